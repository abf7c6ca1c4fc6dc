//! Client connections in `rocgate serve` over real sockets on 127.0.0.1: the cap
//! (`max_connections`) and the idle timeout (`idle_timeout`), HTTP/1.1 and h2c.
//!
//! Each test starts its own upstream and [`Proxy`] on ports the OS picks; every wait is
//! bounded by a timeout, and what is asserted is whether a connection is served or
//! closed, never how long that took.
#![cfg(feature = "proxy")]

#[path = "common/captured.rs"]
mod captured;

use captured::Captured;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rocgate::clock::{Clock, ManualClock, MonotonicClock};
use rocgate::config::{Config, RouteConfig, RouteMatch, ServerConfig};
use rocgate::proxy::{Proxy, ProxySettings};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Sleep};

/// The longest any single exchange may take before the test fails.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// The idle timeout of the tests that close idle connections: short, so that a test
/// waits little for the closing it expects.
const SHORT_IDLE: Duration = Duration::from_millis(300);
/// How long the upstream's `/slow` takes to answer, and its `/drip` to stream its body:
/// several idle timeouts.
const SLOW: Duration = Duration::from_millis(1500);
/// The chunks `/drip` sends, [`SLOW`] ÷ `DRIPS` apart.
const DRIPS: u32 = 5;

/// A body of [`DRIPS`] chunks, the first at once and each next one a while later.
struct Drip {
    left: u32,
    pause: Pin<Box<Sleep>>,
}

impl http_body::Body for Drip {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        if self.left < DRIPS {
            std::task::ready!(self.pause.as_mut().poll(cx));
            let next = tokio::time::Instant::now() + SLOW / DRIPS;
            self.pause.as_mut().reset(next);
        }
        self.left -= 1;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(b"d")))))
    }
}

/// An upstream answering `ok`; `/slow` answers after [`SLOW`], `/drip` streams its
/// body over [`SLOW`].
async fn start_upstream() -> SocketAddr {
    let app = Router::new()
        .route(
            "/slow",
            axum::routing::get(|| async {
                sleep(SLOW).await;
                "slow"
            }),
        )
        .route(
            "/drip",
            axum::routing::get(|| async {
                Body::new(Drip {
                    left: DRIPS,
                    pause: Box::pin(sleep(SLOW / DRIPS)),
                })
            }),
        )
        .fallback(|| async { "ok" });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A proxy running in a task of the test's runtime, stopped when dropped.
struct RunningProxy {
    addr: SocketAddr,
    admin: SocketAddr,
    _stop: oneshot::Sender<()>,
}

/// A proxy in front of `upstream` with `max_connections`, `idle_timeout` and
/// `header_read_timeout` (which also paces the HTTP/2 pings) as given.
async fn start_proxy(
    upstream: SocketAddr,
    max_connections: usize,
    idle_timeout: Duration,
    header_read_timeout: Duration,
) -> RunningProxy {
    let clock = Arc::new(MonotonicClock::new());
    start_proxy_on(
        clock,
        upstream,
        max_connections,
        idle_timeout,
        header_read_timeout,
    )
    .await
}

/// [`start_proxy`] with the engine and the accept loop on `clock`.
async fn start_proxy_on(
    clock: Arc<dyn Clock>,
    upstream: SocketAddr,
    max_connections: usize,
    idle_timeout: Duration,
    header_read_timeout: Duration,
) -> RunningProxy {
    let mut server = ServerConfig::default();
    server.max_connections = max_connections;
    server.idle_timeout = idle_timeout;
    server.header_read_timeout = header_read_timeout;
    start_proxy_with(clock, upstream, &server).await
}

/// A proxy in front of `upstream` with `server`'s settings, but on ports the OS picks,
/// with a 1 s shutdown grace, short upstream timeouts and a 64 KiB body limit.
async fn start_proxy_with(
    clock: Arc<dyn Clock>,
    upstream: SocketAddr,
    server: &ServerConfig,
) -> RunningProxy {
    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = {
        let mut built =
            ProxySettings::from_server(server, format!("http://{upstream}").parse().unwrap());
        built.listen = any_port;
        built.admin_listen = any_port;
        built.shutdown_grace = Duration::from_secs(1);
        built.forward.connect_timeout = Duration::from_secs(1);
        built.forward.response_timeout = Duration::from_secs(5);
        built.forward.max_body_bytes = 64 * 1024;
        built
    };
    // One route no request of these tests takes: every request is forwarded as is.
    let config = Config::new(vec![RouteConfig::new(
        "connections_none",
        RouteMatch::exact("GET", "/no-request-goes-here"),
    )]);
    let proxy = Proxy::bind_with_clock(settings, &config, None, clock)
        .await
        .unwrap();
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    RunningProxy {
        addr,
        admin,
        _stop: stop,
    }
}

/// `GET path`, naming the host as `localhost`: the admin API answers no other name
/// from loopback.
fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header("host", "localhost")
        .body(Empty::new())
        .unwrap()
}

/// An HTTP/1.1 client connection; aborting `conn` closes the socket.
struct H1 {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    conn: JoinHandle<hyper::Result<()>>,
}

impl H1 {
    async fn connect(addr: SocketAddr) -> H1 {
        H1::over(TcpStream::connect(addr).await.unwrap()).await
    }

    /// A connection to `addr` from the loopback address `source`.
    async fn connect_from(addr: SocketAddr, source: [u8; 4]) -> H1 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        H1::over(socket.connect(addr).await.unwrap()).await
    }

    async fn over(stream: TcpStream) -> H1 {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        H1 {
            sender,
            conn: tokio::spawn(conn),
        }
    }

    /// Sends a request once the connection is ready for one; answers with the status
    /// and body.
    async fn send(&mut self, path: &str) -> (StatusCode, Bytes) {
        self.try_send(path).await.unwrap()
    }

    /// [`send`](Self::send), or the error of a connection that closed.
    async fn try_send(&mut self, path: &str) -> hyper::Result<(StatusCode, Bytes)> {
        self.sender.ready().await?;
        let res = self.sender.send_request(get(path)).await?;
        let status = res.status();
        Ok((status, res.into_body().collect().await?.to_bytes()))
    }

    fn close(self) {
        self.conn.abort();
    }
}

/// An h2c (HTTP/2 with prior knowledge) client connection; `conn` ends when the
/// connection closes.
struct H2 {
    sender: hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
    conn: JoinHandle<hyper::Result<()>>,
}

impl H2 {
    async fn connect(addr: SocketAddr) -> H2 {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        H2 {
            sender,
            conn: tokio::spawn(conn),
        }
    }

    async fn send(&mut self, path: &str) -> Result<(StatusCode, Bytes), hyper::Error> {
        let res = self.sender.send_request(get(path)).await?;
        let status = res.status();
        Ok((status, res.into_body().collect().await?.to_bytes()))
    }
}

/// A value from the proxy's `/metrics`, `None` if the series is absent.
async fn metric(proxy: &RunningProxy, series: &str) -> Option<f64> {
    let mut admin = H1::connect(proxy.admin).await;
    let (status, body) = timeout(IO_TIMEOUT, admin.send("/metrics")).await.unwrap();
    admin.close();
    assert_eq!(status, StatusCode::OK);
    String::from_utf8_lossy(&body).lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().unwrap())
    })
}

async fn open_connections(proxy: &RunningProxy) -> f64 {
    metric(proxy, "rocgate_client_connections").await.unwrap()
}

/// At `max_connections`, connections whose requests are in progress (an h2c stream
/// whose body is still streaming, an HTTP/1.1 request waiting on a slow answer) are
/// not closed to make room: a new connection waits, the h2c one takes new streams
/// meanwhile (no GOAWAY), and their answers come whole. Once one of them has its
/// answer and goes idle, it is closed gracefully for the new one, which is served well
/// before `idle_timeout` (60 s: it waited that long for an idle keep-alive connection
/// to close).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_beyond_max_connections_waits_while_requests_are_in_progress() {
    let upstream = start_upstream().await;
    // Long timeouts: only making room closes a connection within the test.
    let secs = Duration::from_secs(60);
    let proxy = start_proxy(upstream, 2, secs, secs).await;
    // An h2c connection with no stream open is idle: its stream's answer has begun
    // (its head is in) before the third connection comes.
    let mut h2 = H2::connect(proxy.addr).await;
    let res = timeout(IO_TIMEOUT, h2.sender.send_request(get("/drip")))
        .await
        .unwrap()
        .unwrap();
    let drip = tokio::spawn(async move {
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ddddd", "answered whole");
    });
    let mut h1 = H1::connect(proxy.addr).await;
    let slow = tokio::spawn(async move {
        let (status, body) = timeout(IO_TIMEOUT, h1.send("/slow")).await.unwrap();
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"slow"[..]));
        h1
    });
    // The kernel completes the third connection (it waits at the cap), and its request
    // gets no answer while the two are in progress.
    let mut third = H1::connect(proxy.addr).await;
    let answer = tokio::spawn(async move {
        let answer = timeout(IO_TIMEOUT, third.send("/")).await;
        (answer, third)
    });
    sleep(SHORT_IDLE).await;
    assert!(!answer.is_finished(), "a third connection was served");
    // The admin API's connections are not counted.
    assert_eq!(open_connections(&proxy).await, 2.0);
    let reached = metric(&proxy, "rocgate_client_connection_limit_reached_total").await;
    assert!(reached >= Some(1.0), "the cap was reached: {reached:?}");
    // The h2c connection, busy, was not asked to close: it takes another stream.
    let (status, _) = timeout(IO_TIMEOUT, h2.send("/"))
        .await
        .unwrap()
        .expect("a new stream on the busy h2c connection");
    assert_eq!(status, StatusCode::OK);

    drip.await.unwrap();
    let h1 = slow.await.unwrap();
    let (served, third) = answer.await.unwrap();
    let (status, body) = served.expect("served once a connection went idle");
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    assert_eq!(open_connections(&proxy).await, 2.0);
    // The registry is the process's, shared with the other tests of this file: at
    // least this proxy's one.
    let reclaimed = "rocgate_client_connections_reclaimed_total";
    assert!(metric(&proxy, reclaimed).await >= Some(1.0));
    // The one closed for it was closed between requests: its client saw a clean end
    // (an h2c GOAWAY or an HTTP/1.1 end after the answer). The other stays open.
    let mut conns = vec![h2.conn, h1.conn];
    let closed = timeout(IO_TIMEOUT, async {
        loop {
            if let Some(at) = conns.iter().position(JoinHandle::is_finished) {
                break at;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("one of the two is closed");
    let ended = conns.remove(closed).await.unwrap();
    assert!(ended.is_ok(), "closed gracefully: {ended:?}");
    assert!(!conns[0].is_finished(), "both were closed");

    conns[0].abort();
    third.close();
    timeout(IO_TIMEOUT, async {
        while open_connections(&proxy).await != 0.0 {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the gauge falls to 0 once every connection is closed");
}

/// At `max_connections` with every connection busy, the next HTTP/1.1 answer closes
/// its connection for the one waiting, and says so (`Connection: close`): a client that
/// reuses its connection at once would otherwise find it closed, after an answer that
/// promised it open, before the answer to the request it sent next. The one waiting is
/// served then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_a_busy_http1_connection_closes_after_an_answer_that_says_so() {
    let upstream = start_upstream().await;
    let secs = Duration::from_secs(60);
    let proxy = start_proxy(upstream, 1, secs, secs).await;
    let mut busy = H1::connect(proxy.addr).await;
    busy.sender.ready().await.unwrap();
    let slow = busy.sender.send_request(get("/slow"));
    let slow = tokio::spawn(async move {
        let res = timeout(IO_TIMEOUT, slow).await.unwrap().unwrap();
        let close = res.headers().get(http::header::CONNECTION).cloned();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (close, body)
    });
    sleep(SHORT_IDLE).await;
    let mut waiting = H1::connect(proxy.addr).await;
    let (status, body) = timeout(IO_TIMEOUT, waiting.send("/"))
        .await
        .expect("served once the busy one closed");
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    let (close, body) = slow.await.unwrap();
    assert_eq!(&body[..], b"slow", "answered whole");
    assert_eq!(close.as_ref().map(|v| v.as_bytes()), Some(&b"close"[..]));
    let ended = timeout(IO_TIMEOUT, busy.conn).await.unwrap().unwrap();
    assert!(ended.is_ok(), "closed gracefully: {ended:?}");
}

/// A connection accepted at `max_connections`, waiting for a place, is closed as
/// shutdown begins: its socket is not held while the connection in progress finishes
/// (within the 1 s grace), nor served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_waiting_at_the_cap_is_closed_at_shutdown() {
    let upstream = start_upstream().await;
    let secs = Duration::from_secs(60);
    let proxy = start_proxy(upstream, 1, secs, secs).await;
    let mut busy = H1::connect(proxy.addr).await;
    let slow = tokio::spawn(async move { busy.try_send("/slow").await });
    sleep(SHORT_IDLE).await;
    let mut waiting = H1::connect(proxy.addr).await;
    let answer = tokio::spawn(async move { waiting.try_send("/").await });
    sleep(SHORT_IDLE).await;
    assert!(!answer.is_finished(), "served at the cap");
    drop(proxy);
    let answer = timeout(SHORT_IDLE, answer)
        .await
        .expect("closed as shutdown begins")
        .unwrap();
    assert!(answer.is_err(), "not served: {answer:?}");
    slow.abort();
}

/// At `max_connections`, open connections idle between requests are closed to make
/// room for a new one, the oldest idle first, gracefully: an HTTP/1.1 one after its
/// answer (its client reads the end, no reset), an h2c one with a GOAWAY. The new
/// connection is served at once, where it waited for one of them to close at
/// `idle_timeout` (60 s). Connections not needed for room stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_oldest_first_to_make_room_at_the_cap() {
    use tokio::io::AsyncReadExt;
    let upstream = start_upstream().await;
    let secs = Duration::from_secs(60);
    let proxy = start_proxy(upstream, 3, secs, secs).await;
    // Idle in this order: an HTTP/1.1 connection, an h2c one, another HTTP/1.1 one.
    let mut oldest = TcpStream::connect(proxy.addr).await.unwrap();
    raw_request(&mut oldest).await;
    let mut h2 = H2::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, h2.send("/")).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK);
    let mut newest = H1::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, newest.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // An HTTP/1.1 connection is closed to make room once idle for 100 ms.
    sleep(SHORT_IDLE).await;

    let mut fourth = H1::connect(proxy.addr).await;
    let (status, body) = timeout(IO_TIMEOUT, fourth.send("/"))
        .await
        .expect("served while the others idle");
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    // The oldest was closed after its answer, which its client had read whole: it
    // reads the end, not a reset.
    let mut buf = [0u8; 64];
    let end = timeout(IO_TIMEOUT, oldest.read(&mut buf)).await.unwrap();
    assert!(matches!(end, Ok(0)), "a clean end: {end:?}");

    // The fourth is idle now too; the next oldest, the h2c one, makes room next.
    let mut fifth = H1::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, fifth.send("/"))
        .await
        .expect("served while the others idle");
    assert_eq!(status, StatusCode::OK);
    let ended = timeout(IO_TIMEOUT, h2.conn)
        .await
        .expect("the h2c connection is closed")
        .unwrap();
    assert!(ended.is_ok(), "closed gracefully: {ended:?}");
    assert!(!newest.conn.is_finished() && !fourth.conn.is_finished());
    let (status, _) = timeout(IO_TIMEOUT, newest.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // At least this proxy's two: the registry is shared with the other tests.
    let reclaimed = "rocgate_client_connections_reclaimed_total";
    assert!(metric(&proxy, reclaimed).await >= Some(2.0));
}

/// At `max_connections`, a connection that has sent nothing (a browser's preconnect, or
/// a client that holds places by opening connections) is closed to make room once open
/// for 100 ms, as an idle one is, without an answer: nothing was asked. One whose first
/// bytes came is not: an HTTP/1.1 head begun, or part of HTTP/2's preface (still being
/// told apart from HTTP/1.1), is served once whole. Before, the new connection waited
/// for the silent one to reach `header_read_timeout` (60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_has_sent_nothing_is_closed_to_make_room_at_the_cap() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = start_upstream().await;
    let secs = Duration::from_secs(60);
    let proxy = start_proxy(upstream, 3, secs, secs).await;
    let mut silent = TcpStream::connect(proxy.addr).await.unwrap();
    let mut head = TcpStream::connect(proxy.addr).await.unwrap();
    head.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let mut preface = TcpStream::connect(proxy.addr).await.unwrap();
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    sleep(SHORT_IDLE).await;

    let mut fourth = H1::connect(proxy.addr).await;
    let (status, body) = timeout(IO_TIMEOUT, fourth.send("/"))
        .await
        .expect("served while a silent connection held a place");
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
    let mut buf = [0u8; 64];
    let end = timeout(IO_TIMEOUT, silent.read(&mut buf)).await.unwrap();
    assert!(matches!(end, Ok(0)), "closed with nothing sent: {end:?}");
    // The head begun is served once whole.
    head.write_all(b"Host: rocgate.test\r\n\r\n").await.unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n\r\nok") {
        let n = timeout(IO_TIMEOUT, head.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_ne!(n, 0, "closed before its answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    // The h2c one, its preface whole and its SETTINGS sent, has the server's.
    preface
        .write_all(b"\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut frame = [0u8; 9];
    timeout(IO_TIMEOUT, preface.read_exact(&mut frame))
        .await
        .unwrap()
        .expect("open, not closed for the fourth");
    assert_eq!(frame[3], 0x04, "a SETTINGS frame: {frame:?}");
}

/// With `max_connections_per_client`, an address that holds that many has its next
/// connection closed as soon as it is accepted, while another address is served; a
/// connection that closes gives its address's place back. The trusted proxies'
/// connections are not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_address_beyond_its_cap_is_closed_while_others_are_served() {
    let upstream = start_upstream().await;
    let mut server = ServerConfig::default();
    server.max_connections_per_client = Some(2);
    server.idle_timeout = Duration::from_secs(60);
    let proxy = start_proxy_with(Arc::new(MonotonicClock::new()), upstream, &server).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut client = H1::connect(proxy.addr).await;
        assert_eq!(client.send("/").await.0, StatusCode::OK);
        held.push(client);
    }
    let mut third = H1::connect(proxy.addr).await;
    let answer = timeout(IO_TIMEOUT, third.try_send("/")).await.unwrap();
    assert!(answer.is_err(), "a third connection was served: {answer:?}");
    let mut other = H1::connect_from(proxy.addr, [127, 0, 0, 2]).await;
    let (status, _) = timeout(IO_TIMEOUT, other.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK, "another address is served");
    let refused = "rocgate_client_connections_refused_total";
    assert_eq!(metric(&proxy, refused).await, Some(1.0));
    assert_eq!(open_connections(&proxy).await, 3.0);

    held.pop().unwrap().close();
    // The proxy sees the close a moment later: until then a new connection is closed.
    let served = timeout(IO_TIMEOUT, async {
        loop {
            let mut client = H1::connect(proxy.addr).await;
            if let Ok((status, _)) = client.try_send("/").await {
                break status;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a closed connection gives its address's place back");
    assert_eq!(served, StatusCode::OK);

    server.trusted_proxies = vec!["127.0.0.0/8".parse().unwrap()];
    let behind = start_proxy_with(Arc::new(MonotonicClock::new()), upstream, &server).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut client = H1::connect(behind.addr).await;
        let (status, _) = timeout(IO_TIMEOUT, client.send("/")).await.unwrap();
        assert_eq!(
            status,
            StatusCode::OK,
            "a trusted proxy's connections are not counted"
        );
        clients.push(client);
    }
}

/// The cap's warning is logged when a connection is first accepted at the cap, then at
/// most once per 10 s of the proxy's clock however often connections wait, each time
/// with the cap and how many connections were accepted at it.
#[tokio::test]
async fn reaching_the_cap_is_logged_at_most_once_per_ten_seconds() {
    // A current-thread runtime: the proxy's tasks run on this thread, under the
    // subscriber set for it.
    let (log, _capturing) = Captured::on_this_thread();
    let warned = || log.lines_with("client connection limit reached");

    let upstream = start_upstream().await;
    let clock = Arc::new(ManualClock::new());
    let secs = Duration::from_secs(60);
    let proxy = start_proxy_on(clock.clone(), upstream, 1, secs, secs).await;

    // The first connection takes the only place: the accept loop accepts the second at
    // the cap at once, and warns.
    let mut first = H1::connect(proxy.addr).await;
    let second = H1::connect(proxy.addr).await;
    let third = H1::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, first.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let lines = warned();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(lines[0].contains("max_connections=1"), "{}", lines[0]);
    assert!(lines[0].contains("times_reached=1"), "{}", lines[0]);

    // The second takes the place the first leaves (closed, idle, to make room for it),
    // and the third is accepted at the cap at the same instant of the proxy's clock:
    // counted, not logged.
    let serve = |mut client: H1| async move {
        let (status, _) = timeout(IO_TIMEOUT, client.send("/")).await.unwrap();
        assert_eq!(status, StatusCode::OK);
        client
    };
    first.close();
    let second = serve(second).await;
    assert_eq!(warned().len(), 1, "{:#?}", warned());

    // 10 s later by the proxy's clock, the next connection accepted at the cap is
    // logged again, with those in between counted (the registry's counter is shared
    // with the other tests of this file, so the log's count is the one asserted).
    clock.advance(Duration::from_secs(10));
    second.close();
    let _third = serve(third).await;
    let _fourth = H1::connect(proxy.addr).await;
    timeout(IO_TIMEOUT, async {
        while warned().len() < 2 {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the fourth is accepted at the cap");
    let lines = warned();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[1].contains("times_reached=3"), "{}", lines[1]);
}

/// A failing upstream is logged at the first failure, then at most once per 10 s of
/// the proxy's clock, each line with the failures since the last (an upstream that is
/// down fails every request: a line each would flood the log).
#[tokio::test]
async fn a_failing_upstream_is_logged_at_most_once_per_ten_seconds() {
    let (log, _capturing) = Captured::on_this_thread();
    let warned = || log.lines_with("upstream request failed");
    // A port nothing listens on: bound, then closed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let clock = Arc::new(ManualClock::new());
    let secs = Duration::from_secs(60);
    let proxy = start_proxy_on(clock.clone(), dead, 100, secs, secs).await;
    let mut client = H1::connect(proxy.addr).await;
    let mut fail = async || {
        let (status, _) = timeout(IO_TIMEOUT, client.send("/")).await.unwrap();
        assert_eq!(status, StatusCode::BAD_GATEWAY);
    };
    fail().await;
    let lines = warned();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(
        lines[0].contains(&format!("upstream={dead}")),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("Connection refused"), "{}", lines[0]);
    assert!(lines[0].contains("failures=1"), "{}", lines[0]);
    for _ in 0..3 {
        fail().await;
    }
    clock.advance(Duration::from_millis(9_999));
    fail().await;
    assert_eq!(warned().len(), 1, "{:#?}", warned());
    clock.advance(Duration::from_millis(1));
    fail().await;
    let lines = warned();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[1].contains("failures=5"), "{}", lines[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_connection_that_only_answers_pings_is_closed_after_idle_timeout() {
    let upstream = start_upstream().await;
    // Pings every 100 ms, which hyper's client answers.
    let pings = Duration::from_millis(100);
    let idle = start_proxy(upstream, 100, SHORT_IDLE, pings).await;
    let patient = start_proxy(upstream, 100, Duration::from_secs(60), pings).await;
    let closed = H2::connect(idle.addr).await;
    let mut kept = H2::connect(patient.addr).await;

    let ended = timeout(IO_TIMEOUT, closed.conn)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert!(ended.is_ok(), "closed gracefully: {ended:?}");
    assert!(closed.sender.is_closed());

    // The same connection with a long idle timeout, meanwhile, answered its pings and
    // is open: the closing above was the idle timeout's, not the pings'.
    assert!(!kept.conn.is_finished(), "{:?}", kept.conn);
    let (status, _) = timeout(IO_TIMEOUT, kept.send("/")).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http1_connection_is_closed_after_idle_timeout() {
    let upstream = start_upstream().await;
    // header_read_timeout far longer than the idle timeout: the idle timeout closes
    // the connection.
    let proxy = start_proxy(upstream, 100, SHORT_IDLE, Duration::from_secs(60)).await;
    let mut client = H1::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, client.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let ended = timeout(IO_TIMEOUT, client.conn)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert!(ended.is_ok(), "closed gracefully: {ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_progress_keeps_its_connection_open_past_idle_timeout() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream, 100, SHORT_IDLE, Duration::from_secs(60)).await;
    // A slow response head, then a body that streams for as long: each takes several
    // idle timeouts. The connection is still open after each, and takes the next
    // request.
    let mut h2 = H2::connect(proxy.addr).await;
    for (path, body) in [("/slow", &b"slow"[..]), ("/drip", b"ddddd"), ("/", b"ok")] {
        let (status, got) = timeout(IO_TIMEOUT, h2.send(path))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("h2c {path}: {e}"));
        assert_eq!((status, &got[..]), (StatusCode::OK, body), "h2c {path}");
    }
    assert!(!h2.conn.is_finished());

    let mut h1 = H1::connect(proxy.addr).await;
    for (path, body) in [("/slow", &b"slow"[..]), ("/drip", b"ddddd"), ("/", b"ok")] {
        let (status, got) = timeout(IO_TIMEOUT, h1.send(path)).await.unwrap();
        assert_eq!(
            (status, &got[..]),
            (StatusCode::OK, body),
            "HTTP/1.1 {path}"
        );
    }
    assert!(!h1.conn.is_finished());
}

/// At the cap, connections wait complete in the listen backlog, which rocgate asks for
/// at `LISTEN_BACKLOG` (1024) rather than the 128 of a plain `bind`: 400 connections
/// beyond the cap all complete their handshake (with 128, those past about 129 had
/// their handshakes ignored and were still connecting when the test gave up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_complete_in_a_deep_backlog() {
    use rocgate::proxy::LISTEN_BACKLOG;
    let upstream = start_upstream().await;
    let secs = Duration::from_secs(60);
    let proxy = start_proxy(upstream, 1, secs, secs).await;
    let mut held = H1::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, held.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // The kernel caps the backlog at `net.core.somaxconn`.
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(LISTEN_BACKLOG);
    let waiting = 400.min(LISTEN_BACKLOG.min(somaxconn)) as usize;
    let connects = (0..waiting).map(|_| {
        tokio::spawn(timeout(
            Duration::from_millis(1500),
            TcpStream::connect(proxy.addr),
        ))
    });
    let mut streams = Vec::new();
    for connect in connects.collect::<Vec<_>>() {
        if let Ok(Ok(stream)) = connect.await.unwrap() {
            streams.push(stream);
        }
    }
    assert_eq!(
        streams.len(),
        waiting,
        "connections completed while at the cap"
    );
    assert_eq!(open_connections(&proxy).await, 1.0);
}

/// A response body of 64 KiB chunks without end; `dropped` is told when it is dropped
/// (the proxy let go of the upstream connection it came on).
struct Endless(Option<oneshot::Sender<()>>);

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            &[b'e'; 64 * 1024],
        )))))
    }
}

impl Drop for Endless {
    fn drop(&mut self) {
        if let Some(dropped) = self.0.take() {
            let _ = dropped.send(());
        }
    }
}

/// An upstream whose every response is an [`Endless`] body, the first of which tells
/// the receiver returned when it is dropped.
async fn start_endless_upstream() -> (SocketAddr, oneshot::Receiver<()>) {
    let (dropped, upstream_let_go) = oneshot::channel::<()>();
    let dropped = Arc::new(Mutex::new(Some(dropped)));
    let app = Router::new().fallback(move || {
        let dropped = dropped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        async move { Body::new(Endless(dropped)) }
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (upstream, upstream_let_go)
}

/// An h2c client that reads its socket (and answers pings) but never opens a stream's
/// flow-control window: the stream's response waits, unpolled, for as long as the
/// client likes, holding the upstream connection and the request's permit. After
/// `idle_timeout` of that the proxy lets the response go (as Envoy's
/// `stream_idle_timeout` does); the stream is reset, and the connection serves on. A
/// stream read slowly but steadily is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_stream_whose_window_stays_shut_is_let_go_after_idle_timeout() {
    let (upstream, upstream_let_go) = start_endless_upstream().await;
    // Pings every 100 ms, which hyper's client answers; an idle timeout long enough
    // for the steady reader's pauses, however the machine schedules it.
    let pings = Duration::from_millis(100);
    const IDLE: Duration = Duration::from_secs(1);
    let proxy = start_proxy(upstream, 100, IDLE, pings).await;
    let mut client = H2::connect(proxy.addr).await;
    let shut = timeout(IO_TIMEOUT, client.sender.send_request(get("/endless")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(shut.status(), StatusCode::OK);
    // Its body is never read, so the client's window stays shut.
    timeout(IO_TIMEOUT, upstream_let_go)
        .await
        .expect("the unread stream's response let go")
        .unwrap();
    assert!(!client.conn.is_finished(), "{:?}", client.conn);
    let next = timeout(IO_TIMEOUT, client.sender.send_request(get("/next")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    // What the client reads of the abandoned stream ends in an error, not in what
    // looks like a complete body.
    let read = timeout(IO_TIMEOUT, shut.into_body().collect())
        .await
        .unwrap();
    assert!(read.is_err(), "{read:?}");
    // Reads 2 MiB, a frame (at most 16 KiB) every 20 ms: never IDLE without taking
    // something, and over 2.5 s in all.
    let steady = timeout(IO_TIMEOUT, client.sender.send_request(get("/steady")))
        .await
        .unwrap()
        .unwrap();
    let mut body = steady.into_body();
    let read = timeout(IO_TIMEOUT, async {
        let mut total = 0;
        while total < 2 << 20 {
            sleep(Duration::from_millis(20)).await;
            let frame = body.frame().await.expect("more body").unwrap();
            total += frame.data_ref().map_or(0, Bytes::len);
        }
    })
    .await;
    assert!(read.is_ok(), "2 MiB within {IO_TIMEOUT:?}");
}

/// A client that takes nothing of its response for `idle_timeout` is closed, as
/// nginx's `send_timeout` does: it held its connection, the upstream connection and
/// the request's concurrency permit for as long as it stayed connected. One that reads
/// slowly but steadily is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_for_idle_timeout_is_closed() {
    let (upstream, upstream_let_go) = start_endless_upstream().await;
    // Long enough for a steady reader's writes to be taken well within it, however the
    // kernel paces them.
    const IDLE: Duration = Duration::from_secs(1);
    let proxy = start_proxy(upstream, 100, IDLE, Duration::from_secs(60)).await;
    let connect = |recv_buffer: u32| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(recv_buffer).unwrap();
        let mut stream = socket.connect(proxy.addr).await.unwrap();
        use tokio::io::AsyncWriteExt;
        stream
            .write_all(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        stream
    };
    // Takes nothing: the proxy lets go of the response, and of the upstream connection.
    let _stalled = connect(4096).await;
    timeout(IO_TIMEOUT, upstream_let_go)
        .await
        .expect("the stalled client's response dropped")
        .unwrap();
    // Reads 8 MiB, up to 64 KiB every 20 ms: never IDLE without taking something, and
    // longer than IDLE in all.
    let mut steady = connect(64 * 1024).await;
    let read = timeout(IO_TIMEOUT, async {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 * 1024];
        let mut total = 0;
        while total < 8 << 20 {
            sleep(Duration::from_millis(20)).await;
            let n = steady.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {total} bytes");
            total += n;
        }
    })
    .await;
    assert!(read.is_ok(), "8 MiB within {IO_TIMEOUT:?}");
}

/// An upstream that answers every request with a head promising 100 bytes, sends 10
/// and closes.
async fn start_truncating_upstream() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
                .await;
        }
    });
    addr
}

/// An upstream that fails mid-body is logged with the upstream's other failures:
/// the client already has its head, so the line names no status.
#[tokio::test]
async fn an_upstream_that_fails_mid_body_is_logged() {
    let (log, _capturing) = Captured::on_this_thread();
    let upstream = start_truncating_upstream().await;
    let secs = Duration::from_secs(60);
    let proxy = start_proxy(upstream, 100, secs, secs).await;
    let mut client = H1::connect(proxy.addr).await;
    client.sender.ready().await.unwrap();
    let res = timeout(IO_TIMEOUT, client.sender.send_request(get("/")))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = timeout(IO_TIMEOUT, res.into_body().collect())
        .await
        .unwrap();
    assert!(body.is_err(), "the client's body is cut short: {body:?}");
    let lines = log.lines_with("upstream request failed");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(lines[0].contains("kind=\"body_aborted\""), "{}", lines[0]);
    assert!(
        lines[0].contains(&format!("upstream={upstream}")),
        "{}",
        lines[0]
    );
    assert!(!lines[0].contains("status="), "{}", lines[0]);
}

/// The header read timeout of the keep-alive tests: far shorter than their idle
/// timeouts, so that what closes a connection tells which of the two did.
const SHORT_HEAD: Duration = Duration::from_millis(200);

/// An HTTP/1.1 keep-alive connection idle between requests waits for `idle_timeout`,
/// not `header_read_timeout`: a client (or a load balancer: AWS ALB keeps an idle
/// connection 60 s) that pools connections longer than the header read timeout reused
/// one just as rocgate closed it, and got an empty reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connection_idle_past_header_read_timeout_serves_its_next_request() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream, 100, Duration::from_secs(60), SHORT_HEAD).await;
    let mut client = H1::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, client.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    sleep(5 * SHORT_HEAD).await;
    let next = timeout(IO_TIMEOUT, client.try_send("/")).await.unwrap();
    let (status, body) = next.expect("the connection is still open after the lull");
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"ok"[..]));
}

/// An HTTP/1.1 connection idle between requests is open past `header_read_timeout`
/// and closed gracefully at `idle_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http1_connection_is_closed_at_idle_timeout_not_header_read_timeout() {
    let upstream = start_upstream().await;
    let idle = Duration::from_millis(1500);
    let proxy = start_proxy(upstream, 100, idle, SHORT_HEAD).await;
    let mut client = H1::connect(proxy.addr).await;
    let (status, _) = timeout(IO_TIMEOUT, client.send("/")).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    sleep(3 * SHORT_HEAD).await;
    assert!(!client.conn.is_finished(), "closed at header_read_timeout");
    let ended = timeout(IO_TIMEOUT, client.conn)
        .await
        .expect("the idle connection is closed")
        .unwrap();
    assert!(ended.is_ok(), "closed gracefully: {ended:?}");
}

/// Whether the proxy closes `stream` within `limit`, what it sends meanwhile read and
/// thrown away.
async fn closed_within(stream: &mut (impl tokio::io::AsyncRead + Unpin), limit: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let reading = async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                return;
            }
        }
    };
    timeout(limit, reading).await.is_ok()
}

/// Sends a whole request on `stream` and reads its answer, `ok`.
async fn raw_request(stream: &mut TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: rocgate.test\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = timeout(IO_TIMEOUT, stream.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_ne!(n, 0, "closed before its answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// A request head begun on a keep-alive connection after a lull, and then stalled, or
/// dripped a byte at a time, is closed at `header_read_timeout` (slowloris), not held
/// until `idle_timeout`; so is a new connection's first head, however short (shorter
/// than HTTP/2's preface, it is read whole before hyper times the head), and a new
/// connection that sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_head_is_closed_at_header_read_timeout_not_idle_timeout() {
    use tokio::io::AsyncWriteExt;
    let upstream = start_upstream().await;
    let proxy = start_proxy(upstream, 100, Duration::from_secs(60), SHORT_HEAD).await;
    // Whatever closes these within this wait is the header read timeout: the idle
    // timeout is 60 s.
    let wait = Duration::from_secs(5);
    let heads: [(&[u8], bool, bool); 4] = [
        // (head begun, after a first request and a lull, dripped on)
        (b"GET / HT", true, false),
        (b"GET / HTTP/1.1\r\nX-A: b\r\n", true, true),
        (b"GET / HTTP/1.1\r\n", false, false),
        (b"", false, false),
    ];
    for (begun, after_lull, drip) in heads {
        let what = format!(
            "{:?} (after a lull: {after_lull})",
            String::from_utf8_lossy(begun)
        );
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        if after_lull {
            raw_request(&mut stream).await;
            sleep(3 * SHORT_HEAD).await;
        }
        stream.write_all(begun).await.unwrap();
        let (mut rd, mut wr) = stream.into_split();
        let dripping = tokio::spawn(async move {
            if drip {
                loop {
                    sleep(SHORT_HEAD / 4).await;
                    if wr.write_all(b"X").await.is_err() {
                        break;
                    }
                }
            }
            // Holds the write half open.
            std::future::pending::<()>().await;
        });
        let closed = closed_within(&mut rd, wait).await;
        dripping.abort();
        assert!(closed, "{what}: still open after {wait:?}");
    }
}
