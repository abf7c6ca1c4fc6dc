//! Time as the core sees it: a monotonic [`Nanos`] count and the [`Clock`] that supplies it.
//!
//! The core never reads a clock on its own: every time-dependent function takes
//! `now: Nanos` as an argument. Only adapters hold a [`Clock`]: [`MonotonicClock`] in
//! production, [`ManualClock`] in tests and in the simulator, where time moves only
//! when the caller advances it.
//!
//! ```
//! use rocgate::clock::{Clock, ManualClock, Nanos};
//! use std::time::Duration;
//!
//! let clock = ManualClock::new();
//! assert_eq!(clock.now(), Nanos::ZERO);
//! clock.advance(Duration::from_millis(250));
//! assert_eq!(clock.now(), Nanos::from_millis(250));
//! ```

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A point in time: nanoseconds since the origin of the clock that produced it.
///
/// Monotonic and `Copy`; 64 bits cover 584 years. Arithmetic saturates rather than wraps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(u64);

impl Nanos {
    /// The clock's origin.
    pub const ZERO: Nanos = Nanos(0);

    /// A time `n` nanoseconds after the origin.
    pub const fn new(n: u64) -> Self {
        Nanos(n)
    }

    /// A time `ms` milliseconds after the origin.
    pub const fn from_millis(ms: u64) -> Self {
        Nanos(ms.saturating_mul(1_000_000))
    }

    /// A time `secs` seconds after the origin.
    pub const fn from_secs(secs: u64) -> Self {
        Nanos(secs.saturating_mul(1_000_000_000))
    }

    /// A time `secs` (fractional) seconds after the origin; negative values give the origin.
    pub fn from_secs_f64(secs: f64) -> Self {
        Nanos((secs * 1e9).max(0.0) as u64)
    }

    /// Nanoseconds since the origin.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// Seconds since the origin.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// The time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Nanos) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Nanos {
    type Output = Nanos;
    fn add(self, rhs: Duration) -> Nanos {
        Nanos(self.0.saturating_add(duration_nanos(rhs)))
    }
}

impl Sub<Duration> for Nanos {
    type Output = Nanos;
    fn sub(self, rhs: Duration) -> Nanos {
        Nanos(self.0.saturating_sub(duration_nanos(rhs)))
    }
}

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.as_secs_f64())
    }
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
pub(crate) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A source of monotonic time.
pub trait Clock: Send + Sync {
    /// The current time. Never goes backwards.
    fn now(&self) -> Nanos;
}

/// The production clock: monotonic, counted from when this value was built.
///
/// Where the kernel keeps time with the CPU's time-stamp counter (Linux's
/// `current_clocksource` is `tsc`: the kernel has checked that the counters of all
/// CPUs agree and tick at a constant rate), it reads the TSC through [`quanta`],
/// scaled to nanoseconds by a calibration against the OS clock that runs once per
/// process (10–20 ms, at most 200 ms, in the first `MonotonicClock::new`): about
/// 10 ns a read against 23 ns for `Instant::now()`, and the read is most of a
/// decision's cost. Elsewhere (another clocksource such as `kvm-clock` or `hpet`,
/// another OS) it reads `std::time::Instant`: an unsynchronised TSC could step back
/// between cores and reject requests that have their tokens.
///
/// Build it once and share it: building one reads sysfs and may run CPUID, which
/// traps in a VM.
#[derive(Clone, Debug)]
pub struct MonotonicClock {
    source: Source,
}

#[derive(Clone, Debug)]
enum Source {
    Tsc {
        clock: quanta::Clock,
        origin: quanta::Instant,
    },
    Os {
        origin: std::time::Instant,
    },
}

/// Where Linux names the clocksource it keeps time with.
const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

impl MonotonicClock {
    /// A clock whose origin is the moment of this call, reading the TSC where the
    /// kernel does.
    pub fn new() -> Self {
        let tsc = std::fs::read_to_string(CLOCKSOURCE).is_ok_and(|s| s.trim() == "tsc");
        if tsc {
            Self::tsc()
        } else {
            Self::os()
        }
    }

    /// A clock reading the TSC through quanta (which itself falls back to the OS
    /// clock where the CPU does not report an invariant TSC).
    #[allow(clippy::disallowed_methods)] // the one place that reads the OS clock
    fn tsc() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.now();
        MonotonicClock {
            source: Source::Tsc { clock, origin },
        }
    }

    /// A clock reading `std::time::Instant`.
    #[allow(clippy::disallowed_methods)] // the one place that reads the OS clock
    pub fn os() -> Self {
        MonotonicClock {
            source: Source::Os {
                origin: std::time::Instant::now(),
            },
        }
    }

    /// Whether this clock reads the TSC (through quanta) rather than `Instant`.
    pub fn reads_tsc(&self) -> bool {
        matches!(self.source, Source::Tsc { .. })
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    #[allow(clippy::disallowed_methods)] // the one place that reads the OS clock
    fn now(&self) -> Nanos {
        let elapsed = match &self.source {
            Source::Tsc { clock, origin } => clock.now().saturating_duration_since(*origin),
            Source::Os { origin } => origin.elapsed(),
        };
        Nanos(duration_nanos(elapsed))
    }
}

/// A clock that moves only when told to: for tests and simulation.
///
/// Shareable across threads; every reader sees the same time.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A manual clock standing at its origin.
    pub fn new() -> Self {
        Self::default()
    }

    /// A manual clock standing at `at`.
    pub fn starting_at(at: Nanos) -> Self {
        ManualClock {
            now: AtomicU64::new(at.0),
        }
    }

    /// Moves the clock forward by `by`, saturating at the end of time (as [`Nanos`]
    /// arithmetic does) rather than wrapping back.
    pub fn advance(&self, by: Duration) {
        let by = duration_nanos(by);
        let _ = self
            .now
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the clock to `to`; a time earlier than the current one is ignored,
    /// so the clock stays monotonic.
    pub fn set(&self, to: Nanos) {
        self.now.fetch_max(to.0, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        Nanos(self.now.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward() {
        let c = ManualClock::starting_at(Nanos::from_secs(5));
        c.set(Nanos::from_secs(3));
        assert_eq!(c.now(), Nanos::from_secs(5));
        c.advance(Duration::from_millis(1500));
        assert_eq!(c.now(), Nanos::from_millis(6500));
    }

    #[test]
    fn manual_clock_saturates_instead_of_wrapping() {
        let c = ManualClock::starting_at(Nanos::from_secs(5));
        c.advance(Duration::MAX);
        assert_eq!(c.now(), Nanos::new(u64::MAX));
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now(), Nanos::new(u64::MAX));
    }

    #[test]
    fn nanos_arithmetic_saturates() {
        assert_eq!(Nanos::ZERO - Duration::from_secs(1), Nanos::ZERO);
        assert_eq!(
            Nanos::new(u64::MAX) + Duration::from_secs(1),
            Nanos::new(u64::MAX)
        );
        assert_eq!(
            Nanos::from_secs(2).saturating_since(Nanos::from_secs(3)),
            Duration::ZERO
        );
    }

    #[test]
    fn monotonic_clock_does_not_go_backwards_on_any_thread() {
        for c in [MonotonicClock::new(), MonotonicClock::os()] {
            reads_forward_on_two_threads(&c);
        }
        assert!(!MonotonicClock::os().reads_tsc());
    }

    /// One clock (and one origin) read by threads on different cores: each thread
    /// sees a non-decreasing sequence, and a clone reads the same time line.
    fn reads_forward_on_two_threads(c: &MonotonicClock) {
        let start = c.now();
        std::thread::scope(|s| {
            for _ in 0..2 {
                let c = c.clone();
                s.spawn(move || {
                    let mut last = c.now();
                    assert!(last >= start);
                    for _ in 0..100_000 {
                        let now = c.now();
                        assert!(now >= last, "{now} after {last}");
                        last = now;
                    }
                });
            }
        });
        assert!(c.now() >= start);
    }
}
