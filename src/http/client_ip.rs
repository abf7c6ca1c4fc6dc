//! The client's IP address: from the socket, and from `X-Forwarded-For` or RFC 7239
//! `Forwarded` (one of them, as configured) only when the socket peer is a trusted
//! proxy (by its network, or, with trusted hops, any peer for that many entries).

use crate::config::ClientIpHeader;
use http::header::GetAll;
use http::{HeaderMap, HeaderValue};
use ipnet::{IpNet, Ipv4Net};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// The socket address of the connection's peer, as a request extension, for the
/// admission layer (partitions by client IP) and a `rocgate::proxy::Forwarder` called
/// directly (`X-Forwarded-For`); in an axum app, `ConnectInfo<SocketAddr>` is used as
/// well. `rocgate serve` inserts none: its layer and forwarder are given the peer once
/// per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// Finds the client IP of a request.
///
/// The socket peer is the client unless it belongs to one of the trusted proxy
/// networks. Then `X-Forwarded-For` is walked from the right (the entry the nearest
/// proxy appended) past every trusted address; the first untrusted one is the client.
/// An entry may carry a port (`203.0.113.7:5123`, `[2001:db8::7]:443`), which is
/// ignored, and an IPv6 address may be in brackets without one (`[2001:db8::7]`); a
/// malformed entry ends the walk, the address right of it (the last one verified) the
/// client. So does an empty one (`203.0.113.7, , 10.0.0.2`, a trailing comma): reached,
/// it stands where a trusted proxy should have named its peer, and skipped (as nginx's
/// realip module skips it) the walk would go on into what that peer sent, which a
/// client may have written. Such requests share the key of the proxy right of it, as
/// they would with Envoy (which takes the connection's address): no key is the
/// client's, and a key a client cannot choose is the one a limiter may use. With [`ClientIpHeader::Forwarded`]
/// ([`with_header`](Self::with_header)), RFC 7239's `Forwarded` is walked the same way
/// instead, through the `for=` of each element (`for=203.0.113.7`,
/// `for="[2001:db8::7]:443"`, `for="203.0.113.7:_p1"` with an obfuscated port); an
/// obfuscated or `unknown` node ends the walk as a
/// malformed entry does. Only the chosen header is read: a proxy that writes
/// `Forwarded` and passes on the `X-Forwarded-For` a client sent would otherwise let
/// the client choose its own key. Headers from untrusted peers are ignored.
///
/// With trusted hops ([`with_trusted_hops`](Self::with_trusted_hops), Envoy's
/// `xff_num_trusted_hops`) in place of trusted networks, every peer is taken for the
/// nearest of that many proxies, each of which appends to the header: the client is
/// the hops-th entry from the right (the right-most being the one the peer appended),
/// whatever the addresses. A header with fewer entries (a request that came through
/// fewer proxies, each entry then one of theirs) gives its left-most; a malformed
/// or empty entry is counted as an entry, as Envoy counts it, and ends the walk as it
/// does through trusted networks, the entry right of it taken (the peer, if it is the
/// right-most).
///
/// ```
/// use rocgate::http::ClientIpResolver;
/// use http::HeaderMap;
///
/// let resolver = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
/// let mut headers = HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.1.2.3".parse().unwrap());
/// // Through the trusted proxies: the rightmost untrusted entry.
/// assert_eq!(resolver.resolve(Some("10.0.0.1".parse().unwrap()), &headers), Some("203.0.113.7".parse().unwrap()));
/// // From an untrusted peer, the header counts for nothing.
/// assert_eq!(resolver.resolve(Some("198.51.100.1".parse().unwrap()), &headers), Some("198.51.100.1".parse().unwrap()));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClientIpResolver {
    trusted: Vec<IpNet>,
    header: ClientIpHeader,
    hops: usize,
}

impl ClientIpResolver {
    /// Trusts `X-Forwarded-For` from peers in these networks. A network within the
    /// IPv4-mapped range (`::ffff:10.0.0.0/104`) is the IPv4 network it maps
    /// (`10.0.0.0/8`), as peers are compared.
    pub fn new(trusted: Vec<IpNet>) -> Self {
        let trusted = trusted.into_iter().map(canonical_net).collect();
        ClientIpResolver {
            trusted,
            header: ClientIpHeader::XForwardedFor,
            hops: 0,
        }
    }

    /// Believes `hops` entries of the header from the right, whatever the peer and
    /// the addresses (`0`, the default: the trusted networks decide). Every peer is
    /// then a proxy, so rocgate must be reachable only through those proxies; the
    /// trusted networks are not consulted.
    #[must_use]
    pub fn with_trusted_hops(mut self, hops: usize) -> Self {
        self.hops = hops;
        self
    }

    /// The entries believed from the right whatever the peer (`0`: none, the trusted
    /// networks decide).
    pub fn trusted_hops(&self) -> usize {
        self.hops
    }

    /// Reads `header` from the trusted proxies instead (and only it).
    #[must_use]
    pub fn with_header(mut self, header: ClientIpHeader) -> Self {
        self.header = header;
        self
    }

    /// The header read from the trusted proxies.
    pub fn header(&self) -> ClientIpHeader {
        self.header
    }

    /// The trusted proxy networks.
    pub fn networks(&self) -> &[IpNet] {
        &self.trusted
    }

    /// Whether the forwarding header of a peer at `ip` is read: `ip` belongs to a
    /// trusted proxy network, or, with trusted hops, any.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.hops > 0 || self.in_trusted_network(ip)
    }

    fn in_trusted_network(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client IP for a request from `peer` with these headers.
    pub fn resolve(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        self.walk(peer, headers).0
    }

    /// [`resolve`](Self::resolve), and, where the walk ended at an entry that names no
    /// address (so that the client is the entry right of it, a trusted proxy's, or the
    /// peer), that entry: every client whose entry the walk ends at shares that key.
    /// A trusted peer's request without the header read at all is keyed by the peer,
    /// and ends at no entry of it ([`Fallback::NoHeader`], an empty entry): every
    /// request through that proxy shares its key. `None` for a walk that ended at the
    /// client or ran out of entries, and for a peer that is no trusted proxy.
    pub fn walk<'h>(
        &self,
        peer: Option<IpAddr>,
        headers: &'h HeaderMap,
    ) -> (Option<IpAddr>, Option<EndedAt<'h>>) {
        let Some(peer) = peer.map(canonical) else {
            return (None, None);
        };
        if !self.is_trusted(peer) {
            return (Some(peer), None);
        }
        let mut client = peer;
        let mut taken_any = false;
        // Split as bytes: a value may hold bytes beyond ASCII, which make only the
        // entry holding them malformed. Each entry as received, and its node.
        let xff = (self.header == ClientIpHeader::XForwardedFor)
            .then(|| headers.get_all("x-forwarded-for"));
        let entries = xff.into_iter().flat_map(right_to_left).map(|entry| {
            let entry = entry.trim_ascii();
            (entry, Some(entry))
        });
        // Each `Forwarded` element, and its `for=`, unquoted.
        let forwarded =
            (self.header == ClientIpHeader::Forwarded).then(|| headers.get_all("forwarded"));
        let elements = forwarded
            .into_iter()
            .flat_map(|all| all.into_iter().rev())
            .flat_map(|v| Elements {
                rest: Some(v.as_bytes()),
            })
            .map(|element| (element.trim_ascii(), forwarded_for(element)));
        for (taken, (entry, node)) in (1..).zip(entries.chain(elements)) {
            taken_any = true;
            let ip = node
                .and_then(|node| std::str::from_utf8(node).ok())
                .and_then(node_address);
            match ip {
                Some(ip) => {
                    client = canonical(ip);
                    let further = match self.hops {
                        0 => self.in_trusted_network(client),
                        hops => taken < hops,
                    };
                    if !further {
                        break;
                    }
                }
                // A malformed entry ends the walk: what lies left of it is unverifiable.
                None => {
                    let ended = EndedAt {
                        reason: Fallback::of(node),
                        entry,
                    };
                    return (Some(client), Some(ended));
                }
            }
        }
        let ended = (!taken_any).then_some(EndedAt {
            reason: Fallback::NoHeader,
            entry: b"",
        });
        (Some(client), ended)
    }
}

/// Why a walk through the forwarding header ended at an entry rather than at the
/// client: the request is then keyed by the entry right of it (a trusted proxy's) or
/// the peer, with every other client whose entry the walk ends at.
///
/// More reasons may be told apart later (`NoHeader` was added), so a `match` outside
/// rocgate has an arm for the others; one naming only these four does not compile:
///
/// ```compile_fail,E0004
/// use rocgate::http::Fallback;
///
/// fn label(reason: Fallback) -> &'static str {
///     match reason {
///         Fallback::EmptyEntry => "empty",
///         Fallback::MalformedEntry => "malformed",
///         Fallback::HiddenNode => "hidden",
///         Fallback::NoHeader => "none",
///     }
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fallback {
    /// The entry names nothing: empty in `X-Forwarded-For` (`a, , b`, a trailing
    /// comma), or a `Forwarded` element without `for=` or with an empty one.
    EmptyEntry,
    /// The entry is no address rocgate reads (`junk`, `[203.0.113.7]`, an address
    /// with a zone id it refuses).
    MalformedEntry,
    /// The entry is `unknown` or an obfuscated identifier (`_hidden`), which RFC 7239
    /// lets a proxy write in place of the address it hides.
    HiddenNode,
    /// The request came from a trusted proxy without the header read at all (no
    /// `X-Forwarded-For`, or, with `Forwarded` read, no `Forwarded`): keyed by that
    /// proxy's address. A proxy's own requests (its health checks) are such requests.
    NoHeader,
}

impl Fallback {
    /// Every reason, in the order of their labels.
    pub const ALL: [Fallback; 4] = [
        Fallback::EmptyEntry,
        Fallback::MalformedEntry,
        Fallback::HiddenNode,
        Fallback::NoHeader,
    ];

    /// The reason's label: `empty_entry`, `malformed_entry`, `hidden_node`,
    /// `no_header`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::EmptyEntry => "empty_entry",
            Fallback::MalformedEntry => "malformed_entry",
            Fallback::HiddenNode => "hidden_node",
            Fallback::NoHeader => "no_header",
        }
    }

    /// The reason's place in [`Fallback::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The reason a node (`None`: a `Forwarded` element without `for=`) that is no
    /// address is one.
    fn of(node: Option<&[u8]>) -> Fallback {
        match node {
            None | Some([]) => Fallback::EmptyEntry,
            Some(n) if n.eq_ignore_ascii_case(b"unknown") || n.first() == Some(&b'_') => {
                Fallback::HiddenNode
            }
            Some(_) => Fallback::MalformedEntry,
        }
    }
}

/// The entry a walk ended at ([`ClientIpResolver::walk`]).
///
/// Only a walk makes one, and it may come to say more of the entry (where in the
/// header it was), so a pattern outside rocgate names the fields it reads and ends
/// with `..`; one that names only these two does not compile:
///
/// ```compile_fail,E0638
/// use rocgate::http::EndedAt;
///
/// fn entry(ended: EndedAt<'_>) -> &[u8] {
///     let EndedAt { reason: _, entry } = ended;
///     entry
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndedAt<'h> {
    /// Why it names no address.
    pub reason: Fallback,
    /// The entry as received, without the whitespace around it: an `X-Forwarded-For`
    /// entry, or a whole `Forwarded` element (empty for [`Fallback::NoHeader`]).
    pub entry: &'h [u8],
}

/// The address of a forwarding entry or node: an address (`1.2.3.4`, `2001:db8::1`),
/// one with its port (`1.2.3.4:5678`, `[2001:db8::1]:443`) or an obfuscated port
/// (`1.2.3.4:_p1`, RFC 7239 §6.3), or an IPv6 address in brackets without one
/// (`[2001:db8::1]`, as RFC 7239 writes it). An IPv6 address's zone id
/// (`fe80::1%eth0`, `[fe80::1%25eth0]:443`) is dropped: it names an interface of the
/// host that wrote the entry, which means nothing here, and the address is the client.
/// A zone on an IPv4 address, or an empty one, makes the entry malformed.
fn node_address(entry: &str) -> Option<IpAddr> {
    match entry.split_once('%') {
        Some((address, zoned)) => {
            // The zone runs to the closing bracket, or to the end of a bare address.
            let (zone, after) = zoned.split_at(zoned.find(']').unwrap_or(zoned.len()));
            let ip = is_zone(zone)
                .then(|| address_of(&format!("{address}{after}")))
                .flatten()?;
            ip.is_ipv6().then_some(ip)
        }
        None => address_of(entry),
    }
}

/// Whether `zone` is an IPv6 zone id as a URI writes one (RFC 6874: letters, digits,
/// `-`, `.`, `_`, `~`, and `%` for a byte escaped, as the `%25` its `%` is written as).
fn is_zone(zone: &str) -> bool {
    !zone.is_empty()
        && zone
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'%'))
}

/// The address of an entry without a zone id.
fn address_of(entry: &str) -> Option<IpAddr> {
    if let Ok(ip) = entry.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = entry.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    if let Some((node, _)) = entry
        .rsplit_once(':')
        .filter(|(_, p)| is_obfuscated_port(p))
    {
        return match node.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
            Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
            None => node.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4),
        };
    }
    let v6 = entry.strip_prefix('[')?.strip_suffix(']')?;
    v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// Whether `port` is an obfuscated port of RFC 7239 §6.3 (`_` and then letters,
/// digits, `.`, `_` or `-`), which a proxy may write for its client's in place of the
/// number: the address before it is still the client's. Read as malformed, it ended
/// the walk, and every client behind such a proxy shared the proxy's own key.
fn is_obfuscated_port(port: &str) -> bool {
    port.strip_prefix('_').is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    })
}

/// A header's comma-separated entries, over all its lines, the last first.
fn right_to_left(all: GetAll<'_, HeaderValue>) -> impl Iterator<Item = &[u8]> {
    all.into_iter()
        .rev()
        .flat_map(|v| v.as_bytes().rsplit(|&b| b == b','))
}

/// A `Forwarded` header line's elements, the last first: split at the commas outside
/// quoted strings (RFC 7239 §4: a value may be a quoted string, holding commas and
/// semicolons, such as a `host` a proxy writes after `for`), found from the right,
/// where the trusted proxies wrote theirs: what a client wrote on the left, its quotes
/// balanced or not, cannot move where theirs split. (Split at every comma, a host of
/// `"a,for=6.6.6.6"` in a trusted proxy's own element gave the client the address it
/// wrote there.)
struct Elements<'a> {
    rest: Option<&'a [u8]>,
}

impl<'a> Iterator for Elements<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let rest = self.rest?;
        let mut quoted = false;
        for i in (0..rest.len()).rev() {
            match rest[i] {
                b'"' if !escaped(rest, i) => quoted = !quoted,
                b',' if !quoted => {
                    self.rest = Some(&rest[..i]);
                    return Some(&rest[i + 1..]);
                }
                _ => {}
            }
        }
        self.rest = None;
        Some(rest)
    }
}

/// Whether the byte at `i` is escaped inside a quoted string: an odd run of
/// backslashes before it.
fn escaped(bytes: &[u8], i: usize) -> bool {
    bytes[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1
}

/// An element's `name=value` pairs, in order, split at the semicolons outside quoted
/// strings (the element is a trusted proxy's, its quotes balanced).
fn pairs(element: &[u8]) -> impl Iterator<Item = &[u8]> {
    let (mut quoted, mut escape) = (false, false);
    // `split` asks of each byte once, in order, as the pairs are taken.
    element.split(move |&b| {
        if escape {
            escape = false;
            return false;
        }
        match b {
            b'\\' if quoted => {
                escape = true;
                false
            }
            b'"' => {
                quoted = !quoted;
                false
            }
            b';' => !quoted,
            _ => false,
        }
    })
}

/// The node of a `Forwarded` element's `for=` parameter (its name in any case), without
/// its quotes; `None` for an element without one.
fn forwarded_for(element: &[u8]) -> Option<&[u8]> {
    pairs(element).find_map(|pair| {
        let pair = pair.trim_ascii();
        let (name, value) = pair.split_at(pair.iter().position(|&b| b == b'=')?);
        if !name.trim_ascii().eq_ignore_ascii_case(b"for") {
            return None;
        }
        let value = value[1..].trim_ascii();
        Some(match value {
            [b'"', inner @ .., b'"'] => inner,
            _ => value,
        })
    })
}

/// A network within the IPv4-mapped range as the IPv4 network it maps; any other as
/// it is.
pub(crate) fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => v6
            .network()
            .to_ipv4_mapped()
            .and_then(|v4| Ipv4Net::new(v4, v6.prefix_len() - 96).ok())
            .map_or(net, IpNet::V4),
        other => other,
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:1.2.3.4`) as plain IPv4, so one client is one key.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(xff: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in xff {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn no_trusted_proxies_means_the_socket_peer() {
        let r = ClientIpResolver::default();
        assert_eq!(
            r.resolve(Some(ip("1.2.3.4")), &headers(&["9.9.9.9"])),
            Some(ip("1.2.3.4"))
        );
        assert_eq!(r.resolve(None, &headers(&["9.9.9.9"])), None);
    }

    #[test]
    fn walks_several_headers_from_the_right() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let h = headers(&["1.1.1.1, 2.2.2.2", "10.0.0.9"]);
        assert_eq!(r.resolve(Some(ip("10.0.0.1")), &h), Some(ip("2.2.2.2")));
    }

    #[test]
    fn all_trusted_or_garbage_stops_at_the_last_good_hop() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(
            r.resolve(Some(ip("10.0.0.1")), &headers(&["10.0.0.3, 10.0.0.2"])),
            Some(ip("10.0.0.3"))
        );
        assert_eq!(
            r.resolve(Some(ip("10.0.0.1")), &headers(&["1.1.1.1, junk, 10.0.0.2"])),
            Some(ip("10.0.0.2"))
        );
        assert_eq!(
            r.resolve(Some(ip("10.0.0.1")), &HeaderMap::new()),
            Some(ip("10.0.0.1"))
        );
    }

    #[test]
    fn entries_with_a_port_are_their_address() {
        // Some load balancers (Azure Application Gateway) append `address:port`.
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let h = headers(&["6.6.6.6, 203.0.113.7:5123, 10.0.0.2:443"]);
        assert_eq!(r.resolve(Some(ip("10.0.0.1")), &h), Some(ip("203.0.113.7")));
        let h = headers(&["[2001:db8::7]:443"]);
        assert_eq!(r.resolve(Some(ip("10.0.0.1")), &h), Some(ip("2001:db8::7")));
    }

    #[test]
    fn bytes_beyond_ascii_on_the_left_do_not_hide_the_entries_right_of_them() {
        // A value holding a byte beyond ASCII (obs-text) was read as empty: the
        // client behind the proxy became the proxy itself.
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let mut h = HeaderMap::new();
        let value = http::HeaderValue::from_bytes(b"caf\xe9, 203.0.113.7, 10.0.0.2").unwrap();
        h.append("x-forwarded-for", value);
        assert_eq!(r.resolve(Some(ip("10.0.0.1")), &h), Some(ip("203.0.113.7")));
        // Where it is the entry reached, the walk ends as at any malformed one.
        let mut h = HeaderMap::new();
        let value = http::HeaderValue::from_bytes(b"203.0.113.7, caf\xe9, 10.0.0.2").unwrap();
        h.append("x-forwarded-for", value);
        assert_eq!(r.resolve(Some(ip("10.0.0.1")), &h), Some(ip("10.0.0.2")));
    }

    #[test]
    fn mapped_ipv6_is_ipv4() {
        let r = ClientIpResolver::new(vec!["127.0.0.0/8".parse().unwrap()]);
        assert_eq!(
            r.resolve(Some(ip("::ffff:127.0.0.1")), &headers(&["::ffff:8.8.8.8"])),
            Some(ip("8.8.8.8"))
        );
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("forwarded", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn forwarded_is_walked_when_it_is_the_header_chosen() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()])
            .with_header(ClientIpHeader::Forwarded);
        let peer = Some(ip("10.0.0.1"));
        // RFC 7239's own examples: names in any case, IPv6 quoted with its port.
        let h = forwarded(&["for=6.6.6.6, For=\"[2001:db8:cafe::17]:4711\";proto=https"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("2001:db8:cafe::17")));
        let h = forwarded(&[
            "for=6.6.6.6;by=10.0.0.9",
            "proto=http;for=203.0.113.7, for=10.0.0.2",
        ]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        // An obfuscated port is no part of the address.
        let h = forwarded(&[r#"for=6.6.6.6, for="203.0.113.7:_p1", for=10.0.0.2"#]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        let h = forwarded(&[r#"for="[2001:db8::7]:_x-1", for=10.0.0.2"#]);
        assert_eq!(r.resolve(peer, &h), Some(ip("2001:db8::7")));
        for bad in [
            r#""203.0.113.7:_""#,
            r#""203.0.113.7:_a/b""#,
            r#""[203.0.113.7]:_p""#,
        ] {
            let h = forwarded(&[&format!("for=6.6.6.6, for={bad}, for=10.0.0.2")]);
            assert_eq!(r.resolve(peer, &h), Some(ip("10.0.0.2")), "{bad}");
        }
        // An obfuscated or unknown node, or an element without `for=`, ends the walk.
        let h = forwarded(&["for=6.6.6.6, for=_hidden, for=10.0.0.2"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("10.0.0.2")));
        let h = forwarded(&["for=6.6.6.6, for=unknown"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("10.0.0.1")));
        let h = forwarded(&["for=6.6.6.6, proto=http"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("10.0.0.1")));
        // From an untrusted peer, it counts for nothing.
        let h = forwarded(&["for=203.0.113.7"]);
        assert_eq!(r.resolve(Some(ip("1.2.3.4")), &h), Some(ip("1.2.3.4")));
    }

    /// A quoted value in a trusted proxy's element may hold commas and semicolons (a
    /// host is a reg-name, which may): they split nothing. (A host of
    /// `"a,for=6.6.6.6;x="` after the proxy's `for=` gave the client 6.6.6.6.) Quotes a
    /// client wrote on the left, unbalanced or not, do not move the proxies' split.
    #[test]
    fn a_quoted_forwarded_value_splits_no_element_and_no_pair() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()])
            .with_header(ClientIpHeader::Forwarded);
        let peer = Some(ip("10.0.0.1"));
        let h = forwarded(&[r#"for=203.0.113.7;host="a,for=6.6.6.6;x=";proto=https"#]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        let h = forwarded(&[r#"host="a;for=6.6.6.6";for=203.0.113.7"#]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        let h = forwarded(&[r#"host="a\",for=6.6.6.6";for=203.0.113.7"#]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        let h = forwarded(&[r#"for="6.6.6.6, for=203.0.113.7;host="shop""#]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        let h = forwarded(&[r#"for="6.6.6.6"#, "for=203.0.113.7"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
    }

    /// Only the header chosen is read. A proxy that writes `Forwarded` and passes on
    /// the `X-Forwarded-For` its client sent (HAProxy's `option forwarded`) let the
    /// client choose its key: `X-Forwarded-For`, present, was read first. And one
    /// that writes `X-Forwarded-For` cannot be overruled by a `Forwarded` its client
    /// sent when the request has no `X-Forwarded-For` of its own.
    #[test]
    fn a_client_cannot_name_itself_in_the_header_its_proxy_does_not_write() {
        let trusted = vec!["10.0.0.0/8".parse().unwrap()];
        let peer = Some(ip("10.0.0.1"));
        let mut h = forwarded(&["for=203.0.113.7"]);
        h.append("x-forwarded-for", "6.6.6.6".parse().unwrap());
        let forwarded_only =
            ClientIpResolver::new(trusted.clone()).with_header(ClientIpHeader::Forwarded);
        assert_eq!(forwarded_only.resolve(peer, &h), Some(ip("203.0.113.7")));
        let xff_only = ClientIpResolver::new(trusted);
        assert_eq!(xff_only.resolve(peer, &h), Some(ip("6.6.6.6")));
        assert_eq!(
            xff_only.resolve(peer, &forwarded(&["for=203.0.113.7"])),
            Some(ip("10.0.0.1"))
        );
    }

    #[test]
    fn a_bracketed_ipv6_node_without_a_port_is_its_address() {
        // RFC 7239 writes an IPv6 node in brackets, with or without a port:
        // `for="[2001:db8:cafe::17]"`. Read as malformed, it ended the walk and every
        // IPv6 client behind the proxy shared the proxy's key.
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer = Some(ip("10.0.0.1"));
        let h = forwarded(&[r#"for="[2001:db8:cafe::17]""#]);
        let forwarded_only = r.clone().with_header(ClientIpHeader::Forwarded);
        assert_eq!(
            forwarded_only.resolve(peer, &h),
            Some(ip("2001:db8:cafe::17"))
        );
        let h = headers(&["6.6.6.6, [2001:db8::7], 10.0.0.2"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("2001:db8::7")));
        // Brackets around an IPv4 address, or half a pair, are no address.
        for bad in ["[203.0.113.7]", "[2001:db8::7", "2001:db8::7]", "[]"] {
            let h = headers(&[&format!("6.6.6.6, {bad}, 10.0.0.2")]);
            assert_eq!(r.resolve(peer, &h), Some(ip("10.0.0.2")), "{bad}");
        }
    }

    #[test]
    fn a_trusted_network_written_as_mapped_ipv6_trusts_its_ipv4_peers() {
        // Peers are compared as IPv4 (`::ffff:10.0.0.1` is 10.0.0.1), so a network
        // written in the mapped form, as a dual-stack socket shows its peers, matched
        // none of them and their X-Forwarded-For was ignored.
        let r = ClientIpResolver::new(vec!["::ffff:10.0.0.0/104".parse().unwrap()]);
        let h = headers(&["203.0.113.7"]);
        for peer in ["10.0.0.1", "::ffff:10.0.0.1"] {
            assert_eq!(
                r.resolve(Some(ip(peer)), &h),
                Some(ip("203.0.113.7")),
                "{peer}"
            );
        }
        assert_eq!(r.resolve(Some(ip("11.0.0.1")), &h), Some(ip("11.0.0.1")));
        // A network wider than the mapped range stays as written.
        let r = ClientIpResolver::new(vec!["::/0".parse().unwrap()]);
        assert!(r.is_trusted(ip("2001:db8::1")));
    }

    /// An IPv6 address with a zone id (`fe80::1%eth0`, as a proxy on the client's link
    /// may write it; `%25` as a URI writes the `%`) is its address: the zone names an
    /// interface of the proxy's host, which means nothing here. Only a numeric zone in
    /// brackets with a port was read (`[fe80::1%2]:443`); every other spelling ended
    /// the walk, and the client behind it took the next proxy's key.
    #[test]
    fn an_ipv6_zone_id_is_no_part_of_the_address() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let forwarded_only = r.clone().with_header(ClientIpHeader::Forwarded);
        let peer = Some(ip("10.0.0.1"));
        for zoned in [
            "fe80::1%eth0",
            "fe80::1%2",
            "[fe80::1%eth0]",
            "[fe80::1%eth0]:443",
            "[fe80::1%25eth0]:443",
            "[fe80::1%2]:443",
            "[fe80::1%eth0]:_p1",
        ] {
            let h = headers(&[&format!("6.6.6.6, {zoned}, 10.0.0.2")]);
            assert_eq!(r.resolve(peer, &h), Some(ip("fe80::1")), "{zoned}");
            let h = forwarded(&[&format!("for=6.6.6.6, for=\"{zoned}\", for=10.0.0.2")]);
            assert_eq!(
                forwarded_only.resolve(peer, &h),
                Some(ip("fe80::1")),
                "{zoned}"
            );
        }
        // A zone on an IPv4 address, an empty one, one holding what no zone holds, or
        // one cut from its bracket is no address: the walk ends there.
        for bad in [
            "203.0.113.7%eth0",
            "[203.0.113.7%eth0]:443",
            "fe80::1%",
            "[fe80::1%]:443",
            "fe80::1%eth0:443",
            "fe80::1%eth/0",
            "[fe80::1%eth0:443",
            "fe80::1%eth0]",
        ] {
            let h = headers(&[&format!("6.6.6.6, {bad}, 10.0.0.2")]);
            assert_eq!(r.resolve(peer, &h), Some(ip("10.0.0.2")), "{bad}");
        }
    }

    /// An empty entry (`a, , b`, a trailing comma) is no address, and ends the walk as
    /// a malformed entry does, the entry right of it the key. Reached, it stands where a
    /// trusted proxy should have named its peer: skipped, as nginx's realip module
    /// skips it, the walk would go on into what that peer sent, which a client may have
    /// written. With trusted hops it is counted as an entry, as Envoy counts it.
    /// Left of the client's entry (a client's own trailing comma) it is never reached.
    #[test]
    fn an_empty_entry_ends_the_walk_and_is_counted_as_a_hop() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer = Some(ip("10.0.0.1"));
        let h = headers(&["6.6.6.6, , 10.0.0.2"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("10.0.0.2")));
        let h = headers(&["6.6.6.6, 10.0.0.2,"]);
        assert_eq!(r.resolve(peer, &h), peer);
        let h = headers(&["6.6.6.6,, 203.0.113.7, 10.0.0.2"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        let h = headers(&["", "203.0.113.7"]);
        assert_eq!(r.resolve(peer, &h), Some(ip("203.0.113.7")));
        let two = ClientIpResolver::default().with_trusted_hops(2);
        let h = headers(&["6.6.6.6, , 198.51.100.1"]);
        assert_eq!(two.resolve(peer, &h), Some(ip("198.51.100.1")));
        let h = headers(&["6.6.6.6, 198.51.100.1,"]);
        assert_eq!(two.resolve(peer, &h), peer);
    }

    /// The walk says which entry it ended at, as received, and why: empty, malformed,
    /// a node RFC 7239 lets a proxy hide, or no header from a trusted peer; not where it ended at the client, ran out
    /// of entries (fewer than the trusted hops: the left-most is a proxy's word for its
    /// client), or met a bad entry only left of the client.
    #[test]
    fn the_walk_names_the_entry_it_ended_at() {
        let r = ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer = Some(ip("10.0.0.1"));
        let ended = |r: &ClientIpResolver, h: &HeaderMap| {
            let (client, at) = r.walk(peer, h);
            (client, at.map(|a| (a.reason, a.entry.to_vec())))
        };
        let h = headers(&["6.6.6.6, , 10.0.0.2"]);
        let empty = Some((Fallback::EmptyEntry, b"".to_vec()));
        assert_eq!(ended(&r, &h), (Some(ip("10.0.0.2")), empty));
        let h = headers(&["6.6.6.6, [203.0.113.7] , 10.0.0.2"]);
        let bad = Some((Fallback::MalformedEntry, b"[203.0.113.7]".to_vec()));
        assert_eq!(ended(&r, &h), (Some(ip("10.0.0.2")), bad));
        let h = headers(&["unknown"]);
        let hidden = Some((Fallback::HiddenNode, b"unknown".to_vec()));
        assert_eq!(ended(&r, &h), (peer, hidden));
        for good in ["junk, , 203.0.113.7, 10.0.0.2", "10.0.0.3, 10.0.0.2"] {
            let h = headers(&[good]);
            assert_eq!(ended(&r, &h).1, None, "{good}");
        }
        // A trusted peer's header sent empty names no one; none sent is no header, and
        // so is an `X-Forwarded-For` where `Forwarded` is read.
        let h = headers(&[""]);
        assert_eq!(
            ended(&r, &h),
            (peer, Some((Fallback::EmptyEntry, Vec::new())))
        );
        let none = Some((Fallback::NoHeader, Vec::new()));
        assert_eq!(ended(&r, &HeaderMap::new()), (peer, none.clone()));
        let forwarded_read = r.clone().with_header(ClientIpHeader::Forwarded);
        let h = headers(&["203.0.113.7"]);
        assert_eq!(ended(&forwarded_read, &h), (peer, none));
        let three = ClientIpResolver::default().with_trusted_hops(3);
        let h = headers(&["203.0.113.7, 198.51.100.1"]);
        assert_eq!(ended(&three, &h), (Some(ip("203.0.113.7")), None));
        let fwd = r.clone().with_header(ClientIpHeader::Forwarded);
        let h = forwarded(&["for=6.6.6.6, proto=http;by=10.0.0.9 , for=10.0.0.2"]);
        let no_for = Some((Fallback::EmptyEntry, b"proto=http;by=10.0.0.9".to_vec()));
        assert_eq!(ended(&fwd, &h), (Some(ip("10.0.0.2")), no_for));
        let h = forwarded(&["for=6.6.6.6, for=_hidden;proto=https"]);
        let hidden = Some((Fallback::HiddenNode, b"for=_hidden;proto=https".to_vec()));
        assert_eq!(ended(&fwd, &h), (peer, hidden));
        let h = forwarded(&[r#"for="[203.0.113.7]""#]);
        assert_eq!(ended(&fwd, &h).1.unwrap().0, Fallback::MalformedEntry);
        // From an untrusted peer nothing is walked, a header or none.
        assert_eq!(r.walk(Some(ip("1.2.3.4")), &headers(&[", x"])).1, None);
        assert_eq!(r.walk(Some(ip("1.2.3.4")), &HeaderMap::new()).1, None);
    }

    /// With trusted hops the client is the hops-th entry from the right, whatever
    /// the peer and the addresses; fewer entries give the left-most; a malformed entry
    /// ends the walk at the one right of it; ports, brackets and header lines are read
    /// as through trusted networks.
    #[test]
    fn trusted_hops_take_the_nth_entry_from_the_right() {
        let peer = Some(ip("198.51.100.200"));
        let one = ClientIpResolver::default().with_trusted_hops(1);
        assert!(one.is_trusted(ip("198.51.100.200")));
        assert_eq!(
            one.resolve(peer, &headers(&["6.6.6.6, 203.0.113.7"])),
            Some(ip("203.0.113.7"))
        );
        let two = ClientIpResolver::default().with_trusted_hops(2);
        let h = headers(&["6.6.6.6, 203.0.113.7, 198.51.100.1"]);
        assert_eq!(two.resolve(peer, &h), Some(ip("203.0.113.7")));
        // Over several header lines, the last line's entries nearest.
        let h = headers(&["6.6.6.6, 203.0.113.7", "198.51.100.1"]);
        assert_eq!(two.resolve(peer, &h), Some(ip("203.0.113.7")));
        // Ports and brackets are no part of an address.
        let h = headers(&["6.6.6.6, [2001:db8::7]:443, 198.51.100.1:80"]);
        assert_eq!(two.resolve(peer, &h), Some(ip("2001:db8::7")));
        let h = headers(&["6.6.6.6, [2001:db8::7], [2001:db8::1]"]);
        assert_eq!(two.resolve(peer, &h), Some(ip("2001:db8::7")));
        // Fewer entries than hops: the left-most; none: the peer.
        let three = ClientIpResolver::default().with_trusted_hops(3);
        let h = headers(&["203.0.113.7, 198.51.100.1"]);
        assert_eq!(three.resolve(peer, &h), Some(ip("203.0.113.7")));
        assert_eq!(three.resolve(peer, &HeaderMap::new()), peer);
        // A malformed entry ends the walk at the entry right of it, or the peer.
        let h = headers(&["1.1.1.1, junk, 198.51.100.1"]);
        assert_eq!(three.resolve(peer, &h), Some(ip("198.51.100.1")));
        let h = headers(&["1.1.1.1, 2.2.2.2, "]);
        assert_eq!(three.resolve(peer, &h), peer);
        // The trusted networks are not consulted: an address in one is no hop more.
        let counted =
            ClientIpResolver::new(vec!["10.0.0.0/8".parse().unwrap()]).with_trusted_hops(1);
        let h = headers(&["203.0.113.7, 10.0.0.5"]);
        assert_eq!(counted.resolve(peer, &h), Some(ip("10.0.0.5")));
        // `Forwarded`, when it is the header chosen, is counted the same way.
        let forwarded_two = two.clone().with_header(ClientIpHeader::Forwarded);
        let h = forwarded(&["for=6.6.6.6, for=\"[2001:db8::7]:443\"", "for=198.51.100.1"]);
        assert_eq!(forwarded_two.resolve(peer, &h), Some(ip("2001:db8::7")));
        let h = forwarded(&["for=6.6.6.6, for=unknown, for=198.51.100.1"]);
        assert_eq!(forwarded_two.resolve(peer, &h), Some(ip("198.51.100.1")));
        // Zero hops: the trusted networks alone, none here: the peer.
        let none = ClientIpResolver::default().with_trusted_hops(0);
        assert!(!none.is_trusted(ip("198.51.100.200")));
        assert_eq!(none.resolve(peer, &headers(&["203.0.113.7"])), peer);
    }
}
