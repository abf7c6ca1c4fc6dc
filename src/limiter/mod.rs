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

mod concurrency;
pub(crate) mod gcra;
mod leaky;
mod token_bucket;
mod window;
pub(crate) mod words;

#[cfg(feature = "http")]
pub(crate) use concurrency::permits;
pub use concurrency::{Concurrency, HoldClock, Permit, Ticket, CONCURRENCY_RETRY_MAX};
pub use leaky::LeakyBucket;
pub use token_bucket::TokenBucket;
pub use window::{FixedWindow, SlidingWindowCounter};
pub use words::MAX_WINDOW_COUNT;

use crate::clock::Nanos;
use std::fmt;
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
/// So giving places back never lets the bucket pass more than one request per
/// interval, nor hold more waiting than its wait bound admits (`queue` at a steady
/// limit; see [`LeakyBucket`] for a limit changed under a queue). Giving a place back takes the `Pace`, so no place is given
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
    /// Paces output at the limit; a request waits at most `queue` intervals at the
    /// limit in force when it asks: `queue` requests waiting at a steady limit, up to
    /// `base ÷ cut × queue` just after a cut (see [`LeakyBucket`]).
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
    /// Tokens left, requests counted in the window, requests in a leaky bucket
    /// (waiting, and the last one sent while its interval runs), or in flight.
    pub value: f64,
    /// The most `value` can be (a leaky bucket's `queue + 1`, which its requests may
    /// pass after its limit is raised, scheduled at the longer interval).
    pub capacity: f64,
}

impl Level {
    /// Whether there is no room for one more request: no token left in a token
    /// bucket (whose level counts what is left), or a full window, leaky bucket or
    /// set of permits (whose levels count what is used).
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
                Limiter::FixedWindow(FixedWindow::new(limit, window, now))
            }
            Algorithm::SlidingWindow { window } => {
                Limiter::SlidingWindow(SlidingWindowCounter::new(limit, window, now))
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
            Limiter::Concurrency(l) => l.check(now),
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

    /// Takes the state `from` holds at `now`, the limiter of a route that a reload
    /// rebuilds as this one's (see [`Engine::reload`](crate::engine::Engine::reload)),
    /// kept at this limiter's limit: a token bucket the tokens (converted to its rate,
    /// clamped to its capacity: any burst), a window counter the counts of its windows
    /// (of the same length), a leaky bucket its schedule (any queue). Whether it took
    /// them: a limiter of another algorithm, or a window of another length, has none
    /// this one could take, and `concurrency`'s permits are handed over, not copied.
    pub(crate) fn copy_from(&self, from: &Limiter, now: Nanos) -> bool {
        match (self, from) {
            (Limiter::TokenBucket(to), Limiter::TokenBucket(from)) => {
                to.copy_from(from, now);
                true
            }
            (Limiter::FixedWindow(to), Limiter::FixedWindow(from)) => to.copy_from(from),
            (Limiter::SlidingWindow(to), Limiter::SlidingWindow(from)) => to.copy_from(from),
            (Limiter::LeakyBucket(to), Limiter::LeakyBucket(from)) => {
                to.copy_from(from);
                true
            }
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

#[cfg(test)]
mod tests;
