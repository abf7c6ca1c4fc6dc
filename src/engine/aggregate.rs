//! A partitioned route's limit over its keys together (`route_limit`): one token bucket
//! for the route, tried after a key's own limiter admits, scaled by the cut as the
//! keys' limit is.
//!
//! A key refused by its own limit never reaches it, so it does not spend the other
//! keys' shared quota; a key its own limit admits and the total refuses has spent its
//! own token (as with Envoy's descriptors checked together). While the controller holds
//! the route's limit below base, the total is held at a fraction of its configured
//! value that follows the cut (below); in `shadow_adaptive`, which enforces the base
//! limits, at its configured value, with a second bucket beside it at the cut's
//! fraction, which counts what the cut's total would have refused. A change keeps the
//! tokens there are (clamped to the new capacity), never refilling them, as the
//! limiters' contract says. A scheduled event may carry a total of its own, put in
//! force at its start and the route's back at its end ([`Aggregate::choose`]), each
//! such a change.
//!
//! On a fleet sharing a Redis store, which decides no partitioned route, the
//! configured total is the fleet's: each instance holds its share, the total ÷ the
//! live instances that the store counts ([`Aggregate::set_share`], which the store
//! sets through [`Engine::set_route_limit_share`](super::Engine::set_route_limit_share)),
//! its burst with it (the bucket's capacity is its rate × the route's burst). A
//! change of the count is a limit change like the others.
//!
//! A cut holds the total at the fraction of its configured value that the cut held the
//! keys' limit to when it was made (`cut_limit ÷ base_limit` then, the controller's
//! [`cut_fraction`](Controller::cut_fraction)), and its restore brings the total back
//! as far as it brings the keys' limit from cut to base under the limits in force
//! ([`progress`](Controller::progress)): the fraction is `f + (1 − f) × progress`, 1 at
//! base. Without a change of limits during the cut that is `limit ÷ base_limit` (60/200
//! of 1,000 is 300, and each restore step of 20 brings back 100). It is read from the
//! controller at every [`Aggregate::follow`], so it holds no state of its own: a change
//! undone (a runtime change withdrawn, an event over) puts back the total it found. A
//! change of `base_limit` during the cut moves neither the keys' limit (the cut limit)
//! nor the total, whichever way (a base lowered to 100 under the cut limit of 60 does
//! not raise it to 60/100, 600, nor does an event's base of 400 halve it to 60/400,
//! 150); one of `cut_limit` while the cut holds moves the keys' alone, as the route's cut limit moves no
//! tier's: the total is held as a tier of its own would be, its cut limit the
//! configured total × that fraction. (Not the cut limit over the base at the cut: an
//! event raising base, cut and total twofold would then hold the total at 120/200 of
//! 2,000, four times what it was where the keys get twice. In `Cut`, no change raises
//! the total but a raised total or a smaller count of instances sharing it.) During the
//! restore a base limit lowered toward the limit reached brings the keys nearer their
//! base, and the total with them (at 100 of 60 → 200, a base lowered to 110 puts both
//! 4/5 of the way back, 860), up to the configured total when the change ends the
//! restore: a rule that held the total lower there would put it back all at once at the
//! restore's end. A `cut_limit` changed during the restore moves the total too, with
//! the keys' progress counted from the new cut limit: one raised above the limit
//! reached puts the keys there, at progress 0, and the total back at its cut fraction
//! (at 100 of 60 → 200, a cut limit of 150 raises the keys to 150 and lowers the total
//! from 500 to 300), as it puts a tier back at its own cut limit.

use super::Held;
use crate::clock::Nanos;
use crate::config::Mode;
use crate::controller::Controller;
use crate::limiter::{Algorithm, Level, TokenBucket};
use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

/// The route-wide token bucket of a partitioned route's `route_limit`.
pub(super) struct Aggregate {
    /// The route's own configured total, req/s, as f64 bits: a reload that keeps the
    /// route sets it in place ([`Aggregate::configure`]).
    own: AtomicU64,
    /// The configured total of the profile in force, req/s, as f64 bits: the running
    /// event's, if it has one, else `own` ([`Aggregate::choose`]).
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
    /// `shadow_adaptive`: the total as a cut would hold it ([`Aggregate::follow`]),
    /// which every request admitted takes a token from outside cuts (so that a cut
    /// finds it as drained as the enforced one) and, during a cut, every request the
    /// shadow key table admits: a request it refuses counts as the cut's.
    shadow: Option<TokenBucket>,
    /// Requests its refusal decided (in `shadow`, would have), since the route was built.
    rejected: AtomicU64,
}

impl Aggregate {
    /// The total of a route in `mode` with `algorithm`, its own configured total
    /// `own_rps`, at `limit_rps` (the profile's in force at `now`: a running event's,
    /// or `own_rps`), full at `now`: its bucket holds the route's burst (a token
    /// bucket's `burst`, a window counter's window).
    pub(super) fn new(
        own_rps: f64,
        limit_rps: f64,
        mode: Mode,
        algorithm: Algorithm,
        now: Nanos,
    ) -> Self {
        let burst = match algorithm {
            Algorithm::TokenBucket { burst } => burst,
            Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } => window,
            // Refused by the configuration: a second of the limit.
            _ => Duration::from_secs(1),
        };
        Aggregate {
            own: AtomicU64::new(own_rps.to_bits()),
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

    /// Sets the route's own configured total (a reload), which the next
    /// [`Aggregate::choose`] without an event's and [`Aggregate::follow`] put in force.
    pub(super) fn configure(&self, limit_rps: f64) {
        self.own.store(limit_rps.to_bits(), Ordering::Relaxed);
    }

    /// Takes the configured total of the profile in force: `event`'s, the running
    /// event's if it has one, else the route's own. Whether it changed (the next
    /// [`Aggregate::follow`] puts it in force). Called under the route's state lock.
    pub(super) fn choose(&self, event: Option<f64>) -> bool {
        let total = event.unwrap_or_else(|| self.own_rps());
        let before = self.configured.swap(total.to_bits(), Ordering::Relaxed);
        before != total.to_bits()
    }

    /// The route's own configured total, req/s.
    pub(super) fn own_rps(&self) -> f64 {
        f64::from_bits(self.own.load(Ordering::Relaxed))
    }

    /// The configured total of the profile in force (the running event's, or the
    /// route's own), req/s.
    pub(super) fn configured_rps(&self) -> f64 {
        f64::from_bits(self.configured.load(Ordering::Relaxed))
    }

    /// Shares the configured total among `instances` (at least 1), which the next
    /// [`Aggregate::follow`] puts in force: `false` if it was shared so already.
    /// Called with the route's state lock held, the silence before it stepped.
    pub(super) fn set_share(&self, instances: u64) -> bool {
        self.share.swap(instances.max(1), Ordering::Relaxed) != instances.max(1)
    }

    /// The instances the configured total is shared among ([`Aggregate::set_share`]).
    pub(super) fn instances(&self) -> u64 {
        self.share.load(Ordering::Relaxed).max(1)
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

    /// The fraction of the configured total a cut holds the route to under `c`:
    /// the fraction of base the cut was made at, `f` ([`Controller::cut_fraction`]),
    /// brought back toward 1 as far as the keys' limit has come from cut to base
    /// ([`Controller::progress`]): `f + (1 − f) × progress`, in `f ..= 1`, 1 at base
    /// (see the module doc).
    fn scale(c: &Controller) -> f64 {
        let f = c.cut_fraction();
        f + (1.0 - f) * c.progress()
    }

    /// Puts the total `c` holds the route to in force as of `at`: this instance's
    /// share of the configured one ([`Aggregate::set_share`]) scaled by the cut
    /// ([`Aggregate::scale`]), or in `shadow_adaptive` the share unscaled (and the
    /// scaled one in its shadow), without waiting: `false` when a change
    /// found its bucket's note taken and changed nothing (the engine makes it later; a
    /// bucket at its total already is left alone then). Called under the route's state
    /// lock.
    pub(super) fn follow(&self, c: &Controller, mode: Mode, at: Nanos) -> bool {
        let set = |bucket: &TokenBucket, target: f64| {
            bucket.is_at(target) || bucket.try_set_limit(target, at)
        };
        let share = self.share_rps();
        let scaled = (share * Self::scale(c)).max(crate::config::MIN_LIMIT);
        let target = if mode == Mode::ShadowAdaptive {
            share
        } else {
            scaled
        };
        self.in_force.store(target.to_bits(), Ordering::Relaxed);
        let enforced = set(&self.bucket, target);
        let shadow = self.shadow.as_ref().is_none_or(|s| set(s, scaled));
        enforced && shadow
    }

    /// The total in force, req/s (see [`Aggregate::follow`]). One atomic load.
    pub(super) fn in_force_rps(&self) -> f64 {
        f64::from_bits(self.in_force.load(Ordering::Relaxed))
    }

    /// The total's buckets by the limit each holds, as a reload that rebuilds the
    /// route carries them ([`Held`]): the total as the cut holds it, and the total
    /// at its configured value, which is the same bucket outside a cut (`engaged`
    /// false), and none during one but in `shadow_adaptive`.
    pub(super) fn held(&self, engaged: bool) -> [Option<Held<'_>>; 2] {
        let bucket = Some(Held::Bucket(&self.bucket));
        match &self.shadow {
            Some(cut) => [Some(Held::Bucket(cut)), bucket],
            None => [bucket, bucket.filter(|_| !engaged)],
        }
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
