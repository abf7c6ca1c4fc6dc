//! The forwarding service: rewrites a client request for the upstream, sends it over
//! the client connection's own upstream connection ([`super::lane`]) or pooled
//! keep-alive connections, streams both bodies, and maps failures to responses. An
//! HTTP/1.1 upgrade request goes over an upstream connection of its own; the 101 that
//! accepts it carries the [`Tunnel`] `rocgate serve` runs. At most
//! `max_upstream_requests` requests are in flight to the upstream, each holding its
//! place through its response body or its tunnel; beyond them, 503 `upstream_overflow`.

use super::error::ProxyError;
use super::lane::{Driver, Lane, LaneCount};
use super::tunnel::Tunnel;
use crate::clock::{Clock, Nanos};
use crate::config::ClientIpHeader;
use crate::hints::UpstreamMeter;
use crate::http::{ClientIpResolver, MatchedRoute, PeerAddr, RouteSlot, SharedEngine};
use crate::metrics as metric;
use axum::body::Body;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Request, Response, Uri, Version};
use http_body::Body as _;
use http_body_util::Limited;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tower::ServiceExt as _;

/// Where and how requests are forwarded. Build it with
/// [`ForwardSettings::from_server`] and set its fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ForwardSettings {
    /// The upstream's scheme and authority (`http://127.0.0.1:3000`).
    pub upstream: Uri,
    /// Longest wait for a TCP connection to the upstream.
    pub connect_timeout: Duration,
    /// Longest wait for the upstream's response head, counted from the request's head
    /// or, for a request with a body, from the last part of the body the client sent
    /// (an upload slower than this is the client's time); a client that sends nothing
    /// of its body for this long gets 408. Also the longest wait between two parts of
    /// the response body: after it, the client's connection is aborted.
    pub response_timeout: Duration,
    /// Largest request body forwarded; larger ones get 413.
    pub max_body_bytes: u64,
    /// Most upstream connections held by client connections of their own (from a
    /// connection's second HTTP/1.1 request on); 0 sends every request through the
    /// shared pool.
    pub max_upstream_lanes: usize,
    /// Most requests in flight to the upstream at once (at least 1), through the pool,
    /// lanes and tunnels together: each holds its place from the moment it is
    /// forwarded until its response body ends (or the client leaves), it fails, or its
    /// WebSocket tunnel closes. A request that finds every place taken is answered 503
    /// `upstream_overflow` at once, never forwarded.
    pub max_upstream_requests: usize,
    /// How long an upstream connection may sit idle and still be reused, in the pool
    /// and in lanes. An upstream that closes a connection just as a request goes out on
    /// it makes that request fail (502): keep this below the upstream's keep-alive
    /// timeout.
    pub upstream_idle_timeout: Duration,
    /// Whether the upstream receives the request's path
    /// [normalized](crate::config::normalize_path), as its route was matched (`true`),
    /// or as the client sent it. The query is sent as the client sent it either way.
    pub normalize_path: bool,
    /// Proxies whose `X-Forwarded-For` chain is kept and extended.
    pub resolver: ClientIpResolver,
}

impl ForwardSettings {
    /// Forwarding to `upstream` as `server`'s `[server]` settings say
    /// ([`ServerConfig::default`](crate::config::ServerConfig::default) for the file's
    /// defaults); set a field to change it.
    pub fn from_server(server: &crate::config::ServerConfig, upstream: Uri) -> Self {
        ForwardSettings {
            upstream,
            connect_timeout: server.connect_timeout,
            response_timeout: server.response_timeout,
            max_body_bytes: server.max_body_bytes,
            max_upstream_lanes: server.max_upstream_lanes,
            max_upstream_requests: server.max_upstream_requests,
            upstream_idle_timeout: server.upstream_idle_timeout,
            normalize_path: server.normalize_path,
            resolver: crate::http::ClientIpResolver::new(server.trusted_proxies.clone())
                .with_header(server.client_ip_header)
                .with_trusted_hops(server.trusted_hops),
        }
    }

    /// The trusted proxy networks, for the admission layer's client IP resolution.
    pub fn resolver_networks(&self) -> Vec<ipnet::IpNet> {
        self.resolver.networks().to_vec()
    }
}

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1). `Trailer` is not
/// one (RFC 9110 §6.6.2: it names the message's trailer fields, end to end), and
/// HTTP/1.1 sends only the trailer fields it names.
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// The client address headers of CDNs and load balancers ([`is_forwarding`]), dropped
/// from every peer: a trusted proxy of `X-Forwarded-For` passes on those its client
/// wrote.
const CDN_CLIENT_ADDRESS: [&str; 7] = [
    "x-client-ip",
    "true-client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-forwarded",
    "forwarded-for",
];

/// Whether `name` is a forwarding header: one `set_forwarded` keeps from a trusted
/// peer and replaces or drops from any other. Besides `X-Forwarded-For`, `-Proto`,
/// `-Host` and `Forwarded`, that is every other `X-Forwarded-*` and `X-Real-IP`:
/// upstream frameworks and proxies read many (Rack, Spring, Symfony, Gin; Traefik's
/// list; `X-Forwarded-Uri` and `-Method` for forward auth, Envoy's
/// `X-Forwarded-Client-Cert` for the client's certificate), and from an untrusted peer
/// they would tell the upstream what the client chose, against what rocgate sets
/// (Rack takes `X-Forwarded-Ssl: on` and `X-Forwarded-Scheme` before
/// `X-Forwarded-Proto`). And the headers in which CDNs and load balancers name the
/// client (`X-Client-IP`, Akamai's `True-Client-IP`, Cloudflare's `CF-Connecting-IP`,
/// Fastly's, `X-Cluster-Client-IP`, `X-Forwarded`, `Forwarded-For`), which Node.js's
/// `request-ip` reads before `X-Forwarded-For`.
fn is_forwarding(name: &HeaderName) -> bool {
    match name.as_str() {
        "forwarded"
        | "x-real-ip"
        | "x-client-ip"
        | "true-client-ip"
        | "cf-connecting-ip"
        | "fastly-client-ip"
        | "x-cluster-client-ip"
        | "forwarded-for" => true,
        other => other.starts_with("x-forwarded"),
    }
}

/// What one pass over a request's header names finds, for the checks before admission
/// ([`refusal`]) and the rewrite ([`Inner::rewrite`]): most requests carry few headers
/// and none of the rare ones (hop-by-hop, forwarding, `Via`, `Expect`), and a pass
/// over the names costs less than hashing each name looked up.
#[derive(Default)]
struct HeadScan<'a> {
    /// `Host` values: 0, 1, or 2 for two or more.
    hosts: u8,
    /// The first `Host` value.
    host: Option<&'a HeaderValue>,
    /// Any `Via`.
    via: bool,
    /// Any `Transfer-Encoding`.
    transfer_encoding: bool,
    /// Any hop-by-hop header (`Transfer-Encoding` included).
    hop_by_hop: bool,
    /// Any forwarding header: `X-Forwarded-*`, `Forwarded` or `X-Real-IP`.
    forwarding: bool,
    /// Any `Expect`.
    expect: bool,
}

impl<'a> HeadScan<'a> {
    /// One pass over `headers`, every value of each name.
    fn of(headers: &'a HeaderMap) -> Self {
        let mut scan = HeadScan::default();
        for (name, value) in headers {
            match name.as_str() {
                "host" => {
                    scan.hosts = scan.hosts.saturating_add(1).min(2);
                    scan.host.get_or_insert(value);
                }
                "via" => scan.via = true,
                "expect" => scan.expect = true,
                hop if is_hop_by_hop(hop) => {
                    scan.hop_by_hop = true;
                    scan.transfer_encoding |= hop == "transfer-encoding";
                }
                _ if is_forwarding(name) => scan.forwarding = true,
                _ => {}
            }
        }
        scan
    }
}

/// Whether `headers` holds any hop-by-hop header. Most messages carry none: one pass
/// over the names saves hashing each of the eight on every message. One match on each
/// name's text (by length, then bytes), not nine comparisons of names.
fn any_hop_by_hop(headers: &HeaderMap) -> bool {
    headers.keys().any(|k| is_hop_by_hop(k.as_str()))
}

/// Whether a header of this (lower-case) name is hop-by-hop: [`HOP_BY_HOP`] or
/// `Proxy-Connection`.
#[inline]
fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "transfer-encoding"
            | "upgrade"
            | "proxy-connection"
    )
}

/// Removes a response's hop-by-hop headers, including every header named in
/// `Connection`, and a `Content-Length` beside a `Transfer-Encoding`.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if any_hop_by_hop(headers) {
        remove_hop_by_hop(headers, false, |_| false);
    }
}

/// [`strip_hop_by_hop`] on a response, but for its `Upgrade`, kept with `Connection:
/// upgrade` (RFC 9110 §7.8: the option that keeps the next hop from passing it on):
/// a 101's switch, or the protocols a 426 requires.
fn strip_but_upgrade(headers: &mut HeaderMap) {
    let offered: Vec<HeaderValue> = headers.get_all(header::UPGRADE).iter().cloned().collect();
    strip_hop_by_hop(headers);
    for v in offered {
        headers.append(header::UPGRADE, v);
    }
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
}

/// [`strip_hop_by_hop`], without looking first whether there is any, but for the
/// headers named in `Connection` that `keep` takes (a request's `Host`, forwarding
/// headers and key: see [`Inner::rewrite`]). With `upgrade`
/// (an HTTP/1.1 request that hyper can hand over), a message whose `Connection` names
/// `upgrade` and that has an `Upgrade` not offering `h2c` keeps its `Upgrade` and gets
/// `Connection: upgrade`: returns whether it did. `h2c` is never tunnelled: an
/// upgraded HTTP/2 connection would carry requests no route admits.
fn remove_hop_by_hop(
    headers: &mut HeaderMap,
    upgrade: bool,
    keep: impl Fn(&HeaderName) -> bool,
) -> bool {
    // The body was framed by its transfer coding, which overrides a `Content-Length`
    // (RFC 9112 §6.3: a proxy MUST remove it). Kept, it would frame the next hop's.
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    // What `keep` takes of the headers named stays.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .filter_map(|name| HeaderName::from_bytes(name.trim_ascii()).ok())
        .filter(|name| {
            // `keep` is not asked of the options most messages name, which are stripped
            // whatever it says (hop by hop) or are no header (`close`).
            let always = is_hop_by_hop(name.as_str()) || name.as_str() == "close";
            always || !keep(name)
        })
        .collect();
    let upgrading = upgrade && named.contains(&header::UPGRADE) && tunnelled(headers);
    for name in named.iter().chain(HOP_BY_HOP.iter()) {
        if !(upgrading && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    headers.remove(&PROXY_CONNECTION);
    if upgrading {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    upgrading
}

/// The protocol names (without their versions, in lower case) a message's `Upgrade`
/// lists.
fn protocol_names(headers: &HeaderMap) -> Vec<Vec<u8>> {
    headers
        .get_all(header::UPGRADE)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(|p| {
            let name = p.split(|&b| b == b'/').next().unwrap_or_default();
            name.trim_ascii().to_ascii_lowercase()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// Whether a message asking to upgrade (`Connection: upgrade`) names protocols in
/// `Upgrade` that may be tunnelled: any but `h2c`.
fn tunnelled(headers: &HeaderMap) -> bool {
    let mut offered = headers.get_all(header::UPGRADE).iter().peekable();
    offered.peek().is_some()
        && !offered.any(|v| {
            v.as_bytes()
                .split(|&b| b == b',')
                .any(|p| p.trim_ascii().eq_ignore_ascii_case(b"h2c"))
        })
}

/// This instance in `Via` (RFC 9110 §7.6.3: a gateway names itself in each request
/// it forwards): a pseudonym drawn when the forwarder is built, so that a request that
/// comes back through it (an upstream that leads back to rocgate, directly or through
/// other proxies) is recognised as a forwarding loop rather than forwarded again until
/// connections run out.
#[derive(Debug)]
pub(crate) struct Via {
    /// `rocgate-` and 16 random hex digits.
    pseudonym: String,
    /// `1.0 rocgate-…`, `1.1 rocgate-…` and `2 rocgate-…`: this hop's entry, by the
    /// protocol version the client spoke.
    entries: [HeaderValue; 3],
}

impl Via {
    pub(crate) fn new() -> Self {
        let pseudonym = format!("rocgate-{:016x}", fastrand::u64(..));
        let entry = |version: &'static str| {
            // Digits, letters and a space: always a valid header value.
            HeaderValue::from_str(&format!("{version} {pseudonym}"))
                .unwrap_or(HeaderValue::from_static("1.1 rocgate"))
        };
        Via {
            entries: [entry("1.0"), entry("1.1"), entry("2")],
            pseudonym,
        }
    }

    /// This hop's entry for a request the client sent in `version`.
    fn entry(&self, version: Version) -> &HeaderValue {
        match version {
            Version::HTTP_10 => &self.entries[0],
            Version::HTTP_2 => &self.entries[2],
            _ => &self.entries[1],
        }
    }

    /// Whether the request has come through this instance before.
    pub(crate) fn came_through(&self, headers: &HeaderMap) -> bool {
        let me = self.pseudonym.as_bytes();
        headers
            .get_all(header::VIA)
            .iter()
            .any(|v| v.as_bytes().windows(me.len()).any(|w| w == me))
    }
}

/// Why a request cannot be forwarded, known from its head alone: `rocgate serve`
/// asks before admission, so such a request spends none of its route's tokens, and
/// the forwarder asks again for whoever calls it directly.
fn refusal(req: &Request<Incoming>, max_body_bytes: u64, via: &Via) -> Option<ProxyError> {
    let (method, headers) = (req.method(), req.headers());
    // A tunnel is not forwarding: sent on, it would ask the upstream for one to
    // itself, and no route's limit would hold it (its target has no path).
    if method == http::Method::CONNECT {
        return Some(ProxyError::Unforwardable(
            "CONNECT is not forwarded: rocgate is a reverse proxy, not a forward proxy",
        ));
    }
    // A target in authority form (`shop.example:80`) is CONNECT's alone, and `*`
    // OPTIONS's (RFC 9112 §3.2.3, §3.2.4): no request for a resource of the upstream.
    let uri = req.uri();
    if uri.scheme().is_none() && uri.authority().is_some() {
        return Some(ProxyError::Unforwardable(
            "a target in authority form (host:port) is CONNECT's alone (RFC 9112 §3.2.3)",
        ));
    }
    if uri.path() == "*" && method != http::Method::OPTIONS {
        return Some(ProxyError::Unforwardable(
            "the target * is OPTIONS's alone (RFC 9112 §3.2.4)",
        ));
    }
    let scan = HeadScan::of(headers);
    if let Some(why) = host_problem(req.version(), uri, &scan) {
        return Some(ProxyError::Unforwardable(why));
    }
    if scan.via && via.came_through(headers) {
        return Some(ProxyError::ForwardingLoop);
    }
    // hyper takes the chunked coding off and hands over what is under it: forwarded,
    // `gzip, chunked` would reach the upstream as gzip's bytes taken for the content,
    // and `chunked, chunked` as the inner chunks' framing.
    if scan.transfer_encoding && !chunked_only(headers) {
        return Some(ProxyError::TransferCodingNotImplemented);
    }
    // A declared `Content-Length` (hyper has parsed it, and refused a malformed one)
    // is the body's size, exact, without a second header lookup.
    (req.body().size_hint().lower() > max_body_bytes).then_some(ProxyError::BodyTooLarge)
}

/// What is wrong with a request's `Host` fields, if anything (RFC 9112 §3.2: a server
/// MUST answer it 400), as the proxy ([`refusal`]) and the admin API refuse it.
pub(crate) fn host_refusal(
    version: http::Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Option<&'static str> {
    host_problem(version, uri, &HeadScan::of(headers))
}

/// What is wrong with the `Host` fields `scan` found in a request of `version` for
/// `uri`. Two `Host`s are refused: a proxy in front that reads the other one would
/// route or cache by another host than the upstream sees. So is one `Host` holding a
/// comma (`a.example,b.example`), the shape two `Host` fields take merged into one
/// line (RFC 9110 §5.3), as a client or a proxy in front may write them: RFC 3986's
/// `reg-name` takes a comma among its sub-delims, but no host name holds one (RFC
/// 1123), and the one that keeps the first host and the one that reads the line see
/// two. Jetty refuses it (400 "Bad Host"); nginx and Envoy check a `Host`'s characters
/// only and pass it on. Like two fields, it is refused in HTTP/1.0 and beside a target
/// in absolute form. So is a target whose host (past any userinfo) holds one, in
/// absolute form or HTTP/2's `:authority`: that host is the one sent up as `Host`
/// (RFC 9112 §3.2.2), so the upstream would read the comma refused in `Host`. So is
/// an HTTP/1.1 request
/// that names no host in `Host`, whatever its target: forwarded, it went up with the
/// upstream's own `Host`, for a host the client never named, and a target in absolute
/// form replaces the `Host` it must carry, not its absence (RFC 9112 §3.2.2). HTTP/1.0
/// needs none, and HTTP/2 names the host in `:authority`. A `Host` that is no
/// `host[:port]` is refused where it is the request's host: in absolute form the
/// target's replaces it. Forwarded, `shop.example@evil.example` told an upstream that
/// builds links from `Host` (or `X-Forwarded-Host`) of a host a browser reads as
/// `evil.example`.
fn host_problem(version: http::Version, uri: &Uri, scan: &HeadScan<'_>) -> Option<&'static str> {
    match scan.hosts {
        2 => return Some("two Host fields: a request names one host (RFC 9112 §3.2)"),
        1 if scan.host.is_some_and(|h| h.as_bytes().contains(&b',')) => {
            return Some(
                "a Host field holding a comma, as two Host fields merged: \
                 a request names one host (RFC 9112 §3.2)",
            )
        }
        0 if version == http::Version::HTTP_11 => {
            return Some("no Host field: an HTTP/1.1 request names its host (RFC 9112 §3.2)")
        }
        _ => {}
    }
    let target_host = uri.authority().map(|a| {
        let a = a.as_str();
        a.rsplit_once('@').map_or(a, |(_, host)| host)
    });
    if target_host.is_some_and(|h| h.contains(',')) {
        return Some(
            "a target whose host holds a comma, as two hosts: a request names one host (RFC 9112 §3.2)",
        );
    }
    (target_host.is_none() && scan.host.is_some_and(|h| !names_a_host(h.as_bytes())))
        .then_some("a Host field that is no host[:port] (RFC 9112 §3.2)")
}

/// Whether `host`, a `Host` value, is `uri-host [":" port]` (RFC 9110 §7.2) with a
/// host: an IP literal in brackets, or a name of URI characters (RFC 3986 §3.2.2's
/// `reg-name`, an IPv4 address among them), never empty; then, after a colon, digits
/// only. A userinfo (`@`), a path (`/`), whitespace and bytes beyond ASCII are none of
/// these.
fn names_a_host(host: &[u8]) -> bool {
    let (name, port) = match host.first() {
        Some(b'[') => match host.iter().position(|&b| b == b']') {
            Some(end) => (&host[1..end], &host[end + 1..]),
            None => return false,
        },
        _ => host.split_at(host.iter().position(|&b| b == b':').unwrap_or(host.len())),
    };
    let in_brackets = host.first() == Some(&b'[');
    !name.is_empty()
        && name.iter().all(|&b| {
            matches!(b,
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9'
                | b'-' | b'.' | b'_' | b'~' | b'%'
                | b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
            ) || (in_brackets && b == b':')
        })
        && match port.split_first() {
            None => true,
            Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
            Some(_) => false,
        }
}

/// Whether a message's `Transfer-Encoding`, if it has one, names `chunked` alone, once:
/// the one coding hyper takes off. Under any other, or under `chunked` applied twice
/// (`chunked, chunked`, which RFC 9112 §6.1 forbids a sender), the body hyper hands
/// over is still coded, and with `Transfer-Encoding` stripped (hop by hop) the next hop
/// would take it for the content.
fn chunked_only(headers: &HeaderMap) -> bool {
    let mut codings = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','));
    match (codings.next(), codings.next()) {
        (None, _) => true,
        (Some(coding), None) => coding.trim_ascii().eq_ignore_ascii_case(b"chunked"),
        (Some(_), Some(_)) => false,
    }
}

/// A client request rewritten for the upstream ([`Inner::rewrite`]): the request, the
/// progress of its body if it has one, and the client connection's hand-over if it is
/// an upgrade request.
type Rewritten = (Request<Body>, Option<Arc<BodyProgress>>, Option<OnUpgrade>);

/// What [`Inner::prepare`] makes of a client request.
enum Prepared {
    /// Ready for the upstream.
    Outgoing(Outgoing),
    /// Answered without the upstream: refused, or given no place under
    /// `max_upstream_requests`.
    Answered(Response<Body>),
}

/// A request ready for the upstream, and what its exchange with the upstream needs
/// ([`Inner::exchange`]).
struct Outgoing {
    req: Request<Body>,
    progress: Option<Arc<BodyProgress>>,
    /// The client connection's hand-over, for an upgrade request.
    upgrade: Option<OnUpgrade>,
    /// Its place under `max_upstream_requests`: held by its response body or its
    /// tunnel, or given up with a failure.
    place: tokio::sync::OwnedSemaphorePermit,
    route: Arc<str>,
    /// The client request's version.
    version: Version,
    /// Whether it goes on the client connection's lane.
    on_lane: bool,
}

/// Forwards requests to the upstream. Cloning is one reference count (two for the
/// forwarder of one client connection): the connection pool and settings are shared.
/// Only the forwarder of a client connection (`rocgate serve`'s) forwards upgrades;
/// called directly, it strips `Upgrade` as any hop-by-hop header.
#[derive(Clone, Debug)]
pub struct Forwarder {
    inner: Arc<Inner>,
    /// The client connection this forwarder serves, if it serves one.
    connection: Option<Arc<Connection>>,
}

/// What the forwarder keeps of one client connection, for all its requests: its lane,
/// its peer, the route of the request being called, and the upstream latency
/// histogram it recorded into last.
struct Connection {
    lane: Lane,
    /// Where the connection's admission service puts the route of the request it is
    /// calling the forwarder with ([`Forwarder::route_slot`]).
    route: Arc<RouteSlot>,
    /// The response timeout of the lane's requests.
    timer: Mutex<LaneTimer>,
    peer: Peer,
    /// The route and status class of the histogram its last request recorded into,
    /// and that histogram's handle: the next request on the same route, with the same
    /// class, records into it without looking the labels up again.
    durations: Mutex<Option<(Arc<str>, &'static str, metrics::Histogram)>>,
}

impl Connection {
    /// A connection from `peer` whose HTTP/1.1 requests go through `lane`.
    fn new(lane: Lane, peer: IpAddr, forwards: bool) -> Self {
        Connection {
            lane,
            route: Arc::default(),
            timer: Mutex::new(LaneTimer::new()),
            peer: Peer {
                forwards,
                ..Peer::new(peer)
            },
            durations: Mutex::new(None),
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer.ip)
            .finish_non_exhaustive()
    }
}

/// A client connection's peer: its address, and that address as `X-Forwarded-For`
/// writes it (built once per connection, not once per request).
struct Peer {
    ip: IpAddr,
    /// The canonical address (a dual-stack listener's IPv4 clients are mapped,
    /// `::ffff:1.2.3.4`: written as IPv4), as a header value.
    header: HeaderValue,
    /// Whether its forwarding headers are passed on if it is a trusted proxy: not if
    /// its PROXY protocol header named no client (what it sends is its relayed
    /// client's, as that client wrote it).
    forwards: bool,
}

impl Peer {
    fn new(ip: IpAddr) -> Peer {
        let text = ip.to_canonical().to_string();
        Peer {
            ip,
            // Digits, dots, colons and hex letters: always a valid value.
            header: HeaderValue::from_maybe_shared(Bytes::from(text))
                .expect("an IP address is a valid header value"),
            forwards: true,
        }
    }
}

struct Inner {
    client: Client<HttpConnector, Body>,
    settings: ForwardSettings,
    scheme: Scheme,
    authority: Authority,
    clock: Arc<dyn Clock>,
    in_flight: Arc<AtomicI64>,
    meter: Arc<UpstreamMeter>,
    /// Upstream connections held by client connections' lanes.
    lanes: LaneCount,
    /// Connects lanes to the upstream (the pool has its own clone).
    connector: HttpConnector,
    /// `Host` for requests that carry none (the legacy client's default too).
    upstream_host: Option<HeaderValue>,
    /// This instance's `Via` entry.
    via: Arc<Via>,
    /// Failures of the upstream, logged at most once every [`FAILURE_LOG_EVERY`]
    /// (shared with the response bodies on their way, which can fail too).
    failures: Arc<FailureLog>,
    /// The places of requests in flight to the upstream: `max_upstream_requests`.
    upstream_requests: UpstreamRequests,
    /// Requests refused for want of a place, logged at most once every
    /// [`FAILURE_LOG_EVERY`].
    overflows: Throttled,
    /// The engine whose routes' partition headers are kept when a request names them
    /// in `Connection` (`rocgate serve`'s: see [`Forwarder::keeping_keys_of`]).
    keys: Option<SharedEngine>,
}

/// How often at most a failing upstream is logged.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(10);

/// Events counted, to be logged at most once every [`FAILURE_LOG_EVERY`] with the
/// count since the last line: one line per event would flood the log.
struct Throttled {
    clock: Arc<dyn Clock>,
    /// Events not yet logged.
    unlogged: AtomicU64,
    /// When the last was logged, in nanoseconds plus one (0: never).
    logged_at: AtomicU64,
}

impl Throttled {
    fn new(clock: Arc<dyn Clock>) -> Self {
        Throttled {
            clock,
            unlogged: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
        }
    }

    /// Counts an event; returns the events since the last line (this one included)
    /// if a line is due now, which the caller logs.
    fn count(&self) -> Option<u64> {
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        let now = self.clock.now();
        let last = self.logged_at.load(Ordering::Relaxed);
        let due = last == 0
            || now.as_u64().saturating_sub(last - 1) >= FAILURE_LOG_EVERY.as_nanos() as u64;
        let stamp = now.as_u64().saturating_add(1);
        if !due
            || self
                .logged_at
                .compare_exchange(last, stamp, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        Some(self.unlogged.swap(0, Ordering::Relaxed))
    }
}

/// The upstream's failures since the last one logged, and when that was: an upstream
/// that is down fails every request, and one line per request would flood the log.
struct FailureLog {
    upstream: Authority,
    log: Throttled,
}

impl FailureLog {
    fn new(upstream: Authority, clock: Arc<dyn Clock>) -> Self {
        FailureLog {
            upstream,
            log: Throttled::new(clock),
        }
    }

    /// Counts a failed request on `route`, and logs it with the failures since the
    /// last line if that was [`FAILURE_LOG_EVERY`] ago.
    fn failed(&self, route: &str, e: &ProxyError) {
        self.failed_as(route, e.kind(), Some(e.status()), &e.detail());
    }

    /// [`failed`](Self::failed), for a failure of `kind` described by `detail`;
    /// `status` is what the client was answered, if the failure decided it.
    fn failed_as(&self, route: &str, kind: &str, status: Option<http::StatusCode>, detail: &str) {
        let Some(failures) = self.log.count() else {
            return;
        };
        tracing::warn!(
            upstream = %self.upstream,
            route,
            kind,
            status = status.map(|s| s.as_u16()),
            failures,
            "upstream request failed: {detail} (failures counts those since the last such line, at most one every {}s)",
            FAILURE_LOG_EVERY.as_secs(),
        );
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Forwarder {
    /// A forwarder with its own connection pool, timing upstream requests with
    /// `clock`, counting requests in flight in `in_flight` and recording each
    /// upstream outcome in `meter` (for the tuning hints).
    pub fn new(
        settings: ForwardSettings,
        clock: Arc<dyn Clock>,
        in_flight: Arc<AtomicI64>,
        meter: Arc<UpstreamMeter>,
    ) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(settings.connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(settings.upstream_idle_timeout)
            .pool_max_idle_per_host(1024)
            .build(connector.clone());
        let lanes = LaneCount::new(settings.max_upstream_lanes);
        let scheme = settings.upstream.scheme().cloned().unwrap_or(Scheme::HTTP);
        let authority = settings
            .upstream
            .authority()
            .cloned()
            .unwrap_or_else(|| Authority::from_static("127.0.0.1:80"));
        let failures = Arc::new(FailureLog::new(authority.clone(), Arc::clone(&clock)));
        let upstream_requests = UpstreamRequests::new(settings.max_upstream_requests);
        let overflows = Throttled::new(Arc::clone(&clock));
        Forwarder {
            inner: Arc::new(Inner {
                client,
                upstream_host: HeaderValue::from_str(authority.as_str()).ok(),
                settings,
                scheme,
                authority,
                clock,
                in_flight,
                meter,
                lanes,
                connector,
                via: Arc::new(Via::new()),
                failures,
                upstream_requests,
                overflows,
                keys: None,
            }),
            connection: None,
        }
    }

    /// This forwarder, before any clone of it is made, keeping in each request the
    /// header a route of `engine` (the one in force at the time) is partitioned by,
    /// even where the request names it in `Connection`: the admission layer in front
    /// keyed the request by it, and the upstream must read the same key. A forwarder
    /// already cloned is returned as it is.
    pub(crate) fn keeping_keys_of(mut self, engine: SharedEngine) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.keys = Some(engine);
        }
        self
    }

    /// This instance's name in `Via`, to know a request that came through it.
    pub(crate) fn via(&self) -> Arc<Via> {
        Arc::clone(&self.inner.via)
    }

    /// Why `req` cannot be forwarded, known from its head alone (a tunnel, a target in
    /// a form its method cannot take, two `Host`s, an HTTP/1.1 request with none or a
    /// `Host` that is no `host[:port]`, a transfer coding besides chunked, a declared body over `max_body_bytes`, a
    /// forwarding loop): asked before admission, so that such a request spends no
    /// token.
    pub(crate) fn refusal(&self, req: &Request<Incoming>) -> Option<ProxyError> {
        refusal(req, self.inner.settings.max_body_bytes, &self.inner.via)
    }

    /// This forwarder for the client connection from `peer`, whose forwarding headers
    /// are passed on if it is a trusted proxy and it `forwards` (not a load balancer
    /// whose PROXY protocol header named no client): its HTTP/1.1 requests get
    /// an upstream connection of their own (a [`Lane`]), polled by the returned driver,
    /// which must run beside the client connection, in its task.
    pub(crate) fn for_connection(&self, peer: SocketAddr, forwards: bool) -> (Forwarder, Driver) {
        let (lane, driver) = Lane::new();
        let forwarder = Forwarder {
            inner: Arc::clone(&self.inner),
            connection: Some(Arc::new(Connection::new(lane, peer.ip(), forwards))),
        };
        (forwarder, driver)
    }

    /// Where the admission service of this forwarder's client connection puts the route
    /// of each request it calls the forwarder with at once, taken as the forwarder is
    /// called by a request that carries no [`MatchedRoute`] ([`RouteSlot::route_of`]);
    /// `None` for a forwarder that serves no one connection.
    pub(crate) fn route_slot(&self) -> Option<Arc<RouteSlot>> {
        self.connection.as_ref().map(|c| Arc::clone(&c.route))
    }

    /// The count of upstream connections held by client connections' lanes.
    pub(crate) fn lanes(&self) -> LaneCount {
        self.inner.lanes.clone()
    }

    /// The places of requests in flight to the upstream, for `/metrics`.
    pub(crate) fn upstream_requests(&self) -> UpstreamRequests {
        self.inner.upstream_requests.clone()
    }
}

/// The places of requests in flight to the upstream: `max_upstream_requests` of them,
/// taken without waiting. Cloning shares them.
#[derive(Clone, Debug)]
pub(crate) struct UpstreamRequests {
    places: Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl UpstreamRequests {
    /// `max` places (at least 1, at most what a semaphore counts).
    pub(crate) fn new(max: usize) -> Self {
        let max = max.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        UpstreamRequests {
            places: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        }
    }

    /// A place, held until dropped; none if every one is taken.
    fn try_take(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        Arc::clone(&self.places).try_acquire_owned().ok()
    }

    /// Requests holding a place now.
    pub(crate) fn held(&self) -> usize {
        self.max.saturating_sub(self.places.available_permits())
    }

    /// The places there are: `max_upstream_requests` (as clamped by [`new`](Self::new)).
    pub(crate) fn max(&self) -> usize {
        self.max
    }
}

impl Inner {
    /// Rewrites a client request from `peer` into the upstream request, with the
    /// progress of its body if it has one. A request not yet `checked` for a
    /// [`refusal`] is checked here. With `upgrades` (a client connection served by
    /// `rocgate serve`), an HTTP/1.1 upgrade request keeps its `Upgrade`, and the
    /// client connection's hand-over is returned with it.
    fn rewrite(
        &self,
        req: Request<Incoming>,
        peer: Option<&Peer>,
        checked: bool,
        upgrades: bool,
    ) -> Result<Rewritten, ProxyError> {
        let max = self.settings.max_body_bytes;
        if !checked {
            if let Some(refused) = refusal(&req, max, &self.via) {
                return Err(refused);
            }
        }
        let (mut parts, body) = req.into_parts();
        let HeadScan {
            host,
            hop_by_hop,
            forwarding,
            expect,
            ..
        } = HeadScan::of(&parts.headers);
        let host = host.cloned();
        // The target's host and port win over `Host` (RFC 9112 §3.2.2; HTTP/2's
        // `:authority`), which a request in origin form carries alone. A userinfo
        // (credentials) is no part of them.
        let target_host = parts
            .uri
            .authority()
            .map(|a| {
                a.as_str()
                    .rsplit_once('@')
                    .map_or(a.as_str(), |(_, host)| host)
            })
            .and_then(|host| HeaderValue::from_str(host).ok());
        // `Host` is set again unless it is the client's own (a request has one at most:
        // see `refusal`), which it would replace with itself.
        let set_host = target_host.is_some() || host.is_none();
        let original_host = target_host.or(host);
        let mut upgrade = None;
        if hop_by_hop {
            // `TE` is this hop's, but its `trailers` says the client takes trailer
            // fields, without which an upstream may send none (hyper does not): passed
            // on alone, as Envoy does.
            let takes_trailers = parts.headers.get_all(header::TE).iter().any(|v| {
                v.as_bytes()
                    .split(|&b| b == b',')
                    .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers"))
            });
            // hyper hands over a connection it read an HTTP/1.1 `Upgrade` on.
            let upgrades = upgrades && parts.version == Version::HTTP_11;
            // The header a route of the engine in force is partitioned by was the
            // request's key: named as a connection option, it still goes on, so that
            // the upstream reads the key the request was limited by. Stripped, a
            // fresh key a request (and `Connection` naming it) had a fresh quota each
            // time, and reached the upstream as a request with no key at all.
            let engine = self.keys.as_ref().map(SharedEngine::load);
            // `Host` is end to end and HTTP/1.1 requires it (RFC 9112 §3.2): named as
            // a connection option, it stays. Stripped, the request went up with the
            // upstream's own `Host` through the pool, and with none at all over a lane.
            // So do the forwarding headers, which `set_forwarded` keeps or replaces by
            // who the peer is: a client behind a trusted proxy that passes its
            // `Connection` on would otherwise strip the chain and the scheme the proxy
            // wrote (Traefik's CVE-2024-45410). (A response's are stripped: nothing
            // rewrites them.)
            let kept = |name: &HeaderName| {
                name == header::HOST
                    || is_forwarding(name)
                    || engine
                        .as_deref()
                        .is_some_and(|engine| engine.keys_by_header(name.as_str()))
            };
            if remove_hop_by_hop(&mut parts.headers, upgrades, kept) {
                upgrade = parts.extensions.remove::<OnUpgrade>();
                if upgrade.is_none() {
                    parts.headers.remove(header::UPGRADE);
                    parts.headers.remove(header::CONNECTION);
                }
            }
            if takes_trailers {
                parts
                    .headers
                    .insert(header::TE, HeaderValue::from_static("trailers"));
            }
        }
        // rocgate answers `Expect: 100-continue` itself: hyper sends the client its
        // `100 Continue` once the body is asked for, after admission. The upstream is
        // not asked for another (its 100 would stop at rocgate's client connection,
        // which sends the body without waiting for it), as Envoy strips it.
        if expect
            && parts
                .headers
                .get(header::EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
        {
            parts.headers.remove(header::EXPECT);
        }
        if parts.version == Version::HTTP_2 {
            join_cookies(&mut parts.headers);
            // The h2 crate takes a `content-length` repeated on field lines of equal
            // values, which HTTP/1.1 would send on as lines an upstream may refuse
            // (llhttp's does); hyper's HTTP/1 server keeps one line itself.
            one_content_length(&mut parts.headers);
        }
        self.set_forwarded(&mut parts.headers, peer, original_host.as_ref(), forwarding);
        parts
            .headers
            .append(header::VIA, self.via.entry(parts.version).clone());
        // HTTP/1.1 requires a Host: the client's, or else the upstream's.
        if set_host {
            if let Some(host) = original_host.or_else(|| self.upstream_host.clone()) {
                parts.headers.insert(header::HOST, host);
            }
        }
        // The request goes upstream in origin form (the path alone): a lane's
        // connection goes to the origin itself, and the pool is given the upstream's
        // scheme and authority (`send_pooled`).
        if parts.uri.scheme().is_some() || parts.uri.authority().is_some() {
            parts.uri = Uri::from(origin_form(&parts.uri));
        }
        if self.settings.normalize_path {
            if let Some(normalized) = normalized_target(&parts.uri) {
                parts.uri = normalized;
            }
        }
        parts.version = Version::HTTP_11;
        if body.is_end_stream() {
            // No body (most GETs): nothing to limit, nothing to time, nothing to box.
            return Ok((Request::from_parts(parts, Body::empty()), None, upgrade));
        }
        // A body of no declared length (chunked, or HTTP/2's DATA frames without
        // `content-length`) goes on chunked, which hyper's client assumes for every
        // method but GET, HEAD and CONNECT: it sends those with no body at all unless
        // told, and the upstream got a GET without its body (Elasticsearch's
        // `GET /_search` taking its query so).
        if body.size_hint().exact().is_none() {
            parts.headers.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        }
        let progress = Arc::new(BodyProgress::new());
        let body = match usize::try_from(max) {
            Ok(max) => Body::new(TimedBody {
                body: Limited::new(body, max),
                progress: Arc::clone(&progress),
            }),
            Err(_) => Body::new(TimedBody {
                body,
                progress: Arc::clone(&progress),
            }),
        };
        Ok((Request::from_parts(parts, body), Some(progress), upgrade))
    }

    /// The forwarding headers a trusted proxy writes are those of its kind, the one
    /// `client_ip_header` names: with `x-forwarded-for`, `X-Forwarded-For` and the
    /// other `X-Forwarded-*` and `X-Real-IP` (nginx, Envoy); with `forwarded`, RFC
    /// 7239's `Forwarded` (HAProxy's `option forwarded`). Those are kept from a trusted
    /// proxy and extended with this hop: the `X-Forwarded-For` chain with the peer,
    /// `Forwarded` with `for=` the peer and `proto=http` (rocgate adds no `Forwarded`
    /// of its own where the request had none). The other kind, which such a proxy
    /// passes on as its client wrote it (nginx passes `Forwarded` on, HAProxy
    /// `X-Forwarded-For`), and every forwarding header ([`is_forwarding`]) from an
    /// untrusted peer, are dropped, so that no client can choose what the upstream
    /// reads of it; `X-Forwarded-For` (the peer alone), `-Proto` (`http`) and `-Host`
    /// are then set by rocgate. `any` says whether the request carries any forwarding
    /// header ([`HeadScan`]).
    fn set_forwarded(
        &self,
        headers: &mut HeaderMap,
        peer: Option<&Peer>,
        host: Option<&HeaderValue>,
        any: bool,
    ) {
        let trusted = peer.is_some_and(|p| p.forwards && self.settings.resolver.is_trusted(p.ip));
        let forwarded_kind = self.settings.resolver.header() == ClientIpHeader::Forwarded;
        // The kind a trusted proxy writes, kept; the other is its client's.
        let (keep_x, keep_forwarded) = (trusted && !forwarded_kind, trusted && forwarded_kind);
        // One buffer, handed to the header value without a copy. Bytes, since a value
        // may hold bytes beyond ASCII: the chain is passed on as received.
        let mut chain = Vec::new();
        if keep_x && any {
            for v in headers.get_all(&X_FORWARDED_FOR) {
                if !chain.is_empty() {
                    chain.extend_from_slice(b", ");
                }
                chain.extend_from_slice(v.as_bytes());
            }
        }
        if any {
            if keep_x {
                headers.remove(&X_FORWARDED_FOR);
                headers.remove(&FORWARDED);
                // A CDN's header names the client only where that CDN is the trusted
                // proxy; nginx or Envoy in front pass on the one their client wrote.
                for name in CDN_CLIENT_ADDRESS {
                    headers.remove(name);
                }
            } else {
                let names: Vec<HeaderName> = headers
                    .keys()
                    .filter(|n| is_forwarding(n) && !(keep_forwarded && *n == FORWARDED))
                    .cloned()
                    .collect();
                for name in &names {
                    headers.remove(name);
                }
            }
        }
        if let Some(Peer { ip, .. }) =
            peer.filter(|_| keep_forwarded && any && headers.contains_key(&FORWARDED))
        {
            // The trusted proxy's chain goes on with this hop (RFC 7239 §4: an IPv6
            // node is quoted and bracketed), as `X-Forwarded-For` does.
            let element = match ip.to_canonical() {
                std::net::IpAddr::V4(v4) => format!("for={v4};proto=http"),
                std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\";proto=http"),
            };
            if let Ok(v) = HeaderValue::from_str(&element) {
                headers.append(FORWARDED.clone(), v);
            }
        }
        match peer {
            // The peer alone (most requests): its value is shared, not built.
            Some(peer) if chain.is_empty() => {
                headers.insert(X_FORWARDED_FOR.clone(), peer.header.clone());
            }
            Some(peer) => {
                chain.extend_from_slice(b", ");
                chain.extend_from_slice(peer.header.as_bytes());
            }
            None => {}
        }
        if !chain.is_empty() {
            if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(chain)) {
                headers.insert(X_FORWARDED_FOR.clone(), v);
            }
        }
        // Behind a trusted proxy of `Forwarded`, the scheme is the one its element
        // says (`proto=https` where it terminated TLS): `http` here would be wrong.
        if keep_forwarded {
            headers.remove(&X_FORWARDED_PROTO);
        } else if !(keep_x && any && headers.contains_key(&X_FORWARDED_PROTO)) {
            headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static("http"));
        }
        if !(keep_x && any && headers.contains_key(&X_FORWARDED_HOST)) {
            match host {
                Some(h) => {
                    headers.insert(X_FORWARDED_HOST.clone(), h.clone());
                }
                None if any => {
                    headers.remove(&X_FORWARDED_HOST);
                }
                None => {}
            }
        }
    }

    /// Readies one request, of `connection` if the forwarder serves one, admitted on
    /// `route` (`None`: on no route), for the upstream: rewritten, with its place
    /// under `max_upstream_requests`. Done when the forwarder is called, so that the
    /// client's request is no part of the future that waits for the upstream (boxed
    /// for every request: the smaller, the cheaper). A request that cannot go gets its
    /// answer.
    fn prepare(
        &self,
        req: Request<Incoming>,
        connection: Option<&Connection>,
        route: Option<Arc<str>>,
    ) -> Prepared {
        let route = route.unwrap_or_else(|| Arc::from(crate::config::UNMATCHED_ROUTE));
        // HTTP/1 requests come one after another on a connection: from the second
        // one on they go through the connection's own lane (HTTP/2 streams run side
        // by side and share the pool).
        let version = req.version();
        let on_lane = connection.is_some_and(|c| version <= Version::HTTP_11 && c.lane.enter());
        let own_peer;
        let peer = match connection {
            Some(c) => Some(&c.peer),
            None => {
                own_peer = req
                    .extensions()
                    .get::<PeerAddr>()
                    .map(|p| Peer::new(p.0.ip()));
                own_peer.as_ref()
            }
        };
        // A connection's forwarder serves `rocgate serve`, which asked for a refusal
        // before admission; one called directly has its requests checked here.
        // Only `rocgate serve` runs tunnels: it serves the connection, and takes the
        // tunnel from the 101's extensions.
        let (req, progress, upgrade) =
            match self.rewrite(req, peer, connection.is_some(), connection.is_some()) {
                Ok(rewritten) => rewritten,
                Err(e) => return Prepared::Answered(self.failed(route, e)),
            };
        // Taken after admission, never waited for: at the cap the upstream has all it
        // may be sent, and a request kept waiting would hold its client.
        let Some(place) = self.upstream_requests.try_take() else {
            return Prepared::Answered(self.overflowed(route));
        };
        Prepared::Outgoing(Outgoing {
            req,
            progress,
            // An upgrade goes over an upstream connection of its own: the tunnel
            // takes that connection over, so it must come from no pool or lane.
            on_lane: on_lane && upgrade.is_none(),
            upgrade,
            place,
            route,
            version,
        })
    }

    /// Sends a request [`prepare`](Self::prepare)d on `connection` (if the forwarder
    /// serves one) and answers it with the upstream's response; every failure becomes
    /// a response. Records the upstream duration by route and status class, and
    /// failures by kind. The forwarder boxes this future for every request: it holds
    /// `out` once (called at the first poll of a future holding the client's request,
    /// the forwarding held the request twice, in 2.9 KB). Written out rather than as
    /// an `async fn`, whose future cost about 250 instructions more per request.
    #[allow(clippy::manual_async_fn)] // see above
    fn exchange(
        self: Arc<Self>,
        connection: Option<Arc<Connection>>,
        out: Outgoing,
    ) -> impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static {
        async move {
            let this = &*self;
            let connection = connection.as_deref();
            let Outgoing {
                progress,
                upgrade,
                place,
                route,
                version,
                on_lane,
                ..
            } = out;
            let _in_flight = InFlight::enter(&this.in_flight);
            let started = this.clock.now();
            let timeout = this.settings.response_timeout;
            let offered = upgrade.as_ref().map(|_| protocol_names(out.req.headers()));
            let result = match connection.filter(|_| on_lane) {
                Some(c) => {
                    // Pinned where it is made: a `Deadline` holding the future itself
                    // was moved whole three times on its way to its first poll.
                    let sent = std::pin::pin!(this.send_on_lane(&c.lane, out.req, started));
                    Deadline {
                        inner: sent,
                        at: tokio::time::Instant::now() + timeout,
                        timeout,
                        progress: progress.as_deref(),
                        timer: &c.timer,
                    }
                    .await
                }
                None => {
                    let sent = if upgrade.is_some() {
                        this.send_upgrade(out.req)
                    } else {
                        this.send_pooled(out.req)
                    };
                    within_response_timeout(sent, timeout, progress.as_deref()).await
                }
            };
            // A 101 to a request that asked for no upgrade has nothing to switch
            // to: a failure of the upstream's, logged and counted as one. A body
            // still under a coding rocgate does not decode cannot go on without
            // its `Transfer-Encoding`, a hop-by-hop header. (`Transfer-Encoding`
            // is hop-by-hop: a response with none of those has none, and needs no
            // lookup.)
            // A 101 must name what it switches to, among the protocols the client
            // offered (RFC 9110 §7.8, §15.2.2): anything else would leave the
            // client speaking one protocol to an upstream that speaks another.
            let result = result.and_then(|res| {
                let switching = res.status() == http::StatusCode::SWITCHING_PROTOCOLS;
                if switching && upgrade.is_none() {
                    Err(ProxyError::upstream(
                        "a 101 to a request that did not upgrade",
                    ))
                } else if switching
                    && offered.as_ref().is_some_and(|offered| {
                        let chosen = protocol_names(res.headers());
                        chosen.is_empty() || !chosen.iter().all(|p| offered.contains(p))
                    })
                {
                    Err(ProxyError::upstream(
                        "a 101 switching to no protocol the client offered",
                    ))
                } else if !any_hop_by_hop(res.headers()) || chunked_only(res.headers()) {
                    Ok(res)
                } else {
                    Err(ProxyError::upstream(
                        "the response body has a transfer coding besides chunked",
                    ))
                }
            });
            // The upstream's time: less the client's, sending its body.
            let took = this.clock.now().saturating_since(started);
            let took = progress.map_or(took, |p| took.saturating_sub(p.sent_in()));
            // A response timeout is latency too: without it, an upstream that only
            // times out would leave the latency alert silent.
            let class = match &result {
                Ok(res) => Some(status_class(res.status())),
                Err(ProxyError::ResponseTimeout) => Some("timeout"),
                Err(_) => None,
            };
            if let Some(class) = class {
                record_duration(connection, &route, class, took.as_secs_f64());
            }
            // A request the client cut short, or made too large, says nothing of
            // the upstream's health (nor, its time being the client's, of its latency).
            let failed = match &result {
                Ok(r) => Some(r.status().is_server_error()),
                Err(e) => e.is_upstream_failure().then_some(true),
            };
            if let Some(failed) = failed {
                this.meter.record(&route, took, failed);
            }
            Ok(match result {
                Ok(res) if res.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
                    let (mut parts, _) = res.into_parts();
                    let upstream = parts.extensions.remove::<OnUpgrade>();
                    // (A request that asked for none was failed above.)
                    let Some((client, upstream)) = upgrade.zip(upstream) else {
                        // hyper hands over no upstream connection: nothing to switch to.
                        let e = ProxyError::upstream("a 101 whose connection cannot be taken over");
                        this.failures.failed(&route, &e);
                        metrics::counter!(metric::UPSTREAM_ERRORS, "route" => route, "kind" => e.kind())
                            .increment(1);
                        return Ok(e.into_response());
                    };
                    // The upstream's switch, told to the client.
                    strip_but_upgrade(&mut parts.headers);
                    let mut res = Response::from_parts(parts, Body::empty());
                    let tunnel = Tunnel::new(client, upstream).holding_upstream_place(Some(place));
                    res.extensions_mut().insert(tunnel);
                    res
                }
                Ok(res) => {
                    let (mut parts, body) = res.into_parts();
                    // A 426 names the protocols it requires in its `Upgrade` (RFC 9110
                    // §15.5.22: it must), which an HTTP/1.1 client gets; HTTP/1.0 and
                    // HTTP/2 have none.
                    if parts.status == http::StatusCode::UPGRADE_REQUIRED
                        && version == Version::HTTP_11
                        && parts.headers.contains_key(header::UPGRADE)
                    {
                        strip_but_upgrade(&mut parts.headers);
                    } else {
                        strip_hop_by_hop(&mut parts.headers);
                    }
                    one_content_length(&mut parts.headers);
                    // The proxy answers in its own version: an HTTP/1.0 upstream's passed
                    // on would make hyper answer a keep-alive client in HTTP/1.0 and close
                    // its connection (hyper still answers an HTTP/1.0 client in 1.0).
                    parts.version = Version::HTTP_11;
                    let body = UpstreamBody {
                        body,
                        route,
                        timeout: this.settings.response_timeout,
                        stall: None,
                        failures: Arc::clone(&this.failures),
                        place: Some(place),
                    };
                    Response::from_parts(parts, Body::new(body))
                }
                Err(e) => this.failed(route, e),
            })
        }
    }

    /// The answer to a request on `route` that could not be forwarded, or had no
    /// response, for `e`: logged (at most once every [`FAILURE_LOG_EVERY`] for a
    /// failure of the upstream's) and counted by kind.
    fn failed(&self, route: Arc<str>, e: ProxyError) -> Response<Body> {
        tracing::debug!(error = %e, route = %route, "forwarding failed");
        if e.is_upstream_failure() {
            self.failures.failed(&route, &e);
        }
        metrics::counter!(metric::UPSTREAM_ERRORS, "route" => route, "kind" => e.kind())
            .increment(1);
        e.into_response()
    }

    /// The answer to a request on `route` that found every place under
    /// `max_upstream_requests` taken: 503 `upstream_overflow`, counted, and logged at
    /// most once every [`FAILURE_LOG_EVERY`] with the requests refused since.
    fn overflowed(&self, route: Arc<str>) -> Response<Body> {
        let e = ProxyError::UpstreamOverflow;
        if let Some(refused) = self.overflows.count() {
            tracing::warn!(
                upstream = %self.authority,
                max_upstream_requests = self.settings.max_upstream_requests,
                refused,
                "upstream request cap reached: requests answered 503 upstream_overflow \
                 without being forwarded (refused counts those since the last such line, \
                 at most one every {}s)",
                FAILURE_LOG_EVERY.as_secs(),
            );
        }
        metrics::counter!(metric::UPSTREAM_ERRORS, "route" => route, "kind" => e.kind())
            .increment(1);
        e.into_response()
    }

    /// Sends through the shared pool of upstream connections, to the upstream's scheme
    /// and authority. Boxed: the pool serves a connection's first request, and others
    /// only when a lane cannot, so its future makes no part of the lane's.
    fn send_pooled(
        &self,
        mut req: Request<Body>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Incoming>, ProxyError>> + Send + '_>> {
        Box::pin(async move {
            *req.uri_mut() = Uri::builder()
                .scheme(self.scheme.clone())
                .authority(self.authority.clone())
                .path_and_query(origin_form(req.uri()))
                .build()
                .map_err(|_| ProxyError::BadRequest)?;
            self.client
                .request(req)
                .await
                .map_err(ProxyError::from_client)
        })
    }

    /// Sends an upgrade request over an upstream connection opened for it alone, driven
    /// by a task of its own until hyper hands it over (after a 101) or it closes
    /// (after any other response, once its body is read: nothing else is sent on it).
    fn send_upgrade(
        &self,
        req: Request<Body>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Incoming>, ProxyError>> + Send + '_>> {
        Box::pin(async move {
            let stream = self.connect().await?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(stream)
                .await
                .map_err(ProxyError::upstream)?;
            tokio::spawn(async move {
                if let Err(e) = connection.with_upgrades().await {
                    tracing::debug!(error = %e, "upgrade's upstream connection ended with an error");
                }
            });
            sender.send_request(req).await.map_err(ProxyError::upstream)
        })
    }

    /// Sends on the client connection's own upstream connection at `now`, opening it
    /// if the lane has none (or only one idle too long); a request the connection
    /// could not take goes to the pool.
    async fn send_on_lane(
        &self,
        lane: &Lane,
        req: Request<Body>,
        now: Nanos,
    ) -> Result<Response<Incoming>, ProxyError> {
        let mut sender = match lane.take(now, self.settings.upstream_idle_timeout) {
            Some(sender) => sender,
            None => {
                let Some(slot) = self.lanes.acquire() else {
                    return self.send_pooled(req).await;
                };
                // Boxed, as it is rare: its future makes no part of the lane's.
                Box::pin(async {
                    let stream = self.connect().await?;
                    lane.open(stream, slot).await.map_err(ProxyError::upstream)
                })
                .await?
            }
        };
        if sender.ready().await.is_err() {
            return self.send_pooled(req).await;
        }
        match sender.try_send_request(req).await {
            Ok(res) => {
                lane.put_back(sender, self.clock.now());
                Ok(res)
            }
            Err(mut e) => match e.take_message() {
                // Not sent: the connection closed before it took the request.
                Some(req) => self.send_pooled(req).await,
                None => Err(ProxyError::upstream(e.into_error())),
            },
        }
    }

    /// A TCP connection to the upstream, made as the pool makes its own (the same
    /// connector: `connect_timeout`, no Nagle, happy eyeballs across addresses).
    async fn connect(&self) -> Result<TokioIo<TcpStream>, ProxyError> {
        self.connector
            .clone()
            .oneshot(self.settings.upstream.clone())
            .await
            .map_err(ProxyError::connecting)
    }
}

/// The timer behind the response timeout of a connection's lane requests: one per
/// connection, not one per request. Registering a timer and cancelling it cost each
/// request a lock of the runtime's timer wheel; this one is set to a request's
/// deadline only when it fires. A lane's requests come one after another, each with a
/// later deadline than the one before, so a timer set for an earlier request fires
/// early, never late: it is then set again, to the deadline of the request waiting.
/// Polled only by the connection's task (lanes serve HTTP/1 connections, whose
/// requests their task polls), so the waker registered stays current.
struct LaneTimer {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Whether the sleep has been polled, and so registered, since it was last set.
    armed: bool,
}

impl LaneTimer {
    fn new() -> Self {
        LaneTimer {
            // Fires at its first poll, which sets it to that request's deadline.
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: false,
        }
    }

    /// Ready once `at` has passed; registers the task's waker to be woken by then.
    fn poll_until(&mut self, at: tokio::time::Instant, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.armed && !self.sleep.is_elapsed() {
                return Poll::Pending;
            }
            self.armed = true;
            std::task::ready!(self.sleep.as_mut().poll(cx));
            if tokio::time::Instant::now() >= at {
                return Poll::Ready(());
            }
            self.sleep.as_mut().reset(at);
            self.armed = false;
        }
    }
}

pin_project_lite::pin_project! {
    /// `inner`, or a timeout once `at` has passed (or, for a request with a body,
    /// `timeout` after the body's last progress), on a connection's [`LaneTimer`].
    struct Deadline<'a, F> {
        #[pin]
        inner: F,
        at: tokio::time::Instant,
        timeout: Duration,
        progress: Option<&'a BodyProgress>,
        timer: &'a Mutex<LaneTimer>,
    }
}

impl<T, F: Future<Output = Result<T, ProxyError>>> Future for Deadline<'_, F> {
    type Output = Result<T, ProxyError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(result) = this.inner.poll(cx) {
            return Poll::Ready(result);
        }
        // A body's progress only moves its deadline later: the timer, set for an
        // earlier one, fires early and is set again.
        let at = this
            .progress
            .map_or(*this.at, |p| p.deadline(*this.timeout));
        let mut timer = this.timer.lock().unwrap_or_else(PoisonError::into_inner);
        timer
            .poll_until(at, cx)
            .map(|()| Err(timed_out(*this.progress)))
    }
}

/// `sent`, or a timeout `timeout` from now (or, for a request with a body, `timeout`
/// after the body's last progress).
async fn within_response_timeout<T>(
    sent: impl Future<Output = Result<T, ProxyError>>,
    timeout: Duration,
    progress: Option<&BodyProgress>,
) -> Result<T, ProxyError> {
    tokio::pin!(sent);
    let mut at = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(result) = tokio::time::timeout_at(at, sent.as_mut()).await {
            return result;
        }
        match progress.map(|p| p.deadline(timeout)) {
            Some(later) if later > tokio::time::Instant::now() => at = later,
            _ => return Err(timed_out(progress)),
        }
    }
}

/// The error of a request whose response timeout has passed: the client's, if it was
/// still to send some of its body, else the upstream's.
fn timed_out(progress: Option<&BodyProgress>) -> ProxyError {
    if progress.is_some_and(BodyProgress::waiting_for_client) {
        ProxyError::ClientTimeout
    } else {
        ProxyError::ResponseTimeout
    }
}

/// How far a request body has come on its way upstream: when a part of it (or its end)
/// last arrived from the client, and whether the upstream connection is waiting for
/// the client's next part. The response timeout counts from the later of the request's
/// head and that last arrival.
struct BodyProgress {
    /// When the request was forwarded; `last` counts from it.
    base: tokio::time::Instant,
    /// The last arrival, in nanoseconds from `base`.
    last: AtomicU64,
    /// Whether the body's last poll found nothing from the client yet.
    waiting: AtomicBool,
}

impl BodyProgress {
    fn new() -> Self {
        BodyProgress {
            base: tokio::time::Instant::now(),
            last: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
        }
    }

    /// `timeout` after the last arrival.
    fn deadline(&self, timeout: Duration) -> tokio::time::Instant {
        self.base + self.sent_in() + timeout
    }

    /// How long after the request was forwarded its body last progressed.
    fn sent_in(&self) -> Duration {
        Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// Whether the upstream connection waits for the client to send more of the body.
    fn waiting_for_client(&self) -> bool {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Records a poll of the body: pending (waiting for the client), or an arrival.
    fn polled(&self, pending: bool) {
        if pending {
            self.waiting.store(true, Ordering::Relaxed);
            return;
        }
        let since = tokio::time::Instant::now().saturating_duration_since(self.base);
        self.last.store(
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        self.waiting.store(false, Ordering::Relaxed);
    }
}

/// A request body on its way upstream, recording its [`BodyProgress`], its trailer
/// section stripped of the forwarding and hop-by-hop headers ([`strip_trailers`]).
struct TimedBody<B> {
    body: B,
    progress: Arc<BodyProgress>,
}

impl<B: http_body::Body + Unpin> http_body::Body for TimedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let mut polled = Pin::new(&mut self.body).poll_frame(cx);
        self.progress.polled(polled.is_pending());
        if let Poll::Ready(Some(Ok(frame))) = &mut polled {
            if let Some(trailers) = frame.trailers_mut() {
                strip_trailers(trailers);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Removes from a request's trailer section the forwarding headers ([`is_forwarding`])
/// and the hop-by-hop ones: `set_forwarded` rewrites the head's alone, and an untrusted
/// client's `X-Forwarded-For` sent as a trailer field went past it to the upstream, as
/// did a `Proxy-Authorization`, this hop's credentials. (hyper's client sends none of
/// the fields that frame, route or authenticate a request, RFC 9110 §6.5.1's, and only
/// those `Trailer` declares.)
fn strip_trailers(trailers: &mut HeaderMap) {
    let names: Vec<HeaderName> = trailers
        .keys()
        .filter(|name| is_forwarding(name) || is_hop_by_hop(name.as_str()))
        .cloned()
        .collect();
    for name in &names {
        trailers.remove(name);
    }
}

/// Records an upstream duration of `seconds` on `route` with status class `class`,
/// through `connection`'s handle when its last request recorded into the same
/// histogram.
fn record_duration(
    connection: Option<&Connection>,
    route: &Arc<str>,
    class: &'static str,
    seconds: f64,
) {
    let lookup = || metrics::histogram!(metric::UPSTREAM_DURATION, "route" => Arc::clone(route), "status_class" => class);
    let Some(connection) = connection else {
        lookup().record(seconds);
        return;
    };
    let mut durations = connection
        .durations
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    match &*durations {
        Some((r, c, histogram)) if Arc::ptr_eq(r, route) && *c == class => {
            histogram.record(seconds);
        }
        _ => {
            let histogram = lookup();
            histogram.record(seconds);
            *durations = Some((Arc::clone(route), class, histogram));
        }
    }
}

/// A message's `Content-Length` given as a list of one length repeated, on one field
/// line (`5, 5`, as a proxy that combines field lines writes it) or on several (the
/// same list, RFC 9110 §5.3), set to that one length: the list is no valid
/// `Content-Length` (`1*DIGIT`, RFC 9110 §8.6) to pass on, an HTTP/2 client gets every
/// field line (nghttp2's refuses a second `content-length`), and so does an HTTP/1.1
/// upstream (llhttp's refuses a second `Content-Length`). In a response, hyper's client
/// frames the body by that one length (RFC 9112 §6.3: the recipient uses it); in an
/// HTTP/2 request, the h2 crate took the lines, being equal. A list of lengths that
/// differ, or of no length, which hyper lets through only where it frames no body by
/// it (a HEAD's answer, a 204, a 304), is removed: a sender forwards no invalid
/// `Content-Length` (RFC 9110 §8.6). One value without a comma is left as it is.
fn one_content_length(headers: &mut HeaderMap) {
    let mut values = headers.get_all(header::CONTENT_LENGTH).iter();
    let Some(first) = values.next() else {
        return;
    };
    if values.next().is_none() && !first.as_bytes().contains(&b',') {
        return;
    }
    // Empty elements are no lengths (RFC 9110 §5.6.1: a recipient ignores them).
    let mut lengths = headers
        .get_all(header::CONTENT_LENGTH)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|length| !length.is_empty())
        .map(|length| {
            length.iter().try_fold(0u64, |n, &digit| {
                n.checked_mul(10)?
                    .checked_add(u64::from(digit.checked_sub(b'0').filter(|d| *d < 10)?))
            })
        });
    let one = match lengths.next() {
        Some(Some(one)) if lengths.all(|length| length == Some(one)) => Some(one),
        _ => None,
    };
    match one {
        Some(one) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(one));
        }
        None => {
            headers.remove(header::CONTENT_LENGTH);
        }
    }
}

/// The path and query of `uri`, `/` if it has none.
fn origin_form(uri: &Uri) -> PathAndQuery {
    uri.path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"))
}

/// An HTTP/2 request's `cookie` fields as one, joined with `"; "`, as it goes on in
/// HTTP/1.1 (RFC 9113 §8.2.3: HTTP/2 may split them, one crumb a field, and an
/// HTTP/1.1 server reads one `Cookie` line; CGI and WSGI stacks joined several with
/// `", "`, which is no cookie separator).
fn join_cookies(headers: &mut HeaderMap) {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    let (Some(first), Some(_)) = (crumbs.next(), crumbs.next()) else {
        return;
    };
    let mut joined = first.as_bytes().to_vec();
    for crumb in headers.get_all(header::COOKIE).iter().skip(1) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(crumb.as_bytes());
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(joined)) {
        headers.insert(header::COOKIE, v);
    }
}

/// `uri` (in origin form) with its path [normalized](crate::config::normalize_path)
/// and its query as it was, if normalizing changes the path. `*` (of `OPTIONS *`) is
/// no path and stays.
fn normalized_target(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    if !path.starts_with('/') {
        return None;
    }
    let std::borrow::Cow::Owned(mut target) = crate::config::normalize_path(path) else {
        return None;
    };
    if let Some(query) = uri.query() {
        target.push('?');
        target.push_str(query);
    }
    // The normalized path holds only bytes valid in a target: the request's ASCII
    // bytes (an escape of an unreserved character decoded, a backslash made a slash),
    // and escapes (upper-cased, or of a byte beyond ASCII).
    Uri::try_from(target).ok()
}

/// `1xx` … `5xx`.
fn status_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Counts a request as in flight to the upstream until dropped.
struct InFlight<'a>(&'a AtomicI64);

impl<'a> InFlight<'a> {
    fn enter(count: &'a AtomicI64) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        InFlight(count)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl tower::Service<Request<Incoming>> for Forwarder {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        let connection = self.connection.clone();
        // Put by the connection's admission service just before this call, unless the
        // request carries it.
        let route = match &connection {
            Some(c) => c.route.route_of(&req),
            None => req
                .extensions()
                .get::<MatchedRoute>()
                .map(|m| Arc::clone(&m.0)),
        };
        match inner.prepare(req, connection.as_deref(), route) {
            Prepared::Outgoing(out) => Box::pin(inner.exchange(connection, out)),
            Prepared::Answered(answer) => Box::pin(std::future::ready(Ok(answer))),
        }
    }
}

/// An upstream response body on its way to the client. An upstream that fails
/// after a good head (closes mid-body, sends a malformed chunk, or sends nothing more
/// for `response_timeout`) leaves the client a truncated body, its connection aborted;
/// it is counted as `rocgate_upstream_errors_total{kind="body_aborted"}`, since the
/// head was already counted a success, and logged with the upstream's other failures.
struct UpstreamBody {
    body: Incoming,
    route: Arc<str>,
    /// The longest wait for the body's next part.
    timeout: Duration,
    /// The wait for the next part, from the body's first wait on.
    stall: Option<Stall>,
    failures: Arc<FailureLog>,
    /// The request's place under `max_upstream_requests`, given up when the body ends
    /// or fails (or is dropped: the client left).
    place: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// The timer of an [`UpstreamBody`] waiting for its next part. Like the lane's
/// [`LaneTimer`], it is not set again at every part: it fires at the deadline of the
/// wait it was set for and looks again. The body's task is its only poller, so the
/// waker registered stays current.
struct Stall {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Whether the sleep has been polled, and so registered, since it was last set.
    armed: bool,
    /// When the wait began: the first time the body found nothing after a part.
    since: tokio::time::Instant,
    /// Whether a part has arrived since `since`.
    progressed: bool,
}

impl UpstreamBody {
    /// Ready once the body has waited `timeout` for its next part; registers the
    /// task's waker to be woken by then.
    fn poll_stalled(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let now = tokio::time::Instant::now();
        let timeout = self.timeout;
        let stall = self.stall.get_or_insert_with(|| Stall {
            sleep: Box::pin(tokio::time::sleep_until(now + timeout)),
            armed: false,
            since: now,
            progressed: false,
        });
        if stall.progressed {
            stall.progressed = false;
            stall.since = now;
        }
        loop {
            if stall.armed && !stall.sleep.is_elapsed() {
                return Poll::Pending;
            }
            stall.armed = true;
            std::task::ready!(stall.sleep.as_mut().poll(cx));
            let at = stall.since + timeout;
            if tokio::time::Instant::now() >= at {
                return Poll::Ready(());
            }
            stall.sleep.as_mut().reset(at);
            stall.armed = false;
        }
    }

    /// Counts and logs the body cut short, the client having been answered `status`.
    fn aborted(&self, detail: &str) {
        metrics::counter!(metric::UPSTREAM_ERRORS, "route" => Arc::clone(&self.route), "kind" => "body_aborted")
            .increment(1);
        self.failures
            .failed_as(&self.route, "body_aborted", None, detail);
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::BoxError>>> {
        match Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Pending => {
                std::task::ready!(self.poll_stalled(cx));
                let e = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the upstream sent nothing of its body for response_timeout",
                );
                self.aborted(&e.to_string());
                self.place = None;
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(Some(Err(e))) => {
                self.place = None;
                self.aborted(&format!(
                    "the response body failed: {}",
                    super::error::with_causes(&e)
                ));
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(frame) => {
                if frame.is_none() {
                    self.place = None;
                }
                if let Some(stall) = self.stall.as_mut() {
                    stall.progressed = true;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, X-Secret".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert(header::TE, "trailers".parse().unwrap());
        h.insert(header::UPGRADE, "websocket".parse().unwrap());
        h.insert("proxy-connection", "close".parse().unwrap());
        h.insert("x-kept", "yes".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h["x-kept"], "yes");
    }

    #[test]
    fn an_upgrade_keeps_its_upgrade_and_only_that() {
        let request = |connection: &'static str, upgrade: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONNECTION, HeaderValue::from_static(connection));
            h.insert(header::UPGRADE, HeaderValue::from_static(upgrade));
            h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
            h.insert("x-hop", HeaderValue::from_static("1"));
            h.insert("x-kept", HeaderValue::from_static("yes"));
            h
        };
        let mut h = request("keep-alive, Upgrade, x-hop", "websocket");
        assert!(remove_hop_by_hop(&mut h, true, |_| false));
        assert_eq!(h[header::UPGRADE], "websocket");
        assert_eq!(h[header::CONNECTION], "upgrade");
        assert_eq!(h.len(), 3, "{h:?}");
        // Not asked for in `Connection`, offering h2c (whose upgraded connection would
        // carry requests no route admits), or not upgradable: stripped as before.
        for (connection, upgrade, upgradable) in [
            ("keep-alive, x-hop", "websocket", true),
            ("upgrade, x-hop", "h2c", true),
            ("upgrade, x-hop", "websocket, H2C", true),
            ("upgrade, x-hop", "websocket", false),
        ] {
            let mut h = request(connection, upgrade);
            assert!(
                !remove_hop_by_hop(&mut h, upgradable, |_| false),
                "{connection}, {upgrade}"
            );
            assert_eq!(h.len(), 1, "{h:?}");
            assert_eq!(h["x-kept"], "yes");
        }
    }

    #[test]
    fn each_hop_by_hop_header_alone_is_stripped() {
        // The pass that looks for any of them names them apart from the list removed;
        // a request's scan before its rewrite looks through the same names.
        for name in HOP_BY_HOP.iter().chain([&PROXY_CONNECTION]) {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("1"));
            h.insert("x-kept", HeaderValue::from_static("yes"));
            let scan = HeadScan::of(&h);
            assert!(scan.hop_by_hop, "{name} unseen by the request's scan");
            assert_eq!(scan.transfer_encoding, name == header::TRANSFER_ENCODING);
            strip_hop_by_hop(&mut h);
            assert!(!h.contains_key(name), "{name} was forwarded");
            assert_eq!(h.len(), 1, "{h:?}");
        }
    }

    /// A forwarder trusting `resolver`'s proxies, sending nowhere.
    fn forwarder(resolver: ClientIpResolver) -> Forwarder {
        let settings = ForwardSettings {
            upstream: Uri::from_static("http://127.0.0.1:3000"),
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            max_body_bytes: 1024,
            max_upstream_lanes: 0,
            max_upstream_requests: 10,
            upstream_idle_timeout: Duration::from_secs(4),
            normalize_path: true,
            resolver,
        };
        Forwarder::new(
            settings,
            Arc::new(crate::clock::ManualClock::new()),
            Arc::default(),
            Arc::new(UpstreamMeter::new()),
        )
    }

    #[test]
    fn a_dual_stack_listeners_ipv4_peer_is_forwarded_as_ipv4() {
        let forwarder = forwarder(ClientIpResolver::default());
        let mut h = HeaderMap::new();
        // A client of a `[::]` listener over IPv4 is a mapped address: the same client
        // (and key) as 203.0.113.7, which is what the upstream must see.
        let peer = Peer::new("::ffff:203.0.113.7".parse().unwrap());
        let any = HeadScan::of(&h).forwarding;
        forwarder
            .inner
            .set_forwarded(&mut h, Some(&peer), None, any);
        assert_eq!(h[&X_FORWARDED_FOR], "203.0.113.7");
    }

    #[test]
    fn a_trusted_proxys_forwarded_chain_gets_this_hop() {
        let forwarder = forwarder(
            ClientIpResolver::new(vec![
                "10.0.0.0/8".parse().unwrap(),
                "fd00::/8".parse().unwrap(),
            ])
            .with_header(ClientIpHeader::Forwarded),
        );
        let forwarded = |peer: &str, sent: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = sent {
                h.insert(&FORWARDED, HeaderValue::from_static(v));
            }
            let peer = Peer::new(peer.parse().unwrap());
            let any = HeadScan::of(&h).forwarding;
            forwarder
                .inner
                .set_forwarded(&mut h, Some(&peer), None, any);
            let all = h.get_all(&FORWARDED).iter();
            all.map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        let client = Some("for=203.0.113.7;proto=https");
        assert_eq!(
            forwarded("10.0.0.2", client),
            ["for=203.0.113.7;proto=https", "for=10.0.0.2;proto=http"]
        );
        assert_eq!(
            forwarded("fd00::2", client),
            [
                "for=203.0.113.7;proto=https",
                r#"for="[fd00::2]";proto=http"#
            ]
        );
        // From an untrusted peer it is dropped; where there was none, none is added.
        assert!(forwarded("198.51.100.9", client).is_empty());
        assert!(forwarded("10.0.0.2", None).is_empty());
    }

    #[test]
    fn a_trusted_chain_beyond_ascii_is_passed_on_whole() {
        // A header value may hold bytes beyond ASCII (obs-text): the trusted proxy's
        // chain was dropped then, and the upstream saw this hop alone.
        let forwarder = forwarder(ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]));
        let mut h = HeaderMap::new();
        let sent = HeaderValue::from_bytes(b"203.0.113.7, caf\xe9").unwrap();
        h.append(&X_FORWARDED_FOR, sent);
        h.append(&X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.3"));
        let peer = Peer::new("10.0.0.2".parse().unwrap());
        let any = HeadScan::of(&h).forwarding;
        forwarder
            .inner
            .set_forwarded(&mut h, Some(&peer), None, any);
        assert_eq!(
            h[&X_FORWARDED_FOR].as_bytes(),
            b"203.0.113.7, caf\xe9, 10.0.0.3, 10.0.0.2"
        );
    }

    #[tokio::test]
    async fn a_connections_durations_go_to_the_histogram_of_their_route_and_class() {
        // The connection keeps the handle of the histogram it recorded into last: a
        // request on another route, or with another status class, must not land in it.
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let (lane, _driver) = Lane::new();
        let connection = Connection::new(lane, "203.0.113.7".parse().unwrap(), true);
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        metrics::with_local_recorder(&recorder, || {
            for (route, class) in [
                (&a, "2xx"),
                (&a, "2xx"),
                (&a, "5xx"),
                (&b, "2xx"),
                (&a, "2xx"),
            ] {
                record_duration(Some(&connection), route, class, 0.001);
            }
            record_duration(None, &b, "5xx", 0.001);
        });
        let text = handle.render();
        let count = |route: &str, class: &str| {
            let name = format!(
                "{}_count{{route=\"{route}\",status_class=\"{class}\"}} ",
                metric::UPSTREAM_DURATION
            );
            text.lines()
                .find_map(|line| line.strip_prefix(&name))
                .map(|n| n.trim().to_owned())
        };
        assert_eq!(count("a", "2xx").as_deref(), Some("3"), "{text}");
        assert_eq!(count("a", "5xx").as_deref(), Some("1"), "{text}");
        assert_eq!(count("b", "2xx").as_deref(), Some("1"), "{text}");
        assert_eq!(count("b", "5xx").as_deref(), Some("1"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lane_request_times_out_at_its_own_deadline_not_an_earlier_ones() {
        use tokio::time::{sleep, Instant};
        const TIMEOUT: Duration = Duration::from_secs(5);
        /// A request without a body on `timer`'s lane, begun now: `inner`, or a
        /// timeout at its own deadline, `TIMEOUT` from now.
        fn begun_now<F>(inner: F, timer: &Mutex<LaneTimer>) -> Deadline<'_, F> {
            Deadline {
                inner,
                at: Instant::now() + TIMEOUT,
                timeout: TIMEOUT,
                progress: None,
                timer,
            }
        }
        let timer = Mutex::new(LaneTimer::new());
        let start = Instant::now();
        let answered_after = |delay| async move {
            sleep(delay).await;
            Ok::<_, ProxyError>(delay)
        };
        // Answered within its timeout: the timer is left set to its deadline (5 s).
        let first = begun_now(answered_after(Duration::from_secs(1)), &timer);
        assert!(first.await.is_ok());
        // From 1 s to 5.5 s: past the first request's deadline, within its own.
        let second = begun_now(answered_after(Duration::from_millis(4_500)), &timer);
        assert!(second.await.is_ok(), "timed out at an earlier deadline");
        // Never answered: times out at its own deadline, 5 s after it began.
        let third = begun_now(std::future::pending::<Result<(), ProxyError>>(), &timer);
        assert!(matches!(third.await, Err(ProxyError::ResponseTimeout)));
        assert_eq!(Instant::now() - start, Duration::from_millis(10_500));
    }

    #[test]
    fn a_throttled_log_is_due_once_every_ten_seconds_with_the_count_since() {
        let clock = Arc::new(crate::clock::ManualClock::new());
        let log = Throttled::new(clock.clone());
        assert_eq!(log.count(), Some(1), "the first is logged at once");
        for _ in 0..4 {
            assert_eq!(log.count(), None);
        }
        clock.advance(FAILURE_LOG_EVERY - Duration::from_nanos(1));
        assert_eq!(log.count(), None);
        clock.advance(Duration::from_nanos(1));
        assert_eq!(log.count(), Some(6), "the line counts those not logged");
        assert_eq!(log.count(), None);
    }

    #[test]
    fn upstream_places_are_taken_without_waiting_and_come_back_when_dropped() {
        let places = UpstreamRequests::new(2);
        let first = places.try_take().expect("a first place");
        let second = places.try_take().expect("a second place");
        assert!(places.try_take().is_none(), "a third place at a cap of 2");
        assert_eq!(places.held(), 2);
        drop(first);
        assert_eq!(places.held(), 1);
        assert!(places.try_take().is_some());
        drop(second);
        // A cap of 0 (a `ForwardSettings` set by hand) is one place, not none.
        assert!(UpstreamRequests::new(0).try_take().is_some());
    }

    #[test]
    fn a_host_is_a_name_or_an_ip_literal_then_a_port_of_digits() {
        for host in [
            &b"shop.example"[..],
            b"shop.example:8080",
            b"shop.example:",
            b"203.0.113.7:80",
            b"[2001:db8::1]",
            b"[2001:db8::1]:443",
            b"xn--caf-dma.example",
        ] {
            assert!(names_a_host(host), "{}", String::from_utf8_lossy(host));
        }
        for host in [
            &b""[..],
            b":80",
            b"[]",
            b"[::1",
            b"[::1]x",
            b"[::1]:80:1",
            b"shop.example:8o",
            b"shop.example:80:1",
            b"user@shop.example",
            b"shop.example/x",
            b"shop.example?x",
            b"shop.example#x",
            b"shop example",
            b"shop.example\t",
            b"caf\xc3\xa9.example",
        ] {
            assert!(!names_a_host(host), "{}", String::from_utf8_lossy(host));
        }
    }

    #[test]
    fn a_content_length_list_becomes_its_one_length_or_goes() {
        let listed = |values: &[&'static str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::CONTENT_LENGTH, HeaderValue::from_static(v));
            }
            h.insert("x-kept", HeaderValue::from_static("yes"));
            one_content_length(&mut h);
            assert_eq!(h["x-kept"], "yes");
            let lengths = h.get_all(header::CONTENT_LENGTH).iter();
            lengths
                .map(|v| v.to_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        // One length repeated, on one line or on several: that length, once.
        assert_eq!(listed(&["5, 5"]), ["5"]);
        assert_eq!(listed(&["5", "5"]), ["5"]);
        assert_eq!(listed(&["5", "5, 5"]), ["5"]);
        assert_eq!(listed(&["05 , 5"]), ["5"]);
        assert_eq!(listed(&[", 5,"]), ["5"]);
        // Lengths that differ, or none (a HEAD's answer, which hyper does not frame
        // by it): no valid Content-Length to pass on.
        assert!(listed(&["5, 6"]).is_empty());
        assert!(listed(&["5", "6"]).is_empty());
        assert!(listed(&[", "]).is_empty());
        assert!(listed(&["5, x"]).is_empty());
        assert!(listed(&["5, 99999999999999999999"]).is_empty());
        // One value, as it came.
        assert_eq!(listed(&["5"]), ["5"]);
        assert_eq!(listed(&["007"]), ["007"]);
        assert!(listed(&[]).is_empty());
    }

    #[test]
    fn connection_names_beyond_ascii_still_drop_the_headers_named() {
        // `Connection: x-hop, é` names x-hop as this hop's own: it must not be
        // forwarded because another name in the value is not ASCII.
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_bytes(b"x-hop, \xe9").unwrap(),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key("x-hop"));
        assert!(!h.contains_key(header::CONNECTION));
        assert!(h.contains_key("x-kept"));
    }
}
