//! The server `scripts/bench-http.sh` drives: an axum hello world, bare or behind an
//! admission layer (rocgate's or tower_governor's), on one core.
//!
//! ```text
//! cargo run --release --example bench_server --features http -- MODE ADDR
//! ```
//!
//! MODE is one of:
//!
//! | mode | layer | quota |
//! |---|---|---|
//! | `bare` | none | — |
//! | `noop-layer` | a layer that adds nothing (`layer_fn(\|s\| s)`): what any axum `Router::layer` costs | — |
//! | `rocgate-admit` | `AdmissionLayer`, token bucket | 10,000,000 req/s, burst 10,000,000 |
//! | `rocgate-reject` | `AdmissionLayer`, token bucket | 1 req/s, burst 1 |
//! | `rocgate-admit-outside` | `AdmissionLayer` around the whole `Router` | as `rocgate-admit` |
//! | `rocgate-reject-outside` | `AdmissionLayer` around the whole `Router` | as `rocgate-reject` |
//! | `governor-admit` | `tower_governor::GovernorLayer`, one global key | 10,000,000 req/s, burst 10,000,000 |
//! | `governor-reject` | `tower_governor::GovernorLayer`, one global key | 1 req/s, burst 1 |
//!
//! The first four layered modes add the layer with `Router::layer`, which runs it after
//! routing and wraps each route in one more boxed service, cloned per request, whatever
//! the layer (the `noop-layer` floor). The `-outside` modes wrap the `Router` instead
//! (`AdmissionLayer::layer(router)`, as with `ServiceBuilder`): rocgate matches routes
//! itself, so it can decide before routing, and a rejected request never reaches the
//! router.
//!
//! The quotas are the same for both layers: a rate and a bucket of one second of it.
//! rocgate's cut limit equals its base limit, so the ROC controller, which still runs at
//! every slot rollover, never changes the quota. tower_governor limits one global key
//! (`GlobalKeyExtractor`), the counterpart of a rocgate route without partition.
//!
//! ADDR is where to listen (`127.0.0.1:0` picks a free port). The server prints one line,
//! `listening on http://ADDR`, once it accepts connections, and then runs until killed.
//! It runs on a current-thread tokio runtime, so it uses one core; nothing is logged
//! per request.

use axum::extract::Request;
use axum::response::Response;
use axum::routing::get;
use axum::{Router, ServiceExt as _};
use rocgate::config::{Config, RouteConfig, RouteMatch};
use rocgate::http::AdmissionLayer;
use rocgate::limiter::Algorithm;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;
use tower::Layer as _;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::GlobalKeyExtractor;
use tower_governor::GovernorLayer;

/// A quota both layers enforce: `rate_rps` per second, a bucket of one second of it.
#[derive(Clone, Copy)]
struct Quota {
    rate_rps: u32,
}

/// High enough that nothing is rejected at any rate one core can serve.
const ADMIT: Quota = Quota {
    rate_rps: 2_000_000,
};
/// Low enough that all but about one request per second is rejected.
const REJECT: Quota = Quota { rate_rps: 1 };

const MODES: [&str; 8] = [
    "bare",
    "noop-layer",
    "rocgate-admit",
    "rocgate-reject",
    "rocgate-admit-outside",
    "rocgate-reject-outside",
    "governor-admit",
    "governor-reject",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, addr) = match args.as_slice() {
        [mode, addr] if MODES.contains(&mode.as_str()) => match addr.parse::<SocketAddr>() {
            Ok(addr) => (mode.as_str(), addr),
            Err(e) => return usage(&format!("bad address {addr:?}: {e}")),
        },
        _ => return usage("expected MODE ADDR"),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let served = match mode {
        "rocgate-admit-outside" => runtime.block_on(serve(rocgate(ADMIT).layer(hello()), addr)),
        "rocgate-reject-outside" => runtime.block_on(serve(rocgate(REJECT).layer(hello()), addr)),
        _ => runtime.block_on(serve(app(mode), addr)),
    };
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot serve on {addr}: {e}")),
    }
}

fn hello() -> Router {
    Router::new().route("/", get(|| async { "Hello, World!" }))
}

/// The router of `mode`, with the layer added by `Router::layer`.
fn app(mode: &str) -> Router {
    let hello = hello();
    match mode {
        // Router::layer wraps the route in its own boxed service even when the layer
        // returns it unchanged: the floor every layer below pays.
        "noop-layer" => hello.layer(tower::layer::layer_fn(|inner| inner)),
        "rocgate-admit" => hello.layer(rocgate(ADMIT)),
        "rocgate-reject" => hello.layer(rocgate(REJECT)),
        "governor-admit" => hello.layer(governor(ADMIT)),
        "governor-reject" => hello.layer(governor(REJECT)),
        _ => hello,
    }
}

/// rocgate on one route taking every request: base = cut = the quota, a token bucket
/// of one second.
fn rocgate(quota: Quota) -> AdmissionLayer {
    let mut route = RouteConfig::new("hello", RouteMatch::any());
    route.controller.base_limit_rps = f64::from(quota.rate_rps);
    route.controller.cut_limit_rps = f64::from(quota.rate_rps);
    route.algorithm = Algorithm::TokenBucket {
        burst: Duration::from_secs(1),
    };
    AdmissionLayer::from_config(&Config::new(vec![route])).expect("a valid route")
}

/// tower_governor with one global key: one cell every 1/quota s, a burst of one second.
fn governor(
    quota: Quota,
) -> GovernorLayer<GlobalKeyExtractor, governor::middleware::NoOpMiddleware, axum::body::Body> {
    let config = GovernorConfigBuilder::default()
        .key_extractor(GlobalKeyExtractor)
        .period(Duration::from_secs(1) / quota.rate_rps)
        .burst_size(quota.rate_rps)
        .finish()
        .expect("period and burst are non-zero");
    GovernorLayer::new(config)
}

/// Serves `app`: a `Router`, or any service of axum requests (a `Router` wrapped in a
/// layer) made into one with `axum::ServiceExt::into_make_service`.
async fn serve<S>(app: S, addr: SocketAddr) -> std::io::Result<()>
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send,
{
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app.into_make_service()).await
}

fn usage(problem: &str) -> ExitCode {
    fail(&format!(
        "{problem}\nusage: bench_server MODE ADDR   (MODE: {})",
        MODES.join(", ")
    ))
}

fn fail(message: &str) -> ExitCode {
    eprintln!("bench_server: {message}");
    ExitCode::FAILURE
}
