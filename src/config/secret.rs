//! A secret from the configuration, the admin token: kept out of `{:?}`, compared in
//! constant time, wiped from memory when dropped.
//!
//! The comparison and the wiping are well-kept crates', not hand-written: a digest of
//! each side compared with `subtle`'s `ct_eq` (which the optimiser cannot turn into an
//! early exit), and the text and its digest held in `zeroize`'s `Zeroizing`.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// A secret (`[admin] token`): its `Debug` shows `***`, so that a config or the
/// settings holding it can be logged (`tracing::debug!(?config)`) without it, and it
/// has no `Display`. [`expose`](Self::expose) gives its text to the one that sends or
/// checks it. Its text and its digest are overwritten with zeros when it is dropped.
///
/// ```
/// use rocgate::config::Secret;
///
/// let token = Secret::new("s3cr3t");
/// assert_eq!(format!("{token:?}"), "***");
/// assert!(token.matches(b"s3cr3t"));
/// assert!(!token.matches(b"s3cr3"));
/// assert_eq!(token.expose(), "s3cr3t");
/// ```
#[derive(Clone)]
pub struct Secret {
    text: Zeroizing<String>,
    /// The SHA-256 digest of `text`, taken once: [`matches`](Self::matches) hashes
    /// only what it is given.
    digest: Zeroizing<[u8; 32]>,
}

impl Secret {
    /// The secret `text`.
    pub fn new(text: impl Into<String>) -> Self {
        let text = Zeroizing::new(text.into());
        let digest = Zeroizing::new(Sha256::digest(text.as_bytes()).into());
        Secret { text, digest }
    }

    /// The secret's text.
    pub fn expose(&self) -> &str {
        &self.text
    }

    /// Whether `given` is the secret, byte for byte. The SHA-256 digest of `given` is
    /// compared in constant time with the secret's, taken when the secret was made, so
    /// that the time taken says nothing about the secret, not even its length (hashing
    /// `given` takes a time that depends on its own length only). An empty secret
    /// matches nothing.
    pub fn matches(&self, given: &[u8]) -> bool {
        if self.text.is_empty() {
            return false;
        }
        Sha256::digest(given).ct_eq(&self.digest[..]).into()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Two secrets are equal when their texts are: their digests are compared in constant
/// time, as [`Secret::matches`] compares (two empty ones are equal too).
impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.digest[..].ct_eq(&other.digest[..]).into()
    }
}

impl Eq for Secret {}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Secret::new(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Secret::new(text)
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn a_secret_matches_its_bytes_only() {
        let token = Secret::new("t0k");
        assert!(token.matches(b"t0k"));
        for other in [&b""[..], b"t0", b"t0kt0k", b"T0K", b"t0j", b"x0k"] {
            assert!(!token.matches(other), "{other:?}");
        }
        assert!(!Secret::new("").matches(b""));
        assert_eq!(Secret::new("t0k"), Secret::from("t0k"));
        assert_ne!(Secret::new("t0k"), Secret::from("t0kt0k"));
        assert_eq!(Secret::new(""), Secret::from(""));
        assert_ne!(Secret::new(""), Secret::from("t0k"));
        // Neither of a secret and its text doubled matches the other.
        assert!(!Secret::new("t0kt0k").matches(b"t0k"));
        assert_ne!(Secret::new("t0kt0k"), Secret::from("t0k"));
    }
}
