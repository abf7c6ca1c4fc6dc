//! The proxy's side of the tuning hints: the bounded [`History`] it keeps of every
//! route, fed by the engine's sample hook, a timer and the forwarder's
//! [`UpstreamMeter`], and the report behind `GET /admin/hints`.
//!
//! The timer ticks every `[hints] interval`, and at each scheduled event's start and
//! end ([`Advisor::next_tick`]): an interval ends at an event's edge (of its own
//! route's events only), so the event's part of a period is judged over exactly the
//! time it ran, and the route's own part over the rest. Where the profile due changes
//! with no edge ahead (a reload, the wall clock stepped), the timer ticks at its next
//! look, within a second.

use crate::clock::Nanos;
use crate::config::HintsConfig;
use crate::engine::{Engine, RouteId, SlotReport};
use crate::hints::{
    follow_in_events, one_per_route_setting, Hint, HintsReport, History, Policy, RouteHints,
    RouteSettings, UpstreamMeter,
};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Keeps the history the tuning hints are computed from, and gives the hints.
#[derive(Debug)]
pub struct Advisor {
    history: Mutex<History>,
    /// `[hints] keep`: the longest period a report looks at.
    keep: Duration,
    meter: Arc<UpstreamMeter>,
    policy: Policy,
    /// The store that shares the distributed routes, once `serve` has opened it: their
    /// history is this instance's share ([`RouteSettings::distributed`]).
    #[cfg(feature = "redis")]
    store: std::sync::OnceLock<crate::store::redis::RedisStore>,
}

impl Advisor {
    /// An advisor with an empty history shaped by `config`.
    pub(crate) fn new(config: &HintsConfig) -> Self {
        Advisor {
            history: Mutex::new(History::new(config.interval, config.keep)),
            keep: config.keep,
            meter: Arc::new(UpstreamMeter::new()),
            policy: config.policy.clone(),
            #[cfg(feature = "redis")]
            store: std::sync::OnceLock::new(),
        }
    }

    /// Judges the routes `store` shares as distributed from the next tick on (`serve`
    /// calls it once, as it opens the store; a second store is ignored).
    #[cfg(feature = "redis")]
    pub(crate) fn share_with(&self, store: crate::store::redis::RedisStore) {
        let _ = self.store.set(store);
    }

    /// The profile due at `now` for `route` of `engine`, as the history takes it:
    /// distributed where the store shares the route.
    fn settings_at(&self, engine: &Engine, route: RouteId, now: Nanos) -> Option<RouteSettings> {
        let settings = engine.route_settings_at(route, now)?;
        #[cfg(feature = "redis")]
        let settings = RouteSettings {
            distributed: self
                .store
                .get()
                .is_some_and(|store| store.shares(engine, route)),
            ..settings
        };
        Some(settings)
    }

    pub(super) fn history(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// When the tick after one at `last` is due: when the first route's open interval
    /// has run `[hints] interval`, or earlier at the first start or end of a scheduled
    /// event of `engine` after `last`, so that no interval straddles an event's edge
    /// (an event adds at most two intervals to its route's history: the ones its edges
    /// cut short). At `last` itself when the profile due at `last` is not the one a
    /// route's open interval began under, or a route has none: a reload brought or
    /// took away a running event or a route, or the wall clock was stepped across an
    /// event's edge (the engine places events again from it), where no edge lies ahead
    /// to tick at.
    pub fn next_tick(&self, engine: &Engine, last: Nanos) -> Nanos {
        // Route locks are taken before, never under, the history's lock.
        let due: Vec<_> = engine
            .route_ids()
            .filter_map(|id| engine.route_settings_at(id, last))
            .collect();
        let regular = {
            let history = self.history();
            let mut regular = last + history.interval();
            for s in &due {
                match closes_at(&history, s) {
                    Some(at) => regular = regular.min(at),
                    None => return last,
                }
            }
            regular
        };
        engine
            .next_event_edge(last)
            .filter(|&edge| edge < regular)
            .unwrap_or(regular)
    }

    /// Where the forwarder records upstream outcomes.
    pub(crate) fn meter(&self) -> Arc<UpstreamMeter> {
        Arc::clone(&self.meter)
    }

    /// One completed slot (from the engine's sample hook).
    pub(crate) fn on_slot(&self, route: &str, report: &SlotReport) {
        self.history().on_slot(route, report);
    }

    /// Closes the current interval of every route of `engine` at `now` and opens the
    /// next, judged under the profile due at `now` (before a report that must cover
    /// up to `now`; the proxy calls [`Advisor::tick_due`]).
    pub fn tick(&self, engine: &Engine, now: Nanos) {
        self.close(engine, now, true);
    }

    /// Closes the current interval of each route of `engine` that is due at `now`, and
    /// opens its next, judged under the profile due at `now` (the proxy calls it when
    /// [`Advisor::next_tick`] says). A route is due when its interval has run `[hints]
    /// interval`, when the profile due is not the one its interval began under (an
    /// edge of one of its events), and when it has no history yet: another route's
    /// event does not cut its interval short.
    pub fn tick_due(&self, engine: &Engine, now: Nanos) {
        self.close(engine, now, false);
    }

    fn close(&self, engine: &Engine, now: Nanos, all: bool) {
        // Route locks are taken before, never under, the history's lock: the sample
        // hook takes them in the other order.
        let snapshots = engine.snapshot(now);
        let settings: Vec<_> = engine
            .route_ids()
            .filter_map(|id| self.settings_at(engine, id, now).map(|s| (id, s)))
            .collect();
        let mut history = self.history();
        // The keys refused are taken (emptied) only from the routes whose interval
        // closes: the others' go on into theirs.
        let (snapshots, settings): (Vec<_>, Vec<_>) = snapshots
            .into_iter()
            .zip(settings)
            .filter(|(_, (_, s))| all || closes_at(&history, s).is_none_or(|at| at <= now))
            .map(|(mut snap, (id, s))| {
                snap.refused_keys = engine.take_refused_keys(id);
                (snap, s)
            })
            .unzip();
        // A distributed route's closing interval takes the fleet's demand that Redis's
        // answers gave in it (the store's lock is a leaf: taken under the history's).
        #[cfg(feature = "redis")]
        if let Some(store) = self.store.get() {
            for s in settings.iter().filter(|s| s.distributed) {
                if let Some(demand) = store.take_fleet_demand(&s.name) {
                    history.fleet_demand(&s.name, demand);
                }
            }
        }
        history.tick(now, &snapshots, settings, Some(&self.meter));
    }

    /// The hints over the last `period` before `now`, as `GET /admin/hints` returns
    /// them, one suggestion per route-only setting across a route's parts
    /// ([`one_per_route_setting`]): the closed intervals that began within it. The
    /// interval still open is not included: call [`Advisor::tick`] first to close it.
    /// A period is at least two intervals (a shorter one holds no closed interval, and
    /// read as no traffic) and at most `[hints] keep`; the report's `period_s` says
    /// the period it looked at, its `covered_s` how much of it the history covers. Only the routes `engine` has are reported: a route a
    /// reload removed has no setting left to change (its history stays until `keep`
    /// ends, and is reported again if a reload brings the route back).
    pub fn report(&self, period: Duration, now: Nanos, engine: &Engine) -> HintsReport {
        let h = self.history();
        let interval = h.interval();
        let period = period.max(interval.saturating_mul(2)).min(self.keep);
        let since = Nanos::new(
            now.as_u64()
                .saturating_sub(u64::try_from(period.as_nanos()).unwrap_or(u64::MAX)),
        );
        let routes = h.since(since);
        drop(h);
        let mut routes: Vec<RouteHints> = routes
            .iter()
            .filter(|(settings, _)| engine.route_id(&settings.name).is_some())
            .map(|(settings, intervals)| RouteHints::new(settings, intervals, None, &self.policy))
            .collect();
        // One route's parts come together: one suggestion per route-only setting
        // across them.
        // and the events' settings a lowered one of the route's own would leave refused
        // lowered with it.
        for parts in routes.chunk_by_mut(|a, b| a.route == b.route) {
            one_per_route_setting(parts.iter_mut().map(|r| (r.event.as_deref(), &mut r.hints)));
            let Some(id) = engine.route_id(&parts[0].route) else {
                continue;
            };
            // One state of the route: a runtime change between separate reads of the
            // three would judge the events by one state and the route by another.
            let Some(t) = engine.route_tuning(id) else {
                continue;
            };
            let all: Vec<Hint> = parts.iter().flat_map(|r| r.hints.iter().cloned()).collect();
            let follow = follow_in_events(&t.algorithm, &t.own, &t.events, &all);
            if let Some(own_part) = parts.iter_mut().find(|r| r.event.is_none()) {
                own_part.hints.extend(follow);
            }
        }
        HintsReport::new(period.as_secs_f64(), interval.as_secs_f64(), routes)
    }
}

/// When the open interval of the route `due` describes closes: once it has run `[hints]
/// interval`; `None`, at once, when it began under another profile than the one `due`
/// says is due, or no tick has seen the route yet. ([`Advisor::next_tick`] and
/// [`Advisor::tick_due`] judge a route by it alike.)
fn closes_at(history: &History, due: &RouteSettings) -> Option<Nanos> {
    history
        .open(&due.name)
        .filter(|open| open.event == due.event)
        .map(|open| open.start + history.interval())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::Key;
    use crate::hints::Setting;
    use crate::sim::{ArrivalModel, Scenario};
    use std::time::UNIX_EPOCH;

    /// The engine of config `toml`, whose slot reports feed a new advisor.
    fn advised(toml: &str) -> (Arc<Advisor>, Engine) {
        let config = Config::from_toml_str(toml, "test").unwrap();
        let advisor = Arc::new(Advisor::new(&config.hints));
        let hook = Arc::clone(&advisor);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH)
            .unwrap()
            .with_sample_hook(Arc::new(move |route, report| hook.on_slot(route, report)));
        (advisor, engine)
    }

    /// `GET /admin/hints` of a route whose scheduled event (not running in the period)
    /// takes the route's base limit and writes a cut_limit of 150 beside it, under 150
    /// req/s against an upstream that fails beyond 100 a second: lowering the route's
    /// base limit alone (200 → 130, 90% of the rate it saturated at) was advised, which
    /// the event's cut_limit of 150 would leave refused.
    /// The event's cut_limit is lowered with it, in the route's own entry, naming the
    /// event.
    #[test]
    fn a_lowered_base_limit_lowers_the_cut_limit_an_event_writes_beside_it() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"2027-11-26T20:00:00Z\"\n\
                    duration = \"30m\"\ncut_limit = 150\n";
        let (advisor, engine) = advised(toml);
        let id = engine.route_at(0).unwrap();
        let route: Arc<str> = "r".into();
        let meter = advisor.meter();
        let steady = crate::sim::Profile::from_points(&[(0.0, 150.0), (60.0, 150.0)]).unwrap();
        let mut due = Nanos::from_secs(10);
        let (mut second, mut admitted) = (0, 0);
        for now in steady.arrivals(ArrivalModel::Uniform) {
            while now >= due {
                advisor.tick_due(&engine, due);
                due = due + advisor.history().interval();
            }
            if engine.check(id, Key::None, now).is_admit() {
                if now.as_u64() / 1_000_000_000 != second {
                    (second, admitted) = (now.as_u64() / 1_000_000_000, 0);
                }
                admitted += 1;
                meter.record(&route, Duration::from_millis(5), admitted > 100);
            }
        }
        let end = Nanos::from_secs(60);
        engine.catch_up(id, end);
        advisor.tick_due(&engine, end);
        let report = advisor.report(Duration::from_secs(3600), end, &engine);
        assert_eq!(report.routes.len(), 1, "{report:#?}");
        let hints = &report.routes[0].hints;
        let changes: Vec<_> = hints
            .iter()
            .filter_map(|h| {
                Some((
                    h.event.as_deref(),
                    h.parameter.as_deref()?,
                    h.current.clone()?,
                    h.suggested.clone()?,
                ))
            })
            .collect();
        assert_eq!(
            changes,
            [
                (
                    None,
                    "base_limit",
                    Setting::Number(200.0),
                    Setting::Number(130.0)
                ),
                (
                    Some("sale"),
                    "cut_limit",
                    Setting::Number(150.0),
                    Setting::Number(97.0)
                ),
            ],
            "{hints:#?}"
        );
    }

    /// `GET /admin/hints` after `PUT /admin/routes/r` lowered the route's danger_roc
    /// from 80 to 50, below the safe_roc of 60 its event writes: the event keeps the
    /// danger_roc of 80 it was written over (the three of ROC go together), so the
    /// change was taken. A lower_danger_roc of the route's, 50 → 40, then needs the
    /// event's safe_roc below 40 where the file's event takes danger_roc from the
    /// route: 30, its ratio to the danger_roc it runs (60 of 80). It was scaled by the
    /// route's 50 instead, to 48, not below the 40 its own reason named.
    #[test]
    fn an_events_safe_roc_follows_below_a_danger_roc_lowered_after_a_runtime_change() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"2027-11-26T20:00:00Z\"\n\
                    duration = \"30m\"\nsafe_roc = 60\n";
        let (_, engine) = advised(toml);
        let id = engine.route_at(0).unwrap();
        let mut params = engine.route_params(id).unwrap();
        params.danger_roc = 50.0;
        engine
            .update_route(id, params, Nanos::from_secs(1))
            .unwrap();
        let t = engine.route_tuning(id).unwrap();
        let lowered = Hint {
            route: "r".into(),
            rule: "lower_danger_roc".into(),
            severity: crate::hints::Severity::Warn,
            parameter: Some("danger_roc".into()),
            current: Some(Setting::Number(50.0)),
            suggested: Some(Setting::Number(40.0)),
            reason: String::new(),
            event: None,
        };
        let follow = follow_in_events(&t.algorithm, &t.own, &t.events, &[lowered]);
        let changes: Vec<_> = follow
            .iter()
            .map(|h| {
                (
                    h.event.as_deref(),
                    h.parameter.as_deref(),
                    h.suggested.clone(),
                )
            })
            .collect();
        assert_eq!(
            changes,
            [(Some("sale"), Some("safe_roc"), Some(Setting::Number(30.0)))],
            "{follow:#?}"
        );
    }

    /// `serve`'s hints, with the default `[hints]` (10 s intervals), over the flash
    /// sale (40 req/s, 600 from 20 s to 40 s, back to 40 by 50 s) on a route whose
    /// sale event runs from 20 s to 60 s with a base limit of 500, against an upstream
    /// that takes 300 req/s (an admitted request beyond that in a second fails). The
    /// first tick comes `phase` seconds in; the next ones when [`Advisor::next_tick`]
    /// says or, with `edges` false, every interval only (as before). Returns the
    /// event's `base_limit` change, if any.
    fn sale_advice(phase: u64, edges: bool) -> Option<(Setting, Setting)> {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:20Z\"\n\
                    duration = \"40s\"\nbase_limit = 500\ncut_limit = 150\ndanger_roc = 200\n";
        let (advisor, engine) = advised(toml);
        let id = engine.route_at(0).unwrap();
        let route: Arc<str> = "r".into();
        let meter = advisor.meter();
        let (mut last, mut due) = (Nanos::ZERO, Nanos::from_secs(phase));
        let mut tick = |now: Nanos| {
            while now >= due {
                advisor.tick_due(&engine, due);
                last = due;
                due = if edges {
                    advisor.next_tick(&engine, last)
                } else {
                    last + advisor.history().interval()
                };
            }
        };
        let (mut second, mut admitted) = (0, 0);
        for now in Scenario::FlashSale
            .profile()
            .arrivals(ArrivalModel::Uniform)
        {
            tick(now);
            if engine.check(id, Key::None, now).is_admit() {
                if now.as_u64() / 1_000_000_000 != second {
                    (second, admitted) = (now.as_u64() / 1_000_000_000, 0);
                }
                admitted += 1;
                meter.record(&route, Duration::from_millis(5), admitted > 300);
            }
        }
        let end = Nanos::from_secs(60);
        engine.catch_up(id, end);
        tick(end);
        let report = advisor.report(Duration::from_secs(3600), end, &engine);
        let sale = report
            .routes
            .iter()
            .find(|r| r.event.as_deref() == Some("sale"))?;
        let lower = sale.hints.iter().find(|h| {
            h.rule == "lower_base_limit" && h.parameter.as_deref() == Some("base_limit")
        })?;
        Some((lower.current.clone()?, lower.suggested.clone()?))
    }

    /// "Event blur": with intervals of 10 s ending only every 10 s, an interval in
    /// which the sale began went with the route's own profile, and with it the sale's
    /// onset, where its base limit shows too high: the event's `lower_base_limit` was
    /// lost in some phases of the interval grid against the event's start. Ending an
    /// interval at each edge of the event finds it at every phase.
    #[test]
    fn the_default_interval_finds_an_events_advice_at_every_phase() {
        let found: Vec<_> = (0..10).map(|phase| sale_advice(phase, true)).collect();
        for (phase, advice) in found.iter().enumerate() {
            let (current, suggested) = advice
                .clone()
                .unwrap_or_else(|| panic!("no lower_base_limit at phase {phase}"));
            assert_eq!(current, Setting::Number(500.0), "phase {phase}");
            assert!(
                matches!(suggested, Setting::Number(s) if s < 300.0),
                "phase {phase}: {suggested:?}"
            );
        }
        // The event's part is the same time whatever the phase: so is the advice.
        assert!(found.iter().all(|a| *a == found[0]), "{found:?}");
        // Without the early ticks, some phases lose it.
        let lost = (0..10).filter(|&p| sale_advice(p, false).is_none()).count();
        assert!(lost > 0, "lost in {lost} of 10 phases");
    }

    /// The profile due can change where no edge lies ahead of the last tick: a reload
    /// that brings an event already running, takes away the one running or adds a
    /// route, or the wall clock stepped across an event's edge (the engine places
    /// events again from it).
    /// The next tick is then due at once, not up to an interval later with the
    /// interval straddling the change under the profile it began with.
    #[test]
    fn a_profile_due_without_an_edge_ahead_ends_the_interval_at_once() {
        let config = |events: &str| {
            let toml = format!("[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n{events}");
            Config::from_toml_str(&toml, "test").unwrap()
        };
        let sale = config(
            "[[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:20Z\"\n\
             duration = \"40s\"\nbase_limit = 500\ncut_limit = 150\n",
        );
        let plain = config("");
        let (s, wall) = (Nanos::from_secs, |t| UNIX_EPOCH + Duration::from_secs(t));
        let advisor = Advisor::new(&plain.hints);
        let engine = Engine::new(&plain, Nanos::ZERO, UNIX_EPOCH).unwrap();
        advisor.tick_due(&engine, s(30));
        assert_eq!(advisor.next_tick(&engine, s(30)), s(40));
        // A reload at 31 s brings the sale, running since 20 s: no edge lies ahead.
        let engine = engine.reload(&sale, s(31), wall(31)).unwrap();
        assert_eq!(advisor.next_tick(&engine, s(30)), s(30));
        advisor.tick_due(&engine, s(31));
        assert_eq!(advisor.next_tick(&engine, s(31)), s(41));
        // A reload at 33 s takes it away while it runs.
        let engine = engine.reload(&plain, s(33), wall(33)).unwrap();
        assert_eq!(advisor.next_tick(&engine, s(31)), s(31));
        advisor.tick_due(&engine, s(33));
        // A reload at 34 s adds a route: its history begins at once.
        let two = "[[routes]]\nname = \"s\"\npath_prefix = \"/s\"\n\
                   [[routes]]\nname = \"r\"\npath_prefix = \"/\"\n";
        let two = Config::from_toml_str(two, "test").unwrap();
        let engine = engine.reload(&two, s(34), wall(34)).unwrap();
        assert_eq!(advisor.next_tick(&engine, s(33)), s(33));
        advisor.tick_due(&engine, s(34));
        // Only the new route's interval began then: r's, begun at 33 s, runs on.
        assert_eq!(advisor.history().open("s").map(|i| i.start), Some(s(34)));
        assert_eq!(advisor.next_tick(&engine, s(34)), s(43));

        // The wall clock stepped 15 s forward at 12 s: the sale began at 5 s.
        let advisor = Advisor::new(&sale.hints);
        let engine = Engine::new(&sale, Nanos::ZERO, UNIX_EPOCH).unwrap();
        advisor.tick_due(&engine, s(10));
        assert_eq!(advisor.next_tick(&engine, s(10)), s(20));
        engine.align_events(s(12), wall(27));
        assert_eq!(advisor.next_tick(&engine, s(10)), s(10));
        advisor.tick_due(&engine, s(12));
        assert_eq!(advisor.next_tick(&engine, s(12)), s(22));
        // Then 10 s back at 14 s: the sale now begins at 15 s.
        engine.align_events(s(14), wall(19));
        assert_eq!(advisor.next_tick(&engine, s(12)), s(12));
        advisor.tick_due(&engine, s(14));
        assert_eq!(advisor.next_tick(&engine, s(14)), s(15));
    }

    /// An event's edges end its own route's interval, not every route's: a route
    /// without events keeps whole intervals whatever other routes schedule, and with
    /// them its share of the history's bound (twice `keep ÷ interval` intervals), which
    /// other routes' short events used up.
    #[test]
    fn an_events_edges_end_only_its_own_routes_interval() {
        let toml = "[[routes]]\nname = \"a\"\npath_prefix = \"/a\"\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:20Z\"\n\
                    duration = \"5s\"\nbase_limit = 500\ncut_limit = 150\n\
                    [[routes]]\nname = \"b\"\npath_prefix = \"/\"\n";
        let config = Config::from_toml_str(toml, "test").unwrap();
        let advisor = Advisor::new(&config.hints);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let mut last = Nanos::ZERO;
        advisor.tick_due(&engine, last);
        while last < Nanos::from_secs(60) {
            last = advisor.next_tick(&engine, last);
            advisor.tick_due(&engine, last);
        }
        let starts = |route: &str| {
            let mut starts: Vec<u64> = advisor
                .history()
                .since(Nanos::ZERO)
                .iter()
                .filter(|(s, _)| s.name == route)
                .flat_map(|(_, i)| i.iter().map(|i| i.start.as_u64() / 1_000_000_000))
                .collect();
            starts.sort_unstable();
            starts
        };
        assert_eq!(starts("b"), [0, 10, 20, 30, 40, 50]);
        assert_eq!(starts("a"), [0, 10, 20, 25, 35, 45]);
    }

    /// Each interval holds the keys its route refused in it, taken from the engine as
    /// the interval closes: a client flooding a per-IP route in the first two of three
    /// 1 s intervals is refused in those two and none in the third (the take emptied
    /// the count), and the report counts it once over the period, not once an
    /// interval; a route limited as a whole has no count.
    #[test]
    fn each_interval_holds_the_keys_refused_in_it() {
        let toml = "[hints]\ninterval = \"1s\"\n\
                    [[routes]]\nname = \"login\"\npath = \"/login\"\npartition = \"ip\"\n\
                    base_limit = 5\ncut_limit = 1\ndanger_roc = 1000\nsafe_roc = 100\n\
                    [[routes]]\nname = \"rest\"\npath_prefix = \"/\"\n";
        let (advisor, engine) = advised(toml);
        let id = engine.route_at(0).unwrap();
        let client = Key::Ip(std::net::Ipv4Addr::new(203, 0, 113, 9).into());
        advisor.tick(&engine, Nanos::ZERO);
        for s in 0..3u64 {
            if s < 2 {
                for k in 0..50 {
                    let _ = engine.check(id, client, Nanos::from_millis(s * 1000 + k * 20));
                }
            }
            advisor.tick(&engine, Nanos::from_secs(s + 1));
        }
        let end = Nanos::from_secs(3);
        let refused: Vec<Option<u64>> = advisor
            .history()
            .since(Nanos::ZERO)
            .iter()
            .filter(|(s, _)| s.name == "login")
            .flat_map(|(_, i)| {
                i.iter()
                    .map(|i| i.refused_keys.as_ref().map(|s| s.estimate()))
            })
            .collect();
        assert_eq!(refused, [Some(1), Some(1), None]);
        let report = advisor.report(Duration::from_secs(3600), end, &engine);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["routes"][0]["route"], "login");
        assert_eq!(json["routes"][0]["refused_keys"], 1);
        assert_eq!(json["routes"][1]["route"], "rest");
        assert!(json["routes"][1].get("refused_keys").is_none(), "{json}");
    }

    /// The keys refused before a reload within an interval are the interval's: a
    /// reload that rebuilds the route (its `max_keys` changed) carries them into the
    /// new engine's route, whose tick takes them; they were lost with the old route.
    #[test]
    fn the_keys_refused_before_a_reload_are_the_intervals() {
        let toml = |max_keys: u32| {
            format!(
                "[hints]\ninterval = \"1s\"\n\
                 [[routes]]\nname = \"login\"\npath = \"/login\"\npartition = \"ip\"\n\
                 max_keys = {max_keys}\nbase_limit = 5\ncut_limit = 1\n"
            )
        };
        let (advisor, engine) = advised(&toml(100));
        let client = Key::Ip(std::net::Ipv4Addr::new(203, 0, 113, 9).into());
        advisor.tick(&engine, Nanos::ZERO);
        let id = engine.route_at(0).unwrap();
        for k in 0..20 {
            let _ = engine.check(id, client, Nanos::from_millis(k * 20));
        }
        let config = Config::from_toml_str(&toml(200), "test").unwrap();
        let engine = engine
            .reload(&config, Nanos::from_millis(500), UNIX_EPOCH)
            .unwrap();
        advisor.tick(&engine, Nanos::from_secs(1));
        let refused: Vec<Option<u64>> = advisor
            .history()
            .since(Nanos::ZERO)
            .iter()
            .flat_map(|(_, i)| {
                i.iter()
                    .map(|i| i.refused_keys.as_ref().map(|s| s.estimate()))
            })
            .collect();
        assert_eq!(refused, [Some(1)]);
    }

    /// A route a reload removed is not reported (it was, for as long as `keep`, with
    /// suggestions for settings no longer anywhere); one the reload keeps is.
    #[test]
    fn a_route_a_reload_removed_is_not_reported() {
        let two = "[hints]\ninterval = \"1s\"\n\
                   [[routes]]\nname = \"a\"\npath = \"/a\"\n\
                   [[routes]]\nname = \"b\"\npath_prefix = \"/\"\n";
        let (advisor, engine) = advised(two);
        for s in 1..=5 {
            advisor.tick(&engine, Nanos::from_secs(s));
        }
        let end = Nanos::from_secs(5);
        let names = |engine: &Engine| -> Vec<String> {
            let report = advisor.report(Duration::from_secs(3600), end, engine);
            report.routes.into_iter().map(|r| r.route).collect()
        };
        assert_eq!(names(&engine), ["a", "b"]);
        let one = "[[routes]]\nname = \"a\"\npath = \"/a\"\n";
        let reloaded = engine
            .reload(
                &Config::from_toml_str(one, "reloaded").unwrap(),
                end,
                UNIX_EPOCH,
            )
            .unwrap();
        assert_eq!(names(&reloaded), ["a"]);
    }

    /// `GET /admin/hints` judges a period with an event in parts, and `burst`, which
    /// no event takes, is the route's in both: bursts of 600 req/s every 10 s over 100
    /// against a base limit of 200, and of 160 during a sale from 20 s to 40 s, are
    /// bursts in each part. The report gives one `burst` suggestion for the route,
    /// with both parts' figures, and the other part a note saying where it is.
    #[test]
    fn the_report_gives_one_burst_suggestion_per_route() {
        let toml = "[hints]\ninterval = \"1s\"\n\
                    [[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    danger_roc = 2000\nsafe_roc = 100\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:00:20Z\"\n\
                    duration = \"20s\"\nbase_limit = 160\n";
        let (advisor, engine) = advised(toml);
        let id = engine.route_at(0).unwrap();
        let route: Arc<str> = "r".into();
        let meter = advisor.meter();
        let mut points = Vec::new();
        for k in 0..6 {
            let t = f64::from(k) * 10.0;
            points.extend([
                (t, 100.0),
                (t + 9.0, 100.0),
                (t + 9.0, 600.0),
                (t + 10.0, 600.0),
            ]);
        }
        let profile = crate::sim::Profile::from_points(&points).unwrap();
        let mut due = Nanos::ZERO;
        for now in profile.arrivals(ArrivalModel::Uniform) {
            while now >= due {
                advisor.tick_due(&engine, due);
                due = advisor.next_tick(&engine, due);
            }
            if engine.check(id, Key::None, now).is_admit() {
                meter.record(&route, Duration::from_millis(5), false);
            }
        }
        let end = Nanos::from_secs(60);
        engine.catch_up(id, end);
        advisor.tick(&engine, end);
        let report = advisor.report(Duration::from_secs(3600), end, &engine);
        let parts: Vec<_> = report.routes.iter().map(|r| r.event.clone()).collect();
        assert_eq!(parts, [None, Some("sale".to_owned())]);
        let hints: Vec<_> = report.routes.iter().flat_map(|r| &r.hints).collect();
        let bursts: Vec<_> = hints
            .iter()
            .filter(|h| h.parameter.as_deref() == Some("burst"))
            .collect();
        assert_eq!(bursts.len(), 1, "{hints:#?}");
        assert!(
            bursts[0].reason.contains("under the route's own profile, ")
                && bursts[0].reason.contains("under event sale, "),
            "{}",
            bursts[0].reason
        );
        assert!(
            hints.iter().any(|h| h.rule == "raise_burst"
                && h.parameter.is_none()
                && h.reason.starts_with("burst is the route's: one suggestion")),
            "{hints:#?}"
        );
    }
}
