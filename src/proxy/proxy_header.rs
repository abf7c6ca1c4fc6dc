//! The PROXY protocol header (`[server] proxy_protocol`) that an L4 load balancer
//! (HAProxy in TCP mode, AWS NLB, GCP's TCP load balancer) sends at the start of a
//! connection to name its client, which then is the connection's peer.
//!
//! The header is read before any HTTP, within bounds of bytes (a text header's 107, a
//! binary one's 16 and the length it states) and of time (the caller's), and no
//! further than its last byte: what follows it stays in the socket, for HTTP. The
//! bytes read are parsed by the `ppp` crate. A header that names no client (a text
//! `PROXY UNKNOWN`, a binary `LOCAL`: the load balancer's health checks, or a family
//! other than TCP over IPv4 or IPv6) leaves the socket's peer the connection's, but
//! not as a proxy: what it sends is its relayed client's, as that client wrote it, and
//! the forwarding headers in it are not read (an L4 load balancer writes none). A
//! connection closed, or silent through the time given, before its first byte is
//! refused as empty, apart from one whose header was begun: a health check that
//! connects and closes, or a balancer that sends its header only with its client's
//! first bytes, is no fault of the balancer's.

use crate::config::ProxyProtocol;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpStream;

/// The longest text (version 1) header, its CRLF included.
const V1_MAX: usize = 107;
/// The binary (version 2) header's fixed part: its signature, version and command,
/// family and protocol, and the length of what follows.
const V2_FIXED: usize = 16;
/// How a binary (version 2) header begins.
const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// Why a connection's header was not taken: the connection is closed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer closed (or reset) its side, or the time given ran out, before it sent
    /// a byte: a balancer's health check that connects and closes, or one that sends
    /// its header only with its client's first bytes, which never came.
    Empty,
    /// The peer closed (or reset) its side before its header was whole.
    Closed,
    /// Not a header of a version taken, or one that does not parse.
    Invalid(String),
    /// Not whole within the time given.
    Timeout,
}

impl Refusal {
    /// The refusal's `reason` label of `rocgate_proxy_protocol_refused_total`, if it
    /// is counted (one closed mid-header is not).
    pub(crate) fn reason(&self) -> Option<&'static str> {
        match self {
            Refusal::Empty => Some("empty"),
            Refusal::Closed => None,
            Refusal::Invalid(_) => Some("invalid"),
            Refusal::Timeout => Some("timeout"),
        }
    }

    /// Whether the refusal is warned of: not an empty connection, which says nothing
    /// wrong of the peer (it connected and sent nothing).
    pub(crate) fn warns(&self) -> bool {
        !matches!(self, Refusal::Empty)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Empty => f.write_str("closed or timed out before it sent a byte"),
            Refusal::Closed => f.write_str("closed before its PROXY protocol header was whole"),
            Refusal::Invalid(why) => write!(f, "invalid PROXY protocol header: {why}"),
            Refusal::Timeout => {
                f.write_str("no whole PROXY protocol header within header_read_timeout")
            }
        }
    }
}

/// Reads the header of a version `taken` that `stream` begins with, within `timeout`;
/// returns the client it names, `None` for a header that names none. A connection
/// closed, or silent through `timeout`, before its first byte is
/// [`Empty`](Refusal::Empty), not [`Closed`](Refusal::Closed) or
/// [`Timeout`](Refusal::Timeout).
pub(crate) async fn client_of(
    stream: &TcpStream,
    taken: ProxyProtocol,
    timeout: Duration,
) -> Result<Option<SocketAddr>, Refusal> {
    // One timer for the whole header: whether a byte came says which refusal its end is.
    let begun = AtomicBool::new(false);
    let header = async {
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(n) if n > 0 => begun.store(true, Ordering::Relaxed),
            _ => return Err(Refusal::Empty),
        }
        read(stream, taken, first[0]).await
    };
    match tokio::time::timeout(timeout, header).await {
        Ok(named) => named,
        Err(_) if begun.load(Ordering::Relaxed) => Err(Refusal::Timeout),
        Err(_) => Err(Refusal::Empty),
    }
}

/// The header that begins with `first` (peeked, still in the socket).
async fn read(
    stream: &TcpStream,
    taken: ProxyProtocol,
    first: u8,
) -> Result<Option<SocketAddr>, Refusal> {
    match first {
        b'\r' if taken.takes_v2() => v2(stream).await,
        b'P' if taken.takes_v1() => v1(stream).await,
        _ => Err(Refusal::Invalid(format!(
            "the connection does not begin with a header of proxy_protocol {:?}",
            taken.as_str()
        ))),
    }
}

/// A text header: read up to its line feed, at most [`V1_MAX`] bytes.
async fn v1(stream: &TcpStream) -> Result<Option<SocketAddr>, Refusal> {
    let mut header = [0u8; V1_MAX];
    let mut len = 0;
    loop {
        let n = stream
            .peek(&mut header[len..])
            .await
            .map_err(|_| Refusal::Closed)?;
        if n == 0 {
            return Err(Refusal::Closed);
        }
        // What comes before the line feed is header: taken from the socket as it comes,
        // so that the next peek waits for more.
        let end = match header[len..len + n].iter().position(|&b| b == b'\n') {
            Some(at) => len + at + 1,
            None => len + n,
        };
        read_exact(stream, &mut header[len..end]).await?;
        len = end;
        if header[len - 1] == b'\n' {
            break;
        }
        if len == V1_MAX {
            return Err(Refusal::Invalid(format!(
                "a version 1 header longer than {V1_MAX} bytes"
            )));
        }
    }
    let parsed =
        ppp::v1::Header::try_from(&header[..len]).map_err(|e| Refusal::Invalid(e.to_string()))?;
    Ok(match parsed.addresses {
        ppp::v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        ppp::v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        ppp::v1::Addresses::Unknown => None,
    })
}

/// A binary header: its fixed part, then the length it states.
async fn v2(stream: &TcpStream) -> Result<Option<SocketAddr>, Refusal> {
    let mut fixed = [0u8; V2_FIXED];
    read_exact(stream, &mut fixed).await?;
    if fixed[..V2_SIGNATURE.len()] != V2_SIGNATURE[..] {
        return Err(Refusal::Invalid("not a version 2 signature".to_owned()));
    }
    let rest = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let mut header = vec![0u8; V2_FIXED + rest];
    header[..V2_FIXED].copy_from_slice(&fixed);
    read_exact(stream, &mut header[V2_FIXED..]).await?;
    let parsed =
        ppp::v2::Header::try_from(&header[..]).map_err(|e| Refusal::Invalid(e.to_string()))?;
    // Only TCP (`\x11`, `\x21`) names this connection's client: a receiver falls back
    // to the connection's endpoints for the others it does not serve (UDP, or a family
    // with no protocol), as for `LOCAL` (HAProxy's proxy-protocol.txt, 2.2).
    use ppp::v2::{Addresses, Command, Protocol};
    Ok(match (parsed.command, parsed.protocol, parsed.addresses) {
        (Command::Proxy, Protocol::Stream, Addresses::IPv4(a)) => {
            Some(SocketAddr::from((a.source_address, a.source_port)))
        }
        (Command::Proxy, Protocol::Stream, Addresses::IPv6(a)) => {
            Some(SocketAddr::from((a.source_address, a.source_port)))
        }
        _ => None,
    })
}

/// Fills `buf` from `stream`, reading no further.
async fn read_exact(stream: &TcpStream, mut buf: &mut [u8]) -> Result<(), Refusal> {
    while !buf.is_empty() {
        stream.readable().await.map_err(|_| Refusal::Closed)?;
        match stream.try_read(buf) {
            Ok(0) => return Err(Refusal::Closed),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(Refusal::Closed),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{client_of, Refusal};
    use crate::config::ProxyProtocol;
    use std::net::SocketAddr;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// The client named by what a client sends in `writes` (flushed one by one, a
    /// pause between them), under `taken` (`None` if none); and what the connection
    /// then has to read.
    async fn header_of(
        writes: &[&[u8]],
        taken: ProxyProtocol,
    ) -> (Result<Option<SocketAddr>, Refusal>, Vec<u8>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        // Each write its own segment: no coalescing of a test's byte-at-a-time writes.
        client.set_nodelay(true).unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let writes: Vec<Vec<u8>> = writes.iter().map(|w| w.to_vec()).collect();
        let sending = tokio::spawn(async move {
            for w in writes {
                client.write_all(&w).await.unwrap();
                client.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            client.shutdown().await.unwrap();
            client
        });
        let named = client_of(&server, taken, Duration::from_secs(10)).await;
        let _client = sending.await.unwrap();
        let mut rest = Vec::new();
        let mut server = server;
        if named.is_ok() {
            server.read_to_end(&mut rest).await.unwrap();
        }
        (named, rest)
    }

    /// A binary header: `command` (0x20 LOCAL, 0x21 PROXY), `family` and its addresses.
    fn v2(command: u8, family: u8, addresses: &[u8]) -> Vec<u8> {
        let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        h.push(command);
        h.push(family);
        h.extend_from_slice(&u16::try_from(addresses.len()).unwrap().to_be_bytes());
        h.extend_from_slice(addresses);
        h
    }

    #[tokio::test]
    async fn a_text_header_split_over_writes_names_the_client_and_leaves_what_follows() {
        let (named, rest) = header_of(
            &[
                b"PROX",
                b"Y TCP4 203.0.113.7 10.0.0.1 5123",
                b" 80\r",
                b"\nGET / HTTP/1.1\r\n",
            ],
            ProxyProtocol::V1,
        )
        .await;
        assert_eq!(named, Ok(Some("203.0.113.7:5123".parse().unwrap())));
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn a_binary_header_names_an_ipv6_client_and_leaves_what_follows() {
        let mut addresses = Vec::new();
        addresses.extend_from_slice(
            &"2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        addresses.extend_from_slice(
            &"2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        addresses.extend_from_slice(&443u16.to_be_bytes());
        addresses.extend_from_slice(&80u16.to_be_bytes());
        let mut sent = v2(0x21, 0x21, &addresses);
        sent.extend_from_slice(b"PRI * HTTP/2.0");
        let (named, rest) = header_of(&[&sent], ProxyProtocol::Any).await;
        assert_eq!(named, Ok(Some("[2001:db8::7]:443".parse().unwrap())));
        assert_eq!(rest, b"PRI * HTTP/2.0");
    }

    /// A peer that sends its header a byte at a time has it read whole, and no byte
    /// past it: a text one through its line feed, a binary one through its length.
    #[tokio::test]
    async fn a_header_sent_a_byte_at_a_time_is_read_to_its_end_and_no_further() {
        let text = b"PROXY TCP4 203.0.113.7 10.0.0.1 5123 80\r\nGET".as_slice();
        let binary = [
            v2(
                0x21,
                0x11,
                &[198, 51, 100, 9, 10, 0, 0, 1, 0x14, 0x03, 0, 80],
            ),
            b"GET".to_vec(),
        ]
        .concat();
        for (sent, client) in [
            (text, "203.0.113.7:5123"),
            (&binary[..], "198.51.100.9:5123"),
        ] {
            let bytes: Vec<&[u8]> = sent.chunks(1).collect();
            let (named, rest) = header_of(&bytes, ProxyProtocol::Any).await;
            assert_eq!(named, Ok(Some(client.parse().unwrap())));
            assert_eq!(rest, b"GET");
        }
    }

    /// A text header of the longest form (107 bytes, `UNKNOWN` with two IPv6
    /// addresses of 39 characters) is taken; one byte more is refused.
    #[tokio::test]
    async fn a_text_header_of_107_bytes_is_taken_and_one_of_108_refused() {
        let full = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
        let longest = format!("PROXY UNKNOWN {full} {full} 65535 65535\r\n");
        assert_eq!(longest.len(), 107);
        let (named, rest) =
            header_of(&[format!("{longest}GET").as_bytes()], ProxyProtocol::V1).await;
        assert_eq!(named, Ok(None));
        assert_eq!(rest, b"GET");
        let over = format!("PROXY UNKNOWN {full} {full} 65535 655350\r\n");
        let (named, _) = header_of(&[over.as_bytes()], ProxyProtocol::V1).await;
        assert!(matches!(named, Err(Refusal::Invalid(_))), "{named:?}");
    }

    #[tokio::test]
    async fn unknown_and_local_name_no_client() {
        let (named, rest) = header_of(&[b"PROXY UNKNOWN\r\nGET"], ProxyProtocol::Any).await;
        assert_eq!(named, Ok(None));
        assert_eq!(rest, b"GET");
        let (named, _) = header_of(&[&v2(0x20, 0x00, &[])], ProxyProtocol::V2).await;
        assert_eq!(named, Ok(None));
    }

    /// A binary header of another transport than TCP (UDP over IPv4 or IPv6, or
    /// an address family with no protocol) names no client of this TCP connection: as
    /// the PROXY protocol's receiver must, it falls back to the connection's own
    /// endpoints (HAProxy's spec, 2.2: "automatically falls back to the UNSPEC mode").
    #[tokio::test]
    async fn a_binary_header_of_another_transport_than_tcp_names_no_client() {
        let v4 = [203, 0, 113, 7, 10, 0, 0, 1, 0x14, 0x03, 0, 53];
        let v6 = [
            "2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
            "2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        ]
        .concat();
        let v6 = [&v6[..], &[0x14, 0x03, 0, 53]].concat();
        for (family, addresses) in [
            (0x12, &v4[..]),
            (0x22, &v6[..]),
            (0x10, &v4[..]),
            (0x20, &v6[..]),
        ] {
            let (named, rest) = header_of(
                &[&[v2(0x21, family, addresses), b"GET".to_vec()].concat()],
                ProxyProtocol::V2,
            )
            .await;
            assert_eq!(named, Ok(None), "family and protocol {family:#04x}");
            assert_eq!(rest, b"GET", "family and protocol {family:#04x}");
        }
    }

    #[tokio::test]
    async fn a_header_of_a_version_not_taken_or_malformed_or_too_long_is_refused() {
        let text: &[u8] = b"PROXY TCP4 203.0.113.7 10.0.0.1 5123 80\r\n";
        let binary = v2(0x21, 0x11, &[203, 0, 113, 7, 10, 0, 0, 1, 0, 1, 0, 80]);
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
        for (sent, taken) in [
            (text, ProxyProtocol::V2),
            (&binary[..], ProxyProtocol::V1),
            (b"GET / HTTP/1.1\r\n\r\n", ProxyProtocol::Any),
            (
                b"PROXY TCP4 203.0.113.300 10.0.0.1 5123 80\r\n",
                ProxyProtocol::Any,
            ),
            (
                b"PROXY TCP4 203.0.113.7 10.0.0.1 5123 80\n",
                ProxyProtocol::Any,
            ),
            (&long, ProxyProtocol::Any),
            (b"\r\n\r\n\0\r\nQUIX\n\x21\x11\x00\x00", ProxyProtocol::Any),
        ] {
            let (named, _) = header_of(&[sent], taken).await;
            assert!(
                matches!(named, Err(Refusal::Invalid(_))),
                "{:?} under {taken:?}: {named:?}",
                String::from_utf8_lossy(sent)
            );
        }
    }

    /// A connection closed, or silent through the time given, before its first byte
    /// is empty; one silent after a byte of its header is timed out.
    #[tokio::test(start_paused = true)]
    async fn nothing_sent_is_empty_and_a_header_begun_then_silent_a_timeout() {
        let (named, _) = header_of(&[], ProxyProtocol::Any).await;
        assert_eq!(named, Err(Refusal::Empty));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let silent = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let timeout = Duration::from_secs(10);
        let named = client_of(&server, ProxyProtocol::Any, timeout).await;
        assert_eq!(named, Err(Refusal::Empty));
        let mut begun = TcpStream::connect(addr).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        begun.write_all(b"PROXY TCP4 ").await.unwrap();
        let named = client_of(&server, ProxyProtocol::Any, timeout).await;
        assert_eq!(named, Err(Refusal::Timeout));
        drop((silent, begun));
    }

    #[tokio::test]
    async fn a_header_cut_short_is_closed() {
        let (named, _) = header_of(&[b"PROXY TCP4 203.0"], ProxyProtocol::Any).await;
        assert_eq!(named, Err(Refusal::Closed));
        let (named, _) =
            header_of(&[&v2(0x21, 0x11, &[203, 0, 113])[..15]], ProxyProtocol::Any).await;
        assert_eq!(named, Err(Refusal::Closed));
    }
}
