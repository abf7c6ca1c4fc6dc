//! A secret from the configuration, the admin token: kept out of `{:?}`, compared in
//! constant time.

/// A secret (`[admin] token`): its `Debug` shows `***`, so that a config or the
/// settings holding it can be logged (`tracing::debug!(?config)`) without it, and it
/// has no `Display`. [`expose`](Self::expose) gives its text to the one that sends or
/// checks it.
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
pub struct Secret(String);

impl Secret {
    /// The secret `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Secret(text.into())
    }

    /// The secret's text.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `given` is the secret, byte for byte, compared in a time that depends
    /// on the length of `given` only, so that the time taken says nothing about the
    /// secret, not even its length. An empty secret matches nothing.
    pub fn matches(&self, given: &[u8]) -> bool {
        let secret = self.0.as_bytes();
        if secret.is_empty() {
            return false;
        }
        let differ = given
            .iter()
            .zip(secret.iter().cycle())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y));
        differ == 0 && given.len() == secret.len()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// Two secrets are equal when their texts are, compared as [`Secret::matches`]
/// compares (two empty ones are equal too).
impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other.0.as_bytes()) || (self.0.is_empty() && other.0.is_empty())
    }
}

impl Eq for Secret {}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Secret(text)
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Secret(text.to_owned())
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
    }
}
