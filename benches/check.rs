//! The cost of one admission decision, beside governor and a naive baseline, in one
//! criterion run so that ratios compare runs made under the same machine noise.
//!
//! Groups (each benchmark is one decision; criterion reports time per decision):
//!
//! - `primitives`: what the decisions below are made of, measured in the same run:
//!   one time read (rocgate's `MonotonicClock`, a quanta TSC read less its origin;
//!   `Instant::now()`, governor's std clock; governor's default `QuantaClock`, the
//!   same TSC read) and one uncontended atomic `fetch_add`.
//! - `route`: `Engine::check` on one route with no partition (token bucket, never
//!   rejecting), against governor's direct limiter with the same GCRA parameters.
//! - `route_2_threads`: the same, with two threads hammering the same route or
//!   limiter. The time is per decision *as each thread sees it* while the other thread
//!   runs (the slower thread's wall time over its `iters` decisions): the two threads
//!   together decide twice as often as that.
//! - `keyed_10k`: a route partitioned by client IP, keys cycling over 10,000 IPv4
//!   addresses, all present before measuring; against governor's keyed limiter
//!   (DashMap store) over the same keys. Key insertion is not measured.
//!   `rocgate/given_now/route_limit`: the same route with a `route_limit` over its
//!   keys together (at the same rate and burst, never refusing): what the total's
//!   token bucket adds to a keyed decision.
//! - `reject`: the rejecting path (bucket empty): under a spike most requests take it.
//! - `concurrency`: `Engine::check` on a route limited by `concurrency` (no queue),
//!   rocgate alone: an admission whose permit is dropped at once (`admit_release`),
//!   and a refusal with every permit held (`reject`); each also as the tower layer
//!   has it, the permit timed on a monotonic clock (`timed_monotonic`), and refused
//!   with a mean hold known (`hold_timed`).
//! - `retry_after`: what telling a `roc_cut` refusal its `Retry-After` costs, on a
//!   route cut (default window, 6 s of 100 ms slots; a hold and `max_cut` of a day,
//!   so that it stays cut), with no scheduled event and with 3 ahead of its raise,
//!   each a profile of its own (a longer hold): `refusal`, one refused decision and
//!   `Engine::restore_eta` read for it (a load of what the last step published); and
//!   `step`, the step that publishes it, once a slot (`Engine::catch_up` to the next
//!   slot's end: the window's roll, the controller's step, and the raise told from
//!   the window's readings of a spike that holds its level, then walked through the
//!   events' edges), each measured on a fresh route, 100 ms of virtual time a call.
//! - `header_keys`: a route partitioned by a header, keys cycling over 1,000 values
//!   of 8 bytes (kept whole as keys), 32 bytes (an API key) and 1,024 bytes (a JWT),
//!   the two longer ones keyed by their SHA-256: what the digest adds to a decision.
//! - `occupancy_1000rps`: the textbook sliding window log (`Mutex<VecDeque<Nanos>>`,
//!   timestamps older than the window evicted on each call) against the engine, both
//!   on a virtual clock advancing 1 ms per call, so the log holds ~1,000 timestamps of
//!   its 1 s window in steady state; on 1 thread, then on 2 threads sharing the
//!   virtual clock (a contended `fetch_add`, also measured alone), and on 2 threads
//!   with a virtual clock each (as in `window_1000rps` below).
//! - `window_1000rps`: the demand meter alone, the part of a decision that the target
//!   "≥ 10× the timestamp queue" is about: rocgate's slotted window (a rollover check
//!   and a count on the thread's lane; at each 100 ms slot's end, the rollover) against
//!   the textbook sliding window as a meter (`Mutex<VecDeque<Nanos>>` of every arrival,
//!   evicted past the window; at each slot's end, the half-window counts by binary
//!   search). Default window (6 s of 100 ms slots), 1 ms of virtual time per call, so
//!   the queue holds ~6,000 timestamps. On 1 thread; on 2 threads sharing the virtual
//!   clock; and on 2 threads with a virtual clock each (no shared write but the
//!   meter's own), fresh meters for each batch. Those clocks are kept within 2 s of
//!   each other (a thread that runs ahead waits), so the queue stays about a window
//!   long (checked before measuring); a meter decides nothing from the order of
//!   arrivals, and the queue still pushes and evicts each timestamp once.
//!
//! Clock fairness. governor reads its clock inside `check`; rocgate takes `now` as an
//! argument and its adapters read the clock once per request. So `route`,
//! `route_2_threads`, `keyed_10k` and `reject` each measure rocgate twice,
//! `given_now` (time passed in) and `monotonic_clock` (`MonotonicClock::now()` read
//! per call), and governor three times: `fake_clock` (`FakeRelativeClock`, an atomic
//! load), `std_clock` (`Instant::now()`) and `quanta_clock` (its default). The
//! like-for-like pairs are `given_now` ↔ `fake_clock` (the algorithm and its state,
//! no real clock) and `monotonic_clock` ↔ `quanta_clock` (the same quanta TSC read
//! inside: governor as shipped); `std_clock` shows what `Instant::now()` would cost.
//!
//! Both limiters admit at 2 × 10⁶/s (the most rocgate's configuration takes for a
//! token bucket, [`MAX_SPACED_RATE`](rocgate::limiter::MAX_SPACED_RATE)) with a burst
//! of `u32::MAX` tokens (emission interval 500 ns, tolerance ≈ 2147 s): with a fixed
//! `now` each decision takes one token, so neither empties in a run (of fewer than
//! 4.29 × 10⁹ decisions). rocgate's controller never cuts here
//! (`danger_roc` is `f64::MAX`), but its window still counts every request and rolls
//! over at each 100 ms slot of the clock in use (never, with a fixed `now`).
//!
//! Run with bounded times: `scripts/bench.sh`, or
//! `cargo bench --bench check -- --warm-up-time 1 --measurement-time 3`.

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use governor::clock::{Clock as _, FakeRelativeClock, QuantaClock};
use governor::{Quota, RateLimiter};
use rocgate::clock::{Clock as _, MonotonicClock, Nanos};
use rocgate::config::{Config, Event, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key, RouteId};
use rocgate::limiter::{Admit, Algorithm, Decision, HoldClock};
use rocgate::window::{SlotCounter, SlotRing, WindowSpec};
use std::collections::VecDeque;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, SystemTime};

/// Admitting limiters: one token per 500 ns, the most a token bucket is configured at.
const RATE: u32 = 2_000_000;
/// Admitting limiters: tokens in a full bucket (a tolerance of ≈ 2147 s).
const BURST: u32 = u32::MAX;
/// Keys on the partitioned route.
const KEYS: u32 = 10_000;
/// The time passed to `check` in the `given_now` benchmarks.
const NOW: Nanos = Nanos::from_secs(1);
/// Virtual time between two calls in `occupancy_1000rps`.
const STEP_NS: u64 = 1_000_000;
/// Limit of the `occupancy_1000rps` limiters, twice the offered rate.
const OCCUPANCY_LIMIT: u32 = 2_000;

/// The one route of the engines below.
fn bench_route(e: &Engine) -> RouteId {
    e.route_id("bench").unwrap()
}

/// One route taking every request, limited at `rate_rps` with a burst of `burst`, whose
/// controller never cuts.
fn route_config(rate_rps: u32, burst: Duration, partition: Partition) -> RouteConfig {
    let mut r = RouteConfig::new("bench", RouteMatch::any());
    r.controller.base_limit_rps = f64::from(rate_rps);
    r.controller.cut_limit_rps = f64::from(rate_rps);
    r.controller.danger_roc = f64::MAX;
    r.algorithm = Algorithm::TokenBucket { burst };
    r.partition = partition;
    r
}

/// The engine of [`route_config`]'s route.
fn route(rate_rps: u32, burst: Duration, partition: Partition) -> Engine {
    engine_of(route_config(rate_rps, burst, partition))
}

fn engine_of(r: RouteConfig) -> Engine {
    Engine::new(&Config::new(vec![r]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// The burst of [`open_quota`] (kept to the millisecond: 1,295 tokens fewer).
fn open_burst() -> Duration {
    Duration::from_secs_f64(f64::from(BURST) / f64::from(RATE))
}

/// rocgate with the same GCRA parameters as [`open_quota`].
fn open_engine(partition: Partition) -> Engine {
    route(RATE, open_burst(), partition)
}

/// [`open_engine`] with a `route_limit` over the keys together at the same rate and
/// burst, which never empties in a run either: the keyed decision and the total's.
fn open_engine_with_total(partition: Partition) -> Engine {
    let mut r = route_config(RATE, open_burst(), partition);
    r.route_limit_rps = Some(f64::from(RATE));
    engine_of(r)
}

fn open_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(RATE).unwrap()).allow_burst(NonZeroU32::new(BURST).unwrap())
}

/// A 1 req/s limit with a burst of one, already spent.
fn empty_engine() -> Engine {
    let e = route(1, Duration::from_secs(1), Partition::Route);
    assert!(e.check(bench_route(&e), Key::None, Nanos::ZERO).is_admit());
    e
}

fn one_per_second() -> Quota {
    Quota::per_second(NonZeroU32::MIN)
}

fn ips() -> Vec<IpAddr> {
    (0..KEYS)
        .map(|k| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + k)))
        .collect()
}

/// Runs `op(thread, i)` for `i` in `0..iters` on each of two threads started together
/// and returns the slower thread's time, measured inside the threads (thread start-up
/// is not counted).
fn on_two_threads<R>(iters: u64, op: impl Fn(u64, u64) -> R + Sync) -> Duration {
    let barrier = Barrier::new(2);
    let clock = MonotonicClock::new();
    std::thread::scope(|s| {
        let threads: Vec<_> = (0..2)
            .map(|thread| {
                let (barrier, op, clock) = (&barrier, &op, &clock);
                s.spawn(move || {
                    barrier.wait();
                    let start = clock.now();
                    for i in 0..iters {
                        black_box(op(thread, i));
                    }
                    clock.now().saturating_since(start)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("benchmark thread panicked"))
            .max()
            .expect("two threads")
    })
}

fn primitives(c: &mut Criterion) {
    let mut g = c.benchmark_group("primitives");
    let ours = MonotonicClock::new();
    g.bench_function("rocgate_monotonic", |b| b.iter(|| ours.now()));
    let std_clock = governor::clock::MonotonicClock;
    g.bench_function("std_instant", |b| b.iter(|| std_clock.now()));
    let quanta = QuantaClock::default();
    g.bench_function("quanta", |b| b.iter(|| quanta.now()));
    let counter = AtomicU64::new(0);
    g.bench_function("fetch_add", |b| {
        b.iter(|| counter.fetch_add(1, Ordering::Relaxed))
    });
    g.finish();
}

/// rocgate's two variants: `now` passed in, and `MonotonicClock::now()` read per call.
/// Each gets a fresh engine from `engine`; `check` decides one request at a time on
/// the engine's route.
fn rocgate_variants<R>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    engine: impl Fn() -> Engine,
    mut check: impl FnMut(&Engine, RouteId, Nanos) -> R,
) {
    let e = engine();
    let route = bench_route(&e);
    g.bench_function("rocgate/given_now", |b| {
        b.iter(|| check(&e, route, black_box(NOW)))
    });
    let e = engine();
    let route = bench_route(&e);
    let clock = MonotonicClock::new();
    g.bench_function("rocgate/monotonic_clock", |b| {
        b.iter(|| check(&e, route, clock.now()))
    });
}

/// governor's three variants, one per clock: `|clock| build` makes a limiter for a
/// clock, `|lim| check` decides one request. (A macro because each clock makes a
/// limiter of another type, and a closure cannot be generic.)
macro_rules! governor_variants {
    ($g:expr, |$clock:ident| $build:expr, |$lim:ident| $check:expr) => {{
        let g: &mut BenchmarkGroup<'_, WallTime> = $g;
        let $clock = FakeRelativeClock::default();
        let $lim = $build;
        g.bench_function("governor/fake_clock", |b| b.iter(|| $check));
        let $clock = governor::clock::MonotonicClock;
        let $lim = $build;
        g.bench_function("governor/std_clock", |b| b.iter(|| $check));
        let $clock = QuantaClock::default();
        let $lim = $build;
        g.bench_function("governor/quanta_clock", |b| b.iter(|| $check));
    }};
}

fn route_level(c: &mut Criterion) {
    let mut g = c.benchmark_group("route");
    rocgate_variants(
        &mut g,
        || open_engine(Partition::Route),
        |e, route, now| e.check(route, Key::None, now),
    );
    governor_variants!(
        &mut g,
        |clock| RateLimiter::direct_with_clock(open_quota(), clock),
        |lim| lim.check()
    );
    g.finish();
}

fn reject(c: &mut Criterion) {
    let mut g = c.benchmark_group("reject");
    rocgate_variants(&mut g, empty_engine, |e, route, now| {
        e.check(route, Key::None, now)
    });
    governor_variants!(
        &mut g,
        |clock| {
            let lim = RateLimiter::direct_with_clock(one_per_second(), clock);
            assert!(lim.check().is_ok());
            lim
        },
        |lim| lim.check()
    );
    g.finish();
}

/// One route limited by `concurrency` to `limit` requests in flight, no queue, whose
/// controller never cuts.
fn concurrency_engine(limit: f64) -> Engine {
    let mut r = RouteConfig::new("bench", RouteMatch::any());
    r.controller.base_limit_rps = limit;
    r.controller.cut_limit_rps = limit;
    r.controller.danger_roc = f64::MAX;
    r.algorithm = Algorithm::Concurrency { queue: 0 };
    Engine::new(&Config::new(vec![r]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

fn concurrency(c: &mut Criterion) {
    let mut g = c.benchmark_group("concurrency");
    let e = concurrency_engine(1.0);
    let route = bench_route(&e);
    g.bench_function("admit_release/given_now", |b| {
        b.iter(|| e.check(route, Key::None, black_box(NOW)));
    });
    let held = e.check(route, Key::None, NOW);
    assert!(held.is_admit());
    g.bench_function("reject/given_now", |b| {
        b.iter(|| e.check(route, Key::None, black_box(NOW)));
    });
    drop(held);
    // Timed, as the tower layer times every permit it hands on: the hold clock's
    // `Arc` taken and given back, and the clock read at release. Then refused with a
    // mean hold known, which the refusal's wait is computed from (on an engine of
    // its own: refused above, no hold has been timed).
    let e = concurrency_engine(1.0);
    let route = bench_route(&e);
    let on = std::sync::Arc::new(HoldClock::new(std::sync::Arc::new(MonotonicClock::new())));
    g.bench_function("admit_release/timed_monotonic", |b| {
        b.iter(|| {
            if let Decision::Admit(Admit::Held(mut permit)) =
                e.check(route, Key::None, black_box(NOW))
            {
                permit.time_on(&on);
            }
        });
    });
    let held = e.check(route, Key::None, NOW);
    assert!(held.is_admit());
    g.bench_function("reject/hold_timed", |b| {
        b.iter(|| e.check(route, Key::None, black_box(NOW)));
    });
    drop(held);
    g.finish();
}

fn keyed(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed_10k");
    let keys = ips();
    let mut next = keys.iter().copied().cycle();
    let partition = Partition::ClientIp({
        let mut v = KeyLimits::default();
        v.max_keys = KEYS as usize;
        v
    });
    let filled = |e: Engine| {
        for ip in &keys {
            assert!(e
                .check(bench_route(&e), Key::Ip(*ip), Nanos::ZERO)
                .is_admit());
        }
        e
    };
    let filled_engine = || filled(open_engine(partition.clone()));
    rocgate_variants(&mut g, filled_engine, |e, route, now| {
        e.check(route, Key::Ip(next.next().unwrap()), now)
    });
    let e = filled(open_engine_with_total(partition.clone()));
    let route = bench_route(&e);
    g.bench_function("rocgate/given_now/route_limit", |b| {
        b.iter(|| e.check(route, Key::Ip(next.next().unwrap()), black_box(NOW)))
    });
    governor_variants!(
        &mut g,
        |clock| {
            let lim = RateLimiter::dashmap_with_clock(open_quota(), clock);
            for ip in &keys {
                assert!(lim.check_key(ip).is_ok());
            }
            lim
        },
        |lim| lim.check_key(&next.next().unwrap())
    );
    g.finish();
}

fn header_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("header_keys");
    for len in [8, 32, 1024] {
        let values: Vec<String> = (0..1_000).map(|k| format!("{k:0len$}")).collect();
        let e = open_engine(Partition::Header("x-api-key".into(), KeyLimits::default()));
        let route = bench_route(&e);
        for v in &values {
            assert!(e.check(route, Key::Value(v), NOW).is_admit());
        }
        let mut next = values.iter().cycle();
        g.bench_function(format!("rocgate/given_now/{len}_bytes"), |b| {
            b.iter(|| e.check(route, Key::Value(next.next().unwrap()), black_box(NOW)))
        });
    }
    g.finish();
}

fn route_2_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("route_2_threads");
    let e = open_engine(Partition::Route);
    let route = bench_route(&e);
    g.bench_function("rocgate/given_now", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| e.check(route, Key::None, black_box(NOW)))
        })
    });
    let e = open_engine(Partition::Route);
    let route = bench_route(&e);
    let clock = MonotonicClock::new();
    g.bench_function("rocgate/monotonic_clock", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| e.check(route, Key::None, clock.now())))
    });
    let lim = RateLimiter::direct_with_clock(open_quota(), FakeRelativeClock::default());
    g.bench_function("governor/fake_clock", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| lim.check()))
    });
    let lim = RateLimiter::direct_with_clock(open_quota(), governor::clock::MonotonicClock);
    g.bench_function("governor/std_clock", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| lim.check()))
    });
    let lim = RateLimiter::direct(open_quota());
    g.bench_function("governor/quanta_clock", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| lim.check()))
    });
    g.finish();
}

/// The textbook sliding window log: every admitted request's timestamp, oldest first.
struct TimestampLog {
    window_ns: u64,
    limit: usize,
    log: Mutex<VecDeque<Nanos>>,
}

impl TimestampLog {
    fn new(window: Duration, limit: u32) -> Self {
        let limit = limit as usize;
        TimestampLog {
            window_ns: u64::try_from(window.as_nanos()).unwrap(),
            limit,
            log: Mutex::new(VecDeque::with_capacity(limit)),
        }
    }

    /// Forgets timestamps older than the window, then admits if fewer than `limit` remain.
    fn check(&self, now: Nanos) -> bool {
        let mut log = self.log.lock().unwrap();
        let horizon = now.as_u64().saturating_sub(self.window_ns);
        while log.front().is_some_and(|t| t.as_u64() <= horizon) {
            log.pop_front();
        }
        let admit = log.len() < self.limit;
        if admit {
            log.push_back(now);
        }
        admit
    }
}

/// The next millisecond of a virtual clock shared by threads (a contended `fetch_add`).
fn tick(clock: &AtomicU64) -> Nanos {
    Nanos::new(clock.fetch_add(STEP_NS, Ordering::Relaxed) + STEP_NS)
}

/// Call `i` of thread `t` (of two) on its own virtual clock: at (2i + t + 1) ms, so
/// the two threads offer 1,000 req/s between them while they keep pace.
fn own_clock(t: u64, i: u64) -> Nanos {
    Nanos::new((2 * i + t + 1) * STEP_NS)
}

/// Calls between two looks at the other thread in [`on_two_threads_in_step`].
const IN_STEP: u64 = 1_024;

/// [`on_two_threads`] for threads on their own virtual clocks ([`own_clock`]): neither
/// runs more than [`IN_STEP`] calls ahead of the other (about 2 s of virtual time), so
/// their clocks stay within one window even when one thread is descheduled. Every
/// `IN_STEP` calls each thread publishes its count on a cache line of its own and,
/// while it is ahead, yields its core (which the other thread may be waiting for); the
/// wait adds nothing to the result, which is the slower thread's time.
fn on_two_threads_in_step<R>(iters: u64, op: impl Fn(u64, u64) -> R + Sync) -> Duration {
    #[repr(align(64))]
    struct Progress(AtomicU64);
    let progress = [Progress(AtomicU64::new(0)), Progress(AtomicU64::new(0))];
    on_two_threads(iters, |t, i| {
        if i % IN_STEP == 0 {
            let (mine, other) = (&progress[t as usize].0, &progress[1 - t as usize].0);
            mine.store(i, Ordering::Relaxed);
            while i > other.load(Ordering::Relaxed) + IN_STEP {
                std::thread::yield_now();
            }
        }
        op(t, i)
    })
}

fn occupancy(c: &mut Criterion) {
    let mut g = c.benchmark_group("occupancy_1000rps");
    let second = Duration::from_secs(1);
    // Each benchmark has its own virtual clock, so time never runs backwards.
    let log = TimestampLog::new(second, OCCUPANCY_LIMIT);
    let mut now = 0;
    g.bench_function("timestamp_log", |b| {
        b.iter(|| {
            now += STEP_NS;
            log.check(Nanos::new(now))
        })
    });
    let e = route(OCCUPANCY_LIMIT, second, Partition::Route);
    let id = bench_route(&e);
    let mut now = 0;
    g.bench_function("rocgate", |b| {
        b.iter(|| {
            now += STEP_NS;
            e.check(id, Key::None, Nanos::new(now))
        })
    });
    // Two threads share one virtual clock, as they would share a real one: each call
    // takes the next millisecond. That read is a contended `fetch_add` that both sides
    // pay; `virtual_clock_2_threads` measures it alone.
    let clock = AtomicU64::new(0);
    g.bench_function("virtual_clock_2_threads", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| tick(&clock)))
    });
    let (log, clock) = (
        TimestampLog::new(second, OCCUPANCY_LIMIT),
        AtomicU64::new(0),
    );
    g.bench_function("timestamp_log_2_threads", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| log.check(tick(&clock))))
    });
    let e = route(OCCUPANCY_LIMIT, second, Partition::Route);
    let id = bench_route(&e);
    let clock = AtomicU64::new(0);
    g.bench_function("rocgate_2_threads", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| e.check(id, Key::None, tick(&clock))))
    });
    // Two threads with a virtual clock each, as in `window_1000rps`: no shared write
    // but the limiter's own. Each batch starts its clocks at zero again, so it gets a
    // fresh log and a fresh engine (neither timed).
    g.bench_function("timestamp_log_2_own_clocks", |b| {
        b.iter_custom(|iters| {
            let log = TimestampLog::new(second, OCCUPANCY_LIMIT);
            on_two_threads_in_step(iters, |t, i| log.check(own_clock(t, i)))
        })
    });
    g.bench_function("rocgate_2_own_clocks", |b| {
        b.iter_custom(|iters| {
            let e = route(OCCUPANCY_LIMIT, second, Partition::Route);
            let id = bench_route(&e);
            on_two_threads_in_step(iters, |t, i| e.check(id, Key::None, own_clock(t, i)))
        })
    });
    g.finish();
}

/// The textbook sliding window as a demand meter: every arrival's timestamp, oldest
/// first, evicted once older than the window; at each slot's end, the half-window
/// counts by binary search over the timestamps.
struct TimestampWindow {
    window_ns: u64,
    half_ns: u64,
    slot_ns: u64,
    /// The timestamps, and the end of the slot being accumulated.
    inner: Mutex<(VecDeque<Nanos>, u64)>,
}

impl TimestampWindow {
    fn new(spec: &WindowSpec) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
        TimestampWindow {
            window_ns: ns(spec.window()),
            half_ns: ns(spec.half()),
            slot_ns: ns(spec.slot()),
            inner: Mutex::new((VecDeque::new(), ns(spec.slot()))),
        }
    }

    /// Records an arrival at `now`; at a slot's end, first gives `on_slot` the arrivals
    /// in the earlier and later half-windows that ended with it.
    fn record(&self, now: Nanos, on_slot: impl FnOnce(u64, u64)) {
        let mut guard = self.inner.lock().unwrap();
        let (log, boundary) = &mut *guard;
        let now = now.as_u64();
        if now >= *boundary {
            let end = now / self.slot_ns * self.slot_ns;
            let mid = end.saturating_sub(self.half_ns);
            let start = end.saturating_sub(self.window_ns);
            while log.front().is_some_and(|t| t.as_u64() < start) {
                log.pop_front();
            }
            let split = log.partition_point(|t| t.as_u64() < mid);
            on_slot(split as u64, (log.len() - split) as u64);
            *boundary = end + self.slot_ns;
        }
        let horizon = now.saturating_sub(self.window_ns);
        while log.front().is_some_and(|t| t.as_u64() < horizon) {
            log.pop_front();
        }
        log.push_back(Nanos::new(now));
    }
}

/// rocgate's window as the engine drives it: roll over at a slot's end (the request
/// that wins a `try_lock` does), then count the arrival on the thread's lane.
struct SlottedWindow {
    counter: SlotCounter,
    ring: Mutex<SlotRing>,
}

impl SlottedWindow {
    fn new(spec: &WindowSpec) -> Self {
        SlottedWindow {
            counter: SlotCounter::new(spec),
            ring: Mutex::new(SlotRing::new(spec)),
        }
    }

    /// As [`TimestampWindow::record`] (a gap of several slots gives the last sample).
    fn record(&self, now: Nanos, on_slot: impl FnOnce(u64, u64)) {
        if self.counter.needs_roll(now) {
            if let Ok(mut ring) = self.ring.try_lock() {
                let mut last = None;
                ring.advance(&self.counter, self.counter.slot_index(now), |s| {
                    last = Some((s.sample.n_prev, s.sample.n_recent));
                });
                if let Some((prev, recent)) = last {
                    on_slot(prev, recent);
                }
            }
        }
        self.counter.add();
    }
}

/// Where the meters put a sample: where the controller would take it.
fn take(prev: u64, recent: u64) {
    black_box((prev, recent));
}

/// Both meters give the same half-window counts for the same arrivals (a spike in the
/// middle), so the baseline does the slotted window's job; and the queue holds about
/// a window of timestamps on two threads with a clock each.
fn meters_agree(spec: &WindowSpec) {
    let (queue, slotted) = (TimestampWindow::new(spec), SlottedWindow::new(spec));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for ms in 1..20_000u64 {
        let calls = if (8_000..12_000).contains(&ms) { 3 } else { 1 };
        for _ in 0..calls {
            let now = Nanos::from_millis(ms);
            queue.record(now, |p, r| a.push((p, r)));
            slotted.record(now, |p, r| b.push((p, r)));
        }
    }
    assert_eq!(a.len(), 199);
    assert_eq!(a, b, "the two meters disagree");
    // On two threads with a clock each, the queue still holds about a window of
    // timestamps, however far one thread runs ahead of the other.
    let queue = TimestampWindow::new(spec);
    on_two_threads_in_step(200_000, |t, i| queue.record(own_clock(t, i), take));
    let len = queue.inner.lock().unwrap().0.len();
    assert!(len <= 12_000, "{len} timestamps for a window of 6,000");
}

fn window(c: &mut Criterion) {
    let mut g = c.benchmark_group("window_1000rps");
    let spec = WindowSpec::default();
    meters_agree(&spec);
    let w = TimestampWindow::new(&spec);
    let mut now = 0;
    g.bench_function("timestamp_queue", |b| {
        b.iter(|| {
            now += STEP_NS;
            w.record(Nanos::new(now), take)
        })
    });
    let w = SlottedWindow::new(&spec);
    let mut now = 0;
    g.bench_function("slotted", |b| {
        b.iter(|| {
            now += STEP_NS;
            w.record(Nanos::new(now), take)
        })
    });
    let (w, clock) = (TimestampWindow::new(&spec), AtomicU64::new(0));
    g.bench_function("timestamp_queue_2_threads", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| w.record(tick(&clock), take)))
    });
    let (w, clock) = (SlottedWindow::new(&spec), AtomicU64::new(0));
    g.bench_function("slotted_2_threads", |b| {
        b.iter_custom(|iters| on_two_threads(iters, |_, _| w.record(tick(&clock), take)))
    });
    // Each batch starts its clocks at zero again (`i` counts from 0), so it gets fresh
    // meters: one holding later timestamps would evict nothing.
    g.bench_function("timestamp_queue_2_own_clocks", |b| {
        b.iter_custom(|iters| {
            let w = TimestampWindow::new(&spec);
            on_two_threads_in_step(iters, |t, i| w.record(own_clock(t, i), take))
        })
    });
    g.bench_function("slotted_2_own_clocks", |b| {
        b.iter_custom(|iters| {
            let w = SlottedWindow::new(&spec);
            on_two_threads_in_step(iters, |t, i| w.record(own_clock(t, i), take))
        })
    });
    g.finish();
}

/// A route cut at 10.1 s by a spike of 600 requests in the slot from 10 s, its hold and
/// `max_cut` a day long (the longest the config takes) so that it stays cut, with
/// `events` scheduled events ahead of its raise (from 2, 3 and 4 h, for 30 min each,
/// each with a hold of its own: a measurement steps a route through well under an
/// hour): the
/// engine, the route, and the end of the slot it was last stepped at.
fn cut_engine(events: u32) -> (Engine, RouteId, Nanos) {
    let day = Duration::from_secs(24 * 3600);
    let mut r = RouteConfig::new("bench", RouteMatch::any());
    r.controller.hold = day;
    r.controller.max_cut = day;
    r.events = (1..=events)
        .map(|i| {
            let mut p = r.controller.clone();
            p.hold = day - Duration::from_secs(u64::from(i));
            let start = SystemTime::UNIX_EPOCH + Duration::from_secs(3600 * (1 + u64::from(i)));
            Event::new(format!("e{i}"), start, Duration::from_secs(1800), p)
        })
        .collect();
    let e = Engine::new(&Config::new(vec![r]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = bench_route(&e);
    for k in 0..40u64 {
        let _ = e.check(id, Key::None, Nanos::new(k * 250_000_000));
    }
    for k in 0..600u64 {
        let _ = e.check(
            id,
            Key::None,
            Nanos::new(10_000_000_000 + k * 100_000_000 / 600),
        );
    }
    let at = Nanos::from_millis(10_200);
    e.catch_up(id, at);
    assert!(e.restore_eta(id, at).is_some(), "cut");
    (e, id, at)
}

/// A route with the widest window the config takes, 100,000 slots (100 s of 1 ms
/// slots), cut at 100.501 s by a spike of 600 requests in the slot from 100.5 s over
/// 40 spread through the first 100 s (thresholds scaled to its 50 s halves: danger 5,
/// safe 1 req/s per half-window, `min_rps` 1), its hold and `max_cut` a day long so
/// that it stays cut: the engine, the route, and the end of the slot it was last
/// stepped at.
fn wide_cut_engine() -> (Engine, RouteId, Nanos) {
    let day = Duration::from_secs(24 * 3600);
    let mut r = RouteConfig::new("bench", RouteMatch::any());
    r.window = WindowSpec::new(Duration::from_secs(100), Duration::from_millis(1)).unwrap();
    r.controller.hold = day;
    r.controller.max_cut = day;
    r.controller.danger_roc = 5.0;
    r.controller.safe_roc = 1.0;
    r.controller.min_rps = 1.0;
    let e = Engine::new(&Config::new(vec![r]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = bench_route(&e);
    for k in 0..40u64 {
        let _ = e.check(id, Key::None, Nanos::new(k * 2_500_000_000));
    }
    for k in 0..600u64 {
        let _ = e.check(id, Key::None, Nanos::new(100_500_000_000 + k * 1_000));
    }
    let at = Nanos::from_millis(100_502);
    e.catch_up(id, at);
    assert!(e.restore_eta(id, at).is_some(), "cut");
    (e, id, at)
}

/// How long `iters` steps of a cut route take, one a slot of `slot_ms` of virtual
/// time (`Engine::catch_up` to each slot's end), on routes `cut` builds, a fresh one
/// (not timed) for each 30,000 steps: a route stepped on through a warm-up of a
/// million calls would pass its day-long `max_cut` (100 ms slots) and restore, and no
/// longer measure a cut's step.
fn steps(iters: u64, cut: impl Fn() -> (Engine, RouteId, Nanos), slot_ms: u64) -> Duration {
    let clock = MonotonicClock::new();
    let mut took = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(30_000);
        let (e, id, at) = cut();
        let start = clock.now();
        for i in 1..=n {
            e.catch_up(id, at + Duration::from_millis(slot_ms * i));
        }
        took += clock.now().saturating_since(start);
        let end = at + Duration::from_millis(slot_ms * n);
        assert!(e.restore_eta(id, end).is_some(), "still cut");
        left -= n;
    }
    took
}

fn retry_after(c: &mut Criterion) {
    let mut g = c.benchmark_group("retry_after");
    for events in [0, 3] {
        let (e, id, at) = cut_engine(events);
        let now = at + Duration::from_millis(50);
        g.bench_function(format!("refusal/{events}_events"), |b| {
            b.iter(|| {
                let d = e.check(id, Key::None, black_box(now));
                (d, e.restore_eta(id, now))
            })
        });
        g.bench_function(format!("step/{events}_events"), |b| {
            b.iter_custom(|iters| steps(iters, || cut_engine(events), 100))
        });
    }
    // The step of a cut route whose window holds the most slots the config takes,
    // 1 ms of virtual time a call.
    g.bench_function("step/100000_slots", |b| {
        b.iter_custom(|iters| steps(iters, wide_cut_engine, 1))
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    primitives(&mut c);
    route_level(&mut c);
    route_2_threads(&mut c);
    keyed(&mut c);
    header_keys(&mut c);
    retry_after(&mut c);
    reject(&mut c);
    concurrency(&mut c);
    occupancy(&mut c);
    window(&mut c);
    c.final_summary();
}
