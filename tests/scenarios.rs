//! Scenario tests: the real engine driven by the simulator on the virtual clock, on
//! the `order` route of the shipped `config/examples/flash-sale.toml` (window 6 s of
//! 100 ms slots, base 200, cut 60, danger 80, safe 20, step 20 every 1 s after a 2 s
//! hold, min_rps 10, min_samples 20, min_dwell 1 s, max_cut 60 s; token bucket holding
//! 1 s of the limit).

use rocgate::clock::Nanos;
use rocgate::config::{Config, Event, Mode, Partition, RouteConfig};
use rocgate::controller::{ControllerParams, ControllerState};
use rocgate::limiter::{Algorithm, TokenBucket};
use rocgate::sim::{
    ArrivalModel, Profile, Scenario, SimError, SimResult, Simulator, Summary, TransitionRecord,
};
use rocgate::window::WindowSpec;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// The step of the flash-sale scenario: 40 → 600 req/s at t = 20 s, a slot boundary
/// well after the first full window.
const STEP_S: f64 = 20.0;
/// The spike holds at 600 req/s until t = 40 s.
const SPIKE_END_S: f64 = 40.0;
/// Seeds for the Poisson runs.
const SEEDS: [u64; 5] = [0, 1, 2, 3, 4];
/// Float slack for times that are whole numbers of slots.
const EPS: f64 = 1e-9;

/// The `order` route of `config/examples/flash-sale.toml`, as `rocgate` loads it.
fn order() -> RouteConfig {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/config/examples/flash-sale.toml"
    );
    let config = Config::load(Path::new(path)).unwrap_or_else(|e| panic!("{e}"));
    let order = config.routes.into_iter().find(|r| r.name == "order");
    order.expect("flash-sale.toml has an `order` route")
}

/// The `order` route's controller parameters.
fn params() -> ControllerParams {
    order().controller
}

/// The `order` route with other controller parameters.
fn route(controller: ControllerParams) -> RouteConfig {
    let mut v = order();
    v.controller = controller;
    v
}

#[test]
fn the_flash_sale_file_has_the_classic_values() {
    let r = order();
    assert_eq!(r.window, WindowSpec::default());
    assert_eq!(r.window.window(), Duration::from_secs(6));
    let p = &r.controller;
    let values = (p.base_limit_rps, p.cut_limit_rps, p.danger_roc, p.safe_roc);
    assert_eq!(values, (200.0, 60.0, 80.0, 20.0));
    assert_eq!(p.restore_step_rps, 20.0);
    assert_eq!(r.algorithm, Algorithm::default());
    assert_eq!((r.mode, &r.partition), (Mode::Enforce, &Partition::Route));
}

fn simulator(route: RouteConfig) -> Simulator {
    Simulator::new(Config::new(vec![route]), Some("order")).unwrap()
}

fn flash_sale(model: ArrivalModel) -> SimResult {
    simulator(route(params()))
        .run_profile(&Scenario::FlashSale.profile(), model)
        .unwrap()
}

/// Uniform arrivals, then Poisson arrivals for each seed.
fn models() -> impl Iterator<Item = ArrivalModel> {
    std::iter::once(ArrivalModel::Uniform)
        .chain(SEEDS.into_iter().map(|seed| ArrivalModel::Poisson { seed }))
}

fn first(s: &Summary, to: ControllerState) -> Option<&TransitionRecord> {
    s.transitions.iter().find(|t| t.to == to)
}

#[test]
fn a_step_from_40_to_600_is_cut_within_0_6_s() {
    for model in models() {
        let r = flash_sale(model);
        let s = &r.summary;
        let cut = s.cuts.first().unwrap_or_else(|| panic!("{model}: no cut"));
        assert_eq!(
            s.transitions[0], *cut,
            "{model}: the cut is the first transition"
        );
        assert_eq!(cut.from, ControllerState::Normal);
        assert!(cut.roc > 80.0, "{model}: {cut:?}");
        assert!(
            cut.t_s > STEP_S && cut.t_s <= STEP_S + 0.6 + EPS,
            "{model}: cut at {} s, step at {STEP_S} s",
            cut.t_s
        );
        // From the cut on, the route runs at the cut limit and rejects as `roc_cut`.
        let cut_row = r
            .series
            .iter()
            .find(|row| row.t_s >= cut.t_s - EPS)
            .unwrap();
        assert_eq!(cut_row.state, ControllerState::Cut);
        assert_eq!(cut_row.limit_rps, 60.0);
        assert!(cut_row.rejected.roc_cut > 0, "{model}: {cut_row:?}");
        assert!(s.rejected_by_reason.roc_cut > 0);
    }
    // Uniform arrivals: ROC rises by (60 − 4) / 3 req/s per slot after the step, and
    // passes 80 after the 5th slot.
    assert_eq!(
        flash_sale(ArrivalModel::Uniform).summary.first_cut_s,
        Some(20.5)
    );
}

#[test]
fn the_limit_is_back_at_base_while_the_spike_holds() {
    // window + hold + (base − cut) / step × restore_interval + 1 s = 6 + 2 + 7 + 1.
    let bound_s = 16.0;
    let r = flash_sale(ArrivalModel::Uniform);
    let s = &r.summary;
    let normal = first(s, ControllerState::Normal).expect("restored");
    assert!(
        normal.t_s <= STEP_S + bound_s + EPS && normal.t_s < SPIKE_END_S,
        "back at base at {} s",
        normal.t_s
    );
    assert_eq!(normal.limit_rps, 200.0);
    // Calm from 25.9 s (ROC < 20 once the earlier half-window holds > 580 req/s), a
    // 2 s hold, then 7 steps of 1 s.
    let recovering = first(s, ControllerState::Recovering).unwrap();
    assert!((recovering.t_s - 27.9).abs() < EPS, "{recovering:?}");
    assert!((normal.t_s - 34.9).abs() < EPS, "{normal:?}");
    // The limit climbs 60, 80, …, 200, one step per restore_interval, never faster.
    let mut steps: Vec<(f64, f64)> = Vec::new();
    for row in r
        .series
        .iter()
        .filter(|row| row.t_s >= recovering.t_s - EPS)
    {
        if steps
            .last()
            .is_none_or(|&(_, limit)| limit != row.limit_rps)
        {
            steps.push((row.t_s, row.limit_rps));
        }
        if row.state == ControllerState::Normal {
            break;
        }
    }
    let limits: Vec<f64> = steps.iter().map(|&(_, l)| l).collect();
    assert_eq!(
        limits,
        [60.0, 80.0, 100.0, 120.0, 140.0, 160.0, 180.0, 200.0]
    );
    for w in steps.windows(2) {
        assert!((w[1].0 - w[0].0 - 1.0).abs() < EPS, "steps {steps:?}");
    }

    // Poisson: the noise of ROC at 600 req/s is √(2 × 1800) / 3 ≈ 20 req/s, as large
    // as safe_roc, so "below safe for 2 s in a row" restarts by chance and the restore
    // time is a random variable: over 200 seeds, 14.6 s to 24.6 s after the step (median
    // 15.0, p95 19.1, 35% beyond the 16 s bound, one seed cut again by a noise peak
    // of ROC 84). The 16 s bound holds for uniform arrivals only; here the fixed seeds
    // (restored at 18.2, 15.0, 16.9, 16.9, 15.0 s) are held to "back at base before the
    // spike ends".
    for seed in SEEDS {
        let r = flash_sale(ArrivalModel::Poisson { seed });
        let normal = first(&r.summary, ControllerState::Normal).expect("restored");
        assert!(
            normal.t_s < SPIKE_END_S,
            "seed {seed}: back at base at {} s",
            normal.t_s
        );
    }
}

#[test]
fn a_warmup_ramp_never_cuts() {
    let sim = simulator(route(params()));
    for scenario in [Scenario::Warmup, Scenario::Steady] {
        for model in models() {
            let r = sim.run_profile(&scenario.profile(), model).unwrap();
            let s = &r.summary;
            assert!(
                s.transitions.is_empty(),
                "{} {model}: {:?}",
                scenario.name(),
                s.transitions
            );
            assert_eq!(s.rejected, 0);
            assert_eq!(s.admitted, s.offered);
            assert!(r
                .series
                .iter()
                .all(|row| row.state == ControllerState::Normal));
        }
    }
}

#[test]
fn a_quiet_route_never_cuts_even_past_danger() {
    // 1 → 8 req/s: ROC 7 passes danger 2, but 8 req/s is below min_rps 10.
    let quiet = {
        let mut v = params();
        v.danger_roc = 2.0;
        v.safe_roc = 1.0;
        v
    };
    let profile = Profile::parse_csv("t_seconds,rate\n0,1\n20,1\n20,8\n60,8\n").unwrap();
    let r = simulator(route(quiet.clone()))
        .run_profile(&profile, ArrivalModel::Uniform)
        .unwrap();
    assert!(
        r.summary.transitions.is_empty(),
        "{:?}",
        r.summary.transitions
    );
    let peak_roc = r.series.iter().map(|row| row.roc).fold(f64::MIN, f64::max);
    assert!(peak_roc > 6.0, "ROC did pass danger: {peak_roc}");
    // The guard is what holds it: the same traffic with min_rps 1 is cut.
    let guarded_off = {
        let mut v = quiet;
        v.min_rps = 1.0;
        v
    };
    let r = simulator(route(guarded_off))
        .run_profile(&profile, ArrivalModel::Uniform)
        .unwrap();
    let cut = r
        .summary
        .first_cut_s
        .expect("cut without the min_rps guard");
    assert!(cut > STEP_S, "{cut}");
    // Poisson arrivals are not asserted here: at 8 req/s a 3 s half-window holds 24 ± 5
    // arrivals, so the measured rate passes 10 req/s by chance and a cut is then right.
}

#[test]
fn traffic_back_after_a_silence_is_cut_as_a_spike_of_its_rate() {
    // As the README has it: after an hour of silence the earlier half-window holds
    // zeros, so a shop opening at a steady rate reads a ROC of that whole rate.
    let opening = |rate: u32, controller: ControllerParams| {
        let csv = format!("t_seconds,rate\n0,0\n3600,0\n3600,{rate}\n3660,{rate}\n");
        simulator(route(controller))
            .run_profile(&Profile::parse_csv(&csv).unwrap(), ArrivalModel::Uniform)
            .unwrap()
            .summary
    };
    // 100 req/s: ROC climbs 10/3 req/s a slot and passes danger 80 after 25 slots.
    let s = opening(100, params());
    assert_eq!(s.cuts.len(), 1, "{:?}", s.transitions);
    let cut = s.first_cut_s.unwrap();
    assert!((cut - 3602.5).abs() < EPS, "cut at {cut} s");
    // 70 req/s never reads more than 70: no cut.
    let s = opening(70, params());
    assert!(s.transitions.is_empty(), "{:?}", s.transitions);
    // Relative mode: the earlier half counts as min_rps (10), so 20 req/s is a
    // doubling once the later half reads more than 10 req/s (30 arrivals): after
    // 16 slots of 2.
    let relative = {
        let mut v = params();
        v.roc_mode = rocgate::window::RocMode::Relative;
        v.danger_roc = 1.0;
        v.safe_roc = 0.25;
        v
    };
    let s = opening(20, relative);
    let cut = s.first_cut_s.expect("relative mode cuts the opening");
    assert!((cut - 3601.6).abs() < EPS, "cut at {cut} s");
}

#[test]
fn same_seed_same_result() {
    let sim = simulator(route(params()));
    for scenario in Scenario::ALL {
        let profile = scenario.profile();
        let model = ArrivalModel::Poisson { seed: 42 };
        let a = sim.run_profile(&profile, model).unwrap();
        let b = sim.run_profile(&profile, model).unwrap();
        assert_eq!(a, b, "{}", scenario.name());
        let other = sim
            .run_profile(&profile, ArrivalModel::Poisson { seed: 43 })
            .unwrap();
        assert_ne!(a.series, other.series, "{}", scenario.name());
    }
    assert_eq!(
        flash_sale(ArrivalModel::Uniform),
        flash_sale(ArrivalModel::Uniform)
    );
}

/// A run gives the same result while another thread changes the limits of token
/// buckets of its own all along (as a sweep's other points or another simulation
/// do): a bucket's change that met another thread's on the note they shared was put
/// off, and the same seed gave another result (CI once saw a double-spike bucket level
/// of 172.99 against 172.74).
#[test]
fn a_run_beside_limit_changes_on_another_thread_gives_the_same_result() {
    let sim = simulator(route(params()));
    let profile = Scenario::DoubleSpike.profile();
    let model = ArrivalModel::Poisson { seed: 42 };
    let alone = sim.run_profile(&profile, model).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let started = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let buckets: Vec<TokenBucket> = (0..512)
                .map(|_| TokenBucket::new(100.0, Duration::from_secs(1), Nanos::ZERO))
                .collect();
            let mut limit = 100.0;
            started.wait();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                limit = 300.0 - limit;
                for b in &buckets {
                    b.set_limit(limit, Nanos::ZERO);
                }
            }
        });
        started.wait();
        let runs: Vec<_> = (0..100)
            .map(|_| sim.run_profile(&profile, model).unwrap())
            .collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for (i, run) in runs.iter().enumerate() {
            assert!(*run == alone, "run {i} differs from the run alone");
        }
    });
}

#[test]
fn admitted_per_second_stays_within_the_bucket_bound() {
    let p = params();
    // A token bucket holding 1 s of the limit admits at most capacity + 1 s of refill
    // in any second: 200 + 200 at base; 60 + 60 while cut, the bucket having been
    // clamped to the cut capacity rather than refilled.
    let base_bound = 2 * p.base_limit_rps as u64;
    let cut_bound = 2 * p.cut_limit_rps as u64;
    let sim = simulator(route(p));
    for scenario in Scenario::ALL {
        for model in models() {
            let r = sim.run_profile(&scenario.profile(), model).unwrap();
            let what = format!("{} {model}", scenario.name());
            let peak = r.summary.peak_admitted_1s;
            assert!(peak <= base_bound, "{what}: {peak} admitted in 1 s");
            let mut seconds_in_cut = 0;
            for second in r.series.windows(10) {
                let admitted: u64 = second.iter().map(|row| row.admitted).sum();
                assert!(admitted <= peak, "{what}: peak_admitted_1s is not the peak");
                if second.iter().all(|row| row.state == ControllerState::Cut) {
                    seconds_in_cut += 1;
                    assert!(
                        admitted <= cut_bound,
                        "{what}: {admitted} admitted in 1 s of cut"
                    );
                }
            }
            if !r.summary.cuts.is_empty() {
                assert!(
                    seconds_in_cut > 0,
                    "{what}: the cut bound was never checked"
                );
            }
        }
    }
}

#[test]
fn the_series_agrees_with_the_engine_counters_and_transitions() {
    for scenario in Scenario::ALL {
        let r = simulator(route(params()))
            .run_profile(&scenario.profile(), ArrivalModel::Uniform)
            .unwrap();
        let s = &r.summary;
        let what = scenario.name();
        // Counts from the decisions, slot by slot, against the engine's own counters.
        let offered: u64 = r.series.iter().map(|row| row.offered).sum();
        let admitted: u64 = r.series.iter().map(|row| row.admitted).sum();
        let roc_cut: u64 = r.series.iter().map(|row| row.rejected.roc_cut).sum();
        let limit: u64 = r.series.iter().map(|row| row.rejected.limit).sum();
        assert_eq!(offered, s.offered, "{what}");
        assert_eq!(
            offered,
            scenario.profile().expected_arrivals().round() as u64,
            "{what}"
        );
        assert_eq!(admitted, s.admitted, "{what}");
        assert_eq!(
            (limit, roc_cut),
            (s.rejected_by_reason.limit, s.rejected_by_reason.roc_cut)
        );
        assert_eq!(s.admitted + s.rejected, s.offered, "{what}");
        // Each row's state is the state the transitions put the controller in (every
        // slot has arrivals here, so the engine steps at each slot's start).
        let mut state = ControllerState::Normal;
        let mut transitions = s.transitions.iter().peekable();
        for row in &r.series {
            while let Some(t) = transitions.next_if(|t| t.t_s <= row.t_s + EPS) {
                state = t.to;
            }
            assert_eq!(row.state, state, "{what} at {} s", row.t_s);
        }
        // The engine's time in cut is the sum of the cut intervals.
        let mut in_cut = 0.0;
        let mut since = None;
        for t in &s.transitions {
            if t.to == ControllerState::Cut {
                since = Some(t.t_s);
            } else if let Some(from) = since.take() {
                in_cut += t.t_s - from;
            }
        }
        in_cut += since.map_or(0.0, |from| s.duration_s - from);
        assert!(
            (s.time_in_cut_s - in_cut).abs() < 1e-6,
            "{what}: {} vs {in_cut}",
            s.time_in_cut_s
        );
    }
}

#[test]
fn shadow_counts_what_enforce_rejects() {
    let enforce = flash_sale(ArrivalModel::Uniform).summary;
    let shadow = simulator({
        let mut v = route(params());
        v.mode = Mode::Shadow;
        v
    })
    .run_profile(&Scenario::FlashSale.profile(), ArrivalModel::Uniform)
    .unwrap();
    let s = &shadow.summary;
    assert_eq!((s.admitted, s.rejected), (s.offered, 0));
    // Rejected requests take no token, so shadow decides exactly as enforce does.
    assert_eq!(s.shadow_rejected_by_reason, enforce.rejected_by_reason);
    assert_eq!(s.transitions, enforce.transitions);
    let per_slot: u64 = shadow.series.iter().map(|row| row.shadow_rejected).sum();
    assert_eq!(per_slot, s.shadow_rejected);

    // shadow_adaptive enforces the base limit only, and counts what the cut would reject.
    let adaptive = simulator({
        let mut v = route(params());
        v.mode = Mode::ShadowAdaptive;
        v
    })
    .run_profile(&Scenario::FlashSale.profile(), ArrivalModel::Uniform)
    .unwrap();
    let a = &adaptive.summary;
    assert_eq!(a.cuts, enforce.cuts);
    assert_eq!(a.rejected_by_reason.roc_cut, 0);
    assert!(a.rejected_by_reason.limit > 0);
    assert!(a.admitted > enforce.admitted);
    assert!(a.shadow_rejected_by_reason.roc_cut > 0);
    assert_eq!(a.shadow_rejected, a.shadow_rejected_by_reason.roc_cut);
    let per_slot: u64 = adaptive.series.iter().map(|row| row.shadow_rejected).sum();
    assert_eq!(per_slot, a.shadow_rejected);
}

/// A route whose scheduled event, from `start_s` after the epoch for 40 s, runs a
/// profile that no ROC can trip.
fn route_with_event(start_s: u64) -> RouteConfig {
    let mut w = route(params());
    w.events = vec![Event::new(
        "sale",
        UNIX_EPOCH + Duration::from_secs(start_s),
        Duration::from_secs(40),
        {
            let mut v = params();
            v.danger_roc = 10_000.0;
            v
        },
    )];
    w
}

#[test]
fn scheduled_events_are_placed_by_the_wall_start() {
    let flash_sale = Scenario::FlashSale.profile();
    // t = 0 is UNIX_EPOCH + the profile's start (0): an event from 10 s covers the step.
    let sim = simulator(route_with_event(10));
    let r = sim.run_profile(&flash_sale, ArrivalModel::Uniform).unwrap();
    assert!(r.summary.cuts.is_empty(), "{:?}", r.summary.cuts);
    assert_eq!(r.summary.start_unix_s, 0.0);

    // An event an hour after the epoch is still ahead.
    let sim = simulator(route_with_event(3610));
    let r = sim.run_profile(&flash_sale, ArrivalModel::Uniform).unwrap();
    assert_eq!(r.summary.first_cut_s, Some(20.5));
    // Unless the run starts an hour after the epoch...
    let r = sim
        .clone()
        .wall_start(UNIX_EPOCH + Duration::from_secs(3600))
        .run_profile(&flash_sale, ArrivalModel::Uniform)
        .unwrap();
    assert!(r.summary.cuts.is_empty(), "{:?}", r.summary.cuts);
    assert_eq!(r.summary.start_unix_s, 3600.0);
    // ... or the profile is written in Unix seconds from then.
    let unix = Profile::parse_csv("3600,40\n3620,40\n3620,600\n3640,600\n").unwrap();
    let r = sim.run_profile(&unix, ArrivalModel::Uniform).unwrap();
    assert_eq!(r.summary.start_unix_s, 3600.0);
    assert!(r.summary.cuts.is_empty(), "{:?}", r.summary.cuts);
    assert_eq!(r.series.len(), 400);
}

/// An event that ended before the engine started stays over. It was applied from the
/// start: its start was computed as `now - (wall_now - event.start)`, which saturated at
/// `Nanos::ZERO` for an engine started near zero (as every engine is), and its end as
/// that start + duration, so an event from 10 s to 50 s after the epoch ran from 0 s to
/// 40 s in an engine started an hour after the epoch, and every past event in a config
/// came back for its whole duration after each start (`span` in
/// src/engine/events.rs now places no event that has ended).
#[test]
fn a_past_event_does_not_come_back_at_start() {
    let r = simulator(route_with_event(10))
        .wall_start(UNIX_EPOCH + Duration::from_secs(3600))
        .run_profile(&Scenario::FlashSale.profile(), ArrivalModel::Uniform)
        .unwrap();
    assert_eq!(
        r.summary.first_cut_s,
        Some(20.5),
        "the sale of 10 s..50 s is over at 3600 s"
    );
}

#[test]
fn arbitrary_arrivals_run_until_the_duration() {
    let sim = simulator(route(params()));
    let arrivals = [50, 150, 150, 120, 1_999, 2_000, 2_500].map(Nanos::from_millis);
    let r = sim.run(arrivals, Duration::from_secs(2)).unwrap();
    assert_eq!(r.series.len(), 20);
    // 120 ms comes after 150 ms: taken at 150 ms. The arrival at 2 s ends the run.
    let offered: Vec<u64> = r.series.iter().map(|row| row.offered).collect();
    assert_eq!(&offered[..3], &[1, 3, 0]);
    assert_eq!(offered[19], 1);
    assert_eq!(r.summary.offered, 5);
    assert_eq!(r.summary.duration_s, 2.0);
}

#[test]
fn bad_simulations_are_errors() {
    let config = Config::new(vec![route(params())]);
    assert_eq!(
        Simulator::new(config.clone(), Some("seckill"))
            .unwrap_err()
            .to_string(),
        "unknown route `seckill`; routes in the configuration: order"
    );
    assert_eq!(
        Simulator::new(Config::default(), None).unwrap_err(),
        SimError::NoRoutes
    );
    let sim = Simulator::new(config, None).unwrap();
    let too_long = Profile::from_points(&[(0.0, 1.0), (1e6, 1.0)]).unwrap();
    assert!(matches!(
        sim.run_profile(&too_long, ArrivalModel::Uniform),
        Err(SimError::TooManySlots {
            slots: 10_000_000,
            ..
        })
    ));
    // 10^13 slots of 100 ms: more nanoseconds than a u64 holds, counted exactly (the
    // count was once taken from the run's length in saturated nanoseconds).
    let far_too_long = Profile::from_points(&[(0.0, 0.0), (1e12, 0.0)]).unwrap();
    assert_eq!(
        sim.run_profile(&far_too_long, ArrivalModel::Uniform)
            .unwrap_err()
            .to_string(),
        "a run of 1000000000000s in slots of 100ms needs 10000000000000 slots, \
         more than 1000000"
    );
    let too_busy = Profile::from_points(&[(0.0, 1e12), (60.0, 1e12)]).unwrap();
    assert!(matches!(
        sim.run_profile(&too_busy, ArrivalModel::Uniform),
        Err(SimError::TooManyArrivals { .. })
    ));
    // 10 s at 10^9 req/s would take about 20 minutes.
    let twenty_minutes = Profile::from_points(&[(0.0, 1e9), (10.0, 1e9)]).unwrap();
    assert!(matches!(
        sim.run_profile(&twenty_minutes, ArrivalModel::Uniform),
        Err(SimError::TooManyArrivals { .. })
    ));
}
