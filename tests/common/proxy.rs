//! A `rocgate serve` proxy running in a task of the test's runtime, for the files that
//! drive one over sockets (`tests/proxy.rs`, `tests/upgrade.rs`, `tests/lingering.rs`,
//! `tests/upstream_cap.rs`, `tests/hints_serve.rs`), included by path.
#![allow(dead_code)] // each file uses its part

use rocgate::config::{Config, RouteConfig, RouteMatch};
use rocgate::engine::RouteSnapshot;
use rocgate::proxy::{Proxy, ProxySettings, Reloader};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The longest any single exchange may take before the test fails.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The proxies' `header_read_timeout`.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// A proxy running in a task of the test's runtime. Dropping it begins shutdown.
pub(crate) struct RunningProxy {
    pub(crate) addr: SocketAddr,
    /// The admin API.
    pub(crate) admin: SocketAddr,
    /// Gives the engine in force and its clock.
    pub(crate) reloader: Reloader,
    stop: oneshot::Sender<()>,
    run: JoinHandle<io::Result<()>>,
}

impl RunningProxy {
    pub(crate) fn snapshot(&self, route: &str) -> RouteSnapshot {
        let engine = self.reloader.engine();
        let id = engine.route_id(route).unwrap();
        engine
            .route_snapshot(id, self.reloader.clock().now())
            .unwrap()
    }

    /// The route's limiter level: for the concurrency algorithm, requests in flight.
    pub(crate) fn level(&self, route: &str) -> f64 {
        self.snapshot(route).level.value
    }

    /// Triggers the shutdown future; the handle resolves with what `run` returns.
    pub(crate) fn shut_down(self) -> JoinHandle<io::Result<()>> {
        self.stop.send(()).unwrap();
        self.run
    }
}

/// Settings for a proxy in front of `upstream`, with short timeouts, no trusted
/// proxies and a 64 KiB body limit.
pub(crate) fn settings(upstream: SocketAddr) -> ProxySettings {
    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
    {
        let mut built = ProxySettings::from_server(
            &rocgate::config::ServerConfig::default(),
            format!("http://{upstream}").parse().unwrap(),
        );
        built.listen = any_port;
        built.admin_listen = any_port;
        built.header_read_timeout = HEADER_READ_TIMEOUT;
        built.shutdown_grace = Duration::from_secs(5);
        built.forward.connect_timeout = Duration::from_secs(1);
        built.forward.response_timeout = Duration::from_secs(2);
        built.forward.max_body_bytes = 64 * 1024;
        built
    }
}

/// A proxy over `routes`; with none, over one route no request takes (a config needs
/// a route), so that every request is forwarded as it is.
pub(crate) async fn start_proxy(
    settings: ProxySettings,
    mut routes: Vec<RouteConfig>,
) -> RunningProxy {
    if routes.is_empty() {
        routes.push(RouteConfig::new(
            "forward_only",
            RouteMatch::exact("GET", "/no-request-goes-here"),
        ));
    }
    let proxy = Proxy::bind(settings, &Config::new(routes), None)
        .await
        .unwrap();
    run(proxy)
}

/// [`start_proxy`] on `clock`, which the engine, its controllers and the admission
/// layer (the hold of a concurrency permit among them) read.
pub(crate) async fn start_proxy_with_clock(
    settings: ProxySettings,
    routes: Vec<RouteConfig>,
    clock: std::sync::Arc<dyn rocgate::clock::Clock>,
) -> RunningProxy {
    let proxy = Proxy::bind_with_clock(settings, &Config::new(routes), None, clock)
        .await
        .unwrap();
    run(proxy)
}

/// A proxy over the routes of the config file `file`, which `reloader.reload()` reads
/// again.
pub(crate) async fn start_proxy_from(settings: ProxySettings, file: &Path) -> RunningProxy {
    let config = Config::load(file).unwrap();
    let proxy = Proxy::bind(settings, &config, Some(file.to_path_buf()))
        .await
        .unwrap();
    run(proxy)
}

/// `proxy` running in a task of the test's runtime.
fn run(proxy: Proxy) -> RunningProxy {
    let addr = proxy.local_addr().unwrap();
    let admin = proxy.admin_addr().unwrap();
    let reloader = proxy.reloader().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    RunningProxy {
        addr,
        admin,
        reloader,
        stop,
        run,
    }
}

/// A response, body read.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: http::StatusCode,
    pub(crate) headers: http::HeaderMap,
    pub(crate) body: bytes::Bytes,
}

impl Reply {
    /// `res`, its body read to the end.
    pub(crate) async fn read(res: http::Response<hyper::body::Incoming>) -> Reply {
        use http_body_util::BodyExt;
        let (parts, body) = res.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.unwrap().to_bytes(),
        }
    }

    /// The body as JSON; the test fails if it is not JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
}

/// An address on 127.0.0.1 that nothing listens on: a port bound and let go again.
pub(crate) async fn closed_port() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// An upstream that answers every request with a head promising 100 bytes, sends
/// 10 and closes the connection.
pub(crate) async fn start_truncating_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut head = [0u8; 4096];
                let _ = stream.read(&mut head).await;
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
                    .await;
            });
        }
    });
    addr
}

/// What `fut` gives, within [`IO_TIMEOUT`]; else the test fails, naming `what` it was
/// waiting for.
pub(crate) async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(IO_TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {IO_TIMEOUT:?}"))
}

/// A connection to `addr` (the proxy), made within [`IO_TIMEOUT`]; the test fails if
/// it is refused.
pub(crate) async fn connect(addr: SocketAddr) -> TcpStream {
    within("connect", TcpStream::connect(addr)).await.unwrap()
}

/// Reads a request head from `stream` (an upstream's connection), up to its blank line
/// and with whatever came in the same reads after it: `None` if the connection ends or
/// fails first.
pub(crate) async fn read_head(stream: &mut TcpStream) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(head)
}
