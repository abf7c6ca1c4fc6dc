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
//! | `governor-admit` | `tower_governor::GovernorLayer`, one global key | 10,000,000 req/s, burst 10,000,000 |
//! | `governor-reject` | `tower_governor::GovernorLayer`, one global key | 1 req/s, burst 1 |
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

use axum::routing::get;
use axum::Router;
use rocgate::config::{Config, RouteConfig, RouteMatch};
use rocgate::http::AdmissionLayer;
use rocgate::limiter::Algorithm;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;
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
    rate_rps: 10_000_000,
};
/// Low enough that all but about one request per second is rejected.
const REJECT: Quota = Quota { rate_rps: 1 };

const MODES: [&str; 6] = [
    "bare",
    "noop-layer",
    "rocgate-admit",
    "rocgate-reject",
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
    let app = app(mode);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(serve(app, addr)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot serve on {addr}: {e}")),
    }
}

fn app(mode: &str) -> Router {
    let hello = Router::new().route("/", get(|| async { "Hello, World!" }));
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
    AdmissionLayer::from_config(&Config::new(vec![route]))
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

async fn serve(app: Router, addr: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await
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
