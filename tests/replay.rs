//! Access-log replay, multi-route runs, overload, sweeps and charts, through the
//! library: parsing (common and combined formats, IPv6 clients, escapes, gzip, bad
//! lines with their line numbers), placing requests inside their second, the
//! equivalence of a replayed log with its profile, and charts that show what they
//! claim.

use flate2::write::GzEncoder;
use flate2::Compression;
use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::controller::ControllerParams;
use rocgate::sim::access_log::{self, parse_line, LineError, LogError};
use rocgate::sim::{
    chart, sweep, ArrivalModel, LogOptions, LogReader, Profile, Request, Scenario, SimError,
    SimRun, Simulator, Spread, Sweep, SweepError, SweepParam,
};
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

/// 27/Nov/2026:20:00:00 +0100, the first second of the synthetic logs.
const SALE_UNIX_S: i64 = 1_795_806_000;

fn order_route() -> RouteConfig {
    RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"))
}

fn default_route() -> RouteConfig {
    let mut w = RouteConfig::new("default", RouteMatch::prefix("/"));
    w.controller = {
        let mut v = ControllerParams::default();
        v.base_limit_rps = 1000.0;
        v.cut_limit_rps = 300.0;
        v.danger_roc = 400.0;
        v.safe_roc = 100.0;
        v
    };
    w
}

fn config() -> Config {
    Config::new(vec![order_route(), default_route()])
}

/// `27/Nov/2026:20:MM:SS +0100` for `s` seconds after the sale's start.
fn logged_time(s: u64) -> String {
    format!("27/Nov/2026:20:{:02}:{:02} +0100", s / 60, s % 60)
}

/// A combined-format line.
fn line(client: &str, s: u64, method: &str, path: &str) -> String {
    format!(
        "{client} - - [{}] \"{method} {path} HTTP/1.1\" 200 612 \"https://shop.example/\" \"Mozilla/5.0 (X11; Linux x86_64)\"\n",
        logged_time(s)
    )
}

/// A log with `counts[s]` orders in second `s`, each followed by one static request
/// every tenth order.
fn sale_log(counts: &[u64]) -> String {
    let mut text = String::new();
    for (s, &n) in counts.iter().enumerate() {
        for i in 0..n {
            text.push_str(&line(
                &format!("203.0.113.{}", i % 200),
                s as u64,
                "POST",
                "/api/order",
            ));
            if i % 10 == 0 {
                text.push_str(&line("2001:db8::7", s as u64, "GET", "/static/app.js"));
            }
        }
    }
    text
}

fn read(
    config: &Config,
    options: LogOptions,
    text: &str,
) -> Result<rocgate::sim::AccessLog, LogError> {
    let mut reader = LogReader::new(config, options)?;
    reader.read("sale.log", text.as_bytes())?;
    reader.finish()
}

#[test]
fn combined_and_common_lines_parse() {
    let combined = br#"198.51.100.23 - alice [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif?x=1 HTTP/1.0" 200 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)""#;
    let l = parse_line(combined).unwrap();
    assert_eq!(l.client, b"198.51.100.23");
    assert_eq!(l.client_ip(), Some("198.51.100.23".parse().unwrap()));
    // 13:55:36 at -07:00 is 20:55:36 UTC.
    assert_eq!(l.time_unix_s, 971_211_336);
    assert_eq!(
        l.method_and_path().unwrap(),
        ("GET".into(), "/apache_pb.gif".into())
    );
    assert_eq!((l.status, l.bytes), (200, Some(2326)));
    assert_eq!(l.referer, Some(&b"http://www.example.com/start.html"[..]));
    assert_eq!(
        l.user_agent,
        Some(&b"Mozilla/4.08 [en] (Win98; I ;Nav)"[..])
    );

    let common =
        b"host.example.org - - [01/Jan/2024:00:00:00 +0000] \"POST /api/order HTTP/1.1\" 201 -";
    let l = parse_line(common).unwrap();
    assert_eq!(l.client_ip(), None, "a host name is no address");
    assert_eq!(l.time_unix_s, 1_704_067_200);
    assert_eq!(
        (l.status, l.bytes, l.referer, l.user_agent),
        (201, None, None, None)
    );

    // nginx formats often append fields to combined: skipped.
    let extra = b"10.0.0.1 - - [29/Feb/2024:12:00:00 +0530] \"GET / HTTP/2.0\" 304 0 \"-\" \"curl/8\" 0.004 \"10.1.1.1, 10.2.2.2\"";
    let l = parse_line(extra).unwrap();
    assert_eq!(l.time_unix_s, 1_709_188_200, "a leap day, at +05:30");
    assert_eq!(l.user_agent, Some(&b"curl/8"[..]));
}

#[test]
fn ipv6_clients_parse() {
    for client in [
        "::1",
        "2001:db8::42",
        "fe80::1ff:fe23:4567:890a",
        "::ffff:192.0.2.1",
    ] {
        let text = format!("{client} - - [27/Nov/2026:20:00:00 +0100] \"GET / HTTP/1.1\" 200 1");
        let l = parse_line(text.as_bytes()).unwrap_or_else(|e| panic!("{client}: {e}"));
        assert_eq!(l.client_ip(), Some(client.parse().unwrap()), "{client}");
        assert_eq!(l.time_unix_s, SALE_UNIX_S);
    }
}

#[test]
fn quoted_fields_keep_their_escapes() {
    // Apache escapes a quote as \" and a backslash as \\; nginx writes \x22 and \x5C.
    let apache = br#"::1 - - [27/Nov/2026:20:00:00 +0100] "GET /search?q=\"sale\"&d=a\\b HTTP/1.1" 200 5 "-" "agent \"quoted\" [x]""#;
    let l = parse_line(apache).unwrap();
    assert_eq!(l.request_text(), r#"GET /search?q="sale"&d=a\b HTTP/1.1"#);
    assert_eq!(l.user_agent, Some(&br#"agent \"quoted\" [x]"#[..]));
    let nginx = br#"::1 - - [27/Nov/2026:20:00:00 +0100] "GET /a\x22b/\xE2\x82\xAC HTTP/1.1" 200 5 "-" "ua""#;
    let l = parse_line(nginx).unwrap();
    assert_eq!(l.method_and_path().unwrap().1, "/a\"b/€");
    // A request field that is not a request is still a valid line.
    for request in [r#""-""#, r#""\x16\x03\x01\x00\xA5\x01""#, r#""GET""#] {
        let text = format!("::1 - - [27/Nov/2026:20:00:00 +0100] {request} 400 0 \"-\" \"-\"");
        let l = parse_line(text.as_bytes()).unwrap();
        assert_eq!(l.method_and_path(), None, "{request}");
    }
    // Absolute-form targets are matched on their path.
    let absolute = b"::1 - - [27/Nov/2026:20:00:00 +0100] \"POST http://shop.example:8080/api/order?a=1 HTTP/1.1\" 200 5";
    assert_eq!(
        parse_line(absolute).unwrap().method_and_path().unwrap(),
        ("POST".into(), "/api/order".into())
    );
}

#[test]
fn malformed_lines_say_what_is_wrong() {
    let cases: [(&[u8], LineError); 9] = [
        (b"", LineError::Client),
        (b"10.0.0.1", LineError::Identity),
        (b"10.0.0.1 - - \"GET / HTTP/1.1\" 200 1", LineError::NoTime),
        (
            b"10.0.0.1 - - [27/Nov/2026:20:00:00] \"GET /\" 200 1",
            LineError::BadTime,
        ),
        (
            b"10.0.0.1 - - [31/Feb/2026:20:00:00 +0000] \"GET /\" 200 1",
            LineError::BadTime,
        ),
        (
            b"10.0.0.1 - - [27/Nov/2026:20:00:00 +0000] GET / 200 1",
            LineError::NoRequest,
        ),
        (
            b"10.0.0.1 - - [27/Nov/2026:20:00:00 +0000] \"GET / HTTP/1.1 200 1",
            LineError::Unterminated,
        ),
        (
            b"10.0.0.1 - - [27/Nov/2026:20:00:00 +0000] \"GET /\" OK 1",
            LineError::Status,
        ),
        (
            b"10.0.0.1 - - [27/Nov/2026:20:00:00 +0000] \"GET /\" 200 many",
            LineError::Bytes,
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            parse_line(text),
            Err(expected),
            "{}",
            String::from_utf8_lossy(text)
        );
    }
    let truncated =
        b"10.0.0.1 - - [27/Nov/2026:20:00:00 +0000] \"GET / HTTP/1.1\" 200 1 \"https://ref";
    assert_eq!(parse_line(truncated), Err(LineError::Unterminated));
}

#[test]
fn bad_lines_are_counted_with_their_line_numbers() {
    let mut text = sale_log(&[50; 4]); // 220 lines
    let mut lines: Vec<&str> = text.lines().collect();
    lines.insert(2, "");
    lines.insert(9, "not a log line");
    lines.insert(
        30,
        "10.0.0.1 - - [27/Nov/2026:20:00:00] \"GET / HTTP/1.1\" 200 1",
    );
    text = lines.join("\r\n");
    let log = read(&config(), LogOptions::default(), &text).unwrap();
    let s = log.stats();
    assert_eq!((s.lines, s.blank, s.unparsable), (223, 1, 2));
    let first: Vec<String> = s.first_unparsable.iter().map(ToString::to_string).collect();
    assert_eq!(
        first,
        [
            "sale.log:10: no [time] after the user field",
            "sale.log:31: the time is not dd/Mon/yyyy:hh:mm:ss ±hhmm"
        ]
    );
    assert_eq!(s.replayed, 220);

    // Past 1%, an error naming the lines; --lenient replays the rest.
    let mut bad = sale_log(&[20; 2]);
    bad.push_str("garbage\n");
    bad.push_str("more garbage\n");
    let err = read(&config(), LogOptions::default(), &bad).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::TooManyUnparsable {
                unparsable: 2,
                lines: 46,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("2 of 46 lines (4.35%)"), "{msg}");
    // Just past 1% reads past it (3 of 297 read "1.0%", more than 1%).
    let mut over =
        "203.0.113.7 - - [27/Nov/2026:20:00:00 +0100] \"GET / HTTP/1.1\" 200 1\n".repeat(294);
    over.push_str("garbage\n".repeat(3).as_str());
    let past = read(&config(), LogOptions::default(), &over)
        .unwrap_err()
        .to_string();
    assert!(past.contains("3 of 297 lines (1.01%)"), "{past}");
    assert!(
        msg.contains("sale.log:45: no ident and user fields") && msg.contains("sale.log:46:"),
        "{msg}"
    );
    let lenient = {
        let mut v = LogOptions::default();
        v.lenient = true;
        v
    };
    assert_eq!(read(&config(), lenient, &bad).unwrap().stats().replayed, 44);
}

#[test]
fn gzip_logs_are_read_through_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let text = sale_log(&[30; 5]);
    let (a, b) = text.split_at(text.len() / 2 + text[text.len() / 2..].find('\n').unwrap() + 1);
    // Two gzip members in one file, as `cat a.gz b.gz` makes.
    let path = dir.path().join("access.log.2.gz");
    let mut file = std::fs::File::create(&path).unwrap();
    for part in [a, b] {
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(part.as_bytes()).unwrap();
        file.write_all(&gz.finish().unwrap()).unwrap();
    }
    drop(file);
    let plain = dir.path().join("access.log");
    std::fs::write(&plain, &text).unwrap();
    let logs: Vec<_> = [&path, &plain]
        .iter()
        .map(|p| {
            let mut reader = LogReader::new(&config(), LogOptions::default()).unwrap();
            reader.read("x", access_log::open(p).unwrap()).unwrap();
            reader.finish().unwrap()
        })
        .collect();
    assert_eq!(logs[0].stats(), logs[1].stats());
    assert_eq!(logs[0].stats().replayed, 5 * 33);
    assert!(logs[0].requests().eq(logs[1].requests()));
}

#[test]
fn requests_are_matched_as_serve_matches_them() {
    let mut text = sale_log(&[20; 3]);
    text.push_str(&line("10.0.0.9", 1, "GET", "/api/order")); // not POST: the prefix route
    text.push_str(&line("10.0.0.9", 1, "PATCH", "/api/order?x=1"));
    let log = read(&config(), LogOptions::default(), &text).unwrap();
    let routes = log.routes();
    assert_eq!(routes, [(0, 60), (1, 6 + 2)]);

    // Only `order`: the rest is on other routes, and nothing is unmatched.
    let only = {
        let mut v = LogOptions::default();
        v.routes = vec!["order".into()];
        v
    };
    let log = read(&config(), only, &text).unwrap();
    assert_eq!(
        (
            log.stats().replayed,
            log.stats().other_routes,
            log.stats().unmatched
        ),
        (60, 8, 0)
    );
    assert!(log.requests().all(|r| r.route == 0));

    // Without the prefix route, other requests match nothing, and are named.
    let narrow = Config::new(vec![order_route()]);
    let log = read(&narrow, LogOptions::default(), &text).unwrap();
    let s = log.stats();
    assert_eq!(s.unmatched, 8);
    assert_eq!(
        s.unmatched_examples,
        ["GET /static/app.js", "GET /api/order", "PATCH /api/order"]
    );

    let unknown = {
        let mut v = LogOptions::default();
        v.routes = vec!["checkout".into()];
        v
    };
    let err = LogReader::new(&config(), unknown).unwrap_err().to_string();
    assert_eq!(
        err,
        "unknown route `checkout`; routes in the configuration: order, default"
    );
}

#[test]
fn each_seconds_requests_are_spread_inside_it() {
    // Out of order, as servers write lines when requests end.
    let text = [
        line("::1", 2, "POST", "/api/order"),
        line("::1", 0, "POST", "/api/order"),
    ]
    .concat()
        + &sale_log(&[4])
        + &line("::1", 0, "GET", "/x");
    let log = read(&config(), LogOptions::default(), &text).unwrap();
    assert_eq!(log.duration(), Duration::from_secs(3));
    assert_eq!(
        log.start(),
        UNIX_EPOCH + Duration::from_secs(SALE_UNIX_S as u64)
    );
    let times: Vec<(f64, usize)> = log
        .requests()
        .map(|r| (r.at.as_secs_f64(), r.route))
        .collect();
    // Second 0: five orders at (k + ½) / 5 and two other requests at (k + ½) / 2,
    // interleaved by time; second 1 empty; second 2: one order in the middle.
    assert_eq!(
        times,
        [
            (0.1, 0),
            (0.25, 1),
            (0.3, 0),
            (0.5, 0),
            (0.7, 0),
            (0.75, 1),
            (0.9, 0),
            (2.5, 0)
        ]
    );

    // Random: reproducible from the seed, inside the second, in time order.
    let random = |seed| {
        let options = {
            let mut v = LogOptions::default();
            v.spread = Spread::Random { seed };
            v
        };
        let log = read(&config(), options, &sale_log(&[300, 300])).unwrap();
        log.requests().collect::<Vec<Request>>()
    };
    let (a, b, c) = (random(7), random(7), random(8));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
    let first_second = a.iter().filter(|r| r.at.as_secs_f64() < 1.0).count();
    assert_eq!(first_second, 330);
}

#[test]
fn from_and_to_bound_the_replay() {
    let text = sale_log(&[10; 10]);
    let at = |s: u64| UNIX_EPOCH + Duration::from_millis((SALE_UNIX_S as u64 + s) * 1000 + 500);
    let options = {
        let mut v = LogOptions::default();
        v.from = Some(at(2));
        v.to = Some(at(5));
        v
    };
    let log = read(&config(), options, &text).unwrap();
    // Exact to the logged whole seconds: from 2.5 s, the seconds from 3 s; to 5.5 s,
    // those to 5 s. (The bounds were rounded down and up: 2 s to 5 s.)
    assert_eq!(
        log.start(),
        UNIX_EPOCH + Duration::from_secs(SALE_UNIX_S as u64 + 3)
    );
    assert_eq!(log.duration(), Duration::from_secs(3));
    assert_eq!((log.stats().replayed, log.stats().outside), (33, 77));
    // A bound a millisecond short of a second keeps that second out, or in.
    let options = {
        let mut v = LogOptions::default();
        v.from = Some(UNIX_EPOCH + Duration::from_millis(SALE_UNIX_S as u64 * 1000 + 999));
        v.to = Some(UNIX_EPOCH + Duration::from_millis((SALE_UNIX_S as u64 + 2) * 1000 - 1));
        v
    };
    let log = read(&config(), options, &text).unwrap();
    assert_eq!(
        log.start(),
        UNIX_EPOCH + Duration::from_secs(SALE_UNIX_S as u64 + 1)
    );
    assert_eq!((log.stats().replayed, log.stats().outside), (11, 99));

    let empty = {
        let mut v = LogOptions::default();
        v.from = Some(at(20));
        v
    };
    let err = read(&config(), empty, &text).unwrap_err().to_string();
    assert_eq!(
        err,
        "no request to replay: 110 lines read, 110 outside the time bounds"
    );
    let reversed = {
        let mut v = LogOptions::default();
        v.from = Some(at(5));
        v.to = Some(at(2));
        v
    };
    assert!(matches!(
        LogReader::new(&config(), reversed),
        Err(LogError::EmptyBounds)
    ));
}

/// A log too long to replay is refused with where its span starts and ends: the
/// earliest and the latest request and where each was read, or the bound given. (It
/// said only the span: one line with a wrong year in a large log had to be searched
/// for.)
#[test]
fn a_log_too_long_names_its_earliest_and_latest_request() {
    let mut text = sale_log(&[2, 2, 2]);
    text.push_str(&line("203.0.113.7", 0, "POST", "/api/order").replace("2026", "2025"));
    let mut reader = LogReader::new(&config(), LogOptions::default()).unwrap();
    reader.read("a.log", text.as_bytes()).unwrap();
    reader.read("b.log", sale_log(&[1]).as_bytes()).unwrap();
    let lines = text.lines().count();
    let latest = 1 + text
        .lines()
        .position(|l| l.contains(&logged_time(2)))
        .unwrap();
    let Err(e) = reader.finish() else {
        panic!("a year of requests replayed");
    };
    assert_eq!(
        e.to_string(),
        format!(
            "the replay would span 31536003 s, more than 1000000 s: from 2025-11-27T19:00:00Z (the earliest request, a.log:{lines}) to 2026-11-27T19:00:02Z (the latest request, a.log:{latest})"
        )
    );
    // A bound given is named as such.
    let far = {
        let mut v = LogOptions::default();
        v.to = Some(UNIX_EPOCH + Duration::from_secs(SALE_UNIX_S as u64 + 2_000_000));
        v
    };
    let mut reader = LogReader::new(&config(), far).unwrap();
    reader.read("a.log", sale_log(&[2]).as_bytes()).unwrap();
    let e = reader.finish().err().unwrap().to_string();
    assert!(
        e.ends_with("from 2026-11-27T19:00:00Z (the earliest request, a.log:1) to 2026-12-20T22:33:20Z (the `to` bound)"),
        "{e}"
    );
}

/// The flash-sale scenario's per-second counts: 40 req/s, 600 from 20 s to 40 s, then
/// 40 again (the scenario's decay replaced by a step, in both).
fn sale_profile() -> Profile {
    Profile::from_points(&[
        (0.0, 40.0),
        (20.0, 40.0),
        (20.0, 600.0),
        (40.0, 600.0),
        (40.0, 40.0),
        (60.0, 40.0),
    ])
    .unwrap()
}

#[test]
fn a_replayed_flash_sale_cuts_when_its_profile_does() {
    let counts: Vec<u64> = (0..60)
        .map(|s| if (20..40).contains(&s) { 600 } else { 40 })
        .collect();
    let log = read(&config(), LogOptions::default(), &sale_log(&counts)).unwrap();
    let sim = Simulator::for_routes(config(), &["order"]).unwrap();
    let replayed = sim.replay(&log).unwrap();
    let profiled = sim
        .run_profile(&sale_profile(), ArrivalModel::Uniform)
        .unwrap();
    let r = &replayed.routes[0];
    assert_eq!(r.summary.first_cut_s, Some(20.5));
    assert_eq!(r.summary.first_cut_s, profiled.summary.first_cut_s);
    assert_eq!(r.summary.transitions, profiled.summary.transitions);
    // Evenly spread seconds are the profile's uniform arrivals: the same run, slot by slot.
    assert_eq!(r.series, profiled.series);
    assert_eq!(replayed.summary.start_unix_s, SALE_UNIX_S as f64);

    // Both routes at once: the static requests do not disturb the order route.
    let both = Simulator::for_routes(config(), &["default", "order"])
        .unwrap()
        .replay(&log)
        .unwrap();
    let names: Vec<&str> = both
        .routes
        .iter()
        .map(|r| r.summary.route.as_str())
        .collect();
    assert_eq!(names, ["order", "default"]);
    assert_eq!(both.routes[0], replayed.routes[0]);
    assert_eq!(
        both.routes[1].summary.offered,
        counts.iter().map(|n| n.div_ceil(10)).sum::<u64>()
    );
    assert_eq!(
        both.summary.offered,
        both.routes.iter().map(|r| r.summary.offered).sum::<u64>()
    );
}

#[test]
fn client_ip_routes_key_on_the_logged_client() {
    let per_ip = {
        let mut w = order_route();
        w.partition = Partition::ClientIp(KeyLimits::default());
        w.controller = {
            let mut v = ControllerParams::default();
            v.base_limit_rps = 5.0;
            v.cut_limit_rps = 2.0;
            v
        };
        w
    };
    let config = Config::new(vec![per_ip]);
    // 200 clients (203.0.113.0–199) × 1 order per second each: well within 5 req/s each.
    let log = read(&config, LogOptions::default(), &sale_log(&[200; 10])).unwrap();
    let run = Simulator::for_routes(config.clone(), &["order"])
        .unwrap()
        .replay(&log)
        .unwrap();
    assert_eq!((run.summary.offered, run.summary.rejected), (2000, 0));
    // The same requests without their clients all share one keyless limit of 5 req/s.
    let keyless: Vec<Request> = log
        .requests()
        .map(|r| Request { client: None, ..r })
        .collect();
    let run = Simulator::for_routes(config, &["order"])
        .unwrap()
        .run_requests(keyless, log.duration())
        .unwrap();
    assert!(run.summary.rejected > 1500, "{:?}", run.summary);
}

/// On a route partitioned by client IP each request keeps its client, and a second's
/// requests are placed in the log's order, with lines out of time order and a host
/// name (no address: keyless) among them; a whole route's requests interleave by time.
#[test]
fn keyed_requests_keep_their_clients_in_the_logs_order() {
    let per_ip = {
        let mut v = order_route();
        v.partition = Partition::ClientIp(KeyLimits::default());
        v
    };
    let config = Config::new(vec![per_ip, default_route()]);
    let text = [
        line("203.0.113.1", 1, "POST", "/api/order"),
        line("203.0.113.2", 1, "POST", "/api/order"),
        line("198.51.100.9", 0, "POST", "/api/order"),
        line("203.0.113.9", 1, "GET", "/"),
        line("proxy.example", 1, "POST", "/api/order"),
        line("203.0.113.1", 1, "POST", "/api/order"),
    ]
    .concat();
    let log = read(&config, LogOptions::default(), &text).unwrap();
    let client = |a: &str| Some(a.parse::<std::net::IpAddr>().unwrap());
    let got: Vec<(f64, usize, Option<std::net::IpAddr>)> = log
        .requests()
        .map(|r| (r.at.as_secs_f64(), r.route, r.client))
        .collect();
    assert_eq!(
        got,
        [
            (0.5, 0, client("198.51.100.9")),
            (1.125, 0, client("203.0.113.1")),
            (1.375, 0, client("203.0.113.2")),
            (1.5, 1, None),
            (1.625, 0, None),
            (1.875, 0, client("203.0.113.1")),
        ]
    );
    assert_eq!(log.requests().len(), 6);
    assert_eq!(log.routes(), [(0, 5), (1, 1)]);
}

#[test]
fn overload_counts_admitted_requests_above_capacity() {
    // 300 req/s under a 1000 req/s limit: nothing rejected, 50 over a capacity of 250
    // in each of the 10 seconds.
    let profile = Profile::from_points(&[(0.0, 300.0), (10.0, 300.0)]).unwrap();
    let sim = Simulator::new(Config::new(vec![default_route()]), None).unwrap();
    let run = sim
        .clone()
        .capacity(250)
        .run_profile_all(&profile, ArrivalModel::Uniform)
        .unwrap();
    let s = &run.summary;
    assert_eq!(
        (s.capacity_rps, s.rejected, s.overload, s.overload_s),
        (Some(250), 0, 500, 10)
    );
    assert_eq!(run.routes[0].summary.overload, 500);
    let per_slot: u64 = run.routes[0].series.iter().map(|r| r.overload).sum();
    assert_eq!(per_slot, 500);
    // Each second's last sixth is overload: 250 of 300 arrive by 0.833 s.
    let second: Vec<u64> = run.routes[0].series[..10]
        .iter()
        .map(|r| r.overload)
        .collect();
    assert_eq!(second, [0, 0, 0, 0, 0, 0, 0, 0, 20, 30]);
    assert_eq!(s.peak_admitted_1s, 300);
    // Without a capacity nothing is overload.
    let run = sim
        .run_profile_all(&profile, ArrivalModel::Uniform)
        .unwrap();
    assert_eq!((run.summary.capacity_rps, run.summary.overload), (None, 0));
}

fn try_flash_sale(sim: &Simulator) -> Result<SimRun, SimError> {
    sim.run_profile_all(&Scenario::FlashSale.profile(), ArrivalModel::Uniform)
}

fn flash_sale_run(sim: &Simulator) -> SimRun {
    try_flash_sale(sim).unwrap()
}

/// The simulator of the route `order` at 250 req/s of capacity, and the sweep of
/// `params` (`--sweep` arguments) over it.
fn sweep_of(params: &[&str]) -> (Simulator, Sweep) {
    let sim = Simulator::new(config(), Some("order"))
        .unwrap()
        .capacity(250);
    let params: Vec<SweepParam> = params.iter().map(|p| p.parse().unwrap()).collect();
    (sim, Sweep::new(params).unwrap())
}

#[test]
fn sweeps_run_the_grid_in_order_on_any_number_of_threads() {
    let (sim, sweep) = sweep_of(&["danger_roc=60..120:30", "order.hold=1,3"]);
    assert_eq!(sweep.runs(), 6);
    let one = sweep.run(&sim, 1, try_flash_sale).unwrap();
    let two = sweep.run(&sim, 2, try_flash_sale).unwrap();
    assert_eq!(one, two);
    let points: Vec<Vec<f64>> = one.iter().map(|r| r.values.clone()).collect();
    assert_eq!(
        points,
        [
            [60.0, 1.0],
            [60.0, 3.0],
            [90.0, 1.0],
            [90.0, 3.0],
            [120.0, 1.0],
            [120.0, 3.0]
        ]
    );
    // Each row is the run of its values.
    let changed = Config::new(vec![
        {
            let mut w = order_route();
            w.controller = {
                let mut v = ControllerParams::default();
                v.danger_roc = 90.0;
                v.hold = Duration::from_secs(3);
                v
            };
            w
        },
        default_route(),
    ]);
    // (A sweep counts no rejections without cuts.)
    let direct = flash_sale_run(
        &Simulator::new(changed, Some("order"))
            .unwrap()
            .capacity(250)
            .count_without_cuts(false),
    );
    assert_eq!(one[3].summary, direct.summary);
    // A later cut lets more through: the trade a sweep is for.
    assert!(one[0].summary.first_cut_s < one[4].summary.first_cut_s);
    assert!(one[0].summary.overload < one[4].summary.overload);
    assert!(one[0].rejected_pct() > one[4].rejected_pct());

    let mut csv = Vec::new();
    sweep::write_csv(&sweep, &one, &mut csv).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("danger_roc,order.hold,offered,admitted,rejected,rejected_pct,shadow_rejected,cut_count,first_cut_s,time_in_cut_s,peak_admitted_1s,overload,overload_pct,overload_s")
    );
    assert!(lines.next().unwrap().starts_with("60,1,16400,"));
    assert_eq!(lines.count(), 5);
}

#[test]
fn bad_sweeps_are_clear_errors() {
    let err = |spec: &str| spec.parse::<SweepParam>().unwrap_err().to_string();
    assert_eq!(
        err("danger_roc"),
        "`danger_roc`: no `=`; expected NAME=START..END:STEP or NAME=V1,V2,…"
    );
    assert!(err("danger_roc=40..160").contains("a range needs a step, `:STEP`"));
    assert!(err("danger_roc=40..160:0").contains("the step must be above 0, got 0"));
    assert!(err("danger_roc=40..x:20").contains("end `x` is not a number"));
    assert!(err("danger_roc=40,,60").contains("value `` is not a number"));
    assert!(err("min_samples=1.5").contains("min_samples must be a whole number ≥ 0, got 1.5"));
    assert!(err("hold=-1").contains("hold must be a number of seconds ≥ 0"));
    let unknown = err("danger=1,2");
    assert!(unknown.starts_with("`danger=1,2`: unknown parameter `danger`; parameters: base_limit, cut_limit, danger_roc"), "{unknown}");
    assert_eq!(
        err("danger_roc=0..1000:1"),
        "danger_roc (1001) = 1001 runs, more than 400"
    );

    let parse = |specs: &[&str]| -> Result<Sweep, SweepError> {
        Sweep::new(specs.iter().map(|s| s.parse().unwrap()).collect())
    };
    assert_eq!(
        parse(&["danger_roc=1..30:1", "safe_roc=1..20:1"])
            .unwrap_err()
            .to_string(),
        "danger_roc (30) × safe_roc (20) = 600 runs, more than 400"
    );
    assert!(
        parse(&["danger_roc=1..20:1", "safe_roc=1..20:1"]).is_ok(),
        "400 runs are allowed"
    );
    assert_eq!(
        parse(&["hold=1,2", "order.hold=3"])
            .unwrap_err()
            .to_string(),
        "`hold` is swept twice (as `hold` and `order.hold`)"
    );

    let sim = Simulator::new(config(), Some("order")).unwrap();
    let sweep = parse(&["danger_roc=10,80"]).unwrap();
    let e = sweep.run(&sim, 2, try_flash_sale).unwrap_err().to_string();
    assert_eq!(
        e,
        "at danger_roc=10: route `order`: danger_roc: must be > safe_roc (20), got 10"
    );
    let e = parse(&["default.hold=1"])
        .unwrap()
        .simulators(&sim)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "`default.hold`: route `default` is not one of the routes run: order"
    );
    let e = parse(&["queue=1,2"])
        .unwrap()
        .simulators(&sim)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "at queue=1: route `order`: queue applies to leaky_bucket and concurrency, not token_bucket");
    let e = parse(&["slot=0.7"])
        .unwrap()
        .simulators(&sim)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("at slot=0.7: route `order`: slot:"), "{e}");
}

/// The SVG polylines drawn in `color`, as lists of (x, y).
fn polylines(svg: &str, color: &str) -> Vec<Vec<(f64, f64)>> {
    svg.lines()
        .filter(|l| l.starts_with("<polyline") && l.contains(&format!("stroke=\"{color}\"")))
        .map(|l| {
            let points = l
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            points
                .split_whitespace()
                .map(|p| {
                    let (x, y) = p.split_once(',').unwrap();
                    (x.parse().unwrap(), y.parse().unwrap())
                })
                .collect()
        })
        .collect()
}

/// The height of the one horizontal line (of dashes) that spans the plot's width, and
/// its ends; the legend's short sample of the same colour is left out.
fn level(lines: &[Vec<(f64, f64)>]) -> (f64, f64, f64) {
    let mut spans: Vec<(f64, f64, f64)> = Vec::new();
    for line in lines {
        let y = line[0].1;
        assert!(line.iter().all(|p| p.1 == y), "not horizontal: {line:?}");
        let (lo, hi) = line.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
        match spans.iter_mut().find(|s| s.0 == y) {
            Some(s) => (s.1, s.2) = (s.1.min(lo), s.2.max(hi)),
            None => spans.push((y, lo, hi)),
        }
    }
    let wide: Vec<_> = spans.into_iter().filter(|s| s.2 - s.1 > 1000.0).collect();
    assert_eq!(wide.len(), 1, "one line across the plot: {wide:?}");
    wide[0]
}

#[test]
fn the_svg_draws_the_thresholds_where_they_are() {
    let (d, s) = (chart::DANGER, chart::SAFE);
    let danger = format!("#{:02X}{:02X}{:02X}", d.0, d.1, d.2);
    let safe = format!("#{:02X}{:02X}{:02X}", s.0, s.1, s.2);
    assert_eq!((danger.as_str(), safe.as_str()), ("#D62728", "#2CA02C"));
    let svg_for = |danger_roc: f64| {
        let route = {
            let mut w = order_route();
            w.controller = {
                let mut v = ControllerParams::default();
                v.danger_roc = danger_roc;
                v
            };
            w
        };
        let run = flash_sale_run(&Simulator::new(Config::new(vec![route]), None).unwrap());
        chart::svg(&run).unwrap()
    };
    let svg = svg_for(80.0);
    assert!(svg.contains("danger_roc 80") && svg.contains("safe_roc 20"));
    let (danger_y, ..) = level(&polylines(&svg, &danger));
    let (safe_y, ..) = level(&polylines(&svg, &safe));
    // Danger above safe (SVG y grows downwards), both in the ROC plot (the lower part
    // of the chart).
    assert!(
        danger_y < safe_y && safe_y > 280.0,
        "danger at y {danger_y}, safe at y {safe_y}"
    );
    // A higher threshold is drawn higher.
    let (higher_y, ..) = level(&polylines(&svg_for(140.0), &danger));
    assert!(
        higher_y < danger_y,
        "danger_roc 140 at y {higher_y}, 80 at {danger_y}"
    );
    // Cut periods are shaded.
    assert!(svg.contains("fill=\"#D62728\""), "no cut shading");
}

#[test]
fn the_png_is_an_image_of_the_expected_size() {
    let log = read(&config(), LogOptions::default(), &sale_log(&[40; 30])).unwrap();
    let sim = Simulator::for_routes(config(), &["order", "default"]).unwrap();
    let run = sim.replay(&log).unwrap();
    let png = chart::png(&run).unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(&png));
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), chart::size(2));
    assert_eq!(chart::size(2), (1200, 1120));
    assert_eq!(frame.color_type, png::ColorType::Rgb);
    // Not blank: mostly white, with some of the danger line's red in it.
    let pixels = &pixels[..frame.buffer_size()];
    let white = pixels.chunks(3).filter(|p| p == &[255, 255, 255]).count();
    let total = pixels.len() / 3;
    assert!(
        white > total / 2 && white < total * 99 / 100,
        "{white} of {total} white"
    );
    let d = chart::DANGER;
    assert!(
        pixels.chunks(3).any(|p| p == [d.0, d.1, d.2]),
        "no danger line"
    );
    // The same run draws the same bytes.
    assert_eq!(chart::png(&run).unwrap(), png);
    assert_eq!(chart::svg(&run).unwrap(), chart::svg(&run).unwrap());
}

/// A line longer than `MAX_LINE_BYTES` (a file with no line breaks, say) ends the
/// read, lenient or not, naming its line: it was counted as unparsable and skipped to
/// its end, and a line that never ends was read forever. A line at the cap is read
/// (and is no access-log line either).
#[test]
fn an_overlong_line_ends_the_read_naming_it() {
    use rocgate::sim::access_log::MAX_LINE_BYTES;
    let mut text = sale_log(&[20; 3]);
    let first = text.lines().next().unwrap().to_owned();
    text.push_str(&format!("{}\n", "y".repeat(MAX_LINE_BYTES)));
    text.push_str(&first);
    text.push('\n');
    let lenient = {
        let mut v = LogOptions::default();
        v.lenient = true;
        v
    };
    let log = read(&config(), lenient.clone(), &text).unwrap();
    assert_eq!(log.stats().unparsable, 1);
    let lines = text.lines().count() as u64;
    text.push_str(&format!("{}\n", "x".repeat(3 * MAX_LINE_BYTES)));
    text.push_str(&first);
    text.push('\n');
    for options in [LogOptions::default(), lenient] {
        let e = read(&config(), options, &text).map(|_| ()).unwrap_err();
        assert!(
            matches!(&e, LogError::LineTooLong { name, line } if name == "sale.log" && *line == lines + 1),
            "{e}"
        );
    }
}

/// A chart error keeps its cause as its `source()` (it kept only its text), with the
/// messages it had.
#[test]
fn a_chart_error_keeps_its_cause() {
    use std::error::Error as _;
    let font = chart::ChartError::Font(ab_glyph::InvalidFont);
    assert_eq!(font.to_string(), "the bundled chart font cannot be loaded");
    assert!(font
        .source()
        .is_some_and(|s| s.is::<ab_glyph::InvalidFont>()));
    let io = std::io::Error::other("disk full");
    let png = chart::ChartError::Png(png::EncodingError::IoError(io));
    assert_eq!(png.to_string(), "cannot encode the chart as PNG: disk full");
    assert!(png.source().is_some_and(|s| s.is::<png::EncodingError>()));
    let draw = chart::ChartError::Draw("no room".into());
    assert_eq!(draw.to_string(), "cannot draw the chart: no room");
    assert_eq!(
        draw.source().map(ToString::to_string).as_deref(),
        Some("no room")
    );
}

/// A shadow route rejects nothing: its chart's title says what it would have rejected,
/// as its summary does. (It said "0.0% rejected" and nothing else.)
#[test]
fn a_shadow_routes_chart_says_what_it_would_have_rejected() {
    let mut route = order_route();
    route.mode = rocgate::config::Mode::Shadow;
    let run = flash_sale_run(&Simulator::new(Config::new(vec![route]), None).unwrap());
    let s = &run.routes[0].summary;
    assert_eq!(s.rejected, 0);
    assert!(s.shadow_rejected > 0);
    let would = format!(
        "0.0% rejected ({:.1}% would have been)",
        100.0 * s.shadow_rejected as f64 / s.offered as f64
    );
    let svg = chart::svg(&run).unwrap();
    assert!(svg.contains(&would), "{would:?} not in the chart's title");
}

/// A shadow_adaptive route rejects at its base limit; the cut's share is counted apart
/// and its chart's title says it is more, not the total.
#[test]
fn a_shadow_adaptive_routes_chart_says_the_cut_would_have_rejected_more() {
    let mut route = order_route();
    route.mode = rocgate::config::Mode::ShadowAdaptive;
    let run = flash_sale_run(&Simulator::new(Config::new(vec![route]), None).unwrap());
    let s = &run.routes[0].summary;
    assert!(s.rejected > 0);
    assert!(s.shadow_rejected > 0);
    let pct = |n: u64| 100.0 * n as f64 / s.offered as f64;
    let title = format!(
        "{:.1}% rejected (the cut would have rejected {:.1}% more)",
        pct(s.rejected),
        pct(s.shadow_rejected)
    );
    let svg = chart::svg(&run).unwrap();
    assert!(svg.contains(&title), "{title:?} not in the chart's title");
    assert!(!svg.contains("would have been"));
}

/// A swept value in `sweep.csv` is the text the table and a refusal print, with an
/// exponent past 10^15 or below 10^-4, and reads back as the very value run: `1e308`
/// was written as a 1 and 308 zeros, `1e-300` as 300 zeros and a 1, a cell of 302
/// characters beside the table's `1e-300`.
#[test]
fn a_swept_value_in_the_csv_is_written_as_the_table_writes_it() {
    let (sim, sweep) = sweep_of(&["danger_roc=80,1e308", "order.hold=1e-300"]);
    let rows = sweep.run(&sim, 1, try_flash_sale).unwrap();
    let mut csv = Vec::new();
    sweep::write_csv(&sweep, &rows, &mut csv).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    let lines: Vec<&str> = csv.lines().skip(1).collect();
    assert_eq!(lines.len(), 2, "{csv}");
    for (line, values, shown) in [
        (lines[0], [80.0, 1e-300], ["80", "1e-300"]),
        (lines[1], [1e308, 1e-300], ["1e308", "1e-300"]),
    ] {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells[..2], shown, "{line}");
        for (cell, value) in cells.iter().zip(values) {
            assert_eq!(cell.parse::<f64>(), Ok(value), "{line}");
        }
    }
}
