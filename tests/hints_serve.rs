//! Tuning hints from a running proxy: real upstream, real sockets, `GET /admin/hints`
//! and `rocgate hints --admin`.
#![cfg(feature = "cli")]

#[path = "common/proxy.rs"]
mod running;

use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rocgate::config::Config;
use rocgate::proxy::Proxy;
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One route limited to 50 req/s with a bucket of one second, history in 200 ms
/// intervals, and little evidence needed. The upstream counts as healthy unless its
/// p99 passes 30 s: on a loaded test machine a burst of 300 requests once took over the
/// default 500 ms, and another hint came first (the rules' health judgment is tested
/// on a virtual clock in tests/hints.rs; this test is about the HTTP and CLI plumbing).
const CONFIG: &str = r#"
[[routes]]
name = "order"
path_prefix = "/"
base_limit = 50
cut_limit = 20

[hints]
interval = "200ms"
keep = "1m"
min_requests = 50
latency_budget = "30s"
"#;

async fn get(url: String) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let res = tokio::time::timeout(Duration::from_secs(5), client.get(url.parse().unwrap()))
        .await
        .expect("answers in time")
        .unwrap();
    let status = res.status().as_u16();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn start() -> (SocketAddr, SocketAddr, tokio::sync::oneshot::Sender<()>) {
    start_with(CONFIG).await
}

/// A proxy of `config` in front of an upstream that answers everything: its client
/// and admin addresses, and what stops it.
async fn start_with(config: &str) -> (SocketAddr, SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let app = Router::new().fallback(|| async { "ok" });
    tokio::spawn(async move { axum::serve(upstream, app).await });
    let config = Config::from_toml_str(config, "test").unwrap();
    // The shared test settings, with this file's own timeouts and body limit, and the
    // config's admin token, reads and address (on a port of the system's).
    let settings = {
        let mut built = running::settings(upstream_addr);
        built.admin_token = config.server.admin_token.clone();
        built.admin_reads = config.server.admin_reads;
        built.admin_listen = SocketAddr::new(config.server.admin_listen.ip(), 0);
        built.header_read_timeout = Duration::from_secs(2);
        built.shutdown_grace = Duration::from_secs(2);
        built.forward.response_timeout = Duration::from_secs(5);
        built.forward.max_body_bytes = 1024;
        built
    };
    let proxy = Proxy::bind(settings, &config, None).await.unwrap();
    let (listen, admin) = (proxy.local_addr().unwrap(), proxy.admin_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(proxy.run(async {
        let _ = stopped.await;
    }));
    (listen, admin, stop)
}

fn hint<'a>(report: &'a Value, rule: &str) -> Option<&'a Value> {
    report["routes"]
        .as_array()?
        .iter()
        .find_map(|r| r["hints"].as_array()?.iter().find(|h| h["rule"] == rule))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_proxy_gives_hints_over_http_and_to_the_cli() {
    let (listen, admin, stop) = start().await;

    // 300 requests at once against a bucket of 50: most are rejected, while the
    // upstream answers everything it gets at once.
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let mut tasks = Vec::new();
    for _ in 0..300 {
        let client = client.clone();
        let url: http::Uri = format!("http://{listen}/buy").parse().unwrap();
        tasks.push(tokio::spawn(async move {
            client.get(url).await.map(|r| r.status().as_u16())
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().unwrap());
    }
    let rejected = statuses.iter().filter(|&&s| s == 429).count();
    assert!(rejected > 200, "{rejected} of 300 rejected");

    // The history closes an interval every 200 ms; wait (bounded) until the one
    // holding the burst is closed.
    let url = format!("http://{admin}/admin/hints?period=1m");
    let mut report = Value::Null;
    for _ in 0..50 {
        let (status, body) = get(url.clone()).await;
        assert_eq!(status, 200);
        report = body;
        if hint(&report, "raise_base_limit").is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let raise = hint(&report, "raise_base_limit").unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(raise["route"], "order");
    assert_eq!(raise["parameter"], "base_limit");
    assert_eq!(raise["current"], 50.0);
    assert_eq!(raise["suggested"], 65.0);
    assert_eq!(raise["severity"], "warn");
    assert!(
        raise["reason"].as_str().unwrap().contains("healthy"),
        "{raise}"
    );
    assert_eq!(report["period_s"], 60.0);
    assert_eq!(report["interval_s"], 0.2);
    // The history it covers: the proxy started within the period, so less of it.
    let covered = report["covered_s"].as_f64().unwrap_or(f64::NAN);
    assert!(covered > 0.0 && covered < 60.0, "{report:#}");
    // A longer period than the history keeps (`keep = "1m"`) looks at what is kept,
    // and says so: it read 7200.
    let (status, body) = get(format!("http://{admin}/admin/hints?period=2h")).await;
    assert_eq!(status, 200);
    assert_eq!(body["period_s"], 60.0, "{body}");
    // A shorter one than two intervals holds no closed interval: it looks at two
    // (it read as no traffic).
    let (status, body) = get(format!("http://{admin}/admin/hints?period=50ms")).await;
    assert_eq!(status, 200);
    assert_eq!(body["period_s"], 0.4, "{body}");

    let (status, body) = get(format!("http://{admin}/admin/hints?period=soon")).await;
    assert_eq!(status, 400);
    assert!(
        body["errors"][0].as_str().unwrap().starts_with("period:"),
        "{body}"
    );

    // The CLI prints the same hint as a table, or the JSON as returned.
    let table = hints_from(admin, &["--period", "1m"]).await;
    let json = hints_from(admin, &["--json"]).await;
    let bad = hints_from(admin, &["--period", "never"]).await;
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(table.status.success(), "{text}");
    assert!(text.contains("base_limit 50 → 65"), "{text}");
    assert!(text.contains("route order:"), "{text}");
    let parsed: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(hint(&parsed, "raise_base_limit").is_some(), "{parsed:#}");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--period"));

    let _ = stop.send(());
}

/// "Event blur": the history's intervals ended only every `[hints] interval`, and an
/// interval in which a scheduled event started went with the profile it began under.
/// Here 1 s intervals and a sale event of 1.5 s from half a second between two ticks:
/// the event's part covered 1.0 s, not 1.5, and the requests of its first half
/// second went to the route's own part. Now an interval ends at each edge of the
/// event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_events_part_of_the_history_is_exactly_the_time_it_ran() {
    let started = tokio::time::Instant::now();
    #[allow(clippy::disallowed_methods)] // the event is placed relative to the real wall clock
    let sale_start = std::time::SystemTime::now() + Duration::from_millis(1500);
    let config = format!(
        "[[routes]]\nname = \"order\"\npath_prefix = \"/\"\nbase_limit = 50\ncut_limit = 20\n\
         [[routes.events]]\nname = \"sale\"\nstart = \"{}\"\nduration = \"1500ms\"\n\
         base_limit = 500\ncut_limit = 150\n\
         [hints]\ninterval = \"1s\"\nkeep = \"1m\"\nmin_requests = 1\n",
        humantime::format_rfc3339_millis(sale_start)
    );
    let (listen, admin, stop) = start_with(&config).await;
    let stalls = Stalls::watch(started);
    // 20 requests a quarter second into the sale, before the first tick after its
    // start (about 2 s after the proxy began).
    tokio::time::sleep_until(started + Duration::from_millis(1750)).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    for _ in 0..20 {
        let url: http::Uri = format!("http://{listen}/buy").parse().unwrap();
        let res = tokio::time::timeout(Duration::from_secs(5), client.get(url))
            .await
            .expect("answers in time")
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    // The sale ends 3 s in; the interval after it closes by 4 s in (a tick a second
    // after the edge).
    tokio::time::sleep_until(started + Duration::from_millis(4500)).await;
    let (status, report) = get(format!("http://{admin}/admin/hints?period=1m")).await;
    assert_eq!(status, 200);
    let parts = report["routes"].as_array().unwrap();
    let part = |event: Option<&str>| {
        parts
            .iter()
            .find(|r| r["event"].as_str() == event)
            .unwrap_or_else(|| panic!("no part for {event:?} in {report:#}"))
    };
    let sale = part(Some("sale"));
    let covered = sale["covered_s"].as_f64().unwrap();
    // Either edge's tick comes as late as the runtime's timers ran at that edge (a
    // loaded machine, the process stopped): the part is that much shorter or longer.
    // The old grid-bound intervals gave 1 s or 2 s.
    let late = [1500, 3000].map(|edge| stalls.after(Duration::from_millis(edge)));
    let most_off = 0.1 + late[0].max(late[1]).as_secs_f64();
    assert!(
        (covered - 1.5).abs() < most_off,
        "the sale's part covers {covered} s, more than {most_off} s off with the \
         timers {late:?} late at its edges: {report:#}"
    );
    assert_eq!(sale["offered"], 20, "{report:#}");
    assert_eq!(part(None)["offered"], 0, "{report:#}");
    // The report covers the route's history, its parts together.
    let own = part(None)["covered_s"].as_f64().unwrap();
    let whole = report["covered_s"].as_f64().unwrap_or(f64::NAN);
    assert!((whole - (own + covered)).abs() < 1e-9, "{report:#}");
    let _ = stop.send(());
}

/// A timer of the test's own, due 5 ms after each time it fired, and when it fired: how
/// late the runtime ran its timers at each moment of a test (the proxy's run on the
/// same runtime).
struct Stalls {
    started: tokio::time::Instant,
    fired: Arc<Mutex<Vec<tokio::time::Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Stalls {
    fn watch(started: tokio::time::Instant) -> Stalls {
        let fired: Arc<Mutex<Vec<tokio::time::Instant>>> = Arc::default();
        let task = tokio::spawn({
            let fired = Arc::clone(&fired);
            async move {
                loop {
                    let due = tokio::time::Instant::now() + Duration::from_millis(5);
                    tokio::time::sleep_until(due).await;
                    fired.lock().unwrap().push(tokio::time::Instant::now());
                }
            }
        });
        Stalls {
            started,
            fired,
            task,
        }
    }

    /// How long after `at` (since `started`) the timer first fired: at most its 5 ms
    /// period, unless the runtime was held up then.
    fn after(&self, at: Duration) -> Duration {
        let at = self.started + at;
        let fired = self.fired.lock().unwrap();
        let first = fired.iter().find(|&&t| t >= at);
        *first.expect("the timer fired after that") - at
    }
}

impl Drop for Stalls {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[test]
fn the_cli_reports_an_unreachable_admin_api() {
    // A port nothing listens on: bind one, then free it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = hints(&["--admin", &format!("http://127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(1));
    // The cause, not only the client's "client error (Connect)".
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("cannot connect") && said.contains("Connection refused"),
        "{said}"
    );
    // Another scheme; a path or a query of its own (it was sent as
    // `/x?y/admin/hints?period=15m`); a port past 65535 (the client took it for none,
    // and asked port 80: "cannot connect", exit 1, for a typo in the flag).
    for admin in [
        "ftp://127.0.0.1:9090",
        "http://127.0.0.1:9090/x",
        "http://127.0.0.1:9090?y",
        "http://127.0.0.1:99999",
        "http://user:pw@127.0.0.1:65536",
    ] {
        let out = hints(&["--admin", admin]);
        assert_eq!(out.status.code(), Some(2), "{admin}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--admin"),
            "{admin}"
        );
    }
}

/// An admin API that answers every `GET /admin/hints` with `report`, and the periods
/// it was asked for.
async fn fake_admin(report: &'static str) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let asked: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&asked);
    let app = Router::new().route(
        "/admin/hints",
        axum::routing::get(
            move |axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>| {
                seen.lock()
                    .unwrap()
                    .push(q.get("period").cloned().unwrap_or_default());
                async move { ([("content-type", "application/json")], report) }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, asked)
}

/// Runs `rocgate hints` with these arguments and waits for it: its exit status and
/// output, which the tests of the CLI read.
fn hints(args: &[&str]) -> Output {
    hints_with(args, None)
}

/// [`hints`] with `ROCGATE__ADMIN__TOKEN` set to `token`, or unset (whatever the test
/// runner's environment holds).
fn hints_with(args: &[&str], token: Option<&str>) -> Output {
    hints_command(args, token).output().unwrap()
}

/// [`hints_with`], its standard input a pipe that `input` is written into: read through
/// `--token-file /dev/stdin`, it stands in for the pipe that a shell's process
/// substitution (`--token-file <(printf %s "$TOKEN")`) names `/dev/fd/63`.
fn hints_fed(args: &[&str], token: Option<&str>, input: &[u8]) -> Output {
    let mut child = hints_command(args, token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // An error is the command's having read no further, which the test reads in its
    // output; the pipe closes as the thread ends.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// The command [`hints_with`] runs.
fn hints_command(args: &[&str], token: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rocgate"));
    command.arg("hints").args(args);
    match token {
        Some(token) => command.env("ROCGATE__ADMIN__TOKEN", token),
        None => command.env_remove("ROCGATE__ADMIN__TOKEN"),
    };
    command
}

/// Runs `rocgate hints --admin http://{admin}` followed by `more`, off the runtime's
/// threads (so that an admin API served by a task of the test's runtime answers it).
async fn hints_from(admin: SocketAddr, more: &[&str]) -> Output {
    let mut args = vec!["--admin".to_owned(), format!("http://{admin}")];
    args.extend(more.iter().map(|a| (*a).to_owned()));
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        hints(&args)
    })
    .await
    .unwrap()
}

/// What `rocgate hints --admin … {more}` prints on stdout of `report`, which a
/// [`fake_admin`] answers; the test fails, showing it, unless the CLI exits 0.
async fn printed(report: &'static str, more: &[&str]) -> String {
    let (admin, _) = fake_admin(report).await;
    let out = hints_from(admin, more).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_passes_on_a_period_with_a_space() {
    let (admin, asked) = fake_admin(r#"{"period_s":5400,"interval_s":10,"routes":[]}"#).await;
    let out = hints_from(admin, &["--period", "1h 30m"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(*asked.lock().unwrap(), ["1h 30m"]);
    // No history to report: the header claims no period.
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("hints (asked 1h 30m)\n"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `--admin 127.0.0.1:9090`, as `serve --admin` takes the address and its log prints
/// it, is read as `http://127.0.0.1:9090`: it was refused as no http:// URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_the_admin_address_without_a_scheme() {
    let (admin, asked) = fake_admin(r#"{"period_s":900,"interval_s":10,"routes":[]}"#).await;
    let out = tokio::task::spawn_blocking(move || hints(&["--admin", &admin.to_string()]))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(*asked.lock().unwrap(), ["15m"]);
}

/// The header said "hints over the last 1h" (the period asked, capped at `[hints]
/// keep`) of a history of 20 s: it says what the report covers (its `covered_s`), and
/// what was asked. A report without `covered_s` (a `serve` from before it) covers the
/// longest history of a route in it (a route's parts together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_header_claims_only_the_history_there_is() {
    let parts = r#""routes":[
            {"route":"order","intervals":1,"covered_s":10,"offered":100,"rejected":0,"hints":[]},
            {"route":"order","event":"sale","intervals":1,"covered_s":10,"offered":20,"rejected":0,"hints":[]},
            {"route":"search","intervals":1,"covered_s":10,"offered":20,"rejected":0,"hints":[]}
        ]"#;
    for (covered, header) in [
        (
            r#""covered_s":30,"#,
            "hints over the last 30s of history (asked 1h)\n",
        ),
        ("", "hints over the last 20s of history (asked 1h)\n"),
    ] {
        let answer = format!(r#"{{"period_s":3600,{covered}"interval_s":10,{parts}}}"#);
        let stdout = printed(Box::leak(answer.into_boxed_str()), &["--period", "1h"]).await;
        assert!(stdout.starts_with(header), "{stdout}");
    }
    // A history that fills the period (all but the interval still open) covers it.
    let (admin, _) = fake_admin(
        r#"{"period_s":3600,"covered_s":3590,"interval_s":10,"routes":[
            {"route":"order","intervals":359,"covered_s":3590,"offered":100,"rejected":0,"hints":[]}
        ]}"#,
    )
    .await;
    let out = hints_from(admin, &["--period", "2h"]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("hints over the last 1h (asked 2h)\n"),
        "{stdout}"
    );
}

/// A partitioned route's line says how many clients its rejections came from
/// (`refused_keys`): one client's flood reads apart from many clients refused. On a
/// shadow route, they are the clients its rejections and would-be ones came from:
/// the count follows both ("0 rejected from about 3 clients" said none was).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_says_how_many_clients_a_partitioned_route_refused() {
    let stdout = printed(
        r#"{"period_s":60,"interval_s":10,"routes":[
            {"route":"shadowed","intervals":6,"covered_s":60,"offered":9000,"rejected":0,"shadow_rejected":1800,"refused_keys":3,"hints":[]},
            {"route":"login","intervals":6,"covered_s":60,"offered":20000,"rejected":12000,"refused_keys":3,"hints":[]},
            {"route":"api","intervals":6,"covered_s":60,"offered":20000,"rejected":12000,"refused_keys":1400,"hints":[]},
            {"route":"brute","intervals":6,"covered_s":60,"offered":900,"rejected":800,"refused_keys":1,"hints":[]},
            {"route":"quiet","intervals":6,"covered_s":60,"offered":900,"rejected":0,"refused_keys":0,"hints":[]}
        ]}"#,
        &[],
    )
    .await;
    for line in [
        "route login: 6 interval(s), 60.0 s, 20000 offered, 12000 rejected from about 3 clients\n",
        "route api: 6 interval(s), 60.0 s, 20000 offered, 12000 rejected from about 1400 clients\n",
        "route brute: 6 interval(s), 60.0 s, 900 offered, 800 rejected from about 1 client\n",
        "route quiet: 6 interval(s), 60.0 s, 900 offered, 0 rejected\n",
        "route shadowed: 6 interval(s), 60.0 s, 9000 offered, 0 rejected, 1800 would have been rejected, from about 3 clients\n",
    ] {
        assert!(stdout.contains(line), "{line}in {stdout}");
    }
}

/// A shadow route's line said "0 rejected" however much enforcing would have
/// rejected: it says that too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_says_what_a_shadow_route_would_have_rejected() {
    let stdout = printed(
        r#"{"period_s":60,"interval_s":10,"routes":[
            {"route":"order","intervals":6,"covered_s":60,"offered":9000,"rejected":0,"shadow_rejected":1800,"hints":[]},
            {"route":"search","intervals":6,"covered_s":60,"offered":100,"rejected":5,"hints":[]}
        ]}"#,
        &[],
    )
    .await;
    assert!(
        stdout.contains(
            "route order: 6 interval(s), 60.0 s, 9000 offered, 0 rejected, 1800 would have been rejected\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("route search: 6 interval(s), 60.0 s, 100 offered, 5 rejected\n"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_does_not_panic_on_an_answer_out_of_range() {
    let (admin, _) = fake_admin(r#"{"period_s":1e300,"interval_s":10,"routes":[]}"#).await;
    let out = hints_from(admin, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

/// An interval ends at each event's edge, so an event's part of a report is often a
/// fraction of a second, or a second and a half: the table printed the time covered in
/// whole seconds, "0 s" for 0.4 s of a sale and "2 s" for 1.5.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_an_events_part_to_a_tenth_of_a_second() {
    let stdout = printed(
        r#"{"period_s":60,"interval_s":10,"routes":[
            {"route":"order","intervals":6,"covered_s":58.5,"offered":100,"rejected":0,"hints":[]},
            {"route":"order","event":"sale","intervals":1,"covered_s":0.4,"offered":20,"rejected":0,"hints":[]}
        ]}"#,
        &[],
    )
    .await;
    assert!(
        stdout.contains("route order: 6 interval(s), 58.5 s,"),
        "{stdout}"
    );
    assert!(
        stdout.contains("route order during event sale: 1 interval(s), 0.4 s,"),
        "{stdout}"
    );
}

/// The answer is another server's: a control character in it (an escape sequence in a
/// route or event name) is printed escaped, not sent to the terminal to act on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_an_answers_control_characters_escaped() {
    let stdout = printed(
        r#"{"period_s":60,"interval_s":10,"routes":[
            {"route":"or\u001b[2Jder","event":"sa\u0007le","intervals":6,"covered_s":58.5,"offered":100,"rejected":0,"hints":[]}
        ]}"#,
        &[],
    )
    .await;
    assert!(!stdout.contains(['\u{1b}', '\u{7}']), "{stdout:?}");
    assert!(
        stdout.contains(r"route or\u{1b}[2Jder during event sa\u{7}le: 6 interval(s)"),
        "{stdout}"
    );
}

/// An answer larger than any report (16 MiB) is refused with an error, not read whole
/// into memory however large it grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_refuses_an_answer_larger_than_any_report() {
    let huge: &'static str = Box::leak(" ".repeat(17 << 20).into_boxed_str());
    let (admin, _) = fake_admin(huge).await;
    let out = hints_from(admin, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("reading the answer"), "{stderr}");
}

/// A negative `--period` gets the period's own error (it was clap's "unexpected
/// argument '-5m'"), before any call to the admin API.
#[test]
fn a_negative_period_is_refused_naming_the_flag() {
    let out = hints(&["--admin", "http://127.0.0.1:9", "--period", "-5m"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--period: must be a duration such as 15m or 1h, got \"-5m\""),
        "{stderr}"
    );
}

/// A refused `--admin` or `--period` says what is wrong with it: "must be the admin
/// API's URL such as http://127.0.0.1:9090" answered `http://127.0.0.1:9090/admin`
/// (the admin API's URL, with a path) and `https://…` alike, and "must be a duration
/// such as 15m" answered `0s`, a duration.
#[test]
fn a_refused_admin_or_period_says_what_is_wrong_with_it() {
    for (admin, period, expected) in [
        (
            "http://127.0.0.1:9090/admin",
            "15m",
            "--admin: must be the admin API's root, http://host[:port] with no path or query (such as http://127.0.0.1:9090): it ends in \"/admin\", got \"http://127.0.0.1:9090/admin\"",
        ),
        (
            "http://127.0.0.1:9090/?period=1h",
            "15m",
            "--admin: must be the admin API's root, http://host[:port] with no path or query (such as http://127.0.0.1:9090): it ends in \"/?period=1h\", got \"http://127.0.0.1:9090/?period=1h\"",
        ),
        (
            "https://127.0.0.1:9090",
            "15m",
            "--admin: must be an http:// URL (the admin API speaks plain HTTP), got \"https://127.0.0.1:9090\"",
        ),
        (
            "ftp://127.0.0.1:9090",
            "15m",
            "--admin: must be an http:// URL (the admin API speaks plain HTTP), got \"ftp://127.0.0.1:9090\"",
        ),
        (
            "127.0.0.1:9090/admin",
            "15m",
            "--admin: must be the admin API's root, http://host[:port] with no path or query (such as http://127.0.0.1:9090): it ends in \"/admin\", got \"127.0.0.1:9090/admin\"",
        ),
        // No host: the client looked the empty name up ("dns error"), exit 1.
        (
            ":9090",
            "15m",
            "--admin: must be host:port, as serve --admin takes it (such as 127.0.0.1:9090), or http://host[:port]: it names no host, got \":9090\"",
        ),
        (
            "http://:9090",
            "15m",
            "--admin: must be http://host[:port] such as http://127.0.0.1:9090: it names no host, got \"http://:9090\"",
        ),
        // Without a scheme, a host alone is no address serve takes: it was read as
        // http://localhost, port 80, and answered "Connection refused" there.
        (
            "localhost",
            "15m",
            "--admin: must be host:port, as serve --admin takes it (such as 127.0.0.1:9090), or http://host[:port]: it names no port, got \"localhost\"",
        ),
        (
            "http://127.0.0.1:99999",
            "15m",
            "--admin: must be http://host[:port] with a port from 1 to 65535, such as http://127.0.0.1:9090, got \"http://127.0.0.1:99999\"",
        ),
        (
            "http://127.0.0.1:0",
            "15m",
            "--admin: must be http://host[:port] with a port from 1 to 65535, such as http://127.0.0.1:9090, got \"http://127.0.0.1:0\"",
        ),
        // User info was dropped without a word: no credential was sent.
        (
            "http://user:pw@127.0.0.1:9090",
            "15m",
            "--admin: must not carry user info (user:password@): hints sends none; pass the admin token with --token-file PATH, got \"http://user:***@127.0.0.1:9090\"",
        ),
        (
            "http://127.0.0.1:9",
            "0s",
            "--period: must be longer than zero, got \"0s\"",
        ),
    ] {
        let out = hints(&["--admin", admin, "--period", period]);
        assert_eq!(out.status.code(), Some(2), "{admin} {period}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim_end(),
            expected,
            "{admin} {period}"
        );
    }
}

/// `--json` prints a hints report, not whatever answered at that address: a 200 that is
/// no report fails as it does without `--json`, and prints nothing on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_as_json_only_a_hints_report() {
    let (admin, _) = fake_admin("<html>a login page</html>").await;
    for json in [true, false] {
        let out = hints_from(admin, if json { &["--json"] } else { &[] }).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--json {json}: {stderr}");
        assert!(out.stdout.is_empty(), "--json {json}");
        assert!(
            stderr.contains("not a hints report"),
            "--json {json}: {stderr}"
        );
    }
}

/// `rocgate hints` sends the admin token, read from `--token-file PATH`, as
/// `Authorization: Bearer`: from loopback, an admin API refuses (403) a `Host` that is
/// none of this host's names unless the request carries it, and hints could send none.
/// `127.1` is such a `Host` here (the resolver reads it as 127.0.0.1, the admin API
/// does not take it for an IP address), standing in for the host's own name not listed
/// in `[admin] allowed_hosts`. Refused, hints prints the API's own answer and says how
/// to pass the token; a token file may end in a line break, and begin with a byte
/// order mark (which was sent as the token's first character, and refused). Without a
/// token, and with one, it used to take no such flag (exit 2) and send none. The
/// variable `ROCGATE__ADMIN__TOKEN` (the one `serve` reads for `[admin] token`) is not
/// sent: it was, from wherever it was exported, to whatever `--admin` named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sends_the_admin_token_from_a_file_only() {
    let config = format!("{CONFIG}\n[admin]\ntoken = \"s3cret\"\n");
    let (_listen, admin, stop) = start_with(&config).await;
    let url = format!("http://127.1:{}", admin.port());
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let good = file("token", b"s3cret\n");
    // As Notepad saves it: a byte order mark, a CRLF.
    let marked = file("marked", "\u{feff}s3cret\r\n".as_bytes());
    let wrong = file("wrong", b"other");
    let run = |args: Vec<String>, token: Option<&'static str>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            hints_with(&args, token)
        })
    };
    let admin_args = |more: &[&str]| {
        let mut args = vec!["--admin".to_owned(), url.clone()];
        args.extend(more.iter().map(|a| (*a).to_owned()));
        args
    };
    let refused = format!(
        "Host \\\"127.1:{}\\\" is not a name of this host: from loopback, the admin API \
         answers a Host that is an IP address, localhost or a name in [admin] allowed_hosts \
         (list it there if it is one of this host's names), or a request with the bearer token",
        admin.port()
    );
    // With the variable too: it is no token given to hints.
    for token in [None, Some("s3cret")] {
        let out = run(admin_args(&[]), token).await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{token:?}: {stderr}");
        assert!(stderr.contains("answered 403 Forbidden: "), "{stderr}");
        assert!(stderr.contains(&refused), "{stderr}");
        assert!(
            stderr.contains(
                "the admin API refused the request: with [admin] token set, pass its token \
                 with --token-file PATH (one held in a variable as \
                 --token-file <(printf %s \"$ROCGATE__ADMIN__TOKEN\"))"
            ),
            "{token:?}: {stderr}"
        );
    }
    let out = run(admin_args(&["--token-file", &wrong]), None)
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&refused), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the token sent, from {wrong}, was not taken: it is not the admin API's \
             [admin] token, or the API has none"
        )),
        "{stderr}"
    );
    for (args, token) in [
        (admin_args(&["--token-file", &good]), None),
        (admin_args(&["--token-file", &marked]), None),
        // The file is sent, not the variable.
        (admin_args(&["--token-file", &good]), Some("other")),
    ] {
        let out = run(args.clone(), token).await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?} {token:?}: {stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with("hints"), "{args:?} {token:?}: {stdout}");
    }
    let _ = stop.send(());
}

/// An address of this host beyond loopback, if it has one: the source address of its
/// route to a documentation address (RFC 5737; a connected UDP socket sends nothing).
fn an_address_beyond_loopback() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("198.51.100.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// Against an admin API beyond loopback with `[admin] reads = "token"`, reached from
/// beyond loopback (this host's own address), `rocgate hints` without a token is
/// refused 401 and says how to pass it; with `--token-file`, it prints the hints. A
/// host with no address beyond loopback has nothing to show it on, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_hints_closed_to_reads_without_the_token_with_it() {
    let Some(ip) = an_address_beyond_loopback() else {
        eprintln!("skipped: this host has no address beyond loopback to bind the admin API on");
        return;
    };
    let config = format!(
        "{CONFIG}\n[admin]\nlisten = \"{}\"\ntoken = \"s3cret\"\nreads = \"token\"\n",
        SocketAddr::new(ip, 9090)
    );
    let (_listen, admin, stop) = start_with(&config).await;
    assert_eq!(admin.ip(), ip);
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("token");
    std::fs::write(&good, "s3cret\n").unwrap();
    let out = hints_from(admin, &[]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("answered 401 Unauthorized: "), "{stderr}");
    assert!(
        stderr.contains("pass its token with --token-file PATH"),
        "{stderr}"
    );
    let out = hints_from(admin, &["--token-file", good.to_str().unwrap()]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("hints"), "{stdout}");
    let _ = stop.send(());
}

/// A token file that cannot be read, is empty, or holds what no `Authorization` header
/// carries is refused naming the file, before anything is sent (exit 2); the token
/// itself is never printed. A file over 64 KiB is refused unread past that:
/// `--token-file /dev/zero`, or a log named by mistake, was read whole into memory (and
/// a 64 KiB one sent as the token); a pipe so (`<(cat big.log)`). An empty or unsendable
/// `ROCGATE__ADMIN__TOKEN` is not read: it was refused (exit 2), read as the token to send.
#[test]
fn a_token_file_that_gives_no_token_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let missing = dir.path().join("missing").to_str().unwrap().to_owned();
    let empty = file("empty", b"\n");
    let control = file("control", b"s3c\x01ret\n");
    let spaced = file("spaced", b" s3cret\n");
    let two_lines = file("two-lines", b"s3cret\nmore\n");
    let binary = file("binary", b"s3\xffcret");
    let huge = file("huge", &[b's'; 64 * 1024 + 1]);
    for (path, why) in [
        (&missing, "cannot be read: No such file or directory (os error 2)"),
        (&empty, "is empty: it holds no token"),
        (
            &control,
            "holds what an Authorization header cannot carry: the control character U+0001 as character 4 of 7",
        ),
        (
            &spaced,
            "holds what an Authorization header cannot carry: whitespace before a token of 7 characters",
        ),
        (
            &two_lines,
            "holds what an Authorization header cannot carry: the control character U+000A as character 7 of 11",
        ),
        (&binary, "is not UTF-8 text"),
        (
            &huge,
            "is over 64 KiB: it holds more than a token (read no further)",
        ),
    ] {
        let out = hints_with(&["--admin", "http://127.0.0.1:9", "--token-file", path], None);
        assert_eq!(out.status.code(), Some(2), "{path}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr.trim_end(),
            format!("--token-file: {path} {why}"),
            "{path}"
        );
        assert!(!stderr.contains("s3"), "{stderr}");
    }
    // A path is shown with its control characters escaped, as check-config's and
    // simulate's are: an escape sequence in the name acted on the terminal.
    let odd = dir.path().join("gone\u{1b}[2J");
    let out = hints_with(
        &[
            "--admin",
            "http://127.0.0.1:9",
            "--token-file",
            odd.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        format!(
            "--token-file: {}/gone\\u{{1b}}[2J cannot be read: No such file or directory (os error 2)",
            dir.path().display()
        )
    );
    let args = [
        "--admin",
        "http://127.0.0.1:9",
        "--token-file",
        "/dev/stdin",
    ];
    for (input, why) in [
        (&b""[..], "is empty: it holds no token"),
        (
            &[b's'; 64 * 1024 + 1][..],
            "is over 64 KiB: it holds more than a token (read no further)",
        ),
    ] {
        let out = hints_fed(&args, None, input);
        assert_eq!(out.status.code(), Some(2), "{}", input.len());
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).trim_end(),
            format!("--token-file: /dev/stdin {why}")
        );
    }
    // Nothing listens at port 9: the request was tried, the variable not read.
    for token in ["", "s3\tcret\r"] {
        let out = hints_with(&["--admin", "http://127.0.0.1:9"], Some(token));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{token:?}: {stderr}");
        assert!(stderr.contains("cannot connect"), "{token:?}: {stderr}");
        assert!(!stderr.contains("ROCGATE__ADMIN__TOKEN"), "{stderr}");
    }
}

/// A token file no one writes to (a named pipe without a writer, a process
/// substitution whose command hangs) is given up after the command's 10 s, exit 2,
/// naming the file (escaped) and saying nothing was written to it; `rocgate hints`
/// waited in `open` for ever, before its request's timeout began. Bounded here by the
/// test's own minute, not timed: the exit and the message are what is asserted.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_token_file_no_one_writes_to_is_given_up_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("token\u{1b}[2J");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
    )
    .unwrap();
    let child = tokio::process::Command::from(hints_command(
        &[
            "--admin",
            "http://127.0.0.1:9",
            "--token-file",
            fifo.to_str().unwrap(),
        ],
        None,
    ))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("rocgate hints gives the token file up within a minute")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "--token-file: {}/token\\u{{1b}}[2J gave no token within 10s: nothing was written \
             to it, or its writer never closed it (a named pipe no one writes to?)",
            dir.path().display()
        )
    );
}

/// With `ROCGATE__ADMIN__TOKEN` set and no `--token-file`, `rocgate hints` sends no
/// `Authorization` header: it sent the variable's token to whatever `--admin` named,
/// over plain HTTP, where it was exported (as it is wherever `serve` runs with it); the
/// proxy's port, named by mistake, passed it on to the application, as this stub, which
/// records what it is sent, would. Given as a pipe, as a shell's process substitution
/// gives it (`--token-file <(printf %s "$ROCGATE__ADMIN__TOKEN")`), the token is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_variable_alone_sends_no_authorization_header() {
    let sent: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let seen = Arc::clone(&sent);
    let app = Router::new().fallback(move |headers: axum::http::HeaderMap| {
        seen.lock().unwrap().push(
            headers
                .get(axum::http::header::AUTHORIZATION)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        );
        async move {
            (
                [("content-type", "application/json")],
                r#"{"period_s":900,"interval_s":10,"routes":[]}"#,
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stub = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let out = tokio::task::spawn_blocking({
        let stub = stub.clone();
        move || hints_with(&["--admin", &stub], Some("s3cret"))
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(*sent.lock().unwrap(), [None]);
    let out = tokio::task::spawn_blocking(move || {
        hints_fed(
            &["--admin", &stub, "--token-file", "/dev/stdin"],
            Some("other"),
            b"s3cret",
        )
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        *sent.lock().unwrap(),
        [None, Some("Bearer s3cret".to_owned())]
    );
}
