//! The Redis backend: a distributed route's window, bucket and controller state shared
//! by every instance, one atomic round trip per decision, with a local fallback.
//!
//! Each decision runs [`DECIDE`] (by SHA, and by body on `NOSCRIPT`),
//! which reads the time from Redis (`TIME`, so instance clocks never matter), counts
//! the arrival in the shared slotted window, takes a token from the shared bucket
//! refilling at the shared limit, and answers with the decision, the shared limit and
//! the controller state. The one call that observes a new slot wins the rollover: the
//! script hands it the completed slots' counts and the controller's memory, and this
//! instance steps the ordinary [`Controller`] on them (in a task of its own, off the
//! decision's path) and stores the result with [`SAVE`], guarded so that a late writer
//! cannot overwrite a newer step. Every instance then enforces the same limit and cuts
//! together, and the controller is written once, in Rust.
//!
//! Keys: `{<prefix>:<route>}:w` (window: `cur` and one field per slot index, kept two
//! windows), `:b` (bucket: `tokens`, `ts`), `:c` (controller); and `:probe`, which
//! the heartbeat's probe of a route in fallback names and never creates. The braces
//! are a Redis Cluster hash tag, so a route's keys share one slot and one script may
//! touch them all. Every key has an expiry (`key_ttl`, or the route's burst and
//! window if longer, each with one slot more), renewed once per slot. Instances
//! announce themselves in the sorted set `{<prefix>}:instances` ([`HEARTBEAT`]) and
//! learn the live count (`expected_instances` until then; one that finds itself
//! missing from the set, lost with Redis, or beats again after a beat that failed,
//! lets the count fall only three beats later).
//!
//! Redis Cluster (`cluster_nodes`): the same scripts over redis-rs's cluster client,
//! which sends each call to the master of its keys' slot. Each [`DECIDE`] and [`SAVE`]
//! call touches one route's keys only, so one slot; [`HEARTBEAT`] touches its own key
//! only. Scripts go by `EVALSHA`, and by `EVAL` on `NOSCRIPT` (routed like any keyed
//! command, where `SCRIPT LOAD` would go to every master and fail while any is down). A
//! call is sent again only after a node refused it, which proves that no node ran it:
//! `MOVED` (at once, to the slot's node on the map the `MOVED` had the client refresh),
//! `TRYAGAIN` or `CLUSTERDOWN` (after 5 ms, then 10, to the slot's node); at most twice
//! per call, while the decision still waits for it. Never by address to the node a
//! redirection names: the client fails a call routed to a node it holds no connection
//! to with `ClusterConnectionNotFound` and then reconnects to every seed node and every
//! node of its map. So an `ASK` (a slot being migrated, whose key the node named imports)
//! is not followed: the call falls back for the migration's moment.
//! The client is built with no retries of its own: it hands back only its last try's
//! error, and a try before whose reply was lost (its connection dropped, or the reply
//! came late) may have run the call, which sent again would be applied twice (a token
//! taken twice, or a batched sync's arrivals counted twice). A call whose connection
//! failed is decided locally instead, as on one server, whose connection sends each
//! call once, not again on a new connection after its own dropped: redis-rs 1.8 fails a
//! call that never left (its connection had closed already) and one whose reply was
//! lost with the same error (a broken pipe), and [`DECIDE`] applied twice counts twice.
//! During a failover a node not yet told of it (the dead master's replica, to which the
//! client sends the slot's calls while it holds no connection to the master) answers
//! `MOVED` to the dead master: the call goes to the slot's node on the refreshed map,
//! and falls back if refused again.
//!
//! While Redis refuses connections or is away, connection attempts are spaced: one at
//! a time, the waits doubling from `timeout` up to `probe_interval` (with jitter), and
//! the calls in between fail at once with the last attempt's error (the refusal named:
//! `WRONGPASS`, `NOAUTH`), decided by `fail_mode` in the same request. Only an answer
//! on a connection that has lasted the backoff's current step ends the run. At the
//! run's first failure, one server's next connection is opened as soon as the last is
//! known gone (a call failed on it, or, on RESP3, the connection's notice of its end).
//! On a cluster this holds while the client reaches no node at all; one node away is
//! repaired by the client, with a backoff of its own.
//!
//! Failure: a call that errs or takes longer than `timeout` is decided locally within
//! the same request, at this instance's share (the shared limit last seen ÷ the live
//! instances last seen), or by `fail_mode`. Each route has a [`Breaker`]: it stops
//! calling Redis for that route after `failures_to_open` failures in a row and lets
//! one call probe it per `probe_interval`: a decision's, or the heartbeat's (a
//! `SETRANGE` of nothing on the route's `:probe` key, a write refused where the
//! script would be, so that a route with no traffic comes back too, about one
//! heartbeat after its probe is due; on one server only after a beat that reached
//! it). The first answer returns the route to shared state, its controller rearmed
//! for one window by the route's next call (the decisions taken locally meanwhile are
//! missing from the shared window: see [`DECIDE`]'s `ARGV[9]`). On a cluster a dead
//! master thus sends only the routes it holds to fallback. The instance counts as in
//! fallback while any route is. A heartbeat that
//! Redis does not answer within `timeout` replaces the connection (one server), which
//! could otherwise have gone dark, silent and never erring, for minutes. On a cluster,
//! whose client reconnects to a node only when its connection errs, a call (or heartbeat) that times out starts a try of a new
//! cluster connection (at most one per heartbeat), taken if it answers on that call's
//! keys: a node silent on every connection leaves the old one in place. Every
//! connection also probes with TCP keepalive and (Linux) a user timeout set from
//! `timeout`, so the kernel closes one whose peer vanished.
//!
//! No switch brings a fresh burst (exact mode, `fail_mode = "local"`): each answer
//! lowers the route's fallback bucket to this instance's share of the level the shared
//! bucket answered with ([`TokenBucket::lower_to`]: never a refill), so at a switch to
//! fallback the instances' buckets hold together about what the shared one held; and
//! what the fallback bucket admits is debited from the shared bucket by the first
//! call that reaches Redis again (`ARGV[8]` of [`DECIDE`]: after the refill, never
//! below empty), so the shared bucket does not refill for time the fleet already
//! used. A route that the heartbeat's probe brought back, with no call, has its debt
//! sent by that beat ([`DEBIT`]: the refill and the debit alone), so that it reaches
//! the shared bucket whether or not the route decides again. A call or debit that
//! failed keeps its debit owed, to send again (the route's next decision, or the next
//! beat): a timed-out call that Redis runs later debits twice (never not at all).
//! Each sender takes the debt whole (a swap), so no two send the same. The fleet's bound over `T`
//! therefore stays `limit × (T + burst)` across switches, plus at each switch what an
//! instance's bucket holds beyond its share of the shared level: what the others took
//! since its last answer, or its whole share of a burst if it made no shared decision
//! (README: Distributed mode).
//!
//! Batched mode (`mode = "batched"`) takes Redis off the hot path: each decision is
//! local, on a token bucket at this instance's share of the shared limit, and counts
//! the request; the first decision of each sync slot starts, in a
//! task of its own, one [`DECIDE`] call that adds the arrivals since the last sync to
//! the shared window without taking a token, and learns the shared limit and
//! controller state back (rollovers step the controller as in exact mode); the same
//! task sends the arrivals that follow at the sync slot's end, unless a decision of the
//! next one has sent them. Sync slots are the route's slots on the instance's clock,
//! shifted to begin halfway through Redis's (where the answers say Redis's begin; the
//! instance's own slots until one does), so that each sync lands in the slot it is
//! meant for, however late, up to half a slot.
//! Its bounds:
//! - admission: instance `i` admits at most `limit ÷ n` per second plus a burst of
//!   `limit ÷ n × burst`, so the fleet admits at most what exact mode admits
//!   (`limit × (T + burst)` over `T`), if `n` is the true live count. With uneven load
//!   the fleet admits less: an instance cannot lend its unused share to another. A
//!   bucket holds at least one request, so where a share of the burst is under one
//!   (`limit × burst < n`) the fleet's burst is `n`, not `limit × burst`: a route that
//!   slow on a fleet that large is exact mode's.
//! - the window: while Redis answers, every arrival reaches it, at most one slot and
//!   one round trip late (the arrivals of a failed or skipped sync are dropped rather
//!   than dumped into a later slot as a false spike, and the next call answered
//!   rearms the shared controller for one window, as a probe back from fallback does:
//!   see [`DECIDE`]'s `ARGV[9]`); so ROC, cuts and restores lag exact mode by that
//!   much, and a new limit reaches an instance at its next sync (one slot, while it
//!   has traffic).
//!
//! Distributed routes are those limited as a whole (`partition = "route"`) with the
//! token bucket, in `enforce` or `shadow` mode, with at most 1000 slots per window;
//! other routes are decided by the local engine as before ([`RedisStore::shares`]).
//! A partitioned route's `route_limit`, which no call here decides, is the fleet's
//! total all the same: the store shares it among the live instances in the engine it
//! follows ([`RedisStore::follow`], [`Engine::set_route_limit_share`]), at start and
//! at each change of the count, so that each instance holds `route_limit ÷ n` (its
//! burst too), the last count holding in fallback. Its bound is batched mode's for
//! its share: about `route_limit` over the fleet while the balancer spreads the
//! route's traffic evenly, less when unevenly (one instance that receives it all
//! admits its share alone).

use super::breaker::{Breaker, Call};
use super::{FailMode, RedisConfig, RedisServers, SyncMode};
use crate::clock::{Clock, Nanos};
use crate::config::{Mode, Partition, MIN_LIMIT};
use crate::controller::{
    Controller, ControllerMemory, ControllerParams, ControllerState, Transition, TransitionCounts,
};
use crate::engine::{Engine, RouteId, Schedule};
use crate::hints::FleetDemand;
use crate::limiter::{Admit, Algorithm, Decision, Level, Reason, Rejection, TokenBucket};
use crate::metrics as metric;
use crate::window::{RocSample, SampleAt, SlotRing, WindowSpec};
use arc_swap::ArcSwap;
use dashmap::DashMap;
use metrics::{Counter, Gauge};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, ProtocolVersion,
    PushInfo, PushKind, RedisError, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value,
};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

/// The Lua that [`DECIDE`] and [`DEBIT`] are both built from, so that a debit refills
/// the shared bucket exactly as a decision does: two functions defined at the head of
/// each script.
///
/// - `shared_limit(stored, base)`: the limit a route's bucket refills at, the stored
///   controller `limit` capped by the instance's base limit in force, or the base where
///   the stored one is none or no limit the config takes (below 0.000001 req/s, `nan`).
/// - `refill(key, limit, burst, now)`: reads the bucket hash `key` (`tokens`, `ts`) and
///   returns its level refilled to `now` (µs) at `limit`, capped at its capacity
///   (`max(floor(limit × burst + 1e-6), 1)`), and whether the bucket was missing (then
///   it starts full); a level that is no number, or below empty, reads empty. Writes
///   nothing: the caller stores the level with `ts` now.
macro_rules! bucket_lua {
    () => {
        r"
local function shared_limit(stored, base)
  local limit = tonumber(stored) or base
  if not (limit >= 0.000001) or base < limit then limit = base end
  return limit
end
local function refill(key, limit, burst, now)
  local cap = math.max(math.floor(limit * burst + 1e-6), 1)
  local b = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(b[1])
  local ts = tonumber(b[2])
  local created = tokens == nil or ts == nil
  if created then tokens = cap; ts = now end
  if not (tokens >= 0) then tokens = 0 end
  if now > ts then tokens = tokens + (now - ts) * limit / 1000000 end
  if tokens > cap then tokens = cap end
  return tokens, created
end"
    };
}

/// One decision on a route's shared state.
///
/// - `KEYS[1]` window hash: `cur` (the slot accumulating) and one field per slot index
///   (arrivals in it).
/// - `KEYS[2]` bucket hash: `tokens` (float) and `ts` (µs, Redis time).
/// - `KEYS[3]` controller hash: `limit`, `state` (0 normal, 1 cut, 2 recovering; any
///   other, normal),
///   `through` (last slot stepped), `entered`, `armed`, `safe` (ns, Redis time), `roc`,
///   `slot_us` (the slot length, µs, that the slot numbers of the window and of
///   `through` count), `slots` (slots per window the controller last stepped on),
///   `rate` (the fleet's demand, req/s, in the later half of the last window stepped:
///   the sample whose ROC is `roc`) and `raise` (`<through>:<ns>`: when, Redis time,
///   the limit next rises if the last slot's demand holds, as the instance that
///   stepped through `through` projected it from the window's completed slots;
///   nothing after the colon: it does not rise); after Redis lost it, `view` and
///   `seeded` (see `ARGV[10]` below). A carry-over drops `raise`, and so does a call
///   that drops `through` (a changed slot length, a window ahead of Redis's clock, a rearm):
///   a raise is told only beside the `through` it was projected at.
/// - `ARGV[1]` slot length, µs; `ARGV[2]` slots per window; `ARGV[3]` the calling
///   instance's base limit in force: the limit until the controller hash has one (a
///   stored `limit` that is no limit the config takes, such as `nan` or one below
///   0.000001 req/s, counts as none: a refusal's wait at `1e-300` would pass what
///   Redis answers as an integer), and
///   a cap on the stored one (a base lowered by a reload, a runtime change or a
///   scheduled event applies to the instance's next call, before the controller is
///   stepped under it; a raised one waits for that step); `ARGV[4]` bucket burst,
///   seconds;
///   `ARGV[5]` key expiry, ms; `ARGV[6]` arrivals to count (1 per decision; a
///   slot's worth in batched mode); `ARGV[7]` `1` to take a token, `0` to only count
///   (batched mode: the answer then always admits); `ARGV[8]` tokens to debit before
///   taking one (exact mode: what this instance admitted in fallback since it last
///   reached Redis; absent means 0). The debit comes after the refill and never takes
///   the bucket below empty, where an admission of its last token leaves it.
///   `ARGV[9]` `1` if the window missed arrivals (the call is the probe of a route
///   in fallback, whose decisions were taken locally, or the first call answered
///   since the heartbeat's probe brought the route back, or, in batched mode, the
///   first call answered since a sync of the instance failed or was skipped, whose
///   arrivals were dropped): drops `through`, as below.
/// - `ARGV[10]` to `ARGV[14]`, absent but from an instance that saw the controller
///   stepped, recently (see `Seed`): the state it saw (`0`|`1`|`2`), its limit, when
///   it was entered (ns, Redis time; empty where the instance does not know), its ROC
///   and when that view was answered (µs, Redis time). Where the controller hash
///   holds no step (no `roc`: Redis restarted empty, was flushed, or the key was
///   evicted or expired), or holds a step carried over that has not been stepped
///   since (`seeded`, the `through` it was carried at, still `through`), a view newer
///   than the newest carried so far (`view`) is carried: a cut or a restore is
///   written into the hash (`entered` now where empty), rearmed for one window from
///   now (`armed`; no `safe`), `through` the slot before now: the controller goes on
///   from what the instance saw rather than afresh at the base limit, and a step
///   handed out on the hash as it was before (whose `through` was another, or none)
///   cannot be stored over it (a view of the state carried already leaves it as it
///   is: one carry-over, one warning); a normal view removes a step carried over (the
///   hash holds no step again: afresh, at the base limit). Either way `view` records
///   it, so
///   that an older view, come later, changes nothing: a cut that one instance last
///   saw does not come back over the restore that another saw after it. One script:
///   the newest view to call before the carried controller is stepped wins.
///
/// A call whose slot length differs from `slot_us` (a reload, or a release, changed
/// the route's slot) starts the window afresh: slot numbers counted in another length
/// mean nothing, and a window kept with longer slots would otherwise never see a new
/// slot. Such a call, or one whose slots per window differ from `slots` (a longer
/// window would read the slots deleted under the shorter one as empty: a false
/// spike), drops `through`, and the stored controller then continues from its
/// memory, rearmed for one window as a local route is on such a reload.
///
/// A call that says the window missed arrivals (`ARGV[9]`) drops `through` too: the
/// slots of the gap read as a fall, and the traffic back as a rise that would cut a
/// steady route fleet-wide; rearmed, the controller takes no action until the window
/// holds a whole window of counts again. In batched mode one failed sync leaves a
/// hole of a slot (of the instance's arrivals): `k` holes in a half-window of `h`
/// slots read, once in the earlier half, as a rise of `k ÷ h` of the route's rate
/// (absolute mode; `k ÷ (h − k)` relative), which a steady route at high load, or on
/// a short window, passes `danger_roc` by (a 1 s window of 100 ms slots at 100 req/s
/// read 60 for 3 holes, against a `danger_roc` of 40), before the breaker opens.
///
/// A window whose `cur` is more than a window ahead of the slot now (Redis's clock
/// went back by more than a window), or no number (`nan`, written by another client),
/// starts afresh too, and drops `through`; so does a `through` more than a window
/// ahead, or no slot (no number, below 0 or a fraction), alone: otherwise no call would
/// observe a new slot, or find one after `through` to step, or store its step over a
/// `through` it read as another slot, and the controller would not step, until the
/// clock caught up (for ever, for a NaN or no slot). A `through` kept is handed over
/// in whole digits, however it is spelled (` 42`, `0x2a` read as 42 here, and as no
/// number by the caller, whose save would then never match it). (The controller's stored times, then ahead of it too, are
/// brought back to now when it is stepped: see `replay`.)
///
/// A stored bucket level that is no level (NaN, infinite below, or below empty, which
/// no call stores) counts as empty.
///
/// A count of the slot now that is no integer (`nan`, `1.5`, written by another
/// client), on which `HINCRBY` errs, is counted over: the field is set to this call's
/// arrivals (`redis.pcall`, so that no call pays a read for it), where the script
/// failed, and every call of the slot fell back, until the next slot.
///
/// The bucket refills for the time since its `ts`, and is stamped with the time now
/// even when that is earlier than `ts` (Redis's clock went back: the host's clock
/// stepped, or a failover to a replica whose clock is behind the old master's): it
/// then refills from now, rather than not at all until the clock passes `ts` again.
///
/// Expiries are set when a key is created and renewed by the first call of each slot
/// (a route's keys therefore outlive its last request by `ARGV[5]` at most, and at
/// least that less one slot).
///
/// The call that observes a new slot hands the slots completed since `through` to
/// its caller to step the controller over (see `replay`): at most one window of the
/// slots up to `cur` (the last slot that had a call), with a window of counts before
/// each, and none of the silent slots after `cur`, which all count zero (as does a
/// count that is no count, such as `nan`, which `HINCRBY` never stores).
///
/// Returns `{admit (1|0), wait µs, limit, state, now µs, slot, roc, tokens, roll,
/// rate, memory, seeded, view}`; `limit` is the one the call was decided at (the stored one, or
/// `ARGV[3]` if lower); `tokens` is the bucket's level after this call (nil when
/// `ARGV[7]` is `0`); `roll` is nil but for the call that observed a new slot: `{lo,
/// counts of slots lo..cur (or lo..slot-1, whichever ends first; none when `cur` is
/// before `lo`), controller fields (limit, state, through, entered, armed, safe, roc,
/// slot_us, slots, rate, view, seeded, raise)}`; `rate` is the stored `rate` (nil
/// before a step stored one: an older release's `SAVE` stores none, and leaves the
/// last one in place; a field more of the hash already read, no call more); `memory`
/// is present only while the controller is not normal, for a call that was refused
/// or took no token (batched mode): the controller fields as in `roll`, from which
/// the caller tells when the limit will next rise (the `Retry-After` of a rejection
/// for a cut: the stored `raise`, where it was projected at the stored `through`, of
/// one of the two slots before the call's); `seeded` is `1` if this call wrote the
/// caller's cut or restore (`ARGV[10]`) into the controller hash (`memory` then nil
/// where it has none); `view` is the `view` of a controller carried over and not
/// stepped since: the time of the view it was carried from, which is what an answer
/// on it tells (an answer's own time would make each a newer view, carried again
/// and rearmed at each call, never stepped). Both are absent otherwise.
pub const DECIDE: &str = concat!(
    bucket_lua!(),
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local slot_us = tonumber(ARGV[1])
local slots = tonumber(ARGV[2])
local ttl = ARGV[5]
local slot = math.floor(now / slot_us)
local ctl = redis.call('HMGET', KEYS[3], 'limit', 'state', 'through', 'entered', 'armed', 'safe', 'roc', 'slot_us', 'slots', 'rate', 'view', 'seeded', 'raise')
local cur = tonumber(redis.call('HGET', KEYS[1], 'cur'))
if ctl[8] ~= ARGV[1] or ctl[9] ~= ARGV[2] then
  if ctl[8] and ctl[8] ~= ARGV[1] then
    redis.call('DEL', KEYS[1])
    cur = nil
  end
  if ctl[8] then
    redis.call('HDEL', KEYS[3], 'through', 'raise')
    ctl[3] = false
    ctl[13] = false
  end
  redis.call('HSET', KEYS[3], 'slot_us', ARGV[1], 'slots', ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ttl)
end
if cur ~= nil and not (cur <= slot + slots) then
  redis.call('DEL', KEYS[1])
  cur = nil
  if ctl[3] then
    redis.call('HDEL', KEYS[3], 'through', 'raise')
    ctl[3] = false
    ctl[13] = false
  end
end
local stored_through = tonumber(ctl[3])
if ctl[3] and (ARGV[9] == '1' or not (stored_through and stored_through >= 0 and stored_through % 1 == 0 and stored_through < slot + slots)) then
  redis.call('HDEL', KEYS[3], 'through', 'raise')
  ctl[3] = false
  ctl[13] = false
end
if ctl[3] then ctl[3] = string.format('%.0f', stored_through) end
local seeded = false
local view = tonumber(ARGV[14])
local unstepped = ctl[7] and ctl[3] and tonumber(ctl[12]) == tonumber(ctl[3])
if view and (not ctl[7] or unstepped) and not (tonumber(ctl[11]) and tonumber(ctl[11]) >= view) then
  redis.call('HSET', KEYS[3], 'view', ARGV[14])
  redis.call('PEXPIRE', KEYS[3], ttl)
  if ARGV[10] == '0' then
    if ctl[7] then
      redis.call('HDEL', KEYS[3], 'limit', 'state', 'through', 'entered', 'armed', 'safe', 'roc', 'seeded', 'raise')
      ctl = {false, false, false, false, false, false, false, ctl[8], ctl[9], ctl[10]}
      unstepped = false
    end
  elseif not (ctl[7] and ctl[2] == ARGV[10]) then
    local entered = ARGV[12]
    if entered == '' then entered = string.format('%.0f', now) .. '000' end
    local armed = string.format('%.0f', now + slot_us * slots) .. '000'
    local through = string.format('%.0f', slot - 1)
    redis.call('HSET', KEYS[3], 'limit', ARGV[11], 'state', ARGV[10], 'entered', entered,
      'armed', armed, 'roc', ARGV[13], 'through', through, 'slot_us', ARGV[1], 'slots', ARGV[2],
      'seeded', through)
    redis.call('HDEL', KEYS[3], 'safe', 'raise')
    ctl = {ARGV[11], ARGV[10], through, entered, armed, false, ARGV[13], ARGV[1], ARGV[2], ctl[10], ARGV[14], through}
    seeded = true
    unstepped = true
  end
end
local limit = shared_limit(ctl[1], tonumber(ARGV[3]))
local roll = false
local fresh = cur == nil or cur < slot
if fresh then
  redis.call('HSET', KEYS[1], 'cur', string.format('%.0f', slot))
  if cur ~= nil then
    local through = tonumber(ctl[3])
    local first = slot - 1
    if through ~= nil then first = math.max(through + 1, math.min(cur + 1, slot) - slots) end
    if first <= slot - 1 then
      local lo = first - slots + 1
      local fields = {}
      for i = lo, math.min(cur, slot - 1) do fields[#fields + 1] = string.format('%.0f', i) end
      local counts = {}
      if #fields > 0 then counts = redis.call('HMGET', KEYS[1], unpack(fields)) end
      for i = 1, #counts do
        local n = tonumber(counts[i])
        if not (n and n >= 0 and n < 9.2e18) then n = 0 end
        counts[i] = n
      end
      roll = {lo, counts, ctl}
    end
    for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
      local i = tonumber(f)
      if f ~= 'cur' and i ~= nil and i < slot - 2 * slots then redis.call('HDEL', KEYS[1], f) end
    end
  end
end
local field = string.format('%.0f', slot)
local counted = redis.pcall('HINCRBY', KEYS[1], field, ARGV[6])
if type(counted) == 'table' and counted.err then redis.call('HSET', KEYS[1], field, ARGV[6]) end
local admit = 1
local wait = 0
local level = false
if ARGV[7] == '1' then
  local tokens, created = refill(KEYS[2], limit, tonumber(ARGV[4]), now)
  local debit = tonumber(ARGV[8]) or 0
  if debit > 0 then tokens = math.max(tokens - debit, 0) end
  if tokens >= 1 then
    tokens = tokens - 1
  else
    admit = 0
    wait = math.ceil((1 - tokens) * 1000000 / limit)
  end
  level = string.format('%.17g', tokens)
  redis.call('HSET', KEYS[2], 'tokens', level, 'ts', string.format('%.0f', now))
  if created then redis.call('PEXPIRE', KEYS[2], ttl) end
end
if fresh then
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
local state = tonumber(ctl[2])
if state ~= 1 and state ~= 2 then state = 0 end
local result = {admit, wait, string.format('%.17g', limit), state, now, slot, ctl[7], level, roll, ctl[10]}
if state ~= 0 and (admit == 0 or ARGV[7] ~= '1') then result[11] = ctl end
if unstepped then
  result[11] = result[11] or false
  result[12] = seeded and 1 or false
  result[13] = ctl[11]
end
return result
"
);

/// Stores a controller step, unless another instance stored a newer one meanwhile.
///
/// - `KEYS[1]` controller hash (see [`DECIDE`]).
/// - `ARGV[1]` the `through` the step started from (empty: none; compared with the
///   stored one as numbers, whatever their spelling); `ARGV[2]` the new
///   `through`; `ARGV[3]` limit; `ARGV[4]` state; `ARGV[5]` entered; `ARGV[6]` armed;
///   `ARGV[7]` safe since (empty: none); `ARGV[8]` roc; `ARGV[9]` key expiry, ms;
///   `ARGV[10]` the slot length, µs, and `ARGV[11]` the slots per window the step
///   was taken on; `ARGV[12]` the fleet's demand, req/s, in the later half of the
///   last window stepped (`rate`, see [`DECIDE`]); `ARGV[13]` when the limit next
///   rises if the spike holds, as the stepping instance projected it from the
///   window's completed slots (`raise`, see [`DECIDE`]).
///
/// Returns 1 if stored, 0 if the hash had moved on (or the route's window changed).
pub const SAVE: &str = r"
local stored = redis.call('HMGET', KEYS[1], 'through', 'slot_us', 'slots')
if tonumber(stored[1]) ~= tonumber(ARGV[1]) or stored[2] ~= ARGV[10] or stored[3] ~= ARGV[11] then return 0 end
redis.call('HSET', KEYS[1], 'through', ARGV[2], 'limit', ARGV[3], 'state', ARGV[4],
  'entered', ARGV[5], 'armed', ARGV[6], 'roc', ARGV[8], 'rate', ARGV[12], 'raise', ARGV[13])
if ARGV[7] == '' then redis.call('HDEL', KEYS[1], 'safe') else redis.call('HSET', KEYS[1], 'safe', ARGV[7]) end
redis.call('PEXPIRE', KEYS[1], ARGV[9])
return 1
";

/// Debits a route's shared bucket, and does nothing else: what the fallback bucket of
/// an instance admitted while Redis was away, sent by the heartbeat once the route is
/// shared again ([`RedisStore::beat`]), so that the others see it debited whether or
/// not the route decides again. Refills the bucket to now as [`DECIDE`] does, at the limit a
/// decision would be decided at, then subtracts the debit, never below empty; counts no
/// arrival and touches no window, so it can win no rollover and needs none of a
/// decision's parameters.
///
/// - `KEYS[1]` bucket hash, `KEYS[2]` controller hash (see [`DECIDE`]; the controller
///   is only read, for its `limit`).
/// - `ARGV[1]` the instance's base limit in force, as [`DECIDE`]'s `ARGV[3]`;
///   `ARGV[2]` bucket burst, seconds; `ARGV[3]` key expiry, ms, set on the bucket as
///   the first decision of a slot sets it (a debit comes after an outage, in a slot
///   no call has seen; a bucket left to expire sooner would come back full, the
///   debit lost); `ARGV[4]` tokens to debit. A bucket that expired, or a Redis
///   restarted empty, starts full, as a decision finds it.
///
/// Returns the bucket's level after the debit.
pub const DEBIT: &str = concat!(
    bucket_lua!(),
    r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = shared_limit(redis.call('HGET', KEYS[2], 'limit'), tonumber(ARGV[1]))
local tokens = refill(KEYS[1], limit, tonumber(ARGV[2]), now)
tokens = math.max(tokens - tonumber(ARGV[4]), 0)
local level = string.format('%.17g', tokens)
redis.call('HSET', KEYS[1], 'tokens', level, 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return level
"
);

/// Announces an instance and counts the live ones.
///
/// - `KEYS[1]` sorted set of instances, each scored by the time its last beat stops
///   counting (ms, Redis time).
/// - `ARGV[1]` this instance's member (its id, with random bits after a given one);
///   `ARGV[2]` how long its beat counts, ms.
///
/// Each member counts until the end of its own beat, so that instances beating at
/// different `heartbeat`s (a rolling change of it) count each other; the set expires
/// when the last of them would stop counting. A beat removes the members whose beat
/// has ended by score (`O(log N)` plus those removed), never walks the set.
///
/// Returns `{count, missing}`: the number of instances whose beat still counts, this
/// one included, and `1` if this instance was not in the set (its first beat, or the
/// set was lost: Redis restarted empty, or nobody beat for as long as a beat counts),
/// else `0`.
pub const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local span = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now))
local missing = redis.call('ZADD', KEYS[1], string.format('%.0f', now + span), ARGV[1])
if redis.call('PTTL', KEYS[1]) < span then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return {redis.call('ZCARD', KEYS[1]), missing}
";

/// Why the store could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The URL is not one redis-rs can connect to.
    #[error("store.url: {0}")]
    Url(#[source] redis::RedisError),
    /// The cluster's seed nodes are not ones redis-rs can connect to.
    #[error("store.cluster_nodes: {0}")]
    ClusterNodes(#[source] redis::RedisError),
}

/// The connection to Redis: one server (reconnecting by itself), or a Redis Cluster
/// (routing each command to the node that holds its keys' slot, following `MOVED` and
/// `ASK`).
enum Conn {
    Single(Arc<Single>),
    Cluster(Arc<Cluster>),
}

/// One server's connection, and what it takes to open a new one, at most one at a
/// time, spaced while Redis refuses or is away.
///
/// A connection is opened in a task of its own (with no retry within it), one attempt
/// at a time. At the first failure of a run, the link opens the next one as soon as it
/// learns that its connection is gone ([`lost`](Self::lost)): a call failed with an
/// error that says so (closed, reset, never answering in its protocol), or, on RESP3,
/// the connection's own notice of its end, which redis-rs sends through the
/// connection's push sender the moment it reads the end, between calls too (RESP2
/// connections take no push sender: there the first call after the end fails). The
/// calls that find one being opened after a connection was open (a start, a dropped
/// connection, a [`renew`](Conn::renew)) wait for it, within their own timeout; one
/// that fails fails them with its error (the refusal: `WRONGPASS`, `NOAUTH`, a refused
/// port), and the next call tries once more at once. After two failures in a row the link is down: calls fail at once with the
/// last failure's error, and the first call after the backoff ([`Backoff`]: from
/// `timeout`, doubling up to `probe_interval`) opens the next one, which it alone
/// waits for. An answer from Redis (an error reply too) ends the run of failures if
/// its connection has been open for the backoff's current step (its first step after
/// one failure): a connection dropped sooner, answers or none, counts as one more
/// failure in the run, so that a proxy that answers once on each connection and then
/// drops it is reached at the backoff's pace, not once per answer. Calls are answered
/// on a new connection at once all the same: the run only spaces the attempts after
/// the next failure. A connection that connects but fails its first command (a
/// balancer that accepts and closes) counts as a failure too: open connections are
/// not the measure, lasting answers are.
///
/// A connection errs when its peer closes or resets it, never when it merely stays
/// silent: a connection gone dark (half-open: a NAT or load balancer that dropped the
/// flow, a failover behind a virtual IP) errs only when the kernel gives up
/// retransmitting, some 15 minutes later, and every call on it until then times out.
/// [`Conn::renew`] replaces it.
struct Single {
    client: redis::Client,
    config: AsyncConnectionConfig,
    /// Whether the URL asks for RESP3 (`protocol=resp3`): each connection is then
    /// given a push sender, through which it tells of its end.
    resp3: bool,
    link: Mutex<Link>,
    /// Connection failures in a row since a lasting connection last answered: written
    /// under `link`'s lock, read without it (a call that Redis answers resets it only
    /// if not 0).
    failures: AtomicU32,
    backoff: Backoff,
}

/// The state of [`Single`]'s connection.
enum Link {
    /// None (the last one, the `epoch`th, closed; 0 before the first): the next call
    /// opens one.
    Closed { epoch: u64 },
    /// One being opened, the `epoch`th: its outcome comes on `outcome`. `down` is the
    /// error of the failure before it, if the link was down: then only the call that
    /// started it waits for it, the others fail at once with `down`.
    Opening {
        epoch: u64,
        outcome: Outcome,
        down: Option<RedisError>,
    },
    /// The `epoch`th connection, open since `opened`.
    Open {
        epoch: u64,
        connection: MultiplexedConnection,
        opened: tokio::time::Instant,
    },
    /// Two or more connections failed in a row, the last with `error`: calls fail at
    /// once with it until `retry_at`, when the next call opens a new one.
    Down {
        epoch: u64,
        error: RedisError,
        retry_at: tokio::time::Instant,
    },
}

/// Where a connection attempt's outcome comes: `None` until it ends.
type Outcome = tokio::sync::watch::Receiver<Option<RedisResult<MultiplexedConnection>>>;

impl Link {
    /// The number of connection attempts started so far.
    fn epoch(&self) -> u64 {
        match self {
            Link::Closed { epoch }
            | Link::Opening { epoch, .. }
            | Link::Open { epoch, .. }
            | Link::Down { epoch, .. } => *epoch,
        }
    }
}

/// The spacing of [`Single`]'s connection attempts while Redis refuses or is away:
/// after the `n`th failure in a row (`n` ≥ 2), `first × 2^(n−2)`, at most `cap`, each
/// drawn at random between half of that and all of it (so that instances that lost
/// Redis together do not come back in step).
#[derive(Clone, Copy, Debug)]
struct Backoff {
    first: Duration,
    cap: Duration,
}

impl Backoff {
    /// The step after the `failures`th failure in a row (`failures` ≥ 2), before its
    /// jitter.
    fn step(self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(2).min(31);
        self.first
            .saturating_mul(1 << doublings)
            .min(self.cap.max(self.first))
    }

    /// The wait after the `failures`th failure in a row: [`step`](Self::step), less up
    /// to half of it at random (`bits`).
    fn wait(self, failures: u32, bits: u64) -> Duration {
        let step = self.step(failures);
        let half = u64::try_from(step.as_nanos() / 2).unwrap_or(u64::MAX);
        let off = if half == 0 { 0 } else { bits % half };
        step - Duration::from_nanos(off)
    }
}

impl Single {
    /// A connection to send a call on, its epoch, and when it opened: the open one;
    /// else the one being opened, waited for (within the caller's timeout); else a new
    /// one, opened now if the link is not down or its backoff has passed. While down,
    /// the last failure's error at once.
    async fn connection(
        self: &Arc<Self>,
    ) -> RedisResult<(MultiplexedConnection, u64, tokio::time::Instant)> {
        let (epoch, mut outcome) = {
            let mut link = self.link.lock().unwrap_or_else(PoisonError::into_inner);
            match &*link {
                Link::Open {
                    epoch,
                    connection,
                    opened,
                } => return Ok((connection.clone(), *epoch, *opened)),
                Link::Opening { down: Some(e), .. } => return Err(e.clone()),
                Link::Opening {
                    epoch,
                    outcome,
                    down: None,
                } => (*epoch, outcome.clone()),
                Link::Down {
                    error, retry_at, ..
                } if tokio::time::Instant::now() < *retry_at => return Err(error.clone()),
                Link::Down { .. } | Link::Closed { .. } => {
                    let (epoch, outcome, start) = self.open(&mut link);
                    drop(link);
                    start();
                    (epoch, outcome)
                }
            }
        };
        let answer = outcome
            .wait_for(Option::is_some)
            .await
            .map(|o| o.clone())
            .ok()
            .flatten();
        match answer {
            // Opened a moment ago, when its attempt ended.
            Some(Ok(connection)) => Ok((connection, epoch, tokio::time::Instant::now())),
            Some(Err(e)) => Err(e),
            None => Err(RedisError::from((
                ErrorKind::Client,
                "the store's connection attempt ended with no outcome",
            ))),
        }
    }

    /// Readies a connection attempt, under `link`'s lock: the link goes `Opening`.
    /// Returns the attempt's epoch, where its outcome comes, and what starts it in a
    /// task of its own that records its outcome, to call once the lock is released
    /// (an attempt dropped unstarted, or by a runtime shutting down, takes the lock to
    /// count as a failure: [`Attempt`]).
    fn open(self: &Arc<Self>, link: &mut Link) -> (u64, Outcome, impl FnOnce()) {
        let epoch = link.epoch() + 1;
        let down = match link {
            Link::Down { error, .. } => Some(error.clone()),
            _ => None,
        };
        let (tell, outcome) = tokio::sync::watch::channel(None);
        *link = Link::Opening {
            epoch,
            outcome: outcome.clone(),
            down,
        };
        let mut config = self.config.clone();
        if self.resp3 {
            let single = Arc::downgrade(self);
            config = config.set_push_sender(move |info: PushInfo| {
                if info.kind == PushKind::Disconnection {
                    if let Some(single) = single.upgrade() {
                        single.lost(epoch, &closed_connection());
                    }
                }
                Ok::<(), std::convert::Infallible>(())
            });
        }
        let client = self.client.clone();
        let mut attempt = Attempt {
            epoch,
            single: Arc::clone(self),
            ended: false,
        };
        let start = move || {
            tokio::spawn(async move {
                let opened = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await;
                attempt.end(&opened);
                tell.send_replace(Some(opened));
            });
        };
        (epoch, outcome, start)
    }

    /// Sends `cmd` on the connection ([`connection`](Self::connection)). An answer on
    /// a connection open for the backoff's current step ends the run of failures; a
    /// failure that means the connection is gone (closed, reset, never answering in
    /// its protocol) counts as one ([`lost`](Self::lost)).
    async fn query<T: FromRedisValue>(self: &Arc<Self>, cmd: &Cmd) -> RedisResult<T> {
        let (mut connection, epoch, opened) = self.connection().await?;
        match connection.req_packed_command(cmd).await {
            Ok(value) => {
                let failures = self.failures.load(Ordering::Relaxed);
                if failures != 0 && opened.elapsed() >= self.backoff.step(failures.max(2)) {
                    let link = self.link.lock().unwrap_or_else(PoisonError::into_inner);
                    // Not if the connection failed meanwhile: that failure is the run's.
                    if matches!(&*link, Link::Open { epoch: at, .. } if *at == epoch) {
                        self.failures.store(0, Ordering::Relaxed);
                    }
                }
                Ok(redis::from_redis_value(value.extract_error()?)?)
            }
            Err(e) => {
                if e.is_unrecoverable_error() {
                    self.lost(epoch, &e);
                }
                Err(e)
            }
        }
    }

    /// The `epoch`th connection is gone (with `error`): if it is still the open one,
    /// that is one more failure in a row ([`failed`]), and after the first the next
    /// connection is opened at once, for the next call to find it open or opening.
    fn lost(self: &Arc<Self>, epoch: u64, error: &RedisError) {
        let mut link = self.link.lock().unwrap_or_else(PoisonError::into_inner);
        if !matches!(&*link, Link::Open { epoch: at, .. } if *at == epoch) {
            return;
        }
        *link = failed(epoch, error, &self.failures, self.backoff);
        if matches!(&*link, Link::Closed { .. }) {
            let (_, _, start) = self.open(&mut link);
            drop(link);
            start();
        }
    }

    /// Closes the open connection, for the next call to open a new one (if one is
    /// being opened, or the link is down, it stays so).
    fn renew(&self) {
        let mut link = self.link.lock().unwrap_or_else(PoisonError::into_inner);
        if let Link::Open { epoch, .. } = &*link {
            *link = Link::Closed { epoch: *epoch };
            tracing::debug!("store connection replaced after a failed heartbeat");
        }
    }
}

/// [`Single::open`]'s attempt, in its task: records its outcome in the link. Dropped
/// unended (its task panicked, or was dropped unfinished with the runtime that ran
/// it), it counts as a failure, so that the link does not stay `Opening` with nobody
/// to end it (its waiters see its outcome's sender gone).
struct Attempt {
    epoch: u64,
    single: Arc<Single>,
    ended: bool,
}

impl Attempt {
    /// Takes the attempt's outcome: the link goes `Open`, or fails, if it is still
    /// this attempt's.
    fn end(&mut self, opened: &RedisResult<MultiplexedConnection>) {
        self.ended = true;
        let single = &self.single;
        let mut link = single.link.lock().unwrap_or_else(PoisonError::into_inner);
        if matches!(&*link, Link::Opening { epoch: e, .. } if *e == self.epoch) {
            *link = match opened {
                Ok(connection) => Link::Open {
                    epoch: self.epoch,
                    connection: connection.clone(),
                    opened: tokio::time::Instant::now(),
                },
                Err(e) => failed(self.epoch, e, &single.failures, single.backoff),
            };
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.ended {
            self.end(&Err(RedisError::from((
                ErrorKind::Client,
                "the store's connection attempt ended with no outcome",
            ))));
        }
    }
}

/// The link after its `epoch`th connection failed with `error` (to open, or on a
/// command), under its lock: one more failure in a row; after the first, closed (the
/// next call tries again at once), after more, down for the backoff's wait.
fn failed(epoch: u64, error: &RedisError, failures: &AtomicU32, backoff: Backoff) -> Link {
    let n = failures.load(Ordering::Relaxed).saturating_add(1);
    failures.store(n, Ordering::Relaxed);
    if n < 2 {
        return Link::Closed { epoch };
    }
    let wait = backoff.wait(n, random_bits());
    tracing::debug!(error = %error, failures = n, ?wait, "store connection failed: next try after a wait");
    Link::Down {
        epoch,
        error: error.clone(),
        retry_at: tokio::time::Instant::now() + wait,
    }
}

/// The error of a connection that told of its end (RESP3's notice): the one redis-rs
/// gives a call on a connection that closed.
fn closed_connection() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
}

/// A Redis Cluster's connection, and what it takes to open a new one.
///
/// The cluster client reconnects to a node only when its connection errs: a node connection gone
/// dark (half-open) would hold the routes on that node in fallback until the kernel
/// gives up on it, some 15 minutes later. [`Conn::suspect`] replaces the whole cluster
/// connection by a new one if the new one answers on the route's keys.
///
/// A client that reaches no node at all (`ClusterConnectionNotFound`) connects to every
/// seed node again for each call: while that lasts the cluster is [`down`](Self::down), and one call per wait of the same backoff
/// as one server's ([`Backoff`]) goes through. The client repairs a single node's
/// connection by itself, one attempt at a time, with a backoff of its own.
struct Cluster {
    client: ClusterClient,
    config: ClusterConfig,
    connection: ArcSwap<ClusterConnection>,
    /// Set while a new connection is tried, and for `every` after: one try at a time,
    /// at most one per heartbeat.
    trying: AtomicBool,
    every: Duration,
    timeout: Duration,
    /// Set while the client reaches no node at all (`ClusterConnectionNotFound`: every
    /// seed refused or away), when each call would make it connect to every seed node
    /// again: calls then fail at once with that error, and one call per wait of
    /// `backoff` (after the `n`th such failure in a row, its wait after `n + 1`
    /// failures: from `timeout`) goes through to try again.
    down: Mutex<Option<ClusterDown>>,
    backoff: Backoff,
}

/// [`Cluster::down`]: the last `ClusterConnectionNotFound`, how many came in a row,
/// and when the next call may try again (`None` while one is trying).
struct ClusterDown {
    error: RedisError,
    failures: u32,
    retry_at: Option<tokio::time::Instant>,
}

/// A call that [`Cluster::admit`] let through while the cluster was down: if dropped
/// before [`Cluster::record`] took its answer (its caller's timeout gave up on it),
/// counts as one more failure, so that the next call may try after a wait.
struct ClusterTry<'a> {
    cluster: &'a Cluster,
    answered: bool,
}

impl Drop for ClusterTry<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let mut down = self
                .cluster
                .down
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(d) = down.as_mut() {
                d.failures = d.failures.saturating_add(1);
                d.retry_at = Some(self.cluster.retry_at(d.failures));
            }
        }
    }
}

impl Cluster {
    /// Whether a call may go to the client: `Ok(None)` while the cluster is not down,
    /// `Ok(Some(_))` for the one call that tries again after the wait, else the last
    /// `ClusterConnectionNotFound` at once.
    fn admit(&self) -> RedisResult<Option<ClusterTry<'_>>> {
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        match down.as_mut() {
            None => Ok(None),
            Some(d)
                if d.retry_at
                    .is_some_and(|at| tokio::time::Instant::now() >= at) =>
            {
                d.retry_at = None;
                Ok(Some(ClusterTry {
                    cluster: self,
                    answered: false,
                }))
            }
            Some(d) => Err(d.error.clone()),
        }
    }

    /// Takes a call's answer: a `ClusterConnectionNotFound` takes the cluster down (or
    /// keeps it down, one more failure in a row, if the call was the try); anything
    /// else from the try brings it back up.
    fn record<T>(&self, answer: &RedisResult<T>, tried: Option<ClusterTry<'_>>) {
        let tried = tried.map(|mut t| t.answered = true).is_some();
        let not_found = match answer {
            Err(e) if e.kind() == ErrorKind::ClusterConnectionNotFound => Some(e),
            _ => None,
        };
        if !tried && not_found.is_none() {
            // Changes nothing (the last arm below): every call on a cluster that is up
            // would otherwise take the lock that all routes share.
            return;
        }
        let mut down = self.down.lock().unwrap_or_else(PoisonError::into_inner);
        match not_found {
            Some(e) if tried || down.is_none() => {
                let failures = down.as_ref().map_or(0, |d| d.failures).saturating_add(1);
                *down = Some(ClusterDown {
                    error: e.clone(),
                    failures,
                    retry_at: Some(self.retry_at(failures)),
                });
            }
            None if tried => *down = None,
            _ => {}
        }
    }

    /// When the next call may try again after the `failures`th failure in a row.
    fn retry_at(&self, failures: u32) -> tokio::time::Instant {
        let wait = self.backoff.wait(failures.saturating_add(1), random_bits());
        tokio::time::Instant::now() + wait
    }

    /// Opens a new cluster connection and takes it in place of the current one if it
    /// answers on `key` within `timeout` (a node that is silent on every connection, or
    /// away, leaves the current one in place). Then waits `every` before the next try
    /// may start.
    async fn try_new(self: Arc<Self>, key: String) {
        let deadline = self.timeout.max(Duration::from_millis(100)) * 2;
        let fresh = tokio::time::timeout(deadline, async {
            let mut fresh = self
                .client
                .get_async_connection_with_config(self.config.clone())
                .await?;
            redis::cmd("EXISTS")
                .arg(&key)
                .query_async::<i64>(&mut fresh)
                .await?;
            RedisResult::Ok(fresh)
        })
        .await;
        match fresh {
            Ok(Ok(fresh)) => {
                self.connection.store(Arc::new(fresh));
                tracing::info!(
                    key,
                    "store cluster connection replaced: a new one answered where the old one did not"
                );
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "store cluster connection kept"),
            Err(_) => {
                tracing::debug!("store cluster connection kept: the new one did not answer either")
            }
        }
        tokio::time::sleep(self.every).await;
        self.trying.store(false, Ordering::Relaxed);
    }
}

impl Conn {
    fn single(client: redis::Client, config: AsyncConnectionConfig, backoff: Backoff) -> Conn {
        let resp3 =
            client.get_connection_info().redis_settings().protocol() == ProtocolVersion::RESP3;
        Conn::Single(Arc::new(Single {
            client,
            config,
            resp3,
            link: Mutex::new(Link::Closed { epoch: 0 }),
            failures: AtomicU32::new(0),
            backoff,
        }))
    }

    /// Sends one command (on a cluster, to the node its first key's slot lives on).
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> RedisResult<T> {
        match self {
            Conn::Single(s) => s.query(cmd).await,
            Conn::Cluster(c) => {
                let tried = c.admit()?;
                let mut connection = ClusterConnection::clone(&c.connection.load());
                let mut answer = connection
                    .req_packed_command(cmd)
                    .await
                    .and_then(Value::extract_error);
                for resend in 1..=RESENDS {
                    let Some(refusal) = answer.as_ref().err().and_then(Refusal::of) else {
                        break;
                    };
                    match refusal.resend(cmd, &mut connection, resend).await {
                        Some(again) => answer = again,
                        None => break,
                    }
                }
                c.record(&answer, tried);
                Ok(redis::from_redis_value(answer?)?)
            }
        }
    }

    /// A call on `key` got no answer within the timeout. On a cluster, tries a new
    /// connection in a task of its own (at most one try per heartbeat): if it answers
    /// on `key`, the node's connection had gone dark, and the new one replaces it.
    /// One server: nothing (the heartbeat's [`renew`](Self::renew) covers it).
    fn suspect(&self, key: &str) {
        if let Conn::Cluster(c) = self {
            if !c.trying.swap(true, Ordering::Relaxed) {
                tokio::spawn(Arc::clone(c).try_new(key.to_owned()));
            }
        }
    }

    /// One server: drops the connection for a new one (opened by the next call), after
    /// a heartbeat that it did not answer within `timeout`, or answered with an error
    /// a new connection may cure ([`cured_by_reconnecting`]).
    /// Calls in flight keep the old one until they end. A Redis that is slow or
    /// failing costs one new connection per heartbeat; one whose connection went dark
    /// or only answers errors is reached again on the next call. One that refuses
    /// connections or is away leaves none open to replace: its attempts follow the
    /// backoff ([`Single`]). A connection a call found gone is replaced by the link
    /// itself ([`Single::lost`]), and the heartbeat leaves it be. A
    /// cluster's connection is replaced by [`suspect`](Self::suspect) instead.
    fn renew(&self) {
        if let Conn::Single(s) = self {
            s.renew();
        }
    }

    /// Runs a script by SHA (`EVALSHA`); if the node answering lacks it (`NOSCRIPT`:
    /// restarted, flushed, or a cluster node that never ran it), runs it by body
    /// (`EVAL`), which caches it there. Both go to the node of the script's keys: a
    /// `SCRIPT LOAD` would go to every cluster master and fail while any is down.
    async fn invoke<T: FromRedisValue>(&self, call: &LuaCall<'_>) -> RedisResult<T> {
        match self.query(&call.command("EVALSHA", &call.lua.sha)).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.query(&call.command("EVAL", call.lua.body)).await
            }
            answer => answer,
        }
    }
}

/// How many times a cluster call refused by every node it went to is sent again.
const RESENDS: u32 = 2;

/// A cluster node's refusal of a call that is sent again: an answer that proves the
/// node did not run it (it checks a call's slot before running it), so the call may be
/// sent again without the risk of applying it twice. Only a refusal of the one try the
/// client made: it is built with no retries, since it hands back only its last try's
/// error and a try before whose reply was lost may have run the call.
///
/// Neither a `MOVED` nor an `ASK` is sent to the node it names, by address: routed so
/// to a node it holds no connection to (a dead master that its replica names during a
/// failover, a new master being filled by a migration), the client fails the call with
/// `ClusterConnectionNotFound` and, taking that for the loss of every node, reconnects
/// to every seed node and every node of its map, while every other call waits. So an
/// `ASK` (the key moved to a node that imports its slot, which takes the call only after
/// `ASKING`, on the connection to it) is no refusal here: the call falls back for the
/// moment of the slot's migration.
#[derive(Debug, PartialEq)]
enum Refusal {
    /// `MOVED`: the slot lives on another node; the client refreshes its slot map
    /// before it sends the next call.
    Moved,
    /// `TRYAGAIN` (a multi-key call during a slot's migration) or `CLUSTERDOWN`: the
    /// same call may be taken after a wait.
    Wait,
}

impl Refusal {
    /// The refusal `error` is, if it is one. Not any other error (a connection that
    /// failed or timed out after the call was written, `ClusterConnectionNotFound`,
    /// which the client also hands to a call in flight when a slot-map refresh fails),
    /// nor an `ASK` (see [`Refusal`]).
    fn of(error: &RedisError) -> Option<Refusal> {
        match error.kind() {
            ErrorKind::Server(ServerErrorKind::Moved) => Some(Refusal::Moved),
            ErrorKind::Server(ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown) => {
                Some(Refusal::Wait)
            }
            _ => None,
        }
    }

    /// The wait before the `n`th send again (from 1) after a `TRYAGAIN` or
    /// `CLUSTERDOWN`: 5 ms, doubling.
    fn wait(n: u32) -> Duration {
        Duration::from_millis(5 << n.saturating_sub(1).min(6))
    }

    /// Sends `cmd` again, the `n`th time (from 1), to the slot's node: after a `MOVED`
    /// at once, on the map the `MOVED` had the client refresh (the client sends no call
    /// before the refresh ends), else after [`wait`](Self::wait). `None` where the
    /// client fails the call with `ClusterConnectionNotFound` (which it also hands a
    /// call in flight when a slot-map refresh fails): the call keeps the refusal as its
    /// answer.
    async fn resend(
        self,
        cmd: &Cmd,
        connection: &mut ClusterConnection,
        n: u32,
    ) -> Option<RedisResult<Value>> {
        if self == Refusal::Wait {
            tokio::time::sleep(Refusal::wait(n)).await;
        }
        match connection.req_packed_command(cmd).await {
            Err(e) if e.kind() == ErrorKind::ClusterConnectionNotFound => None,
            again => Some(again.and_then(Value::extract_error)),
        }
    }
}

/// A Lua script and its SHA1.
struct Lua {
    body: &'static str,
    sha: String,
}

impl Lua {
    fn new(body: &'static str) -> Lua {
        Lua {
            body,
            sha: Script::new(body).get_hash().to_owned(),
        }
    }

    /// A call on `keys` (all of one route, so of one cluster slot).
    fn call<'a>(&'a self, keys: &[&str]) -> LuaCall<'a> {
        LuaCall {
            lua: self,
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            args: Vec::new(),
        }
    }
}

/// One call of a [`Lua`] script: its keys and arguments.
struct LuaCall<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl LuaCall<'_> {
    fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `EVALSHA sha` or `EVAL body`, then the keys and arguments.
    fn command(&self, name: &str, script: &str) -> Cmd {
        let mut cmd = redis::cmd(name);
        cmd.arg(script)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }
}

/// Where an instance decides its distributed routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreMode {
    /// On the shared state in Redis.
    Shared,
    /// Locally, while Redis is unreachable.
    Fallback,
}

impl StoreMode {
    /// The `mode` label of `rocgate_store_mode`: `shared` or `fallback_local`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreMode::Shared => "shared",
            StoreMode::Fallback => "fallback_local",
        }
    }
}

/// What this instance last saw of a route's shared state.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct SharedView {
    /// Whether this instance decides the route on the shared state or locally.
    pub mode: StoreMode,
    /// The shared limit, req/s, as the last answer gave it: the shared controller's,
    /// or this instance's base limit in force where that is lower (see [`DECIDE`]'s
    /// `ARGV[3]`).
    pub limit_rps: f64,
    /// The shared controller's state.
    pub state: ControllerState,
    /// ROC of the last slot the shared controller observed: NaN before Redis answered
    /// one of this instance's decisions (or syncs) on the route, as in the view of a
    /// route it has not decided on (see [`RedisStore::shared_view`]).
    pub roc: f64,
    /// The fleet's demand, req/s: the arrivals of every instance in the later half of
    /// the shared window, as the shared controller last stepped on it (the sample whose
    /// ROC is [`roc`](Self::roc)), as Redis's last answer to this instance gave it.
    /// NaN before such an answer, and while Redis holds none (no step stored since the
    /// route's state was lost, or only steps of an older release, which stores none).
    pub demand_rps: f64,
    /// How long ago (this instance's clock) Redis last answered this instance on the
    /// route, the answer that told [`limit_rps`](Self::limit_rps),
    /// [`state`](Self::state), [`roc`](Self::roc) and
    /// [`demand_rps`](Self::demand_rps): their age, which grows while the route is in
    /// fallback. `None` before any answer.
    pub answered_ago: Option<Duration>,
    /// Whether the route fell back to local decisions since Redis last answered this
    /// instance on it: true from the fall until the first answer taken in after it
    /// (a decision's or a sync's), so through the return to [`StoreMode::Shared`] by
    /// the heartbeat's probe, which reads nothing. What the last answer told (its
    /// [`roc`](Self::roc) and [`demand_rps`](Self::demand_rps)) is then from before
    /// the outage.
    pub fell_since_answer: bool,
    /// The shared controller's transitions that this instance stepped and stored:
    /// each is stepped and stored by one instance, so summed over the fleet they are
    /// the shared controller's.
    pub stepped: TransitionCounts,
    /// The bucket that decides this instance's requests on the route: in exact mode
    /// while shared, the shared bucket (its tokens as Redis answered this instance's
    /// last decision, refilled at the shared limit since by this instance's clock,
    /// not knowing what other instances took meanwhile; its capacity the shared
    /// limit × burst); in batched mode or in fallback, this instance's own bucket at
    /// its share of the limit. A level and capacity of NaN (no level) where none is
    /// known or none decides: before this instance decided on the route, in exact
    /// mode before Redis answered a decision on it (the shared bucket's level is not
    /// known yet), and in fallback with `fail_mode = "open"` or `"closed"` (every
    /// request is admitted, or every one refused). Never the local engine's bucket,
    /// which decides none of the route's requests.
    pub level: Level,
    /// Exact mode with `fail_mode = "local"`: the tokens this instance's fallback
    /// bucket admitted that the shared bucket has not been debited yet (a debt
    /// waiting for the route's next call that reaches Redis, or the heartbeat's
    /// debit, or this instance's [`leave`](RedisStore::leave)); 0 otherwise.
    pub owed_tokens: u64,
}

/// No bucket level (see [`SharedView::level`]): none is known, or none decides.
const UNKNOWN_LEVEL: Level = Level {
    value: f64::NAN,
    capacity: f64::NAN,
};

/// A decision, and the reason it rejected the request, or would have in shadow mode.
type Verdict = (Decision, Option<Reason>);

/// The debt a decision's call carries to Redis ([`SharedRoute::owed`], taken whole),
/// counted in [`Inner::carrying`] until dropped, once the call has ended and, if it
/// failed, the debt is owed again: a leave waits for it, so that its debits send a debt
/// such a call gives back, or report it, rather than find nothing owed.
struct Carried {
    inner: Arc<Inner>,
    tokens: u64,
}

impl Carried {
    /// Takes what `r` owes for a decision's call; `None` when nothing is owed, or once
    /// the instance has left (the debt then stays owed, for the leave's debits).
    fn take(inner: &Arc<Inner>, r: &SharedRoute) -> Option<Carried> {
        if r.owed.load(Ordering::Relaxed) == 0 {
            return None;
        }
        // SeqCst, as the leave's: counted before `left` is read.
        inner.carrying.fetch_add(1, Ordering::SeqCst);
        let mut carried = Carried {
            inner: Arc::clone(inner),
            tokens: 0,
        };
        if inner.left.load(Ordering::SeqCst) {
            return None;
        }
        carried.tokens = r.owed.swap(0, Ordering::Relaxed);
        Some(carried)
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        if self.inner.carrying.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.carried.notify_waiters();
        }
    }
}

/// What an instance last saw of a shared controller, sent with each call
/// ([`DECIDE`]'s `ARGV[10]` to `ARGV[14]`) so that Redis, should it have lost the
/// controller (restarted empty, flushed, its key evicted or expired), continues a
/// cut or a restore from there rather than afresh at the base limit in the middle of
/// the spike that cut it. Only while the instance's last answer on the route is no
/// older than the route's `max_cut`: the longest a cut holds whatever the traffic,
/// past which what was seen says nothing of the cut now; and only a view a stored
/// step told (an answer that found no step says nothing of the fleet's controller).
/// Continued as the controller continues a stored one: rearmed for one window (the
/// window is empty; its refill would read as a rise), a cut then restoring after
/// `hold` of calm (or at once if `max_cut` has passed since `entered`), a restore on
/// its schedule. A normal view is carried too, so that the newest view wins: a cut
/// seen before the fleet restored, carried by an instance whose view is stale, is
/// undone by one that saw the restore, until the carried controller is stepped.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Seed {
    /// [`ControllerState::as_index`].
    state: u8,
    /// The limit last seen, req/s, within the cut and base limits in force.
    limit_rps: f64,
    /// When the state was entered (Redis's clock, ns), if this instance knows (a
    /// memory told it, or the answer that first showed the state, an upper bound);
    /// else Redis's now.
    entered: Option<u64>,
    /// The ROC last seen (NaN, never answered, is sent as 0).
    roc: f64,
    /// When (Redis's clock, µs) the answer that told this view came: the newest view
    /// of those carried wins.
    view_us: u64,
}

/// A route's shared state as one instance sees it.
struct SharedRoute {
    name: Arc<str>,
    keys: [String; 3],
    /// `{<prefix>:<route>}:probe`, the key of the heartbeat's probe ([`Inner::probe`]),
    /// which no one writes.
    probe_key: String,
    /// Guards the calls on this route's keys: on a cluster, those go to the one node
    /// that holds the route's slot, so each route falls back (and returns) on its own.
    breaker: Mutex<Breaker>,
    /// Whether this route is decided locally for now.
    fallen: AtomicBool,
    /// Why it last fell: the error and the setting to check ([`Why`]), which the
    /// route rebuilt from it on reload says as it falls in its place.
    fell_for: Mutex<Option<(String, Option<String>)>>,
    /// Whether the route fell back since an answer was last taken in
    /// ([`SharedView::fell_since_answer`]): set by the fall, cleared by
    /// [`Inner::absorb`] once the answer's ROC and demand are stored.
    fell_since_answer: AtomicBool,
    /// Whether the store dropped this route (see [`Inner::retire`]).
    retired: AtomicBool,
    window: WindowSpec,
    burst: Duration,
    slot_us: u64,
    /// The keys' expiry, ms: `key_ttl`, or the burst and the window if longer, each
    /// with one slot more (see [`Inner::route`]).
    ttl_ms: u64,
    /// The route's own base limit, f64 bits (refreshed in exact mode by each decision
    /// that calls Redis and by the heartbeat's debit, in batched mode by the first
    /// decision of each slot).
    base_limit: AtomicU64,
    /// The shared limit last seen, f64 bits.
    limit: AtomicU64,
    /// The shared controller state last seen ([`ControllerState::as_index`]).
    state: AtomicU8,
    /// When (this instance's clock, ns) an answer last told `limit` and `state`; 0
    /// before any.
    seen_at: AtomicU64,
    /// When (Redis's clock, µs) that answer came, if it read a stored step; 0 if it
    /// found none (Redis had lost the controller, or no instance had stepped it): the
    /// view a [`Seed`] carries, and how new it is.
    view_us: AtomicU64,
    /// When (Redis's clock, ns) the state [`entered_state`](Self::entered_state) was
    /// entered, as the last controller memory an answer carried, or a step this
    /// instance stored, told it; else, for a state an answer without memory showed
    /// after another, that answer's time (it was entered no later): what a [`Seed`]
    /// carries over.
    entered: AtomicU64,
    /// The state whose entry `entered` tells ([`ControllerState::as_index`]; `Normal`
    /// when none told).
    entered_state: AtomicU8,
    /// The shared ROC last seen, f64 bits (NaN before any).
    roc: AtomicU64,
    /// The fleet's demand last seen, req/s, f64 bits (NaN before any, or when the
    /// answer had none: [`SharedView::demand_rps`]).
    demand: AtomicU64,
    /// The fleet's demand each answer gave since [`RedisStore::take_fleet_demand`]
    /// last took it.
    demand_seen: Mutex<DemandSeen>,
    /// When (this instance's clock, ns) the shared controller will next raise the
    /// limit, as the last answer that told it put it; 0 when not known, or normal
    /// (see [`RedisStore::restore_eta`]).
    next_raise: AtomicU64,
    /// Exact mode: the shared bucket's tokens after this instance's last decision
    /// answered, f64 bits (NaN before the first).
    tokens: AtomicU64,
    /// When (this instance's clock) `tokens` was answered, ns.
    tokens_at: AtomicU64,
    /// Decides while Redis is unreachable (and every decision in batched mode), at
    /// this instance's share. In exact mode, each answer from Redis lowers it to this
    /// instance's share of the shared bucket's level, so that a switch to fallback
    /// starts from what the fleet has left rather than from a full bucket.
    fallback: TokenBucket,
    /// The limit the fallback bucket is set to, f64 bits.
    fallback_limit: AtomicU64,
    /// Exact mode: tokens the fallback bucket gave since this instance last reached
    /// Redis, to be debited from the shared bucket by the next call that does, or by
    /// the heartbeat's debit once the route is shared again ([`Inner::pay`]), so that
    /// the shared bucket does not refill for time the fleet already used. A sender
    /// takes it whole (swapped to 0) and owes it again if its call fails.
    owed: AtomicU64,
    /// Held by a debit ([`Inner::pay`]) from taking the debt to owing it again if its
    /// call fails: a leave's debit of the route waits for the heartbeat's in flight,
    /// and so sees what it gives back (a debt not paid, which the leave reports).
    paying: tokio::sync::Mutex<()>,
    /// The route that replaced this one (a reload rebuilt it), to which what is owed
    /// here goes ([`SharedRoute::owe`]), and a gap left here ([`SharedRoute::miss`]).
    /// Held, not weak: a route rebuilt twice while a call on the first was in flight
    /// must still lead to the third. A route never leads back, so the chain ends with
    /// the oldest route still held.
    successor: std::sync::OnceLock<Arc<SharedRoute>>,
    admitted: Counter,
    rejected: Counter,
    shadow_rejected: Counter,
    fallbacks: Counter,
    /// `rocgate_store_controllers_carried_total`: answers whose call carried this
    /// instance's [`Seed`] into a controller Redis had lost.
    carried: Counter,
    limit_gauge: Gauge,
    /// Batched mode: arrivals since the last sync.
    pending: AtomicU64,
    /// The window missed arrivals since a call last said so: the next call says it
    /// ([`DECIDE`]'s `ARGV[9]`). Set by [`SharedRoute::miss`]: in batched mode when a
    /// sync's arrivals were dropped (its call failed, or the breaker skipped it), and
    /// when the heartbeat's probe ([`Inner::probe`]) brought the route back from
    /// fallback, whose decisions were taken locally.
    missed: AtomicBool,
    /// Batched mode: the sync slot (see [`SharedRoute::sync_slot`]) of the last sync.
    synced_slot: AtomicU64,
    /// Batched mode: what [`SharedRoute::sync_slot`] adds to this instance's clock, ns
    /// (under one slot), so that its sync slots begin halfway through Redis's slots:
    /// learned from the answers ([`SharedRoute::learn_phase`]), 0 until one is.
    sync_shift: AtomicU64,
    /// The shared controller's transitions stepped and stored here.
    stepped: Mutex<TransitionCounts>,
}

impl SharedRoute {
    /// Owes `n` tokens the fallback bucket gave to the shared bucket: on this route, or
    /// on the one that replaced it if a reload has (a decision in flight on this one
    /// when it was rebuilt would otherwise leave its debit where no call sends it).
    fn owe(&self, n: u64) {
        if n == 0 {
            return;
        }
        // AcqRel with the move in `Inner::replaced`: whichever of the two comes
        // second in `owed`'s order sees the other (the add, or the successor set
        // before the move).
        self.owed.fetch_add(n, Ordering::AcqRel);
        if let Some(next) = self.successor.get() {
            next.owe(self.owed.swap(0, Ordering::AcqRel));
        }
    }

    /// Marks that the window missed arrivals of this route (a sync's, dropped, or the
    /// decisions taken locally in fallback): on it, or on the one that replaced it if
    /// a reload has (a sync in flight on this one when it was rebuilt, failing after,
    /// would otherwise leave the gap where no call says it).
    fn miss(&self) {
        // AcqRel with the move in `Inner::replaced`: whichever of the two comes
        // second in `missed`'s order sees the other (the flag set, or the successor
        // set before the move).
        self.missed.swap(true, Ordering::AcqRel);
        if let Some(next) = self.successor.get() {
            if self.missed.swap(false, Ordering::AcqRel) {
                next.miss();
            }
        }
    }

    /// What a call at `now` carries for Redis to re-seed the shared controller with,
    /// should it find it gone: the state this instance last saw, told by an answer
    /// on a stored step within the route's `max_cut` (see [`Seed`]), its limit
    /// brought within `params`' cut and base limits.
    fn seed(&self, params: &ControllerParams, now: Nanos) -> Option<Seed> {
        let state = self.state.load(Ordering::Relaxed);
        let seen_at = self.seen_at.load(Ordering::Relaxed);
        let view_us = self.view_us.load(Ordering::Relaxed);
        if view_us == 0
            || seen_at == 0
            || now.saturating_since(Nanos::new(seen_at)) > params.max_cut
        {
            return None;
        }
        let entered = (self.entered_state.load(Ordering::Relaxed) == state)
            .then(|| self.entered.load(Ordering::Relaxed))
            .filter(|&at| at > 0);
        Some(Seed {
            state,
            // Within the parameters in force (a reload since the view may have raised
            // the cut limit or lowered the base), as the first step would bring it.
            limit_rps: self
                .seen_limit()
                .max(params.cut_limit_rps)
                .min(params.base_limit_rps),
            entered,
            roc: f64::from_bits(self.roc.load(Ordering::Relaxed)),
            view_us,
        })
    }

    /// Notes when the state `memory` holds was entered, for a [`Seed`].
    fn note_entered(&self, memory: &ControllerMemory) {
        self.entered
            .store(memory.entered_at.as_u64(), Ordering::Relaxed);
        self.entered_state
            .store(memory.state.as_index(), Ordering::Relaxed);
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn demand_seen(&self) -> std::sync::MutexGuard<'_, DemandSeen> {
        self.demand_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The slot's length, ns (at least 1).
    fn slot_ns(&self) -> u64 {
        self.slot_us.saturating_mul(1000).max(1)
    }

    /// Batched mode: the sync slot of `now` (this instance's clock): a slot of the
    /// route's length, shifted by `sync_shift` so that it begins halfway through one of
    /// Redis's. A sync is sent at the first decision of each and at its end
    /// ([`flush`]), and Redis counts it in the slot of its own clock then: where the
    /// instance's slots began where Redis's do (its clock's origin is its start, so
    /// anywhere in Redis's), a sync a millisecond later or earlier fell into the next
    /// slot or this one, a slot's arrivals counted in the one beside it (0 then 2
    /// slots' worth: a steady route read ROC 56 to 92 and was cut). Halfway, a sync
    /// lands in the slot it is meant for however late it is, up to half a slot.
    fn sync_slot(&self, now: Nanos) -> u64 {
        now.as_u64()
            .saturating_add(self.sync_shift.load(Ordering::Relaxed))
            / self.slot_ns()
    }

    /// Batched mode: learns where Redis's slots begin on this instance's clock from an
    /// answer that told Redis's time `redis_us` and was sent at `sent` and taken at
    /// `answered` (this instance's clock), and shifts the sync slots to begin halfway
    /// through Redis's ([`sync_shift`]). Redis read its time anywhere within the round
    /// trip, so the estimate (at its midpoint) is off by up to half of it: one whose
    /// round trip took half a slot or more says too little, and a shift is moved only if
    /// it is more than an eighth of a slot and that half a round trip from the one held,
    /// so that each sync slot stays put however slow an answer is, and moves where
    /// Redis's clock did (a failover to a server whose clock differs). An answer across
    /// which the instance's clock did not move says nothing (a manual clock, whose time
    /// is no wall clock's).
    fn learn_phase(&self, redis_us: u64, sent: Nanos, answered: Nanos) {
        let slot = self.slot_ns();
        let trip = answered.as_u64().saturating_sub(sent.as_u64());
        if trip == 0 || trip >= slot / 2 {
            return;
        }
        let shift = sync_shift(
            slot,
            redis_us.saturating_mul(1000),
            sent.as_u64() + trip / 2,
        );
        let held = self.sync_shift.load(Ordering::Relaxed);
        let apart = shift.abs_diff(held);
        if apart.min(slot - apart) > slot / 8 + trip / 2 {
            self.sync_shift.store(shift, Ordering::Relaxed);
        }
    }

    /// The shared limit last seen.
    fn seen_limit(&self) -> f64 {
        f64::from_bits(self.limit.load(Ordering::Relaxed))
    }

    fn mode(&self) -> StoreMode {
        if self.fallen.load(Ordering::Relaxed) {
            StoreMode::Fallback
        } else {
            StoreMode::Shared
        }
    }

    fn view(&self, config: &RedisConfig, now: Nanos) -> SharedView {
        // Acquire, before the ROC and demand are read, with the release that clears
        // it in `Inner::absorb`: cleared, they are that answer's (or a later one's).
        let fell_since_answer = self.fell_since_answer.load(Ordering::Acquire);
        SharedView {
            mode: self.mode(),
            limit_rps: f64::from_bits(self.limit.load(Ordering::Relaxed)),
            state: state_of(self.state.load(Ordering::Relaxed)),
            roc: f64::from_bits(self.roc.load(Ordering::Relaxed)),
            demand_rps: f64::from_bits(self.demand.load(Ordering::Relaxed)),
            answered_ago: match self.seen_at.load(Ordering::Relaxed) {
                0 => None,
                at => Some(now.saturating_since(Nanos::new(at))),
            },
            fell_since_answer,
            stepped: *self.stepped.lock().unwrap_or_else(PoisonError::into_inner),
            level: self.level(config, now),
            owed_tokens: self.owed.load(Ordering::Relaxed),
        }
    }

    /// See [`SharedView::level`]. The shared bucket's capacity is [`DECIDE`]'s: the
    /// limit × burst, whole, at least 1.
    fn level(&self, config: &RedisConfig, now: Nanos) -> Level {
        let fallen = self.mode() == StoreMode::Fallback;
        if fallen && config.fail_mode != FailMode::Local {
            return UNKNOWN_LEVEL;
        }
        if config.mode == SyncMode::Batched || fallen {
            return self.fallback.level(now);
        }
        let tokens = f64::from_bits(self.tokens.load(Ordering::Relaxed));
        if tokens.is_nan() {
            return UNKNOWN_LEVEL;
        }
        let limit = self.seen_limit();
        let capacity = (limit * self.burst.as_secs_f64() + 1e-6).floor().max(1.0);
        let since = now.saturating_since(Nanos::new(self.tokens_at.load(Ordering::Relaxed)));
        Level {
            value: (tokens + since.as_secs_f64() * limit).min(capacity),
            capacity,
        }
    }

    /// Why a shared limit rejects: a cut if the controller holds it below base.
    fn reason(&self, limit: f64, state: u8) -> Reason {
        let base = f64::from_bits(self.base_limit.load(Ordering::Relaxed));
        if state != ControllerState::Normal.as_index() && limit < base {
            Reason::RocCut
        } else {
            Reason::Limit
        }
    }

    /// A rejection, counted; in shadow mode, an admission counted as shadow-rejected.
    fn enforce(&self, mode: Mode, rejection: Rejection) -> Verdict {
        let reason = Some(rejection.reason);
        if mode == Mode::Shadow {
            self.shadow_rejected.increment(1);
            return (Decision::Admit(Admit::Now), reason);
        }
        self.rejected.increment(1);
        (Decision::Reject(rejection), reason)
    }
}

struct Inner {
    conn: Conn,
    config: RedisConfig,
    instance_id: String,
    /// This instance's member of the heartbeat set: its id, and if the id was given,
    /// random bits after it, so that instances given the same id count as two.
    member: String,
    instances_key: String,
    clock: Arc<dyn Clock>,
    /// Routes decided locally for now: the instance is in fallback while any is.
    fallen: AtomicUsize,
    /// Held while a route's mode changes: `fallen`, the routes' flags and
    /// `rocgate_store_mode` change together.
    changing: Mutex<()>,
    /// Live instances as counted ([`Inner::counted`]; `expected_instances` before any
    /// beat counted them): each route's share is its shared limit ÷ this.
    instances: AtomicU64,
    /// Sequence numbers of beats sent.
    beats: AtomicU64,
    /// How the beats' answers are taken in.
    count: Mutex<Count>,
    /// What the last heartbeat found: [`UNHEARD`], [`REACHED`] or [`UNREACHED`]. Each
    /// change is logged once, so that an operator learns that Redis is away before
    /// traffic does, and when it is back.
    heard: AtomicU8,
    routes: DashMap<Arc<str>, Arc<SharedRoute>>,
    /// The engine in force ([`RedisStore::follow`]), whose base limits in force the
    /// heartbeat's debits are decided at, as a decision's call is; none before it is
    /// given, or once dropped.
    engine: Mutex<Weak<Engine>>,
    /// Shared routes not built yet whose `rocgate_store_*` series
    /// [`RedisStore::register_undecided`] registered, until built or no longer shared.
    undecided: Mutex<std::collections::HashSet<Arc<str>>>,
    decide: Lua,
    save: Lua,
    debit: Lua,
    heartbeat: Lua,
    timeouts: Counter,
    errors: Counter,
    /// Decisions taken locally, all routes.
    fallbacks: AtomicU64,
    /// Set by [`RedisStore::leave`]: the heartbeat stops, and decisions carry no debt.
    left: AtomicBool,
    /// Decisions whose call carries a debt ([`Carried`]), until the call has ended
    /// (the debt paid, or owed again): a leave waits for them, so that its debits see
    /// a debt such a call gives back.
    carrying: AtomicUsize,
    /// Told when `carrying` falls to 0.
    carried: tokio::sync::Notify,
    /// Held by a beat from its look at `left` to its answer, and by a leave around its
    /// `ZREM`: a beat in flight when the instance leaves cannot add it back after (its
    /// `EVALSHA`, or the `EVAL` that follows a `NOSCRIPT`, reaching Redis after the
    /// `ZREM`, would count it for three more beats).
    beating: tokio::sync::Mutex<()>,
    /// The leave, spawned as a task of its own by the first [`RedisStore::leave`]:
    /// `true` once it has ended. A later leave waits for it rather than starting
    /// another.
    leaving: Mutex<Option<tokio::sync::watch::Receiver<bool>>>,
}

/// The shared state of every distributed route in Redis. Cloning is one reference
/// count; dropping the last clone stops the heartbeat.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("instance_id", &self.inner.instance_id)
            .field("mode", &self.mode())
            .field("instances", &self.instances())
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store on `config.servers` (one Redis or a Redis Cluster), timing decisions
    /// with `clock` (the engine's). Never waits for Redis: it connects in the
    /// background and falls back as soon as Redis fails to answer. Starts the
    /// heartbeat, so it must run inside a tokio runtime. Its metrics go to the
    /// `metrics` recorder installed when this is called.
    ///
    /// # Errors
    /// If a URL cannot be parsed.
    pub fn connect(config: &RedisConfig, clock: Arc<dyn Clock>) -> Result<Self, StoreError> {
        // A period the file refuses but a `RedisConfig` built in code may hold: zero is
        // no period tokio takes, and a span past what `PEXPIRE` takes would fail every
        // beat.
        let config = &RedisConfig {
            heartbeat: config
                .heartbeat
                .clamp(Duration::from_millis(1), LONGEST_HEARTBEAT),
            ..config.clone()
        };
        let connect_timeout = config.timeout.max(Duration::from_millis(100));
        let conn = match &config.servers {
            RedisServers::Single(url) => {
                let info = url
                    .as_str()
                    .into_connection_info()
                    .map_err(StoreError::Url)?
                    .set_tcp_settings(tcp_settings(config.timeout));
                let client = redis::Client::open(info).map_err(StoreError::Url)?;
                // No retry within a connection attempt: a refusal (`WRONGPASS`,
                // `NOAUTH`, a closed port) is the call's answer at once, not a wait past
                // `timeout` that hid it behind a timeout; the attempts are spaced
                // between calls instead ([`Backoff`]).
                let connection = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(None);
                let backoff = Backoff {
                    first: config.timeout,
                    cap: config.probe_interval,
                };
                Conn::single(client, connection, backoff)
            }
            RedisServers::Cluster(nodes) => {
                // No retries: the client hands back only its last try's error, so a
                // try before whose reply was lost (and that may have run) would be
                // hidden; `Conn::query` sends a call again after a node's refusal only.
                let client = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .retries(0)
                    .tcp_settings(tcp_settings(config.timeout))
                    .build()
                    .map_err(StoreError::ClusterNodes)?;
                let cluster = ClusterConfig::new()
                    .set_connection_timeout(connect_timeout)
                    .set_response_timeout(connect_timeout);
                let connection = client.get_pending_async_connection_with_config(cluster.clone());
                Conn::Cluster(Arc::new(Cluster {
                    client,
                    config: cluster,
                    connection: ArcSwap::from_pointee(connection),
                    trying: AtomicBool::new(false),
                    every: config.heartbeat,
                    timeout: config.timeout,
                    down: Mutex::new(None),
                    backoff: Backoff {
                        first: config.timeout,
                        cap: config.probe_interval,
                    },
                }))
            }
        };
        let instance_id = config.instance_id.clone().unwrap_or_else(random_id);
        let member = match &config.instance_id {
            Some(id) => format!("{id}#{:016x}", random_bits()),
            None => instance_id.clone(),
        };
        let inner = Arc::new(Inner {
            conn,
            instances_key: format!("{{{}}}:instances", config.key_prefix),
            config: config.clone(),
            instance_id,
            member,
            clock,
            fallen: AtomicUsize::new(0),
            changing: Mutex::new(()),
            instances: AtomicU64::new(u64::from(config.expected_instances)),
            beats: AtomicU64::new(0),
            count: Mutex::new(Count {
                applied: 0,
                held: 0,
                said: CountSaid {
                    count: u64::from(config.expected_instances).max(1),
                    at: None,
                    unsaid: 0,
                    fell: false,
                },
            }),
            heard: AtomicU8::new(UNHEARD),
            routes: DashMap::new(),
            undecided: Mutex::default(),
            engine: Mutex::new(Weak::new()),
            decide: Lua::new(DECIDE),
            save: Lua::new(SAVE),
            debit: Lua::new(DEBIT),
            heartbeat: Lua::new(HEARTBEAT),
            timeouts: metrics::counter!(metric::STORE_ERRORS, "kind" => "timeout"),
            errors: metrics::counter!(metric::STORE_ERRORS, "kind" => "error"),
            fallbacks: AtomicU64::new(0),
            left: AtomicBool::new(false),
            carrying: AtomicUsize::new(0),
            carried: tokio::sync::Notify::new(),
            beating: tokio::sync::Mutex::new(()),
            leaving: Mutex::new(None),
        });
        publish_mode(StoreMode::Shared);
        metrics::gauge!(metric::STORE_INSTANCES).set(f64::from(config.expected_instances));
        tokio::spawn(heartbeat(Arc::downgrade(&inner)));
        Ok(RedisStore { inner })
    }

    /// Whether `route` is decided on the shared state (see the module docs): never a
    /// route `engine` does not hold (see [`RouteId`]).
    pub fn shares(&self, engine: &Engine, route: RouteId) -> bool {
        matches!(engine.partition(route), Some(Partition::Route))
            && matches!(engine.algorithm(route), Some(Algorithm::TokenBucket { .. }))
            && engine
                .mode(route)
                .is_some_and(|m| m != Mode::ShadowAdaptive)
            && engine.window(route).is_some_and(|w| w.slots() <= 1000)
    }

    /// Decides one request on a distributed route at `now` (the engine's clock).
    /// Exact mode: one round trip to Redis, or a local decision if Redis errs, takes
    /// longer than `timeout`, or the breaker is open; never waits longer than
    /// `timeout`. Batched mode: a local decision at this instance's share, never
    /// waiting on Redis (the first decision of each sync slot starts its sync in a
    /// task of its own).
    ///
    /// The decision is counted in `engine` ([`Engine::record`]), as [`Engine::check`]
    /// counts its own: offered, and rejected for its reason (in shadow mode,
    /// shadow-rejected), so the engine's snapshots and metrics show this instance's
    /// traffic on the route. A route `engine` does not hold (see [`RouteId`]) is
    /// admitted uncounted, as [`Engine::check`] admits it.
    ///
    /// A rejection's `retry_after` is the bucket's wait, as [`Engine::check`]'s is;
    /// for a `roc_cut` rejection, [`restore_eta`](Self::restore_eta) tells when the
    /// shared limit will next rise, as [`Engine::restore_eta`] does for a local
    /// route.
    pub async fn check(&self, engine: &Engine, route: RouteId, now: Nanos) -> Decision {
        let (decision, rejected) = self.decide(engine, route, now).await;
        engine.record(route, rejected, now);
        decision
    }

    async fn decide(&self, engine: &Engine, route: RouteId, now: Nanos) -> Verdict {
        let inner = &self.inner;
        let (Some(mode), Some(r)) = (engine.mode(route), inner.route(engine, route, now)) else {
            return (Decision::Admit(Admit::Now), None);
        };
        if inner.config.mode == SyncMode::Batched {
            return inner.batched(engine, route, &r, mode, now);
        }
        let base = || {
            engine
                .params_at(route, now)
                .unwrap_or_default()
                .base_limit_rps
        };
        if r.breaker().call(now) == Call::Skip {
            return inner.fallback(&r, mode, base, now);
        }
        // What this instance admitted in fallback goes with the next call that reaches
        // Redis (a load only, on the common path where nothing is owed).
        let carried = Carried::take(inner, &r);
        let owed = carried.as_ref().map_or(0, |c| c.tokens);
        // Taken before the call (the schedule the route holds, shared, not copied),
        // which may end without this caller: a rollover its answer won is stepped on
        // them. Their base limit goes with the call: a lowered
        // one applies to this decision, before the shared controller steps on it (see
        // [`DECIDE`]'s `ARGV[3]`). A route this engine no longer holds keeps the base
        // it had.
        let schedule = engine.schedule(route);
        if let Some(schedule) = &schedule {
            r.base_limit.store(
                schedule.params_at(now).base_limit_rps.to_bits(),
                Ordering::Relaxed,
            );
        }
        let schedule = schedule.unwrap_or_default();
        let base_limit = schedule.params_at(now).base_limit_rps;
        // The call runs to its answer or its `timeout`, and the answer is taken in,
        // even if this decision's caller stops waiting first (its client gone, a
        // deadline shorter than `timeout`): the breaker learns how Redis answered, so
        // a stalled Redis opens it whoever waits; a debit the call carried is owed
        // again if Redis did not answer; and a rollover the answer won is stepped.
        let call = {
            let (inner, r) = (Arc::clone(inner), Arc::clone(&r));
            RunsToEnd::new(async move {
                let params = schedule.params_at(now);
                let Some(reply) = inner.call(&r, 1, true, owed, params).await else {
                    // Owed still: the call may have been applied anyway (a timeout on
                    // a Redis that answers later), so this can debit twice, never not
                    // at all. Before the leave that waits for it is told.
                    r.owe(owed);
                    drop(carried);
                    return None;
                };
                drop(carried);
                let answer = (reply.admit, reply.wait_us, reply.limit, reply.state);
                let tokens = reply.tokens;
                inner.absorb(&r, reply, &schedule, now);
                if let Some(tokens) = tokens {
                    r.tokens.store(tokens.to_bits(), Ordering::Relaxed);
                    r.tokens_at.store(now.as_u64(), Ordering::Relaxed);
                    if inner.config.fail_mode == FailMode::Local {
                        inner.mirror(&r, tokens, now);
                    }
                }
                Some(answer)
            })
        };
        let Some((admit, wait_us, limit, state)) = call.await else {
            return inner.fallback(&r, mode, || base_limit, now);
        };
        if admit {
            r.admitted.increment(1);
            return (Decision::Admit(Admit::Now), None);
        }
        r.enforce(
            mode,
            Rejection {
                retry_after: Duration::from_micros(wait_us),
                reason: r.reason(limit, state),
            },
        )
    }

    /// Where this instance decides now: [`StoreMode::Fallback`] while any route is
    /// decided locally ([`SharedView::mode`] says which).
    pub fn mode(&self) -> StoreMode {
        self.inner.mode()
    }

    /// Live instances as last counted through the heartbeat (`expected_instances`
    /// until first counted): this instance's share is the shared limit ÷ this, and
    /// so is its share of a partitioned route's `route_limit` ([`follow`](Self::follow)).
    pub fn instances(&self) -> u64 {
        self.inner.instances()
    }

    /// Whether the last heartbeat reached Redis (`None` until the first one ends).
    /// Unlike [`mode`](Self::mode), which a decision sets, it tells an instance that
    /// has decided nothing yet whether Redis answers.
    pub fn reached(&self) -> Option<bool> {
        match self.inner.heard.load(Ordering::Relaxed) {
            REACHED => Some(true),
            UNREACHED => Some(false),
            _ => None,
        }
    }

    /// Decisions on distributed routes taken locally since start.
    pub fn fallback_decisions(&self) -> u64 {
        self.inner.fallbacks.load(Ordering::Relaxed)
    }

    /// The live instances assumed until a heartbeat counts them (`expected_instances`).
    pub fn expected_instances(&self) -> u16 {
        self.inner.config.expected_instances
    }

    /// This instance's id (`instance_id`, or a random one). Its member of the
    /// heartbeat set is the id, followed by random bits if the id was given, so that
    /// instances given the same id still count as two.
    pub fn instance_id(&self) -> &str {
        &self.inner.instance_id
    }

    /// What this instance last saw of a route's shared state, if it has decided on it.
    pub fn view(&self, route: &str) -> Option<SharedView> {
        let inner = &self.inner;
        Some(
            inner
                .routes
                .get(route)?
                .view(&inner.config, inner.clock.now()),
        )
    }

    /// The limit, req/s, that this instance's decisions on `route` enforce as of
    /// `now`, as a fleet's (in batched mode and in fallback this instance decides at
    /// its share of it): the shared limit last seen ([`SharedView::limit_rps`]), or
    /// the route's base limit in force where lower, as [`check`](Self::check) decides
    /// (in batched mode, the base taken at the first decision of the sync slot). `None`
    /// for a route this instance has not decided on. The quota that a rejection's
    /// `RateLimit-Policy` states in `rocgate serve`: `reason` is the rejection's, and
    /// a fallback's under `fail_mode = "closed"`, which refuses every request, enforces
    /// a limit of 0.
    pub fn limit_in_force(
        &self,
        engine: &Engine,
        route: RouteId,
        reason: Reason,
        now: Nanos,
    ) -> Option<f64> {
        if reason == Reason::FallbackLocal && self.inner.config.fail_mode == FailMode::Closed {
            return Some(0.0);
        }
        let r = self.inner.routes.get(engine.route_name(route)?)?;
        let base = match self.inner.config.mode {
            SyncMode::Batched => f64::from_bits(r.base_limit.load(Ordering::Relaxed)),
            SyncMode::Exact => engine.params_at(route, now)?.base_limit_rps,
        };
        Some(r.seen_limit().min(base))
    }

    /// How long after `now` (this instance's clock) the shared controller will next
    /// raise `route`'s limit, at the earliest, as the last answer that told it put it
    /// (in exact mode each rejection while the controller is not normal, in batched
    /// mode each sync): the basis of `Retry-After` for a `roc_cut` rejection of the
    /// route, as [`Engine::restore_eta`] is for a local route's
    /// (`rocgate::http::rejection::retry_after` adds the jitter), and for a
    /// `fallback_local` one while Redis is away (the schedule last seen: the
    /// controller does not step meanwhile, so the raise comes later). `None` when the
    /// shared controller was last seen normal, or it is not known.
    pub fn restore_eta(&self, route: &str, now: Nanos) -> Option<Duration> {
        match self
            .inner
            .routes
            .get(route)?
            .next_raise
            .load(Ordering::Relaxed)
        {
            0 => None,
            at => Some(Nanos::new(at).saturating_since(now)),
        }
    }

    /// Follows `engine`, the one in force (`rocgate serve` gives it at start and at
    /// each reload): the heartbeat's debit of a route ([`beat`](Self::beat)) is then
    /// decided at the route's base limit in force there as of the debit, as a decision
    /// would be, a runtime change or a scheduled event since the route's last call
    /// included. Held weakly; a route it does not hold, or no engine followed, keeps
    /// the base limit of the route's last call.
    ///
    /// It also shares each partitioned route's `route_limit` of `engine`, which no
    /// store decides, among the live instances ([`instances`](Self::instances)):
    /// `engine` holds the total ÷ the live count, set now and again at each change
    /// of the count ([`Engine::set_route_limit_share`]), so that the fleet's total is
    /// the configured one. An engine never given to a store holds the whole total on
    /// each instance: give it before it decides (`rocgate serve` gives a reload's
    /// engine before putting it in force).
    pub fn follow(&self, engine: &Arc<Engine>) {
        let mut followed = self
            .inner
            .engine
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *followed = Arc::downgrade(engine);
        engine.set_route_limit_share(self.inner.instances(), self.inner.clock.now());
    }

    /// Forgets every route that `engine` (the one a reload just put in force) does
    /// not share: removed, or made local. A route in fallback then no longer keeps
    /// the instance in fallback (its mode changes on its own decisions and the
    /// heartbeat's probes only, and it gets neither any more). `rocgate serve` calls
    /// it on each reload.
    pub fn retain(&self, engine: &Engine) {
        let inner = &self.inner;
        inner.routes.retain(|name, r| {
            let kept = engine
                .route_id(name)
                .is_some_and(|id| self.shares(engine, id));
            if !kept {
                inner.retire(r);
                // As the collector does for a route's own gauges once it is gone.
                r.limit_gauge.set(f64::NAN);
            }
            kept
        });
    }

    /// [`view`](Self::view), for a route that `engine` (the one in force) shares: a
    /// route a reload made local keeps the view it had until [`retain`](Self::retain),
    /// which this leaves out. A shared route this instance has not decided on yet has
    /// a view all the same, of a shared state not known: shared, at its base limit in
    /// force and normal, as the store starts it, with a ROC and a bucket level of NaN
    /// (never the local engine's, which decides none of its requests).
    pub fn shared_view(&self, engine: &Engine, route: &str) -> Option<SharedView> {
        let id = engine.route_id(route)?;
        if !self.shares(engine, id) {
            return None;
        }
        self.view(route).or_else(|| {
            let params = engine.params_at(id, self.inner.clock.now())?;
            Some(SharedView {
                mode: StoreMode::Shared,
                limit_rps: params.base_limit_rps,
                state: ControllerState::Normal,
                roc: f64::NAN,
                demand_rps: f64::NAN,
                answered_ago: None,
                fell_since_answer: false,
                stepped: TransitionCounts::default(),
                level: UNKNOWN_LEVEL,
                owed_tokens: 0,
            })
        })
    }

    /// The fleet's demand on `route` that Redis's answers to this instance gave since
    /// the last call (each answer's [`SharedView::demand_rps`]): their mean over time,
    /// each answer's standing until the next one's (or this call, or a call Redis did
    /// not answer), the highest, and the seconds measured
    /// ([`FleetDemand::measured_s`]). `None` if no answer gave one since (no
    /// decision or sync reached Redis, or Redis held no rate), or the store has not
    /// built the route. `rocgate serve`'s tuning hints take it at the end of each
    /// interval ([`crate::hints::Interval::fleet_demand`]).
    pub fn take_fleet_demand(&self, route: &str) -> Option<FleetDemand> {
        let now = self.inner.clock.now();
        self.inner.routes.get(route)?.demand_seen().take(now)
    }

    /// Registers the `rocgate_store_*` series of every route that `engine` (the one
    /// in force) shares and this instance has not decided on yet (the store builds a
    /// route at its first decision), as `/metrics` shows the route's other series from
    /// the start: its counters at 0, so that `rate` counts its first decision (a
    /// first fallback too), and `rocgate_store_limit_rps` at its base limit in force,
    /// the limit [`shared_view`](Self::shared_view) gives it. From its first decision
    /// the store sets them. Such a route that `engine` no longer shares, not built,
    /// has its gauge blanked (NaN), as [`retain`](Self::retain) blanks a built one's.
    /// `rocgate serve` calls it before each scrape.
    pub fn register_undecided(&self, engine: &Engine) {
        let inner = &self.inner;
        let mut undecided = inner
            .undecided
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        undecided.retain(|name| {
            if inner.routes.contains_key(name) {
                return false;
            }
            let shared = engine
                .route_id(name)
                .is_some_and(|id| self.shares(engine, id));
            if !shared {
                metrics::gauge!(metric::STORE_LIMIT, "route" => name.to_string()).set(f64::NAN);
            }
            shared
        });
        for name in engine.route_names() {
            let Some(view) = self.shared_view(engine, name) else {
                continue;
            };
            let name: Arc<str> = Arc::from(name);
            // Under the map's lock of the name: a decision building the route now sets
            // the gauge after this, from Redis's answer.
            let dashmap::Entry::Vacant(_building) = inner.routes.entry(Arc::clone(&name)) else {
                continue;
            };
            let route = || name.to_string();
            for decision in ["admitted", "rejected", "shadow_rejected"] {
                metrics::counter!(metric::STORE_REQUESTS, "route" => route(), "decision" => decision)
                    .increment(0);
            }
            metrics::counter!(metric::STORE_FALLBACK, "route" => route()).increment(0);
            let _at_zero = carried_counter(&name);
            metrics::gauge!(metric::STORE_LIMIT, "route" => route()).set(view.limit_rps);
            undecided.insert(name);
        }
    }

    /// Every route that `engine` (the one in force) shares, by name, with its
    /// [`shared_view`](Self::shared_view): what this instance last saw of it, or, for a
    /// route it has not decided on yet, a view of nothing known (shared, normal at the
    /// base limit in force, no ROC).
    pub fn shared_views(&self, engine: &Engine) -> Vec<(String, SharedView)> {
        let mut views: Vec<_> = engine
            .route_names()
            .filter_map(|name| Some((name.to_owned(), self.shared_view(engine, name)?)))
            .collect();
        views.sort_by(|a, b| a.0.cmp(&b.0));
        views
    }

    /// Beats once now (the heartbeat task beats every `heartbeat`): announces this
    /// instance and updates the live count ([`instances`](Self::instances): for three
    /// beats after one that found this instance missing from the set, or the first
    /// answered after one that failed, it does not fall). Then probes each route in
    /// fallback whose probe is due (the one probe of
    /// its `probe_interval`, which its decisions then do not get), with a `SETRANGE`
    /// of nothing on its `:probe` key (a write that creates nothing, refused where a
    /// decision's script would be), all at once, each within `timeout`: an answer
    /// puts the route back on the shared state with no request on it, its next call
    /// rearming the shared controller as a decision's probe does (see the module
    /// docs). Then sends, with [`DEBIT`], what each route on the shared state owes for
    /// what its fallback admitted (those just brought back, which made no call, and
    /// any whose call or debit failed), each within `timeout`; a route that owes
    /// nothing costs no call. One server: only if this beat reached it. A cluster:
    /// whatever the beat found (the heartbeat's key is on one master, a route's on its
    /// own). Returns once every probe and debit is answered or timed out: the count
    /// Redis answered, or `None` if Redis did not answer within `timeout` (or this
    /// instance has left).
    pub async fn beat(&self) -> Option<u64> {
        self.inner.beat().await
    }

    /// Stops the heartbeat, pays what each route still owes for what its fallback
    /// admitted, and removes this instance from the heartbeat set (on shutdown), so
    /// the others' shares grow at once instead of after three missed beats.
    ///
    /// Every route that owes ([`SharedView::owed_tokens`]) is sent its debit with
    /// [`DEBIT`], whatever its mode (a route still in fallback may well reach Redis
    /// now, as the heartbeat's probe would find), all at once, each within `timeout`;
    /// a debit the heartbeat has in flight on a route is waited for first. What Redis
    /// does not take (it errs, or does not answer within `timeout`) is logged once, as
    /// a warning naming the routes and the tokens: the shared bucket was not debited
    /// them, and the instance leaving takes the debt with it. Returns within three
    /// times `timeout` at most, whatever Redis does: a beat, a debit or a decision's
    /// call carrying a debit in flight, the debits, the `ZREM`, each bounded by it. A
    /// decision's call is waited for up to twice `timeout`, so that a call timing out
    /// gives its debit back before the wait ends (one `timeout` could end in the same
    /// timer tick); only a decision whose caller holds it and no longer polls it
    /// (its call then never ends) makes that wait, and the leave four `timeout`s.
    ///
    /// The leave runs once: it is a task of its own, which a caller that gives up
    /// (`rocgate serve`'s second SIGTERM drops the shutdown that was leaving) leaves
    /// running, and a later leave waits for it to end rather than sending the debits
    /// and the warning again; once it has ended, a leave returns at once.
    pub async fn leave(&self) {
        let mut ended = self
            .inner
            .leaving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(|| {
                let (done, ended) = tokio::sync::watch::channel(false);
                let inner = Arc::clone(&self.inner);
                tokio::spawn(async move {
                    let _ = inner.leave().await;
                    let _ = done.send(true);
                });
                ended
            })
            .clone();
        // An error: the task is gone (its runtime shutting down), and with it the leave.
        let _ = ended.wait_for(|&ended| ended).await;
    }
}

impl Inner {
    /// [`RedisStore::leave`]'s work, run once; returns the routes whose debt Redis did
    /// not take, as the warning names them.
    async fn leave(self: &Arc<Self>) -> Vec<(Arc<str>, u64)> {
        // SeqCst, as `Carried::take`'s: a decision either sees the leave and carries
        // nothing, or is counted before the wait below reads the count.
        self.left.store(true, Ordering::SeqCst);
        // Decisions whose call carries a debt end first, and a beat in flight (each
        // within `timeout`, under way together: the beat goes on while the
        // decisions are waited for); no beat starts after. A call waited for began
        // before the leave and ends within its `timeout`, giving its debt back as its
        // deadline passes: a wait of one `timeout` too could end in the tick the
        // call's does, before the call gives it back. The second `timeout` bounds
        // only a decision its caller holds and no longer polls.
        let _ = tokio::time::timeout(
            self.config.timeout.saturating_mul(2),
            self.carried_calls_end(),
        )
        .await;
        let _beating = self.beating.lock().await;
        let unpaid = self.settle().await;
        if !unpaid.is_empty() {
            let routes: Vec<&str> = unpaid.iter().map(|(name, _)| name.as_ref()).collect();
            let tokens: u64 = unpaid.iter().map(|(_, owed)| owed).sum();
            tracing::warn!(
                routes = %routes.join(","),
                tokens,
                "leaving with fallback admissions the shared bucket was not debited: Redis did not take the debit"
            );
        }
        let cmd = redis::cmd("ZREM")
            .arg(&self.instances_key)
            .arg(&self.member)
            .to_owned();
        let _ = tokio::time::timeout(self.config.timeout, self.conn.query::<Value>(&cmd)).await;
        unpaid
    }

    /// Returns once no decision's call carries a debt ([`Carried`]).
    async fn carried_calls_end(&self) {
        loop {
            let ended = self.carried.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.carrying.load(Ordering::SeqCst) == 0 {
                return;
            }
            ended.await;
        }
    }

    fn mode(&self) -> StoreMode {
        if self.fallen.load(Ordering::Relaxed) > 0 {
            StoreMode::Fallback
        } else {
            StoreMode::Shared
        }
    }

    /// Sets a route's mode; the instance's, and its gauge, when that changes.
    fn set_mode(&self, r: &SharedRoute, mode: StoreMode) {
        self.set_mode_for(r, mode, None);
    }

    /// [`set_mode`](Self::set_mode), the fall logged with `why`.
    fn set_mode_for(&self, r: &SharedRoute, mode: StoreMode, why: Option<&Why<'_>>) {
        if r.fallen.load(Ordering::Relaxed) == (mode == StoreMode::Fallback) {
            return;
        }
        let _one_at_a_time = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        self.flip(r, mode, why);
    }

    /// Takes a route the store no longer holds (a reload dropped or rebuilt it) out of
    /// the instance's mode for good: a decision still in flight on it that fails
    /// afterwards must not put the instance in fallback, where nothing would take it
    /// out again.
    fn retire(&self, r: &SharedRoute) {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        // SeqCst with the load in `absorb`: an answer that sets the route's gauge after
        // `retain` blanked it sees the route retired.
        r.retired.store(true, Ordering::SeqCst);
        self.flip(r, StoreMode::Shared, None);
    }

    /// [`set_mode`](Self::set_mode), under `changing`: the count of fallen routes and
    /// the gauge published from it change together, and a route retired before
    /// never falls. A fall's lines say `why` (the failure that opened the breaker),
    /// which is all an operator learns of it where the heartbeat is answered (an ACL
    /// that lets the heartbeat's key through but not the route's).
    fn flip(&self, r: &SharedRoute, mode: StoreMode, why: Option<&Why<'_>>) {
        let fall = mode == StoreMode::Fallback;
        if fall && r.retired.load(Ordering::Relaxed) {
            return;
        }
        if r.fallen.swap(fall, Ordering::Relaxed) == fall {
            return;
        }
        if fall {
            r.fell_since_answer.store(true, Ordering::Relaxed);
            if let Some(w) = why {
                *r.fell_for.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((w.error.to_string(), w.check.map(str::to_owned)));
            }
        }
        let before = if fall {
            self.fallen.fetch_add(1, Ordering::Relaxed)
        } else {
            self.fallen.fetch_sub(1, Ordering::Relaxed)
        };
        let error = why.map(|w| w.error.to_string());
        let check = why.and_then(|w| w.check);
        tracing::info!(
            route = r.name.as_ref(),
            mode = mode.as_str(),
            error = error.as_deref(),
            check,
            "route store mode changed"
        );
        // The instance's mode changes with the first route to fall and the last to
        // come back, not with every route that comes back. The fall is a warning, the
        // return not (an alert on warnings would fire again as Redis came back).
        if before == usize::from(!fall) {
            publish_mode(mode);
            if fall {
                tracing::warn!(
                    mode = mode.as_str(),
                    route = r.name.as_ref(),
                    error = error.as_deref(),
                    check,
                    "store mode changed"
                );
            } else {
                tracing::info!(mode = mode.as_str(), "store mode changed");
            }
        }
    }

    /// A call on a route failed with `error` (and a setting to `check`, see
    /// [`setting_to_check`]): feed its breaker; once that is open, the route is
    /// decided locally, and its fall says why.
    fn failed(&self, r: &SharedRoute, error: &dyn std::fmt::Display, check: Option<&str>) {
        let now = self.clock.now();
        // The mode changes under the breaker's lock, as on a success: a success
        // between the two would otherwise leave the route in fallback, its breaker
        // closed, until its next decision.
        let mut b = r.breaker();
        b.failure(now);
        if b.is_open() {
            self.set_mode_for(r, StoreMode::Fallback, Some(&Why { error, check }));
        }
    }

    /// The route's shared state, built on first use and rebuilt when its shape
    /// (window, burst) changed on reload; `None` for a route `engine` does not hold.
    fn route(&self, engine: &Engine, route: RouteId, now: Nanos) -> Option<Arc<SharedRoute>> {
        let name = engine.route_name(route)?;
        let window = engine.window(route)?;
        let burst = match engine.algorithm(route)? {
            Algorithm::TokenBucket { burst } => *burst,
            _ => Duration::from_secs(1),
        };
        // A rebuilt route keeps the transitions it stepped: the counters set from them
        // must not go back.
        let mut stepped = TransitionCounts::default();
        // It keeps what it last saw of the shared state, its fallback bucket's level
        // and debt, its arrivals not yet synced, and its breaker and mode: a reload
        // during a Redis outage must not hand out a fresh burst, nor send decisions to
        // Redis again to find it away.
        let mut before = None;
        if let Some(r) = self.routes.get(name) {
            if r.window == window && r.burst == burst {
                return Some(Arc::clone(&r));
            }
            stepped = *r.stepped.lock().unwrap_or_else(PoisonError::into_inner);
            before = Some(Arc::clone(&r));
        }
        let label: Arc<str> = engine.route_label(route)?;
        // Keys renewed once per slot outlive the last request by their expiry less one
        // slot: at least the burst (a bucket that expired would have refilled anyway,
        // so recreating it full hands out nothing more) and the window (one that
        // expired would be empty anyway), whatever a shorter `key_ttl` says.
        let ttl = self
            .config
            .key_ttl
            .max(burst + window.slot())
            .max(window.window() + window.slot());
        let base = engine.params_at(route, now)?.base_limit_rps;
        let share = base / self.instances() as f64;
        let tag = format!("{{{}:{}}}", self.config.key_prefix, label);
        let counter = |decision: &'static str| metrics::counter!(metric::STORE_REQUESTS, "route" => label.to_string(), "decision" => decision);
        let r = Arc::new(SharedRoute {
            name: Arc::clone(&label),
            keys: [format!("{tag}:w"), format!("{tag}:b"), format!("{tag}:c")],
            probe_key: format!("{tag}:probe"),
            breaker: Mutex::new(Breaker::new(
                self.config.failures_to_open,
                self.config.probe_interval,
            )),
            fallen: AtomicBool::new(false),
            fell_for: Mutex::new(None),
            fell_since_answer: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            window,
            burst,
            slot_us: (window.slot().as_micros() as u64).max(1),
            ttl_ms: ttl_ms(ttl),
            base_limit: AtomicU64::new(base.to_bits()),
            limit: AtomicU64::new(base.to_bits()),
            state: AtomicU8::new(ControllerState::Normal.as_index()),
            seen_at: AtomicU64::new(0),
            view_us: AtomicU64::new(0),
            entered: AtomicU64::new(0),
            entered_state: AtomicU8::new(ControllerState::Normal.as_index()),
            // Not known before Redis answers (see [`SharedView::roc`]).
            roc: AtomicU64::new(f64::NAN.to_bits()),
            demand: AtomicU64::new(f64::NAN.to_bits()),
            demand_seen: Mutex::new(DemandSeen::default()),
            next_raise: AtomicU64::new(0),
            tokens: AtomicU64::new(f64::NAN.to_bits()),
            tokens_at: AtomicU64::new(0),
            fallback: TokenBucket::new(share, burst, now),
            fallback_limit: AtomicU64::new(share.to_bits()),
            owed: AtomicU64::new(0),
            paying: tokio::sync::Mutex::new(()),
            successor: std::sync::OnceLock::new(),
            admitted: counter("admitted"),
            rejected: counter("rejected"),
            shadow_rejected: counter("shadow_rejected"),
            fallbacks: metrics::counter!(metric::STORE_FALLBACK, "route" => label.to_string()),
            carried: carried_counter(&label),
            limit_gauge: metrics::gauge!(metric::STORE_LIMIT, "route" => label.to_string()),
            pending: AtomicU64::new(0),
            missed: AtomicBool::new(false),
            synced_slot: AtomicU64::new(u64::MAX),
            sync_shift: AtomicU64::new(0),
            stepped: Mutex::new(stepped),
        });
        if let Some(old) = &before {
            // The shared state it had last seen (`r` is not published yet: the order
            // of these stores is no one's to observe).
            for (to, from) in [
                (&r.limit, &old.limit),
                (&r.roc, &old.roc),
                (&r.demand, &old.demand),
                (&r.next_raise, &old.next_raise),
                (&r.tokens, &old.tokens),
                (&r.tokens_at, &old.tokens_at),
                (&r.seen_at, &old.seen_at),
                (&r.view_us, &old.view_us),
                (&r.entered, &old.entered),
            ] {
                to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            for (to, from) in [
                (&r.state, &old.state),
                (&r.entered_state, &old.entered_state),
            ] {
                to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            // The fleet's demand its answers gave since the hints last took it.
            *r.demand_seen() = std::mem::take(&mut *old.demand_seen());
            // What it owes, and what decisions still in flight on it come to owe.
            Self::replaced(old, &r);
            // Batched mode: the arrivals not yet synced go with the rebuilt route's
            // first sync (the shared window would otherwise miss a slot of them).
            let pending = old.pending.swap(0, Ordering::Relaxed);
            r.pending.fetch_add(pending, Ordering::Relaxed);
            // And where its sync slots begin, while its slots are as long.
            if old.slot_us == r.slot_us {
                r.sync_shift
                    .store(old.sync_shift.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            let level = old.fallback.level(now).value;
            self.share(&r, r.seen_limit(), now).lower_to(level, now);
            // And its breaker and mode: a route in fallback stays there (counted before
            // the old one is retired, so the instance's mode does not flip to shared
            // and back) and calls Redis only when a probe is due. Both read under the
            // old breaker's lock, under which its mode changes: a call on the old route
            // ending between the two would leave this one in fallback with a closed
            // breaker, which the heartbeat does not probe, or shared with an open one.
            let (breaker, fallen) = {
                let b = old.breaker();
                (b.clone(), old.mode() == StoreMode::Fallback)
            };
            *r.breaker() = breaker;
            if fallen {
                // Said again with the error that sent the old one.
                let fell_for = old
                    .fell_for
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let why = fell_for.as_ref().map(|(error, check)| Why {
                    error,
                    check: check.as_deref(),
                });
                self.set_mode_for(&r, StoreMode::Fallback, why.as_ref());
            }
        }
        if let Some(old) = self.routes.insert(label, Arc::clone(&r)) {
            // The route replaced, which is `before` unless another decision rebuilt
            // it meanwhile: its debt follows too.
            Self::replaced(&old, &r);
            self.retire(&old);
        }
        Some(r)
    }

    /// `old`, replaced by `new`: what it owes, and what decisions still in flight on
    /// it come to owe, goes to `new`, and so does a gap its dropped arrivals left, or
    /// syncs still in flight on it come to leave, still to be said (batched mode:
    /// `missed`), the successor set first, so that none is left behind. A route
    /// replaced twice keeps its first successor, which leads on.
    fn replaced(old: &SharedRoute, new: &Arc<SharedRoute>) {
        if std::ptr::eq(old, Arc::as_ptr(new)) {
            return;
        }
        let _ = old.successor.set(Arc::clone(new));
        let owed = old.owed.swap(0, Ordering::AcqRel);
        new.owe(owed);
        if old.missed.swap(false, Ordering::AcqRel) {
            new.miss();
        }
    }

    /// Runs [`DECIDE`]: counts `arrivals`, and, if `take`, debits `debit` tokens and
    /// takes one; with the route's [`Seed`] under `params`, if it has one. `None` if
    /// Redis erred, did not answer within `timeout`, or answered nonsense; the breaker
    /// and the error counters know either way.
    async fn call(
        &self,
        r: &SharedRoute,
        arrivals: u64,
        take: bool,
        debit: u64,
        params: &ControllerParams,
    ) -> Option<Reply> {
        // A call on a route in fallback is its probe: the decisions taken locally
        // meanwhile are missing from the shared window, so an answer restarts the
        // shared controller's window (see [`DECIDE`]). The first call after the
        // heartbeat's probe brought the route back says so too (`missed`). So are, in
        // batched mode, the arrivals of a sync that failed or was skipped: the call
        // that fails sets `missed` again ([`sync`]), as does any call that took
        // `missed` and failed: the gap is still to be said. A probe takes `missed`
        // too: the gap it says covers the syncs skipped in fallback, and the next
        // call has none to say.
        let fallen = r.mode() == StoreMode::Fallback;
        let missed = r.missed.load(Ordering::Relaxed) && r.missed.swap(false, Ordering::Relaxed);
        let gap = fallen || missed;
        let mut invocation = self.decide.call(&[&r.keys[0], &r.keys[1], &r.keys[2]]);
        invocation
            .arg(r.slot_us)
            .arg(r.window.slots())
            .arg(f64::from_bits(r.base_limit.load(Ordering::Relaxed)))
            .arg(r.burst.as_secs_f64())
            .arg(r.ttl_ms)
            .arg(arrivals)
            .arg(u8::from(take))
            .arg(debit)
            .arg(u8::from(gap));
        if let Some(seed) = r.seed(params, self.clock.now()) {
            let roc = if seed.roc.is_finite() { seed.roc } else { 0.0 };
            invocation
                .arg(seed.state)
                .arg(format!("{:?}", seed.limit_rps))
                .arg(seed.entered.map_or_else(String::new, |at| at.to_string()))
                .arg(format!("{roc:?}"))
                .arg(seed.view_us);
        }
        let answer =
            tokio::time::timeout(self.config.timeout, self.conn.invoke::<Value>(&invocation)).await;
        // An answer, or why there was none (for the log line of the route's fall).
        let reply = match answer {
            Ok(Ok(value)) => Reply::parse(value).ok_or_else(|| {
                self.errors.increment(1);
                tracing::debug!("store call answered something unreadable");
                (
                    "an answer the decision script does not give".to_owned(),
                    None,
                )
            }),
            Ok(Err(e)) => {
                self.errors.increment(1);
                tracing::debug!(error = %e, "store call failed");
                Err((e.to_string(), setting_to_check(&e)))
            }
            Err(_) => {
                self.timeouts.increment(1);
                self.conn.suspect(&r.keys[0]);
                Err((format!("no answer within {:?}", self.config.timeout), None))
            }
        };
        let reply = match reply {
            Ok(reply) => {
                let mut b = r.breaker();
                b.success();
                self.set_mode(r, StoreMode::Shared);
                reply
            }
            Err((error, check)) => {
                if missed {
                    r.miss();
                }
                r.demand_seen().stop(self.clock.now());
                self.failed(r, &error, check);
                return None;
            }
        };
        Some(reply)
    }

    /// Takes in what Redis answered at `now` (this instance's clock): the shared limit
    /// and state, when the limit will next rise if it told the controller's memory
    /// (under the profile of `schedule` due now), and, for the winner of a rollover,
    /// the controller step under `schedule`, each slot under the profile due at its
    /// end, moved onto Redis's clock (in a task of its own). The
    /// base limit is taken before the call, not from its answer: in exact mode by each
    /// decision, in batched mode by each slot's first decision only (see
    /// [`Inner::batched`]): the end-of-slot sync, answered after the next slot's first
    /// decision, would otherwise write the base of the slot it was sent for back over
    /// a lowered one, for the rest of the slot.
    fn absorb(
        self: &Arc<Self>,
        r: &Arc<SharedRoute>,
        reply: Reply,
        schedule: &Schedule,
        now: Nanos,
    ) {
        r.limit.store(reply.limit.to_bits(), Ordering::Relaxed);
        let seen = r.state.swap(reply.state, Ordering::Relaxed);
        r.seen_at.store(now.as_u64().max(1), Ordering::Relaxed);
        let view_us = match reply.carried_view_us {
            _ if reply.afresh => 0,
            Some(carried) => carried.max(1),
            None => reply.now_us.max(1),
        };
        r.view_us.store(view_us, Ordering::Relaxed);
        let memory = reply
            .memory
            .as_ref()
            .or(reply.roll.as_ref().map(|roll| &roll.memory));
        if let Some(m) = memory.and_then(|m| m.memory.as_ref()) {
            r.note_entered(m);
        } else if seen != reply.state {
            // A state this instance had not seen, with no memory to say when it was
            // entered: no later than this answer's time. What it noted of an earlier
            // state (another cut's entry, the same state's index) is not this one's.
            r.entered
                .store(reply.now_us.saturating_mul(1000), Ordering::Relaxed);
            r.entered_state.store(reply.state, Ordering::Relaxed);
        }
        if reply.seeded {
            // This call found the controller gone and carried over what this instance
            // last saw: no transition says it either.
            r.carried.increment(1);
            tracing::warn!(
                route = r.name.as_ref(),
                state = state_of(reply.state).as_str(),
                limit_rps = reply.limit,
                "shared controller state gone from Redis (restarted empty, flushed, or the route's keys evicted or expired): carried over from what this instance last saw, rearmed for one window"
            );
        } else if reply.afresh && seen != ControllerState::Normal.as_index() {
            // No transition says it: the cut (or restore) this instance last saw is
            // gone with Redis's state, the route back at its base limit, its
            // controller unarmed for a window.
            tracing::warn!(
                route = r.name.as_ref(),
                was = state_of(seen).as_str(),
                limit_rps = reply.limit,
                "shared controller state gone from Redis (restarted empty, flushed, or the route's keys evicted or expired): the route starts afresh at its base limit"
            );
        }
        if reply.state == ControllerState::Normal.as_index() {
            r.next_raise.store(0, Ordering::Relaxed);
        } else if let Some(memory) = &reply.memory {
            let eta = held_eta(memory, reply.slot, reply.now_us).unwrap_or_else(|| {
                let redis_now = Nanos::new(reply.now_us.saturating_mul(1000));
                let on_redis = schedule.clone().on_clock(now, redis_now);
                next_raise(&on_redis, &r.window, memory, reply.now_us)
            });
            let at = eta.map_or(0, |eta| (now + eta).as_u64().max(1));
            r.next_raise.store(at, Ordering::Relaxed);
        }
        r.roc.store(reply.roc.to_bits(), Ordering::Relaxed);
        r.demand.store(reply.rate.to_bits(), Ordering::Relaxed);
        r.fell_since_answer.store(false, Ordering::Release);
        if reply.rate.is_finite() {
            r.demand_seen().add(reply.rate, now);
        }
        r.limit_gauge.set(reply.limit);
        // An answer to a call on a route that a reload has since dropped or made
        // local (no route of its name held any more) blanks the gauge again, as the
        // reload's pass did: no pass sees this route again to blank it.
        if r.retired.load(Ordering::SeqCst) && !self.routes.contains_key(&r.name) {
            r.limit_gauge.set(f64::NAN);
        }
        if let Some(roll) = reply.roll {
            let redis_now = Nanos::new(reply.now_us.saturating_mul(1000));
            tokio::spawn(step(
                Arc::clone(self),
                Arc::clone(r),
                schedule.clone().on_clock(now, redis_now),
                reply.slot,
                reply.now_us,
                roll,
            ));
        }
    }

    /// Batched mode: counts the request for the next sync, starts the sync if this is
    /// the first decision of a sync slot ([`SharedRoute::sync_slot`]), and decides
    /// locally at this instance's share of the shared limit last seen, or of the
    /// route's base limit in force (taken at the first decision of each sync slot) if
    /// lower: a lowered base limit applies within a sync slot, before the shared
    /// controller steps on it, and while Redis is away before the breaker opens as
    /// after.
    fn batched(
        self: &Arc<Self>,
        engine: &Engine,
        route: RouteId,
        r: &Arc<SharedRoute>,
        mode: Mode,
        now: Nanos,
    ) -> Verdict {
        r.pending.fetch_add(1, Ordering::Relaxed);
        let slot = r.sync_slot(now);
        let last = r.synced_slot.load(Ordering::Relaxed);
        if slot != last
            && r.synced_slot
                .compare_exchange(last, slot, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // The base limit in force, taken once a sync slot: a lowered one applies
            // from here on, whether Redis answers, fails or is skipped. A route this
            // engine no longer holds (a reload raced the request) keeps the base it had
            // and syncs nothing more.
            let schedule = engine.schedule(route);
            if let Some(schedule) = &schedule {
                r.base_limit.store(
                    schedule.params_at(now).base_limit_rps.to_bits(),
                    Ordering::Relaxed,
                );
            }
            // Arrivals of a failed or skipped sync are dropped: dumped into a later
            // slot they would look like a spike. The hole they leave would read as a
            // fall, then as a rise, so the next call says so (`missed`).
            let arrivals = r.pending.swap(0, Ordering::Relaxed);
            if let Some(schedule) = schedule.filter(|_| r.breaker().call(now) != Call::Skip) {
                let params = schedule.params_at(now).clone();
                tokio::spawn(sync(
                    Arc::clone(self),
                    Arc::clone(r),
                    arrivals,
                    schedule,
                    params,
                    slot,
                ));
            } else {
                r.miss();
            }
        }
        let base = f64::from_bits(r.base_limit.load(Ordering::Relaxed));
        if r.mode() == StoreMode::Fallback {
            return self.fallback(r, mode, || base, now);
        }
        match self.share(r, r.seen_limit().min(base), now).check(now) {
            Decision::Reject(rej) => {
                let limit = f64::from_bits(r.limit.load(Ordering::Relaxed));
                let reason = r.reason(limit, r.state.load(Ordering::Relaxed));
                r.enforce(
                    mode,
                    Rejection {
                        retry_after: rej.retry_after,
                        reason,
                    },
                )
            }
            admit => {
                r.admitted.increment(1);
                (admit, None)
            }
        }
    }

    /// The local bucket, set to this instance's share of `limit` (÷ live instances
    /// last counted) if that changed.
    fn share<'r>(&self, r: &'r SharedRoute, limit: f64, now: Nanos) -> &'r TokenBucket {
        let share = limit / self.instances() as f64;
        set_share(&r.fallback, &r.fallback_limit, share, now);
        &r.fallback
    }

    /// Exact mode with `fail_mode = "local"`, on each answer (once its limit is
    /// absorbed): lowers the local bucket to this instance's share of the shared
    /// bucket's level (`tokens`), so that the instances' buckets hold together what
    /// the shared one holds when a switch to fallback comes. Never refills it: between
    /// answers it refills at the share, as the shared one does at the limit.
    fn mirror(&self, r: &SharedRoute, tokens: f64, now: Nanos) {
        let share = tokens / self.instances() as f64;
        self.share(r, r.seen_limit(), now).lower_to(share, now);
    }

    /// Decides locally, by `fail_mode`. `fail_mode = "local"` decides at this
    /// instance's share of the shared limit last seen, or of `base()` (the route's base
    /// limit in force) if lower: a reload or a scheduled event that lowers it while
    /// Redis is away applies at once; one that raises it waits for Redis.
    fn fallback(
        &self,
        r: &SharedRoute,
        mode: Mode,
        base: impl FnOnce() -> f64,
        now: Nanos,
    ) -> Verdict {
        r.fallbacks.increment(1);
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        let rejection = match self.config.fail_mode {
            FailMode::Open => return (Decision::Admit(Admit::Now), None),
            FailMode::Closed => Rejection {
                retry_after: self.config.probe_interval,
                reason: Reason::FallbackLocal,
            },
            FailMode::Local => match self.share(r, r.seen_limit().min(base()), now).check(now) {
                Decision::Reject(rej) => Rejection {
                    retry_after: rej.retry_after,
                    reason: Reason::FallbackLocal,
                },
                admit => {
                    // Exact mode debits it from the shared bucket once Redis answers.
                    if self.config.mode == SyncMode::Exact {
                        r.owe(1);
                    }
                    return (admit, None);
                }
            },
        };
        let reason = Some(rejection.reason);
        if mode == Mode::Shadow {
            return (Decision::Admit(Admit::Now), reason);
        }
        (Decision::Reject(rejection), reason)
    }

    /// Live instances as last counted (`expected_instances` until counted).
    fn instances(&self) -> u64 {
        self.instances.load(Ordering::Relaxed).max(1)
    }

    /// Takes in the live count `n` that beat `seq` answered, if no later beat's answer
    /// came first (the background beat and an explicit [`RedisStore::beat`] can
    /// overlap). A beat that found this instance `missing` from the heartbeat set (its
    /// first, or the set was lost with Redis, or expired in an outage), or the first
    /// answered after one that failed (which may have reached a Redis that had lost
    /// the set, its answer lost), may count only the instances that have beaten into
    /// the set since: for [`HELD_BEATS`] beats
    /// from it, the count may rise but not fall, so that a Redis
    /// that fails again meanwhile does not leave this instance in fallback at a share
    /// counted from a half-empty set. Each change of the count in force is logged
    /// ([`CountSaid`]). Returns the count now in force.
    fn counted(&self, seq: u64, n: u64, missing: bool) -> u64 {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        let before = self.instances();
        if seq <= count.applied {
            return before;
        }
        count.applied = seq;
        if missing {
            count.held = HELD_BEATS;
        }
        let n = if count.held > 0 {
            count.held -= 1;
            n.max(before)
        } else {
            n
        };
        self.instances.store(n, Ordering::Relaxed);
        metrics::gauge!(metric::STORE_INSTANCES).set(n as f64);
        let said = count.said.after_beat(before, n, self.clock.now());
        drop(count);
        if n != before {
            self.share_route_limits();
        }
        if let Some(change) = said {
            change.log();
        }
        n
    }

    /// Shares the `route_limit` of the engine followed ([`RedisStore::follow`]) among
    /// the live instances as counted now. Under the engine's lock, which a follow
    /// holds while it shares them too: whichever comes last sets the count in force
    /// then, never an older one.
    fn share_route_limits(&self) {
        let followed = self.engine.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(engine) = followed.upgrade() {
            engine.set_route_limit_share(self.instances(), self.clock.now());
        }
    }

    /// Beats once ([`announce`](Self::announce)), then probes the routes in fallback
    /// whose probe is due ([`probe_fallen`](Self::probe_fallen)), then sends what the
    /// routes shared again owe ([`pay_debts`](Self::pay_debts)), those the probes just
    /// brought back among them, and returns once each probe and debit is answered or
    /// timed out. One server: only if the beat reached it (a probe or a debit
    /// would only find it away too). A cluster: whatever the beat found, which tells
    /// of the heartbeat key's master alone, each probe going to its route's own.
    async fn beat(self: &Arc<Self>) -> Option<u64> {
        let counted = self.announce().await;
        if counted.is_some() || matches!(self.conn, Conn::Cluster(_)) {
            self.probe_fallen().await;
            self.pay_debts().await;
        }
        counted
    }

    /// The routes in fallback whose breaker grants a probe at `now`: each grant is the
    /// route's one probe of its `probe_interval`, which its decisions then do not get.
    /// Never a route the store dropped.
    fn due_probes(&self, now: Nanos) -> Vec<Arc<SharedRoute>> {
        let fallen: Vec<Arc<SharedRoute>> = self
            .routes
            .iter()
            .filter(|r| r.mode() == StoreMode::Fallback && !r.retired.load(Ordering::Relaxed))
            .map(|r| Arc::clone(r.value()))
            .collect();
        fallen
            .into_iter()
            .filter(|r| r.breaker().call(now) == Call::Probe)
            .collect()
    }

    /// Probes every route [`due_probes`](Self::due_probes) gives, each in a task of its
    /// own (a master that does not answer costs one `timeout`, not one per route),
    /// and waits for them all.
    async fn probe_fallen(self: &Arc<Self>) {
        if self.left.load(Ordering::Relaxed) {
            return;
        }
        let probes: Vec<_> = self
            .due_probes(self.clock.now())
            .into_iter()
            .map(|r| tokio::spawn(Arc::clone(self).probe(r)))
            .collect();
        for probe in probes {
            let _ = probe.await;
        }
    }

    /// A route's probe by the heartbeat, within `timeout`: `SETRANGE` of nothing on
    /// its `probe_key`, which is under the route's hash tag (on a cluster, it goes to
    /// the master holding the route's keys). A write that writes nothing (an empty
    /// range on a key that does not exist creates none), refused where a decision's
    /// script would be: by a Redis out of memory under `noeviction`, which answers
    /// reads (an `EXISTS` put the route back at each beat, and its next decisions sent
    /// it back to fallback), by a replica, by `BUSY`; not where the script alone fails
    /// (a key of another type under the route's tag, an ACL refusing the scripts but
    /// not `SETRANGE`), whose route comes back at each probe and falls again at its
    /// next decisions. Not [`DECIDE`], whose answer may
    /// win a rollover, which the route's controller parameters step (the engine's,
    /// which the heartbeat does not hold). Answered, the route is back on the shared
    /// state as after a decision's probe, and its next call says that the window
    /// missed the decisions taken locally (`missed`), which a decision's probe says
    /// itself; what the fallback admitted is sent by the beat after its probes
    /// ([`pay_debts`](Self::pay_debts)), or by the route's next call if that comes
    /// first. Not answered, the
    /// breaker stays open, its next probe a whole `probe_interval` after this one.
    async fn probe(self: Arc<Self>, r: Arc<SharedRoute>) {
        let nothing = redis::cmd("SETRANGE")
            .arg(&r.probe_key)
            .arg(0)
            .arg("")
            .to_owned();
        match tokio::time::timeout(self.config.timeout, self.conn.query::<i64>(&nothing)).await {
            Ok(Ok(_)) => {
                // `missed` first: a decision that sees the route shared says the gap.
                let mut b = r.breaker();
                r.miss();
                b.success();
                self.set_mode(&r, StoreMode::Shared);
            }
            Ok(Err(e)) => {
                self.errors.increment(1);
                tracing::debug!(route = r.name.as_ref(), error = %e, "store probe failed");
                self.failed(&r, &e, setting_to_check(&e));
            }
            Err(_) => {
                self.timeouts.increment(1);
                self.conn.suspect(&r.probe_key);
                self.failed(
                    &r,
                    &format_args!("no answer within {:?}", self.config.timeout),
                    None,
                );
            }
        }
    }

    /// The routes that owe the shared bucket what their fallback admitted
    /// ([`SharedRoute::owed`]): brought back by the heartbeat's probe, which sends no
    /// debit, or left owing by a call or debit that failed; on the shared state only,
    /// unless `leaving` (a leave's debits, the debt's last chance: whatever the
    /// route's mode, and a route whose debit is in flight too, which may give its debt
    /// back). A load per route: a route that owes nothing costs no call. Never a route
    /// the store dropped (what it owed went to the route that replaced it).
    fn owing(&self, leaving: bool) -> Vec<Arc<SharedRoute>> {
        self.routes
            .iter()
            .filter(|r| {
                !r.retired.load(Ordering::Relaxed)
                    && if leaving {
                        r.owed.load(Ordering::Relaxed) > 0 || r.paying.try_lock().is_err()
                    } else {
                        r.mode() == StoreMode::Shared && r.owed.load(Ordering::Relaxed) > 0
                    }
            })
            .map(|r| Arc::clone(r.value()))
            .collect()
    }

    /// Pays what every route [`owing`](Self::owing) on the shared state gives owes
    /// ([`pay`](Self::pay)), each in a task of its own, and waits for them all; nothing
    /// once the instance has left (the leave pays them: [`settle`](Self::settle)).
    async fn pay_debts(self: &Arc<Self>) {
        if self.left.load(Ordering::Relaxed) {
            return;
        }
        self.pay_all(self.owing(false)).await;
    }

    /// Pays what each of `routes` owes, each in a task of its own, and waits for them
    /// all.
    async fn pay_all(self: &Arc<Self>, routes: Vec<Arc<SharedRoute>>) {
        let debits: Vec<_> = routes
            .into_iter()
            .map(|r| tokio::spawn(Arc::clone(self).pay(r)))
            .collect();
        for debit in debits {
            let _ = debit.await;
        }
    }

    /// A leave's debits ([`RedisStore::leave`]): pays what every route owes, whatever
    /// its mode, and returns the routes that still owe (Redis did not take their
    /// debit), with what they owe. Within two `timeout`s: a debit of the heartbeat's
    /// in flight on a route is waited for ([`SharedRoute::paying`]), then the
    /// route's own.
    async fn settle(self: &Arc<Self>) -> Vec<(Arc<str>, u64)> {
        self.pay_all(self.owing(true)).await;
        let mut unpaid: Vec<(Arc<str>, u64)> = self
            .routes
            .iter()
            .filter(|r| !r.retired.load(Ordering::Relaxed))
            .filter_map(|r| match r.owed.load(Ordering::Relaxed) {
                0 => None,
                owed => Some((Arc::clone(&r.name), owed)),
            })
            .collect();
        unpaid.sort();
        unpaid
    }

    /// Sends what `r` owes with [`DEBIT`], within `timeout`, so that an idle route's
    /// debt reaches the shared bucket without waiting for a decision that may never
    /// come. The debt is taken as a decision takes it (swapped out: a decision made
    /// meanwhile sends none of it, and what the fallback admits meanwhile is owed
    /// anew), and owed again if Redis errs or does not answer (a call timed out that
    /// Redis runs later debits twice, never not at all), for the route's next decision
    /// or the next beat to send. A debit is no probe and no decision: its outcome leaves
    /// the breaker and the route's mode alone (a decision's failures open the
    /// breaker), and its errors and timeouts count in `rocgate_store_errors_total`.
    /// Answered, the level it answers is taken as a decision's is: the shared bucket's
    /// last level seen, and the fallback bucket lowered to this instance's share of it.
    /// Decided at the route's base limit in force in the engine followed
    /// ([`base_in_force`](Self::base_in_force)), taken as a decision takes it.
    async fn pay(self: Arc<Self>, r: Arc<SharedRoute>) {
        let _paying = r.paying.lock().await;
        let owed = r.owed.swap(0, Ordering::AcqRel);
        if owed == 0 {
            return;
        }
        let now = self.clock.now();
        // The base limit in force, as a decision's call takes it.
        if let Some(base) = self.base_in_force(&r, now) {
            r.base_limit.store(base.to_bits(), Ordering::Relaxed);
        }
        let mut invocation = self.debit.call(&[&r.keys[1], &r.keys[2]]);
        invocation
            .arg(f64::from_bits(r.base_limit.load(Ordering::Relaxed)))
            .arg(r.burst.as_secs_f64())
            .arg(r.ttl_ms)
            .arg(owed);
        let answer =
            tokio::time::timeout(self.config.timeout, self.conn.invoke::<Value>(&invocation)).await;
        match answer {
            Ok(Ok(value)) => {
                // Applied, readable or not: paid.
                let Some(tokens) = float(&value) else {
                    self.errors.increment(1);
                    tracing::debug!("store debit answered something unreadable");
                    return;
                };
                r.tokens.store(tokens.to_bits(), Ordering::Relaxed);
                r.tokens_at.store(now.as_u64(), Ordering::Relaxed);
                if self.config.fail_mode == FailMode::Local {
                    self.mirror(&r, tokens, now);
                }
            }
            Ok(Err(e)) => {
                r.owe(owed);
                self.errors.increment(1);
                tracing::debug!(route = r.name.as_ref(), error = %e, "store debit failed");
            }
            Err(_) => {
                r.owe(owed);
                self.timeouts.increment(1);
                self.conn.suspect(&r.keys[1]);
            }
        }
    }

    /// `r`'s base limit in force at `now` in the engine followed
    /// ([`RedisStore::follow`]); `None` with no engine followed, or one that does not
    /// hold the route.
    fn base_in_force(&self, r: &SharedRoute, now: Nanos) -> Option<f64> {
        let engine = self
            .engine
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .upgrade()?;
        let id = engine.route_id(&r.name)?;
        Some(engine.params_at(id, now)?.base_limit_rps)
    }

    /// Announces this instance in the heartbeat set and takes in the live count
    /// ([`counted`](Self::counted)); on no answer or an error a new connection may
    /// cure, replaces the connection ([`Conn::renew`], [`Conn::suspect`]), but one
    /// found gone, which one server's link replaces by itself ([`Single::lost`]).
    async fn announce(&self) -> Option<u64> {
        let _beating = self.beating.lock().await;
        if self.left.load(Ordering::Relaxed) {
            return None;
        }
        let seq = self.beats.fetch_add(1, Ordering::Relaxed) + 1;
        let mut invocation = self.heartbeat.call(&[&self.instances_key]);
        invocation
            .arg(self.member.as_str())
            .arg(ttl_ms(self.config.heartbeat.saturating_mul(3)));
        let started = tokio::time::Instant::now();
        let answer = tokio::time::timeout(
            self.config.timeout,
            self.conn.invoke::<(u64, u64)>(&invocation),
        )
        .await;
        match answer {
            Ok(Ok((n, missing))) => {
                let n = n.clamp(1, u64::from(u16::MAX));
                // A beat that failed may have reached Redis all the same (its answer
                // lost or late), and put this instance into a set Redis had lost:
                // this one then finds it there, yet the set is as new.
                let after_failure = self.heard.load(Ordering::Relaxed) == UNREACHED;
                let instances = self.counted(seq, n, missing == 1 || after_failure);
                if self.heard.swap(REACHED, Ordering::Relaxed) != REACHED {
                    tracing::info!(instances, "shared store reached");
                }
                return Some(n);
            }
            Ok(Err(e)) => {
                let left = self.config.timeout.saturating_sub(started.elapsed());
                match self.seeds_refusal(&e, left).await {
                    Some((error, check)) => self.unreached(&error, Some(check)),
                    None => self.unreached(&e, setting_to_check(&e)),
                }
                if !cured_by_reconnecting(&e) {
                    return None;
                }
                if e.is_unrecoverable_error() {
                    // The connection is gone, and one server's link is opening the
                    // next already (a cluster's client alike): a renew would drop
                    // that one.
                    self.conn.suspect(&self.instances_key);
                    return None;
                }
            }
            Err(_) => {
                self.unreached(
                    &format_args!("no answer within {:?}", self.config.timeout),
                    None,
                );
            }
        }
        self.conn.renew();
        self.conn.suspect(&self.instances_key);
        None
    }

    /// On a cluster, whose client answers `ClusterConnectionNotFound` where every seed
    /// node refused it (a wrong password among them): a seed's refusal of a connection
    /// of its own that names a setting ([`setting_to_check`]), with the seed's address
    /// (not its URL, which may hold the password), for the heartbeat's warning. Tried
    /// only when that warning is due (the last beat did not fail) and `error` names no
    /// setting itself: one connection per seed, all at once, each closed again, and
    /// all given up `within` (what is left of the beat's `timeout`, so that the beat,
    /// and a leave waiting for it, stays within its bound); the first refusal to come
    /// is taken.
    async fn seeds_refusal(
        &self,
        error: &redis::RedisError,
        within: Duration,
    ) -> Option<(String, &'static str)> {
        let RedisServers::Cluster(seeds) = &self.config.servers else {
            return None;
        };
        if self.heard.load(Ordering::Relaxed) == UNREACHED || setting_to_check(error).is_some() {
            return None;
        }
        let mut asked = tokio::task::JoinSet::new();
        for seed in seeds {
            let Ok(client) = redis::Client::open(seed.as_str()) else {
                continue;
            };
            asked.spawn(async move {
                let tried = tokio::time::timeout(within, async {
                    let mut c = client.get_multiplexed_async_connection().await?;
                    redis::cmd("PING").query_async::<()>(&mut c).await
                })
                .await;
                let e = tried.ok()?.err()?;
                let check = setting_to_check(&e)?;
                let at = client.get_connection_info().addr();
                Some((format!("seed node {at}: {e}"), check))
            });
        }
        // Dropped at the first refusal, the set aborts the seeds still asked.
        while let Some(answer) = asked.join_next().await {
            if let Ok(Some((seed, check))) = answer {
                return Some((format!("{error}; {seed}"), check));
            }
        }
        None
    }

    /// A heartbeat failed: logged as a warning if the last one did not fail too, with
    /// the setting to `check` where the error names one ([`setting_to_check`]).
    fn unreached(&self, error: &dyn std::fmt::Display, check: Option<&str>) {
        if self.heard.swap(UNREACHED, Ordering::Relaxed) != UNREACHED {
            tracing::warn!(
                error = %error,
                check,
                fail_mode = %self.config.fail_mode.as_str(),
                "shared store unreachable: a decision that Redis does not answer follows fail_mode"
            );
        } else {
            tracing::debug!(error = %error, "heartbeat failed");
        }
    }
}

/// Whether a heartbeat's error may go with a new connection, which then replaces the
/// one that answered it, as a dark one is replaced: the client reconnects on I/O errors
/// alone, and would keep answering `READONLY` from a master demoted behind the same
/// address, or the error of a setup refused once (an `AUTH`, a `SELECT`), for good.
/// Only what Redis answers any connection alike (`OOM`, `NOPERM`: the user's rights
/// apply to open connections too, `BUSY`) leaves the connection be: a new one per beat
/// would cure nothing. Anything else may be cured, `ERR` included: Redis before 7.0
/// wraps a script's error (`READONLY` among them) in an `ERR`, and redis-rs reports a
/// refused `SELECT` as one (and an ACL refusal inside a script, which Redis 7.0 words
/// as `ERR` too, costs a new connection per beat).
fn cured_by_reconnecting(e: &redis::RedisError) -> bool {
    !matches!(e.code(), Some("OOM" | "NOPERM" | "BUSY"))
}

/// The setting an error of Redis's points at, for the warning that says it: Redis
/// refused the credentials (`AUTH` refused, `WRONGPASS`, `NOAUTH`) or the rights
/// (`NOPERM`, or a script's command refused, which Redis 7.0 words as an `ERR`) that
/// the store's URL gives. `None` for an error no setting of the store
/// explains (Redis away, slow, out of memory, a replica).
fn setting_to_check(e: &redis::RedisError) -> Option<&'static str> {
    if e.kind() == ErrorKind::AuthenticationFailed {
        return Some(CHECK_CREDENTIALS);
    }
    // Redis 7.0 words an ACL refusal inside a script as an `ERR`.
    let refused_in_script = e
        .detail()
        .is_some_and(|d| d.starts_with("The user executing the script can't"));
    match e.code() {
        Some("WRONGPASS" | "NOAUTH") => Some(CHECK_CREDENTIALS),
        Some("NOPERM") => Some(CHECK_RIGHTS),
        _ if refused_in_script => Some(CHECK_RIGHTS),
        _ => None,
    }
}

/// [`setting_to_check`] for refused rights.
const CHECK_RIGHTS: &str = "the ACL rights of the user in [store] url (or cluster_nodes): the \
     scripts (EVALSHA, EVAL, and the commands they run), SETRANGE and ZREM on the keys \
     {<key_prefix>}:instances and {<key_prefix>:<route>}:*, and on a cluster PING and \
     CLUSTER SLOTS";

/// Why a route's calls failed, as the lines of its fall say it.
struct Why<'a> {
    error: &'a dyn std::fmt::Display,
    /// [`setting_to_check`].
    check: Option<&'a str>,
}

/// [`setting_to_check`] for refused credentials.
const CHECK_CREDENTIALS: &str = "the user and password in [store] url (or cluster_nodes)";

/// Sets `rocgate_store_mode`: 1 for `mode`, 0 for the others.
fn publish_mode(mode: StoreMode) {
    for m in [StoreMode::Shared, StoreMode::Fallback] {
        let on = if m == mode { 1.0 } else { 0.0 };
        metrics::gauge!(metric::STORE_MODE, "mode" => m.as_str()).set(on);
    }
    metrics::gauge!(metric::STORE_MODE, "mode" => "local").set(0.0);
}

/// Beats every `heartbeat` while the store lives ([`Inner::beat`]: announces the
/// instance, and probes the routes in fallback whose probe is due, so that one with
/// no traffic returns to the shared state too).
async fn heartbeat(inner: Weak<Inner>) {
    let every = match inner.upgrade() {
        Some(i) => i.config.heartbeat,
        None => return,
    };
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.left.load(Ordering::Relaxed) {
            return;
        }
        inner.beat().await;
    }
}

/// [`Inner::heard`] before the first heartbeat's answer.
const UNHEARD: u8 = 0;
/// [`Inner::heard`] after a heartbeat that Redis answered.
const REACHED: u8 = 1;
/// [`Inner::heard`] after a heartbeat that failed or timed out.
const UNREACHED: u8 = 2;

/// Beats, from one that found this instance missing from the heartbeat set, whose
/// count may raise the live count but not lower it: as many as an instance may miss
/// before it counts as gone, so every live instance has beaten into the set again.
const HELD_BEATS: u8 = 3;

/// What [`Inner::counted`] keeps between beats.
struct Count {
    /// The sequence number of the newest beat whose answer was taken in.
    applied: u64,
    /// Beats left whose count may not lower the live count.
    held: u8,
    /// What the log said of the count.
    said: CountSaid,
}

/// How often, at most, a change of the live count is logged: an instance whose beats
/// come and go (one starved of CPU, beating every third heartbeat or so) would
/// otherwise have the count said at every beat.
const COUNT_LOGGED_EVERY: Duration = Duration::from_secs(10);

/// What the log said of the live count: each change is said once, in a line at most
/// every [`COUNT_LOGGED_EVERY`]; the changes that come sooner wait for the first beat
/// answered after it, said in one line that counts them.
struct CountSaid {
    /// The count the last line said (`expected_instances` before any line).
    count: u64,
    /// When the last line was written (the store's clock); none before the first.
    at: Option<Nanos>,
    /// Changes of the count since the last line.
    unsaid: u64,
    /// Whether one of them was a fall.
    fell: bool,
}

/// A change of the live count to log.
#[derive(Debug, PartialEq, Eq)]
struct CountChange {
    /// The count the last line said (`expected_instances` before any line).
    from: u64,
    /// The count in force now.
    to: u64,
    /// The changes from one to the other (more than one where some were not said).
    changes: u64,
    /// Whether one of them was a fall (the count lower after it than before).
    fell: bool,
}

impl CountSaid {
    /// Takes in the count `n` that a beat put in force at `now`, in place of `before`:
    /// returns the line to log, if a change is not said yet and the last line was
    /// [`COUNT_LOGGED_EVERY`] ago or more (or there was none).
    fn after_beat(&mut self, before: u64, n: u64, now: Nanos) -> Option<CountChange> {
        self.unsaid += u64::from(n != before);
        self.fell |= n < before;
        let quiet = self
            .at
            .is_none_or(|at| now.saturating_since(at) >= COUNT_LOGGED_EVERY);
        if self.unsaid == 0 || !quiet {
            return None;
        }
        self.at = Some(now);
        let from = std::mem::replace(&mut self.count, n);
        Some(CountChange {
            from,
            to: n,
            changes: std::mem::take(&mut self.unsaid),
            fell: std::mem::take(&mut self.fell),
        })
    }
}

impl CountChange {
    /// Logs the change: at `WARN` if one of its changes was a fall (an instance gone,
    /// whether it left or died: this one cannot tell), even where the count ends
    /// higher or back where it was (others came meanwhile); else, a rise, at `INFO`.
    fn log(&self) {
        let Self {
            from,
            to,
            changes,
            fell,
        } = *self;
        let share = format_args!("1/{to}");
        if fell {
            tracing::warn!(from, to, changes, %share, "{COUNT_CHANGED}");
        } else {
            tracing::info!(from, to, changes, %share, "{COUNT_CHANGED}");
        }
    }
}

/// The message of [`CountChange::log`].
const COUNT_CHANGED: &str = "live instance count changed: this instance's share of each shared \
     limit is now `share` (of a distributed route's in batched mode while Redis answers, and in \
     fallback with fail_mode = \"local\"; of a partitioned route's route_limit)";

/// The fleet's demand that the answers on a route gave (their `rate`), gathered for the
/// tuning hints until [`RedisStore::take_fleet_demand`] takes it. Each answer's rate
/// stands until the next answer (or the take), so the mean is over time: in exact
/// mode answers come one per decision, and a mean over answers would weigh the busy
/// stretches of this instance's traffic more. A call that Redis does not answer ends
/// the last rate's stand ([`stop`](Self::stop)): while Redis is away the fleet's
/// demand is not measured, and the seconds measured ([`FleetDemand::measured_s`])
/// leave that stretch out.
#[derive(Debug, Default)]
struct DemandSeen {
    /// The answers' rates, req/s, each times the seconds it stood.
    weighted: f64,
    /// The seconds those rates stood.
    stood: f64,
    /// The last answer's rate while it stands, and when (this instance's clock) it
    /// came.
    standing: Option<(f64, Nanos)>,
    /// The last answer's rate, standing or not; `None` before any.
    last: Option<f64>,
    peak: f64,
}

impl DemandSeen {
    /// An answer at `now` gave `rate`.
    fn add(&mut self, rate: f64, now: Nanos) {
        self.stand_until(now);
        self.standing = Some((rate, now));
        self.last = Some(rate);
        self.peak = self.peak.max(rate);
    }

    /// A call at `now` was not answered: the last rate stands no longer.
    fn stop(&mut self, now: Nanos) {
        self.stand_until(now);
        self.standing = None;
    }

    /// The last answer's rate has stood until `now` (an answer that came with an
    /// earlier `now` than the last, its call made before, stands for none).
    fn stand_until(&mut self, now: Nanos) {
        if let Some((rate, at)) = self.standing {
            let stood = now.saturating_since(at).as_secs_f64();
            self.weighted += rate * stood;
            self.stood += stood;
            self.standing = Some((rate, now.max(at)));
        }
    }

    /// The mean over time until `now`, the peak of what the answers gave and the
    /// seconds measured, and none gathered from then; `None` if none gave one.
    fn take(&mut self, now: Nanos) -> Option<FleetDemand> {
        let mut seen = std::mem::take(self);
        let last = seen.last?;
        seen.stand_until(now);
        let mean_rps = if seen.stood > 0.0 {
            seen.weighted / seen.stood
        } else {
            last
        };
        Some(FleetDemand::new(mean_rps, seen.peak, seen.stood))
    }
}

/// What [`DECIDE`] answered.
struct Reply {
    admit: bool,
    wait_us: u64,
    limit: f64,
    state: u8,
    now_us: u64,
    slot: u64,
    roc: f64,
    /// The fleet's demand the last stored step stepped on, req/s (NaN if none stored).
    rate: f64,
    /// Whether Redis held no controller step for the route (no `roc` stored): a route
    /// no instance has stepped yet, or one whose state Redis lost (restarted empty,
    /// flushed, or its keys evicted or expired).
    afresh: bool,
    /// Whether this call wrote its [`Seed`] into a controller hash that held no step.
    seeded: bool,
    /// Of a controller carried over and not stepped since: when (Redis's clock, µs)
    /// the view it was carried from was answered, the time of what this answer tells.
    carried_view_us: Option<u64>,
    /// The shared bucket's level after the call (when it took a token).
    tokens: Option<f64>,
    roll: Option<Roll>,
    /// The controller's memory, when it is not normal and the call was refused or
    /// took no token.
    memory: Option<StoredController>,
}

/// The completed slots a rollover hands to its winner.
struct Roll {
    lo: i64,
    counts: Vec<u64>,
    memory: StoredController,
}

/// The controller hash as read by [`DECIDE`].
#[derive(Debug, Default, PartialEq)]
struct StoredController {
    through: Option<u64>,
    memory: Option<ControllerMemory>,
    /// `raise`: the slot stepped through when it was projected, and when (Redis
    /// time) the limit next rises if the last slot's demand holds (`None`: it does
    /// not rise).
    held: Option<(u64, Option<Nanos>)>,
}

impl Reply {
    fn parse(value: Value) -> Option<Reply> {
        let Value::Array(items) = value else {
            return None;
        };
        let mut items = items.into_iter();
        let mut next = || items.next();
        let admit = int(&next()?)? == 1;
        let wait_us = u64::try_from(int(&next()?)?).ok()?;
        let limit = float(&next()?)?;
        let state = u8::try_from(int(&next()?)?).ok()?;
        let now_us = u64::try_from(int(&next()?)?).ok()?;
        let slot = u64::try_from(int(&next()?)?).ok()?;
        // Every stored step writes `roc`: without one, the controller starts afresh.
        let roc = next();
        let afresh = matches!(roc, None | Some(Value::Nil));
        let roc = roc.as_ref().and_then(float).unwrap_or(0.0);
        let tokens = next().as_ref().and_then(float);
        let roll = match next() {
            Some(Value::Array(roll)) => Some(Roll::parse(roll)?),
            _ => None,
        };
        let rate = next()
            .as_ref()
            .and_then(float)
            .filter(|r| r.is_finite() && *r >= 0.0)
            .unwrap_or(f64::NAN);
        let memory = match next() {
            Some(Value::Array(ctl)) => Some(StoredController::parse(&ctl)),
            _ => None,
        };
        let seeded = next().as_ref().and_then(int) == Some(1);
        let carried_view_us = next()
            .as_ref()
            .and_then(int)
            .and_then(|v| u64::try_from(v).ok());
        (limit.is_finite() && limit > 0.0).then_some(Reply {
            admit,
            wait_us,
            limit,
            state,
            now_us,
            slot,
            roc,
            rate,
            afresh,
            seeded,
            carried_view_us,
            tokens,
            roll,
            memory,
        })
    }
}

impl Roll {
    /// The count of slot `i`: 0 for a slot the roll does not hold (before `lo`, or
    /// after the last slot that had a call).
    fn count(&self, i: u64) -> u64 {
        let at = (i as i64).saturating_sub(self.lo);
        usize::try_from(at)
            .ok()
            .and_then(|k| self.counts.get(k).copied())
            .unwrap_or(0)
    }

    fn parse(items: Vec<Value>) -> Option<Roll> {
        let [lo, Value::Array(counts), Value::Array(ctl)] = <[Value; 3]>::try_from(items).ok()?
        else {
            return None;
        };
        let lo = int(&lo)?;
        let counts = counts
            .iter()
            .map(|c| int(c).and_then(|n| u64::try_from(n).ok()))
            .collect::<Option<Vec<_>>>()?;
        Some(Roll {
            lo,
            counts,
            memory: StoredController::parse(&ctl),
        })
    }
}

impl StoredController {
    /// Fields `limit, state, through, entered, armed, safe, roc`, and `raise` (the
    /// 13th: `<through>:<ns>`, the time empty for none); anything missing or
    /// unreadable, a limit that is no number of at least [`MIN_LIMIT`] included (as
    /// [`DECIDE`] reads it), means no memory (the controller starts afresh).
    fn parse(ctl: &[Value]) -> StoredController {
        let field = |i: usize| ctl.get(i).and_then(float);
        // Times are ns since the Unix epoch, past 2^53: read whole, not as floats.
        let time = |i: usize| ctl.get(i).and_then(whole).map(Nanos::new);
        let through = field(2).map(|t| t as u64);
        let memory = (|| {
            Some(ControllerMemory {
                limit_rps: field(0).filter(|l| l.is_finite() && *l >= MIN_LIMIT)?,
                state: match field(1)? {
                    0.0 => ControllerState::Normal,
                    1.0 => ControllerState::Cut,
                    2.0 => ControllerState::Recovering,
                    _ => return None,
                },
                entered_at: time(3)?,
                armed_at: time(4)?,
                safe_since: time(5),
                last_roc: field(6).unwrap_or(0.0),
            })
        })();
        let held = match ctl.get(12) {
            Some(Value::BulkString(b)) => std::str::from_utf8(b).ok().and_then(|text| {
                let (at, raise) = text.split_once(':')?;
                let raise = match raise {
                    "" => None,
                    ns => Some(Nanos::new(ns.parse().ok()?)),
                };
                Some((at.parse().ok()?, raise))
            }),
            _ => None,
        };
        StoredController {
            through,
            memory,
            held,
        }
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A count that may pass 2^53: an integer reply or whole digits, exactly; else a
/// float's whole part.
fn whole(v: &Value) -> Option<u64> {
    match v {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(b) => {
            let text = std::str::from_utf8(b).ok()?;
            text.parse()
                .ok()
                .or_else(|| text.parse::<f64>().ok().map(|f| f as u64))
        }
        other => float(other).map(|f| f as u64),
    }
}

fn float(v: &Value) -> Option<f64> {
    match v {
        Value::Int(n) => Some(*n as f64),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::Double(d) => Some(*d),
        _ => None,
    }
}

/// A route's `rocgate_store_controllers_carried_total`, set at 0 if it has no
/// series yet (so that `increase` counts the first carry-over).
fn carried_counter(route: &str) -> Counter {
    let counter = metrics::counter!(metric::STORE_CARRIED, "route" => route.to_string());
    counter.increment(0);
    counter
}

fn state_of(index: u8) -> ControllerState {
    match index {
        1 => ControllerState::Cut,
        2 => ControllerState::Recovering,
        _ => ControllerState::Normal,
    }
}

/// The longest `heartbeat` taken, as the file's longest period: a beat counts three.
const LONGEST_HEARTBEAT: Duration = Duration::from_secs(365 * 24 * 3600);

fn ttl_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The TCP settings of every connection to Redis: keepalive probes after `timeout`
/// idle (at least 1 s: the kernel counts them in whole seconds), then one every as
/// long, and on Linux a user timeout of four times that (with the default `timeout`,
/// 4 s): a connection whose peer answers no probe, or acknowledges nothing sent for
/// that long, is closed by the kernel and the client reconnects. A peer that vanished
/// without a word (a host powered off, a NAT or load balancer that dropped the flow)
/// would otherwise hold a connection open for two hours idle, or about 15 minutes of
/// retransmissions. A Redis that is merely stopped or slow is unaffected: its kernel
/// still acknowledges.
fn tcp_settings(timeout: Duration) -> TcpSettings {
    // Linux refuses a keepalive time over 32767 s (and rounds none up).
    let whole_secs = timeout
        .as_secs()
        .saturating_add(u64::from(timeout.subsec_nanos() > 0));
    let probe = Duration::from_secs(whole_secs.clamp(1, 32_767));
    let keepalive = TcpKeepalive::new().with_time(probe);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "macos"))]
    let keepalive = keepalive.with_interval(probe).with_retries(3);
    let settings = TcpSettings::default().set_keepalive(keepalive);
    #[cfg(any(target_os = "linux", target_os = "android"))]
    let settings = settings.set_user_timeout(probe.saturating_mul(4));
    settings
}

/// A random instance id: the process id and 64 random bits.
fn random_id() -> String {
    format!("rocgate-{}-{:016x}", std::process::id(), random_bits())
}

/// 64 random bits (from the standard library's per-map random keys).
fn random_bits() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// Batched mode: adds a slot's arrivals to the shared window and learns the shared
/// limit back, then, at the slot's end, those that came after, unless a decision of
/// the next slot sends them ([`flush`]). A call that fails drops its arrivals, and
/// marks the route `missed`, for the next call to say that the window missed some.
async fn sync(
    inner: Arc<Inner>,
    r: Arc<SharedRoute>,
    arrivals: u64,
    schedule: Arc<Schedule>,
    params: ControllerParams,
    slot: u64,
) {
    let send = |arrivals| {
        let (inner, r, schedule, params) = (&inner, &r, &schedule, &params);
        async move {
            let sent = inner.clock.now();
            match inner.call(r, arrivals, false, 0, params).await {
                Some(reply) => {
                    let answered = inner.clock.now();
                    r.learn_phase(reply.now_us, sent, answered);
                    inner.absorb(r, reply, schedule, answered);
                }
                None => r.miss(),
            }
        }
    };
    send(arrivals).await;
    if let Some(more) = flush(&inner, &r, slot).await {
        send(more).await;
    }
}

/// A future that, dropped before it is done, is finished on a task of its own: where
/// what it does matters beyond its caller's answer. Costs a box, and a task only when
/// dropped early (a task for every call added about 7% to an exact decision's median
/// on loopback, 92.7 → 99.7 µs in `cargo bench --bench store`; the box is within the
/// noise).
/// The runtime it finishes on is the one current when it was made (it may be
/// dropped where none is).
struct RunsToEnd<T: Send + 'static, F: Future<Output = Option<T>> + Send + 'static>(
    Option<Pin<Box<F>>>,
    Option<tokio::runtime::Handle>,
);

impl<T: Send + 'static, F: Future<Output = Option<T>> + Send + 'static> RunsToEnd<T, F> {
    fn new(future: F) -> Self {
        RunsToEnd(
            Some(Box::pin(future)),
            tokio::runtime::Handle::try_current().ok(),
        )
    }
}

impl<T: Send + 'static, F: Future<Output = Option<T>> + Send + 'static> Future for RunsToEnd<T, F> {
    type Output = Option<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let Some(future) = self.0.as_mut() else {
            return Poll::Ready(None);
        };
        let done = future.as_mut().poll(cx);
        if done.is_ready() {
            self.0 = None;
        }
        done
    }
}

impl<T: Send + 'static, F: Future<Output = Option<T>> + Send + 'static> Drop for RunsToEnd<T, F> {
    fn drop(&mut self) {
        if let (Some(future), Some(runtime)) = (self.0.take(), self.1.take()) {
            runtime.spawn(future);
        }
    }
}

/// Batched mode, after the sync of `slot`: waits for the slot's end, and takes the
/// arrivals counted since that sync if no decision of a later slot has sent them by
/// then (an instance whose traffic pauses held them until its next request, however
/// late, and a burst reached the shared window only then, as a false spike). The slot
/// that follows is still opened, and synced under the parameters then in force, by its
/// first decision. `None` if there is nothing to send, a decision sent it, the breaker
/// skips the call (its arrivals are dropped, as a decision's are, and the route marked
/// `missed`), the store dropped the route or the instance left, or the sync slot has
/// not ended by the clock (a manual one that has not moved on, or sync slots an answer
/// moved later meanwhile: the next decision sends them).
async fn flush(inner: &Inner, r: &SharedRoute, slot: u64) -> Option<u64> {
    let end = slot.saturating_add(1).saturating_mul(r.slot_ns());
    let at = inner.clock.now();
    let wait = end.saturating_sub(
        at.as_u64()
            .saturating_add(r.sync_shift.load(Ordering::Relaxed)),
    );
    tokio::time::sleep(Duration::from_nanos(wait)).await;
    let now = inner.clock.now();
    if r.sync_slot(now) <= slot
        || r.synced_slot.load(Ordering::Relaxed) != slot
        || r.retired.load(Ordering::Relaxed)
        || inner.left.load(Ordering::Relaxed)
        || r.pending.load(Ordering::Relaxed) == 0
    {
        return None;
    }
    let arrivals = r.pending.swap(0, Ordering::Relaxed);
    let sent = r.breaker().call(now) != Call::Skip;
    if !sent {
        r.miss();
    }
    sent.then_some(arrivals)
}

/// What [`SharedRoute::sync_slot`] adds to an instance's clock (ns, under `slot_ns`) for
/// its slots of `slot_ns` to begin halfway through Redis's, where Redis's clock read
/// `redis_ns` at the instance's `local_ns`.
fn sync_shift(slot_ns: u64, redis_ns: u64, local_ns: u64) -> u64 {
    // Redis's clock is the instance's plus `ahead` (modulo a slot); a sync slot
    // begins at local time t where t + shift ≡ 0 and t + ahead ≡ slot_ns / 2.
    let ahead = (redis_ns % slot_ns + slot_ns - local_ns % slot_ns) % slot_ns;
    (ahead + slot_ns - slot_ns / 2) % slot_ns
}

/// Steps the controller over the slots the rollover completed, under `schedule` (on
/// Redis's clock), and stores the result.
async fn step(
    inner: Arc<Inner>,
    r: Arc<SharedRoute>,
    schedule: Schedule,
    slot: u64,
    now_us: u64,
    roll: Roll,
) {
    let now = Nanos::new(now_us.saturating_mul(1000));
    let Some((controller, through, transitions, in_cut, rate)) =
        replay(&schedule, &r.window, &roll, slot, now)
    else {
        return;
    };
    let m = controller.memory();
    let nanos = |n: Nanos| n.as_u64().to_string();
    let raise = held_raise(&schedule, &r.window, &roll, (&controller, through), now);
    let mut invocation = inner.save.call(&[&r.keys[2]]);
    invocation
        .arg(
            roll.memory
                .through
                .map_or_else(String::new, |t| t.to_string()),
        )
        .arg(through)
        .arg(format!("{:?}", m.limit_rps))
        .arg(m.state.as_index())
        .arg(nanos(m.entered_at))
        .arg(nanos(m.armed_at))
        .arg(m.safe_since.map_or_else(String::new, nanos))
        .arg(format!("{:?}", m.last_roc))
        .arg(r.ttl_ms)
        .arg(r.slot_us)
        .arg(r.window.slots())
        .arg(format!("{rate:?}"))
        .arg(format!(
            "{through}:{}",
            raise.map_or_else(String::new, nanos)
        ));
    match tokio::time::timeout(inner.config.timeout, inner.conn.invoke::<i64>(&invocation)).await {
        // Stored: no other instance stores these slots' steps, so counting and logging
        // here counts and logs each transition once in the fleet.
        Ok(Ok(1)) => {
            r.note_entered(&m);
            let mut stepped = r.stepped.lock().unwrap_or_else(PoisonError::into_inner);
            stepped.time_in_cut += in_cut;
            for (t, _) in &transitions {
                stepped.count(t);
                tracing::info!(
                    route = r.name.as_ref(),
                    from = t.from.as_str(),
                    to = t.to.as_str(),
                    roc = t.roc,
                    limit_rps = t.limit_rps,
                    "shared controller transition"
                );
            }
        }
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            inner.errors.increment(1);
            tracing::debug!(error = %e, "storing a controller step failed");
        }
        Err(_) => inner.timeouts.increment(1),
    }
}

/// Transitions, each with when the state it left was entered.
type Entered = Vec<(Transition, Nanos)>;

/// What [`replay`] gives: the controller, the slot stepped through, the transitions,
/// the time in cut and the fleet's demand.
type Replayed = (Controller, u64, Entered, Duration, f64);

/// The controller after observing every slot from the one after `through` up to
/// `slot - 1`, the new `through`, the transitions on the way, each with when the
/// state it left was entered, the time it spent in cut over the slots stepped
/// (from the end of the stored `through`, or now without one, to the end of the new
/// one): each step is stored by one instance, so the fleet's instances together count
/// every slot's time in cut once, as it passes, not at the cut's end; and the fleet's
/// demand, req/s, in the later half of the window of the last slot observed (what
/// [`SAVE`] stores as `rate`). `None` if there is nothing to observe. Times are
/// Redis's, in ns.
///
/// Of the slots up to the last that had a call (the end of the roll's counts), at most
/// the last window's are stepped. The silent slots after it are stepped as the engine
/// steps a silence longer than the window: each until the window reads all zero, then
/// only the last, when the controller catches up on that reading's time (a cut's calm
/// counts from its first calm slot, not from one window before now); and, if they came
/// in between, the slots where the controller was armed, a scheduled event started or
/// ended, or a cut ran out by the clock ([`Controller::next_stop`]).
///
/// Each slot is stepped under the profile of `schedule` (on Redis's clock) due at its
/// end, put in force before the step as the engine puts it in force for a local
/// route; the stored controller is continued under the profile due when it was last
/// stepped.
fn replay(
    schedule: &Schedule,
    window: &WindowSpec,
    roll: &Roll,
    slot: u64,
    now: Nanos,
) -> Option<Replayed> {
    let last = slot.checked_sub(1)?;
    let slots = window.slots() as u64;
    let half = slots / 2;
    // No slot from here on had a call.
    let called = u64::try_from(roll.lo.saturating_add(roll.counts.len() as i64)).unwrap_or(0);
    let first = match roll.memory.through {
        Some(t) => t
            .saturating_add(1)
            .max(called.min(slot).saturating_sub(slots)),
        None => last,
    };
    if first > last {
        return None;
    }
    let slot_ns = window.slot().as_micros() as u64 * 1000;
    let stepped_at = stepped_at(window, &roll.memory, now);
    let mut active = schedule.event_at(stepped_at);
    let params = schedule.params_at(stepped_at).clone();
    let mut controller = resume(params, window, &roll.memory, now);
    let count = |i: u64| roll.count(i);
    let half_secs = window.half().as_secs_f64();
    let mut transitions = Vec::new();
    // Since when the controller has been in cut within the slots stepped, if it is.
    let mut cut_since = (controller.state() == ControllerState::Cut)
        .then(|| stepped_at.max(controller.entered_at()));
    let mut in_cut = Duration::ZERO;
    let mut rate = f64::NAN;
    let mut observe = |controller: &mut Controller, s: u64| {
        let start = (s + 1).saturating_sub(slots);
        // Saturating: the counts are Redis's, any up to i64::MAX.
        let n_prev = (start..start + half)
            .map(count)
            .fold(0, u64::saturating_add);
        let n_recent = (start + half..=s).map(count).fold(0, u64::saturating_add);
        let rate_prev_rps = n_prev as f64 / half_secs;
        let rate_recent_rps = n_recent as f64 / half_secs;
        rate = rate_recent_rps;
        let sample = RocSample {
            n_prev,
            n_recent,
            rate_prev_rps,
            rate_recent_rps,
            roc: rate_recent_rps - rate_prev_rps,
        };
        let at = Nanos::new((s + 1).saturating_mul(slot_ns));
        let mut record = |t: Transition, entered: Nanos| {
            if let Some(since) = cut_since.take() {
                in_cut += t.at.saturating_since(since);
            }
            if t.to == ControllerState::Cut {
                cut_since = Some(t.at);
            }
            transitions.push((t, entered));
        };
        let entered = controller.entered_at();
        schedule.follow(&mut active, controller, at, |t| record(t, entered));
        let entered = controller.entered_at();
        controller.observe(SampleAt { at, sample }, |t| record(t, entered));
    };
    // The first slot whose window holds no call: it and every later one read zero.
    let quiet = called.saturating_add(slots).saturating_sub(1);
    let each_until = last.min(quiet.max(first));
    for s in first..=each_until {
        observe(&mut controller, s);
    }
    if each_until < last {
        let end = |s: u64| Nanos::new((s + 1).saturating_mul(slot_ns));
        let mut after = end(each_until);
        while let Some(stop) =
            controller.next_stop(schedule.edges(), after, end(last), slot_ns.max(1))
        {
            observe(&mut controller, stop.as_u64() / slot_ns.max(1) - 1);
            after = stop;
        }
        observe(&mut controller, last);
    }
    if let Some(since) = cut_since {
        in_cut += Nanos::new((last + 1).saturating_mul(slot_ns)).saturating_since(since);
    }
    Some((controller, last, transitions, in_cut, rate))
}

/// When the stored controller was last stepped to, as of Redis's `now`: the end of the
/// slot it last stepped (as of now, a restore that reaches base in the slots still to
/// step would end before they are stepped, unreported and dated now), or now without
/// one.
fn stepped_at(window: &WindowSpec, stored: &StoredController, now: Nanos) -> Nanos {
    let slot_ns = window.slot().as_micros() as u64 * 1000;
    stored.through.map_or(now, |t| {
        Nanos::new(t.saturating_add(1).saturating_mul(slot_ns)).min(now)
    })
}

/// The stored controller continued under `params` at Redis's `now`, as the next step
/// continues it (a new one without a memory).
fn resume(
    params: ControllerParams,
    window: &WindowSpec,
    stored: &StoredController,
    now: Nanos,
) -> Controller {
    let Some(m) = stored.memory else {
        return Controller::new(params, now, window.window());
    };
    // Times stored under a clock ahead of Redis's now (it went back) would hold the
    // controller in its state, and unarmed, until the clock caught up.
    let m = ControllerMemory {
        entered_at: m.entered_at.min(now),
        armed_at: m.armed_at.min(now + window.window()),
        safe_since: m.safe_since.map(|t| t.min(now)),
        ..m
    };
    let mut c = Controller::from_memory(params, m, stepped_at(window, stored, now));
    // Stepped before, but not in this window: its slot or length changed.
    if stored.through.is_none() {
        c.rearm(now, window.window());
    }
    c
}

/// When (Redis's clock) `controller`, stepped through slot `through` under `schedule`
/// (on Redis's clock) on the counts of `roll`, next raises the limit above where it
/// stands if the demand of slot `through` holds: [`Schedule::next_raise_held`] on
/// the window's readings to come, as [`Engine::restore_eta`] tells it of a local
/// route, its window the window of slots that ends at `through` (those after the last
/// that had a call count zero). Taken where the step is taken, off the decision's
/// path, and stored with it (`raise`, see [`DECIDE`]): at most
/// [`HELD_READINGS`](crate::controller::HELD_READINGS) readings, as the engine's.
/// `None` in `Normal`, without building the window: the limit is where it rises to.
fn held_raise(
    schedule: &Schedule,
    window: &WindowSpec,
    roll: &Roll,
    (controller, through): (&Controller, u64),
    now: Nanos,
) -> Option<Nanos> {
    if controller.state() == ControllerState::Normal {
        return None;
    }
    let slots = window.slots() as u64;
    let slot_ns = window.slot().as_micros() as u64 * 1000;
    let stepped = Nanos::new(through.saturating_add(1).saturating_mul(slot_ns));
    let first = through.saturating_add(1).saturating_sub(slots);
    let ring = SlotRing::from_counts(window, (first..=through).map(|i| roll.count(i)));
    let active = schedule.event_at(stepped);
    schedule.next_raise_held((active, controller), ring.held(), (stepped, now), window)
}

/// How long after Redis's `now_us`, in slot `slot`, the stored controller will next
/// raise the limit if the last slot's demand holds, as the instance that stepped it
/// projected it ([`held_raise`]): `Some(None)` if it does not rise. `None` where no
/// projection fits the stored step (a step stored by an older release, or dropped
/// with `through`), or where that step is not of one of the two slots before `slot`
/// (the step of the slot just completed may still be on its way): after a silence
/// no step has covered yet, the held level of the slot before it is no longer what
/// the window holds, and [`next_raise`] tells the raise instead.
fn held_eta(stored: &StoredController, slot: u64, now_us: u64) -> Option<Option<Duration>> {
    stored.memory?;
    let through = stored.through?;
    let (at, raise) = stored.held?;
    if at != through || through.saturating_add(2) < slot {
        return None;
    }
    let now = Nanos::new(now_us.saturating_mul(1000));
    Some(raise.map(|at| at.saturating_since(now)))
}

/// How long after Redis's `now_us` the stored controller will next raise the limit
/// above where it stands, where no projection of the held spike fits the answer
/// ([`held_eta`]): as [`Engine::restore_eta`] tells it of a local route, but for the
/// window's readings, the calm of a cut not yet calm taken a window after the cut
/// ([`Controller::next_raise_at`]): the controller continued, as the next step
/// continues it, under the profile of `schedule` (on Redis's clock) due when it was
/// last stepped, then walked through the events due before the raise
/// ([`Schedule::next_raise`]), the slots not yet stepped included. `None` without a memory, in `Normal`, or if the limit never
/// rises above where it stands.
fn next_raise(
    schedule: &Schedule,
    window: &WindowSpec,
    stored: &StoredController,
    now_us: u64,
) -> Option<Duration> {
    stored.memory?;
    let now = Nanos::new(now_us.saturating_mul(1000));
    let stepped = stepped_at(window, stored, now);
    let c = resume(schedule.params_at(stepped).clone(), window, stored, now);
    let at = schedule.next_raise(schedule.event_at(stepped), &c, stepped, now, window)?;
    Some(at.saturating_since(now))
}

/// A [`SharedRoute::fallback_limit`] that is no share's: the fallback bucket's last
/// change is still to be made.
const SHARE_UNSET: u64 = u64::MAX;

/// Sets the fallback `bucket` to `share` at `now` if `set_to` (the share it was last
/// set to, f64 bits) says otherwise, without waiting: a change that finds its
/// bucket's note taken by another bucket's change (see `limiter::gcra`) is left
/// behind, `set_to` saying [`SHARE_UNSET`], for the next call, and this call's
/// decision is made at the share the bucket has.
fn set_share(bucket: &TokenBucket, set_to: &AtomicU64, share: f64, now: Nanos) {
    let bits = share.to_bits();
    if claim_share(set_to, bits) {
        make_share(bucket, set_to, bits, now);
    }
}

/// Records the share `bits` in `set_to`: whether it said another, so that the bucket's
/// change ([`make_share`]) falls to this call.
fn claim_share(set_to: &AtomicU64, bits: u64) -> bool {
    set_to.load(Ordering::Relaxed) != bits && set_to.swap(bits, Ordering::Relaxed) != bits
}

/// Sets `bucket` to the share `bits` that this call recorded in `set_to`
/// ([`claim_share`]), without waiting: a change that finds the note taken marks
/// `set_to` [`SHARE_UNSET`] unless another share was recorded meanwhile.
///
/// Then, if `set_to` says another share, sets that one too, until it stays: two calls
/// may record their shares in one order and change the bucket in the other, and the
/// share recorded last, which every later call finds recorded and leaves alone, must
/// be the one the bucket keeps. A call whose change comes after another's took the
/// note that one gave back, so it reads `set_to` as that one recorded it or later.
fn make_share(bucket: &TokenBucket, set_to: &AtomicU64, mut bits: u64, now: Nanos) {
    loop {
        if !bucket.try_set_limit(f64::from_bits(bits), now) {
            let _ =
                set_to.compare_exchange(bits, SHARE_UNSET, Ordering::Relaxed, Ordering::Relaxed);
            return;
        }
        match set_to.load(Ordering::Relaxed) {
            last if last == bits || last == SHARE_UNSET => return,
            last => bits = last,
        }
    }
}

#[cfg(test)]
mod tests;
