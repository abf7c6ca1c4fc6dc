//! The leaky bucket: requests paced out at the limit, with a bounded queue.

use super::{interval_ns, words, Decision, Level, Pace};
use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};

/// Paces requests out at the limit, each after the one before it; a request waits at
/// most `queue` intervals at the limit in force when it asks, which is `queue`
/// requests waiting at a steady limit (after a cut, those scheduled before it at the
/// shorter interval may be more; after a raise, fewer take the same wait). The state
/// is one atomic word: when the next request may leave.
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
    /// rejected with `queue_full` when that wait would pass `queue` intervals.
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

    /// Takes the schedule of `from`, a bucket of a route a reload rebuilds: the next
    /// request leaves when it would have left there, at this bucket's pace and within
    /// its queue.
    pub(crate) fn copy_from(&self, from: &LeakyBucket) {
        self.next_free
            .store(from.next_free.load(Ordering::Acquire), Ordering::Release);
    }

    /// Changes the pace; requests already scheduled keep their departure times.
    pub fn set_limit(&self, limit: f64) {
        self.emission_ns
            .store(interval_ns(limit), Ordering::Relaxed);
    }

    /// The requests in the bucket at `now`: those waiting and the last one sent
    /// while its interval runs (the wait a request asking now would have, in
    /// intervals at the limit in force, rounded up), against `queue + 1`, the most
    /// at a steady limit. There is room for one more while it is under `queue + 1`:
    /// an idle bucket has room at `queue = 0`, and a request just sent fills it.
    /// After the limit is raised, the requests scheduled at the longer interval
    /// may count more than `queue + 1` until they are sent.
    pub fn level(&self, now: Nanos) -> Level {
        let t = self.emission_ns.load(Ordering::Relaxed);
        let backlog = self
            .next_free
            .load(Ordering::Relaxed)
            .saturating_sub(now.as_u64());
        Level {
            value: backlog.div_ceil(t.max(1)) as f64,
            capacity: f64::from(self.queue) + 1.0,
        }
    }
}
