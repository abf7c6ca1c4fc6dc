//! Unit tests of the file format: what the raw structs take, what their validation
//! reports and where, and that what it writes back reads as the routes given.
//! [`reference`] holds README's configuration reference and `config/rocgate.toml` to
//! the raw structs.

use super::*;

mod reference;

/// [`super::patch_controller`]'s problems, whichever kind of refusal.
fn patch_controller(
    current: &ControllerParams,
    algorithm: &Algorithm,
    json: &str,
    withdraw: Option<&str>,
) -> Result<ControllerParams, Vec<Problem>> {
    super::patch_controller(current, algorithm, json, withdraw).map_err(PatchError::problems)
}

/// [`super::patch_controller`] of `json` on the default parameters and algorithm, its
/// refusal kept whole (a body that is no change, or one the rules refuse).
fn patched(json: &str) -> Result<ControllerParams, PatchError> {
    super::patch_controller(
        &ControllerParams::default(),
        &Algorithm::default(),
        json,
        None,
    )
}

/// A body that is no change (its syntax, a field unknown, given twice or of the wrong
/// JSON type, `null`) is told apart from a change the rules refuse: the admin API
/// answers the first 400, the second 422.
#[test]
fn a_change_that_does_not_read_is_told_from_one_the_rules_refuse() {
    let malformed = |json: &str| matches!(patched(json), Err(PatchError::Malformed(_)));
    for json in [
        "[1]",
        r#"{"base_limit": }"#,
        r#"{} {}"#,
        r#"{"colour": 1}"#,
        r#"{"base_limit": "300"}"#,
        r#"{"min_samples": "3"}"#,
        r#"{"base_limit": 300, "base_limit": 300}"#,
        r#"{"hold": null}"#,
        r#"{"base_limit": 1e400}"#,
        r#"{"min_samples": true}"#,
        r#"{"hold": 5}"#,
        r#"{"max_cut": 2.5}"#,
        r#"{"min_dwell": [1]}"#,
    ] {
        assert!(malformed(json), "{json}");
    }
    for json in [
        r#"{"cut_limit": 300}"#,
        r#"{"hold": "soon"}"#,
        r#"{"base_limit": -1}"#,
        r#"{"roc_mode": "sideways"}"#,
        // JSON's one number type, out of the field's bounds as -1 is of base_limit's.
        r#"{"min_samples": -1}"#,
        r#"{"min_samples": 2.5}"#,
    ] {
        assert!(
            matches!(patched(json), Err(PatchError::Refused(_))),
            "{json}"
        );
    }
}

/// A whole number out of its bounds in a change (`-1`, `2.5`: JSON has one type of
/// number) is refused by the rules, with the change's other problems, as `base_limit:
/// -1` is: it was refused alone as no change, where every other number of the right
/// JSON type out of its field's bounds was refused with the rest.
#[test]
fn a_whole_number_out_of_its_bounds_is_refused_with_the_changes_other_problems() {
    let e = patch_controller(
        &ControllerParams::default(),
        &Algorithm::default(),
        r#"{"min_samples": -1, "base_limit": -5}"#,
        None,
    )
    .unwrap_err();
    let said: Vec<String> = e.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        said,
        [
            "base_limit: must be a number > 0, got -5",
            "min_samples: invalid value: integer `-1`, expected a whole number ≥ 0",
        ]
    );
}

/// A number written not 0 but nearer 0 than any number held (`1e-400`) is refused as a
/// body that is no change (400), as one past the largest (`1e400`) is, naming the
/// field and the number as written: serde_json reads it as 0, which was taken where 0
/// is allowed (`min_rps`) or refused as `got 0`. A 0 written so (`0e-400`) is 0.
#[test]
fn a_number_nearer_0_than_any_held_is_a_change_that_does_not_read() {
    let Err(PatchError::Malformed(e)) = patched(r#"{"min_rps": 1e-400, "base_limit": -2.5E-999}"#)
    else {
        panic!("taken or refused by the rules");
    };
    let said: Vec<String> = e.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        said,
        [
            "min_rps: number out of range, got \"1e-400\": nearer 0 than any number held, it would read as 0 (write 0 if 0 is meant)",
            "base_limit: number out of range, got \"-2.5E-999\": nearer 0 than any number held, it would read as 0 (write 0 if 0 is meant)",
        ]
    );
    let params = patched(r#"{"min_rps": 0e-400}"#).unwrap();
    assert_eq!(params.min_rps, 0.0);
}

/// A number past the largest held (`1e400`, `-1e400`, `1E+999`) is refused as a body
/// that is no change (400), naming the field and the number as written, with the
/// change's other problems of shape, as one nearer 0 than any held (`1e-400`) is: it was
/// serde_json's `number out of range at line 1 column 20`, the first such number alone
/// and no other problem. A body that does not read for another reason as well (cut
/// short) is refused as before.
#[test]
fn a_number_past_the_largest_held_is_refused_naming_its_field_as_written() {
    let Err(PatchError::Malformed(e)) = patched(
        r#"{"base_limit": 1e400, "colour": 1, "min_rps": -1e400, "cut_limit": 1E+999, "safe_roc": 1e-400}"#,
    ) else {
        panic!("taken or refused by the rules");
    };
    let said: Vec<String> = e.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        said,
        [
            "base_limit: number out of range, got \"1e400\": past the largest number held",
            "colour: unknown field `colour`, expected one of `base_limit`, `cut_limit`, `danger_roc`, `safe_roc`, `hold`, `restore_step`, `restore_interval`, `min_rps`, `min_samples`, `min_dwell`, `max_cut`, `roc_mode`",
            "min_rps: number out of range, got \"-1e400\": past the largest number held",
            "cut_limit: number out of range, got \"1E+999\": past the largest number held",
            "safe_roc: number out of range, got \"1e-400\": nearer 0 than any number held, it would read as 0 (write 0 if 0 is meant)",
        ]
    );
    let Err(PatchError::Malformed(e)) = patched(r#"{"base_limit": 1e400"#) else {
        panic!("taken or refused by the rules");
    };
    let said: Vec<String> = e.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        said,
        ["base_limit: number out of range at line 1 column 20"]
    );
}

/// A number written as a string is told how to write it only where its text, without
/// the quotes, is a JSON number the field takes: `Infinity`, `NaN`, `.5`, `+5`, `007`
/// and `1e400` are no JSON number, and `7.0` no whole one, so the advice was a change
/// that is no JSON or refused again. `1e-400` is a JSON number, but one nearer 0 than
/// any held, which a change does not read (400): it was advised.
#[test]
fn a_number_as_a_string_is_told_to_drop_the_quotes_only_where_that_reads() {
    let said = |json: &str| {
        patch_controller(
            &ControllerParams::default(),
            &Algorithm::default(),
            json,
            None,
        )
        .unwrap_err()[0]
            .message()
            .to_owned()
    };
    for text in [
        "Infinity", "NaN", "inf", ".5", "5.", "+5", "007", "1e400", "0x10", "1e-400", "-1E-999",
    ] {
        assert_eq!(
            said(&format!(r#"{{"base_limit": "{text}"}}"#)),
            format!("must be a number, got the string \"{text}\""),
            "{text}"
        );
    }
    for text in ["7.0", "+7", "1e2"] {
        assert_eq!(
            said(&format!(r#"{{"min_samples": "{text}"}}"#)),
            format!("must be a whole number ≥ 0, got the string \"{text}\""),
            "{text}"
        );
    }
    assert_eq!(
        said(r#"{"base_limit": " -2.5e1 "}"#),
        "must be a number, got the string \" -2.5e1 \" (write it without quotes: -2.5e1)"
    );
}

/// A change's problem quotes a long field name or value by its first 64 characters,
/// cut between characters: a name of two-byte characters (`é`) is cut at a character's
/// boundary, not inside one (which would panic), and its length given in bytes.
#[test]
fn a_long_name_or_value_of_many_byte_characters_is_quoted_cut_between_characters() {
    let long = "é".repeat(100);
    let first: String = "é".repeat(64);
    for (json, said) in [
        (
            format!(r#"{{"{long}": 1}}"#),
            format!("unknown field `{first}`… (200 bytes)"),
        ),
        (
            format!(r#"{{"base_limit": "{long}"}}"#),
            format!("must be a number, got the string \"{first}\"… (200 bytes)"),
        ),
    ] {
        let e = patch_controller(
            &ControllerParams::default(),
            &Algorithm::default(),
            &json,
            None,
        )
        .unwrap_err();
        assert!(e[0].message().starts_with(&said), "{:?}", e[0].message());
    }
}

/// What [`check_routes`] writes back reads as the very routes it was given, for
/// every shipped file (tiers, events, partitions, every algorithm, relative ROC):
/// no setting is lost or changed on the way, so the file's rules see what runs.
#[test]
fn routes_written_back_read_as_themselves() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files = vec![dir.join("rocgate.toml")];
    for entry in std::fs::read_dir(dir.join("examples")).expect("config/examples") {
        files.push(entry.expect("an entry").path());
    }
    assert!(files.len() >= 8, "{files:?}");
    for path in files {
        let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let again = reread(&config.routes).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        assert_eq!(again.routes, config.routes, "{}", path.display());
    }
    // Durations to the nanosecond, and an event's start too.
    let mut r = RouteConfig::new("r", RouteMatch::exact("GET", "/api/items/{id}"));
    r.controller.hold = Duration::from_nanos(1_500_000_001);
    r.partition = Partition::Header("X-Api-Key".into(), KeyLimits::default());
    r.route_limit_rps = Some(500.0);
    r.events.push(Event {
        name: "sale".into(),
        start: SystemTime::UNIX_EPOCH + Duration::from_nanos(1_764_000_000_123_456_789),
        duration: Duration::from_secs(60),
        controller: r.controller.clone(),
        sets: Some(ProfileFields::ALL),
        route_limit_rps: Some(900.0),
    });
    let again = reread(std::slice::from_ref(&r)).expect("valid");
    assert_eq!(again.routes[0].route_limit_rps, Some(500.0));
    assert_eq!(again.routes[0].controller, r.controller);
    assert_eq!(again.routes[0].events, r.events);
    assert_eq!(again.routes[0].matcher, r.matcher);
    // An event that sets `safe_roc` alone keeps the `danger_roc` it was written over
    // (the three of ROC go together), here not the route's: the table writes it too.
    let mut kept = r.controller.clone();
    (kept.danger_roc, kept.safe_roc) = (100.0, 70.0);
    r.events[0].controller = kept.clone();
    r.events[0].sets = Some(ProfileFields {
        safe_roc: true,
        ..ProfileFields::default()
    });
    let again = reread(std::slice::from_ref(&r)).expect("valid");
    assert_eq!(again.routes[0].events[0].controller, kept);
}

/// [`EVENT_SETTINGS`] are the settings an event's table takes: the fields its
/// deserializer takes, past `name`, `start` and `duration`.
#[test]
fn event_settings_are_the_fields_an_event_takes() {
    let fields = fields_of::<RawEvent>();
    assert_eq!(fields[..3], ["name", "start", "duration"]);
    assert_eq!(fields[3..], EVENT_SETTINGS);
}

fn matcher(method: Option<&str>, path: PathPattern) -> RouteMatch {
    RouteMatch {
        method: method.map(str::to_owned),
        path,
    }
}

fn template(path: &str) -> PathPattern {
    PathPattern::parse_path(path).expect("a valid template")
}

#[test]
fn a_route_is_shadowed_only_when_every_request_it_matches_is_taken() {
    let prefix = |p: &str| PathPattern::Prefix(p.to_owned());
    let exact = |p: &str| PathPattern::Exact(p.to_owned());
    let all = matcher(None, prefix("/"));
    let api = matcher(None, prefix("/api/"));
    let post_order = matcher(Some("POST"), exact("/api/order"));
    let items = matcher(None, template("/api/items/{id}"));

    assert!(shadows(&all, &post_order));
    assert!(shadows(&api, &post_order));
    assert!(shadows(&api, &items));
    assert!(shadows(&api, &matcher(None, prefix("/api/v2"))));
    assert!(shadows(&items, &matcher(None, exact("/api/items/7"))));
    assert!(shadows(&post_order, &post_order.clone()));

    assert!(!shadows(
        &post_order,
        &matcher(Some("GET"), exact("/api/order"))
    ));
    assert!(!shadows(&post_order, &matcher(None, exact("/api/order"))));
    assert!(!shadows(&matcher(Some("GET"), prefix("/")), &post_order));
    // A GET route takes HEAD requests too (the GET handler answers them).
    let get_order = matcher(Some("GET"), exact("/api/order"));
    let head_order = matcher(Some("HEAD"), exact("/api/order"));
    assert!(shadows(&get_order, &head_order));
    assert!(!shadows(&head_order, &get_order));
    assert!(!shadows(&api, &matcher(None, prefix("/ap"))));
    assert!(!shadows(
        &items,
        &matcher(None, exact("/api/items/7/reviews"))
    ));
    assert!(!shadows(&matcher(None, prefix("/api/items/1")), &items));
}

#[test]
fn a_template_shadows_a_later_one_whatever_its_parameters_are_named() {
    let items = matcher(None, template("/api/items/{id}"));
    assert!(shadows(
        &items,
        &matcher(None, template("/api/items/{item}"))
    ));
    assert!(shadows(
        &items,
        &matcher(Some("GET"), template("/api/items/{sku}/"))
    ));
    assert!(shadows(
        &matcher(None, template("/api/{kind}/{id}")),
        &items
    ));
    assert!(!shadows(
        &items,
        &matcher(None, template("/api/{kind}/{id}"))
    ));
    assert!(!shadows(
        &items,
        &matcher(None, template("/api/items/{id}/reviews"))
    ));
    assert!(!shadows(
        &matcher(None, template("/api/items/{id}/reviews")),
        &items
    ));
    assert!(!shadows(
        &matcher(None, template("/api/orders/{id}")),
        &items
    ));
    // And the file says so.
    let text = "[[routes]]\nname = \"a\"\npath = \"/api/items/{id}\"\n\
                    [[routes]]\nname = \"b\"\npath = \"/api/items/{item}\"\n";
    let e = Config::from_toml_str(text, "t.toml")
        .unwrap_err()
        .to_string();
    assert_eq!(
            e,
            "t.toml: routes[1].path: never matches: routes[0] (\"a\") comes first and its path takes every request it would"
        );
}

#[test]
fn a_change_that_is_not_json_is_named_once() {
    let e = crate::config::patch_controller(
        &ControllerParams::default(),
        &Algorithm::default(),
        r#"{"base_limit": }"#,
        "PUT /admin/routes/order",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "PUT /admin/routes/order: base_limit: expected value at line 1 column 16"
    );
    // What follows the object is not dropped silently.
    let e = patch_controller(
        &ControllerParams::default(),
        &Algorithm::default(),
        r#"{"base_limit": 300} {"cut_limit": 500}"#,
        None,
    )
    .unwrap_err();
    assert_eq!(e[0].to_string(), "trailing characters at line 1 column 21");
}

/// `null` is no value: refused at its field, where it read as the field left out
/// (answered 200, the route unchanged, the operator told it was done).
#[test]
fn a_change_setting_a_field_to_null_is_refused_at_that_field() {
    for (json, field) in [
        (r#"{"base_limit": null}"#, "base_limit"),
        (r#"{"cut_limit": 30, "hold": null}"#, "hold"),
        (r#"{"min_samples": null}"#, "min_samples"),
    ] {
        let e = patch_controller(
            &ControllerParams::default(),
            &Algorithm::default(),
            json,
            None,
        )
        .unwrap_err();
        assert_eq!(e.len(), 1, "{json}: {e:?}");
        assert_eq!(e[0].location(), field, "{json}");
        assert!(e[0].message().contains("null is no value"), "{json}: {e:?}");
    }
}

/// A problem with a named field's value is placed by the field, as a file's is: the
/// JSON position serde_json appends ended the `null` refusal's "to go back to the
/// file's parameters at line 1 column 20", which read as a place in the config file.
/// A problem of the text's syntax keeps its position: it has no field to name.
/// A duration given no string (`5`, `true`, an array) says it takes a duration string:
/// `5` was taken as the text "5" and refused by the rules (422) as without a unit. A
/// number far from 1 is shown as the problems show a figure (`1e300`, `-1e-300`), not
/// in its hundreds of digits (`1000…`, `-0.000…1`).
#[test]
fn a_changes_field_problem_is_placed_by_its_field_alone() {
    for (json, field, message) in [
        (
            r#"{"base_limit": null}"#,
            "base_limit",
            "null is no value: leave the field out to keep it, or withdraw the change to go back to the file's parameters",
        ),
        (
            r#"{"base_limit": "x"}"#,
            "base_limit",
            "must be a number, got the string \"x\"",
        ),
        (
            r#"{"hold": true}"#,
            "hold",
            "must be a duration string such as \"5s\" or \"100ms\", got true",
        ),
        (
            r#"{"hold": 5}"#,
            "hold",
            "must be a duration string such as \"5s\" or \"100ms\", got the number 5",
        ),
        (
            r#"{"max_cut": 2.5}"#,
            "max_cut",
            "must be a duration string such as \"5s\" or \"100ms\", got the number 2.5",
        ),
        (
            r#"{"hold": 1e300}"#,
            "hold",
            "must be a duration string such as \"5s\" or \"100ms\", got the number 1e300",
        ),
        (
            r#"{"max_cut": -1e-300}"#,
            "max_cut",
            "must be a duration string such as \"5s\" or \"100ms\", got the number -1e-300",
        ),
        (
            r#"{"min_dwell": ["5s"]}"#,
            "min_dwell",
            "must be a duration string such as \"5s\" or \"100ms\", got an array",
        ),
        (
            r#"{"restore_interval": {"s": 5}}"#,
            "restore_interval",
            "must be a duration string such as \"5s\" or \"100ms\", got an object",
        ),
        (
            r#"{"hold": null}"#,
            "hold",
            "null is no value: leave the field out to keep it, or withdraw the change to go back to the file's parameters",
        ),
    ] {
        let e = patch_controller(&ControllerParams::default(), &Algorithm::default(), json, None)
            .unwrap_err();
        assert_eq!(e.len(), 1, "{json}: {e:?}");
        assert_eq!(e[0].location(), field, "{json}");
        assert_eq!(e[0].message(), message, "{json}");
    }
    let e = patch_controller(
        &ControllerParams::default(),
        &Algorithm::default(),
        r#"{"colour": 1}"#,
        None,
    )
    .unwrap_err();
    assert_eq!(e[0].location(), "colour");
    assert!(
        e[0].message().ends_with("`max_cut`, `roc_mode`"),
        "{:?}",
        e[0].message()
    );
    let e = patch_controller(
        &ControllerParams::default(),
        &Algorithm::default(),
        r#"{"base_limit": }"#,
        None,
    )
    .unwrap_err();
    assert_eq!(e[0].message(), "expected value at line 1 column 16");
}

#[test]
fn a_change_keeps_a_token_buckets_capacity_within_what_it_holds() {
    // 10^6 req/s for 2 h is 7.2 × 10^9 tokens; the bucket holds 2^32 − 1.
    let bucket = Algorithm::TokenBucket {
        burst: Duration::from_secs(7200),
    };
    let e = patch_controller(
        &ControllerParams::default(),
        &bucket,
        r#"{"base_limit": 1000000}"#,
        None,
    )
    .unwrap_err();
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].location(), "base_limit");
    assert!(
        e[0].message()
            .contains("base_limit × burst must be at most 4294967295 tokens"),
        "{e:?}"
    );
    patch_controller(
        &ControllerParams::default(),
        &bucket,
        r#"{"base_limit": 500000}"#,
        None,
    )
    .unwrap();
}

#[test]
fn a_change_of_roc_mode_at_runtime_takes_thresholds_of_the_new_mode() {
    // An absolute route (danger 80 req/s per half-window): read as a ratio, 80 would mean
    // demand up 81-fold. The file requires the thresholds with relative, and so
    // does a change.
    let absolute = ControllerParams::default();
    let patch = |json: &str, current: &ControllerParams| {
        patch_controller(current, &Algorithm::default(), json, None)
    };
    let e = patch(r#"{"roc_mode": "relative"}"#, &absolute).unwrap_err();
    let fields: Vec<&str> = e.iter().map(Problem::location).collect();
    assert_eq!(fields, ["danger_roc", "safe_roc"], "{e:?}");
    assert!(e[0].message().contains("roc_mode"), "{e:?}");
    let e = patch(r#"{"roc_mode": "relative", "danger_roc": 1.5}"#, &absolute).unwrap_err();
    let about_mode: Vec<&str> = e
        .iter()
        .filter(|p| p.message().contains("roc_mode"))
        .map(Problem::location)
        .collect();
    assert_eq!(about_mode, ["safe_roc"], "{e:?}");
    let relative = patch(
        r#"{"roc_mode": "relative", "danger_roc": 1.5, "safe_roc": 0.2}"#,
        &absolute,
    )
    .unwrap();
    assert_eq!(relative.roc_mode, RocMode::Relative);
    assert_eq!((relative.danger_roc, relative.safe_roc), (1.5, 0.2));
    // Back to absolute: the ratios would be read as req/s per half-window.
    let e = patch(r#"{"roc_mode": "absolute"}"#, &relative).unwrap_err();
    assert_eq!(e.len(), 2, "{e:?}");
    // Naming the mode in force, or changing a threshold alone, needs nothing more.
    assert!(patch(r#"{"roc_mode": "relative"}"#, &relative).is_ok());
    assert_eq!(
        patch(r#"{"danger_roc": 2}"#, &relative).unwrap().danger_roc,
        2.0
    );
}

#[test]
fn every_algorithm_name_is_the_limiter_s_own() {
    for (name, kind) in ALGORITHMS {
        let s = Settings {
            algorithm: Some(Set {
                value: kind,
                scope: Scope::Defaults,
            }),
            ..Settings::builtin()
        };
        let built = algorithm_of(&mut Problems::default(), &s, Scope::Defaults);
        assert_eq!(built.map(|a| a.name()), Some(name));
    }
}

/// The field names a struct's derived `Deserialize` takes (the list it hands
/// `deserialize_struct`), so that the docs are compared with the file format itself.
fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> Deserializer<'de> for Probe<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map
            enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    assert!(
        !fields.is_empty(),
        "{} declares no field",
        std::any::type_name::<T>()
    );
    fields
}

/// The check that refuses a route an earlier one shadows, as it was before the routes
/// were indexed for it: every route against every valid one before it, first one that
/// [`shadows`] it. The oracle of [`first_shadowing`].
fn first_shadowing_pairwise(matchers: &[Option<&RouteMatch>]) -> Vec<Option<usize>> {
    matchers
        .iter()
        .enumerate()
        .map(|(j, later)| {
            let later = (*later)?;
            (0..j).find(|&i| matchers[i].is_some_and(|first| shadows(first, later)))
        })
        .collect()
}

/// Segments' text, few enough that routes share them: one a prefix of another (`a`,
/// `ab`), two longer than 8 bytes that differ only after them, and the empty one
/// (`//`, a trailing slash).
fn shadow_text() -> impl proptest::strategy::Strategy<Value = String> + Clone {
    use proptest::strategy::Strategy;
    proptest::sample::select(vec!["a", "ab", "b", "api", "products-a", "products-b", ""])
        .prop_map(str::to_owned)
}

/// A route's path pattern, normalized or not (`//`, an empty literal): an exact path,
/// a prefix (ending in a slash, mid-segment, or the root), or a template of literals
/// and parameters ending in a catch-all, a trailing slash or neither. (Not a catch-all
/// before the last segment, which the file refuses before this check: the pairwise
/// check read one before a catch-all as a parameter, where the route matches no path.)
fn shadow_pattern() -> impl proptest::strategy::Strategy<Value = PathPattern> {
    use proptest::prelude::*;
    let text = || {
        (prop::collection::vec(shadow_text(), 0..4), any::<bool>()).prop_map(|(s, slash)| {
            let mut p = format!("/{}", s.join("/"));
            if slash && !s.is_empty() {
                p.push('/');
            }
            p
        })
    };
    let segment = prop_oneof![
        3 => shadow_text().prop_map(Segment::Literal),
        2 => prop::sample::select(vec!["id", "x"]).prop_map(|n| Segment::Param(n.to_owned())),
    ];
    prop_oneof![
        text().prop_map(PathPattern::Exact),
        (text(), any::<bool>()).prop_map(|(mut p, cut)| {
            if cut && p.len() > 1 {
                p.pop();
            }
            PathPattern::Prefix(p)
        }),
        (prop::collection::vec(segment, 0..5), 0..3u8).prop_map(|(mut s, end)| {
            match end {
                0 => s.push(Segment::CatchAll("rest".to_owned())),
                1 => s.push(Segment::Literal(String::new())),
                _ => {}
            }
            PathPattern::Template(s)
        }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(2048))]

    /// The check finds, for every route, the same earlier route that shadows it (or
    /// none) as comparing it with every valid route before it: the index it walks
    /// misses no route that shadows, whatever the patterns (exact paths, prefixes,
    /// templates, catch-alls, literals that one another start with), the methods (any,
    /// `GET` which takes `HEAD`, others) and the invalid routes (`None`) among them.
    #[test]
    fn the_indexed_shadow_check_finds_what_every_pair_finds(
        drawn in proptest::collection::vec(
            proptest::option::weighted(
                0.9,
                (
                    proptest::sample::select(vec![None, Some("GET"), Some("HEAD"), Some("POST")]),
                    shadow_pattern(),
                ),
            ),
            1..40,
        ),
    ) {
        let matchers: Vec<Option<RouteMatch>> = drawn
            .into_iter()
            .map(|r| r.map(|(method, path)| RouteMatch::new(method, path)))
            .collect();
        let matchers: Vec<Option<&RouteMatch>> = matchers.iter().map(Option::as_ref).collect();
        proptest::prop_assert_eq!(
            first_shadowing(&matchers),
            first_shadowing_pairwise(&matchers),
            "{:?}",
            matchers
        );
    }
}

/// The check walks the tries without recursion: a template, an exact path and a
/// prefix 100,000 segments deep are each found shadowed by the earlier deep template
/// that takes their paths, where a walk that recursed once a segment overflowed the
/// test thread's stack and aborted the process (a file like this aborted
/// `check-config`, and a `serve` reload, with it).
#[test]
fn routes_of_many_segments_are_checked_without_overflowing_the_stack() {
    let deep = "/a".repeat(100_000);
    let routes = [
        matcher(None, template(&format!("{deep}/{{*rest}}"))),
        matcher(None, template(&format!("{deep}/{{id}}"))),
        matcher(None, PathPattern::Exact(format!("{deep}/b"))),
        matcher(None, PathPattern::Prefix(format!("{deep}/b"))),
        matcher(Some("GET"), template(&format!("{deep}/{{id}}"))),
        matcher(Some("GET"), PathPattern::Exact(format!("{deep}/c"))),
    ];
    let matchers: Vec<Option<&RouteMatch>> = routes.iter().map(Some).collect();
    assert_eq!(
        first_shadowing(&matchers),
        [None, Some(0), Some(0), Some(0), Some(0), Some(0)]
    );
}

/// `cluster_nodes` as one string is cut at the commas between URLs, not at one in a
/// node's user info; everything else is cut as it was, empty pieces included.
#[test]
fn node_urls_keep_a_comma_in_the_user_info() {
    for (text, urls) in [
        (
            "redis://a:7000,redis://b:7000",
            &["redis://a:7000", "redis://b:7000"][..],
        ),
        ("redis://a:7000,b:7000", &["redis://a:7000", "b:7000"]),
        ("a:7000,,b:7000,", &["a:7000", "", "b:7000", ""]),
        ("redis://u@a,x@b", &["redis://u@a", "x@b"]),
        (
            "redis://u:p,w@a:7000,redis://u:p,,w,@b,c",
            &["redis://u:p,w@a:7000", "redis://u:p,,w,@b", "c"],
        ),
        (
            "redis://u:p,w@a,x,redis://b",
            &["redis://u:p,w@a", "x", "redis://b"],
        ),
    ] {
        assert_eq!(node_urls(text), urls, "{text}");
    }
}

/// The admin token read from a file is `***` in the `Debug` of the raw structs that
/// hold it, as in the `Config` built from them: `TokenText` derived `Debug` over the
/// token's text.
#[test]
fn the_raw_admin_token_is_not_in_the_debug_output() {
    let admin: RawAdmin =
        serde_json::from_str(r#"{"token": "s3cr3t"}"#).unwrap_or_else(|e| panic!("{e}"));
    for shown in [format!("{admin:?}"), format!("{admin:#?}")] {
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }
}
