//! Long uptime on a virtual clock: what the engine does after hours, days and weeks,
//! after long silences and across the points where its counters wrap.

use rocgate::clock::Nanos;
use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::controller::ControllerState;
use rocgate::engine::{Engine, Key, RouteId};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

fn engine(routes: Vec<RouteConfig>) -> Engine {
    Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH)
}

/// Offers `rate` req/s evenly from `from` to `to` (seconds); returns those admitted.
fn offer(e: &Engine, id: RouteId, key: Key<'_>, from: f64, to: f64, rate: f64) -> u64 {
    let n = ((to - from) * rate).round() as u64;
    (0..n)
        .filter(|k| {
            let now = Nanos::from_secs_f64(from + *k as f64 / rate);
            e.check(id, key, now).is_admit()
        })
        .count() as u64
}

/// `n` requests at one instant; returns those admitted.
fn burst(e: &Engine, id: RouteId, key: Key<'_>, at: Nanos, n: u64) -> u64 {
    (0..n).filter(|_| e.check(id, key, at).is_admit()).count() as u64
}

/// The default route (base 200 req/s with a second of burst, cut 60), cut by a spike
/// from 40 to 600 req/s at 10 s, then left without a request.
fn cut_then_silent(partition: Partition) -> (Engine, RouteId) {
    let mut route = RouteConfig::new("order", RouteMatch::any());
    route.partition = partition;
    let e = engine(vec![route]);
    let id = RouteId(0);
    let key = Key::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    offer(&e, id, key, 0.0, 10.0, 40.0);
    offer(&e, id, key, 10.0, 11.0, 600.0);
    let s = e.route_snapshot(id, Nanos::from_secs(11));
    assert_eq!(s.state, ControllerState::Cut);
    (e, id)
}

#[test]
fn a_bucket_silent_since_a_cut_comes_back_full_at_the_base_limit() {
    // The cut ended (max_cut 60 s) and the limit climbed back to base long before the
    // next request, an hour later: by then the bucket has refilled at the base limit,
    // to its base capacity, not only to the cut's.
    for partition in [
        Partition::Route,
        Partition::ClientIp(KeyLimits {
            idle_timeout: Duration::from_secs(24 * 3600),
            ..KeyLimits::default()
        }),
    ] {
        let (e, id) = cut_then_silent(partition.clone());
        let key = Key::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let later = Nanos::from_secs(3600);
        let admitted = burst(&e, id, key, later, 300);
        let s = e.route_snapshot(id, later);
        assert_eq!(s.state, ControllerState::Normal, "{partition:?}");
        assert_eq!(admitted, 200, "{partition:?}");
    }
}
