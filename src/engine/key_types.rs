//! The keys the key tables are keyed by: [`TableKey`] (a request's [`Key`], owned),
//! [`IpKey`] (a client IP cut to its route's IPv6 prefix) and [`ValueKey`] (a header
//! value, whole or by its digest), and [`tier_index`], each tier value by the key bits
//! it matches.

use super::Key;
#[cfg(feature = "http")]
use crate::config::{credentials_fold, host_name};
use crate::config::{Partition, RouteConfig, MAX_KEY_VALUE_BYTES};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

/// A [`Key`] as the key tables take it, and owned: a header value by its 16-byte
/// [`ValueKey`] (the value whole up to [`MAX_KEY_VALUE_BYTES`], else a digest), made
/// once per request. A paced request keeps it to give its place back with, holding no
/// copy of its header value however long.
#[derive(Clone, Copy)]
pub(crate) enum TableKey {
    /// No key.
    None,
    /// A client IP, cut to its route's `ipv6_prefix` by the table.
    Ip(IpAddr),
    /// A header value.
    Value(ValueKey),
}

impl TableKey {
    /// The table key of `key`.
    #[inline]
    pub(crate) fn of(key: Key<'_>) -> Self {
        match key {
            Key::None => TableKey::None,
            Key::Ip(ip) => TableKey::Ip(ip),
            Key::Value(v) => TableKey::Value(ValueKey::new(v)),
        }
    }

    /// The table key of a `header:host` value: that of its
    /// [`host_key`](crate::config::host_key), made with no `String` however the value
    /// is spelled.
    #[cfg(feature = "http")]
    #[inline]
    pub(crate) fn of_host(value: &str) -> Self {
        TableKey::Value(ValueKey::of_lower_case(host_name(value)))
    }

    /// The table key of a `header:authorization` (or `proxy-authorization`) value:
    /// that of its [`credentials_key`](crate::config::credentials_key), made with no
    /// `String` however the value is spelled.
    #[cfg(feature = "http")]
    #[inline]
    pub(crate) fn of_credentials(value: &str) -> Self {
        TableKey::Value(match credentials_fold(value) {
            None => ValueKey::new(value),
            Some((scheme, credentials)) => ValueKey::of_credentials(scheme, credentials),
        })
    }
}

/// The tier of each tier value, by its key's bits, hashed with fixed keys: 16 bytes
/// less in the route than a randomly keyed map, room for the key table's count of the
/// keys refused. Only configured values go in, so no request's key can lengthen a
/// lookup's probe by its hash (a lookup stops at the first empty slot, wherever the
/// configured values left one).
pub(super) type TierIndex =
    HashMap<u128, u16, std::hash::BuildHasherDefault<std::hash::DefaultHasher>>;

/// The tier of each of the route's tier values (tiers counted from 1), by the bits of
/// the key they are (an address of a client-IP partition cut to the route's
/// `ipv6_prefix`, so `::FFFF:10.0.0.7` matches the client 10.0.0.7 and an IPv6 address
/// every client of its prefix; a header value as [`ValueKey::new`] keys it, so a long
/// one by its digest); a value that two tiers hold, which only an address and another
/// of its IPv6 prefix can be, is the first's. A tier value of a client-IP partition
/// that is no address is no client's (the configuration refuses it).
pub(super) fn tier_index(cfg: &RouteConfig) -> TierIndex {
    let mut index = TierIndex::default();
    for (i, tier) in cfg.tiers.iter().enumerate() {
        let n = u16::try_from(i + 1).unwrap_or(u16::MAX);
        for value in &tier.values {
            let bits = match cfg.partition {
                Partition::ClientIp(limits) => match value.parse::<IpAddr>() {
                    Ok(ip) => IpKey::new(ip, limits.ipv6_prefix).bits(),
                    Err(_) => continue,
                },
                _ => ValueKey::new(value).bits(),
            };
            index.entry(bits).or_insert(n);
        }
    }
    index
}

/// A key-table key as the 128 bits its tier is looked up by.
pub(super) trait TierKey {
    fn bits(&self) -> u128;
}

/// A client IP as a key-table key: the IPv6 address's bits (past the route's
/// `ipv6_prefix` zeroed), IPv4 in its IPv4-mapped form, so that a key is 16 bytes with
/// no tag (an `IpAddr` is 17, padded to 24 beside
/// a key's state: 8 B more per key). An IPv4 client and the same address mapped into
/// IPv6 share a key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct IpKey(u128);

/// The prefix of IPv4-mapped IPv6 addresses (`::ffff:0:0/96`), shifted down 32 bits.
const V4_MAPPED: u128 = 0xffff;

impl IpKey {
    /// The key of `ip`: an IPv4 address whole, an IPv6 one by its first `v6_prefix`
    /// bits (1 to 128).
    #[inline]
    pub(super) fn new(ip: IpAddr, v6_prefix: u8) -> Self {
        IpKey(match ip.to_canonical() {
            IpAddr::V4(v4) => V4_MAPPED << 32 | u128::from(v4.to_bits()),
            IpAddr::V6(v6) => {
                v6.to_bits() & (u128::MAX << (128 - u32::from(v6_prefix.clamp(1, 128))))
            }
        })
    }
}

impl Hash for IpKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        // An IPv4 key hashes its 4 bytes only (SipHash's cost grows with the input).
        if self.0 >> 32 == V4_MAPPED {
            state.write_u32(self.0 as u32);
        } else {
            state.write_u128(self.0);
        }
    }
}

impl TierKey for IpKey {
    fn bits(&self) -> u128 {
        self.0
    }
}

/// A header value as a key-table key: 16 bytes in the table's slot, whatever the
/// value's length, and nothing on the heap. A value of up to
/// [`MAX_KEY_VALUE_BYTES`] (15) bytes is kept whole: its bytes, zero-padded, and its
/// length in the 16th byte. A longer one is the first 128 bits of its SHA-256, so that
/// a key costs the same whether its value is a user id, a 1 KiB JWT or the hundreds
/// of KiB an HTTP/1 head may carry.
///
/// Every value has one key on every instance and every run (no seed). Two long values
/// share a key only if their SHA-256s agree in 128 bits: a client who knows this code
/// needs about 2^64 hashes to make two of them collide, and about 2^128 to find a
/// value with another client's key, short or long. A long value whose digest reads as
/// a short one of its own choosing (its 16th byte 15, the rest a header value it could
/// send) takes fewer, about 2^30 for ASCII; either collision only makes the client's
/// own values share one quota. No marker sets a kept value apart from a digest: with 16 bytes to a key
/// there is no bit left for one, and a 17th byte would pad each table slot by 8 (up
/// to 130 B per key just after a table doubles, over the 128 B target).
///
/// Held as bytes, not a `u128`, so that a [`TableKey`] is no bigger and no more aligned
/// than the [`Key`] it is made of (17 bytes and 1, against 24 and 8; a `u128`, aligned
/// to 16, made it 32 and 16).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ValueKey([u8; 16]);

impl ValueKey {
    /// The key of a header value.
    #[inline]
    fn new(value: &str) -> Self {
        let bytes = value.as_bytes();
        let mut key = [0u8; 16];
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= MAX_KEY_VALUE_BYTES => {
                key[..bytes.len()].copy_from_slice(bytes);
                key[15] = len;
            }
            _ => {
                use sha2::Digest as _;
                key.copy_from_slice(&sha2::Sha256::digest(bytes)[..16]);
            }
        }
        ValueKey(key)
    }

    /// The key of `value` in ASCII lower case, with no such value made: a short one is
    /// lower-cased in the key's bytes, a long one as it is hashed
    /// ([`update_lower_case`]), the same key as of the value lower-cased whole.
    #[cfg(feature = "http")]
    fn of_lower_case(value: &str) -> Self {
        let bytes = value.as_bytes();
        let mut key = [0u8; 16];
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= MAX_KEY_VALUE_BYTES => {
                key[..bytes.len()].copy_from_slice(bytes);
                // All 16 bytes, the zeros past the value unchanged: a fixed length the
                // compiler lowers in a few vector instructions.
                key.make_ascii_lowercase();
                key[15] = len;
            }
            _ => {
                use sha2::Digest as _;
                let mut sha = sha2::Sha256::new();
                update_lower_case(&mut sha, bytes);
                key.copy_from_slice(&sha.finalize()[..16]);
            }
        }
        ValueKey(key)
    }

    /// The key of the value `scheme` in lower case, one space, then `credentials` (the
    /// fold of [`credentials_key`](crate::config::credentials_key)), with no such value
    /// made: a short one is written into the key's bytes, a long one hashed in its
    /// three parts (the scheme lower-cased as it is hashed, [`update_lower_case`]), the
    /// same digest as of the value whole.
    #[cfg(feature = "http")]
    fn of_credentials(scheme: &str, credentials: &str) -> Self {
        let (scheme, credentials) = (scheme.as_bytes(), credentials.as_bytes());
        let len = scheme.len() + 1 + credentials.len();
        let mut key = [0u8; 16];
        match u8::try_from(len) {
            Ok(n) if len <= MAX_KEY_VALUE_BYTES => {
                key[..scheme.len()].copy_from_slice(scheme);
                key[..scheme.len()].make_ascii_lowercase();
                key[scheme.len()] = b' ';
                key[scheme.len() + 1..len].copy_from_slice(credentials);
                key[15] = n;
            }
            _ => {
                use sha2::Digest as _;
                let mut sha = sha2::Sha256::new();
                update_lower_case(&mut sha, scheme);
                sha.update(b" ");
                sha.update(credentials);
                key.copy_from_slice(&sha.finalize()[..16]);
            }
        }
        ValueKey(key)
    }
}

/// Hashes `bytes` in ASCII lower case into `sha`, lower-cased on the stack 64 bytes
/// (SHA-256's block) at a time.
#[cfg(feature = "http")]
fn update_lower_case(sha: &mut sha2::Sha256, bytes: &[u8]) {
    use sha2::Digest as _;
    let mut lower = [0u8; 64];
    for piece in bytes.chunks(lower.len()) {
        let lower = &mut lower[..piece.len()];
        lower.copy_from_slice(piece);
        lower.make_ascii_lowercase();
        sha.update(&*lower);
    }
}

impl Hash for ValueKey {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128(self.bits());
    }
}

impl TierKey for ValueKey {
    #[inline]
    fn bits(&self) -> u128 {
        u128::from_le_bytes(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header value of up to 15 bytes is its own key; a longer one is the first 128
    /// bits of its SHA-256, the published one (FIPS 180-2's two-block example), so
    /// that every instance and every build keys it alike.
    #[test]
    fn a_long_header_value_is_keyed_by_its_sha256() {
        let long = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        let sha256_prefix = 0x248d6a61_d20638b8_e5c02693_0c3e6039_u128.swap_bytes();
        assert_eq!(ValueKey::new(long).bits(), sha256_prefix);
        // The same value, one key; values that differ in their last byte, two.
        let (a, b) = (
            format!("{}a", "k".repeat(99_999)),
            format!("{}b", "k".repeat(99_999)),
        );
        assert_eq!(ValueKey::new(&a).bits(), ValueKey::new(&a.clone()).bits());
        assert_ne!(ValueKey::new(&a).bits(), ValueKey::new(&b).bits());
        // Kept whole: its bytes, and its length in the 16th byte, so that "k" and
        // "k\0" are two keys.
        let short = ValueKey::new("fifteen-bytes-k").bits().to_le_bytes();
        assert_eq!(&short[..15], b"fifteen-bytes-k");
        assert_eq!(short[15], 15);
        assert_ne!(ValueKey::new("k").bits(), ValueKey::new("k\0").bits());
        assert_ne!(ValueKey::new("").bits(), ValueKey::new("\0").bits());
    }

    /// The layer's key of a host (the layer's alone: built without `http`, no code
    /// makes one).
    #[cfg(feature = "http")]
    mod hosts {
        use super::*;
        use crate::config::host_key;

        /// The table key the layer makes of a `Host` value.
        fn host_bits(value: &str) -> u128 {
            match TableKey::of_host(value) {
                TableKey::Value(key) => key.bits(),
                _ => panic!("{value:?} is no header value's key"),
            }
        }

        /// Every spelling of a host (letter case, a port, a trailing dot) is keyed as
        /// its name in lower case, sent as it is (the key a host in lower case had when
        /// it was folded into a `String`, which only a name with a capital was): kept
        /// whole up to 15 bytes, by its digest beyond, and beyond the 64 bytes a long
        /// name is lower-cased by at a time.
        #[test]
        fn every_spelling_of_a_host_is_keyed_as_its_name_in_lower_case() {
            let long = format!("{}.example.com", "ab".repeat(40));
            let names = [
                "example.com",
                "fifteen-bytes.x",
                "api.shop-example.com",
                long.as_str(),
                "[2001:db8::1]",
            ];
            for name in names {
                let key = ValueKey::new(name).bits();
                let upper = name.to_ascii_uppercase();
                let mixed: String = name
                    .chars()
                    .enumerate()
                    .map(|(i, c)| {
                        if i % 2 == 0 {
                            c.to_ascii_uppercase()
                        } else {
                            c
                        }
                    })
                    .collect();
                for spelling in [name, &upper, &mixed] {
                    for suffix in ["", ":8080", ":", ".", ".:443"] {
                        if name.starts_with('[') && suffix.starts_with('.') {
                            continue;
                        }
                        let value = format!("{spelling}{suffix}");
                        assert_eq!(host_bits(&value), key, "{value:?} is {name:?}");
                        assert_eq!(
                            host_bits(&value),
                            ValueKey::new(&host_key(&value)).bits(),
                            "{value:?}"
                        );
                    }
                }
            }
            assert_eq!(host_bits("Example.COM"), host_bits("example.com"));
            // Another host, another key.
            for (a, b) in [
                ("example.com", "example.org"),
                ("Example.COM", "example.co"),
                (long.as_str(), &long[1..]),
            ] {
                assert_ne!(host_bits(a), host_bits(b), "{a:?}, {b:?}");
            }
        }

        /// `host_key` as it was when the layer keyed a host by its fold in a
        /// `String` (`ValueKey::new(&host_key(v))`), copied whole: the oracle of the
        /// key a host had.
        fn folded_before(value: &str) -> std::borrow::Cow<'_, str> {
            let end = match value.strip_prefix('[') {
                Some(rest) => rest.find(']').map_or(value.len(), |close| close + 2),
                None => value.find(':').unwrap_or(value.len()),
            };
            let name = &value[..end];
            let name = name
                .strip_suffix('.')
                .filter(|n| !n.is_empty())
                .unwrap_or(name);
            if name.bytes().any(|b| b.is_ascii_uppercase()) {
                std::borrow::Cow::Owned(name.to_ascii_lowercase())
            } else {
                std::borrow::Cow::Borrowed(name)
            }
        }

        /// The key a host had before, at each edge: a name of 14 to 17 bytes (kept
        /// whole up to 15, digested from 16) and of 63 to 66, 128 and 129 (the 64
        /// bytes lower-cased at a time), in capitals, with a port or a trailing dot
        /// beyond those lengths; letters beyond ASCII, capitals among them, which no
        /// fold touches (`É`, `İ`, the Kelvin sign); IPv6 literals with a port and a
        /// zone; a value that is no name (empty, a port alone, a dot alone, brackets
        /// unclosed).
        #[test]
        fn a_host_is_keyed_as_before_at_every_edge() {
            let mut values: Vec<String> = Vec::new();
            for len in [1, 14, 15, 16, 17, 63, 64, 65, 66, 128, 129] {
                // Names of `len` bytes.
                for unit in ["A", "b", "É", "Aé"] {
                    let mut name = unit.repeat(len / unit.len());
                    while name.len() < len {
                        name.push('X');
                    }
                    for suffix in ["", ":8080", ".", ".:443", ":"] {
                        values.push(format!("{name}{suffix}"));
                    }
                }
                let name = "X".repeat(len);
                for suffix in ["", ":80", "."] {
                    values.push(format!("[{name}]{suffix}"));
                }
            }
            for value in [
                "",
                ":",
                ":80",
                ".",
                "..",
                ".:80",
                "a..",
                "[",
                "[]",
                "[]:80",
                "]",
                "[::1",
                "[::1]",
                "[::1]:8080",
                "[::1]x",
                "[2001:DB8::1]:443",
                "[FE80::1%25ETH0]:8080",
                "[fe80::1%eth0]",
                "İstanbul.Example",
                "\u{212A}elvin.example:80",
                "SHOP.EXAMPLE.\u{00C9}",
                "caf\u{00C9}.EXAMPLE.COM.",
                "xn--CAF-DMA.example",
                "Shop Example",
                "@Shop.Example",
            ] {
                values.push(value.to_owned());
            }
            for value in &values {
                assert_eq!(
                    host_bits(value),
                    ValueKey::new(&folded_before(value)).bits(),
                    "{value:?}"
                );
                assert_eq!(folded_before(value), host_key(value), "{value:?}");
            }
            // A byte beyond ASCII is kept as it is: `É` is no `é`, in a kept name and
            // in a digested one.
            assert_ne!(host_bits("\u{00C9}.example"), host_bits("\u{00E9}.example"));
            assert_ne!(
                host_bits("\u{00C9}.shop-example.com"),
                host_bits("\u{00E9}.shop-example.com")
            );
        }

        proptest::proptest! {
            /// Any value, ports and brackets and bytes beyond ASCII too: the layer's
            /// key of it is the key of `host_key`'s fold, and the key it had before.
            #[test]
            fn any_host_is_keyed_as_its_folded_name(value in "[A-Za-z0-9.:\\[\\]é-]{0,90}") {
                proptest::prop_assert_eq!(
                    host_bits(&value),
                    ValueKey::new(&host_key(&value)).bits()
                );
            }

            /// Any printable value, ASCII or not (Latin-1's letters, capitals among
            /// them, `İ`, the Kelvin sign), up to 140 characters: the key it had
            /// before.
            #[test]
            fn any_host_is_keyed_as_before(value in "[ -~\u{00C0}-\u{00FF}\u{0130}\u{212A}]{0,140}") {
                proptest::prop_assert_eq!(
                    host_bits(&value),
                    ValueKey::new(&folded_before(&value)).bits()
                );
            }
        }
    }

    /// The layer's key of a credential (the layer's alone: built without `http`, no
    /// code makes one).
    #[cfg(feature = "http")]
    mod credentials {
        use super::*;
        use crate::config::credentials_key;

        /// The table key the layer makes of an `Authorization` value, which is the
        /// key of its fold, `credentials_key` (and, for a value already folded, of
        /// the value).
        fn credentials_bits(value: &str) -> u128 {
            match TableKey::of_credentials(value) {
                TableKey::Value(key) => key.bits(),
                _ => panic!("{value:?} is no header value's key"),
            }
        }

        /// A credential's key made from its parts is its folded value's key, whatever
        /// the scheme's case and the blanks after it, on either side of the 15 bytes
        /// kept whole (up to 15, 16, a scheme longer than the 64 bytes it is
        /// lower-cased by at a time) and for a value with no blank.
        #[test]
        fn a_credential_is_keyed_as_its_folded_value() {
            let long_scheme = format!("X-{}", "Ab".repeat(70));
            let schemes = ["", "b", "Bearer", "bearer", "BEARER", "Basic", &long_scheme];
            let blanks = [" ", "  ", "\t", " \t ", ""];
            let mut checked = std::collections::HashSet::new();
            for scheme in schemes {
                for blank in blanks {
                    for len in 0..=70 {
                        let credentials: String = "tOk.9-_~+/=".chars().cycle().take(len).collect();
                        let value = format!("{scheme}{blank}{credentials}");
                        let folded = credentials_key(&value);
                        assert_eq!(
                            credentials_bits(&value),
                            ValueKey::new(&folded).bits(),
                            "{value:?}"
                        );
                        checked.insert(folded.len());
                    }
                }
            }
            // Both sides of the boundary were met, folded and kept whole.
            assert!((0..=40)
                .chain([143, 144, 211])
                .all(|n| checked.contains(&n)));
            // One key for every spelling of a credential, short or long; another case
            // of its credentials is another key.
            for credentials in ["t0k", "t0k0123", "t0k01234", "t0k".repeat(20).as_str()] {
                let key = credentials_bits(&format!("bearer {credentials}"));
                for scheme in ["Bearer ", "BEARER   ", "bEaReR\t"] {
                    assert_eq!(credentials_bits(&format!("{scheme}{credentials}")), key);
                }
                let other = credentials.to_ascii_uppercase();
                assert_ne!(credentials_bits(&format!("Bearer {other}")), key);
            }
        }

        proptest::proptest! {
            /// Any value, blanks anywhere, beyond ASCII too: the layer's key of it is
            /// the key of `credentials_key`'s fold.
            #[test]
            fn any_credential_is_keyed_as_its_folded_value(
                value in "[ \tA-Za-z0-9é=.]{0,90}"
            ) {
                proptest::prop_assert_eq!(
                    credentials_bits(&value),
                    ValueKey::new(&credentials_key(&value)).bits()
                );
            }
        }
    }
}
