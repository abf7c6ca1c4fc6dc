//! `rocgate serve` run as a child process: its log lines read on a thread of their
//! own, the addresses it logs, the child killed when the test is done with it, and
//! requests to it over a connection of their own.
//! Shared by `tests/serve_cli.rs` and `tests/serve_soak.rs`, included by path.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;

/// The value of `key=` in a log line.
pub(crate) fn field(line: &str, key: &str) -> Option<SocketAddr> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.parse().ok())
}

/// `serve`'s log lines, read from `stderr` on a thread of their own.
pub(crate) fn log_lines(
    stderr: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Kills the child it holds when dropped (a test that fails leaves no process behind).
pub(crate) struct Reap(pub(crate) std::process::Child);

impl Reap {
    /// Starts `command` with its stderr piped (`serve`'s log) and its stdout dropped.
    pub(crate) fn spawn(command: &mut std::process::Command) -> Self {
        use std::process::Stdio;
        Reap(
            command
                .stderr(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `req`'s response from `addr`, over a connection of its own.
pub(crate) async fn send<B>(
    addr: SocketAddr,
    req: http::Request<B>,
) -> Result<http::Response<hyper::body::Incoming>, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// A response's status and its body as text.
pub(crate) async fn status_and_text(
    res: http::Response<hyper::body::Incoming>,
) -> Result<(u16, String), String> {
    use http_body_util::BodyExt as _;
    let status = res.status().as_u16();
    let body = res
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
