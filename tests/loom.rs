//! Model checks of the lock-free core with loom: every interleaving of a few threads
//! (up to the preemption bound of [`check`]), with relaxed loads free to return any
//! value the memory model allows.
//!
//! Only built with `--cfg loom`, which swaps the core's atomics for loom's
//! (`src/sync.rs`):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --no-default-features --test loom
//! ```
//!
//! What is modelled, and what is not, is in README.md, "Model checking (loom)".
#![cfg(loom)]

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use rocgate::beside::Beside;
use rocgate::clock::Nanos;
use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key};
use rocgate::limiter::{
    Admit, Decision, FixedWindow, LeakyBucket, Reason, SlidingWindowCounter, TokenBucket,
};
use rocgate::limiter::{Concurrency, Permit};
use rocgate::window::{SlotCounter, SlotRing, WindowSpec};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::pin::{pin, Pin};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

/// Runs `f` under every interleaving loom finds with at most 3 preemptions per
/// execution (most models below finish in a second or less under it).
///
/// Also checks that loom explored more than one execution (a model whose threads
/// never touch shared state would pass vacuously), and says how many on stderr.
fn check(f: impl Fn() + Sync + Send + 'static) {
    check_bounded(3, f);
}

/// [`check`] with at most `preemptions` preemptions per execution, for models of
/// three threads whose every interleaving under 3 takes more than a few seconds.
fn check_bounded(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    // A std counter: outside what loom models, it counts across executions.
    let executions = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&executions);
    let mut model = loom::model::Builder::new();
    model.preemption_bound = Some(preemptions);
    model.check(move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    let n = executions.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "{}: {n} executions",
        std::thread::current().name().unwrap_or("model")
    );
    assert!(n > 1, "loom explored a single execution");
}

fn ms(n: u64) -> Nanos {
    Nanos::from_millis(n)
}

// ---------------------------------------------------------------- window

/// A route's window as the engine keeps it: the lock-free counter, and the ring
/// behind a lock that a request only ever `try_lock`s, at a slot rollover.
struct Window {
    counter: SlotCounter,
    ring: Mutex<SlotRing>,
}

impl Window {
    fn new(spec: &WindowSpec) -> Self {
        Window {
            counter: SlotCounter::new(spec),
            ring: Mutex::new(SlotRing::new(spec)),
        }
    }

    /// One arrival at `now`, as `Engine::check` counts it: whoever finds the slot
    /// over and wins the lock moves the boundary; everyone adds to its lane.
    fn arrive(&self, now: Nanos) {
        if self.counter.needs_roll(now) {
            if let Ok(mut ring) = self.ring.try_lock() {
                ring.advance(&self.counter, self.counter.slot_index(now), |_| {});
            }
        }
        self.counter.add();
    }
}

/// Arrivals of two threads across the end of slot 0, and one more in slot 1 after
/// a rollover that either thread may win (or that both race for): once the last
/// slot has been completed, the half-window sums hold every arrival exactly once.
#[test]
fn window_counts_every_arrival_once_across_a_rollover() {
    check(|| {
        // 4 slots of 100 ms: 2 per half-window, nothing falls out within 400 ms.
        let spec = WindowSpec::new(Duration::from_millis(400), Duration::from_millis(100))
            .expect("a valid window");
        let w = Arc::new(Window::new(&spec));
        let threads: Vec<_> = [[50, 150], [120, 180]]
            .into_iter()
            .map(|times| {
                let w = Arc::clone(&w);
                thread::spawn(move || {
                    for t in times {
                        w.arrive(ms(t));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("an arriving thread");
        }
        // Complete slots 0 and 1.
        let mut ring = w.ring.lock().expect("the ring");
        ring.advance(&w.counter, w.counter.slot_index(ms(250)), |_| {});
        let s = ring.sample();
        assert_eq!(s.n_prev + s.n_recent, 4, "{s:?}");
        assert_eq!(w.counter.arrivals(), 4);
        assert_eq!(w.counter.current(), 2);
    });
}

/// Three threads, each arriving in slot 1 while slot 0's count is still
/// accumulating: one of them rolls over, the others count in the new slot or in the
/// completed one, never in both and never in neither.
#[test]
fn window_rollover_race_of_three_threads_loses_nothing() {
    check(|| {
        let spec = WindowSpec::new(Duration::from_millis(400), Duration::from_millis(100))
            .expect("a valid window");
        let w = Arc::new(Window::new(&spec));
        // One arrival in slot 0 before the race.
        w.arrive(ms(10));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let w = Arc::clone(&w);
                thread::spawn(move || w.arrive(ms(110)))
            })
            .collect();
        for t in threads {
            t.join().expect("an arriving thread");
        }
        let mut ring = w.ring.lock().expect("the ring");
        let mut completed = Vec::new();
        ring.advance(&w.counter, w.counter.slot_index(ms(210)), |s| {
            completed.push(s)
        });
        // The rollover to slot 1 happened during the race: only slot 1 completes here.
        assert_eq!(completed.len(), 1);
        let s = ring.sample();
        assert_eq!(s.n_prev + s.n_recent, 4, "{s:?}");
    });
}

// ---------------------------------------------------------------- rate limiters

/// Runs `take` on `threads` threads, `each` times per thread, and returns how many
/// were admitted.
fn admitted_by<L: Send + Sync + 'static>(
    limiter: L,
    threads: usize,
    each: usize,
    take: fn(&L) -> bool,
) -> usize {
    let limiter = Arc::new(limiter);
    let admitted = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (limiter, admitted) = (Arc::clone(&limiter), Arc::clone(&admitted));
            thread::spawn(move || {
                for _ in 0..each {
                    if take(&limiter) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a taking thread");
    }
    admitted.load(Ordering::Relaxed)
}

/// A token bucket of capacity 2 that does not refill within the model (1 token per
/// second, every take at 0): three concurrent takers get exactly 2.
#[test]
fn token_bucket_admits_exactly_its_capacity() {
    check(|| {
        let bucket = TokenBucket::new(1.0, Duration::from_secs(2), Nanos::ZERO);
        let n = admitted_by(bucket, 3, 1, |b| b.check(Nanos::ZERO).is_admit());
        assert_eq!(n, 2);
    });
}

/// Two takers of two tokens each, from a bucket of 3: exactly 3, and the fourth is
/// told to come back when a token is there (1 s).
#[test]
fn token_bucket_capacity_holds_with_repeated_takers() {
    check(|| {
        let bucket = Arc::new(TokenBucket::new(1.0, Duration::from_secs(3), Nanos::ZERO));
        let b = Arc::clone(&bucket);
        let n = admitted_by(b, 2, 2, |b| b.check(Nanos::ZERO).is_admit());
        assert_eq!(n, 3);
        let r = bucket
            .check(Nanos::ZERO)
            .rejection()
            .expect("an empty bucket");
        assert_eq!(
            (r.reason, r.retry_after),
            (Reason::Limit, Duration::from_secs(1))
        );
    });
}

/// A limit change racing a decision on an empty bucket: whether lowered (4/s → 1/s,
/// one second's burst each) or raised (1/s → 4/s), the bucket is empty before and after
/// (tokens are kept, never refilled by a change), so the decision is refused whatever
/// it reads. It read the rate, capacity and TAT as three separate words, and was
/// admitted when it read the new rate beside the old capacity (4 tokens of 1 s each),
/// or the new parameters beside the TAT not yet rescaled; the TAT is now marked while
/// a change rewrites the three.
#[test]
fn token_bucket_limit_change_never_refills_an_empty_bucket() {
    for (from, to) in [(4.0, 1.0), (1.0, 4.0)] {
        check(move || {
            let bucket = Arc::new(TokenBucket::new(from, Duration::from_secs(1), Nanos::ZERO));
            while bucket.check(Nanos::ZERO).is_admit() {}
            // The decision on a thread of its own: loom explores no interleaving of
            // a main thread that only loads before the spawned one has run.
            let b = Arc::clone(&bucket);
            let decision = thread::spawn(move || b.check(Nanos::ZERO).is_admit());
            bucket.set_limit(to, Nanos::ZERO);
            let admitted = decision.join().expect("the decision");
            assert!(!admitted, "{from} → {to}: an empty bucket admitted");
            assert_eq!(bucket.level(Nanos::ZERO).value, 0.0, "{from} → {to}");
        });
    }
}

/// A change held half-way (its thread stopped once it has marked the tokens' word,
/// until the decision is done) does not hold up a decision on the bucket: the
/// decision ends, charged at the old rate, and the change then keeps what it left.
/// Lowering 4/s to 1/s (one second's burst) with one token left, the decision takes
/// it (at either rate) and the bucket ends empty; with none left, it is refused.
/// When a decision waited for a change to end, the two threads waited for each other
/// and loom stopped the model ("Model exceeded maximum number of branches").
#[test]
fn token_bucket_decision_never_waits_for_a_change() {
    for left in [1, 0] {
        check(move || {
            let bucket = Arc::new(TokenBucket::new(4.0, Duration::from_secs(1), Nanos::ZERO));
            for _ in left..4 {
                assert!(bucket.check(Nanos::ZERO).is_admit());
            }
            let done = Arc::new(AtomicBool::new(false));
            let decision = {
                let (b, done) = (Arc::clone(&bucket), Arc::clone(&done));
                thread::spawn(move || {
                    let admitted = b.check(Nanos::ZERO).is_admit();
                    done.store(true, Ordering::Release);
                    admitted
                })
            };
            bucket.set_limit_midway(1.0, Nanos::ZERO, || {
                while !done.load(Ordering::Acquire) {
                    thread::yield_now();
                }
            });
            let admitted = decision.join().expect("the decision");
            assert_eq!(admitted, left == 1, "{left} token(s) left");
            let level = bucket.level(Nanos::ZERO);
            assert_eq!((level.value, level.capacity), (0.0, 1.0), "{left} left");
        });
    }
}

/// Two limit changes at once take turns: the bucket ends at one of the two limits'
/// parameters, with the tokens it had (all 2 of a full 2/s bucket, clamped to the
/// capacity of 1 at 1/s), never a mix of one change's rate and the other's capacity.
#[test]
fn token_bucket_two_limit_changes_take_turns() {
    check(|| {
        let bucket = Arc::new(TokenBucket::new(2.0, Duration::from_secs(1), Nanos::ZERO));
        let b = Arc::clone(&bucket);
        let change = thread::spawn(move || b.set_limit(1.0, Nanos::ZERO));
        bucket.set_limit(4.0, Nanos::ZERO);
        change.join().expect("the change");
        let level = bucket.level(Nanos::ZERO);
        assert!(
            [(1.0, 1.0), (4.0, 1.0)].contains(&(level.capacity, level.value)),
            "{level:?}"
        );
    });
}

/// A bucket (1/s with two seconds' burst: τ = 2 s) whose changes share the one note of
/// the loom build with those of [`bucket_with`]'s. Read beside the TAT word of one of
/// those emptied at 4/s (1 s), its old parameters would admit.
fn other_bucket() -> TokenBucket {
    TokenBucket::new(1.0, Duration::from_secs(2), Nanos::ZERO)
}

/// The limit the buckets under test start at (one second's burst: 4 tokens of 250 ms).
const A_FROM: f64 = 4.0;

/// A bucket at [`A_FROM`] with `left` tokens.
fn bucket_with(left: u32) -> Arc<TokenBucket> {
    let bucket = Arc::new(TokenBucket::new(
        A_FROM,
        Duration::from_secs(1),
        Nanos::ZERO,
    ));
    for _ in left..4 {
        assert!(bucket.check(Nanos::ZERO).is_admit());
    }
    bucket
}

/// A decision on one bucket overlaps its change (4/s → 1/s, one second's burst) and
/// the change of another bucket that shares its note (the loom build has one): the
/// decision may meet the first change half-way and read the note after the second
/// has rewritten it with the other bucket's old parameters (1/s, τ = 2 s), which
/// would admit on the emptied bucket. It must not: it is admitted exactly when a
/// token is left (at either rate), and the bucket ends empty at the new capacity;
/// the other bucket ends at its new capacity with the 2 tokens it had. Giving the note back before the
/// change's last exchange (its TAT word still marked) fails this model: the empty
/// bucket admits.
#[test]
fn token_bucket_decision_never_reads_another_buckets_note() {
    for left in [0, 1] {
        check(move || {
            let bucket = bucket_with(left);
            let other = Arc::new(other_bucket());
            let decision = {
                let b = Arc::clone(&bucket);
                thread::spawn(move || b.check(Nanos::ZERO).is_admit())
            };
            let change = {
                let o = Arc::clone(&other);
                thread::spawn(move || o.set_limit(8.0, Nanos::ZERO))
            };
            bucket.set_limit(1.0, Nanos::ZERO);
            let admitted = decision.join().expect("the decision");
            change.join().expect("the other change");
            assert_eq!(admitted, left == 1, "{left} token(s) left");
            let level = bucket.level(Nanos::ZERO);
            assert_eq!((level.value, level.capacity), (0.0, 1.0), "{left} left");
            let level = other.level(Nanos::ZERO);
            assert_eq!((level.value, level.capacity), (2.0, 16.0), "the other");
        });
    }
}

/// The level of a bucket read while it changes (4/s → 1/s, two tokens left) and
/// another bucket's change rewrites their shared note: the old level with the old
/// capacity (2 of 4) or the new (the 2 clamped to 1 of 1), never a mix of one's
/// tokens and the other's rate or capacity.
#[test]
fn token_bucket_level_during_shared_note_changes_is_old_or_new() {
    check(|| {
        let bucket = bucket_with(2);
        let other = Arc::new(other_bucket());
        let level = {
            let b = Arc::clone(&bucket);
            thread::spawn(move || b.level(Nanos::ZERO))
        };
        let change = {
            let o = Arc::clone(&other);
            thread::spawn(move || o.set_limit(8.0, Nanos::ZERO))
        };
        bucket.set_limit(1.0, Nanos::ZERO);
        let seen = level.join().expect("the level");
        change.join().expect("the other change");
        assert!(
            [(2.0, 4.0), (1.0, 1.0)].contains(&(seen.value, seen.capacity)),
            "{seen:?}"
        );
    });
}

/// `lower_to` racing a change of its bucket (4/s → 1/s, full) and a change of
/// another bucket on the same note: lowered to one token before the change (1 of 4,
/// kept as 1 of 1) or after it (4 clamped to 1 of 1, already there), the bucket ends
/// with one token at the new capacity, and a decision after both takes it and no
/// more.
#[test]
fn token_bucket_lower_to_during_shared_note_changes() {
    check(|| {
        let bucket = bucket_with(4);
        let other = Arc::new(other_bucket());
        let lower = {
            let b = Arc::clone(&bucket);
            thread::spawn(move || b.lower_to(1.0, Nanos::ZERO))
        };
        let change = {
            let o = Arc::clone(&other);
            thread::spawn(move || o.set_limit(8.0, Nanos::ZERO))
        };
        bucket.set_limit(1.0, Nanos::ZERO);
        lower.join().expect("the lowering");
        change.join().expect("the other change");
        let level = bucket.level(Nanos::ZERO);
        assert_eq!((level.value, level.capacity), (1.0, 1.0));
        assert!(bucket.check(Nanos::ZERO).is_admit());
        assert!(!bucket.check(Nanos::ZERO).is_admit());
    });
}

/// A fixed window with a quota of 2: three concurrent requests in one window, 2
/// admitted.
#[test]
fn fixed_window_admits_exactly_its_quota() {
    check(|| {
        let w = FixedWindow::new(2.0, Duration::from_secs(1), Nanos::ZERO);
        let n = admitted_by(w, 3, 1, |w| w.check(ms(100)).is_admit());
        assert_eq!(n, 2);
    });
}

/// A sliding window with a quota of 2, at the start of a window (the previous one
/// empty): three concurrent requests, 2 admitted.
#[test]
fn sliding_window_admits_exactly_its_quota() {
    check(|| {
        let w = SlidingWindowCounter::new(2.0, Duration::from_secs(1), Nanos::ZERO);
        let n = admitted_by(w, 3, 1, |w| w.check(ms(1000)).is_admit());
        assert_eq!(n, 2);
    });
}

/// A leaky bucket at 10/s with a queue of 1: of three concurrent requests one
/// leaves now, one is paced 100 ms later, one is rejected; no two get the same
/// departure time.
#[test]
fn leaky_bucket_schedules_each_request_once() {
    check(|| {
        let bucket = Arc::new(LeakyBucket::new(10.0, 1));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let b = Arc::clone(&bucket);
                thread::spawn(move || match b.check(Nanos::ZERO) {
                    Decision::Admit(Admit::Now) => Some(Duration::ZERO),
                    Decision::Admit(Admit::Paced(pace)) => Some(pace.wait(Nanos::ZERO)),
                    Decision::Admit(other) => panic!("{other:?}"),
                    Decision::Reject(r) => {
                        assert_eq!(r.reason, Reason::QueueFull);
                        None
                    }
                })
            })
            .collect();
        let mut waits: Vec<_> = handles
            .into_iter()
            .filter_map(|h| h.join().expect("a scheduling thread"))
            .collect();
        waits.sort();
        assert_eq!(waits, [Duration::ZERO, Duration::from_millis(100)]);
    });
}

/// A leaky bucket at 10/s with a queue of 3: a paced request gives its place back
/// while another request is scheduled. Either the give-back comes first (the new
/// request takes its departure) or the new request does (the give-back fails, the
/// place stays taken): the requests that stay, and two more after them, never depart
/// less than an interval apart, in every interleaving.
#[test]
fn leaky_bucket_give_back_races_a_new_request_soundly() {
    check(|| {
        let bucket = Arc::new(LeakyBucket::new(10.0, 3));
        assert!(matches!(
            bucket.check(Nanos::ZERO),
            Decision::Admit(Admit::Now)
        ));
        let Decision::Admit(Admit::Paced(pace)) = bucket.check(Nanos::ZERO) else {
            panic!("the second is paced");
        };
        let leaving = {
            let b = Arc::clone(&bucket);
            thread::spawn(move || b.give_back(pace, Nanos::ZERO))
        };
        let departure = match bucket.check(Nanos::ZERO) {
            Decision::Admit(Admit::Paced(p)) => p.departure(),
            other => panic!("{other:?}"),
        };
        let given_back = leaving.join().expect("the leaving thread");
        let mut departures = vec![Nanos::ZERO, departure];
        if !given_back {
            departures.push(Nanos::from_millis(100));
        }
        for _ in 0..2 {
            if let Decision::Admit(Admit::Paced(p)) = bucket.check(Nanos::ZERO) {
                departures.push(p.departure());
            }
        }
        departures.sort();
        for pair in departures.windows(2) {
            assert!(
                pair[1].as_u64() - pair[0].as_u64() >= 100_000_000,
                "{departures:?}"
            );
        }
    });
}

// ---------------------------------------------------------------- concurrency

/// A request through the limiter, to the end: a permit now, or a queue place
/// awaited to a permit (loom reports a deadlock if nobody ever wakes it), or `None`.
fn acquire(c: &Concurrency) -> Option<Permit> {
    match c.check(Nanos::ZERO) {
        Decision::Admit(Admit::Held(permit)) => Some(permit),
        Decision::Admit(Admit::Queued(ticket)) => Some(block_on(ticket)),
        Decision::Admit(other) => panic!("{other:?}"),
        Decision::Reject(_) => None,
    }
}

/// `n` requests on `c` at once, each on a thread of its own, each holding its permit
/// (if it gets one, which it must if `must_get`) for a moment: never more than
/// `limit` in flight, and every permit given back.
fn requests_at_once(c: &Concurrency, n: usize, limit: usize, must_get: bool) {
    let inside = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (c, inside) = (c.clone(), Arc::clone(&inside));
            thread::spawn(move || {
                let permit = acquire(&c);
                assert!(
                    permit.is_some() || !must_get,
                    "neither a permit nor a queue place"
                );
                if let Some(permit) = permit {
                    let in_flight = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(
                        in_flight <= limit,
                        "{in_flight} in flight at a limit of {limit}"
                    );
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a request thread");
    }
    assert_eq!((c.level().value, c.waiting()), (0.0, 0));
}

/// Three requests at a limit of 2, with no queue: never more than 2 in flight, and
/// every permit given back.
#[test]
fn concurrency_never_exceeds_its_limit() {
    check_bounded(2, || {
        requests_at_once(&Concurrency::new(2.0, 0), 3, 2, false)
    });
}

/// Two requests at a limit of 1 with a queue of 1: whichever is queued is woken when
/// the other releases its permit (or the model deadlocks), and holds the permit alone.
#[test]
fn concurrency_wakes_the_waiter_when_a_permit_is_released() {
    check(|| requests_at_once(&Concurrency::new(1.0, 1), 2, 1, true));
}

/// Two requests queued at a limit of 0 (nothing in flight that could wake them):
/// raising the limit to 2 meanwhile wakes both.
#[test]
fn concurrency_wakes_the_waiters_when_the_limit_is_raised() {
    check_bounded(2, || {
        let c = Concurrency::new(0.0, 2);
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                thread::spawn(move || {
                    let permit = acquire(&c).expect("a queue place");
                    drop(permit);
                })
            })
            .collect();
        c.set_limit(2.0);
        for h in waiters {
            h.join().expect("a waiting thread");
        }
        assert_eq!((c.level().value, c.waiting()), (0.0, 0));
    });
}

fn poll_once(ticket: &mut rocgate::limiter::Ticket) -> Poll<Permit> {
    Pin::new(ticket).poll(&mut Context::from_waker(Waker::noop()))
}

/// A permit held, two requests queued; the first gives up (its ticket dropped, maybe
/// after it was notified) while the permit is released: the second is woken all the
/// same, and at the end no permit and no queue place is left counted.
#[test]
fn concurrency_dropped_waiter_leaks_nothing() {
    check(|| {
        let c = Concurrency::new(1.0, 2);
        let held = acquire(&c).expect("a permit");
        let Decision::Admit(Admit::Queued(mut first)) = c.check(Nanos::ZERO) else {
            panic!("a queue place");
        };
        let Decision::Admit(Admit::Queued(second)) = c.check(Nanos::ZERO) else {
            panic!("a queue place");
        };
        // The first in line listens, then gives up.
        let Poll::Pending = poll_once(&mut first) else {
            panic!("no permit is free");
        };
        let quitter = thread::spawn(move || drop(first));
        let waiter = thread::spawn(move || drop(block_on(second)));
        let releaser = thread::spawn(move || drop(held));
        for h in [quitter, waiter, releaser] {
            h.join().expect("a thread");
        }
        assert_eq!((c.level().value, c.waiting()), (0.0, 0));
    });
}

// ---------------------------------------------------------------- beside

/// A one-shot signal between threads, as a channel gives it: set once, waking the
/// waker of the future that last looked at it unset.
#[derive(Default)]
struct Signal(Mutex<(bool, Option<Waker>)>);

impl Signal {
    /// Sets it, and wakes the future that looked, outside the lock: the wake races
    /// whatever poll is under way.
    fn set(&self) {
        let waker = {
            let mut state = self.0.lock().unwrap();
            state.0 = true;
            state.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn is_set(&self) -> bool {
        self.0.lock().unwrap().0
    }

    /// Whether it is set; if not, `cx`'s waker is woken when it is.
    fn listen(&self, cx: &Context<'_>) -> bool {
        let mut state = self.0.lock().unwrap();
        if !state.0 {
            state.1 = Some(cx.waker().clone());
        }
        state.0
    }
}

/// A future that completes with `n` once `signal` is set.
fn waiting(signal: &Arc<Signal>, n: u32) -> impl Future<Output = u32> {
    let signal = Arc::clone(signal);
    std::future::poll_fn(move |cx| {
        if signal.listen(cx) {
            Poll::Ready(n)
        } else {
            Poll::Pending
        }
    })
}

/// A task's waker that counts its wakes. A `std` `Arc`, as a `Waker` needs; the
/// count is loom's.
#[derive(Default)]
struct CountWakes(AtomicUsize);

impl std::task::Wake for CountWakes {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The future beside the other waits for a signal that another thread sets, waking
/// the waker the future cloned out during a poll: the task polling the `Beside`
/// (loom's `block_on`, which sleeps until woken) always sees it complete. A wake lost
/// (the future marked woken, the task never woken) is a deadlock loom reports.
#[test]
fn beside_a_wake_from_another_thread_completes_the_future() {
    check(|| {
        let signal = Arc::new(Signal::default());
        let both = Beside::new(std::future::pending(), waiting(&signal, 1));
        let setter = thread::spawn(move || signal.set());
        assert_eq!(block_on(both), 1);
        setter.join().expect("the setting thread");
    });
}

/// Both futures' wakers woken at once from two threads, each future completing once
/// both signals are set (each listens to its own): whichever wake comes last, during
/// a poll or between two, reaches the task or the poll under way, and the `Beside`
/// completes.
#[test]
fn beside_two_wakes_at_once_from_two_threads_are_both_taken() {
    check(|| {
        let (a, b) = (Arc::new(Signal::default()), Arc::new(Signal::default()));
        let both_set = |mine: &Arc<Signal>, other: &Arc<Signal>, n: u32| {
            let (mine, other) = (Arc::clone(mine), Arc::clone(other));
            std::future::poll_fn(move |cx| {
                if mine.listen(cx) && other.is_set() {
                    Poll::Ready(n)
                } else {
                    Poll::Pending
                }
            })
        };
        let both = Beside::new(both_set(&a, &b, 1), both_set(&b, &a, 2));
        let setters = [a, b].map(|s| thread::spawn(move || s.set()));
        let n = block_on(both);
        assert!(n == 1 || n == 2);
        for h in setters {
            h.join().expect("a setting thread");
        }
    });
}

/// One poll of a `Beside` while another thread wakes its future (after the future
/// cloned its waker out): at any point of the poll, the last pass, the moment between
/// the last pass and the end of `polling`, or after, the future is either polled again
/// in that poll and completes, or the task is woken. Never neither: a task left
/// unwoken with its future marked is never polled again.
#[test]
fn beside_a_wake_during_its_poll_completes_it_or_wakes_the_task() {
    check(|| {
        let signal = Arc::new(Signal::default());
        let mut both = pin!(Beside::new(waiting(&signal, 1), std::future::pending()));
        let wakes = std::sync::Arc::new(CountWakes::default());
        let waker = Waker::from(std::sync::Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let setter = thread::spawn(move || signal.set());
        let first = both.as_mut().poll(&mut cx);
        setter.join().expect("the setting thread");
        if first.is_pending() {
            assert!(
                wakes.0.load(Ordering::SeqCst) > 0,
                "the future was woken, the task was not"
            );
            assert_eq!(both.as_mut().poll(&mut cx), Poll::Ready(1));
        }
    });
}

// ---------------------------------------------------------------- engine

fn client(n: u8) -> Key<'static> {
    Key::Ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)))
}

/// A route with one permit per client IP and a queue of 1; keys idle for 10 s are
/// evicted at a rollover.
fn keyed_concurrency_engine() -> Engine {
    let mut cfg = RouteConfig::new("keys", RouteMatch::any());
    cfg.algorithm = rocgate::limiter::Algorithm::Concurrency { queue: 1 };
    let mut keys = KeyLimits::default();
    keys.idle_timeout = Duration::from_secs(10);
    cfg.partition = Partition::ClientIp(keys);
    cfg.controller.base_limit_rps = 1.0;
    cfg.controller.cut_limit_rps = 1.0;
    Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// A client's key, unseen for longer than the idle timeout, holds first a permit,
/// then a request queued for it, then (handed over) the permit again, while another
/// client's request, 30 s later, rolls the window and sweeps idle keys: the key is
/// never evicted, so the client still cannot get a second permit.
#[test]
fn engine_never_evicts_a_key_that_holds_a_permit_or_a_waiter() {
    check(|| {
        let e = Arc::new(keyed_concurrency_engine());
        let id = e.route_at(0).unwrap();
        let Decision::Admit(Admit::Held(held)) = e.check(id, client(1), Nanos::ZERO) else {
            panic!("a permit");
        };
        let Decision::Admit(Admit::Queued(ticket)) = e.check(id, client(1), Nanos::ZERO) else {
            panic!("a queue place");
        };
        let handover = thread::spawn(move || {
            drop(held);
            block_on(ticket)
        });
        let later = Nanos::from_secs(30);
        let sweeper = {
            let e = Arc::clone(&e);
            thread::spawn(move || e.check(id, client(2), later).is_admit())
        };
        assert!(sweeper.join().expect("the sweeping thread"));
        let permit = handover.join().expect("the handover thread");
        // Client 1 still holds its one permit: no fresh key with a fresh permit.
        let again = e.check(id, client(1), later);
        assert!(
            !matches!(again, Decision::Admit(Admit::Held(_))),
            "client 1 got a second permit: its key was evicted"
        );
        drop((again, permit));
    });
}

/// A client holds its one permit; its second request is queued on its key while
/// the route's limit is raised to 2 per client (a runtime update): the raise wakes
/// it, whichever of the two goes first. (Its permit stays out until both are done,
/// so nothing else could wake it.)
#[test]
fn engine_raising_the_limit_wakes_a_request_queued_meanwhile() {
    check(|| {
        let e = Arc::new(keyed_concurrency_engine());
        let id = e.route_at(0).unwrap();
        let Decision::Admit(Admit::Held(held)) = e.check(id, client(1), Nanos::ZERO) else {
            panic!("a permit");
        };
        let second = {
            let e = Arc::clone(&e);
            thread::spawn(move || match e.check(id, client(1), Nanos::ZERO) {
                Decision::Admit(Admit::Held(permit)) => drop(permit),
                Decision::Admit(Admit::Queued(ticket)) => drop(block_on(ticket)),
                other => panic!("{other:?}"),
            })
        };
        let mut params = e.route_params(id).unwrap();
        params.base_limit_rps = 2.0;
        e.update_route(id, params, Nanos::ZERO).unwrap();
        second.join().expect("the second request");
        drop(held);
    });
}

/// A route limited as a whole to 1 request in flight with a queue of 1, its window
/// `window_s` seconds long.
fn in_flight_config(window_s: u64) -> Config {
    let mut cfg = RouteConfig::new("ws", RouteMatch::any());
    cfg.algorithm = rocgate::limiter::Algorithm::Concurrency { queue: 1 };
    cfg.window = WindowSpec::new(Duration::from_secs(window_s), Duration::from_millis(100))
        .expect("a window");
    cfg.controller.base_limit_rps = 1.0;
    cfg.controller.cut_limit_rps = 1.0;
    Config::new(vec![cfg])
}

/// A request holds the route's one permit and a second is queued for it, both on the
/// old engine, when a reload rebuilds the route (a new window) while the permit is
/// released: the new route, set to its limit around the permits handed over, and the
/// release race for the queued request, which is woken whichever comes first, and its
/// permit is counted in the new route (a third request is queued there).
#[test]
fn engine_a_reload_that_hands_the_permits_over_wakes_a_request_queued_before_it() {
    check(|| {
        let e = Engine::new(&in_flight_config(1), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        let Decision::Admit(Admit::Held(held)) = e.check(id, Key::None, Nanos::ZERO) else {
            panic!("a permit");
        };
        let Decision::Admit(Admit::Queued(ticket)) = e.check(id, Key::None, Nanos::ZERO) else {
            panic!("a queue place");
        };
        let release = thread::spawn(move || drop(held));
        let next = e
            .reload(&in_flight_config(2), Nanos::ZERO, SystemTime::UNIX_EPOCH)
            .unwrap();
        let permit = block_on(ticket);
        release.join().expect("the releasing thread");
        let id = next.route_at(0).unwrap();
        assert_eq!(
            next.route_snapshot(id, Nanos::ZERO).unwrap().level.value,
            1.0
        );
        let third = next.check(id, Key::None, Nanos::ZERO);
        assert!(
            matches!(third, Decision::Admit(Admit::Queued(_))),
            "{third:?}"
        );
        drop((third, permit));
        assert_eq!(
            next.route_snapshot(id, Nanos::ZERO).unwrap().level.value,
            0.0
        );
    });
}

/// [`engine_a_reload_that_hands_the_permits_over_wakes_a_request_queued_before_it`],
/// on a route limited per header value: the permit and the queued request are key
/// "a"'s, handed to key "a" of the new route, where a third request of "a" is queued.
#[test]
fn engine_a_reload_that_hands_a_keys_permits_over_wakes_a_request_queued_before_it() {
    let keyed = |window_s: u64| {
        let mut config = in_flight_config(window_s);
        config.routes[0].partition = Partition::Header("x-key".into(), KeyLimits::default());
        config
    };
    check(move || {
        let a = Key::Value("a");
        let e = Engine::new(&keyed(1), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        let Decision::Admit(Admit::Held(held)) = e.check(id, a, Nanos::ZERO) else {
            panic!("a permit");
        };
        let Decision::Admit(Admit::Queued(ticket)) = e.check(id, a, Nanos::ZERO) else {
            panic!("a queue place");
        };
        let release = thread::spawn(move || drop(held));
        let next = e
            .reload(&keyed(2), Nanos::ZERO, SystemTime::UNIX_EPOCH)
            .unwrap();
        let permit = block_on(ticket);
        release.join().expect("the releasing thread");
        let id = next.route_at(0).unwrap();
        let third = next.check(id, a, Nanos::ZERO);
        assert!(
            matches!(third, Decision::Admit(Admit::Queued(_))),
            "{third:?}"
        );
        drop((third, permit));
        assert!(matches!(
            next.check(id, a, Nanos::ZERO),
            Decision::Admit(Admit::Held(_))
        ));
    });
}

/// A request on the old engine catches key "a" up with the old route's change (its
/// generation 2) as a reload hands the key over: whichever comes first, the new route's
/// own change (base 4, its second change) reaches the key, and "a" holds 4 permits in
/// all. Where the request wrote the old route's generation after the hand-over, the
/// new route, at the same number, took the key as caught up: 3 permits (the file's
/// base the hand-over set).
#[test]
fn engine_a_key_caught_up_on_the_old_route_as_it_is_handed_over_takes_the_new_routes_change() {
    let keyed = |window_s: u64, base: f64| {
        let mut config = in_flight_config(window_s);
        config.routes[0].partition = Partition::Header("x-key".into(), KeyLimits::default());
        config.routes[0].controller.base_limit_rps = base;
        config
    };
    let raise = |e: &Engine, id, base| {
        let mut p = e.route_params(id).expect("the route");
        p.base_limit_rps = base;
        e.update_route(id, p, Nanos::ZERO).expect("a change");
    };
    check(move || {
        let a = Key::Value("a");
        let e = Arc::new(Engine::new(&keyed(1, 1.0), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap());
        let id = e.route_at(0).unwrap();
        drop(e.check(id, a, Nanos::ZERO));
        raise(&e, id, 2.0);
        let late = {
            let e = Arc::clone(&e);
            thread::spawn(move || e.check(id, a, Nanos::ZERO))
        };
        let next = e
            .reload(&keyed(2, 3.0), Nanos::ZERO, SystemTime::UNIX_EPOCH)
            .unwrap();
        let late = late.join().expect("the old engine's request");
        let nid = next.route_at(0).unwrap();
        raise(&next, nid, 4.0);
        let mut held = vec![late];
        for _ in 0..5 {
            match next.check(nid, a, Nanos::ZERO) {
                d @ Decision::Admit(Admit::Held(_)) => held.push(d),
                _ => break,
            }
        }
        let permits = held
            .iter()
            .filter(|d| matches!(d, Decision::Admit(Admit::Held(_))))
            .count();
        assert_eq!(permits, 4);
    });
}

/// A route with a token bucket per client IP: 4/s, one second's burst (4 tokens), cut
/// to 1/s.
fn keyed_bucket_engine() -> Engine {
    keyed_engine("bucket_keys", KEY_BUCKET)
}

/// The per-client token bucket of the keyed models: one second's burst.
const KEY_BUCKET: rocgate::limiter::Algorithm = rocgate::limiter::Algorithm::TokenBucket {
    burst: Duration::from_secs(1),
};

/// A route `name` limited per client IP with `algorithm`, at 4/s (cut at 1/s).
fn keyed_engine(name: &str, algorithm: rocgate::limiter::Algorithm) -> Engine {
    let mut cfg = RouteConfig::new(name, RouteMatch::any());
    cfg.algorithm = algorithm;
    cfg.partition = Partition::ClientIp(KeyLimits::default());
    cfg.controller.base_limit_rps = 4.0;
    cfg.controller.cut_limit_rps = 1.0;
    Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// Two runtime updates of route 0 in a row (4/s → 2/s → 1/s), raced by two requests
/// of one client: one on a thread of its own, made after the first update, and one
/// made after the second.
fn two_updates_raced_by_a_client(e: &Arc<Engine>) {
    let id = e.route_at(0).unwrap();
    let update = |limit: f64| {
        let mut params = e.route_params(id).unwrap();
        params.base_limit_rps = limit;
        e.update_route(id, params, Nanos::ZERO).unwrap();
    };
    update(2.0);
    let first = {
        let e = Arc::clone(e);
        thread::spawn(move || drop(e.check(id, client(1), Nanos::ZERO)))
    };
    update(1.0);
    drop(e.check(id, client(1), Nanos::ZERO));
    first.join().expect("the first request");
}

/// A runtime update lowers a per-client token bucket route from 4/s to 1/s (one
/// second's burst) while two requests of a client whose key is empty catch up with
/// it: the route's bucket and the key's change one after another on the one note of
/// the loom build (a request that finds it taken is decided at the key's old limit
/// and leaves its change to the next), and a request may be decided while the
/// other's catch-up changes the key. Both are
/// refused whichever comes first, and so is the next. Decisions that read the rate
/// and capacity words whatever the mark fail this model (the one that meets the
/// other's catch-up half-way reads the new rate beside the old capacity and admits).
/// At most 1 preemption: 191,392 executions (19 s; the route's state lock, loom's,
/// is a point where loom switches threads too), the requests looking at the route's
/// generation again once caught up.
#[test]
fn engine_an_empty_key_stays_empty_while_its_requests_catch_up_with_a_cut() {
    check_bounded(1, || {
        let e = Arc::new(keyed_bucket_engine());
        let id = e.route_at(0).unwrap();
        for _ in 0..4 {
            assert!(e.check(id, client(1), Nanos::ZERO).is_admit());
        }
        let request = || {
            let e = Arc::clone(&e);
            thread::spawn(move || e.check(id, client(1), Nanos::ZERO).is_admit())
        };
        let (first, second) = (request(), request());
        let mut params = e.route_params(id).unwrap();
        params.base_limit_rps = 1.0;
        e.update_route(id, params, Nanos::ZERO).unwrap();
        for r in [first, second] {
            assert!(!r.join().expect("a request"), "an empty key admitted");
        }
        assert!(!e.check(id, client(1), Nanos::ZERO).is_admit());
        // Empty at 1/s: a token in a second.
        let r = e
            .check(id, client(1), Nanos::ZERO)
            .rejection()
            .expect("refused");
        assert_eq!(r.retry_after, Duration::from_secs(1));
    });
}

/// A client's request must catch up with a runtime cut of its route (4/s → 1/s, one
/// second's burst; the key has 3 tokens left) while another bucket's change, on the
/// one note of the loom build, is held half-way until the request is done. The
/// request never waits for the note: it is decided at the key's old limit, or at
/// the new one if its change took the note first, and admitted either way. The key
/// still ends at the cut: full 1.5 s later, it admits 1 request, not 2 or 4. When a
/// key's change waited for the note, the two threads waited for each other and loom
/// stopped the model ("Model exceeded maximum number of branches").
#[test]
fn engine_a_keyed_request_never_waits_for_another_buckets_change() {
    check(|| {
        let e = Arc::new(keyed_bucket_engine());
        let id = e.route_at(0).unwrap();
        assert!(e.check(id, client(1), Nanos::ZERO).is_admit());
        let mut params = e.route_params(id).unwrap();
        params.base_limit_rps = 1.0;
        e.update_route(id, params, Nanos::ZERO).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let request = {
            let (e, done) = (Arc::clone(&e), Arc::clone(&done));
            thread::spawn(move || {
                let admitted = e.check(id, client(1), Nanos::ZERO).is_admit();
                done.store(true, Ordering::Release);
                admitted
            })
        };
        other_bucket().set_limit_midway(8.0, Nanos::ZERO, || {
            while !done.load(Ordering::Acquire) {
                thread::yield_now();
            }
        });
        assert!(request.join().expect("the request"));
        let later = Nanos::from_millis(1_500);
        let n = (0..3)
            .filter(|_| e.check(id, client(1), later).is_admit())
            .count();
        assert_eq!(n, 1, "the key does not hold the cut");
    });
}

/// Two runtime updates in a row (4/s → 2/s → 1/s, one second's burst): a client's
/// request catches up with the first while the second is made and another request of
/// the client catches up with it. The key ends at the last limit, whichever applies
/// first: 1.5 s later, full, it admits 1 request, not 2. It ended at 2/s when the
/// first request read the route's limit before the second update and set it after
/// the other request had set 1/s and recorded the route's last generation.
#[test]
fn engine_a_key_ends_at_the_last_of_two_updates() {
    a_rate_key_ends_at_the_last_of_two_updates("bucket_keys", KEY_BUCKET);
}

/// [`engine_a_key_ends_at_the_last_of_two_updates`] on a fixed window per client IP
/// (one second): the key ends at the last limit, 1 request per window, not 2. It
/// ended at 2 the same way.
#[test]
fn engine_a_window_key_ends_at_the_last_of_two_updates() {
    a_rate_key_ends_at_the_last_of_two_updates(
        "window_keys",
        rocgate::limiter::Algorithm::FixedWindow {
            window: Duration::from_secs(1),
        },
    );
}

/// The two models above: a key of a route `name` limited with `algorithm` (a second's
/// burst or window), full 1.5 s after the race, admits 1 request, not 2.
fn a_rate_key_ends_at_the_last_of_two_updates(
    name: &'static str,
    algorithm: rocgate::limiter::Algorithm,
) {
    check_bounded(2, move || {
        let e = Arc::new(keyed_engine(name, algorithm));
        let id = e.route_at(0).unwrap();
        assert!(e.check(id, client(1), Nanos::ZERO).is_admit());
        two_updates_raced_by_a_client(&e);
        let later = Nanos::from_millis(1_500);
        let n = (0..3)
            .filter(|_| e.check(id, client(1), later).is_admit())
            .count();
        assert_eq!(n, 1, "{name}: the key does not hold the last limit");
    });
}

/// [`engine_a_key_ends_at_the_last_of_two_updates`] on a concurrency limit per client
/// IP (no queue): the key ends at the last limit, 1 permit, not 2.
#[test]
fn engine_a_concurrency_key_ends_at_the_last_of_two_updates() {
    check_bounded(2, || {
        let e = Arc::new(keyed_engine(
            "permit_keys",
            rocgate::limiter::Algorithm::Concurrency { queue: 0 },
        ));
        let id = e.route_at(0).unwrap();
        drop(e.check(id, client(1), Nanos::ZERO));
        two_updates_raced_by_a_client(&e);
        let held: Vec<_> = (0..3)
            .map(|_| e.check(id, client(1), Nanos::ZERO))
            .filter(|d| matches!(d, Decision::Admit(Admit::Held(_))))
            .collect();
        assert_eq!(held.len(), 1, "the key's permits are not the last limit's");
    });
}

// ---------------------------------------------------------------- the cut's twin

/// A route limited as a whole by a token bucket of 100 ms at `base` req/s (4 tokens
/// at 40/s), cut to 10/s (1 token), so with a twin at the base limit; a window of
/// 400 ms in 100 ms slots, and a controller that cuts at the first slot whose ROC
/// passes 1 (no floor of rate or samples, no dwell) and, after a slot below 0.5,
/// restores to base in one step.
fn twin_engine(base: f64) -> Engine {
    let mut cfg = RouteConfig::new("twin", RouteMatch::any());
    cfg.algorithm = rocgate::limiter::Algorithm::TokenBucket {
        burst: Duration::from_millis(100),
    };
    cfg.window =
        WindowSpec::new(Duration::from_millis(400), Duration::from_millis(100)).expect("a window");
    let p = &mut cfg.controller;
    p.base_limit_rps = base;
    p.cut_limit_rps = base.min(10.0);
    p.danger_roc = 1.0;
    p.safe_roc = 0.5;
    p.min_rps = 0.0;
    p.min_samples = 1;
    p.min_dwell = Duration::ZERO;
    p.hold = Duration::ZERO;
    p.restore_step_rps = 30.0;
    p.restore_interval = Duration::from_millis(100);
    Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// Arrivals on `id` up to 450 ms whose window, rolled at 500 ms, reads an ROC past
/// danger: the request that rolls it engages the cut. The bucket, at 40/s, is full
/// again at 500 ms, or, if `drain`, left empty at 490 ms.
fn to_the_brink(e: &Engine, id: rocgate::engine::RouteId, drain: bool) {
    for t in [0, 100, 200, 300, 400, 450] {
        drop(e.check(id, Key::None, ms(t)));
    }
    while drain && e.check(id, Key::None, ms(490)).is_admit() {}
}

/// A decision on `id` at `at` on a thread of its own.
fn decide_at(
    e: &Arc<Engine>,
    id: rocgate::engine::RouteId,
    at: u64,
) -> thread::JoinHandle<Decision> {
    let e = Arc::clone(e);
    thread::spawn(move || e.check(id, Key::None, ms(at)))
}

/// The reason of `d`'s refusal, if it is one.
fn refused_for(d: &Decision) -> Option<Reason> {
    d.rejection().map(|r| r.reason)
}

/// A cut engages (the request at 500 ms rolls a slot whose ROC passes danger: the
/// twin is given the bucket's tokens, marked engaged, the bucket cut to 10/s, then
/// `engaged` stored) while a request at 550 ms is decided, before, during or after,
/// or wins the rollover itself. The bucket was empty at 490 ms: at 550 ms the twin
/// at base has 2 tokens more, the bucket at the cut half of one. So that request is
/// refused as the cut's own exactly when it is tried against the twin after
/// `engaged` is stored: counted in `cut_vs_base_rejected` only if its refusal says
/// `roc_cut` (a refusal in the gap, the twin engaged and `engaged` not yet stored,
/// says `limit`), never more than the `roc_cut` refusals, and no admission is
/// counted against the base limit. The twin ends engaged with the bucket's tokens at
/// the engage, less the token the request took from it (a request that read the mark
/// just before it was set takes none). Counting a refusal whatever `engaged` read
/// fails this model (a refusal labelled `limit` counted); so does copying the
/// bucket's tokens after its change to the cut (the twin starts with the cut's one
/// token). Copying them after marking the twin passes it: a request tried against
/// the twin between the two has its token there overwritten by the copy, the one
/// token of the tolerance above. 261,405 executions (28 s).
#[test]
fn engine_a_cut_engaging_beside_a_decision_counts_only_its_own_refusals() {
    check(|| {
        let e = Arc::new(twin_engine(40.0));
        let id = e.route_at(0).unwrap();
        to_the_brink(&e, id, true);
        // The bucket at base, untouched from here: what the twin is given at 550 ms.
        let at_base = e.route_snapshot(id, ms(550)).unwrap().level.value;
        let (roller, decider) = (decide_at(&e, id, 500), decide_at(&e, id, 550));
        let rolled = roller.join().expect("the rolling request");
        let decided = decider.join().expect("the deciding request");
        let s = e.route_snapshot(id, ms(550)).unwrap();
        assert_eq!(s.state, rocgate::controller::ControllerState::Cut);
        let own = s.cut_vs_base_rejected.unwrap();
        assert!(own <= s.rejected_for(Reason::RocCut), "{s:?}");
        if own > 0 {
            assert_eq!(own, 1);
            assert_eq!(refused_for(&decided), Some(Reason::RocCut), "{rolled:?}");
        }
        assert_eq!(s.cut_vs_base_admitted, Some(0));
        let (twin, marked, behind) = e.twin_at(id, ms(550)).unwrap();
        assert!(marked && !behind);
        let took = [at_base - 1.0, at_base];
        assert!(
            took.iter().any(|v| (twin.value - v).abs() < 1e-6),
            "twin {twin:?}, the bucket at base {at_base}"
        );
    });
}

/// A cut engages while the twin's change to the base limit finds the note taken:
/// the base limit was raised from 10/s to 40/s (4 tokens) while no cut held, which
/// the idle twin did not follow (1 token), and the request that rolls the slot at
/// 500 ms does so while another bucket's change holds the one note of the loom
/// build. The twin and the bucket are left behind at base, unmarked, and a request
/// at 500 ms on another thread, decided before, during or after (or winning the
/// rollover itself, the note held or not yet), makes the change if it finds the
/// note free; an upkeep afterwards makes it if no request did. Whoever makes it, the
/// twin ends engaged at base with the full bucket's 4 tokens less the 2 requests'
/// (one more if a request read the mark just before it was set), the bucket at the
/// cut, nothing left behind, and no refusal counted as the cut's own beyond the
/// `roc_cut` ones. Marking the twin engaged when its change is left behind fails
/// this model (the change is then made as a restore step's, without the copy: the
/// twin keeps its 1 token, less the requests'), and so does copying the tokens
/// before the twin's change, clamped to its 1 token.
#[test]
fn engine_a_cut_whose_twin_is_left_behind_is_caught_up_with_the_buckets_tokens() {
    check(|| {
        let e = Arc::new(twin_engine(10.0));
        let id = e.route_at(0).unwrap();
        let mut p = e.route_params(id).unwrap();
        p.base_limit_rps = 40.0;
        e.update_route(id, p, Nanos::ZERO).unwrap();
        to_the_brink(&e, id, false);
        assert_eq!(e.route_snapshot(id, ms(500)).unwrap().level.value, 4.0);
        assert_eq!(e.twin_at(id, ms(500)).unwrap().0.capacity, 1.0);
        let decider = decide_at(&e, id, 500);
        let roller = {
            let e = Arc::clone(&e);
            thread::spawn(move || {
                other_bucket().set_limit_midway(8.0, Nanos::ZERO, || {
                    drop(e.check(id, Key::None, ms(500)));
                });
            })
        };
        roller.join().expect("the rolling request");
        drop(decider.join().expect("the deciding request"));
        e.catch_up(id, ms(500));
        let s = e.route_snapshot(id, ms(500)).unwrap();
        assert_eq!(s.state, rocgate::controller::ControllerState::Cut);
        assert_eq!(s.level.capacity, 1.0, "the bucket at the cut");
        assert!(
            s.cut_vs_base_rejected.unwrap() <= s.rejected_for(Reason::RocCut),
            "{s:?}"
        );
        assert_eq!(s.cut_vs_base_admitted, Some(0));
        let (twin, marked, behind) = e.twin_at(id, ms(500)).unwrap();
        assert!(marked && !behind);
        assert_eq!(twin.capacity, 4.0);
        assert!(twin.value == 2.0 || twin.value == 3.0, "{twin:?}");
    });
}

/// A cut ends (the request at 900 ms rolls the slot where the restore reaches the
/// base limit: the bucket set back to 40/s, the twin's mark cleared, then `engaged`
/// stored false) while a request at 850 ms is decided, with the twin or without it,
/// before, during or after. The bucket at the cut holds half a token at 850 ms, the
/// twin at base more than one: the request is refused, and counted as the cut's own
/// only if its refusal says `roc_cut`, never one that says `limit` (decided with
/// the twin after `engaged` was stored false). Once the cut is over, the twin is
/// idle, unmarked, and a request decided then leaves it as it was. Counting a
/// refusal whatever `engaged` read fails this model, and so does keeping the mark
/// once the limit is back at base.
#[test]
fn engine_a_cut_ending_beside_a_decision_counts_only_its_own_refusals() {
    check(|| {
        let e = Arc::new(twin_engine(40.0));
        let id = e.route_at(0).unwrap();
        to_the_brink(&e, id, false);
        for t in [500, 500, 550, 600, 700, 800] {
            drop(e.check(id, Key::None, ms(t)));
        }
        let before = e.route_snapshot(id, ms(850)).unwrap();
        assert_eq!(
            before.state,
            rocgate::controller::ControllerState::Recovering
        );
        assert_eq!(before.level.capacity, 1.0);
        assert!(e.twin_at(id, ms(850)).unwrap().1, "the twin engaged");
        let (decider, roller) = (decide_at(&e, id, 850), decide_at(&e, id, 900));
        let decided = decider.join().expect("the deciding request");
        drop(roller.join().expect("the rolling request"));
        let s = e.route_snapshot(id, ms(900)).unwrap();
        assert_eq!(s.state, rocgate::controller::ControllerState::Normal);
        assert_eq!(s.level.capacity, 4.0, "the bucket at base");
        let own = s.cut_vs_base_rejected.unwrap();
        let own_before = before.cut_vs_base_rejected.unwrap();
        assert!(own <= s.rejected_for(Reason::RocCut), "{s:?}");
        assert!(own <= own_before + 1);
        if own > own_before {
            assert_eq!(refused_for(&decided), Some(Reason::RocCut));
        }
        assert_eq!(s.cut_vs_base_admitted, before.cut_vs_base_admitted);
        let (idle, marked, behind) = e.twin_at(id, ms(900)).unwrap();
        assert!(!marked && !behind);
        drop(e.check(id, Key::None, ms(900)));
        assert_eq!(e.twin_at(id, ms(900)).unwrap().0, idle, "the twin idle");
    });
}

/// A snapshot is taken on another thread while a request refused as the cut's own
/// is counted (the cut holds, the bucket has half a token at 550 ms, the twin at
/// base more than one): the refusal's `roc_cut` is added, then
/// `cut_vs_base_rejected`, each a relaxed store on the deciding thread's lane, and
/// the snapshot reads the second before the first. Every `roc_cut` refusal so far
/// was the cut's own, so the snapshot never shows more of the cut's own than of
/// `roc_cut` only if it sees the first add whenever it sees the second: a release
/// fence before the second add and an acquire fence after the snapshot reads it
/// see to that. Without either fence the snapshot shows 2 of the cut's own for 1
/// `roc_cut` and fails this model (on x86's store order it cannot, on a weakly
/// ordered CPU it can).
#[test]
fn engine_a_snapshot_never_shows_more_of_the_cuts_own_than_of_roc_cut() {
    check(|| {
        let e = Arc::new(twin_engine(40.0));
        let id = e.route_at(0).unwrap();
        to_the_brink(&e, id, false);
        drop(e.check(id, Key::None, ms(500)));
        drop(e.check(id, Key::None, ms(500)));
        let before = e.route_snapshot(id, ms(500)).unwrap();
        assert_eq!(before.rejected_for(Reason::RocCut), 1);
        assert_eq!(before.cut_vs_base_rejected, Some(1));
        let snapshot = {
            let e = Arc::clone(&e);
            thread::spawn(move || e.route_snapshot(id, ms(550)).unwrap())
        };
        let decided = e.check(id, Key::None, ms(550));
        let s = snapshot.join().expect("the snapshot");
        let own = s.cut_vs_base_rejected.unwrap();
        assert!(
            own <= s.rejected_for(Reason::RocCut),
            "{own} of the cut's own: {s:?}"
        );
        assert_eq!(refused_for(&decided), Some(Reason::RocCut));
        let s = e.route_snapshot(id, ms(550)).unwrap();
        assert_eq!(s.cut_vs_base_rejected, Some(2));
    });
}

/// A runtime update of a route (base limit 200 → 160, danger_roc 80 → 70) races
/// `GET /admin/hints`'s read of the route for its events' hints
/// ([`Engine::route_tuning`]): the read gives the route's own parameters and its
/// events' profiles from one state, both before the update or both after (the
/// event that takes the base limit and danger_roc runs 200 and 80 beside own 200
/// and 80, or 160 and 70 beside 160 and 70). Read as two holds of the route's lock,
/// the own parameters, then the events, it gave the old own parameters beside the
/// events already moved onto the new, which this model finds.
#[test]
fn engine_a_runtime_update_never_reaches_half_of_a_hints_read() {
    check(|| {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"2027-11-26T10:00:00Z\"\n\
                    duration = \"30m\"\ncut_limit = 150\n";
        let config = Config::from_toml_str(toml, "loom").unwrap();
        let e = Arc::new(Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap());
        let id = e.route_at(0).unwrap();
        let update = {
            let e = Arc::clone(&e);
            thread::spawn(move || {
                let mut params = e.route_params(id).unwrap();
                (params.base_limit_rps, params.danger_roc) = (160.0, 70.0);
                e.update_route(id, params, Nanos::ZERO).unwrap();
            })
        };
        let rocgate::hints::RouteTuning { own, events, .. } = e.route_tuning(id).unwrap();
        let read = (
            own.base_limit_rps,
            own.danger_roc,
            events[0].controller.base_limit_rps,
            events[0].controller.danger_roc,
        );
        assert!(
            read == (200.0, 80.0, 200.0, 80.0) || read == (160.0, 70.0, 160.0, 70.0),
            "own and event from two states: {read:?}"
        );
        update.join().expect("the update");
    });
}
