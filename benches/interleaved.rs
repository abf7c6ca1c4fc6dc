//! rocgate's decision against governor's, interleaved: the ratios the performance
//! targets are stated in, measured so that machine drift cancels out.
//!
//! criterion measures one benchmark after another, and on this project's shared
//! machine the speed drifts by 20–30% over a minute, so a ratio of two criterion
//! medians taken a minute apart moves more than the effects being measured. Here each
//! round times rocgate and then governor (or governor first, every other round) on the
//! same loop of `ITERS` decisions; the ratio of a round compares two runs a few
//! milliseconds apart, and the figure reported is the median over `ROUNDS` rounds.
//!
//! Pairs (the like-for-like ones of `benches/check.rs`; both limiters admit at 2 × 10⁶/s
//! with a burst of `u32::MAX` tokens, or reject with 1/s after a burst of 1):
//! - `route`: `Engine::check` on one route, `now` given, against governor's direct
//!   limiter on `FakeRelativeClock` (an atomic load), admitting;
//! - `reject`: the same, rejecting;
//! - `keyed_10k`: a route partitioned by client IP against governor's keyed limiter
//!   (DashMap), keys cycling over 10,000 IPv4 addresses already present.
//!
//! Each decision is consumed as a caller does, by branching on it (`is_admit`,
//! `is_ok`), not passed whole to `black_box`: that would force each side's result
//! (rocgate's `Decision`, governor's `Result<(), NotUntil>`) through memory, which no
//! caller does.
//!
//! Run: `cargo bench --bench interleaved` (about 10 s). Prints, per pair, the median
//! ns per decision of each side and the median of the per-round ratios, with the
//! issue's target for the route-level check (≤ 1.5× governor).

use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use rocgate::clock::{Clock as _, MonotonicClock, Nanos};
use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key, RouteId};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

const ROUNDS: usize = 15;
const ITERS: u64 = 2_000_000;
const KEYS: u32 = 10_000;
const NOW: Nanos = Nanos::from_secs(1);
/// The admitting quota's rate, req/s.
const OPEN_RATE: f64 = 2_000_000.0;

/// The engine of one route, `bench`, and the route.
fn engine(rate_rps: f64, burst: Duration, partition: Partition) -> (Engine, RouteId) {
    let mut r = RouteConfig::new("bench", RouteMatch::any());
    r.controller.base_limit_rps = rate_rps;
    r.controller.cut_limit_rps = rate_rps;
    r.controller.danger_roc = f64::MAX;
    r.algorithm = rocgate::limiter::Algorithm::TokenBucket { burst };
    r.partition = partition;
    let e = Engine::new(&Config::new(vec![r]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let route = e.route_id("bench").unwrap();
    (e, route)
}

/// Admits at 2 × 10⁶/s (the most a token bucket is configured at) with a burst of
/// `u32::MAX` tokens (kept to the millisecond: 1,295 fewer), as governor's
/// [`open_quota`].
fn open_engine(partition: Partition) -> (Engine, RouteId) {
    let burst = Duration::from_secs_f64(f64::from(u32::MAX) / OPEN_RATE);
    engine(OPEN_RATE, burst, partition)
}

fn open_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(OPEN_RATE as u32).expect("non-zero"))
        .allow_burst(NonZeroU32::MAX)
}

/// Nanoseconds per call of `op` over `ITERS` calls.
fn time(mut op: impl FnMut(u64) -> bool) -> f64 {
    let clock = MonotonicClock::new();
    for i in 0..ITERS {
        black_box(op(i));
    }
    clock.now().as_u64() as f64 / ITERS as f64
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Times `ours` and `theirs` in alternation and prints the medians and the median of
/// the per-round ratios.
fn pair(name: &str, mut ours: impl FnMut(u64) -> bool, mut theirs: impl FnMut(u64) -> bool) {
    let (mut a, mut b, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (x, y) = if round % 2 == 0 {
            let x = time(&mut ours);
            (x, time(&mut theirs))
        } else {
            let y = time(&mut theirs);
            (time(&mut ours), y)
        };
        a.push(x);
        b.push(y);
        ratios.push(x / y);
    }
    println!(
        "{name:<10} rocgate {:>7.2} ns   governor {:>7.2} ns   ratio {:.2} (per-round ratios {:.2}–{:.2})",
        median(a),
        median(b),
        median(ratios.clone()),
        ratios.iter().copied().fold(f64::INFINITY, f64::min),
        ratios.iter().copied().fold(0.0, f64::max),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing and only
    // needs this to build.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    println!("median over {ROUNDS} interleaved rounds of {ITERS} decisions each:");

    let (e, route) = open_engine(Partition::Route);
    let g = RateLimiter::direct_with_clock(open_quota(), FakeRelativeClock::default());
    pair(
        "route",
        |_| e.check(route, Key::None, black_box(NOW)).is_admit(),
        |_| g.check().is_ok(),
    );

    let (e, route) = engine(1.0, Duration::from_secs(1), Partition::Route);
    assert!(e.check(route, Key::None, Nanos::ZERO).is_admit());
    let g = RateLimiter::direct_with_clock(
        Quota::per_second(NonZeroU32::MIN),
        FakeRelativeClock::default(),
    );
    assert!(g.check().is_ok());
    pair(
        "reject",
        |_| e.check(route, Key::None, black_box(NOW)).is_admit(),
        |_| g.check().is_ok(),
    );

    let ips: Vec<IpAddr> = (0..KEYS)
        .map(|k| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + k)))
        .collect();
    let (e, route) = open_engine(Partition::ClientIp({
        let mut v = KeyLimits::default();
        v.max_keys = KEYS as usize;
        v
    }));
    let g = RateLimiter::dashmap_with_clock(open_quota(), FakeRelativeClock::default());
    for ip in &ips {
        assert!(e.check(route, Key::Ip(*ip), Nanos::ZERO).is_admit());
        assert!(g.check_key(ip).is_ok());
    }
    let key = |i: u64| ips[(i % u64::from(KEYS)) as usize];
    pair(
        "keyed_10k",
        |i| e.check(route, Key::Ip(key(i)), black_box(NOW)).is_admit(),
        |i| g.check_key(&key(i)).is_ok(),
    );
    println!("target: route ratio <= 1.5");
}
