//! The shipped example configurations do what their comments say: each file under
//! `config/examples/` run through the engine on the virtual clock, its main claims
//! asserted (a tier's limits, cut and not; one client held while another is served;
//! each algorithm's limit; a relative threshold that takes doubling, whatever the
//! volume; a scheduled event's profile in force for its time; shadow modes counting
//! what enforcing would reject). The flash-sale example's claims are
//! `tests/scenarios.rs`'; the Redis example's, which need a Redis server,
//! `tests/redis_store.rs`' (`the_redis_example_shares_the_routes_its_comments_say`).

use rocgate::clock::Nanos;
use rocgate::config::Config;
use rocgate::controller::ControllerState;
use rocgate::engine::{Engine, Key, RouteId};
use rocgate::limiter::{Admit, Decision, Reason};
use rocgate::sim::{ArrivalModel, Profile, Scenario, SimResult, Simulator};
use std::net::IpAddr;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[path = "common/offer.rs"]
mod offer;
use offer::offer;

/// `config/examples/NAME`, as `rocgate` loads it.
fn example(name: &str) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/examples")
        .join(name);
    Config::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// An engine of the example `name`, started at 0 s, the epoch its wall time.
fn engine(name: &str) -> Engine {
    Engine::new(&example(name), Nanos::ZERO, UNIX_EPOCH).unwrap()
}

/// The route `method path` takes.
fn route(e: &Engine, method: &str, path: &str) -> RouteId {
    e.route_for(method, path)
        .unwrap_or_else(|| panic!("no route takes {method} {path}"))
}

/// How many of `n` requests with `key` at the one instant `at` are admitted, each
/// decision dropped at once.
fn at_once(e: &Engine, id: RouteId, key: Key<'_>, n: usize, at: f64) -> usize {
    let at = Nanos::from_secs_f64(at);
    (0..n).filter(|_| e.check(id, key, at).is_admit()).count()
}

fn ip(text: &str) -> Key<'static> {
    Key::Ip(text.parse::<IpAddr>().unwrap())
}

fn state(e: &Engine, id: RouteId, at: f64) -> (ControllerState, f64) {
    let s = e.route_snapshot(id, Nanos::from_secs_f64(at)).unwrap();
    (s.state, s.limit_rps)
}

/// api-keys-tiers.toml: each key gets the route's 50 req/s, the `vip` keys 10 times
/// that, the `batch` key 10 req/s; requests without the header share one key at the
/// route's limits. In a cut, every key moves to its tier's cut limit: `vip` 250
/// (cut less deeply than the route's 15), `batch` stays at 10.
#[test]
fn api_keys_tiers_gives_each_tier_its_limits_cut_or_not() {
    let e = engine("api-keys-tiers.toml");
    let search = route(&e, "GET", "/api/search");
    // A full bucket of a second of each key's limit, at once.
    let keys = [
        ("key-acme-prod", 500),
        ("key-globex-prod", 500),
        ("key-someone", 50),
        ("", 50),
        ("key-nightly-export", 10),
    ];
    for (key, limit) in keys {
        let got = at_once(&e, search, Key::Value(key), 1000, 1.0);
        assert_eq!(got, limit, "key {key:?}");
    }
    assert_eq!(at_once(&e, search, Key::None, 1000, 1.0), 50, "no header");
    // The items route's vip tier: 1,000 against 100.
    let items = route(&e, "GET", "/api/items/7");
    assert_eq!(
        at_once(&e, items, Key::Value("key-acme-prod"), 2000, 1.0),
        1000
    );
    assert_eq!(
        at_once(&e, items, Key::Value("key-someone"), 2000, 1.0),
        100
    );

    // The route's whole demand, past its first window, jumps by 3,000 req/s: a ROC of
    // 1,000 in a second, above 600, whichever keys send it.
    offer(&e, search, Key::Value("key-spike"), 10.0, 11.0, 3000.0);
    assert_eq!(state(&e, search, 11.0), (ControllerState::Cut, 15.0));
    // Each key drained, then a second of refill at its tier's cut limit.
    let keys = [
        ("key-acme-prod", 250),
        ("key-someone", 15),
        ("key-nightly-export", 10),
    ];
    for (key, cut) in keys {
        at_once(&e, search, Key::Value(key), 1000, 11.0);
        let got = offer(&e, search, Key::Value(key), 11.0, 12.0, 2000.0);
        assert!(
            got.abs_diff(cut) <= 1,
            "key {key:?}: {got} in a cut of {cut}"
        );
    }
    assert_eq!(state(&e, search, 12.0).0, ControllerState::Cut);
}

/// api-keys-tiers.toml: "header names are case-insensitive": the file's routes keyed
/// by `header:X-API-Key` are keyed as by its `header:x-api-key`, the lower-case name
/// the header is looked up by (an HTTP header map's names are lower case).
#[test]
fn api_keys_tiers_header_name_is_case_insensitive() {
    use rocgate::config::Partition;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/examples/api-keys-tiers.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches("\"header:x-api-key\"").count(), 2);
    let written = example("api-keys-tiers.toml");
    let upper = Config::from_toml_str(
        &text.replace("\"header:x-api-key\"", "\"header:X-API-Key\""),
        "api-keys-tiers.toml",
    )
    .unwrap();
    for (w, u) in written.routes.iter().zip(&upper.routes) {
        let Partition::Header(name, _) = &w.partition else {
            panic!("{} is keyed by a header", w.name);
        };
        assert_eq!(name, "x-api-key");
        assert_eq!(u.partition, w.partition, "{}", w.name);
    }
    assert_eq!(upper.routes.len(), 2);
}

/// api-keys-tiers.toml: a paying customer that starts at its tier's full rate from a
/// quiet route is no spike: it gets its limit, and nobody is cut. With a `danger_roc`
/// below a `vip` key's base limit (400 against 500), one such key starting at 480 req/s
/// cut the route within 2 s: itself to 250 req/s, every other key to 15, for 12 s.
#[test]
fn api_keys_tiers_lets_a_vip_key_start_at_its_limit() {
    let e = engine("api-keys-tiers.toml");
    let evenly = |key: &'static str, rate: f64| {
        (0..(20.0 * rate) as u32).map(move |k| (10.0 + f64::from(k) / rate, key))
    };
    for (path, vip, other) in [("/api/search", 480.0, 20.0), ("/api/items/7", 980.0, 50.0)] {
        let id = route(&e, "GET", path);
        offer(&e, id, Key::Value("key-someone"), 0.0, 10.0, other);
        // 20 s of the vip key's requests and the other key's, in time order.
        let mut arrivals: Vec<(f64, &str)> = evenly("key-acme-prod", vip)
            .chain(evenly("key-someone", other))
            .collect();
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (t, key) in arrivals {
            let d = e.check(id, Key::Value(key), Nanos::from_secs_f64(t));
            assert!(d.is_admit(), "{path}: {key} refused at {t} s: {d:?}");
        }
        assert_eq!(e.route_snapshot(id, Nanos::from_secs(30)).unwrap().cuts, 0);
    }
}

/// per-ip.toml: a client flooding the login route is held to 5 req/s, and the API to
/// 20, while another client at its own pace is served whole; an IPv6 client rotating
/// addresses inside its /64 is one client; the API's clients together are held to
/// its `route_limit`.
#[test]
fn per_ip_holds_one_client_while_another_is_served() {
    let e = engine("per-ip.toml");
    for (path, method, limit, flood) in [
        ("/api/login", "POST", 5u64, 30.0),
        ("/api/items", "GET", 20, 100.0),
    ] {
        let id = route(&e, method, path);
        let (flooder, other) = (ip("203.0.113.7"), ip("198.51.100.9"));
        // 20 s of a flood and of a client at 2 req/s, interleaved in time.
        let (mut held, mut served) = (0, 0);
        for s in 0..20 {
            let s = f64::from(s);
            held += offer(&e, id, flooder, s, s + 0.5, flood);
            served += offer(&e, id, other, s + 0.5, s + 1.0, 4.0);
        }
        // A full bucket (a second of the limit), then the limit every second.
        // Its bucket (a second of the limit), then the limit for the 19.5 s it sent in.
        assert!(
            held.abs_diff(limit * 41 / 2) <= 1,
            "{path}: the flooder got {held} at {limit} req/s"
        );
        assert_eq!(served, 40, "{path}: the other client");
        assert_eq!(state(&e, id, 20.0).0, ControllerState::Normal, "{path}");
    }
    let login = route(&e, "POST", "/api/login");
    let rotated = (1..=100)
        .filter(|n| {
            let key = ip(&format!("2001:db8:0:1::{n:x}"));
            e.check(login, key, Nanos::from_secs(30)).is_admit()
        })
        .count();
    assert_eq!(rotated, 5, "a /64 is one client");
    assert_eq!(at_once(&e, login, ip("2001:db8:0:2::1"), 100, 30.0), 5);
    // The API's clients together are held to its route_limit: 3,000 clients at once,
    // each within its own 20 req/s, have a second of the 2,000 req/s admitted.
    let api = route(&e, "GET", "/api/items");
    let together = (0..3000u32)
        .filter(|n| {
            let key = ip(&std::net::Ipv4Addr::from(0x0a00_0000 + n).to_string());
            e.check(api, key, Nanos::from_secs(40)).is_admit()
        })
        .count();
    assert_eq!(together, 2000, "the API's clients together");
}

/// algorithms.toml: each algorithm enforces the limit its comment gives.
#[test]
fn algorithms_each_enforce_their_limit() {
    let e = engine("algorithms.toml");
    // Token bucket, burst 2 s: up to 400 at once at 200 req/s.
    let token = route(&e, "GET", "/api/token");
    assert_eq!(at_once(&e, token, Key::None, 1000, 0.5), 400);
    // Fixed window of 10 s: 2,000 requests per window.
    let fixed = route(&e, "GET", "/api/fixed");
    assert_eq!(offer(&e, fixed, Key::None, 0.0, 10.0, 1000.0), 2000);
    assert_eq!(offer(&e, fixed, Key::None, 10.0, 20.0, 1000.0), 2000);
    // Sliding window of 1 s: traffic spread over the windows gets the limit in any
    // second, within a request, where a fixed window would let two quotas across an
    // edge...
    let sliding = route(&e, "GET", "/api/sliding");
    let mut admitted_at = Vec::new();
    for k in 0..5000 {
        let t = f64::from(k) / 1000.0;
        if e.check(sliding, Key::None, Nanos::from_secs_f64(t))
            .is_admit()
        {
            admitted_at.push(t);
        }
    }
    for (i, &t) in admitted_at.iter().enumerate() {
        let in_a_second = admitted_at[i..]
            .iter()
            .take_while(|&&u| u < t + 1.0)
            .count();
        assert!(
            in_a_second <= 201,
            "{in_a_second} admitted in 1 s from {t} s"
        );
    }
    // ... but a quota spent at the very end of one window weighs almost nothing once
    // the next is well under way: nearly two quotas in one window's length.
    let fresh = engine("algorithms.toml");
    let edge = route(&fresh, "GET", "/api/sliding");
    assert_eq!(at_once(&fresh, edge, Key::None, 1000, 0.999), 200);
    let next = offer(&fresh, edge, Key::None, 1.0, 1.999, 1000.0);
    assert!((190..200).contains(&next), "{next}");
    // Leaky bucket, queue 50: one goes now and 50 wait, the last 50 intervals (250 ms).
    let leaky = route(&e, "GET", "/api/leaky");
    let at = Nanos::from_secs(1);
    let waits: Vec<Duration> = (0..100)
        .filter_map(|_| match e.check(leaky, Key::None, at) {
            Decision::Admit(Admit::Paced(p)) => Some(p.wait(at)),
            Decision::Admit(_) => Some(Duration::ZERO),
            Decision::Reject(r) => {
                assert_eq!(r.reason, Reason::QueueFull);
                None
            }
        })
        .collect();
    assert_eq!(waits.len(), 51);
    assert_eq!(waits.iter().max(), Some(&Duration::from_millis(250)));
    // Concurrency: 64 in flight, 10 more waiting for a permit, the rest refused.
    let upload = route(&e, "POST", "/api/upload");
    let decisions: Vec<Decision> = (0..100)
        .map(|_| e.check(upload, Key::None, Nanos::from_secs(1)))
        .collect();
    let count = |f: fn(&Decision) -> bool| decisions.iter().filter(|d| f(d)).count();
    assert_eq!(count(|d| matches!(d, Decision::Admit(Admit::Held(_)))), 64);
    assert_eq!(
        count(|d| matches!(d, Decision::Admit(Admit::Queued(_)))),
        10
    );
    assert_eq!(
        count(|d| matches!(d, Decision::Reject(r) if r.reason == Reason::QueueFull)),
        26
    );
}

/// A run of `route` of the example `name` over the profile `points`, evenly spaced.
fn simulate(name: &str, route: &str, points: &[(f64, f64)], start: SystemTime) -> SimResult {
    Simulator::new(example(name), Some(route))
        .unwrap()
        .wall_start(start)
        .run_profile(
            &Profile::from_points(points).unwrap(),
            ArrivalModel::Uniform,
        )
        .unwrap()
}

/// A step from `from` to `to` req/s at 30 s, held 30 s.
fn step(from: f64, to: f64) -> [(f64, f64); 4] {
    [(0.0, from), (30.0, from), (30.0, to), (60.0, to)]
}

/// relative-roc.toml: one threshold, "demand more than doubles", cuts a small route
/// and a busy one alike; growing by 90% cuts neither, a doubling from a trickle does
/// not cut the busy route (its min_rps of 100), and the warm-up ramp cuts neither; a
/// climb from silence reads against min_rps.
#[test]
fn relative_roc_cuts_a_doubling_at_any_volume() {
    let cuts = |route: &str, points: &[(f64, f64)]| {
        simulate("relative-roc.toml", route, points, UNIX_EPOCH)
            .summary
            .cuts
            .len()
    };
    assert_eq!(cuts("order", &step(20.0, 45.0)), 1);
    assert_eq!(cuts("catalog", &step(2000.0, 4500.0)), 1);
    assert_eq!(cuts("order", &step(20.0, 38.0)), 0);
    assert_eq!(cuts("catalog", &step(2000.0, 3800.0)), 0);
    assert_eq!(cuts("catalog", &step(20.0, 45.0)), 0);
    // From silence the earlier half counts as min_rps: a climb from 0 to 200 req/s in
    // a minute is cut at about 24 req/s, under the cut limit, so nothing is refused.
    let from_silence = simulate(
        "relative-roc.toml",
        "order",
        &[(0.0, 0.0), (60.0, 200.0)],
        UNIX_EPOCH,
    );
    let s = &from_silence.summary;
    assert_eq!((s.cuts.len(), s.rejected), (1, 0), "{:?}", s.cuts);
    assert!((7.0..7.5).contains(&s.cuts[0].t_s), "{:?}", s.cuts);
    let warm_up = Scenario::Warmup.profile();
    for route in ["order", "catalog"] {
        let r = Simulator::new(example("relative-roc.toml"), Some(route))
            .unwrap()
            .run_profile(&warm_up, ArrivalModel::Uniform)
            .unwrap();
        assert!(r.summary.cuts.is_empty(), "{route}: {:?}", r.summary.cuts);
    }
}

/// scheduled-event.toml: from 2027-11-26T20:00:00Z for 30 min Black Friday's profile
/// is in force (limits 400 and 150, danger 60, hold 5 s, steps of 25); a step from 40
/// to 600 req/s ten seconds in is cut to 150, restores 5 s after ROC is calm, and
/// climbs back to 400 by 25 req/s a second. Cyber Monday only raises the base limit.
#[test]
fn scheduled_event_runs_black_friday_for_its_half_hour() {
    let at = |rfc3339: &str| humantime::parse_rfc3339(rfc3339).unwrap();
    // 30 s before the event, then a sale 10 s into it.
    let sale = [(0.0, 40.0), (40.0, 40.0), (40.0, 600.0), (70.0, 600.0)];
    let r = simulate(
        "scheduled-event.toml",
        "order",
        &sale,
        at("2027-11-26T19:59:30Z"),
    );
    let row = |t: f64| {
        let slot = r.series.iter().find(|s| (s.t_s - t).abs() < 1e-9).unwrap();
        (slot.base_limit_rps, slot.danger_roc)
    };
    assert_eq!(row(29.9), (200.0, 80.0), "before the event");
    assert_eq!(row(30.0), (400.0, 60.0), "from its start");
    let cuts = &r.summary.cuts;
    assert_eq!(cuts.len(), 1, "{cuts:?}");
    assert_eq!((cuts[0].t_s, cuts[0].limit_rps), (40.4, 150.0));
    let t = &r.summary.transitions;
    let recovering = t
        .iter()
        .find(|x| x.to == ControllerState::Recovering)
        .unwrap();
    let normal = t.iter().find(|x| x.to == ControllerState::Normal).unwrap();
    // (400 − 150) / 25 = 10 steps a second apart.
    assert!((normal.t_s - recovering.t_s - 10.0).abs() < 1e-9, "{t:?}");

    // The event ends at 20:30:00; Cyber Monday starts at 18:00:00 and sets the base
    // limit alone.
    let steady = [(0.0, 40.0), (20.0, 40.0)];
    let r = simulate(
        "scheduled-event.toml",
        "order",
        &steady,
        at("2027-11-26T20:29:50Z"),
    );
    let limits = |r: &SimResult, t: f64| {
        let s = r.series.iter().find(|s| (s.t_s - t).abs() < 1e-9).unwrap();
        (s.base_limit_rps, s.danger_roc, s.safe_roc)
    };
    assert_eq!(limits(&r, 9.9), (400.0, 60.0, 15.0));
    assert_eq!(limits(&r, 10.0), (200.0, 80.0, 20.0));
    let r = simulate(
        "scheduled-event.toml",
        "order",
        &steady,
        at("2027-11-29T17:59:50Z"),
    );
    assert_eq!(limits(&r, 9.9), (200.0, 80.0, 20.0));
    assert_eq!(limits(&r, 10.0), (300.0, 80.0, 20.0));
}

/// shadow.toml: on the flash sale, `checkout` (shadow) admits everything and counts
/// what `order`, the same limits enforced, rejects; `cart` (shadow_adaptive) rejects
/// by its base limit alone and counts what its cut would have rejected on top.
#[test]
fn shadow_counts_what_enforcing_would_reject() {
    let run = |route: &str| {
        Simulator::new(example("shadow.toml"), Some(route))
            .unwrap()
            .run_profile(&Scenario::FlashSale.profile(), ArrivalModel::Uniform)
            .unwrap()
            .summary
    };
    let (checkout, order) = (run("checkout"), run("order"));
    assert_eq!(checkout.admitted, checkout.offered);
    assert!(order.rejected > 0);
    assert_eq!(checkout.shadow_rejected, order.rejected);
    assert_eq!(checkout.shadow_rejected_by_reason, order.rejected_by_reason);
    let cart = run("cart");
    assert_eq!(cart.cuts.len(), 1);
    assert_eq!(cart.rejected, cart.rejected_by_reason.limit);
    assert!(cart.shadow_rejected > 0);
    assert_eq!(cart.shadow_rejected, cart.shadow_rejected_by_reason.roc_cut);
}
