//! Typed configuration: the validated types the engine is built from.
//!
//! Nothing invalid can be constructed from a file: the raw serde structs in `raw`
//! convert into these types with [`TryFrom`]-style validation, and every error names
//! the file and the field path (`routes[2].cut_limit: must be ≤ base_limit (200), got 300`).

mod load;
mod raw;
mod secret;
pub use raw::figure;
pub(crate) use raw::{check_burst, check_route, EVENT_SETTINGS, LONGEST_RESTORE};
#[cfg(feature = "proxy")]
pub(crate) use raw::{
    MAX_WRONG_TOKENS_BURST, MAX_WRONG_TOKENS_PER_SECOND, MIN_WRONG_TOKENS_PER_SECOND,
};

pub use load::{env_name_shown, ConfigError, Problem};
pub use secret::Secret;

/// The most characters of a value an error quotes ([`quoted`]).
const QUOTED_CHARS: usize = 64;

/// `text`, a value as the user wrote it (or a part of one), as an error quotes it:
/// whole if it holds at most [`QUOTED_CHARS`] characters, else its first ones and its
/// length (`{:?}`: `"xxx…x"… (100000 bytes)`; `{}`, without the quotes and escapes),
/// so that a value written too long (a 100 KB `store.instance_id`) is not echoed whole
/// into a log line or a terminal. Every error of the configuration that quotes a value
/// written goes through it.
pub(crate) fn quoted(text: &str) -> Quoted<'_> {
    Quoted(text)
}

/// What keeps `token` out of an `Authorization` header, as `[admin] token` is checked
/// (a control character but a tab inside it, a space or tab before or after it), said
/// without the token, which is a secret; `None` for a token a header carries.
/// `rocgate hints` checks the token it is given to send so.
pub fn unsendable_token(token: &str) -> Option<String> {
    (!raw::is_header_value(token)).then(|| raw::unsendable(token))
}

/// `text` with each character `escape` picks written as `{:?}` writes it (`\u{1b}`,
/// `\n`), the rest as is: text shown to a user whose control characters would act
/// on the terminal, break a line, or show as nothing.
pub fn escaped(text: &str, escape: impl Fn(char) -> bool) -> std::borrow::Cow<'_, str> {
    if !text.contains(&escape) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if escape(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A value quoted by [`quoted`].
pub(crate) struct Quoted<'a>(&'a str);

impl Quoted<'_> {
    /// The part quoted, and the whole's length in bytes if that is not all of it.
    fn cut(&self) -> (&str, Option<usize>) {
        match self.0.char_indices().nth(QUOTED_CHARS) {
            None => (self.0, None),
            Some((end, _)) => (&self.0[..end], Some(self.0.len())),
        }
    }
}

impl std::fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cut() {
            (all, None) => write!(f, "{all:?}"),
            (part, Some(bytes)) => write!(f, "{part:?}… ({bytes} bytes)"),
        }
    }
}

/// `message`, from a deserializer, with each quoted part of it (between `"`, with
/// its escapes, or between backticks: a value, or a key, as written) bounded as
/// [`quoted`] bounds a value: its first [`QUOTED_CHARS`] characters (an escape counts
/// one), then how long it is as quoted.
pub(crate) fn quotes_bounded(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(1024));
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        let quote = if rest.as_bytes()[open] == b'"' {
            '"'
        } else {
            '`'
        };
        out.push_str(&rest[..=open]);
        rest = &rest[open + 1..];
        // Up to the closing quote, an escape (`\"`, `\u{1}`) at a time.
        let mut chars = rest.char_indices();
        let (mut shown, mut count) = (None, 0);
        let close = loop {
            let Some((i, c)) = chars.next() else {
                break None;
            };
            if c == quote {
                break Some(i);
            }
            if count == QUOTED_CHARS {
                shown.get_or_insert(i);
            }
            count += 1;
            if c == '\\' && quote == '"' {
                if let Some((_, 'u')) = chars.next() {
                    chars.find(|&(_, c)| c == '}');
                }
            }
        };
        let Some(close) = close else {
            break;
        };
        match shown {
            None => out.push_str(&rest[..=close]),
            Some(end) => {
                out.push_str(&rest[..end]);
                out.push(quote);
                out.push_str(&format!("… ({close} bytes)"));
            }
        }
        rest = &rest[close + quote.len_utf8()..];
    }
    out.push_str(rest);
    out
}

impl std::fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cut() {
            (all, None) => f.write_str(all),
            (part, Some(bytes)) => write!(f, "{part}… ({bytes} bytes)"),
        }
    }
}

/// `current` (the parameters of a route enforced by `algorithm`) changed by a JSON
/// object of file fields (`{"base_limit": 300, "hold": "5s"}`), validated by the rules
/// of the file; `origin` names the change in errors. For runtime changes through the
/// admin API.
///
/// ```
/// use rocgate::config::patch_controller;
/// use rocgate::controller::ControllerParams;
/// use rocgate::limiter::Algorithm;
///
/// let current = ControllerParams::default(); // base 200, cut 60
/// let p = patch_controller(&current, &Algorithm::default(), r#"{"base_limit": 300, "hold": "5s"}"#, "PUT").unwrap();
/// assert_eq!((p.base_limit_rps, p.hold.as_secs()), (300.0, 5));
/// let e = patch_controller(&current, &Algorithm::default(), r#"{"cut_limit": 300}"#, "PUT").unwrap_err();
/// assert_eq!(e.to_string(), "PUT: cut_limit: must be ≤ base_limit (200), got 300");
/// ```
pub fn patch_controller(
    current: &ControllerParams,
    algorithm: &Algorithm,
    json: &str,
    origin: &str,
) -> Result<ControllerParams, ConfigError> {
    raw::patch_controller(current, algorithm, json, None)
        .map_err(|e| ConfigError::new(origin, e.problems()))
}

/// [`patch_controller`] of the route `name` through the admin API: the origin is
/// `PUT /admin/routes/{name}`, and a field set to `null` is refused naming the way
/// back to the file's parameters, `DELETE /admin/routes/{name}/change`. The error says
/// whether the body is no change at all ([`PatchRefusal::malformed`]: the API answers
/// 400) or a change the rules refuse (422).
#[cfg(feature = "proxy")]
pub(crate) fn patch_route_controller(
    current: &ControllerParams,
    algorithm: &Algorithm,
    json: &str,
    name: &str,
) -> Result<ControllerParams, PatchRefusal> {
    let withdraw = format!("DELETE /admin/routes/{name}/change");
    raw::patch_controller(current, algorithm, json, Some(&withdraw)).map_err(|e| {
        let malformed = matches!(e, raw::PatchError::Malformed(_));
        PatchRefusal {
            malformed,
            error: ConfigError::new(&format!("PUT /admin/routes/{name}"), e.problems()),
        }
    })
}

/// Why [`patch_route_controller`] refused a change.
#[cfg(feature = "proxy")]
#[derive(Debug)]
pub(crate) struct PatchRefusal {
    /// Whether the body is no change: not a JSON object of the change's fields each
    /// of its JSON type (malformed JSON, an unknown field or one given twice, a number
    /// written as a string, `null`). Otherwise the rules refused a change that reads.
    pub(crate) malformed: bool,
    /// Every problem.
    pub(crate) error: ConfigError,
}

/// Whether two listening addresses take the same port on a shared address, so that
/// the second bind fails: the same address, or one of them unspecified (`0.0.0.0`,
/// `::`, every address) on the same port. An IPv4-mapped IPv6 address
/// (`::ffff:127.0.0.1`) is its IPv4 address: Linux refuses to bind both. Port 0 on
/// both is two free ports, no clash. `server.listen` and `admin.listen` are held to
/// it, and `rocgate serve`'s `--listen` and `--admin`.
///
/// ```
/// use rocgate::config::listeners_clash;
///
/// let at = |s: &str| s.parse().unwrap();
/// assert!(listeners_clash(at("127.0.0.1:8080"), at("127.0.0.1:8080")));
/// assert!(listeners_clash(at("0.0.0.0:8080"), at("127.0.0.1:8080")));
/// assert!(!listeners_clash(at("127.0.0.1:8080"), at("127.0.0.2:8080")));
/// assert!(listeners_clash(at("[::ffff:127.0.0.1]:8080"), at("127.0.0.1:8080")));
/// assert!(!listeners_clash(at("127.0.0.1:0"), at("127.0.0.1:0")));
/// ```
pub fn listeners_clash(a: SocketAddr, b: SocketAddr) -> bool {
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    a.port() != 0 && a.port() == b.port() && (x == y || x.is_unspecified() || y.is_unspecified())
}

/// Whether the upstream `http://host[:port]` (as [`check_upstream`] returns it) is
/// this process's own listener at `listener`: its port, and a host a connection to
/// which the listener takes. That is the listener's address; a loopback one where the
/// listener takes every address (of its family, or of both where it is `[::]`);
/// `localhost`, which reaches `127.0.0.1` or `[::1]`; and an unspecified address
/// (`0.0.0.0`, `[::]`), which a connection takes for the loopback one of its family.
/// Requests sent there would come back to rocgate: to the admin API (where every
/// client of the proxy could read and, from loopback, change limits), or to the proxy
/// itself. A host name other than `localhost` is not resolved, and is never taken for
/// a listener.
///
/// ```
/// use rocgate::config::upstream_is_listener;
/// let at = |a: &str| a.parse().unwrap();
/// assert!(upstream_is_listener("http://127.0.0.1:9090", at("127.0.0.1:9090")));
/// assert!(upstream_is_listener("http://localhost:9090", at("0.0.0.0:9090")));
/// assert!(upstream_is_listener("http://[::1]:80", at("[::]:80")));
/// assert!(upstream_is_listener("http://127.0.0.1", at("127.0.0.1:80")));
/// assert!(upstream_is_listener("http://[::ffff:127.0.0.1]:80", at("127.0.0.1:80")));
/// assert!(upstream_is_listener("http://0.0.0.0:80", at("127.0.0.1:80")));
/// assert!(!upstream_is_listener("http://127.0.0.1:3000", at("127.0.0.1:9090")));
/// assert!(!upstream_is_listener("http://10.0.0.5:9090", at("127.0.0.1:9090")));
/// assert!(!upstream_is_listener("http://shop.internal:9090", at("0.0.0.0:9090")));
/// assert!(!upstream_is_listener("http://localhost:80", at("127.0.0.2:80")));
/// ```
pub fn upstream_is_listener(upstream: &str, listener: SocketAddr) -> bool {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let Ok(url) = check_upstream(upstream) else {
        return false;
    };
    let authority = url.strip_prefix("http://").unwrap_or(&url);
    let (host, port) = raw::host_and_port(authority);
    let port = port.map_or(Some(80), |p| p.parse::<u16>().ok());
    if port != Some(listener.port()) || listener.port() == 0 {
        return false;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let v6 = IpAddr::V6(Ipv6Addr::LOCALHOST);
    // The addresses a connection to the host may reach.
    let reached = match host.parse::<IpAddr>().map(|ip| ip.to_canonical()) {
        Ok(ip) if ip.is_unspecified() => [Some(if ip.is_ipv4() { v4 } else { v6 }), None],
        Ok(ip) => [Some(ip), None],
        Err(_) if host.eq_ignore_ascii_case("localhost") => [Some(v4), Some(v6)],
        Err(_) => return false,
    };
    let own = listener.ip().to_canonical();
    reached.into_iter().flatten().any(|ip| {
        ip == own || (own.is_unspecified() && ip.is_loopback() && (own.is_ipv6() || ip.is_ipv4()))
    })
}

/// Checks an upstream URL by the rules of the file's `server.upstream`:
/// `http://host[:port]`, nothing after the authority but `/`, a port from 1 to 65535.
/// Returns it as `http://host[:port]`, or what is wrong with it (without a field name:
/// the caller names where it came from).
///
/// ```
/// use rocgate::config::{check_upstream, UpstreamError};
///
/// assert_eq!(check_upstream("http://127.0.0.1:3000/").unwrap(), "http://127.0.0.1:3000");
/// let e = check_upstream("http://127.0.0.1:99999").unwrap_err();
/// assert_eq!(e, UpstreamError::Port { port: "99999".into() });
/// assert_eq!(e.to_string(), "port must be a number from 1 to 65535, got \"99999\"");
/// ```
pub fn check_upstream(text: &str) -> Result<String, UpstreamError> {
    raw::upstream_url(text.to_owned())
}

/// Why an upstream URL was refused ([`check_upstream`], `server.upstream`). Each
/// variant holds the text as given; `Display` names no field, and quotes the URL with
/// a password in it masked ([`masked_url`](crate::store::masked_url)). Non-exhaustive: a new
/// rule is not a breaking change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamError {
    /// An `https://` URL: rocgate reaches its upstream over plain HTTP only.
    #[error("TLS upstreams are not supported: use http://, got {:?}", quoted(&crate::store::masked_url(.url)))]
    Tls {
        /// The URL as given.
        url: String,
    },
    /// Not `http://` followed by an authority alone (a path, a query or a fragment
    /// after it, or nothing).
    #[error("must be http://host[:port] with no path, got {:?}", quoted(&crate::store::masked_url(.url)))]
    NotAnAuthority {
        /// The URL as given.
        url: String,
    },
    /// User info before the host (`http://user:password@host`): rocgate would send
    /// no credentials upstream.
    #[error(
        "must not carry user info (user:password@): rocgate sends no credentials upstream, got {:?}",
        quoted(&crate::store::masked_url(.url))
    )]
    UserInfo {
        /// The URL as given.
        url: String,
    },
    /// The authority names no host (`http://:3000`), or a malformed IPv6 one.
    #[error(
        "must name a host, as in http://127.0.0.1:3000 or http://[::1]:3000, got {:?}",
        quoted(&crate::store::masked_url(.url))
    )]
    NoHost {
        /// The URL as given.
        url: String,
    },
    /// The host holds a character no host name or address does (`é`, `%`, `|`): no
    /// URI holds it, and `serve` refused it at start with "invalid uri character".
    #[error(
        "the host holds {:?}, which no host does (letters, digits and - . _ ~ ! $ & ' ( ) * + , ; =), got {:?}",
        .character.to_string(),
        quoted(&crate::store::masked_url(.url))
    )]
    HostCharacter {
        /// The URL as given.
        url: String,
        /// The first such character.
        character: char,
    },
    /// The port is not a number from 1 to 65535.
    #[error("port must be a number from 1 to 65535, got {:?}", quoted(.port))]
    Port {
        /// The port as given.
        port: String,
    },
}

use crate::controller::{ControllerParams, ProfileFields};
use crate::limiter::Algorithm;
use crate::window::WindowSpec;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

/// A whole configuration. One loaded from TOML ([`Config::load`],
/// [`Config::from_toml_str`]) is validated; the routes of one built or changed in code
/// are checked by [`Config::validate`], which every engine, layer and simulator built
/// from it calls first.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// Routes in match order: the first route that matches a request takes it.
    pub routes: Vec<RouteConfig>,
    /// The reverse proxy's settings (`[server]` and `[admin]`); unused by the layer.
    pub server: ServerConfig,
    /// What the tuning hints keep and call saturated (`[hints]`).
    pub hints: HintsConfig,
    /// Where shared state lives (`[store]`): local by default.
    pub store: crate::store::StoreConfig,
}

impl Config {
    /// The scheduled events that ended at or before `now`, with where each is
    /// (`routes[0].events[1]`) and when it ended: valid, and never to run (a date left
    /// from a past sale). `check-config` and `serve` name them as warnings.
    pub fn ended_events(&self, now: SystemTime) -> Vec<(String, &Event, SystemTime)> {
        let mut ended = Vec::new();
        for (i, route) in self.routes.iter().enumerate() {
            for (j, event) in route.events.iter().enumerate() {
                match event.start.checked_add(event.duration) {
                    Some(end) if end <= now => {
                        ended.push((format!("routes[{i}].events[{j}]"), event, end));
                    }
                    _ => {}
                }
            }
        }
        ended
    }

    /// These routes, with the default proxy settings. Nothing is checked here: an
    /// engine, layer or simulator built from it checks the routes
    /// ([`validate`](Config::validate)), as a file's are checked when loaded.
    pub fn new(routes: Vec<RouteConfig>) -> Self {
        Config {
            routes,
            server: ServerConfig::default(),
            hints: HintsConfig::default(),
            store: crate::store::StoreConfig::default(),
        }
    }

    /// Checks the routes by the rules of the file, reporting every problem under the
    /// field path the file would have (`routes[0].cut_limit: must be ≤ base_limit
    /// (2), got 60`): at least one route; names, paths and methods; limits in range and
    /// a `cut_limit` no higher than `base_limit` (else a cut would raise the limit);
    /// thresholds, durations, algorithm and partition settings and how they combine;
    /// tiers and events; no route shadowed by an earlier one. The `[server]`,
    /// `[hints]` and `[store]` sections are not checked here (they are when loaded).
    ///
    /// ```
    /// use rocgate::config::{Config, RouteConfig, RouteMatch};
    ///
    /// let mut order = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
    /// order.controller.base_limit_rps = 20.0; // below the default cut_limit (60)
    /// let e = Config::new(vec![order.clone()]).validate().unwrap_err();
    /// assert_eq!(e.to_string(), "config: routes[0].cut_limit: must be ≤ base_limit (20), got 60");
    /// order.controller.cut_limit_rps = 5.0;
    /// assert!(Config::new(vec![order]).validate().is_ok());
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        raw::check_routes(&self.routes).map_err(|problems| ConfigError::new("config", problems))
    }
}

/// One protected route.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RouteConfig {
    /// Unique name; the only route identifier that reaches metrics labels.
    pub name: String,
    /// Which requests belong to the route.
    pub matcher: RouteMatch,
    /// Enforce, or only count.
    pub mode: Mode,
    /// Status of a rejection: 429, or e.g. 503 for capacity shedding.
    pub reject_status: u16,
    /// Shape of the ROC window (the config takes a window of at most an hour).
    pub window: WindowSpec,
    /// The ROC controller's parameters (limits are per key on partitioned routes).
    pub controller: ControllerParams,
    /// The enforcing algorithm.
    pub algorithm: Algorithm,
    /// Whether the limit applies to the route as a whole or to each key.
    pub partition: Partition,
    /// A partitioned route's limit over its keys' requests together, req/s
    /// (`route_limit`): one token bucket for the route, with the route's burst (its
    /// `burst`, or `limiter_window` for the window counters), tried after a key's own
    /// limiter admits, and scaled by the cut as the keys' limit is: held at the
    /// fraction of base the cut was made at, `f` (`cut_limit_rps / base_limit_rps`
    /// then), and brought back as the keys' limit is restored, `f + (1 − f) ×` the
    /// controller's progress from cut to base (a `base_limit` changed while the cut
    /// holds does not move it). `None`: no limit over the keys together.
    /// Only on partitioned routes with `token_bucket`, `fixed_window` or
    /// `sliding_window`. With the Redis store, the fleet's total: each instance holds its
    /// share, this ÷ the live instances (`Engine::set_route_limit_share`, which the store
    /// sets). A scheduled event may set its own for its duration
    /// ([`Event::route_limit_rps`]), shared so too.
    pub route_limit_rps: Option<f64>,
    /// Key values with limits of their own (partitioned routes only).
    pub tiers: Vec<Tier>,
    /// Scheduled events that run another profile for a while.
    pub events: Vec<Event>,
}

impl RouteConfig {
    /// A route with every other setting at its default: enforce mode, a 6 s window of
    /// 100 ms slots, the classic controller values, a token bucket, no partition.
    pub fn new(name: impl Into<String>, matcher: RouteMatch) -> Self {
        RouteConfig {
            name: name.into(),
            matcher,
            mode: Mode::Enforce,
            reject_status: 429,
            window: WindowSpec::default(),
            controller: ControllerParams::default(),
            algorithm: Algorithm::default(),
            partition: Partition::Route,
            route_limit_rps: None,
            tiers: Vec::new(),
            events: Vec::new(),
        }
    }
}

/// Which requests a route takes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteMatch {
    /// Upper-case HTTP method, or any method when `None`; `GET` takes `HEAD` too.
    pub method: Option<String>,
    /// The path pattern.
    pub path: PathPattern,
}

impl RouteMatch {
    /// Requests with this method (any method when `None`; upper-cased here) whose
    /// path matches `path`.
    pub fn new(method: Option<&str>, path: PathPattern) -> Self {
        RouteMatch {
            method: method.map(str::to_ascii_uppercase),
            path,
        }
    }

    /// Every request.
    pub fn any() -> Self {
        RouteMatch {
            method: None,
            path: PathPattern::Prefix("/".into()),
        }
    }

    /// Requests whose path starts with `prefix`, any method.
    pub fn prefix(prefix: impl Into<String>) -> Self {
        RouteMatch {
            method: None,
            path: PathPattern::Prefix(prefix.into()),
        }
    }

    /// Requests with exactly this method and path, where the path may be a template
    /// (`/api/items/{id}`), as a file's `path` is ([`PathPattern::parse_path`]).
    pub fn exact(method: &str, path: impl Into<String>) -> Self {
        let path = path.into();
        RouteMatch {
            method: Some(method.to_ascii_uppercase()),
            path: PathPattern::parse_path(&path).unwrap_or(PathPattern::Exact(path)),
        }
    }

    /// Whether a request with this method and path belongs to the route.
    #[inline]
    pub fn matches(&self, method: &str, path: &str) -> bool {
        self.takes_method(method) && self.path.matches(path)
    }

    /// Whether the route takes requests with this method (whatever their path).
    #[inline]
    pub(crate) fn takes_method(&self, method: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| method_matches(m, method))
    }
}

/// Whether a request's method is the route's, in any case; a `GET` route also takes
/// `HEAD`, which servers answer with the GET handler, doing all its work (RFC 9110
/// §9.3.2). Out of line: inlined, its vectorised comparison makes every route match pay
/// for a large stack frame.
#[inline(never)]
fn method_matches(route: &str, request: &str) -> bool {
    route.eq_ignore_ascii_case(request)
        || (route.eq_ignore_ascii_case("GET") && request.eq_ignore_ascii_case("HEAD"))
}

/// A path pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PathPattern {
    /// The path must equal this.
    Exact(String),
    /// The path must start with this.
    Prefix(String),
    /// Segment by segment; `{name}` stands for any one non-empty segment, and a last
    /// `{*name}` for the rest of the path.
    Template(Vec<Segment>),
}

/// One segment of a path template.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Segment {
    /// Must equal this text.
    Literal(String),
    /// Any one non-empty segment, bound to this name.
    Param(String),
    /// The rest of the path, slashes and all, bound to this name (`{*rest}`, as axum's
    /// router, matchit, writes it): everything after the slash that ends the segments
    /// before it, which must not be empty (`/files/{*rest}` takes `/files/a` and
    /// `/files/a/b/`, not `/files/` or `/files`). Only as a template's last segment: a
    /// template with one elsewhere matches no path.
    CatchAll(String),
}

impl PathPattern {
    /// Parses `/api/items/{id}` or `/files/{*rest}` (a template), or any path without
    /// braces (exact). Returns `None` when braces are unbalanced, a parameter has no
    /// name, or a catch-all is not the last segment.
    pub fn parse_path(path: &str) -> Option<PathPattern> {
        if !path.contains(['{', '}']) {
            return Some(PathPattern::Exact(path.to_owned()));
        }
        let segments = path
            .trim_start_matches('/')
            .split('/')
            .map(
                |seg| match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some(name) if name.contains(['{', '}']) => None,
                    Some(name) => match name.strip_prefix('*') {
                        Some("") => None,
                        Some(rest) => Some(Segment::CatchAll(rest.to_owned())),
                        None if name.is_empty() => None,
                        None => Some(Segment::Param(name.to_owned())),
                    },
                    None if seg.contains(['{', '}']) => None,
                    None => Some(Segment::Literal(seg.to_owned())),
                },
            )
            .collect::<Option<Vec<_>>>()?;
        match segments.split_last() {
            Some((_, before)) if before.iter().any(|s| matches!(s, Segment::CatchAll(_))) => None,
            _ => Some(PathPattern::Template(segments)),
        }
    }

    /// Whether `path` (without query string, [normalized](normalize_path)) matches. An
    /// exact path or a template matches with or without a trailing slash.
    #[inline]
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPattern::Exact(p) => {
                p == path || without_trailing_slash(p) == without_trailing_slash(path)
            }
            PathPattern::Prefix(p) => path.starts_with(p.as_str()),
            PathPattern::Template(segments) => template_matches(segments, path),
        }
    }
}

/// `path` without its trailing slash, unless it is the root.
pub(crate) fn without_trailing_slash(path: &str) -> &str {
    match path.strip_suffix('/') {
        Some(rest) if !rest.is_empty() => rest,
        _ => path,
    }
}

/// A request path as `rocgate serve` matches it to a route: without each segment's
/// parameters (`;` and what follows it in its segment: `/api/order;jsessionid=1` is
/// `/api/order`), then [normalized](normalize_path). Tomcat, Jetty and Spring route a
/// path so, before they resolve its dot segments: matched with its parameters, a path
/// reached their handler past the route's limit, `/api/order;x` as a path no route
/// took, and `/static/..;/api/login` as a static file. An encoded `;` (`%3B`) is no
/// separator, as there. Without a `;`, the path is only normalized.
///
/// ```
/// use rocgate::config::matching_path;
///
/// assert_eq!(matching_path("/api/order;jsessionid=1"), "/api/order");
/// assert_eq!(matching_path("/static/..;/api/login"), "/api/login");
/// assert_eq!(matching_path("/api;v=2/items;x/42"), "/api/items/42");
/// assert_eq!(matching_path("/api/order%3Bx"), "/api/order%3Bx");
/// assert_eq!(matching_path("//api/./order"), "/api/order");
/// ```
pub fn matching_path(path: &str) -> std::borrow::Cow<'_, str> {
    if path.starts_with('/') && is_plain(path.as_bytes(), true) {
        return std::borrow::Cow::Borrowed(path);
    }
    if !path.contains(';') {
        return normalize_path(path);
    }
    let mut bare = String::with_capacity(path.len());
    let mut in_parameters = false;
    for c in path.chars() {
        match c {
            '/' | '\\' => {
                in_parameters = false;
                bare.push(c);
            }
            ';' => in_parameters = true,
            c if !in_parameters => bare.push(c),
            _ => {}
        }
    }
    std::borrow::Cow::Owned(normalize_path(&bare).into_owned())
}

/// A request path as routes see it: percent-encoded unreserved characters decoded
/// (`%6F` is `o`) and dot segments removed (`/a/./b/../c` is `/a/c`), as RFC 3986
/// §6.2.2 makes them equivalent, and runs of slashes merged (`//a//b` is `/a/b`), as
/// most servers do. A backslash is a slash (`/api\order` is `/api/order`), as IIS,
/// nginx on Windows and the WHATWG URL parser (`new URL()` in Node.js, Deno, Bun) read
/// it. A client cannot then send a route's path spelled otherwise, reach
/// the same handler and escape the route's limit. An encoded slash (`%2F`) stays
/// encoded, as servers keep it inside its segment; the hexadecimal digits of an
/// escape kept are upper case (`%c3%a9` is `%C3%A9`, RFC 3986 §6.2.2.1), and a byte
/// beyond ASCII that a client sent unencoded is encoded (`é` is `%C3%A9`), so that a
/// route written `/caf%C3%A9` takes each spelling. A target that is no path (`OPTIONS
/// *`) is `/`, so that a catch-all route limits it too. Paths that need none of this
/// (ASCII, no `%`, no `\`, no `//`, no `/.`) are returned as they are.
///
/// ```
/// use rocgate::config::normalize_path;
///
/// assert_eq!(normalize_path("/api/order"), "/api/order");
/// assert_eq!(normalize_path("//api/x/../%6Frder/."), "/api/order/");
/// assert_eq!(normalize_path("/api%2Forder"), "/api%2Forder");
/// assert_eq!(normalize_path("/api\\order"), "/api/order");
/// assert_eq!(normalize_path("/.."), "/");
/// assert_eq!(normalize_path("*"), "/");
/// assert_eq!(normalize_path("/caf%c3%a9"), "/caf%C3%A9");
/// assert_eq!(normalize_path("/café"), "/caf%C3%A9");
/// ```
pub fn normalize_path(path: &str) -> std::borrow::Cow<'_, str> {
    if !path.starts_with('/') {
        return std::borrow::Cow::Borrowed("/");
    }
    let bytes = path.as_bytes();
    if is_plain(bytes, false) {
        return std::borrow::Cow::Borrowed(path);
    }
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match (bytes[i], bytes.get(i + 1..i + 3)) {
            (b'%', Some(&[hi, lo])) => hex(hi).zip(hex(lo)).map(|(hi, lo)| (hi << 4) | lo),
            _ => None,
        };
        match escaped {
            Some(c) if c.is_ascii_alphanumeric() || b"-._~".contains(&c) => {
                decoded.push(c);
                i += 3;
            }
            Some(c) => {
                push_escape(&mut decoded, c);
                i += 3;
            }
            None if !bytes[i].is_ascii() => {
                push_escape(&mut decoded, bytes[i]);
                i += 1;
            }
            None => {
                decoded.push(if bytes[i] == b'\\' { b'/' } else { bytes[i] });
                i += 1;
            }
        }
    }
    // Every byte beyond ASCII was encoded: the text is ASCII.
    let decoded = String::from_utf8_lossy(&decoded);
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for segment in &segments {
        out.push('/');
        out.push_str(segment);
    }
    let ends_in_directory = ["/", "/.", "/.."].iter().any(|end| decoded.ends_with(end));
    if out.is_empty() || ends_in_directory {
        out.push('/');
    }
    std::borrow::Cow::Owned(out)
}

/// Whether a path (that starts with `/`) is its own normalized form: no `%`, `\`,
/// byte beyond ASCII, `//` or `/.`, and with `parameters` no `;` either: then
/// [`matching_path`] reads the common request's path (plain, without parameters)
/// once, where it looked for a `;` before normalizing.
#[inline(always)]
fn is_plain(bytes: &[u8], parameters: bool) -> bool {
    !bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            || (parameters && b == b';')
            || b == b'\\'
            || !b.is_ascii()
            || (b == b'/' && matches!(bytes.get(i + 1), Some(b'/' | b'.')))
    })
}

/// Appends `byte` percent-encoded, in upper-case hexadecimal digits.
pub(crate) fn push_escape(out: &mut Vec<u8>, byte: u8) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    out.extend([
        b'%',
        DIGITS[usize::from(byte >> 4)],
        DIGITS[usize::from(byte & 0xF)],
    ]);
}

/// The value of a hexadecimal digit.
fn hex(digit: u8) -> Option<u8> {
    char::from(digit)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

/// Whether `path` matches a template, segment by segment (a trailing slash on either
/// is no segment; a catch-all takes the rest of the path as it is, a trailing slash
/// too). Out of line, so that the exact and prefix matches stay small where they are
/// inlined.
#[inline(never)]
fn template_matches(segments: &[Segment], path: &str) -> bool {
    let segments = without_trailing_empty(segments);
    let path = TemplatePath::new(path);
    let mut rest = Some(path.segments());
    for (i, segment) in segments.iter().enumerate() {
        let Some(here) = rest else {
            return false;
        };
        if let Segment::CatchAll(_) = segment {
            return i + 1 == segments.len() && path.catches(here);
        }
        let (part, next) = match here.split_once('/') {
            Some((part, next)) => (part, Some(next)),
            None => (here, None),
        };
        let matches = match segment {
            Segment::Literal(l) => l == part,
            _ => !part.is_empty(),
        };
        if !matches {
            return false;
        }
        rest = next;
    }
    rest.is_none()
}

/// A template's segments without a last empty literal (its trailing slash, which is
/// no segment), unless that is its only one.
pub(crate) fn without_trailing_empty(segments: &[Segment]) -> &[Segment] {
    match segments.split_last() {
        Some((Segment::Literal(l), rest)) if l.is_empty() && !rest.is_empty() => rest,
        _ => segments,
    }
}

/// The literal segments a template starts with, each between slashes (`/api/items/`
/// for `/api/items/{id}`, `/` for `/{id}`): every path the template matches starts
/// with it.
pub(crate) fn literal_lead(segments: &[Segment]) -> String {
    let mut lead = String::from("/");
    for segment in segments {
        match segment {
            Segment::Literal(l) => {
                lead.push_str(l);
                lead.push('/');
            }
            _ => break,
        }
    }
    lead
}

/// A request's path as templates read it: segment by segment without its leading
/// slashes and trailing slash, and whole after a segment for a catch-all.
pub(crate) struct TemplatePath<'a> {
    /// The path without its leading slashes.
    whole: &'a str,
    /// Its segments: `whole` without a trailing slash.
    segments: &'a str,
}

impl<'a> TemplatePath<'a> {
    /// `path` (a request's, normalized or as written) read so.
    #[inline]
    pub(crate) fn new(path: &'a str) -> Self {
        TemplatePath {
            whole: path.trim_start_matches('/'),
            segments: without_trailing_slash(path).trim_start_matches('/'),
        }
    }

    /// The segments, `/`-separated, for the walk to read one by one.
    #[inline]
    pub(crate) fn segments(&self) -> &'a str {
        self.segments
    }

    /// Whether a catch-all at `rest` (the segments not yet read, a suffix of
    /// [`segments`](Self::segments)) takes the path: the rest of the path from there,
    /// its trailing slash included, is not empty, as for matchit (`/files/{*rest}`
    /// takes `/files/a` and `/files//`, not `/files/`).
    #[inline]
    pub(crate) fn catches(&self, rest: &str) -> bool {
        self.whole.len() > self.segments.len() - rest.len()
    }
}

/// The header in which trusted proxies name the client (`[server] client_ip_header`).
/// Only that header is read: a proxy that writes one and passes the other on as the
/// client sent it would otherwise let the client choose its own address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientIpHeader {
    /// `X-Forwarded-For` (nginx, Envoy, HAProxy's `option forwardfor`, cloud load
    /// balancers).
    #[default]
    XForwardedFor,
    /// RFC 7239's `Forwarded`, each element's `for=` (HAProxy's `option forwarded`).
    Forwarded,
}

impl ClientIpHeader {
    /// The header's name as written in config, in lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            ClientIpHeader::XForwardedFor => "x-forwarded-for",
            ClientIpHeader::Forwarded => "forwarded",
        }
    }
}

/// Who may read the admin API from beyond loopback (`[admin] reads`): its routes'
/// state, hints, store and metrics. The health checks (`/healthz`, `/readyz`) are
/// answered without the token either way (a kubelet's probe carries none), and a
/// change always needs it from there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdminReads {
    /// Whoever reaches the listener (a Prometheus on another host scrapes by name).
    #[default]
    Open,
    /// Only a request with the bearer token (`[admin] token`): `/metrics` too, which
    /// carries the same routes' state, so a Prometheus sends the token
    /// (`authorization: credentials_file:`). From loopback, the operator on the host
    /// reads without it, as before.
    Token,
}

impl AdminReads {
    /// The value as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminReads::Open => "open",
            AdminReads::Token => "token",
        }
    }
}

/// The PROXY protocol header `rocgate serve` expects at the start of each connection
/// from `[server] proxy_protocol_from` (`[server] proxy_protocol`): an L4 load balancer (HAProxy in
/// TCP mode, AWS NLB, GCP's TCP load balancer) names the client in it, the address
/// then taken as the connection's peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProxyProtocol {
    /// No header is read: the socket's peer is the connection's.
    #[default]
    Off,
    /// The text header (version 1, `PROXY TCP4 ...`).
    V1,
    /// The binary header (version 2).
    V2,
    /// Either version.
    Any,
}

impl ProxyProtocol {
    /// The setting's name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyProtocol::Off => "off",
            ProxyProtocol::V1 => "v1",
            ProxyProtocol::V2 => "v2",
            ProxyProtocol::Any => "any",
        }
    }

    /// Whether a header of version 1 (text) is taken.
    pub fn takes_v1(self) -> bool {
        matches!(self, ProxyProtocol::V1 | ProxyProtocol::Any)
    }

    /// Whether a header of version 2 (binary) is taken.
    pub fn takes_v2(self) -> bool {
        matches!(self, ProxyProtocol::V2 | ProxyProtocol::Any)
    }
}

/// What the route does with the controller's decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// Reject what the limiter rejects.
    #[default]
    Enforce,
    /// Decide and count everything, admit all (pacing is decided, not applied). A
    /// concurrency queue would still hold requests: the config refuses one here.
    Shadow,
    /// Enforce the base limit only; count what the ROC cut would have rejected.
    ShadowAdaptive,
}

impl Mode {
    /// The mode's name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
            Mode::ShadowAdaptive => "shadow_adaptive",
        }
    }
}

/// How a route's limit is shared out.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum Partition {
    /// One limiter for the whole route.
    #[default]
    Route,
    /// One limiter per client IP.
    ClientIp(KeyLimits),
    /// One limiter per value of this request header (lower-case name), without the
    /// spaces and tabs around it (which HTTP/2 carries and HTTP/1 drops). A value longer
    /// than [`MAX_KEY_VALUE_BYTES`] is keyed by a 128-bit digest of it (a tier value
    /// too, so a tier of long tokens matches them); the header given more
    /// than once counts as no key, like a missing header. `host` is the host the
    /// request is for, its name alone in lower case (no port, no trailing dot): of its
    /// target's authority where it has one (absolute form, HTTP/2's `:authority`), else
    /// of its `Host`. `authorization` and `proxy-authorization` are a credential, its
    /// scheme in lower case, one space, then the credentials as sent (`Bearer  t` is
    /// `bearer t`), a value with no space kept whole.
    Header(String, KeyLimits),
}

/// The route label that `rocgate serve`'s upstream metrics give a request no route
/// takes; a route may not be named so.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// The least limit a route takes, req/s: one request in 11.6 days, so that the
/// interval between two requests stays within the limiters' nanosecond arithmetic. A
/// limit stored in Redis below it (by hand or by a faulty client) is no limit, as the
/// config would refuse it: the shared controller's script and its replay both take
/// the base limit then.
pub const MIN_LIMIT: f64 = 1e-6;

/// The longest header value that is kept whole as a key of a `header:<name>`
/// partition; a longer one is keyed by the first 128 bits of its SHA-256. A key is 16
/// bytes in its table whatever its value (every key is kept while it lives, and an
/// HTTP/1 head may carry a value of hundreds of KiB): a kept value takes 15 of them and
/// its length the 16th, so that a key costs at most 112 B beside its state by layout
/// (123 B for a concurrency key), within 128 B, whatever its value's length.
pub const MAX_KEY_VALUE_BYTES: usize = 15;

/// The key of a `header:host` partition: the host name alone, as nginx reads it to
/// choose a virtual host (`ngx_http_validate_host`), so that every spelling of one
/// host is one key. A host name in any case is one host (RFC 9110 §4.2.3); the port is
/// dropped (`shop.example:80`, `shop.example:8080` and `shop.example:` are
/// `shop.example`: nginx and Apache pick a virtual host by the name alone), as is one
/// trailing dot (`shop.example.` is the same fully qualified name). An IPv6 literal
/// keeps its brackets (`[2001:db8::1]:80` is `[2001:db8::1]`). Each of these used to be
/// a key of its own, a fresh quota per spelling: 2^n for a name of n letters, 65,536
/// for its ports.
pub(crate) fn host_key(value: &str) -> std::borrow::Cow<'_, str> {
    let name = host_name(value);
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(name.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// The host name of a `Host` value as sent, which [`host_key`] is in lower case: the
/// value without its port and one trailing dot. The layer builds a host's table key
/// from it, lower-casing as it copies or hashes, with no `String`.
pub(crate) fn host_name(value: &str) -> &str {
    let end = match value.strip_prefix('[') {
        Some(rest) => rest.find(']').map_or(value.len(), |close| close + 2),
        None => value.find(':').unwrap_or(value.len()),
    };
    let name = &value[..end];
    name.strip_suffix('.')
        .filter(|n| !n.is_empty())
        .unwrap_or(name)
}

/// Whether a `header:<name>` partition is keyed by credentials ([`credentials_key`]):
/// `Authorization` or `Proxy-Authorization`, in any case.
pub(crate) fn is_credentials_header(name: &str) -> bool {
    // Exactly first, as a config names them (in lower case): a byte-wise comparison
    // took 92 instructions of a request's decision.
    matches!(name, "authorization" | "proxy-authorization")
        || name.eq_ignore_ascii_case("authorization")
        || name.eq_ignore_ascii_case("proxy-authorization")
}

/// The key of a `header:authorization` (or `header:proxy-authorization`) partition,
/// from a value without the whitespace around it: its scheme in lower case and one
/// space, then the credentials as sent, so that every spelling of one credential is
/// one key. The scheme is case-insensitive and parted from the credentials by one or
/// more spaces (RFC 9110 §11.1, §11.4: `Bearer t`, `bearer t` and `BEARER  t` are one
/// token to the upstream); a tab there, which the grammar has not, is folded too. The
/// credentials keep their case (a token68 or an auth-param value is case-sensitive in
/// general), and a value with no space or tab (a bare token, as some APIs take) is kept
/// whole. Each spelling used to be a key of its own: 2^6 quotas for one token from the
/// case of `Bearer` alone, one more per added space. An auth-param list (`Digest a="B",
/// c=D`) is kept as sent, though its names are case-insensitive and a value may be
/// quoted or not (RFC 9110 §11.2): the schemes that send one sign each request anew (a
/// fresh key whatever its spelling), and a canonical form would cost every credential
/// a parse and a sort (README, "Partitions").
pub(crate) fn credentials_key(value: &str) -> std::borrow::Cow<'_, str> {
    match credentials_fold(value) {
        None => std::borrow::Cow::Borrowed(value),
        Some((scheme, credentials)) => {
            let mut key = String::with_capacity(scheme.len() + 1 + credentials.len());
            key.push_str(scheme);
            key.make_ascii_lowercase();
            key.push(' ');
            key.push_str(credentials);
            std::borrow::Cow::Owned(key)
        }
    }
}

/// How [`credentials_key`] folds `value`: its scheme and its credentials, which the
/// key is with the scheme in lower case and one space between them; `None` for a
/// value that is its own key (no space or tab, or already in the key's form). The
/// layer builds a credential's table key from these parts, with no `String`.
pub(crate) fn credentials_fold(value: &str) -> Option<(&str, &str)> {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let mut upper = false;
    let end = value.bytes().position(|b| {
        upper |= b.is_ascii_uppercase();
        blank(&b)
    })?;
    let (scheme, rest) = value.split_at(end);
    let spaces = rest.bytes().take_while(blank).count();
    if spaces == 1 && rest.starts_with(' ') && !upper {
        None
    } else {
        Some((scheme, &rest[spaces..]))
    }
}

/// Bounds on per-key state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyLimits {
    /// Most keys tracked at once, besides the keys the route's tiers list (which take
    /// a place in a full table). When the table is full, new keys share one overflow
    /// limiter (at the route's per-key limit) until keys are evicted: a full table
    /// evicts every key whose limiter holds nothing, idle or not.
    pub max_keys: usize,
    /// A key unseen for this long is evicted (at most 7 days).
    pub idle_timeout: Duration,
    /// Client-IP partitions: an IPv6 client is keyed by its first this many bits. 64
    /// (the default) keys a subscriber's /64, whose addresses one holder can rotate
    /// through to get a fresh quota each; 128 keys each address.
    pub ipv6_prefix: u8,
}

impl Default for KeyLimits {
    fn default() -> Self {
        KeyLimits {
            max_keys: 10_000,
            idle_timeout: Duration::from_secs(300),
            ipv6_prefix: 64,
        }
    }
}

/// Key values with limits of their own.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Tier {
    /// The tier's name.
    pub name: String,
    /// Key values (header values or IPs as text) that belong to the tier.
    pub values: Vec<String>,
    /// Per-key base limit for the tier, req/s.
    pub base_limit_rps: f64,
    /// Per-key cut limit for the tier, req/s.
    pub cut_limit_rps: f64,
}

impl Tier {
    /// The tier `name`: each key of `values` gets these per-key limits, req/s.
    pub fn new(
        name: impl Into<String>,
        values: impl IntoIterator<Item = impl Into<String>>,
        base_limit_rps: f64,
        cut_limit_rps: f64,
    ) -> Self {
        Tier {
            name: name.into(),
            values: values.into_iter().map(Into::into).collect(),
            base_limit_rps,
            cut_limit_rps,
        }
    }
}

/// A scheduled event: from `start` for `duration`, the route runs `controller`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Event {
    /// The event's name, shown as the active event.
    pub name: String,
    /// Wall-clock start.
    pub start: SystemTime,
    /// How long it lasts.
    pub duration: Duration,
    /// The profile in force meanwhile (the route's own, overridden field by field).
    pub controller: ControllerParams,
    /// Which of `controller`'s fields the event sets, the others being the route's own
    /// when it was configured: an event read from a file has them as its table wrote
    /// them. Without them ([`Event::new`]), a field the profile leaves as the route's
    /// own has it is taken as one the event leaves alone
    /// ([`ControllerParams::rebased`]), so an event built in code that sets a field to
    /// the route's own value follows a runtime change of it.
    pub sets: Option<ProfileFields>,
    /// A partitioned route's `route_limit` meanwhile, req/s (`None`: the route's own):
    /// put in force at the event's start and the route's back at its end, each as a
    /// limit change (tokens clamped, never refilled), scaled by a cut as the route's
    /// is. Only on a route with a `route_limit` of its own.
    pub route_limit_rps: Option<f64>,
}

impl Event {
    /// The event `name`: from `start`, for `duration`, the route runs `controller`;
    /// the fields it sets are those where `controller` differs from the route's own.
    pub fn new(
        name: impl Into<String>,
        start: SystemTime,
        duration: Duration,
        controller: ControllerParams,
    ) -> Self {
        Event {
            name: name.into(),
            start,
            duration,
            controller,
            sets: None,
            route_limit_rps: None,
        }
    }

    /// The event's profile, written over the route's own parameters `written_over`,
    /// moved onto the route's own parameters in force, `own`: the fields it sets are
    /// its own, the others `own`'s.
    #[must_use]
    pub fn profile_on(
        &self,
        written_over: &ControllerParams,
        own: &ControllerParams,
    ) -> ControllerParams {
        match &self.sets {
            Some(sets) => sets.apply(&self.controller, own),
            None => self.controller.rebased(written_over, own),
        }
    }
}

/// The reverse proxy's settings (`[server]` and `[admin]`).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The upstream: `http://host:port`, no path.
    pub upstream: String,
    /// Longest wait for a TCP connection to the upstream.
    pub connect_timeout: Duration,
    /// Longest wait for the upstream's response head, from the request's last body
    /// byte; also the longest a client may pause its body (408), and the upstream its
    /// response body (the client's connection is aborted).
    pub response_timeout: Duration,
    /// Longest wait for a connection's first byte, and for a request head to be
    /// complete once its first byte is in; not the wait between requests on a
    /// keep-alive connection, which is `idle_timeout`'s.
    pub header_read_timeout: Duration,
    /// Largest request body forwarded.
    pub max_body_bytes: u64,
    /// Most upstream connections held by client connections of their own (0: every
    /// request goes through the shared pool).
    pub max_upstream_lanes: usize,
    /// How long an upstream connection may sit idle and still be reused (pool and
    /// lanes); keep it below the upstream's own keep-alive timeout.
    pub upstream_idle_timeout: Duration,
    /// Whether the upstream receives a request's path
    /// [normalized](normalize_path), the path its route was matched on (`true`,
    /// the default), or as the client sent it.
    pub normalize_path: bool,
    /// Networks whose client IP header ([`client_ip_header`](Self::client_ip_header))
    /// is believed.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// How many entries of the client IP header are believed from the right, from
    /// any peer (Envoy's `xff_num_trusted_hops`; 0, the default: none, the trusted
    /// proxies decide); at most 10, and not with `trusted_proxies`. The client is the
    /// N-th entry from the right, the left-most of fewer; every peer is taken for
    /// the nearest of N proxies, so rocgate must be reachable through them alone.
    pub trusted_hops: usize,
    /// The header the trusted proxies write the client's address in: only that one
    /// is read.
    pub client_ip_header: ClientIpHeader,
    /// The PROXY protocol header each connection from
    /// [`proxy_protocol_networks`](Self::proxy_protocol_networks) must begin with
    /// (off by default): its source address is the connection's peer from then on,
    /// for client IP keys, `X-Forwarded-For` and `max_connections_per_client`; a header
    /// that names none (`UNKNOWN`, `LOCAL`, a family other than TCP) leaves the proxy
    /// the peer, the forwarding headers of its requests (its relayed client's) unread. A
    /// connection from those networks without a valid header is closed; one from any
    /// other peer is read as plain HTTP, its socket's peer its address (a header it
    /// sends is a malformed request).
    pub proxy_protocol: ProxyProtocol,
    /// The peers whose connections must begin with the PROXY protocol header (with
    /// [`proxy_protocol`](Self::proxy_protocol) on); `None`, as left out of a file,
    /// for [`trusted_proxies`](Self::trusted_proxies)
    /// ([`proxy_protocol_networks`](Self::proxy_protocol_networks)). Apart from
    /// them, an L4 load balancer (its header believed) need not be a trusted proxy
    /// (its `X-Forwarded-For` believed, which an L4 balancer relays from its client
    /// as written), and an L7 proxy beside it (trusted, plain HTTP) need not send a
    /// header. The client a header names is the connection's peer, its forwarding
    /// headers believed only if it is itself in `trusted_proxies`.
    pub proxy_protocol_from: Option<Vec<ipnet::IpNet>>,
    /// How long requests in flight may finish after shutdown begins.
    pub shutdown_grace: Duration,
    /// Most client connections open at once (the admin API's are not counted); at the
    /// cap, the connections idle longest are closed to make room, and further
    /// connections wait (in the kernel's listen backlog) until one closes.
    pub max_connections: usize,
    /// Most client connections open at once from one client address (an IPv6 client's
    /// /64), if set; the connections of the trusted proxies and of
    /// [`proxy_protocol_networks`](Self::proxy_protocol_networks) are not counted (a
    /// client a PROXY protocol header names is, unless it is a trusted proxy). Beyond
    /// it, a connection is closed as soon as it is accepted.
    pub max_connections_per_client: Option<usize>,
    /// Most requests forwarded to the upstream at once, through the pool, lanes and
    /// WebSocket tunnels together, each counted until its response body ends or its
    /// tunnel closes; at the cap, further admitted requests get 503
    /// `upstream_overflow` at once.
    pub max_upstream_requests: usize,
    /// How long a client connection may have no request in progress before it is
    /// closed gracefully (HTTP/1.1, its wait for its next request included, and
    /// HTTP/2); also how long a WebSocket tunnel may carry nothing before it is
    /// closed.
    pub idle_timeout: Duration,
    /// The longest a lingering close reads what a client still sends, in all: an
    /// HTTP/1.1 connection closed after an answer that left its request's body unread
    /// (a 429, a 413) reads and throws the rest away before it closes (nginx's
    /// `lingering_time`).
    pub lingering_time: Duration,
    /// The longest pause in what the client sends during a lingering close (nginx's
    /// `lingering_timeout`).
    pub lingering_timeout: Duration,
    /// Where the admin API listens.
    pub admin_listen: SocketAddr,
    /// Bearer token required by mutating admin endpoints, if set (`***` in `{:?}`),
    /// and by every read from beyond loopback but the health checks with
    /// [`admin_reads`](Self::admin_reads) [`AdminReads::Token`].
    pub admin_token: Option<Secret>,
    /// Names of this host, besides `localhost` and IP addresses, that a request to the
    /// admin API from loopback may carry in `Host` (lower-case, without a trailing
    /// dot): one naming any other host is refused, as a web page's through a name
    /// re-bound to 127.0.0.1 (DNS rebinding) would be.
    pub admin_allowed_hosts: Vec<String>,
    /// Whether a read of the admin API from beyond loopback needs the token
    /// (`[admin] reads`): [`AdminReads::Token`] is taken only with
    /// [`admin_token`](Self::admin_token) set (set by hand without it, every read
    /// from beyond loopback but the health checks is refused).
    pub admin_reads: AdminReads,
    /// Wrong bearer tokens a client address may send to the admin API at once (at
    /// least 1); past them, and the rate below, a request with a token gets 429.
    pub admin_wrong_tokens_burst: u32,
    /// Wrong bearer tokens a client address may send to the admin API per second once
    /// its burst is spent.
    pub admin_wrong_tokens_per_second: f64,
}

impl ServerConfig {
    /// The networks whose connections must begin with the PROXY protocol header,
    /// `proxy_protocol` on: [`proxy_protocol_from`](Self::proxy_protocol_from), or
    /// the trusted proxies where it is `None`.
    pub fn proxy_protocol_networks(&self) -> &[ipnet::IpNet] {
        self.proxy_protocol_from
            .as_deref()
            .unwrap_or(&self.trusted_proxies)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstream: "http://127.0.0.1:3000".into(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            max_body_bytes: 10 * 1024 * 1024,
            max_upstream_lanes: 1024,
            upstream_idle_timeout: Duration::from_secs(4),
            normalize_path: true,
            trusted_proxies: Vec::new(),
            trusted_hops: 0,
            client_ip_header: ClientIpHeader::XForwardedFor,
            proxy_protocol: ProxyProtocol::Off,
            proxy_protocol_from: None,
            shutdown_grace: Duration::from_secs(30),
            max_connections: 10_000,
            max_connections_per_client: None,
            max_upstream_requests: 10_000,
            idle_timeout: Duration::from_secs(75),
            lingering_time: Duration::from_secs(30),
            lingering_timeout: Duration::from_secs(5),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            admin_token: None,
            admin_allowed_hosts: Vec::new(),
            admin_reads: AdminReads::Open,
            admin_wrong_tokens_burst: 10,
            admin_wrong_tokens_per_second: 1.0,
        }
    }
}

/// `[hints]`: the history the tuning hints are computed from, and when the upstream
/// counts as saturated.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct HintsConfig {
    /// Length of one history interval (the finest grain of a period).
    pub interval: Duration,
    /// How much history is kept (the longest period that can be asked for).
    pub keep: Duration,
    /// Saturation budgets and the least evidence.
    pub policy: crate::hints::Policy,
}

impl Default for HintsConfig {
    /// 10 s intervals, 1 h kept, [`crate::hints::Policy::default`].
    fn default() -> Self {
        HintsConfig {
            interval: Duration::from_secs(10),
            keep: Duration::from_secs(3600),
            policy: crate::hints::Policy::default(),
        }
    }
}

#[cfg(test)]
mod quoting_tests {
    use super::*;

    /// A value of at most 64 characters is quoted whole; a longer one by its first 64
    /// (characters, not bytes) and its length.
    #[test]
    fn a_value_is_quoted_whole_or_by_its_start() {
        assert_eq!(format!("{:?}", quoted("gw\n1")), r#""gw\n1""#);
        assert_eq!(format!("{}", quoted("gw-1")), "gw-1");
        let long = "é".repeat(100);
        let start = "é".repeat(64);
        assert_eq!(
            format!("{:?}", quoted(&long)),
            format!("\"{start}\"… (200 bytes)")
        );
        assert_eq!(
            format!("{}", quoted(&long)),
            format!("{start}… (200 bytes)")
        );
        let url = format!("https://{}", "x".repeat(1000));
        let e = check_upstream(&url).unwrap_err().to_string();
        assert!(e.ends_with(r#"x"… (1008 bytes)"#), "{e}");
    }

    /// A deserializer's message has each quoted part bounded, an escape counted as one
    /// character and never cut.
    #[test]
    fn quotes_in_a_message_are_bounded() {
        let short = r#"invalid type: string "a\"b", expected `x`"#;
        assert_eq!(quotes_bounded(short), short);
        let key = "k".repeat(63) + r"\u{1}" + &"k".repeat(10);
        let message = format!("unknown field `{}`, expected \"{key}\"", "f".repeat(70));
        assert_eq!(
            quotes_bounded(&message),
            format!(
                "unknown field `{}`… (70 bytes), expected \"{}\\u{{1}}\"… (78 bytes)",
                "f".repeat(64),
                "k".repeat(63)
            )
        );
        assert_eq!(quotes_bounded("an \"open quote"), "an \"open quote");
    }
}

#[cfg(test)]
mod credentials_key_tests {
    use super::*;
    use std::borrow::Cow;

    /// A value already in its key's form is the key itself, borrowed; another spelling
    /// is folded to that form, its credentials as sent.
    #[test]
    fn a_credential_is_keyed_by_its_scheme_in_lower_case_and_one_space() {
        for value in [
            "bearer Tok.1",
            "basic dTpw",
            "Tok.1",
            "TOK",
            "digest a=\"B\", c=D",
        ] {
            assert!(
                matches!(credentials_key(value), Cow::Borrowed(v) if v == value),
                "{value:?}"
            );
        }
        for (value, key) in [
            ("Bearer Tok.1", "bearer Tok.1"),
            ("BEARER   Tok.1", "bearer Tok.1"),
            ("bearer\tTok.1", "bearer Tok.1"),
            ("bearer \t Tok.1", "bearer Tok.1"),
            ("bearer  Tok 1", "bearer Tok 1"),
            ("Digest a=\"B\",  c=D", "digest a=\"B\",  c=D"),
        ] {
            assert!(
                matches!(credentials_key(value), Cow::Owned(k) if k == key),
                "{value:?}"
            );
        }
    }

    /// A tier built in code (no file) on a credentials partition, its header named in
    /// any case, is refused as a file's is when no request's credential can match it
    /// (a scheme with a capital, more than one blank or a tab after it), and taken in
    /// its key's form: by `Config::validate`, which `Engine::new` (so every layer and
    /// simulator built in code) calls first.
    #[test]
    fn a_tier_built_in_code_that_no_credential_can_match_is_refused() {
        let config = |header: &str, value: &str| {
            let mut route = RouteConfig::new("api", RouteMatch::any());
            route.partition = Partition::Header(header.into(), KeyLimits::default());
            route.tiers = vec![Tier::new("gold", [value], 100.0, 50.0)];
            Config::new(vec![route])
        };
        for header in ["authorization", "Proxy-Authorization", "AUTHORIZATION"] {
            for (value, key) in [
                ("Bearer t", "bearer t"),
                ("bearer  t", "bearer t"),
                ("bearer\tt", "bearer t"),
                ("DIGEST a=\"B\", c=D", "digest a=\"B\", c=D"),
            ] {
                let e = config(header, value).validate().unwrap_err().to_string();
                assert!(
                    e.contains("routes[0].tiers[0].values[0]: can never match: credentials are keyed by their scheme in lower case")
                        && e.contains(&format!("({key:?}), got {value:?}")),
                    "{header}, {value:?}: {e}"
                );
                let engine = crate::engine::Engine::new(
                    &config(header, value),
                    crate::clock::Nanos::ZERO,
                    SystemTime::UNIX_EPOCH,
                );
                assert_eq!(engine.unwrap_err().to_string(), e);
            }
            for value in ["bearer t", "T0ken", "digest a=\"B\", c=D"] {
                config(header, value)
                    .validate()
                    .unwrap_or_else(|e| panic!("{header}, {value:?}: {e}"));
            }
        }
    }
}
