//! `rocgate serve` end to end, in process: HTTP/1.1 bytes to the proxy (on
//! 127.0.0.1), which forwards to a stub upstream (on 127.0.0.1) that records what it
//! receives. Covers the request-head checks (`refusal`: CONNECT, a target in a form its
//! method cannot take, two `Host`s or none in HTTP/1.1, a `Host` that is no
//! `host[:port]`, a transfer coding besides chunked, body size), hop-by-hop stripping (the fixed list and every header named in
//! `Connection`), `Host`, `TE`/`Trailer`, and the forwarding headers, from a trusted
//! peer and from an untrusted one.
//!
//! Input: either a request (method, target, header lines, body) written as HTTP/1.1,
//! or raw bytes. Invariants: no panic in the proxy; a complete request head (as
//! httparse, hyper's parser, reads it) always gets a response; a request that reaches
//! the upstream carries no hop-by-hop header (`Transfer-Encoding: chunked` aside, the
//! framing of this hop, and `TE: trailers`), no header the client named in
//! `Connection` (but those the proxy sets itself), exactly one `Host`, a target in
//! origin form, and forwarding headers from the proxy alone unless the peer is trusted.
//! An HTTP/1.1 upgrade request (`Connection` naming `upgrade`, an `Upgrade` not offering
//! `h2c`) keeps its `Upgrade`, with `Connection: upgrade` alone.
#![no_main]

use arbitrary::Arbitrary;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use rocgate::config::Config;
use rocgate::http::ClientIpResolver;
use rocgate::proxy::{Proxy, ProxySettings};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the upstream received: the target and the header lines.
static RECEIVED: Mutex<Vec<(String, HeaderMap)>> = Mutex::new(Vec::new());

struct World {
    runtime: tokio::runtime::Runtime,
    /// A proxy that trusts 127.0.0.0/8 (its peer, the fuzzer), and one that trusts none.
    trusting: SocketAddr,
    untrusting: SocketAddr,
}

async fn upstream(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let target = req.uri().to_string();
    RECEIVED
        .lock()
        .unwrap()
        .push((target, req.headers().clone()));
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

async fn start_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(upstream)),
            );
        }
    });
    addr
}

async fn start_proxy(upstream: SocketAddr, trusted: &str) -> SocketAddr {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = {
        let mut built = ProxySettings::from_server(
            &rocgate::config::ServerConfig::default(),
            format!("http://{upstream}").parse().unwrap(),
        );
        built.listen = any;
        built.admin_listen = any;
        built.header_read_timeout = Duration::from_millis(500);
        built.shutdown_grace = Duration::from_secs(1);
        built.max_connections = 1000;
        built.idle_timeout = Duration::from_secs(5);
        built.admin_token = None;
        built.forward.connect_timeout = Duration::from_secs(1);
        built.forward.response_timeout = Duration::from_millis(500);
        built.forward.max_body_bytes = 1024;
        built.forward.max_upstream_lanes = 64;
        built.forward.upstream_idle_timeout = Duration::from_secs(4);
        built.forward.resolver =
            ClientIpResolver::new(trusted.split(',').filter_map(|n| n.parse().ok()).collect());
        built
    };
    let config = Config::from_toml_str(
        "[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nmode = \"shadow\"\n",
        "fuzz",
    )
    .unwrap();
    let proxy = Proxy::bind(settings, &config, None).await.unwrap();
    let addr = proxy.local_addr().unwrap();
    tokio::spawn(proxy.run(std::future::pending()));
    addr
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (trusting, untrusting) = runtime.block_on(async {
            let up = start_upstream().await;
            (
                start_proxy(up, "127.0.0.0/8").await,
                start_proxy(up, "").await,
            )
        });
        World {
            runtime,
            trusting,
            untrusting,
        }
    })
}

#[derive(Arbitrary, Debug)]
enum Name {
    Known(u8),
    Other(Vec<u8>),
}

const NAMES: [&str; 24] = [
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "content-length",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
    "x-real-ip",
    "x-forwarded-port",
    "x-forwarded-ssl",
    "expect",
    "x-custom",
    "Connection",
    "HOST",
    "cookie",
    "content-type",
];

#[derive(Arbitrary, Debug)]
struct Structured {
    method: u8,
    target: Vec<u8>,
    version: u8,
    headers: Vec<(Name, Vec<u8>)>,
    body: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Structured { trusted: bool, req: Structured },
    Raw { trusted: bool, bytes: Vec<u8> },
}

const METHODS: [&str; 7] = ["GET", "POST", "PUT", "CONNECT", "OPTIONS", "HEAD", "DELETE"];

fn write(req: &Structured) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(METHODS[usize::from(req.method) % METHODS.len()].as_bytes());
    out.push(b' ');
    if req.target.is_empty() {
        out.push(b'/');
    }
    out.extend_from_slice(&req.target);
    out.extend_from_slice(if req.version & 1 == 0 {
        b" HTTP/1.1\r\n"
    } else {
        b" HTTP/1.0\r\n"
    });
    for (name, value) in &req.headers {
        match name {
            Name::Known(i) => {
                out.extend_from_slice(NAMES[usize::from(*i) % NAMES.len()].as_bytes())
            }
            Name::Other(n) => out.extend_from_slice(n),
        }
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&req.body);
    out
}

/// A request's header lines as sent: lowercase names and values.
type Lines = Vec<(String, Vec<u8>)>;

/// The head as httparse reads it: header names and values, and its length; `None`
/// unless complete and valid.
fn parse_head(bytes: &[u8]) -> Option<(Lines, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(len)) => Some((
            req.headers
                .iter()
                .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
                .collect(),
            len,
        )),
        _ => None,
    }
}

/// Reads until a final (non-1xx) response head has come, or `deadline` passes.
async fn response_head(stream: &mut TcpStream, deadline: Duration) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut res = httparse::Response::new(&mut headers);
            let mut start = 0;
            // Skip interim responses (100 Continue).
            while let Ok(httparse::Status::Complete(len)) = res.parse(&buf[start..]) {
                if res.code.is_some_and(|c| c >= 200) {
                    return Some(buf[start..start + len].to_vec());
                }
                start += len;
                headers = [httparse::EMPTY_HEADER; 64];
                res = httparse::Response::new(&mut headers);
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(deadline, read).await.ok().flatten()
}

const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
];

/// Names the proxy sets itself (or the upstream connection's framing), whatever the
/// client's `Connection` listed.
const SET_BY_PROXY: [&str; 7] = [
    "host",
    "te",
    "transfer-encoding",
    "content-length",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
];

/// The tokens of the client's `Connection` lines, lowercase.
fn connection_tokens(sent: &[(String, Vec<u8>)]) -> impl Iterator<Item = String> + '_ {
    sent.iter()
        .filter(|(n, _)| n == "connection")
        .flat_map(|(_, v)| v.split(|&b| b == b','))
        .map(|n| String::from_utf8_lossy(n.trim_ascii()).to_ascii_lowercase())
}

/// Whether the upstream got an upgrade request, checked: `Connection: upgrade` alone,
/// for a client that named `upgrade` in its own, with an `Upgrade` offering no `h2c`.
fn upgraded(got: &HeaderMap, sent: &[(String, Vec<u8>)]) -> bool {
    let connection: Vec<_> = got.get_all("connection").iter().collect();
    if connection.is_empty() {
        return false;
    }
    assert_eq!(connection, ["upgrade"], "Connection forwarded: {got:?}");
    assert!(
        connection_tokens(sent).any(|t| t == "upgrade"),
        "an upgrade the client did not ask for: sent {sent:?}, got {got:?}"
    );
    let offered: Vec<_> = got.get_all("upgrade").iter().collect();
    assert!(
        !offered.is_empty(),
        "Connection: upgrade without Upgrade: {got:?}"
    );
    for v in offered {
        assert!(
            !v.as_bytes()
                .split(|&b| b == b',')
                .any(|p| p.trim_ascii().eq_ignore_ascii_case(b"h2c")),
            "h2c upgrade forwarded: {got:?}"
        );
    }
    true
}

fn check(target: &str, got: &HeaderMap, sent: &[(String, Vec<u8>)], trusted: bool) {
    assert!(
        target.starts_with('/') || target == "*",
        "the upstream got the target {target:?}"
    );
    // An upgrade keeps `Upgrade`, with `Connection: upgrade`.
    let upgraded = upgraded(got, sent);
    for name in HOP_BY_HOP {
        if upgraded && (name == "connection" || name == "upgrade") {
            continue;
        }
        assert!(!got.contains_key(name), "{name} forwarded: {got:?}");
    }
    for te in got.get_all("te") {
        assert_eq!(te, "trailers", "TE forwarded: {got:?}");
    }
    for te in got.get_all("transfer-encoding") {
        assert_eq!(te, "chunked", "Transfer-Encoding forwarded: {got:?}");
    }
    assert_eq!(got.get_all("host").iter().count(), 1, "Host: {got:?}");
    for name in connection_tokens(sent) {
        if upgraded && (name == "connection" || name == "upgrade") {
            continue;
        }
        if !name.is_empty() && !SET_BY_PROXY.contains(&name.as_str()) {
            assert!(
                !got.contains_key(name.as_str()),
                "{name} is named in Connection but forwarded: sent {sent:?}, got {got:?}"
            );
        }
    }
    if !trusted {
        assert_eq!(
            got.get_all("x-forwarded-for").iter().collect::<Vec<_>>(),
            ["127.0.0.1"]
        );
        assert_eq!(
            got.get_all("x-forwarded-proto").iter().collect::<Vec<_>>(),
            ["http"]
        );
        for name in [
            "forwarded",
            "x-real-ip",
            "x-forwarded-port",
            "x-forwarded-ssl",
        ] {
            assert!(
                !got.contains_key(name),
                "{name} from an untrusted peer: {got:?}"
            );
        }
    } else {
        let xff: Vec<_> = got.get_all("x-forwarded-for").iter().collect();
        assert_eq!(xff.len(), 1, "{got:?}");
        let xff = xff[0].as_bytes();
        assert!(
            xff == b"127.0.0.1" || xff.ends_with(b", 127.0.0.1"),
            "X-Forwarded-For {xff:?}"
        );
    }
}

fuzz_target!(|input: Input| {
    let w = world();
    let (trusted, bytes) = match input {
        Input::Structured { trusted, req } => (trusted, write(&req)),
        Input::Raw { trusted, bytes } => (trusted, bytes),
    };
    let mut bytes = bytes;
    let head = parse_head(&bytes);
    // A body shorter than its Content-Length would wait for the response timeout:
    // completed, to keep the runs fast.
    if let Some((headers, len)) = &head {
        let declared = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
        if let Some(declared) = declared.filter(|&d| d <= 4096) {
            bytes.resize(bytes.len().max(len + declared), b'x');
        }
    }
    let addr = if trusted { w.trusting } else { w.untrusting };
    RECEIVED.lock().unwrap().clear();
    let response = w.runtime.block_on(async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(&bytes).await.ok()?;
        if head.is_none() {
            // An incomplete head would wait for the header read timeout: the client
            // stops sending instead.
            stream.shutdown().await.ok()?;
        }
        response_head(&mut stream, Duration::from_secs(3)).await
    });
    let Some((sent, _)) = head else {
        return;
    };
    // A complete head always gets an answer (a body the client never finishes gets 408).
    assert!(
        response.is_some(),
        "no response to a complete head: {:?}",
        String::from_utf8_lossy(&bytes)
    );
    let received = std::mem::take(&mut *RECEIVED.lock().unwrap());
    if let Some((target, got)) = received.first() {
        check(target, got, &sent, trusted);
    }
});
