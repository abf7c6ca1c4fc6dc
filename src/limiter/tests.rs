use super::*;
use crate::sync::{Arc, AtomicU64, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

fn admitted(d: Decision) -> bool {
    d.is_admit()
}

#[test]
fn token_bucket_burst_then_rate() {
    let b = TokenBucket::new(100.0, Duration::from_secs(1), ms(0));
    let n = (0..150).filter(|_| admitted(b.check(ms(0)))).count();
    assert_eq!(n, 100);
    let r = b.check(ms(0)).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_millis(10));
    assert!(!admitted(b.check(ms(9))));
    assert!(admitted(b.check(ms(10))));
    // A second later, a full second of tokens minus the one just taken... capped at capacity.
    let n = (0..150).filter(|_| admitted(b.check(ms(2000)))).count();
    assert_eq!(n, 100);
}

#[test]
fn a_limit_written_as_n_per_burst_holds_n_tokens() {
    // 1,000 per 1.1 s is 909.090909090909 req/s, whose product with the burst
    // comes out of the float arithmetic as 999.9999999999999: floored, the bucket
    // held 999 tokens (the window counters' quotas already count it as 1,000).
    for (limit, burst_ms, n) in [
        (909.090909090909, 1_100, 1_000),
        (30.3030303030303, 1_100, 33),
        (1.0 / 0.7, 7_000, 10),
    ] {
        let b = TokenBucket::new(limit, Duration::from_millis(burst_ms), ms(0));
        let taken = (0..=n).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(taken, n, "{limit} req/s with a burst of {burst_ms} ms");
        assert_eq!(b.level(ms(0)).capacity, n as f64);
    }
}

/// Greedy requests at `limit` over `intervals` of it on the manual clock, each sent
/// the moment the limiter allows (a rejection's `retry_after` later): the
/// requests admitted and the span, in ns.
fn greedy(limiter: &Limiter, limit: f64, intervals: f64) -> (u64, u64) {
    let span_ns = (intervals * 1e9 / limit) as u64;
    let (mut now, mut admitted) = (Nanos::ZERO, 0);
    while now.as_u64() <= span_ns {
        match limiter.check(now) {
            Decision::Admit(Admit::Now) => admitted += 1,
            Decision::Admit(other) => panic!("{other:?} with no queue"),
            Decision::Reject(r) => {
                assert!(r.retry_after > Duration::ZERO);
                now = now + r.retry_after;
            }
        }
    }
    (admitted, span_ns)
}

#[test]
fn up_to_the_largest_spaced_rate_a_bucket_keeps_to_its_limit_within_a_thousandth() {
    // The bound, and the rates just under it that round furthest: 1e9 / 500.4999
    // ns is spaced 500 ns apart, 1e9 / 500.5001 is 501.
    let rates = [
        MAX_SPACED_RATE,
        1e9 / 500.4999,
        1e9 / 500.5001,
        1_999_999.0,
        1_234_567.0,
    ];
    for limit in rates {
        for (limiter, capacity) in [
            (
                Limiter::new(
                    Algorithm::TokenBucket {
                        burst: Duration::from_millis(1),
                    },
                    limit,
                    Nanos::ZERO,
                ),
                (limit / 1e3).floor(),
            ),
            (
                Limiter::new(Algorithm::LeakyBucket { queue: 0 }, limit, Nanos::ZERO),
                1.0,
            ),
        ] {
            let (admitted, span_ns) = greedy(&limiter, limit, 1e5);
            let expected = capacity + limit * span_ns as f64 / 1e9;
            let off = (admitted as f64 - expected).abs() / expected;
            assert!(
                off <= 1e-3,
                "{limit}: {admitted} admitted, {expected} expected"
            );
        }
    }
    // What the bound keeps out: 7 × 10^8 req/s is spaced 1 ns apart, 10^9 req/s.
    let burst = Duration::from_millis(1);
    let b = Limiter::new(Algorithm::TokenBucket { burst }, 7e8, Nanos::ZERO);
    let (admitted, span_ns) = greedy(&b, 7e8, 1e5);
    let rate = (admitted as f64 - 7e5) * 1e9 / span_ns as f64;
    assert!((rate - 1e9).abs() < 1e6, "{rate}");
}

#[test]
fn at_the_largest_spaced_rate_a_rejection_says_when_to_come_back() {
    let b = TokenBucket::new(MAX_SPACED_RATE, Duration::from_millis(1), ms(0));
    let n = (0..3_000).filter(|_| admitted(b.check(ms(0)))).count();
    assert_eq!(n, 2_000);
    let r = b.check(ms(0)).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_nanos(500));
    assert!(!admitted(b.check(Nanos::new(499))));
    assert!(admitted(b.check(Nanos::new(500))));
    let leaky = LeakyBucket::new(MAX_SPACED_RATE, 0);
    assert!(admitted(leaky.check(ms(0))));
    let r = leaky.check(ms(0)).rejection().unwrap();
    assert_eq!(
        (r.retry_after, r.reason),
        (Duration::from_nanos(500), Reason::QueueFull)
    );
}

#[test]
fn the_largest_bucket_the_config_takes_holds_every_token() {
    // The longest burst at 1000 req/s: 4294967295 tokens, all the capacity keeps.
    let most = Duration::from_millis(u32::MAX.into());
    let b = TokenBucket::new(1000.0, most, ms(0));
    assert_eq!(b.level(ms(0)).capacity, f64::from(gcra::MAX_TOKENS));
    assert!(admitted(b.check(ms(0))));
    assert_eq!(b.level(ms(0)).value, f64::from(gcra::MAX_TOKENS) - 1.0);
    // Beyond it (which the config refuses) the capacity saturates rather than
    // wraps, whatever the product, and decisions go on: built in code, 10^12 req/s
    // (an interval of 1 ns) for the longest burst holds as many tokens as fit.
    for (limit, burst) in [
        (1e6, Duration::from_secs(7200)),
        (1e12, most),
        (f64::MAX, most),
    ] {
        let b = TokenBucket::new(limit, burst, ms(0));
        assert_eq!(
            b.level(ms(0)).capacity,
            f64::from(gcra::MAX_TOKENS),
            "{limit}"
        );
        let n = (0..1000).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(n, 1000, "{limit}");
        let left = b.level(ms(0)).value;
        assert!(
            left > 4e9 && left < f64::from(gcra::MAX_TOKENS),
            "{limit}: {left}"
        );
    }
}

#[test]
fn token_bucket_limit_change_keeps_tokens() {
    let b = TokenBucket::new(200.0, Duration::from_secs(1), ms(0));
    for _ in 0..150 {
        assert!(admitted(b.check(ms(0))));
    }
    assert!((b.level(ms(0)).value - 50.0).abs() < 1e-6);
    // Cut to 60: capacity 60, the 50 tokens stay.
    b.set_limit(60.0, ms(0));
    let l = b.level(ms(0));
    assert!((l.value - 50.0).abs() < 1e-6, "{l:?}");
    assert!((l.capacity - 60.0).abs() < 1e-6);
    // Raise to 200 again: still 50 tokens, not a fresh burst.
    b.set_limit(200.0, ms(0));
    assert!((b.level(ms(0)).value - 50.0).abs() < 1e-6);
    // From full, a cut clamps to the new capacity.
    let b = TokenBucket::new(200.0, Duration::from_secs(1), ms(0));
    b.set_limit(60.0, ms(0));
    let n = (0..300).filter(|_| admitted(b.check(ms(0)))).count();
    assert_eq!(n, 60);
}

/// A change dated in the past (the engine dates a route's change at the slot
/// where its controller made it, and a key's at its route's change) keeps the
/// tokens decisions took after that date. 10/s with 10 tokens, emptied at 0 and
/// then one request every 100 ms to 1 s: 20 admitted, all that 10/s with 10
/// tokens allows by 1 s. At 1 s the limit is cut to 1/s (1 token), dated at 0.
/// Rescaled at 0, the TAT (2 s) read as fewer than no tokens, was taken as none,
/// and the bucket, empty at 0 at 1/s, held a token at 1 s: a 21st admission by
/// 1 s, more than either limit allows. Rescaled at 1 s (the TAT less τ: the
/// latest decision it shows), it is empty at 1 s and refills at 1/s from then.
#[test]
fn a_backdated_change_gives_back_no_token_taken_after_its_date() {
    let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    let mut n = (0..20).filter(|_| admitted(b.check(ms(0)))).count();
    n += (1..=10).filter(|i| admitted(b.check(ms(i * 100)))).count();
    assert_eq!(n, 20);
    b.set_limit(1.0, ms(0));
    let r = b
        .check(ms(1_000))
        .rejection()
        .expect("a 21st admission by 1 s");
    assert_eq!(r.retry_after, Duration::from_secs(1));
    assert!(admitted(b.check(ms(2_000))));
    // With no decision after its date, a change dated in the past counts from
    // there: emptied at 0 at 1/s, raised to 10/s dated at 0, it holds 5 tokens
    // at 500 ms, not the half token 1/s gave back.
    let b = TokenBucket::new(1.0, Duration::from_secs(1), ms(0));
    assert!(admitted(b.check(ms(0))));
    b.set_limit(10.0, ms(0));
    let n = (0..20).filter(|_| admitted(b.check(ms(500)))).count();
    assert_eq!(n, 5);
}

#[test]
fn a_decision_midway_through_a_change_goes_on_at_the_old_rate() {
    // 10 req/s, 10 tokens, 4 taken. A change to 2/s (capacity 2) is held half-way,
    // its tokens' word marked: decisions meanwhile neither wait nor see the new
    // rate, and the change then keeps the half token they left.
    let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    for _ in 0..4 {
        assert!(admitted(b.check(ms(0))));
    }
    b.words()
        .set_midway(gcra::params(2.0, b.burst_ms), ms(0), || {
            let level = b.level(ms(0));
            assert_eq!((level.value, level.capacity), (6.0, 10.0));
            for _ in 0..5 {
                assert!(admitted(b.check(ms(0))));
            }
            b.lower_to(0.5, ms(0));
            assert_eq!(b.level(ms(0)).value, 0.5);
            let r = b.check(ms(0)).rejection().unwrap();
            assert_eq!(r.retry_after, Duration::from_millis(50));
        });
    // Half a token at 10/s is half a token at 2/s: 250 ms to the next.
    let level = b.level(ms(0));
    assert_eq!((level.value, level.capacity), (0.5, 2.0));
    let r = b.check(ms(0)).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_millis(250));
    assert!(admitted(b.check(ms(250))));
}

#[test]
fn tokens_survive_the_change_count_wrapping() {
    // The TAT word counts changes in 4 bits: 40 changes wrap it twice.
    let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    for _ in 0..3 {
        assert!(admitted(b.check(ms(0))));
    }
    for i in 0..40 {
        b.set_limit(if i % 2 == 0 { 20.0 } else { 10.0 }, ms(0));
        let level = b.level(ms(0));
        assert!((level.value - 7.0).abs() < 1e-6, "change {i}: {level:?}");
    }
    let n = (0..20).filter(|_| admitted(b.check(ms(0)))).count();
    assert_eq!(n, 7);
    // Refilled, it reads as full to the key table's sweep, count and all.
    assert!(!b.words().full(ms(999)));
    assert!(b.words().full(ms(1_000)));
}

#[test]
fn a_bucket_past_the_latest_now_it_sees_stays_whole() {
    // Past 2^59 − 2^57 ns a bucket holds `now` there: its TAT, up to `now + τ` at
    // the most τ (a limit of zero), still fits below the change count, which
    // changes and decisions then keep intact.
    let late = Nanos::new(u64::MAX);
    let b = TokenBucket::new(0.0, Duration::from_secs(1), late);
    assert!(b.words().full(late));
    assert!(admitted(b.check(late)));
    let r = b.check(late).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_nanos(1 << 57));
    for i in 0..20 {
        b.set_limit(if i % 2 == 0 { 0.0 } else { 1.0 }, late);
        assert_eq!(b.level(late).value, 0.0, "change {i}");
        assert!(!admitted(b.check(late)), "change {i}");
    }
    b.lower_to(0.0, late);
    assert_eq!(b.level(late).value, 0.0);
    // A full bucket there admits its capacity, and then no more.
    let b = TokenBucket::new(10.0, Duration::from_secs(1), late);
    b.set_limit(5.0, late);
    let n = (0..20).filter(|_| admitted(b.check(late))).count();
    assert_eq!(n, 5);
}

#[test]
fn a_bucket_at_a_limit_of_zero_admits_one_then_waits_the_most_tau_allows() {
    let b = TokenBucket::new(0.0, Duration::from_secs(1), ms(0));
    assert!(admitted(b.check(ms(0))));
    let r = b.check(ms(0)).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_nanos(1 << 57));
}

#[test]
fn lowering_a_bucket_never_refills_it() {
    let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    for _ in 0..7 {
        assert!(admitted(b.check(ms(0))));
    }
    // 3 left: lowering to 5 (or to more than the capacity) leaves 3.
    b.lower_to(5.0, ms(0));
    b.lower_to(1e9, ms(0));
    assert!((b.level(ms(0)).value - 3.0).abs() < 1e-9);
    let n = (0..10).filter(|_| admitted(b.check(ms(0)))).count();
    assert_eq!(n, 3);
    // Empty: lowering an empty bucket changes nothing, not even its wait.
    let wait = b.check(ms(0)).rejection().unwrap().retry_after;
    b.lower_to(0.0, ms(0));
    assert_eq!(b.check(ms(0)).rejection().unwrap().retry_after, wait);
}

#[test]
fn a_lowered_bucket_admits_the_level_then_refills_from_it() {
    let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    b.lower_to(2.5, ms(0));
    assert!((b.level(ms(0)).value - 2.5).abs() < 1e-9);
    let n = (0..10).filter(|_| admitted(b.check(ms(0)))).count();
    assert_eq!(n, 2);
    // Half a token left: the next one is 50 ms away, then one per 100 ms.
    let r = b.check(ms(0)).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_millis(50));
    assert!(admitted(b.check(ms(50))));
    assert!(!admitted(b.check(ms(149))));
    assert!(admitted(b.check(ms(150))));
    // Later, the bucket is full again: lowering did not shrink it.
    let n = (0..20).filter(|_| admitted(b.check(ms(2_000)))).count();
    assert_eq!(n, 10);
}

#[test]
fn lowering_stops_at_empty_where_an_admission_of_the_last_token_does() {
    // One bucket emptied by admissions, one lowered to nothing (or less, or NaN):
    // both hold no token and say the same wait.
    let emptied = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    for _ in 0..10 {
        assert!(admitted(emptied.check(ms(0))));
    }
    for tokens in [0.0, -4.0, f64::NAN] {
        let lowered = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        lowered.lower_to(tokens, ms(0));
        assert_eq!(lowered.level(ms(0)).value, 0.0, "{tokens}");
        assert_eq!(
            lowered.check(ms(0)).rejection().unwrap().retry_after,
            emptied.check(ms(0)).rejection().unwrap().retry_after,
            "{tokens}"
        );
        assert!(admitted(lowered.check(ms(100))));
        assert!(!admitted(lowered.check(ms(100))));
    }
}

#[test]
fn lowering_follows_a_limit_change() {
    // Lowered to 4 of 10, then cut to 5 req/s (capacity 5): still 4, refilling at 5/s.
    let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    b.lower_to(4.0, ms(0));
    b.set_limit(5.0, ms(0));
    let l = b.level(ms(0));
    assert!((l.value - 4.0).abs() < 1e-6 && l.capacity == 5.0, "{l:?}");
    b.lower_to(1.0, ms(100));
    // 1 token at 100 ms, the next 200 ms later.
    assert!(admitted(b.check(ms(100))));
    assert!(!admitted(b.check(ms(299))));
    assert!(admitted(b.check(ms(300))));
}

#[test]
fn fixed_window_counts_per_window() {
    let w = FixedWindow::new(10.0, Duration::from_secs(1), Nanos::ZERO);
    let n = (0..20).filter(|_| admitted(w.check(ms(100)))).count();
    assert_eq!(n, 10);
    let r = w.check(ms(300)).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_millis(700));
    assert!(admitted(w.check(ms(1000))));
    assert_eq!(w.level(ms(1000)).value, 1.0);
    w.set_limit(1.0);
    assert!(!admitted(w.check(ms(1001))));
}

#[test]
fn a_quota_a_rounding_error_short_of_whole_is_whole() {
    // 909.090909090909 × 1.1 s comes out of the product as 999.9999999999999.
    let w = FixedWindow::new(909.090909090909, Duration::from_millis(1_100), Nanos::ZERO);
    assert_eq!(w.level(ms(0)).capacity, 1_000.0);
    let w = SlidingWindowCounter::new(1.0 / 0.033, Duration::from_millis(33), Nanos::ZERO);
    assert!(admitted(w.check(ms(0))));
    // A quota really below a whole number still rounds down.
    let w = FixedWindow::new(999.99, Duration::from_secs(1), Nanos::ZERO);
    assert_eq!(w.level(ms(0)).capacity, 999.0);
}

/// A counter built in the last second before its 24-bit window index wraps counts its
/// first request in that request's window, not in the window 0 still to come.
#[test]
fn a_window_counter_built_just_before_the_index_wraps_starts_in_its_window() {
    let wrap = Nanos::from_millis(1 << 24);
    let built = Nanos::new(wrap.as_u64() - 500_000_000);
    let w = FixedWindow::new(1000.0, Duration::from_millis(1), built);
    let s = SlidingWindowCounter::new(1000.0, Duration::from_millis(1), built);
    assert!(admitted(w.check(built)));
    assert!(admitted(s.check(built)));
    // Window 0, after the wrap: the counts of 0.5 s earlier are not in it.
    assert!(admitted(w.check(wrap)));
    assert!(admitted(s.check(Nanos::new(wrap.as_u64() + 999_999))));
}

#[test]
fn a_late_reader_cannot_reopen_a_counted_window() {
    let w = FixedWindow::new(2.0, Duration::from_secs(1), Nanos::ZERO);
    assert!(admitted(w.check(ms(1000))));
    assert!(admitted(w.check(ms(1000))));
    // A thread that read the clock in the previous window arrives late.
    let r = w.check(ms(999)).rejection().unwrap();
    assert_eq!(r.retry_after, Duration::from_millis(1001));
    assert!(admitted(w.check(ms(999) + r.retry_after)));
}

#[test]
fn window_counters_count_afresh_once_their_packed_index_wraps() {
    // The word keeps 24 bits of window index: 2^23 windows of 10 ms is 23 hours.
    // Uptime or idleness past that must not read as a window still to come.
    let window = Duration::from_millis(10);
    let late = Nanos::new(((1 << 23) + 5) * 10_000_000);
    let fixed = FixedWindow::new(100.0, window, Nanos::ZERO);
    let sliding = SlidingWindowCounter::new(100.0, window, Nanos::ZERO);
    // One request per window (the quota), every other window.
    for w in [0, 2, 4] {
        let now = late + window * w;
        assert!(admitted(fixed.check(now)), "fixed, window {w}");
        assert!(admitted(sliding.check(now)), "sliding, window {w}");
    }
    // A full window still says when it ends.
    let r = fixed.check(late + window * 4).rejection().unwrap();
    assert_eq!(r.retry_after, window);
}

#[test]
fn a_window_counter_idle_for_a_whole_wrap_reads_its_last_count_for_at_most_a_second() {
    // 1 ms windows, 2 requests each; the packed index wraps every 2^24 windows
    // (4.66 h) and a word up to a second (1,000 windows) ahead is a late reader's.
    const WRAP: u64 = 1 << 24;
    let window = Duration::from_millis(1);
    let full = || {
        let fixed = FixedWindow::new(2_000.0, window, Nanos::ZERO);
        let sliding = SlidingWindowCounter::new(2_000.0, window, Nanos::ZERO);
        for _ in 0..2 {
            assert!(admitted(fixed.check(ms(0))));
            assert!(admitted(sliding.check(ms(0))));
        }
        (fixed, sliding)
    };
    let retry = |d: Decision| d.rejection().map(|r| r.retry_after.as_micros());
    // Idle past half the wrap, or more than a second short of a whole wrap, or two
    // windows past it: a fresh window.
    for idle in [WRAP / 2 + 1, WRAP - 1_001, WRAP + 2, 3 * WRAP + 2] {
        let (fixed, sliding) = full();
        assert!(admitted(fixed.check(ms(idle))), "fixed, idle {idle} ms");
        assert!(admitted(sliding.check(ms(idle))), "sliding, idle {idle} ms");
    }
    // A second short of a whole wrap: the word reads as a window 1,000 ms ahead,
    // which its last count filled: refused until that window ends.
    let (fixed, sliding) = full();
    assert_eq!(retry(fixed.check(ms(WRAP - 1_000))), Some(1_001_000));
    assert_eq!(retry(sliding.check(ms(WRAP - 1_000))), Some(1_001_500));
    // Exactly a whole wrap: the last count is this window's.
    let (fixed, sliding) = full();
    assert_eq!(retry(fixed.check(ms(WRAP))), Some(1_000));
    assert_eq!(retry(sliding.check(ms(WRAP))), Some(1_500));
    // One window past it: the fixed window starts afresh; the sliding window weighs
    // the last count as the previous window's, for half a window here.
    let (fixed, sliding) = full();
    assert!(admitted(fixed.check(ms(WRAP + 1))));
    assert_eq!(retry(sliding.check(ms(WRAP + 1))), Some(500));
    assert!(admitted(
        sliding.check(ms(WRAP + 1) + Duration::from_micros(500))
    ));
}

#[test]
fn sliding_window_weights_the_previous_window() {
    let w = SlidingWindowCounter::new(10.0, Duration::from_secs(1), Nanos::ZERO);
    let n = (0..20).filter(|_| admitted(w.check(ms(900)))).count();
    assert_eq!(n, 10);
    // At 1.5 s the previous window weighs half: 5 estimated, 5 more fit.
    let n = (0..20).filter(|_| admitted(w.check(ms(1500)))).count();
    assert_eq!(n, 5);
    let r = w.check(ms(1500)).rejection().unwrap();
    // prev 10 × (1 − x) + 5 + 1 ≤ 10 ⇒ x ≥ 0.6: 100 ms from now.
    assert_eq!(r.retry_after, Duration::from_millis(100));
    assert!(admitted(w.check(ms(1600))));
}

/// A sliding window's refusal says exactly when to come back: a request at
/// `retry_after` is admitted, one a nanosecond sooner is not. The weighted count
/// was compared in floating point with a tolerance of 1e-9 requests, which in a
/// window of seconds is several nanoseconds of the previous window's weight: one
/// request per 3.792 s, refused at 0 and told 7.584 s, was admitted at 7.584 s
/// less 3 ns (the previous count times 3 ns over 3.792 s is 0.8e-9), and one per
/// day 86 µs before its two days.
#[test]
fn a_sliding_window_admits_no_sooner_than_its_retry_after() {
    for (limit, window_ms, sends) in [
        (1.0 / 3.792, 3_792, vec![0, 0]),
        (10.0, 1_000, vec![900; 12]),
        (1.0 / 86_400.0, 86_400_000, vec![0, 0]),
        (3.0, 1_000, vec![0, 0, 0, 0, 1_300, 1_300, 1_300]),
    ] {
        let w = SlidingWindowCounter::new(limit, Duration::from_millis(window_ms), Nanos::ZERO);
        let Some((at, r)) = sends
            .iter()
            .find_map(|&t| w.check(ms(t)).rejection().map(|r| (ms(t), r)))
        else {
            panic!("{limit} per s in {window_ms} ms: nothing refused");
        };
        let back = at + r.retry_after;
        let sooner = back - Duration::from_nanos(1);
        assert!(
            !admitted(w.check(sooner)),
            "{limit} per s in {window_ms} ms: admitted before {:?}",
            r.retry_after
        );
        assert!(
            admitted(w.check(back)),
            "{limit} per s in {window_ms} ms: refused at {:?}",
            r.retry_after
        );
    }
}

/// A window counter decided in the last window 64 bits of nanoseconds count, whose
/// end is past them, tells the time to that end and does not overflow: the fixed
/// window computed the end as `(index + 1) × window` (a debug build panicked, "attempt
/// to multiply with overflow"), and so did both counters for a word counted a whole
/// wrap of the index earlier, which reads as a window ahead of `now`.
#[test]
fn window_counters_in_the_last_window_of_the_clock_tell_its_end() {
    let w = 1_000_000_000;
    let end = Nanos::new(u64::MAX);
    let to_end = Duration::from_nanos(w - u64::MAX % w);
    let wrap = Duration::from_secs(1 << 24);
    for sliding in [false, true] {
        let window = Duration::from_secs(1);
        let new = |at: Nanos| {
            if sliding {
                Limiter::SlidingWindow(SlidingWindowCounter::new(1.0, window, at))
            } else {
                Limiter::FixedWindow(FixedWindow::new(1.0, window, at))
            }
        };
        let l = new(end - Duration::from_nanos(5));
        assert!(admitted(l.check(end - Duration::from_nanos(5))));
        let r = l
            .check(end)
            .rejection()
            .expect("the window's one request is taken");
        // The sliding window's count weighs on the whole next window too.
        let want = if sliding { to_end + window } else { to_end };
        assert_eq!(r.retry_after, want, "sliding {sliding}");
        let counted = end - wrap + window;
        let l = new(counted);
        assert!(admitted(l.check(counted)));
        assert!(
            !admitted(l.check(end)),
            "sliding {sliding}: read a wrap later"
        );
    }
}

/// A limiter built or set at a limit no config would hold (0, below 0, no number,
/// far below one request in 11.6 days) never panics and admits at most its first
/// request at once, for every algorithm: a limit of 0 or below made the token
/// bucket's rescale subtract past zero, and a NaN limit gave the window counters
/// their largest quota. (The engine refuses such limits; `Limiter` takes them.)
#[test]
fn absurd_limits_never_panic_and_admit_next_to_nothing() {
    let algorithms = [
        Algorithm::TokenBucket {
            burst: Duration::from_secs(1),
        },
        Algorithm::FixedWindow {
            window: Duration::from_secs(1),
        },
        Algorithm::SlidingWindow {
            window: Duration::from_secs(1),
        },
        Algorithm::LeakyBucket { queue: 4 },
        Algorithm::Concurrency { queue: 2 },
    ];
    for limit in [0.0, -5.0, f64::NAN, 1e-300] {
        for algorithm in algorithms {
            for set_later in [false, true] {
                let l = if set_later {
                    let l = Limiter::new(algorithm, 1.0, ms(0));
                    l.set_limit(limit, ms(0));
                    l
                } else {
                    Limiter::new(algorithm, limit, ms(0))
                };
                let mut at_once = 0;
                let mut held = Vec::new();
                for i in 0..50 {
                    let now = ms(i * 100);
                    match l.check(now) {
                        Decision::Admit(Admit::Now) => at_once += 1,
                        Decision::Admit(admit) => held.push(admit),
                        Decision::Reject(_) => {}
                    }
                    l.set_limit(limit, now);
                }
                assert!(
                    at_once <= 1,
                    "{limit} {} set later {set_later}: {at_once} admitted at once",
                    algorithm.name()
                );
            }
        }
    }
}

#[test]
fn a_leaky_bucket_at_an_absurdly_low_limit_does_not_overflow() {
    // One request per ~150 years, five more may wait: the schedule passes u64.
    let b = LeakyBucket::new(2e-10, 5);
    assert!(matches!(b.check(ms(0)), Decision::Admit(Admit::Now)));
    for _ in 0..6 {
        // Never a wrapped schedule that lets a request through at once.
        match b.check(ms(1)) {
            Decision::Admit(Admit::Paced(pace)) => {
                assert!(pace.wait(ms(1)) > Duration::from_secs(100 * 365 * 86_400))
            }
            other => assert!(other.rejection().is_some(), "{other:?}"),
        }
    }
}

/// The queue stays bounded where the schedule would pass what its word holds: at the
/// lowest limit a file accepts (1e-6 req/s, one request per ~31.7 years) with a queue
/// of 20,000, no more than 20,000 wait. (The schedule saturated at u64::MAX ns, every
/// later request read as waiting within the saturated bound, and 29,999 of 30,000
/// were paced, 11,553 to depart in 584 years.)
#[test]
fn a_leaky_bucket_whose_schedule_would_pass_its_word_keeps_its_queue_bound() {
    let queue = 20_000u32;
    let b = LeakyBucket::new(1e-6, queue);
    let mut waiting = 0u64;
    for _ in 0..30_000 {
        match b.check(ms(0)) {
            Decision::Admit(Admit::Paced(_)) => waiting += 1,
            Decision::Admit(_) => {}
            Decision::Reject(r) => {
                assert_eq!(r.reason, Reason::QueueFull);
                assert!(r.retry_after > Duration::ZERO);
            }
        }
    }
    assert!(waiting <= u64::from(queue), "{waiting} waiting");
}

#[test]
fn leaky_bucket_paces_and_bounds_its_queue() {
    let b = LeakyBucket::new(10.0, 2);
    assert!(matches!(b.check(ms(0)), Decision::Admit(Admit::Now)));
    match b.check(ms(0)) {
        Decision::Admit(Admit::Paced(p)) => {
            assert_eq!(p.wait(ms(0)), Duration::from_millis(100))
        }
        other => panic!("{other:?}"),
    }
    match b.check(ms(0)) {
        Decision::Admit(Admit::Paced(p)) => {
            assert_eq!(p.wait(ms(0)), Duration::from_millis(200))
        }
        other => panic!("{other:?}"),
    }
    let r = b.check(ms(0)).rejection().unwrap();
    assert_eq!(r.reason, Reason::QueueFull);
    assert_eq!(r.retry_after, Duration::from_millis(100));
    assert!(b.check(ms(100)).is_admit());
}

/// A leaky bucket's level counts the requests waiting and the last one sent while
/// its interval runs, of `queue + 1`, and reads exhausted exactly when the next
/// request would be refused: at `queue = 0` an idle bucket has room (it read
/// exhausted, 0 waiting of a queue of 0), one just sent fills it until its
/// interval ends.
#[test]
fn a_leaky_buckets_level_is_exhausted_exactly_when_it_refuses() {
    let leaky = Algorithm::LeakyBucket { queue: 0 };
    let b = LeakyBucket::new(10.0, 0);
    let level = |at| b.level(ms(at));
    assert_eq!(
        level(0),
        Level {
            value: 0.0,
            capacity: 1.0
        }
    );
    assert!(!level(0).exhausted(&leaky));
    assert!(b.check(ms(0)).is_admit());
    assert_eq!(level(0).value, 1.0);
    assert!(level(99).exhausted(&leaky));
    assert!(!b.check(ms(99)).is_admit());
    assert!(!level(100).exhausted(&leaky));
    assert!(b.check(ms(100)).is_admit());

    let queued = Algorithm::LeakyBucket { queue: 2 };
    let b = LeakyBucket::new(10.0, 2);
    for (n, at) in [(1.0, 0), (2.0, 0), (3.0, 0)] {
        assert!(!b.level(ms(at)).exhausted(&queued));
        assert!(b.check(ms(at)).is_admit());
        assert_eq!(
            b.level(ms(at)),
            Level {
                value: n,
                capacity: 3.0
            }
        );
    }
    assert!(b.level(ms(0)).exhausted(&queued));
    assert!(!b.check(ms(0)).is_admit());
    // 50 ms on: one sent at 0, one waiting to 100 ms and one to 200 ms; the wait of
    // one more, 250 ms, passes the queue's 200 ms (2.5 intervals, 3 rounded up).
    assert_eq!(b.level(ms(50)).value, 3.0);
    assert!(!b.check(ms(50)).is_admit());
    assert_eq!(b.level(ms(100)).value, 2.0);
    assert!(b.check(ms(100)).is_admit());
}

/// A cut under a full queue lets more than `queue` wait: the bound is a wait of
/// `queue` intervals at the limit in force, and the requests already waiting keep
/// their shorter spacing (what `Algorithm::LeakyBucket` and README say; they said
/// the bucket never held more than `queue` waiting).
#[test]
fn a_cut_under_a_full_queue_lets_more_than_queue_wait() {
    let b = LeakyBucket::new(100.0, 10);
    let admitted_at_0 = |b: &LeakyBucket| (0..40).filter(|_| b.check(ms(0)).is_admit()).count();
    // One leaves now, 10 wait, 10 ms apart.
    assert_eq!(admitted_at_0(&b), 11);
    b.set_limit(10.0);
    // The 110 ms scheduled, 100 ms more each while the wait is at most 1 s: 9 more.
    assert_eq!(admitted_at_0(&b), 9);
}

/// The pace of a paced decision.
fn paced(d: Decision) -> Pace {
    match d {
        Decision::Admit(Admit::Paced(p)) => p,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_paced_request_dropped_last_gives_its_place_to_the_next() {
    let b = LeakyBucket::new(10.0, 2);
    assert!(matches!(b.check(ms(0)), Decision::Admit(Admit::Now)));
    let first = paced(b.check(ms(0)));
    let second = paced(b.check(ms(0)));
    assert_eq!(
        b.check(ms(0)).rejection().unwrap().reason,
        Reason::QueueFull
    );
    // The last scheduled leaves at 50 ms: the next request takes its 200 ms.
    assert!(b.give_back(second, ms(50)));
    let next = paced(b.check(ms(50)));
    assert_eq!(next.departure(), ms(200));
    assert_eq!(next.wait(ms(50)), Duration::from_millis(150));
    assert_eq!(
        b.check(ms(50)).rejection().unwrap().reason,
        Reason::QueueFull
    );
    // One with a request scheduled behind it keeps its place (the one behind keeps
    // its departure, 100 ms after it).
    assert!(!b.give_back(first, ms(60)));
    assert_eq!(
        b.check(ms(60)).rejection().unwrap().reason,
        Reason::QueueFull
    );
    // The one behind it, last again, gives its place back; the first's place,
    // given up while one was behind it, stays taken until 200 ms.
    assert!(b.give_back(next, ms(60)));
    // The level is the wait of one more, 140 ms, in intervals rounded up.
    assert_eq!(b.level(ms(60)).value, 2.0, "one place, to 200 ms");
    assert_eq!(paced(b.check(ms(70))).departure(), ms(200));
}

#[test]
fn a_paced_request_gives_nothing_back_once_it_departed() {
    let b = LeakyBucket::new(10.0, 1);
    assert!(b.check(ms(0)).is_admit());
    let p = paced(b.check(ms(0)));
    assert_eq!(p.departure(), ms(100));
    // Dropped at its departure or after, it has left: its interval was spent.
    assert!(!b.give_back(p, ms(100)));
    assert!(b.check(ms(100)).is_admit());
    assert_eq!(
        b.check(ms(100)).rejection().unwrap().reason,
        Reason::QueueFull
    );
}

#[test]
fn a_place_given_back_after_a_cut_restores_the_departure_not_the_new_pace() {
    // Scheduled at 10/s, then cut to 2/s: the given-back place is its own
    // departure, and the next request after it is spaced at the pace in force.
    let b = LeakyBucket::new(10.0, 4);
    assert!(b.check(ms(0)).is_admit());
    let p = paced(b.check(ms(0)));
    b.set_limit(2.0);
    let q = paced(b.check(ms(0)));
    assert_eq!(q.departure(), ms(200));
    // Back to front, each is the last scheduled when it leaves.
    assert!(b.give_back(q, ms(10)));
    assert!(b.give_back(p, ms(10)));
    assert_eq!(paced(b.check(ms(10))).departure(), ms(100));
    assert_eq!(paced(b.check(ms(10))).departure(), ms(600));
}

#[test]
fn another_algorithm_has_no_place_to_give_back() {
    let b = LeakyBucket::new(10.0, 1);
    assert!(b.check(ms(0)).is_admit());
    let p = paced(b.check(ms(0)));
    let tb = Limiter::new(
        Algorithm::TokenBucket {
            burst: Duration::from_secs(1),
        },
        10.0,
        ms(0),
    );
    assert!(!tb.give_back(p, ms(0)));
    let leaky = Limiter::new(Algorithm::LeakyBucket { queue: 1 }, 10.0, ms(0));
    assert!(leaky.check(ms(0)).is_admit());
    let p = paced(leaky.check(ms(0)));
    assert!(leaky.give_back(p, ms(0)));
}

#[test]
fn concurrency_permits_are_released_on_drop() {
    let c = Concurrency::new(2.0, 0);
    let a = c.check(Nanos::ZERO);
    let b = c.check(Nanos::ZERO);
    assert!(a.is_admit() && b.is_admit());
    assert_eq!(
        c.check(Nanos::ZERO).rejection().unwrap().reason,
        Reason::Concurrency
    );
    assert_eq!(c.level().value, 2.0);
    drop(a);
    assert!(c.check(Nanos::ZERO).is_admit());
}

fn noop_waker() -> Waker {
    Waker::noop().clone()
}

#[test]
fn concurrency_queue_hands_over_permits() {
    let c = Concurrency::new(1.0, 1);
    let held = c.check(Nanos::ZERO);
    let Decision::Admit(Admit::Queued(mut ticket)) = c.check(Nanos::ZERO) else {
        panic!("expected a queue place");
    };
    assert_eq!(
        c.check(Nanos::ZERO).rejection().unwrap().reason,
        Reason::QueueFull
    );
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert!(Pin::new(&mut ticket).poll(&mut cx).is_pending());
    drop(held);
    let Poll::Ready(permit) = Pin::new(&mut ticket).poll(&mut cx) else {
        panic!("permit not handed over");
    };
    assert_eq!(c.waiting(), 0);
    assert_eq!(c.level().value, 1.0);
    drop(permit);
    assert_eq!(c.level().value, 0.0);
}

/// A waker that counts its wakes.
#[derive(Default)]
struct Wakes(AtomicU64);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

impl Wakes {
    fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A queued request's ticket, and the waker it is polled with.
fn queued(c: &Concurrency) -> (Ticket, Arc<Wakes>) {
    let Decision::Admit(Admit::Queued(ticket)) = c.check(Nanos::ZERO) else {
        panic!("expected a queue place");
    };
    (ticket, Arc::default())
}

fn poll(ticket: &mut Ticket, wakes: &Arc<Wakes>) -> Poll<Permit> {
    let waker = Waker::from(Arc::clone(wakes));
    Pin::new(ticket).poll(&mut Context::from_waker(&waker))
}

#[test]
fn a_ticket_polled_again_takes_no_other_tickets_wake() {
    // A server polls a queued request's future again whenever its connection
    // wakes (a body chunk arriving, say), not only when the ticket is woken.
    let c = Concurrency::new(1.0, 2);
    let held = c.check(Nanos::ZERO);
    let (mut a, wa) = queued(&c);
    let (mut b, wb) = queued(&c);
    assert!(poll(&mut a, &wa).is_pending());
    assert!(poll(&mut a, &wa).is_pending());
    assert!(poll(&mut b, &wb).is_pending());
    drop(held);
    assert_eq!(wa.count(), 1);
    let Poll::Ready(permit) = poll(&mut a, &wa) else {
        panic!("the first in line gets the permit");
    };
    drop(permit);
    assert_eq!(wb.count(), 1, "the permit is free but B sleeps on");
    assert!(poll(&mut b, &wb).is_ready());
}

#[test]
fn raising_the_limit_wakes_the_waiters_it_lets_in() {
    let c = Concurrency::new(1.0, 3);
    let _held = c.check(Nanos::ZERO);
    let mut waiting: Vec<_> = (0..3).map(|_| queued(&c)).collect();
    for (t, w) in &mut waiting {
        assert!(poll(t, w).is_pending());
    }
    c.set_limit(4.0);
    let mut permits = Vec::new();
    for (t, w) in &mut waiting {
        assert!(w.count() >= 1, "a waiter the new limit lets in sleeps on");
        let Poll::Ready(permit) = poll(t, w) else {
            panic!("a woken waiter gets a permit");
        };
        permits.push(permit);
    }
    assert_eq!((c.level().value, c.waiting()), (4.0, 0));
}

#[test]
fn a_woken_ticket_dropped_passes_its_turn_on() {
    let c = Concurrency::new(1.0, 2);
    let held = c.check(Nanos::ZERO);
    let (mut a, wa) = queued(&c);
    let (mut b, wb) = queued(&c);
    assert!(poll(&mut a, &wa).is_pending());
    assert!(poll(&mut b, &wb).is_pending());
    drop(held);
    assert_eq!((wa.count(), wb.count()), (1, 0));
    drop(a);
    assert_eq!(wb.count(), 1);
    assert!(poll(&mut b, &wb).is_ready());
}

#[test]
fn a_woken_ticket_taking_its_permit_wakes_no_one_else() {
    // The executor polls what was woken, and only that.
    let c = Concurrency::new(1.0, 3);
    let held = c.check(Nanos::ZERO);
    let mut line: Vec<_> = (0..3).map(|_| queued(&c)).collect();
    for (t, w) in &mut line {
        assert!(poll(t, w).is_pending());
    }
    drop(held);
    let (a, wa) = &mut line[0];
    assert_eq!(wa.count(), 1);
    let Poll::Ready(permit) = poll(a, wa) else {
        panic!("the first in line gets the permit");
    };
    let woken = |line: &[(Ticket, Arc<Wakes>)]| -> Vec<u64> {
        line[1..].iter().map(|(_, w)| w.count()).collect()
    };
    assert_eq!(woken(&line), [0, 0], "no permit is free: nobody is woken");
    for (t, w) in &mut line[1..] {
        if w.count() > 0 {
            assert!(poll(t, w).is_pending());
        }
    }
    drop(permit);
    assert_eq!(woken(&line), [1, 0], "the second in line is next");
}

#[test]
fn dropping_a_ticket_frees_its_place() {
    let c = Concurrency::new(0.0, 1);
    let t = c.check(Nanos::ZERO);
    assert!(t.is_admit());
    assert_eq!(
        c.check(Nanos::ZERO).rejection().unwrap().reason,
        Reason::QueueFull
    );
    drop(t);
    assert!(c.check(Nanos::ZERO).is_admit());
}

#[test]
fn a_limiter_fits_in_32_bytes() {
    // Kept per route, and for its shadow and overflow limiters.
    assert!(
        std::mem::size_of::<Limiter>() <= 32,
        "{}",
        std::mem::size_of::<Limiter>()
    );
    // Returned by every check: a timed permit (its grant and clock) is no bigger than
    // a paced admission.
    assert!(
        std::mem::size_of::<Decision>() <= 32,
        "{}",
        std::mem::size_of::<Decision>()
    );
}

/// A bucket that takes another's tokens at another rate holds those tokens, not
/// its TAT read at its own rate: the engine starts a route bucket's twin so when a
/// cut engages, and a twin whose change to the base limit found its note taken
/// (left for the next decision) is still at an older base then. 20/s with 10 of 20
/// tokens taken, copied into one at 10/s (both a second's burst), read 5 tokens
/// there, and 5 once changed to 20/s: the twin started 5 tokens short of the route's.
#[test]
fn a_bucket_copied_at_another_rate_takes_its_tokens() {
    let bucket = TokenBucket::new(20.0, Duration::from_secs(1), ms(0));
    for _ in 0..10 {
        assert!(admitted(bucket.check(ms(0))));
    }
    let twin = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
    twin.copy_from(&bucket, ms(0));
    assert_eq!(twin.level(ms(0)).value, 10.0, "10 of its 10 tokens");
    twin.set_limit(20.0, ms(0));
    assert_eq!(twin.level(ms(0)).value, bucket.level(ms(0)).value);
    let lower = TokenBucket::new(40.0, Duration::from_secs(1), ms(0));
    lower.copy_from(&bucket, ms(0));
    assert_eq!(lower.level(ms(0)).value, 10.0);
}

/// Ten thousand queued requests given up (a timeout above the layer, clients gone),
/// most of them listening for a permit, the first in line woken for one as they go:
/// each round leaves the queue holding no one, the freed permit taken at once by the
/// next request, and the queue then takes its whole bound again and hands its permits
/// out in order, one per release. The rounds give up in arrival order, back to front,
/// and the odd ones before the even ones.
#[test]
fn a_queue_emptied_by_ten_thousand_cancellations_takes_its_whole_bound_again() {
    const QUEUE: usize = 10_000;
    let c = Concurrency::new(1.0, QUEUE as u32);
    let line = |c: &Concurrency| -> Vec<(Ticket, Arc<Wakes>)> {
        let line: Vec<_> = (0..QUEUE).map(|_| queued(c)).collect();
        assert_eq!(
            c.check(Nanos::ZERO).rejection().unwrap().reason,
            Reason::QueueFull
        );
        line
    };
    let orders: [fn(usize) -> usize; 3] = [|i| i, |i| QUEUE - 1 - i, |i| (1 - i % 2) * QUEUE + i];
    for order in orders {
        let held = c.check(Nanos::ZERO);
        assert!(matches!(held, Decision::Admit(Admit::Held(_))));
        let mut waiting = line(&c);
        // Every tenth never polled (its future not yet run when its client left).
        for (i, (t, w)) in waiting.iter_mut().enumerate() {
            if i % 10 != 0 {
                assert!(poll(t, w).is_pending());
            }
        }
        drop(held);
        assert_eq!(waiting[1].1.count(), 1, "the first listening is woken");
        let mut waiting: Vec<_> = waiting.into_iter().map(Some).collect();
        let mut at: Vec<usize> = (0..QUEUE).collect();
        at.sort_by_key(|&i| order(i));
        for i in at {
            drop(waiting[i].take());
        }
        assert_eq!((c.waiting(), c.level().value), (0, 0.0));
        let Decision::Admit(Admit::Held(permit)) = c.check(Nanos::ZERO) else {
            panic!("the free permit is taken at once");
        };
        drop(permit);
    }
    let held = c.check(Nanos::ZERO);
    let mut waiting = line(&c);
    for (t, w) in &mut waiting {
        assert!(poll(t, w).is_pending());
    }
    drop(held);
    for (t, w) in &mut waiting {
        assert_eq!(w.count(), 1, "woken in order, one per release");
        let Poll::Ready(permit) = poll(t, w) else {
            panic!("a woken waiter gets the permit");
        };
        assert_eq!(c.level().value, 1.0);
        drop(permit);
    }
    assert_eq!((c.waiting(), c.level().value), (0, 0.0));
}

/// A mean hold is kept in 16 bits, within 0.1% (it was 32 bits, which made a
/// partitioned route's every `concurrency` key 8 bytes bigger, over its budget).
#[test]
fn a_hold_packed_in_16_bits_is_kept_within_a_thousandth() {
    for us in [
        1,
        2047,
        2048,
        2049,
        5_000,
        29_999_999,
        30_000_000,
        3_600_000_000,
    ] {
        let back = concurrency::unpack_us(concurrency::pack_us(us));
        assert!(
            back <= us && (us - back) * 1024 <= us,
            "{us} µs kept as {back}"
        );
    }
    assert_eq!(concurrency::unpack_us(0), 0);
}

/// The permit `d` holds.
fn permit(d: Decision) -> Permit {
    let Decision::Admit(Admit::Held(permit)) = d else {
        panic!("a permit: {d:?}");
    };
    permit
}

/// A refused request is told when a permit is expected to come free, from the holds
/// timed: with `n` permits held about `H` each, one every `H / n`, one more `H / n`
/// for each request queued ahead, and as many as the permits held over a lowered
/// limit. It was told 1 s whatever the holds (30 s uploads sent every refused client
/// back 29 times for nothing); 1 s it stays until a hold is timed.
#[test]
fn a_refusal_is_told_when_a_permit_is_expected_to_come_free() {
    let clock = std::sync::Arc::new(crate::clock::ManualClock::new());
    let on = std::sync::Arc::new(HoldClock::new(clock.clone()));
    let now = || crate::clock::Clock::now(&*clock);
    let retry = |c: &Concurrency| c.check(now()).rejection().unwrap();
    let timed = |d: Decision| {
        let mut p = permit(d);
        p.time_on(&on);
        p
    };
    let c = Concurrency::new(2.0, 0);
    let (a, b) = (permit(c.check(now())), permit(c.check(now())));
    clock.advance(Duration::from_secs(30));
    drop((a, b));
    let (a, b) = (timed(c.check(now())), timed(c.check(now())));
    let r = retry(&c);
    assert_eq!(r.retry_after, Duration::from_secs(1), "nothing timed yet");
    clock.advance(Duration::from_secs(30));
    drop((a, b));
    let (a, b) = (timed(c.check(now())), timed(c.check(now())));
    let r = retry(&c);
    assert_eq!(r.reason, Reason::Concurrency);
    about(r.retry_after, Duration::from_secs(15));
    // Lowered to 1: both held must end.
    c.set_limit(1.0);
    about(retry(&c).retry_after, Duration::from_secs(30));
    c.set_limit(2.0);
    // A 10 s hold weighs 1/8 in the mean: 30 − 20/8 = 27.5 s, over 2 held.
    clock.advance(Duration::from_secs(10));
    drop(a);
    let a = timed(c.check(now()));
    about(retry(&c).retry_after, Duration::from_millis(13_750));
    // Holds of an hour: told at most a minute.
    clock.advance(Duration::from_secs(3600));
    drop((a, b));
    let _held = (timed(c.check(now())), timed(c.check(now())));
    assert_eq!(retry(&c).retry_after, CONCURRENCY_RETRY_MAX);
}

/// A permit whose timing is stopped (one an upgraded connection goes on holding) is
/// released without counting its hold: an hour-long tunnel, weighing 1/8, lifted a
/// mean of 5 ms to 450 s, and every refusal was told the 60 s cap.
#[test]
fn a_permit_no_longer_timed_leaves_the_mean_hold_alone() {
    let clock = std::sync::Arc::new(crate::clock::ManualClock::new());
    let on = std::sync::Arc::new(HoldClock::new(clock.clone()));
    let now = || crate::clock::Clock::now(&*clock);
    let timed = |d: Decision| {
        let mut p = permit(d);
        p.time_on(&on);
        p
    };
    let c = Concurrency::new(1.0, 0);
    let request = timed(c.check(now()));
    clock.advance(Duration::from_millis(5));
    drop(request);
    let mut tunnel = timed(c.check(now()));
    tunnel.stop_timing();
    clock.advance(Duration::from_secs(3600));
    drop(tunnel);
    let _held = timed(c.check(now()));
    about(
        c.check(now()).rejection().unwrap().retry_after,
        Duration::from_millis(5),
    );
}

/// At a limit of 0 no release admits a refused request: it is told the longest wait,
/// [`CONCURRENCY_RETRY_MAX`], as a token bucket at a limit of 0 tells the longest it
/// can, whatever the holds timed and the permits held (it was told 2 × H with none
/// held, (n + 1) × H / n with n held over the limit, 1 s before a hold was timed).
#[test]
fn a_limit_of_0_is_told_the_longest_wait() {
    let clock = std::sync::Arc::new(crate::clock::ManualClock::new());
    let on = std::sync::Arc::new(HoldClock::new(clock.clone()));
    let now = || crate::clock::Clock::now(&*clock);
    let told = |c: &Concurrency, reason| {
        let r = c.check(now()).rejection().unwrap();
        assert_eq!(r.reason, reason);
        r.retry_after
    };
    let untimed = Concurrency::new(0.0, 0);
    assert_eq!(told(&untimed, Reason::Concurrency), CONCURRENCY_RETRY_MAX);
    let c = Concurrency::new(1.0, 0);
    let mut p = permit(c.check(now()));
    p.time_on(&on);
    clock.advance(Duration::from_secs(2));
    drop(p);
    let held = permit(c.check(now()));
    c.set_limit(0.0);
    assert_eq!(told(&c, Reason::Concurrency), CONCURRENCY_RETRY_MAX);
    drop(held);
    assert_eq!(told(&c, Reason::Concurrency), CONCURRENCY_RETRY_MAX);
    let queued = Concurrency::new(0.0, 1);
    let _waits = queued.check(now());
    assert_eq!(told(&queued, Reason::QueueFull), CONCURRENCY_RETRY_MAX);
}

/// With a queue, a request refused with `queue_full` waits behind the requests queued
/// ahead of it too; a permit taken from the queue is timed from when it was taken.
#[test]
fn a_full_queue_is_told_the_releases_it_waits_behind() {
    let clock = std::sync::Arc::new(crate::clock::ManualClock::new());
    let on = std::sync::Arc::new(HoldClock::new(clock.clone()));
    let now = || crate::clock::Clock::now(&*clock);
    let c = Concurrency::new(1.0, 2);
    let held = permit(c.check(now()));
    let Decision::Admit(Admit::Queued(mut ticket)) = c.check(now()) else {
        panic!("queued");
    };
    ticket.time_on(&on);
    clock.advance(Duration::from_secs(4));
    drop(held);
    let wakes = Arc::new(Wakes::default());
    let Poll::Ready(next) = poll(&mut ticket, &wakes) else {
        panic!("the first in line takes the permit");
    };
    clock.advance(Duration::from_secs(2));
    drop(next);
    // One hold timed, of 2 s (the 4 s one was not): 1 held, 2 queued ahead.
    let _held = permit(c.check(now()));
    let _queued = (c.check(now()), c.check(now()));
    let r = c.check(now()).rejection().unwrap();
    assert_eq!(r.reason, Reason::QueueFull);
    about(r.retry_after, Duration::from_secs(6));
}

/// `got` is `want` within the 0.1% a mean hold is kept to.
#[track_caller]
fn about(got: Duration, want: Duration) {
    let off = got.abs_diff(want).as_secs_f64() / want.as_secs_f64();
    assert!(off <= 0.001, "{got:?}, not {want:?}");
}
