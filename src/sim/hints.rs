//! Tuning hints for a simulated run: its per-slot series cut into one-second
//! [`Interval`]s, with the modelled capacity standing in for upstream health (an
//! admitted request beyond it counts as an upstream failure), judged per profile (the
//! route's own, and each scheduled event's over the intervals that began during it).

use super::{SimResult, SimRun, SlotRow};
use crate::config::{Config, Partition, RouteConfig};
use crate::controller::ControllerState;
use crate::hints::{self, Hint, Interval, Policy, RouteSettings, Severity, UpstreamCounts};
use crate::limiter::{Algorithm, Level};
use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Slots per interval: one second of them, at least one.
fn slots_per_interval(slot_s: f64) -> usize {
    ((1.0 / slot_s).round() as usize).max(1)
}

/// Where the intervals of a route's series begin, row by row: at its first row, after
/// every `per` rows ([`slots_per_interval`]), and at the first row that begins at or
/// after an edge (within a microsecond: an edge on a slot's start, read back from
/// floating seconds, is that slot's). [`intervals`] cuts a series by it, and the run
/// takes the keys a route refused at each interval's end by it, as the rows come.
pub(super) struct IntervalStarts {
    per: usize,
    /// The edges not yet reached, the latest first.
    edges: Vec<f64>,
    /// Rows since the interval's start.
    rows: usize,
}

impl IntervalStarts {
    /// The starts of a series of slots of `slot_s` seconds, cut at `edges` too
    /// (seconds since the run's start; [`event_edges`]).
    pub(super) fn new(slot_s: f64, edges: &[f64]) -> Self {
        let mut edges: Vec<f64> = edges.iter().copied().filter(|e| e.is_finite()).collect();
        edges.sort_by(|a, b| b.total_cmp(a));
        IntervalStarts {
            per: slots_per_interval(slot_s),
            edges,
            rows: 0,
        }
    }

    /// Whether the series' next row, which begins at `t_s`, begins an interval.
    pub(super) fn begins(&mut self, t_s: f64) -> bool {
        let mut at_edge = false;
        while self.edges.last().is_some_and(|&e| e <= t_s + 1e-6) {
            self.edges.pop();
            at_edge = true;
        }
        let begins = self.rows == 0 || at_edge || self.rows == self.per;
        self.rows = if begins { 1 } else { self.rows + 1 };
        begins
    }
}

/// The edges of `route`'s scheduled events (their starts and ends), in seconds since
/// the start of a run begun at `start_unix_s`: where the engine puts another profile in
/// force at the slot rollover, and an interval ends.
pub(super) fn event_edges(route: &RouteConfig, start_unix_s: f64) -> Vec<f64> {
    route
        .events
        .iter()
        .flat_map(|e| {
            let from = unix(e.start) - start_unix_s;
            [from, from + e.duration.as_secs_f64()]
        })
        .collect()
}

/// One route's series as one-second intervals, each also ended at the first slot
/// that begins at or after one of `edges` (seconds since the run's start: its
/// scheduled events' starts and ends, where the engine puts another profile in force
/// at the slot rollover), the next one-second interval counting from there, as
/// `serve` ends an interval at an event's edge. `half_slots` is the route's
/// half-window in slots (demand is that half-window's rate, as the controller sees
/// it; ROC is recorded from the end of the first full window, when the controller
/// starts to act); `algorithm` reads the limiter's level; `capacity` says whether a capacity was
/// modelled.
pub fn intervals(
    result: &SimResult,
    half_slots: usize,
    algorithm: &Algorithm,
    capacity: bool,
    edges: &[f64],
) -> Vec<Interval> {
    let slot_s = result.summary.slot_s;
    let half_secs = slot_s * half_slots.max(1) as f64;
    let mut recent: VecDeque<u64> = VecDeque::with_capacity(half_slots + 1);
    let mut recent_sum = 0u64;
    let mut last_state = ControllerState::Normal;
    // Slots before the controller acts: one full window.
    let mut armed = 2 * half_slots;
    // No length if `slot_s` is none (negative, NaN, past `Duration::MAX`).
    let slot = Duration::try_from_secs_f64(slot_s).unwrap_or_default();
    let mut out = Vec::new();
    // The keys refused, taken per interval by the run: by the interval's place.
    let mut refused = result.refused_keys.iter().peekable();
    let starts = IntervalStarts::new(slot_s, edges);
    for (n, chunk) in (0u32..).zip(chunks(&result.series, starts)) {
        let start = crate::clock::Nanos::new((chunk[0].t_s * 1e9).round() as u64);
        let length = slot.saturating_mul(u32::try_from(chunk.len()).unwrap_or(u32::MAX));
        let mut i = Interval::new(start, length);
        let mut upstream = UpstreamCounts::default();
        for row in chunk {
            i.offered += row.offered;
            for (reason, n) in row.rejected.iter() {
                i.rejected[reason.index()] += n;
            }
            for (reason, n) in row.shadow_rejected_by_reason.iter() {
                i.shadow_rejected[reason.index()] += n;
            }
            i.route_limit_rejected += row.route_limit_rejected;
            // The first window's ROC compares with an earlier half still filling
            // (about the whole rate), and the controller does not act on it.
            if armed == 0 {
                i.roc.record(row.roc);
            } else {
                armed -= 1;
            }
            i.in_state[usize::from(row.state.as_index())] += slot_s;
            let level = Level {
                value: row.level,
                capacity: row.level_capacity,
            };
            if row.level_capacity > 0.0 && level.exhausted(algorithm) {
                i.exhausted_s += slot_s;
            }
            if row.state == ControllerState::Cut && last_state != ControllerState::Cut {
                i.cuts += 1;
                i.cut_roc = i.cut_roc.max(row.roc);
            }
            last_state = row.state;
            recent.push_back(row.offered);
            recent_sum += row.offered;
            if recent.len() > half_slots.max(1) {
                recent_sum -= recent.pop_front().unwrap_or(0);
            }
            i.peak_demand_rps = i.peak_demand_rps.max(recent_sum as f64 / half_secs);
            upstream.requests += row.admitted;
            upstream.errors += row.overload;
        }
        while let Some((_, keys)) = refused.next_if(|(at, _)| *at <= n) {
            i.refused_keys.get_or_insert_with(Box::default).merge(keys);
        }
        if capacity {
            i.upstream = Some(upstream);
        }
        out.push(i);
    }
    out
}

/// `rows` in runs, each from a row that `starts` says begins an interval.
fn chunks(rows: &[SlotRow], mut starts: IntervalStarts) -> Vec<&[SlotRow]> {
    let (mut out, mut from) = (Vec::new(), 0);
    for (k, row) in rows.iter().enumerate() {
        if starts.begins(row.t_s) && k > from {
            out.push(&rows[from..k]);
            from = k;
        }
    }
    if from < rows.len() {
        out.push(&rows[from..]);
    }
    out
}

/// What a simulation says of a `concurrency` route: requests complete at once, so its
/// limit never binds and no run shows what another size of it would do.
const CONCURRENCY_NOT_JUDGED: &str = "no change: the simulation completes requests at once, so a concurrency limit never binds and a run cannot judge its settings";

/// The hints for every route of `run`, simulated with `config`, one suggestion per
/// route-only setting across its parts ([`hints::one_per_route_setting`]), and the
/// events' settings that a lowered limit or threshold of the route's own would leave
/// refused lowered with it ([`hints::follow_in_events`]). A `concurrency`
/// route gets one "no change" hint saying so: advice from a run in
/// which its limit never binds would move it without end (each round lowering a limit
/// that changed nothing).
pub fn hints(run: &SimRun, config: &Config, policy: &Policy) -> Vec<Hint> {
    let capacity = run.summary.capacity_rps;
    let single = run.routes.len() == 1;
    run.routes
        .iter()
        .filter_map(|result| {
            let route = config
                .routes
                .iter()
                .find(|r| r.name == result.summary.route)?;
            if matches!(route.algorithm, Algorithm::Concurrency { .. }) {
                return Some(vec![Hint {
                    route: route.name.clone(),
                    rule: "no_change".to_owned(),
                    severity: Severity::Info,
                    parameter: None,
                    current: None,
                    suggested: None,
                    reason: CONCURRENCY_NOT_JUDGED.to_owned(),
                    event: None,
                }]);
            }
            let edges = event_edges(route, result.summary.start_unix_s);
            let all = intervals(
                result,
                route.window.slots() / 2,
                &route.algorithm,
                capacity.is_some(),
                &edges,
            );
            let known = capacity.filter(|_| single).map(|c| c as f64);
            let mut parts: Vec<(Option<String>, Vec<Hint>)> =
                by_profile(route, result.summary.start_unix_s, all)
                    .into_iter()
                    .map(|(settings, part)| {
                        let hints = hints::advise(&settings, &part, known, policy);
                        (settings.event, hints)
                    })
                    .collect();
            hints::one_per_route_setting(
                parts
                    .iter_mut()
                    .map(|(event, hints)| (event.as_deref(), hints)),
            );
            let mut hints: Vec<Hint> = parts.into_iter().flat_map(|(_, hints)| hints).collect();
            let follow =
                hints::follow_in_events(&route.algorithm, &route.controller, &route.events, &hints);
            hints.extend(follow);
            Some(hints)
        })
        .flatten()
        .collect()
}

/// `intervals` of `route`, whose run began at `start_unix_s`, grouped by the profile
/// in force when each began (the route's own, or a scheduled event's: from its start,
/// for its duration, as the engine takes it over), each group with that profile's
/// settings, in the order each profile first appears: as `serve` judges a period, so
/// that an event's part is judged against the event's parameters and its hints name
/// it.
fn by_profile(
    route: &RouteConfig,
    start_unix_s: f64,
    intervals: Vec<Interval>,
) -> Vec<(RouteSettings, Vec<Interval>)> {
    let mut groups: Vec<(RouteSettings, Vec<Interval>)> = Vec::new();
    for mut i in intervals {
        let at = i.start.as_secs_f64();
        let event = route.events.iter().find(|e| {
            // Since the run's start, within a microsecond as the edges split it.
            let from = unix(e.start) - start_unix_s;
            from <= at + 1e-6 && at + 1e-6 < from + e.duration.as_secs_f64()
        });
        i.event = event.map(|e| e.name.clone());
        match groups.iter_mut().find(|(s, _)| s.event == i.event) {
            Some((_, part)) => part.push(i),
            None => {
                let settings = RouteSettings {
                    name: route.name.clone(),
                    mode: route.mode,
                    algorithm: route.algorithm,
                    params: event
                        .map_or_else(|| route.controller.clone(), |e| e.controller.clone()),
                    partitioned: route.partition != Partition::Route,
                    tiered: !route.tiers.is_empty(),
                    route_limit_rps: route
                        .route_limit_rps
                        .map(|own| event.and_then(|e| e.route_limit_rps).unwrap_or(own)),
                    // A simulation runs one instance: the whole total.
                    route_limit_instances: 1,
                    distributed: false,
                    event: i.event.clone(),
                };
                groups.push((settings, vec![i]));
            }
        }
    }
    groups
}

/// Seconds since the Unix epoch (negative before it).
fn unix(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Reason;
    use crate::sim::{SlotRow, Summary};

    fn result(rows: Vec<SlotRow>) -> SimResult {
        SimResult {
            summary: Summary {
                route: "r".into(),
                mode: crate::config::Mode::Enforce,
                start_unix_s: 0.0,
                duration_s: rows.len() as f64 * 0.1,
                slot_s: 0.1,
                offered: 0,
                admitted: 0,
                rejected: 0,
                rejected_without_cuts: None,
                cut_own_net: None,
                route_limit_rejected: None,
                rejected_by_reason: Default::default(),
                shadow_rejected: 0,
                shadow_rejected_by_reason: Default::default(),
                overload: 0,
                cuts: Vec::new(),
                first_cut_s: None,
                time_in_cut_s: 0.0,
                transitions: Vec::new(),
                peak_admitted_1s: 0,
                peak_admitted_1s_at_s: 0.0,
                peak_offered_1s: 0,
            },
            series: rows,
            refused_keys: Vec::new(),
        }
    }

    /// The hints of a route whose scheduled event takes the route's base limit or
    /// danger_roc and writes its own cut_limit or safe_roc: lowering the route's alone
    /// was advised (base_limit 200 → 90 beside an event's cut_limit of 150; danger_roc
    /// 80 → 24 beside an event's safe_roc of 60), a config the file's rules refuse
    /// (`routes[0].events[0].cut_limit: must be ≤ base_limit (90), got 150`). The
    /// event's setting is now lowered with it, and the config the hints make is one
    /// the rules accept.
    #[test]
    fn a_lowered_route_setting_lowers_what_an_event_writes_beside_it() {
        use crate::hints::Setting;
        use crate::sim::{ArrivalModel, Profile, Simulator};
        let route = |own: &str, event: &str| {
            format!(
                "[[routes]]\nname = \"order\"\npath_prefix = \"/\"\n{own}\n\
                 [[routes.events]]\nname = \"sale\"\nstart = \"2027-11-26T20:00:00Z\"\n\
                 duration = \"30m\"\n{event}\n"
            )
        };
        let steady = Profile::from_points(&[(0.0, 150.0), (60.0, 150.0)]).unwrap();
        let ramps = Profile::from_points(&[
            (0.0, 0.0),
            (40.0, 400.0),
            (41.0, 0.0),
            (60.0, 0.0),
            (100.0, 400.0),
            (101.0, 0.0),
            (120.0, 0.0),
        ])
        .unwrap();
        let cases = [
            (
                "base_limit = 200\ncut_limit = 60",
                "cut_limit = 150",
                &steady,
                ("cut_limit", 150.0, 67.0),
                "base_limit = 90",
                "base_limit = 90\ncut_limit = 60",
                "cut_limit = 67",
            ),
            (
                "base_limit = 1000\ncut_limit = 300",
                "safe_roc = 60",
                &ramps,
                ("safe_roc", 60.0, 18.0),
                "base_limit = 90\ncut_limit = 27\ndanger_roc = 24",
                "base_limit = 90\ncut_limit = 27\ndanger_roc = 24",
                "safe_roc = 18",
            ),
        ];
        // Each case: the route's own settings and the event's, the traffic, the
        // event's hint, the route's own hints, and the settings they make.
        for (own, event, profile, (parameter, from, to), own_hints, own_after, event_after) in cases
        {
            let config = Config::from_toml_str(&route(own, event), "test").unwrap();
            let run = Simulator::new(config.clone(), Some("order"))
                .unwrap()
                .capacity(100)
                .run_profile_all(profile, ArrivalModel::Uniform)
                .unwrap();
            let hints = hints(&run, &config, &Policy::default());
            let of_event: Vec<_> = hints
                .iter()
                .filter(|h| h.event.as_deref() == Some("sale"))
                .map(|h| {
                    (
                        h.parameter.as_deref(),
                        h.current.clone(),
                        h.suggested.clone(),
                    )
                })
                .collect();
            assert_eq!(
                of_event,
                [(
                    Some(parameter),
                    Some(Setting::Number(from)),
                    Some(Setting::Number(to))
                )],
                "{hints:#?}"
            );
            let routes_own: Vec<String> = hints
                .iter()
                .filter(|h| h.event.is_none())
                .filter_map(|h| {
                    Some(format!(
                        "{} = {}",
                        h.parameter.as_ref()?,
                        h.suggested.as_ref()?
                    ))
                })
                .collect();
            assert_eq!(routes_own.join("\n"), own_hints, "{hints:#?}");
            let after = route(own_after, event_after);
            Config::from_toml_str(&after, "test").unwrap();
            let route_alone = route(own_after, event);
            let refused = Config::from_toml_str(&route_alone, "test").unwrap_err();
            assert!(
                refused.to_string().contains("routes[0].events[0]."),
                "{refused}"
            );
        }
    }

    /// Every kind of event beside a route whose base_limit (200 → 90) and danger_roc
    /// (80 → 24) are lowered: only an event that takes the lowered setting from the
    /// route and writes its own cut_limit or safe_roc beyond it gets a hint, each
    /// event its own, and the config every hint makes, the route's and the events'
    /// together, is one the file's rules accept. An event that writes a setting at the
    /// route's value keeps it, and gets none.
    #[test]
    fn only_events_that_take_a_lowered_setting_follow_it_and_all_hints_apply() {
        use crate::hints::{follow_in_events, Setting, Severity};
        let events = [
            // Takes base_limit and danger_roc, writes both beside them.
            ("both", "cut_limit = 150\nsafe_roc = 60"),
            // Writes its own base_limit: its cut_limit stays beside it.
            ("own_base", "base_limit = 200\ncut_limit = 150"),
            // A cut_limit already within the lowered base limit.
            ("within", "cut_limit = 80"),
            // Its own thresholds, in the other mode.
            (
                "relative",
                "roc_mode = \"relative\"\ndanger_roc = 1.0\nsafe_roc = 0.5\nmin_rps = 5",
            ),
            // Its own part already lowers its cut_limit.
            ("judged", "cut_limit = 120"),
            // Writes its own danger_roc, the route's value: its safe_roc stays below it.
            ("own_danger", "danger_roc = 80\nsafe_roc = 60"),
        ];
        let toml = |own: &str, written: &dyn Fn(&str, &str) -> String| {
            let mut t = format!("[[routes]]\nname = \"order\"\npath_prefix = \"/\"\n{own}\n");
            for (i, (name, fields)) in events.iter().enumerate() {
                t.push_str(&format!(
                    "[[routes.events]]\nname = \"{name}\"\nstart = \"2027-11-26T1{i}:00:00Z\"\n\
                     duration = \"30m\"\n{}\n",
                    written(name, fields)
                ));
            }
            t
        };
        let own = "base_limit = 200\ncut_limit = 60\ndanger_roc = 80\nsafe_roc = 20";
        let config = Config::from_toml_str(&toml(own, &|_, f| f.to_owned()), "test").unwrap();
        let route = &config.routes[0];
        let hint = |event: Option<&str>, parameter: &str, from: f64, to: f64| Hint {
            route: "order".into(),
            rule: "r".into(),
            severity: Severity::Warn,
            parameter: Some(parameter.into()),
            current: Some(Setting::Number(from)),
            suggested: Some(Setting::Number(to)),
            reason: String::new(),
            event: event.map(str::to_owned),
        };
        let mut all = vec![
            hint(None, "base_limit", 200.0, 90.0),
            hint(None, "danger_roc", 80.0, 24.0),
            hint(Some("judged"), "cut_limit", 120.0, 90.0),
        ];
        let follow = follow_in_events(&route.algorithm, &route.controller, &route.events, &all);
        let changes: Vec<_> = follow
            .iter()
            .map(|h| {
                (
                    h.event.clone().unwrap(),
                    h.parameter.clone().unwrap(),
                    h.suggested.clone().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            changes,
            [
                ("both".into(), "cut_limit".into(), Setting::Number(67.0)),
                ("both".into(), "safe_roc".into(), Setting::Number(18.0)),
            ],
            "{follow:#?}"
        );
        all.extend(follow);
        // Each hint applied in its entry: the route's own, or its event's.
        let apply = |fields: &str, event: Option<&str>| {
            let mut lines: Vec<String> = fields.lines().map(str::to_owned).collect();
            for h in all.iter().filter(|h| h.event.as_deref() == event) {
                let (p, v) = (h.parameter.as_ref().unwrap(), h.suggested.as_ref().unwrap());
                lines.retain(|l| !l.starts_with(&format!("{p} =")));
                lines.push(format!("{p} = {v}"));
            }
            lines.join("\n")
        };
        let after = toml(&apply(own, None), &|name, f| apply(f, Some(name)));
        Config::from_toml_str(&after, "test").unwrap_or_else(|e| panic!("{e}\n{after}"));
    }

    #[test]
    fn rows_group_into_seconds_with_state_time_cuts_and_demand() {
        let rows: Vec<SlotRow> = (0..20)
            .map(|k| {
                let mut row = SlotRow::empty(f64::from(k) * 0.1);
                row.offered = if k < 10 { 10 } else { 30 };
                row.admitted = row.offered - u64::from(k >= 15);
                row.rejected.roc_cut = u64::from(k >= 15);
                row.overload = u64::from(k == 19);
                row.level_capacity = 100.0;
                row.level = if k >= 15 { 0.5 } else { 50.0 };
                row.roc = f64::from(k);
                row.state = if k >= 15 {
                    ControllerState::Cut
                } else {
                    ControllerState::Normal
                };
                row
            })
            .collect();
        let bucket = Algorithm::TokenBucket {
            burst: Duration::from_secs(1),
        };
        let out = intervals(&result(rows), 5, &bucket, true, &[]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].offered, 100);
        assert_eq!(out[1].offered, 300);
        assert_eq!(out[1].rejected[Reason::RocCut.index()], 5);
        assert_eq!(out[1].cuts, 1);
        assert_eq!(out[1].cut_roc, 15.0);
        assert!((out[1].time_in(ControllerState::Cut) - 0.5).abs() < 1e-9);
        // Half-window of 5 slots of 0.1 s: 5 × 30 arrivals in 0.5 s.
        assert!((out[1].peak_demand_rps - 300.0).abs() < 1e-9);
        assert_eq!(out[0].peak_demand_rps, 100.0);
        let up = out[1].upstream.as_ref().unwrap();
        assert_eq!((up.requests, up.errors), (295, 1));
        assert!(
            (out[1].exhausted_s - 0.5).abs() < 1e-9,
            "tokens < 1 from slot 15"
        );
        assert_eq!(out[0].exhausted_s, 0.0);
        assert!(intervals(&result(Vec::new()), 5, &bucket, false, &[]).is_empty());
    }

    /// A result whose slot length is no duration (its fields are public, so a caller
    /// may have set any) gives intervals of no length, not a panic: the slot was made
    /// a `Duration` with `from_secs_f64`, which panics on a negative or NaN value.
    #[test]
    fn a_slot_length_that_is_no_duration_is_no_panic() {
        let rows: Vec<SlotRow> = (0..20)
            .map(|k| {
                let mut row = SlotRow::empty(f64::from(k) * 0.1);
                row.offered = 10;
                row
            })
            .collect();
        let bucket = Algorithm::TokenBucket {
            burst: Duration::from_secs(1),
        };
        for slot_s in [-0.1, f64::NAN, f64::INFINITY, 1e300] {
            let mut odd = result(rows.clone());
            odd.summary.slot_s = slot_s;
            let out = intervals(&odd, 5, &bucket, false, &[]);
            assert_eq!(out.iter().map(|i| i.offered).sum::<u64>(), 200, "{slot_s}");
        }
    }

    /// An event whose edges fall within a second (from 0.5 s to 1.5 s): the intervals
    /// were whole seconds grouped by their start, so the event's part was [1 s, 2 s),
    /// half of it under the route's own profile, and the event's first half went to
    /// the route's own part. Split at the edges, each part is exactly the time it ran.
    #[test]
    fn an_events_edges_within_a_second_split_the_intervals() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    [[routes.events]]\nname = \"sale\"\n\
                    start = \"1970-01-01T00:00:00.5Z\"\nduration = \"1s\"\nbase_limit = 500\n";
        let config = Config::from_toml_str(toml, "test").unwrap();
        let route = &config.routes[0];
        // Row k, from k × 0.1 s, offers k requests.
        let rows: Vec<SlotRow> = (0..30u32)
            .map(|k| {
                let mut row = SlotRow::empty(f64::from(k) * 0.1);
                row.offered = u64::from(k);
                row
            })
            .collect();
        let edges = [0.5, 1.5];
        let all = intervals(&result(rows), 5, &route.algorithm, false, &edges);
        let groups = by_profile(route, 0.0, all);
        let parts: Vec<_> = groups
            .iter()
            .map(|(s, part)| {
                let starts: Vec<u64> = part.iter().map(|i| i.start.as_u64() / 1_000_000).collect();
                (
                    s.event.clone(),
                    s.params.base_limit_rps,
                    starts,
                    part.iter().map(|i| i.offered).sum::<u64>(),
                )
            })
            .collect();
        assert_eq!(
            parts,
            [
                (
                    None,
                    200.0,
                    vec![0, 1500, 2500],
                    (0..5u64).chain(15..30).sum()
                ),
                (Some("sale".into()), 500.0, vec![500], (5..15u64).sum()),
            ]
        );
    }

    /// A run takes the keys a partitioned route refused once per interval of its
    /// hints, as the rows come, not per slot: each interval holds the keys refused in
    /// it, an event's edge within a second included. Three clients one after the
    /// other, each at 20 req/s against 1 per key: the interval from 0 s holds client
    /// 1, the sale's [0.5 s, 1.5 s) client 2, the one from 1.5 s client 3, and the one
    /// from 2.5 s none.
    #[test]
    fn the_keys_refused_are_taken_per_interval() {
        use crate::sim::{Request, Simulator};
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\npartition = \"ip\"\n\
                    base_limit = 1\ncut_limit = 1\n\
                    [[routes.events]]\nname = \"sale\"\n\
                    start = \"1970-01-01T00:00:00.5Z\"\nduration = \"1s\"\nbase_limit = 1\n";
        let config = Config::from_toml_str(toml, "test").unwrap();
        let client = |k: u8| Some(std::net::IpAddr::from([10, 0, 0, k]));
        // Every 50 ms until 2.5 s: client 1 until 0.5 s, 2 until 1.5 s, then 3.
        let requests = (0..50u64).map(|n| Request {
            at: crate::clock::Nanos::from_millis(n * 50),
            route: 0,
            client: client(match n * 50 {
                0..500 => 1,
                500..1500 => 2,
                _ => 3,
            }),
        });
        let sim = Simulator::new(config.clone(), None).unwrap();
        let run = sim.run_requests(requests, Duration::from_secs(3)).unwrap();
        let result = &run.routes[0];
        let route = &config.routes[0];
        let edges = event_edges(route, result.summary.start_unix_s);
        let all = intervals(result, 5, &route.algorithm, false, &edges);
        let starts: Vec<u64> = all.iter().map(|i| i.start.as_u64() / 1_000_000).collect();
        assert_eq!(starts, [0, 500, 1500, 2500]);
        let counts: Vec<Option<u64>> = all
            .iter()
            .map(|i| i.refused_keys.as_ref().map(|s| s.estimate()))
            .collect();
        assert_eq!(counts, [Some(1), Some(1), Some(1), None]);
        // Three sketches of one key each, other keys: together, 3 (or 2, where two
        // keys' hashes, random per table, share a register).
        let together = Interval::refused_keys(&all).unwrap();
        assert!((2..=3).contains(&together), "{together}");
        assert_eq!(result.refused_keys.len(), 3);
    }
}
