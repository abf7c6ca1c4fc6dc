//! `Engine::route_for` (and `route_for_written`) finds the route that trying every
//! route's matcher in config order finds (first match wins), on random route tables of exact paths, prefixes and
//! templates, method-restricted or not, for paths drawn from the table and perturbed;
//! and a route that validation refuses as never matching never is the first to match.

mod common;

use proptest::prelude::*;
use rocgate::clock::Nanos;
use rocgate::config::{matching_path, Config, PathPattern, RouteConfig, RouteMatch, Segment};
use rocgate::engine::{Engine, SCAN_ROUTES};
use std::time::SystemTime;

/// The route a linear scan finds: every matcher in config order, first match wins,
/// on the normalized path or on `path` as written (a target that is no path read as
/// `/`).
fn linear(routes: &[RouteConfig], method: &str, path: &str, normalized: bool) -> Option<usize> {
    let path = match normalized {
        true => matching_path(path),
        false if !path.starts_with('/') => std::borrow::Cow::Borrowed("/"),
        false => std::borrow::Cow::Borrowed(path),
    };
    routes.iter().position(|r| r.matcher.matches(method, &path))
}

/// Segments of paths, few enough that routes share them: one a prefix of another
/// (`a`, `ab`), two longer than 8 bytes that differ only after them.
fn segment() -> impl Strategy<Value = String> + Clone {
    prop::sample::select(vec![
        "a",
        "ab",
        "b",
        "api",
        "v1",
        "x.y",
        "7",
        "products-a",
        "products-b",
    ])
    .prop_map(str::to_owned)
}

/// A route's method: any, or one of a few (`GET` also takes `HEAD`).
fn method() -> impl Strategy<Value = Option<&'static str>> {
    prop::sample::select(vec![None, Some("GET"), Some("HEAD"), Some("POST")])
}

/// A route's path pattern: exact, a prefix (ending in a slash, mid-segment, or the
/// root), or a template with one or more parameters, ending in a slash or a
/// catch-all (`{*rest}`) or neither.
fn pattern() -> impl Strategy<Value = PathPattern> {
    let segments = || prop::collection::vec(segment(), 0..4);
    prop_oneof![
        (segments(), any::<bool>()).prop_map(|(s, slash)| {
            let mut p = format!("/{}", s.join("/"));
            if slash && !s.is_empty() {
                p.push('/');
            }
            PathPattern::Exact(p)
        }),
        (segments(), 0..3usize).prop_map(|(s, cut)| {
            let mut p = format!("/{}", s.join("/"));
            if !s.is_empty() {
                match cut {
                    0 => p.push('/'),
                    1 => {
                        p.pop();
                    }
                    _ => {}
                }
            }
            PathPattern::Prefix(p)
        }),
        (
            prop::collection::vec((segment(), any::<bool>()), 1..5),
            0..3u8
        )
            .prop_map(|(s, end)| {
                let mut p = String::new();
                for (i, (seg, param)) in s.iter().enumerate() {
                    p.push('/');
                    match (*param, end) {
                        (_, 2) if i + 1 == s.len() => p.push_str("{*rest}"),
                        (true, _) => p.push_str(&format!("{{p{i}}}")),
                        (false, _) => p.push_str(seg),
                    }
                }
                if end == 1 {
                    p.push('/');
                }
                PathPattern::parse_path(&p).expect("a valid template")
            }),
    ]
}

/// A route table: the routes drawn that an engine takes (none shadowed by an earlier
/// one, as the engine refuses such a table), in the order drawn.
fn table() -> impl Strategy<Value = Vec<RouteConfig>> {
    drawn().prop_map(|(routes, _)| routes)
}

/// Routes drawn: those an engine takes, in the order drawn, and every one drawn, each
/// with whether it was refused (shadowed by an earlier one that was taken).
fn drawn() -> impl Strategy<Value = (Vec<RouteConfig>, Vec<(RouteConfig, bool)>)> {
    prop::collection::vec((method(), pattern()), 1..40).prop_map(|drawn| {
        let mut routes: Vec<RouteConfig> = Vec::new();
        let mut all = Vec::new();
        for (i, (method, path)) in drawn.into_iter().enumerate() {
            let route = RouteConfig::new(format!("r{i}"), RouteMatch::new(method, path));
            routes.push(route.clone());
            let refused = Config::new(routes.clone()).validate().is_err();
            if refused {
                routes.pop();
            }
            all.push((route, refused));
        }
        (routes, all)
    })
}

/// A path a route of the table would take (a template's parameters filled in, a
/// catch-all with one segment or two), or a random one, then perturbed: a trailing
/// slash added or taken away, a byte cut off, a segment added, spelled otherwise
/// (`//`, a `.` segment, a percent-encoded letter, a last segment of `..` or holding a
/// backslash, an empty last segment).
fn path(routes: &[RouteConfig], pick: usize, filler: &str, change: u8, extra: &str) -> String {
    let base = match &routes[pick % routes.len()].matcher.path {
        PathPattern::Exact(p) | PathPattern::Prefix(p) => p.clone(),
        PathPattern::Template(segments) => segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => format!("/{l}"),
                Segment::CatchAll(_) if change % 2 == 1 => format!("/{filler}/{extra}"),
                _ => format!("/{filler}"),
            })
            .collect(),
        _ => "/".to_owned(),
    };
    match change {
        0 | 1 => base,
        2 => format!("{base}/"),
        3 => base.strip_suffix('/').unwrap_or(&base).to_owned(),
        4 => {
            let mut p = base;
            p.pop();
            if p.is_empty() {
                p.push('/');
            }
            p
        }
        5 => format!("{}/{extra}", base.trim_end_matches('/')),
        6 => format!("{base}{extra}"),
        7 => format!("/{base}"),
        8 => format!("/.{base}"),
        9 => base.replacen('a', "%61", 1),
        10 => format!("{base}/../{extra}"),
        // A parameter of `..`, or holding a backslash: a template takes it as
        // written (route_for_written), normalized it is another path (route_for).
        11 => match base.trim_end_matches('/').rsplit_once('/') {
            Some((head, _)) => format!("{head}/.."),
            None => base,
        },
        12 => match base.trim_end_matches('/').rsplit_once('/') {
            Some((head, last)) => format!("{head}/{last}\\{extra}"),
            None => base,
        },
        // Segments' parameters, which `serve` matches without (`route_for`): on a
        // segment, and behind `..` (`/x/..;/api`, the dot segment Tomcat resolves).
        13 => format!("{};{extra}", base.trim_end_matches('/')),
        14 => format!("/{extra}/..;{base}"),
        // An empty last segment: no rest for a catch-all normalized, a rest of `/`
        // as written (matchit's `/files/{*rest}` takes `/files//` so).
        15 => format!("{}//", base.trim_end_matches('/')),
        _ => format!("/{extra}"),
    }
}

proptest! {
    #![proptest_config(common::cases(512))]

    #[test]
    fn the_engine_finds_the_route_a_scan_in_config_order_finds(
        routes in table(),
        requests in prop::collection::vec(
            (
                any::<usize>(),
                segment(),
                0u8..17,
                segment(),
                prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "get", "head", "Post"]),
            ),
            1..24,
        ),
    ) {
        // The table as drawn (up to `SCAN_ROUTES` routes the engine tries each in
        // turn), and behind routes no request takes, enough for the engine's index
        // to find its route whatever the table's size.
        let mut padded: Vec<RouteConfig> = (0..=SCAN_ROUTES)
            .map(|i| RouteConfig::new(format!("pad{i}"), RouteMatch::new(None, PathPattern::Exact(format!("/zz{i}")))))
            .collect();
        padded.extend(routes.iter().cloned());
        for table in [&routes, &padded] {
            let engine = Engine::new(&Config::new(table.clone()), Nanos::ZERO, SystemTime::UNIX_EPOCH)
                .expect("the table validates");
            for &(pick, ref filler, change, ref extra, method) in &requests {
                let path = path(&routes, pick, filler, change, extra);
                prop_assert_eq!(
                    engine.route_for(method, &path).map(|r| r.index()),
                    linear(table, method, &path, true),
                    "{} {} in {:?}", method, path,
                    table.iter().map(|r| (&r.matcher.method, &r.matcher.path)).collect::<Vec<_>>()
                );
                prop_assert_eq!(
                    engine.route_for_written(method, &path).map(|r| r.index()),
                    linear(table, method, &path, false),
                    "as written: {} {} in {:?}", method, path,
                    table.iter().map(|r| (&r.matcher.method, &r.matcher.path)).collect::<Vec<_>>()
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(common::cases(512))]

    /// A route refused as one that `never matches` (an earlier route covers it:
    /// templates, catch-alls, prefixes, exact paths) never is the first to match a
    /// request's normalized path in the table that holds it: the check refuses no route
    /// that would have taken a request. (As written, a path may start with `//`, which
    /// a template reads past and a prefix does not: `//a/b` is taken by `/a/{id}`, not
    /// by an earlier `path_prefix = "/a/"`.)
    #[test]
    fn a_route_refused_as_never_matching_never_matches_first(
        (_, all) in drawn(),
        requests in prop::collection::vec(
            (any::<usize>(), segment(), 0u8..17, segment(), prop::sample::select(vec!["GET", "HEAD", "POST"])),
            1..24,
        ),
    ) {
        let routes: Vec<RouteConfig> = all.iter().map(|(r, _)| r.clone()).collect();
        for &(pick, ref filler, change, ref extra, method) in &requests {
            let path = path(&routes, pick, filler, change, extra);
            if let Some(first) = linear(&routes, method, &path, true) {
                prop_assert!(
                    !all[first].1,
                    "{} {} is taken by the refused {:?} in {:?}",
                    method, path, routes[first].matcher,
                    routes.iter().map(|r| (&r.matcher.method, &r.matcher.path)).collect::<Vec<_>>()
                );
            }
        }
    }
}

/// A request is looked up without a call per segment: in a table of more routes than
/// the engine scans, templates 30,000 segments deep (of literals, of parameters, and
/// of literals under a catch-all) are found, or not, on a
/// thread of 256 KiB of stack, where the lookup that recursed once a segment
/// overflowed a 2 MiB one at 8,000 and aborted the process (a `serve` of such a file
/// aborted on its first long request).
#[test]
fn a_request_as_deep_as_its_route_is_looked_up_without_overflowing_the_stack() {
    const DEEP: usize = 30_000;
    let template = |s: &str| PathPattern::parse_path(s).unwrap();
    let literals = "/a".repeat(DEEP);
    let params: String = (0..DEEP).map(|i| format!("/{{p{i}}}")).collect();
    let mut table = vec![
        RouteConfig::new(
            "literal",
            RouteMatch::new(None, template(&format!("{literals}/{{id}}"))),
        ),
        RouteConfig::new(
            "param",
            RouteMatch::new(None, template(&format!("{params}/b"))),
        ),
        RouteConfig::new(
            "rest",
            RouteMatch::new(None, template(&format!("{literals}/c/{{*rest}}"))),
        ),
    ];
    table.extend((0..SCAN_ROUTES).map(|i| {
        RouteConfig::new(
            format!("r{i}"),
            RouteMatch::new(None, PathPattern::Exact(format!("/r{i}"))),
        )
    }));
    let engine = Engine::new(&Config::new(table), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let found = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            ["/7", "/b", "/c/x/y", "/c", "/b/extra"].map(|tail| {
                engine
                    .route_for("GET", &format!("{literals}{tail}"))
                    .and_then(|id| engine.route_name(id).map(str::to_owned))
            })
        })
        .unwrap()
        .join()
        .unwrap();
    assert_eq!(
        found,
        [
            Some("literal".to_owned()),
            Some("literal".to_owned()),
            Some("rest".to_owned()),
            Some("literal".to_owned()),
            None,
        ]
    );
}
