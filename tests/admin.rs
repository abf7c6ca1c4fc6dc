//! The admin API over real sockets: live state, runtime changes, reload, bearer token.
#![cfg(feature = "proxy")]

#[path = "common/captured.rs"]
mod captured;

use captured::Captured;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rocgate::clock::{Clock, ManualClock, Nanos};
use rocgate::config::Config;
use rocgate::proxy::{Proxy, ProxySettings, ReloadError, Reloader};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

const CONFIG: &str = r#"
[[routes]]
name = "order"
method = "POST"
path = "/api/order"

[[routes]]
name = "rest"
path_prefix = "/"
base_limit = 1000
cut_limit = 300
"#;

struct Running {
    listen: SocketAddr,
    admin: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("proxy stops")
            .unwrap()
            .unwrap();
    }
}

async fn start(token: Option<&str>) -> Running {
    start_on(token, CONFIG, None).await.0
}

/// A proxy serving `text` (written to its file), on `clock` if given; with its reloader.
async fn start_on(
    token: Option<&str>,
    text: &str,
    clock: Option<Arc<dyn Clock>>,
) -> (Running, Reloader) {
    start_from(token, text, clock, true).await
}

/// [`start_on`], the proxy told of its file only if `reloadable` (else it runs as if
/// started with the embedded default).
async fn start_from(
    token: Option<&str>,
    text: &str,
    clock: Option<Arc<dyn Clock>>,
    reloadable: bool,
) -> (Running, Reloader) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    std::fs::write(&file, text).unwrap();
    let config = Config::load(&file).unwrap();
    let settings = {
        let mut built = ProxySettings::from_server(
            &rocgate::config::ServerConfig::default(),
            "http://127.0.0.1:9".parse().unwrap(),
        );
        built.listen = "127.0.0.1:0".parse().unwrap();
        // The config's address, on a port of the system's: 127.0.0.1 unless it names another.
        built.admin_listen = SocketAddr::new(config.server.admin_listen.ip(), 0);
        built.header_read_timeout = Duration::from_secs(2);
        built.shutdown_grace = Duration::from_secs(2);
        built.admin_token = token.map(rocgate::config::Secret::from);
        built.admin_allowed_hosts = config.server.admin_allowed_hosts.clone();
        built.admin_reads = config.server.admin_reads;
        built.admin_wrong_tokens_burst = config.server.admin_wrong_tokens_burst;
        built.admin_wrong_tokens_per_second = config.server.admin_wrong_tokens_per_second;
        built.forward.connect_timeout = Duration::from_millis(200);
        built.forward.response_timeout = Duration::from_secs(1);
        built.forward.max_body_bytes = 1024;
        built
    };
    let source = reloadable.then(|| file.clone());
    let proxy = match clock {
        Some(clock) => Proxy::bind_with_clock(settings, &config, source, clock).await,
        None => Proxy::bind(settings, &config, source).await,
    }
    .unwrap();
    let reloader = proxy.reloader().clone();
    let admin = proxy.admin_addr().unwrap();
    let listen = proxy.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    let running = Running {
        listen,
        admin,
        stop: Some(stop),
        task,
        file,
        _dir: dir,
    };
    (running, reloader)
}

/// Sends one request to the admin API; returns the status and the JSON body.
async fn call(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, Value) {
    let authorization = token.map(|t| format!("Bearer {t}"));
    call_raw(
        admin,
        method,
        path,
        body.as_bytes().to_vec(),
        authorization.as_deref(),
    )
    .await
}

/// [`call`] with any body, and the `Authorization` header as given.
async fn call_raw(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Vec<u8>,
    authorization: Option<&str>,
) -> (u16, Value) {
    let headers: Vec<_> = authorization
        .map(|a| ("authorization", a))
        .into_iter()
        .collect();
    call_with(admin, method, path, body, &headers).await
}

/// Sends one request with `headers` to the admin API; returns the status and the JSON
/// body (the body as a JSON string if it is not JSON).
async fn call_with(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{admin}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(Full::from(body)).unwrap();
    let res = tokio::time::timeout(Duration::from_secs(5), client.request(req))
        .await
        .unwrap()
        .unwrap();
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, json)
}

fn route<'a>(all: &'a Value, name: &str) -> &'a Value {
    all["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap()
}

/// The admin API's answers are gzip-compressed for a client that accepts gzip, as
/// Prometheus does, and plain for one that does not: `/metrics` is the same series
/// either way, in a fraction of the bytes.
#[tokio::test]
async fn metrics_are_gzipped_for_a_client_that_accepts_gzip() {
    use std::io::Read;
    let p = start(None).await;
    let admin = p.admin;
    let scrape = |gzip: bool| async move {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
        let mut req = http::Request::get(format!("http://{admin}/metrics"));
        if gzip {
            req = req.header("accept-encoding", "gzip");
        }
        let res = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(req.body(Full::default()).unwrap()),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(res.status(), 200);
        let encoding = res
            .headers()
            .get("content-encoding")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (encoding, body)
    };
    // Series are registered as the first scrape collects them: compare later ones.
    scrape(false).await;
    let (encoding, plain) = scrape(false).await;
    assert_eq!(encoding, None);
    let plain = String::from_utf8(plain.to_vec()).unwrap();
    let (encoding, gzipped) = scrape(true).await;
    assert_eq!(encoding.as_deref(), Some("gzip"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gzipped[..])
        .read_to_string(&mut text)
        .unwrap();
    // A moment apart, gauges may move: the series are the same.
    let series = |t: &str| -> std::collections::BTreeSet<String> {
        t.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.rsplit_once(' ').unwrap().0.to_owned())
            .collect()
    };
    assert!(plain.contains("rocgate_requests_total{"), "{plain}");
    assert_eq!(series(&text), series(&plain));
    assert!(
        gzipped.len() * 3 < plain.len(),
        "{} bytes gzipped, {} plain",
        gzipped.len(),
        plain.len()
    );
    p.stop().await;
}

#[tokio::test]
async fn health_and_live_state() {
    let p = start(None).await;
    assert_eq!(call(p.admin, "GET", "/healthz", "", None).await.0, 200);
    assert_eq!(call(p.admin, "GET", "/readyz", "", None).await.0, 200);
    let (status, all) = call(p.admin, "GET", "/admin/routes", "", None).await;
    assert_eq!(status, 200);
    let order = route(&all, "order");
    assert_eq!(order["state"], "normal");
    assert_eq!(order["base_limit_rps"], 200.0);
    assert_eq!(order["tokens"], 200.0);
    assert_eq!(order["rejected"]["roc_cut"], 0);
    assert!(order["active_event"].is_null());
    assert_eq!(
        call(p.admin, "GET", "/admin/routes/nope", "", None).await.0,
        404
    );
    p.stop().await;
}

/// README's table of a route's state names every field `GET /admin/routes/{name}`
/// answers, and no other.
#[tokio::test]
async fn readme_names_every_field_of_a_routes_state() {
    let readme = include_str!("../README.md");
    let at = readme
        .find("\nA route's state, as `GET /admin/routes`")
        .expect("README's table of a route's state");
    let table = &readme[at..];
    let table = &table[table.find("\n|").expect("the table")..];
    let table = &table[..table.find("\n\n").unwrap_or(table.len())];
    let documented: std::collections::BTreeSet<&str> = table
        .lines()
        .filter_map(|row| row.split('|').nth(1))
        .flat_map(|names| names.split(','))
        .filter_map(|name| name.trim().strip_prefix('`')?.strip_suffix('`'))
        .collect();
    let p = start(None).await;
    let (status, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(status, 200);
    let answered: std::collections::BTreeSet<&str> = order
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(documented, answered, "README's fields against the answer's");
    p.stop().await;
}

#[tokio::test]
async fn a_runtime_change_is_validated_and_applied() {
    let p = start(None).await;
    let (status, body) = change_order(p.admin, r#"{"base_limit": 100, "danger_roc": 120}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base_limit_rps"], 100.0);
    assert_eq!(body["limit_rps"], 100.0);
    assert_eq!(body["danger_roc"], 120.0);
    assert_eq!(body["tokens"], 100.0, "tokens clamped to the new capacity");

    let (status, body) = change_order(
        p.admin,
        r#"{"cut_limit": 500, "hold": "soon", "window": "10s"}"#,
    )
    .await;
    assert_eq!(status, 400);
    let errors: Vec<&str> = body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("window"),
        "unknown field named: {errors:?}"
    );

    let (status, body) = change_order(p.admin, r#"{"cut_limit": 500, "hold": "soon"}"#).await;
    assert_eq!(status, 422);
    let errors = body["errors"].to_string();
    assert!(
        errors.contains("cut_limit: must be ≤ base_limit (100), got 500"),
        "{errors}"
    );
    assert!(errors.contains("hold: invalid duration"), "{errors}");
    // The failed change left the route as it was.
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 100.0);
    assert_eq!(order["cut_limit_rps"], 60.0);
    p.stop().await;
}

/// `GET /metrics` on the admin API, which must answer 200 with text: the exposition.
async fn metrics_text(admin: SocketAddr) -> String {
    match call(admin, "GET", "/metrics", "", None).await {
        (200, Value::String(text)) => text,
        other => panic!("{other:?}"),
    }
}

/// Puts the runtime change `change` (JSON) on route `order`, with no token: the
/// status and the body.
async fn change_order(admin: SocketAddr, change: &str) -> (u16, Value) {
    call(admin, "PUT", "/admin/routes/order", change, None).await
}

/// Puts `change` on route `order` and checks that it is refused (422) with each of
/// `errors` in the body, and that the route then has no runtime change. Returns the
/// route as `GET /admin/routes/order` then reads it.
async fn refused_on_order(admin: SocketAddr, change: &str, errors: &[&str]) -> Value {
    let (status, body) = change_order(admin, change).await;
    assert_eq!(status, 422, "{body}");
    let said = body["errors"].to_string();
    for expected in errors {
        assert!(said.contains(expected), "{expected} in {said}");
    }
    let (_, order) = call(admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["runtime_change"], false, "{order}");
    order
}

/// A runtime change's durations have the file's upper bounds: each past its bound is
/// refused (422) naming the field and the bound, and the route is left as it was;
/// each at its bound is taken.
#[tokio::test]
async fn a_runtime_change_past_a_durations_bound_is_refused() {
    let p = start(None).await;
    refused_on_order(
        p.admin,
        r#"{"hold": "100years", "restore_interval": "25h", "min_dwell": "2days", "max_cut": "1000years"}"#,
        &[
            "hold: must be at most 1day, got 100years",
            "restore_interval: must be at most 1day, got 1day 1h",
            "min_dwell: must be at most 1day, got 2days",
            "max_cut: must be at most 1day, got 1000years",
        ],
    )
    .await;
    let (status, body) = change_order(
        p.admin,
        r#"{"hold": "1day", "restore_interval": "24h", "min_dwell": "1day", "max_cut": "1day"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["runtime_change"], true, "{body}");
    p.stop().await;
}

/// A duration is a JSON string: one written as a bare number, or any other JSON value
/// that is no string, is a change that does not read (400), each field named with
/// what it takes. A bare number was taken as its text and refused by the rules (422)
/// as `invalid duration "5": time unit needed`, where a field of any other wrong JSON
/// type is 400.
#[tokio::test]
async fn a_runtime_change_of_a_duration_not_written_as_a_string_asks_for_one() {
    let p = start(None).await;
    malformed_on_order(
        p.admin,
        r#"{"hold": 5, "max_cut": 2.5, "min_dwell": true}"#,
        &[
            r#"PUT /admin/routes/order: hold: must be a duration string such as "5s" or "100ms", got the number 5"#,
            r#"PUT /admin/routes/order: max_cut: must be a duration string such as "5s" or "100ms", got the number 2.5"#,
            r#"PUT /admin/routes/order: min_dwell: must be a duration string such as "5s" or "100ms", got true"#,
        ],
    )
    .await;
    p.stop().await;
}

/// A runtime change's limits have the file's upper bound: a token bucket spaces
/// requests a whole number of nanoseconds apart, so 7 × 10^8 req/s (1.43 ns) was
/// taken and enforced as 10^9. Past the bound it is refused (422) naming the field and
/// the bound, and the route is left as it was; at the bound it is taken.
#[tokio::test]
async fn a_runtime_change_past_a_limits_bound_is_refused() {
    let p = start(None).await;
    let order = refused_on_order(
        p.admin,
        r#"{"base_limit": 700000000, "cut_limit": 2000001}"#,
        &[
            "base_limit: must be at most 2000000 req/s with algorithm token_bucket",
            "got 700000000",
            "cut_limit: must be at most 2000000 req/s",
            "got 2000001",
        ],
    )
    .await;
    assert_eq!(order["base_limit_rps"], 200.0, "{order}");
    let (status, body) =
        change_order(p.admin, r#"{"base_limit": 2000000, "cut_limit": 2000000}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base_limit_rps"], 2_000_000.0, "{body}");
    p.stop().await;
}

#[tokio::test]
async fn reload_applies_a_good_file_and_keeps_the_running_config_on_a_bad_one() {
    let p = start(None).await;
    std::fs::write(
        &p.file,
        CONFIG.replace("base_limit = 1000", "base_limit = 800"),
    )
    .unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    let (_, all) = call(p.admin, "GET", "/admin/routes", "", None).await;
    assert_eq!(route(&all, "rest")["base_limit_rps"], 800.0);

    let broken = two_problems_config();
    std::fs::write(&p.file, broken).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 422);
    let errors = body["errors"].to_string();
    assert!(
        errors.contains("routes[1].cut_limit: must be ≤ base_limit (100), got 300"),
        "{errors}"
    );
    assert!(
        errors.contains("routes[1].window"),
        "every error is reported: {errors}"
    );
    let (_, all) = call(p.admin, "GET", "/admin/routes", "", None).await;
    assert_eq!(
        route(&all, "rest")["base_limit_rps"],
        800.0,
        "the running config stays"
    );
    p.stop().await;
}

/// Every route's upstream error counters are in the first scrape, at 0, for every
/// kind README names (`UPSTREAM_ERROR_KINDS`, which src/proxy/error.rs's
/// `every_kind_is_counted_from_zero` holds to every kind the proxy counts,
/// `body_aborted` included): a counter that appears with its first errors already
/// counted gives `rate` and `increase` nothing to compare with, so the errors panel
/// and any alert on it missed the first burst of an upstream's failure. So are those
/// of a route a reload adds, in the scrape after it (each route's are registered once).
#[tokio::test]
async fn upstream_error_counters_start_at_zero_for_every_route() {
    let extra = "[[routes]]\nname = \"errors_from_zero\"\npath = \"/errors-from-zero\"\n";
    let p = start_on(None, &format!("{extra}{CONFIG}"), None).await.0;
    let text = metrics_text(p.admin).await;
    let all_at_zero = |text: &str, route: &str| {
        for kind in rocgate::metrics::UPSTREAM_ERROR_KINDS {
            let series =
                format!("rocgate_upstream_errors_total{{route=\"{route}\",kind=\"{kind}\"}} 0\n");
            assert!(text.contains(&series), "no {series} in {text}");
        }
    };
    all_at_zero(&text, "errors_from_zero");
    // The requests no route matches, whose first errors the alert on an overloaded
    // upstream judges too, started at their first error (helper-123).
    all_at_zero(&text, "unmatched");
    let added = "[[routes]]\nname = \"errors_from_zero_added\"\npath = \"/errors-added\"\n";
    std::fs::write(&p.file, format!("{extra}{added}{CONFIG}")).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    let text = metrics_text(p.admin).await;
    all_at_zero(&text, "errors_from_zero");
    all_at_zero(&text, "errors_from_zero_added");
    p.stop().await;
}

/// The cut's decisions against the base limit's, both sides and the net (the cut's
/// own), are in a route's live state and `/metrics` where they are counted (a route
/// limited as a whole by a token bucket), and `null` and absent where not (a
/// partitioned route). (Routes of names of their own: the tests of one process
/// share the global recorder.)
#[tokio::test]
async fn the_cut_against_the_base_limit_is_live_state_and_metrics_where_counted() {
    let extra = "[[routes]]\nname = \"cut_own_whole\"\npath = \"/cut-own-whole\"\n\n\
                 [[routes]]\nname = \"cut_own_keyed\"\npath = \"/cut-own-keyed\"\n\
                 partition = \"ip\"\n";
    let p = start_on(None, &format!("{extra}{CONFIG}"), None).await.0;
    let (status, all) = call(p.admin, "GET", "/admin/routes", "", None).await;
    assert_eq!(status, 200);
    let text = metrics_text(p.admin).await;
    for decision in ["rejected", "admitted"] {
        let field = format!("cut_vs_base_{decision}");
        assert_eq!(route(&all, "cut_own_whole")[&field], 0, "{field}");
        assert!(route(&all, "cut_own_keyed")[&field].is_null(), "{field}");
        let series = |route: &str| {
            format!(r#"rocgate_cut_vs_base_total{{route="{route}",decision="{decision}"}}"#)
        };
        let whole = format!("{} 0", series("cut_own_whole"));
        assert!(text.lines().any(|l| l == whole), "no `{whole}` in {text}");
        assert!(!text.contains(&series("cut_own_keyed")), "{text}");
    }
    assert_eq!(route(&all, "cut_own_whole")["cut_own_net"], 0);
    assert!(route(&all, "cut_own_keyed")["cut_own_net"].is_null());
    p.stop().await;
}

/// A route that a reload removes leaves `/metrics` gauge by gauge (they would read NaN
/// until a restart); its counters stay.
#[tokio::test]
async fn a_route_removed_by_a_reload_leaves_the_gauges_of_metrics() {
    let extra = "[[routes]]\nname = \"retired_by_reload\"\npath = \"/retired\"\n";
    let p = start_on(None, &format!("{extra}{CONFIG}"), None).await.0;
    let gauge = r#"rocgate_limit_rps{route="retired_by_reload"} "#;
    let counter = r#"rocgate_cuts_total{route="retired_by_reload"} "#;
    let text = metrics_text(p.admin).await;
    assert!(text.contains(&format!("{gauge}200")), "{text}");

    std::fs::write(&p.file, CONFIG).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    let text = metrics_text(p.admin).await;
    assert!(!text.contains(gauge), "{text}");
    assert!(!text.contains("NaN"), "{text}");
    assert!(text.contains(&format!("{counter}0")), "{text}");
    p.stop().await;
}

#[tokio::test]
async fn a_reload_names_the_changes_that_wait_for_a_restart() {
    let p = start(None).await;
    // A token rotated in the file: the running admin API keeps the one it started
    // with, and the operator must hear that the new one is not in force.
    let rotated = format!(
        "{CONFIG}\n[admin]\ntoken = \"rotated\"\nallowed_hosts = [\"rocgate.internal\"]\n[server]\ntrusted_proxies = [\"10.0.0.0/8\"]\n"
    );
    std::fs::write(
        &p.file,
        rotated.replace("base_limit = 1000", "base_limit = 800"),
    )
    .unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["restart_required"],
        serde_json::json!(["[server]", "[admin]"]),
        "{body}"
    );
    let (_, all) = call(p.admin, "GET", "/admin/routes", "", None).await;
    assert_eq!(
        route(&all, "rest")["base_limit_rps"],
        800.0,
        "the routes are reloaded"
    );
    std::fs::write(&p.file, CONFIG).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["restart_required"], serde_json::json!([]), "{body}");
    // The names the admin API answers as this host's are read at start, as its token.
    std::fs::write(&p.file, format!("{CONFIG}{ALLOWED}")).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["restart_required"],
        serde_json::json!(["[admin]"]),
        "{body}"
    );
    // So is the bound on wrong tokens, each of its two fields.
    for bound in ["wrong_tokens_burst = 20", "wrong_tokens_per_second = 2"] {
        std::fs::write(&p.file, format!("{CONFIG}\n[admin]\n{bound}\n")).unwrap();
        let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(
            body["restart_required"],
            serde_json::json!(["[admin]"]),
            "{bound}: {body}"
        );
    }
    p.stop().await;
}

/// `[admin] reads` is read at start, as the rest of `[admin]`: a reload that closes
/// or opens the reads lists `[admin]` in `restart_required`, the token unchanged; one
/// that leaves it as it was lists nothing. Started with `reads = "token"`, the
/// operator on the host (loopback, a `Host` naming it) still reads without the token,
/// and `/healthz` is answered.
#[tokio::test]
async fn a_reload_that_changes_reads_waits_for_a_restart() {
    let token = "the-token-of-this-file";
    let admin = |reads: &str| format!("{CONFIG}\n[admin]\ntoken = \"{token}\"\n{reads}\n");
    let (p, _) = start_on(Some(token), &admin("reads = \"token\""), None).await;
    for path in ["/admin/routes", "/metrics", "/healthz"] {
        let (status, _) = call(p.admin, "GET", path, "", None).await;
        assert_eq!(status, 200, "{path}");
    }
    for (reads, restart) in [
        ("reads = \"open\"", serde_json::json!(["[admin]"])),
        ("", serde_json::json!(["[admin]"])),
        ("reads = \"token\"", serde_json::json!([])),
    ] {
        std::fs::write(&p.file, admin(reads)).unwrap();
        let (status, body) = call(p.admin, "POST", "/admin/reload", "", Some(token)).await;
        assert_eq!(status, 200, "{reads}: {body}");
        assert_eq!(body["restart_required"], restart, "{reads}: {body}");
    }
    p.stop().await;
}

/// An address of this host beyond loopback, if it has one: the source address of its
/// route to a documentation address (RFC 5737; a connected UDP socket sends nothing).
fn an_address_beyond_loopback() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("198.51.100.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// `[admin] reads` reaches the running admin API: bound on this host's address beyond
/// loopback and reached from it (a peer that is not loopback), with `reads = "token"`
/// every read, `/metrics` and unknown paths included, needs the token, `/healthz` and
/// `/readyz` excepted; with the reads open, they are answered without it. A host with
/// no address beyond loopback has nothing to show it on, and says so.
#[tokio::test]
async fn reads_token_closes_the_reads_of_a_running_admin_api_beyond_loopback() {
    let Some(ip) = an_address_beyond_loopback() else {
        eprintln!("skipped: this host has no address beyond loopback to bind the admin API on");
        return;
    };
    let token = "the-token-of-this-file";
    let admin = |reads: &str| {
        format!(
            "{CONFIG}\n[admin]\nlisten = \"{}\"\ntoken = \"{token}\"\n{reads}\n",
            SocketAddr::new(ip, 9090)
        )
    };
    let reads = [
        "/metrics",
        "/admin/routes",
        "/admin/routes/order",
        "/admin/hints",
        "/admin/store",
    ];
    let (p, _) = start_on(Some(token), &admin("reads = \"token\""), None).await;
    assert_eq!(p.admin.ip(), ip);
    for path in reads
        .into_iter()
        .chain(["/metrics/", "//admin/routes", "/nowhere"])
    {
        for method in ["GET", "HEAD"] {
            let (status, _) = call(p.admin, method, path, "", None).await;
            assert_eq!(status, 401, "{method} {path} without the token");
        }
    }
    for path in reads {
        let (status, _) = call(p.admin, "GET", path, "", Some(token)).await;
        assert_eq!(status, 200, "{path} with the token");
    }
    for path in ["/healthz", "/readyz"] {
        let (status, _) = call(p.admin, "GET", path, "", None).await;
        assert_eq!(status, 200, "{path}");
    }
    p.stop().await;
    let (p, _) = start_on(Some(token), &admin(""), None).await;
    for path in reads {
        let (status, _) = call(p.admin, "GET", path, "", None).await;
        assert_eq!(status, 200, "{path}, the reads open");
    }
    p.stop().await;
}

/// A reload names the file's scheduled events that have ended, as the start does
/// (it named none: a sale's date mistyped into the past went by in silence).
#[tokio::test]
async fn a_reload_names_the_events_that_have_ended() {
    let p = start(None).await;
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events_ended"], serde_json::json!([]), "{body}");
    let with_events = format!(
        "{CONFIG}\n\
         [[routes.events]]\nname = \"last-years-sale\"\nstart = \"2020-11-27T19:00:00Z\"\nduration = \"2h\"\nbase_limit = 500\n\n\
         [[routes.events]]\nname = \"next-sale\"\nstart = \"2999-11-27T19:00:00Z\"\nduration = \"2h\"\nbase_limit = 500\n"
    );
    std::fs::write(&p.file, with_events).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    p.stop().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["events_ended"],
        serde_json::json!(["routes[1].events[0]"]),
        "{body}"
    );
}

/// A reload's answer lists the routes whose runtime change it `kept` and those whose
/// change the file `replaced`, and drops none.
#[track_caller]
fn assert_reload_lists(body: &Value, kept: Value, replaced: Value) {
    assert_eq!(body["runtime_changes_kept"], kept, "{body}");
    assert_eq!(body["runtime_changes_replaced"], replaced, "{body}");
    assert_eq!(
        body["runtime_changes_dropped"],
        serde_json::json!([]),
        "{body}"
    );
}

/// A reload whose file no longer has a route of that name (renamed here) drops the
/// route's runtime change with it, and its answer names it. (It named it nowhere: an
/// operator's change made during an incident went without a word.)
#[tokio::test]
async fn a_reload_that_renames_a_changed_route_says_it_dropped_the_change() {
    let p = start(None).await;
    let (status, body) = change_order(p.admin, r#"{"base_limit": 300}"#).await;
    assert_eq!(status, 200, "{body}");
    std::fs::write(
        &p.file,
        CONFIG.replace("name = \"order\"", "name = \"orders\""),
    )
    .unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    let (_, orders) = call(p.admin, "GET", "/admin/routes/orders", "", None).await;
    p.stop().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["runtime_changes_dropped"],
        serde_json::json!(["order"]),
        "{body}"
    );
    assert_eq!(
        body["runtime_changes_kept"],
        serde_json::json!([]),
        "{body}"
    );
    assert_eq!(
        body["runtime_changes_replaced"],
        serde_json::json!([]),
        "{body}"
    );
    assert_eq!(orders["base_limit_rps"], 200.0, "{orders}");
    assert_eq!(orders["runtime_change"], false, "{orders}");
}

/// A field set to `null` is refused, naming it and how to withdraw the route's change
/// (it named `DELETE /admin/routes/{name}/change`, a literal `{name}`); the route is
/// left as it was.
#[tokio::test]
async fn a_change_setting_a_field_to_null_is_refused() {
    let p = start(None).await;
    let change = r#"{"cut_limit": 30, "hold": null}"#;
    let (status, body) = call(p.admin, "PUT", "/admin/routes/order", change, None).await;
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    p.stop().await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("hold: null is no value"),
        "{body}"
    );
    assert!(
        body.to_string()
            .contains("withdraw the change (DELETE /admin/routes/order/change)"),
        "{body}"
    );
    assert_eq!(order["runtime_change"], false, "{order}");
}

/// Reloads `p` with a file that changes the `rest` route alone (its base limit 1000 →
/// 900): `order`'s runtime change is kept, and the answer says so.
async fn reload_for_rests_sake(p: &Running) {
    std::fs::write(
        &p.file,
        CONFIG.replace("base_limit = 1000", "base_limit = 900"),
    )
    .unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    assert_reload_lists(&body, serde_json::json!(["order"]), serde_json::json!([]));
}

/// A runtime change outlives a reload that leaves its route as the file had it: a
/// colleague's reload for another route does not undo an incident's raised limit (it
/// did: every reload put the file's parameters back). A file that changes the route
/// replaces the change, and says so; a file that repeats the change takes it over.
#[tokio::test]
async fn a_reload_keeps_a_runtime_change_unless_the_file_changed_its_route() {
    let p = start(None).await;
    let change = r#"{"base_limit": 300}"#;
    let (status, body) = call(p.admin, "PUT", "/admin/routes/order", change, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["runtime_change"], true, "{body}");

    // Another route changed in the file: `order`'s change stays.
    reload_for_rests_sake(&p).await;
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 300.0, "{order}");
    assert_eq!(order["runtime_change"], true, "{order}");
    let (_, rest) = call(p.admin, "GET", "/admin/routes/rest", "", None).await;
    assert_eq!(
        rest["base_limit_rps"], 900.0,
        "the file's change is in force"
    );
    assert_eq!(rest["runtime_change"], false, "{rest}");

    // The file changes `order` itself: the file's parameters replace the change.
    let edited = CONFIG.replace(
        "path = \"/api/order\"",
        "path = \"/api/order\"\nbase_limit = 250",
    );
    std::fs::write(&p.file, &edited).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    assert_reload_lists(&body, serde_json::json!([]), serde_json::json!(["order"]));
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 250.0, "the file's base_limit");
    assert_eq!(order["runtime_change"], false, "{order}");

    // A change the file then repeats is neither kept nor replaced: it is the file's.
    let (status, body) = call(p.admin, "PUT", "/admin/routes/order", change, None).await;
    assert_eq!(status, 200, "{body}");
    std::fs::write(
        &p.file,
        edited.replace("base_limit = 250", "base_limit = 300"),
    )
    .unwrap();
    for _ in 0..2 {
        let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
        assert_eq!(status, 200, "{body}");
        assert_reload_lists(&body, serde_json::json!([]), serde_json::json!([]));
    }
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 300.0);
    assert_eq!(order["runtime_change"], false, "{order}");
    p.stop().await;
}

/// A runtime change kept through a reload is in force on the route the whole time, and
/// its controller goes on: a spike right after the reload is cut at once. It was cut a
/// window late: the reload put the file's parameters in force and the change back in
/// two steps, each of which rearmed the controller (no ROC action for a window).
#[tokio::test]
async fn a_runtime_change_kept_through_a_reload_does_not_pause_its_controller() {
    let clock = Arc::new(ManualClock::new());
    let (p, reloader) = start_on(None, CONFIG, Some(clock.clone())).await;
    let change = r#"{"base_limit": 300}"#;
    let (status, body) = call(p.admin, "PUT", "/admin/routes/order", change, None).await;
    assert_eq!(status, 200, "{body}");
    // Two windows at 40 req/s: the controller is armed.
    let mut at = Nanos::ZERO;
    let mut send = |engine: &rocgate::engine::Engine, rate: u32, secs: u32| {
        let id = engine.route_id("order").unwrap();
        for _ in 0..rate * secs {
            at = Nanos::from_secs_f64(at.as_secs_f64() + 1.0 / f64::from(rate));
            let _ = engine.check(id, rocgate::engine::Key::None, at);
        }
        at
    };
    clock.set(send(&reloader.engine(), 40, 12));

    // A reload for another route's sake keeps `order`'s change.
    reload_for_rests_sake(&p).await;

    // A spike from 40 to 600 req/s, a second long: cut within it.
    clock.set(send(&reloader.engine(), 600, 1));
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["state"], "cut", "{order}");
    assert_eq!(order["base_limit_rps"], 300.0, "{order}");
    assert_eq!(order["runtime_change"], true, "{order}");
    p.stop().await;
}

/// A runtime change survives a refused reload as the running config does, and is
/// withdrawn on demand: the file's parameters, as last read, are back in force.
#[tokio::test]
async fn a_runtime_change_is_withdrawn_on_demand_and_survives_a_refused_reload() {
    let p = start(None).await;
    let (status, body) = call(p.admin, "DELETE", "/admin/routes/order/change", "", None).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body["errors"][0],
        "route \"order\" has no runtime change: the file's parameters are in force"
    );
    let (status, _) = call(p.admin, "DELETE", "/admin/routes/nope/change", "", None).await;
    assert_eq!(status, 404);

    let change = r#"{"base_limit": 300, "cut_limit": 90}"#;
    let (status, body) = call(p.admin, "PUT", "/admin/routes/order", change, None).await;
    assert_eq!(status, 200, "{body}");
    std::fs::write(&p.file, "[[routes]]\nname = 3\n").unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 422, "{body}");
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 300.0, "{order}");
    assert_eq!(order["runtime_change"], true, "{order}");

    let (_, metrics) = call(p.admin, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    assert!(text.contains("rocgate_runtime_changes 1\n"), "{text}");
    let (status, order) = call(p.admin, "DELETE", "/admin/routes/order/change", "", None).await;
    assert_eq!(status, 200, "{order}");
    let (_, metrics) = call(p.admin, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    assert!(text.contains("rocgate_runtime_changes 0\n"), "{text}");
    assert_eq!(order["base_limit_rps"], 200.0, "{order}");
    assert_eq!(order["cut_limit_rps"], 60.0, "{order}");
    assert_eq!(order["runtime_change"], false, "{order}");
    let (status, _) = call(p.admin, "DELETE", "/admin/routes/order/change", "", None).await;
    assert_eq!(status, 404, "withdrawn once");

    // Changed back by hand to the file's parameters: no change is in force either.
    let (status, _) = call(p.admin, "PUT", "/admin/routes/order", change, None).await;
    assert_eq!(status, 200);
    let back = r#"{"base_limit": 200, "cut_limit": 60}"#;
    let (status, order) = call(p.admin, "PUT", "/admin/routes/order", back, None).await;
    assert_eq!(status, 200, "{order}");
    assert_eq!(order["runtime_change"], false, "{order}");
    p.stop().await;
}

#[tokio::test]
async fn mutating_endpoints_require_the_token_when_set() {
    let p = start(Some("s3cret")).await;
    assert_eq!(
        call(p.admin, "POST", "/admin/reload", "", None).await.0,
        401
    );
    assert_eq!(
        call(p.admin, "POST", "/admin/reload", "", Some("wrong"))
            .await
            .0,
        401
    );
    let put = r#"{"base_limit": 150}"#;
    assert_eq!(
        call(p.admin, "PUT", "/admin/routes/order", put, None)
            .await
            .0,
        401
    );
    assert_eq!(
        call(p.admin, "PUT", "/admin/routes/order", put, Some("s3cret"))
            .await
            .0,
        200
    );
    let withdraw = "/admin/routes/order/change";
    assert_eq!(call(p.admin, "DELETE", withdraw, "", None).await.0, 401);
    assert_eq!(
        call(p.admin, "DELETE", withdraw, "", Some("s3cret"))
            .await
            .0,
        200
    );
    assert_eq!(
        call(p.admin, "POST", "/admin/reload", "", Some("s3cret"))
            .await
            .0,
        200
    );
    // Reading needs no token.
    assert_eq!(call(p.admin, "GET", "/admin/routes", "", None).await.0, 200);
    p.stop().await;
}

/// Wrong tokens are bounded per client address, 10 at once and one a second: past
/// them, a request from that address with a token, right or wrong, gets 429 with
/// `Retry-After` (whole seconds) and its token is not compared. The test's peer is
/// loopback, where the operator's tools (no `Origin`, a `Host` naming this host) are
/// never bounded: a page's requests are (its `Origin` on a change, its own name in
/// `Host` through a rebound name), so the page guesses here. Before, every one of its
/// guesses was answered 401, as fast as it sent them.
#[tokio::test]
async fn a_client_sending_wrong_tokens_is_bounded_and_the_operator_is_not() {
    let clock = Arc::new(ManualClock::new());
    let (p, _) = start_on(Some("s3cret"), CONFIG, Some(clock.clone())).await;
    let put = br#"{"base_limit": 150}"#.to_vec();
    let page = |token: &'static str| {
        let authorization = format!("Bearer {token}");
        let put = put.clone();
        async move {
            let headers = [
                ("origin", "http://evil.example"),
                ("authorization", authorization.as_str()),
            ];
            call_with(p.admin, "PUT", "/admin/routes/order", put, &headers).await
        }
    };
    for _ in 0..10 {
        assert_eq!(page("guess").await.0, 401);
    }
    for token in ["guess", "s3cret"] {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
        let req = http::Request::put(format!("http://{}/admin/routes/order", p.admin))
            .header("origin", "http://evil.example")
            .header("authorization", format!("Bearer {token}"))
            .body(Full::from(put.clone()))
            .unwrap();
        let res = tokio::time::timeout(Duration::from_secs(5), client.request(req))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(res.status(), 429, "{token}");
        assert_eq!(res.headers()["retry-after"], "1", "{token}");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            answer["errors"][0],
            "too many wrong tokens from this address: a token is compared again in 1s"
        );
    }
    // The operator's curl on the host: a typo is answered 401, the token gets in.
    for _ in 0..20 {
        let (status, _) = call(p.admin, "PUT", "/admin/routes/order", "{}", Some("typo")).await;
        assert_eq!(status, 401);
    }
    let (status, answer) = call(
        p.admin,
        "PUT",
        "/admin/routes/order",
        r#"{"base_limit": 150}"#,
        Some("s3cret"),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // A second on (the proxy's clock), the page's address may guess once more.
    clock.advance(Duration::from_secs(1));
    assert_eq!(page("guess").await.0, 401);
    assert_eq!(page("guess").await.0, 429);
    let metrics = metrics_text(p.admin).await;
    for reason in ["wrong_token", "too_many_guesses"] {
        let series = format!("rocgate_admin_refused_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&series), "{series} in {metrics}");
    }
    p.stop().await;
}

/// `[admin] wrong_tokens_burst` and `wrong_tokens_per_second` set the bound: 2 at
/// once, then one every 10 seconds.
#[tokio::test]
async fn the_bound_on_wrong_tokens_is_the_configs() {
    let clock = Arc::new(ManualClock::new());
    let text =
        format!("{CONFIG}\n[admin]\nwrong_tokens_burst = 2\nwrong_tokens_per_second = 0.1\n");
    let (p, _) = start_on(Some("s3cret"), &text, Some(clock.clone())).await;
    let headers = [("host", "evil.example"), ("authorization", "Bearer guess")];
    let guess = || call_with(p.admin, "GET", "/admin/routes", Vec::new(), &headers);
    assert_eq!(guess().await.0, 403);
    assert_eq!(guess().await.0, 403);
    assert_eq!(guess().await.0, 429);
    clock.advance(Duration::from_secs(9));
    assert_eq!(guess().await.0, 429);
    clock.advance(Duration::from_secs(1));
    assert_eq!(guess().await.0, 403);
    p.stop().await;
}

/// Sends one request to the admin API as a web page's would go, with `Origin`.
async fn call_from_page(admin: SocketAddr, method: &str, path: &str, body: &str) -> (u16, Value) {
    let headers = [
        ("origin", "http://evil.example"),
        ("content-type", "text/plain"),
    ];
    let (status, answer) = call_with(admin, method, path, body.into(), &headers).await;
    assert!(!answer.is_string(), "not JSON: {answer}");
    (status, answer)
}

/// Without a token, a page the operator opens could have the browser change limits
/// on the loopback admin API: `POST /admin/reload` as a form, any change through a
/// name re-bound to 127.0.0.1. A browser names the page in `Origin`; such a change
/// is refused, and tools that send none (curl) change limits as before.
#[tokio::test]
async fn without_a_token_a_web_page_cannot_change_limits() {
    let p = start(None).await;
    for (method, path, body) in [
        ("PUT", "/admin/routes/order", r#"{"base_limit": 150}"#),
        ("DELETE", "/admin/routes/order/change", ""),
        ("POST", "/admin/reload", ""),
    ] {
        let (status, answer) = call_from_page(p.admin, method, path, body).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
        assert_eq!(
            answer["errors"][0],
            "a change from a web page (Origin: \"http://evil.example\") is refused without [admin] token",
            "{method} {path}"
        );
    }
    let (status, all) = call_from_page(p.admin, "GET", "/admin/routes", "").await;
    assert_eq!(status, 200);
    assert_eq!(route(&all, "order")["runtime_change"], false);
    let put = r#"{"base_limit": 150}"#;
    let (status, order) = call(p.admin, "PUT", "/admin/routes/order", put, None).await;
    assert_eq!(
        (status, &order["runtime_change"]),
        (200, &Value::Bool(true))
    );
    p.stop().await;
}

/// `[admin] allowed_hosts` beside [`CONFIG`]: a name of this host besides its
/// addresses and `localhost`.
const ALLOWED: &str = "\n[admin]\nallowed_hosts = [\"rocgate.internal\"]\n";

/// The refusal of a request from loopback whose `Host` is `host`, without a token set.
fn foreign_host(host: &str) -> String {
    format!(
        "Host \"{host}\" is not a name of this host: from loopback, the admin API answers a \
         Host that is an IP address, localhost or a name in [admin] allowed_hosts (list it \
         there if it is one of this host's names)"
    )
}

/// A web page served from a name its owner then re-binds to 127.0.0.1 (DNS rebinding)
/// reaches the loopback admin API as its own origin: its reads carry its name in
/// `Host` and no `Origin`. Every endpoint but the health checks (see below) refuses
/// them (403, naming the host and the setting), a change among them, which is not made; and answers a `Host` that names
/// this host: an IP address (v6 in brackets), `localhost` or a name in
/// `[admin] allowed_hosts`, in any case, with a port or without, and a request that
/// names none (HTTP/1.0: a browser sends one with every request). Every read of the
/// page was answered before.
#[tokio::test]
async fn a_page_through_a_rebound_name_reads_nothing_from_loopback() {
    let (p, _) = start_on(None, &format!("{CONFIG}{ALLOWED}"), None).await;
    let port = p.admin.port();
    let evil = format!("evil.example:{port}");
    let paths = [
        "/admin/routes",
        "/admin/routes/order",
        "/admin/hints",
        "/admin/store",
        "/metrics",
    ];
    for path in paths {
        let (status, answer) =
            call_with(p.admin, "GET", path, Vec::new(), &[("host", &evil)]).await;
        assert_eq!(status, 403, "{path}: {answer}");
        assert_eq!(answer["errors"][0], foreign_host(&evil), "{path}");
    }
    let put = br#"{"base_limit": 150}"#.to_vec();
    let (status, _) = call_with(
        p.admin,
        "PUT",
        "/admin/routes/order",
        put,
        &[("host", &evil)],
    )
    .await;
    assert_eq!(status, 403);
    for host in [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        format!("LocalHost.:{port}"),
        format!("[::1]:{port}"),
        "[::1]".to_owned(),
        "rocgate.internal".to_owned(),
        format!("Rocgate.Internal:{port}"),
    ] {
        for path in paths {
            let (status, answer) =
                call_with(p.admin, "GET", path, Vec::new(), &[("host", &host)]).await;
            assert_eq!(status, 200, "{host} {path}: {answer}");
        }
        let (_, all) = call_with(
            p.admin,
            "GET",
            "/admin/routes",
            Vec::new(),
            &[("host", &host)],
        )
        .await;
        assert_eq!(route(&all, "order")["runtime_change"], false, "{host}");
    }
    let raw = raw_admin(p.admin, b"GET /admin/routes HTTP/1.0\r\n\r\n").await;
    assert_eq!(raw.split(' ').nth(1), Some("200"), "{raw}");
    p.stop().await;
}

/// RFC 9112 §3.2: "A server MUST respond with a 400 (Bad Request) status code to any
/// HTTP/1.1 request message that lacks a Host header field and to any HTTP/1.1
/// request message that contains more than one Host header field line or a Host
/// header field with an invalid field value." The admin API answered all three, a
/// request without `Host` as one that names no host. Now each gets 400 saying which it
/// is, as the proxy's does, on every endpoint, the health checks among them (a kubelet
/// probe, Envoy's and Prometheus's send `Host`), with the token or without, before
/// the `Host` is held to this host's names; a target in absolute form does not stand
/// in for the `Host` an HTTP/1.1 request lacks. HTTP/1.0 needs no `Host`. A `Host`,
/// or a target's host, holding a comma (two hosts) gets 400 too.
#[tokio::test]
async fn a_request_without_one_valid_host_gets_400() {
    let p = start(Some("s3cret")).await;
    let none = "no Host field: an HTTP/1.1 request names its host (RFC 9112 §3.2)";
    let two = "two Host fields: a request names one host (RFC 9112 §3.2)";
    let invalid = "a Host field that is no host[:port] (RFC 9112 §3.2)";
    let merged =
        "a Host field holding a comma, as two Host fields merged: a request names one host (RFC 9112 §3.2)";
    let target_merged =
        "a target whose host holds a comma, as two hosts: a request names one host (RFC 9112 §3.2)";
    for path in ["/admin/routes", "/healthz", "/readyz", "/metrics"] {
        for (head, why) in [
            (format!("GET {path} HTTP/1.1\r\n"), none),
            (format!("GET http://127.0.0.1{path} HTTP/1.1\r\n"), none),
            (
                format!("GET {path} HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n"),
                none,
            ),
            (
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n"),
                two,
            ),
            (
                format!("GET {path} HTTP/1.0\r\nHost: localhost\r\nHost: 127.0.0.1\r\n"),
                two,
            ),
            (
                format!("GET {path} HTTP/1.1\r\nHost: localhost@evil.example\r\n"),
                invalid,
            ),
            (
                format!("GET {path} HTTP/1.1\r\nHost: localhost/x\r\n"),
                invalid,
            ),
            (format!("GET {path} HTTP/1.1\r\nHost: \r\n"), invalid),
            (
                format!("GET {path} HTTP/1.1\r\nHost: localhost,127.0.0.1\r\n"),
                merged,
            ),
            (
                format!("GET {path} HTTP/1.1\r\nHost: localhost, evil.example\r\n"),
                merged,
            ),
            (
                format!("GET {path} HTTP/1.0\r\nHost: localhost,localhost\r\n"),
                merged,
            ),
            (
                format!("GET http://127.0.0.1{path} HTTP/1.1\r\nHost: localhost,127.0.0.1\r\n"),
                merged,
            ),
            (
                format!("GET http://127.0.0.1,evil.example{path} HTTP/1.1\r\nHost: localhost\r\n"),
                target_merged,
            ),
        ] {
            let raw = raw_admin(
                p.admin,
                format!("{head}Connection: close\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(raw.split(' ').nth(1), Some("400"), "{head:?}: {raw}");
            let body = serde_json::json!({ "errors": [why] }).to_string();
            assert!(raw.ends_with(&body), "{head:?}: {raw}");
        }
        for head in [
            format!("GET {path} HTTP/1.0\r\n"),
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n"),
            format!("GET http://127.0.0.1{path} HTTP/1.1\r\nHost: localhost\r\n"),
        ] {
            let raw = raw_admin(
                p.admin,
                format!("{head}Connection: close\r\n\r\n").as_bytes(),
            )
            .await;
            assert_eq!(raw.split(' ').nth(1), Some("200"), "{head:?}: {raw}");
        }
    }
    p.stop().await;
}

/// Over HTTP/2 (h2c, as a tool may speak it: a browser speaks HTTP/2 over TLS only),
/// the host is the request's `:authority`: one naming another host is refused as its
/// `Host` would be, and so is a `host` header naming another beside an `:authority`
/// naming this one; an `:authority` naming this host is answered.
#[tokio::test]
async fn over_http2_the_authority_is_held_to_the_names_of_this_host() {
    use hyper_util::rt::TokioIo;
    let p = start(None).await;
    let port = p.admin.port();
    let stream = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let evil = format!("evil.example:{port}");
    let here = format!("127.0.0.1:{port}");
    for (authority, host, status) in [
        (&evil, None, 403),
        (&here, Some(evil.as_str()), 403),
        (&here, None, 200),
        (&format!("localhost:{port}"), None, 200),
    ] {
        let mut request = http::Request::get(format!("http://{authority}/admin/routes"))
            .version(http::Version::HTTP_2);
        if let Some(host) = host {
            request = request.header("host", host);
        }
        let request = request.body(Full::<bytes::Bytes>::default()).unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), sender.send_request(request))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.status().as_u16(), status, "{authority} {host:?}");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        if status == 403 {
            let body: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                body["errors"][0],
                foreign_host(&evil),
                "{authority} {host:?}"
            );
        }
    }
    drop(sender);
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    p.stop().await;
}

/// A health check from loopback is answered whatever its `Host`: Envoy's names the
/// cluster checked (`rocgate_admin`) unless told another, and a check by HAProxy or
/// nginx on the host may send the site's name. Refused, a front proxy or sidecar on
/// the host took rocgate for down and sent its clients nowhere; `/healthz` and
/// `/readyz` tell a page re-bound to 127.0.0.1 only that rocgate is up and ready.
/// Every other endpoint still refuses that `Host` (see above).
#[tokio::test]
async fn a_health_check_from_loopback_is_answered_whatever_its_host() {
    let p = start(None).await;
    for host in ["rocgate_admin", "shop.example:443", "evil.example"] {
        for (path, answer) in [("/healthz", "ok"), ("/readyz", "ready")] {
            for method in ["GET", "HEAD"] {
                let (status, body) =
                    call_with(p.admin, method, path, Vec::new(), &[("host", host)]).await;
                assert_eq!(status, 200, "{method} {path} with Host {host}: {body}");
                if method == "GET" {
                    assert_eq!(body, answer, "{path} with Host {host}");
                }
            }
        }
        let (status, _) = call_with(
            p.admin,
            "GET",
            "/admin/routes",
            Vec::new(),
            &[("host", host)],
        )
        .await;
        assert_eq!(status, 403, "{host}");
    }
    p.stop().await;
}

/// With a token set, a request from loopback that carries it is answered whatever its
/// `Host`: a page does not have it, and a tool sending it through a forwarder on the
/// host that passes its own `Host` on keeps working. Without it, or with another, the
/// refusal says the token would do.
#[tokio::test]
async fn the_token_answers_a_request_whatever_its_host() {
    let p = start(Some("s3cret")).await;
    let host = ("host", "admin.example.com");
    for (authorization, status) in [
        (None, 403),
        (Some("Bearer wrong"), 403),
        (Some("Bearer s3cret"), 200),
    ] {
        let headers: Vec<_> = [host]
            .into_iter()
            .chain(authorization.map(|a| ("authorization", a)))
            .collect();
        let (got, answer) = call_with(p.admin, "GET", "/admin/routes", Vec::new(), &headers).await;
        assert_eq!(got, status, "{authorization:?}: {answer}");
        if status == 403 {
            assert_eq!(
                answer["errors"][0],
                format!(
                    "{}, or a request with the bearer token",
                    foreign_host("admin.example.com")
                )
            );
        }
    }
    p.stop().await;
}

/// A request refused for its `Host` is logged at `WARN` with the caller's address, the
/// path, the status and the host, at most one line a second (the proxy's clock), its
/// `refused` counting those since the line before, as a refused change is, and apart
/// from the refused changes: a page reading in a loop hides none of those.
#[tokio::test]
async fn a_request_refused_for_its_host_is_logged_once_a_second() {
    let (log, _guard) = Captured::on_this_thread();
    let clock = Arc::new(ManualClock::new());
    let (p, _) = start_on(None, CONFIG, Some(clock.clone())).await;
    let evil = [("host", "evil.example")];
    for path in ["/admin/routes", "/admin/store", "/metrics"] {
        assert_eq!(
            call_with(p.admin, "GET", path, Vec::new(), &evil).await.0,
            403
        );
    }
    let (status, _) = call_from_page(p.admin, "POST", "/admin/reload", "").await;
    assert_eq!(status, 403);
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        call_with(p.admin, "GET", "/admin/hints", Vec::new(), &evil)
            .await
            .0,
        403
    );
    p.stop().await;
    let refused = log.lines_with("admin request refused");
    assert_eq!(refused.len(), 2, "{refused:#?}");
    for (line, (path, count)) in refused
        .iter()
        .zip([("/admin/routes", 1), ("/admin/hints", 3)])
    {
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains("peer=127.0.0.1"), "{line}");
        assert!(line.contains(&format!("path=\"{path}\"")), "{line}");
        assert!(
            line.contains(&format!("status=403 refused={count}")),
            "{line}"
        );
        assert!(line.contains(&foreign_host("evil.example")), "{line}");
    }
    assert_eq!(log.lines_with("admin change refused").len(), 1);
}

#[tokio::test]
async fn a_scheduled_event_takes_effect_at_its_wall_clock_time() {
    #[allow(clippy::disallowed_methods)] // the event is placed relative to the real wall clock
    let started = std::time::SystemTime::now() - Duration::from_secs(5);
    let config = format!(
        "{CONFIG}\n[[routes.events]]\nname = \"sale\"\nstart = \"{}\"\nduration = \"1h\"\nbase_limit = 700\ncut_limit = 200\n",
        humantime::format_rfc3339_seconds(started)
    );
    let p = start(None).await;
    std::fs::write(&p.file, config).unwrap();
    assert_eq!(
        call(p.admin, "POST", "/admin/reload", "", None).await.0,
        200
    );
    // The event is in force from the first slot the route sees after its start.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let req = http::Request::get(format!("http://{}/anything", p.listen))
        .body(Full::default())
        .unwrap();
    let _ = tokio::time::timeout(Duration::from_secs(5), client.request(req)).await;
    let (_, rest) = call(p.admin, "GET", "/admin/routes/rest", "", None).await;
    assert_eq!(rest["active_event"], "sale");
    assert_eq!(rest["base_limit_rps"], 700.0);
    assert_eq!(rest["cut_limit_rps"], 200.0);
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert!(order["active_event"].is_null());
    p.stop().await;
}

/// A manual clock whose next reading, once armed, waits until released: it holds a
/// runtime change between its read of the route and its write.
#[derive(Default)]
struct GateClock {
    time: ManualClock,
    gate: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl Clock for GateClock {
    fn now(&self) -> Nanos {
        let armed = self.gate.lock().unwrap().take();
        if let Some((entered, release)) = armed {
            let _ = entered.send(());
            let _ = release.recv_timeout(Duration::from_secs(10));
        }
        self.time.now()
    }
}

impl GateClock {
    /// Arms the gate: returns what tells that a reading waits, and what releases it.
    fn arm(&self) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
        let (entered, waiting) = mpsc::channel();
        let (release, released) = mpsc::channel();
        *self.gate.lock().unwrap() = Some((entered, released));
        (waiting, release)
    }
}

/// [`CONFIG`] with two problems: route `rest`'s cut above its lowered base, and a
/// window of 65 slots.
fn two_problems_config() -> String {
    CONFIG
        .replace("base_limit = 1000", "base_limit = 100")
        .replace("cut_limit = 300", "cut_limit = 300\nwindow = \"6500ms\"")
}

/// The config of the race tests: no hints tick (the first, at start, aside) to take
/// the gate.
fn gated_config(danger_roc: u32) -> String {
    format!(
        "[hints]\ninterval = \"1h\"\nkeep = \"2h\"\n{}",
        CONFIG.replace(
            "path = \"/api/order\"",
            &format!("path = \"/api/order\"\ndanger_roc = {danger_roc}"),
        )
    )
}

/// Starts a PUT of `body` to the order route and waits until it holds the gate.
async fn gated_put(
    clock: &GateClock,
    admin: SocketAddr,
    body: &'static str,
) -> (tokio::task::JoinHandle<(u16, Value)>, mpsc::Sender<()>) {
    // A request served first: the ticker's reading at start is behind us.
    assert_eq!(call(admin, "GET", "/healthz", "", None).await.0, 200);
    let (waiting, release) = clock.arm();
    let put =
        tokio::spawn(async move { call(admin, "PUT", "/admin/routes/order", body, None).await });
    tokio::task::spawn_blocking(move || waiting.recv_timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .expect("the change reads the clock");
    (put, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_during_a_runtime_change_is_not_undone_by_it() {
    let clock = Arc::new(GateClock::default());
    let (p, reloader) = start_on(None, &gated_config(80), Some(clock.clone())).await;
    let (put, release) = gated_put(&clock, p.admin, r#"{"base_limit": 300}"#).await;
    // A reload while the change holds what it read: the file moves danger_roc.
    std::fs::write(&p.file, gated_config(90)).unwrap();
    let (done, reloaded) = mpsc::channel();
    let reload = std::thread::spawn(move || {
        let result = reloader.reload().map(|_| ()).map_err(|e| e.to_string());
        done.send(result).unwrap()
    });
    // Give a reload that does not wait for the change the time to finish inside it.
    let early = reloaded.recv_timeout(Duration::from_millis(300));
    release.send(()).unwrap();
    let (status, body) = put.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base_limit_rps"], 300.0);
    let result = early.or_else(|_| reloaded.recv_timeout(Duration::from_secs(10)));
    assert_eq!(result.expect("the reload ends"), Ok(()));
    reload.join().unwrap();
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(
        order["danger_roc"], 90.0,
        "the reloaded file's danger_roc is in force, not the one the change read before it"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_runtime_changes_at_once_both_land() {
    let clock = Arc::new(GateClock::default());
    let (p, _) = start_on(None, &gated_config(80), Some(clock.clone())).await;
    let (first, release) = gated_put(&clock, p.admin, r#"{"base_limit": 300}"#).await;
    let admin = p.admin;
    let mut second =
        tokio::spawn(async move { change_order(admin, r#"{"danger_roc": 90}"#).await });
    // Give a change that does not wait for the first the time to finish inside it.
    let early = tokio::time::timeout(Duration::from_millis(300), &mut second).await;
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().0, 200);
    let (status, body) = match early {
        Ok(done) => done.unwrap(),
        Err(_) => second.await.unwrap(),
    };
    assert_eq!(status, 200, "{body}");
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 300.0);
    assert_eq!(order["danger_roc"], 90.0, "the second change is not lost");
    p.stop().await;
}

/// Puts `change` on route `order` and checks that it is refused as no change (400:
/// the body is not a JSON object of the change's fields, each of its JSON type) with
/// exactly `errors`, and that the route is left as it was.
async fn malformed_on_order(admin: SocketAddr, change: &str, errors: &[&str]) {
    let (status, body) = change_order(admin, change).await;
    assert_eq!(status, 400, "{change}: {body}");
    assert_eq!(body["errors"], serde_json::json!(errors), "{change}");
    let (_, order) = call(admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 200.0, "{change}: {order}");
    assert_eq!(order["runtime_change"], false, "{change}: {order}");
}

/// JSON has numbers: a number written as a string (`"300"`, a script that quoted what
/// it should not) is refused (400), naming the field and what it takes, every such
/// field listed. It was taken as the number, because the change was read by the
/// file's rules, which take text for the environment's overrides.
#[tokio::test]
async fn a_number_written_as_a_string_is_refused_naming_the_field() {
    let p = start(None).await;
    malformed_on_order(
        p.admin,
        r#"{"base_limit": "300"}"#,
        &[r#"PUT /admin/routes/order: base_limit: must be a number, got the string "300" (write it without quotes: 300)"#],
    )
    .await;
    malformed_on_order(
        p.admin,
        r#"{"cut_limit": "50", "min_samples": " 7", "danger_roc": "high"}"#,
        &[
            r#"PUT /admin/routes/order: cut_limit: must be a number, got the string "50" (write it without quotes: 50)"#,
            r#"PUT /admin/routes/order: min_samples: must be a whole number ≥ 0, got the string " 7" (write it without quotes: 7)"#,
            r#"PUT /admin/routes/order: danger_roc: must be a number, got the string "high""#,
        ],
    )
    .await;
    malformed_on_order(
        p.admin,
        r#"{"base_limit": true, "roc_mode": 1}"#,
        &[
            "PUT /admin/routes/order: base_limit: invalid type: boolean `true`, expected a number",
            "PUT /admin/routes/order: roc_mode: invalid type: integer `1`, expected a string",
        ],
    )
    .await;
    p.stop().await;
}

/// A body of thousands of unknown fields is answered with the first 50 problems and a
/// line saying more follow: each was listed, about 250 bytes apiece, so that a 64 KiB
/// body drew an answer of megabytes.
#[tokio::test]
async fn a_change_of_thousands_of_problems_is_answered_with_the_first_50() {
    let p = start(None).await;
    let fields: Vec<String> = (0..5000).map(|i| format!("\"f{i}\":1")).collect();
    let body = format!("{{{}}}", fields.join(","));
    assert!(body.len() < 64 << 10);
    let (status, reply) = change_order(p.admin, &body).await;
    assert_eq!(status, 400);
    let errors = reply["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 51, "{}", errors.len());
    assert!(errors[0]
        .as_str()
        .unwrap()
        .starts_with("PUT /admin/routes/order: f0: unknown field `f0`"));
    assert_eq!(
        errors[50],
        "PUT /admin/routes/order: more problems follow: the first 50 are reported"
    );
    p.stop().await;
}

/// A field given twice is refused naming it (which of the two a JSON reader keeps is
/// its own choice): it was ``duplicate field `base_limit` at line 1 column 37``,
/// with no field path where every other problem of a change has one.
#[tokio::test]
async fn a_field_given_twice_is_refused_naming_it() {
    let p = start(None).await;
    malformed_on_order(
        p.admin,
        r#"{"base_limit": 300, "hold": "5s", "base_limit": 400, "base_limit": 1}"#,
        &["PUT /admin/routes/order: base_limit: given 3 times: a change gives each field once"],
    )
    .await;
    malformed_on_order(
        p.admin,
        r#"{"hold": "5s", "hold": "5s", "window": "1s", "cut_limit": "5"}"#,
        &[
            "PUT /admin/routes/order: hold: given 2 times: a change gives each field once",
            "PUT /admin/routes/order: window: unknown field `window`, expected one of `base_limit`, `cut_limit`, `danger_roc`, `safe_roc`, `hold`, `restore_step`, `restore_interval`, `min_rps`, `min_samples`, `min_dwell`, `max_cut`, `roc_mode`",
            r#"PUT /admin/routes/order: cut_limit: must be a number, got the string "5" (write it without quotes: 5)"#,
        ],
    )
    .await;
    p.stop().await;
}

/// Odd values of the right type: each is answered, none is taken where the file
/// would refuse it, and none takes the server down.
#[tokio::test]
async fn odd_numbers_in_a_change_are_refused_or_taken_as_the_file_would() {
    let p = start(None).await;
    for (change, status, says) in [
        (
            r#"{"base_limit": 1e400}"#,
            400,
            r#"base_limit: number out of range, got \"1e400\": past the largest number held"#,
        ),
        (
            r#"{"min_rps": -1E+999}"#,
            400,
            r#"min_rps: number out of range, got \"-1E+999\": past the largest number held"#,
        ),
        (
            r#"{"min_rps": 1e-400}"#,
            400,
            r#"min_rps: number out of range, got \"1e-400\": nearer 0 than any number held"#,
        ),
        (
            r#"{"base_limit": -0}"#,
            422,
            "base_limit: must be a number > 0, got -0",
        ),
        (
            r#"{"base_limit": -5}"#,
            422,
            "base_limit: must be a number > 0, got -5",
        ),
        (
            r#"{"min_samples": 2.5}"#,
            422,
            "min_samples: invalid value: floating point `2.5`, expected a whole number ≥ 0",
        ),
        (
            r#"{"min_samples": -1}"#,
            422,
            "min_samples: invalid value: integer `-1`, expected a whole number ≥ 0",
        ),
        (
            r#"{"base_limit": {"a": [1]}}"#,
            400,
            "base_limit: invalid type: map, expected a number",
        ),
        ("{}  {}", 400, "trailing characters at line 1 column 5"),
        ("", 400, "must be a JSON object"),
    ] {
        let (got, body) = change_order(p.admin, change).await;
        assert_eq!(got, status, "{change}: {body}");
        let said = body["errors"].to_string();
        assert!(said.contains(says), "{change}: {said}");
    }
    let (status, body) = change_order(p.admin, r#"{"base_limit": 250.5}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["base_limit_rps"], 250.5, "{body}");
    p.stop().await;
}

/// A route path naming no route is 404 naming it, quoted by its first 64 characters
/// and its length when longer, as every value a refusal quotes: a name of 5,000
/// characters was echoed whole, by `GET`, `PUT` and `DELETE` alike.
#[tokio::test]
async fn a_route_path_naming_no_route_is_quoted_bounded() {
    let p = start(None).await;
    let long = "x".repeat(5000);
    for (method, path, change) in [
        ("GET", format!("/admin/routes/{long}"), ""),
        ("PUT", format!("/admin/routes/{long}"), "{}"),
        ("DELETE", format!("/admin/routes/{long}/change"), ""),
    ] {
        let (status, body) = call(p.admin, method, &path, change, None).await;
        assert_eq!(status, 404, "{method}");
        assert_eq!(
            body["errors"],
            serde_json::json!([format!("no route named \"{}\"… (5000 bytes)", &long[..64])]),
            "{method}"
        );
    }
    // Cut between characters, not inside a two-byte one.
    let (status, body) = call(
        p.admin,
        "GET",
        &format!("/admin/routes/x{}", "%C3%A9".repeat(100)),
        "",
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        body["errors"],
        serde_json::json!([format!(
            "no route named \"x{}\"… (201 bytes)",
            "é".repeat(63)
        )])
    );
    let (status, body) = call(p.admin, "GET", "/admin/routes/n%0Ape", "", None).await;
    assert_eq!(status, 404);
    assert_eq!(
        body["errors"],
        serde_json::json!(["no route named \"n\\npe\""])
    );
    p.stop().await;
}

#[tokio::test]
async fn a_change_is_a_json_object_and_nothing_else() {
    let p = start(None).await;
    // serde reads a struct from an array too: `[500]` was base_limit = 500.
    for body in ["[500]", "[500, 100]", "500", "\"x\"", "null"] {
        let (status, reply) = call(p.admin, "PUT", "/admin/routes/order", body, None).await;
        assert_eq!(status, 400, "{body}: {reply}");
        let error = reply["errors"][0].as_str().unwrap_or_default();
        assert!(error.contains("must be a JSON object"), "{body}: {reply}");
    }
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 200.0, "no change was applied");
    // A byte order mark in front of the object is no part of it (it was refused as
    // no JSON object).
    let body = "\u{feff}{\"base_limit\": 300}";
    let (status, reply) = call(p.admin, "PUT", "/admin/routes/order", body, None).await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["base_limit_rps"], 300.0, "{reply}");
    p.stop().await;
}

/// A body cut short is refused with the parser's line and column and no field path:
/// the answer read `PUT /admin/routes/order: ?: EOF while parsing an object`, the `?`
/// where a field's name goes.
#[tokio::test]
async fn a_change_cut_short_names_where_the_text_ends() {
    let p = start(None).await;
    for (body, says) in [
        (
            r#"{"base_limit": 300"#,
            "PUT /admin/routes/order: EOF while parsing an object at line 1 column 18",
        ),
        (
            r#"{"base_limit": 300,"#,
            "PUT /admin/routes/order: EOF while parsing a value at line 1 column 19",
        ),
        (
            r#"{"base_limit": "#,
            "PUT /admin/routes/order: base_limit: EOF while parsing a value at line 1 column 15",
        ),
    ] {
        let (status, reply) = call(p.admin, "PUT", "/admin/routes/order", body, None).await;
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["errors"][0], says, "{body}: {reply}");
    }
    p.stop().await;
}

#[tokio::test]
async fn the_token_is_checked_before_the_body_is_read() {
    let p = start(Some("s3cret")).await;
    let path = "/admin/routes/order";
    // Neither a body that is not text nor one too large tells an unauthorized client
    // anything but 401.
    let not_utf8 = vec![b'{', 0xff, b'}'];
    let (status, _) = call_raw(p.admin, "PUT", path, not_utf8.clone(), None).await;
    assert_eq!(status, 401);
    // Over the 64 KiB the admin API reads, and small enough to be sent whole before
    // the answer comes.
    let huge = vec![b' '; (64 << 10) + 100];
    let (status, _) = call_raw(p.admin, "PUT", path, huge.clone(), None).await;
    assert_eq!(status, 401);
    // With the token, each is refused in the API's own shape, naming the body.
    let bearer = Some("Bearer s3cret");
    let (status, reply) = call_raw(p.admin, "PUT", path, not_utf8, bearer).await;
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["errors"][0]
            .as_str()
            .unwrap()
            .contains("body: not UTF-8"),
        "{reply}"
    );
    let (status, reply) = call_raw(p.admin, "PUT", path, huge, bearer).await;
    assert_eq!(status, 413, "{reply}");
    assert!(
        reply["errors"][0]
            .as_str()
            .unwrap()
            .contains("body: larger than"),
        "{reply}"
    );
    p.stop().await;
}

/// A change whose `Content-Length` is past the 64 KiB the admin API reads is refused
/// with 413 as soon as its head is read, naming the body's size. It waited for a body
/// that would be refused anyway, and answered 408 (`not received within 10s`) after
/// holding the connection for 10 s when the client waited for the answer first.
#[tokio::test]
async fn a_change_declaring_a_body_too_large_is_refused_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = start(None).await;
    let mut stream = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    let head = format!(
        "PUT /admin/routes/order HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n\r\n{{}}",
        (64 << 10) + 1
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Past the 10 s the body timeout took: the status tells the two apart.
    tokio::time::timeout(Duration::from_secs(30), async {
        while !answer.ends_with(b"}") {
            match stream.read(&mut buf).await {
                Ok(n) if n > 0 => answer.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
    })
    .await
    .expect("an answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("body: larger than 65536 bytes"), "{answer}");
    p.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    // RFC 9110 §11.1: an authentication scheme is matched case-insensitively.
    let p = start(Some("s3cret")).await;
    for header in [
        "Bearer s3cret",
        "bearer s3cret",
        "BEARER s3cret",
        "Bearer  s3cret",
    ] {
        let (status, reply) =
            call_raw(p.admin, "POST", "/admin/reload", Vec::new(), Some(header)).await;
        assert_eq!(status, 200, "{header}: {reply}");
    }
    for header in [
        "Bearer s3cre",
        "Bearer s3crett",
        "Basic s3cret",
        "Bearers3cret",
        "s3cret",
        "Bearer",
    ] {
        let (status, _) =
            call_raw(p.admin, "POST", "/admin/reload", Vec::new(), Some(header)).await;
        assert_eq!(status, 401, "{header}");
    }
    p.stop().await;
}

#[tokio::test]
async fn a_hints_query_with_an_unknown_or_repeated_field_is_refused() {
    let p = start(None).await;
    for query in [
        "perod=1h",
        "period=1h&period=2h",
        "period=0s",
        "period=99999999999999999999y",
    ] {
        let (status, reply) =
            call(p.admin, "GET", &format!("/admin/hints?{query}"), "", None).await;
        assert_eq!(status, 400, "{query}: {reply}");
        assert!(
            reply["errors"][0].is_string(),
            "{query}: errors in the API's shape: {reply}"
        );
    }
    // Each says what is wrong: axum's "Failed to deserialize query string: …" named
    // the query, and a zero period was "must be a duration such as \"15m\"".
    for (query, error) in [
        (
            "perod=1h",
            "query: perod: unknown field `perod`, expected `period`",
        ),
        ("period=1h&period=2h", "query: duplicate field `period`"),
        ("period=0s", "period: must be longer than zero, got \"0s\""),
        (
            "period=soon",
            "period: must be a duration such as \"15m\" or \"1h\", got \"soon\"",
        ),
    ] {
        let (_, reply) = call(p.admin, "GET", &format!("/admin/hints?{query}"), "", None).await;
        assert_eq!(reply, serde_json::json!({ "errors": [error] }), "{query}");
    }
    assert_eq!(
        call(p.admin, "GET", "/admin/hints?period=1h", "", None)
            .await
            .0,
        200
    );
    p.stop().await;
}

/// A withdrawal and a reload take no body: one is refused with 400, naming what it got
/// and what the endpoint does, and nothing is changed. The body was ignored, so that
/// `curl -X POST -d @new.toml …/admin/reload`, meant to send a config, reloaded the
/// file on disk instead. An empty body, or one of whitespace alone, is none.
#[tokio::test]
async fn a_withdrawal_or_reload_with_a_body_is_refused_and_changes_nothing() {
    let p = start(None).await;
    let (status, _) = change_order(p.admin, r#"{"base_limit": 300}"#).await;
    assert_eq!(status, 200);
    std::fs::write(
        &p.file,
        CONFIG.replace("base_limit = 1000", "base_limit = 800"),
    )
    .unwrap();
    for (method, path, says) in [
        (
            "DELETE",
            "/admin/routes/order/change",
            "body: DELETE /admin/routes/order/change takes none, got 14 bytes: nothing was changed",
        ),
        (
            "POST",
            "/admin/reload",
            "body: POST /admin/reload takes none, got 14 bytes: nothing was changed (a reload reads the config file again)",
        ),
    ] {
        let (status, reply) = call(p.admin, method, path, "base_limit=100", None).await;
        assert_eq!(status, 400, "{method} {path}: {reply}");
        assert_eq!(reply["errors"], serde_json::json!([says]), "{method} {path}");
    }
    let (_, all) = call(p.admin, "GET", "/admin/routes", "", None).await;
    assert_eq!(route(&all, "order")["runtime_change"], true, "{all}");
    assert_eq!(route(&all, "rest")["base_limit_rps"], 1000.0, "{all}");
    for (method, path) in [
        ("POST", "/admin/reload"),
        ("DELETE", "/admin/routes/order/change"),
    ] {
        let (status, reply) = call(p.admin, method, path, " \n", None).await;
        assert_eq!(status, 200, "{method} {path}: {reply}");
    }
    p.stop().await;
}

/// A withdrawal or reload whose body is larger than a change's may be, or is not
/// UTF-8, is refused as carrying a body (400), saying that it takes none: it was 413,
/// ``body: larger than 65536 bytes``, or ``body: not UTF-8``, as if a smaller body or
/// one of text would have done (`curl -X POST --data-binary @big.toml …/admin/reload`).
#[tokio::test]
async fn a_withdrawal_or_reload_with_a_large_or_binary_body_is_refused_as_taking_none() {
    let p = start(None).await;
    let (status, _) = change_order(p.admin, r#"{"base_limit": 300}"#).await;
    assert_eq!(status, 200);
    let large = vec![b'x'; 100 << 10];
    for (method, path, body, says) in [
        (
            "POST",
            "/admin/reload",
            large.clone(),
            "body: POST /admin/reload takes none, got more than 65536 bytes: nothing was \
             changed (a reload reads the config file again)",
        ),
        (
            "DELETE",
            "/admin/routes/order/change",
            large,
            "body: DELETE /admin/routes/order/change takes none, got more than 65536 bytes: \
             nothing was changed",
        ),
        (
            "DELETE",
            "/admin/routes/order/change",
            vec![0xff, 0xfe, b' '],
            "body: DELETE /admin/routes/order/change takes none, got 3 bytes: nothing was \
             changed",
        ),
    ] {
        let (status, reply) = call_raw(p.admin, method, path, body, None).await;
        assert_eq!(status, 400, "{method} {path}: {reply}");
        assert_eq!(
            reply["errors"],
            serde_json::json!([says]),
            "{method} {path}"
        );
    }
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["runtime_change"], true, "{order}");
    p.stop().await;
}

/// A change, its withdrawal and a reload take no query: each is refused with 400,
/// naming the query, and nothing is changed. The query was ignored, so that
/// `PUT /admin/routes/order?dry_run=1` changed the limit it meant to try.
#[tokio::test]
async fn a_change_with_a_query_is_refused_and_changes_nothing() {
    let p = start(None).await;
    let base = |state: &Value| state["base_limit_rps"].clone();
    let before = call(p.admin, "GET", "/admin/routes/order", "", None)
        .await
        .1;
    for (method, path, body) in [
        (
            "PUT",
            "/admin/routes/order?dry_run=1",
            r#"{"base_limit": 300}"#,
        ),
        ("DELETE", "/admin/routes/order/change?all", ""),
        ("POST", "/admin/reload?dry_run=true", ""),
    ] {
        let (status, reply) = call(p.admin, method, path, body, None).await;
        assert_eq!(status, 400, "{method} {path}: {reply}");
        let error = reply["errors"][0].as_str().unwrap_or_default();
        let query = path.split_once('?').unwrap().1;
        assert!(
            error.starts_with("query: ") && error.contains(&format!("{query:?}")),
            "{method} {path}: {reply}"
        );
    }
    let after = call(p.admin, "GET", "/admin/routes/order", "", None)
        .await
        .1;
    assert_eq!(base(&after), base(&before));
    assert_eq!(after["runtime_change"], false);
    // Without one, the same change is made.
    let (status, _) = change_order(p.admin, r#"{"base_limit": 300}"#).await;
    assert_eq!(status, 200);
    p.stop().await;
}

/// Every refusal is `{"errors": […]}`, those of the router too: an unknown path or a
/// method an endpoint does not take was an empty body.
#[tokio::test]
async fn an_unknown_path_or_method_is_refused_with_errors() {
    let p = start(None).await;
    for (method, path, status) in [
        ("GET", "/admin/nothing", 404),
        ("GET", "/", 404),
        ("GET", "/admin/reload", 405),
        ("DELETE", "/admin/routes/order", 405),
        ("POST", "/metrics", 405),
    ] {
        let (got, reply) = call(p.admin, method, path, "", None).await;
        assert_eq!(got, status, "{method} {path}: {reply}");
        let error = reply["errors"][0].as_str().unwrap_or_default();
        assert!(error.contains(path), "{method} {path}: {reply}");
    }
    // A route name that is no text (`%FF`) was refused in axum's plain text, then in
    // axum's words, "route name: Invalid URL: Invalid UTF-8 in `name`".
    for method in ["GET", "PUT", "DELETE"] {
        let path = if method == "DELETE" {
            "/admin/routes/%FF/change"
        } else {
            "/admin/routes/%FF"
        };
        let (got, reply) = call(p.admin, method, path, "{}", None).await;
        assert_eq!(got, 400, "{method} {path}: {reply}");
        assert_eq!(
            reply["errors"][0],
            "route name: not UTF-8 once percent-decoded (a route's name is text)",
            "{method} {path}"
        );
    }
    // A 405 still says which methods the endpoint takes.
    let raw = raw_admin(
        p.admin,
        b"GET /admin/reload HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        raw.to_ascii_lowercase().contains("\r\nallow: post\r\n"),
        "{raw}"
    );
    p.stop().await;
}

/// Writes `request` to the admin API and reads the answer until it closes.
async fn raw_admin(admin: SocketAddr, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The admin listener bounds a request head's time by `header_read_timeout`, as the
/// proxy's does: it had no timeout, so connections that send nothing, or drip a head,
/// were held open for ever, each a file descriptor of the process the proxy accepts
/// with (the admin API is often opened to a Prometheus on another host).
#[tokio::test]
async fn an_admin_connection_silent_or_dripping_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = start(None).await;
    // header_read_timeout is 2 s: closed well within 8.
    let closed = |mut stream: tokio::net::TcpStream| async move {
        let mut buf = [0u8; 1024];
        let ended = tokio::time::timeout(Duration::from_secs(8), async {
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        })
        .await;
        ended.is_ok()
    };
    let silent = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    assert!(closed(silent).await, "a silent connection was kept open");
    let mut dripping = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    dripping
        .write_all(b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let drip = tokio::spawn(async move {
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if dripping.write_all(b"x-drip: 1\r\n").await.is_err() {
                break;
            }
        }
        dripping
    });
    let dripping = drip.await.unwrap();
    assert!(closed(dripping).await, "a dripping head was kept open");
    // The admin API still answers.
    let (status, _) = call(p.admin, "GET", "/healthz", "", None).await;
    assert_eq!(status, 200);
    p.stop().await;
}

/// Asks `/healthz` on an open admin connection and reads its answer, which must come
/// within `within` and before the connection closes.
async fn healthz_on(stream: &mut tokio::net::TcpStream, within: Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = tokio::time::timeout(within, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no answer within {within:?}"))
            .unwrap();
        assert_ne!(n, 0, "closed before its answer: {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// An admin connection idle between requests past `header_read_timeout` serves its
/// next request, as the proxy's connections do: the wait for the next request is
/// `idle_timeout`'s. It was closed at `header_read_timeout`, and a client that pooled
/// it longer (a Prometheus scraping every 15 s) reused it just as it closed.
#[tokio::test]
async fn an_admin_connection_idle_past_header_read_timeout_serves_its_next_request() {
    let p = start(None).await;
    let mut stream = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    healthz_on(&mut stream, Duration::from_secs(5)).await;
    // header_read_timeout is 2 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    healthz_on(&mut stream, Duration::from_secs(5)).await;
    p.stop().await;
}

/// With every admin place held by an idle keep-alive connection (a scraper that pools
/// many), a new connection is served at once: the idle one longest is closed to make
/// room, as the proxy's are, not after `idle_timeout` (75 s), long enough for a
/// liveness probe on `/healthz` to fail; before `idle_timeout` held them, such a
/// connection closed at `header_read_timeout`. The one closed sees a clean end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_connection_at_the_cap_is_served_while_the_others_idle() {
    use tokio::io::AsyncReadExt;
    async fn healthz(stream: &mut tokio::net::TcpStream) {
        healthz_on(stream, Duration::from_secs(1)).await;
    }
    let p = start(None).await;
    let max = 256;
    let mut idle = Vec::new();
    for _ in 0..max {
        let mut stream = tokio::net::TcpStream::connect(p.admin).await.unwrap();
        healthz(&mut stream).await;
        idle.push(stream);
    }
    let mut fresh = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    healthz(&mut fresh).await;
    // The oldest was closed for it, after its answer: it reads the end.
    let mut buf = [0u8; 16];
    let end = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut buf)).await;
    assert!(matches!(end, Ok(Ok(0))), "a clean end: {end:?}");
    // Counted apart from the proxy's client connections (the scrape's own connection,
    // at the cap too, may have closed one more).
    let text = metrics_text(p.admin).await;
    let reclaimed = text
        .lines()
        .find_map(|l| l.strip_prefix("rocgate_admin_connections_reclaimed_total "))
        .and_then(|v| v.parse::<f64>().ok());
    assert!(reclaimed.is_some_and(|n| n >= 1.0), "{text}");
    assert!(
        text.contains("\nrocgate_client_connections_reclaimed_total 0\n"),
        "{text}"
    );
    p.stop().await;
}

/// A route left silent in a cut reads where its controller stands now, in the admin
/// API and in `/metrics`, without waiting for the periodic upkeep.
#[tokio::test]
async fn a_silent_route_reads_where_it_stands_now() {
    let clock = Arc::new(ManualClock::new());
    let (p, reloader) = start_on(None, CONFIG, Some(clock.clone())).await;
    let engine = reloader.engine();
    let id = engine.route_id("order").unwrap();
    // 40 req/s for two windows, then 600 req/s: the spike cuts the route.
    let mut at = Nanos::ZERO;
    for (rate, secs) in [(40, 12), (600, 3)] {
        for _ in 0..rate * secs {
            at = Nanos::from_secs_f64(at.as_secs_f64() + 1.0 / f64::from(rate));
            let _ = engine.check(id, rocgate::engine::Key::None, at);
        }
    }
    clock.set(at);
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["state"], "cut", "{order}");

    // Silence far past the cut's end: no request steps the route.
    clock.set(Nanos::from_secs(600));
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["state"], "normal", "{order}");
    assert_eq!(order["limit_rps"], 200.0, "{order}");
    clock.set(Nanos::from_secs(1200));
    let (_, all) = call(p.admin, "GET", "/admin/routes", "", None).await;
    assert_eq!(route(&all, "order")["state"], "normal", "{all}");
    let text = metrics_text(p.admin).await;
    assert!(
        text.contains(r#"rocgate_limit_rps{route="order"} 200"#),
        "{text}"
    );
    p.stop().await;
}

/// A refused reload answers `{"errors": [...]}`: one string for each problem of the
/// file, prefixed with its path, in the order found; a proxy started without a file
/// answers the one reason.
#[tokio::test]
async fn a_refused_reload_answers_each_problem_as_a_string() {
    let p = start(None).await;
    let broken = two_problems_config();
    std::fs::write(&p.file, broken).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 422);
    let file = p.file.display();
    let expected = serde_json::json!({ "errors": [
        format!("{file}: routes[1].window: window must hold an even number of at least 4 slots, got 65"),
        format!("{file}: routes[1].cut_limit: must be ≤ base_limit (100), got 300"),
    ]});
    assert_eq!(body, expected);
    p.stop().await;

    // Nothing to reload is no invalid file: 409 (it was a 422).
    let (p, _) = start_from(None, CONFIG, None, false).await;
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 409);
    let expected = serde_json::json!({ "errors": [
        "no config file to reload: rocgate was started with the embedded default",
    ]});
    assert_eq!(body, expected);
    p.stop().await;
}

/// What a caller needs of an error type: to hold it in a `Box<dyn Error + Send + Sync>`
/// (across threads and tasks, as `anyhow` does) and to look through its sources.
fn is_an_error<E: std::error::Error + Send + Sync + 'static>() {}

/// A refused reload is a [`ReloadError`] a caller can match on, whichever way it was
/// asked for, and its `Display` is the message the admin API shows.
#[tokio::test]
async fn a_refused_reload_is_an_error_to_match_on() {
    is_an_error::<ReloadError>();
    let (p, reloader) = start_from(None, CONFIG, None, false).await;
    let e = reloader.reload().unwrap_err();
    assert!(matches!(e, ReloadError::NoConfigFile), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no config file to reload: rocgate was started with the embedded default"
    );
    assert!(std::error::Error::source(&e).is_none());
    p.stop().await;

    let (p, reloader) = start_on(None, CONFIG, None).await;
    std::fs::write(
        &p.file,
        CONFIG.replace("cut_limit = 300", "cut_limit = 3000"),
    )
    .unwrap();
    let e = reloader.reload_async().await.unwrap_err();
    let ReloadError::Config(config) = &e else {
        panic!("a refused file is a ConfigError: {e:?}");
    };
    assert_eq!(config.origin(), p.file.display().to_string());
    let problems: Vec<_> = config.problems().iter().map(|p| p.location()).collect();
    assert_eq!(problems, ["routes[1].cut_limit"]);
    assert_eq!(e.to_string(), config.to_string());
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(e);
    assert!(boxed.downcast_ref::<ReloadError>().is_some());
    p.stop().await;
}

/// A reload that brings an event already running has no edge ahead to end the
/// interval at: the open one went on under the route's own profile until the event's
/// end (or the next regular tick), and the event got no part of the history. The
/// hints timer, looking every second, now ends the interval within about a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_brings_a_running_event_starts_its_part_of_the_history() {
    let route = "[[routes]]\nname = \"edge_reload\"\npath_prefix = \"/\"\n";
    let hints = "[hints]\nmin_requests = 1\n";
    let (p, _) = start_on(None, &format!("{route}{hints}"), None).await;
    let reloaded = tokio::time::Instant::now();
    #[allow(clippy::disallowed_methods)] // the event is placed relative to the real wall clock
    let wall = std::time::SystemTime::now();
    let event = format!(
        "[[routes.events]]\nname = \"sale\"\nstart = \"{}\"\nduration = \"9s\"\nbase_limit = 500\n",
        humantime::format_rfc3339_millis(wall - Duration::from_secs(5))
    );
    std::fs::write(&p.file, format!("{route}{event}{hints}")).unwrap();
    let (status, body) = call(p.admin, "POST", "/admin/reload", "", None).await;
    assert_eq!(status, 200, "{body}");
    // The sale ends 4 s after the reload; 10 requests 2 s in, past the timer's look.
    tokio::time::sleep_until(reloaded + Duration::from_secs(2)).await;
    for _ in 0..10 {
        call(p.listen, "GET", "/buy", "", None).await;
    }
    tokio::time::sleep_until(reloaded + Duration::from_millis(5500)).await;
    let (status, report) = call(p.admin, "GET", "/admin/hints?period=1m", "", None).await;
    assert_eq!(status, 200, "{report}");
    let sale = report["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["event"] == "sale")
        .unwrap_or_else(|| panic!("no part for the sale in {report:#}"));
    assert_eq!(sale["offered"], 10, "{report:#}");
    let covered = sale["covered_s"].as_f64().unwrap();
    assert!(
        (2.5..4.5).contains(&covered),
        "the sale's part covers {covered} s: {report:#}"
    );
    p.stop().await;
}

/// An upstream that leads to the admin API (a typo, a port swapped) does not open it to
/// the proxy's clients: a request that came through the proxy is refused with 508, and
/// the route keeps its limit. (Every client of the proxy could read the admin API and,
/// the change coming from rocgate's own loopback address, set any limit without a
/// token.) The config and `serve`'s flags refuse such an upstream too; this is what
/// holds when neither was asked, as for `Proxy::bind` here.
#[tokio::test]
async fn the_admin_api_is_not_reachable_through_the_proxy() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = Config::from_toml_str(CONFIG, "t.toml").unwrap();
    let mut settings = ProxySettings::from_server(
        &rocgate::config::ServerConfig::default(),
        format!("http://127.0.0.1:{port}").parse().unwrap(),
    );
    settings.listen = "127.0.0.1:0".parse().unwrap();
    settings.admin_listen = format!("127.0.0.1:{port}").parse().unwrap();
    let proxy = Proxy::bind(settings, &config, None).await.unwrap();
    let (listen, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    let change = r#"{"base_limit": 1, "cut_limit": 1}"#;
    let (status, body) = call(listen, "PUT", "/admin/routes/order", change, None).await;
    let (read, _) = call(listen, "GET", "/admin/routes", "", None).await;
    let (_, order) = call(admin, "GET", "/admin/routes/order", "", None).await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    assert_eq!(status, 508, "{body}");
    assert!(
        body["errors"][0]
            .as_str()
            .unwrap()
            .contains("came through this instance's proxy"),
        "{body}"
    );
    assert_eq!(read, 508);
    assert_eq!(order["base_limit_rps"], 200.0, "{order}");
}

/// A reload refuses a config path that is no regular file (a FIFO here): reading it
/// would hold the reload up, and with it the scrapes and changes that wait for the
/// reload's lock. (`GET /metrics` had no answer while a reload waited on a FIFO, and
/// the process did not exit until it was killed.) Scrapes answer throughout.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_a_config_path_that_is_no_regular_file() {
    let p = start(None).await;
    std::fs::remove_file(&p.file).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&p.file)
        .status()
        .unwrap();
    assert!(made.success());
    let reload = tokio::time::timeout(
        Duration::from_secs(5),
        call(p.admin, "POST", "/admin/reload", "", None),
    )
    .await;
    let scrape = tokio::time::timeout(
        Duration::from_secs(5),
        call_raw(p.admin, "GET", "/metrics", Vec::new(), None),
    )
    .await;
    // Whatever came of the above, let a read of the FIFO end before stopping.
    let file = p.file.clone();
    std::thread::spawn(move || std::fs::write(file, CONFIG));
    p.stop().await;
    let (status, body) = reload.expect("the reload answers");
    assert_eq!(status, 422, "{body}");
    assert!(
        body["errors"][0]
            .as_str()
            .unwrap()
            .contains("not a regular file"),
        "{body}"
    );
    assert_eq!(scrape.expect("the scrape answers").0, 200);
}

/// No admin connection outlives `Proxy::run`: one whose change's body is still
/// coming when the proxy stops is closed past the drain. (It stayed open, holding the
/// engine, until its body timeout answered 408.)
#[tokio::test]
async fn admin_connections_end_before_run_returns() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let p = start(None).await;
    let mut conn = tokio::net::TcpStream::connect(p.admin).await.unwrap();
    conn.write_all(
        b"PUT /admin/routes/order HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .unwrap();
    // The head is read before the proxy stops.
    let mut buf = [0u8; 256];
    assert!(
        tokio::time::timeout(Duration::from_millis(200), conn.read(&mut buf))
            .await
            .is_err(),
        "no answer while the body is coming"
    );
    p.stop().await;
    let read = tokio::time::timeout(Duration::from_secs(3), conn.read(&mut buf)).await;
    match read {
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(n)) => panic!(
            "answered after run returned: {}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(_) => panic!("the admin connection was still open 3 s after Proxy::run returned"),
    }
}

/// The admin token is `***` in the proxy's settings printed with `{:?}`, as in the
/// config it came from: `ProxySettings` derived `Debug` over the token's text.
#[test]
fn the_admin_token_is_not_in_the_settings_debug_output() {
    let text = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\n[admin]\ntoken = \"s3cr3t\"\n";
    let config = Config::from_toml_str(text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let settings =
        ProxySettings::from_server(&config.server, "http://127.0.0.1:9".parse().unwrap());
    assert!(settings.admin_token.is_some());
    for shown in [format!("{settings:?}"), format!("{settings:#?}")] {
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
    }
}

/// A change that sends `Authorization` twice is refused (400, `invalid_request`, RFC
/// 6750 §3.1), whichever of the two holds the token, and changes nothing: the first
/// alone was checked, so a request with the token first and any other credential after
/// it was taken, where a gateway in front that checks the last one (or all) saw another
/// caller.
#[tokio::test]
async fn a_change_that_sends_authorization_twice_is_refused() {
    let p = start(Some("s3cret")).await;
    let changes = [
        ("PUT", "/admin/routes/order", r#"{"base_limit": 150}"#),
        ("DELETE", "/admin/routes/order/change", ""),
        ("POST", "/admin/reload", ""),
    ];
    for twice in [
        [
            ("authorization", "Bearer s3cret"),
            ("authorization", "Bearer wrong"),
        ],
        [
            ("authorization", "Bearer wrong"),
            ("authorization", "Bearer s3cret"),
        ],
        [
            ("authorization", "Bearer s3cret"),
            ("authorization", "Bearer s3cret"),
        ],
    ] {
        for (method, path, body) in changes {
            let (status, reply) =
                call_with(p.admin, method, path, body.as_bytes().to_vec(), &twice).await;
            assert_eq!(status, 400, "{method} {path} {twice:?}: {reply}");
            assert_eq!(
                reply["errors"][0],
                "authorization: sent 2 times, where one is taken: nothing was changed",
                "{method} {path} {twice:?}"
            );
        }
    }
    let (_, order) = call(p.admin, "GET", "/admin/routes/order", "", None).await;
    assert_eq!(order["base_limit_rps"], 200.0, "{order}");
    assert_eq!(order["runtime_change"], false, "{order}");
    // One header with the token is taken, as ever.
    let (status, reply) = call(
        p.admin,
        "PUT",
        "/admin/routes/order",
        r#"{"base_limit": 150}"#,
        Some("s3cret"),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    p.stop().await;
}

/// Each refused change is logged at `WARN`, naming the caller's address, the path, the
/// status and why, and never the token sent nor the one set: a security reviewer or an
/// operator paged mid-incident reads who was turned away (a script with an old token,
/// someone trying tokens). At most one line a second (the proxy's clock), counting the
/// refusals since the last line, so that a client trying tokens as fast as it can does
/// not write a line each. Nothing was logged of a refusal.
#[tokio::test]
async fn a_refused_change_is_logged_without_any_token() {
    let (log, _guard) = Captured::on_this_thread();
    let clock = Arc::new(ManualClock::new());
    let (p, _) = start_on(Some("s3cret"), CONFIG, Some(clock.clone())).await;
    let put = r#"{"base_limit": 150}"#;
    let path = "/admin/routes/order";
    let withdraw = "/admin/routes/order/change";
    let twice = [
        ("authorization", "Bearer s3cret"),
        ("authorization", "Bearer s3cret"),
    ];
    assert_eq!(call(p.admin, "PUT", path, put, None).await.0, 401);
    // Within the second: counted, not logged.
    for _ in 0..3 {
        assert_eq!(
            call(p.admin, "PUT", path, put, Some("guess-t0ken")).await.0,
            401
        );
    }
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        call_with(p.admin, "DELETE", withdraw, Vec::new(), &twice)
            .await
            .0,
        400
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        call(p.admin, "PUT", path, put, Some("guess-t0ken")).await.0,
        401
    );
    assert_eq!(
        call(p.admin, "POST", "/admin/reload", "", Some("s3cret"))
            .await
            .0,
        200
    );
    p.stop().await;
    let refused = log.lines_with("admin change refused");
    assert_eq!(refused.len(), 3, "{refused:#?}");
    for (line, (path, status, why, count)) in refused.iter().zip([
        (path, 401, "a valid bearer token is required", 1),
        (withdraw, 400, "authorization: sent 2 times", 4),
        (path, 401, "a valid bearer token is required", 1),
    ]) {
        assert!(line.contains(" WARN "), "{line}");
        assert!(line.contains("peer=127.0.0.1"), "{line}");
        assert!(line.contains(&format!("path=\"{path}\"")), "{line}");
        assert!(
            line.contains(&format!("status={status} refused={count}")),
            "{line}"
        );
        assert!(line.contains(why), "{line}");
    }
    assert_eq!(log.lines_with("s3cret"), Vec::<String>::new());
    assert_eq!(log.lines_with("guess-t0ken"), Vec::<String>::new());
    // Without a token, a change from a web page is logged so too.
    let (log, _guard) = Captured::on_this_thread();
    let p = start(None).await;
    let (status, _) = call_from_page(p.admin, "POST", "/admin/reload", "").await;
    assert_eq!(status, 403);
    p.stop().await;
    let refused = log.lines_with("admin change refused");
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert!(refused[0].contains("status=403"), "{}", refused[0]);
    assert!(
        refused[0].contains("a change from a web page"),
        "{}",
        refused[0]
    );
}

/// A refusal quotes what the request sent (its `Origin`, the path asked for) by its
/// first 64 characters and its length, in the answer and in the `WARN` line, as the
/// `Host` refused is quoted: a client that sent a 100 KB `Origin` or a 60 KB route
/// name had it written whole into a line a second (8 GB of log a day from one loop),
/// and the `Origin` into the answer.
#[tokio::test]
async fn a_refusal_quotes_what_the_request_sent_bounded() {
    let origin = format!("http://{}", "o".repeat(100_000));
    let route = format!("/admin/routes/{}", "r".repeat(60_000));
    let (log, _guard) = Captured::on_this_thread();
    let p = start(None).await;
    let reload = "/admin/reload";
    let (status, answer) =
        call_with(p.admin, "POST", reload, Vec::new(), &[("origin", &origin)]).await;
    assert_eq!(status, 403);
    let why = answer["errors"][0].as_str().unwrap();
    let quoted = format!("(Origin: {:?}… (100007 bytes))", &origin[..64]);
    assert!(why.contains(&quoted), "{}…", &why[..why.len().min(300)]);
    let foreign = [("host", "evil.example")];
    let (status, _) = call_with(p.admin, "GET", &route, Vec::new(), &foreign).await;
    assert_eq!(status, 403);
    p.stop().await;
    let p = start(Some("s3cret")).await;
    let put = br#"{"base_limit": 150}"#.to_vec();
    let (status, _) = call_with(p.admin, "PUT", &route, put, &[]).await;
    assert_eq!(status, 401);
    p.stop().await;
    let refused = log.lines_with("refused: ");
    let starts: Vec<_> = refused.iter().map(|l| &l[..l.len().min(200)]).collect();
    assert_eq!(refused.len(), 3, "{starts:#?}");
    for line in &refused {
        assert!(line.len() < 1000, "{}…", &line[..300]);
    }
    assert!(refused[0].contains(&quoted), "{}", refused[0]);
    let path = format!("path={:?}… (60014 bytes)", &route[..64]);
    assert!(refused[1].contains(&path), "{}", refused[1]);
    assert!(refused[2].contains(&path), "{}", refused[2]);
}

/// A change's body is read as JSON whatever its `Content-Type` says, as README says:
/// `curl -d` sends a form's, and an operator mid-incident should not have to add
/// `-H 'content-type: application/json'` for the change to be made.
#[tokio::test]
async fn a_change_is_read_as_json_whatever_its_content_type() {
    let p = start(Some("s3cret")).await;
    for (limit, content_type) in [
        (301, "application/x-www-form-urlencoded"),
        (302, "text/plain"),
        (303, "application/json; charset=utf-8"),
    ] {
        let headers = [
            ("authorization", "Bearer s3cret"),
            ("content-type", content_type),
        ];
        let body = format!(r#"{{"base_limit": {limit}}}"#).into_bytes();
        let (status, reply) =
            call_with(p.admin, "PUT", "/admin/routes/order", body, &headers).await;
        assert_eq!(status, 200, "{content_type}: {reply}");
        assert_eq!(reply["base_limit_rps"], f64::from(limit), "{content_type}");
    }
    p.stop().await;
}
