//! rocgate's metrics as a real Prometheus sees them: every query of the dashboard
//! returns data after a spike, the alert rules load and evaluate and every series they
//! read is scraped, and a scrape passes `promtool check metrics`.
//!
//! Needs the `prometheus` and `promtool` binaries (Debian's `prometheus` package,
//! which `scripts/test.sh` installs), and with the `redis` feature `redis-server` (for
//! a distributed route, whose series only a Redis store has). The test starts
//! everything itself on loopback ports it picks, and stops it.
#![cfg(feature = "proxy")]

use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rocgate::config::{Config, RouteConfig, RouteMatch};
use rocgate::proxy::{Proxy, ProxySettings};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[path = "common/promql.rs"]
mod promql;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<bytes::Bytes>>;

/// A child process killed (by its PID) when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn which(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: scripts/test.sh installs it (Debian's prometheus and redis-server packages)"
            )
        })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn get_text(client: &HttpClient, url: &str) -> (u16, String) {
    let req = http::Request::get(url).body(Full::default()).unwrap();
    match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await {
        Ok(Ok(res)) => {
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
        _ => (0, String::new()),
    }
}

/// An instant query's result vector.
async fn query(client: &HttpClient, prom: SocketAddr, q: &str) -> Vec<Value> {
    let (status, body) = get_text(
        client,
        &format!("http://{prom}/api/v1/query?query={}", encode(q)),
    )
    .await;
    assert_eq!(status, 200, "query {q}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "success", "query {q}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Every query of a dashboard, with Grafana's variables given values. Template
/// variable queries (`label_values(metric, label)`) become their metric selector.
fn dashboard_queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for a in dashboard["annotations"]["list"].as_array().unwrap() {
        if let Some(expr) = a["expr"].as_str() {
            out.push(expr.to_owned());
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map(|(selector, _)| selector.to_owned())
                .unwrap_or_else(|| panic!("unexpected variable query {q}"));
            out.push(inner);
        }
    }
    out.into_iter()
        .map(|q| {
            q.replace("$route", ".*")
                .replace("$instance", ".*")
                .replace("$__rate_interval", "15s")
        })
        .collect()
}

/// The vector selectors of a PromQL expression that read rocgate's metrics: each
/// metric name with its label matchers, if any.
fn selectors(expr: &str) -> Vec<String> {
    promql::rocgate_selectors(expr)
        .into_iter()
        .map(|(name, matchers)| match matchers {
            Some(matchers) => format!("{name}{{{matchers}}}"),
            None => name.to_owned(),
        })
        .collect()
}

/// The Grafana dashboard as shipped (`dashboards/rocgate.json`).
fn dashboard() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("dashboards/rocgate.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn selectors_are_found_in_expressions() {
    assert_eq!(
        selectors(
            r#"sum by (route) (rate(rocgate_requests_total{decision="rejected"}[5m])) == 0 and rocgate_roc"#
        ),
        [
            r#"rocgate_requests_total{decision="rejected"}"#,
            "rocgate_roc"
        ]
    );
}

async fn upstream() -> SocketAddr {
    let app = Router::new()
        .route(
            "/fail",
            get(|| async { (http::StatusCode::SERVICE_UNAVAILABLE, "overloaded") }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(2)).await;
                "late"
            }),
        )
        .fallback(|| async { "ok" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A route that cuts within seconds: a 2 s window, low thresholds, fast restore.
fn quick_route() -> RouteConfig {
    let mut r = RouteConfig::new("order", RouteMatch::prefix("/api/order"));
    r.window = rocgate::window::WindowSpec::new(Duration::from_secs(2), Duration::from_millis(100))
        .unwrap();
    let c = &mut r.controller;
    c.base_limit_rps = 200.0;
    c.cut_limit_rps = 20.0;
    c.danger_roc = 30.0;
    c.safe_roc = 10.0;
    c.min_rps = 5.0;
    c.min_samples = 5;
    c.hold = Duration::from_millis(500);
    c.restore_step_rps = 30.0;
    c.restore_interval = Duration::from_millis(500);
    c.min_dwell = Duration::from_millis(200);
    r
}

/// Sends `rate` requests per second to `path` for `secs`, without waiting for answers.
async fn drive(client: &HttpClient, addr: SocketAddr, path: &str, rate: u32, secs: f64) {
    let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    for _ in 0..(f64::from(rate) * secs) as u32 {
        every.tick().await;
        let client = client.clone();
        let url = format!("http://{addr}{path}");
        tokio::spawn(async move { get_text(&client, &url).await });
    }
}

/// Starts prometheus on a loopback port with the shipped alert rules, scraping and
/// evaluating every second, `scrape_configs` (YAML) its scrape jobs, and waits until it
/// is ready: the process (killed when dropped), its address, and its directory.
async fn start_prometheus(
    client: &HttpClient,
    scrape_configs: &str,
) -> (Process, SocketAddr, tempfile::TempDir) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let prom_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let prom_config = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n{scrape_configs}",
            root.join("dashboards/alerts.yml").display()
        ),
    )
    .unwrap();
    let prometheus = Process(
        Command::new(which("prometheus"))
            .arg(format!("--config.file={}", prom_config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus starts"),
    );
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while get_text(client, &format!("http://{prom_addr}/-/ready"))
            .await
            .0
            != 200
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(ready.is_ok(), "prometheus became ready");
    (prometheus, prom_addr, dir)
}

/// Every query of the dashboard returns data from a real Prometheus scraping a real
/// instance after a spike, and with the `redis` feature a second instance deciding a
/// distributed route on a real redis-server (the fleet's demand, and the shared ROC,
/// only such a route has); the alert rules load, evaluate and read only series a
/// scrape has; a scrape passes `promtool check metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let promtool = which("promtool");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    let up = upstream().await;
    let settings = || {
        let mut built = ProxySettings::from_server(
            &rocgate::config::ServerConfig::default(),
            format!("http://{up}").parse().unwrap(),
        );
        built.listen = "127.0.0.1:0".parse().unwrap();
        built.admin_listen = "127.0.0.1:0".parse().unwrap();
        built.header_read_timeout = Duration::from_secs(5);
        built.shutdown_grace = Duration::from_secs(1);
        built.forward.connect_timeout = Duration::from_secs(1);
        built.forward.response_timeout = Duration::from_millis(200);
        built.forward.max_body_bytes = 1024;
        built
    };
    // A route partitioned by ip, which no request takes: its forwarding fallbacks are
    // counted from 0.
    let mut per_ip = RouteConfig::new("per-ip", RouteMatch::prefix("/per-ip"));
    per_ip.partition = rocgate::config::Partition::ClientIp(Default::default());
    let config = Config::new(vec![
        quick_route(),
        per_ip,
        RouteConfig::new("rest", RouteMatch::any()),
    ]);
    let proxy = Proxy::bind(settings(), &config, None).await.unwrap();
    let (addr, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));

    // A distributed route, on a real redis-server, served by an instance of its own
    // (scraped too): only such a route has the fleet's demand.
    #[cfg(feature = "redis")]
    let fleet = Distributed::start(settings()).await;
    #[cfg(feature = "redis")]
    let targets = format!("\"{admin}\", \"{}\"", fleet.admin);
    #[cfg(not(feature = "redis"))]
    let targets = format!("\"{admin}\"");

    let (_prometheus, prom_addr, _dir) = start_prometheus(
        &client,
        &format!(
            "scrape_configs:\n  - job_name: rocgate\n    static_configs:\n      - targets: [{targets}]\n"
        ),
    )
    .await;
    // Counters must be seen before the spike, or `increase` has nothing to compare.
    let scraped = tokio::time::timeout(Duration::from_secs(30), async {
        while query(&client, prom_addr, r#"rocgate_cuts_total{route="order"}"#)
            .await
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        scraped.is_ok(),
        "prometheus scraped rocgate before the spike"
    );

    #[cfg(feature = "redis")]
    let fleet_traffic = {
        let (client, addr) = (client.clone(), fleet.addr);
        tokio::spawn(async move { drive(&client, addr, "/api/fleet", 20, 60.0).await })
    };
    // Warm traffic past the first window, a spike, then steady traffic with some
    // upstream timeouts while the queries run.
    drive(&client, addr, "/api/order", 20, 3.0).await;
    drive(&client, addr, "/api/order", 300, 1.5).await;
    let background = {
        let client = client.clone();
        tokio::spawn(async move {
            for _ in 0..60 {
                drive(&client, addr, "/api/order", 20, 0.5).await;
                drive(&client, addr, "/slow", 2, 0.5).await;
                drive(&client, addr, "/fail", 4, 0.5).await;
            }
        })
    };
    let cut_seen = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if !query(
                &client,
                prom_addr,
                r#"rocgate_cuts_total{route="order"} > 0"#,
            )
            .await
            .is_empty()
                && !query(&client, prom_addr, "rocgate_upstream_errors_total > 0")
                    .await
                    .is_empty()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(
        cut_seen.is_ok(),
        "prometheus scraped the cut and an upstream error"
    );
    // A few more scrapes so that rates over 15 s have several points.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{} queries", queries.len());
    let mut empty = Vec::new();
    for q in &queries {
        // Only distributed routes (a Redis store) have the fleet's demand (promtool
        // evaluates its query in `the_demand_panel_shows_the_fleets_demand_once`).
        #[cfg(not(feature = "redis"))]
        if q.contains("rocgate_store_demand_rps") {
            continue;
        }
        if query(&client, prom_addr, q).await.is_empty() {
            empty.push(q.clone());
        }
    }
    assert!(
        empty.is_empty(),
        "queries without data:\n{}",
        empty.join("\n")
    );

    // The alert rules loaded and evaluate without errors.
    let (status, rules) = get_text(&client, &format!("http://{prom_addr}/api/v1/rules")).await;
    assert_eq!(status, 200);
    let rules: Value = serde_json::from_str(&rules).unwrap();
    let loaded: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(loaded.len(), 12);
    // Each rule evaluates, and every series it reads is there: a name, label or value
    // that no scrape has would leave the rule quiet for ever.
    let mut unread = Vec::new();
    for rule in loaded {
        assert_ne!(rule["health"], "err", "{rule}");
        let expr = rule["query"].as_str().unwrap();
        for selector in selectors(expr) {
            let selector = match selector.strip_prefix("rocgate_store_mode") {
                // Only a Redis store has the `fallback_local` mode; the local one's
                // series stands in, the value is the store's own.
                Some(labels) => {
                    #[cfg(feature = "redis")]
                    assert_eq!(
                        labels,
                        format!(
                            "{{mode=\"{}\"}}",
                            rocgate::store::redis::StoreMode::Fallback.as_str()
                        ),
                        "{expr}"
                    );
                    let _ = labels;
                    "rocgate_store_mode".to_owned()
                }
                // Only distributed routes (a Redis store) have it; the rules read it
                // by name, which `tests/metrics.rs` checks is exported.
                None if selector == "rocgate_store_limit_rps" => continue,
                // A distributed route's, at 0 from the start: scraped from the
                // instance on Redis with the feature, read by name without it.
                None if selector == rocgate::metrics::STORE_CARRIED && !cfg!(feature = "redis") => {
                    continue
                }
                None => selector,
            };
            if query(&client, prom_addr, &selector).await.is_empty() {
                unread.push(format!("{}: {selector}", rule["name"]));
            }
        }
    }
    assert!(
        unread.is_empty(),
        "alert rules reading series no scrape has:\n{}",
        unread.join("\n")
    );
    let checked = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(root.join("dashboards/alerts.yml"))
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stdout)
    );

    // A scrape passes promtool's exposition lint.
    let (_, scrape) = get_text(&client, &format!("http://{admin}/metrics")).await;
    let mut lint = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    lint.stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let lint = lint.wait_with_output().unwrap();
    assert!(
        lint.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&lint.stdout),
        String::from_utf8_lossy(&lint.stderr)
    );

    background.abort();
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), run).await;
    #[cfg(feature = "redis")]
    {
        fleet_traffic.abort();
        fleet.stop().await;
    }
}

/// `RocgateDown` as a real Prometheus evaluates it, scraping a real instance under the
/// job `gateway` (not `rocgate`) beside a job `edge` whose one target is no rocgate and
/// never answers: silent while the instance answers, pending for the instance (and,
/// rocgate's series gone, once without one) after it stops, never for `edge`'s target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_down_alert_fires_for_an_instance_stopped_under_a_job_of_any_name() {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut settings = ProxySettings::from_server(
        &rocgate::config::ServerConfig::default(),
        format!("http://{}", upstream().await).parse().unwrap(),
    );
    settings.listen = "127.0.0.1:0".parse().unwrap();
    settings.admin_listen = "127.0.0.1:0".parse().unwrap();
    settings.shutdown_grace = Duration::from_secs(1);
    let config = Config::new(vec![RouteConfig::new("rest", RouteMatch::any())]);
    let proxy = Proxy::bind(settings, &config, None).await.unwrap();
    let admin = proxy.admin_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    let nothing = format!("127.0.0.1:{}", free_port());
    let (_prometheus, prom_addr, _dir) = start_prometheus(
        &client,
        &format!(
            "scrape_configs:\n  \
             - job_name: gateway\n    static_configs:\n      - targets: [\"{admin}\"]\n  \
             - job_name: edge\n    static_configs:\n      - targets: [\"{nothing}\"]\n"
        ),
    )
    .await;
    let down = rule_expr("RocgateDown");
    // The (job, instance) of each alert, or each series of a query's result, in `v`.
    let named = |v: &[Value]| -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = v
            .iter()
            .map(|s| {
                let l = &s["labels"];
                let l = if l.is_null() { &s["metric"] } else { l };
                let text = |k: &str| l[k].as_str().unwrap_or_default().to_owned();
                (text("job"), text("instance"))
            })
            .collect();
        out.sort();
        out
    };
    let down_alerts = || async {
        let (status, body) = get_text(&client, &format!("http://{prom_addr}/api/v1/alerts")).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == "RocgateDown")
            .cloned()
            .collect::<Vec<_>>()
    };

    // Both jobs scraped, rocgate's series there: the rule says nothing.
    let scraped = tokio::time::timeout(Duration::from_secs(30), async {
        while query(&client, prom_addr, r#"rocgate_build_info{job="gateway"}"#)
            .await
            .is_empty()
            || query(&client, prom_addr, r#"up{job="edge"} == 0"#)
                .await
                .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(scraped.is_ok(), "prometheus scraped both jobs");
    assert_eq!(named(&query(&client, prom_addr, &down).await), []);
    // The alert pending since Prometheus's first evaluation, before its first scrape
    // (no rocgate series then), ended by an evaluation since: else it would be the one
    // seen after the stop, firing a minute after Prometheus started.
    let quiet = tokio::time::timeout(Duration::from_secs(30), async {
        while !down_alerts().await.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        quiet.is_ok(),
        "RocgateDown ended while the instance answered"
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), run).await;
    let gateway = ("gateway".to_owned(), admin.to_string());
    let expected = vec![(String::new(), String::new()), gateway];
    let pending = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let alerts = down_alerts().await;
            if named(&alerts) == expected {
                return alerts;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let Ok(alerts) = pending else {
        let seen = named(&query(&client, prom_addr, &down).await);
        panic!("RocgateDown names {seen:?} of the stopped instance, expected {expected:?}");
    };
    for alert in alerts {
        assert_eq!(alert["state"], "pending", "{alert}");
    }
}

/// A `rocgate serve` instance on a redis-server of its own, deciding the route
/// `fleet` (`/api/fleet`, otherwise [`quick_route`]) on the shared state.
#[cfg(feature = "redis")]
struct Distributed {
    addr: SocketAddr,
    admin: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    run: tokio::task::JoinHandle<std::io::Result<()>>,
    _redis: Process,
}

#[cfg(feature = "redis")]
impl Distributed {
    /// Starts redis-server on a loopback port, waits until it takes connections, and
    /// serves `fleet` on it with `settings`.
    async fn start(settings: ProxySettings) -> Distributed {
        let port = free_port();
        let redis = Process(
            Command::new(which("redis-server"))
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server starts"),
        );
        let up = tokio::time::timeout(Duration::from_secs(10), async {
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(up.is_ok(), "redis-server took connections");
        let mut route = quick_route();
        route.name = "fleet".into();
        route.matcher = RouteMatch::prefix("/api/fleet");
        let mut store = rocgate::store::RedisConfig::default();
        store.servers = rocgate::store::RedisServers::Single(format!("redis://127.0.0.1:{port}"));
        store.key_prefix = "prometheus-fleet".into();
        store.timeout = Duration::from_secs(1);
        let mut config = Config::new(vec![route]);
        config.store = rocgate::store::StoreConfig::Redis(store);
        let proxy = Proxy::bind(settings, &config, None).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        Distributed {
            addr: proxy.local_addr().unwrap(),
            admin: proxy.admin_addr().unwrap(),
            stop,
            run: tokio::spawn(proxy.run(async {
                let _ = stopped.await;
            })),
            _redis: redis,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.run).await;
    }
}

/// The dashboard's request panel evaluated by promtool on a scrape of a shadow route:
/// its offered line counts each request once. (A shadow-rejected request is also an
/// admitted one: `rocgate_requests_total` counts it under both decisions.)
#[test]
fn the_dashboards_offered_line_counts_each_request_once() {
    use rocgate::clock::Nanos;
    use rocgate::config::Mode;
    use rocgate::engine::{Engine, Key};
    use std::fmt::Write as _;

    let mut route = RouteConfig::new("order", RouteMatch::any());
    route.mode = Mode::Shadow;
    route.controller.base_limit_rps = 10.0;
    route.controller.cut_limit_rps = 10.0;
    let engine = Engine::new(
        &Config::new(vec![route]),
        Nanos::ZERO,
        std::time::SystemTime::UNIX_EPOCH,
    )
    .unwrap();
    let id = engine.route_id("order").unwrap();
    // 120 requests in one second: all admitted, most of them over the limit.
    for i in 0..120u64 {
        assert!(engine
            .check(id, Key::None, Nanos::from_millis(i * 1000 / 120))
            .is_admit());
    }
    let now = Nanos::from_secs(1);
    let snapshot = engine.route_snapshot(id, now).unwrap();
    assert_eq!(snapshot.offered, 120);
    assert!(snapshot.shadow_rejected.iter().map(|(_, n)| n).sum::<u64>() > 100);

    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        rocgate::metrics::Collector::new().collect(&engine, now);
    });
    // Each counter as a series growing by its scraped value every minute: the panel's
    // rate is then that value per 60 s.
    let mut series = String::new();
    for line in handle.render().lines() {
        if let Some(rest) = line.strip_prefix("rocgate_requests_total{") {
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            let labels = labels.replace('\'', "''");
            writeln!(
                series,
                "      - series: 'rocgate_requests_total{{{labels}}}'\n        values: '0+{value}x10'"
            )
            .unwrap();
        }
    }
    let dashboard = dashboard();
    let offered = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .find(|t| t["legendFormat"] == "{{route}} offered")
        .expect("the offered line")["expr"]
        .as_str()
        .map(evaluable)
        .unwrap();
    test_exprs(
        &series,
        &expr_test(&offered, "10m", &[("{route=\"order\"}", "2")]),
    );
}

/// `RocgateRouteCutTooLong` fires on time spent in cut, which `max_cut` (60 s by
/// default) cannot hide by ending each cut: a route cut 45 s of every minute fires,
/// one cut of 60 s does not. promtool evaluates the rule's own expression.
#[test]
fn the_cut_too_long_alert_counts_time_in_cut_across_cuts() {
    let expr = rule_expr("RocgateRouteCutTooLong");
    test_exprs(
        "      \
         - series: 'rocgate_cut_seconds_total{instance=\"a\",route=\"cycling\"}'\n        \
         values: '0+45x15'\n      \
         - series: 'rocgate_cut_seconds_total{instance=\"a\",route=\"once\"}'\n        \
         values: '0 60 60 60 60 60 60 60 60 60 60 60 60 60 60 60'\n",
        &expr_test(
            &expr,
            "12m",
            &[("{instance=\"a\",route=\"cycling\"}", "450")],
        ),
    );
}

/// `RocgateRouteCutTooLong` and `RocgateControllerFlapping` judge each instance's own
/// controller alone, and a distributed route's one shared controller over the fleet:
/// each of its steps is counted by the instance that stored it, so each instance
/// holds a share of its cuts and transitions. Three instances each holding a third
/// of a distributed route's time in cut (and transitions) fire once, for the route;
/// two instances whose own controllers each stay under the bound do not; one over it
/// fires, naming the instance; another fleet's route of the same name (another job)
/// adds nothing. A count of state changes is given whole, about as many as `increase`
/// extrapolates (22.5 of the fleet's). promtool evaluates the rules file itself.
#[test]
fn the_cut_and_flapping_alerts_judge_a_distributed_route_over_the_fleet() {
    let mut series = String::new();
    let mut add_to = |job: &str, name: &str, instance: &str, route: &str, values: &str| {
        series.push_str(&format!(
            "      - series: '{name}{{instance=\"{instance}\",job=\"{job}\",pod=\"{job}-{instance}\",route=\"{route}\"}}'\n        values: '{values}'\n"
        ));
    };
    // Labels beside `instance` that tell instances apart (Kubernetes' pod) are not
    // taken for fleets of their own. Another fleet scraped by the same Prometheus, with
    // a distributed route of the same name: its cuts are its own.
    add_to(
        "staging",
        "rocgate_store_limit_rps",
        "d",
        "order",
        "60+0x20",
    );
    add_to(
        "staging",
        "rocgate_cut_seconds_total",
        "d",
        "order",
        "0+15x20",
    );
    let mut add = |name: &str, instance: &str, route: &str, values: &str| {
        add_to("rocgate", name, instance, route, values);
    };
    for instance in ["a", "b", "c"] {
        add("rocgate_store_limit_rps", instance, "order", "60+0x20");
        add("rocgate_cut_seconds_total", instance, "order", "0+15x20");
        add(
            "rocgate_controller_transitions_total",
            instance,
            "order",
            "0+0.5x20",
        );
    }
    for instance in ["a", "b"] {
        add("rocgate_cut_seconds_total", instance, "browse", "0+10x20");
        add(
            "rocgate_controller_transitions_total",
            instance,
            "browse",
            "0+0.5x20",
        );
    }
    add("rocgate_cut_seconds_total", "a", "cart", "0+30x20");
    add(
        "rocgate_controller_transitions_total",
        "a",
        "cart",
        "0+1x20",
    );
    let cut = "ROC has not stayed below safe_roc; check safe_roc and hold, or the traffic.";
    let flapping = "Thresholds too close to normal traffic's ROC: widen danger_roc - safe_roc or raise min_dwell.";
    test_alert_rules(
        &series,
        &[
            alert_test(
                "12m",
                "RocgateRouteCutTooLong",
                cut,
                &[
                    (
                        "severity: warning, route: order, job: rocgate",
                        "order was cut for 7m 30s of the last 10 minutes (shared by the fleet)",
                    ),
                    (
                        "severity: warning, route: cart, instance: a",
                        "cart was cut for 5m 0s of the last 10 minutes on a",
                    ),
                ],
            ),
            alert_test(
                "16m",
                "RocgateControllerFlapping",
                flapping,
                &[
                    (
                        "severity: warning, route: order, job: rocgate",
                        "order changed controller state about 22 times in 15 minutes (shared by the fleet)",
                    ),
                    (
                        "severity: warning, route: cart, instance: a",
                        "cart changed controller state about 15 times in 15 minutes on a",
                    ),
                ],
            ),
        ]
        .concat(),
    );
}

/// The dashboard's controller state timeline, over instances of which one is cut and
/// another recovering, reads the value its mappings name `cut` (the worst state: any
/// instance cut); with every instance normal, the value they name `normal`.
#[test]
fn the_state_timeline_shows_the_worst_state_over_instances() {
    let dashboard = dashboard();
    let panel = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "state-timeline")
        .expect("the state timeline");
    let expr = panel["targets"][0]["expr"].as_str().map(evaluable).unwrap();
    let mapped = |text: &str| -> String {
        panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
            .as_object()
            .unwrap()
            .iter()
            .find(|(_, m)| m["text"] == text)
            .unwrap_or_else(|| panic!("no mapping for {text}"))
            .0
            .clone()
    };
    let mut series = String::new();
    let states = [
        ("a", "order", [0, 1, 0]),
        ("b", "order", [0, 0, 1]),
        ("a", "cart", [1, 0, 0]),
        ("b", "cart", [1, 0, 0]),
    ];
    for (instance, route, values) in states {
        for (state, value) in ["normal", "cut", "recovering"].into_iter().zip(values) {
            series.push_str(&format!(
                "      - series: 'rocgate_controller_state{{instance=\"{instance}\",route=\"{route}\",state=\"{state}\"}}'\n        values: '{value}x5'\n"
            ));
        }
    }
    test_exprs(
        &series,
        &expr_test(
            &expr,
            "2m",
            &[
                ("{route=\"order\"}", &mapped("cut")),
                ("{route=\"cart\"}", &mapped("normal")),
            ],
        ),
    );
}

/// The dashboard's observed ROC quantiles of a route whose every slot read ROC 0 (an
/// idle or perfectly steady route) read about 0, not a negative ROC that no slot had:
/// `histogram_quantile` spreads a bucket's samples evenly from the bound below, so
/// zeros counted in a bucket reaching down to -0.25 read as -0.125 at the median.
#[test]
fn the_observed_roc_of_a_flat_route_reads_about_zero() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(rocgate::metrics::ROC_OBSERVED.into()),
            &rocgate::metrics::ROC_BUCKETS,
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for _ in 0..100 {
            metrics::histogram!(rocgate::metrics::ROC_OBSERVED, "route" => "flat").record(0.0);
        }
    });
    let mut series = String::new();
    for line in handle.render().lines() {
        if let Some(rest) = line.strip_prefix("rocgate_roc_observed_bucket{") {
            let (labels, value) = rest.rsplit_once("} ").unwrap();
            series.push_str(&format!(
                "      - series: 'rocgate_roc_observed_bucket{{{labels}}}'\n        values: '0+{value}x10'\n"
            ));
        }
    }
    let dashboard = dashboard();
    let quantiles: Vec<String> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .filter_map(|t| t["expr"].as_str())
        .filter(|e| e.contains("rocgate_roc_observed_bucket"))
        .map(evaluable)
        .collect();
    assert_eq!(quantiles.len(), 2, "p50 and p99");
    let mut tests = String::new();
    for q in &quantiles {
        tests.push_str(&expr_test(
            &format!("abs({q}) < bool 0.001"),
            "10m",
            &[("{route=\"flat\"}", "1")],
        ));
    }
    test_exprs(&series, &tests);
}

/// `RocgateClientConnectionLimitReached` fires on an instance whose cap was reached in
/// the last 5 minutes, not on one that reached it earlier; so does
/// `RocgateClientConnectionsRefused` on connections closed at the per-client cap.
/// promtool evaluates each rule's own expression.
#[test]
fn the_connection_alerts_fire_on_a_recent_hit_only() {
    for (alert, counter) in [
        (
            "RocgateClientConnectionLimitReached",
            "rocgate_client_connection_limit_reached_total",
        ),
        (
            "RocgateClientConnectionsRefused",
            "rocgate_client_connections_refused_total",
        ),
    ] {
        let expr = rule_expr(alert);
        let series = format!(
            "      \
             - series: '{counter}{{instance=\"recent\"}}'\n        \
             values: '0 0 0 0 0 0 0 0 2 2 2'\n      \
             - series: '{counter}{{instance=\"earlier\"}}'\n        \
             values: '0 3 3 3 3 3 3 3 3 3 3'\n"
        );
        test_exprs(
            &series,
            &expr_test(&expr, "10m", &[("{instance=\"recent\"}", "2")]),
        );
    }
}

/// `RocgateStoreControllerLost` fires on a route whose shared controller an instance
/// carried over in the last 10 minutes, once for the fleet, not on one carried over
/// earlier. promtool evaluates the rule's own expression.
#[test]
fn the_controller_lost_alert_fires_on_a_recent_carry_over_only() {
    let expr = rule_expr("RocgateStoreControllerLost");
    let series = "      \
         - series: 'rocgate_store_controllers_carried_total{instance=\"a\",route=\"order\"}'\n        \
         values: '0 0 0 0 0 0 0 0 1 1 1 1 1'\n      \
         - series: 'rocgate_store_controllers_carried_total{instance=\"b\",route=\"order\"}'\n        \
         values: '0 0 0 0 0 0 0 0 0 0 0 0 0'\n      \
         - series: 'rocgate_store_controllers_carried_total{instance=\"a\",route=\"cart\"}'\n        \
         values: '0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1'\n";
    test_exprs(
        series,
        &expr_test(&expr, "12m", &[("{route=\"order\"}", "1")]),
    );
    test_exprs(series, &expr_test(&expr, "20m", &[]));
}

/// The description of `RocgateDown`, as its every alert has it.
const DOWN_DESCRIPTION: &str = "The process is down, or its admin API unreachable, or no scrape job reaches it: every other rocgate alert is silent for this instance meanwhile. Check the process and its log (exit 2: a config refused at start; exit 1: a listener it could not open), GET /healthz on the admin address, and the scrape job's targets (README, When an alert fires).";

/// `RocgateDown` fires for an instance Prometheus has not scraped for a minute, whose
/// own series every other rule reads and so falls silent on (pending at its first
/// missed scrape), and not for one that answers or missed a single scrape: in the job
/// `rocgate`, and under a job of another name for an instance that exported rocgate's
/// series before, not for another target of that job that never did. Once for each:
/// an instance of the job `rocgate` that exported rocgate's series too, or one
/// upgraded (two versions of `rocgate_build_info` in the day), is named once.
#[test]
fn the_down_alert_fires_on_an_instance_not_scraped_for_a_minute() {
    let series = "      \
         - series: 'up{job=\"rocgate\",instance=\"down\"}'\n        \
         values: '1 1 0 0 0 0'\n      \
         - series: 'rocgate_build_info{job=\"rocgate\",instance=\"down\",version=\"1\"}'\n        \
         values: '1 1 stale'\n      \
         - series: 'up{job=\"rocgate\",instance=\"blip\"}'\n        \
         values: '1 1 0 1 1 1'\n      \
         - series: 'up{job=\"rocgate\",instance=\"up\"}'\n        \
         values: '1 1 1 1 1 1'\n      \
         - series: 'rocgate_build_info{job=\"rocgate\",instance=\"up\",version=\"1\"}'\n        \
         values: '1 1 1 1 1 1'\n      \
         - series: 'up{job=\"gateway\",instance=\"renamed\"}'\n        \
         values: '1 1 0 0 0 0'\n      \
         - series: 'rocgate_build_info{job=\"gateway\",instance=\"renamed\",version=\"1\"}'\n        \
         values: '1 stale'\n      \
         - series: 'rocgate_build_info{job=\"gateway\",instance=\"renamed\",version=\"2\"}'\n        \
         values: '_ 1 stale'\n      \
         - series: 'up{job=\"gateway\",instance=\"other\"}'\n        \
         values: '0 0 0 0 0 0'\n";
    let tests = alert_test(
        "5m",
        "RocgateDown",
        DOWN_DESCRIPTION,
        &[
            (
                "instance: down, job: rocgate, severity: critical",
                "rocgate on down has not answered Prometheus's scrape for a minute",
            ),
            (
                "instance: renamed, job: gateway, severity: critical",
                "rocgate on renamed has not answered Prometheus's scrape for a minute",
            ),
        ],
    ) + &alert_test("2m", "RocgateDown", DOWN_DESCRIPTION, &[]);
    test_alert_rules(series, &tests);
}

/// `RocgateDown`, under a job not named `rocgate`, holds for an instance down longer
/// than the day its `rocgate_build_info` is looked for over, until it answers again:
/// the instance still down at 26 hours is named, the one back at 25 hours no longer.
/// Another instance answers throughout, so Prometheus has rocgate series.
#[test]
fn the_down_alert_holds_for_an_instance_down_over_a_day() {
    let series = "      \
         - series: 'up{job=\"gateway\",instance=\"long\"}'\n        \
         values: '1 1 0x1600'\n      \
         - series: 'rocgate_build_info{job=\"gateway\",instance=\"long\",version=\"1\"}'\n        \
         values: '1 1 stale'\n      \
         - series: 'up{job=\"gateway\",instance=\"back\"}'\n        \
         values: '1 1 0x1500 1x100'\n      \
         - series: 'rocgate_build_info{job=\"gateway\",instance=\"back\",version=\"1\"}'\n        \
         values: '1 1 stale _x1499 1x100'\n      \
         - series: 'up{job=\"gateway\",instance=\"up\"}'\n        \
         values: '1x1700'\n      \
         - series: 'rocgate_build_info{job=\"gateway\",instance=\"up\",version=\"1\"}'\n        \
         values: '1x1700'\n";
    let summary = |instance: &str| {
        format!("rocgate on {instance} has not answered Prometheus's scrape for a minute")
    };
    let tests = alert_test(
        "25h",
        "RocgateDown",
        DOWN_DESCRIPTION,
        &[
            (
                "instance: long, job: gateway, severity: critical",
                &summary("long"),
            ),
            (
                "instance: back, job: gateway, severity: critical",
                &summary("back"),
            ),
        ],
    ) + &alert_test(
        "26h",
        "RocgateDown",
        DOWN_DESCRIPTION,
        &[(
            "instance: long, job: gateway, severity: critical",
            &summary("long"),
        )],
    );
    test_alert_rules(series, &tests);
}

/// `RocgateDown` fires, without an instance, when Prometheus has had no rocgate series
/// for a minute: a scrape job that reaches no instance (another target answers, under
/// a name that is not `rocgate`) is not silence.
#[test]
fn the_down_alert_fires_when_no_rocgate_series_is_scraped() {
    let series = "      \
         - series: 'up{job=\"gateway\",instance=\"elsewhere\"}'\n        \
         values: '1 1 1 1 1 1'\n";
    let tests = alert_test(
        "5m",
        "RocgateDown",
        DOWN_DESCRIPTION,
        &[(
            "severity: critical",
            "Prometheus has had no rocgate series (rocgate_build_info) for a minute",
        )],
    );
    test_alert_rules(series, &tests);
}

/// The expression of the alert rule `name` in `dashboards/alerts.yml`, on one line
/// (a block scalar's lines joined).
fn rule_expr(name: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = std::fs::read_to_string(root.join("dashboards/alerts.yml")).unwrap();
    let rest = rules
        .split(&format!("alert: {name}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no rule {name}"));
    let mut lines = rest.lines();
    let first = lines
        .find_map(|l| l.trim().strip_prefix("expr:"))
        .unwrap_or_else(|| panic!("no expression in {name}"))
        .trim();
    if first != "|" {
        return first.to_owned();
    }
    // A block: the lines indented deeper than the rule's keys.
    let block: Vec<&str> = lines
        .take_while(|l| l.starts_with("          "))
        .map(str::trim)
        .collect();
    block.join(" ")
}

/// An `alert_rule_test` item for [`test_alert_rules`] (indented six spaces): the alert
/// `alertname` evaluated at `eval_time`, expected to fire once for each of `alerts`,
/// given as its labels (the items of a YAML flow mapping) and its summary, each with
/// `description`.
fn alert_test(
    eval_time: &str,
    alertname: &str,
    description: &str,
    alerts: &[(&str, &str)],
) -> String {
    let mut item = format!(
        "      - eval_time: {eval_time}\n        alertname: {alertname}\n        exp_alerts:\n"
    );
    for (labels, summary) in alerts {
        item.push_str(&format!(
            "          - exp_labels: {{{labels}}}\n            \
             exp_annotations: {{summary: \"{summary}\", description: \"{description}\"}}\n"
        ));
    }
    item
}

/// Runs promtool's `alert_rule_test`s `tests` (YAML list items, indented six
/// spaces) on the real `dashboards/alerts.yml`, over `input_series` (indented four
/// spaces), evaluated and sampled every minute.
fn test_alert_rules(input_series: &str, tests: &str) {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/alerts.yml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("alerts_test.yml");
    std::fs::write(
        &file,
        format!(
            "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    \
             input_series:\n{input_series}    alert_rule_test:\n{tests}",
            rules.display()
        ),
    )
    .unwrap();
    promtool_test_rules(&file);
}

/// Runs `promtool test rules` on `file` and fails with its output unless it passes.
fn promtool_test_rules(file: &Path) {
    let out = Command::new(which("promtool"))
        .args(["test", "rules"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The samples of a Prometheus text exposition `text` as promtool input series of
/// `instance`, sampled every minute for `minutes`: a counter's or histogram's series
/// grows by its value every minute, a gauge's reads its value throughout.
fn scraped_every_minute(text: &str, instance: &str, minutes: u32) -> String {
    let mut series = String::new();
    let mut counting = false;
    for line in text.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            counting = !family.ends_with(" gauge");
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (selector, value) = line.rsplit_once(' ').unwrap();
        let selector = match selector.split_once('{') {
            Some((name, labels)) => format!("{name}{{instance=\"{instance}\",{labels}"),
            None => format!("{selector}{{instance=\"{instance}\"}}"),
        };
        let values = if counting {
            format!("0+{value}x{minutes}")
        } else {
            format!("{value}x{minutes}")
        };
        series.push_str(&format!(
            "      - series: '{}'\n        values: '{values}'\n",
            selector.replace('\'', "''")
        ));
    }
    series
}

/// A recorder that renders `rocgate_upstream_request_duration_seconds` with the
/// proxy's buckets, as `rocgate serve` installs it.
fn recorder_with_proxy_buckets() -> metrics_exporter_prometheus::PrometheusRecorder {
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(rocgate::metrics::UPSTREAM_DURATION.into()),
            &rocgate::metrics::DURATION_BUCKETS,
        )
        .unwrap()
        .build_recorder()
}

/// A route's key gauges as the collector sets them: `keys` tracked of at most
/// `max_keys` (both 0 for a route limited as a whole).
fn keys(route: &'static str, keys: u32, max_keys: u32) {
    metrics::gauge!(rocgate::metrics::KEYS, "route" => route).set(keys);
    metrics::gauge!(rocgate::metrics::MAX_KEYS, "route" => route).set(max_keys);
}

/// One minute of a route's requests as the collector counts them: `admitted`, and
/// `rejected` by reason (every reason's series is there, at 0 if not named).
fn count_requests(route: &'static str, admitted: u64, rejected: &[(&'static str, u64)]) {
    use rocgate::metrics::REQUESTS;
    metrics::counter!(REQUESTS, "route" => route, "decision" => "admitted", "reason" => "none")
        .increment(admitted);
    for reason in rocgate::limiter::Reason::ALL.map(|r| r.as_str()) {
        let n = rejected
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n);
        metrics::counter!(REQUESTS, "route" => route, "decision" => "rejected", "reason" => reason)
            .increment(n);
    }
}

/// One minute of a route's upstream answers as the proxy records them: `n` of
/// `status_class` that each took `seconds` (a timeout takes the `response_timeout`
/// waited, and counts under `rocgate_upstream_errors_total` too).
fn record_upstream(route: &'static str, status_class: &'static str, seconds: f64, n: u64) {
    use rocgate::metrics::{UPSTREAM_DURATION, UPSTREAM_ERRORS};
    let histogram =
        metrics::histogram!(UPSTREAM_DURATION, "route" => route, "status_class" => status_class);
    for _ in 0..n {
        histogram.record(seconds);
    }
    if status_class == "timeout" {
        metrics::counter!(UPSTREAM_ERRORS, "route" => route, "kind" => "response_timeout")
            .increment(n);
    }
}

/// One minute of a route's upstream connections not accepted within
/// `connect_timeout`: `n` requests with no upstream duration, counted under
/// `rocgate_upstream_errors_total` alone.
fn connect_timeouts(route: &'static str, n: u64) {
    metrics::counter!(rocgate::metrics::UPSTREAM_ERRORS, "route" => route, "kind" => "connect_timeout")
        .increment(n);
}

/// `RocgateUpstreamOverloadedWhileAdmitting` fires on an upstream that times out on
/// more than 1% of its requests while nothing is rejected, though a timeout is
/// recorded at the `response_timeout` waited (500 ms here: no p99 over 1 s could
/// show it), on one that accepts too few connections within `connect_timeout` (or
/// none: such a request has no upstream duration at all), on unmatched traffic (`route="unmatched"`, which no limiter counts)
/// whose p99 is over 1 s, and on a partitioned route whose only rejections are one
/// key's at its own limit (the route's limit rejects nothing); not on a route whose
/// timeouts stay under 1%, nor on one that the ROC cut rejects, nor on one limited
/// as a whole that its limit rejects, nor on one with a third of its requests timing
/// out at 0.5 request/s (under the rule's minimum of 1 request/s). promtool evaluates the rules file itself on series rendered by the
/// exporter `rocgate serve` uses, each sample scraped every minute.
#[test]
fn the_upstream_overload_alert_sees_timeouts_and_unmatched_traffic() {
    let recorder = recorder_with_proxy_buckets();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        for route in ["order", "calm", "cutting", "limited", "backlog", "dark"] {
            keys(route, 0, 0);
        }
        // 3% of the upstream's answers time out at a 500 ms `response_timeout`.
        count_requests("order", 1000, &[]);
        record_upstream("order", "2xx", 0.02, 970);
        record_upstream("order", "timeout", 0.501, 30);
        // Traffic no route matches, 10% of it slower than 1 s.
        record_upstream("unmatched", "2xx", 0.02, 90);
        record_upstream("unmatched", "2xx", 2.0, 10);
        // 0.5% of the answers time out at a 1 s `response_timeout`: under 1%.
        count_requests("calm", 1000, &[]);
        record_upstream("calm", "2xx", 0.02, 995);
        record_upstream("calm", "timeout", 1.001, 5);
        // Slow, but rocgate is cutting it.
        count_requests("cutting", 100, &[("roc_cut", 50)]);
        record_upstream("cutting", "2xx", 2.0, 100);
        // Slow, partitioned per key, and one key refused at its own limit all day:
        // the route's limit refuses nothing.
        keys("keyed", 40, 10_000);
        count_requests("keyed", 100, &[("limit", 30)]);
        // Slow, limited as a whole, and its limit refuses some.
        count_requests("limited", 100, &[("limit", 30)]);
        record_upstream("limited", "2xx", 2.0, 100);
        record_upstream("keyed", "2xx", 2.0, 100);
        // 10% of the connections are not accepted within `connect_timeout` (a full
        // listen backlog): those requests have no upstream duration.
        count_requests("backlog", 100, &[]);
        record_upstream("backlog", "2xx", 0.02, 90);
        connect_timeouts("backlog", 10);
        // Not one connection accepted.
        count_requests("dark", 100, &[]);
        connect_timeouts("dark", 100);
        // A third of the upstream's answers time out, but at 0.5 request/s: one
        // timeout of three requests is no overload.
        keys("sparse", 0, 0);
        count_requests("sparse", 30, &[]);
        record_upstream("sparse", "2xx", 0.02, 20);
        record_upstream("sparse", "timeout", 0.501, 10);
    });
    let series = scraped_every_minute(&handle.render(), "a", 20);
    let description =
        "The limits are above what the upstream can take: lower base_limit or danger_roc.";
    test_alert_rules(
        &series,
        &alert_test(
            "15m",
            "RocgateUpstreamOverloadedWhileAdmitting",
            description,
            &[
                (
                    "severity: critical, route: order, instance: a",
                    "upstream p99 over 1 s or over 1% of requests timing out on order while rocgate rejects nothing",
                ),
                (
                    "severity: critical, route: unmatched, instance: a",
                    "upstream p99 over 1 s or over 1% of requests timing out on unmatched while rocgate rejects nothing",
                ),
                (
                    "severity: critical, route: keyed, instance: a",
                    "upstream p99 over 1 s or over 1% of requests timing out on keyed while rocgate rejects nothing",
                ),
                (
                    "severity: critical, route: backlog, instance: a",
                    "upstream p99 over 1 s or over 1% of requests timing out on backlog while rocgate rejects nothing",
                ),
                (
                    "severity: critical, route: dark, instance: a",
                    "upstream p99 over 1 s or over 1% of requests timing out on dark while rocgate rejects nothing",
                ),
            ],
        ),
    );
}

/// One minute of a route as the collector records it: its key gauges (`keys` tracked
/// of at most), its rejection ratio, and its requests, `admitted` and `rejected` by
/// reason.
fn rejecting(
    route: &'static str,
    (keys_tracked, max_keys): (u32, u32),
    ratio: f64,
    admitted: u64,
    rejected: &[(&'static str, u64)],
) {
    keys(route, keys_tracked, max_keys);
    metrics::gauge!(rocgate::metrics::REJECTION_RATIO, "route" => route).set(ratio);
    count_requests(route, admitted, rejected);
}

/// `RocgateHighRejectionRatio` judges a partitioned route with room in its key table
/// by the ROC cut's rejections alone: one client held to its own limit all day, 37.5%
/// of a route's requests, is that client's doing and does not fire; a partitioned
/// route cut with 40% rejected fires; so does one whose key table is full, where new
/// clients share one overflow limiter and 50% are refused at its limit; and a route
/// limited as a whole fires on its rejection ratio whatever the reason; no route fires
/// at 0.5 request/s (under the rule's minimum of 1 request/s), a third of its requests
/// refused, limited as a whole or with its key table full. promtool
/// evaluates the rules file itself on series rendered by the exporter, each sample
/// scraped every minute.
#[test]
fn the_rejection_ratio_alert_leaves_clients_held_to_their_own_limits_alone() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        // Per API key: one key over its limit all day.
        rejecting("api", (40, 10_000), 0.375, 1000, &[("limit", 600)]);
        // Per client IP, in a ROC cut.
        rejecting("shop", (500, 10_000), 0.4, 600, &[("roc_cut", 400)]);
        // Per client IP, its key table full: new clients share the overflow limiter.
        rejecting("crowd", (10_000, 10_000), 0.5, 500, &[("limit", 500)]);
        // Limited as a whole: its base limit refuses 30%.
        rejecting("checkout", (0, 0), 0.3, 700, &[("limit", 300)]);
        // A third refused, but at 0.5 request/s: under the rule's minimum rate, both
        // limited as a whole and with a full key table.
        rejecting("sparse", (0, 0), 1.0 / 3.0, 20, &[("limit", 10)]);
        rejecting("sparse_crowd", (100, 100), 1.0 / 3.0, 20, &[("limit", 10)]);
    });
    let series = scraped_every_minute(&handle.render(), "a", 20);
    let description = "Sustained rejections: either a real overload, or base_limit is too low for healthy traffic (see /admin/hints). On a partitioned route with room for new keys only the ROC cut's count: clients held to their own limits are by design.";
    test_alert_rules(
        &series,
        &alert_test(
            "12m",
            "RocgateHighRejectionRatio",
            description,
            &[
                (
                    "severity: warning, route: shop, instance: a",
                    "rocgate rejects 40% of shop on a",
                ),
                (
                    "severity: warning, route: crowd, instance: a",
                    "rocgate rejects 50% of crowd on a",
                ),
                (
                    "severity: warning, route: checkout, instance: a",
                    "rocgate rejects 30% of checkout on a",
                ),
            ],
        ),
    );
}

/// Every upstream request of `instance` for one minute, as the proxy records them:
/// `forwarded` answered in 20 ms, and `refused` answered 503 `upstream_overflow` at
/// `max_upstream_requests` (never forwarded), rendered by the exporter `rocgate serve`
/// uses and scraped every minute for 20 minutes.
fn overflowing(instance: &str, forwarded: u64, refused: u64) -> String {
    let recorder = recorder_with_proxy_buckets();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || {
        record_upstream("shop", "2xx", 0.02, forwarded);
        for kind in rocgate::metrics::UPSTREAM_ERROR_KINDS {
            let n = if kind == "upstream_overflow" {
                refused
            } else {
                0
            };
            metrics::counter!(rocgate::metrics::UPSTREAM_ERRORS, "route" => "shop", "kind" => kind)
                .increment(n);
        }
        metrics::gauge!(rocgate::metrics::MAX_UPSTREAM_REQUESTS).set(100.0);
    });
    scraped_every_minute(&handle.render(), instance, 20)
}

/// `RocgateUpstreamOverflow` fires on an instance refusing 5% of its upstream requests
/// at `max_upstream_requests` for 5 minutes; not on one refusing 0.5%, nor on one
/// refusing a third at 0.5 request/s (under the rule's minimum of 1 request/s), nor on
/// one minute's burst of refusals (the cap doing its job: `for: 5m`). promtool
/// evaluates the rules file itself.
#[test]
fn the_upstream_overflow_alert_fires_on_sustained_refusals_only() {
    let mut series = overflowing("a", 950, 50);
    series.push_str(&overflowing("b", 995, 5));
    series.push_str(&overflowing("c", 20, 10));
    // One minute of 300 refusals among 1,000 requests a minute, then none.
    series.push_str(
        "      - series: 'rocgate_upstream_request_duration_seconds_count{instance=\"d\",route=\"shop\",status_class=\"2xx\"}'\n        \
         values: '0+1000x20'\n      \
         - series: 'rocgate_upstream_errors_total{instance=\"d\",route=\"shop\",kind=\"upstream_overflow\"}'\n        \
         values: '0 0 0 0 0 0 0 0 0 0 300 300 300 300 300 300 300 300 300 300 300'\n",
    );
    let description = "Requests in flight to the upstream reached max_upstream_requests (503 upstream_overflow): the upstream is slower than usual, or the routes admit more than the cap holds. Compare rocgate_upstream_requests with rocgate_max_upstream_requests and the upstream latency.";
    test_alert_rules(
        &series,
        &alert_test(
            "16m",
            "RocgateUpstreamOverflow",
            description,
            &[(
                "severity: warning, instance: a",
                "rocgate on a refuses 5% of its upstream requests at max_upstream_requests",
            )],
        ),
    );
}

/// The dashboard's upstream cap panel, on two instances: each one's places held beside
/// its `max_upstream_requests`, and its refusals at the cap per second. promtool
/// evaluates the panel's own queries.
#[test]
fn the_upstream_cap_panel_shows_places_held_against_the_cap_and_refusals() {
    let exprs = panel_queries("rocgate_max_upstream_requests");
    let find = |needle: &str| query_of(&exprs, needle);
    let mut series = String::new();
    for (instance, held, cap, refused_a_minute) in [("a", 100, 100, 120), ("b", 7, 50, 0)] {
        series.push_str(&format!(
            "      - series: 'rocgate_upstream_requests{{instance=\"{instance}\"}}'\n        values: '{held}x10'\n      \
             - series: 'rocgate_max_upstream_requests{{instance=\"{instance}\"}}'\n        values: '{cap}x10'\n"
        ));
        for route in ["order", "rest"] {
            series.push_str(&format!(
                "      - series: 'rocgate_upstream_errors_total{{instance=\"{instance}\",route=\"{route}\",kind=\"upstream_overflow\"}}'\n        values: '0+{refused_a_minute}x10'\n      \
                 - series: 'rocgate_upstream_errors_total{{instance=\"{instance}\",route=\"{route}\",kind=\"connect_timeout\"}}'\n        values: '0+60x10'\n"
            ));
        }
    }
    let tests = [
        per_instance(find("rocgate_upstream_requests{"), 100.0, 7.0),
        per_instance(find("rocgate_max_upstream_requests"), 100.0, 50.0),
        // 120 refusals a minute on each of two routes: 4 a second.
        per_instance(find("upstream_overflow"), 4.0, 0.0),
    ]
    .concat();
    test_exprs(&series, &tests);
}

/// The dashboard's demand panel draws a distributed route's fleet demand
/// (`rocgate_store_demand_rps`) beside each instance's own, on two instances deciding
/// `order` on the shared state: once, at the highest of what Redis last answered
/// each, not their sum (each reads the whole fleet's demand); a route whose decisions
/// on the shared state stopped (in fallback, its last answer's demand still held) has
/// no fleet line. promtool evaluates the panel's own query.
#[test]
fn the_demand_panel_shows_the_fleets_demand_once() {
    let exprs = panel_queries("rocgate_store_demand_rps");
    let mut series = String::new();
    for (instance, fleet, decided_a_minute) in [("a", 300, 12000), ("b", 290, 6000)] {
        series.push_str(&format!(
            "      - series: 'rocgate_store_demand_rps{{instance=\"{instance}\",route=\"order\"}}'\n        values: '{fleet}x10'\n      \
             - series: 'rocgate_store_requests_total{{instance=\"{instance}\",route=\"order\",decision=\"admitted\"}}'\n        values: '0+{decided_a_minute}x10'\n      \
             - series: 'rocgate_store_demand_rps{{instance=\"{instance}\",route=\"fallen\"}}'\n        values: '80x10'\n      \
             - series: 'rocgate_store_requests_total{{instance=\"{instance}\",route=\"fallen\",decision=\"admitted\"}}'\n        values: '500x10'\n      \
             - series: 'rocgate_demand_rps{{instance=\"{instance}\",route=\"order\",half=\"recent\"}}'\n        values: '{}x10'\n",
            decided_a_minute / 60
        ));
    }
    let tests = [
        expr_test(
            &query_of(&exprs, "rocgate_store_demand_rps"),
            "10m",
            &[("{route=\"order\"}", "300")],
        ),
        expr_test(
            &query_of(&exprs, "rocgate_demand_rps"),
            "10m",
            &[("{route=\"order\",half=\"recent\"}", "200")],
        ),
    ]
    .concat();
    test_exprs(&series, &tests);
}

/// The queries of the dashboard panel that reads `metric`, [`evaluable`].
fn panel_queries(metric: &str) -> Vec<String> {
    let dashboard = dashboard();
    let panel = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| {
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["expr"].as_str().unwrap().contains(metric))
        })
        .unwrap_or_else(|| panic!("no panel of the dashboard reads {metric}"));
    panel["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| evaluable(t["expr"].as_str().unwrap()))
        .collect()
}

/// A dashboard query `expr` with Grafana's variables given values promtool can
/// evaluate: every route and instance, and `$__rate_interval` as 5m (promtool's
/// samples being a minute apart).
fn evaluable(expr: &str) -> String {
    expr.replace("$route", ".*")
        .replace("$instance", ".*")
        .replace("$__rate_interval", "5m")
}

/// The query of `exprs` that holds `needle`.
fn query_of(exprs: &[String], needle: &str) -> String {
    exprs
        .iter()
        .find(|e| e.contains(needle))
        .unwrap_or_else(|| panic!("no query of {needle} in {exprs:?}"))
        .clone()
}

/// An [`expr_test`] of `expr` at 10 minutes: `a` on instance `a`, `b` on instance `b`.
fn per_instance(expr: String, a: f64, b: f64) -> String {
    expr_test(
        &expr,
        "10m",
        &[
            ("{instance=\"a\"}", &a.to_string()),
            ("{instance=\"b\"}", &b.to_string()),
        ],
    )
}

/// A `promql_expr_test` item for [`test_exprs`] (indented six spaces): `expr`, quoted
/// here for a single-quoted YAML string, evaluated at `eval_time`, expecting `samples`
/// (each one's labels and value).
fn expr_test(expr: &str, eval_time: &str, samples: &[(&str, &str)]) -> String {
    let mut item = format!(
        "      - expr: '{}'\n        eval_time: {eval_time}\n        exp_samples:\n",
        expr.replace('\'', "''")
    );
    for (labels, value) in samples {
        item.push_str(&format!(
            "          - labels: '{labels}'\n            value: {value}\n"
        ));
    }
    item
}

/// Runs promtool's `promql_expr_test`s `tests` (YAML list items, indented six spaces)
/// over `input_series` (indented four spaces), sampled every minute.
fn test_exprs(input_series: &str, tests: &str) {
    promql_test(&format!("{input_series}    promql_expr_test:\n{tests}"));
}

/// The dashboard's client connection panel, on two instances: each one's connections
/// closed at `max_connections_per_client` per second, and the times per second its
/// `max_connections` was reached. promtool evaluates the panel's own queries.
#[test]
fn the_client_connection_panel_shows_refusals_per_client_and_the_cap_reached() {
    let exprs = panel_queries("rocgate_client_connections_refused_total");
    let find = |needle: &str| query_of(&exprs, needle);
    let mut series = String::new();
    for (instance, refused_a_minute, reached_a_minute) in [("a", 120, 0), ("b", 0, 30)] {
        series.push_str(&format!(
            "      - series: 'rocgate_client_connections_refused_total{{instance=\"{instance}\"}}'\n        values: '0+{refused_a_minute}x10'\n      \
             - series: 'rocgate_client_connection_limit_reached_total{{instance=\"{instance}\"}}'\n        values: '0+{reached_a_minute}x10'\n      \
             - series: 'rocgate_client_connections{{instance=\"{instance}\"}}'\n        values: '500x10'\n"
        ));
    }
    let tests = [
        // 120 connections closed a minute: 2 a second.
        per_instance(find("rocgate_client_connections_refused_total"), 2.0, 0.0),
        per_instance(
            find("rocgate_client_connection_limit_reached_total"),
            0.0,
            0.5,
        ),
    ]
    .concat();
    test_exprs(&series, &tests);
}

/// Runs promtool on one test group, sampled and evaluated every minute: `group` is its
/// `input_series` items (indented six spaces) followed by its `promql_expr_test` key and
/// items.
fn promql_test(group: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("exprs.yml");
    std::fs::write(
        &file,
        format!("evaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{group}"),
    )
    .unwrap();
    promtool_test_rules(&file);
}
