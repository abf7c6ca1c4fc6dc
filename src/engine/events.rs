//! Scheduled events on the engine's clock: where a configured event's wall-clock
//! window lies ([`span`]), which profile, an event's or the route's own, is in
//! force at a given moment ([`follow_events`]), the route's [`Schedule`] of them
//! that a shared store steps its controller under, built again after each change, and
//! when a cut route's limit next rises through the events due before it
//! ([`raise_through`]).

use super::{RouteState, ScheduledEvent};
use crate::clock::{duration_nanos, Nanos};
use crate::config::Event;
use crate::controller::{Controller, ControllerParams, ControllerState, Transition, HELD_READINGS};
use crate::window::{RocSample, SampleAt, WindowSpec};
use std::time::{Duration, SystemTime};

impl ScheduledEvent {
    /// Places an event whose profile was written over the route's parameters
    /// `written_over` (a file's) on the engine's clock, where `now` is `wall_now`, its
    /// profile moved onto the route's own parameters in force, `own` (a runtime change
    /// kept through a reload; [`Event::profile_on`]). Both ends are placed from
    /// wall time, so an event that began before `now` keeps its real end (the clock
    /// cannot go below its origin); one that has already ended is placed at 0 for no
    /// time, never due, and kept so that the route's events stay where the file has
    /// them (`events[1]` in a message is the file's second).
    pub(super) fn place(
        e: &Event,
        written_over: &ControllerParams,
        own: &ControllerParams,
        now: Nanos,
        wall_now: SystemTime,
    ) -> Self {
        let (start, end) = span(e.start, e.duration, now, wall_now).unwrap_or_default();
        ScheduledEvent {
            name: e.name.clone(),
            start,
            end,
            params: e.profile_on(written_over, own),
            configured: (e.clone(), written_over.clone()),
            wall: (e.start, e.duration),
        }
    }

    /// The event's profile as configured, moved onto the route's own parameters `own`
    /// ([`Event::profile_on`]).
    pub(super) fn rebased(&self, own: &ControllerParams) -> ControllerParams {
        let (event, written_over) = &self.configured;
        event.profile_on(written_over, own)
    }

    /// Places the event again, where `now` is `wall_now`: one that the wall clock
    /// has passed is placed at 0 for no time, never due, until the wall clock is
    /// stepped back into it; one [`retired`](Self::retire) never again. Whether it
    /// moved.
    pub(super) fn align(&mut self, now: Nanos, wall_now: SystemTime) -> bool {
        let (start, duration) = self.wall;
        let placed = span(start, duration, now, wall_now).unwrap_or_default();
        let moved = placed != (self.start, self.end);
        (self.start, self.end) = placed;
        moved
    }

    /// Never places the event again: a runtime change was made beside it once it had
    /// ended, which its profile does not fit (a cut limit of its own above the route's
    /// new base, say), so the wall clock stepped back into it must not put it in
    /// force again.
    pub(super) fn retire(&mut self) {
        self.wall.1 = Duration::ZERO;
        (self.start, self.end) = (Nanos::ZERO, Nanos::ZERO);
    }
}

/// Whether `e` has ended at wall-clock `wall_now` (it is never in force again).
pub(super) fn has_ended(e: &Event, wall_now: SystemTime) -> bool {
    span(e.start, e.duration, Nanos::ZERO, wall_now).is_none()
}

/// Where an event of `duration` from wall-clock `start` lies on the engine's clock,
/// where `now` is `wall_now`: `None` if it has ended.
fn span(
    start: SystemTime,
    duration: Duration,
    now: Nanos,
    wall_now: SystemTime,
) -> Option<(Nanos, Nanos)> {
    // No file gives an event of no time: a retired one (`ScheduledEvent::retire`),
    // over wherever the wall clock stands.
    if duration.is_zero() {
        return None;
    }
    match start.duration_since(wall_now) {
        Ok(ahead) => Some((now + ahead, now + ahead + duration)),
        Err(past) => {
            let elapsed = past.duration();
            let left = duration.checked_sub(elapsed).filter(|d| !d.is_zero())?;
            Some((now - elapsed, now + left))
        }
    }
}

/// The [`Schedule`] of a route whose own parameters are `own` and whose events are
/// `events`.
pub(super) fn schedule_of(own: &ControllerParams, events: &[ScheduledEvent]) -> Schedule {
    Schedule {
        own: own.clone(),
        // An event never due (one that has ended, placed at 0 for no time) changes
        // nothing.
        events: spans(events)
            .filter(|(start, end, _)| start < end)
            .map(|(start, end, params)| (start, end, params.clone()))
            .collect(),
    }
}

impl RouteState {
    /// The controller parameters due at `at`: those of the scheduled event running
    /// then, or else the route's own (in force once a request or an upkeep has put
    /// them there: see [`follow_events`]).
    pub(super) fn params_due(&self, at: Nanos) -> &ControllerParams {
        due(spans(&self.events), at).map_or(&self.own, |(_, params)| params)
    }

    /// The `route_limit` of the event whose profile is in force (`active_event`), if
    /// it sets one: `None` for the route's own.
    pub(super) fn event_total(&self) -> Option<f64> {
        self.active_event
            .and_then(|i| self.events.get(i))
            .and_then(|e| e.configured.0.route_limit_rps)
    }

    /// Drops the route's [`Schedule`] after every change of its own parameters or its
    /// events (a reload, a runtime change or its withdrawal, an event placed again or
    /// retired), so that [`Engine::schedule`](super::Engine::schedule) builds the one
    /// in force at its next call, and hands it out without copying it until the next
    /// change.
    pub(super) fn reschedule(&mut self) {
        self.schedule = None;
    }

    /// When the controller's limit next rises above where it stands, as seen at
    /// `now` on a route whose window is `window`, its last completed slot ending at
    /// `stepped`, if its last slot's demand holds: [`Controller::next_raise_held`]
    /// from the readings the window then gives. On a route with events a copy of the
    /// controller is stepped through those readings as the engine will step it, the
    /// profile due at each slot's end put in force first, so that a spike that still
    /// reads above `danger_roc` where an edge moves the restore cuts again there; past
    /// them (or past [`HELD_READINGS`] of them, the calm then taken where the window
    /// holds the held level alone, as `next_raise_held` takes it) it is walked
    /// through the edges still ahead ([`raise_through`]). A route in `Normal` costs
    /// what [`Controller::next_raise_at`] does, one cut or recovering an observation a
    /// window slot, up to [`HELD_READINGS`].
    ///
    /// And when its progress between cut and base next rises above where it stands,
    /// which raises a tier's key limits (`tiers`: the route has tiers; else the
    /// first again): the same without events, under one profile; through an event's
    /// edge, one that raises the limit with its profile's higher cut limit leaves the
    /// progress at 0, and one that lowers the base may raise the progress alone.
    #[inline]
    pub(super) fn next_raise(
        &self,
        now: Nanos,
        stepped: Nanos,
        window: &WindowSpec,
        tiers: bool,
    ) -> (Option<Nanos>, Option<Nanos>) {
        held_raise(
            || spans(&self.events),
            &self.own,
            (self.active_event, &self.controller),
            self.ring.held(),
            (stepped, now),
            window,
            tiers,
        )
    }

    /// Puts the profile due at `at` in force (see [`follow_events`]), at the start,
    /// where the controller is in `Normal` and no transition can follow.
    pub(super) fn follow_events(&mut self, at: Nanos) {
        follow_events(
            &self.events,
            &mut self.active_event,
            &self.own,
            &mut self.controller,
            at,
            |_| {},
        );
    }
}

/// [`RouteState::next_raise`] of a route whose scheduled events' spans `spans` gives,
/// its own parameters `own`, its controller and the event whose profile is in force
/// in it (`None`: `own`), and `held` the window's readings at the ends of the slots
/// after `stepped` if the last slot's demand holds
/// ([`SlotRing::held`](crate::window::SlotRing::held)): what a shared store, which
/// has the window's completed slots where it steps the controller, tells too
/// ([`Schedule::next_raise_held`]).
fn held_raise<'a, S, I>(
    spans: S,
    own: &ControllerParams,
    (active, controller): (Option<usize>, &Controller),
    held: impl Iterator<Item = RocSample>,
    (stepped, now): (Nanos, Nanos),
    window: &WindowSpec,
    tiers: bool,
) -> (Option<Nanos>, Option<Nanos>)
where
    S: Fn() -> I,
    I: Iterator<Item = (Nanos, Nanos, &'a ControllerParams)>,
{
    let slot_ns = duration_nanos(window.slot());
    let readings = (1u64..).zip(held).map(|(k, sample)| SampleAt {
        at: Nanos::new(stepped.as_u64().saturating_add(k.saturating_mul(slot_ns))),
        sample,
    });
    let settled = Nanos::new(
        stepped
            .as_u64()
            .saturating_add(duration_nanos(window.window())),
    );
    if spans().next().is_none() || controller.state() == ControllerState::Normal {
        let held = controller.next_raise_held(readings, settled);
        return (held, held);
    }
    let limit = Past::Limit(controller.limit_rps());
    let progress = tiers.then(|| Past::Progress(controller.progress()));
    let mut c = controller.clone();
    let mut active = active;
    let (mut limit_at, mut progress_at) = (None, None);
    // The profile due is looked for at the first reading and where an edge has
    // passed since, not at each reading.
    let next_edge = |after: Nanos| {
        spans()
            .flat_map(|(start, end, _)| [start, end])
            .filter(|&at| at > after)
            .min()
    };
    let mut edge = Some(stepped);
    let mut observed = 0;
    for s in readings.take(HELD_READINGS + 1) {
        observed += 1;
        if observed > HELD_READINGS {
            break;
        }
        if edge.is_some_and(|edge| s.at >= edge) {
            let due = due(spans(), s.at);
            put_in_force(due, &mut active, own, &mut c, s.at, |_| {});
            edge = next_edge(s.at);
        }
        c.observe(s, |_| {});
        if limit_at.is_none() && limit.by(&c) {
            limit_at = Some(s.at);
        }
        if let Some(progress) = progress.filter(|_| progress_at.is_none()) {
            if progress.by(&c) {
                progress_at = Some(s.at);
            }
        }
        if limit_at.is_some() && (progress.is_none() || progress_at.is_some()) {
            break;
        }
    }
    // Past the readings observed: the calm they end in, or, cut short, the one the
    // held level surely reads once it fills the window (as `next_raise_held`).
    let cut_short = observed > HELD_READINGS;
    let from = if cut_short {
        Nanos::new(
            stepped
                .as_u64()
                .saturating_add(slot_ns.saturating_mul(HELD_READINGS as u64)),
        )
    } else {
        settled
    };
    let rest = |past: Past| {
        let calm = if cut_short {
            (c.params().safe_roc > 0.0).then_some(settled)
        } else {
            c.memory().safe_since
        };
        raise_through(
            &spans,
            own,
            active,
            &c,
            (past, c.raised_past(past.limit(&c), calm)),
            (from.min(settled), settled.max(now)),
            window,
        )
    };
    let limit_at = limit_at.or_else(|| rest(limit));
    let progress_at = match progress {
        Some(progress) => progress_at.or_else(|| rest(progress)),
        None => limit_at,
    };
    (limit_at, progress_at)
}

/// Puts the profile due at `at` in force: the scheduled event running then, or the
/// route's own parameters. Does nothing if that profile is already in force. A
/// transition the change makes is passed to `on_transition`.
pub(super) fn follow_events(
    events: &[ScheduledEvent],
    active: &mut Option<usize>,
    own: &ControllerParams,
    controller: &mut Controller,
    at: Nanos,
    on_transition: impl FnMut(Transition),
) {
    put_in_force(
        due(spans(events), at),
        active,
        own,
        controller,
        at,
        on_transition,
    );
}

/// Each event's start, end and profile.
fn spans(
    events: &[ScheduledEvent],
) -> impl Iterator<Item = (Nanos, Nanos, &ControllerParams)> + '_ {
    events.iter().map(|e| (e.start, e.end, &e.params))
}

/// The profile running at `at` among `spans` (start, end, profile), with its index.
fn due<'a>(
    spans: impl Iterator<Item = (Nanos, Nanos, &'a ControllerParams)>,
    at: Nanos,
) -> Option<(usize, &'a ControllerParams)> {
    spans
        .enumerate()
        .find(|(_, (start, end, _))| *start <= at && at < *end)
        .map(|(i, (_, _, params))| (i, params))
}

/// Puts `due` in force (the profile due, with its index, or the route's `own`
/// without one), unless it is the one `active` says is.
fn put_in_force(
    due: Option<(usize, &ControllerParams)>,
    active: &mut Option<usize>,
    own: &ControllerParams,
    controller: &mut Controller,
    at: Nanos,
    on_transition: impl FnMut(Transition),
) {
    let index = due.map(|(i, _)| i);
    if index != *active {
        *active = index;
        let params = due.map_or(own, |(_, params)| params).clone();
        controller.set_params(params, at, on_transition);
    }
}

/// The profiles a route runs over time, as taken from the engine
/// ([`Engine::schedule`](super::Engine::schedule)): its own parameters, and each
/// scheduled event's from its start to its end. What a shared store steps the
/// route's shared controller under, each slot under the profile due at its end, as
/// the engine steps a local route.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    own: ControllerParams,
    events: Vec<(Nanos, Nanos, ControllerParams)>,
}

impl Schedule {
    /// A schedule of the route's `own` parameters and `events`, each a start, an end
    /// and the profile in force from the one to the other.
    pub fn new(own: ControllerParams, events: Vec<(Nanos, Nanos, ControllerParams)>) -> Self {
        Schedule { own, events }
    }

    fn spans(&self) -> impl Iterator<Item = (Nanos, Nanos, &ControllerParams)> {
        self.events
            .iter()
            .map(|(start, end, params)| (*start, *end, params))
    }

    /// The parameters due at `at`: those of the event running then, or else the
    /// route's own (as [`Engine::params_at`](super::Engine::params_at) tells them).
    pub fn params_at(&self, at: Nanos) -> &ControllerParams {
        due(self.spans(), at).map_or(&self.own, |(_, params)| params)
    }

    /// Which event runs at `at`, by its index, if one does: what `active` says in
    /// [`follow`](Self::follow).
    pub fn event_at(&self, at: Nanos) -> Option<usize> {
        due(self.spans(), at).map(|(i, _)| i)
    }

    /// Each event's start and end: where the profile due may change.
    pub fn edges(&self) -> impl Iterator<Item = Nanos> + '_ {
        self.events
            .iter()
            .flat_map(|(start, end, _)| [*start, *end])
    }

    /// Puts the profile due at `at` in force in `controller`, as the engine does
    /// before each step of a local route, unless `active` (the event whose profile
    /// is in force, by its index, `None` for the route's own) says it is already. A
    /// transition the change makes is passed to `on_transition`.
    pub fn follow(
        &self,
        active: &mut Option<usize>,
        controller: &mut Controller,
        at: Nanos,
        on_transition: impl FnMut(Transition),
    ) {
        let due = due(self.spans(), at);
        put_in_force(due, active, &self.own, controller, at, on_transition);
    }

    /// When `controller`, stepped through the slots that end at or before `stepped`
    /// under the profile `active` says is in force (as [`follow`](Self::follow) keeps
    /// it), next raises its limit above where it stands, as seen at `now` (not before
    /// `stepped`) on a route whose window is `window`: what
    /// [`Controller::next_raise_at`] tells, unless an event starts or ends in a slot
    /// before then, in which case the controller is walked through the edges as the
    /// engine steps it, the readings calm. `None` in `Normal`, or if the limit never
    /// rises above where it stands (an event lowered it, and nothing takes it back up
    /// past that).
    ///
    /// Total over parameters that code builds without the config's checks (a restore
    /// step of 1e-300, 0 or NaN, a zero restore interval, times at the end of the
    /// clock): a count of restore steps or a time past `u64` saturates, and the walk
    /// takes a bounded number of stops per edge.
    pub fn next_raise(
        &self,
        active: Option<usize>,
        controller: &Controller,
        stepped: Nanos,
        now: Nanos,
        window: &WindowSpec,
    ) -> Option<Nanos> {
        raise_through(
            || self.spans(),
            &self.own,
            active,
            controller,
            (
                Past::Limit(controller.limit_rps()),
                Some(controller.next_raise_at(now, window.window())?),
            ),
            (stepped, now),
            window,
        )
    }

    /// When `controller`, stepped through the slots that end at or before `stepped`
    /// under the profile `active` says is in force, next raises its limit above where
    /// it stands, as seen at `now`, if the last slot's demand holds: `held` gives the
    /// window's readings at the ends of the slots after `stepped` if it does
    /// ([`SlotRing::held`](crate::window::SlotRing::held)). What
    /// [`Engine::restore_eta`](super::Engine::restore_eta) tells of a local route,
    /// for a shared store that has the window's completed slots where it steps the
    /// controller; [`next_raise`](Self::next_raise) is its estimate without them. At
    /// most [`HELD_READINGS`] readings are observed.
    pub fn next_raise_held(
        &self,
        (active, controller): (Option<usize>, &Controller),
        held: impl Iterator<Item = RocSample>,
        (stepped, now): (Nanos, Nanos),
        window: &WindowSpec,
    ) -> Option<Nanos> {
        let at = (active, controller);
        held_raise(
            || self.spans(),
            &self.own,
            at,
            held,
            (stepped, now),
            window,
            false,
        )
        .0
    }

    /// The schedule on another clock, whose time is `there` where this one's is
    /// `here` (a shared store's, which steps the controller on its own time).
    #[must_use]
    pub fn on_clock(mut self, here: Nanos, there: Nanos) -> Self {
        let moved = |t: Nanos| {
            Nanos::new(
                t.as_u64()
                    .saturating_add(there.as_u64())
                    .saturating_sub(here.as_u64()),
            )
        };
        for (start, end, _) in &mut self.events {
            (*start, *end) = (moved(*start), moved(*end));
        }
        self
    }
}

/// When `controller`'s limit next rises above where it stands (or, by `past`, its
/// progress between cut and base, which a tier's key limits follow), as seen at
/// `now`, the controller stepped up to the slot ending at or before `stepped` under
/// the profile `active` names (`None`: the route's `own`), on a route whose window is
/// `window`, its scheduled events' spans given by `spans`, and `estimate` the raise
/// without them ([`Controller::next_raise_at`], or
/// [`Controller::next_raise_held`] where the window's readings are known; `None`:
/// none under the profile in force, which an edge may still bring).
///
/// Without an edge (an event's start or end) in a slot that ends before the slot of
/// `estimate`, that estimate. Otherwise a clone of the controller
/// is walked as the engine steps it, the readings calm from where `next_raise_at`
/// takes the calm to begin (a cut's known calm, or else the earliest a spike can
/// read calm): it observes a calm reading at the slot where its calm begins or its
/// cut ends by the clock, and at each edge's slot the profile due there is put in
/// force (as [`follow_events`] does), then the slot observed; the first slot at which
/// the limit is above where it stood is the answer, or the time the restore, between
/// edges, takes it there. An edge may raise the limit itself (an event's higher cut
/// limit, or one that ends and restores the route's own), move the raise (another
/// hold, `max_cut`, dwell or restore schedule), or lower the limit, from which the
/// restore must climb back past where it stood. Runs once per step, not per decision;
/// out of line, so that a step of a route without events is as small as before.
#[inline(never)]
fn raise_through<'a, I>(
    spans: impl Fn() -> I,
    own: &ControllerParams,
    active: Option<usize>,
    controller: &Controller,
    (past, estimate): (Past, Option<Nanos>),
    (stepped, now): (Nanos, Nanos),
    spec: &WindowSpec,
) -> Option<Nanos>
where
    I: Iterator<Item = (Nanos, Nanos, &'a ControllerParams)>,
{
    let window = spec.window();
    let slot_ns = duration_nanos(spec.slot()).max(1);
    // The end of the slot holding `t` (`t` itself on a boundary): where the engine
    // observes what happens at `t`.
    let slot_end = |t: Nanos| Nanos::new(t.as_u64().div_ceil(slot_ns).saturating_mul(slot_ns));
    let next_edge = |after: Nanos| {
        spans()
            .flat_map(|(start, end, _)| [start, end])
            .map(slot_end)
            .filter(|&at| at > after)
            .min()
    };
    match next_edge(stepped) {
        Some(edge) if estimate.is_none_or(|estimate| slot_end(estimate) >= edge) => {}
        _ => return estimate,
    }
    let mut c = controller.clone();
    let mut active = active;
    let mut from = stepped;
    // A reading calm under any thresholds, as a calm begun reads on: all of the
    // demand gone at once (ROC of -1 in relative mode, below any `safe_roc` in
    // absolute mode). A reading of no change is not calm under a `safe_roc` of 0 or
    // below, and would forget a calm the controller has seen begin.
    let observe = |c: &mut Controller, at: Nanos| {
        let sample = RocSample {
            rate_prev_rps: f64::MAX,
            roc: f64::MIN,
            ..RocSample::default()
        };
        c.observe(SampleAt { at, sample }, |_| {});
    };
    loop {
        let edge = next_edge(from);
        let p = c.params();
        let rise = match c.state() {
            ControllerState::Normal => None,
            // Its first step, which stops at the base limit, takes it past the limit.
            ControllerState::Cut
                if (p.cut_limit_rps + p.restore_step_rps).min(p.base_limit_rps)
                    > past.limit(&c) =>
            {
                c.next_raise_at(now.max(from), window)
            }
            // Its first step does not take it past the limit: walked stop by stop.
            ControllerState::Cut => None,
            ControllerState::Recovering => c.raised_past(past.limit(&c), None),
        };
        if let Some(at) = rise.filter(|&at| edge.is_none_or(|edge| slot_end(at) < edge)) {
            return Some(at);
        }
        let stop = cut_stop(&c, from, now, window).map(slot_end);
        match (stop, edge) {
            (Some(stop), edge) if edge.is_none_or(|edge| stop < edge) => {
                observe(&mut c, stop);
                from = stop;
            }
            (_, Some(edge)) => {
                put_in_force(due(spans(), edge), &mut active, own, &mut c, edge, |_| {});
                if past.by(&c) {
                    return Some(edge);
                }
                // A cut whose calm has not begun reads no calm here (its spike fills
                // the window yet), which changes nothing but a cut's end by the clock.
                let calm = c.memory().safe_since.is_some()
                    || cut_stop(&c, from, now, window).is_some_and(|s| slot_end(s) <= edge);
                if c.state() != ControllerState::Cut || calm {
                    observe(&mut c, edge);
                }
                from = edge;
            }
            (_, None) => return None,
        }
        if past.by(&c) {
            return Some(from);
        }
    }
}

/// In `Cut`, the next time after `after` at which the controller must observe a calm
/// reading, without an edge, for [`raise_through`] to step it as the engine does:
/// when its cut ends by the clock ([`Controller::cut_ends_at`]), or, its calm not yet
/// begun, where [`Controller::next_raise_at`] takes it to begin (a window after the
/// cut, not before `now` or the arming), if a reading of no arrivals reads calm
/// under its `safe_roc` (one of 0 or below takes none as calm). `None` in the other
/// states.
fn cut_stop(c: &Controller, after: Nanos, now: Nanos, window: Duration) -> Option<Nanos> {
    let end = c.cut_ends_at()?;
    let m = c.memory();
    let calm = (m.safe_since.is_none() && c.params().safe_roc > 0.0)
        .then(|| (m.entered_at + window).max(now).max(m.armed_at));
    let next = Nanos::new(after.as_u64().saturating_add(1));
    Some(calm.map_or(end, |calm| calm.min(end)).max(next))
}

/// Where a controller stands, which a raise must take it past, for
/// [`raise_through`]: its limit, or its progress between its cut and base limits,
/// which a tier's key limits follow ([`Controller::progress`]).
#[derive(Clone, Copy)]
enum Past {
    Limit(f64),
    Progress(f64),
}

impl Past {
    /// Whether `c` stands above it.
    fn by(self, c: &Controller) -> bool {
        match self {
            Past::Limit(limit) => c.limit_rps() > limit,
            Past::Progress(progress) => c.progress() > progress,
        }
    }

    /// The limit above which `c`, under its parameters in force, stands above it:
    /// none (infinite) for progress where the cut limit is not below the base, which
    /// holds the progress at 1.
    fn limit(self, c: &Controller) -> f64 {
        match self {
            Past::Limit(limit) => limit,
            Past::Progress(progress) => {
                let p = c.params();
                let span = p.base_limit_rps - p.cut_limit_rps;
                if span > 0.0 {
                    p.cut_limit_rps + span * progress
                } else {
                    f64::INFINITY
                }
            }
        }
    }
}
