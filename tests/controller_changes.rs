//! The controller under changes: runtime changes and reloads after a silence, a
//! profile changed in the middle of a cut (a runtime change, a scheduled event), the
//! dating of a recovery's end, and the `Retry-After` estimate of a disarmed cut.
//! (Found by a review, helper-120; each failed before its fix.)

use rocgate::clock::Nanos;
use rocgate::config::{Config, Event, RouteConfig, RouteMatch};
use rocgate::controller::{Controller, ControllerParams, ControllerState, Transition};
use rocgate::engine::{Engine, Key, RouteId};
use rocgate::window::{RocSample, SampleAt};
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

/// A completed slot's sample at `at_ms`: half-window rates `prev` and `recent`.
fn sample(at_ms: u64, prev: f64, recent: f64) -> SampleAt {
    SampleAt {
        at: Nanos::from_millis(at_ms),
        sample: RocSample {
            n_prev: (prev * 3.0) as u64,
            n_recent: (recent * 3.0) as u64,
            rate_prev_rps: prev,
            rate_recent_rps: recent,
            roc: recent - prev,
        },
    }
}

/// Steps `c` every 100 ms slot from `from_ms` to `to_ms` (inclusive).
fn run(c: &mut Controller, from_ms: u64, to_ms: u64, prev: f64, recent: f64) -> Vec<Transition> {
    let mut out = Vec::new();
    let mut t = from_ms;
    while t <= to_ms {
        c.observe(sample(t, prev, recent), |tr| out.push(tr));
        t += 100;
    }
    out
}

/// The end of a recovery is dated by the step that reached base as the limit is
/// summed (10 + 30 × 0.7 is 31), not by the quotient (21 / 0.7 is just over 30): it
/// was dated a step after the sample that reached base, and a spike 1.4 s later was
/// not cut (its `min_dwell` counted from that later instant).
#[test]
fn the_end_of_a_recovery_is_not_dated_after_the_sample_that_reached_base() {
    let mut p = ControllerParams::default();
    p.base_limit_rps = 31.0;
    p.cut_limit_rps = 10.0;
    p.restore_step_rps = 0.7;
    p.danger_roc = 8.0;
    p.safe_roc = 2.0;
    p.min_rps = 1.0;
    p.min_samples = 1;
    let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
    run(&mut c, 10_000, 10_000, 4.0, 30.0);
    assert_eq!(c.state(), ControllerState::Cut);
    // Calm from 10.1 s: recovering from 12.1 s, one step a second.
    run(&mut c, 10_100, 12_100, 10.0, 10.0);
    assert_eq!(c.state(), ControllerState::Recovering);
    assert_eq!(c.entered_at(), Nanos::from_millis(12_100));
    let seen = run(&mut c, 12_200, 42_100, 10.0, 10.0);
    assert_eq!(c.limit_rps(), 31.0);
    assert_eq!(c.state(), ControllerState::Normal);
    let normal = seen.last().unwrap();
    assert!(
        normal.at <= Nanos::from_millis(42_100),
        "Normal entered at {} by the sample at 42.100s (in the future)",
        normal.at
    );
    // What it costs: 1.4 s at base (> min_dwell of 1 s) a spike is not cut.
    run(&mut c, 42_200, 43_400, 10.0, 10.0);
    run(&mut c, 43_500, 43_500, 4.0, 30.0);
    assert_eq!(
        c.state(),
        ControllerState::Cut,
        "spike 1.4 s after reaching base"
    );
}

/// A shorter `max_cut` set on a cut long under way restores from the change, one
/// step at a time: it was dated back to when the new `max_cut` would have ended it,
/// and the limit leapt from cut to base in one slot.
#[test]
fn a_shorter_max_cut_mid_cut_does_not_leap_to_base() {
    let mut c = Controller::new(
        ControllerParams::default(),
        Nanos::ZERO,
        Duration::from_secs(6),
    );
    run(&mut c, 10_000, 10_000, 40.0, 600.0);
    run(&mut c, 10_100, 40_000, 100.0, 150.0); // roc 50: neither calm nor danger
    assert_eq!((c.state(), c.limit_rps()), (ControllerState::Cut, 60.0));
    let mut p = ControllerParams::default();
    p.max_cut = Duration::from_secs(10);
    c.set_params(p, Nanos::from_millis(40_050), |_| {});
    run(&mut c, 40_100, 40_100, 100.0, 150.0);
    assert!(
        c.limit_rps() <= 60.0 + 20.0,
        "one slot later: {:?} at {} req/s (entered {})",
        c.state(),
        c.limit_rps(),
        c.entered_at()
    );
}

/// The same through a scheduled event whose profile has a shorter `hold`.
#[test]
fn an_event_with_a_shorter_hold_does_not_leap_a_cut_to_base() {
    let mut cfg = RouteConfig::new("sale", RouteMatch::any());
    cfg.controller.hold = Duration::from_secs(30);
    let mut ev = cfg.controller.clone();
    ev.hold = Duration::from_secs(2);
    cfg.events = vec![Event::new(
        "flash",
        SystemTime::UNIX_EPOCH + Duration::from_secs(30),
        Duration::from_secs(600),
        ev,
    )];
    let e = engine(vec![cfg]);
    let id = e.route_at(0).unwrap();
    offer(&e, id, 0.0, 10.0, 40.0);
    offer(&e, id, 10.0, 11.0, 600.0);
    let mut before = e.limit_rps(id).unwrap();
    assert_eq!(before, 60.0);
    for tenths in 110..400u64 {
        let t = tenths as f64 / 10.0;
        offer(&e, id, t, t + 0.1, 40.0);
        let limit = e.limit_rps(id).unwrap();
        assert!(
            limit <= before + 20.0,
            "at {t:.1} s the limit leapt from {before} to {limit}"
        );
        before = limit;
    }
}

/// `Retry-After` of a cut whose calm began while the controller was disarmed counts
/// the hold from the arming, as the controller does: it said one second early.
#[test]
fn the_next_raise_of_a_disarmed_cut_counts_the_hold_from_the_arming() {
    let window = Duration::from_secs(6);
    let mut c = Controller::new(ControllerParams::default(), Nanos::ZERO, window);
    run(&mut c, 10_000, 10_000, 40.0, 600.0);
    run(&mut c, 10_100, 11_000, 40.0, 600.0); // still climbing: not calm
    c.rearm(Nanos::from_secs(11), window); // a reload: disarmed until 17 s
    run(&mut c, 11_100, 16_000, 100.0, 100.0); // calm from 11.1 s
    let estimate = c.next_raise_at(Nanos::from_secs(16), window).unwrap();
    // When does the limit really first rise?
    let mut t = 16_100;
    while c.limit_rps() == 60.0 && t < 60_000 {
        run(&mut c, t, t, 100.0, 100.0);
        t += 100;
    }
    let actual = Nanos::from_millis(t - 100);
    assert_eq!(
        estimate, actual,
        "estimated at 16 s: {estimate}, first raise: {actual}"
    );
}
