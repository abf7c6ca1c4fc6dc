//! The admission layer's request → route → key path: route matching on arbitrary
//! methods and paths (with path normalization), client IP keys (trusted proxies,
//! IPv6 prefixes, IP tiers) and header-value keys (several values, non-UTF-8, long
//! values, tiers).
//!
//! The table has more routes than `SCAN_ROUTES`, so requests are routed through the
//! route index.
//!
//! Invariants: no panic; every response is the inner service's 200 or the route's
//! rejection status; path normalization is idempotent (for paths whose every `%`
//! begins an escape); the index finds the route that trying every route in config
//! order finds, on the normalized path and as written; no route tracks more keys than
//! its `max_keys` and its tiers' values (a tier's key takes a place in a full table);
//! and on `creds`, partitioned by `header:authorization`, and `hosts`, partitioned by
//! `header:host` (each a bucket of one request per key, `limit × burst` at most 1), in
//! an engine of their own made afresh for each check (so that its table has room and
//! every key's bucket is full: the first request of a key is admitted), a request's
//! one credential, then the same credential spelled another way that folds alike (its
//! scheme in another case, other spaces and tabs after it and around the value), then
//! another credential (one character of its value changed, a letter in the other case
//! where the key keeps case, spelled another way too), sent at one instant: the first
//! is admitted and adds a key, the second is refused and adds none, the third is
//! admitted and adds one; and likewise a request's one `Host`, spelled another way
//! that names the same host (its ASCII letters in another case, a port, a trailing
//! dot), then another host (one character of its name changed).
#![no_main]

use arbitrary::Arbitrary;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri};
use libfuzzer_sys::fuzz_target;
use rocgate::clock::{Clock, ManualClock, Nanos};
use rocgate::config::{matching_path, normalize_path, Config};
use rocgate::engine::{Engine, SCAN_ROUTES};
use rocgate::http::{AdmissionLayer, PeerAddr, SharedEngine};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};
use tower::{Layer, ServiceExt};

const CONFIG: &str = r#"
[[routes]]
name = "by_ip"
path_prefix = "/ip"
partition = "ip"
ipv6_prefix = 48
base_limit = 3
cut_limit = 1
max_keys = 16
[[routes.tiers]]
name = "vip"
values = ["10.0.0.7", "::ffff:10.0.0.8", "2001:db8::"]
base_limit = 30
cut_limit = 10

[[routes]]
name = "by_key"
path = "/key/{id}/x"
partition = "header:x-api-key"
algorithm = "sliding_window"
base_limit = 2
cut_limit = 1
max_keys = 8
[[routes.tiers]]
name = "gold"
values = ["gold", "café"]
base_limit = 20
cut_limit = 5

[[routes]]
name = "queued"
method = "POST"
path_prefix = "/q"
partition = "header:authorization"
algorithm = "concurrency"
base_limit = 2
cut_limit = 1
queue = 0

[[routes]]
name = "creds"
path_prefix = "/c"
partition = "header:authorization"
base_limit = 2
cut_limit = 1
burst = "500ms"
max_keys = 8
[[routes.tiers]]
name = "listed"
values = ["bearer gold-Token", "Opaque-T0ken", "basic Z29sZA=="]
base_limit = 1
cut_limit = 0.5

[[routes]]
name = "hosts"
path_prefix = "/n"
partition = "header:host"
base_limit = 2
cut_limit = 1
burst = "500ms"
max_keys = 8
[[routes.tiers]]
name = "listed"
values = ["gold.example", "api.gold-shop.example.com", "[2001:db8::7]"]
base_limit = 1
cut_limit = 0.5

[[routes]]
name = "item"
path = "/api/items/{id}"

[[routes]]
name = "reviews"
method = "GET"
path = "/api/items/{id}/reviews"

[[routes]]
name = "orders"
path = "/api/orders"

[[routes]]
name = "order_pages"
path_prefix = "/api/orders/"

[[routes]]
name = "delete_any"
method = "DELETE"
path = "/api/{kind}/{id}"

[[routes]]
name = "static_file"
path = "/static/{file}"

[[routes]]
name = "static"
path_prefix = "/static"

[[routes]]
name = "health"
path = "/health"

[[routes]]
name = "rest"
path_prefix = "/"
algorithm = "fixed_window"
base_limit = 5
cut_limit = 2
"#;

struct World {
    runtime: tokio::runtime::Runtime,
    layer: AdmissionLayer,
    engine: SharedEngine,
    config: Config,
    clock: Arc<ManualClock>,
    /// `creds` and `hosts` alone, for the checks of their keys: `keyed_engine` holds
    /// an engine made of them afresh for each check, which `keyed_layer` decides on.
    keyed: Config,
    keyed_engine: SharedEngine,
    keyed_layer: AdmissionLayer,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let config = Config::from_toml_str(CONFIG, "fuzz").expect("valid config");
        let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
        assert!(
            config.routes.len() > SCAN_ROUTES,
            "routed through the index"
        );
        let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
        let engine = SharedEngine::new(engine);
        let layer = AdmissionLayer::with_engine(engine.clone(), clock.clone())
            .trusted_proxies(vec![
                "10.0.0.0/8".parse().unwrap(),
                "::1/128".parse().unwrap(),
            ])
            .build();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let mut keyed = config.clone();
        keyed
            .routes
            .retain(|r| r.name == "creds" || r.name == "hosts");
        let keyed_engine =
            SharedEngine::new(Engine::new(&keyed, clock.now(), SystemTime::UNIX_EPOCH).unwrap());
        let keyed_layer = AdmissionLayer::with_engine(keyed_engine.clone(), clock.clone()).build();
        World {
            runtime,
            layer,
            engine,
            config,
            clock,
            keyed,
            keyed_engine,
            keyed_layer,
        }
    })
}

#[derive(Arbitrary, Debug)]
struct Req {
    method: u8,
    target: Vec<u8>,
    peer: Option<([u8; 16], bool)>,
    headers: Vec<(u8, Vec<u8>)>,
    advance_ms: u16,
    /// How the request's credential is spelled again on `creds`, or its host on
    /// `hosts`, and which character of it another one changes.
    respell: u32,
}

/// Another spelling of the `Host` value `value` (without the blanks around it, as the
/// layer reads it) that names the same host: its name (up to a port, through the `]`
/// of an IPv6 literal, without one trailing dot) with its ASCII letters in the other
/// case where `bits` says, then a trailing dot, a port, both or neither (a port when
/// the name ends in a blank, which the layer would trim else; a dot when it ends in
/// one, which the layer would strip else, as it did from `-/..`, whose name is `-/.`).
/// A value beginning an IPv6 literal with no `]`, whose name runs to its end, only
/// changes case.
fn rehosted(value: &str, bits: u32) -> String {
    let flip = |name: &str| -> String {
        name.chars()
            .enumerate()
            .map(|(i, c)| match bits >> (i % 16) & 1 {
                1 if c.is_ascii_lowercase() => c.to_ascii_uppercase(),
                1 => c.to_ascii_lowercase(),
                _ => c,
            })
            .collect()
    };
    if value.starts_with('[') && !value.contains(']') {
        return flip(value);
    }
    let name = host_name(value);
    let mut again = flip(name);
    let dot = !name.is_empty() && (bits >> 16 & 1 == 1 || name.ends_with('.'));
    let port = bits >> 17 & 1 == 1 || (!dot && name.ends_with([' ', '\t']));
    if dot {
        again.push('.');
    }
    if port {
        again.push_str(&format!(":{}", bits >> 18 & 0x3fff));
    }
    again
}

/// The name of the `Host` value `value`, which the layer keys in lower case: up to a
/// port, through the `]` of an IPv6 literal (all of a value that begins one with no
/// `]`), without one trailing dot.
fn host_name(value: &str) -> &str {
    let end = match value.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or(value.len(), |close| close + 2),
        None => value.find(':').unwrap_or(value.len()),
    };
    let name = &value[..end];
    name.strip_suffix('.')
        .filter(|n| !n.is_empty())
        .unwrap_or(name)
}

/// A letter other than `c` in either case: `q`, or `z` for a `q`.
fn other_letter(c: char) -> char {
    if c.eq_ignore_ascii_case(&'q') {
        'z'
    } else {
        'q'
    }
}

/// A `Host` value naming another host than `value` (without the blanks around it):
/// the character of its name ([`host_name`]) that `bits` picks made another letter
/// than it in either case; a value with no name gains one, `q`, before its port.
fn other_host(value: &str, bits: u32) -> String {
    let name = host_name(value);
    let n = name.chars().count();
    if n == 0 {
        return format!("q{value}");
    }
    let at = bits as usize % n;
    let changed: String = name
        .chars()
        .enumerate()
        .map(|(i, c)| if i == at { other_letter(c) } else { c })
        .collect();
    format!("{changed}{}", &value[name.len()..])
}

/// Another credential than `value` (without the blanks around it): the character
/// `bits` picks changed, outside the blanks after the scheme, which fold. In the
/// scheme, made another letter than it in either case; in the credentials (all of a
/// value with no space or tab, which is kept whole), an ASCII letter in the other case
/// (the key keeps their case), another character made `q`.
fn recredentialed(value: &str, bits: u32) -> String {
    let chars: Vec<char> = value.chars().collect();
    if chars.is_empty() {
        return "q".to_owned();
    }
    let blank = |c: &char| matches!(c, ' ' | '\t');
    let scheme = chars.iter().position(blank);
    let mut at = bits as usize % chars.len();
    if let Some(end) = scheme.filter(|&end| at >= end) {
        // The credentials begin after the blanks; the value ends in none.
        at = at.max(end + chars[end..].iter().take_while(|c| blank(c)).count());
    }
    let c = chars[at];
    let changed = match scheme {
        Some(end) if at < end => other_letter(c),
        _ if c.is_ascii_lowercase() => c.to_ascii_uppercase(),
        _ if c.is_ascii_uppercase() => c.to_ascii_lowercase(),
        _ => 'q',
    };
    chars
        .iter()
        .enumerate()
        .map(|(i, &c)| if i == at { changed } else { c })
        .collect()
}

/// Sends `first`, `again` and `other` as the `header` of a request to `target`, at one
/// instant, through an engine of `creds` and `hosts` made now (its table empty, so
/// every key's bucket full), and checks that `first` is admitted and adds a key, that
/// `again`, spelling the same key, is refused and adds none, and that `other`, another
/// key, is admitted and adds one.
fn one_key_each(w: &World, route: &str, target: &str, header: &str, values: [&str; 3]) {
    w.keyed_engine
        .replace(Engine::new(&w.keyed, w.clock.now(), SystemTime::UNIX_EPOCH).unwrap());
    let engine = w.keyed_engine.load();
    let route = engine.route_id(route).unwrap();
    let service = w
        .keyed_layer
        .layer(tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(bytes::Bytes::new()))
        }));
    let expected = [
        (StatusCode::OK, 1),
        (StatusCode::TOO_MANY_REQUESTS, 1),
        (StatusCode::OK, 2),
    ];
    for (value, (status, keys)) in values.into_iter().zip(expected) {
        let req = Request::builder()
            .uri(target)
            .header(header, HeaderValue::from_bytes(value.as_bytes()).unwrap())
            .body(())
            .unwrap();
        let got = w
            .runtime
            .block_on(service.clone().oneshot(req))
            .unwrap()
            .status();
        let tracked = engine.route_snapshot(route, w.clock.now()).map(|s| s.keys);
        assert_eq!(
            (got, tracked),
            (status, Some(keys)),
            "{value:?} of {values:?}"
        );
    }
}

/// Another spelling of the credential `value` (without the blanks around it, as the
/// layer reads it) that folds as it does: its scheme's ASCII letters in the other case
/// where `bits` says, one to three spaces or tabs after the scheme, up to three around
/// the value. A value with no blank, kept whole, gains only the blanks around it.
fn respelled(value: &str, bits: u32) -> String {
    let blanks = |from: u32, n: u32| -> String {
        (0..n)
            .map(|i| {
                if bits >> (from + i) & 1 == 0 {
                    ' '
                } else {
                    '\t'
                }
            })
            .collect()
    };
    let core = match value.find([' ', '\t']) {
        None => value.to_owned(),
        Some(end) => {
            let (scheme, rest) = value.split_at(end);
            let scheme: String = scheme
                .chars()
                .enumerate()
                .map(|(i, c)| match bits >> (i % 12) & 1 {
                    1 if c.is_ascii_lowercase() => c.to_ascii_uppercase(),
                    1 => c.to_ascii_lowercase(),
                    _ => c,
                })
                .collect();
            let between = blanks(12, 1 + (bits >> 15) % 3);
            format!("{scheme}{between}{}", rest.trim_start_matches([' ', '\t']))
        }
    };
    format!(
        "{}{core}{}",
        blanks(17, (bits >> 20) % 4),
        blanks(22, (bits >> 25) % 4)
    )
}

const METHODS: [&[u8]; 6] = [b"GET", b"POST", b"HEAD", b"PUT", b"PATCH", b"DELETE"];
const NAMES: [&str; 6] = [
    "x-api-key",
    "authorization",
    "x-forwarded-for",
    "forwarded",
    "X-Api-Key",
    "host",
];

fuzz_target!(|reqs: Vec<Req>| {
    let w = world();
    for r in reqs.iter().take(16) {
        let method = match usize::from(r.method) {
            i if i < 200 => Method::from_bytes(METHODS[i % METHODS.len()]).unwrap(),
            _ => match Method::from_bytes(&r.target[..r.target.len().min(8)]) {
                Ok(m) => m,
                Err(_) => Method::GET,
            },
        };
        let Ok(uri) = Uri::try_from(r.target.as_slice()) else {
            continue;
        };
        let path = uri.path().to_owned();
        // Idempotent for a path whose every `%` begins an escape: a stray `%` may
        // form an escape with what the one decoding pass yields (`%%33` is `%3`),
        // which a server, decoding once too, also leaves.
        let escapes_whole = path.match_indices('%').all(|(i, _)| {
            path.as_bytes()
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        });
        let once = normalize_path(&path).into_owned();
        if escapes_whole {
            assert_eq!(
                normalize_path(&once),
                once.as_str(),
                "normalizing {path:?} twice"
            );
        }
        let engine = w.engine.load();
        let linear = |path: &str| {
            w.config
                .routes
                .iter()
                .position(|r| r.matcher.matches(method.as_str(), path))
                .and_then(|i| engine.route_at(i))
        };
        assert_eq!(
            engine.route_for(method.as_str(), &path),
            linear(&matching_path(&path)),
            "{method} {path:?}"
        );
        let written = if path.starts_with('/') {
            path.as_str()
        } else {
            "/"
        };
        assert_eq!(
            engine.route_for_written(method.as_str(), &path),
            linear(written),
            "{method} {path:?} as written"
        );
        let mut req = Request::builder().method(method).uri(uri).body(()).unwrap();
        for (which, value) in &r.headers {
            let name = NAMES[usize::from(*which) % NAMES.len()];
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            if let Ok(v) = HeaderValue::from_bytes(value) {
                req.headers_mut().append(name, v);
            }
        }
        if let Some((bytes, v4)) = r.peer {
            let ip = if v4 {
                IpAddr::V4(Ipv4Addr::new(10, 0, bytes[0] % 2, bytes[1] % 8))
            } else {
                IpAddr::V6(Ipv6Addr::from(bytes))
            };
            req.extensions_mut()
                .insert(PeerAddr(SocketAddr::new(ip, 4000)));
        }
        w.clock
            .advance(Duration::from_millis(u64::from(r.advance_ms)));
        let service = w.layer.layer(tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(bytes::Bytes::new()))
        }));
        // The request's one credential and its one `Host`, each checked on a route
        // of its own kind, whatever route the request is on.
        let one = |name: &str| {
            let mut values = req.headers().get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(v), None) => std::str::from_utf8(v.as_bytes())
                    .ok()
                    .map(|v| v.trim_matches([' ', '\t']).to_owned()),
                _ => None,
            }
        };
        let (credential, host) = (one("authorization"), one("host"));
        let response = w.runtime.block_on(service.oneshot(req)).unwrap();
        let status = response.status();
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "status {status}"
        );
        let bits = r.respell;
        if let Some(value) = credential {
            let other = recredentialed(&value, bits);
            one_key_each(
                w,
                "creds",
                "/c",
                "authorization",
                [
                    &value,
                    &respelled(&value, bits),
                    &respelled(&other, bits.rotate_left(16)),
                ],
            );
        }
        if let Some(value) = host {
            let other = other_host(&value, bits);
            one_key_each(
                w,
                "hosts",
                "/n",
                "host",
                [
                    &value,
                    &rehosted(&value, bits),
                    &rehosted(&other, bits.rotate_left(16)),
                ],
            );
        }
        for route in engine.snapshot(w.clock.now()) {
            // A key listed in a tier takes a place beyond `max_keys`: 16 keys in
            // `by_ip`'s table, then its tier's 10.0.0.7, made 17.
            let tier_values: usize = w
                .config
                .routes
                .iter()
                .find(|r| r.name == route.name)
                .map_or(0, |r| r.tiers.iter().map(|t| t.values.len()).sum());
            assert!(
                route.keys <= route.max_keys + tier_values,
                "{}: {route:?}",
                route.name
            );
        }
    }
});
