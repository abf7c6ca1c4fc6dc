//! The token bucket: GCRA on one atomic word (the default algorithm).

use super::{gcra, reject, Admit, Decision, Level, Reason};
use crate::clock::Nanos;
use crate::sync::{AtomicU32, AtomicU64};
use std::time::Duration;

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
    /// [`Limiter`](super::Limiter) at 32 bytes, which matters per key).
    pub(super) burst_ms: u32,
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

    /// Whether the bucket is at `limit` already (its rate and capacity), for the
    /// holder of the lock its changes are made under.
    pub(crate) fn is_at(&self, limit: f64) -> bool {
        self.words().is_at(gcra::params(limit, self.burst_ms))
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

    /// Takes the tokens `other` holds at `now`, clamped to this bucket's capacity,
    /// whatever either's rate. A decision on this bucket meanwhile is made before or
    /// after, as it is around a change. The engine starts a route bucket's twin so.
    pub(crate) fn copy_from(&self, other: &TokenBucket, now: Nanos) {
        self.words().copy_tat(other.words(), now);
    }

    /// Tokens left at `now` and the capacity.
    pub fn level(&self, now: Nanos) -> Level {
        self.words().level(now)
    }

    pub(super) fn words(&self) -> gcra::Words<'_> {
        gcra::Words {
            tat: &self.tat,
            emission_ns: &self.emission_ns,
            capacity: &self.capacity,
        }
    }
}
