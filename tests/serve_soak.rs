//! `rocgate serve` as a process after churn: a bounded soak (about 10 s of clients that
//! come and go, many of them vanishing mid-request, with reloads) after which every
//! file descriptor, connection, lane, request in flight and concurrency permit taken
//! for the churn has been given back. `scripts/soak-serve.sh` is the long form.
//!
//! The upstream runs in the test's runtime, `rocgate serve` as a child (its open file
//! descriptors read from `/proc`), both on 127.0.0.1; every wait is bounded.
#![cfg(all(target_os = "linux", feature = "cli"))]

#[path = "common/churn.rs"]
mod churn;
#[path = "common/serve.rs"]
mod serve;

use bytes::Bytes;
use http_body_util::Empty;
use serve::{field, log_lines, send, status_and_text, Reap};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// How long the clients churn.
const CHURN: Duration = Duration::from_secs(10);
/// Clients churning at once.
const CLIENTS: usize = 16;
/// The concurrency route's limit: requests in flight at once.
const PERMITS: usize = 8;
/// How long everything has to come back once the clients are gone: past the idle,
/// header, lingering and upstream idle timeouts of [`config`].
const SETTLE: Duration = Duration::from_secs(20);
/// File descriptors the process may hold above its count before traffic.
const FD_SLACK: usize = 2;

/// The config of generation `generation`: the concurrency routes keep their names and
/// algorithm, and so their live state (the permits held) across reloads, while
/// `soak_conc` changes its `hold`; the others are renamed (rebuilt as new routes) in
/// turn.
fn config(upstream: SocketAddr, generation: u32) -> String {
    let g = generation % 3;
    let hold = 1 + generation % 2;
    format!(
        r#"
[defaults]
window = "2s"
slot = "100ms"

[[routes]]
name = "soak_tb_{g}"
path_prefix = "/tb"
base_limit = 5000
cut_limit = 5000

[[routes]]
name = "soak_keys_{g}"
path_prefix = "/keys"
base_limit = 5
cut_limit = 2
partition = "header:x-api-key"
max_keys = 500

[[routes]]
name = "soak_conc"
path_prefix = "/conc"
algorithm = "concurrency"
base_limit = {PERMITS}
cut_limit = {PERMITS}
queue = 16
hold = "{hold}s"

[[routes]]
name = "soak_leaky_{g}"
path_prefix = "/leaky"
algorithm = "leaky_bucket"
base_limit = 200
cut_limit = 100
queue = 20

[[routes]]
name = "soak_tight_{g}"
path_prefix = "/tight"
base_limit = 2
cut_limit = 1

[[routes]]
name = "soak_ws"
path_prefix = "/ws"
algorithm = "concurrency"
base_limit = 20
cut_limit = 20

[[routes]]
name = "soak_rest_{g}"
path_prefix = "/"
base_limit = 100000
cut_limit = 100000

[server]
upstream = "http://{upstream}"
header_read_timeout = "1s"
idle_timeout = "1s"
response_timeout = "2s"
upstream_idle_timeout = "1s"
lingering_time = "2s"
lingering_timeout = "500ms"
max_body_bytes = 1048576
"#
    )
}

/// Starts `rocgate serve --config file` on ports the OS picks; returns it, its proxy
/// and its admin address (from its log line).
fn start_serve(file: &Path) -> (Reap, SocketAddr, SocketAddr) {
    let mut child = Reap::spawn(
        Command::new(env!("CARGO_BIN_EXE_rocgate"))
            .arg("serve")
            .arg("--config")
            .arg(file)
            .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .env("RUST_LOG", "warn,rocgate::cli=info"),
    );
    let stderr = child.0.stderr.take().unwrap();
    let rx = log_lines(stderr);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("serve logs its addresses");
        if let (Some(listen), Some(admin)) = (field(&line, "listen="), field(&line, "admin=")) {
            // The log goes on; what is left of it is read and thrown away.
            std::thread::spawn(move || while rx.recv().is_ok() {});
            return (child, listen, admin);
        }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(usize::MAX)
}

/// How long [`get`] waits for a whole answer: a process that stops answering fails the
/// test rather than hanging it.
const ANSWER: Duration = Duration::from_secs(10);

/// A GET of `path` on a connection of its own: the status and body, or an error if
/// they have not come within [`ANSWER`].
async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    tokio::time::timeout(ANSWER, get_unbounded(addr, path))
        .await
        .unwrap_or_else(|_| Err(format!("no answer to GET {path} from {addr} in {ANSWER:?}")))
}

/// [`get`] without its bound, naming the host as `localhost` (the admin API answers no
/// other name from loopback).
async fn get_unbounded(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    status_and_text(send(addr, req).await?).await
}

/// What the gauges of one `/metrics` scrape, and `/proc`, say the process holds.
#[derive(Debug, PartialEq)]
struct Held {
    fds: usize,
    in_flight: f64,
    upstream_requests: f64,
    client_connections: f64,
    upstream_lanes: f64,
    lingering: f64,
    /// Permits held on the concurrency routes (`rocgate_limiter_level`).
    permits: f64,
}

/// The sum of the series of `name` whose line contains `with`.
fn sum(metrics: &str, name: &str, with: &str) -> f64 {
    metrics
        .lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
                && line.contains(with)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn held(admin: SocketAddr, pid: u32) -> Held {
    let (status, metrics) = get(admin, "/metrics").await.expect("a scrape");
    assert_eq!(status, 200, "{metrics}");
    Held {
        fds: open_fds(pid),
        in_flight: sum(&metrics, "rocgate_in_flight_requests", ""),
        upstream_requests: sum(&metrics, "rocgate_upstream_requests", ""),
        client_connections: sum(&metrics, "rocgate_client_connections", ""),
        upstream_lanes: sum(&metrics, "rocgate_upstream_lanes", ""),
        lingering: sum(&metrics, "rocgate_lingering_connections", ""),
        permits: sum(
            &metrics,
            "rocgate_limiter_level",
            r#"algorithm="concurrency""#,
        ),
    }
}

/// Ten seconds of churn through every kind of route, clients vanishing mid-head,
/// mid-upload, while queued and mid-response on a concurrency route with a queue, h2c
/// and WebSockets, with a reload every two seconds: once the clients are gone and the
/// timeouts have passed, the process holds no connection, lane, request or permit,
/// and no more file descriptors than before the traffic. (A concurrency route's
/// level is its limiter's own count of permits held, the count it admits by.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_churn_everything_taken_is_given_back() {
    let upstream = churn::start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    std::fs::write(&file, config(upstream, 0)).unwrap();
    let (child, proxy, admin) = start_serve(&file);
    let pid = child.0.id();
    let before = held(admin, pid).await;
    let (status, _) = get(proxy, "/tb/").await.expect("the proxy answers");
    assert_eq!(status, 200);

    let until = Instant::now() + CHURN;
    let clients = tokio::spawn(churn::churn(proxy, CLIENTS, until));
    let mut generation = 0;
    while Instant::now() + Duration::from_secs(2) < until {
        sleep(Duration::from_secs(2)).await;
        generation += 1;
        std::fs::write(&file, config(upstream, generation)).unwrap();
        let hup = Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap();
        assert!(hup.success());
    }
    let tally = clients.await.unwrap();
    let (_, metrics) = get(admin, "/metrics").await.expect("a scrape");
    assert_eq!(
        sum(
            &metrics,
            "rocgate_config_reloads_total",
            r#"result="applied""#
        ),
        f64::from(generation),
        "every reload applied"
    );
    for action in churn::Action::ALL {
        let (ended, _) = tally.done.get(&action).copied().unwrap_or_default();
        assert!(ended > 0, "{action:?} never ran to its end: {tally:?}");
    }

    let settled = Instant::now() + SETTLE;
    let mut now = held(admin, pid).await;
    let given_back = |h: &Held| {
        h.fds <= before.fds + FD_SLACK
            && h.in_flight == 0.0
            && h.upstream_requests == 0.0
            && h.client_connections == 0.0
            && h.upstream_lanes == 0.0
            && h.lingering == 0.0
            && h.permits == 0.0
    };
    while !given_back(&now) && Instant::now() < settled {
        sleep(Duration::from_millis(250)).await;
        now = held(admin, pid).await;
    }
    assert!(
        given_back(&now),
        "{SETTLE:?} after the churn ({} turns: {tally:?}) the process still holds {now:?}; \
         before the traffic it held {before:?}",
        tally.turns()
    );
    eprintln!(
        "{} turns ({tally:?}); before the traffic {before:?}, after it {now:?}",
        tally.turns()
    );

    drop(child);
}

/// A peer that takes the connection and never answers (an admin API that wedged under
/// the churn) fails [`get`], and the scrapes of [`held`] with it, in [`ANSWER`]: the
/// test fails rather than hangs.
#[tokio::test(start_paused = true)]
async fn a_peer_that_never_answers_fails_a_get_in_time() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let started = Instant::now();
    let got = get(addr, "/metrics").await;
    assert!(got.is_err(), "{got:?}");
    assert!(started.elapsed() <= ANSWER, "{:?}", started.elapsed());
    holder.abort();
}
