//! What a [`tracing`] subscriber writes, kept for a test to read (for the tests of
//! what rocgate logs).

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// What a [`tracing`] subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures what is logged (at `INFO` and above) on this thread until the guard
    /// is dropped: on a current-thread runtime, what its tasks log too.
    pub(crate) fn on_this_thread() -> (Captured, tracing::subscriber::DefaultGuard) {
        // tracing-core, with a single dispatcher registered, takes a callsite's interest
        // from the default of the thread that first reaches it: reached first by a test
        // on another thread, with no subscriber, it was "never" for every thread, this
        // one's lines missed while both ran. With one more registered for good, it is
        // taken from all of them, and asked of this thread's at each event.
        static ANOTHER: OnceLock<tracing::Dispatch> = OnceLock::new();
        ANOTHER
            .get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        let log = Captured::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        // A callsite first reached on another thread as the subscriber was set may
        // have kept the interest of none (tracing-core registers it after the rebuild
        // that setting it ran): rebuilt again, it is seen.
        tracing::callsite::rebuild_interest_cache();
        (log, guard)
    }

    /// The lines written that contain `text`.
    pub(crate) fn lines_with(&self, text: &str) -> Vec<String> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&kept)
            .lines()
            .filter(|line| line.contains(text))
            .map(str::to_owned)
            .collect()
    }
}
