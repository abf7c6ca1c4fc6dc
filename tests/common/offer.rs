//! Even traffic offered straight to an engine on a virtual clock, which the soak and
//! the example-config tests share.

use rocgate::clock::Nanos;
use rocgate::engine::{Engine, Key, RouteId};

/// Offers `rate` req/s evenly from `from` to `to` (seconds); returns those admitted.
pub(crate) fn offer(e: &Engine, id: RouteId, key: Key<'_>, from: f64, to: f64, rate: f64) -> u64 {
    let n = ((to - from) * rate).round() as u64;
    (0..n)
        .filter(|k| {
            let now = Nanos::from_secs_f64(from + *k as f64 / rate);
            e.check(id, key, now).is_admit()
        })
        .count() as u64
}
