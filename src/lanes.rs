//! Lane counters: monotonic counters that the hot path adds to without a locked
//! instruction.
//!
//! A locked read-modify-write (`fetch_add`, CAS) costs about 10 ns on this project's
//! machines even uncontended, and every request would pay one per counter. Instead,
//! each of the first [`OWNED_LANES`] threads that count anything claims a lane of its
//! own, process-wide, and adds with a plain load and store to its lane's slot: nobody
//! else writes there. Threads beyond that share one more lane with atomic adds. A
//! lane is given back when its thread exits. Readers sum the lanes; the sums only
//! grow, so a reader that wants a difference keeps the last sum it saw.
//!
//! A read is relaxed: an add on another core may be seen a moment later. Every add is
//! seen once the adding thread has been joined, or after any other synchronisation.

use crate::sync::{AtomicU64, AtomicU8, Ordering};
use std::cell::Cell;

/// Lanes owned by one thread each. Gateways run about one busy thread per core.
pub const OWNED_LANES: usize = 4;

/// Counters per lane: one cache line of `u64`s.
pub const COUNTERS: usize = 8;

/// Which owned lanes are taken, one bit each.
#[cfg(not(loom))]
static TAKEN: AtomicU8 = AtomicU8::new(0);
// Loom's atomics have no `const fn new`; its statics start afresh in each execution.
#[cfg(loom)]
loom::lazy_static! {
    static ref TAKEN: AtomicU8 = AtomicU8::new(0);
}

/// [`LANE`] before the thread first counts.
const UNCLAIMED: u8 = u8::MAX;
/// [`LANE`] of a thread that found no owned lane free, or whose claim was released.
const SHARED: u8 = OWNED_LANES as u8;

#[cfg(not(loom))]
thread_local! {
    /// This thread's lane: const-initialised with no destructor, so reading it is a
    /// plain thread-local load on the hot path.
    static LANE: Cell<u8> = const { Cell::new(UNCLAIMED) };
    /// The claim behind `LANE`, released (and `LANE` reset) when the thread exits.
    static CLAIM: Claim = Claim::take();
}
// The same under loom, whose thread-locals live per modelled thread (with no `const`
// form).
#[cfg(loom)]
loom::thread_local! {
    static LANE: Cell<u8> = Cell::new(UNCLAIMED);
    static CLAIM: Claim = Claim::take();
}

/// A thread's claim on a lane, released when the thread exits.
struct Claim(Option<usize>);

impl Claim {
    fn take() -> Claim {
        let got = TAKEN.fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
            let free = (!taken).trailing_zeros() as usize;
            (free < OWNED_LANES).then(|| taken | (1 << free))
        });
        Claim(got.ok().map(|before| (!before).trailing_zeros() as usize))
    }
}

// Under loom a modelled thread keeps its lane to the end of the execution: loom drops
// thread-locals where its statics (`TAKEN`) may be gone already.
#[cfg(not(loom))]
impl Drop for Claim {
    fn drop(&mut self) {
        // Counting after this (from another thread-local's destructor) goes to the
        // shared lane, not to a lane the next owner may already hold.
        LANE.set(SHARED);
        if let Some(lane) = self.0 {
            TAKEN.fetch_and(!(1u8 << lane), Ordering::AcqRel);
        }
    }
}

/// This thread's own lane, or `None` if every owned lane is taken.
#[inline]
fn own_lane() -> Option<usize> {
    let lane = LANE.with(Cell::get);
    if usize::from(lane) < OWNED_LANES {
        Some(usize::from(lane))
    } else if lane == UNCLAIMED {
        claim_lane()
    } else {
        None
    }
}

/// First count on this thread: claims a lane (or the shared one) for good.
#[cold]
fn claim_lane() -> Option<usize> {
    let lane = CLAIM.try_with(|c| c.0).ok().flatten();
    LANE.with(|l| l.set(lane.map_or(SHARED, |l| l as u8)));
    lane
}

/// One lane: a cache line of counters.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Lane([AtomicU64; COUNTERS]);

/// [`COUNTERS`] monotonic counters, split in lanes.
#[derive(Debug, Default)]
pub struct LaneCounters {
    /// `OWNED_LANES` owned lanes, then the shared one.
    lanes: [Lane; OWNED_LANES + 1],
}

impl LaneCounters {
    /// Adds one to counter `counter` (< [`COUNTERS`]; there is no other, and adding
    /// to one past the last counts nothing).
    #[inline]
    pub fn add(&self, counter: usize) {
        match own_lane() {
            // `own_lane` is below OWNED_LANES: the lane is there.
            Some(lane) => {
                if let Some(c) = self.lanes[lane].0.get(counter) {
                    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                }
            }
            None => {
                if let Some(c) = self.lanes[OWNED_LANES].0.get(counter) {
                    c.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Everything ever added to counter `counter` (0 past the last).
    pub fn sum(&self, counter: usize) -> u64 {
        self.lanes
            .iter()
            .filter_map(|l| l.0.get(counter))
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_threads_count_exactly() {
        let c = LaneCounters::default();
        // More threads than owned lanes: some share the atomic lane.
        std::thread::scope(|s| {
            for _ in 0..OWNED_LANES * 2 {
                s.spawn(|| {
                    for i in 0..10_000 {
                        c.add(i % 2);
                    }
                });
            }
        });
        assert_eq!(c.sum(0), 40_000);
        assert_eq!(c.sum(1), 40_000);
    }

    #[test]
    fn counts_stay_exact_as_threads_come_and_go() {
        // Threads that exit give their lane back; the next owner continues from the
        // value its predecessor left (other tests may hold lanes meanwhile).
        let c = LaneCounters::default();
        for round in 0..OWNED_LANES * 4 {
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        for _ in 0..1_000 {
                            c.add(3);
                        }
                    });
                }
            });
            assert_eq!(c.sum(3), (round as u64 + 1) * 2_000);
        }
    }

    /// A counter past the last is none: adding to it counts nothing (on an owned lane
    /// and on the shared one), and its sum is 0. It indexed past the lane and panicked.
    #[test]
    fn a_counter_past_the_last_counts_nothing_and_panics_not() {
        let c = LaneCounters::default();
        c.add(COUNTERS);
        std::thread::scope(|s| {
            for _ in 0..OWNED_LANES * 2 {
                s.spawn(|| c.add(usize::MAX));
            }
        });
        assert_eq!(c.sum(COUNTERS), 0);
        assert_eq!(c.sum(usize::MAX), 0);
        assert_eq!((0..COUNTERS).map(|i| c.sum(i)).sum::<u64>(), 0);
    }

    #[test]
    fn a_claim_is_released_on_drop() {
        let claim = Claim::take();
        if let Some(lane) = claim.0 {
            assert_ne!(TAKEN.load(Ordering::Acquire) & (1 << lane), 0);
        }
        drop(claim);
    }
}
