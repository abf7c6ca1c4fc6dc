//! A partitioned route's `route_limit` shared among the instances of a fleet
//! ([`Engine::set_route_limit_share`], which a Redis store sets to its live count), on
//! a virtual clock: each instance holds the total ÷ the count, its burst too; a change
//! of the count is a limit change (tokens clamped, never refilled); a cut scales the
//! share as it scales the total; a reload that keeps the route keeps its share.

use rocgate::clock::Nanos;
use rocgate::config::{KeyLimits, Mode, Partition};
use rocgate::controller::ControllerState;
use rocgate::engine::{Engine, RouteId};
use rocgate::limiter::Algorithm;
use std::time::Duration;

#[path = "common/route_total.rs"]
mod route_total;

use route_total::{calm_then_spike, engine, ip, keyed, reloaded, total};

/// Requests admitted of one each from keys `keys` at `now`, every key far under its
/// own limit: what the total lets through.
fn admitted(e: &Engine, id: RouteId, keys: std::ops::Range<u32>, now: Nanos) -> usize {
    keys.filter(|&k| e.check(id, ip(k), now).is_admit()).count()
}

/// Shared by two, an instance holds half the total and half its burst; by three, a
/// third; the tokens a lower share clamps are gone, and a higher share refills none:
/// only time does, at the share's rate.
#[test]
fn the_share_is_the_total_over_the_instances_and_never_refills() {
    let e = engine(vec![keyed(1000.0, 120.0)]);
    let id = e.route_at(0).unwrap();
    let t = total(&e, id, Nanos::ZERO);
    assert_eq!((t.limit_rps, t.level.capacity), (120.0, 120.0));

    e.set_route_limit_share(2, Nanos::ZERO);
    let t = total(&e, id, Nanos::ZERO);
    assert_eq!(
        (t.configured_rps, t.limit_rps, t.level.capacity),
        (120.0, 60.0, 60.0)
    );
    assert_eq!(t.level.value, 60.0, "the full bucket clamped to the share");
    assert_eq!(admitted(&e, id, 0..200, Nanos::ZERO), 60);

    // A third instance: 40 req/s, and the empty bucket stays empty.
    e.set_route_limit_share(3, Nanos::ZERO);
    let t = total(&e, id, Nanos::ZERO);
    assert_eq!((t.limit_rps, t.level.capacity), (40.0, 40.0));
    assert_eq!(admitted(&e, id, 200..300, Nanos::ZERO), 0);
    // Half a second refills 20 at 40 req/s.
    let half = Nanos::from_millis(500);
    assert_eq!(admitted(&e, id, 300..400, half), 20);

    // One leaves: 60 req/s, and the change gives no token back.
    e.set_route_limit_share(2, half);
    let t = total(&e, id, half);
    assert_eq!((t.limit_rps, t.level.capacity), (60.0, 60.0));
    assert!(t.level.value < 1.0, "refilled by the change: {:?}", t.level);
    assert_eq!(admitted(&e, id, 400..500, half), 0);
    // Two seconds later: refilled at the share's rate, up to the share's burst, 60.
    let later = Nanos::from_millis(2500);
    assert_eq!(admitted(&e, id, 500..700, later), 60);

    // Alone again (or a count below 1, taken as 1): the whole total.
    e.set_route_limit_share(0, later);
    assert_eq!(total(&e, id, later).limit_rps, 120.0);
}

/// A cut scales the share as it scales the total (here 60/200 of 1,000 ÷ 2 is 150
/// req/s), and `shadow_adaptive` enforces the share unscaled.
#[test]
fn a_cut_scales_the_share() {
    let mut cfg = keyed(200.0, 1000.0);
    cfg.controller.cut_limit_rps = 60.0;
    for (mode, in_cut) in [(Mode::Enforce, 150.0), (Mode::ShadowAdaptive, 500.0)] {
        let mut cfg = cfg.clone();
        cfg.mode = mode;
        let e = engine(vec![cfg]);
        let id = e.route_at(0).unwrap();
        e.set_route_limit_share(2, Nanos::ZERO);
        calm_then_spike(&e, id);
        let now = Nanos::from_secs(11);
        let s = e.route_snapshot(id, now).unwrap();
        assert_eq!(s.state, ControllerState::Cut, "{mode:?}");
        let t = s.route_limit.unwrap();
        assert_eq!(
            (t.limit_rps, t.configured_rps),
            (in_cut, 1000.0),
            "{mode:?}"
        );
        // Four instances during the cut: half the share of two.
        e.set_route_limit_share(4, now);
        assert_eq!(total(&e, id, now).limit_rps, in_cut / 2.0, "{mode:?}");
    }
}

/// A reload that keeps the route keeps its share (and a new value of the total is
/// shared the same way); a route the reload builds anew holds the whole total until
/// its share is set.
#[test]
fn a_reload_keeps_the_share_of_a_kept_route() {
    let e = engine(vec![keyed(1000.0, 100.0)]);
    let id = e.route_at(0).unwrap();
    e.set_route_limit_share(4, Nanos::ZERO);
    assert_eq!(total(&e, id, Nanos::ZERO).limit_rps, 25.0);
    let now = Nanos::from_millis(100);
    let (e2, id2) = reloaded(&e, keyed(1000.0, 200.0), now);
    assert_eq!(id2, id, "the route is kept");
    let t = total(&e2, id2, now);
    assert_eq!((t.configured_rps, t.limit_rps), (200.0, 50.0));

    let mut rebuilt = keyed(1000.0, 200.0);
    rebuilt.partition = Partition::Header("x-api-key".into(), KeyLimits::default());
    let (e3, id3) = reloaded(&e2, rebuilt, now);
    assert_ne!(id3, id2, "a new partition rebuilds the route");
    assert_eq!(total(&e3, id3, now).limit_rps, 200.0);
    e3.set_route_limit_share(4, now);
    assert_eq!(total(&e3, id3, now).limit_rps, 50.0);
}

/// A share changed after a silence takes effect when it is set, not at the restore
/// steps the silence held: those are stepped first, at the share in force during them
/// (as a reload or a runtime change steps the silence before it), so that a raise
/// refills nothing before it was made. Two instances of one history (a cut, then
/// silence through two restore steps, burst 10 s so the drained total is still
/// refilling): the one brought up to the change first and the one changed outright
/// hold the same tokens.
#[test]
fn a_share_change_after_a_silence_is_made_when_set() {
    let mut cfg = keyed(200.0, 100.0);
    cfg.controller.cut_limit_rps = 60.0;
    cfg.controller.max_cut = Duration::from_secs(2);
    cfg.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(10),
    };
    let cut = || {
        let e = engine(vec![cfg.clone()]);
        let id = e.route_at(0).unwrap();
        e.set_route_limit_share(2, Nanos::ZERO);
        // The spike drains the total.
        calm_then_spike(&e, id);
        (e, id)
    };
    let change = Nanos::from_secs(15);
    let (stepped, id) = cut();
    stepped.catch_up(id, change);
    let s = stepped.route_snapshot(id, change).unwrap();
    assert_eq!(
        s.state,
        ControllerState::Recovering,
        "restore steps in the silence"
    );
    assert!(s.limit_rps > 60.0, "{}", s.limit_rps);
    let t = s.route_limit.unwrap();
    assert!(
        t.level.value < t.level.capacity,
        "still refilling: {:?}",
        t.level
    );
    stepped.set_route_limit_share(1, change);
    let (outright, id2) = cut();
    outright.set_route_limit_share(1, change);
    let (a, b) = (total(&stepped, id, change), total(&outright, id2, change));
    assert_eq!(a.limit_rps, b.limit_rps);
    assert_eq!(
        a.level, b.level,
        "the silence's steps were made at the share set after them"
    );
}
