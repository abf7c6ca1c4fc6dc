//! [`AdmissionLayer`]: the tower layer, its builder, and the state all clones share.

use super::client_ip::{ClientIpResolver, EndedAt, Fallback, PeerAddr};
use super::decided::Mark;
use super::service::AdmissionService;
use crate::clock::{Clock, MonotonicClock, Nanos};
use crate::config::{ClientIpHeader, Config, ConfigError, Partition};
use crate::engine::{Engine, Key, RouteId, TableKey};
use crate::limiter::{Admit, Decision, HoldClock, Pace};
use arc_swap::ArcSwap;
use axum::extract::{ConnectInfo, MatchedPath, OriginalUri};
use http::{HeaderValue, Request};
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How a request is mapped to a route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteKey {
    /// The config's route matching (method and path pattern), in config order, on the
    /// request's whole path (axum's `OriginalUri` inside a nested router) as written,
    /// as the service the layer wraps routes it
    /// ([`Engine::route_for_written`](crate::engine::Engine::route_for_written)).
    #[default]
    Config,
    /// The config's route matching on the path normalized, without its segments'
    /// parameters ([`Engine::route_for`](crate::engine::Engine::route_for)), as
    /// `rocgate serve` matches it: for a layer in front of a service that routes on the
    /// normalized path (a proxy to nginx, Apache or Spring), which would otherwise
    /// serve another spelling of a route's path past its limit.
    Normalized,
    /// axum's `MatchedPath` (the route template, such as `/api/items/{id}`) matched
    /// against the config's patterns; requests without one match no route. Never the
    /// raw path.
    MatchedPath,
}

/// The rocgate route that admitted a request, as a request extension seen by the
/// inner service (handlers; `rocgate serve`'s forwarder, for a request it is not
/// handed the route of directly): the name from config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatchedRoute(pub Arc<str>);

/// An engine that can be replaced while requests run (config reload), shared by
/// layers, an admin API and a reloader: every request loads the current one once and
/// uses it throughout. Cloning is cheap and every clone sees the same engine.
///
/// ```
/// use rocgate::clock::Nanos;
/// use rocgate::config::{Config, RouteConfig, RouteMatch};
/// use rocgate::engine::Engine;
/// use rocgate::http::SharedEngine;
/// use std::time::UNIX_EPOCH;
///
/// let config = Config::new(vec![RouteConfig::new("order", RouteMatch::prefix("/"))]);
/// let shared = SharedEngine::new(Engine::new(&config, Nanos::ZERO, UNIX_EPOCH)?);
/// let mut reloaded = config.clone();
/// reloaded.routes[0].controller.base_limit_rps = 300.0;
/// let next = shared.load().reload(&reloaded, Nanos::ZERO, UNIX_EPOCH)?;
/// shared.replace(next);
/// let engine = shared.load();
/// let order = engine.route_id("order").unwrap();
/// assert_eq!(engine.route_params(order).map(|p| p.base_limit_rps), Some(300.0));
/// # Ok::<(), rocgate::config::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct SharedEngine(Arc<ArcSwap<Engine>>, Arc<Mark>);

impl SharedEngine {
    /// Shares `engine`.
    pub fn new(engine: Engine) -> Self {
        SharedEngine(
            Arc::new(ArcSwap::from_pointee(engine)),
            Arc::new(Mark::new()),
        )
    }

    /// The mark this shared engine (and its clones) leaves on the requests its layers
    /// admit, which tells them from every other engine's while it lives: a layer finds
    /// by it whether its engine has decided a request already.
    #[inline]
    pub(crate) fn mark(&self) -> &Mark {
        &self.1
    }

    /// The engine in force now. Requests that loaded the one before keep it until
    /// they finish.
    pub fn load(&self) -> Arc<Engine> {
        self.0.load_full()
    }

    /// Puts `engine` in force for every request that starts from now on (typically
    /// one built by [`Engine::reload`] from the engine in force) and returns the one
    /// it replaces.
    /// A [`RouteId`] kept from the engine replaced still names its route in the new
    /// one if the reload kept the route's state, and no route otherwise (see
    /// [`RouteId`]): look routes up on the engine in force.
    pub fn replace(&self, engine: impl Into<Arc<Engine>>) -> Arc<Engine> {
        self.0.swap(engine.into())
    }

    /// The engine in force now, without touching its reference count: the hot path's
    /// load.
    #[inline]
    pub(crate) fn guard(&self) -> arc_swap::Guard<Arc<Engine>> {
        self.0.load()
    }
}

impl From<Engine> for SharedEngine {
    fn from(engine: Engine) -> Self {
        SharedEngine::new(engine)
    }
}

impl std::fmt::Debug for SharedEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedEngine")
            .field(&*self.0.load())
            .finish()
    }
}

/// Everything every clone of the layer and its services shares: one engine.
pub(crate) struct Gate {
    pub(crate) engine: SharedEngine,
    pub(crate) clock: Arc<dyn Clock>,
    /// `clock`, as the concurrency permits it admits are timed on.
    pub(crate) hold_clock: Arc<HoldClock>,
    route_key: RouteKey,
    resolver: ClientIpResolver,
    /// Whether admitted requests carry a [`MatchedRoute`] extension.
    pub(crate) matched_route: bool,
    /// Pre-built rejection headers, per route.
    pub(crate) rejections: super::rejection::Templates,
    /// What the layer has seen of a setup that limits nothing, or less than it should,
    /// to say so once in the log.
    misplaced: Misplaced,
    /// When each route last said a client keyed by a proxy's address, by reason.
    fallbacks: FallbackLog,
}

/// When each route last said, at WARN, that a walk through the forwarding header ended
/// at an entry naming no address, or that a trusted proxy sent none, by reason: said
/// at most once a minute per route and reason, counted every time
/// (`rocgate_client_key_fallbacks_total`). Held per route of the engine last seen, in
/// its route order: a fallback (with `no_header`, every request of a trusted network's
/// clients that call rocgate directly) finds its route's series by its index, counts
/// on a handle registered once, at the route's first fallback of that reason (with the
/// recorder in use then), and reads and sets when it was last said with an atomic: no
/// allocation, no lookup in the recorder's registry, no lock. A reload's new engine is
/// taken in at its first fallback, each route keeping, by name, its handles and when it
/// last said.
struct FallbackLog(ArcSwap<FallbackTable>);

impl Default for FallbackLog {
    fn default() -> Self {
        FallbackLog(ArcSwap::from_pointee(FallbackTable(Box::new([]))))
    }
}

/// Each route's [`FallbackRoute`] of one engine, by [`RouteId::index`].
struct FallbackTable(Box<[FallbackRoute]>);

/// A route's fallbacks, by [`Fallback`] in [`Fallback::ALL`]'s order.
struct FallbackRoute {
    /// The route of the engine the table was made for.
    id: RouteId,
    label: Arc<str>,
    reasons: [FallbackSeries; Fallback::ALL.len()],
}

/// One route's fallbacks of one reason.
struct FallbackSeries {
    /// `rocgate_client_key_fallbacks_total` of the route and reason, registered at
    /// their first fallback.
    counter: std::sync::OnceLock<metrics::Counter>,
    /// When they were last said ([`Nanos`]), [`FallbackSeries::NEVER`] before.
    said: AtomicU64,
}

impl FallbackSeries {
    /// [`FallbackSeries::said`] of series never said.
    const NEVER: u64 = u64::MAX;

    /// A series that has counted nothing and said nothing.
    fn new() -> Self {
        FallbackSeries {
            counter: std::sync::OnceLock::new(),
            said: AtomicU64::new(Self::NEVER),
        }
    }

    /// The same series, for a table made again: the same handle and time said.
    fn kept(&self) -> Self {
        FallbackSeries {
            counter: self.counter.clone(),
            said: AtomicU64::new(self.said.load(Ordering::Relaxed)),
        }
    }
}

impl FallbackTable {
    /// The table of `engine`'s routes, each keeping, by name, what `old` held of it.
    #[cold]
    #[inline(never)]
    fn of(engine: &Engine, old: &FallbackTable) -> FallbackTable {
        let old: HashMap<&str, &FallbackRoute> = old.0.iter().map(|r| (&*r.label, r)).collect();
        FallbackTable(
            engine
                .route_ids()
                .map(|id| {
                    let label = engine.route_label(id).unwrap_or_default();
                    let reasons = match old.get(&*label) {
                        Some(kept) => kept.reasons.each_ref().map(FallbackSeries::kept),
                        None => std::array::from_fn(|_| FallbackSeries::new()),
                    };
                    FallbackRoute { id, label, reasons }
                })
                .collect(),
        )
    }

    /// The entry of `route`, if the table was made for its engine.
    #[inline]
    fn route(&self, route: RouteId) -> Option<&FallbackRoute> {
        self.0.get(route.index()).filter(|r| r.id == route)
    }
}

impl FallbackLog {
    /// The least time between two lines of one route and reason.
    const EVERY: Duration = Duration::from_secs(60);
    /// The most bytes of the entry a line shows.
    const ENTRY_SHOWN: usize = 64;

    /// A request with `headers` on `route` keyed by `client` as the walk through
    /// `header` ended at `ended` (or found no header, [`Fallback::NoHeader`]), at `now`.
    #[inline(never)]
    fn note(
        &self,
        engine: &Engine,
        route: RouteId,
        (header, headers): (ClientIpHeader, &http::HeaderMap),
        ended: EndedAt<'_>,
        client: IpAddr,
        now: Nanos,
    ) {
        let table = self.0.load();
        let made;
        let entry = match table.route(route) {
            Some(entry) => entry,
            None => {
                made = Arc::new(FallbackTable::of(engine, &table));
                self.0.store(Arc::clone(&made));
                match made.route(route) {
                    Some(entry) => entry,
                    None => return,
                }
            }
        };
        let label: &str = &entry.label;
        let reason = ended.reason.as_str();
        let series = &entry.reasons[ended.reason.index()];
        series
            .counter
            .get_or_init(|| {
                metrics::counter!(crate::metrics::CLIENT_KEY_FALLBACKS, "route" => label.to_string(), "reason" => reason)
            })
            .increment(1);
        // Never waited for: of requests that find it due at once, one says it.
        let last = series.said.load(Ordering::Relaxed);
        let due =
            last == FallbackSeries::NEVER || now.saturating_since(Nanos::new(last)) >= Self::EVERY;
        if !due
            || series
                .said
                .compare_exchange(last, now.as_u64(), Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        if ended.reason == Fallback::NoHeader {
            let other = match header {
                ClientIpHeader::XForwardedFor => ClientIpHeader::Forwarded,
                ClientIpHeader::Forwarded => ClientIpHeader::XForwardedFor,
            };
            if headers.contains_key(other.as_str()) {
                tracing::warn!(
                    route = label,
                    header = header.as_str(),
                    reason,
                    carried = other.as_str(),
                    key = %client,
                    "a request from a trusted proxy carried not the forwarding header read (header) but the other one (carried), which is not read: it is keyed by that proxy's address, as is every such request through it, and that key's limit is theirs together; if the proxies in front write that one, set [server] client_ip_header to it (counted in rocgate_client_key_fallbacks_total; said at most once a minute per route and reason)"
                );
                return;
            }
            tracing::warn!(
                route = label,
                header = header.as_str(),
                reason,
                key = %client,
                "a request from a trusted proxy carried no forwarding header: it is keyed by that proxy's address, as is every such request through it (the proxy's own health checks among them), and that key's limit is theirs together (counted in rocgate_client_key_fallbacks_total; said at most once a minute per route and reason)"
            );
            return;
        }
        let shown = &ended.entry[..ended.entry.len().min(Self::ENTRY_SHOWN)];
        let cut = if shown.len() < ended.entry.len() {
            format!(
                " (its first {} of {} bytes)",
                shown.len(),
                ended.entry.len()
            )
        } else {
            String::new()
        };
        tracing::warn!(
            route = label,
            header = header.as_str(),
            reason,
            entry = %format_args!("\"{}\"{cut}", shown.escape_ascii()),
            key = %client,
            "a request's walk through its forwarding header ended at an entry naming no address: it is keyed by the address right of it, a trusted proxy's (or the peer), as is every client whose entry the walk ends at, and that key's limit is theirs together (counted in rocgate_client_key_fallbacks_total; said at most once a minute per route and reason)"
        );
    }
}

/// What a [`Gate`] has seen of a setup that limits nothing, or less than it should, and
/// said once: the layer outside the router with [`RouteKey::MatchedPath`], or a route
/// partitioned by `ip` whose requests come without their connection's address.
#[derive(Default)]
struct Misplaced {
    /// Whether a request has carried axum's `MatchedPath`.
    matched_path_seen: AtomicBool,
    /// Requests without it, while none has had it (up to [`Misplaced::WITHOUT_MATCHED_PATH`]).
    without_matched_path: AtomicU32,
    /// Whether a request on a route partitioned by `ip` came without its peer's address.
    no_peer_said: AtomicBool,
}

impl Misplaced {
    /// Requests without axum's `MatchedPath`, none with it, that say the layer is
    /// outside the router (a few are requests no route of the router takes).
    const WITHOUT_MATCHED_PATH: u32 = 100;

    /// A request carried `MatchedPath` (`true`) or did not, though it came by no router
    /// and a route takes its written path (`routed`: a request no route takes, or a
    /// 404 inside the router, which carries the router's `OriginalUri`, says nothing).
    /// Once it has said so, or seen one, it counts no more.
    #[inline]
    fn matched_path(&self, carried: bool, routed: impl FnOnce() -> bool) {
        if self.matched_path_seen.load(Ordering::Relaxed) {
            return;
        }
        if carried {
            self.matched_path_seen.store(true, Ordering::Relaxed);
        } else if routed()
            && self.without_matched_path.fetch_add(1, Ordering::Relaxed) + 1
                == Self::WITHOUT_MATCHED_PATH
        {
            self.matched_path_seen.store(true, Ordering::Relaxed);
            tracing::warn!(
                "route_key is MatchedPath, but none of the first {} requests a route takes carried axum's MatchedPath: the layer is outside the Router, and limits no request (add it with Router::layer, or key routes with RouteKey::Normalized)",
                Self::WITHOUT_MATCHED_PATH
            );
        }
    }

    /// A request on `route`, partitioned by `ip`, came without its peer's address.
    #[cold]
    fn no_peer(&self, engine: &Engine, route: RouteId) {
        if !self.no_peer_said.load(Ordering::Relaxed)
            && !self.no_peer_said.swap(true, Ordering::Relaxed)
        {
            let route = engine.route_label(route).unwrap_or_default();
            tracing::warn!(
                route = &*route,
                "a request on a route partitioned by ip came without its connection's address (serve with into_make_service_with_connect_info::<SocketAddr>(), or insert a rocgate::http::PeerAddr): such requests share one anonymous key"
            );
        }
    }
}

impl Gate {
    /// The route a request belongs to, if any.
    #[inline]
    pub(crate) fn route_of<B>(&self, engine: &Engine, req: &Request<B>) -> Option<RouteId> {
        let method = req.method().as_str();
        // Inside a router nested with `Router::nest`, axum has stripped the prefix from
        // the URI; the original has the path routes are written for.
        let whole_path = || {
            req.extensions()
                .get::<OriginalUri>()
                .map_or(req.uri(), |o| &o.0)
                .path()
        };
        match self.route_key {
            // As written: the service this layer wraps routes on it.
            RouteKey::Config => engine.route_for_written(method, whole_path()),
            RouteKey::Normalized => engine.route_for(method, whole_path()),
            RouteKey::MatchedPath => {
                let path = req.extensions().get::<MatchedPath>();
                // A request a router found no route for (a 404 inside it) carries the
                // `OriginalUri` every router sets before it routes, and no
                // `MatchedPath`: no sign of a layer outside the router.
                self.misplaced.matched_path(path.is_some(), || {
                    req.extensions().get::<OriginalUri>().is_none()
                        && engine.route_for(method, whole_path()).is_some()
                });
                engine.route_for(method, path?.as_str())
            }
        }
    }

    /// Reads the clock once and decides the request, from `peer` if its connection's
    /// peer is known (else from its [`PeerAddr`] or `ConnectInfo`), its forwarding
    /// headers read if that peer is a trusted proxy and `peer_forwards`; returns the time
    /// read too, for a rejection the limit it was refused at (its key's tier's, or the
    /// route's), and for a paced admission the key it was decided on (to give its
    /// place back with).
    #[inline]
    pub(crate) fn decide<B>(
        &self,
        engine: &Engine,
        route: RouteId,
        req: &Request<B>,
        peer: Option<SocketAddr>,
        peer_forwards: bool,
    ) -> Decided {
        let joined: Vec<u8>;
        // A request's key becomes its table key once, kept by a paced request.
        let key = match engine.partition(route) {
            // A route this engine does not hold: `check` admits it, whatever the key.
            None | Some(Partition::Route) => TableKey::None,
            Some(Partition::ClientIp(_)) => {
                let ext = req.extensions();
                let peer = peer
                    .or_else(|| ext.get::<PeerAddr>().map(|p| p.0))
                    .or_else(|| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))
                    .map(|a| a.ip());
                if peer.is_none() {
                    self.misplaced.no_peer(engine, route);
                }
                let client = match peer_forwards {
                    true => match self.resolver.walk(peer, req.headers()) {
                        (Some(client), Some(ended)) => {
                            let (header, now) = (self.resolver.header(), self.clock.now());
                            let read = (header, req.headers());
                            self.fallbacks.note(engine, route, read, ended, client, now);
                            Some(client)
                        }
                        (client, _) => client,
                    },
                    false => peer.map(|ip| ip.to_canonical()),
                };
                client.map_or(TableKey::None, TableKey::Ip)
            }
            Some(Partition::Header(name, _)) => {
                // The host a request is for is its target's authority where it has one
                // (absolute form, HTTP/2's `:authority`), which a proxy sends on as
                // `Host` (RFC 9112 §3.2.2): keyed by `Host` alone, a client could name
                // one host in its target and a new one in `Host`, a fresh key each time.
                // Any case: a `Partition` built in code may name it `Host`.
                let host = name.eq_ignore_ascii_case("host");
                let authority = req.uri().authority().filter(|_| host);
                let value = match authority {
                    Some(a) => Some(a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h)),
                    None => {
                        // One value only: of several, which one the upstream reads is
                        // its own choice, so none is the key. But for HTTP/2's cookie
                        // crumbs, one a field (RFC 9113 §8.2.3), which are one cookie
                        // joined with "; ", as `rocgate serve` sends them on.
                        let mut values = req.headers().get_all(name.as_str()).iter();
                        let first = values.next();
                        let value = match values.next() {
                            None => first.map(HeaderValue::as_bytes),
                            Some(_)
                                if req.version() == http::Version::HTTP_2
                                    && name.eq_ignore_ascii_case("cookie") =>
                            {
                                joined = req
                                    .headers()
                                    .get_all(name.as_str())
                                    .iter()
                                    .map(HeaderValue::as_bytes)
                                    .collect::<Vec<_>>()
                                    .join(&b"; "[..]);
                                Some(&joined[..])
                            }
                            Some(_) => None,
                        };
                        // UTF-8 beyond ASCII ("café") is a key of its own; other bytes
                        // are none. Without the whitespace around it, which an HTTP/1
                        // parser drops but HTTP/2 carries (`" k"`): the upstream, sent
                        // it over HTTP/1.1, reads `k`, and each padding was a fresh key.
                        value
                            .and_then(|v| std::str::from_utf8(v).ok())
                            .map(|v| v.trim_matches([' ', '\t']))
                    }
                };
                // One host, one credential, however it is spelled (see `host_key`,
                // `credentials_key`): a key per spelling was a fresh quota per spelling.
                // However long: the engine keys a long value by its digest. A host's
                // and a credential's key are made from the value as sent, lower-cased
                // as copied or hashed, with no folded copy.
                match value {
                    Some(v) if host => TableKey::of_host(v),
                    Some(v) if crate::config::is_credentials_header(name) => {
                        TableKey::of_credentials(v)
                    }
                    Some(v) => TableKey::of(Key::Value(v)),
                    None => TableKey::None,
                }
            }
        };
        // One call site, so that the check can be inlined here.
        let now = self.clock.now();
        let decision = engine.check_key(route, key, now);
        let (refused_at, restore_eta, paced_key) = match &decision {
            Decision::Reject(rejection) => {
                let (refused_at, restore_eta) = engine.key_refusal_of(route, key, rejection, now);
                (refused_at, restore_eta, None)
            }
            Decision::Admit(Admit::Paced(_)) => (None, None, Some(key)),
            Decision::Admit(_) => (None, None, None),
        };
        Decided {
            decision,
            now,
            refused_at,
            restore_eta,
            paced_key,
        }
    }
}

/// What [`Gate::decide`] found.
pub(crate) struct Decided {
    pub(crate) decision: Decision,
    /// The time the decision was made at.
    pub(crate) now: Nanos,
    /// For a rejection, the limit it was refused at.
    pub(crate) refused_at: Option<f64>,
    /// For a rejection, when the limit it was refused at next rises
    /// ([`Engine::key_restore_eta`]: its key's tier's, on a route with tiers).
    pub(crate) restore_eta: Option<Duration>,
    /// For a paced admission, the key it was decided on.
    pub(crate) paced_key: Option<TableKey>,
}

/// A paced request's place in its leaky bucket, until it departs: dropped before
/// then (its client left), it gives the place back ([`Engine::give_back`]), which
/// the next request takes if no request was scheduled after it.
pub(crate) struct Place {
    engine: Arc<Engine>,
    clock: Arc<dyn Clock>,
    route: RouteId,
    key: TableKey,
    /// Its pace while it waits for its departure.
    pace: Option<Pace>,
}

impl Place {
    /// The place of a request paced by `engine` on `route` for `key`.
    pub(crate) fn new(
        engine: Arc<Engine>,
        clock: Arc<dyn Clock>,
        route: RouteId,
        key: TableKey,
        pace: Pace,
    ) -> Self {
        Place {
            engine,
            clock,
            route,
            key,
            pace: Some(pace),
        }
    }

    /// The request departs: its place is spent.
    pub(crate) fn depart(&mut self) {
        self.pace = None;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(pace) = self.pace.take() {
            let now = self.clock.now();
            self.engine.give_back_key(self.route, self.key, pace, now);
        }
    }
}

/// A tower [`Layer`](tower::Layer) that admits or rejects requests with rocgate's engine.
///
/// Cloning is cheap and every clone, and every service it builds, shares one engine:
/// limits hold across connections and tasks.
/// A request admitted by a layer over one engine passes any other layer over the same
/// engine inside it untouched (a route's own layer inside a router-wide clone): one
/// arrival is decided and counted once.
#[derive(Clone)]
pub struct AdmissionLayer {
    gate: Arc<Gate>,
}

impl std::fmt::Debug for AdmissionLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("engine", &self.gate.engine)
            .field("route_key", &self.gate.route_key)
            .finish_non_exhaustive()
    }
}

impl AdmissionLayer {
    /// A layer over a new engine built from `config`, with the system clock, config
    /// route matching and the config's trusted proxies (`[server] trusted_proxies`,
    /// `trusted_hops` and `client_ip_header`; none in a config built in code unless set). The routes are checked by the rules
    /// of the file first ([`Config::validate`]), so a route built in code that a file
    /// would refuse (a `cut_limit` above `base_limit`) is an error, not a layer.
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        Ok(AdmissionLayer::builder(config)?.build())
    }

    /// A builder over a new engine built from `config` (checked as for
    /// [`from_config`](Self::from_config)), trusting the config's trusted proxies
    /// or hops and reading their `client_ip_header` until
    /// [`trusted_proxies`](AdmissionLayerBuilder::trusted_proxies),
    /// [`trusted_hops`](AdmissionLayerBuilder::trusted_hops) and
    /// [`client_ip_header`](AdmissionLayerBuilder::client_ip_header) say otherwise.
    pub fn builder(config: &Config) -> Result<AdmissionLayerBuilder, ConfigError> {
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        #[allow(clippy::disallowed_methods)] // wall time enters here, once, to place events
        let wall_now = SystemTime::now();
        let engine = Engine::new(config, clock.now(), wall_now)?;
        Ok(AdmissionLayerBuilder::new(SharedEngine::new(engine), clock)
            .trusted_proxies(config.server.trusted_proxies.clone())
            .trusted_hops(config.server.trusted_hops)
            .client_ip_header(config.server.client_ip_header))
    }

    /// A builder over an existing engine (shared with an admin API, metrics or a
    /// reloader that swaps it) and the clock that engine was built against (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests).
    pub fn with_engine(engine: SharedEngine, clock: Arc<dyn Clock>) -> AdmissionLayerBuilder {
        AdmissionLayerBuilder::new(engine, clock)
    }

    /// The engine in force now.
    pub fn engine(&self) -> Arc<Engine> {
        self.gate.engine.load()
    }

    /// Periodic upkeep, for a service that runs for days: places the scheduled events
    /// again from the wall clock ([`Engine::align_events`]) and brings every route up
    /// to now ([`Engine::catch_up`]), so that a silent route's snapshot shows where its
    /// controller stands and its idle keys go. Call it every few seconds, or let
    /// [`spawn_upkeep`](Self::spawn_upkeep) do so.
    pub fn upkeep(&self) {
        let engine = self.engine();
        #[allow(clippy::disallowed_methods)] // wall time enters here, to place events
        let wall_now = SystemTime::now();
        engine.upkeep(self.gate.clock.now(), wall_now, |_| false);
    }

    /// Runs [`upkeep`](Self::upkeep) every [`UPKEEP_EVERY`] on the current tokio
    /// runtime, as `rocgate serve` does, until every clone of this layer and every
    /// service it built is dropped (or the handle is aborted). Call it once, after
    /// `build`, from inside the runtime; outside one it returns tokio's error. The
    /// runtime must have its timer enabled (`enable_time` or `enable_all`, as
    /// `#[tokio::main]` has it): in one without, the task panics at its first tick
    /// ("timers are disabled", on stderr and in the handle) and no upkeep runs.
    pub fn spawn_upkeep(
        &self,
    ) -> Result<tokio::task::JoinHandle<()>, tokio::runtime::TryCurrentError> {
        let runtime = tokio::runtime::Handle::try_current()?;
        let gate = Arc::downgrade(&self.gate);
        Ok(runtime.spawn(async move {
            let mut every = tokio::time::interval(UPKEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                match gate.upgrade() {
                    Some(gate) => AdmissionLayer { gate }.upkeep(),
                    None => return,
                }
            }
        }))
    }

    /// Sweeps the idle keys of this layer's partitioned routes on a thread of its own
    /// ([`Sweeper`](super::Sweeper)), as `rocgate serve` does, until the sweeper
    /// returned is dropped: the request that rolls a route's window then has its
    /// decision without waiting for the route's sweep (about 20 ms at 1,000,000
    /// keys). Needs no async runtime. Without it, that request runs the sweep. The
    /// error is the system's, if it makes no thread (requests then go on sweeping).
    pub fn spawn_sweeper(&self) -> std::io::Result<super::Sweeper> {
        super::Sweeper::spawn(self.gate.engine.clone(), Arc::clone(&self.gate.clock))
    }
}

/// How often [`AdmissionLayer::spawn_upkeep`] and `rocgate serve` run the engine's
/// upkeep: often enough that a silent route's cut ends and an event starts on the
/// dashboards within seconds, rarely enough to cost nothing.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = AdmissionService<S>;

    fn layer(&self, inner: S) -> AdmissionService<S> {
        AdmissionService::new(inner, Arc::clone(&self.gate))
    }
}

/// Builds an [`AdmissionLayer`].
///
/// Cloning it is cheap: the layers built from a builder and from its clones share one
/// engine, as clones of a layer do (a builder set up once can build the layer of
/// several routers).
///
/// Its setters take it and return it, set: one whose result is dropped has set
/// nothing, and the compiler says so.
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// fn trust_one_hop(builder: rocgate::http::AdmissionLayerBuilder) {
///     builder.trusted_hops(1);
/// }
/// ```
#[derive(Clone)]
#[must_use = "a builder's setters return it set, and it makes nothing until built"]
pub struct AdmissionLayerBuilder {
    engine: SharedEngine,
    clock: Arc<dyn Clock>,
    route_key: RouteKey,
    trusted: Vec<IpNet>,
    trusted_hops: usize,
    client_ip_header: ClientIpHeader,
    matched_route: bool,
}

impl std::fmt::Debug for AdmissionLayerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionLayerBuilder")
            .field("route_key", &self.route_key)
            .field("trusted", &self.trusted)
            .field("trusted_hops", &self.trusted_hops)
            .field("client_ip_header", &self.client_ip_header)
            .finish_non_exhaustive()
    }
}

impl AdmissionLayerBuilder {
    fn new(engine: SharedEngine, clock: Arc<dyn Clock>) -> Self {
        AdmissionLayerBuilder {
            engine,
            clock,
            route_key: RouteKey::Config,
            trusted: Vec::new(),
            trusted_hops: 0,
            client_ip_header: ClientIpHeader::XForwardedFor,
            matched_route: false,
        }
    }

    /// Whether admitted requests carry a [`MatchedRoute`] extension for the inner
    /// service (off by default: inserting an extension costs a hash-map insert and an
    /// allocation per request).
    pub fn matched_route(mut self, on: bool) -> Self {
        self.matched_route = on;
        self
    }

    /// How requests are mapped to routes.
    pub fn route_key(mut self, route_key: RouteKey) -> Self {
        self.route_key = route_key;
        self
    }

    /// Proxies whose client IP header is believed, in place of those given before (by
    /// [`AdmissionLayer::builder`], the config's); not consulted while
    /// [`trusted_hops`](Self::trusted_hops) is above 0. A network is taken whole:
    /// `10.0.0.5/24` trusts all of `10.0.0.0/24` (a config file refuses it, naming
    /// both readings; here no check is made).
    pub fn trusted_proxies(mut self, networks: Vec<IpNet>) -> Self {
        self.trusted = networks;
        self
    }

    /// How many entries of the client IP header are believed from the right, from any
    /// peer, in place of the count given before (`0` unless set: the trusted proxies
    /// decide; by [`AdmissionLayer::builder`], the config's `trusted_hops`); see
    /// [`ClientIpResolver::with_trusted_hops`]. The trusted proxies are then not
    /// consulted.
    pub fn trusted_hops(mut self, hops: usize) -> Self {
        self.trusted_hops = hops;
        self
    }

    /// The header the trusted proxies name the client in (`X-Forwarded-For` unless
    /// set; by [`AdmissionLayer::builder`], the config's): only it is read.
    pub fn client_ip_header(mut self, header: ClientIpHeader) -> Self {
        self.client_ip_header = header;
        self
    }

    /// The layer.
    pub fn build(self) -> AdmissionLayer {
        AdmissionLayer {
            gate: Arc::new(Gate {
                engine: self.engine,
                hold_clock: Arc::new(HoldClock::new(Arc::clone(&self.clock))),
                clock: self.clock,
                route_key: self.route_key,
                resolver: ClientIpResolver::new(self.trusted)
                    .with_header(self.client_ip_header)
                    .with_trusted_hops(self.trusted_hops),
                matched_route: self.matched_route,
                rejections: super::rejection::Templates::default(),
                misplaced: Misplaced::default(),
                fallbacks: FallbackLog::default(),
            }),
        }
    }
}
