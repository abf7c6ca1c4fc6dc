//! [`RouteSnapshot`]: a read-only view of one route, for the admin API, metrics and
//! tests.

use crate::clock::Nanos;
use crate::config::Mode;
use crate::controller::ControllerState;
use crate::distinct::KeySketch;
use crate::limiter::{Level, Reason};
use crate::window::{RocMode, RocSample, WindowSpec};
use std::time::Duration;

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
    /// The route-level limiter's level (tokens, count, queue or in-flight). On a
    /// partitioned route, where each key has a limiter of its own and the route-level
    /// one decides nothing, the value is NaN (no one level describes the keys) and the
    /// capacity is that of a key in no tier.
    pub level: Level,
    /// Requests offered (admitted and rejected alike).
    pub offered: u64,
    /// Requests admitted (offered less rejected; shadow modes admit all).
    pub admitted: u64,
    /// Requests rejected, by reason.
    pub rejected: Vec<(Reason, u64)>,
    /// Requests a shadow mode admitted but would have rejected, by reason.
    pub shadow_rejected: Vec<(Reason, u64)>,
    /// Requests refused while a cut held (`roc_cut`, real or in `shadow` would-be)
    /// that a token bucket at the base limit would have admitted then. Less
    /// [`cut_vs_base_admitted`](Self::cut_vs_base_admitted), the cut's own refusals
    /// ([`cut_own_net`](Self::cut_own_net)). Counted on a route limited as a whole by
    /// a token bucket in `enforce` and `shadow` mode, by a twin of its bucket at the
    /// base limit that takes the bucket's tokens when a cut engages and every request
    /// while it holds (a few requests decided on other threads as a cut engages or
    /// ends may be missed); and in `shadow_adaptive` mode on every route, as what the
    /// cut would have refused of what the base limit admitted (`shadow_rejected`'s
    /// `roc_cut`). `None` where not counted: a partitioned route or another algorithm
    /// in `enforce` or `shadow`, and a route a shared store decides once its shared
    /// state is put in the snapshot (`SharedControl::apply`): Redis's decisions are
    /// not the engine's.
    pub cut_vs_base_rejected: Option<u64>,
    /// Requests admitted while a cut held that the twin at the base limit refused
    /// then: the bucket at the cut and the one at base have tokens at other instants,
    /// so the cut admits some the base limit alone would have refused. Counted where
    /// [`cut_vs_base_rejected`](Self::cut_vs_base_rejected) is, but for
    /// `shadow_adaptive` routes, which know only that side (their cut's limiter is
    /// tried only on what the base limit admitted): `None` there.
    pub cut_vs_base_admitted: Option<u64>,
    /// Cuts since start.
    pub cuts: u64,
    /// Total time spent in `Cut`, the cut under way (if any) counted to the
    /// snapshot's time, but for one on a route a shared store decides
    /// ([`Engine::record`](super::Engine::record) counts its requests), whose
    /// controller here is not stepped: the store's time in cut is its own.
    pub time_in_cut: Duration,
    /// The part of `time_in_cut` that is the cut under way. Stepped later, its end may
    /// be dated before the snapshot's time (a hold that ran out in a silence), so
    /// `time_in_cut` can read less in a later snapshot than in this one.
    pub cut_running: Duration,
    /// Transition counts, `[from][to]` indexed by [`ControllerState::as_index`].
    pub transitions: [[u64; 3]; 3],
    /// The scheduled event in force, if any.
    pub active_event: Option<String>,
    /// Keys tracked (partitioned routes).
    pub keys: usize,
    /// A partitioned route's limit over its keys together (`route_limit`), and how
    /// full it is; `None` for a route without one.
    pub route_limit: Option<RouteLimitSnapshot>,
    /// Keys a partitioned route tracks at most (its `max_keys`; 0 for a route limited
    /// as a whole): once `keys` reaches it, new keys share one overflow limiter.
    pub max_keys: usize,
    /// Keys evicted (idle, or at rest in a full table) since the route was built.
    pub keys_evicted: u64,
    /// Requests of new keys decided by the shared overflow limiter (the key table
    /// full) since the route was built, modulo 2^32 (read it more often than 2^32
    /// such requests, and a lower count than the last is a wrap: the metrics
    /// collector counts on from it).
    pub keys_overflowed: u32,
    /// The keys a partitioned route refused (by their own limit, cut or not, or
    /// the shared overflow limiter's), or in a shadow mode would have (`shadow`: its
    /// limits' would-be refusals; `shadow_adaptive`: its base limit's and the cut's
    /// would-be ones), since the hints history last took them (a reload carries them
    /// into a route it keeps or rebuilds under the same name)
    /// ([`Engine::take_refused_keys`](super::Engine::take_refused_keys), once per
    /// interval), as a sketch of their count; `None` for a route limited as a whole.
    pub refused_keys: Option<KeySketch>,
    /// The window's shape.
    pub window: WindowSpec,
    /// The `min_rps` in force (the floor of relative ROC).
    pub min_rps: f64,
    /// Whether `roc`, `danger_roc` and `safe_roc` are absolute or relative.
    pub roc_mode: RocMode,
    /// The enforcing algorithm's name, as in config.
    pub algorithm: &'static str,
}

/// A partitioned route's limit over its keys together (`route_limit`), as a
/// [`RouteSnapshot`] shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct RouteLimitSnapshot {
    /// The total enforced now, req/s: the configured one (on a fleet, this instance's
    /// share of it: [`Engine::set_route_limit_share`](super::Engine::set_route_limit_share)),
    /// scaled by the cut as the keys' limit is (the fraction of base the cut was made
    /// at, brought back with the restore's progress:
    /// [`Controller::cut_fraction`](crate::controller::Controller::cut_fraction); in
    /// `shadow_adaptive`, unscaled).
    pub limit_rps: f64,
    /// The total as configured (`route_limit`: the running event's, if it sets one, else
    /// the route's own), req/s.
    pub configured_rps: f64,
    /// Its token bucket's tokens left and capacity.
    pub level: Level,
    /// Requests it refused since the route was built (in `shadow` mode, would have),
    /// counted among `rejected` (or `shadow_rejected`) as `limit`, or `roc_cut` while
    /// a cut holds: the part of those the keys' total refused, not a key's own limit.
    pub rejected: u64,
}

impl RouteSnapshot {
    /// The cut's own refusals, net: [`cut_vs_base_rejected`](Self::cut_vs_base_rejected)
    /// less [`cut_vs_base_admitted`](Self::cut_vs_base_admitted), which over the
    /// cuts' spans is the route's refusals less those a token bucket at the base
    /// limit, started from the route's bucket at each cut's start, makes of the same
    /// arrivals. Below zero where the cut admitted more than it refused of what the
    /// base limit would have decided otherwise. `None` unless both sides are counted.
    pub fn cut_own_net(&self) -> Option<i64> {
        let rejected = i64::try_from(self.cut_vs_base_rejected?).unwrap_or(i64::MAX);
        let admitted = i64::try_from(self.cut_vs_base_admitted?).unwrap_or(i64::MAX);
        Some(rejected.saturating_sub(admitted))
    }

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
