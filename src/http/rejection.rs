//! The rejection response: status, `Retry-After`, RateLimit headers and a JSON body.
//!
//! ```text
//! HTTP/1.1 429 Too Many Requests
//! retry-after: 3
//! ratelimit-policy: "order";q=60;w=1
//! ratelimit: "order";r=0;t=3
//! rocgate-reason: roc_cut
//! content-type: application/json
//! content-length: 81
//!
//! {"error":"rate_limited","reason":"roc_cut","retry_after_ms":2731,"route":"order"}
//! ```
//!
//! The status is the route's `reject_status` (429 unless configured, e.g. 503 for
//! capacity shedding). `Retry-After` is whole seconds, rounded up, at least 1. For `roc_cut` it is derived
//! from the controller's restore schedule (when the limit will next rise) plus a random
//! jitter of up to that long again (between 1 s and 10 s), so rejected clients do not
//! all return in the same second. `RateLimit-Policy` and `RateLimit` follow the IETF
//! draft (draft-ietf-httpapi-ratelimit-headers): the quota `q` is the limit the request
//! was refused at (the route's in force, or its key's tier's, or a partitioned
//! route's `route_limit` in force when that refused it) per `w = 1` second, or
//! over a window in which it is a whole number of requests (0.5 req/s is `q=1;w=2`,
//! 2.5 req/s `q=5;w=2`); for the window algorithms what a window admits, over it
//! (`q=2;w=1` at 2.5 req/s in windows of 1 s), and for the
//! `concurrency` algorithm requests in flight (`q=10;qu="concurrent-requests"`); `r` is the
//! remaining quota (0) and `t` the seconds to wait. The body's `retry_after_ms` is the
//! wait in milliseconds, rounded up.
//!
//! # Another response
//!
//! A rejection, and only a rejection, carries the `rocgate-reason` header. To answer
//! in another form (an HTML page, `application/problem+json`), map responses outside
//! the layer and rewrite those that carry it; the status and `Retry-After` are the
//! layer's to keep or change. Give `Content-Length` the new body's length, and leave
//! the answer to a `HEAD` without a body (its rejection's is empty): an HTTP/2 server
//! sends a body it is given, in frames a `HEAD`'s stream must not carry.
//!
//! ```
//! use axum::{body::Body, response::Response, routing::get, Router};
//! use http::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
//! use http_body::Body as _;
//! use rocgate::config::{Config, RouteConfig, RouteMatch};
//! use rocgate::http::AdmissionLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! const PAGE: &str = "<h1>Busy, back in a moment</h1>";
//!
//! fn busy_page(response: Response) -> Response {
//!     if !response.headers().contains_key("rocgate-reason") {
//!         return response; // admitted: the handler's own response
//!     }
//!     let (mut head, json) = response.into_parts();
//!     let bodiless = json.size_hint().exact() == Some(0); // a HEAD's
//!     head.headers.insert(CONTENT_LENGTH, HeaderValue::from(PAGE.len()));
//!     head.headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/html"));
//!     let page = if bodiless { Body::empty() } else { Body::from(PAGE) };
//!     Response::from_parts(head, page)
//! }
//!
//! let mut page = RouteConfig::new("page", RouteMatch::prefix("/"));
//! page.controller.base_limit_rps = 1.0;
//! page.controller.cut_limit_rps = 1.0;
//! let admission = AdmissionLayer::from_config(&Config::new(vec![page])).expect("valid routes");
//! let app = Router::new().route("/", get(|| async { "home" })).layer(
//!     ServiceBuilder::new().map_response(busy_page).layer(admission),
//! );
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let get = || http::Request::get("/").body(Body::empty()).unwrap();
//! assert_eq!(app.clone().oneshot(get()).await.unwrap().status(), 200);
//! let rejected = app.clone().oneshot(get()).await.unwrap();
//! assert_eq!(rejected.status(), 429);
//! assert_eq!(rejected.headers()["content-type"], "text/html");
//! assert_eq!(rejected.headers()["retry-after"], "1");
//! let body = axum::body::to_bytes(rejected.into_body(), 1024).await.unwrap();
//! assert_eq!(body, PAGE);
//! let head = http::Request::head("/").body(Body::empty()).unwrap();
//! let rejected = app.oneshot(head).await.unwrap();
//! assert_eq!(rejected.status(), 429);
//! assert_eq!(rejected.headers()["content-length"], PAGE.len().to_string().as_str());
//! assert_eq!(rejected.into_body().size_hint().exact(), Some(0));
//! # });
//! ```

use crate::engine::{Engine, RouteId};
use crate::limiter::{words, Algorithm, Reason, Rejection};
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, Response, StatusCode};
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static REASON: HeaderName = HeaderName::from_static("rocgate-reason");
static JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The time a rejected client is told to wait: the limiter's exact time, or for a
/// cut, the restore schedule (`restore_eta`) with jitter. So is a distributed route's
/// `fallback_local` refusal while the shared controller was last seen cut or
/// recovering (its `restore_eta` is the schedule last seen): the cut is still in
/// force, and its bucket's wait would send every client it refuses back at once. A
/// `concurrency` refusal told more than a second (its permits held long: see
/// [`Concurrency`](crate::limiter::Concurrency)) gets the same jitter over its wait:
/// the clients it refuses within a second are all told the same mean wait, and the
/// permits freed then are a few. Told a second or less, the header's whole second.
///
/// A `queue_full` is told its wait as it is: the rejection does not say whether a
/// `leaky_bucket` (whose wait is exact) or a `concurrency` route refused it. The
/// admission layer, which knows the route, jitters a `concurrency` route's
/// `queue_full` as its `concurrency` refusals.
pub fn retry_after(rejection: &Rejection, restore_eta: Option<Duration>) -> Duration {
    told(
        rejection,
        restore_eta,
        rejection.reason == Reason::Concurrency,
    )
}

/// [`retry_after`] for a rejection on `route`, the route of `engine` that refused
/// it: a `concurrency` route's `queue_full` is, like its `concurrency` refusal, an
/// estimate from how long permits are held, jittered when over a second.
pub(crate) fn retry_after_on(
    engine: &Engine,
    route: RouteId,
    rejection: &Rejection,
    restore_eta: Option<Duration>,
) -> Duration {
    let estimated = match rejection.reason {
        Reason::Concurrency => true,
        Reason::QueueFull => matches!(engine.algorithm(route), Some(Algorithm::Concurrency { .. })),
        _ => false,
    };
    told(rejection, restore_eta, estimated)
}

/// [`retry_after`], `estimated` telling whether the limiter's wait is a concurrency
/// limiter's estimate.
fn told(rejection: &Rejection, restore_eta: Option<Duration>, estimated: bool) -> Duration {
    match (rejection.reason, restore_eta) {
        (Reason::RocCut | Reason::FallbackLocal, Some(eta)) => jittered(
            rejection.retry_after.max(eta),
            eta.max(Duration::from_secs(1)),
        ),
        _ if estimated && rejection.retry_after > Duration::from_secs(1) => {
            jittered(rejection.retry_after, rejection.retry_after)
        }
        _ => rejection.retry_after,
    }
}

/// `wait` plus a random jitter of up to `spread`, at most 10 s, so that clients told
/// the same wait do not all come back in the same second.
fn jittered(wait: Duration, spread: Duration) -> Duration {
    wait + spread.min(Duration::from_secs(10)).mul_f64(fastrand::f64())
}

/// The response to a rejected request on `route`, with the route's status
/// (`reject_status`, 429 by default). It carries `Content-Length`: whatever replaces
/// its body must set that header again or remove it. For a route `engine` does not
/// hold (see [`RouteId`]; its [`Engine::check`] rejects none), a 429 that names no
/// route, with a quota of 0.
pub fn respond<B: From<Bytes>>(
    engine: &Engine,
    route: RouteId,
    rejection: &Rejection,
    retry_after: Duration,
) -> Response<B> {
    respond_at_limit(
        engine,
        route,
        rejection,
        retry_after,
        engine.limit_rps(route).unwrap_or(0.0),
    )
}

/// As [`respond`], with the quota in the `RateLimit-Policy` header taken from
/// `limit_rps` rather than the engine's limit (a limit shared by a fleet of instances).
pub fn respond_at_limit<B: From<Bytes>>(
    engine: &Engine,
    route: RouteId,
    rejection: &Rejection,
    retry_after: Duration,
    limit_rps: f64,
) -> Response<B> {
    let name = engine.route_name(route).unwrap_or_default();
    let secs = secs_up(retry_after);
    let reason = rejection.reason.as_str();
    let mut body = String::with_capacity(96);
    let _ = write!(
        body,
        r#"{{"error":"rate_limited","reason":"{reason}","retry_after_ms":{},"route":"{name}"}}"#,
        millis_up(retry_after)
    );
    let length = content_length(body.len());
    let mut response = Response::new(B::from(Bytes::from(body)));
    *response.status_mut() = engine
        .reject_status(route)
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    if let Some(v) = policy_header(name, policy(engine, route, limit_rps)) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r=0;t={secs}")) {
        headers.insert(RATELIMIT.clone(), v);
    }
    headers.insert(REASON.clone(), HeaderValue::from_static(reason));
    headers.insert(CONTENT_TYPE, JSON.clone());
    headers.insert(CONTENT_LENGTH, length);
    response
}

/// The wait in whole milliseconds, rounded up: a positive wait is never 0.
/// `wait` in whole seconds, rounded up, at least 1 (saturating: `Duration::MAX` is
/// `u64::MAX` seconds, not 0).
fn secs_up(wait: Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
        .max(1)
}

fn millis_up(wait: Duration) -> u64 {
    let ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    ms.saturating_add(u64::from(wait.subsec_nanos() % 1_000_000 > 0))
}

/// The quota and window (whole seconds) that `RateLimit-Policy` states for a limit
/// on `route`: over the shortest window of up to [`EXACT_WINDOW_S`] seconds in which
/// the limit admits a whole number of requests (2.5 req/s is 5 per 2 s, 0.3 req/s 3
/// per 10 s); a limit with none, per second, rounded down (12.34 req/s is 12 per
/// 1 s), or under 1 req/s the requests it admits over the whole seconds one takes (1/3
/// req/s is 1 per 3 s), never a quota of 0 for a limit above it. For the
/// `concurrency` algorithm, requests in flight, with no window (0). For the window
/// algorithms, the whole requests their window admits ([`window_policy`]).
fn policy(engine: &Engine, route: RouteId, limit_rps: f64) -> (u64, u64) {
    match engine.algorithm(route) {
        // The permits the limiter grants, rounded as it rounds them.
        Some(Algorithm::Concurrency { .. }) => (u64::from(crate::limiter::permits(limit_rps)), 0),
        Some(Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window }) => {
            window_policy(limit_rps, *window)
        }
        _ => rate_policy(limit_rps),
    }
}

/// [`policy`] for a fixed or sliding window of length `window` at `limit_rps`: the
/// quota the window admits (`limit × window`, rounded down: 2 at 2.5 req/s in windows
/// of 1 s, which admit no more) over the window, if it is whole seconds, or over the
/// shortest span of whole seconds, up to [`EXACT_WINDOW_S`], that is whole windows (4
/// per 1 s in windows of 500 ms admitting 2); else the rate the windows admit, as
/// [`rate_policy`] states it.
fn window_policy(limit_rps: f64, window: Duration) -> (u64, u64) {
    let kept_ms = words::window_ms(window);
    let quota = words::quota(limit_rps, words::window_ns(kept_ms)) as u64;
    let window_ms = u64::from(kept_ms);
    if window_ms % 1000 == 0 {
        return (quota, window_ms / 1000);
    }
    let whole = (1..=EXACT_WINDOW_S)
        .find(|w| (w * 1000) % window_ms == 0)
        .map(|w| (quota.saturating_mul(w * 1000 / window_ms), w));
    whole.unwrap_or_else(|| rate_policy(quota as f64 * 1000.0 / window_ms as f64))
}

/// [`policy`] for a rate of `limit_rps`.
fn rate_policy(limit_rps: f64) -> (u64, u64) {
    if limit_rps.is_nan() || limit_rps <= 0.0 {
        return (0, 1);
    }
    let exact = (1..=EXACT_WINDOW_S).find_map(|w| {
        let quota = limit_rps * w as f64;
        let whole = quota.round();
        ((quota - whole).abs() <= 1e-9 * whole && whole >= 1.0).then_some((whole as u64, w))
    });
    if let Some(policy) = exact {
        return policy;
    }
    if limit_rps >= 1.0 {
        return (limit_rps.floor() as u64, 1);
    }
    let window = (1.0 / limit_rps).ceil();
    ((limit_rps * window).floor().max(1.0) as u64, window as u64)
}

/// The longest window `RateLimit-Policy` states a limit over to make its quota a
/// whole number of requests ([`policy`]), seconds.
const EXACT_WINDOW_S: u64 = 10;

/// The `RateLimit-Policy` value of route `name` with this quota and window ([`policy`]):
/// a quota of requests in flight is in the draft's unit `concurrent-requests`.
fn policy_header(name: &str, (quota, window): (u64, u64)) -> Option<HeaderValue> {
    // Route names are validated to [A-Za-z0-9_.:-], safe inside a quoted string.
    let value = match window {
        0 => format!("\"{name}\";q={quota};qu=\"concurrent-requests\""),
        w => format!("\"{name}\";q={quota};w={w}"),
    };
    HeaderValue::from_str(&value).ok()
}

/// Rejection responses built once per engine and route limit, so that a rejection
/// formats nothing and hashes no header name: it clones a header map (two
/// allocations), writes the body into one exactly sized buffer, and replaces
/// `Retry-After`, `RateLimit` and the reason only when they differ from the common
/// case (a `limit` rejection told to come back in 1 s).
#[derive(Default)]
pub(crate) struct Templates {
    built: ArcSwapOption<Built>,
}

struct Built {
    /// The engine these were built for: a weak reference keeps its allocation, so no
    /// later engine can share its address, without keeping the engine itself alive.
    engine: Weak<Engine>,
    routes: Box<[RouteTemplate]>,
}

struct RouteTemplate {
    /// The quota and window that `RateLimit-Policy` states ([`policy`]) for the
    /// route's limit.
    policy: (u64, u64),
    status: StatusCode,
    /// Every header of a `limit` rejection with `Retry-After: 1`; `Content-Length` is
    /// set per response.
    headers: HeaderMap,
    /// `,"route":"NAME"}`: the end of the body.
    body_end: Box<[u8]>,
}

const BODY_START: &[u8] = br#"{"error":"rate_limited","reason":""#;
const BODY_MS: &[u8] = br#"","retry_after_ms":"#;

impl Built {
    fn new(engine: &Arc<Engine>) -> Self {
        let routes = engine
            .route_ids()
            .zip(engine.route_names())
            .map(|(route, name)| {
                let policy = policy(engine, route, engine.limit_rps(route).unwrap_or(0.0));
                // Room for 12 (the map's slots are a power of two): a response made
                // from it takes a replaced header, or one more, without rehashing.
                let mut headers = HeaderMap::with_capacity(7);
                headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
                if let Some(v) = policy_header(name, policy) {
                    headers.insert(RATELIMIT_POLICY.clone(), v);
                }
                if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r=0;t=1")) {
                    headers.insert(RATELIMIT.clone(), v);
                }
                headers.insert(
                    REASON.clone(),
                    HeaderValue::from_static(Reason::Limit.as_str()),
                );
                headers.insert(CONTENT_TYPE, JSON.clone());
                headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
                RouteTemplate {
                    policy,
                    status: engine
                        .reject_status(route)
                        .and_then(|s| StatusCode::from_u16(s).ok())
                        .unwrap_or(StatusCode::TOO_MANY_REQUESTS),
                    headers,
                    body_end: format!(r#","route":"{name}"}}"#).into_bytes().into(),
                }
            })
            .collect();
        Built {
            engine: Arc::downgrade(engine),
            routes,
        }
    }
}

impl Templates {
    /// The response to a rejected request on `route`, refused at `limit_rps` (the
    /// route's limit, or its key's tier's): as [`respond_at_limit`], from templates.
    pub(crate) fn respond<B: From<Bytes>>(
        &self,
        engine: &Arc<Engine>,
        route: RouteId,
        rejection: &Rejection,
        retry_after: Duration,
        limit_rps: f64,
    ) -> Response<B> {
        // Templates are by place in the engine's table: an id from another engine (of a
        // route a reload kept, or none) is answered without them.
        let (Some(limit), true) = (
            engine.limit_rps(route),
            engine.route_at(route.index()) == Some(route),
        ) else {
            return respond_at_limit(engine, route, rejection, retry_after, limit_rps);
        };
        let route_policy = policy(engine, route, limit);
        let guard = self.built.load();
        let fresh;
        let built = match guard.as_deref() {
            Some(b)
                if Weak::as_ptr(&b.engine) == Arc::as_ptr(engine)
                    && b.routes.get(route.index()).map(|t| t.policy) == Some(route_policy) =>
            {
                b
            }
            _ => {
                fresh = Arc::new(Built::new(engine));
                self.built.store(Some(Arc::clone(&fresh)));
                &*fresh
            }
        };
        let Some(template) = built.routes.get(route.index()) else {
            return respond_at_limit(engine, route, rejection, retry_after, limit_rps);
        };
        let secs = secs_up(retry_after);
        let reason = rejection.reason.as_str();

        let mut digits = Digits::default();
        let ms = digits.of(millis_up(retry_after));
        let mut body = Vec::with_capacity(
            BODY_START.len() + reason.len() + BODY_MS.len() + ms.len() + template.body_end.len(),
        );
        body.extend_from_slice(BODY_START);
        body.extend_from_slice(reason.as_bytes());
        body.extend_from_slice(BODY_MS);
        body.extend_from_slice(ms);
        body.extend_from_slice(&template.body_end);
        let length = content_length(body.len());

        let mut response = Response::new(B::from(Bytes::from(body)));
        *response.status_mut() = template.status;
        let headers = response.headers_mut();
        *headers = template.headers.clone();
        // `Content-Length` is in the template, so the one an axum route adds to a
        // response lacking it does not grow the copy, whose entries have no room to
        // spare (a cloned `Vec` never has).
        headers.insert(CONTENT_LENGTH, length);
        if secs != 1 {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
            let name = engine.route_name(route).unwrap_or_default();
            if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r=0;t={secs}")) {
                headers.insert(RATELIMIT.clone(), v);
            }
        }
        if rejection.reason != Reason::Limit {
            headers.insert(REASON.clone(), HeaderValue::from_static(reason));
        }
        let own_policy = policy(engine, route, limit_rps);
        if own_policy != template.policy {
            let name = engine.route_name(route).unwrap_or_default();
            if let Some(v) = policy_header(name, own_policy) {
                headers.insert(RATELIMIT_POLICY.clone(), v);
            }
        }
        response
    }
}

/// A `Content-Length` value. Up to 1 KiB (every rejection body) it is one of a table
/// of static strings made once: no allocation and no shared count to bump per
/// response, where `HeaderValue::from(n)` allocates.
fn content_length(n: usize) -> HeaderValue {
    static SMALL: OnceLock<Box<[&'static str]>> = OnceLock::new();
    let small = SMALL.get_or_init(|| {
        let all: String = (0..=1024).map(|i| format!("{i} ")).collect();
        Box::leak(all.into_boxed_str()).split_whitespace().collect()
    });
    small
        .get(n)
        .map_or_else(|| HeaderValue::from(n), |s| HeaderValue::from_static(s))
}

/// Decimal digits of a number, on the stack.
#[derive(Default)]
struct Digits([u8; 20]);

impl Digits {
    fn of(&mut self, mut n: u64) -> &[u8] {
        let mut i = self.0.len();
        loop {
            i -= 1;
            self.0[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return &self.0[i..];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Nanos;
    use crate::config::{Config, RouteConfig, RouteMatch};

    fn parts(r: Response<Bytes>) -> (StatusCode, Vec<(String, String)>, Bytes) {
        let headers = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        (r.status(), headers, r.into_body())
    }

    /// An engine of one route (`order`, every path, the default limits), and it.
    fn one_route() -> (Arc<Engine>, RouteId) {
        let engine = Arc::new(
            Engine::new(
                &Config::new(vec![RouteConfig::new("order", RouteMatch::prefix("/"))]),
                Nanos::ZERO,
                std::time::SystemTime::UNIX_EPOCH,
            )
            .unwrap(),
        );
        let route = engine.route_at(0).unwrap();
        (engine, route)
    }

    /// A concurrency route's quota is the permits its limiter grants: a tier key's
    /// limit recovering to 16 between 1 and 23 comes out a rounding error short
    /// (15.999999999999998), the limiter grants 16, and the policy says 16 (it said
    /// 15).
    #[test]
    fn a_concurrency_quota_states_the_permits_granted() {
        let limit = 1.0 + (23.0 - 1.0) * ((16.0 - 1.0) / (23.0 - 1.0));
        assert!(limit < 16.0, "{limit}");
        let granted = crate::limiter::Concurrency::new(limit, 0);
        let held: Vec<_> = (0..20)
            .map(|_| granted.check(Nanos::ZERO))
            .filter(|d| d.is_admit())
            .collect();
        assert_eq!(held.len(), 16);
        let mut r = RouteConfig::new("conc", RouteMatch::prefix("/"));
        r.algorithm = Algorithm::Concurrency { queue: 0 };
        r.controller.base_limit_rps = 23.0;
        r.controller.cut_limit_rps = 1.0;
        let engine =
            Engine::new(&Config::new(vec![r]), Nanos::ZERO, std::time::UNIX_EPOCH).unwrap();
        let route = engine.route_at(0).unwrap();
        assert_eq!(policy(&engine, route, limit), (16, 0));
        assert_eq!(policy(&engine, route, 16.5), (16, 0));
    }

    #[test]
    fn templates_answer_exactly_as_respond() {
        let mut a = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
        a.reject_status = 503;
        let b = RouteConfig::new("search", RouteMatch::prefix("/search"));
        let engine = Arc::new(
            Engine::new(
                &Config::new(vec![a, b]),
                Nanos::ZERO,
                std::time::SystemTime::UNIX_EPOCH,
            )
            .unwrap(),
        );
        let templates = Templates::default();
        for route in engine.route_ids() {
            for reason in [Reason::Limit, Reason::RocCut, Reason::QueueFull] {
                for ms in [1, 999, 1000, 1001, 2731, 60_000] {
                    let rej = Rejection {
                        retry_after: Duration::from_millis(ms),
                        reason,
                    };
                    let wait = Duration::from_millis(ms);
                    let want = respond::<Bytes>(&engine, route, &rej, wait);
                    let limit = engine.limit_rps(route).unwrap();
                    let got = templates.respond::<Bytes>(&engine, route, &rej, wait, limit);
                    let want_body = format!("{:?}", want.body());
                    let got_body = format!("{:?}", got.body());
                    // Room for a header more without rehashing (see `Built::new`).
                    assert!(got.headers().capacity() > got.headers().len());
                    let length = got.headers()[CONTENT_LENGTH].to_str().unwrap().to_owned();
                    assert_eq!(length, got.body().len().to_string(), "{got_body}");
                    assert_eq!(parts(got), parts(want), "{route:?} {reason:?} {ms}");
                    assert_eq!(got_body, want_body);
                }
            }
        }
    }

    /// A wait past what seconds can hold (a library caller's `Duration::MAX`) is told
    /// as the most seconds there are, by both paths: the header's sum overflowed
    /// (a panic in debug builds, `Retry-After: 1` in release ones).
    #[test]
    fn a_wait_of_duration_max_is_told_as_the_longest() {
        let (engine, route) = one_route();
        let rej = Rejection {
            retry_after: Duration::MAX,
            reason: Reason::Limit,
        };
        let longest = u64::MAX.to_string();
        let direct = respond::<Bytes>(&engine, route, &rej, Duration::MAX);
        assert_eq!(direct.headers()[RETRY_AFTER], longest.as_str());
        let templated =
            Templates::default().respond::<Bytes>(&engine, route, &rej, Duration::MAX, 200.0);
        assert_eq!(templated.headers()[RETRY_AFTER], longest.as_str());
    }

    #[test]
    fn a_wait_under_a_millisecond_is_no_zero_in_the_body() {
        // A token bucket at 10,000 req/s says to come back in 100 µs: the body said
        // `"retry_after_ms":0`, a client reading it retried at once.
        let (engine, route) = one_route();
        let templates = Templates::default();
        for (wait, ms) in [
            (100_000, 1),
            (1_000_000, 1),
            (1_000_001, 2),
            (2_731_000_000, 2731),
        ] {
            let rej = Rejection {
                retry_after: Duration::from_nanos(wait),
                reason: Reason::Limit,
            };
            let wait = Duration::from_nanos(wait);
            let want = format!(r#""retry_after_ms":{ms},"#);
            let body = respond::<Bytes>(&engine, route, &rej, wait).into_body();
            assert!(
                std::str::from_utf8(&body).unwrap().contains(&want),
                "{body:?}"
            );
            let body = templates
                .respond::<Bytes>(&engine, route, &rej, wait, 200.0)
                .into_body();
            assert!(
                std::str::from_utf8(&body).unwrap().contains(&want),
                "{body:?}"
            );
        }
    }

    #[test]
    fn content_lengths_are_the_numbers() {
        for n in [0, 1, 9, 10, 81, 999, 1024, 1025, 70_000] {
            assert_eq!(content_length(n), HeaderValue::from(n), "{n}");
        }
    }

    /// `rej`, with a restore due in `eta`, is told at least `eta` and less than twice
    /// it, spread over at least two whole seconds in 500 refusals.
    #[track_caller]
    fn told_the_eta_plus_jitter(rej: &Rejection, eta: Duration) {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let r = retry_after(rej, Some(eta));
            assert!(r >= eta && r < eta * 2, "{r:?}");
            seen.insert(r.as_secs());
        }
        assert!(
            seen.len() >= 2,
            "jitter spreads clients over seconds: {seen:?}"
        );
    }

    #[test]
    fn cut_retry_is_the_restore_eta_plus_bounded_jitter() {
        let rej = Rejection {
            retry_after: Duration::from_millis(20),
            reason: Reason::RocCut,
        };
        let eta = Duration::from_millis(2500);
        told_the_eta_plus_jitter(&rej, eta);
        let limit = Rejection {
            retry_after: Duration::from_millis(20),
            reason: Reason::Limit,
        };
        assert_eq!(retry_after(&limit, Some(eta)), Duration::from_millis(20));
    }

    /// A distributed route decided locally while Redis is away, under a cut last seen:
    /// its refusals (`fallback_local`) are told the restore schedule last seen, with
    /// jitter, as the cut's own are; told its bucket's wait, 1 s, every client the cut
    /// refuses came back at once into it (found by helper-201: a flash sale on two
    /// `rocgate serve` instances, Redis killed mid-cut, 540 refusals a second each
    /// told 1 s). Under no cut (no restore schedule), the bucket's wait.
    #[test]
    fn a_fallback_refusal_under_a_cut_is_told_the_restore_eta_plus_jitter() {
        let rej = Rejection {
            retry_after: Duration::from_millis(33),
            reason: Reason::FallbackLocal,
        };
        told_the_eta_plus_jitter(&rej, Duration::from_millis(6500));
        assert_eq!(retry_after(&rej, None), Duration::from_millis(33));
    }

    /// A `concurrency` refusal told more than a second (permits held long) is told
    /// its wait plus up to as long again, as a cut's are: every client refused within
    /// a second is told the same mean wait. Told a second or less, exactly that (the
    /// header says 1 either way).
    #[test]
    fn a_long_concurrency_wait_is_jittered_a_short_one_is_not() {
        let wait = Duration::from_millis(4500);
        let rej = Rejection {
            retry_after: wait,
            reason: Reason::Concurrency,
        };
        told_the_eta_plus_jitter(&rej, wait);
        let short = Rejection {
            retry_after: Duration::from_secs(1),
            reason: Reason::Concurrency,
        };
        assert_eq!(retry_after(&short, None), Duration::from_secs(1));
    }
}
