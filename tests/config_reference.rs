//! README's configuration reference and `config/rocgate.toml` say what the parser
//! takes: every table's fields under their names, each default the value the parser
//! gives a field left out. README's TOML examples load, and a field it names elsewhere
//! (`` `[hints] keep` ``, `ROCGATE__DEFAULTS__HOLD`) is one its table takes.
//!
//! The fields a table takes are read from the parser itself: a field it does not know
//! is refused with the list of those it does (serde's `deny_unknown_fields`), so no
//! list here repeats README's.

use rocgate::config::{patch_controller, Config, ConfigError};
use rocgate::controller::ControllerParams;
use rocgate::limiter::Algorithm;
use std::collections::BTreeSet;

const README: &str = include_str!("../README.md");
const DEFAULT_FILE: &str = include_str!("../config/rocgate.toml");

/// A field no table takes.
const UNKNOWN: &str = "not_a_field_of_any_table";

/// README's section that begins with the heading `heading`, to the next heading of
/// its level or above.
fn readme_section(heading: &str) -> &'static str {
    let start = README
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README has the section {heading:?}"))
        + 1;
    let level = heading.split(' ').next().expect("a heading's hashes");
    let rest = &README[start + heading.len()..];
    let end = rest
        .match_indices("\n#")
        .find(|(i, _)| {
            let line = &rest[i + 1..];
            let hashes = line.len() - line.trim_start_matches('#').len();
            hashes <= level.len() && line[hashes..].starts_with(' ')
        })
        .map_or(rest.len(), |(i, _)| i);
    &README[start..start + heading.len() + end]
}

/// The fields the table that `before` opens takes, as the parser's refusal of an
/// unknown field lists them.
fn accepted(before: &str) -> BTreeSet<String> {
    let text = format!("{before}{UNKNOWN} = 1\n");
    let e = Config::from_toml_str(&text, "t.toml").expect_err("an unknown field is refused");
    fields_expected(&e)
}

/// The fields a refusal of the field [`UNKNOWN`] lists as expected.
fn fields_expected(e: &ConfigError) -> BTreeSet<String> {
    let message = e.problems()[0].message();
    let expected = message
        .split_once(&format!("unknown field `{UNKNOWN}`, expected "))
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("{e}"));
    // `one of `a`, `b``, or a single `a`: each field is quoted in backticks.
    let fields: BTreeSet<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!fields.is_empty(), "{e}");
    fields
}

/// One route the parser takes, for tables under `[[routes]]`.
const ROUTE: &str = "[[routes]]\nname = \"r\"\npath = \"/r\"\n";

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

/// The fields the first sentence at or after `start` in `text` lists, each with the
/// default that opens its parenthesis, if one does: `` `keep` (`"1h"`, at least…) ``
/// is `keep` with `"1h"` (a code span followed by `,`, `;`, `:` or `)`; not
/// `` `token` (`[admin] listen` and …) ``). Fields are the code spans outside
/// parentheses, past `start` itself; the sentence ends at the first full stop outside
/// them.
fn listed(text: &'static str, start: &str) -> Vec<(&'static str, Option<&'static str>)> {
    let at = text
        .find(start)
        .unwrap_or_else(|| panic!("README says {start:?}"));
    let mut fields: Vec<(&str, Option<&str>)> = Vec::new();
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

/// Routes beside [`ROUTE`] (a route limited as a whole, with the token bucket) that
/// read the settings it does not: a route partitioned by client IP (`max_keys`,
/// `idle_timeout`, `ipv6_prefix`), one counting fixed windows (`limiter_window`) and a
/// leaky bucket (`queue`). Against [`ROUTE`] alone, a `[defaults]` value of those
/// loads as the built-in whatever it is, and a wrong default goes unseen.
const READERS: &str = "[[routes]]\nname = \"keyed\"\npath = \"/k\"\npartition = \"ip\"\n\
    [[routes]]\nname = \"windowed\"\npath = \"/w\"\nalgorithm = \"fixed_window\"\n\
    [[routes]]\nname = \"paced\"\npath = \"/p\"\nalgorithm = \"leaky_bucket\"\n";

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
    let in_table = table.rsplit('\n').next().expect("a table");
    assert_eq!(
        written, left_out,
        "{source}: {field} = {value} (in {in_table}) is not the built-in value",
    );
    if let Some(other) = another_value(value) {
        let moved = Config::from_toml_str(&with(&other), "other.toml")
            .unwrap_or_else(|e| panic!("{source}: `{field} = {other}` is refused: {e}"));
        assert_ne!(
            moved, left_out,
            "{field} = {other} (in {in_table}) loads as the built-in value too: \
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

/// The route table names the settings `[defaults]` and a route take, and no other; a
/// route's own fields (past those settings) are each named in the reference.
#[test]
fn the_route_table_names_every_setting_a_route_takes() {
    let documented: BTreeSet<String> = route_table()
        .iter()
        .map(|(field, _)| field.to_string())
        .collect();
    assert_eq!(documented.len(), route_table().len(), "a row twice");
    let settings = accepted("[defaults]\n");
    assert_eq!(documented, settings, "README's table against [defaults]");

    let route = accepted(ROUTE);
    assert!(route.is_superset(&settings), "{route:?}");
    let section = readme_section("## Configuration reference");
    for own in route.difference(&settings) {
        assert!(
            section.contains(&format!("`{own}`"))
                || section.contains(&format!("`[[routes.{own}]]`")),
            "the route's own field {own} is not in README's reference"
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

/// `[[routes.tiers]]` and `[[routes.events]]` take the fields README says they do.
#[test]
fn tiers_and_events_take_the_fields_readme_names() {
    let section = readme_section("## Configuration reference");
    for (table, sentence) in [
        ("tiers", "`[[routes.tiers]]` take"),
        ("events", "`[[routes.events]]` take"),
    ] {
        let documented: BTreeSet<String> = listed(section, sentence)
            .into_iter()
            .map(|(field, _)| field.to_owned())
            .collect();
        let before = format!("{ROUTE}[[routes.{table}]]\n");
        assert_eq!(documented, accepted(&before), "README's [[routes.{table}]]");
    }
}

/// README's `[hints]` paragraph names the fields the parser takes, each with its
/// built-in default.
#[test]
fn the_hints_paragraph_names_every_field_and_its_default() {
    let section = readme_section("## Configuration reference");
    let fields = listed(section, "`[hints]`:");
    let documented: BTreeSet<String> = fields.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(documented, accepted("[hints]\n"), "README's [hints]");
    for (field, default) in fields {
        let default = default.unwrap_or_else(|| panic!("README gives hints.{field} no default"));
        assert_builtin(
            "[hints]",
            &[],
            field,
            &toml_value(default),
            "README's [hints]",
        );
    }
}

/// README's `[server]` and `[admin]` paragraph names the fields the parser takes,
/// and each default it gives is the built-in one.
#[test]
fn the_server_paragraph_names_every_field_and_its_defaults() {
    let section = readme_section("## Configuration reference");
    let fields = listed(section, "`[server]` and `[admin]`");
    let split = fields
        .iter()
        .position(|(f, _)| *f == "[admin]")
        .expect("the paragraph goes on to `[admin]`");
    for (table, fields) in [
        ("server", &fields[..split]),
        ("admin", &fields[split + 1..]),
    ] {
        let documented: BTreeSet<String> = fields.iter().map(|(f, _)| f.to_string()).collect();
        let header = format!("[{table}]");
        assert_eq!(
            documented,
            accepted(&format!("{header}\n")),
            "README's {header}"
        );
        let in_file = default_file_fields(&header);
        for (field, default) in fields {
            match default {
                Some(default) => assert_builtin(
                    &header,
                    &[],
                    field,
                    &toml_value(default),
                    &format!("README's {header}"),
                ),
                // README leaves it to config/rocgate.toml.
                None => assert!(
                    in_file.iter().any(|(f, _, _)| f == field),
                    "{header} {field}: no default in README, and not in config/rocgate.toml"
                ),
            }
        }
    }
}

/// README's `[store]` list names the fields the parser takes, each default the
/// built-in one (with `backend = "redis"`, which the others need).
#[test]
fn the_store_list_names_every_field_and_its_default() {
    let section = readme_section("### Distributed mode: shared state in Redis");
    let fields = listed(section, "All fields, with their defaults:");
    let documented: BTreeSet<String> = fields.iter().map(|(f, _)| f.to_string()).collect();
    assert_eq!(documented, accepted("[store]\n"), "README's [store]");
    let base = ["backend = \"redis\""];
    for (field, default) in &fields {
        if let Some(default) = default {
            let value = toml_value(default);
            assert_builtin("[store]", &base, field, &value, "README's [store]");
        }
    }
    // The default file's `[store]`, commented out, shows each field README gives a
    // default at that default (the others, `cluster_nodes`, are examples).
    let mut shown = 0;
    for (field, value, _) in default_file_fields("[store]") {
        let has_default = fields.iter().any(|(f, d)| *f == field && d.is_some());
        if has_default && !base.iter().any(|b| b.starts_with(field)) {
            assert_builtin("[store]", &base, field, value, "config/rocgate.toml");
            shown += 1;
        }
    }
    assert!(shown >= 5, "only {shown} of [store] in config/rocgate.toml");
}

/// Every table the parser takes at the top of a file is named in README.
#[test]
fn readme_names_every_table() {
    for table in accepted("") {
        assert!(
            README.contains(&format!("`[{table}]")) || README.contains(&format!("`[[{table}]]`")),
            "README names no [{table}]"
        );
    }
}

/// The fields `config/rocgate.toml` writes in `table` (`[server]`), with their values
/// and whether the line is commented out (`# token = "..."`): trailing comments cut.
fn default_file_fields(table: &str) -> Vec<(&'static str, &'static str, bool)> {
    let mut fields = Vec::new();
    let mut inside = false;
    for line in DEFAULT_FILE.lines() {
        let line = line.split(" #").next().expect("a line").trim();
        let uncommented = line.trim_start_matches('#').trim_start();
        if line.starts_with('[') || uncommented.starts_with('[') {
            inside = uncommented == table;
        } else if let (true, Some((field, value))) = (inside, uncommented.split_once(" = ")) {
            fields.push((field, value, line.starts_with('#')));
        }
    }
    fields
}

/// `config/rocgate.toml` shows each field it sets at its built-in value (its comment
/// says so of `[defaults]`; `[server]`, `[admin]` and `[hints]` document each field
/// by it), so a file that leaves one out runs as the default file does.
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

/// What a table's fields are read against: the text that opens the table.
fn table_text(table: &str) -> String {
    match table {
        "routes" => ROUTE.to_owned(),
        _ => format!("[{table}]\n"),
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
        assert!(
            accepted(&table_text(&table)).contains(&field),
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
    let documented: BTreeSet<String> = list
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    let json = format!("{{\"{UNKNOWN}\": 1}}");
    let current = ControllerParams::default();
    let e = patch_controller(&current, &Algorithm::default(), &json, "PUT")
        .expect_err("an unknown field is refused");
    assert_eq!(documented, fields_expected(&e), "README's against PUT's");
}
