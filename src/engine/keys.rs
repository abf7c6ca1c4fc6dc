//! The per-key state of partitioned routes: a key table per algorithm and key kind,
//! each key's limiter state laid flat beside its tier, generation and last-seen time,
//! the tiers' limits, the lazy catch-up of a key to a changed limit, and the sweep of
//! idle keys. Also [`Shadow`], the second set of limiters of a `shadow_adaptive` route.

use super::key_types::{tier_index, IpKey, TableKey, TierIndex, TierKey, ValueKey};
use super::Route;
use crate::clock::Nanos;
use crate::config::{KeyLimits, Partition, RouteConfig, Tier};
use crate::distinct::{AtomicKeySketch, KeySketch};
use crate::limiter::{
    gcra, interval_ns, reject, words, Admit, Algorithm, Concurrency, Decision, Limiter, Pace,
    Reason, TokenBucket,
};
use crate::sync::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash, RandomState};
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::time::Duration;

/// A route's second limiter, beside the one that decides: in `shadow_adaptive`, its
/// second set of limiters, following the controller's limit while the enforced ones
/// hold the base limit; in `enforce` and `shadow`, a route-wide token bucket's twin at
/// the base limit, which counts the cut's decisions that the base limit would have
/// made the other way.
pub(super) enum Shadow {
    /// shadow_adaptive, for a route limited as a whole.
    Route(Limiter),
    /// shadow_adaptive, for a partitioned route: a second key table (filled only while
    /// a cut is in force, since only then is it consulted).
    Keys(Box<Keys>),
    /// `enforce` and `shadow`, for a route limited as a whole by a token bucket: the
    /// route's bucket as the base limit alone would have it. Idle outside cuts; when
    /// a cut engages it takes the route's bucket's tokens (at base until then), and
    /// while the cut holds every decision on the route is tried against it too: a
    /// refusal it would have admitted, and an admission it would have refused, are
    /// counted (see `TWIN_ENGAGED` and `Engine::decide_twinned`).
    Twin(TokenBucket),
}

/// Per-key state of a partitioned route, in a key table per algorithm: each key's
/// state laid flat beside its own fields, so that a table slot stays small.
pub(super) enum Keys {
    Bucket(KeyTables<BucketKey>),
    Fixed(KeyTables<WordKey<Fixed>>),
    Sliding(KeyTables<WordKey<Sliding>>),
    Leaky(KeyTables<WordKey<Leaky>>),
    Concurrency(KeyTables<ConcurrencyKey>),
}

/// The key tables of one key state, by key kind.
pub(super) enum KeyTables<E> {
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
    pub(super) fn new(cfg: &RouteConfig, now: Nanos, hold_base: bool) -> Option<Self> {
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
    pub(super) fn check(&self, r: &Route, key: TableKey, now: Nanos) -> Decision {
        with_tables!(self, t => t.check(r, key, now))
    }

    pub(super) fn give_back(&self, key: TableKey, pace: Pace, now: Nanos) -> bool {
        with_tables!(self, t => t.give_back(key, pace, now))
    }

    /// The nanoseconds from `now` until the state that decided `key`'s request (its
    /// own, the shared overflow's, the anonymous one) would admit another
    /// ([`KeyState::wait`]).
    pub(super) fn wait(&self, key: TableKey, now: Nanos) -> u64 {
        with_tables!(self, t => t.wait(key, now))
    }

    /// Sweeps the tables (see [`KeyTable::sweep`]); `counted`: the keys evicted count
    /// as the route's ([`super::KEYS_EVICTED`]), as the enforced table's do and a
    /// shadow table's do not.
    pub(super) fn sweep(&self, r: &Route, last: &AtomicU64, now: Nanos, counted: bool) {
        with_tables!(self, t => t.sweep(r, last, now, counted));
    }

    pub(super) fn len(&self) -> usize {
        with_tables!(self, t => t.len())
    }

    /// Requests of new keys decided by the overflow limiter since the tables were
    /// made, modulo 2^32 (a collector that reads it more often than 2^32 such requests
    /// takes a lower count for a wrap).
    pub(super) fn overflow_decisions(&self) -> u32 {
        with_tables!(self, t => t.overflow_decisions())
    }

    /// Concurrency keys with requests queued take the route's new limit now, which
    /// wakes as many as a raise lets in (other keys catch up on their next request).
    /// Only a route with a concurrency queue visits its keys.
    pub(super) fn wake_queued(&self, r: &Route) {
        let Keys::Concurrency(tables) = self else {
            return;
        };
        match tables {
            KeyTables::Ip(t) => t.wake_queued(r),
            KeyTables::Value(t) => t.wake_queued(r),
        }
    }

    pub(super) fn tiers(&self) -> &TierTable {
        with_tables!(self, t => t.tiers())
    }

    /// Takes over the keys of `from`, those of a route that a reload rebuilds into this
    /// one's (same keys, algorithm shape and tiers): a concurrency key's permits, and
    /// requests queued for them at most `queue` from now on ([`KeyTable::take_over`]);
    /// a rate algorithm's key's limiter state, copied ([`KeyTable::carry`]). Each
    /// key comes in at its limit with this route's controller at `progress` between
    /// its cut and base limits (a cut the reload carried is in force from the start).
    /// Nothing unless both are keys of one algorithm and kind.
    ///
    /// `cut`: the shadow keys of `from`'s route, a `shadow_adaptive` one in a cut that
    /// this route enforces (it is not `shadow_adaptive`), and the second that cut
    /// began: a rate algorithm's key that `cut` last saw in that second or later takes
    /// the state of `cut`'s, which followed the cut, not of `from`'s, which held the
    /// base; every other key of `from` (one `cut` last saw in an earlier cut stands
    /// where that cut left it), and the shared overflow and keyless states, come from
    /// `from`.
    pub(super) fn take_over(
        &mut self,
        from: &Keys,
        cut: Option<(&Keys, u32)>,
        queue: u32,
        progress: f64,
    ) {
        let p = progress;
        // `cut`'s tables of the key state `$v`.
        macro_rules! cut {
            ($v:ident) => {
                cut.and_then(|(c, since)| match c {
                    Keys::$v(c) => Some((c, since)),
                    _ => None,
                })
            };
        }
        match (self, from) {
            (Keys::Bucket(new), Keys::Bucket(old)) => {
                new.carry(old, cut!(Bucket), false, p, BucketKey::carried)
            }
            (Keys::Fixed(new), Keys::Fixed(old)) => {
                new.carry(old, cut!(Fixed), false, p, WordKey::carried)
            }
            (Keys::Sliding(new), Keys::Sliding(old)) => {
                new.carry(old, cut!(Sliding), false, p, WordKey::carried)
            }
            (Keys::Leaky(new), Keys::Leaky(old)) => {
                new.carry(old, cut!(Leaky), false, p, WordKey::carried)
            }
            (Keys::Concurrency(KeyTables::Ip(new)), Keys::Concurrency(KeyTables::Ip(old))) => {
                new.take_over(old, queue, p)
            }
            (
                Keys::Concurrency(KeyTables::Value(new)),
                Keys::Concurrency(KeyTables::Value(old)),
            ) => new.take_over(old, queue, p),
            _ => {}
        }
    }

    /// Whether a request with `key` is decided by the shared overflow limiter: the
    /// table is full and holds no state of the key's.
    pub(super) fn overflowed(&self, key: TableKey) -> bool {
        with_tables!(self, t => t.overflowed(key))
    }

    /// Counts `key` among the keys refused (the requests without a key, which share
    /// one limiter, as one key).
    #[cold]
    #[inline(never)]
    pub(super) fn note_refused(&self, key: TableKey) {
        with_tables!(self, t => t.note_refused(key));
    }

    /// The keys refused since they were last taken.
    pub(super) fn refused(&self) -> KeySketch {
        with_tables!(self, t => t.refused(false))
    }

    /// The keys refused since they were last taken, emptied.
    pub(super) fn take_refused(&self) -> KeySketch {
        with_tables!(self, t => t.refused(true))
    }

    /// The keys refused since they were last taken, and the hasher they were counted
    /// by; `None` where the tables were never made (no key came, none was refused).
    pub(super) fn refused_by_hash(&self) -> Option<(RandomState, KeySketch)> {
        with_tables!(self, t => match t {
            KeyTables::Ip(t) => t.refused_by_hash(),
            KeyTables::Value(t) => t.refused_by_hash(),
        })
    }

    /// Takes in `refused`, the keys another route's tables refused by `hasher`
    /// ([`Keys::refused_by_hash`]): a reload rebuilding a route under the same name
    /// carries them, and this route's tables, made now, hash their keys by the same
    /// hasher, so a key refused on both sides counts once (tables already made keep
    /// their own, and such a key may count twice).
    pub(super) fn carry_refused(&self, hasher: RandomState, refused: &KeySketch) {
        with_tables!(self, t => match t {
            KeyTables::Ip(t) => t.carry_refused(hasher, refused),
            KeyTables::Value(t) => t.carry_refused(hasher, refused),
        });
    }
}

impl<E: KeyState> KeyTables<E> {
    /// [`KeyTable::carry`] between tables of one key kind; nothing between two kinds
    /// (and no `cut` of another kind).
    fn carry(
        &mut self,
        from: &Self,
        cut: Option<(&Self, u32)>,
        all: bool,
        progress: f64,
        carried: impl Fn(&E, &TierTable, f64, Nanos) -> E,
    ) {
        match (self, from) {
            (KeyTables::Ip(new), KeyTables::Ip(old)) => {
                let cut = cut.and_then(|(c, since)| match c {
                    KeyTables::Ip(c) => Some((c, since)),
                    KeyTables::Value(_) => None,
                });
                new.carry(old, cut, all, progress, carried)
            }
            (KeyTables::Value(new), KeyTables::Value(old)) => {
                let cut = cut.and_then(|(c, since)| match c {
                    KeyTables::Value(c) => Some((c, since)),
                    KeyTables::Ip(_) => None,
                });
                new.carry(old, cut, all, progress, carried)
            }
            _ => {}
        }
    }

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

    fn note_refused(&self, key: TableKey) {
        match (self, key) {
            (KeyTables::Ip(t), TableKey::Ip(ip)) => {
                t.note_refused(&IpKey::new(ip, t.limits.ipv6_prefix))
            }
            (KeyTables::Value(t), TableKey::Value(v)) => t.note_refused(&v),
            (KeyTables::Ip(t), _) => t.note_anonymous_refused(),
            (KeyTables::Value(t), _) => t.note_anonymous_refused(),
        }
    }

    fn refused(&self, take: bool) -> KeySketch {
        match self {
            KeyTables::Ip(t) => t.refused(take),
            KeyTables::Value(t) => t.refused(take),
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

    fn wait(&self, key: TableKey, now: Nanos) -> u64 {
        match (self, key) {
            (KeyTables::Ip(t), TableKey::Ip(ip)) => {
                t.wait(&IpKey::new(ip, t.limits.ipv6_prefix), now)
            }
            (KeyTables::Value(t), TableKey::Value(v)) => t.wait(&v, now),
            (KeyTables::Ip(t), _) => t.anonymous.wait(&t.tiers, now),
            (KeyTables::Value(t), _) => t.anonymous.wait(&t.tiers, now),
        }
    }

    fn sweep(&self, r: &Route, last: &AtomicU64, now: Nanos, counted: bool) {
        match self {
            KeyTables::Ip(t) => t.sweep(r, last, now, counted),
            KeyTables::Value(t) => t.sweep(r, last, now, counted),
        }
    }

    fn len(&self) -> usize {
        match self {
            KeyTables::Ip(t) => t.len.load(Ordering::Relaxed),
            KeyTables::Value(t) => t.len.load(Ordering::Relaxed),
        }
    }

    fn overflow_decisions(&self) -> u32 {
        match self {
            KeyTables::Ip(t) => t.overflow_decisions.load(Ordering::Relaxed),
            KeyTables::Value(t) => t.overflow_decisions.load(Ordering::Relaxed),
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
pub(super) struct TierTable {
    /// Base and cut limits of keys in no tier, as f64 bits: the route's controller
    /// parameters in force, updated when they change (runtime update, reload of the
    /// parameters, scheduled event).
    default: [AtomicU64; 2],
    /// Each tier's base and cut limits, tier `i` at `i - 1` (a boxed slice, 8 bytes
    /// less than a `Vec`, which made room for [`TierTable::changed_at`] in the route).
    tiers: Box<[(f64, f64)]>,
    /// The tier of each tier value, by its key's bits ([`TierKey`]). A key's tier is
    /// looked up at each new key and rejection: a scan of every value of every tier
    /// made each of those cost as much as the list is long (a partner list of 10,000
    /// API keys), for invented keys too.
    index: TierIndex,
    /// The algorithm's fixed parameter, the same for every key: the token bucket's
    /// burst or the windows' length in milliseconds, or the leaky bucket's or the
    /// concurrency limiter's queue.
    shape: u32,
    /// Keys hold their base limit whatever the controller does (shadow_adaptive's
    /// enforced keys).
    hold_base: bool,
    /// When the limit of the table's keys last changed (ns on the engine's clock): a
    /// key catching up refills at its old rate until then, at the new one after. The
    /// route's own date ([`Route::changed_at`]) moves at every change of its limit,
    /// which a table holding its base limit does not follow: a key of one, idle across
    /// a raise of the base and a cut after it, refilled at the old base until the cut.
    changed_at: AtomicU64,
}

impl TierTable {
    /// Where the table's keys stand between their cut (0) and base (1) limits.
    pub(super) fn progress(&self, r: &Route) -> f64 {
        self.keys_progress(f64::from_bits(r.progress.load(Ordering::Relaxed)))
    }

    /// Where the table's keys stand between their cut (0) and base (1) limits, the
    /// route's controller at `route` between its own.
    fn keys_progress(&self, route: f64) -> f64 {
        if self.hold_base {
            1.0
        } else {
            route
        }
    }

    /// The tier of a key of the table (0: none).
    pub(super) fn tier_of<Q: TierKey>(&self, key: &Q) -> u16 {
        if self.index.is_empty() {
            0
        } else {
            self.index.get(&key.bits()).copied().unwrap_or(0)
        }
    }

    /// Puts the route's controller parameters in force for the keys in no tier, after
    /// a change of the route's limit at `at`, which dates the change of the table's
    /// keys: every change, or, for a table holding its base limit, one that moved its
    /// keys' limits (the base, or the cut, which [`TierTable::limit`] reads at the base too).
    /// Called with the route's state lock held, before the route's generation moves on.
    pub(super) fn set_default(&self, base: f64, cut: f64, at: Nanos) {
        let base_moved = self.default[0].swap(base.to_bits(), Ordering::Relaxed) != base.to_bits();
        let cut_moved = self.default[1].swap(cut.to_bits(), Ordering::Relaxed) != cut.to_bits();
        if base_moved || cut_moved || !self.hold_base {
            self.changed_at.store(at.as_u64(), Ordering::Relaxed);
        }
    }

    /// The base and cut limits of tier `tier` (from 1), if the table has it.
    pub(super) fn tier_limits(&self, tier: u16) -> Option<(f64, f64)> {
        let i = usize::from(tier).checked_sub(1)?;
        self.tiers.get(i).copied()
    }

    pub(super) fn limit(&self, tier: u16, progress: f64) -> f64 {
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
pub(super) trait KeyState: Send + Sync {
    /// A new key of `tier` at `progress` between its cut and base limits, set for the
    /// route's `generation`.
    fn new(tiers: &TierTable, tier: u16, progress: f64, generation: u32, now: Nanos) -> Self;

    /// Decides one request, after catching up with the route's limit if it changed
    /// since this key last looked.
    fn check(&self, r: &Route, tiers: &TierTable, now: Nanos) -> Decision;

    /// Whether the key may be evicted: unseen since `cutoff` (whole seconds) and
    /// holding nothing at `now`, so that a new key would start where it stands (a
    /// token short of a full bucket, a count in the window, a request still queued
    /// or a concurrency permit still out keeps it). A token bucket's key catches up
    /// with the route's limit first, as its next request would: full at a limit the
    /// route has since raised, it holds fewer tokens than a new key gets, and evicted
    /// as it was, it came back full at the new capacity.
    fn evictable(&self, r: &Route, tiers: &TierTable, cutoff: u32, now: Nanos) -> bool;

    /// Gives back a paced request's place (see [`Pace`]); only a leaky bucket's key
    /// has one.
    fn give_back(&self, _pace: Pace, _now: Nanos) -> bool {
        false
    }

    /// The nanoseconds from `now` until the key's limiter would admit a request, at
    /// the limit it has (0: it would now), admitting none: what a request refused by
    /// the route's `route_limit` after its key admitted it waits for its key too.
    /// Only the algorithms a `route_limit` takes (token bucket, fixed and sliding
    /// window) have a wait; the others, 0.
    fn wait(&self, _tiers: &TierTable, _now: Nanos) -> u64 {
        0
    }

    /// Whole seconds on the engine's clock when the key was last seen.
    fn seen_s(&self) -> u32;

    /// The tier the key belongs to (0: none).
    fn tier(&self) -> u16;
}

/// Whole seconds on the engine's clock, as kept per key (136 years fit).
pub(super) fn secs(now: Nanos) -> u32 {
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

    /// This key's tier and last-seen time, for a key carried into the table of the
    /// route a reload rebuilds (same tiers) as a new key of it is set: generation 0,
    /// which a limit change of that route moves past ([`Route::start`] makes one).
    fn carried(&self) -> Self {
        KeyMeta {
            generation: AtomicU32::new(0),
            last_seen_s: AtomicU32::new(self.last_seen_s.load(Ordering::Relaxed)),
            tier: self.tier,
        }
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
pub(super) struct BucketKey {
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
        self.catch_up(r, tiers, now);
        self.meta.touch(now);
        match self.words().take(now) {
            Ok(()) => Decision::Admit(Admit::Now),
            Err(retry_after_ns) => reject(retry_after_ns, Reason::Limit),
        }
    }

    fn evictable(&self, r: &Route, tiers: &TierTable, cutoff: u32, now: Nanos) -> bool {
        if !self.meta.unseen_since(cutoff) {
            return false;
        }
        self.catch_up(r, tiers, now);
        let caught_up = self.meta.generation.load(Ordering::Relaxed)
            == r.generation.load(Ordering::Acquire) as u32;
        caught_up && self.words().full(now)
    }

    fn wait(&self, _tiers: &TierTable, now: Nanos) -> u64 {
        self.words().wait(now)
    }

    fn seen_s(&self) -> u32 {
        self.meta.last_seen_s.load(Ordering::Relaxed)
    }

    fn tier(&self) -> u16 {
        self.meta.tier
    }
}

impl BucketKey {
    /// This key carried into `tiers`, the table of the route a reload rebuilds (same
    /// burst and tiers): a bucket at the key's limit there, its keys at `progress`
    /// between their cut and base limits, holding the tokens this one holds at `at`
    /// (clamped to its capacity), and this key's last-seen time.
    fn carried(&self, tiers: &TierTable, progress: f64, at: Nanos) -> Self {
        let (t, capacity) = gcra::params(tiers.limit(self.meta.tier, progress), tiers.shape);
        let key = BucketKey {
            tat: AtomicU64::new(gcra::full_at(at)),
            emission_ns: AtomicU64::new(t),
            capacity: AtomicU32::new(capacity),
            meta: self.meta.carried(),
        };
        key.words().copy_tat(self.words(), at);
        key
    }

    /// Sets the key's bucket at the route's limit if the route changed it since the
    /// key last looked, dated by the last change of its table's limits
    /// ([`TierTable::set_default`]): refilled at its old rate until then, at the new one
    /// after. A key that missed several changes refilled at its old rate until the
    /// last, and holds at most a bucket of the new limit more or fewer tokens than a
    /// bucket that took each change as it came (both hold between none and that
    /// bucket); exact would keep the route's history of changes. A change whose note
    /// another change holds is left for later; the key stays at the limit it has (see
    /// `keep_up`).
    fn catch_up(&self, r: &Route, tiers: &TierTable, now: Nanos) {
        let words = self.words();
        self.meta.keep_up(r, || {
            let changed = Nanos::new(tiers.changed_at.load(Ordering::Relaxed));
            words.try_set(
                gcra::params(self.meta.limit(r, tiers), tiers.shape),
                changed.min(now),
            )
        });
    }

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
pub(super) struct WordKey<A> {
    state: AtomicU64,
    /// The key's limit in `A`'s form ([`WordAlgo::limit_word`]).
    limit: AtomicU64,
    meta: KeyMeta,
    algorithm: PhantomData<fn() -> A>,
}

/// An algorithm whose per-key state is one word: its decision on [`words`].
pub(super) trait WordAlgo {
    /// The limit word for `limit` req/s.
    fn limit_word(limit: f64) -> u64;

    /// Decides one request on the state word, with the key's limit word and the
    /// route's [`TierTable::shape`]. Changing the limit word keeps the state.
    fn check(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> Decision;

    /// The state word of a new key at `now`.
    fn fresh(_shape: u32, _now: Nanos) -> u64 {
        0
    }

    /// Whether the state word holds nothing at `now` (as a new key's would).
    fn at_rest(state: &AtomicU64, shape: u32, now: Nanos) -> bool;

    /// Gives back a paced request's place on the state word (see [`Pace`]); only the
    /// leaky bucket paces.
    fn give_back(_state: &AtomicU64, _pace: Pace, _now: Nanos) -> bool {
        false
    }

    /// [`KeyState::wait`] on the state word, with the key's limit word; the window
    /// counters' (the leaky bucket takes no `route_limit`: 0).
    fn wait(_state: &AtomicU64, _limit_word: u64, _shape: u32, _now: Nanos) -> u64 {
        0
    }
}

/// [`FixedWindow`](crate::limiter::FixedWindow) per key; the limit word is the limit's bits.
pub(super) struct Fixed;
/// [`SlidingWindowCounter`](crate::limiter::SlidingWindowCounter) per key; the limit
/// word is the limit's bits.
pub(super) struct Sliding;
/// [`LeakyBucket`](crate::limiter::LeakyBucket) per key; the limit word is the
/// emission interval.
pub(super) struct Leaky;

impl WordAlgo for Fixed {
    fn limit_word(limit: f64) -> u64 {
        limit.to_bits()
    }

    fn fresh(shape: u32, now: Nanos) -> u64 {
        words::empty_at(words::window_ns(shape), now)
    }

    fn check(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> Decision {
        let window_ns = words::window_ns(shape);
        let quota = words::quota(f64::from_bits(limit_word), window_ns);
        words::fixed(state, quota as u64, window_ns, now)
    }

    fn at_rest(state: &AtomicU64, shape: u32, now: Nanos) -> bool {
        words::fixed_count(state, words::window_ns(shape), now) == 0
    }

    fn wait(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> u64 {
        let window_ns = words::window_ns(shape);
        let quota = words::quota(f64::from_bits(limit_word), window_ns);
        words::fixed_wait(state, quota as u64, window_ns, now)
    }
}

impl WordAlgo for Sliding {
    fn limit_word(limit: f64) -> u64 {
        limit.to_bits()
    }

    fn fresh(shape: u32, now: Nanos) -> u64 {
        words::empty_at(words::window_ns(shape), now)
    }

    fn check(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> Decision {
        let window_ns = words::window_ns(shape);
        let quota = words::quota(f64::from_bits(limit_word), window_ns);
        words::sliding(state, quota, window_ns, now)
    }

    fn at_rest(state: &AtomicU64, shape: u32, now: Nanos) -> bool {
        words::sliding_count(state, words::window_ns(shape), now) == 0.0
    }

    fn wait(state: &AtomicU64, limit_word: u64, shape: u32, now: Nanos) -> u64 {
        let window_ns = words::window_ns(shape);
        let quota = words::quota(f64::from_bits(limit_word), window_ns);
        words::sliding_wait(state, quota, window_ns, now)
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
            state: AtomicU64::new(A::fresh(tiers.shape, now)),
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

    fn evictable(&self, _r: &Route, tiers: &TierTable, cutoff: u32, now: Nanos) -> bool {
        self.meta.unseen_since(cutoff) && A::at_rest(&self.state, tiers.shape, now)
    }

    fn give_back(&self, pace: Pace, now: Nanos) -> bool {
        A::give_back(&self.state, pace, now)
    }

    fn wait(&self, tiers: &TierTable, now: Nanos) -> u64 {
        let limit = self.limit.load(Ordering::Relaxed);
        A::wait(&self.state, limit, tiers.shape, now)
    }

    fn seen_s(&self) -> u32 {
        self.meta.last_seen_s.load(Ordering::Relaxed)
    }

    fn tier(&self) -> u16 {
        self.meta.tier
    }
}

impl<A: WordAlgo> WordKey<A> {
    /// This key carried into `tiers`, the table of the route a reload rebuilds (same
    /// window or queue, and tiers): its state word as it is (the counts in its
    /// windows, or when its next request may leave), its limit word the key's limit
    /// there, its keys at `progress` between their cut and base limits, and its
    /// last-seen time.
    fn carried(&self, tiers: &TierTable, progress: f64, _at: Nanos) -> Self {
        WordKey {
            state: AtomicU64::new(self.state.load(Ordering::Acquire)),
            limit: AtomicU64::new(A::limit_word(tiers.limit(self.meta.tier, progress))),
            meta: self.meta.carried(),
            algorithm: PhantomData,
        }
    }
}

/// A key of the concurrency limiter. Its permits outlive any place in the key table
/// (which moves its entries as it grows), so its state is shared on the heap.
pub(super) struct ConcurrencyKey {
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
        self.catch_up(r, tiers);
        touch(&self.last_seen_s, now);
        let decision = self.limiter.check(now);
        // Queued: a limit change may have looked for this key's waiters (`wake_queued`)
        // before the request counted itself in the queue, and passed the key by. The
        // request then looks at the route's generation again, after counting itself:
        // both sides write (`SeqCst`), then read what the other wrote (`SeqCst`), so
        // at least one of them sees the other and the key takes the new limit, which
        // wakes as many as it lets in.
        if matches!(decision, Decision::Admit(Admit::Queued(_))) {
            self.catch_up(r, tiers);
        }
        decision
    }

    fn evictable(&self, _r: &Route, _tiers: &TierTable, cutoff: u32, _now: Nanos) -> bool {
        // A request still queued counts as held: a permit handed back leaves none in
        // flight until the request it woke takes it, from this state.
        unseen_since(&self.last_seen_s, cutoff) && self.limiter.is_idle()
    }

    fn seen_s(&self) -> u32 {
        self.last_seen_s.load(Ordering::Relaxed)
    }

    fn tier(&self) -> u16 {
        self.limiter.key_tier()
    }
}

impl ConcurrencyKey {
    /// Takes the route's limit now if requests are queued on the key and it changed
    /// (after the route's generation was raised; see [`ConcurrencyKey::check`] for a
    /// request queued meanwhile).
    fn wake_queued(&self, r: &Route, tiers: &TierTable) {
        if self.limiter.has_waiters() {
            self.catch_up(r, tiers);
        }
    }

    /// [`keep_up`] with the route's limit changes; nothing once a reload has handed
    /// the route's keys over to the route it rebuilds ([`Route::hand_over`]): the
    /// key's limit is that route's then, and so is the generation kept beside the
    /// permits, which this route's would overwrite (a generation the new route also
    /// reaches would then read as its change taken).
    #[inline]
    fn catch_up(&self, r: &Route, tiers: &TierTable) {
        if r.handed_over.load(Ordering::Relaxed) {
            return;
        }
        keep_up(self.limiter.key_generation(), r, Ordering::SeqCst, || {
            self.take_limit(r, tiers)
        });
    }

    /// Sets the key's limit for its tier, as the route now is (always: `true`, as
    /// [`keep_up`] takes it); but not once a reload has handed the route's keys over
    /// (a key that [`catch_up`](Self::catch_up) found not handed over just before).
    fn take_limit(&self, r: &Route, tiers: &TierTable) -> bool {
        if r.handed_over.load(Ordering::Relaxed) {
            return true;
        }
        let tier = self.limiter.key_tier();
        self.limiter.set_limit(tiers.limit(tier, tiers.progress(r)));
        true
    }
}

impl<K: Hash + Eq + Clone> KeyTable<K, ConcurrencyKey> {
    /// Takes over the permits of `from`, the table of a route that a reload rebuilds
    /// into this one's (same partition and tiers): each key with a permit out or a
    /// request queued, and the shared overflow and keyless states, come in under the
    /// same key, their permits held and requests queued counted under this table's
    /// limits, at most `queue` waiting from now on. A key at rest comes too: a request
    /// deciding on the old engine as the new one is put in force may still take a
    /// permit of it, which the new route then counts.
    fn take_over(&mut self, from: &Self, queue: u32, progress: f64) {
        // Every key, whatever `max_keys`: a permit held must be counted.
        self.carry(
            from,
            None,
            true,
            progress,
            |old: &ConcurrencyKey, tiers, progress, _| {
                let limiter = old.limiter.handed_over(queue);
                // Set for this route as a new key is: generation 0, at its limit as the
                // route now is.
                limiter.key_generation().store(0, Ordering::Relaxed);
                limiter.set_limit(tiers.limit(limiter.key_tier(), progress));
                ConcurrencyKey {
                    limiter,
                    last_seen_s: AtomicU32::new(old.last_seen_s.load(Ordering::Relaxed)),
                }
            },
        );
        // Requests may be queued under the old route's queue until it is handed over,
        // key by key, and after it, a request that read the old queue: any key of a
        // table with one may hold some.
        self.carried_waiters = from.tiers.shape > 0 || from.carried_waiters;
    }

    /// [`ConcurrencyKey::wake_queued`] on every key, the shared ones too; nothing
    /// without a queue, where no request waits (but those a reload carried in).
    fn wake_queued(&self, r: &Route) {
        if self.tiers.shape == 0 && !self.carried_waiters {
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

/// Of keys in no tier last seen in the seconds `seen`, the `max` seen last: the second
/// the earliest of them was seen, and how many of the keys seen in it they count
/// (`None`: every key fits).
fn last_kept(mut seen: Vec<u32>, max: usize) -> Option<(u32, usize)> {
    let first = seen.len().checked_sub(max).filter(|&n| n > 0)?;
    if max == 0 {
        return Some((u32::MAX, 0));
    }
    let (_, &mut second, later) = seen.select_nth_unstable(first);
    let after = later.iter().filter(|&&s| s > second).count();
    Some((second, max - after))
}

/// The hash the requests without a key are counted by among the keys refused, as
/// one key: the least rank in the first register (one key alone reads as one).
const ANONYMOUS: u64 = u64::MAX >> 6;

/// The least time between two sweeps of a full key table, which evict every key at
/// rest (see [`KeyTable::sweep`]); a table of over 100,000 keys waits a microsecond
/// per key, as a sweep visits every key.
const FULL_SWEEP_EVERY: Duration = Duration::from_millis(100);

/// Keys a shard of a key table holds at most, about, when the table is full: a table
/// of more than this many keys for each of DashMap's default shards ((4 × cores)
/// rounded up to a power of two) takes more of them, so that a sweep, which holds one shard
/// at a time (for about 20 ns a key), holds none for much longer than 0.1 ms, nor
/// does a shard growing its hash table. 128 bytes a shard, from the table's first key.
const SHARD_KEYS: usize = 4096;

/// The most shards a key table takes (128 KiB of them): a table of more than
/// `SHARD_KEYS` × this many keys has more in each.
const MOST_SHARDS: usize = 1024;

/// The shards of a key table of `max_keys` keys: DashMap's default, or as many as
/// keep at most [`SHARD_KEYS`] in each (a power of two, at most [`MOST_SHARDS`]).
fn shards_for(max_keys: usize) -> usize {
    default_shards().max(
        max_keys
            .div_ceil(SHARD_KEYS)
            .min(MOST_SHARDS)
            .next_power_of_two(),
    )
}

/// DashMap's default shards: (4 × cores) rounded up to a power of two.
fn default_shards() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        (std::thread::available_parallelism().map_or(1, usize::from) * 4).next_power_of_two()
    })
}

/// A key table's map, and the keys it refused since the hints history last took
/// them (by their hash with the map's own, randomly keyed, hasher): 64 bytes beside
/// the map's shards, made with them, and 8 in the route.
pub(super) struct KeyMap<K, E> {
    keys: DashMap<K, E>,
    refused: Box<AtomicKeySketch>,
}

impl<K: Hash + Eq, E> KeyMap<K, E> {
    /// A map of up to `max_keys` keys (the shards it takes: [`shards_for`]).
    fn new(max_keys: usize) -> Self {
        KeyMap::with_hasher(RandomState::new(), max_keys)
    }

    /// A map whose keys, refused ones included, are hashed by `hasher`.
    fn with_hasher(hasher: RandomState, max_keys: usize) -> Self {
        KeyMap {
            keys: DashMap::with_hasher_and_shard_amount(hasher, shards_for(max_keys)),
            refused: Box::new(AtomicKeySketch::new()),
        }
    }
}

impl<K, E> std::ops::Deref for KeyMap<K, E> {
    type Target = DashMap<K, E>;

    fn deref(&self) -> &DashMap<K, E> {
        &self.keys
    }
}

pub(super) struct KeyTable<K, E> {
    /// Made at the first key: DashMap allocates its shards up front ((4 × cores)
    /// rounded up to a power of two, or more for a large table: [`shards_for`], 128
    /// bytes each), which a route whose keys never come, or a shadow table outside
    /// cuts, need not pay.
    map: OnceLock<KeyMap<K, E>>,
    len: AtomicUsize,
    /// Requests of new keys decided by [`KeyTable::overflow`] (the table full), modulo
    /// 2^32: 32 bits keep a route within its memory budget (keys evicted are counted
    /// in the route's lane counters, [`super::KEYS_EVICTED`]).
    overflow_decisions: AtomicU32,
    limits: KeyLimits,
    tiers: TierTable,
    /// Shared by new keys while the table is full.
    overflow: E,
    /// Shared by requests that carry no key.
    anonymous: E,
    /// A reload handed this table the keys of a route that had a queue (requests may
    /// be queued on them), where this one has none ([`KeyTable::take_over`]): a limit
    /// raised must still wake them ([`KeyTable::wake_queued`]).
    carried_waiters: bool,
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
            changed_at: AtomicU64::new(now.as_u64()),
        };
        KeyTable {
            map: OnceLock::new(),
            len: AtomicUsize::new(0),
            overflow_decisions: AtomicU32::new(0),
            limits,
            overflow: E::new(&tiers, 0, 1.0, 0, now),
            anonymous: E::new(&tiers, 0, 1.0, 0, now),
            tiers,
            carried_waiters: false,
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
        let map = self.map.get_or_init(|| KeyMap::new(self.limits.max_keys));
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
        self.overflow_decisions.fetch_add(1, Ordering::Relaxed);
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

    /// [`KeyState::wait`] of the state a request with `key` was decided on: the key's
    /// own, or the shared overflow's for a key the table holds no state of.
    fn wait<Q>(&self, key: &Q, now: Nanos) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.map.get().and_then(|map| map.get(key)) {
            Some(entry) => entry.wait(&self.tiers, now),
            None => self.overflow.wait(&self.tiers, now),
        }
    }

    /// Counts `key` among the keys refused. Hashed once more (the map's hash of it is
    /// not kept), with the map's hasher: random per table, so no client can choose
    /// keys that read as many.
    fn note_refused<Q>(&self, key: &Q)
    where
        Q: Hash + ?Sized,
    {
        // Made already (by the key's first request), but where `max_keys` is 0.
        let map = self.map.get_or_init(|| KeyMap::new(self.limits.max_keys));
        map.refused.record(map.hasher().hash_one(key));
    }

    /// Counts the requests without a key, which share one limiter, as one key
    /// refused (making the table, if no key has yet).
    fn note_anonymous_refused(&self) {
        self.map
            .get_or_init(|| KeyMap::new(self.limits.max_keys))
            .refused
            .record(ANONYMOUS);
    }

    /// [`Keys::refused_by_hash`] of this table.
    fn refused_by_hash(&self) -> Option<(RandomState, KeySketch)> {
        let map = self.map.get()?;
        Some((map.hasher().clone(), map.refused.read()))
    }

    /// [`Keys::carry_refused`] into this table.
    fn carry_refused(&self, hasher: RandomState, refused: &KeySketch) {
        let map = self
            .map
            .get_or_init(|| KeyMap::with_hasher(hasher, self.limits.max_keys));
        map.refused.merge(refused);
    }

    /// The keys refused since last taken; `take`: emptied as read.
    fn refused(&self, take: bool) -> KeySketch {
        match self.map.get() {
            Some(map) if take => map.refused.take(),
            Some(map) => map.refused.read(),
            None => KeySketch::new(),
        }
    }

    /// Takes in the keys of `from`, the table of a route that a reload rebuilds into
    /// this one's (same keys, algorithm shape and tiers), each made this table's by
    /// `carried` (given this table's tiers, where its keys stand between their cut and
    /// base limits with the route's controller at `route_progress`, and the date of
    /// its limits, the reload's `now`), and its shared overflow and keyless states
    /// likewise. Unless `all`, where
    /// `from` holds more keys in no tier than this table's `max_keys`, those seen last
    /// are kept, up to it (by the second they were last seen, a tie broken by the map's
    /// order), and the others dropped: come back, each is a new key (or the overflow
    /// limiter's, the table full). A key of a tier is kept, as it takes a place beyond
    /// `max_keys` anyway.
    ///
    /// `cut_keys`: a table of the same keys whose state stands in for `from`'s where it
    /// holds the key and last saw it in the given second or later (a `shadow_adaptive`
    /// route's shadow table, which followed the cut since it began then, for a route
    /// that enforces it: see [`Keys::take_over`]); which keys are carried is still
    /// `from`'s.
    ///
    /// `from`'s route decides on until the new engine is put in force: a key first
    /// seen there after it is read is not carried, and a request decided there after
    /// its key is read is not counted here.
    fn carry(
        &mut self,
        from: &Self,
        cut_keys: Option<(&Self, u32)>,
        all: bool,
        route_progress: f64,
        carried: impl Fn(&E, &TierTable, f64, Nanos) -> E,
    ) where
        K: Clone,
    {
        let at = Nanos::new(self.tiers.changed_at.load(Ordering::Relaxed));
        let progress = self.tiers.keys_progress(route_progress);
        self.overflow = carried(&from.overflow, &self.tiers, progress, at);
        self.anonymous = carried(&from.anonymous, &self.tiers, progress, at);
        let Some(old) = from.map.get() else {
            return;
        };
        let max = self.limits.max_keys;
        // The second the last key in no tier kept was seen, and how many of those seen
        // then are kept (`None`: every key is).
        let mut cut = if all {
            None
        } else {
            let seen = old.iter().filter(|e| e.tier() == 0).map(|e| e.seen_s());
            last_kept(seen.collect(), max)
        };
        let mut untiered = 0;
        let map = self.map.get_or_init(|| KeyMap::new(self.limits.max_keys));
        for entry in old.iter() {
            let key = entry.value();
            if let Some((second, at_second)) = &mut cut {
                if key.tier() == 0 {
                    let seen = key.seen_s();
                    // A key seen on the old engine since it was counted may make more.
                    if untiered == max || seen < *second || (seen == *second && *at_second == 0) {
                        continue;
                    }
                    if seen == *second {
                        *at_second -= 1;
                    }
                    untiered += 1;
                }
            }
            let followed = cut_keys
                .and_then(|(c, since)| {
                    c.map
                        .get()?
                        .get(entry.key())
                        .filter(|c| c.seen_s() >= since)
                })
                .map(|c| carried(c.value(), &self.tiers, progress, at));
            let state = followed.unwrap_or_else(|| carried(key, &self.tiers, progress, at));
            map.insert(entry.key().clone(), state);
            self.len.fetch_add(1, Ordering::Relaxed);
        }
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
    /// microsecond per key of `max_keys`, whichever is longer, but no less often than
    /// the idle sweep (a sweep of 10,000 keys takes about 0.1 ms, of 1,000,000 about
    /// 20 ms: 2% of a core at most, or more with an `idle_timeout` under 200 ms).
    ///
    /// Run after each rollover of the route's window (a request's, or one that
    /// brings the route up to date), once the route's state is let go (the next
    /// slot's rollover does not wait for it), or, on an engine that sweeps apart from
    /// requests, by [`super::Engine::sweep_due`]; by one thread at a time
    /// ([`super::Route::sweep`]). It holds one shard of the map at a time (a request whose key
    /// is there waits for it): at most about [`SHARD_KEYS`] keys ([`shards_for`]).
    ///
    /// A key at rest (a full bucket, an empty window, no permit held or request
    /// queued) decides its next request as a new key would, so evicting it loses
    /// nothing. Evicting only idle keys let a client that sent one request on each
    /// of `max_keys` invented keys every `idle_timeout` (10,000 per 5 minutes, 33
    /// req/s) keep the table full, and every new client in the one overflow limiter
    /// that it drained too. It must now hold `max_keys` keys off rest at once, again
    /// after each sweep.
    ///
    /// `last`: when the table was last swept (ns on the engine's clock), read and
    /// written by the sweeping thread only. It is moved to `now` before the first key
    /// is visited, so that a sweep that panics (a bug) is tried again on its schedule,
    /// not at every rollover after it.
    fn sweep(&self, r: &Route, last: &AtomicU64, now: Nanos, counted: bool) {
        let full = self.len.load(Ordering::Relaxed) >= self.limits.max_keys;
        let idle_every = self.limits.idle_timeout / 2;
        let every = if full {
            let per_key =
                Duration::from_micros(u64::try_from(self.limits.max_keys).unwrap_or(u64::MAX));
            idle_every.min(FULL_SWEEP_EVERY.max(per_key))
        } else {
            idle_every
        };
        if now.saturating_since(Nanos::new(last.load(Ordering::Relaxed))) < every {
            return;
        }
        last.store(now.as_u64(), Ordering::Relaxed);
        let Some(map) = self.map.get() else {
            return;
        };
        let cutoff = if full {
            u32::MAX
        } else {
            secs(now - self.limits.idle_timeout)
        };
        map.retain(|_, e| {
            let keep = !e.evictable(r, &self.tiers, cutoff, now);
            if !keep {
                #[cfg(test)]
                on_evict();
                self.len.fetch_sub(1, Ordering::Relaxed);
                if counted {
                    r.counter.counters().add(super::KEYS_EVICTED);
                }
            }
            keep
        });
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: called on a sweeping thread at each key the sweep evicts, the key's shard
    /// held; not while it runs (a sweep it starts calls nothing).
    pub(super) static ON_EVICT: std::cell::RefCell<Option<Box<dyn FnMut()>>> =
        const { std::cell::RefCell::new(None) };
}

/// Calls [`ON_EVICT`]'s hook, if a test set one on this thread.
#[cfg(test)]
fn on_evict() {
    if let Some(mut hook) = ON_EVICT.take() {
        hook();
        ON_EVICT.set(Some(hook));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Key;

    /// A sweep holds one shard of a key table at a time, and a large table's shards
    /// hold about [`SHARD_KEYS`] keys each: while the sweep of a table of up to
    /// 1,048,576 keys (16,384 of them in it, all idle) evicts its first key, at most
    /// 1/64 of the keys are locked (1/256 expected, less on over 64 cores). The
    /// table took DashMap's default shards, (4 × cores) rounded up to a power of
    /// two, whatever its size: 8 on 2 cores, an eighth of the table (of 1,000,000
    /// keys, 2.5 ms of the sweep's 20) held at once.
    #[test]
    fn a_sweep_of_a_large_table_holds_a_small_part_of_it_at_once() {
        use crate::config::{Config, KeyLimits, RouteMatch};
        use crate::engine::Engine;
        use dashmap::try_result::TryResult;
        use std::net::{IpAddr, Ipv4Addr};
        use std::sync::{Arc, Mutex};
        use std::time::SystemTime;
        const KEYS: u32 = 16_384;
        let mut cfg = RouteConfig::new("large", RouteMatch::any());
        cfg.partition = Partition::ClientIp(KeyLimits {
            max_keys: 1 << 20,
            idle_timeout: Duration::from_secs(10),
            ..KeyLimits::default()
        });
        let config = Config::new(vec![cfg]);
        let e = Arc::new(Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap());
        let id = e.route_at(0).unwrap();
        let addr = |n: u32| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n));
        for n in 0..KEYS {
            assert!(e.check(id, Key::Ip(addr(n)), Nanos::ZERO).is_admit());
        }
        let locked = Arc::new(Mutex::new(None));
        {
            let (e, locked) = (Arc::clone(&e), Arc::clone(&locked));
            ON_EVICT.set(Some(Box::new(move || {
                let mut locked = locked.lock().unwrap();
                if locked.is_some() {
                    return;
                }
                let Some(Keys::Bucket(KeyTables::Ip(t))) = e.route(id).unwrap().keys() else {
                    panic!("a token bucket keyed by IP");
                };
                let map = t.map.get().expect("the table has keys");
                let held = (0..KEYS)
                    .filter(|&n| {
                        let key = IpKey::new(addr(n), t.limits.ipv6_prefix);
                        matches!(map.try_get(&key), TryResult::Locked)
                    })
                    .count();
                *locked = Some(held);
            })));
        }
        assert!(e.check(id, Key::None, Nanos::from_secs(11)).is_admit());
        ON_EVICT.set(None);
        let held = locked.lock().unwrap().expect("the sweep evicted a key");
        assert!(held > 0, "the key evicted is in a shard held");
        assert!(
            held <= KEYS as usize / 64,
            "{held} of {KEYS} keys held at once"
        );
        assert_eq!(e.route_snapshot(id, Nanos::from_secs(11)).unwrap().keys, 0);
    }

    /// A key table takes DashMap's default shards up to [`SHARD_KEYS`] keys for each,
    /// and past that as many, in a power of two, as keep at most [`SHARD_KEYS`] keys
    /// in each, up to [`MOST_SHARDS`]. It took the power of two at or under
    /// `max_keys` ÷ [`SHARD_KEYS`]: a table a key over the default's reach kept the
    /// default, whose shards held up to twice [`SHARD_KEYS`] keys less one shard's.
    #[test]
    fn a_large_table_takes_a_shard_per_4096_keys() {
        let default = default_shards();
        assert_eq!(shards_for(0), default);
        assert_eq!(shards_for(default * SHARD_KEYS), default);
        assert_eq!(shards_for(default * SHARD_KEYS + 1), 2 * default);
        for max_keys in [default * SHARD_KEYS + 1, 36_863, 1_000_000, 1 << 22] {
            let shards = shards_for(max_keys);
            assert!(shards.is_power_of_two(), "{shards} shards");
            assert!(
                shards * SHARD_KEYS >= max_keys,
                "{max_keys} keys in {shards} shards"
            );
            assert!(
                shards == default || shards / 2 * SHARD_KEYS < max_keys,
                "{max_keys} keys in {shards} shards: half of them would do"
            );
        }
        assert_eq!(shards_for(1_000_000), default.max(256));
        assert_eq!(shards_for(usize::MAX), default.max(MOST_SHARDS));
    }

    /// Of keys seen in the seconds given, the `max` seen last are those after the
    /// second returned and as many as it says of those seen in it: ties at the cut
    /// are kept up to `max`, and a table of no places keeps none.
    #[test]
    fn the_keys_kept_at_a_smaller_max_keys_are_those_seen_last() {
        assert_eq!(last_kept(vec![3, 1, 2], 3), None);
        assert_eq!(last_kept(vec![3, 1, 2], 5), None);
        assert_eq!(last_kept(vec![3, 1, 2, 4], 2), Some((3, 1)));
        assert_eq!(last_kept(vec![2, 2, 1, 2, 5], 3), Some((2, 2)));
        assert_eq!(last_kept(vec![7, 7, 7], 1), Some((7, 1)));
        assert_eq!(last_kept(vec![1, 2], 0), Some((u32::MAX, 0)));
        assert_eq!(last_kept(vec![], 0), None);
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
}
