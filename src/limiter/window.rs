//! The window-counting limiters: a fixed window and the sliding-window counter, each
//! on one packed word ([`words`] holds their arithmetic).

use super::{words, Decision, Level};
use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

/// The limit and window length shared by the two window-counting limiters.
#[derive(Debug)]
struct WindowQuota {
    limit_bits: AtomicU64,
    /// Window length in milliseconds (32 bits keep a [`Limiter`](super::Limiter) at 32 bytes).
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

/// Copies `from`'s counts into `to` if both count windows of the same length (each
/// word keeps its window's start, in windows of its own length). Whether it did.
fn copy_counts(to: (&AtomicU64, &WindowQuota), from: (&AtomicU64, &WindowQuota)) -> bool {
    if to.1.window_ms != from.1.window_ms {
        return false;
    }
    to.0.store(from.0.load(Ordering::Acquire), Ordering::Release);
    true
}

/// Counts requests per fixed window; admits `limit × window` per window.
#[derive(Debug)]
pub struct FixedWindow {
    word: AtomicU64,
    quota: WindowQuota,
}

impl FixedWindow {
    /// A counter empty at `now` (the window is kept to the millisecond).
    pub fn new(limit: f64, window: Duration, now: Nanos) -> Self {
        let quota = WindowQuota::new(limit, window);
        FixedWindow {
            word: AtomicU64::new(words::empty_at(quota.window_ns(), now)),
            quota,
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

    /// Takes the counts of `from`, a counter of a route a reload rebuilds, if its
    /// window has the same length. Whether it took them.
    pub(crate) fn copy_from(&self, from: &FixedWindow) -> bool {
        copy_counts((&self.word, &self.quota), (&from.word, &from.quota))
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
    /// A counter empty at `now` (the window is kept to the millisecond).
    pub fn new(limit: f64, window: Duration, now: Nanos) -> Self {
        let quota = WindowQuota::new(limit, window);
        SlidingWindowCounter {
            word: AtomicU64::new(words::empty_at(quota.window_ns(), now)),
            quota,
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

    /// Takes the counts of `from`, a counter of a route a reload rebuilds, if its
    /// window has the same length. Whether it took them.
    pub(crate) fn copy_from(&self, from: &SlidingWindowCounter) -> bool {
        copy_counts((&self.word, &self.quota), (&from.word, &from.quota))
    }

    /// The weighted count at `now`, and the quota.
    pub fn level(&self, now: Nanos) -> Level {
        Level {
            value: words::sliding_count(&self.word, self.quota.window_ns(), now),
            capacity: self.quota.quota(),
        }
    }
}
