//! rocgate inside an axum app: the flash-sale route is protected by the admission
//! layer, the rest of the app is untouched.
//!
//! ```text
//! cargo run --example axum_layer --features http
//! curl -X POST http://127.0.0.1:3000/api/order          # 200 until the limit, then 429
//! ```

use axum::routing::{get, post};
use axum::Router;
use rocgate::config::{Config, RouteConfig, RouteMatch};
use rocgate::http::{AdmissionLayer, RouteKey};

#[tokio::main]
async fn main() -> std::io::Result<()> {
    // Routes may come from a file (`Config::load`) or, as here, from code.
    let mut order = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
    order.controller.base_limit_rps = 50.0;
    order.controller.cut_limit_rps = 15.0;
    // Routes written in code are checked as a file's are when loaded: a route the
    // file would refuse is an error here, not a layer.
    let config = Config::new(vec![order]);
    let layer = AdmissionLayer::builder(&config)
        .map_err(std::io::Error::other)?
        // Match by the route template axum matched, never the raw path.
        .route_key(RouteKey::MatchedPath)
        .build();
    // Every 5 s: ends a silent route's cut, places scheduled events, lets idle keys go.
    layer.spawn_upkeep().map_err(std::io::Error::other)?;

    let app = Router::new()
        .route("/api/order", post(|| async { "ordered\n" }))
        .route("/", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await
}
