//! The standalone reverse proxy behind `rocgate serve`: the admission layer in front of
//! a forwarding service, plus the admin API on its own listener.
//!
//! Clients speak HTTP/1.1 or h2c (HTTP/2 with prior knowledge); the upstream is reached
//! over pooled keep-alive HTTP/1.1 connections. Admission is decided before the request
//! body is read, so a rejected request is never forwarded and its body never read; an
//! HTTP/1.1 connection closed with a body unread is closed as a lingering close
//! (`connections::linger`), within `lingering_time` and `lingering_timeout`.
//! Bodies stream both ways. With `proxy_protocol`, a connection from
//! `proxy_protocol_from` (the trusted proxies unless set) must first send a PROXY
//! protocol header (`proxy_header`), within `header_read_timeout`,
//! whose client is the connection's peer from then on; without one it is closed. A
//! connection must send enough to tell HTTP/1.1 from
//! HTTP/2 (its first byte, or HTTP/2's preface whole), then its complete request head,
//! each within `header_read_timeout` (slowloris), and each later head within as long
//! of its first byte (the wait for it is `idle_timeout`'s); an HTTP/2 connection silent
//! that long is pinged, and closed unless it answers within as long. At most
//! `max_connections` client connections are open at once (further ones wait in the
//! listen backlog, while those idle longest are closed to make room), and one with no
//! request in progress for `idle_timeout` is closed gracefully. At most
//! `max_upstream_requests` requests are in flight to the upstream (the forwarder's
//! cap; beyond it, 503 `upstream_overflow`). On shutdown the listeners close at once and requests in flight get up
//! to `shutdown_grace` to finish. An admitted HTTP/1.1 upgrade (WebSocket) that the
//! upstream accepts becomes a tunnel between the two connections (`tunnel`), closed
//! once nothing crosses it for `idle_timeout`. The partitioned routes' idle keys are
//! swept on a thread of their own ([`Sweeper`]), stopped when serving ends (on a
//! blocking thread, so that a sweep under way holds up no async worker).

mod admin;
mod connections;
mod error;
mod forward;
mod guesses;
mod hints;
mod lane;
mod proxy_header;
mod tunnel;

pub use hints::Advisor;
#[cfg(feature = "redis")]
mod shared;

pub use error::{BindError, ProxyError, ReloadError};
pub use forward::{ForwardSettings, Forwarder};

use crate::clock::{Clock, MonotonicClock};
use crate::config::{Config, ProxyProtocol, ServerConfig, UNMATCHED_ROUTE};
use crate::controller::ControllerParams;
use crate::controller::Transition;
use crate::engine::{Engine, RefusedChange};
use crate::http::{AdmissionLayer, RouteKey, SharedEngine, Sweeper};
use crate::metrics as metric;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tower::{Layer, Service};

/// Everything `serve` needs besides the routes. Build it with
/// [`ProxySettings::from_server`] ([`ServerConfig::default`] for the file's defaults)
/// and set its fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProxySettings {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// Where the admin API listens.
    pub admin_listen: SocketAddr,
    /// Forwarding: upstream, timeouts, body limit, trusted proxies.
    pub forward: ForwardSettings,
    /// Longest wait for a connection's first byte, and for a request head to be
    /// complete once its first byte is in (the wait between requests is
    /// `idle_timeout`'s).
    pub header_read_timeout: Duration,
    /// How long requests in flight may take to finish after shutdown begins.
    pub shutdown_grace: Duration,
    /// Most client connections open at once (at least 1); the admin API's are not
    /// counted.
    pub max_connections: usize,
    /// Most client connections open at once from one client address (an IPv6 client's
    /// /64), if set; connections from the trusted proxies and from `proxy_protocol_from`
    /// are not counted (a client a header names is, unless a trusted proxy). Beyond it,
    /// a connection is closed as soon as it is accepted.
    pub max_connections_per_client: Option<usize>,
    /// How long a client connection may have no request in progress before it is
    /// closed gracefully; also how long an upgraded connection's tunnel may carry
    /// nothing, either way, before it is closed.
    pub idle_timeout: Duration,
    /// Bearer token required by the admin API's mutating endpoints, if set (`***` in
    /// `{:?}`), and by its reads from beyond loopback with
    /// [`admin_reads`](Self::admin_reads) `Token`.
    pub admin_token: Option<crate::config::Secret>,
    /// Names of this host, besides `localhost` and IP addresses, that a request to the
    /// admin API from loopback may carry in `Host` (lower-case, without a trailing
    /// dot); see [`ServerConfig::admin_allowed_hosts`].
    pub admin_allowed_hosts: Vec<String>,
    /// Whether a read from beyond loopback needs the token; see
    /// [`ServerConfig::admin_reads`]. [`AdminReads::Token`](crate::config::AdminReads::Token)
    /// without [`admin_token`](Self::admin_token) (which the config refuses) fails
    /// closed: every request from beyond loopback but `/healthz` and `/readyz` gets 403,
    /// saying no token is set; the proxy still starts, and loopback reads as before.
    pub admin_reads: crate::config::AdminReads,
    /// Wrong bearer tokens a client address may send to the admin API at once, taken
    /// from 1 to 10000 as the config bounds it (0 is 1); see
    /// [`ServerConfig::admin_wrong_tokens_burst`].
    pub admin_wrong_tokens_burst: u32,
    /// Wrong bearer tokens a client address may send to the admin API per second past
    /// its burst, taken from 0.01 to 1000 as the config bounds it (0, or no number, is
    /// 0.01); see [`ServerConfig::admin_wrong_tokens_per_second`].
    pub admin_wrong_tokens_per_second: f64,
    /// The longest a lingering close reads what the client still sends, in all
    /// (nginx's `lingering_time`): an HTTP/1.1 connection closed after an answer that
    /// left its request's body unread (a 429, a 413) reads and throws away the rest,
    /// so that a client that sends its whole body before it reads gets the answer,
    /// not a reset.
    pub lingering_time: Duration,
    /// The longest pause in what the client sends during a lingering close (nginx's
    /// `lingering_timeout`).
    pub lingering_timeout: Duration,
    /// The most a lingering close reads ([`LINGERING_BYTES`]).
    pub lingering_bytes: u64,
    /// The PROXY protocol header each connection from
    /// [`proxy_protocol_from`](Self::proxy_protocol_from) begins with, if any: its
    /// client is the connection's peer. Read within `header_read_timeout`; a
    /// connection from those peers without one is closed.
    pub proxy_protocol: ProxyProtocol,
    /// The peers whose connections begin with the PROXY protocol header; `None` for
    /// the trusted proxies (`forward.resolver`'s networks). Their connections are not
    /// counted under `max_connections_per_client` (the clients their headers name
    /// are).
    pub proxy_protocol_from: Option<Vec<ipnet::IpNet>>,
}

/// The default [`ProxySettings::lingering_bytes`]: above the default `max_body_bytes`
/// (10 MiB), so that a refused upload the proxy would have taken is read through.
pub const LINGERING_BYTES: u64 = 64 << 20;

impl ProxySettings {
    /// The settings of a config's `[server]` and `[admin]` sections, forwarding to
    /// `upstream` (already checked to be `http://host[:port]`).
    pub fn from_server(server: &ServerConfig, upstream: http::Uri) -> Self {
        ProxySettings {
            listen: server.listen,
            admin_listen: server.admin_listen,
            forward: ForwardSettings::from_server(server, upstream),
            header_read_timeout: server.header_read_timeout,
            shutdown_grace: server.shutdown_grace,
            max_connections: server.max_connections,
            max_connections_per_client: server.max_connections_per_client,
            idle_timeout: server.idle_timeout,
            admin_token: server.admin_token.clone(),
            admin_allowed_hosts: server.admin_allowed_hosts.clone(),
            admin_reads: server.admin_reads,
            admin_wrong_tokens_burst: server.admin_wrong_tokens_burst,
            admin_wrong_tokens_per_second: server.admin_wrong_tokens_per_second,
            lingering_time: server.lingering_time,
            lingering_timeout: server.lingering_timeout,
            lingering_bytes: LINGERING_BYTES,
            proxy_protocol: server.proxy_protocol,
            proxy_protocol_from: server.proxy_protocol_from.clone(),
        }
    }
}

/// A bound, not yet running proxy.
pub struct Proxy {
    listener: TcpListener,
    admin: TcpListener,
    settings: ProxySettings,
    reloader: Reloader,
    advisor: Arc<Advisor>,
    /// The shared store of distributed routes (`[store] backend = "redis"`).
    #[cfg(feature = "redis")]
    store: Option<crate::store::redis::RedisStore>,
}

/// Replaces the engine from a config file, keeping the live state of unchanged routes
/// (see [`Engine::reload`]). Shared by `POST /admin/reload` and SIGHUP.
#[derive(Clone)]
pub struct Reloader {
    engine: SharedEngine,
    clock: Arc<dyn Clock>,
    source: Option<PathBuf>,
    /// Told of each new engine, to forget the routes it no longer shares.
    #[cfg(feature = "redis")]
    store: Option<crate::store::redis::RedisStore>,
    /// The sections read once, at start (`[server]`, `[admin]`, `[hints]`, `[store]`),
    /// as the proxy started with them; the routes are left out.
    started: Arc<Config>,
    /// The fields the command line set, which no file changes.
    held: Arc<HeldByFlags>,
    /// Held through a reload, its file read included: of two at once (a SIGHUP and
    /// `POST /admin/reload`), the second reads the file after the first has swapped
    /// its engine in, so the file read last is the one in force.
    reading: Arc<Mutex<()>>,
    /// Held while a reload swaps its engine in, and while a runtime change is made:
    /// the routes whose runtime change is in force, each with the file's parameters
    /// that the change replaced (see [`Reloaded`]). Not held through the file's read,
    /// which a slow or hung file system may hold up: scrapes and changes need it.
    reloading: Arc<Mutex<BTreeMap<String, ControllerParams>>>,
    /// The reloads applied and refused, for `/metrics`.
    reloads: Arc<ReloadCounts>,
    /// What `/metrics` collects with: a reload counts through it what the engine it
    /// replaces decided since the last scrape.
    collector: Arc<metric::Collector>,
}

/// The reloads a [`Reloader`] applied and refused, and whether the last one was applied.
#[derive(Debug)]
pub(crate) struct ReloadCounts {
    /// Reloads that put a file in force.
    pub(crate) applied: AtomicU64,
    /// Reloads refused: the running config was kept.
    pub(crate) refused: AtomicU64,
    /// Whether the last reload was applied (true before any).
    pub(crate) last_applied: AtomicBool,
}

impl Default for ReloadCounts {
    fn default() -> Self {
        ReloadCounts {
            applied: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            last_applied: AtomicBool::new(true),
        }
    }
}

/// What a reload that was applied did besides putting the file's routes in force.
///
/// A runtime change (`PUT /admin/routes/{name}`) outlives a reload that leaves its
/// route's parameters in the file as they were when the change was made: a reload
/// for another route's sake does not undo an operator's change made during an
/// incident. Where the file's parameters for the route changed, the file is the
/// newer word and replaces the runtime change. A file that now says what the change
/// said takes it over: the change is neither kept nor replaced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reloaded {
    /// The sections read only at start whose content changed since the start
    /// (`"[server]"`, `"[admin]"`, `"[hints]"`, `"[store]"`): they wait for a restart.
    pub restart_required: Vec<&'static str>,
    /// The routes whose runtime change stays in force: the file left their
    /// parameters as they were.
    pub runtime_changes_kept: Vec<String>,
    /// The routes whose runtime change the file's parameters replaced: the file
    /// changed them (or the change no longer fits the route the file describes).
    pub runtime_changes_replaced: Vec<String>,
    /// The routes whose runtime change went with them: the file no longer has a route
    /// of that name (removed, or renamed).
    pub runtime_changes_dropped: Vec<String>,
    /// The file's scheduled events that have ended (`routes[0].events[1]`): valid, and
    /// never to run (a date left from a past sale).
    pub events_ended: Vec<String>,
}

/// Logs each of `config`'s scheduled events that ended at or before `wall_now` (a
/// warning: it will never run), and says where each is (`routes[0].events[1]`).
pub fn warn_ended_events(config: &Config, wall_now: SystemTime) -> Vec<String> {
    config
        .ended_events(wall_now)
        .into_iter()
        .map(|(at, event, end)| {
            tracing::warn!(
                event = %event.name,
                at,
                ended = %humantime::format_rfc3339_seconds(end),
                "a scheduled event has ended: it will never run"
            );
            at
        })
        .collect()
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// The engine in force.
    pub fn engine(&self) -> Arc<Engine> {
        self.engine.load()
    }

    /// The clock the engine runs on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Periodic upkeep of the engine in force: places its scheduled events again from
    /// the wall clock ([`Engine::align_events`]), and brings every route it decides
    /// itself up to now ([`Engine::catch_up`]; a route the shared store decides has
    /// its controller stepped there).
    pub fn upkeep(&self) {
        let engine = self.engine();
        #[allow(clippy::disallowed_methods)] // wall time enters here, to place events
        let wall_now = SystemTime::now();
        #[cfg(feature = "redis")]
        let shared = |id| self.store.as_ref().is_some_and(|s| s.shares(&engine, id));
        #[cfg(not(feature = "redis"))]
        let shared = |_| false;
        engine.upkeep(self.clock.now(), wall_now, shared);
    }

    /// Makes the store forget the routes that the engine in force no longer shares:
    /// those a decision still running on a replaced engine added back after the
    /// reload's own pass. Does nothing while a reload runs (it makes that pass).
    #[cfg(feature = "redis")]
    pub(crate) fn retain_store(&self) {
        let Some(store) = &self.store else {
            return;
        };
        let _no_reload = match self.reloading.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        store.retain(&self.engine());
    }

    /// Reads the config file again and swaps the engine, on tokio's blocking pool (the
    /// file read and the engine build hold no runtime worker, nor does a reload waiting
    /// for another). An invalid file, or a proxy started without one, keeps the
    /// running config and returns why ([`ReloadError`], with every problem of the
    /// file), which is logged too. The routes take effect at once, the file's
    /// parameters replacing the runtime changes of the routes whose parameters the
    /// file changed (those kept and those replaced are returned and logged, see
    /// [`Reloaded`]); the other sections only at a restart: those whose content differs from the
    /// proxy's start are returned (`"[admin]"`, …) and logged.
    pub async fn reload_async(&self) -> Result<Reloaded, ReloadError> {
        let reloader = self.clone();
        tokio::task::spawn_blocking(move || reloader.reload())
            .await
            .unwrap_or_else(|e| Err(ReloadError::Aborted(e)))
    }

    /// Changes the controller parameters of the route `name` by the JSON object
    /// `patch`, checked by the file's rules ([`crate::config::patch_controller`]), and
    /// returns the route's state after the change (blocking: it waits for a reload or
    /// another change under way). The parameters are read, patched and written under
    /// the reload lock, so neither a reload nor another change lands between the read
    /// and the write, to be overwritten by parameters read before it.
    pub(crate) fn update_route(
        &self,
        name: &str,
        patch: &str,
    ) -> Result<crate::engine::RouteSnapshot, RouteChangeError> {
        let changed = |engine: &Engine, id, file: Option<&ControllerParams>| {
            let no_such_route = || RouteChangeError::NoSuchRoute(name.to_owned());
            let current = engine.route_params(id).ok_or_else(no_such_route)?;
            let algorithm = engine.algorithm(id).ok_or_else(no_such_route)?;
            let params = crate::config::patch_route_controller(&current, algorithm, patch, name)
                .map_err(|e| {
                    if e.malformed {
                        RouteChangeError::Malformed(lines(&e.error))
                    } else {
                        RouteChangeError::Invalid(lines(&e.error))
                    }
                })?;
            Ok((params, file.cloned().unwrap_or(current)))
        };
        self.change_route(name, changed, "route parameters changed at runtime")
    }

    /// Withdraws the runtime change of the route `name`: the file's parameters, as
    /// last read, are in force again (applied as a change is, keeping the route's
    /// state). Returns the route's state after it (blocking, as
    /// [`update_route`](Self::update_route)).
    pub(crate) fn withdraw_change(
        &self,
        name: &str,
    ) -> Result<crate::engine::RouteSnapshot, RouteChangeError> {
        let file = |_: &Engine, _, file: Option<&ControllerParams>| {
            let file = file.ok_or_else(|| RouteChangeError::NoChange(name.to_owned()))?;
            Ok((file.clone(), file.clone()))
        };
        self.change_route(
            name,
            file,
            "runtime change withdrawn: the file's parameters are in force",
        )
    }

    /// Puts in force on the route `name` the parameters `params` gives from the engine,
    /// the route and the file's parameters if a runtime change is in force, beside the
    /// file's parameters: under the reload lock, checked by the file's rules for the
    /// route (its tiers and events), and remembered as a runtime change unless they are
    /// the file's.
    fn change_route(
        &self,
        name: &str,
        params: impl FnOnce(
            &Engine,
            crate::engine::RouteId,
            Option<&ControllerParams>,
        ) -> Result<(ControllerParams, ControllerParams), RouteChangeError>,
        done: &'static str,
    ) -> Result<crate::engine::RouteSnapshot, RouteChangeError> {
        let mut changed_at_runtime = self
            .reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let engine = self.engine();
        let no_such_route = || RouteChangeError::NoSuchRoute(name.to_owned());
        let id = engine.route_id(name).ok_or_else(no_such_route)?;
        let (params, file) = params(&engine, id, changed_at_runtime.get(name))?;
        let now = self.clock.now();
        if engine.route_params(id).as_ref() == Some(&params) {
            // Nothing to change (a `PUT` of the values in force, `{}`): not a change
            // to log, nor to remember as one.
            tracing::info!(route = %name, "route parameters unchanged: the values given are those in force");
            return engine.route_snapshot(id, now).ok_or_else(no_such_route);
        }
        let in_force = params != file;
        engine
            .update_route(id, params, now)
            .map_err(|e| RouteChangeError::Invalid(lines(&e)))?;
        if in_force {
            changed_at_runtime.insert(name.to_owned(), file);
        } else {
            changed_at_runtime.remove(name);
        }
        tracing::info!(route = %name, runtime_change = in_force, "{done}");
        engine.route_snapshot(id, now).ok_or_else(no_such_route)
    }

    /// How many routes run on a runtime change.
    pub(crate) fn runtime_changes(&self) -> usize {
        self.reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether the route `name` runs on a runtime change.
    pub(crate) fn has_runtime_change(&self, name: &str) -> bool {
        self.reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(name)
    }

    /// Reads the config file again and swaps the engine (blocking: it reads the file
    /// and builds the engine). See [`reload_async`](Self::reload_async).
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let result = self.reload_file();
        let counts = &self.reloads;
        match &result {
            Ok(_) => counts.applied.fetch_add(1, Ordering::Relaxed),
            // Nothing to reload is no reload: counted as refused, it held
            // `rocgate_config_last_reload_successful` at 0, and its alert firing, until a
            // restart, since no later reload can be applied.
            Err(error @ ReloadError::NoConfigFile) => {
                tracing::error!("reload refused, running config kept: {error}");
                return result;
            }
            Err(error) => {
                // Logged here, whoever asked: a refusal answered to an admin API
                // client was seen by nobody else.
                for e in error.messages() {
                    tracing::error!("reload refused, running config kept: {e}");
                }
                counts.refused.fetch_add(1, Ordering::Relaxed)
            }
        };
        counts.last_applied.store(result.is_ok(), Ordering::Relaxed);
        result
    }

    /// The reloads applied and refused so far.
    pub(crate) fn reload_counts(&self) -> &ReloadCounts {
        &self.reloads
    }

    /// [`reload`](Self::reload), but for counting and logging a refusal.
    fn reload_file(&self) -> Result<Reloaded, ReloadError> {
        let Some(path) = &self.source else {
            return Err(ReloadError::NoConfigFile);
        };
        let _one_at_a_time = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        let config = Config::load_regular(path)?;
        let mut changed_at_runtime = self
            .reloading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        #[allow(clippy::disallowed_methods)] // wall time enters here, once, to place events
        let wall_now = SystemTime::now();
        let before = self.engine.load();
        // Read now: a route the reload keeps is reconfigured in place.
        let changed: Vec<_> = std::mem::take(&mut *changed_at_runtime)
            .into_iter()
            .filter_map(|(name, file)| {
                let runtime = before.route_params(before.route_id(&name)?)?;
                Some((name, file, runtime))
            })
            .collect();
        // Each change the file left room for is offered to the reload, which puts it in
        // force on the new route in the same step as the file's other parameters: a
        // route kept never runs on the file's parameters, and its controller is rearmed
        // once at most (not at all where the parameters in force stay).
        let (mut runtime_changes_kept, mut runtime_changes_replaced) = (Vec::new(), Vec::new());
        let mut runtime_changes_dropped = Vec::new();
        let (mut offered, mut files) = (Vec::new(), Vec::new());
        // By name: a lookup per change, not a scan of the routes.
        let in_file: HashMap<&str, _> = if changed.is_empty() {
            HashMap::new()
        } else {
            config.routes.iter().map(|r| (r.name.as_str(), r)).collect()
        };
        for (name, file, runtime) in &changed {
            // A route the file no longer has takes its change with it.
            let Some(route) = in_file.get(name.as_str()) else {
                runtime_changes_dropped.push(name.clone());
                continue;
            };
            if route.controller == *runtime {
                // The file repeats the change: it is the file's now.
                continue;
            }
            if route.controller != *file {
                runtime_changes_replaced.push(name.clone());
                continue;
            }
            offered.push((name.clone(), runtime.clone()));
            files.push(file.clone());
        }
        let now = self.clock.now();
        let (next, refused) = match before.reload_keeping(&config, &offered, now, wall_now) {
            Ok(reloaded) => reloaded,
            Err(e) => {
                // Refused: the changes stay in force, as the running config does.
                changed_at_runtime.extend(changed.into_iter().map(|(n, file, _)| (n, file)));
                return Err(e.into());
            }
        };
        for RefusedChange { route, error } in &refused {
            for problem in error.to_string().lines() {
                tracing::warn!(route = %route, "the runtime change no longer fits the route: {problem}");
            }
        }
        let refused_routes: HashSet<&str> = refused.iter().map(|r| r.route.as_str()).collect();
        for ((name, _), file) in offered.into_iter().zip(files) {
            if refused_routes.contains(name.as_str()) {
                runtime_changes_replaced.push(name);
            } else {
                changed_at_runtime.insert(name.clone(), file);
                runtime_changes_kept.push(name);
            }
        }
        runtime_changes_replaced.sort();
        runtime_changes_dropped.sort();
        let next = Arc::new(next);
        // Followed before it decides: its partitioned routes built anew then hold
        // their share of `route_limit` from their first request, not the fleet's.
        #[cfg(feature = "redis")]
        if let Some(store) = &self.store {
            store.follow(&next);
        }
        self.collector
            .replace(now, || self.engine.replace(Arc::clone(&next)));
        #[cfg(feature = "redis")]
        if let Some(store) = &self.store {
            store.retain(&next);
        }
        tracing::info!(path = %path.display(), routes = config.routes.len(), "config reloaded");
        let events_ended = warn_ended_events(&config, wall_now);
        for route in &runtime_changes_kept {
            tracing::info!(
                route,
                "the route's runtime change (PUT /admin/routes) stays in force: the file left its parameters as they were"
            );
        }
        for route in &runtime_changes_replaced {
            tracing::warn!(
                route,
                "the reload replaced the route's runtime change (PUT /admin/routes) with the file's parameters"
            );
        }
        for route in &runtime_changes_dropped {
            tracing::warn!(
                route,
                "the reload dropped the route's runtime change (PUT /admin/routes): the file has no route of that name"
            );
        }
        let restart_required = needing_restart(&self.started, &config, &self.held);
        for section in &restart_required {
            tracing::warn!(
                section,
                "changed in the file, but takes effect only at a restart"
            );
        }
        Ok(Reloaded {
            restart_required,
            runtime_changes_kept,
            runtime_changes_replaced,
            runtime_changes_dropped,
            events_ended,
        })
    }
}

/// An error's lines, one problem each.
fn lines(e: &impl std::fmt::Display) -> Vec<String> {
    e.to_string().lines().map(str::to_owned).collect()
}

/// Why [`Reloader::update_route`] changed nothing.
#[derive(Debug)]
pub(crate) enum RouteChangeError {
    /// No route has this name.
    NoSuchRoute(String),
    /// The change's body is no change (not a JSON object of its fields, each of its
    /// JSON type): every problem, one a line.
    Malformed(Vec<String>),
    /// The change is refused: every problem, one a line.
    Invalid(Vec<String>),
    /// The route has no runtime change to withdraw.
    NoChange(String),
}

/// Fields of `[server]` and `[admin]` that `rocgate serve`'s flags set (`--listen`,
/// `--admin`, `--upstream`): they hold over the file's at start and at a restart with
/// the same flags, so a reload does not report a change the file makes to one as
/// waiting for a restart (see [`Proxy::hold`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldByFlags {
    /// `server.listen`, set by `--listen`.
    pub listen: Option<SocketAddr>,
    /// `admin.listen`, set by `--admin`.
    pub admin_listen: Option<SocketAddr>,
    /// `server.upstream`, set by `--upstream`, as
    /// [`check_upstream`](crate::config::check_upstream) returns it.
    pub upstream: Option<String>,
}

impl HeldByFlags {
    /// `server` with the held fields set to the flags' values.
    fn over(&self, server: &ServerConfig) -> ServerConfig {
        ServerConfig {
            listen: self.listen.unwrap_or(server.listen),
            admin_listen: self.admin_listen.unwrap_or(server.admin_listen),
            upstream: self
                .upstream
                .clone()
                .unwrap_or_else(|| server.upstream.clone()),
            ..server.clone()
        }
    }
}

/// The sections of `next` read only at start that differ from those of `started`, the
/// fields the command line holds left out.
fn needing_restart(started: &Config, next: &Config, held: &HeldByFlags) -> Vec<&'static str> {
    let (a, b) = (&held.over(&started.server), &held.over(&next.server));
    let server = |s: &ServerConfig| ServerConfig {
        admin_listen: a.admin_listen,
        admin_token: None,
        admin_allowed_hosts: Vec::new(),
        admin_reads: crate::config::AdminReads::Open,
        admin_wrong_tokens_burst: 0,
        admin_wrong_tokens_per_second: 0.0,
        ..s.clone()
    };
    [
        ("[server]", server(a) != server(b)),
        (
            "[admin]",
            (
                a.admin_listen,
                &a.admin_token,
                &a.admin_allowed_hosts,
                a.admin_reads,
            ) != (
                b.admin_listen,
                &b.admin_token,
                &b.admin_allowed_hosts,
                b.admin_reads,
            ) || (a.admin_wrong_tokens_burst, a.admin_wrong_tokens_per_second)
                != (b.admin_wrong_tokens_burst, b.admin_wrong_tokens_per_second),
        ),
        ("[hints]", started.hints != next.hints),
        ("[store]", started.store != next.store),
    ]
    .into_iter()
    .filter_map(|(section, changed)| changed.then_some(section))
    .collect()
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("listen", &self.listener.local_addr().ok())
            .field("admin", &self.admin.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// Binds both listeners and builds the engine from `config`, which was read from
    /// `source` (reloaded from there), or is built in (`None`: nothing to reload).
    /// A listener that cannot be opened, routes that are refused, or a shared store
    /// that cannot be set up is a [`BindError`] naming which.
    pub async fn bind(
        settings: ProxySettings,
        config: &Config,
        source: Option<PathBuf>,
    ) -> Result<Proxy, BindError> {
        let monotonic = MonotonicClock::new();
        tracing::info!(
            source = if monotonic.reads_tsc() { "tsc" } else { "os" },
            "clock"
        );
        Proxy::bind_with_clock(settings, config, source, Arc::new(monotonic)).await
    }

    /// [`bind`](Self::bind), with the engine and the forwarder on `clock` (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests that drive time).
    pub async fn bind_with_clock(
        settings: ProxySettings,
        config: &Config,
        source: Option<PathBuf>,
        clock: Arc<dyn Clock>,
    ) -> Result<Proxy, BindError> {
        let listener = listen(settings.listen).map_err(|source| BindError::Listen {
            addr: settings.listen,
            source,
        })?;
        let admin = TcpListener::bind(settings.admin_listen)
            .await
            .map_err(|source| BindError::AdminListen {
                addr: settings.admin_listen,
                source,
            })?;
        #[allow(clippy::disallowed_methods)] // wall time enters here, once, to place events
        let wall_now = SystemTime::now();
        let advisor = Arc::new(Advisor::new(&config.hints));
        let roc_histogram = metric::roc_sample_hook();
        let history = Arc::clone(&advisor);
        let engine = Engine::new(config, clock.now(), wall_now)?
            .with_transition_hook(Arc::new(log_transition))
            .with_sample_hook(Arc::new(move |route, report| {
                roc_histogram(route, report);
                history.on_slot(route, report);
            }));
        // The store's metric handles bind to the recorder installed now.
        #[cfg(feature = "redis")]
        let store = match config.store {
            crate::store::StoreConfig::Local => None,
            crate::store::StoreConfig::Redis(_) => {
                prometheus();
                open_store(config, &clock)?
            }
        };
        #[cfg(feature = "redis")]
        if let Some(store) = &store {
            advisor.share_with(store.clone());
        }
        #[cfg(not(feature = "redis"))]
        if config.store != crate::store::StoreConfig::Local {
            return Err(BindError::StoreNotBuilt);
        }
        // Its metrics go to the global recorder `prometheus` installs (or one
        // installed before it): the collector keeps its handles.
        let collector = metric::Collector::new().for_global_recorder();
        #[cfg(feature = "redis")]
        let collector = if store.is_some() {
            collector.with_shared_store()
        } else {
            collector
        };
        let engine = SharedEngine::new(engine);
        // The heartbeat's debits are decided at the base limits in force there, and
        // its partitioned routes hold their share of `route_limit`.
        #[cfg(feature = "redis")]
        if let Some(store) = &store {
            store.follow(&engine.load());
        }
        Ok(Proxy {
            listener,
            admin,
            settings,
            advisor,
            #[cfg(feature = "redis")]
            store: store.clone(),
            reloader: Reloader {
                engine,
                clock,
                source,
                #[cfg(feature = "redis")]
                store,
                started: Arc::new(Config {
                    routes: Vec::new(),
                    ..config.clone()
                }),
                held: Arc::default(),
                reading: Arc::default(),
                reloading: Arc::default(),
                reloads: Arc::default(),
                collector: Arc::new(collector),
            },
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The admin API's address.
    pub fn admin_addr(&self) -> io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    /// The tuning hints' history and rules (what `GET /admin/hints` answers from).
    pub fn advisor(&self) -> Arc<Advisor> {
        Arc::clone(&self.advisor)
    }

    /// Tells the proxy which fields of the file its settings took from elsewhere (the
    /// command line's flags), which a change in the file then does not reach: a reload
    /// leaves them out of [`Reloaded::restart_required`].
    pub fn hold(&mut self, held: HeldByFlags) {
        self.reloader.held = Arc::new(held);
    }

    /// What reloads the config; also gives the engine in force.
    pub fn reloader(&self) -> &Reloader {
        &self.reloader
    }

    /// What the end of [`Proxy::run`] does to the shared store, for a shutdown cut
    /// short before `run` gets there (`rocgate serve`'s second SIGTERM): removes this
    /// instance from the heartbeat set, so the other instances' shares grow at once
    /// rather than after three missed beats, having paid what its routes owe the
    /// shared buckets first (see `RedisStore::leave`).
    /// Bounded in time by three times the store's `timeout`; nothing to do without a
    /// shared store.
    pub fn leaving(&self) -> impl Future<Output = ()> + Send + 'static {
        #[cfg(feature = "redis")]
        let store = self.store.clone();
        async move {
            #[cfg(feature = "redis")]
            if let Some(store) = store {
                store.leave().await;
            }
        }
    }

    /// Serves until `shutdown` completes, then stops accepting and lets requests in
    /// flight finish for up to `shutdown_grace`.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let layer = AdmissionLayer::with_engine(
            self.reloader.engine.clone(),
            Arc::clone(&self.reloader.clock),
        )
        .trusted_proxies(self.settings.forward.resolver_networks())
        .trusted_hops(self.settings.forward.resolver.trusted_hops())
        .client_ip_header(self.settings.forward.resolver.header())
        .matched_route(true)
        .route_key(RouteKey::Normalized)
        .build();
        let in_flight = Arc::new(AtomicI64::new(0));
        let forwarder = Forwarder::new(
            self.settings.forward.clone(),
            Arc::clone(&self.reloader.clock),
            Arc::clone(&in_flight),
            self.advisor.meter(),
        )
        .keeping_keys_of(self.reloader.engine.clone());
        let lanes = forwarder.lanes();
        let upstream_requests = forwarder.upstream_requests();
        let via = forwarder.via();
        // The peers whose connections begin with a PROXY protocol header; IPv4-mapped
        // networks as the IPv4 ones they map, as peers are compared.
        let header_from: Vec<ipnet::IpNet> = match self.settings.proxy_protocol {
            ProxyProtocol::Off => Vec::new(),
            _ => self
                .settings
                .proxy_protocol_from
                .clone()
                .unwrap_or_else(|| self.settings.forward.resolver_networks())
                .into_iter()
                .map(crate::http::client_ip::canonical_net)
                .collect(),
        };
        // The trusted proxies' and the load balancers' connections carry many clients:
        // not counted (the clients a header names are, but for a trusted proxy).
        let connections = Arc::new(
            connections::ClientConnections::new(self.settings.max_connections).per_client(
                self.settings.max_connections_per_client,
                self.settings.forward.resolver_networks(),
                header_from.clone(),
            ),
        );
        // Each client connection gets its own forwarder (its lane, its peer), behind
        // the shared layer.
        #[cfg(feature = "redis")]
        let shared_gate = self.store.clone().map(|store| {
            Arc::new(shared::SharedGate {
                store,
                engine: self.reloader.engine.clone(),
                clock: Arc::clone(&self.reloader.clock),
            })
        });
        // Made in the connection's task, once its peer is known (a PROXY protocol
        // header names it).
        #[cfg(feature = "redis")]
        let service_for = Arc::new(move |forwarder: Forwarder, peer, forwards| {
            shared::Front::new(
                handing_route(
                    layer.layer(forwarder.clone()).for_peer(peer, forwards),
                    &forwarder,
                ),
                shared_gate.clone(),
                forwarder,
            )
        });
        #[cfg(not(feature = "redis"))]
        let service_for = Arc::new(move |forwarder: Forwarder, peer, forwards| {
            let service = layer.layer(forwarder.clone()).for_peer(peer, forwards);
            handing_route(service, &forwarder)
        });
        // The partitioned routes' idle keys are swept on a thread of their own, not by
        // the request that rolls a route's window, which waited for it (about 20 ms at
        // 1,000,000 keys). Without a thread, requests go on sweeping.
        let sweeper = Sweeper::spawn(
            self.reloader.engine.clone(),
            Arc::clone(&self.reloader.clock),
        )
        .inspect_err(|error| {
            tracing::warn!(%error, "no sweeper thread: requests sweep the idle keys");
        })
        .ok();
        let prometheus = prometheus();
        let upkeep = tokio::spawn({
            let handle = prometheus.clone();
            let reloader = self.reloader.clone();
            async move {
                let mut every = tokio::time::interval(crate::http::UPKEEP_EVERY);
                loop {
                    every.tick().await;
                    handle.run_upkeep();
                    // Events follow the wall clock, should it part from the engine's;
                    // silent routes show where their controllers stand.
                    reloader.upkeep();
                }
            }
        });
        let ticker = tokio::spawn({
            let advisor = Arc::clone(&self.advisor);
            let reloader = self.reloader.clone();
            async move {
                let mut last = reloader.clock().now();
                advisor.tick(&reloader.engine(), last);
                loop {
                    // Asked again at least every second: a reload may bring an event
                    // whose edge comes sooner, and events follow the wall clock.
                    let due = advisor.next_tick(&reloader.engine(), last);
                    let wait = due.saturating_since(reloader.clock().now());
                    tokio::time::sleep(wait.clamp(HINTS_WAIT_LEAST, HINTS_WAIT_MOST)).await;
                    let now = reloader.clock().now();
                    if now >= due {
                        advisor.tick_due(&reloader.engine(), now);
                        last = now;
                    }
                }
            }
        });
        // Set once shutdown begins: `/readyz` says so from then on.
        let shutting_down = Arc::new(AtomicBool::new(false));
        // The admin API's connections closed to make room at its cap, which its
        // `/metrics` exports.
        let admin_connections = Arc::<connections::Reclaimable>::default();
        let admin_router = admin::router(admin::AdminState {
            reloader: self.reloader.clone(),
            shutting_down: Arc::clone(&shutting_down),
            advisor: Arc::clone(&self.advisor),
            #[cfg(feature = "redis")]
            store: self.store.clone(),
            token: self.settings.admin_token.clone(),
            allowed_hosts: self.settings.admin_allowed_hosts.clone().into(),
            reads: self.settings.admin_reads,
            read_refusals: Arc::default(),
            via,
            host_refusals: Arc::default(),
            guesses: Arc::new(guesses::Guesses::new(guesses::GuessBound {
                burst: self.settings.admin_wrong_tokens_burst,
                per_second: self.settings.admin_wrong_tokens_per_second,
            })),
            answering: Arc::default(),
            refusals: Arc::default(),
            metrics: Arc::new(admin::Exporter {
                handle: prometheus,
                collector: Arc::clone(&self.reloader.collector),
                in_flight,
                lanes,
                upstream_requests,
                connections: Arc::clone(&connections),
                admin_connections: Arc::clone(&admin_connections),
                errors_registered: std::sync::Mutex::default(),
            }),
        });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.settings.header_read_timeout);
        // HTTP/2 has no head timeout: a connection whose peer sends nothing for that
        // long is pinged, and closed if the peer does not answer within as long.
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.settings.header_read_timeout)
            .keep_alive_timeout(self.settings.header_read_timeout);
        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin = tokio::spawn(admin::serve(
            self.admin,
            admin_router,
            admin_connections,
            builder.clone(),
            self.settings.header_read_timeout,
            self.settings.idle_timeout,
            async {
                let _ = admin_stopped.await;
            },
        ));

        // Each connection task holds a receiver: told to stop, it shuts its connection
        // down gracefully; the sender's `closed` is the last one ending.
        let (stop, stopping) = tokio::sync::watch::channel(());
        // Told once the grace period is over: each connection still open drops itself.
        let (abort, aborting) = tokio::sync::watch::channel(());
        let clock = Arc::clone(&self.reloader.clock);
        let mut limit_warned: Option<crate::clock::Nanos> = None;
        let mut accept_failures = AcceptFailures::default();
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        accept_failures.failed("accept failed", &e);
                        // Out of file descriptors, accept fails again at once for as
                        // long as connections wait: retried straight away, it would
                        // spin a core and flood the log.
                        if !is_connection_error(&e) {
                            tokio::select! {
                                () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                                () = &mut shutdown => break,
                            }
                        }
                        continue;
                    }
                },
                () = &mut shutdown => break,
            };
            let Some(admitted) = connections.admit(peer.ip()) else {
                if connections.warn_refusal(clock.now(), LIMIT_WARN_EVERY) {
                    tracing::warn!(
                        %peer,
                        max_connections_per_client = self.settings.max_connections_per_client,
                        refused = connections.refused(),
                        "a client address holds max_connections_per_client: its new \
                         connections are closed as accepted"
                    );
                }
                continue;
            };
            let place = match connections.try_acquire() {
                Some(place) => place,
                None => {
                    // At the cap: this connection waits for a place, those behind it in
                    // the listen backlog, and the connections idle longest are asked
                    // to close to make room.
                    let times_reached = connections.reached();
                    let now = clock.now();
                    if limit_warned.is_none_or(|at| now.saturating_since(at) >= LIMIT_WARN_EVERY) {
                        limit_warned = Some(now);
                        tracing::warn!(
                            max_connections = connections.max(),
                            times_reached,
                            "client connection limit reached: idle keep-alive connections \
                             are closed to make room, and new connections wait until one \
                             closes"
                        );
                    }
                    let waited = connections
                        .reclaimable()
                        .wait_for_place(connections.acquire(), &mut shutdown)
                        .await;
                    let Some(place) = waited else { break };
                    place
                }
            };
            let slot = connections.open_in(place, admitted);
            let _ = stream.set_nodelay(true);
            // A connection from `proxy_protocol_from` begins with the PROXY protocol
            // header, if `proxy_protocol` expects one; any other peer's is read as HTTP.
            let expects_header = header_from
                .iter()
                .any(|n| n.contains(&peer.ip().to_canonical()));
            let proxy_protocol = self.settings.proxy_protocol;
            let base = forwarder.clone();
            let service_for = Arc::clone(&service_for);
            let counts = Arc::clone(&connections);
            // Read if the client a header names is refused at its cap: not cloned for
            // a connection that begins with no header.
            let clock = expects_header.then(|| Arc::clone(&clock));
            let max_connections_per_client = self.settings.max_connections_per_client;
            let header_timeout = self.settings.header_read_timeout;
            let idle_timeout = self.settings.idle_timeout;
            let lingering = connections::Lingering {
                time: self.settings.lingering_time,
                timeout: self.settings.lingering_timeout,
                bytes: self.settings.lingering_bytes,
                closes: Arc::clone(connections.lingering()),
            };
            let reloader = self.reloader.clone();
            let mut builder = builder.clone();
            // The connection's request heads share one timer, not one each; each but
            // the first is timed from its first byte, which the socket records.
            let arrivals = connections::HeadTimer::time_heads(&mut builder, header_timeout);
            let reclaimable = Arc::clone(connections.reclaimable());
            let mut stopping = stopping.clone();
            let mut aborting = aborting.clone();
            tokio::spawn(async move {
                let _slot = slot;
                // Idle since accepted until its first byte: at the cap, a connection
                // that has sent nothing is closed to make room as an idle one is, with
                // no answer (nothing was asked).
                let activity = connections::Activity::new();
                let fresh =
                    reclaimable.register(Arc::clone(&activity), Some(Arc::clone(&arrivals)));
                // The client its proxy names, if it begins with a PROXY protocol
                // header, else the socket's peer; whether that peer's forwarding
                // headers may be read (a trusted proxy's, unless its header named no
                // client: its requests are then its relayed client's, as written);
                // then its protocol.
                let opened = async {
                    if !expects_header {
                        let protocol =
                            protocol_known_within(&stream, header_timeout, &arrivals).await?;
                        return Some((peer, true, None, protocol));
                    }
                    let named =
                        proxy_header::client_of(&stream, proxy_protocol, header_timeout).await;
                    let client = match named {
                        Ok(Some(client)) => client,
                        Ok(None) => {
                            let protocol =
                                protocol_known_within(&stream, header_timeout, &arrivals).await?;
                            return Some((peer, false, None, protocol));
                        }
                        Err(refusal) => {
                            counts.header_refused(&refusal);
                            // A load balancer that sends no header, or a bad one, has
                            // every connection closed: warned of, a line a period.
                            let now = clock.as_ref().map(|clock| clock.now());
                            // An empty one is not: a health check, or a balancer that
                            // sends its header with its client's first bytes.
                            let reason = refusal.reason().filter(|_| refusal.warns());
                            let warned = reason.zip(now).and_then(|(reason, now)| {
                                Some((reason, counts.warn_header_refusal(now, LIMIT_WARN_EVERY)?))
                            });
                            match warned {
                                Some((reason, unwarned)) => tracing::warn!(
                                    %peer,
                                    reason,
                                    unwarned,
                                    "connection closed: {refusal} (one such line \
                                     every 10 s at most, `unwarned` those left out \
                                     since the last)"
                                ),
                                None => tracing::debug!(%peer, "connection closed: {refusal}"),
                            }
                            return None;
                        }
                    };
                    // A client its proxy names counts against its own address's
                    // `max_connections_per_client` (its proxy's connections are not).
                    let admitted = match counts.admit_named(client.ip()) {
                        Some(admitted) => admitted,
                        None => {
                            let now = clock.as_ref().map(|clock| clock.now());
                            if now.is_some_and(|now| counts.warn_refusal(now, LIMIT_WARN_EVERY)) {
                                tracing::warn!(
                                    %client,
                                    proxy = %peer,
                                    max_connections_per_client,
                                    refused = counts.refused(),
                                    "a client address holds max_connections_per_client: \
                                     its new connections are closed once their PROXY \
                                     protocol header names it"
                                );
                            }
                            return None;
                        }
                    };
                    let protocol =
                        protocol_known_within(&stream, header_timeout, &arrivals).await?;
                    Some((client, true, Some(admitted), protocol))
                };
                // A connection that has sent nothing has no request in flight: shutdown
                // closes it at once rather than wait for its first byte.
                let opened = tokio::select! {
                    biased;
                    known = opened => known,
                    () = fresh.asked_before_first_byte(&stream) => {
                        tracing::debug!(%peer, "connection that had sent nothing closed to make room at max_connections");
                        None
                    }
                    _ = stopping.changed() => None,
                };
                let Some((peer, forwards, _client, protocol)) = opened else {
                    return;
                };
                let (forwarder, driver) = base.for_connection(peer, forwards);
                let checks = forwarder.clone();
                let service = service_for(forwarder, peer, forwards);
                // hyper's socket, handed back once hyper is done with it.
                let back = Arc::new(connections::Handback::default());
                // The connection's service, its lane and their timers live in this
                // block: an upgraded connection's tunnel runs after it, without them,
                // and so does a lingering close.
                let (upgraded, ended) = async {
                    // Asked to close when idle, to make room at the cap, until served:
                    // an h2c connection has no head to begin.
                    let registered = match protocol {
                        Protocol::Http1 => fresh,
                        Protocol::Http2 => {
                            drop(fresh);
                            reclaimable.register(Arc::clone(&activity), None)
                        }
                    };
                    let streams = connections::Streams::new();
                    let svc = hyper::service::service_fn({
                        let activity = Arc::clone(&activity);
                        let streams = Arc::clone(&streams);
                        move |req: http::Request<Incoming>| {
                            let busy = activity.begin();
                            let h2 = (req.version() == http::Version::HTTP_2)
                                .then(|| Arc::clone(&streams));
                            if h2.is_none() {
                                activity.carries_body(!http_body::Body::is_end_stream(req.body()));
                            }
                            let head = req.method() == http::Method::HEAD;
                            let refused = checks.refusal(&req);
                            let response = match refused {
                                Some(e) => Err(refuse(&reloader.engine(), &req, e)),
                                None => {
                                    // The peer is the service's own (`for_peer`), as
                                    // the forwarder's. Readied before it is called
                                    // (`ready_and_call`), here and at once: the
                                    // admission layer is always ready (it readies the
                                    // `Forwarder` itself, in its response future), and
                                    // so is the front over it. Readied in the response
                                    // future instead (`oneshot`), a refused request's
                                    // body was dropped after hyper had looked at it,
                                    // and a refused chunked body left the connection
                                    // open (`a_rejected_requests_unread_body_is_not_
                                    // read_as_the_next_request`).
                                    let called = ready_and_call(service.clone(), req);
                                    debug_assert!(
                                        called.is_ok(),
                                        "the admission service is always ready"
                                    );
                                    Ok(called)
                                }
                            };
                            async move {
                                let mut r = match response {
                                    Ok(Ok(called)) => called.await?,
                                    Ok(Err(unready)) => unready.await?,
                                    Err(refused) => refused,
                                };
                                if head {
                                    leave_out_body(&mut r);
                                }
                                // Room wanted at the cap: this HTTP/1.1 connection closes
                                // after this answer, which says so to its client.
                                if h2.is_none()
                                    && r.status() != http::StatusCode::SWITCHING_PROTOCOLS
                                    && busy.close_after_answer()
                                {
                                    r.headers_mut().insert(
                                        http::header::CONNECTION,
                                        http::HeaderValue::from_static("close"),
                                    );
                                }
                                busy.hand_over_tunnel(&mut r);
                                let r = busy.hold_through_body(r);
                                Ok::<_, std::convert::Infallible>(match h2 {
                                    Some(streams) => streams.watch(r),
                                    None => r.map(connections::ClientBody::Direct),
                                })
                            }
                        }
                    });
                    let writes = connections::WriteStall::new();
                    let stream = connections::Watched::new(
                        stream,
                        Arc::clone(&writes),
                        arrivals,
                        Arc::clone(&back),
                    );
                    let conn = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                        .into_owned();
                    tokio::pin!(conn, driver);
                    let idle = activity.idle(idle_timeout);
                    tokio::pin!(idle);
                    // A client that takes nothing of what is written for as long.
                    let stalled = writes.stalled(idle_timeout);
                    tokio::pin!(stalled);
                    // An HTTP/2 stream whose response the client leaves unread as long.
                    let sweep = streams.sweep(idle_timeout);
                    tokio::pin!(sweep);
                    let asked = registered.asked();
                    tokio::pin!(asked);
                    let probe = stopping.clone();
                    let stopping = connections::Stopping::new(stopping.changed(), probe);
                    tokio::pin!(stopping);
                    let probe = aborting.clone();
                    let aborting = connections::Stopping::new(aborting.changed(), probe);
                    tokio::pin!(aborting);
                    let mut closing = false;
                    let mut upgraded = None;
                    // How the connection ended, unless hyper ended it: it is then
                    // closed at once, with no lingering close.
                    let mut cut = None;
                    // The lane's upstream connection is polled in this task, beside the
                    // client's, each side when woken; it closes when the client
                    // connection ends.
                    let client = async {
                        loop {
                            tokio::select! {
                                // In order: no random start for every wake of the task.
                                biased;
                                served = conn.as_mut() => {
                                    // Completed after a 101: hyper has handed it over.
                                    upgraded = activity.take_tunnel();
                                    break served;
                                }
                                () = stalled.as_mut() => {
                                    tracing::debug!(%peer, "connection closed: the client took nothing for idle_timeout");
                                    cut = Some(Ended::Cut);
                                    break Ok(());
                                }
                                () = idle.as_mut(), if !closing => {
                                    tracing::debug!(%peer, "idle connection closed");
                                    // Gone idle: the last request's body was read through.
                                    activity.body_read();
                                    closing = true;
                                    conn.as_mut().graceful_shutdown();
                                }
                                () = asked.as_mut(), if !closing => {
                                    tracing::debug!(%peer, "idle connection closed to make room at max_connections");
                                    // Idle: the last request's body was read through.
                                    activity.body_read();
                                    closing = true;
                                    conn.as_mut().graceful_shutdown();
                                }
                                () = stopping.as_mut(), if !closing => {
                                    closing = true;
                                    cut = Some(Ended::Stopping);
                                    conn.as_mut().graceful_shutdown();
                                }
                                () = aborting.as_mut() => {
                                    cut = Some(Ended::Cut);
                                    break Ok(());
                                }
                                never = sweep.as_mut() => match never {},
                            }
                        }
                    };
                    // The lane's driver never completes: the connection ends with the
                    // client's side.
                    let upstream = async {
                        match driver.as_mut().await {}
                    };
                    let served = crate::beside::Beside::new(client, upstream).await;
                    if let Err(e) = served {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    let ended = cut.unwrap_or(Ended::ByHyper {
                        unread_body: activity.may_have_unread_body(),
                    });
                    (upgraded, ended)
                }
                .await;
                // hyper has dropped the socket (the block above, which held the
                // connection, is over), unless an upgrade took it.
                if let (None, Ended::ByHyper { unread_body }) = (&upgraded, ended) {
                    if let Some(stream) = back.take() {
                        // Counted against `max_connections` until done; not held
                        // through a shutdown.
                        let shutdown = async {
                            let _ = stopping.changed().await;
                        };
                        connections::linger(stream, unread_body, lingering, shutdown).await;
                    }
                }
                // A tunnel holds the connection's place, and its request's concurrency
                // permit, until it closes, or until the grace period after shutdown.
                if let Some(tunnel) = upgraded {
                    let probe = aborting.clone();
                    let aborting = connections::Stopping::new(aborting.changed(), probe);
                    tokio::select! {
                        biased;
                        () = aborting => tracing::debug!(%peer, "tunnel dropped at shutdown"),
                        () = tunnel.run(idle_timeout) => {}
                    }
                }
            });
        }
        shutting_down.store(true, Ordering::Relaxed);
        drop(self.listener);
        drop((stopping, aborting));
        tracing::info!(connections = connections.open(), "shutting down");
        let _ = stop.send(());
        let drained = tokio::time::timeout(self.settings.shutdown_grace, stop.closed()).await;
        if drained.is_err() {
            tracing::warn!("shutdown grace period over; dropping remaining connections");
            let _ = abort.send(());
            // Each drops its connection at its next poll.
            let _ = tokio::time::timeout(ABORT_WAIT, stop.closed()).await;
        }
        let _ = admin_stop.send(());
        let _ = admin.await;
        upkeep.abort();
        // Dropping it joins its thread, which may be in a sweep (about 20 ms at
        // 1,000,000 keys): a blocking wait, kept off this task's worker.
        if let Some(sweeper) = sweeper {
            let _ = tokio::task::spawn_blocking(move || drop(sweeper)).await;
        }
        #[cfg(feature = "redis")]
        if let Some(store) = &self.store {
            store.leave().await;
        }
        ticker.abort();
        Ok(())
    }
}

/// `service`, a client connection's, handing the route of each request it admits to
/// that connection's `forwarder` through the forwarder's route slot.
fn handing_route(
    service: crate::http::AdmissionService<Forwarder>,
    forwarder: &Forwarder,
) -> crate::http::AdmissionService<Forwarder> {
    match forwarder.route_slot() {
        Some(slot) => service.handing_route(slot),
        None => service,
    }
}

/// How a client connection's serving ended.
#[derive(Clone, Copy, Debug)]
enum Ended {
    /// hyper ended it (it answered a request that closes the connection, the client
    /// closed, a timeout or an error): the client may still be sending, after a
    /// request whose body was not read through if `unread_body`.
    ByHyper { unread_body: bool },
    /// Shutdown began: the connection was told to close, and is not held longer.
    Stopping,
    /// Dropped by the proxy: the client took nothing of its answer, the connection's
    /// upstream lane ended, or the grace period after shutdown is over.
    Cut,
}

/// The process-wide Prometheus recorder, installed on first use. If another recorder
/// is installed already (a library user's), rocgate's metrics go to that one and
/// `/metrics` shows only what this handle sees.
fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full(metric::ROC_OBSERVED.into()),
                    &metric::ROC_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(metric::UPSTREAM_DURATION.into()),
                        &metric::DURATION_BUCKETS,
                    )
                })
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder is installed already: /metrics shows nothing");
            } else {
                metric::describe();
            }
            handle
        })
        .clone()
}

/// The Redis store, if the config asks for one. It connects in the background: a
/// Redis that is down at start leaves the proxy serving in fallback.
#[cfg(feature = "redis")]
fn open_store(
    config: &Config,
    clock: &Arc<dyn Clock>,
) -> Result<Option<crate::store::redis::RedisStore>, crate::store::redis::StoreError> {
    match &config.store {
        crate::store::StoreConfig::Local => Ok(None),
        crate::store::StoreConfig::Redis(c) => {
            let store = crate::store::redis::RedisStore::connect(c, Arc::clone(clock))?;
            tracing::info!(
                instance = store.instance_id(),
                prefix = c.key_prefix,
                "shared store: redis"
            );
            Ok(Some(store))
        }
    }
}

/// `service` called with `req` if it is ready now, as `rocgate serve`'s admission
/// service always is (and the front over it); else the two, to be readied and called
/// in the response future, as tower's `Oneshot` does, rather than called unready. Readied
/// later, a refused request's body would be dropped late (see its call), so serve
/// asserts, in a debug build, that its service was ready.
fn ready_and_call<S, R>(mut service: S, req: R) -> Result<S::Future, tower::util::Oneshot<S, R>>
where
    S: Service<R, Error = std::convert::Infallible>,
{
    let waker = std::task::Waker::noop();
    match service.poll_ready(&mut std::task::Context::from_waker(waker)) {
        std::task::Poll::Ready(Ok(())) => Ok(service.call(req)),
        std::task::Poll::Ready(Err(never)) => match never {},
        std::task::Poll::Pending => Err(tower::util::Oneshot::new(service, req)),
    }
}

/// The answer to a request refused for its head alone ([`Forwarder::refusal`]), before
/// admission: counted under the route it would have taken, as the forwarder counts
/// what it refuses.
fn refuse<B>(
    engine: &Engine,
    req: &http::Request<B>,
    e: ProxyError,
) -> http::Response<axum::body::Body> {
    let route = engine
        .route_for(req.method().as_str(), req.uri().path())
        .and_then(|id| engine.route_label(id))
        .unwrap_or_else(|| Arc::from(UNMATCHED_ROUTE));
    tracing::debug!(error = %e, route = %route, "request refused before admission");
    metrics::counter!(metric::UPSTREAM_ERRORS, "route" => route, "kind" => e.kind()).increment(1);
    e.into_response()
}

/// Leaves out the body of a response to a HEAD: one rocgate answered itself (a
/// rejection, an error), as an upstream's answer to a HEAD has none. hyper's HTTP/1
/// server sends no body to a HEAD, its HTTP/2 server sends what it is given, in DATA
/// frames a HEAD's stream must not carry (the client resets it). The `Content-Length`
/// stays the one a GET would get.
fn leave_out_body(res: &mut http::Response<axum::body::Body>) {
    use http_body::Body as _;
    if res.body().is_end_stream() {
        return;
    }
    if !res.headers().contains_key(http::header::CONTENT_LENGTH) {
        if let Some(length) = res.body().size_hint().exact() {
            res.headers_mut()
                .insert(http::header::CONTENT_LENGTH, length.into());
        }
    }
    *res.body_mut() = axum::body::Body::empty();
}

/// Logs a controller transition.
fn log_transition(route: &str, t: &Transition) {
    tracing::info!(
        route,
        from = t.from.as_str(),
        to = t.to.as_str(),
        roc = t.roc,
        limit_rps = t.limit_rps,
        "controller transition"
    );
}

/// How long `run` waits, after the grace period, for the connections told to drop
/// themselves (each does at its task's next poll).
const ABORT_WAIT: Duration = Duration::from_secs(1);

/// The least the hints timer sleeps between two looks at the clock (a tick due now
/// waits this long, so that clocks apart cannot make it spin).
const HINTS_WAIT_LEAST: Duration = Duration::from_millis(1);

/// The most the hints timer sleeps before it asks again when its next tick is due.
const HINTS_WAIT_MOST: Duration = Duration::from_secs(1);

/// How often, at most, reaching `max_connections` (or a client address's
/// `max_connections_per_client`) is logged.
const LIMIT_WARN_EVERY: Duration = Duration::from_secs(10);

/// Connections the kernel may hold complete for the proxy while it does not accept
/// them (at the `max_connections` cap, or in a burst between two accepts). The
/// standard library's and tokio's `bind` ask for 128; nginx asks for 511 on Linux.
/// The kernel lowers it to `net.core.somaxconn` (4096 on current kernels).
pub const LISTEN_BACKLOG: u32 = 1024;

/// Binds the client listener with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as `bind`
/// sets on Unix, so a restart binds while the last run's connections time out).
fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How often, at most, a listener's failures to accept are logged.
const ACCEPT_WARN_EVERY: Duration = Duration::from_secs(10);

/// A listener's failures to accept, logged at most once every [`ACCEPT_WARN_EVERY`]:
/// out of file descriptors, every retry fails for as long as connections wait.
#[derive(Debug, Default)]
pub(crate) struct AcceptFailures {
    /// When the last line was logged.
    logged_at: Option<tokio::time::Instant>,
    /// Failures since then.
    unlogged: u64,
}

impl AcceptFailures {
    /// Counts a failure, and logs it as `what` with the failures since the last line
    /// if that was [`ACCEPT_WARN_EVERY`] ago.
    pub(crate) fn failed(&mut self, what: &str, e: &io::Error) {
        self.unlogged += 1;
        let now = tokio::time::Instant::now();
        if self
            .logged_at
            .is_some_and(|at| now.duration_since(at) < ACCEPT_WARN_EVERY)
        {
            return;
        }
        self.logged_at = Some(now);
        let failures = std::mem::take(&mut self.unlogged);
        tracing::warn!(
            error = %e,
            failures,
            "{what} (failures counts those since the last such line, at most one every {}s)",
            ACCEPT_WARN_EVERY.as_secs()
        );
    }
}

/// How long the accept loop waits after a failure that is not one connection's.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Whether an accept error concerns only the connection being accepted (the next one
/// may be accepted at once), as hyper's and axum's servers tell them apart.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// HTTP/2's connection preface (RFC 9113 §3.4): hyper reads it whole, with no timeout
/// of its own, to tell an h2c connection from an HTTP/1.1 one.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How often a connection whose bytes so far begin HTTP/2's preface, and do not yet
/// hold it whole, is looked at again. Clients send the preface in one write: only a
/// client that stops within it (a slowloris) is looked at more than once.
const PREFACE_LOOK_EVERY: Duration = Duration::from_millis(50);

/// The protocol a client connection speaks, as its first bytes tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// HTTP/1.1 (or 1.0).
    Http1,
    /// h2c: HTTP/2's preface came whole.
    Http2,
}

/// Waits until a connection has sent enough to tell its protocol: bytes that do not
/// begin HTTP/2's preface (HTTP/1.1, whose head hyper then times), or the preface
/// whole; its first bytes, as they come, are recorded in `first`. `None` if the peer
/// closes, or sends nothing or too little in time: hyper would wait for the rest of a
/// preface, held open, until `idle_timeout`.
async fn protocol_known_within(
    stream: &TcpStream,
    timeout: Duration,
    first: &connections::Arrivals,
) -> Option<Protocol> {
    let mut seen = [0u8; H2_PREFACE.len()];
    let known = async {
        loop {
            let peeked = stream.peek(&mut seen).await;
            if matches!(peeked, Ok(n) if n > 0) {
                first.read();
            }
            match peeked {
                Ok(0) | Err(_) => return None,
                Ok(n) if seen[..n] != H2_PREFACE[..n] => return Some(Protocol::Http1),
                Ok(n) if n == H2_PREFACE.len() => return Some(Protocol::Http2),
                // Still within the preface; what was read stays unread for hyper.
                Ok(_) => tokio::time::sleep(PREFACE_LOOK_EVERY).await,
            }
        }
    };
    tokio::time::timeout(timeout, known).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::ready_and_call;
    use std::convert::Infallible;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};

    /// Not ready when first asked (it wakes its task at once), ready after; counts
    /// the calls made while it was not ready, and all calls.
    #[derive(Default)]
    struct ReadyOnSecondAsk {
        asked: u32,
        unready_calls: Arc<AtomicU32>,
        calls: Arc<AtomicU32>,
    }

    impl tower::Service<()> for ReadyOnSecondAsk {
        type Response = ();
        type Error = Infallible;
        type Future = std::future::Ready<Result<(), Infallible>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            self.asked += 1;
            if self.asked == 1 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            if self.asked < 2 {
                self.unready_calls.fetch_add(1, Ordering::SeqCst);
            }
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    /// Serve's service is called only once ready: one not ready when a request comes
    /// is readied in the response future, then called, as tower asks. It used to be
    /// called at once, ready or not (a debug build asserted it was ready, a release
    /// build went on and called it unready).
    #[test]
    fn a_service_not_ready_is_readied_before_it_is_called() {
        let service = ReadyOnSecondAsk::default();
        let (unready_calls, calls) = (
            Arc::clone(&service.unready_calls),
            Arc::clone(&service.calls),
        );
        let Err(mut later) = ready_and_call(service, ()) else {
            panic!("called at once, not ready");
        };
        assert_eq!(calls.load(Ordering::SeqCst), 0, "not called yet");
        let waker = std::task::Waker::noop();
        let polled = Pin::new(&mut later).poll(&mut Context::from_waker(waker));
        assert!(polled.is_ready(), "readied, then called");
        assert_eq!(
            (
                unready_calls.load(Ordering::SeqCst),
                calls.load(Ordering::SeqCst)
            ),
            (0, 1)
        );
    }

    /// A service ready at once is called at once.
    #[test]
    fn a_ready_service_is_called_at_once() {
        let service = ReadyOnSecondAsk {
            asked: 1,
            ..ReadyOnSecondAsk::default()
        };
        let calls = Arc::clone(&service.calls);
        assert!(ready_and_call(service, ()).is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
