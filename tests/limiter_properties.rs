//! Property tests of every limiter's invariants where `tests/properties.rs` checks
//! them for one algorithm only, or without limit changes or out-of-order clocks:
//! the bound each algorithm's docs promise over any interval, with limit changes at
//! any instant and callers whose clock reads run up to `J` behind one another (the
//! property's `jitter`); the exact `retry_after` after such a history; extreme
//! limits (the config's least, a nanosecond's worth of tokens, bursts at the edges
//! the config takes); a concurrency queue's order and its permits under the limit
//! through releases, tickets given up and limit changes; the key tables' bounds
//! (`max_keys`, eviction only of keys at rest, one overflow limiter at the per-key
//! limit); a whole route's bound and limit through its controller's cuts and
//! restores, under surges shaped to cut it; and a partitioned route's `route_limit`
//! (its keys' total, each key's and each tier's own bound) through cuts, runtime
//! changes, events with a total of their own and changes of the fleet's share, with
//! its refusals' exact `retry_after`. Failures are kept in
//! `tests/limiter_properties.proptest-regressions`.

mod common;

use common::cases;
use proptest::prelude::*;
use rocgate::clock::Nanos;
use rocgate::config::{
    Config, Event, KeyLimits, Partition, RouteConfig, RouteMatch, Tier, MIN_LIMIT,
};
use rocgate::controller::ControllerState;
use rocgate::engine::{Engine, Key, RouteSnapshot};
use rocgate::limiter::{
    Admit, Algorithm, Concurrency, Decision, FixedWindow, LeakyBucket, Limiter, Permit, Reason,
    SlidingWindowCounter, Ticket, TokenBucket, MAX_SPACED_RATE,
};
use rocgate::window::WindowSpec;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, SystemTime};

/// One step of a history: the caller's clock read (true time less its jitter), and
/// a limit change made there instead of a decision.
#[derive(Clone, Copy, Debug)]
struct Step {
    read: u64,
    change: Option<f64>,
}

/// A history of `len` steps in true time, gaps up to a power of ten of microseconds
/// drawn up to `max_gap_us`, so that a load is often heavier than the limits
/// (sometimes an idle stretch of up to a day), each read up to a drawn jitter behind true time (half of
/// them on time), `weight` of them limit changes to a limit drawn by `limit`: the
/// jitter and the steps.
fn history(
    max_gap_us: u64,
    weight: f64,
    limit: BoxedStrategy<f64>,
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = (u64, Vec<Step>)> {
    (jitter(), 0u32..=max_gap_us.ilog10()).prop_flat_map(move |(jitter_ns, scale)| {
        let gap = prop_oneof![
            30 => 0..10u64.pow(scale).max(2),
            1 => 1_000_000u64..86_400_000_000,
        ];
        let late = prop_oneof![1 => Just(0u64), 1 => 0..=jitter_ns];
        let step = (gap, late, prop::option::weighted(weight, limit.clone()));
        let steps = prop::collection::vec(step, len.clone()).prop_map(move |steps| {
            let mut t = jitter_ns;
            steps
                .into_iter()
                .map(|(gap_us, late, change)| {
                    t += gap_us * 1_000;
                    Step {
                        read: t - late,
                        change,
                    }
                })
                .collect()
        });
        (Just(jitter_ns), steps)
    })
}

/// A rate limit: mostly ordinary, sometimes the config's least (one request in 11.6
/// days), up to the most a spaced limiter is configured at, or past it up to a
/// token a nanosecond (which the limiters take when built in code).
fn rate_limit() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => 1.0f64..2_000.0,
        1 => prop_oneof![Just(MIN_LIMIT), MIN_LIMIT..1.0],
        1 => prop_oneof![Just(MAX_SPACED_RATE), 2_000.0f64..MAX_SPACED_RATE],
        1 => prop_oneof![Just(1e9), MAX_SPACED_RATE..1e9],
    ]
}

/// How far behind one another callers read the clock: none, a few microseconds
/// (threads racing), or up to most of the second a window counter tolerates.
fn jitter() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        2 => 0u64..50_000,
        1 => 0u64..900_000_000,
    ]
}

/// The rate a bucket keeps at `limit`: one token per whole nanoseconds (the
/// interval rounded, as `MAX_SPACED_RATE` documents).
fn kept_rate(limit: f64) -> f64 {
    1e9 / (1e9 / limit).round().max(1.0)
}

/// The tokens a bucket of `limit` and `burst` holds: whole, at least one, at most
/// what its 32 bits keep.
fn capacity(limit: f64, burst: Duration) -> f64 {
    (limit * burst.as_secs_f64() + 1e-6)
        .floor()
        .clamp(1.0, f64::from(u32::MAX))
}

/// In every interval [a, b] of clock reads, at most `capacity + rate × (b − a)`
/// admissions were read in it (one more for the nanosecond rounding of a token's time).
fn within_rate(admitted: &mut [u64], capacity: f64, rate: f64) -> Result<(), TestCaseError> {
    admitted.sort_unstable();
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            let span = (admitted[j] - admitted[i]) as f64 / 1e9;
            let count = (j - i + 1) as f64;
            prop_assert!(
                count <= capacity + rate * span + 1.0,
                "{count} admitted in {span}s (capacity {capacity}, rate {rate})"
            );
        }
    }
    Ok(())
}

/// In every interval [a, b] of clock reads, at most `quota × (⌊(b − a + J) / W⌋ + 2)`
/// admissions: a window's requests are counted in it, two windows meet an interval
/// shorter than one, and a caller up to `J` late counts in the window the others
/// moved to. With reads in order (`J` = 0), at most `quota` read in each window.
fn within_windows(
    admitted: &mut [u64],
    quota: u64,
    window_ns: u64,
    jitter_ns: u64,
) -> Result<(), TestCaseError> {
    admitted.sort_unstable();
    if jitter_ns == 0 {
        for window in admitted.chunk_by(|a, b| a / window_ns == b / window_ns) {
            prop_assert!(
                window.len() as u64 <= quota,
                "{} admitted in the window from {} ns, quota {quota}",
                window.len(),
                window[0] / window_ns * window_ns
            );
        }
    }
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            let span = admitted[j] - admitted[i];
            let windows = (span + jitter_ns) / window_ns + 2;
            let count = (j - i + 1) as u64;
            prop_assert!(
                count <= quota * windows,
                "{count} admitted in {span} ns (quota {quota} per {window_ns} ns, jitter {jitter_ns} ns)"
            );
        }
    }
    Ok(())
}

/// The whole requests a window of `window` allows at `limit`, as the limiters count.
/// Runs a window limiter of limit `first` through `steps` (`set_limit` at each
/// change, `check` at each read): the reads it admitted, and the largest quota per
/// window it had.
fn run_window(
    steps: &[Step],
    window: Duration,
    first: f64,
    set_limit: impl Fn(f64),
    check: impl Fn(Nanos) -> bool,
) -> (Vec<u64>, u64) {
    let mut most = quota(first, window);
    let mut admitted = Vec::new();
    for s in steps {
        match s.change {
            Some(limit) => {
                set_limit(limit);
                most = most.max(quota(limit, window));
            }
            None => {
                if check(Nanos::new(s.read)) {
                    admitted.push(s.read);
                }
            }
        }
    }
    (admitted, most)
}

fn quota(limit: f64, window: Duration) -> u64 {
    (limit * window.as_secs_f64() + 1e-6).floor() as u64
}

/// A burst the config takes: its least (1 ms), ordinary ones, and its most (49.7
/// days, what 32 bits of milliseconds keep).
fn burst() -> impl Strategy<Value = Duration> {
    prop_oneof![
        1 => Just(Duration::from_millis(1)),
        6 => (1u64..3_000).prop_map(Duration::from_millis),
        1 => Just(Duration::from_millis(u64::from(u32::MAX))),
    ]
}

/// A window the config takes: mostly ordinary, sometimes its least (1 ms).
fn window() -> impl Strategy<Value = Duration> {
    prop_oneof![
        1 => Just(Duration::from_millis(1)),
        4 => (1u64..2_000).prop_map(Duration::from_millis),
        1 => Just(Duration::from_secs(60)),
    ]
}

proptest! {
    #![proptest_config(cases(128))]

    /// A token bucket, its limit changed at any instant (each change dated at its
    /// caller's read) and its callers reading the clock up to `J` apart, admits in
    /// every interval [a, b] of reads at most the largest capacity plus the largest
    /// rate × (b − a) it had: a change clamps the tokens and never refills them (a
    /// bucket lowered and raised again gets no fresh burst), and a late read takes
    /// no token an earlier decision took. GCRA holds this exactly, reads out of
    /// order or not: an admission leaves the TAT at most its read plus τ, and every
    /// admission moves it one interval on.
    #[test]
    fn a_token_bucket_holds_its_bound_through_changes_and_late_reads(
        first in rate_limit(),
        burst in burst(),
        (_, steps) in history(20_000, 0.05, rate_limit().boxed(), 1..300),
    ) {
        let b = TokenBucket::new(first, burst, Nanos::ZERO);
        let (mut most_capacity, mut most_rate) = (capacity(first, burst), kept_rate(first));
        let mut admitted = Vec::new();
        for s in steps {
            match s.change {
                Some(limit) => {
                    b.set_limit(limit, Nanos::new(s.read));
                    most_capacity = most_capacity.max(capacity(limit, burst));
                    most_rate = most_rate.max(kept_rate(limit));
                }
                None => {
                    if b.check(Nanos::new(s.read)).is_admit() {
                        admitted.push(s.read);
                    }
                }
            }
        }
        within_rate(&mut admitted, most_capacity, most_rate)?;
    }
}

/// A window limit: at least one request per window of `window` (as the config
/// requires), up to what a window's 20-bit count holds.
fn window_limit(window: Duration) -> BoxedStrategy<f64> {
    let least = 1.0 / window.as_secs_f64();
    let most = 1_000_000.0 / window.as_secs_f64();
    prop_oneof![
        8 => 1.0f64..2_000.0,
        1 => Just(least),
        1 => Just(most),
    ]
    .prop_map(move |l: f64| l.clamp(least, most))
    .boxed()
}

/// A first window limit for `window`, and a history of `len` steps (gaps drawn up to
/// `max_gap_us`), 5% of them changes to another window limit.
fn window_limits(
    window: Duration,
    max_gap_us: u64,
    len: std::ops::Range<usize>,
) -> (BoxedStrategy<f64>, impl Strategy<Value = (u64, Vec<Step>)>) {
    (
        window_limit(window),
        history(max_gap_us, 0.05, window_limit(window), len),
    )
}

/// A window, with a history of window limits and its jitter.
fn windowed() -> impl Strategy<Value = (Duration, f64, (u64, Vec<Step>))> {
    window().prop_flat_map(|w| {
        let (first, history) = window_limits(w, 20_000, 1..300);
        (Just(w), first, history)
    })
}

proptest! {
    #![proptest_config(cases(128))]

    /// A fixed window, its limit changed at any instant and its callers reading the
    /// clock up to `J` apart, admits at most the largest quota it had per window,
    /// so at most two quotas in an interval shorter than a window, and in every
    /// interval [a, b] of reads at most `quota × (⌊(b − a + J) / W⌋ + 2)`: a change
    /// keeps the window's count, and a late read cannot reopen a counted window.
    #[test]
    fn a_fixed_window_holds_its_bound_through_changes_and_late_reads(
        (window, first, (jitter, steps)) in windowed(),
    ) {
        let w = FixedWindow::new(first, window, Nanos::ZERO);
        let (mut admitted, most) = run_window(
            &steps,
            window,
            first,
            |limit| w.set_limit(limit),
            |at| w.check(at).is_admit(),
        );
        within_windows(&mut admitted, most, window.as_nanos() as u64, jitter)?;
    }

    /// A sliding-window counter, the same: it counts at most a quota in its current
    /// window (the previous one's weight only lowers that), so the bound holds as
    /// the fixed window's does, through limit changes and late reads. With reads in
    /// order, its docs' "up to about two quotas less one" in a window's length holds:
    /// at most `2 × quota − 1` in any interval shorter than a window.
    #[test]
    fn a_sliding_window_holds_its_bound_through_changes_and_late_reads(
        (window, first, (jitter, steps)) in windowed(),
    ) {
        let w = SlidingWindowCounter::new(first, window, Nanos::ZERO);
        let (mut admitted, most) = run_window(
            &steps,
            window,
            first,
            |limit| w.set_limit(limit),
            |at| w.check(at).is_admit(),
        );
        let window_ns = window.as_nanos() as u64;
        within_windows(&mut admitted, most, window_ns, jitter)?;
        if jitter == 0 {
            // `admitted` is sorted: the most admitted in a span shorter than a window.
            let mut first = 0;
            for last in 0..admitted.len() {
                while admitted[last] - admitted[first] >= window_ns {
                    first += 1;
                }
                let count = (last - first + 1) as u64;
                prop_assert!(
                    count < 2 * most,
                    "{count} admitted in {} ns, quota {most} per {window_ns} ns",
                    admitted[last] - admitted[first]
                );
            }
        }
    }

    /// A leaky bucket, its limit changed at any instant and its callers reading the
    /// clock up to `J` apart, sends its requests one interval apart at the shortest
    /// interval it had, each at or after its read, and makes none wait more than
    /// `queue` intervals at the limit in force when it asked; its level reads
    /// exhausted exactly when it refuses.
    #[test]
    fn a_leaky_bucket_keeps_its_pace_through_changes_and_late_reads(
        first in rate_limit(),
        queue in prop_oneof![Just(0u32), 0u32..16, Just(10_000)],
        (_, steps) in history(20_000, 0.05, rate_limit().boxed(), 1..300),
    ) {
        let interval = |limit: f64| (1e9 / limit).round().max(1.0) as u64;
        let b = LeakyBucket::new(first, queue);
        let (mut t, mut shortest) = (interval(first), interval(first));
        let mut departures = Vec::new();
        for s in steps {
            match s.change {
                Some(limit) => {
                    b.set_limit(limit);
                    t = interval(limit);
                    shortest = shortest.min(t);
                }
                None => match (
                    b.level(Nanos::new(s.read)).exhausted(&Algorithm::LeakyBucket { queue }),
                    b.check(Nanos::new(s.read)),
                ) {
                    (true, d) => prop_assert!(!d.is_admit(), "exhausted, yet {d:?}"),
                    (false, Decision::Admit(Admit::Now)) => departures.push(s.read),
                    (false, Decision::Admit(Admit::Paced(p))) => {
                        let d = p.departure().as_u64();
                        prop_assert!(d > s.read);
                        prop_assert!(
                            d - s.read <= t.saturating_mul(u64::from(queue)),
                            "waits {} ns, {queue} intervals of {t} ns", d - s.read
                        );
                        departures.push(d);
                    }
                    (false, Decision::Admit(other)) => prop_assert!(false, "{other:?}"),
                    (false, d) => prop_assert!(false, "room, yet {d:?}"),
                },
            }
        }
        for pair in departures.windows(2) {
            prop_assert!(
                pair[1] >= pair[0] + shortest,
                "departures at {} and {} ns, the shortest interval {shortest} ns",
                pair[0], pair[1]
            );
        }
    }

    /// A concurrency limiter grants a permit only while fewer than its limit in force
    /// are held, through limit changes (a lowered limit leaves the permits held,
    /// and grants none until they are under it) and releases in any order.
    #[test]
    fn a_concurrency_limiter_grants_under_its_limit_through_changes(
        first in 0.0f64..8.0,
        steps in prop::collection::vec(
            prop_oneof![
                4 => Just(None),
                2 => any::<prop::sample::Index>().prop_map(|i| Some(Err(i))),
                1 => (0.0f64..8.0).prop_map(|l| Some(Ok(l))),
            ],
            1..300,
        ),
    ) {
        let permits = |limit: f64| limit.floor() as usize;
        let c = Concurrency::new(first, 0);
        let mut limit = permits(first);
        let mut held: Vec<Permit> = Vec::new();
        for step in steps {
            match step {
                None => match c.check(Nanos::ZERO) {
                    Decision::Admit(Admit::Held(p)) => {
                        prop_assert!(held.len() < limit, "granted with {} held, limit {limit}", held.len());
                        held.push(p);
                    }
                    Decision::Admit(other) => prop_assert!(false, "{other:?}"),
                    Decision::Reject(_) => prop_assert!(held.len() >= limit),
                },
                Some(Err(i)) if !held.is_empty() => drop(held.remove(i.index(held.len()))),
                Some(Err(_)) => {}
                Some(Ok(l)) => {
                    c.set_limit(l);
                    limit = permits(l);
                }
            }
            prop_assert_eq!(c.level().value as usize, held.len());
        }
    }
}

/// An algorithm whose refusals say exactly when to come back, with a history of
/// limits it takes (a window's at least one request per window) and its jitter.
fn exact_retry() -> impl Strategy<Value = (Algorithm, f64, (u64, Vec<Step>))> {
    let spaced = (burst(), prop_oneof![Just(0u32), 0u32..16]).prop_flat_map(|(burst, queue)| {
        let algorithm = prop_oneof![
            Just(Algorithm::TokenBucket { burst }),
            Just(Algorithm::LeakyBucket { queue }),
        ];
        (
            algorithm,
            rate_limit(),
            history(5_000, 0.05, rate_limit().boxed(), 1..200),
        )
    });
    let windows = (window(), any::<bool>()).prop_flat_map(|(window, sliding)| {
        let algorithm = if sliding {
            Algorithm::SlidingWindow { window }
        } else {
            Algorithm::FixedWindow { window }
        };
        let (first, history) = window_limits(window, 5_000, 1..200);
        (Just(algorithm), first, history)
    });
    prop_oneof![spaced, windows]
}

proptest! {
    #![proptest_config(cases(256))]

    /// After any history of decisions and limit changes, its callers reading the
    /// clock up to `J` apart, a token bucket's, a leaky bucket's or a window's
    /// refusal at a read `r` says exactly when to come back: a request read at
    /// `r + retry_after` is admitted, if nothing else came and the limit did not
    /// change meanwhile (what `Rejection::retry_after` promises), and one read a
    /// nanosecond sooner is refused (a sliding window's weighted count, compared in
    /// floating point with a tolerance, admitted a few nanoseconds sooner).
    #[test]
    fn retry_after_is_exact_after_changes_and_late_reads(
        (algorithm, first, (_, steps)) in exact_retry(),
    ) {
        let l = Limiter::new(algorithm, first, Nanos::ZERO);
        for s in steps {
            let now = Nanos::new(s.read);
            if let Some(limit) = s.change {
                l.set_limit(limit, now);
                continue;
            }
            let Decision::Reject(r) = l.check(now) else { continue };
            prop_assert!(r.retry_after > Duration::ZERO);
            let sooner = now + r.retry_after - Duration::from_nanos(1);
            prop_assert!(!l.check(sooner).is_admit(), "{algorithm:?}: admitted before {:?}", r.retry_after);
            prop_assert!(
                l.check(now + r.retry_after).is_admit(),
                "{algorithm:?}: refused at {s:?} + {:?}", r.retry_after
            );
            break;
        }
    }
}

/// A client's address, as a key.
fn ip(n: u32) -> Key<'static> {
    Key::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
}

/// A rate algorithm of the engine's key tables: a token bucket of two seconds'
/// burst, a window of ten seconds (longer than the idle timeouts drawn, so that
/// keys go idle with counts in their windows), or a leaky bucket with a queue of 4.
fn key_algorithm() -> impl Strategy<Value = Algorithm> {
    let window = Duration::from_secs(10);
    prop_oneof![
        Just(Algorithm::TokenBucket {
            burst: Duration::from_secs(2)
        }),
        Just(Algorithm::FixedWindow { window }),
        Just(Algorithm::SlidingWindow { window }),
        Just(Algorithm::LeakyBucket { queue: 4 }),
    ]
}

/// What a limiter admitted at the reads it admitted them: a departure for a leaky
/// bucket, a read otherwise.
#[derive(Default)]
struct Admitted(Vec<u64>);

impl Admitted {
    fn push(&mut self, read: u64, d: &Decision) {
        match d {
            Decision::Admit(Admit::Paced(p)) => self.0.push(p.departure().as_u64()),
            Decision::Admit(_) => self.0.push(read),
            Decision::Reject(_) => {}
        }
    }

    /// Within what `algorithm` allows at the largest limit it had, `most` req/s,
    /// callers reading up to `jitter` apart.
    fn bounded(
        &mut self,
        algorithm: Algorithm,
        most: f64,
        jitter: u64,
    ) -> Result<(), TestCaseError> {
        match algorithm {
            Algorithm::TokenBucket { burst } => {
                within_rate(&mut self.0, capacity(most, burst), kept_rate(most))
            }
            Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } => {
                within_windows(
                    &mut self.0,
                    quota(most, window),
                    window.as_nanos() as u64,
                    jitter,
                )
            }
            _ => {
                // Departures, in the order they were given: one interval apart at
                // the largest limit, unless a late read was let out at its read
                // (a key at rest is new again), up to `jitter` early.
                let shortest = (1e9 / most).round() as u64;
                self.0.sort_unstable();
                for pair in self.0.windows(2) {
                    prop_assert!(
                        pair[1] + jitter >= pair[0] + shortest,
                        "departures at {} and {} ns, one per {shortest} ns",
                        pair[0],
                        pair[1]
                    );
                }
                Ok(())
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(64))]

    /// A partitioned route's key table, under any sequence of keys (more than it
    /// holds), of limit updates at any instant and of callers reading the clock up
    /// to `J` apart, holds at most `max_keys` keys; each key admits no more than
    /// its algorithm allows one limiter at the largest limit the route had (a key
    /// is evicted only at rest, so one evicted comes back to what it would have
    /// had: README, "Per-key state is bounded by `max_keys`"); and the requests of
    /// keys that found the table full share one overflow limiter at the per-key
    /// limit ("nor get more than one key's quota together").
    #[test]
    fn a_key_table_holds_its_bound_and_each_key_and_the_overflow_their_limit(
        algorithm in key_algorithm(),
        first in 0.1f64..20.0,
        max_keys in 1usize..5,
        idle_s in 1u64..5,
        keys in 1u32..10,
        (jitter, steps) in history(1_000_000, 0.03, (0.1f64..20.0).boxed(), 1..300),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 300),
    ) {
        let mut cfg = RouteConfig::new("ip", RouteMatch::any());
        cfg.algorithm = algorithm;
        let mut limits = KeyLimits::default();
        limits.max_keys = max_keys;
        limits.idle_timeout = Duration::from_secs(idle_s);
        cfg.partition = Partition::ClientIp(limits);
        cfg.controller.base_limit_rps = first;
        cfg.controller.cut_limit_rps = first;
        let mut params = cfg.controller.clone();
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        let mut most = first;
        let mut own: Vec<Admitted> = (0..keys).map(|_| Admitted::default()).collect();
        let mut overflow = Admitted::default();
        let mut overflowed = 0;
        for (s, pick) in steps.into_iter().zip(picks) {
            let now = Nanos::new(s.read);
            if let Some(limit) = s.change {
                params.base_limit_rps = limit;
                params.cut_limit_rps = limit;
                e.update_route(id, params.clone(), now).unwrap();
                most = most.max(limit);
                continue;
            }
            let k = pick.index(keys as usize);
            let d = e.check(id, ip(k as u32), now);
            let snapshot = e.route_snapshot(id, now).unwrap();
            prop_assert!(snapshot.keys <= max_keys, "{} keys, max_keys {max_keys}", snapshot.keys);
            if snapshot.keys_overflowed > overflowed {
                overflowed = snapshot.keys_overflowed;
                overflow.push(s.read, &d);
            } else {
                own[k].push(s.read, &d);
            }
        }
        for key in &mut own {
            key.bounded(algorithm, most, jitter)?;
        }
        overflow.bounded(algorithm, most, jitter)?;
    }
}

proptest! {
    #![proptest_config(cases(64))]

    /// A route limited as a whole, under surges past its `danger_roc` (a step or a
    /// ramp, each after a calm longer than its window) that cut it, and calms that
    /// restore it, its base limit updated at any instant and its callers reading
    /// the clock up to `J` apart: its limit stays within its cut and base limits in
    /// force, and with `J` up to 50 ms it is back at base once the load has been
    /// calm long enough for the restore (reads a good part of a half window apart
    /// move calm arrivals between its halves, which can read as a rise past
    /// `safe_roc` for as long as they go on); and it admits no more than its
    /// algorithm allows one limiter at the largest base limit it had: every change
    /// the engine makes, dated at its slot or left behind for the next decision,
    /// clamps and never refills.
    #[test]
    fn a_route_holds_its_bound_through_cuts_updates_and_late_reads(
        algorithm in key_algorithm(),
        first in 1.0f64..50.0,
        cut in 0.1f64..1.0,
        jitter in jitter(),
        late in prop::collection::vec(0.0f64..=1.0, 64),
        load in surges(),
        changes in prop::collection::vec((0.0f64..1.0, 1.0f64..50.0), 0..3),
    ) {
        let cfg = surging_route("r", algorithm, first, cut);
        let mut params = cfg.controller.clone();
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        let reads = surge_reads(&load);
        let end = *reads.last().unwrap();
        let mut changes: Vec<(u64, f64)> = changes
            .into_iter()
            .map(|(at, limit)| ((at * end as f64) as u64, limit))
            .collect();
        changes.sort_by_key(|&(at, _)| at);
        let mut changes = changes.into_iter().peekable();
        let mut most = first;
        // A change of the route's parameters holds off cuts for a window.
        let mut changed = false;
        let mut admitted = Admitted::default();
        for (i, &t) in reads.iter().enumerate() {
            let read = t + jitter - (late[i % late.len()] * jitter as f64) as u64;
            while let Some((at, limit)) = changes.next_if(|&(at, _)| at <= t) {
                params.base_limit_rps = limit;
                params.cut_limit_rps = limit * cut;
                params.restore_step_rps = limit / 10.0;
                e.update_route(id, params.clone(), Nanos::new(at + jitter)).unwrap();
                most = most.max(limit);
                changed = true;
            }
            let d = e.check(id, Key::None, Nanos::new(read));
            admitted.push(read, &d);
            let s = e.route_snapshot(id, Nanos::new(read)).unwrap();
            prop_assert_eq!(
                (s.base_limit_rps, s.cut_limit_rps),
                (params.base_limit_rps, params.cut_limit_rps)
            );
            prop_assert!(
                params.cut_limit_rps <= s.limit_rps && s.limit_rps <= params.base_limit_rps,
                "a limit of {} in {:?}, cut {} and base {}",
                s.limit_rps, s.state, params.cut_limit_rps, params.base_limit_rps
            );
        }
        let s = e.route_snapshot(id, Nanos::new(end + jitter)).unwrap();
        prop_assert!(s.cuts > 0 || changed, "the load never cut the route");
        if jitter <= 50_000_000 {
            prop_assert_eq!(s.state, ControllerState::Normal);
            prop_assert_eq!(s.limit_rps, params.base_limit_rps);
        }
        admitted.bounded(algorithm, most, jitter)?;
    }
}

/// One surge of a load: `calm` req/s for `calm_s` seconds, then a step to `peak`
/// req/s (or a ramp to it over the first half of the surge) held `peak_s` seconds.
#[derive(Clone, Copy, Debug)]
struct Surge {
    calm: f64,
    calm_s: f64,
    peak: f64,
    ramp: bool,
    peak_s: f64,
}

/// Up to three surges, each after a calm longer than the 1 s window of
/// [`surging_route`], each rising from under 10 req/s to over 100 for 0.4 s or more:
/// at least 25 arrivals more in the later half of the window than in the earlier (a
/// ramp's 10 or more over its 0.2 s and 20 over 0.2 s at its height, less the calm's
/// 5), a rise of 50 req/s, over twice its `danger_roc`.
fn surges() -> impl Strategy<Value = Vec<Surge>> {
    let surge = (
        1.0f64..10.0,
        1.5f64..6.0,
        100.0f64..400.0,
        any::<bool>(),
        0.4f64..2.0,
    )
        .prop_map(|(calm, calm_s, peak, ramp, peak_s)| Surge {
            calm,
            calm_s,
            peak,
            ramp,
            peak_s,
        });
    prop::collection::vec(surge, 1..4)
}

/// How long the calm after the last surge lasts, seconds: past the restore of
/// [`surging_route`] (its window, `hold`, ten steps and `min_dwell`, 3.7 s), with
/// room to spare.
const TAIL_S: f64 = 8.0;

/// The reads of `surges` one after another and a calm of [`TAIL_S`] at the last
/// calm rate, in ns from 0: each a gap its rate's after the one before, wiggled by up
/// to half of it (a golden-ratio sequence, the same for every case); on a ramp, the
/// n-th arrival where the ramp's rate, rising linearly, has brought n (give or take
/// the wiggle) since it began.
fn surge_reads(surges: &[Surge]) -> Vec<u64> {
    let mut reads: Vec<u64> = Vec::new();
    let wiggle = |n: usize| (n as f64 * 0.618_033_988_75).fract() - 0.5;
    let mut t = 0.0f64;
    let steady = |reads: &mut Vec<u64>, t: &mut f64, rate: f64, for_s: f64| {
        let until = *t + for_s;
        while *t < until {
            *t += (1.0 + wiggle(reads.len())) / rate;
            reads.push((*t * 1e9) as u64);
        }
    };
    for s in surges {
        steady(&mut reads, &mut t, s.calm, s.calm_s);
        let (start, end) = (t, t + s.peak_s);
        if s.ramp {
            // From `calm` to `peak` over half the surge: by τ into it, `calm × τ +
            // slope × τ² / 2` arrivals.
            let slope = (s.peak - s.calm) / (s.peak_s / 2.0);
            let mut n = 0.0;
            while t < start + s.peak_s / 2.0 {
                n += 1.0;
                let arrivals = n + wiggle(reads.len());
                let tau = ((s.calm * s.calm + 2.0 * slope * arrivals).sqrt() - s.calm) / slope;
                t = start + tau;
                reads.push((t * 1e9) as u64);
            }
        }
        let left = end - t;
        steady(&mut reads, &mut t, s.peak, left);
    }
    let last = surges.last().map_or(1.0, |s| s.calm);
    steady(&mut reads, &mut t, last, TAIL_S);
    reads
}

/// A route of `algorithm` whose controller cuts at a rise of 20 req/s between the
/// halves of a 1 s window (slots of 50 ms), 5 arrivals in the later, reads calm
/// under 10 req/s (a calm load's arrivals, wiggled, falling 2 or 3 more in one half
/// than the other, read 4 to 6), holds 500 ms, and restores a tenth of
/// `base` every 200 ms, at `base` req/s cut to `base × cut`.
fn surging_route(name: &str, algorithm: Algorithm, base: f64, cut: f64) -> RouteConfig {
    let mut cfg = RouteConfig::new(name, RouteMatch::any());
    cfg.algorithm = algorithm;
    cfg.window = WindowSpec::new(Duration::from_secs(1), Duration::from_millis(50)).unwrap();
    let c = &mut cfg.controller;
    (c.danger_roc, c.safe_roc, c.min_rps, c.min_samples) = (20.0, 10.0, 1.0, 5);
    (c.hold, c.min_dwell) = (Duration::from_millis(500), Duration::from_millis(200));
    (c.restore_step_rps, c.restore_interval) = (base / 10.0, Duration::from_millis(200));
    c.base_limit_rps = base;
    c.cut_limit_rps = base * cut;
    cfg
}

/// The burst of a route's `route_limit`: the route's `burst`, or a window counter's
/// window.
fn total_burst(algorithm: Algorithm) -> Duration {
    match algorithm {
        Algorithm::TokenBucket { burst } => burst,
        Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } => window,
        _ => Duration::from_secs(1),
    }
}

/// A change made while a load runs, at a fraction of its length: the route's own
/// base and cut limits (`Engine::update_route`, the cut a fraction of the base), or
/// the instances the total is shared by (`Engine::set_route_limit_share`).
#[derive(Clone, Copy, Debug)]
enum Change {
    Limits(f64, f64),
    Share(u64),
}

/// A [`Change`] and when, a fraction of the load's length.
fn change() -> impl Strategy<Value = (f64, Change)> {
    let kind = prop_oneof![
        ((1.0f64..50.0), (0.1f64..=1.0)).prop_map(|(b, c)| Change::Limits(b, c)),
        (1u64..5).prop_map(Change::Share),
    ];
    (0.0f64..1.0, kind)
}

/// A scheduled event: its start after the previous one's end and its length,
/// seconds, its base limit, its cut as a fraction of it, and its own `route_limit`.
fn events() -> impl Strategy<Value = Vec<(f64, f64, f64, f64, f64)>> {
    prop::collection::vec(
        (
            0.0f64..10.0,
            0.5f64..8.0,
            1.0f64..50.0,
            0.1f64..=1.0,
            2.0f64..100.0,
        ),
        0..3,
    )
}

/// The rate algorithms a `route_limit` takes, with the burst its total takes: a
/// token bucket's drawn, or a window counter's window of 10 s.
fn total_algorithm() -> impl Strategy<Value = Algorithm> {
    let window = Duration::from_secs(10);
    prop_oneof![
        4 => (1u64..3_000).prop_map(|ms| Algorithm::TokenBucket {
            burst: Duration::from_millis(ms)
        }),
        1 => Just(Algorithm::FixedWindow { window }),
        1 => Just(Algorithm::SlidingWindow { window }),
    ]
}

proptest! {
    #![proptest_config(cases(64))]

    /// A partitioned route's `route_limit`, under surges that cut the route and calms
    /// that restore it, runtime changes of the keys' limits (`Engine::update_route`),
    /// scheduled events that set their own total, and changes of the instances it is
    /// shared by (`Engine::set_route_limit_share`) at any instant, admits in every
    /// interval [a, b] at most the capacity of the largest total configured (the
    /// route's or an event's: a cut and a fleet's share only lower it) plus its rate
    /// × (b − a), plus one (README: the total is a token bucket at `route_limit` with
    /// the route's burst, scaled by a cut and shared by a fleet, each a limit change,
    /// "tokens clamped, never refilled": lowered then raised, no fresh burst); no
    /// change of the limits or the share leaves the total more tokens than it had
    /// just before; each key admits no more than its own limiter at the largest base
    /// limit it had, and each key of a tier no more than one at the tier's base limit
    /// (the tier's limit follows the cut between its own cut and base limits).
    #[test]
    fn a_route_limit_holds_its_bound_through_cuts_events_and_share_changes(
        algorithm in total_algorithm(),
        base in 1.0f64..50.0,
        cut in 0.1f64..=1.0,
        own_total in 2.0f64..100.0,
        tier in prop::option::of((1.0f64..100.0, 0.1f64..=1.0)),
        keys in 2u32..8,
        load in surges(),
        changes in prop::collection::vec(change(), 0..6),
        planned in events(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 64),
    ) {
        let mut cfg = surging_route("keyed", algorithm, base, cut);
        cfg.partition = Partition::ClientIp(KeyLimits::default());
        cfg.route_limit_rps = Some(own_total);
        // Keys 0 and 1 are the tier's, if there is one.
        if let Some((tier_base, tier_cut)) = tier {
            let values = ["10.0.0.0", "10.0.0.1"];
            cfg.tiers = vec![Tier::new("partner", values, tier_base, tier_base * tier_cut)];
        }
        let (mut most_base, mut most_total) = (base, own_total);
        let mut start = 0.0;
        for (i, &(after, length, event_base, event_cut, event_total)) in
            planned.iter().enumerate()
        {
            start += after;
            let mut p = cfg.controller.clone();
            p.base_limit_rps = event_base;
            p.cut_limit_rps = event_base * event_cut;
            p.restore_step_rps = event_base / 10.0;
            let mut event = Event::new(
                format!("event{i}"),
                SystemTime::UNIX_EPOCH + Duration::from_secs_f64(start),
                Duration::from_secs_f64(length),
                p,
            );
            event.route_limit_rps = Some(event_total);
            cfg.events.push(event);
            (most_base, most_total) = (most_base.max(event_base), most_total.max(event_total));
            start += length;
        }
        let mut params = cfg.controller.clone();
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        let reads = surge_reads(&load);
        let end = *reads.last().unwrap() as f64;
        let mut changes: Vec<(u64, Change)> =
            changes.into_iter().map(|(at, c)| ((at * end) as u64, c)).collect();
        changes.sort_by_key(|&(at, _)| at);
        let mut changes = changes.into_iter().peekable();
        let mut own: Vec<Admitted> = (0..keys).map(|_| Admitted::default()).collect();
        let mut all = Vec::new();
        // A change of the route's parameters holds off cuts for a window.
        let mut changed = false;
        for (i, &read) in reads.iter().enumerate() {
            while let Some((at, change)) = changes.next_if(|&(at, _)| at <= read) {
                let at = Nanos::new(at);
                // The silence before the change stepped first, as the change steps
                // it: a restore step in it raises the total from its own slot.
                e.catch_up(id, at);
                let before = e.route_snapshot(id, at).unwrap().route_limit.unwrap();
                match change {
                    Change::Limits(b, c) => {
                        params.base_limit_rps = b;
                        params.cut_limit_rps = b * c;
                        params.restore_step_rps = b / 10.0;
                        e.update_route(id, params.clone(), at).unwrap();
                        most_base = most_base.max(b);
                        changed = true;
                    }
                    Change::Share(n) => e.set_route_limit_share(n, at),
                }
                // Clamped, never refilled: no more tokens than before the change.
                let after = e.route_snapshot(id, at).unwrap().route_limit.unwrap();
                prop_assert!(
                    after.level.value <= before.level.value + 1e-9,
                    "{change:?} took the total from {:?} to {:?}", before, after
                );
            }
            let k = picks[i % picks.len()].index(keys as usize);
            let d = e.check(id, ip(k as u32), Nanos::new(read));
            if d.is_admit() {
                all.push(read);
            }
            own[k].push(read, &d);
        }
        let cuts = e.route_snapshot(id, Nanos::new(end as u64)).unwrap().cuts;
        prop_assert!(cuts > 0 || changed, "the load never cut the route");
        let burst = total_burst(algorithm);
        within_rate(&mut all, capacity(most_total, burst), kept_rate(most_total))?;
        for (k, key) in own.iter_mut().enumerate() {
            match tier {
                Some((tier_base, _)) if k < 2 => key.bounded(algorithm, tier_base, 0)?,
                _ => key.bounded(algorithm, most_base, 0)?,
            }
        }
    }
}

proptest! {
    #![proptest_config(cases(64))]

    /// A refusal by a partitioned route's `route_limit` with the reason `limit` (out
    /// of a cut), after surges that cut and restore the route, tells exactly when to
    /// come back (README: "told to wait for the later of the total's next token and
    /// its key's … exactly"): the key's request read `retry_after` later is admitted,
    /// if nothing else came meanwhile; on a token bucket, whose waits are one clock's
    /// arithmetic, one read a nanosecond sooner is refused (a window counter admits
    /// within its float tolerance of the time: tests/route_limit.rs,
    /// `a_refusal_by_the_total_waits_for_the_keys_own_token_too`). The `skip`-th such
    /// refusal is the one retried, on two engines run alike, unless the limit changed
    /// by then (a cut the surge brings, or its restore).
    #[test]
    fn a_refusal_by_the_route_limit_tells_exactly_when_to_come_back(
        algorithm in total_algorithm(),
        base in 1.0f64..50.0,
        cut in 0.1f64..=1.0,
        own_total in 0.5f64..20.0,
        keys in 2u32..8,
        load in surges(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 64),
        skip in 0usize..4,
    ) {
        let mut cfg = surging_route("keyed", algorithm, base, cut);
        cfg.partition = Partition::ClientIp(KeyLimits::default());
        cfg.route_limit_rps = Some(own_total);
        let config = Config::new(vec![cfg]);
        let reads = surge_reads(&load);
        // The engine, run up to the `skip`-th refusal by the total with `limit`: its
        // read, key and wait.
        let refused = || {
            let e = Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
            let id = e.route_at(0).unwrap();
            let (mut by_total, mut seen) = (0, 0);
            for (i, &read) in reads.iter().enumerate() {
                let k = picks[i % picks.len()].index(keys as usize) as u32;
                let now = Nanos::new(read);
                let Decision::Reject(r) = e.check(id, ip(k), now) else { continue };
                let rejected = e.route_snapshot(id, now).unwrap().route_limit.unwrap().rejected;
                if rejected == by_total {
                    continue;
                }
                by_total = rejected;
                if r.reason == Reason::Limit {
                    if seen == skip {
                        return Some((e, id, now, k, r.retry_after));
                    }
                    seen += 1;
                }
            }
            None
        };
        let Some((e, id, now, k, wait)) = refused() else {
            return Ok(());
        };
        prop_assert!(wait > Duration::ZERO);
        let limits = |s: RouteSnapshot| (s.limit_rps, s.route_limit.unwrap().limit_rps);
        let before = limits(e.route_snapshot(id, now).unwrap());
        let admitted = e.check(id, ip(k), now + wait).is_admit();
        // A cut the surge brings meanwhile changes the limit: no promise then.
        if limits(e.route_snapshot(id, now + wait).unwrap()) != before {
            return Ok(());
        }
        prop_assert!(admitted, "refused at {now:?} + {wait:?}");
        if matches!(algorithm, Algorithm::TokenBucket { .. }) {
            let (e, id, ..) = refused().unwrap();
            prop_assert!(
                !e.check(id, ip(k), now + wait - Duration::from_nanos(1)).is_admit(),
                "admitted before {now:?} + {wait:?}"
            );
        }
    }
}

/// A queued ticket's waker: sets its flag when the ticket is woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, AtomicOrdering::SeqCst);
    }
}

/// One step of a concurrency limiter's history: a request, a release of one of the
/// permits held, a queued request giving up its ticket, or a limit change.
#[derive(Clone, Debug)]
enum Flight {
    Request,
    Release(prop::sample::Index),
    GiveUp(prop::sample::Index),
    Limit(f64),
}

/// The tickets waiting, oldest first: each with its number, its waker's flag and
/// whether it has been polled.
type Tickets = Vec<(usize, Pin<Box<Ticket>>, Arc<Flag>, bool)>;

/// Polls, oldest first, the tickets new or woken, until none is, as a runtime runs
/// the tasks woken: each granted must be the oldest waiting, and take no permit past
/// `limit`.
fn poll_woken(
    tickets: &mut Tickets,
    held: &mut Vec<Permit>,
    limit: usize,
) -> Result<(), TestCaseError> {
    while let Some(i) = tickets
        .iter()
        .position(|(_, _, flag, polled)| !polled || flag.0.swap(false, AtomicOrdering::SeqCst))
    {
        let (n, ticket, flag, polled) = &mut tickets[i];
        *polled = true;
        let waker = Waker::from(Arc::clone(flag));
        if let Poll::Ready(p) = ticket.as_mut().poll(&mut Context::from_waker(&waker)) {
            let (n, oldest) = (*n, tickets[0].0);
            prop_assert!(
                held.len() < limit,
                "ticket {n} granted with {} held, limit {limit}",
                held.len()
            );
            prop_assert_eq!(i, 0, "ticket {} granted before {}", n, oldest);
            held.push(p);
            tickets.remove(i);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(cases(256))]

    /// A concurrency limiter with a queue, its tickets polled as a runtime polls them
    /// (once when queued, then whenever woken, oldest first: after a step, or after
    /// some more requests, releases and tickets given up, before a limit change),
    /// through releases in any order, tickets given up and limit changes: it never
    /// grants a permit that takes those held past the limit in force; a request is
    /// queued only while fewer than `queue` wait, refused `queue_full` only when
    /// `queue` do, and takes a permit at once only when none waits (a permit freed for
    /// a ticket not yet polled is the ticket's); queued requests are granted in
    /// arrival order, each as a permit comes free for it (README: "woken in arrival
    /// order, one per freed permit; a limit raised … wakes as many as it frees
    /// permits for"): none waits, once the woken are polled, while a permit under the
    /// limit is free; and a ticket given up frees its place (`waiting` counts the
    /// tickets held).
    #[test]
    fn a_concurrency_queue_grants_in_order_under_its_limit_through_changes(
        first in 0.0f64..6.0,
        queue in 1u32..6,
        steps in prop::collection::vec(
            (
                prop_oneof![
                    4 => Just(Flight::Request),
                    3 => any::<prop::sample::Index>().prop_map(Flight::Release),
                    1 => any::<prop::sample::Index>().prop_map(Flight::GiveUp),
                    1 => (0.0f64..6.0).prop_map(Flight::Limit),
                ],
                prop::bool::weighted(0.75),
            ),
            1..300,
        ),
    ) {
        let permits = |limit: f64| limit.floor() as usize;
        let c = Concurrency::new(first, queue);
        let mut limit = permits(first);
        let mut held: Vec<Permit> = Vec::new();
        let mut tickets: Tickets = Vec::new();
        let mut queued = 0;
        for (step, poll) in steps {
            match step {
                Flight::Request => match c.check(Nanos::ZERO) {
                    Decision::Admit(Admit::Held(p)) => {
                        prop_assert!(tickets.is_empty(), "a permit taken past {} waiting", tickets.len());
                        prop_assert!(held.len() < limit, "granted with {} held, limit {limit}", held.len());
                        held.push(p);
                    }
                    Decision::Admit(Admit::Queued(t)) => {
                        prop_assert!(tickets.len() < queue as usize, "queued behind {} of {queue}", tickets.len());
                        tickets.push((queued, Box::pin(t), Arc::new(Flag(AtomicBool::new(false))), false));
                        queued += 1;
                    }
                    Decision::Reject(r) => {
                        prop_assert_eq!(r.reason, Reason::QueueFull);
                        prop_assert_eq!(tickets.len(), queue as usize);
                    }
                    Decision::Admit(other) => prop_assert!(false, "{other:?}"),
                },
                Flight::Release(i) if !held.is_empty() => drop(held.remove(i.index(held.len()))),
                Flight::GiveUp(i) if !tickets.is_empty() => drop(tickets.remove(i.index(tickets.len()))),
                Flight::Release(_) | Flight::GiveUp(_) => {}
                Flight::Limit(l) => {
                    // The woken run before the change.
                    poll_woken(&mut tickets, &mut held, limit)?;
                    c.set_limit(l);
                    limit = permits(l);
                }
            }
            if poll {
                poll_woken(&mut tickets, &mut held, limit)?;
                prop_assert!(
                    tickets.is_empty() || held.len() >= limit,
                    "{} waiting with {} held, limit {limit}", tickets.len(), held.len()
                );
            }
            prop_assert_eq!(c.level().value as usize, held.len());
            prop_assert_eq!(c.waiting() as usize, tickets.len());
        }
    }
}
