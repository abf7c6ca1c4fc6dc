//! The engine: route table, partitions, windows, controllers and limiters behind one call.
//!
//! [`Engine::check`] decides one request: count it in the route's window (one relaxed
//! atomic add), and, if its slot is later than the one accumulating, advance the
//! window and step the controller first; then ask the limiter (one CAS on the bucket
//! word). Only the one request that wins a slot rollover takes the route's state lock,
//! with `try_lock`: on a route as a whole no request ever waits for another. On a
//! partitioned route a request may wait briefly on its key's shard of the key table
//! while another request inserts a key there or sweeps idle keys out. Nothing
//! allocates unless a new key enters a partitioned route.
//!
//! ```
//! use rocgate::clock::Nanos;
//! use rocgate::config::{Config, RouteConfig, RouteMatch};
//! use rocgate::engine::{Engine, Key};
//! use std::time::SystemTime;
//!
//! // Every other setting at its default: a token bucket of one second at the base
//! // limit (200 req/s), cut to 60 req/s.
//! let route = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
//! let engine = Engine::new(&Config::new(vec![route]), Nanos::ZERO, SystemTime::UNIX_EPOCH)?;
//! let id = engine.route_for("POST", "/api/order").unwrap();
//! let admitted = (0..300).filter(|_| engine.check(id, Key::None, Nanos::ZERO).is_admit()).count();
//! assert_eq!(admitted, 200); // one second of burst at the base limit
//! # Ok::<(), rocgate::config::ConfigError>(())
//! ```

use crate::clock::Nanos;
use crate::config::{
    Config, ConfigError, Event, KeyLimits, Mode, Partition, Problem, RouteConfig, RouteMatch, Tier,
    MAX_KEY_VALUE_BYTES,
};
use crate::controller::{
    Controller, ControllerParams, ControllerState, Transition, TransitionCounts,
};
use crate::limiter::{
    gcra, interval_ns, reject, words, Admit, Algorithm, Concurrency, Decision, Level, Limiter,
    Pace, Reason, Rejection,
};
use crate::route_index::RouteIndex;
use crate::sync::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use crate::window::{RocMode, RocSample, SampleAt, SlotCounter, SlotRing, WindowSpec};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime};

/// A route of an [`Engine`], as [`Engine::route_for`], [`Engine::route_id`],
/// [`Engine::route_at`] or [`Engine::route_ids`] found it: it cannot be made any other
/// way, so every id names a route some engine built.
///
/// An id names the route's live state (its window, controller, limiters, keys), not
/// its position: it stays good across [`Engine::reload`] for as long as the reload
/// keeps that state (a route whose name and structure are unchanged), wherever the
/// route then stands in the table. It names no route of an engine that does not hold
/// that state: a route rebuilt or removed by a reload, or a route of an engine built
/// separately (even from the same configuration). Given such an id, the engine's
/// methods never panic: [`Engine::check`] admits the request uncounted (as a request
/// no route matches passes through the layer), [`Engine::give_back`] gives nothing
/// back, [`Engine::record`] and [`Engine::catch_up`] do nothing,
/// [`Engine::update_route`] is an error, and the accessors return `None`. Looking the
/// route up again on the engine in use (per request, as the layer does, or after each
/// reload) is what keeps a request counted.
///
/// ```
/// use rocgate::clock::Nanos;
/// use rocgate::config::{Config, RouteConfig, RouteMatch};
/// use rocgate::engine::{Engine, Key};
/// use std::time::UNIX_EPOCH;
///
/// let route = |name: &str| RouteConfig::new(name, RouteMatch::prefix(format!("/{name}")));
/// let engine = Engine::new(&Config::new(vec![route("a"), route("b")]), Nanos::ZERO, UNIX_EPOCH)?;
/// let b = engine.route_for("GET", "/b/1").unwrap();
///
/// // `b` moves to the front and keeps its state: the id still names it.
/// let swapped = engine.reload(&Config::new(vec![route("b"), route("a")]), Nanos::ZERO, UNIX_EPOCH)?;
/// assert_eq!(swapped.route_name(b), Some("b"));
///
/// // `b` is removed: the id names no route, and nothing panics.
/// let without_b = swapped.reload(&Config::new(vec![route("a")]), Nanos::ZERO, UNIX_EPOCH)?;
/// assert_eq!(without_b.route_name(b), None);
/// assert!(without_b.check(b, Key::None, Nanos::ZERO).is_admit());
/// # Ok::<(), rocgate::config::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteId {
    /// Where the route stood in the table of the engine that gave the id.
    index: usize,
    /// The route's [`Route::serial`]: which state the id names.
    serial: NonZeroU64,
}

impl RouteId {
    /// The route's position in the table of the engine that gave this id: its index in
    /// that engine's configuration (`Config::routes`), which is also its match order.
    pub fn index(self) -> usize {
        self.index
    }
}

/// The partition key of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Key<'a> {
    /// No key: the route-level limiter, or a shared anonymous key on partitioned routes.
    None,
    /// The client's IP address.
    Ip(IpAddr),
    /// A header value (API key, user id), of any length: a table keeps one of up to
    /// [`MAX_KEY_VALUE_BYTES`] bytes whole and a longer one by a 128-bit digest of it.
    Value(&'a str),
}

/// A [`Key`] as the key tables take it, and owned: a header value by its 16-byte
/// [`ValueKey`] (the value whole up to [`MAX_KEY_VALUE_BYTES`], else a digest), made
/// once per request. A paced request keeps it to give its place back with, holding no
/// copy of its header value however long.
#[derive(Clone, Copy)]
pub(crate) enum TableKey {
    /// No key.
    None,
    /// A client IP, cut to its route's `ipv6_prefix` by the table.
    Ip(IpAddr),
    /// A header value.
    Value(ValueKey),
}

impl TableKey {
    /// The table key of `key`.
    #[inline]
    pub(crate) fn of(key: Key<'_>) -> Self {
        match key {
            Key::None => TableKey::None,
            Key::Ip(ip) => TableKey::Ip(ip),
            Key::Value(v) => TableKey::Value(ValueKey::new(v)),
        }
    }
}

/// Called with each controller transition: the route's name and the transition.
pub type TransitionHook = Arc<dyn Fn(&str, &Transition) + Send + Sync>;

/// Called with every completed slot: the route's name and what the controller saw and
/// did. Once per slot and route, never per request.
pub type SampleHook = Arc<dyn Fn(&str, &SlotReport) + Send + Sync>;

/// One completed window slot of a route, as the controller saw it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlotReport {
    /// End of the slot, on the engine's clock.
    pub at: Nanos,
    /// The slot's length.
    pub slot: Duration,
    /// The window's reading at the slot's end.
    pub sample: RocSample,
    /// ROC in the route's mode.
    pub roc: f64,
    /// The controller's state after this sample.
    pub state: ControllerState,
    /// The controller's limit after this sample, req/s.
    pub limit_rps: f64,
    /// Whether the route-level limiter had no room left when the slot was closed (no
    /// token, a full window, queue or set of permits). Always false on partitioned
    /// routes, whose limiters are per key.
    pub exhausted: bool,
    /// Requests in flight when the slot was closed, on a `concurrency` route limited as
    /// a whole (`None` with other algorithms and on partitioned routes, whose limiters
    /// are per key): what its base limit counts.
    pub in_flight: Option<f64>,
    /// Whether the controller acted on this sample: false during the first full
    /// window after start or a reload, whose earlier half is still filling (ROC there
    /// is about the whole rate, and no decision uses it).
    pub armed: bool,
}

/// Up to this many routes, [`Engine::route_for`] tries each route's matcher in config
/// order (a few nanoseconds each: 7 ns for a catch-all, under 80 ns for the last of
/// ten), and above it looks the path up in an index (60 to 150 ns whatever the
/// table's size, `cargo bench --all-features --bench routes -- route_lookup`).
pub const SCAN_ROUTES: usize = 8;

/// Every route's window, controller and limiters.
pub struct Engine {
    routes: Box<[Slot]>,
    /// Each route's matcher, in route order, apart from the rest of its state.
    matchers: Box<[RouteMatch]>,
    /// The matchers indexed by path, above [`SCAN_ROUTES`] routes: finding a request's
    /// route then tries only the routes whose path matches, not every route.
    index: Option<RouteIndex>,
    hook: Option<TransitionHook>,
    sample_hook: Option<SampleHook>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("routes", &self.routes.len())
            .finish_non_exhaustive()
    }
}

/// A route in the engine's table, with its serial beside the pointer to it: a
/// [`RouteId`] is checked against the entry that finding the route reads anyway.
struct Slot {
    serial: NonZeroU64,
    route: Arc<Route>,
}

/// The lane counter (next to the window's arrivals) of rejections for `reason`: real
/// ones, or in `shadow` mode the would-be ones.
fn rejected_counter(reason: Reason) -> usize {
    1 + reason.index()
}

/// The lane counter of what a cut would have rejected in `shadow_adaptive` mode.
const SHADOW_CUT: usize = 1 + Reason::ALL.len();
const _: () = assert!(SHADOW_CUT < crate::lanes::COUNTERS);

/// [`Route::behind`]: the route's limiter.
const BEHIND_LIMITER: u8 = 1;
/// [`Route::behind`]: the shadow limiter of a `shadow_adaptive` route-wide route.
const BEHIND_SHADOW: u8 = 2;

/// The next [`Route::serial`], less one. Always `std`'s (a `static` needs a `const fn
/// new`): a process-wide serial, in no loom model.
static ROUTE_SERIALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

struct Route {
    name: Arc<str>,
    /// Unique to this route's state in the process: a reload that rebuilds the route
    /// (and so starts its counts again) gives the new one another. A [`RouteId`]
    /// carries it.
    serial: NonZeroU64,
    mode: Mode,
    window: WindowSpec,
    algorithm: Algorithm,
    tiers: Vec<Tier>,
    reject_status: AtomicU16,
    counter: SlotCounter,
    /// Route-level enforcement (partition `Route`); for shadow_adaptive, at base limit.
    limiter: Limiter,
    /// shadow_adaptive only: at the controller's limit, to count what a cut would reject.
    shadow: Option<Shadow>,
    /// Which of the route-wide limiters ([`BEHIND_LIMITER`], [`BEHIND_SHADOW`]) a
    /// limit change has not reached yet: a token bucket's change that found its note
    /// taken, left for the next decision on the route ([`Route::finish_change`]).
    /// Written under the state lock only, read by decisions as a hint (a stale read
    /// puts the change off, or tries the lock, for one decision). `std`'s even under
    /// loom, as the lock is: a model would only explore more orders of it.
    behind: std::sync::atomic::AtomicU8,
    keys: Option<Keys>,
    /// Bumped whenever the controller's limit or parameters change; keys catch up lazily.
    generation: AtomicU64,
    /// When the limit last changed (ns on the engine's clock): a key catching up
    /// refills at its old rate until then, at the new one after.
    changed_at: AtomicU64,
    /// Controller progress between cut (0) and base (1), as f64 bits.
    progress: AtomicU64,
    /// Whether the controller holds the limit below base.
    engaged: AtomicBool,
    /// The limit enforced now (the controller's, or in `shadow_adaptive` the base
    /// limit), as f64 bits.
    limit: AtomicU64,
    /// When the controller will next raise the limit (ns on the engine's clock; 0: not cut).
    next_raise: AtomicU64,
    partition: Partition,
    state: Mutex<RouteState>,
}

struct RouteState {
    ring: SlotRing,
    controller: Controller,
    /// The route's own profile, in force outside events.
    own: ControllerParams,
    events: Vec<ScheduledEvent>,
    active_event: Option<usize>,
    counts: TransitionCounts,
    /// When the key table was last swept.
    last_sweep: Nanos,
    /// When the shadow key table was last swept: on a cadence of its own, as one of
    /// the two tables may be full (swept often) and the other not.
    last_shadow_sweep: Nanos,
}

struct ScheduledEvent {
    name: String,
    start: Nanos,
    end: Nanos,
    params: ControllerParams,
    /// The configured wall-clock start and duration, from which `start` and `end`
    /// are placed again ([`Engine::align_events`]).
    wall: (SystemTime, Duration),
}

impl Engine {
    /// Builds every route of `config`, after checking its routes by the rules of the
    /// file ([`Config::validate`]): routes built in code that a file would refuse (a
    /// `cut_limit` above `base_limit`, a route shadowed by an earlier one) are an error
    /// naming each field, not an engine. `now` is the engine's start (no controller
    /// acts before one full window after it); `wall_now` is the wall-clock time at
    /// `now`, which places scheduled events on the engine's clock.
    pub fn new(config: &Config, now: Nanos, wall_now: SystemTime) -> Result<Self, ConfigError> {
        config.validate()?;
        let routes = config
            .routes
            .iter()
            .map(|r| Arc::new(Route::new(r, now, wall_now)))
            .collect();
        Ok(Engine::assemble(config, routes, None, None))
    }

    /// The engine of `config`'s routes, built or kept in its order.
    fn assemble(
        config: &Config,
        routes: Vec<Arc<Route>>,
        hook: Option<TransitionHook>,
        sample_hook: Option<SampleHook>,
    ) -> Engine {
        let matchers: Box<[RouteMatch]> = config.routes.iter().map(|r| r.matcher.clone()).collect();
        let index = (matchers.len() > SCAN_ROUTES).then(|| RouteIndex::new(&matchers));
        let routes = routes
            .into_iter()
            .map(|route| Slot {
                serial: route.serial,
                route,
            })
            .collect();
        Engine {
            routes,
            matchers,
            index,
            hook,
            sample_hook,
        }
    }

    /// A new engine for `config` that keeps the live state (window, controller,
    /// buckets, keys, counters) of every route whose name and structure (matcher, mode,
    /// window, algorithm, partition, tiers) are unchanged; their controller parameters
    /// and events are replaced in place, and a route whose parameters changed takes no
    /// action for one full window. Other routes start fresh. Both engines share the
    /// kept routes, so requests still in flight on the old one count in the new one.
    /// `config`'s routes are checked first, as for [`Engine::new`]: an error leaves
    /// this engine as it was.
    pub fn reload(
        &self,
        config: &Config,
        now: Nanos,
        wall_now: SystemTime,
    ) -> Result<Engine, ConfigError> {
        config.validate()?;
        let routes = config
            .routes
            .iter()
            .map(|cfg| {
                let kept = self
                    .routes
                    .iter()
                    .map(|e| &e.route)
                    .zip(self.matchers.iter())
                    .find(|(r, m)| **m == cfg.matcher && r.same_structure(cfg));
                match kept.map(|(r, _)| r) {
                    Some(r) => {
                        let hook = self.hook.as_ref();
                        r.reconfigure(&cfg.controller, Some(&cfg.events), now, wall_now, hook);
                        r.reject_status.store(cfg.reject_status, Ordering::Relaxed);
                        Arc::clone(r)
                    }
                    None => Arc::new(Route::new(cfg, now, wall_now)),
                }
            })
            .collect();
        Ok(Engine::assemble(
            config,
            routes,
            self.hook.clone(),
            self.sample_hook.clone(),
        ))
    }

    /// Replaces a route's own controller parameters at runtime, keeping its state: the
    /// limit is recomputed for the current controller state and applied to the existing
    /// limiters (tokens clamped, never refilled). While an event is active, the event's
    /// profile stays in force and the new parameters apply when it ends.
    ///
    /// `params` are checked first by the rules of the file, for this route (its
    /// algorithm, tiers and events): parameters a file would refuse (a `cut_limit`
    /// above `base_limit`, a limit of 0) are an error naming each field under the
    /// route's name, and change nothing. So is a `route` this engine does not hold (see
    /// [`RouteId`]).
    pub fn update_route(
        &self,
        route: RouteId,
        params: ControllerParams,
        now: Nanos,
    ) -> Result<(), ConfigError> {
        let Some((index, r)) = self.find(route) else {
            return Err(ConfigError::new(
                "engine",
                vec![Problem::new(
                    format!("route {}", route.index),
                    "not a route of this engine (rebuilt or removed by a reload, or \
                     another engine's): look it up again",
                )],
            ));
        };
        let mut checked = RouteConfig::new(r.name.to_string(), self.matchers[index].clone());
        checked.mode = r.mode;
        checked.reject_status = r.reject_status.load(Ordering::Relaxed);
        checked.window = r.window;
        checked.controller = params;
        checked.algorithm = r.algorithm;
        checked.partition = r.partition.clone();
        checked.tiers = r.tiers.clone();
        checked.events = r
            .lock()
            .events
            .iter()
            .map(|e| Event::new(e.name.clone(), e.wall.0, e.wall.1, e.params.clone()))
            .collect();
        crate::config::check_route(&checked)
            .map_err(|problems| ConfigError::new(&format!("route `{}`", r.name), problems))?;
        r.reconfigure(
            &checked.controller,
            None,
            now,
            SystemTime::UNIX_EPOCH,
            self.hook.as_ref(),
        );
        Ok(())
    }

    /// The route's own controller parameters (outside events); `None` if this engine
    /// does not hold `route` (see [`RouteId`]).
    pub fn route_params(&self, route: RouteId) -> Option<ControllerParams> {
        Some(self.route(route)?.lock().own.clone())
    }

    /// What the tuning hints need to know of the route: name, mode, algorithm,
    /// whether it is partitioned and the controller parameters in force (an event's while one is active); `None` if
    /// this engine does not hold `route` (see [`RouteId`]).
    pub fn route_settings(&self, route: RouteId) -> Option<crate::hints::RouteSettings> {
        let r = self.route(route)?;
        let st = r.lock();
        Some(crate::hints::RouteSettings {
            name: r.name.to_string(),
            mode: r.mode,
            algorithm: r.algorithm,
            params: st.controller.params().clone(),
            partitioned: r.partition != Partition::Route,
            event: st
                .active_event
                .and_then(|i| st.events.get(i))
                .map(|e| e.name.clone()),
        })
    }

    /// What the tuning hints need to know of the route, as due at `now`: the profile
    /// of the scheduled event running then (by its schedule), or else the route's
    /// own, whether or not a slot's rollover has put it in force yet (the engine
    /// changes profile at the first rollover from an event's edge on, which a route
    /// without requests has not reached). `None` if this engine does not hold `route`
    /// (see [`RouteId`]).
    pub fn route_settings_at(
        &self,
        route: RouteId,
        now: Nanos,
    ) -> Option<crate::hints::RouteSettings> {
        let r = self.route(route)?;
        let st = r.lock();
        let due = st.events.iter().find(|e| e.start <= now && now < e.end);
        Some(crate::hints::RouteSettings {
            name: r.name.to_string(),
            mode: r.mode,
            algorithm: r.algorithm,
            params: due.map_or_else(|| st.own.clone(), |e| e.params.clone()),
            partitioned: r.partition != Partition::Route,
            event: due.map(|e| e.name.clone()),
        })
    }

    /// The first start or end of a scheduled event of any route strictly after
    /// `after`, on the engine's clock: where `rocgate serve` closes its hints history's
    /// interval early, so that none straddles an event's edge.
    pub fn next_event_edge(&self, after: Nanos) -> Option<Nanos> {
        self.routes
            .iter()
            .flat_map(|e| {
                let st = e.route.lock();
                st.events
                    .iter()
                    .flat_map(|e| [e.start, e.end])
                    .filter(|&t| t > after)
                    .min()
            })
            .min()
    }

    /// The controller parameters due at `now`: those of the scheduled event running
    /// then, or else the route's own. (A shared store steps its controller with these.)
    /// `None` if this engine does not hold `route` (see [`RouteId`]).
    pub fn params_at(&self, route: RouteId, now: Nanos) -> Option<ControllerParams> {
        let st = self.route(route)?.lock();
        Some(
            st.events
                .iter()
                .find(|e| e.start <= now && now < e.end)
                .map_or_else(|| st.own.clone(), |e| e.params.clone()),
        )
    }

    /// Places every route's scheduled events again from the wall clock, where `now` is
    /// `wall_now`. Events are placed on the engine's monotonic clock when the engine is
    /// built or reloaded; the two clocks part when the wall clock is stepped (an NTP
    /// correction after boot), when the monotonic clock stops (a suspended host, a
    /// paused VM) or drifts (a TSC calibrated once: about 1 ppm). Called
    /// periodically (`rocgate serve` does every 5 s), this keeps each event within
    /// that period's parting of its wall-clock time. The event due at the next
    /// completed slot is put in force then, as always (see [`Engine::catch_up`] for
    /// a route without requests).
    pub fn align_events(&self, now: Nanos, wall_now: SystemTime) {
        for e in self.routes.iter() {
            let mut st = e.route.lock();
            for e in &mut st.events {
                e.align(now, wall_now);
            }
        }
    }

    /// Brings a route up to `now` as a request at `now` would, without counting one:
    /// its window advances over the slots that have passed, its controller steps
    /// through them (taking the scheduled event due), its idle keys are swept, and a
    /// limit change its route-wide limiter is still behind on (one that found its
    /// token bucket's note taken) is made. Otherwise a route without requests stands
    /// where its last request left it: a cut that its silence outlasted reads as a
    /// cut, for as long as the silence, in snapshots, metrics and the admin API; its
    /// idle keys stay in memory; an event shows only from its next request. `rocgate serve` calls this every 5 s for the
    /// routes it decides itself; the simulator at the start of every slot without
    /// arrivals. Nothing happens if this engine does not hold `route` (see [`RouteId`]).
    pub fn catch_up(&self, route: RouteId, now: Nanos) {
        let Some(r) = self.route(route) else {
            return;
        };
        if r.counter.needs_roll(now) {
            self.roll(r, now);
        } else if r.behind.load(Ordering::Relaxed) != 0 {
            r.finish_change();
        }
    }

    /// Periodic upkeep for a process that runs for days: places the scheduled events
    /// again from the wall clock ([`Engine::align_events`]) and brings every route up
    /// to now ([`Engine::catch_up`]) but those `decided_elsewhere` (by a shared store,
    /// which steps their controllers). `rocgate serve` and `AdmissionLayer::upkeep`
    /// (feature `http`) call it.
    pub fn upkeep(
        &self,
        now: Nanos,
        wall_now: SystemTime,
        decided_elsewhere: impl Fn(RouteId) -> bool,
    ) {
        self.align_events(now, wall_now);
        for id in self.route_ids() {
            if !decided_elsewhere(id) {
                self.catch_up(id, now);
            }
        }
    }

    /// Calls `hook` with every controller transition (for metrics, logs, simulation).
    pub fn with_transition_hook(mut self, hook: TransitionHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Calls `hook` with every completed slot's ROC (for the ROC histogram).
    pub fn with_sample_hook(mut self, hook: SampleHook) -> Self {
        self.sample_hook = Some(hook);
        self
    }

    /// The first route, in config order, that takes a request with this method and
    /// path (compared once [normalized](crate::config::normalize_path)): the route
    /// whose [`RouteMatch::matches`] is true and that no earlier route's is. In a table
    /// of more than [`SCAN_ROUTES`] routes it is found through an index built with the
    /// engine, so that its cost does not grow with the number of routes; in a smaller
    /// one by trying each route in turn, which costs less there.
    #[inline]
    pub fn route_for(&self, method: &str, path: &str) -> Option<RouteId> {
        let path = crate::config::normalize_path(path);
        let index = match &self.index {
            Some(index) => index.first(&self.matchers, method, &path),
            None => self.matchers.iter().position(|m| m.matches(method, &path)),
        }?;
        self.route_at(index)
    }

    /// The route with this name.
    pub fn route_id(&self, name: &str) -> Option<RouteId> {
        let index = self.routes.iter().position(|e| &*e.route.name == name)?;
        self.route_at(index)
    }

    /// The route at `index` in the configuration this engine was built from (its match
    /// order); `None` past the last.
    #[inline]
    pub fn route_at(&self, index: usize) -> Option<RouteId> {
        self.routes.get(index).map(|e| RouteId {
            index,
            serial: e.serial,
        })
    }

    /// Every route, in match order (the configuration's).
    pub fn route_ids(&self) -> impl ExactSizeIterator<Item = RouteId> + '_ {
        self.routes.iter().enumerate().map(|(index, e)| RouteId {
            index,
            serial: e.serial,
        })
    }

    /// The route `id` names, if this engine holds it (see [`RouteId`]): where the id
    /// says, checked by its serial (on the line the pointer to it is read from).
    #[inline]
    fn route(&self, id: RouteId) -> Option<&Route> {
        match self.routes.get(id.index) {
            Some(e) if e.serial == id.serial => Some(&e.route),
            _ => self.moved(id).map(|(_, r)| r),
        }
    }

    /// The route `id` names and where it stands in this engine's table.
    fn find(&self, id: RouteId) -> Option<(usize, &Route)> {
        match self.routes.get(id.index) {
            Some(e) if e.serial == id.serial => Some((id.index, &e.route)),
            _ => self.moved(id),
        }
    }

    /// A route kept by a reload that moved it in the table, found by its serial; or
    /// none, for a route this engine does not hold.
    #[cold]
    #[inline(never)]
    fn moved(&self, id: RouteId) -> Option<(usize, &Route)> {
        self.routes
            .iter()
            .enumerate()
            .find(|(_, e)| e.serial == id.serial)
            .map(|(i, e)| (i, &*e.route))
    }

    /// Names of all routes, in match order.
    pub fn route_names(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().map(|e| &*e.route.name)
    }

    /// Decides one request on `route` for `key` at `now`. A `route` this engine does
    /// not hold (see [`RouteId`]) is admitted at once and counted nowhere, as a request
    /// that matches no route.
    #[inline]
    pub fn check(&self, route: RouteId, key: Key<'_>, now: Nanos) -> Decision {
        self.check_key(route, TableKey::of(key), now)
    }

    /// [`Engine::check`] of a key already in the form the key tables take it.
    #[inline]
    pub(crate) fn check_key(&self, route: RouteId, key: TableKey, now: Nanos) -> Decision {
        // The route found where the id says is decided here; any other id out of line,
        // so that looking a route up again adds nothing to this path.
        match self.routes.get(route.index) {
            Some(s) if s.serial == route.serial => self.decide(&s.route, key, now),
            _ => self.check_moved(route, key, now),
        }
    }

    /// [`Engine::check`] of an id that is not where it says in this engine's table: of
    /// a route a reload kept and moved, or of none.
    #[cold]
    #[inline(never)]
    fn check_moved(&self, route: RouteId, key: TableKey, now: Nanos) -> Decision {
        match self.moved(route) {
            Some((_, r)) => self.decide(r, key, now),
            None => Decision::Admit(Admit::Now),
        }
    }

    /// Decides one request on `r`.
    #[inline(always)]
    fn decide(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        if r.counter.needs_roll(now) {
            self.roll(r, now);
        } else if r.behind.load(Ordering::Relaxed) != 0 {
            r.finish_change();
        }
        r.counter.add();
        // The common case, a route-wide token bucket, is decided from a two-register
        // result: the `Decision` is built once, in the caller's slot, never moved.
        if let (None, Limiter::TokenBucket(bucket)) = (&r.keys, &r.limiter) {
            return match bucket.take(now) {
                Ok(()) => {
                    self.after_admit(r, key, now);
                    Decision::Admit(Admit::Now)
                }
                Err(retry_after_ns) => self.refused(
                    r,
                    Duration::from_nanos(retry_after_ns.max(1)),
                    Reason::Limit,
                ),
            };
        }
        let decision = match &r.keys {
            None => r.limiter.check(now),
            Some(keys) => keys.check(r, key, now),
        };
        match decision {
            Decision::Reject(rej) => self.refused(r, rej.retry_after, rej.reason),
            // Shadow admits everything as it comes: the pacing is decided, not applied.
            Decision::Admit(Admit::Paced(_)) if r.mode == Mode::Shadow => {
                Decision::Admit(Admit::Now)
            }
            admit => {
                self.after_admit(r, key, now);
                admit
            }
        }
    }

    /// Gives back the place of a paced request (a leaky bucket's [`Admit::Paced`],
    /// decided by [`Engine::check`] on `route` for `key`) that leaves at `now`, before
    /// its departure: if it is still the last one scheduled on its bucket, the next
    /// request takes its departure time. `key` is the key it was checked with. Whether
    /// it did (see [`Pace`]): never if this engine does not hold `route` (see
    /// [`RouteId`]).
    pub fn give_back(&self, route: RouteId, key: Key<'_>, pace: Pace, now: Nanos) -> bool {
        self.give_back_key(route, TableKey::of(key), pace, now)
    }

    /// [`Engine::give_back`] of a key already in the form the key tables take it.
    pub(crate) fn give_back_key(
        &self,
        route: RouteId,
        key: TableKey,
        pace: Pace,
        now: Nanos,
    ) -> bool {
        let Some(r) = self.route(route) else {
            return false;
        };
        match &r.keys {
            None => r.limiter.give_back(pace, now),
            Some(keys) => keys.give_back(key, pace, now),
        }
    }

    /// A limiter refused the request: names an ROC cut as the reason when one is in
    /// force, counts the rejection, and enforces it unless the route is in shadow.
    /// (The rejection comes in registers, as its two parts: a `Rejection` passed by
    /// reference is read back whole from two narrower stores, which stalls the CPU.)
    #[inline(never)]
    fn refused(&self, r: &Route, retry_after: Duration, reason: Reason) -> Decision {
        let mut rej = Rejection {
            retry_after,
            reason,
        };
        if matches!(rej.reason, Reason::Limit | Reason::Concurrency)
            && r.mode != Mode::ShadowAdaptive
            && r.engaged.load(Ordering::Relaxed)
        {
            rej.reason = Reason::RocCut;
        }
        r.counter.counters().add(rejected_counter(rej.reason));
        match r.mode {
            Mode::Enforce | Mode::ShadowAdaptive => Decision::Reject(rej),
            Mode::Shadow => Decision::Admit(Admit::Now),
        }
    }

    /// Counts a request that was decided elsewhere (by a shared store) at `now` as
    /// offered, and as rejected for `rejected` if it was: the route's counters,
    /// snapshots and metrics then show this instance's traffic, its window's demand
    /// and ROC included. Its controller and limiter are left alone. Nothing is counted
    /// if this engine does not hold `route` (see [`RouteId`]).
    pub fn record(&self, route: RouteId, rejected: Option<Reason>, now: Nanos) {
        let Some(r) = self.route(route) else {
            return;
        };
        if r.counter.needs_roll(now) {
            Self::advance(r, now);
        }
        r.counter.add();
        if let Some(reason) = rejected {
            r.counter.counters().add(rejected_counter(reason));
        }
    }

    /// shadow_adaptive: an admitted request is also tried against the limit the
    /// controller sets (its key's, on a partitioned route), and counted while that is
    /// a cut, below base.
    #[inline]
    fn after_admit(&self, r: &Route, key: TableKey, now: Nanos) {
        if let Some(shadow) = &r.shadow {
            Self::count_shadow_cut(r, shadow, key, now);
        }
    }

    /// Counts an admitted request that the cut would have refused. The route's shadow
    /// limiter takes every admitted request, cut or not, so that a cut finds it as
    /// drained as an enforced limiter would be (not full, which would count one burst
    /// at the cut limit too few); the shadow key table is only tried during a cut.
    /// Out of line: only shadow_adaptive routes come here.
    #[inline(never)]
    fn count_shadow_cut(r: &Route, shadow: &Shadow, key: TableKey, now: Nanos) {
        let would_admit = match shadow {
            Shadow::Route(limiter) => limiter.check(now).is_admit(),
            Shadow::Keys(_) if !r.engaged.load(Ordering::Relaxed) => return,
            Shadow::Keys(keys) => keys.check(r, key, now).is_admit(),
        };
        if !would_admit && r.engaged.load(Ordering::Relaxed) {
            r.counter.counters().add(SHADOW_CUT);
        }
    }

    /// Advances the window of a route decided elsewhere to the slot of `now`, if no
    /// other request is doing so already; its controller does not step.
    #[cold]
    fn advance(r: &Route, now: Nanos) {
        if let Some(mut st) = r.try_lock() {
            st.ring
                .advance(&r.counter, r.counter.slot_index(now), |_| {});
        }
    }

    /// Advances the route's window to the slot of `now` and steps the controller, if
    /// no other request is doing so already.
    #[cold]
    fn roll(&self, r: &Route, now: Nanos) {
        let Some(mut guard) = r.try_lock() else {
            return;
        };
        let st = &mut *guard;
        // What the limiters and the tier keys follow: the limit, the base limit, and
        // the cut, which with them says where the limit stands between the two (an
        // event may move the cut and the step and leave the limit where it was).
        let standing = |c: &Controller| {
            (
                c.limit_rps(),
                c.params().base_limit_rps,
                c.params().cut_limit_rps,
            )
        };
        let before = standing(&st.controller);
        let hook = self.hook.as_deref();
        let sample_hook = self.sample_hook.as_deref();
        let level = (sample_hook.is_some() && r.keys.is_none()).then(|| r.limiter.level(now));
        let exhausted = level.is_some_and(|l| l.exhausted(&r.algorithm));
        let in_flight = level
            .filter(|_| matches!(r.algorithm, Algorithm::Concurrency { .. }))
            .map(|l| l.value);
        let RouteState {
            ring,
            controller,
            own,
            events,
            active_event,
            counts,
            ..
        } = st;
        // `entered`: when the state left was entered.
        let mut record = |t: Transition, entered: Nanos| {
            counts.record(&t, entered);
            if let Some(h) = hook {
                h(&r.name, &t);
            }
        };
        let slot_ns = r.counter.slot_ns();
        let mut last_at = None;
        ring.advance(&r.counter, r.counter.slot_index(now), |s| {
            // A silence longer than the window ends in one sample for every slot past
            // the window's replay: they all read alike. If the controller was armed
            // again among them, it observes that reading from the slot where it was,
            // as stepping each slot would have (a cut's calm counts from there).
            let armed_at = controller.memory().armed_at;
            let armed_slot = armed_at.as_u64().div_ceil(slot_ns).saturating_mul(slot_ns);
            let armed_slot = Nanos::new(armed_slot);
            let rearmed = (last_at.is_some_and(|last| last < armed_at) && armed_slot < s.at)
                .then_some(SampleAt {
                    at: armed_slot,
                    ..s
                });
            last_at = Some(s.at);
            for s in rearmed.into_iter().chain([s]) {
                let entered = controller.entered_at();
                follow_events(events, active_event, own, controller, s.at, |t| {
                    record(t, entered);
                });
                let entered = controller.entered_at();
                controller.observe(s, |t| record(t, entered));
            }
            if let Some(h) = sample_hook {
                let report = SlotReport {
                    at: s.at,
                    slot: r.window.slot(),
                    sample: s.sample,
                    roc: controller.last_roc(),
                    state: controller.state(),
                    limit_rps: controller.limit_rps(),
                    exhausted,
                    in_flight,
                    armed: controller.armed(s.at),
                };
                h(&r.name, &report);
            }
        });
        if standing(&st.controller) != before {
            // Dated where the controller changed the limit: after a silence, the
            // limiters refill at the new limit from then, not only from now.
            let at = st.controller.limit_since().min(now);
            r.apply_limit(&st.controller, at);
        } else {
            let behind = r.behind.load(Ordering::Relaxed);
            if behind != 0 {
                let at = Nanos::new(r.changed_at.load(Ordering::Relaxed));
                r.set_limiters(&st.controller, at, behind);
            }
        }
        r.publish_next_raise(&st.controller, now);
        if let Some(keys) = &r.keys {
            keys.sweep(&mut st.last_sweep, now);
            if let Some(Shadow::Keys(shadow)) = &r.shadow {
                shadow.sweep(&mut st.last_shadow_sweep, now);
            }
        }
    }

    /// The route's name. Like every accessor of a route, `None` if this engine does not
    /// hold `route` (see [`RouteId`]).
    pub fn route_name(&self, route: RouteId) -> Option<&str> {
        Some(&self.route(route)?.name)
    }

    /// The route's name, shared: cloning it is one reference count (for request
    /// extensions and metric labels).
    pub fn route_label(&self, route: RouteId) -> Option<Arc<str>> {
        Some(Arc::clone(&self.route(route)?.name))
    }

    /// How the route shares out its limit (which key a request needs).
    pub fn partition(&self, route: RouteId) -> Option<&Partition> {
        Some(&self.route(route)?.partition)
    }

    /// The HTTP status the route answers a rejection with.
    pub fn reject_status(&self, route: RouteId) -> Option<u16> {
        Some(self.route(route)?.reject_status.load(Ordering::Relaxed))
    }

    /// The shape of the route's ROC window.
    pub fn window(&self, route: RouteId) -> Option<WindowSpec> {
        Some(self.route(route)?.window)
    }

    /// The route's mode (enforce or a shadow mode).
    pub fn mode(&self, route: RouteId) -> Option<Mode> {
        Some(self.route(route)?.mode)
    }

    /// The algorithm enforcing the route's limit.
    pub fn algorithm(&self, route: RouteId) -> Option<&Algorithm> {
        Some(&self.route(route)?.algorithm)
    }

    /// The limit the route enforces now, req/s (per key in no tier on partitioned
    /// routes): the controller's, or in `shadow_adaptive` the base limit. One atomic
    /// load: cheap enough for response headers.
    pub fn limit_rps(&self, route: RouteId) -> Option<f64> {
        Some(self.route(route)?.limit_rps())
    }

    /// The limit `route` enforces now for requests with `key`: its tier's, between the
    /// tier's cut and base limits as the route's controller stands, for a key of a tier
    /// that has its own state; [`limit_rps`](Self::limit_rps) otherwise (a key in no
    /// tier, or one that a full key table sends to its shared overflow limiter, which
    /// holds keys to the route's limit). For the quota a rejection states.
    pub fn key_limit_rps(&self, route: RouteId, key: Key<'_>) -> Option<f64> {
        self.key_limit_rps_of(route, TableKey::of(key))
    }

    /// [`Engine::key_limit_rps`] of a key already in the form the key tables take it.
    pub(crate) fn key_limit_rps_of(&self, route: RouteId, key: TableKey) -> Option<f64> {
        let r = self.route(route)?;
        let Some(keys) = r.keys.as_ref().filter(|_| !r.tiers.is_empty()) else {
            return Some(r.limit_rps());
        };
        if keys.overflowed(key) {
            return Some(r.limit_rps());
        }
        let tiers = keys.tiers();
        let tier = match (key, &r.partition) {
            (TableKey::Ip(ip), Partition::ClientIp(limits)) => {
                tiers.tier_of(&IpKey::new(ip, limits.ipv6_prefix))
            }
            (TableKey::Value(value), _) => tiers.tier_of(&value),
            _ => 0,
        };
        Some(match tier {
            0 => r.limit_rps(),
            tier => tiers.limit(tier, tiers.progress(r)),
        })
    }

    /// How long until the controller next raises a cut route's limit, at the earliest
    /// (see [`Controller::next_raise_at`]): the basis of `Retry-After` for `roc_cut`
    /// rejections. `None` when the route is not cut, or this engine does not hold
    /// `route` (see [`RouteId`]). One atomic load.
    pub fn restore_eta(&self, route: RouteId, now: Nanos) -> Option<Duration> {
        match self.route(route)?.next_raise.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Nanos::new(at).saturating_since(now)),
        }
    }

    /// A read-only view of every route at `now`.
    pub fn snapshot(&self, now: Nanos) -> Vec<RouteSnapshot> {
        self.routes.iter().map(|e| e.route.snapshot(now)).collect()
    }

    /// A read-only view of one route at `now`; `None` if this engine does not hold
    /// `route` (see [`RouteId`]).
    pub fn route_snapshot(&self, route: RouteId, now: Nanos) -> Option<RouteSnapshot> {
        Some(self.route(route)?.snapshot(now))
    }
}

impl Route {
    fn new(cfg: &RouteConfig, now: Nanos, wall_now: SystemTime) -> Self {
        let p = &cfg.controller;
        let enforced_limit = p.base_limit_rps;
        // shadow_adaptive enforces each key's base limit; its shadow keys follow the cut.
        let hold_base = cfg.mode == Mode::ShadowAdaptive;
        let keys = Keys::new(cfg, now, hold_base);
        let shadow = (cfg.mode == Mode::ShadowAdaptive).then(|| {
            Keys::new(cfg, now, false).map_or_else(
                || Shadow::Route(Limiter::new(cfg.algorithm, p.base_limit_rps, now)),
                |keys| Shadow::Keys(Box::new(keys)),
            )
        });
        let events = cfg
            .events
            .iter()
            .filter_map(|e| ScheduledEvent::place(e, now, wall_now))
            .collect();
        let route = Route {
            name: cfg.name.as_str().into(),
            serial: NonZeroU64::MIN.saturating_add(ROUTE_SERIALS.fetch_add(1, Ordering::Relaxed)),
            mode: cfg.mode,
            window: cfg.window,
            algorithm: cfg.algorithm,
            tiers: cfg.tiers.clone(),
            reject_status: AtomicU16::new(cfg.reject_status),
            counter: SlotCounter::new(&cfg.window),
            limiter: Limiter::new(cfg.algorithm, enforced_limit, now),
            shadow,
            behind: std::sync::atomic::AtomicU8::new(0),
            keys,
            generation: AtomicU64::new(0),
            changed_at: AtomicU64::new(now.as_u64()),
            progress: AtomicU64::new(1.0f64.to_bits()),
            engaged: AtomicBool::new(false),
            limit: AtomicU64::new(p.base_limit_rps.to_bits()),
            next_raise: AtomicU64::new(0),
            partition: cfg.partition.clone(),
            state: Mutex::new(RouteState {
                ring: SlotRing::new(&cfg.window),
                controller: Controller::new(p.clone(), now, cfg.window.window()),
                own: p.clone(),
                events,
                active_event: None,
                counts: TransitionCounts::default(),
                last_sweep: now,
                last_shadow_sweep: now,
            }),
        };
        route.start(now);
        route
    }

    /// The limit enforced now, req/s.
    fn limit_rps(&self) -> f64 {
        f64::from_bits(self.limit.load(Ordering::Relaxed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RouteState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state lock if no one holds it, without waiting; taken poisoned or not, as
    /// [`Route::lock`] takes it. Refused for poison, no request would roll the window,
    /// step the controller or make a change left behind again, after a panic (a
    /// hook's) while the lock was held.
    fn try_lock(&self) -> Option<std::sync::MutexGuard<'_, RouteState>> {
        match self.state.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Whether `cfg` describes this route with the same shape of state (its matcher
    /// aside: the engine holds the matchers).
    fn same_structure(&self, cfg: &RouteConfig) -> bool {
        *self.name == cfg.name
            && self.mode == cfg.mode
            && self.window == cfg.window
            && self.algorithm == cfg.algorithm
            && self.partition == cfg.partition
            && self.tiers == cfg.tiers
    }

    /// New own parameters (and, on reload, new events) applied to the live state; a
    /// transition this makes is counted and passed to `hook`.
    fn reconfigure(
        &self,
        params: &ControllerParams,
        events: Option<&[Event]>,
        now: Nanos,
        wall_now: SystemTime,
        hook: Option<&TransitionHook>,
    ) {
        let mut st = self.lock();
        let st = &mut *st;
        let changed = st.own != *params;
        st.own = params.clone();
        if let Some(events) = events {
            st.events = events
                .iter()
                .filter_map(|e| ScheduledEvent::place(e, now, wall_now))
                .collect();
        }
        // Whatever was in force, the profile due now replaces it (in one step: the
        // route's own profile set on the way would move a recovering controller).
        let due = st.events.iter().position(|e| e.start <= now && now < e.end);
        st.active_event = due;
        let params = due.map_or_else(|| st.own.clone(), |i| st.events[i].params.clone());
        let (counts, entered) = (&mut st.counts, st.controller.entered_at());
        st.controller.set_params(params, now, |t| {
            counts.record(&t, entered);
            if let Some(h) = hook {
                h(&self.name, &t);
            }
        });
        if changed {
            st.controller.rearm(now, self.window.window());
        }
        self.apply_limit(&st.controller, now);
        self.publish_next_raise(&st.controller, now);
    }

    /// Publishes when the controller next raises the limit, as seen at `now`, for
    /// [`Engine::restore_eta`].
    fn publish_next_raise(&self, c: &Controller, now: Nanos) {
        let at = c
            .next_raise_at(now, self.window.window())
            .map_or(0, Nanos::as_u64);
        self.next_raise.store(at, Ordering::Relaxed);
    }

    /// Starts the window at the slot containing `now` (so a clock that starts far from
    /// zero does not replay empty slots since its origin), and puts in force the event
    /// due now, if any.
    fn start(&self, now: Nanos) {
        let mut st = self.lock();
        let st = &mut *st;
        let idx = self.counter.slot_index(now);
        st.ring.advance(&self.counter, idx, |_| {});
        st.follow_events(now);
        self.apply_limit(&st.controller, now);
    }

    /// Pushes the controller's limit to the limiters, as of `at`, when it took effect
    /// (never before the last change pushed). Never waits: a route-wide token bucket
    /// whose change finds its note taken is marked [`behind`](Route::behind), and
    /// the next decision on the route makes the change ([`Route::finish_change`]).
    fn apply_limit(&self, c: &Controller, at: Nanos) {
        let now = at.max(Nanos::new(self.changed_at.load(Ordering::Relaxed)));
        self.set_limiters(c, now, BEHIND_LIMITER | BEHIND_SHADOW);
        let limit = c.limit_rps();
        let base = c.params().base_limit_rps;
        let cut = c.params().cut_limit_rps;
        if let Some(keys) = &self.keys {
            keys.tiers().set_default(base, cut);
        }
        if let Some(Shadow::Keys(keys)) = &self.shadow {
            keys.tiers().set_default(base, cut);
        }
        self.progress
            .store(c.progress().to_bits(), Ordering::Relaxed);
        let enforced = if self.mode == Mode::ShadowAdaptive {
            base
        } else {
            limit
        };
        self.limit.store(enforced.to_bits(), Ordering::Relaxed);
        self.engaged.store(
            c.state() != ControllerState::Normal && limit < base,
            Ordering::Relaxed,
        );
        self.changed_at.store(now.as_u64(), Ordering::Relaxed);
        // `SeqCst`, then read the concurrency keys' queues (`wake_queued`): see
        // `ConcurrencyKey::check`.
        self.generation.fetch_add(1, Ordering::SeqCst);
        crate::sync::seq_cst_fence_under_loom();
        if let Some(keys) = &self.keys {
            keys.wake_queued(self);
        }
    }

    /// Sets the route-wide limiters among `which` ([`BEHIND_LIMITER`],
    /// [`BEHIND_SHADOW`]) to the controller's limit as of `at`, each without waiting,
    /// and records those whose change could not take its note as [`behind`](Route::behind).
    /// Called with the state lock held.
    fn set_limiters(&self, c: &Controller, at: Nanos, which: u8) {
        let limit = c.limit_rps();
        let base = c.params().base_limit_rps;
        let set = |limiter: &Limiter, limit: f64, flag: u8| {
            if which & flag == 0 || limiter.try_set_limit(limit, at) {
                0
            } else {
                flag
            }
        };
        let behind = match (self.mode, &self.shadow) {
            (Mode::ShadowAdaptive, Some(Shadow::Route(shadow))) => {
                set(&self.limiter, base, BEHIND_LIMITER) | set(shadow, limit, BEHIND_SHADOW)
            }
            // Keys (enforced and shadow) catch up lazily with `generation`.
            (Mode::ShadowAdaptive, _) => 0,
            _ => set(&self.limiter, limit, BEHIND_LIMITER),
        };
        self.behind.store(behind, Ordering::Relaxed);
    }

    /// Makes the limit change that a route-wide limiter is [`behind`](Route::behind)
    /// on, dated where it was pushed, if the state lock is free (it is taken, not
    /// waited for) and the note too (else the next decision tries again). Out of
    /// line: a change finds its note taken only while another change holds it.
    #[cold]
    #[inline(never)]
    fn finish_change(&self) {
        if let Some(st) = self.try_lock() {
            let which = self.behind.load(Ordering::Relaxed);
            if which != 0 {
                let at = Nanos::new(self.changed_at.load(Ordering::Relaxed));
                self.set_limiters(&st.controller, at, which);
            }
        }
    }

    fn snapshot(&self, now: Nanos) -> RouteSnapshot {
        let st = self.lock();
        let c = &st.controller;
        let p = c.params();
        let offered = self.counter.arrivals();
        let counted = Reason::ALL.map(|r| (r, self.counter.counters().sum(rejected_counter(r))));
        let none = Reason::ALL.map(|r| (r, 0));
        let (rejected, shadow_rejected) = match self.mode {
            Mode::Enforce => (counted, none),
            Mode::Shadow => (none, counted),
            Mode::ShadowAdaptive => {
                let cut = self.counter.counters().sum(SHADOW_CUT);
                (
                    counted,
                    none.map(|(r, _)| (r, if r == Reason::RocCut { cut } else { 0 })),
                )
            }
        };
        let rejected_total: u64 = rejected.iter().map(|(_, n)| n).sum();
        RouteSnapshot {
            name: self.name.to_string(),
            serial: self.serial.get(),
            mode: self.mode,
            state: c.state(),
            state_since: c.entered_at(),
            sample: st.ring.sample(),
            roc: c.last_roc(),
            limit_rps: c.limit_rps(),
            base_limit_rps: p.base_limit_rps,
            cut_limit_rps: p.cut_limit_rps,
            danger_roc: p.danger_roc,
            safe_roc: p.safe_roc,
            level: self.limiter.level(now),
            offered,
            admitted: offered.saturating_sub(rejected_total),
            rejected: rejected.to_vec(),
            shadow_rejected: shadow_rejected.to_vec(),
            cuts: st.counts.cuts,
            time_in_cut: st.counts.time_in_cut
                + if c.state() == ControllerState::Cut {
                    now.saturating_since(c.entered_at())
                } else {
                    Duration::ZERO
                },
            transitions: st.counts.transitions,
            active_event: st.active_event.map(|i| st.events[i].name.clone()),
            keys: self.keys.as_ref().map_or(0, Keys::len),
            max_keys: match &self.partition {
                Partition::Route => 0,
                Partition::ClientIp(limits) | Partition::Header(_, limits) => limits.max_keys,
            },
            window: self.window,
            min_rps: p.min_rps,
            roc_mode: p.roc_mode,
            algorithm: self.algorithm.name(),
        }
    }
}

impl ScheduledEvent {
    /// Places an event on the engine's clock, where `now` is `wall_now`. Both ends are
    /// placed from wall time, so an event that began before `now` keeps its real end
    /// (the clock cannot go below its origin); one that has already ended is dropped.
    fn place(e: &Event, now: Nanos, wall_now: SystemTime) -> Option<Self> {
        let (start, end) = span(e.start, e.duration, now, wall_now)?;
        Some(ScheduledEvent {
            name: e.name.clone(),
            start,
            end,
            params: e.controller.clone(),
            wall: (e.start, e.duration),
        })
    }

    /// Places the event again, where `now` is `wall_now`; one that has ended is
    /// never due again.
    fn align(&mut self, now: Nanos, wall_now: SystemTime) {
        let (start, duration) = self.wall;
        (self.start, self.end) = span(start, duration, now, wall_now).unwrap_or_default();
    }
}

/// Where an event of `duration` from wall-clock `start` lies on the engine's clock,
/// where `now` is `wall_now`: `None` if it has ended.
fn span(
    start: SystemTime,
    duration: Duration,
    now: Nanos,
    wall_now: SystemTime,
) -> Option<(Nanos, Nanos)> {
    match start.duration_since(wall_now) {
        Ok(ahead) => Some((now + ahead, now + ahead + duration)),
        Err(past) => {
            let elapsed = past.duration();
            let left = duration.checked_sub(elapsed).filter(|d| !d.is_zero())?;
            Some((now - elapsed, now + left))
        }
    }
}

impl RouteState {
    /// Puts the profile due at `at` in force (see [`follow_events`]), at the start,
    /// where the controller is in `Normal` and no transition can follow.
    fn follow_events(&mut self, at: Nanos) {
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

/// Puts the profile due at `at` in force: the scheduled event running then, or the
/// route's own parameters. Does nothing if that profile is already in force. A
/// transition the change makes is passed to `on_transition`.
fn follow_events(
    events: &[ScheduledEvent],
    active: &mut Option<usize>,
    own: &ControllerParams,
    controller: &mut Controller,
    at: Nanos,
    on_transition: impl FnMut(Transition),
) {
    let due = events.iter().position(|e| e.start <= at && at < e.end);
    if due != *active {
        *active = due;
        let params = due.map_or_else(|| own.clone(), |i| events[i].params.clone());
        controller.set_params(params, at, on_transition);
    }
}

/// shadow_adaptive's second set of limiters, following the controller's limit while
/// the enforced ones hold the base limit.
enum Shadow {
    /// For a route limited as a whole.
    Route(Limiter),
    /// For a partitioned route: a second key table (filled only while a cut is in
    /// force, since only then is it consulted).
    Keys(Box<Keys>),
}

/// Per-key state of a partitioned route, in a key table per algorithm: each key's
/// state laid flat beside its own fields, so that a table slot stays small.
enum Keys {
    Bucket(KeyTables<BucketKey>),
    Fixed(KeyTables<WordKey<Fixed>>),
    Sliding(KeyTables<WordKey<Sliding>>),
    Leaky(KeyTables<WordKey<Leaky>>),
    Concurrency(KeyTables<ConcurrencyKey>),
}

/// The key tables of one key state, by key kind.
enum KeyTables<E> {
    Ip(KeyTable<IpKey, E>),
    Value(KeyTable<ValueKey, E>),
}

/// Runs `$e` with `$t` bound to the key tables, whatever their key state.
macro_rules! with_tables {
    ($keys:expr, $t:ident => $e:expr) => {
        match $keys {
            Keys::Bucket($t) => $e,
            Keys::Fixed($t) => $e,
            Keys::Sliding($t) => $e,
            Keys::Leaky($t) => $e,
            Keys::Concurrency($t) => $e,
        }
    };
}

impl Keys {
    /// The key tables of a partitioned route (`None` for a route limited as a whole),
    /// of the key state of its algorithm, with that algorithm's [`TierTable::shape`].
    fn new(cfg: &RouteConfig, now: Nanos, hold_base: bool) -> Option<Self> {
        let (n, h) = (now, hold_base);
        match cfg.algorithm {
            Algorithm::TokenBucket { burst } => {
                KeyTables::new(cfg, gcra::burst_ms(burst), n, h).map(Keys::Bucket)
            }
            Algorithm::FixedWindow { window } => {
                KeyTables::new(cfg, words::window_ms(window), n, h).map(Keys::Fixed)
            }
            Algorithm::SlidingWindow { window } => {
                KeyTables::new(cfg, words::window_ms(window), n, h).map(Keys::Sliding)
            }
            Algorithm::LeakyBucket { queue } => KeyTables::new(cfg, queue, n, h).map(Keys::Leaky),
            Algorithm::Concurrency { queue } => {
                KeyTables::new(cfg, queue, n, h).map(Keys::Concurrency)
            }
        }
    }

    #[inline]
    fn check(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        with_tables!(self, t => t.check(r, key, now))
    }

    fn give_back(&self, key: TableKey, pace: Pace, now: Nanos) -> bool {
        with_tables!(self, t => t.give_back(key, pace, now))
    }

    fn sweep(&self, last: &mut Nanos, now: Nanos) {
        with_tables!(self, t => t.sweep(last, now));
    }

    fn len(&self) -> usize {
        with_tables!(self, t => t.len())
    }

    /// Concurrency keys with requests queued take the route's new limit now, which
    /// wakes as many as a raise lets in (other keys catch up on their next request).
    /// Only a route with a concurrency queue visits its keys.
    fn wake_queued(&self, r: &Route) {
        let Keys::Concurrency(tables) = self else {
            return;
        };
        match tables {
            KeyTables::Ip(t) => t.wake_queued(r),
            KeyTables::Value(t) => t.wake_queued(r),
        }
    }

    fn tiers(&self) -> &TierTable {
        with_tables!(self, t => t.tiers())
    }

    /// Whether a request with `key` is decided by the shared overflow limiter: the
    /// table is full and holds no state of the key's.
    fn overflowed(&self, key: TableKey) -> bool {
        with_tables!(self, t => t.overflowed(key))
    }
}

impl<E: KeyState> KeyTables<E> {
    /// The tables of a partitioned route (`None` for a route limited as a whole).
    fn new(cfg: &RouteConfig, shape: u32, now: Nanos, hold_base: bool) -> Option<Self> {
        match &cfg.partition {
            Partition::Route => None,
            Partition::ClientIp(limits) => Some(KeyTables::Ip(KeyTable::new(
                cfg, *limits, shape, now, hold_base,
            ))),
            Partition::Header(_, limits) => Some(KeyTables::Value(KeyTable::new(
                cfg, *limits, shape, now, hold_base,
            ))),
        }
    }

    #[inline]
    fn check(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        match (self, key) {
            (KeyTables::Ip(t), TableKey::Ip(ip)) => {
                t.check(r, &IpKey::new(ip, t.limits.ipv6_prefix), now, |k| *k)
            }
            (KeyTables::Value(t), TableKey::Value(v)) => t.check(r, &v, now, |k| *k),
            (KeyTables::Ip(t), _) => t.anonymous.check(r, &t.tiers, now),
            (KeyTables::Value(t), _) => t.anonymous.check(r, &t.tiers, now),
        }
    }

    /// Gives a paced request's place back on the state it was scheduled on: its key's,
    /// the shared overflow's ([`Pace`] says which) or the anonymous one.
    fn give_back(&self, key: TableKey, pace: Pace, now: Nanos) -> bool {
        match (self, key) {
            (KeyTables::Ip(t), TableKey::Ip(ip)) => {
                t.give_back(&IpKey::new(ip, t.limits.ipv6_prefix), pace, now)
            }
            (KeyTables::Value(t), TableKey::Value(v)) => t.give_back(&v, pace, now),
            (KeyTables::Ip(t), _) => t.anonymous.give_back(pace, now),
            (KeyTables::Value(t), _) => t.anonymous.give_back(pace, now),
        }
    }

    fn sweep(&self, last: &mut Nanos, now: Nanos) {
        match self {
            KeyTables::Ip(t) => t.sweep(last, now),
            KeyTables::Value(t) => t.sweep(last, now),
        }
    }

    fn len(&self) -> usize {
        match self {
            KeyTables::Ip(t) => t.len.load(Ordering::Relaxed),
            KeyTables::Value(t) => t.len.load(Ordering::Relaxed),
        }
    }

    fn tiers(&self) -> &TierTable {
        match self {
            KeyTables::Ip(t) => &t.tiers,
            KeyTables::Value(t) => &t.tiers,
        }
    }

    fn overflowed(&self, key: TableKey) -> bool {
        match (self, key) {
            (KeyTables::Ip(t), TableKey::Ip(ip)) => {
                t.overflowed(&IpKey::new(ip, t.limits.ipv6_prefix))
            }
            (KeyTables::Value(t), TableKey::Value(v)) => t.overflowed(&v),
            _ => false,
        }
    }
}

/// Tier limits resolved for the key table: each tier's `(base, cut)`, the tier of
/// each value, and the default.
struct TierTable {
    /// Base and cut limits of keys in no tier, as f64 bits: the route's controller
    /// parameters in force, updated when they change (runtime update, reload of the
    /// parameters, scheduled event).
    default: [AtomicU64; 2],
    /// Each tier's base and cut limits, tier `i` at `i - 1`.
    tiers: Vec<(f64, f64)>,
    /// The tier of each tier value, by its key's bits ([`TierKey`]). A key's tier is
    /// looked up at each new key and rejection: a scan of every value of every tier
    /// made each of those cost as much as the list is long (a partner list of 10,000
    /// API keys), for invented keys too.
    index: HashMap<u128, u16>,
    /// The algorithm's fixed parameter, the same for every key: the token bucket's
    /// burst or the windows' length in milliseconds, or the leaky bucket's or the
    /// concurrency limiter's queue.
    shape: u32,
    /// Keys hold their base limit whatever the controller does (shadow_adaptive's
    /// enforced keys).
    hold_base: bool,
}

impl TierTable {
    /// Where the table's keys stand between their cut (0) and base (1) limits.
    fn progress(&self, r: &Route) -> f64 {
        if self.hold_base {
            1.0
        } else {
            f64::from_bits(r.progress.load(Ordering::Relaxed))
        }
    }

    /// The tier of a key of the table (0: none).
    fn tier_of<Q: TierKey>(&self, key: &Q) -> u16 {
        if self.index.is_empty() {
            0
        } else {
            self.index.get(&key.bits()).copied().unwrap_or(0)
        }
    }

    fn set_default(&self, base: f64, cut: f64) {
        self.default[0].store(base.to_bits(), Ordering::Relaxed);
        self.default[1].store(cut.to_bits(), Ordering::Relaxed);
    }

    fn limit(&self, tier: u16, progress: f64) -> f64 {
        let (base, cut) = match tier {
            0 => (
                f64::from_bits(self.default[0].load(Ordering::Relaxed)),
                f64::from_bits(self.default[1].load(Ordering::Relaxed)),
            ),
            i => {
                let (b, c) = &self.tiers[usize::from(i) - 1];
                (*b, *c)
            }
        };
        cut + (base - cut) * progress
    }
}

/// One key's state, stored inline in the key table (no allocation of its own, but for
/// a [`ConcurrencyKey`]'s shared state): its limiter, the tier it belongs to, when it
/// was last seen, and the route generation its limit was last set for (keys catch up
/// with limit changes lazily).
trait KeyState: Send + Sync {
    /// A new key of `tier` at `progress` between its cut and base limits, set for the
    /// route's `generation`.
    fn new(tiers: &TierTable, tier: u16, progress: f64, generation: u32, now: Nanos) -> Self;

    /// Decides one request, after catching up with the route's limit if it changed
    /// since this key last looked.
    fn check(&self, r: &Route, tiers: &TierTable, now: Nanos) -> Decision;

    /// Whether the key may be evicted: unseen since `cutoff` (whole seconds) and
    /// holding nothing at `now`, so that a new key would start where it stands (a
    /// token short of a full bucket, a count in the window, a request still queued
    /// or a concurrency permit still out keeps it).
    fn evictable(&self, cutoff: u32, shape: u32, now: Nanos) -> bool;

    /// Gives back a paced request's place (see [`Pace`]); only a leaky bucket's key
    /// has one.
    fn give_back(&self, _pace: Pace, _now: Nanos) -> bool {
        false
    }
}

/// Whole seconds on the engine's clock, as kept per key (136 years fit).
fn secs(now: Nanos) -> u32 {
    u32::try_from(now.as_u64() / 1_000_000_000).unwrap_or(u32::MAX)
}

/// What every key keeps beside its limiter's state (12 bytes).
struct KeyMeta {
    /// The route generation this key's limit was last set for (wrapping; compared
    /// for equality only).
    generation: AtomicU32,
    /// Whole seconds on the engine's clock when the key was last seen.
    last_seen_s: AtomicU32,
    tier: u16,
}

impl KeyMeta {
    fn new(tier: u16, generation: u32, now: Nanos) -> Self {
        KeyMeta {
            generation: AtomicU32::new(generation),
            last_seen_s: AtomicU32::new(secs(now)),
            tier,
        }
    }

    /// Calls `apply`, which sets the key's limit as the route now is, if the key's
    /// limit was set for an older route generation than the route's, and again while
    /// the route's generation moves on meanwhile; see [`keep_up`].
    #[inline]
    fn keep_up(&self, r: &Route, apply: impl FnMut() -> bool) {
        keep_up(&self.generation, r, Ordering::Acquire, apply);
    }

    /// The key's limit between its tier's cut and base limits, as the route now is.
    fn limit(&self, r: &Route, tiers: &TierTable) -> f64 {
        tiers.limit(self.tier, tiers.progress(r))
    }

    /// Stores the second the key was seen, unless it already says so (most requests
    /// of a busy key find it there and write nothing).
    #[inline]
    fn touch(&self, now: Nanos) {
        touch(&self.last_seen_s, now);
    }

    /// Whether the key was last seen before `cutoff` (whole seconds): a key seen in
    /// the second `cutoff` itself may have been seen after the instant it stands for.
    fn unseen_since(&self, cutoff: u32) -> bool {
        unseen_since(&self.last_seen_s, cutoff)
    }
}

/// [`KeyMeta::unseen_since`], on a key's `last_seen_s` wherever it is kept.
fn unseen_since(last_seen_s: &AtomicU32, cutoff: u32) -> bool {
    last_seen_s.load(Ordering::Relaxed) < cutoff
}

/// Catches a key up with its route's limit changes: if the key's limit was set for an
/// older generation than the route's, records the route's and calls `apply`, which
/// sets the key's limit as the route now is; then, if the route's generation moved on
/// meanwhile, records it and calls `apply` again, until it stays.
///
/// `apply` may decline, never waiting: a token bucket's change returns `false` when
/// another change holds the note it needs (see the `gcra` module docs). The key then
/// records a generation that is not the route's (the one it recorded, less one,
/// unless another request recorded something else meanwhile), so that its next
/// request tries again; this one is decided at the limit the key has. A request
/// that meets the recorded generation before it is put back is decided at that
/// limit too, as one is while another request's change of the key is under way.
///
/// Without the second look, a request that read the route's limit before a change and
/// set it after another request had caught the key up with that change (recording its
/// generation) left the key at the older limit until the route changed again. `apply`
/// must order the limit it sets after the limit set before it, so that the route's
/// generation read after it is at least the one that other request read: a token
/// bucket's change takes its note, which the one before gave back; a window key swaps
/// its limit word (`AcqRel`); a concurrency key stores its limit `SeqCst`, and reads
/// the generation `SeqCst` after it.
///
/// `order` reads the route's generation: `Acquire`, or `SeqCst` for a concurrency key
/// (whose queue is also read or written beside it: see [`ConcurrencyKey::check`]).
#[inline]
fn keep_up(generation: &AtomicU32, r: &Route, order: Ordering, mut apply: impl FnMut() -> bool) {
    let mut seen = r.generation.load(order) as u32;
    if generation.load(Ordering::Relaxed) == seen {
        return;
    }
    loop {
        generation.store(seen, Ordering::Relaxed);
        if !apply() {
            // The route's generation is `seen` or later (it only moves on), so this
            // is not it, short of 2^32 changes in between.
            let _ = generation.compare_exchange(
                seen,
                seen.wrapping_sub(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            return;
        }
        let now = r.generation.load(order) as u32;
        if now == seen {
            return;
        }
        seen = now;
    }
}

/// [`KeyMeta::touch`], on a key's `last_seen_s` wherever it is kept.
#[inline]
fn touch(last_seen_s: &AtomicU32, now: Nanos) {
    let now_s = secs(now);
    if last_seen_s.load(Ordering::Relaxed) != now_s {
        last_seen_s.store(now_s, Ordering::Relaxed);
    }
}

/// A key's token bucket: the GCRA words of [`TokenBucket`](crate::limiter::TokenBucket)
/// laid flat beside the key's own fields, 32 bytes. With its 16-byte key a table slot
/// is 48 bytes. The burst is the route's, read from the [`TierTable`].
struct BucketKey {
    tat: AtomicU64,
    /// Emission interval T: nanoseconds per token.
    emission_ns: AtomicU64,
    /// Tokens the bucket holds.
    capacity: AtomicU32,
    meta: KeyMeta,
}

impl KeyState for BucketKey {
    fn new(tiers: &TierTable, tier: u16, progress: f64, generation: u32, now: Nanos) -> Self {
        let (t, capacity) = gcra::params(tiers.limit(tier, progress), tiers.shape);
        BucketKey {
            tat: AtomicU64::new(gcra::full_at(now)),
            emission_ns: AtomicU64::new(t),
            capacity: AtomicU32::new(capacity),
            meta: KeyMeta::new(tier, generation, now),
        }
    }

    #[inline]
    fn check(&self, r: &Route, tiers: &TierTable, now: Nanos) -> Decision {
        let words = self.words();
        // A change whose note another change holds is left for the key's next
        // request; this one is decided at the limit the key has (see `keep_up`).
        self.meta.keep_up(r, || {
            let changed = Nanos::new(r.changed_at.load(Ordering::Relaxed));
            words.try_set(
                gcra::params(self.meta.limit(r, tiers), tiers.shape),
                changed.min(now),
            )
        });
        self.meta.touch(now);
        match words.take(now) {
            Ok(()) => Decision::Admit(Admit::Now),
            Err(retry_after_ns) => reject(retry_after_ns, Reason::Limit),
        }
    }

    fn evictable(&self, cutoff: u32, _shape: u32, now: Nanos) -> bool {
        self.meta.unseen_since(cutoff) && self.words().full(now)
    }
}

impl BucketKey {
    fn words(&self) -> gcra::Words<'_> {
        gcra::Words {
            tat: &self.tat,
            emission_ns: &self.emission_ns,
            capacity: &self.capacity,
        }
    }
}

/// A key of the fixed window, the sliding window or the leaky bucket: the limiter's
/// state word (the packed counts, or when the next request may leave) and its limit
/// word laid flat beside the key's own fields, 32 bytes like a [`BucketKey`]. The
/// window length or the queue is the route's, read from the [`TierTable`].
struct WordKey<A> {
    state: AtomicU64,
    /// The key's limit in `A`'s form ([`WordAlgo::limit_word`]).
    limit: AtomicU64,
    meta: KeyMeta,
    algorithm: PhantomData<fn() -> A>,
}

/// An algorithm whose per-key state is one word: its decision on [`words`].
trait WordAlgo {
    /// The limit word for `limit` req/s.
    fn limit_word(limit: f64) -> u64;

    /// Decides one request on the state word, with the key's limit word and the
    /// route's [`TierTable::shape`]. Changing the limit word keeps the state.
    fn check(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> Decision;

    /// Whether the state word holds nothing at `now` (as a new key's would).
    fn at_rest(state: &AtomicU64, shape: u32, now: Nanos) -> bool;

    /// Gives back a paced request's place on the state word (see [`Pace`]); only the
    /// leaky bucket paces.
    fn give_back(_state: &AtomicU64, _pace: Pace, _now: Nanos) -> bool {
        false
    }
}

/// [`FixedWindow`](crate::limiter::FixedWindow) per key; the limit word is the limit's bits.
struct Fixed;
/// [`SlidingWindowCounter`](crate::limiter::SlidingWindowCounter) per key; the limit
/// word is the limit's bits.
struct Sliding;
/// [`LeakyBucket`](crate::limiter::LeakyBucket) per key; the limit word is the
/// emission interval.
struct Leaky;

impl WordAlgo for Fixed {
    fn limit_word(limit: f64) -> u64 {
        limit.to_bits()
    }

    fn check(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> Decision {
        let window_ns = words::window_ns(shape);
        let quota = words::quota(f64::from_bits(limit_word), window_ns);
        words::fixed(state, quota as u64, window_ns, now)
    }

    fn at_rest(state: &AtomicU64, shape: u32, now: Nanos) -> bool {
        words::fixed_count(state, words::window_ns(shape), now) == 0
    }
}

impl WordAlgo for Sliding {
    fn limit_word(limit: f64) -> u64 {
        limit.to_bits()
    }

    fn check(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> Decision {
        let window_ns = words::window_ns(shape);
        let quota = words::quota(f64::from_bits(limit_word), window_ns);
        words::sliding(state, quota, window_ns, now)
    }

    fn at_rest(state: &AtomicU64, shape: u32, now: Nanos) -> bool {
        words::sliding_count(state, words::window_ns(shape), now) == 0.0
    }
}

impl WordAlgo for Leaky {
    fn limit_word(limit: f64) -> u64 {
        interval_ns(limit)
    }

    fn check(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> Decision {
        words::leaky(state, limit_word, shape, now)
    }

    fn at_rest(state: &AtomicU64, _shape: u32, now: Nanos) -> bool {
        state.load(Ordering::Relaxed) <= now.as_u64()
    }

    fn give_back(state: &AtomicU64, pace: Pace, now: Nanos) -> bool {
        words::give_back(state, pace, now)
    }
}

impl<A: WordAlgo> KeyState for WordKey<A> {
    fn new(tiers: &TierTable, tier: u16, progress: f64, generation: u32, now: Nanos) -> Self {
        WordKey {
            state: AtomicU64::new(0),
            limit: AtomicU64::new(A::limit_word(tiers.limit(tier, progress))),
            meta: KeyMeta::new(tier, generation, now),
            algorithm: PhantomData,
        }
    }

    #[inline]
    fn check(&self, r: &Route, tiers: &TierTable, now: Nanos) -> Decision {
        // A swap, `AcqRel`: a key's limits are set one after another, each after the
        // one it replaces, as `keep_up` needs.
        self.meta.keep_up(r, || {
            let limit = self.meta.limit(r, tiers);
            self.limit.swap(A::limit_word(limit), Ordering::AcqRel);
            true
        });
        self.meta.touch(now);
        A::check(
            &self.state,
            self.limit.load(Ordering::Relaxed),
            tiers.shape,
            now,
        )
    }

    fn evictable(&self, cutoff: u32, shape: u32, now: Nanos) -> bool {
        self.meta.unseen_since(cutoff) && A::at_rest(&self.state, shape, now)
    }

    fn give_back(&self, pace: Pace, now: Nanos) -> bool {
        A::give_back(&self.state, pace, now)
    }
}

/// A key of the concurrency limiter. Its permits outlive any place in the key table
/// (which moves its entries as it grows), so its state is shared on the heap.
struct ConcurrencyKey {
    /// Keeps the key's tier and route generation too ([`Concurrency::for_key`]).
    limiter: Concurrency,
    /// Whole seconds on the engine's clock when the key was last seen.
    last_seen_s: AtomicU32,
}

impl KeyState for ConcurrencyKey {
    fn new(tiers: &TierTable, tier: u16, progress: f64, generation: u32, now: Nanos) -> Self {
        let limit = tiers.limit(tier, progress);
        ConcurrencyKey {
            limiter: Concurrency::for_key(limit, tiers.shape, generation, tier),
            last_seen_s: AtomicU32::new(secs(now)),
        }
    }

    #[inline]
    fn check(&self, r: &Route, tiers: &TierTable, now: Nanos) -> Decision {
        keep_up(self.limiter.key_generation(), r, Ordering::SeqCst, || {
            self.take_limit(r, tiers)
        });
        touch(&self.last_seen_s, now);
        let decision = self.limiter.check();
        // Queued: a limit change may have looked for this key's waiters (`wake_queued`)
        // before the request counted itself in the queue, and passed the key by. The
        // request then looks at the route's generation again, after counting itself:
        // both sides write (`SeqCst`), then read what the other wrote (`SeqCst`), so
        // at least one of them sees the other and the key takes the new limit, which
        // wakes as many as it lets in.
        if matches!(decision, Decision::Admit(Admit::Queued(_))) {
            keep_up(self.limiter.key_generation(), r, Ordering::SeqCst, || {
                self.take_limit(r, tiers)
            });
        }
        decision
    }

    fn evictable(&self, cutoff: u32, _shape: u32, _now: Nanos) -> bool {
        // A request still queued counts as held: a permit handed back leaves none in
        // flight until the request it woke takes it, from this state.
        unseen_since(&self.last_seen_s, cutoff) && self.limiter.is_idle()
    }
}

impl ConcurrencyKey {
    /// Takes the route's limit now if requests are queued on the key and it changed
    /// (after the route's generation was raised; see [`ConcurrencyKey::check`] for a
    /// request queued meanwhile).
    fn wake_queued(&self, r: &Route, tiers: &TierTable) {
        if self.limiter.has_waiters() {
            keep_up(self.limiter.key_generation(), r, Ordering::SeqCst, || {
                self.take_limit(r, tiers)
            });
        }
    }

    /// Sets the key's limit for its tier, as the route now is (always: `true`, as
    /// [`keep_up`] takes it).
    fn take_limit(&self, r: &Route, tiers: &TierTable) -> bool {
        let tier = self.limiter.key_tier();
        self.limiter.set_limit(tiers.limit(tier, tiers.progress(r)));
        true
    }
}

impl<K: Hash + Eq> KeyTable<K, ConcurrencyKey> {
    /// [`ConcurrencyKey::wake_queued`] on every key, the shared ones too; nothing
    /// without a queue, where no request waits.
    fn wake_queued(&self, r: &Route) {
        if self.tiers.shape == 0 {
            return;
        }
        self.overflow.wake_queued(r, &self.tiers);
        self.anonymous.wake_queued(r, &self.tiers);
        if let Some(map) = self.map.get() {
            for entry in map.iter() {
                entry.wake_queued(r, &self.tiers);
            }
        }
    }
}

/// The least time between two sweeps of a full key table, which evict every key at
/// rest (see [`KeyTable::sweep`]); a table of over 100,000 keys waits a microsecond
/// per key, as a sweep visits every key.
const FULL_SWEEP_EVERY: Duration = Duration::from_millis(100);

struct KeyTable<K, E> {
    /// Made at the first key: DashMap allocates its shards up front ((4 × cores)
    /// rounded up to a power of two, 128 bytes each), which a route whose keys never
    /// come, or a shadow table outside cuts, need not pay.
    map: OnceLock<DashMap<K, E>>,
    len: AtomicUsize,
    limits: KeyLimits,
    tiers: TierTable,
    /// Shared by new keys while the table is full.
    overflow: E,
    /// Shared by requests that carry no key.
    anonymous: E,
}

impl<K: Hash + Eq, E: KeyState> KeyTable<K, E> {
    fn new(cfg: &RouteConfig, limits: KeyLimits, shape: u32, now: Nanos, hold_base: bool) -> Self {
        let p = &cfg.controller;
        let tiers = TierTable {
            default: [
                AtomicU64::new(p.base_limit_rps.to_bits()),
                AtomicU64::new(p.cut_limit_rps.to_bits()),
            ],
            tiers: cfg
                .tiers
                .iter()
                .map(|t: &Tier| (t.base_limit_rps, t.cut_limit_rps))
                .collect(),
            index: tier_index(cfg),
            shape,
            hold_base,
        };
        KeyTable {
            map: OnceLock::new(),
            len: AtomicUsize::new(0),
            limits,
            overflow: E::new(&tiers, 0, 1.0, 0, now),
            anonymous: E::new(&tiers, 0, 1.0, 0, now),
            tiers,
        }
    }

    #[inline]
    fn check<Q>(&self, r: &Route, key: &Q, now: Nanos, own: impl FnOnce(&Q) -> K) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + TierKey,
    {
        if let Some(entry) = self.map.get().and_then(|map| map.get(key)) {
            return entry.check(r, &self.tiers, now);
        }
        // A key of a tier takes a place beyond `max_keys` (at most as many as the
        // tiers' values): a full table sent it to the overflow limiter at the route's
        // limit, which a client inventing keys both filled and drained.
        let tier = self.tiers.tier_of(key);
        if tier == 0 && self.len.load(Ordering::Relaxed) >= self.limits.max_keys {
            return self.check_overflow(r, now);
        }
        // Generation first: a limit change between the two loads then leaves the new
        // key a generation behind, to catch up on its next request.
        let generation = r.generation.load(Ordering::Acquire) as u32;
        let progress = self.tiers.progress(r);
        let map = self.map.get_or_init(DashMap::new);
        let entry = match map.entry(own(key)) {
            Entry::Occupied(entry) => entry.into_ref(),
            // A place is taken before the key goes in: threads adding keys to a table
            // one short of full each found room, and passed `max_keys` together.
            Entry::Vacant(entry) => {
                let max = if tier == 0 {
                    self.limits.max_keys
                } else {
                    usize::MAX
                };
                let reserved = self
                    .len
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                        (n < max).then_some(n + 1)
                    })
                    .is_ok();
                if !reserved {
                    drop(entry);
                    return self.check_overflow(r, now);
                }
                entry.insert(E::new(&self.tiers, tier, progress, generation, now))
            }
        };
        entry.check(r, &self.tiers, now)
    }

    /// Decides a new key's request on the shared overflow state (the table is full).
    fn check_overflow(&self, r: &Route, now: Nanos) -> Decision {
        match self.overflow.check(r, &self.tiers, now) {
            Decision::Admit(Admit::Paced(mut pace)) => {
                pace.overflow = true;
                Decision::Admit(Admit::Paced(pace))
            }
            decision => decision,
        }
    }

    /// Gives a paced request's place back on the state `key`'s request was scheduled
    /// on: the overflow's if [`Pace`] says so, else the key's own (a key evicted since
    /// held nothing scheduled, so there is nothing to give back).
    fn give_back<Q>(&self, key: &Q, pace: Pace, now: Nanos) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if pace.overflow {
            return self.overflow.give_back(pace, now);
        }
        self.map
            .get()
            .and_then(|map| map.get(key))
            .is_some_and(|entry| entry.give_back(pace, now))
    }

    /// Whether `key` is decided by [`KeyTable::overflow`]: the table is full, `key` is
    /// not in it, and it is in no tier.
    fn overflowed<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + TierKey,
    {
        self.len.load(Ordering::Relaxed) >= self.limits.max_keys
            && !self.map.get().is_some_and(|map| map.contains_key(key))
            && self.tiers.tier_of(key) == 0
    }

    /// Evicts keys idle for `idle_timeout`, at most every half of it; while the table
    /// is full, every key at rest, idle or not, at most every [`FULL_SWEEP_EVERY`] or a
    /// microsecond per key of `max_keys`, whichever is longer (a sweep of 10,000 keys
    /// takes about 0.1 ms, of 1,000,000 about 20 ms: 2% of a core at most).
    ///
    /// A key at rest (a full bucket, an empty window, no permit held or request
    /// queued) decides its next request as a new key would, so evicting it loses
    /// nothing. Evicting only idle keys let a client that sent one request on each
    /// of `max_keys` invented keys every `idle_timeout` (10,000 per 5 minutes, 33
    /// req/s) keep the table full, and every new client in the one overflow limiter
    /// that it drained too. It must now hold `max_keys` keys off rest at once, again
    /// after each sweep.
    fn sweep(&self, last: &mut Nanos, now: Nanos) {
        let full = self.len.load(Ordering::Relaxed) >= self.limits.max_keys;
        let idle_every = self.limits.idle_timeout / 2;
        let every = if full {
            let per_key =
                Duration::from_micros(u64::try_from(self.limits.max_keys).unwrap_or(u64::MAX));
            idle_every.min(FULL_SWEEP_EVERY.max(per_key))
        } else {
            idle_every
        };
        if now.saturating_since(*last) < every {
            return;
        }
        *last = now;
        let Some(map) = self.map.get() else {
            return;
        };
        let cutoff = if full {
            u32::MAX
        } else {
            secs(now - self.limits.idle_timeout)
        };
        map.retain(|_, e| {
            let keep = !e.evictable(cutoff, self.tiers.shape, now);
            if !keep {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            keep
        });
    }
}

/// The tier of each of the route's tier values (tiers counted from 1), by the bits of
/// the key they are (an address of a client-IP partition cut to the route's
/// `ipv6_prefix`, so `::FFFF:10.0.0.7` matches the client 10.0.0.7 and an IPv6 address
/// every client of its prefix; a header value as [`ValueKey::new`] keys it, so a long
/// one by its digest); a value that two tiers hold, which only an address and another
/// of its IPv6 prefix can be, is the first's. A tier value of a client-IP partition
/// that is no address is no client's (the configuration refuses it).
fn tier_index(cfg: &RouteConfig) -> HashMap<u128, u16> {
    let mut index = HashMap::new();
    for (i, tier) in cfg.tiers.iter().enumerate() {
        let n = u16::try_from(i + 1).unwrap_or(u16::MAX);
        for value in &tier.values {
            let bits = match cfg.partition {
                Partition::ClientIp(limits) => match value.parse::<IpAddr>() {
                    Ok(ip) => IpKey::new(ip, limits.ipv6_prefix).bits(),
                    Err(_) => continue,
                },
                _ => ValueKey::new(value).bits(),
            };
            index.entry(bits).or_insert(n);
        }
    }
    index
}

/// A key-table key as the 128 bits its tier is looked up by.
trait TierKey {
    fn bits(&self) -> u128;
}

/// A client IP as a key-table key: the IPv6 address's bits (past the route's
/// `ipv6_prefix` zeroed), IPv4 in its IPv4-mapped form, so that a key is 16 bytes with
/// no tag (an `IpAddr` is 17, padded to 24 beside
/// a key's state: 8 B more per key). An IPv4 client and the same address mapped into
/// IPv6 share a key.
#[derive(Clone, Copy, PartialEq, Eq)]
struct IpKey(u128);

/// The prefix of IPv4-mapped IPv6 addresses (`::ffff:0:0/96`), shifted down 32 bits.
const V4_MAPPED: u128 = 0xffff;

impl IpKey {
    /// The key of `ip`: an IPv4 address whole, an IPv6 one by its first `v6_prefix`
    /// bits (1 to 128).
    #[inline]
    fn new(ip: IpAddr, v6_prefix: u8) -> Self {
        IpKey(match ip.to_canonical() {
            IpAddr::V4(v4) => V4_MAPPED << 32 | u128::from(v4.to_bits()),
            IpAddr::V6(v6) => {
                v6.to_bits() & (u128::MAX << (128 - u32::from(v6_prefix.clamp(1, 128))))
            }
        })
    }
}

impl Hash for IpKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        // An IPv4 key hashes its 4 bytes only (SipHash's cost grows with the input).
        if self.0 >> 32 == V4_MAPPED {
            state.write_u32(self.0 as u32);
        } else {
            state.write_u128(self.0);
        }
    }
}

impl TierKey for IpKey {
    fn bits(&self) -> u128 {
        self.0
    }
}

/// A header value as a key-table key: 16 bytes in the table's slot, whatever the
/// value's length, and nothing on the heap. A value of up to
/// [`MAX_KEY_VALUE_BYTES`] (15) bytes is kept whole: its bytes, zero-padded, and its
/// length in the 16th byte. A longer one is the first 128 bits of its SHA-256, so that
/// a key costs the same whether its value is a user id, a 1 KiB JWT or the hundreds
/// of KiB an HTTP/1 head may carry.
///
/// Every value has one key on every instance and every run (no seed). Two values share
/// a key only if their SHA-256s agree in 128 bits: a client who knows this code needs
/// about 2^64 hashes to make two of its own values collide (which only makes them
/// share one quota), and about 2^128 to find a value with another client's key, short
/// or long. No marker sets a kept value apart from a digest: with 16 bytes to a key
/// there is no bit left for one, and a 17th byte would pad each table slot by 8 (up
/// to 130 B per key just after a table doubles, over the 128 B target).
///
/// Held as bytes, not a `u128`, so that a [`TableKey`] is no bigger and no more aligned
/// than the [`Key`] it is made of (17 bytes and 1, against 24 and 8; a `u128`, aligned
/// to 16, made it 32 and 16).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ValueKey([u8; 16]);

impl ValueKey {
    /// The key of a header value.
    #[inline]
    fn new(value: &str) -> Self {
        let bytes = value.as_bytes();
        let mut key = [0u8; 16];
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= MAX_KEY_VALUE_BYTES => {
                key[..bytes.len()].copy_from_slice(bytes);
                key[15] = len;
            }
            _ => {
                use sha2::Digest as _;
                key.copy_from_slice(&sha2::Sha256::digest(bytes)[..16]);
            }
        }
        ValueKey(key)
    }
}

impl Hash for ValueKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128(self.bits());
    }
}

impl TierKey for ValueKey {
    #[inline]
    fn bits(&self) -> u128 {
        u128::from_le_bytes(self.0)
    }
}

/// A read-only view of one route.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RouteSnapshot {
    /// Route name.
    pub name: String,
    /// Unique to the route's state in this process: a reload that rebuilds the route
    /// (a new window, algorithm, mode, partition or tiers) starts its counts from zero
    /// under a new serial; one that keeps it keeps the serial.
    pub serial: u64,
    /// Enforce or shadow.
    pub mode: Mode,
    /// Controller state.
    pub state: ControllerState,
    /// When the controller entered its state.
    pub state_since: Nanos,
    /// Demand in each half-window over completed slots.
    pub sample: RocSample,
    /// ROC of the last completed slot, in the route's mode.
    pub roc: f64,
    /// The controller's current limit, req/s (per key on partitioned routes).
    pub limit_rps: f64,
    /// The base limit in force (an event's, while one is active).
    pub base_limit_rps: f64,
    /// The cut limit in force.
    pub cut_limit_rps: f64,
    /// The danger threshold in force.
    pub danger_roc: f64,
    /// The safe threshold in force.
    pub safe_roc: f64,
    /// The route-level limiter's level (tokens, count, queue or in-flight).
    pub level: Level,
    /// Requests offered (admitted and rejected alike).
    pub offered: u64,
    /// Requests admitted (offered less rejected; shadow modes admit all).
    pub admitted: u64,
    /// Requests rejected, by reason.
    pub rejected: Vec<(Reason, u64)>,
    /// Requests a shadow mode admitted but would have rejected, by reason.
    pub shadow_rejected: Vec<(Reason, u64)>,
    /// Cuts since start.
    pub cuts: u64,
    /// Total time spent in `Cut`.
    pub time_in_cut: Duration,
    /// Transition counts, `[from][to]` indexed by [`ControllerState::as_index`].
    pub transitions: [[u64; 3]; 3],
    /// The scheduled event in force, if any.
    pub active_event: Option<String>,
    /// Keys tracked (partitioned routes).
    pub keys: usize,
    /// Keys a partitioned route tracks at most (its `max_keys`; 0 for a route limited
    /// as a whole): once `keys` reaches it, new keys share one overflow limiter.
    pub max_keys: usize,
    /// The window's shape.
    pub window: WindowSpec,
    /// The `min_rps` in force (the floor of relative ROC).
    pub min_rps: f64,
    /// Whether `roc`, `danger_roc` and `safe_roc` are absolute or relative.
    pub roc_mode: RocMode,
    /// The enforcing algorithm's name, as in config.
    pub algorithm: &'static str,
}

impl RouteSnapshot {
    /// Total rejected, all reasons.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().map(|(_, n)| n).sum()
    }

    /// Rejected for `reason`.
    pub fn rejected_for(&self, reason: Reason) -> u64 {
        count_for(&self.rejected, reason)
    }

    /// Admitted by a shadow mode but would have been rejected for `reason`.
    pub fn shadow_rejected_for(&self, reason: Reason) -> u64 {
        count_for(&self.shadow_rejected, reason)
    }
}

fn count_for(counts: &[(Reason, u64)], reason: Reason) -> u64 {
    counts
        .iter()
        .find(|(r, _)| *r == reason)
        .map_or(0, |(_, n)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{KeyLimits, Tier};
    use std::net::Ipv4Addr;

    fn ip(n: u32) -> Key<'static> {
        Key::Ip(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)))
    }

    /// Offers `rate` req/s of `key` evenly from `from` to `to` (seconds).
    fn offer(e: &Engine, id: RouteId, key: Key<'_>, from: f64, to: f64, rate: f64) {
        let n = ((to - from) * rate).round() as u64;
        for k in 0..n {
            let _ = e.check(id, key, Nanos::from_secs_f64(from + k as f64 / rate));
        }
    }

    /// Keys in the route's shadow key table.
    fn shadow_keys(e: &Engine, id: RouteId) -> usize {
        match &e.route(id).unwrap().shadow {
            Some(Shadow::Keys(keys)) => keys.len(),
            _ => panic!("a shadow_adaptive partitioned route has a shadow key table"),
        }
    }

    /// In `shadow_adaptive` mode, the shadow key table's idle keys are evicted after
    /// `idle_timeout` while the enforced table stays full, and is swept every 100 ms.
    /// The shadow table used to be swept on the enforced table's clock: with the
    /// enforced table swept every 100 ms, the shadow table, not full and swept every
    /// half `idle_timeout`, never found that much time gone, and kept its keys.
    #[test]
    fn the_shadow_key_table_is_swept_on_its_own_clock() {
        let mut cfg = RouteConfig::new("sa-sweep", crate::config::RouteMatch::any());
        cfg.mode = Mode::ShadowAdaptive;
        cfg.partition = Partition::ClientIp(KeyLimits {
            max_keys: 2,
            idle_timeout: Duration::from_secs(10),
            ..KeyLimits::default()
        });
        cfg.controller.base_limit_rps = 10.0;
        cfg.controller.cut_limit_rps = 3.0;
        cfg.controller.danger_roc = 50.0;
        cfg.controller.safe_roc = 10.0;
        cfg.algorithm = Algorithm::TokenBucket {
            burst: Duration::from_secs(1024),
        };
        // Two keys whose one request each leaves their buckets short for 1,024 s: the
        // enforced table is full, and none of its keys is at rest.
        cfg.tiers = vec![Tier::new(
            "slow",
            vec!["10.0.0.1", "10.0.0.2"],
            1.0 / 1024.0,
            1.0 / 2048.0,
        )];
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
        let id = e.route_at(0).unwrap();
        for n in [1, 2] {
            assert!(e.check(id, ip(n), Nanos::ZERO).is_admit());
        }
        offer(&e, id, Key::None, 0.0, 10.0, 8.0);
        offer(&e, id, Key::None, 10.0, 11.0, 500.0);
        let cut = e.route_snapshot(id, Nanos::from_secs(11)).unwrap();
        assert_eq!(cut.state, ControllerState::Cut);
        // A new client during the cut: the enforced table is full (it goes to the
        // overflow limiter), the shadow table takes it.
        offer(&e, id, ip(3), 11.0, 11.5, 4.0);
        assert_eq!(shadow_keys(&e, id), 1);
        // Anonymous requests roll the window on, every slot, for 30 s.
        offer(&e, id, Key::None, 11.5, 41.5, 10.0);
        let now = Nanos::from_secs_f64(41.5);
        assert_eq!(e.route_snapshot(id, now).unwrap().keys, 2, "still full");
        assert_eq!(
            shadow_keys(&e, id),
            0,
            "the shadow key idle for 30 s, idle_timeout 10 s, was evicted"
        );
    }

    /// The layout the per-key memory target rests on (`tests/memory.rs` measures the
    /// tables): a key of the token bucket, either window or the leaky bucket and its
    /// 16-byte key fill a 48-byte slot.
    #[test]
    fn a_key_fills_a_48_byte_slot() {
        fn slot<E>() -> [usize; 3] {
            use std::mem::size_of;
            [
                size_of::<E>(),
                size_of::<(IpKey, E)>(),
                size_of::<(ValueKey, E)>(),
            ]
        }
        assert_eq!(slot::<BucketKey>(), [32, 48, 48]);
        // A key as the tables take it is no bigger than the `Key` it is made of, nor
        // more aligned (a 16-aligned header key made it 32 bytes against 24).
        assert!(std::mem::size_of::<TableKey>() <= std::mem::size_of::<Key<'_>>());
        assert!(std::mem::align_of::<TableKey>() <= std::mem::align_of::<Key<'_>>());
        assert_eq!(slot::<WordKey<Fixed>>(), [32, 48, 48]);
        assert_eq!(slot::<WordKey<Sliding>>(), [32, 48, 48]);
        assert_eq!(slot::<WordKey<Leaky>>(), [32, 48, 48]);
        // Its state is on the heap, where its permits can reach it, with its tier and
        // generation: a 32-byte slot.
        assert_eq!(slot::<ConcurrencyKey>(), [16, 32, 32]);
    }

    /// A header value of up to 15 bytes is its own key; a longer one is the first 128
    /// bits of its SHA-256, the published one (FIPS 180-2's two-block example), so
    /// that every instance and every build keys it alike.
    #[test]
    fn a_long_header_value_is_keyed_by_its_sha256() {
        let long = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        let sha256_prefix = 0x248d6a61_d20638b8_e5c02693_0c3e6039_u128.swap_bytes();
        assert_eq!(ValueKey::new(long).bits(), sha256_prefix);
        // The same value, one key; values that differ in their last byte, two.
        let (a, b) = (
            format!("{}a", "k".repeat(99_999)),
            format!("{}b", "k".repeat(99_999)),
        );
        assert_eq!(ValueKey::new(&a).bits(), ValueKey::new(&a.clone()).bits());
        assert_ne!(ValueKey::new(&a).bits(), ValueKey::new(&b).bits());
        // Kept whole: its bytes, and its length in the 16th byte, so that "k" and
        // "k\0" are two keys.
        let short = ValueKey::new("fifteen-bytes-k").bits().to_le_bytes();
        assert_eq!(&short[..15], b"fifteen-bytes-k");
        assert_eq!(short[15], 15);
        assert_ne!(ValueKey::new("k").bits(), ValueKey::new("k\0").bits());
        assert_ne!(ValueKey::new("").bits(), ValueKey::new("\0").bits());
    }

    /// The request that wins the slot rollover at 2 s takes the event's profile, and
    /// its change of the route's bucket finds the note taken: it is decided at the
    /// old limit (a 21st request at 2 s is admitted), not held until the note is free
    /// (the test hung there, in `Note::take`), and the route is behind. The first
    /// decision after the note is given back makes the change: the bucket holds 20
    /// tokens and admits 20 at once. The event's end at 3 s, taken by an upkeep
    /// (`catch_up`) while the note is held again, reaches the bucket at the next
    /// upkeep, with no request in between.
    #[test]
    fn a_rollover_winner_never_waits_for_another_buckets_change() {
        let ms = Nanos::from_millis;
        // 200/s (200 tokens), and from 2 s to 3 s an event that brings it to 20/s.
        let mut cfg = RouteConfig::new("held_note", crate::config::RouteMatch::any());
        let mut event = cfg.controller.clone();
        event.base_limit_rps = 20.0;
        event.cut_limit_rps = 10.0;
        let start = std::time::UNIX_EPOCH + Duration::from_secs(2);
        cfg.events = vec![Event::new("sale", start, Duration::from_secs(1), event)];
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
        let (id, r) = (e.route_at(0).unwrap(), &*e.routes[0].route);
        crate::limiter::gcra::with_the_note_held(|| {
            let n = (0..21)
                .filter(|_| e.check(id, Key::None, ms(2_000)).is_admit())
                .count();
            assert_eq!(n, 21, "decided at 200/s meanwhile");
            assert_eq!(e.limit_rps(id), Some(20.0));
            assert_eq!(r.behind.load(Ordering::Relaxed), BEHIND_LIMITER);
        });
        assert_eq!(r.limiter.level(ms(2_000)).capacity, 200.0);
        let n = (0..100)
            .filter(|_| e.check(id, Key::None, ms(2_000)).is_admit())
            .count();
        assert_eq!(n, 20);
        assert_eq!(r.behind.load(Ordering::Relaxed), 0);
        assert_eq!(r.limiter.level(ms(2_000)).capacity, 20.0);
        crate::limiter::gcra::with_the_note_held(|| {
            e.catch_up(id, ms(3_000));
            assert_eq!(e.limit_rps(id), Some(200.0));
            assert_eq!(r.behind.load(Ordering::Relaxed), BEHIND_LIMITER);
        });
        assert_eq!(r.limiter.level(ms(3_000)).capacity, 20.0);
        e.catch_up(id, ms(3_000));
        assert_eq!(r.behind.load(Ordering::Relaxed), 0);
        assert_eq!(r.limiter.level(ms(3_000)).capacity, 200.0);
    }

    /// A concurrency route's slot reports say how many requests were in flight when
    /// the slot closed (what its base limit counts, for the tuning hints); other
    /// algorithms' say nothing.
    #[test]
    fn slot_reports_carry_the_count_in_flight_of_a_concurrency_route() {
        let seen = |algorithm: Algorithm| {
            let mut cfg = RouteConfig::new("in_flight_report", crate::config::RouteMatch::any());
            cfg.algorithm = algorithm;
            cfg.controller.base_limit_rps = 10.0;
            cfg.controller.cut_limit_rps = 5.0;
            let reports = Arc::new(Mutex::new(Vec::new()));
            let hook = {
                let reports = Arc::clone(&reports);
                move |_: &str, r: &SlotReport| reports.lock().unwrap().push(r.in_flight)
            };
            let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH)
                .unwrap()
                .with_sample_hook(Arc::new(hook));
            let id = e.route_at(0).unwrap();
            let held: Vec<Decision> = (0..3)
                .map(|_| e.check(id, Key::None, Nanos::ZERO))
                .collect();
            assert!(held.iter().all(Decision::is_admit));
            let _ = e.check(id, Key::None, Nanos::from_millis(250));
            let seen = reports.lock().unwrap().clone();
            seen
        };
        let counts = seen(Algorithm::Concurrency { queue: 0 });
        assert!(!counts.is_empty());
        assert!(counts.iter().all(|&n| n == Some(3.0)), "{counts:?}");
        let bucket = seen(Algorithm::TokenBucket {
            burst: Duration::from_secs(1),
        });
        assert!(
            !bucket.is_empty() && bucket.iter().all(Option::is_none),
            "{bucket:?}"
        );
    }

    /// A sample hook that panics once (at the first slot's report, 0.5 s) poisons the
    /// route's state lock, which the request rolling the window held. The route still
    /// rolls: the request that wins the rollover at 2 s takes the event's profile
    /// (20/s), and when its change finds the note taken, the next decision makes it.
    /// Before, `try_lock` failed on the poisoned lock forever: no request rolled the
    /// window or stepped the controller again, the limit stayed 200/s through the
    /// event (a cut in force then would have stayed in force for good), and no
    /// decision made a change left behind.
    #[test]
    fn a_route_whose_lock_a_panicking_hook_poisoned_still_rolls() {
        let ms = Nanos::from_millis;
        let mut cfg = RouteConfig::new("poisoned_lock", crate::config::RouteMatch::any());
        let mut event = cfg.controller.clone();
        event.base_limit_rps = 20.0;
        event.cut_limit_rps = 10.0;
        let start = std::time::UNIX_EPOCH + Duration::from_secs(2);
        cfg.events = vec![Event::new("sale", start, Duration::from_secs(1), event)];
        let panicked = Arc::new(AtomicBool::new(false));
        let hook = {
            let panicked = Arc::clone(&panicked);
            move |_: &str, _: &SlotReport| {
                if !panicked.swap(true, Ordering::Relaxed) {
                    panic!("the sample hook fails once");
                }
            }
        };
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH)
            .unwrap()
            .with_sample_hook(Arc::new(hook));
        let (id, r) = (e.route_at(0).unwrap(), &*e.routes[0].route);
        let rolled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            e.check(id, Key::None, ms(500))
        }));
        assert!(rolled.is_err() && r.state.is_poisoned());
        crate::limiter::gcra::with_the_note_held(|| {
            assert!(e.check(id, Key::None, ms(2_000)).is_admit());
            assert_eq!(e.limit_rps(id), Some(20.0), "the event's limit");
            assert_eq!(r.behind.load(Ordering::Relaxed), BEHIND_LIMITER);
        });
        assert!(e.check(id, Key::None, ms(2_000)).is_admit());
        assert_eq!(r.behind.load(Ordering::Relaxed), 0);
        assert_eq!(r.limiter.level(ms(2_000)).capacity, 20.0);
    }

    /// A key's request that must catch up with a change of its route's limit (4/s
    /// lowered to 1/s, one second's burst), while the note the key's bucket needs is
    /// held by another bucket's change: decided at the key's old limit (2 of 4 tokens
    /// left: admitted), not held until the note is free (the test hung there, in
    /// `Note::take`). Its next request catches up: the one token left at 4/s stays
    /// one at 1/s, and a request after it waits a second. At 0 the key admitted 4,
    /// its old capacity.
    #[test]
    fn a_keyed_request_never_waits_for_another_buckets_change() {
        let mut cfg = RouteConfig::new("held_note_keys", crate::config::RouteMatch::any());
        cfg.partition = crate::config::Partition::ClientIp(crate::config::KeyLimits::default());
        cfg.controller.base_limit_rps = 4.0;
        cfg.controller.cut_limit_rps = 1.0;
        let e = Engine::new(&Config::new(vec![cfg]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
        let (id, key) = (
            e.route_at(0).unwrap(),
            Key::Ip(std::net::Ipv4Addr::new(10, 0, 0, 1).into()),
        );
        for _ in 0..2 {
            assert!(e.check(id, key, Nanos::ZERO).is_admit());
        }
        let mut params = e.route_params(id).unwrap();
        params.base_limit_rps = 1.0;
        e.update_route(id, params, Nanos::ZERO).unwrap();
        crate::limiter::gcra::with_the_note_held(|| {
            assert!(e.check(id, key, Nanos::ZERO).is_admit())
        });
        assert!(e.check(id, key, Nanos::ZERO).is_admit());
        let r = e.check(id, key, Nanos::ZERO).rejection().expect("empty");
        assert_eq!(r.retry_after, Duration::from_secs(1));
    }

    /// The sample hook says which slots the controller acted on: none before one full
    /// window (6 s) from the start, every one after.
    #[test]
    fn slot_reports_say_whether_the_controller_was_armed() {
        let config = Config::new(vec![RouteConfig::new(
            "r",
            crate::config::RouteMatch::any(),
        )]);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        let engine = Engine::new(&config, Nanos::ZERO, std::time::UNIX_EPOCH)
            .unwrap()
            .with_sample_hook(Arc::new(move |_: &str, r: &SlotReport| {
                sink.lock().unwrap().push((r.at, r.armed));
            }));
        let id = engine.route_at(0).unwrap();
        for ms in (0..8_000).step_by(50) {
            let _ = engine.check(id, Key::None, Nanos::from_millis(ms));
        }
        let seen = seen.lock().unwrap();
        assert!(seen.len() > 70, "{}", seen.len());
        for &(at, armed) in seen.iter() {
            assert_eq!(armed, at >= Nanos::from_secs(6), "at {at}");
        }
    }
}
