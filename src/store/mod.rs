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

use std::time::Duration;

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

/// Where Redis is: one server, or a Redis Cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedisServers {
    /// One Redis (`url`): `redis://[user:password@]host[:port][/db]` (or
    /// `unix:///path/to/redis.sock`). No TLS: `rediss://` is refused.
    Single(String),
    /// A Redis Cluster (`cluster_nodes`): one or more seed nodes,
    /// `redis://[user:password@]host:port` (no TLS); the client discovers the
    /// others and follows `MOVED`/`ASK` redirections.
    Cluster(Vec<String>),
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
