//! `[server] proxy_protocol`, `proxy_protocol_from` and `trusted_hops` over real
//! sockets on 127.0.0.1 (and 127.0.0.2 and .3, peers of their own): a trusted proxy's
//! connection begins with a PROXY protocol header (version 1 or 2), whose client is
//! the connection's peer for client IP keys, the `X-Forwarded-For` sent upstream and
//! `max_connections_per_client` (its refusals warned of); a header that names no client
//! (`UNKNOWN`, `LOCAL`, UDP) leaves the socket's peer, the `X-Forwarded-For` its client
//! wrote unread; a connection from a trusted proxy without a valid header, or silent
//! past `header_read_timeout`, is closed, and the proxy serves the next; one whose
//! header came but no request yet is closed to make room at `max_connections`; any
//! other peer's connection is plain HTTP, an IPv4-mapped peer of a dual-stack listener
//! taken as its IPv4 address. Peers in `proxy_protocol_from` apart from the trusted
//! proxies each send what they are listed for; `trusted_hops` counts entries of
//! `X-Forwarded-For` from the right, from any peer. The upstream answers with the
//! `X-Forwarded-For` it received. One test alone scrapes `/metrics` (the recorder is one per process).
#![cfg(feature = "proxy")]

use axum::Router;
use http::HeaderMap;
use rocgate::config::{KeyLimits, Partition, ProxyProtocol, RouteConfig, RouteMatch};
use rocgate::http::ClientIpResolver;
use rocgate::limiter::Algorithm;
use rocgate::proxy::ProxySettings;
use std::net::{Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[path = "common/proxy.rs"]
mod running;

#[path = "common/captured.rs"]
mod captured;

use captured::Captured;

use running::{connect, settings, start_proxy, within, RunningProxy, HEADER_READ_TIMEOUT};

/// A request that closes its connection once answered.
const REQUEST: &[u8] = b"GET /per-ip HTTP/1.1\r\nhost: app\r\nconnection: close\r\n\r\n";

/// An upstream answering each request with the `X-Forwarded-For` it received.
async fn start_upstream() -> SocketAddr {
    let app = Router::new().fallback(|headers: HeaderMap| async move {
        headers
            .get("x-forwarded-for")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A route partitioned by client address, each key admitting one request (then a
/// trickle nothing reaches in a test).
fn per_ip() -> RouteConfig {
    let mut route = RouteConfig::new("per-ip", RouteMatch::prefix("/per-ip"));
    route.controller.base_limit_rps = 1.0 / 1024.0;
    route.controller.cut_limit_rps = 1.0 / 1024.0;
    route.controller.danger_roc = f64::MAX;
    route.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(1024),
    };
    route.partition = Partition::ClientIp(KeyLimits::default());
    route
}

/// Settings expecting `proxy_protocol` from the trusted `networks`.
fn expecting(
    upstream: SocketAddr,
    proxy_protocol: ProxyProtocol,
    networks: &[&str],
) -> ProxySettings {
    let mut s = settings(upstream);
    s.proxy_protocol = proxy_protocol;
    s.forward.resolver =
        ClientIpResolver::new(networks.iter().map(|n| n.parse().unwrap()).collect());
    s
}

/// What the proxy answers a connection that sends `writes` (a pause between them) and
/// closes nothing: the status and body, or `None` if it was closed with no answer.
async fn exchange(proxy: &RunningProxy, writes: &[&[u8]]) -> Option<(u16, String)> {
    exchange_on(connect(proxy.addr).await, writes).await
}

/// As [`exchange`], from the loopback address `from` (`127.0.0.2`: a peer of its own).
async fn exchange_from(
    proxy: &RunningProxy,
    from: &str,
    writes: &[&[u8]],
) -> Option<(u16, String)> {
    exchange_on(connect_from(proxy, from).await, writes).await
}

/// A connection to the proxy from the loopback address `from`.
async fn connect_from(proxy: &RunningProxy, from: &str) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(from.parse().unwrap(), 0))
        .unwrap();
    within("connect", socket.connect(proxy.addr)).await.unwrap()
}

/// What the proxy answers on `stream` to `writes`, as [`exchange`] says.
async fn exchange_on(mut stream: TcpStream, writes: &[&[u8]]) -> Option<(u16, String)> {
    for (i, w) in writes.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        if stream.write_all(w).await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    // A connection closed with bytes unread may end in a reset: no answer either way.
    let _ = within("the answer", stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8(answer).unwrap();
    let status = answer.get(9..12)?.parse().unwrap();
    let body = answer.split_once("\r\n\r\n").unwrap().1.to_owned();
    Some((status, body))
}

/// Sends `request` on a new connection again and again, 50 times 20 ms apart,
/// until one is closed unanswered: whether one was. A client's connection held
/// open takes its place only once its header is read, which may not be yet.
async fn refused_within_a_second(proxy: &RunningProxy, request: &[u8]) -> bool {
    refused_within_a_second_from(proxy, None, request).await
}

/// As [`refused_within_a_second`], each connection from the loopback address `from`
/// where one is given (as [`exchange_from`]).
async fn refused_within_a_second_from(
    proxy: &RunningProxy,
    from: Option<&str>,
    request: &[u8],
) -> bool {
    for _ in 0..50 {
        let answer = match from {
            Some(from) => exchange_from(proxy, from, &[request]).await,
            None => exchange(proxy, &[request]).await,
        };
        if answer.is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// A proxy expecting version 1 headers from the balancers `balancers`, apart from
/// the trusted proxies `trusted`, each client held to one connection, a header
/// waited for 10 s.
async fn balancer_capped_at_one(trusted: &str, balancers: &str) -> RunningProxy {
    let upstream = start_upstream().await;
    let mut s = expecting(upstream, ProxyProtocol::V1, &[trusted]);
    s.proxy_protocol_from = Some(vec![balancers.parse().unwrap()]);
    s.max_connections_per_client = Some(1);
    s.header_read_timeout = Duration::from_secs(10);
    start_proxy(s, vec![per_ip()]).await
}

fn v1(client: &str) -> Vec<u8> {
    let tcp = if client.contains(':') { "TCP6" } else { "TCP4" };
    let dest = if client.contains(':') {
        "::1"
    } else {
        "127.0.0.1"
    };
    format!("PROXY {tcp} {client} {dest} 5123 80\r\n").into_bytes()
}

/// A binary header: `command` (0x20 LOCAL, 0x21 PROXY), `family` (0x11 TCP over IPv4,
/// 0x21 over IPv6, 0x00 unspecified) and its addresses.
fn v2_raw(command: u8, family: u8, addresses: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(command);
    h.push(family);
    h.extend_from_slice(&u16::try_from(addresses.len()).unwrap().to_be_bytes());
    h.extend_from_slice(addresses);
    h
}

/// A binary PROXY header naming `client` (port 5123).
fn v2(client: &str) -> Vec<u8> {
    let ip: std::net::IpAddr = client.parse().unwrap();
    let (family, mut addresses) = match ip {
        std::net::IpAddr::V4(v4) => (0x11, [v4.octets(), [127, 0, 0, 1]].concat()),
        std::net::IpAddr::V6(v6) => (0x21, [v6.octets(), Ipv6Addr::LOCALHOST.octets()].concat()),
    };
    addresses.extend_from_slice(&5123u16.to_be_bytes());
    addresses.extend_from_slice(&80u16.to_be_bytes());
    v2_raw(0x21, family, &addresses)
}

fn with_request(header: Vec<u8>) -> Vec<u8> {
    [header, REQUEST.to_vec()].concat()
}

/// A request to `/per-ip` carrying `X-Forwarded-For: xff`, closing its connection
/// once answered.
fn forwarded(xff: &str) -> Vec<u8> {
    format!(
        "GET /per-ip HTTP/1.1\r\nhost: app\r\nx-forwarded-for: {xff}\r\n\
         connection: close\r\n\r\n"
    )
    .into_bytes()
}

#[tokio::test]
async fn each_client_a_header_names_gets_its_own_key_and_is_the_forwarded_address() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::Any, &["127.0.0.1/32"]),
        vec![per_ip()],
    )
    .await;
    for (header, client) in [
        (v1("203.0.113.7"), "203.0.113.7"),
        (v2("198.51.100.9"), "198.51.100.9"),
        (v1("2001:db8::7"), "2001:db8::7"),
        (v2("2001:db8:1::8"), "2001:db8:1::8"),
    ] {
        let answer = exchange(&proxy, &[&with_request(header)]).await;
        // The load balancer's address is no hop: the upstream sees the client alone.
        // (An IPv6 client's key is its /64.)
        assert_eq!(answer, Some((200, client.to_owned())), "{client}");
    }
    // The same client, through another connection of the load balancer: its key.
    let again = exchange(&proxy, &[&with_request(v2("203.0.113.7"))]).await;
    assert_eq!(again.map(|(status, _)| status), Some(429));
    assert_eq!(proxy.snapshot("per-ip").keys, 4);
}

/// `proxy_protocol_from` apart from the trusted proxies: an L7 proxy (127.0.0.2,
/// trusted) beside an L4 balancer (127.0.0.3, its header expected) each does what it
/// does. The L7 proxy's plain HTTP is served and its `X-Forwarded-For` believed; the
/// balancer's header names its client, and its own `X-Forwarded-For` (relayed from a
/// client as written) is not; a header from the L7 proxy, or plain HTTP from the
/// balancer, is refused as before; and a client the balancer names is a proxy of
/// `X-Forwarded-For` only if it is in the trusted proxies itself.
#[tokio::test]
async fn the_balancers_apart_from_the_trusted_proxies_each_send_what_they_send() {
    let upstream = start_upstream().await;
    let mut s = expecting(
        upstream,
        ProxyProtocol::Any,
        &["127.0.0.2/32", "198.51.100.0/24"],
    );
    s.proxy_protocol_from = Some(vec!["127.0.0.3/32".parse().unwrap()]);
    let proxy = start_proxy(s, vec![per_ip()]).await;
    // The L7 proxy: plain HTTP, its X-Forwarded-For believed.
    let l7 = exchange_from(&proxy, "127.0.0.2", &[&forwarded("203.0.113.7")]).await;
    assert_eq!(l7, Some((200, "203.0.113.7, 127.0.0.2".to_owned())));
    // The balancer: its header names the client; what the client wrote is not read.
    let l4 = [v1("192.0.2.9"), forwarded("6.6.6.6")].concat();
    let named = exchange_from(&proxy, "127.0.0.3", &[&l4]).await;
    assert_eq!(named, Some((200, "192.0.2.9".to_owned())));
    // A trusted L7 proxy behind the balancer: named, and its X-Forwarded-For read.
    let behind = [v1("198.51.100.4"), forwarded("203.0.113.8")].concat();
    let through = exchange_from(&proxy, "127.0.0.3", &[&behind]).await;
    assert_eq!(through, Some((200, "203.0.113.8, 198.51.100.4".to_owned())));
    // Each peer sends only what it is expected to.
    let l7_header = exchange_from(&proxy, "127.0.0.2", &[&with_request(v1("192.0.2.10"))]).await;
    assert_eq!(l7_header.map(|(status, _)| status), Some(400));
    let l4_plain = exchange_from(&proxy, "127.0.0.3", &[REQUEST]).await;
    assert_eq!(l4_plain, None);
    // The three clients named, each its key; the refused connections none.
    assert_eq!(proxy.snapshot("per-ip").keys, 3);
}

/// A balancer in `proxy_protocol_from` alone carries many clients: its connections
/// are not counted under `max_connections_per_client`, the clients its headers name
/// are. (Counted, its second connection was closed as accepted.)
#[tokio::test]
async fn a_balancer_apart_from_the_trusted_proxies_is_not_held_to_the_per_client_cap() {
    let proxy = balancer_capped_at_one("127.0.0.2/32", "127.0.0.3/32").await;
    let mut held = connect_from(&proxy, "127.0.0.3").await;
    held.write_all(&v1("192.0.2.1")).await.unwrap();
    let other = exchange_from(&proxy, "127.0.0.3", &[&with_request(v1("192.0.2.2"))]).await;
    assert_eq!(other, Some((200, "192.0.2.2".to_owned())));
    // The client named holds its own place: its second connection is refused once
    // the held one's header is read.
    let again = with_request(v1("192.0.2.1"));
    assert!(
        refused_within_a_second_from(&proxy, Some("127.0.0.3"), &again).await,
        "the held client's second connection was served"
    );
}

/// A client a balancer's header names is held to `max_connections_per_client` even
/// where its address lies in `proxy_protocol_from` (the balancers' network, which
/// clients may share): only a named trusted proxy, an L7 proxy behind the balancer,
/// carries many clients. (The named client's address was held against both lists, and
/// its second connection served.)
#[tokio::test]
async fn a_named_client_in_the_balancers_network_is_held_to_its_cap() {
    let proxy = balancer_capped_at_one("198.51.100.0/24", "127.0.0.0/24").await;
    let mut held = connect(proxy.addr).await;
    held.write_all(&v1("127.0.0.50")).await.unwrap();
    assert!(
        refused_within_a_second(&proxy, &with_request(v1("127.0.0.50"))).await,
        "the named client's second connection was served"
    );
    // A trusted L7 proxy behind the balancer is not held to it: its connection held,
    // its next ones (each for a client of its own) are served, its header read or not.
    let mut behind = connect(proxy.addr).await;
    behind.write_all(&v1("198.51.100.4")).await.unwrap();
    for i in 1..=10 {
        let sent = [v1("198.51.100.4"), forwarded(&format!("203.0.113.{i}"))].concat();
        let answer = exchange(&proxy, &[&sent]).await;
        let body = format!("203.0.113.{i}, 198.51.100.4");
        assert_eq!(answer, Some((200, body)));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((held, behind));
}

/// `[server] trusted_hops` through `rocgate serve`: from any peer, the client is the
/// N-th entry of `X-Forwarded-For` from the right, for the key, and the chain is
/// passed on with the peer appended; without the header, the peer is the client.
#[tokio::test]
async fn trusted_hops_key_each_client_by_its_entry_from_the_right() {
    let mut server = rocgate::config::ServerConfig::default();
    server.trusted_hops = 2;
    let from_file = ProxySettings::from_server(&server, "http://127.0.0.1:1".parse().unwrap());
    assert_eq!(from_file.forward.resolver.trusted_hops(), 2);
    let upstream = start_upstream().await;
    let mut s = settings(upstream);
    s.forward.resolver = ClientIpResolver::default().with_trusted_hops(2);
    let proxy = start_proxy(s, vec![per_ip()]).await;
    let first = exchange(&proxy, &[&forwarded("6.6.6.6, 203.0.113.7, 198.51.100.1")]).await;
    assert_eq!(
        first,
        Some((
            200,
            "6.6.6.6, 203.0.113.7, 198.51.100.1, 127.0.0.1".to_owned()
        ))
    );
    // The same client through another edge node, whatever it wrote on the left.
    let again = exchange(&proxy, &[&forwarded("6.6.6.7, 203.0.113.7, 198.51.100.2")]).await;
    assert_eq!(again.map(|(status, _)| status), Some(429));
    // Fewer entries than hops: the left-most; none: the peer.
    let short = exchange(&proxy, &[&forwarded("192.0.2.4")]).await;
    assert_eq!(short, Some((200, "192.0.2.4, 127.0.0.1".to_owned())));
    let plain = exchange(&proxy, &[REQUEST]).await;
    assert_eq!(plain, Some((200, "127.0.0.1".to_owned())));
    assert_eq!(proxy.snapshot("per-ip").keys, 3);
}

#[tokio::test]
async fn without_proxy_protocol_the_load_balancers_connections_share_its_key() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::Off, &["127.0.0.1/32"]),
        vec![per_ip()],
    )
    .await;
    let first = exchange(&proxy, &[REQUEST]).await;
    assert_eq!(first, Some((200, "127.0.0.1".to_owned())));
    let second = exchange(&proxy, &[REQUEST]).await;
    assert_eq!(second.map(|(status, _)| status), Some(429));
    // A header is no part of HTTP here.
    let header = exchange(&proxy, &[&with_request(v1("203.0.113.7"))]).await;
    assert_eq!(header.map(|(status, _)| status), Some(400));
    assert_eq!(proxy.snapshot("per-ip").keys, 1);
}

#[tokio::test]
async fn a_header_split_over_writes_and_followed_by_http_in_its_last_is_read_whole() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::V1, &["127.0.0.0/8"]),
        vec![per_ip()],
    )
    .await;
    let last = [b"\n".as_slice(), REQUEST].concat();
    let answer = exchange(
        &proxy,
        &[
            b"PROXY TCP4 203.0",
            b".113.7 127.0.0.1 51",
            b"23 80\r",
            &last,
        ],
    )
    .await;
    assert_eq!(answer, Some((200, "203.0.113.7".to_owned())));
    // A binary header, where v1 alone is taken: closed.
    let binary = v2("198.51.100.9");
    let (a, b) = binary.split_at(10);
    assert_eq!(
        exchange(&proxy, &[a, &with_request(b.to_vec())]).await,
        None
    );
}

#[tokio::test]
async fn unknown_and_local_leave_the_load_balancer_the_peer() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::Any, &["127.0.0.1/32"]),
        vec![per_ip()],
    )
    .await;
    let unknown = exchange(&proxy, &[&with_request(b"PROXY UNKNOWN\r\n".to_vec())]).await;
    assert_eq!(unknown, Some((200, "127.0.0.1".to_owned())));
    let local = exchange(&proxy, &[&with_request(v2_raw(0x20, 0x00, &[]))]).await;
    assert_eq!(
        local.map(|(status, _)| status),
        Some(429),
        "127.0.0.1's key"
    );
    assert_eq!(proxy.snapshot("per-ip").keys, 1);
}

/// A connection whose header names no client (`UNKNOWN`, `LOCAL`, UDP) carries what
/// its client wrote, not its load balancer: an L4 balancer writes no
/// `X-Forwarded-For`. The one in the request names no one, for the key as upstream:
/// else a client relayed so would choose its own address.
#[tokio::test]
async fn a_header_naming_no_client_leaves_the_requests_x_forwarded_for_untrusted() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::Any, &["127.0.0.1/32"]),
        vec![per_ip()],
    )
    .await;
    let udp = v2_raw(
        0x21,
        0x12,
        &[203, 0, 113, 7, 127, 0, 0, 1, 0x14, 0x03, 0, 80],
    );
    for (i, header) in [b"PROXY UNKNOWN\r\n".to_vec(), v2_raw(0x20, 0x00, &[]), udp]
        .into_iter()
        .enumerate()
    {
        let spoofed = format!(
            "GET /per-ip HTTP/1.1\r\nhost: app\r\nx-forwarded-for: 6.6.6.{i}\r\n\
             connection: close\r\n\r\n"
        );
        let answer = exchange(&proxy, &[&[header, spoofed.into_bytes()].concat()]).await;
        match i {
            // The balancer's own key, its one request admitted: the upstream sees the
            // balancer's address alone.
            0 => assert_eq!(answer, Some((200, "127.0.0.1".to_owned()))),
            _ => assert_eq!(answer.map(|(status, _)| status), Some(429), "{i}"),
        }
    }
    assert_eq!(proxy.snapshot("per-ip").keys, 1);
}

#[tokio::test]
async fn an_untrusted_peers_connection_is_plain_http_and_its_header_no_address() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::Any, &["10.0.0.0/8"]),
        vec![per_ip()],
    )
    .await;
    let header = exchange(&proxy, &[&with_request(v1("203.0.113.7"))]).await;
    assert_eq!(header.map(|(status, _)| status), Some(400));
    let plain = exchange(&proxy, &[REQUEST]).await;
    assert_eq!(plain, Some((200, "127.0.0.1".to_owned())));
}

/// On a dual-stack listener an IPv4 load balancer's peer is IPv4-mapped
/// (`::ffff:127.0.0.1`): it is trusted as its IPv4 address, its header read; and an
/// untrusted IPv4 peer's header is not, there as on an IPv4 listener.
#[tokio::test]
async fn an_ipv4_mapped_peer_of_a_dual_stack_listener_is_trusted_as_its_ipv4_address() {
    let upstream = start_upstream().await;
    for trusted in ["127.0.0.1/32", "::ffff:127.0.0.1/128"] {
        let mut s = expecting(upstream, ProxyProtocol::Any, &[trusted]);
        s.listen = "[::]:0".parse().unwrap();
        let mut proxy = start_proxy(s, vec![per_ip()]).await;
        proxy.addr = SocketAddr::from(([127, 0, 0, 1], proxy.addr.port()));
        let named = exchange(&proxy, &[&with_request(v2("203.0.113.7"))]).await;
        assert_eq!(named, Some((200, "203.0.113.7".to_owned())), "{trusted}");
        let missing = exchange(&proxy, &[REQUEST]).await;
        assert_eq!(missing, None, "{trusted}: a trusted peer without a header");
    }
    let mut s = expecting(upstream, ProxyProtocol::Any, &["10.0.0.0/8"]);
    s.listen = "[::]:0".parse().unwrap();
    let mut proxy = start_proxy(s, vec![per_ip()]).await;
    proxy.addr = SocketAddr::from(([127, 0, 0, 1], proxy.addr.port()));
    let header = exchange(&proxy, &[&with_request(v2("203.0.113.7"))]).await;
    assert_eq!(header.map(|(status, _)| status), Some(400));
    let plain = exchange(&proxy, &[REQUEST]).await;
    assert_eq!(plain, Some((200, "127.0.0.1".to_owned())));
}

/// At `max_connections`, a connection whose header came but no byte of HTTP is
/// closed to make room, with no answer, as a client's own connection that has sent
/// nothing is (its client asked nothing yet); one whose request head has begun after
/// its header is not, and is served once its head is whole.
#[tokio::test]
async fn at_the_cap_a_header_with_no_request_yet_is_closed_to_make_room() {
    let upstream = start_upstream().await;
    let mut s = expecting(upstream, ProxyProtocol::V1, &["127.0.0.1/32"]);
    s.max_connections = 2;
    s.header_read_timeout = Duration::from_secs(10);
    s.idle_timeout = Duration::from_secs(10);
    let proxy = start_proxy(s, vec![per_ip()]).await;
    let mut header_only = connect(proxy.addr).await;
    header_only.write_all(&v1("203.0.113.7")).await.unwrap();
    let mut begun = connect(proxy.addr).await;
    let head = [v1("203.0.113.8"), b"GET /per-ip HTTP/1.1\r\n".to_vec()].concat();
    begun.write_all(&head).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let third = exchange(&proxy, &[&with_request(v1("198.51.100.9"))]).await;
    assert_eq!(third, Some((200, "198.51.100.9".to_owned())));
    let mut rest = Vec::new();
    let read = within("the closed one", header_only.read_to_end(&mut rest)).await;
    assert!(read.is_err() || rest.is_empty(), "answered: {rest:?}");
    begun
        .write_all(b"host: app\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    within("the begun one's answer", begun.read_to_end(&mut answer))
        .await
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("203.0.113.8"), "{answer}");
}

/// A client its proxy names counts against `max_connections_per_client` as if it had
/// connected itself, from its header on: its second connection is closed, another
/// client's is served.
#[tokio::test]
async fn a_named_client_holds_its_own_connections_under_the_per_client_cap() {
    let upstream = start_upstream().await;
    let mut s = expecting(upstream, ProxyProtocol::V2, &["127.0.0.1/32"]);
    s.max_connections_per_client = Some(1);
    s.header_read_timeout = Duration::from_secs(10);
    let proxy = start_proxy(s, vec![per_ip()]).await;
    // Its header read, the connection waits for its request, held open.
    let mut held = connect(proxy.addr).await;
    held.write_all(&v2("203.0.113.7")).await.unwrap();
    assert!(
        refused_within_a_second(&proxy, &with_request(v2("203.0.113.7"))).await,
        "the client's second connection was served"
    );
    let other = exchange(&proxy, &[&with_request(v2("198.51.100.9"))]).await;
    assert_eq!(other, Some((200, "198.51.100.9".to_owned())));
    held.write_all(REQUEST).await.unwrap();
    let mut answer = Vec::new();
    within(
        "the held connection's answer",
        held.read_to_end(&mut answer),
    )
    .await
    .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("203.0.113.7"), "{answer}");
}

/// A named client refused at `max_connections_per_client` is warned of as a client
/// refused as accepted is (README: "with a warning naming the address at most once
/// every 10 s"): the line names the client, and its load balancer.
#[tokio::test]
async fn a_named_client_refused_at_its_cap_is_warned_of_naming_it() {
    // A current-thread runtime: the proxy's tasks log on this thread.
    let (log, _capturing) = Captured::on_this_thread();
    let upstream = start_upstream().await;
    let mut s = expecting(upstream, ProxyProtocol::V1, &["127.0.0.1/32"]);
    s.max_connections_per_client = Some(1);
    s.header_read_timeout = Duration::from_secs(10);
    let proxy = start_proxy(s, vec![per_ip()]).await;
    let mut held = connect(proxy.addr).await;
    held.write_all(&v1("203.0.113.7")).await.unwrap();
    assert!(
        refused_within_a_second(&proxy, &with_request(v1("203.0.113.7"))).await,
        "the client's second connection was served"
    );
    let lines = log.lines_with("max_connections_per_client");
    let warned: Vec<_> = lines.iter().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warned.len(), 1, "{lines:#?}");
    assert!(warned[0].contains("203.0.113.7"), "{}", warned[0]);
    assert!(warned[0].contains("proxy=127.0.0.1:"), "{}", warned[0]);
    assert!(warned[0].contains("refused=1"), "{}", warned[0]);
    // Within 10 s, another refusal is counted, not logged.
    assert_eq!(
        exchange(&proxy, &[&with_request(v1("203.0.113.7"))]).await,
        None
    );
    let again = log.lines_with("max_connections_per_client");
    assert_eq!(
        again.iter().filter(|l| l.contains("WARN")).count(),
        1,
        "{again:#?}"
    );
}

/// A connection from a load balancer closed for its header is warned of, naming the
/// peer and the reason (a balancer without `send-proxy` has every connection closed,
/// which a debug line hid), at most one line every 10 s: the next refusal within them
/// is counted in the line after, not logged.
#[tokio::test]
async fn a_header_refusal_is_warned_of_naming_the_peer_and_reason_a_line_a_period() {
    // A current-thread runtime: the proxy's tasks log on this thread.
    let (log, _capturing) = Captured::on_this_thread();
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::V1, &["127.0.0.1/32"]),
        vec![per_ip()],
    )
    .await;
    // A connection closed before a byte (a health check) is no fault: not warned of.
    drop(connect(proxy.addr).await);
    for _ in 0..2 {
        assert_eq!(exchange(&proxy, &[REQUEST]).await, None);
    }
    let empty = log.lines_with("before it sent a byte");
    assert!(empty.iter().all(|l| !l.contains("WARN")), "{empty:#?}");
    let warned: Vec<_> = log
        .lines_with("connection closed")
        .into_iter()
        .filter(|l| l.contains("WARN"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(warned[0].contains("peer=127.0.0.1:"), "{}", warned[0]);
    assert!(warned[0].contains("reason=\"invalid\""), "{}", warned[0]);
    assert!(warned[0].contains("unwarned=0"), "{}", warned[0]);
    assert!(
        warned[0].contains("does not begin with a header of proxy_protocol \"v1\""),
        "{}",
        warned[0]
    );
}

/// The one test that scrapes `/metrics`.
#[tokio::test]
async fn bad_or_missing_headers_and_silence_close_the_connection_and_are_counted() {
    let upstream = start_upstream().await;
    let proxy = start_proxy(
        expecting(upstream, ProxyProtocol::Any, &["127.0.0.1/32"]),
        vec![per_ip()],
    )
    .await;
    let oversized = [b"PROXY TCP4 ".as_slice(), &[b'1'; 200], b"\r\n"].concat();
    let bad_v2_length = v2_raw(0x21, 0x11, &[203, 0, 113, 7]);
    for sent in [
        REQUEST.to_vec(),
        with_request(b"PROXY TCP4 203.0.113.300 127.0.0.1 5123 80\r\n".to_vec()),
        with_request(oversized),
        with_request(bad_v2_length),
    ] {
        let answer = exchange(&proxy, &[&sent]).await;
        assert_eq!(answer, None, "{:?}", String::from_utf8_lossy(&sent));
    }
    // A connection closed before a byte (a health check) is empty.
    drop(connect(proxy.addr).await);
    // A connection that sends nothing, and one that begins its header and stops,
    // hold a place, then are closed past header_read_timeout: the first empty, the
    // second timed out.
    let mut silent = connect(proxy.addr).await;
    let mut begun = connect(proxy.addr).await;
    begun.write_all(b"PROXY TCP4 203.0").await.unwrap();
    let mut open = 0.0;
    for _ in 0..20 {
        tokio::time::sleep(HEADER_READ_TIMEOUT / 40).await;
        open = metric(&proxy, "rocgate_client_connections ").await;
        if open == 2.0 {
            break;
        }
    }
    assert_eq!(
        open, 2.0,
        "the silent connection and the one begun, they alone, counted as open"
    );
    for stalled in [&mut silent, &mut begun] {
        let mut rest = Vec::new();
        let read = within(
            "a stalled connection's close",
            stalled.read_to_end(&mut rest),
        )
        .await;
        assert!(read.is_err() || rest.is_empty(), "{rest:?}");
    }
    // The proxy serves the next connection all the same.
    let served = exchange(&proxy, &[&with_request(v1("203.0.113.7"))]).await;
    assert_eq!(served, Some((200, "203.0.113.7".to_owned())));
    let refused = "rocgate_proxy_protocol_refused_total";
    assert_eq!(
        metric(&proxy, &format!("{refused}{{reason=\"invalid\"}}")).await,
        4.0
    );
    assert_eq!(
        metric(&proxy, &format!("{refused}{{reason=\"timeout\"}}")).await,
        1.0
    );
    assert_eq!(
        metric(&proxy, &format!("{refused}{{reason=\"empty\"}}")).await,
        2.0
    );
}

/// The value of the series `prefix` (its name and labels as exposed) in the proxy's
/// `/metrics`.
async fn metric(proxy: &RunningProxy, prefix: &str) -> f64 {
    let mut admin = TcpStream::connect(proxy.admin).await.unwrap();
    admin
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    within("/metrics", admin.read_to_string(&mut text))
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}
