//! An HTTP/1.1 client connection over a real socket, for the files that send requests
//! to a server on 127.0.0.1 (`tests/layer.rs`, `tests/metrics.rs`, `tests/proxy.rs`,
//! `tests/redis_store.rs`, `tests/upstream_cap.rs`), included by path.

use hyper::client::conn::http1::SendRequest;
use std::net::SocketAddr;

/// Opens a connection to `addr` and hands it to hyper, the connection driven by a task
/// of its own; returns the sender of its requests.
pub(crate) async fn connect<B>(addr: SocketAddr) -> SendRequest<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}
