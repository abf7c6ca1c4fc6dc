//! README's configuration reference and `config/rocgate.toml` held to the file format.
//! The fields each table lists, in README and in the default file, are the ones its raw
//! struct takes, read from serde itself ([`fields_of`]) so that no list here repeats
//! README's; each default either gives is the value a file that leaves the field out
//! gets, on routes that read the field. README's TOML examples load, a field it names
//! elsewhere (`` `[hints] keep` ``, `ROCGATE__DEFAULTS__HOLD`) is its table's, and the
//! fields it says `PUT /admin/routes/{name}` takes are those a runtime change takes.

use super::*;
use std::collections::BTreeSet;

const README: &str = include_str!("../../../../README.md");
const DEFAULT_FILE: &str = include_str!("../../../../config/rocgate.toml");

/// README's section under the heading `title`, up to the next heading of its level
/// or above.
fn readme_section(title: &str) -> &'static str {
    let level = title.chars().take_while(|&c| c == '#').count();
    let start = README
        .find(&format!("\n{title}\n"))
        .unwrap_or_else(|| panic!("README.md has no heading {title:?}"))
        + 1;
    let body = &README[start + title.len()..];
    let end = body
        .match_indices("\n#")
        .find(|&(at, _)| {
            let hashes = body[at + 1..].chars().take_while(|&c| c == '#').count();
            hashes <= level && body[at + 1 + hashes..].starts_with(' ')
        })
        .map_or(body.len(), |(at, _)| at);
    &body[..end]
}

/// The fields of the table a file names `table` (`server`, `routes`, `routes.tiers`),
/// as its raw struct takes them; `None` for a name the file format has no table of.
fn table_fields(table: &str) -> Option<&'static [&'static str]> {
    Some(match table {
        "defaults" => fields_of::<RawSettings>(),
        "routes" => fields_of::<RawRoute>(),
        "routes.tiers" => fields_of::<RawTier>(),
        "routes.events" => fields_of::<RawEvent>(),
        "server" => fields_of::<RawServer>(),
        "admin" => fields_of::<RawAdmin>(),
        "hints" => fields_of::<RawHints>(),
        "store" => fields_of::<RawStore>(),
        _ => return None,
    })
}

/// [`table_fields`] of a table the file format has, as a set.
fn fields_set(table: &str) -> BTreeSet<&'static str> {
    let fields = table_fields(table).unwrap_or_else(|| panic!("no table [{table}]"));
    fields.iter().copied().collect()
}

/// One route the parser takes, limited as a whole with the token bucket.
const ROUTE: &str = "[[routes]]\nname = \"r\"\npath = \"/r\"\n";

/// Routes beside [`ROUTE`] that read the settings it does not: one partitioned by
/// client IP (`max_keys`, `idle_timeout`, `ipv6_prefix`), one counting fixed windows
/// (`limiter_window`), a leaky bucket (`queue`). Against [`ROUTE`] alone, a
/// `[defaults]` value of those loads as the built-in one whatever it is, and a wrong
/// default goes unseen.
const READERS: &str = "[[routes]]\nname = \"keyed\"\npath = \"/k\"\npartition = \"ip\"\n\
    [[routes]]\nname = \"windowed\"\npath = \"/w\"\nalgorithm = \"fixed_window\"\n\
    [[routes]]\nname = \"paced\"\npath = \"/p\"\nalgorithm = \"leaky_bucket\"\n";

/// A default as README writes it, as a TOML value: quoted unless it is one already
/// (README's `[store]` list writes `local` and `50ms` bare).
fn toml_value(default: &str) -> String {
    let is_value = default.starts_with('"')
        || default.parse::<f64>().is_ok()
        || default == "true"
        || default == "false";
    if is_value {
        default.to_owned()
    } else {
        format!("{default:?}")
    }
}

/// Another valid value than `value` (a TOML value), where one can be told from it
/// without knowing the field: a number moved (a whole one up by 1, another halved), a
/// duration of one unit doubled, a flag turned over. `None` for other text (a mode's
/// name, an address).
fn another_value(value: &str) -> Option<String> {
    if let Ok(whole) = value.parse::<u64>() {
        return whole.checked_add(1).map(|moved| moved.to_string());
    }
    if let Ok(number) = value.parse::<f64>() {
        return Some((number / 2.0).to_string());
    }
    match value {
        "true" => return Some("false".to_owned()),
        "false" => return Some("true".to_owned()),
        _ => {}
    }
    let text = value.strip_prefix('"')?.strip_suffix('"')?;
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let (count, unit) = text.split_at(digits);
    let count: u64 = count.parse().ok()?;
    let one_unit = unit.chars().all(|c| c.is_ascii_lowercase());
    one_unit.then(|| format!("\"{}{unit}\"", count * 2))
}

/// Asserts that `field = value` written in `table` (after `base`'s other lines there)
/// loads as the configuration that leaves it out: the value is the built-in one.
/// `base` is the rest of the table; a line of it that sets `field` is left out.
///
/// The comparison tells something only if the configuration reads the field, so
/// another value (where [`another_value`] finds one) must load as another
/// configuration: the routes ([`ROUTE`] and [`READERS`]) are such that it does.
fn assert_builtin(table: &str, base: &[&str], field: &str, value: &str, source: &str) {
    let base: Vec<&str> = base
        .iter()
        .copied()
        .filter(|line| line.split('=').next().map(str::trim) != Some(field))
        .collect();
    let without = format!("{ROUTE}{READERS}{table}\n{}\n", base.join("\n"));
    let with = |value: &str| format!("{without}{field} = {value}\n");
    let left_out = Config::from_toml_str(&without, "without.toml")
        .unwrap_or_else(|e| panic!("{source}: {e}\n{without}"));
    let written = Config::from_toml_str(&with(value), "with.toml")
        .unwrap_or_else(|e| panic!("{source}: `{field} = {value}` is refused: {e}"));
    assert_eq!(
        written, left_out,
        "{source}: {field} = {value} (in {table}) is not the built-in value",
    );
    if let Some(other) = another_value(value) {
        let moved = Config::from_toml_str(&with(&other), "other.toml")
            .unwrap_or_else(|e| panic!("{source}: `{field} = {other}` is refused: {e}"));
        assert_ne!(
            moved, left_out,
            "{field} = {other} (in {table}) loads as the built-in value too: \
             these routes do not read {field}, so its default is not checked"
        );
    }
}

/// README's table of route settings: (field, default) from each row.
fn route_table() -> Vec<(&'static str, &'static str)> {
    let section = readme_section("## Configuration reference");
    let at = section
        .find("\n| field | default | meaning |\n")
        .expect("README's table of route settings");
    section[at + 1..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let unquote = |cell: &'static str| {
                cell.strip_prefix('`')
                    .and_then(|c| c.strip_suffix('`'))
                    .unwrap_or_else(|| panic!("a code span: {row}"))
            };
            (unquote(cells[1]), unquote(cells[2]))
        })
        .collect()
}

/// A piece of README prose, read outside code: a code span, or a parenthesis.
#[derive(Debug, PartialEq)]
enum Token<'a> {
    /// A code span; whether it opens a parenthesis as a clause of its own (`` (`"1h"`,
    /// … ``, `` (`0`: off … ``), as a field's default does.
    Code(&'a str, bool),
    Open,
    Close,
    /// The end of a sentence: a full stop followed by white space, outside code.
    Stop,
}

/// `text`'s code spans, parentheses and full stops, in order; what code spans hold is
/// not read for the others.
fn tokens(text: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(['`', '(', ')', '.']) {
        let after = &rest[at + 1..];
        rest = match rest.as_bytes()[at] {
            b'`' => {
                let end = after.find('`').expect("a code span is closed");
                let closed = after[end + 1..].starts_with([',', ';', ':', ')']);
                let opens = at == 0 && closed && out.last() == Some(&Token::Open);
                out.push(Token::Code(&after[..end], opens));
                &after[end + 1..]
            }
            b'(' => {
                out.push(Token::Open);
                after
            }
            b')' => {
                out.push(Token::Close);
                after
            }
            _ => {
                if after.is_empty() || after.starts_with(char::is_whitespace) {
                    out.push(Token::Stop);
                }
                after
            }
        };
    }
    out
}

/// A field README lists, with the default it gives, if it gives one.
type Listed = (&'static str, Option<&'static str>);

/// The fields the first sentence at or after `start` in `text` lists, each with the
/// default that opens its parenthesis, if one does: `` `keep` (`"1h"`, at least…) ``
/// is `keep` with `"1h"` (a code span followed by `,`, `;`, `:` or `)`; not
/// `` `token` (`[admin] listen` and …) ``). Fields are the code spans outside
/// parentheses, past `start` itself; the sentence ends at the first full stop outside
/// them.
fn listed(text: &'static str, start: &str) -> Vec<Listed> {
    let at = text
        .find(start)
        .unwrap_or_else(|| panic!("README says {start:?}"));
    let mut fields: Vec<Listed> = Vec::new();
    let mut depth = 0usize;
    // Whether the parenthesis open now follows a field: its first code span, if
    // nothing comes before it, is the field's default.
    let mut after_field = false;
    let mut last_was_field = false;
    for token in tokens(&text[at + start.len()..]) {
        match token {
            Token::Open => {
                after_field = depth == 0 && last_was_field;
                depth += 1;
            }
            Token::Close => depth = depth.checked_sub(1).expect("parentheses balance"),
            Token::Stop if depth == 0 => return fields,
            Token::Stop => {}
            Token::Code(code, _) if depth == 0 => fields.push((code, None)),
            Token::Code(code, opens) => {
                if depth == 1 && opens && after_field {
                    fields.last_mut().expect("a field").1 = Some(code);
                }
            }
        }
        last_was_field = matches!(token, Token::Code(_, _)) && depth == 0;
    }
    panic!("the sentence from {start:?} ends")
}

/// The tables whose fields README lists in a sentence, each with its fields and the
/// default each is given, if one is: tiers, events, `[hints]`, `[server]` and
/// `[admin]` in the Configuration reference, `[store]` in Distributed mode.
fn prose_lists() -> Vec<(&'static str, Vec<Listed>)> {
    let reference = readme_section("## Configuration reference");
    let distributed = readme_section("### Distributed mode: shared state in Redis");
    let mut server = listed(reference, "`[server]` and `[admin]`");
    let split = server
        .iter()
        .position(|&(field, _)| field == "[admin]")
        .expect("the paragraph goes on to `[admin]`");
    let admin = server.split_off(split + 1);
    server.truncate(split);
    vec![
        ("routes.tiers", listed(reference, "`[[routes.tiers]]` take")),
        (
            "routes.events",
            listed(reference, "`[[routes.events]]` take"),
        ),
        ("hints", listed(reference, "`[hints]`:")),
        ("server", server),
        ("admin", admin),
        (
            "store",
            listed(distributed, "All fields, with their defaults:"),
        ),
    ]
}

/// The fields `config/rocgate.toml` writes in `table` (`[server]`), with their values
/// and whether the line is commented out (`# token = "..."`), trailing comments cut.
/// A commented line is a field when what stands before its ` = ` is a field's name;
/// any other line of a table that is not commented out must be a field.
fn default_file_fields(table: &str) -> Vec<(&'static str, &'static str, bool)> {
    let is_name = |name: &str| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    let mut fields = Vec::new();
    let mut inside = false;
    for line in DEFAULT_FILE.lines() {
        let line = line.split(" #").next().expect("a line").trim();
        let commented = line.starts_with('#');
        let uncommented = line.trim_start_matches('#').trim_start();
        if line.starts_with('[') || uncommented.starts_with('[') {
            inside = uncommented == table;
        } else if inside && !line.is_empty() {
            match uncommented.split_once(" = ") {
                Some((field, value)) if is_name(field) => fields.push((field, value, commented)),
                _ => assert!(commented, "config/rocgate.toml's {table}: {line:?}"),
            }
        }
    }
    fields
}

/// README's table of route settings lists each setting `[defaults]` takes once, and no
/// other; a route takes them all, and each of its own fields is named in the
/// reference.
#[test]
fn the_route_table_names_every_setting_a_route_takes() {
    let rows = route_table();
    let documented: BTreeSet<&str> = rows.iter().map(|&(field, _)| field).collect();
    assert_eq!(documented.len(), rows.len(), "a row twice: {rows:?}");
    let settings = fields_set("defaults");
    assert_eq!(documented, settings, "README's table against [defaults]");

    let route = fields_set("routes");
    assert!(route.is_superset(&settings), "{route:?}");
    let section = readme_section("## Configuration reference");
    for own in route.difference(&settings) {
        assert!(
            section.contains(&format!("`{own}`"))
                || section.contains(&format!("`[[routes.{own}]]`")),
            "README's reference omits [[routes]] {own}"
        );
    }
}

/// Each default in the route table is the value the parser gives a setting left out,
/// on routes that read it ([`READERS`]: partitioned or not, each algorithm's fields).
#[test]
fn the_route_tables_defaults_are_the_built_in_values() {
    for (field, default) in route_table() {
        let value = toml_value(default);
        assert_builtin("[defaults]", &[], field, &value, "README's route table");
    }
}

/// "of the durations below, only `hold` and `min_dwell` may be zero": of the route
/// table's durations, a file takes `"0s"` for those and refuses it for the others.
#[test]
fn readme_says_which_durations_may_be_zero() {
    let section = readme_section("## Configuration reference");
    let zero = section
        .split_once("of the durations below, only ")
        .and_then(|(_, rest)| rest.split_once(" may be zero"))
        .expect("README says which durations may be zero")
        .0;
    let mut durations = 0;
    for (field, default) in route_table() {
        // A duration's default is a quoted number with its unit (`"6s"`).
        let duration = default
            .strip_prefix('"')
            .is_some_and(|d| d.starts_with(|c: char| c.is_ascii_digit()));
        if !duration {
            continue;
        }
        durations += 1;
        let text = format!("[defaults]\n{field} = \"0s\"\n{ROUTE}{READERS}");
        assert_eq!(
            Config::from_toml_str(&text, "README").is_ok(),
            zero.contains(&format!("`{field}`")),
            "README on whether {field} may be zero"
        );
    }
    assert!(durations >= 8, "only {durations} durations in the table");
}

/// The fields README lists for tiers, events, `[hints]`, `[server]`, `[admin]` and
/// `[store]` are the ones each table takes.
#[test]
fn readmes_lists_name_every_field_their_tables_take() {
    for (table, fields) in prose_lists() {
        let documented: BTreeSet<&str> = fields.iter().map(|&(field, _)| field).collect();
        assert_eq!(documented, fields_set(table), "README's [{table}]");
    }
}

/// Each default README's lists give (`` `keep` (`"1h"` ``) is the value a file that
/// leaves the field out gets (`[store]`'s with `backend = "redis"`, which the others
/// need); every `[hints]` field is given one (`[server]` and `[admin]` leave some of
/// theirs to `config/rocgate.toml`; `[store]`'s `cluster_nodes` and `instance_id` have
/// none).
#[test]
fn readmes_defaults_in_prose_are_the_built_in_values() {
    let mut checked = 0;
    for (table, fields) in prose_lists() {
        let (base, every_field): (&[&str], bool) = match table {
            "hints" => (&[], true),
            "server" | "admin" => (&[], false),
            "store" => (&["backend = \"redis\""], false),
            _ => continue,
        };
        for (field, default) in fields {
            let Some(default) = default else {
                assert!(!every_field, "README gives [{table}] {field} no default");
                continue;
            };
            let source = format!("README's [{table}]");
            assert_builtin(
                &format!("[{table}]"),
                base,
                field,
                &toml_value(default),
                &source,
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} defaults in README's prose");
}

/// Every table a file takes at its top is named in README.
#[test]
fn readme_names_every_table() {
    for &table in fields_of::<RawConfig>() {
        assert!(table_fields(table).is_some(), "[{table}] is not read here");
        assert!(
            README.contains(&format!("`[{table}]")) || README.contains(&format!("`[[{table}]]`")),
            "README names no [{table}]"
        );
    }
}

/// `config/rocgate.toml` shows every field of `[defaults]`, `[server]`, `[admin]`,
/// `[hints]` and `[store]` (commented out where it has no value to show, as all of
/// `[store]`), and no field the table does not take.
#[test]
fn the_default_file_shows_every_field() {
    for table in ["defaults", "server", "admin", "hints", "store"] {
        let shown: BTreeSet<&str> = default_file_fields(&format!("[{table}]"))
            .into_iter()
            .map(|(field, _, _)| field)
            .collect();
        assert_eq!(shown, fields_set(table), "config/rocgate.toml's [{table}]");
    }
}

/// `config/rocgate.toml` shows each field it sets at its built-in value (its comment
/// says so of `[defaults]`; `[server]`, `[admin]` and `[hints]` document each field by
/// it), so a file that leaves one out runs as the default file does; its commented-out
/// `[store]` shows the built-in value of each field README gives a default (the others,
/// `cluster_nodes` and `instance_id`, are examples).
#[test]
fn the_default_file_shows_the_built_in_values() {
    let mut checked = 0;
    for table in ["[defaults]", "[server]", "[admin]", "[hints]"] {
        for (field, value, commented) in default_file_fields(table) {
            if !commented {
                assert_builtin(table, &[], field, value, "config/rocgate.toml");
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 40,
        "only {checked} fields read from config/rocgate.toml"
    );

    let (_, store) = prose_lists()
        .into_iter()
        .find(|&(table, _)| table == "store")
        .expect("README's [store]");
    let base = ["backend = \"redis\""];
    let mut shown = 0;
    for (field, value, _) in default_file_fields("[store]") {
        let has_default = store.iter().any(|&(f, d)| f == field && d.is_some());
        if has_default && field != "backend" {
            assert_builtin("[store]", &base, field, value, "config/rocgate.toml");
            shown += 1;
        }
    }
    assert!(shown >= 5, "only {shown} of [store] in config/rocgate.toml");
}

/// Every TOML example in README loads (beside a route, as a file needs one).
#[test]
fn readme_toml_examples_load() {
    let blocks: Vec<&str> = README
        .split("```toml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().expect("a closed block"))
        .collect();
    assert!(!blocks.is_empty(), "README has TOML examples");
    for block in blocks {
        let text = format!("{ROUTE}{block}");
        if let Err(e) = Config::from_toml_str(&text, "README") {
            panic!("{e}\n{block}");
        }
    }
}

/// Where README names a table's field (`` `[hints] keep` ``, `` `[admin]` `listen` ``,
/// `ROCGATE__ROUTES__0__BASE_LIMIT`), the table takes that field.
#[test]
fn readme_names_fields_where_their_tables_take_them() {
    let ident = |text: &'static str| {
        let end = text
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(text.len());
        &text[..end]
    };
    // (table, field, as README writes it)
    let mut named: Vec<(String, String, String)> = Vec::new();
    for (at, _) in README.match_indices("`[") {
        let rest = &README[at + 2..];
        let Some(close) = rest.find(']') else {
            continue;
        };
        let table = &rest[..close];
        let after = &rest[close + 1..];
        let field = [" ", "\n", "` `"]
            .iter()
            .find_map(|gap| after.strip_prefix(gap))
            .map(ident);
        if let Some(field) = field.filter(|f| !f.is_empty() && table == ident(table)) {
            let written = format!("`[{table}] {field}`");
            named.push((table.to_owned(), field.to_owned(), written));
        }
    }
    for (at, _) in README.match_indices("ROCGATE__") {
        let name = &README[at..];
        let name = &name[..name
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(name.len())];
        let parts: Vec<String> = name
            .split("__")
            .skip(1)
            .filter(|p| !p.is_empty() && !p.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_ascii_lowercase)
            .collect();
        if let [table, field, ..] = &parts[..] {
            named.push((table.clone(), field.clone(), name.to_owned()));
        }
    }
    assert!(named.len() >= 30, "only {} mentions found", named.len());
    for (table, field, written) in named {
        let fields = table_fields(&table)
            .unwrap_or_else(|| panic!("README names {written}, but a file has no [{table}]"));
        assert!(
            fields.contains(&field.as_str()),
            "README names {written}, but [{table}] takes no {field}"
        );
    }
}

/// The controller fields README says an event takes, "the fields `PUT
/// /admin/routes/{name}` takes too", are those a runtime change takes.
#[test]
fn the_fields_a_runtime_change_takes_are_readmes() {
    let section = readme_section("## Configuration reference");
    let from = section
        .find("any controller field:")
        .expect("README's fields of an event");
    let list = &section[from..];
    let list = &list[..list
        .find("(the fields `PUT /admin/routes/{name}` takes too)")
        .expect("README says PUT takes them")];
    let documented: BTreeSet<&str> = list.split('`').skip(1).step_by(2).collect();
    let taken: BTreeSet<&str> = fields_of::<RawPatch>().iter().copied().collect();
    assert_eq!(documented, taken, "README's against PUT's");
}
