//! HTTP adapters: rocgate as a tower [`Layer`](tower::Layer) inside an axum or tower
//! service.
//!
//! [`AdmissionLayer`] wraps any `Service<Request<B>> + Clone`. Admission is decided in
//! `call` (one clock read and [`Engine::check`](crate::engine::Engine::check));
//! `poll_ready` is always ready, so a rejection never waits for the inner service. An
//! admitted request readies the inner service itself: it calls it at once if it is
//! ready, else (or after a leaky-bucket pacing or concurrency-queue wait) takes it
//! along, leaving a clone for the next request, and polls it to readiness before
//! calling it. A rejection is a response (429 by default) with `Retry-After`,
//! `RateLimit-Policy`/`RateLimit` headers and a small JSON body, never an `Err`.
//! Every clone of the layer and of its services shares one engine, and a request one
//! of them admitted passes any other over that engine untouched (a request extension
//! marks it), so that stacked layers decide it once. A leaky-bucket
//! route's pacing sleeps on tokio's timer: outside a tokio runtime with time enabled,
//! a paced request's `call` panics (giving its place in the bucket back). A
//! partitioned route's idle keys are swept by the request that rolls its window,
//! unless a [`Sweeper`] ([`AdmissionLayer::spawn_sweeper`]) sweeps them on a thread
//! of its own.
//!
//! The wrapped service's response body is passed through untouched (no wrapper, so
//! axum does not box it again); a rejection's body is made with `From<Bytes>`, which
//! axum's `Body` and `http_body_util::Full<Bytes>` implement. For another body type,
//! map it first (`tower::ServiceBuilder::map_response_body`).
//!
//! ```
//! use axum::{routing::post, Router};
//! use rocgate::config::{Config, RouteConfig, RouteMatch};
//! use rocgate::http::AdmissionLayer;
//! use tower::ServiceExt;
//! # tokio_test_block_on(async {
//! let mut order = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
//! order.controller.base_limit_rps = 2.0; // a burst of 2, then 2 per second
//! order.controller.cut_limit_rps = 1.0; // after a cut (at most base_limit_rps)
//! // Routes written in code are checked as a file's are when loaded.
//! let layer = AdmissionLayer::from_config(&Config::new(vec![order])).expect("valid routes");
//! let app = Router::new().route("/api/order", post(|| async { "ok" })).layer(layer);
//!
//! let post = || http::Request::post("/api/order").body(axum::body::Body::empty()).unwrap();
//! assert_eq!(app.clone().oneshot(post()).await.unwrap().status(), 200);
//! assert_eq!(app.clone().oneshot(post()).await.unwrap().status(), 200);
//! let rejected = app.oneshot(post()).await.unwrap();
//! assert_eq!(rejected.status(), 429);
//! assert_eq!(rejected.headers()["retry-after"], "1");
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
//! # }
//! ```

pub(crate) mod client_ip;
mod decided;
mod future;
mod layer;
pub mod rejection;
mod service;
mod sweeper;

pub use client_ip::{ClientIpResolver, EndedAt, Fallback, PeerAddr};
#[cfg(feature = "proxy")]
pub(crate) use future::HoldUntilEnd;
pub use future::{hold_permit_through_body, HeldPermit, ResponseFuture};
pub use layer::{
    AdmissionLayer, AdmissionLayerBuilder, MatchedRoute, RouteKey, SharedEngine, UPKEEP_EVERY,
};
pub use service::AdmissionService;
#[cfg(feature = "proxy")]
pub(crate) use service::RouteSlot;
pub use sweeper::{Sweeper, SWEEP_EVERY};
