//! The controller under changes, through the engine: runtime changes and reloads after
//! a silence, and scheduled events that shorten a cut's hold or change a restore's step. (Found by a review,
//! helper-120, with the controller's own cases in `src/controller.rs`; each failed
//! before its fix.)

use rocgate::clock::Nanos;
use rocgate::config::{Config, Event, RouteConfig, RouteMatch};
use rocgate::controller::{ControllerParams, ControllerState};
use rocgate::engine::{Engine, Key, RouteId, SlotReport};
use rocgate::window::RocMode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime};

fn engine(routes: Vec<RouteConfig>) -> Engine {
    Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// Offers `rate` req/s evenly from `from` to `to` (seconds).
fn offer(e: &Engine, id: RouteId, from: f64, to: f64, rate: f64) {
    let n = ((to - from) * rate).round() as u64;
    for k in 0..n {
        let _ = e.check(id, Key::None, Nanos::from_secs_f64(from + k as f64 / rate));
    }
}

/// The route after a cut at about 10 s, a silence from 11 s, `change` made at 30 s,
/// and one request at 40 s; with `upkeep`, stepped every slot in between as well.
fn after_a_change_in_a_silence(
    upkeep: bool,
    change: impl Fn(Engine, Nanos) -> Engine,
) -> rocgate::engine::RouteSnapshot {
    let e = engine(vec![RouteConfig::new("r", RouteMatch::any())]);
    let id = e.route_at(0).unwrap();
    offer(&e, id, 0.0, 10.0, 40.0);
    offer(&e, id, 10.0, 11.0, 600.0);
    let step = |e: &Engine, from_ms: u64, to_ms: u64| {
        if upkeep {
            for ms in (from_ms..to_ms).step_by(100) {
                e.catch_up(e.route_at(0).unwrap(), Nanos::from_millis(ms));
            }
        }
    };
    step(&e, 11_100, 30_000);
    let e = change(e, Nanos::from_secs(30));
    step(&e, 30_100, 40_000);
    let (id, end) = (e.route_at(0).unwrap(), Nanos::from_secs(40));
    let _ = e.check(id, Key::None, end);
    e.route_snapshot(id, end).unwrap()
}

/// A runtime change late in a silence after a cut: the silence is stepped under the
/// parameters in force during it before the change applies, so one request at 40 s
/// finds the route where stepping every slot put it (it found it still recovering:
/// the silence's samples were dated before the change's rearm, and read as nothing).
#[test]
fn a_put_late_in_a_silence_lands_where_stepping_every_slot_would() {
    let put = |e: Engine, at| {
        let id = e.route_at(0).unwrap();
        let mut p = e.route_params(id).unwrap();
        p.danger_roc = 90.0;
        e.update_route(id, p, at).unwrap();
        e
    };
    let stepped = after_a_change_in_a_silence(true, put);
    let jumped = after_a_change_in_a_silence(false, put);
    assert_eq!(stepped.state, ControllerState::Normal);
    assert_eq!(
        (jumped.state, jumped.limit_rps),
        (stepped.state, stepped.limit_rps)
    );
}

/// As above, for a reload.
#[test]
fn a_reload_late_in_a_silence_lands_where_stepping_every_slot_would() {
    let reload = |e: Engine, at| {
        let mut cfg = RouteConfig::new("r", RouteMatch::any());
        cfg.controller.danger_roc = 90.0;
        e.reload(&Config::new(vec![cfg]), at, SystemTime::UNIX_EPOCH)
            .unwrap()
    };
    let stepped = after_a_change_in_a_silence(true, reload);
    let jumped = after_a_change_in_a_silence(false, reload);
    assert_eq!(stepped.state, ControllerState::Normal);
    assert_eq!(
        (jumped.state, jumped.limit_rps),
        (stepped.state, stepped.limit_rps)
    );
}

/// The limit every 100 ms from 11 s to 40 s of a route cut at about 10 s (40 req/s,
/// 600 for one second, 40 again), its own parameters set by `own`, with an event
/// from `start` for `secs` seconds whose profile `profile` sets over them. The limit
/// starts at the cut, 60.
fn limits_with_event(
    own: impl FnOnce(&mut ControllerParams),
    profile: impl FnOnce(&mut ControllerParams),
    (start, secs): (u64, u64),
) -> Vec<(u64, f64)> {
    let mut cfg = RouteConfig::new("sale", RouteMatch::any());
    own(&mut cfg.controller);
    let mut ev = cfg.controller.clone();
    profile(&mut ev);
    cfg.events = vec![Event::new(
        "event",
        SystemTime::UNIX_EPOCH + Duration::from_secs(start),
        Duration::from_secs(secs),
        ev,
    )];
    let e = engine(vec![cfg]);
    let id = e.route_at(0).unwrap();
    offer(&e, id, 0.0, 10.0, 40.0);
    offer(&e, id, 10.0, 11.0, 600.0);
    assert_eq!(e.limit_rps(id).unwrap(), 60.0);
    (110..400u64)
        .map(|tenths| {
            let t = tenths as f64 / 10.0;
            offer(&e, id, t, t + 0.1, 40.0);
            (tenths, e.limit_rps(id).unwrap())
        })
        .collect()
}

/// The same through a scheduled event whose profile has a shorter `hold`.
#[test]
fn an_event_with_a_shorter_hold_does_not_leap_a_cut_to_base() {
    let limits = limits_with_event(
        |own| own.hold = Duration::from_secs(30),
        |event| event.hold = Duration::from_secs(2),
        (30, 600),
    );
    let mut before = 60.0;
    for (tenths, limit) in limits {
        assert!(
            limit <= before + 20.0,
            "at {tenths} tenths of a second the limit leapt from {before} to {limit}"
        );
        before = limit;
    }
}

/// A scheduled event that slows the restore (a smaller `restore_step`) starting in a
/// recovery, and ending in it: the limit never falls and rises one step at a time
/// (the steps taken were recomputed under each profile's step from the recovery's
/// start: the limit fell when the event started and leapt when it ended).
#[test]
fn an_event_changing_the_restore_step_mid_recovery_goes_on_from_the_limit() {
    let seen = limits_with_event(|_| {}, |event| event.restore_step_rps = 5.0, (18, 4));
    let mut before = 60.0;
    for &(tenths, limit) in &seen {
        assert!(
            before <= limit && limit <= before + 20.0,
            "at {tenths} tenths of a second the limit went from {before} to {limit}"
        );
        before = limit;
    }
    let at = |tenths| seen.iter().find(|s| s.0 == tenths).unwrap().1;
    assert!(at(175) > 60.0, "recovering before the event: {seen:?}");
    assert!(at(219) - at(181) <= 20.0, "5 a step in the event: {seen:?}");
    assert_eq!(before, 200.0, "back at base: {seen:?}");
}

/// An event that starts in a silence longer than the window, with a slower restore:
/// one request after the silence finds the route where stepping every slot put it
/// (the event was applied at that request, 10 s late, to the limit of the last slot
/// replayed: 63 req/s against 98). (helper-124)
#[test]
fn an_event_in_a_long_silence_lands_where_stepping_every_slot_would() {
    let run = |upkeep: bool| {
        let mut cfg = RouteConfig::new("r", RouteMatch::any());
        cfg.controller.restore_step_rps = 2.0;
        let mut ev = cfg.controller.clone();
        ev.restore_step_rps = 1.0;
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(30);
        cfg.events = vec![Event::new("slow", start, Duration::from_secs(600), ev)];
        let e = engine(vec![cfg]);
        let id = e.route_at(0).unwrap();
        offer(&e, id, 0.0, 10.0, 40.0);
        offer(&e, id, 10.0, 11.0, 600.0);
        if upkeep {
            for ms in (11_100..40_000).step_by(100) {
                e.catch_up(id, Nanos::from_millis(ms));
            }
        }
        let end = Nanos::from_secs(40);
        let _ = e.check(id, Key::None, end);
        let s = e.route_snapshot(id, end).unwrap();
        (s.state, s.limit_rps)
    };
    let stepped = run(true);
    assert_eq!(stepped.0, ControllerState::Recovering);
    assert_eq!(run(false), stepped);
}

/// An engine of one route after a cut at about 10 s and a silence from 11 s, and a
/// `hold` that makes its sample hook hold the route's state at the next slot until
/// the test lets it go (see [`while_the_route_is_held`]).
fn cut_then_silent_with_a_holding_hook() -> (Engine, RouteId, Holder) {
    let hold = Arc::new(AtomicBool::new(false));
    let (held_tx, held) = mpsc::sync_channel(1);
    let (release, release_rx) = mpsc::sync_channel::<()>(1);
    let release_rx = Mutex::new(release_rx);
    let holding = Arc::clone(&hold);
    let e = engine(vec![RouteConfig::new("r", RouteMatch::any())]).with_sample_hook(Arc::new(
        move |_: &str, _: &SlotReport| {
            if holding.swap(false, Ordering::SeqCst) {
                held_tx.send(()).unwrap();
                release_rx.lock().unwrap().recv().unwrap();
            }
        },
    ));
    let id = e.route_at(0).unwrap();
    offer(&e, id, 0.0, 10.0, 40.0);
    offer(&e, id, 10.0, 11.0, 600.0);
    (
        e,
        id,
        Holder {
            hold,
            held,
            release,
        },
    )
}

/// What holds a route's state through its sample hook.
struct Holder {
    hold: Arc<AtomicBool>,
    held: mpsc::Receiver<()>,
    release: mpsc::SyncSender<()>,
}

/// Runs `call` on another thread while the route's state is held by a roll to
/// 11.1 s (whose sample hook waits: a reader such as a snapshot holds it alike), then
/// lets the holder go, and waits for both.
fn while_the_route_is_held(e: &Engine, id: RouteId, holder: Holder, call: impl FnOnce() + Send) {
    holder.hold.store(true, Ordering::SeqCst);
    std::thread::scope(|s| {
        let rolling = s.spawn(|| e.catch_up(id, Nanos::from_millis(11_100)));
        holder.held.recv().unwrap();
        let caller = s.spawn(call);
        // Long enough for the caller to reach the route's state; if it has not, the
        // run is as if nothing held it. What is asserted is the route's state, never
        // a time.
        #[allow(clippy::disallowed_methods)] // a real thread must reach a real lock
        std::thread::sleep(Duration::from_millis(50));
        holder.release.send(()).unwrap();
        rolling.join().unwrap();
        caller.join().unwrap();
    });
}

/// A reload made while something else holds the route's state (a snapshot for
/// `/metrics` or `GET /admin/routes`) still steps the silence before it under the
/// parameters in force during it. (It left the roll to the holder, which rolled to its
/// own time only: the silence was replayed after the change's rearm, read as nothing,
/// and the route stayed recovering at 100 req/s where it should have been back at 200.)
#[test]
fn a_reload_while_the_route_is_held_still_steps_the_silence_first() {
    let (e, id, holder) = cut_then_silent_with_a_holding_hook();
    let mut cfg = RouteConfig::new("r", RouteMatch::any());
    cfg.controller.danger_roc = 90.0;
    let mut reloaded = None;
    while_the_route_is_held(&e, id, holder, || {
        let config = Config::new(vec![cfg]);
        reloaded = Some(
            e.reload(&config, Nanos::from_secs(30), SystemTime::UNIX_EPOCH)
                .unwrap(),
        );
    });
    let e = reloaded.unwrap();
    let (id, end) = (e.route_at(0).unwrap(), Nanos::from_secs(40));
    let _ = e.check(id, Key::None, end);
    let s = e.route_snapshot(id, end).unwrap();
    assert_eq!((s.state, s.limit_rps), (ControllerState::Normal, 200.0));
}

/// Upkeep while something else holds the route's state still brings the route up to
/// now: a cut that the silence outlasted does not read as a cut in the snapshot taken
/// next. (It left the roll to the holder, which rolled to its own time only.)
#[test]
fn a_catch_up_while_the_route_is_held_still_ends_an_outlasted_cut() {
    let (e, id, holder) = cut_then_silent_with_a_holding_hook();
    let end = Nanos::from_secs(40);
    while_the_route_is_held(&e, id, holder, || e.catch_up(id, end));
    let s = e.route_snapshot(id, end).unwrap();
    assert_eq!((s.state, s.limit_rps), (ControllerState::Normal, 200.0));
}

/// After a change of `roc_mode`, the ROC a snapshot shows beside the new thresholds is
/// the last reading in the new mode. (It was the old mode's until the next slot: an
/// absolute 30 beside a relative danger of 1, where the reading is 0.75.)
#[test]
fn a_change_of_roc_mode_shows_the_last_roc_in_the_new_mode() {
    let e = engine(vec![RouteConfig::new("r", RouteMatch::any())]);
    let id = e.route_at(0).unwrap();
    offer(&e, id, 0.0, 7.0, 40.0);
    offer(&e, id, 7.0, 10.0, 70.0);
    let _ = e.check(id, Key::None, Nanos::from_secs(10));
    let before = e.route_snapshot(id, Nanos::from_secs(10)).unwrap();
    assert!((before.roc - 30.0).abs() < 1.0, "{}", before.roc);
    let mut p = e.route_params(id).unwrap();
    p.roc_mode = RocMode::Relative;
    p.danger_roc = 1.0;
    p.safe_roc = 0.25;
    e.update_route(id, p, Nanos::from_secs(10)).unwrap();
    let s = e.route_snapshot(id, Nanos::from_secs(10)).unwrap();
    assert_eq!(s.roc_mode, RocMode::Relative);
    let relative = s.sample.roc_in(RocMode::Relative, s.min_rps);
    assert!((relative - 0.75).abs() < 0.05, "{relative}");
    assert!(
        (s.roc - relative).abs() < 1e-9,
        "{} beside {relative}",
        s.roc
    );
}

/// A route restoring at 60 req/s (cut at about 10 s, calm from 11 s, restoring from
/// 15.4 s in steps of 20 a second), stepped every slot up to 16.4 s, where its first
/// step took it to 80.
fn restored_one_step_at_16_4() -> (Engine, RouteId) {
    let e = engine(vec![RouteConfig::new("r", RouteMatch::any())]);
    let id = e.route_at(0).unwrap();
    offer(&e, id, 0.0, 10.0, 40.0);
    offer(&e, id, 10.0, 11.0, 600.0);
    for ms in (11_000..=16_400u64).step_by(100) {
        e.catch_up(id, Nanos::from_millis(ms));
    }
    assert_eq!(e.limit_rps(id).unwrap(), 80.0);
    (e, id)
}

/// A change dated just before the slot a request has already stepped the controller
/// through (the admin thread read the clock at 16.35 s, a request at 16.4 s took the
/// route's state first and stepped the restore to 80): the controller has seen 16.4 s,
/// so the change is made as of then. Dated 16.35 s, it took the restore back a step,
/// to 60, and one that changed the step went on from there (70, not 90, at 17.4 s).
#[test]
fn a_change_dated_before_the_last_slot_stepped_keeps_the_restore_where_it_is() {
    let (e, id) = restored_one_step_at_16_4();
    let mut p = e.route_params(id).unwrap();
    p.min_rps = 11.0;
    e.update_route(id, p, Nanos::from_millis(16_350)).unwrap();
    assert_eq!(e.limit_rps(id).unwrap(), 80.0);

    let (e, id) = restored_one_step_at_16_4();
    let mut p = e.route_params(id).unwrap();
    p.restore_step_rps = 10.0;
    e.update_route(id, p, Nanos::from_millis(16_350)).unwrap();
    assert_eq!(e.limit_rps(id).unwrap(), 80.0);
    e.catch_up(id, Nanos::from_millis(17_300));
    assert_eq!(e.limit_rps(id).unwrap(), 80.0);
    e.catch_up(id, Nanos::from_millis(17_400));
    assert_eq!(e.limit_rps(id).unwrap(), 90.0);

    let (e, _) = restored_one_step_at_16_4();
    let mut cfg = RouteConfig::new("r", RouteMatch::any());
    cfg.controller.min_rps = 11.0;
    let e = e
        .reload(
            &Config::new(vec![cfg]),
            Nanos::from_millis(16_350),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
    assert_eq!(e.limit_rps(e.route_at(0).unwrap()).unwrap(), 80.0);
}

/// A route whose requests a shared store decides ([`Engine::record`] counts them): its
/// controller here does not step, the store's does. A runtime change or a reload
/// after a spike this instance saw and a slot's silence brought the window up to date
/// and stepped the local controller through it too, which cut, and which nothing
/// stepped again: the route's counts held a cut the shared controller never made,
/// its time in cut growing for good (`rocgate_cut_seconds_total`).
#[test]
fn a_change_to_a_route_decided_elsewhere_does_not_step_its_controller_here() {
    for reload in [false, true] {
        let e = engine(vec![RouteConfig::new("r", RouteMatch::any())]);
        let id = e.route_at(0).unwrap();
        for k in 0..400u64 {
            e.record(id, None, Nanos::from_millis(k * 25));
        }
        for k in 0..600u64 {
            e.record(id, None, Nanos::from_millis(10_000 + k * 5 / 3));
        }
        let at = Nanos::from_millis(11_500);
        let e = if reload {
            let mut cfg = RouteConfig::new("r", RouteMatch::any());
            cfg.controller.danger_roc = 85.0;
            e.reload(&Config::new(vec![cfg]), at, SystemTime::UNIX_EPOCH)
                .unwrap()
        } else {
            let mut p = e.route_params(id).unwrap();
            p.danger_roc = 85.0;
            e.update_route(id, p, at).unwrap();
            e
        };
        let id = e.route_at(0).unwrap();
        let s = e.route_snapshot(id, at).unwrap();
        assert_eq!(
            (s.state, s.cuts),
            (ControllerState::Normal, 0),
            "reload {reload}"
        );
        assert_eq!(
            s.offered, 1000,
            "the window still counts what the store decided"
        );
    }
}

/// A route cut here that a reload rebuilds (here a new window) into one a shared store
/// decides (its requests counted by [`Engine::record`] from the reload on): the cut
/// carried into it is never stepped here again, the store's controller deciding, and
/// its time is not counted on while the store decides. It grew for good: 89 s of cut
/// at 100 s, in `rocgate_cut_seconds_total` (to which the store's own time is added).
#[test]
fn a_cut_carried_into_a_route_decided_elsewhere_stops_counting_time_in_cut() {
    let cfg = RouteConfig::new("r", RouteMatch::any());
    let e = engine(vec![cfg.clone()]);
    let id = e.route_at(0).unwrap();
    offer(&e, id, 0.0, 10.0, 40.0);
    offer(&e, id, 10.0, 11.0, 600.0);
    let at = Nanos::from_secs(11);
    assert_eq!(
        e.route_snapshot(id, at).unwrap().state,
        ControllerState::Cut
    );
    let mut rebuilt = cfg;
    rebuilt.window =
        rocgate::window::WindowSpec::new(Duration::from_secs(4), Duration::from_millis(100))
            .unwrap();
    let e = e
        .reload(&Config::new(vec![rebuilt]), at, SystemTime::UNIX_EPOCH)
        .unwrap();
    let id = e.route_at(0).unwrap();
    for k in 0..(89 * 40u64) {
        e.record(id, None, Nanos::from_millis(11_000 + k * 25));
    }
    let s = e.route_snapshot(id, Nanos::from_secs(100)).unwrap();
    assert_eq!(s.time_in_cut, Duration::ZERO);
    assert_eq!(s.offered, 89 * 40);
}
