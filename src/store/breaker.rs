//! A circuit breaker on the shared store: after a run of failures it stops sending
//! commands, lets one probe through per `probe_interval`, and closes again on the first
//! success. Pure: the time is an argument, so it is tested on plain numbers.
//!
//! ```
//! use rocgate::clock::Nanos;
//! use rocgate::store::breaker::{Breaker, Call};
//! use std::time::Duration;
//!
//! let mut b = Breaker::new(2, Duration::from_millis(500));
//! let t = Nanos::from_secs(1);
//! assert_eq!(b.call(t), Call::Send);
//! b.failure(t);
//! b.failure(t); // the second failure in a row opens it
//! assert_eq!(b.call(t), Call::Skip);
//! let later = t + Duration::from_millis(500);
//! assert_eq!(b.call(later), Call::Probe); // one probe per interval
//! assert_eq!(b.call(later), Call::Skip);
//! b.success();
//! assert_eq!(b.call(later), Call::Send);
//! ```

use crate::clock::Nanos;
use std::time::Duration;

/// What to do with the next command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Call {
    /// The store is healthy: send it.
    Send,
    /// The breaker is open but a probe is due: send this one to see whether the store
    /// is back.
    Probe,
    /// The breaker is open: do not send; decide locally.
    Skip,
}

/// The breaker's state.
#[derive(Clone, Debug)]
pub struct Breaker {
    failures_to_open: u32,
    probe_interval: Duration,
    failures: u32,
    open: bool,
    next_probe: Nanos,
}

impl Breaker {
    /// A closed breaker that opens after `failures_to_open` failures in a row (at
    /// least 1) and then probes once per `probe_interval`.
    pub fn new(failures_to_open: u32, probe_interval: Duration) -> Self {
        Breaker {
            failures_to_open: failures_to_open.max(1),
            probe_interval,
            failures: 0,
            open: false,
            next_probe: Nanos::ZERO,
        }
    }

    /// Whether commands are being skipped.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Whether to send the next command at `now`. A probe is granted at most once per
    /// `probe_interval`, whether or not its outcome is ever reported.
    pub fn call(&mut self, now: Nanos) -> Call {
        if !self.open {
            Call::Send
        } else if now >= self.next_probe {
            self.next_probe = now + self.probe_interval;
            Call::Probe
        } else {
            Call::Skip
        }
    }

    /// A command answered: the breaker closes.
    pub fn success(&mut self) {
        self.failures = 0;
        self.open = false;
    }

    /// A command failed or timed out at `now`. Returns true if this opened the breaker.
    pub fn failure(&mut self, now: Nanos) -> bool {
        self.failures = self.failures.saturating_add(1);
        if !self.open && self.failures >= self.failures_to_open {
            self.open = true;
            self.next_probe = now + self.probe_interval;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROBE: Duration = Duration::from_millis(250);

    fn ms(n: u64) -> Nanos {
        Nanos::from_millis(n)
    }

    #[test]
    fn stays_closed_until_enough_failures_in_a_row() {
        let mut b = Breaker::new(3, PROBE);
        assert!(!b.failure(ms(0)));
        assert!(!b.failure(ms(1)));
        b.success();
        assert!(!b.failure(ms(2)));
        assert!(!b.failure(ms(3)));
        assert_eq!(b.call(ms(3)), Call::Send);
        assert!(b.failure(ms(4)));
        assert!(b.is_open());
        assert_eq!(b.call(ms(5)), Call::Skip);
    }

    #[test]
    fn probes_at_most_once_per_interval() {
        let mut b = Breaker::new(1, PROBE);
        b.failure(ms(0));
        let mut probes = 0;
        for t in 0..2_000 {
            match b.call(ms(t)) {
                Call::Probe => probes += 1,
                Call::Skip => {}
                Call::Send => panic!("sent while open"),
            }
        }
        // Probes at 250, 500, ..., 1750 ms: 7 in 2 s, whatever the request rate.
        assert_eq!(probes, 7);
    }

    #[test]
    fn a_failed_probe_waits_a_full_interval_again() {
        let mut b = Breaker::new(1, PROBE);
        b.failure(ms(0));
        assert_eq!(b.call(ms(250)), Call::Probe);
        assert!(!b.failure(ms(300)));
        assert_eq!(b.call(ms(499)), Call::Skip);
        assert_eq!(b.call(ms(500)), Call::Probe);
        b.success();
        assert!(!b.is_open());
        assert_eq!(b.call(ms(501)), Call::Send);
    }

    #[test]
    fn zero_threshold_means_one() {
        let mut b = Breaker::new(0, PROBE);
        assert_eq!(b.call(ms(0)), Call::Send);
        assert!(b.failure(ms(0)));
    }
}
