//! Memory the engine holds, and proof that deciding a request allocates nothing.
//!
//! Bytes are counted by `allocation-counter`, a counting global allocator linked into
//! this test binary only: it counts the bytes each thread *requests* from the
//! allocator (`Layout::size`), so the figures leave out malloc's own per-block
//! overhead (8–16 B a block on glibc).
//!
//! Targets: at most 2 KiB per route and 128 B per key, a header value's own bytes
//! included, whatever its length. To see every figure:
//! `cargo test --release --test memory -- --nocapture`.

#[path = "common/routes.rs"]
mod routes;

use allocation_counter::measure;
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use rocgate::clock::Nanos;
use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key};
use rocgate::limiter::Algorithm;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

/// Bytes a route may hold (issue target).
const ROUTE_BUDGET: i64 = 2048;
/// Bytes a key may hold (issue target).
const KEY_BUDGET: f64 = 128.0;
/// Keys inserted to measure per-key memory.
const KEYS: u32 = 10_000;

/// Runs `build` and returns what it built with the bytes it left allocated.
fn retained<T>(build: impl FnOnce() -> T) -> (T, i64) {
    let mut built = None;
    let info = measure(|| built = Some(build()));
    (built.expect("build ran"), info.bytes_current)
}

fn engine(routes: Vec<RouteConfig>) -> Engine {
    Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// A route named, and given a path prefix of its own (an engine takes no route that
/// an earlier one shadows), with a fixed width, so that every route costs the same.
fn route(i: usize, partition: Partition) -> RouteConfig {
    let mut r = RouteConfig::new(
        format!("route-{i:05}"),
        RouteMatch::prefix(format!("/api/{i:05}/")),
    );
    r.partition = partition;
    r
}

/// The algorithms whose keys keep their whole state in the key table.
const RATE_ALGORITHMS: [Algorithm; 4] = [
    Algorithm::TokenBucket {
        burst: Duration::from_secs(1),
    },
    Algorithm::FixedWindow {
        window: Duration::from_secs(1),
    },
    Algorithm::SlidingWindow {
        window: Duration::from_secs(1),
    },
    Algorithm::LeakyBucket { queue: 10 },
];

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
}

/// A 32-byte API key, the length of a typical bearer token.
fn api_key(n: u32) -> String {
    format!("ak_{n:029}")
}

/// Bytes `Engine::new` keeps for `n` routes (the config is built outside the count).
fn engine_bytes(n: usize, partition: &Partition) -> i64 {
    let config = Config::new((0..n).map(|i| route(i, partition.clone())).collect());
    let (_engine, bytes) =
        retained(|| Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap());
    bytes
}

/// Asserts that the bytes of engines of 10, 100 and 1,000 routes grow linearly in
/// the number of routes: from 100 to 1,000 routes ten times what they grow from 10 to
/// 100, to within one `parts`-th of it.
#[track_caller]
fn assert_linear([b10, b100, b1000]: [i64; 3], parts: i64) {
    assert!(
        ((b100 - b10) * 10 - (b1000 - b100)).abs() <= (b1000 - b100) / parts,
        "route memory is not linear in the number of routes: {b10} / {b100} / {b1000} B"
    );
}

/// Bytes per route: the difference between engines of different sizes, so the
/// engine's own fixed cost cancels out. Asserts that the cost is linear: to within
/// 0.1%, as the route index keeps the bytes that paths share once (routes 0–9 share
/// `/api/0000`, routes 0–99 `/api/000`).
fn bytes_per_route(partition: Partition) -> i64 {
    engine_bytes(1, &partition); // first use of process-wide caches (CPU count for DashMap)
    let [b10, b100, b1000] = [10, 100, 1000].map(|n| engine_bytes(n, &partition));
    assert_linear([b10, b100, b1000], 1000);
    (b1000 - b100) / 900
}

/// Bytes per key with `n` distinct keys in one partitioned route of `algorithm`: what
/// keys 2 to `n` added. The first key brings the table itself, whose shards are a cost
/// per route that grows with the core count, not with the keys (see the
/// partitioned-route test).
fn bytes_per_key<'a>(
    algorithm: Algorithm,
    partition: Partition,
    n: u32,
    key: impl Fn(u32) -> Key<'a>,
) -> f64 {
    let mut r = route(0, partition);
    r.algorithm = algorithm;
    let e = engine(vec![r]);
    assert!(e
        .check(e.route_at(0).unwrap(), key(0), Nanos::ZERO)
        .is_admit());
    let (_, bytes) = retained(|| {
        for k in 1..n {
            assert!(e
                .check(e.route_at(0).unwrap(), key(k), Nanos::ZERO)
                .is_admit());
        }
    });
    assert_eq!(
        e.route_snapshot(e.route_at(0).unwrap(), Nanos::ZERO)
            .unwrap()
            .keys,
        n as usize
    );
    bytes as f64 / f64::from(n - 1)
}

fn limits(max_keys: usize) -> KeyLimits {
    let mut v = KeyLimits::default();
    v.max_keys = max_keys;
    v
}

#[test]
fn a_route_holds_at_most_2_kib() {
    // Route names and paths of 11 and 5 bytes: every longer byte counts too.
    let bytes = bytes_per_route(Partition::Route);
    println!("bytes per route (whole-route limiter): {bytes}");
    assert!(bytes <= ROUTE_BUDGET, "{bytes} B per route");
}

#[test]
fn a_gateways_routes_hold_memory_linear_in_their_number() {
    // The mix of exact paths, templates and prefixes of benches/routes.rs, with the
    // route index that finds a request's route among them: no part of it grows faster
    // than the table. (Its templates' segments, each a string of its own, make a route
    // of this mix cost more than the budget's one-prefix route.)
    engine_bytes(1, &Partition::Route);
    let [b10, b100, b1000] = [10, 100, 1000].map(|n| {
        let config = Config::new(routes::table(n));
        retained(|| Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()).1
    });
    println!(
        "bytes per route of a gateway's mix: {} from 100 to 1,000 routes, {} from 10 to 100",
        (b1000 - b100) / 900,
        (b100 - b10) / 90
    );
    assert_linear([b10, b100, b1000], 100);
}

#[test]
fn a_partitioned_route_holds_at_most_2_kib() {
    // A key table is made at the route's first key: DashMap allocates
    // (4 × cores).next_power_of_two() shards of 128 B then, and the table its 64 B
    // sketch of the keys refused, which this prints apart.
    let by_ip = bytes_per_route(Partition::ClientIp(KeyLimits::default()));
    let by_header = bytes_per_route(Partition::Header("x-api-key".into(), KeyLimits::default()));
    let e = engine(vec![route(0, Partition::ClientIp(KeyLimits::default()))]);
    let (_, first_key) = retained(|| e.check(e.route_at(0).unwrap(), Key::Ip(ip(1)), Nanos::ZERO));
    println!(
        "bytes per route, no keys yet: per-IP {by_ip}, per-header {by_header}; \
         the first key adds {first_key} (the table's shards and sketch)"
    );
    assert!(by_ip <= ROUTE_BUDGET, "{by_ip} B per IP-partitioned route");
    assert!(
        by_header <= ROUTE_BUDGET,
        "{by_header} B per header-partitioned route"
    );
}

/// Bytes per key of `algorithm` with `n` keys in the table, each key's header value
/// one of `values` (`n` of them at least), the value's own bytes counted.
fn bytes_per_header_key(algorithm: Algorithm, n: u32, values: &[String]) -> f64 {
    bytes_per_key(
        algorithm,
        Partition::Header("x-api-key".into(), limits(KEYS as usize)),
        n,
        |k| Key::Value(&values[k as usize]),
    )
}

/// Bytes per key of `algorithm` with `n` keys in the table: an IP key, and a key of a
/// 32-byte header value, the value's own bytes counted. Prints both.
fn bytes_per_key_at(algorithm: Algorithm, n: u32) -> (f64, f64) {
    let api_keys: Vec<String> = (0..n).map(api_key).collect();
    let ip_key = bytes_per_key(
        algorithm,
        Partition::ClientIp(limits(KEYS as usize)),
        n,
        |k| Key::Ip(ip(k)),
    );
    let header_key = bytes_per_header_key(algorithm, n, &api_keys);
    println!(
        "bytes per {} key at {n:>5} keys: IP {ip_key:.1}; 32-byte header value {header_key:.1}",
        algorithm.name()
    );
    (ip_key, header_key)
}

#[test]
fn a_key_holds_at_most_128_bytes_in_a_full_table() {
    for algorithm in RATE_ALGORITHMS {
        let (ip_key, header_key) = bytes_per_key_at(algorithm, KEYS);
        let name = algorithm.name();
        assert!(ip_key <= KEY_BUDGET, "{name}: {ip_key:.1} B per IP key");
        assert!(
            header_key <= KEY_BUDGET,
            "{name}: {header_key:.1} B per header key"
        );
    }
    println!(
        "governor keyed, IP key, {KEYS} keys: {:.1} B",
        governor_bytes_per_key(KEYS)
    );
}

/// The hash tables grow in steps, so the cost per key depends on how full they are:
/// the worst is just after a table doubled.
#[test]
fn a_key_holds_at_most_128_bytes_at_any_fill() {
    for algorithm in RATE_ALGORITHMS {
        let (mut worst_ip, mut worst_header) = (0.0f64, 0.0f64);
        for n in [1_000, 2_500, 5_000, 7_500] {
            let (ip_key, header_key) = bytes_per_key_at(algorithm, n);
            worst_ip = worst_ip.max(ip_key);
            worst_header = worst_header.max(header_key);
        }
        let name = algorithm.name();
        assert!(
            worst_ip <= KEY_BUDGET,
            "{name}: up to {worst_ip:.1} B per IP key"
        );
        assert!(
            worst_header <= KEY_BUDGET,
            "{name}: up to {worst_header:.1} B per header key"
        );
    }
}

/// A table of up to 1,048,576 keys takes 256 shards, one per 4,096 keys (a sweep
/// holds one at a time), and each shard makes its smallest hash table at its first
/// key: a few hundred keys there hold more than 128 B each (printed), but from 1,000
/// keys on they hold no more than in a table of DashMap's default shards, and a
/// million keys, within the budget too.
#[test]
fn a_key_of_a_large_table_holds_at_most_128_bytes_from_1000_keys() {
    const LARGE: usize = 1 << 20;
    let api_keys: Vec<String> = (0..10_000).map(api_key).collect();
    for algorithm in RATE_ALGORITHMS {
        let name = algorithm.name();
        for n in [100, 300, 1_000, 10_000] {
            let ip_key = bytes_per_key(algorithm, Partition::ClientIp(limits(LARGE)), n, |k| {
                Key::Ip(ip(k))
            });
            let header_key = bytes_per_key(
                algorithm,
                Partition::Header("x-api-key".into(), limits(LARGE)),
                n,
                |k| Key::Value(&api_keys[k as usize]),
            );
            println!(
                "bytes per {name} key at {n:>5} keys of a {LARGE}-key table: IP {ip_key:.1}; \
                 32-byte header value {header_key:.1}"
            );
            if n >= 1_000 {
                assert!(
                    ip_key <= KEY_BUDGET,
                    "{name}: {ip_key:.1} B per IP key at {n}"
                );
                assert!(
                    header_key <= KEY_BUDGET,
                    "{name}: {header_key:.1} B per header key at {n}"
                );
            }
        }
    }
    let algorithm = RATE_ALGORITHMS[0];
    let full = bytes_per_key(
        algorithm,
        Partition::ClientIp(limits(LARGE)),
        1_000_000,
        |k| Key::Ip(ip(k)),
    );
    println!("bytes per token_bucket IP key at 1,000,000 keys: {full:.1}");
    assert!(full <= KEY_BUDGET, "{full:.1} B per IP key at 1,000,000");
}

/// A concurrency key's state is shared with its permits, on the heap (a permit may
/// outlive the key's place in the table): 48 B with the `Arc`'s counts (in-flight and
/// waiting counts, limit, queue, the pointer to a waiter list that exists once a
/// request has queued, and the key's tier and route generation), beside a 32-byte
/// slot in the table (up to 33 × 16 / 7 = 75 B just after the table doubled, control
/// byte included): within the same 128 B as the other algorithms' keys.
#[test]
fn a_concurrency_key_with_its_shared_state_fits_the_key_budget() {
    let algorithm = Algorithm::Concurrency { queue: 10 };
    let (mut worst_ip, mut worst_header) = (0.0f64, 0.0f64);
    for n in [1_000, 2_500, 5_000, 7_500, KEYS] {
        let (ip_key, header_key) = bytes_per_key_at(algorithm, n);
        worst_ip = worst_ip.max(ip_key);
        worst_header = worst_header.max(header_key);
    }
    assert!(worst_ip <= KEY_BUDGET, "up to {worst_ip:.1} B per IP key");
    assert!(
        worst_header <= KEY_BUDGET,
        "up to {worst_header:.1} B per header key"
    );
}

/// A header value is kept whole as its key up to 15 bytes; a longer one (an API key,
/// a JWT, the hundreds of KiB an HTTP/1 head may carry) is keyed by a digest of it, so
/// that its key costs what a short one's does. Kept whole up to 1 KiB, a key of a
/// 1,024-byte value held 1,104 B; of a 40-byte one, up to 147 B.
#[test]
fn a_header_key_holds_at_most_128_bytes_whatever_its_value() {
    const ALGORITHMS: [Algorithm; 5] = [
        RATE_ALGORITHMS[0],
        RATE_ALGORITHMS[1],
        RATE_ALGORITHMS[2],
        RATE_ALGORITHMS[3],
        Algorithm::Concurrency { queue: 10 },
    ];
    // The fills at which the tables are fullest and emptiest (just before and after
    // they double: see the tests above).
    const FILLS: [u32; 2] = [5_000, 7_500];
    let mut over = Vec::new();
    for len in [8, 15, 16, 40, 200, 4096] {
        // Distinct values of `len` bytes, differing in their first bytes only.
        let values: Vec<String> = (0..FILLS[1])
            .map(|k| {
                let mut v = format!("{k:x}-");
                v.extend(std::iter::repeat_n('v', len.max(v.len()) - v.len()));
                v.truncate(len);
                v
            })
            .collect();
        for algorithm in ALGORITHMS {
            let worst = FILLS
                .map(|n| bytes_per_header_key(algorithm, n, &values))
                .into_iter()
                .fold(0.0f64, f64::max);
            println!(
                "bytes per {} key of a {len}-byte header value: up to {worst:.1}",
                algorithm.name()
            );
            if worst > KEY_BUDGET {
                over.push(format!("{}, {len} B: {worst:.1}", algorithm.name()));
            }
        }
    }
    assert!(over.is_empty(), "B per key over {KEY_BUDGET}: {over:?}");
}

/// Governor's keyed limiter (DashMap store) on the same IP keys, for scale.
fn governor_bytes_per_key(n: u32) -> f64 {
    let quota = Quota::per_second(NonZeroU32::new(200).unwrap());
    let (limiter, _) =
        retained(|| RateLimiter::dashmap_with_clock(quota, FakeRelativeClock::default()));
    let (_, bytes) = retained(|| {
        for k in 0..n {
            assert!(limiter.check_key(&ip(k)).is_ok());
        }
    });
    assert_eq!(limiter.len(), n as usize);
    bytes as f64 / f64::from(n)
}

/// Key churn does not grow memory: idle keys are evicted and their room reused.
#[test]
fn key_churn_does_not_grow_memory() {
    const ROUND: u32 = 1_000;
    let partition = Partition::ClientIp({
        let mut v = KeyLimits::default();
        v.max_keys = ROUND as usize;
        v.idle_timeout = Duration::from_secs(10);
        v
    });
    let e = engine(vec![route(0, partition)]);
    // Each round brings ROUND new keys, 30 s after the last: the round's first check
    // rolls the window, which sweeps out the previous round's keys, idle for 30 s.
    let mut held = Vec::new();
    let mut total = 0;
    for round in 0..24 {
        let now = Nanos::from_secs(30 * u64::from(round));
        let (_, bytes) = retained(|| {
            for k in 0..ROUND {
                assert!(e
                    .check(e.route_at(0).unwrap(), Key::Ip(ip(round * ROUND + k)), now)
                    .is_admit());
            }
        });
        assert_eq!(
            e.route_snapshot(e.route_at(0).unwrap(), now).unwrap().keys,
            ROUND as usize
        );
        total += bytes;
        held.push(total);
    }
    // The tables may still grow a step as keys land unevenly in shards: a shard's table
    // doubles, at most every shard's once, under twice the first round's memory (one
    // CI run: 76,480 B, then 101,568 B from the second round on, two shards doubled; a
    // shard may double as late as the 20th round: 101,568 B, then 114,112 and 126,656).
    // A leak of the evicted entries would hold a round's worth more at every round,
    // 24 times the first after 24; a leak of a tenth of them, 3.3 times.
    let (first, last) = (held[0], held[held.len() - 1]);
    assert!(
        last < first * 2,
        "memory after each round of {ROUND} new keys: {held:?} B"
    );
}

/// Offers `rate` req/s evenly over `[from, to)` seconds, all with `key`.
fn offer(e: &Engine, key: Key<'_>, from: f64, to: f64, rate: f64) {
    let n = ((to - from) * rate).round() as u64;
    for k in 0..n {
        let _ = e.check(
            e.route_at(0).unwrap(),
            key,
            Nanos::from_secs_f64(from + k as f64 / rate),
        );
    }
}

/// A minute of traffic with a spike: slot rollovers, a cut, rejections and the
/// restore steps all happen inside it (and key sweeps, with a short idle timeout).
fn spike(e: &Engine, key: Key<'_>) {
    offer(e, key, 0.0, 10.0, 40.0);
    offer(e, key, 10.0, 15.0, 600.0);
    offer(e, key, 15.0, 60.0, 40.0);
}

#[test]
fn checks_allocate_nothing_on_a_route() {
    let e = engine(vec![route(0, Partition::Route)]);
    spike_allocates_nothing(&e, Key::None);
}

#[test]
fn checks_allocate_nothing_once_a_key_exists() {
    let value = api_key(7);
    let limits = {
        let mut v = KeyLimits::default();
        v.max_keys = 100;
        v.idle_timeout = Duration::from_secs(20);
        v
    };
    for partition in [
        Partition::ClientIp(limits),
        Partition::Header("x-api-key".into(), limits),
    ] {
        let key = match partition {
            Partition::ClientIp(_) => Key::Ip(ip(7)),
            _ => Key::Value(&value),
        };
        let e = engine(vec![route(0, partition)]);
        let insert =
            measure(|| assert!(e.check(e.route_at(0).unwrap(), key, Nanos::ZERO).is_admit()));
        assert!(
            insert.count_total > 0,
            "the counter must see the new key stored"
        );
        spike_allocates_nothing(&e, key);
    }
}

/// Through the tower layer, a request whose `Host` has capitals (and a port, a
/// trailing dot) allocates no more than one in lower case: its key, the host's name in
/// lower case, is made without a lower-cased copy (one `String` a request, before).
#[cfg(feature = "http")]
#[test]
fn a_host_in_capitals_is_keyed_without_an_allocation() {
    use rocgate::http::AdmissionLayer;
    use tower::{Layer as _, ServiceExt as _};
    let mut r = route(0, Partition::Header("host".into(), limits(100)));
    r.matcher = RouteMatch::any();
    r.controller.base_limit_rps = 1e6;
    r.controller.cut_limit_rps = 1e6;
    let layer = AdmissionLayer::from_config(&Config::new(vec![r])).unwrap();
    let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(bytes::Bytes::new()))
    }));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let allocations = |host: &str| {
        let req = http::Request::get("/")
            .header("host", host)
            .body(())
            .unwrap();
        let svc = svc.clone();
        let info = measure(|| {
            let response = rt.block_on(svc.oneshot(req)).unwrap();
            assert_eq!(response.status(), http::StatusCode::OK, "{host:?}");
        });
        info.count_total
    };
    for name in ["shop.example", "api.shop-example.com"] {
        // The key made, then a request on it, in lower case.
        allocations(name);
        let lower = allocations(name);
        let upper = name.to_ascii_uppercase();
        for host in [upper.clone(), format!("{upper}:8080"), format!("{upper}.")] {
            assert_eq!(allocations(&host), lower, "{host:?} against {name:?}");
        }
    }
    assert_eq!(layer.engine().snapshot(Nanos::ZERO)[0].keys, 2);
}

/// Through the tower layer, a request admitted at once (its inner service ready) costs
/// no allocation beyond what its inner service makes: on a route, on a route keyed by
/// client IP (walked through `X-Forwarded-For` from a trusted proxy, its key already
/// in the table), on a template, and unrouted, under each route key that needs no
/// normalized copy of the path. `call` and the first poll of its future are counted,
/// beside the same calls on the bare inner service. (With the builder's
/// `matched_route(true)` the route's `MatchedRoute` extension is one allocation: this
/// test then fails, as it should.)
#[cfg(feature = "http")]
#[test]
fn an_admitted_request_through_the_layer_allocates_nothing_of_its_own() {
    use rocgate::http::{AdmissionLayer, PeerAddr, RouteKey};
    use std::future::Future as _;
    use std::task::{Context, Poll, Waker};
    use tower::{Layer as _, Service as _};

    let wide = |r: &mut RouteConfig| {
        r.controller.base_limit_rps = 1e6;
        r.controller.cut_limit_rps = 1e6;
    };
    let mut plain = RouteConfig::new("plain", RouteMatch::prefix("/plain"));
    let mut per_ip = RouteConfig::new("per_ip", RouteMatch::prefix("/ip"));
    per_ip.partition = Partition::ClientIp(limits(100));
    let mut template = RouteConfig::new("template", RouteMatch::exact("GET", "/t/{id}"));
    for r in [&mut plain, &mut per_ip, &mut template] {
        wide(r);
    }
    let mut config = Config::new(vec![plain, per_ip, template]);
    config.server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    let inner = tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(bytes::Bytes::new()))
    });
    let request = |path: &str| {
        let mut req = http::Request::get(path)
            .header("x-forwarded-for", "203.0.113.7, 10.0.0.2")
            .body(())
            .unwrap();
        req.extensions_mut()
            .insert(PeerAddr("10.0.0.1:4242".parse().unwrap()));
        req
    };
    let mut cx = Context::from_waker(Waker::noop());
    // The allocations of a call on `service` and the first poll of its future.
    let allocations = |service: &mut dyn FnMut(http::Request<()>) -> Poll<u16>, path| {
        let req = request(path);
        measure(|| assert_eq!(service(req), Poll::Ready(200), "{path}")).count_total
    };
    for key in [RouteKey::Config, RouteKey::Normalized] {
        let layer = AdmissionLayer::builder(&config)
            .unwrap()
            .route_key(key)
            .build();
        let mut layered = layer.layer(inner);
        let mut bare = inner;
        for path in ["/plain/a", "/ip/a", "/t/42", "/nowhere"] {
            let mut layered_call = |req| {
                let mut f = std::pin::pin!(layered.call(req));
                f.as_mut()
                    .poll(&mut cx)
                    .map(|r| r.unwrap().status().as_u16())
            };
            // The first makes the client's key.
            allocations(&mut layered_call, path);
            let with_layer = allocations(&mut layered_call, path);
            let mut bare_call = |req| {
                let mut f = std::pin::pin!(bare.call(req));
                f.as_mut()
                    .poll(&mut cx)
                    .map(|r| r.unwrap().status().as_u16())
            };
            let without = allocations(&mut bare_call, path);
            assert_eq!(with_layer, without, "{key:?} {path}");
        }
    }
}

/// A request a trusted proxy's address keys, as its forwarding header's walk ended at
/// an entry naming no address or the proxy sent none (`no_header`: with a trusted
/// cluster network, every request of a client inside it that calls rocgate directly),
/// allocates nothing of its own once its route has fallen back for that reason once,
/// with a recorder in use: it is counted in `rocgate_client_key_fallbacks_total` on a
/// handle made at that first one. Each such request allocated the route's label, and
/// the series' key, to look the counter up in the recorder's registry. After a reload,
/// the new engine's first fallback takes it in (the route moved in its table), and the
/// counts go on in the same series.
#[cfg(feature = "proxy")]
#[test]
fn a_request_keyed_by_a_fallback_allocates_nothing_of_its_own() {
    use rocgate::clock::{Clock, ManualClock};
    use rocgate::http::{AdmissionLayer, PeerAddr, SharedEngine};
    use std::future::Future as _;
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};
    use tower::{Layer as _, Service as _};

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let mut per_ip = RouteConfig::new("per_ip", RouteMatch::prefix("/ip"));
    per_ip.partition = Partition::ClientIp(limits(100));
    per_ip.controller.base_limit_rps = 1e6;
    per_ip.controller.cut_limit_rps = 1e6;
    let config = Config::new(vec![per_ip]);
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let shared =
        SharedEngine::new(Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap());
    let layer = AdmissionLayer::with_engine(shared.clone(), clock.clone())
        .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()])
        .build();
    let inner = tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(bytes::Bytes::new()))
    });
    let mut layered = layer.layer(inner);
    let mut bare = inner;
    let request = |xff: Option<&str>| {
        let mut req = http::Request::get("/ip/a");
        if let Some(xff) = xff {
            req = req.header("x-forwarded-for", xff);
        }
        let mut req = req.body(()).unwrap();
        req.extensions_mut()
            .insert(PeerAddr("10.0.0.1:4242".parse().unwrap()));
        req
    };
    let mut cx = Context::from_waker(Waker::noop());
    let allocations = |service: &mut dyn FnMut(http::Request<()>) -> Poll<u16>, xff| {
        let req = request(xff);
        measure(|| assert_eq!(service(req), Poll::Ready(200), "{xff:?}")).count_total
    };
    let mut layered_call = |req| {
        let mut f = std::pin::pin!(layered.call(req));
        f.as_mut()
            .poll(&mut cx)
            .map(|r| r.unwrap().status().as_u16())
    };
    let mut bare_call = |req| {
        let mut f = std::pin::pin!(bare.call(req));
        f.as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .map(|r| r.unwrap().status().as_u16())
    };
    let cases = [
        (None, "no_header"),
        (Some("203.0.113.7, "), "empty_entry"),
        (Some("junk"), "malformed_entry"),
        (Some("unknown"), "hidden_node"),
    ];
    let count = |reason: &str| {
        let series =
            format!("rocgate_client_key_fallbacks_total{{route=\"per_ip\",reason=\"{reason}\"}} ");
        handle
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(&series).map(|n| n.parse::<u64>().unwrap()))
    };
    for (xff, _) in cases {
        // The first registers the series, says it, and makes the client's key.
        allocations(&mut layered_call, xff);
        let with_layer = allocations(&mut layered_call, xff);
        let without = allocations(&mut bare_call, xff);
        assert_eq!(with_layer, without, "{xff:?}");
    }
    for (_, reason) in cases {
        assert_eq!(count(reason), Some(2), "{reason}");
    }
    // A route put before it moves it in the table: its entry is made again.
    let mut moved = config.clone();
    moved
        .routes
        .insert(0, RouteConfig::new("first", RouteMatch::prefix("/first")));
    let reloaded = shared
        .load()
        .reload(&moved, clock.now(), SystemTime::UNIX_EPOCH)
        .unwrap();
    assert_eq!(reloaded.route_id("per_ip").map(|r| r.index()), Some(1));
    shared.replace(reloaded);
    for (xff, _) in cases {
        allocations(&mut layered_call, xff);
        let with_layer = allocations(&mut layered_call, xff);
        let without = allocations(&mut bare_call, xff);
        assert_eq!(with_layer, without, "after the reload: {xff:?}");
    }
    for (_, reason) in cases {
        assert_eq!(count(reason), Some(4), "{reason}");
    }
}

/// A [`spike`] on `e`'s first route with `key`: it cuts, and allocates nothing.
#[track_caller]
fn spike_allocates_nothing(e: &Engine, key: Key<'_>) {
    let info = measure(|| spike(e, key));
    let snap = e
        .route_snapshot(e.route_at(0).unwrap(), Nanos::from_secs(60))
        .unwrap();
    assert!(
        snap.cuts >= 1 && snap.rejected_total() > 0,
        "the spike must cut: {snap:?}"
    );
    assert_eq!(info.count_total, 0, "{key:?}: {info:?}");
}

/// The tuning hints' history of one route over an hour (360 intervals of 10 s, each
/// slot's ROC spread over many histogram buckets, upstream latencies measured): the
/// memory `serve` keeps per route for `GET /admin/hints`.
#[test]
fn an_hour_of_hints_history_per_route() {
    use rocgate::controller::ControllerState;
    use rocgate::engine::SlotReport;
    use rocgate::hints::{History, UpstreamMeter};
    use rocgate::window::RocSample;
    use std::sync::Arc;

    let engine = engine(vec![route(0, Partition::Route)]);
    let settings = || vec![engine.route_settings(engine.route_at(0).unwrap()).unwrap()];
    let meter = UpstreamMeter::new();
    let name: Arc<str> = "route-00000".into();
    let (history, bytes) = retained(|| {
        let mut h = History::new(Duration::from_secs(10), Duration::from_secs(3600));
        let mut x: u64 = 1;
        for interval in 0..=360u64 {
            let start = interval * 10_000;
            for slot in 0..100u64 {
                // A deterministic spread of ROC values over about 60 buckets.
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let roc = (x >> 33) as f64 / f64::from(u32::MAX) * 300.0 - 50.0;
                let report = SlotReport {
                    at: Nanos::from_millis(start + slot * 100),
                    slot: Duration::from_millis(100),
                    sample: RocSample {
                        n_prev: 0,
                        n_recent: 0,
                        rate_prev_rps: 0.0,
                        rate_recent_rps: roc.abs(),
                        roc,
                    },
                    roc,
                    state: ControllerState::Normal,
                    limit_rps: 200.0,
                    exhausted: false,
                    in_flight: None,
                    armed: true,
                };
                h.on_slot("route-00000", &report);
                meter.record(&name, Duration::from_micros(x % 400_000), x % 97 == 0);
            }
            let now = Nanos::from_millis(start + 10_000);
            h.tick(now, &engine.snapshot(now), settings(), Some(&meter));
        }
        h
    });
    let kept = history.since(Nanos::ZERO);
    assert_eq!(kept[0].1.len(), 360);
    println!("hints history: {bytes} B per route for an hour in 10 s intervals");
    assert!(bytes < 1 << 20, "{bytes} B");
}

/// `seconds` s of an access log at `rate` req/s: even lines `POST /api/order` from
/// 1,000 clients, odd lines `GET /` from one.
fn access_log_text(seconds: u32, rate: u32) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    for s in 0..seconds {
        let (m, sec) = (s / 60, s % 60);
        for i in 0..rate {
            let (client, request) = if i % 2 == 0 {
                (ip((s * rate + i) % 1000), "POST /api/order HTTP/1.1")
            } else {
                (ip(5000), "GET / HTTP/1.1")
            };
            writeln!(
                text,
                "{client} - - [27/Nov/2026:20:{m:02}:{sec:02} +0000] \"{request}\" 200 12"
            )
            .unwrap();
        }
    }
    text
}

/// An access log read for replay keeps, per request on a route partitioned by client
/// IP, its route and client (8 B); of the requests on a whole route, only a count per
/// second. Peaks include the reading's growth and the placing at the end.
#[test]
fn an_access_log_holds_a_few_bytes_a_request() {
    use rocgate::sim::{LogOptions, LogReader};
    const SECONDS: u32 = 100;
    const RATE: u32 = 1000;
    let mut order = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
    order.partition = Partition::ClientIp(KeyLimits::default());
    let config = Config::new(vec![
        order,
        RouteConfig::new("rest", RouteMatch::prefix("/")),
    ]);
    let text = access_log_text(SECONDS, RATE);
    let requests = f64::from(SECONDS * RATE);
    let keyed = requests / 2.0;

    let mut reader = LogReader::new(&config, LogOptions::default()).unwrap();
    let mut log = None;
    let read = measure(|| {
        reader.read("access.log", text.as_bytes()).unwrap();
        log = Some(reader.finish().unwrap());
    });
    let log = log.expect("read");
    assert_eq!(log.len() as f64, requests);
    let kept = read.bytes_current as f64;
    let peak = read.bytes_max as f64;
    // Placing a second's requests as they are replayed holds that second only.
    let mut replayed = 0usize;
    let replay = measure(|| replayed = log.requests().count());
    assert_eq!(replayed as f64, requests);
    println!(
        "access log: {:.1} B kept per request ({:.1} per request on the partitioned route), \
         {:.1} B at the peak of reading; replaying holds {} B at most",
        kept / requests,
        kept / keyed,
        peak / requests,
        replay.bytes_max
    );
    // 8 B per keyed request, the 1,000 client addresses, 32 B per second.
    assert!(kept / keyed < 10.0, "{kept} B");
    // The keyed requests as read (16 B each, in a vector that grows by doubling), then
    // placed (8 B each).
    assert!(peak / keyed < 50.0, "{peak} B");
    assert!(replay.bytes_max < 64 * 1024, "{} B", replay.bytes_max);

    // The whole route's requests alone: a count per second.
    let only_rest = {
        let mut v = LogOptions::default();
        v.routes = vec!["rest".to_owned()];
        v
    };
    let mut reader = LogReader::new(&config, only_rest).unwrap();
    let mut rest = None;
    let read = measure(|| {
        reader.read("access.log", text.as_bytes()).unwrap();
        rest = Some(reader.finish().unwrap());
    });
    let whole = requests - keyed;
    assert_eq!(rest.map(|l| l.len() as f64), Some(whole));
    let peak = read.bytes_max as f64;
    println!(
        "access log, a whole route only: {:.2} B per request at the peak of reading",
        peak / whole
    );
    assert!(peak / whole < 1.0, "{peak} B");
}

/// A request paced by a leaky bucket waits for its departure holding its place, with
/// the key its place is given back on if its client leaves first. On a header
/// partition that key was a copy of the whole header value (a 64 KiB token held 64
/// KiB more per waiting request), where the key table keys it by 16 bytes (the value
/// itself up to 15 bytes, else a digest): the place keeps the same 16 bytes.
#[cfg(feature = "http")]
#[test]
fn a_paced_request_holds_no_copy_of_its_header_value() {
    use rocgate::clock::{Clock, ManualClock};
    use rocgate::http::{AdmissionLayer, SharedEngine};
    use std::future::Future as _;
    use std::sync::Arc;
    use std::task::{Context, Waker};
    use tower::{Layer as _, Service as _};

    let mut r = route(0, Partition::Header("x-api-key".into(), limits(100)));
    r.algorithm = Algorithm::LeakyBucket { queue: 1 };
    r.controller.base_limit_rps = 1.0;
    r.controller.cut_limit_rps = 1.0;
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let e = Engine::new(&Config::new(vec![r]), clock.now(), SystemTime::UNIX_EPOCH).unwrap();
    let layer = AdmissionLayer::with_engine(SharedEngine::new(e), clock).build();
    let mut svc = layer.layer(tower::service_fn(|_: http::Request<String>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(axum::body::Body::empty()))
    }));
    let token = "t".repeat(64 * 1024);
    let request = || {
        http::Request::get("/api/00000/x")
            .header("x-api-key", token.as_str())
            .body(String::new())
            .unwrap()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut cx = Context::from_waker(Waker::noop());
    let mut first = Box::pin(svc.call(request()));
    assert!(
        first.as_mut().poll(&mut cx).is_ready(),
        "the first goes at once"
    );
    let second = request();
    let (mut paced, held) = retained(|| {
        let mut paced = Box::pin(svc.call(second));
        assert!(
            paced.as_mut().poll(&mut cx).is_pending(),
            "the second is paced"
        );
        paced
    });
    eprintln!("a paced request with a 64 KiB key holds {held} B beside its request");
    assert!(held < 2048, "{held} B held: a copy of the value");
    // It departs a second after the first.
    rt.block_on(async {
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(paced.as_mut().poll(&mut cx).is_ready(), "then it goes");
    });
}

/// A simulated hour of a partitioned route keeps a row per slot (36,000 of 100 ms),
/// and the distinct keys it refused per hints interval (a second) for its hints, not
/// per slot: a 64-byte sketch in every row made it 248 B where 184 do (8,928,352 B an
/// hour, then 6,902,904 B), where a second's, kept only where a key was refused, is 68
/// B a second at most (245 KB an hour). The hints read them as before. A row is 192 B
/// since it counts the refusals of a partitioned route's `route_limit` (8 B a slot,
/// 288 KB an hour of 100 ms slots: 7,190,920 B).
#[test]
fn a_simulated_hour_keeps_the_keys_refused_per_interval() {
    use rocgate::sim::{ArrivalModel, Profile, Simulator};
    let mut login = RouteConfig::new("login", RouteMatch::prefix("/"));
    login.partition = Partition::ClientIp(KeyLimits::default());
    login.controller.base_limit_rps = 1.0;
    login.controller.cut_limit_rps = 1.0;
    let sim = Simulator::new(Config::new(vec![login]), None)
        .unwrap()
        .capacity(1000);
    // One keyless client at 5 req/s against 1: refused in every second.
    let profile = Profile::from_points(&[(0.0, 5.0), (3600.0, 5.0)]).unwrap();
    let mut run = None;
    let info = measure(|| {
        run = Some(
            sim.run_profile_all(&profile, ArrivalModel::Uniform)
                .unwrap(),
        )
    });
    let run = run.expect("ran");
    let slots = run.routes[0].series.len();
    assert_eq!(slots, 36_000);
    let per_slot = info.bytes_current as f64 / slots as f64;
    let row = std::mem::size_of::<rocgate::sim::SlotRow>();
    println!(
        "a simulated hour of a partitioned route: {} B kept ({per_slot:.1} B a slot, a row {row} B)",
        info.bytes_current
    );
    let hints = rocgate::sim::hints::hints(&run, sim.config(), &rocgate::hints::Policy::default());
    assert!(
        hints
            .iter()
            .any(|h| h.rule == "raise_base_limit" && h.reason.contains("from about 1 client")),
        "{hints:#?}"
    );
    // The row's own fields (192 B: counts by reason, shadow ones too, the
    // route_limit's, the controller's readings), and a second's sketch spread over
    // its 10 slots (68 B, in a vector grown by doubling).
    assert!(row <= 192, "a row of {row} B");
    assert!(per_slot < row as f64 + 10.0, "{per_slot} B a slot");
}

/// A profile line of many fields is refused without holding a slice per field: one
/// line of 1 MiB of commas (the 32 MiB a profile may hold is 32 of them) held 16 B
/// of `&str` per comma, 16 MiB, in a vector that grew by doubling (a 30 MB line took
/// 786 MB resident to say `found 30000001 field(s)`). (helper-258)
#[test]
fn a_profile_line_of_many_fields_is_refused_in_bounded_memory() {
    use rocgate::sim::Profile;
    const COMMAS: usize = 1 << 20;
    let text = format!("0,5\n{}\n10,5\n", ",".repeat(COMMAS));
    let mut result = None;
    let parse = measure(|| result = Some(Profile::parse_csv(&text)));
    let message = result.expect("parsed").unwrap_err().to_string();
    assert_eq!(
        message,
        format!(
            "line 2: expected `t_seconds,rate`, found {} field(s)",
            COMMAS + 1
        )
    );
    assert!(
        parse.bytes_max < 64 * 1024,
        "{} B at the peak of parsing a line of {COMMAS} commas",
        parse.bytes_max
    );
}

/// A key of more than 80 parts is found at its line without holding a place per line
/// of the file: the bisection that finds it kept every line's end, 8 B a line, 15.7 MB
/// beside the parse (72.8 MB at the peak, where a syntax error at the same place takes
/// 57.1 MB) for a file of 1 MiB of blank lines. (helper-266, review)
#[test]
fn a_key_too_deep_is_placed_in_the_memory_of_a_syntax_error() {
    const ORDER: &str = "[[routes]]\nname = \"order\"\npath = \"/api/order\"\n";
    let deep = vec!["a"; 100].join(".");
    let blank = "\n".repeat(1 << 20);
    let peak = |tail: String, says: &str| {
        let text = format!("{ORDER}{blank}{tail}");
        let mut result = None;
        let info = measure(|| result = Some(Config::from_toml_str(&text, "t.toml").map(|_| ())));
        let message = result.expect("parsed").unwrap_err().to_string();
        assert!(message.starts_with(says), "{message}");
        info.bytes_max
    };
    let line = 3 + (1 << 20) + 1;
    let too_deep = peak(
        format!("{deep} = 1\n"),
        &format!("t.toml: line {line}: recursion limit"),
    );
    // The same length, a syntax error the parser places itself.
    let syntax = peak(
        format!("{} = \n", "b".repeat(deep.len())),
        &format!("t.toml: line {line}, column 203: "),
    );
    assert!(
        too_deep < syntax + (1 << 20),
        "{too_deep} B at the peak, {syntax} B for a syntax error"
    );
}
