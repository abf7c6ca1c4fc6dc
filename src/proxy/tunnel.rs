//! HTTP/1.1 upgrades (WebSocket): once the upstream has answered an upgrade request
//! with 101 and the client has been sent that 101, the two connections are spliced
//! together, bytes copied both ways, until either side closes or the tunnel idles.
//!
//! The forwarder sends an upgrade request over an upstream connection of its own,
//! never a pooled one nor the client connection's lane, so the connection a tunnel
//! takes over is never reused for another request. Its 101 carries a [`Tunnel`] in its
//! extensions; the client connection's task takes it, with the request's concurrency
//! permit, and runs it once hyper has handed over the client's connection: the tunnel
//! keeps the connection's place under `max_connections` and, like a request in
//! flight, its route's permit and its place under `max_upstream_requests`, and it is
//! dropped when shutdown's grace period ends.

use crate::http::HeldPermit;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

/// An upgrade both sides agreed to: the client's connection and the upstream's, each
/// handed over by hyper once its 101 has gone through, and what the tunnel holds while
/// it is open. Cloned only because response extensions must be; one clone is run.
#[derive(Clone, Debug)]
pub(crate) struct Tunnel {
    client: OnUpgrade,
    upstream: OnUpgrade,
    permit: Option<HeldPermit>,
    /// The upgrade request's place under `max_upstream_requests`: the tunnel holds an
    /// upstream connection, and counts as a request in flight until it closes.
    upstream_place: Option<Arc<OwnedSemaphorePermit>>,
}

impl Tunnel {
    /// A tunnel between the client connection `client` and the upstream connection
    /// `upstream`, once both have been upgraded.
    pub(crate) fn new(client: OnUpgrade, upstream: OnUpgrade) -> Self {
        Tunnel {
            client,
            upstream,
            permit: None,
            upstream_place: None,
        }
    }

    /// Holds the request's place under `max_upstream_requests` until the tunnel closes.
    pub(crate) fn holding_upstream_place(mut self, place: Option<OwnedSemaphorePermit>) -> Self {
        self.upstream_place = place.map(Arc::new);
        self
    }

    /// Holds the request's concurrency permit, if it has one, until the tunnel closes,
    /// untimed: its hold is the tunnel's life, not a request's service time, and counted
    /// into the route's mean hold an hour-long tunnel would tell every refusal on the
    /// route the longest wait, for dozens of releases after it closed.
    pub(crate) fn holding(mut self, permit: Option<HeldPermit>) -> Self {
        self.permit = permit.map(HeldPermit::untimed);
        self
    }

    /// Copies bytes both ways until either side closes or fails, or nothing has crossed
    /// either way for `idle_timeout`; then both connections are closed and the permit
    /// released.
    pub(crate) async fn run(self, idle_timeout: Duration) {
        let Tunnel {
            client,
            upstream,
            permit: _permit,
            upstream_place: _upstream_place,
        } = self;
        let (client, upstream) = match tokio::try_join!(client, upstream) {
            Ok(both) => both,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed: no tunnel");
                return;
            }
        };
        let activity = LastRead::new();
        let (mut from_client, mut to_client) = tokio::io::split(Counted {
            io: TokioIo::new(client),
            activity: &activity,
        });
        let (mut from_upstream, mut to_upstream) = tokio::io::split(Counted {
            io: TokioIo::new(upstream),
            activity: &activity,
        });
        // The first side to close, once what it sent has been passed on, closes the
        // tunnel (as nginx does): a WebSocket's server closes its connection after the
        // closing handshake, and a client that keeps its own open must not hold the
        // tunnel, its place and its permit.
        let closed = tokio::select! {
            sent = tokio::io::copy(&mut from_client, &mut to_upstream) => ("client", sent),
            sent = tokio::io::copy(&mut from_upstream, &mut to_client) => ("upstream", sent),
            () = activity.idle(idle_timeout) => {
                tracing::debug!("tunnel closed: nothing crossed it for idle_timeout");
                return;
            }
        };
        match closed {
            (side, Ok(bytes)) => tracing::debug!(side, bytes, "tunnel closed"),
            (side, Err(e)) => tracing::debug!(side, error = %e, "tunnel closed with an error"),
        }
    }
}

/// When bytes last crossed a tunnel, either way.
struct LastRead {
    opened: Instant,
    /// Nanoseconds from `opened` to the last read that returned bytes.
    last: AtomicU64,
}

impl LastRead {
    fn new() -> Self {
        LastRead {
            opened: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// Records bytes read now.
    fn read(&self) {
        let since = Instant::now().saturating_duration_since(self.opened);
        self.last.store(
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Completes once nothing has been read for `timeout`. Its timer is not set again
    /// at every read: it wakes at the end of the idle period it last saw and looks
    /// again.
    async fn idle(&self, timeout: Duration) {
        loop {
            let last = self.opened + Duration::from_nanos(self.last.load(Ordering::Relaxed));
            let at = last + timeout;
            if Instant::now() >= at {
                return;
            }
            tokio::time::sleep_until(at).await;
        }
    }
}

/// One side of a tunnel, recording its reads in the tunnel's [`LastRead`]: every byte
/// that crosses is read from one side first.
struct Counted<'a> {
    io: TokioIo<Upgraded>,
    activity: &'a LastRead,
}

impl AsyncRead for Counted<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl AsyncWrite for Counted<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
