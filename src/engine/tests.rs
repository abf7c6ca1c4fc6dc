//! Unit tests of the engine that read its private state (key tables, shadow
//! limiters); the rest are in `tests/`.

use super::*;
use crate::config::{KeyLimits, Tier};
use std::net::Ipv4Addr;

fn ip(n: u32) -> Key<'static> {
    Key::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
}

/// Offers `rate` req/s of `key` evenly from `from` to `to` (seconds).
fn offer(e: &Engine, id: RouteId, key: Key<'_>, from: f64, to: f64, rate: f64) {
    let n = ((to - from) * rate).round() as u64;
    for k in 0..n {
        let _ = e.check(id, key, Nanos::from_secs_f64(from + k as f64 / rate));
    }
}

/// Keys in the route's shadow key table.
fn shadow_keys(e: &Engine, id: RouteId) -> usize {
    match &e.route(id).unwrap().shadow {
        Some(Shadow::Keys(keys)) => keys.len(),
        _ => panic!("a shadow_adaptive partitioned route has a shadow key table"),
    }
}

/// Route `name` at the default limit (200/s, a token bucket of 200 tokens), with an
/// event `sale` from 2 s to 3 s (Unix time) that brings it to 20/s (cut 10/s): the
/// tests of the rollover that takes the event's profile at 2 s start from it.
fn with_a_sale(name: &str) -> RouteConfig {
    let mut cfg = RouteConfig::new(name, crate::config::RouteMatch::any());
    let mut event = cfg.controller.clone();
    event.base_limit_rps = 20.0;
    event.cut_limit_rps = 10.0;
    let start = std::time::UNIX_EPOCH + Duration::from_secs(2);
    cfg.events = vec![Event::new("sale", start, Duration::from_secs(1), event)];
    cfg
}

/// One route, `swept`, partitioned by client IP, its keys idle after 10 s (swept every
/// 5 s).
fn swept() -> Config {
    let mut cfg = RouteConfig::new("swept", crate::config::RouteMatch::any());
    cfg.partition = Partition::ClientIp(KeyLimits {
        idle_timeout: Duration::from_secs(10),
        ..KeyLimits::default()
    });
    Config::new(vec![cfg])
}

/// A rollover's sweep of idle keys runs with the route's state let go: a request of
/// the next slot, decided while the sweep runs (here on the sweeping thread, at the
/// key it evicts), rolls the window then, its arrivals counted in their own slot. The
/// sweep ran under the state lock, where that request found it taken and did not
/// roll: the slot went on accumulating until the next request after the sweep.
#[test]
fn the_next_slot_rolls_while_a_sweep_runs() {
    let reports = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = Arc::clone(&reports);
    let e = Engine::new(&swept(), Nanos::ZERO, SystemTime::UNIX_EPOCH)
        .unwrap()
        .with_sample_hook(Arc::new(move |_, report: &SlotReport| {
            seen.lock().unwrap().push(report.at);
        }));
    let e = Arc::new(e);
    let id = e.route_at(0).unwrap();
    assert!(e.check(id, ip(1), Nanos::ZERO).is_admit());
    // 11 s on, the key is idle (and at rest): the request that rolls the window sweeps
    // it out (every 5 s, half `idle_timeout`). At its eviction, a request of the slot
    // after the one that request rolled to (100 ms slots).
    let (swept, next) = (Nanos::from_secs(11), Nanos::from_millis(11_100));
    let during = Arc::new(std::sync::Mutex::new(None));
    {
        let (e, reports, during) = (Arc::clone(&e), Arc::clone(&reports), Arc::clone(&during));
        keys::ON_EVICT.set(Some(Box::new(move || {
            let before = reports.lock().unwrap().len();
            assert!(e.check(id, Key::None, next).is_admit());
            let rolled = reports.lock().unwrap()[before..].to_vec();
            *during.lock().unwrap() = Some(rolled);
        })));
    }
    assert!(e.check(id, ip(2), swept).is_admit());
    keys::ON_EVICT.set(None);
    assert_eq!(
        during.lock().unwrap().take(),
        Some(vec![next]),
        "the slots that the request during the sweep rolled"
    );
    let after = e.route_snapshot(id, next).unwrap();
    assert_eq!((after.keys, after.keys_evicted), (1, 1));
}

/// A sweep that panics (here the test's hook, at the first key it evicts) lets go of
/// the route's sweep as it unwinds: a later rollover sweeps the idle keys out. Were
/// the sweep's flag left set, no sweep would run again and the table would keep its
/// idle keys for ever, full, every new key in the overflow limiter.
#[test]
fn a_sweep_that_panicked_leaves_the_next_one_to_run() {
    let e = Engine::new(&swept(), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    for n in [1, 2] {
        assert!(e.check(id, ip(n), Nanos::ZERO).is_admit());
    }
    keys::ON_EVICT.set(Some(Box::new(|| panic!("a sweep that panics"))));
    let swept = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        e.check(id, Key::None, Nanos::from_secs(11))
    }));
    keys::ON_EVICT.set(None);
    assert!(swept.is_err(), "the sweep evicted a key, and panicked");
    assert_eq!(e.route_snapshot(id, Nanos::from_secs(11)).unwrap().keys, 2);
    // Past the next idle sweep's time (16 s: the panic left the clock at 11 s).
    let later = Nanos::from_secs(17);
    assert!(e.check(id, Key::None, later).is_admit());
    let s = e.route_snapshot(id, later).unwrap();
    assert_eq!((s.keys, s.keys_evicted), (0, 2));
}

/// A sweep that panics is not tried again before its next time: the table's clock
/// says it swept at 11 s, so the rollovers at 11.1 s and 15.9 s (idle sweeps every
/// 5 s, half `idle_timeout`) run none, and the one at 16 s runs it. The clock was
/// written once the sweep returned: a panicking sweep left it where it was, and every
/// rollover after (one per 100 ms slot) went through the table again and panicked.
#[test]
fn a_sweep_that_panicked_waits_for_its_next_time() {
    let e = Engine::new(&swept(), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    assert!(e.check(id, ip(1), Nanos::ZERO).is_admit());
    // The hook panics at the key's eviction, each time a sweep reaches it.
    let swept_at = |ms: u64| {
        keys::ON_EVICT.set(Some(Box::new(|| panic!("a sweep that panics"))));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            e.check(id, Key::None, Nanos::from_millis(ms))
        }))
        .is_err();
        keys::ON_EVICT.set(None);
        panicked
    };
    let panicked: Vec<u64> = [11_000, 11_100, 15_900, 16_000]
        .into_iter()
        .filter(|&ms| swept_at(ms))
        .collect();
    assert_eq!(panicked, [11_000, 16_000], "the rollovers whose sweep ran");
}

/// Every call that brings a route without requests up to date runs the rollover's
/// sweep as a request's rollover does, now that the sweep is the caller's to run once
/// the route's state is let go: `catch_up`, a runtime change, a change of the
/// `route_limit` share, and a reload, which sweeps the old route before it carries
/// its keys over (an idle key is not carried). Each, at 11 s, finds the one key
/// (seen at 0 s, `idle_timeout` 10 s) idle and evicts it.
#[test]
fn every_call_that_brings_a_route_up_to_date_sweeps_its_idle_keys() {
    let cfg = |mode: Mode| {
        let mut cfg = RouteConfig::new("quiet", crate::config::RouteMatch::any());
        cfg.mode = mode;
        cfg.route_limit_rps = Some(1_000.0);
        cfg.partition = Partition::ClientIp(KeyLimits {
            idle_timeout: Duration::from_secs(10),
            ..KeyLimits::default()
        });
        Config::new(vec![cfg])
    };
    let later = Nanos::from_secs(11);
    /// Brings the route up to `later`; a reload returns the engine it built.
    type BringUp<'a> = &'a dyn Fn(&Engine, RouteId) -> Option<Engine>;
    let bring_up: [(&str, BringUp<'_>); 5] = [
        ("catch_up", &|e, id| {
            e.catch_up(id, later);
            None
        }),
        ("update_route", &|e, id| {
            let params = e.route_params(id).unwrap();
            e.update_route(id, params, later).unwrap();
            None
        }),
        ("set_route_limit_share", &|e, _| {
            e.set_route_limit_share(2, later);
            None
        }),
        ("reload, the route kept", &|e, _| {
            Some(
                e.reload(&cfg(Mode::Enforce), later, SystemTime::UNIX_EPOCH)
                    .unwrap(),
            )
        }),
        ("reload, the route rebuilt", &|e, _| {
            Some(
                e.reload(&cfg(Mode::Shadow), later, SystemTime::UNIX_EPOCH)
                    .unwrap(),
            )
        }),
    ];
    for (what, bring_up) in bring_up {
        let e = Engine::new(&cfg(Mode::Enforce), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        assert!(e.check(id, ip(1), Nanos::ZERO).is_admit(), "{what}");
        let new = bring_up(&e, id);
        let old = e.route_snapshot(id, later).unwrap();
        let new = new.map_or_else(
            || e.route_snapshot(id, later).unwrap(),
            |new| new.route_snapshot(new.route_at(0).unwrap(), later).unwrap(),
        );
        assert_eq!(
            (old.keys, old.keys_evicted),
            (0, 1),
            "{what}: the old route"
        );
        assert_eq!(new.keys, 0, "{what}: the route after");
    }
}

/// In `shadow_adaptive` mode, the shadow key table's idle keys are evicted after
/// `idle_timeout` while the enforced table stays full, and is swept every 100 ms.
/// The shadow table used to be swept on the enforced table's clock: with the
/// enforced table swept every 100 ms, the shadow table, not full and swept every
/// half `idle_timeout`, never found that much time gone, and kept its keys.
#[test]
fn the_shadow_key_table_is_swept_on_its_own_clock() {
    let mut cfg = RouteConfig::new("sa-sweep", crate::config::RouteMatch::any());
    cfg.mode = Mode::ShadowAdaptive;
    cfg.partition = Partition::ClientIp(KeyLimits {
        max_keys: 2,
        idle_timeout: Duration::from_secs(10),
        ..KeyLimits::default()
    });
    cfg.controller.base_limit_rps = 10.0;
    cfg.controller.cut_limit_rps = 3.0;
    cfg.controller.danger_roc = 50.0;
    cfg.controller.safe_roc = 10.0;
    cfg.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(1024),
    };
    // Two keys whose one request each leaves their buckets short for 1,024 s: the
    // enforced table is full, and none of its keys is at rest.
    cfg.tiers = vec![Tier::new(
        "slow",
        vec!["10.0.0.1", "10.0.0.2"],
        1.0 / 1024.0,
        1.0 / 2048.0,
    )];
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    for n in [1, 2] {
        assert!(e.check(id, ip(n), Nanos::ZERO).is_admit());
    }
    offer(&e, id, Key::None, 0.0, 10.0, 8.0);
    offer(&e, id, Key::None, 10.0, 11.0, 500.0);
    let cut = e.route_snapshot(id, Nanos::from_secs(11)).unwrap();
    assert_eq!(cut.state, ControllerState::Cut);
    // A new client during the cut: the enforced table is full (it goes to the
    // overflow limiter), the shadow table takes it.
    offer(&e, id, ip(3), 11.0, 11.5, 4.0);
    assert_eq!(shadow_keys(&e, id), 1);
    // Anonymous requests roll the window on, every slot, for 30 s.
    offer(&e, id, Key::None, 11.5, 41.5, 10.0);
    let now = Nanos::from_secs_f64(41.5);
    assert_eq!(e.route_snapshot(id, now).unwrap().keys, 2, "still full");
    // The shadow key took the base limit's capacity (10,240 tokens) when the cut
    // ended, with the cut's (about 3,070) in it: not at rest until it has refilled,
    // about 12 minutes on.
    assert_eq!(shadow_keys(&e, id), 1);
    offer(&e, id, Key::None, 41.5, 800.0, 10.0);
    let now = Nanos::from_secs(800);
    let s = e.route_snapshot(id, now).unwrap();
    assert_eq!(s.keys, 2, "still full");
    assert_eq!(
        shadow_keys(&e, id),
        0,
        "the shadow key idle and refilled, idle_timeout 10 s, was evicted"
    );
    // The route's evictions are its enforced table's (the shadow table's were counted
    // too).
    assert_eq!(s.keys_evicted, 0);
}

/// The request that wins the slot rollover at 2 s takes the event's profile, and
/// its change of the route's bucket finds the note taken: it is decided at the
/// old limit (a 21st request at 2 s is admitted), not held until the note is free
/// (the test hung there, in `Note::take`), and the route is behind. The first
/// decision after the note is given back makes the change: the bucket holds 20
/// tokens and admits 20 at once. The event's end at 3 s, taken by an upkeep
/// (`catch_up`) while the note is held again, reaches the bucket at the next
/// upkeep, with no request in between.
#[test]
fn a_rollover_winner_never_waits_for_another_buckets_change() {
    let ms = Nanos::from_millis;
    // 200/s (200 tokens), and from 2 s to 3 s an event that brings it to 20/s.
    let cfg = with_a_sale("held_note");
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let (id, r) = (e.route_at(0).unwrap(), &*e.routes[0].route);
    crate::limiter::gcra::with_the_note_held(|| {
        let n = (0..21)
            .filter(|_| e.check(id, Key::None, ms(2_000)).is_admit())
            .count();
        assert_eq!(n, 21, "decided at 200/s meanwhile");
        assert_eq!(e.limit_rps(id), Some(20.0));
        assert_eq!(r.behind.load(Ordering::Relaxed), BEHIND_LIMITER);
    });
    assert_eq!(r.limiter.level(ms(2_000)).capacity, 200.0);
    let n = (0..100)
        .filter(|_| e.check(id, Key::None, ms(2_000)).is_admit())
        .count();
    assert_eq!(n, 20);
    assert_eq!(r.behind.load(Ordering::Relaxed), 0);
    assert_eq!(r.limiter.level(ms(2_000)).capacity, 20.0);
    crate::limiter::gcra::with_the_note_held(|| {
        e.catch_up(id, ms(3_000));
        assert_eq!(e.limit_rps(id), Some(200.0));
        assert_eq!(r.behind.load(Ordering::Relaxed), BEHIND_LIMITER);
    });
    assert_eq!(r.limiter.level(ms(3_000)).capacity, 20.0);
    e.catch_up(id, ms(3_000));
    assert_eq!(r.behind.load(Ordering::Relaxed), 0);
    assert_eq!(r.limiter.level(ms(3_000)).capacity, 200.0);
}

/// While a cut holds, a restore step changes the route's bucket only: the twin is
/// at the base limit already, and is left alone. (Each step set the twin to base
/// again, taking a note that other buckets' changes share: with the note taken,
/// the twin fell behind on a change that changes nothing.)
/// An engine whose one route, a token bucket at 10 req/s (cut 3) with a twin, its
/// controller as `tune` leaves it, has cut at 11 s: 12 req/s for 10 s, then 200 req/s
/// for a second.
fn cut_twin_route(
    tune: impl FnOnce(&mut crate::controller::ControllerParams),
) -> (Engine, RouteId) {
    let mut cfg = RouteConfig::new("twin", crate::config::RouteMatch::any());
    cfg.controller.base_limit_rps = 10.0;
    cfg.controller.cut_limit_rps = 3.0;
    cfg.controller.danger_roc = 50.0;
    cfg.controller.safe_roc = 10.0;
    tune(&mut cfg.controller);
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    let offer = |from_ms: u64, to_ms: u64, every_ms: u64| {
        for t in (from_ms..to_ms).step_by(usize::try_from(every_ms).unwrap()) {
            let _ = e.check(id, Key::None, Nanos::from_millis(t));
        }
    };
    offer(0, 10_000, 83);
    offer(10_000, 11_000, 5);
    assert!(e.limit_rps(id).unwrap() < 10.0, "cut");
    (e, id)
}

#[test]
fn a_restore_step_leaves_the_twin_at_base_alone() {
    let (e, id) = cut_twin_route(|c| c.restore_step_rps = 1.0);
    let r = &*e.routes[0].route;
    // 2 req/s until the first restore step, each decision made with the note held.
    let mut t = 11_000;
    loop {
        t += 500;
        assert!(t < 120_000, "no restore step");
        let before = e.limit_rps(id).unwrap();
        crate::limiter::gcra::with_the_note_held(|| {
            let _ = e.check(id, Key::None, Nanos::from_millis(t));
        });
        let after = e.limit_rps(id).unwrap();
        if after != before && after < 10.0 {
            let behind = r.behind.load(Ordering::Relaxed);
            assert_eq!(behind & TWIN_ENGAGED, TWIN_ENGAGED, "still cut");
            assert_eq!(behind & BEHIND_TWIN, 0, "the twin behind on a step");
            assert_eq!(behind & BEHIND_LIMITER, BEHIND_LIMITER, "the bucket's step");
            break;
        }
        let _ = e.check(id, Key::None, Nanos::from_millis(t));
    }
}

/// An engine whose one route, a token bucket at 10 req/s (cut 3), has cut, and the
/// instant two seconds on, after a decision there: its bucket at the cut holds fewer
/// tokens than its twin at base.
fn cut_with_a_twin() -> (Engine, RouteId, Nanos) {
    let (e, id) = cut_twin_route(|_| {});
    let at = Nanos::from_millis(13_000);
    let _ = e.check(id, Key::None, at);
    let r = e.route(id).unwrap();
    assert_ne!(
        r.behind.load(Ordering::Relaxed) & TWIN_ENGAGED,
        0,
        "twin engaged"
    );
    (e, id, at)
}

/// Decisions made with the twin engaged but the cut not yet marked `engaged` (the gap
/// at a cut's start, between [`Route::set_limiters`] and the store of `engaged`) name
/// their refusals `limit`, and are counted against the base limit neither way: a
/// refusal there counted in `CUT_REJECTED`, labelled `limit`. The twin still takes
/// its tokens, as the base limit alone would. `drain` empties the twin first, so that
/// the bucket's admissions are ones the base limit refuses.
fn decided_in_the_gap(drain: bool) {
    let (e, id, at) = cut_with_a_twin();
    let r = e.route(id).unwrap();
    let Some(Shadow::Twin(twin)) = &r.shadow else {
        panic!("a twin")
    };
    while drain && twin.take(at).is_ok() {}
    let twin_before = twin.level(at).value;
    assert!(
        drain || twin_before >= 1.0,
        "a twin with tokens to take: {twin_before}"
    );
    let before = e.route_snapshot(id, at).unwrap();
    r.engaged.store(false, Ordering::Relaxed);
    let decisions: Vec<Decision> = (0..20).map(|_| e.check(id, Key::None, at)).collect();
    let after = e.route_snapshot(id, at).unwrap();
    let count = |s: &RouteSnapshot, reason: Reason| {
        s.rejected
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    };
    let refused = decisions.iter().filter(|d| !d.is_admit()).count() as u64;
    assert!(0 < refused && refused < 20, "{decisions:?}");
    assert_eq!(
        count(&after, Reason::Limit) - count(&before, Reason::Limit),
        refused
    );
    assert_eq!(
        count(&after, Reason::RocCut),
        count(&before, Reason::RocCut)
    );
    assert_eq!(
        (after.cut_vs_base_rejected, after.cut_vs_base_admitted),
        (before.cut_vs_base_rejected, before.cut_vs_base_admitted),
        "decided in the gap, counted against the base limit"
    );
    assert!(
        twin.take(at).is_err(),
        "the twin took its tokens in the gap, as the base limit would"
    );
}

#[test]
fn a_refusal_labelled_limit_is_not_counted_as_the_cuts_own() {
    decided_in_the_gap(false);
}

#[test]
fn an_admission_before_the_cut_is_marked_is_not_counted_against_the_base_limit() {
    decided_in_the_gap(true);
}

/// A cut that engages while the twin's change to a raised base limit finds its note
/// taken gives the twin the route's bucket's tokens once that change is made, at the
/// raised capacity: they were copied first, clamped to the twin's older capacity (300
/// tokens at 10 req/s for 30 s), and the change kept them so, 100 short.
#[test]
fn a_twin_behind_a_raise_of_the_base_limit_starts_with_the_buckets_tokens() {
    let mut cfg = RouteConfig::new("twin_raised", crate::config::RouteMatch::any());
    cfg.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(30),
    };
    cfg.controller.base_limit_rps = 10.0;
    cfg.controller.cut_limit_rps = 3.0;
    cfg.controller.danger_roc = 50.0;
    cfg.controller.safe_roc = 10.0;
    // From 1 s on, an event raises the base limit to 20 req/s: the twin, idle, stays
    // at 10 until a cut engages.
    let mut raised = cfg.controller.clone();
    raised.base_limit_rps = 20.0;
    raised.cut_limit_rps = 6.0;
    let start = std::time::UNIX_EPOCH + Duration::from_secs(1);
    cfg.events = vec![Event::new(
        "raised",
        start,
        Duration::from_secs(1000),
        raised,
    )];
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let (id, r) = (e.route_at(0).unwrap(), &*e.routes[0].route);
    let Some(Shadow::Twin(twin)) = &r.shadow else {
        panic!("a twin")
    };
    // 12 req/s for 60 s fills the bucket at 20 req/s (600 tokens).
    offer(&e, id, Key::None, 0.0, 60.0, 12.0);
    assert_eq!(r.limiter.level(Nanos::from_secs(60)).value, 600.0);
    // 200 req/s until the cut, every change finding its note taken: the bucket and
    // its twin are left behind.
    let mut t = Nanos::from_secs(60);
    crate::limiter::gcra::with_the_note_held(|| {
        while e.limit_rps(id).unwrap() >= 20.0 {
            assert!(t < Nanos::from_secs(62), "no cut");
            let _ = e.check(id, Key::None, t);
            t = Nanos::new(t.as_u64() + 5_000_000);
        }
    });
    let behind = r.behind.load(Ordering::Relaxed);
    assert_eq!(behind & BEHIND_TWIN, BEHIND_TWIN, "{behind}");
    let tokens = r.limiter.level(t).value;
    assert!(tokens > 300.0, "{tokens}");
    // The next decision makes the changes, and takes a token from both.
    let _ = e.check(id, Key::None, t);
    assert_ne!(r.behind.load(Ordering::Relaxed) & TWIN_ENGAGED, 0);
    let level = twin.level(t);
    assert_eq!(level.capacity, 600.0);
    assert!(
        (level.value - (tokens - 1.0)).abs() < 1e-6,
        "{level:?}, {tokens}"
    );
}

/// An engine of one route of `algorithm` at `base` (cut to `cut`) whose sample hook
/// keeps `pick` of each slot report.
fn reporting<T: Send + 'static>(
    algorithm: Algorithm,
    base: f64,
    cut: f64,
    pick: fn(&SlotReport) -> T,
) -> (Engine, Arc<Mutex<Vec<T>>>) {
    let mut cfg = RouteConfig::new("reporting", crate::config::RouteMatch::any());
    cfg.algorithm = algorithm;
    cfg.controller.base_limit_rps = base;
    cfg.controller.cut_limit_rps = cut;
    let reports = Arc::new(Mutex::new(Vec::new()));
    let hook = {
        let reports = Arc::clone(&reports);
        move |_: &str, r: &SlotReport| reports.lock().unwrap().push(pick(r))
    };
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH)
        .unwrap()
        .with_sample_hook(Arc::new(hook));
    (e, reports)
}

/// A concurrency route's slot reports say how many requests were in flight when
/// the slot closed (what its base limit counts, for the tuning hints); other
/// algorithms' say nothing.
#[test]
fn slot_reports_carry_the_count_in_flight_of_a_concurrency_route() {
    let seen = |algorithm: Algorithm| {
        let (e, reports) = reporting(algorithm, 10.0, 5.0, |r| r.in_flight);
        let id = e.route_at(0).unwrap();
        let held: Vec<Decision> = (0..3)
            .map(|_| e.check(id, Key::None, Nanos::ZERO))
            .collect();
        assert!(held.iter().all(Decision::is_admit));
        let _ = e.check(id, Key::None, Nanos::from_millis(250));
        let seen = reports.lock().unwrap().clone();
        seen
    };
    let counts = seen(Algorithm::Concurrency { queue: 0 });
    assert!(!counts.is_empty());
    assert!(counts.iter().all(|&n| n == Some(3.0)), "{counts:?}");
    let bucket = seen(Algorithm::TokenBucket {
        burst: Duration::from_secs(1),
    });
    assert!(
        !bucket.is_empty() && bucket.iter().all(Option::is_none),
        "{bucket:?}"
    );
}

/// A leaky-bucket route with no queue reports its limiter exhausted when a slot is
/// closed while it is full (a request sent in the interval before), not when it is
/// idle: it reported every slot exhausted, the level's 0 waiting read against
/// a capacity of 0, and the tuning hints counted an idle route's time as exhausted.
#[test]
fn an_idle_leaky_route_with_no_queue_is_not_reported_exhausted() {
    let (e, reports) = reporting(Algorithm::LeakyBucket { queue: 0 }, 1.0, 1.0, |r| {
        r.exhausted
    });
    let id = e.route_at(0).unwrap();
    // Slots of 100 ms, reported by the request that rolls them, with the level it
    // finds: idle at 550 ms and 1.7 s (a request at 550 ms keeps the bucket full to
    // 1.55 s), full at 650 ms.
    for (ms, admitted) in [(550, true), (650, false), (1700, true)] {
        let d = e.check(id, Key::None, Nanos::from_millis(ms));
        assert_eq!(d.is_admit(), admitted, "{ms} ms");
    }
    let seen = reports.lock().unwrap().clone();
    let (idle, full) = (
        seen.iter().filter(|&&x| !x).count(),
        seen.iter().filter(|&&x| x).count(),
    );
    assert!(idle >= 10 && full >= 1, "{seen:?}");
}

/// A sample hook that panics once (at the first slot's report, 0.5 s) poisons the
/// route's state lock, which the request rolling the window held. The route still
/// rolls: the request that wins the rollover at 2 s takes the event's profile
/// (20/s), and when its change finds the note taken, the next decision makes it.
/// Before, `try_lock` failed on the poisoned lock forever: no request rolled the
/// window or stepped the controller again, the limit stayed 200/s through the
/// event (a cut in force then would have stayed in force for good), and no
/// decision made a change left behind.
#[test]
fn a_route_whose_lock_a_panicking_hook_poisoned_still_rolls() {
    let ms = Nanos::from_millis;
    let cfg = with_a_sale("poisoned_lock");
    let panicked = Arc::new(AtomicBool::new(false));
    let hook = {
        let panicked = Arc::clone(&panicked);
        move |_: &str, _: &SlotReport| {
            if !panicked.swap(true, Ordering::Relaxed) {
                panic!("the sample hook fails once");
            }
        }
    };
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH)
        .unwrap()
        .with_sample_hook(Arc::new(hook));
    let (id, r) = (e.route_at(0).unwrap(), &*e.routes[0].route);
    let rolled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        e.check(id, Key::None, ms(500))
    }));
    assert!(rolled.is_err() && r.state.is_poisoned());
    crate::limiter::gcra::with_the_note_held(|| {
        assert!(e.check(id, Key::None, ms(2_000)).is_admit());
        assert_eq!(e.limit_rps(id), Some(20.0), "the event's limit");
        assert_eq!(r.behind.load(Ordering::Relaxed), BEHIND_LIMITER);
    });
    assert!(e.check(id, Key::None, ms(2_000)).is_admit());
    assert_eq!(r.behind.load(Ordering::Relaxed), 0);
    assert_eq!(r.limiter.level(ms(2_000)).capacity, 20.0);
}

/// A key's request that must catch up with a change of its route's limit (4/s
/// lowered to 1/s, one second's burst), while the note the key's bucket needs is
/// held by another bucket's change: decided at the key's old limit (2 of 4 tokens
/// left: admitted), not held until the note is free (the test hung there, in
/// `Note::take`). Its next request catches up: the one token left at 4/s stays
/// one at 1/s, and a request after it waits a second. At 0 the key admitted 4,
/// its old capacity.
#[test]
fn a_keyed_request_never_waits_for_another_buckets_change() {
    let mut cfg = RouteConfig::new("held_note_keys", crate::config::RouteMatch::any());
    cfg.partition = crate::config::Partition::ClientIp(crate::config::KeyLimits::default());
    cfg.controller.base_limit_rps = 4.0;
    cfg.controller.cut_limit_rps = 1.0;
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let (id, key) = (
        e.route_at(0).unwrap(),
        Key::Ip(std::net::Ipv4Addr::new(10, 0, 0, 1).into()),
    );
    for _ in 0..2 {
        assert!(e.check(id, key, Nanos::ZERO).is_admit());
    }
    let mut params = e.route_params(id).unwrap();
    params.base_limit_rps = 1.0;
    e.update_route(id, params, Nanos::ZERO).unwrap();
    crate::limiter::gcra::with_the_note_held(|| assert!(e.check(id, key, Nanos::ZERO).is_admit()));
    assert!(e.check(id, key, Nanos::ZERO).is_admit());
    let r = e.check(id, key, Nanos::ZERO).rejection().expect("empty");
    assert_eq!(r.retry_after, Duration::from_secs(1));
}

/// The sample hook says which slots the controller acted on: none before one full
/// window (6 s) from the start, every one after.
#[test]
fn slot_reports_say_whether_the_controller_was_armed() {
    let config = Config::new(vec![RouteConfig::new(
        "r",
        crate::config::RouteMatch::any(),
    )]);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let engine = Engine::new(&config, Nanos::ZERO, std::time::UNIX_EPOCH)
        .unwrap()
        .with_sample_hook(Arc::new(move |_: &str, r: &SlotReport| {
            sink.lock().unwrap().push((r.at, r.armed));
        }));
    let id = engine.route_at(0).unwrap();
    for ms in (0..8_000).step_by(50) {
        let _ = engine.check(id, Key::None, Nanos::from_millis(ms));
    }
    let seen = seen.lock().unwrap();
    assert!(seen.len() > 70, "{}", seen.len());
    for &(at, armed) in seen.iter() {
        assert_eq!(armed, at >= Nanos::from_secs(6), "at {at}");
    }
}

/// A partitioned route counts the distinct keys it refused, not its refusals: one
/// client's flood reads as one key, forty clients over their limits as about forty,
/// and keys only admitted as none. A snapshot reads the count; a take empties it.
#[test]
fn a_partitioned_route_counts_the_distinct_keys_it_refused() {
    let mut cfg = RouteConfig::new("login", crate::config::RouteMatch::any());
    cfg.partition = Partition::ClientIp(KeyLimits::default());
    cfg.controller.base_limit_rps = 10.0;
    cfg.controller.cut_limit_rps = 5.0;
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    let refused = |e: &Engine| {
        e.route_snapshot(id, Nanos::from_secs(9))
            .unwrap()
            .refused_keys
    };
    assert_eq!(refused(&e).map(|s| s.estimate()), Some(0));
    // One brute-forcer at 100 req/s against 10/s, and 50 clients admitted.
    offer(&e, id, ip(1), 0.0, 2.0, 100.0);
    for n in 100..150 {
        assert!(e.check(id, ip(n), Nanos::from_secs(2)).is_admit());
    }
    assert_eq!(refused(&e).map(|s| s.estimate()), Some(1));
    assert_eq!(e.take_refused_keys(id).map(|s| s.estimate()), Some(1));
    assert_eq!(e.take_refused_keys(id).map(|s| s.estimate()), Some(0));
    // Forty clients, each refused after its burst of 10.
    for n in 200..240 {
        for _ in 0..30 {
            let _ = e.check(id, ip(n), Nanos::from_secs(3));
        }
    }
    let forty = e.take_refused_keys(id).unwrap().estimate();
    assert!((24..=56).contains(&forty), "40 keys read as {forty}");
    let mut whole = RouteConfig::new("whole", crate::config::RouteMatch::any());
    whole.controller.base_limit_rps = 1.0;
    whole.controller.cut_limit_rps = 1.0;
    let e = Engine::new(
        &Config::new(vec![whole]),
        Nanos::ZERO,
        SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    let id = e.route_at(0).unwrap();
    offer(&e, id, ip(1), 0.0, 1.0, 10.0);
    assert_eq!(e.take_refused_keys(id), None);
    let snap = e.route_snapshot(id, Nanos::from_secs(1)).unwrap();
    assert_eq!(snap.refused_keys, None);
}

/// A partitioned route in `shadow_adaptive` ({"login", base 10/s, cut 3/s}) cut by a
/// keyless flood: the keyless requests are refused by their own limiter (one key).
fn a_cut_shadow_adaptive_route() -> (Engine, RouteId) {
    let mut cfg = RouteConfig::new("login", crate::config::RouteMatch::any());
    cfg.mode = Mode::ShadowAdaptive;
    cfg.partition = Partition::ClientIp(KeyLimits::default());
    cfg.controller.base_limit_rps = 10.0;
    cfg.controller.cut_limit_rps = 3.0;
    cfg.controller.danger_roc = 50.0;
    cfg.controller.safe_roc = 10.0;
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    offer(&e, id, Key::None, 0.0, 10.0, 8.0);
    offer(&e, id, Key::None, 10.0, 11.0, 500.0);
    let cut = e.route_snapshot(id, Nanos::from_secs(11)).unwrap();
    assert_eq!(cut.state, ControllerState::Cut);
    (e, id)
}

/// What enforcing would have refused counts among a shadow partitioned route's keys
/// refused: in `shadow` the keys over their limit (refused by the limiter, then let
/// through), in `shadow_adaptive` the keys its base limit refuses and those the cut
/// would have (tried against the shadow key table while it holds), as an enforcing
/// route refuses both. Keys only admitted count as none.
#[test]
fn a_shadow_partitioned_route_counts_the_keys_enforcing_would_refuse() {
    let mut cfg = RouteConfig::new("login", crate::config::RouteMatch::any());
    cfg.mode = Mode::Shadow;
    cfg.partition = Partition::ClientIp(KeyLimits::default());
    cfg.controller.base_limit_rps = 10.0;
    cfg.controller.cut_limit_rps = 5.0;
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    for n in 1..=3 {
        for k in 0..40 {
            let t = Nanos::from_secs_f64(k as f64 / 100.0);
            assert!(e.check(id, ip(n), t).is_admit());
        }
    }
    for n in 100..150 {
        assert!(e.check(id, ip(n), Nanos::from_secs(1)).is_admit());
    }
    let (hasher, three) = refused_by_hash(&e, id);
    assert_eq!(three, by_hash(&hasher, 1..=3));

    let (e, id) = a_cut_shadow_adaptive_route();
    assert_eq!(e.take_refused_keys(id).map(|s| s.estimate()), Some(1));
    // Twenty clients of 6 requests each while the cut holds: the base limit (a
    // bucket of 10) admits them all, the cut (3) would have refused 3 of each.
    let at = Nanos::from_millis(11_050);
    let before = e
        .route_snapshot(id, at)
        .unwrap()
        .shadow_rejected_for(Reason::RocCut);
    for n in 1..=20 {
        for _ in 0..6 {
            assert!(e.check(id, ip(n), at).is_admit());
        }
    }
    let cut = e.route_snapshot(id, at).unwrap();
    assert_eq!(cut.state, ControllerState::Cut);
    assert_eq!(cut.shadow_rejected_for(Reason::RocCut), before + 60);
    let (hasher, twenty) = refused_by_hash(&e, id);
    assert_eq!(twenty, by_hash(&hasher, 1..=20));
    assert_eq!(e.take_refused_keys(id), Some(twenty));
}

/// The sketch of the keys `ip(n)` for `n` in `keys` that a key table hashing by
/// `hasher` counts.
fn by_hash(hasher: &std::hash::RandomState, keys: std::ops::RangeInclusive<u32>) -> KeySketch {
    use std::hash::BuildHasher;
    let mut sketch = KeySketch::new();
    for n in keys {
        let Key::Ip(addr) = ip(n) else { unreachable!() };
        sketch.record(hasher.hash_one(super::key_types::IpKey::new(addr, 64)));
    }
    sketch
}

/// The hasher of route `id`'s key table and the keys it refused so far, hashed by it
/// (read, not taken).
fn refused_by_hash(e: &Engine, id: RouteId) -> (std::hash::RandomState, KeySketch) {
    e.route(id)
        .unwrap()
        .keys()
        .unwrap()
        .refused_by_hash()
        .unwrap()
}

/// A reload carries the keys a partitioned route refused since the history last
/// took them: a route it keeps holds them still, and a route it rebuilds under the
/// same name (here its mode changed) takes them over, counted by the same hash, so a
/// key refused on both sides of the reload counts once. A route the reload drops
/// lets them go: another name starts empty.
#[test]
fn a_reload_carries_the_keys_refused() {
    let route = |name: &str, mode: Mode| {
        let mut cfg = RouteConfig::new(name, crate::config::RouteMatch::any());
        cfg.mode = mode;
        cfg.partition = Partition::ClientIp(KeyLimits::default());
        cfg.controller.base_limit_rps = 10.0;
        cfg.controller.cut_limit_rps = 5.0;
        Config::new(vec![cfg])
    };
    let refuse = |e: &Engine, keys: std::ops::Range<u32>, at: u64| {
        let id = e.route_at(0).unwrap();
        for n in keys {
            offer(e, id, ip(n), at as f64, at as f64 + 1.0, 40.0);
        }
    };
    let refused = |e: &Engine| e.take_refused_keys(e.route_at(0).unwrap()).unwrap();
    // `e` reloaded with route `name` in `mode`, at `at` s.
    let reload = |e: &Engine, name: &str, mode: Mode, at: u64| {
        e.reload(
            &route(name, mode),
            Nanos::from_secs(at),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap()
    };
    let old = Engine::new(
        &route("login", Mode::Enforce),
        Nanos::ZERO,
        SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    refuse(&old, 1..6, 0);
    let kept = reload(&old, "login", Mode::Enforce, 2);
    let (hasher, five) = refused_by_hash(&kept, kept.route_at(0).unwrap());
    assert_eq!(five, by_hash(&hasher, 1..=5));
    assert_eq!(refused(&kept), five);

    refuse(&kept, 1..6, 2);
    let rebuilt = reload(&kept, "login", Mode::Shadow, 4);
    refuse(&rebuilt, 3..9, 4);
    let sketch = refused(&rebuilt);
    let one_hash = {
        let mut by_hand = KeySketch::new();
        refuse(&kept, 1..9, 6);
        by_hand.merge(&refused(&kept));
        by_hand
    };
    assert_eq!(sketch, one_hash);
    assert_eq!(sketch, by_hash(&hasher, 1..=8));

    refuse(&rebuilt, 1..6, 8);
    let renamed = reload(&rebuilt, "signin", Mode::Shadow, 10);
    assert!(refused(&renamed).is_empty());
}

/// The schedule a shared store takes per decision ([`Engine::schedule`]) is the
/// route's, shared rather than copied, and follows every change of the route's own
/// parameters or events at once: a runtime change, an event placed again from the
/// wall clock, a reload that keeps the route. After each, it is the one built afresh
/// from the route's state, and says the new parameters and edges; one not rebuilt
/// would hand the store the old ones until the next change.
#[test]
fn the_shared_schedule_follows_each_change_at_once() {
    let s = Nanos::from_secs_f64;
    let built_afresh = |e: &Engine| {
        let st = e.routes[0].route.lock();
        events::schedule_of(&st.own, &st.events)
    };
    let e = Engine::new(
        &Config::new(vec![with_a_sale("order")]),
        Nanos::ZERO,
        std::time::UNIX_EPOCH,
    )
    .unwrap();
    let id = e.route_at(0).unwrap();
    let schedule = e.schedule(id).unwrap();
    assert_eq!(*schedule, built_afresh(&e));
    assert!(Arc::ptr_eq(&schedule, &e.schedule(id).unwrap()), "copied");
    assert_eq!(schedule.params_at(s(1.0)).base_limit_rps, 200.0);
    assert_eq!(schedule.params_at(s(2.5)).base_limit_rps, 20.0);
    assert_eq!(schedule.edges().collect::<Vec<_>>(), [s(2.0), s(3.0)]);

    // A runtime change: the route's own parameters, and the sale's profile follows in
    // the fields it leaves as the route's own.
    let mut changed = e.params_at(id, s(1.0)).unwrap();
    changed.base_limit_rps = 100.0;
    changed.danger_roc += 1.0;
    e.update_route(id, changed.clone(), s(1.0)).unwrap();
    let schedule = e.schedule(id).unwrap();
    assert_eq!(*schedule, built_afresh(&e));
    assert_eq!(*schedule.params_at(s(1.0)), changed);
    assert_eq!(schedule.params_at(s(2.5)).base_limit_rps, 20.0);
    assert_eq!(schedule.params_at(s(2.5)).danger_roc, changed.danger_roc);

    // The wall clock stepped half a second ahead: the sale comes half a second sooner
    // on the engine's clock.
    e.align_events(s(1.0), std::time::UNIX_EPOCH + Duration::from_millis(1500));
    let schedule = e.schedule(id).unwrap();
    assert_eq!(*schedule, built_afresh(&e));
    assert_eq!(schedule.edges().collect::<Vec<_>>(), [s(1.5), s(2.5)]);
    // Placed again where it stands: the same schedule, not rebuilt.
    e.align_events(s(1.0), std::time::UNIX_EPOCH + Duration::from_millis(1500));
    assert!(Arc::ptr_eq(&schedule, &e.schedule(id).unwrap()));

    // A reload that keeps the route: the file's parameters and its sale, moved.
    let mut cfg = with_a_sale("order");
    cfg.controller.base_limit_rps = 150.0;
    cfg.events[0].start = std::time::UNIX_EPOCH + Duration::from_secs(5);
    let reloaded = e
        .reload(
            &Config::new(vec![cfg]),
            s(1.0),
            std::time::UNIX_EPOCH + Duration::from_secs(1),
        )
        .unwrap();
    assert!(
        Arc::ptr_eq(&e.routes[0].route, &reloaded.routes[0].route),
        "kept"
    );
    let id = reloaded.route_at(0).unwrap();
    let schedule = reloaded.schedule(id).unwrap();
    assert_eq!(*schedule, built_afresh(&reloaded));
    assert_eq!(schedule.params_at(s(1.0)).base_limit_rps, 150.0);
    assert_eq!(schedule.edges().collect::<Vec<_>>(), [s(5.0), s(6.0)]);
}

/// The schedule [`Engine::schedule`] hands out is, after any sequence of what changes
/// a route's own parameters or events, the one built afresh from the route's state,
/// and tells the parameters [`Engine::params_at`] does at each edge: drawn sequences
/// of requests, runtime changes (some retiring an event that has ended, whose profile
/// the change's cut limit no longer fits), the wall clock, up to a second off the
/// engine's, placing the events again, upkeeps (of a route decided here or
/// elsewhere), catch-ups, snapshots, and reloads that keep the route (moving an
/// event, with or without a runtime change kept) or rebuild it (a new window). A
/// writer of the parameters or events that left the shared schedule as it was would
/// hand a shared store the old profile until the next change.
#[test]
fn the_shared_schedule_is_the_routes_after_any_change() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut draw = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut retired = 0;
    // `late` sets its base limit only: its cut limit is the route's own, which a
    // change above 50 leaves it no room for.
    let mut file = with_a_sale("order");
    file.controller.cut_limit_rps = 40.0;
    let mut late = file.controller.clone();
    late.base_limit_rps = 50.0;
    let at = |ms: u64| std::time::UNIX_EPOCH + Duration::from_millis(ms);
    file.events
        .push(Event::new("late", at(6000), Duration::from_secs(2), late));
    for round in 0..100 {
        let mut e = Engine::new(&Config::new(vec![file.clone()]), Nanos::ZERO, at(0)).unwrap();
        let mut t = 0;
        for step in 0..60 {
            t += draw(700);
            let now = Nanos::from_millis(t);
            // The wall clock up to a second either side of the engine's.
            let wall = at((t + draw(2000)).saturating_sub(1000));
            let id = e.route_at(0).unwrap();
            match draw(7) {
                0 => {
                    for _ in 0..draw(50) {
                        let _ = e.check(id, Key::None, now);
                    }
                }
                1 => {
                    let mut p = e.route_params(id).unwrap();
                    p.base_limit_rps = [5.0, 30.0, 100.0, 200.0][draw(4) as usize];
                    p.cut_limit_rps = p.base_limit_rps / 2.0;
                    p.danger_roc = 30.0 + draw(5) as f64;
                    let _ = e.update_route(id, p, now);
                }
                2 => e.align_events(now, wall),
                3 => {
                    let elsewhere = draw(2) == 0;
                    e.upkeep(now, wall, |_| elsewhere);
                }
                4 => e.catch_up(id, now),
                5 => {
                    let mut cfg = file.clone();
                    cfg.controller.base_limit_rps = [100.0, 200.0][draw(2) as usize];
                    cfg.events[0].start = at(draw(5000));
                    if draw(3) == 0 {
                        cfg.window =
                            WindowSpec::new(Duration::from_secs(2), Duration::from_millis(200))
                                .unwrap();
                    }
                    let mut kept = e.route_params(id).unwrap();
                    kept.base_limit_rps = 250.0;
                    let changes = match draw(2) {
                        0 => vec![("order".to_owned(), kept)],
                        _ => Vec::new(),
                    };
                    e = e
                        .reload_keeping(&Config::new(vec![cfg]), &changes, now, wall)
                        .unwrap()
                        .0;
                }
                _ => {
                    let _ = e.route_snapshot(id, now);
                }
            }
            let id = e.route_at(0).unwrap();
            let schedule = e.schedule(id).unwrap();
            let st = e.routes[0].route.lock();
            let afresh = events::schedule_of(&st.own, &st.events);
            assert_eq!(*schedule, afresh, "round {round}, step {step}");
            retired += st.events.iter().filter(|e| e.wall.1.is_zero()).count();
            let edges: Vec<Nanos> = st.events.iter().flat_map(|e| [e.start, e.end]).collect();
            drop(st);
            for edge in edges {
                for t in [edge, edge - Duration::from_nanos(1)] {
                    assert_eq!(
                        *schedule.params_at(t),
                        e.params_at(id, t).unwrap(),
                        "round {round}, step {step}, at {t:?}"
                    );
                }
            }
        }
    }
    assert!(retired > 0, "no change retired an event");
}

/// `Retry-After` of a cut whose calm is known, with an event's edge before the raise,
/// on a route whose `safe_roc` is below 0 (calm is demand falling faster than 50/s
/// a second): the walk through the edge must read the calm on, as
/// [`Controller::next_raise_at`] does, not take a reading of no change, which is not
/// calm under that threshold. A spike of 300 in the slot from 2 s cuts at 2.1 s; from
/// 3.1 s it is in the window's earlier half (ROC -300 a second, calm) until 4.1 s; the
/// hold of 0.5 s ends the cut at 3.6 s, and the sale from 3.35 s (a restore interval
/// of 0.5 s) takes the limit up at 4.1 s. The walk used to read no calm at the
/// sale's slot (3.4 s), forget the calm begun at 3.1 s, and tell 5.1 s.
#[test]
fn a_cut_calm_under_a_negative_safe_roc_stays_calm_through_an_edge() {
    let ms = Nanos::from_millis;
    let mut cfg = RouteConfig::new("r", crate::config::RouteMatch::any());
    cfg.window = WindowSpec::new(Duration::from_secs(2), Duration::from_millis(100)).unwrap();
    cfg.controller.safe_roc = -50.0;
    cfg.controller.hold = Duration::from_millis(500);
    let mut sale = cfg.controller.clone();
    sale.restore_interval = Duration::from_millis(500);
    let start = std::time::UNIX_EPOCH + Duration::from_millis(3_350);
    cfg.events = vec![Event::new("sale", start, Duration::from_secs(10), sale)];
    let (told, raised) = told_and_raised(cfg);
    assert_eq!(raised, ms(4_100), "the engine's own raise");
    assert_eq!(told, raised);
}

/// `Retry-After` of a cut when an event due before the raise lowers both the cut and
/// the base limit below the limit the request met: the cut's first restore step
/// under the event stops at the event's base, no raise past that limit, and the limit
/// first rises above it when the event ends. A spike of 300 in the slot from 2 s cuts
/// to 60/s at 2.1 s, calm from 3.1 s; the event from 3.5 s to 10 s (cut 50, base 55)
/// holds the cut at 50 until 5.1 s, its first step (6.1 s) takes it to 55, and its end
/// at 10 s restores the route's base of 200. The walk used to take the step past
/// where the cut stood (50 + 20 above 60) as the raise, capped by the base or not, and
/// tell 6.1 s.
#[test]
fn a_cut_under_an_event_whose_base_is_below_the_limit_rises_when_it_ends() {
    let ms = Nanos::from_millis;
    let mut cfg = RouteConfig::new("r", crate::config::RouteMatch::any());
    cfg.window = WindowSpec::new(Duration::from_secs(2), Duration::from_millis(100)).unwrap();
    let mut sale = cfg.controller.clone();
    sale.cut_limit_rps = 50.0;
    sale.base_limit_rps = 55.0;
    let start = std::time::UNIX_EPOCH + Duration::from_millis(3_500);
    cfg.events = vec![Event::new(
        "sale",
        start,
        Duration::from_millis(6_500),
        sale,
    )];
    let (told, raised) = told_and_raised(cfg);
    assert_eq!(raised, ms(10_000), "the engine's own raise");
    assert_eq!(told, raised);
}

/// A route of `cfg` (a 2 s window of 100 ms slots) cut by a spike of 300 in the slot
/// from 2 s, stepped slot by slot to 3.1 s (still cut), then refused at 3.15 s: when
/// its `Retry-After` says the limit rises, and the slot end at which the engine,
/// stepped slot by slot from there, first raises it (within 20 s).
fn told_and_raised(cfg: RouteConfig) -> (Nanos, Nanos) {
    let ms = Nanos::from_millis;
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    for k in 0..300 {
        let _ = e.check(
            id,
            Key::None,
            Nanos::new(2_000_000_000 + k * 100_000_000 / 300),
        );
    }
    for slot in 21..=31 {
        e.catch_up(id, ms(slot * 100));
    }
    assert_eq!(
        e.route_snapshot(id, ms(3_100)).unwrap().state,
        ControllerState::Cut
    );
    let probe = ms(3_150);
    let _ = e.check(id, Key::None, probe);
    let told = probe + e.restore_eta(id, probe).unwrap();
    let limit = e.limit_rps(id).unwrap();
    let raised = (32..200)
        .map(|slot| ms(slot * 100))
        .find(|&at| {
            e.catch_up(id, at);
            e.limit_rps(id).unwrap() > limit
        })
        .unwrap();
    (told, raised)
}

/// Under a `safe_roc` of 0 or below a cut whose calm is not known ends at `max_cut`
/// (a spike that holds its level never reads under 0), walked through events or not:
/// cut at 10 s, an event lowering the cut limit to 30/s from 12 s to 50 s, which the
/// walk steps stop by stop (its first step does not take the limit past the 60/s the
/// request met), ends at the cut's `max_cut` (70 s) and the first step past 60/s is at
/// 71 s, as without the event. The walk took the calm at its last edge (50 s), plus
/// the hold and the interval: 53 s, where `next_raise_at` said 19 s.
#[test]
fn a_cut_never_calm_under_a_safe_roc_of_0_is_raised_at_max_cut_through_events() {
    let s = Nanos::from_secs;
    let window = WindowSpec::new(Duration::from_secs(6), Duration::from_millis(100)).unwrap();
    let own = ControllerParams {
        safe_roc: 0.0,
        ..ControllerParams::default()
    };
    let mut c = Controller::new(own.clone(), Nanos::ZERO, window.window());
    let spike = RocSample {
        n_prev: 120,
        n_recent: 1_800,
        rate_prev_rps: 40.0,
        rate_recent_rps: 600.0,
        roc: 560.0,
    };
    c.observe(
        SampleAt {
            at: s(10),
            sample: spike,
        },
        |_| {},
    );
    assert_eq!(c.state(), ControllerState::Cut);
    let lower = ControllerParams {
        cut_limit_rps: 30.0,
        ..own.clone()
    };
    let schedule = Schedule::new(own.clone(), vec![(s(12), s(50), lower)]);
    assert_eq!(
        schedule.next_raise(None, &c, s(10), s(10), &window),
        Some(s(71))
    );
    assert_eq!(c.next_raise_at(s(10), window.window()), Some(s(71)));
}

/// A partitioned route's total whose cut found its bucket's note taken is left
/// behind (`BEHIND_AGGREGATE`), decided at its old value meanwhile; a change that
/// lands while it is still behind moves what it is to become; the first decision
/// after the note is free makes the change to the latest value (the total shared by
/// two instances: 150 of the cut's 300), not the cut's. (A raised cut limit did it
/// before; it no longer moves the total, which a cut holds at the fraction of base it
/// was made at: `aggregate.rs`.)
#[test]
fn a_totals_change_left_behind_takes_a_change_landing_meanwhile() {
    let mut cfg = RouteConfig::new("keyed", crate::config::RouteMatch::any());
    cfg.partition = Partition::ClientIp(KeyLimits::default());
    cfg.controller.cut_limit_rps = 60.0;
    cfg.route_limit_rps = Some(1000.0);
    let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let (id, r) = (e.route_at(0).unwrap(), &*e.routes[0].route);
    let capacity = |now| r.aggregate().unwrap().level(now).capacity;
    offer(&e, id, ip(1), 0.0, 10.0, 40.0);
    crate::limiter::gcra::with_the_note_held(|| {
        offer(&e, id, ip(1), 10.0, 11.0, 600.0);
        assert!(e.limit_rps(id).unwrap() < 200.0, "cut");
        assert_ne!(r.behind.load(Ordering::Relaxed) & BEHIND_AGGREGATE, 0);
        assert_eq!(
            capacity(Nanos::from_secs(11)),
            1000.0,
            "decided at 1,000 meanwhile"
        );
        e.set_route_limit_share(2, Nanos::from_secs(11));
        assert_ne!(r.behind.load(Ordering::Relaxed) & BEHIND_AGGREGATE, 0);
    });
    let _ = e.check(id, ip(2), Nanos::from_secs(11));
    assert_eq!(r.behind.load(Ordering::Relaxed) & BEHIND_CHANGES, 0);
    assert_eq!(e.limit_rps(id), Some(60.0));
    assert_eq!(capacity(Nanos::from_secs(11)), 150.0);
    let s = e.route_snapshot(id, Nanos::from_secs(11)).unwrap();
    assert_eq!(s.route_limit.unwrap().limit_rps, 150.0);
}

/// `Retry-After` of a cut told right after a runtime change or a reload that comes
/// after a silence longer than the window: the silence is stepped before the change
/// ([`Engine::bring_up_to`]) and the raise published at the change from the step at
/// its slot, not from the last step before the silence (whose window still held the
/// spike, and whose held projection would tell a raise a window or more late). A
/// spike of 300 in the slot from 2 s cuts at 2.1 s; silence until 5.55 s, where the
/// restore interval goes from 1 s to 0.7 s: told, as the engine raises it, 5.8 s.
#[test]
fn a_change_after_a_silence_tells_the_raise_from_the_step_at_the_change() {
    let ms = Nanos::from_millis;
    let mut cfg = RouteConfig::new("r", crate::config::RouteMatch::any());
    cfg.window = WindowSpec::new(Duration::from_secs(2), Duration::from_millis(100)).unwrap();
    let mut changed = cfg.controller.clone();
    changed.restore_interval = Duration::from_millis(700);
    let cut = || {
        let config = Config::new(vec![cfg.clone()]);
        let e = Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        offer(&e, id, Key::None, 2.0, 2.1, 3_000.0);
        let _ = e.check(id, Key::None, ms(2_150));
        assert_eq!(e.limit_rps(id), Some(60.0));
        e
    };
    let at = ms(5_550);
    // When the route, changed at `at`, tells its limit rises, and when it does.
    let told_and_raised = |e: &Engine| {
        let id = e.route_at(0).unwrap();
        let told = at + e.restore_eta(id, at).unwrap();
        let raised = (56..200)
            .map(|slot| ms(slot * 100))
            .find(|&t| {
                e.catch_up(id, t);
                e.limit_rps(id).unwrap() > 60.0
            })
            .unwrap();
        (told, raised)
    };
    let updated = cut();
    let id = updated.route_at(0).unwrap();
    updated.update_route(id, changed.clone(), at).unwrap();
    assert_eq!(told_and_raised(&updated), (ms(5_800), ms(5_800)));
    let mut reloaded = cfg.clone();
    reloaded.controller = changed;
    let reloaded = cut()
        .reload(&Config::new(vec![reloaded]), at, SystemTime::UNIX_EPOCH)
        .unwrap();
    assert_eq!(told_and_raised(&reloaded), (ms(5_800), ms(5_800)));
}

/// Partitions key alike whatever their tables' bounds, and not across a kind, a
/// header or an IPv6 prefix, each of which names another key for the same request.
#[test]
fn partitions_key_alike_whatever_their_tables_bounds() {
    let limits = KeyLimits::default();
    let bounds = KeyLimits {
        max_keys: 7,
        idle_timeout: Duration::from_secs(1),
        ..limits
    };
    let prefix = KeyLimits {
        ipv6_prefix: 48,
        ..limits
    };
    let header = |name: &str, l| Partition::Header(name.into(), l);
    assert!(same_keys(&Partition::Route, &Partition::Route));
    assert!(same_keys(
        &Partition::ClientIp(limits),
        &Partition::ClientIp(bounds)
    ));
    assert!(same_keys(&header("k", limits), &header("k", bounds)));
    assert!(!same_keys(
        &Partition::ClientIp(limits),
        &Partition::ClientIp(prefix)
    ));
    assert!(!same_keys(&header("k", limits), &header("j", limits)));
    assert!(!same_keys(
        &Partition::ClientIp(limits),
        &header("k", limits)
    ));
    assert!(!same_keys(&Partition::Route, &Partition::ClientIp(limits)));
}

/// [`Engine::route_tuning`] gives the route's algorithm, own parameters and events
/// from one state: after a runtime change, the own parameters are the change's and
/// each event's profile is moved onto them (an event that takes the base limit runs
/// the new one, one that writes its own keeps it), so hints judge no event by the
/// route's old parameters. `GET /admin/hints` read the three under three holds of
/// the lock, and a change landing between them mixed two states.
#[test]
fn route_tuning_is_one_state_of_the_route() {
    let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nburst = \"2s\"\n\
                [[routes.events]]\nname = \"takes\"\nstart = \"2027-11-26T10:00:00Z\"\n\
                duration = \"30m\"\ncut_limit = 150\n\
                [[routes.events]]\nname = \"writes\"\nstart = \"2027-11-26T11:00:00Z\"\n\
                duration = \"30m\"\nbase_limit = 300\ndanger_roc = 80\nsafe_roc = 60\n";
    let config = Config::from_toml_str(toml, "test").unwrap();
    let e = Engine::new(&config, Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let id = e.route_at(0).unwrap();
    let mut changed = e.route_params(id).unwrap();
    (changed.base_limit_rps, changed.danger_roc) = (160.0, 70.0);
    e.update_route(id, changed.clone(), Nanos::from_secs(1))
        .unwrap();
    let t = e.route_tuning(id).unwrap();
    assert_eq!(
        t.algorithm,
        Algorithm::TokenBucket {
            burst: Duration::from_secs(2)
        }
    );
    assert_eq!(t.own, changed);
    let runs: Vec<_> = t
        .events
        .iter()
        .map(|e| {
            let c = &e.controller;
            (
                e.name.as_str(),
                c.base_limit_rps,
                c.cut_limit_rps,
                c.danger_roc,
                c.safe_roc,
            )
        })
        .collect();
    assert_eq!(
        runs,
        [
            ("takes", 160.0, 150.0, 70.0, 20.0),
            ("writes", 300.0, 60.0, 80.0, 60.0)
        ]
    );
    // Each event as its table wrote it, for the hints to tell what it takes.
    let written: Vec<_> = t.events.iter().map(|e| e.sets).collect();
    assert_eq!(
        written,
        [
            config.routes[0].events[0].sets,
            config.routes[0].events[1].sets
        ]
    );
}
