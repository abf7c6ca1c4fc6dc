//! `max_upstream_requests` over real sockets on 127.0.0.1: at the cap a request is
//! answered 503 `upstream_overflow` at once, never forwarded; a place is held from
//! forwarding until the response body ends, and comes back when it ends, when the
//! client leaves mid-response, and when the upstream fails or times out; HTTP/2 streams
//! each take one.
//!
//! The upstream answers each request once the test opens its gate (`/head`: the head
//! waits; `/body`: the head comes at once, the body waits), or `ok` at once. Every
//! wait is bounded. One test alone reads `rocgate_upstream_requests` and
//! `rocgate_max_upstream_requests`: the metrics recorder is one per process, and
//! another proxy's scrape would set the gauges.
#![cfg(feature = "proxy")]

use axum::body::Body;
use axum::extract::State;
use axum::Router;
use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rocgate::config::{RouteConfig, RouteMatch};
use rocgate::proxy::ProxySettings;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

#[path = "common/http1.rs"]
mod http1;
#[path = "common/proxy.rs"]
mod running;

use running::{
    closed_port, settings, start_proxy, start_truncating_upstream, within, Reply, RunningProxy,
};

/// The longest a refusal at the cap may take: it waits for nothing.
const AT_ONCE: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------
// Upstream

/// A running upstream: how many requests reached it, and the gate its `/head` and
/// `/body` answers wait for.
#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    hits: Arc<watch::Sender<u64>>,
    gate: Arc<watch::Sender<bool>>,
}

impl Upstream {
    fn hits(&self) -> u64 {
        *self.hits.borrow()
    }

    async fn wait_for_hits(&self, n: u64) {
        let mut rx = self.hits.subscribe();
        within("upstream hits", rx.wait_for(|&h| h >= n))
            .await
            .unwrap();
    }

    /// Lets every waiting answer, and every later one, through.
    fn open(&self) {
        self.gate.send_replace(true);
    }
}

/// Starts an upstream on 127.0.0.1: `/head` answers once the gate opens, `/body`
/// sends its head at once and its body once the gate opens, `/never` never answers,
/// anything else answers `ok` at once.
async fn start_upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = Upstream {
        addr: listener.local_addr().unwrap(),
        hits: Arc::new(watch::Sender::new(0)),
        gate: Arc::new(watch::Sender::new(false)),
    };
    let app = Router::new().fallback(answer).with_state(upstream.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    upstream
}

async fn answer(State(up): State<Upstream>, req: Request<Body>) -> Response<Body> {
    up.hits.send_modify(|h| *h += 1);
    let mut gate = up.gate.subscribe();
    match req.uri().path() {
        "/head" => {
            let _ = gate.wait_for(|&open| open).await;
            Response::new(Body::from("head"))
        }
        "/body" => {
            let body = async_stream_body(gate);
            Response::new(body)
        }
        "/never" => std::future::pending().await,
        _ => Response::new(Body::from("ok")),
    }
}

/// A body whose one part comes once `gate` opens.
fn async_stream_body(mut gate: watch::Receiver<bool>) -> Body {
    let part = async move {
        let _ = gate.wait_for(|&open| open).await;
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(b"body")))
    };
    Body::new(http_body_util::StreamBody::new(futures_util::stream::once(
        part,
    )))
}

// ---------------------------------------------------------------------------------
// Proxy and clients

/// A proxy in front of `upstream` with `max_upstream_requests = cap`, and one route
/// named `route` on every path that admits everything.
async fn capped(upstream: SocketAddr, cap: usize, route: &str) -> RunningProxy {
    let mut settings: ProxySettings = settings(upstream);
    settings.forward.max_upstream_requests = cap;
    start_proxy(
        settings,
        vec![RouteConfig::new(route, RouteMatch::prefix("/"))],
    )
    .await
}

/// Sends `GET path` on a connection of its own, naming the host as `localhost` (the
/// admin API answers no other name from loopback).
async fn get(addr: SocketAddr, path: &str) -> Reply {
    within("response", async {
        let mut sender = http1::connect(addr).await;
        let req = Request::get(path)
            .header(header::HOST, "localhost")
            .body(Full::<Bytes>::default())
            .unwrap();
        let res = sender.send_request(req).await.unwrap();
        Reply::read(res).await
    })
    .await
}

/// Asserts that a request sent now is refused at the cap, at once.
async fn assert_overflow(addr: SocketAddr, path: &str) {
    let start = Instant::now();
    let reply = get(addr, path).await;
    let took = start.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.headers[header::RETRY_AFTER], "1");
    assert_eq!(reply.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(&reply.body[..], br#"{"error":"upstream_overflow"}"#);
    assert!(took < AT_ONCE, "the refusal took {took:?}");
}

/// The value of the series `series` (name and labels) in the proxy's `/metrics`.
async fn metric(proxy: &RunningProxy, series: &str) -> Option<String> {
    let reply = get(proxy.admin, "/metrics").await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
}

// ---------------------------------------------------------------------------------
// Tests

/// With the cap at 2 and two requests waiting on the upstream, a third is answered 503
/// `upstream_overflow` at once and never reaches the upstream; it is counted, and not
/// held against the upstream. Once the two are answered, their places are back.
#[tokio::test]
async fn a_request_beyond_the_cap_gets_503_at_once_and_is_never_forwarded() {
    let up = start_upstream().await;
    let proxy = capped(up.addr, 2, "cap_head").await;
    let first = tokio::spawn(get(proxy.addr, "/head"));
    let second = tokio::spawn(get(proxy.addr, "/head"));
    up.wait_for_hits(2).await;
    assert_eq!(
        metric(&proxy, "rocgate_upstream_requests").await.as_deref(),
        Some("2")
    );

    assert_eq!(
        metric(&proxy, "rocgate_max_upstream_requests")
            .await
            .as_deref(),
        Some("2"),
        "the cap is exported beside the places held"
    );

    assert_overflow(proxy.addr, "/head").await;
    assert_eq!(up.hits(), 2, "the refused request reached the upstream");
    let series = r#"rocgate_upstream_errors_total{route="cap_head",kind="upstream_overflow"}"#;
    assert_eq!(metric(&proxy, series).await.as_deref(), Some("1"));

    up.open();
    for answered in [first, second] {
        let reply = within("a request in flight", answered).await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(&reply.body[..], b"head");
    }
    let fourth = get(proxy.addr, "/ok").await;
    assert_eq!(
        fourth.status,
        StatusCode::OK,
        "the places did not come back"
    );
    assert_eq!(up.hits(), 3);
    assert_eq!(
        metric(&proxy, "rocgate_upstream_requests").await.as_deref(),
        Some("0")
    );
    let _ = proxy.shut_down().await;
}

/// A request holds its place until its response body ends, not only its head.
#[tokio::test]
async fn the_place_is_held_until_the_response_body_ends() {
    let up = start_upstream().await;
    let proxy = capped(up.addr, 1, "cap_body").await;
    let mut sender = http1::connect(proxy.addr).await;
    let req = Request::get("/body")
        .header(header::HOST, "shop.example")
        .body(Full::<Bytes>::default())
        .unwrap();
    let head = within("the head", sender.send_request(req)).await.unwrap();
    assert_eq!(head.status(), StatusCode::OK);

    assert_overflow(proxy.addr, "/ok").await;

    up.open();
    let body = within("the body", head.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"body");
    // The place comes back as the body's end is read: a request soon after may find
    // it not yet given back, and is retried until it does.
    place_back(proxy.addr).await;
    let _ = proxy.shut_down().await;
}

/// Waits until a request to `/ok` is forwarded again: the one place held has come
/// back (it comes back as the body's end is read or the client leaves, so a request
/// just after may still find it taken).
async fn place_back(proxy: SocketAddr) {
    within("the place back", async {
        while get(proxy, "/ok").await.status != StatusCode::OK {
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// A client that leaves mid-response gives its place back.
#[tokio::test]
async fn a_client_that_leaves_mid_response_gives_its_place_back() {
    let up = start_upstream().await;
    let proxy = capped(up.addr, 1, "cap_reset").await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"GET /body HTTP/1.1\r\nhost: shop.example\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    within("the head", stream.read_exact(&mut head))
        .await
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    assert_overflow(proxy.addr, "/ok").await;

    // Gone with the body unsent: the gate stays shut.
    drop(stream);
    place_back(proxy.addr).await;
    let _ = proxy.shut_down().await;
}

/// A request the upstream times out on, or that cannot reach it, gives its place back:
/// the next one is forwarded (and fails for its own reason, not the cap's).
#[tokio::test]
async fn a_failed_or_timed_out_request_gives_its_place_back() {
    let up = start_upstream().await;
    let mut timed = settings(up.addr);
    timed.forward.max_upstream_requests = 1;
    timed.forward.response_timeout = Duration::from_millis(300);
    let proxy = start_proxy(
        timed,
        vec![RouteConfig::new("cap_timeout", RouteMatch::prefix("/"))],
    )
    .await;
    assert_eq!(
        get(proxy.addr, "/never").await.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    assert_eq!(get(proxy.addr, "/ok").await.status, StatusCode::OK);
    let _ = proxy.shut_down().await;

    let nowhere = closed_port().await;
    let proxy = capped(nowhere, 1, "cap_refused").await;
    for _ in 0..3 {
        let reply = get(proxy.addr, "/ok").await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{reply:?}");
    }
    let _ = proxy.shut_down().await;
}

/// An upstream that closes mid-body gives the place back with the failure.
#[tokio::test]
async fn an_upstream_that_dies_mid_body_gives_its_place_back() {
    let addr = start_truncating_upstream().await;
    let proxy = capped(addr, 1, "cap_truncated").await;
    for _ in 0..3 {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        stream
            .write_all(b"GET /a HTTP/1.1\r\nhost: shop.example\r\n\r\n")
            .await
            .unwrap();
        let mut reply = Vec::new();
        let _ = within("the truncated reply", stream.read_to_end(&mut reply)).await;
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    }
    let _ = proxy.shut_down().await;
}

/// Each HTTP/2 stream takes a place of its own: on one connection, with the cap at 2,
/// a third stream is refused while two wait on the upstream.
#[tokio::test]
async fn each_http2_stream_takes_a_place() {
    let up = start_upstream().await;
    let proxy = capped(up.addr, 2, "cap_h2").await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = |path: &str| {
        let mut sender = sender.clone();
        let req = Request::get(format!("http://shop.example{path}"))
            .body(Full::<Bytes>::default())
            .unwrap();
        async move {
            let res = sender.send_request(req).await.unwrap();
            let status = res.status();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        }
    };
    let first = tokio::spawn(request("/head"));
    let second = tokio::spawn(request("/head"));
    up.wait_for_hits(2).await;
    let start = Instant::now();
    let (status, body) = within("the third stream", request("/head")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(&body[..], br#"{"error":"upstream_overflow"}"#);
    assert!(start.elapsed() < AT_ONCE);
    assert_eq!(up.hits(), 2);

    up.open();
    for answered in [first, second] {
        let (status, _) = within("a stream in flight", answered).await.unwrap();
        assert_eq!(status, StatusCode::OK);
    }
    let (status, _) = within("a later stream", request("/ok")).await;
    assert_eq!(status, StatusCode::OK);
    let _ = proxy.shut_down().await;
}
