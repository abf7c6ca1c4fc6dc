//! Enforcement: the absolute limiters that hold a route (or one key) to its current limit.
//!
//! The controller decides the limit; a limiter enforces it. Five algorithms, one
//! [`Limiter`] enum (static dispatch, no allocation per check):
//!
//! | algorithm | state | limit means | rejects with |
//! |---|---|---|---|
//! | [`TokenBucket`] (GCRA, default) | one atomic word decided on (the TAT), beside its rate and capacity | refill, req/s; capacity `limit × burst` | `limit` |
//! | [`FixedWindow`] | one atomic word | req/s, counted per window | `limit` |
//! | [`SlidingWindowCounter`] | one atomic word | req/s, previous window weighted | `limit` |
//! | [`LeakyBucket`] | one atomic word | paced output, req/s; bounded queue | `queue_full` |
//! | [`Concurrency`] | in-flight count | requests in flight; optional bounded queue | `concurrency`, `queue_full` |
//!
//! Every check takes `now` and returns a [`Decision`]: admit, or reject with the exact
//! time after which the same request would be admitted (`retry_after`) and a
//! [`Reason`]. [`Limiter::set_limit`] changes rate and capacity of the *existing*
//! state: tokens are kept (clamped to the new capacity), never refilled by the change.
//!
//! A request that races with a limit change (a rare event: at most once per
//! controller step) is charged at either the old or the new rate. A token bucket's
//! rate, capacity and tokens are three words: a change marks the tokens' word and
//! leaves the old rate and capacity in a note while it rewrites them, and a decision
//! that finds the mark reads the note, so no decision mixes one change's rate with
//! another capacity, or new parameters with tokens not yet rescaled (a loom model of
//! a change racing a decision on an empty bucket, lowering and raising, admitted
//! before the mark), and none waits for a change to end: decisions are lock-free
//! (the docs of the private `gcra` module say how). [`TokenBucket::set_limit`] waits
//! while a change of a bucket that shares its note is under way; the engine's changes,
//! made on requests' paths, never wait: one that finds its note taken is made later,
//! by the next request.
//!
//! ```
//! use rocgate::clock::Nanos;
//! use rocgate::limiter::{Decision, Reason, TokenBucket};
//! use std::time::Duration;
//!
//! // 10 req/s, burst of 2 tokens.
//! let bucket = TokenBucket::new(10.0, Duration::from_millis(200), Nanos::ZERO);
//! assert!(bucket.check(Nanos::ZERO).is_admit());
//! assert!(bucket.check(Nanos::ZERO).is_admit());
//! let Decision::Reject(r) = bucket.check(Nanos::ZERO) else { unreachable!() };
//! assert_eq!(r.reason, Reason::Limit);
//! assert_eq!(r.retry_after, Duration::from_millis(100));
//! assert!(bucket.check(Nanos::from_millis(100)).is_admit());
//! ```

use crate::clock::{duration_nanos, Nanos};
use crate::sync::{Arc, AtomicU32, AtomicU64, Ordering};
use event_listener::{Event, EventListener, IntoNotification};
use std::fmt;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

/// Why a request was rejected. One vocabulary for metric labels, headers, bodies and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Reason {
    /// The absolute limit (the base limit, or a tier's) is exhausted.
    Limit,
    /// The limit is exhausted while the ROC controller holds it below base.
    RocCut,
    /// Too many requests in flight.
    Concurrency,
    /// The pacing or waiting queue is full.
    QueueFull,
    /// Rejected by the local fallback limiter while the shared store is unreachable.
    FallbackLocal,
}

impl Reason {
    /// Every reason, in a fixed order (for counters indexed by reason).
    pub const ALL: [Reason; 5] = [
        Reason::Limit,
        Reason::RocCut,
        Reason::Concurrency,
        Reason::QueueFull,
        Reason::FallbackLocal,
    ];

    /// The reason's name: `limit`, `roc_cut`, `concurrency`, `queue_full`, `fallback_local`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::RocCut => "roc_cut",
            Reason::Concurrency => "concurrency",
            Reason::QueueFull => "queue_full",
            Reason::FallbackLocal => "fallback_local",
        }
    }

    /// Position in [`Reason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refused request: when to come back, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejection {
    /// The same request sent `retry_after` from now would be admitted, if nothing else
    /// arrives meanwhile and the limit does not change.
    pub retry_after: Duration,
    /// Why it was refused.
    pub reason: Reason,
}

/// How an admitted request proceeds.
#[derive(Debug)]
#[repr(u8)] // An explicit tag: dropping a Decision is a compare, with no niche to decode.
#[non_exhaustive]
pub enum Admit {
    /// Go ahead now.
    Now,
    /// Go ahead at the departure time the leaky bucket gave it ([`Pace::wait`]); a
    /// request that leaves before then may give its place back ([`Pace`]).
    Paced(Pace),
    /// Go ahead now, holding this permit until the response is done (concurrency).
    Held(Permit),
    /// Wait for a permit: await the ticket (concurrency with a queue).
    Queued(Ticket),
}

/// A leaky bucket's paced admission: when the request departs, and what scheduling
/// it wrote, so that a request dropped before its departure (its client left) can
/// give its place back ([`LeakyBucket::give_back`],
/// [`Engine::give_back`](crate::engine::Engine::give_back)).
///
/// A place is given back only while it is still the last one scheduled: the bucket's
/// word then goes back from this request's departure plus the interval to its
/// departure, and the next request takes that departure time. A place with requests
/// scheduled behind it stays taken (they keep their departure times, one interval
/// apart), and so do the places before it: the word holds one time, not a list.
/// So the bucket never passes more than one request per interval, nor holds more
/// than `queue` waiting. Giving a place back takes the `Pace`, so no place is given
/// back twice (a second give-back could take the place of the request that took it).
#[derive(Debug, PartialEq, Eq)]
pub struct Pace {
    departure: Nanos,
    /// The bucket's word as this request's scheduling left it (its departure plus the
    /// interval, saturating).
    next: u64,
    /// Scheduled on a partitioned route's shared overflow state (its key found no
    /// place in a full key table), not on its key's own.
    pub(crate) overflow: bool,
}

impl Pace {
    /// When the request may go.
    pub fn departure(&self) -> Nanos {
        self.departure
    }

    /// How long a request decided at `now` waits for its departure.
    pub fn wait(&self, now: Nanos) -> Duration {
        Duration::from_nanos(self.departure.as_u64().saturating_sub(now.as_u64()))
    }
}

/// The outcome of a check: admitted or refused, and nothing else, so it stays
/// exhaustive (a match on it needs no catch-all arm, and a third outcome would have to
/// break every match rather than fall into one). What an admission carries
/// ([`Admit`]) may grow.
#[derive(Debug)]
#[must_use]
pub enum Decision {
    /// Let the request through.
    Admit(Admit),
    /// Refuse it.
    Reject(Rejection),
}

impl Decision {
    /// Whether the request is admitted (now, paced, held or queued).
    pub fn is_admit(&self) -> bool {
        matches!(self, Decision::Admit(_))
    }

    /// The rejection, if any.
    pub fn rejection(&self) -> Option<Rejection> {
        match self {
            Decision::Reject(r) => Some(*r),
            Decision::Admit(_) => None,
        }
    }
}

/// Which algorithm enforces a limit, with its own settings.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Algorithm {
    /// GCRA token bucket; capacity is `limit × burst` (at least one token).
    TokenBucket {
        /// Seconds of the limit the bucket holds.
        burst: Duration,
    },
    /// Counts per fixed window of this length; `limit × window` per window.
    FixedWindow {
        /// Window length.
        window: Duration,
    },
    /// Current window plus the previous one weighted by its remaining overlap.
    SlidingWindow {
        /// Window length.
        window: Duration,
    },
    /// Paces output at the limit; holds at most `queue` requests waiting.
    LeakyBucket {
        /// Requests that may wait.
        queue: u32,
    },
    /// At most `limit` requests in flight; up to `queue` more may wait.
    Concurrency {
        /// Requests that may wait for a permit (0: reject at once).
        queue: u32,
    },
}

impl Algorithm {
    /// The algorithm's name as written in config.
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket { .. } => "token_bucket",
            Algorithm::FixedWindow { .. } => "fixed_window",
            Algorithm::SlidingWindow { .. } => "sliding_window",
            Algorithm::LeakyBucket { .. } => "leaky_bucket",
            Algorithm::Concurrency { .. } => "concurrency",
        }
    }
}

impl Default for Algorithm {
    /// A token bucket holding one second of the limit.
    fn default() -> Self {
        Algorithm::TokenBucket {
            burst: Duration::from_secs(1),
        }
    }
}

/// How full a limiter is, for snapshots and gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Level {
    /// Tokens left, requests counted in the window, requests queued, or in flight.
    pub value: f64,
    /// The most `value` can be.
    pub capacity: f64,
}

impl Level {
    /// Whether there is no room for one more request: no token left in a token
    /// bucket (whose level counts what is left), or a full window, queue or set of
    /// permits (whose levels count what is used).
    pub fn exhausted(&self, algorithm: &Algorithm) -> bool {
        match algorithm {
            Algorithm::TokenBucket { .. } => self.value < 1.0,
            _ => self.capacity - self.value < 1.0,
        }
    }
}

/// Any of the five limiters.
#[derive(Debug)]
#[non_exhaustive]
pub enum Limiter {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
    /// See [`SlidingWindowCounter`].
    SlidingWindow(SlidingWindowCounter),
    /// See [`LeakyBucket`].
    LeakyBucket(LeakyBucket),
    /// See [`Concurrency`].
    Concurrency(Concurrency),
}

impl Limiter {
    /// A limiter of this algorithm at `limit`, full (or empty, for counters) at `now`.
    pub fn new(algorithm: Algorithm, limit: f64, now: Nanos) -> Self {
        match algorithm {
            Algorithm::TokenBucket { burst } => {
                Limiter::TokenBucket(TokenBucket::new(limit, burst, now))
            }
            Algorithm::FixedWindow { window } => {
                Limiter::FixedWindow(FixedWindow::new(limit, window))
            }
            Algorithm::SlidingWindow { window } => {
                Limiter::SlidingWindow(SlidingWindowCounter::new(limit, window))
            }
            Algorithm::LeakyBucket { queue } => {
                Limiter::LeakyBucket(LeakyBucket::new(limit, queue))
            }
            Algorithm::Concurrency { queue } => {
                Limiter::Concurrency(Concurrency::new(limit, queue))
            }
        }
    }

    /// Decides one request at `now`.
    #[inline]
    pub fn check(&self, now: Nanos) -> Decision {
        // The default algorithm is inlined into the caller; the others stay behind a
        // call, so that the common hot path stays small enough to inline.
        match self {
            Limiter::TokenBucket(l) => l.check(now),
            other => other.check_other(now),
        }
    }

    #[inline(never)]
    fn check_other(&self, now: Nanos) -> Decision {
        match self {
            Limiter::TokenBucket(l) => l.check(now),
            Limiter::FixedWindow(l) => l.check(now),
            Limiter::SlidingWindow(l) => l.check(now),
            Limiter::LeakyBucket(l) => l.check(now),
            Limiter::Concurrency(l) => l.check(),
        }
    }

    /// Changes the limit of the existing state at `now` (a token bucket's change may
    /// wait for another's: see [`TokenBucket::set_limit`]).
    pub fn set_limit(&self, limit: f64, now: Nanos) {
        match self {
            Limiter::TokenBucket(l) => l.set_limit(limit, now),
            Limiter::FixedWindow(l) => l.set_limit(limit),
            Limiter::SlidingWindow(l) => l.set_limit(limit),
            Limiter::LeakyBucket(l) => l.set_limit(limit),
            Limiter::Concurrency(l) => l.set_limit(limit),
        }
    }

    /// [`set_limit`](Self::set_limit) without waiting: `false` when a token bucket's
    /// change could not take its note and changed nothing (the other algorithms
    /// change at once).
    pub(crate) fn try_set_limit(&self, limit: f64, now: Nanos) -> bool {
        match self {
            Limiter::TokenBucket(l) => l.try_set_limit(limit, now),
            other => {
                other.set_limit(limit, now);
                true
            }
        }
    }

    /// Gives back the place of a paced request (a leaky bucket's) that leaves at
    /// `now`, before its departure, if it is still the last one scheduled; any other
    /// algorithm has none to give back. Whether it did (see [`Pace`]).
    pub fn give_back(&self, pace: Pace, now: Nanos) -> bool {
        match self {
            Limiter::LeakyBucket(l) => l.give_back(pace, now),
            _ => false,
        }
    }

    /// How full the limiter is at `now`.
    pub fn level(&self, now: Nanos) -> Level {
        match self {
            Limiter::TokenBucket(l) => l.level(now),
            Limiter::FixedWindow(l) => l.level(now),
            Limiter::SlidingWindow(l) => l.level(now),
            Limiter::LeakyBucket(l) => l.level(now),
            Limiter::Concurrency(l) => l.level(),
        }
    }
}

/// The highest limit, in req/s, that a [`TokenBucket`] or a [`LeakyBucket`] enforces
/// within 0.1% of what is written. Both space requests a whole number of
/// nanoseconds apart (the emission interval, rounded), which is up to half a
/// nanosecond off the written rate: 0.1% at 500 ns (2,000,000 req/s), and more above
/// it (700,000,000 req/s, 1.43 ns, is spaced 1 ns apart and enforced as
/// 1,000,000,000). The configuration refuses a higher limit for these algorithms; the
/// window counters and `concurrency` count whole requests, and have bounds of their
/// own ([`MAX_WINDOW_COUNT`], [`MAX_PERMITS`]).
pub const MAX_SPACED_RATE: f64 = 2_000_000.0;

/// The most requests in flight a [`Concurrency`] limiter counts: its permits are
/// kept in 32 bits. The configuration refuses a higher limit for `concurrency`.
pub const MAX_PERMITS: u32 = u32::MAX;

/// Nanoseconds between two units at `per_sec` units per second (at least 1 ns).
pub(crate) fn interval_ns(per_sec: f64) -> u64 {
    if per_sec <= 0.0 || !per_sec.is_finite() {
        return u64::MAX / 4;
    }
    ((1e9 / per_sec).round() as u64).clamp(1, u64::MAX / 4)
}

#[inline]
pub(crate) fn reject(retry_after_ns: u64, reason: Reason) -> Decision {
    Decision::Reject(Rejection {
        retry_after: Duration::from_nanos(retry_after_ns.max(1)),
        reason,
    })
}

/// A token bucket as GCRA: a decision reads and moves one atomic word, the theoretical
/// arrival time (TAT) of the next request, beside the rate and capacity words that a
/// limit change rewrites (see the `gcra` module). Refills at `limit` per second; holds
/// `limit × burst` tokens (at least one). `burst` is kept to the millisecond.
#[derive(Debug)]
pub struct TokenBucket {
    tat: AtomicU64,
    /// Emission interval T: nanoseconds per token.
    emission_ns: AtomicU64,
    /// Tokens the bucket holds; the tolerance τ is `capacity × T`.
    capacity: AtomicU32,
    /// Seconds of the limit the bucket holds, in milliseconds (32-bit fields keep a
    /// [`Limiter`] at 32 bytes, which matters per key).
    burst_ms: u32,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(limit: f64, burst: Duration, now: Nanos) -> Self {
        let burst_ms = gcra::burst_ms(burst);
        let (t, capacity) = gcra::params(limit, burst_ms);
        TokenBucket {
            tat: AtomicU64::new(gcra::full_at(now)),
            emission_ns: AtomicU64::new(t),
            capacity: AtomicU32::new(capacity),
            burst_ms,
        }
    }

    /// Takes one token at `now`, or says when one will be there.
    #[inline]
    pub fn check(&self, now: Nanos) -> Decision {
        match self.take(now) {
            Ok(()) => Decision::Admit(Admit::Now),
            Err(retry_after_ns) => reject(retry_after_ns, Reason::Limit),
        }
    }

    /// [`check`](Self::check) in two registers: `Ok` when a token was taken, else the
    /// nanoseconds until one will be there. Callers on the hot path branch on this
    /// before building a [`Decision`].
    #[inline]
    pub fn take(&self, now: Nanos) -> Result<(), u64> {
        self.words().take(now)
    }

    /// Changes rate and capacity, keeping the tokens there are (clamped to the new
    /// capacity). Waits while a change of another bucket holds the note this one's
    /// change needs (a few stores, unless that change's thread is descheduled; see
    /// the `gcra` module): a change is never lost. Decisions never wait.
    pub fn set_limit(&self, limit: f64, now: Nanos) {
        self.words().set(gcra::params(limit, self.burst_ms), now);
    }

    /// [`set_limit`](Self::set_limit) without the wait: changes nothing, and says so
    /// with `false`, while another change holds the note. The engine's route buckets
    /// change this way on requests' paths and apply a refused change later.
    pub(crate) fn try_set_limit(&self, limit: f64, now: Nanos) -> bool {
        self.words()
            .try_set(gcra::params(limit, self.burst_ms), now)
    }

    /// [`set_limit`](Self::set_limit), calling `midway` half-way through the change
    /// (the tokens' word marked, the new rate not yet written). Only in the
    /// model-checking build, whose models hold a change there (`tests/loom.rs`).
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn set_limit_midway(&self, limit: f64, now: Nanos, midway: impl FnOnce()) {
        self.words()
            .set_midway(gcra::params(limit, self.burst_ms), now, midway);
    }

    /// Leaves at most `tokens` tokens in the bucket at `now` (none if `tokens` is not
    /// positive): a bucket that holds more loses the difference, one that holds fewer
    /// keeps what it has. Never refuses, never refills, and never leaves fewer tokens
    /// than none, which is what an admission of the last token leaves; the next
    /// [`check`](Self::check) sees the lowered level, and the bucket refills from it at
    /// the limit.
    ///
    /// ```
    /// use rocgate::clock::Nanos;
    /// use rocgate::limiter::TokenBucket;
    /// use std::time::Duration;
    ///
    /// // 10 req/s, 10 tokens: lowered to 2, it admits 2 now.
    /// let bucket = TokenBucket::new(10.0, Duration::from_secs(1), Nanos::ZERO);
    /// bucket.lower_to(2.0, Nanos::ZERO);
    /// assert!(bucket.check(Nanos::ZERO).is_admit());
    /// assert!(bucket.check(Nanos::ZERO).is_admit());
    /// assert!(!bucket.check(Nanos::ZERO).is_admit());
    /// ```
    #[inline]
    pub fn lower_to(&self, tokens: f64, now: Nanos) {
        self.words().lower_to(tokens, now);
    }

    /// Tokens left at `now` and the capacity.
    pub fn level(&self, now: Nanos) -> Level {
        self.words().level(now)
    }

    fn words(&self) -> gcra::Words<'_> {
        gcra::Words {
            tat: &self.tat,
            emission_ns: &self.emission_ns,
            capacity: &self.capacity,
        }
    }
}

/// GCRA on one TAT word, with the emission interval `t` and the capacity beside it:
/// the arithmetic of [`TokenBucket`], shared with the engine's per-key buckets, which
/// keep the same words beside their own bookkeeping.
///
/// # Limit changes that no decision waits for
///
/// A bucket's rate, capacity and tokens are three words, and a change
/// ([`Words::set`]) rewrites all three. A decision must never mix one change's rate
/// with another capacity, nor new parameters with tokens not yet rescaled (an empty
/// bucket lowered from 4/s to 1/s, one second's burst, would admit); nor may it wait
/// for a change, or a change preempted half-way would stall every decision on its
/// bucket until the change ran again.
///
/// The TAT word holds, above the TAT itself (59 bits), a 4-bit count of the changes
/// the bucket has been through and a `CHANGING` mark. A change:
/// 1. takes the `Note` its bucket's address hashes to (changes of one bucket take
///    turns, and so do changes of buckets that share a note; decisions never take
///    it; a change on a request's path that finds it taken gives up, see below), and
///    writes into it the rate and capacity it is about to replace;
/// 2. marks the TAT word `CHANGING`, leaving the TAT as it is;
/// 3. writes the new rate, then the new capacity;
/// 4. swaps the marked word for the TAT rescaled to the new parameters, unmarked, with
///    the count one higher (a compare-exchange loop: decisions may take tokens
///    meanwhile);
/// 5. gives the note back.
///
/// # No request waits for a note
///
/// [`Words::set`] ([`TokenBucket::set_limit`]) waits
/// for the note while another change holds it: a few stores and an exchange, unless
/// the OS deschedules the holding thread meanwhile, and then until it runs again.
/// Changes made on requests' paths never wait: [`Words::try_set`] takes the note
/// with one compare-exchange and, if another change holds it (of this bucket, or of
/// any bucket of any route that shares the note), changes nothing and says so. The
/// engine then decides the request at the parameters the bucket has, as it decides
/// any request that meets a change, and makes the change later, never dropping it:
/// - a key's bucket (which catches up with its route's limit on the key's next
///   request) records a route generation that is not the route's, so the key's next
///   request tries again (`keep_up` in `engine.rs`);
/// - a route's bucket (changed by the request that wins a slot rollover, or by an
///   update) is marked behind, and the next decision on the route, or the next
///   upkeep, makes the change before it decides, dated where it was pushed.
///
/// A note is held for a few stores and an exchange, so a change finds it taken only
/// while another change is under way; the first decision after that change gives it
/// back (after its thread runs again, if the OS descheduled it) makes the change left
/// behind. Waiting for the note, as those requests did before, made no change sooner:
/// the bucket keeps its old parameters until the change is made either way.
///
/// A decision loads the TAT word first. Unmarked, the rate and capacity words go with
/// the TAT; marked, the note holds the rate and capacity the TAT is still scaled to
/// (a decision during a change is charged at the old rate, as one just before it). It
/// admits only by a compare-exchange expecting the very word it loaded, count and
/// mark included, and rejects, lowers nothing or reports a level only if a second
/// load still finds that word. A parameter it read that was written later than the
/// word it loaded (a new rate or capacity, or a note's values from a later change)
/// was written after that word had moved on: steps 2 and 4 come first in the
/// changing thread, parameters are written with `Release` and read with `Acquire`.
/// So its exchange fails, or its second load differs, and it reads again: a decision
/// retries because a change moved on, never waits for one to.
///
/// The count keeps a word from coming back. Without it, a change that leaves the TAT
/// as it found it (a full bucket stays full; an empty one stays empty at the same τ,
/// as from 4/s to 1/s with one second's burst) would let a decision that read the old
/// rate and the new capacity pass its exchange. With it, the word comes back only
/// after 16 changes of the same bucket, one after another, between two loads of one
/// decision (tens of nanoseconds, unless its thread is descheduled meanwhile), and
/// with the TAT where it was. A bucket changes at most once per controller slot, and
/// per admin update or reload (a key's bucket when a request finds its route's limit
/// changed), so this takes a thread descheduled across 16 limit changes; even then
/// one decision is charged with the parameters it read, and the next reads afresh.
///
/// # Changes dated in the past
///
/// A change is made as of a date: the engine dates a route's change at the slot
/// where its controller made it (so that after a silence the bucket refills at the
/// new limit from then, not only from the request that found it), a key's at its
/// route's change, and a change left behind at the date it was pushed. Decisions
/// made after that date, at the old parameters, are already in the TAT: the requests
/// that raced the rollover, or were decided while the change found its note taken.
/// Read at the date, the TAT may then show fewer tokens than none (it is later than
/// the date plus τ1), and taken as none, the tokens those requests took were handed
/// back: 10/s with 10 tokens, emptied at 0 and then drained at 10/s, cut at 1 s to
/// 1/s dated at 0, admitted a 21st request by 1 s, beyond what either limit allows.
/// So a change counts from its date or from TAT − τ1, whichever is later. Every
/// admission at time `a` leaves the TAT at most `a + τ1` (and a `lower_to` at `now`,
/// at most `now + τ1`), so the latest decision the TAT holds was made at TAT − τ1 or
/// later: counted from there, the tokens are never fewer than none, none are handed
/// back, and the new rate refills from then only. Over any interval a bucket then
/// admits at most the larger capacity plus the larger rate times the interval.
///
/// The TAT counts up to 2^59 ns (18.3 years) and τ is at most 2^57 ns (4.6 years):
/// a bucket holds `now` at 2^59 − 2^57 ns (13.7 years; the clock counts from the
/// process's start), past which it no longer refills.
///
/// [`Words::set`]: gcra::Words::set
/// [`Words::try_set`]: gcra::Words::try_set
pub(crate) mod gcra {
    use super::{interval_ns, Level};
    use crate::clock::Nanos;
    use crate::sync::{spin_wait, AtomicU32, AtomicU64, Ordering};
    use std::time::Duration;

    /// A burst kept to the millisecond in 32 bits (49 days).
    pub(crate) fn burst_ms(burst: Duration) -> u32 {
        u32::try_from(burst.as_millis()).unwrap_or(u32::MAX)
    }

    /// Emission interval and capacity (at least one token) for `limit`. A capacity a
    /// hair below a whole number is that number, as a window's quota is
    /// ([`words::quota`](super::words::quota)): 1,000 per 1.1 s, written as
    /// 909.090909090909 req/s, comes out of the float product as 999.9999999999999
    /// and holds 1,000 tokens. The interval is at most the most τ may be, so that a
    /// full bucket admits one request even at a limit of zero (and then waits 4.6
    /// years).
    pub(crate) fn params(limit: f64, burst_ms: u32) -> (u64, u32) {
        let capacity = tokens(limit, burst_ms).clamp(1.0, f64::from(MAX_TOKENS));
        (interval_ns(limit).min(TAU_MAX), capacity as u32)
    }

    /// The most tokens a bucket holds: its capacity is kept in 32 bits.
    pub(crate) const MAX_TOKENS: u32 = u32::MAX;

    /// The whole tokens `limit` for `burst_ms` makes, before [`params`] bounds them to
    /// between one and [`MAX_TOKENS`] (the configuration refuses more).
    pub(crate) fn tokens(limit: f64, burst_ms: u32) -> f64 {
        (limit * f64::from(burst_ms) / 1e3 + 1e-6).floor()
    }

    /// Bits of a TAT word that hold the TAT.
    const TAT_BITS: u32 = 59;
    /// The TAT in a TAT word.
    const TAT: u64 = (1 << TAT_BITS) - 1;
    /// One change in the count above the TAT.
    const ONE_CHANGE: u64 = 1 << TAT_BITS;
    /// The count of changes in a TAT word (4 bits, wrapping).
    const COUNT: u64 = 0b1111 << TAT_BITS;
    /// The top bit of a TAT word: set while a change rewrites the rate and capacity,
    /// which the bucket's [`Note`] then holds for decisions (see the module docs).
    const CHANGING: u64 = 1 << 63;
    /// The most τ may be (4.6 years).
    const TAU_MAX: u64 = 1 << 57;
    /// The latest `now` a bucket sees: its TAT, at most `now + τ`, fits in [`TAT`].
    const NOW_MAX: u64 = TAT - TAU_MAX;

    /// `now` as a bucket sees it (held at [`NOW_MAX`]).
    #[inline]
    fn clamped(now: Nanos) -> u64 {
        now.as_u64().min(NOW_MAX)
    }

    /// The TAT word of a bucket that is full at `now`.
    pub(crate) fn full_at(now: Nanos) -> u64 {
        clamped(now)
    }

    /// Tolerance τ = capacity × T.
    #[inline]
    fn tolerance(t: u64, capacity: u32) -> u64 {
        t.saturating_mul(u64::from(capacity)).min(TAU_MAX)
    }

    /// Where a change leaves, for the decisions it overlaps, the rate and capacity it
    /// replaces; held by one change at a time (see the module docs).
    struct Note {
        /// 1 while a change holds the note.
        held: AtomicU32,
        /// The capacity the holding change replaces.
        capacity: AtomicU32,
        /// The emission interval the holding change replaces.
        emission_ns: AtomicU64,
    }

    /// Bits of a bucket's address hash that pick its note: 64 notes, 1 KiB in all
    /// (one under loom, so that the models' buckets all share it, whatever their
    /// addresses: the models check a change of one bucket that rewrites the note a
    /// decision on another is reading).
    const NOTE_BITS: u32 = if cfg!(loom) { 0 } else { 6 };

    #[cfg(not(loom))]
    static NOTES: [Note; 1 << NOTE_BITS] = [const {
        Note {
            held: AtomicU32::new(0),
            capacity: AtomicU32::new(0),
            emission_ns: AtomicU64::new(0),
        }
    }; 1 << NOTE_BITS];
    // Loom's atomics have no `const fn new`; its statics start afresh in each execution.
    #[cfg(loom)]
    loom::lazy_static! {
        static ref NOTES: [Note; 1 << NOTE_BITS] = std::array::from_fn(|_| Note {
            held: AtomicU32::new(0),
            capacity: AtomicU32::new(0),
            emission_ns: AtomicU64::new(0),
        });
    }

    #[cfg(test)]
    std::thread_local! {
        /// Set by [`with_the_note_held`]: the note this thread's buckets all take.
        static TEST_NOTE: std::cell::Cell<Option<&'static Note>> =
            const { std::cell::Cell::new(None) };
    }

    /// Unit tests only: runs `during` on this thread while a change of another bucket
    /// is held half-way on a thread of its own, holding a note of the test's own.
    /// Every bucket changed or decided on this thread takes that note from now on,
    /// as every bucket takes the one note under loom, so that `during` meets the held
    /// change whatever bucket it changes (decisions on those buckets must stay on
    /// this thread). The note is no other test's, so tests run at once cannot take it
    /// meanwhile: it is leaked, once per test thread (16 bytes).
    #[cfg(test)]
    pub(crate) fn with_the_note_held(during: impl FnOnce()) {
        let note: &'static Note = TEST_NOTE.get().unwrap_or_else(|| {
            Box::leak(Box::new(Note {
                held: AtomicU32::new(0),
                capacity: AtomicU32::new(0),
                emission_ns: AtomicU64::new(0),
            }))
        });
        TEST_NOTE.set(Some(note));
        let other = super::TokenBucket::new(1.0, Duration::from_secs(1), Nanos::ZERO);
        let (held, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                TEST_NOTE.set(Some(note));
                other
                    .words()
                    .set_midway(params(2.0, other.burst_ms), Nanos::ZERO, || {
                        held.wait();
                        release.wait();
                    });
            });
            held.wait();
            // A failing assertion in `during` still lets the change go, then fails
            // the test: it would otherwise wait for the held change, which waits for
            // `release`, for ever.
            let during = std::panic::catch_unwind(std::panic::AssertUnwindSafe(during));
            release.wait();
            if let Err(panic) = during {
                std::panic::resume_unwind(panic);
            }
        });
    }

    impl Note {
        /// The note of the bucket whose TAT word is `tat`, by its address (which does
        /// not change while a change or a decision borrows the bucket).
        fn of(tat: &AtomicU64) -> &'static Note {
            #[cfg(test)]
            if let Some(note) = TEST_NOTE.get() {
                return note;
            }
            let addr = std::ptr::from_ref(tat) as usize as u64;
            // `checked_shr`: a shift by 64 (no bits, under loom) picks note 0.
            let i = (addr >> 3)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .checked_shr(64 - NOTE_BITS)
                .unwrap_or(0);
            &NOTES[i as usize]
        }

        /// Takes the note, after any change that holds it.
        fn take(&self) {
            let mut turns = 0;
            while !self.try_take() {
                spin_wait(&mut turns);
            }
        }

        /// Takes the note if no change holds it: one compare-exchange, no wait.
        #[inline]
        fn try_take(&self) -> bool {
            self.held
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        }

        /// Lets the next change take the note.
        fn give_back(&self) {
            self.held.store(0, Ordering::Release);
        }
    }

    /// The rate and capacity a change left in the note of the bucket whose TAT word
    /// is `tat`. Out of line: the decisions that overlap a change are rare.
    #[cold]
    #[inline(never)]
    fn noted(tat: &AtomicU64) -> (u64, u32) {
        let note = Note::of(tat);
        (
            note.emission_ns.load(Ordering::Acquire),
            note.capacity.load(Ordering::Acquire),
        )
    }

    /// The words of one bucket: its TAT, emission interval and capacity.
    #[derive(Clone, Copy)]
    pub(crate) struct Words<'a> {
        pub(crate) tat: &'a AtomicU64,
        pub(crate) emission_ns: &'a AtomicU64,
        pub(crate) capacity: &'a AtomicU32,
    }

    impl Words<'_> {
        /// The TAT word as loaded, its TAT, and the rate and capacity the TAT is scaled
        /// to: the rate and capacity words, or a changing bucket's note. Never waits;
        /// the caller acts on them only if the word is still the one loaded (see the
        /// module docs).
        #[inline]
        fn read(self) -> (u64, u64, u64, u32) {
            let word = self.tat.load(Ordering::Acquire);
            let (t, capacity) = if word & CHANGING == 0 {
                (
                    self.emission_ns.load(Ordering::Acquire),
                    self.capacity.load(Ordering::Acquire),
                )
            } else {
                noted(self.tat)
            };
            (word, word & TAT, t, capacity)
        }

        /// Whether the TAT word is still `word`, for a decision that writes nothing.
        #[inline]
        fn still(self, word: u64) -> bool {
            self.tat.load(Ordering::Relaxed) == word
        }

        /// Takes one token at `now`: `Ok`, or the nanoseconds until one will be there.
        #[inline]
        pub(crate) fn take(self, now: Nanos) -> Result<(), u64> {
            let now = clamped(now);
            loop {
                let (word, tat, t, capacity) = self.read();
                let tau = tolerance(t, capacity);
                let next = tat.max(now) + t;
                if next - now > tau {
                    if self.still(word) {
                        return Err(next - tau - now);
                    }
                    continue;
                }
                // The word with its TAT moved to `next` (never back: `next` is later),
                // count and mark kept.
                let moved = word + (next - tat);
                if self
                    .tat
                    .compare_exchange_weak(word, moved, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return Ok(());
                }
            }
        }

        /// Changes the emission interval and capacity to `(t2, c2)` as of `now`,
        /// keeping the tokens there are (clamped to the new capacity). Decisions go on
        /// meanwhile at the old rate; two changes of one bucket take turns, and this
        /// one waits for the note while another change holds it (see the module docs).
        pub(crate) fn set(self, new: (u64, u32), now: Nanos) {
            self.set_midway(new, now, || {});
        }

        /// [`Words::set`] if the bucket's note is free, and nothing if another change
        /// holds it: never waits. Whether the change was made; the caller that gets
        /// `false` makes it again later (see the module docs).
        pub(crate) fn try_set(self, new: (u64, u32), now: Nanos) -> bool {
            let note = Note::of(self.tat);
            if !note.try_take() {
                return false;
            }
            self.change(note, new, now, || {});
            true
        }

        /// [`Words::set`], calling `midway` once the TAT word is marked, before the new
        /// rate is written: the model checks and the tests hold a change there.
        pub(crate) fn set_midway(self, new: (u64, u32), now: Nanos, midway: impl FnOnce()) {
            let note = Note::of(self.tat);
            note.take();
            self.change(note, new, now, midway);
        }

        /// The change, by the holder of the bucket's `note`, which it gives back.
        fn change(self, note: &Note, (t2, c2): (u64, u32), now: Nanos, midway: impl FnOnce()) {
            let now = clamped(now);
            // Only a change that holds the bucket's note writes its rate and capacity.
            let t1 = self.emission_ns.load(Ordering::Relaxed);
            let c1 = self.capacity.load(Ordering::Relaxed);
            note.emission_ns.store(t1, Ordering::Release);
            note.capacity.store(c1, Ordering::Release);
            let mut seen = self.tat.fetch_or(CHANGING, Ordering::Release) | CHANGING;
            midway();
            self.emission_ns.store(t2, Ordering::Release);
            self.capacity.store(c2, Ordering::Release);
            loop {
                let count = (seen & COUNT).wrapping_add(ONE_CHANGE) & COUNT;
                let next = count | rescaled(seen & TAT, (t1, c1), (t2, c2), now);
                match self.tat.compare_exchange_weak(
                    seen,
                    next,
                    Ordering::Release,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(current) => seen = current,
                }
            }
            note.give_back();
        }

        /// Leaves at most `tokens` tokens (at least none) at `now`: moves the TAT
        /// later, never earlier, and never past `now + τ` (an empty bucket). A TAT
        /// already later is left as it is, without a write.
        #[inline]
        pub(crate) fn lower_to(self, tokens: f64, now: Nanos) {
            let now = clamped(now);
            loop {
                let (word, tat, t, capacity) = self.read();
                let tau = tolerance(t, capacity);
                // `max` maps NaN to 0: an unreadable level lowers to empty, never refills.
                let kept = ((tokens.max(0.0) * t as f64) as u64).min(tau);
                let floor = now + (tau - kept);
                if tat >= floor {
                    if self.still(word) {
                        return;
                    }
                } else if self
                    .tat
                    .compare_exchange_weak(
                        word,
                        (word & !TAT) | floor,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    return;
                }
            }
        }

        /// Tokens left at `now` and the capacity.
        pub(crate) fn level(self, now: Nanos) -> Level {
            let now = clamped(now);
            loop {
                let (word, tat, t, capacity) = self.read();
                if self.still(word) {
                    let tau = tolerance(t, capacity);
                    let backlog = tat.saturating_sub(now);
                    return Level {
                        value: tau.saturating_sub(backlog) as f64 / t as f64,
                        capacity: f64::from(capacity),
                    };
                }
            }
        }

        /// Whether the bucket is full at `now`, with no change under way: a new
        /// bucket would start where it stands.
        pub(crate) fn full(self, now: Nanos) -> bool {
            let word = self.tat.load(Ordering::Relaxed);
            word & CHANGING == 0 && word & TAT <= clamped(now)
        }
    }

    /// The TAT that keeps the tokens a TAT of `tat` holds under `(t1, c1)` (clamped
    /// to the new capacity) under `(t2, c2)`, as of `at`, or as of `tat − τ1` if that
    /// is later: the change counts from then (see "Changes dated in the past" in the
    /// module docs).
    fn rescaled(tat: u64, (t1, c1): (u64, u32), (t2, c2): (u64, u32), at: u64) -> u64 {
        let (tau1, tau2) = (tolerance(t1, c1), tolerance(t2, c2));
        let now = at.max(tat.saturating_sub(tau1)).min(NOW_MAX);
        let backlog = tat.saturating_sub(now);
        let tokens = tau1.saturating_sub(backlog) as f64 / t1 as f64;
        let kept = tokens.min(f64::from(c2));
        // Bounded in integers: `tau2 as f64` may round above `tau2`, and the
        // subtraction would go below zero.
        now + tau2 - ((kept * t2 as f64) as u64).min(tau2)
    }
}

/// Bits of a packed window word given to the window index.
const IDX_BITS: u32 = 24;
/// Bits given to each count (20 bits: up to 1,048,575 per window).
const COUNT_BITS: u32 = 20;
const COUNT_MAX: u64 = (1 << COUNT_BITS) - 1;
const IDX_MASK: u64 = (1 << IDX_BITS) - 1;

/// The most requests a window-counting limiter can count in one window.
pub const MAX_WINDOW_COUNT: u64 = COUNT_MAX;

/// Window index, previous count and current count packed in one word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packed {
    idx: u64,
    prev: u64,
    cur: u64,
}

impl Packed {
    fn load(word: u64) -> Self {
        Packed {
            idx: word >> (2 * COUNT_BITS),
            prev: (word >> COUNT_BITS) & COUNT_MAX,
            cur: word & COUNT_MAX,
        }
    }

    fn store(self) -> u64 {
        ((self.idx & IDX_MASK) << (2 * COUNT_BITS))
            | (self.prev.min(COUNT_MAX) << COUNT_BITS)
            | self.cur.min(COUNT_MAX)
    }

    /// The word as seen from window `idx`: rolled forward if it is older. A caller
    /// whose `idx` is at most `late` windows older than the word's (a thread that read
    /// the clock just before another one advanced the window) counts in the word's
    /// window, so a late reader can never reopen a window that has been counted. Any
    /// other index is later: the 24-bit index wraps, so a word older than half the
    /// wrap must not read as one still to come.
    fn at(self, idx: u64, late: u64) -> Self {
        match idx.wrapping_sub(self.idx) & IDX_MASK {
            0 => self,
            1 => Packed {
                idx,
                prev: self.cur,
                cur: 0,
            },
            d if d > IDX_MASK - late => self,
            _ => Packed {
                idx,
                prev: 0,
                cur: 0,
            },
        }
    }

    /// `now`, or the start of the word's window if the word is ahead of `now` (by at
    /// most `late` windows, as in [`Packed::at`]).
    fn effective_now(self, now: u64, window_ns: u64, late: u64) -> u64 {
        let ahead = self.idx.wrapping_sub(now / window_ns) & IDX_MASK;
        if ahead == 0 || ahead > late {
            now
        } else {
            (now / window_ns + ahead) * window_ns
        }
    }
}

/// How late a reader of a window word may be (from its clock read to its update):
/// later, its window index reads as a new window, not as an older one.
const LATE_NS: u64 = 1_000_000_000;

/// [`LATE_NS`] in windows of `window_ns` (at least one).
fn late_windows(window_ns: u64) -> u64 {
    (LATE_NS / window_ns).max(1)
}

/// The limit and window length shared by the two window-counting limiters.
#[derive(Debug)]
struct WindowQuota {
    limit_bits: AtomicU64,
    /// Window length in milliseconds (32 bits keep a [`Limiter`] at 32 bytes).
    window_ms: u32,
}

impl WindowQuota {
    fn new(limit: f64, window: Duration) -> Self {
        WindowQuota {
            limit_bits: AtomicU64::new(limit.to_bits()),
            window_ms: words::window_ms(window),
        }
    }

    fn window_ns(&self) -> u64 {
        words::window_ns(self.window_ms)
    }

    fn quota(&self) -> f64 {
        words::quota(
            f64::from_bits(self.limit_bits.load(Ordering::Relaxed)),
            self.window_ns(),
        )
    }

    fn set_limit(&self, limit: f64) {
        self.limit_bits.store(limit.to_bits(), Ordering::Relaxed);
    }
}

/// The fixed-window, sliding-window and leaky-bucket decisions on their one state
/// word, with the parameters passed in: the arithmetic of [`FixedWindow`],
/// [`SlidingWindowCounter`] and [`LeakyBucket`], shared with the engine's per-key
/// states, which keep the same word beside their own bookkeeping (as [`gcra`] is for
/// the token bucket).
pub(crate) mod words {
    use super::{late_windows, reject, Admit, Decision, Pace, Packed, Reason, COUNT_MAX, IDX_MASK};
    use crate::clock::Nanos;
    use crate::sync::{AtomicU64, Ordering};
    use std::time::Duration;

    /// A window kept to the millisecond in 32 bits (at least 1 ms).
    pub(crate) fn window_ms(window: Duration) -> u32 {
        u32::try_from(window.as_millis()).unwrap_or(u32::MAX).max(1)
    }

    /// A window kept by [`window_ms`] in nanoseconds.
    pub(crate) fn window_ns(window_ms: u32) -> u64 {
        u64::from(window_ms) * 1_000_000
    }

    /// `limit × window` in requests, not yet whole.
    pub(crate) fn per_window(limit: f64, window_ns: u64) -> f64 {
        limit * window_ns as f64 / 1e9
    }

    /// Requests allowed per window: `limit × window`, whole, at most what a word counts.
    /// A hair below a whole number is that number: a limit written as n per window
    /// (30.3030303030303 req/s for one request each 33 ms, 909.090909090909 for 1,000
    /// each 1.1 s) comes out of the float product a rounding error short of n, and the
    /// config, which checks quotas with this function, counts it as n.
    /// A limit that is no number (NaN, from a config built in code and not checked)
    /// allows none, as a limit of 0 does.
    pub(crate) fn quota(limit: f64, window_ns: u64) -> f64 {
        (per_window(limit, window_ns) + 1e-6)
            .floor()
            .max(0.0)
            .min(COUNT_MAX as f64)
    }

    /// Fixed window: counts one request at `now`, or says when the window ends.
    #[inline]
    pub(crate) fn fixed(word: &AtomicU64, quota: u64, window_ns: u64, now: Nanos) -> Decision {
        let idx = (now.as_u64() / window_ns) & IDX_MASK;
        let late = late_windows(window_ns);
        let mut seen = word.load(Ordering::Relaxed);
        loop {
            let p = Packed::load(seen).at(idx, late);
            if p.cur >= quota {
                let at = p.effective_now(now.as_u64(), window_ns, late);
                let end = (at / window_ns + 1) * window_ns;
                return reject(end - now.as_u64(), Reason::Limit);
            }
            let next = Packed {
                cur: p.cur + 1,
                ..p
            }
            .store();
            match word.compare_exchange_weak(seen, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Decision::Admit(Admit::Now),
                Err(current) => seen = current,
            }
        }
    }

    /// Fixed window: the count of the window of `now`.
    pub(crate) fn fixed_count(word: &AtomicU64, window_ns: u64, now: Nanos) -> u64 {
        let idx = (now.as_u64() / window_ns) & IDX_MASK;
        Packed::load(word.load(Ordering::Relaxed))
            .at(idx, late_windows(window_ns))
            .cur
    }

    /// Sliding window: the weighted count at `now` from a word.
    fn estimate(p: Packed, window_ns: u64, now: u64) -> f64 {
        let into = (now % window_ns) as f64 / window_ns as f64;
        p.prev as f64 * (1.0 - into) + p.cur as f64
    }

    /// Sliding window: counts one request at `now`, or says when the weighted count
    /// will allow it.
    #[inline]
    pub(crate) fn sliding(word: &AtomicU64, quota: f64, window_ns: u64, now: Nanos) -> Decision {
        let now = now.as_u64();
        let idx = (now / window_ns) & IDX_MASK;
        let late = late_windows(window_ns);
        let mut seen = word.load(Ordering::Relaxed);
        loop {
            let p = Packed::load(seen).at(idx, late);
            let at = p.effective_now(now, window_ns, late);
            // The tolerance absorbs float rounding, so that a request sent at exactly
            // `retry_after` (solved from the same formula) is admitted.
            if estimate(p, window_ns, at) + 1.0 > quota + 1e-9 {
                return reject(
                    retry_after(p, window_ns, at, quota) + (at - now),
                    Reason::Limit,
                );
            }
            let next = Packed {
                cur: p.cur + 1,
                ..p
            }
            .store();
            match word.compare_exchange_weak(seen, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Decision::Admit(Admit::Now),
                Err(current) => seen = current,
            }
        }
    }

    /// Sliding window: time until `prev × (1 − into) + cur + 1 ≤ quota`, or until the
    /// next window if the current count alone is too high.
    fn retry_after(p: Packed, w: u64, now: u64, quota: f64) -> u64 {
        let start = now - now % w;
        let to_next = start + w - now;
        let cur = p.cur as f64;
        if p.prev > 0 && cur + 1.0 <= quota {
            // Solve prev × (1 − x/w) = quota − cur − 1 for x, the offset into this window.
            let x = (1.0 - (quota - cur - 1.0) / p.prev as f64) * w as f64;
            let at = start + x.ceil() as u64;
            if at > now {
                return (at - now).min(to_next);
            }
        }
        // Next window: the current count becomes the weighted previous one.
        let x = if cur > 0.0 && cur + 1.0 > quota {
            ((1.0 - (quota - 1.0).max(0.0) / cur) * w as f64).ceil() as u64
        } else {
            0
        };
        to_next + x.min(w)
    }

    /// Sliding window: the weighted count at `now`.
    pub(crate) fn sliding_count(word: &AtomicU64, window_ns: u64, now: Nanos) -> f64 {
        let now = now.as_u64();
        let idx = (now / window_ns) & IDX_MASK;
        estimate(
            Packed::load(word.load(Ordering::Relaxed)).at(idx, late_windows(window_ns)),
            window_ns,
            now,
        )
    }

    /// Leaky bucket: schedules one request at `now`, `t` ns after the one before it;
    /// admitted with the delay it must wait, or rejected with `queue_full` when
    /// `queue` requests are already waiting.
    #[inline]
    pub(crate) fn leaky(next_free: &AtomicU64, t: u64, queue: u32, now: Nanos) -> Decision {
        let now = now.as_u64();
        let max_wait = t.saturating_mul(u64::from(queue));
        let mut seen = next_free.load(Ordering::Relaxed);
        loop {
            let start = seen.max(now);
            let wait = start - now;
            if wait > max_wait {
                return reject(wait - max_wait, Reason::QueueFull);
            }
            // Saturates for intervals near `interval_ns`'s cap (limits under 1e-9/s).
            let next = start.saturating_add(t);
            match next_free.compare_exchange_weak(seen, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) if wait == 0 => return Decision::Admit(Admit::Now),
                Ok(_) => {
                    return Decision::Admit(Admit::Paced(Pace {
                        departure: Nanos::new(start),
                        next,
                        overflow: false,
                    }))
                }
                Err(current) => seen = current,
            }
        }
    }

    /// Leaky bucket: gives back the place of a paced request that leaves at `now`,
    /// before its departure, if it is still the last one scheduled (the word is as
    /// its scheduling left it): the word goes back to its departure, which the next
    /// request then takes. Whether it did.
    ///
    /// Sound in one word: every request scheduled (and not given back) after this one
    /// left the word at least at its own departure plus an interval, above this
    /// one's, and a give-back only ever restores a later request's departure; so the
    /// word equals this request's `next` only when no request scheduled after it is
    /// still waiting, and the requests still scheduled keep departures one interval
    /// apart.
    pub(crate) fn give_back(next_free: &AtomicU64, pace: Pace, now: Nanos) -> bool {
        now < pace.departure
            && next_free
                .compare_exchange(
                    pace.next,
                    pace.departure.as_u64(),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

/// Counts requests per fixed window; admits `limit × window` per window.
#[derive(Debug)]
pub struct FixedWindow {
    word: AtomicU64,
    quota: WindowQuota,
}

impl FixedWindow {
    /// An empty counter (the window is kept to the millisecond).
    pub fn new(limit: f64, window: Duration) -> Self {
        FixedWindow {
            word: AtomicU64::new(0),
            quota: WindowQuota::new(limit, window),
        }
    }

    fn quota(&self) -> u64 {
        self.quota.quota() as u64
    }

    /// Counts one request at `now`, or says when the window ends.
    #[inline]
    pub fn check(&self, now: Nanos) -> Decision {
        words::fixed(&self.word, self.quota(), self.quota.window_ns(), now)
    }

    /// Changes the per-second limit; the current window's count is kept.
    pub fn set_limit(&self, limit: f64) {
        self.quota.set_limit(limit);
    }

    /// Requests counted in the current window, and the quota.
    pub fn level(&self, now: Nanos) -> Level {
        Level {
            value: words::fixed_count(&self.word, self.quota.window_ns(), now) as f64,
            capacity: self.quota() as f64,
        }
    }
}

/// The sliding-window counter: the current window's count plus the previous window's
/// count weighted by how much of it still overlaps the sliding window. O(1), one word.
#[derive(Debug)]
pub struct SlidingWindowCounter {
    word: AtomicU64,
    quota: WindowQuota,
}

impl SlidingWindowCounter {
    /// An empty counter (the window is kept to the millisecond).
    pub fn new(limit: f64, window: Duration) -> Self {
        SlidingWindowCounter {
            word: AtomicU64::new(0),
            quota: WindowQuota::new(limit, window),
        }
    }

    /// Counts one request at `now`, or says when the weighted count will allow it.
    #[inline]
    pub fn check(&self, now: Nanos) -> Decision {
        words::sliding(&self.word, self.quota.quota(), self.quota.window_ns(), now)
    }

    /// Changes the per-second limit; counts are kept.
    pub fn set_limit(&self, limit: f64) {
        self.quota.set_limit(limit);
    }

    /// The weighted count at `now`, and the quota.
    pub fn level(&self, now: Nanos) -> Level {
        Level {
            value: words::sliding_count(&self.word, self.quota.window_ns(), now),
            capacity: self.quota.quota(),
        }
    }
}

/// Paces requests out at the limit, each after the one before it; at most `queue`
/// may be waiting. The state is one atomic word: when the next request may leave.
#[derive(Debug)]
pub struct LeakyBucket {
    next_free: AtomicU64,
    emission_ns: AtomicU64,
    queue: u32,
}

impl LeakyBucket {
    /// An idle bucket.
    pub fn new(limit: f64, queue: u32) -> Self {
        LeakyBucket {
            next_free: AtomicU64::new(0),
            emission_ns: AtomicU64::new(interval_ns(limit)),
            queue,
        }
    }

    /// Schedules one request at `now`: admitted with the delay it must wait, or
    /// rejected with `queue_full` when `queue` requests are already waiting.
    #[inline]
    pub fn check(&self, now: Nanos) -> Decision {
        words::leaky(
            &self.next_free,
            self.emission_ns.load(Ordering::Relaxed),
            self.queue,
            now,
        )
    }

    /// Gives back the place of a paced request that leaves at `now`, before its
    /// departure, if no request was scheduled after it: the next request takes its
    /// departure time. Whether it did (see [`Pace`]).
    pub fn give_back(&self, pace: Pace, now: Nanos) -> bool {
        words::give_back(&self.next_free, pace, now)
    }

    /// Changes the pace; requests already scheduled keep their departure times.
    pub fn set_limit(&self, limit: f64) {
        self.emission_ns
            .store(interval_ns(limit), Ordering::Relaxed);
    }

    /// Requests waiting at `now`, and the queue size.
    pub fn level(&self, now: Nanos) -> Level {
        let t = self.emission_ns.load(Ordering::Relaxed);
        let backlog = self
            .next_free
            .load(Ordering::Relaxed)
            .saturating_sub(now.as_u64());
        Level {
            value: (backlog / t.max(1)) as f64,
            capacity: f64::from(self.queue),
        }
    }
}

/// Limits requests in flight. A permit is an RAII guard: dropping it frees the slot.
/// With a queue, requests over the limit may wait (await the [`Ticket`]); requests
/// beyond the queue are rejected with `queue_full`, without a queue with `concurrency`.
#[derive(Debug, Clone)]
pub struct Concurrency {
    shared: Arc<ConcurrencyShared>,
}

#[derive(Debug)]
struct ConcurrencyShared {
    in_flight: AtomicU32,
    waiting: AtomicU32,
    limit: AtomicU32,
    queue: u32,
    /// Queued tickets listen here, in order; each freed permit notifies one more.
    freed: Event,
    /// A partitioned route's key keeps the route generation its limit was set for
    /// here, beside its permits, and its tier (see [`Concurrency::for_key`]): its place
    /// in the key table then holds only this state's address and a second. Unused at
    /// route level, where they fill what would be padding.
    key_generation: AtomicU32,
    key_tier: u16,
}

/// How long a rejected request is told to wait when the limit is in flight counts
/// (there is no schedule to derive it from).
const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

// `in_flight` and `waiting` are read and written in sequentially consistent order: a
// ticket counts itself in `waiting` before it tries for a permit, a release frees its
// permit before it reads `waiting`, so either the ticket sees the permit free or the
// release sees the ticket waiting and notifies. (On x86 this costs nothing: the
// writes are locked instructions anyway.)
impl ConcurrencyShared {
    fn try_acquire(&self) -> bool {
        let limit = self.limit.load(Ordering::SeqCst);
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Wakes up to `n` more queued tickets to try for a permit. With none queued it
    /// leaves the event alone (its state is allocated on first use).
    fn notify_waiting(&self, n: u32) {
        // After the write that frees permits (see `seq_cst_fence_under_loom`).
        crate::sync::seq_cst_fence_under_loom();
        if n > 0 && self.waiting.load(Ordering::SeqCst) > 0 {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            self.freed.notify(n.additional());
        }
    }
}

impl Concurrency {
    /// No requests in flight; at most `limit` at once (up to `u32::MAX`), `queue`
    /// more waiting.
    pub fn new(limit: f64, queue: u32) -> Self {
        Concurrency::for_key(limit, queue, 0, 0)
    }

    /// [`new`](Self::new), for a key of a partitioned route, with the key's route
    /// `generation` and `tier` kept beside the permits ([`key_generation`],
    /// [`key_tier`]).
    ///
    /// [`key_generation`]: Self::key_generation
    /// [`key_tier`]: Self::key_tier
    pub(crate) fn for_key(limit: f64, queue: u32, generation: u32, tier: u16) -> Self {
        Concurrency {
            shared: Arc::new(ConcurrencyShared {
                in_flight: AtomicU32::new(0),
                waiting: AtomicU32::new(0),
                limit: AtomicU32::new(permits(limit)),
                queue,
                freed: Event::new(),
                key_generation: AtomicU32::new(generation),
                key_tier: tier,
            }),
        }
    }

    /// The route generation a key's limit was last set for (see
    /// [`for_key`](Self::for_key)).
    pub(crate) fn key_generation(&self) -> &AtomicU32 {
        &self.shared.key_generation
    }

    /// A key's tier (see [`for_key`](Self::for_key)).
    pub(crate) fn key_tier(&self) -> u16 {
        self.shared.key_tier
    }

    /// Takes a permit, a place in the queue, or neither.
    pub fn check(&self) -> Decision {
        let s = &self.shared;
        if s.waiting.load(Ordering::SeqCst) == 0 && s.try_acquire() {
            return Decision::Admit(Admit::Held(Permit::new(Arc::clone(s))));
        }
        if s.queue == 0 {
            return reject(duration_nanos(CONCURRENCY_RETRY), Reason::Concurrency);
        }
        let queued = s
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < s.queue).then_some(n + 1)
            })
            .is_ok();
        if queued {
            // After counting itself in `waiting`, the ticket reads `in_flight` (see
            // `seq_cst_fence_under_loom`).
            crate::sync::seq_cst_fence_under_loom();
            Decision::Admit(Admit::Queued(Ticket {
                shared: ManuallyDrop::new(Some(Arc::clone(s))),
                listener: None,
            }))
        } else {
            reject(duration_nanos(CONCURRENCY_RETRY), Reason::QueueFull)
        }
    }

    /// Changes the number of permits. Requests in flight keep theirs; lowering the
    /// limit only stops new ones until enough have finished; raising it wakes as many
    /// queued requests as it frees permits.
    pub fn set_limit(&self, limit: f64) {
        let s = &self.shared;
        let limit = permits(limit);
        s.limit.store(limit, Ordering::SeqCst);
        crate::sync::seq_cst_fence_under_loom();
        s.notify_waiting(limit.saturating_sub(s.in_flight.load(Ordering::SeqCst)));
    }

    /// Requests in flight and the limit.
    pub fn level(&self) -> Level {
        Level {
            value: f64::from(self.shared.in_flight.load(Ordering::Relaxed)),
            capacity: f64::from(self.shared.limit.load(Ordering::Relaxed)),
        }
    }

    /// Requests waiting for a permit.
    pub fn waiting(&self) -> u64 {
        u64::from(self.shared.waiting.load(Ordering::Relaxed))
    }

    /// Whether a request is queued, read `SeqCst` (see the engine's concurrency keys).
    pub(crate) fn has_waiters(&self) -> bool {
        self.shared.waiting.load(Ordering::SeqCst) > 0
    }

    /// Whether no permit is out and no request is queued, so that a fresh limiter
    /// would stand where this one does (a partitioned route evicts an idle key only
    /// then).
    ///
    /// A queued request that takes its permit counts itself in flight before it leaves
    /// the queue, so the queue is read first, then the permits, each with `Acquire`:
    /// a request seen gone from the queue is seen in flight. Read the other way round
    /// (or relaxed), a hand-over between the two reads looked idle, and the key was
    /// evicted while its permit was out (`tests/loom.rs`).
    pub(crate) fn is_idle(&self) -> bool {
        let s = &self.shared;
        s.waiting.load(Ordering::Acquire) == 0 && s.in_flight.load(Ordering::Acquire) == 0
    }
}

/// Whole permits for a limit of `limit` requests in flight: rounded down, but a limit
/// a rounding error short of a whole number is that number. A key's limit is computed
/// as `cut + (base − cut) × progress`, which for a route recovering at 16 between 1 and
/// 23 comes out as 15.999999999999998, and must give the route's 16 permits.
fn permits(limit: f64) -> u32 {
    let whole = limit.round();
    let n = if (limit - whole).abs() <= 1e-9 * whole.abs().max(1.0) {
        whole
    } else {
        limit.floor()
    };
    n.clamp(0.0, f64::from(MAX_PERMITS)) as u32
}

/// A slot in flight; dropping it lets the next request in.
#[derive(Debug)]
pub struct Permit {
    // Always `Some` until dropped. In `ManuallyDrop` so that the out-of-line `Drop`
    // below releases the `Arc` too: a `Decision`'s drop glue is then a tag check and
    // at most one call, small enough to inline on the paths that hold no permit.
    shared: ManuallyDrop<Option<Arc<ConcurrencyShared>>>,
}

impl Permit {
    fn new(shared: Arc<ConcurrencyShared>) -> Self {
        Permit {
            shared: ManuallyDrop::new(Some(shared)),
        }
    }
}

impl Drop for Permit {
    #[inline(never)]
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            shared.notify_waiting(1);
        }
    }
}

/// A place in a concurrency queue. Awaiting it yields a [`Permit`]; dropping it
/// gives the place up. Waiters are woken in order, one per freed permit, but a woken
/// waiter competes with the next permit release, so the order is not strictly
/// first-come first-served. Polling it more often than it is woken is harmless.
#[derive(Debug)]
pub struct Ticket {
    // `None` once the permit is taken; `ManuallyDrop` as in `Permit`.
    shared: ManuallyDrop<Option<Arc<ConcurrencyShared>>>,
    /// Its place among the listeners for a freed permit, once it has had to wait.
    listener: Option<EventListener>,
}

impl Future for Ticket {
    type Output = Permit;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        let Some(shared) = (*self.shared).clone() else {
            return Poll::Pending;
        };
        // A notification already in stands for a freed permit, the one this poll is
        // about to try for: taken first, it is not passed on if the permit is taken,
        // which would wake the next in line for nothing (and, polled, send it to the
        // back of the line).
        if let Some(listener) = self.listener.as_mut() {
            if Pin::new(listener).poll(cx).is_ready() {
                self.listener = None;
            }
        }
        // Try; if that fails, listen and try again (a permit freed before the listener
        // was in place notified nobody); then wait for a notification, and so on.
        while !shared.try_acquire() {
            match self.listener.as_mut() {
                None => self.listener = Some(shared.freed.listen()),
                Some(listener) => {
                    ready!(Pin::new(listener).poll(cx));
                    self.listener = None;
                }
            }
        }
        *self.shared = None;
        // A listener notified meanwhile passes its notification on as it drops.
        self.listener = None;
        shared.waiting.fetch_sub(1, Ordering::SeqCst);
        Poll::Ready(Permit::new(shared))
    }
}

impl Drop for Ticket {
    #[inline(never)]
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        // A listener notified for a permit this ticket will not take passes the
        // notification on to the next one.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    fn ms(n: u64) -> Nanos {
        Nanos::from_millis(n)
    }

    fn admitted(d: Decision) -> bool {
        d.is_admit()
    }

    #[test]
    fn token_bucket_burst_then_rate() {
        let b = TokenBucket::new(100.0, Duration::from_secs(1), ms(0));
        let n = (0..150).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(n, 100);
        let r = b.check(ms(0)).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_millis(10));
        assert!(!admitted(b.check(ms(9))));
        assert!(admitted(b.check(ms(10))));
        // A second later, a full second of tokens minus the one just taken... capped at capacity.
        let n = (0..150).filter(|_| admitted(b.check(ms(2000)))).count();
        assert_eq!(n, 100);
    }

    #[test]
    fn a_limit_written_as_n_per_burst_holds_n_tokens() {
        // 1,000 per 1.1 s is 909.090909090909 req/s, whose product with the burst
        // comes out of the float arithmetic as 999.9999999999999: floored, the bucket
        // held 999 tokens (the window counters' quotas already count it as 1,000).
        for (limit, burst_ms, n) in [
            (909.090909090909, 1_100, 1_000),
            (30.3030303030303, 1_100, 33),
            (1.0 / 0.7, 7_000, 10),
        ] {
            let b = TokenBucket::new(limit, Duration::from_millis(burst_ms), ms(0));
            let taken = (0..=n).filter(|_| admitted(b.check(ms(0)))).count();
            assert_eq!(taken, n, "{limit} req/s with a burst of {burst_ms} ms");
            assert_eq!(b.level(ms(0)).capacity, n as f64);
        }
    }

    /// Greedy requests at `limit` over `intervals` of it on the manual clock, each sent
    /// the moment the limiter allows (a rejection's `retry_after` later): the
    /// requests admitted and the span, in ns.
    fn greedy(limiter: &Limiter, limit: f64, intervals: f64) -> (u64, u64) {
        let span_ns = (intervals * 1e9 / limit) as u64;
        let (mut now, mut admitted) = (Nanos::ZERO, 0);
        while now.as_u64() <= span_ns {
            match limiter.check(now) {
                Decision::Admit(Admit::Now) => admitted += 1,
                Decision::Admit(other) => panic!("{other:?} with no queue"),
                Decision::Reject(r) => {
                    assert!(r.retry_after > Duration::ZERO);
                    now = now + r.retry_after;
                }
            }
        }
        (admitted, span_ns)
    }

    #[test]
    fn up_to_the_largest_spaced_rate_a_bucket_keeps_to_its_limit_within_a_thousandth() {
        // The bound, and the rates just under it that round furthest: 1e9 / 500.4999
        // ns is spaced 500 ns apart, 1e9 / 500.5001 is 501.
        let rates = [
            MAX_SPACED_RATE,
            1e9 / 500.4999,
            1e9 / 500.5001,
            1_999_999.0,
            1_234_567.0,
        ];
        for limit in rates {
            for (limiter, capacity) in [
                (
                    Limiter::new(
                        Algorithm::TokenBucket {
                            burst: Duration::from_millis(1),
                        },
                        limit,
                        Nanos::ZERO,
                    ),
                    (limit / 1e3).floor(),
                ),
                (
                    Limiter::new(Algorithm::LeakyBucket { queue: 0 }, limit, Nanos::ZERO),
                    1.0,
                ),
            ] {
                let (admitted, span_ns) = greedy(&limiter, limit, 1e5);
                let expected = capacity + limit * span_ns as f64 / 1e9;
                let off = (admitted as f64 - expected).abs() / expected;
                assert!(
                    off <= 1e-3,
                    "{limit}: {admitted} admitted, {expected} expected"
                );
            }
        }
        // What the bound keeps out: 7 × 10^8 req/s is spaced 1 ns apart, 10^9 req/s.
        let burst = Duration::from_millis(1);
        let b = Limiter::new(Algorithm::TokenBucket { burst }, 7e8, Nanos::ZERO);
        let (admitted, span_ns) = greedy(&b, 7e8, 1e5);
        let rate = (admitted as f64 - 7e5) * 1e9 / span_ns as f64;
        assert!((rate - 1e9).abs() < 1e6, "{rate}");
    }

    #[test]
    fn at_the_largest_spaced_rate_a_rejection_says_when_to_come_back() {
        let b = TokenBucket::new(MAX_SPACED_RATE, Duration::from_millis(1), ms(0));
        let n = (0..3_000).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(n, 2_000);
        let r = b.check(ms(0)).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_nanos(500));
        assert!(!admitted(b.check(Nanos::new(499))));
        assert!(admitted(b.check(Nanos::new(500))));
        let leaky = LeakyBucket::new(MAX_SPACED_RATE, 0);
        assert!(admitted(leaky.check(ms(0))));
        let r = leaky.check(ms(0)).rejection().unwrap();
        assert_eq!(
            (r.retry_after, r.reason),
            (Duration::from_nanos(500), Reason::QueueFull)
        );
    }

    #[test]
    fn the_largest_bucket_the_config_takes_holds_every_token() {
        // The longest burst at 1000 req/s: 4294967295 tokens, all the capacity keeps.
        let most = Duration::from_millis(u32::MAX.into());
        let b = TokenBucket::new(1000.0, most, ms(0));
        assert_eq!(b.level(ms(0)).capacity, f64::from(gcra::MAX_TOKENS));
        assert!(admitted(b.check(ms(0))));
        assert_eq!(b.level(ms(0)).value, f64::from(gcra::MAX_TOKENS) - 1.0);
        // Beyond it (which the config refuses) the capacity saturates rather than
        // wraps, whatever the product, and decisions go on: built in code, 10^12 req/s
        // (an interval of 1 ns) for the longest burst holds as many tokens as fit.
        for (limit, burst) in [
            (1e6, Duration::from_secs(7200)),
            (1e12, most),
            (f64::MAX, most),
        ] {
            let b = TokenBucket::new(limit, burst, ms(0));
            assert_eq!(
                b.level(ms(0)).capacity,
                f64::from(gcra::MAX_TOKENS),
                "{limit}"
            );
            let n = (0..1000).filter(|_| admitted(b.check(ms(0)))).count();
            assert_eq!(n, 1000, "{limit}");
            let left = b.level(ms(0)).value;
            assert!(
                left > 4e9 && left < f64::from(gcra::MAX_TOKENS),
                "{limit}: {left}"
            );
        }
    }

    #[test]
    fn token_bucket_limit_change_keeps_tokens() {
        let b = TokenBucket::new(200.0, Duration::from_secs(1), ms(0));
        for _ in 0..150 {
            assert!(admitted(b.check(ms(0))));
        }
        assert!((b.level(ms(0)).value - 50.0).abs() < 1e-6);
        // Cut to 60: capacity 60, the 50 tokens stay.
        b.set_limit(60.0, ms(0));
        let l = b.level(ms(0));
        assert!((l.value - 50.0).abs() < 1e-6, "{l:?}");
        assert!((l.capacity - 60.0).abs() < 1e-6);
        // Raise to 200 again: still 50 tokens, not a fresh burst.
        b.set_limit(200.0, ms(0));
        assert!((b.level(ms(0)).value - 50.0).abs() < 1e-6);
        // From full, a cut clamps to the new capacity.
        let b = TokenBucket::new(200.0, Duration::from_secs(1), ms(0));
        b.set_limit(60.0, ms(0));
        let n = (0..300).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(n, 60);
    }

    /// A change dated in the past (the engine dates a route's change at the slot
    /// where its controller made it, and a key's at its route's change) keeps the
    /// tokens decisions took after that date. 10/s with 10 tokens, emptied at 0 and
    /// then one request every 100 ms to 1 s: 20 admitted, all that 10/s with 10
    /// tokens allows by 1 s. At 1 s the limit is cut to 1/s (1 token), dated at 0.
    /// Rescaled at 0, the TAT (2 s) read as fewer than no tokens, was taken as none,
    /// and the bucket, empty at 0 at 1/s, held a token at 1 s: a 21st admission by
    /// 1 s, more than either limit allows. Rescaled at 1 s (the TAT less τ: the
    /// latest decision it shows), it is empty at 1 s and refills at 1/s from then.
    #[test]
    fn a_backdated_change_gives_back_no_token_taken_after_its_date() {
        let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        let mut n = (0..20).filter(|_| admitted(b.check(ms(0)))).count();
        n += (1..=10).filter(|i| admitted(b.check(ms(i * 100)))).count();
        assert_eq!(n, 20);
        b.set_limit(1.0, ms(0));
        let r = b
            .check(ms(1_000))
            .rejection()
            .expect("a 21st admission by 1 s");
        assert_eq!(r.retry_after, Duration::from_secs(1));
        assert!(admitted(b.check(ms(2_000))));
        // With no decision after its date, a change dated in the past counts from
        // there: emptied at 0 at 1/s, raised to 10/s dated at 0, it holds 5 tokens
        // at 500 ms, not the half token 1/s gave back.
        let b = TokenBucket::new(1.0, Duration::from_secs(1), ms(0));
        assert!(admitted(b.check(ms(0))));
        b.set_limit(10.0, ms(0));
        let n = (0..20).filter(|_| admitted(b.check(ms(500)))).count();
        assert_eq!(n, 5);
    }

    #[test]
    fn a_decision_midway_through_a_change_goes_on_at_the_old_rate() {
        // 10 req/s, 10 tokens, 4 taken. A change to 2/s (capacity 2) is held half-way,
        // its tokens' word marked: decisions meanwhile neither wait nor see the new
        // rate, and the change then keeps the half token they left.
        let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        for _ in 0..4 {
            assert!(admitted(b.check(ms(0))));
        }
        b.words()
            .set_midway(gcra::params(2.0, b.burst_ms), ms(0), || {
                let level = b.level(ms(0));
                assert_eq!((level.value, level.capacity), (6.0, 10.0));
                for _ in 0..5 {
                    assert!(admitted(b.check(ms(0))));
                }
                b.lower_to(0.5, ms(0));
                assert_eq!(b.level(ms(0)).value, 0.5);
                let r = b.check(ms(0)).rejection().unwrap();
                assert_eq!(r.retry_after, Duration::from_millis(50));
            });
        // Half a token at 10/s is half a token at 2/s: 250 ms to the next.
        let level = b.level(ms(0));
        assert_eq!((level.value, level.capacity), (0.5, 2.0));
        let r = b.check(ms(0)).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_millis(250));
        assert!(admitted(b.check(ms(250))));
    }

    #[test]
    fn tokens_survive_the_change_count_wrapping() {
        // The TAT word counts changes in 4 bits: 40 changes wrap it twice.
        let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        for _ in 0..3 {
            assert!(admitted(b.check(ms(0))));
        }
        for i in 0..40 {
            b.set_limit(if i % 2 == 0 { 20.0 } else { 10.0 }, ms(0));
            let level = b.level(ms(0));
            assert!((level.value - 7.0).abs() < 1e-6, "change {i}: {level:?}");
        }
        let n = (0..20).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(n, 7);
        // Refilled, it reads as full to the key table's sweep, count and all.
        assert!(!b.words().full(ms(999)));
        assert!(b.words().full(ms(1_000)));
    }

    #[test]
    fn a_bucket_past_the_latest_now_it_sees_stays_whole() {
        // Past 2^59 − 2^57 ns a bucket holds `now` there: its TAT, up to `now + τ` at
        // the most τ (a limit of zero), still fits below the change count, which
        // changes and decisions then keep intact.
        let late = Nanos::new(u64::MAX);
        let b = TokenBucket::new(0.0, Duration::from_secs(1), late);
        assert!(b.words().full(late));
        assert!(admitted(b.check(late)));
        let r = b.check(late).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_nanos(1 << 57));
        for i in 0..20 {
            b.set_limit(if i % 2 == 0 { 0.0 } else { 1.0 }, late);
            assert_eq!(b.level(late).value, 0.0, "change {i}");
            assert!(!admitted(b.check(late)), "change {i}");
        }
        b.lower_to(0.0, late);
        assert_eq!(b.level(late).value, 0.0);
        // A full bucket there admits its capacity, and then no more.
        let b = TokenBucket::new(10.0, Duration::from_secs(1), late);
        b.set_limit(5.0, late);
        let n = (0..20).filter(|_| admitted(b.check(late))).count();
        assert_eq!(n, 5);
    }

    #[test]
    fn a_bucket_at_a_limit_of_zero_admits_one_then_waits_the_most_tau_allows() {
        let b = TokenBucket::new(0.0, Duration::from_secs(1), ms(0));
        assert!(admitted(b.check(ms(0))));
        let r = b.check(ms(0)).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_nanos(1 << 57));
    }

    #[test]
    fn lowering_a_bucket_never_refills_it() {
        let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        for _ in 0..7 {
            assert!(admitted(b.check(ms(0))));
        }
        // 3 left: lowering to 5 (or to more than the capacity) leaves 3.
        b.lower_to(5.0, ms(0));
        b.lower_to(1e9, ms(0));
        assert!((b.level(ms(0)).value - 3.0).abs() < 1e-9);
        let n = (0..10).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(n, 3);
        // Empty: lowering an empty bucket changes nothing, not even its wait.
        let wait = b.check(ms(0)).rejection().unwrap().retry_after;
        b.lower_to(0.0, ms(0));
        assert_eq!(b.check(ms(0)).rejection().unwrap().retry_after, wait);
    }

    #[test]
    fn a_lowered_bucket_admits_the_level_then_refills_from_it() {
        let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        b.lower_to(2.5, ms(0));
        assert!((b.level(ms(0)).value - 2.5).abs() < 1e-9);
        let n = (0..10).filter(|_| admitted(b.check(ms(0)))).count();
        assert_eq!(n, 2);
        // Half a token left: the next one is 50 ms away, then one per 100 ms.
        let r = b.check(ms(0)).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_millis(50));
        assert!(admitted(b.check(ms(50))));
        assert!(!admitted(b.check(ms(149))));
        assert!(admitted(b.check(ms(150))));
        // Later, the bucket is full again: lowering did not shrink it.
        let n = (0..20).filter(|_| admitted(b.check(ms(2_000)))).count();
        assert_eq!(n, 10);
    }

    #[test]
    fn lowering_stops_at_empty_where_an_admission_of_the_last_token_does() {
        // One bucket emptied by admissions, one lowered to nothing (or less, or NaN):
        // both hold no token and say the same wait.
        let emptied = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        for _ in 0..10 {
            assert!(admitted(emptied.check(ms(0))));
        }
        for tokens in [0.0, -4.0, f64::NAN] {
            let lowered = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
            lowered.lower_to(tokens, ms(0));
            assert_eq!(lowered.level(ms(0)).value, 0.0, "{tokens}");
            assert_eq!(
                lowered.check(ms(0)).rejection().unwrap().retry_after,
                emptied.check(ms(0)).rejection().unwrap().retry_after,
                "{tokens}"
            );
            assert!(admitted(lowered.check(ms(100))));
            assert!(!admitted(lowered.check(ms(100))));
        }
    }

    #[test]
    fn lowering_follows_a_limit_change() {
        // Lowered to 4 of 10, then cut to 5 req/s (capacity 5): still 4, refilling at 5/s.
        let b = TokenBucket::new(10.0, Duration::from_secs(1), ms(0));
        b.lower_to(4.0, ms(0));
        b.set_limit(5.0, ms(0));
        let l = b.level(ms(0));
        assert!((l.value - 4.0).abs() < 1e-6 && l.capacity == 5.0, "{l:?}");
        b.lower_to(1.0, ms(100));
        // 1 token at 100 ms, the next 200 ms later.
        assert!(admitted(b.check(ms(100))));
        assert!(!admitted(b.check(ms(299))));
        assert!(admitted(b.check(ms(300))));
    }

    #[test]
    fn fixed_window_counts_per_window() {
        let w = FixedWindow::new(10.0, Duration::from_secs(1));
        let n = (0..20).filter(|_| admitted(w.check(ms(100)))).count();
        assert_eq!(n, 10);
        let r = w.check(ms(300)).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_millis(700));
        assert!(admitted(w.check(ms(1000))));
        assert_eq!(w.level(ms(1000)).value, 1.0);
        w.set_limit(1.0);
        assert!(!admitted(w.check(ms(1001))));
    }

    #[test]
    fn a_quota_a_rounding_error_short_of_whole_is_whole() {
        // 909.090909090909 × 1.1 s comes out of the product as 999.9999999999999.
        let w = FixedWindow::new(909.090909090909, Duration::from_millis(1_100));
        assert_eq!(w.level(ms(0)).capacity, 1_000.0);
        let w = SlidingWindowCounter::new(1.0 / 0.033, Duration::from_millis(33));
        assert!(admitted(w.check(ms(0))));
        // A quota really below a whole number still rounds down.
        let w = FixedWindow::new(999.99, Duration::from_secs(1));
        assert_eq!(w.level(ms(0)).capacity, 999.0);
    }

    #[test]
    fn a_late_reader_cannot_reopen_a_counted_window() {
        let w = FixedWindow::new(2.0, Duration::from_secs(1));
        assert!(admitted(w.check(ms(1000))));
        assert!(admitted(w.check(ms(1000))));
        // A thread that read the clock in the previous window arrives late.
        let r = w.check(ms(999)).rejection().unwrap();
        assert_eq!(r.retry_after, Duration::from_millis(1001));
        assert!(admitted(w.check(ms(999) + r.retry_after)));
    }

    #[test]
    fn window_counters_count_afresh_once_their_packed_index_wraps() {
        // The word keeps 24 bits of window index: 2^23 windows of 10 ms is 23 hours.
        // Uptime or idleness past that must not read as a window still to come.
        let window = Duration::from_millis(10);
        let late = Nanos::new(((1 << 23) + 5) * 10_000_000);
        let fixed = FixedWindow::new(100.0, window);
        let sliding = SlidingWindowCounter::new(100.0, window);
        // One request per window (the quota), every other window.
        for w in [0, 2, 4] {
            let now = late + window * w;
            assert!(admitted(fixed.check(now)), "fixed, window {w}");
            assert!(admitted(sliding.check(now)), "sliding, window {w}");
        }
        // A full window still says when it ends.
        let r = fixed.check(late + window * 4).rejection().unwrap();
        assert_eq!(r.retry_after, window);
    }

    #[test]
    fn a_window_counter_idle_for_a_whole_wrap_reads_its_last_count_for_at_most_a_second() {
        // 1 ms windows, 2 requests each; the packed index wraps every 2^24 windows
        // (4.66 h) and a word up to a second (1,000 windows) ahead is a late reader's.
        const WRAP: u64 = 1 << 24;
        let window = Duration::from_millis(1);
        let full = || {
            let fixed = FixedWindow::new(2_000.0, window);
            let sliding = SlidingWindowCounter::new(2_000.0, window);
            for _ in 0..2 {
                assert!(admitted(fixed.check(ms(0))));
                assert!(admitted(sliding.check(ms(0))));
            }
            (fixed, sliding)
        };
        let retry = |d: Decision| d.rejection().map(|r| r.retry_after.as_micros());
        // Idle past half the wrap, or more than a second short of a whole wrap, or two
        // windows past it: a fresh window.
        for idle in [WRAP / 2 + 1, WRAP - 1_001, WRAP + 2, 3 * WRAP + 2] {
            let (fixed, sliding) = full();
            assert!(admitted(fixed.check(ms(idle))), "fixed, idle {idle} ms");
            assert!(admitted(sliding.check(ms(idle))), "sliding, idle {idle} ms");
        }
        // A second short of a whole wrap: the word reads as a window 1,000 ms ahead,
        // which its last count filled: refused until that window ends.
        let (fixed, sliding) = full();
        assert_eq!(retry(fixed.check(ms(WRAP - 1_000))), Some(1_001_000));
        assert_eq!(retry(sliding.check(ms(WRAP - 1_000))), Some(1_001_500));
        // Exactly a whole wrap: the last count is this window's.
        let (fixed, sliding) = full();
        assert_eq!(retry(fixed.check(ms(WRAP))), Some(1_000));
        assert_eq!(retry(sliding.check(ms(WRAP))), Some(1_500));
        // One window past it: the fixed window starts afresh; the sliding window weighs
        // the last count as the previous window's, for half a window here.
        let (fixed, sliding) = full();
        assert!(admitted(fixed.check(ms(WRAP + 1))));
        assert_eq!(retry(sliding.check(ms(WRAP + 1))), Some(500));
        assert!(admitted(
            sliding.check(ms(WRAP + 1) + Duration::from_micros(500))
        ));
    }

    #[test]
    fn sliding_window_weights_the_previous_window() {
        let w = SlidingWindowCounter::new(10.0, Duration::from_secs(1));
        let n = (0..20).filter(|_| admitted(w.check(ms(900)))).count();
        assert_eq!(n, 10);
        // At 1.5 s the previous window weighs half: 5 estimated, 5 more fit.
        let n = (0..20).filter(|_| admitted(w.check(ms(1500)))).count();
        assert_eq!(n, 5);
        let r = w.check(ms(1500)).rejection().unwrap();
        // prev 10 × (1 − x) + 5 + 1 ≤ 10 ⇒ x ≥ 0.6: 100 ms from now.
        assert_eq!(r.retry_after, Duration::from_millis(100));
        assert!(admitted(w.check(ms(1600))));
    }

    /// A limiter built or set at a limit no config would hold (0, below 0, no number,
    /// far below one request in 11.6 days) never panics and admits at most its first
    /// request at once, for every algorithm: a limit of 0 or below made the token
    /// bucket's rescale subtract past zero, and a NaN limit gave the window counters
    /// their largest quota. (The engine refuses such limits; `Limiter` takes them.)
    #[test]
    fn absurd_limits_never_panic_and_admit_next_to_nothing() {
        let algorithms = [
            Algorithm::TokenBucket {
                burst: Duration::from_secs(1),
            },
            Algorithm::FixedWindow {
                window: Duration::from_secs(1),
            },
            Algorithm::SlidingWindow {
                window: Duration::from_secs(1),
            },
            Algorithm::LeakyBucket { queue: 4 },
            Algorithm::Concurrency { queue: 2 },
        ];
        for limit in [0.0, -5.0, f64::NAN, 1e-300] {
            for algorithm in algorithms {
                for set_later in [false, true] {
                    let l = if set_later {
                        let l = Limiter::new(algorithm, 1.0, ms(0));
                        l.set_limit(limit, ms(0));
                        l
                    } else {
                        Limiter::new(algorithm, limit, ms(0))
                    };
                    let mut at_once = 0;
                    let mut held = Vec::new();
                    for i in 0..50 {
                        let now = ms(i * 100);
                        match l.check(now) {
                            Decision::Admit(Admit::Now) => at_once += 1,
                            Decision::Admit(admit) => held.push(admit),
                            Decision::Reject(_) => {}
                        }
                        l.set_limit(limit, now);
                    }
                    assert!(
                        at_once <= 1,
                        "{limit} {} set later {set_later}: {at_once} admitted at once",
                        algorithm.name()
                    );
                }
            }
        }
    }

    #[test]
    fn a_leaky_bucket_at_an_absurdly_low_limit_does_not_overflow() {
        // One request per ~150 years, five more may wait: the schedule passes u64.
        let b = LeakyBucket::new(2e-10, 5);
        assert!(matches!(b.check(ms(0)), Decision::Admit(Admit::Now)));
        for _ in 0..6 {
            // Never a wrapped schedule that lets a request through at once.
            match b.check(ms(1)) {
                Decision::Admit(Admit::Paced(pace)) => {
                    assert!(pace.wait(ms(1)) > Duration::from_secs(100 * 365 * 86_400))
                }
                other => assert!(other.rejection().is_some(), "{other:?}"),
            }
        }
    }

    #[test]
    fn leaky_bucket_paces_and_bounds_its_queue() {
        let b = LeakyBucket::new(10.0, 2);
        assert!(matches!(b.check(ms(0)), Decision::Admit(Admit::Now)));
        match b.check(ms(0)) {
            Decision::Admit(Admit::Paced(p)) => {
                assert_eq!(p.wait(ms(0)), Duration::from_millis(100))
            }
            other => panic!("{other:?}"),
        }
        match b.check(ms(0)) {
            Decision::Admit(Admit::Paced(p)) => {
                assert_eq!(p.wait(ms(0)), Duration::from_millis(200))
            }
            other => panic!("{other:?}"),
        }
        let r = b.check(ms(0)).rejection().unwrap();
        assert_eq!(r.reason, Reason::QueueFull);
        assert_eq!(r.retry_after, Duration::from_millis(100));
        assert!(b.check(ms(100)).is_admit());
    }

    /// The pace of a paced decision.
    fn paced(d: Decision) -> Pace {
        match d {
            Decision::Admit(Admit::Paced(p)) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_paced_request_dropped_last_gives_its_place_to_the_next() {
        let b = LeakyBucket::new(10.0, 2);
        assert!(matches!(b.check(ms(0)), Decision::Admit(Admit::Now)));
        let first = paced(b.check(ms(0)));
        let second = paced(b.check(ms(0)));
        assert_eq!(
            b.check(ms(0)).rejection().unwrap().reason,
            Reason::QueueFull
        );
        // The last scheduled leaves at 50 ms: the next request takes its 200 ms.
        assert!(b.give_back(second, ms(50)));
        let next = paced(b.check(ms(50)));
        assert_eq!(next.departure(), ms(200));
        assert_eq!(next.wait(ms(50)), Duration::from_millis(150));
        assert_eq!(
            b.check(ms(50)).rejection().unwrap().reason,
            Reason::QueueFull
        );
        // One with a request scheduled behind it keeps its place (the one behind keeps
        // its departure, 100 ms after it).
        assert!(!b.give_back(first, ms(60)));
        assert_eq!(
            b.check(ms(60)).rejection().unwrap().reason,
            Reason::QueueFull
        );
        // The one behind it, last again, gives its place back; the first's place,
        // given up while one was behind it, stays taken until 200 ms.
        assert!(b.give_back(next, ms(60)));
        assert_eq!(b.level(ms(60)).value, 1.0, "one place, to 200 ms");
        assert_eq!(paced(b.check(ms(70))).departure(), ms(200));
    }

    #[test]
    fn a_paced_request_gives_nothing_back_once_it_departed() {
        let b = LeakyBucket::new(10.0, 1);
        assert!(b.check(ms(0)).is_admit());
        let p = paced(b.check(ms(0)));
        assert_eq!(p.departure(), ms(100));
        // Dropped at its departure or after, it has left: its interval was spent.
        assert!(!b.give_back(p, ms(100)));
        assert!(b.check(ms(100)).is_admit());
        assert_eq!(
            b.check(ms(100)).rejection().unwrap().reason,
            Reason::QueueFull
        );
    }

    #[test]
    fn a_place_given_back_after_a_cut_restores_the_departure_not_the_new_pace() {
        // Scheduled at 10/s, then cut to 2/s: the given-back place is its own
        // departure, and the next request after it is spaced at the pace in force.
        let b = LeakyBucket::new(10.0, 4);
        assert!(b.check(ms(0)).is_admit());
        let p = paced(b.check(ms(0)));
        b.set_limit(2.0);
        let q = paced(b.check(ms(0)));
        assert_eq!(q.departure(), ms(200));
        // Back to front, each is the last scheduled when it leaves.
        assert!(b.give_back(q, ms(10)));
        assert!(b.give_back(p, ms(10)));
        assert_eq!(paced(b.check(ms(10))).departure(), ms(100));
        assert_eq!(paced(b.check(ms(10))).departure(), ms(600));
    }

    #[test]
    fn another_algorithm_has_no_place_to_give_back() {
        let b = LeakyBucket::new(10.0, 1);
        assert!(b.check(ms(0)).is_admit());
        let p = paced(b.check(ms(0)));
        let tb = Limiter::new(
            Algorithm::TokenBucket {
                burst: Duration::from_secs(1),
            },
            10.0,
            ms(0),
        );
        assert!(!tb.give_back(p, ms(0)));
        let leaky = Limiter::new(Algorithm::LeakyBucket { queue: 1 }, 10.0, ms(0));
        assert!(leaky.check(ms(0)).is_admit());
        let p = paced(leaky.check(ms(0)));
        assert!(leaky.give_back(p, ms(0)));
    }

    #[test]
    fn concurrency_permits_are_released_on_drop() {
        let c = Concurrency::new(2.0, 0);
        let a = c.check();
        let b = c.check();
        assert!(a.is_admit() && b.is_admit());
        assert_eq!(c.check().rejection().unwrap().reason, Reason::Concurrency);
        assert_eq!(c.level().value, 2.0);
        drop(a);
        assert!(c.check().is_admit());
    }

    fn noop_waker() -> Waker {
        Waker::noop().clone()
    }

    #[test]
    fn concurrency_queue_hands_over_permits() {
        let c = Concurrency::new(1.0, 1);
        let held = c.check();
        let Decision::Admit(Admit::Queued(mut ticket)) = c.check() else {
            panic!("expected a queue place");
        };
        assert_eq!(c.check().rejection().unwrap().reason, Reason::QueueFull);
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut ticket).poll(&mut cx).is_pending());
        drop(held);
        let Poll::Ready(permit) = Pin::new(&mut ticket).poll(&mut cx) else {
            panic!("permit not handed over");
        };
        assert_eq!(c.waiting(), 0);
        assert_eq!(c.level().value, 1.0);
        drop(permit);
        assert_eq!(c.level().value, 0.0);
    }

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicU64);

    impl std::task::Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    impl Wakes {
        fn count(&self) -> u64 {
            self.0.load(Ordering::Relaxed)
        }
    }

    /// A queued request's ticket, and the waker it is polled with.
    fn queued(c: &Concurrency) -> (Ticket, Arc<Wakes>) {
        let Decision::Admit(Admit::Queued(ticket)) = c.check() else {
            panic!("expected a queue place");
        };
        (ticket, Arc::default())
    }

    fn poll(ticket: &mut Ticket, wakes: &Arc<Wakes>) -> Poll<Permit> {
        let waker = Waker::from(Arc::clone(wakes));
        Pin::new(ticket).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn a_ticket_polled_again_takes_no_other_tickets_wake() {
        // A server polls a queued request's future again whenever its connection
        // wakes (a body chunk arriving, say), not only when the ticket is woken.
        let c = Concurrency::new(1.0, 2);
        let held = c.check();
        let (mut a, wa) = queued(&c);
        let (mut b, wb) = queued(&c);
        assert!(poll(&mut a, &wa).is_pending());
        assert!(poll(&mut a, &wa).is_pending());
        assert!(poll(&mut b, &wb).is_pending());
        drop(held);
        assert_eq!(wa.count(), 1);
        let Poll::Ready(permit) = poll(&mut a, &wa) else {
            panic!("the first in line gets the permit");
        };
        drop(permit);
        assert_eq!(wb.count(), 1, "the permit is free but B sleeps on");
        assert!(poll(&mut b, &wb).is_ready());
    }

    #[test]
    fn raising_the_limit_wakes_the_waiters_it_lets_in() {
        let c = Concurrency::new(1.0, 3);
        let _held = c.check();
        let mut waiting: Vec<_> = (0..3).map(|_| queued(&c)).collect();
        for (t, w) in &mut waiting {
            assert!(poll(t, w).is_pending());
        }
        c.set_limit(4.0);
        let mut permits = Vec::new();
        for (t, w) in &mut waiting {
            assert!(w.count() >= 1, "a waiter the new limit lets in sleeps on");
            let Poll::Ready(permit) = poll(t, w) else {
                panic!("a woken waiter gets a permit");
            };
            permits.push(permit);
        }
        assert_eq!((c.level().value, c.waiting()), (4.0, 0));
    }

    #[test]
    fn a_woken_ticket_dropped_passes_its_turn_on() {
        let c = Concurrency::new(1.0, 2);
        let held = c.check();
        let (mut a, wa) = queued(&c);
        let (mut b, wb) = queued(&c);
        assert!(poll(&mut a, &wa).is_pending());
        assert!(poll(&mut b, &wb).is_pending());
        drop(held);
        assert_eq!((wa.count(), wb.count()), (1, 0));
        drop(a);
        assert_eq!(wb.count(), 1);
        assert!(poll(&mut b, &wb).is_ready());
    }

    #[test]
    fn a_woken_ticket_taking_its_permit_wakes_no_one_else() {
        // The executor polls what was woken, and only that.
        let c = Concurrency::new(1.0, 3);
        let held = c.check();
        let mut line: Vec<_> = (0..3).map(|_| queued(&c)).collect();
        for (t, w) in &mut line {
            assert!(poll(t, w).is_pending());
        }
        drop(held);
        let (a, wa) = &mut line[0];
        assert_eq!(wa.count(), 1);
        let Poll::Ready(permit) = poll(a, wa) else {
            panic!("the first in line gets the permit");
        };
        let woken = |line: &[(Ticket, Arc<Wakes>)]| -> Vec<u64> {
            line[1..].iter().map(|(_, w)| w.count()).collect()
        };
        assert_eq!(woken(&line), [0, 0], "no permit is free: nobody is woken");
        for (t, w) in &mut line[1..] {
            if w.count() > 0 {
                assert!(poll(t, w).is_pending());
            }
        }
        drop(permit);
        assert_eq!(woken(&line), [1, 0], "the second in line is next");
    }

    #[test]
    fn dropping_a_ticket_frees_its_place() {
        let c = Concurrency::new(0.0, 1);
        let t = c.check();
        assert!(t.is_admit());
        assert_eq!(c.check().rejection().unwrap().reason, Reason::QueueFull);
        drop(t);
        assert!(c.check().is_admit());
    }

    #[test]
    fn a_limiter_fits_in_32_bytes() {
        // Kept per route, and for its shadow and overflow limiters.
        assert!(
            std::mem::size_of::<Limiter>() <= 32,
            "{}",
            std::mem::size_of::<Limiter>()
        );
    }

    #[test]
    fn packed_word_rolls_forward() {
        let p = Packed {
            idx: 5,
            prev: 3,
            cur: 7,
        };
        assert_eq!(Packed::load(p.store()), p);
        assert_eq!(
            p.at(6, 1),
            Packed {
                idx: 6,
                prev: 7,
                cur: 0
            }
        );
        assert_eq!(
            p.at(8, 1),
            Packed {
                idx: 8,
                prev: 0,
                cur: 0
            }
        );
        let wrap = Packed {
            idx: IDX_MASK,
            prev: 0,
            cur: 4,
        };
        assert_eq!(
            wrap.at(0, 1),
            Packed {
                idx: 0,
                prev: 4,
                cur: 0
            }
        );
        // An older window index sees the newer word unchanged, if at most `late` older.
        assert_eq!(p.at(4, 1), p);
        assert_eq!(p.at(3, 2), p);
        assert_eq!(
            p.at(3, 1),
            Packed {
                idx: 3,
                prev: 0,
                cur: 0
            }
        );
        assert_eq!(
            Packed {
                idx: 0,
                prev: 1,
                cur: 2
            }
            .at(IDX_MASK, 1),
            Packed {
                idx: 0,
                prev: 1,
                cur: 2
            }
        );
    }
}
