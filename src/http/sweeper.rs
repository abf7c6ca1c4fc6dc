//! [`Sweeper`]: a thread that sweeps the idle keys of an engine's partitioned routes
//! apart from requests, so that no request waits for a sweep.

use super::layer::SharedEngine;
use crate::clock::Clock;
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a [`Sweeper`] runs [`Engine::sweep_due`](crate::engine::Engine::sweep_due):
/// as often as a full key table is swept at most, so that every table is swept on the
/// schedule a rollover would keep.
pub const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A thread of its own (`rocgate-sweeper`) that sweeps the idle keys of the engine in
/// force of a [`SharedEngine`], as `rocgate serve` runs one: every [`SWEEP_EVERY`] it
/// sets that engine to sweep apart from requests
/// ([`Engine::set_sweeps_apart`](crate::engine::Engine::set_sweeps_apart); an engine
/// put in force since is set at the next pass) and runs
/// [`Engine::sweep_due`](crate::engine::Engine::sweep_due) on it, at its clock's now.
/// The request that rolls a partitioned route's window then has its decision without
/// waiting for the route's sweep (about 20 ms at 1,000,000 keys).
///
/// It needs no async runtime. Dropping it stops the thread (waiting for a sweep under
/// way, which blocks: in async code, drop it on a blocking thread,
/// `tokio::task::spawn_blocking(move || drop(sweeper))`, as `rocgate serve` does) and sets the engine in force back to sweeping in requests, so that its idle
/// keys are still evicted: it and the engines reloaded from it share the setting, so
/// a reload under way then puts in force an engine that sweeps in requests too. A pass that panics (a bug, which the panic hook prints) is
/// left behind: the sweeps it ran are not tried again before their next time, and the
/// next pass runs the others.
///
/// ```
/// use rocgate::clock::{Clock, MonotonicClock};
/// use rocgate::config::{Config, KeyLimits, Partition, RouteConfig, RouteMatch};
/// use rocgate::engine::Engine;
/// use rocgate::http::{SharedEngine, Sweeper};
/// use std::sync::Arc;
/// use std::time::SystemTime;
///
/// let mut route = RouteConfig::new("login", RouteMatch::prefix("/login"));
/// route.partition = Partition::ClientIp(KeyLimits::default());
/// let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
/// let engine = Engine::new(&Config::new(vec![route]), clock.now(), SystemTime::now())?;
/// let shared = SharedEngine::new(engine);
/// let sweeper = Sweeper::spawn(shared.clone(), clock)?;
/// assert!(shared.load().sweeps_apart());
/// drop(sweeper);
/// assert!(!shared.load().sweeps_apart(), "requests sweep again");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping the sweeper stops it"]
pub struct Sweeper {
    engine: SharedEngine,
    /// Dropped to stop the thread: it wakes at once.
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Starts the thread over `engine`, read at `clock` (the clock the engine was built
    /// against). The engine in force sweeps apart from when this returns; the error is
    /// the system's, if it makes no thread (the engine is then left as it was).
    pub fn spawn(engine: SharedEngine, clock: Arc<dyn Clock>) -> io::Result<Sweeper> {
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = engine.clone();
        let thread = std::thread::Builder::new()
            .name("rocgate-sweeper".into())
            .spawn(move || loop {
                let engine = shared.load();
                engine.set_sweeps_apart(true);
                let now = clock.now();
                let _panicked = catch_unwind(AssertUnwindSafe(|| engine.sweep_due(now)));
                drop(engine);
                match stopped.recv_timeout(SWEEP_EVERY) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
            })?;
        engine.load().set_sweeps_apart(true);
        Ok(Sweeper {
            engine,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A panic is the thread's to have printed; it sweeps no more either way.
            let _ = thread.join();
        }
        self.engine.load().set_sweeps_apart(false);
    }
}

impl std::fmt::Debug for Sweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sweeper")
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}
