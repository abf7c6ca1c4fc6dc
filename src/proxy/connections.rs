//! Client connections: how many may be open at once (`max_connections`), and when an
//! idle one is closed (`idle_timeout`).
//!
//! A connection accepted takes a [`Place`] under the cap and holds it, as a [`Slot`],
//! until it closes. At the cap, the connection accepted waits for a place, and further
//! ones wait in the kernel's listen backlog (as with nginx's `worker_connections` and
//! Envoy's listener limits), until a connection closes and gives its place back, which
//! wakes the loop at once. Meanwhile the connections idle longest between requests are
//! asked to close to make room ([`Reclaimable`]), as nginx closes its reusable
//! connections when it runs out (`ngx_drain_connections`): idle keep-alive connections
//! would otherwise hold every place for up to `idle_timeout` while nothing is served.
//! With `max_connections_per_client`, a client address (an IPv6 client's /64) that
//! holds that many already has a new connection closed as soon as it is accepted,
//! before a byte of it is read, so that one client cannot take every place (HAProxy's
//! `src_conn_cur`, nginx's `limit_conn` by address); the connections of the trusted
//! proxies and of the load balancers that send a PROXY protocol header, which carry
//! many clients, are not counted (a client a header names is, unless it is a trusted
//! proxy itself).
//!
//! A connection's [`Activity`] counts its requests in progress: a request begins when
//! the service is called and ends with its response body (or with the service's
//! error). [`Activity::idle`] completes once the connection has had none for the idle
//! timeout; the connection is then shut down gracefully. Its timer is not re-armed at
//! every request: it wakes at the deadline of the idle period it last saw and looks
//! again, so a request costs two atomic updates and a clock read, not a timer, and a
//! busy connection is looked at once per idle timeout. Between those wakes, polling it
//! costs a load.
//!
//! A connection's socket is [`Watched`]: a write the client's socket cannot take (its
//! receive window is full: the client reads nothing) marks the connection blocked, the
//! next write taken clears it. [`WriteStall::stalled`] completes once it has been
//! blocked for the idle timeout, and the connection is then dropped (nginx's
//! `send_timeout`): a client that takes nothing of its response would otherwise hold
//! its connection, the upstream connection and the request's concurrency permit for as
//! long as it stays connected. A write costs a load; the clock is read when one blocks.
//!
//! An HTTP/2 client can take nothing of one stream while its socket takes every write:
//! each HTTP/2 response body is watched by the connection's [`Streams`], and one that
//! hyper does not ask for its next frame for the idle timeout is let go.
//!
//! An HTTP/1.1 connection that closes while its client may still be sending (a
//! request answered without its body read through: a 429, a 413) is closed as a
//! lingering close ([`linger`]), as nginx's `lingering_close` and Envoy's delayed close
//! do: its write half is shut, and what the client still sends is read and thrown
//! away, within bounds ([`Lingering`]), before the socket is closed. Closed with the
//! body unread, the socket would answer it with a reset, and a client that sends its
//! whole body before it reads would see its writes fail, never the answer.
//!
//! hyper times each HTTP/1 request head (`header_read_timeout`) with a sleep it asks
//! its timer for; a connection's [`HeadTimer`] lets those sleeps share one timer,
//! re-armed as [`Activity::idle`]'s is, rather than register one per request. hyper
//! starts that sleep as the connection goes idle, for the next head: the timer lets
//! the head's time begin with its first byte instead, which [`Watched`] sees, so that
//! the wait between requests is [`Activity::idle`]'s (`idle_timeout`), as nginx's
//! `keepalive_timeout` is kept apart from its `client_header_timeout`.
//!
//! A connection runs [`Beside`](crate::beside::Beside) its lane's upstream connection (`super::lane`): each
//! side is polled when it has been woken, and the wakes they give each other (a request
//! handed to the lane, its response handed back) are taken in the same poll of the task
//! rather than waking it again.

use super::tunnel::Tunnel;
use crate::clock::Nanos;
use crate::http::{HeldPermit, HoldUntilEnd};
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The cap on client connections, and the counts `/metrics` exports.
#[derive(Debug)]
pub(crate) struct ClientConnections {
    permits: Arc<Semaphore>,
    max: usize,
    /// Connections open now.
    open: Arc<AtomicUsize>,
    /// Connections accepted with every place taken.
    limit_reached: AtomicU64,
    /// The cap per client address, if any.
    per_client: Option<PerClient>,
    /// Connections closed as accepted, their address at its cap.
    refused: AtomicU64,
    /// When such a connection was last warned of: the proxy clock's nanoseconds plus
    /// one, 0 if never.
    refusal_warned: AtomicU64,
    /// Connections closed for their PROXY protocol header: invalid, and not whole in
    /// time.
    header_invalid: AtomicU64,
    header_timeout: AtomicU64,
    /// Connections closed, or timed out, before their first byte.
    header_empty: AtomicU64,
    /// When a header refusal was last warned of, as `refusal_warned`.
    header_warned: AtomicU64,
    /// Header refusals not warned of since the last one that was.
    header_unwarned: AtomicU64,
    /// Connections closed as lingering closes.
    lingering: Arc<LingeringCloses>,
    /// The connections being served, which may be asked to close when idle.
    reclaimable: Arc<Reclaimable>,
}

/// The cap on connections per client address, and the connections each address
/// holds.
#[derive(Debug)]
struct PerClient {
    max: usize,
    /// Addresses whose connections are not counted: the trusted proxies.
    exempt: Vec<ipnet::IpNet>,
    /// Load balancers, whose own connections are not counted either: the clients
    /// their headers name are, one of these networks or not.
    balancers: Vec<ipnet::IpNet>,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// The address a client's connections count under: an IPv4 client's (IPv4-mapped
/// IPv6 peers of a dual-stack listener included) whole, an IPv6 client's /64, which
/// one holder can rotate addresses through.
fn client_address(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !(u128::MAX >> 64))),
        v4 => v4,
    }
}

/// Whether something at `now` is the first, or the first at least `every` after the
/// last that was (`last`: its nanoseconds plus one, 0 if none), which it then becomes;
/// an instant behind the last is not.
fn first_or_once_every(last: &AtomicU64, now: Nanos, every: Duration) -> bool {
    let was = last.load(Ordering::Relaxed);
    if was != 0 && now.saturating_since(Nanos::new(was - 1)) < every {
        return false;
    }
    last.compare_exchange(
        was,
        now.as_u64().saturating_add(1),
        Ordering::Relaxed,
        Ordering::Relaxed,
    )
    .is_ok()
}

impl ClientConnections {
    /// A cap of `max` connections, taken as 1 if 0 and as `Semaphore::MAX_PERMITS` if
    /// more (the config allows from 1 to far fewer).
    pub(crate) fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        ClientConnections {
            permits: Arc::new(Semaphore::new(max)),
            max,
            open: Arc::default(),
            limit_reached: AtomicU64::new(0),
            per_client: None,
            refused: AtomicU64::new(0),
            refusal_warned: AtomicU64::new(0),
            header_invalid: AtomicU64::new(0),
            header_timeout: AtomicU64::new(0),
            header_empty: AtomicU64::new(0),
            header_warned: AtomicU64::new(0),
            header_unwarned: AtomicU64::new(0),
            lingering: Arc::default(),
            reclaimable: Arc::default(),
        }
    }

    /// At most `max` connections open at once from one client address, if set, not
    /// counting those from `exempt` networks (the trusted proxies), nor the socket
    /// peers in `balancers` (the load balancers that send a PROXY protocol header).
    pub(crate) fn per_client(
        mut self,
        max: Option<usize>,
        exempt: Vec<ipnet::IpNet>,
        balancers: Vec<ipnet::IpNet>,
    ) -> Self {
        self.per_client = max.map(|max| PerClient {
            max,
            exempt,
            balancers,
            open: Arc::default(),
        });
        self
    }

    /// The most connections open at once.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// A place for one more connection, if one is free now.
    pub(crate) fn try_acquire(&self) -> Option<Place> {
        Arc::clone(&self.permits)
            .try_acquire_owned()
            .ok()
            .map(Place)
    }

    /// Counts a connection accepted at the cap; returns how many were.
    pub(crate) fn reached(&self) -> u64 {
        self.limit_reached.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Waits for a place: one comes free as soon as a connection closes.
    pub(crate) async fn acquire(&self) -> Place {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the connection semaphore is never closed");
        Place(permit)
    }

    /// Counts a connection just accepted from `peer` against its client address's
    /// cap, until the [`Slot`] it opens is dropped; `None`, the refusal counted, if
    /// that address holds `max_connections_per_client` already.
    pub(crate) fn admit(&self, peer: IpAddr) -> Option<Admitted> {
        self.admit_unless(peer, true)
    }

    /// As [`admit`](Self::admit), for the client a PROXY protocol header named: not
    /// counted only if it is a trusted proxy (it then carries many clients), whether
    /// or not its address lies in a load balancer's network.
    pub(crate) fn admit_named(&self, client: IpAddr) -> Option<Admitted> {
        self.admit_unless(client, false)
    }

    /// [`admit`](Self::admit), the balancers' networks exempt or not.
    fn admit_unless(&self, peer: IpAddr, balancers_exempt: bool) -> Option<Admitted> {
        let ip = peer.to_canonical();
        let exempt = |cap: &PerClient| {
            let within = |nets: &[ipnet::IpNet]| nets.iter().any(|n| n.contains(&ip));
            within(&cap.exempt) || (balancers_exempt && within(&cap.balancers))
        };
        match &self.per_client {
            Some(cap) if !exempt(cap) => {
                let address = client_address(peer);
                let mut open = cap.open.lock().unwrap_or_else(PoisonError::into_inner);
                let held = open.entry(address).or_insert(0);
                if *held >= cap.max {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                *held += 1;
                Some(Admitted(Some(ClientHold {
                    open: Arc::clone(&cap.open),
                    address,
                })))
            }
            _ => Some(Admitted(None)),
        }
    }

    /// Counts a connection `admitted` into `place` as open, until the slot is dropped.
    pub(crate) fn open_in(&self, place: Place, admitted: Admitted) -> Slot {
        self.open.fetch_add(1, Ordering::Relaxed);
        Slot {
            _permit: place.0,
            open: Arc::clone(&self.open),
            _client: admitted.0,
        }
    }

    /// Connections closed as soon as accepted since start, their client address at
    /// `max_connections_per_client`.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Whether a connection closed `now` at `max_connections_per_client` is to be
    /// warned of: the first, then at most one every `every`, whether the accept loop
    /// closed it or its task did (its client named by a PROXY protocol header).
    pub(crate) fn warn_refusal(&self, now: Nanos, every: Duration) -> bool {
        first_or_once_every(&self.refusal_warned, now, every)
    }

    /// Whether a connection closed `now` for its PROXY protocol header is to be warned
    /// of, as [`warn_refusal`](Self::warn_refusal) has it for its own: if so, how many
    /// such refusals were not since the last that was (one line in a period, however
    /// many peers are refused, the count of the rest in it).
    pub(crate) fn warn_header_refusal(&self, now: Nanos, every: Duration) -> Option<u64> {
        if first_or_once_every(&self.header_warned, now, every) {
            Some(self.header_unwarned.swap(0, Ordering::Relaxed))
        } else {
            self.header_unwarned.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// Counts a connection closed for its PROXY protocol header (not one its peer
    /// closed after a byte of it and before it was whole).
    pub(crate) fn header_refused(&self, refusal: &super::proxy_header::Refusal) {
        use super::proxy_header::Refusal;
        let count = match refusal {
            Refusal::Empty => &self.header_empty,
            Refusal::Invalid(_) => &self.header_invalid,
            Refusal::Timeout => &self.header_timeout,
            Refusal::Closed => return,
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections closed for their PROXY protocol header since start, by reason
    /// (`empty`, `invalid`, `timeout`).
    pub(crate) fn headers_refused(&self) -> [(&'static str, u64); 3] {
        [
            ("empty", self.header_empty.load(Ordering::Relaxed)),
            ("invalid", self.header_invalid.load(Ordering::Relaxed)),
            ("timeout", self.header_timeout.load(Ordering::Relaxed)),
        ]
    }

    /// Connections open now (accepted and not yet closed).
    pub(crate) fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections accepted at the cap since start.
    pub(crate) fn limit_reached(&self) -> u64 {
        self.limit_reached.load(Ordering::Relaxed)
    }

    /// The connections' lingering closes.
    pub(crate) fn lingering(&self) -> &Arc<LingeringCloses> {
        &self.lingering
    }

    /// The connections being served, which may be asked to close when idle.
    pub(crate) fn reclaimable(&self) -> &Arc<Reclaimable> {
        &self.reclaimable
    }

    /// Connections closed to make room at the cap since start.
    pub(crate) fn reclaimed(&self) -> u64 {
        self.reclaimable.reclaimed()
    }
}

/// A connection accepted and counted against its client address's cap (if that
/// address has one), not yet open.
#[derive(Debug)]
pub(crate) struct Admitted(Option<ClientHold>);

/// A place under the cap for a connection not yet accepted, given back when dropped.
#[derive(Debug)]
pub(crate) struct Place(OwnedSemaphorePermit);

/// An open client connection's place under the cap, given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Arc<AtomicUsize>,
    _client: Option<ClientHold>,
}

/// A connection counted against its client address's cap, until dropped.
#[derive(Debug)]
struct ClientHold {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    address: IpAddr,
}

impl Drop for ClientHold {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = open.get_mut(&self.address) {
            *held -= 1;
            if *held == 0 {
                open.remove(&self.address);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The most idle connections asked at once to close to make room at the cap: as
/// nginx's `ngx_drain_connections`, an eighth of those idle, at least one and at most
/// 32. Asking for a few more than the one connection waiting makes room for those
/// behind it in the backlog with one look at the connections, not one look each.
pub(crate) const RECLAIM_AT_MOST: usize = 32;

/// How long an HTTP/1.1 connection must have been idle to be closed to make room, and
/// how often the accept loop looks again while a connection waits at the cap. A
/// client that reuses its connection at once (a busy one: its next request follows
/// its last answer within a round trip) would find it closed before an answer, as it
/// reused it; that many fewer clients reuse a connection idle this long. A busy
/// connection's next answer carries `Connection: close` instead
/// ([`Reclaimable::close_after_answer`]).
pub(crate) const RECLAIM_IDLE_LEAST: Duration = Duration::from_millis(100);

/// How long a connection asked to close to make room counts as that room being made:
/// while one does, no other is asked. An idle HTTP/1.1 connection closes at its task's
/// next poll, an HTTP/2 one within a round trip of its client (who answers the
/// GOAWAY's ping); one asked this long ago whose client has not answered (hyper waits
/// for the ping until `header_read_timeout`) no longer counts, and the next look
/// asks others.
pub(crate) const RECLAIM_ASK_PENDING_MOST: Duration = Duration::from_secs(1);

/// The client connections being served (from their acceptance to their last
/// response: not a tunnel, nor a lingering close), which the accept loop asks to
/// close, when idle, to make room at the cap.
///
/// A connection is idle with no request in progress ([`Activity`]) and, over
/// HTTP/1.1, no byte of its next request head read ([`Arrivals`]): such a connection
/// is closed as the idle timeout closes it, between requests, and no request is cut.
/// A connection whose protocol is not yet told is idle, since accepted, until its
/// first byte comes ([`Registered::asked_before_first_byte`]), and is closed with no
/// answer: nginx reuses such a connection as it does an idle keep-alive one, and
/// clients that open connections and send nothing (a browser's preconnect, or one
/// that holds places so) would otherwise hold them until `header_read_timeout`.
/// A request in progress is never touched. An HTTP/2 connection with no stream in
/// progress gets a GOAWAY, which tells its client which streams were not taken.
///
/// An HTTP/1.1 connection counts as idle once it has been for [`RECLAIM_IDLE_LEAST`]:
/// a busy client reuses its connection within a round trip of its last answer, and
/// would find it closed before the answer to its next request.
///
/// Nothing here is on a request's way but a load per HTTP/1.1 answer
/// ([`Reclaimable::close_after_answer`]): a connection registers as it is accepted
/// and leaves as it ends (a lock each; an h2c one registers again once told, with no
/// head to begin), and its task's every wake costs two
/// loads ([`Registered::asked`]). The accept loop, while a connection waits at the
/// cap, looks every [`RECLAIM_IDLE_LEAST`] at every connection registered (under the
/// lock, a few nanoseconds each) for those idle longest, and wakes them; if none is
/// idle, the next HTTP/1.1 answer made closes its connection and says so
/// (`Connection: close`), or the first HTTP/2 connection to go idle closes.
///
/// A connection that goes idle at the very moment the loop looks may be seen busy by
/// the loop while it saw no room wanted: the connection waiting then has the next
/// answer, the next look, or the next to close. An HTTP/2 stream ends in a task of its own, which
/// may end after the connection's task last woke: such a connection sees the room
/// wanted at its next wake (a frame, or its ping every `header_read_timeout`).
#[derive(Debug, Default)]
pub(crate) struct Reclaimable {
    serving: Mutex<Serving>,
    /// Whether a connection waits at the cap ([`WAITING`]), and whether no connection
    /// was asked to make room for it ([`WANTED`]): the next HTTP/1.1 answer, or the
    /// first HTTP/2 connection to go idle, then makes it. One word, so that an ask passed on ([`Asked`]) wants room only while
    /// a connection waits: passed on after the room was made, it would close the next
    /// connection to go idle, however long after and with no connection waiting.
    room: AtomicU8,
    /// Connections closed to make room.
    reclaimed: AtomicU64,
}

/// [`Reclaimable`]'s `room`: a connection waits at the cap.
const WAITING: u8 = 1;
/// [`Reclaimable`]'s `room`: room is wanted that no connection was asked to make.
const WANTED: u8 = 2;

/// The connections registered, by index, and the indices free.
#[derive(Debug, Default)]
struct Serving {
    entries: Vec<Option<Arc<Reclaim>>>,
    free: Vec<usize>,
}

/// One connection as [`Reclaimable`] sees it.
#[derive(Debug)]
struct Reclaim {
    activity: Arc<Activity>,
    /// The reads of an HTTP/1.1 connection since its head timer last made a sleep
    /// (its next head begun); `None` over HTTP/2.
    head: Option<Arc<Arrivals>>,
    /// Whether the accept loop asked it to close.
    asked: AtomicBool,
    /// When it was asked, in nanoseconds from its activity's opening.
    asked_at: AtomicU64,
    /// Its task's waker, from its first poll of [`Asked`].
    waker: Mutex<Option<Waker>>,
}

impl Reclaim {
    /// Marks the connection asked to close, now.
    fn ask(&self) {
        let at = nanos_since(self.activity.opened);
        self.asked_at.store(at, Ordering::Relaxed);
        self.asked.store(true, Ordering::Release);
    }

    /// Since when the connection has been idle, or `None` while a request is in
    /// progress or a head is begun.
    fn idle_since(&self) -> Option<Instant> {
        if self.head.as_ref().is_some_and(|head| head.seen()) {
            return None;
        }
        self.activity.idle_since()
    }

    /// Since when the connection has been idle, if it may be closed to make room: an
    /// HTTP/2 one once idle (its GOAWAY tells its client which streams were taken), an
    /// HTTP/1.1 one once idle for [`RECLAIM_IDLE_LEAST`].
    fn reclaimable_since(&self) -> Option<Instant> {
        let since = self.idle_since()?;
        let long_enough = self.head.is_none()
            || Instant::now().saturating_duration_since(since) >= RECLAIM_IDLE_LEAST;
        long_enough.then_some(since)
    }
}

impl Reclaimable {
    /// Registers a connection being served, whose requests `activity` counts, and over
    /// HTTP/1.1 whose head reads `head` records, until the returned guard is dropped.
    pub(crate) fn register(
        self: &Arc<Self>,
        activity: Arc<Activity>,
        head: Option<Arc<Arrivals>>,
    ) -> Registered {
        let _ = activity.reclaimable.set(Arc::clone(self));
        let reclaim = Arc::new(Reclaim {
            activity,
            head,
            asked: AtomicBool::new(false),
            asked_at: AtomicU64::new(0),
            waker: Mutex::new(None),
        });
        let mut serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = Some(Arc::clone(&reclaim));
        let index = match serving.free.pop() {
            Some(index) => {
                serving.entries[index] = entry;
                index
            }
            None => {
                serving.entries.push(entry);
                serving.entries.len() - 1
            }
        };
        Registered {
            registry: Arc::clone(self),
            reclaim,
            index,
        }
    }

    /// Asks the connections idle longest to close, for a connection waiting at the
    /// cap: an eighth of those idle and not asked yet, at least one, at most
    /// [`RECLAIM_AT_MOST`], an HTTP/1.1 one idle for [`RECLAIM_IDLE_LEAST`] at least;
    /// none while one asked in the last [`RECLAIM_ASK_PENDING_MOST`] is still closing
    /// (the room is being made: each look of the waiting connection, every
    /// [`RECLAIM_IDLE_LEAST`], and each connection waiting after it, would otherwise
    /// ask as many again, and a burst close many more than it takes). With none idle,
    /// the next HTTP/1.1 answer made closes its connection
    /// ([`Reclaimable::close_after_answer`]), or the first HTTP/2 connection to go idle
    /// closes, until [`Reclaimable::made_room`]. Returns how many were asked.
    pub(crate) fn make_room(&self) -> usize {
        // Wanted before the look: a connection that goes idle during it closes, rather
        // than be missed by both.
        self.room.store(WAITING | WANTED, Ordering::SeqCst);
        let serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
        let mut closing = false;
        let mut idle: Vec<(Instant, usize)> = serving
            .entries
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| {
                let reclaim = entry.as_ref()?;
                if reclaim.asked.load(Ordering::Acquire) {
                    let asked_at = Duration::from_nanos(reclaim.asked_at.load(Ordering::Relaxed));
                    closing |=
                        reclaim.activity.opened.elapsed() < asked_at + RECLAIM_ASK_PENDING_MOST;
                    return None;
                }
                Some((reclaim.reclaimable_since()?, index))
            })
            .collect();
        if closing {
            self.room.fetch_and(!WANTED, Ordering::Relaxed);
            return 0;
        }
        if idle.is_empty() {
            return 0;
        }
        self.room.fetch_and(!WANTED, Ordering::Relaxed);
        let asked = (idle.len() / 8).clamp(1, RECLAIM_AT_MOST);
        if asked < idle.len() {
            idle.select_nth_unstable(asked - 1);
            idle.truncate(asked);
        }
        for (_, index) in idle {
            if let Some(reclaim) = &serving.entries[index] {
                reclaim.ask();
                if let Some(waker) = &*reclaim.waker.lock().unwrap_or_else(PoisonError::into_inner)
                {
                    waker.wake_by_ref();
                }
            }
        }
        asked
    }

    /// Whether the HTTP/1.1 answer being made ends its connection to make room: if room
    /// is wanted that no connection was asked to make, this answer takes it (counted as
    /// reclaimed), and carries `Connection: close`, which its client reads before it
    /// reuses the connection. A load while no room is wanted.
    pub(crate) fn close_after_answer(&self) -> bool {
        if self.room.load(Ordering::Relaxed) & WANTED == 0 {
            return false;
        }
        let taken = self
            .room
            .compare_exchange(
                WAITING | WANTED,
                WAITING,
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok();
        if taken {
            self.reclaimed.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Connections closed to make room since start.
    pub(crate) fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// The connection that waited at the cap has its place: no room is wanted.
    pub(crate) fn made_room(&self) {
        self.room.store(0, Ordering::SeqCst);
    }

    /// For a connection accepted at the cap: waits for `place` while the connections
    /// idle longest are asked to close ([`make_room`](Self::make_room)), looking again
    /// every [`RECLAIM_IDLE_LEAST`] (an HTTP/1.1 connection becomes closable once idle
    /// that long, and nothing wakes the waiter then); `None` if `stop` completes first.
    /// Either way no room is wanted after: those closing at shutdown are not counted
    /// as closed to make room. The proxy's accept loop and the admin API's wait so.
    pub(crate) async fn wait_for_place<P>(
        &self,
        place: impl Future<Output = P>,
        stop: impl Future<Output = ()>,
    ) -> Option<P> {
        tokio::pin!(place, stop);
        let got = loop {
            let asked = self.make_room();
            tracing::debug!(asked, "idle connections asked to close to make room");
            tokio::select! {
                place = &mut place => break Some(place),
                () = tokio::time::sleep(RECLAIM_IDLE_LEAST) => {}
                () = &mut stop => break None,
            }
        };
        self.made_room();
        got
    }
}

/// A connection registered with [`Reclaimable`], until dropped.
#[derive(Debug)]
pub(crate) struct Registered {
    registry: Arc<Reclaimable>,
    reclaim: Arc<Reclaim>,
    index: usize,
}

impl Registered {
    /// As [`Registered::asked`], for a connection registered as accepted, its protocol
    /// not yet told ([`Arrivals`] records its first bytes as they are peeked at): it is
    /// idle, since accepted, until a byte comes. Once it is asked (or room is wanted),
    /// and before it may complete, the socket is peeked at, which does not wait for the
    /// runtime to have seen it readable: a byte there makes the connection busy, and
    /// the ask is passed on, so that a request whose first bytes came is not cut. The
    /// connection is then closed with no answer.
    pub(crate) fn asked_before_first_byte<'a>(&'a self, stream: &'a TcpStream) -> Asked<'a> {
        Asked {
            registered: self,
            waker_set: false,
            fresh: Some(stream),
        }
    }

    /// Completes once the connection is idle and asked to close to make room at the
    /// cap (or, with room wanted that no connection was asked for, once it is idle:
    /// an HTTP/1.1 one for [`RECLAIM_IDLE_LEAST`]),
    /// counted as reclaimed. The connection's task is its only poller.
    pub(crate) fn asked(&self) -> Asked<'_> {
        Asked {
            registered: self,
            waker_set: false,
            fresh: None,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut serving = self
            .registry
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        serving.entries[self.index] = None;
        serving.free.push(self.index);
    }
}

/// Whether bytes wait to be read on `stream`, as the kernel holds them now.
fn has_bytes(stream: &TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit()];
    socket2::SockRef::from(stream)
        .peek(&mut byte)
        .is_ok_and(|n| n > 0)
}

/// The future of [`Registered::asked`] and [`Registered::asked_before_first_byte`].
/// Like [`Idle`], it is polled at every wake of the connection's task: until the
/// connection is asked, or room is wanted, a poll is two loads. Its waker is the
/// task's, registered at the first poll.
#[derive(Debug)]
pub(crate) struct Asked<'a> {
    registered: &'a Registered,
    waker_set: bool,
    /// The socket of a connection that has sent nothing yet
    /// ([`Registered::asked_before_first_byte`]), peeked at once the ask is read.
    fresh: Option<&'a TcpStream>,
}

impl Future for Asked<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Registered {
            registry, reclaim, ..
        } = this.registered;
        if !this.waker_set {
            *reclaim.waker.lock().unwrap_or_else(PoisonError::into_inner) =
                Some(cx.waker().clone());
            this.waker_set = true;
        }
        let asked = reclaim.asked.load(Ordering::Acquire);
        if !asked && registry.room.load(Ordering::SeqCst) & WANTED == 0 {
            return Poll::Pending;
        }
        // Looked for after the ask is read: an ask made since the last look (here or in
        // the runtime's) finds the bytes that came before it.
        if let (Some(stream), Some(first)) = (this.fresh, &reclaim.head) {
            if has_bytes(stream) {
                first.read();
            }
        }
        if reclaim.reclaimable_since().is_none() {
            // Busy again since the loop looked: the next to go idle makes the room, if
            // a connection still waits for it.
            if asked {
                reclaim.asked.store(false, Ordering::Relaxed);
                let _ = registry
                    .room
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |room| {
                        (room & WAITING != 0).then_some(room | WANTED)
                    });
            }
            return Poll::Pending;
        }
        if !asked {
            let wanted = registry.room.compare_exchange(
                WAITING | WANTED,
                WAITING,
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
            if wanted.is_err() {
                return Poll::Pending;
            }
            // Closing now: the loop looks past it until it is gone.
            reclaim.ask();
        }
        registry.reclaimed.fetch_add(1, Ordering::Relaxed);
        Poll::Ready(())
    }
}

/// The requests in progress on one client connection, since when it has had none, and
/// the tunnel an upgrade opened on it, if one did.
#[derive(Debug)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
    /// Whether the last HTTP/1.1 request carried a body, which the answer may have
    /// left unread.
    body: AtomicBool,
    /// When the last request ended, in nanoseconds from `opened`.
    last_end: AtomicU64,
    opened: Instant,
    /// Put by the request whose 101 upgraded the connection, for the connection's
    /// task to run once hyper has handed the connection over.
    tunnel: Mutex<Option<Tunnel>>,
    /// Where the connection is registered to make room at the cap, once it is.
    reclaimable: OnceLock<Arc<Reclaimable>>,
}

impl Activity {
    /// A connection opened now, with no request in progress yet.
    pub(crate) fn new() -> Arc<Activity> {
        // The proxy's timers, hyper's included, run on tokio's clock.
        Arc::new(Activity {
            in_flight: AtomicUsize::new(0),
            body: AtomicBool::new(false),
            last_end: AtomicU64::new(0),
            opened: Instant::now(),
            tunnel: Mutex::new(None),
            reclaimable: OnceLock::new(),
        })
    }

    /// The tunnel an upgrade opened on the connection, if one did.
    pub(crate) fn take_tunnel(&self) -> Option<Tunnel> {
        self.tunnel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Counts a request in progress until the returned guard is dropped.
    pub(crate) fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy {
            activity: Arc::clone(self),
            permit: None,
        }
    }

    /// Records whether the request begun last, an HTTP/1.1 one, carries a body.
    pub(crate) fn carries_body(&self, body: bool) {
        self.body.store(body, Ordering::Relaxed);
    }

    /// Forgets the last request's body: the connection went idle after it, so hyper
    /// read it through (a body left unread closes the connection at its answer).
    pub(crate) fn body_read(&self) {
        self.body.store(false, Ordering::Relaxed);
    }

    /// Whether the last request carried a body that may be unread.
    pub(crate) fn may_have_unread_body(&self) -> bool {
        self.body.load(Ordering::Relaxed)
    }

    /// When the connection last became idle, or `None` while a request is in progress.
    fn idle_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let nanos = self.last_end.load(Ordering::Acquire);
        Some(self.opened + Duration::from_nanos(nanos))
    }

    /// Completes once the connection has had no request in progress for `timeout`
    /// (counting from its opening if it has had none yet).
    pub(crate) fn idle(&self, timeout: Duration) -> Idle<'_> {
        Idle {
            activity: self,
            timeout,
            armed: false,
            sleep: tokio::time::sleep_until(self.opened + timeout),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Activity::idle`]. It is polled at every wake of the connection's
    /// task (a few per request), but polls its timer only to register it and once it
    /// has fired: between those, a poll is one load, where polling a `Sleep` goes
    /// through tokio's budget, the driver's handle and the waker's registration. The
    /// connection's task is its only poller, so the waker registered stays current.
    #[derive(Debug)]
    pub(crate) struct Idle<'a> {
        activity: &'a Activity,
        timeout: Duration,
        // Whether the timer has been polled, and so registered, since it was last set.
        armed: bool,
        #[pin]
        sleep: Sleep,
    }
}

impl Future for Idle<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            if *this.armed && !this.sleep.is_elapsed() {
                return Poll::Pending;
            }
            *this.armed = true;
            std::task::ready!(this.sleep.as_mut().poll(cx));
            let now = Instant::now();
            let deadline = match this.activity.idle_since() {
                Some(since) if now.saturating_duration_since(since) >= *this.timeout => {
                    return Poll::Ready(());
                }
                Some(since) => since + *this.timeout,
                // Busy: the earliest it can have been idle long enough.
                None => now + *this.timeout,
            };
            this.sleep.as_mut().reset(deadline);
            *this.armed = false;
        }
    }
}

pin_project_lite::pin_project! {
    /// Completes once the proxy begins to shut down (`changed` completes, from a
    /// `watch::Receiver::changed` of `probe`'s channel). Like [`Idle`], it is polled at
    /// every wake of the connection's task, but polls `changed` only to register and
    /// once the channel has changed: between those, a poll is one load, where polling
    /// `changed` takes the channel's waiter lock. The connection's task is its only
    /// poller, so the waker registered stays current.
    pub(crate) struct Stopping<F> {
        #[pin]
        changed: F,
        probe: watch::Receiver<()>,
        // Whether `changed` has been polled, and so registered.
        armed: bool,
    }
}

impl<F> Stopping<F> {
    /// Completes with `changed`, a `changed()` future of a receiver of `probe`'s
    /// channel, which had seen the same value as `probe`.
    pub(crate) fn new(changed: F, probe: watch::Receiver<()>) -> Self {
        Stopping {
            changed,
            probe,
            armed: false,
        }
    }
}

impl<F: Future> Future for Stopping<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        // A sender dropped counts as a change, as it ends `changed` too.
        if *this.armed && !this.probe.has_changed().unwrap_or(true) {
            return Poll::Pending;
        }
        *this.armed = true;
        this.changed.poll(cx).map(|_| ())
    }
}

/// A request in progress on a connection, until dropped, with its concurrency permit
/// once its response holds one.
#[derive(Debug)]
pub(crate) struct Busy {
    activity: Arc<Activity>,
    permit: Option<HeldPermit>,
}

impl Busy {
    /// `response`, with this request counted in progress, and its concurrency permit
    /// (if the admission layer put one in its extensions) held, until its body ends:
    /// one wrapper for both, where [`hold_permit_through_body`] would box the body
    /// once more.
    ///
    /// [`hold_permit_through_body`]: crate::http::hold_permit_through_body
    pub(crate) fn hold_through_body<B>(
        mut self,
        mut response: http::Response<B>,
    ) -> http::Response<HoldUntilEnd<B, Busy>> {
        self.permit = response.extensions_mut().remove::<HeldPermit>();
        response.map(|body| HoldUntilEnd::new(body, self))
    }

    /// Whether the connection closes after this request's answer, an HTTP/1.1 one, to
    /// make room at the cap ([`Reclaimable::close_after_answer`]).
    pub(crate) fn close_after_answer(&self) -> bool {
        self.activity
            .reclaimable
            .get()
            .is_some_and(|room| room.close_after_answer())
    }

    /// Moves the tunnel of a 101 (put in its extensions by the forwarder), with the
    /// request's concurrency permit, to the connection, whose task runs it once hyper
    /// has handed the connection over: the permit is then held until the tunnel
    /// closes. Any other response is left as it is, for one status check.
    pub(crate) fn hand_over_tunnel<B>(&self, response: &mut http::Response<B>) {
        if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            return;
        }
        let extensions = response.extensions_mut();
        if let Some(tunnel) = extensions.remove::<Tunnel>() {
            let tunnel = tunnel.holding(extensions.remove::<HeldPermit>());
            *self
                .activity
                .tunnel
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(tunnel);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.activity;
        let nanos = Instant::now().saturating_duration_since(activity.opened);
        let nanos = u64::try_from(nanos.as_nanos()).unwrap_or(u64::MAX);
        // Stamped before the count drops, so whoever sees the count at 0 sees the
        // stamp of the request that ended last.
        activity.last_end.fetch_max(nanos, Ordering::Release);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Since when a connection's writes have been blocked, if they are.
#[derive(Debug)]
pub(crate) struct WriteStall {
    /// Nanoseconds from `opened` to the first write refused since the last one
    /// taken, plus one; 0 while writes are taken.
    blocked: AtomicU64,
    opened: Instant,
}

impl WriteStall {
    /// A connection whose writes are taken.
    pub(crate) fn new() -> Arc<WriteStall> {
        Arc::new(WriteStall {
            blocked: AtomicU64::new(0),
            opened: Instant::now(),
        })
    }

    /// Records a write: refused (`pending`), or taken.
    fn wrote(&self, pending: bool) {
        let blocked = self.blocked.load(Ordering::Relaxed);
        if pending && blocked == 0 {
            let since = Instant::now().saturating_duration_since(self.opened);
            let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX - 1);
            self.blocked.store(nanos + 1, Ordering::Relaxed);
        } else if !pending && blocked != 0 {
            self.blocked.store(0, Ordering::Relaxed);
        }
    }

    /// When the writes began to be refused, if they are.
    fn blocked_since(&self) -> Option<Instant> {
        match self.blocked.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.opened + Duration::from_nanos(n - 1)),
        }
    }

    /// Completes once the writes have been refused for `timeout` on end.
    pub(crate) fn stalled(&self, timeout: Duration) -> Stalled<'_> {
        Stalled {
            stall: self,
            timeout,
            armed: false,
            sleep: tokio::time::sleep_until(self.opened),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`WriteStall::stalled`]. Polled at every wake of the connection's
    /// task, it is one load while writes are taken; its timer is set when they are not,
    /// and, like [`Idle`]'s, it is polled only to register and once it has fired. The
    /// connection's task is its only poller, and writes the socket: a write refused in
    /// a wake is seen by the poll of this future in the same wake.
    #[derive(Debug)]
    pub(crate) struct Stalled<'a> {
        stall: &'a WriteStall,
        timeout: Duration,
        // Whether the timer has been polled, and so registered, since it was last set.
        armed: bool,
        #[pin]
        sleep: Sleep,
    }
}

impl Future for Stalled<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        let Some(since) = this.stall.blocked_since() else {
            return Poll::Pending;
        };
        let at = since + *this.timeout;
        loop {
            // Set for an earlier stall, the timer fires early and is set again.
            if *this.armed && !this.sleep.is_elapsed() {
                return Poll::Pending;
            }
            if Instant::now() >= at {
                return Poll::Ready(());
            }
            this.sleep.as_mut().reset(at);
            *this.armed = true;
            std::task::ready!(this.sleep.as_mut().poll(cx));
        }
    }
}

/// A client connection's socket, recording in a [`WriteStall`] whether its writes are
/// taken and in its [`Arrivals`] that bytes were read, and handed back to its
/// [`Handback`] when hyper drops it, for a lingering close.
#[derive(Debug)]
pub(crate) struct Watched {
    /// `None` once handed back, as it is dropped.
    stream: Option<TcpStream>,
    stall: Arc<WriteStall>,
    arrivals: Arc<Arrivals>,
    back: Arc<Handback>,
}

impl Watched {
    /// `stream`, its writes recorded in `stall` and its reads in `arrivals`, handed
    /// back to `back` when dropped.
    pub(crate) fn new(
        stream: TcpStream,
        stall: Arc<WriteStall>,
        arrivals: Arc<Arrivals>,
        back: Arc<Handback>,
    ) -> Self {
        Watched {
            stream: Some(stream),
            stall,
            arrivals,
            back,
        }
    }

    fn stream(&mut self) -> std::io::Result<Pin<&mut TcpStream>> {
        self.stream.as_mut().map(Pin::new).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotConnected, "socket handed back")
        })
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            *self.back.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(stream);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = self.stream()?.poll_read(cx, buf);
        if buf.filled().len() > before {
            self.arrivals.read();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = self.stream()?.poll_write(cx, buf);
        self.stall.wrote(polled.is_pending());
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = self.stream()?.poll_write_vectored(cx, bufs);
        self.stall.wrote(polled.is_pending());
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.stream()?.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.stream()?.poll_shutdown(cx)
    }
}

/// Where a [`Watched`] socket goes when hyper drops it: the connection's task takes it
/// back to close it as a lingering close, or drops it.
#[derive(Debug, Default)]
pub(crate) struct Handback(Mutex<Option<TcpStream>>);

impl Handback {
    /// The socket, once hyper has dropped it.
    pub(crate) fn take(&self) -> Option<TcpStream> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// The bounds of a lingering close: what a client may still send is read for at most
/// `time` in all, with no pause longer than `timeout`, and `bytes` in all; and where it
/// is counted.
#[derive(Clone, Debug)]
pub(crate) struct Lingering {
    pub(crate) time: Duration,
    pub(crate) timeout: Duration,
    pub(crate) bytes: u64,
    pub(crate) closes: Arc<LingeringCloses>,
}

/// How a lingering close ended: the `ended` label of `rocgate_lingering_closes_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LingerEnd {
    /// The client closed its side (or reset the connection).
    ClientClosed,
    /// The client sent nothing for `lingering_timeout`.
    Timeout,
    /// `lingering_time` was over.
    Time,
    /// The client sent more than the bytes a lingering close reads.
    Bytes,
    /// Shutdown began.
    Shutdown,
}

impl LingerEnd {
    /// Every end, in the order [`LingeringCloses`] counts them.
    pub(crate) const ALL: [LingerEnd; 5] = [
        LingerEnd::ClientClosed,
        LingerEnd::Timeout,
        LingerEnd::Time,
        LingerEnd::Bytes,
        LingerEnd::Shutdown,
    ];

    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LingerEnd::ClientClosed => "client_closed",
            LingerEnd::Timeout => "lingering_timeout",
            LingerEnd::Time => "lingering_time",
            LingerEnd::Bytes => "lingering_bytes",
            LingerEnd::Shutdown => "shutdown",
        }
    }
}

/// The lingering closes under way, and those done by how they ended, for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct LingeringCloses {
    under_way: AtomicUsize,
    /// By [`LingerEnd`], in the order of [`LingerEnd::ALL`].
    ended: [AtomicU64; LingerEnd::ALL.len()],
}

impl LingeringCloses {
    /// Lingering closes under way now.
    pub(crate) fn under_way(&self) -> usize {
        self.under_way.load(Ordering::Relaxed)
    }

    /// Lingering closes that ended `end` since start.
    pub(crate) fn ended(&self, end: LingerEnd) -> u64 {
        self.ended[end as usize].load(Ordering::Relaxed)
    }

    /// Counts a lingering close under way until the guard is dropped.
    fn begin(&self) -> UnderWay<'_> {
        self.under_way.fetch_add(1, Ordering::Relaxed);
        UnderWay(self)
    }
}

/// A lingering close counted as under way, until dropped.
struct UnderWay<'a>(&'a LingeringCloses);

impl UnderWay<'_> {
    /// Counts the close as ended `end`.
    fn ended(self, end: LingerEnd) {
        self.0.ended[end as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.under_way.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Closes `stream` as a lingering close, if the client may still be sending
/// (`unread_body`, or bytes waiting to be read now): shuts its write half, so that the
/// client reads the answer and then the end, and reads and throws away what it sends
/// until it closes its side, the bounds are reached, or `shutdown` completes, before
/// dropping it. Closed with bytes unread, a socket answers them, and all the client
/// sends after, with a reset. A lingering close is counted in `bounds.closes` while
/// under way, and by how it ended.
pub(crate) async fn linger(
    mut stream: TcpStream,
    unread_body: bool,
    bounds: Lingering,
    shutdown: impl Future<Output = ()>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut left = bounds.bytes;
    // Looked for in the socket itself: the runtime may not have seen bytes that came
    // since hyper's last read found none.
    if !unread_body && !has_bytes(&stream) {
        // Nothing waits (or the client is gone), and nothing is owed: a plain close.
        return;
    }
    let under_way = bounds.closes.begin();
    let reading = async {
        let _ = stream.shutdown().await;
        let mut buf = vec![0u8; 16 * 1024];
        let deadline = Instant::now() + bounds.time;
        while left > 0 {
            let pause_over = Instant::now() + bounds.timeout;
            match tokio::time::timeout_at(deadline.min(pause_over), stream.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return LingerEnd::ClientClosed,
                Err(_) if deadline <= pause_over => return LingerEnd::Time,
                Err(_) => return LingerEnd::Timeout,
                Ok(Ok(n)) => left = left.saturating_sub(n as u64),
            }
        }
        tracing::debug!(
            bytes = bounds.bytes,
            "lingering close: the client sent more than its bound"
        );
        LingerEnd::Bytes
    };
    let ended = tokio::select! {
        biased;
        () = shutdown => LingerEnd::Shutdown,
        ended = reading => ended,
    };
    under_way.ended(ended);
}

/// A response body as the client connection sends it: as it is (HTTP/1.1, whose
/// stalls [`Watched`] sees), or watched for a client that leaves it unread (HTTP/2).
#[derive(Debug)]
pub(crate) enum ClientBody {
    /// Sent as it is.
    Direct(HoldUntilEnd<Body, Busy>),
    /// One stream's body among the connection's [`Streams`].
    Watched(WatchedBody),
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        match self.get_mut() {
            ClientBody::Direct(body) => Pin::new(body).poll_frame(cx),
            ClientBody::Watched(body) => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Direct(body) => body.is_end_stream(),
            ClientBody::Watched(body) => body.with(|b| b.is_some_and(|b| b.is_end_stream())),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Direct(body) => body.size_hint(),
            ClientBody::Watched(body) => {
                body.with(|b| b.map_or_else(SizeHint::new, |b| b.size_hint()))
            }
        }
    }
}

/// The HTTP/2 responses in progress on one client connection, watched for a client
/// that leaves one unread.
///
/// HTTP/2 flow control lets a client take nothing of one stream while it reads its
/// socket (and answers pings): hyper then polls that stream's body no more, so the
/// socket's writes never stall and the connection never goes idle, and the response
/// would hold the upstream connection and the request's concurrency permit for as
/// long as the client likes. A body that has handed hyper a data frame and is not
/// polled again for the idle timeout is let go: its upstream body and its guards are
/// dropped (Envoy's `stream_idle_timeout` does the same), and when hyper polls it
/// again it fails, which resets the stream. [`Streams::sweep`] looks every quarter of
/// the timeout while the connection has responses in progress. A body waiting on the
/// upstream has handed nothing: that wait is `response_timeout`'s.
#[derive(Debug)]
pub(crate) struct Streams {
    opened: Instant,
    live: Mutex<Live>,
    /// Whether [`Streams::watch`] has woken the sweep since it last went to wait.
    woken: AtomicBool,
}

/// The bodies [`Streams`] watches, and the sweep's waker while it has none to watch.
#[derive(Debug, Default)]
struct Live {
    streams: Vec<Weak<Stream>>,
    /// The length at which ended streams are next pruned from `streams`.
    prune_at: usize,
    sweep: Option<Waker>,
}

/// One watched body.
#[derive(Debug)]
struct Stream {
    /// Nanoseconds from [`Streams::opened`] to the data frame the body last handed,
    /// plus one, until it is polled again; 0 while it owes the client nothing.
    handed: AtomicU64,
    /// `None` once let go.
    body: Mutex<Option<HoldUntilEnd<Body, Busy>>>,
}

/// Nanoseconds from `opened` to now (at most `u64::MAX - 1`, so that one more fits).
fn nanos_since(opened: Instant) -> u64 {
    let since = Instant::now().saturating_duration_since(opened);
    u64::try_from(since.as_nanos()).unwrap_or(u64::MAX - 1)
}

/// A response body of an HTTP/2 stream, watched by its connection's [`Streams`].
#[derive(Debug)]
pub(crate) struct WatchedBody {
    stream: Arc<Stream>,
    /// When its connection opened, the origin of [`Stream::handed`].
    opened: Instant,
}

impl WatchedBody {
    fn with<T>(&self, f: impl FnOnce(Option<&HoldUntilEnd<Body, Busy>>) -> T) -> T {
        f(self
            .stream
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref())
    }

    fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let stream = &self.stream;
        let mut body = stream.body.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(inner) = body.as_mut() else {
            return Poll::Ready(Some(Err(axum::Error::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took nothing of the response for idle_timeout",
            )))));
        };
        stream.handed.store(0, Ordering::Relaxed);
        let polled = Pin::new(inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if frame.is_data() {
                stream
                    .handed
                    .store(nanos_since(self.opened) + 1, Ordering::Relaxed);
            }
        }
        polled
    }
}

impl Streams {
    /// A connection opened now, with no response in progress.
    pub(crate) fn new() -> Arc<Streams> {
        Arc::new(Streams {
            opened: Instant::now(),
            live: Mutex::new(Live::default()),
            woken: AtomicBool::new(false),
        })
    }

    /// `response`, its body watched.
    pub(crate) fn watch(
        &self,
        response: http::Response<HoldUntilEnd<Body, Busy>>,
    ) -> http::Response<ClientBody> {
        response.map(|body| {
            let stream = Arc::new(Stream {
                handed: AtomicU64::new(0),
                body: Mutex::new(Some(body)),
            });
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            if live.streams.len() >= live.prune_at {
                live.streams.retain(|s| s.strong_count() > 0);
                live.prune_at = (2 * live.streams.len()).max(16);
            }
            live.streams.push(Arc::downgrade(&stream));
            if let Some(sweep) = live.sweep.take() {
                self.woken.store(true, Ordering::Release);
                sweep.wake();
            }
            ClientBody::Watched(WatchedBody {
                stream,
                opened: self.opened,
            })
        })
    }

    /// Lets go of every body that has handed a frame and not been polled since, for
    /// `timeout`, and forgets the bodies that have ended.
    fn let_go_stalled(&self, timeout: Duration) {
        let now = nanos_since(self.opened);
        let timeout = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.streams.retain(|s| {
            let Some(stream) = s.upgrade() else {
                return false;
            };
            let handed = stream.handed.load(Ordering::Relaxed);
            if handed == 0 || now.saturating_sub(handed - 1) < timeout {
                return true;
            }
            let body = stream
                .body
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            tracing::debug!("HTTP/2 stream let go: the client took nothing of it for idle_timeout");
            drop(body);
            false
        });
    }

    /// Never completes: lets go of the bodies left unread for `timeout`, looking every
    /// quarter of it while any body is watched. The connection's task polls it.
    pub(crate) fn sweep(&self, timeout: Duration) -> Sweep<'_> {
        Sweep {
            streams: self,
            timeout,
            armed: false,
            waiting: false,
            sleep: tokio::time::sleep_until(self.opened),
        }
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Streams::sweep`]. Like [`Idle`], it is polled at every wake of
    /// the connection's task, but polls its timer only to register it and once it has
    /// fired; with no body to watch it waits, timer unset, for [`Streams::watch`] to
    /// wake it, and a poll meanwhile is one load (an HTTP/1.1 connection's every poll).
    /// The connection's task is its only poller, so the waker registered stays current.
    #[derive(Debug)]
    pub(crate) struct Sweep<'a> {
        streams: &'a Streams,
        timeout: Duration,
        // Whether the timer has been polled, and so registered, since it was last set.
        armed: bool,
        // Whether the waker is registered with `streams` for the next body watched.
        waiting: bool,
        #[pin]
        sleep: Sleep,
    }
}

impl Future for Sweep<'_> {
    type Output = Infallible;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Infallible> {
        let mut this = self.project();
        if *this.waiting && !this.streams.woken.load(Ordering::Acquire) {
            return Poll::Pending;
        }
        *this.waiting = false;
        loop {
            if *this.armed {
                if !this.sleep.is_elapsed() {
                    return Poll::Pending;
                }
                *this.armed = false;
                this.streams.let_go_stalled(*this.timeout);
            }
            {
                let mut live = this
                    .streams
                    .live
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if live.streams.is_empty() {
                    live.sweep = Some(cx.waker().clone());
                    this.streams.woken.store(false, Ordering::Relaxed);
                    *this.waiting = true;
                    return Poll::Pending;
                }
            }
            let period = *this.timeout / 4;
            this.sleep.as_mut().reset(Instant::now() + period);
            *this.armed = true;
            std::task::ready!(this.sleep.as_mut().poll(cx));
        }
    }
}

/// hyper's timer for one client connection's HTTP/1 request heads
/// (`header_read_timeout`). hyper asks its timer for a new sleep for every request
/// head, polls it while the head is incomplete and drops it once the head is in: with
/// tokio's own sleeps, each request registered a timer in the runtime's wheel and
/// cancelled it, under the wheel's lock. The sleeps of one connection share one tokio
/// sleep instead, set to a sleep's deadline only when it fires: a connection's heads
/// come one after another, each with a later deadline than the one before, so the
/// shared sleep, set for an earlier one, fires early, never late, and is then set
/// again. Polled only by the connection's task, so the waker registered stays current.
///
/// hyper makes a head's sleep as the connection goes idle after a response, and would
/// close a keep-alive connection idle for `header_read_timeout`, with no
/// `Connection: close` sent: a client that reused it then got an empty reply. Every
/// head but the connection's first has its time from its first byte instead: its
/// sleep waits, with no timer set, until [`Watched`] has read a byte, and has
/// `header_read_timeout` from the poll that follows that read (from the byte, as
/// nginx's `client_header_timeout` runs, rather than from the sleep's start: a head
/// begun just before a deadline counted from the lull would be cut off while it
/// arrives). Until then the connection is idle, and [`Activity::idle`] closes it at
/// `idle_timeout`. The first head keeps hyper's deadline: its first bytes were read
/// before its sleep was made (to tell HTTP/1.1 from HTTP/2), within
/// `header_read_timeout` of the connection's opening.
///
/// A head whose first bytes hyper read before it made the head's sleep (sent in the
/// previous head's packet, or while the previous request was in flight: hyper reads
/// ahead then) is taken for an idle wait, and a stall in it is closed at
/// `idle_timeout`, as an idle connection is: hyper does not say whether its read
/// buffer holds anything when it makes the sleep.
#[derive(Clone, Debug)]
pub(crate) struct HeadTimer {
    shared: Arc<Heads>,
}

/// What a connection's [`HeadSleep`]s share.
#[derive(Debug)]
struct Heads {
    sleep: Mutex<SharedSleep>,
    /// The time a head has from its first byte.
    timeout: Duration,
    arrivals: Arc<Arrivals>,
    /// Whether the connection's first head has had its sleep.
    first_made: AtomicBool,
}

/// The sleep a connection's [`HeadSleep`]s share.
#[derive(Debug)]
struct SharedSleep {
    sleep: Pin<Box<Sleep>>,
    /// Whether the sleep has been polled, and so registered, since it was last set.
    armed: bool,
}

/// Whether a client connection's socket has been read bytes from since its
/// [`HeadTimer`] last made a sleep: the connection's [`Watched`] socket records its
/// reads, a store each.
#[derive(Debug, Default)]
pub(crate) struct Arrivals(AtomicBool);

impl Arrivals {
    /// Records bytes read (or peeked at, to tell the connection's protocol).
    pub(crate) fn read(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether bytes were read since the last [`Arrivals::clear`].
    fn seen(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Forgets the reads so far.
    fn clear(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

impl HeadTimer {
    /// A timer for one connection, whose heads have `timeout` each.
    pub(crate) fn new(timeout: Duration) -> Self {
        HeadTimer {
            shared: Arc::new(Heads {
                sleep: Mutex::new(SharedSleep {
                    // Fires at its first poll, which sets it to that sleep's deadline.
                    sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
                    armed: false,
                }),
                timeout,
                arrivals: Arc::default(),
                first_made: AtomicBool::new(false),
            }),
        }
    }

    /// Times the HTTP/1 request heads of the one connection `builder` serves next
    /// with a timer of its own, each head `timeout`; returns where the connection's
    /// [`Watched`] socket must record its reads. The proxy's client connections and
    /// the admin API's are timed so.
    pub(crate) fn time_heads(
        builder: &mut auto::Builder<TokioExecutor>,
        timeout: Duration,
    ) -> Arc<Arrivals> {
        let heads = HeadTimer::new(timeout);
        let arrivals = Arc::clone(&heads.shared.arrivals);
        builder.http1().timer(heads);
        arrivals
    }
}

impl hyper::rt::Timer for HeadTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until((Instant::now() + duration).into_std())
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let shared = &self.shared;
        let at = if shared.first_made.load(Ordering::Relaxed) {
            // hyper makes the sleep before it reads: a byte read from now on is this
            // head's.
            shared.arrivals.clear();
            None
        } else {
            shared.first_made.store(true, Ordering::Relaxed);
            Some(Instant::from_std(deadline))
        };
        Box::pin(HeadSleep {
            shared: Arc::clone(shared),
            at,
        })
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: std::time::Instant) {
        match sleep.as_mut().downcast_mut_pin::<HeadSleep>() {
            Some(mut own) => own.at = Some(Instant::from_std(new_deadline)),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }

    /// tokio's clock, as hyper-util's `TokioTimer` reads it (paused in tests).
    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }
}

/// One request head's wait, on its connection's [`HeadTimer`].
#[derive(Debug)]
struct HeadSleep {
    shared: Arc<Heads>,
    /// The head's deadline; `None` until its first byte is read (the connection idle
    /// between requests, its wait bounded by `idle_timeout`).
    at: Option<Instant>,
}

impl Future for HeadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let at = match this.at {
            Some(at) => at,
            // Idle: the socket's read, which hyper polled before this, wakes the task
            // when a byte comes.
            None if !this.shared.arrivals.seen() => return Poll::Pending,
            None => *this.at.insert(Instant::now() + this.shared.timeout),
        };
        let mut shared = this
            .shared
            .sleep
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let SharedSleep { sleep, armed } = &mut *shared;
        // Set for a later deadline (a reset moved this one earlier): it would fire late.
        if sleep.deadline() > at {
            sleep.as_mut().reset(at);
            *armed = false;
        }
        loop {
            if *armed && !sleep.is_elapsed() {
                return Poll::Pending;
            }
            *armed = true;
            std::task::ready!(sleep.as_mut().poll(cx));
            if Instant::now() >= at {
                return Poll::Ready(());
            }
            sleep.as_mut().reset(at);
            *armed = false;
        }
    }
}

impl hyper::rt::Sleep for HeadSleep {}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[tokio::test]
    async fn places_are_given_back_when_dropped() {
        let connections = ClientConnections::new(2);
        let a = connections.try_acquire().expect("a first place");
        let b = connections.try_acquire().expect("a second place");
        assert!(connections.try_acquire().is_none(), "two of two taken");
        // A place counts as open once a connection is accepted into it.
        assert_eq!(connections.open(), 0);
        let admit = || connections.admit(PEER).expect("no cap per client");
        let a = connections.open_in(a, admit());
        let b = connections.open_in(b, admit());
        assert_eq!(connections.open(), 2);
        drop(a);
        assert_eq!(connections.open(), 1);
        let c = connections.open_in(connections.acquire().await, admit());
        assert_eq!(connections.open(), 2);
        assert_eq!(connections.reached(), 1);
        assert_eq!(connections.limit_reached(), 1);
        drop((b, c));
        assert_eq!(connections.open(), 0);
    }

    /// Opens a connection from `peer`, if its address is under its cap.
    fn open_from(connections: &ClientConnections, peer: &str) -> Option<Slot> {
        let admitted = connections.admit(peer.parse().unwrap())?;
        let place = connections.try_acquire().expect("places to spare");
        Some(connections.open_in(place, admitted))
    }

    #[test]
    fn a_client_address_holds_at_most_its_cap_and_the_trusted_proxies_none() {
        let trusted = vec!["10.0.0.0/8".parse().unwrap()];
        let connections = ClientConnections::new(100).per_client(Some(2), trusted, Vec::new());
        let a = open_from(&connections, "192.0.2.1").expect("a first");
        let b = open_from(&connections, "::ffff:192.0.2.1").expect("a second, mapped");
        assert!(open_from(&connections, "192.0.2.1").is_none(), "a third");
        assert_eq!((connections.open(), connections.refused()), (2, 1));
        // Another address has its own two; an IPv6 client's /64 is one address.
        let v6 = [
            open_from(&connections, "2001:db8:0:1::1"),
            open_from(&connections, "2001:db8:0:1:ffff::2"),
        ];
        assert!(v6.iter().all(Option::is_some));
        assert!(open_from(&connections, "2001:db8:0:1::3").is_none());
        assert!(open_from(&connections, "2001:db8:0:2::1").is_some());
        // A trusted proxy's connections carry many clients: none is refused.
        let proxy: Vec<_> = (0..5)
            .map(|_| open_from(&connections, "10.1.2.3"))
            .collect();
        assert!(proxy.iter().all(Option::is_some));
        assert_eq!(connections.refused(), 2);
        // A connection that closes gives its address's place back, and an address
        // with none open is forgotten.
        drop(a);
        let c = open_from(&connections, "192.0.2.1").expect("a place given back");
        drop((b, c, v6));
        let cap = connections.per_client.as_ref().unwrap();
        assert!(cap.open.lock().unwrap().is_empty());
        assert_eq!(connections.open(), 5);
    }

    /// A load balancer's own connections are not counted, but the clients its headers
    /// name are, their addresses in its network or not; a trusted proxy named is not.
    #[test]
    fn a_named_client_is_counted_in_the_balancers_network_a_trusted_proxy_not() {
        let trusted = vec!["198.51.100.0/24".parse().unwrap()];
        let balancers = vec!["10.0.0.0/8".parse().unwrap()];
        let connections = ClientConnections::new(100).per_client(Some(1), trusted, balancers);
        let balancer: IpAddr = "10.0.0.1".parse().unwrap();
        let accepted = [connections.admit(balancer), connections.admit(balancer)];
        assert!(accepted.iter().all(Option::is_some), "a balancer's own");
        let named: IpAddr = "10.9.9.9".parse().unwrap();
        let first = connections.admit_named(named).expect("its first");
        assert!(connections.admit_named(named).is_none(), "its second");
        let proxy: IpAddr = "198.51.100.4".parse().unwrap();
        let behind = [
            connections.admit_named(proxy),
            connections.admit_named(proxy),
        ];
        assert!(behind.iter().all(Option::is_some), "a trusted proxy's");
        assert_eq!(connections.refused(), 1);
        drop((accepted, first, behind));
    }

    /// The first refusal is warned of, at any instant of the clock (its origin
    /// included), then one at most every period; a clock read behind the last warning
    /// warns of none.
    #[test]
    fn a_refusal_is_warned_of_first_then_once_a_period() {
        let every = Duration::from_secs(10);
        let connections = ClientConnections::new(1);
        assert!(connections.warn_refusal(Nanos::ZERO, every));
        assert!(!connections.warn_refusal(Nanos::ZERO, every));
        assert!(!connections.warn_refusal(Nanos::from_millis(9_999), every));
        assert!(connections.warn_refusal(Nanos::from_secs(10), every));
        assert!(!connections.warn_refusal(Nanos::from_secs(5), every));
        assert!(!connections.warn_refusal(Nanos::from_secs(19), every));
        assert!(connections.warn_refusal(Nanos::from_secs(25), every));
    }

    /// Header refusals are warned of as per-client ones, on a clock of their own:
    /// the first, then one a period, each with the count of those not warned of since.
    #[test]
    fn a_header_refusal_is_warned_of_once_a_period_with_the_count_left_out() {
        let every = Duration::from_secs(10);
        let connections = ClientConnections::new(1);
        assert!(connections.warn_refusal(Nanos::ZERO, every));
        assert_eq!(connections.warn_header_refusal(Nanos::ZERO, every), Some(0));
        assert_eq!(
            connections.warn_header_refusal(Nanos::from_secs(1), every),
            None
        );
        assert_eq!(
            connections.warn_header_refusal(Nanos::from_secs(9), every),
            None
        );
        assert_eq!(
            connections.warn_header_refusal(Nanos::from_secs(10), every),
            Some(2)
        );
        assert_eq!(
            connections.warn_header_refusal(Nanos::from_secs(5), every),
            None
        );
        assert_eq!(
            connections.warn_header_refusal(Nanos::from_secs(30), every),
            Some(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_the_timeout_after_the_last_request() {
        const TIMEOUT: Duration = Duration::from_secs(60);
        let activity = Activity::new();
        let idle = activity.idle(TIMEOUT);
        tokio::pin!(idle);
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(50)).await;
        let busy = activity.begin();
        // In progress through the first deadline (60 s) and for 100 s more.
        tokio::select! {
            () = &mut idle => panic!("idle while a request is in progress"),
            () = tokio::time::sleep(Duration::from_secs(100)) => {}
        }
        drop(busy);
        let ended = Instant::now();
        idle.await;
        assert_eq!(ended - start, Duration::from_secs(150));
        assert_eq!(Instant::now() - ended, TIMEOUT);
    }

    #[tokio::test]
    async fn stopping_completes_when_the_channel_changes_after_its_first_poll() {
        let (stop, mut rx) = watch::channel(());
        let probe = rx.clone();
        let stopping = Stopping::new(rx.changed(), probe);
        tokio::pin!(stopping);
        // Polled a few times (registered, then skipping the channel), still pending.
        for _ in 0..3 {
            assert!(futures_poll(stopping.as_mut()).is_pending());
        }
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), stopping)
            .await
            .expect("a change completes it");
    }

    #[tokio::test]
    async fn stopping_completes_when_the_sender_is_dropped() {
        let (stop, mut rx) = watch::channel(());
        let probe = rx.clone();
        let stopping = Stopping::new(rx.changed(), probe);
        tokio::pin!(stopping);
        assert!(futures_poll(stopping.as_mut()).is_pending());
        drop(stop);
        tokio::time::timeout(Duration::from_secs(5), stopping)
            .await
            .expect("a dropped sender completes it");
    }

    /// Polls `future` once with a waker that does nothing.
    fn futures_poll<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
        future.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test(start_paused = true)]
    async fn head_sleeps_fire_at_their_own_deadlines_on_one_shared_timer() {
        use hyper::rt::Timer as _;
        const HEAD: Duration = Duration::from_secs(10);
        let timer = HeadTimer::new(HEAD);
        let arrivals = Arc::clone(&timer.shared.arrivals);
        let start = Instant::now();
        // Polled by this task, as hyper polls them in the connection's: the shared
        // sleep keeps the waker of the first poll.
        let mut first = timer.sleep(HEAD);
        assert!(poll_here(&mut first).await.is_pending());
        // The first head came in after 4 s: its sleep is dropped, and the connection,
        // idle, waits for its next head with no deadline.
        tokio::time::sleep(Duration::from_secs(4)).await;
        drop(first);
        let mut second = timer.sleep(HEAD);
        tokio::select! {
            () = &mut second => panic!("an idle wait timed as a head"),
            () = tokio::time::sleep(Duration::from_secs(100)) => {}
        }
        // A byte of it at 104 s: the head has 10 s from then, past the deadline the
        // shared sleep was set for.
        arrivals.read();
        second.await;
        assert_eq!(Instant::now() - start, Duration::from_secs(114));
        // A sleep moved earlier by a reset fires at its new deadline, byte or none.
        let mut third = timer.sleep(Duration::from_secs(30));
        assert!(poll_here(&mut third).await.is_pending());
        timer.reset(
            &mut third,
            (Instant::now() + Duration::from_secs(3)).into_std(),
        );
        third.await;
        assert_eq!(Instant::now() - start, Duration::from_secs(117));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_begun_after_an_idle_wait_has_the_head_timeout_from_its_first_byte() {
        use hyper::rt::Timer as _;
        const HEAD: Duration = Duration::from_secs(10);
        let timer = HeadTimer::new(HEAD);
        let arrivals = Arc::clone(&timer.shared.arrivals);
        // The first head's bytes were read before its sleep was made (hyper-util reads
        // them to tell HTTP/1.1 from HTTP/2): it keeps hyper's deadline, bytes or none.
        let start = Instant::now();
        timer.sleep(HEAD).await;
        assert_eq!(Instant::now() - start, HEAD);
        // Bytes read before a later head's sleep was made (the last request's) are
        // not its own: idle, it waits on.
        arrivals.read();
        let mut next = timer.sleep(HEAD);
        assert!(poll_here(&mut next).await.is_pending());
        tokio::time::sleep(Duration::from_secs(50)).await;
        assert!(poll_here(&mut next).await.is_pending());
        // Its first byte at 60 s, then more, dripped: 10 s from the first.
        let begun = Instant::now();
        arrivals.read();
        assert!(poll_here(&mut next).await.is_pending());
        tokio::time::sleep(Duration::from_secs(6)).await;
        arrivals.read();
        assert!(poll_here(&mut next).await.is_pending());
        next.await;
        assert_eq!(Instant::now() - begun, HEAD);
    }

    /// Polls `sleep` once with this task's waker.
    async fn poll_here(sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(sleep.as_mut().poll(cx))).await
    }

    /// Registers an HTTP/1.1 connection that has served one request, ended now.
    fn served_one(registry: &Arc<Reclaimable>) -> (Arc<Activity>, Arc<Arrivals>, Registered) {
        let activity = Activity::new();
        drop(activity.begin());
        let head = Arc::<Arrivals>::default();
        let registered = registry.register(Arc::clone(&activity), Some(Arc::clone(&head)));
        (activity, head, registered)
    }

    /// Whether `registered` is asked to close (and closes) at this poll.
    fn closes(registered: &Registered) -> bool {
        let asked = registered.asked();
        tokio::pin!(asked);
        futures_poll(asked).is_ready()
    }

    #[tokio::test(start_paused = true)]
    async fn the_connections_idle_longest_make_room_and_no_busy_one_does() {
        let registry = Arc::<Reclaimable>::default();
        // Oldest of all, but not idle: a request in progress, a next head begun.
        let busy = served_one(&registry);
        let request = busy.0.begin();
        let begun = served_one(&registry);
        begun.1.read();
        // 17 idle, gone idle a second apart, an HTTP/2 one among them.
        let mut idle = Vec::new();
        for n in 0..17 {
            tokio::time::advance(Duration::from_secs(1)).await;
            if n == 1 {
                let h2 = Activity::new();
                idle.push(registry.register(h2, None));
            } else {
                idle.push(served_one(&registry).2);
            }
        }
        // An eighth of the 17: the two idle longest, the HTTP/2 one second.
        assert_eq!(registry.make_room(), 2);
        let closing: Vec<bool> = idle.iter().map(closes).collect();
        assert_eq!(closing.iter().filter(|c| **c).count(), 2, "{closing:?}");
        assert!(closing[0] && closing[1], "{closing:?}");
        assert!(!closes(&busy.2) && !closes(&begun.2));
        // While those asked are closing, none other is asked; once closed, they leave.
        assert_eq!(registry.make_room(), 0);
        drop(idle.drain(..2));
        assert_eq!(registry.make_room(), 1);
        assert!(closes(&idle[0]));
        assert_eq!(registry.reclaimed.load(Ordering::Relaxed), 3);
        drop(request);
    }

    #[tokio::test(start_paused = true)]
    async fn with_none_idle_the_next_http1_answer_or_http2_connection_idle_makes_room() {
        let registry = Arc::<Reclaimable>::default();
        let (first, _, first_registered) = served_one(&registry);
        let (second, _, second_registered) = served_one(&registry);
        let requests = (first.begin(), second.begin());
        assert_eq!(registry.make_room(), 0);
        assert!(!closes(&first_registered));
        // The second goes idle first: its client, busy, may reuse it at once, and it
        // is not closed; the first's answer, made next, takes the room and says so.
        drop(requests.1);
        assert!(!closes(&second_registered));
        assert!(requests.0.close_after_answer());
        assert!(!second.begin().close_after_answer(), "the room is made");
        drop(requests.0);
        assert!(!closes(&first_registered) && !closes(&second_registered));
        registry.made_room();

        // An HTTP/1.1 connection idle for RECLAIM_IDLE_LEAST is closed at the loop's
        // next look; an HTTP/2 one, told by a GOAWAY, as soon as it goes idle.
        let h2 = Activity::new();
        let h2_registered = registry.register(Arc::clone(&h2), None);
        let request = h2.begin();
        assert_eq!(
            registry.make_room(),
            0,
            "the HTTP/1.1 ones idle too briefly"
        );
        drop(request);
        assert!(closes(&h2_registered));
        drop(h2_registered);
        registry.made_room();
        tokio::time::advance(RECLAIM_IDLE_LEAST).await;
        assert_eq!(registry.make_room(), 1);
        assert!(closes(&first_registered) || closes(&second_registered));
        registry.made_room();
        assert_eq!(registry.reclaimed.load(Ordering::Relaxed), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ask_passed_on_by_a_connection_busy_again_goes_to_the_next_answer() {
        let registry = Arc::<Reclaimable>::default();
        let (first, _, first_registered) = served_one(&registry);
        let (second, _, second_registered) = served_one(&registry);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            registry.make_room(),
            1,
            "an eighth of the two, at least one"
        );
        // Busy again by their polls: the one asked passes the ask on, which the next
        // answer takes; none closes as it goes idle.
        let again = (first.begin(), second.begin());
        assert!(!closes(&first_registered) && !closes(&second_registered));
        assert!(again.1.close_after_answer());
        drop(again);
        assert!(!closes(&first_registered) && !closes(&second_registered));
        registry.made_room();
        assert_eq!(registry.reclaimed.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ask_passed_on_after_the_room_was_made_closes_no_connection() {
        let registry = Arc::<Reclaimable>::default();
        let (first, _, first_registered) = served_one(&registry);
        tokio::time::advance(Duration::from_secs(1)).await;
        let (_second, _, second_registered) = served_one(&registry);
        assert_eq!(registry.make_room(), 1, "the first, idle longest");
        // Busy again before its task looks, and the connection waiting has its place
        // meanwhile (another closed): the ask it passes on finds no room wanted.
        let request = first.begin();
        registry.made_room();
        assert!(!closes(&first_registered));
        // The next to go idle, or idle already, is not closed: no connection waits.
        assert!(!closes(&second_registered));
        drop(request);
        assert!(!closes(&first_registered));
        assert_eq!(registry.reclaimed.load(Ordering::Relaxed), 0);
        // Room wanted again is made by the one idle longest, once.
        let request = first.begin();
        tokio::time::advance(RECLAIM_IDLE_LEAST).await;
        assert_eq!(registry.make_room(), 1, "the second");
        assert!(closes(&second_registered));
        drop(request);
        assert!(!closes(&first_registered));
    }

    #[tokio::test(start_paused = true)]
    async fn asks_not_yet_closed_count_against_the_room_wanted() {
        let registry = Arc::<Reclaimable>::default();
        // 12 idle: an eighth of them is one.
        let mut idle: Vec<Registered> = (0..12).map(|_| served_one(&registry).2).collect();
        tokio::time::advance(Duration::from_secs(1)).await;
        // 4 connections wait at the cap in turn, each looked for 3 times (every
        // RECLAIM_IDLE_LEAST) before the one asked for it closes and gives it its
        // place: the one asked, still closing, is room being made, and no other is
        // asked meanwhile. 4 waiting close 4, where asking again at every look
        // closed 3 for each.
        let mut asked = 0;
        for _ in 0..4 {
            for _ in 0..3 {
                asked += registry.make_room();
                tokio::time::advance(RECLAIM_IDLE_LEAST).await;
            }
            let at = idle.iter().position(closes).expect("one was asked");
            drop(idle.remove(at));
            registry.made_room();
        }
        assert_eq!(asked, 4);
        assert_eq!(registry.reclaimed.load(Ordering::Relaxed), 4);
        // A connection asked that has not closed within RECLAIM_ASK_PENDING_MOST (an
        // HTTP/2 client that does not answer its GOAWAY's ping) no longer counts: the
        // next look asks another.
        assert_eq!(registry.make_room(), 1);
        assert_eq!(registry.make_room(), 0);
        // Room being made is not left wanted for the next answer to make too.
        let (busy, _, _busy_registered) = served_one(&registry);
        assert!(!busy.begin().close_after_answer());
        tokio::time::advance(RECLAIM_ASK_PENDING_MOST).await;
        assert_eq!(registry.make_room(), 1);
        registry.made_room();
    }

    /// A connection closed with nothing owed (idle, or closed to make room) whose
    /// client's next request came before the runtime saw its socket readable (hyper's
    /// last read found nothing) is closed as a lingering close, not with the request
    /// unread: closed so, the socket would answer with a reset, which can throw away
    /// an answer its client has not read yet. (It was closed at once: the probe for
    /// bytes waiting asked the runtime, which had not looked.)
    #[tokio::test(flavor = "current_thread")]
    async fn bytes_the_runtime_has_not_seen_yet_make_a_lingering_close() {
        use std::io::{Read as _, Write as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        // hyper's last read found nothing, and the runtime has not looked since: the
        // request below comes as the server's task runs on.
        let nothing = server.try_read(&mut [0u8; 1]);
        assert!(
            nothing
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
            "{nothing:?}"
        );
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let closes = Arc::<LingeringCloses>::default();
        let bounds = Lingering {
            time: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            bytes: 1 << 20,
            closes: Arc::clone(&closes),
        };
        let lingering = linger(server, false, bounds, std::future::pending());
        tokio::pin!(lingering);
        assert!(
            futures_poll(lingering.as_mut()).is_pending(),
            "closed with the request unread"
        );
        assert_eq!(closes.under_way(), 1);
        // The client reads the end (not a reset), and closes its side.
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(client.read(&mut buf).unwrap(), 0);
        drop(client);
        tokio::time::timeout(Duration::from_secs(5), lingering)
            .await
            .expect("ends as the client closes");
        assert_eq!(closes.ended(LingerEnd::ClientClosed), 1);
    }

    /// A connection that has sent nothing, asked to close to make room while its task
    /// polls (after the poll looked whether it may be asked, before it reads the ask),
    /// still peeks at its socket before it closes: a head begun there keeps it open.
    /// (It closed with the head unread: the peek was gated on a look made before the
    /// ask.) The ask lands in that gap while the test holds the lock on the
    /// connection's waker, which the poll takes, at its first, between the two.
    #[test]
    fn an_ask_made_while_a_fresh_connection_polls_still_peeks_before_it_closes() {
        use std::io::Write as _;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (mut client, server) = runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            (client, listener.accept().await.unwrap().0)
        });
        let registry = Arc::<Reclaimable>::default();
        let first = Arc::<Arrivals>::default();
        let fresh = registry.register(Activity::new(), Some(Arc::clone(&first)));
        // Open long enough to be closed, and its first bytes come.
        runtime.block_on(async { tokio::time::sleep(RECLAIM_IDLE_LEAST).await });
        client.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let waker = fresh.reclaim.waker.lock().unwrap();
        let closed = std::thread::scope(|scope| {
            let polled = scope.spawn(|| {
                let closing = fresh.asked_before_first_byte(&server);
                tokio::pin!(closing);
                futures_poll(closing).is_ready()
            });
            // The poll, past its look, waits for the waker's lock; the loop asks. (Were
            // the poll slower to get there, the ask would come before its look, and the
            // test would prove nothing, not fail.)
            runtime.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
            registry.room.store(WAITING, Ordering::SeqCst);
            fresh.reclaim.ask();
            drop(waker);
            polled.join().unwrap()
        });
        assert!(!closed, "closed with a head begun");
        assert!(first.seen());
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_requests_is_idle_from_its_opening() {
        let activity = Activity::new();
        let start = Instant::now();
        activity.idle(Duration::from_secs(5)).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
    }
}
