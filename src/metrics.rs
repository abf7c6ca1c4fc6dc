//! Metrics: every number an operator watches, named by Prometheus conventions and
//! recorded through the [`metrics`] facade, so any recorder can collect them.
//!
//! Requests are not recorded one by one: the engine already counts them with its own
//! atomics, so the hot path pays nothing for metrics. A [`Collector`] reads the
//! engine's snapshots and sets counters (as absolute values) and gauges; call
//! [`Collector::collect`] just before each scrape (the admin API's `/metrics` does).
//! Only the ROC histogram is recorded as it happens, once per completed window slot
//! and route, through [`roc_sample_hook`]. In proxy mode the forwarder records the
//! upstream duration histogram and error counters.
//!
//! Labels carry values from config only (route names, reasons, states), never raw
//! paths, client addresses or keys.
//!
//! A route that is gone (removed by a reload) keeps its series in the recorder, since
//! the facade cannot delete one, but the collector sets its gauges to NaN: no reading,
//! and no alert rule firing on its last one. [`omit_blank_gauges`] then leaves them out
//! of the exposition (`rocgate serve`'s `/metrics` does), so their series end.
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `rocgate_requests_total` | counter | `route`, `decision`, `reason` | requests by decision (`admitted`, `rejected`, `shadow_rejected`: a shadow mode admitted it, so it is counted under `admitted` too) and reason (`none` when admitted) |
//! | `rocgate_demand_rps` | gauge | `route`, `half` | demand of the earlier (`prev`) and later (`recent`) half-window |
//! | `rocgate_roc` | gauge | `route`, `mode` | ROC of the last completed slot, `absolute` and `relative` |
//! | `rocgate_controller_roc` | gauge | `route` | ROC of the last completed slot in the route's `roc_mode`: what the controller compares with `danger_roc` and `safe_roc` |
//! | `rocgate_roc_observed` | histogram | `route` | every slot's ROC in the route's mode, from the end of its first window |
//! | `rocgate_limit_rps`, `rocgate_base_limit_rps`, `rocgate_cut_limit_rps` | gauge | `route` | current, base and cut limit, req/s, or requests in flight on a `concurrency` route, a key's on a partitioned one (in the shadow modes, the current limit is the controller's, not the one enforced) |
//! | `rocgate_danger_roc`, `rocgate_safe_roc` | gauge | `route` | thresholds in force |
//! | `rocgate_limiter_level`, `rocgate_limiter_capacity` | gauge | `route`, `algorithm` | tokens (or window count, requests in a leaky bucket, in flight) and its maximum (a leaky bucket's `queue + 1`); NaN and a key's capacity on a partitioned route (each key has its own limiter); a distributed route's: the shared bucket as this instance last saw it (exact mode), or this instance's bucket at its share (batched mode, fallback); NaN in fallback with `fail_mode` `open` or `closed`, where no bucket decides |
//! | `rocgate_controller_state` | gauge | `route`, `state` | 1 for the state the controller is in, 0 for the others |
//! | `rocgate_controller_transitions_total` | counter | `route`, `from`, `to` | state changes |
//! | `rocgate_cuts_total` | counter | `route` | cuts |
//! | `rocgate_cut_vs_base_total` | counter | `route`, `decision` | decisions made while a cut held that a token bucket at the base limit, started from the route's at the cut's start and fed the same requests, made the other way: `rejected`, the cut refused (`roc_cut`, in `shadow` mode would-be) and the base limit admits; `admitted`, the cut admitted and the base limit refuses. `rejected` less `admitted` is the cut's own refusals, net. Only for routes limited as a whole by a token bucket in `enforce` and `shadow` mode, and for `shadow_adaptive` routes, `rejected` only (what the cut would have refused of what the base limit admitted, its `shadow_rejected` `roc_cut`: its cut's limiter sees only those); not for partitioned routes or other algorithms in `enforce` and `shadow`, nor for routes a shared store decides |
//! | `rocgate_cut_seconds_total` | counter | `route` | time spent in `cut`, whole seconds, a cut under way counted to the collection (never taken back if its end is later dated before that) |
//! | `rocgate_rejection_ratio` | gauge | `route` | rejected ÷ offered over the last window (at least), 0 without traffic; shadow modes' would-be rejections are not in it |
//! | `rocgate_keys` | gauge | `route` | keys tracked by a partitioned route |
//! | `rocgate_route_limit_rps`, `rocgate_route_limit_tokens` | gauge | `route` | a partitioned route's limit over its keys together (`route_limit`) as enforced now (scaled by a cut as the keys' limit is; with the Redis store, this instance's share of it), and its bucket's tokens left; only for routes with one |
//! | `rocgate_route_limit_rejected_total` | counter | `route` | requests a partitioned route's `route_limit` refused (in `shadow` mode, would have), after their key's own limit admitted them: the part of `rocgate_requests_total`'s `limit` and `roc_cut` that is the keys' total, not a key's own limit; only for routes with one |
//! | `rocgate_max_keys` | gauge | `route` | keys a partitioned route tracks at most (`max_keys`; 0 for a route limited as a whole): at it, new keys share one overflow limiter |
//! | `rocgate_keys_evicted_total` | counter | `route` | keys a partitioned route evicted: idle for `idle_timeout`, or at rest while its table was full |
//! | `rocgate_key_overflow_total` | counter | `route` | requests of new keys a partitioned route decided on its one shared overflow limiter, its key table full (`rocgate_keys` may read below `max_keys` between sweeps meanwhile) |
//! | `rocgate_client_key_fallbacks_total` | counter | `route`, `reason` | requests on a route partitioned by `ip` keyed by the address right of the entry their forwarding header's walk ended at (a trusted proxy's, or the peer), as that entry names no address: `empty_entry` (empty, or a `Forwarded` element without `for=`), `malformed_entry`, `hidden_node` (`unknown`, or an obfuscated identifier); and requests from a trusted proxy without the forwarding header read at all, keyed by the proxy's address: `no_header` (the proxy's own health checks among them); every such client shares that key; in `rocgate serve`, each at 0 from the start on routes partitioned by `ip` |
//! | `rocgate_upstream_request_duration_seconds` | histogram | `route`, `status_class` | proxy: upstream time to response head (`timeout`: the `response_timeout` waited) |
//! | `rocgate_upstream_errors_total` | counter | `route`, `kind` | proxy: `connect_timeout`, `response_timeout`, `upstream_error`, `body_aborted` (the upstream failed after a good head, or sent nothing of its body for `response_timeout`: the client got a truncated body), and the request's own: `body_too_large`, `client_aborted`, `client_timeout`, `bad_request`, `transfer_coding_not_implemented`, `forwarding_loop`, and this instance's own cap: `upstream_overflow` (`max_upstream_requests` in flight, answered 503 without forwarding) |
//! | `rocgate_upstream_lanes` | gauge | | proxy: upstream connections held by client connections of their own (at most `max_upstream_lanes`) |
//! | `rocgate_in_flight_requests` | gauge | | proxy: requests being forwarded, until the upstream's response head (those under `max_upstream_requests` are counted until their response body ends or their tunnel closes) |
//! | `rocgate_upstream_requests` | gauge | | proxy: requests holding a place under `max_upstream_requests`: from forwarding until the response body ends, or the WebSocket tunnel closes |
//! | `rocgate_max_upstream_requests` | gauge | | proxy: `max_upstream_requests`, the most places there are (a restart changes it, a reload does not) |
//! | `rocgate_client_connections` | gauge | | proxy: client connections open (at most `max_connections`; the admin API's are not counted) |
//! | `rocgate_client_connection_limit_reached_total` | counter | | proxy: connections accepted while every one of `max_connections` was taken: each waited for a place, idle ones closed to make room |
//! | `rocgate_client_connections_reclaimed_total` | counter | | proxy: keep-alive connections closed gracefully to make room for a connection waiting at `max_connections`: idle ones (no request in progress; a new one that has sent nothing, closed with no answer), and HTTP/1.1 ones closed after an answer that said `Connection: close` |
//! | `rocgate_admin_connections_reclaimed_total` | counter | | proxy: the admin API's keep-alive connections closed gracefully to make room for one waiting at its cap of 256 (a scraper or client pooling that many idle ones); not counted in `rocgate_client_connections_reclaimed_total`, which, as the other `rocgate_client_connections*` series, counts the proxy's clients' |
//! | `rocgate_admin_refused_total` | counter | `reason` | proxy: admin API requests refused for the bearer token they sent: `wrong_token` (compared and not the `[admin] token`: 401, or 403 with a `Host` naming another host), `too_many_guesses` (429 without being compared, their client address having sent too many wrong ones); each at 0 from the start |
//! | `rocgate_client_connections_refused_total` | counter | | proxy: connections closed as soon as accepted (or, with `proxy_protocol`, as soon as their header names their client), their client address holding `max_connections_per_client` already |
//! | `rocgate_proxy_protocol_refused_total` | counter | `reason` | proxy: connections from `proxy_protocol_from` closed for their PROXY protocol header (`proxy_protocol`): `empty` (closed, or silent through `header_read_timeout`, before a byte: a health check that connects and closes, or a balancer that sends its header only with its client's first bytes), `invalid` (none, of a version not taken, malformed, or a text one past 107 bytes), `timeout` (not whole within `header_read_timeout`); each at 0 from the start |
//! | `rocgate_lingering_connections` | gauge | | proxy: client connections being closed as lingering closes now: answered with a body left unread, or closed (idle, keep-alive, HTTP/2) with bytes waiting unread, their write half shut, reading what the client still sends (they hold a place under `max_connections`) |
//! | `rocgate_lingering_closes_total` | counter | `ended` | proxy: lingering closes by how they ended: `client_closed` (the client closed its side, or reset it: most closes that found bytes waiting end so), `lingering_timeout` (it sent nothing for that long), `lingering_time` (that long in all), `lingering_bytes` (it sent more than a lingering close reads, 64 MiB), `shutdown` |
//! | `rocgate_config_reloads_total` | counter | `result` | proxy: config reloads (SIGHUP or `POST /admin/reload`), `applied` or `refused` (the running config kept) |
//! | `rocgate_config_last_reload_successful` | gauge | | proxy: 1 if the last reload was applied (or none was asked for), 0 if it was refused |
//! | `rocgate_runtime_changes` | gauge | | proxy: routes running on a runtime change (`PUT /admin/routes/{name}`) rather than the file's parameters |
//! | `rocgate_store_mode` | gauge | `mode` | 1 for where decisions are taken: `local` (no shared store), `shared` (Redis), `fallback_local` (Redis unreachable) |
//! | `rocgate_store_errors_total` | counter | `kind` | shared-store calls that failed: `timeout`, `error` (none in local mode) |
//! | `rocgate_store_fallback_total` | counter | `route` | decisions on distributed routes taken locally because the store could not answer (at 0 from the start, in `rocgate serve`) |
//! | `rocgate_store_requests_total` | counter | `route`, `decision` | decisions on the shared state: `admitted`, `rejected`, `shadow_rejected` (each at 0 from the start, in `rocgate serve`) |
//! | `rocgate_store_controllers_carried_total` | counter | `route` | shared controllers Redis had lost (restarted empty, flushed, the route's keys evicted or expired) mid-cut that a call of this instance carried over from what it last saw, cut or recovering (at 0 from the start, in `rocgate serve`; summed over the fleet, one a loss) |
//! | `rocgate_store_limit_rps` | gauge | `route` | the shared limit, as this instance last saw it (in exact mode, this instance's base limit in force where that is lower: the limit Redis decided its last request at); in `rocgate serve`, before the instance's first decision on the route, its base limit in force, as the store starts it |
//! | `rocgate_store_roc` | gauge | `route` | ROC of the last slot the shared controller observed (the fleet's traffic, in the route's `roc_mode`), as this instance last saw it; left out (NaN) from the route's fall to fallback until Redis answers one of its decisions (or syncs) again, so also once the heartbeat's probe has put it back in `shared` before any answer |
//! | `rocgate_store_demand_rps` | gauge | `route` | the fleet's demand, req/s: every instance's arrivals in the later half of the shared window, as the shared controller last stepped on them (the slot whose ROC is `rocgate_store_roc`), as Redis's last answer to this instance gave it; left out (NaN) as `rocgate_store_roc` is, from a fall to fallback until the next answer; `rocgate_demand_rps` keeps this instance's own |
//! | `rocgate_store_instances` | gauge | | live instances, as last counted through the heartbeat |
//! | `rocgate_build_info` | gauge | `version` | always 1 |

use crate::clock::Nanos;
use crate::controller::{ControllerState, TransitionCounts};
use crate::engine::{Engine, RouteSnapshot, SampleHook, SlotReport};
use crate::limiter::{Level, Reason};
use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, Counter, Gauge, Unit,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// `rocgate_requests_total`.
pub const REQUESTS: &str = "rocgate_requests_total";
/// `rocgate_demand_rps`.
pub const DEMAND: &str = "rocgate_demand_rps";
/// `rocgate_roc`.
pub const ROC: &str = "rocgate_roc";
/// `rocgate_controller_roc`.
pub const CONTROLLER_ROC: &str = "rocgate_controller_roc";
/// `rocgate_roc_observed` (histogram).
pub const ROC_OBSERVED: &str = "rocgate_roc_observed";
/// `rocgate_limit_rps`.
pub const LIMIT: &str = "rocgate_limit_rps";
/// `rocgate_base_limit_rps`.
pub const BASE_LIMIT: &str = "rocgate_base_limit_rps";
/// `rocgate_cut_limit_rps`.
pub const CUT_LIMIT: &str = "rocgate_cut_limit_rps";
/// `rocgate_danger_roc`.
pub const DANGER_ROC: &str = "rocgate_danger_roc";
/// `rocgate_safe_roc`.
pub const SAFE_ROC: &str = "rocgate_safe_roc";
/// `rocgate_limiter_level`.
pub const LIMITER_LEVEL: &str = "rocgate_limiter_level";
/// `rocgate_limiter_capacity`.
pub const LIMITER_CAPACITY: &str = "rocgate_limiter_capacity";
/// `rocgate_controller_state`.
pub const CONTROLLER_STATE: &str = "rocgate_controller_state";
/// `rocgate_controller_transitions_total`.
pub const TRANSITIONS: &str = "rocgate_controller_transitions_total";
/// `rocgate_cuts_total`.
pub const CUTS: &str = "rocgate_cuts_total";
/// `rocgate_cut_vs_base_total`.
pub const CUT_VS_BASE: &str = "rocgate_cut_vs_base_total";
/// `rocgate_cut_seconds_total`.
pub const CUT_SECONDS: &str = "rocgate_cut_seconds_total";
/// `rocgate_rejection_ratio`.
pub const REJECTION_RATIO: &str = "rocgate_rejection_ratio";
/// `rocgate_keys`.
pub const KEYS: &str = "rocgate_keys";
/// `rocgate_max_keys`.
pub const MAX_KEYS: &str = "rocgate_max_keys";
/// `rocgate_route_limit_rps`.
pub const ROUTE_LIMIT: &str = "rocgate_route_limit_rps";
/// `rocgate_route_limit_tokens`.
pub const ROUTE_LIMIT_TOKENS: &str = "rocgate_route_limit_tokens";
/// `rocgate_route_limit_rejected_total`.
pub const ROUTE_LIMIT_REJECTED: &str = "rocgate_route_limit_rejected_total";
/// `rocgate_keys_evicted_total`.
pub const KEYS_EVICTED: &str = "rocgate_keys_evicted_total";
/// `rocgate_key_overflow_total`.
pub const KEY_OVERFLOW: &str = "rocgate_key_overflow_total";
/// `rocgate_upstream_request_duration_seconds` (histogram).
pub const UPSTREAM_DURATION: &str = "rocgate_upstream_request_duration_seconds";
/// `rocgate_client_key_fallbacks_total`.
pub const CLIENT_KEY_FALLBACKS: &str = "rocgate_client_key_fallbacks_total";
/// `rocgate_upstream_errors_total`.
pub const UPSTREAM_ERRORS: &str = "rocgate_upstream_errors_total";
/// `rocgate_upstream_lanes`.
pub const UPSTREAM_LANES: &str = "rocgate_upstream_lanes";
/// `rocgate_in_flight_requests`.
pub const IN_FLIGHT: &str = "rocgate_in_flight_requests";
/// `rocgate_upstream_requests`.
pub const UPSTREAM_REQUESTS: &str = "rocgate_upstream_requests";
/// `rocgate_max_upstream_requests`.
pub const MAX_UPSTREAM_REQUESTS: &str = "rocgate_max_upstream_requests";
/// `rocgate_client_connections`.
pub const CLIENT_CONNECTIONS: &str = "rocgate_client_connections";
/// `rocgate_client_connection_limit_reached_total`.
pub const CONNECTION_LIMIT_REACHED: &str = "rocgate_client_connection_limit_reached_total";
/// `rocgate_client_connections_refused_total`.
pub const CONNECTIONS_REFUSED: &str = "rocgate_client_connections_refused_total";
/// `rocgate_proxy_protocol_refused_total`.
pub const PROXY_PROTOCOL_REFUSED: &str = "rocgate_proxy_protocol_refused_total";
/// `rocgate_client_connections_reclaimed_total`.
pub const CONNECTIONS_RECLAIMED: &str = "rocgate_client_connections_reclaimed_total";
/// `rocgate_admin_connections_reclaimed_total`.
pub const ADMIN_CONNECTIONS_RECLAIMED: &str = "rocgate_admin_connections_reclaimed_total";
/// `rocgate_admin_refused_total`.
pub const ADMIN_REFUSED: &str = "rocgate_admin_refused_total";
/// `rocgate_lingering_connections`.
pub const LINGERING_CONNECTIONS: &str = "rocgate_lingering_connections";
/// `rocgate_lingering_closes_total`.
pub const LINGERING_CLOSES: &str = "rocgate_lingering_closes_total";
/// `rocgate_config_reloads_total`.
pub const CONFIG_RELOADS: &str = "rocgate_config_reloads_total";
/// `rocgate_config_last_reload_successful`.
pub const CONFIG_LAST_RELOAD_APPLIED: &str = "rocgate_config_last_reload_successful";
/// `rocgate_runtime_changes`.
pub const RUNTIME_CHANGES: &str = "rocgate_runtime_changes";
/// `rocgate_store_mode`.
pub const STORE_MODE: &str = "rocgate_store_mode";
/// `rocgate_store_errors_total`.
pub const STORE_ERRORS: &str = "rocgate_store_errors_total";
/// `rocgate_store_fallback_total`.
pub const STORE_FALLBACK: &str = "rocgate_store_fallback_total";
/// `rocgate_store_requests_total`.
pub const STORE_REQUESTS: &str = "rocgate_store_requests_total";
/// `rocgate_store_controllers_carried_total`.
pub const STORE_CARRIED: &str = "rocgate_store_controllers_carried_total";
/// `rocgate_store_limit_rps`.
pub const STORE_LIMIT: &str = "rocgate_store_limit_rps";
/// `rocgate_store_roc`.
pub const STORE_ROC: &str = "rocgate_store_roc";
/// `rocgate_store_demand_rps`.
pub const STORE_DEMAND: &str = "rocgate_store_demand_rps";
/// `rocgate_store_instances`.
pub const STORE_INSTANCES: &str = "rocgate_store_instances";
/// `rocgate_build_info`.
pub const BUILD_INFO: &str = "rocgate_build_info";

/// Every metric name rocgate exports.
pub const ALL: [&str; 54] = [
    REQUESTS,
    DEMAND,
    ROC,
    CONTROLLER_ROC,
    ROC_OBSERVED,
    LIMIT,
    BASE_LIMIT,
    CUT_LIMIT,
    DANGER_ROC,
    SAFE_ROC,
    LIMITER_LEVEL,
    LIMITER_CAPACITY,
    ROUTE_LIMIT,
    ROUTE_LIMIT_TOKENS,
    ROUTE_LIMIT_REJECTED,
    CONTROLLER_STATE,
    TRANSITIONS,
    CUTS,
    CUT_VS_BASE,
    CUT_SECONDS,
    REJECTION_RATIO,
    KEYS,
    MAX_KEYS,
    KEYS_EVICTED,
    KEY_OVERFLOW,
    CLIENT_KEY_FALLBACKS,
    UPSTREAM_DURATION,
    UPSTREAM_ERRORS,
    UPSTREAM_LANES,
    IN_FLIGHT,
    UPSTREAM_REQUESTS,
    MAX_UPSTREAM_REQUESTS,
    CLIENT_CONNECTIONS,
    CONNECTION_LIMIT_REACHED,
    CONNECTIONS_REFUSED,
    PROXY_PROTOCOL_REFUSED,
    CONNECTIONS_RECLAIMED,
    ADMIN_CONNECTIONS_RECLAIMED,
    ADMIN_REFUSED,
    LINGERING_CONNECTIONS,
    LINGERING_CLOSES,
    CONFIG_RELOADS,
    CONFIG_LAST_RELOAD_APPLIED,
    RUNTIME_CHANGES,
    STORE_MODE,
    STORE_ERRORS,
    STORE_FALLBACK,
    STORE_REQUESTS,
    STORE_CARRIED,
    STORE_LIMIT,
    STORE_ROC,
    STORE_DEMAND,
    STORE_INSTANCES,
    BUILD_INFO,
];

/// The `kind` label values of `rocgate_upstream_errors_total`. The proxy sets each
/// route's counters of every kind at 0 before its first error, so that `rate` and
/// `increase` count the first burst of errors too.
pub const UPSTREAM_ERROR_KINDS: [&str; 11] = [
    "connect_timeout",
    "response_timeout",
    "upstream_error",
    "body_aborted",
    "body_too_large",
    "client_aborted",
    "client_timeout",
    "bad_request",
    "transfer_coding_not_implemented",
    "forwarding_loop",
    "upstream_overflow",
];

/// Bucket bounds of `rocgate_roc_observed`: both absolute ROC (req/s per half-window)
/// and relative ROC (ratios around ±1) fall in useful buckets. A ROC of exactly 0 (an
/// idle or steady slot, the most common) falls in the narrow bucket above -0.001:
/// `histogram_quantile` spreads a bucket's samples from the bound below, so in a
/// bucket from -0.25 the quantiles of a flat route read -0.125, a ROC no slot had.
pub const ROC_BUCKETS: [f64; 28] = [
    -1000.0, -400.0, -160.0, -80.0, -40.0, -20.0, -10.0, -5.0, -2.0, -1.0, -0.5, -0.25, -0.001,
    0.0, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 400.0, 1000.0, 4000.0, 10000.0,
];

/// Bucket bounds of `rocgate_upstream_request_duration_seconds`.
pub const DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Registers the help text and unit of every metric. Call once after installing a
/// recorder.
pub fn describe() {
    describe_counter!(REQUESTS, "Requests by route, decision and reason.");
    describe_gauge!(DEMAND, "Demand of each half-window, req/s.");
    describe_gauge!(
        ROC,
        "Rate of change of demand over the last completed slot."
    );
    describe_gauge!(
        CONTROLLER_ROC,
        "ROC of the last completed slot in the route's roc_mode, as the thresholds read it."
    );
    describe_histogram!(
        ROC_OBSERVED,
        "Every completed slot's ROC, in the route's mode."
    );
    describe_gauge!(
        LIMIT,
        "The controller's current limit, req/s (in flight on a concurrency route, a key's on a partitioned one)."
    );
    describe_gauge!(
        BASE_LIMIT,
        "The base limit in force, req/s (in flight on a concurrency route, a key's on a partitioned one)."
    );
    describe_gauge!(
        CUT_LIMIT,
        "The cut limit in force, req/s (in flight on a concurrency route, a key's on a partitioned one)."
    );
    describe_gauge!(DANGER_ROC, "ROC above which the route is cut.");
    describe_gauge!(SAFE_ROC, "ROC below which the route is calm.");
    describe_gauge!(
        LIMITER_LEVEL,
        "Tokens left (or window count, requests in a leaky bucket, in flight)."
    );
    describe_gauge!(LIMITER_CAPACITY, "The most the limiter level can be.");
    describe_gauge!(
        CONTROLLER_STATE,
        "1 for the controller's state, 0 for the others."
    );
    describe_counter!(TRANSITIONS, "Controller state changes.");
    describe_gauge!(
        ROUTE_LIMIT,
        "A partitioned route's limit over its keys together, as enforced now, req/s."
    );
    describe_gauge!(
        ROUTE_LIMIT_TOKENS,
        "Tokens left in a partitioned route's limit over its keys together."
    );
    describe_counter!(
        ROUTE_LIMIT_REJECTED,
        "Requests a partitioned route's limit over its keys together refused."
    );
    describe_counter!(CUTS, "Cuts.");
    describe_counter!(
        CUT_VS_BASE,
        "Decisions while a cut held that the base limit alone would have made the other way, by the cut's decision."
    );
    describe_counter!(CUT_SECONDS, Unit::Seconds, "Time spent in cut.");
    describe_gauge!(
        REJECTION_RATIO,
        "Rejected over offered, over the last window at least."
    );
    describe_gauge!(KEYS, "Keys tracked by a partitioned route.");
    describe_gauge!(
        MAX_KEYS,
        "Keys a partitioned route tracks at most (0 for a route limited as a whole)."
    );
    describe_counter!(KEYS_EVICTED, "Keys a partitioned route evicted.");
    describe_counter!(
        KEY_OVERFLOW,
        "Requests of new keys decided on the shared overflow limiter, the key table full."
    );
    describe_counter!(
        CLIENT_KEY_FALLBACKS,
        "Requests keyed by a trusted proxy's address (or the peer) as their forwarding header's walk ended at an entry naming no address, or a trusted proxy sent none, by route and reason."
    );
    describe_histogram!(
        UPSTREAM_DURATION,
        Unit::Seconds,
        "Upstream time to response head."
    );
    describe_counter!(UPSTREAM_ERRORS, "Upstream failures by kind.");
    describe_gauge!(
        UPSTREAM_LANES,
        "Upstream connections held by client connections of their own."
    );
    describe_gauge!(
        IN_FLIGHT,
        "Requests being forwarded, until the upstream's response head."
    );
    describe_gauge!(
        UPSTREAM_REQUESTS,
        "Requests holding a place under max_upstream_requests: forwarded, until their response body ends or their tunnel closes."
    );
    describe_gauge!(
        MAX_UPSTREAM_REQUESTS,
        "max_upstream_requests: the most requests in flight to the upstream at once; past it, 503 upstream_overflow."
    );
    describe_gauge!(CLIENT_CONNECTIONS, "Client connections open.");
    describe_counter!(
        CONNECTION_LIMIT_REACHED,
        "Connections accepted while every one of max_connections was taken: each waited for a place."
    );
    describe_counter!(
        CONNECTIONS_RECLAIMED,
        "Keep-alive connections closed gracefully to make room at max_connections (idle, new ones that sent nothing included, or after an answer saying Connection: close)."
    );
    describe_counter!(
        ADMIN_CONNECTIONS_RECLAIMED,
        "Admin API keep-alive connections closed gracefully to make room at its cap of 256."
    );
    describe_counter!(
        ADMIN_REFUSED,
        "Admin API requests refused for their bearer token: wrong_token (compared, not the token), too_many_guesses (429, their address having sent too many wrong ones)."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections closed as accepted (or once their PROXY protocol header named their client): their client address held max_connections_per_client."
    );
    describe_counter!(
        PROXY_PROTOCOL_REFUSED,
        "Connections from proxy_protocol_from closed for their PROXY protocol header (proxy_protocol): empty (nothing sent before closing or header_read_timeout), invalid, or not whole within header_read_timeout."
    );
    describe_gauge!(
        LINGERING_CONNECTIONS,
        "Client connections being closed as lingering closes: reading what the client still sends."
    );
    describe_counter!(
        LINGERING_CLOSES,
        "Lingering closes by how they ended: client_closed, lingering_timeout, lingering_time, lingering_bytes, shutdown."
    );
    describe_counter!(
        CONFIG_RELOADS,
        "Config reloads, applied or refused (the running config kept)."
    );
    describe_gauge!(
        CONFIG_LAST_RELOAD_APPLIED,
        "1 if the last config reload was applied (or none was asked for), 0 if it was refused."
    );
    describe_gauge!(
        RUNTIME_CHANGES,
        "Routes running on a runtime change (PUT /admin/routes) rather than the file's parameters."
    );
    describe_gauge!(STORE_MODE, "1 for the state store in use.");
    describe_counter!(STORE_ERRORS, "Shared-store calls that failed, by kind.");
    describe_counter!(
        STORE_FALLBACK,
        "Decisions on distributed routes taken locally because the store could not answer."
    );
    describe_counter!(STORE_REQUESTS, "Decisions on the shared state.");
    describe_counter!(
        STORE_CARRIED,
        "Shared controllers Redis had lost (restarted empty, flushed, keys evicted or expired) that a call of this instance carried over from what it last saw, cut or recovering."
    );
    describe_gauge!(STORE_LIMIT, "The shared limit as last seen, req/s.");
    describe_gauge!(
        STORE_ROC,
        "ROC of the last slot the shared controller observed (in the route's roc_mode), as last seen."
    );
    describe_gauge!(
        STORE_DEMAND,
        "The fleet's demand (every instance's arrivals in the later half-window) the shared controller last stepped on, req/s, as last seen."
    );
    describe_gauge!(STORE_INSTANCES, "Live instances as last counted.");
    describe_gauge!(BUILD_INFO, "Always 1; the version is a label.");
}

/// A sample hook recording each slot's ROC into `rocgate_roc_observed`, once the
/// controller is armed: in a route's first window one half is still empty, so its ROC
/// is about the whole rate, which no decision uses and which would set the quantiles
/// far above the noise.
pub fn roc_sample_hook() -> SampleHook {
    Arc::new(|route: &str, report: &SlotReport| {
        if report.armed {
            metrics::histogram!(ROC_OBSERVED, "route" => route.to_owned()).record(report.roc);
        }
    })
}

/// Offered and rejected counts of one route at one collection.
#[derive(Clone, Copy, Debug)]
struct Reading {
    at: Nanos,
    offered: u64,
    rejected: u64,
}

/// What the collector remembers of a route between collections.
#[derive(Debug, Default)]
struct Seen {
    /// Recent readings, for the rejection ratio over at least one window.
    readings: VecDeque<Reading>,
    /// The `algorithm` label its limiter gauges were last set with.
    algorithm: &'static str,
    /// Whether `rocgate_store_roc` and `rocgate_store_demand_rps` were last set for it.
    shared: bool,
    /// The route's serial when `readings` were taken.
    serial: u64,
    /// Its series' handles, registered with the recorder in use (see
    /// [`RouteSeries`]); dropped with the route.
    series: RouteSeries,
}

/// A counter the engine starts again from zero when a reload rebuilds its route (a new
/// window, algorithm, mode, partition or tiers), or a shared store forgets it. The
/// registry keeps the highest value a counter was set to, so the restarted count would
/// leave the series flat until it passed the old total; instead each restart adds the
/// last total to an offset. The request counters know a rebuild by the route's new
/// serial, as do the controller's counters of a route whose controller is its own;
/// those of a route a shared store decides (the store's part in them outlives some
/// rebuilds) know it by a count lower than the last. (One of those that passes its old
/// total between two collections is taken for growth: it then undercounts, but never
/// goes back.)
#[derive(Clone, Copy, Debug, Default)]
struct Monotonic {
    last: u64,
    offset: u64,
}

impl Monotonic {
    /// The count starts again from zero: what it had counted goes to the offset.
    fn restart(&mut self) {
        self.offset += self.last;
        self.last = 0;
    }

    /// The value to export for the engine's count `raw`.
    fn next(&mut self, raw: u64) -> u64 {
        if raw < self.last {
            self.offset += self.last;
        }
        self.last = raw;
        self.offset + raw
    }

    /// The value to export for a count the engine keeps modulo 2^32 (`raw`), read
    /// before it has gone round once more: a count lower than the last has wrapped
    /// (the route's rebuilds are known by its serial, see [`restart`](Self::restart)).
    fn next_u32(&mut self, raw: u32) -> u64 {
        let raw = u64::from(raw);
        if raw < self.last {
            self.offset += 1 << 32;
        }
        self.last = raw;
        self.offset + raw
    }
}

/// A route's exported counters, kept for every route name ever seen (a route removed
/// and added back continues its series).
#[derive(Debug, Default)]
struct RouteCounters {
    /// The route's serial when its request counts were last read (0 before).
    serial: u64,
    /// The route's serial when its controller's counts were last read (0 before): a
    /// reload's last reading of the engine it replaced reads its requests only.
    controller_serial: u64,
    /// Whether the controller last read was the route's own (not a shared store's).
    controller_local: bool,
    admitted: Monotonic,
    rejected: [Monotonic; Reason::ALL.len()],
    shadow_rejected: [Monotonic; Reason::ALL.len()],
    transitions: [[Monotonic; 3]; 3],
    cuts: Monotonic,
    /// Milliseconds in cuts that have ended.
    cut_ended_ms: Monotonic,
    /// Milliseconds into the cut under way, as last read.
    cut_running_ms: u64,
    /// `rocgate_cut_seconds_total` as last exported.
    cut_seconds: u64,
    keys_evicted: Monotonic,
    key_overflow: Monotonic,
    cut_vs_base_rejected: Monotonic,
    cut_vs_base_admitted: Monotonic,
    route_limit_rejected: Monotonic,
}

impl RouteCounters {
    /// Follows the route to the engine's serial `serial`: a new one (the route
    /// rebuilt) starts its request counts again.
    fn follow_requests(&mut self, serial: u64) {
        if self.serial != serial {
            let requests = self.rejected.iter_mut().chain(&mut self.shadow_rejected);
            requests
                .chain([
                    &mut self.admitted,
                    &mut self.keys_evicted,
                    &mut self.key_overflow,
                    &mut self.cut_vs_base_rejected,
                    &mut self.cut_vs_base_admitted,
                    &mut self.route_limit_rejected,
                ])
                .for_each(Monotonic::restart);
            self.serial = serial;
        }
    }

    /// Follows the route's controller to the engine's serial `serial`: a new one starts
    /// the counts again where the controller is the route's own (`local`), or was
    /// before the rebuild (a shared store's counts do not go on from a local
    /// controller's), the cut under way when it was rebuilt counted as ended.
    fn follow_controller(&mut self, serial: u64, local: bool) {
        if self.controller_serial != serial && (local || self.controller_local) {
            self.transitions
                .iter_mut()
                .flatten()
                .chain([&mut self.cuts, &mut self.cut_ended_ms])
                .for_each(Monotonic::restart);
            self.cut_ended_ms.offset += std::mem::take(&mut self.cut_running_ms);
        }
        self.controller_serial = serial;
        self.controller_local = local;
    }

    /// Exports the request counts of `s` to `h`.
    fn requests(&mut self, s: &RouteSnapshot, h: &CounterSeries) {
        self.follow_requests(s.serial);
        h.admitted.absolute(self.admitted.next(s.admitted));
        for ((reason, n), m) in s.rejected.iter().zip(&mut self.rejected) {
            if let Some(handle) = h.rejected.get(reason.index()) {
                handle.absolute(m.next(*n));
            }
        }
        for ((reason, n), m) in s.shadow_rejected.iter().zip(&mut self.shadow_rejected) {
            if let Some(handle) = h.shadow_rejected.get(reason.index()) {
                handle.absolute(m.next(*n));
            }
        }
        h.keys_evicted
            .absolute(self.keys_evicted.next(s.keys_evicted));
        h.key_overflow
            .absolute(self.key_overflow.next_u32(s.keys_overflowed));
        if let (Some(n), Some(handle)) = (s.cut_vs_base_rejected, &h.cut_vs_base_rejected) {
            handle.absolute(self.cut_vs_base_rejected.next(n));
        }
        if let (Some(n), Some(handle)) = (s.cut_vs_base_admitted, &h.cut_vs_base_admitted) {
            handle.absolute(self.cut_vs_base_admitted.next(n));
        }
        if let (Some(t), Some(handle)) = (s.route_limit, &h.route_limit_rejected) {
            handle.absolute(self.route_limit_rejected.next(t.rejected));
        }
    }
}

/// Sets every engine metric from the engine's snapshots. Remembers each route's recent
/// readings to compute the rejection ratio over at least one window, which gauges it
/// set, to blank them once they describe nothing (a route removed by a reload, an
/// algorithm or a shared store no longer in use), and its counters' totals across
/// reloads that rebuild it.
#[derive(Debug, Default)]
pub struct Collector {
    history: Mutex<HashMap<String, Seen>>,
    counters: Mutex<HashMap<String, RouteCounters>>,
    /// The address of the recorder the routes' handles belong to (0 before any).
    recorder: AtomicUsize,
    /// Whether a shared store sets the store metrics itself.
    shared_store: bool,
    /// Whether series handles are kept from one collection to the next.
    keep_handles: bool,
}

/// A route's limit and controller state as a shared store runs them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SharedControl {
    /// The shared limit, req/s.
    pub limit_rps: f64,
    /// The shared controller's state.
    pub state: ControllerState,
    /// ROC of the last slot the shared controller observed, in the route's `roc_mode`:
    /// the value it compares with the thresholds (fleet-wide traffic).
    pub roc: f64,
    /// The fleet's demand, req/s, that the shared controller last stepped on (every
    /// instance's arrivals in the later half of the shared window), as the store last
    /// answered it: `rocgate_store_demand_rps`. NaN where no answer gave one (the
    /// series is then left out of `/metrics`, see [`omit_blank_gauges`]).
    pub demand_rps: f64,
    /// The shared controller's transitions that this instance stepped (summed over
    /// the fleet, the shared controller's), added to the route's own counts.
    pub stepped: TransitionCounts,
    /// The level of the bucket that decides this instance's requests on the route
    /// (the shared bucket as last seen, or this instance's share of it; NaN where no
    /// bucket decides them, or the deciding one's level is not known yet), in place
    /// of the local engine's limiter, which does not decide them; `None` keeps the
    /// local one. A route a shared store decides has a `SharedControl` from its start,
    /// before its shared state is known: its controller counts are never the local
    /// one's (see the collector's `follow_controller`).
    pub level: Option<Level>,
}

impl SharedControl {
    /// Puts the shared limit, controller state and bucket level in `s`, a snapshot of
    /// the route in the local engine (whose controller does not step, nor its limiter
    /// decide, for a route a shared store decides), and adds the shared transitions
    /// this instance stepped to its counts. Its decisions against the base limit's
    /// are not counted (`None`): the engine decides none of its requests.
    pub fn apply(&self, s: &mut RouteSnapshot) {
        s.limit_rps = self.limit_rps;
        s.state = self.state;
        let stepped = &self.stepped;
        let pairs = s.transitions.iter_mut().flatten();
        for (mine, theirs) in pairs.zip(stepped.transitions.iter().flatten()) {
            *mine += theirs;
        }
        s.cuts += stepped.cuts;
        s.time_in_cut += stepped.time_in_cut;
        s.cut_vs_base_rejected = None;
        s.cut_vs_base_admitted = None;
        if let Some(level) = self.level {
            s.level = level;
        }
    }
}

impl Collector {
    /// A collector with no history.
    pub fn new() -> Self {
        Self::default()
    }

    /// A collector that leaves the `rocgate_store_*` metrics to a shared store
    /// (otherwise it reports the local store).
    #[must_use]
    pub fn with_shared_store(mut self) -> Self {
        self.shared_store = true;
        self
    }

    /// A collector for a process whose metrics go to its one global recorder, as
    /// `rocgate serve`'s do: it registers each series with the recorder once and keeps
    /// the handle, so that a collection sets each series with an atomic store instead
    /// of looking it up by name and labels in the recorder's registry (at 1,000 routes,
    /// most of what a collection costs). The handles are registered again when a
    /// recorder at another address is in use (the global one installed after a
    /// first collection); not when a recorder dropped is replaced by another at the
    /// same address, as a local recorder on the stack may be, so a collector used
    /// under [`metrics::with_local_recorder`] should be a [`new`](Self::new) one,
    /// which registers its series at every collection.
    #[must_use]
    pub fn for_global_recorder(mut self) -> Self {
        self.keep_handles = true;
        self
    }

    /// Puts a new engine in place of one by `replace`, which returns the engine it
    /// replaced, and counts the requests that engine's routes decided since the last
    /// collection (then no more): those of a route the new engine rebuilt (its counts
    /// start again from zero) or does not have were lost otherwise. Nothing is
    /// collected between the two, the new engine's rebuilt routes read as restarted
    /// only once the old ones' counts are in. The controllers' counts (transitions,
    /// cuts, time in cut) are not read from the replaced engine: a shared store's part in
    /// them is not the engine's; a rebuilt route's since the last collection are lost.
    /// `rocgate serve`'s reloads replace their engine so; a layer that replaces its
    /// engine (`rocgate::http::SharedEngine::replace`) can too.
    pub fn replace(&self, now: Nanos, replace: impl FnOnce() -> Arc<Engine>) {
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        let replaced = replace();
        for mut s in replaced.snapshot(now) {
            // A count still at 0 adds nothing, and its series is not started here: a
            // route a shared store decides (which the replaced engine's snapshot
            // does not say) has none.
            s.cut_vs_base_rejected = s.cut_vs_base_rejected.filter(|&n| n > 0);
            s.cut_vs_base_admitted = s.cut_vs_base_admitted.filter(|&n| n > 0);
            let mut series = RouteSeries::default();
            let c = counters.entry(s.name.clone()).or_default();
            c.requests(&s, series.counters(&s));
        }
    }

    /// Sets every metric of every route of `engine` as of `now`.
    pub fn collect(&self, engine: &Engine, now: Nanos) {
        self.collect_with(engine, now, |_| None);
    }

    /// [`collect`](Self::collect), with the limit and controller state of the routes a
    /// shared store decides taken from `shared` (by route name): the local engine's
    /// controller does not step for those. Their shared ROC goes to
    /// `rocgate_store_roc` and the fleet's demand to `rocgate_store_demand_rps`;
    /// `rocgate_roc` and `rocgate_demand_rps` keep this instance's own traffic.
    pub fn collect_with(
        &self,
        engine: &Engine,
        now: Nanos,
        shared: impl Fn(&str) -> Option<SharedControl>,
    ) {
        let mut history = self.history.lock().unwrap_or_else(PoisonError::into_inner);
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        // Handles are kept while the recorder they belong to is in use.
        let recorder =
            metrics::with_recorder(|r| (r as *const dyn metrics::Recorder).cast::<()>().addr());
        if self.recorder.swap(recorder, Ordering::Relaxed) != recorder || !self.keep_handles {
            for seen in history.values_mut() {
                seen.series = RouteSeries::default();
            }
        }
        let mut snapshots = engine.snapshot(now);
        let in_force: HashSet<&str> = snapshots.iter().map(|s| s.name.as_str()).collect();
        history.retain(|name, seen| {
            let kept = in_force.contains(name.as_str());
            if !kept {
                let route = &mut seen.series;
                route_gauges(route, name, seen.algorithm, None);
                if seen.shared {
                    route.store_gauges(name).blank();
                }
            }
            kept
        });
        for s in &mut snapshots {
            let seen = history.entry(s.name.clone()).or_default();
            let route = &mut seen.series;
            let control = shared(&s.name);
            if let Some(control) = control {
                control.apply(s);
            }
            if control.is_some() || seen.shared {
                let h = route.store_gauges(&s.name);
                match control {
                    Some(c) => {
                        h.roc.set(c.roc);
                        h.demand.set(c.demand_rps);
                    }
                    None => h.blank(),
                }
                seen.shared = control.is_some();
            }
            if !seen.algorithm.is_empty() && seen.algorithm != s.algorithm {
                limiter_gauges(route, &s.name, seen.algorithm, None);
            }
            seen.algorithm = s.algorithm;
            if seen.serial != s.serial {
                // Counts started again: readings of the old ones compare with nothing.
                seen.readings.clear();
                seen.serial = s.serial;
            }
            let ratio = rejection_ratio(&mut seen.readings, s, now);
            let c = counters.entry(s.name.clone()).or_default();
            record_route(s, ratio, control.is_none(), c, route);
        }
        gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
        if !self.shared_store {
            gauge!(STORE_MODE, "mode" => "local").set(1.0);
        }
    }
}

/// The Prometheus text exposition `text` without the samples of gauges that read NaN.
///
/// The collector blanks a gauge that describes nothing any more (a route removed by a
/// reload, an algorithm a route no longer uses, a shared ROC no store reports), since
/// the recorder cannot delete it. Left out of what a scrape reads, such a series ends
/// (Prometheus marks it stale) instead of reading NaN for as long as the process runs.
/// Counters and histograms are kept whatever they read.
pub fn omit_blank_gauges(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // Whether the samples that follow belong to a gauge (each family's `# TYPE` line
    // comes before its samples).
    let mut in_gauge = false;
    for line in text.split_inclusive('\n') {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            in_gauge = family.trim_end().ends_with(" gauge");
        } else if in_gauge && !line.starts_with('#') && line.trim_end().ends_with(" NaN") {
            continue;
        }
        out.push_str(line);
    }
    out
}

/// Rejected ÷ offered between the newest reading at least one window old (or the
/// oldest kept) and now. Only requests refused count: shadow modes' would-be
/// rejections were admitted. Without readings (the route's first collection, or its
/// first since it was rebuilt) the counts are taken from zero, where the route started
/// them, by a reading of zeros a window back: kept until a real reading is a window
/// old, it makes the ratio cover the counts since the start until then, not the time
/// since the last scrape.
fn rejection_ratio(readings: &mut VecDeque<Reading>, s: &RouteSnapshot, now: Nanos) -> f64 {
    let current = Reading {
        at: now,
        offered: s.offered,
        rejected: s.rejected_total(),
    };
    let window = s.window.window();
    if readings.is_empty() {
        readings.push_back(Reading {
            at: now - window,
            offered: 0,
            rejected: 0,
        });
    }
    // Keep one reading at least a window old, and everything newer.
    while readings.len() >= 2 && now.saturating_since(readings[1].at) >= window {
        readings.pop_front();
    }
    let base = readings[0];
    readings.push_back(current);
    if readings.len() > 1024 {
        readings.pop_front();
    }
    let offered = current.offered.saturating_sub(base.offered);
    if offered == 0 {
        0.0
    } else {
        current.rejected.saturating_sub(base.rejected) as f64 / offered as f64
    }
}

/// The controller's states, as `rocgate_controller_state` labels them.
const STATES: [ControllerState; 3] = [
    ControllerState::Normal,
    ControllerState::Cut,
    ControllerState::Recovering,
];

/// Exports the counters and gauges of the route `s`, whose controller is its own
/// (`local`) or a shared store's.
fn record_route(
    s: &RouteSnapshot,
    rejection_ratio: f64,
    local: bool,
    c: &mut RouteCounters,
    series: &mut RouteSeries,
) {
    let h = series.counters(s);
    c.requests(s, h);
    c.follow_controller(s.serial, local);
    for (f, row) in h.transitions.iter().enumerate() {
        for (t, handle) in row.iter().enumerate() {
            if let Some(handle) = handle {
                handle.absolute(c.transitions[f][t].next(s.transitions[f][t]));
            }
        }
    }
    h.cuts.absolute(c.cuts.next(s.cuts));
    // The cut under way is counted on top of the ended ones, and never taken back: a
    // cut stepped after a silence may end before a time it was counted to, and the
    // lower total then read as a restart, adding the whole total again.
    let ended_ms = s.time_in_cut.saturating_sub(s.cut_running).as_millis();
    let ended_ms = c
        .cut_ended_ms
        .next(u64::try_from(ended_ms).unwrap_or(u64::MAX));
    let running_ms = u64::try_from(s.cut_running.as_millis()).unwrap_or(u64::MAX);
    c.cut_running_ms = running_ms;
    c.cut_seconds = c
        .cut_seconds
        .max(ended_ms.saturating_add(running_ms) / 1000);
    h.cut_seconds.absolute(c.cut_seconds);
    route_gauges(series, &s.name, s.algorithm, Some((s, rejection_ratio)));
}

/// Sets a route's gauges from its snapshot and rejection ratio, or, with `None`, to
/// NaN: a route that is gone has no reading, and NaN compares false in any alert rule,
/// where its last readings would keep an alert firing. (The metrics facade cannot
/// delete a series; its counters stay, as counters may.)
fn route_gauges(
    series: &mut RouteSeries,
    route: &str,
    algorithm: &'static str,
    now: Option<(&RouteSnapshot, f64)>,
) {
    let v = |f: fn(&RouteSnapshot) -> f64| now.map_or(f64::NAN, |(s, _)| f(s));
    let h = series.gauges(route);
    h.demand_prev.set(v(|s| s.sample.rate_prev_rps));
    h.demand_recent.set(v(|s| s.sample.rate_recent_rps));
    h.roc_absolute.set(v(|s| s.sample.roc));
    h.roc_relative.set(v(|s| s.sample.relative_roc(s.min_rps)));
    h.controller_roc
        .set(v(|s| s.sample.roc_in(s.roc_mode, s.min_rps)));
    h.limit.set(v(|s| s.limit_rps));
    h.base_limit.set(v(|s| s.base_limit_rps));
    h.cut_limit.set(v(|s| s.cut_limit_rps));
    h.danger_roc.set(v(|s| s.danger_roc));
    h.safe_roc.set(v(|s| s.safe_roc));
    for (state, handle) in STATES.iter().zip(&h.state) {
        let on = now.map_or(f64::NAN, |(s, _)| f64::from(u8::from(s.state == *state)));
        handle.set(on);
    }
    h.rejection_ratio
        .set(now.map_or(f64::NAN, |(_, ratio)| ratio));
    h.keys.set(v(|s| s.keys as f64));
    h.max_keys.set(v(|s| s.max_keys as f64));
    // A route's total, or NaN once it has none (removed, or the route gone).
    let total = now.and_then(|(s, _)| s.route_limit);
    if total.is_some() || series.route_limit.is_some() {
        let [limit, tokens] = series.route_limit.get_or_insert_with(|| {
            let r = || route.to_owned();
            [
                gauge!(ROUTE_LIMIT, "route" => r()),
                gauge!(ROUTE_LIMIT_TOKENS, "route" => r()),
            ]
        });
        limit.set(total.map_or(f64::NAN, |t| t.limit_rps));
        tokens.set(total.map_or(f64::NAN, |t| t.level.value));
    }
    limiter_gauges(series, route, algorithm, now.map(|(s, _)| s));
}

/// Sets a route's limiter gauges under `algorithm`, or to NaN with `None`.
fn limiter_gauges(
    series: &mut RouteSeries,
    route: &str,
    algorithm: &'static str,
    now: Option<&RouteSnapshot>,
) {
    let h = series.limiter(route, algorithm);
    h.level.set(now.map_or(f64::NAN, |s| s.level.value));
    h.capacity.set(now.map_or(f64::NAN, |s| s.level.capacity));
}

/// A route's series handles, each group registered the first time it is set (a route
/// removed before its first collection has only its gauges blanked, as before).
///
/// `counter!` and `gauge!` build a series' key (its name and labels, the route's name
/// copied) and look it up in the recorder's registry at every call: one a series, about
/// 40 a route and 40,000 a scrape at 1,000 routes. A handle kept from the first is set with one atomic store.
/// Handles belong to the recorder in use when they were registered: only a collector
/// [`for_global_recorder`](Collector::for_global_recorder) keeps them, while that
/// recorder is in use, and only for the routes in force (those of a route a reload
/// removed go with it; added back, it registers them again).
#[derive(Debug, Default)]
struct RouteSeries {
    counters: Option<CounterSeries>,
    gauges: Option<GaugeSeries>,
    /// `rocgate_limiter_level` and `rocgate_limiter_capacity` under each `algorithm`
    /// label the route has been set with.
    limiters: Vec<LimiterSeries>,
    /// `rocgate_store_roc` and `rocgate_store_demand_rps`.
    store: Option<StoreSeries>,
    /// `rocgate_route_limit_rps` and `rocgate_route_limit_tokens`, registered once the
    /// route has a `route_limit`.
    route_limit: Option<[Gauge; 2]>,
}

impl RouteSeries {
    /// The counters of the route `s`, with each side of `rocgate_cut_vs_base_total`
    /// once the route counts it (never for a route that does not: the series would
    /// read 0 where nothing is counted).
    fn counters(&mut self, s: &RouteSnapshot) -> &CounterSeries {
        let h = self
            .counters
            .get_or_insert_with(|| CounterSeries::register(&s.name));
        let side = |count: Option<u64>, handle: &mut Option<Counter>, decision: &'static str| {
            if count.is_some() && handle.is_none() {
                *handle =
                    Some(counter!(CUT_VS_BASE, "route" => s.name.clone(), "decision" => decision));
            }
        };
        side(
            s.cut_vs_base_rejected,
            &mut h.cut_vs_base_rejected,
            "rejected",
        );
        side(
            s.cut_vs_base_admitted,
            &mut h.cut_vs_base_admitted,
            "admitted",
        );
        if s.route_limit.is_some() && h.route_limit_rejected.is_none() {
            h.route_limit_rejected =
                Some(counter!(ROUTE_LIMIT_REJECTED, "route" => s.name.clone()));
        }
        h
    }

    fn gauges(&mut self, route: &str) -> &GaugeSeries {
        self.gauges
            .get_or_insert_with(|| GaugeSeries::register(route))
    }

    fn limiter(&mut self, route: &str, algorithm: &'static str) -> &LimiterSeries {
        let at = match self.limiters.iter().position(|l| l.algorithm == algorithm) {
            Some(at) => at,
            None => {
                let r = || route.to_owned();
                self.limiters.push(LimiterSeries {
                    algorithm,
                    level: gauge!(LIMITER_LEVEL, "route" => r(), "algorithm" => algorithm),
                    capacity: gauge!(LIMITER_CAPACITY, "route" => r(), "algorithm" => algorithm),
                });
                self.limiters.len() - 1
            }
        };
        &self.limiters[at]
    }

    fn store_gauges(&mut self, route: &str) -> &StoreSeries {
        self.store.get_or_insert_with(|| StoreSeries {
            roc: gauge!(STORE_ROC, "route" => route.to_owned()),
            demand: gauge!(STORE_DEMAND, "route" => route.to_owned()),
        })
    }
}

/// A route's counters: `rocgate_requests_total`, `rocgate_controller_transitions_total`,
/// `rocgate_cuts_total`, `rocgate_cut_seconds_total`.
#[derive(Debug)]
struct CounterSeries {
    admitted: Counter,
    /// By [`Reason::index`].
    rejected: [Counter; Reason::ALL.len()],
    /// By [`Reason::index`].
    shadow_rejected: [Counter; Reason::ALL.len()],
    /// By `[from][to]` state index; none from a state to itself.
    transitions: [[Option<Counter>; 3]; 3],
    cuts: Counter,
    cut_seconds: Counter,
    keys_evicted: Counter,
    key_overflow: Counter,
    /// `rocgate_cut_vs_base_total{decision="rejected"}`, registered once the route
    /// counts it.
    cut_vs_base_rejected: Option<Counter>,
    /// `rocgate_cut_vs_base_total{decision="admitted"}`, registered once the route
    /// counts it.
    cut_vs_base_admitted: Option<Counter>,
    /// `rocgate_route_limit_rejected_total`, registered once the route has a
    /// `route_limit`.
    route_limit_rejected: Option<Counter>,
}

impl CounterSeries {
    fn register(route: &str) -> Self {
        let r = || route.to_owned();
        let requests = |decision: &'static str| {
            Reason::ALL.map(|reason| {
                counter!(REQUESTS, "route" => r(), "decision" => decision, "reason" => reason.as_str())
            })
        };
        let mut transitions = [const { [const { None }; 3] }; 3];
        for from in STATES {
            for to in STATES {
                if from != to {
                    let (f, t) = (from.as_index() as usize, to.as_index() as usize);
                    transitions[f][t] = Some(
                        counter!(TRANSITIONS, "route" => r(), "from" => from.as_str(), "to" => to.as_str()),
                    );
                }
            }
        }
        Self {
            admitted: counter!(REQUESTS, "route" => r(), "decision" => "admitted", "reason" => "none"),
            rejected: requests("rejected"),
            shadow_rejected: requests("shadow_rejected"),
            transitions,
            cuts: counter!(CUTS, "route" => r()),
            cut_seconds: counter!(CUT_SECONDS, "route" => r()),
            keys_evicted: counter!(KEYS_EVICTED, "route" => r()),
            key_overflow: counter!(KEY_OVERFLOW, "route" => r()),
            cut_vs_base_rejected: None,
            cut_vs_base_admitted: None,
            route_limit_rejected: None,
        }
    }
}

/// A route's gauges but its limiter's and the shared store's.
#[derive(Debug)]
struct GaugeSeries {
    demand_prev: Gauge,
    demand_recent: Gauge,
    roc_absolute: Gauge,
    roc_relative: Gauge,
    controller_roc: Gauge,
    limit: Gauge,
    base_limit: Gauge,
    cut_limit: Gauge,
    danger_roc: Gauge,
    safe_roc: Gauge,
    /// In [`STATES`] order.
    state: [Gauge; 3],
    rejection_ratio: Gauge,
    keys: Gauge,
    max_keys: Gauge,
}

impl GaugeSeries {
    fn register(route: &str) -> Self {
        let r = || route.to_owned();
        Self {
            demand_prev: gauge!(DEMAND, "route" => r(), "half" => "prev"),
            demand_recent: gauge!(DEMAND, "route" => r(), "half" => "recent"),
            roc_absolute: gauge!(ROC, "route" => r(), "mode" => "absolute"),
            roc_relative: gauge!(ROC, "route" => r(), "mode" => "relative"),
            controller_roc: gauge!(CONTROLLER_ROC, "route" => r()),
            limit: gauge!(LIMIT, "route" => r()),
            base_limit: gauge!(BASE_LIMIT, "route" => r()),
            cut_limit: gauge!(CUT_LIMIT, "route" => r()),
            danger_roc: gauge!(DANGER_ROC, "route" => r()),
            safe_roc: gauge!(SAFE_ROC, "route" => r()),
            state: STATES
                .map(|state| gauge!(CONTROLLER_STATE, "route" => r(), "state" => state.as_str())),
            rejection_ratio: gauge!(REJECTION_RATIO, "route" => r()),
            keys: gauge!(KEYS, "route" => r()),
            max_keys: gauge!(MAX_KEYS, "route" => r()),
        }
    }
}

/// A route's gauges of what a shared store last answered: `rocgate_store_roc` and
/// `rocgate_store_demand_rps` (the store sets its limit's itself).
#[derive(Debug)]
struct StoreSeries {
    roc: Gauge,
    demand: Gauge,
}

impl StoreSeries {
    /// No store decides the route (any more): nothing to read.
    fn blank(&self) {
        self.roc.set(f64::NAN);
        self.demand.set(f64::NAN);
    }
}

/// A route's limiter gauges under one `algorithm` label.
#[derive(Debug)]
struct LimiterSeries {
    algorithm: &'static str,
    level: Gauge,
    capacity: Gauge,
}

#[cfg(test)]
mod tests {
    use super::Monotonic;

    /// A count kept modulo 2^32 that wraps between two readings counts on past 2^32;
    /// it went back to the last reading's value, counting 2^32 − 100 + 50 as 50.
    /// (helper-146)
    #[test]
    fn a_wrapped_count_counts_on() {
        let mut overflow = Monotonic::default();
        let last = u32::MAX - 99;
        assert_eq!(overflow.next_u32(last), u64::from(last));
        assert_eq!(overflow.next_u32(50), (1 << 32) + 50);
        // A rebuilt route's count starts again from zero: added to the total.
        overflow.restart();
        assert_eq!(overflow.next_u32(7), (1 << 32) + 50 + 7);
    }
}
