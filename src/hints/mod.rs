//! Tuning hints: what rocgate has seen of a route's traffic, turned into suggested
//! values for its limits and thresholds, each with one sentence of reasoning that
//! quotes the figures.
//!
//! Pure: [`advise`] takes one route's [`RouteSettings`] and its [`Interval`]s over a
//! period (from a [`History`] in the proxy, or from a simulated run) and returns
//! [`Hint`]s, the same for the same input. A route without evidence for any rule gets
//! a single "no change" hint.
//!
//! Upstream health, per interval: *saturated* when more than
//! [`Policy::error_budget`] of forwarded requests failed or their p99 latency exceeded
//! [`Policy::latency_budget`]; *healthy* otherwise; *unknown* without measurements.
//! The rules, in the order they are reported:
//!
//! | rule | evidence | suggestion |
//! |---|---|---|
//! | `raise_base_limit` | over 10% rejected by the base limit while the upstream was measured and healthy (saturated in at most 5% of the intervals; in `shadow`, would have been, enforced: an `info` hint); on a partitioned route, whose limit is each key's, quoting the distinct keys refused over the period ("from about 1400 clients"), an `info` hint "only if many clients are refused" under [`MANY_KEYS`] (a few keys over their own limit, one client's flood: the limit working) or where its intervals carry no count; a `route_limit`'s refusals ([`Interval::route_limit_rejected`]) are not the base limit's and are left out; not on a route with tiers (their rejections count as the base limit's) | `base_limit` +30%, at most the upstream's known capacity; for a token bucket at most capacity ÷ (1 + burst in seconds), what a full bucket and a second of refill pass, and at most what it keeps (`limit × burst` in 4294967295 tokens); for a token bucket or a leaky bucket at most 2000000 req/s (what it enforces within 0.1%); for a window counter or `concurrency` at most what it holds |
//! | `raise_route_limit` | a partitioned route's `route_limit` refused over 10% of the requests out of a cut (taken from an interval's `limit` count first: exact in one wholly out of or wholly in a cut), each after its key's own limit admitted it, while the upstream was measured and healthy as for `raise_base_limit` (in `shadow`, would have: an `info` hint); its refusals during a cut are the cut's, not judged | `route_limit` +30%, at most the upstream's capacity (known, or measured where it saturated) ÷ (1 + burst in seconds), the burst of the total's token bucket: the route's `burst`, or a window counter's window; on a fleet sharing a Redis store, where each instance holds `route_limit ÷ n` ([`RouteSettings::route_limit_instances`]) and its history its share of the requests, a measured capacity (the rate this instance admitted) counts for the fleet times the instances sharing the total in the interval it was measured in ([`Interval::route_limit_instances`]), and bounds the fleet's total, saying so |
//! | `lower_base_limit` | the upstream saturated in at least 10% of the intervals (and 2) while under 1% was rejected (in the shadow modes, would have been, enforced), or while the base limit is above its capacity (in 2 intervals are enough when the capacity is known) | `base_limit` −20%, or 90% of the rate at which it saturated if lower; for a token bucket drained while the upstream saturated, `burst` with it to capacity ÷ base − 1 s when a full bucket and a second of refill would still exceed the capacity; `cut_limit` with it (same ratio) when it would be above the new base limit, and a scheduled event's that takes the base limit from the route ([`follow_in_events`]); `min_rps` with it (same ratio, at most half of it) when above it, but for `concurrency` and partitioned routes (per-key base limit, route-wide `min_rps`) |
//! | `raise_burst` | token bucket; the base limit's rejection ratio (in `shadow`, would-be) swings (≥ 2 intervals over 20% in runs right after an interval with room, under 2% rejected for any reason; ≥ 2 with room) while mean demand fits under the base limit and the upstream is healthy as above | `burst` to absorb the largest run's excess, at least doubled, at most 10 times, within capacity ÷ base − 1 s when the capacity is known, and within what the bucket keeps (49.7 days, 4294967295 tokens at the base limit, the raised one if raised) |
//! | `raise_danger_roc` | cuts during which demand stayed under `base_limit` and the upstream was not saturated (false cuts) | `danger_roc` 10% above both the p99.9 ROC (of the slots the controller acted on) and the ROC that started each false cut; `info` if a needed cut started below that, or if `lower_danger_roc` fires too |
//! | `lower_danger_roc` | upstream saturated, above the rate it usually takes healthily, in at least 2 intervals of ramps (ROC over `safe_roc`) that never reached a cut | `danger_roc` to 80% of the lowest such ramp's peak ROC; a scheduled event's `safe_roc` with it where the event takes `danger_roc` from the route and its own would no longer be below it ([`follow_in_events`]) |
//! | `raise_min_rps` | 3 or more cuts on a quiet route (mean demand under 20% of `base_limit`, one key's on a partitioned route); not for `concurrency` | `min_rps` 20% above the peak demand of those cuts, at least doubled, at most half of `base_limit` (of the one suggested with it, if lowered) |
//! | `faster_restore` | over 10% rejected while recovering beyond what the base limit would have rejected (its own rejections, and the cut's of demand over its rate, as `raise_base_limit` counts them), for at least two restore intervals, the upstream measured healthy throughout recovery, and the base limit within the upstream's capacity (as `raise_base_limit` bounds it); in a shadow mode what enforcing would have rejected (`info`) | `restore_step` doubled (or `restore_interval` halved once a step is half the cut's depth) |
//! | `shadow_verdict` | shadow modes: what enforcing would have rejected, by reason (the cut's of demand beyond the base limit's rate counted as the base limit's, as in `raise_base_limit`) | `mode = "enforce"` when that is under 1%, or when it would have fallen while the upstream was saturated; otherwise "not safe yet", naming what to tune: the other hint that changes it, or `base_limit` toward the demand seen while healthy, `danger_roc` / `cut_limit` for the cut; on a partitioned route the base limit's quoting the distinct keys enforcing would refuse over the period ("which would refuse about 1400 clients"; under [`MANY_KEYS`], "the limit working"; "if many clients would be refused" where no interval counted them), and `base_limit` without a value, and a `route_limit`'s would-be refusals out of a cut as the total's (`raise_route_limit`), not the base limit's; on a `concurrency` or partitioned route `danger_roc` without a value, saying why (`raise_danger_roc` does not judge the route) |
//!
//! Every rule compares quantities in the units of the setting it changes. On a
//! `concurrency` route the base limit counts requests in flight: the upstream's
//! capacity there is the most requests in flight seen in the intervals in which it
//! saturated ([`Interval::peak_in_flight`]), never a rate; `raise_danger_roc` and
//! `raise_min_rps` do not judge it (demand is a rate), nor does `faster_restore` (what
//! its base limit would have rejected during recovery is not observed). On any route
//! the capacity is not read from intervals mostly in `Cut` in which requests were
//! refused, where the cut is enforced: the cut limit bounded what was admitted there
//! (in `shadow_adaptive` the base limit did). On a partitioned route the base
//! limit is each key's: `raise_base_limit` scales it by the capacity over the route's
//! highest admitted rate, `lower_base_limit` takes no capacity target, and
//! `raise_burst`, `raise_danger_roc` and `faster_restore` do not judge it (one key's
//! demand is not observed). On a distributed route (shared through Redis in `rocgate
//! serve`, [`RouteSettings::distributed`]) the base limit, bucket and controller are
//! the fleet's, while the intervals hold this instance's share of the requests and
//! none of the shared controller's slots: `raise_base_limit` holds the fleet's demand
//! ([`Interval::fleet_demand`], as Redis's answers gave it) against the fleet's base
//! limit, and advises as on a route of one instance when more than a tenth of it is
//! beyond that limit while the upstream is healthy, within the same bounds (a
//! capacity only a modelled one); where no interval holds the fleet's demand it does
//! not judge the route (its hint quotes this instance's demand and rejections as its
//! share, and the fleet's base limit). Nor do `raise_burst`, `raise_danger_roc`, `lower_danger_roc`,
//! `raise_min_rps` and `faster_restore`; `lower_base_limit` takes no capacity from
//! the rate this instance admitted (only a modelled one) and says its figures are
//! this instance's share; the shadow verdict names `base_limit` and `danger_roc`
//! without a value. A rule that does not judge a route says so in an `info`
//! hint without a change, "not advised on a … route: …", once per rule in each part of
//! the period a route ran under a profile (its own, and each event's that ran).
//!
//! Routes with fewer than [`Policy::min_requests`] offered in the period (or none at
//! all) get "no change: too little traffic"; a route without an interval in it,
//! "no change: nothing measured yet".

mod history;
mod sketch;

pub use history::{
    reason_array, FleetDemand, History, Interval, ReasonArray, RouteSettings, UpstreamCounts,
    UpstreamMeter,
};
pub use sketch::Sketch;

use crate::config::{Event, Mode, EVENT_SETTINGS, LONGEST_RESTORE, MIN_LIMIT};
use crate::controller::{ControllerParams, ControllerState};
use crate::limiter::{gcra, Algorithm, Reason, MAX_PERMITS, MAX_SPACED_RATE, MAX_WINDOW_COUNT};
use crate::window::RocMode;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

/// The kinds of route a rule may not judge, as its "not advised on …" hint names them.
const CONCURRENCY: &str = "a concurrency route";
const PARTITIONED: &str = "a partitioned route";
const DISTRIBUTED: &str = "a distributed route";

/// Why the rules of cuts, ramps and restores do not judge a distributed route.
const SHARED_CONTROLLER: &str = "the shared controller steps on the fleet's window in Redis, and its ROC, cuts and restores are not in this instance's history";

/// When the upstream counts as saturated, and how much evidence a rule needs.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Policy {
    /// An interval whose upstream p99 latency exceeds this is saturated. At most
    /// [`Policy::LONGEST_LATENCY_BUDGET`].
    pub latency_budget: Duration,
    /// An interval in which more than this fraction of forwarded requests failed is
    /// saturated.
    pub error_budget: f64,
    /// Fewer requests than this in the period: no hint but "too little traffic".
    pub min_requests: u64,
}

impl Policy {
    /// The longest latency budget that can be exceeded: the upstream meter tells
    /// latencies apart up to 55 s, and holds every longer one in its last bucket.
    pub const LONGEST_LATENCY_BUDGET: Duration = Duration::from_secs(55);
}

impl Default for Policy {
    /// 500 ms p99, 1% errors, 200 requests.
    fn default() -> Self {
        Policy {
            latency_budget: Duration::from_millis(500),
            error_budget: 0.01,
            min_requests: 200,
        }
    }
}

/// How much a hint matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Severity {
    /// Worth knowing; nothing is at risk.
    Info,
    /// Clients are rejected without need, or protection is weaker than it looks.
    Warn,
    /// The upstream was saturated and rocgate let it happen.
    Critical,
}

impl Severity {
    /// `info`, `warn` or `critical`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Critical => "critical",
        }
    }
}

/// A parameter's value, as written in config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[non_exhaustive]
pub enum Setting {
    /// A number (a rate, a ROC).
    Number(f64),
    /// Anything else: a duration such as `"500ms"`, a mode.
    Text(String),
}

impl Setting {
    /// `d` as written in a config file. Not rounded: a value in force is shown as it
    /// is (a `current` rounded down to 100 ms made a lowered burst of 1550 ms → 1500 ms
    /// read `1s 500ms → 1s 500ms`); a suggestion is rounded where it is made.
    fn duration(d: Duration) -> Setting {
        Setting::Text(humantime::format_duration(d).to_string())
    }
}

/// The number `hint` suggests, if it suggests one.
fn suggested_number(hint: &Hint) -> Option<f64> {
    match hint.suggested {
        Some(Setting::Number(x)) => Some(x),
        _ => None,
    }
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::Number(x) => write!(f, "{}", fmt_num(*x)),
            Setting::Text(s) => f.write_str(s),
        }
    }
}

/// One suggestion for one route.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Hint {
    /// The route.
    pub route: String,
    /// Which rule produced it (see the module doc), or `no_change`.
    pub rule: String,
    /// How much it matters.
    pub severity: Severity,
    /// The config field to change (`None` for "no change").
    pub parameter: Option<String>,
    /// Its value in force.
    pub current: Option<Setting>,
    /// The suggested value.
    pub suggested: Option<Setting>,
    /// Why, with the figures.
    pub reason: String,
    /// The scheduled event whose profile the hint judges (and `current` comes from):
    /// the change belongs in its `[[routes.events]]` entry (`PUT /admin/routes`
    /// changes the route's own profile, outside events). A hint without a change
    /// judged in an event's part names the event too; one that changes a setting of
    /// the route's alone (`burst`, `mode`) names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
}

/// One route's hints over a period, with the evidence's size: what
/// `GET /admin/hints` returns per route.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RouteHints {
    /// The route.
    pub route: String,
    /// The scheduled event whose profile these hints judge, over the intervals that
    /// began while it ran; `None`: the route's own profile, over the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// History intervals in the period.
    pub intervals: usize,
    /// Seconds they cover.
    pub covered_s: f64,
    /// Requests offered in them.
    pub offered: u64,
    /// Requests rejected in them.
    pub rejected: u64,
    /// Requests a shadow mode would have rejected in them, which it let through: what
    /// enforcing would have rejected on a `shadow` route, what the ROC cut would have
    /// on a `shadow_adaptive` one (whose base limit's rejections are in `rejected`); 0
    /// on an enforcing route.
    #[serde(default)]
    pub shadow_rejected: u64,
    /// On a partitioned route, about how many distinct keys (clients) its limits
    /// refused in them (a sketch's estimate, within about 13%; within about a key
    /// at 10), or would have in a shadow mode (in `shadow_adaptive`, its base
    /// limit's refusals and the cut's would-be ones); absent on a route limited as a
    /// whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_keys: Option<u64>,
    /// A distributed route ([`RouteSettings::distributed`]): its limits are the
    /// fleet's, while these figures are this instance's share of its requests (its
    /// hints say what they judge). `false` from a `serve` that did not say.
    #[serde(default)]
    pub distributed: bool,
    /// The hints.
    pub hints: Vec<Hint>,
}

impl RouteHints {
    /// The hints for `settings` over `intervals` (see [`advise`]).
    pub fn new(
        settings: &RouteSettings,
        intervals: &[Interval],
        capacity_rps: Option<f64>,
        policy: &Policy,
    ) -> Self {
        RouteHints {
            route: settings.name.clone(),
            event: settings.event.clone(),
            intervals: intervals.len(),
            covered_s: Interval::total_secs(intervals),
            offered: intervals.iter().map(|i| i.offered).sum(),
            rejected: intervals.iter().map(Interval::rejected_total).sum(),
            shadow_rejected: intervals.iter().map(Interval::shadow_rejected_total).sum(),
            refused_keys: if settings.partitioned {
                Some(Interval::refused_keys(intervals).unwrap_or(0))
            } else {
                None
            },
            distributed: settings.distributed,
            hints: advise(settings, intervals, capacity_rps, policy),
        }
    }
}

/// Every route's hints over a period: the body of `GET /admin/hints`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "ReportFields")]
#[non_exhaustive]
pub struct HintsReport {
    /// The period looked at, seconds: the one asked for, at least two intervals and
    /// at most `[hints] keep`.
    pub period_s: f64,
    /// The seconds of history the report covers: the longest history of a route in
    /// the period, its parts (its own profile's and each event's) together; the
    /// interval still open is not in it. Less than `period_s` where `serve` started,
    /// or every route's settings changed, within the period; 0 without routes.
    pub covered_s: f64,
    /// The history's interval, seconds.
    pub interval_s: f64,
    /// One entry per route with history in the period, and per profile when a
    /// scheduled event ran in it: a route's own and each event's, judged apart.
    pub routes: Vec<RouteHints>,
}

impl HintsReport {
    /// The report of `routes` over `period_s` of history in intervals of
    /// `interval_s`, covering the longest history of a route in it.
    pub fn new(period_s: f64, interval_s: f64, routes: Vec<RouteHints>) -> Self {
        HintsReport {
            period_s,
            covered_s: longest_history(&routes),
            interval_s,
            routes,
        }
    }
}

/// A [`HintsReport`] as read: one from a `serve` that gave no `covered_s` (from
/// before it did) covers what its routes say.
#[derive(Deserialize)]
struct ReportFields {
    period_s: f64,
    covered_s: Option<f64>,
    interval_s: f64,
    routes: Vec<RouteHints>,
}

impl From<ReportFields> for HintsReport {
    fn from(f: ReportFields) -> Self {
        HintsReport {
            covered_s: f.covered_s.unwrap_or_else(|| longest_history(&f.routes)),
            period_s: f.period_s,
            interval_s: f.interval_s,
            routes: f.routes,
        }
    }
}

/// The longest history of a route in `routes`, its parts together, seconds.
fn longest_history(routes: &[RouteHints]) -> f64 {
    let mut covered = Vec::<(&str, f64)>::new();
    for r in routes {
        match covered.iter_mut().find(|(route, _)| *route == r.route) {
            Some((_, secs)) => *secs += r.covered_s,
            None => covered.push((&r.route, r.covered_s)),
        }
    }
    covered.iter().map(|&(_, secs)| secs).fold(0.0, f64::max)
}

/// What [`advise`] says of a route without an interval: not "too little traffic",
/// which a busy route whose settings had just changed read as having none.
const NOTHING_MEASURED: &str = "no change: nothing measured yet: no interval of the route's history in the period has ended (the first ends one [hints] interval after serve starts, or after a change of the route's settings, which starts its history again)";

/// The hints for one route over the given intervals. `capacity_rps` is the
/// upstream's capacity when known (a simulation's model); otherwise only measured
/// health counts.
pub fn advise(
    settings: &RouteSettings,
    intervals: &[Interval],
    capacity_rps: Option<f64>,
    policy: &Policy,
) -> Vec<Hint> {
    let e = Evidence::new(settings, intervals, capacity_rps, policy);
    if intervals.is_empty() {
        return vec![e.hint(
            "no_change",
            Severity::Info,
            None,
            None,
            NOTHING_MEASURED.to_owned(),
        )];
    }
    if e.offered < policy.min_requests.max(1) {
        return vec![e.hint(
            "no_change",
            Severity::Info,
            None,
            None,
            format!(
                "no change: too little traffic to judge ({} request{} in {})",
                e.offered,
                if e.offered == 1 { "" } else { "s" },
                fmt_secs(e.secs)
            ),
        )];
    }
    let lower_base = e.lower_base_limit();
    let lowered = lower_base.as_ref().and_then(suggested_number);
    let lower_cut = lowered.and_then(|b| e.lower_cut_limit(b));
    let lower_min = lowered.and_then(|b| e.lower_min_rps(b));
    let lower_burst = lowered.and_then(|b| e.lower_burst(b));
    let quiet_cuts = e.raise_min_rps(lowered);
    let raise_base = e.raise_base_limit();
    let raise_total = e.raise_route_limit();
    let raise_burst = e.raise_burst(raise_base.as_ref().and_then(suggested_number));
    let lower_danger = e.lower_danger_roc();
    let raise_danger = if quiet_cuts.is_some() {
        None
    } else {
        e.raise_danger_roc().map(|mut h| {
            // Ramps that saturated the upstream without a cut ask for the opposite:
            // protection first, so raising is only worth knowing.
            if lower_danger.is_some() && h.severity > Severity::Info {
                h.severity = Severity::Info;
                h.reason.push_str(
                    ", but the upstream saturated in ramps that never reached a cut (see lower_danger_roc), so this would miss them",
                );
            }
            h
        })
    };
    let mut hints: Vec<Hint> = [
        raise_base,
        raise_total,
        lower_base,
        lower_cut,
        lower_min,
        lower_burst,
        raise_burst,
        raise_danger,
        lower_danger,
        quiet_cuts,
        e.faster_restore(),
    ]
    .into_iter()
    .flatten()
    .collect();
    // A verdict "not safe to enforce yet" names the settings to tune, pointing at
    // these hints where one of them changes a setting it names.
    let verdict = e.shadow_verdict(&hints);
    hints.extend(verdict);
    if hints.is_empty() {
        // A distributed route's cuts are the shared controller's, not counted here.
        let figures = if settings.distributed {
            format!(
                "this instance's share of a distributed route, {} requests, {} rejected",
                e.offered,
                pct(e.rejected, e.offered)
            )
        } else {
            format!(
                "{} requests, {} rejected, {} cut(s)",
                e.offered,
                pct(e.rejected, e.offered),
                e.cut_count()
            )
        };
        hints.push(e.hint(
            "no_change",
            Severity::Info,
            None,
            None,
            format!("no change: {figures}, upstream {}", e.health_summary()),
        ));
    }
    hints.extend(e.not_advised());
    hints
}

/// One suggestion per route-only setting across the parts of one route's period.
///
/// A period in which a scheduled event ran is judged in parts (the route's own profile,
/// each event's), and a setting no `[[routes.events]]` entry takes (`burst`, `mode`)
/// is the route's in every part: two parts could each suggest a value for it. `parts`
/// are one route's, each with the event it judged (`None`: the route's own profile).
/// Where more than one suggests a value for such a setting, the
/// first keeps one, the smallest value suggested (equal values: the first part's),
/// with the highest severity and every part's reasoning; the others become `info`
/// notes without a change that say where it is.
/// The smallest because the setting is in force under every profile and each part
/// bounds it only by its own figures: a burst raised within one part's capacity bound
/// and raised further within another's stays within both only at the smaller, and a
/// burst one part lowers to spare the upstream must not be raised by another.
/// For the same reason a part whose judgement of the same rule suggests no change
/// withdraws the others' suggestion (`shadow_verdict`: safe to enforce under the
/// route's own profile, not safe during a sale, is not safe): the suggestion becomes
/// an `info` note that quotes that part's reasoning.
pub fn one_per_route_setting<'a>(
    parts: impl IntoIterator<Item = (Option<&'a str>, &'a mut Vec<Hint>)>,
) {
    let mut parts: Vec<(Option<&str>, &mut Vec<Hint>)> = parts.into_iter().collect();
    // Every suggestion of a route-only setting: the setting, the part, the place there.
    let mut found: Vec<(String, usize, usize)> = Vec::new();
    // Suggestions another part's judgement of the same rule withdraws: the part and
    // place, and the note that replaces it.
    let mut withdrawn: Vec<(usize, usize, String)> = Vec::new();
    for (p, (_, hints)) in parts.iter().enumerate() {
        for (k, h) in hints.iter().enumerate() {
            let Some(parameter) = h.parameter.as_ref().filter(|_| h.suggested.is_some()) else {
                continue;
            };
            if EVENT_SETTINGS.contains(&parameter.as_str()) {
                continue;
            }
            let veto = parts.iter().enumerate().find_map(|(q, (event, others))| {
                let other = others
                    .iter()
                    .find(|o| q != p && o.rule == h.rule && o.parameter.is_none())?;
                Some((profile_name(*event), other))
            });
            match veto {
                Some((there, other)) => withdrawn.push((
                    p,
                    k,
                    format!(
                        "{} ({parameter} is the route's, in force under every profile: no change suggested, since under {there}: {})",
                        h.reason, other.reason
                    ),
                )),
                None => found.push((parameter.clone(), p, k)),
            }
        }
    }
    for (p, k, note) in withdrawn {
        // A hint that changes nothing names its event's part, as one made so does.
        let event = parts[p].0.map(str::to_owned);
        let h = &mut parts[p].1[k];
        h.severity = Severity::Info;
        h.parameter = None;
        h.current = None;
        h.suggested = None;
        h.reason = note;
        h.event = event;
    }
    // Setting by setting (each merge changes only that setting's hints), each one's
    // suggestions in order: the sort is stable.
    found.sort_by(|a, b| a.0.cmp(&b.0));
    for same in found
        .chunk_by(|a, b| a.0 == b.0)
        .filter(|same| same.len() > 1)
    {
        let at: Vec<(usize, usize)> = same.iter().map(|&(_, p, k)| (p, k)).collect();
        merge_suggestions(&mut parts, &same[0].0, &at);
    }
}

/// [`one_per_route_setting`] of `parameter`, suggested at `at` (part, place; two or
/// more, in order).
fn merge_suggestions(
    parts: &mut [(Option<&str>, &mut Vec<Hint>)],
    parameter: &str,
    at: &[(usize, usize)],
) {
    let profile = |p: usize| profile_name(parts[p].0);
    let hint = |(p, k): (usize, usize)| &parts[p].1[k];
    let value = |h: &Hint| {
        h.suggested
            .as_ref()
            .map_or_else(String::new, Setting::to_string)
    };
    let kept = at[1..].iter().fold(at[0], |a, &b| {
        if smaller(hint(b).suggested.as_ref(), hint(a).suggested.as_ref()) {
            b
        } else {
            a
        }
    });
    let reasons: Vec<String> = at
        .iter()
        .map(|&(p, k)| {
            let h = hint((p, k));
            format!("under {}, {}: {}", profile(p), value(h), h.reason)
        })
        .collect();
    let which = if at
        .iter()
        .all(|&h| hint(h).suggested == hint(kept).suggested)
    {
        "one suggestion"
    } else {
        "the smallest suggested"
    };
    let mut merged = hint(kept).clone();
    merged.severity = at
        .iter()
        .map(|&h| hint(h).severity)
        .fold(merged.severity, Ord::max);
    merged.reason = format!(
        "{} ({which}: {parameter} is the route's, in force under every profile, and each part bounds it only by its own figures)",
        reasons.join("; ")
    );
    let note = format!(
        "{parameter} is the route's: one suggestion for the whole period, {}, among the hints judged under {}, with this part's figures",
        value(&merged),
        profile(at[0].0)
    );
    for &(p, k) in &at[1..] {
        let h = &mut parts[p].1[k];
        h.severity = Severity::Info;
        h.parameter = None;
        h.current = None;
        h.suggested = None;
        h.reason.clone_from(&note);
    }
    parts[at[0].0].1[at[0].1] = merged;
}

/// `x` as a limit `algorithm` takes, rounded `up` or down ([`Evidence::fit_limit`]).
fn fit_limit(algorithm: &Algorithm, x: f64, up: bool) -> f64 {
    match *algorithm {
        Algorithm::Concurrency { .. } => {
            if up { x.ceil() } else { x.floor() }.clamp(1.0, f64::from(MAX_PERMITS))
        }
        Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } => {
            let secs = window.as_secs_f64();
            x.max(round_sig(1.0 / secs, 4, true)).min(round_sig(
                MAX_WINDOW_COUNT as f64 / secs,
                4,
                false,
            ))
        }
        Algorithm::TokenBucket { burst } => {
            let secs = f64::from(gcra::burst_ms(burst)) / 1e3;
            x.max(MIN_LIMIT)
                .min(round_sig(f64::from(gcra::MAX_TOKENS) / secs, 4, false))
                .min(MAX_SPACED_RATE)
        }
        Algorithm::LeakyBucket { .. } => x.clamp(MIN_LIMIT, MAX_SPACED_RATE),
    }
}

/// What [`follow_in_events`] takes of a running route, from one state of it
/// ([`Engine::route_tuning`](crate::engine::Engine::route_tuning)): a runtime change
/// of the route is in all three or in none, so no hint is judged from a mix.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteTuning {
    /// The route's algorithm.
    pub algorithm: Algorithm,
    /// The route's own controller parameters in force.
    pub own: ControllerParams,
    /// The route's scheduled events, each with the profile it runs over `own`.
    pub events: Vec<Event>,
}

/// The hints a scheduled event of the route needs where it takes a limit or a
/// threshold from the route's own profile and the route's own part of `hints` (those
/// naming no event) lowers it below a setting the event writes itself, which the
/// config would then refuse: an event that leaves `base_limit` to the route and sets
/// a `cut_limit` above the lowered base limit, or leaves `danger_roc` to the route and
/// sets a `safe_roc` at or above the lowered `danger_roc`. Each such event gets a hint
/// of the same rule and severity, in its own `[[routes.events]]` entry (`event`), that
/// lowers its setting with the route's, keeping its ratio to it (`cut_limit` 150 with
/// a base limit of 200 lowered to 90 goes to 67): to the one the event runs, which for
/// `danger_roc` is the one it was written over where the route's changed at runtime
/// (an event that writes `safe_roc` keeps it). An event whose own part of `hints`
/// already changes either setting is left to that part, and so is one that writes the
/// route's setting itself, even at the route's value: it keeps its own (an event built
/// in code, with no table, is taken to write the fields where its profile differs
/// from the route's). `hints` are every part's of
/// one route; `algorithm`, `own` and `events` are the route's, each event with the
/// profile it runs. Returns the hints to add.
pub fn follow_in_events(
    algorithm: &Algorithm,
    own: &ControllerParams,
    events: &[Event],
    hints: &[Hint],
) -> Vec<Hint> {
    let mut added = Vec::new();
    for h in hints.iter().filter(|h| h.event.is_none()) {
        let (Some(parameter), Some(Setting::Number(from)), Some(Setting::Number(to))) =
            (h.parameter.as_deref(), &h.current, &h.suggested)
        else {
            continue;
        };
        let (from, to) = (*from, *to);
        if to >= from {
            continue;
        }
        for e in events {
            let p = &e.controller;
            // Whether the event takes the route's setting and writes its own beside it
            // (one it takes too follows the route's hint): as its table wrote them, a
            // setting written at the route's value being its own; for an event built
            // in code, which has no table, where its profile differs from the route's.
            // `runs`: the event's own value of the setting it takes, as it runs (the
            // route's, but for a danger_roc kept through a runtime change).
            let (upper, lower, value, runs, takes_it) = match parameter {
                "base_limit" => (
                    "base_limit",
                    "cut_limit",
                    p.cut_limit_rps,
                    p.base_limit_rps,
                    e.sets.map_or(
                        p.base_limit_rps == own.base_limit_rps
                            && p.cut_limit_rps != own.cut_limit_rps,
                        |s| !s.base_limit && s.cut_limit,
                    ),
                ),
                "danger_roc" => (
                    "danger_roc",
                    "safe_roc",
                    p.safe_roc,
                    p.danger_roc,
                    e.sets.map_or(
                        p.roc_mode == own.roc_mode
                            && p.danger_roc == own.danger_roc
                            && p.safe_roc != own.safe_roc,
                        |s| !s.danger_roc && s.safe_roc,
                    ),
                ),
                _ => break,
            };
            let refused = if lower == "cut_limit" {
                value > to
            } else {
                value >= to
            };
            let judged = hints.iter().any(|o| {
                o.event.as_deref() == Some(e.name.as_str())
                    && matches!(o.parameter.as_deref(), Some(q) if q == upper || q == lower)
            });
            if !takes_it || !refused || judged {
                continue;
            }
            // Its ratio (or gap) to the setting the event runs, which its own value is
            // below: so the suggestion is below `to`. The route's `from` is not that
            // setting where the route's danger_roc was changed at runtime.
            let suggested = if lower == "cut_limit" {
                fit_limit(algorithm, round_down(value * to / runs, value), false).min(to)
            } else if to > 0.0 {
                round_down(value * to / runs, value)
            } else if p.roc_mode == RocMode::Relative {
                // Halfway down to −1, the lowest a relative threshold reaches.
                (to - 1.0) / 2.0
            } else {
                to - (runs - value)
            };
            added.push(Hint {
                route: h.route.clone(),
                rule: h.rule.clone(),
                severity: h.severity,
                parameter: Some(lower.to_owned()),
                current: Some(Setting::Number(value)),
                suggested: Some(Setting::Number(suggested)),
                reason: format!(
                    "event {} takes its {upper} from the route's, lowered to {} ({}), and sets a {lower} of {} of its own, which must stay {} it: lower it with the route's {upper}, keeping its ratio to it",
                    e.name,
                    fmt_num(to),
                    h.rule,
                    fmt_num(value),
                    if lower == "cut_limit" { "at most" } else { "below" },
                ),
                event: Some(e.name.clone()),
            });
        }
    }
    added
}

/// The profile a part of a route's period was judged under, for a person.
fn profile_name(event: Option<&str>) -> String {
    event.map_or_else(
        || "the route's own profile".to_owned(),
        |e| format!("event {e}"),
    )
}

/// Whether suggestion `a` is a smaller value than `b`: both numbers, or both
/// durations as written (`"111ms"`); anything else is not smaller.
fn smaller(a: Option<&Setting>, b: Option<&Setting>) -> bool {
    match (a, b) {
        (Some(Setting::Number(a)), Some(Setting::Number(b))) => a < b,
        (Some(Setting::Text(a)), Some(Setting::Text(b))) => {
            match (humantime::parse_duration(a), humantime::parse_duration(b)) {
                (Ok(a), Ok(b)) => a < b,
                _ => false,
            }
        }
        _ => false,
    }
}

/// The hints as a table for a person: one line per hint (route, severity, the change)
/// and its reasoning indented below.
pub fn table(hints: &[Hint]) -> String {
    // In chars, as `{:<width$}` pads (a name's bytes widened the column past it).
    let width = hints
        .iter()
        .map(|h| h.route.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for h in hints {
        let mut change = match (&h.parameter, &h.current, &h.suggested) {
            (Some(p), Some(c), Some(s)) => format!("{p} {c} → {s}"),
            (Some(p), _, _) => p.clone(),
            (None, _, _) if h.rule == "no_change" => "no change".to_owned(),
            (None, _, _) => format!("{}: no change", h.rule),
        };
        if let Some(event) = &h.event {
            change.push_str(&format!(" in event {event}"));
        }
        out.push_str(&format!(
            "  {:<width$}  {:<8}  {change}\n  {:<width$}  {:<8}  {}\n",
            h.route,
            h.severity.as_str(),
            "",
            "",
            h.reason
        ));
    }
    out
}

/// A hint's change as the table shows it: `rule (parameter current → suggested)`,
/// with the event whose entry it belongs in (`… in event sale)`).
fn change_of(h: &Hint) -> String {
    let event = h
        .event
        .as_ref()
        .map_or_else(String::new, |e| format!(" in event {e}"));
    match (&h.parameter, &h.current, &h.suggested) {
        (Some(p), Some(c), Some(s)) => format!("{} ({p} {c} → {s}{event})", h.rule),
        _ => h.rule.clone(),
    }
}

/// Why a partitioned route's base-limit rejections need not ask for a higher limit,
/// where its intervals carry no count of the keys refused (intervals a library user
/// built).
const FEW_KEYS: &str = "each key has its own limit, and these may be a few keys over their own limit (one client's flood, a brute-forcer), which rocgate does not tell apart from many";

/// The distinct keys refused over a period from which a partitioned route's
/// `raise_base_limit` is a warning: clients enough that the limit is too low for
/// them, not one client's flood or a few (a brute-forcer, a scraper, from an
/// address or a handful). At 10 keys the sketch counts within about one (a standard
/// deviation of 0.9 key).
pub const MANY_KEYS: u64 = 10;

/// What a shadow partitioned route's base limit would refuse, enforced, from `n`
/// distinct keys refused or would-be refused over the period (0: none counted, where
/// a shared store decided them), as `raise_base_limit` quotes them: "which would
/// refuse about 1400 clients"; under [`MANY_KEYS`], that these are a few clients'
/// floods, the limit working.
fn would_refuse(n: u64) -> String {
    match n {
        0 => format!("if many clients would be refused: {FEW_KEYS}"),
        1 => "which would refuse about 1 client (one client's flood, held to its own limit: the limit working)".to_owned(),
        n if n < MANY_KEYS => format!("which would refuse about {n} clients (a few clients' floods, each held to its own limit: the limit working)"),
        n => format!("which would refuse about {n} clients"),
    }
}

/// An interval's upstream health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Unknown,
    Healthy,
    Saturated,
}

/// A run of consecutive intervals with time in `Cut`.
#[derive(Clone, Copy, Debug)]
struct CutEpisode {
    /// Start of its first interval, seconds since the period's start.
    at_s: f64,
    /// Transitions into `Cut` in it (at least one: a cut in force when the period
    /// began counts as one).
    cuts: u64,
    trigger_roc: f64,
    peak_demand_rps: f64,
    saturated: bool,
    /// The upstream's health was known in at least one of its intervals: a cut in
    /// which it was never measured is neither needed nor needless.
    measured: bool,
}

impl CutEpisode {
    /// Measured, and the upstream never saturated in it.
    fn healthy(&self) -> bool {
        self.measured && !self.saturated
    }
}

/// Everything the rules look at, computed once.
/// A distributed route's fleet demand over a period ([`Evidence::fleet_demand`]).
struct Fleet {
    demand: FleetDemand,
    /// The intervals that had a figure.
    intervals: usize,
}

struct Evidence<'a> {
    s: &'a RouteSettings,
    intervals: &'a [Interval],
    health: Vec<Health>,
    capacity_rps: Option<f64>,
    offered: u64,
    rejected: u64,
    /// What the base limit itself would have refused, `base_in_cut` of it estimated
    /// ([`base_refused`]).
    base_rejected: u64,
    /// Demand beyond the base limit's rate in an interval in which the cut refused it
    /// (labelled `roc_cut`, as every refusal while the cut holds the limit below base
    /// is, on a route that enforces its cut), up to what the cut refused there: the
    /// base limit would have refused it too. Zero on a `concurrency` or partitioned
    /// route, whose base limit is no rate the route's demand can be held against.
    base_in_cut: u64,
    secs: f64,
    /// Seconds with the route-level limiter exhausted.
    exhausted_s: f64,
    cuts: Vec<CutEpisode>,
    roc: Sketch,
    latency: Sketch,
}

impl<'a> Evidence<'a> {
    fn new(
        s: &'a RouteSettings,
        intervals: &'a [Interval],
        capacity_rps: Option<f64>,
        policy: &'a Policy,
    ) -> Self {
        let health: Vec<Health> = intervals.iter().map(|i| health(i, policy)).collect();
        let mut roc = Sketch::new();
        let mut latency = Sketch::new();
        for i in intervals {
            roc.merge(&i.roc);
            if let Some(u) = &i.upstream {
                latency.merge(&u.latency);
            }
        }
        let offered = intervals.iter().map(|i| i.offered).sum();
        let rejected = intervals.iter().map(Interval::rejected_total).sum();
        let (mut base_rejected, mut base_in_cut) = (0u64, 0u64);
        for i in intervals {
            let (own, beyond) = base_refused(s, i);
            base_rejected += own + beyond;
            base_in_cut += beyond;
        }
        let start = intervals.first().map_or(0.0, |i| i.start.as_secs_f64());
        let mut cuts: Vec<CutEpisode> = Vec::new();
        let mut in_episode = false;
        for (i, h) in intervals.iter().zip(&health) {
            let cut = i.time_in(ControllerState::Cut) > 0.0 || i.cuts > 0;
            if !cut {
                in_episode = false;
                continue;
            }
            let saturated = *h == Health::Saturated;
            let measured = *h != Health::Unknown;
            match cuts.last_mut() {
                Some(ep) if in_episode => {
                    ep.cuts += u64::from(i.cuts);
                    ep.trigger_roc = ep.trigger_roc.max(i.cut_roc);
                    ep.peak_demand_rps = ep.peak_demand_rps.max(i.peak_demand_rps);
                    ep.saturated |= saturated;
                    ep.measured |= measured;
                }
                _ => cuts.push(CutEpisode {
                    at_s: i.start.as_secs_f64() - start,
                    cuts: u64::from(i.cuts).max(1),
                    trigger_roc: i.cut_roc,
                    peak_demand_rps: i.peak_demand_rps,
                    saturated,
                    measured,
                }),
            }
            in_episode = true;
        }
        Evidence {
            s,
            intervals,
            health,
            capacity_rps,
            offered,
            rejected,
            base_rejected,
            base_in_cut,
            secs: Interval::total_secs(intervals),
            exhausted_s: intervals.iter().map(|i| i.exhausted_s).sum(),
            cuts,
            roc,
            latency,
        }
    }

    /// A hint of `rule` on this route. Judged in an event's part, it names the event
    /// where `parameter` is one an event's profile sets ([`EVENT_SETTINGS`]), or where
    /// it changes nothing (so that a list of several parts' hints, `simulate`'s, tells
    /// them apart); any other parameter (`burst`, `mode`) is the route's own, in force
    /// during the event too.
    fn hint(
        &self,
        rule: &'static str,
        severity: Severity,
        parameter: Option<&'static str>,
        change: Option<(Setting, Setting)>,
        reason: String,
    ) -> Hint {
        let (current, suggested) = change.map_or((None, None), |(c, s)| (Some(c), Some(s)));
        Hint {
            route: self.s.name.clone(),
            rule: rule.to_owned(),
            severity,
            parameter: parameter.map(str::to_owned),
            current,
            suggested,
            reason,
            event: self
                .s
                .event
                .clone()
                .filter(|_| parameter.is_none_or(|p| EVENT_SETTINGS.contains(&p))),
        }
    }

    /// One `info` hint, without a change, per rule that does not judge a route of this
    /// kind because what it would compare is not in the units of the setting it
    /// changes (see the module doc): so that a missing suggestion is not read as "all
    /// is well".
    fn not_advised(&self) -> Vec<Hint> {
        const TIERED: &str = "a route with tiers";
        if self.s.distributed {
            return self.not_advised_distributed();
        }
        let concurrency = self.concurrency();
        let partitioned = self.s.partitioned;
        let bucket = matches!(self.s.algorithm, Algorithm::TokenBucket { .. });
        let danger = self.danger_unjudged();
        [
            (
                "raise_burst",
                partitioned && bucket,
                (PARTITIONED, "the burst is each key's, and whether one key's demand came in bursts or fit its limit is not observed (demand is the whole route's)"),
            ),
            (
                "raise_danger_roc",
                danger.is_some(),
                danger.unwrap_or_default(),
            ),
            (
                "raise_base_limit",
                self.s.tiered,
                (TIERED, "a tier's rejections count as the base limit's (reason limit), so what the base limit alone rejected is not observed"),
            ),
            (
                "raise_min_rps",
                concurrency,
                (CONCURRENCY, "min_rps is a rate and the base limit a count of requests in flight: how many a rate keeps in flight depends on a latency the route need not measure"),
            ),
            (
                "faster_restore",
                concurrency || partitioned,
                if concurrency {
                    (CONCURRENCY, "what the base limit would have rejected during recovery is not observed (a request refused under the lowered limit never is in flight), so a faster restore might save none of the rejections there")
                } else {
                    (PARTITIONED, "what each key's base limit would have rejected during recovery, and what the keys' limits let through together against the upstream's capacity, are not observed")
                },
            ),
        ]
        .into_iter()
        .filter(|(_, applies, _)| *applies)
        .map(|(rule, _, (kind, why))| {
            self.hint(rule, Severity::Info, None, None, format!("not advised on {kind}: {why}"))
        })
        .collect()
    }

    /// [`Evidence::not_advised`] on a distributed route, whose base limit, bucket and
    /// controller are the fleet's while the intervals hold this instance's share of
    /// the requests and none of the shared controller's slots: the rules that hold
    /// demand against the base limit, or judge the controller's cuts, ramps and
    /// restores, do not judge it. `raise_base_limit`'s says what this instance saw,
    /// as its share; it has none where the intervals hold the fleet's demand
    /// ([`Evidence::fleet_demand`]), which `raise_base_limit` then judges.
    fn not_advised_distributed(&self) -> Vec<Hint> {
        let judged = self.fleet_demand().is_some();
        let (rejected, enforced) = match self.s.mode {
            Mode::Shadow => ("would have been rejected", ", enforced"),
            _ => ("rejected", ""),
        };
        let base = format!(
            "this instance's {} req/s ({} of {} requests {rejected} by the base limit{enforced}) are its share of a route shared by the fleet, and the fleet's base limit of {} req/s is held against the fleet's demand, which this instance does not observe: raise it only on the fleet's figures (rocgate_requests_total of every instance)",
            fmt_measured(self.mean_rps()),
            pct(self.base_rejected, self.offered),
            self.offered,
            fmt_num(self.base())
        );
        [
            ("raise_base_limit", (!judged).then_some(base)),
            ("raise_burst", Some("the bucket is the fleet's, and whether the fleet's demand came in bursts or fit under its base limit is not observed (this instance's requests are its share)".to_owned())),
            ("raise_danger_roc", Some(SHARED_CONTROLLER.to_owned())),
            ("lower_danger_roc", Some(SHARED_CONTROLLER.to_owned())),
            ("raise_min_rps", Some(SHARED_CONTROLLER.to_owned())),
            ("faster_restore", Some(SHARED_CONTROLLER.to_owned())),
        ]
        .into_iter()
        .filter_map(|(rule, why)| Some((rule, why?)))
        .map(|(rule, why)| {
            self.hint(rule, Severity::Info, None, None, format!("not advised on {DISTRIBUTED}: {why}"))
        })
        .collect()
    }

    /// Why `raise_danger_roc` does not judge this route, as (the route's kind, the
    /// reason), if it does not: on a `concurrency` or partitioned route a false cut's
    /// demand, a rate of the whole route, is held against a base limit it cannot be;
    /// on a distributed route the shared controller's cuts are not observed.
    /// The shadow verdict names `danger_roc` without a value there, for the same
    /// reason.
    fn danger_unjudged(&self) -> Option<(&'static str, &'static str)> {
        if self.s.distributed {
            Some((DISTRIBUTED, SHARED_CONTROLLER))
        } else if self.concurrency() {
            Some((CONCURRENCY, "a false cut is one whose demand fit under the base limit, here a count of requests in flight, while demand is a rate, and what rejected requests would have kept in flight is not observed"))
        } else if self.s.partitioned {
            Some((PARTITIONED, "a false cut is one whose demand fit under the base limit, here each key's, while demand is the whole route's, and one key's demand is not observed"))
        } else {
            None
        }
    }

    /// Cuts in the period: transitions into `Cut`, a cut in force at its start
    /// counting as one.
    fn cut_count(&self) -> u64 {
        self.cuts.iter().map(|c| c.cuts).sum()
    }

    fn base(&self) -> f64 {
        self.s.params.base_limit_rps
    }

    /// A distributed route's fleet demand over the intervals that have a figure
    /// ([`Interval::fleet_demand`]): their means weighted by the seconds each
    /// measured ([`FleetDemand::fold`]), and the highest peak. `None` on a route not distributed, and where no interval has one (Redis
    /// away, or it held no rate): then the fleet's demand is not observed.
    fn fleet_demand(&self) -> Option<Fleet> {
        if !self.s.distributed {
            return None;
        }
        let (mut demand, mut intervals) = (None::<FleetDemand>, 0);
        for d in self.intervals.iter().filter_map(|i| i.fleet_demand) {
            demand = Some(demand.map_or(d, |all| all.fold(d)));
            intervals += 1;
        }
        demand.map(|demand| Fleet { demand, intervals })
    }

    /// A suggested limit as the route's algorithm takes it (the config file's rules):
    /// whole requests in flight, at most [`MAX_PERMITS`], for `concurrency`, at least
    /// one request per window and at most what a window counter holds
    /// ([`MAX_WINDOW_COUNT`]) for the window counters, at most what a token bucket
    /// keeps (`limit × burst` at most [`MAX_TOKENS`](gcra::MAX_TOKENS)) for
    /// `token_bucket`, at most [`MAX_SPACED_RATE`] for `token_bucket` and
    /// `leaky_bucket`, at least [`MIN_LIMIT`] for the rate algorithms; rounded `up`
    /// or down.
    fn fit_limit(&self, x: f64, up: bool) -> f64 {
        fit_limit(&self.s.algorithm, x, up)
    }

    fn count(&self, h: Health) -> usize {
        self.health.iter().filter(|&&x| x == h).count()
    }

    fn known(&self) -> usize {
        self.health.len() - self.count(Health::Unknown)
    }

    fn mean_rps(&self) -> f64 {
        self.offered as f64 / self.secs.max(1e-9)
    }

    /// ", the bucket empty N% of the time", when the limiter was measured exhausted.
    fn exhausted_summary(&self) -> String {
        if self.exhausted_s <= 0.0 {
            return String::new();
        }
        format!(
            ", the limiter exhausted {:.0}% of the time",
            100.0 * self.exhausted_s / self.secs.max(1e-9)
        )
    }

    fn health_summary(&self) -> String {
        if self.known() == 0 {
            return "health not measured".into();
        }
        let saturated = self.count(Health::Saturated);
        let p99 = self
            .latency
            .quantile(0.99)
            .map(|l| format!(", p99 {}", fmt_secs(l)))
            .unwrap_or_default();
        // "Throughout" only of a period measured throughout: an interval that forwarded
        // nothing (or had no upstream figures) says nothing of the upstream.
        let unknown = self.count(Health::Unknown);
        let (measured, not_measured) = if unknown == 0 {
            ("", String::new())
        } else {
            (" measured", format!(" ({unknown} not measured)"))
        };
        match saturated {
            0 if unknown == 0 => format!("healthy throughout{p99}"),
            0 => format!(
                "healthy in all {}{measured} intervals{not_measured}{p99}",
                self.known()
            ),
            _ => format!(
                "healthy in {} of {}{measured} intervals, saturated in {saturated}{not_measured}{p99}",
                self.known() - saturated,
                self.known()
            ),
        }
    }

    /// Measured, and saturated in at most 5% of the intervals (a bucket's first
    /// burst may overshoot for a moment).
    fn mostly_healthy(&self) -> bool {
        self.known() > 0 && self.count(Health::Saturated) as f64 <= 0.05 * self.known() as f64
    }

    /// The intervals in which the upstream saturated at a rate (or a count in flight)
    /// that it was offered, not one a cut pinned: left out are those in `Cut` for at
    /// least half their length in which requests were refused, on a route that
    /// enforces its cut (`shadow_adaptive` enforces the base limit, and its
    /// rejections there are the base limit's). There the cut limit,
    /// not the upstream, set what was admitted and kept in flight, and the saturation
    /// may be what came before the cut still draining (a queue's latency) or what
    /// another route sent: read as the capacity, a cut limit of 150 req/s lowered a
    /// base limit of 500 to 130 over an upstream measured healthy at 400, and each
    /// round's lower cut limit (it follows the base limit) would read lower again.
    /// Recovery stays in: there the limit climbs back towards the base limit, and an
    /// upstream that saturates as it passes the capacity shows where that is (a
    /// flash sale's event against 300 req/s is found so).
    ///
    /// Nor does an interval that saturated at no more than the median admitted rate
    /// of the healthy ones, unless most intervals saturated (the upstream degraded at
    /// its usual rate): the upstream took that rate well as a rule, and what
    /// saturated it there was something else (a few slow requests, a moment of
    /// another route's load). Read as the capacity, one slow request in ten on a
    /// quiet route took its base limit from 200 to its usual demand, 0.9 req/s.
    fn capacity_readings(&self) -> impl Iterator<Item = &Interval> {
        let mut healthy: Vec<f64> = self
            .intervals
            .iter()
            .zip(&self.health)
            .filter(|(_, h)| **h == Health::Healthy)
            .map(|(i, _)| i.admitted() as f64 / i.secs())
            .collect();
        let usual = median(&mut healthy).unwrap_or(0.0);
        // Saturated in most intervals, the upstream is degraded at its usual rate:
        // every reading counts.
        let saturated = self.count(Health::Saturated);
        let degraded = 2 * saturated > self.known();
        self.intervals
            .iter()
            .zip(&self.health)
            .filter(move |(i, h)| {
                let pinned = self.s.mode == Mode::Enforce
                    && i.time_in(ControllerState::Cut) >= 0.5 * i.secs()
                    && i.rejected_total() > 0;
                let above_usual = degraded || i.admitted() as f64 / i.secs() > usual;
                **h == Health::Saturated && !pinned && above_usual
            })
            .map(|(i, _)| i)
    }

    /// The upstream's capacity as a rate for the whole route, req/s: the model's, or
    /// the median admitted rate of the intervals in which it saturated at what the
    /// base limit let through ([`Evidence::capacity_readings`]).
    fn route_capacity(&self) -> Option<f64> {
        if self.capacity_rps.is_some() {
            return self.capacity_rps;
        }
        let mut rates: Vec<f64> = self
            .capacity_readings()
            .map(|i| i.admitted() as f64 / i.secs())
            .collect();
        median(&mut rates)
    }

    /// The upstream's capacity in the units of the base limit, where it has them: the
    /// route's rate ([`Evidence::route_capacity`]) on a rate route limited as a whole;
    /// on a `concurrency` route the median of the most requests in flight seen in the
    /// intervals in which it saturated at what the base limit let through (a modelled
    /// capacity, a rate, does not count); `None` on a partitioned route, whose base
    /// limit is each key's while the upstream takes all keys together. On a
    /// distributed route only a modelled capacity: the rate this instance admitted is
    /// its share of what the fleet sent the upstream.
    fn capacity(&self) -> Option<f64> {
        if self.s.partitioned {
            return None;
        }
        if self.s.distributed {
            return self.capacity_rps;
        }
        if !self.concurrency() {
            return self.route_capacity();
        }
        let mut counts: Vec<f64> = self
            .capacity_readings()
            .filter_map(|i| i.peak_in_flight)
            .collect();
        median(&mut counts)
    }

    fn concurrency(&self) -> bool {
        matches!(self.s.algorithm, Algorithm::Concurrency { .. })
    }

    /// What the base limit counts: `req/s`, `in flight`, each `per key` on a
    /// partitioned route.
    fn units(&self) -> &'static str {
        match (self.concurrency(), self.s.partitioned) {
            (false, false) => "req/s",
            (false, true) => "req/s per key",
            (true, false) => "in flight",
            (true, true) => "in flight per key",
        }
    }

    /// Whether, in an interval in which the upstream saturated, the route-level
    /// limiter ran dry (exhausted at a slot's end, or rejecting by the base limit):
    /// demand spent a bucket's burst there, not only passed under the base limit.
    fn drained_while_saturated(&self) -> bool {
        self.intervals.iter().zip(&self.health).any(|(i, h)| {
            *h == Health::Saturated
                && (i.exhausted_s > 0.0 || i.rejected[Reason::Limit.index()] > 0)
        })
    }

    /// The highest base limit an upstream taking `cap` req/s copes with: a token
    /// bucket full after a quiet spell passes base × (1 s + burst) in the first second
    /// of a spike, so that, not the base alone, must fit (raise_burst keeps the same
    /// bound); with other algorithms the capacity itself.
    fn base_within(&self, cap: f64) -> f64 {
        match self.s.algorithm {
            Algorithm::TokenBucket { burst } => cap / (1.0 + burst.as_secs_f64()),
            _ => cap,
        }
    }

    /// The highest base limit the upstream copes with, and how that was found, in
    /// the base limit's units: on a route limited as a whole [`Evidence::base_within`]
    /// its capacity; on a partitioned route, whose base limit is each key's, the base
    /// limit scaled by the route's capacity over its highest admitted rate in an
    /// interval (each key's limit scaled by a factor scales what it admits, and so
    /// what the route admits, by at most that factor). `None` without a capacity.
    fn highest_base(&self) -> Option<(f64, String)> {
        let base = self.base();
        if self.s.partitioned {
            let cap = self.route_capacity()?;
            let peak = self
                .intervals
                .iter()
                .map(|i| i.admitted() as f64 / i.secs())
                .fold(0.0, f64::max);
            if peak <= 0.0 {
                return None;
            }
            let most = base * cap / peak;
            return Some((
                most,
                format!(
                    ", at most {} {} so that the route's highest admitted rate, {} req/s, scaled with each key's limit stays within the upstream's capacity of {} req/s",
                    fmt_measured(most),
                    self.units(),
                    fmt_measured(peak),
                    fmt_measured(cap)
                ),
            ));
        }
        let cap = self.capacity()?;
        let most = self.base_within(cap);
        let bound = match self.s.algorithm {
            Algorithm::TokenBucket { burst } => format!(
                ", at most {} so that a full bucket and a second of refill (base × (1 s + burst {})) stay within the upstream's capacity of {} req/s",
                fmt_measured(most),
                fmt_secs(burst.as_secs_f64()),
                fmt_measured(cap)
            ),
            Algorithm::Concurrency { .. } => format!(
                ", at most the {} requests in flight at which the upstream saturated",
                fmt_measured(cap)
            ),
            _ => format!(
                ", at most {} bounded by the upstream's capacity of {} req/s",
                fmt_measured(most),
                fmt_measured(cap)
            ),
        };
        Some((most, bound))
    }

    /// Not on a route with tiers: a tier's rejections count as the base limit's (reason
    /// `limit`), and a key held to its tier's lower limit asked for the base limit of
    /// the other keys, none of them rejected, to be raised, again at every report.
    /// On a partitioned route, the distinct keys refused over the period: `Some(0)`
    /// where no interval counted one; `None` on a route limited as a whole.
    fn refused_keys(&self) -> Option<u64> {
        self.s
            .partitioned
            .then(|| Interval::refused_keys(self.intervals).unwrap_or(0))
    }

    fn raise_base_limit(&self) -> Option<Hint> {
        if self.s.tiered {
            return None;
        }
        let base = self.base();
        // A distributed route: the fleet's demand, not this instance's share of it,
        // against the fleet's base limit; more than a tenth of it beyond the limit, as
        // a local route's 10% of requests rejected by it.
        let fleet = if self.s.distributed {
            let fleet = self.fleet_demand()?;
            if fleet.demand.mean_rps * 0.9 <= base {
                return None;
            }
            Some(fleet)
        } else {
            if self.base_rejected as f64 <= 0.10 * self.offered as f64 {
                return None;
            }
            None
        };
        if !self.mostly_healthy() {
            return None;
        }
        let mut target = base * 1.3;
        let mut bound = String::new();
        // Whether `target` is the upstream's capacity, a bound not to round past.
        let mut at_capacity = false;
        if let Some((most, why)) = self.highest_base() {
            if most <= base * 1.01 {
                return None;
            }
            if most < target {
                target = most;
                bound = why;
                at_capacity = true;
            }
        }
        // A restore from the cut limit to the raised base limit must end within 7
        // days, as the config requires (a raise it then refused was suggested).
        let p = &self.s.params;
        let steps = (LONGEST_RESTORE.as_secs_f64() / p.restore_interval.as_secs_f64()).floor();
        let restores = p.cut_limit_rps + p.restore_step_rps * steps;
        if restores < target {
            if restores <= base * 1.01 {
                return None;
            }
            target = restores;
            at_capacity = false;
            bound = format!(
                ", at most {} so that a restore from the cut limit of {} in steps of {} every {} ends within 7 days",
                fmt_num(round_sig(restores, 4, false)),
                fmt_num(p.cut_limit_rps),
                fmt_num(p.restore_step_rps),
                fmt_secs(p.restore_interval.as_secs_f64())
            );
        }
        let health = format!("the upstream was {}", self.health_summary());
        // At the upstream's capacity, rounded down: not above it.
        let wanted = if at_capacity {
            round_within(target, base)
        } else {
            round_up(target, base)
        };
        let wanted = if wanted > restores {
            round_sig(restores, 4, false)
        } else {
            wanted
        };
        let suggested = self.fit_limit(wanted, true);
        if suggested <= base {
            return None;
        }
        if suggested < wanted {
            let what = match self.s.algorithm {
                Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. }
                    if suggested == MAX_SPACED_RATE =>
                {
                    "the most a bucket enforces within 0.1% (it spaces requests a whole number of nanoseconds apart)"
                }
                Algorithm::TokenBucket { .. } => {
                    "what the limiter's bucket (limit × burst in 4294967295 tokens) holds"
                }
                Algorithm::Concurrency { .. } => "what the limiter's count of them holds",
                _ => "what the limiter's window counter holds",
            };
            bound.push_str(&format!(
                ", at most {} {}, {what}",
                fmt_num(suggested),
                self.units()
            ));
        }
        // A `shadow` route rejects nothing yet: the raise readies it for enforcing.
        let (severity, rejected, cut_rejected) = if self.s.mode == Mode::Shadow {
            (
                Severity::Info,
                format!(
                    "enforcing would have rejected {} of {} requests by",
                    pct(self.base_rejected, self.offered),
                    self.offered
                ),
                "would have rejected",
            )
        } else {
            (
                Severity::Warn,
                format!(
                    "{} of {} requests were rejected by",
                    pct(self.base_rejected, self.offered),
                    self.offered
                ),
                "rejected",
            )
        };
        // Each key's limit refuses only the keys over it: one brute-forcer held to it
        // refuses as many as a crowd, and that is the limit working. The keys refused
        // tell the two apart, where the engine counted them.
        let (severity, from_keys, few_keys) = match self.refused_keys() {
            None => (severity, String::new(), String::new()),
            Some(0) => (
                Severity::Info,
                String::new(),
                format!(" only if many clients are refused: {FEW_KEYS}"),
            ),
            Some(n) if n >= MANY_KEYS => {
                (severity, format!(", from about {n} clients"), String::new())
            }
            Some(n) => (
                Severity::Info,
                format!(
                    ", from about {n} {}",
                    if n == 1 { "client" } else { "clients" }
                ),
                if n == 1 {
                    " only if many clients are refused: about 1 was (one client's flood, held to its own limit: the limit working)".to_string()
                } else {
                    format!(" only if many clients are refused: about {n} were (a few clients' floods, each held to its own limit: the limit working)")
                },
            ),
        };
        if let Some(fleet) = fleet {
            let severity = if self.s.mode == Mode::Shadow {
                Severity::Info
            } else {
                Severity::Warn
            };
            return Some(self.hint(
                "raise_base_limit",
                severity,
                Some("base_limit"),
                Some((Setting::Number(base), Setting::Number(suggested))),
                format!(
                    "the fleet's demand {} req/s (peak {} req/s, as Redis's answers to this instance gave it in {} of {} intervals) against its base limit of {} req/s while {health}: raise it about 30%{bound}",
                    fmt_measured(fleet.demand.mean_rps),
                    fmt_measured(fleet.demand.peak_rps),
                    fleet.intervals,
                    self.intervals.len(),
                    fmt_num(base)
                ),
            ));
        }
        let in_cut = if self.base_in_cut > 0 {
            format!(
                ", counting {} beyond its rate that the ROC cut {cut_rejected} while in force",
                pct(self.base_in_cut, self.offered)
            )
        } else {
            String::new()
        };
        Some(self.hint(
            "raise_base_limit",
            severity,
            Some("base_limit"),
            Some((Setting::Number(base), Setting::Number(suggested))),
            format!(
                "{rejected} the base limit of {} {}{in_cut}{from_keys} (mean demand {} req/s{}) while {health}: raise it about 30%{bound}{few_keys}",
                fmt_num(base),
                self.units(),
                fmt_measured(self.mean_rps()),
                self.exhausted_summary()
            ),
        ))
    }

    /// A partitioned route's `route_limit` that refused over 10% of the requests out
    /// of a cut, each admitted by its key's own limit first, while the upstream was
    /// measured and healthy (as `raise_base_limit` asks): its keys together were held
    /// below what the upstream took, not each key. Suggests the total +30%, at most
    /// what the upstream's capacity (as [`Evidence::route_capacity`] finds it) takes
    /// with a full bucket and a second of refill (the total's bucket has the route's
    /// burst: a token bucket's `burst`, a window counter's window), and at most what
    /// that bucket holds and spaces.
    ///
    /// On a fleet sharing the total ([`RouteSettings::route_limit_instances`] `n`
    /// above 1) this instance holds `total ÷ n`, its intervals hold its share of the
    /// requests, and a capacity measured from them is the rate it admitted when the
    /// upstream saturated: each such reading counts for the fleet at the instances the
    /// total was shared by in its interval ([`Interval::route_limit_instances`]) times
    /// it (the fleet admits the total when the balancer spreads the route evenly), so
    /// that readings taken before the fleet grew do not count for the larger fleet.
    /// The bound so found is the fleet's, held against the whole total, as a modelled
    /// capacity (the whole upstream's) is.
    fn raise_route_limit(&self) -> Option<Hint> {
        let total = self.s.route_limit_rps?;
        let instances = self.s.route_limit_instances.max(1);
        let refused: u64 = self
            .intervals
            .iter()
            .map(|i| total_refused(self.s, i).0)
            .sum();
        if refused as f64 <= 0.10 * self.offered as f64 || !self.mostly_healthy() {
            return None;
        }
        let mut target = total * 1.3;
        let mut bound = String::new();
        let mut at_capacity = false;
        let burst = self.total_burst_secs();
        // A measured capacity is this instance's share of the upstream's, read for the
        // fleet at the instances sharing the total when it was measured; a modelled
        // one, the upstream's.
        let measured_on_a_fleet = self.capacity_rps.is_none()
            && self
                .capacity_readings()
                .any(|i| i.route_limit_instances > 1);
        let capacity = if measured_on_a_fleet {
            let mut rates: Vec<f64> = self
                .capacity_readings()
                .map(|i| i.admitted() as f64 / i.secs() * i.route_limit_instances.max(1) as f64)
                .collect();
            median(&mut rates)
        } else {
            self.route_capacity()
        };
        if let Some(cap) = capacity {
            let most = cap / (1.0 + burst);
            if most <= total * 1.01 {
                return None;
            }
            if most < target {
                target = most;
                at_capacity = true;
                bound = if measured_on_a_fleet {
                    format!(
                        ", at most {} so that the instances' full buckets and a second of refill stay within the upstream's capacity as this instance measured it, {} req/s (the rate it admitted when the upstream saturated, times the instances sharing the total then)",
                        fmt_measured(most),
                        fmt_measured(cap)
                    )
                } else {
                    format!(
                        ", at most {} so that its full bucket and a second of refill stay within the upstream's capacity of {} req/s",
                        fmt_measured(most),
                        fmt_measured(cap)
                    )
                };
            }
        }
        if instances > 1 {
            bound.push_str(&format!(
                "; the route_limit is the fleet's, shared by {instances} instances: this one holds {} req/s of it, and these figures are its share of the route's requests",
                fmt_measured(total / instances as f64)
            ));
        }
        let wanted = if at_capacity {
            round_within(target, total)
        } else {
            round_up(target, total)
        };
        // What the total's token bucket holds and spaces, as the configuration
        // checks it (not the keys' algorithm's bounds).
        let suggested = wanted
            .min(round_sig(
                f64::from(gcra::MAX_TOKENS) / burst.max(1e-3),
                4,
                false,
            ))
            .min(MAX_SPACED_RATE);
        if suggested <= total {
            return None;
        }
        let (severity, refused_by) = if self.s.mode == Mode::Shadow {
            (Severity::Info, "enforcing would have rejected")
        } else {
            (Severity::Warn, "")
        };
        let what = if refused_by.is_empty() {
            format!(
                "{} of {} requests were rejected by",
                pct(refused, self.offered),
                self.offered
            )
        } else {
            format!(
                "{refused_by} {} of {} requests by",
                pct(refused, self.offered),
                self.offered
            )
        };
        Some(self.hint(
            "raise_route_limit",
            severity,
            Some("route_limit"),
            Some((Setting::Number(total), Setting::Number(suggested))),
            format!(
                "{what} the route_limit of {} req/s over its keys together, out of a cut and after each key's own limit admitted them (mean demand {} req/s) while the upstream was {}: raise it about 30%{bound}",
                fmt_num(total),
                fmt_measured(self.mean_rps()),
                self.health_summary()
            ),
        ))
    }

    /// The burst of a partitioned route's `route_limit` bucket, seconds: the route's
    /// (a token bucket's `burst`, a window counter's window), as the engine builds it
    /// whatever the keys' algorithm, at least a millisecond (what the bucket counts).
    fn total_burst_secs(&self) -> f64 {
        let burst = match self.s.algorithm {
            Algorithm::TokenBucket { burst } => burst,
            Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } => window,
            // Refused by the configuration with a route_limit.
            Algorithm::LeakyBucket { .. } | Algorithm::Concurrency { .. } => Duration::from_secs(1),
        };
        f64::from(gcra::burst_ms(burst)) / 1e3
    }

    fn lower_base_limit(&self) -> Option<Hint> {
        let base = self.base();
        // The saturations that the load let through may be blamed on: not those a
        // cut bounded, nor those at the rate the upstream usually takes healthily
        // ([`Evidence::capacity_readings`]).
        let saturated = self.capacity_readings().count();
        // A measured upstream must saturate in 10% of the intervals, lest a brief
        // incident at ordinary load read as a low capacity; a known capacity (a
        // simulation's model) under the base limit is a fact, and two are enough.
        // The capacity is compared in the base limit's units: none on a partitioned
        // route (each key's limit, the whole route's capacity), requests in flight
        // on a `concurrency` route.
        let capacity = self.capacity();
        let known_above = !self.concurrency()
            && !self.s.partitioned
            && self.capacity_rps.is_some_and(|c| c < base);
        if saturated < 2 || (!known_above && (saturated as f64) < 0.10 * self.known() as f64) {
            return None;
        }
        // What the route would have rejected enforced: in `shadow` nothing is
        // rejected, and a load the base limit would have held back saturated the
        // upstream only because it was let through (`shadow_verdict` says to
        // enforce); in `shadow_adaptive` the cut's would-rejects count as they would
        // in `enforce`.
        let rejected = self.rejected
            + self
                .intervals
                .iter()
                .map(Interval::shadow_rejected_total)
                .sum::<u64>();
        let few_rejected = (rejected as f64) < 0.01 * self.offered as f64;
        let above_capacity = capacity.is_some_and(|c| c < base);
        if !few_rejected && !above_capacity {
            return None;
        }
        let mut target = base * 0.8;
        let mut why = String::new();
        if self.s.partitioned {
            why = "; each key's limit holds back only the keys at it, so the route's share of the upstream may fall by less".into();
        }
        if let Some(cap) = capacity {
            if cap * 0.9 < target {
                target = cap * 0.9;
                why = format!(
                    "; it saturates at about {} {}, so go to 90% of that",
                    fmt_measured(cap),
                    self.units()
                );
            }
        }
        if self.s.distributed {
            why.push_str("; the figures are this instance's share of a route shared by the fleet");
            if capacity.is_none() {
                why.push_str(", the rate it admitted no measure of the upstream's capacity, so the fleet's base limit goes down by a step: judge again after");
            }
        }
        let suggested = self.fit_limit(round_down(target, base), false);
        if suggested >= base {
            return None;
        }
        Some(self.hint(
            "lower_base_limit",
            Severity::Critical,
            Some("base_limit"),
            Some((Setting::Number(base), Setting::Number(suggested))),
            format!(
                "{} of {} requests {} rejected while the upstream was {}: the base limit of {} {} lets through more than it can take; lower it about 20%{why}",
                pct(rejected, self.offered),
                self.offered,
                if self.s.mode == Mode::Enforce {
                    "were"
                } else {
                    "were or would have been"
                },
                self.health_summary(),
                fmt_num(base),
                self.units()
            ),
        ))
    }

    /// A token bucket that demand drains passes base × (1 s + burst) in the first
    /// second of a spike after a quiet spell: the burst counts, against the burst. The
    /// base limit goes to 90% of the capacity, what sustained demand gets; where a
    /// saturated interval drained the bucket and the new base limit × (1 s + burst)
    /// would still exceed the capacity, the burst goes down with it to capacity ÷ base
    /// − 1 s (the bound `raise_burst` keeps), to the millisecond down. Lowering the
    /// base limit further instead would reject more of every second to spare the
    /// first one: `flash-sale` against 300 req/s with a sale event's base limit of 500
    /// gets 270 and a burst of 111 ms (no overload), where counting the burst in the
    /// base limit alone (220) still overloaded the first second and rejected 4% more.
    /// `new_base`: the base limit `lower_base_limit` suggests. The bucket is the
    /// route's (an event has none): the hint names no event ([`Evidence::hint`]).
    fn lower_burst(&self, new_base: f64) -> Option<Hint> {
        let Algorithm::TokenBucket { burst } = self.s.algorithm else {
            return None;
        };
        let cap = self.capacity()?;
        let passes = new_base * (1.0 + burst.as_secs_f64());
        if !self.drained_while_saturated() || passes <= cap {
            return None;
        }
        // To the millisecond, down: raise_burst's bound, rounded as it rounds, is no
        // more than this.
        let fits_ms = ((cap / new_base - 1.0) * 1e3).floor().max(1.0);
        let suggested = round_duration(Duration::from_millis(fits_ms as u64));
        if suggested >= burst {
            return None;
        }
        Some(self.hint(
            "lower_base_limit",
            Severity::Critical,
            Some("burst"),
            Some((Setting::duration(burst), Setting::duration(suggested))),
            format!(
                "the bucket ran dry while the upstream saturated: after a quiet spell a full one passes base × (1 s + burst {}) = {} requests in a spike's first second at the base limit of {} req/s, over the upstream's capacity of {} req/s; lower the burst with the base limit to capacity ÷ base − 1 s (the route's bucket: events have none)",
                fmt_secs(burst.as_secs_f64()),
                fmt_num(passes),
                fmt_num(new_base),
                fmt_measured(cap)
            ),
        ))
    }

    /// The cut limit must stay at most the base limit: when the base limit's
    /// suggestion (`new_base`) goes under it, the cut limit goes down too, keeping its
    /// ratio to the base limit.
    fn lower_cut_limit(&self, new_base: f64) -> Option<Hint> {
        let (base, cut) = (self.base(), self.s.params.cut_limit_rps);
        if cut <= new_base {
            return None;
        }
        let suggested = self
            .fit_limit(round_down(cut * new_base / base, cut), false)
            .min(new_base);
        Some(self.hint(
            "lower_base_limit",
            Severity::Critical,
            Some("cut_limit"),
            Some((Setting::Number(cut), Setting::Number(suggested))),
            format!(
                "the cut limit of {} {} must stay at most the base limit, lowered to {}: lower it with the base limit, keeping its ratio to it",
                fmt_num(cut),
                self.units(),
                fmt_num(new_base)
            ),
        ))
    }

    /// A cut needs demand of at least `min_rps`: above the base limit's suggestion
    /// (`new_base`), a surge that stays under it is never cut, and only the lowered
    /// base limit stands between it and an upstream that saturated. `min_rps` goes
    /// down with the base limit, keeping its ratio to it, at most half of it (as
    /// `raise_min_rps` bounds it). Not for `concurrency`, whose base limit counts
    /// requests in flight, not a rate that `min_rps` could be above, nor for a
    /// partitioned route, whose base limit is each key's while `min_rps` is the
    /// route's whole demand.
    fn lower_min_rps(&self, new_base: f64) -> Option<Hint> {
        if self.concurrency() || self.s.partitioned {
            return None;
        }
        let (base, min) = (self.base(), self.s.params.min_rps);
        if min <= new_base {
            return None;
        }
        let suggested = round_down((min * new_base / base).min(0.5 * new_base), min);
        Some(self.hint(
            "lower_base_limit",
            Severity::Critical,
            Some("min_rps"),
            Some((Setting::Number(min), Setting::Number(suggested))),
            format!(
                "min_rps of {} req/s would be above the base limit, lowered to {} req/s: a surge under it is never cut, so only the base limit would stand between it and the upstream; lower it with the base limit, keeping its ratio to it, at most half of it",
                fmt_num(min),
                fmt_num(new_base)
            ),
        ))
    }

    /// `new_base`: the base limit `raise_base_limit` suggests in the same report, if
    /// it does: the burst stays within what the bucket keeps at that limit too. The
    /// bucket is the route's, judged in an event's part too: the hint names no event
    /// ([`Evidence::hint`]).
    fn raise_burst(&self, new_base: Option<f64>) -> Option<Hint> {
        let Algorithm::TokenBucket { burst } = self.s.algorithm else {
            return None;
        };
        if self.s.partitioned
            || self.s.distributed
            || !self.mostly_healthy()
            || self.mean_rps() > self.base()
        {
            return None;
        }
        // A bucket absorbs a burst only if it had time to fill before it: runs of
        // intervals over 20% rejected by the bucket at the base limit, each right
        // after an interval with room (under 2% rejected for any reason). A run after
        // a cut, or a sustained excess, empties any bucket. A rejection by the local
        // fallback limiter (a distributed route while Redis is away) is the outage's,
        // not the bucket's: a larger burst would not have admitted it.
        let base = self.base();
        let (mut high, mut low, mut excess) = (0usize, 0usize, 0.0f64);
        let (mut run, mut run_excess, mut room_before) = (0usize, 0.0f64, false);
        for i in self.intervals.iter().filter(|i| i.offered >= 10) {
            let offered = i.offered as f64;
            let rejected = as_enforced(self.s.mode, i);
            let base_rej = rejected[Reason::Limit.index()];
            if base_rej as f64 > 0.20 * offered {
                if room_before {
                    run += 1;
                    run_excess += offered - base * i.secs();
                }
                continue;
            }
            if room_before && run > 0 {
                high += run;
                excess = excess.max(run_excess);
            }
            (run, run_excess) = (0, 0.0);
            room_before = (rejected.iter().sum::<u64>() as f64) < 0.02 * offered;
            low += usize::from(room_before);
        }
        if room_before && run > 0 {
            high += run;
            excess = excess.max(run_excess);
        }
        if high < 2 || low < 2 {
            return None;
        }
        let current = burst.as_secs_f64();
        let mut most = current * 10.0;
        let mut bound = String::new();
        // The base limit in force once the report is followed: the one raise_base_limit
        // suggests with it, if it does.
        let then = new_base.unwrap_or(base).max(base);
        // A full bucket and a second of refill pass in one second: base × (1 s + burst)
        // must fit what the upstream takes, at that base limit (at the current one, a
        // raised base and a raised burst each fit and together passed it: 260 × 5 s
        // against 1,000 req/s).
        if let Some(cap) = self.capacity() {
            let fits = cap / then - 1.0;
            if fits < most {
                most = fits;
                let at = if then > base {
                    format!(" at the base limit of {} suggested with it", fmt_num(then))
                } else {
                    String::new()
                };
                bound = format!(
                    ", at most {} so that a full bucket and a second of refill{at} stay within the upstream's {} req/s",
                    fmt_secs(fits.max(0.0)),
                    fmt_measured(cap)
                );
            }
        }
        // What the bucket keeps: a burst of 49.7 days at most, and limit × burst in
        // 32 bits of tokens, at the base limit suggested with it too.
        let keeps = (f64::from(gcra::MAX_TOKENS) / then).min(f64::from(u32::MAX) / 1e3);
        if keeps < most {
            most = keeps;
            bound = format!(
                ", at most {}, what the bucket keeps (4294967295 tokens, 49.7 days)",
                fmt_secs(keeps)
            );
        }
        let needed = (excess / base).max(2.0 * current).min(most);
        if needed <= current {
            return None;
        }
        let suggested =
            round_duration(Duration::try_from_secs_f64(needed).unwrap_or(Duration::MAX));
        if suggested <= burst {
            return None;
        }
        Some(self.hint(
            "raise_burst",
            Severity::Info,
            Some("burst"),
            Some((Setting::duration(burst), Setting::duration(suggested))),
            format!(
                "{} in bursts ({high} intervals over 20% rejected right after room in the limiter, {low} under 2%{}) while mean demand of {} req/s fits the base limit of {} req/s; the largest burst exceeded it by {} requests: a larger bucket absorbs it{bound}",
                if self.s.mode == Mode::Shadow {
                    "what enforcing would have rejected comes"
                } else {
                    "rejections come"
                },
                self.exhausted_summary(),
                fmt_beside(self.mean_rps(), base),
                fmt_num(base),
                fmt_measured(excess)
            ),
        ))
    }

    /// Not on a `concurrency` or partitioned route: a false cut is one whose demand,
    /// a rate of the whole route, fit under the base limit, there a count in flight
    /// (which rejected requests never enter) or each key's (whose demand is not
    /// observed).
    fn raise_danger_roc(&self) -> Option<Hint> {
        if self.danger_unjudged().is_some() {
            return None;
        }
        let base = self.base();
        let false_cuts: Vec<&CutEpisode> = self
            .cuts
            .iter()
            .filter(|c| c.healthy() && c.peak_demand_rps <= base)
            .collect();
        if false_cuts.is_empty() {
            return None;
        }
        let danger = self.s.params.danger_roc;
        let trigger = false_cuts
            .iter()
            .map(|c| c.trigger_roc)
            .fold(danger, f64::max);
        let high = self.roc.quantile(0.999).unwrap_or(danger);
        let target = trigger.max(high) * 1.1;
        let true_below: Vec<&CutEpisode> = self
            .cuts
            .iter()
            .filter(|c| (c.saturated || c.peak_demand_rps > base) && c.trigger_roc < target)
            .collect();
        let suggested = round_up(target, danger);
        let first = false_cuts[0];
        let mut reason = format!(
            "{} of {} cut(s) came while demand stayed under the base limit of {} req/s (peak {} req/s) and the upstream was not saturated, e.g. in the interval from +{} with ROC {}; p99.9 of ROC was {}: raise danger_roc just above both",
            false_cuts.iter().map(|c| c.cuts).sum::<u64>(),
            self.cut_count(),
            fmt_num(base),
            fmt_beside(first.peak_demand_rps, base),
            fmt_secs(first.at_s),
            fmt_beside(first.trigger_roc, danger),
            fmt_beside(high, danger)
        );
        let severity = if true_below.is_empty() {
            Severity::Warn
        } else {
            reason.push_str(&format!(
                ", but {} needed cut(s) started below that, so this would miss them",
                true_below.len()
            ));
            Severity::Info
        };
        Some(self.hint(
            "raise_danger_roc",
            severity,
            Some("danger_roc"),
            Some((Setting::Number(danger), Setting::Number(suggested))),
            reason,
        ))
    }

    /// A ramp is an interval with no cut or recovery whose ROC rose past `safe_roc`
    /// and in which the upstream saturated at more than it usually takes healthily
    /// ([`Evidence::capacity_readings`]); at least two are needed. One saturated
    /// interval at the usual rate is no ramp: ROC noise alone passes `safe_roc` (150
    /// req/s of Poisson arrivals peaks at ROC 18 to 29 under the classic window), and
    /// a deploy's errors in one interval asked, critical, for a danger_roc that cuts on
    /// that noise.
    fn lower_danger_roc(&self) -> Option<Hint> {
        if self.s.distributed {
            return None;
        }
        let p = &self.s.params;
        let ramps: Vec<(f64, &Interval)> = self
            .capacity_readings()
            .filter(|i| {
                i.time_in(ControllerState::Cut) == 0.0
                    && i.time_in(ControllerState::Recovering) == 0.0
            })
            .filter_map(|i| i.roc.max().map(|m| (m, i)))
            .filter(|(m, _)| *m > p.safe_roc && *m < p.danger_roc)
            .collect();
        if ramps.len() < 2 {
            return None;
        }
        let lowest = ramps.iter().map(|(m, _)| *m).reduce(f64::min)?;
        let floor = p.safe_roc + 0.05 * (p.danger_roc - p.safe_roc).abs().max(1e-9);
        let target = (0.8 * lowest).max(floor);
        if target >= p.danger_roc {
            return None;
        }
        let suggested = round_down(target, p.danger_roc).max(floor);
        let peak = ramps.iter().map(|(m, _)| *m).fold(0.0, f64::max);
        Some(self.hint(
            "lower_danger_roc",
            Severity::Critical,
            Some("danger_roc"),
            Some((Setting::Number(p.danger_roc), Setting::Number(suggested))),
            format!(
                "the upstream saturated in {} interval(s) of ramping demand (ROC up to {}, the lowest ramp {}) that never reached danger_roc {}: lower it below those ramps",
                ramps.len(),
                fmt_beside(peak, p.danger_roc),
                fmt_beside(lowest, p.danger_roc),
                fmt_num(p.danger_roc)
            ),
        ))
    }

    /// `new_base`: the base limit `lower_base_limit` suggests in the same report, if
    /// it does: min_rps stays at most half of the base limit that will be in force.
    /// Not for `concurrency`: a route is quiet by its demand, a rate, against its base
    /// limit, which counts requests in flight there (how many a rate keeps in flight
    /// depends on a latency the route need not measure). On a partitioned route the
    /// base limit is one key's: a route whose whole demand is under a fifth of one
    /// key's limit is quiet by any measure, and half of one key's limit bounds the
    /// raise, short of what the keys together let through.
    fn raise_min_rps(&self, new_base: Option<f64>) -> Option<Hint> {
        if self.concurrency() || self.s.distributed {
            return None;
        }
        let base = self.base();
        // The cuts that guarded nothing: those in which the upstream saturated were
        // needed, and a min_rps above their demand would have stopped them. One in
        // which the upstream was never measured is neither.
        let needless: Vec<&CutEpisode> = self.cuts.iter().filter(|c| c.healthy()).collect();
        let needed: Vec<&CutEpisode> = self.cuts.iter().filter(|c| c.saturated).collect();
        let count: u64 = needless.iter().map(|c| c.cuts).sum();
        if count < 3 || self.mean_rps() >= 0.2 * base {
            return None;
        }
        let current = self.s.params.min_rps;
        let peak = needless
            .iter()
            .map(|c| c.peak_demand_rps)
            .fold(0.0, f64::max);
        let most = 0.5 * new_base.unwrap_or(base).min(base);
        let target = (peak * 1.2).max(2.0 * current).min(most);
        if target <= current || needed.iter().any(|c| c.peak_demand_rps <= target) {
            return None;
        }
        // At the bound, rounded down: not above it.
        let suggested = if target == most {
            round_sig(most, 2, false)
        } else {
            round_up(target, current)
        };
        if suggested <= current {
            return None;
        }
        let bound = match new_base {
            Some(b) if target == most => format!(
                ", at most half the base limit of {} {} suggested with it",
                fmt_num(b),
                self.units()
            ),
            _ => String::new(),
        };
        Some(self.hint(
            "raise_min_rps",
            Severity::Warn,
            Some("min_rps"),
            Some((Setting::Number(current), Setting::Number(suggested))),
            format!(
                "{} cuts on a quiet route while the upstream was not saturated (mean demand {} req/s, base limit {} {}, peak demand during them {} req/s): small numbers make ROC jumpy; raise min_rps above that peak{bound}",
                count,
                fmt_measured(self.mean_rps()),
                fmt_num(base),
                self.units(),
                fmt_measured(peak)
            ),
        ))
    }

    /// Not on a partitioned route: neither what each key's base limit would have
    /// rejected during recovery nor what the keys' base limits let through together
    /// (to hold against the upstream's capacity) is observed. Not on a `concurrency`
    /// route: what its base limit would have rejected during recovery is not observed
    /// either (a request refused under the lowered limit never is in flight, and a
    /// limit in flight has no rate to hold demand against), so every rejection there
    /// would count as one a faster restore saves, those the base limit makes too.
    fn faster_restore(&self) -> Option<Hint> {
        if self.s.partitioned || self.s.distributed || self.concurrency() {
            return None;
        }
        let p = &self.s.params;
        // Restoring faster brings back the base limit sooner, and with it whatever the
        // base limit lets through: not while that is more than the upstream takes.
        if self
            .capacity()
            .is_some_and(|cap| self.base_within(cap) < p.base_limit_rps)
        {
            return None;
        }
        // What the base limit refused, or would have, would be refused at any pace of
        // restoring, as `raise_base_limit` counts it ([`base_refused`]: its own, and the
        // cut's of demand beyond its rate), as would the local fallback limiter's (a
        // distributed route while Redis is away): only the rest is what a faster
        // restore can save.
        let (mut secs, mut offered, mut rejected, mut anyway) = (0.0, 0u64, 0u64, 0u64);
        for (i, h) in self.intervals.iter().zip(&self.health) {
            let t = i.time_in(ControllerState::Recovering);
            if t < 0.5 * i.secs() {
                continue;
            }
            if *h != Health::Healthy {
                return None;
            }
            secs += t;
            offered += i.offered;
            // On a `shadow` route what enforcing would have rejected; `shadow_adaptive`
            // enforces its base limit and shadows the lowered limit, whose would-be
            // rejections (of what the base limit let through) are what restoring
            // faster saves there.
            let r = as_enforced(self.s.mode, i);
            let mut refused = r.iter().sum::<u64>() - r[Reason::FallbackLocal.index()];
            if self.s.mode == Mode::ShadowAdaptive {
                refused += i.shadow_rejected[Reason::RocCut.index()];
            }
            rejected += refused;
            let (own, beyond) = base_refused(self.s, i);
            anyway += own + beyond;
        }
        let avoidable = rejected - anyway;
        if offered == 0
            || (avoidable as f64) <= 0.10 * offered as f64
            || secs < 2.0 * p.restore_interval.as_secs_f64()
        {
            return None;
        }
        let depth = (p.base_limit_rps - p.cut_limit_rps).max(0.0);
        let beyond_base = if anyway > 0 {
            format!(
                " ({} beyond what the base limit of {} {} would have rejected)",
                pct(avoidable, offered),
                fmt_num(p.base_limit_rps),
                self.units()
            )
        } else {
            String::new()
        };
        // In a shadow mode the restore rejects nothing yet: the hint readies it for
        // enforcing.
        let share = format!("{} of {} requests", pct(rejected, offered), offered);
        let (severity, figures) = if self.s.mode == Mode::Enforce {
            (Severity::Warn, format!("{share} were rejected"))
        } else {
            (
                Severity::Info,
                format!("enforcing would have rejected {share}"),
            )
        };
        let figures = format!(
            "{figures} during {} of recovery{beyond_base} while the upstream stayed healthy",
            fmt_secs(secs)
        );
        if p.restore_step_rps * 2.0 <= depth.max(p.restore_step_rps) && depth > 0.0 {
            let suggested = round_up((p.restore_step_rps * 2.0).min(depth), p.restore_step_rps);
            Some(self.hint(
                "faster_restore",
                severity,
                Some("restore_step"),
                Some((
                    Setting::Number(p.restore_step_rps),
                    Setting::Number(suggested),
                )),
                format!("{figures}: restore in larger steps"),
            ))
        } else {
            let suggested = round_duration(p.restore_interval / 2).max(Duration::from_millis(100));
            if suggested >= p.restore_interval {
                return None;
            }
            Some(self.hint(
                "faster_restore",
                severity,
                Some("restore_interval"),
                Some((
                    Setting::duration(p.restore_interval),
                    Setting::duration(suggested),
                )),
                format!(
                    "{figures}: restore steps are already large, shorten the interval between them"
                ),
            ))
        }
    }

    /// `others`: the other hints of this part. A verdict "not safe to enforce yet"
    /// says what to tune ([`Evidence::shadow_tuning`]): it said "see the other hints",
    /// and there may be none (`raise_base_limit` judges rejections, which a shadow
    /// route has none of), or none of the setting behind the would-be rejections.
    fn shadow_verdict(&self, others: &[Hint]) -> Option<Hint> {
        let mode = match self.s.mode {
            Mode::Enforce => return None,
            Mode::Shadow => "shadow",
            Mode::ShadowAdaptive => "shadow_adaptive",
        };
        let (mut would, mut would_saturated) = (0u64, 0u64);
        // What would have been rejected outside the intervals the upstream saturated
        // in, by reason; the cut's of demand beyond the base limit's rate are the base
        // limit's, as `raise_base_limit` counts them ([`base_refused`], of what the
        // interval holds as the cut's: an interval before a reload into
        // `shadow_adaptive` may hold enforced ones), and a leaky bucket's `queue_full`
        // ones while the cut was in force are the cut's ([`paced_by_cut`]).
        let mut unneeded: ReasonArray = [0; Reason::ALL.len()];
        // Of `unneeded`'s `limit`, those a partitioned route's `route_limit` would have
        // made out of a cut ([`total_refused`]): its keys' total, not their own limit.
        // (In `shadow_adaptive` its refusals are enforced ones, not among these.)
        let mut by_total = 0;
        for (i, h) in self.intervals.iter().zip(&self.health) {
            would += i.shadow_rejected_total();
            if *h == Health::Saturated {
                would_saturated += i.shadow_rejected_total();
            } else {
                for (mine, n) in unneeded.iter_mut().zip(&i.shadow_rejected) {
                    *mine += n;
                }
                let paced = paced_by_cut(self.s, i);
                unneeded[Reason::QueueFull.index()] -= paced;
                unneeded[Reason::RocCut.index()] += paced;
                let beyond = base_refused(self.s, i)
                    .1
                    .min(i.shadow_rejected[Reason::RocCut.index()] + paced);
                unneeded[Reason::RocCut.index()] -= beyond;
                unneeded[Reason::Limit.index()] += beyond;
                if self.s.mode == Mode::Shadow {
                    by_total += total_refused(self.s, i).0;
                }
            }
        }
        let by_total = by_total.min(unneeded[Reason::Limit.index()]);
        let what = if self.s.mode == Mode::Shadow {
            "enforcing"
        } else {
            "the ROC cut"
        };
        let figures = format!(
            "{what} would have rejected {} of {} requests ({})",
            would,
            self.offered,
            pct(would, self.offered)
        );
        let change = Some((Setting::Text(mode.into()), Setting::Text("enforce".into())));
        if (would as f64) <= 0.01 * self.offered as f64 {
            return Some(self.hint(
                "shadow_verdict",
                Severity::Info,
                Some("mode"),
                change,
                format!("{figures}: safe to enforce"),
            ));
        }
        if would_saturated * 2 >= would {
            return Some(self.hint(
                "shadow_verdict",
                Severity::Warn,
                Some("mode"),
                change,
                format!(
                    "{figures}, {} of them while the upstream was saturated: enforcing would have protected it; turn it on",
                    pct(would_saturated, would)
                ),
            ));
        }
        let tune = self.shadow_tuning(&unneeded, by_total, others);
        Some(self.hint(
            "shadow_verdict",
            Severity::Info,
            None,
            None,
            format!(
                "{figures}, mostly while the upstream was not saturated: not safe to enforce yet; {tune}"
            ),
        ))
    }

    /// What to tune before a shadow route can enforce: for each reason that `would`
    /// (what would have been rejected outside the intervals in which the upstream
    /// saturated) holds at least a tenth of, the most first, the setting behind it.
    /// Where one of `others` (this part's other hints) suggests a change of such a
    /// setting, that hint; otherwise the base limit (toward the demand seen while the
    /// upstream was healthy) or the cut (`danger_roc`, `cut_limit`), quoting what the
    /// intervals hold. The cut's also points at a `faster_restore` hint among `others`:
    /// its would-be rejections include those while it restored the base limit.
    /// `by_total`: of `would`'s `limit`, those a partitioned route's `route_limit`
    /// would have made, its keys together: the total's (`raise_route_limit`), not the
    /// base limit's.
    fn shadow_tuning(&self, would: &ReasonArray, by_total: u64, others: &[Hint]) -> String {
        let total: u64 = would.iter().sum();
        let cut = would[Reason::RocCut.index()];
        let fallback = would[Reason::FallbackLocal.index()];
        let base = total - cut - fallback - by_total;
        let mut parts = [(base, 0), (cut, 1), (fallback, 2), (by_total, 3)];
        parts.sort_by_key(|&(n, _)| std::cmp::Reverse(n));
        parts
            .iter()
            .enumerate()
            .filter(|&(k, &(n, _))| k == 0 || (n > 0 && n * 10 >= total))
            .map(|(_, &(n, which))| {
                let share = pct(n, total);
                let route_limit = self.s.route_limit_rps.unwrap_or_default();
                let (by, settings): (String, &[&str]) = match which {
                    0 => ("the base limit".into(), &["base_limit", "burst"]),
                    1 => ("the ROC cut".into(), &["danger_roc", "cut_limit", "min_rps"]),
                    3 => (
                        format!("the route_limit of {} req/s", fmt_num(route_limit)),
                        &["route_limit"],
                    ),
                    _ => (String::new(), &[]),
                };
                let other = others.iter().find(|h| {
                    h.suggested.is_some()
                        && h.parameter
                            .as_deref()
                            .is_some_and(|p| settings.contains(&p))
                });
                let said = match (other, which) {
                    (Some(h), _) => format!("{share} of them by {by}: see {}", change_of(h)),
                    (None, 0) => self.shadow_base_tuning(&share),
                    (None, 1) => self.shadow_cut_tuning(&share),
                    (None, 3) => format!(
                        "{share} of them by {by} over its keys together, each admitted by its own limit: raise route_limit{} if the upstream takes more (no value is suggested: raise_route_limit asks for over 10% refused while the upstream was measured healthy)",
                        self.in_event()
                    ),
                    (None, _) => format!(
                        "{share} of them by the local fallback limiter while Redis was away, which the route's limits do not set: judge again over a period with Redis reached"
                    ),
                };
                // The cut's would-be rejections include those while it restored the
                // base limit, which restoring faster saves.
                let restore = others
                    .iter()
                    .find(|h| h.rule == "faster_restore" && h.suggested.is_some())
                    .filter(|_| which == 1);
                // A partitioned route's base limit refuses only the keys over it.
                let said = match self.refused_keys() {
                    Some(n) if which == 0 => format!("{said}, {}", would_refuse(n)),
                    _ => said,
                };
                match restore {
                    Some(h) => format!(
                        "{said}, and for those while it restored the limit: see {}",
                        change_of(h)
                    ),
                    None => said,
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// " in event NAME" where this part is an event's, for a setting named in a
    /// reason (a hint without a change has no `event`): the change belongs in its
    /// `[[routes.events]]` entry.
    fn in_event(&self) -> String {
        self.s
            .event
            .as_ref()
            .map_or_else(String::new, |e| format!(" in event {e}"))
    }

    /// [`Evidence::shadow_tuning`] of the base limit: raise it toward the most demand
    /// (requests in flight on `concurrency`) seen in an interval in which the
    /// upstream was measured healthy, within its known capacity.
    fn shadow_base_tuning(&self, share: &str) -> String {
        let at = self.in_event();
        let base = self.base();
        let by = format!(
            "{share} of them by the base limit of {} {}",
            fmt_num(base),
            self.units()
        );
        if self.s.partitioned {
            return format!(
                "{by}: raise base_limit{at} (each key's; one key's demand is not observed, so no value is suggested)"
            );
        }
        if self.s.distributed {
            return format!(
                "{by}: raise base_limit{at} (the fleet's; the demand seen is this instance's share of the fleet's, so no value is suggested)"
            );
        }
        let demand = self
            .intervals
            .iter()
            .zip(&self.health)
            .filter(|(_, h)| **h == Health::Healthy)
            .filter_map(|(i, _)| {
                if self.concurrency() {
                    i.peak_in_flight
                } else {
                    Some(i.peak_demand_rps.max(i.offered as f64 / i.secs()))
                }
            })
            .reduce(f64::max);
        let Some(demand) = demand else {
            return format!(
                "{by}: raise base_limit{at} (no interval measured the upstream healthy with its demand, so no value is suggested)"
            );
        };
        let (mut target, mut bound) = (demand, String::new());
        // At the upstream's capacity, rounded down: not above it.
        let mut round: fn(f64, f64) -> f64 = round_up;
        if let Some((most, why)) = self.highest_base() {
            if most < target {
                (target, bound, round) = (most, why, round_within);
            }
        }
        let suggested = self.fit_limit(round(target, base), true);
        if suggested <= base {
            let burst = match self.s.algorithm {
                Algorithm::TokenBucket { burst } => format!(
                    "; on a token bucket, a larger burst ({}) absorbs bursts the base limit need not",
                    fmt_secs(burst.as_secs_f64())
                ),
                _ => String::new(),
            };
            return format!(
                "{by}, though the most demand seen while the upstream was healthy, {} {}, is within it{}: raise base_limit{at} only with evidence it takes more{burst}",
                fmt_beside(demand, base),
                self.units(),
                bound
            );
        }
        format!(
            "{by}: raise base_limit{at} from {} {} toward {} {}, the most demand seen in an interval while the upstream was healthy ({} {}){bound}",
            fmt_num(base),
            self.units(),
            fmt_num(suggested),
            self.units(),
            fmt_measured(demand),
            self.units()
        )
    }

    /// [`Evidence::shadow_tuning`] of the cut: `danger_roc` above the ROC that started
    /// the cuts in which the upstream did not saturate (without a value where
    /// `raise_danger_roc` does not judge the route, [`Evidence::danger_unjudged`]), or
    /// `cut_limit` toward the demand they saw.
    fn shadow_cut_tuning(&self, share: &str) -> String {
        let at = self.in_event();
        let p = &self.s.params;
        let unneeded = || self.cuts.iter().filter(|c| !c.saturated);
        let trigger = unneeded().map(|c| c.trigger_roc).fold(0.0, f64::max);
        let peak = unneeded().map(|c| c.peak_demand_rps).fold(0.0, f64::max);
        let danger = if let Some((kind, why)) = self.danger_unjudged() {
            format!(
                "raise danger_roc{at} ({}; no value is suggested on {kind}: {why})",
                fmt_num(p.danger_roc)
            )
        } else if trigger > 0.0 {
            format!(
                "raise danger_roc{at} ({}) above {}, the highest ROC that started them",
                fmt_num(p.danger_roc),
                fmt_beside(trigger, p.danger_roc)
            )
        } else {
            format!("raise danger_roc{at} ({})", fmt_num(p.danger_roc))
        };
        let base = self.base();
        let toward = if self.concurrency() || self.s.partitioned || peak <= 0.0 {
            format!("the base limit of {} {}", fmt_num(base), self.units())
        } else if peak >= base {
            format!(
                "the base limit of {} req/s (their demand peaked at {} req/s)",
                fmt_num(base),
                fmt_beside(peak, base)
            )
        } else {
            format!(
                "the {} req/s of demand they saw at their peak",
                fmt_beside(peak, p.cut_limit_rps)
            )
        };
        format!(
            "{share} of them by the ROC cut, in cuts during which the upstream did not saturate: {danger}, or cut_limit{at} ({} {}) toward {toward}",
            fmt_num(p.cut_limit_rps),
            self.units()
        )
    }
}

/// What the base limit refused in `i`, or on a `shadow` route would have refused
/// enforced ([`as_enforced`]), in two parts: the refusals labelled its own, and those
/// labelled `roc_cut` that were its too. Neither the cut's refusals nor the local
/// fallback limiter's (Redis away) are the base limit's, but for the cut's of demand
/// beyond the base limit's rate in the interval, up to what the cut refused there (in
/// all `max(own, min(own + cut, excess))`), which the base limit would have refused
/// too. `raise_base_limit`'s share and the shadow verdict's split both count this.
/// The second part is zero on a `concurrency` or partitioned route, whose base limit
/// is no rate the route's demand can be held against, and on `shadow_adaptive`, which
/// enforces its base limit and only shadows the cut: the cut refuses nothing there,
/// and what it would have refused the base limit let through.
///
/// A leaky bucket refuses with `queue_full`, cut or not (the engine names a `limit`
/// refusal the cut's, not a `queue_full` one): in an interval the cut was in force in
/// (cut or recovering), on a route that enforces or shadows it, those count as the
/// cut's, and such an interval's part before the cut or after the restore is read by
/// its excess alone.
fn base_refused(s: &RouteSettings, i: &Interval) -> (u64, u64) {
    let r = as_enforced(s.mode, i);
    let (total_calm, total_cut) = total_refused(s, i);
    let cut = r[Reason::RocCut.index()] + paced_by_cut(s, i);
    let own =
        (r.iter().sum::<u64>() - cut - r[Reason::FallbackLocal.index()]).saturating_sub(total_calm);
    let cut = cut.saturating_sub(total_cut);
    let rate = !matches!(s.algorithm, Algorithm::Concurrency { .. }) && !s.partitioned;
    if !rate {
        return (own, 0);
    }
    let excess = (i.offered as f64 - s.params.base_limit_rps * i.secs()).max(0.0) as u64;
    (own, excess.min(own + cut).saturating_sub(own))
}

/// A partitioned route's `route_limit` refusals in `i` ([`as_enforced`]:
/// [`Interval::route_limit_rejected`]) as its counts by reason hold them: those under
/// `limit`, outside a cut, and those under `roc_cut`. An interval does not say which
/// of its refusals were made during a cut, so they are taken from `limit` first: exact
/// in an interval wholly out of a cut (all `limit`) or wholly in one (all `roc_cut`).
/// [`base_refused`] leaves both out of the base limit's; `raise_route_limit` judges
/// the first.
fn total_refused(s: &RouteSettings, i: &Interval) -> (u64, u64) {
    let r = as_enforced(s.mode, i);
    let calm = i.route_limit_rejected.min(r[Reason::Limit.index()]);
    let in_cut = (i.route_limit_rejected - calm).min(r[Reason::RocCut.index()]);
    (calm, in_cut)
}

/// The `queue_full` refusals in `i` ([`as_enforced`]) that [`base_refused`] counts as
/// the cut's: on a leaky bucket, in an interval the cut was in force in (cut or
/// recovering), unless the route only shadows the cut (`shadow_adaptive`).
fn paced_by_cut(s: &RouteSettings, i: &Interval) -> u64 {
    let in_force = s.mode != Mode::ShadowAdaptive
        && (i.time_in(ControllerState::Cut) > 0.0 || i.time_in(ControllerState::Recovering) > 0.0);
    if in_force && matches!(s.algorithm, Algorithm::LeakyBucket { .. }) {
        as_enforced(s.mode, i)[Reason::QueueFull.index()]
    } else {
        0
    }
}

/// What the route rejected in `i`, by reason; on a `shadow` route, which rejects
/// nothing, what enforcing would have rejected. (`shadow_adaptive` enforces its base
/// limit: its rejections are its own, and its would-be ones the cut's.)
fn as_enforced(mode: Mode, i: &Interval) -> &ReasonArray {
    if mode == Mode::Shadow {
        &i.shadow_rejected
    } else {
        &i.rejected
    }
}

fn health(i: &Interval, p: &Policy) -> Health {
    let Some(u) = &i.upstream else {
        return Health::Unknown;
    };
    if u.requests == 0 {
        return Health::Unknown;
    }
    let errors = u.errors as f64 / u.requests as f64;
    // A p99 past the budget: more than 1% of the requests measured took longer. Those
    // in the budget's own bucket of the sketch are not counted as longer: the meter
    // records its bucket bounds (the 0.5 s one at the default budget), which the
    // sketch holds up to 2.4% above them, and read as its p99 they made a p99 of
    // 400 ms with one request in a hundred at 600 ms "512 ms".
    let slow = u.latency.count_above(p.latency_budget.as_secs_f64()) as f64
        > 0.01 * u.latency.count() as f64;
    if errors > p.error_budget || slow {
        Health::Saturated
    } else {
        Health::Healthy
    }
}

fn median(xs: &mut [f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

/// `x` to `digits` significant digits, rounded up (`up`) or down: the float nearest
/// that decimal ([`decimal`]).
fn round_sig(x: f64, digits: i32, up: bool) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let shift = digits - 1 - x.abs().log10().floor() as i32;
    let scale = 10f64.powi(shift);
    if !scale.is_finite() {
        return x;
    }
    let scaled = x * scale;
    // Not a hair above a round value because of binary fractions.
    let near = scaled.round();
    let r = if (scaled - near).abs() < 1e-9 {
        near
    } else if up {
        scaled.ceil()
    } else {
        scaled.floor()
    };
    decimal(r, -shift)
}

/// The float nearest `whole` × 10^`exponent` (`whole` a whole number of a few
/// digits): the number that decimal reads as, written in a file or typed. Divided by
/// 10^-`exponent`, it was off by a hair wherever that is below 1, which no float
/// holds: 2 × 777000 rounded up to 2 digits was 1599999.9999999998, not 1600000.
fn decimal(whole: f64, exponent: i32) -> f64 {
    format!("{whole}e{exponent}")
        .parse()
        .unwrap_or(whole * 10f64.powi(exponent))
}

/// A suggested increase over `from`: `x` rounded up to a readable value.
fn round_up(x: f64, from: f64) -> f64 {
    (2..=4)
        .map(|d| round_sig(x, d, true))
        .find(|&r| r > from)
        .unwrap_or(x)
}

/// A suggested increase over `from` up to a bound `x`: `x` rounded down to a readable
/// value still above `from`.
fn round_within(x: f64, from: f64) -> f64 {
    (2..=4)
        .map(|d| round_sig(x, d, false))
        .find(|&r| r > from)
        .unwrap_or(x)
}

/// A suggested decrease below `from`: `x` rounded down to a readable value.
fn round_down(x: f64, from: f64) -> f64 {
    (2..=4)
        .map(|d| round_sig(x, d, false))
        .find(|&r| r < from)
        .unwrap_or(x)
}

fn round_duration(d: Duration) -> Duration {
    if d >= Duration::from_secs(1) {
        Duration::from_millis(u64::try_from(d.as_millis() / 100 * 100).unwrap_or(u64::MAX))
    } else {
        Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1))
    }
}

/// A setting or a suggestion as an operator reads it: no needless decimals, to 4
/// significant digits at least, as suggestions are rounded (a raise of a base limit
/// of 0.001 to 0.0013 read "0.001 → 0.001", one to 230.8 "→ 231", a value above the
/// bound it was rounded down to), to the thousandth from 1 to 100 and whole from
/// 1000; with an exponent past 10^15 or below 10^-4 ([`plain`]).
fn fmt_num(x: f64) -> String {
    plain(num_shown(x))
}

/// The value [`fmt_num`] prints.
fn num_shown(x: f64) -> f64 {
    let a = x.abs();
    if a >= 1000.0 {
        x.round()
    } else if (1.0..100.0).contains(&a) {
        (x * 1000.0).round() / 1000.0
    } else {
        nearest_sig(x, 4)
    }
}

/// A measured figure (a rate, a ROC, a capacity, a bound read from them) as an
/// operator reads it: to 3 significant digits, whole from 100. It printed the
/// thousandths of a rate read from intervals, "it saturates at about 86.392 req/s",
/// beside suggestions rounded to 2.
fn fmt_measured(x: f64) -> String {
    plain(measured_shown(x))
}

/// The value [`fmt_measured`] prints.
fn measured_shown(x: f64) -> f64 {
    if x.abs() >= 100.0 {
        x.round()
    } else {
        nearest_sig(x, 3)
    }
}

/// A measured figure quoted beside a `setting` it exceeds or falls short of: as
/// [`fmt_measured`], with as many more significant digits as it takes for the two as
/// printed (the setting by [`fmt_num`]) to compare as they do, and as the setting
/// when equal. A false cut started at ROC 50.04 read "raise danger_roc (50) above
/// 50".
fn fmt_beside(x: f64, setting: f64) -> String {
    if x == setting {
        return fmt_num(setting);
    }
    let shown = num_shown(setting);
    let order = x.partial_cmp(&setting);
    // Past the whole digits that fmt_measured keeps from 100 on.
    let from = if x.abs() >= 100.0 {
        x.abs().log10().floor() as i32 + 2
    } else {
        4
    };
    std::iter::once(measured_shown(x))
        .chain((from..=17).map(|d| nearest_sig(x, d)))
        .find(|r| r.partial_cmp(&shown) == order)
        .map_or_else(|| plain(x), plain)
}

/// `x` to the nearest of `digits` significant digits: the float nearest that
/// decimal ([`decimal`]).
fn nearest_sig(x: f64, digits: i32) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let shift = digits - 1 - x.abs().log10().floor() as i32;
    let scale = 10f64.powi(shift);
    if !scale.is_finite() {
        return x;
    }
    decimal((x * scale).round(), -shift)
}

/// `r` as a file writes it ([`figure`](crate::config::figure)): without a fraction of
/// zero, and with an exponent past 10^15 or below 10^-4, so that a suggestion of
/// 1.7e302 is not printed in 303 digits, nor one past 2^63 as an integer a TOML file
/// cannot hold.
fn plain(r: f64) -> String {
    crate::config::figure(r)
}

fn fmt_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{:.1} s", s)
    }
}

fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0%".into();
    }
    format!("{:.1}%", 100.0 * part as f64 / whole as f64)
}
