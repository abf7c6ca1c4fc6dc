//! A partitioned route's limit over its keys together (`route_limit`): one token bucket
//! for the route, tried after a key's own limiter admits, scaled by the cut as the
//! keys' limit is.
//!
//! A key refused by its own limit never reaches it, so it does not spend the other
//! keys' shared quota; a key its own limit admits and the total refuses has spent its
//! own token (as with Envoy's descriptors checked together). While the controller
//! holds the route's limit below base, the total is held at the same fraction of its
//! configured value (`limit / base_limit`); in `shadow_adaptive`, which enforces the
//! base limits, at its configured value, with a second bucket beside it at the cut's
//! fraction, which counts what the cut's total would have refused. A change keeps the
//! tokens there are (clamped to the new capacity), never refilling them, as the
//! limiters' contract says.
//!
//! On a fleet sharing a Redis store, which decides no partitioned route, the
//! configured total is the fleet's: each instance holds its share, the total ÷ the
//! live instances that the store counts ([`Aggregate::set_share`], which the store
//! sets through [`Engine::set_route_limit_share`](super::Engine::set_route_limit_share)),
//! its burst with it (the bucket's capacity is its rate × the route's burst). A
//! change of the count is a limit change like the others.

use crate::clock::Nanos;
use crate::config::Mode;
use crate::controller::Controller;
use crate::limiter::{Algorithm, Level, TokenBucket};
use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

/// The route-wide token bucket of a partitioned route's `route_limit`.
pub(super) struct Aggregate {
    /// The configured total, req/s, as f64 bits: a reload that keeps the route sets
    /// it in place ([`Aggregate::configure`]).
    configured: AtomicU64,
    /// The instances the configured total is shared by (1 but on a fleet sharing a
    /// Redis store): this instance holds `configured ÷ this`.
    share: AtomicU64,
    /// The total as enforced now.
    bucket: TokenBucket,
    /// The total in force, req/s, as f64 bits: the rate [`Aggregate::follow`] last
    /// set `bucket` to (or left for the engine to set), for the quota a refusal by
    /// it states, read without the route's state.
    in_force: AtomicU64,
    /// `shadow_adaptive`: the total as a cut would hold it ([`Aggregate::scaled_rps`]),
    /// which every request admitted takes a token from outside cuts (so that a cut
    /// finds it as drained as the enforced one) and, during a cut, every request the
    /// shadow key table admits: a request it refuses counts as the cut's.
    shadow: Option<TokenBucket>,
    /// Requests its refusal decided (in `shadow`, would have), since the route was built.
    rejected: AtomicU64,
}

impl Aggregate {
    /// The total of a route in `mode` with `algorithm` at `limit_rps`, full at `now`:
    /// its bucket holds the route's burst (a token bucket's `burst`, a window
    /// counter's window).
    pub(super) fn new(limit_rps: f64, mode: Mode, algorithm: Algorithm, now: Nanos) -> Self {
        let burst = match algorithm {
            Algorithm::TokenBucket { burst } => burst,
            Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } => window,
            // Refused by the configuration: a second of the limit.
            _ => Duration::from_secs(1),
        };
        Aggregate {
            configured: AtomicU64::new(limit_rps.to_bits()),
            share: AtomicU64::new(1),
            bucket: TokenBucket::new(limit_rps, burst, now),
            in_force: AtomicU64::new(limit_rps.to_bits()),
            shadow: (mode == Mode::ShadowAdaptive).then(|| TokenBucket::new(limit_rps, burst, now)),
            rejected: AtomicU64::new(0),
        }
    }

    /// Takes one token at `now`, or says in how many nanoseconds one will be there.
    #[inline]
    pub(super) fn take(&self, now: Nanos) -> Result<(), u64> {
        self.bucket.take(now)
    }

    /// `shadow_adaptive`: whether the total as the cut would hold it has a token for a
    /// request admitted at `now`, taking it (`true` on a route in another mode).
    #[inline]
    pub(super) fn take_shadow(&self, now: Nanos) -> bool {
        self.shadow.as_ref().is_none_or(|s| s.take(now).is_ok())
    }

    /// Counts a request the total refused.
    #[inline]
    pub(super) fn count_refusal(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Sets the configured total (a reload), which the next [`Aggregate::follow`]
    /// puts in force.
    pub(super) fn configure(&self, limit_rps: f64) {
        self.configured
            .store(limit_rps.to_bits(), Ordering::Relaxed);
    }

    /// The configured total, req/s.
    pub(super) fn configured_rps(&self) -> f64 {
        f64::from_bits(self.configured.load(Ordering::Relaxed))
    }

    /// Shares the configured total among `instances` (at least 1), which the next
    /// [`Aggregate::follow`] puts in force: `false` if it was shared so already.
    /// Called with the route's state lock held, the silence before it stepped.
    pub(super) fn set_share(&self, instances: u64) -> bool {
        self.share.swap(instances.max(1), Ordering::Relaxed) != instances.max(1)
    }

    /// Whether the configured total is shared among `instances` (at least 1) already.
    pub(super) fn is_shared_by(&self, instances: u64) -> bool {
        self.share.load(Ordering::Relaxed) == instances.max(1)
    }

    /// This instance's share of the configured total, req/s: all of it but on a
    /// fleet ([`Aggregate::set_share`]).
    fn share_rps(&self) -> f64 {
        let instances = self.share.load(Ordering::Relaxed).max(1);
        (self.configured_rps() / instances as f64).max(crate::config::MIN_LIMIT)
    }

    /// The total `c` holds the route to in `mode`: this instance's share of the
    /// configured one scaled by the controller's limit over its base limit (never
    /// above 1), or in `shadow_adaptive` the share unscaled.
    pub(super) fn target_rps(&self, c: &Controller, mode: Mode) -> f64 {
        if mode == Mode::ShadowAdaptive {
            return self.share_rps();
        }
        self.scaled_rps(c)
    }

    /// This instance's share of the configured total scaled by `c`'s limit over its
    /// base limit (never above 1): the total a cut holds the route to.
    fn scaled_rps(&self, c: &Controller) -> f64 {
        let share = self.share_rps();
        let base = c.params().base_limit_rps;
        if base <= 0.0 {
            return share;
        }
        (share * (c.limit_rps() / base).min(1.0)).max(crate::config::MIN_LIMIT)
    }

    /// Puts the total `c` holds the route to in force as of `at` (and in
    /// `shadow_adaptive` the cut's, in its shadow), without waiting: `false` when a
    /// change found its bucket's note taken and changed nothing (the engine makes it
    /// later; a bucket at its total already is left alone then).
    pub(super) fn follow(&self, c: &Controller, mode: Mode, at: Nanos) -> bool {
        let set = |bucket: &TokenBucket, target: f64| {
            bucket.is_at(target) || bucket.try_set_limit(target, at)
        };
        let target = self.target_rps(c, mode);
        self.in_force.store(target.to_bits(), Ordering::Relaxed);
        let enforced = set(&self.bucket, target);
        let shadow = self
            .shadow
            .as_ref()
            .is_none_or(|s| set(s, self.scaled_rps(c)));
        enforced && shadow
    }

    /// The total in force, req/s (see [`Aggregate::follow`]). One atomic load.
    pub(super) fn in_force_rps(&self) -> f64 {
        f64::from_bits(self.in_force.load(Ordering::Relaxed))
    }

    /// Tokens left at `now` and the capacity.
    pub(super) fn level(&self, now: Nanos) -> Level {
        self.bucket.level(now)
    }

    /// Requests refused by the total since the route was built.
    pub(super) fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }
}
