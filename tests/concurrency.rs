//! Concurrent stress: exact admission counts and exact demand counts under contention.

use rocgate::clock::{Clock, MonotonicClock, Nanos};
use rocgate::config::{Config, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key};
use rocgate::limiter::{
    Admit, Algorithm, Concurrency, Decision, FixedWindow, LeakyBucket, Limiter, Permit, Ticket,
    TokenBucket,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, SystemTime};

const ATTEMPTS: usize = 10_000;

/// Runs `threads` threads that each call `attempt` ATTEMPTS times, started together,
/// and returns how many attempts were admitted.
fn hammer(threads: usize, attempt: impl Fn() -> bool + Sync) -> usize {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    (0..ATTEMPTS).filter(|_| attempt()).count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    })
}

#[test]
fn token_bucket_admits_exactly_its_capacity_under_contention() {
    for threads in [2, 4, 8] {
        for _ in 0..5 {
            // Capacity 1,000 and a frozen clock: no refill.
            let b = TokenBucket::new(1_000.0, Duration::from_secs(1), Nanos::ZERO);
            let admitted = hammer(threads, || b.check(Nanos::ZERO).is_admit());
            assert_eq!(admitted, 1_000, "{threads} threads");
        }
    }
}

#[test]
fn engine_route_admits_exactly_its_capacity_under_contention() {
    for threads in [2, 4, 8] {
        let mut cfg = RouteConfig::new("r", RouteMatch::any());
        cfg.controller.base_limit_rps = 1_000.0;
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let admitted = hammer(threads, || {
            e.check(e.route_at(0).unwrap(), Key::None, Nanos::ZERO)
                .is_admit()
        });
        assert_eq!(admitted, 1_000, "{threads} threads");
        let s = e
            .route_snapshot(e.route_at(0).unwrap(), Nanos::ZERO)
            .unwrap();
        assert_eq!(s.offered, (threads * ATTEMPTS) as u64);
        assert_eq!(s.admitted, 1_000);
    }
}

#[test]
fn other_limiters_are_exact_under_contention() {
    for threads in [2, 4, 8] {
        let fixed = FixedWindow::new(1_000.0, Duration::from_secs(1), Nanos::ZERO);
        assert_eq!(
            hammer(threads, || fixed.check(Nanos::ZERO).is_admit()),
            1_000
        );
        let sliding = Limiter::new(
            Algorithm::SlidingWindow {
                window: Duration::from_secs(1),
            },
            1_000.0,
            Nanos::ZERO,
        );
        assert_eq!(
            hammer(threads, || sliding.check(Nanos::ZERO).is_admit()),
            1_000
        );
        // Pacing at 1 per second with 999 places in the queue: 1,000 scheduled.
        let leaky = LeakyBucket::new(1.0, 999);
        assert_eq!(
            hammer(threads, || leaky.check(Nanos::ZERO).is_admit()),
            1_000
        );
    }
}

#[test]
fn concurrency_permits_never_exceed_the_limit() {
    let c = Concurrency::new(3.0, 0);
    let peak = AtomicU64::new(0);
    let admitted = hammer(4, || match c.check(Nanos::ZERO) {
        Decision::Admit(permit) => {
            peak.fetch_max(c.level().value as u64, Ordering::Relaxed);
            drop(permit);
            true
        }
        // A rejection.
        _ => false,
    });
    assert!(admitted > 0);
    assert!(peak.load(Ordering::Relaxed) <= 3);
    assert_eq!(c.level().value, 0.0, "every permit returned");
}

/// A wait this long for a permit means a lost wake.
const LOST: Duration = Duration::from_secs(10);

/// Wakes the thread that waits on it, and says whether it did.
struct Unpark {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// Waits on this thread for a queued request's permit, polling twice at each wake as
/// a server may (a second poll must not cost anyone their wake). Returns the permit
/// and how many times it waited 10 s without a wake: a ticket left asleep although
/// permits were freed (other threads free one every few microseconds).
fn wait_for(mut ticket: Ticket, clock: &MonotonicClock) -> (Permit, u32) {
    let unpark = Arc::new(Unpark {
        thread: std::thread::current(),
        woken: AtomicBool::new(false),
    });
    let waker = Waker::from(Arc::clone(&unpark));
    let mut cx = Context::from_waker(&waker);
    let mut lost = 0;
    loop {
        for _ in 0..2 {
            if let Poll::Ready(permit) = Pin::new(&mut ticket).poll(&mut cx) {
                return (permit, lost);
            }
        }
        let parked = clock.now();
        std::thread::park_timeout(LOST);
        let woken = unpark.woken.swap(false, Ordering::SeqCst);
        if !woken && clock.now().saturating_since(parked) >= LOST {
            lost += 1;
        }
    }
}

#[test]
fn queued_requests_all_get_their_permits_under_contention() {
    let (c, clock) = (Concurrency::new(1.0, 3), MonotonicClock::new());
    let (peak, queued, lost) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU32::new(0));
    let admitted = hammer(4, || {
        let permit = match c.check(Nanos::ZERO) {
            Decision::Admit(Admit::Held(permit)) => permit,
            Decision::Admit(Admit::Queued(ticket)) => {
                queued.fetch_add(1, Ordering::Relaxed);
                let (permit, never_woken) = wait_for(ticket, &clock);
                lost.fetch_add(never_woken, Ordering::Relaxed);
                permit
            }
            Decision::Admit(other) => panic!("{other:?}"),
            // A rejection.
            _ => return false,
        };
        peak.fetch_max(c.level().value as u64, Ordering::Relaxed);
        // Hold the permit while other threads run, so that they queue.
        std::thread::yield_now();
        drop(permit);
        true
    });
    assert!(queued.load(Ordering::Relaxed) > 0, "nothing was queued");
    assert_eq!(
        lost.load(Ordering::Relaxed),
        0,
        "waiters slept through freed permits"
    );
    assert!(admitted > 0 && peak.load(Ordering::Relaxed) <= 1);
    assert_eq!((c.level().value, c.waiting()), (0.0, 0));
}

#[test]
fn every_arrival_is_counted_across_slot_rollovers() {
    for threads in [2, 4, 8] {
        let e = Engine::new(
            &Config::new(vec![RouteConfig::new("r", RouteMatch::any())]),
            Nanos::ZERO,
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        // A shared virtual clock moving 50 µs per call: threads race over many
        // slot boundaries (100 ms slots, 2,000 calls per slot).
        let clock = AtomicU64::new(0);
        hammer(threads, || {
            let now = Nanos::new(clock.fetch_add(50_000, Ordering::Relaxed));
            e.check(e.route_at(0).unwrap(), Key::None, now).is_admit()
        });
        let end = Nanos::new(clock.load(Ordering::Relaxed));
        let s = e.route_snapshot(e.route_at(0).unwrap(), end).unwrap();
        assert_eq!(s.offered, (threads * ATTEMPTS) as u64, "{threads} threads");
        assert_eq!(s.admitted + s.rejected_total(), s.offered);
    }
}

#[test]
fn a_key_table_never_holds_more_than_max_keys_under_contention() {
    // Threads adding new keys to a table one short of full each saw room and added
    // theirs: the table passed `max_keys` by up to one key per thread.
    let threads = 4;
    for round in 0..20 {
        let mut cfg = RouteConfig::new("max_keys_race", RouteMatch::any());
        cfg.partition = rocgate::config::Partition::Header("x-key".into(), {
            let mut v = rocgate::config::KeyLimits::default();
            v.max_keys = 64;
            v
        });
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let barrier = Barrier::new(threads);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (e, barrier) = (&e, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    for k in 0..500 {
                        let key = format!("{t}-{k}");
                        let _ = e.check(e.route_at(0).unwrap(), Key::Value(&key), Nanos::ZERO);
                    }
                });
            }
        });
        let keys = e
            .route_snapshot(e.route_at(0).unwrap(), Nanos::ZERO)
            .unwrap()
            .keys;
        assert!(keys <= 64, "round {round}: {keys} keys in a table of 64");
    }
}

/// Keys of a per-client token bucket route catch up with runtime limit changes made
/// while four threads decide their requests, at one instant: the keys' changes and
/// the route's take the 64 notes at once, and a change that finds its note taken is
/// left for the key's next request (a few times per run, most runs). No key admits
/// more than the largest capacity it had (8: a change never refills a bucket), and
/// every key ends at the last limit: full ten seconds later, each admits its 3 tokens.
/// A key whose change was left behind but which kept the route's generation it had
/// recorded stayed at an older limit (2 runs in 8 failed so).
#[test]
fn keys_catch_up_with_limit_changes_made_while_they_decide() {
    const KEYS: u32 = 256;
    let mut cfg = RouteConfig::new("keys_catch_up_race", RouteMatch::any());
    cfg.partition = rocgate::config::Partition::ClientIp(rocgate::config::KeyLimits::default());
    cfg.controller.base_limit_rps = 8.0;
    cfg.controller.cut_limit_rps = 1.0;
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    let key = |k: u32| Key::Ip(std::net::Ipv4Addr::from(0x0a00_0000 + k).into());
    let update = |limit: f64| {
        let mut params = e.route_params(id).unwrap();
        params.base_limit_rps = limit;
        e.update_route(id, params, Nanos::ZERO).unwrap();
    };
    let admitted: Vec<AtomicU32> = (0..KEYS).map(|_| AtomicU32::new(0)).collect();
    let threads = 4;
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (e, barrier, admitted) = (&e, &barrier, &admitted);
            s.spawn(move || {
                barrier.wait();
                for i in 0..ATTEMPTS as u32 {
                    let k = (i * 7 + t as u32) % KEYS;
                    if e.check(id, key(k), Nanos::ZERO).is_admit() {
                        admitted[k as usize].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        barrier.wait();
        for round in 0..300 {
            update([2.0, 4.0, 8.0][round % 3]);
        }
        update(3.0);
    });
    for (k, n) in admitted.iter().enumerate() {
        let n = n.load(Ordering::Relaxed);
        assert!(
            n <= 8,
            "key {k} admitted {n} at one instant, capacity 8 at most"
        );
    }
    let later = Nanos::from_secs(10);
    for k in 0..KEYS {
        let n = (0..10)
            .filter(|_| e.check(id, key(k), later).is_admit())
            .count();
        assert_eq!(n, 3, "key {k} does not hold the last limit");
    }
}
