//! HTTP/1.1 upgrades (WebSocket) through `rocgate serve`, over real sockets on
//! 127.0.0.1: a handshake admitted like any request on its route and forwarded with its
//! `Upgrade`, the two connections spliced after the upstream's 101, a rejected
//! handshake that never reaches the upstream, a refused upgrade passed on, the
//! concurrency permit a tunnel holds, the idle bound, shutdown, and the upstream
//! connection a tunnel takes, never reused.
//!
//! The upstream is an axum app with WebSocket echo on `/ws`; the client is
//! tokio-tungstenite, or raw bytes where the exact head matters. Every wait is bounded.
#![cfg(feature = "proxy")]

#[path = "common/captured.rs"]
mod captured;

use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use captured::Captured;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderMap, StatusCode};
use rocgate::config::{RouteConfig, RouteMatch};
use rocgate::limiter::Algorithm;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

#[path = "common/proxy.rs"]
mod running;

use rocgate::clock::{Clock, ManualClock};
use running::{
    connect, read_head, settings, start_proxy, start_proxy_from, start_proxy_with_clock, within,
    RunningProxy,
};

// ---------------------------------------------------------------------------------
// Upstream

/// What the upstream has received: each request's path, peer (the proxy's upstream
/// connection) and headers, in order.
#[derive(Clone, Default)]
struct Upstream {
    seen: Arc<Mutex<Vec<(String, SocketAddr, HeaderMap)>>>,
}

impl Upstream {
    /// Requests to `path` received so far.
    fn count(&self, path: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _, _)| p == path)
            .count()
    }

    /// The headers and peer of every request to `path`.
    fn requests(&self, path: &str) -> Vec<(SocketAddr, HeaderMap)> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, peer, h)| (*peer, h.clone()))
            .collect()
    }

    fn record(&self, path: &str, peer: SocketAddr, headers: &HeaderMap) {
        let mut seen = self.seen.lock().unwrap();
        seen.push((path.to_owned(), peer, headers.clone()));
    }
}

/// `/ws`: says `welcome`, then echoes every text and binary message. `/refuse`: 426
/// with a body, requiring `websocket` in its `Upgrade`. `/plain`: `ok`.
async fn start_upstream() -> (SocketAddr, Upstream) {
    let upstream = Upstream::default();
    let app = Router::new()
        .route(
            "/ws",
            get(
                |State(up): State<Upstream>,
                 ConnectInfo(peer): ConnectInfo<SocketAddr>,
                 headers: HeaderMap,
                 ws: WebSocketUpgrade| async move {
                    up.record("/ws", peer, &headers);
                    ws.on_upgrade(echo)
                },
            ),
        )
        .route(
            "/refuse",
            get(
                |State(up): State<Upstream>,
                 ConnectInfo(peer): ConnectInfo<SocketAddr>,
                 headers: HeaderMap| async move {
                    up.record("/refuse", peer, &headers);
                    (
                        StatusCode::UPGRADE_REQUIRED,
                        [("upgrade", "websocket"), ("connection", "upgrade")],
                        "not here",
                    )
                        .into_response()
                },
            ),
        )
        .route(
            "/plain",
            get(
                |State(up): State<Upstream>,
                 ConnectInfo(peer): ConnectInfo<SocketAddr>,
                 headers: HeaderMap| async move {
                    up.record("/plain", peer, &headers);
                    Response::new(axum::body::Body::from("ok"))
                },
            ),
        )
        .with_state(upstream.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    (addr, upstream)
}

async fn echo(mut socket: WebSocket) {
    if socket.send(WsMessage::text("welcome")).await.is_err() {
        return;
    }
    while let Some(Ok(msg)) = socket.recv().await {
        match msg {
            WsMessage::Text(_) | WsMessage::Binary(_) => {
                if socket.send(msg).await.is_err() {
                    return;
                }
            }
            WsMessage::Close(_) => return,
            WsMessage::Ping(_) | WsMessage::Pong(_) => {}
        }
    }
}

// ---------------------------------------------------------------------------------
// Proxy

/// A route on the paths under `prefix` whose controller never cuts, at `rps`.
fn route(name: &str, prefix: &str, algorithm: Algorithm, rps: f64) -> RouteConfig {
    let mut r = RouteConfig::new(name, RouteMatch::prefix(prefix));
    r.controller.base_limit_rps = rps;
    r.controller.cut_limit_rps = rps;
    r.controller.danger_roc = f64::MAX;
    r.algorithm = algorithm;
    r
}

/// A route `name` on every path with the default algorithm at 1000/s: no request of
/// these tests is refused there.
fn roomy(name: &str) -> RouteConfig {
    route(name, "/", Algorithm::default(), 1000.0)
}

/// One request in flight at most on the route, none queued.
fn one_at_a_time(name: &str, prefix: &str) -> RouteConfig {
    route(name, prefix, Algorithm::Concurrency { queue: 0 }, 1.0)
}

/// Writes `rocgate.toml` in `dir`: one concurrency route `ws` on `/ws`, with `limits`
/// (its partition and limits, as TOML lines) and `extra` lines.
fn write_ws_file(dir: &Path, limits: &str, extra: &str) -> PathBuf {
    let file = dir.join("rocgate.toml");
    let config = format!(
        "[[routes]]\nname = \"ws\"\npath_prefix = \"/ws\"\nalgorithm = \"concurrency\"\n\
         {limits}{extra}"
    );
    std::fs::write(&file, config).unwrap();
    file
}

/// A proxy in front of `upstream` over the file [`write_ws_file`] writes with `limits`
/// in a new temporary folder (returned with it: the file lasts as long as it), which a
/// reload reads again.
async fn proxy_over_a_ws_file(
    upstream: SocketAddr,
    limits: &str,
) -> (RunningProxy, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = write_ws_file(dir.path(), limits, "");
    (start_proxy_from(settings(upstream), &file).await, dir)
}

/// Gives the route `ws` of [`proxy_over_a_ws_file`] a new window (`4s`; `limits` as
/// they were) and reloads `proxy`, which must rebuild the route.
async fn rebuild_with_a_new_window(proxy: &RunningProxy, dir: &tempfile::TempDir, limits: &str) {
    write_ws_file(dir.path(), limits, "window = \"4s\"\n");
    let serial = proxy.snapshot("ws").serial;
    proxy.reloader.reload_async().await.expect("the reload");
    assert_ne!(proxy.snapshot("ws").serial, serial, "the route is rebuilt");
}

// ---------------------------------------------------------------------------------
// Clients

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A WebSocket handshake on `path` through the proxy, with `extra` headers.
async fn open(
    addr: SocketAddr,
    path: &str,
    extra: &[(&'static str, &'static str)],
) -> Result<Ws, WsError> {
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    for (name, value) in extra {
        req.headers_mut().insert(*name, value.parse().unwrap());
    }
    let stream = connect(addr).await;
    within(
        "the handshake",
        tokio_tungstenite::client_async(req, MaybeTlsStream::Plain(stream)),
    )
    .await
    .map(|(ws, _)| ws)
}

/// The next text message.
async fn next_text<S>(ws: &mut WebSocketStream<S>) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        match within("a message", ws.next()).await {
            Some(Ok(Message::Text(t))) => return t.as_str().to_owned(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a text message, got {other:?}"),
        }
    }
}

/// The status of a handshake the proxy or the upstream refused.
fn refused(result: Result<Ws, WsError>) -> http::Response<Option<Vec<u8>>> {
    match result {
        Err(WsError::Http(response)) => *response,
        Err(e) => panic!("expected a refusal, got {e}"),
        Ok(_) => panic!("expected a refusal, got a WebSocket"),
    }
}

/// Sends `GET /plain` with `Connection: close` on `stream`: the answer, to the close.
async fn last_plain_get(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /plain HTTP/1.1\r\nhost: shop.example\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    within("the answer", stream.read_to_end(&mut reply))
        .await
        .unwrap();
    String::from_utf8_lossy(&reply).into_owned()
}

/// Reads from `stream` until what it has read ends with `end`, each read within
/// [`IO_TIMEOUT`](running::IO_TIMEOUT) (waiting for `what`): all it read. The test
/// fails if the connection closes first.
async fn read_until_it_ends_with(stream: &mut TcpStream, what: &str, end: &str) -> String {
    let mut received = Vec::new();
    let mut buf = [0u8; 1024];
    while !received.ends_with(end.as_bytes()) {
        let n = within(what, stream.read(&mut buf)).await.unwrap();
        assert!(
            n > 0,
            "closed early: {}",
            String::from_utf8_lossy(&received)
        );
        received.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&received).into_owned()
}

/// Waits until `cond` holds, polling every 10 ms.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------
// Tests

/// The handshake reaches the upstream with its `Upgrade`, `Connection: upgrade`, the
/// forwarding headers and `Via`, without this hop's other headers; after the 101,
/// messages cross both ways, the upstream's first unprompted.
#[tokio::test]
async fn a_websocket_through_serve_echoes_both_ways() {
    let (upstream_addr, upstream) = start_upstream().await;
    let proxy = start_proxy(settings(upstream_addr), vec![roomy("ws_echo")]).await;
    let mut ws = open(
        proxy.addr,
        "/ws",
        &[
            ("connection", "keep-alive, Upgrade, X-Hop"),
            ("x-hop", "this hop's"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic c2VjcmV0"),
        ],
    )
    .await
    .expect("the handshake through the proxy");
    assert_eq!(next_text(&mut ws).await, "welcome");
    for text in ["flash sale", "stock: 3", "stock: 2"] {
        within("send", ws.send(Message::text(text))).await.unwrap();
        assert_eq!(next_text(&mut ws).await, text);
    }
    within("send", ws.send(Message::binary(vec![0u8, 1, 2, 255])))
        .await
        .unwrap();
    match within("the binary echo", ws.next()).await {
        Some(Ok(Message::Binary(b))) => assert_eq!(&b[..], &[0u8, 1, 2, 255]),
        other => panic!("expected the binary echo, got {other:?}"),
    }
    within("close", ws.close(None)).await.unwrap();

    let seen = upstream.requests("/ws");
    assert_eq!(seen.len(), 1, "one handshake");
    let headers = &seen[0].1;
    assert_eq!(headers["upgrade"], "websocket");
    assert_eq!(headers["connection"], "upgrade");
    assert!(headers.contains_key("sec-websocket-key"));
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1");
    assert!(headers["via"].to_str().unwrap().starts_with("1.1 rocgate-"));
    for hop in ["x-hop", "keep-alive", "proxy-authorization"] {
        assert!(!headers.contains_key(hop), "{hop} was forwarded");
    }
}

/// A handshake the route rejects gets 429 with `Retry-After`, and the upstream never
/// sees it.
#[tokio::test]
async fn a_rejected_handshake_gets_429_and_never_reaches_the_upstream() {
    let (upstream_addr, upstream) = start_upstream().await;
    // One token, refilled once per 1024 s: the first handshake takes it.
    let bucket = Algorithm::TokenBucket {
        burst: Duration::from_secs(1024),
    };
    let proxy = start_proxy(
        settings(upstream_addr),
        vec![route("ws_rejected", "/", bucket, 1.0 / 1024.0)],
    )
    .await;
    let mut first = open(proxy.addr, "/ws", &[])
        .await
        .expect("the first handshake");
    assert_eq!(next_text(&mut first).await, "welcome");
    let response = refused(open(proxy.addr, "/ws", &[]).await);
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        upstream.count("/ws"),
        1,
        "the rejected handshake reached it"
    );
}

/// An upstream that answers the handshake with anything but 101 has its answer passed
/// on as an ordinary response, body and all; a 426 with the `Upgrade` it requires
/// (RFC 9110: a 426 must name it), and the connection goes on.
#[tokio::test]
async fn an_upstream_refusing_the_upgrade_is_passed_on() {
    let (upstream_addr, upstream) = start_upstream().await;
    let proxy = start_proxy(settings(upstream_addr), vec![roomy("ws_refused")]).await;
    let mut stream = connect(proxy.addr).await;
    stream
        .write_all(
            b"GET /refuse HTTP/1.1\r\nhost: shop.example\r\nconnection: upgrade\r\n\
              upgrade: websocket\r\nsec-websocket-version: 13\r\n\
              sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await
        .unwrap();
    let reply = read_until_it_ends_with(&mut stream, "the refusal", "not here")
        .await
        .to_lowercase();
    assert!(reply.starts_with("http/1.1 426 "), "{reply}");
    assert!(reply.contains("\r\nupgrade: websocket\r\n"), "{reply}");
    assert!(reply.contains("\r\nconnection: upgrade\r\n"), "{reply}");
    assert_eq!(upstream.count("/refuse"), 1);
    let rest = last_plain_get(&mut stream).await;
    assert!(
        rest.starts_with("HTTP/1.1 200 ") && rest.ends_with("ok"),
        "{rest}"
    );
    assert_eq!(upstream.requests("/refuse")[0].1["upgrade"], "websocket");
}

/// On a concurrency route, an open tunnel is a request in flight: it holds its permit
/// (a second handshake, or any request, is refused) until it closes.
#[tokio::test]
async fn a_tunnel_holds_its_concurrency_permit_until_it_closes() {
    let (upstream_addr, upstream) = start_upstream().await;
    let proxy = start_proxy(
        settings(upstream_addr),
        vec![one_at_a_time("ws_permit", "/")],
    )
    .await;
    let mut ws = open(proxy.addr, "/ws", &[]).await.expect("the handshake");
    assert_eq!(next_text(&mut ws).await, "welcome");
    // Past the 101, its head and its empty body are long gone.
    sleep(Duration::from_millis(100)).await;
    assert_eq!(proxy.level("ws_permit"), 1.0, "the tunnel lost its permit");
    let second = refused(open(proxy.addr, "/ws", &[]).await);
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.count("/ws"), 1);
    // Still open both ways.
    within("send", ws.send(Message::text("still here")))
        .await
        .unwrap();
    assert_eq!(next_text(&mut ws).await, "still here");

    within("close", ws.close(None)).await.unwrap();
    until("the permit back", || proxy.level("ws_permit") == 0.0).await;
    let mut again = open(proxy.addr, "/ws", &[])
        .await
        .expect("a handshake once the tunnel closed");
    assert_eq!(next_text(&mut again).await, "welcome");
}

/// A tunnel's permit is not timed: the hour a WebSocket was open is not a request's
/// service time, and counted into the route's mean hold (weighing 1/8) it lifted the
/// mean of 1 µs requests to 450 s, every refusal told the 60 s cap. Requests timed
/// before it set the wait a refused handshake is told after it closes, as they did
/// before it opened. On a manual clock, which the admission layer times holds on.
#[tokio::test]
async fn a_tunnels_life_is_not_counted_as_a_hold() {
    let (upstream_addr, _upstream) = start_upstream().await;
    let clock = Arc::new(ManualClock::new());
    let proxy = start_proxy_with_clock(
        settings(upstream_addr),
        vec![one_at_a_time("ws_hold", "/")],
        Arc::clone(&clock) as Arc<dyn Clock>,
    )
    .await;
    // A request held for no time on the manual clock: a mean hold of 1 µs.
    let mut plain = connect(proxy.addr).await;
    assert!(last_plain_get(&mut plain).await.ends_with("ok"));
    until("the request's permit back", || {
        proxy.level("ws_hold") == 0.0
    })
    .await;
    let mut ws = open(proxy.addr, "/ws", &[]).await.expect("the handshake");
    assert_eq!(next_text(&mut ws).await, "welcome");
    clock.advance(Duration::from_secs(3600));
    within("close", ws.close(None)).await.unwrap();
    until("the tunnel's permit back", || proxy.level("ws_hold") == 0.0).await;

    let mut holder = open(proxy.addr, "/ws", &[]).await.expect("a handshake");
    assert_eq!(next_text(&mut holder).await, "welcome");
    let response = refused(open(proxy.addr, "/ws", &[]).await);
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: serde_json::Value =
        serde_json::from_slice(response.body().as_deref().expect("a body")).unwrap();
    assert_eq!(body["reason"], "concurrency");
    assert_eq!(
        body["retry_after_ms"], 1,
        "one 1 µs hold over one permit, not the tunnel's hour"
    );
}

/// A reload that rebuilds the tunnels' concurrency route (here a new window) hands
/// the new route the permits the open tunnels hold: the level stays at 3 and a fourth
/// handshake is still refused, until a tunnel closes. The new route started at 0 and
/// let 3 more tunnels in, 6 open on a limit of 3.
#[tokio::test]
async fn a_reload_that_rebuilds_the_route_keeps_counting_the_open_tunnels() {
    const LIMITS: &str = "base_limit = 3\ncut_limit = 3\n";
    let (upstream_addr, upstream) = start_upstream().await;
    let (proxy, dir) = proxy_over_a_ws_file(upstream_addr, LIMITS).await;
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        let mut ws = open(proxy.addr, "/ws", &[]).await.expect("the handshake");
        assert_eq!(next_text(&mut ws).await, "welcome");
        tunnels.push(ws);
    }
    let fourth = refused(open(proxy.addr, "/ws", &[]).await);
    assert_eq!(fourth.status(), StatusCode::TOO_MANY_REQUESTS);

    rebuild_with_a_new_window(&proxy, &dir, LIMITS).await;
    assert_eq!(proxy.level("ws"), 3.0, "the open tunnels' permits");
    let fourth = refused(open(proxy.addr, "/ws", &[]).await);
    assert_eq!(fourth.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.count("/ws"), 3);

    let mut closing = tunnels.pop().unwrap();
    within("close", closing.close(None)).await.unwrap();
    until("the permit back", || proxy.level("ws") == 2.0).await;
    let mut again = open(proxy.addr, "/ws", &[])
        .await
        .expect("a handshake in the place the closed tunnel freed");
    assert_eq!(next_text(&mut again).await, "welcome");
    let fifth = refused(open(proxy.addr, "/ws", &[]).await);
    assert_eq!(fifth.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// The same, per client: on a route limited to 2 tunnels per `x-client`, a reload that
/// rebuilds it (a new window) hands each client's open tunnels to the same client of
/// the new route: client "a", with its 2 open, is refused a third, and client "b" opens
/// its 2. The new route's clients started at 0, and "a" opened 2 more, 4 on a limit of
/// 2.
#[tokio::test]
async fn a_reload_that_rebuilds_a_per_client_route_keeps_counting_each_clients_tunnels() {
    const LIMITS: &str = "partition = \"header:x-client\"\nbase_limit = 2\ncut_limit = 2\n";
    let (upstream_addr, upstream) = start_upstream().await;
    let (proxy, dir) = proxy_over_a_ws_file(upstream_addr, LIMITS).await;
    let client = |name: &'static str| [("x-client", name)];
    let mut tunnels = Vec::new();
    for _ in 0..2 {
        let mut ws = open(proxy.addr, "/ws", &client("a"))
            .await
            .expect("the handshake");
        assert_eq!(next_text(&mut ws).await, "welcome");
        tunnels.push(ws);
    }
    let third = refused(open(proxy.addr, "/ws", &client("a")).await);
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);

    rebuild_with_a_new_window(&proxy, &dir, LIMITS).await;
    let third = refused(open(proxy.addr, "/ws", &client("a")).await);
    assert_eq!(
        third.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a's open tunnels count on the new route"
    );
    for _ in 0..2 {
        let mut ws = open(proxy.addr, "/ws", &client("b"))
            .await
            .expect("b's handshake");
        assert_eq!(next_text(&mut ws).await, "welcome");
        tunnels.push(ws);
    }
    assert_eq!(upstream.count("/ws"), 4);

    let mut closing = tunnels.remove(0);
    within("close", closing.close(None)).await.unwrap();
    let mut again = None;
    for _ in 0..100 {
        if let Ok(ws) = open(proxy.addr, "/ws", &client("a")).await {
            again = Some(ws);
            break;
        }
        sleep(Duration::from_millis(20)).await;
    }
    let mut again = again.expect("a handshake of a in the place its closed tunnel freed");
    assert_eq!(next_text(&mut again).await, "welcome");
    let fourth = refused(open(proxy.addr, "/ws", &client("a")).await);
    assert_eq!(fourth.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// An open tunnel holds its place under `max_upstream_requests` (it holds an upstream
/// connection): with the cap at 1, any other request is answered 503
/// `upstream_overflow` until the tunnel closes.
#[tokio::test]
async fn a_tunnel_holds_its_upstream_place_until_it_closes() {
    let (upstream_addr, upstream) = start_upstream().await;
    let mut capped = settings(upstream_addr);
    capped.forward.max_upstream_requests = 1;
    let proxy = start_proxy(capped, vec![roomy("ws_upstream_cap")]).await;
    let mut ws = open(proxy.addr, "/ws", &[]).await.expect("the handshake");
    assert_eq!(next_text(&mut ws).await, "welcome");
    let plain = |addr| async move { last_plain_get(&mut connect(addr).await).await };
    let refused = plain(proxy.addr).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.ends_with(r#"{"error":"upstream_overflow"}"#),
        "{refused}"
    );
    assert_eq!(upstream.count("/plain"), 0);

    within("close", ws.close(None)).await.unwrap();
    within("the place back", async {
        while !plain(proxy.addr).await.starts_with("HTTP/1.1 200") {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(upstream.count("/plain"), 1);
}

/// A tunnel nothing crosses for `idle_timeout` is closed, and its permit released;
/// one with traffic more often stays open past it.
#[tokio::test]
async fn a_tunnel_idle_for_idle_timeout_is_closed() {
    const IDLE: Duration = Duration::from_millis(400);
    let (upstream_addr, _upstream) = start_upstream().await;
    let mut short = settings(upstream_addr);
    short.idle_timeout = IDLE;
    let proxy = start_proxy(short, vec![one_at_a_time("ws_idle", "/")]).await;
    let mut ws = open(proxy.addr, "/ws", &[]).await.expect("the handshake");
    assert_eq!(next_text(&mut ws).await, "welcome");
    // Traffic every quarter of the bound, for three times the bound: kept open.
    for i in 0..12 {
        sleep(IDLE / 4).await;
        let text = format!("tick {i}");
        within("send", ws.send(Message::text(text.clone())))
            .await
            .unwrap();
        assert_eq!(next_text(&mut ws).await, text, "closed while in use");
    }
    let quiet = Instant::now();
    match within("the close", ws.next()).await {
        None | Some(Err(_)) => {}
        other => panic!("expected the tunnel closed, got {other:?}"),
    }
    let after = quiet.elapsed();
    assert!(
        after >= IDLE - Duration::from_millis(50),
        "closed after {after:?}"
    );
    until("the permit back", || proxy.level("ws_idle") == 0.0).await;
}

/// On shutdown a tunnel is left open for `shutdown_grace`, then dropped; `run` returns.
#[tokio::test]
async fn a_tunnel_is_dropped_when_the_shutdown_grace_ends() {
    const GRACE: Duration = Duration::from_millis(500);
    let (upstream_addr, _upstream) = start_upstream().await;
    let mut quick = settings(upstream_addr);
    quick.shutdown_grace = GRACE;
    let proxy = start_proxy(quick, vec![roomy("ws_shutdown")]).await;
    let mut ws = open(proxy.addr, "/ws", &[]).await.expect("the handshake");
    assert_eq!(next_text(&mut ws).await, "welcome");
    let stopping = Instant::now();
    let run = proxy.shut_down();
    // Within the grace period it still carries messages.
    sleep(GRACE / 4).await;
    within("send", ws.send(Message::text("during the grace")))
        .await
        .unwrap();
    assert_eq!(next_text(&mut ws).await, "during the grace");
    match within("the close", ws.next()).await {
        None | Some(Err(_)) => {}
        other => panic!("expected the tunnel dropped, got {other:?}"),
    }
    assert!(stopping.elapsed() >= GRACE - Duration::from_millis(50));
    within("run to return", run).await.unwrap().unwrap();
}

/// The upstream connection a tunnel takes is its own: not one the client connection's
/// earlier requests used (pooled, then its lane), and not one any later request gets.
#[tokio::test]
async fn a_tunnels_upstream_connection_is_never_reused() {
    let (upstream_addr, upstream) = start_upstream().await;
    let proxy = start_proxy(settings(upstream_addr), vec![roomy("ws_own_conn")]).await;
    // Two plain requests, then the handshake, on one client connection.
    let mut stream = connect(proxy.addr).await;
    for _ in 0..2 {
        stream
            .write_all(b"GET /plain HTTP/1.1\r\nhost: shop.example\r\n\r\n")
            .await
            .unwrap();
        read_until_it_ends_with(&mut stream, "a plain answer", "ok").await;
    }
    let req = format!("ws://{}/ws", proxy.addr)
        .into_client_request()
        .unwrap();
    let (mut ws, _) = within(
        "the handshake",
        tokio_tungstenite::client_async(req, stream),
    )
    .await
    .expect("the handshake after two requests");
    assert_eq!(next_text(&mut ws).await, "welcome");
    within("close", ws.close(None)).await.unwrap();
    // Later requests, on other client connections (the pool) and on one connection
    // (its lane).
    for _ in 0..3 {
        let mut s = connect(proxy.addr).await;
        s.write_all(
            b"GET /plain HTTP/1.1\r\nhost: shop.example\r\n\r\n\
              GET /plain HTTP/1.1\r\nhost: shop.example\r\nconnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let mut sink = Vec::new();
        within("two plain answers", s.read_to_end(&mut sink))
            .await
            .unwrap();
    }
    let tunnel = upstream.requests("/ws")[0].0;
    let plain: Vec<SocketAddr> = upstream
        .requests("/plain")
        .into_iter()
        .map(|(peer, _)| peer)
        .collect();
    assert_eq!(plain.len(), 8);
    assert!(
        !plain.contains(&tunnel),
        "the tunnel's upstream connection {tunnel} carried a plain request: {plain:?}"
    );
}

/// An upstream that answers 101 to a request that asked for no upgrade has nothing to
/// switch to: the client gets 502, not a 101 with no protocol behind it, and the
/// upstream's failure is logged as any other.
#[tokio::test]
async fn a_101_to_a_plain_request_is_a_bad_gateway() {
    let (log, _capturing) = Captured::on_this_thread();
    let upstream_addr = answering_every_request(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\nconnection: upgrade\r\n\r\n",
    )
    .await;
    let proxy = start_proxy(settings(upstream_addr), vec![roomy("ws_bad_101")]).await;
    let mut stream = connect(proxy.addr).await;
    let reply = last_plain_get(&mut stream).await;
    assert!(reply.starts_with("HTTP/1.1 502 "), "{reply}");
    let lines = log.lines_with("upstream request failed");
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
    assert!(
        lines[0].contains("a 101 to a request that did not upgrade"),
        "{}",
        lines[0]
    );
}

/// An upstream on loopback that reads each request's head and answers `response`, then
/// holds the connection until the client closes it.
async fn answering_every_request(response: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_head(&mut stream).await.is_none() {
                    return;
                }
                let _ = stream.write_all(response).await;
                let mut rest = Vec::new();
                let _ = stream.read_to_end(&mut rest).await;
            });
        }
    });
    addr
}

/// A 101 must say what it switches to, among what the client offered (RFC 9110 §7.8):
/// one with no `Upgrade`, or switching a WebSocket handshake to `h2c`, would leave the
/// client speaking one protocol to an upstream speaking another. The client gets 502.
/// A 101 naming the offered protocol in another case and with a version is a switch.
#[tokio::test]
async fn a_101_to_no_protocol_the_client_offered_is_a_bad_gateway() {
    let cases: [(&'static [u8], &str); 3] = [
        (
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\n\r\n",
            "HTTP/1.1 502 ",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
            "HTTP/1.1 502 ",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: WebSocket/13\r\nconnection: upgrade\r\n\r\n",
            "HTTP/1.1 101 ",
        ),
    ];
    for (answer, expected) in cases {
        let (log, _capturing) = Captured::on_this_thread();
        let upstream_addr = answering_every_request(answer).await;
        let proxy = start_proxy(settings(upstream_addr), vec![roomy("ws_wrong_101")]).await;
        let mut stream = connect(proxy.addr).await;
        within(
            "handshake",
            stream.write_all(
                b"GET /chat HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\n\
                  sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
            ),
        )
        .await
        .unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = within("answer", stream.read(&mut buf)).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&head));
            head.extend_from_slice(&buf[..n]);
        }
        let head = String::from_utf8_lossy(&head);
        let answer = String::from_utf8_lossy(answer);
        assert!(head.starts_with(expected), "{answer:?}: {head}");
        let lines = log.lines_with("a 101 switching to no protocol the client offered");
        assert_eq!(
            lines.len(),
            usize::from(expected.contains("502")),
            "{answer:?}: {lines:#?}"
        );
    }
}
