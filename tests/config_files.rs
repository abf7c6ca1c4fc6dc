//! The shipped configuration files are valid, and broken ones are refused with the
//! field path and the reason, every problem at once.

use rocgate::config::{
    ClientIpHeader, Config, Mode, Partition, ProxyProtocol, Secret, ServerConfig,
};
use rocgate::limiter::{Algorithm, MAX_WINDOW_COUNT};
use rocgate::window::RocMode;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every `.toml` file under `dir`, recursively, sorted.
fn toml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("config/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files.extend(toml_files(&path));
        } else if path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config")
}

fn load(name: &str) -> Config {
    let path = config_dir().join(name);
    let text = std::fs::read_to_string(&path).expect("the file exists");
    Config::from_toml_str(&text, name).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_file_in_config_is_valid() {
    let files = toml_files(&config_dir());
    assert!(
        files.len() >= 8,
        "expected the default and 7 examples, found {files:?}"
    );
    for path in files {
        let text = std::fs::read_to_string(&path).expect("readable");
        let origin = path.display().to_string();
        let config = Config::from_toml_str(&text, &origin).unwrap_or_else(|e| panic!("{e}"));
        assert!(!config.routes.is_empty(), "{origin} has no route");
    }
}

#[test]
fn the_examples_show_what_they_are_named_for() {
    let c = load("examples/flash-sale.toml");
    assert_eq!(c.routes[0].name, "order");
    assert_eq!(c.routes[0].controller, Default::default());
    // A request no route takes would be forwarded with no limit: the example ends
    // with a catch-all, as the default configuration does.
    let last = c.routes.last().expect("routes");
    assert!(last.matcher.matches("GET", "/api/cart"), "{}", last.name);

    let c = load("examples/per-ip.toml");
    assert!(
        matches!(c.routes[0].partition, Partition::ClientIp(k) if k.max_keys == 50_000 && k.ipv6_prefix == 64)
    );
    assert_eq!(c.routes[2].partition, Partition::Route);

    let c = load("examples/api-keys-tiers.toml");
    let Partition::Header(header, _) = &c.routes[0].partition else {
        panic!("partitioned by header")
    };
    assert_eq!(header, "x-api-key");
    assert_eq!(c.routes[0].tiers[0].name, "vip");
    assert_eq!(c.routes[0].tiers[0].base_limit_rps, 500.0);

    let c = load("examples/scheduled-event.toml");
    let events = &c.routes[0].events;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].controller.base_limit_rps, 400.0);
    assert_eq!(events[0].controller.min_rps, c.routes[0].controller.min_rps);
    assert_eq!(events[1].controller.cut_limit_rps, 60.0);

    let c = load("examples/shadow.toml");
    let modes: Vec<Mode> = c.routes.iter().map(|r| r.mode).collect();
    assert_eq!(modes, [Mode::Shadow, Mode::ShadowAdaptive, Mode::Enforce]);

    let c = load("examples/relative-roc.toml");
    assert!(c
        .routes
        .iter()
        .all(|r| r.controller.roc_mode == RocMode::Relative));
    assert_eq!(c.routes[0].controller.danger_roc, 1.0);

    let c = load("examples/algorithms.toml");
    let names: Vec<&str> = c.routes.iter().map(|r| r.algorithm.name()).collect();
    assert_eq!(
        names,
        [
            "token_bucket",
            "fixed_window",
            "sliding_window",
            "leaky_bucket",
            "concurrency"
        ]
    );
    assert_eq!(c.routes[4].algorithm, Algorithm::Concurrency { queue: 10 });
}

const ORDER: &str = "[[routes]]\nname = \"order\"\npath = \"/api/order\"\n";

/// The error lines for `text`, without the origin prefix.
fn problems(text: &str) -> Vec<String> {
    match Config::from_toml_str(text, "bad.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e
            .to_string()
            .lines()
            .map(|line| {
                line.strip_prefix("bad.toml: ")
                    .unwrap_or_else(|| panic!("every line names the file: {line}"))
                    .to_owned()
            })
            .collect(),
    }
}

/// Asserts that `text` is refused with a problem at `path` whose message contains `message`.
#[track_caller]
fn refused(text: &str, path: &str, message: &str) {
    let found = problems(text);
    assert!(
        found.iter().any(|line| line
            .strip_prefix(path)
            .and_then(|m| m.strip_prefix(": "))
            .is_some_and(|m| m.contains(message))),
        "expected `{path}: …{message}…` for\n{text}\ngot:\n{}",
        found.join("\n")
    );
}

fn route(extra: &str) -> String {
    format!("{ORDER}{extra}\n")
}

/// A value written too long (100 KB) is quoted by its first 64 characters and its
/// length, not echoed whole into the error (a log line, a terminal). Every field whose
/// error quotes the value as written; `store.instance_id` was quoted whole.
#[test]
fn an_over_long_value_is_quoted_by_a_bounded_prefix() {
    let long = "x".repeat(100_000);
    let redis = |extra: &str| route(&format!("[store]\nbackend = \"redis\"\n{extra}"));
    refused(
        &redis(&format!("instance_id = \"{long}\"")),
        "store.instance_id",
        &format!("must be 1 to 128 characters; leave it out for a random one, got \"{}\"… (100000 bytes)", &long[..64]),
    );
    let cases = [
        redis(&format!("instance_id = \"{long}\"")),
        redis(&format!("key_prefix = \"{{{long}\"")),
        redis(&format!("mode = \"{long}\"")),
        redis(&format!("fail_mode = \"{long}\"")),
        redis(&format!("url = \"http://{long}\"")),
        redis(&format!("url = \"{long}\"")),
        redis(&format!("cluster_nodes = [\"redis://a:7000\", \"redis://u:p@{long}:7000\"]")),
        route(&format!("[store]\nbackend = \"{long}\"")),
        format!("[[routes]]\nname = \"a {long}\"\npath = \"/api/order\"\n"),
        format!("[[routes]]\nname = \"order\"\npath = \"/{long}?\"\n"),
        format!("[[routes]]\nname = \"order\"\npath = \"{long}\"\n"),
        format!("[[routes]]\nname = \"order\"\npath = \"/{{{long}\"\n"),
        route(&format!("method = \"{long} \"")),
        route(&format!("hold = \"{long}\"")),
        route(&format!("hold = \"1{long}\"")),
        route(&format!("hold = \"-{long}\"")),
        route(&format!("algorithm = \"{long}\"")),
        route(&format!("mode = \"{long}\"")),
        route(&format!("partition = \"{long}\"")),
        route(&format!("partition = \"header:{long} \"")),
        route(&format!("roc_mode = \"{long}\"")),
        route(&format!("base_limit = \"{long}\"")),
        route(&format!("[[routes.events]]\nname = \"sale\"\nstart = \"{long}\"\nduration = \"1m\"")),
        format!("[server]\ntrusted_proxies = [\"{long}\"]\n{ORDER}"),
        format!("[server]\nclient_ip_header = \"{long}\"\n{ORDER}"),
        format!("[server]\nproxy_protocol = \"{long}\"\n{ORDER}"),
        route(&format!("hold = {long}")),
        route(&format!("tiers = \"{long}\"")),
        route(&format!("tiers = [{{ name = \"gold\", base_limit = 10, keys = [\"{long}\"] }}]\npartition = \"ip\"")),
    ];
    for text in &cases {
        let found = problems(text);
        assert!(!found.is_empty());
        for line in &found {
            assert!(
                line.len() < 1000,
                "{} bytes: {}…",
                line.len(),
                &line[..1000]
            );
        }
    }
    // A runtime change's too.
    for json in [
        format!("{{\"hold\": \"{long}\"}}"),
        format!("{{\"roc_mode\": \"{long}\"}}"),
        format!("{{\"base_limit\": \"{long}\"}}"),
        format!("{{\"min_samples\": \"{long}\"}}"),
    ] {
        let e = rocgate::config::patch_controller(
            &Default::default(),
            &Default::default(),
            &json,
            "PUT",
        )
        .unwrap_err()
        .to_string();
        assert!(e.len() < 1000, "{} bytes: {}…", e.len(), &e[..1000]);
    }
    // An over-long key is named whole in the field path, which locates the problem
    // (and names the variable that set it), and bounded in the message.
    let unknown = format!("unknown field `{}`… (100000 bytes), expected", &long[..64]);
    for text in [
        route(&format!("{long} = 1")),
        route(&format!("\"{long}\" = 1")),
    ] {
        refused(&text, &format!("routes[0].{long}"), &unknown);
        for line in problems(&text) {
            assert!(line.len() < long.len() + 1000, "{} bytes", line.len());
        }
    }
    let e = rocgate::config::patch_controller(
        &Default::default(),
        &Default::default(),
        &format!("{{\"{long}\": 1}}"),
        "PUT",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(&format!("{long}: {unknown}")), "{}…", &e[..1000]);
    assert!(e.len() < long.len() + 1000, "{} bytes", e.len());
}

#[test]
fn limits_and_thresholds_must_fit_together() {
    refused(
        &route("cut_limit = 300"),
        "routes[0].cut_limit",
        "must be ≤ base_limit (200), got 300",
    );
    refused(
        &route("safe_roc = 80"),
        "routes[0].safe_roc",
        "must be < danger_roc (80), got 80",
    );
    // A [defaults] value that only breaks with the route's own is named at the route.
    refused(
        &format!("[defaults]\ncut_limit = 60\n{}", route("base_limit = 50")),
        "routes[0].base_limit",
        "must be ≥ cut_limit (60), got 50",
    );
    // Both from [defaults]: reported there, once.
    let found = problems(&format!(
        "[defaults]\nsafe_roc = 90\n{ORDER}[[routes]]\nname = \"b\"\npath = \"/b\"\n"
    ));
    assert_eq!(
        found,
        ["defaults.safe_roc: must be < danger_roc (80), got 90"]
    );
}

#[test]
fn numbers_must_be_positive_and_numbers() {
    refused(
        &route("base_limit = -5"),
        "routes[0].base_limit",
        "must be a number > 0, got -5",
    );
    refused(
        &route("cut_limit = 0"),
        "routes[0].cut_limit",
        "must be a number > 0, got 0",
    );
    // One request in 30,000 years: its interval is beyond the limiters' nanosecond
    // arithmetic, which overflowed when the engine was built.
    refused(
        &route("base_limit = 1e-12\ncut_limit = 1e-12"),
        "routes[0].base_limit",
        "must be at least 0.000001 (one request in 11.6 days), got 1e-12",
    );
    // A number far from 1 is written with an exponent: 1e-300 was written out in full,
    // 300 zeros and a 1, and -1e300 a 1 and 300 zeros.
    refused(
        &route("base_limit = 1e-300\ncut_limit = 1e-300"),
        "routes[0].base_limit",
        "must be at least 0.000001 (one request in 11.6 days), got 1e-300",
    );
    refused(
        &route("base_limit = -1e300"),
        "routes[0].base_limit",
        "must be a number > 0, got -1e300",
    );
    refused(
        &route("min_rps = -1e300"),
        "routes[0].min_rps",
        "must be a number ≥ 0, got -1e300",
    );
    refused(
        &route("restore_step = 0"),
        "routes[0].restore_step",
        "must be a number > 0",
    );
    refused(
        &route("min_rps = -1"),
        "routes[0].min_rps",
        "must be a number ≥ 0, got -1",
    );
    refused(
        &route("base_limit = true"),
        "routes[0].base_limit",
        "invalid type: boolean `true`, expected a number",
    );
    refused(
        &route("queue = -1"),
        "routes[0].queue",
        "expected a whole number ≥ 0",
    );
    refused(
        &route("partition = \"ip\"\nmax_keys = 0"),
        "routes[0].max_keys",
        "must be at least 1, got 0",
    );
}

#[test]
fn the_window_must_split_into_halves_of_slots() {
    refused(
        &format!("[defaults]\nwindow = \"6s\"\nslot = \"700ms\"\n{ORDER}"),
        "defaults.slot",
        "must divide the window",
    );
    // Named where the value at fault was written: the more specific of the two, the
    // slot where both are written in one place.
    refused(
        &route("window = \"500ms\""),
        "routes[0].window",
        "an even number of at least 4 slots, got 5",
    );
    refused(
        &route("window = \"200ms\""),
        "routes[0].window",
        "at least 4 slots, got 2",
    );
    refused(
        &route("slot = \"700ms\""),
        "routes[0].slot",
        "slot (700ms) must divide the window (6s)",
    );
    refused(
        &route("window = \"1s\"\nslot = \"300ms\""),
        "routes[0].slot",
        "slot (300ms) must divide the window (1s)",
    );
    // A window of 4 ns passed check-config; simulate could not step through it.
    refused(
        &route("window = \"4ns\"\nslot = \"1ns\""),
        "routes[0].slot",
        "slot must be at least 1ms, got 1ns",
    );
}

#[test]
fn a_cut_route_must_be_restored_within_a_week() {
    // 140 req/s back in steps of 10^-300 req/s: never, as it was (60 + 10^-300 is 60).
    refused(
        &route("restore_step = 1e-300"),
        "routes[0].restore_step",
        "restoring from cut_limit (60) to base_limit (200) in steps of 1e-300 every 1s \
         takes 1.4e302 steps, longer than 7days: take a restore_step of at least 0.0002315 or",
    );
    // 14,000 steps of 0.01 req/s a minute: 9.7 days. At most 10,080 steps of a minute
    // fit in a week: a step of 140/10,080 req/s at least.
    refused(
        &format!("[defaults]\nrestore_step = 0.01\n{ORDER}restore_interval = \"1m\"\n"),
        "routes[0].restore_interval",
        "takes 14000 steps, longer than 7days: take a restore_step of at least 0.01389 or",
    );
    // The step suggested is one the check takes, where rounding it to 4 figures lands
    // on the least step exactly: 54,216 req/s in 86,400 steps of 7 s are 0.6275 each,
    // and 54,216 / 0.6275 in floating point is just over 86,400.
    let limits = "base_limit = 54276\ncut_limit = 60\nrestore_interval = \"7s\"\n";
    let found = problems(&route(&format!("{limits}restore_step = 0.01")));
    let suggested = found
        .iter()
        .find_map(|line| line.split("a restore_step of at least ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{found:?}"));
    let taken = route(&format!("{limits}restore_step = {suggested}"));
    assert!(
        Config::from_toml_str(&taken, "week.toml").is_ok(),
        "{taken}"
    );
    // An event's limits that a route's step cannot restore in time are named in the
    // event: 340 req/s in steps of 0.01 every 43 s.
    refused(
        &format!(
            "[defaults]\nrestore_step = 0.01\n{ORDER}restore_interval = \"43s\"\n\
             [[routes.events]]\nname = \"sale\"\nstart = \"2027-11-26T20:00:00Z\"\n\
             duration = \"1h\"\nbase_limit = 400\n"
        ),
        "routes[0].events[0].base_limit",
        "restoring from cut_limit (60) to base_limit (400) in steps of 0.01 every 43s",
    );
    // 14,000 steps of 43 s are 6.97 days; 7 steps of a day, 7 days.
    for within in [
        format!("[defaults]\nrestore_step = 0.01\n{ORDER}restore_interval = \"43s\"\n"),
        route("restore_interval = \"1day\""),
    ] {
        assert!(
            Config::from_toml_str(&within, "week.toml").is_ok(),
            "{within}"
        );
    }
}

/// Two routes of one name are refused whatever else is wrong with either: the name
/// of a route refused for another field (a negative `hold`) was left out of the
/// check, and the duplicate showed only once that field was fixed.
#[test]
fn a_duplicate_name_is_reported_beside_the_routes_other_problems() {
    assert_eq!(
        problems(&format!(
            "{ORDER}hold = \"-1s\"\n[[routes]]\nname = \"order\"\npath = \"/b\"\ncut_limit = 500\n"
        )),
        [
            "routes[0].hold: must not be negative, got \"-1s\"",
            "routes[1].cut_limit: must be ≤ base_limit (200), got 500",
            "routes[1].name: duplicate of routes[0].name (\"order\")",
        ]
    );
}

/// A third route of a name is named a duplicate of the first, as the second is: it
/// was named a duplicate of the second, each route of the name pointing at the one
/// before it.
#[test]
fn every_duplicate_name_points_at_the_first_route_of_it() {
    assert_eq!(
        problems(&format!(
            "{ORDER}[[routes]]\nname = \"order\"\npath = \"/b\"\n\
             [[routes]]\nname = \"order\"\npath = \"/c\"\n"
        )),
        [
            "routes[1].name: duplicate of routes[0].name (\"order\")",
            "routes[2].name: duplicate of routes[0].name (\"order\")",
        ]
    );
}

#[test]
fn route_names_and_paths() {
    refused(
        &format!("{ORDER}{ORDER}"),
        "routes[1].name",
        "duplicate of routes[0].name (\"order\")",
    );
    refused(
        "[[routes]]\nname = \"order page\"\npath = \"/\"\n",
        "routes[0].name",
        "use only A-Z a-z 0-9 _ . : -",
    );
    refused(
        "[[routes]]\nname = \"unmatched\"\npath = \"/\"\n",
        "routes[0].name",
        "\"unmatched\" is reserved: it labels the requests that no route takes",
    );
    // The admin API names a route in its path (/admin/routes/{name}), where clients
    // take `.` and `..` as steps of the path, encoded or not.
    for dots in [".", ".."] {
        refused(
            &format!("[[routes]]\nname = \"{dots}\"\npath = \"/\"\n"),
            "routes[0].name",
            &format!("{dots:?} cannot name a route: the admin API names a route in its path (/admin/routes/{{name}}), where clients read . and .. as steps of the path"),
        );
    }
    refused(
        "[[routes]]\nname = \"order\"\n",
        "routes[0].path",
        "required",
    );
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/a\"\npath_prefix = \"/a\"\n",
        "routes[0].path_prefix",
        "cannot be set together with path",
    );
    refused(
        "[[routes]]\nname = \"a\"\npath = \"api/order\"\n",
        "routes[0].path",
        "must start with '/'",
    );
    // `serve` matches a request's path without its segments' parameters: a route
    // with one would never match.
    for (field, written) in [("path", "/api/order;v=2"), ("path_prefix", "/a;x/")] {
        refused(
            &format!("[[routes]]\nname = \"a\"\n{field} = \"{written}\"\n"),
            &format!("routes[0].{field}"),
            "must not contain ';': `serve` matches a request's path without its segments' parameters",
        );
    }
    // Requests are matched on their normalized path, so a route written otherwise
    // would never match one.
    for (field, written, normalized) in [
        ("path", "/api//order", "/api/order"),
        ("path", "/api/./order", "/api/order"),
        ("path", "/api/x/../order", "/api/order"),
        ("path", "/api/%6Frder", "/api/order"),
        ("path", "/api\\\\order", "/api/order"),
        ("path_prefix", "/files/%7Euser/", "/files/~user/"),
        ("path_prefix", "/api/.", "/api/"),
    ] {
        refused(
            &format!("[[routes]]\nname = \"a\"\n{field} = \"{written}\"\n"),
            &format!("routes[0].{field}"),
            &format!("a route's path is written normalized (`serve` matches requests so): write {normalized:?}"),
        );
    }
    // A client percent-encodes a character that is not printable ASCII, and
    // normalization keeps the escape: `/café` never matched `/caf%C3%A9`.
    for (field, written, encoded) in [
        ("path", "/café", "/caf%C3%A9"),
        ("path", "/menü/{id}", "/men%C3%BC/{id}"),
        ("path_prefix", "/files/\\u0001", "/files/%01"),
    ] {
        refused(
            &format!("[[routes]]\nname = \"a\"\n{field} = \"{written}\"\n"),
            &format!("routes[0].{field}"),
            &format!(
                "must be printable ASCII, as clients send it (other characters \
                 percent-encoded in UTF-8): write {encoded:?}"
            ),
        );
    }
    let c = Config::from_toml_str(
        "[[routes]]\nname = \"a\"\npath = \"/caf%C3%A9/{thé}\"\n",
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Each spelling a client may send: escapes in either case, or the bytes unencoded.
    // (`/caf%c3%a9` and `/café` missed the route, and escaped its limit.)
    for sent in ["/caf%C3%A9/1", "/caf%c3%a9/1", "/café/1"] {
        let sent = rocgate::config::normalize_path(sent);
        assert!(c.routes[0].matcher.matches("GET", &sent), "{sent}");
    }
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/caf%c3%a9\"\n",
        "routes[0].path",
        "a route's path is written normalized (`serve` matches requests so): write \"/caf%C3%A9\"",
    );
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/api/items/{id\"\n",
        "routes[0].path",
        "invalid template \"/api/items/{id\"",
    );
    // One name for two segments passed check-config.
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/a/{id}/b/{ref}/{id}\"\n",
        "routes[0].path",
        "invalid template \"/a/{id}/b/{ref}/{id}\": the parameter {id} is named twice; \
         give each its own name",
    );
    Config::from_toml_str(
        "[[routes]]\nname = \"a\"\npath = \"/a/{id}/b/{ID}\"\n",
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // A catch-all (axum's `{*rest}`), last, takes the rest of the path, as axum's
    // router does: `/files/a/b` too, where it matched one segment (and, refused, it
    // broke a layer keyed by axum's `MatchedPath`, where it matched the template's own
    // text). Not an empty rest: `/files/` and `/files` are no path it takes, as for
    // matchit. (helper-268)
    let c = Config::from_toml_str(
        "[[routes]]\nname = \"a\"\npath = \"/files/{*rest}\"\n\
         [[routes]]\nname = \"b\"\npath = \"/u/{user}/{*rest}\"\n",
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    for (path, files, user) in [
        ("/files/a", true, false),
        ("/files/a/b", true, false),
        ("/files/a/b/", true, false),
        ("/files/{*rest}", true, false),
        ("/files/", false, false),
        ("/files", false, false),
        ("/u/x/a/b", false, true),
        ("/u/x/", false, false),
        ("/u//a", false, false),
    ] {
        assert_eq!(c.routes[0].matcher.matches("GET", path), files, "{path}");
        assert_eq!(c.routes[1].matcher.matches("GET", path), user, "{path}");
    }
    // Anywhere else it is refused: axum's router refuses it so.
    for path in ["/files/{*rest}/", "/files/{*rest}/x", "/{*a}/{*b}"] {
        refused(
            &format!("[[routes]]\nname = \"a\"\npath = \"{path}\"\n"),
            "routes[0].path",
            &format!("invalid template {path:?}: the catch-all "),
        );
    }
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/files/{*rest}/x\"\n",
        "routes[0].path",
        "the catch-all {*rest} takes the rest of the path, and must be the last segment \
         (with no trailing slash), as in \"/files/{*rest}\"",
    );
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/{*}\"\n",
        "routes[0].path",
        "invalid template \"/{*}\": each {param} must be a whole segment with a name",
    );
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/a/{id}/{*id}\"\n",
        "routes[0].path",
        "the parameter {id} is named twice",
    );
    // A pattern in another router's syntax (actix's and gorilla/mux's
    // `{id:[0-9]+}`), taken as a name, matched any one segment: `/items/abc` took
    // the route. (helper-258)
    for (path, name) in [
        ("/items/{id:[0-9]+}", "id:[0-9]+"),
        ("/items/{:id}", ":id"),
        ("/files/{*rest:.*}", "rest:.*"),
    ] {
        refused(
            &format!("[[routes]]\nname = \"a\"\npath = \"{path}\"\n"),
            "routes[0].path",
            &format!(
                "invalid template {path:?}: the parameter name {name:?} holds ':', a pattern \
                 in another router's syntax ({{id:[0-9]+}}), which is no part of this one's"
            ),
        );
    }
    // Any other name is a name, each matching one segment, as before helper-258's
    // check (`{a.b}`, OpenAPI's style, was refused by it): no pattern is read there.
    let c = Config::from_toml_str(
        "[[routes]]\nname = \"a\"\n\
         path = \"/a/{item_id}/b/{item-ref}/{thé}/{a.b}/{id+}/{x*}/{$v}\"\n",
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.routes[0].matcher.matches("GET", "/a/1/b/2/3/4/5/6/7"));
    assert!(!c.routes[0].matcher.matches("GET", "/a/1/b/2/3/4/5/6/7/8"));
    // A name with spaces (`{ id }`) stays refused, as before: no path holds whitespace.
    refused(
        "[[routes]]\nname = \"a\"\npath = \"/items/{ id }\"\n",
        "routes[0].path",
        "must not contain '?', '#' or whitespace",
    );
    refused(
        "[[routes]]\nname = \"a\"\nmethod = \"PO ST\"\npath = \"/a\"\n",
        "routes[0].method",
        "must be an HTTP method",
    );
    // A token, but written to mean "any": it matched no request. (helper-149)
    refused(
        "[[routes]]\nname = \"a\"\nmethod = \"*\"\npath = \"/a\"\n",
        "routes[0].method",
        "leave method out to take every method",
    );
    refused(
        &format!("[[routes]]\nname = \"all\"\npath_prefix = \"/\"\n{ORDER}"),
        "routes[1].path",
        "never matches: routes[0] (\"all\") comes first",
    );
    // An exact path takes its spelling without the trailing slash too, which a prefix
    // ending in one does not: `/api/order` reaches the later route (it was refused).
    let sub_first = "[[routes]]\nname = \"sub\"\npath_prefix = \"/api/order/\"\n\
         [[routes]]\nname = \"order\"\npath = \"/api/order/\"\n";
    Config::from_toml_str(sub_first, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    refused(
        "[[routes]]\nname = \"sub\"\npath_prefix = \"/api/order\"\n\
         [[routes]]\nname = \"order\"\npath = \"/api/order/\"\n",
        "routes[1].path",
        "never matches: routes[0] (\"sub\") comes first",
    );
    // A catch-all takes every path its rest can hold: a later route under it never
    // matches, one that reaches outside it (its segments before, or an empty rest)
    // does. (helper-268)
    let after_files = |later: &str| {
        format!(
            "[[routes]]\nname = \"files\"\npath = \"/files/{{*rest}}\"\n\
             [[routes]]\nname = \"later\"\n{later}\n"
        )
    };
    for (later, field) in [
        ("path = \"/files/a\"", "path"),
        ("path = \"/files/a/b/\"", "path"),
        ("path = \"/files/{id}\"", "path"),
        ("path = \"/files/{id}/x/{*more}\"", "path"),
        ("path = \"/files/{*other}\"", "path"),
        ("path_prefix = \"/files/a\"", "path_prefix"),
        ("path_prefix = \"/files/a/\"", "path_prefix"),
    ] {
        refused(
            &after_files(later),
            &format!("routes[1].{field}"),
            "never matches: routes[0] (\"files\") comes first and its path takes every request",
        );
    }
    for later in [
        "path = \"/files\"",
        "path = \"/files/\"",
        "path = \"/file/a\"",
        "path = \"/{dir}/a\"",
        "path = \"/{*any}\"",
        "path_prefix = \"/files/\"",
        "path_prefix = \"/files\"",
    ] {
        Config::from_toml_str(&after_files(later), "t.toml")
            .unwrap_or_else(|e| panic!("{later}: {e}"));
    }
    // And a catch-all after a route that covers it never matches.
    for first in [
        "path_prefix = \"/files/\"",
        "path = \"/{dir}/{*rest}\"",
        "path = \"/{*any}\"",
    ] {
        refused(
            &format!(
                "[[routes]]\nname = \"first\"\n{first}\n\
                 [[routes]]\nname = \"files\"\npath = \"/files/{{*rest}}\"\n"
            ),
            "routes[1].path",
            "never matches: routes[0] (\"first\") comes first",
        );
    }
    Config::from_toml_str(
        "[[routes]]\nname = \"first\"\npath = \"/files/{id}\"\n\
         [[routes]]\nname = \"files\"\npath = \"/files/{*rest}\"\n",
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    refused(
        "[defaults]\nhold = \"2s\"\n",
        "routes",
        "at least one [[routes]] table is required",
    );
}

#[test]
fn unknown_fields_and_values() {
    refused(&route("danger = 90"), "routes[0].danger", "unknown field");
    // A key holding a line break is written escaped, as a quoted TOML key: it made a
    // problem of two lines, where check-config promises one a line.
    let found = problems(&format!("[defaults]\n\"x\\ny\" = 1\n{ORDER}"));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].starts_with(r#"defaults."x\ny": unknown field `x\ny`, expected one of"#),
        "{found:#?}"
    );
    let found = problems(&format!("[defaults]\n\"x\\ty\" = 1e999\n{ORDER}"));
    assert!(
        found.len() == 1 && found[0].starts_with(r#"defaults."x\ty": number out of range"#),
        "{found:#?}"
    );
    // The admin API's changes are read by the same rules.
    let e = rocgate::config::patch_controller(
        &Default::default(),
        &Algorithm::default(),
        r#"{"x\ny": 1}"#,
        "PUT",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with(r#"PUT: "x\ny": unknown field `x\ny`"#) && !e.contains('\n'),
        "{e}"
    );
    refused("[default]\nhold = \"2s\"\n", "default", "unknown field");
    refused(
        &route("hold = \"2 parsecs\""),
        "routes[0].hold",
        "invalid duration \"2 parsecs\"",
    );
    refused(&route("hold = 2"), "routes[0].hold", "time unit needed");
    refused(
        &route("mode = \"audit\""),
        "routes[0].mode",
        "must be one of \"enforce\", \"shadow\", \"shadow_adaptive\", got \"audit\"",
    );
    refused(
        &route("mode = \"shadow_adaptive\"\nalgorithm = \"concurrency\""),
        "routes[0].mode",
        "shadow_adaptive cannot count what a cut would reject with the concurrency",
    );
    refused(
        &route("mode = \"shadow\"\nalgorithm = \"concurrency\"\nqueue = 4"),
        "routes[0].mode",
        "shadow admits every request at once, so a concurrency queue would hold \
         requests it should not: set queue = 0 (over-limit requests are then counted as \
         concurrency), or use enforce",
    );
    refused(
        &route("algorithm = \"fixed_window\"\nlimiter_window = \"60days\""),
        "routes[0].limiter_window",
        "must be at most 4294967295ms (49.7 days, what a window counter holds), got 5184000000ms",
    );
    refused(
        &route("burst = \"60days\""),
        "routes[0].burst",
        "must be at most 4294967295ms (49.7 days, what a token bucket keeps), got 5184000000ms",
    );
    refused(
        &route("partition = \"ip\"\nipv6_prefix = 129"),
        "routes[0].ipv6_prefix",
        "must be a prefix length from 1 to 128, got 129",
    );
    refused(
        &route("partition = \"header:x-api-key\"\nipv6_prefix = 56"),
        "routes[0].ipv6_prefix",
        r#"applies only to routes partitioned by client IP (partition = "ip")"#,
    );
    refused(
        &route("algorithm = \"gcra\""),
        "routes[0].algorithm",
        "must be one of \"token_bucket\"",
    );
    refused(
        &format!("[defaults]\nroc_mode = \"percent\"\n{ORDER}"),
        "defaults.roc_mode",
        "must be one of \"absolute\", \"relative\", got \"percent\"",
    );
    refused(
        &route("partition = \"cookie:sid\""),
        "routes[0].partition",
        "must be \"route\", \"ip\" or \"header:<name>\"",
    );
    refused(
        &route("partition = \"header:x api\""),
        "routes[0].partition",
        "\"x api\" is not a valid HTTP header name",
    );
    refused(
        &route("partition = \"header:\""),
        "routes[0].partition",
        "is not a valid HTTP header name",
    );
}

#[test]
fn settings_of_another_algorithm_or_partition_are_refused() {
    refused(
        &route("algorithm = \"fixed_window\"\nburst = \"2s\""),
        "routes[0].burst",
        "applies only to token_bucket, and this route uses fixed_window",
    );
    refused(
        &route("idle_timeout = \"1m\""),
        "routes[0].idle_timeout",
        "applies only to partitioned routes",
    );
}

#[test]
fn limits_must_suit_the_algorithm() {
    refused(
        &route("algorithm = \"fixed_window\"\nbase_limit = 2000000"),
        "routes[0].base_limit",
        &format!("base_limit × limiter_window must be at most {MAX_WINDOW_COUNT} requests"),
    );
    // The base limit comes from [defaults]; the window that makes it too big from the route.
    refused(
        &format!(
            "[defaults]\nbase_limit = 200000\n{}",
            route("algorithm = \"sliding_window\"\nlimiter_window = \"10s\"")
        ),
        "routes[0].base_limit",
        "got 2000000",
    );
    refused(
        &route("algorithm = \"fixed_window\"\nlimiter_window = \"100ms\"\ncut_limit = 5"),
        "routes[0].cut_limit",
        "must admit at least 1 request, got 0.5",
    );
    // The window counters keep their window to the millisecond: 1.5 ms would be 1 ms,
    // where a cut limit of 700/s admits nothing.
    refused(
        &route("algorithm = \"fixed_window\"\nlimiter_window = \"1500us\"\nbase_limit = 1000\ncut_limit = 700"),
        "routes[0].limiter_window",
        "must be a whole number of milliseconds, got 1ms 500us",
    );
    // A token bucket holds at most 4294967295 tokens: 10^6 req/s with a burst of 2 h
    // (7.2 × 10^9 tokens) was accepted and held 40% fewer, unsaid.
    refused(
        &route("base_limit = 1000000\ncut_limit = 1000\nburst = \"2h\""),
        "routes[0].base_limit",
        "base_limit × burst must be at most 4294967295 tokens (what a token bucket holds), got 7200000000",
    );
    // The burst from [defaults], a tier's limit against it, an event's profile.
    refused(
        &format!(
            "[defaults]\nburst = \"1h\"\n{}",
            route(
                "partition = \"ip\"\n[[routes.tiers]]\nname = \"bulk\"\nvalues = [\"10.0.0.1\"]\nbase_limit = 2000000\ncut_limit = 10"
            )
        ),
        "routes[0].tiers[0].base_limit",
        "base_limit × burst must be at most 4294967295 tokens",
    );
    refused(
        &route(
            "burst = \"1h\"\n[[routes.events]]\nname = \"sale\"\nstart = \"2030-01-01T00:00:00Z\"\nduration = \"1h\"\nbase_limit = 2000000"
        ),
        "routes[0].events[0].base_limit",
        "got 7200000000",
    );
    // At the bound it is taken: 1000 req/s for the longest burst, 4294967.295 s.
    Config::from_toml_str(
        &route("base_limit = 1000\ncut_limit = 100\nburst = \"4294967295ms\""),
        "test",
    )
    .unwrap();
    refused(
        &route("algorithm = \"concurrency\"\nbase_limit = 10.5\ncut_limit = 4\nrestore_step = 2"),
        "routes[0].base_limit",
        "must be a whole number ≥ 1 with algorithm concurrency",
    );
}

/// A limit is enforced as written or refused. The token and leaky buckets space
/// requests a whole number of nanoseconds apart: 7 × 10^8 req/s (1.43 ns) was taken
/// and enforced as 10^9, 1.5 × 10^8 as 1.43 × 10^8; above 2 × 10^6 (500 ns) the
/// rounding is more than 0.1%. `concurrency` counts permits in 32 bits: 5 × 10^9 was
/// taken and held to 4294967295. Every place a limit is written is checked: a route,
/// `[defaults]`, a tier, an event.
#[test]
fn limits_above_what_the_algorithm_enforces_are_refused() {
    let spaced = "must be at most 2000000 req/s with algorithm token_bucket (it spaces requests a whole number of nanoseconds apart, which above 2000000 req/s, 500 ns apart, moves the rate by more than 0.1%), got 700000000";
    refused(
        &route("base_limit = 700000000"),
        "routes[0].base_limit",
        spaced,
    );
    refused(
        &route("base_limit = 3000000\ncut_limit = 2000001"),
        "routes[0].cut_limit",
        "must be at most 2000000 req/s with algorithm token_bucket",
    );
    refused(
        &format!("[defaults]\nbase_limit = 150000000\n{ORDER}"),
        "defaults.base_limit",
        "must be at most 2000000 req/s with algorithm token_bucket",
    );
    // The limit from [defaults], the algorithm that bounds it from the route.
    refused(
        &format!(
            "[defaults]\nbase_limit = 3000000\n{}",
            route("algorithm = \"leaky_bucket\"")
        ),
        "routes[0].base_limit",
        "must be at most 2000000 req/s with algorithm leaky_bucket",
    );
    refused(
        &route(
            "partition = \"ip\"\n[[routes.tiers]]\nname = \"bulk\"\nvalues = [\"10.0.0.1\"]\nbase_limit = 5000000\ncut_limit = 10"
        ),
        "routes[0].tiers[0].base_limit",
        "must be at most 2000000 req/s with algorithm token_bucket",
    );
    refused(
        &route(
            "[[routes.events]]\nname = \"sale\"\nstart = \"2030-01-01T00:00:00Z\"\nduration = \"1h\"\nbase_limit = 100000000"
        ),
        "routes[0].events[0].base_limit",
        "must be at most 2000000 req/s with algorithm token_bucket",
    );
    refused(
        &route("algorithm = \"concurrency\"\nbase_limit = 5000000000\ncut_limit = 4"),
        "routes[0].base_limit",
        "must be at most 4294967295 with algorithm concurrency (what its count of requests in flight holds), got 5000000000",
    );
    // At the bounds they are taken; the window counters count whole requests, exactly
    // at any rate, and are bounded by their count a window alone.
    for (extra, limit) in [
        ("", 2e6),
        ("algorithm = \"leaky_bucket\"", 2e6),
        ("algorithm = \"concurrency\"", 4_294_967_295.0),
        (
            "algorithm = \"fixed_window\"\nlimiter_window = \"1ms\"",
            1e9,
        ),
        (
            "algorithm = \"sliding_window\"\nlimiter_window = \"1ms\"",
            1e9,
        ),
    ] {
        let text = route(&format!(
            "{extra}\nbase_limit = {limit}\ncut_limit = {limit}"
        ));
        let c = Config::from_toml_str(&text, "test").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.routes[0].controller.base_limit_rps, limit, "{text}");
    }
}

#[test]
fn tiers() {
    let tier =
        "[[routes.tiers]]\nname = \"vip\"\nvalues = [\"k1\"]\nbase_limit = 100\ncut_limit = 200\n";
    refused(
        &route(tier),
        "routes[0].tiers",
        "only partitioned routes have tiers",
    );
    let keyed = route(&format!("partition = \"header:x-api-key\"\n{tier}"));
    refused(
        &keyed,
        "routes[0].tiers[0].cut_limit",
        "must be ≤ base_limit (100), got 200",
    );
    refused(
        &route("partition = \"ip\"\n[[routes.tiers]]\nname = \"office\"\nvalues = [\"10.0.0.300\"]\nbase_limit = 100\ncut_limit = 50"),
        "routes[0].tiers[0].values[0]",
        "must be an IP address, got \"10.0.0.300\"",
    );
    refused(
        &route("partition = \"ip\"\n[[routes.tiers]]\nname = \"office\"\nvalues = [\"10.0.0.1\"]\ncut_limit = 50"),
        "routes[0].tiers[0].base_limit",
        "required",
    );
    refused(
        &route(
            "partition = \"header:x-key\"\n\
             [[routes.tiers]]\nname = \"a\"\nvalues = [\"k\"]\nbase_limit = 10\ncut_limit = 5\n\
             [[routes.tiers]]\nname = \"b\"\nvalues = [\"k\"]\nbase_limit = 10\ncut_limit = 5",
        ),
        "routes[0].tiers[1].values[0]",
        "duplicate of routes[0].tiers[0].values[0] (\"k\")",
    );
    // Two values that are one client, as the engine keys it: the second tier was
    // never applied (its client got the first's limits), and the file said `ok`.
    let ip_tiers = |a: &str, b: &str, extra: &str| {
        route(&format!(
            "partition = \"ip\"\n{extra}\n\
             [[routes.tiers]]\nname = \"vip\"\nvalues = [\"{a}\"]\nbase_limit = 100\ncut_limit = 50\n\
             [[routes.tiers]]\nname = \"blocked\"\nvalues = [\"{b}\"]\nbase_limit = 1\ncut_limit = 1"
        ))
    };
    refused(
        &ip_tiers("2001:db8::1", "2001:db8::2", ""),
        "routes[0].tiers[1].values[0]",
        "the same client as routes[0].tiers[0].values[0] (\"2001:db8::2\" is keyed as 2001:db8::/64, by ipv6_prefix)",
    );
    refused(
        &ip_tiers("10.0.0.1", "::ffff:10.0.0.1", ""),
        "routes[0].tiers[1].values[0]",
        "the same client as routes[0].tiers[0].values[0] (\"::ffff:10.0.0.1\" is keyed as 10.0.0.1",
    );
    // Apart under a longer prefix.
    Config::from_toml_str(
        &ip_tiers("2001:db8::1", "2001:db8::2", "ipv6_prefix = 128"),
        "test",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // A header value arrives trimmed and without control characters: a tier value
    // with either would never match. (Values as TOML writes them.)
    let header_tier = |value: &str| {
        route(&format!(
            "partition = \"header:x-key\"\n[[routes.tiers]]\nname = \"a\"\nvalues = [{value}]\nbase_limit = 10\ncut_limit = 5"
        ))
    };
    for value in [r#"" k""#, r#""k ""#, r#""k\n""#, r#""a\u007Fb""#, r#""\t""#] {
        refused(
            &header_tier(value),
            "routes[0].tiers[0].values[0]",
            "can never match: a header value has no control characters",
        );
    }
    // A value of any length may be a tier's: a long one is keyed by its digest, which
    // the tier's value is matched by (tests/layer.rs).
    let long = format!("{:?}", "k".repeat(1025));
    for value in [r#""café""#, r#""a b""#, r#""a\tb""#, r#""k1""#, &long] {
        Config::from_toml_str(&header_tier(value), "t.toml")
            .unwrap_or_else(|e| panic!("{value:?}: {e}"));
    }
    // A `header:host` partition keys by the host in lower case.
    let host_tier = |value: &str| {
        route(&format!(
            "partition = \"header:Host\"\n[[routes.tiers]]\nname = \"a\"\nvalues = [{value:?}]\nbase_limit = 10\ncut_limit = 5"
        ))
    };
    for (value, key) in [
        ("Shop.example", "shop.example"),
        ("shop.example:8080", "shop.example"),
        ("shop.example.", "shop.example"),
        ("[2001:DB8::1]:80", "[2001:db8::1]"),
    ] {
        refused(
            &host_tier(value),
            "routes[0].tiers[0].values[0]",
            &format!("can never match: a host is keyed by its name in lower case, without a port or a trailing dot ({key:?}), got {value:?}"),
        );
    }
    Config::from_toml_str(&host_tier("shop.example"), "t.toml").unwrap();
    // A `header:authorization` (or `proxy-authorization`) partition keys credentials
    // by their scheme in lower case and one space.
    for header in ["Authorization", "proxy-authorization"] {
        let credentials_tier = |value: &str| {
            route(&format!(
                "partition = \"header:{header}\"\n[[routes.tiers]]\nname = \"a\"\nvalues = [{value:?}]\nbase_limit = 10\ncut_limit = 5"
            ))
        };
        for (value, key) in [
            ("Bearer gold-Token", "bearer gold-Token"),
            ("bearer  gold-Token", "bearer gold-Token"),
            ("BASIC\tZ29sZA==", "basic Z29sZA=="),
        ] {
            refused(
                &credentials_tier(value),
                "routes[0].tiers[0].values[0]",
                &format!("can never match: credentials are keyed by their scheme in lower case, one space, then the credentials as sent ({key:?}), got {value:?}"),
            );
        }
        for value in ["bearer gold-Token", "Gold-Token", "basic Z29sZA=="] {
            Config::from_toml_str(&credentials_tier(value), "t.toml")
                .unwrap_or_else(|e| panic!("{header}, {value:?}: {e}"));
        }
    }
}

#[test]
fn events() {
    let event = |start: &str, duration: &str| {
        format!("[[routes.events]]\nname = \"e{start}\"\nstart = \"{start}\"\nduration = \"{duration}\"\n")
    };
    refused(
        &route(&event("next friday", "30m")),
        "routes[0].events[0].start",
        "must be an RFC 3339 UTC time such as \"2026-11-27T20:00:00Z\"",
    );
    refused(
        &route(&event("2026-11-27T20:00:00+01:00", "30m")),
        "routes[0].events[0].start",
        "in UTC: Z, or an offset of +00:00",
    );
    refused(
        &route(&event("2026-11-27T20:00:00Z", "0s")),
        "routes[0].events[0].duration",
        "must be longer than zero",
    );
    // Shorter than a slot, it could fall between two slots' ends, where the profile
    // due is taken, and never be in force.
    refused(
        &route(&event("2026-11-27T20:00:00Z", "50ms")),
        "routes[0].events[0].duration",
        "must be at least the route's slot (100ms), got 50ms",
    );
    Config::from_toml_str(&route(&event("2026-11-27T20:00:00Z", "100ms")), "t.toml").unwrap();
    // RFC 3339's `t` and `z` may be lower case, and a space may stand for the `T`: each
    // spelling is one time. (Lower case was refused.)
    let start = |text: &str| {
        let table =
            format!("[[routes.events]]\nname = \"e\"\nstart = \"{text}\"\nduration = \"1m\"");
        Config::from_toml_str(&route(&table), "t.toml")
            .unwrap()
            .routes[0]
            .events[0]
            .start
    };
    let upper = start("2026-11-27T20:00:00Z");
    assert_eq!(start("2026-11-27t20:00:00z"), upper);
    assert_eq!(start("2026-11-27 20:00:00Z"), upper);
    refused(
        &route(&format!(
            "{}{}",
            event("2026-11-27T20:00:00Z", "30m"),
            event("2026-11-27T20:29:00Z", "5m")
        )),
        "routes[0].events[1].start",
        "overlaps routes[0].events[0], which runs until 2026-11-27T20:30:00Z",
    );
    // An end past what RFC 3339 can write: said in words (its formatting panicked).
    refused(
        &route(&format!(
            "{}{}",
            event("9999-06-01T00:00:00Z", "365days"),
            event("9999-12-01T00:00:00Z", "1h")
        )),
        "routes[0].events[1].start",
        "overlaps routes[0].events[0], which runs until a time after 9999-12-31T23:59:59Z",
    );
    refused(
        &route(&format!(
            "{}cut_limit = 500\n",
            event("2026-11-27T20:00:00Z", "30m")
        )),
        "routes[0].events[0].cut_limit",
        "must be ≤ base_limit (200), got 500",
    );
    refused(
        &route("[[routes.events]]\nname = \"e\"\nduration = \"1m\""),
        "routes[0].events[0].start",
        "required",
    );
    refused(
        &route(&format!(
            "{}min_rps = -1\n",
            event("2026-11-27T20:00:00Z", "30m")
        )),
        "routes[0].events[0].min_rps",
        "must be a number ≥ 0",
    );
}

#[test]
fn relative_thresholds_must_be_given() {
    refused(
        &route("roc_mode = \"relative\""),
        "routes[0].danger_roc",
        "must be set when roc_mode is relative",
    );
    refused(
        &route("roc_mode = \"relative\"\ndanger_roc = 1.0\nsafe_roc = -2"),
        "routes[0].safe_roc",
        "must be > -1 when roc_mode is relative",
    );
    // Thresholds written where the mode was another are in its unit (req/s per half-window or a
    // ratio): inherited across a change of mode, they were read in the wrong one.
    refused(
        &format!("[defaults]\ndanger_roc = 50\nsafe_roc = 10\n{ORDER}roc_mode = \"relative\"\n"),
        "routes[0].danger_roc",
        "must be set with roc_mode where it changes the mode: the danger_roc in force (50)",
    );
    refused(
        &route("danger_roc = 90\n[[routes.events]]\nname = \"e\"\nstart = \"2026-11-27T20:00:00Z\"\nduration = \"1h\"\nroc_mode = \"relative\"\nsafe_roc = 0.1"),
        "routes[0].events[0].danger_roc",
        "this mode reads it as a ratio",
    );
    refused(
        &format!("[defaults]\nroc_mode = \"relative\"\ndanger_roc = 1.0\nsafe_roc = 0.2\n{ORDER}roc_mode = \"absolute\"\n"),
        "routes[0].safe_roc",
        "this mode reads it as req/s per half-window",
    );
    for ok in [
        format!("[defaults]\nroc_mode = \"relative\"\ndanger_roc = 1.0\nsafe_roc = 0.2\n{ORDER}"),
        format!("[defaults]\ndanger_roc = 50\n{ORDER}roc_mode = \"relative\"\ndanger_roc = 1.0\nsafe_roc = 0.2\n"),
        format!("[defaults]\nroc_mode = \"relative\"\ndanger_roc = 1.0\nsafe_roc = 0.2\n{ORDER}roc_mode = \"relative\"\n"),
    ] {
        Config::from_toml_str(&ok, "t.toml").unwrap_or_else(|e| panic!("{ok}\n{e}"));
    }
}

#[test]
fn syntax_errors_carry_the_position() {
    refused(
        "[[routes]]\nname = \"order\npath = \"/a\"\n",
        "line 2, column 14",
        "invalid basic string",
    );
    // A key of 100 parts (more than 80), which the parser refuses without a position: it was
    // `bad.toml: recursion limit`, the file named and no line. (helper-258)
    let deep = vec!["a"; 100].join(".");
    for (text, line) in [
        (format!("{ORDER}\n# a comment\n{deep} = 1\nb = 2\n"), 6),
        (format!("[{deep}]\nb = 1\n{ORDER}"), 1),
        (format!("{ORDER}base_limit = 5\nx = {{ {deep} = 1 }}\n"), 5),
        (format!("{ORDER}{} = 1\n", vec!["a"; 81].join(".")), 4),
    ] {
        assert_eq!(
            problems(&text),
            [format!(
                "line {line}: recursion limit: a key of more than 80 parts (a.b.c…, a table's \
                 header too) is more than the TOML parser reads"
            )],
            "{text}"
        );
    }
    // 80 parts are read: the key is then unknown, at its place.
    refused(
        &format!("{}.a = 1\n{ORDER}", vec!["x"; 79].join(".")),
        "x",
        "unknown field `x`",
    );
}

/// A number TOML reads but 64 bits cannot hold is named with its field and position
/// (the `config` crate reports it with neither).
#[test]
fn a_number_too_large_names_its_field_and_line() {
    refused(
        &route("base_limit = 1e400"),
        "routes[0].base_limit",
        "number out of range at line 4, column 14",
    );
    refused(
        &format!("{ORDER}[server]\nmax_body_bytes = 99999999999999999999\n"),
        "server.max_body_bytes",
        "number out of range at line 5, column 18",
    );
    refused(
        &format!("{ORDER}[[routes.tiers]]\nname = \"t\"\nvalues = [\"a\"]\nbase_limit = -1e999\n"),
        "routes[0].tiers[0].base_limit",
        "number out of range at line 7",
    );
}

/// A negative duration says so, rather than humantime's "expected number at 0".
#[test]
fn durations_need_a_unit_and_a_sign_they_can_have() {
    refused(
        &route("hold = \"-1s\""),
        "routes[0].hold",
        "must not be negative, got \"-1s\"",
    );
    refused(&route("hold = \"2\""), "routes[0].hold", "time unit needed");
    refused(&route("hold = 2"), "routes[0].hold", "time unit needed");
}

#[test]
fn several_errors_are_all_reported_each_once() {
    let text = "\
[defaults]
hold = \"soon\"
slot = \"700ms\"

[[routes]]
name = \"order\"
path = \"/api/order\"
cut_limit = 300

[[routes]]
name = \"order\"
path = \"api/seckill\"
mode = \"loud\"

[[routes]]
name = \"x y\"
path = \"/c\"
";
    let found = problems(text);
    let expected = [
        "defaults.hold: invalid duration \"soon\"",
        "defaults.slot: slot (700ms) must divide the window (6s)",
        "routes[0].cut_limit: must be ≤ base_limit (200), got 300",
        "routes[1].mode: must be one of",
        "routes[1].path: must start with '/'",
        "routes[2].name: must be non-empty",
        "routes[1].name: duplicate of routes[0].name (\"order\")",
    ];
    for e in expected {
        assert_eq!(
            found.iter().filter(|l| l.starts_with(e)).count(),
            1,
            "{e} in\n{}",
            found.join("\n")
        );
    }
    // The duplicate name is reported beside routes[1]'s own problems (it showed only
    // once they were fixed).
    assert_eq!(found.len(), expected.len(), "{}", found.join("\n"));
}

/// An override whose value is not UTF-8 is refused, naming its variable: it was read
/// with its bytes replaced by U+FFFD, an admin token of "\u{FFFD}\u{FFFD}" nobody wrote.
/// (helper-149)
#[test]
fn an_override_that_is_not_utf8_is_refused() {
    use std::os::unix::ffi::OsStrExt;
    let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .arg("check-config")
        .arg(config_dir().join("rocgate.toml"))
        .env(
            "ROCGATE__ADMIN__TOKEN",
            std::ffi::OsStr::from_bytes(b"\xff\xfe"),
        )
        .env("ROCGATE__DEFAULTS__SAFE_ROC", "90")
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    let file = config_dir().join("rocgate.toml");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "{0}: admin.token: not UTF-8 text (set by environment variable ROCGATE__ADMIN__TOKEN)\n\
             {0}: defaults.safe_roc: must be < danger_roc (80), got 90 (set by environment variable ROCGATE__DEFAULTS__SAFE_ROC)\n",
            file.display()
        )
    );
}

/// An override's name is shown with its control characters escaped, and bounded past
/// 256 bytes: an escape sequence in a name whose value is not UTF-8 went to the
/// terminal, and a 100 KiB name was written whole, twice.
#[test]
fn an_override_name_is_shown_escaped_and_bounded() {
    use std::os::unix::ffi::OsStrExt;
    let long = format!("ROCGATE__SERVER__{}", "A".repeat(100 << 10));
    let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .arg("check-config")
        .arg(config_dir().join("rocgate.toml"))
        .env(
            "ROCGATE__ADMIN__\u{1b}[2J",
            std::ffi::OsStr::from_bytes(b"\xff"),
        )
        .env(&long, "1")
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains('\u{1b}'), "{stderr}");
    assert!(
        stderr.contains(
            "admin.\\u{1b}[2j: not UTF-8 text (set by environment variable ROCGATE__ADMIN__\\u{1b}[2J)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "(set by environment variable {}… ({} bytes))",
            &long[..64],
            long.len()
        )),
        "{stderr}"
    );
    assert!(stderr.len() < 2048, "{} bytes", stderr.len());
}

#[test]
fn env_override_changes_a_default() {
    let text =
        std::fs::read_to_string(config_dir().join("rocgate.toml")).expect("the default config");
    let env = [
        ("ROCGATE__DEFAULTS__DANGER_ROC".to_owned(), "95".to_owned()),
        ("ROCGATE__ROUTES__1__CUT_LIMIT".to_owned(), "40".to_owned()),
    ];
    let c = Config::from_toml_str_with_env(&text, "rocgate.toml", env)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[0].controller.danger_roc, 95.0);
    assert_eq!(c.routes[1].controller.cut_limit_rps, 40.0);
    // The catch-all route sets its own threshold, which wins over [defaults].
    assert_eq!(c.routes[2].controller.danger_roc, 400.0);

    let env = [("ROCGATE__DEFAULTS__SAFE_ROC".to_owned(), "90".to_owned())];
    let e = Config::from_toml_str_with_env(&text, "rocgate.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rocgate.toml: defaults.safe_roc: must be < danger_roc (80), got 90 \
         (set by environment variable ROCGATE__DEFAULTS__SAFE_ROC)"
    );
    // Both fields of the problem set by variables: both are named.
    let env = [
        ("ROCGATE__DEFAULTS__SAFE_ROC".to_owned(), "90".to_owned()),
        ("ROCGATE__DEFAULTS__DANGER_ROC".to_owned(), "85".to_owned()),
    ];
    let e = Config::from_toml_str_with_env(&text, "rocgate.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rocgate.toml: defaults.safe_roc: must be < danger_roc (85), got 90 \
         (set by environment variable ROCGATE__DEFAULTS__SAFE_ROC; \
         danger_roc set by environment variable ROCGATE__DEFAULTS__DANGER_ROC)"
    );
}

/// The environment's overrides are text, so a number there is read from its text
/// (`ROCGATE__ROUTES__0__BASE_LIMIT=300`), and text that is no number is refused naming
/// the variable; a runtime change is JSON, which has numbers, and refuses the same
/// text written as a string (`{"base_limit": "300"}`), naming the field. The two share
/// the file's rules but not this: the change took `"300"` for 300.
#[test]
fn a_number_from_the_environment_is_text_and_from_a_change_a_number() {
    let env = [
        (
            "ROCGATE__ROUTES__0__BASE_LIMIT".to_owned(),
            "300".to_owned(),
        ),
        (
            "ROCGATE__ROUTES__0__MIN_SAMPLES".to_owned(),
            " 7".to_owned(),
        ),
        (
            "ROCGATE__DEFAULTS__DANGER_ROC".to_owned(),
            "2.5e1".to_owned(),
        ),
        ("ROCGATE__DEFAULTS__SAFE_ROC".to_owned(), "5".to_owned()),
    ];
    let c = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_or_else(|e| panic!("{e}"));
    let order = &c.routes[0].controller;
    assert_eq!(order.base_limit_rps, 300.0);
    assert_eq!(order.min_samples, 7);
    assert_eq!(order.danger_roc, 25.0);
    let env = [
        (
            "ROCGATE__ROUTES__0__BASE_LIMIT".to_owned(),
            "lots".to_owned(),
        ),
        (
            "ROCGATE__ROUTES__0__MIN_SAMPLES".to_owned(),
            "2.5".to_owned(),
        ),
    ];
    let e = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.toml: routes[0].base_limit: invalid value: string \"lots\", expected a number \
         (set by environment variable ROCGATE__ROUTES__0__BASE_LIMIT)\n\
         t.toml: routes[0].min_samples: invalid value: string \"2.5\", expected a whole number ≥ 0 \
         (set by environment variable ROCGATE__ROUTES__0__MIN_SAMPLES)"
    );
    let e = rocgate::config::patch_controller(
        &c.routes[0].controller,
        &c.routes[0].algorithm,
        r#"{"base_limit": "300", "min_samples": "7"}"#,
        "PUT",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "PUT: base_limit: must be a number, got the string \"300\" (write it without quotes: 300)\n\
         PUT: min_samples: must be a whole number ≥ 0, got the string \"7\" (write it without quotes: 7)"
    );
}

/// `proxy_protocol` is set from the environment as any `[server]` field, and refused
/// there as in the file, naming the variable.
#[test]
fn env_override_sets_proxy_protocol() {
    let text = route("[server]\ntrusted_proxies = [\"10.0.0.0/8\"]");
    let env = [(
        "ROCGATE__SERVER__PROXY_PROTOCOL".to_owned(),
        "v1".to_owned(),
    )];
    let c = Config::from_toml_str_with_env(&text, "rocgate.toml", env)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.proxy_protocol, ProxyProtocol::V1);
    let env = [(
        "ROCGATE__SERVER__PROXY_PROTOCOL".to_owned(),
        "on".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(&text, "rocgate.toml", env).unwrap_err();
    assert!(
        e.to_string().contains("server.proxy_protocol: must be")
            && e.to_string().contains("ROCGATE__SERVER__PROXY_PROTOCOL"),
        "{e}"
    );
    // A list, as trusted_proxies: comma-separated from the environment.
    let env = [
        (
            "ROCGATE__SERVER__PROXY_PROTOCOL".to_owned(),
            "v2".to_owned(),
        ),
        (
            "ROCGATE__SERVER__PROXY_PROTOCOL_FROM".to_owned(),
            "10.1.0.0/16,10.2.0.0/16".to_owned(),
        ),
    ];
    let c = Config::from_toml_str_with_env(ORDER, "rocgate.toml", env)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.server.proxy_protocol_from,
        Some(vec![
            "10.1.0.0/16".parse().unwrap(),
            "10.2.0.0/16".parse().unwrap()
        ])
    );
}

/// The list fields of `[server]`, `[admin]` and `[store]` take one string of
/// comma-separated items from the environment (a container's settings come from it),
/// each read without the spaces around it; an empty item is refused naming the
/// variable and its position, and a value that is neither a list nor a string names
/// the field and what it takes. They were refused from the environment as `invalid
/// type: string, expected a sequence`, and `cluster_nodes = 5` as `data did not match
/// any variant of untagged enum NodeList`.
#[test]
fn list_fields_take_a_comma_separated_string_from_the_environment() {
    let with_env = |text: &str, var: &str, value: &str| {
        Config::from_toml_str_with_env(text, "t.toml", [(var.to_owned(), value.to_owned())])
    };
    let c = with_env(
        ORDER,
        "ROCGATE__SERVER__TRUSTED_PROXIES",
        "10.0.0.0/8, 192.168.0.0/16",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.server.trusted_proxies,
        vec![
            "10.0.0.0/8".parse::<ipnet::IpNet>().unwrap(),
            "192.168.0.0/16".parse().unwrap()
        ]
    );
    let c = with_env(
        ORDER,
        "ROCGATE__ADMIN__ALLOWED_HOSTS",
        " rocgate.internal ,ops.internal",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.server.admin_allowed_hosts,
        vec!["rocgate.internal".to_owned(), "ops.internal".to_owned()]
    );
    // The variable replaces the file's list whole.
    let c = with_env(
        &route("[server]\ntrusted_proxies = [\"0.0.0.0/0\"]"),
        "ROCGATE__SERVER__TRUSTED_PROXIES",
        "10.0.0.0/8",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.server.trusted_proxies,
        vec!["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]
    );

    for (value, i) in [
        ("10.0.0.0/8,,x", 1),
        ("10.0.0.0/8,", 1),
        (" ,10.0.0.0/8", 0),
    ] {
        let e = with_env(ORDER, "ROCGATE__SERVER__TRUSTED_PROXIES", value).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "t.toml: server.trusted_proxies: item {i} (counted from 0) of the \
                 comma-separated list is empty: write one item between two commas, and no \
                 comma after the last (set by environment variable \
                 ROCGATE__SERVER__TRUSTED_PROXIES)"
            ),
            "{value:?}"
        );
    }
    // A string of no item at all is told how to write an empty list, not where its
    // comma goes (it was "item 0 … is empty: write one item between two commas").
    let nothing = "lists nothing (an empty string): write [] in the file for an empty list";
    for text in ["", " \t"] {
        let file = route(&format!("[admin]\nallowed_hosts = \"{text}\""));
        assert_eq!(
            problems(&file),
            [format!("admin.allowed_hosts: {nothing}")],
            "{text:?}"
        );
    }
    let e = with_env(ORDER, "ROCGATE__STORE__CLUSTER_NODES", "  ").unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "t.toml: store.cluster_nodes: {nothing} (set by environment variable \
             ROCGATE__STORE__CLUSTER_NODES)"
        )
    );
    let c = Config::from_toml_str(&route("[admin]\nallowed_hosts = []"), "t.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(c.server.admin_allowed_hosts.is_empty());
    // An item that is no network is refused at its index, as in the file.
    let e = with_env(ORDER, "ROCGATE__SERVER__TRUSTED_PROXIES", "10.0.0.0/8, x").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("t.toml: server.trusted_proxies[1]: ")
            && e.to_string()
                .ends_with("(set by environment variable ROCGATE__SERVER__TRUSTED_PROXIES)"),
        "{e}"
    );

    refused(
        &route("[store]\nbackend = \"redis\"\ncluster_nodes = 5"),
        "store.cluster_nodes",
        "invalid type: integer `5`, expected a list of Redis URLs, or a comma-separated string",
    );
    refused(
        &route("[server]\ntrusted_proxies = true"),
        "server.trusted_proxies",
        "invalid type: boolean `true`, expected a list of networks (such as \"10.0.0.0/8\"), \
         or a comma-separated string",
    );
    refused(
        &route("[admin]\nallowed_hosts = { a = 1 }"),
        "admin.allowed_hosts",
        "invalid type: map, expected a list of host names, or a comma-separated string",
    );
}

/// `trusted_hops` is set from the environment (text, read as a whole number), and
/// refused there as in the file, beside `trusted_proxies` or above 10, naming the
/// variable.
#[test]
fn env_override_sets_trusted_hops() {
    let var = |value: &str| [("ROCGATE__SERVER__TRUSTED_HOPS".to_owned(), value.to_owned())];
    let c = Config::from_toml_str_with_env(&route(""), "rocgate.toml", var("2"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.trusted_hops, 2);
    for (text, value, message) in [
        (
            route(""),
            "11",
            "server.trusted_hops: must be at most 10, got 11",
        ),
        (route(""), "two", "expected a whole number ≥ 0"),
        (
            route("[server]\ntrusted_proxies = [\"10.0.0.0/8\"]"),
            "1",
            "server.trusted_hops: cannot be combined with server.trusted_proxies",
        ),
    ] {
        let e = Config::from_toml_str_with_env(&text, "rocgate.toml", var(value)).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains(message) && e.contains("ROCGATE__SERVER__TRUSTED_HOPS"),
            "{value}: {e}"
        );
    }
}

#[test]
fn env_override_of_no_field_is_refused_and_an_empty_value_skipped() {
    let text =
        std::fs::read_to_string(config_dir().join("rocgate.toml")).expect("the default config");
    // `ROCGATE__` alone names no field: it was ignored, as a variable without the prefix.
    let env = [("ROCGATE__".to_owned(), "5".to_owned())];
    let e = Config::from_toml_str_with_env(&text, "rocgate.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rocgate.toml: not a field path: each part between `__` must be a field name \
         (letters, digits, _) or an index (set by environment variable ROCGATE__)"
    );
    // An empty value is no override, whatever the name: the file's value stays.
    let env = [
        ("ROCGATE__".to_owned(), String::new()),
        ("ROCGATE__ROUTES__0__BASE_LIMIT".to_owned(), String::new()),
    ];
    let c = Config::from_toml_str_with_env(&text, "rocgate.toml", env)
        .unwrap_or_else(|e| panic!("{e}"));
    let file = Config::from_toml_str(&text, "rocgate.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.routes[0].controller.base_limit_rps,
        file.routes[0].controller.base_limit_rps
    );
}

/// A problem between fields, or between routes, that a variable caused names it, as a
/// problem in the value it set does (it named none: the README said every one did).
#[test]
fn a_problem_a_variable_caused_names_it() {
    let two = "[[routes]]\nname = \"order\"\npath = \"/api/order\"\nalgorithm = \"concurrency\"\n\
               [[routes]]\nname = \"b\"\npath = \"/x\"\n";
    for (var, value, problem) in [
        (
            "ROCGATE__DEFAULTS__MODE",
            "shadow_adaptive",
            "routes[0].mode: shadow_adaptive cannot count what a cut would reject with the \
             concurrency algorithm (its shadow permits would be released at once): use \
             enforce or shadow, or another algorithm (defaults.mode set by environment \
             variable ROCGATE__DEFAULTS__MODE)",
        ),
        (
            "ROCGATE__ROUTES__0__PATH",
            "/x",
            "routes[1].path: never matches: routes[0] (\"order\") comes first and its path \
             takes every request it would (routes[0].path set by environment variable \
             ROCGATE__ROUTES__0__PATH)",
        ),
        (
            "ROCGATE__ROUTES__0__NAME",
            "b",
            "routes[1].name: duplicate of routes[0].name (\"b\") (routes[0].name set by \
             environment variable ROCGATE__ROUTES__0__NAME)",
        ),
        (
            "ROCGATE__SERVER__LISTEN",
            "127.0.0.1:9090",
            "admin.listen: 127.0.0.1:9090 takes the port of server.listen (127.0.0.1:9090): \
             the proxy and the admin API need an address each (server.listen set by \
             environment variable ROCGATE__SERVER__LISTEN)",
        ),
    ] {
        let env = [(var.to_owned(), value.to_owned())];
        let e = Config::from_toml_str_with_env(two, "t.toml", env).unwrap_err();
        assert_eq!(e.to_string(), format!("t.toml: {problem}"));
    }
    // A route that sets the field itself does not take the variable's value.
    let own = two.replace("algorithm", "mode = \"shadow_adaptive\"\nalgorithm");
    let env = [(
        "ROCGATE__DEFAULTS__MODE".to_owned(),
        "shadow_adaptive".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(&own, "t.toml", env).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("t.toml: routes[0].mode: shadow_adaptive cannot count")
            && !e.to_string().contains("ROCGATE__"),
        "{e}"
    );
    // A variable on a field of another route that the message does not name is not
    // the cause.
    let env = [(
        "ROCGATE__ROUTES__0__BASE_LIMIT".to_owned(),
        "300".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(&format!("{two}{ORDER}"), "t.toml", env).unwrap_err();
    assert!(!e.to_string().contains("ROCGATE__"), "{e}");
}

/// An element of a list of values is not set from the environment: an element the file
/// has was replaced (`ROCGATE__SERVER__TRUSTED_PROXIES__0=0.0.0.0/0` trusted every
/// peer's `X-Forwarded-For`, where the README said it could not be set). The refusal
/// of an element of a list the environment sets whole (`trusted_proxies`,
/// `proxy_protocol_from`, `allowed_hosts`, `cluster_nodes`) names the variable that
/// does; it said "a list of values is set in the file", which they no longer are only.
#[test]
fn an_element_of_a_list_of_values_is_not_set_from_the_environment() {
    let text = format!(
        "{ORDER}partition = \"header:x-api-key\"\n[[routes.tiers]]\nname = \"vip\"\n\
         values = [\"k1\"]\nbase_limit = 500\ncut_limit = 150\n\
         [server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n"
    );
    Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    // (variable, element, whether the environment sets its list whole)
    for (var, element, whole) in [
        (
            "ROCGATE__SERVER__TRUSTED_PROXIES__0",
            "server.trusted_proxies[0]",
            true,
        ),
        (
            "ROCGATE__SERVER__TRUSTED_PROXIES__1",
            "server.trusted_proxies[1]",
            true,
        ),
        (
            "rocgate__server__proxy_protocol_from__0",
            "server.proxy_protocol_from[0]",
            true,
        ),
        (
            "ROCGATE__ADMIN__ALLOWED_HOSTS__2",
            "admin.allowed_hosts[2]",
            true,
        ),
        (
            "ROCGATE__STORE__CLUSTER_NODES__0",
            "store.cluster_nodes[0]",
            true,
        ),
        (
            "ROCGATE__ROUTES__0__TIERS__0__VALUES__0",
            "routes[0].tiers[0].values[0]",
            false,
        ),
        ("ROCGATE__ROUTES__0__NAME__0", "routes[0].name[0]", false),
    ] {
        let how = match var.rsplit_once("__") {
            Some((list, _)) if whole => {
                format!("; set the whole list, its items separated by commas ({list}=…)")
            }
            _ => ", and a list of values is set in the file".to_owned(),
        };
        let env = [(var.to_owned(), "0.0.0.0/0".to_owned())];
        let e = Config::from_toml_str_with_env(&text, "t.toml", env).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "t.toml: {element}: cannot be set from the environment: an index may follow \
                 routes, events or tiers only{how} (set by environment variable {var})"
            )
        );
    }
    // A tier's values are not set whole either, as README says (a key may hold a comma).
    let env = [(
        "ROCGATE__ROUTES__0__TIERS__0__VALUES".to_owned(),
        "k1,k2".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(&text, "t.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.toml: routes[0].tiers[0].values: invalid type: string \"k1,k2\", expected a \
         sequence (set by environment variable ROCGATE__ROUTES__0__TIERS__0__VALUES)"
    );
    // The arrays of tables still take an index.
    let env = [(
        "ROCGATE__ROUTES__0__TIERS__0__BASE_LIMIT".to_owned(),
        "600".to_owned(),
    )];
    let c = Config::from_toml_str_with_env(&text, "t.toml", env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[0].tiers[0].base_limit_rps, 600.0);
}

/// TOML has numbers and booleans: a file that writes one as a string
/// (`base_limit = "300"`) is refused, naming the field and how to write it, every such
/// field listed, as a runtime change's JSON is. It was taken as the number, because the
/// file is read by the rules that read the environment's overrides, whose values are
/// text; those still are (`ROCGATE__ROUTES__0__BASE_LIMIT=300`), and a string field
/// whose text is a number (`name = "300"`) is a string.
#[test]
fn a_number_or_boolean_written_as_a_string_in_the_file_is_refused() {
    let text = format!(
        "{ORDER}base_limit = \"300\"\nmin_samples = \" 7\"\n\
         [[routes]]\nname = \"300\"\npath = \"/b\"\ncut_limit = \"2.5e1\"\n\
         [server]\nnormalize_path = \"true\"\n"
    );
    assert_eq!(
        problems(&text),
        [
            "routes[0].base_limit: must be a number, got the string \"300\" (write it without quotes: 300)",
            "routes[0].min_samples: must be a whole number ≥ 0, got the string \" 7\" (write it without quotes: 7)",
            "routes[1].cut_limit: must be a number, got the string \"2.5e1\" (write it without quotes: 2.5e1)",
            "server.normalize_path: must be true or false, got the string \"true\" (write it without quotes: true)",
        ]
    );
    let env = [(
        "ROCGATE__ROUTES__0__BASE_LIMIT".to_owned(),
        "300".to_owned(),
    )];
    let c = Config::from_toml_str_with_env(
        &format!("{ORDER}[[routes]]\nname = \"300\"\npath = \"/b\"\n"),
        "t.toml",
        env,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[0].controller.base_limit_rps, 300.0);
    assert_eq!(c.routes[1].name, "300");
}

/// The file is told to write a number without its quotes only where that is a number:
/// `base_limit = ".5"`, `"+5"` or `"Infinity"` without the quotes is no TOML; each is
/// refused as a string all the same. `"1e-400"` without the quotes is TOML, but a
/// number nearer 0 than any held, which the file refuses: it was advised.
#[test]
fn a_number_as_a_string_in_the_file_is_told_to_drop_the_quotes_only_where_that_reads() {
    let text = format!(
        "{ORDER}base_limit = \".5\"\ncut_limit = \"+5\"\ndanger_roc = \"Infinity\"\n\
         min_rps = \"1.5e1\"\nrestore_step = \"1e-400\"\n"
    );
    assert_eq!(
        problems(&text),
        [
            "routes[0].base_limit: must be a number, got the string \".5\"",
            "routes[0].cut_limit: must be a number, got the string \"+5\"",
            "routes[0].danger_roc: must be a number, got the string \"Infinity\"",
            "routes[0].min_rps: must be a number, got the string \"1.5e1\" (write it without quotes: 1.5e1)",
            "routes[0].restore_step: must be a number, got the string \"1e-400\"",
        ]
    );
}

/// A number or boolean the file writes as a string is reported with the file's other
/// problems of shape, in the file's order, whatever its text (`"lots"`, `"2.0"` where a
/// whole number goes, `"1e400"`), at most 50 of them: it was reported only once the
/// file had no other problem of shape (`colour = 1` hid it), and text that reads as no
/// number the field takes as the environment's text is (``invalid value: string
/// "lots", expected a number``, ``number out of range, got "1e400"``, of a value the
/// file wrote as a string).
#[test]
fn a_number_as_a_string_is_reported_with_the_files_other_problems_of_shape() {
    let text = format!(
        "{ORDER}base_limit = \"300\"\ncolour = 1\nmin_samples = \"2.0\"\n\
         safe_roc = \"1e400\"\ndanger_roc = \"lots\"\n[server]\nnormalize_path = \"yes\"\n"
    );
    let found = problems(&text);
    assert_eq!(found.len(), 6, "{}", found.join("\n"));
    assert_eq!(
        found[0],
        "routes[0].base_limit: must be a number, got the string \"300\" (write it without quotes: 300)"
    );
    assert!(
        found[1].starts_with("routes[0].colour: unknown field `colour`"),
        "{}",
        found[1]
    );
    assert_eq!(
        found[2..],
        [
            "routes[0].min_samples: must be a whole number ≥ 0, got the string \"2.0\"",
            "routes[0].safe_roc: must be a number, got the string \"1e400\"",
            "routes[0].danger_roc: must be a number, got the string \"lots\"",
            "server.normalize_path: must be true or false, got the string \"yes\"",
        ]
    );
    let many: String = (0..60)
        .map(|i| format!("[[routes]]\nname = \"r{i}\"\npath = \"/{i}\"\nbase_limit = \"{i}\"\n"))
        .collect();
    let found = problems(&format!("{many}[server]\ncolour = 1\n"));
    assert_eq!(found.len(), 51, "{}", found.join("\n"));
    assert_eq!(
        found[49],
        "routes[49].base_limit: must be a number, got the string \"49\" (write it without quotes: 49)"
    );
    assert_eq!(
        found[50],
        "more problems of shape follow: the first 50 are reported"
    );
}

/// A name where a list of tables takes an index (`ROCGATE__ROUTES__ORDER__HOLD`, the
/// route named rather than counted) is refused naming the list and what it takes: it
/// was ``routes: invalid type: map, expected a sequence``, which named no part of the
/// variable that was wrong.
#[test]
fn a_name_where_a_list_of_tables_takes_an_index_is_refused_saying_so() {
    let text = format!(
        "{ORDER}partition = \"header:x-api-key\"\n[[routes.tiers]]\nname = \"vip\"\n\
         values = [\"k1\"]\nbase_limit = 500\ncut_limit = 150\n"
    );
    for (var, location, list, indexed) in [
        (
            "ROCGATE__ROUTES__ORDER__HOLD",
            "routes.order",
            "routes",
            "ROCGATE__ROUTES__0__…",
        ),
        (
            "ROCGATE__ROUTES__HOLD",
            "routes.hold",
            "routes",
            "ROCGATE__ROUTES__0__…",
        ),
        (
            "rocgate__routes__0__tiers__vip__base_limit",
            "routes[0].tiers.vip",
            "routes[0].tiers",
            "rocgate__routes__0__tiers__0__…",
        ),
        (
            "ROCGATE__ROUTES__0__EVENTS__SALE__HOLD",
            "routes[0].events.sale",
            "routes[0].events",
            "ROCGATE__ROUTES__0__EVENTS__0__…",
        ),
    ] {
        let env = [(var.to_owned(), "5s".to_owned())];
        let e = Config::from_toml_str_with_env(&text, "t.toml", env).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "t.toml: {location}: not a field path: {list} is a list of tables, each \
                 named by its index from 0 ({indexed}) (set by environment variable {var})"
            )
        );
    }
}

/// A number from the environment past what a number holds (`1e400`) is refused as
/// the file's is, "number out of range", quoting the text: it read as infinity, and
/// was refused as `must be a number > 0, got inf`, a value nobody wrote and that is
/// more than 0. An infinite value written as such (TOML's `inf`, the environment's
/// `inf`) is refused as not finite.
#[test]
fn a_number_past_the_range_or_infinite_is_refused_as_such() {
    let env = [(
        "ROCGATE__ROUTES__0__BASE_LIMIT".to_owned(),
        "1e400".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.toml: routes[0].base_limit: number out of range, got \"1e400\" \
         (set by environment variable ROCGATE__ROUTES__0__BASE_LIMIT)"
    );
    let env = [("ROCGATE__DEFAULTS__MIN_RPS".to_owned(), "-1E999".to_owned())];
    let e = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.toml: defaults.min_rps: number out of range, got \"-1E999\" \
         (set by environment variable ROCGATE__DEFAULTS__MIN_RPS)"
    );
    refused(
        &route("base_limit = inf"),
        "routes[0].base_limit",
        "must be a finite number > 0, got inf",
    );
    refused(
        &route("min_rps = inf"),
        "routes[0].min_rps",
        "must be a finite number ≥ 0, got inf",
    );
    refused(
        &route("cut_limit = nan"),
        "routes[0].cut_limit",
        "must be a finite number > 0, got NaN",
    );
    let env = [(
        "ROCGATE__ROUTES__0__BASE_LIMIT".to_owned(),
        "inf".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "t.toml: routes[0].base_limit: must be a finite number > 0, got inf \
         (set by environment variable ROCGATE__ROUTES__0__BASE_LIMIT)"
    );
}

/// An empty `ROCGATE__ADMIN__TOKEN` is refused, not skipped as other empty variables
/// are: a secret that came out empty (`ROCGATE__ADMIN__TOKEN=$TOKEN` with `TOKEN`
/// unset) ran the admin API without a token.
#[test]
fn an_empty_admin_token_from_the_environment_is_refused() {
    let text =
        std::fs::read_to_string(config_dir().join("rocgate.toml")).expect("the default config");
    for var in ["ROCGATE__ADMIN__TOKEN", "rocgate__admin__token"] {
        let env = [(var.to_owned(), String::new())];
        let e = Config::from_toml_str_with_env(&text, "rocgate.toml", env).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "rocgate.toml: admin.token: must not be empty (set by environment variable \
                 {var}); unset it to run without a token"
            )
        );
    }
    // With a token in the file, unsetting the variable keeps that one.
    let with_token = text.replace("# token = \"...\"", "token = \"from-the-file\"");
    assert_ne!(
        with_token, text,
        "the default config's commented token line moved"
    );
    let env = [("ROCGATE__ADMIN__TOKEN".to_owned(), String::new())];
    let e = Config::from_toml_str_with_env(&with_token, "rocgate.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rocgate.toml: admin.token: must not be empty (set by environment variable \
         ROCGATE__ADMIN__TOKEN); unset it to use the file's token"
    );
}

#[test]
fn env_overrides_the_connection_limits() {
    let text =
        std::fs::read_to_string(config_dir().join("rocgate.toml")).expect("the default config");
    let c = Config::from_toml_str(&text, "rocgate.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.max_connections, 10_000);
    assert_eq!(c.server.idle_timeout.as_secs(), 75);
    let env = [
        (
            "ROCGATE__SERVER__MAX_CONNECTIONS".to_owned(),
            "500".to_owned(),
        ),
        ("ROCGATE__SERVER__IDLE_TIMEOUT".to_owned(), "15s".to_owned()),
    ];
    let c = Config::from_toml_str_with_env(&text, "rocgate.toml", env)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.max_connections, 500);
    assert_eq!(c.server.idle_timeout.as_secs(), 15);

    let env = [(
        "ROCGATE__SERVER__MAX_CONNECTIONS".to_owned(),
        "0".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(&text, "rocgate.toml", env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "rocgate.toml: server.max_connections: must be at least 1, got 0 \
         (set by environment variable ROCGATE__SERVER__MAX_CONNECTIONS)"
    );
}

#[test]
fn normalize_path_is_a_boolean_from_the_file_or_the_environment() {
    let text =
        std::fs::read_to_string(config_dir().join("rocgate.toml")).expect("the default config");
    let c = Config::from_toml_str(&text, "rocgate.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(c.server.normalize_path);
    let off = text.replace("normalize_path = true", "normalize_path = false");
    assert_ne!(off, text, "the default config's normalize_path line moved");
    let c = Config::from_toml_str(&off, "rocgate.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.server.normalize_path);
    let env = |value: &str| {
        [(
            "ROCGATE__SERVER__NORMALIZE_PATH".to_owned(),
            value.to_owned(),
        )]
    };
    let c = Config::from_toml_str_with_env(&text, "rocgate.toml", env("false"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.server.normalize_path);
    let e = Config::from_toml_str(
        &text.replace("normalize_path = true", "normalize_path = 1"),
        "rocgate.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("rocgate.toml: server.normalize_path: "),
        "{e}"
    );
    let e = Config::from_toml_str_with_env(&text, "rocgate.toml", env("sometimes"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("rocgate.toml: server.normalize_path: ")
            && e.contains("ROCGATE__SERVER__NORMALIZE_PATH"),
        "{e}"
    );
}

/// A path to something endless (`/dev/zero`) or huge is refused once 16 MiB are read:
/// it was read until memory ran out (helper-149).
#[test]
fn check_config_refuses_an_endless_file() {
    let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .args(["check-config", "/dev/zero"])
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "/dev/zero: longer than 16 MiB: not a config file\n"
    );
}

#[test]
fn check_config_prints_ok_or_every_error() {
    let bin = env!("CARGO_BIN_EXE_rocgate");
    let dir = tempfile::tempdir().expect("a temp dir");

    let out = Command::new(bin)
        .args(["check-config"])
        .arg(config_dir().join("rocgate.toml"))
        .env_remove("ROCGATE__DEFAULTS__DANGER_ROC")
        .output()
        .expect("rocgate runs");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, route("cut_limit = 300\nsafe_roc = 90")).expect("written");
    let out = Command::new(bin)
        .arg("check-config")
        .arg(&bad)
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let shown = bad.display();
    assert_eq!(
        lines,
        [
            format!("{shown}: routes[0].cut_limit: must be ≤ base_limit (200), got 300"),
            format!("{shown}: routes[0].safe_roc: must be < danger_roc (80), got 90"),
        ]
    );

    // An event that has ended is valid, and named as one that will never run.
    let past = dir.path().join("past.toml");
    std::fs::write(
        &past,
        route(
            "[[routes.events]]\nname = \"sale\"\nstart = \"2020-11-27T20:00:00Z\"\n\
             duration = \"30m\"\nbase_limit = 400\n\
             [[routes.events]]\nname = \"next\"\nstart = \"2999-11-27T20:00:00Z\"\n\
             duration = \"30m\"\nbase_limit = 400",
        ),
    )
    .expect("written");
    let out = Command::new(bin)
        .arg("check-config")
        .arg(&past)
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!(
            "{}: warning: routes[0].events[0] (\"sale\") ended at 2020-11-27T20:30:00Z: it will never run",
            past.display()
        )
    );

    let out = Command::new(bin)
        .arg("check-config")
        .arg(dir.path().join("missing.toml"))
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml: cannot read the file"));

    let out = Command::new(bin)
        .arg("check-config")
        .arg(config_dir().join("rocgate.toml"))
        .env("ROCGATE__DEFAULTS__CUT_LIMIT", "500")
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ROCGATE__DEFAULTS__CUT_LIMIT"));
}

/// An upstream that is rocgate's own listener is refused: the admin API's would open
/// it to every client of the proxy, the proxy's would send each request back to
/// itself.
#[test]
fn the_upstream_is_not_rocgates_own_listener() {
    for (upstream, more, which, addr) in [
        (
            "http://127.0.0.1:9090",
            "",
            "admin.listen",
            "127.0.0.1:9090",
        ),
        (
            "http://localhost:9191",
            "[admin]\nlisten = \"0.0.0.0:9191\"\n",
            "admin.listen",
            "0.0.0.0:9191",
        ),
        (
            "http://127.0.0.1:8080",
            "listen = \"127.0.0.1:8080\"\n",
            "server.listen",
            "127.0.0.1:8080",
        ),
        // An IPv4-mapped address is its IPv4 address, on either side.
        (
            "http://[::ffff:127.0.0.1]:9090",
            "",
            "admin.listen",
            "127.0.0.1:9090",
        ),
        (
            "http://127.0.0.1:8080",
            "listen = \"[::ffff:127.0.0.1]:8080\"\n",
            "server.listen",
            "[::ffff:127.0.0.1]:8080",
        ),
        (
            "http://localhost:8080",
            "listen = \"[::ffff:127.0.0.1]:8080\"\n",
            "server.listen",
            "[::ffff:127.0.0.1]:8080",
        ),
        // A connection to an unspecified address goes to the loopback one (helper-151:
        // these three were let through).
        ("http://0.0.0.0:9090", "", "admin.listen", "127.0.0.1:9090"),
        (
            "http://[::]:8080",
            "listen = \"[::1]:8080\"\n",
            "server.listen",
            "[::1]:8080",
        ),
    ] {
        let (server, admin) = match more.strip_prefix("[admin]") {
            Some(_) => ("", more),
            None => (more, ""),
        };
        refused(
            &route(&format!(
                "[server]\nupstream = \"{upstream}\"\n{server}{admin}"
            )),
            "server.upstream",
            &format!(
                "{upstream} is rocgate's own {which} ({addr}): requests would come back to it"
            ),
        );
    }
    // Another port, or another host, is an upstream; so is localhost beside a listener
    // on 127.0.0.2 (localhost reaches 127.0.0.1 or ::1: helper-151 found it refused),
    // and an IPv6 address beside an IPv4 listener that takes every address.
    for (upstream, listen) in [
        ("http://127.0.0.1:9091", ""),
        ("http://10.0.0.5:9090", ""),
        ("http://shop:9090", ""),
        ("http://localhost:8080", "listen = \"127.0.0.2:8080\"\n"),
        ("http://[::1]:8080", "listen = \"0.0.0.0:8080\"\n"),
        ("http://[::]:8080", "listen = \"127.0.0.1:8080\"\n"),
    ] {
        let text = route(&format!("[server]\nupstream = \"{upstream}\"\n{listen}"));
        Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{upstream}: {e}"));
    }
}

#[test]
fn the_proxy_and_the_admin_api_need_an_address_each() {
    // check-config said ok, and serve then failed to bind the admin API as if another
    // process held the port.
    for (listen, admin) in [
        ("127.0.0.1:8080", "127.0.0.1:8080"),
        ("0.0.0.0:8080", "127.0.0.1:8080"),
        ("127.0.0.1:9090", "[::]:9090"),
        // An IPv4-mapped address is its IPv4 address: the second bind fails.
        ("[::ffff:127.0.0.1]:8080", "127.0.0.1:8080"),
        ("127.0.0.1:8080", "[::ffff:127.0.0.1]:8080"),
    ] {
        refused(
            &route(&format!(
                "[server]\nlisten = \"{listen}\"\n[admin]\nlisten = \"{admin}\""
            )),
            "admin.listen",
            &format!(
                "{} takes the port of server.listen ({}): the proxy and the admin API \
                 need an address each",
                admin.parse::<std::net::SocketAddr>().unwrap(),
                listen.parse::<std::net::SocketAddr>().unwrap()
            ),
        );
    }
    // The admin API's default, 127.0.0.1:9090, taken by the proxy.
    refused(
        &route("[server]\nlisten = \"127.0.0.1:9090\""),
        "admin.listen",
        "127.0.0.1:9090 takes the port of server.listen (127.0.0.1:9090)",
    );
    // Port 0 twice is two free ports; other ports or other addresses do not clash.
    for (listen, admin) in [
        ("127.0.0.1:0", "127.0.0.1:0"),
        ("127.0.0.1:8080", "127.0.0.1:8081"),
        ("127.0.0.1:8080", "127.0.0.2:8080"),
    ] {
        let text = route(&format!(
            "[server]\nlisten = \"{listen}\"\n[admin]\nlisten = \"{admin}\""
        ));
        Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    }
    // A listen address that is wrong is reported alone, not also as a clash with the
    // default it left in place.
    let found = problems(&route(
        "[server]\nlisten = \"nowhere\"\n[admin]\nlisten = \"127.0.0.1:8080\"",
    ));
    assert_eq!(found.len(), 1, "{}", found.join("\n"));
}

/// `proxy_protocol_from` names the peers that send the PROXY protocol header apart
/// from `trusted_proxies`; left out, it is `trusted_proxies`, as before it existed.
#[test]
fn proxy_protocol_from_is_its_own_list_and_defaults_to_the_trusted_proxies() {
    let c = Config::from_toml_str(
        &route(
            "[server]\ntrusted_proxies = [\"192.168.1.7\"]\nproxy_protocol = \"v1\"\n\
             proxy_protocol_from = [\"10.0.0.0/8\", \"::ffff:172.16.0.0/108\"]",
        ),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let nets: Vec<String> = c
        .server
        .proxy_protocol_networks()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(nets, ["10.0.0.0/8", "::ffff:172.16.0.0/108"]);
    assert_eq!(c.server.trusted_proxies.len(), 1);
    // Without trusted proxies at all: the balancer's header alone is believed.
    let c = Config::from_toml_str(
        &route("[server]\nproxy_protocol = \"any\"\nproxy_protocol_from = [\"10.0.0.1\"]"),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.proxy_protocol_networks().len(), 1);
    assert!(c.server.trusted_proxies.is_empty());
    // Left out: the trusted proxies, as an older file meant.
    let c = Config::from_toml_str(
        &route("[server]\ntrusted_proxies = [\"192.168.1.7\"]\nproxy_protocol = \"v2\""),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.proxy_protocol_from, None);
    assert_eq!(
        c.server.proxy_protocol_networks(),
        &c.server.trusted_proxies[..]
    );
    refused(
        &route("[server]\nproxy_protocol = \"v1\"\nproxy_protocol_from = [\"10.0.0.0/33\"]"),
        "server.proxy_protocol_from[0]",
        "must be a network",
    );
    refused(
        &route("[server]\nproxy_protocol = \"v1\"\nproxy_protocol_from = [\"10.0.0.1\", \"lb\"]"),
        "server.proxy_protocol_from[1]",
        "must be a network such as \"10.0.0.0/8\" or an IP address, got \"lb\"",
    );
    // An empty list would expect the header from no one: the setting would be moot.
    refused(
        &route("[server]\ntrusted_proxies = [\"10.0.0.1\"]\nproxy_protocol = \"v1\"\nproxy_protocol_from = []"),
        "server.proxy_protocol_from",
        "must name at least one network",
    );
    // Without the header expected, the list says nothing: refused, not ignored.
    refused(
        &route("[server]\nproxy_protocol_from = [\"10.0.0.1\"]"),
        "server.proxy_protocol_from",
        "has no effect unless server.proxy_protocol is",
    );
    refused(
        &route("[server]\nproxy_protocol = \"off\"\nproxy_protocol_from = [\"10.0.0.1\"]"),
        "server.proxy_protocol_from",
        "has no effect unless server.proxy_protocol is",
    );
    // The file may write a list as one comma-separated string, as a variable does.
    let c = Config::from_toml_str(
        &route("[server]\nproxy_protocol_from = \"10.0.0.1, 10.0.0.2\"\nproxy_protocol = \"v1\""),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.server.proxy_protocol_from,
        Some(vec![
            "10.0.0.1/32".parse().unwrap(),
            "10.0.0.2/32".parse().unwrap()
        ])
    );
    refused(
        &route("[server]\nproxy_protocol_from = 10\nproxy_protocol = \"v1\""),
        "server.proxy_protocol_from",
        "invalid type: integer `10`, expected a list of networks",
    );
    // A proxy_protocol misspelt is its own error: the list beside it is not said to
    // have no effect (it would, were the version read), and its entries are checked.
    let text =
        route("[server]\nproxy_protocol = \"v3\"\nproxy_protocol_from = [\"10.0.0.1\", \"lb\"]");
    let found = problems(&text);
    assert_eq!(found.len(), 2, "{}", found.join("\n"));
    refused(&text, "server.proxy_protocol", "must be \"off\", \"v1\"");
    refused(
        &text,
        "server.proxy_protocol_from[1]",
        "must be a network such as",
    );
}

/// `trusted_hops` counts from 0 to 10, and stands apart from `trusted_proxies`.
#[test]
fn trusted_hops_are_bounded_and_not_with_trusted_proxies() {
    let c = Config::from_toml_str(&route("[server]\ntrusted_hops = 2"), "t.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.trusted_hops, 2);
    let c = Config::from_toml_str(
        &route("[server]\ntrusted_hops = 0\ntrusted_proxies = [\"10.0.0.0/8\"]"),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.trusted_hops, 0);
    assert_eq!(ServerConfig::default().trusted_hops, 0);
    refused(
        &route("[server]\ntrusted_hops = 11"),
        "server.trusted_hops",
        "must be at most 10, got 11",
    );
    refused(
        &route("[server]\ntrusted_hops = -1"),
        "server.trusted_hops",
        "expected a whole number ≥ 0",
    );
    refused(
        &route("[server]\ntrusted_hops = 1\ntrusted_proxies = [\"10.0.0.0/8\"]"),
        "server.trusted_hops",
        "cannot be combined with server.trusted_proxies",
    );
    // With the PROXY protocol, the balancers are named: no trusted proxies to default to.
    refused(
        &route("[server]\ntrusted_hops = 1\nproxy_protocol = \"v2\""),
        "server.proxy_protocol",
        "needs server.proxy_protocol_from",
    );
    Config::from_toml_str(
        &route(
            "[server]\ntrusted_hops = 1\nproxy_protocol = \"v2\"\n\
             proxy_protocol_from = [\"10.0.0.0/8\"]",
        ),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn server_and_admin_sections() {
    let text = format!(
        "{ORDER}[server]\nlisten = \"0.0.0.0:8081\"\nupstream = \"http://10.1.2.3:3000/\"\n\
         connect_timeout = \"500ms\"\nmax_body_bytes = 2048\nmax_upstream_lanes = 0\n\
         upstream_idle_timeout = \"1500ms\"\nmax_connections = 3\nmax_upstream_requests = 7\n\
         max_connections_per_client = 2\n\
         idle_timeout = \"90s\"\nlingering_time = \"12s\"\nlingering_timeout = \"1500ms\"\n\
         trusted_proxies = [\"10.0.0.0/8\", \"192.168.1.7\"]\nclient_ip_header = \"Forwarded\"\n\
         proxy_protocol = \"V2\"\n\
         [admin]\nlisten = \"127.0.0.1:9999\"\ntoken = \"t0k\"\n"
    );
    let c = Config::from_toml_str(&text, "server.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.listen.to_string(), "0.0.0.0:8081");
    assert_eq!(c.server.upstream, "http://10.1.2.3:3000");
    assert_eq!(c.server.connect_timeout.as_millis(), 500);
    assert_eq!(c.server.max_body_bytes, 2048);
    assert_eq!(c.server.max_upstream_lanes, 0);
    assert_eq!(c.server.upstream_idle_timeout.as_millis(), 1500);
    assert_eq!(c.server.max_connections, 3);
    assert_eq!(c.server.max_upstream_requests, 7);
    assert_eq!(c.server.max_connections_per_client, Some(2));
    assert_eq!(c.server.idle_timeout.as_secs(), 90);
    assert_eq!(c.server.lingering_time.as_secs(), 12);
    assert_eq!(c.server.lingering_timeout.as_millis(), 1500);
    let nets: Vec<String> = c
        .server
        .trusted_proxies
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(nets, ["10.0.0.0/8", "192.168.1.7/32"]);
    assert_eq!(c.server.client_ip_header, ClientIpHeader::Forwarded);
    assert_eq!(c.server.proxy_protocol, ProxyProtocol::V2);
    assert_eq!(c.server.admin_listen.to_string(), "127.0.0.1:9999");
    assert_eq!(
        c.server.admin_token.as_ref().map(Secret::expose),
        Some("t0k")
    );
    // Left out, the defaults.
    assert_eq!(
        load("examples/flash-sale.toml").server,
        ServerConfig::default()
    );

    refused(
        &route("[server]\nlisten = \"localhost\""),
        "server.listen",
        "must be an IP address and port",
    );
    refused(
        &route("[server]\nupstream = \"https://x:443\""),
        "server.upstream",
        "TLS upstreams are not supported",
    );
    refused(
        &route("[server]\nupstream = \"http://x:80/api\""),
        "server.upstream",
        "with no path",
    );
    // User info was refused as a path. Its password is masked.
    refused(
        &route("[server]\nupstream = \"http://user:pw@x:80\""),
        "server.upstream",
        "must not carry user info (user:password@): rocgate sends no credentials upstream, \
         got \"http://user:***@x:80\"",
    );
    refused(
        &route("[server]\nupstream = \"http://x:80/a@b\""),
        "server.upstream",
        "with no path",
    );
    refused(
        &route("[server]\nupstream = \"http://x:http\""),
        "server.upstream",
        "port must be a number",
    );
    // Port 0 reaches nothing: every request would get a 502.
    refused(
        &route("[server]\nupstream = \"http://x:0\""),
        "server.upstream",
        "port must be a number from 1 to 65535, got \"0\"",
    );
    // check-config said ok to these, and serve then refused them (blaming --upstream).
    for upstream in [
        "http://:80",
        "http://[::1",
        "http://[::1]x:80",
        "http://[nope]:80",
    ] {
        refused(
            &route(&format!("[server]\nupstream = \"{upstream}\"")),
            "server.upstream",
            "must name a host",
        );
    }
    // Nor a host no URI holds: check-config said ok, and serve refused it at start
    // with "invalid uri character" or "invalid authority".
    for (upstream, character) in [
        ("http://café.internal:80", "é"),
        ("http://a%20b", "%"),
        ("http://a|b", "|"),
        ("http://a\\\\b", "\\"),
        ("http://a^b:80", "^"),
    ] {
        refused(
            &route(&format!("[server]\nupstream = \"{upstream}\"")),
            "server.upstream",
            &format!(
                "the host holds {character:?}, which no host does (letters, digits and - . _ ~ ! $ & ' ( ) * + , ; =)"
            ),
        );
    }
    for upstream in [
        "http://[::1]:3000",
        "http://[::1]",
        "http://shop.internal",
        "http://my_service:8080",
    ] {
        let text = route(&format!("[server]\nupstream = \"{upstream}\""));
        let config = Config::from_toml_str(&text, "good.toml").unwrap();
        assert_eq!(config.server.upstream, upstream);
    }
    refused(
        &route("[server]\nresponse_timeout = \"0s\""),
        "server.response_timeout",
        "longer than zero",
    );
    // Read as "never", such lengths overflowed the clock in hyper (every connection's
    // task panicked at its first request) or in the hints' ticker.
    refused(
        &route("[server]\nheader_read_timeout = \"300000000000y\""),
        "server.header_read_timeout",
        "must be at most 365 days",
    );
    refused(
        &route("[hints]\ninterval = \"300000000000y\"\nkeep = \"300000000000y\""),
        "hints.interval",
        "must be at most 365 days",
    );
    refused(
        &route("[server]\nupstream_idle_timeout = \"soon\""),
        "server.upstream_idle_timeout",
        "invalid duration \"soon\"",
    );
    refused(
        &route("[server]\nlingering_timeout = \"0s\""),
        "server.lingering_timeout",
        "must be longer than zero",
    );
    refused(
        &route("[server]\nmax_body_bytes = 0"),
        "server.max_body_bytes",
        "at least 1",
    );
    refused(
        &route("[server]\nmax_upstream_lanes = 2000000"),
        "server.max_upstream_lanes",
        "at most 1000000",
    );
    refused(
        &route("[server]\nmax_upstream_lanes = -1"),
        "server.max_upstream_lanes",
        "",
    );
    refused(
        &route("[server]\nmax_connections = 0"),
        "server.max_connections",
        "must be at least 1, got 0",
    );
    refused(
        &route("[server]\nmax_connections = 20000000"),
        "server.max_connections",
        "must be at most 10000000",
    );
    refused(
        &route("[server]\nmax_connections = 1.5"),
        "server.max_connections",
        "",
    );
    refused(
        &route("[server]\nmax_connections_per_client = 0"),
        "server.max_connections_per_client",
        "must be at least 1, got 0",
    );
    refused(
        &route("[server]\nmax_connections_per_client = 20000000"),
        "server.max_connections_per_client",
        "must be at most 10000000, got 20000000",
    );
    refused(
        &route("[server]\nmax_upstream_requests = 0"),
        "server.max_upstream_requests",
        "must be at least 1, got 0",
    );
    refused(
        &route("[server]\nmax_upstream_requests = 20000000"),
        "server.max_upstream_requests",
        "must be at most 10000000, got 20000000",
    );
    refused(
        &route("[server]\nmax_upstream_requests = -1"),
        "server.max_upstream_requests",
        "",
    );
    refused(
        &route("[server]\nidle_timeout = \"0s\""),
        "server.idle_timeout",
        "longer than zero",
    );
    refused(
        &route("[server]\nidle_timeout = \"366d\""),
        "server.idle_timeout",
        "must be at most 365 days",
    );
    refused(
        &route("[server]\nidle_timeout = \"later\""),
        "server.idle_timeout",
        "invalid duration \"later\"",
    );
    refused(
        &route("[server]\ntrusted_proxies = [\"10.0.0.0/33\"]"),
        "server.trusted_proxies[0]",
        "must be a network",
    );
    refused(
        &route("[server]\nclient_ip_header = \"x-real-ip\""),
        "server.client_ip_header",
        "must be \"x-forwarded-for\" or \"forwarded\", got \"x-real-ip\"",
    );
    refused(
        &route("[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\nproxy_protocol = \"v3\""),
        "server.proxy_protocol",
        "must be \"off\", \"v1\", \"v2\" or \"any\", got \"v3\"",
    );
    // Read from no peer, the header would name no client: the file says whose to read.
    refused(
        &route("[server]\nproxy_protocol = \"any\""),
        "server.proxy_protocol",
        "\"any\" needs server.proxy_protocol_from (or, left out, server.trusted_proxies)",
    );
    refused(
        &route("[admin]\ntoken = \" \""),
        "admin.token",
        "must not be empty",
    );
    // A token no client can send in an `Authorization` header locks the admin API.
    // The refusal says what is wrong where, without the token: errors go to logs.
    for (token, wrong) in [
        (r#"" t0k""#, "whitespace before a token of 4 characters"),
        (r#""t0k ""#, "whitespace after a token of 4 characters"),
        (
            r#""t0\nk""#,
            "the control character U+000A as character 3 of 4",
        ),
        (
            r#""t0\u0000k""#,
            "the control character U+0000 as character 3 of 4",
        ),
        (
            r#""t0\u007fk""#,
            "the control character U+007F as character 3 of 4",
        ),
        // U+0085 is a control character a header value may carry (its UTF-8 bytes
        // are not): the refusal names the one it cannot.
        (
            r#""t0\u0085k\u0001""#,
            "the control character U+0001 as character 5 of 5",
        ),
    ] {
        let text = route(&format!("[admin]\ntoken = {token}"));
        refused(
            &text,
            "admin.token",
            &format!("no control characters and no leading or trailing whitespace, got {wrong}"),
        );
        assert!(
            problems(&text).iter().all(|line| !line.contains("t0")),
            "the token shown: {:?}",
            problems(&text)
        );
    }
    refused(
        &route("[admin]\nport = 9090"),
        "admin.port",
        "unknown field",
    );
    refused(
        &route("[admin]\ntoken = \"a-long-enough-token\"\nreads = \"closed\""),
        "admin.reads",
        "must be \"open\" or \"token\", got \"closed\"",
    );
    // Written as its other enum-like settings are (mode, roc_mode, fail_mode): in
    // lower case alone.
    for reads in ["Token", "OPEN"] {
        refused(
            &route(&format!(
                "[admin]\ntoken = \"a-long-enough-token\"\nreads = \"{reads}\""
            )),
            "admin.reads",
            &format!("must be \"open\" or \"token\", got \"{reads}\""),
        );
    }
    // Reads needing a token there is none of would lock every scrape out.
    refused(
        &route("[admin]\nreads = \"token\""),
        "admin.reads",
        "\"token\" needs admin.token set",
    );
}

#[test]
fn reject_status_is_a_4xx_or_5xx() {
    let c = Config::from_toml_str(&route("reject_status = 503"), "s.toml")
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.routes[0].reject_status, 503);
    assert_eq!(load("rocgate.toml").routes[0].reject_status, 429);
    refused(
        &route("reject_status = 200"),
        "routes[0].reject_status",
        "from 400 to 599",
    );
}

#[test]
fn store_section() {
    use rocgate::store::{FailMode, RedisConfig, RedisServers, StoreConfig, SyncMode};
    use std::time::Duration;
    assert_eq!(load("rocgate.toml").store, StoreConfig::Local);
    let StoreConfig::Redis(r) = load("examples/redis.toml").store else {
        panic!("examples/redis.toml uses the redis backend");
    };
    assert_eq!(
        r.servers,
        RedisServers::Single("redis://127.0.0.1:6379/0".into())
    );
    assert_eq!(r.timeout, Duration::from_millis(50));
    assert_eq!(r.fail_mode, FailMode::Local);
    // A fleet's example says the fleet's size: the default 1 would have every
    // instance restarted during a Redis outage admit the whole limit.
    assert_eq!(r.expected_instances, 3);

    let text = route(
        "[store]\nbackend = \"redis\"\nurl = \"redis://10.0.0.5:6380\"\ntimeout = \"20ms\"\n\
         key_prefix = \"shop-eu\"\nfail_mode = \"closed\"\nmode = \"batched\"\nheartbeat = \"2s\"\n\
         failures_to_open = 5\nprobe_interval = \"1s\"\nkey_ttl = \"1h\"\ninstance_id = \"gw-1\"\n\
         expected_instances = 12",
    );
    let c = Config::from_toml_str(&text, "store.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.store,
        StoreConfig::Redis({
            let mut v = RedisConfig::default();
            v.servers = RedisServers::Single("redis://10.0.0.5:6380".into());
            v.timeout = Duration::from_millis(20);
            v.key_prefix = "shop-eu".into();
            v.fail_mode = FailMode::Closed;
            v.mode = SyncMode::Batched;
            v.heartbeat = Duration::from_secs(2);
            v.failures_to_open = 5;
            v.probe_interval = Duration::from_secs(1);
            v.key_ttl = Duration::from_secs(3600);
            v.instance_id = Some("gw-1".into());
            v.expected_instances = 12;
            v
        })
    );
    // Defaults when only the backend is given.
    let c = Config::from_toml_str(&route("[store]\nbackend = \"redis\""), "store.toml").unwrap();
    assert_eq!(c.store, StoreConfig::Redis(RedisConfig::default()));
    // From the environment, like any other field.
    let env = [
        (
            "ROCGATE__STORE__URL".to_owned(),
            "redis://cache:6379".to_owned(),
        ),
        ("ROCGATE__STORE__TIMEOUT".to_owned(), "30ms".to_owned()),
        (
            "ROCGATE__STORE__EXPECTED_INSTANCES".to_owned(),
            "8".to_owned(),
        ),
    ];
    let text = route("[store]\nbackend = \"redis\"");
    let c = Config::from_toml_str_with_env(&text, "store.toml", env).unwrap();
    let StoreConfig::Redis(r) = c.store else {
        panic!("redis");
    };
    assert_eq!(
        (r.servers, r.timeout, r.expected_instances),
        (
            RedisServers::Single("redis://cache:6379".into()),
            Duration::from_millis(30),
            8
        )
    );

    // A Redis Cluster: its seed nodes, as a list or (from the environment) one string.
    let cluster =
        |nodes: &[&str]| RedisServers::Cluster(nodes.iter().map(|n| n.to_string()).collect());
    let text = route(
        "[store]\nbackend = \"redis\"\ncluster_nodes = [\"redis://10.0.0.1:7000\", \" redis://10.0.0.2:7000/0\"]",
    );
    let c = Config::from_toml_str(&text, "store.toml").unwrap_or_else(|e| panic!("{e}"));
    let StoreConfig::Redis(r) = c.store else {
        panic!("redis");
    };
    assert_eq!(
        r.servers,
        cluster(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000/0"])
    );
    let env = [(
        "ROCGATE__STORE__CLUSTER_NODES".to_owned(),
        "redis://a:7000,redis://b:7001".to_owned(),
    )];
    let text = route("[store]\nbackend = \"redis\"");
    let c =
        Config::from_toml_str_with_env(&text, "store.toml", env).unwrap_or_else(|e| panic!("{e}"));
    let StoreConfig::Redis(r) = c.store else {
        panic!("redis");
    };
    assert_eq!(r.servers, cluster(&["redis://a:7000", "redis://b:7001"]));

    refused(
        &route("[store]\nbackend = \"memcached\""),
        "store.backend",
        "must be \"local\" or \"redis\"",
    );
    refused(
        &route("[store]\nurl = \"redis://x\""),
        "store.url",
        "only applies with backend = \"redis\"",
    );
    let redis = |extra: &str| route(&format!("[store]\nbackend = \"redis\"\n{extra}"));
    refused(
        &redis("url = \"http://x:6379\""),
        "store.url",
        "must be a URL such as",
    );
    refused(
        &redis("timeout = \"0ms\""),
        "store.timeout",
        "longer than zero",
    );
    refused(&redis("timeout = \"soon\""), "store.timeout", "");
    // A beat answered after three of them counts its instance gone (helper-154).
    refused(
        &redis("timeout = \"2s\""),
        "store.timeout",
        "must be shorter than heartbeat (1s), got 2s",
    );
    refused(
        &redis("heartbeat = \"40ms\""),
        "store.timeout",
        "must be shorter than heartbeat (40ms), got 50ms",
    );
    refused(
        &redis("heartbeat = \"300000000000y\""),
        "store.heartbeat",
        "must be at most 365 days",
    );
    refused(
        &redis("key_prefix = \"{a}\""),
        "store.key_prefix",
        "no braces",
    );
    refused(
        &redis("fail_mode = \"panic\""),
        "store.fail_mode",
        "\"local\", \"open\" or \"closed\"",
    );
    refused(
        &redis("mode = \"lazy\""),
        "store.mode",
        "\"exact\" or \"batched\"",
    );
    refused(
        &redis("failures_to_open = 0"),
        "store.failures_to_open",
        "must be from 1",
    );
    refused(&redis("key_ttl = \"10ms\""), "store.key_ttl", "at least 1s");
    refused(
        &redis("expected_instances = 0"),
        "store.expected_instances",
        "must be from 1 to 65535, got 0",
    );
    refused(
        &redis("expected_instances = 70000"),
        "store.expected_instances",
        "must be from 1 to 65535, got 70000",
    );
    refused(
        &redis("expected_instances = 2.5"),
        "store.expected_instances",
        "",
    );
    refused(
        &route("[store]\nexpected_instances = 4"),
        "store.expected_instances",
        "only applies with backend = \"redis\"",
    );
    refused(
        &redis("instance_id = \" \""),
        "store.instance_id",
        "1 to 128 characters",
    );
    // Characters, as the refusal says, not bytes: 128 of "é" (256 bytes) were refused.
    let id = |n: usize| redis(&format!("instance_id = \"{}\"", "é".repeat(n)));
    let c = Config::from_toml_str(&id(128), "store.toml").unwrap_or_else(|e| panic!("{e}"));
    let StoreConfig::Redis(r) = c.store else {
        panic!("the redis backend")
    };
    assert_eq!(r.instance_id.map(|i| i.chars().count()), Some(128));
    refused(&id(129), "store.instance_id", "1 to 128 characters");
    refused(&redis("timeout = 5"), "store.timeout", "");
    refused(
        &redis("url = \"redis://a:6379\"\ncluster_nodes = [\"redis://b:7000\"]"),
        "store.cluster_nodes",
        "not both",
    );
    refused(
        &redis("cluster_nodes = []"),
        "store.cluster_nodes",
        "at least one node",
    );
    refused(
        &redis("cluster_nodes = [\"redis://a:7000\", \"unix:///run/redis.sock\"]"),
        "store.cluster_nodes[1]",
        "must be a URL such as",
    );
    #[cfg(feature = "redis")]
    refused(
        &redis("cluster_nodes = [\"redis://a:7000/2\"]"),
        "store.cluster_nodes[0]",
        "database 0 only",
    );
    // URLs the Redis client cannot read when serve starts (it would not start), or
    // reads as a Redis no connection reaches (a port of 0, a negative database):
    // refused by check-config (in a build with the Redis client, which reads them).
    // They were taken.
    #[cfg(feature = "redis")]
    for (url, says) in [
        (
            "redis://127.0.0.1:notaport",
            "port must be a number from 1 to 65535",
        ),
        (
            "redis://127.0.0.1:99999",
            "port must be a number from 1 to 65535",
        ),
        (
            "redis://127.0.0.1:0",
            "port must be a number from 1 to 65535",
        ),
        ("redis://:6379", "names no host"),
        ("redis://user:pw@", "names no host"),
        ("redis://[::1:6379", "must be an IPv6 address"),
        ("redis://[::1]6379", "must be an IPv6 address"),
        ("redis://[cache]:6379", "must be an IPv6 address"),
        ("redis://::1:6379", "an IPv6 host in brackets"),
        (
            "redis://cache:+6379",
            "port must be a number from 1 to 65535",
        ),
        ("redis://0.0.0.0:6379", "0.0.0.0 is a wildcard address"),
        ("redis://[::]:6379", ":: is a wildcard address"),
        (
            "redis://cache:6379/?protocol=bogus",
            "protocol=\"bogus\" is no protocol",
        ),
        (
            "redis://cache:6379/?protocol",
            "protocol=\"\" is no protocol",
        ),
        (
            "redis://cache :6379",
            "the host holds a character no host name has",
        ),
        (
            "redis://ca^che:6379",
            "the host holds a character no host name has",
        ),
        (
            "unix:///run/redis.sock?db=abc",
            "the database ?db=abc must be a whole number",
        ),
        (
            "unix:///run/redis.sock?db=-1",
            "the database ?db=-1 must be a whole number",
        ),
        (
            "redis://%FF@cache:6379",
            "the user, percent-decoded, must be UTF-8",
        ),
        (
            "redis://:%FF@cache:6379",
            "the password, percent-decoded, must be UTF-8",
        ),
        (
            "redis://cache:6379/abc",
            "the database /abc must be a whole number",
        ),
        (
            "redis://cache:6379/-1",
            "the database /-1 must be a whole number",
        ),
        (
            "redis://cache:6379/0/extra",
            "the database /0/extra must be",
        ),
        ("unix://run/redis.sock", "the socket's absolute path"),
    ] {
        refused(&redis(&format!("url = {url:?}")), "store.url", says);
        use redis::{ConnectionAddr, IntoConnectionInfo as _};
        match url.into_connection_info() {
            Err(_) => {}
            Ok(info) => assert!(
                info.redis_settings().db() < 0 || matches!(info.addr(), ConnectionAddr::Tcp(_, 0)),
                "{url}: the client reads {:?}",
                info.addr()
            ),
        }
        refused(
            &redis(&format!("cluster_nodes = [\"redis://a:7000\", {url:?}]")),
            "store.cluster_nodes[1]",
            if url.starts_with("unix") {
                "must be a URL such as"
            } else {
                says
            },
        );
    }
    // A user with no password, which the client reads and never sends (it
    // authenticates only with a password): refused, where it connected
    // unauthenticated.
    #[cfg(feature = "redis")]
    for url in [
        "redis://fleet@cache:6379",
        "redis://fleet:@cache:6379",
        "unix:///run/redis.sock?user=fleet",
    ] {
        refused(
            &redis(&format!("url = {url:?}")),
            "store.url",
            "names a user but no password",
        );
        use redis::IntoConnectionInfo as _;
        let info = url.into_connection_info().unwrap();
        assert_eq!(info.redis_settings().username(), Some("fleet"), "{url}");
        assert_eq!(info.redis_settings().password(), None, "{url}");
    }
    // What the client reads is taken: user and password, a database, IPv6, a query.
    for url in [
        "redis://cache.internal",
        "redis://user:p%40ss@cache.internal:6380/3",
        "redis://:secret@10.0.0.1:6379/0",
        "redis://[::1]:6379",
        "redis://[::1]",
        "redis://cache:6379/?protocol=resp3",
        "unix:///run/redis.sock",
        "redis+unix:///run/redis.sock?db=2",
        // Refused before: a space in the password (the client reads it encoded), an
        // empty port (the default), a socket on `localhost`, a scheme in capitals.
        "redis://:my pass@cache:6379",
        "redis://cache:",
        "unix://localhost/run/redis.sock",
        "REDIS://cache:6379",
        // The query as the client reads it, percent-decoded.
        "redis://cache:6379/?protocol=resp%33",
    ] {
        let text = redis(&format!("url = {url:?}"));
        Config::from_toml_str(&text, "store.toml").unwrap_or_else(|e| panic!("{url}: {e}"));
        #[cfg(feature = "redis")]
        {
            use redis::IntoConnectionInfo as _;
            let info = url
                .into_connection_info()
                .unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(info.redis_settings().db() >= 0, "{url}");
        }
    }
    // Nodes that differ in user, password or protocol, which the client refuses.
    #[cfg(feature = "redis")]
    refused(
        &redis("cluster_nodes = [\"redis://:a@n1:7000\", \"redis://:b@n2:7000\"]"),
        "store.cluster_nodes[1]",
        "every node must give the user, password and protocol of cluster_nodes[0]",
    );
    // Nodes alike as the client reads them: the protocol by its version, the user and
    // password decoded.
    #[cfg(feature = "redis")]
    for nodes in [
        r#"["redis://a:7000/?protocol=2", "redis://b:7000"]"#,
        r#"["redis://a:7000/?protocol=3", "redis://b:7000/?protocol=resp3"]"#,
        r#"["redis://us%65r:pw@a:7000", "redis://user:pw@b:7000"]"#,
    ] {
        let text = redis(&format!("cluster_nodes = {nodes}"));
        Config::from_toml_str(&text, "store.toml").unwrap_or_else(|e| panic!("{nodes}: {e}"));
    }
    // A query on a cluster node is no database (it was read as "/?protocol=resp3").
    let text = redis("cluster_nodes = [\"redis://a:7000/?protocol=resp3\"]");
    Config::from_toml_str(&text, "store.toml").unwrap_or_else(|e| panic!("{e}"));
    // No TLS in the build: refused by check-config, not only when serve starts.
    refused(
        &redis("url = \"rediss://cache.internal:6380/0\""),
        "store.url",
        "rediss:// (TLS) is not supported",
    );
    refused(
        &redis("cluster_nodes = [\"redis://a:7000\", \"rediss://b:7000\"]"),
        "store.cluster_nodes[1]",
        "rediss:// (TLS) is not supported",
    );
    refused(
        &route("[store]\ncluster_nodes = [\"redis://a:7000\"]"),
        "store.cluster_nodes",
        "only applies with backend = \"redis\"",
    );
}

#[test]
fn the_hints_section_is_read_and_checked() {
    let c = Config::from_toml_str(
        &route("[hints]\ninterval = \"5s\"\nkeep = \"30m\"\nlatency_budget = \"250ms\"\nerror_budget = 0.05\nmin_requests = 10"),
        "ok.toml",
    )
    .unwrap();
    assert_eq!(c.hints.interval.as_secs(), 5);
    assert_eq!(c.hints.keep.as_secs(), 1800);
    assert_eq!(c.hints.policy.latency_budget.as_millis(), 250);
    assert_eq!(c.hints.policy.error_budget, 0.05);
    assert_eq!(c.hints.policy.min_requests, 10);
    assert_eq!(
        load("examples/flash-sale.toml").hints,
        rocgate::config::HintsConfig::default()
    );

    refused(
        &route("[hints]\ninterval = \"0s\""),
        "hints.interval",
        "longer than zero",
    );
    // The upstream meter tells latencies apart up to 55 s: a longer budget could
    // never be exceeded, and the upstream would never count as saturated.
    refused(
        &route("[hints]\nlatency_budget = \"56s\""),
        "hints.latency_budget",
        "must be at most 55s (upstream latencies are told apart up to that), got 56s",
    );
    let c = Config::from_toml_str(&route("[hints]\nlatency_budget = \"55s\""), "ok.toml").unwrap();
    assert_eq!(c.hints.policy.latency_budget.as_secs(), 55);
    refused(
        &route("[hints]\nerror_budget = 1.5"),
        "hints.error_budget",
        "fraction of at least 0 and below 1",
    );
    refused(
        &route("[hints]\ninterval = \"1m\"\nkeep = \"10s\""),
        "hints.keep",
        "at least twice hints.interval",
    );
    // One interval kept: the one closed last was dropped as it closed (the timer
    // closes it a little late), and no hint was ever given.
    refused(
        &route("[hints]\ninterval = \"10s\"\nkeep = \"10s\""),
        "hints.keep",
        "must be at least twice hints.interval (10s), got 10s",
    );
    refused(
        &route("[hints]\ninterval = \"40m\""),
        "hints.interval",
        "must be at most half of hints.keep (1h, its default), got 40m",
    );
    // Every route keeps a record an interval for `keep`: 1 ms intervals over the
    // default hour were 3.6 million records a route (and a tick every millisecond);
    // below 1 ms the history silently ticked every millisecond anyway.
    // The field the file wrote is named (it was hints.keep, left at its default).
    refused(
        &route("[hints]\ninterval = \"1ms\""),
        "hints.interval",
        "must be at least hints.keep ÷ 100000 (36ms, hints.keep being 1h, its default), got 1ms",
    );
    refused(
        &route("[hints]\ninterval = \"1ms\"\nkeep = \"1h\""),
        "hints.keep",
        "must be at most 100000 intervals of hints.interval (1ms), got 3600000",
    );
    refused(
        &route("[hints]\ninterval = \"2h\""),
        "hints.interval",
        "must be at most half of hints.keep (1h, its default)",
    );
    refused(
        &route("[hints]\ninterval = \"100us\"\nkeep = \"1s\""),
        "hints.interval",
        "must be at least 1ms",
    );
    // A value refused is not held against the other: `keep` was checked against the
    // built-in 10 s interval the file never wrote, and `interval` against the
    // built-in hour of `keep`.
    for (hints, only) in [
        ("interval = \"0s\"\nkeep = \"15s\"", "hints.interval: "),
        ("interval = \"100us\"\nkeep = \"1s\"", "hints.interval: "),
        ("interval = \"2h\"\nkeep = \"0s\"", "hints.keep: "),
    ] {
        let found = problems(&route(&format!("[hints]\n{hints}")));
        assert!(
            found.len() == 1 && found[0].starts_with(only),
            "{hints}: {found:#?}"
        );
    }
    refused(
        &route("[hints]\nbudget = 1"),
        "hints.budget",
        "unknown field",
    );
}

#[test]
fn several_unknown_fields_are_named_each_in_the_files_order_every_time() {
    // Found by fuzzing (fuzz/fuzz_targets/config.rs): the table was a hash map, so the
    // unknown field named changed from one load of the same text to the next.
    let top = "zulu = 1\nyankee = 2\nxray = 3\nwhiskey = 4\nvictor = 5\nuniform = 6\n";
    let route =
        "[[routes]]\nname = \"a\"\npath = \"/\"\nzulu = 1\nyankee = 2\nxray = 3\nwhiskey = 4\n";
    let names = ["zulu", "yankee", "xray", "whiskey", "victor", "uniform"];
    for (text, table, names) in [(top, "", &names[..]), (route, "routes[0].", &names[..4])] {
        for _ in 0..32 {
            let e = Config::from_toml_str(text, "t.toml").unwrap_err();
            let found: Vec<(&str, &str)> = e
                .problems()
                .iter()
                .map(|p| (p.location(), p.message()))
                .collect();
            assert_eq!(found.len(), names.len(), "{e}");
            for ((location, message), name) in found.iter().zip(names) {
                assert_eq!(*location, format!("{table}{name}"), "{e}");
                assert!(
                    message.starts_with(&format!("unknown field `{name}`")),
                    "{e}"
                );
            }
        }
    }
}

/// Every problem of shape is reported, not the first alone, and none that taking one
/// out made: a value of the wrong type and an unknown field in three tables. Reported
/// one at a time, each fix showed the next. A list's element of the wrong type ends
/// the list: the problems after it are found once it is fixed.
#[test]
fn every_problem_of_shape_is_reported() {
    let text = "[defaults]\nbase_limt = 200\n\
                [[routes]]\nname = \"a\"\npath = \"/a\"\ncut_limit = \"x\"\n\
                [[routes]]\nname = \"b\"\npath = \"/b\"\ncolour = \"red\"\n\
                [server]\nfoo = 1\n[store]\nbaz = 1\n";
    let e = Config::from_toml_str(text, "t.toml").unwrap_err();
    let locations: Vec<&str> = e.problems().iter().map(|p| p.location()).collect();
    assert_eq!(
        locations,
        [
            "defaults.base_limt",
            "routes[0].cut_limit",
            "routes[1].colour",
            "server.foo",
            "store.baz"
        ],
        "{e}"
    );
    assert_eq!(
        e.problems()[1].message(),
        "must be a number, got the string \"x\"",
        "{e}"
    );
    let text = "[[routes]]\nname = \"a\"\npath = \"/a\"\nevents = [1]\nx = 1\n[server]\nfoo = 1\n";
    let e = Config::from_toml_str(text, "t.toml").unwrap_err();
    let locations: Vec<&str> = e.problems().iter().map(|p| p.location()).collect();
    assert_eq!(locations, ["routes[0].events[0]"], "{e}");
    // Up to 50, then a word that more follow.
    let many: String = (0..60).map(|i| format!("unknown_{i} = 1\n")).collect();
    let e = Config::from_toml_str(&format!("{many}{}", route("")), "t.toml").unwrap_err();
    let problems = e.problems();
    assert_eq!(problems.len(), 51, "{e}");
    assert_eq!(problems[49].location(), "unknown_49", "{e}");
    assert_eq!(
        problems[50].message(),
        "more problems of shape follow: the first 50 are reported"
    );
}

/// A config built in code is checked by the file's rules: every shipped file, once
/// loaded, passes (the check reads back what it writes), and what the file refuses is
/// refused in code too, under the same path.
#[test]
fn a_config_built_in_code_is_validated_by_the_files_rules() {
    for path in toml_files(&config_dir()) {
        let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        if let Err(e) = config.validate() {
            panic!("{} loads but does not validate:\n{e}", path.display());
        }
    }
    use rocgate::config::{RouteConfig, RouteMatch};
    use std::time::Duration;
    let problems = |routes: Vec<RouteConfig>| -> Vec<String> {
        match Config::new(routes).validate() {
            Ok(()) => Vec::new(),
            Err(e) => e.problems().iter().map(|p| p.to_string()).collect(),
        }
    };
    let order = || RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
    assert_eq!(problems(vec![order()]), Vec::<String>::new());
    // A base limit under the default cut limit: a cut would raise it.
    let mut low = order();
    low.controller.base_limit_rps = 2.0;
    assert_eq!(
        problems(vec![low]),
        ["routes[0].cut_limit: must be ≤ base_limit (2), got 60"]
    );
    // Values the engine cannot work with.
    let mut zero = order();
    zero.controller.base_limit_rps = 0.0;
    zero.controller.cut_limit_rps = f64::NAN;
    zero.controller.restore_interval = Duration::ZERO;
    zero.reject_status = 200;
    zero.algorithm = Algorithm::FixedWindow {
        window: Duration::from_micros(1500),
    };
    assert_eq!(
        problems(vec![zero]),
        [
            "routes[0].base_limit: must be a number > 0, got 0",
            "routes[0].cut_limit: must be a finite number > 0, got NaN",
            "routes[0].restore_interval: must be longer than zero",
            "routes[0].reject_status: must be an HTTP status from 400 to 599, got 200",
            "routes[0].limiter_window: must be a whole number of milliseconds, got 1ms 500us",
        ]
    );
    // Names, duplicates, shadowing, and no routes at all.
    let mut spaced = order();
    spaced.name = "my order".into();
    assert_eq!(
        problems(vec![RouteConfig::new("all", RouteMatch::any()), order(), spaced]),
        [
            "routes[2].name: must be non-empty and use only A-Z a-z 0-9 _ . : - (it is a metric label value), got \"my order\"",
            "routes[1].path: never matches: routes[0] (\"all\") comes first and its path_prefix takes every request it would",
        ]
    );
    assert_eq!(
        problems(vec![order(), order()])[0],
        "routes[1].name: duplicate of routes[0].name (\"order\")"
    );
    assert_eq!(
        problems(Vec::new()),
        ["routes: at least one [[routes]] table is required"]
    );
    // Events a file cannot place (its times are RFC 3339): refused, not a panic.
    use rocgate::config::Event;
    use rocgate::controller::ControllerParams;
    use std::time::UNIX_EPOCH;
    for (start, said) in [
        (
            UNIX_EPOCH - Duration::from_secs(1),
            "before 1970-01-01T00:00:00Z",
        ),
        (
            UNIX_EPOCH + Duration::from_secs(253_402_300_800),
            "after 9999-12-31T23:59:59Z",
        ),
    ] {
        let mut far = order();
        far.events.push(Event::new(
            "far",
            start,
            Duration::from_secs(60),
            ControllerParams::default(),
        ));
        let found = problems(vec![far]);
        assert!(
            found.len() == 1
                && found[0].starts_with("routes[0].events[0].start: must be an RFC 3339")
                && found[0].contains(said),
            "{found:?}"
        );
    }
}

/// `RouteMatch::exact` with a template matches the paths the template stands for, as
/// a file's `path` does, not the template's text only.
#[test]
fn an_exact_match_in_code_takes_a_template() {
    use rocgate::config::{PathPattern, RouteMatch};
    let items = RouteMatch::exact("get", "/api/items/{id}");
    assert!(items.matches("GET", "/api/items/7"));
    assert!(
        items.matches("GET", "/api/items/{id}"),
        "axum's MatchedPath"
    );
    assert!(!items.matches("GET", "/api/items/7/reviews"));
    assert_eq!(
        Some(items.path),
        PathPattern::parse_path("/api/items/{id}"),
        "as the file reads it"
    );
    // A path that is no template stays exact.
    assert_eq!(
        RouteMatch::exact("POST", "/api/order").path,
        PathPattern::Exact("/api/order".into())
    );
}

/// `check_upstream` (what `serve --upstream` is held to) says what is wrong in the
/// words `server.upstream` uses, with the text as given.
#[test]
fn check_upstream_names_what_is_wrong() {
    use rocgate::config::check_upstream;
    for (url, message) in [
        (
            "https://x:443",
            r#"TLS upstreams are not supported: use http://, got "https://x:443""#,
        ),
        (
            " http://x:80/api",
            r#"must be http://host[:port] with no path, got " http://x:80/api""#,
        ),
        (
            "http://[::1]x:80",
            r#"must name a host, as in http://127.0.0.1:3000 or http://[::1]:3000, got "http://[::1]x:80""#,
        ),
        (
            "http://x:0",
            r#"port must be a number from 1 to 65535, got "0""#,
        ),
    ] {
        let e = check_upstream(url).unwrap_err();
        assert_eq!(e.to_string(), message, "{url}");
    }
}

/// What a caller needs of an error type: to hold it in a `Box<dyn Error + Send + Sync>`
/// (across threads and tasks, as `anyhow` does) and to look through its sources.
fn is_an_error<E: std::error::Error + Send + Sync + 'static>() {}

/// A refused upstream is an `UpstreamError` a caller can match on, each variant with
/// the text it refused.
#[test]
fn check_upstream_refuses_with_an_error_to_match_on() {
    use rocgate::config::{check_upstream, ConfigError, UpstreamError};
    is_an_error::<UpstreamError>();
    is_an_error::<ConfigError>();
    let url = |u: &str| u.to_owned();
    assert_eq!(
        check_upstream("https://x:443"),
        Err(UpstreamError::Tls {
            url: url("https://x:443")
        })
    );
    for bad in ["http://x:80/api", "http://", "ftp://x", "http://x:80/u@x"] {
        assert_eq!(
            check_upstream(bad),
            Err(UpstreamError::NotAnAuthority { url: url(bad) })
        );
    }
    for bad in ["http://u@x:80", "http://u:pw@x:80/", "http://@x"] {
        assert_eq!(
            check_upstream(bad),
            Err(UpstreamError::UserInfo { url: url(bad) })
        );
    }
    for bad in ["http://:80", "http://[::1", "http://[nope]:80"] {
        assert_eq!(
            check_upstream(bad),
            Err(UpstreamError::NoHost { url: url(bad) })
        );
    }
    for (bad, port) in [
        ("http://x:0", "0"),
        ("http://x:65536", "65536"),
        ("http://x:", ""),
    ] {
        match check_upstream(bad) {
            Err(UpstreamError::Port { port: p }) => assert_eq!(p, port, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert_eq!(
        check_upstream("http://[::1]:3000/").unwrap(),
        "http://[::1]:3000"
    );
    // A scheme is case-insensitive: `HTTP://` was refused as no `http://host[:port]`.
    assert_eq!(
        check_upstream("HTTP://127.0.0.1:3000").unwrap(),
        "http://127.0.0.1:3000"
    );
    assert_eq!(
        check_upstream("Https://x:443"),
        Err(UpstreamError::Tls {
            url: url("Https://x:443")
        })
    );
}

/// Every duration has an upper bound, named with the field: one past it was taken as
/// written (`restore_interval = "100years"` left a cut route at its cut limit for a
/// century, and told rejected clients to come back then). At the bound, each is taken.
#[test]
fn every_duration_has_an_upper_bound() {
    let ip = "partition = \"ip\"\n";
    let event = |duration: &str| {
        format!(
            "[[routes.events]]\nname = \"sale\"\nstart = \"2026-11-27T20:00:00Z\"\nduration = \"{duration}\"\n"
        )
    };
    let bounds = [
        (
            "window",
            "window = \"2h\"\nslot = \"1800s\"",
            "must be at most 1h, got 2h",
        ),
        ("slot", "slot = \"2h\"", "must be at most 1h, got 2h"),
        (
            "hold",
            "hold = \"100years\"",
            "must be at most 1day, got 100years",
        ),
        (
            "restore_interval",
            "restore_interval = \"25h\"",
            "must be at most 1day, got 1day 1h",
        ),
        (
            "min_dwell",
            "min_dwell = \"2days\"",
            "must be at most 1day, got 2days",
        ),
        (
            "max_cut",
            "max_cut = \"1000years\"",
            "must be at most 1day, got 1000years",
        ),
        (
            "idle_timeout",
            &format!("{ip}idle_timeout = \"8days\""),
            "must be at most 7days, got 8days",
        ),
        (
            "burst",
            "burst = \"50days\"",
            "must be at most 4294967295ms (49.7 days",
        ),
        (
            "limiter_window",
            "algorithm = \"fixed_window\"\nlimiter_window = \"50days\"",
            "must be at most 4294967295ms (49.7 days",
        ),
        (
            "events[0].duration",
            &event("366days"),
            "must be at most 365 days",
        ),
    ];
    for (field, extra, message) in bounds {
        refused(&route(extra), &format!("routes[0].{field}"), message);
    }
    // `[defaults]` and an event are read by the same rules.
    refused(
        &format!("[defaults]\nmax_cut = \"2days\"\n{}", route("")),
        "defaults.max_cut",
        "must be at most 1day",
    );
    refused(
        &route(&format!("{}hold = \"2days\"\n", event("30m"))),
        "routes[0].events[0].hold",
        "must be at most 1day",
    );
    refused(
        "[hints]\nkeep = \"400days\"\n[[routes]]\nname = \"order\"\npath = \"/api/order\"\n",
        "hints.keep",
        "must be at most 365 days",
    );
    let at_bounds = route(&format!(
        "window = \"1h\"\nslot = \"15m\"\nhold = \"1day\"\nrestore_interval = \"24h\"\n\
         min_dwell = \"1day\"\nmax_cut = \"1day\"\n{ip}idle_timeout = \"7days\"\n{}",
        event("365days")
    ));
    Config::from_toml_str(&at_bounds, "bounds.toml").unwrap();
}

/// `route_limit`, a partitioned route's keys together: read where it is written, and
/// refused (each problem under its own field path) where it could do nothing or where
/// no token bucket could hold it; taken with the Redis store, as the fleet's total.
#[test]
fn route_limit_is_a_partitioned_routes_total() {
    let c = Config::from_toml_str(
        &route("partition = \"ip\"\nbase_limit = 10\ncut_limit = 2\nroute_limit = 500"),
        "good.toml",
    )
    .unwrap();
    assert_eq!(c.routes[0].route_limit_rps, Some(500.0));
    let c = Config::from_toml_str(&route("partition = \"header:x-api-key\""), "good.toml").unwrap();
    assert_eq!(c.routes[0].route_limit_rps, None);
    let c = Config::from_toml_str(
        &route("partition = \"ip\"\nalgorithm = \"sliding_window\"\nroute_limit = 50.5"),
        "good.toml",
    )
    .unwrap();
    assert_eq!(c.routes[0].route_limit_rps, Some(50.5));

    refused(
        &route("route_limit = 500"),
        "routes[0].route_limit",
        "applies only to partitioned routes",
    );
    refused(
        &route("partition = \"ip\"\nroute_limit = 0"),
        "routes[0].route_limit",
        "must be a number > 0, got 0",
    );
    refused(
        &route("partition = \"ip\"\nroute_limit = \"lots\""),
        "routes[0].route_limit",
        "",
    );
    refused(
        &route("partition = \"ip\"\nroute_limit = 3000000"),
        "routes[0].route_limit",
        "must be at most 2000000 req/s",
    );
    refused(
        &route("partition = \"ip\"\nburst = \"1h\"\nbase_limit = 1\ncut_limit = 1\nroute_limit = 2000000"),
        "routes[0].route_limit",
        "route_limit × burst must be at most",
    );
    for algorithm in ["leaky_bucket", "concurrency"] {
        refused(
            &route(&format!(
                "partition = \"ip\"\nalgorithm = \"{algorithm}\"\nroute_limit = 100"
            )),
            "routes[0].route_limit",
            &format!("applies only with token_bucket, fixed_window or sliding_window, and this route uses {algorithm}"),
        );
    }
    // Not a setting of [defaults] or of an event: a total is one route's.
    refused(
        &format!("[defaults]\nroute_limit = 5\n{ORDER}"),
        "defaults.route_limit",
        "unknown field `route_limit`",
    );
    // Every problem is reported, each once, under its own path.
    let found = problems(&format!(
        "{}{}",
        route("route_limit = 5"),
        "[[routes]]\nname = \"b\"\npath = \"/b\"\npartition = \"ip\"\nroute_limit = -1\n"
    ));
    assert_eq!(
        found
            .iter()
            .filter(|l| l.starts_with("routes[0].route_limit")
                || l.starts_with("routes[1].route_limit"))
            .count(),
        2,
        "{found:?}"
    );
    // With the Redis store it is the fleet's total, each instance holding its share
    // (the store shares it among the live instances): read as written.
    let c = Config::from_toml_str(
        &format!(
            "{}[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n",
            route("partition = \"ip\"\nroute_limit = 500")
        ),
        "good.toml",
    )
    .unwrap();
    assert_eq!(c.routes[0].route_limit_rps, Some(500.0));
    assert!(matches!(c.store, rocgate::store::StoreConfig::Redis(_)));
}

/// A query field the Redis client does not read is refused, not ignored: a database
/// written as `?db=5` on a `redis://` URL (which reads it from the path only) ran on
/// database 0, sharing it with whatever else uses it; `?password=` sent none.
/// (helper-258)
#[cfg(feature = "redis")]
#[test]
fn a_redis_url_query_the_client_does_not_read_is_refused() {
    use redis::IntoConnectionInfo as _;
    let redis = |extra: &str| route(&format!("[store]\nbackend = \"redis\"\n{extra}"));
    for (url, says) in [
        (
            "redis://cache:6379?db=5",
            "the query field \"db\" is not read by the Redis client on a redis:// URL: \
             it reads protocol alone there, the database from the path (redis://host:port/5)",
        ),
        (
            "redis://cache:6379/2?password=secret",
            "the query field \"password\" is not read by the Redis client on a redis:// URL",
        ),
        (
            "unix:///run/redis.sock?database=2",
            "the query field \"database\" is not read by the Redis client on a unix socket's \
             URL: it reads db, user, pass and protocol",
        ),
    ] {
        // The client takes it, and leaves the field unread: database 0, no password.
        let info = url
            .into_connection_info()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert_eq!(
            info.redis_settings().db(),
            if url.contains("/2") { 2 } else { 0 }
        );
        assert_eq!(info.redis_settings().password(), None, "{url}");
        refused(&redis(&format!("url = {url:?}")), "store.url", says);
    }
    refused(
        &redis("cluster_nodes = [\"redis://a:7000\", \"redis://b:7000?db=1\"]"),
        "store.cluster_nodes[1]",
        "the query field \"db\" is not read by the Redis client on a redis:// URL",
    );
    // What the client reads stays taken: a deployment that ran must still load. A
    // field's name percent-encoded (the client decodes it), the user and password in
    // the userinfo, an empty query or empty pairs, a scheme in capitals, an IPv6 host,
    // both socket schemes. (helper-266, review)
    for url in [
        "redis://cache:6379/?protocol=resp3",
        "unix:///run/redis.sock?db=2&user=u&pass=p&protocol=3",
        "redis+unix:///run/redis.sock?user=u&pass=p%26q&db=1",
        "redis://:p%40ss@cache:6379/3?protocol=resp3",
        "redis://user:pw@cache/?%70rotocol=3",
        "REDIS://cache:6379/?protocol=2",
        "redis://cache/?",
        "redis://cache/?&protocol=3&",
        "redis://[::1]:6379/0?protocol=resp2",
        "redis://cache:6379/#fragment",
    ] {
        let info = url
            .into_connection_info()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        Config::from_toml_str(&redis(&format!("url = {url:?}")), "store.toml")
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        if url.contains("rotocol=3") || url.contains("resp3") {
            assert_eq!(
                info.redis_settings().protocol(),
                redis::ProtocolVersion::RESP3,
                "{url}"
            );
        }
    }
    Config::from_toml_str(
        &redis(r#"cluster_nodes = ["redis://u:p@a:7000/?protocol=3", "redis://u:p@b:7000/0?protocol=resp3"]"#),
        "store.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// A network written with an address inside it (`10.0.0.5/24`, as `ip addr` prints an
/// interface's) is refused, naming both readings: it was taken as the whole network,
/// `10.0.0.0/24`, so that copying the proxy's line believed every peer of its subnet.
/// (helper-258)
#[test]
fn a_trusted_network_with_host_bits_is_refused() {
    for (field, written, network, address) in [
        ("trusted_proxies", "10.0.0.5/24", "10.0.0.0/24", "10.0.0.5"),
        (
            "trusted_proxies",
            "2001:db8::7/64",
            "2001:db8::/64",
            "2001:db8::7",
        ),
        (
            "proxy_protocol_from",
            "192.168.1.9/16",
            "192.168.0.0/16",
            "192.168.1.9",
        ),
    ] {
        let text = route(&format!(
            "[server]\nproxy_protocol = \"v1\"\n{field} = [\"10.1.1.1\", \"{written}\"]"
        ));
        refused(
            &text,
            &format!("server.{field}[1]"),
            &format!(
                "{written:?} has bits set past its prefix: write {network:?} for the \
                 network, or {address:?} for the one address"
            ),
        );
    }
    let c = Config::from_toml_str(
        &route("[server]\ntrusted_proxies = [\"10.0.0.0/24\", \"10.1.1.1/32\", \"::/0\", \"10.2.2.2\"]"),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.trusted_proxies.len(), 4);
}

/// The passwords the secrecy tests write, each as written and as the client decodes it.
const PASSWORDS: [(&str, &str); 2] = [("s3cr3t-Pa55", "s3cr3t-Pa55"), ("p%40ss", "p@ss")];

/// Asserts that `text` names `says` and holds neither form of `password`.
fn says_without(text: &str, says: &str, (written, decoded): (&str, &str)) {
    assert!(text.contains(says), "expected …{says}… in:\n{text}");
    assert!(
        !text.contains(written) && !text.contains(decoded),
        "the password {written:?} shown in:\n{text}"
    );
}

/// The refusals of a store's URL that quote it, each with `PW` where the password goes,
/// the field they are reported at and what they say. A password in them was quoted
/// whole into check-config's output and serve's log; it is masked (`***`), the rest of
/// the URL shown as written.
fn store_url_refusals() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut cases = vec![
        (
            "url",
            "rediss://fleet:PW@cache:6380",
            "rediss:// (TLS) is not supported",
        ),
        ("url", "http://fleet:PW@cache:6379", "must be a URL such as"),
        ("url", "fleet:PW@cache:6379", "must be a URL such as"),
        // A `://` past the user info is no scheme's: the password before it was shown.
        ("url", "fleet:PW@cache:6379/a://b", "must be a URL such as"),
    ];
    #[cfg(feature = "redis")]
    cases.extend([
        (
            "url",
            "redis://fleet:PW@cache:notaport",
            "port must be a number",
        ),
        (
            "url",
            "redis://fleet:PW@0.0.0.0:6379",
            "is a wildcard address",
        ),
        (
            "url",
            "redis://fleet:PW@cache:6379/abc",
            "the database /abc must be",
        ),
        (
            "url",
            "redis://fleet:PW@cache:6379/?db=1",
            "the query field \"db\" is not read",
        ),
        (
            "url",
            "redis://fleet:PW/x@cache:6379",
            "port must be a number",
        ),
        (
            "url",
            "unix:///run/redis.sock?user=fleet&pass=PW&db=x",
            "the database ?db=x must be",
        ),
        // A password written without its colon is a user the client never sends:
        // refused, and the whole user info hidden.
        (
            "url",
            "redis://PW@cache:6379",
            "names a user but no password",
        ),
        // A password field the client does not read, named in another case: refused,
        // and was quoted with its value.
        (
            "url",
            "unix:///run/redis.sock?user=fleet&PASS=PW",
            "the query field \"PASS\" is not read",
        ),
        (
            "cluster_nodes",
            "redis://fleet:PW@b:7000/1",
            "a Redis Cluster has database 0 only",
        ),
        (
            "cluster_nodes",
            "redis://other:PW@b:7000",
            "every node must give the user, password",
        ),
    ]);
    cases
}

/// A store's password is never shown by a refusal of its URL, whether the file or an
/// environment variable wrote it: masked, the rest of the URL kept.
#[test]
fn a_store_password_never_appears_in_a_refusal() {
    let file = |field: &str, url: &str| {
        let value = match field {
            "url" => format!("{url:?}"),
            _ => format!("[\"redis://fleet:s3cr3t-Pa55@a:7000\", {url:?}]"),
        };
        route(&format!("[store]\nbackend = \"redis\"\n{field} = {value}"))
    };
    for password in PASSWORDS {
        for (field, url, says) in store_url_refusals() {
            let url = url.replace("PW", password.0);
            let from_file = problems(&file(field, &url)).join("\n");
            says_without(&from_file, says, password);
            says_without(&from_file, "***", password);
            let var = format!("ROCGATE__STORE__{}", field.to_ascii_uppercase());
            let text = match field {
                "url" => route("[store]\nbackend = \"redis\""),
                _ => route("[store]\nbackend = \"redis\"\ncluster_nodes = [\"redis://a:7000\"]"),
            };
            let value = match field {
                "url" => url.clone(),
                _ => format!("redis://fleet:{}@a:7000,{url}", password.0),
            };
            let from_env = Config::from_toml_str_with_env(&text, "t.toml", [(var.clone(), value)])
                .expect_err("refused")
                .to_string();
            says_without(&from_env, says, password);
            says_without(
                &from_env,
                &format!("set by environment variable {var}"),
                password,
            );
        }
        // Two variables for one field quote both values.
        let url = format!("redis://fleet:{}@cache:6379", password.0);
        let e = Config::from_toml_str_with_env(
            &route("[store]\nbackend = \"redis\""),
            "t.toml",
            [
                ("ROCGATE__STORE__URL".to_owned(), url.clone()),
                ("rocgate__store__url".to_owned(), url.clone()),
            ],
        )
        .expect_err("refused")
        .to_string();
        says_without(&e, "set by two environment variables", password);
        says_without(&e, "redis://fleet:***@cache:6379", password);
        // So is the proxy's upstream, which must carry no user info.
        let upstream = format!(
            "[server]\nupstream = \"http://app:{}@app:3000\"",
            password.0
        );
        says_without(
            &problems(&route(&upstream)).join("\n"),
            "must not carry user info",
            password,
        );
        // And its two values when two variables set it: they were quoted whole.
        let upstream = format!("http://app:{}@app:3000", password.0);
        let e = Config::from_toml_str_with_env(
            &route("[server]\nupstream = \"http://app:3000\""),
            "t.toml",
            [
                ("ROCGATE__SERVER__UPSTREAM".to_owned(), upstream.clone()),
                ("rocgate__server__upstream".to_owned(), upstream),
            ],
        )
        .expect_err("refused")
        .to_string();
        says_without(&e, "set by two environment variables", password);
        says_without(&e, "http://app:***@app:3000", password);
    }
    // The admin token, set twice, is not quoted either.
    let e = Config::from_toml_str_with_env(
        ORDER,
        "t.toml",
        [
            ("ROCGATE__ADMIN__TOKEN".to_owned(), "s3cr3t-Pa55".to_owned()),
            ("rocgate__admin__token".to_owned(), "s3cr3t-Pa55".to_owned()),
        ],
    )
    .expect_err("refused")
    .to_string();
    says_without(&e, "set by two environment variables", PASSWORDS[0]);
}

/// `rocgate check-config` refuses a store's URL from the environment without printing
/// its password.
#[test]
fn check_config_prints_no_store_password() {
    let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .arg("check-config")
        .arg(config_dir().join("rocgate.toml"))
        .env("ROCGATE__STORE__BACKEND", "redis")
        .env(
            "ROCGATE__STORE__URL",
            "rediss://fleet:s3cr3t-Pa55@cache:6380/2",
        )
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    says_without(
        &String::from_utf8_lossy(&out.stderr),
        "store.url: rediss:// (TLS) is not supported: rocgate is built without TLS for Redis; use redis://, through a TLS tunnel (such as stunnel) if Redis requires TLS, got \"rediss://fleet:***@cache:6380/2\"",
        PASSWORDS[0],
    );
}

/// A config's `Debug` shows its store's URLs with the password masked: logging
/// `?config` printed them whole.
#[test]
fn a_configs_debug_masks_the_store_password() {
    for password in PASSWORDS {
        for (store, shown) in [
            (
                format!("url = \"redis://fleet:{}@cache:6379/3\"", password.0),
                "Single(\"redis://fleet:***@cache:6379/3\")",
            ),
            (
                format!(
                    "url = \"unix:///run/redis.sock?user=fleet&pass={}&db=1\"",
                    password.0
                ),
                "Single(\"unix:///run/redis.sock?user=fleet&pass=***&db=1\")",
            ),
            (
                format!(
                    "cluster_nodes = [\"redis://fleet:{0}@a:7000\", \"redis://fleet:{0}@b:7000\"]",
                    password.0
                ),
                "Cluster([\"redis://fleet:***@a:7000\", \"redis://fleet:***@b:7000\"])",
            ),
        ] {
            let text = route(&format!("[store]\nbackend = \"redis\"\n{store}"));
            let config = Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
            says_without(&format!("{config:?}"), shown, password);
            says_without(&format!("{config:#?}"), "***", password);
        }
    }
}

/// A huge number in a refusal is written with an exponent (`1e308`), not in its 309
/// digits; a number a person writes (`2000001`, `0.5`) as it was. Each refusal that
/// quotes a limit or a threshold.
#[test]
fn a_huge_number_is_quoted_compactly() {
    for (extra, says) in [
        ("cut_limit = 1e308", "routes[0].cut_limit: must be ≤ base_limit (200), got 1e308"),
        ("safe_roc = 1e308", "routes[0].safe_roc: must be < danger_roc (80), got 1e308"),
        ("base_limit = 1e308", "moves the rate by more than 0.1%), got 1e308"),
        ("base_limit = 1e308", "restoring from cut_limit (60) to base_limit (1e308)"),
        (
            "base_limit = 1e308\nalgorithm = \"concurrency\"",
            "(what its count of requests in flight holds), got 1e308",
        ),
        (
            "base_limit = 1e308\nalgorithm = \"concurrency\"\ncut_limit = 0.5",
            "routes[0].cut_limit: must be a whole number ≥ 1 with algorithm concurrency (it counts requests in flight), got 0.5",
        ),
        (
            "roc_mode = \"relative\"\nsafe_roc = -1e308\ndanger_roc = 1",
            "when roc_mode is relative (demand cannot fall by more than all of it), got -1e308",
        ),
        (
            "route_limit = 1e308\npartition = \"ip\"",
            "spacing requests a whole number of nanoseconds apart), got 1e308",
        ),
        ("base_limit = 2000001", "moves the rate by more than 0.1%), got 2000001"),
    ] {
        let found = problems(&route(extra)).join("\n");
        assert!(found.contains(says), "{extra}: expected …{says}… in\n{found}");
        assert!(!found.contains("0000000000000000"), "{extra}: digits in\n{found}");
    }
}

/// The refusals `a_huge_number_is_quoted_compactly` missed: a window counter's quota
/// (`cut_limit = 1e299` with a window algorithm), a token bucket's tokens, and
/// `hints.error_budget` (`1e308`, `-1e-300`) were written in all their digits.
#[test]
fn every_number_a_refusal_quotes_is_compact() {
    for (extra, says) in [
        (
            "algorithm = \"sliding_window\"\nbase_limit = 1e300\ncut_limit = 1e299",
            "routes[0].cut_limit: cut_limit × limiter_window must be at most 1048575 requests (what a window counter holds), got 1e299",
        ),
        (
            "algorithm = \"fixed_window\"\nlimiter_window = \"1ms\"\nbase_limit = 0.00001\ncut_limit = 0.00001\nrestore_step = 0.00001",
            "base_limit × limiter_window must admit at least 1 request, got 1e-8",
        ),
        (
            "burst = \"49days\"\nbase_limit = 2000000\ncut_limit = 1000000",
            "base_limit × burst must be at most 4294967295 tokens (what a token bucket holds), got 8467200000000",
        ),
        (
            "[hints]\nerror_budget = 1e308",
            "hints.error_budget: must be a fraction of at least 0 and below 1, such as 0.01, got 1e308",
        ),
        (
            "[hints]\nerror_budget = -1e-300",
            "hints.error_budget: must be a fraction of at least 0 and below 1, such as 0.01, got -1e-300",
        ),
    ] {
        let found = problems(&route(extra)).join("\n");
        assert!(found.contains(says), "{extra}: expected …{says}… in\n{found}");
        // No number of more than the 16 digits of a whole number below 10^15 and a
        // fraction's.
        let longest = found
            .split(|c: char| !c.is_ascii_digit())
            .map(str::len)
            .max();
        assert!(longest <= Some(16), "{extra}: digits in\n{found}");
    }
}

/// `cluster_nodes` written as one string (as its environment variable gives it) is
/// cut at its commas, and a comma in a node's password cut the URL in two: neither
/// half was masked (`redis://fleet:s3c` has no `@`, `r3t@a:7000` no `:` before it),
/// so each refusal showed half the password. A comma inside a node's user info is
/// now read as part of it, as the URL is (the list form already took it).
#[cfg(feature = "redis")]
#[test]
fn a_comma_in_a_cluster_password_is_part_of_it() {
    let nodes = "redis://fleet:s3c,r3t@a:7000,redis://fleet:s3c,r3t@b:7000";
    let text = route(&format!(
        "[store]\nbackend = \"redis\"\ncluster_nodes = \"{nodes}\""
    ));
    let config = Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let rocgate::store::StoreConfig::Redis(redis) = &config.store else {
        panic!("{:?}", config.store);
    };
    assert_eq!(
        format!("{:?}", redis.servers),
        "Cluster([\"redis://fleet:***@a:7000\", \"redis://fleet:***@b:7000\"])"
    );
    // Refused (a database on a node), from the file and from a variable, and the two
    // values of two variables: no part of the password shown.
    let refused = "redis://fleet:s3c,r3t@a:7000,redis://fleet:s3c,,r3t@b:7000/1";
    let from_file = problems(&route(&format!(
        "[store]\nbackend = \"redis\"\ncluster_nodes = \"{refused}\""
    )))
    .join("\n");
    let with_env = |vars: Vec<(&str, &str)>| {
        Config::from_toml_str_with_env(
            &route("[store]\nbackend = \"redis\"\ncluster_nodes = [\"redis://a:7000\"]"),
            "t.toml",
            vars.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())),
        )
        .expect_err("refused")
        .to_string()
    };
    let from_env = with_env(vec![("ROCGATE__STORE__CLUSTER_NODES", refused)]);
    for shown in [&from_file, &from_env] {
        assert!(
            shown.contains("store.cluster_nodes[1]: a Redis Cluster has database 0 only, got 1 in \"redis://fleet:***@b:7000/1\""),
            "{shown}"
        );
    }
    let twice = with_env(vec![
        ("ROCGATE__STORE__CLUSTER_NODES", nodes),
        ("rocgate__store__cluster_nodes", nodes),
    ]);
    assert!(
        twice.contains("set by two environment variables"),
        "{twice}"
    );
    for shown in [&from_file, &from_env, &twice] {
        assert!(!shown.contains("s3c") && !shown.contains("r3t"), "{shown}");
    }
}

/// The admin token, from the file or from the environment, is `***` wherever the
/// config is printed with `{:?}`: `ServerConfig` derived `Debug` over the token's text,
/// so that the next `tracing::debug!(?config)` would have logged it.
#[test]
fn the_admin_token_is_not_in_the_configs_debug_output() {
    let file = Config::from_toml_str(
        &format!("{ORDER}[admin]\ntoken = \"s3cr3t-file\"\n"),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let env = [("ROCGATE__ADMIN__TOKEN".to_owned(), "s3cr3t-env".to_owned())];
    let from_env =
        Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_or_else(|e| panic!("{e}"));
    for (config, token) in [(file, "s3cr3t-file"), (from_env, "s3cr3t-env")] {
        assert!(config.server.admin_token.is_some(), "{token}");
        for shown in [
            format!("{:?}", config.server),
            format!("{:#?}", config.server),
            format!("{config:?}"),
        ] {
            assert!(!shown.contains(token), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
    }
}

/// An `[admin] token` that is not a TOML string is refused, naming the field and the
/// kind of value written, never the value: `token = 0x1F` was taken as the token
/// `31`, `token = 1e3` as `1000`, `token = true` as `true`, whatever the file said.
#[test]
fn an_admin_token_that_is_no_string_is_refused_without_its_value() {
    for (value, kind) in [
        ("123456", "an integer"),
        ("0x1F", "an integer"),
        ("1_000", "an integer"),
        ("1e3", "a float"),
        ("1.50", "a float"),
        ("inf", "a float"),
        ("true", "a boolean"),
    ] {
        let text = format!("{ORDER}[admin]\ntoken = {value}\n");
        let found = problems(&text);
        assert_eq!(
            found,
            [format!(
                "admin.token: must be a string, got {kind}: write it in quotes (token = \"…\"), \
                 the text a client sends"
            )],
            "{value}"
        );
        let e = Config::from_toml_str(&text, "bad.toml").unwrap_err();
        let debug = format!("{e:?}");
        for shown in [
            "123456", "0x1F", "31", "1_000", "1000", "1.5", "inf", "true",
        ] {
            assert!(!debug.contains(shown), "{value}: {debug}");
        }
    }
    // Set from the environment, a token is the variable's text, digits or not.
    for text in ["0x1F", "123456", "1e3", "true"] {
        let env = [("ROCGATE__ADMIN__TOKEN".to_owned(), text.to_owned())];
        let c =
            Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.server.admin_token.as_ref().map(Secret::expose),
            Some(text)
        );
        assert!(format!("{:?}", c.server).contains("admin_token: Some(***)"));
    }
}

/// `rocgate check-config` refuses a token written as a number, naming the field and
/// not the number.
#[test]
fn check_config_refuses_a_number_for_a_token_without_echoing_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    std::fs::write(&file, format!("{ORDER}[admin]\ntoken = 987654321\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
        .arg("check-config")
        .arg(&file)
        .env_remove("ROCGATE__ADMIN__TOKEN")
        .output()
        .expect("rocgate runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("987654321"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}: admin.token: must be a string, got an integer: write it in quotes",
            file.display()
        )),
        "{stderr}"
    );
}

/// An `[admin] token` written as a TOML date-time is refused as a number is, without
/// its value: the `config` crate took `1979-05-27 07:32:00Z` as the token
/// `1979-05-27T07:32:00Z`, the text it writes for it. Quoted, it is the token.
#[test]
fn an_admin_token_written_as_a_date_time_is_refused() {
    for value in [
        "1979-05-27 07:32:00Z",
        "1979-05-27T07:32:00-07:00",
        "1979-05-27",
        "07:32:00",
    ] {
        for text in [
            format!("{ORDER}[admin]\ntoken = {value}\n"),
            format!("admin.token = {value}\n{ORDER}"),
        ] {
            assert_eq!(
                problems(&text),
                [
                    "admin.token: must be a string, got a date-time: write it in quotes \
                  (token = \"…\"), the text a client sends"
                ],
                "{text}"
            );
        }
        let quoted = format!("{ORDER}[admin]\ntoken = \"{value}\"\n");
        let c = Config::from_toml_str(&quoted, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.server.admin_token.as_ref().map(Secret::expose),
            Some(value)
        );
        // Set from the environment, the variable's text, over the file's date-time.
        let env = [("ROCGATE__ADMIN__TOKEN".to_owned(), "t0k".to_owned())];
        let text = format!("{ORDER}[admin]\ntoken = {value}\n");
        let c =
            Config::from_toml_str_with_env(&text, "t.toml", env).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c.server.admin_token.as_ref().map(Secret::expose),
            Some("t0k")
        );
    }
}

/// `[admin] allowed_hosts` takes host names, kept lower-case without a trailing dot
/// (the admin API compares them so); an entry that is no host name alone is refused,
/// naming the entry's index and what to leave out: a URL's scheme, path or port, or an
/// IP address (always answered: the list names this host, not the clients allowed).
#[test]
fn admin_allowed_hosts_takes_host_names_alone() {
    let text = format!(
        "{ORDER}[admin]\nallowed_hosts = [\"rocgate.internal\", \"Admin.Example.\", \"host_1\"]\n"
    );
    let c = Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.server.admin_allowed_hosts,
        ["rocgate.internal", "admin.example", "host_1"]
    );
    let none = Config::from_toml_str(ORDER, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(none.server.admin_allowed_hosts.is_empty());
    for (entry, message) in [
        (
            "",
            "must not be empty: a name of this host that a request's Host may carry, such as \"rocgate.internal\"",
        ),
        (
            "rocgate.internal:9090",
            "must be a host name alone, got \"rocgate.internal:9090\": leave out the port (:9090): a name listed is taken on any port",
        ),
        (
            "http://rocgate.internal",
            "must be a host name alone, got \"http://rocgate.internal\": leave out the scheme (http://)",
        ),
        (
            "rocgate.internal/admin",
            "must be a host name alone, got \"rocgate.internal/admin\": leave out the path (/admin)",
        ),
        (
            "10.0.0.7",
            "\"10.0.0.7\" is an IP address, which the admin API answers without being listed",
        ),
        (
            "[::1]",
            "\"[::1]\" is an IP address, which the admin API answers without being listed",
        ),
        (
            "rocgate internal",
            "must be a host name (labels of letters, digits, - and _ between dots, each of 1 to 63 characters), got \"rocgate internal\"",
        ),
        (
            "rocgate..internal",
            "must be a host name (labels of letters",
        ),
        ("*.internal", "must be a host name (labels of letters"),
        (
            "bücher.example",
            "must be a host name in ASCII, got \"bücher.example\": write an internationalized \
             name in its xn-- form (xn--bcher-kva.example for bücher.example), as a browser \
             sends it in Host",
        ),
    ] {
        let text = format!(
            "{ORDER}[admin]\nallowed_hosts = [\"rocgate.internal\", {:?}]\n",
            entry
        );
        refused(&text, "admin.allowed_hosts[1]", message);
        assert_eq!(problems(&text).len(), 1, "{entry}: {:?}", problems(&text));
    }
    // One string of comma-separated names, in the file as from the environment.
    let c = Config::from_toml_str(
        &format!("{ORDER}[admin]\nallowed_hosts = \"rocgate.internal\"\n"),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.admin_allowed_hosts, vec!["rocgate.internal"]);
    // An entry of the list is read without the spaces around it, as an item of the
    // string is and as trusted_proxies' entries are: `[" rocgate.internal "]` was
    // refused where `" rocgate.internal "` was taken.
    let c = Config::from_toml_str(
        &format!("{ORDER}[admin]\nallowed_hosts = [\" Rocgate.Internal\\t\"]\n"),
        "t.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.admin_allowed_hosts, vec!["rocgate.internal"]);
    refused(
        &format!("{ORDER}[admin]\nallowed_hosts = [\"  \"]\n"),
        "admin.allowed_hosts[0]",
        "must not be empty",
    );
    let env = [(
        "ROCGATE__ADMIN__ALLOWED_HOSTS".to_owned(),
        "rocgate.internal,a b".to_owned(),
    )];
    let e = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("t.toml: admin.allowed_hosts[1]: must be a host name")
            && e.to_string()
                .ends_with("(set by environment variable ROCGATE__ADMIN__ALLOWED_HOSTS)"),
        "{e}"
    );
}

/// `[admin] reads` is "open" by default, "token" with a token set, from the file or
/// the environment; "token" beside a token the file refuses is reported as the
/// token's error alone, not again as a token missing.
#[test]
fn admin_reads_is_read_and_needs_the_token() {
    use rocgate::config::AdminReads;
    let c = Config::from_toml_str(&route(""), "t.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.admin_reads, AdminReads::Open);
    for (reads, read) in [("open", AdminReads::Open), ("token", AdminReads::Token)] {
        let text = route(&format!(
            "[admin]\ntoken = \"a-long-enough-token\"\nreads = \"{reads}\""
        ));
        let c = Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.server.admin_reads, read, "{reads}");
    }
    let env = [
        ("ROCGATE__ADMIN__READS".to_owned(), "token".to_owned()),
        (
            "ROCGATE__ADMIN__TOKEN".to_owned(),
            "a-long-enough-token".to_owned(),
        ),
    ];
    let c = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.admin_reads, AdminReads::Token);
    let env = [("ROCGATE__ADMIN__READS".to_owned(), "token".to_owned())];
    let e = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_err();
    assert!(
        e.to_string()
            .contains("admin.reads: \"token\" needs admin.token set")
            && e.to_string().contains("ROCGATE__ADMIN__READS"),
        "{e}"
    );
    let text = route("[admin]\ntoken = \" \"\nreads = \"token\"");
    let found = problems(&text);
    assert!(
        found.iter().any(|l| l.starts_with("admin.token:"))
            && !found.iter().any(|l| l.starts_with("admin.reads")),
        "{found:?}"
    );
}

/// `[admin] wrong_tokens_burst` and `wrong_tokens_per_second` bound the wrong bearer
/// tokens a client address may send: 10 and 1 by default, set in the file or the
/// environment, refused outside their bounds naming the field.
#[test]
fn admin_wrong_tokens_are_read_and_bounded() {
    let c = Config::from_toml_str(&route(""), "t.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            c.server.admin_wrong_tokens_burst,
            c.server.admin_wrong_tokens_per_second
        ),
        (10, 1.0)
    );
    let text = route("[admin]\nwrong_tokens_burst = 3\nwrong_tokens_per_second = 0.2");
    let c = Config::from_toml_str(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            c.server.admin_wrong_tokens_burst,
            c.server.admin_wrong_tokens_per_second
        ),
        (3, 0.2)
    );
    let env = [(
        "ROCGATE__ADMIN__WRONG_TOKENS_BURST".to_owned(),
        "5".to_owned(),
    )];
    let c = Config::from_toml_str_with_env(ORDER, "t.toml", env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.server.admin_wrong_tokens_burst, 5);
    refused(
        &route("[admin]\nwrong_tokens_burst = 0"),
        "admin.wrong_tokens_burst",
        "must be at least 1, got 0",
    );
    refused(
        &route("[admin]\nwrong_tokens_burst = 10001"),
        "admin.wrong_tokens_burst",
        "must be at most 10000, got 10001",
    );
    for bad in ["0", "0.001", "-1", "1001"] {
        refused(
            &route(&format!("[admin]\nwrong_tokens_per_second = {bad}")),
            "admin.wrong_tokens_per_second",
            &format!("must be from 0.01 to 1000, got {bad}"),
        );
    }
}
