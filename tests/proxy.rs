//! The reverse proxy over real sockets on 127.0.0.1: admission under concurrent load,
//! rejections, header hygiene, request smuggling, slowloris, body limits, upstream
//! failures and graceful shutdown.
//!
//! Each test starts its own recording upstream (an axum app) and its own [`Proxy`],
//! both on ports the OS picks, and talks to the proxy with hyper's client, or with raw
//! bytes over a `TcpStream` where the framing itself is under test. Every wait is
//! bounded by a timeout.
#![cfg(feature = "proxy")]

use axum::body::Body;
use axum::extract::State;
use axum::Router;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rocgate::config::{
    ClientIpHeader, Config, KeyLimits, Mode, Partition, RouteConfig, RouteMatch,
};
use rocgate::http::ClientIpResolver;
use rocgate::limiter::Algorithm;
use rocgate::proxy::Proxy;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{sleep, timeout, Instant};

#[path = "common/http1.rs"]
mod http1;
#[path = "common/proxy.rs"]
mod running;

use running::{
    closed_port, connect, read_head, settings, start_proxy, start_truncating_upstream, within,
    Reply, RunningProxy, HEADER_READ_TIMEOUT, IO_TIMEOUT,
};

/// How long the upstream's `/slow` handler takes.
const SLOW: Duration = Duration::from_millis(500);
/// The size of the upstream's `/big` answer.
const BIG: usize = 8 << 20;
/// A bucket refilling one token per 1024 s (exact in binary): over a test run, it
/// admits exactly its capacity.
const TRICKLE_RPS: f64 = 1.0 / 1024.0;
const HOST: &str = "shop.example:8080";

// ---------------------------------------------------------------------------------
// Upstream

/// One request as the upstream received it.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    headers: HeaderMap,
    /// The whole body, or why reading it failed (the proxy aborted it mid-stream).
    body: Result<Bytes, String>,
}

/// A running upstream and what it has received.
#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    /// Requests whose head reached the handler, counted before the body is read.
    hits: Arc<watch::Sender<u64>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    fn hits(&self) -> u64 {
        *self.hits.borrow()
    }

    /// Every request to `path`, in the order their bodies were read.
    fn seen(&self, path: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == path).cloned().collect()
    }

    /// The one request to `path`.
    fn only(&self, path: &str) -> Seen {
        let mut seen = self.seen(path);
        assert_eq!(seen.len(), 1, "requests to {path}: {seen:?}");
        seen.remove(0)
    }

    /// The `n` requests to `path`.
    fn only_n(&self, path: &str, n: usize) -> Vec<Seen> {
        let seen = self.seen(path);
        assert_eq!(seen.len(), n, "requests to {path}: {seen:?}");
        seen
    }

    fn all_paths(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter().map(|s| s.path.clone()).collect()
    }

    async fn wait_for_hits(&self, n: u64) {
        let mut rx = self.hits.subscribe();
        within("upstream hits", rx.wait_for(|&h| h >= n))
            .await
            .unwrap();
    }
}

/// Starts an upstream on 127.0.0.1 that records every request and answers `ok`;
/// `/slow` answers after [`SLOW`], `/hop` answers with hop-by-hop headers, `/big` with
/// [`BIG`] bytes of `b`.
async fn start_upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = Upstream {
        addr: listener.local_addr().unwrap(),
        hits: Arc::new(watch::Sender::new(0)),
        seen: Arc::default(),
    };
    let app = Router::new().fallback(record).with_state(upstream.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    upstream
}

/// A recording upstream ([`start_upstream`]) and a proxy in front of it, with the
/// tests' [`settings`], over no route: every request is forwarded as it is, none
/// limited.
async fn forwarding_proxy() -> (Upstream, RunningProxy) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(settings(upstream.addr), Vec::new()).await;
    (upstream, proxy)
}

async fn record(State(up): State<Upstream>, req: Request<Body>) -> Response<Body> {
    up.hits.send_modify(|h| *h += 1);
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| e.to_string());
    let path = parts.uri.path().to_owned();
    up.seen.lock().unwrap().push(Seen {
        path: path.clone(),
        headers: parts.headers,
        body,
    });
    match path.as_str() {
        "/slow" => {
            sleep(SLOW).await;
            Response::new(Body::from("slow"))
        }
        "/big" => Response::new(Body::from(vec![b'b'; BIG])),
        "/hop" => Response::builder()
            .header(header::CONNECTION, "X-Resp-Hop, X-Forwarded-For")
            .header("x-resp-hop", "1")
            .header("x-forwarded-for", "10.0.0.9")
            .header("keep-alive", "timeout=5")
            .header(header::PROXY_AUTHENTICATE, "Basic realm=\"upstream\"")
            .header(header::UPGRADE, "h2c")
            .header("proxy-connection", "keep-alive")
            .header("x-resp-kept", "yes")
            .body(Body::from("hop"))
            .unwrap(),
        _ => Response::new(Body::from("ok")),
    }
}

/// A listener that accepts connections and never answers on them.
async fn start_silent_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    addr
}

// ---------------------------------------------------------------------------------
// Proxy

/// A route on the paths under `prefix` whose bucket holds `capacity` tokens and
/// (practically) never refills, and whose controller never cuts.
fn trickle_route(name: &str, prefix: &str, capacity: u64) -> RouteConfig {
    let mut r = RouteConfig::new(name, RouteMatch::prefix(prefix));
    r.controller.base_limit_rps = TRICKLE_RPS;
    r.controller.cut_limit_rps = TRICKLE_RPS;
    r.controller.danger_roc = f64::MAX;
    r.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(capacity * 1024),
    };
    r
}

// ---------------------------------------------------------------------------------
// Clients

/// One HTTP/1.1 keep-alive connection to the proxy.
struct Client {
    sender: SendRequest<Full<Bytes>>,
}

impl Client {
    async fn connect(addr: SocketAddr) -> Client {
        Client {
            sender: within("connect", http1::connect(addr)).await,
        }
    }

    async fn send(&mut self, req: Request<Full<Bytes>>) -> Reply {
        within("response", async {
            self.sender.ready().await.unwrap();
            let res = self.sender.send_request(req).await.unwrap();
            Reply::read(res).await
        })
        .await
    }
}

/// Sends one request on a connection of its own.
async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Reply {
    Client::connect(addr).await.send(req).await
}

fn get(path: &str) -> http::request::Builder {
    Request::get(path).header(header::HOST, HOST)
}

/// A `GET path` to the admin API, naming this host as a tool on it does: the admin API
/// answers a request from loopback that names another host (`HOST`) with 403.
fn admin_get(path: &str) -> http::request::Builder {
    Request::get(path).header(header::HOST, "localhost")
}

fn empty(builder: http::request::Builder) -> Request<Full<Bytes>> {
    builder.body(Full::default()).unwrap()
}

/// Writes `bytes` on a fresh connection and reads until the proxy closes it (or until
/// `deadline`, whatever it sent by then).
async fn raw_exchange(addr: SocketAddr, bytes: &[u8], deadline: Duration) -> Vec<u8> {
    let mut stream = connect(addr).await;
    stream.write_all(bytes).await.unwrap();
    closed_within(&mut stream, deadline).await.1
}

/// Reads until the proxy closes the connection, for at most `limit`: whether it closed
/// by then, and what it sent.
async fn closed_within(stream: &mut (impl AsyncRead + Unpin), limit: Duration) -> (bool, Vec<u8>) {
    let mut received = Vec::new();
    let closed = timeout(limit, read_until_closed(stream, &mut received))
        .await
        .is_ok();
    (closed, received)
}

/// Reads until EOF or a connection error.
async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin), into: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => into.extend_from_slice(&buf[..n]),
        }
    }
}

/// The status codes of the responses in a raw byte stream: each status line starts the
/// stream or follows a line feed. (Good enough for the short bodies these tests see.)
fn statuses(raw: &[u8]) -> Vec<u16> {
    (0..raw.len())
        .filter(|&i| (i == 0 || raw[i - 1] == b'\n') && raw[i..].starts_with(b"HTTP/1."))
        .filter_map(|i| {
            std::str::from_utf8(raw.get(i + 9..i + 12)?)
                .ok()?
                .parse()
                .ok()
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// 1. Admission under concurrent load

const TASKS: usize = 50;
const PER_TASK: usize = 40;
const LOAD_CAPACITY: u64 = 100;

/// Sends TASKS × PER_TASK requests to `/load`, each task on its own connection;
/// returns the counts of 200 and 429.
async fn drive_load(addr: SocketAddr) -> (u64, u64) {
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        tasks.spawn(async move {
            let mut client = Client::connect(addr).await;
            let mut counts = (0u64, 0u64);
            for _ in 0..PER_TASK {
                match client.send(empty(get("/load"))).await.status {
                    StatusCode::OK => counts.0 += 1,
                    StatusCode::TOO_MANY_REQUESTS => counts.1 += 1,
                    other => panic!("unexpected status {other}"),
                }
            }
            counts
        });
    }
    let mut total = (0, 0);
    while let Some(counts) = within("load task", tasks.join_next()).await {
        let (ok, limited) = counts.unwrap();
        total.0 += ok;
        total.1 += limited;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_load_the_upstream_receives_exactly_what_the_engine_admitted() {
    let (upstream, proxy) = trickle_proxy("load", "/load", LOAD_CAPACITY).await;

    let (ok, limited) = drive_load(proxy.addr).await;

    let snap = proxy.snapshot("load");
    let offered = (TASKS * PER_TASK) as u64;
    assert_eq!(snap.offered, offered);
    assert_eq!(ok + limited, offered);
    assert_eq!(
        snap.admitted, ok,
        "the engine admitted what the clients got as 200"
    );
    assert_eq!(
        upstream.hits(),
        ok,
        "the upstream saw exactly the admitted requests"
    );
    assert_eq!(ok, LOAD_CAPACITY, "one shared bucket across connections");
    assert_eq!(snap.rejected_total(), limited);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_shadow_mode_everything_reaches_the_upstream_and_rejections_are_counted() {
    let upstream = start_upstream().await;
    let mut route = trickle_route("load", "/load", LOAD_CAPACITY);
    route.mode = Mode::Shadow;
    let proxy = start_proxy(settings(upstream.addr), vec![route]).await;

    let (ok, limited) = drive_load(proxy.addr).await;

    let offered = (TASKS * PER_TASK) as u64;
    assert_eq!((ok, limited), (offered, 0));
    assert_eq!(upstream.hits(), offered);
    let snap = proxy.snapshot("load");
    assert_eq!(snap.admitted, offered);
    assert_eq!(snap.rejected_total(), 0);
    let shadow: u64 = snap.shadow_rejected.iter().map(|(_, n)| n).sum();
    assert_eq!(
        shadow,
        offered - LOAD_CAPACITY,
        "{:?}",
        snap.shadow_rejected
    );
}

// ---------------------------------------------------------------------------------
// 2. The 429 response

#[tokio::test]
async fn rejection_through_the_proxy_carries_retry_after_ratelimit_headers_and_json() {
    let upstream = start_upstream().await;
    let mut route = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
    route.controller.base_limit_rps = 2.0; // a bucket of 2, refilling 2 per second
    route.controller.cut_limit_rps = 1.0;
    let proxy = start_proxy(settings(upstream.addr), vec![route]).await;

    let mut client = Client::connect(proxy.addr).await;
    let mut admitted = 0;
    let mut rejected = None;
    for id in 0..10 {
        let req = Request::post("/api/order")
            .header(header::HOST, HOST)
            .header("x-request-id", id.to_string())
            .body(Full::default())
            .unwrap();
        let reply = client.send(req).await;
        match reply.status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                rejected = Some((id, reply));
                break;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    let (rejected_id, res) = rejected.expect("a 429 within 10 requests on a bucket of 2");
    assert!(admitted >= 2, "the bucket's two tokens were admitted first");

    let h = &res.headers;
    let retry: u64 = h[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
    assert!(
        retry >= 1,
        "Retry-After is whole seconds, at least 1: {retry}"
    );
    assert_eq!(h["ratelimit-policy"], r#""order";q=2;w=1"#);
    assert_eq!(h["ratelimit"], format!(r#""order";r=0;t={retry}"#).as_str());
    assert_eq!(h["rocgate-reason"], "limit");
    assert_eq!(h[header::CONTENT_TYPE], "application/json");
    let json = res.json();
    assert_eq!(json["error"], "rate_limited");
    assert_eq!(json["reason"], "limit");
    assert_eq!(json["route"], "order");
    let retry_ms = json["retry_after_ms"].as_u64().unwrap();
    assert!(
        retry_ms > 0 && retry_ms <= retry * 1000,
        "retry_after_ms {retry_ms} rounds up to Retry-After {retry}"
    );

    assert_eq!(upstream.hits(), admitted);
    let ids: Vec<_> = upstream
        .seen("/api/order")
        .iter()
        .map(|s| s.headers["x-request-id"].to_str().unwrap().to_owned())
        .collect();
    assert!(
        !ids.contains(&rejected_id.to_string()),
        "the rejected request reached the upstream: {ids:?}"
    );
}

#[tokio::test]
async fn another_spelling_of_a_routes_path_does_not_evade_its_limit() {
    let upstream = start_upstream().await;
    let mut order = trickle_route("order", "/", 1);
    order.matcher = RouteMatch::exact("POST", "/api/order");
    // A catch-all with room to spare, as in the default config: a request the order
    // route misses is admitted there.
    let all = trickle_route("default", "/", 1000);
    let proxy = start_proxy(settings(upstream.addr), vec![order, all]).await;
    let post = |path: &str| {
        format!("POST {path} HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    };
    let status = |path: &'static str| {
        let request = post(path);
        async move { statuses(&raw_exchange(proxy.addr, request.as_bytes(), IO_TIMEOUT).await) }
    };
    assert_eq!(
        status("/api/order").await,
        [200],
        "the order route's one token"
    );
    for path in [
        "/api/order/",
        "//api/order",
        "/api//order",
        "/api/./order",
        "/api/x/../order",
        "/api/%6Frder",
        "/%61pi/order/.",
        // IIS, nginx on Windows and the WHATWG URL parser read a backslash as a slash.
        "/api\\order",
        "/api\\x\\..\\order",
    ] {
        assert_eq!(status(path).await, [429], "{path} is /api/order");
    }
    for path in ["/api/orders", "/api/order/x", "/api/x/order"] {
        assert_eq!(status(path).await, [200], "{path} is another path");
    }
}

/// An upstream that answers each request with its target as received.
async fn start_echoing_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(|req: Request<Body>| async move { req.uri().to_string() });
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// What the upstream received as the target of `GET {target}`, sent as written.
async fn target_received(proxy: SocketAddr, target: &str) -> String {
    let request = format!("GET {target} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    let raw = raw_exchange(proxy, request.as_bytes(), IO_TIMEOUT).await;
    let raw = String::from_utf8(raw).unwrap();
    assert_eq!(statuses(raw.as_bytes()), [200], "{target}: {raw}");
    raw.split_once("\r\n\r\n").unwrap().1.to_owned()
}

#[tokio::test]
async fn the_upstream_receives_the_path_its_route_was_matched_on() {
    // An upstream that routes as written (axum) would serve `/api/items/..` with the
    // `/api/items/{id}` handler, under the limit of the route `/api` takes.
    let upstream = start_echoing_upstream().await;
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    for (sent, received) in [
        ("/api/items/..", "/api/"),
        ("/api/items/%2e%2e?x=..%2F&y=/./", "/api/?x=..%2F&y=/./"),
        ("/api/./x//y\\z/%6Frder/", "/api/x/y/z/order/"),
        ("http://shop.example/a/b/../c?q", "/a/c?q"),
        // Already normalized: as sent, encoded slash and case kept.
        ("/api/Items/a%2Fb?q=%41", "/api/Items/a%2Fb?q=%41"),
        // An escape's digits upper case, a byte beyond ASCII encoded: one spelling.
        ("/caf%c3%a9?q=%c3", "/caf%C3%A9?q=%c3"),
        ("/café", "/caf%C3%A9"),
    ] {
        assert_eq!(target_received(proxy.addr, sent).await, received, "{sent}");
    }
    let request = format!("OPTIONS * HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    let raw = raw_exchange(proxy.addr, request.as_bytes(), IO_TIMEOUT).await;
    assert!(
        String::from_utf8_lossy(&raw).ends_with("\r\n\r\n*"),
        "{raw:?}"
    );

    let mut as_sent = settings(upstream);
    as_sent.forward.normalize_path = false;
    let proxy = start_proxy(as_sent, Vec::new()).await;
    for sent in ["/api/items/..", "/api/./x//y/%6Frder/?q=/../"] {
        assert_eq!(target_received(proxy.addr, sent).await, sent);
    }
}

#[tokio::test]
async fn options_asterisk_does_not_evade_a_catch_all_limit() {
    let (upstream, proxy) = trickle_proxy("all", "/", 1).await;
    let request = |line: &str| format!("{line}\r\nHost: {HOST}\r\nConnection: close\r\n\r\n");
    let raw = raw_exchange(proxy.addr, request("GET / HTTP/1.1").as_bytes(), IO_TIMEOUT).await;
    assert_eq!(statuses(&raw), [200], "the route's one token");
    let raw = raw_exchange(
        proxy.addr,
        request("OPTIONS * HTTP/1.1").as_bytes(),
        IO_TIMEOUT,
    )
    .await;
    assert_eq!(statuses(&raw), [429], "{}", String::from_utf8_lossy(&raw));
    assert_eq!(upstream.hits(), 1);
}

// ---------------------------------------------------------------------------------
// 3. Hop-by-hop headers

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_both_ways() {
    let (upstream, proxy) = forwarding_proxy().await;

    let req = get("/hop")
        .header(header::CONNECTION, "keep-alive, X-Custom-Hop")
        .header("x-custom-hop", "1")
        .header("keep-alive", "timeout=5")
        .header(header::TE, "gzip, trailers")
        .header(header::PROXY_AUTHORIZATION, "Basic cHJveHk6c2VjcmV0")
        .header(header::UPGRADE, "websocket")
        .header("proxy-connection", "keep-alive")
        .header(header::AUTHORIZATION, "Bearer end-to-end")
        .header(header::ACCEPT, "text/plain")
        .header("x-kept", "yes");
    let res = send(proxy.addr, empty(req)).await;
    assert_eq!(res.status, StatusCode::OK);

    let up = upstream.only("/hop").headers;
    for name in [
        "connection",
        "x-custom-hop",
        "keep-alive",
        "proxy-authorization",
        "upgrade",
        "proxy-connection",
    ] {
        assert!(
            !up.contains_key(name),
            "{name} reached the upstream: {up:?}"
        );
    }
    // Of `TE`, only `trailers` goes on: the client takes trailer fields.
    assert_eq!(up[header::TE], "trailers");
    assert_eq!(up[header::AUTHORIZATION], "Bearer end-to-end");
    assert_eq!(up[header::ACCEPT], "text/plain");
    assert_eq!(up["x-kept"], "yes");
    assert_eq!(up[header::HOST], HOST);

    // A header the upstream names in `Connection` is its hop's, a forwarding header
    // too: only a request's are kept (`set_forwarded` rewrites them), and a response's
    // `X-Forwarded-For` so named used to reach the client.
    let down = &res.headers;
    for name in [
        "x-resp-hop",
        "x-forwarded-for",
        "keep-alive",
        "proxy-authenticate",
        "upgrade",
        "proxy-connection",
    ] {
        assert!(
            !down.contains_key(name),
            "{name} reached the client: {down:?}"
        );
    }
    // The proxy's own connection management may add a Connection header; never the
    // upstream's.
    for v in down.get_all(header::CONNECTION) {
        assert!(
            !v.to_str()
                .unwrap()
                .to_ascii_lowercase()
                .contains("x-resp-hop"),
            "{down:?}"
        );
    }
    assert_eq!(down["x-resp-kept"], "yes");
    assert_eq!(res.body, "hop");
}

/// `Host` is end to end, and HTTP/1.1 requires it (RFC 9112 §3.2): a `Connection` that
/// names it takes nothing away. It used to be stripped as a connection option: the
/// pool's request went up with the upstream's own `Host`, the lane's with none.
#[tokio::test]
async fn a_connection_header_naming_host_keeps_the_clients_host() {
    let (upstream, proxy) = forwarding_proxy().await;
    // The first request goes through the pool, the second through the lane.
    let raw = raw_exchange(
        proxy.addr,
        format!(
            "GET /named-host-1 HTTP/1.1\r\nHost: {HOST}\r\nConnection: host\r\n\r\n\
             GET /named-host-2 HTTP/1.1\r\nHost: {HOST}\r\nConnection: Host, close\r\n\r\n"
        )
        .as_bytes(),
        IO_TIMEOUT,
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(text.matches("HTTP/1.1 200 ").count(), 2, "{text}");
    for path in ["/named-host-1", "/named-host-2"] {
        let seen = upstream.only(path).headers;
        assert_eq!(
            seen.get(header::HOST).and_then(|h| h.to_str().ok()),
            Some(HOST),
            "{path}: {seen:?}"
        );
        assert_eq!(seen["x-forwarded-host"], HOST, "{path}");
    }
}

// ---------------------------------------------------------------------------------
// 4. X-Forwarded-*

fn forwarded_request() -> Request<Full<Bytes>> {
    empty(
        get("/xff")
            .header("x-forwarded-for", "6.6.6.6, 10.0.0.1")
            .header("x-forwarded-for", "10.0.0.2")
            .header("x-forwarded-proto", "https")
            .header("x-forwarded-host", "public.example")
            .header("forwarded", "for=6.6.6.6;proto=https;host=public.example")
            .header("x-real-ip", "6.6.6.6")
            .header("x-client-ip", "6.6.6.6")
            .header("true-client-ip", "6.6.6.6")
            .header("cf-connecting-ip", "6.6.6.6")
            .header("fastly-client-ip", "6.6.6.6")
            .header("x-cluster-client-ip", "6.6.6.6")
            .header("x-forwarded", "for=6.6.6.6")
            .header("forwarded-for", "6.6.6.6")
            .header("x-forwarded-port", "443")
            .header("x-forwarded-prefix", "/evil")
            .header("x-forwarded-ssl", "on")
            .header("x-forwarded-scheme", "https")
            .header("x-forwarded-server", "public.example")
            .header("x-forwarded-uri", "/admin")
            .header("x-forwarded-method", "GET")
            .header(
                "x-forwarded-client-cert",
                "By=spiffe://evil;URI=spiffe://admin",
            ),
    )
}

/// The other forwarding headers upstream frameworks read (Rack, Spring, Symfony, Gin,
/// Traefik's list, forward auth's URI and method, Envoy's client certificate): some say
/// the opposite of rocgate's `X-Forwarded-Proto: http` (Rack takes `X-Forwarded-Ssl:
/// on` and `X-Forwarded-Scheme` before it), some what an upstream authorises on.
const OTHER_FORWARDING: [&str; 16] = [
    "x-real-ip",
    // Where CDNs and load balancers name the client, read by Node.js's `request-ip`
    // before `X-Forwarded-For`: they reached the upstream as the client wrote them.
    "x-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-forwarded",
    "forwarded-for",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-ssl",
    "x-forwarded-scheme",
    "x-forwarded-server",
    "x-forwarded-uri",
    "x-forwarded-method",
    "x-forwarded-client-cert",
];

/// A recording upstream and a proxy in front of it over no route, whose client (on
/// loopback, 127.0.0.0/8 trusted) is a trusted proxy that writes `header`.
async fn behind_a_trusted_proxy(header: ClientIpHeader) -> (Upstream, RunningProxy) {
    let upstream = start_upstream().await;
    let mut settings = settings(upstream.addr);
    settings.forward.resolver =
        ClientIpResolver::new(vec!["127.0.0.0/8".parse().unwrap()]).with_header(header);
    let proxy = start_proxy(settings, Vec::new()).await;
    (upstream, proxy)
}

/// Sends `req` (to `/xff`) through `proxy`, which must answer 200: the headers the
/// upstream received with it, its one request to `/xff`.
async fn forwarded_as(
    proxy: &RunningProxy,
    upstream: &Upstream,
    req: Request<Full<Bytes>>,
) -> HeaderMap {
    let res = send(proxy.addr, req).await;
    assert_eq!(res.status, StatusCode::OK);
    upstream.only("/xff").headers
}

#[tokio::test]
async fn forwarded_headers_from_an_untrusted_peer_are_replaced() {
    let (upstream, proxy) = forwarding_proxy().await;

    let h = forwarded_as(&proxy, &upstream, forwarded_request()).await;
    // As are the others an untrusted client may send: they were passed on.
    assert_x_forwarded_replaced(&h);
    assert_eq!(h["x-forwarded-proto"], "http");
    assert_eq!(h[header::HOST], HOST);
    // RFC 7239's header says the same things, and upstreams that read it prefer it.
    assert!(!h.contains_key("forwarded"), "{h:?}");
}

/// What the upstream sees of [`forwarded_request`]'s `X-Forwarded-*` where rocgate
/// believed none of them: `X-Forwarded-For` is its own hop (127.0.0.1) alone,
/// `X-Forwarded-Host` the request's `Host`, and none of [`OTHER_FORWARDING`] is left.
fn assert_x_forwarded_replaced(h: &HeaderMap) {
    let xff: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
    assert_eq!(xff, [HeaderValue::from_static("127.0.0.1")]);
    assert_eq!(h["x-forwarded-host"], HOST);
    for name in OTHER_FORWARDING {
        assert!(!h.contains_key(name), "{name} reached the upstream: {h:?}");
    }
}

#[tokio::test]
async fn forwarded_headers_from_a_trusted_proxy_are_kept_and_extended() {
    let (upstream, proxy) = behind_a_trusted_proxy(ClientIpHeader::XForwardedFor).await;

    assert_kept_and_extended(&forwarded_as(&proxy, &upstream, forwarded_request()).await);
}

/// With `client_ip_header = "forwarded"`, a trusted proxy writes `Forwarded` (HAProxy's
/// `option forwarded`), kept and extended; the `X-Forwarded-*` and `X-Real-IP` it
/// passes on are its client's, and are replaced or dropped as from an untrusted peer.
/// (They were kept: the client's own `X-Forwarded-For: 6.6.6.6` reached the upstream
/// as a chain rocgate extended.)
#[tokio::test]
async fn a_trusted_proxy_of_forwarded_has_only_forwarded_kept() {
    let (upstream, proxy) = behind_a_trusted_proxy(ClientIpHeader::Forwarded).await;

    let h = forwarded_as(&proxy, &upstream, forwarded_request()).await;
    let forwarded: Vec<_> = h.get_all("forwarded").iter().collect();
    assert_eq!(
        forwarded,
        [
            HeaderValue::from_static("for=6.6.6.6;proto=https;host=public.example"),
            HeaderValue::from_static("for=127.0.0.1;proto=http"),
        ]
    );
    assert_x_forwarded_replaced(&h);
    // The scheme is the trusted element's (`proto=https`): `http` would be wrong.
    assert!(!h.contains_key("x-forwarded-proto"), "{h:?}");
}

/// A client behind a trusted proxy that passes its `Connection` on names the
/// forwarding headers there, as connection options to strip: the chain and scheme the
/// proxy wrote reach the upstream all the same (Traefik's CVE-2024-45410).
#[tokio::test]
async fn a_connection_header_naming_them_does_not_strip_a_trusted_proxys_forwarding_headers() {
    let (upstream, proxy) = behind_a_trusted_proxy(ClientIpHeader::XForwardedFor).await;

    let mut req = forwarded_request();
    let named = [
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "forwarded",
    ]
    .into_iter()
    .chain(OTHER_FORWARDING)
    .collect::<Vec<_>>()
    .join(", ");
    req.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_str(&named).unwrap());
    assert_kept_and_extended(&forwarded_as(&proxy, &upstream, req).await);
}

/// What the upstream sees of [`forwarded_request`] sent by a trusted proxy.
fn assert_kept_and_extended(h: &HeaderMap) {
    let xff: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
    assert_eq!(
        xff,
        [HeaderValue::from_static(
            "6.6.6.6, 10.0.0.1, 10.0.0.2, 127.0.0.1"
        )]
    );
    assert_eq!(h["x-forwarded-host"], "public.example");
    assert_eq!(h["x-forwarded-proto"], "https");
    // Not the kind `client_ip_header` says the proxy writes: its client's, as nginx
    // passes it on. (It was kept and extended with rocgate's hop, as if believed.)
    assert!(!h.contains_key("forwarded"), "{h:?}");
    for name in OTHER_FORWARDING {
        // A CDN's header is its client's, passed on by this proxy: dropped.
        let cdn = !name.starts_with("x-real") && !name.starts_with("x-forwarded-");
        assert_eq!(
            h.contains_key(name),
            !cdn,
            "{name} from a trusted proxy of X-Forwarded-For: {h:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarded_for_values_from_one_client_share_one_bucket() {
    const CAPACITY: u64 = 5;
    const REQUESTS: u32 = 1_000;
    const CONNECTIONS: u32 = 10;
    let upstream = start_upstream().await;
    let mut route = trickle_route("per-ip", "/per-ip", CAPACITY);
    route.partition = Partition::ClientIp(KeyLimits::default());
    let proxy = start_proxy(settings(upstream.addr), vec![route]).await;

    let mut tasks = JoinSet::new();
    for c in 0..CONNECTIONS {
        let addr = proxy.addr;
        tasks.spawn(async move {
            let mut client = Client::connect(addr).await;
            let mut ok = 0u64;
            for n in (c..REQUESTS).step_by(CONNECTIONS as usize) {
                let spoofed = format!("203.0.{}.{}", n / 256, n % 256);
                let req = empty(get("/per-ip").header("x-forwarded-for", spoofed));
                match client.send(req).await.status {
                    StatusCode::OK => ok += 1,
                    StatusCode::TOO_MANY_REQUESTS => {}
                    other => panic!("unexpected status {other}"),
                }
            }
            ok
        });
    }
    let mut ok = 0;
    while let Some(n) = within("client task", tasks.join_next()).await {
        ok += n.unwrap();
    }

    let snap = proxy.snapshot("per-ip");
    assert_eq!(snap.offered, u64::from(REQUESTS));
    assert_eq!(ok, CAPACITY, "one bucket: 127.0.0.1's");
    assert_eq!(snap.admitted, CAPACITY);
    assert_eq!(snap.keys, 1);
    assert_eq!(upstream.hits(), CAPACITY);
}

/// `serve` counts the requests on a route partitioned by `ip` whose forwarding header's
/// walk ended at an empty or malformed entry, keying them by the trusted proxy right of
/// it (here the peer), in `rocgate_client_key_fallbacks_total` by route and reason,
/// each series at 0 from the first scrape; a good walk counts nothing. Nothing
/// counted them before. A request from the trusted proxy without the header at all,
/// keyed by the proxy's address, is counted as `no_header`.
#[tokio::test]
async fn serve_counts_clients_keyed_by_a_proxy_for_a_bad_forwarding_entry() {
    let upstream = start_upstream().await;
    let mut route = trickle_route("per-ip-fallback", "/per-ip-fallback", 100);
    route.partition = Partition::ClientIp(KeyLimits::default());
    let mut settings = settings(upstream.addr);
    settings.forward.resolver = ClientIpResolver::new(vec!["127.0.0.0/8".parse().unwrap()]);
    let proxy = start_proxy(settings, vec![route]).await;
    let counts = || async {
        let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        ["empty_entry", "malformed_entry", "hidden_node", "no_header"].map(|reason| {
            let series = format!(
                "rocgate_client_key_fallbacks_total{{route=\"per-ip-fallback\",reason=\"{reason}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .unwrap_or_else(|| panic!("no {series}: {text}"))
                .to_owned()
        })
    };
    assert_eq!(counts().await, ["0", "0", "0", "0"]);
    for xff in [
        "203.0.113.7",
        "203.0.113.7, ",
        "6.6.6.6, , 203.0.113.8",
        "6.6.6.6, junk",
    ] {
        let req = empty(get("/per-ip-fallback").header("x-forwarded-for", xff));
        assert_eq!(send(proxy.addr, req).await.status, StatusCode::OK, "{xff}");
    }
    assert_eq!(counts().await, ["1", "1", "0", "0"]);
    let req = empty(get("/per-ip-fallback"));
    assert_eq!(send(proxy.addr, req).await.status, StatusCode::OK);
    assert_eq!(counts().await, ["1", "1", "0", "1"]);
}

/// `serve` keys a `header:authorization` partition by the credential however its
/// scheme is spelled (`credentials_key`), through the same layer as the tower one, and
/// sends the header on as the client wrote it: the key is rocgate's, not the request.
#[tokio::test]
async fn an_authorization_partition_keys_one_token_however_its_scheme_is_spelled() {
    const CAPACITY: u64 = 2;
    let upstream = start_upstream().await;
    let mut route = trickle_route("per-token", "/per-token", CAPACITY);
    route.partition = Partition::Header("authorization".into(), KeyLimits::default());
    let proxy = start_proxy(settings(upstream.addr), vec![route]).await;
    let mut client = Client::connect(proxy.addr).await;
    let mut ok = 0;
    for value in ["BEARER  t0k", "Bearer t0k", "bearer t0k", "bEaReR\tt0k"] {
        let req = empty(get("/per-token").header(header::AUTHORIZATION, value));
        match client.send(req).await.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok, CAPACITY, "one token's bucket");
    let snap = proxy.snapshot("per-token");
    assert_eq!(snap.keys, 1);
    let sent: Vec<_> = upstream
        .only_n("/per-token", CAPACITY as usize)
        .into_iter()
        .map(|s| s.headers[header::AUTHORIZATION].clone())
        .collect();
    assert_eq!(sent, ["BEARER  t0k", "Bearer t0k"]);
}

// ---------------------------------------------------------------------------------
// 5. Request smuggling

/// What RFC 9112 lets a proxy do with a case.
#[derive(Debug)]
enum Must {
    /// 400, forward nothing (a MUST of RFC 9112).
    Reject,
    /// Either a 4xx and forward nothing, or forward one request with this body.
    RejectOrForward(String),
    /// Forward one request with this body.
    Forward(String),
}

struct SmugglingCase {
    name: &'static str,
    /// The request head's header lines after `Host`, each with its line ending.
    headers: String,
    /// Everything after the head.
    rest: String,
    must: Must,
    /// Whether RFC 9112 requires closing the connection after the response (the
    /// framing was ambiguous or invalid): the response must say `connection: close`.
    closes: bool,
}

const SMUGGLED: &str = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n";

fn chunked(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n0\r\n\r\n", data.len())
}

/// Each case hides a request to `/smuggled` where some parser would see one. `must`
/// and `closes` hold what RFC 9112 requires (§6.3 for the framing cases, §2.2 bare LF,
/// §5.1 whitespace before the colon, §5.2 obs-fold); where it allows a choice, the
/// test accepts either. What hyper 1.12 (the proxy's HTTP/1 server) did, as of this
/// writing:
///
/// - `cl-te` (Content-Length, then `Transfer-Encoding: chunked`): forwarded, framed
///   by the chunked coding alone (an empty body), Content-Length removed; answered
///   with `connection: close` and closed, so the bytes after the last chunk were never
///   read as a request.
/// - `te-cl` (the same, other order, with a short Content-Length): forwarded with the
///   chunked body (the would-be smuggled text as data), connection closed.
/// - `cl-cl` (two differing Content-Length): 400.
/// - `cl-body` (Content-Length covering a request-shaped body): forwarded as one
///   request whose body is that text.
/// - `bare-lf` (a header line ended by LF alone, before Content-Length): forwarded;
///   LF is accepted as a line ending, so Content-Length is seen and frames the body.
/// - `obs-fold` (a folded header line): 400.
/// - `te-gzip` (`Transfer-Encoding: chunked, gzip`): 400.
/// - `cl-negative` (`Content-Length: -1`): 400.
/// - `cl-hex` (`Content-Length: 0x23`): 400.
/// - `te-space` (`Transfer-Encoding : chunked`, space before the colon): 400.
fn smuggling_cases() -> Vec<SmugglingCase> {
    let n = SMUGGLED.len();
    let case = |name, headers: String, rest: String, must, closes| SmugglingCase {
        name,
        headers,
        rest,
        must,
        closes,
    };
    let after_empty_chunk = format!("0\r\n\r\n{SMUGGLED}");
    vec![
        case(
            "cl-te",
            format!(
                "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                after_empty_chunk.len()
            ),
            after_empty_chunk.clone(),
            Must::RejectOrForward(String::new()),
            true,
        ),
        case(
            "te-cl",
            "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n".into(),
            chunked(SMUGGLED),
            Must::RejectOrForward(SMUGGLED.into()),
            true,
        ),
        case(
            "cl-cl",
            format!("Content-Length: 0\r\nContent-Length: {n}\r\n"),
            SMUGGLED.into(),
            Must::Reject,
            true,
        ),
        case(
            "cl-body",
            format!("Content-Length: {n}\r\n"),
            SMUGGLED.into(),
            Must::Forward(SMUGGLED.into()),
            false,
        ),
        case(
            "bare-lf",
            format!("X-Pad: y\nContent-Length: {n}\r\n"),
            SMUGGLED.into(),
            Must::RejectOrForward(SMUGGLED.into()),
            false,
        ),
        case(
            "obs-fold",
            format!("Content-Length: {n}\r\nX-Folded: a\r\n b\r\n"),
            SMUGGLED.into(),
            Must::RejectOrForward(SMUGGLED.into()),
            false,
        ),
        case(
            "te-gzip",
            "Transfer-Encoding: chunked, gzip\r\n".into(),
            chunked(SMUGGLED),
            Must::Reject,
            true,
        ),
        case(
            "cl-negative",
            "Content-Length: -1\r\n".into(),
            SMUGGLED.into(),
            Must::Reject,
            true,
        ),
        case(
            "cl-hex",
            format!("Content-Length: 0x{n:x}\r\n"),
            SMUGGLED.into(),
            Must::Reject,
            true,
        ),
        case(
            "te-space",
            format!("Transfer-Encoding : chunked\r\nContent-Length: {n}\r\n"),
            chunked(SMUGGLED),
            Must::Reject,
            false,
        ),
    ]
}

#[tokio::test]
async fn request_smuggling_corpus_never_reaches_the_upstream() {
    let (upstream, proxy) = forwarding_proxy().await;

    // Each case on a fresh connection, all at once; the proxy closes each connection
    // after an error, or has answered what it will within three header read
    // timeouts (one left waiting for its next request is open until idle_timeout).
    let mut exchanges = JoinSet::new();
    for case in smuggling_cases() {
        let addr = proxy.addr;
        exchanges.spawn(async move {
            let request = format!(
                "POST /case/{} HTTP/1.1\r\nHost: x\r\n{}\r\n{}",
                case.name, case.headers, case.rest
            );
            let raw = raw_exchange(addr, request.as_bytes(), HEADER_READ_TIMEOUT * 3).await;
            (case, raw)
        });
    }
    let mut results = Vec::new();
    while let Some(done) = within("smuggling case", exchanges.join_next()).await {
        results.push(done.unwrap());
    }

    let paths = upstream.all_paths();
    assert!(
        !paths.iter().any(|p| p == "/smuggled"),
        "a smuggled request reached the upstream: {paths:?}"
    );
    for (case, raw) in results {
        let path = format!("/case/{}", case.name);
        let seen = upstream.seen(&path);
        let answered = statuses(&raw);
        let text = String::from_utf8_lossy(&raw);
        let context = format!(
            "case {}: answered {text:?}, upstream saw {seen:?}",
            case.name
        );
        assert_eq!(answered.len(), 1, "{context}");
        let status = answered[0];
        if case.closes {
            assert!(
                text.to_ascii_lowercase()
                    .contains("\r\nconnection: close\r\n"),
                "{context}"
            );
        }
        let forwarded = match &case.must {
            Must::Reject => {
                assert_eq!(status, 400, "{context}");
                None
            }
            Must::RejectOrForward(_) if (400..500).contains(&status) => None,
            Must::RejectOrForward(body) | Must::Forward(body) => Some(body),
        };
        match forwarded {
            None => {
                assert!((400..500).contains(&status), "{context}");
                assert!(seen.is_empty(), "{context}");
            }
            Some(body) => {
                assert_eq!(status, 200, "{context}");
                assert_eq!(seen.len(), 1, "{context}");
                let got = seen[0].body.as_ref().expect("a complete body");
                assert_eq!(got, body.as_bytes(), "{context}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// 6. Slowloris

/// How long a test waits for the proxy to close a connection that its header read
/// timeout (1 s) should close. Whatever else would close it takes longer: a timer
/// restarted by each byte, after the dripping client's 10 s; `idle_timeout`, after
/// 60 s. So the wait only bounds a hang, however late a loaded machine runs the timer.
const HEADER_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// That a connection with no whole head yet (`what`), read from for at most
/// [`HEADER_CLOSE_WAIT`], was `closed` by the proxy `elapsed` after it was opened, and
/// not before the [`HEADER_READ_TIMEOUT`].
fn assert_closed_at_the_header_read_timeout(what: &str, closed: bool, elapsed: Duration) {
    assert!(closed, "{what}: still open after {elapsed:?}");
    assert!(
        elapsed >= HEADER_READ_TIMEOUT,
        "{what}: closed after {elapsed:?}, before the header read timeout"
    );
}

#[tokio::test]
async fn dripping_request_head_is_closed_within_the_header_read_timeout() {
    let (upstream, proxy) = forwarding_proxy().await;

    let start = Instant::now();
    let stream = connect(proxy.addr).await;
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let drip = tokio::spawn(async move {
        // One header byte every 500 ms, for at most 10 s.
        for _ in 0..20 {
            sleep(Duration::from_millis(500)).await;
            if wr.write_all(b"X").await.is_err() {
                return;
            }
        }
    });
    let (closed, received) = closed_within(&mut rd, HEADER_CLOSE_WAIT).await;
    let elapsed = start.elapsed();
    drip.abort();
    assert_closed_at_the_header_read_timeout("the dripping head", closed, elapsed);
    assert!(!statuses(&received).contains(&200));
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn silent_connection_is_closed_within_the_header_read_timeout() {
    let (_upstream, proxy) = forwarding_proxy().await;

    let start = Instant::now();
    let mut stream = connect(proxy.addr).await;
    let (closed, received) = closed_within(&mut stream, HEADER_CLOSE_WAIT).await;
    let elapsed = start.elapsed();
    assert_closed_at_the_header_read_timeout("the silent connection", closed, elapsed);
    assert!(received.is_empty(), "{received:?}");
}

/// A connection whose first bytes could still be HTTP/2's preface (`P`, `PRI * HTTP/2.0`)
/// is still a connection without a request: it is closed within the header read
/// timeout. hyper waits for the whole preface to tell HTTP/2 from HTTP/1.1, with no
/// timeout of its own, so such a connection used to be held until `idle_timeout`
/// (60 s), six times as long: a slowloris that sends one `P` per connection.
#[tokio::test]
async fn a_connection_stalled_within_the_http2_preface_is_closed_within_the_header_read_timeout() {
    let (upstream, proxy) = forwarding_proxy().await;
    let mut stalled = JoinSet::new();
    for sent in [&b"P"[..], b"PRI * HTTP/2.0\r\n\r\nSM\r\n"] {
        let addr = proxy.addr;
        stalled.spawn(async move {
            let start = Instant::now();
            let mut stream = connect(addr).await;
            stream.write_all(sent).await.unwrap();
            let (closed, received) = closed_within(&mut stream, HEADER_CLOSE_WAIT).await;
            (sent, start.elapsed(), closed, received)
        });
    }
    while let Some(done) = within("stalled connections", stalled.join_next()).await {
        let (sent, elapsed, closed, received) = done.unwrap();
        let sent = String::from_utf8_lossy(sent);
        assert_closed_at_the_header_read_timeout(&format!("{sent:?}"), closed, elapsed);
        assert!(received.is_empty(), "{sent:?}: {received:?}");
    }
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn an_h2c_connection_gone_silent_is_closed() {
    let (_upstream, proxy) = forwarding_proxy().await;

    let start = Instant::now();
    let mut stream = connect(proxy.addr).await;
    // The HTTP/2 preface and an empty SETTINGS frame, then nothing: no head to time.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (closed, _) = closed_within(&mut stream, HEADER_CLOSE_WAIT).await;
    let elapsed = start.elapsed();
    assert!(closed, "still open after {elapsed:?}");
}

// ---------------------------------------------------------------------------------
// 7. Body limit

const MAX_BODY: u64 = 1024;

#[tokio::test]
async fn declared_oversized_body_gets_413_and_never_reaches_the_upstream() {
    let upstream = start_upstream().await;
    let mut settings = settings(upstream.addr);
    settings.forward.max_body_bytes = MAX_BODY;
    let proxy = start_proxy(settings, Vec::new()).await;

    let req = Request::post("/upload")
        .header(header::HOST, HOST)
        .body(Full::new(Bytes::from(vec![b'a'; 4096])))
        .unwrap();
    let res = send(proxy.addr, req).await;
    assert_eq!(res.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(res.json()["error"], "body_too_large");
    assert_eq!(upstream.hits(), 0);

    // A body at the limit passes.
    let req = Request::post("/upload")
        .header(header::HOST, HOST)
        .body(Full::new(Bytes::from(vec![b'a'; MAX_BODY as usize])))
        .unwrap();
    assert_eq!(send(proxy.addr, req).await.status, StatusCode::OK);
    assert_eq!(
        upstream.only("/upload").body.unwrap().len() as u64,
        MAX_BODY
    );
}

#[tokio::test]
async fn chunked_body_over_the_limit_gets_413_mid_stream() {
    let upstream = start_upstream().await;
    let mut settings = settings(upstream.addr);
    settings.forward.max_body_bytes = MAX_BODY;
    let proxy = start_proxy(settings, Vec::new()).await;

    let chunk = format!("320\r\n{}\r\n", "a".repeat(0x320)); // 800 bytes
    let head = "POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    // Complete, and cut off mid-stream (the client is still sending when the limit
    // is passed).
    let complete = format!("{head}{chunk}{chunk}0\r\n\r\n");
    let unfinished = format!("{head}{chunk}{chunk}");
    for request in [complete, unfinished] {
        let raw = raw_exchange(proxy.addr, request.as_bytes(), HEADER_READ_TIMEOUT * 3).await;
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(statuses(&raw), [413], "{text}");
        assert!(text.contains(r#"{"error":"body_too_large"}"#), "{text}");
    }
    let seen = upstream.seen("/chunked");
    assert!(
        seen.iter().all(|s| s.body.is_err()),
        "a complete oversized body reached the upstream: {seen:?}"
    );
}

/// A client that stops sending its body is not an upstream failure: the tuning hints
/// would take it for one (and suggest a lower limit while clients give up in a sale),
/// and so would whoever reads `rocgate_upstream_errors_total{kind="upstream_error"}`.
#[tokio::test]
async fn a_client_that_aborts_its_body_is_not_an_upstream_error() {
    let (upstream, proxy) = trickle_proxy("aborted_uploads", "/", 1000).await;
    const CUT_SHORT: &[u8] = b"POST /upload HTTP/1.1\r\nHost: h\r\nContent-Length: 50\r\n\r\nabc";
    // A connection's first request goes through the pool.
    let mut stream = connect(proxy.addr).await;
    stream.write_all(CUT_SHORT).await.unwrap();
    upstream.wait_for_hits(1).await;
    drop(stream);
    // Its second, through the connection's own lane.
    let mut stream = connect(proxy.addr).await;
    stream
        .write_all(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        .await
        .unwrap();
    within("the first answer", async {
        let mut head = [0u8; 64];
        stream.read(&mut head).await.unwrap()
    })
    .await;
    stream.write_all(CUT_SHORT).await.unwrap();
    upstream.wait_for_hits(3).await;
    drop(stream);
    let counted = |text: &str, kind: &str| {
        let series =
            format!("rocgate_upstream_errors_total{{route=\"aborted_uploads\",kind=\"{kind}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map(str::to_owned)
    };
    let text = within("the abort counted", async {
        loop {
            let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
            let text = String::from_utf8_lossy(&metrics.body).into_owned();
            if counted(&text, "client_aborted").as_deref() == Some("2")
                || counted(&text, "upstream_error").is_some_and(|n| n != "0")
            {
                return text;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // Every kind is exported from 0: an upstream error would show as 1.
    assert_eq!(
        counted(&text, "upstream_error").as_deref(),
        Some("0"),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------
// 8. Upstream failures

#[tokio::test]
async fn nothing_listening_upstream_gets_502() {
    let addr = closed_port().await;
    let proxy = start_proxy(settings(addr), Vec::new()).await;

    let res = send(proxy.addr, empty(get("/"))).await;
    assert_eq!(res.status, StatusCode::BAD_GATEWAY);
    assert_eq!(res.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(res.json(), serde_json::json!({ "error": "upstream_error" }));
}

#[tokio::test]
async fn silent_upstream_gets_504_after_the_response_timeout() {
    const RESPONSE_TIMEOUT: Duration = Duration::from_millis(300);
    let mut settings = settings(start_silent_upstream().await);
    settings.forward.response_timeout = RESPONSE_TIMEOUT;
    let proxy = start_proxy(settings, Vec::new()).await;

    let start = Instant::now();
    let res = send(proxy.addr, empty(get("/"))).await;
    let elapsed = start.elapsed();
    assert_eq!(res.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(
        res.json(),
        serde_json::json!({ "error": "response_timeout" })
    );
    assert!(
        elapsed >= RESPONSE_TIMEOUT && elapsed < RESPONSE_TIMEOUT + Duration::from_secs(2),
        "answered after {elapsed:?}"
    );
    // A request whose body was sent whole waits on the upstream too: 504, not the
    // client's 408.
    let post = Request::post("/")
        .header(header::HOST, HOST)
        .body(Full::new(Bytes::from_static(b"whole")))
        .unwrap();
    let res = send(proxy.addr, post).await;
    assert_eq!(res.status, StatusCode::GATEWAY_TIMEOUT);
    // The wait is in the latency histogram (the p99 alert sees an upstream that only
    // times out), under its own class.
    let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
    let text = String::from_utf8_lossy(&metrics.body);
    let timed_out = text.lines().find_map(|l| {
        let rest = l.strip_prefix("rocgate_upstream_request_duration_seconds_count{")?;
        let (labels, n) = rest.split_once("} ")?;
        labels.contains(r#"status_class="timeout""#).then_some(n)
    });
    assert!(timed_out.is_some_and(|n| n != "0"), "{text}");
}

#[tokio::test]
async fn an_upstream_that_dies_mid_body_is_counted() {
    let upstream = start_truncating_upstream().await;
    let route = RouteConfig::new("truncated", RouteMatch::prefix("/"));
    let proxy = start_proxy(settings(upstream), vec![route]).await;
    // The client gets the head and 10 of the 100 bytes promised.
    let reply = raw_exchange(
        proxy.addr,
        b"GET /a HTTP/1.1\r\nhost: shop.example\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("0123456789"), "{reply}");
    let series = r#"rocgate_upstream_errors_total{route="truncated",kind="body_aborted"} "#;
    within("the truncated body counted", async {
        loop {
            let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
            let text = String::from_utf8_lossy(&metrics.body).into_owned();
            if text.lines().any(|l| l.strip_prefix(series) == Some("1")) {
                return;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// An upstream that speaks HTTP/1.0, as `python3 -m http.server` does: it answers each
/// request with `HTTP/1.0 200 OK`, no length, and its path as the body ended by closing
/// the connection.
async fn start_http10_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Some(head) = read_head(&mut stream).await else {
                    return;
                };
                let path = String::from_utf8_lossy(&head)
                    .split(' ')
                    .nth(1)
                    .unwrap_or_default()
                    .to_owned();
                let answer = format!("HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\n{path}");
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

/// The proxy answers in its own HTTP version, not the upstream's: behind an HTTP/1.0
/// upstream a keep-alive client gets HTTP/1.1 answers (the body chunked, since the
/// upstream gave no length) and keeps its connection for the next request. The
/// upstream's version passed on made each answer `HTTP/1.0` and closed the client's
/// connection after it: the second request on it failed.
#[tokio::test]
async fn an_http10_upstream_is_answered_for_in_http11_and_the_connection_kept() {
    let upstream = start_http10_upstream().await;
    let route = RouteConfig::new("old", RouteMatch::prefix("/"));
    let proxy = start_proxy(settings(upstream), vec![route]).await;
    let mut sender: SendRequest<Full<Bytes>> = within("connect", http1::connect(proxy.addr)).await;
    for path in ["/first", "/second", "/third"] {
        let (version, body) = within(path, async {
            sender.ready().await.expect("the connection is kept");
            let res = sender.send_request(empty(get(path))).await.unwrap();
            let version = res.version();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (version, body)
        })
        .await;
        assert_eq!(version, http::Version::HTTP_11, "{path}");
        assert_eq!(body, path.as_bytes(), "{path}");
    }
}

/// Once shutdown begins, `/readyz` answers 503 "shutting down" through the grace
/// period in which requests in flight finish (the admin API still answers): a load
/// balancer probing it stops sending the instance requests it would refuse. It
/// answered 200 "ready" until the admin API closed with the rest.
#[tokio::test]
async fn readyz_answers_503_once_shutdown_begins() {
    // An upstream that tells when it has a request and never answers it: the request
    // stays in flight, and the grace period lasts.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (has_request, mut request_arrived) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head).await;
            let _ = has_request.send(());
            held.push(stream);
        }
    });
    let mut s = settings(upstream);
    s.forward.response_timeout = Duration::from_secs(30);
    s.shutdown_grace = Duration::from_secs(10);
    let proxy = start_proxy(s, vec![]).await;
    let admin = proxy.admin;
    let ready = send(admin, empty(admin_get("/readyz"))).await;
    assert_eq!(
        (ready.status, &ready.body[..]),
        (StatusCode::OK, &b"ready"[..])
    );
    let addr = proxy.addr;
    let _in_flight = tokio::spawn(async move { send(addr, empty(get("/held"))).await });
    within("the request upstream", request_arrived.recv()).await;
    let _run = proxy.shut_down();
    let answer = within("/readyz saying so", async {
        loop {
            let answer = send(admin, empty(admin_get("/readyz"))).await;
            if answer.status != StatusCode::OK {
                return answer;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert_eq!(
        (answer.status, &answer.body[..]),
        (StatusCode::SERVICE_UNAVAILABLE, &b"shutting down"[..])
    );
}

/// Held by the tests that read `rocgate_upstream_lanes`: the metrics recorder is one
/// per process, so another proxy's scrape would set the gauge to its own count.
static LANES_GAUGE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An upstream that answers every request with its path and counts the connections
/// it accepted; with `close`, it closes each connection after one response.
async fn start_counting_upstream(close: bool) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let service =
                hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| async move {
                    let mut res =
                        Response::new(Full::new(Bytes::from(req.uri().path().to_owned())));
                    if close {
                        res.headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    Ok::<_, std::convert::Infallible>(res)
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    (addr, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_client_gets_one_upstream_connection_of_its_own() {
    use std::sync::atomic::Ordering;
    let _gauge = LANES_GAUGE.lock().await;
    let (upstream, accepted) = start_counting_upstream(false).await;
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    for (client, expected) in [(0, 2), (1, 3)] {
        let mut conn = Client::connect(proxy.addr).await;
        for n in 0..20 {
            let path = format!("/c{client}/r{n}");
            let res = conn.send(empty(get(&path))).await;
            assert_eq!(res.status, StatusCode::OK);
            assert_eq!(res.body, path.as_bytes(), "responses stay in order");
        }
        // The first request of a connection goes through the pool (whose connection is
        // reused by the next client), the rest through the connection's own lane.
        assert_eq!(accepted.load(Ordering::SeqCst), expected, "client {client}");
        if client == 0 {
            let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
            let text = String::from_utf8_lossy(&metrics.body);
            assert!(
                text.lines().any(|l| l == "rocgate_upstream_lanes 1"),
                "{text}"
            );
        }
    }
}

/// `rocgate serve` sweeps the idle keys of a partitioned route on a thread of its own:
/// its engine sweeps apart from requests, and a key idle past `idle_timeout` (10 s on
/// the test's clock) is evicted with no request to roll the route's window, within
/// the 3 s the test waits (the sweeper passes every 100 ms; the upkeep task, which
/// would bring the route up to date, is 5 s from the start away, and sweeps nothing on
/// an engine that sweeps apart). Once serving ends, the sweeper has stopped and left
/// the engine sweeping in requests. Before, the request that rolled the window ran
/// the sweep, and waited for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_sweeps_idle_keys_apart_from_requests() {
    use rocgate::clock::{Clock, ManualClock};
    let upstream = start_upstream().await;
    let clock = Arc::new(ManualClock::new());
    let mut route = RouteConfig::new("swept_apart", RouteMatch::prefix("/"));
    let mut keys = KeyLimits::default();
    keys.idle_timeout = Duration::from_secs(10);
    route.partition = Partition::ClientIp(keys);
    let proxy = running::start_proxy_with_clock(
        settings(upstream.addr),
        vec![route],
        Arc::clone(&clock) as Arc<dyn Clock>,
    )
    .await;
    let reply = send(proxy.addr, empty(get("/a"))).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(proxy.reloader.engine().sweeps_apart());
    assert_eq!(proxy.snapshot("swept_apart").keys, 1);
    clock.advance(Duration::from_secs(11));
    // A snapshot reads the table as it is: it rolls and sweeps nothing.
    let evicted = timeout(Duration::from_secs(3), async {
        while proxy.snapshot("swept_apart").keys != 0 {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        evicted.is_ok(),
        "the idle key is still in the table after 3 s"
    );
    assert_eq!(proxy.snapshot("swept_apart").keys_evicted, 1);
    let reloader = proxy.reloader.clone();
    within("shutdown", proxy.shut_down())
        .await
        .unwrap()
        .unwrap();
    assert!(
        !reloader.engine().sweeps_apart(),
        "the sweeper stopped with serving, and requests sweep again"
    );
}

/// `Proxy::run` stops its sweeper, whose drop joins the sweeper's thread and so waits
/// for a sweep under way, without blocking the async worker it runs on: on a runtime
/// of one worker, with the sweeper held in a pass until a task of that runtime lets it
/// go, shutdown completes. Before, the join blocked the only worker, the task that was
/// to let the pass go never ran again, and shutdown never completed.
#[test]
fn serve_stops_its_sweeper_without_blocking_the_async_worker() {
    use rocgate::clock::{Clock, ManualClock, Nanos};
    use std::sync::Condvar;

    /// A manual clock that holds the sweeper thread's first read until released,
    /// saying when it holds it.
    struct HoldsTheSweeper {
        clock: ManualClock,
        held: Mutex<Option<oneshot::Sender<()>>>,
        released: (Mutex<bool>, Condvar),
    }
    impl HoldsTheSweeper {
        fn release(&self) {
            *self.released.0.lock().unwrap() = true;
            self.released.1.notify_all();
        }
    }
    impl Clock for HoldsTheSweeper {
        fn now(&self) -> Nanos {
            if std::thread::current().name() == Some("rocgate-sweeper") {
                if let Some(held) = self.held.lock().unwrap().take() {
                    let _ = held.send(());
                    let (released, freed) = &self.released;
                    let mut released = released.lock().unwrap();
                    while !*released {
                        released = freed.wait(released).unwrap();
                    }
                }
            }
            self.clock.now()
        }
    }

    let (held, sweeper_held) = oneshot::channel();
    let clock = Arc::new(HoldsTheSweeper {
        clock: ManualClock::new(),
        held: Mutex::new(Some(held)),
        released: (Mutex::new(false), Condvar::new()),
    });
    let (done, finished) = std::sync::mpsc::channel();
    let served = Arc::clone(&clock);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let upstream = start_upstream().await;
            let mut route = RouteConfig::new("swept_at_shutdown", RouteMatch::prefix("/"));
            route.partition = Partition::ClientIp(KeyLimits::default());
            let proxy = running::start_proxy_with_clock(
                settings(upstream.addr),
                vec![route],
                Arc::clone(&served) as Arc<dyn Clock>,
            )
            .await;
            sweeper_held.await.unwrap();
            let run = proxy.shut_down();
            // Time for `run` to reach the sweeper; this task runs again only if `run`
            // waits for the sweeper's thread without holding the worker.
            sleep(Duration::from_millis(100)).await;
            served.release();
            run.await.unwrap().unwrap();
        });
        let _ = done.send(());
    });
    let shut_down = finished.recv_timeout(Duration::from_secs(10));
    // Should it have blocked, the sweeper is let go, for the thread to end.
    clock.release();
    assert!(
        shut_down.is_ok(),
        "shutdown did not complete in 10 s: the sweeper's drop blocked the only worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_idle_for_upstream_idle_timeout_opens_a_new_connection() {
    use rocgate::clock::ManualClock;
    use std::sync::atomic::Ordering;
    let (upstream, accepted) = start_counting_upstream(false).await;
    let clock = Arc::new(ManualClock::new());
    let proxy = Proxy::bind_with_clock(
        settings(upstream),
        // One route no request here takes: every request is forwarded as is.
        &Config::new(vec![RouteConfig::new(
            "lane_idle_none",
            RouteMatch::exact("GET", "/no-request-goes-here"),
        )]),
        None,
        Arc::clone(&clock) as Arc<dyn rocgate::clock::Clock>,
    )
    .await
    .unwrap();
    let addr = proxy.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    let mut conn = Client::connect(addr).await;
    // (idle before the request, upstream connections accepted after it)
    for (idle_ms, connections, why) in [
        (0, 1, "the first request goes through the pool"),
        (0, 2, "the second opens the lane's connection"),
        (
            3_900,
            2,
            "idle for less than upstream_idle_timeout (4 s): reused",
        ),
        (
            4_000,
            3,
            "idle for 4 s: the upstream may be closing it, so another",
        ),
        (0, 3, "the new connection is reused"),
    ] {
        clock.advance(Duration::from_millis(idle_ms));
        let res = conn.send(empty(get("/r"))).await;
        assert_eq!(res.status, StatusCode::OK, "{why}");
        assert_eq!(accepted.load(Ordering::SeqCst), connections, "{why}");
    }
    stop.send(()).unwrap();
    within("shutdown", run).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_does_not_reuse_a_connection_idle_for_upstream_idle_timeout() {
    use std::sync::atomic::Ordering;
    let (upstream, accepted) = start_counting_upstream(false).await;
    let mut short = settings(upstream);
    short.forward.upstream_idle_timeout = Duration::from_millis(200);
    let proxy = start_proxy(short, Vec::new()).await;
    // A request on a connection of its own goes through the pool.
    assert_eq!(
        send(proxy.addr, empty(get("/a"))).await.status,
        StatusCode::OK
    );
    let before = accepted.load(Ordering::SeqCst);
    // The pool reads its own clock (hyper-util's): wait past the timeout for real.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        send(proxy.addr, empty(get("/b"))).await.status,
        StatusCode::OK
    );
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        before + 1,
        "a new connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_max_upstream_lanes_0_every_request_shares_the_pool() {
    use std::sync::atomic::Ordering;
    let (upstream, accepted) = start_counting_upstream(false).await;
    let mut pooled = settings(upstream);
    pooled.forward.max_upstream_lanes = 0;
    let proxy = start_proxy(pooled, Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    for n in 0..10 {
        let path = format!("/r{n}");
        assert_eq!(conn.send(empty(get(&path))).await.body, path.as_bytes());
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// Writes `request` on a connection of its own ([`raw_exchange`]), which must be
/// answered 200 alone: the upstream's one request to `path`.
async fn answered_200(
    proxy: &RunningProxy,
    upstream: &Upstream,
    request: &[u8],
    path: &str,
) -> Seen {
    let raw = raw_exchange(proxy.addr, request, IO_TIMEOUT).await;
    assert_eq!(statuses(&raw), [200]);
    upstream.only(path)
}

/// An HTTP/1.1 request without `Host` gets 400 (RFC 9112 §3.2, a MUST; Envoy and
/// nginx refuse it too): it was forwarded with the upstream's own `Host`, for a host
/// the client never named. So does one in absolute form, whose target names the
/// host: RFC 9112 §3.2.2 puts the target's host in place of `Host`, not of its absence
/// ("a client MUST send a Host header field in all HTTP/1.1 request messages"); it was
/// forwarded. HTTP/1.0 needs no `Host`: its requests go up with the upstream's; two
/// `Host`s, or one that is no `host[:port]`, are refused in HTTP/1.0 as in HTTP/1.1.
#[tokio::test]
async fn a_request_without_host_is_refused_in_http_1_1_and_gets_the_upstreams_in_1_0() {
    let (upstream, proxy) = forwarding_proxy().await;
    for request in [
        &b"GET /n1 HTTP/1.1\r\n\r\n"[..],
        b"GET http://shop.example/n1 HTTP/1.1\r\nConnection: close\r\n\r\n",
        b"GET /n1 HTTP/1.0\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
        b"GET /n1 HTTP/1.0\r\nHost: a.example@b.example\r\n\r\n",
    ] {
        let raw = raw_exchange(proxy.addr, request, IO_TIMEOUT).await;
        let text = String::from_utf8_lossy(&raw);
        assert_eq!(statuses(&raw), [400], "{text}");
    }
    assert!(
        upstream.seen("/n1").is_empty(),
        "went up without one valid host"
    );
    let seen = answered_200(&proxy, &upstream, b"GET /h1 HTTP/1.0\r\n\r\n", "/h1").await;
    assert_eq!(
        seen.headers[header::HOST],
        upstream.addr.to_string().as_str()
    );
    assert!(!seen.headers.contains_key("x-forwarded-host"));
}

#[tokio::test]
async fn an_absolute_form_requests_host_is_its_targets() {
    let (upstream, proxy) = forwarding_proxy().await;
    // RFC 9112 §3.2.2: the Host of a request in absolute form is replaced by the
    // authority of its target.
    let seen = answered_200(
        &proxy,
        &upstream,
        b"GET http://shop.example/abs HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n",
        "/abs",
    )
    .await;
    assert_eq!(seen.headers[header::HOST], "shop.example");
    assert_eq!(seen.headers["x-forwarded-host"], "shop.example");
    // Its host and port, that is: a userinfo (credentials) is no part of a Host.
    let seen = answered_200(
        &proxy,
        &upstream,
        b"GET http://alice:secret@shop.example:8080/user HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n",
        "/user",
    )
    .await;
    assert_eq!(seen.headers[header::HOST], "shop.example:8080");
    assert_eq!(seen.headers["x-forwarded-host"], "shop.example:8080");
}

/// A recording upstream and a proxy in front of it, with the tests' [`settings`], over
/// one [`trickle_route`]: `name` on the paths under `prefix`, admitting `capacity`
/// requests over a test run.
async fn trickle_proxy(name: &str, prefix: &str, capacity: u64) -> (Upstream, RunningProxy) {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        settings(upstream.addr),
        vec![trickle_route(name, prefix, capacity)],
    )
    .await;
    (upstream, proxy)
}

/// A recording upstream and a proxy in front of it over one route `name` on every
/// path, partitioned by `header:host`: each host (as the route keys it) has one token
/// over a test run.
async fn host_partitioned_proxy(name: &str) -> (Upstream, RunningProxy) {
    let upstream = start_upstream().await;
    let mut route = trickle_route(name, "/", 1);
    route.partition = Partition::Header("host".into(), KeyLimits::default());
    let proxy = start_proxy(settings(upstream.addr), vec![route]).await;
    (upstream, proxy)
}

/// The statuses of the answers to `requests`, each written on a connection of its own
/// (see [`raw_exchange`]), one after the other.
async fn statuses_each(addr: SocketAddr, requests: impl IntoIterator<Item = String>) -> Vec<u16> {
    let mut answers = Vec::new();
    for request in requests {
        answers.extend(statuses(
            &raw_exchange(addr, request.as_bytes(), IO_TIMEOUT).await,
        ));
    }
    answers
}

/// A route partitioned by `header:host` keys a request by the host it is for, the one
/// the upstream sees: its target's authority (absolute form, HTTP/2's `:authority`)
/// before its `Host`. It used to key by `Host` alone: a client could name the same
/// tenant in its target and a new `Host` each time, for a fresh quota each, and h2c
/// requests (which need no `Host`) were all one keyless client.
#[tokio::test]
async fn a_host_partition_keys_by_the_host_the_upstream_sees() {
    let (upstream, proxy) = host_partitioned_proxy("per_host").await;
    // One tenant in the target, two in `Host`: one key, one token.
    let answers = statuses_each(
        proxy.addr,
        ["fake-1.example", "fake-2.example"].map(|fake| {
            format!(
                "GET http://tenant-a.example/abs HTTP/1.1\r\nHost: {fake}\r\nConnection: close\r\n\r\n"
            )
        }),
    )
    .await;
    assert_eq!(answers, [200, 429]);
    // A host name in any case is one host (RFC 9110 §4.2.3), so one key: each spelling
    // used to be a key of its own, 2^n fresh quotas for a name of n letters.
    let answers = statuses_each(
        proxy.addr,
        ["case.example", "CASE.example", "Case.Example"].map(|spelling| {
            format!("GET /case HTTP/1.1\r\nHost: {spelling}\r\nConnection: close\r\n\r\n")
        }),
    )
    .await;
    assert_eq!(answers, [200, 429, 429]);
    // Two tenants over HTTP/2, without `Host`: two keys, a token each.
    let mut sender = h2c_connect(proxy.addr).await;
    for tenant in ["tenant-b.example", "tenant-c.example"] {
        let req = Request::get(format!("http://{tenant}/h2"))
            .body(Full::<Bytes>::default())
            .unwrap();
        let res = within("h2 response", sender.send_request(req))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{tenant}");
    }
    let hosts: Vec<_> = upstream
        .seen("/h2")
        .iter()
        .map(|s| s.headers[header::HOST].clone())
        .collect();
    assert_eq!(hosts, ["tenant-b.example", "tenant-c.example"]);
}

/// A `header:host` partition keys a host by its name alone: a port (the default one,
/// another, or none after the colon) and a trailing dot name the same virtual host
/// to nginx and Apache, and each was a fresh quota of its own (65,536 for the ports).
#[tokio::test]
async fn a_host_partition_keys_a_host_by_its_name_without_port_or_trailing_dot() {
    let (upstream, proxy) = host_partitioned_proxy("per_host_name").await;
    let requests = [
        ("/n", "name.example"),
        ("/n", "name.example."),
        ("/n", "name.example:80"),
        ("/n", "NAME.example.:8080"),
        ("/n", "name.example:"),
        ("http://name.example.:81/n", "other.example"),
        ("/v6", "[2001:db8::1]"),
        ("/v6", "[2001:DB8::1]:80"),
    ]
    .map(|(target, host)| {
        format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    });
    let answers = statuses_each(proxy.addr, requests).await;
    assert_eq!(answers, [200, 429, 429, 429, 429, 429, 200, 429]);
    // The upstream still gets the host as the client wrote it.
    let seen = upstream.only("/n");
    assert_eq!(seen.headers[header::HOST], "name.example");
}

/// A request refused with 400 for its head says why, beside its kind: every such
/// refusal answered `{"error":"bad_request"}` alone, and logged nothing at the default
/// level, so a client's developer could not tell two `Host` fields from a missing one.
#[tokio::test]
async fn a_head_refused_with_400_says_why() {
    let (upstream, proxy) = forwarding_proxy().await;
    for (request, why) in [
        (
            &b"CONNECT db.internal:5432 HTTP/1.1\r\nHost: db.internal:5432\r\nConnection: close\r\n\r\n"[..],
            "CONNECT is not forwarded: rocgate is a reverse proxy, not a forward proxy",
        ),
        (
            b"GET shop.example:8080 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "a target in authority form (host:port) is CONNECT's alone (RFC 9112 §3.2.3)",
        ),
        (
            b"GET * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            "the target * is OPTIONS's alone (RFC 9112 §3.2.4)",
        ),
        (
            b"GET /two HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nConnection: close\r\n\r\n",
            "two Host fields: a request names one host (RFC 9112 §3.2)",
        ),
        (
            b"GET /none HTTP/1.1\r\nConnection: close\r\n\r\n",
            "no Host field: an HTTP/1.1 request names its host (RFC 9112 §3.2)",
        ),
    ] {
        let raw = raw_exchange(proxy.addr, request, IO_TIMEOUT).await;
        let text = String::from_utf8_lossy(&raw);
        assert!(text.starts_with("HTTP/1.1 400 "), "{text}");
        let body = format!(r#"{{"error":"bad_request","detail":"{why}"}}"#);
        assert!(text.ends_with(&body), "{text}");
    }
    assert_eq!(upstream.hits(), 0, "{:?}", upstream.all_paths());
}

#[tokio::test]
async fn connect_is_refused_and_never_reaches_the_upstream() {
    let (upstream, proxy) = trickle_proxy("all", "/", 1000).await;
    let raw = raw_exchange(
        proxy.addr,
        b"CONNECT db.internal:5432 HTTP/1.1\r\nHost: db.internal:5432\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(statuses(&raw), [400], "{}", String::from_utf8_lossy(&raw));
    assert_eq!(upstream.hits(), 0, "{:?}", upstream.all_paths());
}

#[tokio::test]
async fn a_lane_recovers_after_a_response_timeout() {
    let upstream = start_upstream().await;
    let mut short = settings(upstream.addr);
    short.forward.response_timeout = SLOW / 2;
    let proxy = start_proxy(short, Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    // The pool's request, then the lane's, time out; the lane then opens a new
    // connection, and no late answer reaches a later request.
    for path in ["/slow", "/slow"] {
        assert_eq!(
            conn.send(empty(get(path))).await.status,
            StatusCode::GATEWAY_TIMEOUT
        );
    }
    for n in 0..3 {
        let res = conn.send(empty(get(&format!("/after{n}")))).await;
        assert_eq!((res.status, &res.body[..]), (StatusCode::OK, &b"ok"[..]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways_over_a_lane() {
    let (upstream, proxy) = forwarding_proxy().await;
    let mut conn = Client::connect(proxy.addr).await;
    assert_eq!(conn.send(empty(get("/first"))).await.status, StatusCode::OK);
    // An upload within the limit (64 KiB) arrives whole.
    let body = Bytes::from(vec![b'u'; 60 * 1024]);
    let upload = Request::post("/upload")
        .header(header::HOST, HOST)
        .body(Full::new(body.clone()))
        .unwrap();
    assert_eq!(conn.send(upload).await.status, StatusCode::OK);
    assert_eq!(upstream.only("/upload").body.unwrap(), body);
    // Large answers, one after another on the connection, arrive whole.
    for n in 0..3 {
        let res = conn.send(empty(get("/big"))).await;
        assert_eq!(res.status, StatusCode::OK);
        assert_eq!(res.body.len(), BIG, "answer {n}");
        assert!(res.body.iter().all(|&b| b == b'b'), "answer {n}");
    }
}

/// A GET (or any request) whose body has no declared length, chunked over HTTP/1.1 or
/// DATA frames without `content-length` over h2c, reaches the upstream with its body,
/// as one with a `Content-Length` does (Elasticsearch's `GET /_search` takes its query
/// so). hyper's client sends a GET of unknown length as one with no body unless told
/// `Transfer-Encoding: chunked`, and rocgate strips the client's (hop by hop): the
/// upstream got the GET without its body, and answered it as a query of nothing.
#[tokio::test]
async fn a_get_whose_body_has_no_declared_length_is_forwarded_with_it() {
    let (upstream, proxy) = forwarding_proxy().await;
    // The connection's first request goes through the pool, its second on its lane.
    let mut stream = connect(proxy.addr).await;
    for path in ["/get-body-pooled", "/get-body-lane"] {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{}",
            chunked("{\"query\":1}")
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_until_seen(&mut stream, "\r\n\r\nok").await;
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{path}: {answer}");
        assert_eq!(upstream.only(path).body.unwrap(), "{\"query\":1}", "{path}");
    }
    let stream = connect(proxy.addr).await;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (mut body, channel) = http_body_util::channel::Channel::<Bytes, io::Error>::new(1);
    let req = Request::get(format!("http://{HOST}/get-body-h2c"))
        .body(channel)
        .unwrap();
    let answer = tokio::spawn(sender.send_request(req));
    body.send_data(Bytes::from_static(b"{\"query\":2}"))
        .await
        .unwrap();
    drop(body);
    let res = within("h2 response", answer).await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        upstream.only("/get-body-h2c").body.unwrap(),
        "{\"query\":2}"
    );
    // Told so, not guessed: the bodies of unknown length went up chunked, with no
    // `Content-Length`.
    for path in ["/get-body-pooled", "/get-body-lane", "/get-body-h2c"] {
        let seen = upstream.only(path);
        assert_eq!(seen.headers[header::TRANSFER_ENCODING], "chunked", "{path}");
        assert!(!seen.headers.contains_key(header::CONTENT_LENGTH), "{path}");
    }
    // A request with no body, or one of a declared length (0 too), goes as it came:
    // not chunked, its `Content-Length` alone.
    for (path, request, length) in [
        ("/no-body", "GET /no-body HTTP/1.1\r\nHost: x\r\n", None),
        (
            "/zero",
            "GET /zero HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n",
            Some("0"),
        ),
        ("/head", "HEAD /head HTTP/1.1\r\nHost: x\r\n", None),
        (
            "/sized",
            "GET /sized HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n",
            Some("5"),
        ),
    ] {
        let body = if length == Some("5") { "hello" } else { "" };
        let request = format!("{request}Connection: close\r\n\r\n{body}");
        let seen = answered_200(&proxy, &upstream, request.as_bytes(), path).await;
        assert!(
            !seen.headers.contains_key(header::TRANSFER_ENCODING),
            "{path}"
        );
        let sent = seen.headers.get(header::CONTENT_LENGTH);
        assert_eq!(sent.map(|v| v.to_str().unwrap()), length, "{path}");
        assert_eq!(seen.body.unwrap(), body, "{path}");
    }
    let res = h2c_get(proxy.addr, "/no-body-h2c").await;
    assert_eq!(res.status(), StatusCode::OK);
    let seen = upstream.only("/no-body-h2c");
    assert!(!seen.headers.contains_key(header::TRANSFER_ENCODING));
    assert_eq!(seen.body.unwrap(), "");
}

/// Reads from `stream` until what was read contains `marker`.
async fn read_until_seen(stream: &mut TcpStream, marker: &str) -> String {
    let mut seen = Vec::new();
    within(marker, async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains(marker) {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before {marker:?}: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test]
async fn expect_100_continue_works_over_a_lane() {
    let (upstream, proxy) = forwarding_proxy().await;
    let mut stream = connect(proxy.addr).await;
    stream
        .write_all(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_until_seen(&mut stream, "\r\n\r\nok").await;
    // The body is sent only once the proxy asks for it.
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        .await
        .unwrap();
    read_until_seen(&mut stream, "HTTP/1.1 100 Continue\r\n\r\n").await;
    stream.write_all(b"hello").await.unwrap();
    let answer = read_until_seen(&mut stream, "\r\n\r\nok").await;
    assert!(answer.contains("HTTP/1.1 200 OK"), "{answer}");
    assert_eq!(upstream.only("/upload").body.unwrap(), "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_beyond_max_upstream_lanes_share_the_pool() {
    use std::sync::atomic::Ordering;
    let _gauge = LANES_GAUGE.lock().await;
    let (upstream, accepted) = start_counting_upstream(false).await;
    let mut one = settings(upstream);
    one.forward.max_upstream_lanes = 1;
    let proxy = start_proxy(one, Vec::new()).await;
    let lanes = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("rocgate_upstream_lanes "))
            .map(str::to_owned)
    };
    let mut first = Client::connect(proxy.addr).await;
    let mut second = Client::connect(proxy.addr).await;
    for n in 0..10 {
        for (name, conn) in [("a", &mut first), ("b", &mut second)] {
            let path = format!("/{name}{n}");
            assert_eq!(conn.send(empty(get(&path))).await.body, path.as_bytes());
        }
    }
    // The first client holds the one lane; the second's requests all went through the
    // pool, whose connection the first request opened.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
    assert_eq!(
        lanes(&String::from_utf8_lossy(&metrics.body)).as_deref(),
        Some("1")
    );
    // Once the first client leaves, its lane is free for a newcomer.
    drop(first);
    within("the lane freed", async {
        loop {
            let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
            if lanes(&String::from_utf8_lossy(&metrics.body)).as_deref() == Some("0") {
                break;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let mut third = Client::connect(proxy.addr).await;
    for n in 0..3 {
        let path = format!("/c{n}");
        assert_eq!(third.send(empty(get(&path))).await.body, path.as_bytes());
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_reconnects_when_the_upstream_closes_its_connection() {
    use std::sync::atomic::Ordering;
    let (upstream, accepted) = start_counting_upstream(true).await;
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    for n in 0..10 {
        let path = format!("/r{n}");
        let res = conn.send(empty(get(&path))).await;
        assert_eq!(res.status, StatusCode::OK, "request {n}");
        assert_eq!(res.body, path.as_bytes());
        assert!(
            res.headers.get(header::CONNECTION).is_none(),
            "the upstream's Connection header is hop-by-hop"
        );
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        10,
        "one connection per request"
    );
}

#[tokio::test]
async fn upstream_failures_map_the_same_on_a_connections_later_requests() {
    // Nothing listening: 502 for the first request (the pool) and the next (the lane).
    let addr = closed_port().await;
    let proxy = start_proxy(settings(addr), Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    for _ in 0..2 {
        let res = conn.send(empty(get("/"))).await;
        assert_eq!(res.status, StatusCode::BAD_GATEWAY);
        assert_eq!(res.json(), serde_json::json!({ "error": "upstream_error" }));
    }
    // A silent upstream: 504 both times.
    let mut silent = settings(start_silent_upstream().await);
    silent.forward.response_timeout = Duration::from_millis(300);
    let proxy = start_proxy(silent, Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    for _ in 0..2 {
        let res = conn.send(empty(get("/"))).await;
        assert_eq!(res.status, StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            res.json(),
            serde_json::json!({ "error": "response_timeout" })
        );
    }
    // A body over the limit on a connection's second request: 413, as on its first.
    let upstream = start_upstream().await;
    let mut limited = settings(upstream.addr);
    limited.forward.max_body_bytes = MAX_BODY;
    let proxy = start_proxy(limited, Vec::new()).await;
    let chunk = format!("320\r\n{}\r\n", "a".repeat(0x320));
    let first = "GET /first HTTP/1.1\r\nHost: x\r\n\r\n";
    let second = format!(
        "POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}{chunk}0\r\n\r\n"
    );
    let raw = raw_exchange(
        proxy.addr,
        format!("{first}{second}").as_bytes(),
        HEADER_READ_TIMEOUT * 3,
    )
    .await;
    // (The first body, `ok`, runs into the second status line.)
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.starts_with("HTTP/1.1 200 ") && text.contains("okHTTP/1.1 413 "),
        "{text}"
    );
    assert!(text.ends_with(r#"{"error":"body_too_large"}"#), "{text}");
    assert!(upstream.seen("/chunked").iter().all(|s| s.body.is_err()));
}

// ---------------------------------------------------------------------------------
// 9. Graceful shutdown

#[tokio::test]
async fn shutdown_closes_the_listener_and_lets_requests_in_flight_finish() {
    const IN_FLIGHT: u64 = 5;
    let (upstream, proxy) = forwarding_proxy().await;
    let addr = proxy.addr;

    // Each slow request is its connection's second, so it runs on the connection's
    // own upstream connection.
    let mut in_flight = JoinSet::new();
    for _ in 0..IN_FLIGHT {
        in_flight.spawn(async move {
            let mut conn = Client::connect(addr).await;
            assert_eq!(conn.send(empty(get("/warm"))).await.status, StatusCode::OK);
            conn.send(empty(get("/slow"))).await
        });
    }
    upstream.wait_for_hits(2 * IN_FLIGHT).await;
    let run = proxy.shut_down();

    // The listener closes at once: connecting is soon refused. (A connection the
    // kernel queued just before the close is reset instead; try again.)
    within("listener closed", async {
        loop {
            match TcpStream::connect(addr).await {
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => break,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
                Err(e) => panic!("connect failed otherwise: {e}"),
                Ok(_) => sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await;

    let mut finished = 0;
    while let Some(reply) = within("in-flight request", in_flight.join_next()).await {
        let reply = reply.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "slow");
        finished += 1;
    }
    assert_eq!(finished, IN_FLIGHT);
    within("run() returning", run).await.unwrap().unwrap();
    assert_eq!(upstream.hits(), 2 * IN_FLIGHT);
}

// ---------------------------------------------------------------------------------
// HTTP/2 to clients

/// An HTTP/2 (prior knowledge) connection to `addr`, driven by a task of its own.
/// A GET of `path` with no body on a fresh h2c connection to `addr`, and its answer.
async fn h2c_get(addr: SocketAddr, path: &str) -> Response<hyper::body::Incoming> {
    let req = Request::get(format!("http://{HOST}{path}"))
        .body(Full::default())
        .unwrap();
    within("h2 response", h2c_connect(addr).await.send_request(req))
        .await
        .unwrap()
}

async fn h2c_connect(addr: SocketAddr) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let stream = connect(addr).await;
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    sender
}

/// A header value is keyed without the whitespace around it. An HTTP/1 parser drops
/// it, but HTTP/2 carries a value as sent: `" k"` was a key of its own, and the
/// upstream, sent it over HTTP/1.1, read `k`: a fresh quota per padding.
#[tokio::test]
async fn a_header_partition_keys_a_value_without_the_whitespace_around_it() {
    let upstream = start_upstream().await;
    let mut route = trickle_route("per_padded_key", "/", 1);
    route.partition = Partition::Header("x-api-key".into(), KeyLimits::default());
    let proxy = start_proxy(settings(upstream.addr), vec![route]).await;
    let mut sender = h2c_connect(proxy.addr).await;
    let mut answers = Vec::new();
    for key in ["k", " k", "k ", "\tk\t", "  k  "] {
        let req = Request::get(format!("http://{HOST}/padded"))
            .header("x-api-key", key)
            .body(Full::<Bytes>::default())
            .unwrap();
        let res = within("h2 response", sender.send_request(req))
            .await
            .unwrap();
        answers.push(res.status().as_u16());
    }
    assert_eq!(answers, [200, 429, 429, 429, 429]);
    assert_eq!(upstream.only("/padded").headers["x-api-key"], "k");
}

/// The header a route is partitioned by reaches the upstream even when the client
/// names it in `Connection`: the upstream reads the key the request was limited by. It
/// used to be stripped as a connection option, so a client sending a fresh key with
/// each request (`Connection: x-api-key`) got a fresh quota each time while the
/// upstream saw a request with no key at all, one that the keyless limit holds: the
/// keyless limit escaped.
#[tokio::test]
async fn the_partition_header_named_in_connection_still_reaches_the_upstream() {
    let upstream = start_upstream().await;
    let mut route = trickle_route("per_named_key", "/", 1);
    route.partition = Partition::Header("x-api-key".into(), KeyLimits::default());
    let proxy = start_proxy(settings(upstream.addr), vec![route]).await;
    let mut conn = Client::connect(proxy.addr).await;
    for (path, key) in [("/fresh-1", "k1"), ("/fresh-2", "k2")] {
        let req = get(path)
            .header("x-api-key", key)
            .header(header::CONNECTION, "x-api-key, x-hop")
            .header("x-hop", "this hop's")
            .body(Full::<Bytes>::default())
            .unwrap();
        let res = conn.send(req).await;
        assert_eq!(res.status, StatusCode::OK, "{path}");
        let seen = upstream.only(path).headers;
        assert_eq!(
            seen.get("x-api-key").map(|v| v.as_bytes()),
            Some(key.as_bytes()),
            "{path}: {seen:?}"
        );
        // Another connection option is still this hop's.
        assert!(!seen.contains_key("x-hop"), "{path}: {seen:?}");
    }
}

/// A client speaking h2c (HTTP/2 with prior knowledge) is served like an HTTP/1.1 one:
/// forwarded over HTTP/1.1, and limited by the same bucket.
/// An h2c client's `cookie` fields, split one crumb a field as HTTP/2 allows, reach an
/// HTTP/1.1 upstream as one `Cookie` line joined with `"; "` (RFC 9113 §8.2.3). (They
/// went up as several lines, which CGI and WSGI stacks join with `", "`.)
#[tokio::test]
async fn an_h2c_clients_split_cookies_reach_the_upstream_as_one() {
    let up = start_upstream().await;
    let proxy = start_proxy(settings(up.addr), Vec::new()).await;
    let mut sender = h2c_connect(proxy.addr).await;
    for (path, crumbs) in [
        ("/one-crumb", &["a=1"][..]),
        ("/crumbs", &["a=1", "b=2", "c=3"]),
    ] {
        let mut req = Request::get(format!("http://{HOST}{path}"));
        for crumb in crumbs {
            req = req.header(header::COOKIE, *crumb);
        }
        let res = within(
            "h2 response",
            sender.send_request(req.body(Full::<Bytes>::default()).unwrap()),
        )
        .await
        .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let seen = up.only(path).headers;
        let cookies: Vec<_> = seen.get_all(header::COOKIE).iter().collect();
        assert_eq!(
            cookies,
            [HeaderValue::from_str(&crumbs.join("; ")).unwrap()],
            "{path}"
        );
    }
    let _ = proxy.shut_down().await;
}

#[tokio::test]
async fn h2c_clients_are_forwarded_and_limited() {
    let (up, proxy) = trickle_proxy("h2", "/", 2).await;
    let mut sender = h2c_connect(proxy.addr).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let req = Request::get(format!("http://{HOST}/h2"))
            .body(Full::<Bytes>::default())
            .unwrap();
        let res = within("h2 response", sender.send_request(req))
            .await
            .unwrap();
        assert_eq!(res.version(), http::Version::HTTP_2);
        statuses.push(res.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    let seen = up.only_n("/h2", 2);
    assert_eq!(seen[0].headers["x-forwarded-host"], HOST);
    let _ = proxy.shut_down().await;
}

/// A HEAD that rocgate answers itself (a 429, a 502) gets the head alone over HTTP/2
/// too, with the `Content-Length` a GET would have. hyper's HTTP/1 server leaves a
/// HEAD's body out, its HTTP/2 server does not: the body went out in DATA frames, which
/// a HEAD's stream must not carry, and the client's HTTP/2 stack reset the stream
/// (PROTOCOL_ERROR), so an h2c client saw an error, never the 429 or its `Retry-After`.
#[tokio::test]
async fn an_h2c_head_answered_by_rocgate_has_no_body() {
    let up = start_upstream().await;
    let down_addr = closed_port().await;
    for (upstream, route, want) in [
        (up.addr, "h2_head_limited", 429),
        (down_addr, "h2_head_down", 502),
    ] {
        let proxy = start_proxy(settings(upstream), vec![trickle_route(route, "/", 1)]).await;
        let mut sender = h2c_connect(proxy.addr).await;
        if want == 429 {
            // The one token.
            let req = Request::get(format!("http://{HOST}/h2-head"))
                .body(Full::<Bytes>::default())
                .unwrap();
            let res = within("h2 response", sender.send_request(req)).await;
            assert_eq!(res.unwrap().status(), StatusCode::OK);
        }
        let req = Request::head(format!("http://{HOST}/h2-head"))
            .body(Full::<Bytes>::default())
            .unwrap();
        let res = within("h2 HEAD response", sender.send_request(req))
            .await
            .unwrap_or_else(|e| panic!("{route}: the HEAD's stream failed: {e}"));
        assert_eq!(res.status().as_u16(), want, "{route}");
        let length: usize = res.headers()[header::CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(length > 0, "{route}: {:?}", res.headers());
        let body = within("h2 HEAD body", res.into_body().collect())
            .await
            .unwrap_or_else(|e| panic!("{route}: the HEAD's body failed: {e}"))
            .to_bytes();
        assert!(body.is_empty(), "{route}: {body:?}");
        let _ = proxy.shut_down().await;
    }
}

/// A response body that sends `done` once its gate opens, and not before.
struct GatedBody(Option<oneshot::Receiver<()>>);

impl http_body::Body for GatedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let Some(gate) = self.0.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let _ = std::task::ready!(std::pin::Pin::new(gate).poll(cx));
        self.0 = None;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            b"done",
        )))))
    }
}

/// A route admitting one request in flight (a concurrency limit, never cut) with
/// `queue` places to wait in, before an upstream whose first answer's body streams
/// until `open` is sent; the permit is held by that first request, whose head has
/// come. `hits` counts the requests the upstream got.
struct PermitHeld {
    proxy: RunningProxy,
    open: oneshot::Sender<()>,
    head: Response<hyper::body::Incoming>,
    hits: Arc<std::sync::atomic::AtomicUsize>,
    /// The first request's connection, open while its body streams.
    _first: Client,
}

impl PermitHeld {
    async fn start(queue: u32) -> PermitHeld {
        let (open, gate) = oneshot::channel::<()>();
        let gate = Arc::new(Mutex::new(Some(gate)));
        let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = listener.local_addr().unwrap();
        let app = Router::new().fallback({
            let hits = Arc::clone(&hits);
            move || {
                hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let gate = gate.lock().unwrap().take();
                async move {
                    match gate {
                        Some(gate) => Response::new(Body::new(GatedBody(Some(gate)))),
                        None => Response::new(Body::from("ok")),
                    }
                }
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut route = RouteConfig::new("one", RouteMatch::prefix("/"));
        route.controller.base_limit_rps = 1.0;
        route.controller.cut_limit_rps = 1.0;
        route.controller.danger_roc = f64::MAX;
        route.algorithm = Algorithm::Concurrency { queue };
        let proxy = start_proxy(settings(upstream), vec![route]).await;
        let mut first = Client::connect(proxy.addr).await;
        let head = within("the first head", async {
            first.sender.ready().await.unwrap();
            first
                .sender
                .send_request(empty(get("/stream")))
                .await
                .unwrap()
        })
        .await;
        assert_eq!(head.status(), StatusCode::OK);
        PermitHeld {
            proxy,
            open,
            head,
            hits,
            _first: first,
        }
    }
}

/// Opens a [`PermitHeld`]'s gate: the first request's body streams to its end, which
/// gives its permit back.
async fn end_the_first_body(open: oneshot::Sender<()>, head: Response<hyper::body::Incoming>) {
    open.send(()).unwrap();
    let body = within("the first body", head.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"done");
}

/// With the concurrency algorithm, a request stays in flight until its response body
/// has been sent: while the one permit's response streams, the next request is
/// refused; once the body ends, the permit is back.
#[tokio::test]
async fn a_concurrency_permit_is_held_until_the_response_body_ends() {
    let held = PermitHeld::start(0).await;
    let (proxy, open, head) = (&held.proxy, held.open, held.head);
    let refused = send(proxy.addr, empty(get("/other"))).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the first body still streams"
    );
    end_the_first_body(open, head).await;
    assert_eq!(
        send(proxy.addr, empty(get("/other"))).await.status,
        StatusCode::OK,
        "the body ended: its permit is back"
    );
}

// ---------------------------------------------------------------------------------
// 10. Slow request bodies

/// Sends a `Content-Length: n` upload on `stream` one byte every `every`, its head
/// after `before` (a request on the connection before it, or nothing); returns what
/// the proxy answered, read until it closes the connection.
async fn trickle_upload(addr: SocketAddr, before: &[u8], n: usize, every: Duration) -> String {
    let mut stream = connect(addr).await;
    if !before.is_empty() {
        stream.write_all(before).await.unwrap();
        read_until_seen(&mut stream, "\r\n\r\nok").await;
    }
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    for _ in 0..n {
        sleep(every).await;
        if stream.write_all(b"u").await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    within("the answer", read_until_closed(&mut stream, &mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// An upload that takes longer than `response_timeout` is the client's time, not the
/// upstream's: the upstream, which answers at once once it has the body, must get it
/// whole and its answer must reach the client (it was a 504, counted against the
/// upstream's health).
#[tokio::test]
async fn an_upload_slower_than_the_response_timeout_is_forwarded_whole() {
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
    let upstream = start_upstream().await;
    let mut short = settings(upstream.addr);
    short.forward.response_timeout = RESPONSE_TIMEOUT;
    let proxy = start_proxy(short, vec![trickle_route("slow_uploads", "/", 1000)]).await;
    // 20 bytes, one every 100 ms: 2 s in all, never 1 s without a byte. On a
    // connection's first request (the pool), then on its second (its lane).
    for before in [&b""[..], b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"] {
        let answer = trickle_upload(proxy.addr, before, 20, Duration::from_millis(100)).await;
        assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok"), "{answer}");
    }
    let seen = upstream.only_n("/upload", 2);
    assert!(
        seen.iter()
            .all(|s| s.body.as_deref() == Ok(&[b'u'; 20][..])),
        "{seen:?}"
    );
    // Nor is the upload upstream latency: the upstream answered at once, which is what
    // the latency histogram (and the alert on its p99) must say.
    let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
    let text = String::from_utf8_lossy(&metrics.body);
    let sum = text.lines().find_map(|l| {
        l.strip_prefix(
            r#"rocgate_upstream_request_duration_seconds_sum{route="slow_uploads",status_class="2xx"} "#,
        )
    });
    let sum: f64 = sum.expect("a 2xx duration").parse().unwrap();
    assert!(
        sum < 1.0,
        "two uploads of 2 s took the upstream {sum} s: {text}"
    );
}

/// A client that stops sending its body for `response_timeout` gets 408, the client's
/// timeout, not a 504 that blames the upstream.
#[tokio::test]
async fn a_client_that_stalls_its_body_gets_408_not_504() {
    const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
    let upstream = start_upstream().await;
    let mut short = settings(upstream.addr);
    short.forward.response_timeout = RESPONSE_TIMEOUT;
    let route = trickle_route("stalled", "/", 1000);
    let proxy = start_proxy(short, vec![route]).await;
    for before in [&b""[..], b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"] {
        let mut stream = connect(proxy.addr).await;
        if !before.is_empty() {
            stream.write_all(before).await.unwrap();
            read_until_seen(&mut stream, "\r\n\r\nok").await;
        }
        // 3 bytes of 10, then nothing.
        stream
            .write_all(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            .await
            .unwrap();
        let answer = read_until_seen(&mut stream, "}").await;
        assert!(answer.contains("HTTP/1.1 408 "), "{answer}");
        assert!(answer.contains(r#"{"error":"client_timeout"}"#), "{answer}");
    }
    let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
    let text = String::from_utf8_lossy(&metrics.body);
    let series =
        |kind: &str| format!(r#"rocgate_upstream_errors_total{{route="stalled",kind="{kind}"}} "#);
    assert!(
        text.lines()
            .any(|l| l.strip_prefix(&series("client_timeout")) == Some("2")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.strip_prefix(&series("response_timeout")) == Some("0")),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------
// 11. Trailers

/// Trailer fields pass both ways. HTTP/1.1 sends only those its `Trailer` header
/// declares (hyper drops the others), and `Trailer` is end-to-end (RFC 9110 §6.6.2,
/// not among §7.6.1's hop-by-hop fields): stripped, every trailer was lost.
#[tokio::test]
async fn trailers_pass_both_ways() {
    // The upstream answers with the request's `x-sum` trailer as its body, in a chunked
    // response that ends with an `x-checksum` trailer.
    let text = trailers_through_proxy(
        |trailers| {
            let sum = trailers
                .and_then(|t| t.get("x-sum"))
                .map_or(Bytes::from_static(b"none"), |v| {
                    Bytes::copy_from_slice(v.as_bytes())
                });
            let mut trailers = HeaderMap::new();
            trailers.insert("x-checksum", HeaderValue::from_static("abc"));
            // A body of unknown length, so HTTP/1.1 sends it chunked.
            let (mut tx, body) =
                http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(2);
            let (_, _) = (
                tx.try_send(http_body::Frame::data(sum)),
                tx.try_send(http_body::Frame::trailers(trailers)),
            );
            Response::builder()
                .header(header::TRAILER, "x-checksum")
                .body(Body::new(body))
                .unwrap()
        },
        "POST /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nTrailer: x-sum\r\n\
         Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nx-sum: 42\r\n\r\n",
    )
    .await;
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
    assert_eq!(text.matches("\r\n2\r\n42\r\n").count(), 2, "{text}");
    assert_eq!(
        text.matches("\r\n0\r\nx-checksum: abc\r\n\r\n").count(),
        2,
        "{text}"
    );
}

/// A client's trailer section carries no forwarding header and no hop-by-hop one to
/// the upstream, whoever the peer: rocgate rewrites those in the head alone, and an
/// untrusted client's `X-Forwarded-For: 6.6.6.6` sent as a trailer field (declared in
/// `Trailer`) went up as it came, past the rewrite, to an upstream that reads trailer
/// fields beside the head's. Other trailer fields still pass.
#[tokio::test]
async fn a_clients_trailers_carry_no_forwarding_or_hop_by_hop_header() {
    // The upstream answers with the request's trailer fields, `name=value;` each.
    let text = trailers_through_proxy(
        |trailers| {
            let mut seen = String::new();
            for (name, value) in trailers.into_iter().flatten() {
                seen.push_str(&format!("{name}={};", value.to_str().unwrap()));
            }
            Response::new(Body::from(seen))
        },
        "POST /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\
         Trailer: x-sum, x-forwarded-for, x-real-ip, forwarded, proxy-authorization\r\n\
         Transfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\nx-sum: 42\r\n\
         x-forwarded-for: 6.6.6.6\r\nx-real-ip: 6.6.6.6\r\nforwarded: for=6.6.6.6\r\n\
         proxy-authorization: Basic cHJveHk6c2VjcmV0\r\n\r\n",
    )
    .await;
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
    assert_eq!(text.matches("\r\n\r\nx-sum=42;").count(), 2, "{text}");
    assert!(!text.contains("6.6.6.6"), "{text}");
    assert!(!text.contains("proxy-authorization"), "{text}");
}

/// Starts an HTTP/1.1 upstream that answers each request with what `answer` makes of
/// its trailer fields, and a proxy in front of it; sends `request` twice on one
/// connection (the pool's request, then its lane's) and returns what came back.
async fn trailers_through_proxy(
    answer: fn(Option<&HeaderMap>) -> Response<Body>,
    request: &str,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service =
                hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| async move {
                    let collected = req.into_body().collect().await?;
                    Ok::<_, hyper::Error>(answer(collected.trailers()))
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    let raw = raw_exchange(
        proxy.addr,
        format!("{request}{request}").as_bytes(),
        HEADER_READ_TIMEOUT * 3,
    )
    .await;
    String::from_utf8_lossy(&raw).into_owned()
}

// ---------------------------------------------------------------------------------
// 12. Host

/// RFC 9112 §3.2: a request with more than one `Host` gets 400. Forwarded with the
/// first, it let a front proxy that reads the last (to route or cache) and the
/// upstream behind rocgate see two different hosts.
#[tokio::test]
async fn a_request_with_two_hosts_gets_400_and_is_not_forwarded() {
    let (upstream, proxy) = forwarding_proxy().await;
    for first in ["", "GET /first HTTP/1.1\r\nHost: a.example\r\n\r\n"] {
        let raw = raw_exchange(
            proxy.addr,
            format!(
                "{first}GET /two HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\
                 Connection: close\r\n\r\n"
            )
            .as_bytes(),
            IO_TIMEOUT,
        )
        .await;
        let text = String::from_utf8_lossy(&raw);
        assert!(text.contains("HTTP/1.1 400 "), "{text}");
        assert!(
            text.ends_with(
                r#"{"error":"bad_request","detail":"two Host fields: a request names one host (RFC 9112 §3.2)"}"#
            ),
            "{text}"
        );
    }
    assert!(
        upstream.seen("/two").is_empty(),
        "{:?}",
        upstream.all_paths()
    );
}

/// Two hosts in one `Host` field, `a.example,b.example`, as a client or a proxy in
/// front writes two `Host` fields merged into one (RFC 9110 §5.3), get 400 like the two
/// fields, and are not forwarded: a front proxy that keeps the first and the upstream
/// that reads the line would see two different hosts. RFC 3986's reg-name takes a comma
/// (a sub-delim), but no host name holds one (RFC 1123); Jetty refuses it, nginx and
/// Envoy pass it on. Refused in HTTP/1.0 and in absolute form too, as two fields are.
#[tokio::test]
async fn a_host_holding_a_comma_gets_400_and_is_not_forwarded() {
    let (upstream, proxy) = forwarding_proxy().await;
    let heads = [
        "GET /merged-0 HTTP/1.1\r\nHost: a.example,b.example",
        "GET /merged-1 HTTP/1.1\r\nHost: a.example, b.example",
        "GET /merged-2 HTTP/1.1\r\nHost: a.example,",
        "GET /merged-3 HTTP/1.0\r\nHost: a.example,a.example",
        "GET http://a.example/merged-4 HTTP/1.1\r\nHost: a.example,b.example",
    ];
    let why = "a Host field holding a comma, as two Host fields merged: a request names one host (RFC 9112 §3.2)";
    each_a_bad_request(proxy.addr, &heads, why).await;
    assert_eq!(upstream.all_paths(), Vec::<String>::new());
}

/// Sends each request head (its `Connection: close` added) on a connection of its own
/// to `addr`, and asserts each gets 400 with `bad_request` and `detail`.
async fn each_a_bad_request(addr: SocketAddr, heads: &[&str], detail: &str) {
    for (n, head) in heads.iter().enumerate() {
        let raw = raw_exchange(
            addr,
            format!("{head}\r\nConnection: close\r\n\r\n").as_bytes(),
            IO_TIMEOUT,
        )
        .await;
        let text = String::from_utf8_lossy(&raw);
        assert!(text.contains(" 400 "), "{n}: {text}");
        let body = format!(r#"{{"error":"bad_request","detail":"{detail}"}}"#);
        assert!(text.ends_with(&body), "{n}: {text}");
    }
}

/// A target whose host holds a comma gets 400 too, and is not forwarded: in absolute
/// form (`GET http://a.example,b.example/`) and in HTTP/2's `:authority`, the target's
/// host is the one sent up as `Host` (RFC 9112 §3.2.2), so the upstream read the comma
/// the `Host` rule refuses, while a proxy in front that routes by `Host` saw another
/// host. Forwarded before, its `Host` `a.example,b.example`.
#[tokio::test]
async fn a_target_whose_host_holds_a_comma_gets_400_and_is_not_forwarded() {
    let (upstream, proxy) = forwarding_proxy().await;
    let why =
        "a target whose host holds a comma, as two hosts: a request names one host (RFC 9112 §3.2)";
    let heads = [
        "GET http://a.example,b.example/comma-0 HTTP/1.1\r\nHost: a.example",
        "GET http://user,x@a.example,b.example:80/comma-1 HTTP/1.1\r\nHost: a.example",
        "GET http://a.example,b.example/comma-2 HTTP/1.0",
    ];
    each_a_bad_request(proxy.addr, &heads, why).await;
    let mut sender = h2c_connect(proxy.addr).await;
    let req = Request::get("http://a.example,b.example/comma-h2")
        .body(Full::<Bytes>::default())
        .unwrap();
    let res = within("h2 response", sender.send_request(req))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // A comma in a target's userinfo is no part of its host: forwarded.
    let raw = raw_exchange(
        proxy.addr,
        b"GET http://user,x@a.example/comma-userinfo HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n",
        IO_TIMEOUT,
    )
    .await;
    assert!(String::from_utf8_lossy(&raw).contains(" 200 "));
    assert_eq!(upstream.all_paths(), ["/comma-userinfo"]);
}

/// A `Host` that is no `host[:port]` (RFC 9110 §7.2) gets 400 (RFC 9112 §3.2: a server
/// MUST; stricter than nginx, which refuses whitespace and a path but takes a `@` and
/// bytes beyond ASCII, and than Envoy, which takes a userinfo in HTTP/1), and is not
/// forwarded: it went up as it came, and into `X-Forwarded-Host`, where an upstream
/// that builds links from it (a password reset's) was told `shop.example@evil.example`,
/// which a browser reads as the host `evil.example`. In absolute form the target names
/// the host and `Host` is ignored (RFC 9112 §3.2.2), whatever it holds, as is an
/// HTTP/2 request's beside its `:authority`; a valid `Host` is forwarded as sent.
#[tokio::test]
async fn a_host_that_names_no_host_gets_400_and_is_not_forwarded() {
    let (upstream, proxy) = forwarding_proxy().await;
    for (n, host) in [
        &b"shop.example@evil.example"[..],
        b"shop.example/evil",
        b"shop example",
        b"shop.example:80x",
        b"[::1",
        b"",
        b"caf\xc3\xa9.example",
    ]
    .into_iter()
    .enumerate()
    {
        let mut request = format!("GET /bad-host-{n} HTTP/1.1\r\nHost: ").into_bytes();
        request.extend_from_slice(host);
        request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
        let raw = raw_exchange(proxy.addr, &request, IO_TIMEOUT).await;
        let text = String::from_utf8_lossy(&raw);
        let host = String::from_utf8_lossy(host);
        assert!(text.starts_with("HTTP/1.1 400 "), "{host:?}: {text}");
        assert!(
            text.ends_with(
                r#"{"error":"bad_request","detail":"a Host field that is no host[:port] (RFC 9112 §3.2)"}"#
            ),
            "{host:?}: {text}"
        );
    }
    assert_eq!(upstream.all_paths(), Vec::<String>::new());
    for (n, host) in [
        "shop.example:8080",
        "Shop.Example.",
        "127.0.0.1",
        "[::1]:8080",
        "xn--caf-dma.example",
        "shop.example:",
        "localhost:65535",
        "shop.example:0",
        "[::1]",
        "[fe80::1%25eth0]:80",
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("/good-host-{n}");
        let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let seen = answered_200(&proxy, &upstream, request.as_bytes(), &path).await;
        assert_eq!(seen.headers[header::HOST], host);
    }
    let seen = answered_200(
        &proxy,
        &upstream,
        b"GET http://shop.example/abs HTTP/1.1\r\nHost: shop.example@evil.example\r\nConnection: close\r\n\r\n",
        "/abs",
    )
    .await;
    assert_eq!(seen.headers[header::HOST], "shop.example");
    // HTTP/2: `:authority` names the host, and a `Host` beside it is not looked at;
    // without `:authority`, `Host` is the request's host, checked as in HTTP/1.1.
    let mut sender = h2c_connect(proxy.addr).await;
    for (target, host, status) in [
        (
            "http://shop.example/h2-authority",
            "shop.example@evil.example",
            200,
        ),
        ("/h2-host", "shop.example:8443", 200),
        ("/h2-bad-host", "shop.example@evil.example", 400),
    ] {
        let req = Request::get(target)
            .header(header::HOST, host)
            .body(Full::default())
            .unwrap();
        let res = within("h2 response", sender.send_request(req))
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), status, "{target} {host}");
    }
    assert_eq!(
        upstream.only("/h2-authority").headers[header::HOST],
        "shop.example"
    );
    assert_eq!(
        upstream.only("/h2-host").headers[header::HOST],
        "shop.example:8443"
    );
    assert!(upstream.seen("/h2-bad-host").is_empty());
}

/// Each forwarded request names this instance in `Via` after the hops before it, by a
/// pseudonym that stays the same across requests.
#[tokio::test]
async fn each_forwarded_request_names_this_instance_in_via() {
    let (upstream, proxy) = forwarding_proxy().await;
    for _ in 0..2 {
        let res = send(proxy.addr, empty(get("/via").header("via", "1.1 cdn-edge"))).await;
        assert_eq!(res.status, StatusCode::OK);
    }
    let seen = upstream.only_n("/via", 2);
    let entries = |s: &Seen| -> Vec<String> {
        let v = s.headers.get_all(header::VIA).iter();
        v.map(|v| v.to_str().unwrap().to_owned()).collect()
    };
    let first = entries(&seen[0]);
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0], "1.1 cdn-edge");
    let ours = first[1]
        .strip_prefix("1.1 rocgate-")
        .unwrap_or_else(|| panic!("{first:?}"));
    assert!(
        ours.len() == 16 && ours.bytes().all(|b| b.is_ascii_hexdigit()),
        "{ours}"
    );
    assert_eq!(entries(&seen[1]), first);
}

/// An upstream that leads back to rocgate itself: the request comes back naming this
/// instance in `Via` and gets 508, where it was forwarded again and again until the
/// response timeout (or the connection limit) ended the storm.
#[tokio::test]
async fn an_upstream_that_leads_back_to_rocgate_gets_508() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut settings = settings(port);
    settings.listen = port;
    settings.max_connections = 64;
    let proxy = start_proxy(settings, Vec::new()).await;
    assert_eq!(proxy.addr, port);
    let res = within("a looped request", send(proxy.addr, empty(get("/loop")))).await;
    assert_eq!(res.status, StatusCode::LOOP_DETECTED, "{:?}", res.body);
    assert_eq!(res.json()["error"], "forwarding_loop");
}

/// Requests refused for their heads alone, with the status each gets, where
/// `max_body_bytes` is 1024: no `Host` in HTTP/1.1, two `Host`s, CONNECT, a declared
/// body of 4096 bytes.
fn refused_for_their_heads() -> [(&'static [u8], u16); 9] {
    [
        // No `Host` in HTTP/1.1, in origin form or in absolute form (RFC 9112 §3.2).
        (b"GET /none HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        (
            b"GET http://shop.example/none HTTP/1.1\r\nConnection: close\r\n\r\n",
            400,
        ),
        // A target in authority form is CONNECT's alone, and in asterisk form
        // OPTIONS's (RFC 9112 §3.2.3, §3.2.4). They used to be forwarded, as `/` with
        // the authority for `Host`, and as `GET *`.
        (
            b"GET shop.example:8080 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            400,
        ),
        (
            b"GET * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            400,
        ),
        // A transfer coding besides chunked (RFC 9112 §6.1: 501). It used to be
        // forwarded with only the chunked coding taken off: the upstream read gzip's
        // bytes as the content itself.
        (
            b"POST /gzip HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            501,
        ),
        (
            b"POST /gzip HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            501,
        ),
        (
            b"GET /two HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nConnection: close\r\n\r\n",
            400,
        ),
        (
            b"CONNECT db.internal:5432 HTTP/1.1\r\nHost: db.internal:5432\r\nConnection: close\r\n\r\n",
            400,
        ),
        (
            b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n",
            413,
        ),
    ]
}

/// A request refused for its head alone (a target in a form its method cannot take, a
/// transfer coding besides chunked, two `Host`s, CONNECT, a declared body over
/// `max_body_bytes`) spends none of its route's tokens: a client cannot drain a route
/// with requests that never reach the upstream. Each is still counted under its route.
/// Sends each of [`refused_for_their_heads`] to `addr`, checking its status, then one
/// good request, which must get 200 and be the only one to reach `upstream`.
async fn refused_then_one_good(addr: SocketAddr, upstream: &Upstream) {
    for (request, status) in refused_for_their_heads() {
        let raw = raw_exchange(addr, request, IO_TIMEOUT).await;
        assert_eq!(
            statuses(&raw),
            [status],
            "{}",
            String::from_utf8_lossy(&raw)
        );
    }
    let raw = raw_exchange(
        addr,
        b"GET /good HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        IO_TIMEOUT,
    )
    .await;
    assert_eq!(statuses(&raw), [200], "{}", String::from_utf8_lossy(&raw));
    assert_eq!(upstream.all_paths(), ["/good"]);
}

#[tokio::test]
async fn a_request_refused_for_its_head_spends_no_token() {
    let upstream = start_upstream().await;
    let mut settings = settings(upstream.addr);
    settings.forward.max_body_bytes = 1024;
    let proxy = start_proxy(settings, vec![trickle_route("one_token", "/", 1)]).await;
    // Each refused, and the route's one token is still there.
    refused_then_one_good(proxy.addr, &upstream).await;
    let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
    let text = String::from_utf8_lossy(&metrics.body);
    for (kind, count) in [
        ("transfer_coding_not_implemented", 2),
        ("bad_request", 6),
        ("body_too_large", 1),
    ] {
        let series =
            format!(r#"rocgate_upstream_errors_total{{route="one_token",kind="{kind}"}} {count}"#);
        assert!(text.lines().any(|l| l == series), "{series}\n{text}");
    }
    // No admission decision was made for them: the good request alone is counted.
    let decisions: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(r#"rocgate_requests_total{route="one_token","#))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert_eq!(
        decisions,
        [r#"rocgate_requests_total{route="one_token",decision="admitted",reason="none"} 1"#]
    );
}

/// A [`Forwarder`](rocgate::proxy::Forwarder) served directly, without `rocgate
/// serve`'s check before admission, refuses the same requests itself.
#[tokio::test]
async fn a_forwarder_served_directly_refuses_what_cannot_be_forwarded() {
    let upstream = start_upstream().await;
    let mut forward = settings(upstream.addr).forward;
    forward.max_body_bytes = 1024;
    let forwarder = rocgate::proxy::Forwarder::new(
        forward,
        Arc::new(rocgate::clock::MonotonicClock::new()),
        Arc::new(std::sync::atomic::AtomicI64::new(0)),
        Arc::new(rocgate::hints::UpstreamMeter::new()),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper_util::service::TowerToHyperService::new(forwarder.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    refused_then_one_good(addr, &upstream).await;
}

// ---------------------------------------------------------------------------------
// 13. An upstream that stalls its body

/// An upstream that answers every request with a head promising 100 bytes, sends 10
/// and then nothing, holding the connection open.
async fn start_stalling_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
                .await;
            held.push(stream);
        }
    });
    addr
}

/// An upstream that sends nothing of its body for `response_timeout` has failed: the
/// client's connection is aborted (its body cut short, as when the upstream closes)
/// and the request's concurrency permit comes back. Without a timeout the permit was
/// held for as long as the upstream connection stayed open, which on a dead host is
/// forever: a few such requests shut a route with the concurrency algorithm.
#[tokio::test]
async fn an_upstream_that_stalls_its_body_is_cut_off_after_the_response_timeout() {
    const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);
    let mut short = settings(start_stalling_upstream().await);
    short.forward.response_timeout = RESPONSE_TIMEOUT;
    let mut route = RouteConfig::new("stalled_body", RouteMatch::prefix("/"));
    route.controller.base_limit_rps = 1.0;
    route.controller.cut_limit_rps = 1.0;
    route.controller.danger_roc = f64::MAX;
    route.algorithm = Algorithm::Concurrency { queue: 0 };
    let proxy = start_proxy(short, vec![route]).await;
    let started = Instant::now();
    let reply = raw_exchange(
        proxy.addr,
        b"GET /a HTTP/1.1\r\nhost: shop.example\r\n\r\n",
        IO_TIMEOUT,
    )
    .await;
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.ends_with("0123456789"), "{reply}");
    assert!(
        started.elapsed() < IO_TIMEOUT - Duration::from_secs(1),
        "the connection was left open"
    );
    // The permit goes with the response body, which the connection's task drops as
    // it closes the connection: soon after the client sees it closed.
    within("the permit back", async {
        while proxy.snapshot("stalled_body").level.value != 0.0 {
            sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let series = r#"rocgate_upstream_errors_total{route="stalled_body",kind="body_aborted"} "#;
    let metrics = send(proxy.admin, empty(admin_get("/metrics"))).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.lines().any(|l| l.strip_prefix(series) == Some("1")),
        "{text}"
    );
}

/// A body that streams slower than `response_timeout` in all, but never pauses that
/// long, arrives whole: the timeout is between two parts.
#[tokio::test]
async fn a_body_streamed_with_pauses_shorter_than_the_response_timeout_arrives_whole() {
    const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = hyper::service::service_fn(|_req| async {
                let (mut tx, body) =
                    http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
                tokio::spawn(async move {
                    for n in 0..15u8 {
                        sleep(Duration::from_millis(100)).await;
                        let _ = tx.send_data(Bytes::from(vec![b'0' + n])).await;
                    }
                });
                Ok::<_, std::convert::Infallible>(Response::new(body))
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    let mut short = settings(upstream);
    short.forward.response_timeout = RESPONSE_TIMEOUT;
    let proxy = start_proxy(short, Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    // The pool's request, then the lane's.
    for _ in 0..2 {
        let res = conn.send(empty(get("/stream"))).await;
        assert_eq!(res.status, StatusCode::OK);
        assert_eq!(res.body, "0123456789:;<=>");
    }
}

// ---------------------------------------------------------------------------------
// 14. Response framing

/// An upstream on a free loopback port that answers every read on a connection with
/// `response`, as written: framings hyper's server would not send.
async fn raw_upstream(response: &'static [u8]) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = [0u8; 4096];
                while matches!(stream.read(&mut head).await, Ok(n) if n > 0) {
                    let _ = stream.write_all(response).await;
                }
            });
        }
    });
    upstream
}

/// RFC 9112 §6.3: `Transfer-Encoding` overrides `Content-Length`, and a proxy MUST
/// remove the `Content-Length` before forwarding. Kept, it framed the client's
/// response: `Content-Length: 3` over a 5-byte chunked body gave the client a
/// complete-looking `hel`.
#[tokio::test]
async fn an_upstream_response_with_both_framings_is_forwarded_by_its_chunks() {
    let upstream = raw_upstream(
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\
          transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    // The pool's request, then the lane's.
    for _ in 0..2 {
        let res = conn.send(empty(get("/both"))).await;
        assert_eq!(res.status, StatusCode::OK);
        assert_eq!(res.body, "hello");
        assert_ne!(
            res.headers
                .get(header::CONTENT_LENGTH)
                .map(|v| v.as_bytes()),
            Some(&b"3"[..]),
            "{:?}",
            res.headers
        );
    }
}

/// An upstream's `Content-Length: 5, 5` (one length repeated, as a proxy that combines
/// field lines writes it) frames its body by that one length (RFC 9112 §6.3, as hyper
/// reads it) and reaches the client as `Content-Length: 5`: the list is no valid
/// `Content-Length` (`1*DIGIT`, RFC 9110 §8.6), which it used to be passed on as, for
/// the client's parser to refuse or read as it may.
#[tokio::test]
async fn an_upstream_length_repeated_in_a_list_reaches_the_client_as_one() {
    let upstream = raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\nhello").await;
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    let mut stream = connect(proxy.addr).await;
    // The pool's request, then the lane's.
    for _ in 0..2 {
        stream
            .write_all(b"GET /listed HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let answer = read_until_seen(&mut stream, "\r\n\r\nhello").await;
        let head = answer.to_ascii_lowercase();
        assert!(head.contains("\r\ncontent-length: 5\r\n"), "{answer}");
        assert_eq!(head.matches("content-length").count(), 1, "{answer}");
    }
}

/// The same list on two field lines (`content-length: 5` twice, RFC 9110 §5.3) reaches
/// an HTTP/2 client as one `content-length`: hyper's HTTP/2 server sends every line,
/// and nghttp2 (curl's) resets a stream with a second one. A HEAD's answer, which hyper
/// frames by no `Content-Length` and so does not check, gets its list's one length, or
/// none where the list holds lengths that differ (no valid `Content-Length` is passed
/// on, RFC 9110 §8.6): `, 5` used to reach the client as an empty `content-length`.
#[tokio::test]
async fn a_length_repeated_on_two_lines_or_listed_in_a_heads_answer_reaches_the_client_as_one() {
    let twice =
        raw_upstream(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\nhello")
            .await;
    let proxy = start_proxy(settings(twice), Vec::new()).await;
    let res = h2c_get(proxy.addr, "/twice").await;
    assert_eq!(res.status(), StatusCode::OK);
    let lengths: Vec<_> = res
        .headers()
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .collect();
    assert_eq!(lengths, ["5"], "{res:?}");
    for (listed, expected) in [(&b", 5"[..], Some("5")), (b"5, 6", None)] {
        let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: ".to_vec();
        answer.extend_from_slice(listed);
        answer.extend_from_slice(b"\r\n\r\n");
        let upstream = raw_upstream(answer.leak()).await;
        let proxy = start_proxy(settings(upstream), Vec::new()).await;
        let raw = raw_exchange(
            proxy.addr,
            b"HEAD /listed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            IO_TIMEOUT,
        )
        .await;
        let head = String::from_utf8_lossy(&raw).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200 ok\r\n"), "{head}");
        let lengths: Vec<_> = head
            .lines()
            .filter_map(|line| line.strip_prefix("content-length:"))
            .map(str::trim)
            .collect();
        assert_eq!(lengths, Vec::from_iter(expected), "{head}");
    }
}

/// An HTTP/2 client's `content-length` on two field lines (the h2 crate takes them,
/// being equal) reaches the upstream as one `Content-Length`: sent on as two lines,
/// an upstream on Node.js (llhttp) refuses a duplicate `Content-Length` whatever it
/// holds. (hyper's HTTP/1 server already keeps one line of an HTTP/1.1 client's.)
#[tokio::test]
async fn an_h2_clients_length_on_two_lines_reaches_the_upstream_as_one() {
    // An upstream that answers with the head of the request it read.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut buf = [0u8; 4096];
                while !read.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&buf[..n]),
                    }
                }
                let end = read.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
                let head = read[..end].to_vec();
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    head.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.write_all(&head).await;
            });
        }
    });
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    let mut sender = h2c_connect(proxy.addr).await;
    let req = Request::post(format!("http://{HOST}/twice"))
        .header(header::CONTENT_LENGTH, "5")
        .header(header::CONTENT_LENGTH, "5")
        .body(Full::new(Bytes::from_static(b"hello")))
        .unwrap();
    let res = within("h2 response", sender.send_request(req))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let head = res.into_body().collect().await.unwrap().to_bytes();
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let lengths: Vec<_> = head
        .lines()
        .filter_map(|line| line.strip_prefix("content-length:"))
        .map(str::trim)
        .collect();
    assert_eq!(lengths, ["5"], "{head}");
}

/// A response body with a transfer coding besides chunked (`gzip, chunked`), which
/// rocgate does not decode, is a 502: it used to go to the client with the chunks
/// taken off and `Transfer-Encoding` dropped, gzip's bytes passed off as the content.
#[tokio::test]
async fn an_upstream_response_with_a_transfer_coding_besides_chunked_is_a_bad_gateway() {
    a_response_so_framed_is_a_bad_gateway(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
}

/// Asserts that an upstream answering `response` gets the client a 502
/// `upstream_error`, on the pool's request and on the lane's.
async fn a_response_so_framed_is_a_bad_gateway(response: &'static [u8]) {
    let upstream = raw_upstream(response).await;
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    let mut conn = Client::connect(proxy.addr).await;
    for _ in 0..2 {
        let res = conn.send(empty(get("/framed"))).await;
        assert_eq!(res.status, StatusCode::BAD_GATEWAY, "{res:?}");
        assert_eq!(res.json()["error"], "upstream_error");
    }
}

/// `chunked` named twice (`chunked, chunked`, or two `Transfer-Encoding` lines) is a
/// coding rocgate does not decode: hyper takes one chunked coding off, and what is under
/// it is still chunked (RFC 9112 §6.1: a sender must not apply it more than once). A
/// request so framed gets 501 and a response so framed is a 502, as `gzip, chunked`
/// are: each went on with one layer taken off, its chunk framing passed off as the
/// content, where nginx refuses any `Transfer-Encoding` but `chunked` itself.
#[tokio::test]
async fn chunked_named_twice_is_a_coding_rocgate_does_not_decode() {
    let (upstream, proxy) = forwarding_proxy().await;
    for request in [
        &b"POST /twice HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\nConnection: close\r\n\r\n\
           f\r\n5\r\nhello\r\n0\r\n\r\n\r\n0\r\n\r\n"[..],
        b"POST /twice HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
           f\r\n5\r\nhello\r\n0\r\n\r\n\r\n0\r\n\r\n",
    ] {
        let raw = raw_exchange(proxy.addr, request, IO_TIMEOUT).await;
        assert_eq!(statuses(&raw), [501], "{}", String::from_utf8_lossy(&raw));
    }
    assert!(
        upstream.all_paths().is_empty(),
        "{:?}",
        upstream.all_paths()
    );
    a_response_so_framed_is_a_bad_gateway(
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, chunked\r\n\r\n\
          f\r\n5\r\nhello\r\n0\r\n\r\n\r\n0\r\n\r\n",
    )
    .await;
}

/// Once `shutdown_grace` is over, `run` drops the connections still open, as its log
/// says: they were left running in the caller's runtime, served and forwarding, after
/// `run` had returned.
#[tokio::test]
async fn connections_still_open_after_the_shutdown_grace_are_dropped() {
    // An upstream streaming a chunk every 50 ms, without end.
    let app = Router::new().fallback(|| async {
        let (mut tx, body) =
            http_body_util::channel::Channel::<Bytes, std::convert::Infallible>::new(1);
        tokio::spawn(async move {
            while tx.send_data(Bytes::from_static(b"s")).await.is_ok() {
                sleep(Duration::from_millis(50)).await;
            }
        });
        Body::new(body)
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let mut short = settings(upstream);
    short.shutdown_grace = Duration::from_millis(300);
    let proxy = start_proxy(short, Vec::new()).await;
    let mut stream = connect(proxy.addr).await;
    stream
        .write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_until_seen(&mut stream, "\r\n\r\n").await;
    within("run() returning", proxy.shut_down())
        .await
        .unwrap()
        .unwrap();
    // Whatever was in flight drains, then the connection ends.
    let (ended, rest) = closed_within(&mut stream, Duration::from_secs(2)).await;
    assert!(
        ended,
        "the connection outlived run(): {} bytes since",
        rest.len()
    );
}

/// A connection that has sent nothing when shutdown begins has no request in flight:
/// it is closed at once. It used to be left waiting for its first byte for
/// `header_read_timeout`, holding the drain (and `run`) that long: a browser's
/// preconnected sockets delayed every exit, and with a `header_read_timeout` past the
/// grace period `run` returned with the connection still open.
#[tokio::test]
async fn a_connection_that_has_sent_nothing_does_not_hold_the_shutdown() {
    let upstream = start_upstream().await;
    let mut patient = settings(upstream.addr);
    patient.header_read_timeout = Duration::from_secs(60);
    patient.shutdown_grace = Duration::from_secs(60);
    let proxy = start_proxy(patient, Vec::new()).await;
    let mut silent = connect(proxy.addr).await;
    // Connections are accepted in the order they were made: once a later one is
    // answered, the silent one is the proxy's.
    let raw = raw_exchange(
        proxy.addr,
        b"GET /after-silent HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        IO_TIMEOUT,
    )
    .await;
    assert_eq!(statuses(&raw), [200]);
    within("run() returning", proxy.shut_down())
        .await
        .unwrap()
        .unwrap();
    let (closed, rest) = closed_within(&mut silent, Duration::from_secs(2)).await;
    assert!(closed && rest.is_empty(), "{rest:?}");
}

/// A keep-alive connection waiting for its next request past `header_read_timeout`
/// (which no longer closes it: that wait is `idle_timeout`'s) has no request in
/// flight: shutdown closes it at once rather than wait out its idle timeout.
#[tokio::test]
async fn an_idle_keep_alive_connection_does_not_hold_the_shutdown() {
    let upstream = start_upstream().await;
    let mut patient = settings(upstream.addr);
    patient.idle_timeout = Duration::from_secs(60);
    patient.shutdown_grace = Duration::from_secs(60);
    let proxy = start_proxy(patient, Vec::new()).await;
    let mut kept = connect(proxy.addr).await;
    kept.write_all(b"GET /kept HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    read_until_seen(&mut kept, "HTTP/1.1 200").await;
    sleep(2 * HEADER_READ_TIMEOUT).await;
    let (closed, _) = closed_within(&mut kept, Duration::from_millis(100)).await;
    assert!(!closed, "closed before shutdown");
    within("run() returning", proxy.shut_down())
        .await
        .unwrap()
        .unwrap();
    let (closed, _) = closed_within(&mut kept, Duration::from_secs(2)).await;
    assert!(closed, "the idle connection outlived run()");
}

// ---------------------------------------------------------------------------------
// 15. Keep-alive after a rejection; HEAD

/// A rejected request's body is never read, and must not be read as the next request:
/// a short body is skipped and the connection goes on, a chunked one (or one the
/// client holds back, `Expect: 100-continue`, no `100 Continue` sent) closes the
/// connection, and the 429 says so.
#[tokio::test]
async fn a_rejected_requests_unread_body_is_not_read_as_the_next_request() {
    let (upstream, proxy) = trickle_proxy("limited", "/limited", 1).await;
    let raw = raw_exchange(
        proxy.addr,
        b"POST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
          POST /limited HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
          GET /after-length HTTP/1.1\r\nHost: x\r\n\r\n\
          POST /limited HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n\
          GET /after-chunked HTTP/1.1\r\nHost: x\r\n\r\n",
        IO_TIMEOUT,
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    let statuses: Vec<&str> = text.split("HTTP/1.1 ").skip(1).map(|r| &r[..3]).collect();
    assert_eq!(statuses, ["200", "429", "200", "429"], "{text}");
    let last = text.rsplit("HTTP/1.1 ").next().unwrap();
    assert!(last.contains("connection: close"), "{text}");
    assert_eq!(upstream.all_paths(), ["/limited", "/after-length"]);
    // Held back: no 100 Continue, and the connection closes after the 429.
    let raw = raw_exchange(
        proxy.addr,
        b"POST /limited HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        IO_TIMEOUT,
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 429 "), "{text}");
    assert!(text.contains("connection: close"), "{text}");
}

/// A HEAD's answer keeps the upstream's `Content-Length` and has no body; the next
/// request on the connection is read right after it.
#[tokio::test]
async fn a_head_answer_keeps_its_content_length_and_has_no_body() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    // One request a read: the proxy sends the next only once
                    // answered.
                    let reply: &[u8] = if buf.starts_with(b"HEAD ") {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n"
                    } else {
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                    };
                    if stream.write_all(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let proxy = start_proxy(settings(upstream), Vec::new()).await;
    // The pool's, the lane's, then a GET on the lane.
    let raw = raw_exchange(
        proxy.addr,
        b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\nHEAD /b HTTP/1.1\r\nHost: x\r\n\r\n\
          GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        IO_TIMEOUT,
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    let answers: Vec<&str> = text.split("HTTP/1.1 ").skip(1).collect();
    assert_eq!(answers.len(), 3, "{text}");
    for head in &answers[..2] {
        assert!(head.contains("content-length: 1234\r\n"), "{text}");
        assert!(
            head.ends_with("\r\n\r\n"),
            "a HEAD answer with a body: {text}"
        );
    }
    assert!(answers[2].ends_with("\r\n\r\nok"), "{text}");
}

/// A leaky-bucket request whose client gives up while it is paced (an HTTP/2 stream
/// reset) gives its place back: the next request is paced into it instead of being
/// refused `queue_full`, and the upstream sees only the requests that stayed.
#[tokio::test]
async fn a_paced_request_whose_client_leaves_gives_its_place_to_the_next() {
    let up = start_upstream().await;
    let mut route = RouteConfig::new("paced", RouteMatch::prefix("/paced"));
    // One request every 4 s, one may wait.
    route.controller.base_limit_rps = 0.25;
    route.controller.cut_limit_rps = 0.25;
    route.controller.danger_roc = f64::MAX;
    route.algorithm = Algorithm::LeakyBucket { queue: 1 };
    let proxy = start_proxy(settings(up.addr), vec![route]).await;
    assert_eq!(
        send(proxy.addr, empty(get("/paced"))).await.status,
        StatusCode::OK
    );

    let mut sender = h2c_connect(proxy.addr).await;
    let paced_since = tokio::time::Instant::now();
    let req = Request::get(format!("http://{HOST}/paced"))
        .body(Full::<Bytes>::default())
        .unwrap();
    // Paced for 4 s: its client gives up after 200 ms (the stream is reset).
    assert!(
        timeout(Duration::from_millis(200), sender.send_request(req))
            .await
            .is_err()
    );

    // Until its departure, the next request finds its place (once the reset is in),
    // where it was refused `queue_full` before.
    let next = loop {
        let reply = send(proxy.addr, empty(get("/paced"))).await;
        if reply.status == StatusCode::OK || paced_since.elapsed() > Duration::from_millis(2_500) {
            break reply;
        }
        assert_eq!(reply.headers["rocgate-reason"], "queue_full");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(next.status, StatusCode::OK, "{:?}", next.headers);
    assert_eq!(
        up.seen("/paced").len(),
        2,
        "the one that left never reached it"
    );
    drop(sender);
    let _ = proxy.shut_down().await;
}

/// `Proxy::bind` says why it started no proxy with a `BindError` to match on, each
/// cause kept as its source, and with the messages `rocgate serve` prints: it returned
/// an `io::Error`, a refused config wrapped in one of kind `InvalidInput`.
#[tokio::test]
async fn bind_errors_name_the_listener_or_the_config_and_keep_their_causes() {
    use rocgate::proxy::BindError;
    use std::error::Error as _;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let upstream = SocketAddr::from(([127, 0, 0, 1], 1));
    let config = Config::new(vec![RouteConfig::new(
        "bind_refused",
        RouteMatch::exact("GET", "/no-request-goes-here"),
    )]);

    let mut proxy_taken = settings(upstream);
    proxy_taken.listen = addr;
    let e = Proxy::bind(proxy_taken, &config, None).await.unwrap_err();
    let BindError::Listen { addr: at, source } = &e else {
        panic!("not the proxy's listener: {e:?}");
    };
    assert_eq!((*at, source.kind()), (addr, io::ErrorKind::AddrInUse));
    assert_eq!(
        e.to_string(),
        format!("cannot listen on {addr} (the proxy): {source}")
    );
    let cause = e.source().and_then(|s| s.downcast_ref::<io::Error>());
    assert_eq!(cause.map(io::Error::kind), Some(io::ErrorKind::AddrInUse));

    let mut admin_taken = settings(upstream);
    admin_taken.admin_listen = addr;
    let e = Proxy::bind(admin_taken, &config, None).await.unwrap_err();
    let BindError::AdminListen { addr: at, source } = &e else {
        panic!("not the admin API's listener: {e:?}");
    };
    assert_eq!((*at, source.kind()), (addr, io::ErrorKind::AddrInUse));
    assert_eq!(
        e.to_string(),
        format!("cannot listen on {addr} (the admin API): {source}")
    );
    assert!(e.source().is_some_and(|s| s.is::<io::Error>()));

    let mut refused = config.clone();
    refused.routes[0].controller.base_limit_rps = 20.0; // the default cut_limit is 60
    let e = Proxy::bind(settings(upstream), &refused, None)
        .await
        .unwrap_err();
    let BindError::Config(config_error) = &e else {
        panic!("not the config: {e:?}");
    };
    let want = "config: routes[0].cut_limit: must be ≤ base_limit (20), got 60";
    assert_eq!(config_error.to_string(), want);
    assert_eq!(e.to_string(), want);
}

/// An upstream failure's cause is the `ProxyError`'s `source()`, so that an error
/// reporter walking the chain sees why the upstream failed (it had no source); its
/// `Display` and `detail()` are unchanged.
#[test]
fn an_upstream_error_is_the_proxy_errors_source() {
    use rocgate::proxy::ProxyError;
    use std::error::Error as _;
    let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "tcp connect error");
    let e = ProxyError::Upstream(Box::new(refused));
    let source = e.source().expect("the upstream's error");
    let io = source
        .downcast_ref::<io::Error>()
        .expect("the io::Error given");
    assert_eq!(io.kind(), io::ErrorKind::ConnectionRefused);
    assert_eq!(e.to_string(), "upstream error: tcp connect error");
    assert_eq!(e.detail(), "upstream error: tcp connect error");
    for other in [ProxyError::ConnectTimeout, ProxyError::BadRequest] {
        assert!(other.source().is_none(), "{other}");
    }
}

/// A request queued for a concurrency permit whose HTTP/1.1 client closes its
/// connection while it waits gives its place in the queue back: the next request is
/// queued in its place, not refused `queue_full`, and is served once the permit is
/// free; the one that left never reaches the upstream.
#[tokio::test]
async fn a_queued_request_whose_client_closes_gives_its_place_back() {
    let held = PermitHeld::start(1).await;
    let (proxy, open, head, hits) = (&held.proxy, held.open, held.head, held.hits);

    // Queued, then its client goes.
    let request = format!("GET /left HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    let mut left = connect(proxy.addr).await;
    left.write_all(request.as_bytes()).await.unwrap();
    sleep(Duration::from_millis(100)).await;
    let full = send(proxy.addr, empty(get("/full"))).await;
    assert_eq!(full.headers["rocgate-reason"], "queue_full", "one waits");
    drop(left);

    // Its place is given back once the proxy sees the close.
    let started = Instant::now();
    let mut next = loop {
        let mut stream = connect(proxy.addr).await;
        let request = format!("GET /next HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buf = [0u8; 1024];
        match timeout(Duration::from_millis(200), stream.read(&mut buf)).await {
            Err(_) => break stream,
            Ok(read) => {
                let answer = String::from_utf8_lossy(&buf[..read.unwrap()]).into_owned();
                assert!(answer.contains("queue_full"), "{answer}");
                assert!(
                    started.elapsed() < Duration::from_secs(3),
                    "the place of a client that left is still taken"
                );
            }
        }
    };
    end_the_first_body(open, head).await;
    let answer = read_until_seen(&mut next, "\r\n\r\nok").await;
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the one that left never reached the upstream"
    );
}
