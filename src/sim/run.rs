//! Running traffic through the engine: the [`Simulator`], what it records ([`SimRun`]:
//! a [`RunSummary`] and, per route, a [`SimResult`] of a [`Summary`] and [`SlotRow`]s),
//! and the time series as CSV.

use super::hints::{event_edges, IntervalStarts};
use super::{ArrivalModel, Profile, MAX_ARRIVALS, MAX_SLOTS};
use crate::clock::{duration_nanos, Nanos};
use crate::config::{Config, ConfigError, Mode, Partition};
use crate::controller::{ControllerState, Transition};
use crate::distinct::KeySketch;
use crate::engine::{Engine, Key, RouteId};
use crate::limiter::{Decision, Reason};
use serde::{Serialize, Serializer};
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One second, in nanoseconds.
const SECOND_NS: u64 = 1_000_000_000;
/// The step by which a busiest second slides: 100 ms, or finer where slots need it
/// ([`peak_step`]).
const PEAK_GRID_NS: u64 = SECOND_NS / 10;
/// The shortest step all routes' busiest second slides by ([`all_routes_step`]): a
/// route's shortest slot, 1 ms.
const SHORTEST_PEAK_STEP_NS: u64 = 1_000_000;

/// Why a simulation cannot run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The configuration's routes break the file's rules ([`Config::validate`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configuration has no route to drive.
    #[error("the configuration has no routes")]
    NoRoutes,
    /// An empty list of routes was asked for.
    #[error("no route was selected to drive")]
    NoRouteSelected,
    /// No route has the name asked for.
    #[error("unknown route `{}`; routes in the configuration: {}", crate::config::escaped(.name, char::is_control), known.join(", "))]
    UnknownRoute {
        /// The name asked for (shown with its control characters escaped).
        name: String,
        /// The routes there are.
        known: Vec<String>,
    },
    /// The run would record more than [`MAX_SLOTS`] slots over all its routes.
    #[error(
        "a run of {duration:?} in slots of {slot:?} needs {slots} slots{}, more than {MAX_SLOTS}",
        over_routes(*routes)
    )]
    TooManySlots {
        /// Length of the run.
        duration: Duration,
        /// The routes' shortest slot.
        slot: Duration,
        /// The routes the run records.
        routes: usize,
        /// Slots the run would record, counted exactly: a run of 10^15 s in 100 ms
        /// slots needs 10^16 of them, and one of `Duration::MAX` in 1 ns slots more
        /// than a `u64` holds.
        slots: u128,
    },
    /// The profile offers more than [`MAX_ARRIVALS`] requests.
    #[error(
        "the profile offers {} requests, more than {MAX_ARRIVALS:.0}",
        count_of(*expected)
    )]
    TooManyArrivals {
        /// Requests the profile offers.
        expected: f64,
    },
    /// The profile spans less than one slot of the route it drives: the run would
    /// record one partial slot, and summarize it as if it were the route's traffic.
    /// (A profile under 1 ms, shorter than any slot, is refused as it is read,
    /// [`ProfileError::SpanTooShort`](super::ProfileError::SpanTooShort).)
    #[error(
        "the profile spans {span:?}, less than one slot of route `{route}` ({slot:?}): make it span at least one slot, or give the route shorter slots"
    )]
    ProfileShorterThanSlot {
        /// From the profile's first point to its last.
        span: Duration,
        /// The route the profile drives.
        route: String,
        /// The route's slot.
        slot: Duration,
    },
}

/// A request count as a person reads it: whole below 10^12, else in scientific
/// notation (a profile may offer 10^300 requests, which `{:.0}` writes in 301 digits).
pub(super) fn count_of(n: f64) -> String {
    if n < 1e12 {
        format!("{n:.0}")
    } else {
        format!("{n:.2e}")
    }
}

/// One request of a run: when it arrives, the route that takes it, and the client's
/// address when known (the key of a route partitioned by client IP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Arrival, time since the start of the run.
    pub at: Nanos,
    /// The route that takes it: its index in the configuration's routes (its match
    /// order), as [`Engine::route_for`] matched it ([`RouteId::index`]).
    pub route: usize,
    /// The client's address, if known.
    pub client: Option<IpAddr>,
}

/// Replays requests through a fresh [`Engine`] built from a configuration, recording
/// one or more of its routes.
#[derive(Clone, Debug)]
pub struct Simulator {
    config: Config,
    /// The routes recorded, in config order, without repeats.
    routes: Vec<usize>,
    wall_start: Option<SystemTime>,
    capacity_rps: Option<u64>,
    /// Whether a run counts what its `enforce` routes reject without their cuts.
    without_cuts: bool,
}

impl Simulator {
    /// A simulator for `route` (by name; the first route when `None`) of `config`,
    /// whose routes are checked by the rules of the file ([`Config::validate`]).
    pub fn new(config: Config, route: Option<&str>) -> Result<Self, SimError> {
        match route {
            None if config.routes.is_empty() => Err(SimError::NoRoutes),
            None => Self::build(config, vec![0]),
            Some(name) => Self::for_routes(config, &[name]),
        }
    }

    /// A simulator recording every route named (in config order, whatever the order of
    /// `names`): the routes of a multi-route replay. `config`'s routes are checked as
    /// for [`Simulator::new`].
    pub fn for_routes(config: Config, names: &[impl AsRef<str>]) -> Result<Self, SimError> {
        if config.routes.is_empty() {
            return Err(SimError::NoRoutes);
        }
        if names.is_empty() {
            return Err(SimError::NoRouteSelected);
        }
        let mut routes = names
            .iter()
            .map(|name| {
                let name = name.as_ref();
                config
                    .routes
                    .iter()
                    .position(|r| r.name == name)
                    .ok_or_else(|| SimError::UnknownRoute {
                        name: name.to_owned(),
                        known: config.routes.iter().map(|r| r.name.clone()).collect(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        routes.sort_unstable();
        routes.dedup();
        Self::build(config, routes)
    }

    /// The simulator of `routes`, once `config` is checked by the rules of the file.
    fn build(config: Config, routes: Vec<usize>) -> Result<Self, SimError> {
        config.validate()?;
        Ok(Simulator {
            config,
            routes,
            wall_start: None,
            capacity_rps: None,
            without_cuts: true,
        })
    }

    /// Places virtual time zero at this wall-clock time, for scheduled events.
    #[must_use]
    pub fn wall_start(mut self, at: SystemTime) -> Self {
        self.wall_start = Some(at);
        self
    }

    /// Models the protected service as taking at most `rps` requests in each whole
    /// second of the run (all recorded routes together): in each second, the admitted
    /// requests after the first `rps` count as overload.
    #[must_use]
    pub fn capacity(mut self, rps: u64) -> Self {
        self.capacity_rps = Some(rps);
        self
    }

    /// Whether a run counts, for each recorded route in `enforce` mode, what it rejects
    /// without its cuts ([`Summary::rejected_without_cuts`]); on by default. Counting
    /// decides every arrival on such a route a second time, in a twin engine whose
    /// controllers never cut, beside the run's own.
    #[must_use]
    pub fn count_without_cuts(mut self, on: bool) -> Self {
        self.without_cuts = on;
        self
    }

    /// The configuration the engine is built from.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The routes recorded, in config order: their indices in the configuration's routes.
    pub fn routes(&self) -> &[usize] {
        &self.routes
    }

    /// The same simulator over another configuration with the same routes in the same
    /// order (a sweep's variant of it).
    pub(super) fn with_config(&self, config: Config) -> Simulator {
        Simulator {
            config,
            ..self.clone()
        }
    }

    /// Runs the profile's arrivals under `model` on the first recorded route, for the
    /// profile's duration. Time zero is at wall-clock `UNIX_EPOCH + profile.start_s()`
    /// unless [`Simulator::wall_start`] says otherwise.
    pub fn run_profile(
        &self,
        profile: &Profile,
        model: ArrivalModel,
    ) -> Result<SimResult, SimError> {
        self.run_profile_all(profile, model)
            .and_then(SimRun::into_first)
    }

    /// [`Simulator::run_profile`], with the run-wide summary. A profile spanning less
    /// than one slot of the route is refused ([`SimError::ProfileShorterThanSlot`]).
    pub fn run_profile_all(
        &self,
        profile: &Profile,
        model: ArrivalModel,
    ) -> Result<SimRun, SimError> {
        let expected = profile.expected_arrivals();
        if expected > MAX_ARRIVALS {
            return Err(SimError::TooManyArrivals { expected });
        }
        let route = self.routes[0];
        if let Some(cfg) = self.config.routes.get(route) {
            let (span, slot) = (profile.duration(), cfg.window.slot());
            if span < slot {
                return Err(SimError::ProfileShorterThanSlot {
                    span,
                    route: cfg.name.clone(),
                    slot,
                });
            }
        }
        let wall = self
            .wall_start
            .unwrap_or_else(|| unix_time(profile.start_s()));
        let requests = profile.arrivals(model).map(|at| Request {
            at,
            route,
            client: None,
        });
        self.execute(requests, profile.duration(), wall)
    }

    /// Runs arbitrary arrival times on the first recorded route (time since the start,
    /// in order; an arrival earlier than the one before it is taken at that one's
    /// time) until `duration`: the first arrival at or after `duration` ends the run.
    /// Time zero is at wall-clock `UNIX_EPOCH` unless [`Simulator::wall_start`] says
    /// otherwise.
    pub fn run(
        &self,
        arrivals: impl IntoIterator<Item = Nanos>,
        duration: Duration,
    ) -> Result<SimResult, SimError> {
        let route = self.routes[0];
        let requests = arrivals.into_iter().map(|at| Request {
            at,
            route,
            client: None,
        });
        self.run_requests(requests, duration)
            .and_then(SimRun::into_first)
    }

    /// Runs requests to any routes, in time order (as for [`Simulator::run`]), until
    /// `duration`. Requests to routes this simulator does not record are skipped. The
    /// client address is the key of routes partitioned by client IP; every other
    /// request is keyless. Time zero is at wall-clock `UNIX_EPOCH` unless
    /// [`Simulator::wall_start`] says otherwise.
    pub fn run_requests(
        &self,
        requests: impl IntoIterator<Item = Request>,
        duration: Duration,
    ) -> Result<SimRun, SimError> {
        self.execute(requests, duration, self.wall_start.unwrap_or(UNIX_EPOCH))
    }

    /// Replays an access log: its requests, from its start for its duration. Time zero
    /// is at the log's start unless [`Simulator::wall_start`] says otherwise.
    pub fn replay(&self, log: &super::AccessLog) -> Result<SimRun, SimError> {
        let wall = self.wall_start.unwrap_or_else(|| log.start());
        self.execute(log.requests(), log.duration(), wall)
    }

    fn execute(
        &self,
        requests: impl IntoIterator<Item = Request>,
        duration: Duration,
        wall_start: SystemTime,
    ) -> Result<SimRun, SimError> {
        let end = Nanos::new(duration_nanos(duration));
        let mut slot_of = vec![None; self.config.routes.len()];
        let mut plans = Vec::with_capacity(self.routes.len());
        // Every route's rows are kept to the end of the run: the bound is on them all.
        let (mut total, mut shortest) = (0u128, Duration::MAX);
        for (i, &route) in self.routes.iter().enumerate() {
            let Some(cfg) = self.config.routes.get(route) else {
                continue;
            };
            let slot = cfg.window.slot();
            let exact = duration.as_nanos().div_ceil(slot.as_nanos());
            total = total.saturating_add(exact);
            shortest = shortest.min(slot);
            slot_of[route] = Some(i);
            plans.push((route, duration_nanos(slot), exact as u64));
        }
        if total > u128::from(MAX_SLOTS) {
            return Err(SimError::TooManySlots {
                duration,
                slot: shortest,
                routes: plans.len(),
                slots: total,
            });
        }

        // Every decision and change of this run's buckets is made on this thread:
        // their notes are its own, so that another run at once (a sweep's, a test's)
        // cannot put a limit change off and change the result; until the run ends
        // (the guard outlives the engine), when the thread's buckets take the shared
        // notes again.
        let _own_notes = crate::limiter::gcra::notes_of_this_thread();
        let transitions = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&transitions);
        let names: Vec<String> = self
            .routes
            .iter()
            .filter_map(|&r| self.config.routes.get(r))
            .map(|r| r.name.clone())
            .collect();
        let engine = Engine::new(&self.config, Nanos::ZERO, wall_start)?.with_transition_hook(
            Arc::new(move |route: &str, t: &Transition| {
                if let Some(i) = names.iter().position(|n| n == route) {
                    sink.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((i, *t));
                }
            }),
        );

        // The engine builds its route table in config order.
        let ids: Vec<RouteId> = plans
            .iter()
            .filter_map(|&(route, _, _)| engine.route_at(route))
            .collect();
        let twin = self.twin(wall_start)?;
        let mut recorders: Vec<Recorder<'_>> = plans
            .iter()
            .zip(&ids)
            .map(|(&(route, slot_ns, slots), &id)| {
                let by_ip = matches!(
                    self.config.routes.get(route).map(|r| &r.partition),
                    Some(Partition::ClientIp(_))
                );
                let twin = twin.as_ref().and_then(|(twin, routes)| {
                    let id = routes.contains(&route).then(|| twin.route_at(route))??;
                    Some(Twin {
                        engine: twin,
                        route: id,
                        rejected: 0,
                    })
                });
                let edges = self
                    .config
                    .routes
                    .get(route)
                    .map(|r| event_edges(r, unix_seconds(wall_start)))
                    .unwrap_or_default();
                let starts = IntervalStarts::new(Nanos::new(slot_ns).as_secs_f64(), &edges);
                Recorder::new(&engine, id, by_ip, slot_ns, slots, twin, starts)
            })
            .collect();
        let step = all_routes_step(plans.iter().map(|&(_, slot_ns, _)| slot_ns));
        let mut load = Load::new(self.capacity_rps, step);
        let mut last = Nanos::ZERO;
        for r in requests {
            let t = r.at.max(last);
            if t >= end {
                break;
            }
            last = t;
            let Some(Some(i)) = slot_of.get(r.route) else {
                continue;
            };
            let rec = &mut recorders[*i];
            if rec.arrive(t, r.client) && load.admit(t.as_u64()) {
                rec.row.overload += 1;
            }
        }

        let mut by_route: Vec<Vec<TransitionRecord>> = vec![Vec::new(); recorders.len()];
        let (series, grids): (Vec<_>, Vec<_>) = recorders
            .into_iter()
            .zip(&plans)
            .map(|(rec, &(_, _, slots))| {
                let f = rec.finish(slots);
                ((f.rows, f.refused), (f.grid, f.without_cuts))
            })
            .unzip();
        let snaps: Vec<_> = ids
            .iter()
            .filter_map(|&r| engine.route_snapshot(r, end))
            .collect();
        drop(engine);
        for (i, t) in
            std::mem::take(&mut *transitions.lock().unwrap_or_else(PoisonError::into_inner))
        {
            by_route[i].push(TransitionRecord::from(&t));
        }

        let start_unix_s = unix_seconds(wall_start);
        let routes: Vec<SimResult> = series
            .into_iter()
            .zip(grids)
            .zip(snaps)
            .zip(by_route)
            .zip(&plans)
            .map(
                |(
                    ((((series, refused_keys), (grid, without_cuts)), snap), transitions),
                    &(_, slot_ns, _),
                )| {
                    let peaks =
                        grid.map(|(offered, admitted)| (offered.finish(end), admitted.finish(end)));
                    let mut summary = summarize(
                        snap,
                        &series,
                        peaks,
                        transitions,
                        slot_ns,
                        start_unix_s,
                        end,
                    );
                    summary.rejected_without_cuts = without_cuts;
                    SimResult {
                        summary,
                        series,
                        refused_keys,
                    }
                },
            )
            .collect();
        let summary = load.finish(&routes, self.capacity_rps, start_unix_s, end);
        Ok(SimRun { summary, routes })
    }

    /// The twin engine of a run that counts what its routes reject without their cuts
    /// ([`Simulator::count_without_cuts`]), and the routes it counts (indices in the
    /// configuration): the recorded routes in `enforce` mode, whose controllers never
    /// cut there (no window sample ever holds the requests a cut needs: `min_samples` is
    /// `u64::MAX`, in their events' profiles too), so that they enforce their base
    /// limit (an event's, while one is active) and nothing else. `None` when no
    /// recorded route is in `enforce` mode: a shadow mode enforces no cut.
    ///
    /// Not `shadow_adaptive`, which enforces the base limit too but keeps a second set
    /// of limiters following the cuts beside it, which the count has no use for (its
    /// keys once took a change of the base limit dated at a later cut's step, and a key
    /// idle across both rejected what the route without cuts admits: no longer).
    fn twin(&self, wall_start: SystemTime) -> Result<Option<(Engine, Vec<usize>)>, SimError> {
        if !self.without_cuts {
            return Ok(None);
        }
        let mut config = self.config.clone();
        let mut counted = Vec::new();
        for &i in &self.routes {
            if let Some(route) = config.routes.get_mut(i).filter(|r| r.mode == Mode::Enforce) {
                route.controller.min_samples = u64::MAX;
                for event in &mut route.events {
                    event.controller.min_samples = u64::MAX;
                }
                counted.push(i);
            }
        }
        if counted.is_empty() {
            return Ok(None);
        }
        Ok(Some((
            Engine::new(&config, Nanos::ZERO, wall_start)?,
            counted,
        )))
    }
}

/// One route's summary from its final snapshot, its series and its transitions. Its
/// busiest seconds come from `peaks` (offered, admitted) when given, otherwise from
/// whole slots.
fn summarize(
    snap: crate::engine::RouteSnapshot,
    series: &[SlotRow],
    peaks: Option<((u64, f64), (u64, f64))>,
    transitions: Vec<TransitionRecord>,
    slot_ns: u64,
    start_unix_s: f64,
    end: Nanos,
) -> Summary {
    let cuts: Vec<TransitionRecord> = transitions
        .iter()
        .filter(|t| t.to == ControllerState::Cut)
        .copied()
        .collect();
    let ((peak_offered_1s, _), (peak_admitted_1s, peak_admitted_1s_at_s)) =
        peaks.unwrap_or_else(|| {
            let span = ((1e9 / slot_ns as f64).round() as usize).max(1);
            let (admitted, at) = peak(series, span, |r| r.admitted);
            let at_s = Nanos::new(at as u64 * slot_ns).as_secs_f64();
            ((peak(series, span, |r| r.offered).0, 0.0), (admitted, at_s))
        });
    let rejected_by_reason = ReasonCounts::from_pairs(&snap.rejected);
    let shadow_rejected_by_reason = ReasonCounts::from_pairs(&snap.shadow_rejected);
    let cut_own_net = snap.cut_own_net();
    let route_limit_rejected = snap.route_limit.map(|t| t.rejected);
    Summary {
        route: snap.name,
        mode: snap.mode,
        start_unix_s,
        duration_s: end.as_secs_f64(),
        slot_s: Nanos::new(slot_ns).as_secs_f64(),
        offered: snap.offered,
        admitted: snap.admitted,
        rejected: rejected_by_reason.total(),
        rejected_without_cuts: None,
        cut_own_net,
        rejected_by_reason,
        route_limit_rejected,
        shadow_rejected: shadow_rejected_by_reason.total(),
        shadow_rejected_by_reason,
        overload: series.iter().map(|r| r.overload).sum(),
        first_cut_s: cuts.first().map(|c| c.t_s),
        cuts,
        time_in_cut_s: snap.time_in_cut.as_secs_f64(),
        transitions,
        peak_admitted_1s,
        peak_admitted_1s_at_s,
        peak_offered_1s,
    }
}

/// How [`SimError::TooManySlots`] names a run's routes: by their count, if more than one.
fn over_routes(routes: usize) -> String {
    if routes > 1 {
        format!(" over its {routes} routes")
    } else {
        String::new()
    }
}

/// `UNIX_EPOCH + secs`, or the epoch itself when that is not a representable time.
pub(super) fn unix_time(secs: f64) -> SystemTime {
    let offset = Duration::try_from_secs_f64(secs.abs()).ok();
    let at = if secs >= 0.0 {
        offset.and_then(|d| UNIX_EPOCH.checked_add(d))
    } else {
        offset.and_then(|d| UNIX_EPOCH.checked_sub(d))
    };
    at.unwrap_or(UNIX_EPOCH)
}

/// Seconds since `UNIX_EPOCH`, negative before it.
pub(super) fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

/// The largest sum of `span` consecutive rows (all rows if fewer), and the first row's index.
fn peak(rows: &[SlotRow], span: usize, value: impl Fn(&SlotRow) -> u64) -> (u64, usize) {
    let span = span.min(rows.len());
    let mut sum: u64 = rows[..span].iter().map(&value).sum();
    let (mut best, mut at) = (sum, 0);
    for i in span..rows.len() {
        sum = sum + value(&rows[i]) - value(&rows[i - span]);
        if sum > best {
            (best, at) = (sum, i + 1 - span);
        }
    }
    (best, at)
}

/// The step by which the busiest second slides over a route's slots of `slot_ns`:
/// 100 ms; the slot, when it is 100 ms or less and 1 s a whole number of them (the
/// series' rows); or, when 1 s is a whole number of longer slots, the longest step
/// that meets both every 100 ms and every slot's edge (50 ms for slots of 250 ms), so
/// that each second the series shows as whole slots is one the peak weighs: on the
/// 100 ms grid the second from 0.25 s, four rows of 250 ms, was passed over, and a
/// peak below the sum of those rows was printed as the busiest second.
fn peak_step(slot_ns: u64) -> u64 {
    if slot_ns == 0 || SECOND_NS % slot_ns != 0 {
        return PEAK_GRID_NS;
    }
    if slot_ns <= PEAK_GRID_NS {
        return slot_ns;
    }
    gcd(PEAK_GRID_NS, slot_ns)
}

/// The step by which all routes' busiest second together slides, over routes of the
/// slots given: the longest that meets each route's [`peak_step`] (one route's,
/// alone, so that both weigh the same seconds), but 100 ms where that would be under
/// [`SHORTEST_PEAK_STEP_NS`] (routes whose slots' edges meet only every few
/// microseconds, 1.953125 ms beside 1.6 ms: 3.125 µs, a grid of 320,000 cells a
/// second that a long run would step through one by one).
fn all_routes_step(slots_ns: impl Iterator<Item = u64>) -> u64 {
    slots_ns
        .map(peak_step)
        .reduce(gcd)
        .filter(|&step| step >= SHORTEST_PEAK_STEP_NS)
        .unwrap_or(PEAK_GRID_NS)
}

/// The greatest common divisor of `a` and `b`.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The busiest second of a count, on a grid of cells that divide a second: counts per
/// cell, summed over the last second's.
#[derive(Clone, Debug)]
struct Peak {
    /// Length of a cell, ns: a divisor of a second.
    cell_ns: u64,
    /// Index, end (ns) and count of the cell being counted.
    cell: u64,
    cell_end: u64,
    cell_count: u64,
    /// The last second's closed cells, and their sum.
    ring: Box<[u64]>,
    ring_sum: u64,
    peak: u64,
    /// First cell of the busiest second.
    peak_cell: u64,
}

impl Peak {
    /// A grid of cells of `cell_ns`, a divisor of a second (a step of [`peak_step`]).
    fn new(cell_ns: u64) -> Self {
        let cell_ns = cell_ns.clamp(1, SECOND_NS);
        Peak {
            cell_ns,
            cell: 0,
            cell_end: cell_ns,
            cell_count: 0,
            ring: vec![0; (SECOND_NS / cell_ns) as usize].into_boxed_slice(),
            ring_sum: 0,
            peak: 0,
            peak_cell: 0,
        }
    }

    /// Counts one at `t` ns (in time order).
    #[inline]
    fn add(&mut self, t: u64) {
        if t >= self.cell_end {
            self.close_cells(t / self.cell_ns);
        }
        self.cell_count += 1;
    }

    /// Closes cells until `cell` is the one being counted.
    #[cold]
    fn close_cells(&mut self, cell: u64) {
        let per_s = self.ring.len() as u64;
        while self.cell < cell {
            let slot = (self.cell % per_s) as usize;
            self.ring_sum = self.ring_sum + self.cell_count - self.ring[slot];
            self.ring[slot] = self.cell_count;
            if self.ring_sum > self.peak {
                self.peak = self.ring_sum;
                self.peak_cell = (self.cell + 1).saturating_sub(per_s);
            }
            self.cell += 1;
            self.cell_count = 0;
            if self.ring_sum == 0 && self.cell < cell {
                // Nothing left in the last second: skip the empty cells at once.
                self.cell = cell;
            }
        }
        self.cell_end = (self.cell + 1) * self.cell_ns;
    }

    /// The most counted in any second of the grid up to `end`, and when that second
    /// began, seconds since the start.
    fn finish(mut self, end: Nanos) -> (u64, f64) {
        self.close_cells(end.as_u64().div_ceil(self.cell_ns).max(self.cell + 1));
        let at = Nanos::new(self.peak_cell * self.cell_ns).as_secs_f64();
        (self.peak, at)
    }
}

/// What the protected service receives, all recorded routes together: admitted
/// requests per whole second against the capacity, and per step of the grid for the
/// busiest second (100 ms, or finer where a route's slots need it: [`peak_step`]).
struct Load {
    capacity: Option<u64>,
    /// End of the whole second being counted, ns.
    second_end: u64,
    admitted_in_second: u64,
    second_overloaded: bool,
    overload: u64,
    overload_s: u64,
    /// Admitted requests, for the busiest second.
    peak: Peak,
}

impl Load {
    /// A load against `capacity`, its busiest second sliding by `peak_step` ns.
    fn new(capacity: Option<u64>, peak_step: u64) -> Self {
        Load {
            capacity,
            second_end: SECOND_NS,
            admitted_in_second: 0,
            second_overloaded: false,
            overload: 0,
            overload_s: 0,
            peak: Peak::new(peak_step),
        }
    }

    /// Counts one admitted request at `t` ns; whether it is overload.
    #[inline]
    fn admit(&mut self, t: u64) -> bool {
        self.peak.add(t);
        if t >= self.second_end {
            self.second_end = (t / SECOND_NS + 1) * SECOND_NS;
            self.admitted_in_second = 0;
            self.second_overloaded = false;
        }
        let over = self.capacity.is_some_and(|c| self.admitted_in_second >= c);
        self.admitted_in_second += 1;
        if over {
            self.overload += 1;
            if !self.second_overloaded {
                self.second_overloaded = true;
                self.overload_s += 1;
            }
        }
        over
    }

    fn finish(
        self,
        routes: &[SimResult],
        capacity_rps: Option<u64>,
        start_unix_s: f64,
        end: Nanos,
    ) -> RunSummary {
        let (peak_admitted_1s, peak_admitted_1s_at_s) = self.peak.finish(end);
        let sum = |f: fn(&Summary) -> u64| routes.iter().map(|r| f(&r.summary)).sum::<u64>();
        let rejected_without_cuts = routes
            .iter()
            .any(|r| r.summary.rejected_without_cuts.is_some())
            .then(|| sum(|s| s.rejected_without_cuts.unwrap_or(s.rejected)));
        let first_cut_s = routes
            .iter()
            .filter_map(|r| r.summary.first_cut_s)
            .reduce(f64::min);
        RunSummary {
            start_unix_s,
            duration_s: end.as_secs_f64(),
            capacity_rps,
            offered: sum(|s| s.offered),
            admitted: sum(|s| s.admitted),
            rejected: sum(|s| s.rejected),
            rejected_without_cuts,
            shadow_rejected: sum(|s| s.shadow_rejected),
            overload: self.overload,
            overload_s: self.overload_s,
            cut_count: sum(|s| s.cuts.len() as u64),
            first_cut_s,
            time_in_cut_s: routes.iter().map(|r| r.summary.time_in_cut_s).sum(),
            peak_admitted_1s,
            peak_admitted_1s_at_s,
        }
    }
}

/// Counts one route's arrivals slot by slot, and closes each slot with one engine
/// snapshot.
struct Recorder<'e> {
    engine: &'e Engine,
    route: RouteId,
    /// Whether the route is partitioned by client IP (the client is its key).
    by_ip: bool,
    slot_ns: u64,
    /// End of the slot being counted.
    boundary: u64,
    row: SlotRow,
    /// Shadow would-rejects counted by the engine up to the last closed slot, by
    /// reason.
    shadow_seen: crate::hints::ReasonArray,
    /// Refusals by the route's `route_limit` the engine counted up to the last closed
    /// slot.
    route_limit_seen: u64,
    rows: Vec<SlotRow>,
    /// Offered and admitted requests on the grid of [`peak_step`], for the busiest
    /// second, when slots are longer than 100 ms or 1 s is not a whole number of them
    /// (whole slots would slide too coarsely: by 1 s, only the aligned seconds).
    grid: Option<(Peak, Peak)>,
    /// The route in the twin engine, when the run counts what it rejects without its
    /// cuts (see `Simulator::twin`).
    twin: Option<Twin<'e>>,
    /// Where the intervals of the route's hints begin, as its rows come.
    starts: IntervalStarts,
    /// The place of the interval the slot being counted is in.
    interval: u32,
    /// The keys refused per interval, where some were.
    refused: Vec<(u32, KeySketch)>,
}

/// What a [`Recorder`] counted over the run.
struct Finished {
    rows: Vec<SlotRow>,
    grid: Option<(Peak, Peak)>,
    /// What its twin rejected, if it has one.
    without_cuts: Option<u64>,
    /// The keys refused per interval ([`SimResult::refused_keys`]).
    refused: Vec<(u32, KeySketch)>,
}

/// A route of the twin engine, which decides each of the route's arrivals too.
struct Twin<'e> {
    engine: &'e Engine,
    route: RouteId,
    /// Arrivals the twin rejected.
    rejected: u64,
}

impl<'e> Recorder<'e> {
    fn new(
        engine: &'e Engine,
        route: RouteId,
        by_ip: bool,
        slot_ns: u64,
        slots: u64,
        twin: Option<Twin<'e>>,
        mut starts: IntervalStarts,
    ) -> Self {
        // The first row, at 0 s, begins the first interval.
        starts.begins(0.0);
        Recorder {
            starts,
            interval: 0,
            refused: Vec::new(),
            engine,
            route,
            twin,
            by_ip,
            slot_ns,
            boundary: slot_ns,
            row: SlotRow::empty(0.0),
            shadow_seen: Default::default(),
            route_limit_seen: 0,
            rows: Vec::with_capacity(usize::try_from(slots).unwrap_or(0)),
            grid: (slot_ns > PEAK_GRID_NS || SECOND_NS % slot_ns != 0)
                .then(|| (Peak::new(peak_step(slot_ns)), Peak::new(peak_step(slot_ns)))),
        }
    }

    /// Decides one arrival; whether it was admitted.
    #[inline]
    fn arrive(&mut self, t: Nanos, client: Option<IpAddr>) -> bool {
        while t.as_u64() >= self.boundary {
            self.close();
        }
        self.row.offered += 1;
        let key = match client {
            Some(ip) if self.by_ip => Key::Ip(ip),
            _ => Key::None,
        };
        let decision = self.engine.check(self.route, key, t);
        if let Some(twin) = &mut self.twin {
            if !twin.engine.check(twin.route, key, t).is_admit() {
                twin.rejected += 1;
            }
        }
        if let Some((offered, admitted)) = &mut self.grid {
            offered.add(t.as_u64());
            if decision.is_admit() {
                admitted.add(t.as_u64());
            }
        }
        match decision {
            Decision::Admit(_) => {
                self.row.admitted += 1;
                true
            }
            Decision::Reject(r) => {
                self.row.rejected.add(r.reason);
                false
            }
        }
    }

    /// Snapshots the engine at the slot's end (before any later arrival is decided)
    /// and starts the next slot. A slot without arrivals steps the controller at its
    /// start first, as its first arrival would have, in the twin too.
    #[cold]
    fn close(&mut self) {
        if self.row.offered == 0 {
            let start = Nanos::new(self.boundary.saturating_sub(self.slot_ns));
            self.engine.catch_up(self.route, start);
            if let Some(twin) = &self.twin {
                twin.engine.catch_up(twin.route, start);
            }
        }
        let next = SlotRow::empty(Nanos::new(self.boundary).as_secs_f64());
        // The next slot begins an interval of the hints: this one's keys refused are
        // the interval's.
        if self.starts.begins(next.t_s) {
            self.take_refused();
            self.interval += 1;
        }
        let row = std::mem::replace(&mut self.row, next);
        // The route came from this engine, which holds it: there is always a snapshot.
        let snap = self
            .engine
            .route_snapshot(self.route, Nanos::new(self.boundary));
        self.rows.push(match snap {
            Some(snap) => {
                let shadow = crate::hints::reason_array(&snap.shadow_rejected);
                let seen = std::mem::replace(&mut self.shadow_seen, shadow);
                let by_reason =
                    Reason::ALL.map(|r| (r, shadow[r.index()].saturating_sub(seen[r.index()])));
                let shadow_rejected_by_reason = ReasonCounts::from_pairs(&by_reason);
                let total = snap.route_limit.map_or(0, |t| t.rejected);
                let seen = std::mem::replace(&mut self.route_limit_seen, total);
                SlotRow {
                    shadow_rejected: shadow_rejected_by_reason.total(),
                    shadow_rejected_by_reason,
                    route_limit_rejected: total.saturating_sub(seen),
                    roc: snap.roc,
                    danger_roc: snap.danger_roc,
                    safe_roc: snap.safe_roc,
                    limit_rps: snap.limit_rps,
                    base_limit_rps: snap.base_limit_rps,
                    state: snap.state,
                    level: snap.level.value,
                    level_capacity: snap.level.capacity,
                    ..row
                }
            }
            None => row,
        });
        self.boundary = self.boundary.saturating_add(self.slot_ns);
    }

    /// The keys the route refused since last taken, as the current interval's (none
    /// kept where it refused none, or is limited as a whole).
    fn take_refused(&mut self) {
        if let Some(keys) = self.engine.take_refused_keys(self.route) {
            if !keys.is_empty() {
                self.refused.push((self.interval, keys));
            }
        }
    }

    /// The route's rows, its busiest seconds on its grid if it kept them, what
    /// its twin rejected, if it has one, and the keys it refused per interval.
    fn finish(mut self, slots: u64) -> Finished {
        while (self.rows.len() as u64) < slots {
            self.close();
        }
        self.take_refused();
        Finished {
            rows: self.rows,
            grid: self.grid,
            without_cuts: self.twin.map(|t| t.rejected),
            refused: self.refused,
        }
    }
}

/// Requests counted by rejection reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ReasonCounts {
    /// `limit`: the absolute limit was exhausted.
    pub limit: u64,
    /// `roc_cut`: the limit was exhausted while cut by the controller.
    pub roc_cut: u64,
    /// `concurrency`: too many in flight.
    pub concurrency: u64,
    /// `queue_full`: the queue was full.
    pub queue_full: u64,
    /// `fallback_local`: rejected by the local fallback limiter.
    pub fallback_local: u64,
}

impl ReasonCounts {
    fn from_pairs(pairs: &[(Reason, u64)]) -> Self {
        let mut counts = ReasonCounts::default();
        for &(reason, n) in pairs {
            *counts.slot(reason) += n;
        }
        counts
    }

    #[inline]
    fn add(&mut self, reason: Reason) {
        *self.slot(reason) += 1;
    }

    #[inline]
    fn slot(&mut self, reason: Reason) -> &mut u64 {
        match reason {
            Reason::Limit => &mut self.limit,
            Reason::RocCut => &mut self.roc_cut,
            Reason::Concurrency => &mut self.concurrency,
            Reason::QueueFull => &mut self.queue_full,
            Reason::FallbackLocal => &mut self.fallback_local,
        }
    }

    /// Every reason with its count, in the order of [`Reason::ALL`].
    pub fn iter(&self) -> impl Iterator<Item = (Reason, u64)> {
        let counts = [
            self.limit,
            self.roc_cut,
            self.concurrency,
            self.queue_full,
            self.fallback_local,
        ];
        Reason::ALL.into_iter().zip(counts)
    }

    /// All reasons together.
    pub fn total(&self) -> u64 {
        self.iter().map(|(_, n)| n).sum()
    }
}

/// A controller state change, in simulation time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TransitionRecord {
    /// When the change took effect, seconds since the start.
    pub t_s: f64,
    /// State left.
    #[serde(serialize_with = "state_name")]
    pub from: ControllerState,
    /// State entered.
    #[serde(serialize_with = "state_name")]
    pub to: ControllerState,
    /// ROC of the sample that caused it.
    pub roc: f64,
    /// The limit after the change, req/s.
    pub limit_rps: f64,
}

impl From<&Transition> for TransitionRecord {
    fn from(t: &Transition) -> Self {
        TransitionRecord {
            t_s: t.at.as_secs_f64(),
            from: t.from,
            to: t.to,
            roc: t.roc,
            limit_rps: t.limit_rps,
        }
    }
}

/// One slot of a route's time series (see the module doc of [`crate::sim`] for each
/// column).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SlotRow {
    /// Start of the slot, seconds since the start.
    pub t_s: f64,
    /// Requests that arrived in the slot.
    pub offered: u64,
    /// Of those, admitted.
    pub admitted: u64,
    /// Of those, rejected, by reason.
    pub rejected: ReasonCounts,
    /// Shadow modes: admitted but would have been rejected.
    pub shadow_rejected: u64,
    /// Of those, by the reason they would have been rejected for.
    pub shadow_rejected_by_reason: ReasonCounts,
    /// Of the rejected (in `shadow` mode, of those that would have been), those a
    /// partitioned route's `route_limit` refused, its keys together, after their key's
    /// own limit admitted them: counted among `limit` or `roc_cut` too (0 on a route
    /// without one).
    pub route_limit_rejected: u64,
    /// Of the admitted, those above the service's capacity ([`Simulator::capacity`]).
    pub overload: u64,
    /// ROC of the last sample the controller saw when the slot began.
    pub roc: f64,
    /// The danger threshold in force.
    pub danger_roc: f64,
    /// The safe threshold in force.
    pub safe_roc: f64,
    /// The limit in force during the slot, req/s.
    pub limit_rps: f64,
    /// The base limit in force (an event's, while one is active), req/s.
    pub base_limit_rps: f64,
    /// The controller's state during the slot.
    #[serde(serialize_with = "state_name")]
    pub state: ControllerState,
    /// The limiter's level at the end of the slot (tokens left, for a token bucket).
    pub level: f64,
    /// The most `level` can be.
    pub level_capacity: f64,
}

impl SlotRow {
    /// A slot starting at `t_s` in which nothing happened.
    pub fn empty(t_s: f64) -> Self {
        SlotRow {
            t_s,
            offered: 0,
            admitted: 0,
            rejected: ReasonCounts::default(),
            shadow_rejected: 0,
            shadow_rejected_by_reason: ReasonCounts::default(),
            route_limit_rejected: 0,
            overload: 0,
            roc: 0.0,
            danger_roc: 0.0,
            safe_roc: 0.0,
            limit_rps: 0.0,
            base_limit_rps: 0.0,
            state: ControllerState::Normal,
            level: 0.0,
            level_capacity: 0.0,
        }
    }
}

/// What a run did on one route, in a few numbers (see the module doc of
/// What a run's cuts themselves rejected: its rejections less those it makes without
/// cuts ([`Summary::rejected_without_cuts`]), below zero should a cut have left a
/// limiter fuller afterwards than the base limit alone would have, as a count and a
/// share of what was offered. `rocgate simulate` and `rocgate demo` print it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CutsOwn {
    /// `rejected - without_cuts`.
    pub count: i128,
    /// `count` as a percentage of the requests offered (of at least one).
    pub percent: f64,
}

impl CutsOwn {
    /// The cuts' own of a run that offered `offered` and rejected `rejected`, of which
    /// its base limit alone rejects `without_cuts`.
    pub fn new(rejected: u64, without_cuts: u64, offered: u64) -> Self {
        let count = i128::from(rejected) - i128::from(without_cuts);
        CutsOwn {
            count,
            percent: 100.0 * count as f64 / offered.max(1) as f64,
        }
    }

    /// How a report names it: "the cuts' own", or "difference" below zero.
    pub fn label(&self) -> &'static str {
        if self.count >= 0 {
            "the cuts' own"
        } else {
            "difference"
        }
    }
}

/// [`crate::sim`] for each field).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// The route driven.
    pub route: String,
    /// Its mode.
    #[serde(serialize_with = "mode_name")]
    pub mode: Mode,
    /// Wall-clock time of the start, Unix seconds.
    pub start_unix_s: f64,
    /// Length of the run, seconds.
    pub duration_s: f64,
    /// Length of one slot, seconds.
    pub slot_s: f64,
    /// Requests offered.
    pub offered: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests rejected, all reasons.
    pub rejected: u64,
    /// `enforce` routes: requests the route rejects on the same arrivals when its
    /// controller never cuts (by its base limit alone, an event's while one is
    /// active); equal to `rejected` on a route that never cut. While a cut holds,
    /// every refusal counts as `roc_cut`, those the base limit would have made too:
    /// `rejected` less this is what the cuts themselves rejected (below zero, should
    /// a cut leave a limiter fuller afterwards than the base limit alone would have).
    /// The arrivals are the same: clients are taken to send what they sent, refused
    /// or not. `None` for routes in a shadow mode, which enforce no cut, and in runs
    /// that do not count it ([`Simulator::count_without_cuts`], sweeps).
    pub rejected_without_cuts: Option<u64>,
    /// The cuts' own refusals as the engine counts them live, net (`GET
    /// /admin/routes`' `cut_own_net`, [`RouteSnapshot::cut_own_net`] at the run's
    /// end): the cut's refusals the base limit would have admitted less its admissions
    /// the base limit would have refused, each against a twin token bucket at the base
    /// limit started from the route's at each cut's start. 0 on a route that never cut;
    /// `None` where it is not counted (a partitioned route, another algorithm, a
    /// `shadow_adaptive` route).
    ///
    /// [`RouteSnapshot::cut_own_net`]: crate::engine::RouteSnapshot::cut_own_net
    pub cut_own_net: Option<i64>,
    /// Requests rejected, by reason.
    pub rejected_by_reason: ReasonCounts,
    /// A partitioned route's `route_limit`: the requests it refused, its keys together,
    /// after their key's own limit admitted them (in `shadow` mode, would have), of
    /// those counted in `rejected_by_reason` (`shadow_rejected_by_reason`) as `limit`,
    /// or `roc_cut` while a cut held: the part the total refused, not a key's own
    /// limit. `None` on a route without one.
    pub route_limit_rejected: Option<u64>,
    /// Shadow modes: requests admitted that would have been rejected.
    pub shadow_rejected: u64,
    /// Shadow would-rejects, by reason.
    pub shadow_rejected_by_reason: ReasonCounts,
    /// Of the admitted, those above the service's capacity (0 without a capacity).
    pub overload: u64,
    /// Every transition into `cut`.
    pub cuts: Vec<TransitionRecord>,
    /// Time of the first cut, seconds since the start.
    pub first_cut_s: Option<f64>,
    /// Total time in `cut`, seconds.
    pub time_in_cut_s: f64,
    /// Every state change.
    pub transitions: Vec<TransitionRecord>,
    /// Most requests admitted in any 1 s (sliding by whole slots of 100 ms or less,
    /// otherwise by 100 ms, or by 50 ms or 25 ms where that meets every edge of slots
    /// that 1 s holds a whole number of: 250 ms, 125 ms).
    pub peak_admitted_1s: u64,
    /// Start of that busiest second, seconds since the start.
    pub peak_admitted_1s_at_s: f64,
    /// Most requests offered in any 1 s.
    pub peak_offered_1s: u64,
}

/// What a run did over all its routes (see the module doc of [`crate::sim`] for each
/// field).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RunSummary {
    /// Wall-clock time of the start, Unix seconds.
    pub start_unix_s: f64,
    /// Length of the run, seconds.
    pub duration_s: f64,
    /// The service's capacity, req/s, if one was modelled.
    pub capacity_rps: Option<u64>,
    /// Requests offered.
    pub offered: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests rejected.
    pub rejected: u64,
    /// Requests rejected had no route enforced its cuts: the routes'
    /// [`Summary::rejected_without_cuts`], or `rejected` where that is `None`; `None`
    /// when no route has it.
    pub rejected_without_cuts: Option<u64>,
    /// Shadow modes: requests admitted that would have been rejected.
    pub shadow_rejected: u64,
    /// Admitted requests above the capacity.
    pub overload: u64,
    /// Whole seconds in which more than the capacity was admitted.
    pub overload_s: u64,
    /// Cuts, all routes together.
    pub cut_count: u64,
    /// The earliest first cut of any route, seconds since the start.
    pub first_cut_s: Option<f64>,
    /// Time in `cut`, summed over the routes, seconds.
    pub time_in_cut_s: f64,
    /// Most requests admitted in any 1 s, all routes together (sliding by the longest
    /// step that meets the step each route's busiest second slides by: one route's
    /// alone).
    pub peak_admitted_1s: u64,
    /// Start of that busiest second, seconds since the start.
    pub peak_admitted_1s_at_s: f64,
}

/// The outcome of a run on one route: a summary and the per-slot time series.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SimResult {
    /// The run in a few numbers.
    pub summary: Summary,
    /// One row per slot, from time zero.
    pub series: Vec<SlotRow>,
    /// The distinct keys a partitioned route refused, as a sketch per interval of its
    /// hints ([`super::hints::intervals`]: a second, ended at its events' edges too),
    /// by the interval's place among them, where it refused a key (not written out:
    /// the hints read them). Taken per interval, not per slot: a sketch in each row
    /// held 64 B more a slot.
    #[serde(skip)]
    pub refused_keys: Vec<(u32, KeySketch)>,
}

/// The outcome of a run: over all routes, and route by route.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SimRun {
    /// All routes together.
    pub summary: RunSummary,
    /// One result per recorded route, in config order.
    pub routes: Vec<SimResult>,
}

impl SimRun {
    /// The header line of [`SimRun::write_csv`], without the line break.
    pub const CSV_HEADER: &'static str = "route,t_s,offered,admitted,rejected,\
        rejected_limit,rejected_roc_cut,rejected_concurrency,rejected_queue_full,\
        rejected_fallback_local,shadow_rejected,overload,roc,danger_roc,safe_roc,\
        limit_rps,base_limit_rps,state,level,level_capacity,route_limit_rejected";

    /// The first route's result (the only one of a single-route run).
    fn into_first(self) -> Result<SimResult, SimError> {
        self.routes
            .into_iter()
            .next()
            .ok_or(SimError::NoRouteSelected)
    }

    /// Writes the time series as CSV: the header, then one line per slot of each
    /// route, route after route in config order.
    pub fn write_csv(&self, mut out: impl io::Write) -> io::Result<()> {
        writeln!(out, "{}", Self::CSV_HEADER)?;
        for route in &self.routes {
            let name = csv_field(&route.summary.route);
            for r in &route.series {
                let x = &r.rejected;
                writeln!(
                    out,
                    "{name},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                    r.t_s,
                    r.offered,
                    r.admitted,
                    x.total(),
                    x.limit,
                    x.roc_cut,
                    x.concurrency,
                    x.queue_full,
                    x.fallback_local,
                    r.shadow_rejected,
                    r.overload,
                    r.roc,
                    r.danger_roc,
                    r.safe_roc,
                    r.limit_rps,
                    r.base_limit_rps,
                    r.state,
                    r.level,
                    r.level_capacity,
                    r.route_limit_rejected,
                )?;
            }
        }
        out.flush()
    }
}

/// A CSV field: as is, or quoted (quotes doubled) when it holds a comma, quote or
/// line break.
pub(super) fn csv_field(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\"")).into()
    } else {
        text.into()
    }
}

fn state_name<S: Serializer>(state: &ControllerState, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.as_str())
}

fn mode_name<S: Serializer>(mode: &Mode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(mode.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread that ran a simulation takes the notes all threads share again: its
    /// change of a bucket that another thread is changing waits for that change (a
    /// thread of a pool that ran a what-if and then changes a live route's limit).
    /// The run's note used to stay the thread's, and the change went ahead beside the
    /// other, two changes of one bucket at once.
    #[test]
    fn a_thread_that_ran_a_simulation_takes_the_shared_notes_again() {
        let route = crate::config::RouteConfig::new("r", crate::config::RouteMatch::any());
        let sim = Simulator::new(Config::new(vec![route]), None).unwrap();
        let profile = super::super::Scenario::FlashSale.profile();
        sim.run_profile(&profile, ArrivalModel::Uniform).unwrap();
        let live = crate::limiter::TokenBucket::new(100.0, Duration::from_secs(1), Nanos::ZERO);
        let mut beside = None;
        crate::limiter::gcra::with_a_change_held(&live, || {
            beside = Some(live.try_set_limit(50.0, Nanos::ZERO));
        });
        assert_eq!(beside, Some(false), "changed beside the held change");
    }

    /// A partitioned route's `route_limit` refusals are set apart from its key's own:
    /// in the summary (the total's part of `limit`) and slot by slot, and `None` on a
    /// route without one. Before, both were only among `limit`.
    #[test]
    fn a_routes_total_refusals_are_counted_apart() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/r\"\npartition = \"ip\"\n\
                    base_limit = 100\nroute_limit = 20\n\
                    [[routes]]\nname = \"s\"\npath_prefix = \"/s\"\npartition = \"ip\"\n";
        let config = Config::from_toml_str(toml, "test").unwrap();
        // 50 req/s for 10 s: under each key's limit of 100, over the total of 20.
        let profile = super::super::Profile::from_points(&[(0.0, 50.0), (10.0, 50.0)]).unwrap();
        let run = Simulator::new(config.clone(), Some("r"))
            .unwrap()
            .run_profile(&profile, ArrivalModel::Uniform)
            .unwrap();
        let s = &run.summary;
        let total = s.route_limit_rejected.expect("a route with a route_limit");
        assert!(total > 250 && total <= s.rejected, "{s:?}");
        assert_eq!(
            total, s.rejected_by_reason.limit,
            "the keys' own refused none"
        );
        let by_slot: u64 = run.series.iter().map(|r| r.route_limit_rejected).sum();
        assert_eq!(by_slot, total);
        let without = Simulator::new(config, Some("s"))
            .unwrap()
            .run_profile(&profile, ArrivalModel::Uniform)
            .unwrap();
        assert_eq!(without.summary.route_limit_rejected, None);
        assert!(without.series.iter().all(|r| r.route_limit_rejected == 0));
    }

    #[test]
    fn too_many_arrivals_reads_as_a_count_at_any_size() {
        let msg = |expected| SimError::TooManyArrivals { expected }.to_string();
        assert_eq!(
            msg(2_500_000_000.0),
            "the profile offers 2500000000 requests, more than 1000000000"
        );
        assert_eq!(
            msg(1e300),
            "the profile offers 1.00e300 requests, more than 1000000000"
        );
    }

    #[test]
    fn peak_slides_over_whole_rows() {
        let rows: Vec<SlotRow> = [1u64, 5, 5, 1, 9]
            .iter()
            .enumerate()
            .map(|(i, &n)| SlotRow {
                admitted: n,
                ..SlotRow::empty(i as f64)
            })
            .collect();
        assert_eq!(peak(&rows, 2, |r| r.admitted), (10, 1));
        assert_eq!(peak(&rows, 10, |r| r.admitted), (21, 0));
        assert_eq!(peak(&[], 10, |r| r.admitted), (0, 0));
    }

    #[test]
    fn a_routes_busiest_second_is_one_second_whatever_its_slot() {
        use crate::config::{RouteConfig, RouteMatch};
        use crate::window::WindowSpec;
        // 400 ms slots: 1 s is not a whole number of them.
        let mut route = RouteConfig::new("order", RouteMatch::any());
        route.window =
            WindowSpec::new(Duration::from_millis(3200), Duration::from_millis(400)).unwrap();
        route.controller.base_limit_rps = 1000.0;
        route.controller.cut_limit_rps = 500.0;
        let sim = Simulator::new(Config::new(vec![route]), None).unwrap();
        let steady = Profile::from_points(&[(0.0, 100.0), (10.0, 100.0)]).unwrap();
        let run = sim.run_profile_all(&steady, ArrivalModel::Uniform).unwrap();
        let s = &run.routes[0].summary;
        assert_eq!(s.admitted, 1000);
        assert_eq!((s.peak_admitted_1s, s.peak_offered_1s), (100, 100));
        assert_eq!(run.summary.peak_admitted_1s, 100);
    }

    #[test]
    fn the_busiest_second_is_one_the_series_shows_as_whole_slots() {
        use crate::config::{RouteConfig, RouteMatch};
        use crate::window::WindowSpec;
        // 250 ms slots, and 400 req/s from 0.25 s to 1.25 s: the second of the rows
        // from 0.25 s holds all 400, which the 100 ms grid passed over (380 at most,
        // from 0.2 s or 0.3 s).
        let mut route = RouteConfig::new("order", RouteMatch::any());
        route.window =
            WindowSpec::new(Duration::from_millis(2000), Duration::from_millis(250)).unwrap();
        route.controller.base_limit_rps = 1000.0;
        route.controller.cut_limit_rps = 1000.0;
        let sim = Simulator::new(Config::new(vec![route]), None).unwrap();
        let burst = Profile::from_points(&[
            (0.0, 0.0),
            (0.25, 0.0),
            (0.25, 400.0),
            (1.25, 400.0),
            (1.25, 0.0),
            (3.0, 0.0),
        ])
        .unwrap();
        let run = sim.run_profile_all(&burst, ArrivalModel::Uniform).unwrap();
        let r = &run.routes[0];
        let rows: Vec<u64> = r.series.iter().map(|row| row.admitted).collect();
        assert_eq!(rows[1..5].iter().sum::<u64>(), 400, "{rows:?}");
        let s = &r.summary;
        assert_eq!((s.peak_admitted_1s, s.peak_offered_1s), (400, 400));
        assert_eq!(s.peak_admitted_1s_at_s, 0.25);
        assert_eq!(run.summary.peak_admitted_1s, 400);
        assert_eq!(run.summary.peak_admitted_1s_at_s, 0.25);
    }

    /// One route of 40 ms slots, whose busiest second slides by its slot, and 400
    /// req/s from 0.02 s to 1.02 s: all routes together slid by 20 ms (the step that
    /// also met every 100 ms) and printed 400 from 0.02 s, a second the route's own
    /// peak (392 from 0 s) and its series do not show, for the same requests.
    #[test]
    fn one_route_and_all_routes_give_the_same_busiest_second() {
        use crate::config::{RouteConfig, RouteMatch};
        use crate::window::WindowSpec;
        let mut route = RouteConfig::new("order", RouteMatch::any());
        route.window =
            WindowSpec::new(Duration::from_millis(2000), Duration::from_millis(40)).unwrap();
        route.controller.base_limit_rps = 1000.0;
        route.controller.cut_limit_rps = 1000.0;
        let sim = Simulator::new(Config::new(vec![route]), None).unwrap();
        let burst = Profile::from_points(&[
            (0.0, 0.0),
            (0.02, 0.0),
            (0.02, 400.0),
            (1.02, 400.0),
            (1.02, 0.0),
            (3.0, 0.0),
        ])
        .unwrap();
        let run = sim.run_profile_all(&burst, ArrivalModel::Uniform).unwrap();
        let s = &run.routes[0].summary;
        assert_eq!((s.peak_admitted_1s, s.peak_admitted_1s_at_s), (392, 0.0));
        assert_eq!(
            (
                run.summary.peak_admitted_1s,
                run.summary.peak_admitted_1s_at_s
            ),
            (s.peak_admitted_1s, s.peak_admitted_1s_at_s)
        );
    }

    #[test]
    fn a_busiest_second_slides_by_a_step_that_meets_every_slot_edge() {
        let ms = |n: u64| n * 1_000_000;
        assert_eq!(peak_step(ms(100)), ms(100));
        assert_eq!(peak_step(ms(250)), ms(50));
        assert_eq!(peak_step(ms(125)), 25_000_000);
        assert_eq!(peak_step(ms(500)), ms(100));
        assert_eq!(peak_step(ms(1000)), ms(100));
        assert_eq!(peak_step(ms(40)), ms(40));
        // 1 s is not a whole number of 400 ms slots: their edges drift against any
        // second, and the grid stays at 100 ms.
        assert_eq!(peak_step(ms(400)), ms(100));
        assert_eq!(peak_step(0), ms(100));
    }

    /// All routes' busiest second slides by the longest step that meets each route's,
    /// never under 1 ms: 100 ms for routes whose slots' edges meet every 3.125 µs,
    /// where it stepped through 320,000 cells a second.
    #[test]
    fn all_routes_busiest_second_slides_by_a_step_of_1_ms_at_least() {
        let ms = |n: u64| n * 1_000_000;
        assert_eq!(all_routes_step([ms(40)].into_iter()), ms(40));
        assert_eq!(all_routes_step([ms(250), ms(40)].into_iter()), ms(10));
        assert_eq!(all_routes_step([ms(1), ms(100)].into_iter()), ms(1));
        assert_eq!(all_routes_step([1_953_125, 1_600_000].into_iter()), ms(100));
        assert_eq!(all_routes_step(std::iter::empty()), ms(100));
    }

    #[test]
    fn load_counts_overload_per_whole_second() {
        let mut load = Load::new(Some(2), PEAK_GRID_NS);
        let ms = |n: u64| n * 1_000_000;
        let over: Vec<bool> = [0, 100, 200, 900, 1_000, 1_500, 1_600, 2_100]
            .iter()
            .map(|&t| load.admit(ms(t)))
            .collect();
        assert_eq!(over, [false, false, true, true, false, false, true, false]);
        assert_eq!((load.overload, load.overload_s), (3, 2));
        let run = load.finish(&[], Some(2), 0.0, Nanos::from_secs(3));
        // Busiest 1 s on the 100 ms grid: 4, first in 0 s..1 s (again in 0.7 s..1.7 s).
        assert_eq!(run.peak_admitted_1s, 4);
        assert_eq!(run.peak_admitted_1s_at_s, 0.0);
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("order"), "order");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }

    #[test]
    fn a_simulator_is_built_only_from_routes_a_file_would_accept() {
        // A cut above the base: a file refuses it, and so does the simulator, which
        // used to replay it (the cut raising the limit from 20 to 60 req/s).
        let mut route = crate::config::RouteConfig::new("order", crate::config::RouteMatch::any());
        route.controller.base_limit_rps = 20.0;
        let config = Config::new(vec![route]);
        let want = "config: routes[0].cut_limit: must be ≤ base_limit (20), got 60";
        let e = Simulator::new(config.clone(), None).unwrap_err();
        assert!(matches!(e, SimError::Config(_)), "{e:?}");
        assert_eq!(e.to_string(), want);
        let e = Simulator::for_routes(config.clone(), &["order"]).unwrap_err();
        assert_eq!(e.to_string(), want);
        let options = super::super::LogOptions::default();
        let e = super::super::LogReader::new(&config, options).unwrap_err();
        assert_eq!(e.to_string(), want);
    }
}
