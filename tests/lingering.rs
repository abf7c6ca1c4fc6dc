//! A client that is refused while it sends its body sees the refusal: `rocgate serve`
//! answers some requests without reading their body (429, 413, 503...), and then
//! closes the connection as a lingering close, so that the unread body does not turn
//! the close into a reset that takes the answer with it. Also `Expect: 100-continue`,
//! refused and admitted.
//!
//! Raw HTTP/1.1 clients over real sockets on 127.0.0.1. Each test starts its own
//! upstream and proxy on ports the OS picks; every wait is bounded by a timeout.
#![cfg(feature = "proxy")]

#[path = "common/proxy.rs"]
mod running;

use axum::body::Body;
use axum::extract::State;
use axum::Router;
use http::{Request, Response};
use http_body_util::BodyExt;
use rocgate::config::{RouteConfig, RouteMatch};
use rocgate::limiter::Algorithm;
use rocgate::proxy::ProxySettings;
use running::{settings, start_proxy, within, RunningProxy, IO_TIMEOUT};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout};

/// The body the uploading clients send: far more than the sockets' buffers hold, so
/// that most of it is still to be sent when the answer comes.
const UPLOAD: usize = 4 << 20;
/// The proxies' `max_body_bytes`: the upload is within it.
const MAX_BODY: u64 = 8 << 20;

/// What the upstream saw of a request.
#[derive(Clone, Debug)]
struct Seen {
    path: String,
    expect: Option<String>,
    body_len: usize,
}

/// An upstream that reads each request's body whole and answers with its length.
#[derive(Clone, Default)]
struct Upstream {
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    async fn start(&self) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(record).with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn record(State(up): State<Upstream>, req: Request<Body>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let body_len = body.collect().await.map_or(0, |b| b.to_bytes().len());
    up.seen.lock().unwrap().push(Seen {
        path: parts.uri.path().to_owned(),
        expect: parts
            .headers
            .get(http::header::EXPECT)
            .map(|v| v.to_str().unwrap().to_owned()),
        body_len,
    });
    Response::new(Body::from(body_len.to_string()))
}

/// A route on the paths under `prefix` whose bucket holds one token and
/// (practically) never refills: its second request gets 429.
fn one_token_route(name: &str, prefix: &str) -> RouteConfig {
    let rps = 1.0 / 1024.0;
    let mut r = RouteConfig::new(name, RouteMatch::prefix(prefix));
    r.controller.base_limit_rps = rps;
    r.controller.cut_limit_rps = rps;
    r.controller.danger_roc = f64::MAX;
    r.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(1024),
    };
    r
}

/// A proxy in front of `upstream` over `routes`, with a body limit of [`MAX_BODY`].
async fn proxy(upstream: SocketAddr, routes: Vec<RouteConfig>) -> RunningProxy {
    proxy_with(upstream, routes, |_| {}).await
}

/// [`proxy`], its settings changed by `change`.
async fn proxy_with(
    upstream: SocketAddr,
    routes: Vec<RouteConfig>,
    change: impl FnOnce(&mut ProxySettings),
) -> RunningProxy {
    let mut settings = settings(upstream);
    settings.forward.max_body_bytes = MAX_BODY;
    change(&mut settings);
    start_proxy(settings, routes).await
}

/// A head for a request with a body of `len` bytes, with `extra` header lines.
fn head(method: &str, path: &str, len: usize, extra: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: shop.example\r\ncontent-length: {len}\r\n{extra}\r\n"
    )
}

/// Writes `len` bytes of body, in 64 KiB writes.
async fn write_body(write: &mut OwnedWriteHalf, len: usize) -> io::Result<()> {
    let chunk = vec![b'x'; 64 * 1024];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        write.write_all(&chunk[..n]).await?;
        left -= n;
    }
    Ok(())
}

/// Reads until one whole response has come (`what` names it in a failure): the bytes
/// read, which may run past it.
async fn read_response(read: &mut OwnedReadHalf, what: &str) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    within(what, async {
        while parse(&raw).is_none() {
            let n = read.read(&mut buf).await.unwrap();
            assert_ne!(n, 0, "closed before {what} was whole");
            raw.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    raw
}

/// Reads until the peer closes; what was read, and the error that ended it if one did.
async fn read_to_close(read: &mut OwnedReadHalf) -> (Vec<u8>, Option<io::Error>) {
    let mut received = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match read.read(&mut buf).await {
            Ok(0) => return (received, None),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) => return (received, Some(e)),
        }
    }
}

/// A complete HTTP/1.1 response, parsed from the start of a byte stream.
#[derive(Debug)]
struct Parsed {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// How many bytes of the stream it took.
    len: usize,
}

impl Parsed {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// The first response in `raw`, interim (1xx) ones included, if `raw` holds it whole:
/// its head, and a body of its `Content-Length`.
fn parse(raw: &[u8]) -> Option<Parsed> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_len) = response.parse(raw).ok()? else {
        return None;
    };
    let headers: Vec<(String, String)> = response
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    let status = response.code?;
    let body_len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.parse().unwrap());
    let body = raw.get(head_len..head_len + body_len)?.to_vec();
    Some(Parsed {
        status,
        headers,
        body,
        len: head_len + body_len,
    })
}

/// Every complete response in `raw`, in order.
fn parse_all(mut raw: &[u8]) -> Vec<Parsed> {
    let mut all = Vec::new();
    while let Some(parsed) = parse(raw) {
        raw = &raw[parsed.len..];
        all.push(parsed);
    }
    all
}

/// An upstream and a proxy in front of it (`change` applied to its settings) whose
/// route `name` on `path` has its one token spent: its next request is refused.
async fn refusing(
    name: &str,
    path: &str,
    change: impl FnOnce(&mut ProxySettings),
) -> (Upstream, RunningProxy) {
    let upstream = Upstream::default();
    let proxy = proxy_with(
        upstream.start().await,
        vec![one_token_route(name, path)],
        change,
    )
    .await;
    spend_token(&proxy, path).await;
    (upstream, proxy)
}

/// A connection to `addr`, split.
async fn connect(addr: SocketAddr) -> (OwnedReadHalf, OwnedWriteHalf) {
    TcpStream::connect(addr).await.unwrap().into_split()
}

/// Spends the one token of the route at `path`.
async fn spend_token(proxy: &RunningProxy, path: &str) {
    let (mut read, mut write) = connect(proxy.addr).await;
    let request = format!("GET {path} HTTP/1.1\r\nhost: shop.example\r\nconnection: close\r\n\r\n");
    write.write_all(request.as_bytes()).await.unwrap();
    let (raw, _) = within("the admitted GET", read_to_close(&mut read)).await;
    assert_eq!(parse(&raw).map(|r| r.status), Some(200));
}

/// A client as curl or a script sends an upload: the head, the whole body, and only
/// then does it read. What the writes came to, and what it read.
async fn upload_then_read(addr: SocketAddr, head: &str, len: usize) -> (io::Result<()>, Vec<u8>) {
    let (mut read, mut write) = connect(addr).await;
    let written = within("the upload", async {
        write.write_all(head.as_bytes()).await?;
        write_body(&mut write, len).await
    })
    .await;
    let (raw, _) = within("the answer", read_to_close(&mut read)).await;
    drop(write);
    (written, raw)
}

/// Asserts that `raw` holds a complete 429 with `Retry-After`, and nothing else.
fn assert_whole_429(raw: &[u8]) {
    let all = parse_all(raw);
    assert_eq!(
        all.iter().map(|r| r.status).collect::<Vec<_>>(),
        [429],
        "{}",
        String::from_utf8_lossy(raw)
    );
    let retry = all[0].header("retry-after").expect("a Retry-After");
    assert!(retry.parse::<u64>().unwrap() >= 1, "{retry}");
    let body = String::from_utf8_lossy(&all[0].body);
    assert!(body.contains("rate_limited"), "{body}");
}

/// A client that sends its whole upload before it reads, refused with 429 from the
/// head: rocgate used to close the connection with most of the body unread, the
/// kernel answered the rest with a reset, and the client's writes failed ("connection
/// reset by peer", or a broken pipe) before it ever read the 429.
#[tokio::test]
async fn a_client_that_uploads_before_it_reads_gets_the_429() {
    let (upstream, proxy) = refusing("linger_upload", "/upload", |_| {}).await;
    let (written, raw) =
        upload_then_read(proxy.addr, &head("POST", "/upload", UPLOAD, ""), UPLOAD).await;
    written.expect("the whole body is taken");
    assert_whole_429(&raw);
    // The connection is not kept: its body is not read through (what admission before
    // the body saves), and the 429 says so.
    assert_eq!(parse(&raw).unwrap().header("connection"), Some("close"));
    assert!(upstream
        .seen()
        .iter()
        .all(|s| s.path == "/upload" && s.body_len == 0));
}

/// The same for a body over `max_body_bytes`, refused with 413 from its head.
#[tokio::test]
async fn a_client_that_uploads_too_much_before_it_reads_gets_the_413() {
    let upstream = Upstream::default();
    let mut settings = settings(upstream.start().await);
    settings.forward.max_body_bytes = 1 << 20;
    let proxy = start_proxy(settings, Vec::new()).await;
    let (written, raw) =
        upload_then_read(proxy.addr, &head("POST", "/big", UPLOAD, ""), UPLOAD).await;
    written.expect("the whole body is taken");
    let all = parse_all(&raw);
    assert_eq!(
        all.iter().map(|r| r.status).collect::<Vec<_>>(),
        [413],
        "{}",
        String::from_utf8_lossy(&raw)
    );
    assert!(upstream.seen().is_empty());
}

/// Sends the head of a POST of [`UPLOAD`] bytes to `/upload` on a connection of its
/// own, and reads that connection to its close in a task ([`read_to_close`]): the write
/// half, for the body, and the reading task.
async fn upload_head_reading(
    addr: SocketAddr,
) -> (
    OwnedWriteHalf,
    tokio::task::JoinHandle<(Vec<u8>, Option<io::Error>)>,
) {
    let (mut read, mut write) = connect(addr).await;
    write
        .write_all(head("POST", "/upload", UPLOAD, "").as_bytes())
        .await
        .unwrap();
    let reader = tokio::spawn(async move { read_to_close(&mut read).await });
    (write, reader)
}

/// A client that reads while it writes, and keeps writing after the answer has come:
/// it reads the whole 429, then the connection's end as an end, not a reset.
#[tokio::test]
async fn a_client_that_keeps_writing_after_the_429_reads_it_and_a_clean_close() {
    let (_, proxy) = refusing("linger_keep_writing", "/upload", |_| {}).await;
    let (mut write, reader) = upload_head_reading(proxy.addr).await;
    let written = within("the upload", write_body(&mut write, UPLOAD)).await;
    let (raw, error) = within("the answer", reader).await.unwrap();
    written.expect("the whole body is taken");
    assert_whole_429(&raw);
    assert!(error.is_none(), "the connection ended with {error:?}");
}

/// A refused request whose small body came whole with its head: hyper reads it past,
/// and the connection goes on to the next request (as nginx discards a body it does
/// not need and keeps the connection).
#[tokio::test]
async fn a_refused_request_with_a_small_body_keeps_its_connection() {
    let (_, proxy) = refusing("linger_small", "/small", |_| {}).await;
    let (mut read, mut write) = connect(proxy.addr).await;
    let mut two = head("POST", "/small", 5, "");
    two.push_str("hello");
    two.push_str("GET /other HTTP/1.1\r\nhost: shop.example\r\nconnection: close\r\n\r\n");
    write.write_all(two.as_bytes()).await.unwrap();
    let (raw, error) = within("the answers", read_to_close(&mut read)).await;
    assert!(error.is_none(), "the connection ended with {error:?}");
    let all = parse_all(&raw);
    assert_eq!(all.iter().map(|r| r.status).collect::<Vec<_>>(), [429, 200]);
}

/// Sends a refused upload's head and `sent` bytes of its body, reads the whole 429,
/// and leaves the connection open, sending nothing more: the proxy lingers on it.
async fn refused_then_silent(addr: SocketAddr, sent: usize) -> (OwnedReadHalf, OwnedWriteHalf) {
    let (mut read, mut write) = connect(addr).await;
    write
        .write_all(head("POST", "/upload", UPLOAD, "").as_bytes())
        .await
        .unwrap();
    write_body(&mut write, sent).await.unwrap();
    let raw = read_response(&mut read, "the 429").await;
    assert_whole_429(&raw);
    (read, write)
}

/// Sends a GET on a new connection and reads its answer's status, `None` if none
/// comes within `wait`.
async fn get_within(addr: SocketAddr, wait: Duration) -> Option<u16> {
    let answered = async {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        let request = "GET /other HTTP/1.1\r\nhost: shop.example\r\nconnection: close\r\n\r\n";
        write.write_all(request.as_bytes()).await.unwrap();
        let (raw, _) = read_to_close(&mut read).await;
        parse(&raw).map(|r| r.status)
    };
    timeout(wait, answered).await.ok().flatten()
}

/// A proxy with `max_connections = 1`, `lingering_time` 60 s and `lingering_timeout`,
/// whose route `name` on `/upload` is [`refusing`], and its one connection (kept
/// open): [`refused_then_silent`] after 64 KiB of the body.
async fn lingering_at_a_cap_of_one(
    name: &str,
    lingering_timeout: Duration,
) -> (RunningProxy, (OwnedReadHalf, OwnedWriteHalf)) {
    let (_, proxy) = refusing(name, "/upload", |s| {
        s.max_connections = 1;
        s.lingering_time = Duration::from_secs(60);
        s.lingering_timeout = lingering_timeout;
    })
    .await;
    let held = refused_then_silent(proxy.addr, 64 * 1024).await;
    (proxy, held)
}

/// A lingering connection holds its place under `max_connections` (it is an open
/// socket), until the client closes its side: the connection beyond the cap waits.
#[tokio::test]
async fn a_lingering_connection_counts_against_max_connections_until_the_client_closes() {
    let (proxy, (mut read, mut write)) =
        lingering_at_a_cap_of_one("linger_cap", Duration::from_secs(60)).await;
    assert_eq!(
        get_within(proxy.addr, Duration::from_millis(300)).await,
        None,
        "answered beside a lingering connection at a cap of one"
    );
    // The client has read its answer and closes: the lingering close is over.
    write.shutdown().await.unwrap();
    let (rest, error) = within("the proxy's close", read_to_close(&mut read)).await;
    assert!(rest.is_empty() && error.is_none(), "{rest:?} {error:?}");
    assert_eq!(get_within(proxy.addr, IO_TIMEOUT).await, Some(200));
}

/// A client that sends nothing more for `lingering_timeout` is closed, though
/// `lingering_time` is far off: the connection beyond a cap of one is then served.
#[tokio::test]
async fn a_lingering_connection_silent_for_lingering_timeout_is_closed() {
    let (proxy, _held) =
        lingering_at_a_cap_of_one("linger_silent", Duration::from_millis(300)).await;
    assert_eq!(get_within(proxy.addr, IO_TIMEOUT).await, Some(200));
}

/// A client that never stops sending is closed after `lingering_time`: its writes
/// fail long before its body is through.
#[tokio::test]
async fn a_client_that_keeps_sending_is_closed_after_lingering_time() {
    let (_, proxy) = refusing("linger_time", "/upload", |s| {
        s.lingering_time = Duration::from_millis(500);
        s.lingering_timeout = Duration::from_secs(60);
    })
    .await;
    let (mut write, reader) = upload_head_reading(proxy.addr).await;
    // 64 KiB every 40 ms: the 4 MiB would take 2.5 s, five lingering times.
    let written = within("the paced upload", async {
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..UPLOAD / chunk.len() {
            write.write_all(&chunk).await?;
            sleep(Duration::from_millis(40)).await;
        }
        io::Result::Ok(())
    })
    .await;
    let (raw, _) = within("the answer", reader).await.unwrap();
    assert_whole_429(&raw);
    assert!(written.is_err(), "the whole body was taken");
}

/// A lingering close reads at most `lingering_bytes`: a client that sends more sees
/// its writes fail.
#[tokio::test]
async fn a_lingering_close_reads_at_most_lingering_bytes() {
    let upstream = Upstream::default();
    let proxy = proxy_with(upstream.start().await, Vec::new(), |s| {
        s.lingering_bytes = 1 << 20;
    })
    .await;
    // 32 MiB, far over what the sockets' buffers hold, over `max_body_bytes`: 413.
    let len = 32 << 20;
    let (written, raw) = upload_then_read(proxy.addr, &head("POST", "/big", len, ""), len).await;
    assert!(written.is_err(), "the whole body was taken");
    assert_eq!(parse(&raw).map(|r| r.status), Some(413));
}

/// Shutdown does not wait for a lingering connection: it is closed as shutdown
/// begins, and `run` returns long before `shutdown_grace`.
#[tokio::test]
async fn shutdown_closes_a_lingering_connection_at_once() {
    let (_, proxy) = refusing("linger_shutdown", "/upload", |s| {
        s.lingering_time = Duration::from_secs(60);
        s.lingering_timeout = Duration::from_secs(60);
        s.shutdown_grace = Duration::from_secs(30);
    })
    .await;
    let (mut read, _write) = refused_then_silent(proxy.addr, 64 * 1024).await;
    let run = proxy.shut_down();
    within("shutdown", run).await.unwrap().unwrap();
    let (rest, _) = within("the proxy's close", read_to_close(&mut read)).await;
    assert!(rest.is_empty(), "{rest:?}");
}

/// A refused request with `Expect: 100-continue` gets its 429 at once, with no
/// `100 Continue` before it, and without sending its body.
#[tokio::test]
async fn a_refused_request_expecting_100_continue_gets_the_429_alone() {
    let (upstream, proxy) = refusing("linger_expect", "/upload", |_| {}).await;
    let (mut read, mut write) = connect(proxy.addr).await;
    let head = head("POST", "/upload", UPLOAD, "expect: 100-continue\r\n");
    write.write_all(head.as_bytes()).await.unwrap();
    // The client sends nothing more: it waits for the 100, and reads the 429 instead.
    let (raw, error) = within("the 429, and the close", read_to_close(&mut read)).await;
    assert!(error.is_none(), "{error:?}");
    assert_whole_429(&raw);
    assert!(upstream.seen().iter().all(|s| s.body_len == 0));
}

/// An admitted request with `Expect: 100-continue` gets one `100 Continue` (rocgate's,
/// once admitted; the upstream is not asked for another: `Expect` is not forwarded),
/// then sends its body, which reaches the upstream whole.
#[tokio::test]
async fn an_admitted_request_expecting_100_continue_gets_one_100_and_its_body_through() {
    let upstream = Upstream::default();
    let proxy = proxy(upstream.start().await, Vec::new()).await;
    let (mut read, mut write) = connect(proxy.addr).await;
    let len = 1 << 20;
    let head = head(
        "POST",
        "/expecting",
        len,
        "expect: 100-continue\r\nconnection: close\r\n",
    );
    write.write_all(head.as_bytes()).await.unwrap();
    let mut raw = read_response(&mut read, "the 100").await;
    assert_eq!(parse(&raw).map(|r| r.status), Some(100));
    within("the body", write_body(&mut write, len))
        .await
        .unwrap();
    let (rest, error) = within("the answer", read_to_close(&mut read)).await;
    assert!(error.is_none(), "{error:?}");
    raw.extend_from_slice(&rest);
    let all = parse_all(&raw);
    assert_eq!(
        all.iter().map(|r| r.status).collect::<Vec<_>>(),
        [100, 200],
        "{}",
        String::from_utf8_lossy(&raw)
    );
    assert_eq!(all[1].body, len.to_string().as_bytes());
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body_len, len);
    assert_eq!(seen[0].expect, None, "Expect was forwarded");
}

/// Over h2c a refused upload is a stream: its 429 comes, the stream is reset once the
/// answer is out (`NO_ERROR`: stop sending), and the connection goes on.
#[tokio::test]
async fn a_refused_h2c_upload_gets_its_429_and_the_connection_goes_on() {
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let (_, proxy) = refusing("linger_h2", "/upload", |_| {}).await;
    let stream = TcpStream::connect(proxy.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let upload = Request::post("http://shop.example/upload")
        .body(Full::new(bytes::Bytes::from(vec![b'x'; UPLOAD])))
        .unwrap();
    let refused = within("the 429", sender.send_request(upload))
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body = within("the 429's body", refused.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("rate_limited"));
    let next = Request::post("http://shop.example/other")
        .body(Full::new(bytes::Bytes::from_static(b"12345")))
        .unwrap();
    let next = within("the next answer", sender.send_request(next))
        .await
        .unwrap();
    assert_eq!(next.status(), 200);
    let body = within("its body", next.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], b"5");
    conn.abort();
}

/// A head hyper cannot parse gets its 400 from hyper, which closes the connection
/// with what follows unread: a client that sends its body before it reads gets the
/// 400 too (the bytes waiting when the connection ends call for a lingering close).
#[tokio::test]
async fn a_client_whose_head_is_malformed_reads_the_400_after_its_upload() {
    let upstream = Upstream::default();
    let proxy = proxy(upstream.start().await, Vec::new()).await;
    let head = head(
        "POST",
        "/upload",
        UPLOAD,
        "a header line without a colon\r\n",
    );
    let (written, raw) = upload_then_read(proxy.addr, &head, UPLOAD).await;
    written.expect("the whole body is taken");
    assert_eq!(
        parse(&raw).map(|r| r.status),
        Some(400),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    assert!(upstream.seen().is_empty());
}

/// A value of the proxy's `/metrics`: the sample of `series` (a name with its labels,
/// as exposed), 0 if the series is absent.
async fn metric(admin: SocketAddr, series: &str) -> f64 {
    let (mut read, mut write) = connect(admin).await;
    let request = "GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n";
    write.write_all(request.as_bytes()).await.unwrap();
    let (raw, _) = within("the scrape", read_to_close(&mut read)).await;
    let scrape = parse(&raw).expect("a whole answer to the scrape");
    assert_eq!(scrape.status, 200);
    String::from_utf8_lossy(&scrape.body)
        .lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().unwrap())
        })
        .unwrap_or(0.0)
}

/// Polls the proxy's `/metrics` until `series` reads `value` (failing after
/// [`IO_TIMEOUT`] with what it read last).
async fn metric_reaches(admin: SocketAddr, series: &str, value: f64) {
    let mut last = f64::NAN;
    let reached = timeout(IO_TIMEOUT, async {
        loop {
            last = metric(admin, series).await;
            if last == value {
                return;
            }
            sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(reached.is_ok(), "{series} read {last}, not {value}");
}

/// Sends a KiB more of a refused body every 100 ms, so that the lingering close on it
/// never waits `lingering_timeout`, until `/metrics` shows one connection lingering.
async fn trickle_until_lingering(admin: SocketAddr, write: &mut OwnedWriteHalf) {
    for _ in 0..15 {
        write.write_all(&[b'x'; 1024]).await.unwrap();
        if metric(admin, "rocgate_lingering_connections").await == 1.0 {
            return;
        }
        sleep(Duration::from_millis(100)).await;
    }
    panic!("no connection lingering while the client trickled");
}

/// The series of lingering closes that ended `ended`.
fn closes(ended: &str) -> String {
    format!("rocgate_lingering_closes_total{{ended=\"{ended}\"}}")
}

/// `/metrics` shows the connections lingering now, and each lingering close by how it
/// ended: the client closing its side, silent for `lingering_timeout`, sending for
/// `lingering_time`, sending more than `lingering_bytes`, and shutdown. (The one test of this file
/// that reads `/metrics`: the proxies of the others, in the same process, set none of
/// these series.)
#[tokio::test]
async fn lingering_closes_are_counted_by_how_they_ended() {
    let lingering = "rocgate_lingering_connections";
    let (_, proxy) = refusing("linger_metrics", "/upload", |s| {
        s.lingering_time = Duration::from_secs(2);
        s.lingering_timeout = Duration::from_millis(500);
        s.lingering_bytes = 1 << 20;
    })
    .await;
    let admin = proxy.admin;
    for ended in [
        "client_closed",
        "lingering_timeout",
        "lingering_time",
        "lingering_bytes",
        "shutdown",
    ] {
        assert_eq!(metric(admin, &closes(ended)).await, 0.0, "{ended}");
    }
    assert_eq!(metric(admin, lingering).await, 0.0);

    // A client that trickles a little more of its body is lingered on, until it closes.
    let (mut read, mut write) = refused_then_silent(proxy.addr, 64 * 1024).await;
    trickle_until_lingering(admin, &mut write).await;
    write.shutdown().await.unwrap();
    within("the proxy's close", read_to_close(&mut read)).await;
    metric_reaches(admin, &closes("client_closed"), 1.0).await;
    metric_reaches(admin, lingering, 0.0).await;

    // Silent for `lingering_timeout`.
    let (mut read, _write) = refused_then_silent(proxy.addr, 64 * 1024).await;
    within("the proxy's close", read_to_close(&mut read)).await;
    metric_reaches(admin, &closes("lingering_timeout"), 1.0).await;

    // 16 KiB every 100 ms, far under `lingering_bytes` and never silent for
    // `lingering_timeout`, until `lingering_time` closes the connection.
    let (mut read, mut write) = refused_then_silent(proxy.addr, 64 * 1024).await;
    let reader = tokio::spawn(async move { read_to_close(&mut read).await });
    let written = within("the paced body", async {
        for _ in 0..40 {
            write.write_all(&[b'x'; 16 * 1024]).await?;
            sleep(Duration::from_millis(100)).await;
        }
        io::Result::Ok(())
    })
    .await;
    assert!(written.is_err(), "the connection was kept for 4 s");
    within("the proxy's close", reader).await.unwrap();
    metric_reaches(admin, &closes("lingering_time"), 1.0).await;

    // 32 MiB, far over `lingering_bytes`.
    let len = 32 << 20;
    let (written, raw) = upload_then_read(proxy.addr, &head("POST", "/upload", len, ""), len).await;
    assert!(written.is_err(), "the whole body was taken");
    assert_eq!(parse(&raw).map(|r| r.status), Some(413));
    metric_reaches(admin, &closes("lingering_bytes"), 1.0).await;

    // Each close was counted once, under its own end.
    for ended in [
        "client_closed",
        "lingering_timeout",
        "lingering_time",
        "lingering_bytes",
    ] {
        assert_eq!(metric(admin, &closes(ended)).await, 1.0, "{ended}");
    }
    assert_eq!(metric(admin, &closes("shutdown")).await, 0.0);
    metric_reaches(admin, lingering, 0.0).await;

    // Shutdown ends a lingering close at once; an upload in progress (its body to
    // come) keeps the proxy, and its admin API, up through the grace period.
    let (_uploading, mut upload) = connect(proxy.addr).await;
    upload
        .write_all(head("POST", "/other", 1024, "").as_bytes())
        .await
        .unwrap();
    upload.write_all(b"begun").await.unwrap();
    metric_reaches(admin, "rocgate_in_flight_requests", 1.0).await;
    let (_read, mut lingerer) = refused_then_silent(proxy.addr, 64 * 1024).await;
    trickle_until_lingering(admin, &mut lingerer).await;
    let run = proxy.shut_down();
    metric_reaches(admin, &closes("shutdown"), 1.0).await;
    metric_reaches(admin, lingering, 0.0).await;
    drop((_uploading, upload));
    within("shutdown", run).await.unwrap().unwrap();
}
