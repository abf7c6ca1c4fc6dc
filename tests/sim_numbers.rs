//! The simulator's and the hints' numbers, recomputed independently: arrival counts
//! from the profile's own points (not from `Profile`'s integral), the busiest second
//! from the arrival times, the controller's time in cut against a run that steps it
//! after the silence, and the hints' advice applied to the config and run again.

use rocgate::config::Config;
use rocgate::sim::{ArrivalModel, Profile, SimRun, Simulator};

/// A config of one route `r` taking every path, with `extra` TOML lines of the route.
fn config(extra: &str) -> Config {
    let toml = format!("[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n{extra}\n");
    Config::from_toml_str(&toml, "test").unwrap_or_else(|e| panic!("{toml}: {e}"))
}

fn run(extra: &str, points: &[(f64, f64)], model: ArrivalModel) -> SimRun {
    let profile = Profile::from_points(points).unwrap();
    Simulator::new(config(extra), None)
        .unwrap()
        .run_profile_all(&profile, model)
        .unwrap()
}

/// The expected count of `points` from the start to `t`: the trapezoids, computed here.
fn integral(points: &[(f64, f64)], t: f64) -> f64 {
    points
        .windows(2)
        .map(|w| {
            let ((t0, r0), (t1, r1)) = (w[0], w[1]);
            if t <= t0 || t1 <= t0 {
                return 0.0;
            }
            let end = t.min(t1);
            let r_end = r0 + (r1 - r0) * (end - t0) / (t1 - t0);
            0.5 * (r0 + r_end) * (end - t0)
        })
        .sum()
}

/// Profiles with ramps, steps, stretches at rate zero and a fractional total.
fn profiles() -> Vec<Vec<(f64, f64)>> {
    vec![
        vec![
            (0.0, 40.0),
            (20.0, 40.0),
            (20.0, 600.0),
            (40.0, 600.0),
            (50.0, 40.0),
            (60.0, 40.0),
        ],
        vec![(0.0, 5.0), (60.0, 40.0)],
        vec![
            (0.0, 0.0),
            (10.0, 0.0),
            (10.0, 120.0),
            (15.0, 0.0),
            (30.0, 0.0),
            (30.0, 33.3),
            (45.5, 33.3),
        ],
        vec![(0.0, 0.0), (30.0, 90.0), (30.0, 0.0), (35.0, 0.0)],
        vec![(0.0, 7.5), (0.5, 7.5)],
    ]
}

/// Arrival times in seconds.
fn arrivals(profile: &Profile, model: ArrivalModel) -> Vec<f64> {
    profile.arrivals(model).map(|t| t.as_secs_f64()).collect()
}

#[test]
fn uniform_arrivals_are_the_rounded_integral_up_to_every_point() {
    for points in profiles() {
        let profile = Profile::from_points(&points).unwrap();
        let times = arrivals(&profile, ArrivalModel::Uniform);
        let total = integral(&points, f64::INFINITY);
        assert!((profile.expected_arrivals() - total).abs() < 1e-9 * total.max(1.0));
        assert_eq!(times.len() as f64, total.round(), "{points:?}");
        // Arrival k comes when the integral reaches k − ½: up to any point, as many as
        // the integral there rounds to (the half-way cases sit exactly on the point).
        for &(t, _) in &points {
            let before = times.iter().filter(|&&a| a < t - 1e-6).count() as f64;
            let expected = integral(&points, t);
            assert!(
                (before - expected.round()).abs() <= 1.0 && (before - expected).abs() <= 0.5 + 1e-6,
                "{points:?}: {before} before {t} s, integral {expected}"
            );
        }
        // None where the rate is zero.
        for w in points.windows(2) {
            let ((t0, r0), (t1, r1)) = (w[0], w[1]);
            if r0 == 0.0 && r1 == 0.0 {
                assert!(
                    !times.iter().any(|&a| a > t0 + 1e-6 && a < t1 - 1e-6),
                    "{points:?}: an arrival in the silence {t0}..{t1}"
                );
            }
        }
    }
}

/// Poisson counts: over 40 fixed seeds the count of each profile has mean μ and
/// variance μ. Each count lies within 5σ = 5√μ of μ (a miss has probability under
/// 1e-6 a run), and their mean within 4σ/√40 (under 1e-4): the seeds are fixed, so a
/// pass is deterministic, and an integral or time-rescaling off by more than about
/// 2% of a 16,000-request run would fail it.
#[test]
fn poisson_counts_have_the_profiles_mean() {
    const SEEDS: u64 = 40;
    for points in profiles() {
        let profile = Profile::from_points(&points).unwrap();
        let mu = integral(&points, f64::INFINITY);
        let mut sum = 0.0;
        for seed in 0..SEEDS {
            let times = arrivals(&profile, ArrivalModel::Poisson { seed });
            let n = times.len() as f64;
            assert!(
                (n - mu).abs() <= 5.0 * mu.sqrt() + 1.0,
                "{points:?} seed {seed}: {n} arrivals, expected {mu}"
            );
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "in time order");
            for w in points.windows(2) {
                let ((t0, r0), (t1, r1)) = (w[0], w[1]);
                if r0 == 0.0 && r1 == 0.0 {
                    assert!(!times.iter().any(|&a| a > t0 + 1e-6 && a < t1 - 1e-6));
                }
            }
            sum += n;
        }
        let mean = sum / SEEDS as f64;
        let bound = 4.0 * (mu / SEEDS as f64).sqrt() + 0.5;
        assert!(
            (mean - mu).abs() <= bound,
            "{points:?}: mean {mean} over {SEEDS} seeds, expected {mu} ± {bound}"
        );
    }
}

#[test]
fn a_profile_needs_two_points_a_step_is_instant_and_a_zero_stretch_is_silent() {
    assert!(Profile::from_points(&[(0.0, 10.0)]).is_err());
    assert!(Profile::from_points(&[(5.0, 10.0), (5.0, 20.0)]).is_err());
    let step =
        Profile::from_points(&[(0.0, 10.0), (10.0, 10.0), (10.0, 100.0), (20.0, 100.0)]).unwrap();
    assert_eq!(step.expected_arrivals(), 1100.0);
    let times = arrivals(&step, ArrivalModel::Uniform);
    assert_eq!(times.iter().filter(|&&t| t < 10.0).count(), 100);
    assert_eq!(times.iter().filter(|&&t| t >= 10.0).count(), 1000);
}

/// The most arrivals in any second `[t, t + 1)` with `t` on the 100 ms grid.
fn busiest_second(times: &[f64]) -> u64 {
    let end = times.last().copied().unwrap_or(0.0);
    (0..=((end * 10.0) as u64))
        .map(|k| {
            let t = k as f64 / 10.0;
            times
                .iter()
                .filter(|&&a| a >= t - 1e-9 && a < t + 1.0 - 1e-9)
                .count() as u64
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn the_busiest_second_slides_whatever_the_slot() {
    // 150 req/s over [9.5 s, 10.5 s), 10 req/s around it, all admitted (base 200): the
    // busiest second is [9.5 s, 10.5 s), which straddles a whole second.
    let points = [
        (0.0, 10.0),
        (9.5, 10.0),
        (9.5, 150.0),
        (10.5, 150.0),
        (10.5, 10.0),
        (20.0, 10.0),
    ];
    let times = arrivals(
        &Profile::from_points(&points).unwrap(),
        ArrivalModel::Uniform,
    );
    let busiest = busiest_second(&times);
    assert_eq!(busiest, 150);
    for (window, slot) in [
        ("6s", "100ms"),
        ("6s", "200ms"),
        ("6s", "500ms"),
        ("8s", "1s"),
        ("8s", "2s"),
    ] {
        let run = run(
            &format!("window = \"{window}\"\nslot = \"{slot}\""),
            &points,
            ArrivalModel::Uniform,
        );
        let s = &run.routes[0].summary;
        assert_eq!(s.admitted, s.offered, "slot {slot}: all admitted");
        assert_eq!(
            (
                s.peak_offered_1s,
                s.peak_admitted_1s,
                run.summary.peak_admitted_1s
            ),
            (busiest, busiest, busiest),
            "slot {slot}"
        );
        assert!(
            (s.peak_admitted_1s_at_s - 9.5).abs() < 1e-9,
            "slot {slot}: {}",
            s.peak_admitted_1s_at_s
        );
    }
}
