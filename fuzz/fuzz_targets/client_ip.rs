//! Client IP resolution from `X-Forwarded-For` or `Forwarded` with trusted proxies.
//!
//! Input: trusted networks, the header read, the socket peer and header lines
//! (X-Forwarded-For, Forwarded, X-Real-IP, others), all from fuzz bytes. Invariants:
//! no panic; no peer, no client; an untrusted peer is the client whatever the headers
//! say; otherwise the client is the peer or an address written in the header read;
//! every other header changes nothing.
#![no_main]

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use rocgate::config::ClientIpHeader;
use rocgate::http::ClientIpResolver;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[derive(Arbitrary, Debug)]
enum Addr {
    V4([u8; 4]),
    V6([u8; 16]),
    /// IPv4-mapped IPv6.
    Mapped([u8; 4]),
}

impl Addr {
    fn ip(&self) -> IpAddr {
        match *self {
            Addr::V4(b) => IpAddr::V4(Ipv4Addr::from(b)),
            Addr::V6(b) => IpAddr::V6(Ipv6Addr::from(b)),
            Addr::Mapped(b) => IpAddr::V6(Ipv4Addr::from(b).to_ipv6_mapped()),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    trusted: Vec<(Addr, u8)>,
    forwarded: bool,
    peer: Option<Addr>,
    headers: Vec<(u8, Vec<u8>)>,
}

const NAMES: [&str; 5] = [
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
    "X-Forwarded-For",
    "x-forwarded-host",
];

fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Every address written anywhere in these values, however delimited.
fn written(values: &[Vec<u8>]) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for v in values {
        let text = String::from_utf8_lossy(v);
        for token in text.split(|c: char| ",;=\"[] \t".contains(c)) {
            if let Ok(ip) = token.parse::<IpAddr>() {
                found.push(canonical(ip));
            }
            if let Some((host, _)) = token.rsplit_once(':') {
                if let Ok(ip) = host.parse::<Ipv4Addr>() {
                    found.push(IpAddr::V4(ip));
                }
            }
        }
    }
    found
}

fuzz_target!(|input: Input| {
    let trusted: Vec<IpNet> = input
        .trusted
        .iter()
        .filter_map(|(a, len)| IpNet::new(a.ip(), *len).ok())
        .collect();
    let (header, read) = if input.forwarded {
        (ClientIpHeader::Forwarded, "forwarded")
    } else {
        (ClientIpHeader::XForwardedFor, "x-forwarded-for")
    };
    let resolver = ClientIpResolver::new(trusted).with_header(header);
    let mut headers = HeaderMap::new();
    let mut forwarding: Vec<Vec<u8>> = Vec::new();
    for (which, value) in &input.headers {
        let name = NAMES[usize::from(*which) % NAMES.len()];
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid name");
        let Ok(value) = HeaderValue::from_bytes(value) else {
            continue;
        };
        if name == read {
            forwarding.push(value.as_bytes().to_vec());
        }
        headers.append(name, value);
    }
    let peer = input.peer.as_ref().map(Addr::ip);
    let client = resolver.resolve(peer, &headers);
    let Some(peer) = peer else {
        assert_eq!(client, None);
        return;
    };
    let peer = canonical(peer);
    let client = client.expect("a peer gives a client");
    if !resolver.is_trusted(peer) {
        assert_eq!(client, peer, "an untrusted peer chose its key");
        return;
    }
    if client != peer {
        assert!(
            written(&forwarding).contains(&client),
            "{client} is not written in {read}: {headers:?}"
        );
    }
    // Headers other than the one read change nothing.
    let mut only = HeaderMap::new();
    for v in headers.get_all(read) {
        only.append(read, v.clone());
    }
    assert_eq!(resolver.resolve(Some(peer), &only), Some(client));
});
