//! A client connection's own upstream connection, driven by the client connection's
//! task.
//!
//! The pooled client (hyper-util's) runs every upstream connection in a task of its
//! own: each forwarded request crosses from the client connection's task to the
//! upstream connection's task and back, two wake-ups and a pool checkout per request,
//! about a third of what `rocgate serve` spends on an admitted request. An HTTP/1
//! client sends its requests one after another on a connection, so from its second
//! request on the connection gets a [`Lane`]: one upstream connection of its own,
//! polled by the [`Driver`] that runs beside the client connection in the same task.
//! A request then reaches the upstream and its response comes back without leaving
//! the task, as in an event-loop proxy.
//!
//! The pool still serves the first request of every connection (a client that sends
//! one request per connection never opens an upstream connection for nothing), HTTP/2
//! clients (whose requests run side by side), any request the lane's connection could
//! not take, and every request while `max_upstream_lanes` lanes hold an upstream
//! connection (an upstream with a connection limit must not be filled by idle
//! keep-alive clients; 0 turns lanes off).

use crate::clock::Nanos;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::net::TcpStream;

/// The request body type the lane sends upstream.
type Body = axum::body::Body;

/// Counts the upstream connections lanes hold, against a maximum; clones share the
/// count.
#[derive(Clone, Debug)]
pub(crate) struct LaneCount {
    open: Arc<AtomicUsize>,
    max: usize,
}

impl LaneCount {
    /// A count allowing `max` lane connections at once.
    pub(crate) fn new(max: usize) -> Self {
        LaneCount {
            open: Arc::default(),
            max,
        }
    }

    /// A place for one more lane connection, if there is room.
    pub(crate) fn acquire(&self) -> Option<LaneSlot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| LaneSlot(Arc::clone(&self.open)))
    }

    /// Lane connections open now.
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }
}

/// One lane connection counted in a [`LaneCount`], until dropped.
pub(crate) struct LaneSlot(Arc<AtomicUsize>);

impl Drop for LaneSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client connection's upstream connection, held by the connection's forwarder.
pub(crate) struct Lane {
    state: Arc<Mutex<State>>,
}

struct State {
    /// Requests seen on the client connection.
    requests: u32,
    /// The upstream connection's sender while no request holds it.
    sender: Option<SendRequest<Body>>,
    /// When the sender was last given back: the connection is idle since.
    idle_since: Nanos,
    /// The upstream connection, polled by the [`Driver`], and its place in the count.
    connection: Option<(Connection<TokioIo<TcpStream>, Body>, LaneSlot)>,
    /// The client connection task's waker, to poll a connection just installed.
    waker: Option<Waker>,
}

impl Lane {
    /// A lane and the driver to run beside the client connection, in its task.
    pub(crate) fn new() -> (Lane, Driver) {
        let state = Arc::new(Mutex::new(State {
            requests: 0,
            sender: None,
            idle_since: Nanos::ZERO,
            connection: None,
            waker: None,
        }));
        (
            Lane {
                state: Arc::clone(&state),
            },
            Driver { state },
        )
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a request; `true` from the connection's second request on, when the
    /// request should go through the lane rather than the pool.
    pub(crate) fn enter(&self) -> bool {
        let mut state = self.state();
        state.requests = state.requests.saturating_add(1);
        state.requests > 1
    }

    /// The upstream connection's sender at `now`, if the lane has an open one that no
    /// other request holds and that has been idle for less than `idle_timeout`. A
    /// connection idle longer is closed: the upstream may be closing it too, and a
    /// request sent as it does would fail. Idle time counts from the last response
    /// head ([`put_back`](Self::put_back)), so after a body that streamed for longer
    /// the next request opens a new connection: an extra connect, never a stale one.
    /// A lane past its timeout is closed only here, when its client sends again, or
    /// with its client connection; until then it holds its place in
    /// `max_upstream_lanes`.
    pub(crate) fn take(&self, now: Nanos, idle_timeout: Duration) -> Option<SendRequest<Body>> {
        let mut state = self.state();
        match state.sender.take() {
            Some(sender)
                if !sender.is_closed() && now.saturating_since(state.idle_since) < idle_timeout =>
            {
                Some(sender)
            }
            Some(_) => {
                state.connection = None;
                None
            }
            None => None,
        }
    }

    /// Gives the sender back once the response head has arrived, at `now`.
    pub(crate) fn put_back(&self, sender: SendRequest<Body>, now: Nanos) {
        if !sender.is_closed() {
            let mut state = self.state();
            state.sender = Some(sender);
            state.idle_since = now;
        }
    }

    /// Opens the lane's upstream connection over `stream`, counted by `slot`; the
    /// driver polls it from now on. Returns its sender, which the caller puts back
    /// when done.
    pub(crate) async fn open(
        &self,
        stream: TokioIo<TcpStream>,
        slot: LaneSlot,
    ) -> hyper::Result<SendRequest<Body>> {
        let (sender, connection) = http1::handshake(stream).await?;
        let waker = {
            let mut state = self.state();
            state.connection = Some((connection, slot));
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(sender)
    }
}

/// Polls the lane's upstream connection. Never completes: run it beside the client
/// connection and drop it when that ends, which closes the upstream connection.
pub(crate) struct Driver {
    state: Arc<Mutex<State>>,
}

impl Future for Driver {
    type Output = std::convert::Infallible;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((connection, _)) = state.connection.as_mut() {
            if let Poll::Ready(result) = Pin::new(connection).poll(cx) {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "upstream connection ended with an error");
                }
                state.connection = None;
                state.sender = None;
            }
        }
        if !state
            .waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            state.waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}
