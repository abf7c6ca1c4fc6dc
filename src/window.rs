//! The slotted sliding window that measures a route's demand and its rate of change (ROC).
//!
//! A window of `window` seconds is a ring of fixed slots (100 ms by default), one
//! counter per slot, split into an earlier and a later half. Memory is O(slots),
//! never O(requests).
//!
//! The window has two parts with different owners:
//! - [`SlotCounter`] is the hot path. Every request adds one to the arrivals of the
//!   slot that is accumulating, with a plain store on its thread's own cache line
//!   ([`crate::lanes`]): no locked instruction, no lock, no allocation. Whether the
//!   slot is over is one load and a comparison.
//! - [`SlotRing`] holds the completed slots and the two half-window sums. It is plain
//!   data, advanced at slot rollover by the one request that wins the rollover (the
//!   engine keeps it behind a `try_lock` that no other request waits for). Each
//!   completed slot yields one [`RocSample`].
//!
//! Stale slots never count: the ring is advanced by the number of slots that really
//! elapsed (a gap longer than the window empties it), so no background task is needed.
//!
//! ```
//! use rocgate::clock::Nanos;
//! use rocgate::window::{SlotCounter, SlotRing, WindowSpec};
//! use std::time::Duration;
//!
//! let spec = WindowSpec::new(Duration::from_secs(2), Duration::from_millis(500)).unwrap();
//! let counter = SlotCounter::new(&spec);
//! let mut ring = SlotRing::new(&spec);
//! // 10 arrivals in each of the first two slots, 40 in each of the next two.
//! for slot in 0..4u64 {
//!     let n = if slot < 2 { 10 } else { 40 };
//!     for _ in 0..n {
//!         counter.add();
//!     }
//!     let now = Nanos::from_millis(500 * (slot + 1));
//!     ring.advance(&counter, counter.slot_index(now), |_| {});
//! }
//! let s = ring.sample();
//! assert_eq!((s.n_prev, s.n_recent), (20, 80));
//! assert_eq!(s.rate_prev_rps, 20.0);
//! assert_eq!(s.rate_recent_rps, 80.0);
//! assert_eq!(s.roc, 60.0);
//! ```

use crate::clock::{duration_nanos, Nanos};
use crate::lanes::LaneCounters;
use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

/// The validated shape of a window: its length and its slot length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    slot_ns: u64,
    slots: usize,
}

/// Why a window shape was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WindowError {
    /// The slot length is zero.
    #[error("slot must be longer than zero")]
    ZeroSlot,
    /// The slot is shorter than [`WindowSpec::SHORTEST_SLOT`].
    #[error("slot must be at least 1ms, got {slot:?}")]
    SlotTooShort {
        /// The slot length.
        slot: Duration,
    },
    /// The slot does not divide the window into a whole number of slots.
    #[error("slot ({slot:?}) must divide the window ({window:?}) into a whole number of slots")]
    NotDivisible {
        /// The window length.
        window: Duration,
        /// The slot length.
        slot: Duration,
    },
    /// The window holds too few slots, or an odd number, so it cannot be split in halves.
    #[error("window must hold an even number of at least 4 slots, got {slots}")]
    BadSlotCount {
        /// The number of slots the window would hold.
        slots: u64,
    },
    /// More than 100,000 slots: memory would no longer be small.
    #[error("window must hold at most 100000 slots, got {slots}")]
    TooManySlots {
        /// The number of slots the window would hold.
        slots: u64,
    },
}

impl WindowSpec {
    /// The shortest slot: a slot holds the arrivals of a span of time, and one much
    /// shorter than a request's own handling (a window of 4 ns) measures nothing a
    /// controller could act on, nor can a simulation step through its slots.
    pub const SHORTEST_SLOT: Duration = Duration::from_millis(1);

    /// A window of `window` split into slots of `slot`.
    ///
    /// The slot must be at least [`SHORTEST_SLOT`](Self::SHORTEST_SLOT) and divide the
    /// window into an even number of at least 4 slots.
    pub fn new(window: Duration, slot: Duration) -> Result<Self, WindowError> {
        let slot_ns = duration_nanos(slot);
        let window_ns = duration_nanos(window);
        if slot_ns == 0 {
            return Err(WindowError::ZeroSlot);
        }
        if slot < Self::SHORTEST_SLOT {
            return Err(WindowError::SlotTooShort { slot });
        }
        if window_ns % slot_ns != 0 {
            return Err(WindowError::NotDivisible { window, slot });
        }
        let slots = window_ns / slot_ns;
        if slots < 4 || slots % 2 != 0 {
            return Err(WindowError::BadSlotCount { slots });
        }
        if slots > 100_000 {
            return Err(WindowError::TooManySlots { slots });
        }
        Ok(WindowSpec {
            slot_ns,
            slots: slots as usize,
        })
    }

    /// The slot length.
    pub fn slot(&self) -> Duration {
        Duration::from_nanos(self.slot_ns)
    }

    /// The whole window's length.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.slot_ns * self.slots as u64)
    }

    /// The length of one half-window.
    pub fn half(&self) -> Duration {
        self.window() / 2
    }

    /// Number of slots in the window.
    pub fn slots(&self) -> usize {
        self.slots
    }
}

impl Default for WindowSpec {
    /// 6 s of 100 ms slots.
    fn default() -> Self {
        WindowSpec {
            slot_ns: 100_000_000,
            slots: 60,
        }
    }
}

/// How ROC is expressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RocMode {
    /// `rate_recent − rate_prev`, in req/s per half-window.
    #[default]
    Absolute,
    /// `(rate_recent − rate_prev) / max(rate_prev, min_rps)`: one threshold for routes
    /// of very different volume (1.0 means demand doubled).
    Relative,
}

/// The window's reading after a completed slot.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RocSample {
    /// Arrivals in the earlier half-window.
    pub n_prev: u64,
    /// Arrivals in the later half-window.
    pub n_recent: u64,
    /// Demand in the earlier half, req/s.
    pub rate_prev_rps: f64,
    /// Demand in the later half, req/s.
    pub rate_recent_rps: f64,
    /// `rate_recent − rate_prev`, req/s per half-window.
    pub roc: f64,
}

impl RocSample {
    /// ROC relative to the earlier half's rate, floored at `min_rps` so a quiet route
    /// cannot divide by almost nothing. With neither (an earlier half without
    /// requests and a `min_rps` of 0, which only a route in absolute mode may have) it
    /// has no value: NaN, or 0 where demand did not change either. (Divided by the
    /// least positive number instead, it was infinite, and a gauge of it read +Inf.)
    pub fn relative_roc(&self, min_rps: f64) -> f64 {
        let base = self.rate_prev_rps.max(min_rps);
        match (base > 0.0, self.roc == 0.0) {
            (true, _) => self.roc / base,
            (false, true) => 0.0,
            (false, false) => f64::NAN,
        }
    }

    /// ROC in the given mode.
    pub fn roc_in(&self, mode: RocMode, min_rps: f64) -> f64 {
        match mode {
            RocMode::Absolute => self.roc,
            RocMode::Relative => self.relative_roc(min_rps),
        }
    }
}

/// The lock-free front of the window: counts arrivals into the slot that is
/// accumulating, in [`LaneCounters`] (a plain store on the thread's own lane).
///
/// Its lane counters have room for more: the engine counts rejections there too
/// ([`ARRIVALS`] is the window's).
#[derive(Debug)]
pub struct SlotCounter {
    slot_ns: u64,
    /// Index (time / slot) of the slot being accumulated.
    current: AtomicU64,
    /// When that slot ends, ns: `(current + 1) × slot`.
    boundary: AtomicU64,
    counters: LaneCounters,
}

/// The lane counter that counts arrivals.
pub const ARRIVALS: usize = 0;

impl SlotCounter {
    /// A counter for windows of this shape, accumulating slot 0.
    pub fn new(spec: &WindowSpec) -> Self {
        SlotCounter {
            slot_ns: spec.slot_ns,
            current: AtomicU64::new(0),
            boundary: AtomicU64::new(spec.slot_ns),
            counters: LaneCounters::default(),
        }
    }

    /// The index of the slot that contains `now`.
    #[inline]
    pub fn slot_index(&self, now: Nanos) -> u64 {
        now.as_u64() / self.slot_ns
    }

    /// Whether `now` lies past the slot being accumulated, so the ring must advance
    /// before an arrival at `now` is counted. One load and a comparison.
    #[inline]
    pub fn needs_roll(&self, now: Nanos) -> bool {
        now.as_u64() >= self.boundary.load(Ordering::Acquire)
    }

    /// Counts one arrival in the accumulating slot.
    #[inline]
    pub fn add(&self) {
        self.counters.add(ARRIVALS);
    }

    /// The lane counters (arrivals in [`ARRIVALS`], the rest free for the caller).
    pub fn counters(&self) -> &LaneCounters {
        &self.counters
    }

    /// Every arrival counted so far (a relaxed read, for snapshots).
    pub fn arrivals(&self) -> u64 {
        self.counters.sum(ARRIVALS)
    }

    /// The slot length, ns.
    pub fn slot_ns(&self) -> u64 {
        self.slot_ns
    }

    /// Index of the slot being accumulated.
    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Acquire)
    }
}

/// The completed slots of a window and their half-window sums. Plain data, advanced
/// by the holder of the route's rollover lock.
#[derive(Clone, Debug)]
pub struct SlotRing {
    slot_secs: f64,
    counts: Box<[u32]>,
    /// Position of the oldest slot in `counts`.
    head: usize,
    prev_sum: u64,
    recent_sum: u64,
    /// The counter's arrivals already moved into the ring.
    taken: u64,
}

impl SlotRing {
    /// An empty ring for windows of this shape.
    pub fn new(spec: &WindowSpec) -> Self {
        SlotRing {
            slot_secs: spec.slot_ns as f64 / 1e9,
            counts: vec![0; spec.slots].into_boxed_slice(),
            head: 0,
            prev_sum: 0,
            recent_sum: 0,
            taken: 0,
        }
    }

    fn half(&self) -> usize {
        self.counts.len() / 2
    }

    /// A ring for windows of this shape holding `counts`, the completed slots' counts,
    /// oldest first, the last of them the last completed slot (a count past
    /// `u32::MAX` held as that): a window whose counts are kept elsewhere (a shared
    /// store's), read as the engine reads its own ([`held`](Self::held)).
    pub fn from_counts(spec: &WindowSpec, counts: impl IntoIterator<Item = u64>) -> Self {
        let mut ring = SlotRing::new(spec);
        for count in counts {
            ring.push(u32::try_from(count).unwrap_or(u32::MAX));
        }
        ring
    }

    /// Pushes one completed slot's count, dropping the oldest.
    fn push(&mut self, count: u32) {
        let n = self.counts.len();
        let half = self.half();
        let oldest = self.counts[self.head];
        let crossing = self.counts[(self.head + half) % n];
        self.prev_sum = self.prev_sum - u64::from(oldest) + u64::from(crossing);
        self.recent_sum = self.recent_sum - u64::from(crossing) + u64::from(count);
        self.counts[self.head] = count;
        self.head = (self.head + 1) % n;
    }

    /// Moves the counter's accumulated arrivals into the ring as completed slot(s) and
    /// makes `to_index` the accumulating slot. `on_slot` is called once per completed
    /// slot with the sample at that slot's end and the end time; a gap longer than the
    /// window is reported as one window of empty slots followed by one sample at the
    /// end of the gap. Does nothing if `to_index` is not later than the current slot.
    pub fn advance(
        &mut self,
        counter: &SlotCounter,
        to_index: u64,
        mut on_slot: impl FnMut(SampleAt),
    ) {
        let from = counter.current();
        if to_index <= from {
            return;
        }
        let slot_ns = counter.slot_ns;
        let arrived = counter.arrivals();
        let first = arrived.saturating_sub(self.taken);
        self.taken = arrived;
        self.push(u32::try_from(first).unwrap_or(u32::MAX));
        on_slot(SampleAt {
            at: Nanos::new((from + 1).saturating_mul(slot_ns)),
            sample: self.sample(),
        });
        let gap = to_index - from - 1;
        let replay = gap.min(self.counts.len() as u64);
        for k in 0..replay {
            self.push(0);
            on_slot(SampleAt {
                at: Nanos::new((from + 2 + k).saturating_mul(slot_ns)),
                sample: self.sample(),
            });
        }
        if gap > replay {
            on_slot(SampleAt {
                at: Nanos::new(to_index.saturating_mul(slot_ns)),
                sample: self.sample(),
            });
        }
        counter.current.store(to_index, Ordering::Release);
        counter
            .boundary
            .store((to_index + 1).saturating_mul(slot_ns), Ordering::Release);
    }

    /// The current reading over completed slots.
    pub fn sample(&self) -> RocSample {
        let half_secs = self.slot_secs * self.half() as f64;
        let rate_prev_rps = self.prev_sum as f64 / half_secs;
        let rate_recent_rps = self.recent_sum as f64 / half_secs;
        RocSample {
            n_prev: self.prev_sum,
            n_recent: self.recent_sum,
            rate_prev_rps,
            rate_recent_rps,
            roc: rate_recent_rps - rate_prev_rps,
        }
    }

    /// The readings the window will give at the ends of its next slots if each holds
    /// what the last completed one did (a spike that holds its level), one a slot,
    /// up to the one at which it holds nothing else (each after it reads the same).
    pub fn held(&self) -> impl Iterator<Item = RocSample> + '_ {
        let n = self.counts.len();
        let half = self.half();
        let half_secs = self.slot_secs * half as f64;
        let at = move |i: usize| u64::from(self.counts[(self.head + i) % n]);
        let level = at(n - 1);
        // The slot `i` places after the oldest, the held ones past the ring.
        let slot = move |i: usize| if i < n { at(i) } else { level };
        let (mut prev, mut recent) = (self.prev_sum, self.recent_sum);
        (0..n).map(move |m| {
            let crossing = slot(m + half);
            prev = prev - slot(m) + crossing;
            recent = recent - crossing + level;
            let (rate_prev_rps, rate_recent_rps) =
                (prev as f64 / half_secs, recent as f64 / half_secs);
            RocSample {
                n_prev: prev,
                n_recent: recent,
                rate_prev_rps,
                rate_recent_rps,
                roc: rate_recent_rps - rate_prev_rps,
            }
        })
    }

    /// The largest count in any run of `span_slots` consecutive completed slots.
    pub fn max_run(&self, span_slots: usize) -> u64 {
        let n = self.counts.len();
        let span = span_slots.clamp(1, n);
        let at = |i: usize| u64::from(self.counts[(self.head + i) % n]);
        let mut run: u64 = (0..span).map(at).sum();
        let mut best = run;
        for i in span..n {
            run = run + at(i) - at(i - span);
            best = best.max(run);
        }
        best
    }
}

/// A sample together with the time at which its slot ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleAt {
    /// End of the completed slot.
    pub at: Nanos,
    /// The window's reading at that time.
    pub sample: RocSample,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WindowSpec {
        WindowSpec::new(Duration::from_secs(1), Duration::from_millis(100)).unwrap()
    }

    fn fill(counter: &SlotCounter, ring: &mut SlotRing, now: Nanos, n: u64) -> Vec<SampleAt> {
        let mut out = Vec::new();
        if counter.needs_roll(now) {
            ring.advance(counter, counter.slot_index(now), |s| out.push(s));
        }
        for _ in 0..n {
            counter.add();
        }
        out
    }

    #[test]
    fn spec_rejects_bad_shapes() {
        let ms = Duration::from_millis;
        assert_eq!(WindowSpec::new(ms(1000), ms(0)), Err(WindowError::ZeroSlot));
        // 4 slots of 1 ns passed, and no simulation could step through a minute of them.
        let ns = Duration::from_nanos;
        assert_eq!(
            WindowSpec::new(ns(4), ns(1)),
            Err(WindowError::SlotTooShort { slot: ns(1) })
        );
        assert!(WindowSpec::new(ms(4), ms(1)).is_ok());
        assert!(matches!(
            WindowSpec::new(ms(1000), ms(300)),
            Err(WindowError::NotDivisible { .. })
        ));
        assert_eq!(
            WindowSpec::new(ms(1000), ms(200)),
            Err(WindowError::BadSlotCount { slots: 5 })
        );
        assert_eq!(
            WindowSpec::new(ms(200), ms(100)),
            Err(WindowError::BadSlotCount { slots: 2 })
        );
        assert!(WindowSpec::new(ms(400), ms(100)).is_ok());
        assert_eq!(WindowSpec::default().slots(), 60);
    }

    #[test]
    fn halves_and_roc_over_completed_slots_only() {
        let spec = spec();
        let counter = SlotCounter::new(&spec);
        let mut ring = SlotRing::new(&spec);
        // Slots 0..5 carry 2 arrivals each, slots 5..10 carry 6 each.
        for slot in 0..10u64 {
            fill(
                &counter,
                &mut ring,
                Nanos::from_millis(slot * 100),
                if slot < 5 { 2 } else { 6 },
            );
        }
        // Slot 9 is still accumulating: not counted yet; the oldest ring slot is still empty.
        let s = ring.sample();
        assert_eq!((s.n_prev, s.n_recent), (8, 26));
        let samples = fill(&counter, &mut ring, Nanos::from_millis(1000), 0);
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].at, Nanos::from_millis(1000));
        let s = ring.sample();
        assert_eq!((s.n_prev, s.n_recent), (10, 30));
        assert!((s.rate_prev_rps - 20.0).abs() < 1e-9);
        assert!((s.rate_recent_rps - 60.0).abs() < 1e-9);
        assert!((s.roc - 40.0).abs() < 1e-9);
        assert!((s.relative_roc(5.0) - 2.0).abs() < 1e-9);
        assert!((s.roc_in(RocMode::Relative, 100.0) - 0.4).abs() < 1e-9);
        assert_eq!(counter.arrivals(), 40);
    }

    #[test]
    fn a_gap_longer_than_the_window_empties_it() {
        let spec = spec();
        let counter = SlotCounter::new(&spec);
        let mut ring = SlotRing::new(&spec);
        fill(&counter, &mut ring, Nanos::ZERO, 50);
        let samples = fill(&counter, &mut ring, Nanos::from_secs(3600), 0);
        // One slot with the 50 arrivals, one window of empty slots, one sample at the end.
        assert_eq!(samples.len(), 1 + 10 + 1);
        assert_eq!(samples.last().unwrap().at, Nanos::from_secs(3600));
        assert_eq!(ring.sample(), RocSample::default());
        assert_eq!(
            counter.current(),
            counter.slot_index(Nanos::from_secs(3600))
        );
    }

    #[test]
    fn a_short_gap_replays_each_empty_slot() {
        let spec = spec();
        let counter = SlotCounter::new(&spec);
        let mut ring = SlotRing::new(&spec);
        fill(&counter, &mut ring, Nanos::ZERO, 7);
        let samples = fill(&counter, &mut ring, Nanos::from_millis(450), 0);
        let times: Vec<u64> = samples.iter().map(|s| s.at.as_u64() / 1_000_000).collect();
        assert_eq!(times, vec![100, 200, 300, 400]);
        assert_eq!(ring.sample().n_recent, 7);
    }

    #[test]
    fn max_run_finds_the_busiest_span() {
        let spec = spec();
        let counter = SlotCounter::new(&spec);
        let mut ring = SlotRing::new(&spec);
        for (slot, n) in [1u64, 9, 9, 1, 0, 0, 5, 0, 0, 0].iter().enumerate() {
            fill(
                &counter,
                &mut ring,
                Nanos::from_millis(slot as u64 * 100),
                *n,
            );
        }
        fill(&counter, &mut ring, Nanos::from_millis(1000), 0);
        assert_eq!(ring.max_run(2), 18);
        assert_eq!(ring.max_run(10), 25);
    }

    #[test]
    fn concurrent_adds_are_all_counted() {
        let spec = spec();
        let counter = SlotCounter::new(&spec);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        counter.add();
                    }
                });
            }
        });
        assert_eq!(counter.arrivals(), 40_000);
        let mut ring = SlotRing::new(&spec);
        assert!(counter.needs_roll(Nanos::from_millis(100)));
        ring.advance(&counter, 1, |_| {});
        assert!(!counter.needs_roll(Nanos::from_millis(199)));
        assert_eq!(ring.sample().n_recent, 40_000);
    }
}
