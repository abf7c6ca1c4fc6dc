//! Property tests of the parsers of outside input: whatever they are given, they
//! return a value or an error naming where the input is wrong, and never panic
//! (proptest; failures are kept in `tests/parser_properties.proptest-regressions`).

use proptest::prelude::*;
use rocgate::config::Config;
use rocgate::sim::access_log::parse_line;
use rocgate::sim::{Profile, SweepParam};

const ROUTES: &str = "[[routes]]\nname = \"order\"\npath = \"/api/order\"\n\
                      partition = \"header:x-key\"\n\
                      [[routes.tiers]]\nname = \"gold\"\nvalues = [\"k\"]\nbase_limit = 10\ncut_limit = 5\n\
                      [[routes.events]]\nname = \"sale\"\nstart = \"2030-01-01T00:00:00Z\"\nduration = \"1h\"\n";

/// The field paths of the file's tables, as an override's name spells them.
const FIELDS: [&str; 8] = [
    "DEFAULTS__BASE_LIMIT",
    "DEFAULTS__HOLD",
    "ROUTES__0__BASE_LIMIT",
    "ROUTES__0__CUT_LIMIT",
    "ROUTES__0__TIERS__0__BASE_LIMIT",
    "ROUTES__0__TIERS__0__VALUES",
    "ROUTES__0__EVENTS__0__DURATION",
    "SERVER__TRUSTED_PROXIES",
];

/// A variable: a real field path, one with a part changed, or parts at random.
fn override_name() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(&FIELDS[..]).prop_map(|f| format!("ROCGATE__{f}")),
        (
            prop::sample::select(&FIELDS[..]),
            0..6usize,
            override_part()
        )
            .prop_map(|(f, i, part)| {
                let mut parts: Vec<String> = f.split("__").map(str::to_owned).collect();
                let i = i % parts.len();
                parts[i] = part;
                format!("ROCGATE__{}", parts.join("__"))
            }),
        random_override_name(),
    ]
}

/// The field path a variable's name spells, as errors write locations: `ROCGATE__ROUTES__00__EVENTS__0__DURATION`
/// is `routes[0].events[0].duration` (an index may have leading zeros).
fn field_path(var: &str) -> String {
    let mut path = String::new();
    for part in var.to_ascii_lowercase().split("__").skip(1) {
        match part.parse::<u64>() {
            Ok(index) if part.bytes().all(|b| b.is_ascii_digit()) => {
                path.push_str(&format!("[{index}]"));
            }
            _ => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(part);
            }
        }
    }
    path
}

/// One part of a variable's name, right or wrong.
fn override_part() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("00".to_owned()),
        Just("1".to_owned()),
        Just("-1".to_owned()),
        Just(String::new()),
        Just("99999999999999999999999".to_owned()),
        "[a-z_]{1,10}",
        "[A-Za-z0-9_.\\[\\]-]{1,5}",
        "\\PC{1,3}",
    ]
}

/// A field path of the file, right or wrong, as an override's name spells it.
fn random_override_name() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        Just("defaults".to_owned()),
        Just("routes".to_owned()),
        Just("tiers".to_owned()),
        Just("events".to_owned()),
        Just("server".to_owned()),
        Just("store".to_owned()),
        Just("base_limit".to_owned()),
        Just("hold".to_owned()),
        Just("values".to_owned()),
        Just("name".to_owned()),
        Just("trusted_proxies".to_owned()),
        "[0-9]{1,22}",
        "-?[0-9]",
        "[a-z_.\\[\\]]{0,6}",
        "\\PC{0,4}",
    ];
    prop::collection::vec(part, 1..5).prop_map(|parts| format!("ROCGATE__{}", parts.join("__")))
}

/// A value as the environment may hold it.
fn override_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("NaN".to_owned()),
        Just("inf".to_owned()),
        Just("-inf".to_owned()),
        Just("1e309".to_owned()),
        Just("0s".to_owned()),
        Just("1e309s".to_owned()),
        Just("-5s".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("99999999999y".to_owned()),
        Just("[1, 2]".to_owned()),
        Just("a,b".to_owned()),
        "-?[0-9]{0,25}(\\.[0-9]{0,5})?(e-?[0-9]{1,3})?[a-z]{0,2}",
        "\\PC{0,12}",
    ]
}

/// `default` cases per property, or as many as `PROPTEST_CASES` asks for (to explore
/// further: README.md, Development).
fn cases(default: u32) -> ProptestConfig {
    let config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_some() {
        config
    } else {
        ProptestConfig {
            cases: default,
            ..config
        }
    }
}

proptest! {
    #![proptest_config(cases(512))]

    /// Any bytes: an access-log line or the reason it is not one.
    #[test]
    fn an_access_log_line_never_panics(line in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = parse_line(&line);
    }

    /// Lines built from the shapes of a log line, with the bytes around them
    /// disturbed, parse or are refused without panicking.
    #[test]
    fn a_near_access_log_line_never_panics(
        client in "[0-9a-f:.]{0,12}",
        time in "[0-9]{0,2}/[A-Za-z]{0,3}/[0-9]{0,4}:[0-9]{0,2}:[0-9]{0,2}:[0-9]{0,2} [+-]?[0-9]{0,4}",
        request in "[A-Z]{0,6} /[ -~]{0,10}( HTTP/1\\.[01])?",
        tail in "[ -~\\\\\"]{0,20}",
    ) {
        let line = format!("{client} - - [{time}] \"{request}\" 200 12{tail}");
        if let Ok(l) = parse_line(line.as_bytes()) {
            let _ = l.method_and_path();
            let _ = l.request_text();
            let _ = l.client_ip();
        }
    }

    /// Any text: a profile, or an error whose line is one of the text's lines.
    #[test]
    fn a_profile_error_names_a_line_of_the_text(
        lines in prop::collection::vec(
            prop_oneof![
                "-?[0-9]{1,4}(\\.[0-9]{1,3})?,-?[0-9]{1,4}(\\.[0-9]{1,3})?",
                "[0-9e.+-]{0,8},[0-9e.+-]{0,8}(,[0-9]{0,3})?",
                "\\PC{0,12}",
                Just("t_seconds,rate".to_owned()),
                Just("# comment".to_owned()),
                Just(String::new()),
            ],
            0..12,
        ),
    ) {
        let text = lines.join("\n");
        if let Err(e) = Profile::parse_csv(&text) {
            if let Some(line) = e.line() {
                prop_assert!((1..=lines.len()).contains(&line), "{e} for {} line(s)", lines.len());
                prop_assert!(e.to_string().starts_with(&format!("line {line}: ")), "{e}");
            }
        }
    }

    /// Any `--sweep` text: a parameter, or an error quoting it (or, for too many
    /// values, naming the parameter).
    #[test]
    fn a_sweep_error_quotes_the_parameter(spec in prop_oneof![
        "[a-z_.]{0,12}=[0-9.,:-]{0,14}",
        "(order\\.)?(danger_roc|hold|min_samples|queue|window)=-?[0-9]{1,4}(\\.\\.-?[0-9]{1,6}:-?[0-9.]{1,4})?",
        "\\PC{0,16}",
    ]) {
        if let Err(e) = spec.parse::<SweepParam>() {
            let text = e.to_string();
            let label = spec.split_once('=').map_or("", |(label, _)| label.trim());
            prop_assert!(
                text.contains(&format!("`{spec}`")) || (!label.is_empty() && text.contains(label)),
                "{text}"
            );
        }
    }

    /// Any overrides of any field: a config, or errors that each name where they
    /// are and the variable that set what is wrong. (The file alone is valid, so every
    /// problem comes from a variable; one found where another field of the same
    /// table does not fit the value set may name that field only.)
    #[test]
    fn environment_overrides_never_panic_and_name_the_variable(
        vars in prop::collection::vec((override_name(), override_value()), 1..4),
    ) {
        let env: Vec<(String, String)> = vars.clone();
        if let Err(e) = Config::from_toml_str_with_env(ROUTES, "t.toml", env) {
            for problem in e.problems() {
                let named = vars.iter().any(|(var, _)| problem.message().contains(var.as_str()));
                let sibling = problem.location().rsplit_once('.').is_some_and(|(table, _)| {
                    vars.iter().any(|(var, _)| field_path(var).starts_with(&format!("{table}.")))
                });
                prop_assert!(
                    named || (sibling && !problem.location().is_empty()),
                    "{problem} does not name the variable, for {vars:?}"
                );
            }
        }
    }

    /// Any TOML-ish text: a config, or errors with a location or a message.
    #[test]
    fn a_config_file_never_panics(text in prop_oneof![
        "\\PC{0,40}",
        "(\\[\\[routes\\]\\]\nname = \"[a-z]{1,3}\"\npath = \"/[a-z{}/]{0,6}\"\n[a-z_]{1,12} = (-?[0-9]{1,20}|\"[0-9a-z.]{0,6}\"|nan|inf|true|\\[\\])\n){1,3}",
    ]) {
        if let Err(e) = Config::from_toml_str(&text, "t.toml") {
            prop_assert!(!e.problems().is_empty());
        }
    }
}
