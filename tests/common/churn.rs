//! Churn for soaking `rocgate serve`: an upstream with slow, streaming, upload and
//! WebSocket paths, and clients that come and go the ways real ones do (well-behaved
//! keep-alive and h2c clients, and clients that vanish mid-head, mid-upload, while
//! queued, mid-response, with a reset, or leave a WebSocket without closing it).
//! Shared by `examples/soak_peer.rs` (which `scripts/soak-serve.sh` drives) and
//! `tests/serve_soak.rs`, included by path.

use axum::body::{Body, Bytes};
use axum::extract::ws::{Message as WsMessage, WebSocket, WebSocketUpgrade};
use axum::routing::{get, post};
use axum::Router;
use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{sleep, timeout, Instant};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// How long the upstream's `…/slow` takes to answer.
pub(crate) const SLOW: Duration = Duration::from_millis(300);
/// The chunks `…/drip` sends, [`DRIP_PAUSE`] apart.
pub(crate) const DRIPS: u32 = 10;
/// The pause between two chunks of `…/drip`.
pub(crate) const DRIP_PAUSE: Duration = Duration::from_millis(100);
/// The longest any one client action may take; past it the action is dropped (its
/// sockets closed), which is one more way for a client to vanish.
const ACTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Distinct `x-api-key` values the clients draw from.
pub(crate) const KEYS: u64 = 5_000;

/// The route prefixes of a soak config, each a path prefix of one route (see
/// `scripts/soak-serve.sh` and `tests/serve_soak.rs`).
pub(crate) mod prefix {
    /// A token bucket that admits nearly everything.
    pub(crate) const BUCKET: &str = "/tb";
    /// Partitioned by `x-api-key`.
    pub(crate) const KEYED: &str = "/keys";
    /// The `concurrency` algorithm with a queue.
    pub(crate) const CONCURRENCY: &str = "/conc";
    /// A leaky bucket with a queue.
    pub(crate) const LEAKY: &str = "/leaky";
    /// A token bucket that refuses most requests (lingering closes of uploads).
    pub(crate) const TIGHT: &str = "/tight";
    /// WebSockets, on a `concurrency` route of their own.
    pub(crate) const SOCKETS: &str = "/ws";
}

/// The upstream: `/{p}/slow` answers after [`SLOW`], `/{p}/drip` streams [`DRIPS`]
/// chunks [`DRIP_PAUSE`] apart, `POST /{p}/upload` reads its body and answers its
/// length, `/{p}/ws` echoes WebSocket messages, anything else answers `ok`.
pub(crate) fn upstream_app() -> Router {
    Router::new()
        .route(
            "/{p}/slow",
            get(|| async {
                sleep(SLOW).await;
                "slow"
            }),
        )
        .route("/{p}/drip", get(|| async { drip() }))
        .route(
            "/{p}/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .route(
            "/{p}/ws",
            get(|ws: WebSocketUpgrade| async move { ws.on_upgrade(echo) }),
        )
        .fallback(|| async { "ok" })
}

/// Serves [`upstream_app`] on 127.0.0.1, a port the OS picks, in a task of the
/// current runtime.
#[allow(dead_code)] // examples/soak_peer.rs serves `upstream_app` on the address it is given
pub(crate) async fn start_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, upstream_app()).await });
    addr
}

fn drip() -> Body {
    let chunks = futures_util::stream::unfold(0u32, |sent| async move {
        if sent == DRIPS {
            return None;
        }
        if sent > 0 {
            sleep(DRIP_PAUSE).await;
        }
        Some((Ok::<_, Infallible>(Bytes::from_static(b"drip\n")), sent + 1))
    });
    Body::from_stream(chunks)
}

async fn echo(mut socket: WebSocket) {
    while let Some(Ok(message)) = socket.next().await {
        match message {
            WsMessage::Text(_) | WsMessage::Binary(_) => {
                if socket.send(message).await.is_err() {
                    return;
                }
            }
            WsMessage::Close(_) => return,
            WsMessage::Ping(_) | WsMessage::Pong(_) => {}
        }
    }
}

/// What a churning client does on one turn, each on connections of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Action {
    /// A keep-alive connection sending a few requests to the routes, read whole.
    Requests,
    /// A few requests over h2c, read whole, on one connection.
    H2Requests,
    /// Part of a request head, then the connection closed.
    AbortHead,
    /// An upload's head and a part of its body, then the connection closed.
    AbortUpload,
    /// A request to the concurrency route's slow path, closed before its answer
    /// (while queued or while in flight).
    AbortWaiting,
    /// The same, closed with a reset (`SO_LINGER` 0).
    ResetWaiting,
    /// A streamed answer from the concurrency or leaky route, the connection closed
    /// after its first bytes.
    AbortResponse,
    /// h2c streams to the concurrency route's streamed path, the connection dropped
    /// once their heads are in.
    H2AbortResponse,
    /// An upload to the tight route sent whole, then its answer read (most are
    /// refused: a lingering close).
    RefusedUpload,
    /// An upload to the tight route that stops halfway and waits, then closes.
    StalledUpload,
    /// A WebSocket: a message echoed, then closed.
    WebSocket,
    /// A WebSocket: a message sent, then the socket dropped without a close.
    WebSocketDropped,
}

impl Action {
    /// Every action, in the order a client's turns cycle through them.
    pub(crate) const ALL: [Action; 12] = [
        Action::Requests,
        Action::AbortWaiting,
        Action::AbortHead,
        Action::AbortResponse,
        Action::H2Requests,
        Action::ResetWaiting,
        Action::AbortUpload,
        Action::WebSocket,
        Action::RefusedUpload,
        Action::H2AbortResponse,
        Action::StalledUpload,
        Action::WebSocketDropped,
    ];
}

/// What the clients did: per action, turns that ran to their end and turns that met an
/// error or the action timeout (both expected, of clients that misbehave).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) done: BTreeMap<Action, (u64, u64)>,
}

impl Tally {
    fn add(&mut self, action: Action, ok: bool) {
        let entry = self.done.entry(action).or_default();
        if ok {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }

    fn merge(&mut self, other: Tally) {
        for (action, (ok, failed)) in other.done {
            let entry = self.done.entry(action).or_default();
            entry.0 += ok;
            entry.1 += failed;
        }
    }

    /// Turns taken in all.
    pub(crate) fn turns(&self) -> u64 {
        self.done.values().map(|(ok, failed)| ok + failed).sum()
    }
}

/// A small deterministic generator (splitmix64), one per client.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Runs `clients` clients against the proxy at `proxy` until `until`, each cycling
/// through [`Action::ALL`] from its own offset; returns what they did.
pub(crate) async fn churn(proxy: SocketAddr, clients: usize, until: Instant) -> Tally {
    let tasks: Vec<_> = (0..clients)
        .map(|client| {
            tokio::spawn(async move {
                let mut draw = Draw(client as u64);
                let mut tally = Tally::default();
                let mut turn = client;
                while Instant::now() < until {
                    let action = Action::ALL[turn % Action::ALL.len()];
                    turn += 1;
                    let ok = matches!(
                        timeout(ACTION_TIMEOUT, act(proxy, action, &mut draw)).await,
                        Ok(Ok(()))
                    );
                    tally.add(action, ok);
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        if let Ok(part) = task.await {
            tally.merge(part);
        }
    }
    tally
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

async fn act(proxy: SocketAddr, action: Action, draw: &mut Draw) -> Result<(), Failure> {
    use prefix::*;
    match action {
        Action::Requests => {
            let stream = TcpStream::connect(proxy).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            for _ in 0..4 {
                let path = match draw.below(5) {
                    0 => format!("{BUCKET}/"),
                    1 => format!("{KEYED}/item"),
                    2 => format!("{CONCURRENCY}/slow"),
                    3 => format!("{LEAKY}/"),
                    _ => "/other".to_owned(),
                };
                let req = http::Request::get(path)
                    .header("host", "soak")
                    .header("x-api-key", draw.below(KEYS).to_string())
                    .body(Empty::<Bytes>::new())?;
                let res = sender.send_request(req).await?;
                res.into_body().collect().await?;
            }
            Ok(())
        }
        Action::H2Requests | Action::H2AbortResponse => {
            let stream = TcpStream::connect(proxy).await?;
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await?;
            let conn = tokio::spawn(conn);
            let path = if action == Action::H2Requests {
                format!("{BUCKET}/")
            } else {
                format!("{CONCURRENCY}/drip")
            };
            let streams: Vec<_> = (0..3)
                .map(|_| {
                    let mut sender = sender.clone();
                    let req = http::Request::get(format!("http://soak{path}"))
                        .body(Empty::<Bytes>::new());
                    tokio::spawn(async move {
                        let res = sender.send_request(req?).await?;
                        if action == Action::H2Requests {
                            res.into_body().collect().await?;
                        }
                        Ok::<(), Failure>(())
                    })
                })
                .collect();
            for stream in streams {
                stream.await??;
            }
            conn.abort();
            Ok(())
        }
        Action::AbortHead => {
            let mut stream = TcpStream::connect(proxy).await?;
            stream
                .write_all(format!("GET {BUCKET}/ HTTP/1.1\r\nhost: soak\r\n").as_bytes())
                .await?;
            sleep(Duration::from_millis(draw.below(50))).await;
            Ok(())
        }
        Action::AbortUpload => {
            let mut stream = TcpStream::connect(proxy).await?;
            stream
                .write_all(
                    format!(
                        "POST {BUCKET}/upload HTTP/1.1\r\nhost: soak\r\ncontent-length: 100000\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await?;
            stream.write_all(&[b'u'; 1000]).await?;
            sleep(Duration::from_millis(draw.below(100))).await;
            Ok(())
        }
        Action::AbortWaiting | Action::ResetWaiting => {
            let mut stream = TcpStream::connect(proxy).await?;
            stream
                .write_all(
                    format!("GET {CONCURRENCY}/slow HTTP/1.1\r\nhost: soak\r\n\r\n").as_bytes(),
                )
                .await?;
            sleep(Duration::from_millis(draw.below(SLOW.as_millis() as u64))).await;
            if action == Action::ResetWaiting {
                stream.set_zero_linger()?;
            }
            Ok(())
        }
        Action::AbortResponse => {
            let path = if draw.below(2) == 0 {
                CONCURRENCY
            } else {
                LEAKY
            };
            let mut stream = TcpStream::connect(proxy).await?;
            stream
                .write_all(
                    format!("GET {path}/drip HTTP/1.1\r\nhost: soak\r\nconnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await?;
            let mut buf = [0u8; 4096];
            let mut read = 0;
            while !buf[..read].windows(5).any(|w| w == b"drip\n") && read < buf.len() {
                let n = stream.read(&mut buf[read..]).await?;
                if n == 0 {
                    // refused or queued out: the whole answer came and the connection ended
                    return Ok(());
                }
                read += n;
            }
            if draw.below(2) == 0 {
                stream.set_zero_linger()?;
            }
            Ok(())
        }
        Action::RefusedUpload | Action::StalledUpload => {
            const LENGTH: usize = 200_000;
            let mut stream = TcpStream::connect(proxy).await?;
            stream
                .write_all(
                    format!(
                        "POST {TIGHT}/upload HTTP/1.1\r\nhost: soak\r\nconnection: close\r\ncontent-length: {LENGTH}\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await?;
            let sent = if action == Action::RefusedUpload {
                LENGTH
            } else {
                LENGTH / 2
            };
            stream.write_all(&vec![b'u'; sent]).await?;
            let mut answer = Vec::new();
            if action == Action::RefusedUpload {
                stream.read_to_end(&mut answer).await?;
            } else {
                let mut buf = [0u8; 1024];
                let _ = timeout(Duration::from_millis(200), stream.read(&mut buf)).await;
                sleep(Duration::from_millis(500 + draw.below(1000))).await;
            }
            Ok(())
        }
        Action::WebSocket | Action::WebSocketDropped => {
            let stream = TcpStream::connect(proxy).await?;
            let req = format!("ws://{proxy}{SOCKETS}/ws").into_client_request()?;
            let (mut ws, _) = tokio_tungstenite::client_async(req, stream).await?;
            ws.send(Message::text("soak")).await?;
            if action == Action::WebSocket {
                ws.next().await.ok_or("the echo")??;
                ws.close(None).await?;
            }
            Ok(())
        }
    }
}
