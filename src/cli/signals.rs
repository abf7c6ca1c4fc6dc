//! The signals that end a run of `serve` or `demo`.

/// What ended a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGTERM (a service manager, `kill`, a container runtime).
    Terminate,
    /// SIGINT (Ctrl-C).
    Interrupt,
}

impl Stop {
    /// The exit code of a run it ended: 128 + the signal's number, as a shell reports a
    /// process the signal killed.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Stop::Terminate => 143,
            Stop::Interrupt => 130,
        }
    }
}

/// SIGTERM and Ctrl-C (SIGINT), listened for once for the whole run, so that none is
/// missed between the first and the second.
pub(crate) struct ShutdownSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    /// Starts listening (within a Tokio runtime).
    pub(crate) fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            ShutdownSignals {
                term: signal(SignalKind::terminate()).ok(),
                interrupt: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        ShutdownSignals {}
    }

    /// Completes on the next SIGTERM or Ctrl-C, saying which.
    pub(crate) async fn next(&mut self) -> Stop {
        #[cfg(unix)]
        {
            async fn recv(signal: Option<&mut tokio::signal::unix::Signal>) {
                match signal {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = recv(self.term.as_mut()) => Stop::Terminate,
                () = recv(self.interrupt.as_mut()) => Stop::Interrupt,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Stop::Interrupt
        }
    }
}
