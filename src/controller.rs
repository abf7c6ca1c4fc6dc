//! The ROC controller: a small state machine that turns window samples into a route's
//! current limit.
//!
//! ```text
//! Normal ── roc > danger_roc ──▶ Cut (limit = cut_limit)
//! Cut ── roc < safe_roc continuously for `hold` ──▶ Recovering
//! Cut ── in Cut for `max_cut` ──▶ Recovering (regardless of ROC)
//! Recovering: every `restore_interval`, limit += restore_step (up to base_limit)
//! Recovering ── roc > danger_roc ──▶ Cut        Recovering ── limit == base ──▶ Normal
//! ```
//!
//! It is stepped once per completed window slot with that slot's [`SampleAt`]. Every
//! timed rule is evaluated from timestamps, not from the number of steps, so a route
//! that fell silent and is stepped once at the end of a long gap lands exactly where
//! per-slot stepping would have put it, and a burst of requests can never undo a cut.
//!
//! Guards against false cuts, each on its own parameter:
//! - no cut while the later half-window's demand is below `min_rps`, or holds fewer
//!   than `min_samples` arrivals;
//! - no cut, and no end of a cut, before one full window has passed since start or
//!   [`Controller::rearm`] (a restore in progress keeps its schedule), and none
//!   dated before then;
//! - no cut before `min_dwell` has passed in `Normal` or `Recovering`, and no
//!   restoring after calm before it has passed in `Cut`;
//! - `max_cut` bounds how long a cut can last, even one shorter than `min_dwell`
//!   (and `Recovering` ends when the limit reaches base, however soon).
//!
//! ```
//! use rocgate::clock::Nanos;
//! use rocgate::controller::{Controller, ControllerParams, ControllerState};
//! use rocgate::window::{RocSample, SampleAt};
//! use std::time::Duration;
//!
//! let params = ControllerParams::default(); // base 200, cut 60, danger 80, safe 20
//! let mut c = Controller::new(params, Nanos::ZERO, Duration::from_secs(6));
//! let spike = RocSample { n_prev: 120, n_recent: 1500, rate_prev_rps: 40.0, rate_recent_rps: 500.0, roc: 460.0 };
//! let mut seen = Vec::new();
//! c.observe(SampleAt { at: Nanos::from_secs(10), sample: spike }, |t| seen.push(t));
//! assert_eq!(c.state(), ControllerState::Cut);
//! assert_eq!(c.limit_rps(), 60.0);
//! assert_eq!(seen[0].to, ControllerState::Cut);
//! ```

use crate::clock::{duration_nanos, Nanos};
use crate::window::{RocMode, RocSample, SampleAt};
use std::fmt;
use std::time::Duration;

/// The most readings of a spike that holds its level that
/// [`Controller::next_raise_held`] observes: a window of up to 1,024 slots is told to
/// the slot (the default one holds 60), at about 13 ns a reading (`retry_after` in
/// `benches/check.rs`: a step of a cut route under a window of 100,000 slots took
/// 1.26 ms, and 25 µs with this bound).
pub const HELD_READINGS: usize = 1024;

/// Every parameter of the controller. Validated by the config layer; the controller
/// itself only relies on `cut_limit ≤ base_limit`, `safe_roc ≤ danger_roc` and a
/// non-zero `restore_interval`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ControllerParams {
    /// Limit in normal operation, req/s.
    pub base_limit_rps: f64,
    /// Limit right after a cut, req/s.
    pub cut_limit_rps: f64,
    /// ROC above which the route is cut (req/s per half-window, or a ratio in relative mode).
    pub danger_roc: f64,
    /// ROC below which the route counts as calm again.
    pub safe_roc: f64,
    /// How long ROC must stay below `safe_roc` before restoring starts (the config
    /// takes at most a day).
    pub hold: Duration,
    /// How much the limit rises at each restore step, req/s.
    pub restore_step_rps: f64,
    /// Time between restore steps (the config takes at most a day).
    pub restore_interval: Duration,
    /// No cut while the later half-window's demand is below this, req/s. Also the
    /// floor of the denominator in relative mode.
    pub min_rps: f64,
    /// No cut while the later half-window holds fewer arrivals than this.
    pub min_samples: u64,
    /// Minimum time in a state before ROC moves the controller out of it: before a
    /// cut, and before restoring after calm. `max_cut` and the last restore step are
    /// not held back by it (the config takes at most a day).
    pub min_dwell: Duration,
    /// Longest cut: after it, restoring starts whatever ROC says (the config takes at
    /// most a day).
    pub max_cut: Duration,
    /// Absolute or relative ROC.
    pub roc_mode: RocMode,
}

impl ControllerParams {
    /// These parameters, an event's profile written over the route's own `from`, moved
    /// onto the route's new own parameters `onto`: a field the profile leaves as `from`
    /// has it takes `onto`'s; a field it sets otherwise stays the profile's. So a
    /// runtime change reaches the fields an event does not set, while the event is in
    /// force too. `roc_mode`, `danger_roc` and `safe_roc` move together: thresholds
    /// mean something only in their mode, so a profile that differs in any of the
    /// three keeps all three.
    #[must_use]
    pub fn rebased(&self, from: &ControllerParams, onto: &ControllerParams) -> ControllerParams {
        ProfileFields::differing(self, from).apply(self, onto)
    }
}

/// Which of the controller's fields an event's profile sets, as its table in the file
/// wrote them: a field it sets stays the event's through any runtime change of the
/// route's own parameters, even one that passes by the event's value; a field it does
/// not set is the route's own in force. `roc_mode`, `danger_roc` and `safe_roc` are
/// each named as written, and kept together ([`ProfileFields::roc`]): an event that
/// sets any of the three keeps all three (thresholds mean something only in their
/// mode).
///
/// It has a field for each of the controller's parameters, and gains one with each
/// parameter added ([`ControllerParams`] is `#[non_exhaustive]` too): build one from
/// `Default` (none) or [`ProfileFields::ALL`] and set its fields.
///
/// ```
/// use rocgate::controller::ProfileFields;
///
/// let mut sets = ProfileFields::default();
/// sets.base_limit = true;
/// assert_ne!(sets, ProfileFields::default());
/// ```
///
/// A struct expression does not compile outside rocgate, `..Default::default()`
/// included:
///
/// ```compile_fail,E0639
/// use rocgate::controller::ProfileFields;
///
/// let sets = ProfileFields { base_limit: true, ..ProfileFields::default() };
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProfileFields {
    /// `base_limit`.
    pub base_limit: bool,
    /// `cut_limit`.
    pub cut_limit: bool,
    /// `roc_mode`.
    pub roc_mode: bool,
    /// `danger_roc`.
    pub danger_roc: bool,
    /// `safe_roc`.
    pub safe_roc: bool,
    /// `hold`.
    pub hold: bool,
    /// `restore_step`.
    pub restore_step: bool,
    /// `restore_interval`.
    pub restore_interval: bool,
    /// `min_rps`.
    pub min_rps: bool,
    /// `min_samples`.
    pub min_samples: bool,
    /// `min_dwell`.
    pub min_dwell: bool,
    /// `max_cut`.
    pub max_cut: bool,
}

impl ProfileFields {
    /// The fields where `profile` differs from `own`, the route's parameters it was
    /// written over.
    #[must_use]
    pub fn differing(profile: &ControllerParams, own: &ControllerParams) -> ProfileFields {
        let (p, o) = (profile, own);
        ProfileFields {
            base_limit: p.base_limit_rps != o.base_limit_rps,
            cut_limit: p.cut_limit_rps != o.cut_limit_rps,
            roc_mode: p.roc_mode != o.roc_mode,
            danger_roc: p.danger_roc != o.danger_roc,
            safe_roc: p.safe_roc != o.safe_roc,
            hold: p.hold != o.hold,
            restore_step: p.restore_step_rps != o.restore_step_rps,
            restore_interval: p.restore_interval != o.restore_interval,
            min_rps: p.min_rps != o.min_rps,
            min_samples: p.min_samples != o.min_samples,
            min_dwell: p.min_dwell != o.min_dwell,
            max_cut: p.max_cut != o.max_cut,
        }
    }

    /// Every field: a whole profile.
    pub const ALL: ProfileFields = ProfileFields {
        base_limit: true,
        cut_limit: true,
        roc_mode: true,
        danger_roc: true,
        safe_roc: true,
        hold: true,
        restore_step: true,
        restore_interval: true,
        min_rps: true,
        min_samples: true,
        min_dwell: true,
        max_cut: true,
    };

    /// Whether these name any of `roc_mode`, `danger_roc` and `safe_roc`: then the
    /// profile keeps all three.
    #[must_use]
    pub fn roc(&self) -> bool {
        self.roc_mode || self.danger_roc || self.safe_roc
    }

    /// `profile`'s fields that these name, the others `onto`'s, the three of ROC
    /// together ([`ProfileFields::roc`]).
    #[must_use]
    pub fn apply(&self, profile: &ControllerParams, onto: &ControllerParams) -> ControllerParams {
        fn field<T: Clone>(set: bool, profile: &T, onto: &T) -> T {
            if set { profile } else { onto }.clone()
        }
        // Every flag named, so that a new one cannot be left out.
        let ProfileFields {
            base_limit,
            cut_limit,
            roc_mode,
            danger_roc,
            safe_roc,
            hold,
            restore_step,
            restore_interval,
            min_rps,
            min_samples,
            min_dwell,
            max_cut,
        } = *self;
        let roc = roc_mode || danger_roc || safe_roc;
        let (p, o) = (profile, onto);
        ControllerParams {
            base_limit_rps: field(base_limit, &p.base_limit_rps, &o.base_limit_rps),
            cut_limit_rps: field(cut_limit, &p.cut_limit_rps, &o.cut_limit_rps),
            danger_roc: field(roc, &p.danger_roc, &o.danger_roc),
            safe_roc: field(roc, &p.safe_roc, &o.safe_roc),
            roc_mode: field(roc, &p.roc_mode, &o.roc_mode),
            hold: field(hold, &p.hold, &o.hold),
            restore_step_rps: field(restore_step, &p.restore_step_rps, &o.restore_step_rps),
            restore_interval: field(restore_interval, &p.restore_interval, &o.restore_interval),
            min_rps: field(min_rps, &p.min_rps, &o.min_rps),
            min_samples: field(min_samples, &p.min_samples, &o.min_samples),
            min_dwell: field(min_dwell, &p.min_dwell, &o.min_dwell),
            max_cut: field(max_cut, &p.max_cut, &o.max_cut),
        }
    }
}

impl Default for ControllerParams {
    /// The classic values: base 200, cut 60, danger 80, safe 20, step 20 every 1 s
    /// after a 2 s hold.
    fn default() -> Self {
        ControllerParams {
            base_limit_rps: 200.0,
            cut_limit_rps: 60.0,
            danger_roc: 80.0,
            safe_roc: 20.0,
            hold: Duration::from_secs(2),
            restore_step_rps: 20.0,
            restore_interval: Duration::from_secs(1),
            min_rps: 10.0,
            min_samples: 20,
            min_dwell: Duration::from_secs(1),
            max_cut: Duration::from_secs(60),
            roc_mode: RocMode::Absolute,
        }
    }
}

/// Where the controller stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ControllerState {
    /// The limit is the base limit.
    Normal,
    /// The limit is the cut limit.
    Cut,
    /// The limit climbs back to base, one step per `restore_interval`.
    Recovering,
}

impl ControllerState {
    /// Lower-case name, as used in metrics, logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ControllerState::Normal => "normal",
            ControllerState::Cut => "cut",
            ControllerState::Recovering => "recovering",
        }
    }

    /// A small number per state, for a gauge: 0 normal, 1 cut, 2 recovering.
    pub fn as_index(self) -> u8 {
        match self {
            ControllerState::Normal => 0,
            ControllerState::Cut => 1,
            ControllerState::Recovering => 2,
        }
    }
}

impl fmt::Display for ControllerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a controller's transitions add up to, as `rocgate_controller_transitions_total`,
/// `rocgate_cuts_total` and `rocgate_cut_seconds_total` count them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransitionCounts {
    /// Transitions by `[from][to]` ([`ControllerState::as_index`]).
    pub transitions: [[u64; 3]; 3],
    /// Transitions into Cut.
    pub cuts: u64,
    /// Time spent in cut: a local controller's in the cuts that have ended
    /// ([`record`](Self::record)); a shared controller's, in the slots this instance
    /// stepped, cut in force included.
    pub time_in_cut: Duration,
}

impl TransitionCounts {
    /// Counts `t`, which left a state entered at `entered`, and if it left Cut, the
    /// time in that cut.
    pub fn record(&mut self, t: &Transition, entered: Nanos) {
        self.count(t);
        if t.from == ControllerState::Cut {
            self.time_in_cut += t.at.saturating_since(entered);
        }
    }

    /// Counts `t` and, if it entered Cut, the cut; not the time in cut, which the
    /// caller counts.
    pub fn count(&mut self, t: &Transition) {
        self.transitions[t.from.as_index() as usize][t.to.as_index() as usize] += 1;
        if t.to == ControllerState::Cut {
            self.cuts += 1;
        }
    }
}

/// A change of state, reported to the caller for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Transition {
    /// State left.
    pub from: ControllerState,
    /// State entered.
    pub to: ControllerState,
    /// When the change took effect.
    pub at: Nanos,
    /// ROC (in the configured mode) of the sample that caused it.
    pub roc: f64,
    /// The limit after the change, req/s.
    pub limit_rps: f64,
}

/// A controller's progress without its parameters: what a shared store keeps between
/// steps so that whichever instance steps the controller next continues where the last
/// one stopped ([`Controller::memory`], [`Controller::from_memory`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ControllerMemory {
    /// The state.
    pub state: ControllerState,
    /// When the state was entered.
    pub entered_at: Nanos,
    /// No action before this time.
    pub armed_at: Nanos,
    /// Since when ROC has stayed below `safe_roc` in `Cut`, if it has.
    pub safe_since: Option<Nanos>,
    /// The limit, req/s.
    pub limit_rps: f64,
    /// ROC of the last sample observed.
    pub last_roc: f64,
}

impl ControllerMemory {
    /// This memory, kept under `from`, carried to `to` whose limits count something
    /// else (a route changing to or from `concurrency`, requests per second or in
    /// flight, or to or from a partition, the route's rate or a key's): a restore keeps
    /// its place as a share of the way from the cut limit to the base limit, on `to`'s
    /// step at or below that share, taking its next step one `restore_interval` after
    /// `now` ([`Controller::from_memory`] at `now`). Its limit carried as it was could
    /// stand above `to`'s base and end the restore at once. The other states are kept
    /// as they are: their limit follows from the state.
    #[must_use]
    pub fn carried_across(
        mut self,
        from: &ControllerParams,
        to: &ControllerParams,
        now: Nanos,
    ) -> Self {
        if self.state != ControllerState::Recovering {
            return self;
        }
        let span = from.base_limit_rps - from.cut_limit_rps;
        let share = if span > 0.0 {
            ((self.limit_rps - from.cut_limit_rps) / span).clamp(0.0, 1.0)
        } else {
            0.0
        };
        let way = share * (to.base_limit_rps - to.cut_limit_rps).max(0.0);
        let steps = if to.restore_step_rps > 0.0 {
            (way / to.restore_step_rps + 1e-9).floor()
        } else {
            0.0
        };
        self.limit_rps = to.cut_limit_rps + steps * to.restore_step_rps;
        self.entered_at = now;
        self
    }
}

/// The ROC state machine of one route.
#[derive(Clone, Debug)]
pub struct Controller {
    params: ControllerParams,
    state: ControllerState,
    entered_at: Nanos,
    armed_at: Nanos,
    safe_since: Option<Nanos>,
    limit_rps: f64,
    /// When `limit_rps` took its value (see [`Controller::limit_since`]).
    limit_since: Nanos,
    last_roc: f64,
    /// The last sample observed, as much of it as its ROC in either mode needs (the
    /// earlier half's rate and the absolute ROC): a change of `roc_mode` or `min_rps`
    /// reads it again. Not kept in [`ControllerMemory`]. [`NO_READING`] before the
    /// first (a pair of NaN, which no sample's rate is: an `Option` of the pair took
    /// 8 bytes more, and a route's state is held to its budget).
    last_reading: (f64, f64),
    /// [`Controller::cut_fraction`]. Not kept in [`ControllerMemory`].
    cut_fraction: f64,
}

impl Controller {
    /// A controller in `Normal` at `now`, which takes no action before `now + window`.
    pub fn new(params: ControllerParams, now: Nanos, window: Duration) -> Self {
        let limit_rps = params.base_limit_rps;
        Controller {
            state: ControllerState::Normal,
            entered_at: now,
            armed_at: now + window,
            safe_since: None,
            limit_rps,
            limit_since: now,
            last_roc: 0.0,
            last_reading: NO_READING,
            cut_fraction: fraction_of_base(&params),
            params,
        }
    }

    /// Its progress, to be continued elsewhere with [`Controller::from_memory`].
    pub fn memory(&self) -> ControllerMemory {
        ControllerMemory {
            state: self.state,
            entered_at: self.entered_at,
            armed_at: self.armed_at,
            safe_since: self.safe_since,
            limit_rps: self.limit_rps,
            last_roc: self.last_roc,
        }
    }

    /// A controller that continues from `memory` under `params` (the limit is
    /// recomputed for the state under these parameters, as by
    /// [`Controller::set_params`] at `now`, whose transition, if any, is not reported:
    /// [`Controller::from_memory_reporting`] reports it).
    /// A restore whose limit is above where `params`' schedule puts it at `now` was
    /// stepped under another schedule (another instance's parameters, or a change
    /// since): it goes on from the limit it reached, as after a change, its next step
    /// one interval after `now`. One below it (time passed since its last step, when
    /// `now` is later than that) goes on at its pace: it may also have been stepped
    /// under a slower schedule, and then takes the steps `params` would have taken.
    pub fn from_memory(params: ControllerParams, memory: ControllerMemory, now: Nanos) -> Self {
        Self::from_memory_reporting(params, memory, now, |_| {})
    }

    /// [`Controller::from_memory`], the transition `params` make, if any (a restore
    /// whose limit reaches their base limit ends), passed to `on_transition`.
    pub fn from_memory_reporting(
        params: ControllerParams,
        memory: ControllerMemory,
        now: Nanos,
        on_transition: impl FnMut(Transition),
    ) -> Self {
        let mut c = Controller {
            params: params.clone(),
            state: memory.state,
            entered_at: memory.entered_at,
            armed_at: memory.armed_at,
            safe_since: memory.safe_since,
            limit_rps: memory.limit_rps,
            limit_since: memory.entered_at,
            last_roc: memory.last_roc,
            last_reading: NO_READING,
            cut_fraction: fraction_of_base(&params),
        };
        if c.state == ControllerState::Recovering && c.recovering_limit(now) < c.limit_rps {
            c.entered_at = c.restore_origin(now, now);
        }
        c.limit_since = c.step_time();
        c.set_params(params, now, on_transition);
        c
    }

    /// The parameters in force.
    pub fn params(&self) -> &ControllerParams {
        &self.params
    }

    /// The current state.
    pub fn state(&self) -> ControllerState {
        self.state
    }

    /// The current limit, req/s.
    pub fn limit_rps(&self) -> f64 {
        self.limit_rps
    }

    /// ROC (in the configured mode) of the last sample observed.
    pub fn last_roc(&self) -> f64 {
        self.last_roc
    }

    /// Whether ROC decides on a sample at `at`: not before one full window has passed
    /// since start or [`Controller::rearm`].
    pub fn armed(&self, at: Nanos) -> bool {
        at >= self.armed_at
    }

    /// When the current state was entered.
    pub fn entered_at(&self) -> Nanos {
        self.entered_at
    }

    /// When the limit took the value it has: the transition or restore step that set
    /// it, or the last change of parameters (which may move the base limit alone,
    /// which `shadow_adaptive` enforces). Stepped once at the end of a long silence, the
    /// controller dates each change where per-slot stepping would have made it, and a
    /// limiter that takes the new limit only then can refill at it from that time.
    pub fn limit_since(&self) -> Nanos {
        self.limit_since
    }

    /// Where the limit stands between cut (0.0) and base (1.0). Routes with several
    /// tiers scale each tier's own limits by it, and a partitioned route's
    /// `route_limit` its total, from [`Controller::cut_fraction`].
    pub fn progress(&self) -> f64 {
        let span = self.params.base_limit_rps - self.params.cut_limit_rps;
        if span <= 0.0 {
            1.0
        } else {
            ((self.limit_rps - self.params.cut_limit_rps) / span).clamp(0.0, 1.0)
        }
    }

    /// The fraction of its base limit the last cut held the limit to when it was
    /// made: `cut_limit ÷ base_limit` as they stood when the controller last entered
    /// `Cut` (at most 1; before any cut, and continued from a [`ControllerMemory`],
    /// those of the parameters it was given). A change of parameters during the cut
    /// or its restore does not move it. A partitioned route holds its `route_limit`
    /// at this fraction in the cut and brings it back with [`Controller::progress`].
    pub fn cut_fraction(&self) -> f64 {
        self.cut_fraction
    }

    /// Suspends what ROC decides (a cut, the end of a cut) for one full window from
    /// `now`, as after a reload. The state and the limit are kept, and a restore in
    /// progress keeps its pace; a cut whose hold or `max_cut` passes meanwhile starts
    /// restoring when the window is over, from the cut limit.
    pub fn rearm(&mut self, now: Nanos, window: Duration) {
        self.armed_at = now + window;
    }

    /// Replaces the parameters (a runtime change, or a scheduled event starting or
    /// ending), keeping the state: the limit is recomputed for the state under the new
    /// parameters. A recovering limit already at the new base ends the recovery: that
    /// transition to `Normal` is passed to `on_transition`. A cut whose new parameters
    /// end it sooner (a shorter `hold` or `max_cut`) restores from `now` at the
    /// earliest, one step at a time.
    ///
    /// A restore whose schedule the change replaces (`cut_limit`, `restore_step` or
    /// `restore_interval`) is first brought up to `now` under the old one (a change
    /// applied late, after a silence, lands where stepping every slot would have), then
    /// goes on under the new one from the limit it has reached: from the new cut limit
    /// if that is higher, else from the new schedule's first step at or above that
    /// limit. A limit on the new schedule (the new cut limit included) takes its next
    /// step one new interval after its last step, or at the change if that has passed;
    /// one between two steps takes the upper one at the change, and the next one new
    /// interval later. The restore is re-dated to where the new schedule would have
    /// started it, which [`Controller::entered_at`] then reports and `min_dwell`
    /// counts from. A schedule is not dated before the clock's origin: one younger
    /// than the steps it has taken goes on from the highest step it has room for.
    pub fn set_params(
        &mut self,
        params: ControllerParams,
        now: Nanos,
        mut on_transition: impl FnMut(Transition),
    ) {
        let changed = self.params != params;
        if changed
            && self.state == ControllerState::Recovering
            && self.recovering_limit(now) > self.limit_rps
        {
            let roc = self.last_roc;
            self.restore(now, roc, &mut on_transition);
        }
        if changed && self.state == ControllerState::Cut {
            // The cut's end under the new parameters (a shorter hold or max_cut) is
            // not dated before they came in force: it restores from now, one step at
            // a time, not with the steps it would have taken since.
            self.armed_at = self.armed_at.max(now);
        }
        let rescheduled = self.state == ControllerState::Recovering
            && (params.cut_limit_rps != self.params.cut_limit_rps
                || params.restore_step_rps != self.params.restore_step_rps
                || params.restore_interval != self.params.restore_interval);
        let last_step = self.step_time();
        self.params = params;
        // The last ROC in the mode in force, as snapshots show it beside its
        // thresholds.
        let (rate_prev_rps, roc) = self.last_reading;
        if !rate_prev_rps.is_nan() {
            let sample = RocSample {
                rate_prev_rps,
                roc,
                ..RocSample::default()
            };
            self.last_roc = sample.roc_in(self.params.roc_mode, self.params.min_rps);
        }
        if rescheduled {
            self.entered_at = self.restore_origin(last_step.min(now), now);
        }
        let before = self.limit_rps;
        self.limit_rps = match self.state {
            ControllerState::Normal => self.params.base_limit_rps,
            ControllerState::Cut => self.params.cut_limit_rps,
            ControllerState::Recovering => self.recovering_limit(now),
        };
        if changed || self.limit_rps != before {
            self.limit_since = now.max(self.limit_since);
        }
        if self.state == ControllerState::Recovering && self.limit_rps >= self.params.base_limit_rps
        {
            let roc = self.last_roc;
            self.enter(ControllerState::Normal, now, roc, &mut on_transition);
        }
    }

    /// When the limit will next rise, as seen at `now` on a route whose ROC window is
    /// `window` long, for `Retry-After` on a cut. `None` in `Normal`. A cut never ends
    /// while the controller is disarmed ([`Controller::rearm`]): then not before one
    /// interval after it is armed again. A restore in progress keeps its schedule.
    ///
    /// In `Cut`, once ROC is calm: when its `hold` ends, plus one `restore_interval`.
    /// Before that, when the cut's spike ends is not known, and without the window's
    /// readings this takes the calm to begin a window after the cut began (a spike
    /// that holds its level fills the window by then, and both halves carry it), or
    /// `now` once that has passed: the estimate is that calm, plus the `hold` and the
    /// interval. Under a `safe_roc` of 0 or below a spike that holds its level never
    /// reads calm (its ROC falls to 0, not under it): the estimate is the end of
    /// `max_cut` plus the interval. Never later than `max_cut` allows.
    /// [`next_raise_held`](Self::next_raise_held) tells it from the readings a spike
    /// that holds its level will give, which the engine has.
    ///
    /// Under the parameters in force alone: a change of parameters due before then (a
    /// scheduled event's start or end) is not seen here.
    /// [`Schedule::next_raise`](crate::engine::Schedule::next_raise) walks a route's
    /// controller through them, as the engine and a shared store tell `Retry-After`.
    pub fn next_raise_at(&self, now: Nanos, window: Duration) -> Option<Nanos> {
        let at = match self.state {
            ControllerState::Normal => return None,
            ControllerState::Cut => {
                // A calm that starts while the controller is disarmed is seen, and
                // its hold counted, from when it is armed again.
                let calm = self.safe_since.or_else(|| {
                    (self.params.safe_roc > 0.0)
                        .then(|| (self.entered_at + window).max(now).max(self.armed_at))
                });
                self.cut_end_at(calm)
                    .saturating_add(duration_nanos(self.params.restore_interval))
            }
            ControllerState::Recovering => self.step_at(self.limit_steps().saturating_add(1)),
        };
        Some(Nanos::new(at))
    }

    /// When the limit will next rise above where it stands if demand holds its
    /// level, told from `readings`: the window's readings at the ends of the slots to
    /// come if each holds what the last one completed did
    /// ([`SlotRing::held`](crate::window::SlotRing::held)), the last of them at
    /// `settled`, when the window holds that level alone, past which they stay as the
    /// last (ROC 0). A copy of the controller observes each, and the first slot end
    /// at which its limit is above where it stands is the answer: a spike still
    /// rising reads calm later, one under a `safe_roc` near its height before it
    /// fills the window, and a `max_cut` or a restore step met while it reads above
    /// `danger_roc` cuts again. Past them, what the readings leave: the hold of the
    /// calm they end in, or `max_cut` if they end in none, then the restore's first
    /// step past the limit; or that step of a restore under way. `None` in `Normal`,
    /// or if the limit never rises past where it stands.
    ///
    /// Observes [`HELD_READINGS`] readings at most (a window wider than that, up to
    /// the config's 100,000 slots, would cost a millisecond a step): with more, and no
    /// raise among those observed, the calm is taken to begin at `settled`, where the
    /// held level surely reads calm under a positive `safe_roc` (ROC 0; under one of 0
    /// or below, never: `max_cut`), not at a calm begun among the readings observed,
    /// which those not observed may break. Later than the held spike's own raise by up
    /// to the readings not observed, never earlier, but a restore met in them while
    /// the spike reads above `danger_roc` (a cut again) is not seen. Taken once a step
    /// while cut or recovering, not once a decision.
    /// [`next_raise_at`](Self::next_raise_at) is its estimate without the readings.
    pub fn next_raise_held(
        &self,
        readings: impl IntoIterator<Item = SampleAt>,
        settled: Nanos,
    ) -> Option<Nanos> {
        if self.state == ControllerState::Normal {
            return None;
        }
        let limit = self.limit_rps;
        let mut c = self.clone();
        let mut readings = readings.into_iter();
        for s in readings.by_ref().take(HELD_READINGS) {
            c.observe(s, |_| {});
            if c.limit_rps > limit {
                return Some(s.at);
            }
        }
        let calm = match readings.next() {
            None => c.safe_since,
            Some(_) => (c.params.safe_roc > 0.0).then_some(settled),
        };
        c.raised_past(limit, calm)
    }

    /// When the limit is first above `limit`, the readings to come reading as the last
    /// one did: in `Cut`, the restore's first step past it from the end of the hold of
    /// a calm begun at `calm` (`None`: none, the cut ends at `max_cut`); in
    /// `Recovering`, the first of its steps past it, and not before the next. `None`
    /// in `Normal`, or if the base limit is not above `limit`.
    pub(crate) fn raised_past(&self, limit: f64, calm: Option<Nanos>) -> Option<Nanos> {
        let steps = self.steps_past(limit)?;
        let at = match self.state {
            ControllerState::Normal => return None,
            ControllerState::Cut => {
                let interval = duration_nanos(self.params.restore_interval);
                self.cut_end_at(calm)
                    .saturating_add(steps.saturating_mul(interval))
            }
            ControllerState::Recovering => {
                self.step_at(steps.max(self.limit_steps().saturating_add(1)))
            }
        };
        Some(Nanos::new(at))
    }

    /// When a cut whose calm begins at `calm` (`None`: never) ends, ns: when its hold
    /// of that calm, or else `max_cut`, ends, not before the controller is armed.
    fn cut_end_at(&self, calm: Option<Nanos>) -> u64 {
        let max_cut = self.entered_at + self.params.max_cut;
        let end = calm.map_or(max_cut, |calm| self.hold_done(calm).min(max_cut));
        end.max(self.armed_at).as_u64()
    }

    /// When a restore's step `k` is due, ns, counted from `entered_at` (saturating).
    fn step_at(&self, k: u64) -> u64 {
        let interval = duration_nanos(self.params.restore_interval).max(1);
        self.entered_at
            .as_u64()
            .saturating_add(k.saturating_mul(interval))
    }

    /// The fewest restore steps after which the limit is above `limit`: the first
    /// whose sum of steps passes it, or the one that reaches the base limit, whichever
    /// comes first (a step too small to move the sum in floating point never passes
    /// it, but the count to base saturates). `None` if the base limit is not above
    /// `limit`. A bounded number of operations, whatever the parameters.
    fn steps_past(&self, limit: f64) -> Option<u64> {
        let p = &self.params;
        // NaN passes neither: no raise past a limit that is not a number.
        if p.base_limit_rps.partial_cmp(&limit) != Some(std::cmp::Ordering::Greater) {
            return None;
        }
        let to_base = self.steps_to_base().max(1);
        if p.restore_step_rps.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
            return Some(to_base);
        }
        let past = |k: u64| p.cut_limit_rps + k as f64 * p.restore_step_rps > limit;
        // The quotient, then up to two steps either way for its rounding: a limit the
        // restore reached, `cut + j × step`, is passed at step j + 1, and its quotient
        // may read just under j (60 + 19.648832001695304 over that step reads
        // 0.9999999999999997), two steps short. The `as` cast saturates a quotient too
        // large for a count.
        let mut k = ((limit - p.cut_limit_rps) / p.restore_step_rps)
            .floor()
            .max(0.0) as u64;
        for _ in 0..2 {
            if k > 0 && past(k - 1) {
                k -= 1;
            }
        }
        for _ in 0..2 {
            if !past(k) {
                k = k.saturating_add(1);
            }
        }
        if !past(k) {
            return Some(to_base);
        }
        Some(k.clamp(1, to_base))
    }

    /// Observes one completed slot. Transitions are passed to `on_transition` in order.
    pub fn observe(&mut self, s: SampleAt, mut on_transition: impl FnMut(Transition)) {
        let p = &self.params;
        let roc = s.sample.roc_in(p.roc_mode, p.min_rps);
        self.last_roc = roc;
        self.last_reading = (s.sample.rate_prev_rps, s.sample.roc);
        let now = s.at;
        if now < self.armed_at {
            // Disarmed, ROC decides nothing; a restore in progress keeps its schedule,
            // which ROC does not decide either. A cut's calm counts from the arming,
            // and must hold throughout: a calm begun before the controller was armed
            // again ends at a reading that is not calm, armed or not.
            match self.state {
                ControllerState::Recovering => self.restore(now, roc, &mut on_transition),
                ControllerState::Cut if roc < p.safe_roc => {}
                ControllerState::Cut => self.safe_since = None,
                ControllerState::Normal => {}
            }
            return;
        }
        let dwelt = now.saturating_since(self.entered_at) >= p.min_dwell;
        let may_cut = roc > p.danger_roc
            && s.sample.rate_recent_rps >= p.min_rps
            && s.sample.n_recent >= p.min_samples;
        match self.state {
            ControllerState::Normal | ControllerState::Recovering if may_cut && dwelt => {
                self.enter(ControllerState::Cut, now, roc, &mut on_transition);
                return;
            }
            ControllerState::Normal | ControllerState::Recovering => {}
            ControllerState::Cut => {
                if roc < p.safe_roc {
                    self.safe_since.get_or_insert(now);
                } else {
                    self.safe_since = None;
                }
                let start = self.cut_end();
                if start <= now {
                    self.enter(ControllerState::Recovering, start, roc, &mut on_transition);
                }
            }
        }
        if self.state == ControllerState::Recovering {
            self.restore(now, roc, &mut on_transition);
        }
    }

    /// In `Recovering`: the limit the restore schedule has reached at `now`, and
    /// `Normal` when it is the base limit, dated when its last step was due.
    fn restore(&mut self, now: Nanos, roc: f64, on_transition: &mut impl FnMut(Transition)) {
        let before = self.limit_rps;
        self.limit_rps = self.recovering_limit(now);
        if self.limit_rps != before {
            self.limit_since = self.step_time().max(self.limit_since);
        }
        if self.limit_rps >= self.params.base_limit_rps {
            let steps = self.steps_to_base();
            let interval = duration_nanos(self.params.restore_interval);
            let at = Nanos::new(
                self.entered_at
                    .as_u64()
                    .saturating_add(steps.saturating_mul(interval)),
            );
            self.enter(ControllerState::Normal, at, roc, on_transition);
        }
    }

    /// In `Cut`, when the cut ends by the clock alone, as the readings observed so far
    /// have it: its hold of calm done, or `max_cut`, whichever comes first, and not
    /// before the controller is armed. `None` in the other states. A caller that steps
    /// the controller once for many slots that read alike (a silence longer than the
    /// window) observes that reading at the slot where this falls too, before a change
    /// of parameters later in the silence, as stepping each slot would have.
    pub fn cut_ends_at(&self) -> Option<Nanos> {
        (self.state == ControllerState::Cut).then(|| self.cut_end())
    }

    /// Where a caller that steps the controller once for many slots that read alike
    /// (a silence longer than the window, each slot `slot_ns` long) must step it at an
    /// earlier slot too, as stepping each slot would have: the end of the first slot
    /// that ends after `after` (the last slot stepped) and before `until` (the one the
    /// silence ends in) and holds one of `edges` (a change of profile due then, a
    /// scheduled event's start or end), the time the controller is armed, or
    /// [`cut_ends_at`](Self::cut_ends_at). `None` if there is none. Looked for again
    /// after each such step, which may move the arming and the cut's end.
    pub fn next_stop(
        &self,
        edges: impl IntoIterator<Item = Nanos>,
        after: Nanos,
        until: Nanos,
        slot_ns: u64,
    ) -> Option<Nanos> {
        edges
            .into_iter()
            .chain([self.armed_at])
            .chain(self.cut_ends_at())
            .filter(|&mark| after < mark)
            .map(|mark| Nanos::new(mark.as_u64().div_ceil(slot_ns).saturating_mul(slot_ns)))
            .filter(|&slot| slot < until)
            .min()
    }

    /// [`cut_ends_at`](Self::cut_ends_at) of a controller in `Cut`.
    fn cut_end(&self) -> Nanos {
        let by_hold = self.safe_since.map(|since| self.hold_done(since));
        let by_max = self.entered_at + self.params.max_cut;
        // Not dated before the controller was armed: a cut whose hold or max_cut
        // passed while it was not restores from then, one step at a time, not with the
        // steps it would have taken meanwhile.
        by_hold.map_or(by_max, |t| t.min(by_max)).max(self.armed_at)
    }

    /// The earliest time a calm stretch starting at `since` lets restoring begin.
    fn hold_done(&self, since: Nanos) -> Nanos {
        (since + self.params.hold).max(self.entered_at + self.params.min_dwell)
    }

    /// The restore steps that take the limit from cut to base: the fewest at which
    /// [`recovering_limit`](Self::recovering_limit)'s sum reaches it (the quotient
    /// alone can round the other way: 21 / 0.7 is just over 30, where 10 + 30 × 0.7 is
    /// 31 exactly).
    fn steps_to_base(&self) -> u64 {
        let p = &self.params;
        if p.restore_step_rps <= 0.0 {
            return u64::MAX;
        }
        let reaches = |k: u64| p.cut_limit_rps + k as f64 * p.restore_step_rps >= p.base_limit_rps;
        let mut k = ((p.base_limit_rps - p.cut_limit_rps) / p.restore_step_rps)
            .ceil()
            .max(0.0) as u64;
        if k > 0 && reaches(k - 1) {
            k -= 1;
        } else if !reaches(k) {
            k = k.saturating_add(1);
        }
        k
    }

    /// Restore steps taken so far in `Recovering`, derived from the limit.
    fn limit_steps(&self) -> u64 {
        let p = &self.params;
        if p.restore_step_rps <= 0.0 {
            return 0;
        }
        ((self.limit_rps - p.cut_limit_rps) / p.restore_step_rps)
            .round()
            .max(0.0) as u64
    }

    /// When the restore step that set the limit was due, in `Recovering` (the state's
    /// entry, in the others).
    fn step_time(&self) -> Nanos {
        if self.state != ControllerState::Recovering {
            return self.entered_at;
        }
        let interval = duration_nanos(self.params.restore_interval).max(1);
        let done = self.limit_steps().saturating_mul(interval);
        Nanos::new(self.entered_at.as_u64().saturating_add(done))
    }

    /// Where the restore schedule under the parameters in force starts for a
    /// restore that has reached the current limit, its last step due at `last_step`.
    /// A limit on the new schedule keeps its place and the pace of its steps, the next
    /// one a new interval after the last (or now, if that has passed); a limit between
    /// two of its steps takes the upper one now.
    fn restore_origin(&self, last_step: Nanos, now: Nanos) -> Nanos {
        let p = &self.params;
        let interval = duration_nanos(p.restore_interval).max(1);
        let (steps, last) = if p.restore_step_rps > 0.0 {
            let at = ((self.limit_rps - p.cut_limit_rps) / p.restore_step_rps).max(0.0);
            // The tolerance keeps a limit the new schedule passes through (120 from 60
            // in steps of 20, or of 0.7) from reading as between two steps.
            let steps = (at - 1e-9).ceil().max(0.0);
            if steps - at < 1e-9 {
                let last = last_step.max(Nanos::new(now.as_u64().saturating_sub(interval)));
                (steps as u64, last)
            } else {
                (steps as u64, now)
            }
        } else {
            (0, now)
        };
        Nanos::new(last.as_u64().saturating_sub(steps.saturating_mul(interval)))
    }

    fn recovering_limit(&self, now: Nanos) -> f64 {
        let p = &self.params;
        let interval = duration_nanos(p.restore_interval).max(1);
        let steps = now.saturating_since(self.entered_at).as_nanos() as u64 / interval;
        (p.cut_limit_rps + steps as f64 * p.restore_step_rps).min(p.base_limit_rps)
    }

    fn enter(
        &mut self,
        to: ControllerState,
        at: Nanos,
        roc: f64,
        on_transition: &mut impl FnMut(Transition),
    ) {
        let from = self.state;
        self.state = to;
        self.entered_at = at;
        self.safe_since = None;
        if to == ControllerState::Cut {
            self.cut_fraction = fraction_of_base(&self.params);
        }
        self.limit_rps = match to {
            ControllerState::Normal => self.params.base_limit_rps,
            ControllerState::Cut | ControllerState::Recovering => self.params.cut_limit_rps,
        };
        self.limit_since = at;
        on_transition(Transition {
            from,
            to,
            at,
            roc,
            limit_rps: self.limit_rps,
        });
    }
}

/// [`Controller`]'s last reading before its first sample.
const NO_READING: (f64, f64) = (f64::NAN, f64::NAN);

/// `params`' cut limit over its base limit, at most 1 (1 where the base is not
/// positive: a cut that takes nothing away).
fn fraction_of_base(params: &ControllerParams) -> f64 {
    if params.base_limit_rps > 0.0 {
        (params.cut_limit_rps / params.base_limit_rps).clamp(0.0, 1.0)
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::RocSample;

    fn sample(at_ms: u64, rate_prev: f64, rate_recent: f64) -> SampleAt {
        SampleAt {
            at: Nanos::from_millis(at_ms),
            sample: RocSample {
                n_prev: (rate_prev * 3.0) as u64,
                n_recent: (rate_recent * 3.0) as u64,
                rate_prev_rps: rate_prev,
                rate_recent_rps: rate_recent,
                roc: rate_recent - rate_prev,
            },
        }
    }

    fn controller() -> Controller {
        Controller::new(
            ControllerParams::default(),
            Nanos::ZERO,
            Duration::from_secs(6),
        )
    }

    /// Steps `c` every slot from `from_ms` to `to_ms`. Returns the transitions.
    fn run(
        c: &mut Controller,
        from_ms: u64,
        to_ms: u64,
        prev: f64,
        recent: f64,
    ) -> Vec<Transition> {
        run_checking(c, from_ms, to_ms, prev, recent, |_, _, _| {})
    }

    /// [`run`], calling `check` after each step with the controller, the step's time
    /// (ms) and the limit before it.
    fn run_checking(
        c: &mut Controller,
        from_ms: u64,
        to_ms: u64,
        prev: f64,
        recent: f64,
        mut check: impl FnMut(&Controller, u64, f64),
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        let mut t = from_ms;
        while t <= to_ms {
            let before = c.limit_rps();
            c.observe(sample(t, prev, recent), |tr| out.push(tr));
            check(c, t, before);
            t += 100;
        }
        out
    }

    #[test]
    fn no_action_before_the_first_full_window() {
        let mut c = controller();
        assert!(run(&mut c, 100, 5900, 40.0, 600.0).is_empty());
        let t = run(&mut c, 6000, 6000, 40.0, 600.0);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].to, ControllerState::Cut);
        assert_eq!(c.limit_rps(), 60.0);
    }

    #[test]
    fn cut_hold_restore_step_by_step_then_normal() {
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        assert_eq!(c.state(), ControllerState::Cut);
        // Calm from 12 s: hold of 2 s ends at 14 s.
        run(&mut c, 10_100, 11_900, 500.0, 560.0);
        assert_eq!(c.state(), ControllerState::Cut);
        let t = run(&mut c, 12_000, 13_900, 600.0, 600.0);
        assert!(t.is_empty());
        let t = run(&mut c, 14_000, 14_000, 600.0, 600.0);
        assert_eq!(t[0].to, ControllerState::Recovering);
        assert_eq!(t[0].at, Nanos::from_secs(14));
        assert_eq!(c.limit_rps(), 60.0);
        run(&mut c, 14_100, 15_000, 600.0, 600.0);
        assert_eq!(c.limit_rps(), 80.0);
        run(&mut c, 15_100, 17_500, 600.0, 600.0);
        assert_eq!(c.limit_rps(), 120.0);
        // 7 steps of 20 from 60: base 200 at 14 s + 7 s.
        let t = run(&mut c, 17_600, 21_000, 600.0, 600.0);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].to, ControllerState::Normal);
        assert_eq!(t[0].at, Nanos::from_secs(21));
        assert_eq!(c.limit_rps(), 200.0);
    }

    /// The fraction of base a cut was made at is taken when it is made: a change of
    /// parameters during the cut or its restore does not move it, and a cut made
    /// again under the new ones takes theirs.
    #[test]
    fn the_cut_fraction_is_the_cuts_own() {
        let mut c = controller();
        assert_eq!(c.cut_fraction(), 0.3);
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        assert_eq!((c.state(), c.cut_fraction()), (ControllerState::Cut, 0.3));
        let mut changed = c.params().clone();
        changed.base_limit_rps = 100.0;
        changed.cut_limit_rps = 50.0;
        c.set_params(changed, Nanos::from_millis(10_050), |_| {});
        assert_eq!((c.limit_rps(), c.cut_fraction()), (50.0, 0.3));
        run(&mut c, 10_100, 13_000, 100.0, 100.0);
        assert_eq!(c.state(), ControllerState::Recovering);
        assert_eq!(c.cut_fraction(), 0.3);
        let t = run(&mut c, 13_100, 14_000, 40.0, 600.0);
        assert_eq!(t.last().map(|t| t.to), Some(ControllerState::Cut));
        assert_eq!(c.cut_fraction(), 0.5);
    }

    #[test]
    fn an_unsafe_sample_restarts_the_hold() {
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 11_500, 100.0, 100.0);
        run(&mut c, 11_600, 11_600, 100.0, 150.0); // roc 50: neither safe nor danger
        run(&mut c, 11_700, 13_600, 100.0, 100.0);
        assert_eq!(c.state(), ControllerState::Cut);
        run(&mut c, 13_700, 13_700, 100.0, 100.0);
        assert_eq!(c.state(), ControllerState::Recovering);
    }

    #[test]
    fn danger_while_recovering_cuts_again() {
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 13_000, 100.0, 100.0);
        assert_eq!(c.state(), ControllerState::Recovering);
        let t = run(&mut c, 13_100, 13_100, 100.0, 400.0);
        assert_eq!(t[0].from, ControllerState::Recovering);
        assert_eq!(t[0].to, ControllerState::Cut);
        assert_eq!(c.limit_rps(), 60.0);
    }

    #[test]
    fn guards_block_cuts_on_quiet_or_thin_demand() {
        let mut p = ControllerParams {
            danger_roc: 2.0,
            safe_roc: 1.0,
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p.clone(), Nanos::ZERO, Duration::from_secs(6));
        run(&mut c, 6_000, 20_000, 1.0, 8.0); // roc 7 > 2, but 8 req/s < min_rps 10
        assert_eq!(c.state(), ControllerState::Normal);
        p.min_rps = 1.0;
        p.min_samples = 100; // 8 req/s × 3 s = 24 arrivals < 100
        let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
        run(&mut c, 6_000, 20_000, 1.0, 8.0);
        assert_eq!(c.state(), ControllerState::Normal);
    }

    /// The thresholds as the README states them: a cut above `danger_roc`, not at it;
    /// calm below `safe_roc`, not at it; the guards let a cut through at `min_rps` and
    /// `min_samples` exactly. (The `sample` helper counts 3 s of each half's rate.)
    #[test]
    fn thresholds_are_strict_and_guards_inclusive() {
        let mut c = controller();
        // roc 80 = danger_roc: no cut; 80.5: a cut.
        run(&mut c, 6_000, 9_000, 100.0, 180.0);
        assert_eq!(c.state(), ControllerState::Normal);
        run(&mut c, 9_100, 9_100, 100.0, 180.5);
        assert_eq!(c.state(), ControllerState::Cut);
        // roc 20 = safe_roc is not calm: the cut holds to max_cut (60 s) less a step.
        run(&mut c, 9_200, 69_000, 100.0, 120.0);
        assert_eq!(c.state(), ControllerState::Cut);
        run(&mut c, 69_100, 69_100, 100.0, 120.0);
        assert_eq!(c.state(), ControllerState::Recovering);

        // Demand of min_rps (10 req/s) exactly, and min_samples (30 of them) exactly.
        let p = ControllerParams {
            danger_roc: 2.0,
            safe_roc: 1.0,
            min_samples: 30,
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
        run(&mut c, 6_000, 6_000, 1.0, 10.0);
        assert_eq!(c.state(), ControllerState::Cut);
    }

    #[test]
    fn min_dwell_delays_leaving_a_state() {
        let p = ControllerParams {
            min_dwell: Duration::from_secs(5),
            hold: Duration::from_millis(500),
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 14_900, 100.0, 100.0);
        assert_eq!(c.state(), ControllerState::Cut);
        let t = run(&mut c, 15_000, 15_000, 100.0, 100.0);
        assert_eq!(t[0].to, ControllerState::Recovering);
        assert_eq!(t[0].at, Nanos::from_secs(15));
    }

    #[test]
    fn min_dwell_holds_back_what_roc_decides_not_max_cut_or_the_last_step() {
        // min_dwell 5 s: a cut waits 5 s after the controller entered Normal, and
        // restoring after calm waits 5 s in Cut; but max_cut (3 s here) ends the cut
        // when it says, and Recovering ends as the limit reaches base, 2 s in.
        let p = ControllerParams {
            min_dwell: Duration::from_secs(5),
            max_cut: Duration::from_secs(3),
            hold: Duration::from_millis(500),
            restore_step_rps: 70.0,
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
        assert!(run(&mut c, 4_900, 4_900, 40.0, 600.0).is_empty());
        let t = run(&mut c, 6_000, 6_000, 40.0, 600.0);
        assert_eq!(t[0].to, ControllerState::Cut);
        let t = run(&mut c, 6_100, 11_000, 100.0, 150.0);
        assert_eq!(t[0].to, ControllerState::Recovering);
        assert_eq!(t[0].at, Nanos::from_secs(9), "max_cut, before min_dwell");
        assert_eq!(t[1].to, ControllerState::Normal);
        assert_eq!(t[1].at, Nanos::from_secs(11), "at base, before min_dwell");
    }

    #[test]
    fn max_cut_starts_restoring_regardless() {
        let p = ControllerParams {
            max_cut: Duration::from_secs(10),
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 19_900, 100.0, 150.0); // roc 50, never safe
        assert_eq!(c.state(), ControllerState::Cut);
        let t = run(&mut c, 20_000, 20_000, 100.0, 150.0);
        assert_eq!(t[0].to, ControllerState::Recovering);
    }

    #[test]
    fn one_late_sample_lands_where_per_slot_stepping_would() {
        let mut stepped = controller();
        run(&mut stepped, 10_000, 10_000, 40.0, 600.0);
        run(&mut stepped, 10_100, 40_000, 0.0, 0.0);
        let mut jumped = controller();
        run(&mut jumped, 10_000, 10_000, 40.0, 600.0);
        let mut seen = Vec::new();
        jumped.observe(sample(10_100, 0.0, 0.0), |t| seen.push(t));
        jumped.observe(sample(40_000, 0.0, 0.0), |t| seen.push(t));
        assert_eq!(jumped.state(), stepped.state());
        assert_eq!(jumped.limit_rps(), stepped.limit_rps());
        let times: Vec<Nanos> = seen.iter().map(|t| t.at).collect();
        // Calm from 10.1 s: recovering at 12.1 s, normal 7 steps later.
        assert_eq!(
            times,
            vec![Nanos::from_millis(12_100), Nanos::from_millis(19_100)]
        );
    }

    #[test]
    fn the_next_raise_of_a_cut_not_yet_calm_is_its_earliest_calm() {
        let window = Duration::from_secs(6);
        let at = |c: &Controller, now_ms| c.next_raise_at(Nanos::from_millis(now_ms), window);
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        assert_eq!(c.state(), ControllerState::Cut);
        // Cut at 10 s: the spike fills the window at 16 s, then a 2 s hold and a 1 s
        // restore interval (not max_cut's 70 s).
        assert_eq!(at(&c, 10_000), Some(Nanos::from_secs(19)));
        // Still climbing past the window: calm now, at the earliest.
        run(&mut c, 10_100, 30_000, 40.0, 600.0);
        assert_eq!(at(&c, 30_000), Some(Nanos::from_secs(33)));
        // Never past max_cut's end (60 s after the cut), plus the interval.
        run(&mut c, 30_100, 69_000, 40.0, 600.0);
        assert_eq!(at(&c, 69_000), Some(Nanos::from_secs(71)));

        // Calm before the window is full: the hold counts from the first calm sample.
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 12_000, 600.0, 600.0);
        assert_eq!(c.state(), ControllerState::Cut);
        assert_eq!(at(&c, 12_000), Some(Nanos::from_millis(13_100)));
    }

    /// [`Controller::next_raise_held`] observes [`HELD_READINGS`] readings at most: a
    /// cut at 10 s told from 5,000 readings a millisecond apart (a window of 5,000
    /// slots), calm from the 3,000th, takes the calm at the last, 15 s (its raise 18 s,
    /// after the 2 s hold and the 1 s interval), and takes 1,025 of them (the 1,025th
    /// only to see that more follow); the same readings 10 ms apart, calm from the
    /// 50th (10.5 s), raise the limit at the 350th, 13.5 s, to the reading. It observed
    /// every reading, 1.26 ms a step under a window of 100,000 slots
    /// (`benches/check.rs`, `retry_after/step/100000_slots`).
    #[test]
    fn the_held_readings_observed_are_capped() {
        for (gap_ms, calm_from, raise_ms, taken) in
            [(1, 3_000, 18_000, 1_025), (10, 50, 13_500, 350)]
        {
            let mut c = controller();
            run(&mut c, 10_000, 10_000, 40.0, 600.0);
            assert_eq!(c.state(), ControllerState::Cut);
            let pulled = std::cell::Cell::new(0usize);
            let readings = (1..=5_000u64)
                .map(|k| {
                    let recent = if k < calm_from { 600.0 } else { 40.0 };
                    sample(10_000 + k * gap_ms, 40.0, recent)
                })
                .inspect(|_| pulled.set(pulled.get() + 1));
            let settled = Nanos::from_millis(10_000 + 5_000 * gap_ms);
            assert_eq!(
                (c.next_raise_held(readings, settled), pulled.get()),
                (Some(Nanos::from_millis(raise_ms)), taken),
                "{gap_ms} ms apart"
            );
        }
    }

    /// Under a `safe_roc` of 0 or below, a spike that holds its level never reads
    /// calm (its ROC falls to 0, not under it): a cut whose calm is not known ends at
    /// `max_cut`, as [`Schedule::next_raise`](crate::engine::Schedule::next_raise)'s
    /// walk has it. It took the calm at the window's end, as under a positive one.
    #[test]
    fn the_next_raise_of_a_cut_never_calm_under_a_safe_roc_of_0_is_max_cut() {
        let window = Duration::from_secs(6);
        for safe_roc in [0.0, -5.0] {
            let p = ControllerParams {
                safe_roc,
                ..ControllerParams::default()
            };
            let mut c = Controller::new(p, Nanos::ZERO, window);
            run(&mut c, 10_000, 10_000, 40.0, 600.0);
            assert_eq!(c.state(), ControllerState::Cut);
            // Cut at 10 s, max_cut 60 s, a 1 s restore interval.
            assert_eq!(
                c.next_raise_at(Nanos::from_secs(10), window),
                Some(Nanos::from_secs(71))
            );
            // The held spike's readings: ROC 0 from 16 s on, never under 0.
            run(&mut c, 10_100, 69_900, 600.0, 600.0);
            assert_eq!(c.state(), ControllerState::Cut);
            run(&mut c, 70_000, 70_900, 600.0, 600.0);
            assert_eq!(
                (c.state(), c.limit_rps()),
                (ControllerState::Recovering, 60.0)
            );
            run(&mut c, 71_000, 71_000, 600.0, 600.0);
            assert_eq!(
                (c.state(), c.limit_rps()),
                (ControllerState::Recovering, 80.0)
            );
        }
    }

    /// A restore that has reached its first step, the limit the sum `cut + step`,
    /// rises next at its second step, past that sum: with a step of
    /// 19.648832001695304 the quotient `(limit - cut) / step` reads 0.9999999999999997,
    /// whose floor's next step is the limit itself, not past it. Told from no readings
    /// more ([`Controller::next_raise_held`]), the raise was the step that reaches the
    /// base, the eighth (18.5 s, not 13.7 s).
    #[test]
    fn the_next_raise_of_a_restore_at_a_step_whose_quotient_rounds_down_is_the_next_step() {
        let step = 19.648832001695304;
        let p = ControllerParams {
            restore_step_rps: step,
            restore_interval: Duration::from_millis(800),
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        assert_eq!(c.state(), ControllerState::Cut);
        // Calm from 10.1 s: the 2 s hold ends at 12.1 s, the first step is at 12.9 s.
        run(&mut c, 10_100, 12_900, 0.0, 0.0);
        assert_eq!(
            (c.state(), c.limit_rps()),
            (ControllerState::Recovering, 60.0 + step)
        );
        assert!((c.limit_rps() - 60.0) / step < 1.0);
        let told = c.next_raise_held([], Nanos::from_millis(12_900));
        assert_eq!(told, Some(Nanos::from_millis(13_700)));
        run(&mut c, 13_000, 13_600, 0.0, 0.0);
        assert_eq!(c.limit_rps(), 60.0 + step);
        run(&mut c, 13_700, 13_700, 0.0, 0.0);
        assert!(c.limit_rps() > 60.0 + step);
    }

    #[test]
    fn the_next_raise_waits_for_the_controller_to_be_armed_again() {
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 11_000, 0.0, 0.0);
        // Calm since 10.1 s: the limit would rise at 12.1 s + 1 s. A reload at 11 s
        // suspends the controller until 17 s: nothing rises before then.
        let (now, window) = (Nanos::from_secs(11), Duration::from_secs(6));
        assert_eq!(
            c.next_raise_at(now, window),
            Some(Nanos::from_millis(13_100))
        );
        c.rearm(now, window);
        let at = c.next_raise_at(now, window).unwrap();
        assert!(at >= Nanos::from_secs(17), "{at}");
        run(&mut c, 11_100, at.as_u64() / 1_000_000 - 100, 0.0, 0.0);
        assert_eq!(c.limit_rps(), 60.0);
        run(
            &mut c,
            at.as_u64() / 1_000_000,
            at.as_u64() / 1_000_000,
            0.0,
            0.0,
        );
        assert!(c.limit_rps() > 60.0);
    }

    /// Steps `c` every slot from `from_ms` to `to_ms` and checks that the limit never
    /// rises by more than one restore step from one slot to the next (no silence, so
    /// no catch-up): the restore keeps its pace. Returns the transitions.
    fn paced(
        c: &mut Controller,
        from_ms: u64,
        to_ms: u64,
        prev: f64,
        recent: f64,
    ) -> Vec<Transition> {
        let step = c.params().restore_step_rps;
        run_checking(c, from_ms, to_ms, prev, recent, |c, t, before| {
            assert!(
                c.limit_rps() <= before + step,
                "at {t} ms the limit jumped from {before} to {}",
                c.limit_rps()
            );
        })
    }

    #[test]
    fn a_rearm_mid_recovery_keeps_the_restore_pace() {
        // Cut at 10 s, calm from 10.1 s: recovering from 12.1 s, a step each second.
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        paced(&mut c, 10_100, 14_400, 100.0, 100.0);
        assert_eq!(c.state(), ControllerState::Recovering);
        assert_eq!(c.limit_rps(), 100.0);
        // A reload at 14.5 s (new thresholds) suspends ROC decisions until 20.5 s.
        c.rearm(Nanos::from_millis(14_500), Duration::from_secs(6));
        // The restore schedule goes on meanwhile: no freeze, then no jump.
        paced(&mut c, 14_500, 16_100, 100.0, 100.0);
        assert_eq!(c.limit_rps(), 140.0);
        // Nor does a spike while disarmed cut again.
        paced(&mut c, 16_200, 16_200, 100.0, 600.0);
        assert_eq!(c.state(), ControllerState::Recovering);
        let seen = paced(&mut c, 16_300, 25_000, 100.0, 100.0);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].to, ControllerState::Normal);
        assert_eq!(seen[0].at, Nanos::from_millis(19_100));
    }

    #[test]
    fn a_cut_that_ends_while_disarmed_restores_from_when_it_is_armed() {
        let window = Duration::from_secs(6);
        // max_cut of 3 s ends a cut at 13 s, during a rearm from 12 s to 18 s.
        let p = ControllerParams {
            max_cut: Duration::from_secs(3),
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p, Nanos::ZERO, window);
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        paced(&mut c, 10_100, 11_900, 100.0, 150.0); // roc 50: never calm
        c.rearm(Nanos::from_secs(12), window);
        paced(&mut c, 12_000, 17_900, 100.0, 150.0);
        assert_eq!(c.state(), ControllerState::Cut);
        assert_eq!(
            c.next_raise_at(Nanos::from_millis(17_900), window),
            Some(Nanos::from_secs(19))
        );
        // Armed at 18 s: restoring starts then, from the cut limit, not as if it had
        // started at 13 s (five steps at once).
        let seen = paced(&mut c, 18_000, 18_000, 100.0, 150.0);
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].to, ControllerState::Recovering);
        assert_eq!(seen[0].at, Nanos::from_secs(18));
        assert_eq!(c.limit_rps(), 60.0);
        paced(&mut c, 18_100, 19_000, 100.0, 150.0);
        assert_eq!(c.limit_rps(), 80.0);

        // The same for a hold of calm that was done before the controller was armed.
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        paced(&mut c, 10_100, 11_000, 0.0, 0.0);
        c.rearm(Nanos::from_secs(11), window);
        paced(&mut c, 11_000, 16_900, 0.0, 0.0);
        assert_eq!(c.state(), ControllerState::Cut);
        paced(&mut c, 17_000, 18_000, 0.0, 0.0);
        assert_eq!(c.state(), ControllerState::Recovering);
        assert_eq!(c.entered_at(), Nanos::from_secs(17));
        assert_eq!(c.limit_rps(), 80.0);
    }

    /// A cut's calm must hold throughout `hold`: a calm begun before the controller
    /// was armed again ends at a reading that is not calm while it is disarmed. (It
    /// survived 6 s of ROC 600 while disarmed, and the first calm reading once armed
    /// ended the cut at once.)
    #[test]
    fn a_surge_while_disarmed_ends_a_calm_begun_before() {
        let window = Duration::from_secs(6);
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 10_900, 300.0, 300.0); // calm from 10.1 s
        c.rearm(Nanos::from_secs(11), window);
        run(&mut c, 11_000, 16_900, 300.0, 900.0); // a second surge, disarmed
        let t = run(&mut c, 17_000, 17_000, 300.0, 300.0);
        assert_eq!(c.state(), ControllerState::Cut, "{t:?}");
        // The calm counts from its first reading once armed: restoring begins a
        // hold after it.
        let restores = 17_000 + c.params().hold.as_millis() as u64;
        run(&mut c, 17_100, restores - 100, 300.0, 300.0);
        assert_eq!(c.state(), ControllerState::Cut);
        run(&mut c, restores, restores, 300.0, 300.0);
        assert_eq!(c.state(), ControllerState::Recovering);
        assert_eq!(c.entered_at(), Nanos::from_millis(restores));
    }

    #[test]
    fn event_params_apply_to_the_current_state() {
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        let sale = ControllerParams {
            base_limit_rps: 400.0,
            cut_limit_rps: 150.0,
            ..ControllerParams::default()
        };
        c.set_params(sale, Nanos::from_millis(10_050), |_| {});
        assert_eq!(c.state(), ControllerState::Cut);
        assert_eq!(c.limit_rps(), 150.0);
        assert!((c.progress() - 0.0).abs() < 1e-12);
    }

    #[test]
    fn relative_mode_uses_the_ratio() {
        let p = ControllerParams {
            roc_mode: RocMode::Relative,
            danger_roc: 1.0,
            safe_roc: 0.25,
            ..ControllerParams::default()
        };
        let mut c = Controller::new(p, Nanos::ZERO, Duration::from_secs(6));
        run(&mut c, 6_000, 6_000, 30.0, 55.0); // +83%
        assert_eq!(c.state(), ControllerState::Normal);
        run(&mut c, 6_100, 6_100, 30.0, 65.0); // +117%
        assert_eq!(c.state(), ControllerState::Cut);
        assert!((c.last_roc() - 35.0 / 30.0).abs() < 1e-9);
    }

    /// The end of a recovery is dated by the step that reached base as the limit is
    /// summed (10 + 30 × 0.7 is 31), not by the quotient (21 / 0.7 is just over 30): it
    /// was dated a step after the sample that reached base, and a spike 1.4 s later was
    /// not cut (its `min_dwell` counted from that later instant).
    #[test]
    fn the_end_of_a_recovery_is_not_dated_after_the_sample_that_reached_base() {
        let p = ControllerParams {
            base_limit_rps: 31.0,
            cut_limit_rps: 10.0,
            restore_step_rps: 0.7,
            danger_roc: 8.0,
            safe_roc: 2.0,
            min_rps: 1.0,
            min_samples: 1,
            ..ControllerParams::default()
        };
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
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 40_000, 100.0, 150.0); // roc 50: neither calm nor danger
        assert_eq!((c.state(), c.limit_rps()), (ControllerState::Cut, 60.0));
        let p = ControllerParams {
            max_cut: Duration::from_secs(10),
            ..ControllerParams::default()
        };
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

    /// Steps the cut of [`cut_hold_restore_step_by_step_then_normal`] to 17.5 s: in
    /// `Recovering` since 14 s, at 120 req/s (three steps of 20 from 60).
    fn recovering_at_120() -> Controller {
        let mut c = controller();
        run(&mut c, 10_000, 10_000, 40.0, 600.0);
        run(&mut c, 10_100, 11_900, 500.0, 560.0);
        run(&mut c, 12_000, 17_500, 600.0, 600.0);
        assert_eq!(
            (c.state(), c.limit_rps()),
            (ControllerState::Recovering, 120.0)
        );
        c
    }

    /// [`recovering_at_120`] with `p` set on it at `at`, and the transitions the change
    /// reported. The tests of a change mid-recovery start from it.
    fn recovering_at_120_changed(p: ControllerParams, at: Nanos) -> (Controller, Vec<Transition>) {
        let mut c = recovering_at_120();
        let mut seen = Vec::new();
        c.set_params(p, at, |t| seen.push(t));
        (c, seen)
    }

    /// A slower restore set mid-recovery goes on from the limit reached: the steps
    /// taken were recomputed under the new step, and the limit fell from 120 to 75
    /// with no cut.
    #[test]
    fn a_smaller_restore_step_mid_recovery_does_not_lower_the_limit() {
        let p = ControllerParams {
            restore_step_rps: 5.0,
            ..ControllerParams::default()
        };
        let mut c = recovering_at_120_changed(p, Nanos::from_millis(17_550)).0;
        assert_eq!(c.limit_rps(), 120.0);
        // The last step was due at 17 s: the next, of 5, at 18 s.
        run(&mut c, 17_600, 17_900, 600.0, 600.0);
        assert_eq!(c.limit_rps(), 120.0);
        run(&mut c, 18_000, 18_000, 600.0, 600.0);
        assert_eq!(c.limit_rps(), 125.0);
        assert_eq!(
            c.next_raise_at(Nanos::from_secs(18), Duration::from_secs(6)),
            Some(Nanos::from_secs(19))
        );
    }

    /// A faster restore set mid-recovery goes on one step at a time from the limit
    /// reached: a step of 100 leapt from 120 to base at once, and a 100 ms interval
    /// from 120 to base (35 steps since 14 s).
    #[test]
    fn a_faster_restore_mid_recovery_goes_on_one_step_at_a_time() {
        let bigger = ControllerParams {
            restore_step_rps: 100.0,
            ..ControllerParams::default()
        };
        let sooner = ControllerParams {
            restore_interval: Duration::from_millis(100),
            ..ControllerParams::default()
        };
        // 120 is between 60 and 160 on the schedule of 100: 160 at the change, then
        // base a second later. 120 is on the schedule of 20 every 100 ms, whose
        // interval has passed since the step of 17 s: a step at the change, then one
        // every 100 ms from it.
        let mut after = vec![160.0; 10];
        after.push(200.0);
        let cases = [
            (bigger, 160.0, after),
            (
                sooner,
                140.0,
                [140.0, 160.0, 180.0, 200.0]
                    .into_iter()
                    .chain([200.0; 7])
                    .collect(),
            ),
        ];
        for (p, at_change, expected) in cases {
            let (mut c, seen) = recovering_at_120_changed(p.clone(), Nanos::from_millis(17_550));
            assert_eq!(c.limit_rps(), at_change, "{p:?}");
            assert!(seen.is_empty());
            let limits: Vec<f64> = (0..11)
                .map(|i| {
                    run(&mut c, 17_600 + 100 * i, 17_600 + 100 * i, 600.0, 600.0);
                    c.limit_rps()
                })
                .collect();
            assert_eq!(limits, expected, "{p:?}");
            assert_eq!(c.state(), ControllerState::Normal);
        }
    }

    /// A cut limit raised mid-recovery above the limit reached restores from it.
    #[test]
    fn a_cut_limit_raised_past_a_recovery_restores_from_it() {
        let p = ControllerParams {
            cut_limit_rps: 150.0,
            ..ControllerParams::default()
        };
        let mut c = recovering_at_120_changed(p, Nanos::from_millis(17_550)).0;
        assert_eq!(c.limit_rps(), 150.0);
        run(&mut c, 17_600, 18_000, 600.0, 600.0);
        assert_eq!(c.limit_rps(), 170.0);
    }

    /// A change applied late, after a silence, to a restore whose old schedule reached
    /// base meanwhile: it lands where stepping every slot would have (it went on from
    /// the limit of the last step observed, 120, at the new step). (helper-124)
    #[test]
    fn a_change_after_a_silence_steps_the_restore_under_the_old_schedule_first() {
        let p = ControllerParams {
            restore_step_rps: 5.0,
            ..ControllerParams::default()
        };
        let (c, seen) = recovering_at_120_changed(p, Nanos::from_secs(30));
        assert_eq!((c.state(), c.limit_rps()), (ControllerState::Normal, 200.0));
        assert_eq!(seen[0].at, Nanos::from_secs(21));
    }

    /// A shared controller continued under a schedule other than the one that stepped
    /// it goes on from the limit it reached (it was recomputed from the restore's start:
    /// 120 fell to 75). (helper-124)
    #[test]
    fn a_restore_continued_under_another_schedule_keeps_its_limit() {
        let m = recovering_at_120().memory();
        let p = ControllerParams {
            restore_step_rps: 5.0,
            ..ControllerParams::default()
        };
        let mut c = Controller::from_memory(p, m, Nanos::from_millis(17_500));
        assert_eq!(c.limit_rps(), 120.0);
        run(&mut c, 17_600, 18_400, 600.0, 600.0);
        assert_eq!(c.limit_rps(), 120.0);
        run(&mut c, 18_500, 18_500, 600.0, 600.0);
        assert_eq!(c.limit_rps(), 125.0);
        // Under its own schedule, it is continued as it was.
        let mut same =
            Controller::from_memory(ControllerParams::default(), m, Nanos::from_millis(17_500));
        assert_eq!(same.entered_at(), Nanos::from_secs(14));
        run(&mut same, 17_600, 18_000, 600.0, 600.0);
        assert_eq!(same.limit_rps(), 140.0);
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
}
