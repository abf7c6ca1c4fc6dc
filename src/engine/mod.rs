//! The engine: route table, partitions, windows, controllers and limiters behind one call.
//!
//! [`Engine::check`] decides one request: count it in the route's window (one relaxed
//! atomic add), and, if its slot is later than the one accumulating, advance the
//! window and step the controller first; then ask the limiter (one CAS on the bucket
//! word). Only the one request that wins a slot rollover takes the route's state lock,
//! with `try_lock`: on a route as a whole no request ever waits for another. On a
//! partitioned route a request may wait briefly on its key's shard of the key table
//! while another request inserts a key there or a sweep evicts idle keys from it (a
//! request's, or a sweeper thread's: [`Engine::set_sweeps_apart`]); one its key
//! admits is then tried against the route's `route_limit` over its keys together, if
//! it has one (one CAS more). Nothing allocates unless a new key enters a partitioned
//! route.
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

mod aggregate;
mod events;
mod key_types;
mod keys;
mod snapshot;

use aggregate::Aggregate;
use events::follow_events;
pub use events::Schedule;
use key_types::IpKey;
pub(crate) use key_types::TableKey;
use keys::{Keys, Shadow};
pub use snapshot::{RouteLimitSnapshot, RouteSnapshot};

use crate::clock::Nanos;
use crate::config::{
    Config, ConfigError, Event, Mode, Partition, Problem, RouteConfig, RouteMatch, Tier,
};
use crate::controller::{
    Controller, ControllerMemory, ControllerParams, ControllerState, Transition, TransitionCounts,
};
use crate::distinct::KeySketch;
use crate::limiter::{
    Admit, Algorithm, Concurrency, Decision, Level, Limiter, Pace, Reason, Rejection, TokenBucket,
};
use crate::route_index::RouteIndex;
use crate::sync::{
    AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Mutex, MutexGuard, Ordering,
};
use crate::window::{RocSample, SampleAt, SlotCounter, SlotRing, WindowSpec};
use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::{Arc, PoisonError};
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

/// Whether two partitions key a request alike: the same kind, header and IPv6
/// prefix, whatever their tables' `max_keys` and `idle_timeout`, which bound a table
/// and leave what a key names alone. A reload hands a keyed `concurrency` route's
/// permits over between such partitions, and a keyed rate algorithm's state.
fn same_keys(a: &Partition, b: &Partition) -> bool {
    match (a, b) {
        (Partition::Route, Partition::Route) => true,
        (Partition::ClientIp(a), Partition::ClientIp(b)) => a.ipv6_prefix == b.ipv6_prefix,
        (Partition::Header(a, _), Partition::Header(b, _)) => a == b,
        _ => false,
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
    /// [`MAX_KEY_VALUE_BYTES`](crate::config::MAX_KEY_VALUE_BYTES) bytes whole and a
    /// longer one by a 128-bit digest of it.
    Value(&'a str),
}

/// Called with each controller transition: the route's name and the transition.
///
/// A hook runs while the engine holds the route's state: it must not call back into
/// the engine for a route (a snapshot, [`Engine::catch_up`], [`Engine::upkeep`], a
/// change or a reload wait for that state, and on its own route would wait for ever).
/// Hand what it needs to another thread instead.
pub type TransitionHook = Arc<dyn Fn(&str, &Transition) + Send + Sync>;

/// Called with every completed slot: the route's name and what the controller saw and
/// did. Once per slot and route, never per request. It runs as a
/// [`TransitionHook`] does, the route's state held, and must not call back into the
/// engine.
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
    /// The headers, in lower case and each once, that routes are partitioned by.
    key_headers: Box<[String]>,
    hook: Option<TransitionHook>,
    sample_hook: Option<SampleHook>,
    /// Whether the partitioned routes' idle keys are swept by [`Engine::sweep_due`]
    /// only, not by the request (or catch-up) that rolls a route's window
    /// ([`Engine::set_sweeps_apart`]). Read after a rollover only. Shared with the
    /// engines [`Engine::reload`] builds from this one, and with the one this one was
    /// built from. Always `std`'s: a setting, in no loom model.
    sweeps_apart: Arc<std::sync::atomic::AtomicBool>,
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

/// The lane counter of requests a cut refused that the base limit admits. In
/// `shadow_adaptive` mode, those the base limit admitted that a cut would have
/// rejected (its shadow limiter counts them); in `enforce` and `shadow`, on a route
/// limited as a whole by a token bucket, those a cut rejected that the route's twin
/// at the base limit admits ([`Shadow::Twin`]). One quantity, so one counter.
const CUT_REJECTED: usize = 1 + Reason::ALL.len();
/// The lane counter of keys a partitioned route's sweeps evicted.
const KEYS_EVICTED: usize = CUT_REJECTED + 1;
/// The lane counter of requests a cut admitted that the twin at the base limit
/// refuses ([`Shadow::Twin`]): [`KEYS_EVICTED`]'s, as a lane holds 8 counters and
/// the others are all taken. The two never meet: a twin is only on a route limited
/// as a whole, which has no key table to evict from, and only a partitioned route
/// evicts keys. (A route's snapshot reads the slot as the one its route has.)
const CUT_ADMITTED: usize = KEYS_EVICTED;
const _: () = assert!(KEYS_EVICTED < crate::lanes::COUNTERS);

/// [`Route::behind`]: the route's limiter.
const BEHIND_LIMITER: u8 = 1;
/// [`Route::behind`]: the shadow limiter of a `shadow_adaptive` route-wide route.
const BEHIND_SHADOW: u8 = 2;
/// [`Route::behind`]: the twin of an `enforce` or `shadow` route-wide token bucket
/// ([`Shadow::Twin`]), whose rate follows the base limit while a cut holds.
const BEHIND_TWIN: u8 = 4;
/// [`Route::behind`]: the total over a partitioned route's keys ([`Aggregate`]),
/// whose limit follows the cut.
const BEHIND_AGGREGATE: u8 = 16;
/// The [`Route::behind`] bits of changes left to make.
const BEHIND_CHANGES: u8 = BEHIND_LIMITER | BEHIND_SHADOW | BEHIND_TWIN | BEHIND_AGGREGATE;
/// [`Route::behind`]: a cut holds on a route with a twin ([`Shadow::Twin`]), which
/// every decision is tried against too, out of line ([`Engine::decide_twinned`]).
/// No change is left to make for it: it sends the route's decisions out of line for
/// as long as the cut holds, and for no longer.
const TWIN_ENGAGED: u8 = 8;

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
    /// The configured tiers, boxed: a slice's two words, not a vector's three.
    tiers: Box<[Tier]>,
    reject_status: AtomicU16,
    counter: SlotCounter,
    /// Route-level enforcement (partition `Route`); for shadow_adaptive, at base limit.
    limiter: Limiter,
    /// shadow_adaptive: at the controller's limit, to count what a cut would reject.
    /// `enforce` and `shadow` with a route-wide token bucket: its twin at the base
    /// limit, to count what a cut rejects that the base limit would not.
    shadow: Option<Shadow>,
    /// Set once a reload has rebuilt this route around its concurrency permits, route
    /// wide or per key ([`Route::hand_over`]): their limit is then the new route's to
    /// set, and this route's controller and keys leave it alone. Written under the
    /// state lock, read under it (route wide) or by a key catching up with a limit
    /// change (a hint there, read without the lock: loom's under loom, so that the
    /// models see a key read it as the hand-over is made; see [`Route::hand_over`]).
    handed_over: AtomicBool,
    /// Whether a shared store decides the route's requests: set by
    /// [`Engine::record`], which counts them, and cleared by a decision here that
    /// rolls the window. While set, bringing the route up to date (a reload, a runtime
    /// change, [`Engine::catch_up`]) advances its window only: its controller is the
    /// store's to step, and one stepped here once, by whatever came next, stood there.
    elsewhere: AtomicBool,
    /// Which of the route-wide limiters ([`BEHIND_LIMITER`], [`BEHIND_SHADOW`],
    /// [`BEHIND_TWIN`], [`BEHIND_AGGREGATE`]) a limit change has not reached yet: a
    /// token bucket's change that found its note taken, left for the next decision on
    /// the route ([`Route::finish_change`]); and [`TWIN_ENGAGED`] while a cut holds on a route
    /// with a twin. Written under the state lock only, read by decisions as a hint (a
    /// stale read puts the change off, or tries the lock, for one decision, and
    /// decides one request with or without the twin at a cut's edges). Loom's under
    /// loom, as the lock is, so that the models see a decision read it as a cut
    /// engages or ends.
    behind: AtomicU8,
    /// What only a partitioned route has. Boxed: a route limited as a whole (most
    /// routes) pays a pointer for it.
    partitioned: Option<Box<Partitioned>>,
    /// Bumped whenever the controller's limit or parameters change; keys catch up lazily.
    generation: AtomicU64,
    /// When the limit last changed (ns on the engine's clock), what a route-wide
    /// limiter's change left behind is dated by; no change is dated before it. Keys
    /// date theirs by their table's own ([`keys::TierTable::set_default`]).
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
    /// Set while a thread sweeps a partitioned route's key tables ([`Route::sweep`]),
    /// apart from `state`: one sweep at a time. Loom's under loom.
    sweeping: AtomicBool,
    /// When the key table, and the shadow key table, were last swept (ns on the
    /// engine's clock): each on a cadence of its own, as one of the two may be full
    /// (swept often) and the other not. Read and written by the sweeping thread only.
    /// These and `sweeping` are in the route, not in [`Partitioned`]: they take bytes
    /// the route's alignment (64) leaves unused.
    swept: [AtomicU64; 2],
}

/// Lets go of a route's sweep ([`Route::sweeping`]) when dropped, a sweep that
/// panicked included.
struct Sweeping<'a>(&'a AtomicBool);

impl Drop for Sweeping<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A partitioned route's own state, beside the [`Route`]'s.
struct Partitioned {
    /// The key tables.
    keys: Keys,
    /// The limit over the keys together (`route_limit`), tried after a key's own
    /// admits. Boxed: a route without one pays a pointer.
    aggregate: Option<Box<Aggregate>>,
    /// On a route with tiers, when the controller's progress between cut and base
    /// will next rise, which raises a tier's key limits (as [`Route::next_raise`]).
    next_tier_raise: AtomicU64,
    /// When the route's [`engaged`](Route::engaged) last became true (whole seconds on
    /// the engine's clock), or, on a route rebuilt by a reload that carried the cut,
    /// when the old route's did: a `shadow_adaptive` route's shadow key last seen
    /// before then was last tried in an earlier cut.
    engaged_since_s: AtomicU32,
}

struct RouteState {
    ring: SlotRing,
    controller: Controller,
    /// The route's own profile, in force outside events.
    own: ControllerParams,
    events: Vec<ScheduledEvent>,
    /// `own` and `events` as a [`Schedule`], what [`Engine::schedule`] hands out:
    /// built at its first call after a change of either ([`RouteState::reschedule`]
    /// drops it), so that a route no shared store asks for costs a pointer, not a
    /// copy of its parameters.
    schedule: Option<Arc<Schedule>>,
    active_event: Option<usize>,
    counts: TransitionCounts,
    /// When `counts` began: the route's build. A cut carried from the route this one
    /// rebuilds ([`Route::new`]) counts its time in cut from then, the old route's
    /// counts holding the time before.
    counted_from: Nanos,
}

/// A configured event, placed on the engine's clock.
struct ScheduledEvent {
    name: String,
    start: Nanos,
    end: Nanos,
    /// The profile in force while it runs: `configured` moved onto the route's own
    /// parameters ([`ScheduledEvent::rebased`]).
    params: ControllerParams,
    /// The event as configured, and the route's own parameters it was written over
    /// then: what a runtime change moves onto its new parameters, each time from
    /// these, so that a field the event sets stays its own through changes that pass
    /// by its value, and a change withdrawn leaves the profile as configured.
    configured: (Event, ControllerParams),
    /// The configured wall-clock start and duration, from which `start` and `end`
    /// are placed again ([`Engine::align_events`]).
    wall: (SystemTime, Duration),
}

impl ScheduledEvent {
    /// Whether the event is in force at `now`: from its start, up to its end.
    fn runs_at(&self, now: Nanos) -> bool {
        self.start <= now && now < self.end
    }
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
            .map(|r| Arc::new(Route::new(r, &r.controller, now, wall_now, None, None)))
            .collect();
        Ok(Engine::assemble(config, routes, None, None, Arc::default()))
    }

    /// The engine of `config`'s routes, built or kept in its order.
    fn assemble(
        config: &Config,
        routes: Vec<Arc<Route>>,
        hook: Option<TransitionHook>,
        sample_hook: Option<SampleHook>,
        sweeps_apart: Arc<std::sync::atomic::AtomicBool>,
    ) -> Engine {
        let matchers: Box<[RouteMatch]> = config.routes.iter().map(|r| r.matcher.clone()).collect();
        let index = (matchers.len() > SCAN_ROUTES).then(|| RouteIndex::new(&matchers));
        let mut key_headers: Vec<String> = config
            .routes
            .iter()
            .filter_map(|r| match &r.partition {
                Partition::Header(name, _) => Some(name.to_ascii_lowercase()),
                _ => None,
            })
            .collect();
        key_headers.sort_unstable();
        key_headers.dedup();
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
            key_headers: key_headers.into(),
            hook,
            sample_hook,
            sweeps_apart,
        }
    }

    /// A new engine for `config` that keeps the live state (window, controller,
    /// buckets, keys, counters) of every route whose name and structure (matcher, mode,
    /// window, algorithm, partition, tiers) are unchanged; their controller parameters
    /// and events are replaced in place, and a route whose parameters in force (its
    /// own, or an event's running) changed takes no action for one full window. Other
    /// routes start fresh, but a route rebuilt under the same name keeps its
    /// controller's state (a cut, a restore under way, at its share of the way from
    /// the cut limit to the base where the limit comes to count something else:
    /// [`ControllerMemory::carried_across`]) under the new parameters, taking no action
    /// for one window, and the permits of a `concurrency` route that stays one
    /// (by name; its mode, window, queue, matcher or limits changed), limited as a
    /// whole, or per key with the same partition (its `max_keys` and `idle_timeout`
    /// aside) and tiers: the route rebuilt takes
    /// them over (each key's under the same key), with the requests queued for them,
    /// and counts them under its own limit until they are released, which frees a
    /// place in it; from then on their limit is the new route's to set, and the old
    /// route leaves it alone. Both engines share the kept routes and the permits taken
    /// over, so requests still in flight on the old one count in the new one. A
    /// partitioned route limited by a rate algorithm that stays the same (with its
    /// burst, window or queue), rebuilt with the same keys and tiers, carries each key's
    /// state (tokens, window counts, leaky schedule) and last-seen time, and the shared
    /// overflow and keyless states, into the new route at its limit for the key as its
    /// carried controller stands: copied once the new engine is built, the most
    /// recently seen up to a smaller `max_keys` (and every key of a tier). So does a
    /// `shadow_adaptive` route's shadow key table, which follows the cut (a route the
    /// reload moves into `shadow_adaptive` builds it from its keys, which followed the
    /// cut); a route the reload moves out of `shadow_adaptive` during a cut takes each
    /// key from that table where it saw the key since the cut began (it is filled only
    /// during cuts, and a key last seen in an earlier cut stands where that cut left
    /// it), from the keys that held the base otherwise. A route limited as a whole carries its
    /// limiter's state the same way, and a partitioned route its `route_limit`
    /// total's, each by the limit it holds (the cut's, or the base's: a twin's, a
    /// `shadow_adaptive` route's; the cut's where the old route held none at the
    /// base), where the new route has one of the same
    /// algorithm: a token bucket's tokens (any burst, converted to the new rate and
    /// capacity), a window counter's counts (a window of the same length), a leaky
    /// bucket's schedule (any queue). A limiter of another algorithm, or a window
    /// counter of another window, starts afresh at the carried limit. The old route
    /// decides on its own state until the new engine is put in force: a request it
    /// decides after its state was copied is not counted in the new route. A
    /// partitioned route rebuilt under the same name carries the keys it refused
    /// since the hints history last took them ([`Engine::take_refused_keys`]; a kept
    /// route holds them still), counted by the same hash.
    /// `config`'s routes are checked first, as for [`Engine::new`]: an error leaves
    /// this engine as it was.
    pub fn reload(
        &self,
        config: &Config,
        now: Nanos,
        wall_now: SystemTime,
    ) -> Result<Engine, ConfigError> {
        self.reload_keeping(config, &[], now, wall_now)
            .map(|(engine, _)| engine)
    }

    /// [`Engine::reload`], each route named in `changes` taking the parameters given
    /// there as its own in place of `config`'s (a runtime change kept through the
    /// reload, as [`Engine::update_route`] would make it on the new engine), in the
    /// same step: a route kept never has `config`'s parameters in force, even for an
    /// instant, and one whose parameters are those in force takes no pause in its
    /// controller. Its events' profiles are `config`'s, moved onto the change
    /// ([`Event::profile_on`]). A change that the new route's algorithm,
    /// tiers or events refuse (checked as `update_route` checks one) is not made: the
    /// route takes `config`'s parameters, and the change comes back with its error.
    /// A name that is no route of `config` is ignored.
    pub fn reload_keeping(
        &self,
        config: &Config,
        changes: &[(String, ControllerParams)],
        now: Nanos,
        wall_now: SystemTime,
    ) -> Result<(Engine, Vec<RefusedChange>), ConfigError> {
        config.validate()?;
        let mut refused = Vec::new();
        let mut keys_handed = Vec::new();
        let mut states_carried = Vec::new();
        // Looked up by name, each name's first: a route is kept, or hands its permits
        // and keys over, only under its own name (names are unique in an engine, as
        // `Config::validate` wants them), and trying every old route for each new one
        // made a reload quadratic in the routes.
        let mut old_routes: HashMap<&str, usize> = HashMap::with_capacity(self.routes.len());
        for (at, e) in self.routes.iter().enumerate() {
            old_routes.entry(&*e.route.name).or_insert(at);
        }
        let mut changes_by_name: HashMap<&str, &ControllerParams> = HashMap::new();
        for (name, params) in changes {
            changes_by_name.entry(name.as_str()).or_insert(params);
        }
        let routes = config
            .routes
            .iter()
            .enumerate()
            .map(|(i, cfg)| {
                let change = changes_by_name.get(cfg.name.as_str()).copied();
                let own = match change.map(|params| changed(cfg, params, wall_now)) {
                    Some(Ok(checked)) => Cow::Owned(checked),
                    Some(Err(error)) => {
                        refused.push(RefusedChange {
                            route: cfg.name.clone(),
                            error,
                        });
                        Cow::Borrowed(cfg)
                    }
                    None => Cow::Borrowed(cfg),
                };
                let before = old_routes
                    .get(cfg.name.as_str())
                    .map(|&at| (&self.routes[at].route, &self.matchers[at]));
                let kept = before.filter(|(r, m)| **m == cfg.matcher && r.same_structure(cfg));
                match kept.map(|(r, _)| r) {
                    Some(r) => {
                        let hook = self.hook.as_ref();
                        // `own`'s: the file's, but those a kept change retired.
                        let events = Some((own.events.as_slice(), &cfg.controller));
                        // The silence before the reload is stepped under the parameters
                        // that were in force during it.
                        self.bring_up_to(r, now);
                        if let (Some(a), Some(total)) = (r.aggregate(), cfg.route_limit_rps) {
                            a.configure(total);
                        }
                        r.reconfigure(&own.controller, events, now, wall_now, hook);
                        r.reject_status.store(cfg.reject_status, Ordering::Relaxed);
                        Arc::clone(r)
                    }
                    None => {
                        let before = before.map(|(r, _)| r);
                        // The controller goes on where the silence before the reload
                        // left it: a cut is not dropped by a change of window,
                        // algorithm, mode, partition or tiers. A restore keeps its
                        // place between the cut and the base where the limit comes to
                        // count something else.
                        let carried = before.map(|r| {
                            self.bring_up_to(r, now);
                            let st = r.lock();
                            let memory = st.controller.memory();
                            if r.limit_counts_as(cfg) {
                                memory
                            } else {
                                memory.carried_across(st.controller.params(), &own.controller, now)
                            }
                        });
                        if let Some(r) = before {
                            states_carried.push((i, r));
                        }
                        let handed = before.and_then(|r| r.hand_over(cfg));
                        if let Some(HandedOver::Keys(keys, queue, _)) = handed {
                            // A rate algorithm's shadow keys (shadow_adaptive's, which
                            // follow a cut) are carried too: from the old route's shadow
                            // keys, or, a route that was not shadow_adaptive, from its
                            // keys, which followed the cut. A concurrency route's start
                            // afresh, its old ones left to the old route.
                            let shadow = match before.map(|r| &r.shadow) {
                                _ if matches!(cfg.algorithm, Algorithm::Concurrency { .. }) => None,
                                Some(Some(Shadow::Keys(old))) => Some(&**old),
                                _ => Some(keys),
                            };
                            // A route moved out of shadow_adaptive during a cut enforces
                            // it: a key its shadow table tried in this cut comes from
                            // there, not from the key that held the base. (Outside a cut
                            // the shadow keys are not tried, and stand where the last cut
                            // left them.)
                            let cut = before
                                .filter(|_| cfg.mode != Mode::ShadowAdaptive)
                                .filter(|r| r.engaged.load(Ordering::Relaxed))
                                .and_then(|r| match &r.shadow {
                                    Some(Shadow::Keys(old)) => {
                                        let since = &r.partitioned.as_deref()?.engaged_since_s;
                                        Some((&**old, since.load(Ordering::Relaxed)))
                                    }
                                    _ => None,
                                });
                            keys_handed.push((i, keys, cut, queue, shadow));
                        }
                        let written_over = &cfg.controller;
                        let carried = carried.map(|memory| (memory, self.hook.as_ref()));
                        let route = Route::new(&own, written_over, now, wall_now, handed, carried);
                        // A cut carried began when the old route's did, not at the reload.
                        let engaged = |r: &Route| r.engaged.load(Ordering::Relaxed);
                        let old = before
                            .filter(|r| engaged(r))
                            .and_then(|r| r.partitioned.as_deref());
                        let new = route.partitioned.as_deref().filter(|_| engaged(&route));
                        if let (Some(old), Some(new)) = (old, new) {
                            let since = old.engaged_since_s.load(Ordering::Relaxed);
                            new.engaged_since_s.store(since, Ordering::Relaxed);
                        }
                        // The keys the route refused since the hints history last took
                        // them, read, not taken: the old engine decides on until the
                        // swap, and its route is dropped with it.
                        let refused = before.and_then(|r| r.keys()?.refused_by_hash());
                        if let (Some(keys), Some((hasher, refused))) = (route.keys(), refused) {
                            keys.carry_refused(hasher, &refused);
                        }
                        Arc::new(route)
                    }
                }
            })
            .collect();
        let mut engine = Engine::assemble(
            config,
            routes,
            self.hook.clone(),
            self.sample_hook.clone(),
            Arc::clone(&self.sweeps_apart),
        );
        // The state of a route rebuilt, and the keys of a partitioned route handed
        // over, come in last, once the rest is built, so that fewer decisions are made
        // on the old engine after they are taken (they are not counted in the new
        // route), and fewer keys are first reached there (a client's first request
        // during the reload): such a key is not carried, and its permits are not
        // counted in the new route.
        for (i, old) in states_carried {
            engine.routes[i].route.take_state(old, now);
        }
        for (i, old, cut, queue, old_shadow) in keys_handed {
            let built = engine
                .routes
                .get_mut(i)
                .and_then(|s| Arc::get_mut(&mut s.route));
            if let Some(r) = built {
                // The carried controller's, as `Route::start` put it in force.
                let progress = f64::from_bits(r.progress.load(Ordering::Relaxed));
                if let Some(p) = r.partitioned.as_mut() {
                    p.keys.take_over(old, cut, queue, progress);
                }
                if let (Some(Shadow::Keys(new)), Some(old)) = (r.shadow.as_mut(), old_shadow) {
                    new.take_over(old, None, queue, progress);
                }
            }
        }
        Ok((engine, refused))
    }

    /// Replaces a route's own controller parameters at runtime, keeping its state: the
    /// limit is recomputed for the current controller state and applied to the existing
    /// limiters (tokens clamped, never refilled). Each scheduled event's profile
    /// follows the change in the fields it leaves as the route's own parameters were
    /// when it was configured ([`Event::profile_on`]), and keeps those it sets,
    /// whatever changes came before: while an event is active, a change to a field it
    /// sets applies when it ends.
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
        checked.route_limit_rps = r.aggregate().map(|a| a.own_rps());
        checked.tiers = r.tiers.to_vec();
        let ended: Vec<bool>;
        (checked.events, ended) = {
            // As `reconfigure` will have them: moved onto the new parameters.
            let st = r.lock();
            let moved = st.events.iter().map(|e| {
                let moved = e.rebased(&checked.controller);
                Event::new(e.name.clone(), e.wall.0, e.wall.1, moved)
            });
            (
                moved.collect(),
                st.events.iter().map(|e| e.end <= now).collect(),
            )
        };
        let retired = refused_by_file(&checked, |i| ended.get(i) == Some(&true))?;
        {
            let mut st = r.lock();
            for i in retired {
                if let Some(e) = st.events.get_mut(i) {
                    e.retire();
                }
            }
            st.reschedule();
        }
        // The silence before the change is stepped under the parameters that were in
        // force during it.
        self.bring_up_to(r, now);
        r.reconfigure(
            &checked.controller,
            None,
            now,
            SystemTime::UNIX_EPOCH,
            self.hook.as_ref(),
        );
        Ok(())
    }

    /// Shares each partitioned route's `route_limit` among `instances` (taken as 1
    /// below 1): this engine then holds the total ÷ `instances`, its burst with it, as
    /// of `now` (a limit change: tokens clamped to the new capacity, never refilled;
    /// a cut scales the share as it scales the total; the silence before `now` is
    /// stepped first, under the share it had). 1, the default, holds the
    /// whole total. A Redis store that this engine is given to
    /// (`RedisStore::follow`) sets it to the fleet's live count, and again at each
    /// change of the count. A route already shared so is left alone.
    pub fn set_route_limit_share(&self, instances: u64, now: Nanos) {
        for slot in &self.routes {
            let r = &slot.route;
            let Some(a) = r.aggregate().filter(|a| !a.is_shared_by(instances)) else {
                continue;
            };
            // The silence before the change is stepped under the share in force
            // during it: a restore step in it must not take the new share from its
            // own instant, refilling at it before it was set.
            self.bring_up_to(r, now);
            let st = r.lock();
            if a.set_share(instances) {
                r.apply_limit(&st.controller, now);
            }
        }
    }

    /// The route's own controller parameters (outside events); `None` if this engine
    /// does not hold `route` (see [`RouteId`]).
    pub fn route_params(&self, route: RouteId) -> Option<ControllerParams> {
        Some(self.route(route)?.lock().own.clone())
    }

    /// What the hints for the route's events need ([`crate::hints::follow_in_events`]),
    /// read under one hold of the route's lock: its algorithm, its own parameters and
    /// its scheduled events as configured, each with the profile it runs (its own
    /// fields over those own parameters). So a runtime change ([`Engine::update_route`])
    /// is in all of them or in none. `None` if this engine does not hold `route` (see
    /// [`RouteId`]).
    pub fn route_tuning(&self, route: RouteId) -> Option<crate::hints::RouteTuning> {
        let r = self.route(route)?;
        let st = r.lock();
        Some(crate::hints::RouteTuning {
            algorithm: r.algorithm,
            own: st.own.clone(),
            events: st
                .events
                .iter()
                .map(|e| crate::config::Event {
                    controller: e.params.clone(),
                    ..e.configured.0.clone()
                })
                .collect(),
        })
    }

    /// What the tuning hints need to know of the route: name, mode, algorithm,
    /// whether it is partitioned and the controller parameters in force (an event's while one is active); `None` if
    /// this engine does not hold `route` (see [`RouteId`]). Never `distributed`: the
    /// store that shares a route is `rocgate serve`'s, which says so.
    pub fn route_settings(&self, route: RouteId) -> Option<crate::hints::RouteSettings> {
        let r = self.route(route)?;
        let st = r.lock();
        Some(crate::hints::RouteSettings {
            name: r.name.to_string(),
            mode: r.mode,
            algorithm: r.algorithm,
            params: st.controller.params().clone(),
            partitioned: r.partition != Partition::Route,
            tiered: !r.tiers.is_empty(),
            route_limit_rps: r.aggregate().map(|a| a.configured_rps()),
            route_limit_instances: r.aggregate().map_or(1, Aggregate::instances),
            distributed: false,
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
        let due = st.events.iter().find(|e| e.runs_at(now));
        Some(crate::hints::RouteSettings {
            name: r.name.to_string(),
            mode: r.mode,
            algorithm: r.algorithm,
            params: due.map_or_else(|| st.own.clone(), |e| e.params.clone()),
            partitioned: r.partition != Partition::Route,
            tiered: !r.tiers.is_empty(),
            route_limit_rps: r.aggregate().map(|a| {
                due.and_then(|e| e.configured.0.route_limit_rps)
                    .unwrap_or_else(|| a.own_rps())
            }),
            route_limit_instances: r.aggregate().map_or(1, Aggregate::instances),
            distributed: false,
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
        Some(self.route(route)?.lock().params_due(now).clone())
    }

    /// The route's [`Schedule`]: its own parameters and its scheduled events' profiles,
    /// from which [`params_at`](Self::params_at) tells those due at any time. (A
    /// shared store steps its controller, over the slots since it last did, under
    /// these.) The one in force, shared: the route builds it again whenever its
    /// parameters or events change (a reload, a runtime change, an event placed
    /// again), so that taking it costs no copy; the next call sees a change made
    /// since. `None` if this engine does not hold `route` (see [`RouteId`]).
    pub fn schedule(&self, route: RouteId) -> Option<Arc<Schedule>> {
        let mut st = self.route(route)?.lock();
        let st = &mut *st;
        let schedule = st
            .schedule
            .get_or_insert_with(|| Arc::new(events::schedule_of(&st.own, &st.events)));
        Some(Arc::clone(schedule))
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
            let mut moved = false;
            for e in &mut st.events {
                moved |= e.align(now, wall_now);
            }
            if moved {
                st.reschedule();
            }
        }
    }

    /// Brings a route up to `now` as a request at `now` would, without counting one:
    /// its window advances over the slots that have passed, its controller steps
    /// through them (taking the scheduled event due), its idle keys are swept (unless
    /// the engine sweeps them apart: [`Engine::set_sweeps_apart`]), and a
    /// limit change its route-wide limiter is still behind on (one that found its
    /// token bucket's note taken) is made. Otherwise a route without requests stands
    /// where its last request left it: a cut that its silence outlasted reads as a
    /// cut, for as long as the silence, in snapshots, metrics and the admin API; its
    /// idle keys stay in memory; an event shows only from its next request. `rocgate serve` calls this every 5 s for the
    /// routes it decides itself; the simulator at the start of every slot without
    /// arrivals. A route whose requests a shared store decides ([`Engine::record`]
    /// counts them, and no decision here has rolled its window since) has its window
    /// advanced only: its controller is the store's to step. Nothing happens if this
    /// engine does not hold `route` (see [`RouteId`]).
    pub fn catch_up(&self, route: RouteId, now: Nanos) {
        if let Some(r) = self.route(route) {
            self.bring_up_to(r, now);
        }
    }

    /// Brings `r` up to `now`: its window rolled and its controller stepped over the
    /// slots completed since the last request (a silence), or a limit change left
    /// half-made finished. A route a shared store decides ([`Route::elsewhere`]) has
    /// its window advanced only. Unlike a request, which leaves the roll to whoever holds
    /// the route's state, it waits for it: a snapshot holding it must not leave a
    /// change about to be made without the silence stepped before it, nor a cut that
    /// the silence outlasted in what the caller reads next.
    fn bring_up_to(&self, r: &Route, now: Nanos) {
        if r.counter.needs_roll(now) {
            let mut st = r.lock();
            // A request may have rolled while this waited.
            if r.elsewhere.load(Ordering::Relaxed) {
                st.ring
                    .advance(&r.counter, r.counter.slot_index(now), |_| {});
            } else if r.counter.needs_roll(now) {
                self.roll_locked(r, &mut st, now);
                drop(st);
                self.sweep_rolled(r, now);
            }
        } else if r.behind.load(Ordering::Relaxed) & BEHIND_CHANGES != 0 {
            r.finish_change();
        }
    }

    /// Periodic upkeep for a process that runs for days: places the scheduled events
    /// again from the wall clock ([`Engine::align_events`]) and brings every route up
    /// to now ([`Engine::catch_up`]) but those `decided_elsewhere` (by a shared store,
    /// which steps their controllers), whose profile in force it only follows: a
    /// scheduled event shows in their snapshots from its start to its end.
    /// `rocgate serve` and `AdmissionLayer::upkeep` (feature `http`) call it.
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
            } else if let Some(r) = self.route(id) {
                // The store steps its controller under the profile due then
                // ([`Engine::params_at`]); the route's own, which never steps (its
                // state stays `Normal`), shows which profile that is, for snapshots
                // (`active_event`, the limits) and metrics.
                r.lock().follow_events(now);
            }
        }
    }

    /// Sets whether the partitioned routes' idle keys are swept apart from requests:
    /// by [`Engine::sweep_due`] only, which a thread of the caller's then runs (every
    /// 100 ms, the fastest a full table is swept, as `rocgate::http::Sweeper` does,
    /// feature `http`). Off by default: the request (or [`Engine::catch_up`], a runtime
    /// change, a reload) that rolls a route's window runs the route's sweep once it
    /// has let go of the route's state, and that request waits for it (about 20 ms at
    /// 1,000,000 keys) before it has its decision. Off again, requests sweep again.
    /// The engines that [`Engine::reload`] builds from this one, and the one it was
    /// built from, share the setting: set on one, it is set on all, so that a reload
    /// built before a sweeper thread stopped (and set this engine back) does not put
    /// an engine in force that sweeps apart with no thread to sweep it. Costs requests
    /// nothing: it is read after a rollover only.
    pub fn set_sweeps_apart(&self, apart: bool) {
        self.sweeps_apart
            .store(apart, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the partitioned routes' idle keys are swept apart from requests
    /// ([`Engine::set_sweeps_apart`]).
    pub fn sweeps_apart(&self) -> bool {
        self.sweeps_apart.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sweeps the key tables of every partitioned route whose sweep is due at `now`,
    /// as a rollover would ([`Engine::set_sweeps_apart`]): keys idle for
    /// `idle_timeout` whose limiter holds nothing are evicted, at most every half of
    /// it, and while a table is full every key at rest, at most every 100 ms (or a
    /// microsecond per key of `max_keys`, if longer). A table whose sweep is not due
    /// is left as it is, in a few nanoseconds; a route limited as a whole has nothing
    /// to sweep. A route's sweep that another thread is running (a request's, on an
    /// engine that does not sweep apart) is left to it. Blocks for as long as the
    /// sweeps take (about 20 ms a table of 1,000,000 keys): call it on a thread of its
    /// own, not on an async runtime's worker.
    pub fn sweep_due(&self, now: Nanos) {
        for slot in &self.routes {
            slot.route.sweep(now);
        }
    }

    /// Calls `hook` with every controller transition (for metrics, logs, simulation).
    #[must_use]
    pub fn with_transition_hook(mut self, hook: TransitionHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Calls `hook` with every completed slot's ROC (for the ROC histogram).
    #[must_use]
    pub fn with_sample_hook(mut self, hook: SampleHook) -> Self {
        self.sample_hook = Some(hook);
        self
    }

    /// The first route, in config order, that takes a request with this method and
    /// path (compared once [normalized](crate::config::normalize_path), without its
    /// segments' parameters: [`matching_path`](crate::config::matching_path)): the route
    /// whose [`RouteMatch::matches`] is true and that no earlier route's is. For a
    /// service that routes on the normalized path (behind `rocgate serve`: nginx,
    /// Apache, Spring normalize), so that another spelling of a route's path cannot
    /// reach its handler past its limit. In a table of more than [`SCAN_ROUTES`]
    /// routes it is found through an index built with the engine, so that its cost
    /// does not grow with the number of routes; in a smaller one by trying each route
    /// in turn, which costs less there.
    #[inline]
    pub fn route_for(&self, method: &str, path: &str) -> Option<RouteId> {
        self.first_route(method, &crate::config::matching_path(path))
    }

    /// [`route_for`](Self::route_for) on the path as written, for a service that
    /// routes on it (tower and axum normalize nothing): there a template's parameter
    /// may be `..` or hold a backslash (`/api/items/..` reaches the
    /// `/api/items/{id}` handler, where normalized it is `/api/`), and
    /// `/static/../api/login` is no login. A target that is no path (`OPTIONS *`) is
    /// `/`, as normalized.
    #[inline]
    pub fn route_for_written(&self, method: &str, path: &str) -> Option<RouteId> {
        self.first_route(method, if path.starts_with('/') { path } else { "/" })
    }

    #[inline]
    fn first_route(&self, method: &str, path: &str) -> Option<RouteId> {
        let index = match &self.index {
            Some(index) => index.first(&self.matchers, method, path),
            None => self.matchers.iter().position(|m| m.matches(method, path)),
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

    /// Decides one request on `r`: at once, or, when its window needs rolling, a
    /// limit change is left to make or a cut holds on a route with a twin, out of
    /// line, in a tail call: no value of the common path has to be kept across a call
    /// for it.
    #[inline(always)]
    fn decide(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        if r.counter.needs_roll(now) || r.behind.load(Ordering::Relaxed) != 0 {
            return self.decide_late(r, key, now);
        }
        self.decide_now(r, key, now)
    }

    /// [`Engine::decide`] of a request that finds its window to roll or a limit change
    /// left to make ([`Route::finish_change`]): does that first. While a cut holds on a
    /// route with a twin, decides with it ([`Engine::decide_twinned`]).
    #[cold]
    #[inline(never)]
    fn decide_late(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        if r.counter.needs_roll(now) {
            self.roll(r, now);
        } else if r.behind.load(Ordering::Relaxed) & BEHIND_CHANGES != 0 {
            r.finish_change();
        }
        if r.behind.load(Ordering::Relaxed) & TWIN_ENGAGED != 0 {
            if let (Limiter::TokenBucket(bucket), Some(Shadow::Twin(twin))) =
                (&r.limiter, &r.shadow)
            {
                return self.decide_twinned(r, bucket, twin, now);
            }
        }
        self.decide_now(r, key, now)
    }

    /// Decides one request on a route-wide token bucket, `bucket`, while a cut holds,
    /// as [`Engine::decide_now`] does, and tries it against the bucket's `twin` at the
    /// base limit, which every request takes a token from if it has one, as the base
    /// limit alone would have: a refusal that the twin admits counts in
    /// [`CUT_REJECTED`], an admission that the twin refuses in [`CUT_ADMITTED`] (the
    /// bucket at the cut and its twin at base have tokens at other instants, so the
    /// cut admits some requests the base limit alone would have refused then). The
    /// first less the second is the cut's own refusals over its span: the route's
    /// refusals less the twin's.
    ///
    /// Both are counted only on a decision that read the route
    /// [`engaged`](Route::engaged), which names its refusal `roc_cut` (passed to
    /// `refused` as such, not read again): at a cut's start the twin is engaged just
    /// before `engaged` is stored, and a refusal decided in between, named `limit`,
    /// was counted as the cut's own. The twin takes its token all the same, as the
    /// base limit alone would have.
    fn decide_twinned(
        &self,
        r: &Route,
        bucket: &TokenBucket,
        twin: &TokenBucket,
        now: Nanos,
    ) -> Decision {
        r.counter.add();
        let engaged = r.engaged.load(Ordering::Relaxed);
        match bucket.take(now) {
            Ok(()) => {
                if twin.take(now).is_err() && engaged {
                    r.counter.counters().add(CUT_ADMITTED);
                }
                Decision::Admit(Admit::Now)
            }
            Err(retry_after_ns) => {
                let own = twin.take(now).is_ok() && engaged;
                let reason = if engaged {
                    Reason::RocCut
                } else {
                    Reason::Limit
                };
                let decision = self.refused(r, Duration::from_nanos(retry_after_ns.max(1)), reason);
                // After the refusal's `roc_cut`, which a snapshot reads after this (see
                // `Route::snapshot`): a snapshot taken in between never finds more of the
                // cut's own than of `roc_cut`. Both adds are relaxed stores, which
                // another thread may see in the other order (on a weakly ordered CPU):
                // the fence, with the snapshot's, has one that sees this add see the
                // `roc_cut` one too (on x86 it only keeps the compiler's order).
                if own {
                    crate::sync::fence(Ordering::Release);
                    r.counter.counters().add(CUT_REJECTED);
                }
                decision
            }
        }
    }

    /// Decides one request on `r`, its window and limiters up to date.
    #[inline(always)]
    fn decide_now(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        r.counter.add();
        // The common case, a route-wide token bucket, is decided from a two-register
        // result: the `Decision` is built once, in the caller's slot, never moved.
        match (r.keys(), &r.limiter) {
            (None, Limiter::TokenBucket(bucket)) => match bucket.take(now) {
                Ok(()) if r.mode != Mode::ShadowAdaptive => Decision::Admit(Admit::Now),
                Ok(()) => self.admit_shadowed(r, key, now),
                Err(retry_after_ns) => self.refused(
                    r,
                    Duration::from_nanos(retry_after_ns.max(1)),
                    Reason::Limit,
                ),
            },
            (Some(keys), _) => {
                let decision = keys.check(r, key, now);
                if !decision.is_admit() {
                    keys.note_refused(key);
                } else if let Some(aggregate) = r.aggregate() {
                    // After the key's own limiter admitted: a key refused by its own
                    // limit spends none of the route's total.
                    if let Err(retry_after_ns) = aggregate.take(now) {
                        return self.refused_by_total(r, keys, key, now, retry_after_ns);
                    }
                }
                self.settle(r, key, now, decision)
            }
            // Inline: out of line, a fixed window's admission cost 25 instructions more.
            (None, limiter) => self.settle(r, key, now, limiter.check(now)),
        }
    }

    /// A request its key admitted that the route's total over its keys refused, a
    /// token there in `retry_after_ns`: counted as the total's, then as any refusal
    /// ([`Engine::refused`]), told to wait for the later of the total's token and its
    /// key's next (the key spent one on it: sent again when the total has one, it
    /// would be refused by its key's own limit if that had none by then). Out of
    /// line, so that a keyed decision the total admits, or on a route without one,
    /// keeps few of this path's registers: the key, kept for it in a register of its
    /// own, costs such a decision 3 instructions (benches/README.md).
    #[cold]
    #[inline(never)]
    fn refused_by_total(
        &self,
        r: &Route,
        keys: &Keys,
        key: TableKey,
        now: Nanos,
        retry_after_ns: u64,
    ) -> Decision {
        if let Some(total) = r.aggregate() {
            total.count_refusal();
        }
        let wait = retry_after_ns.max(keys.wait(key, now)).max(1);
        self.refused(r, Duration::from_nanos(wait), Reason::Limit)
    }

    /// An admission by a route-wide token bucket on a `shadow_adaptive` route.
    #[inline(never)]
    fn admit_shadowed(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        self.after_admit(r, key, now);
        Decision::Admit(Admit::Now)
    }

    /// What becomes of the limiter's `decision` on `r`: a rejection counted (and
    /// enforced unless in shadow), an admission tried against the shadow limiter.
    #[inline(always)]
    fn settle(&self, r: &Route, key: TableKey, now: Nanos, decision: Decision) -> Decision {
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
        match r.keys() {
            None => r.limiter.give_back(pace, now),
            Some(keys) => keys.give_back(key, pace, now),
        }
    }

    /// A limiter refused the request: names an ROC cut as the reason when one is in
    /// force, counts the rejection, and enforces it unless the route is in shadow.
    /// (The rejection comes in registers, as its two parts: a `Rejection` passed by
    /// reference is read back whole from two narrower stores, which stalls the CPU.)
    /// Inlined: a call cost a rejection by a route's token bucket its registers'
    /// saves and restores, and the reason (`limit`) is known there.
    #[inline(always)]
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
    /// and ROC included. Its controller and limiter are left alone, by this and by
    /// whatever brings the route up to date until a decision here rolls its window
    /// (a reload, a runtime change, [`Engine::catch_up`]). Nothing is counted if this
    /// engine does not hold `route` (see [`RouteId`]).
    pub fn record(&self, route: RouteId, rejected: Option<Reason>, now: Nanos) {
        let Some(r) = self.route(route) else {
            return;
        };
        if !r.elsewhere.load(Ordering::Relaxed) {
            r.elsewhere.store(true, Ordering::Relaxed);
        }
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
        // Whether the cut would have admitted the request, and whether its key's limit
        // would have (a key refused by the cut's total alone is not among the keys
        // refused, as in `enforce`).
        let (would_admit, key_would) = match shadow {
            Shadow::Route(limiter) => (limiter.check(now).is_admit(), true),
            Shadow::Keys(_) if !r.engaged.load(Ordering::Relaxed) => {
                // The cut's total takes every admitted request's token, as the
                // enforced total does, until a cut scales it.
                if let Some(total) = r.aggregate() {
                    total.take_shadow(now);
                }
                return;
            }
            // The cut's total is tried once the key's cut limit admits, as in `enforce`.
            Shadow::Keys(keys) => {
                let key_would = keys.check(r, key, now).is_admit();
                let total = || r.aggregate().is_none_or(|t| t.take_shadow(now));
                (key_would && total(), key_would)
            }
            // Not shadow_adaptive's: a twin is tried in `decide_twinned` only.
            Shadow::Twin(_) => return,
        };
        if !would_admit && r.engaged.load(Ordering::Relaxed) {
            r.counter.counters().add(CUT_REJECTED);
            // A key the cut would have refused counts among the keys refused, as
            // enforcing would have refused it.
            if let (Shadow::Keys(_), Some(keys), false) = (shadow, r.keys(), key_would) {
                keys.note_refused(key);
            }
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
        if r.elsewhere.load(Ordering::Relaxed) {
            r.elsewhere.store(false, Ordering::Relaxed);
        }
        if let Some(mut st) = r.try_lock() {
            self.roll_locked(r, &mut st, now);
            drop(st);
            self.sweep_rolled(r, now);
        }
    }

    /// Sweeps the keys of `r`, whose window this thread rolled to `now` and whose
    /// state it let go ([`Route::sweep`]), unless this engine sweeps apart
    /// ([`Engine::set_sweeps_apart`]).
    fn sweep_rolled(&self, r: &Route, now: Nanos) {
        if !self.sweeps_apart() {
            r.sweep(now);
        }
    }

    /// [`roll`](Self::roll), the route's state held; the caller sweeps the route's
    /// keys then ([`Engine::sweep_rolled`]), the state let go.
    fn roll_locked(&self, r: &Route, st: &mut RouteState, now: Nanos) {
        // What the limiters and the tier keys follow: the limit, the base limit, and
        // the cut, which with them says where the limit stands between the two (an
        // event may move the cut and the step and leave the limit where it was), and
        // the fraction of base the cut was made at, which a partitioned route's total
        // follows (a cut made again at the limit a restore had not raised yet).
        let standing = |c: &Controller| {
            (
                c.limit_rps(),
                c.params().base_limit_rps,
                c.params().cut_limit_rps,
                c.cut_fraction(),
            )
        };
        let before = standing(&st.controller);
        let hook = self.hook.as_deref();
        let sample_hook = self.sample_hook.as_deref();
        let level =
            (sample_hook.is_some() && r.partitioned.is_none()).then(|| r.limiter.level(now));
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
            counted_from,
            ..
        } = st;
        // `entered`: when the state left was entered.
        let mut record = |t: Transition, entered: Nanos| {
            counts.record(&t, entered.max(*counted_from));
            if let Some(h) = hook {
                h(&r.name, &t);
            }
        };
        let slot_ns = r.counter.slot_ns();
        let mut last_at = None;
        ring.advance(&r.counter, r.counter.slot_index(now), |s| {
            // The profile due at `at`, then `s`'s reading observed at `at`.
            let mut step = |controller: &mut Controller, at: Nanos| {
                let entered = controller.entered_at();
                follow_events(events, active_event, own, controller, at, |t| {
                    record(t, entered);
                });
                let entered = controller.entered_at();
                controller.observe(SampleAt { at, ..s }, |t| record(t, entered));
            };
            // A silence longer than the window ends in one sample for every slot past
            // the window's replay: they all read alike. If the controller was armed
            // again among them, an event started or ended, or a cut ran out by the
            // clock, it observes that reading from that slot too, as stepping each slot
            // would have (a cut's calm counts from the arming, an event's profile is in
            // force from its start, a cut that ran out restores from then, not from a
            // change of profile after it). The next such slot is looked for after each
            // step, which may move the arming and the cut's end.
            if let Some(mut last) = last_at.filter(|&last| s.at > last + r.window.slot()) {
                let edges = || events.iter().flat_map(|e| [e.start, e.end]);
                while let Some(at) = controller.next_stop(edges(), last, s.at, slot_ns) {
                    step(controller, at);
                    last = at;
                }
            }
            last_at = Some(s.at);
            step(controller, s.at);
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
        // An event's edge that changed the total's profile (its `route_limit`) is a
        // limit change too.
        let total_changed = r.aggregate().is_some_and(|a| a.choose(st.event_total()));
        if standing(&st.controller) != before {
            // Dated where the controller changed the limit: after a silence, the
            // limiters refill at the new limit from then, not only from now.
            let at = st.controller.limit_since().min(now);
            r.apply_limit(&st.controller, at);
        } else if total_changed {
            // Dated now: a total raised at an edge past does not refill from there.
            r.apply_limit(&st.controller, now);
        } else {
            let behind = r.behind.load(Ordering::Relaxed) & BEHIND_CHANGES;
            if behind != 0 {
                let at = Nanos::new(r.changed_at.load(Ordering::Relaxed));
                r.set_limiters(&st.controller, at, behind);
            }
        }
        r.publish_next_raise(st, now);
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

    /// Whether a route of this engine is partitioned by the header `name` (in lower
    /// case, as `http` names headers): a request's key, which a proxy must pass on.
    /// A look at the few names kept when the engine was built, not at every route.
    pub fn keys_by_header(&self, name: &str) -> bool {
        self.key_headers.iter().any(|h| h == name)
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
        Some(self.route(route)?.key_stand(TableKey::of(key)).0)
    }

    /// The limit a refusal of a request with `key` on `route` at `now` (`rejection`,
    /// as [`Engine::check`] gave it) was made at, for the quota it states: the route's
    /// `route_limit` in force if the refusal was its (told a longer wait than the
    /// key's own state is from admitting), else the key's
    /// ([`key_limit_rps`](Self::key_limit_rps)). A refusal by the total whose key's
    /// own wait is as long states the key's: that is the limit the client waits for.
    /// Ask it at once: a request of the same key since may have moved the key's wait.
    pub fn refused_limit_rps(
        &self,
        route: RouteId,
        key: Key<'_>,
        rejection: &Rejection,
        now: Nanos,
    ) -> Option<f64> {
        self.key_refusal_of(route, TableKey::of(key), rejection, now)
            .0
    }

    /// For a request with `key` refused on `route` at `now` (`rejection`): the limit
    /// it was refused at ([`refused_limit_rps`](Self::refused_limit_rps)) and how long
    /// until the key's own limit next rises
    /// ([`key_restore_eta`](Self::key_restore_eta)), its tier looked up once.
    pub(crate) fn key_refusal_of(
        &self,
        route: RouteId,
        key: TableKey,
        rejection: &Rejection,
        now: Nanos,
    ) -> (Option<f64>, Option<Duration>) {
        let Some(r) = self.route(route) else {
            return (None, None);
        };
        let (limit, next) = r.key_stand(key);
        let limit = match (r.aggregate(), r.keys()) {
            (Some(total), Some(keys))
                if rejection.retry_after > Duration::from_nanos(keys.wait(key, now)) =>
            {
                total.in_force_rps()
            }
            _ => limit,
        };
        (Some(limit), next.and_then(|next| eta(next, now)))
    }

    /// How long until the controller next raises a cut route's limit above where it
    /// stands if the demand of its last slot holds (see
    /// [`Controller::next_raise_held`]), through the route's scheduled events: an event that starts or ends in a slot before then
    /// is put in force at that slot's end, as the engine steps it, and may raise the
    /// limit itself or move the raise ([`Schedule::next_raise`]). The basis of
    /// `Retry-After` for `roc_cut` rejections, as of the route's last step (each
    /// completed slot). `None` when the route is not cut, when its limit never rises
    /// above where it stands (an event lowered it, and its base stays below that), or
    /// this engine does not hold `route` (see [`RouteId`]). One atomic load.
    pub fn restore_eta(&self, route: RouteId, now: Nanos) -> Option<Duration> {
        eta(&self.route(route)?.next_raise, now)
    }

    /// [`restore_eta`](Self::restore_eta) for requests with `key`: for a key of a
    /// tier with limits of its own, how long until the controller next raises the
    /// tier's limit, between the tier's cut and base limits as the controller's
    /// progress between the route's stands (see
    /// [`key_limit_rps`](Self::key_limit_rps)): a raise of the route's limit that
    /// leaves that progress where it is (a scheduled event's higher cut limit) is
    /// none for it, and a tier whose cut limit is its base is never raised (`None`:
    /// its limiter's wait is the one to tell). The route's own otherwise. One atomic
    /// load, and the key's tier looked up.
    pub fn key_restore_eta(&self, route: RouteId, key: Key<'_>, now: Nanos) -> Option<Duration> {
        let (_, next) = self.route(route)?.key_stand(TableKey::of(key));
        eta(next?, now)
    }

    /// The twin's level at `now` ([`Shadow::Twin`]), whether the route is marked
    /// [`TWIN_ENGAGED`], and whether a change is left [`behind`](Route::behind), of a
    /// route with a twin; `None` for others. Only in the model-checking build, whose
    /// models check a cut's edges with them (`tests/loom.rs`).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn twin_at(&self, route: RouteId, now: Nanos) -> Option<(Level, bool, bool)> {
        let r = self.route(route)?;
        let Some(Shadow::Twin(twin)) = &r.shadow else {
            return None;
        };
        let behind = r.behind.load(Ordering::Relaxed);
        Some((
            twin.level(now),
            behind & TWIN_ENGAGED != 0,
            behind & BEHIND_CHANGES != 0,
        ))
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

    /// The keys a partitioned route refused since they were last taken, emptied: what
    /// the hints history takes once per interval ([`RouteSnapshot::refused_keys`]
    /// reads them without emptying). `None` for a route limited as a whole, or one
    /// this engine does not hold.
    pub fn take_refused_keys(&self, route: RouteId) -> Option<KeySketch> {
        Some(self.route(route)?.keys()?.take_refused())
    }
}

/// A runtime change that [`Engine::reload_keeping`] could not keep, and why.
///
/// Only a reload makes one, and it may come to say more (the change refused), so a
/// pattern outside rocgate ends with `..`; one that names only these two fields does
/// not compile:
///
/// ```compile_fail,E0638
/// use rocgate::engine::RefusedChange;
///
/// fn say(refused: &RefusedChange) -> String {
///     let RefusedChange { route, error } = refused;
///     format!("{route}: {error}")
/// }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct RefusedChange {
    /// The route's name.
    pub route: String,
    /// What the file's rules refuse in the change, on the reloaded route.
    pub error: ConfigError,
}

/// `cfg` with `params` as its own parameters, if the rules of the file take them
/// there with its events' profiles moved onto them; its events are left as `cfg`'s,
/// written over `cfg.controller`.
fn changed(
    cfg: &RouteConfig,
    params: &ControllerParams,
    wall_now: SystemTime,
) -> Result<RouteConfig, ConfigError> {
    let mut checked = cfg.clone();
    checked.controller = params.clone();
    for e in &mut checked.events {
        e.controller = e.profile_on(&cfg.controller, params);
    }
    let retired = refused_by_file(&checked, |i| {
        checked
            .events
            .get(i)
            .is_some_and(|e| events::has_ended(e, wall_now))
    })?;
    checked.events.clone_from(&cfg.events);
    // Ended, and not fitting the change: never placed again (see
    // `ScheduledEvent::retire`).
    for i in retired {
        if let Some(e) = checked.events.get_mut(i) {
            e.duration = Duration::ZERO;
        }
    }
    Ok(checked)
}

/// What the rules of the file refuse in `route`, under its name, but for problems in
/// its events that have `ended` (by index: an event over is not in force again, so a
/// change it would not fit beside is no change it refuses); a problem in one of its
/// events names the event too (`events[0].cut_limit: … (event "flash")`): a change
/// refused for an event's sake is made by someone who knows the event by its name.
/// Returns the ended events whose problems were passed over, which the change must
/// retire.
fn refused_by_file(
    route: &RouteConfig,
    ended: impl Fn(usize) -> bool,
) -> Result<Vec<usize>, ConfigError> {
    let Err(problems) = crate::config::check_route(route) else {
        return Ok(Vec::new());
    };
    let mut passed_over = Vec::new();
    let named: Vec<Problem> = problems
        .into_iter()
        .filter_map(|p| {
            let index = p
                .location()
                .strip_prefix("events[")
                .and_then(|rest| rest.split_once(']'))
                .and_then(|(index, _)| index.parse::<usize>().ok());
            match index.map(|i| (i, route.events.get(i))) {
                Some((i, _)) if ended(i) => {
                    passed_over.push(i);
                    None
                }
                Some((_, Some(e))) => Some(Problem::new(
                    p.location(),
                    format!("{} (event {:?})", p.message(), e.name),
                )),
                _ => Some(p),
            }
        })
        .collect();
    if named.is_empty() {
        passed_over.dedup();
        return Ok(passed_over);
    }
    Err(ConfigError::new(&format!("route `{}`", route.name), named))
}

/// What a reload takes from a route it rebuilds, for the route built in its place
/// ([`Route::hand_over`]): the concurrency permits held and queued for, route wide, or
/// in the keys of a partitioned route with the new route's queue; or the keys of a
/// partitioned route limited by a rate algorithm.
enum HandedOver<'a> {
    /// The route-wide permits, their queue already the new route's.
    Route(Concurrency),
    /// The keys whose permits, or rate state, the new route's keys take over (once the
    /// new engine is built: [`Engine::reload_keeping`]), its concurrency queue (0 for
    /// a rate algorithm), and the old route's generation then, which the new route's
    /// counts on from.
    Keys(&'a Keys, u32, u64),
}

/// A route-wide limiter whose state a reload carries into the route that rebuilds its
/// route ([`Route::take_state`]): a limiter, or a bucket beside one (a twin, or a
/// `route_limit`'s total).
#[derive(Clone, Copy)]
enum Held<'a> {
    Limiter(&'a Limiter),
    Bucket(&'a TokenBucket),
}

impl Held<'_> {
    /// Takes `from`'s state at `now`, if it is of the same algorithm (see
    /// [`Limiter::copy_from`]).
    fn take(self, from: Held<'_>, now: Nanos) {
        match (self, from) {
            (Held::Limiter(to), Held::Limiter(from)) => {
                to.copy_from(from, now);
            }
            (
                Held::Limiter(Limiter::TokenBucket(to)) | Held::Bucket(to),
                Held::Limiter(Limiter::TokenBucket(from)) | Held::Bucket(from),
            ) => to.copy_from(from, now),
            _ => {}
        }
    }
}

/// How long from `now` until the time `next` holds (ns; 0: none).
fn eta(next: &AtomicU64, now: Nanos) -> Option<Duration> {
    match next.load(Ordering::Relaxed) {
        0 => None,
        at => Some(Nanos::new(at).saturating_since(now)),
    }
}

impl Route {
    /// Sweeps a partitioned route's key tables, each on its own clock
    /// ([`Route::swept`]), after a rollover, the route's state let go, or apart from
    /// requests ([`Engine::sweep_due`]): a sweep of a
    /// large table (about 20 ms for 1,000,000 keys) held it, and the next slot's
    /// rollover, which found it taken, was skipped, its arrivals counted in the slot
    /// after. One sweep at a time, as under the state: one due while another runs is
    /// left to it, and no one waits for it.
    fn sweep(&self, now: Nanos) {
        let Some(keys) = self.keys() else {
            return;
        };
        if self
            .sweeping
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let _sweeping = Sweeping(&self.sweeping);
        keys.sweep(self, &self.swept[0], now, true);
        if let Some(Shadow::Keys(shadow)) = &self.shadow {
            shadow.sweep(self, &self.swept[1], now, false);
        }
    }

    /// A partitioned route's key tables; `None` on a route limited as a whole.
    fn keys(&self) -> Option<&Keys> {
        self.partitioned.as_deref().map(|p| &p.keys)
    }

    /// A partitioned route's limit over its keys together, if it has one.
    fn aggregate(&self) -> Option<&Aggregate> {
        self.partitioned.as_deref()?.aggregate.as_deref()
    }

    /// The limit requests with `key` are held to now, and where the time of its next
    /// raise is published (`None`: it is never raised): a key of a tier with limits of
    /// its own, its tier's, between the tier's cut and base limits as the controller's
    /// progress between the route's stands, and the time of that progress's next
    /// raise (none for a tier whose cut limit is its base); the route's limit and
    /// its next raise for any other.
    fn key_stand(&self, key: TableKey) -> (f64, Option<&AtomicU64>) {
        match (self.tier_of(key), self.partitioned.as_deref()) {
            (Some((base, cut)), Some(p)) => (
                cut + (base - cut) * p.keys.tiers().progress(self),
                (base > cut).then_some(&p.next_tier_raise),
            ),
            _ => (self.limit_rps(), Some(&self.next_raise)),
        }
    }

    /// The base and cut limits of the tier `key` belongs to, for a key of a tier
    /// that has its own state; `None` for others (a route without tiers, a key in
    /// none, or one a full key table sends to its shared overflow limiter).
    fn tier_of(&self, key: TableKey) -> Option<(f64, f64)> {
        let keys = self.keys().filter(|_| !self.tiers.is_empty())?;
        if keys.overflowed(key) {
            return None;
        }
        let tiers = keys.tiers();
        let tier = match (key, &self.partition) {
            (TableKey::Ip(ip), Partition::ClientIp(limits)) => {
                tiers.tier_of(&IpKey::new(ip, limits.ipv6_prefix))
            }
            (TableKey::Value(value), _) => tiers.tier_of(&value),
            _ => 0,
        };
        tiers.tier_limits(tier)
    }

    /// The route `cfg` describes, fresh at `now`; or, with the concurrency permits a
    /// reload took from the route this one rebuilds ([`Route::hand_over`]), around
    /// those, set to its limit. Its events' profiles were written over `written_over`
    /// (the file's parameters of a route whose `cfg.controller` is a runtime change
    /// kept through a reload). With `carried`, the controller of the route this one
    /// rebuilds, as it stands at `now`, goes on under `cfg`'s parameters (a cut stays
    /// a cut, a restore keeps its place: [`Controller::from_memory`]), taking no
    /// action for one window, its new window empty; the limiters start full at its
    /// limit, until the reload gives them the old route's state
    /// ([`Route::take_state`]). The transition that `cfg`'s parameters, or an event's running at `now`,
    /// make (a restore that reaches their base limit ends) is counted and passed to
    /// the hook carried with it. Else the controller starts in `Normal`.
    fn new(
        cfg: &RouteConfig,
        written_over: &ControllerParams,
        now: Nanos,
        wall_now: SystemTime,
        handed: Option<HandedOver<'_>>,
        carried: Option<(ControllerMemory, Option<&TransitionHook>)>,
    ) -> Self {
        let p = &cfg.controller;
        let name: Arc<str> = cfg.name.as_str().into();
        let mut counts = TransitionCounts::default();
        let (controller, hook) = match carried {
            None => (Controller::new(p.clone(), now, cfg.window.window()), None),
            Some((memory, hook)) => {
                let report = |t: Transition| {
                    counts.record(&t, now);
                    if let Some(h) = hook {
                        h(&name, &t);
                    }
                };
                let mut c = Controller::from_memory_reporting(p.clone(), memory, now, report);
                c.rearm(now, cfg.window.window());
                (c, hook)
            }
        };
        let enforced_limit = p.base_limit_rps;
        // shadow_adaptive enforces each key's base limit; its shadow keys follow the cut.
        let hold_base = cfg.mode == Mode::ShadowAdaptive;
        let keys = Keys::new(cfg, now, hold_base);
        // A key handed over keeps its generation beside its permits: a request on the
        // old route that wrote the old route's there as the hand-over was made must
        // never match one of this route's. (The keys themselves come in once the
        // engine is built: see `Engine::reload_keeping`.)
        let mut generation = 0;
        let permits = match handed {
            Some(HandedOver::Route(permits)) => Some(permits),
            Some(HandedOver::Keys(_, _, old_generation)) => {
                generation = old_generation.wrapping_add(1);
                None
            }
            None => None,
        };
        let shadow = match (cfg.mode, cfg.algorithm, &cfg.partition) {
            (Mode::ShadowAdaptive, _, _) => Some(Keys::new(cfg, now, false).map_or_else(
                || Shadow::Route(Limiter::new(cfg.algorithm, p.base_limit_rps, now)),
                |keys| Shadow::Keys(Box::new(keys)),
            )),
            (_, Algorithm::TokenBucket { burst }, Partition::Route) => {
                Some(Shadow::Twin(TokenBucket::new(p.base_limit_rps, burst, now)))
            }
            _ => None,
        };
        let events: Vec<ScheduledEvent> = cfg
            .events
            .iter()
            .map(|e| ScheduledEvent::place(e, written_over, p, now, wall_now))
            .collect();
        let route = Route {
            name,
            serial: NonZeroU64::MIN.saturating_add(ROUTE_SERIALS.fetch_add(1, Ordering::Relaxed)),
            mode: cfg.mode,
            window: cfg.window,
            algorithm: cfg.algorithm,
            tiers: cfg.tiers.clone().into_boxed_slice(),
            reject_status: AtomicU16::new(cfg.reject_status),
            counter: SlotCounter::new(&cfg.window),
            limiter: permits.map_or_else(
                || Limiter::new(cfg.algorithm, enforced_limit, now),
                Limiter::Concurrency,
            ),
            shadow,
            handed_over: AtomicBool::new(false),
            elsewhere: AtomicBool::new(false),
            behind: AtomicU8::new(0),
            partitioned: keys.map(|keys| {
                Box::new(Partitioned {
                    keys,
                    engaged_since_s: AtomicU32::new(0),
                    aggregate: cfg.route_limit_rps.map(|own| {
                        // The running event's, if it sets one: a route built during an
                        // event starts at its total, full, as it starts at its profile.
                        let total = events
                            .iter()
                            .find(|e| e.runs_at(now))
                            .and_then(|e| e.configured.0.route_limit_rps)
                            .unwrap_or(own);
                        Box::new(Aggregate::new(own, total, cfg.mode, cfg.algorithm, now))
                    }),
                    next_tier_raise: AtomicU64::new(0),
                })
            }),
            generation: AtomicU64::new(generation),
            changed_at: AtomicU64::new(now.as_u64()),
            progress: AtomicU64::new(1.0f64.to_bits()),
            engaged: AtomicBool::new(false),
            limit: AtomicU64::new(p.base_limit_rps.to_bits()),
            next_raise: AtomicU64::new(0),
            partition: cfg.partition.clone(),
            state: Mutex::new(RouteState {
                ring: SlotRing::new(&cfg.window),
                controller,
                own: p.clone(),
                schedule: None,
                events,
                active_event: None,
                counts,
                counted_from: now,
            }),
            sweeping: AtomicBool::new(false),
            swept: [AtomicU64::new(now.as_u64()), AtomicU64::new(now.as_u64())],
        };
        route.start(now, hook);
        route
    }

    /// The limit enforced now, req/s.
    fn limit_rps(&self) -> f64 {
        f64::from_bits(self.limit.load(Ordering::Relaxed))
    }

    fn lock(&self) -> MutexGuard<'_, RouteState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The state lock if no one holds it, without waiting; taken poisoned or not, as
    /// [`Route::lock`] takes it. Refused for poison, no request would roll the window,
    /// step the controller or make a change left behind again, after a panic (a
    /// hook's) while the lock was held.
    fn try_lock(&self) -> Option<MutexGuard<'_, RouteState>> {
        match self.state.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// The route's concurrency permits, for `cfg`, the route a reload rebuilds it as
    /// (see [`Engine::reload`]), if both are limited by `concurrency`: as a whole, or
    /// per key with the same keys and tiers (each key's permits go to the same key, in
    /// the same tier; a new `max_keys` or `idle_timeout` bounds the table, not what a
    /// key names: [`same_keys`]). From then on this route leaves their limit to that one.
    /// Taken under the state lock, so no route-wide limit this route is setting lands
    /// after the new route's. A key of this route reads
    /// [`handed_over`](Route::handed_over) without the lock before it catches up with
    /// a limit change, and leaves the key alone once it is set. One that read it just
    /// before may set this route's limit after the new route set its own, with this
    /// route's generation, which the new route's, counting on from it, never is: the
    /// new route's next request on the key sets it again.
    ///
    /// A partitioned route limited by a rate algorithm hands its keys over too, to a
    /// route with the same keys, tiers and algorithm (the same burst, window or
    /// queue): they are copied into the new route's table once the new engine is built
    /// ([`Keys::take_over`]), not shared. This route keeps its own, and their limit,
    /// for the requests it decides until the new engine is put in force.
    fn hand_over<'a>(&'a self, cfg: &RouteConfig) -> Option<HandedOver<'a>> {
        let Algorithm::Concurrency { queue } = cfg.algorithm else {
            let keys = self.keys().filter(|_| {
                self.algorithm == cfg.algorithm
                    && same_keys(&cfg.partition, &self.partition)
                    && cfg.tiers[..] == self.tiers[..]
            })?;
            return Some(HandedOver::Keys(
                keys,
                0,
                self.generation.load(Ordering::SeqCst),
            ));
        };
        let _st = self.lock();
        let handed = match (self.keys(), &self.limiter) {
            (None, Limiter::Concurrency(permits)) if cfg.partition == Partition::Route => {
                HandedOver::Route(permits.handed_over(queue))
            }
            (Some(keys @ Keys::Concurrency(_)), _)
                if same_keys(&cfg.partition, &self.partition)
                    && cfg.tiers[..] == self.tiers[..] =>
            {
                HandedOver::Keys(keys, queue, self.generation.load(Ordering::SeqCst))
            }
            _ => return None,
        };
        self.handed_over.store(true, Ordering::Relaxed);
        Some(handed)
    }

    /// The route-wide limiters, and a partitioned route's total, by the limit each
    /// holds: `[[at the controller's limit, at the base limit]; 2]`, the route-wide
    /// limiters first. The base's is the limit's own outside a cut; during one, the
    /// twin of a token bucket once engaged ([`Shadow::Twin`]), or none. In
    /// `shadow_adaptive` the enforced limiter holds the base, and the shadow the cut.
    fn held(&self) -> [[Option<Held<'_>>; 2]; 2] {
        let engaged = self.engaged.load(Ordering::Relaxed);
        let limiter = Held::Limiter(&self.limiter);
        let route = match (&self.partitioned, &self.shadow) {
            (Some(_), _) => [None, None],
            (None, Some(Shadow::Route(cut))) => [Some(Held::Limiter(cut)), Some(limiter)],
            (None, _) if !engaged => [Some(limiter), Some(limiter)],
            (None, Some(Shadow::Twin(twin)))
                if self.behind.load(Ordering::Relaxed) & TWIN_ENGAGED != 0 =>
            {
                [Some(limiter), Some(Held::Bucket(twin))]
            }
            (None, _) => [Some(limiter), None],
        };
        let total = self.aggregate().map_or([None, None], |a| a.held(engaged));
        [route, total]
    }

    /// Takes the state of `old`'s route-wide limiters (and total) at `now`, where this
    /// route, built by a reload in `old`'s place (under its controller, carried), has
    /// one holding the same limit, of the same algorithm: the tokens, window counts or
    /// leaky schedule that `old` had, at this route's limits, not a full limiter.
    /// Each by the limit it holds, whatever the modes: a route that leaves `enforce`
    /// for `shadow_adaptive` during a cut enforces its base with the twin's tokens, and
    /// counts the cut with the cut bucket's. Where `old` holds nothing at the base (a
    /// cut in `enforce` or `shadow` with no twin: a limiter of another rate algorithm
    /// than the token bucket, or a `route_limit` total), the base takes the cut's
    /// state: what the cut admitted counts against the base, not a full limiter on top
    /// of it. `concurrency`'s permits are handed over instead ([`Route::hand_over`]); a
    /// partitioned route's keys are taken apart ([`Keys::take_over`]).
    fn take_state(&self, old: &Route, now: Nanos) {
        for (to, from) in self.held().into_iter().zip(old.held()) {
            // The base's first: where one limiter holds both, the limit's is kept.
            for role in [1, 0] {
                if let (Some(to), Some(from)) = (to[role], from[role].or(from[0])) {
                    to.take(from, now);
                }
            }
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
            && self.tiers[..] == cfg.tiers[..]
            && self.aggregate().is_some() == cfg.route_limit_rps.is_some()
    }

    /// New own parameters (and, on reload, new events, with the parameters their
    /// profiles were written over) applied to the live state; a transition this makes
    /// is counted and passed to `hook`.
    ///
    /// Made as of `now`, or as of the end of the last slot the controller has stepped
    /// through if that is later: a request that read the clock after the caller may
    /// have taken the state first and stepped a slot that ends after `now` (a restore
    /// step, an event's start), which a change dated before it would undo.
    fn reconfigure(
        &self,
        params: &ControllerParams,
        events: Option<(&[Event], &ControllerParams)>,
        now: Nanos,
        wall_now: SystemTime,
        hook: Option<&TransitionHook>,
    ) {
        let mut st = self.lock();
        let st = &mut *st;
        // The events are placed by the clocks' readings taken together, the rest is
        // dated where the controller stands.
        let (placed_at, now) = (now, now.max(self.stepped()));
        // What is in force now: the profile due, which no request may have put in the
        // controller yet (an event that has just started or ended).
        let before = st.params_due(now).clone();
        if let Some((events, written_over)) = events {
            st.events = events
                .iter()
                .map(|e| ScheduledEvent::place(e, written_over, params, placed_at, wall_now))
                .collect();
        } else {
            // A runtime change: the events' profiles follow it where they leave the
            // route's own parameters as they were.
            for e in &mut st.events {
                e.params = e.rebased(params);
            }
        }
        st.own = params.clone();
        st.reschedule();
        // Whatever was in force, the profile due now replaces it (in one step: the
        // route's own profile set on the way would move a recovering controller).
        let due = st.events.iter().position(|e| e.runs_at(now));
        st.active_event = due;
        if let Some(a) = self.aggregate() {
            a.choose(st.event_total());
        }
        let params = due.map_or_else(|| st.own.clone(), |i| st.events[i].params.clone());
        let changed = params != before;
        let (counts, entered) = (
            &mut st.counts,
            st.controller.entered_at().max(st.counted_from),
        );
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
        self.publish_next_raise(st, now);
    }

    /// Publishes when the controller next raises the limit, as seen at `now`, through
    /// the scheduled events due before then, for [`Engine::restore_eta`].
    fn publish_next_raise(&self, st: &RouteState, now: Nanos) {
        let stepped = self.stepped();
        let tiers = !self.tiers.is_empty();
        let (limit, progress) = st.next_raise(now, stepped, &self.window, tiers);
        self.next_raise
            .store(limit.map_or(0, Nanos::as_u64), Ordering::Relaxed);
        if let Some(p) = self.partitioned.as_deref().filter(|_| tiers) {
            p.next_tier_raise
                .store(progress.map_or(0, Nanos::as_u64), Ordering::Relaxed);
        }
    }

    /// Whether `cfg`'s limits count what this route's do: requests per second or in
    /// flight (`concurrency`), the route's or a key's (a partition).
    fn limit_counts_as(&self, cfg: &RouteConfig) -> bool {
        let in_flight = |a: &Algorithm| matches!(a, Algorithm::Concurrency { .. });
        let whole = |p: &Partition| matches!(p, Partition::Route);
        in_flight(&self.algorithm) == in_flight(&cfg.algorithm)
            && whole(&self.partition) == whole(&cfg.partition)
    }

    /// The end of the last slot the route's window has completed, and its controller
    /// stepped through: the start of the slot being accumulated.
    fn stepped(&self) -> Nanos {
        Nanos::new(
            self.counter
                .current()
                .saturating_mul(self.counter.slot_ns()),
        )
    }

    /// Starts the window at the slot containing `now` (so a clock that starts far from
    /// zero does not replay empty slots since its origin), and puts in force the event
    /// due now, if any (and its `route_limit`, if it sets one): the transition it
    /// makes in a controller carried into the route is counted and passed to `hook`.
    fn start(&self, now: Nanos, hook: Option<&TransitionHook>) {
        let mut st = self.lock();
        let st = &mut *st;
        let idx = self.counter.slot_index(now);
        st.ring.advance(&self.counter, idx, |_| {});
        let entered = st.controller.entered_at().max(st.counted_from);
        let RouteState {
            events,
            active_event,
            own,
            controller,
            counts,
            ..
        } = st;
        follow_events(events, active_event, own, controller, now, |t| {
            counts.record(&t, entered);
            if let Some(h) = hook {
                h(&self.name, &t);
            }
        });
        if let Some(a) = self.aggregate() {
            a.choose(st.event_total());
        }
        self.apply_limit(&st.controller, now);
        self.publish_next_raise(st, now);
    }

    /// Pushes the controller's limit to the limiters, as of `at`, when it took effect
    /// (never before the last change pushed). Never waits: a route-wide token bucket
    /// whose change finds its note taken is marked [`behind`](Route::behind), and
    /// the next decision on the route makes the change ([`Route::finish_change`]).
    fn apply_limit(&self, c: &Controller, at: Nanos) {
        let now = at.max(Nanos::new(self.changed_at.load(Ordering::Relaxed)));
        self.set_limiters(c, now, BEHIND_CHANGES);
        let limit = c.limit_rps();
        let base = c.params().base_limit_rps;
        let cut = c.params().cut_limit_rps;
        if let Some(keys) = self.keys() {
            keys.tiers().set_default(base, cut, now);
        }
        if let Some(Shadow::Keys(keys)) = &self.shadow {
            keys.tiers().set_default(base, cut, now);
        }
        self.progress
            .store(c.progress().to_bits(), Ordering::Relaxed);
        let enforced = if self.mode == Mode::ShadowAdaptive {
            base
        } else {
            limit
        };
        self.limit.store(enforced.to_bits(), Ordering::Relaxed);
        let engaged = c.state() != ControllerState::Normal && limit < base;
        if let Some(p) = self.partitioned.as_deref() {
            if engaged && !self.engaged.load(Ordering::Relaxed) {
                p.engaged_since_s.store(keys::secs(now), Ordering::Relaxed);
            }
        }
        self.engaged.store(engaged, Ordering::Relaxed);
        self.changed_at.store(now.as_u64(), Ordering::Relaxed);
        // `SeqCst`, then read the concurrency keys' queues (`wake_queued`): see
        // `ConcurrencyKey::check`. Not once the keys are handed over: their limit is
        // the new route's, whose generation counts on from this one's as it was then,
        // and a late request of this route writing this one's must not meet it.
        if !self.handed_over.load(Ordering::Relaxed) {
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        crate::sync::seq_cst_fence_under_loom();
        if let Some(keys) = self.keys() {
            keys.wake_queued(self);
        }
    }

    /// Sets the route-wide limiters among `which` ([`BEHIND_LIMITER`],
    /// [`BEHIND_SHADOW`], [`BEHIND_TWIN`], [`BEHIND_AGGREGATE`]) to the controller's
    /// limit as of `at` (a twin to the base limit, a partitioned route's total to its
    /// share of the configured one: [`Aggregate::follow`]), each without waiting,
    /// and records those whose change could not take its note as
    /// [`behind`](Route::behind). Called with the state lock held.
    ///
    /// On a route with a twin ([`Shadow::Twin`]), a cut that engages (the limit below
    /// base) first sets the twin at the base limit and gives it the route's bucket's
    /// tokens (the bucket is at base until then), then marks the route
    /// [`TWIN_ENGAGED`], then changes the bucket; should the twin's change find its
    /// note taken, the bucket is left at base too, both [`behind`](Route::behind),
    /// and the decision that makes the twin's change does all three (a twin given the
    /// tokens at an older base limit kept them clamped to its older capacity, short
    /// after a raise); while it holds, the twin follows the
    /// base limit (an event's, a runtime change's: tokens clamped, never refilled);
    /// once the limit is back at base the mark is cleared and the twin is idle until
    /// the next cut. A decision that read the mark just before it changed is decided
    /// without the twin, or with it, as the other side of the edge: a few requests at
    /// a cut's start or end may be left out of the count, or tried against an idle
    /// twin, which the next cut's start sets again. One decided with the twin before
    /// [`engaged`](Route::engaged) is stored names its refusal `limit` and is not
    /// counted ([`Engine::decide_twinned`]).
    fn set_limiters(&self, c: &Controller, at: Nanos, which: u8) {
        let which = if self.handed_over.load(Ordering::Relaxed) {
            which & !BEHIND_LIMITER
        } else {
            which
        };
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
            (_, Some(Shadow::Twin(twin)))
                if c.state() != ControllerState::Normal && limit < base =>
            {
                let engaged = self.behind.load(Ordering::Relaxed) & TWIN_ENGAGED != 0;
                // A twin at base already is left alone: a restore step changes the
                // route's bucket only, and a change would take a note for nothing.
                let twin_limiter = |which: u8| {
                    if which & BEHIND_TWIN == 0 || twin.is_at(base) || twin.try_set_limit(base, at)
                    {
                        0
                    } else {
                        BEHIND_TWIN
                    }
                };
                if engaged {
                    TWIN_ENGAGED | twin_limiter(which) | set(&self.limiter, limit, BEHIND_LIMITER)
                } else if twin_limiter(BEHIND_TWIN) == 0 {
                    if let Limiter::TokenBucket(bucket) = &self.limiter {
                        twin.copy_from(bucket, at);
                    }
                    self.behind.fetch_or(TWIN_ENGAGED, Ordering::Relaxed);
                    TWIN_ENGAGED | set(&self.limiter, limit, BEHIND_LIMITER)
                } else {
                    // The twin's change to base found its note taken: copied now, the
                    // bucket's tokens would be clamped to its older capacity. The
                    // bucket is left at base with it, to be copied from there.
                    BEHIND_TWIN | (which & BEHIND_LIMITER)
                }
            }
            _ => set(&self.limiter, limit, BEHIND_LIMITER),
        };
        let aggregate = match self.aggregate() {
            Some(a) if which & BEHIND_AGGREGATE != 0 && !a.follow(c, self.mode, at) => {
                BEHIND_AGGREGATE
            }
            _ => 0,
        };
        self.behind.store(behind | aggregate, Ordering::Relaxed);
    }

    /// Makes the limit change that a route-wide limiter is [`behind`](Route::behind)
    /// on, dated where it was pushed, if the state lock is free (it is taken, not
    /// waited for) and the note too (else the next decision tries again). Out of
    /// line: a change finds its note taken only while another change holds it.
    #[cold]
    #[inline(never)]
    fn finish_change(&self) {
        if let Some(st) = self.try_lock() {
            let which = self.behind.load(Ordering::Relaxed) & BEHIND_CHANGES;
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
        // Read before the reasons' counts, which a decision adds to first
        // (`Engine::decide_twinned`): never more of the cut's own than of `roc_cut`.
        let cut_vs_base_rejected = match (self.mode, &self.shadow) {
            (Mode::ShadowAdaptive, _) | (_, Some(Shadow::Twin(_))) => {
                Some(self.counter.counters().sum(CUT_REJECTED))
            }
            _ => None,
        };
        // With the decision's fence before its add: the reasons' counts read next hold
        // the `roc_cut` of every cut's own refusal counted above.
        crate::sync::fence(Ordering::Acquire);
        let counted = Reason::ALL.map(|r| (r, self.counter.counters().sum(rejected_counter(r))));
        let none = Reason::ALL.map(|r| (r, 0));
        let (rejected, shadow_rejected) = match self.mode {
            Mode::Enforce => (counted, none),
            Mode::Shadow => (none, counted),
            Mode::ShadowAdaptive => {
                let cut = cut_vs_base_rejected.unwrap_or(0);
                (
                    counted,
                    none.map(|(r, _)| (r, if r == Reason::RocCut { cut } else { 0 })),
                )
            }
        };
        let rejected_total: u64 = rejected.iter().map(|(_, n)| n).sum();
        // A route a shared store decides has its time in cut counted there: a cut
        // here (carried into the route by a reload) is not stepped while it does.
        let elsewhere = self.elsewhere.load(Ordering::Relaxed);
        let cut_running = if c.state() == ControllerState::Cut && !elsewhere {
            now.saturating_since(c.entered_at().max(st.counted_from))
        } else {
            Duration::ZERO
        };
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
            level: match self.partitioned {
                None => self.limiter.level(now),
                Some(_) => Level {
                    value: f64::NAN,
                    ..self.limiter.level(now)
                },
            },
            offered,
            admitted: offered.saturating_sub(rejected_total),
            rejected: rejected.to_vec(),
            shadow_rejected: shadow_rejected.to_vec(),
            cuts: st.counts.cuts,
            time_in_cut: st.counts.time_in_cut + cut_running,
            cut_running,
            transitions: st.counts.transitions,
            active_event: st.active_event.map(|i| st.events[i].name.clone()),
            keys: self.keys().map_or(0, Keys::len),
            route_limit: self.aggregate().map(|a| RouteLimitSnapshot {
                limit_rps: a.in_force_rps(),
                configured_rps: a.configured_rps(),
                level: a.level(now),
                rejected: a.rejected(),
            }),
            max_keys: match &self.partition {
                Partition::Route => 0,
                Partition::ClientIp(limits) | Partition::Header(_, limits) => limits.max_keys,
            },
            cut_vs_base_rejected,
            cut_vs_base_admitted: match &self.shadow {
                Some(Shadow::Twin(_)) => Some(self.counter.counters().sum(CUT_ADMITTED)),
                _ => None,
            },
            keys_evicted: match &self.shadow {
                Some(Shadow::Twin(_)) => 0,
                _ => self.counter.counters().sum(KEYS_EVICTED),
            },
            keys_overflowed: self.keys().map_or(0, Keys::overflow_decisions),
            refused_keys: self.keys().map(Keys::refused),
            window: self.window,
            min_rps: p.min_rps,
            roc_mode: p.roc_mode,
            algorithm: self.algorithm.name(),
        }
    }
}

#[cfg(test)]
mod tests;
