//! What the hints are computed from: each route's activity cut into fixed intervals,
//! kept in a bounded history.
//!
//! A [`History`] is fed three ways, none of them per request through a lock:
//! - [`History::on_slot`], from the engine's sample hook, once per completed window
//!   slot and route: ROC, controller state, demand;
//! - [`History::tick`], once per interval, with the engine's snapshots (cumulative
//!   counters, diffed here) and the [`UpstreamMeter`]'s counts;
//! - [`UpstreamMeter::record`], per forwarded request, into atomic buckets.
//!
//! An interval ends at the next tick: every `interval`, and (in `rocgate serve`) at
//! each scheduled event's start and end, so that no interval straddles the edge
//! between two profiles. Memory is bounded: the intervals that began in the last
//! `keep` per route (`keep ÷ interval`, and one more per edge of its events),
//! never more than twice `keep ÷ interval`, each with two sparse [`Sketch`]es (at most
//! one bucket per slot or per latency decade step). A route whose events have more
//! edges within `keep` than that leaves room folds intervals rather than lose any
//! ([`History::tick`]): two of one profile, next to each other among that profile's
//! intervals and the shortest such pair, become one, so the whole of `keep` stays and
//! no interval mixes two profiles; coarser intervals are the price.

use super::sketch::Sketch;
use crate::clock::{duration_nanos, Nanos};
use crate::config::Mode;
use crate::controller::{ControllerParams, ControllerState};
use crate::distinct::KeySketch;
use crate::engine::{RouteSnapshot, SlotReport};
use crate::limiter::{Algorithm, Reason};
use dashmap::DashMap;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Rejections by reason, indexed by [`Reason::index`].
pub type ReasonArray = [u64; Reason::ALL.len()];

/// One route's activity over one interval. Build one with [`Interval::new`] and set
/// its fields.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Interval {
    /// Start, on the engine's clock.
    pub start: Nanos,
    /// Length.
    pub length: Duration,
    /// Requests offered.
    pub offered: u64,
    /// Requests rejected, by reason.
    pub rejected: ReasonArray,
    /// Requests a shadow mode admitted but would have rejected, by the reason it
    /// would have rejected them for (in `shadow_adaptive`, only the cut's,
    /// [`Reason::RocCut`]: it enforces the base limit).
    pub shadow_rejected: ReasonArray,
    /// A partitioned route's `route_limit`: the requests it refused after their key's
    /// own limit admitted them (in `shadow` mode, would have), counted among
    /// `rejected` (`shadow_rejected`) as [`Reason::Limit`], or [`Reason::RocCut`] while
    /// a cut held: the part of those the keys' total refused, not a key's own limit.
    pub route_limit_rejected: u64,
    /// Every completed slot's ROC, in the route's mode.
    pub roc: Sketch,
    /// Seconds spent in each controller state, by [`ControllerState::as_index`].
    pub in_state: [f64; 3],
    /// Seconds of slots that ended with the route-level limiter exhausted (the bucket
    /// empty).
    pub exhausted_s: f64,
    /// Cuts that began in the interval.
    pub cuts: u32,
    /// The highest ROC that started a cut in the interval (0 without a cut).
    pub cut_roc: f64,
    /// The highest later-half-window demand seen at a slot's end, req/s.
    pub peak_demand_rps: f64,
    /// The most requests in flight seen at a slot's end, on a `concurrency` route
    /// limited as a whole (`None` elsewhere, or before a slot ended): in the units of
    /// its base limit.
    pub peak_in_flight: Option<f64>,
    /// What the upstream did, when it is measured (the proxy, or a modelled capacity).
    pub upstream: Option<UpstreamCounts>,
    /// The scheduled event whose profile was due when the interval began (`None`:
    /// the route's own): the profile its hints judge. In `serve` an interval ends at
    /// each event's edge, so the whole interval ran under it.
    pub event: Option<String>,
    /// The distinct keys a partitioned route refused in the interval, as a sketch
    /// (64 bytes; merged, a period's): `None` where it refused none, and on a route
    /// limited as a whole.
    pub refused_keys: Option<Box<KeySketch>>,
    /// A distributed route ([`RouteSettings::distributed`]): the fleet's demand, as
    /// Redis's answers to this instance gave it in the interval
    /// ([`History::fleet_demand`]); `None` where none did (Redis away, no decision,
    /// or no rate stored yet) and on a route limited by this instance alone.
    pub fleet_demand: Option<FleetDemand>,
    /// A partitioned route's `route_limit` on a fleet sharing a Redis store: the
    /// fewest instances it was shared by in the interval, as its start's and its
    /// end's settings said ([`RouteSettings::route_limit_instances`]), whose share of
    /// the route's requests this instance's figures hold; the fewest of those folded
    /// together. 0 (an interval built without it) reads as 1.
    pub route_limit_instances: u64,
}

/// The demand of every instance of a fleet on a distributed route over an interval,
/// as the shared controller stepped on it: its recent half-window's rate, req/s, as
/// the answers to this instance's decisions gave it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct FleetDemand {
    /// The mean over time of what the answers gave.
    pub mean_rps: f64,
    /// The highest.
    pub peak_rps: f64,
    /// The seconds the mean stands for: those in which an answer's figure stood (from
    /// the interval's first answer, less the stretches from a call Redis did not
    /// answer to the next answer). An interval measured only in part weighs by these,
    /// not by its length, where several are folded or averaged.
    pub measured_s: f64,
}

impl FleetDemand {
    /// The fleet's demand with mean `mean_rps` and peak `peak_rps`, measured over
    /// `measured_s` seconds.
    pub fn new(mean_rps: f64, peak_rps: f64, measured_s: f64) -> Self {
        FleetDemand {
            mean_rps,
            peak_rps,
            measured_s,
        }
    }

    /// This figure and `other` as one: the means weighted by the seconds each
    /// measured (the higher mean where neither measured any: a single answer taken
    /// at once), the higher peak, the seconds added.
    #[must_use]
    pub fn fold(self, other: FleetDemand) -> FleetDemand {
        let (a, b) = (self.measured_s, other.measured_s);
        let mean = if a + b > 0.0 {
            (self.mean_rps * a + other.mean_rps * b) / (a + b)
        } else {
            self.mean_rps.max(other.mean_rps)
        };
        FleetDemand::new(mean, self.peak_rps.max(other.peak_rps), a + b)
    }
}

impl Interval {
    /// An empty interval from `start`.
    pub fn new(start: Nanos, length: Duration) -> Self {
        Interval {
            start,
            length,
            ..Interval::default()
        }
    }

    /// Length in seconds (at least a nanosecond, so rates stay finite).
    pub fn secs(&self) -> f64 {
        self.length.as_secs_f64().max(1e-9)
    }

    /// The seconds `intervals` cover together: 0 for none (not the -0.0 of an empty
    /// float sum, which prints as "-0 s").
    pub fn total_secs(intervals: &[Interval]) -> f64 {
        intervals.iter().fold(0.0, |total, i| total + i.secs())
    }

    /// All rejections.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().sum()
    }

    /// All that a shadow mode would have rejected.
    pub fn shadow_rejected_total(&self) -> u64 {
        self.shadow_rejected.iter().sum()
    }

    /// Requests admitted.
    pub fn admitted(&self) -> u64 {
        self.offered.saturating_sub(self.rejected_total())
    }

    /// Seconds in `state`.
    pub fn time_in(&self, state: ControllerState) -> f64 {
        self.in_state[usize::from(state.as_index())]
    }

    /// Takes the activity of `earlier`, an interval of the same profile that began
    /// before it, into this one, as if one: lengths and counts added, sketches merged,
    /// peaks the higher. The start stays this one's, so that the two age out of `keep`
    /// with the newer part (what began in `keep` is never dropped with an older one).
    fn take_in(&mut self, earlier: &Interval) {
        self.length = self.length.saturating_add(earlier.length);
        self.offered += earlier.offered;
        for (mine, theirs) in self.rejected.iter_mut().zip(&earlier.rejected) {
            *mine += theirs;
        }
        for (mine, theirs) in self
            .shadow_rejected
            .iter_mut()
            .zip(&earlier.shadow_rejected)
        {
            *mine += theirs;
        }
        self.route_limit_rejected += earlier.route_limit_rejected;
        self.roc.merge(&earlier.roc);
        for (mine, theirs) in self.in_state.iter_mut().zip(&earlier.in_state) {
            *mine += theirs;
        }
        self.exhausted_s += earlier.exhausted_s;
        self.cuts = self.cuts.saturating_add(earlier.cuts);
        self.cut_roc = self.cut_roc.max(earlier.cut_roc);
        self.peak_demand_rps = self.peak_demand_rps.max(earlier.peak_demand_rps);
        self.peak_in_flight = match (self.peak_in_flight, earlier.peak_in_flight) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.upstream = match (self.upstream.take(), &earlier.upstream) {
            (Some(mut mine), Some(theirs)) => {
                mine.requests += theirs.requests;
                mine.errors += theirs.errors;
                mine.latency.merge(&theirs.latency);
                Some(mine)
            }
            (mine, theirs) => mine.or_else(|| theirs.clone()),
        };
        self.refused_keys = merge_keys(self.refused_keys.take(), earlier.refused_keys.as_deref());
        self.fleet_demand = match (self.fleet_demand, earlier.fleet_demand) {
            (Some(mine), Some(theirs)) => Some(mine.fold(theirs)),
            (mine, theirs) => mine.or(theirs),
        };
        self.route_limit_instances = self
            .route_limit_instances
            .max(1)
            .min(earlier.route_limit_instances.max(1));
    }

    /// The distinct keys refused over `intervals` together: their sketches merged
    /// (a key refused in several counts once), estimated; `None` where no interval has
    /// a sketch (a route limited as a whole).
    pub fn refused_keys(intervals: &[Interval]) -> Option<u64> {
        intervals
            .iter()
            .fold(None, |all, i| merge_keys(all, i.refused_keys.as_deref()))
            .map(|s| s.estimate())
    }
}

/// `a` and `b` merged; either alone if the other is `None`.
fn merge_keys(a: Option<Box<KeySketch>>, b: Option<&KeySketch>) -> Option<Box<KeySketch>> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.merge(b);
            Some(a)
        }
        (a, b) => a.or_else(|| b.map(|b| Box::new(*b))),
    }
}

/// Requests the upstream answered in one interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpstreamCounts {
    /// Requests forwarded.
    pub requests: u64,
    /// Of those, failed: a 5xx, a timeout or a connection error (or, simulated,
    /// admitted beyond the modelled capacity).
    pub errors: u64,
    /// Time to the response head, seconds (empty when not measured).
    pub latency: Sketch,
}

/// What a route is configured with, as the rules need it.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteSettings {
    /// Route name.
    pub name: String,
    /// Enforce or shadow.
    pub mode: Mode,
    /// The enforcing algorithm.
    pub algorithm: Algorithm,
    /// The controller's parameters in force.
    pub params: ControllerParams,
    /// Partitioned (`ip` or `header:`): `base_limit` is each key's, while `min_rps`
    /// and ROC are the route's whole demand, so the rules do not compare the two.
    pub partitioned: bool,
    /// Has tiers: a tier's rejections count as the base limit's do (reason `limit`),
    /// so what the base limit alone rejected is not observed.
    pub tiered: bool,
    /// A partitioned route's `route_limit`, its keys together, req/s, as configured
    /// for the profile (an event's, if it sets one; `None`: none). Its refusals ([`Interval::route_limit_rejected`]) are not the
    /// base limit's.
    pub route_limit_rps: Option<f64>,
    /// The instances `route_limit_rps` is shared by: 1, but on a fleet sharing a
    /// Redis store the live count the store last set
    /// ([`Engine::set_route_limit_share`](crate::engine::Engine::set_route_limit_share)),
    /// where this instance holds `route_limit_rps ÷` it and its history holds its share
    /// of the route's requests. Not part of the profile: a change of the count keeps
    /// the route's history, each interval holding the count it ran under
    /// ([`Interval::route_limit_instances`]).
    pub route_limit_instances: u64,
    /// Distributed (`rocgate serve` with a Redis `[store]` that shares the route):
    /// the base limit, window and controller are the fleet's, while the history holds
    /// this instance's share of the requests, and no slot of the shared controller
    /// (its ROC, cuts and restores are stepped on the fleet's window in Redis).
    pub distributed: bool,
    /// The scheduled event whose profile `params` are, if one was running: its
    /// `[[routes.events]]` entry is where a change to them belongs.
    pub event: Option<String>,
}

/// Upstream outcomes per route, recorded per forwarded request with atomics only.
#[derive(Debug, Default)]
pub struct UpstreamMeter {
    routes: DashMap<Arc<str>, MeterCell>,
}

/// Latency buckets of the meter: the [`Sketch`]'s own (each about 9% wide, from 1 ms),
/// so that an interval's sketch is exactly what recording each latency in it would
/// have made, whatever `latency_budget` it is judged by; the last one holds every
/// latency above 55 s (read as 60 s). 1 KiB a route.
const METER_BUCKETS: usize = 128;

#[derive(Debug)]
struct MeterCell {
    requests: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; METER_BUCKETS],
}

impl Default for MeterCell {
    fn default() -> Self {
        MeterCell {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A meter's cumulative counts for one route.
#[derive(Clone, Copy, Debug, PartialEq)]
struct MeterReading {
    requests: u64,
    errors: u64,
    buckets: [u64; METER_BUCKETS],
}

impl Default for MeterReading {
    fn default() -> Self {
        MeterReading {
            requests: 0,
            errors: 0,
            buckets: [0; METER_BUCKETS],
        }
    }
}

impl UpstreamMeter {
    /// An empty meter.
    pub fn new() -> Self {
        UpstreamMeter::default()
    }

    /// Records one forwarded request of `route`: how long the upstream took to answer
    /// (or to fail) and whether it failed.
    pub fn record(&self, route: &Arc<str>, took: Duration, failed: bool) {
        match self.routes.get(route) {
            Some(cell) => cell.record(took, failed),
            None => self
                .routes
                .entry(Arc::clone(route))
                .or_default()
                .record(took, failed),
        }
    }

    fn reading(&self, route: &str) -> Option<MeterReading> {
        let cell = self.routes.get(route)?;
        Some(MeterReading {
            requests: cell.requests.load(Ordering::Relaxed),
            errors: cell.errors.load(Ordering::Relaxed),
            buckets: std::array::from_fn(|i| cell.buckets[i].load(Ordering::Relaxed)),
        })
    }
}

impl MeterCell {
    fn record(&self, took: Duration, failed: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        let i = usize::from(Sketch::bucket(took.as_secs_f64())).min(METER_BUCKETS - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
    }
}

impl MeterReading {
    /// What happened between `before` and `self`.
    fn since(&self, before: &MeterReading) -> UpstreamCounts {
        let mut latency = Sketch::new();
        for (i, (&now, &then)) in (0u16..).zip(self.buckets.iter().zip(&before.buckets)) {
            latency.record_in(i, now.saturating_sub(then));
        }
        UpstreamCounts {
            requests: self.requests.saturating_sub(before.requests),
            errors: self.errors.saturating_sub(before.errors),
            latency,
        }
    }
}

/// Cumulative counters of one route at the last tick.
#[derive(Clone, Copy, Debug, Default)]
struct Totals {
    /// The route state the counters are of ([`RouteSnapshot::serial`]): a route that
    /// a reload rebuilt, or that was removed and added again, counts from zero.
    serial: u64,
    offered: u64,
    rejected: ReasonArray,
    shadow_rejected: ReasonArray,
    route_limit_rejected: u64,
    upstream: Option<MeterReading>,
}

#[derive(Debug)]
struct RouteHistory {
    /// The latest settings of each profile (the route's own, an event's) that an
    /// interval kept or open began under; the one in force last.
    profiles: Vec<RouteSettings>,
    done: VecDeque<Interval>,
    open: Interval,
    totals: Totals,
    last_state: ControllerState,
}

/// Every route's recent intervals.
#[derive(Debug)]
pub struct History {
    interval: Duration,
    /// How long an interval is kept after it began.
    keep: Duration,
    /// The most intervals kept per route: twice `keep ÷ interval`, room for the ticks
    /// at event edges between the regular ones (past it, intervals fold: [`fold`]).
    most: usize,
    routes: BTreeMap<String, RouteHistory>,
}

impl History {
    /// A history cutting time into `interval`s and keeping those that began in the
    /// last `keep` (at least two intervals' worth: the interval that closed last
    /// began more than one interval before the tick that closed it), at most twice
    /// `keep ÷ interval` of them per route.
    pub fn new(interval: Duration, keep: Duration) -> Self {
        let interval = interval.max(Duration::from_millis(1));
        let keep = keep.max(interval.saturating_mul(2));
        let regular = usize::try_from(keep.as_nanos() / interval.as_nanos()).unwrap_or(usize::MAX);
        History {
            interval,
            keep,
            most: regular.saturating_mul(2),
            routes: BTreeMap::new(),
        }
    }

    /// The interval length.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The open interval of `route` (its start and the profile it began under; its
    /// counts are filled in when it closes), or `None` if no tick has seen the route.
    pub fn open(&self, route: &str) -> Option<&Interval> {
        self.routes.get(route).map(|h| &h.open)
    }

    /// One completed slot of `route` (the engine's sample hook). Routes not seen by a
    /// [`History::tick`] yet are ignored.
    pub fn on_slot(&mut self, route: &str, report: &SlotReport) {
        let Some(h) = self.routes.get_mut(route) else {
            return;
        };
        let open = &mut h.open;
        if report.armed {
            open.roc.record(report.roc);
        }
        open.in_state[usize::from(report.state.as_index())] += report.slot.as_secs_f64();
        open.peak_demand_rps = open.peak_demand_rps.max(report.sample.rate_recent_rps);
        if let Some(n) = report.in_flight {
            open.peak_in_flight = Some(open.peak_in_flight.map_or(n, |peak| peak.max(n)));
        }
        if report.exhausted {
            open.exhausted_s += report.slot.as_secs_f64();
        }
        if report.state == ControllerState::Cut && h.last_state != ControllerState::Cut {
            open.cuts += 1;
            open.cut_roc = open.cut_roc.max(report.roc);
        }
        h.last_state = report.state;
    }

    /// The fleet's demand on the distributed `route` over its open interval (in `rocgate
    /// serve`, what Redis's answers gave, taken as the interval closes): the closed
    /// interval's [`Interval::fleet_demand`]. Routes not seen by a [`History::tick`]
    /// yet are ignored.
    pub fn fleet_demand(&mut self, route: &str, demand: FleetDemand) {
        if let Some(h) = self.routes.get_mut(route) {
            h.open.fleet_demand = Some(demand);
        }
    }

    /// Closes the open interval of every route in `snapshots` at `now` (counters
    /// are cumulative; a counter that went back, after a reload, counts from zero;
    /// the keys refused, [`RouteSnapshot::refused_keys`], are taken as the interval's
    /// own: the snapshot's taker empties them, [`crate::engine::Engine::take_refused_keys`])
    /// and opens the next. Past the most intervals kept per route (more edges than
    /// regular ticks within `keep`), two of one profile fold into one (the pair next
    /// to each other among that profile's intervals that is shortest together, dated
    /// by the newer) rather than drop out of `keep`. `settings` gives each route's configuration, in the order
    /// of `snapshots`: the profile due at `now`, under which the next interval is
    /// judged; where it differs from what the profile had (a reload, a runtime
    /// change), the profile's intervals so far are dropped, the one closed now too:
    /// they say nothing of the new settings. Called every `interval`, and at each
    /// event's start and end (an early tick: the interval then ends there). Intervals
    /// that began more than `keep`
    /// before `now` are dropped; routes gone from the engine keep their past intervals
    /// until they age out.
    pub fn tick(
        &mut self,
        now: Nanos,
        snapshots: &[RouteSnapshot],
        settings: impl IntoIterator<Item = RouteSettings>,
        upstream: Option<&UpstreamMeter>,
    ) {
        for (snap, settings) in snapshots.iter().zip(settings) {
            let totals = Totals {
                serial: snap.serial,
                offered: snap.offered,
                rejected: reason_array(&snap.rejected),
                shadow_rejected: reason_array(&snap.shadow_rejected),
                route_limit_rejected: snap.route_limit.map_or(0, |t| t.rejected),
                upstream: upstream.and_then(|u| u.reading(&snap.name)),
            };
            let interval = self.interval;
            let h = self
                .routes
                .entry(snap.name.clone())
                .or_insert_with(|| RouteHistory {
                    profiles: Vec::new(),
                    done: VecDeque::new(),
                    open: Interval {
                        event: settings.event.clone(),
                        route_limit_instances: settings.route_limit_instances,
                        ..Interval::new(now, interval)
                    },
                    totals,
                    last_state: snap.state,
                });
            let mut before = h.totals;
            if before.serial != totals.serial {
                // Another route state under the name: its counters began at zero (what
                // the old one counted since the last tick is not known). The upstream
                // meter goes by the name, and went on.
                before = Totals {
                    upstream: before.upstream,
                    ..Totals::default()
                };
            }
            let open = &mut h.open;
            open.length = now.saturating_since(open.start);
            open.offered = delta(totals.offered, before.offered);
            for (i, n) in totals.rejected.iter().enumerate() {
                open.rejected[i] = delta(*n, before.rejected[i]);
            }
            for (i, n) in totals.shadow_rejected.iter().enumerate() {
                open.shadow_rejected[i] = delta(*n, before.shadow_rejected[i]);
            }
            open.route_limit_rejected =
                delta(totals.route_limit_rejected, before.route_limit_rejected);
            open.upstream = totals
                .upstream
                .map(|now| now.since(&before.upstream.unwrap_or_default()));
            open.refused_keys = snap.refused_keys.filter(|s| !s.is_empty()).map(Box::new);
            open.route_limit_instances = open
                .route_limit_instances
                .min(settings.route_limit_instances);
            h.totals = totals;
            let next = Interval {
                event: settings.event.clone(),
                route_limit_instances: settings.route_limit_instances,
                ..Interval::new(now, interval)
            };
            let mut closed = std::mem::replace(open, next);
            closed.roc.compact();
            if let Some(u) = &mut closed.upstream {
                u.latency.compact();
            }
            if !closed.length.is_zero() {
                h.done.push_back(closed);
            }
            let oldest = now.as_u64().saturating_sub(duration_nanos(self.keep));
            while h.done.front().is_some_and(|i| i.start.as_u64() < oldest) {
                h.done.pop_front();
            }
            while h.done.len() > self.most {
                fold(&mut h.done);
            }
            // Settings changed for the profile (a reload, a runtime change): its
            // intervals so far, the one just closed too, were under others. Judged
            // against the new ones, rejections at a base limit of 200 read as the
            // raised one's, and a raise already made was advised again, and again.
            if h.profiles
                .iter()
                .any(|p| p.event == settings.event && !same_profile(p, &settings))
            {
                h.done.retain(|i| i.event != settings.event);
            }
            h.profiles.retain(|p| p.event != settings.event);
            h.profiles.push(settings);
            let (done, open) = (&h.done, &h.open);
            h.profiles
                .retain(|p| p.event == open.event || done.iter().any(|i| i.event == p.event));
        }
        let keep = self.keep;
        self.routes
            .retain(|_, h| now.saturating_since(h.open.start) <= keep);
    }

    /// Each route's closed intervals that started at or after `since`, grouped by the
    /// profile they began under (the route's own, or a scheduled event's), each group
    /// with that profile's latest settings, in the order each profile first appears. A
    /// route without such intervals has one group, empty, with the settings in force.
    pub fn since(&self, since: Nanos) -> Vec<(RouteSettings, Vec<Interval>)> {
        let mut groups = Vec::new();
        for h in self.routes.values() {
            let first = groups.len();
            for i in h.done.iter().filter(|i| i.start >= since) {
                let group = groups[first..]
                    .iter()
                    .position(|(s, _): &(RouteSettings, Vec<Interval>)| s.event == i.event);
                match group {
                    Some(g) => groups[first + g].1.push(i.clone()),
                    None => {
                        if let Some(p) = h.profiles.iter().find(|p| p.event == i.event) {
                            groups.push((p.clone(), vec![i.clone()]));
                        }
                    }
                }
            }
            if groups.len() == first {
                if let Some(p) = h.profiles.last() {
                    groups.push((p.clone(), Vec::new()));
                }
            }
        }
        groups
    }
}

/// One interval fewer in `done`, none of `keep` lost and no two profiles mixed: of
/// the pairs of intervals of one profile that are next to each other among that
/// profile's intervals (as its part of a period is judged), the shortest together
/// (the oldest of those) becomes one, at the newer one's place and start
/// ([`Interval::take_in`]): the older one's activity is dated later, and may outstay
/// `keep` by its length, rather than the newer one's go early. Only when every
/// interval is of a profile of its own (more events than room) does the oldest go.
fn fold(done: &mut VecDeque<Interval>) {
    let mut last: Vec<(&Option<String>, usize)> = Vec::new();
    let mut best: Option<(Duration, usize, usize)> = None;
    for (k, i) in done.iter().enumerate() {
        match last.iter_mut().find(|(event, _)| **event == i.event) {
            Some((_, at)) => {
                let length = done[*at].length.saturating_add(i.length);
                if best.is_none_or(|(shortest, _, _)| length < shortest) {
                    best = Some((length, *at, k));
                }
                *at = k;
            }
            None => last.push((&i.event, k)),
        }
    }
    match best {
        Some((_, older, later)) => {
            if let Some(older) = done.remove(older) {
                done[later - 1].take_in(&older);
            }
        }
        None => {
            done.pop_front();
        }
    }
}

/// `now − before`, or `now` when the counter restarted.
fn delta(now: u64, before: u64) -> u64 {
    if now >= before {
        now - before
    } else {
        now
    }
}

/// Counts by reason as an array indexed by [`Reason::index`].
pub fn reason_array(counts: &[(Reason, u64)]) -> ReasonArray {
    let mut out = [0; Reason::ALL.len()];
    for &(r, n) in counts {
        out[r.index()] += n;
    }
    out
}

/// Whether `a` and `b` are one profile: alike but for the count of instances
/// sharing the route's `route_limit` ([`RouteSettings::route_limit_instances`]),
/// which moves with the fleet, not with the route's configuration.
fn same_profile(a: &RouteSettings, b: &RouteSettings) -> bool {
    let a = RouteSettings {
        route_limit_instances: b.route_limit_instances,
        ..a.clone()
    };
    a == *b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RouteConfig, RouteMatch};
    use crate::engine::{Engine, Key};
    use crate::window::RocSample;
    use std::time::UNIX_EPOCH;

    fn settings(name: &str) -> RouteSettings {
        RouteSettings {
            name: name.into(),
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

    /// The engine of `route` alone, and a history of it in 1 s intervals kept 3 s,
    /// ticked with `settings` at 0 s and at 1 s around 250 requests sent to the route
    /// at 0 s.
    fn ticked_around_250_at_once(
        route: RouteConfig,
        settings: impl Fn() -> RouteSettings,
    ) -> (Engine, History) {
        let engine = Engine::new(
            &crate::config::Config::new(vec![route]),
            Nanos::ZERO,
            UNIX_EPOCH,
        )
        .unwrap();
        let mut h = History::new(Duration::from_secs(1), Duration::from_secs(3));
        let s = Nanos::from_secs;
        h.tick(s(0), &engine.snapshot(s(0)), [settings()], None);
        for _ in 0..250 {
            let _ = engine.check(engine.route_at(0).unwrap(), Key::None, s(0));
        }
        h.tick(s(1), &engine.snapshot(s(1)), [settings()], None);
        (engine, h)
    }

    fn report(at_ms: u64, roc: f64, state: ControllerState) -> SlotReport {
        SlotReport {
            at: Nanos::new(at_ms * 1_000_000),
            slot: Duration::from_millis(100),
            sample: RocSample {
                n_prev: 0,
                n_recent: 0,
                rate_prev_rps: 0.0,
                rate_recent_rps: roc,
                roc,
            },
            roc,
            state,
            limit_rps: 60.0,
            exhausted: state == ControllerState::Cut,
            in_flight: None,
            armed: true,
        }
    }

    /// A distributed route's fleet demand, given for its open interval, is the closed
    /// interval's; the next interval has none until given; two intervals folded into
    /// one weigh each's mean by the seconds it measured (not its length: one measured
    /// a quarter of its second weighs a quarter) and keep the higher peak.
    #[test]
    fn the_fleet_demand_given_is_the_closed_intervals_and_folds_by_length() {
        let config = crate::config::Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let mut h = History::new(Duration::from_secs(1), Duration::from_secs(60));
        let s = Nanos::from_secs;
        let shared = RouteSettings {
            distributed: true,
            ..settings("r")
        };
        h.fleet_demand("r", FleetDemand::new(1.0, 1.0, 1.0));
        h.tick(s(0), &engine.snapshot(s(0)), [shared.clone()], None);
        h.fleet_demand("r", FleetDemand::new(600.0, 700.0, 0.25));
        h.tick(s(1), &engine.snapshot(s(1)), [shared.clone()], None);
        h.tick(s(2), &engine.snapshot(s(2)), [shared.clone()], None);
        let kept = &h.since(Nanos::ZERO)[0].1;
        let demand: Vec<_> = kept.iter().map(|i| i.fleet_demand).collect();
        assert_eq!(demand, [Some(FleetDemand::new(600.0, 700.0, 0.25)), None]);
        let mut later = Interval::new(s(3), Duration::from_secs(3));
        later.fleet_demand = Some(FleetDemand::new(200.0, 300.0, 1.75));
        later.take_in(&kept[0]);
        assert_eq!(
            later.fleet_demand,
            Some(FleetDemand::new(250.0, 700.0, 2.0))
        );
        later.take_in(&kept[1]);
        assert_eq!(
            later.fleet_demand,
            Some(FleetDemand::new(250.0, 700.0, 2.0))
        );
    }

    /// `keep` of one interval keeps two: the interval closed by a tick a little late
    /// began more than one interval before it, and was dropped as it closed.
    #[test]
    fn a_keep_of_one_interval_still_keeps_the_one_closed_last() {
        let config = crate::config::Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let mut h = History::new(Duration::from_secs(10), Duration::from_secs(10));
        h.tick(
            Nanos::ZERO,
            &engine.snapshot(Nanos::ZERO),
            [settings("r")],
            None,
        );
        for k in 0..1000 {
            let _ = engine.check(
                engine.route_at(0).unwrap(),
                Key::None,
                Nanos::from_millis(k * 10),
            );
        }
        let late = Nanos::from_millis(10_002);
        h.tick(late, &engine.snapshot(late), [settings("r")], None);
        let kept = h.since(Nanos::ZERO);
        assert_eq!(kept[0].1.len(), 1);
        assert_eq!(kept[0].1[0].offered, 1000);
    }

    #[test]
    fn ticks_diff_counters_and_slots_fill_the_open_interval() {
        let config = crate::config::Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let meter = UpstreamMeter::new();
        let mut h = History::new(Duration::from_secs(1), Duration::from_secs(3));
        let s = Nanos::from_secs;
        h.tick(s(0), &engine.snapshot(s(0)), [settings("r")], Some(&meter));
        for _ in 0..250 {
            let _ = engine.check(engine.route_at(0).unwrap(), Key::None, s(0));
        }
        let route: Arc<str> = "r".into();
        meter.record(&route, Duration::from_millis(30), false);
        meter.record(&route, Duration::from_millis(700), true);
        // Before the controller acts, ROC compares with an earlier half still filling:
        // not recorded.
        let mut unarmed = report(50, 150.0, ControllerState::Normal);
        unarmed.sample.rate_recent_rps = 40.0;
        unarmed.armed = false;
        h.on_slot("r", &unarmed);
        h.on_slot("r", &report(100, 90.0, ControllerState::Cut));
        h.on_slot("r", &report(200, 10.0, ControllerState::Cut));
        h.on_slot("r", &report(300, 5.0, ControllerState::Recovering));
        h.on_slot("elsewhere", &report(300, 5.0, ControllerState::Cut));
        h.tick(s(1), &engine.snapshot(s(1)), [settings("r")], Some(&meter));

        let all = h.since(Nanos::ZERO);
        assert_eq!(all.len(), 1);
        let i = &all[0].1[0];
        assert_eq!((i.offered, i.rejected_total()), (250, 50), "bucket of 200");
        assert_eq!((i.cuts, i.cut_roc), (1, 90.0));
        assert!((i.time_in(ControllerState::Cut) - 0.2).abs() < 1e-9);
        assert!((i.exhausted_s - 0.2).abs() < 1e-9);
        assert_eq!(i.roc.count(), 3);
        assert!(i.roc.max().is_some_and(|m| m < 150.0), "{:?}", i.roc.max());
        assert_eq!(i.peak_demand_rps, 90.0);
        let up = i.upstream.as_ref().unwrap();
        assert_eq!((up.requests, up.errors), (2, 1));
        // 700 ms, in its bucket's upper bound (at most 9% above).
        let max = up.latency.max().unwrap();
        assert!((0.7..=0.7 * 1.0906).contains(&max), "{max}");

        // The next interval counts only what came after.
        let _ = engine.check(engine.route_at(0).unwrap(), Key::None, s(1));
        h.tick(s(2), &engine.snapshot(s(2)), [settings("r")], Some(&meter));
        let all = h.since(s(1));
        assert_eq!(all[0].1.len(), 1);
        assert_eq!(all[0].1[0].offered, 1);
        assert_eq!(all[0].1[0].upstream.as_ref().unwrap().requests, 0);
    }

    /// What a shadow route would have rejected is kept by reason, as the engine's
    /// snapshot counts it, so that a verdict can say which setting would have
    /// rejected it: the bucket of 200 would have rejected 50 of 250 for `limit`.
    #[test]
    fn ticks_keep_shadow_rejections_by_reason() {
        let mut route = RouteConfig::new("r", RouteMatch::any());
        route.mode = Mode::Shadow;
        let (_, h) = ticked_around_250_at_once(route, || settings("r"));
        let all = h.since(Nanos::ZERO);
        let i = &all[0].1[0];
        assert_eq!(i.rejected_total(), 0);
        assert_eq!(i.shadow_rejected[Reason::Limit.index()], 50);
        assert_eq!(i.shadow_rejected_total(), 50);
    }

    /// A partitioned route's `route_limit` refusals are kept per interval apart, as
    /// the engine's snapshot counts them (of 250 at once, the keys' own limit of 200
    /// refuses 50, a total of 100 another 100), each interval its own.
    #[test]
    fn ticks_keep_the_totals_refusals_apart() {
        let mut route = RouteConfig::new("r", RouteMatch::any());
        route.partition = crate::config::Partition::ClientIp(Default::default());
        route.route_limit_rps = Some(100.0);
        let keyed = || RouteSettings {
            partitioned: true,
            route_limit_rps: Some(100.0),
            route_limit_instances: 1,
            ..settings("r")
        };
        let (engine, mut h) = ticked_around_250_at_once(route, keyed);
        let s = Nanos::from_secs;
        h.tick(s(2), &engine.snapshot(s(2)), [keyed()], None);
        let all = h.since(Nanos::ZERO);
        let i = &all[0].1;
        assert_eq!(i[0].route_limit_rejected, 100);
        assert_eq!(i[0].rejected[Reason::Limit.index()], 150);
        assert_eq!(i[1].route_limit_rejected, 0);
        // A fleet's count of instances sharing the total moves with the fleet, not
        // the route's configuration: the history is kept, each interval with the
        // fewest instances it ran under, at its start or its end (a changed total
        // drops it, as any change of the profile).
        let shared = RouteSettings {
            route_limit_instances: 3,
            ..keyed()
        };
        h.tick(s(3), &engine.snapshot(s(3)), [shared.clone()], None);
        let all = h.since(Nanos::ZERO);
        assert_eq!((all[0].1.len(), &all[0].0), (3, &shared));
        let counts = |h: &History| -> Vec<u64> {
            h.since(Nanos::ZERO)[0]
                .1
                .iter()
                .map(|i| i.route_limit_instances)
                .collect()
        };
        assert_eq!(counts(&h), [1, 1, 1]);
        h.tick(s(4), &engine.snapshot(s(4)), [shared.clone()], None);
        assert_eq!(counts(&h), [1, 1, 3]);
        let shrunk = RouteSettings {
            route_limit_instances: 2,
            ..shared.clone()
        };
        h.tick(s(5), &engine.snapshot(s(5)), [shrunk], None);
        assert_eq!(counts(&h), [1, 3, 2]);
        // Folded, the fewer: a capacity read from them counts for no larger a fleet.
        let kept = &h.since(Nanos::ZERO)[0].1;
        let mut folded = kept[1].clone();
        folded.take_in(&kept[2]);
        assert_eq!(folded.route_limit_instances, 2);
        let mut unset = Interval::new(s(9), Duration::from_secs(1));
        unset.take_in(&kept[1]);
        assert_eq!(unset.route_limit_instances, 1);
        let raised = RouteSettings {
            route_limit_rps: Some(200.0),
            ..shared
        };
        h.tick(s(6), &engine.snapshot(s(6)), [raised], None);
        assert!(h.since(Nanos::ZERO)[0].1.is_empty());
    }

    /// A concurrency route's slots say how many requests were in flight: the interval
    /// keeps the most, in the base limit's units; a route without them has none.
    #[test]
    fn the_open_interval_keeps_the_most_in_flight() {
        let config = crate::config::Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let mut h = History::new(Duration::from_secs(1), Duration::from_secs(3));
        let s = Nanos::from_secs;
        h.tick(s(0), &engine.snapshot(s(0)), [settings("r")], None);
        h.tick(s(1), &engine.snapshot(s(1)), [settings("r")], None);
        for (at, n) in [(1_100, 3.0), (1_200, 7.0), (1_300, 2.0)] {
            let mut r = report(at, 1.0, ControllerState::Normal);
            r.in_flight = Some(n);
            h.on_slot("r", &r);
        }
        h.tick(s(2), &engine.snapshot(s(2)), [settings("r")], None);
        let kept: Vec<_> = h.since(Nanos::ZERO)[0]
            .1
            .iter()
            .map(|i| i.peak_in_flight)
            .collect();
        assert_eq!(kept, [None, Some(7.0)]);
    }

    /// A period that spans a scheduled event is judged in two parts: the intervals
    /// that began under the route's own profile against it, those that began during
    /// the event against the event's.
    #[test]
    fn intervals_are_judged_against_the_profile_they_began_under() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:01:40Z\"\n\
                    duration = \"1m\"\nbase_limit = 500\ncut_limit = 150\n";
        let config = crate::config::Config::from_toml_str(toml, "test").unwrap();
        // The engine starts at wall time 0: the sale runs from 100 s to 160 s.
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let mut h = History::new(Duration::from_secs(10), Duration::from_secs(3600));
        for t in (95..=185).step_by(10) {
            let now = Nanos::from_secs(t);
            engine.catch_up(engine.route_at(0).unwrap(), now);
            h.tick(
                now,
                &engine.snapshot(now),
                [engine.route_settings(engine.route_at(0).unwrap()).unwrap()],
                None,
            );
        }
        let groups = h.since(Nanos::ZERO);
        let summary: Vec<_> = groups
            .iter()
            .map(|(s, intervals)| {
                let starts: Vec<u64> = intervals
                    .iter()
                    .map(|i| i.start.as_u64() / 1_000_000_000)
                    .collect();
                (s.event.clone(), s.params.base_limit_rps, starts)
            })
            .collect();
        assert_eq!(
            summary,
            [
                (None, 200.0, vec![95, 165, 175]),
                (
                    Some("sale".into()),
                    500.0,
                    vec![105, 115, 125, 135, 145, 155]
                ),
            ]
        );
        // From the event's first interval on: the event's group comes first.
        let from_sale: Vec<_> = h
            .since(Nanos::from_secs(105))
            .iter()
            .map(|(s, intervals)| (s.event.clone(), intervals.len()))
            .collect();
        assert_eq!(from_sale, [(Some("sale".into()), 6), (None, 2)]);
    }

    /// Ticks at event edges cut intervals short: what is kept is the intervals that
    /// began in the last `keep`, not `keep ÷ interval` of them (which would have kept
    /// half of it here), and never more than twice that many.
    #[test]
    fn intervals_cut_short_at_edges_keep_the_whole_period() {
        let config = crate::config::Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let mut h = History::new(Duration::from_secs(1), Duration::from_secs(3));
        for t in 0..=20 {
            let now = Nanos::from_millis(t * 500);
            h.tick(now, &engine.snapshot(now), [settings("r")], None);
        }
        let kept = &h.since(Nanos::ZERO)[0].1;
        let starts: Vec<u64> = kept.iter().map(|i| i.start.as_u64() / 1_000_000).collect();
        assert_eq!(starts, [7000, 7500, 8000, 8500, 9000, 9500]);
        // Ticks every 100 ms: six kept, the most for keep ÷ interval = 3, folded so
        // that they still hold the 30 that began in the last 3 s (the cap kept the
        // last six, 600 ms).
        for t in 101..=200 {
            let now = Nanos::from_millis(t * 100);
            h.tick(now, &engine.snapshot(now), [settings("r")], None);
        }
        let kept = &h.since(Nanos::ZERO)[0].1;
        assert_eq!(kept.len(), 6);
        assert!(kept[0].start >= Nanos::from_secs(17), "{:?}", kept[0].start);
        let covered = Interval::total_secs(kept);
        assert!((3.0..3.5).contains(&covered), "{covered}");
    }

    /// The profile an interval is judged under is the one due when it begins, by the
    /// events' schedule, even on a route that no request has rolled over into it yet;
    /// the edges are where the proxy ticks early.
    #[test]
    fn event_edges_and_the_profile_due_come_from_the_schedule() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n\
                    [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T00:01:40Z\"\n\
                    duration = \"1m\"\nbase_limit = 500\ncut_limit = 150\n";
        let config = crate::config::Config::from_toml_str(toml, "test").unwrap();
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let id = engine.route_at(0).unwrap();
        let s = Nanos::from_secs;
        assert_eq!(engine.next_event_edge(Nanos::ZERO), Some(s(100)));
        assert_eq!(engine.next_event_edge(s(100)), Some(s(160)));
        assert_eq!(engine.next_event_edge(s(160)), None);
        let due = engine.route_settings_at(id, s(100)).unwrap();
        assert_eq!(
            (due.event.as_deref(), due.params.base_limit_rps),
            (Some("sale"), 500.0)
        );
        // Not in force yet: no request has rolled the route past the edge.
        assert_eq!(engine.route_settings(id).unwrap().event, None);
        let after = engine.route_settings_at(id, s(160)).unwrap();
        assert_eq!((after.event, after.params.base_limit_rps), (None, 200.0));
    }

    /// More edges within `keep` than `keep ÷ interval` (an event every half second,
    /// each 250 ms long, against 1 s intervals kept 3 s: 12 intervals where 6 fit):
    /// the oldest intervals went to the cap, half of `keep` lost, though they began
    /// within it. They fold instead, each with the next of its own profile: every
    /// request of the last 3 s is kept, each under the profile it came in, and no more
    /// intervals than the cap.
    #[test]
    fn more_edges_than_room_fold_intervals_and_lose_none_of_keep() {
        let config = crate::config::Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let id = engine.route_at(0).unwrap();
        let mut h = History::new(Duration::from_secs(1), Duration::from_secs(3));
        let profile = |sale: bool| RouteSettings {
            event: sale.then(|| "sale".to_owned()),
            ..settings("r")
        };
        // From k × 250 ms: the sale's profile in every other quarter second, with 1
        // request in it; 10 in the route's own quarters.
        let (mut own, mut sale) = (0u64, 0u64);
        for k in 0..=40u64 {
            let now = Nanos::from_millis(k * 250);
            let during = k % 2 == 1;
            h.tick(now, &engine.snapshot(now), [profile(during)], None);
            let n = if during { 1 } else { 10 };
            for _ in 0..n {
                let _ = engine.check(id, Key::None, now);
            }
            // Those that began within the last 3 s before the last tick, at 10 s.
            if k < 40 && k * 250 >= 7_000 {
                *if during { &mut sale } else { &mut own } += n;
            }
        }
        assert_eq!((own, sale), (60, 6));
        let kept = h.since(Nanos::from_secs(7));
        let mut intervals = 0;
        for (s, part) in &kept {
            let per_quarter = if s.event.is_some() { 1 } else { 10 };
            let offered: u64 = part.iter().map(|i| i.offered).sum();
            assert!(
                offered >= if s.event.is_some() { sale } else { own },
                "{:?}: {offered} of {own} and {sale}",
                s.event
            );
            for i in part {
                assert_eq!(i.event, s.event);
                let quarters = (i.length.as_millis() / 250) as u64;
                assert_eq!(i.offered, per_quarter * quarters, "{i:?}");
            }
            intervals += part.len();
        }
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(intervals <= 6, "at most twice keep ÷ interval: {intervals}");
    }

    #[test]
    fn history_is_bounded_and_gone_routes_age_out() {
        let config = crate::config::Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).unwrap();
        let mut h = History::new(Duration::from_secs(1), Duration::from_secs(3));
        for t in 0..10 {
            let now = Nanos::from_secs(t);
            h.tick(now, &engine.snapshot(now), [settings("r")], None);
        }
        let kept = h.since(Nanos::ZERO);
        assert_eq!(kept[0].1.len(), 3);
        assert_eq!(kept[0].1[0].start, Nanos::from_secs(6));
        // No snapshot of the route any more: it ages out after `keep`.
        for t in 10..15 {
            h.tick(Nanos::from_secs(t), &[], Vec::new(), None);
        }
        assert!(h.since(Nanos::ZERO).is_empty());
    }
}
