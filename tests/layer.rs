//! The tower/axum layer: rejection responses, shared state across clones and
//! connections, client IP keys, over `oneshot` and over real sockets on 127.0.0.1.
#![cfg(feature = "http")]

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use rocgate::clock::{Clock, ManualClock, Nanos};
use rocgate::config::{ClientIpHeader, Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::controller::ControllerState;
use rocgate::engine::{Engine, Key};
use rocgate::http::{AdmissionLayer, PeerAddr, RouteKey, SharedEngine, UPKEEP_EVERY};
use rocgate::limiter::Algorithm;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tower::ServiceExt;

#[path = "common/http1.rs"]
mod http1;

#[path = "common/captured.rs"]
mod captured;

fn route(name: &str, matcher: RouteMatch, limit: f64) -> RouteConfig {
    let mut r = RouteConfig::new(name, matcher);
    r.controller.base_limit_rps = limit;
    r.controller.cut_limit_rps = (limit / 3.0).max(1.0);
    r
}

/// A layer over one route `name` on the paths under `prefix`, limited by `algorithm`
/// to 1 request a second (when cut too), on a manual clock ([`layer`]).
fn one_a_second(
    name: &str,
    prefix: &str,
    algorithm: rocgate::limiter::Algorithm,
) -> (AdmissionLayer, Arc<ManualClock>) {
    let mut r = route(name, RouteMatch::prefix(prefix), 1.0);
    r.controller.cut_limit_rps = 1.0;
    r.algorithm = algorithm;
    layer(vec![r])
}

/// A layer over an engine on a manual clock.
fn layer(routes: Vec<RouteConfig>) -> (AdmissionLayer, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let engine = Engine::new(&Config::new(routes), clock.now(), SystemTime::UNIX_EPOCH).unwrap();
    let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock.clone()).build();
    (l, clock)
}

fn app(layer: AdmissionLayer, hits: Arc<AtomicU64>) -> Router {
    router(hits).layer(layer)
}

/// The application's routes; the order handler counts its calls in `hits`.
fn router(hits: Arc<AtomicU64>) -> Router {
    Router::new()
        .route(
            "/api/order",
            post(move || {
                let hits = hits.clone();
                async move {
                    hits.fetch_add(1, Ordering::Relaxed);
                    "ordered"
                }
            }),
        )
        .route("/api/items/{id}", get(|| async { "item" }))
}

fn post_order() -> Request<Body> {
    Request::post("/api/order").body(Body::empty()).unwrap()
}

/// [`post_order`] from the peer `peer` (port 4242), carrying `X-Forwarded-For: xff`.
/// The statuses `app` answers `n` orders with, one after the other.
async fn orders(app: &Router, n: usize) -> Vec<StatusCode> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(app.clone().oneshot(post_order()).await.unwrap().status());
    }
    statuses
}

/// The status `app` answers an order forwarded by the proxy 10.0.0.1 with `xff`.
async fn from_proxy(app: &Router, xff: &str) -> StatusCode {
    let req = order_from(xff, "10.0.0.1");
    app.clone().oneshot(req).await.unwrap().status()
}

fn order_from(xff: &str, peer: &str) -> Request<Body> {
    let mut req = post_order();
    req.headers_mut()
        .insert("x-forwarded-for", xff.parse().unwrap());
    req.extensions_mut()
        .insert(PeerAddr(format!("{peer}:4242").parse().unwrap()));
    req
}

/// A config of one route `name`, `POST /api/order` at 1 request a second, keyed by
/// client IP.
fn order_per_client(name: &str) -> Config {
    let mut r = route(name, RouteMatch::exact("POST", "/api/order"), 1.0);
    r.partition = Partition::ClientIp(KeyLimits::default());
    Config::new(vec![r])
}

/// The layers `config` builds: by `from_config`, and by its builder left as it is.
fn layers_of(config: &Config) -> [AdmissionLayer; 2] {
    [
        AdmissionLayer::from_config(config).unwrap(),
        AdmissionLayer::builder(config).unwrap().build(),
    ]
}

/// A route cut by a spike, then silent: the upkeep the layer spawns brings it back to
/// base without a request, and ends once the last clone of the layer is gone.
#[tokio::test(start_paused = true)]
async fn spawned_upkeep_ends_a_silent_routes_cut_and_ends_with_the_layer() {
    let (l, clock) = layer(vec![RouteConfig::new("upkept", RouteMatch::any())]);
    let engine = l.engine();
    let id = engine.route_for("GET", "/").unwrap();
    let offer = |from: f64, to: f64, rate: f64| {
        let n = ((to - from) * rate).round() as u64;
        for k in 0..n {
            let now = Nanos::from_secs_f64(from + k as f64 / rate);
            clock.set(now);
            let _ = engine.check(id, Key::None, now);
        }
    };
    offer(1.0, 11.0, 40.0);
    offer(11.0, 12.0, 600.0);
    let state = |at: Nanos| engine.route_snapshot(id, at).unwrap().state;
    assert_eq!(state(clock.now()), ControllerState::Cut);

    // A minute of silence: nothing steps the controller, the snapshot still says cut.
    clock.advance(Duration::from_secs(60));
    assert_eq!(state(clock.now()), ControllerState::Cut);

    let upkeep = l.spawn_upkeep().unwrap();
    tokio::time::sleep(UPKEEP_EVERY / 2).await;
    assert_eq!(state(clock.now()), ControllerState::Normal);
    assert_eq!(engine.limit_rps(id), Some(200.0));

    drop(l);
    tokio::time::sleep(UPKEEP_EVERY * 2).await;
    assert!(upkeep.is_finished(), "the upkeep outlived its layer");
}

#[test]
fn spawn_upkeep_outside_a_runtime_is_an_error_not_a_panic() {
    let (l, _) = layer(vec![RouteConfig::new("no-runtime", RouteMatch::any())]);
    assert!(l.spawn_upkeep().is_err());
}

/// The sweeper a layer spawns needs no runtime: on its thread it sweeps a key idle
/// past `idle_timeout` (10 s on the test's clock) out of the engine in force, with no
/// request to roll the route's window, which sweeps nothing while it runs; it
/// follows an engine put in force since; dropped, it leaves the engine in force
/// sweeping in requests. Polled for up to 3 s (it passes every 100 ms).
#[test]
fn a_layers_sweeper_sweeps_the_engine_in_force_apart_from_requests() {
    #[allow(clippy::disallowed_methods)] // a real thread's passes, polled in real time
    let within_3_s = |done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while !done() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        done()
    };
    let mut keys = KeyLimits::default();
    keys.idle_timeout = Duration::from_secs(10);
    let mut r = RouteConfig::new("swept", RouteMatch::any());
    r.partition = Partition::ClientIp(keys);
    let config = Config::new(vec![r]);
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let build = || Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
    let shared = SharedEngine::new(build());
    let l = AdmissionLayer::with_engine(shared.clone(), clock.clone()).build();
    let sweeper = l.spawn_sweeper().unwrap();
    let engine = l.engine();
    assert!(engine.sweeps_apart());
    let id = engine.route_at(0).unwrap();
    let client = Key::Ip(std::net::Ipv4Addr::new(10, 0, 0, 1).into());
    assert!(engine.check(id, client, clock.now()).is_admit());
    clock.advance(Duration::from_secs(11));
    // Another client's request rolls the window, and leaves the sweep to the sweeper.
    let other = Key::Ip(std::net::Ipv4Addr::new(10, 0, 0, 2).into());
    assert!(engine.check(id, other, clock.now()).is_admit());
    let keys = || engine.route_snapshot(id, clock.now()).unwrap().keys;
    assert!(within_3_s(&|| keys() == 1), "{} keys", keys());
    shared.replace(build());
    assert!(
        within_3_s(&|| shared.load().sweeps_apart()),
        "the sweeper sets the engine put in force"
    );
    drop(sweeper);
    assert!(!shared.load().sweeps_apart());
}

/// A reload that races a sweeper's drop: built from the engine in force while the
/// sweeper ran, so set to sweep apart, and put in force once the sweeper has stopped
/// and set the engine then in force back to sweeping in requests. The engine it
/// built still sweeps in requests: its idle keys are evicted by the request that
/// rolls the route's window. An engine left to sweep apart with no sweeper would
/// keep every key until its table was full, and every new client in the overflow
/// limiter, and each reload after would keep the setting.
#[test]
fn an_engine_reloaded_across_a_sweepers_drop_sweeps_in_requests() {
    let mut keys = KeyLimits::default();
    keys.idle_timeout = Duration::from_secs(10);
    let mut r = RouteConfig::new("swept", RouteMatch::any());
    r.partition = Partition::ClientIp(keys);
    let config = Config::new(vec![r]);
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
    let shared = SharedEngine::new(engine);
    let l = AdmissionLayer::with_engine(shared.clone(), clock.clone()).build();
    let sweeper = l.spawn_sweeper().unwrap();
    let next = shared
        .load()
        .reload(&config, clock.now(), SystemTime::UNIX_EPOCH)
        .unwrap();
    drop(sweeper);
    shared.replace(next);
    let engine = l.engine();
    assert!(!engine.sweeps_apart(), "no sweeper runs");
    let id = engine.route_at(0).unwrap();
    let client = Key::Ip(std::net::Ipv4Addr::new(10, 0, 0, 1).into());
    assert!(engine.check(id, client, clock.now()).is_admit());
    clock.advance(Duration::from_secs(11));
    let other = Key::Ip(std::net::Ipv4Addr::new(10, 0, 0, 2).into());
    assert!(engine.check(id, other, clock.now()).is_admit());
    let snapshot = engine.route_snapshot(id, clock.now()).unwrap();
    assert_eq!(
        (snapshot.keys, snapshot.keys_evicted),
        (1, 1),
        "the request that rolled the window swept the idle key"
    );
}

#[tokio::test]
async fn rejection_carries_retry_after_ratelimit_headers_and_json() {
    let (l, clock) = layer(vec![route(
        "order",
        RouteMatch::exact("POST", "/api/order"),
        2.0,
    )]);
    let hits = Arc::new(AtomicU64::new(0));
    let app = app(l, hits.clone());
    for _ in 0..2 {
        assert_eq!(
            app.clone().oneshot(post_order()).await.unwrap().status(),
            StatusCode::OK
        );
    }
    let res = app.clone().oneshot(post_order()).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = res.headers();
    let retry = retry_after_secs(h);
    assert!(retry >= 1);
    assert_eq!(h["ratelimit-policy"], r#""order";q=2;w=1"#);
    assert_eq!(h["ratelimit"], format!(r#""order";r=0;t={retry}"#).as_str());
    assert_eq!(h["rocgate-reason"], "limit");
    assert_eq!(h["content-type"], "application/json");
    let length = h["content-length"].to_str().unwrap().to_owned();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(length, body.len().to_string());
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["reason"], "limit");
    assert_eq!(json["route"], "order");
    assert_eq!(json["error"], "rate_limited");
    assert_eq!(json["retry_after_ms"], 500);
    assert_eq!(
        hits.load(Ordering::Relaxed),
        2,
        "the rejected request never reached the handler"
    );
    // Sent again after Retry-After, it is admitted.
    clock.advance(Duration::from_secs(retry));
    assert_eq!(
        app.oneshot(post_order()).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(hits.load(Ordering::Relaxed), 3);
}

#[tokio::test]
async fn unmatched_requests_pass_and_matched_path_keys_by_template() {
    let mut items = route("items", RouteMatch::any(), 1.0);
    items.matcher.path = rocgate::config::PathPattern::parse_path("/api/items/{id}").unwrap();
    let clock = Arc::new(ManualClock::new());
    let engine = Engine::new(
        &Config::new(vec![items]),
        clock.now(),
        SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock)
        .route_key(RouteKey::MatchedPath)
        .build();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    // Different raw paths, one template: one bucket of 1.
    let get = |id: u32| {
        Request::get(format!("/api/items/{id}"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        app.clone().oneshot(get(1)).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        app.clone().oneshot(get(2)).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // No route in the config takes /api/order: never limited.
    for _ in 0..10 {
        assert_eq!(
            app.clone().oneshot(post_order()).await.unwrap().status(),
            StatusCode::OK
        );
    }
}

/// A config's catch-all (`path = "/files/{*rest}"`, as axum writes it) takes the rest
/// of the path under every route key: keyed by axum's `MatchedPath`, it matches that
/// template's own text (as it did before it was refused, helper-266's review); on the
/// request's path, it takes `/files/a/b` (where it matched one segment, `/files/a`, and
/// the deeper path escaped the limit). `/files/`, no path it takes, passes. One bucket
/// of one request for all: the second request is refused. (helper-268)
#[tokio::test]
async fn a_catch_all_takes_the_rest_of_the_path_under_every_route_key() {
    for key in [
        RouteKey::MatchedPath,
        RouteKey::Config,
        RouteKey::Normalized,
    ] {
        let mut files = route("files", RouteMatch::exact("GET", "/files/{*rest}"), 1.0);
        files.controller.cut_limit_rps = 1.0;
        let config = Config::new(vec![files]);
        config.validate().unwrap_or_else(|e| panic!("{e}"));
        let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
        let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
        let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock)
            .route_key(key)
            .build();
        let app = Router::new()
            .route("/files/{*rest}", get(|| async { "file" }))
            .route("/files/", get(|| async { "index" }))
            .layer(l);
        let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
        let status = |path: &'static str| {
            let app = app.clone();
            async move { app.oneshot(get(path)).await.unwrap().status() }
        };
        assert_eq!(status("/files/a/b").await, StatusCode::OK, "{key:?}");
        assert_eq!(
            status("/files/a").await,
            StatusCode::TOO_MANY_REQUESTS,
            "{key:?}: the route's one bucket, spent"
        );
        assert_eq!(status("/files/").await, StatusCode::OK, "{key:?}");
    }
}

/// A layer keyed by `MatchedPath` outside the router limits nothing (no request carries
/// axum's `MatchedPath` there): it says so, once, after 100 requests without one. Inside
/// the router, requests no route takes (which carry none either) do not make it say so.
/// It said nothing. (helper-147)
#[tokio::test(flavor = "current_thread")]
async fn a_matched_path_layer_outside_the_router_says_it_limits_nothing() {
    let said = "none of the first 100 requests a route takes carried axum's MatchedPath";
    let keyed = || {
        let routes = vec![route("order", RouteMatch::exact("POST", "/api/order"), 1.0)];
        let engine = Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH);
        let clock = Arc::new(ManualClock::new());
        AdmissionLayer::with_engine(SharedEngine::new(engine.unwrap()), clock)
    };
    let (log, _guard) = captured::Captured::on_this_thread();
    let outside = tower::Layer::layer(
        &keyed().route_key(RouteKey::MatchedPath).build(),
        router(Arc::new(AtomicU64::new(0))),
    );
    for _ in 0..99 {
        let response = outside.clone().oneshot(post_order()).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "nothing limited");
    }
    assert_eq!(log.lines_with(said).len(), 0, "not before the 100th");
    for _ in 0..50 {
        let _ = outside.clone().oneshot(post_order()).await.unwrap();
    }
    assert_eq!(log.lines_with(said).len(), 1, "once");
    // Inside: 200 requests no route takes (a 404 each), then one a route takes.
    let inside =
        router(Arc::new(AtomicU64::new(0))).layer(keyed().route_key(RouteKey::MatchedPath).build());
    for _ in 0..200 {
        let nowhere = Request::get("/nowhere").body(Body::empty()).unwrap();
        let response = inside.clone().oneshot(nowhere).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    let _ = inside.clone().oneshot(post_order()).await.unwrap();
    assert_eq!(log.lines_with(said).len(), 1);
}

/// A `MatchedPath` layer inside the router (`Router::layer`) sees every 404 too, which
/// carries no `MatchedPath`: one under a path a config route takes (a prefix route's
/// `/api/…` that no handler serves, as scanners send at start-up) is no sign of a
/// misplaced layer. 100 of them before the first routed request said, at `WARN`, that
/// the layer was outside the router and limited nothing, while it was in place and
/// limited every routed request. The router marks each request it routes, found or
/// not, with `OriginalUri`; the layer now counts only those without it.
#[tokio::test(flavor = "current_thread")]
async fn a_matched_path_layer_inside_the_router_says_nothing_of_404s_a_prefix_takes() {
    let said = "none of the first 100 requests a route takes carried axum's MatchedPath";
    let (log, _guard) = captured::Captured::on_this_thread();
    let routes = vec![route("api", RouteMatch::prefix("/api"), 1.0)];
    let engine = Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    let keyed =
        AdmissionLayer::with_engine(SharedEngine::new(engine), Arc::new(ManualClock::new()))
            .route_key(RouteKey::MatchedPath)
            .build();
    let inside = router(Arc::new(AtomicU64::new(0))).layer(keyed);
    for _ in 0..200 {
        let missing = Request::get("/api/missing").body(Body::empty()).unwrap();
        let response = inside.clone().oneshot(missing).await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    assert_eq!(log.lines_with(said), Vec::<String>::new());
    // In place: the routed requests are limited.
    assert_eq!(
        inside.clone().oneshot(post_order()).await.unwrap().status(),
        StatusCode::OK
    );
    let over = inside.clone().oneshot(post_order()).await.unwrap();
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
}

/// A route partitioned by `ip` whose requests come without their connection's address
/// (the app served without `ConnectInfo`) puts every client under one anonymous key:
/// the layer says so, once, naming the route. It said nothing. (helper-147)
#[tokio::test(flavor = "current_thread")]
async fn a_route_partitioned_by_ip_without_peer_addresses_says_so() {
    let said = "came without its connection's address";
    let mut per_ip = route("per_ip", RouteMatch::any(), 100.0);
    per_ip.partition = Partition::ClientIp(KeyLimits::default());
    let (log, _guard) = captured::Captured::on_this_thread();
    let (l, _) = layer(vec![per_ip.clone()]);
    let with_peer = app(l, Arc::new(AtomicU64::new(0)));
    for _ in 0..3 {
        let mut req = post_order();
        req.extensions_mut()
            .insert(PeerAddr("198.51.100.7:4242".parse().unwrap()));
        let _ = with_peer.clone().oneshot(req).await.unwrap();
    }
    assert_eq!(log.lines_with(said).len(), 0);
    let (l, _) = layer(vec![per_ip]);
    let without = app(l, Arc::new(AtomicU64::new(0)));
    for _ in 0..3 {
        let _ = without.clone().oneshot(post_order()).await.unwrap();
    }
    let lines = log.lines_with(said);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("per_ip"), "{lines:?}");
}

/// A template's parameter of `..`, `.` (encoded or not) or holding a backslash is
/// limited by the template's route: axum routes on the path as written and serves it
/// with the template's handler, where the normalized path (`/api`, `/api/items/`,
/// `/api/items/7/x`) is another. (It matched no route, and passed unlimited.)
#[tokio::test]
async fn a_parameter_spelled_as_a_dot_segment_or_with_a_backslash_stays_limited() {
    let mut items = route("items", RouteMatch::any(), 1.0);
    items.matcher.path = rocgate::config::PathPattern::parse_path("/api/items/{id}").unwrap();
    let (l, _) = layer(vec![items]);
    let app = app(l, Arc::new(AtomicU64::new(0)));
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();
    assert_eq!(
        app.clone()
            .oneshot(get("/api/items/1"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    for path in [
        "/api/items/2",
        "/api/items/..",
        "/api/items/.",
        "/api/items/%2e%2e",
        "/api/items/%2E",
        "/api/items/7\\x",
    ] {
        let status = app.clone().oneshot(get(path)).await.unwrap().status();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{path}");
    }
}

#[tokio::test]
async fn spoofed_forwarded_for_from_an_untrusted_peer_lands_in_one_bucket() {
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 5.0);
    r.partition = Partition::ClientIp(KeyLimits::default());
    let (l, _clock) = layer(vec![r]);
    let engine = l.engine().clone();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    let mut admitted = 0;
    for n in 0..1_000u32 {
        let req = order_from(&format!("203.0.{}.{}", n / 256, n % 256), "198.51.100.7");
        if app.clone().oneshot(req).await.unwrap().status() == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5);
    assert_eq!(engine.snapshot(Nanos::from_secs(1))[0].keys, 1);
}

/// An app whose order route (5 req/s) is partitioned by `x-key`, and its engine.
fn keyed_by_header() -> (Router, Arc<Engine>) {
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 5.0);
    r.partition = Partition::Header("x-key".into(), KeyLimits::default());
    let (l, _clock) = layer(vec![r]);
    let engine = l.engine();
    (app(l, Arc::new(AtomicU64::new(0))), engine)
}

/// Whether an order with this `x-key` is admitted.
async fn admitted_with_key(app: &Router, value: http::HeaderValue) -> bool {
    let mut req = post_order();
    req.headers_mut().insert("x-key", value);
    app.clone().oneshot(req).await.unwrap().status() == StatusCode::OK
}

#[tokio::test]
async fn a_header_value_beyond_ascii_is_its_own_key() {
    // `HeaderValue::to_str` takes visible ASCII only: keys such as "café", sent as
    // UTF-8, all fell into the one anonymous key.
    let (app, engine) = keyed_by_header();
    let mut admitted = 0;
    for key in ["café", "thé"] {
        for _ in 0..10 {
            let value = http::HeaderValue::from_bytes(key.as_bytes()).unwrap();
            admitted += usize::from(admitted_with_key(&app, value).await);
        }
    }
    assert_eq!(admitted, 10, "each key has its own 5 req/s");
    assert_eq!(engine.snapshot(Nanos::from_secs(1))[0].keys, 2);
}

/// Every key is kept while it lives: values of hundreds of KiB (what an HTTP/1 head may
/// carry) made max_keys of them gigabytes. One longer than 15 bytes (an API key, a JWT)
/// is a key of its own by a 128-bit digest of it (16 bytes kept, as for a shorter one;
/// tests/memory.rs): the same value one key, two values two keys, however far apart
/// their difference is.
#[tokio::test]
async fn an_overlong_header_value_is_keyed_by_its_digest() {
    let (app, engine) = keyed_by_header();
    let send = |value: String| admitted_with_key(&app, value.parse().unwrap());
    let token = |n: u32| format!("{n:04}{}", "k".repeat(100_000));
    let mut admitted = [0, 0];
    for _ in 0..10 {
        for (n, count) in admitted.iter_mut().enumerate() {
            *count += usize::from(send(token(n as u32)).await);
        }
    }
    assert_eq!(admitted, [5, 5], "each long value has its own 5 req/s");
    let keys = || engine.snapshot(Nanos::from_secs(1))[0].keys;
    assert_eq!(keys(), 2);
    // Values that differ in their last byte only, at the threshold and past it.
    for value in [
        format!("{}a", "k".repeat(99_999)),
        format!("{}b", "k".repeat(99_999)),
        "k".repeat(15),
        format!("{}a", "k".repeat(15)),
        format!("{}b", "k".repeat(15)),
    ] {
        assert!(send(value).await);
    }
    assert_eq!(keys(), 7);
}

/// A tier of long tokens (a partner's 1.1 KiB JWT) matches them: the configuration
/// refused a tier value longer than the longest kept whole ("can never match"), as
/// its requests were keyed by a digest the tier's value was never compared with.
#[tokio::test]
async fn a_tier_value_longer_than_a_kept_value_matches_its_requests() {
    let jwt = |c: char| format!("eyJhbGciOiJIUzI1NiJ9.{}.{c}", "x".repeat(1100));
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 5.0);
    r.partition = Partition::Header("x-key".into(), KeyLimits::default());
    r.tiers = vec![rocgate::config::Tier::new(
        "partner",
        vec![jwt('p')],
        50.0,
        20.0,
    )];
    let (l, _clock) = layer(vec![r]);
    let keyed = app(l, Arc::new(AtomicU64::new(0)));
    let mut admitted = [0, 0];
    for _ in 0..20 {
        for (count, c) in admitted.iter_mut().zip(['p', 'q']) {
            *count += usize::from(admitted_with_key(&keyed, jwt(c).parse().unwrap()).await);
        }
    }
    assert_eq!(
        admitted,
        [20, 5],
        "the partner's 50 req/s, another token's 5"
    );
    assert_eq!(
        quota_stated(&keyed, Some(&jwt('p'))).await,
        r#""order";q=50;w=1"#
    );
    assert_eq!(
        quota_stated(&keyed, Some(&jwt('q'))).await,
        r#""order";q=5;w=1"#
    );
}

/// Sends `GET /api/items/1` to `app` once with each of `hosts` as its `host`: how
/// many were admitted.
async fn admitted_of_hosts<H: AsRef<str>>(
    app: &Router,
    hosts: impl IntoIterator<Item = H>,
) -> usize {
    let mut admitted = 0;
    for host in hosts {
        let req = Request::get("/api/items/1")
            .header("host", host.as_ref())
            .body(Body::empty())
            .unwrap();
        admitted += usize::from(app.clone().oneshot(req).await.unwrap().status() == StatusCode::OK);
    }
    admitted
}

/// A route partitioned by `Host` (named in any case, as a `Partition` built in code
/// may name it) keys every spelling of one host (a port, letter case, a trailing dot)
/// as that host: named `Host`, each spelling had a fresh quota.
#[tokio::test]
async fn a_host_partition_named_in_any_case_folds_the_spellings_of_a_host() {
    let spellings = [
        "shop.example",
        "shop.example:1",
        "shop.example:2",
        "SHOP.example",
        "shop.example.",
    ];
    for name in ["host", "Host", "HOST"] {
        let mut r = route("shop", RouteMatch::prefix("/"), 1.0);
        r.controller.cut_limit_rps = 1.0;
        r.partition = Partition::Header(name.into(), KeyLimits::default());
        let (layer, _clock) = layer(vec![r]);
        let app = app(layer, Arc::default());
        let admitted = admitted_of_hosts(&app, spellings).await;
        assert_eq!(admitted, 1, "partitioned by {name:?}");
    }
}

/// A tier value of a `header:host` route, a host's key (its name in lower case),
/// takes every spelling of that host (capitals, a port, a trailing dot), a name kept
/// whole as its key and one keyed by its digest alike, as the layer keys a host with
/// no lower-cased copy of it.
#[tokio::test]
async fn a_host_tier_takes_every_spelling_of_its_host() {
    let names = [
        "gold.example",
        "fifteen-bytes.x",
        "sixteen-bytes.xy",
        "api.gold-shop.example.com",
        "[2001:db8::7]",
    ];
    let mut r = route("shop", RouteMatch::prefix("/"), 1.0);
    r.controller.cut_limit_rps = 1.0;
    r.partition = Partition::Header("host".into(), KeyLimits::default());
    r.tiers = vec![rocgate::config::Tier::new("gold", names, 4.0, 4.0)];
    let (layer, _clock) = layer(vec![r]);
    let engine = layer.engine();
    let app = app(layer, Arc::default());
    for name in names.into_iter().chain(["plain.example"]) {
        let upper = name.to_ascii_uppercase();
        let spellings = [
            name.to_owned(),
            upper.clone(),
            format!("{upper}:8443"),
            format!("{name}:"),
            if name.starts_with('[') {
                format!("{upper}:80")
            } else {
                format!("{upper}.")
            },
            format!("{upper}:1"),
        ];
        let admitted = admitted_of_hosts(&app, &spellings).await;
        let want = if name == "plain.example" { 1 } else { 4 };
        assert_eq!(admitted, want, "{name:?}, spelled {spellings:?}");
    }
    assert_eq!(
        engine.snapshot(rocgate::clock::Nanos::ZERO)[0].keys,
        names.len() + 1
    );
}

/// A route partitioned by `Authorization` (or `Proxy-Authorization`, named in any
/// case) keys a credential however its scheme is spelled: the scheme is
/// case-insensitive and one or more spaces part it from the credentials (RFC 9110
/// §11.1, §11.4), so "Bearer t", "bearer t" and "BEARER  t" are one token to the
/// upstream. Each spelling was a key of its own: 2^6 quotas for one token from the case
/// of "Bearer" alone, one more per added space. The credentials keep their case, and a
/// bare token (no scheme) is its own key.
#[tokio::test]
async fn an_authorization_partition_keys_a_credential_however_its_scheme_is_spelled() {
    let spellings = [
        "Bearer tok-Secret.1",
        "bearer tok-Secret.1",
        "BEARER  tok-Secret.1",
        "bEaReR \t tok-Secret.1",
        "Bearer tok-Secret.1\t\t",
        " \tBearer   tok-Secret.1",
    ];
    for name in ["authorization", "Authorization", "proxy-authorization"] {
        let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 2.0);
        r.controller.cut_limit_rps = 1.0;
        r.partition = Partition::Header(name.into(), KeyLimits::default());
        let (l, _clock) = layer(vec![r]);
        let engine = l.engine();
        let app = app(l, Arc::default());
        let send = |value: &str| {
            let mut req = post_order();
            req.headers_mut().insert(
                name.to_ascii_lowercase()
                    .as_str()
                    .parse::<http::HeaderName>()
                    .unwrap(),
                value.parse().unwrap(),
            );
            let app = app.clone();
            async move { app.oneshot(req).await.unwrap().status() == StatusCode::OK }
        };
        let mut admitted = 0;
        for value in spellings {
            admitted += usize::from(send(value).await);
        }
        assert_eq!(admitted, 2, "one token's 2 req/s, partitioned by {name:?}");
        assert_eq!(engine.snapshot(Nanos::from_secs(1))[0].keys, 1, "{name:?}");
        // Other credentials: another case of the token, a bare token, a bare token in
        // another case, another scheme.
        for value in [
            "Bearer tok-secret.1",
            "tok-Secret.1",
            "TOK-Secret.1",
            "Basic tok-Secret.1",
        ] {
            assert!(send(value).await, "{value:?}, partitioned by {name:?}");
        }
        assert_eq!(engine.snapshot(Nanos::from_secs(1))[0].keys, 5, "{name:?}");
    }
}

#[tokio::test]
async fn a_repeated_key_header_is_no_key() {
    // The first of two values was the key: a client could send a fresh one first on
    // every request, for a fresh quota each, and its real key second, for an upstream
    // that reads the last. Two values are no one key, like a missing header.
    let (app, engine) = keyed_by_header();
    let mut admitted = 0;
    for n in 0..20 {
        let mut req = post_order();
        req.headers_mut()
            .append("x-key", format!("fresh-{n}").parse().unwrap());
        req.headers_mut().append("x-key", "real".parse().unwrap());
        if app.clone().oneshot(req).await.unwrap().status() == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "one anonymous key for them all");
    assert_eq!(engine.snapshot(Nanos::from_secs(1))[0].keys, 0);
}

/// HTTP/2's cookie crumbs, one a field (RFC 9113 §8.2.3), are one cookie: the key is
/// them joined with "; ", as `rocgate serve` sends them on. Several fields were no key,
/// so each cookie so sent drew on the one keyless bucket (here the third, of another
/// cookie, was refused). Over HTTP/1.1 two `Cookie` lines stay no key.
#[tokio::test]
async fn http2_cookie_crumbs_are_one_cookie_key() {
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 1.0);
    r.partition = Partition::Header("cookie".into(), KeyLimits::default());
    let (l, _clock) = layer(vec![r]);
    let engine = l.engine();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    let send = |crumbs: [&'static str; 2], version: http::Version| {
        let app = app.clone();
        async move {
            let mut req = post_order();
            *req.version_mut() = version;
            for crumb in crumbs {
                req.headers_mut().append("cookie", crumb.parse().unwrap());
            }
            app.oneshot(req).await.unwrap().status()
        }
    };
    let h2 = http::Version::HTTP_2;
    assert_eq!(send(["a=1", "b=2"], h2).await, StatusCode::OK);
    assert_eq!(
        send(["a=1", "b=2"], h2).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(send(["a=3", "b=2"], h2).await, StatusCode::OK);
    assert_eq!(engine.snapshot(Nanos::from_secs(1))[0].keys, 2);
    let h1 = http::Version::HTTP_11;
    assert_eq!(send(["a=5", "b=6"], h1).await, StatusCode::OK);
    assert_eq!(
        send(["a=7", "b=8"], h1).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(engine.snapshot(Nanos::from_secs(1))[0].keys, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connections_share_one_bucket() {
    const CONNECTIONS: usize = 1_500;
    const CAPACITY: u64 = 300;
    // A frozen manual clock: the bucket never refills.
    let (l, _clock) = layer(vec![route(
        "order",
        RouteMatch::exact("POST", "/api/order"),
        CAPACITY as f64,
    )]);
    let hits = Arc::new(AtomicU64::new(0));
    let app = app(l, hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CONNECTIONS {
        tasks.spawn(async move {
            let mut sender = http1::connect(addr).await;
            let req = Request::post("/api/order")
                .header("host", "127.0.0.1")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap();
            sender.send_request(req).await.unwrap().status()
        });
    }
    let mut ok = 0u64;
    let mut limited = 0u64;
    let deadline = Duration::from_secs(60);
    while let Some(status) = tokio::time::timeout(deadline, tasks.join_next())
        .await
        .unwrap()
    {
        match status.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    server.abort();
    assert_eq!(ok, CAPACITY);
    assert_eq!(limited, CONNECTIONS as u64 - CAPACITY);
    assert_eq!(
        hits.load(Ordering::Relaxed),
        CAPACITY,
        "the handler saw exactly the admitted requests"
    );
}

#[tokio::test]
async fn a_route_may_shed_with_another_status() {
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 1.0);
    r.reject_status = 503;
    let (l, _clock) = layer(vec![r]);
    let app = app(l, Arc::new(AtomicU64::new(0)));
    assert_eq!(
        app.clone().oneshot(post_order()).await.unwrap().status(),
        StatusCode::OK
    );
    let res = app.oneshot(post_order()).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key("retry-after"));
}

/// Wrapped around the whole `Router` (not added with `Router::layer`), the layer
/// decides before routing, with the config's route matching: over a real socket, the
/// handler sees exactly the admitted requests, and a path no route of the config takes
/// reaches the router untouched.
#[tokio::test]
async fn around_the_router_it_decides_before_routing() {
    use tower::Layer as _;
    const CAPACITY: u64 = 5;
    let (l, _clock) = layer(vec![route(
        "order",
        RouteMatch::exact("POST", "/api/order"),
        CAPACITY as f64,
    )]);
    let hits = Arc::new(AtomicU64::new(0));
    // The request type names which `Service` impl to make a `MakeService` of.
    let app = axum::ServiceExt::<Request<Body>>::into_make_service(l.layer(router(hits.clone())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let mut sender = http1::connect(addr).await;
    let mut send = |method: &str, path: &str| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let sent = sender.send_request(req);
        async move { sent.await.unwrap().status() }
    };
    let mut statuses = Vec::new();
    for _ in 0..CAPACITY + 3 {
        statuses.push(send("POST", "/api/order").await);
    }
    let unrouted = send("GET", "/nowhere").await;
    server.abort();

    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count() as u64;
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count() as u64;
    assert_eq!((ok, limited), (CAPACITY, 3), "{statuses:?}");
    assert_eq!(hits.load(Ordering::Relaxed), CAPACITY);
    assert_eq!(unrouted, StatusCode::NOT_FOUND);
}

/// `Router::nest` strips its prefix from the URI the nested router and its layers see:
/// the config's routes, written for the whole path, must still match.
#[tokio::test]
async fn config_routes_match_inside_a_nested_router() {
    // As written and normalized alike (`Normalized` read the nested URI, and matched
    // no route there).
    for key in [RouteKey::Config, RouteKey::Normalized] {
        let order = route("order", RouteMatch::exact("POST", "/api/order"), 1.0);
        let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
        let engine = Engine::new(
            &Config::new(vec![order]),
            clock.now(),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock)
            .route_key(key)
            .build();
        let hits = Arc::new(AtomicU64::new(0));
        let counted = hits.clone();
        let api = Router::new()
            .route(
                "/order",
                post(move || {
                    let hits = counted.clone();
                    async move {
                        hits.fetch_add(1, Ordering::Relaxed);
                        "ordered"
                    }
                }),
            )
            .layer(l);
        let app = Router::new().nest("/api", api);
        let statuses = [
            app.clone().oneshot(post_order()).await.unwrap().status(),
            app.clone().oneshot(post_order()).await.unwrap().status(),
        ];
        assert_eq!(
            statuses,
            [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS],
            "{key:?}"
        );
        assert_eq!(hits.load(Ordering::Relaxed), 1, "{key:?}");
    }
}

/// A concurrency route behind the layer, over a real hyper server, with a response
/// body that streams until the test lets it end. Mapped with
/// `hold_permit_through_body`, the request is in flight until its body ends: a second
/// one is refused meanwhile, and admitted once the first body has ended. Without it,
/// the server drops the permit with the head, and the second is admitted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_holds_its_concurrency_permit_when_mapped() {
    use http_body_util::channel::Channel;
    use rocgate::http::hold_permit_through_body;
    use rocgate::limiter::Algorithm;
    use std::net::SocketAddr;
    use tokio::sync::{mpsc, Mutex};

    async fn serve(app: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, server)
    }
    /// Sends a GET; returns its status and its body, still streaming.
    async fn fetch(addr: SocketAddr) -> (StatusCode, hyper::body::Incoming) {
        let mut sender = http1::connect(addr).await;
        let req = Request::get("/feed")
            .header("host", "127.0.0.1")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let send = sender.send_request(req);
        let res = tokio::time::timeout(Duration::from_secs(5), send)
            .await
            .unwrap()
            .unwrap();
        (res.status(), res.into_body())
    }
    for held in [true, false] {
        let mut feed = route("feed", RouteMatch::prefix("/feed"), 1.0);
        feed.algorithm = Algorithm::Concurrency { queue: 0 };
        let (l, _clock) = layer(vec![feed]);
        // Each response streams what the test sends, and ends when it drops the sender.
        let (tx, rx) = mpsc::channel::<Channel<bytes::Bytes>>(2);
        let rx = Arc::new(Mutex::new(rx));
        let handler = move || {
            let rx = rx.clone();
            async move { Body::new(rx.lock().await.recv().await.unwrap()) }
        };
        let routes = Router::new().route("/feed", get(handler));
        let app = if held {
            routes.layer(
                tower::ServiceBuilder::new()
                    .map_response(hold_permit_through_body)
                    .layer(l),
            )
        } else {
            routes.layer(l)
        };
        let (addr, server) = serve(app).await;
        let (mut first_chunks, chunks) = Channel::new(1);
        tx.send(chunks).await.unwrap();
        let (status, mut first) = fetch(addr).await;
        assert_eq!(status, StatusCode::OK);
        first_chunks.send_data("a".into()).await.unwrap();
        let frame = first.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "a");
        // The first body is still streaming.
        let (second_chunks, chunks) = Channel::new(1);
        tx.send(chunks).await.unwrap();
        let (status, _) = fetch(addr).await;
        if !held {
            assert_eq!(status, StatusCode::OK, "the permit went with the head");
            server.abort();
            continue;
        }
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "held by the first body"
        );
        drop(first_chunks);
        assert!(first.frame().await.is_none(), "the first body ended");
        // The server drops the body (and its permit) once it has sent the end.
        let mut status = StatusCode::TOO_MANY_REQUESTS;
        for _ in 0..100 {
            let (s, _) = fetch(addr).await;
            status = s;
            if s == StatusCode::OK {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status, StatusCode::OK, "admitted once the first body ended");
        drop(second_chunks);
        server.abort();
    }
}

#[tokio::test]
async fn a_head_request_counts_against_its_get_route() {
    // axum (as most servers) answers HEAD with the GET handler, which does all of
    // GET's work: a route limiting GET that let HEAD through was a way around it.
    let hits = Arc::new(AtomicU64::new(0));
    let counted = hits.clone();
    let (l, _clock) = layer(vec![route(
        "item",
        RouteMatch::exact("GET", "/api/item"),
        1.0,
    )]);
    let app = Router::new()
        .route(
            "/api/item",
            get(move || {
                counted.fetch_add(1, Ordering::Relaxed);
                async { "item" }
            }),
        )
        .layer(l);
    let request = |method: &str| {
        Request::builder()
            .method(method)
            .uri("/api/item")
            .body(Body::empty())
            .unwrap()
    };
    let first = app.clone().oneshot(request("HEAD")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    for method in ["HEAD", "GET"] {
        let r = app.clone().oneshot(request(method)).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{method}");
    }
    assert_eq!(hits.load(Ordering::Relaxed), 1);
}

/// A HEAD the layer rejects gets no body, with the `Content-Length` its GET would
/// get. It got the GET's body: axum's server leaves it out, but hyper's HTTP/2 server
/// sends it in DATA frames a HEAD's stream must not carry, and the client resets the
/// stream (`PROTOCOL_ERROR`) without seeing the 429 or its `Retry-After`.
/// A rejected request's body is dropped unread. A client waiting on `Expect:
/// 100-continue` is answered 429 without a `100 Continue`, so it need not send the
/// body; hyper then closes the connection after the 429 rather than read a body it
/// was never asked for (as it does after any response whose request body was left
/// unread), so the client's next request goes on a new connection.
#[tokio::test]
async fn a_rejected_upload_is_answered_before_its_body_and_its_connection_closed() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (l, _clock) = layer(vec![route(
        "upload",
        RouteMatch::exact("POST", "/api/order"),
        1.0,
    )]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, app(l, Arc::new(AtomicU64::new(0))))
            .await
            .unwrap()
    });
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let empty = "POST /api/order HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n";
    let upload = "POST /api/order HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 100000\r\n\r\n";
    socket.write_all(empty.as_bytes()).await.unwrap();
    socket.write_all(upload.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut read)).await;
    server.abort();
    assert!(
        matches!(closed, Ok(Ok(_))),
        "closed by the server: {closed:?}"
    );
    let read = String::from_utf8_lossy(&read);
    let statuses: Vec<&str> = read
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| &read[i + 9..i + 12])
        .collect();
    assert_eq!(statuses, ["200", "429"], "{read}");
}

#[tokio::test]
async fn a_head_the_layer_rejects_has_no_body() {
    let (l, _clock) = layer(vec![route("head", RouteMatch::exact("GET", "/x"), 1.0)]);
    let inner = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("x")))
    });
    let svc = tower::Layer::layer(&l, inner);
    let request = |method: &str| {
        Request::builder()
            .method(method)
            .uri("/x")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        svc.clone().oneshot(request("GET")).await.unwrap().status(),
        StatusCode::OK
    );
    let get = svc.clone().oneshot(request("GET")).await.unwrap();
    let head = svc.oneshot(request("HEAD")).await.unwrap();
    assert_eq!(head.status(), StatusCode::TOO_MANY_REQUESTS);
    let length = |r: &http::Response<Body>| r.headers()[http::header::CONTENT_LENGTH].clone();
    assert_eq!(length(&head), length(&get));
    assert!(head.headers().contains_key(http::header::RETRY_AFTER));
    let get_body = get.into_body().collect().await.unwrap().to_bytes();
    assert!(!get_body.is_empty());
    let head_body = head.into_body().collect().await.unwrap().to_bytes();
    assert!(head_body.is_empty(), "{head_body:?}");
}

#[tokio::test]
async fn a_limit_states_its_quota_over_the_window_that_makes_it_whole() {
    // At 0.5 req/s the policy said `q=0;w=1`: no request ever, which is not the limit.
    for (limit, policy) in [
        (0.5, r#""order";q=1;w=2"#),
        (0.3, r#""order";q=3;w=10"#),
        (0.1, r#""order";q=1;w=10"#),
        (1.0 / 3.0, r#""order";q=1;w=3"#),
        // Over the window that makes it whole: 2.5 req/s was stated as 2 per second.
        (2.5, r#""order";q=5;w=2"#),
        (1.5, r#""order";q=3;w=2"#),
        (12.34, r#""order";q=12;w=1"#),
    ] {
        let mut r = route("order", RouteMatch::exact("POST", "/api/order"), limit);
        r.controller.cut_limit_rps = limit;
        let (l, _clock) = layer(vec![r]);
        let app = app(l, Arc::new(AtomicU64::new(0)));
        let mut rejected = None;
        for _ in 0..20 {
            let res = app.clone().oneshot(post_order()).await.unwrap();
            if res.status() == StatusCode::TOO_MANY_REQUESTS {
                rejected = Some(res);
                break;
            }
        }
        let res = rejected.expect("a rejection within 20 requests");
        assert_eq!(res.headers()["ratelimit-policy"], policy, "{limit}");
    }
}

/// The `RateLimit-Policy` quota of the rejection of a request on `app`'s order route
/// with this `x-key` (if any), once its key's bucket is empty.
async fn quota_stated(app: &Router, key: Option<&str>) -> String {
    for _ in 0..1_000 {
        let mut req = post_order();
        if let Some(key) = key {
            req.headers_mut()
                .insert("x-key", http::HeaderValue::from_str(key).unwrap());
        }
        let res = app.clone().oneshot(req).await.unwrap();
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            return res.headers()["ratelimit-policy"]
                .to_str()
                .unwrap()
                .to_owned();
        }
    }
    panic!("no rejection in 1000 requests");
}

/// A window algorithm's policy states what its windows admit: `limit × window`,
/// rounded down, per window (or per whole seconds of whole windows). At 2.5 req/s in
/// windows of 1 s it said `q=5;w=2`, where the windows admit 2 a second, 4 in 2 s.
#[tokio::test]
async fn a_window_routes_policy_states_what_its_windows_admit() {
    let ms = Duration::from_millis;
    let fixed = |window| Algorithm::FixedWindow { window };
    let sliding = |window| Algorithm::SlidingWindow { window };
    for (algorithm, limit, policy) in [
        (fixed(ms(1000)), 2.5, r#""order";q=2;w=1"#),
        (sliding(ms(1000)), 2.5, r#""order";q=2;w=1"#),
        (fixed(ms(10_000)), 20.0, r#""order";q=200;w=10"#),
        // 2 per 500 ms.
        (sliding(ms(500)), 5.0, r#""order";q=4;w=1"#),
        // 3 per 300 ms: 30 in 3 s, the first whole seconds of whole windows.
        (fixed(ms(300)), 10.0, r#""order";q=30;w=3"#),
        // 3 per 333 ms, no whole seconds of whole windows up to 10 s: 9.009 req/s.
        (fixed(ms(333)), 10.0, r#""order";q=9;w=1"#),
    ] {
        let mut r = route("order", RouteMatch::exact("POST", "/api/order"), limit);
        r.controller.cut_limit_rps = limit;
        r.algorithm = algorithm;
        let (l, _clock) = layer(vec![r]);
        let app = app(l, Arc::new(AtomicU64::new(0)));
        assert_eq!(
            quota_stated(&app, None).await,
            policy,
            "{algorithm:?} {limit}"
        );
    }
}

#[tokio::test]
async fn a_tier_keys_quota_is_its_tiers_limit() {
    // A key of a tier is refused at its tier's limit, not the route's.
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 5.0);
    r.partition = Partition::Header("x-key".into(), KeyLimits::default());
    r.tiers = vec![rocgate::config::Tier::new("gold", vec!["gold"], 50.0, 20.0)];
    let (l, _clock) = layer(vec![r]);
    let keyed = app(l, Arc::new(AtomicU64::new(0)));
    assert_eq!(
        quota_stated(&keyed, Some("gold")).await,
        r#""order";q=50;w=1"#
    );
    assert_eq!(
        quota_stated(&keyed, Some("plain")).await,
        r#""order";q=5;w=1"#
    );
    // Before and after the gold key's rejection (the responses are made from
    // templates per route), the route's own quota for keys in no tier.
    assert_eq!(
        quota_stated(&keyed, Some("other")).await,
        r#""order";q=5;w=1"#
    );
    assert_eq!(
        quota_stated(&keyed, Some("gold")).await,
        r#""order";q=50;w=1"#
    );
}

#[tokio::test]
async fn shadow_adaptive_states_the_base_limit_it_enforces_during_a_cut() {
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 10.0);
    r.mode = rocgate::config::Mode::ShadowAdaptive;
    r.controller.cut_limit_rps = 2.0;
    r.controller.danger_roc = 50.0;
    r.controller.safe_roc = 10.0;
    let (l, clock) = layer(vec![r]);
    let engine = l.engine();
    let id = engine.route_at(0).unwrap();
    // Quiet at 10 req/s for a full window, then a spike: cut (in shadow).
    let start = clock.now();
    for k in 0..100 {
        let _ = engine.check(id, Key::None, start + Duration::from_millis(100 * k));
    }
    for k in 0..500 {
        let _ = engine.check(id, Key::None, start + Duration::from_millis(10_000 + 2 * k));
    }
    let now = start + Duration::from_secs(11);
    clock.advance(now.saturating_since(clock.now()));
    assert!(engine.snapshot(now)[0].limit_rps < 10.0, "cut");
    let shadowed = app(l, Arc::new(AtomicU64::new(0)));
    assert_eq!(quota_stated(&shadowed, None).await, r#""order";q=10;w=1"#);
}

/// A service that, like tower's and tower-http's `Timeout` (which start their timer
/// there), does work in `call`: it counts its calls. Its responses take `takes`.
fn counting_service(
    calls: Arc<AtomicU64>,
    takes: Duration,
) -> impl tower::Service<
    Request<Body>,
    Response = http::Response<Body>,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<
        Output = Result<http::Response<Body>, std::convert::Infallible>,
    > + Send,
> + Clone {
    tower::service_fn(move |_req: Request<Body>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(takes).await;
            Ok(http::Response::new(Body::empty()))
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_reaches_the_inner_service_only_once_admitted() {
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let get = || Request::get("/feed").body(Body::empty()).unwrap();

    // Paced by a leaky bucket (1 req/s): the second request waits a second, and
    // reaches the service (whose timeout would start) only then.
    let (l, _clock) = one_a_second("feed", "/feed", Algorithm::LeakyBucket { queue: 2 });
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls.clone(), Duration::ZERO));
    let first = svc.ready().await.unwrap().call(get());
    let second = svc.ready().await.unwrap().call(get());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the paced request waits");
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    let started = tokio::time::Instant::now();
    assert_eq!(second.await.unwrap().status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // Queued for a concurrency permit (1 in flight, 1 waiting): not called while it
    // waits; dropped while waiting, it gives its place up and is never called.
    let (l, _clock) = one_a_second("feed", "/feed", Algorithm::Concurrency { queue: 1 });
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls.clone(), Duration::from_secs(10)));
    // Its response (and with it the permit) is dropped as the task ends.
    let first = svc.ready().await.unwrap().call(get());
    let first = tokio::spawn(async move { first.await.map(|r| r.status()) });
    tokio::task::yield_now().await;
    let queued = svc.ready().await.unwrap().call(get());
    let full = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(full.headers()["rocgate-reason"], "queue_full");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the queued request waits");
    drop(queued);
    let next = svc.ready().await.unwrap().call(get());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let started = tokio::time::Instant::now();
    assert_eq!(next.await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(20),
        "after the first"
    );
    assert_eq!(first.await.unwrap().unwrap(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_quota_is_stated_in_requests_in_flight() {
    // It said `q=1;w=1`, one request per second, which is not what was refused.
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second("feed", "/feed", Algorithm::Concurrency { queue: 0 });
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls, Duration::from_secs(10)));
    let get = || Request::get("/feed").body(Body::empty()).unwrap();
    let first = svc.ready().await.unwrap().call(get());
    let refused = svc.ready().await.unwrap().call(get()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        r#""feed";q=1;qu="concurrent-requests""#
    );
    drop(first);
}

/// Polls `service` for readiness once, with a waker that does nothing.
fn ready_now<S: tower::Service<R>, R>(service: &mut S) -> bool {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    matches!(service.poll_ready(&mut cx), std::task::Poll::Ready(Ok(())))
}

/// Polls `future` once, with a waker that does nothing.
fn poll_now<F: std::future::Future + Unpin>(future: &mut F) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::pin::Pin::new(future).poll(&mut cx)
}

/// An inner service saturated as a backend pool is: tower's `ConcurrencyLimit` of 1
/// over `counting_service`, with its one permit held by the clone returned beside it.
async fn saturated(
    calls: Arc<AtomicU64>,
) -> (
    impl tower::Service<
            Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
            Future = impl std::future::Future + Send,
        > + Clone,
    impl Sized,
) {
    let limited = tower::limit::ConcurrencyLimit::new(counting_service(calls, Duration::ZERO), 1);
    let mut holder = limited.clone();
    holder.ready().await.unwrap();
    (limited, holder)
}

#[tokio::test(start_paused = true)]
async fn a_rejection_does_not_wait_for_a_saturated_inner_service() {
    // `poll_ready` passed through to the inner service: while a `ConcurrencyLimit`
    // inside was full, the layer was not ready, and a request the engine rejects
    // waited for the inner service instead of getting its 429 at once.
    use tower::{Layer as _, Service as _};
    let (l, _clock) = layer(vec![route("rq-shed", RouteMatch::prefix("/rq-shed"), 1.0)]);
    let calls = Arc::new(AtomicU64::new(0));
    let (inner, holder) = saturated(calls.clone()).await;
    let mut svc = l.layer(inner);
    let get = || Request::get("/rq-shed").body(Body::empty()).unwrap();

    assert!(ready_now(&mut svc), "ready while the inner service is full");
    let mut admitted = Box::pin(svc.call(get()));
    assert!(
        poll_now(&mut admitted).is_pending(),
        "waits for the inner service"
    );
    assert!(ready_now(&mut svc));
    let mut over = Box::pin(svc.call(get()));
    let std::task::Poll::Ready(Ok(rejected)) = poll_now(&mut over) else {
        panic!("the rejection is ready on its first poll");
    };
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(rejected.headers()["rocgate-reason"], "limit");
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Once the inner service has room, the admitted request is served.
    drop(holder);
    assert_eq!(admitted.await.unwrap().status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_concurrency_permit_is_held_while_the_inner_service_readies_and_freed_if_dropped() {
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second("rq-held", "/rq-held", Algorithm::Concurrency { queue: 0 });
    let calls = Arc::new(AtomicU64::new(0));
    let (inner, holder) = saturated(calls.clone()).await;
    let mut svc = l.layer(inner);
    let get = || Request::get("/rq-held").body(Body::empty()).unwrap();

    assert!(ready_now(&mut svc), "ready while the inner service is full");
    let mut first = Box::pin(svc.call(get()));
    assert!(poll_now(&mut first).is_pending());
    // The first is in flight for the engine while it waits for the inner service.
    let std::task::Poll::Ready(Ok(refused)) = poll_now(&mut Box::pin(svc.call(get()))) else {
        panic!("the rejection is ready on its first poll");
    };
    assert_eq!(refused.headers()["rocgate-reason"], "concurrency");
    // Dropped (its client left), it gives its permit back.
    drop(first);
    let mut next = Box::pin(svc.call(get()));
    assert!(
        poll_now(&mut next).is_pending(),
        "admitted, waits for the inner"
    );
    drop(holder);
    let served = next.await.unwrap();
    assert_eq!(served.status(), StatusCode::OK);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the dropped one never called"
    );
    // The permit rides with the response; released with it.
    drop(served);
    let mut after = Box::pin(svc.call(get()));
    assert!(poll_now(&mut after).is_ready());
}

/// An inner service that never becomes ready (here a `ConcurrencyLimit` whose one
/// permit is never freed) keeps an admitted request waiting for as long as its future
/// is polled: the layer has no deadline of its own, as tower's `Oneshot` has none. A
/// `Timeout` outside the layer ends the wait with its error, and the concurrency
/// permit the request held is given back, as it is when the future is dropped.
#[tokio::test(start_paused = true)]
async fn an_inner_service_never_ready_keeps_an_admitted_request_waiting_until_a_timeout_outside() {
    use rocgate::limiter::Algorithm;
    use tower::Service as _;
    let (l, _clock) = one_a_second("rq-never", "/rq-never", Algorithm::Concurrency { queue: 0 });
    let calls = Arc::new(AtomicU64::new(0));
    let (inner, _holder) = saturated(calls.clone()).await;
    let svc = tower::Layer::layer(&l, inner);
    let get = || Request::get("/rq-never").body(Body::empty()).unwrap();

    let waiting = svc.clone().oneshot(get());
    let waited = tokio::time::timeout(Duration::from_secs(3600), waiting).await;
    assert!(waited.is_err(), "still waiting an hour on: {waited:?}");

    let mut timed = tower::timeout::Timeout::new(svc.clone(), Duration::from_secs(5));
    let error = timed.ready().await.unwrap().call(get()).await.unwrap_err();
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    // Both permits came back: the next request is admitted (it waits for the inner
    // service) rather than refused for concurrency.
    let mut next = Box::pin(svc.clone().call(get()));
    assert!(poll_now(&mut next).is_pending(), "admitted, not refused");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the inner service never called"
    );
}

#[tokio::test(start_paused = true)]
async fn a_paced_request_readies_the_inner_service_only_when_it_departs() {
    // The layer used to ready the inner service in `poll_ready` and take it along
    // through the pacing wait: a `ConcurrencyLimit` inside lost its permit to a
    // request asleep for a second.
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second("rq-paced", "/rq-paced", Algorithm::LeakyBucket { queue: 2 });
    let calls = Arc::new(AtomicU64::new(0));
    let limited =
        tower::limit::ConcurrencyLimit::new(counting_service(calls.clone(), Duration::ZERO), 1);
    let mut svc = l.layer(limited.clone());
    let get = || Request::get("/rq-paced").body(Body::empty()).unwrap();

    let first = svc.ready().await.unwrap().call(get());
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    let second = svc.ready().await.unwrap().call(get());
    let mut other = limited.clone();
    assert!(
        ready_now(&mut other),
        "the inner service's permit is free while the paced request waits"
    );
    drop(other);
    let started = tokio::time::Instant::now();
    assert_eq!(second.await.unwrap().status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::from_secs(1), "paced, no later");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A service whose readiness the test sets: not ready (it keeps the waker to wake when
/// set), ready, or failed (its `poll_ready` says "broken").
#[derive(Clone, Default)]
struct Switch(Arc<std::sync::Mutex<SwitchState>>);

/// The readiness a [`Switch`] answers (`None`: not ready), and the waker to wake when
/// it is set.
type SwitchState = (Option<Result<(), &'static str>>, Option<std::task::Waker>);

impl Switch {
    fn set(&self, to: Option<Result<(), &'static str>>) {
        let mut state = self.0.lock().unwrap();
        state.0 = to;
        if let Some(waker) = state.1.take() {
            waker.wake();
        }
    }
}

impl tower::Service<Request<Body>> for Switch {
    type Response = http::Response<Body>;
    type Error = &'static str;
    type Future = std::future::Ready<Result<http::Response<Body>, &'static str>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), &'static str>> {
        let mut state = self.0.lock().unwrap();
        match state.0 {
            Some(ready) => std::task::Poll::Ready(ready),
            None => {
                state.1 = Some(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }

    fn call(&mut self, _req: Request<Body>) -> Self::Future {
        std::future::ready(Ok(http::Response::new(Body::empty())))
    }
}

#[tokio::test(start_paused = true)]
async fn an_inner_readiness_error_is_the_admitted_requests_error_and_a_rejection_stays_a_429() {
    // The inner service's `poll_ready` error used to be the layer's `poll_ready`
    // error, for every request, the ones the engine rejects too.
    use tower::{Layer as _, Service as _};
    let (l, clock) = layer(vec![route(
        "rq-broken",
        RouteMatch::prefix("/rq-broken"),
        1.0,
    )]);
    let inner = Switch::default();
    let mut svc = l.layer(inner.clone());
    let get = || Request::get("/rq-broken").body(Body::empty()).unwrap();

    // Admitted while the inner service is not ready; it fails while the request waits.
    assert!(ready_now(&mut svc));
    let mut waiting = Box::pin(svc.call(get()));
    assert!(poll_now(&mut waiting).is_pending());
    inner.set(Some(Err("broken")));
    assert!(
        ready_now(&mut svc),
        "a failed inner service fails admitted requests only"
    );
    let rejected = svc.call(get()).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(waiting.await.unwrap_err(), "broken");
    // Admitted while it is failed: the same error, from the response future.
    clock.advance(Duration::from_secs(1));
    assert_eq!(svc.call(get()).await.unwrap_err(), "broken");
    // Once it is ready again, requests are served.
    inner.set(Some(Ok(())));
    clock.advance(Duration::from_secs(1));
    assert_eq!(svc.call(get()).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn load_shed_inside_the_layer_sheds_an_admitted_request_the_full_inner_cannot_take() {
    // As the README says: the layer hides the inner service's backpressure from what
    // is outside it, so shedding on a full inner service is done inside it.
    use tower::{Layer as _, Service as _};
    let (l, _clock) = layer(vec![route(
        "rq-inner-shed",
        RouteMatch::prefix("/rq-inner-shed"),
        2.0,
    )]);
    let calls = Arc::new(AtomicU64::new(0));
    let (inner, holder) = saturated(calls.clone()).await;
    let mut svc = l.layer(tower::load_shed::LoadShed::new(inner));
    let get = || Request::get("/rq-inner-shed").body(Body::empty()).unwrap();

    let shed = svc.call(get()).await.unwrap_err();
    assert!(shed.is::<tower::load_shed::error::Overloaded>(), "{shed}");
    drop(holder);
    assert_eq!(svc.call(get()).await.unwrap().status(), StatusCode::OK);
    let over = svc.call(get()).await.unwrap();
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_paced_request_gives_its_place_to_the_next() {
    // A paced request dropped before its departure (its client left) kept its place:
    // the next request was refused `queue_full` by a queue holding no one.
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second(
        "rq-paced-drop",
        "/rq-paced-drop",
        Algorithm::LeakyBucket { queue: 1 },
    );
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls.clone(), Duration::ZERO));
    let get = || Request::get("/rq-paced-drop").body(Body::empty()).unwrap();

    assert_eq!(svc.call(get()).await.unwrap().status(), StatusCode::OK);
    let mut paced = Box::pin(svc.call(get()));
    assert!(poll_now(&mut paced).is_pending());
    drop(paced);
    let next = svc.call(get());
    let started = tokio::time::Instant::now();
    let served = next.await.unwrap();
    assert_eq!(served.status(), StatusCode::OK, "{:?}", served.headers());
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "at the dropped one's time"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "the dropped one never called"
    );
}

#[tokio::test(start_paused = true)]
async fn a_paced_request_that_departed_keeps_its_place_spent() {
    // Dropped after its departure, while it waits for the inner service, a request
    // has used its interval: nothing is given back.
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second(
        "rq-paced-gone",
        "/rq-paced-gone",
        Algorithm::LeakyBucket { queue: 1 },
    );
    let inner = Switch::default();
    let mut svc = l.layer(inner.clone());
    let get = || Request::get("/rq-paced-gone").body(Body::empty()).unwrap();

    let first = svc.call(get());
    let mut paced = Box::pin(svc.call(get()));
    assert!(poll_now(&mut paced).is_pending());
    // Its departure passes (the engine's manual clock stands still: only the place's
    // own record of having departed keeps it from being given back).
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        poll_now(&mut paced).is_pending(),
        "departed, waits for the inner"
    );
    drop(paced);
    let std::task::Poll::Ready(Ok(full)) = poll_now(&mut Box::pin(svc.call(get()))) else {
        panic!("its place was given back: the next request is paced, not refused");
    };
    assert_eq!(full.headers()["rocgate-reason"], "queue_full");
    inner.set(Some(Ok(())));
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
}

/// A route built in code that a file would refuse (a `cut_limit` above `base_limit`, so
/// that a cut would raise the limit) builds no layer: both constructors return the
/// problem under the field path the file would have. They used to build the layer.
#[test]
fn routes_a_file_would_refuse_build_no_layer() {
    let mut order = RouteConfig::new("layer_refused", RouteMatch::exact("POST", "/api/order"));
    order.controller.base_limit_rps = 20.0; // the default cut_limit is 60
    let config = Config::new(vec![order]);
    let want = "config: routes[0].cut_limit: must be ≤ base_limit (20), got 60";
    let from_config = AdmissionLayer::from_config(&config).unwrap_err();
    assert_eq!(from_config.to_string(), want);
    let builder = AdmissionLayer::builder(&config).unwrap_err();
    assert_eq!(builder.to_string(), want);
    // No route at all is refused too, as in a file.
    let empty = AdmissionLayer::from_config(&Config::new(vec![])).unwrap_err();
    assert!(empty.to_string().contains("routes"), "{empty}");
}

/// A shared engine replaced by a reload: layers built over it decide with the new one
/// from the next request on; a reload to routes a file would refuse leaves it as it was.
#[tokio::test]
async fn a_shared_engine_replaced_is_the_one_the_layer_decides_with() {
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let config = Config::new(vec![route(
        "layer_replaced",
        RouteMatch::exact("POST", "/api/order"),
        1.0,
    )]);
    let shared =
        SharedEngine::new(Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap());
    let hits = Arc::new(AtomicU64::new(0));
    let app = app(
        AdmissionLayer::with_engine(shared.clone(), clock.clone()).build(),
        hits,
    );
    let status = |app: Router| async move { app.oneshot(post_order()).await.unwrap().status() };
    assert_eq!(status(app.clone()).await, StatusCode::OK);
    assert_eq!(status(app.clone()).await, StatusCode::TOO_MANY_REQUESTS);

    let mut bad = config.clone();
    bad.routes[0].controller.cut_limit_rps = 5.0; // above base_limit 1
    let before = shared.load();
    let e = before
        .reload(&bad, clock.now(), SystemTime::UNIX_EPOCH)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "config: routes[0].cut_limit: must be ≤ base_limit (1), got 5"
    );
    assert!(
        Arc::ptr_eq(&before, &shared.load()),
        "the engine in force is kept"
    );

    // A new route table (another path): the layer now admits there, at once.
    let mut other = config.clone();
    other.routes[0].matcher = RouteMatch::exact("POST", "/api/other");
    let next = before
        .reload(&other, clock.now(), SystemTime::UNIX_EPOCH)
        .unwrap();
    let replaced = shared.replace(next);
    assert!(Arc::ptr_eq(&replaced, &before));
    assert_eq!(
        status(app).await,
        StatusCode::OK,
        "/api/order is no route now"
    );
}

/// What a tower user needs of the public types, checked by the compiler: the layer, its
/// builder, its service, the shared engine and a route id are `Send + Sync + Clone +
/// Debug` (a service shared across tasks and cloned per connection), the engine is
/// shared across threads, the response future is `Send` over a `Send` service, and a
/// config error is a `std::error::Error` that can cross threads.
#[test]
fn public_types_are_send_sync_clone_and_debug() {
    fn shared<T: Send + Sync + Clone + std::fmt::Debug + 'static>() {}
    fn sent<T: Send + std::fmt::Debug>() {}
    fn threads<T: Send + Sync + std::fmt::Debug>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    shared::<AdmissionLayer>();
    shared::<rocgate::http::AdmissionService<Router>>();
    shared::<SharedEngine>();
    shared::<rocgate::http::MatchedRoute>();
    shared::<rocgate::http::HeldPermit>();
    shared::<rocgate::http::ClientIpResolver>();
    sent::<rocgate::http::ResponseFuture<Router, Body, Body>>();
    shared::<rocgate::http::AdmissionLayerBuilder>();
    shared::<rocgate::engine::RouteId>();
    threads::<Engine>();
    error::<rocgate::config::ConfigError>();
    error::<rocgate::sim::SimError>();
}

/// A builder set up once builds the layer of two routers: both layers decide on one
/// engine, so the limit holds across them.
#[tokio::test]
async fn layers_built_from_a_builder_and_its_clone_share_one_engine() {
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let config = Config::new(vec![route(
        "cloned_builder",
        RouteMatch::exact("POST", "/api/order"),
        2.0,
    )]);
    let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
    let builder = AdmissionLayer::with_engine(SharedEngine::new(engine), clock).matched_route(true);
    let (first, second) = (builder.clone().build(), builder.build());
    let hits = Arc::new(AtomicU64::new(0));
    let (a, b) = (app(first, hits.clone()), app(second, hits.clone()));
    let status = |app: Router| async move { app.oneshot(post_order()).await.unwrap().status() };
    assert_eq!(status(a.clone()).await, StatusCode::OK);
    assert_eq!(status(b.clone()).await, StatusCode::OK);
    // The burst of 2 is spent, through either layer.
    assert_eq!(status(a).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(b).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(hits.load(Ordering::Relaxed), 2);
}

/// A leaky-bucket route of 1 req/s (queue 2) named `name` on `/name`, and a GET to it.
fn paced(name: &'static str) -> (AdmissionLayer, impl Fn() -> Request<Body>) {
    use rocgate::limiter::Algorithm;
    let path = format!("/{name}");
    let (l, _clock) = one_a_second(name, &path, Algorithm::LeakyBucket { queue: 2 });
    (l, move || Request::get(&path).body(Body::empty()).unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_timeout_outside_counts_the_pacing_wait_and_one_inside_does_not() {
    // As the README says: tower's `Timeout` starts its timer in `call`, so inside the
    // layer it starts once the paced request departs; outside, it runs through the wait.
    use tower::{Layer as _, Service as _, ServiceBuilder};
    let half = Duration::from_millis(500);

    let (l, get) = paced("rq-timeout-inside");
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(l)
        .timeout(half)
        .service(counting_service(calls.clone(), Duration::ZERO));
    assert!(svc.ready().await.unwrap().call(get()).await.is_ok());
    let started = tokio::time::Instant::now();
    let waited = svc.ready().await.unwrap().call(get()).await;
    assert_eq!(waited.unwrap().status(), StatusCode::OK, "not timed out");
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let (l, get) = paced("rq-timeout-outside");
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = tower::timeout::Timeout::new(
        l.layer(counting_service(calls.clone(), Duration::ZERO)),
        half,
    );
    assert!(svc.ready().await.unwrap().call(get()).await.is_ok());
    let started = tokio::time::Instant::now();
    let e = svc.ready().await.unwrap().call(get()).await.unwrap_err();
    assert!(e.is::<tower::timeout::error::Elapsed>(), "{e}");
    assert_eq!(started.elapsed(), half, "timed out while paced");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never reached the service");
}

#[tokio::test(start_paused = true)]
async fn a_buffer_outside_hands_every_request_on_and_one_inside_is_the_inner_service() {
    // Outside: the layer is always ready, so a `Buffer` of 1 passes a rejected request
    // on while an admitted one waits for the full inner service. Inside: the `Buffer`
    // is the inner service, readied and called by the admitted request.
    use tower::buffer::Buffer;
    use tower::{Layer as _, Service as _};
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();

    let (l, _clock) = layer(vec![route(
        "rq-buffer-out",
        RouteMatch::prefix("/rq-buffer-out"),
        1.0,
    )]);
    let calls = Arc::new(AtomicU64::new(0));
    let (inner, holder) = saturated(calls.clone()).await;
    let mut svc = Buffer::new(l.layer(inner), 1);
    let admitted = svc.ready().await.unwrap().call(get("/rq-buffer-out"));
    let admitted = tokio::spawn(admitted);
    tokio::task::yield_now().await;
    let rejected = svc.ready().await.unwrap().call(get("/rq-buffer-out")).await;
    assert_eq!(rejected.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!admitted.is_finished(), "waits for the inner service");
    drop(holder);
    assert_eq!(admitted.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (l, _clock) = layer(vec![route(
        "rq-buffer-in",
        RouteMatch::prefix("/rq-buffer-in"),
        1.0,
    )]);
    let calls = Arc::new(AtomicU64::new(0));
    let inner =
        tower::limit::ConcurrencyLimit::new(counting_service(calls.clone(), Duration::ZERO), 1);
    let mut holder = inner.clone();
    holder.ready().await.unwrap();
    let mut svc = l.layer(Buffer::new(inner, 1));
    let admitted = tokio::spawn(svc.call(get("/rq-buffer-in")));
    tokio::task::yield_now().await;
    let rejected = svc.call(get("/rq-buffer-in")).await;
    assert_eq!(rejected.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!admitted.is_finished(), "waits for the inner service");
    drop(holder);
    assert_eq!(admitted.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// A request whose `fail` header tells [`panicking_inner`] where to panic.
fn failing(req: http::request::Builder, fail: &str) -> Request<Body> {
    req.header("fail", fail).body(Body::empty()).unwrap()
}

/// An inner service that panics in `call` for a request whose `fail` header is
/// `call`, in its response future for `future`, and answers 200 otherwise.
fn panicking_inner() -> impl tower::Service<
    Request<Body>,
    Response = http::Response<Body>,
    Error = std::convert::Infallible,
    Future = impl std::future::Future<
        Output = Result<http::Response<Body>, std::convert::Infallible>,
    > + Send,
> + Clone
       + Send {
    tower::service_fn(|req: Request<Body>| {
        let fail = req.headers()["fail"].to_str().unwrap().to_owned();
        assert_ne!(fail, "call", "the inner service panics in call");
        async move {
            assert_ne!(fail, "future", "the inner future panics");
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        }
    })
}

#[tokio::test]
async fn a_panicking_inner_service_gives_its_concurrency_permit_back() {
    // A panic unwinds through the layer (in `call`, or in the response future's task):
    // the permit goes with it, and the next request is admitted.
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second("rq-panic", "/rq-panic", Algorithm::Concurrency { queue: 0 });
    let get = |fail: &str| failing(Request::get("/rq-panic"), fail);
    let mut svc = l.layer(panicking_inner());
    let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        drop(svc.call(get("call")));
    }));
    assert!(called.is_err());
    let polled = tokio::spawn(svc.call(get("future"))).await;
    assert!(polled.unwrap_err().is_panic());
    let served = svc.call(get("no")).await.unwrap();
    assert_eq!(served.status(), StatusCode::OK, "{:?}", served.headers());
}

#[tokio::test]
async fn the_layer_serves_any_request_body_and_answers_in_the_inner_services_body() {
    // Not only axum's `Body`: a `String` request body, and `Full<Bytes>` responses,
    // the rejection's too.
    use http_body_util::Full;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = layer(vec![route(
        "rq-bodies",
        RouteMatch::prefix("/rq-bodies"),
        1.0,
    )]);
    let echo = tower::service_fn(|req: Request<String>| async move {
        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(bytes::Bytes::from(
            req.into_body(),
        ))))
    });
    let mut svc = l.layer(echo);
    let post = || {
        Request::post("/rq-bodies")
            .body("hello".to_owned())
            .unwrap()
    };
    let admitted = svc.call(post()).await.unwrap();
    assert_eq!(
        admitted.into_body().collect().await.unwrap().to_bytes(),
        "hello"
    );
    let rejected = svc.call(post()).await.unwrap();
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    let length = rejected.headers()["content-length"].clone();
    let body = rejected.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(length, body.len().to_string().as_str());
    assert!(
        body.starts_with(br#"{"error":"rate_limited","reason":"limit""#),
        "{body:?}"
    );
}

/// A paced request's wait is a tokio timer: outside a tokio runtime (or in one without
/// timers) `call` panics, as tokio's `sleep` does. Its place in the bucket went with
/// the panic: the queue, holding no one, refused every later request `queue_full`.
/// Now the place is given back as the panic unwinds.
#[test]
fn a_paced_call_that_panics_outside_tokio_gives_its_place_back() {
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second(
        "rq-no-timer",
        "/rq-no-timer",
        Algorithm::LeakyBucket { queue: 1 },
    );
    let inner = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let mut svc = l.layer(inner);
    let get = || Request::get("/rq-no-timer").body(Body::empty()).unwrap();
    let no_timers = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let first = no_timers.block_on(svc.call(get())).unwrap();
    assert_eq!(first.status(), StatusCode::OK, "admitted at once, no timer");
    for no_timer in [Some(&no_timers), None] {
        let paced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match no_timer {
            Some(runtime) => runtime.block_on(async { drop(svc.call(get())) }),
            None => drop(svc.call(get())),
        }));
        assert!(paced.is_err(), "tokio's sleep panics");
    }
    let timers = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let next = timers.block_on(async { svc.call(get()).await }).unwrap();
    assert_eq!(next.status(), StatusCode::OK, "{:?}", next.headers());
}

/// A config's `[server] trusted_proxies` are the layer's: behind a load balancer in that
/// network, each client behind it is a key of its own. They were ignored (the layer
/// trusted no proxy unless told in code), so every client shared the balancer's key,
/// the whole site one client's quota.
#[tokio::test]
async fn a_configs_trusted_proxies_are_the_layers() {
    let mut config = order_per_client("rq-trusted");
    config.server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    let from = |client: &str| order_from(client, "10.0.0.1");
    for l in layers_of(&config) {
        let app = app(l, Arc::new(AtomicU64::new(0)));
        let status = |client| {
            let app = app.clone();
            async move { app.oneshot(from(client)).await.unwrap().status() }
        };
        assert_eq!(status("203.0.113.1").await, StatusCode::OK);
        assert_eq!(
            status("203.0.113.2").await,
            StatusCode::OK,
            "a key of its own"
        );
        assert_eq!(status("203.0.113.1").await, StatusCode::TOO_MANY_REQUESTS);
    }
    // Set in code, the builder's networks replace the config's.
    let l = AdmissionLayer::builder(&config)
        .unwrap()
        .trusted_proxies(Vec::new())
        .build();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    assert_eq!(
        app.clone()
            .oneshot(from("203.0.113.1"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let shared = app.oneshot(from("203.0.113.2")).await.unwrap().status();
    assert_eq!(shared, StatusCode::TOO_MANY_REQUESTS, "the balancer's key");
}

/// A config's `[server] trusted_hops` is the layer's, from any peer: behind a CDN
/// whose addresses cannot be listed (one hop that appends its client), each client is
/// the right-most entry, a key of its own, whatever a client wrote to its left. The
/// builder's count replaces the config's.
#[tokio::test]
async fn a_configs_trusted_hops_are_the_layers() {
    let mut config = order_per_client("rq-hops");
    config.server.trusted_hops = 1;
    for l in layers_of(&config) {
        let app = app(l, Arc::new(AtomicU64::new(0)));
        let status = |xff, peer| {
            let app = app.clone();
            async move { app.oneshot(order_from(xff, peer)).await.unwrap().status() }
        };
        assert_eq!(status("203.0.113.1", "198.51.100.1").await, StatusCode::OK);
        // Through another CDN node: the same client, its key.
        assert_eq!(
            status("6.6.6.6, 203.0.113.1", "198.51.100.2").await,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            status("203.0.113.1, 203.0.113.2", "198.51.100.1").await,
            StatusCode::OK,
            "a key of its own"
        );
    }
    // Set in code, the builder's count replaces the config's: two hops.
    let l = AdmissionLayer::builder(&config)
        .unwrap()
        .trusted_hops(2)
        .build();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    let first = app
        .clone()
        .oneshot(order_from("203.0.113.1, 10.0.0.1", "198.51.100.1"));
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    let again = app.oneshot(order_from("203.0.113.1, 10.0.0.2", "198.51.100.2"));
    assert_eq!(again.await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
}

/// Behind a proxy that writes RFC 7239's `Forwarded` and passes on the
/// `X-Forwarded-For` its client sent, the config's `client_ip_header = "forwarded"`
/// keys each client by the proxy's word: a client that sends `X-Forwarded-For` of its
/// own does not escape its quota (the layer read `X-Forwarded-For` wherever there
/// was one, so each invented address was a fresh key).
#[tokio::test]
async fn a_configs_client_ip_header_is_the_only_one_the_layer_reads() {
    let mut config = order_per_client("rq-forwarded");
    config.server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    config.server.client_ip_header = ClientIpHeader::Forwarded;
    let from = |client: &str, invented: &str| {
        let mut req = order_from(invented, "10.0.0.1");
        let forwarded = format!("for={client}");
        req.headers_mut()
            .insert("forwarded", forwarded.parse().unwrap());
        req
    };
    let app = app(
        AdmissionLayer::from_config(&config).unwrap(),
        Arc::new(AtomicU64::new(0)),
    );
    let status = |client, invented| {
        let app = app.clone();
        async move { app.oneshot(from(client, invented)).await.unwrap().status() }
    };
    assert_eq!(status("203.0.113.1", "6.6.6.1").await, StatusCode::OK);
    assert_eq!(
        status("203.0.113.1", "6.6.6.2").await,
        StatusCode::TOO_MANY_REQUESTS,
        "an invented X-Forwarded-For is no new key"
    );
    assert_eq!(status("203.0.113.2", "6.6.6.2").await, StatusCode::OK);
}

/// Two layers stacked (one around the app, one around a route), each with a concurrency
/// route the request takes: the response holds both permits until it is dropped. The
/// outer layer's permit replaced the inner's in the response's extensions, dropping it:
/// the inner route counted the request out while its response was still held.
#[tokio::test]
async fn stacked_layers_both_hold_their_permits_until_the_response_goes() {
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let concurrency =
        |name: &str| one_a_second(name, "/rq-stacked", Algorithm::Concurrency { queue: 0 }).0;
    let (outer, inner) = (
        concurrency("rq-stacked-outer"),
        concurrency("rq-stacked-inner"),
    );
    let handler = tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    });
    let mut direct = inner.layer(handler);
    let mut stacked = outer.layer(direct.clone());
    let get = || Request::get("/rq-stacked").body(Body::empty()).unwrap();

    let held = stacked.call(get()).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let refused = direct.call(get()).await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the inner permit is held"
    );
    let refused = stacked.call(get()).await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "so is the outer"
    );
    drop(held);
    assert_eq!(direct.call(get()).await.unwrap().status(), StatusCode::OK);
    assert_eq!(stacked.call(get()).await.unwrap().status(), StatusCode::OK);
}

/// Sends `rounds` rounds of two requests through `timed`, a timeout of 500 ms above a
/// route whose one permit is held and whose queue takes 2: both wait, a third is
/// refused `queue_full`, and both time out.
async fn time_out_in_the_queue<S>(timed: &mut S, get: impl Fn() -> Request<Body>, rounds: usize)
where
    S: tower::Service<Request<Body>, Response = http::Response<Body>, Error = tower::BoxError>,
{
    for _ in 0..rounds {
        let a = timed.ready().await.unwrap().call(get());
        let b = timed.ready().await.unwrap().call(get());
        let full = timed.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(full.headers()["rocgate-reason"], "queue_full");
        let (a, b) = tokio::join!(a, b);
        for e in [a.unwrap_err(), b.unwrap_err()] {
            assert!(e.is::<tower::timeout::error::Elapsed>(), "{e}");
        }
    }
}

/// A `Timeout` above a queued concurrency route (1 in flight, 2 may wait) cancels
/// the requests it times out while they wait for the permit: 5,000 rounds of two such
/// requests (10,000 cancelled waiters), then 1,000 more through a `Buffer` between the
/// timeout and the layer, leave the queue holding no one, so it takes its whole bound
/// again, and none of them reached the inner service. A queued request woken for the
/// freed permit and dropped before it takes it (its client left just then) passes the
/// permit on to the next in line.
#[tokio::test(start_paused = true)]
async fn a_timeout_above_a_queued_route_gives_every_cancelled_place_back() {
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second(
        "rq-queue-timeout",
        "/rq-queue-timeout",
        Algorithm::Concurrency { queue: 2 },
    );
    let get = || {
        Request::get("/rq-queue-timeout")
            .body(Body::empty())
            .unwrap()
    };
    let calls = Arc::new(AtomicU64::new(0));
    let mut direct = l.layer(counting_service(calls.clone(), Duration::ZERO));
    let mut timed = tower::timeout::Timeout::new(direct.clone(), Duration::from_millis(500));
    // The permit rides in the response held here.
    let held = direct.call(get()).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);

    time_out_in_the_queue(&mut timed, get, 5_000).await;
    let buffered = tower::buffer::Buffer::new(direct.clone(), 4);
    let mut timed = tower::timeout::Timeout::new(buffered, Duration::from_millis(500));
    time_out_in_the_queue(&mut timed, get, 1_000).await;
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no cancelled one was called"
    );

    let mut a = Box::pin(direct.call(get()));
    let mut b = Box::pin(direct.call(get()));
    assert!(poll_now(&mut a).is_pending() && poll_now(&mut b).is_pending());
    let full = direct.call(get()).await.unwrap();
    assert_eq!(full.headers()["rocgate-reason"], "queue_full", "2 wait");
    drop(held);
    drop(a);
    let served = b.await.unwrap();
    assert_eq!(served.status(), StatusCode::OK, "{:?}", served.headers());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A response body that holds its request's concurrency permit
/// (`hold_permit_through_body`) gives it back when it is dropped unread, or after
/// part of it was read (its client left mid-stream), not only at its end.
#[tokio::test]
async fn a_body_holding_its_permit_gives_it_back_when_dropped_unfinished() {
    use http_body_util::channel::Channel;
    use rocgate::http::hold_permit_through_body;
    use rocgate::limiter::Algorithm;
    use tower::{Service as _, ServiceBuilder};
    let (l, _clock) = one_a_second("rq-body", "/rq-body", Algorithm::Concurrency { queue: 0 });
    let senders = Arc::new(std::sync::Mutex::new(Vec::new()));
    let handler = tower::service_fn({
        let senders = senders.clone();
        move |_req: Request<Body>| {
            // Two chunks in, and the sender kept: the body never ends by itself.
            let (mut tx, body) = Channel::<bytes::Bytes>::new(2);
            let senders = senders.clone();
            async move {
                tx.send_data("a".into()).await.unwrap();
                tx.send_data("b".into()).await.unwrap();
                senders.lock().unwrap().push(tx);
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::new(body)))
            }
        }
    });
    let mut svc = ServiceBuilder::new()
        .map_response(hold_permit_through_body)
        .layer(l)
        .service(handler);
    let get = || Request::get("/rq-body").body(Body::empty()).unwrap();
    for read in [0, 1] {
        let mut body = svc.call(get()).await.unwrap().into_body();
        for _ in 0..read {
            assert_eq!(
                body.frame().await.unwrap().unwrap().into_data().unwrap(),
                "a"
            );
        }
        let refused = svc.call(get()).await.unwrap();
        assert_eq!(
            refused.headers()["rocgate-reason"],
            "concurrency",
            "held by the body, {read} chunks read"
        );
        drop(body);
        let next = svc.call(get()).await.unwrap();
        assert_eq!(
            next.status(),
            StatusCode::OK,
            "{read} chunks read, then dropped"
        );
    }
}

/// A queued request, handed its permit, whose inner service panics in `call` or whose
/// inner future panics (each in a task of its own, as a server runs it): the permit
/// goes back as the panic unwinds, and the queue holds no one after.
#[tokio::test(start_paused = true)]
async fn a_queued_request_that_panics_gives_its_permit_and_place_back() {
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    let (l, _clock) = one_a_second(
        "rq-queue-panic",
        "/rq-queue-panic",
        Algorithm::Concurrency { queue: 1 },
    );
    let get = |fail: &str| failing(Request::get("/rq-queue-panic"), fail);
    let mut svc = l.layer(panicking_inner());
    for fail in ["call", "future"] {
        let held = svc.call(get("no")).await.unwrap();
        let queued = tokio::spawn(svc.call(get(fail)));
        tokio::task::yield_now().await;
        let full = svc.call(get("no")).await.unwrap();
        assert_eq!(full.headers()["rocgate-reason"], "queue_full", "{fail}");
        drop(held);
        assert!(queued.await.unwrap_err().is_panic(), "{fail}");
        let next = svc.call(get("no")).await.unwrap();
        assert_eq!(
            next.status(),
            StatusCode::OK,
            "{fail}: {:?}",
            next.headers()
        );
        let queued = tokio::spawn(svc.call(get("no")));
        tokio::task::yield_now().await;
        assert!(!queued.is_finished(), "{fail}: one place in the queue");
        let full = svc.call(get("no")).await.unwrap();
        assert_eq!(full.headers()["rocgate-reason"], "queue_full", "{fail}");
        drop(next);
        assert_eq!(queued.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

/// A leaky-bucket request refused `queue_full` is told, in `Retry-After`, the wait
/// its bucket computed rounded up to whole seconds (2.5 s is 3, never 2; a wait under
/// a second is 1, never 0), and in `retry_after_ms` to the millisecond; sent again
/// after that wait on the engine's clock, it is admitted, and a millisecond sooner it
/// is not.
#[tokio::test(start_paused = true)]
async fn a_paced_routes_queue_full_retry_after_rounds_up_to_what_the_client_needs() {
    use rocgate::limiter::Algorithm;
    use tower::{Layer as _, Service as _};
    // One request each 2.5 s; one may wait.
    let mut r = route("rq-paced-retry", RouteMatch::prefix("/rq-paced-retry"), 0.4);
    r.controller.cut_limit_rps = 0.4;
    r.algorithm = Algorithm::LeakyBucket { queue: 1 };
    let (l, clock) = layer(vec![r]);
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls, Duration::ZERO));
    let get = || Request::get("/rq-paced-retry").body(Body::empty()).unwrap();
    assert_eq!(svc.call(get()).await.unwrap().status(), StatusCode::OK);
    // Paced to 2.5 s; kept, so that its place stays taken.
    let _paced = svc.call(get());
    let told = |res: http::Response<Body>| async move {
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(res.headers()["rocgate-reason"], "queue_full");
        let secs = res.headers()[http::header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .to_owned();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        (secs, json["retry_after_ms"].as_u64().unwrap())
    };
    let full = svc.call(get()).await.unwrap();
    assert_eq!(told(full).await, ("3".to_owned(), 2_500));
    clock.advance(Duration::from_millis(2_100));
    let full = svc.call(get()).await.unwrap();
    assert_eq!(told(full).await, ("1".to_owned(), 400));
    clock.advance(Duration::from_millis(399));
    let full = svc.call(get()).await.unwrap();
    assert_eq!(told(full).await, ("1".to_owned(), 1));
    clock.advance(Duration::from_millis(1));
    let admitted = svc.call(get());
    assert_eq!(admitted.await.unwrap().status(), StatusCode::OK);
}

/// A `concurrency` refusal's `Retry-After` is when a permit is expected to come free,
/// from how long the layer's permits were held on its clock: with uploads held 30 s,
/// 30 s (plus jitter), where it said 1 s whatever the holds. Until one is timed, 1 s.
#[tokio::test]
async fn a_concurrency_refusal_is_told_how_long_permits_are_held() {
    use tower::{Layer as _, Service as _};
    let (l, clock) = one_a_second("upload", "/upload", Algorithm::Concurrency { queue: 0 });
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls, Duration::ZERO));
    let post = || Request::post("/upload").body(Body::empty()).unwrap();
    let held = svc.ready().await.unwrap().call(post()).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let refused = svc.ready().await.unwrap().call(post()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1", "no hold timed yet");
    clock.advance(Duration::from_secs(30));
    drop(held); // the permit, in its extensions, held 30 s
    let _held = svc.ready().await.unwrap().call(post()).await.unwrap();
    let refused = svc.ready().await.unwrap().call(post()).await.unwrap();
    assert_eq!(refused.headers()["rocgate-reason"], "concurrency");
    let secs = retry_after_secs(refused.headers());
    assert!((30..=40).contains(&secs), "told {secs} s");
}

/// A `concurrency` route's `queue_full` is told when a permit is expected to come
/// free for it, as its `concurrency` refusal is: an estimate from the mean hold, over
/// a second jittered as that one is, so that the clients a full queue refuses within
/// the same second do not all come back at once. It was told the bare mean, every
/// client the same (the jitter was left to `concurrency`, and `queue_full` taken for
/// a `leaky_bucket`'s, whose wait is exact).
#[tokio::test]
async fn a_concurrency_routes_queue_full_is_jittered_as_its_refusals_are() {
    use tower::{Layer as _, Service as _};
    let (l, clock) = one_a_second("queued", "/queued", Algorithm::Concurrency { queue: 1 });
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls, Duration::ZERO));
    let post = || Request::post("/queued").body(Body::empty()).unwrap();
    let held = svc.ready().await.unwrap().call(post()).await.unwrap();
    clock.advance(Duration::from_secs(10));
    drop(held); // a hold of 10 s timed
    let _held = svc.ready().await.unwrap().call(post()).await.unwrap();
    let _queued = svc.ready().await.unwrap().call(post());
    let mut told = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let refused = svc.ready().await.unwrap().call(post()).await.unwrap();
        assert_eq!(refused.headers()["rocgate-reason"], "queue_full");
        let secs = retry_after_secs(refused.headers());
        // Two releases of a permit held 10 s: 20 s, plus up to 10 s.
        assert!((20..=30).contains(&secs), "told {secs} s");
        told.insert(secs);
    }
    assert!(told.len() >= 2, "every client told the same: {told:?}");
}

/// Permits held a few milliseconds: the header still says 1 s (whole seconds, at
/// least 1), and the body's `retry_after_ms` the estimate itself, rounded up.
#[tokio::test]
async fn a_concurrency_refusal_of_short_holds_says_1_s_and_the_estimate_in_ms() {
    use tower::{Layer as _, Service as _};
    let (l, clock) = one_a_second("short", "/short", Algorithm::Concurrency { queue: 0 });
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = l.layer(counting_service(calls, Duration::ZERO));
    let post = || Request::post("/short").body(Body::empty()).unwrap();
    let held = svc.ready().await.unwrap().call(post()).await.unwrap();
    clock.advance(Duration::from_millis(5));
    drop(held);
    let _held = svc.ready().await.unwrap().call(post()).await.unwrap();
    let refused = svc.ready().await.unwrap().call(post()).await.unwrap();
    assert_eq!(refused.headers()["retry-after"], "1");
    let body = axum::body::to_bytes(refused.into_body(), 1024)
        .await
        .unwrap();
    let body = std::str::from_utf8(&body).unwrap();
    assert!(body.contains(r#""retry_after_ms":5,"#), "{body}");
}

/// A refusal's `Retry-After`, in whole seconds.
fn retry_after_secs(headers: &http::HeaderMap) -> u64 {
    headers["retry-after"].to_str().unwrap().parse().unwrap()
}

/// A refusal by a partitioned route's `route_limit` (its keys together) is a 429 like
/// a key's own: the reason, and the total's exact wait in `retry_after_ms` (rounded up
/// to whole seconds in `Retry-After`), after which the next key is admitted. Its
/// `RateLimit-Policy` states the total's quota, which is used up, not the key's, which
/// is not; a refusal by the key's own limit states the key's.
#[tokio::test]
async fn a_refusal_by_the_keys_total_carries_retry_after_and_the_reason() {
    let mut r = route("order", RouteMatch::exact("POST", "/api/order"), 2.0);
    r.partition = Partition::Header("x-key".into(), KeyLimits::default());
    r.route_limit_rps = Some(4.0);
    let (l, clock) = layer(vec![r]);
    let engine = l.engine();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    let order = |key: &str| {
        let mut req = post_order();
        req.headers_mut()
            .insert("x-key", http::HeaderValue::from_str(key).unwrap());
        app.clone().oneshot(req)
    };
    for key in ["a", "b", "c", "d"] {
        assert_eq!(order(key).await.unwrap().status(), StatusCode::OK, "{key}");
    }
    // Key `e` is within its own 2 req/s: the total of 4 refuses it.
    let res = order("e").await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after_secs(res.headers()), 1);
    assert_eq!(res.headers()["rocgate-reason"], "limit");
    // The quota stated is the total's (4 a second, used up), not the key's 2, of
    // which `e` had spent one.
    assert_eq!(res.headers()["ratelimit-policy"], r#""order";q=4;w=1"#);
    assert_eq!(res.headers()["ratelimit"], r#""order";r=0;t=1"#);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["reason"], "limit");
    assert_eq!(json["retry_after_ms"], 250);
    let total = engine.snapshot(clock.now())[0].route_limit.unwrap();
    assert_eq!(total.rejected, 1);
    clock.advance(Duration::from_millis(250));
    assert_eq!(order("f").await.unwrap().status(), StatusCode::OK);
    // A key refused by its own limit is told its own quota: a second on, the total
    // full again, `f` has its 2 admitted and the third refused by its key.
    clock.advance(Duration::from_secs(1));
    for _ in 0..2 {
        assert_eq!(order("f").await.unwrap().status(), StatusCode::OK);
    }
    let own = order("f").await.unwrap();
    assert_eq!(own.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(own.headers()["ratelimit-policy"], r#""order";q=2;w=1"#);
    assert_eq!(
        engine.snapshot(clock.now())[0]
            .route_limit
            .unwrap()
            .rejected,
        1
    );
}

/// A layer around the whole router and another on one route, over one engine (as a
/// router-wide layer and a route's own, both built from one builder): a request both
/// see is one arrival, decided and counted once. The inner layer decided it again, so
/// each request counted twice (the route's second request of a burst of 2 refused,
/// its ROC and offered count twice the traffic). A layer over another engine decides
/// it as its own.
#[tokio::test]
async fn two_layers_over_one_engine_decide_a_request_once() {
    let mut order = route("order", RouteMatch::exact("POST", "/api/order"), 2.0);
    order.controller.cut_limit_rps = 2.0;
    let (outer, clock) = layer(vec![order]);
    let inner = outer.clone();
    let hits = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route(
            "/api/order",
            post({
                let hits = hits.clone();
                move || async move {
                    hits.fetch_add(1, Ordering::Relaxed);
                    "ordered"
                }
            })
            .layer(inner),
        )
        .layer(outer.clone());
    let statuses = orders(&app, 3).await;
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert_eq!(hits.load(Ordering::Relaxed), 2);
    let snapshot = &outer.engine().snapshot(clock.now())[0];
    assert_eq!((snapshot.offered, snapshot.admitted), (3, 2));

    // Two layers built apart over one shared engine, a route-level one under
    // `RouteKey::MatchedPath`, are one engine too.
    let mut order = route("order", RouteMatch::exact("POST", "/api/order"), 2.0);
    order.controller.cut_limit_rps = 2.0;
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let engine = Engine::new(
        &Config::new(vec![order]),
        clock.now(),
        SystemTime::UNIX_EPOCH,
    );
    let shared = SharedEngine::new(engine.unwrap());
    let wide = AdmissionLayer::with_engine(shared.clone(), clock.clone()).build();
    let own = AdmissionLayer::with_engine(shared, clock.clone())
        .route_key(RouteKey::MatchedPath)
        .build();
    let app = Router::new()
        .route("/api/order", post(|| async { "ordered" }).layer(own))
        .layer(wide);
    let statuses = orders(&app, 3).await;
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    // Under another engine's layer, of 1 a second, the route's second request is that
    // engine's to refuse, though the outer engine admits it.
    let mut strict = route("order", RouteMatch::exact("POST", "/api/order"), 1.0);
    strict.controller.cut_limit_rps = 1.0;
    let (other, _) = layer(vec![strict]);
    let mut roomy = route("order", RouteMatch::exact("POST", "/api/order"), 5.0);
    roomy.controller.cut_limit_rps = 5.0;
    let (outer, _) = layer(vec![roomy]);
    let app = Router::new()
        .route("/api/order", post(|| async { "ordered" }).layer(other))
        .layer(outer);
    let statuses = orders(&app, 2).await;
    assert_eq!(statuses, [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]);
}

/// An empty `X-Forwarded-For` entry reached in the walk stands where a trusted proxy
/// should have named its peer: the request is keyed by the proxy right of it (the
/// peer, for a trailing comma), never by what lies left of it, which a client may have
/// written; a client cannot take a fresh key by writing a fresh address there.
#[tokio::test]
async fn an_empty_forwarded_for_entry_keys_by_the_proxy_right_of_it() {
    let mut config = order_per_client("rq-empty-entry");
    config.server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    let app = app(
        AdmissionLayer::from_config(&config).unwrap(),
        Arc::new(AtomicU64::new(0)),
    );
    let status = |xff| from_proxy(&app, xff);
    assert_eq!(status("203.0.113.1, , 10.0.0.2").await, StatusCode::OK);
    assert_eq!(
        status("203.0.113.9, , 10.0.0.2").await,
        StatusCode::TOO_MANY_REQUESTS,
        "10.0.0.2's key"
    );
    assert_eq!(status("203.0.113.1, 10.0.0.3,").await, StatusCode::OK);
    assert_eq!(
        status("203.0.113.9, 10.0.0.3,").await,
        StatusCode::TOO_MANY_REQUESTS,
        "the peer's key"
    );
}

/// An IPv6 client a proxy names with its zone id (`fe80::1%eth0`, or `%25` for the
/// `%` as a URI writes it) is keyed by its address: the zone is the proxy's
/// interface. Every spelling but a numeric zone in brackets with a port ended the
/// walk, and each such client took the proxy's key, one bucket for all of them.
#[tokio::test]
async fn an_ipv6_client_named_with_its_zone_id_is_a_key_of_its_own() {
    let mut config = order_per_client("rq-zone");
    config.server.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
    // Each address a key (link-local clients share their /64, fe80::, by default).
    if let Partition::ClientIp(limits) = &mut config.routes[0].partition {
        limits.ipv6_prefix = 128;
    }
    let app = app(
        AdmissionLayer::from_config(&config).unwrap(),
        Arc::new(AtomicU64::new(0)),
    );
    let status = |xff| from_proxy(&app, xff);
    assert_eq!(status("fe80::1%eth0").await, StatusCode::OK);
    assert_eq!(status("fe80::2%eth0").await, StatusCode::OK, "its own key");
    assert_eq!(
        status("[fe80::1%25eth1]:443").await,
        StatusCode::TOO_MANY_REQUESTS,
        "fe80::1's key"
    );
}

/// A trailing slash, under every route key and in tables small and indexed: an exact
/// path and a template take a path with or without one (a client does not escape
/// their limit by adding one), a catch-all's rest keeps it (`/files/` is not
/// `/files/{*rest}`'s, as axum does not route it there), and a prefix is the text, as
/// Envoy's `prefix`: `/sale/` takes `/sale/` and what follows, not `/sale`.
#[tokio::test]
async fn a_trailing_slash_is_matched_alike_by_exact_paths_and_templates() {
    for key in [RouteKey::Config, RouteKey::Normalized] {
        for fillers in [0, 8] {
            let mut routes = vec![
                route("order", RouteMatch::exact("GET", "/api/order"), 1.0),
                route("item", RouteMatch::exact("GET", "/api/items/{id}"), 1.0),
                route("files", RouteMatch::exact("GET", "/files/{*rest}"), 1.0),
                route("sale", RouteMatch::prefix("/sale/"), 1.0),
            ];
            for n in 0..fillers {
                let path = format!("/filler/{n}");
                routes.push(route(
                    &format!("filler{n}"),
                    RouteMatch::exact("GET", &path),
                    1.0,
                ));
            }
            for r in &mut routes {
                r.controller.cut_limit_rps = 1.0;
            }
            let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
            let engine =
                Engine::new(&Config::new(routes), clock.now(), SystemTime::UNIX_EPOCH).unwrap();
            let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock)
                .route_key(key)
                .build();
            let app = Router::new().fallback(|| async { "ok" }).layer(l);
            let status = |path: &'static str| {
                let app = app.clone();
                async move {
                    let req = Request::get(path).body(Body::empty()).unwrap();
                    app.oneshot(req).await.unwrap().status()
                }
            };
            let case = format!("{key:?}, {fillers} fillers");
            for (first, other) in [
                ("/api/order", "/api/order/"),
                ("/api/items/7/", "/api/items/8"),
                ("/files/a", "/files/b/"),
            ] {
                assert_eq!(status(first).await, StatusCode::OK, "{case}: {first}");
                assert_eq!(
                    status(other).await,
                    StatusCode::TOO_MANY_REQUESTS,
                    "{case}: {other} is {first}'s route"
                );
            }
            // `/sale` twice: counted by the prefix's route, the second would be refused.
            for unrouted in ["/files/", "/files", "/sale", "/sale"] {
                assert_eq!(status(unrouted).await, StatusCode::OK, "{case}: {unrouted}");
            }
            assert_eq!(status("/sale/").await, StatusCode::OK, "{case}");
            assert_eq!(
                status("/sale/x").await,
                StatusCode::TOO_MANY_REQUESTS,
                "{case}"
            );
        }
    }
    // What README says of axum: a nested router's `/` is the nest's path without the
    // slash, which a prefix ending in one does not take.
    let nested = Router::new().nest("/sale", Router::new().route("/", get(|| async { "ok" })));
    for (path, want) in [("/sale", StatusCode::OK), ("/sale/", StatusCode::NOT_FOUND)] {
        let req = Request::get(path).body(Body::empty()).unwrap();
        assert_eq!(
            nested.clone().oneshot(req).await.unwrap().status(),
            want,
            "{path}"
        );
    }
}

/// A route's own layer built with `matched_route(true)`, inside a router-wide one over
/// the same engine built without it: the request the outer one admitted passes the
/// inner one undecided, and still carries the route that admitted it to the handler,
/// as the inner layer promises every request it lets through.
#[tokio::test]
async fn a_request_passed_through_carries_the_route_the_inner_layer_promises() {
    use axum::Extension;
    use rocgate::http::MatchedRoute;
    let mut order = route("order", RouteMatch::exact("POST", "/api/order"), 2.0);
    order.controller.cut_limit_rps = 2.0;
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let engine = Engine::new(
        &Config::new(vec![order]),
        clock.now(),
        SystemTime::UNIX_EPOCH,
    );
    let shared = SharedEngine::new(engine.unwrap());
    let wide = AdmissionLayer::with_engine(shared.clone(), clock.clone()).build();
    let own = AdmissionLayer::with_engine(shared.clone(), clock.clone())
        .matched_route(true)
        .build();
    let handler = |route: Option<Extension<MatchedRoute>>| async move {
        route.map_or_else(|| "none".to_owned(), |r| r.0 .0.to_string())
    };
    let app = Router::new()
        .route("/api/order", post(handler).layer(own))
        .layer(wide);
    let res = app.clone().oneshot(post_order()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"order");
    let snapshot = &shared.load().snapshot(clock.now())[0];
    assert_eq!(
        (snapshot.offered, snapshot.admitted),
        (1, 1),
        "decided once"
    );
}

/// A concurrency route under two stacked layers over one engine: the outer one's
/// permit is the request's only one, held while it runs and given back as it ends. The
/// inner one, passing the request through, takes none (taking one, it would refuse the
/// route's one request in flight as a second), and leaves none behind.
#[tokio::test(start_paused = true)]
async fn stacked_layers_over_one_engine_hold_one_concurrency_permit() {
    use tower::{Layer as _, Service as _};
    let (outer, _clock) = one_a_second("stacked", "/stacked", Algorithm::Concurrency { queue: 0 });
    let calls = Arc::new(AtomicU64::new(0));
    let inner = outer
        .clone()
        .layer(counting_service(calls.clone(), Duration::from_secs(1)));
    let mut svc = outer.layer(inner);
    let get = || Request::get("/stacked").body(Body::empty()).unwrap();
    for round in 0..3 {
        let first = svc.ready().await.unwrap().call(get());
        let refused = svc.ready().await.unwrap().call(get()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "{round}");
        assert_eq!(first.await.unwrap().status(), StatusCode::OK, "{round}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// The count of `route`'s series of `rocgate_client_key_fallbacks_total` with `reason`
/// in what `handle` renders; `None` where it has none.
#[cfg(feature = "proxy")]
fn fallbacks(
    handle: &metrics_exporter_prometheus::PrometheusHandle,
    route: &str,
    reason: &str,
) -> Option<u64> {
    let line =
        format!("rocgate_client_key_fallbacks_total{{route=\"{route}\",reason=\"{reason}\"}} ");
    handle
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&line).map(|n| n.parse().unwrap()))
}

/// A request on a route partitioned by `ip` whose forwarding header ends the walk at an
/// empty or malformed entry is keyed by the proxy right of it: every such client shares
/// that key. Each one is counted in `rocgate_client_key_fallbacks_total` by route and
/// reason, and said at WARN at most once a minute per route and reason, naming the
/// header, the entry as received (escaped) and the key taken; a good walk counts
/// nothing. Nothing said so before.
#[cfg(feature = "proxy")]
#[tokio::test(flavor = "current_thread")]
async fn a_walk_ended_by_a_bad_entry_is_counted_and_said_once_a_minute() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (log, _guard) = captured::Captured::on_this_thread();
    let config = order_per_client("rq-fallback");
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
    let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock.clone())
        .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()])
        .build();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    let send = |xff: &'static [u8]| {
        let app = app.clone();
        async move {
            let mut req = post_order();
            req.headers_mut().insert(
                "x-forwarded-for",
                http::HeaderValue::from_bytes(xff).unwrap(),
            );
            req.extensions_mut()
                .insert(PeerAddr("10.0.0.1:4242".parse().unwrap()));
            let _ = app.oneshot(req).await.unwrap();
        }
    };
    let count = |reason: &str| fallbacks(&handle, "rq-fallback", reason);
    let said = "rocgate_client_key_fallbacks_total";
    send(b"203.0.113.1, 10.0.0.2").await;
    assert_eq!(count("empty_entry"), None, "{}", handle.render());
    assert_eq!(count("malformed_entry"), None);
    assert_eq!(log.lines_with(said).len(), 0);

    send(b"203.0.113.1, , 10.0.0.2").await;
    send(b"203.0.113.1, 10.0.0.3,").await;
    assert_eq!(count("empty_entry"), Some(2));
    let lines = log.lines_with(said);
    assert_eq!(lines.len(), 1, "{lines:?}");
    for part in [
        "WARN",
        "rq-fallback",
        "x-forwarded-for",
        "empty_entry",
        "10.0.0.2",
    ] {
        assert!(lines[0].contains(part), "{part}: {lines:?}");
    }

    send(b"6.6.6.6, junk\xe9\"x, 10.0.0.2").await;
    assert_eq!(count("malformed_entry"), Some(1));
    let lines = log.lines_with("malformed_entry");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(r#"entry="junk\xe9\"x""#), "{lines:?}");
    assert!(!lines[0].contains("6.6.6.6"), "{lines:?}");

    // Within the minute, counted and not said; a minute after the last line, said.
    clock.advance(Duration::from_secs(59));
    send(b", 10.0.0.2").await;
    assert_eq!(count("empty_entry"), Some(3));
    assert_eq!(log.lines_with("empty_entry").len(), 1);
    clock.advance(Duration::from_secs(1));
    send(b", 10.0.0.2").await;
    assert_eq!(count("empty_entry"), Some(4));
    assert_eq!(log.lines_with("empty_entry").len(), 2);
}

/// A request on a route partitioned by `ip` from a trusted proxy that carries no
/// forwarding header at all (or, where `Forwarded` is the header read, only
/// `X-Forwarded-For`) is keyed by the proxy's address, with every such request through
/// it: a proxy that stopped writing the header put its clients under one key unseen.
/// Each is counted in `rocgate_client_key_fallbacks_total` with `reason="no_header"`,
/// and said at WARN at most once a minute per route, naming the header and the key
/// taken; one with the header, and one from a peer that is no trusted proxy, count
/// nothing.
#[cfg(feature = "proxy")]
#[tokio::test(flavor = "current_thread")]
async fn a_trusted_proxys_request_without_a_forwarding_header_is_counted_and_said() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (log, _guard) = captured::Captured::on_this_thread();
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let app_of = |name: &str, header: ClientIpHeader| {
        let config = order_per_client(name);
        let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
        let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock.clone())
            .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()])
            .client_ip_header(header)
            .build();
        app(l, Arc::new(AtomicU64::new(0)))
    };
    let xff = app_of("rq-no-header", ClientIpHeader::XForwardedFor);
    let fwd = app_of("rq-no-forwarded", ClientIpHeader::Forwarded);
    let send = |app: &Router, peer: &str, header: Option<(&'static str, &'static str)>| {
        let mut req = post_order();
        if let Some((name, value)) = header {
            req.headers_mut()
                .insert(name, http::HeaderValue::from_static(value));
        }
        req.extensions_mut()
            .insert(PeerAddr(format!("{peer}:4242").parse().unwrap()));
        app.clone().oneshot(req)
    };
    let count = |route: &str| fallbacks(&handle, route, "no_header");
    let said = "no_header";
    send(&xff, "10.0.0.1", Some(("x-forwarded-for", "203.0.113.1")))
        .await
        .unwrap();
    send(&xff, "203.0.113.9", None).await.unwrap();
    assert_eq!(count("rq-no-header"), None, "{}", handle.render());
    assert_eq!(log.lines_with(said).len(), 0);

    send(&xff, "10.0.0.1", None).await.unwrap();
    send(&xff, "10.0.0.1", None).await.unwrap();
    assert_eq!(count("rq-no-header"), Some(2));
    let lines = log.lines_with(said);
    assert_eq!(lines.len(), 1, "{lines:?}");
    for part in ["WARN", "rq-no-header", "x-forwarded-for", "key=10.0.0.1"] {
        assert!(lines[0].contains(part), "{part}: {lines:?}");
    }
    assert!(!lines[0].contains("entry="), "{lines:?}");

    // `Forwarded` read: an `X-Forwarded-For` alone is no header of the walk's.
    send(&fwd, "10.0.0.2", Some(("x-forwarded-for", "203.0.113.1")))
        .await
        .unwrap();
    send(&fwd, "10.0.0.2", Some(("forwarded", "for=203.0.113.1")))
        .await
        .unwrap();
    assert_eq!(count("rq-no-forwarded"), Some(1));
    let lines = log.lines_with("rq-no-forwarded");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains(r#"header="forwarded""#), "{lines:?}");

    // Within the minute, counted and not said; a minute after the last line, said.
    clock.advance(Duration::from_secs(59));
    send(&xff, "10.0.0.1", None).await.unwrap();
    assert_eq!(count("rq-no-header"), Some(3));
    assert_eq!(log.lines_with("rq-no-header").len(), 1);
    clock.advance(Duration::from_secs(1));
    send(&xff, "10.0.0.1", None).await.unwrap();
    assert_eq!(count("rq-no-header"), Some(4));
    assert_eq!(log.lines_with("rq-no-header").len(), 2);
}

/// A manual clock at 1 s, the engine of `config` on it, and the test app behind a layer
/// over that engine that trusts proxies in 10.0.0.0/8.
#[cfg(feature = "proxy")]
fn behind_trusted_proxies(config: &Config) -> (Arc<ManualClock>, SharedEngine, Router) {
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let shared =
        SharedEngine::new(Engine::new(config, clock.now(), SystemTime::UNIX_EPOCH).unwrap());
    let l = AdmissionLayer::with_engine(shared.clone(), clock.clone())
        .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()])
        .build();
    (clock, shared, app(l, Arc::new(AtomicU64::new(0))))
}

/// An order from the trusted proxy 10.0.0.1, with no forwarding header.
#[cfg(feature = "proxy")]
fn from_a_trusted_proxy() -> Request<Body> {
    let mut req = post_order();
    req.extensions_mut()
        .insert(PeerAddr("10.0.0.1:4242".parse().unwrap()));
    req
}

/// The layer finds a route's fallback series by the route's place in the engine's
/// table: a reload that moves the route (a route put before it) takes its new engine
/// in at its first fallback, and the route keeps, by name, its series and when it last
/// said one: counted on, and not said again within the minute.
#[cfg(feature = "proxy")]
#[tokio::test(flavor = "current_thread")]
async fn a_routes_fallbacks_go_on_through_a_reload_that_moves_it() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (log, _guard) = captured::Captured::on_this_thread();
    let config = order_per_client("rq-moved");
    let (clock, shared, app) = behind_trusted_proxies(&config);
    let send = || app.clone().oneshot(from_a_trusted_proxy());
    let count = || fallbacks(&handle, "rq-moved", "no_header");
    send().await.unwrap();
    assert_eq!(count(), Some(1));
    assert_eq!(log.lines_with("rq-moved").len(), 1);

    let mut moved = config.clone();
    let first = route("first", RouteMatch::prefix("/first"), 1.0);
    moved.routes.insert(0, first);
    let reloaded = shared
        .load()
        .reload(&moved, clock.now(), SystemTime::UNIX_EPOCH)
        .unwrap();
    assert_eq!(reloaded.route_id("rq-moved").map(|r| r.index()), Some(1));
    shared.replace(reloaded);
    clock.advance(Duration::from_secs(59));
    send().await.unwrap();
    assert_eq!(count(), Some(2));
    assert_eq!(log.lines_with("rq-moved").len(), 1);
    clock.advance(Duration::from_secs(1));
    send().await.unwrap();
    assert_eq!(count(), Some(3));
    assert_eq!(log.lines_with("rq-moved").len(), 2);
}

/// A request from a trusted proxy that carries the forwarding header not read (here
/// `Forwarded`, where `X-Forwarded-For` is read, and the other way round) is a
/// `no_header` fallback, and its line says which one it carried and that
/// `client_ip_header` chooses the one read: it said the request carried no forwarding
/// header at all, which an operator whose proxy writes `Forwarded` reads as false.
#[cfg(feature = "proxy")]
#[tokio::test(flavor = "current_thread")]
async fn a_no_header_line_says_the_request_carried_the_other_header() {
    let (log, _guard) = captured::Captured::on_this_thread();
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    for (name, read, other) in [
        (
            "rq-other-xff",
            ClientIpHeader::XForwardedFor,
            ("forwarded", "for=203.0.113.1"),
        ),
        (
            "rq-other-fwd",
            ClientIpHeader::Forwarded,
            ("x-forwarded-for", "203.0.113.1"),
        ),
    ] {
        let config = order_per_client(name);
        let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
        let l = AdmissionLayer::with_engine(SharedEngine::new(engine), clock.clone())
            .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()])
            .client_ip_header(read)
            .build();
        let mut req = post_order();
        req.headers_mut()
            .insert(other.0, http::HeaderValue::from_static(other.1));
        req.extensions_mut()
            .insert(PeerAddr("10.0.0.1:4242".parse().unwrap()));
        app(l, Arc::new(AtomicU64::new(0)))
            .oneshot(req)
            .await
            .unwrap();
        let lines = log.lines_with(name);
        assert_eq!(lines.len(), 1, "{lines:?}");
        for part in [
            "no_header",
            &format!("header=\"{}\"", read.as_str()),
            &format!("carried=\"{}\"", other.0),
            "client_ip_header",
        ] {
            assert!(lines[0].contains(part), "{part}: {lines:?}");
        }
    }
}

/// A route's fallback series follow its name, whichever engine a request loads: two
/// engines put in force in turn, the route at another place in each, count on in one
/// series and say it once in the minute; renamed, it counts from 1 under its new name
/// and says that at once, its old series left as it was; rebuilt under its name (a
/// new algorithm: a new `RouteId` at the same place), it counts on and says nothing
/// more within the minute.
#[cfg(feature = "proxy")]
#[tokio::test(flavor = "current_thread")]
async fn a_routes_fallbacks_follow_its_name_through_engines_in_turn_and_renames() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _recorder = metrics::set_default_local_recorder(&recorder);
    let (log, _guard) = captured::Captured::on_this_thread();
    let config = order_per_client("rq-turns");
    let (clock, shared, app) = behind_trusted_proxies(&config);
    let send = || app.clone().oneshot(from_a_trusted_proxy());
    let count = |name: &str| fallbacks(&handle, name, "no_header");
    let said = |name: &str| log.lines_with(&format!("route=\"{name}\"")).len();
    send().await.unwrap();
    let first = shared.load();
    let mut moved = config.clone();
    moved
        .routes
        .insert(0, route("first", RouteMatch::prefix("/first"), 1.0));
    let second = Arc::new(
        first
            .reload(&moved, clock.now(), SystemTime::UNIX_EPOCH)
            .unwrap(),
    );
    assert_eq!(second.route_id("rq-turns").map(|r| r.index()), Some(1));
    for turn in 0..6 {
        let engine = [&second, &first][turn % 2];
        shared.replace(Arc::clone(engine));
        send().await.unwrap();
    }
    assert_eq!(count("rq-turns"), Some(7));
    assert_eq!(said("rq-turns"), 1);

    let mut renamed = config.clone();
    renamed.routes[0].name = "rq-renamed".into();
    let engine = shared.load();
    let reloaded = engine
        .reload(&renamed, clock.now(), SystemTime::UNIX_EPOCH)
        .unwrap();
    shared.replace(reloaded);
    send().await.unwrap();
    assert_eq!((count("rq-turns"), count("rq-renamed")), (Some(7), Some(1)));
    assert_eq!((said("rq-turns"), said("rq-renamed")), (1, 1));

    let mut rebuilt = renamed.clone();
    rebuilt.routes[0].algorithm = Algorithm::FixedWindow {
        window: Duration::from_secs(1),
    };
    let engine = shared.load();
    let reloaded = engine
        .reload(&rebuilt, clock.now(), SystemTime::UNIX_EPOCH)
        .unwrap();
    let (before, after) = (
        engine.route_id("rq-renamed"),
        reloaded.route_id("rq-renamed"),
    );
    assert_ne!(before, after);
    assert_eq!(after.map(|r| r.index()), Some(0));
    shared.replace(reloaded);
    send().await.unwrap();
    assert_eq!(count("rq-renamed"), Some(2));
    assert_eq!(said("rq-renamed"), 1);
}

/// Fallbacks on threads of their own, while one of them reloads the engine over and
/// over (moving the route each time, so that each reload's first fallbacks make the
/// route's entry again, on several threads at once), are every one counted, in one
/// series, and said a few times at most in the minute, never a line a request.
#[cfg(feature = "proxy")]
#[test]
fn fallbacks_on_many_threads_through_reloads_are_all_counted_and_said_a_few_times() {
    use tower::Service as _;
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // Registers the capture's second dispatcher, so that every thread's callsites ask.
    drop(captured::Captured::on_this_thread());
    let log = captured::Captured::default();
    let writer = log.clone();
    let dispatch = tracing::Dispatch::new(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish(),
    );
    let config = order_per_client("rq-threads");
    let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
    let shared =
        SharedEngine::new(Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap());
    let l = AdmissionLayer::with_engine(shared.clone(), clock.clone())
        .trusted_proxies(vec!["10.0.0.0/8".parse().unwrap()])
        .build();
    let app = app(l, Arc::new(AtomicU64::new(0)));
    let (threads, each, reload_every) = (4, 500, 25);
    let reloads = each / reload_every;
    std::thread::scope(|s| {
        for thread in 0..threads {
            let (mut app, recorder, dispatch) = (app.clone(), &recorder, &dispatch);
            let (shared, config, clock) = (&shared, &config, &clock);
            s.spawn(move || {
                let _recorder = metrics::set_default_local_recorder(recorder);
                let _log = tracing::dispatcher::set_default(dispatch);
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for n in 0..each {
                    if thread == 0 && n % reload_every == 0 {
                        let mut moved = config.clone();
                        for k in 0..n / reload_every % 3 {
                            let path = format!("/before-{k}");
                            let r = route(&format!("before-{k}"), RouteMatch::prefix(&path), 1.0);
                            moved.routes.insert(0, r);
                        }
                        let engine = shared.load();
                        let reloaded = engine
                            .reload(&moved, clock.now(), SystemTime::UNIX_EPOCH)
                            .unwrap();
                        shared.replace(reloaded);
                    }
                    let mut req = post_order();
                    req.extensions_mut()
                        .insert(PeerAddr("10.0.0.1:4242".parse().unwrap()));
                    runtime.block_on(app.call(req)).unwrap();
                }
            });
        }
    });
    let counted = fallbacks(&handle, "rq-threads", "no_header");
    assert_eq!(counted, u64::try_from(threads * each).ok());
    let said = log.lines_with("rq-threads").len();
    assert!(
        (1..=threads * (reloads + 1)).contains(&said),
        "{said} lines for {} fallbacks",
        threads * each
    );
}
