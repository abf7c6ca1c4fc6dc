//! Where a route's state lives: in this process (the default), or shared by a fleet of
//! instances in Redis, with a local fallback.
//!
//! This module holds the validated `[store]` settings and the [`breaker`], both pure.
//! The Redis backend itself (the module `redis`, feature `redis`) keeps each
//! distributed route's slotted window, token bucket and controller state in Redis,
//! updated by Lua scripts in one atomic round trip per decision. When Redis errs, is
//! slower than `timeout`, or the breaker is open, the decision is taken locally at
//! this instance's share of the shared limit (shared limit ÷ live instances), so the
//! store can never turn into an outage. A partitioned route, which no store decides,
//! holds its share of its `route_limit` the same way (the fleet's total ÷ live
//! instances).

pub mod breaker;
#[cfg(feature = "redis")]
pub mod redis;

use std::borrow::Cow;
use std::time::Duration;

/// What [`masked_url`] writes in place of a password.
const MASK: &str = "***";

/// `url`, a store's URL as written (`[store] url`, one of `cluster_nodes`), with every
/// password in it replaced by `***`, the rest as written: the user info's
/// (`redis://user:***@cache:6379/3`), the whole user info where it has no `:`
/// (`redis://***@cache`: a password written without its colon, which the config
/// refuses, quoting the URL) and each `pass` or `password` query field's, in
/// any case (`unix:///run/redis.sock?user=u&pass=***&db=1`, as the client reads a
/// socket's).
/// Every error, log line and `Debug` that shows such a URL shows it so, and so do the
/// refusals of an upstream's or `hints --admin`'s URL, which take no user info: an
/// operator pastes them into tickets.
///
/// The user info begins after the scheme's `://` (at the start where no scheme comes
/// before the first `://`) and ends at the last `@` before the path; with no `@`
/// there, at the last `@` of the whole text, so that a password holding `/`, `?` or
/// `#` unencoded (which the client reads as no password, and the config refuses,
/// quoting the URL) is masked too, whatever else that masks. A query field is any
/// `name=value` after a `?` or a `&` past the user info.
///
/// ```
/// use rocgate::store::masked_url;
///
/// assert_eq!(masked_url("redis://fleet:p%40ss@cache:6379/3"), "redis://fleet:***@cache:6379/3");
/// assert_eq!(
///     masked_url("unix:///run/redis.sock?user=u&pass=s3cr3t&db=1"),
///     "unix:///run/redis.sock?user=u&pass=***&db=1"
/// );
/// assert_eq!(masked_url("redis://cache:6379"), "redis://cache:6379");
/// ```
pub fn masked_url(url: &str) -> Cow<'_, str> {
    // A scheme is a letter, then letters, digits, `+`, `-` or `.` (after any
    // whitespace, which the config trims): a `://` later in the text
    // (`fleet:pw@cache/a://b`) is no scheme's, and the user info is before it.
    let start = url
        .find("://")
        .filter(|&at| {
            let mut scheme = url[..at].trim_start().chars();
            scheme.next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        })
        .map_or(0, |at| at + 3);
    let rest = &url[start..];
    let authority = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    // A user info with no `:` is masked whole only before the authority's end: past
    // it, an `@` is a path's or a query's.
    let password = match rest[..authority].rfind('@') {
        Some(at) => Some((rest[..at].find(':').map_or(0, |colon| colon + 1), at)),
        None => rest
            .rfind('@')
            .and_then(|at| rest[..at].find(':').map(|colon| (colon + 1, at))),
    }
    .filter(|(from, to)| from < to);
    // The query's fields are looked for after the user info.
    let (mut out, after) = match password {
        Some((from, to)) => (format!("{}{MASK}", &url[..start + from]), start + to),
        None => (url[..start].to_owned(), start),
    };
    let mut masked = password.is_some();
    // Each piece after a `?` or a `&` is a field (`pass=pw&`); the first is none.
    for (i, piece) in url[after..].split_inclusive(['?', '&']).enumerate() {
        let field = piece.trim_end_matches(['?', '&']);
        match field.split_once('=') {
            Some((key, value)) if i > 0 && !value.is_empty() && is_password_field(key) => {
                masked = true;
                out.push_str(&format!("{key}={MASK}{}", &piece[field.len()..]));
            }
            _ => out.push_str(piece),
        }
    }
    if masked {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(url)
    }
}

/// Whether a query field's name, as written, is `pass` or `password` once
/// percent-decoded (`pa%73s`), as the client decodes it, in any case: a `PASS` the
/// client does not read is refused, its URL quoted.
fn is_password_field(key: &str) -> bool {
    let bytes = key.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                decoded.push(b);
                i += 3;
            }
            (b, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    decoded.eq_ignore_ascii_case(b"pass") || decoded.eq_ignore_ascii_case(b"password")
}

/// `[store]`: where shared state lives.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// Every instance on its own (the default); no Redis anywhere.
    #[default]
    Local,
    /// Distributed routes share their state in Redis.
    Redis(RedisConfig),
}

/// Where Redis is: one server, or a Redis Cluster. `Debug` shows each URL with its
/// password masked ([`masked_url`]).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisServers {
    /// One Redis (`url`): `redis://[user:password@]host[:port][/db]` (or
    /// `unix:///path/to/redis.sock`). No TLS: `rediss://` is refused.
    Single(String),
    /// A Redis Cluster (`cluster_nodes`): one or more seed nodes,
    /// `redis://[user:password@]host:port` (no TLS); the client discovers the
    /// others, and a call refused with `MOVED` is sent again to the slot's new node
    /// (an `ASK` is not followed: `rocgate::store::redis`'s module docs).
    Cluster(Vec<String>),
}

impl std::fmt::Debug for RedisServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisServers::Single(url) => f.debug_tuple("Single").field(&masked_url(url)).finish(),
            RedisServers::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|n| masked_url(n)).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// `[store]` with `backend = "redis"`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// One Redis or a Redis Cluster.
    pub servers: RedisServers,
    /// Longest a decision waits for Redis before deciding locally.
    pub timeout: Duration,
    /// Prefix of every key rocgate writes (several fleets can share one Redis).
    pub key_prefix: String,
    /// What a decision does when Redis cannot answer in time.
    pub fail_mode: FailMode,
    /// One round trip per decision, or local decisions synchronised once per slot.
    pub mode: SyncMode,
    /// How often an instance announces itself (at least every millisecond); it counts
    /// as gone after 3 missed beats.
    pub heartbeat: Duration,
    /// Failures in a row that open the breaker.
    pub failures_to_open: u32,
    /// While the breaker is open, one decision per interval tries Redis again.
    pub probe_interval: Duration,
    /// How long a route's keys outlive its last request; the route's burst and window,
    /// each with one slot more, if longer (an expired key must not hand out tokens or
    /// drop history that the route would still have).
    pub key_ttl: Duration,
    /// This instance's name (logs, `GET /admin/store`); a random one when unset. Its
    /// member of the heartbeat set is the name followed by random bits, so instances
    /// given the same name (one config file for the fleet) still count as two, and by
    /// how long its beat counts.
    pub instance_id: Option<String>,
    /// The live instances this one assumes until a heartbeat has counted them (its
    /// share is the shared limit ÷ this, and so is its share of a partitioned route's
    /// `route_limit`): bounds what a fleet started while Redis is unreachable admits. Not a floor: once counted, the count is the heartbeat's.
    pub expected_instances: u16,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            servers: RedisServers::Single("redis://127.0.0.1:6379".into()),
            timeout: Duration::from_millis(50),
            key_prefix: "rocgate".into(),
            fail_mode: FailMode::Local,
            mode: SyncMode::Exact,
            heartbeat: Duration::from_secs(1),
            failures_to_open: 3,
            probe_interval: Duration::from_millis(250),
            key_ttl: Duration::from_secs(600),
            instance_id: None,
            expected_instances: 1,
        }
    }
}

/// How decisions use the shared state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyncMode {
    /// Every decision is one atomic round trip on the shared window and bucket.
    #[default]
    Exact,
    /// Decisions are local, at this instance's share of the shared limit; each
    /// instance adds its arrivals to the shared window once per slot and learns the
    /// shared limit back. No round trip on the hot path; see the module `redis`
    /// (feature `redis`) for the bound.
    Batched,
}

impl SyncMode {
    /// The name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Exact => "exact",
            SyncMode::Batched => "batched",
        }
    }
}

/// What a decision does when the shared store cannot answer in time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailMode {
    /// Decide locally at this instance's share of the shared limit (the default).
    #[default]
    Local,
    /// Admit.
    Open,
    /// Reject (reason `fallback_local`, with the route's reject status).
    Closed,
}

impl FailMode {
    /// The name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            FailMode::Local => "local",
            FailMode::Open => "open",
            FailMode::Closed => "closed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::masked_url;

    proptest::proptest! {
        /// Whatever a user info holds before the host, what could be a password in it
        /// (past its first `:`, or all of it with no `:`) is not shown, and the host,
        /// port and database are.
        #[test]
        fn a_user_info_never_shows_its_password(
            user in "[a-z0-9:%!$&'()*+,;=.~-]{0,12}",
            password in "[A-Z][A-Za-z0-9:%!$&'()*+,;=.~@-]{5,12}",
            colon in proptest::bool::ANY,
        ) {
            // With no `:` before it, the password holds none (a `:` in it would make
            // what comes before it a user name).
            let password = if colon { password } else { password.replace(':', "") };
            let info = if colon { format!("{user}:{password}") } else { password.clone() };
            let url = format!("redis://{info}@cache:6379/1");
            let shown = masked_url(&url);
            proptest::prop_assert!(!shown.contains(&password), "{url} shown as {shown}");
            proptest::prop_assert!(shown.ends_with("***@cache:6379/1"), "{url} shown as {shown}");
        }
    }

    #[test]
    fn masked_url_hides_every_password_and_keeps_the_rest() {
        for (url, shown) in [
            ("redis://cache:6379/2", "redis://cache:6379/2"),
            // A user info with no `:` is hidden whole: it is often a password
            // written without its colon.
            ("redis://s3cr3t@cache", "redis://***@cache"),
            ("s3cr3t@cache:6379", "***@cache:6379"),
            ("redis://@cache", "redis://@cache"),
            ("redis://fleet:@cache", "redis://fleet:@cache"),
            ("redis://:pw@cache:6379", "redis://:***@cache:6379"),
            (
                "redis://fleet:p%40ss@[::1]:6379/3?protocol=resp3#x",
                "redis://fleet:***@[::1]:6379/3?protocol=resp3#x",
            ),
            // A password with `@`, `/`, `?` or `#` unencoded: all of it is hidden.
            ("redis://fleet:p@ss@cache", "redis://fleet:***@cache"),
            ("redis://fleet:pa/ss@cache/1", "redis://fleet:***@cache/1"),
            ("redis://fleet:pa?ss@cache", "redis://fleet:***@cache"),
            ("redis://fleet:pa#ss@cache", "redis://fleet:***@cache"),
            // No scheme: the user info is still found.
            ("fleet:pw@cache:6379", "fleet:***@cache:6379"),
            // A socket's password is a query field, its name percent-decoded.
            (
                "unix:///run/redis.sock?db=1&user=u&pass=pw&protocol=3",
                "unix:///run/redis.sock?db=1&user=u&pass=***&protocol=3",
            ),
            (
                "redis+unix:///run/redis.sock?pa%73s=pw&password=pw2&pass=",
                "redis+unix:///run/redis.sock?pa%73s=***&password=***&pass=",
            ),
            (
                "unix:///run/redis.sock?user=a@b&pass=pw",
                "unix:///run/redis.sock?user=a@b&pass=***",
            ),
            ("rediss://u:pw@h?pass=pw", "rediss://u:***@h?pass=***"),
            // A `://` after the user info is no scheme's.
            ("fleet:pw@cache:6379/a://b", "fleet:***@cache:6379/a://b"),
            ("fleet:pw@cache?x=redis://h", "fleet:***@cache?x=redis://h"),
            // Whitespace before the scheme, which the config trims: the scheme is kept.
            (" rediss://u:pw@h:6380 ", " rediss://u:***@h:6380 "),
            // A password field named in any case (which the client does not read, and
            // the config refuses, quoting the URL).
            (
                "unix:///run/redis.sock?PASS=pw&Password=pw2",
                "unix:///run/redis.sock?PASS=***&Password=***",
            ),
            // An `@` in the query: its fields after it are still read.
            (
                "redis://cache/?protocol=a@b&pass=pw",
                "redis://cache/?protocol=a@b&pass=***",
            ),
        ] {
            assert_eq!(masked_url(url), shown, "{url}");
        }
    }
}
