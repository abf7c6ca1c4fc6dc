//! What the tests of a partitioned route's `route_limit` share (tests/route_limit.rs,
//! tests/route_limit_share.rs): an engine on a virtual clock from time zero, client IP
//! keys, a keyed route with a total, one client's spike that cuts it, an engine reloaded
//! to one route, and the total as its snapshot shows it.

use rocgate::clock::Nanos;
use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key, RouteId, RouteLimitSnapshot};
use rocgate::limiter::Algorithm;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

/// An engine of `routes`, built at time zero.
pub(crate) fn engine(routes: Vec<RouteConfig>) -> Engine {
    Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// The client IP key `10.0.0.0 + n`.
pub(crate) fn ip(n: u32) -> Key<'static> {
    Key::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
}

/// A route keyed by client IP at `per_key` req/s each (a cut to a fifth of it), its
/// keys together at `total` req/s, both with a burst of one second.
pub(crate) fn keyed(per_key: f64, total: f64) -> RouteConfig {
    let mut cfg = RouteConfig::new("ip", RouteMatch::any());
    cfg.partition = Partition::ClientIp(KeyLimits::default());
    cfg.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(1),
    };
    cfg.controller.base_limit_rps = per_key;
    cfg.controller.cut_limit_rps = per_key / 5.0;
    cfg.route_limit_rps = Some(total);
    cfg
}

/// One client's calm 40 req/s for 10 s, then its spike of 600 req/s for 1 s, all on
/// route `id`: enough to cut a route of the default controller by 11 s.
pub(crate) fn calm_then_spike(e: &Engine, id: RouteId) {
    for k in 0..400u64 {
        let _ = e.check(id, ip(1), Nanos::from_millis(k * 25));
    }
    for k in 0..600u64 {
        let _ = e.check(id, ip(1), Nanos::new(10_000_000_000 + k * 1_666_666));
    }
}

/// `e` reloaded at `now` to the one route `route`, and that route's id.
pub(crate) fn reloaded(e: &Engine, route: RouteConfig, now: Nanos) -> (Engine, RouteId) {
    let e = e
        .reload(&Config::new(vec![route]), now, SystemTime::UNIX_EPOCH)
        .unwrap();
    let id = e.route_at(0).unwrap();
    (e, id)
}

/// The route's total as its snapshot shows it at `now`.
pub(crate) fn total(e: &Engine, id: RouteId, now: Nanos) -> RouteLimitSnapshot {
    e.route_snapshot(id, now).unwrap().route_limit.unwrap()
}
