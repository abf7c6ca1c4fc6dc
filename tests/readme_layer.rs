//! README's "As a tower/axum layer" code, compiled and run: every ```rust block of
//! README.md appears verbatim in this file, inside a test that runs it, so that an
//! API change that breaks a README example breaks this build. Also README's links to
//! its own headings and to benches/README.md's, which a renamed heading breaks, and
//! the axum version its layer section names, which an axum upgrade makes stale.
#![cfg(feature = "http")]

use axum::routing::post;
use rocgate::config::Config;
use rocgate::http::{AdmissionLayer, RouteKey};
use std::error::Error;
use tower::ServiceExt as _;

async fn order() -> &'static str {
    "ordered"
}

/// README's first example (kept as README writes it, so not reformatted).
#[rustfmt::skip]
fn inside_the_router() -> Result<axum::Router, Box<dyn Error>> {
    // README.md, "As a tower/axum layer":
    let config = Config::load("config/rocgate.toml".as_ref())?;
    let layer = AdmissionLayer::builder(&config)?.route_key(RouteKey::MatchedPath).build();
    // Every 5 s: ends a silent route's cut, places scheduled events, lets idle keys go.
    layer.spawn_upkeep()?;
    let app = axum::Router::new()
        .route("/api/order", axum::routing::post(order))
        .layer(layer);
    // (end of README's code)
    Ok(app)
}

/// README: the layer inside the router, from the default config file.
#[tokio::test]
async fn the_layer_inside_the_router() -> Result<(), Box<dyn Error>> {
    let app = inside_the_router()?;
    let post = || {
        http::Request::post("/api/order")
            .body(axum::body::Body::empty())
            .expect("a request")
    };
    let response = app.oneshot(post()).await?;
    assert_eq!(response.status(), 200);
    Ok(())
}

/// README's second example, over a real socket on 127.0.0.1.
async fn serve_around_the_router(
    config: Config,
    router: axum::Router,
    listener: tokio::net::TcpListener,
) -> Result<(), Box<dyn Error + Send + Sync>> {
    // README.md, "Where to put it":
    use axum::{extract::Request, ServiceExt};
    use tower::Layer as _;

    let app = AdmissionLayer::from_config(&config)?.layer(router);
    axum::serve(listener, ServiceExt::<Request>::into_make_service(app)).await?;
    // (end of README's code)
    Ok(())
}

#[tokio::test]
async fn the_layer_around_the_router() -> Result<(), Box<dyn Error>> {
    let config = Config::from_toml_str(
        r#"
        [[routes]]
        name = "readme_order"
        method = "POST"
        path = "/api/order"
        base_limit = 1
        cut_limit = 1
        "#,
        "inline",
    )?;
    let router = axum::Router::new().route("/api/order", post(order));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(serve_around_the_router(config, router, listener));
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut send, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let request = http::Request::post("/api/order")
            .header("host", "127.0.0.1")
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        statuses.push(send.send_request(request).await?.status().as_u16());
    }
    assert_eq!(statuses, [200, 429], "a burst of 1, then the limit");
    drop(send);
    let _ = connection.await;
    server.abort();
    Ok(())
}

/// README's recorder for a layer's metrics: `rocgate_roc_observed` is a histogram
/// (with the exporter's defaults it is a summary, with no `_bucket` series for the
/// dashboard's "Observed ROC" panel).
/// README's dependency line for the layer names the axum it is built for, the major
/// version of rocgate's own `axum` dependency: it named rocgate alone, and a
/// newcomer's `cargo add axum` of another major version takes no rocgate layer.
#[test]
fn the_readme_names_the_axum_the_layer_is_built_for() {
    let manifest = include_str!("../Cargo.toml");
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("axum = { version = \""))
        .and_then(|rest| rest.split('"').next())
        .expect("Cargo.toml depends on axum");
    let readme = include_str!("../README.md");
    let section = readme
        .split_once("### As a tower/axum layer\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(before_code, _)| before_code.replace('\n', " "))
        .expect("README's layer section");
    assert!(
        section.contains(&format!("`axum = \"{version}\"`")),
        "README's layer section does not name axum {version} beside rocgate: {section}"
    );
}

#[cfg(feature = "proxy")]
#[test]
fn the_roc_histogram_has_its_buckets() -> Result<(), Box<dyn Error>> {
    use rocgate::clock::Nanos;
    use rocgate::config::{RouteConfig, RouteMatch};
    use rocgate::engine::{Engine, Key};
    // README.md, "Metrics and dashboards":
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    use rocgate::metrics::{ROC_BUCKETS, ROC_OBSERVED};

    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(ROC_OBSERVED.into()), &ROC_BUCKETS)?
        .install_recorder()?;
    // (end of README's code)
    let mut route = RouteConfig::new("r", RouteMatch::any());
    route.window = rocgate::window::WindowSpec::new(
        std::time::Duration::from_secs(2),
        std::time::Duration::from_millis(100),
    )?;
    let engine = Engine::new(
        &Config::new(vec![route]),
        Nanos::ZERO,
        std::time::UNIX_EPOCH,
    )?
    .with_sample_hook(rocgate::metrics::roc_sample_hook());
    let id = engine.route_id("r").ok_or("no route r")?;
    // 100 req/s for 10 s: 80 slots once the first window has armed the controller.
    for ms in (0..10_000u64).step_by(10) {
        let _ = engine.check(id, Key::None, Nanos::from_millis(ms));
    }
    let text = handle.render();
    assert!(
        text.contains("# TYPE rocgate_roc_observed histogram\n"),
        "{text}"
    );
    let count = text
        .lines()
        .find_map(|l| l.strip_prefix(r#"rocgate_roc_observed_count{route="r"} "#))
        .ok_or("no count")?;
    assert!(count.parse::<u64>()? >= 70, "{text}");
    Ok(())
}

/// Every ```rust block in README.md is code of this file.
#[test]
fn every_rust_block_in_the_readme_is_compiled_here() {
    let readme = include_str!("../README.md");
    let this = include_str!("readme_layer.rs");
    let mut blocks = 0;
    let mut rest = readme;
    while let Some(start) = rest.find("```rust") {
        let body = &rest[start..];
        let body = &body[body.find('\n').map_or(body.len(), |n| n + 1)..];
        let end = body.find("```").expect("a closed code block");
        for line in body[..end].lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                this.lines().any(|own| own.trim() == line.trim()),
                "README line not compiled by tests/readme_layer.rs: {line:?}"
            );
        }
        blocks += 1;
        rest = &body[end + 3..];
    }
    assert!(blocks >= 2, "found {blocks} rust blocks in README.md");
}

/// The anchors of `markdown`'s headings, as GitHub makes them: lower case, spaces to
/// `-`, punctuation but `-` and `_` dropped. Lines inside code blocks are no headings.
fn anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut anchors = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            let title = line.trim_start_matches('#').trim();
            anchors.push(
                title
                    .to_lowercase()
                    .chars()
                    .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect(),
            );
        }
    }
    anchors
}

/// Every `](#anchor)` and `](benches/README.md#anchor)` link of README.md names a
/// heading that exists.
#[test]
fn every_link_to_a_heading_finds_it() {
    let readme = include_str!("../README.md");
    let own = anchors(readme);
    let benches = anchors(include_str!("../benches/README.md"));
    let mut links = 0;
    for (at, _) in readme.match_indices("](") {
        let target = &readme[at + 2..];
        let target = &target[..target.find(')').expect("a closed link")];
        let (file, anchor) = match target.split_once('#') {
            Some(("", anchor)) => (&own, anchor),
            Some(("benches/README.md", anchor)) => (&benches, anchor),
            _ => continue,
        };
        assert!(
            file.iter().any(|a| a == anchor),
            "README links to {target}, which no heading makes"
        );
        links += 1;
    }
    assert!(links >= 10, "only {links} links to headings in README.md");
}
