//! Property tests of the parsers of outside input: whatever they are given, they
//! return a value or an error naming where the input is wrong, and never panic
//! (proptest; failures are kept in `tests/parser_properties.proptest-regressions`).

mod common;

use common::cases;
use proptest::prelude::*;
use rocgate::config::{matching_path, normalize_path, Config};
use rocgate::sim::access_log::{parse_line, LogError, MAX_LINE_BYTES};
use rocgate::sim::{LogOptions, LogReader};
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
        // Letters in either case (the same field as another variable sets, often).
        (prop::sample::select(&FIELDS[..]), any::<u64>()).prop_map(|(f, lower)| {
            format!("ROCGATE__{f}")
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if lower >> (i % 64) & 1 == 1 {
                        c.to_ascii_lowercase()
                    } else {
                        c
                    }
                })
                .collect()
        }),
        // Separators out of place: trailing, tripled, or nothing after the prefix.
        prop::sample::select(&FIELDS[..]).prop_map(|f| format!("ROCGATE__{f}__")),
        prop::sample::select(&FIELDS[..]).prop_map(|f| format!("ROCGATE___{f}")),
        prop::sample::select(&FIELDS[..])
            .prop_map(|f| format!("ROCGATE__{}", f.replacen("__", "___", 1))),
        Just("ROCGATE__".to_owned()),
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
        Just(" 5 ".to_owned()),
        Just("5s ".to_owned()),
        Just("1_000".to_owned()),
        Just("0x10".to_owned()),
        Just("true".to_owned()),
        Just("\u{ff15}".to_owned()),
        Just("9".repeat(400)),
        "-?[0-9]{0,25}(\\.[0-9]{0,5})?(e-?[0-9]{1,3})?[a-z]{0,2}",
        "\\PC{0,12}",
    ]
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

    /// Any log: every line counted once, as what it is, and the unparsable ones
    /// (those [`parse_line`] refuses) named by their line number; or, where a line is
    /// longer than a line may be, an error naming the first such line.
    #[test]
    fn a_log_reader_names_each_unparsable_line(
        lines in prop::collection::vec(log_line(), 0..12),
        crlf in any::<bool>(),
        trailing_newline in any::<bool>(),
    ) {
        let newline: &[u8] = if crlf { b"\r\n" } else { b"\n" };
        let mut text = lines.join(newline);
        if trailing_newline {
            text.extend_from_slice(newline);
        }
        let config = Config::from_toml_str(
            "[[routes]]\nname = \"order\"\npath = \"/api/order\"\n",
            "t.toml",
        )
        .expect("a valid config");
        let mut reader = LogReader::new(&config, LogOptions::default()).expect("a reader");
        let result = reader.read("t.log", &text[..]);
        // The lines as the reader sees them: nothing after the last line break is none.
        let mut read: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
        if read.last().is_some_and(|l| l.is_empty()) {
            read.pop();
        }
        // Too long: more bytes than the cap before the line break (\n or \r\n).
        let too_long = read
            .iter()
            .position(|l| l.strip_suffix(b"\r").unwrap_or(l).len() > MAX_LINE_BYTES);
        if let Some(at) = too_long {
            let named = matches!(
                &result,
                Err(LogError::LineTooLong { name, line }) if name == "t.log" && *line == at as u64 + 1
            );
            prop_assert!(named, "line {}: {:?}", at + 1, result.map(|_| ()));
            return Ok(());
        }
        result.expect("reading from memory");
        let stats = reader.stats().clone();
        let counted = read.len();
        prop_assert_eq!(stats.lines, counted as u64);
        let content = |l: &[u8]| -> Vec<u8> {
            let mut l = l.to_vec();
            while l.last().is_some_and(|b| *b == b'\r') {
                l.pop();
            }
            l
        };
        let refused = |l: &[u8]| {
            let l = content(l);
            !l.iter().all(u8::is_ascii_whitespace)
                && parse_line(&l).is_err()
        };
        let unparsable = read.iter().filter(|l| refused(l)).count();
        prop_assert_eq!(stats.unparsable, unparsable as u64);
        for bad in &stats.first_unparsable {
            let line = usize::try_from(bad.line).unwrap_or(usize::MAX);
            prop_assert!((1..=counted).contains(&line), "{bad}");
            let l = content(read[line - 1]);
            prop_assert_eq!(parse_line(&l).err(), Some(bad.error), "{}", bad);
        }
        prop_assert_eq!(
            stats.blank + stats.unparsable + stats.outside + stats.unmatched
                + stats.other_routes + stats.replayed,
            stats.lines
        );
    }

    /// Any text: a profile, or an error whose line is one of the text's lines.
    #[test]
    fn a_profile_error_names_a_line_of_the_text(
        lines in prop::collection::vec(
            prop_oneof![
                "-?[0-9]{1,4}(\\.[0-9]{1,3})?,-?[0-9]{1,4}(\\.[0-9]{1,3})?",
                "[0-9e.+-]{0,8},[0-9e.+-]{0,8}(,[0-9]{0,3})?",
                "(-?1e30[89]|NaN|inf|-inf|0|-0|1e-320),(-?1e30[89]|NaN|inf|-inf|0|-0|1e-320)",
                "\\PC{0,12}",
                Just("t_seconds,rate".to_owned()),
                Just("# comment".to_owned()),
                Just("0,10 # a point".to_owned()),
                Just(" 5 , 7 ".to_owned()),
                Just(String::new()),
            ],
            0..12,
        ),
        newline in prop_oneof![Just("\n"), Just("\r\n"), Just("\r")],
        trailing_newline in any::<bool>(),
    ) {
        let mut text = lines.join(newline);
        if trailing_newline {
            text.push_str(newline);
        }
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
        // A key or table twice, a value TOML or the config cannot hold, CRLF lines.
        "\\[\\[routes\\]\\]\r?\nname = \"a\"\r?\n(name|path) = \"/b\"\r?\n(\\[defaults\\]\r?\n){1,2}(base_limit = (1e309|-0|nan|-inf|9223372036854775808|1_000|0x10)\r?\n){1,2}",
        "(\\[\\[routes\\]\\]\nname = \"[a-z]{1,3}\"\npath = \"/[a-z{}/]{0,6}\"\n[a-z_]{1,12} = (-?[0-9]{1,20}|\"[0-9a-z.]{0,6}\"|nan|inf|true|\\[\\])\n){1,3}",
    ]) {
        if let Err(e) = Config::from_toml_str(&text, "t.toml") {
            prop_assert!(!e.problems().is_empty());
            // A syntax error is at a line and column of the text.
            for problem in e.problems() {
                if let Some(at) = problem.location().strip_prefix("line ") {
                    let (line, column) = at.split_once(", column ").unwrap_or((at, ""));
                    let (line, column): (usize, usize) =
                        (line.parse().unwrap_or(0), column.parse().unwrap_or(0));
                    let line_text = text.split('\n').nth(line.wrapping_sub(1));
                    prop_assert!(
                        line_text.is_some_and(|l| column >= 1 && column <= l.chars().count() + 1),
                        "{problem} for {text:?}"
                    );
                }
            }
        }
    }
}

/// One line of an access log, without its line break: a good one (often at the time
/// of the line before), one with a field disturbed, blank, any bytes, or about as long
/// as a line may be.
fn log_line() -> impl Strategy<Value = Vec<u8>> {
    let good = (
        prop_oneof![Just("203.0.113.7"), Just("::1"), Just("-")],
        prop_oneof![
            3 => Just("10/Oct/2000:13:55:36 -0700"),
            1 => Just("10/Oct/2000:13:55:37 +0000"),
            1 => Just("31/Feb/2000:25:61:61 +9999"),
            1 => Just("10/Oct/2000:13:55:36"),
        ],
        prop_oneof![
            Just("GET /api/order HTTP/1.1"),
            Just("POST /x?y=\\\"z\\\" HTTP/1.0"),
            Just("-")
        ],
        prop_oneof![
            Just(" 200 12"),
            Just(" 200 -"),
            Just(" 200"),
            Just(""),
            Just(" 200 12 \"-\" \"ua\"")
        ],
    )
        .prop_map(|(client, time, request, tail)| {
            format!("{client} - - [{time}] \"{request}\"{tail}").into_bytes()
        });
    prop_oneof![
        6 => good,
        1 => Just(Vec::new()),
        1 => Just(b" \t ".to_vec()),
        2 => prop::collection::vec(any::<u8>().prop_filter("a line break", |b| *b != b'\n'), 0..80),
        1 => (MAX_LINE_BYTES - 1..=MAX_LINE_BYTES + 1).prop_map(|n| vec![b'x'; n]),
    ]
}

/// A path as a request target may spell it: segments of plain text, dots, percent
/// escapes (right or wrong), runs of slashes, segments' parameters (`;` and what
/// follows it in its segment).
fn request_path() -> impl Strategy<Value = String> {
    let segment = prop_oneof![
        "[a-z]{1,4}",
        "[a-z.]{0,3};[a-z=;]{0,4}",
        Just("..;".to_owned()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just(String::new()),
        "%[0-9A-Fa-fG-Z%]{0,2}",
        "%%?[2-7][0-9A-Fa-f]{1,2}",
        Just("%%36F".to_owned()),
        "%25[2-7][0-9A-F]",
        Just("%2E%2e".to_owned()),
        Just("%2F".to_owned()),
        "\\PC{1,3}",
    ];
    (
        prop::collection::vec(segment, 0..8),
        prop_oneof![Just("/"), Just(""), Just("*")],
    )
        .prop_map(|(segments, lead)| format!("{lead}{}", segments.join("/")))
}

proptest! {
    #![proptest_config(cases(512))]

    /// Any request path normalizes to one routes can match without being fooled: it
    /// starts with `/`, has no empty segment but a last one and no `.` or `..`
    /// segment, and one already normal is left as it is.
    #[test]
    fn a_request_path_normalizes_to_one_without_dot_or_empty_segments(path in request_path()) {
        let normal = normalize_path(&path);
        prop_assert!(normal.starts_with('/'), "{path:?} → {normal:?}");
        let segments: Vec<&str> = normal[1..].split('/').collect();
        for (i, segment) in segments.iter().enumerate() {
            prop_assert!(
                !matches!(*segment, "." | "..") && (!segment.is_empty() || i + 1 == segments.len()),
                "{path:?} → {normal:?}"
            );
        }
        // Normalizing again changes nothing, but for a percent escape that the one
        // decoding made (`/%%36F` is `/%6F`, as a server that decodes once reads it).
        if !normal.contains('%') {
            let again = normalize_path(&normal);
            prop_assert_eq!(again.as_ref(), normal.as_ref(), "{:?}", path);
        }
    }
}

/// `path` without its segments' parameters: each `;` and what follows it up to the
/// next `/` or `\`.
fn without_parameters(path: &str) -> String {
    let (mut bare, mut rest) = (String::new(), path);
    while let Some(at) = rest.find(';') {
        bare.push_str(&rest[..at]);
        let parameters = &rest[at..];
        rest = &parameters[parameters.find(['/', '\\']).unwrap_or(parameters.len())..];
    }
    bare + rest
}

proptest! {
    #![proptest_config(cases(512))]

    /// A request path is matched as its normalized form without its segments'
    /// parameters, read from the path once when it needs neither (the common request).
    #[test]
    fn a_request_path_is_matched_normalized_without_its_parameters(path in request_path()) {
        let expected = normalize_path(&without_parameters(&path)).into_owned();
        let matched = matching_path(&path);
        prop_assert_eq!(matched.as_ref(), expected.as_str(), "{:?}", path);
    }
}

/// Forwarding headers (`X-Forwarded-For`, `Forwarded`) as any client or proxy may
/// send them.
#[cfg(feature = "http")]
mod forwarding_headers {
    use super::cases;
    use http::{HeaderMap, HeaderValue};
    use proptest::prelude::*;
    use rocgate::http::ClientIpResolver;
    use std::net::{IpAddr, SocketAddr};

    /// One entry of a forwarding header: an address (with a port, mapped, trusted or
    /// not), a `Forwarded` element, or text that is none.
    fn entry() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just("10.0.0.9"),
            Just("203.0.113.7"),
            Just("203.0.113.7:5123"),
            Just("::ffff:10.0.0.9"),
            Just("::ffff:203.0.113.7"),
            Just("[2001:db8::7]:443"),
            Just("[2001:db8::7]"),
            Just("2001:db8::7"),
            Just("fd00::1"),
            Just("for=203.0.113.7"),
            Just("For=\"[2001:db8::7]:443\";proto=https"),
            Just("for=\"[2001:db8::8]\""),
            Just("for=10.0.0.9;by=10.0.0.1"),
            Just("for=unknown"),
            Just("for=_hidden"),
            Just("unknown"),
            Just(""),
            Just(" "),
        ]
        .prop_map(|e| e.as_bytes().to_vec())
        .boxed()
        .prop_union(
            // Any bytes a header value may hold: visible ASCII, space, tab, obs-text.
            prop::collection::vec(prop_oneof![0x20u8..0x7f, Just(b'\t'), 0x80u8..=0xff], 0..16)
                .boxed(),
        )
    }

    /// A header's lines, each of entries joined by commas.
    fn header_lines() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(
            prop::collection::vec(entry(), 1..5).prop_map(|entries| entries.join(&b","[..])),
            0..3,
        )
    }

    /// Every address an entry of these lines could name, by any reading.
    fn addresses(lines: &[Vec<u8>]) -> Vec<IpAddr> {
        let mut found = Vec::new();
        for piece in lines
            .iter()
            .flat_map(|l| l.split(|&b| b == b',' || b == b';'))
        {
            let Ok(text) = std::str::from_utf8(piece) else {
                continue;
            };
            let text = text.trim_matches(|c: char| c.is_ascii_whitespace());
            let text = text.split_once('=').map_or(text, |(_, value)| value);
            let text = text.trim().trim_matches('"');
            if let Some(ip) = text
                .parse::<IpAddr>()
                .ok()
                .or_else(|| text.parse::<SocketAddr>().ok().map(|a| a.ip()))
                .or_else(|| {
                    let v6 = text.strip_prefix('[')?.strip_suffix(']')?;
                    v6.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6)
                })
            {
                found.push(ip);
                if let IpAddr::V6(v6) = ip {
                    found.extend(v6.to_ipv4_mapped().map(IpAddr::V4));
                }
            }
        }
        found
    }

    proptest! {
        #![proptest_config(cases(512))]

        /// Whatever the forwarding headers hold, the client IP is the peer's when the
        /// peer is not a trusted proxy, and otherwise the peer's or one the headers
        /// name: never one made up, and never a panic.
        #[test]
        fn the_client_ip_is_the_peer_or_one_the_headers_name(
            xff in header_lines(),
            forwarded in header_lines(),
            peer in prop::sample::select(vec!["10.0.0.1", "::ffff:10.0.0.1", "203.0.113.9", "fd00::9"]),
        ) {
            let resolver = ClientIpResolver::new(vec![
                "10.0.0.0/8".parse().expect("a network"),
                "fd00::/8".parse().expect("a network"),
            ]);
            let mut headers = HeaderMap::new();
            for (name, lines) in [("x-forwarded-for", &xff), ("forwarded", &forwarded)] {
                for line in lines {
                    if let Ok(value) = HeaderValue::from_bytes(line) {
                        headers.append(name, value);
                    }
                }
            }
            let peer: IpAddr = peer.parse().expect("an address");
            let canonical_peer = match peer {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(peer, IpAddr::V4),
                v4 => v4,
            };
            let client = resolver.resolve(Some(peer), &headers);
            prop_assert!(client.is_some());
            let client = client.unwrap_or(canonical_peer);
            if !resolver.is_trusted(peer) {
                prop_assert_eq!(client, canonical_peer);
            } else {
                let named = addresses(&xff).into_iter().chain(addresses(&forwarded));
                prop_assert!(
                    client == canonical_peer || named.into_iter().any(|ip| ip == client),
                    "{client} for {headers:?}"
                );
            }
        }
    }
}
