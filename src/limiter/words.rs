//! The fixed-window, sliding-window and leaky-bucket decisions on their one state
//! word, with the parameters passed in: the arithmetic of [`FixedWindow`](super::FixedWindow),
//! [`SlidingWindowCounter`](super::SlidingWindowCounter) and [`LeakyBucket`](super::LeakyBucket), shared with the engine's per-key
//! states, which keep the same word beside their own bookkeeping (as [`gcra`](super::gcra) is for
//! the token bucket).

use super::{reject, Admit, Decision, Pace, Reason};
use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

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
            // Saturating: a word counted a whole wrap of the index earlier reads as
            // ahead too, and its window, seen from the last ones 64 bits count, ends
            // past them.
            (now - now % window_ns).saturating_add(ahead * window_ns)
        }
    }
}

/// Nanoseconds from `now` to the end of the window of `at` (`now`, or the start of
/// a word's window ahead of it): in differences, which hold where the window's end
/// is past what 64 bits count.
fn to_window_end(at: u64, now: u64, window_ns: u64) -> u64 {
    window_ns - at % window_ns + (at - now)
}

/// How late a reader of a window word may be (from its clock read to its update):
/// later, its window index reads as a new window, not as an older one.
const LATE_NS: u64 = 1_000_000_000;

/// [`LATE_NS`] in windows of `window_ns` (at least one).
fn late_windows(window_ns: u64) -> u64 {
    (LATE_NS / window_ns).max(1)
}

/// A window kept to the millisecond in 32 bits (at least 1 ms).
pub(crate) fn window_ms(window: Duration) -> u32 {
    u32::try_from(window.as_millis()).unwrap_or(u32::MAX).max(1)
}

/// A window word that has counted nothing, in the window of `now`. (A word of 0 is
/// window index 0: a first request in the last `late` windows before the index wraps
/// would read it as a window still to come and count there, into the window 0 it then
/// reached with that count.)
pub(crate) fn empty_at(window_ns: u64, now: Nanos) -> u64 {
    Packed {
        idx: now.as_u64() / window_ns.max(1),
        prev: 0,
        cur: 0,
    }
    .store()
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
            return reject(to_window_end(at, now.as_u64(), window_ns), Reason::Limit);
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

/// Fixed window: the nanoseconds from `now` until [`fixed`] would count a request
/// (0: it would now), counting none.
pub(crate) fn fixed_wait(word: &AtomicU64, quota: u64, window_ns: u64, now: Nanos) -> u64 {
    let idx = (now.as_u64() / window_ns) & IDX_MASK;
    let late = late_windows(window_ns);
    let p = Packed::load(word.load(Ordering::Relaxed)).at(idx, late);
    if p.cur < quota {
        return 0;
    }
    let at = p.effective_now(now.as_u64(), window_ns, late);
    to_window_end(at, now.as_u64(), window_ns)
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

/// Sliding window: whether one more request fits the `quota` at `now`, weighing
/// the previous window by what is left of the current one: `prev × (w − into) +
/// (cur + 1) × w ≤ quota × w`, in integers (products in 128 bits: a count of 20
/// bits times a window of up to 52), so that it agrees to the nanosecond with
/// [`retry_after`], which solves the same inequality.
fn fits(p: Packed, w: u64, now: u64, quota: u64) -> bool {
    let Some(room) = quota.checked_sub(p.cur + 1) else {
        return false;
    };
    u128::from(p.prev) * u128::from(w - now % w) <= u128::from(room) * u128::from(w)
}

/// The most nanoseconds of a window of `w` that a previous count of `prev` may
/// still overlap so that it weighs at most `room` requests: `⌊room × w ÷ prev⌋`
/// (a previous count of 0 weighs nothing over any of it).
fn overlap_within(prev: u64, room: u64, w: u64) -> u64 {
    if prev == 0 {
        return w;
    }
    // In 64 bits but for a product that needs more (a window of hours): a 128-bit
    // division is a call into the runtime library.
    let most = match room.checked_mul(w) {
        Some(product) => product / prev,
        None => {
            u64::try_from(u128::from(room) * u128::from(w) / u128::from(prev)).unwrap_or(u64::MAX)
        }
    };
    most.min(w)
}

/// Sliding window: counts one request at `now`, or says when the weighted count
/// will allow it. `quota` is whole ([`quota`]).
#[inline]
pub(crate) fn sliding(word: &AtomicU64, quota: f64, window_ns: u64, now: Nanos) -> Decision {
    let now = now.as_u64();
    let quota = quota as u64;
    let idx = (now / window_ns) & IDX_MASK;
    let late = late_windows(window_ns);
    let mut seen = word.load(Ordering::Relaxed);
    loop {
        let p = Packed::load(seen).at(idx, late);
        let at = p.effective_now(now, window_ns, late);
        if !fits(p, window_ns, at, quota) {
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

/// Sliding window: the nanoseconds from `now` until [`sliding`] would count a
/// request (0: it would now), counting none.
pub(crate) fn sliding_wait(word: &AtomicU64, quota: f64, window_ns: u64, now: Nanos) -> u64 {
    let now = now.as_u64();
    let quota = quota as u64;
    let idx = (now / window_ns) & IDX_MASK;
    let late = late_windows(window_ns);
    let p = Packed::load(word.load(Ordering::Relaxed)).at(idx, late);
    let at = p.effective_now(now, window_ns, late);
    if fits(p, window_ns, at, quota) {
        0
    } else {
        retry_after(p, window_ns, at, quota) + (at - now)
    }
}

/// Sliding window: the nanoseconds from `now` until [`fits`] holds, a request
/// that does not fit now: later in this window, once the previous count weighs
/// little enough, or in the next, where the current count becomes the weighted
/// previous one. Solved in integers, the first nanosecond at which it holds.
fn retry_after(p: Packed, w: u64, now: u64, quota: u64) -> u64 {
    let into = now % w;
    let to_next = w - into;
    if let Some(room) = quota.checked_sub(p.cur + 1) {
        // prev × (w − x) ≤ room × w from x = w − ⌊room × w ÷ prev⌋ on; past the
        // window's end, the next window's start, where it fits (cur ≤ quota − 1).
        let x = w - overlap_within(p.prev, room, w);
        return (x - into).min(to_next);
    }
    // Next window, with nothing counted in it: cur × (w − x) ≤ (quota − 1) × w.
    let x = if p.cur > 0 {
        w - overlap_within(p.cur, quota.saturating_sub(1), w)
    } else {
        0
    };
    to_next + x
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
/// admitted with the delay it must wait, or rejected with `queue_full` when that
/// wait would pass `queue × t` (`queue` requests waiting, at a steady `t`).
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
        // A schedule that would pass what the word holds has no place left: refused,
        // not saturated (every later request then read as waiting no longer than
        // the saturated `max_wait`, and the queue had no bound). At 1e-6 req/s a
        // queue of 18,447 reaches it.
        let Some(next) = start.checked_add(t) else {
            return reject(wait.max(1), Reason::QueueFull);
        };
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

#[cfg(test)]
mod tests {
    use super::{Packed, IDX_MASK};

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
