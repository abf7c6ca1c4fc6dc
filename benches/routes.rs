//! rocgate with hundreds of routes: what a request, a scrape, the admin API, a reload
//! and the hints timer cost as the route table grows. The table is a gateway's mix of
//! exact paths, templates and prefixes, method-restricted and not
//! (tests/common/routes.rs).
//!
//! Groups:
//!
//! - `route_lookup`: finding a request's route in tables of 10, 100 and 1,000 routes,
//!   for a request that the first route takes, one a middle route takes (`n / 2`), one
//!   the last takes, and one no route takes; and in a table of one catch-all route
//!   (`1/catch_all`, as examples/bench_server.rs has). `engine` is `Engine::route_for`;
//!   `linear` is the scan of every matcher in config order (first match wins) that
//!   the engine did before it indexed its routes, kept here to compare with.
//! - `layer_admit`: one admitted request through `AdmissionLayer` around a service
//!   that answers at once, for the request the last route takes and one no route
//!   takes, with 10 and 1,000 routes: what route lookup is of a whole request.
//! - `routes_1000`: with 1,000 routes, once each: loading and validating the config
//!   file's text (`Config::from_toml_str`), building the engine, reloading it with the
//!   same config, a hints timer tick (`Advisor::next_tick` and `tick_due`, as `serve`
//!   runs them), and over loopback a scrape of `/metrics`, a `GET /admin/routes` and
//!   a `GET /admin/hints` over the whole history the ticks filled (the sizes of the
//!   bodies are printed before they are measured), then
//!   `metrics_after_traffic`: a scrape once every route has its histograms, as it has
//!   after traffic (the ROC histogram, upstream durations answered 2xx and 4xx), and
//!   `metrics_after_traffic_gzip`, the same scrape as Prometheus asks for it, gzipped.
//! - `reload_keys`: a reload that rebuilds a route limited per client IP by
//!   `concurrency` (its queue changed), which hands each of its 1,000, 10,000 or
//!   100,000 keys over to the new route (the new engine's drop left out).
//!
//! Run with bounded times:
//! `cargo bench --bench routes -- --warm-up-time 1 --measurement-time 3`.

#[path = "../tests/common/routes.rs"]
mod routes;

use criterion::{BenchmarkId, Criterion};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rocgate::clock::Nanos;
use rocgate::config::{normalize_path, Config, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::engine::Engine;
use rocgate::engine::Key;
use rocgate::http::AdmissionLayer;
use rocgate::proxy::{Proxy, ProxySettings};
use std::convert::Infallible;
use std::hint::black_box;
use std::net::SocketAddr;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};
use tower::{Layer as _, Service as _, ServiceExt as _};

/// Table sizes measured.
const SIZES: [usize; 3] = [10, 100, 1_000];

fn engine(routes: Vec<RouteConfig>) -> Engine {
    Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// The first route in `matchers` that takes the request, by trying each in order.
fn linear(matchers: &[RouteMatch], method: &str, path: &str) -> Option<usize> {
    let path = normalize_path(path);
    matchers.iter().position(|m| m.matches(method, &path))
}

/// The cases measured in a table of `n`: name, request, and the index of the route
/// that takes it.
fn cases(n: usize) -> [(&'static str, (&'static str, String), Option<usize>); 4] {
    [
        ("first", routes::request(0), Some(0)),
        ("middle", routes::request(n / 2), Some(n / 2)),
        ("last", routes::request(n - 1), Some(n - 1)),
        ("none", routes::unmatched(n), None),
    ]
}

fn route_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("route_lookup");
    // One catch-all route, as examples/bench_server.rs has: what the layer's figures
    // against bare axum pay for the lookup.
    let any = vec![RouteConfig::new("any", RouteMatch::any())];
    let matchers = [RouteMatch::any()];
    let e = engine(any);
    g.bench_function("engine/1/catch_all", |b| {
        b.iter(|| e.route_for(black_box("GET"), black_box("/hello")))
    });
    g.bench_function("linear/1/catch_all", |b| {
        b.iter(|| linear(&matchers, black_box("GET"), black_box("/hello")))
    });
    for n in SIZES {
        let table = routes::table(n);
        let matchers: Vec<RouteMatch> = table.iter().map(|r| r.matcher.clone()).collect();
        let e = engine(table);
        for (case, (method, path), expected) in cases(n) {
            assert_eq!(e.route_for(method, &path).map(|r| r.index()), expected);
            assert_eq!(linear(&matchers, method, &path), expected);
            let id = format!("{n}/{case}");
            g.bench_function(BenchmarkId::new("engine", &id), |b| {
                b.iter(|| e.route_for(black_box(method), black_box(&path)))
            });
            g.bench_function(BenchmarkId::new("linear", &id), |b| {
                b.iter(|| linear(&matchers, black_box(method), black_box(&path)))
            });
        }
    }
    g.finish();
}

fn layer_admit(c: &mut Criterion) {
    let mut g = c.benchmark_group("layer_admit");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for n in [10, 1_000] {
        let mut table = routes::table(n);
        for r in &mut table {
            // Admits everything: the highest limit the config takes, far above the
            // rate one thread reaches here.
            r.controller.base_limit_rps = rocgate::limiter::MAX_SPACED_RATE;
            r.controller.cut_limit_rps = rocgate::limiter::MAX_SPACED_RATE;
            r.controller.danger_roc = f64::MAX;
        }
        let layer = AdmissionLayer::from_config(&Config::new(table)).unwrap();
        let svc = layer.layer(tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, Infallible>(http::Response::new(bytes::Bytes::new()))
        }));
        for (case, (method, path)) in [
            ("last", routes::request(n - 1)),
            ("none", routes::unmatched(n)),
        ] {
            let uri: http::Uri = path.parse().unwrap();
            let method: http::Method = method.parse().unwrap();
            g.bench_function(BenchmarkId::new(format!("{n}"), case), |b| {
                b.iter(|| {
                    let req = http::Request::builder()
                        .method(method.clone())
                        .uri(uri.clone())
                        .body(())
                        .unwrap();
                    let mut svc = svc.clone();
                    rt.block_on(async { svc.ready().await.unwrap().call(req).await.unwrap() })
                })
            });
        }
    }
    g.finish();
}

/// GETs `path` from `addr`; the body.
/// `GET path` (as a scraper would, accepting gzip, if the path ends in `?gzip`: the
/// query is dropped).
async fn get(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<bytes::Bytes>>,
    addr: SocketAddr,
    path: &str,
) -> bytes::Bytes {
    let (plain, gzip) = match path.strip_suffix("?gzip") {
        Some(plain) => (plain, true),
        None => (path, false),
    };
    let mut req = http::Request::get(format!("http://{addr}{plain}"));
    if gzip {
        req = req.header("accept-encoding", "gzip");
    }
    let res = client
        .request(req.body(Full::default()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "GET {path}");
    res.into_body().collect().await.unwrap().to_bytes()
}

fn at_1000(c: &mut Criterion) {
    const N: usize = 1_000;
    let mut g = c.benchmark_group("routes_1000");
    g.sample_size(20);
    let text = routes::toml(N);
    g.bench_function("config_load", |b| {
        b.iter(|| Config::from_toml_str(black_box(&text), "bench").unwrap())
    });
    let config = Config::from_toml_str(&text, "bench").unwrap();
    assert_eq!(config.routes.len(), N);
    g.bench_function("engine_new", |b| {
        b.iter(|| Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap())
    });
    let built = Engine::new(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
    g.bench_function("engine_reload", |b| {
        b.iter(|| {
            built
                .reload(&config, Nanos::ZERO, SystemTime::UNIX_EPOCH)
                .unwrap()
        })
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let proxy = rt.block_on(async {
        let mut settings = ProxySettings::from_server(
            &rocgate::config::ServerConfig::default(),
            "http://127.0.0.1:9".parse().unwrap(),
        );
        settings.listen = "127.0.0.1:0".parse().unwrap();
        settings.admin_listen = "127.0.0.1:0".parse().unwrap();
        Proxy::bind(settings, &config, None).await.unwrap()
    });
    let admin = proxy.admin_addr().unwrap();
    let advisor = proxy.advisor();
    let reloader = proxy.reloader().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = rt.spawn(proxy.run(async {
        let _ = stopped.await;
    }));

    let engine = reloader.engine();
    let mut now = reloader.clock().now();
    advisor.tick(&engine, now);
    g.bench_function("hints_tick", |b| {
        b.iter(|| {
            // A second later each time: every route's interval is due in turn.
            now = now + Duration::from_secs(1);
            let due = advisor.next_tick(&engine, now);
            advisor.tick_due(&engine, now);
            due
        })
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut scrape = |name: &str, path: &'static str| {
        let body = rt.block_on(get(&client, admin, path));
        let lines = body.iter().filter(|&&b| b == b'\n').count();
        eprintln!(
            "{name}: GET {path} with {N} routes: {} bytes, {lines} lines",
            body.len()
        );
        g.bench_function(name, |b| b.iter(|| rt.block_on(get(&client, admin, path))));
    };
    scrape("metrics", "/metrics");
    scrape("admin_routes", "/admin/routes");
    // The whole history the hints keep (`keep`, 1 h of 10 s intervals) once the
    // ticks above have filled it: their times ran ahead of the proxy's clock, so the
    // hour before now covers all of it.
    scrape("admin_hints", "/admin/hints?period=1h");
    // Every route as it is once it has had traffic: its ROC histogram (recorded once
    // a slot, from the end of its first window) and its upstream durations, answered
    // 2xx and 4xx, recorded as the proxy records them.
    for r in &config.routes {
        let route = r.name.clone();
        metrics::histogram!(rocgate::metrics::ROC_OBSERVED, "route" => route.clone()).record(0.0);
        for class in ["2xx", "4xx"] {
            let labels = [("route", route.clone()), ("status_class", class.to_owned())];
            metrics::histogram!(rocgate::metrics::UPSTREAM_DURATION, &labels).record(0.004);
        }
    }
    scrape("metrics_after_traffic", "/metrics");
    scrape("metrics_after_traffic_gzip", "/metrics?gzip");
    g.finish();
    let _ = stop.send(());
    rt.block_on(task).unwrap().unwrap();
}

/// Keys of a partitioned `concurrency` route handed over by a reload.
const KEY_COUNTS: [u32; 3] = [1_000, 10_000, 100_000];

/// A route limited per client IP by `concurrency`, with room for `keys` keys and
/// `queue` queued requests per key.
fn per_ip_concurrency(keys: u32, queue: u32) -> Config {
    let mut r = RouteConfig::new("keyed", RouteMatch::any());
    r.algorithm = rocgate::limiter::Algorithm::Concurrency { queue };
    r.partition = Partition::ClientIp({
        let mut limits = KeyLimits::default();
        limits.max_keys = keys as usize;
        limits
    });
    Config::new(vec![r])
}

/// A reload that rebuilds a partitioned `concurrency` route (its queue changed) and so
/// hands every key over to the new route, for tables of 1,000 to 100,000 keys at rest.
fn reload_keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("reload_keys");
    g.sample_size(10);
    for keys in KEY_COUNTS {
        let built = Engine::new(
            &per_ip_concurrency(keys, 0),
            Nanos::ZERO,
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        let route = built.route_id("keyed").unwrap();
        for k in 0..keys {
            let ip = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + k));
            assert!(built.check(route, Key::Ip(ip), Nanos::ZERO).is_admit());
        }
        let rebuilt = per_ip_concurrency(keys, 1);
        g.bench_function(BenchmarkId::from_parameter(keys), |b| {
            // The old engine's drop, as a reload's, is left out.
            b.iter_with_large_drop(|| {
                built
                    .reload(&rebuilt, Nanos::ZERO, SystemTime::UNIX_EPOCH)
                    .unwrap()
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    route_lookup(&mut c);
    layer_admit(&mut c);
    at_1000(&mut c);
    reload_keys(&mut c);
    c.final_summary();
}
