//! Tuning hints on simulated traffic: for every rule, a scenario that triggers it
//! (and the suggestion moves the right way by a sensible amount) and a close one that
//! does not. The modelled capacity stands in for upstream health.

#[path = "common/traffic.rs"]
mod traffic;
use traffic::bursts;

use rocgate::clock::Nanos;
use rocgate::config::{Config, Mode};
use rocgate::controller::{ControllerParams, ControllerState};
use rocgate::engine::{Engine, Key};
use rocgate::hints::{
    FleetDemand, Hint, History, Interval, Policy, RouteSettings, Setting, Severity, UpstreamCounts,
    UpstreamMeter,
};
use rocgate::limiter::{Algorithm, Reason};
use rocgate::sim::{hints, ArrivalModel, Profile, Scenario, Simulator};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// The hints `serve` gives for a route of `settings` over `intervals` of its history,
/// with no capacity known and the default policy (the rules' own bounds).
fn advise_over(settings: &RouteSettings, intervals: &[Interval]) -> Vec<Hint> {
    rocgate::hints::advise(settings, intervals, None, &Policy::default())
}

/// The hints for one route `r` (classic parameters plus `extra`, TOML lines of the
/// route) under a profile of `(t_seconds, rate)` points.
fn advise(extra: &str, points: &[(f64, f64)], capacity: Option<u64>) -> Vec<Hint> {
    advise_on(extra, &Profile::from_points(points).unwrap(), capacity)
}

/// [`advise`] on a profile.
fn advise_on(extra: &str, profile: &Profile, capacity: Option<u64>) -> Vec<Hint> {
    let toml = format!("[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n{extra}\n");
    let config = Config::from_toml_str(&toml, "test").unwrap();
    let mut sim = Simulator::new(config.clone(), Some("r")).unwrap();
    if let Some(c) = capacity {
        sim = sim.capacity(c);
    }
    let run = sim.run_profile_all(profile, ArrivalModel::Uniform).unwrap();
    hints::hints(&run, &config, &Policy::default())
}

fn find<'a>(hints: &'a [Hint], rule: &str) -> Option<&'a Hint> {
    hints.iter().find(|h| h.rule == rule)
}

/// The hint that sets `parameter` (the first, in the report's order); the test fails
/// showing the hints if none does.
fn setting<'a>(hints: &'a [Hint], parameter: &str) -> &'a Hint {
    hints
        .iter()
        .find(|h| h.parameter.as_deref() == Some(parameter))
        .unwrap_or_else(|| panic!("no {parameter} hint in {hints:#?}"))
}

/// The test fails, showing the reason, unless `hint`'s reason contains `text`.
#[track_caller]
fn assert_says(hint: &Hint, text: &str) {
    assert!(hint.reason.contains(text), "{}", hint.reason);
}

fn rules(hints: &[Hint]) -> Vec<&str> {
    hints.iter().map(|h| h.rule.as_str()).collect()
}

/// The suggested change of `rule` as (current, suggested) numbers.
fn numbers(hints: &[Hint], rule: &str) -> (f64, f64) {
    let h = find(hints, rule).unwrap_or_else(|| panic!("no {rule} in {:#?}", rules(hints)));
    match (&h.current, &h.suggested) {
        (Some(Setting::Number(c)), Some(Setting::Number(s))) => (*c, *s),
        other => panic!("{rule}: not numbers: {other:?}"),
    }
}

fn steady(rate: f64) -> Vec<(f64, f64)> {
    vec![(0.0, rate), (60.0, rate)]
}

/// 100 req/s for 20 s, then 400 (twice the default base limit) to 60 s.
fn spike_to_400() -> Vec<(f64, f64)> {
    vec![(0.0, 100.0), (20.0, 100.0), (20.0, 400.0), (60.0, 400.0)]
}

#[test]
fn rejections_under_a_healthy_upstream_raise_the_base_limit() {
    let h = advise("", &steady(300.0), Some(1000));
    let (current, suggested) = numbers(&h, "raise_base_limit");
    assert_eq!(current, 200.0);
    assert_eq!(suggested, 260.0, "about 30%");
    assert!(find(&h, "raise_base_limit")
        .unwrap()
        .reason
        .contains("rejected by the base limit"));

    // Bounded by the upstream's capacity, less what a full bucket (1 s) adds in a
    // spike's first second: 500 ÷ 2.
    let (_, bounded) = numbers(&advise("", &steady(300.0), Some(500)), "raise_base_limit");
    assert_eq!(bounded, 250.0);
    // 240 ÷ 2 is under the base limit already: no raise.
    assert!(find(&advise("", &steady(300.0), Some(240)), "raise_base_limit").is_none());

    // 5% rejected is not enough; neither is an upstream no one measured.
    assert!(find(&advise("", &steady(210.0), Some(1000)), "raise_base_limit").is_none());
    assert!(find(&advise("", &steady(300.0), None), "raise_base_limit").is_none());
}

/// A raise bounded by the upstream's capacity is rounded down to the bound, never up
/// past it: at a capacity of 422 req/s a token bucket of 1 s takes at most 211 (a full
/// bucket and a second of refill, 422), and the raise of 200 said "at most 211" beside
/// a suggestion of 220, which passes 440: now 210. As `raise_min_rps` rounds at its bound.
/// (found by helper-172)
#[test]
fn a_raise_bounded_by_the_capacity_is_not_rounded_past_it() {
    for (capacity, most, readable) in [
        (422, 211.0, 210.0),
        (466, 233.0, 230.0),
        (500, 250.0, 250.0),
    ] {
        let h = advise("", &steady(300.0), Some(capacity));
        let (current, suggested) = numbers(&h, "raise_base_limit");
        assert!(
            current < suggested && suggested <= most,
            "{capacity}: {current} → {suggested}, at most {most}"
        );
        assert_eq!(suggested, readable, "{capacity}");
    }
}

/// A limit under 0.1 req/s (the config takes them down to 0.000001) is printed to
/// three significant digits: a raise of 0.001 was printed `0.001 → 0.001` (three
/// decimals), and one of 0.0002, `0 → 0`. (helper-167)
#[test]
fn a_raise_of_a_tiny_base_limit_prints_the_change() {
    for (base, printed) in [
        ("0.001", "base_limit 0.001 → 0.0013"),
        ("0.0002", "base_limit 0.0002 → 0.00026"),
    ] {
        let h = advise(
            &format!("base_limit = {base}\ncut_limit = {base}"),
            &steady(300.0),
            Some(1000),
        );
        let table = rocgate::hints::table(&h);
        assert!(table.contains(printed), "{table}");
        assert!(
            table.contains(&format!("base limit of {base} req/s")),
            "{table}"
        );
    }
}

#[test]
fn a_saturated_upstream_behind_few_rejections_lowers_the_base_limit() {
    let h = advise("", &steady(180.0), Some(150));
    let (current, suggested) = numbers(&h, "lower_base_limit");
    assert_eq!(current, 200.0);
    assert!(
        (100.0..=135.0).contains(&suggested),
        "90% of the 150 req/s it saturates at, rounded down: {suggested}"
    );
    // The same traffic under a capacity that holds: nothing to lower.
    assert!(find(&advise("", &steady(180.0), Some(250)), "lower_base_limit").is_none());
}

/// Two spikes of 500 req/s against a service of 150 req/s behind a base limit of 200:
/// the service was overloaded in 5 seconds of 60 (260 requests over), fewer than the
/// 10% of intervals a measured upstream must saturate in, and the hints said "no
/// change". A known capacity under the base limit is a fact, not a sample.
#[test]
fn a_base_limit_above_a_known_capacity_is_lowered_after_a_short_overload() {
    let double = Scenario::DoubleSpike.profile();
    let h = advise_on("", &double, Some(150));
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 130.0));
    // Under a capacity above the base limit, as many saturated seconds (a full bucket's
    // burst) are not enough.
    let h = advise_on("", &double, Some(250));
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
}

#[test]
fn bursty_rejections_raise_the_burst() {
    // A high danger_roc keeps the controller out of it: only the bucket rejects.
    let h = advise("danger_roc = 2000\nsafe_roc = 100", &bursts(), Some(1000));
    let hint = find(&h, "raise_burst").unwrap_or_else(|| panic!("{:#?}", rules(&h)));
    assert_eq!(hint.current, Some(Setting::Text("1s".into())));
    assert_eq!(hint.suggested, Some(Setting::Text("2s".into())));
    // A bucket of 3 s absorbs every burst: no rejections, no hint.
    let h = advise(
        "danger_roc = 2000\nsafe_roc = 100\nburst = \"3s\"",
        &bursts(),
        Some(1000),
    );
    assert!(find(&h, "raise_burst").is_none(), "{:#?}", rules(&h));
}

/// Rejections by the local fallback limiter (a distributed route while Redis is
/// away) are the outage's, no reason to tune the bucket or the restore: bursts of 300
/// req/s over a base of 200, each after a quiet second, raise the burst when the
/// bucket rejected them, and not when the fallback limiter did; a third of 150 req/s
/// rejected while recovering asks for a faster restore when the lowered limit rejected
/// it, and not when the fallback limiter did. Both rules took every rejection but the
/// cut's for the limit's.
#[test]
fn fallback_rejections_tune_neither_base_limit_nor_burst_nor_restore() {
    let settings = classic();
    // 20 seconds of (offered, rejected for `reason`), in `state`.
    let intervals = |pattern: &dyn Fn(u64) -> (u64, u64), reason: Reason, state| {
        let seconds = (0..20u64).flat_map(|k| {
            let (offered, rejected) = pattern(k);
            rejecting(k, 1, offered, (reason, rejected), 0)
        });
        in_state(seconds.collect(), state)
    };
    let bursts = |k: u64| -> (u64, u64) {
        if k % 2 == 0 {
            (100, 0)
        } else {
            (300, 100)
        }
    };
    let over = |_: u64| -> (u64, u64) { (150, 50) };
    // The limiter's refusals: while recovering, the lowered limit's (`roc_cut`).
    for (pattern, state, limiter, rule) in [
        (
            &bursts as &dyn Fn(u64) -> (u64, u64),
            ControllerState::Normal,
            Reason::Limit,
            "raise_burst",
        ),
        (
            &over,
            ControllerState::Recovering,
            Reason::RocCut,
            "faster_restore",
        ),
        // A Redis outage read as the base limit's rejections raised it for good.
        (
            &over,
            ControllerState::Normal,
            Reason::Limit,
            "raise_base_limit",
        ),
    ] {
        let advised = |reason| {
            let part = intervals(pattern, reason, state);
            advise_over(&settings, &part)
        };
        let by_limit = advised(limiter);
        assert!(find(&by_limit, rule).is_some(), "{rule}: {by_limit:#?}");
        let by_fallback = advised(Reason::FallbackLocal);
        assert!(
            find(&by_fallback, rule).is_none(),
            "{rule}: {by_fallback:#?}"
        );
    }
}

/// What a faster restore cannot save is what the base limit refused, or would have,
/// anyway: `faster_restore` counts it as `raise_base_limit` does ([`base_refused`]),
/// its own refusals (`limit`, once the restore reached the base limit, or a
/// `shadow_adaptive` route's enforced ones) and the cut's of demand beyond its rate.
/// It took the demand beyond the rate out of all the refusals instead: 20 seconds of
/// recovery at 150 req/s under a base limit of 200, of which the base limit refused 30
/// and the lowered one 20, read as 33.3% a faster restore saves, not 13.3%; 50 by the
/// base limit asked for a faster restore; and on a `shadow_adaptive` route at 300 req/s
/// whose base limit refused 80 (a full bucket let more than its rate through) and
/// whose lowered one would have refused 60 more, 13.3%, where the lowered limit's
/// alone, which restoring faster saves, are 20%.
#[test]
fn faster_restore_counts_the_base_limits_refusals_as_raise_base_limit_does() {
    // 20 seconds of recovery at `offered`, rejected for (reason, n) enforced, and
    // `shadow_cut` by the lowered limit in shadow.
    let recovery = |offered: u64, rejected: &[(Reason, u64)], shadow_cut: u64| {
        (0..20u64)
            .map(|k| {
                let mut i = Interval::new(Nanos::from_secs(k), Duration::from_secs(1));
                i.offered = offered;
                for &(reason, n) in rejected {
                    i.rejected[reason.index()] = n;
                }
                i.shadow_rejected[Reason::RocCut.index()] = shadow_cut;
                let admitted = offered - rejected.iter().map(|&(_, n)| n).sum::<u64>();
                i.in_state[usize::from(ControllerState::Recovering.as_index())] = 1.0;
                i.upstream = Some(UpstreamCounts {
                    requests: admitted,
                    ..UpstreamCounts::default()
                });
                i
            })
            .collect::<Vec<Interval>>()
    };
    let restore = |settings: &RouteSettings, part: &[Interval]| {
        let h = advise_over(settings, part);
        find(&h, "faster_restore").map(|h| h.reason.clone())
    };
    let enforce = classic();
    let mixed = recovery(150, &[(Reason::Limit, 30), (Reason::RocCut, 20)], 0);
    let said = restore(&enforce, &mixed).expect("20 of 150 rejected by the lowered limit");
    assert!(
        said.contains("(13.3% beyond what the base limit of 200 req/s would have rejected)"),
        "{said}"
    );
    let own = recovery(150, &[(Reason::Limit, 50)], 0);
    assert_eq!(restore(&enforce, &own), None);
    let adaptive = RouteSettings {
        mode: Mode::ShadowAdaptive,
        ..classic()
    };
    let part = recovery(300, &[(Reason::Limit, 80)], 60);
    let said = restore(&adaptive, &part).expect("60 of 300 the lowered limit's");
    assert!(
        said.contains("(20.0% beyond what the base limit of 200 req/s would have rejected)"),
        "{said}"
    );
}

#[test]
fn a_cut_under_the_base_limit_with_a_healthy_upstream_raises_danger_roc() {
    // 20 → 150 req/s: ROC 130 passes danger 80, though 150 fits under base 200.
    let step = |to: f64| vec![(0.0, 20.0), (30.0, 20.0), (30.0, to), (60.0, to)];
    let h = advise("", &step(150.0), Some(1000));
    let (current, suggested) = numbers(&h, "raise_danger_roc");
    assert_eq!(current, 80.0);
    assert!(
        (130.0..=200.0).contains(&suggested),
        "just above the ROC of 130 that cut: {suggested}"
    );
    // 20 → 90: ROC 70 never cuts.
    assert!(find(&advise("", &step(90.0), Some(1000)), "raise_danger_roc").is_none());
    // 20 → 400 overloads a 250 req/s upstream: that cut was needed.
    assert!(find(&advise("", &step(400.0), Some(250)), "raise_danger_roc").is_none());
}

#[test]
fn a_saturating_ramp_under_danger_lowers_danger_roc() {
    // 50 → 300 req/s over 10 s: ROC about 75, just under danger 80.
    let ramp = vec![(0.0, 50.0), (20.0, 50.0), (30.0, 300.0), (60.0, 300.0)];
    let h = advise("", &ramp, Some(150));
    let (current, suggested) = numbers(&h, "lower_danger_roc");
    assert_eq!(current, 80.0);
    assert!(
        suggested > 20.0 && suggested < 70.0,
        "below the ramp's ROC, above safe_roc: {suggested}"
    );
    // The same ramp into an upstream that copes.
    assert!(find(&advise("", &ramp, Some(1000)), "lower_danger_roc").is_none());
}

/// 5 req/s with `n` three-second bursts at 20 req/s, 15 s apart.
fn quiet(n: u32) -> Vec<(f64, f64)> {
    let mut points = vec![(0.0, 5.0)];
    for k in 0..n {
        let t = 10.0 + f64::from(k) * 15.0;
        points.extend([(t, 5.0), (t, 20.0), (t + 3.0, 20.0), (t + 3.0, 5.0)]);
    }
    points.push((70.0, 5.0));
    points
}

const RELATIVE: &str = "roc_mode = \"relative\"\ndanger_roc = 1.0\nsafe_roc = 0.2\nmin_rps = 2\nmin_samples = 5\nhold = \"1s\"";

#[test]
fn many_cuts_on_a_quiet_route_raise_min_rps() {
    let h = advise(RELATIVE, &quiet(4), Some(1000));
    let (current, suggested) = numbers(&h, "raise_min_rps");
    assert_eq!(current, 2.0);
    assert!(
        (15.0..=30.0).contains(&suggested),
        "above the bursts' 20 req/s peak demand: {suggested}"
    );
    // Two cuts are not many.
    let h = advise(RELATIVE, &quiet(2), Some(1000));
    assert!(find(&h, "raise_min_rps").is_none(), "{:#?}", rules(&h));
}

#[test]
fn heavy_rejection_while_recovering_under_a_healthy_upstream_restores_faster() {
    let spike = spike_to_400();
    let h = advise("", &spike, Some(1000));
    let (current, suggested) = numbers(&h, "faster_restore");
    assert_eq!(current, 20.0);
    assert_eq!(suggested, 40.0);
    // An upstream that saturates during the recovery says the pace is right.
    let h = advise("", &spike, Some(150));
    assert!(find(&h, "faster_restore").is_none(), "{:#?}", rules(&h));
}

/// A sale of 600 req/s against a base limit of 130: the recovery rejects most
/// requests, but the base limit would have rejected nearly as many, so restoring faster
/// saves almost nothing. The rule counted every rejection during recovery and asked
/// for larger steps, which took the run's rejections from 72.7% to 72.3%.
#[test]
fn rejections_the_base_limit_would_make_anyway_do_not_hurry_the_restore() {
    let sale = Scenario::FlashSale.profile();
    let h = advise_on("base_limit = 130", &sale, Some(1000));
    assert!(find(&h, "faster_restore").is_none(), "{h:#?}");
}

/// Two spikes of 500 req/s 6 s apart, against a service of 300 req/s: the base limit of
/// 200 with a bucket of 1 s passes 400 in the first second of a spike after a quiet
/// spell. Restoring faster brings that back before the second spike: the rule asked
/// for it (restore_step 20 → 40), and the overload went from 43 to 112 requests.
#[test]
fn no_faster_restore_to_a_base_limit_the_upstream_cannot_take() {
    let double = Scenario::DoubleSpike.profile();
    let h = advise_on("", &double, Some(300));
    assert!(find(&h, "faster_restore").is_none(), "{h:#?}");
    // A sustained spike: restored faster against a service with room for a full bucket
    // and a second of refill (400 req/s), not against one without.
    let spike = spike_to_400();
    assert_eq!(
        numbers(&advise("", &spike, Some(400)), "faster_restore"),
        (20.0, 40.0)
    );
    let h = advise("", &spike, Some(390));
    assert!(find(&h, "faster_restore").is_none(), "{h:#?}");
}

#[test]
fn shadow_mode_says_whether_enforcing_is_safe() {
    let shadow = "mode = \"shadow\"";
    let safe = advise(shadow, &steady(150.0), Some(1000));
    let hint = find(&safe, "shadow_verdict").unwrap();
    assert_eq!(hint.suggested, Some(Setting::Text("enforce".into())));
    assert_says(hint, "safe to enforce");

    let unsafe_ = advise(shadow, &steady(300.0), Some(1000));
    let hint = find(&unsafe_, "shadow_verdict").unwrap();
    assert_eq!(hint.suggested, None);
    assert_says(hint, "not safe");

    let protect = advise(shadow, &steady(300.0), Some(150));
    let hint = find(&protect, "shadow_verdict").unwrap();
    assert_eq!(hint.suggested, Some(Setting::Text("enforce".into())));
    assert_says(hint, "protected");
}

/// A shadow route whose base limit would have rejected some of a healthy upstream's
/// traffic (7.6% of 220 req/s: too few for `raise_base_limit`, too many to enforce),
/// and no other hint: the verdict said "not safe to enforce yet; tune the limits
/// first (see the other hints)", pointing at hints there were none of. It names the
/// setting itself: the base limit, toward the demand seen while healthy.
#[test]
fn a_shadow_verdict_without_other_hints_names_what_to_tune() {
    let h = advise("mode = \"shadow\"", &steady(220.0), Some(1000));
    let verdict = find(&h, "shadow_verdict").unwrap();
    assert!(
        verdict.reason.contains("(7.6%)") && verdict.reason.contains("not safe"),
        "{}",
        verdict.reason
    );
    assert!(
        h.iter()
            .all(|o| o.rule == "shadow_verdict" || o.suggested.is_none()),
        "{h:#?}"
    );
    assert!(
        !verdict.reason.contains("see the other hints")
            && verdict
                .reason
                .contains("raise base_limit from 200 req/s toward 220 req/s"),
        "{}",
        verdict.reason
    );
}

/// The verdict's raise toward the demand, stopped at the upstream's capacity, is
/// rounded down within it, as `raise_base_limit`'s is: at a capacity of 410 req/s a
/// token bucket of 1 s takes at most 205, and the verdict said "toward 210 req/s".
/// (found by helper-172)
#[test]
fn a_shadow_verdicts_raise_bounded_by_the_capacity_is_not_rounded_past_it() {
    let h = advise("mode = \"shadow\"", &steady(220.0), Some(410));
    let verdict = find(&h, "shadow_verdict").unwrap();
    assert!(
        verdict
            .reason
            .contains("raise base_limit from 200 req/s toward 205 req/s")
            && verdict.reason.contains("at most 205"),
        "{}",
        verdict.reason
    );
}

/// The same for the ROC cut of a `shadow_adaptive` route: cuts while the upstream was
/// healthy, with demand above the base limit at their peak (so not the false cuts
/// `raise_danger_roc` judges), would have rejected 6.7%: the verdict names
/// `danger_roc` and `cut_limit` with the figures of those cuts.
#[test]
fn a_shadow_adaptive_verdict_without_other_hints_names_the_cut_settings() {
    let settings = engine_settings("mode = \"shadow_adaptive\"");
    let mut intervals = seconds(180, false);
    shadow_cut(&mut intervals, 250.0);
    let h = advise_over(&settings, &intervals);
    let verdict = find(&h, "shadow_verdict").unwrap_or_else(|| panic!("{h:#?}"));
    assert!(
        h.iter()
            .all(|o| o.rule == "shadow_verdict" || o.suggested.is_none()),
        "{h:#?}"
    );
    assert!(
        verdict.reason.contains("not safe")
            && verdict.reason.contains("raise danger_roc (")
            && verdict.reason.contains("above 95")
            && verdict.reason.contains("cut_limit (")
            && verdict
                .reason
                .contains("(their demand peaked at 250 req/s)"),
        "{}",
        verdict.reason
    );
}

/// The rules that judge cuts, ramps and restores: on a distributed route the shared
/// controller's slots are not in this instance's history, and they say they do not
/// judge it.
const NOT_JUDGED_ON_A_DISTRIBUTED_ROUTE: [&str; 5] = [
    "raise_burst",
    "raise_danger_roc",
    "lower_danger_roc",
    "raise_min_rps",
    "faster_restore",
];

/// `intervals` with the keys `keys(k)` refused in interval `k`, as hashes a key table
/// would give them.
fn with_refused_keys(
    intervals: &[Interval],
    keys: &dyn Fn(u64) -> std::ops::Range<u64>,
) -> Vec<Interval> {
    use std::hash::BuildHasher;
    let hasher = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default();
    let mut intervals = intervals.to_vec();
    for (k, i) in (0u64..).zip(&mut intervals) {
        let mut sketch = rocgate::distinct::KeySketch::new();
        for key in keys(k) {
            sketch.record(hasher.hash_one(key));
        }
        i.refused_keys = Some(Box::new(sketch));
    }
    intervals
}

/// One cut, started at second 10 with ROC 95 and holding seconds 10 to 15 in `Cut`,
/// their demand peaking at `peak_demand_rps` (above the base limit: no false cut), in
/// which a shadow cut would have rejected 60 requests a second: the cut whose settings
/// the shadow verdict of a `shadow_adaptive` route names (`raise danger_roc (80) above
/// 95`, `cut_limit`).
fn shadow_cut(intervals: &mut [Interval], peak_demand_rps: f64) {
    for i in &mut intervals[10..16] {
        i.in_state[usize::from(ControllerState::Cut.as_index())] = 1.0;
        i.peak_demand_rps = peak_demand_rps;
        i.shadow_rejected[Reason::RocCut.index()] = 60;
    }
    intervals[10].cuts = 1;
    intervals[10].cut_roc = 95.0;
}

/// Another hint of the route does not cover every setting behind the would-be
/// rejections: a `shadow_adaptive` route whose base limit (enforced) rejected a fifth
/// of a healthy upstream's traffic gets `raise_base_limit`, and the verdict on its
/// cut said "see the other hints", though none of them touches the cut. It names the
/// cut's settings, and points at the other hint only for a setting it changes.
#[test]
fn a_shadow_verdict_names_what_the_other_hints_leave_out() {
    let settings = engine_settings("mode = \"shadow_adaptive\"");
    let mut intervals = seconds(300, false);
    for i in &mut intervals {
        i.rejected[Reason::Limit.index()] = 60;
        i.peak_demand_rps = 300.0;
    }
    shadow_cut(&mut intervals, 300.0);
    let h = advise_over(&settings, &intervals);
    assert!(find(&h, "raise_base_limit").is_some(), "{h:#?}");
    let verdict = find(&h, "shadow_verdict").unwrap_or_else(|| panic!("{h:#?}"));
    assert!(
        verdict.reason.contains("not safe")
            && !verdict.reason.contains("see the other hints")
            && verdict.reason.contains("raise danger_roc (80) above 95"),
        "{}",
        verdict.reason
    );
}

/// A shadow route rejects nothing: 300 req/s against a service of 250 behind a base
/// limit of 200 saturated it because shadow let the load through, not because the base
/// limit did, and `lower_base_limit` said 200 → 160 ("0.0% of 18000 requests were
/// rejected … the base limit lets through more than it can take"), beside the verdict
/// that enforcing would have protected it. Enforced, a third is rejected and nothing is
/// lowered; what a shadow route would have rejected counts as that.
#[test]
fn a_shadow_route_saturating_what_it_would_have_rejected_keeps_its_base_limit() {
    let enforced = advise("", &steady(300.0), Some(250));
    assert!(
        find(&enforced, "lower_base_limit").is_none(),
        "{enforced:#?}"
    );
    for mode in ["shadow", "shadow_adaptive"] {
        let h = advise(&format!("mode = \"{mode}\""), &steady(300.0), Some(250));
        assert!(find(&h, "lower_base_limit").is_none(), "{mode}: {h:#?}");
    }
    let h = advise("mode = \"shadow\"", &steady(300.0), Some(250));
    let verdict = find(&h, "shadow_verdict").unwrap();
    assert_says(verdict, "protected");
    // A shadow route that would have rejected nothing, and saturated the upstream: its
    // base limit lets through too much, as when enforced.
    let h = advise("mode = \"shadow\"", &steady(180.0), Some(150));
    let lower = find(&h, "lower_base_limit").unwrap_or_else(|| panic!("{h:#?}"));
    assert!(
        lower
            .reason
            .starts_with("0.0% of 10800 requests were or would have been rejected"),
        "{}",
        lower.reason
    );
}

#[test]
fn a_quiet_healthy_route_gets_no_change() {
    let h = advise("", &steady(100.0), Some(1000));
    assert_eq!(rules(&h), ["no_change"]);
    assert!(h[0].parameter.is_none());
    let h = advise("", &steady(2.0), Some(1000));
    assert_eq!(rules(&h), ["no_change"]);
    assert_says(&h[0], "too little traffic");
}

#[test]
fn hints_are_deterministic() {
    let spike = spike_to_400();
    let a = advise("", &spike, Some(1000));
    let b = advise("", &spike, Some(1000));
    assert_eq!(a, b);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
}

/// With `[hints] min_requests = 0`, a period without a single request still judges
/// nothing: no "safe to enforce" for a shadow route that saw no traffic.
#[test]
fn no_traffic_gets_no_verdict_even_without_a_minimum() {
    let settings = RouteSettings {
        mode: Mode::Shadow,
        ..classic()
    };
    let policy = {
        let mut v = Policy::default();
        v.min_requests = 0;
        v
    };
    let h = rocgate::hints::advise(&settings, &seconds(0, false), None, &policy);
    assert_eq!(rules(&h), ["no_change"], "{h:#?}");
    assert_eq!(
        h[0].reason,
        "no change: too little traffic to judge (0 requests in 30.0 s)"
    );
}

/// One request is counted in the singular: it said "1 requests".
#[test]
fn one_request_is_too_little_traffic_in_the_singular() {
    let settings = engine_settings("");
    let mut intervals = seconds(0, false);
    intervals[0].offered = 1;
    let h = advise_over(&settings, &intervals);
    assert_eq!(
        h[0].reason,
        "no change: too little traffic to judge (1 request in 30.0 s)"
    );
}

/// The hints' controller changes applied together, as `PUT /admin/routes/r` applies
/// them to the route of `extra`: the config file's rules must accept them.
fn apply(extra: &str, hints: &[Hint]) -> Result<(), String> {
    let toml = format!("[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n{extra}\n");
    let config = Config::from_toml_str(&toml, "test").unwrap();
    let route = &config.routes[0];
    let mut patch = serde_json::Map::new();
    for h in hints {
        if let (Some(p), Some(s)) = (&h.parameter, &h.suggested) {
            if p != "mode" && p != "burst" {
                patch.insert(p.clone(), serde_json::to_value(s).unwrap());
            }
        }
    }
    let json = serde_json::Value::Object(patch).to_string();
    rocgate::config::patch_controller(&route.controller, &route.algorithm, &json, "hints")
        .map(|_| ())
        .map_err(|e| format!("{json}: {e}"))
}

#[test]
fn a_base_limit_lowered_below_the_cut_limit_takes_the_cut_limit_with_it() {
    // Cut 180 of base 200; the upstream takes 100 req/s: base 200 → 90, below the cut.
    let extra = "cut_limit = 180";
    let h = advise(extra, &steady(150.0), Some(100));
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 90.0));
    let cut = setting(&h, "cut_limit");
    assert_eq!(cut.rule, "lower_base_limit");
    assert_eq!(cut.current, Some(Setting::Number(180.0)));
    assert_eq!(
        cut.suggested,
        Some(Setting::Number(81.0)),
        "its ratio to base kept"
    );
    apply(extra, &h).unwrap();
    // A cut limit already under the new base limit is left alone.
    let h = advise("", &steady(150.0), Some(100));
    assert!(h
        .iter()
        .all(|h| h.parameter.as_deref() != Some("cut_limit")));
    apply("", &h).unwrap();
}

/// A cut needs demand of at least `min_rps`. With `min_rps = 150` against an upstream
/// of 50 req/s, the base limit went 200 → 45 and `min_rps` stayed 150: no surge under
/// 150 req/s, three times what the upstream takes, would ever be cut. It goes down
/// with the base limit, at most to half of it (`raise_min_rps`'s bound).
#[test]
fn a_base_limit_lowered_below_min_rps_takes_min_rps_with_it() {
    let extra = "min_rps = 150\nmin_samples = 5";
    let h = advise(extra, &steady(150.0), Some(50));
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 45.0));
    let min = setting(&h, "min_rps");
    assert_eq!(min.rule, "lower_base_limit");
    assert_eq!(min.current, Some(Setting::Number(150.0)));
    assert_eq!(
        min.suggested,
        Some(Setting::Number(22.0)),
        "half of 45, rounded down"
    );
    assert_says(min, "never cut");
    apply(extra, &h).unwrap();
    // A min_rps already under the new base limit is left alone.
    let h = advise("min_rps = 40", &steady(150.0), Some(50));
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 45.0));
    assert!(h.iter().all(|h| h.parameter.as_deref() != Some("min_rps")));
}

/// A `concurrency` route's base limit counts requests in flight, and `min_rps` a rate:
/// 64 in flight may carry 1,000 req/s. Lowering the base limit 64 → 51 took `min_rps`
/// 100 → 25 with it, "above the base limit, lowered to 51 req/s", comparing the two
/// units. `min_rps` is left alone there.
#[test]
fn a_concurrency_limit_lowered_leaves_min_rps_alone() {
    use rocgate::controller::ControllerParams;
    use rocgate::hints::RouteSettings;
    use rocgate::limiter::Algorithm;
    let mut params = ControllerParams::default();
    params.base_limit_rps = 64.0;
    params.cut_limit_rps = 32.0;
    params.min_rps = 100.0;
    let settings = RouteSettings {
        algorithm: Algorithm::Concurrency { queue: 0 },
        params,
        ..classic()
    };
    // 1,000 req/s admitted, 5% failing: saturated, nothing rejected.
    let intervals = seconds(1_000, true);
    let h = advise_over(&settings, &intervals);
    assert_eq!(numbers(&h, "lower_base_limit"), (64.0, 51.0));
    assert!(
        h.iter().all(|h| h.parameter.as_deref() != Some("min_rps")),
        "{h:#?}"
    );
}

/// Two rules of one report, each within its bounds, broke the relation together:
/// a quiet route cut again and again while its upstream was healthy (`raise_min_rps`
/// 10 → 58, at most half the base limit of 200) and saturating it at other times
/// (`lower_base_limit` 200 → 45): min_rps 58 above a base limit of 45.
/// `raise_min_rps` is bounded by the base limit suggested with it.
#[test]
fn min_rps_raised_beside_a_lowered_base_limit_stays_under_it() {
    // 20 req/s, healthy; three seconds at 50 in which the upstream saturated; three
    // cuts of spikes to 60 req/s over a healthy upstream.
    let intervals: Vec<Interval> = (0..30u64)
        .map(|k| {
            let mut i = Interval::new(Nanos::from_secs(k), Duration::from_secs(1));
            let (offered, errors) = match k % 10 {
                2 => (50, 10),
                _ => (20, 0),
            };
            i.offered = offered;
            i.peak_demand_rps = offered as f64;
            if k % 10 == 6 {
                i.cuts = 1;
                i.cut_roc = 40.0;
                i.peak_demand_rps = 60.0;
                i.in_state[usize::from(ControllerState::Cut.as_index())] = 1.0;
            } else {
                i.in_state[usize::from(ControllerState::Normal.as_index())] = 1.0;
            }
            i.upstream = Some(UpstreamCounts {
                requests: offered,
                errors,
                ..UpstreamCounts::default()
            });
            i
        })
        .collect();
    let h = advise_over(&classic(), &intervals);
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 45.0));
    let (current, raised) = numbers(&h, "raise_min_rps");
    assert_eq!(current, 10.0);
    assert!(
        raised > 10.0 && raised <= 22.5,
        "{raised}: half of 45 at most"
    );
    let reason = &find(&h, "raise_min_rps").unwrap().reason;
    assert!(reason.contains("half the base limit of 45"), "{reason}");
    apply("", &h).unwrap();
}

/// A window counter holds at most 1,048,575 requests a window: a base limit of 10^6
/// req/s in windows of 1 s, a fifth of its traffic rejected while the upstream is
/// healthy, was raised 30% to 1.3 × 10^6, which the config refuses.
#[test]
fn a_raised_window_limit_stays_within_what_its_counter_holds() {
    use rocgate::controller::ControllerParams;
    use rocgate::hints::RouteSettings;
    use rocgate::limiter::{Algorithm, Reason};
    use std::time::Duration;
    let settings = |base: f64| RouteSettings {
        algorithm: Algorithm::FixedWindow {
            window: Duration::from_secs(1),
        },
        params: {
            let mut v = ControllerParams::default();
            v.base_limit_rps = base;
            v
        },
        ..classic()
    };
    let intervals = rejecting(0, 30, 1_250_000, (Reason::Limit, 250_000), 0);
    let h = advise_over(&settings(1e6), &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (1e6, 1_048_000.0));
    let raise = find(&h, "raise_base_limit").unwrap();
    assert_says(raise, "window counter");
    let extra = "algorithm = \"fixed_window\"\nlimiter_window = \"1s\"\nbase_limit = 1000000";
    apply(extra, &h).unwrap();
    // At that most already: nothing to raise.
    let h = advise_over(&settings(1_048_000.0), &intervals);
    assert!(find(&h, "raise_base_limit").is_none(), "{h:#?}");
}

/// A token bucket keeps `limit × burst` in 32 bits of tokens, which the config holds
/// each limit to: 10^6 req/s with a burst of 1 h, a fifth rejected while the upstream
/// is healthy, would be raised 30% to 1.3 × 10^6 (4.68 × 10^9 tokens), which the
/// config refuses. The raise stops at what the bucket keeps.
#[test]
fn a_raised_bucket_limit_stays_within_what_the_bucket_keeps() {
    let extra = "base_limit = 1000000\ncut_limit = 1000\nburst = \"1h\"";
    let mut intervals = seconds(1_250_000, false);
    for i in &mut intervals {
        i.rejected[rocgate::limiter::Reason::Limit.index()] = 250_000;
    }
    let settings = engine_settings(extra);
    let h = advise_over(&settings, &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (1e6, 1_193_000.0));
    let raise = find(&h, "raise_base_limit").unwrap();
    assert_says(raise, "4294967295 tokens");
    apply(extra, &h).unwrap();
    // Rejections in bursts after room in the bucket: a larger burst is suggested too,
    // within what the bucket keeps at the raised limit.
    for (k, i) in intervals.iter_mut().enumerate() {
        let (offered, rejected) = if k % 2 == 0 {
            (500_000, 0)
        } else {
            (1_300_000, 300_000)
        };
        i.offered = offered;
        i.rejected[rocgate::limiter::Reason::Limit.index()] = rejected;
        i.upstream.as_mut().unwrap().requests = offered - rejected;
    }
    let h = advise_over(&settings, &intervals);
    let (_, base) = numbers(&h, "raise_base_limit");
    let burst = find(&h, "raise_burst").unwrap_or_else(|| panic!("{h:#?}"));
    let Some(Setting::Text(raised)) = &burst.suggested else {
        panic!("{burst:?}")
    };
    let secs = humantime::parse_duration(raised).unwrap().as_secs_f64();
    assert!(secs > 3600.0, "{raised}");
    assert!(base * secs <= 4_294_967_295.0, "{base} req/s × {raised}");
    assert_says(burst, "what the bucket keeps");
    Config::from_toml_str(
        &format!(
            "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nbase_limit = {base}\ncut_limit = 1000\nburst = \"{raised}\"\n"
        ),
        "test",
    )
    .unwrap();
}

/// A token or leaky bucket is configured at most at 2 × 10^6 req/s (it spaces
/// requests a whole number of nanoseconds apart, within 0.1% up to there): a base
/// limit of 1.8 × 10^6, a fifth of its traffic rejected while the upstream is
/// healthy, was raised 30% to 2.34 × 10^6, which the config refuses. The raise stops
/// at the bound.
#[test]
fn a_raised_bucket_limit_stays_within_what_a_bucket_enforces() {
    for algorithm in ["token_bucket", "leaky_bucket"] {
        let extra = format!("algorithm = \"{algorithm}\"\nbase_limit = 1800000\ncut_limit = 1000");
        let mut intervals = seconds(2_250_000, false);
        for i in &mut intervals {
            i.rejected[rocgate::limiter::Reason::Limit.index()] = 450_000;
        }
        let h = advise_over(&engine_settings(&extra), &intervals);
        assert_eq!(numbers(&h, "raise_base_limit"), (1.8e6, 2e6), "{algorithm}");
        let raise = find(&h, "raise_base_limit").unwrap();
        assert!(
            raise
                .reason
                .contains("at most 2000000 req/s, the most a bucket enforces within 0.1%"),
            "{algorithm}: {}",
            raise.reason
        );
        apply(&extra, &h).unwrap();
        // At the bound already: nothing to raise.
        let extra = format!("algorithm = \"{algorithm}\"\nbase_limit = 2000000\ncut_limit = 1000");
        let h = advise_over(&engine_settings(&extra), &intervals);
        assert!(
            find(&h, "raise_base_limit").is_none(),
            "{algorithm}: {h:#?}"
        );
    }
}

#[test]
fn limits_are_suggested_as_the_routes_algorithm_takes_them() {
    use rocgate::controller::ControllerParams;
    use rocgate::hints::RouteSettings;
    use rocgate::limiter::{Algorithm, Reason};

    // A fixed window of 1 s must admit at least one request: base 1 cannot go lower.
    let window = "algorithm = \"fixed_window\"\nbase_limit = 1\ncut_limit = 1";
    let h = advise(window, &steady(5.0), Some(0));
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
    apply(window, &h).unwrap();

    // A quarter rejected for concurrency while the upstream is healthy: 7 → 10, not 9.1.
    let settings = RouteSettings {
        algorithm: Algorithm::Concurrency { queue: 0 },
        params: {
            let mut v = ControllerParams::default();
            v.base_limit_rps = 7.0;
            v.cut_limit_rps = 3.0;
            v.restore_step_rps = 1.0;
            v
        },
        ..classic()
    };
    let intervals = rejecting(0, 30, 20, (Reason::Concurrency, 5), 0);
    let h = advise_over(&settings, &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (7.0, 10.0));

    // An upstream saturated with 5 requests in flight behind a limit of 7: 90% of 5
    // is 4.5, which is no limit concurrency takes; 4 is.
    let mut saturated = rejecting(0, 30, 10, (Reason::Concurrency, 0), 1);
    for i in &mut saturated {
        i.peak_in_flight = Some(5.0);
    }
    let h = advise_over(&settings, &saturated);
    assert_eq!(numbers(&h, "lower_base_limit"), (7.0, 4.0));
    let concurrency =
        "algorithm = \"concurrency\"\nbase_limit = 7\ncut_limit = 3\nrestore_step = 1";
    apply(concurrency, &h).unwrap();
}

/// A simulation completes requests at once, so a concurrency limit never binds: the
/// flash sale against a 400 req/s service was overloaded by 4352 requests whatever the
/// limit, and each round of advice lowered it further (20 → 16 → 12 → … → 2), a limit
/// that changed nothing. Such a route gets no advice from a run, and says why.
#[test]
fn a_simulated_concurrency_route_gets_no_advice_it_cannot_judge() {
    let sale = Scenario::FlashSale.profile();
    let h = advise_on(
        "algorithm = \"concurrency\"\nbase_limit = 20\ncut_limit = 6\nrestore_step = 2",
        &sale,
        Some(400),
    );
    assert_eq!(h.len(), 1, "{h:#?}");
    assert_eq!((h[0].rule.as_str(), &h[0].suggested), ("no_change", &None));
    assert_says(&h[0], "a concurrency limit never binds");
}

/// A route with no history yet (a `serve` just started) covers 0 s, not -0 s: an empty
/// sum of floats is -0.0, which printed as "0 interval(s), -0 s" and "in -0 ms". And
/// it says that nothing was measured: "too little traffic to judge (0 requests in 0
/// ms)" was read of a busy route whose settings had just changed (which starts its
/// history again) as a route without traffic.
#[test]
fn no_history_covers_zero_seconds_not_minus_zero() {
    let r = rocgate::hints::RouteHints::new(&classic(), &[], None, &Policy::default());
    assert_eq!(r.intervals, 0);
    assert!(
        r.covered_s == 0.0 && r.covered_s.is_sign_positive(),
        "{}",
        r.covered_s
    );
    assert_eq!(
        r.hints[0].reason,
        "no change: nothing measured yet: no interval of the route's history in the period has ended (the first ends one [hints] interval after serve starts, or after a change of the route's settings, which starts its history again)"
    );
}

/// `simulate` judges a run the way `serve` judges a period: the intervals that began
/// during a scheduled event against the event's profile, the rest against the route's
/// own. It judged the whole run against the route's own: a sale event with a base
/// limit of 500 overloaded a 300 req/s service in 10 of 60 seconds (878 requests over),
/// and the hints said "no change" (the route's own base limit of 200 fits).
#[test]
fn a_simulated_event_is_judged_against_its_own_profile() {
    let event = "[[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:15Z\"\n\
                 duration = \"40s\"\nbase_limit = 500\ncut_limit = 150";
    let sale = Scenario::FlashSale.profile();
    let h = advise_on(event, &sale, Some(300));
    assert_eq!(numbers(&h, "lower_base_limit"), (500.0, 270.0));
    let lower = find(&h, "lower_base_limit").unwrap();
    assert_eq!(lower.event.as_deref(), Some("sale"));
    assert_says(lower, "saturated in 10");
    // The bucket is the route's, which an event has none of: its burst goes down with
    // the event's base limit, naming no event (a full bucket and a second of refill at
    // 270 req/s pass 540 in a second, over 300).
    let burst = setting(&h, "burst");
    assert_eq!(
        (&burst.event, &burst.suggested),
        (&None, &Some(Setting::Text("111ms".into())))
    );
    // The 20 s outside the event, 40 req/s under the route's own profile: no event
    // named, nothing to change.
    let own: Vec<&Hint> = h
        .iter()
        .filter(|h| h.event.is_none() && h.parameter.is_none())
        .collect();
    assert_eq!(own.len(), 1, "{h:#?}");
    assert!(
        own[0].reason.starts_with("no change: 800 requests"),
        "{}",
        own[0].reason
    );
}

/// `simulate` prints a run's hints as one table: where an event ran, a hint that
/// changes nothing (no change, a rule that does not judge the route) names the part it
/// judged, as one that changes an event's setting names the event. `simulate
/// --profile` over `config/examples/scheduled-event.toml`'s Black Friday printed
/// "order  info  no change" twice, the route's own part and the event's alike.
#[test]
fn a_simulated_events_hints_without_a_change_name_the_event() {
    let event = "[[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:30Z\"\n\
                 duration = \"30s\"\nbase_limit = 400\ncut_limit = 150";
    let h = advise(event, &steady(40.0), Some(1000));
    let no_change: Vec<Option<&str>> = h
        .iter()
        .filter(|h| h.rule == "no_change")
        .map(|h| h.event.as_deref())
        .collect();
    assert_eq!(no_change, [None, Some("sale")], "{h:#?}");
    let table = rocgate::hints::table(&h);
    assert!(table.contains("  no change in event sale\n"), "{table}");
    let json = serde_json::to_value(&h[1]).unwrap();
    assert_eq!(json["event"], "sale");
}

/// While a scheduled event runs, the hints judge the event's profile (the parameters in
/// force) and say so: each hint that changes a parameter names the event, whose
/// `[[routes.events]]` entry is where the change belongs, not `PUT /admin/routes` (the
/// route's own profile). Outside the event, no event is named.
#[test]
fn hints_during_an_event_name_the_event() {
    use rocgate::clock::Nanos;
    use rocgate::engine::Engine;
    use rocgate::limiter::Reason;
    use std::time::SystemTime;
    let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:01:40Z\"\n\
                duration = \"1h\"\nbase_limit = 500\ncut_limit = 150\n";
    let config = Config::from_toml_str(toml, "test").unwrap();
    // The engine starts at wall time 0; the sale from 100 s.
    let engine = Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let id = engine.route_id("r").unwrap();
    let before = engine.route_settings(id).unwrap();
    assert_eq!(
        (&before.event, before.params.base_limit_rps),
        (&None, 200.0)
    );
    // The event takes over at a slot's rollover.
    let _ = engine.check(id, rocgate::engine::Key::None, Nanos::from_secs(101));
    let during = engine.route_settings(id).unwrap();
    assert_eq!(during.event.as_deref(), Some("sale"));
    assert_eq!(during.params.base_limit_rps, 500.0);
    // A third rejected by the base limit while the upstream is healthy.
    let intervals = rejecting(100, 30, 750, (Reason::Limit, 250), 0);
    let h = advise_over(&during, &intervals);
    let raise = find(&h, "raise_base_limit").unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(numbers(&h, "raise_base_limit"), (500.0, 650.0));
    assert_eq!(raise.event.as_deref(), Some("sale"));
    let table = rocgate::hints::table(&h);
    assert!(
        table.contains("base_limit 500 → 650 in event sale"),
        "{table}"
    );
    let json = serde_json::to_value(raise).unwrap();
    assert_eq!(json["event"], "sale");
    // Judged outside the event: no event named, and none in the JSON.
    let h = advise_over(&before, &intervals);
    let raise = find(&h, "raise_base_limit").unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(raise.event, None);
    assert!(serde_json::to_value(raise).unwrap().get("event").is_none());
}

/// What `serve` hands the hints for route `r` of `extra` (TOML lines of the route).
fn engine_settings(extra: &str) -> rocgate::hints::RouteSettings {
    use rocgate::clock::Nanos;
    use rocgate::engine::Engine;
    use std::time::SystemTime;
    let toml = format!("[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n{extra}\n");
    let config = Config::from_toml_str(&toml, "test").unwrap();
    let engine = Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    engine
        .route_settings(engine.route_id("r").unwrap())
        .unwrap()
}

/// 30 one-second intervals of `offered` requests each, the upstream healthy (or 5%
/// failing if `saturated`), none rejected: [`rejecting`] nothing.
fn seconds(offered: u64, saturated: bool) -> Vec<rocgate::hints::Interval> {
    let errors = if saturated { offered / 20 } else { 0 };
    rejecting(0, 30, offered, (Reason::Limit, 0), errors)
}

/// Three two-second spikes against 150 req/s among quiet seconds of [`seconds`] at
/// 100 req/s: 260 admitted a second, the bucket drained half of each (2 rejected by
/// the base limit), the upstream failing 110 of them.
fn drained_spikes() -> Vec<rocgate::hints::Interval> {
    use rocgate::limiter::Reason;
    let mut spikes = seconds(100, false);
    for k in [5, 6, 15, 16, 25, 26] {
        let i = &mut spikes[k];
        i.offered = 262;
        i.rejected[Reason::Limit.index()] = 2;
        i.exhausted_s = 0.5;
        let up = i.upstream.as_mut().unwrap();
        (up.requests, up.errors) = (260, 110);
    }
    spikes
}

/// `raise_min_rps` judged a `concurrency` route quiet by its mean demand, a rate,
/// against a fifth of its base limit, a count in flight, and bounded `min_rps` by half
/// that count: 10 req/s against 64 in flight, with three cuts peaking at 30 req/s,
/// gave `min_rps` 10 → 32, "at most half of" 64 requests in flight read as req/s. How
/// many requests in flight a rate makes depends on the latency, which the route need
/// not measure: the rule is not for `concurrency`.
#[test]
fn a_concurrency_route_gets_no_min_rps_raise_measured_against_its_in_flight_limit() {
    use rocgate::controller::ControllerState;
    let extra = "algorithm = \"concurrency\"\nbase_limit = 64\ncut_limit = 32\nrestore_step = 2\nmin_rps = 10";
    let settings = engine_settings(extra);
    let mut intervals = seconds(10, false);
    for k in [5, 15, 25] {
        let i = &mut intervals[k];
        i.cuts = 1;
        i.cut_roc = 20.0;
        i.peak_demand_rps = 30.0;
        i.in_state[usize::from(ControllerState::Cut.as_index())] = 1.0;
    }
    let h = advise_over(&settings, &intervals);
    assert!(
        find(&h, "raise_min_rps").is_some_and(|h| h.parameter.is_none()),
        "{h:#?}"
    );
    // The same traffic on a token bucket of 64 req/s is quiet, and min_rps is raised
    // above the cuts' peak demand, at most half the base limit.
    let settings = engine_settings("base_limit = 64\ncut_limit = 32\nmin_rps = 10");
    let h = advise_over(&settings, &intervals);
    assert_eq!(numbers(&h, "raise_min_rps"), (10.0, 32.0));
    // Per client, the route's whole demand under a fifth of one client's limit is
    // quiet too, and the raise stays within half of one client's limit.
    let settings =
        engine_settings("partition = \"ip\"\nbase_limit = 64\ncut_limit = 32\nmin_rps = 10");
    assert!(settings.partitioned);
    let h = advise_over(&settings, &intervals);
    assert_eq!(numbers(&h, "raise_min_rps"), (10.0, 32.0));
}

/// On a partitioned route `base_limit` is each key's, while `min_rps` (like ROC) is the
/// route's whole demand: many keys together take many times one key's limit. Lowering
/// each client's limit 200 → 160 took `min_rps` 180 → 80 with it, "above the base
/// limit": a route-wide floor brought under one client's limit, which would let the
/// ROC cut the whole route on what a single client may send. `min_rps` is left alone
/// there.
#[test]
fn a_partitioned_routes_lowered_base_limit_leaves_min_rps_alone() {
    for partition in ["ip", "header:x-api-key"] {
        let settings = engine_settings(&format!("partition = \"{partition}\"\nmin_rps = 180"));
        let h = advise_over(&settings, &seconds(1_000, true));
        assert_eq!(
            numbers(&h, "lower_base_limit"),
            (200.0, 160.0),
            "{partition}"
        );
        assert!(
            h.iter().all(|h| h.parameter.as_deref() != Some("min_rps")),
            "{partition}: {h:#?}"
        );
    }
    // Limited as a whole, the same route's min_rps goes down with its base limit.
    let settings = engine_settings("min_rps = 180");
    let h = advise_over(&settings, &seconds(1_000, true));
    let min = setting(&h, "min_rps");
    assert_eq!(min.suggested, Some(Setting::Number(80.0)));
}

/// `n` one-second intervals from `from_s` with `offered` requests each, `rejected` of
/// them by `reason`; the upstream answered the rest, `errors` of them failing. The
/// interval builders of this file ([`seconds`], [`healthy_seconds`], …) and the tests
/// that need no more than that start from it: nothing else of an interval is set.
fn rejecting(
    from_s: u64,
    n: u64,
    offered: u64,
    rejected: (rocgate::limiter::Reason, u64),
    errors: u64,
) -> Vec<rocgate::hints::Interval> {
    use rocgate::hints::{Interval, UpstreamCounts};
    use std::time::Duration;
    (from_s..from_s + n)
        .map(|k| {
            let mut i = Interval::new(rocgate::clock::Nanos::from_secs(k), Duration::from_secs(1));
            i.offered = offered;
            i.rejected[rejected.0.index()] = rejected.1;
            i.upstream = Some(UpstreamCounts {
                requests: offered - rejected.1,
                errors,
                ..UpstreamCounts::default()
            });
            i
        })
        .collect()
}

/// A partitioned route whose keys were held by its `route_limit`, not by their own
/// limit, is told to raise the total, not its base limit: before, the total's
/// refusals (counted among `limit`) read as the base limit's, and `raise_base_limit`
/// advised raising each key's limit by 30%, which the total would have refused anyway.
#[test]
fn a_route_held_by_its_total_is_told_to_raise_the_total_not_its_base_limit() {
    let keyed = engine_settings("partition = \"ip\"\nroute_limit = 500");
    assert_eq!(keyed.route_limit_rps, Some(500.0));
    let by_total = |reason: Reason, state: ControllerState| {
        let mut intervals = rejecting(0, 30, 1_000, (reason, 300), 0);
        for i in &mut intervals {
            i.route_limit_rejected = 280;
            i.in_state[usize::from(state.as_index())] = 1.0;
        }
        advise_over(&keyed, &intervals)
    };
    // Out of a cut: 28% refused by the total, 2% by the keys' own limit.
    let h = by_total(Reason::Limit, ControllerState::Normal);
    assert!(find(&h, "raise_base_limit").is_none(), "{:#?}", rules(&h));
    assert_eq!(numbers(&h, "raise_route_limit"), (500.0, 650.0));
    let hint = find(&h, "raise_route_limit").unwrap();
    assert_eq!(hint.severity, Severity::Warn);
    assert_eq!(hint.parameter.as_deref(), Some("route_limit"));
    assert_says(
        hint,
        "28.0% of 30000 requests were rejected by the route_limit of 500",
    );
    // The same refusals during a cut are the cut's: neither is raised.
    let h = by_total(Reason::RocCut, ControllerState::Cut);
    assert!(find(&h, "raise_route_limit").is_none(), "{:#?}", rules(&h));
    assert!(find(&h, "raise_base_limit").is_none(), "{:#?}", rules(&h));
    // The keys' own limit refusing, the total refusing few: the base limit, as before.
    let mut intervals = rejecting(0, 30, 1_000, (Reason::Limit, 300), 0);
    for i in &mut intervals {
        i.route_limit_rejected = 20;
    }
    let h = advise_over(&keyed, &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (200.0, 260.0));
    assert!(find(&h, "raise_route_limit").is_none(), "{:#?}", rules(&h));
    // A simulated run counts the total's refusals per slot: 50 req/s against a total
    // of 20, every key's own limit 200, a healthy upstream of 1000 req/s.
    let h = advise(
        "partition = \"ip\"\nroute_limit = 20",
        &steady(50.0),
        Some(1000),
    );
    assert!(find(&h, "raise_base_limit").is_none(), "{:#?}", rules(&h));
    assert_eq!(numbers(&h, "raise_route_limit"), (20.0, 26.0));
}

/// On a fleet sharing a Redis store each instance holds `route_limit ÷` the live
/// instances, and its history its share of the requests: `raise_route_limit` reads
/// the capacity this instance measured for the fleet at the instance count of the
/// interval it was measured in, and suggests the fleet's total within it. A total of
/// 500 over 2 instances (250 each, a burst of 100 ms), 37% refused by it, the upstream
/// saturating once at 300 req/s of this instance's: the fleet's capacity is 600, and
/// its total may be 600 ÷ 1.1, 545; before, the fleet's 500 was held against one
/// instance's 300 and nothing was advised (as it still is for one instance alone).
#[test]
fn raise_route_limit_on_a_fleet_holds_the_share_against_this_instances_capacity() {
    let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\npartition = \"ip\"\n\
                route_limit = 500\nburst = \"100ms\"\n";
    let config = Config::from_toml_str(toml, "test").unwrap();
    let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
    let id = engine.route_id("r").unwrap();
    assert_eq!(engine.route_settings(id).unwrap().route_limit_instances, 1);
    engine.set_route_limit_share(2, Nanos::ZERO);
    let fleet = engine.route_settings(id).unwrap();
    assert_eq!(fleet.route_limit_instances, 2);
    assert_eq!(
        engine
            .route_settings_at(id, Nanos::ZERO)
            .unwrap()
            .route_limit_instances,
        2
    );
    // 39 healthy seconds at the share (400 offered, 150 refused by the total), one
    // saturated at 300 admitted (5% failing).
    let mut intervals = rejecting(0, 40, 400, (Reason::Limit, 150), 0);
    for i in &mut intervals {
        i.route_limit_rejected = 150;
        i.route_limit_instances = 2;
    }
    let last = intervals.last_mut().unwrap();
    last.rejected[Reason::Limit.index()] = 100;
    last.route_limit_rejected = 100;
    last.upstream = Some(rocgate::hints::UpstreamCounts {
        requests: 300,
        errors: 15,
        ..rocgate::hints::UpstreamCounts::default()
    });
    let h = advise_over(&fleet, &intervals);
    let (current, suggested) = numbers(&h, "raise_route_limit");
    assert_eq!(current, 500.0);
    assert!(
        suggested > 500.0 && suggested <= 2.0 * 300.0 / 1.1,
        "{suggested}"
    );
    let hint = find(&h, "raise_route_limit").unwrap();
    assert_says(
        hint,
        "at most 545 so that the instances' full buckets and a second of refill stay within the upstream's capacity as this instance measured it, 600 req/s",
    );
    assert_says(
        hint,
        "shared by 2 instances: this one holds 250 req/s of it",
    );
    // The fleet grown to 4 since: the readings were taken at 2, and the fleet's
    // capacity is still 600 (before, 4 × 273, 1,091, above the upstream's: the 650 of
    // +30% was suggested). Each instance now holds 125.
    let grown = RouteSettings {
        route_limit_instances: 4,
        ..fleet.clone()
    };
    let h = advise_over(&grown, &intervals);
    let (_, suggested) = numbers(&h, "raise_route_limit");
    assert!(
        suggested > 500.0 && suggested <= 2.0 * 300.0 / 1.1,
        "{suggested}"
    );
    assert_says(
        find(&h, "raise_route_limit").unwrap(),
        "shared by 4 instances: this one holds 125 req/s of it",
    );
    for i in &mut intervals {
        i.route_limit_instances = 1;
    }
    let alone = RouteSettings {
        route_limit_instances: 1,
        ..fleet
    };
    let h = advise_over(&alone, &intervals);
    assert!(find(&h, "raise_route_limit").is_none(), "{:#?}", rules(&h));
}

/// 30 one-second intervals, every other one a burst of 400 requests after 100, 150
/// of each burst rejected by the limit; the upstream answered the rest, healthy.
fn bursts_of_400() -> Vec<rocgate::hints::Interval> {
    use rocgate::limiter::Reason;
    (0..30)
        .flat_map(|k| {
            let (offered, rejected) = if k % 2 == 0 { (100, 0) } else { (400, 150) };
            rejecting(k, 1, offered, (Reason::Limit, rejected), 0)
        })
        .collect()
}

/// A `concurrency` route's base limit counts requests in flight, and the upstream's
/// capacity was the admitted rate at which it saturated: 1,000 req/s saturating it
/// behind 64 in flight read as "capacity 1,000" above 64 (lowered 20%, to 51), and a
/// capacity of 15 req/s bounded a raise of 7 in flight... not at all, 15 being above
/// 9.1. The capacity there is the most requests in flight seen (at a slot's end) in
/// the intervals in which the upstream saturated.
#[test]
fn a_concurrency_routes_capacity_is_the_count_in_flight_it_saturated_at() {
    use rocgate::limiter::Reason;
    let settings = engine_settings(
        "algorithm = \"concurrency\"\nbase_limit = 64\ncut_limit = 32\nrestore_step = 2",
    );
    let mut saturated = seconds(1_000, true);
    for (k, i) in saturated.iter_mut().enumerate() {
        i.peak_in_flight = Some(if k % 2 == 0 { 40.0 } else { 38.0 });
    }
    let h = advise_over(&settings, &saturated);
    assert_eq!(numbers(&h, "lower_base_limit"), (64.0, 36.0), "90% of 40");
    let reason = &find(&h, "lower_base_limit").unwrap().reason;
    assert!(reason.contains("about 40 in flight"), "{reason}");
    assert!(reason.contains("64 in flight"), "{reason}");

    // A quarter rejected while the upstream was healthy, but for one second in which
    // it saturated with 8 in flight, taking more than it usually did (20 requests, not
    // 15): 7 → 8, not 7 → 10.
    let settings = engine_settings(
        "algorithm = \"concurrency\"\nbase_limit = 7\ncut_limit = 3\nrestore_step = 1",
    );
    let mut intervals = rejecting(0, 30, 20, (Reason::Concurrency, 5), 0);
    intervals[10] = rejecting(10, 1, 20, (Reason::Concurrency, 0), 1).remove(0);
    intervals[10].peak_in_flight = Some(8.0);
    let h = advise_over(&settings, &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (7.0, 8.0));
    let reason = &find(&h, "raise_base_limit").unwrap().reason;
    assert!(
        reason.contains("the 8 requests in flight at which"),
        "{reason}"
    );
}

/// On a partitioned route `base_limit` is each key's, while the upstream's capacity
/// is what all keys together may send. Compared as they were, a per-client limit was
/// raised to what one client alone could send within capacity (200 → 260 against 1000
/// req/s with 800 admitted), and lowered to 90% of the capacity (200 → 130 under 150)
/// as if one client took it all. Raised, each key's limit scales what the route admits
/// by at most as much: the bound is the route's highest admitted rate scaled to the
/// capacity. Lowered, it holds back only the keys at it: no capacity gives the
/// target, the 20% step does.
#[test]
fn a_partitioned_routes_limit_per_key_is_bounded_by_the_routes_admitted_rate() {
    use rocgate::limiter::Reason;
    let settings = engine_settings("partition = \"ip\"");
    let intervals = rejecting(0, 30, 1_000, (Reason::Limit, 200), 0);
    let h = rocgate::hints::advise(&settings, &intervals, Some(1_000.0), &Policy::default());
    assert_eq!(
        numbers(&h, "raise_base_limit"),
        (200.0, 250.0),
        "200 × 1000 ÷ 800"
    );
    let reason = &find(&h, "raise_base_limit").unwrap().reason;
    assert!(
        reason.contains("highest admitted rate, 800 req/s"),
        "{reason}"
    );
    assert!(reason.contains("200 req/s per key"), "{reason}");

    let h = rocgate::hints::advise(
        &settings,
        &seconds(1_000, true),
        Some(150.0),
        &Policy::default(),
    );
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 160.0));
    let reason = &find(&h, "lower_base_limit").unwrap().reason;
    assert!(reason.contains("only the keys at it"), "{reason}");
    // Limited as a whole, the same route goes to 90% of the capacity.
    let whole = engine_settings("");
    let h = rocgate::hints::advise(
        &whole,
        &seconds(1_000, true),
        Some(150.0),
        &Policy::default(),
    );
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 130.0));
}

/// Where a rule would compare a rate with a count in flight, or the route's demand
/// with one key's limit, and the figure it needs is not observed, it does not fire,
/// and the report says so once per route and rule (in a period with no event): a `raise_burst` of each client's
/// bucket from the route's bursts, and a `raise_danger_roc` from a "false" cut whose
/// demand of 30 req/s was under 64 requests in flight, were suggested before.
#[test]
fn rules_that_cannot_compare_like_with_like_say_so_once_per_route() {
    use rocgate::controller::ControllerState;
    use rocgate::hints::RouteHints;
    // Bursts of 400 req/s after a second of 100, against 300 req/s per client.
    let bursty = bursts_of_400();
    let notes = |h: &[Hint], rule: &str| {
        h.iter()
            .filter(|h| h.rule == rule && h.parameter.is_none())
            .map(|h| h.reason.clone())
            .collect::<Vec<_>>()
    };
    let whole = engine_settings("base_limit = 300");
    let h = advise_over(&whole, &bursty);
    assert_eq!(
        find(&h, "raise_burst").and_then(|h| h.parameter.as_deref()),
        Some("burst")
    );
    let keyed = engine_settings("partition = \"ip\"\nbase_limit = 300");
    let h = advise_over(&keyed, &bursty);
    for rule in ["raise_burst", "raise_danger_roc", "faster_restore"] {
        let said = notes(&h, rule);
        assert_eq!(said.len(), 1, "{rule}: {h:#?}");
        assert!(
            said[0].starts_with("not advised on a partitioned route: "),
            "{}",
            said[0]
        );
        assert_eq!(h.iter().filter(|h| h.rule == rule).count(), 1, "{rule}");
    }
    assert!(notes(&h, "raise_min_rps").is_empty());
    // In the table, and in the admin API's JSON.
    let table = rocgate::hints::table(&h);
    assert!(table.contains("raise_burst: no change"), "{table}");
    let report = RouteHints::new(&keyed, &bursty, None, &Policy::default());
    let json = serde_json::to_value(&report).unwrap();
    let rules: Vec<_> = json["hints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["parameter"].is_null())
        .map(|h| h["rule"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(rules, ["raise_burst", "raise_danger_roc", "faster_restore"]);

    // A cut at 30 req/s of demand while the upstream was healthy.
    let mut intervals = seconds(100, false);
    let i = &mut intervals[5];
    i.cuts = 1;
    i.cut_roc = 20.0;
    i.peak_demand_rps = 30.0;
    i.in_state[usize::from(ControllerState::Cut.as_index())] = 1.0;
    let rate = engine_settings("base_limit = 64\ncut_limit = 32");
    let h = advise_over(&rate, &intervals);
    assert_eq!(
        find(&h, "raise_danger_roc").and_then(|h| h.parameter.as_deref()),
        Some("danger_roc")
    );
    let concurrency = engine_settings(
        "algorithm = \"concurrency\"\nbase_limit = 64\ncut_limit = 32\nrestore_step = 2",
    );
    let h = advise_over(&concurrency, &intervals);
    for rule in ["raise_danger_roc", "raise_min_rps"] {
        let said = notes(&h, rule);
        assert_eq!(said.len(), 1, "{rule}: {h:#?}");
        assert!(
            said[0].starts_with("not advised on a concurrency route: "),
            "{}",
            said[0]
        );
    }
    let said = notes(&h, "faster_restore");
    assert_eq!(said.len(), 1, "faster_restore: {h:#?}");
    assert!(said[0].starts_with("not advised on a concurrency route: "));
    assert!(notes(&h, "raise_burst").is_empty());
    assert_eq!(h[0].rule, "no_change", "{h:#?}");
}

/// A token bucket that demand drains passes base × (1 s + burst) in a spike's first
/// second after a quiet spell. Against 150 req/s the base limit went to 90% of it,
/// 130, and the bucket of 1 s stayed: 260 requests passed in a spike's first second,
/// 110 over, round after round. The burst goes down with the base limit, to what
/// fits: 150 ÷ 130 − 1 s = 153 ms; where demand never drained the bucket (noise under
/// the base limit) no burst was spent, and it stays.
#[test]
fn a_lowered_token_bucket_limit_takes_the_burst_with_it_where_demand_drained_it() {
    use rocgate::limiter::Reason;
    let settings = engine_settings("");
    let spikes = drained_spikes();
    let burst_of = |h: &[Hint]| {
        h.iter()
            .find(|h| h.parameter.as_deref() == Some("burst"))
            .map(|h| {
                (
                    h.rule.clone(),
                    h.current.clone(),
                    h.suggested.clone(),
                    h.severity,
                )
            })
    };
    let h = rocgate::hints::advise(&settings, &spikes, Some(150.0), &Policy::default());
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 130.0));
    assert_eq!(
        burst_of(&h),
        Some((
            "lower_base_limit".into(),
            Some(Setting::Text("1s".into())),
            Some(Setting::Text("153ms".into())),
            Severity::Critical
        )),
        "{h:#?}"
    );
    apply("", &h).unwrap();
    // The same spikes under the base limit, never draining the bucket: the burst stays.
    let mut noise = spikes.clone();
    for i in &mut noise {
        i.rejected[Reason::Limit.index()] = 0;
        i.exhausted_s = 0.0;
    }
    let h = rocgate::hints::advise(&settings, &noise, Some(150.0), &Policy::default());
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 130.0));
    assert_eq!(burst_of(&h), None, "{h:#?}");
    // A bucket small enough already stays too: 130 × 1.1 s = 143 fits 150.
    let small = engine_settings("burst = \"100ms\"");
    let h = rocgate::hints::advise(&small, &spikes, Some(150.0), &Policy::default());
    assert_eq!(burst_of(&h), None, "{h:#?}");
}

/// A scheduled event has controller parameters and no `burst`: a `raise_burst` judged
/// in an event's part named the event ("burst 1s → 2s in event sale"), pointing at an
/// entry that cannot take it. The bucket is the route's: the hint names no event.
#[test]
fn a_burst_hint_in_an_events_part_names_no_event() {
    let bursty = bursts_of_400();
    let mut during = engine_settings("base_limit = 300");
    during.event = Some("sale".into());
    let h = advise_over(&during, &bursty);
    let burst = find(&h, "raise_burst").unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(burst.parameter.as_deref(), Some("burst"));
    assert_eq!(burst.event, None);
    // The base limit is the event's.
    let base = find(&h, "raise_base_limit").unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(base.event.as_deref(), Some("sale"));
}

/// A scheduled event has controller parameters and no `mode`: a shadow route's
/// `shadow_verdict` judged in an event's part named the event ("mode shadow → enforce
/// in event sale"), pointing at an entry that cannot take it, as `raise_burst` did for
/// `burst`. The mode is the route's: the hint names no event.
#[test]
fn a_mode_hint_in_an_events_part_names_no_event() {
    let mut during = engine_settings("mode = \"shadow\"");
    during.event = Some("sale".into());
    let h = advise_over(&during, &seconds(100, false));
    let verdict = find(&h, "shadow_verdict").unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(verdict.parameter.as_deref(), Some("mode"));
    assert_eq!(verdict.event, None, "{verdict:#?}");
}

/// On a partitioned route the base limit is each key's: `raise_min_rps` quoted it as
/// "base limit 200 req/s", the route's whole rate by its units, beside the route's
/// mean demand. It says "req/s per key", as the other rules do.
#[test]
fn a_min_rps_raise_on_a_partitioned_route_quotes_each_keys_base_limit() {
    let h = advise(
        &format!("partition = \"ip\"\n{RELATIVE}"),
        &quiet(4),
        Some(1000),
    );
    let reason = &find(&h, "raise_min_rps")
        .unwrap_or_else(|| panic!("{h:#?}"))
        .reason;
    assert!(reason.contains("base limit 200 req/s per key"), "{reason}");
}

/// Seconds in which the controller held the limit under the base limit (a whole
/// second in `Cut`) and the cut refused requests while the upstream saturated: what was
/// admitted, and kept in flight, was the cut's to bound, not the upstream's. Read as the
/// capacity, a cut limit of 150 req/s took a base limit of 500 to 130 over an upstream
/// measured healthy at 400 req/s in 26 seconds of 30; on a `concurrency` route 32 in
/// flight under the cut took 64 to 28 over an upstream healthy at 50. Such seconds say
/// nothing of the capacity above the cut and are left out of it; a second in a cut
/// that refused nothing (the cut did not bind) still reads as the capacity.
#[test]
fn a_cut_limit_is_not_read_as_the_upstreams_capacity() {
    use rocgate::controller::ControllerState;
    use rocgate::limiter::Reason;
    let cut = usize::from(ControllerState::Cut.as_index());
    let held = |mut i: rocgate::hints::Interval| {
        i.in_state[cut] = 1.0;
        i
    };
    let rate = engine_settings("base_limit = 500\ncut_limit = 150");
    let mut intervals = rejecting(0, 26, 400, (Reason::Limit, 0), 0);
    intervals.extend(
        rejecting(26, 4, 500, (Reason::RocCut, 350), 10)
            .into_iter()
            .map(held),
    );
    let h = advise_over(&rate, &intervals);
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
    // The cut refusing nothing: 150 req/s was all there was, and the upstream,
    // healthy at 100, saturated at it.
    let mut unbound = rejecting(0, 26, 100, (Reason::Limit, 0), 0);
    unbound.extend(
        rejecting(26, 4, 150, (Reason::RocCut, 0), 10)
            .into_iter()
            .map(held),
    );
    let h = advise_over(&rate, &unbound);
    assert_eq!(
        numbers(&h, "lower_base_limit"),
        (500.0, 130.0),
        "90% of 150"
    );

    let concurrency = engine_settings(
        "algorithm = \"concurrency\"\nbase_limit = 64\ncut_limit = 32\nrestore_step = 2",
    );
    let mut intervals = rejecting(0, 26, 400, (Reason::Concurrency, 0), 0);
    for i in &mut intervals {
        i.peak_in_flight = Some(50.0);
    }
    intervals.extend(
        rejecting(26, 4, 500, (Reason::Concurrency, 350), 10)
            .into_iter()
            .map(|mut i| {
                i.peak_in_flight = Some(32.0);
                held(i)
            }),
    );
    let h = advise_over(&concurrency, &intervals);
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
}

/// Under `shadow_adaptive` the cut is not enforced: the base limit is, and what it
/// admitted while the controller was in `Cut` is what the upstream was offered. Seconds
/// in a cut in which the base limit refused a few while the upstream saturated at 396
/// req/s were left out of the capacity as if the cut had pinned them, and
/// `lower_base_limit` took a base limit of 500 to 400, over where the upstream was
/// seen to saturate, instead of to 350 (90% of it, rounded down). An enforced cut's
/// seconds alike are still left out, and lower nothing: the cut set what was admitted
/// there, and a saturation under it is no fault of the base limit's.
#[test]
fn a_cut_in_shadow_adaptive_pins_nothing_of_the_capacity() {
    use rocgate::controller::ControllerState;
    use rocgate::limiter::Reason;
    let cut = usize::from(ControllerState::Cut.as_index());
    let spike = |reason: Reason| {
        let mut intervals = rejecting(0, 26, 300, (Reason::Limit, 0), 0);
        intervals.extend(
            rejecting(26, 4, 400, (reason, 4), 40)
                .into_iter()
                .map(|mut i| {
                    i.in_state[cut] = 1.0;
                    i
                }),
        );
        intervals
    };
    let shadow = engine_settings("mode = \"shadow_adaptive\"\nbase_limit = 500\ncut_limit = 150");
    let h = advise_over(&shadow, &spike(Reason::Limit));
    assert_eq!(
        numbers(&h, "lower_base_limit"),
        (500.0, 350.0),
        "90% of the 396 req/s it saturated at, rounded down"
    );
    let enforced = engine_settings("base_limit = 500\ncut_limit = 150");
    let h = advise_over(&enforced, &spike(Reason::RocCut));
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
}

/// On a `concurrency` route what the base limit would have rejected during recovery
/// is not observed (a request refused under the lowered limit never is in flight, and
/// a count in flight has no rate to hold demand against), so `faster_restore` counted
/// every rejection in recovery as one a faster restore saves: 40% refused in 10 s of
/// recovery doubled `restore_step` 2 → 4, though the base limit of 64 may have refused
/// them all. It does not fire there and says so; a rate route with the same seconds,
/// whose demand of 100 req/s fits its base limit, is still told to restore faster.
#[test]
fn a_concurrency_route_is_not_told_to_restore_faster() {
    use rocgate::controller::ControllerState;
    use rocgate::limiter::Reason;
    let recovering = usize::from(ControllerState::Recovering.as_index());
    let recovery = |reason: Reason| {
        let mut intervals = seconds(100, false);
        intervals.extend(
            rejecting(30, 10, 100, (reason, 40), 0)
                .into_iter()
                .map(|mut i| {
                    i.in_state[recovering] = 1.0;
                    i.peak_in_flight = Some(40.0);
                    i
                }),
        );
        intervals
    };
    let concurrency = engine_settings(
        "algorithm = \"concurrency\"\nbase_limit = 64\ncut_limit = 32\nrestore_step = 2",
    );
    let h = advise_over(&concurrency, &recovery(Reason::Concurrency));
    let restore: Vec<&Hint> = h.iter().filter(|h| h.rule == "faster_restore").collect();
    assert_eq!(restore.len(), 1, "{h:#?}");
    assert_eq!(restore[0].parameter, None, "{h:#?}");
    assert!(
        restore[0]
            .reason
            .starts_with("not advised on a concurrency route: "),
        "{}",
        restore[0].reason
    );
    let rate = engine_settings("base_limit = 200\ncut_limit = 60");
    let h = advise_over(&rate, &recovery(Reason::RocCut));
    assert_eq!(numbers(&h, "faster_restore"), (20.0, 40.0));
}

/// A route's `burst` is in force under its own profile and during its events alike,
/// but a period with an event is judged in parts: bursts of 600 req/s every 10 s over
/// a base limit of 200, and of 160 during a sale from 25 s to 45 s, got "burst 1s →
/// 2s" from the route's own part and "burst 1s → 2s 700ms" from the sale's in one report.
/// One suggestion is left, the smaller (each part bounds it only by its own figures),
/// with both parts' reasoning; the other part says where it went.
#[test]
fn a_route_and_its_event_give_one_burst_suggestion() {
    let extra = "danger_roc = 2000\nsafe_roc = 100\n\
                 [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:25Z\"\n\
                 duration = \"20s\"\nbase_limit = 160";
    let h = advise(extra, &bursts(), Some(1000));
    let bursts: Vec<&Hint> = h
        .iter()
        .filter(|h| h.parameter.as_deref() == Some("burst"))
        .collect();
    assert_eq!(bursts.len(), 1, "{h:#?}");
    let burst = bursts[0];
    assert_eq!(
        burst.suggested,
        Some(Setting::Text("2s".into())),
        "{burst:#?}"
    );
    assert_eq!(burst.event, None);
    assert!(
        burst.reason.contains("under the route's own profile, 2s: ")
            && burst.reason.contains("under event sale, 2s 700ms: "),
        "{}",
        burst.reason
    );
    let note = h
        .iter()
        .find(|h| h.rule == "raise_burst" && h.parameter.is_none())
        .unwrap_or_else(|| panic!("{h:#?}"));
    assert!(
        note.reason
            .starts_with("burst is the route's: one suggestion"),
        "{}",
        note.reason
    );
}

/// Where one part lowers the route's `burst` to spare the upstream and another would
/// raise it for its bursts, the lowering is the one left (the smaller, `critical`),
/// with both parts' figures: a raise from another part's figures must not undo it.
#[test]
fn a_lowered_burst_is_not_raised_by_another_part() {
    let mut own = advise_over(&engine_settings("base_limit = 300"), &bursts_of_400());
    assert_eq!(
        find(&own, "raise_burst").and_then(|h| h.parameter.as_deref()),
        Some("burst")
    );
    let spikes = drained_spikes();
    let mut during = engine_settings("");
    during.event = Some("sale".into());
    let mut sale = rocgate::hints::advise(&during, &spikes, Some(150.0), &Policy::default());
    rocgate::hints::one_per_route_setting([(None, &mut own), (Some("sale"), &mut sale)]);
    let all: Vec<&Hint> = own.iter().chain(&sale).collect();
    let bursts: Vec<&&Hint> = all
        .iter()
        .filter(|h| h.parameter.as_deref() == Some("burst"))
        .collect();
    assert_eq!(bursts.len(), 1, "{all:#?}");
    let burst = bursts[0];
    assert_eq!(
        (burst.severity, &burst.suggested),
        (Severity::Critical, &Some(Setting::Text("153ms".into())))
    );
    assert!(
        burst.reason.contains("under the route's own profile, ")
            && burst.reason.contains("under event sale, 153ms: "),
        "{}",
        burst.reason
    );
}

/// The hints of a shadow route over 30 quiet seconds of its own profile and over
/// `sale`, judged under its event `sale`, made one per route-only setting: the
/// route's part's, then the sale's.
fn shadow_route_and_sale(sale: Vec<rocgate::hints::Interval>) -> (Vec<Hint>, Vec<Hint>) {
    let own_settings = engine_settings("mode = \"shadow\"");
    let mut during = own_settings.clone();
    during.event = Some("sale".into());
    let mut own = advise_over(&own_settings, &seconds(100, false));
    let mut sale = advise_over(&during, &sale);
    rocgate::hints::one_per_route_setting([(None, &mut own), (Some("sale"), &mut sale)]);
    (own, sale)
}

/// A shadow route judged safe to enforce under its own profile, but not during its
/// sale (enforcing would have rejected a fifth of the sale's requests while the
/// upstream was healthy): `mode` is the route's under both, so no part suggests
/// `enforce`, and the route's part says why, quoting the sale's verdict. Before, the
/// route's part suggested `mode = "enforce"` beside the sale's "not safe to enforce".
#[test]
fn a_part_not_safe_to_enforce_withdraws_another_parts_enforce() {
    let mut busy = seconds(100, false);
    for i in &mut busy {
        i.shadow_rejected[Reason::Limit.index()] = 20;
    }
    let (own, sale) = shadow_route_and_sale(busy);
    let verdicts: Vec<&Hint> = own
        .iter()
        .chain(&sale)
        .filter(|h| h.rule == "shadow_verdict")
        .collect();
    assert_eq!(verdicts.len(), 2, "{own:#?} {sale:#?}");
    assert!(
        verdicts.iter().all(|h| h.suggested.is_none()),
        "{verdicts:#?}"
    );
    let own_verdict = find(&own, "shadow_verdict").unwrap();
    assert!(
        own_verdict.reason.contains("safe to enforce")
            && own_verdict
                .reason
                .contains("under event sale: enforcing would have rejected 600 of 3000"),
        "{}",
        own_verdict.reason
    );
}

/// A verdict judged in an event's part names the event where it names a setting the
/// event sets: the change belongs in its `[[routes.events]]` entry, and the hint had
/// no `event` of its own then (it changes no parameter), so a flat list of hints (as
/// `simulate` prints them) did not say whose base limit to raise.
/// Where it points at another hint, that hint's change names the event too. (5% would
/// have been rejected: too few for `raise_base_limit`; a fifth: enough.)
#[test]
fn a_verdict_in_an_events_part_names_the_event_with_its_settings() {
    let mut busy = seconds(100, false);
    for i in &mut busy {
        i.shadow_rejected[Reason::Limit.index()] = 5;
        i.peak_demand_rps = 300.0;
    }
    let (_, sale) = shadow_route_and_sale(busy.clone());
    let verdict = find(&sale, "shadow_verdict").unwrap();
    assert_says(
        verdict,
        "raise base_limit in event sale from 200 req/s toward 300 req/s",
    );
    for i in &mut busy {
        i.shadow_rejected[Reason::Limit.index()] = 20;
    }
    let (_, sale) = shadow_route_and_sale(busy);
    let verdict = find(&sale, "shadow_verdict").unwrap();
    assert_says(
        verdict,
        "see raise_base_limit (base_limit 200 → 260 in event sale)",
    );
}

/// A shadow route judged safe to enforce during its sale but not under its own
/// profile: the sale's `mode = "enforce"` is withdrawn, a hint that changes nothing,
/// and names the sale as such a hint of an event's part does, so that a flat list of
/// both parts' hints (`simulate`'s table) tells the two verdicts apart. It kept the
/// `event` of its withdrawn `mode` (none), and the table printed "shadow_verdict: no
/// change" for both parts alike. (found by helper-171)
#[test]
fn a_withdrawn_suggestion_of_an_events_part_names_the_event() {
    let own_settings = engine_settings("mode = \"shadow\"");
    let mut during = own_settings.clone();
    during.event = Some("sale".into());
    let mut busy = seconds(100, false);
    for i in &mut busy {
        i.shadow_rejected[Reason::Limit.index()] = 20;
    }
    let mut own = advise_over(&own_settings, &busy);
    let mut sale = advise_over(&during, &seconds(100, false));
    rocgate::hints::one_per_route_setting([(None, &mut own), (Some("sale"), &mut sale)]);
    let verdict = find(&sale, "shadow_verdict").unwrap();
    assert_eq!(
        (&verdict.suggested, verdict.event.as_deref()),
        (&None, Some("sale")),
        "{verdict:#?}"
    );
    assert_eq!(find(&own, "shadow_verdict").unwrap().event, None);
}

/// A shadow route's `mode`, which no event takes either, judged safe to enforce under
/// the route's own profile and during its sale: one `mode` suggestion for the route,
/// not two, saying it is one and not "the smallest".
#[test]
fn a_route_and_its_event_give_one_mode_suggestion() {
    let (own, sale) = shadow_route_and_sale(seconds(100, false));
    let modes: Vec<&Hint> = own
        .iter()
        .chain(&sale)
        .filter(|h| h.parameter.as_deref() == Some("mode"))
        .collect();
    assert_eq!(modes.len(), 1, "{own:#?} {sale:#?}");
    assert_eq!(modes[0].suggested, Some(Setting::Text("enforce".into())));
    assert_says(modes[0], "(one suggestion: mode is the route's");
}

/// The classic route's settings (route `r`, enforced, the default controller, neither
/// partitioned nor tiered, no event), limited by a token bucket of 1 s: the tests of
/// another mode, algorithm or parameters take the rest of the settings from it.
fn classic() -> RouteSettings {
    RouteSettings {
        name: "r".to_owned(),
        mode: Mode::Enforce,
        algorithm: Algorithm::TokenBucket {
            burst: Duration::from_secs(1),
        },
        params: ControllerParams::default(),
        partitioned: false,
        tiered: false,
        route_limit_rps: None,
        route_limit_instances: 1,
        distributed: false,
        event: None,
    }
}

/// A quiet route (1 req/s) on which one request in ten, in 3 intervals of 30, took
/// 750 ms: each of those reads as saturated (its p99 is its slowest request), at the
/// route's usual 1 req/s, which the upstream takes healthily in the other 27. Read as
/// the capacity, it lowered the base limit from 200 to 0.9 (critical).
#[test]
fn a_few_slow_requests_at_the_usual_rate_are_no_capacity() {
    let intervals: Vec<Interval> = (0..30u64)
        .map(|k| {
            let mut i = Interval::new(Nanos::from_secs(10 * k), Duration::from_secs(10));
            i.offered = 10;
            i.in_state[usize::from(ControllerState::Normal.as_index())] = 10.0;
            let mut latency = rocgate::hints::Sketch::new();
            latency.record_n(0.005, 9);
            latency.record(if k % 10 == 3 { 0.75 } else { 0.005 });
            i.upstream = Some(UpstreamCounts {
                requests: 10,
                errors: 0,
                latency,
            });
            i
        })
        .collect();
    let h = advise_over(&classic(), &intervals);
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
}

/// 100 req/s for 20 s, 99 of each 100 answered in 400 ms and one in 600 ms: a p99 of
/// 400 ms, within the 500 ms budget. The meter counts the 400 ms ones under its
/// 500 ms bound, which the sketch held as 512 ms: every second read as saturated and
/// the base limit was to be lowered from 200 to 90 (critical).
#[test]
fn a_p99_within_the_latency_budget_is_healthy() {
    use rocgate::engine::{Engine, Key};
    use rocgate::hints::{History, UpstreamMeter};
    let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\ndanger_roc = 5000\nsafe_roc = 100\n";
    let config = Config::from_toml_str(toml, "test").unwrap();
    let engine = Engine::new(&config, Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    let id = engine.route_at(0).unwrap();
    let meter = UpstreamMeter::new();
    let route: std::sync::Arc<str> = "r".into();
    let mut history = History::new(Duration::from_secs(1), Duration::from_secs(3600));
    let settings = || engine.route_settings(id).unwrap();
    history.tick(
        Nanos::ZERO,
        &engine.snapshot(Nanos::ZERO),
        [settings()],
        Some(&meter),
    );
    for sec in 0..20u64 {
        for n in 0..100u64 {
            let now = Nanos::from_millis(sec * 1000 + n * 10);
            if engine.check(id, Key::None, now).is_admit() {
                let took = if n == 50 { 600 } else { 400 };
                meter.record(&route, Duration::from_millis(took), false);
            }
        }
        let now = Nanos::from_secs(sec + 1);
        history.tick(now, &engine.snapshot(now), [settings()], Some(&meter));
    }
    let (st, intervals) = history.since(Nanos::ZERO).remove(0);
    let h = advise_over(&st, &intervals);
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
    assert_eq!(rules(&h), ["no_change"], "{h:#?}");
}

/// Three cuts on a quiet route (10 req/s) whose spikes to 80 req/s saturated the
/// upstream (10 of 60 forwarded failed): the cuts were needed. Counted with the
/// others, they made `raise_min_rps` ask for min_rps above their peak (10 → 96),
/// which would have stopped them all.
#[test]
fn needed_cuts_do_not_raise_min_rps_above_them() {
    let spiking = |failed: u64| -> Vec<Interval> {
        (0..30u64)
            .map(|k| {
                let mut i = Interval::new(Nanos::from_secs(k), Duration::from_secs(1));
                let spike = k % 10 == 5;
                i.offered = if spike { 80 } else { 10 };
                let mut errors = 0;
                if spike {
                    i.cuts = 1;
                    i.cut_roc = 100.0;
                    i.peak_demand_rps = 80.0;
                    i.in_state[usize::from(ControllerState::Cut.as_index())] = 1.0;
                    i.rejected[Reason::RocCut.index()] = 20;
                    errors = failed;
                } else {
                    i.in_state[usize::from(ControllerState::Normal.as_index())] = 1.0;
                    i.peak_demand_rps = 10.0;
                }
                i.upstream = Some(UpstreamCounts {
                    requests: i.offered - i.rejected_total(),
                    errors,
                    ..UpstreamCounts::default()
                });
                i
            })
            .collect()
    };
    let h = advise_over(&classic(), &spiking(10));
    assert!(find(&h, "raise_min_rps").is_none(), "{h:#?}");
    // The same cuts over a healthy upstream guarded nothing: raise it above them.
    let h = advise_over(&classic(), &spiking(0));
    let (current, suggested) = numbers(&h, "raise_min_rps");
    assert_eq!(current, 10.0);
    assert!(suggested > 80.0, "{suggested}");
    assert!(
        find(&h, "raise_min_rps")
            .unwrap()
            .reason
            .starts_with("3 cuts on a quiet route while the upstream was not saturated"),
        "{h:#?}"
    );
}

/// 300 req/s against a base limit of 200 for 30 s: raise it to 260. Once raised, 250
/// req/s are all admitted, yet the hour of history kept the rejections made at 200
/// and judged them against 260: "17% rejected by the base limit of 260", raise it
/// again to 340, and so on at every report. A change of the route's settings drops
/// what came before it.
#[test]
fn advice_applied_is_not_advised_again_on_what_came_before() {
    use rocgate::engine::{Engine, Key};
    use rocgate::hints::{History, UpstreamMeter};
    let cfg = |base: u32| {
        let toml = format!(
            "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\ndanger_roc = 5000\nsafe_roc = 100\nbase_limit = {base}\n"
        );
        Config::from_toml_str(&toml, "test").unwrap()
    };
    let meter = UpstreamMeter::new();
    let route: std::sync::Arc<str> = "r".into();
    let mut history = History::new(Duration::from_secs(1), Duration::from_secs(3600));
    let settings = |e: &Engine| e.route_settings(e.route_at(0).unwrap()).unwrap();
    let run = |engine: &Engine, history: &mut History, from: u64, to: u64, rate: u64| {
        let id = engine.route_at(0).unwrap();
        for sec in from..to {
            for n in 0..rate {
                let now = Nanos::new(sec * 1_000_000_000 + n * 1_000_000_000 / rate);
                if engine.check(id, Key::None, now).is_admit() {
                    meter.record(&route, Duration::from_millis(5), false);
                }
            }
            let now = Nanos::from_secs(sec + 1);
            history.tick(now, &engine.snapshot(now), [settings(engine)], Some(&meter));
        }
    };
    let engine = Engine::new(&cfg(200), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
    history.tick(
        Nanos::ZERO,
        &engine.snapshot(Nanos::ZERO),
        [settings(&engine)],
        Some(&meter),
    );
    run(&engine, &mut history, 0, 30, 300);
    let (st, iv) = history.since(Nanos::ZERO).remove(0);
    let first = advise_over(&st, &iv);
    assert_eq!(numbers(&first, "raise_base_limit"), (200.0, 260.0));

    let wall = std::time::UNIX_EPOCH + Duration::from_secs(30);
    let engine = engine
        .reload(&cfg(260), Nanos::from_secs(30), wall)
        .unwrap();
    run(&engine, &mut history, 30, 60, 250);
    let (st, iv) = history.since(Nanos::ZERO).remove(0);
    assert!(iv.iter().all(|i| i.start >= Nanos::from_secs(30)), "{iv:?}");
    assert_eq!(iv.iter().map(|i| i.rejected_total()).sum::<u64>(), 0);
    let second = advise_over(&st, &iv);
    assert!(find(&second, "raise_base_limit").is_none(), "{second:#?}");
}

/// An upstream that degrades at its usual rate, saturated in most seconds, is still
/// told to lower the base limit: a saturation at the usual rate is left out of the
/// capacity only while it is the exception.
#[test]
fn an_upstream_degraded_at_the_usual_rate_still_lowers_the_base_limit() {
    for (healthy, degraded_rate) in [(10u64, 100u64), (1, 100), (10, 80)] {
        let mut intervals = rejecting(0, healthy, 100, (Reason::Limit, 0), 0);
        intervals.extend(rejecting(
            healthy,
            30 - healthy,
            degraded_rate,
            (Reason::Limit, 0),
            degraded_rate / 10,
        ));
        let h = advise_over(&classic(), &intervals);
        assert!(
            find(&h, "lower_base_limit").is_some(),
            "{healthy} healthy at 100, saturated at {degraded_rate}: {:?}",
            rules(&h)
        );
    }
}

/// 20 one-second intervals of route `r` (default config) offered `rate` req/s, each
/// request admitted taking `took` upstream, through the proxy's meter and history.
fn metered(rate: u64, took: Duration) -> (RouteSettings, Vec<Interval>) {
    let config =
        Config::from_toml_str("[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n", "t").unwrap();
    let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
    let id = engine.route_at(0).unwrap();
    let settings = classic();
    let meter = UpstreamMeter::new();
    let route: Arc<str> = "r".into();
    let mut history = History::new(Duration::from_secs(1), Duration::from_secs(3600));
    let snapshot = |at| engine.snapshot(at);
    history.tick(
        Nanos::ZERO,
        &snapshot(Nanos::ZERO),
        [settings.clone()],
        Some(&meter),
    );
    for sec in 0..20u64 {
        for k in 0..rate {
            let now = Nanos::new(sec * 1_000_000_000 + k * 1_000_000_000 / rate);
            if engine.check(id, Key::None, now).is_admit() {
                meter.record(&route, took, false);
            }
        }
        let end = Nanos::from_secs(sec + 1);
        history.tick(end, &snapshot(end), [settings.clone()], Some(&meter));
    }
    let mut groups = history.since(Nanos::ZERO);
    assert_eq!(groups.len(), 1);
    groups.remove(0)
}

/// A latency budget between two of the old meter's bounds (250 ms: 200 and 300) read
/// every request of 210 ms as 300 ms: each interval saturated, and a healthy route
/// was to be lowered from 200 to 90 req/s.
#[test]
fn requests_within_a_latency_budget_off_the_old_bounds_are_healthy() {
    let (settings, intervals) = metered(100, Duration::from_millis(210));
    let mut policy = Policy::default();
    policy.latency_budget = Duration::from_millis(250);
    let h = rocgate::hints::advise(&settings, &intervals, None, &policy);
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
    // Over it, the same route is saturated throughout.
    let (settings, intervals) = metered(100, Duration::from_millis(300));
    let h = rocgate::hints::advise(&settings, &intervals, None, &policy);
    assert!(find(&h, "lower_base_limit").is_some(), "{h:#?}");
}

/// The longest budget the config takes can be exceeded: requests of 58 s make the
/// upstream saturated under it, requests of 50 s do not. (The meter holds every
/// latency above 55 s in its last bucket: a budget of a minute was never exceeded.)
#[test]
fn the_longest_latency_budget_can_be_exceeded() {
    let mut policy = Policy::default();
    policy.latency_budget = Policy::LONGEST_LATENCY_BUDGET;
    let (settings, intervals) = metered(100, Duration::from_secs(58));
    let h = rocgate::hints::advise(&settings, &intervals, None, &policy);
    assert!(find(&h, "lower_base_limit").is_some(), "{h:#?}");
    let (settings, intervals) = metered(100, Duration::from_secs(50));
    let h = rocgate::hints::advise(&settings, &intervals, None, &policy);
    assert!(find(&h, "lower_base_limit").is_none(), "{h:#?}");
}

/// The p99 a reason quotes is the upstream's, within the histogram's 9%: 11 ms, not
/// the old meter's bound above it (20 ms).
#[test]
fn the_quoted_upstream_p99_is_within_nine_percent() {
    let (settings, intervals) = metered(300, Duration::from_millis(11));
    let h = advise_over(&settings, &intervals);
    let raise = find(&h, "raise_base_limit").expect("a raise");
    assert_says(raise, "p99 11 ms");
}
/// `n` one-second intervals in `state`, each of `offered` requests of which `rejected`
/// by `reason`, the upstream healthy with the rest.
fn healthy_seconds(
    n: u64,
    (offered, rejected): (u64, u64),
    reason: Reason,
    state: ControllerState,
) -> Vec<Interval> {
    in_state(rejecting(0, n, offered, (reason, rejected), 0), state)
}

/// `intervals`, each spent wholly in `state` (the rules judge a route's recovery, or its
/// cuts, by the time in each state).
fn in_state(mut intervals: Vec<Interval>, state: ControllerState) -> Vec<Interval> {
    for i in &mut intervals {
        i.in_state[usize::from(state.as_index())] = 1.0;
    }
    intervals
}

/// `n` one-second intervals in `Normal` at `usual` req/s, healthy and none rejected,
/// but for the last of every `every`: a burst of `offered` requests of which `rejected`
/// by the base limit, the bucket empty half that second, `errors` of those admitted
/// failing upstream.
fn bursting(
    n: u64,
    every: u64,
    usual: u64,
    (offered, rejected, errors): (u64, u64, u64),
) -> Vec<Interval> {
    let seconds = (0..n).flat_map(|k| {
        if k % every == every - 1 {
            let mut burst = rejecting(k, 1, offered, (Reason::Limit, rejected), errors);
            burst[0].exhausted_s = 0.5;
            burst
        } else {
            rejecting(k, 1, usual, (Reason::Limit, 0), 0)
        }
    });
    in_state(seconds.collect(), ControllerState::Normal)
}

fn suggested_by(h: &[Hint], param: &str) -> Option<f64> {
    h.iter()
        .find(|h| h.parameter.as_deref() == Some(param) && h.suggested.is_some())
        .and_then(|h| match &h.suggested {
            Some(Setting::Number(x)) => Some(*x),
            _ => None,
        })
}

fn suggested_secs(h: &[Hint], param: &str) -> Option<f64> {
    h.iter()
        .find(|h| h.parameter.as_deref() == Some(param) && h.suggested.is_some())
        .and_then(|h| match &h.suggested {
            Some(Setting::Text(t)) => humantime::parse_duration(t).ok().map(|d| d.as_secs_f64()),
            _ => None,
        })
}

/// raise_base_limit and raise_burst in one report stay within the known capacity
/// together: the burst is bounded at the raised base limit. (Each was bounded on its
/// own: 260 × (1 s + 4 s) against 1,000 req/s.)
#[test]
fn raised_base_and_raised_burst_together_stay_within_the_capacity() {
    // 10 cycles of 10 s: 9 s at 100 req/s (nothing rejected), then 1 s at 1000 req/s of
    // which a full 1 s bucket at 200 admits 400 (600 rejected by the base limit).
    let intervals = bursting(100, 10, 100, (1000, 600, 0));
    let cap = 1000.0;
    let h = rocgate::hints::advise(&classic(), &intervals, Some(cap), &Policy::default());
    let base = suggested_by(&h, "base_limit").expect("raise_base_limit");
    let burst = suggested_secs(&h, "burst").expect("raise_burst");
    assert!(
        base * (1.0 + burst) <= cap,
        "base {base} × (1 s + burst {burst} s) = {} > capacity {cap}",
        base * (1.0 + burst)
    );
}

/// A reload that rebuilds a route (here: its path changes; its parameters do not)
/// starts its counters from zero, and the history counts them from zero. (It diffed
/// them against the old route's: 1,100 offered and 981 rejected for 2,100 and 981.)
#[test]
fn a_rebuilt_route_is_not_diffed_against_the_old_routes_counters() {
    let toml = |prefix: &str| {
        Config::from_toml_str(
            &format!("[[routes]]\nname = \"r\"\npath_prefix = \"{prefix}\"\n"),
            "test",
        )
        .unwrap()
    };
    let s = Nanos::from_secs;
    let wall = |t: u64| UNIX_EPOCH + Duration::from_secs(t);
    let engine = Engine::new(&toml("/"), Nanos::ZERO, UNIX_EPOCH).unwrap();
    let mut h = History::new(Duration::from_secs(10), Duration::from_secs(3600));
    let settings = |e: &Engine| e.route_settings(e.route_at(0).unwrap()).unwrap();
    h.tick(s(0), &engine.snapshot(s(0)), [settings(&engine)], None);
    // 0..10 s: 100 req/s, all admitted.
    for t in 0..10 {
        for _ in 0..100 {
            let _ = engine.check(engine.route_at(0).unwrap(), Key::None, s(t));
        }
    }
    h.tick(s(10), &engine.snapshot(s(10)), [settings(&engine)], None);
    // A reload at 12 s changes only the route's path.
    let engine = engine.reload(&toml("/api"), s(12), wall(12)).unwrap();
    assert_eq!(settings(&engine).params, ControllerParams::default());
    // 13..20 s: 300 req/s against the bucket of 200.
    let (mut offered, mut rejected) = (0u64, 0u64);
    for t in 13..20 {
        for _ in 0..300 {
            offered += 1;
            if !engine
                .check(engine.route_at(0).unwrap(), Key::None, s(t))
                .is_admit()
            {
                rejected += 1;
            }
        }
    }
    h.tick(s(20), &engine.snapshot(s(20)), [settings(&engine)], None);
    let kept = h.since(s(10));
    let i = &kept[0].1[0];
    assert_eq!((i.offered, i.rejected_total()), (offered, rejected));
}

/// Without any measure of the upstream (no `--capacity`; the layer without a meter),
/// health is unknown and the rules that need it stay silent. (A cut was judged false,
/// and danger_roc raised, the reason saying the upstream "was not saturated".)
#[test]
fn an_unmeasured_upstream_is_not_reported_as_not_saturated() {
    // A 20 → 180 req/s step; nothing says whether the upstream took 180 req/s.
    let step = vec![(0.0, 20.0), (30.0, 20.0), (30.0, 180.0), (60.0, 180.0)];
    let h = advise("", &step, None);
    assert!(
        h.iter().all(|h| h.rule != "raise_danger_roc"),
        "raise_danger_roc on an upstream nobody measured"
    );
}

/// `current` is the value in force, not rounded (it was, down to 100 ms).
#[test]
fn a_current_duration_is_the_value_in_force() {
    let mut settings = classic();
    settings.params.restore_step_rps = 100.0; // more than half the cut's depth of 140
    settings.params.restore_interval = Duration::from_millis(1250);
    // 10 s recovering at 150 req/s, a third rejected by the lowered limit, healthy.
    let intervals = healthy_seconds(10, (150, 50), Reason::RocCut, ControllerState::Recovering);
    let h = advise_over(&settings, &intervals);
    let hint = setting(&h, "restore_interval");
    assert_eq!(hint.current, Some(Setting::Text("1s 250ms".into())));
}

/// A lowered burst never reads as no change. (With `current` rounded down to 100 ms,
/// 1550 ms lowered to 1500 ms read "burst 1s 500ms → 1s 500ms", critical.)
#[test]
fn a_lowered_burst_does_not_read_as_no_change() {
    let mut settings = classic();
    settings.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_millis(1550),
    };
    let intervals = bursting(30, 5, 100, (502, 2, 100));
    let h = rocgate::hints::advise(&settings, &intervals, Some(400.0), &Policy::default());
    let burst = setting(&h, "burst");
    assert_ne!(burst.current, burst.suggested);
}

/// Steady Poisson traffic at 150 req/s under the classic route (no cut), the upstream
/// healthy but for one interval in sixty (the 20th) with 2% errors (a deploy, a bad
/// node): one saturated interval at the usual rate is no capacity, and no ramp either.
/// (lower_danger_roc read the ROC noise of that interval as a ramp and asked,
/// critical, to lower danger_roc towards safe_roc: a controller then cutting on noise.)
#[test]
fn one_bad_interval_at_the_usual_rate_is_no_ramp() {
    use rocgate::sim::{ArrivalModel, Profile, Simulator};
    let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\ndanger_roc = 2000\n";
    let config = Config::from_toml_str(toml, "test").unwrap();
    let sim = Simulator::new(config.clone(), Some("r")).unwrap();
    let profile = Profile::from_points(&[(0.0, 150.0), (60.0, 150.0)]).unwrap();
    let run = sim
        .run_profile_all(&profile, ArrivalModel::Poisson { seed: 7 })
        .unwrap();
    let route = &config.routes[0];
    let mut intervals = hints::intervals(
        &run.routes[0],
        route.window.slots() / 2,
        &route.algorithm,
        false,
        &[],
    );
    for (k, i) in intervals.iter_mut().enumerate() {
        let requests = i.admitted();
        i.upstream = Some(UpstreamCounts {
            requests,
            errors: if k == 19 { requests / 50 } else { 0 },
            ..UpstreamCounts::default()
        });
    }
    let mut settings = classic();
    settings.params = route.controller.clone();
    settings.params.danger_roc = 80.0; // judged against the classic thresholds
    let h = advise_over(&settings, &intervals);
    assert!(h.iter().all(|h| h.rule != "lower_base_limit"));
    assert!(
        h.iter().all(|h| h.rule != "lower_danger_roc"),
        "critical on one bad interval"
    );
}

/// On a route with tiers, a tier's limit rejects as `Reason::Limit`, as the base
/// limit does: raise_base_limit is not advised there. (A batch key held to its tier's
/// 10 req/s got the base limit of the keys in no tier, none of them rejected, raised
/// at every report.)
#[test]
fn a_tiers_rejections_do_not_raise_the_routes_base_limit() {
    use rocgate::hints::UpstreamMeter;
    use std::sync::Arc;
    let toml = "[[routes]]\nname = \"search\"\npath_prefix = \"/\"\n\
                partition = \"header:x-api-key\"\nbase_limit = 50\ncut_limit = 15\n\
                restore_step = 5\ndanger_roc = 400\nsafe_roc = 100\n\
                [[routes.tiers]]\nname = \"batch\"\nvalues = [\"key-nightly-export\"]\n\
                base_limit = 10\ncut_limit = 10\n";
    let config = Config::from_toml_str(toml, "test").unwrap();
    let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
    let id = engine.route_at(0).unwrap();
    let meter = UpstreamMeter::new();
    let route: Arc<str> = "search".into();
    let mut h = History::new(Duration::from_secs(1), Duration::from_secs(3600));
    let settings = || engine.route_settings(id).unwrap();
    h.tick(
        Nanos::ZERO,
        &engine.snapshot(Nanos::ZERO),
        [settings()],
        Some(&meter),
    );
    let keys: Vec<String> = (0..20).map(|k| format!("key-{k}")).collect();
    let mut untiered_rejected = 0u64;
    for t in 0..30u64 {
        for n in 0..100u64 {
            let now = Nanos::from_millis(t * 1000 + n * 10);
            if engine
                .check(id, Key::Value("key-nightly-export"), now)
                .is_admit()
            {
                meter.record(&route, Duration::from_millis(5), false);
            }
            if n % 5 == 0 {
                for k in &keys {
                    if engine.check(id, Key::Value(k), now).is_admit() {
                        meter.record(&route, Duration::from_millis(5), false);
                    } else {
                        untiered_rejected += 1;
                    }
                }
            }
        }
        let now = Nanos::from_secs(t + 1);
        engine.catch_up(id, now);
        h.tick(now, &engine.snapshot(now), [settings()], Some(&meter));
    }
    assert_eq!(
        untiered_rejected, 0,
        "the keys in no tier were never rejected"
    );
    let groups = h.since(Nanos::ZERO);
    let (s, intervals) = &groups[0];
    let hints = advise_over(s, intervals);
    let raise: Vec<&Hint> = hints
        .iter()
        .filter(|h| h.rule == "raise_base_limit")
        .collect();
    assert_eq!(raise.len(), 1, "{hints:#?}");
    assert_eq!(raise[0].suggested, None, "{:?}", raise[0]);
    assert!(
        raise[0]
            .reason
            .starts_with("not advised on a route with tiers: "),
        "{}",
        raise[0].reason
    );
}

/// A raised base limit widens the gap a restore climbs: with a slow restore it is
/// bounded by what a restore covers in 7 days, as the config requires. (A raise the
/// config then refused was suggested.)
#[test]
fn a_raised_base_limit_is_one_the_config_accepts() {
    let mut settings = classic();
    settings.params.restore_interval = Duration::from_secs(20 * 3600); // 8 steps in 7 days: 220 at most
    let intervals = healthy_seconds(30, (300, 100), Reason::Limit, ControllerState::Normal);
    let h = advise_over(&settings, &intervals);
    let base = suggested_by(&h, "base_limit").expect("raise_base_limit");
    let json = format!("{{\"base_limit\": {base}}}");
    let r =
        rocgate::config::patch_controller(&settings.params, &settings.algorithm, &json, "hints");
    assert!(r.is_ok(), "{json}: {}", r.unwrap_err());
}

/// "healthy throughout" is said only of a period every interval of which was
/// measured: with 10 of 30 intervals forwarding nothing the upstream measured (no
/// upstream figures), the raise said "healthy throughout" of 20 seconds. It says how
/// many intervals were measured and how many not.
#[test]
fn health_is_claimed_only_of_the_intervals_measured() {
    let settings = engine_settings("");
    let mut intervals = rejecting(0, 30, 300, (Reason::Limit, 60), 0);
    for i in &mut intervals[..10] {
        i.upstream = None;
    }
    let h = advise_over(&settings, &intervals);
    let raise = find(&h, "raise_base_limit").unwrap_or_else(|| panic!("{h:#?}"));
    assert_says(
        raise,
        "the upstream was healthy in all 20 measured intervals (10 not measured)",
    );
    // Saturated in some of them: the unmeasured are counted too.
    for i in &mut intervals[10..11] {
        i.upstream.as_mut().unwrap().errors = 100;
    }
    let h = advise_over(&settings, &intervals);
    let raise = find(&h, "raise_base_limit").unwrap_or_else(|| panic!("{h:#?}"));
    assert_says(
        raise,
        "healthy in 19 of 20 measured intervals, saturated in 1 (10 not measured)",
    );
    // Every interval measured: throughout.
    let h = advise_over(&settings, &rejecting(0, 30, 300, (Reason::Limit, 60), 0));
    let raise = find(&h, "raise_base_limit").unwrap_or_else(|| panic!("{h:#?}"));
    assert_says(raise, "the upstream was healthy throughout");
}

/// A shadow route rejects nothing, and its `RouteHints` said "0 rejected" beside a
/// verdict that enforcing would have rejected a fifth: they count what it would have
/// rejected, apart from what it did.
#[test]
fn a_shadow_routes_hints_count_what_it_would_have_rejected() {
    let settings = engine_settings("mode = \"shadow\"");
    let mut intervals = seconds(300, false);
    for i in &mut intervals {
        i.shadow_rejected[Reason::Limit.index()] = 60;
    }
    // As `GET /admin/hints` returns it.
    let r = rocgate::hints::RouteHints::new(&settings, &intervals, None, &Policy::default());
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        (
            &json["offered"],
            &json["rejected"],
            &json["shadow_rejected"]
        ),
        (&9000.into(), &0.into(), &1800.into()),
        "{json}"
    );
    // An enforcing route would have rejected nothing more than it did.
    let r = rocgate::hints::RouteHints::new(
        &engine_settings(""),
        &rejecting(0, 30, 300, (Reason::Limit, 60), 0),
        None,
        &Policy::default(),
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(
        (&json["rejected"], &json["shadow_rejected"]),
        (&1800.into(), &0.into()),
        "{json}"
    );
}

/// The table sized its route column by the names' bytes and padded them by `char`s:
/// a route named "日本" (6 bytes, 2 chars) beside "r" widened the column to 6, four
/// spaces past the longest name. (The columns stayed aligned, each name padded to the
/// same count of chars; a wide character still takes two places on a terminal, which
/// a count of chars does not know.)
#[test]
fn the_tables_route_column_is_as_wide_as_the_longest_name() {
    let mut hints = Vec::new();
    for name in ["日本", "r"] {
        let mut settings = engine_settings("");
        settings.name = name.into();
        hints.extend(advise_over(&settings, &seconds(300, false)));
    }
    let table = rocgate::hints::table(&hints);
    // Each route's "no change" line: where its severity begins, in chars: two spaces,
    // the column of 2, two spaces.
    let severity: Vec<Option<usize>> = table
        .lines()
        .filter(|l| l.contains("info"))
        .map(|l| l.find("info").map(|b| l[..b].chars().count()))
        .collect();
    assert_eq!(severity, [Some(6), Some(6)], "{table}");
}

/// A `shadow` route got no `base_limit` or `burst` suggestion: `raise_base_limit` and
/// `raise_burst` judged rejections, and a shadow route makes none, so only the
/// verdict's text said what to raise. What enforcing would have rejected by the base
/// limit counts as its rejections there: 300 req/s against a base limit of 200 and a
/// healthy upstream of 1,000 gets 200 → 260 as an enforcing route does (`info`:
/// nothing is rejected yet), and the verdict points at it; bursts over the bucket get
/// a larger one.
#[test]
fn a_shadow_route_gets_the_limits_enforcing_would_need() {
    let h = advise("mode = \"shadow\"", &steady(300.0), Some(1000));
    assert_eq!(numbers(&h, "raise_base_limit"), (200.0, 260.0), "{h:#?}");
    let raise = find(&h, "raise_base_limit").unwrap();
    assert_eq!(raise.severity, Severity::Info);
    assert!(
        raise.reason.starts_with(
            "enforcing would have rejected 32.2% of 18000 requests by the base limit of 200 req/s"
        ),
        "{}",
        raise.reason
    );
    let verdict = find(&h, "shadow_verdict").unwrap();
    assert_says(verdict, "see raise_base_limit (base_limit 200 → 260)");
    let h = advise(
        "mode = \"shadow\"\ndanger_roc = 2000\nsafe_roc = 100",
        &bursts(),
        Some(1000),
    );
    let burst = find(&h, "raise_burst").unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(
        (&burst.current, &burst.suggested),
        (
            &Some(Setting::Text("1s".into())),
            &Some(Setting::Text("2s".into()))
        )
    );
    assert!(
        burst
            .reason
            .starts_with("what enforcing would have rejected comes in bursts"),
        "{}",
        burst.reason
    );
}

/// A `shadow` route got no `faster_restore`: the rule read what was rejected during
/// recovery, and a shadow route rejects nothing, its would-be rejections in
/// `shadow_rejected`. A spike of 400 req/s against a base limit of 200 and a healthy
/// upstream of 1,000, which an enforcing route is told to restore faster from (20 →
/// 40), tells a `shadow` route the same (`info`: nothing is rejected yet), and a
/// `shadow_adaptive` one, whose base limit's rejections are its own and whose
/// restoring limit's are would-be ones, too. The verdict, whose would-be rejections by
/// the cut include those while restoring, pointed at the cut's settings only.
#[test]
fn a_shadow_route_that_recovers_slowly_is_told_to_restore_faster() {
    let spike = spike_to_400();
    for mode in ["shadow", "shadow_adaptive"] {
        let h = advise(&format!("mode = \"{mode}\""), &spike, Some(1000));
        assert_eq!(
            numbers(&h, "faster_restore"),
            (20.0, 40.0),
            "{mode}: {h:#?}"
        );
        let restore = find(&h, "faster_restore").unwrap();
        assert_eq!(restore.severity, Severity::Info, "{mode}");
        assert!(
            restore.reason.starts_with("enforcing would have rejected "),
            "{mode}: {}",
            restore.reason
        );
        // The verdict points at it for the cut's would-be rejections while restoring,
        // beside its own tuning of the cut.
        let verdict = find(&h, "shadow_verdict").unwrap();
        assert!(
            verdict.reason.contains(
                "(their demand peaked at 400 req/s), and for those while it restored the limit: see faster_restore (restore_step 20 → 40)"
            ),
            "{mode}: {}",
            verdict.reason
        );
        // An upstream that saturates during the recovery says the pace is right.
        let h = advise(&format!("mode = \"{mode}\""), &spike, Some(150));
        assert!(
            find(&h, "faster_restore").is_none(),
            "{mode}: {:#?}",
            rules(&h)
        );
    }
}

/// The share of the rejections `raise_base_limit` counts as the base limit's (the first
/// percentage its reason quotes), and that reason, for the route of `extra` under
/// [`spike_to_400`] at a capacity of 1,000 req/s; the test fails, naming `extra`, if it
/// gives no `raise_base_limit`.
fn base_limits_share(extra: &str) -> (f64, String) {
    let h = advise(extra, &spike_to_400(), Some(1000));
    let reason = &find(&h, "raise_base_limit")
        .unwrap_or_else(|| panic!("{extra}: {h:#?}"))
        .reason;
    let end = reason.find('%').unwrap();
    let start = reason[..end].rfind(' ').map_or(0, |s| s + 1);
    (reason[start..end].parse::<f64>().unwrap(), reason.clone())
}

/// The share `raise_base_limit` quotes is what the base limit itself would have
/// refused. While a cut holds the limit below base (cut and recovery), an enforcing
/// route labels every refusal `roc_cut`, those of demand beyond the base limit's rate
/// too, and a `shadow` route's would-be refusals are labelled so as well:
/// `shadow_adaptive`, which enforces its base limit throughout, quoted 43.3% of a spike
/// of 400 req/s against 200, the other two 27.9%. Demand beyond the base limit's rate
/// in an interval counts as the base limit's, up to what the cut refused there.
#[test]
fn the_base_limits_share_is_the_same_in_every_mode() {
    let share = |mode: &str| base_limits_share(&format!("mode = \"{mode}\""));
    let (adaptive, why) = share("shadow_adaptive");
    assert_eq!(adaptive, 43.3, "{why}");
    for mode in ["enforce", "shadow"] {
        let (quoted, why) = share(mode);
        assert!((quoted - adaptive).abs() <= 0.5, "{mode}: {why}");
        assert!(
            why.contains(
                "the base limit of 200 req/s, counting 15.5% beyond its rate that the ROC cut"
            ),
            "{mode}: {why}"
        );
    }
}

/// A leaky bucket refuses with `queue_full`, cut or not (the engine names only a
/// `limit` refusal the cut's), and `raise_base_limit` counted every refusal of the
/// cut's lowered pace as the base limit's: on a spike of 400 req/s against 200, 54.5%
/// enforcing and in `shadow` (the verdict then "100.0% of them by the base limit"),
/// where `shadow_adaptive`, which enforces its base limit, quotes 46.3%. In an interval
/// the cut was in force in, they count as the cut's do on another algorithm: 45.2%
/// (the interval the cut began in holds the base limit's refusals before it, which
/// count up to its excess only). The `shadow` verdict, which said "100.0% of them by
/// the base limit", now says 83.0%, and 17.0% by the ROC cut.
#[test]
fn a_leaky_buckets_share_is_the_same_in_every_mode() {
    let share =
        |mode: &str| base_limits_share(&format!("algorithm = \"leaky_bucket\"\nmode = \"{mode}\""));
    let (adaptive, why) = share("shadow_adaptive");
    for mode in ["enforce", "shadow"] {
        let (quoted, why_mode) = share(mode);
        assert!(
            (quoted - adaptive).abs() <= 1.5,
            "{mode}: {why_mode}; shadow_adaptive: {why}"
        );
    }
    let h = advise(
        "algorithm = \"leaky_bucket\"\nmode = \"shadow\"",
        &spike_to_400(),
        Some(1000),
    );
    let verdict = &find(&h, "shadow_verdict").unwrap().reason;
    assert!(verdict.contains("of them by the ROC cut"), "{verdict}");
}

/// The shadow verdict's split of the would-be rejections between the base limit and
/// the cut is `raise_base_limit`'s: demand beyond the base limit's rate that the cut
/// would have refused while in force is the base limit's in both. On a spike of
/// 400 req/s against 200 the verdict said "53.7% of them by the base limit" (27.9% of
/// the requests, those labelled `limit`) beside `raise_base_limit`'s 43.4%, and
/// "46.3% … by the ROC cut", where `shadow_adaptive`, which enforces its base limit,
/// sees the cut refuse 1540 of 18000 requests (16.5% of the 9341 would-be ones).
#[test]
fn the_shadow_verdict_splits_the_rejections_as_raise_base_limit_does() {
    let h = advise("mode = \"shadow\"", &spike_to_400(), Some(1000));
    let percent = |text: &str, before: &str| -> f64 {
        let end = text
            .find(before)
            .unwrap_or_else(|| panic!("{before:?} in {text:?}"));
        let start = text[..end].rfind(' ').map_or(0, |s| s + 1);
        text[start..end].parse().unwrap()
    };
    let raise = &find(&h, "raise_base_limit")
        .unwrap_or_else(|| panic!("{h:#?}"))
        .reason;
    let quoted = percent(raise, "% of 18000 requests");
    let verdict = &find(&h, "shadow_verdict")
        .unwrap_or_else(|| panic!("{h:#?}"))
        .reason;
    let would: f64 = verdict["enforcing would have rejected ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let base = percent(verdict, "% of them by the base limit");
    let cut = percent(verdict, "% of them by the ROC cut");
    assert!(
        (base * would / 18000.0 - quoted).abs() <= 0.1,
        "{base}% of {would} against {quoted}% of 18000: {verdict}"
    );
    assert!((cut - 100.0 * 1540.0 / would).abs() <= 0.5, "{verdict}");
}

/// On a partitioned route each key has its own base limit: a brute-forcer held to a
/// per-IP limit on a login route rejects as many as a crowd over it. The history
/// counts the distinct keys refused (a sketch per interval, merged over the period):
/// refused from about 1 client, `raise_base_limit` is `info` and names it (the limit
/// working: `simulate` of config/examples/per-ip.toml, one keyless client at 273 req/s
/// against 5 req/s per key); from 10 or more, a `warn` quoting them. Where no key was
/// counted (a shared store decided them) it is `info`, saying it cannot tell; a shadow
/// verdict naming the base limit says the same of its would-be rejections.
#[test]
fn a_partitioned_routes_raise_of_its_base_limit_may_be_a_few_keys_over_theirs() {
    use rocgate::limiter::Reason;
    let keyed = engine_settings("partition = \"ip\"");
    let intervals = rejecting(0, 30, 1_000, (Reason::Limit, 200), 0);
    let h = advise_over(&keyed, &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (200.0, 260.0));
    let hint = find(&h, "raise_base_limit").unwrap();
    assert_eq!(hint.severity, Severity::Info);
    assert!(
        hint.reason.contains("a few keys over their own limit")
            && hint.reason.contains("only if many clients are refused"),
        "{}",
        hint.reason
    );
    // Each interval's refused keys: `keys(k)` in interval k, as hashes a key table
    // would give them.
    let counted = |keys: &dyn Fn(u64) -> std::ops::Range<u64>| {
        let intervals = with_refused_keys(&intervals, keys);
        let h = advise_over(&keyed, &intervals);
        let hint = find(&h, "raise_base_limit").unwrap().clone();
        assert_eq!(numbers(&h, "raise_base_limit"), (200.0, 260.0));
        let report = rocgate::hints::RouteHints::new(&keyed, &intervals, None, &Policy::default());
        (hint, report.refused_keys)
    };
    // One client, in every interval: the limit working.
    let (hint, refused) = counted(&|_| 7..8);
    assert_eq!((hint.severity, refused), (Severity::Info, Some(1)));
    assert!(
        hint.reason.contains("from about 1 client (")
            && hint
                .reason
                .contains("only if many clients are refused: about 1 was (one client's flood"),
        "{}",
        hint.reason
    );
    // Three, one of them in each interval: the period's are its intervals' together.
    let (hint, refused) = counted(&|k| k % 3..k % 3 + 1);
    assert_eq!((hint.severity, refused), (Severity::Info, Some(3)));
    assert!(
        hint.reason.contains("about 3 were (a few clients' floods"),
        "{}",
        hint.reason
    );
    // Forty clients, a new one in each of 30 intervals and ten in all of them.
    let (hint, refused) = counted(&|k| 100 + k..111 + k);
    let forty = refused.unwrap();
    assert!((28..=52).contains(&forty), "40 keys read as {forty}");
    assert_eq!(hint.severity, Severity::Warn);
    assert!(
        hint.reason
            .contains(&format!("from about {forty} clients ("))
            && !hint.reason.contains("only if"),
        "{}",
        hint.reason
    );
    // Limited as a whole, the route's rejections are a shortfall: `warn`, as before.
    let whole = engine_settings("");
    let h = advise_over(&whole, &intervals);
    let hint = find(&h, "raise_base_limit").unwrap();
    assert_eq!(hint.severity, Severity::Warn);
    assert!(!hint.reason.contains("few keys"), "{}", hint.reason);

    let shadow = engine_settings("partition = \"ip\"\nmode = \"shadow\"");
    let mut intervals = rejecting(0, 30, 1_000, (Reason::Limit, 0), 0);
    for i in &mut intervals {
        i.shadow_rejected[Reason::Limit.index()] = 200;
    }
    let h = advise_over(&shadow, &intervals);
    let verdict = find(&h, "shadow_verdict").unwrap();
    assert!(
        verdict.reason.contains("see raise_base_limit")
            && verdict.reason.contains("a few keys over their own limit"),
        "{}",
        verdict.reason
    );
    // Where the keys enforcing would have refused were counted, the verdict quotes
    // them, as `raise_base_limit` does.
    let verdict_over = |keys: &dyn Fn(u64) -> std::ops::Range<u64>| {
        let intervals = with_refused_keys(&intervals, keys);
        let report = rocgate::hints::RouteHints::new(&shadow, &intervals, None, &Policy::default());
        let verdict = find(&report.hints, "shadow_verdict")
            .unwrap()
            .reason
            .clone();
        (verdict, report.refused_keys)
    };
    let (verdict, refused) = verdict_over(&|_| 7..8);
    assert_eq!(refused, Some(1));
    assert!(
        verdict.contains("see raise_base_limit")
            && verdict.contains(
                "which would refuse about 1 client (one client's flood, held to its own limit"
            )
            && !verdict.contains("if many clients"),
        "{verdict}"
    );
    let (verdict, refused) = verdict_over(&|k| 100 + k..111 + k);
    let forty = refused.unwrap();
    assert!(
        verdict.contains(&format!("which would refuse about {forty} clients"))
            && !verdict.contains("if many clients")
            && !verdict.contains("the limit working"),
        "{verdict}"
    );
}

/// A measured rate is quoted to 3 significant digits: a capacity read from intervals
/// of 3 s, 259 requests each, was "it saturates at about 86.333 req/s" beside a
/// suggestion of 77. A small limit keeps its digits: a raise of 0.001 read
/// "0.001 → 0.001".
#[test]
fn measured_rates_are_quoted_to_three_significant_digits() {
    use rocgate::hints::{Interval, UpstreamCounts};
    let intervals: Vec<Interval> = (0..30)
        .map(|k| {
            let mut i = Interval::new(Nanos::from_secs(3 * k), Duration::from_secs(3));
            i.offered = 259;
            i.upstream = Some(UpstreamCounts {
                requests: 259,
                errors: 13,
                ..UpstreamCounts::default()
            });
            i
        })
        .collect();
    let h = advise_over(&engine_settings(""), &intervals);
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 77.0));
    let reason = &find(&h, "lower_base_limit").unwrap().reason;
    assert!(
        reason.contains("it saturates at about 86.3 req/s"),
        "{reason}"
    );

    let small = engine_settings("base_limit = 0.001\ncut_limit = 0.0003\nmin_rps = 0.0001");
    let intervals = rejecting(0, 30, 1_000, (Reason::Limit, 200), 0);
    let h = advise_over(&small, &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (0.001, 0.0013));
    let table = rocgate::hints::table(&h);
    assert!(table.contains("base_limit 0.001 → 0.0013"), "{table}");
}

/// A measured figure quoted beside a setting it exceeds or falls short of keeps the
/// digits that tell the two apart: a false cut started at ROC 80.04 against a
/// `danger_roc` of 80 read "raise danger_roc (80) above 80", and its demand of
/// 199.6 req/s under a base limit of 200 "peak 200 req/s".
#[test]
fn a_measured_figure_beside_a_setting_is_told_apart_from_it() {
    let cuts = |intervals: &mut [Interval]| {
        for i in &mut intervals[10..16] {
            i.in_state[usize::from(ControllerState::Cut.as_index())] = 1.0;
            i.peak_demand_rps = 199.6;
        }
        intervals[10].cuts = 1;
        intervals[10].cut_roc = 80.04;
    };
    let mut intervals = seconds(180, false);
    cuts(&mut intervals);
    let h = advise_over(&engine_settings(""), &intervals);
    let reason = &find(&h, "raise_danger_roc")
        .unwrap_or_else(|| panic!("{h:#?}"))
        .reason;
    assert!(
        reason.contains("with ROC 80.04") && reason.contains("(peak 199.6 req/s)"),
        "{reason}"
    );

    let shadow = engine_settings("mode = \"shadow_adaptive\"");
    let mut intervals = seconds(180, false);
    cuts(&mut intervals);
    // Demand over the base limit: no false cut for raise_danger_roc, which the verdict
    // would point at.
    for i in &mut intervals[10..16] {
        i.shadow_rejected[Reason::RocCut.index()] = 60;
        i.peak_demand_rps = 250.0;
    }
    let h = advise_over(&shadow, &intervals);
    let verdict = &find(&h, "shadow_verdict")
        .unwrap_or_else(|| panic!("{h:#?}"))
        .reason;
    assert!(
        verdict.contains("raise danger_roc (80) above 80.04,"),
        "{verdict}"
    );
    // Far from the setting, a figure keeps its 3 significant digits.
    let mut intervals = seconds(180, false);
    cuts(&mut intervals);
    intervals[10].cut_roc = 95.04;
    let h = advise_over(&engine_settings(""), &intervals);
    let reason = &find(&h, "raise_danger_roc").unwrap().reason;
    assert!(reason.contains("with ROC 95;"), "{reason}");
}

/// `raise_danger_roc` does not judge a partitioned route (a false cut's demand is
/// held against each key's base limit, and one key's demand is not observed), nor a
/// `concurrency` one: the shadow verdict's cut part said "raise danger_roc (80) above
/// 95" there all the same. It names `danger_roc` without a value, and says why.
#[test]
fn a_shadow_verdict_suggests_no_danger_roc_where_raise_danger_roc_does_not_judge() {
    let cut = || {
        let mut intervals = seconds(180, false);
        shadow_cut(&mut intervals, 250.0);
        intervals
    };
    for (extra, kind) in [
        ("mode = \"shadow_adaptive\"\npartition = \"ip\"", "a partitioned route"),
        (
            "mode = \"shadow\"\npartition = \"header:x-api-key\"",
            "a partitioned route",
        ),
        (
            "mode = \"shadow\"\nalgorithm = \"concurrency\"\nbase_limit = 64\ncut_limit = 32\nrestore_step = 2",
            "a concurrency route",
        ),
    ] {
        let settings = engine_settings(extra);
        let h = advise_over(&settings, &cut());
        let verdict = &find(&h, "shadow_verdict")
            .unwrap_or_else(|| panic!("{h:#?}"))
            .reason;
        assert!(
            verdict.contains(&format!(
                "raise danger_roc (80; no value is suggested on {kind}: a false cut is one whose demand fit under the base limit"
            )) && !verdict.contains("above 95"),
            "{extra}: {verdict}"
        );
    }
    // Limited as a whole, the verdict still quotes the ROC to raise it above.
    let settings = engine_settings("mode = \"shadow_adaptive\"");
    let h = advise_over(&settings, &cut());
    let verdict = &find(&h, "shadow_verdict").unwrap().reason;
    assert!(
        verdict.contains("raise danger_roc (80) above 95"),
        "{verdict}"
    );
}

/// [`classic`], distributed: `rocgate serve` shares it through Redis, its base limit
/// the fleet's, its history this instance's share of the requests.
fn distributed() -> RouteSettings {
    RouteSettings {
        distributed: true,
        ..classic()
    }
}

/// A game day's flash sale on a route two instances share through Redis (found by
/// helper-201): each instance saw 40 req/s, a third of it refused by the shared
/// bucket of 200 req/s, and its hints said "32.5% … rejected by the base limit of 200
/// req/s (mean demand 40 req/s)": one instance's demand against the fleet's limit,
/// and a raise to 260 worked out from it. On a distributed route the rule does not
/// judge: it says so, quoting the figures as this instance's share, with no value.
#[test]
fn a_distributed_routes_base_limit_is_not_raised_from_one_instances_share() {
    let intervals = healthy_seconds(60, (40, 13), Reason::Limit, ControllerState::Normal);
    // Limited here alone, the same figures raise it.
    assert_eq!(
        numbers(&advise_over(&classic(), &intervals), "raise_base_limit"),
        (200.0, 260.0)
    );
    let h = advise_over(&distributed(), &intervals);
    assert!(
        h.iter().all(|h| h.suggested.is_none()),
        "a value from one instance's figures: {h:#?}"
    );
    let raise = find(&h, "raise_base_limit").unwrap();
    assert_eq!(raise.severity, Severity::Info);
    assert_says(raise, "not advised on a distributed route");
    assert_says(raise, "this instance's 40 req/s");
    assert_says(raise, "32.5% of 2400 requests rejected by the base limit");
    assert_says(raise, "the fleet's base limit of 200 req/s");
    // The shared controller's slots are not in this instance's history: the rules
    // that judge cuts, ramps and restores say they do not judge it.
    for rule in NOT_JUDGED_ON_A_DISTRIBUTED_ROUTE {
        let hint = find(&h, rule).unwrap_or_else(|| panic!("no {rule}: {h:#?}"));
        assert_eq!(hint.suggested, None, "{rule}");
        assert_says(hint, "not advised on a distributed route");
    }
    // Only once per rule.
    assert_eq!(
        h.iter().filter(|h| h.rule == "raise_base_limit").count(),
        1,
        "{h:#?}"
    );
}

/// An upstream saturated behind few rejections: limited here alone, the base limit
/// goes to 90% of the rate it saturated at; on a distributed route that rate is this
/// instance's share of what the fleet sent (a third of it with three instances), and
/// the capacity it reads a fraction of the upstream's: the base limit goes down
/// about 20%, the figures said to be this instance's.
#[test]
fn a_distributed_routes_saturated_upstream_lowers_the_base_limit_without_its_share_as_capacity() {
    let intervals = in_state(
        rejecting(0, 60, 40, (Reason::Limit, 0), 4),
        ControllerState::Normal,
    );
    assert_eq!(
        numbers(&advise_over(&classic(), &intervals), "lower_base_limit"),
        (200.0, 36.0)
    );
    let h = advise_over(&distributed(), &intervals);
    assert_eq!(numbers(&h, "lower_base_limit"), (200.0, 160.0));
    let lower = find(&h, "lower_base_limit").unwrap();
    assert_says(lower, "this instance's share");
    assert!(!lower.reason.contains("saturates at about"), "{lower:#?}");
}

/// A shadow distributed route that would have refused 7.5% of this instance's
/// requests (too few for `raise_base_limit`, too many to enforce): the verdict names
/// the base limit without a value, where a route limited here alone is told that the
/// most demand seen while healthy, 40 req/s, fits under it: on a distributed route
/// that is this instance's share, not the fleet's demand.
#[test]
fn a_distributed_shadow_verdict_names_the_base_limit_without_a_value() {
    let mut intervals = healthy_seconds(60, (40, 0), Reason::Limit, ControllerState::Normal);
    for i in &mut intervals {
        i.shadow_rejected[Reason::Limit.index()] = 3;
    }
    let shadow = |s: RouteSettings| RouteSettings {
        mode: Mode::Shadow,
        ..s
    };
    let seen = "the most demand seen while the upstream was healthy, 40 req/s";
    let local = advise_over(&shadow(classic()), &intervals);
    assert_says(find(&local, "shadow_verdict").unwrap(), seen);
    let h = advise_over(&shadow(distributed()), &intervals);
    let verdict = find(&h, "shadow_verdict").unwrap();
    assert_eq!(verdict.suggested, None);
    assert!(!verdict.reason.contains(seen), "{verdict:#?}");
    assert_says(verdict, "this instance's share");
}

/// A quiet distributed route: "no change", quoting this instance's share and no count
/// of cuts (the shared controller's are not in its history), beside the rules that do
/// not judge it.
#[test]
fn a_quiet_distributed_route_gets_no_change_as_its_share() {
    let intervals = healthy_seconds(60, (40, 0), Reason::Limit, ControllerState::Normal);
    let h = advise_over(&distributed(), &intervals);
    let none = find(&h, "no_change").unwrap_or_else(|| panic!("{h:#?}"));
    assert_eq!(
        none.reason,
        "no change: this instance's share of a distributed route, 2400 requests, 0.0% rejected, upstream healthy throughout"
    );
}

/// `intervals`, the first `with` of them holding the fleet's demand that Redis's
/// answers gave: `mean` req/s, peaking at `peak`.
fn with_fleet_demand(
    mut intervals: Vec<Interval>,
    with: usize,
    (mean, peak): (f64, f64),
) -> Vec<Interval> {
    for i in intervals.iter_mut().take(with) {
        i.fleet_demand = Some(FleetDemand::new(mean, peak, i.secs()));
    }
    intervals
}

/// The game day's flash sale of
/// [`a_distributed_routes_base_limit_is_not_raised_from_one_instances_share`], now with
/// the fleet's demand in the history (found by helper-206): Redis's answers said the
/// fleet sent 600 req/s against its base limit of 200 while the upstream was healthy,
/// so the rule advises as on a route of one instance, +30%, quoting the fleet's
/// figures, not this instance's share. The other rules still do not judge it.
#[test]
fn a_distributed_routes_base_limit_is_raised_on_the_fleets_demand() {
    let intervals = with_fleet_demand(
        healthy_seconds(60, (40, 13), Reason::Limit, ControllerState::Normal),
        60,
        (600.0, 700.0),
    );
    let h = advise_over(&distributed(), &intervals);
    assert_eq!(numbers(&h, "raise_base_limit"), (200.0, 260.0));
    let raise = find(&h, "raise_base_limit").unwrap();
    assert_eq!(raise.severity, Severity::Warn);
    assert_says(
        raise,
        "the fleet's demand 600 req/s (peak 700 req/s, as Redis's answers to this instance gave it in 60 of 60 intervals) against its base limit of 200 req/s while the upstream was healthy throughout: raise it about 30%",
    );
    assert!(!raise.reason.contains("this instance's"), "{raise:#?}");
    assert_eq!(
        h.iter().filter(|h| h.rule == "raise_base_limit").count(),
        1,
        "{h:#?}"
    );
    for rule in NOT_JUDGED_ON_A_DISTRIBUTED_ROUTE {
        let hint = find(&h, rule).unwrap_or_else(|| panic!("no {rule}: {h:#?}"));
        assert_says(hint, "not advised on a distributed route");
    }
    // A shadow route is told, as one limited here alone is.
    let shadow = RouteSettings {
        mode: Mode::Shadow,
        ..distributed()
    };
    let raise = advise_over(&shadow, &intervals);
    let raise = find(&raise, "raise_base_limit").unwrap();
    assert_eq!(raise.severity, Severity::Info);
    assert_eq!(raise.suggested, Some(Setting::Number(260.0)));
}

/// Within the same bounds as on a route of one instance: a modelled upstream of 500
/// req/s holds the raise to what a full bucket and a second of refill keep within it.
#[test]
fn a_distributed_routes_raise_on_the_fleets_demand_stays_within_the_capacity() {
    let intervals = with_fleet_demand(
        healthy_seconds(60, (40, 13), Reason::Limit, ControllerState::Normal),
        60,
        (600.0, 700.0),
    );
    let h = rocgate::hints::advise(&distributed(), &intervals, Some(500.0), &Policy::default());
    let local = rocgate::hints::advise(&classic(), &intervals, Some(500.0), &Policy::default());
    let (current, suggested) = numbers(&h, "raise_base_limit");
    assert_eq!((current, suggested), numbers(&local, "raise_base_limit"));
    assert!(suggested > 200.0 && suggested < 260.0, "{suggested}");
    assert_says(
        find(&h, "raise_base_limit").unwrap(),
        "within the upstream's capacity of 500 req/s",
    );
}

/// The fleet's demand within a tenth of its base limit (210 req/s against 200, as a
/// route of one instance with under 10% rejected), or above it with the upstream
/// saturated: no raise, and no "not advised" either (the fleet's demand was judged).
#[test]
fn a_distributed_routes_fleet_demand_that_fits_or_saturates_is_not_raised() {
    let fits = with_fleet_demand(
        healthy_seconds(60, (40, 13), Reason::Limit, ControllerState::Normal),
        60,
        (210.0, 260.0),
    );
    let h = advise_over(&distributed(), &fits);
    assert!(find(&h, "raise_base_limit").is_none(), "{h:#?}");
    let saturated = with_fleet_demand(
        in_state(
            rejecting(0, 60, 40, (Reason::Limit, 13), 4),
            ControllerState::Normal,
        ),
        60,
        (600.0, 700.0),
    );
    let h = advise_over(&distributed(), &saturated);
    assert!(find(&h, "raise_base_limit").is_none(), "{h:#?}");
}

/// The fleet's demand in some intervals only (Redis away in the others, or answers of
/// a release that kept no rate): judged on those, and the hint says how many. In none,
/// the rule does not judge the route, as before the answers carried it.
#[test]
fn a_distributed_routes_fleet_demand_is_judged_where_the_history_has_it() {
    let seconds = || healthy_seconds(60, (40, 13), Reason::Limit, ControllerState::Normal);
    let h = advise_over(
        &distributed(),
        &with_fleet_demand(seconds(), 20, (600.0, 650.0)),
    );
    assert_eq!(numbers(&h, "raise_base_limit"), (200.0, 260.0));
    assert_says(
        find(&h, "raise_base_limit").unwrap(),
        "in 20 of 60 intervals",
    );
    let h = advise_over(
        &distributed(),
        &with_fleet_demand(seconds(), 0, (600.0, 650.0)),
    );
    let raise = find(&h, "raise_base_limit").unwrap();
    assert_eq!(raise.suggested, None);
    assert_says(raise, "not advised on a distributed route");
}

/// On a window counter's partitioned route the total's bucket has the route's window
/// as its burst (a token bucket's, as README says), so `raise_route_limit` stops at
/// the capacity ÷ (1 + window in seconds), what a full bucket and a second of refill
/// pass: 500 of 1000 req/s with a window of 1 s. Before, it read the window counter's
/// bound (the capacity itself) and suggested 520, whose full bucket and a second of
/// refill pass 1040 req/s.
#[test]
fn raise_route_limit_on_a_window_counter_counts_the_totals_burst() {
    let h = advise(
        "partition = \"ip\"\nalgorithm = \"fixed_window\"\nlimiter_window = \"1s\"\n\
         base_limit = 1000\ncut_limit = 1000\nroute_limit = 400",
        &steady(500.0),
        Some(1000),
    );
    assert!(find(&h, "raise_base_limit").is_none(), "{:#?}", rules(&h));
    let (current, suggested) = numbers(&h, "raise_route_limit");
    assert_eq!(current, 400.0);
    assert!(suggested > 400.0 && suggested <= 500.0, "{suggested}");
}

/// A `shadow` partitioned route whose keys the `route_limit` would have held, not
/// their own limit, is told so by its verdict: the total's would-be refusals point at
/// `raise_route_limit`, not at each key's base limit. Before, they were the base
/// limit's ("100.0% of them by the base limit of 200 req/s: raise base_limit").
#[test]
fn a_shadow_verdict_tells_the_totals_would_be_refusals_apart() {
    let h = advise(
        "partition = \"ip\"\nroute_limit = 20\nmode = \"shadow\"",
        &steady(50.0),
        Some(1000),
    );
    let total = find(&h, "raise_route_limit").expect("raise_route_limit");
    assert_eq!(total.severity, Severity::Info);
    let verdict = find(&h, "shadow_verdict").expect("a verdict");
    assert!(
        verdict.reason.contains("by the route_limit of 20 req/s")
            && verdict
                .reason
                .contains("see raise_route_limit (route_limit 20 → 26"),
        "{}",
        verdict.reason
    );
    assert!(!verdict.reason.contains("base limit"), "{}", verdict.reason);
    // Without the hint (no upstream measured), the verdict still names the total.
    let h = advise(
        "partition = \"ip\"\nroute_limit = 20\nmode = \"shadow\"",
        &steady(50.0),
        None,
    );
    let verdict = find(&h, "shadow_verdict").expect("a verdict");
    assert!(
        verdict.reason.contains("by the route_limit of 20 req/s")
            && verdict.reason.contains("raise route_limit"),
        "{}",
        verdict.reason
    );
    assert!(!verdict.reason.contains("base limit"), "{}", verdict.reason);
}

/// A simulated event that sets its own `route_limit` is judged against it: the
/// event's part of a steady 50 req/s is refused by the event's total of 30 (40%), the
/// route's own part by its total of 20 (60%), each told to raise its own, the event's
/// named in its hint as the `[[routes.events]]` entry the change belongs in.
#[test]
fn an_events_route_limit_is_judged_in_the_events_part() {
    let h = advise(
        "partition = \"ip\"\nroute_limit = 20\n\
         [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:30Z\"\n\
         duration = \"30s\"\nroute_limit = 30",
        &steady(50.0),
        Some(1000),
    );
    let totals: Vec<(Option<&str>, (f64, f64))> = h
        .iter()
        .filter(|h| h.rule == "raise_route_limit")
        .map(|x| {
            let n = |s: &Option<Setting>| match s {
                Some(Setting::Number(n)) => *n,
                other => panic!("{other:?}"),
            };
            (x.event.as_deref(), (n(&x.current), n(&x.suggested)))
        })
        .collect();
    assert_eq!(
        totals,
        [(None, (20.0, 26.0)), (Some("sale"), (30.0, 39.0))],
        "{h:#?}"
    );
    assert!(find(&h, "raise_base_limit").is_none(), "{:#?}", rules(&h));
}

/// A suggested `restore_step` is the round number it reads as, printed as an operator
/// would type it: the rules rounded by dividing by a power of ten below 1, which no
/// float holds, so that doubling a step of 777000 suggested 1599999.9999999998 (shown
/// 1600000, but the JSON and a config written from it carry the noise, and the file's
/// 1600000 is not what was suggested), and one of 8.27e301 was printed in 303 digits.
#[test]
fn a_suggested_restore_step_is_the_number_it_reads_as() {
    let intervals = healthy_seconds(20, (150, 50), Reason::RocCut, ControllerState::Recovering);
    for (step, shown) in [
        (777_000.0, "1600000"),
        (1e6, "2000000"),
        (1.654e10, "34000000000"),
        (4.1e12, "8200000000000"),
        (8.27e15, "1.7e16"),
        (6.02e21, "1.3e22"),
        (8.27e301, "1.7e302"),
        (77.7, "160"),
    ] {
        let mut settings = classic();
        settings.params.restore_step_rps = step;
        settings.params.cut_limit_rps = step;
        settings.params.base_limit_rps = step * 4.0;
        let h = advise_over(&settings, &intervals);
        let hint = find(&h, "faster_restore").unwrap_or_else(|| panic!("{step}: {h:#?}"));
        let (current, suggested) = numbers(&h, "faster_restore");
        assert_eq!(current, step);
        let text = hint.suggested.as_ref().unwrap().to_string();
        assert_eq!(text, shown, "{step}");
        assert_eq!(text.parse::<f64>(), Ok(suggested), "{step}: {suggested:?}");
        let json = serde_json::to_value(hint).unwrap();
        assert_eq!(json["suggested"].as_f64(), Some(suggested), "{json}");
    }
}

/// A suggested `restore_step`, written into the config as the hint prints it, loads as
/// the step suggested, and is then large enough that the rule asks for a shorter
/// interval instead: the file's 1600000 was a hair above the 1599999.9999999998
/// suggested.
#[test]
fn a_suggested_restore_step_written_back_is_the_step_suggested() {
    let route =
        |step: &str| format!("base_limit = 2000000\ncut_limit = 100000\nrestore_step = {step}");
    let intervals = healthy_seconds(20, (150, 50), Reason::RocCut, ControllerState::Recovering);
    let h = advise_over(&engine_settings(&route("777000")), &intervals);
    let hint = setting(&h, "restore_step");
    let (_, suggested) = numbers(&h, "faster_restore");
    let written = route(&hint.suggested.as_ref().unwrap().to_string());
    let toml = format!("[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n{written}\n");
    let config = Config::from_toml_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.routes[0].controller.restore_step_rps, suggested);
    assert_eq!(apply(&route("777000"), &h), Ok(()));
    let again = advise_over(&engine_settings(&written), &intervals);
    let next = find(&again, "faster_restore").unwrap_or_else(|| panic!("{again:#?}"));
    assert_eq!(
        next.parameter.as_deref(),
        Some("restore_interval"),
        "{next:#?}"
    );
}

/// A suggestion of 4 significant digits is printed as suggested, in the table and in
/// the reason: settings and suggestions were printed to the thousandth and whole from
/// 100, so that a raise of the base limit bounded by what a restore covers in 7 days,
/// 230.8, read "base_limit 200 → 231" and "at most 231", a value the config refuses,
/// and 0.1065 read 0.107.
#[test]
fn a_suggestion_of_four_digits_is_printed_as_suggested() {
    for (base, cut, step, shown) in [
        ("200", 60.0, 21.35, "230.8"),
        ("0.1", 0.03, 0.00957, "0.1065"),
    ] {
        let mut settings = classic();
        settings.params.base_limit_rps = base.parse().unwrap();
        settings.params.cut_limit_rps = cut;
        settings.params.min_rps = cut / 10.0;
        settings.params.restore_step_rps = step;
        // 8 steps in 7 days: at most cut + 8 × step.
        settings.params.restore_interval = Duration::from_secs(20 * 3600);
        let intervals = healthy_seconds(30, (300, 100), Reason::Limit, ControllerState::Normal);
        let h = advise_over(&settings, &intervals);
        let hint = setting(&h, "base_limit");
        let (_, suggested) = numbers(&h, "raise_base_limit");
        let text = hint.suggested.as_ref().unwrap().to_string();
        assert_eq!(text, shown, "{hint:#?}");
        assert_eq!(text.parse::<f64>(), Ok(suggested), "{hint:#?}");
        assert!(
            rocgate::hints::table(&h).contains(&format!("base_limit {base} → {shown}\n")),
            "{}",
            rocgate::hints::table(&h)
        );
        assert_says(hint, &format!("at most {shown} so that a restore"));
        let json = format!("{{\"base_limit\": {text}}}");
        let r = rocgate::config::patch_controller(
            &settings.params,
            &settings.algorithm,
            &json,
            "hints",
        );
        assert!(r.is_ok(), "{json}: {}", r.unwrap_err());
    }
}
