//! `rocgate serve` as a process: forwards, and on SIGTERM finishes the requests in
//! flight, refuses new connections and exits 0.
#![cfg(all(unix, feature = "cli"))]

#[path = "common/serve.rs"]
mod serve;

use axum::routing::get;
use axum::Router;
use serve::{field, log_lines, send, status_and_text, Reap};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// An upstream whose `/slow` takes `delay` and counts requests that arrived.
async fn upstream(delay: Duration, arrived: Arc<AtomicU64>) -> SocketAddr {
    let app = Router::new()
        .route(
            "/slow",
            get(move || {
                let arrived = arrived.clone();
                async move {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(delay).await;
                    "done"
                }
            }),
        )
        .route("/", get(|| async { "hello" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// `rocgate serve` in front of `upstream`, its proxy and admin API on ports the OS
/// picks.
fn serve_to(upstream: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rocgate"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--upstream", upstream]);
    command
}

/// Reads `serve`'s log lines from `stderr` on a thread of their own until one names
/// the address it listens on; the lines after it come on the receiver.
fn logged_listen(
    stderr: impl std::io::Read + Send + 'static,
) -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
    let rx = log_lines(stderr);
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("serve logs its address");
        if let Some(addr) = field(&line, "listen=") {
            return (addr, rx);
        }
    }
}

async fn get_status(addr: SocketAddr, path: &str) -> Result<u16, String> {
    let req = http::Request::get(path)
        .header("host", "rocgate.test")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    status_of(addr, req).await
}

/// The status of `req`'s answer, sent on a new connection to `addr`.
async fn status_of<B>(addr: SocketAddr, req: http::Request<B>) -> Result<u16, String>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Ok(send(addr, req).await?.status().as_u16())
}

/// `child`'s exit status, if it exits within `within` (looked at every 50 ms).
async fn exit_within(
    child: &mut std::process::Child,
    within: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let arrived = Arc::new(AtomicU64::new(0));
    let up = upstream(Duration::from_millis(800), arrived.clone()).await;
    let mut child = serve_to(&format!("http://{up}"))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stderr = child.stderr.take().unwrap();
    let (listen, _log) = logged_listen(stderr); // kept: the child logs on
    assert_eq!(get_status(listen, "/").await, Ok(200));

    let in_flight: Vec<_> = (0..5)
        .map(|_| tokio::spawn(get_status(listen, "/slow")))
        .collect();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while arrived.load(Ordering::SeqCst) < 5 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the 5 requests reached the upstream");

    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());

    // New connections are refused once the listener is closed.
    let refused = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if tokio::net::TcpStream::connect(listen).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(refused.is_ok(), "the listener closed after SIGTERM");

    for request in in_flight {
        let status = tokio::time::timeout(Duration::from_secs(10), request)
            .await
            .expect("in-flight request finishes")
            .unwrap();
        assert_eq!(status, Ok(200), "requests in flight complete");
    }
    let Some(status) = exit_within(&mut child, Duration::from_secs(20)).await else {
        let _ = child.kill();
        panic!("rocgate serve did not exit within 20 s of SIGTERM");
    };
    assert!(status.success(), "exit status {status:?}");
}

/// A second SIGTERM during the shutdown's grace period ends the process at once, with
/// exit status 1 and a warning: an operator who means it is not kept waiting for a
/// request that will not finish. The second one was ignored, the process waiting out
/// `shutdown_grace` (30 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_drain_exits_at_once() {
    let arrived = Arc::new(AtomicU64::new(0));
    let up = upstream(Duration::from_secs(60), arrived.clone()).await;
    let mut child = Reap::spawn(serve_to(&format!("http://{up}")).env("RUST_LOG", "info"));
    let (listen, log) = logged_listen(child.0.stderr.take().unwrap());
    let _stuck = tokio::spawn(get_status(listen, "/slow"));
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while arrived.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the request reached the upstream");

    let status = sigterm_twice(&mut child.0, &log).await;
    assert_eq!(status.code(), Some(1), "{status:?}");
    let line = logged(&log, &["second SIGTERM"]).expect("the second SIGTERM is logged");
    assert!(line.contains("WARN"), "{line}");
}

/// Sends SIGTERM to `child`, waits for `log` to say the drain began, sends another,
/// and waits (5 s at most) for its exit.
async fn sigterm_twice(
    child: &mut std::process::Child,
    log: &std::sync::mpsc::Receiver<String>,
) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    let term = || Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(term().success());
    assert!(
        logged(log, &["shutting down"]).is_some(),
        "the first SIGTERM starts the drain"
    );
    assert!(term().success());
    exit_within(child, Duration::from_secs(5))
        .await
        .expect("rocgate serve exits within 5 s of the second SIGTERM")
}

/// A `redis-server` of the test's own on a free loopback port, killed (by PID) on drop.
struct Redis(std::process::Child, u16);

impl Redis {
    async fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test.sh installs it)");
        let redis = Redis(child, port);
        for _ in 0..200 {
            if redis.query::<String>(&mut redis::cmd("PING")).is_ok() {
                return redis;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("redis-server did not answer on port {port}");
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.1))?;
        cmd.query(&mut client.get_connection_with_timeout(Duration::from_secs(1))?)
    }

    /// Instances in the heartbeat set of the default key prefix.
    fn instances(&self) -> u64 {
        self.query(redis::cmd("ZCARD").arg("{rocgate}:instances"))
            .expect("redis answers")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The second SIGTERM's exit leaves the shared store's heartbeat set, as a graceful
/// exit does, so that the other instances' shares of a shared limit grow at once. It
/// left the instance in the set, counted by the others until three beats were missed
/// (3 s by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_leaves_the_shared_store() {
    let redis = Redis::start().await;
    let arrived = Arc::new(AtomicU64::new(0));
    let up = upstream(Duration::from_secs(60), arrived.clone()).await;
    let (mut child, listen, log, _dir) = serve_on_redis(up, &redis, "");
    let _stuck = tokio::spawn(get_status(listen, "/slow"));
    let joined = tokio::time::timeout(Duration::from_secs(10), async {
        while arrived.load(Ordering::SeqCst) < 1 || redis.instances() < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        joined.is_ok(),
        "the request reached the upstream and the instance beat into the set"
    );

    let status = sigterm_twice(&mut child.0, &log).await;
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert_eq!(redis.instances(), 0, "the instance left the heartbeat set");
}

/// A store's password is in no line of `serve`'s log, at debug level, while Redis
/// refuses it: the start names the store by its prefix, the heartbeat's warning and
/// the failures of calls and connections by Redis's answer, none by its URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_store_password_is_in_no_log_line() {
    let redis = Redis::start().await;
    let up = upstream(Duration::ZERO, Arc::new(AtomicU64::new(0))).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    let config = format!(
        "[[routes]]\nname = \"all\"\npath_prefix = \"/\"\n\n\
         [store]\nbackend = \"redis\"\nurl = \"redis://fleet:s3cr3t-Pa55@127.0.0.1:{}/0\"\n\
         heartbeat = \"100ms\"\n",
        redis.1
    );
    std::fs::write(&file, config).unwrap();
    let mut child = Reap::spawn(
        serve_to(&format!("http://{up}"))
            .arg("--config")
            .arg(&file)
            .env("RUST_LOG", "rocgate=debug"),
    );
    let lines = log_lines(child.0.stderr.take().unwrap());
    let wanted = [
        "shared store: redis",
        "shared store unreachable",
        "store call failed",
        "authentication failed",
    ];
    // Up to 1,000 lines (the heartbeat's, every 100 ms), within 10 s of silence.
    let mut log = String::new();
    let mut asked = false;
    for _ in 0..1000 {
        if wanted.iter().all(|w| log.contains(w)) {
            break;
        }
        let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) else {
            break;
        };
        if let Some(listen) = field(&line, "listen=").filter(|_| !asked) {
            asked = true;
            let _ = get_status(listen, "/").await;
        }
        log.push_str(&line);
        log.push('\n');
    }
    for w in wanted {
        assert!(log.contains(w), "{w:?} is logged:\n{log}");
    }
    assert!(!log.contains("s3cr3t-Pa55"), "{log}");
}

/// `rocgate serve` in front of `upstream`, one route `all` for every path, sharing
/// its state on `redis` with the heartbeat beating once at start only, and the
/// `[store]` lines `store` more; its address and its log lines (info and up) after
/// that, and the folder of its config file (removed on drop).
fn serve_on_redis(
    upstream: SocketAddr,
    redis: &Redis,
    store: &str,
) -> (
    Reap,
    SocketAddr,
    std::sync::mpsc::Receiver<String>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    let config = format!(
        "[[routes]]\nname = \"all\"\npath_prefix = \"/\"\n\n\
         [store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\n\
         heartbeat = \"1h\"\n{store}",
        redis.1
    );
    std::fs::write(&file, config).unwrap();
    let mut child = Reap::spawn(
        serve_to(&format!("http://{upstream}"))
            .arg("--config")
            .arg(&file)
            .env("RUST_LOG", "info"),
    );
    let (listen, log) = logged_listen(child.0.stderr.take().unwrap());
    (child, listen, log, dir)
}

/// A second SIGTERM that comes while the graceful exit is already leaving the shared
/// store (Redis stopped: its debits failed and it warned, its `ZREM` waiting) lets
/// that leave finish rather than starting another: the warning that the shared bucket
/// was not debited is logged once. (The second signal dropped the first leave and
/// started a second, which sent the debits again, waited on them another `timeout`,
/// and logged the warning again.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_leave_does_not_leave_again() {
    let redis = Redis::start().await;
    let up = upstream(Duration::ZERO, Arc::new(AtomicU64::new(0))).await;
    // Room to send the second SIGTERM while the first leave's `ZREM` waits.
    let (mut child, listen, log, _dir) = serve_on_redis(up, &redis, "timeout = \"500ms\"\n");
    let joined = tokio::time::timeout(Duration::from_secs(10), async {
        while redis.instances() < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(joined.is_ok(), "the instance beat into the set");
    assert_eq!(get_status(listen, "/").await, Ok(200), "shared");
    let redis_pid = redis.0.id().to_string();
    let signal = |sig: &str, pid: &str| {
        assert!(Command::new("kill")
            .args([sig, pid])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP", &redis_pid);
    // The breaker opens after 3 timeouts; the rest are admitted in fallback, owed.
    for _ in 0..10 {
        assert_eq!(get_status(listen, "/").await, Ok(200));
    }
    let pid = child.0.id().to_string();
    signal("-TERM", &pid);
    assert!(
        logged(&log, &["not debited"]).is_some(),
        "the first leave warns of the debt Redis did not take"
    );
    signal("-TERM", &pid);
    let status = exit_within(&mut child.0, Duration::from_secs(5))
        .await
        .expect("rocgate serve exits within 5 s of the second SIGTERM");
    signal("-CONT", &redis_pid);
    assert_eq!(
        status.code(),
        Some(1),
        "the second SIGTERM cut the leave short"
    );
    let again: Vec<String> = log.iter().filter(|l| l.contains("not debited")).collect();
    assert!(again.is_empty(), "warned again: {again:#?}");
}

/// `--upstream` is held to the file's rules: a path the proxy would silently drop is
/// an error, not a proxy that forwards elsewhere than asked; so is a port no
/// connection can reach (99999 and 0 were taken, and every request got a 502). A
/// password in the flag is masked wherever the refusal quotes it (it was echoed whole
/// before the masked `got`).
#[tokio::test]
async fn an_upstream_flag_the_file_would_refuse_is_refused_with_exit_code_2() {
    for (upstream, says) in [
        ("http://127.0.0.1:1/api", "with no path"),
        ("http://user@127.0.0.1:1", "must not carry user info"),
        ("http://user:s3cret@127.0.0.1:1", "must not carry user info"),
        (
            "http://user:s3cret@127.0.0.1:1/api",
            "must not carry user info",
        ),
        ("http://127.0.0.1:1?x=1", "with no path"),
        (
            "http://127.0.0.1:99999",
            "port must be a number from 1 to 65535",
        ),
        (
            "http://127.0.0.1:0",
            "port must be a number from 1 to 65535",
        ),
    ] {
        let child = serve_to(upstream)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Reap(child);
        let status = exit_within(&mut child.0, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("serve --upstream {upstream} kept running"));
        assert_eq!(status.code(), Some(2), "{upstream}");
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(stderr.contains("--upstream"), "{upstream}: {stderr}");
        assert!(stderr.contains(says), "{upstream}: {stderr}");
        assert!(!stderr.contains("s3cret"), "{upstream}: {stderr}");
    }
}

/// Out of file descriptors, `accept` fails at once for as long as connections wait in
/// the backlog: retried straight away, it spins a core and floods the log (66,000
/// warnings a second here), on the machine a flash sale has already loaded. Retried
/// every 100 ms, it still logged 10 warnings a second for as long as that lasted: one
/// line says it, with how many failures it stands for, at most every 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_the_accept_loop_backs_off() {
    let up = upstream(Duration::ZERO, Arc::default()).await;
    let command = format!(
        "ulimit -n 40 && exec {} serve --listen 127.0.0.1:0 --admin 127.0.0.1:0 --upstream http://{up}",
        env!("CARGO_BIN_EXE_rocgate")
    );
    let mut child = Reap::spawn(
        Command::new("sh")
            .args(["-c", &command])
            .env("RUST_LOG", "info"),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (listen, rx) = logged_listen(stderr);
    // Silent connections: each holds a descriptor until the header read timeout (10 s).
    let mut held = Vec::new();
    for _ in 0..60 {
        held.push(tokio::net::TcpStream::connect(listen).await.unwrap());
    }
    // The first failure is logged once the descriptors run out, however long a loaded
    // machine takes to get there (the bound only ends a hang)...
    let first = tokio::task::block_in_place(|| logged(&rx, &["accept failed"]))
        .expect("an accept failure is logged");
    assert!(
        first.contains("WARN") && first.contains("failures=1"),
        "{first}"
    );
    // ... and no other in the next 2 s, though accept fails every 100 ms meanwhile (the
    // connections beyond the descriptors still wait in the backlog).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let more: Vec<String> = rx
        .try_iter()
        .filter(|line| line.contains("accept failed"))
        .collect();
    assert!(more.is_empty(), "accept failures logged again: {more:#?}");
}

/// The status of a `PUT` of `body` to `path` at `addr`, with no `Authorization`, naming
/// the host as `localhost` (the admin API answers no other name from loopback).
async fn put_status(addr: SocketAddr, path: &str, body: &'static str) -> Result<u16, String> {
    let req = http::Request::put(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            body.as_bytes(),
        )))
        .unwrap();
    status_of(addr, req).await
}

/// Without `--config`, `serve` runs the embedded default with the environment's
/// overrides, as it would a file: `ROCGATE__ADMIN__TOKEN` (the documented way to set
/// the token) protects the admin API. It was ignored, leaving the API open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_config_file_the_environment_still_sets_the_admin_token() {
    let up = upstream(Duration::ZERO, Arc::default()).await;
    let mut child = Reap::spawn(
        serve_to(&format!("http://{up}"))
            .env_clear()
            .env("RUST_LOG", "info")
            .env("ROCGATE__ADMIN__TOKEN", "s3cret"),
    );
    let rx = log_lines(child.0.stderr.take().unwrap());
    let admin = loop {
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("serve logs its admin address");
        if let Some(addr) = field(&line, "admin=") {
            // The start-up line says which configuration runs, and that no file is
            // there for a SIGHUP to reload.
            assert!(line.contains("config=embedded default"), "{line}");
            break addr;
        }
    };
    let change = r#"{"base_limit": 300}"#;
    assert_eq!(
        put_status(admin, "/admin/routes/order", change).await,
        Ok(401),
        "a change without the token is refused"
    );
}

/// A listener that cannot be opened exits 1, naming which of the two it is: with both
/// addresses in one message an operator could not tell the proxy's port from the
/// admin API's.
#[tokio::test]
async fn an_address_in_use_is_named_with_its_listener() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for (flag, listener, other) in [
        ("--admin", "(the admin API)", "--listen"),
        ("--listen", "(the proxy)", "--admin"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
            .args(["serve", flag, &addr, other, "127.0.0.1:0"])
            .args(["--upstream", "http://127.0.0.1:1"])
            .env_clear()
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flag}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot listen on {addr} {listener}")),
            "{flag}: {stderr}"
        );
        assert!(!stderr.contains("127.0.0.1:0"), "{flag}: {stderr}");
    }
}

/// `serve` started on a config with an event that has ended, on a listen address in
/// use (so that the start fails and the run ends), with `RUST_LOG` if given: its exit
/// code and stderr.
fn serve_an_ended_event(rust_log: Option<&std::ffi::OsStr>) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("past.toml");
    std::fs::write(
        &file,
        "[[routes]]\nname = \"order\"\npath = \"/api/order\"\n\
         [[routes.events]]\nname = \"last-sale\"\nstart = \"2020-11-27T20:00:00Z\"\n\
         duration = \"30m\"\nbase_limit = 400\n",
    )
    .unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_rocgate"));
    command
        .args(["serve", "--config"])
        .arg(&file)
        .args(["--listen", &taken.local_addr().unwrap().to_string()])
        .args(["--admin", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1"])
        .env_clear()
        .stdout(Stdio::null());
    if let Some(filter) = rust_log {
        command.env("RUST_LOG", filter);
    }
    let out = command.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Without a token, an admin API beyond loopback is warned of at start; one on
/// loopback, written as an IPv4-mapped IPv6 address too, is not (it was). (helper-148)
#[test]
fn an_admin_api_beyond_loopback_without_a_token_is_warned_of() {
    let warned =
        |admin: &str| serve_warned(admin, None).contains("beyond loopback without a token");
    assert!(warned("0.0.0.0:0"));
    assert!(!warned("[::ffff:127.0.0.1]:0"));
    assert!(!warned("127.0.0.1:0"));
}

/// With a token shorter than 16 bytes, an admin API beyond loopback is warned of at
/// start, naming the token's length and never the token: anyone who reaches the API
/// may try tokens, by default one a second from each address past its first 10 (the
/// warning says so), and more from more addresses. A longer
/// token, or an API on loopback, is not warned of.
#[test]
fn an_admin_api_beyond_loopback_with_a_short_token_is_warned_of() {
    let short = "beyond loopback with a token of 6 bytes";
    let log = serve_warned("0.0.0.0:0", Some("s3cr3t"));
    let line = log.lines().find(|l| l.contains(short));
    let line = line.unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(" WARN "), "{line}");
    assert!(
        line.contains("1 a second from each address past its first 10"),
        "{line}"
    );
    assert!(!log.contains("s3cr3t"), "{log}");
    assert!(!serve_warned("127.0.0.1:0", Some("s3cr3t")).contains("a token of"));
    let long = "0123456789abcdef";
    assert!(!serve_warned("0.0.0.0:0", Some(long)).contains("a token of"));
}

/// Without a token, the warning of an admin API beyond loopback names `[admin] reads`
/// beside the token; with a token and the reads open (the default), `serve` says at
/// `INFO` that anyone who reaches it reads the state without the token, naming
/// `reads = "token"`; with `reads = "token"` (here from the environment), or on
/// loopback, it says nothing of the reads.
#[test]
fn an_admin_api_beyond_loopback_with_its_reads_open_is_told_of() {
    let long = "0123456789abcdef";
    let open = "beyond loopback with its reads open";
    let log = serve_warned("0.0.0.0:0", None);
    let line = log
        .lines()
        .find(|l| l.contains("beyond loopback without a token"));
    let line = line.unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(r#"[admin] reads = "token""#), "{line}");
    assert!(!log.contains(open), "{log}");
    let log = serve_warned("0.0.0.0:0", Some(long));
    let line = log.lines().find(|l| l.contains(open));
    let line = line.unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(" INFO "), "{line}");
    assert!(line.contains(r#"set [admin] reads = "token""#), "{line}");
    assert!(!log.contains(long), "{log}");
    let closed = [("ROCGATE__ADMIN__READS", "token")];
    assert!(!serve_warned_with("0.0.0.0:0", Some(long), &closed).contains(open));
    assert!(!serve_warned("127.0.0.1:0", Some(long)).contains(open));
}

/// The short token's warning names the bound on wrong tokens the config sets (here
/// from the environment), not the default's.
#[test]
fn the_short_token_warning_names_the_configured_bound_on_guesses() {
    let env = [
        ("ROCGATE__ADMIN__WRONG_TOKENS_BURST", "50"),
        ("ROCGATE__ADMIN__WRONG_TOKENS_PER_SECOND", "0.5"),
    ];
    let log = serve_warned_with("0.0.0.0:0", Some("s3cr3t"), &env);
    let line = log.lines().find(|l| l.contains("a token of 6 bytes"));
    let line = line.unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("0.5 a second from each address past its first 50"),
        "{line}"
    );
}

/// What `serve` logs at start with its admin API on `admin`, with `token` as
/// `[admin] token` (from the environment) or none, stopped once it listens.
fn serve_warned(admin: &str, token: Option<&str>) -> String {
    serve_warned_with(admin, token, &[])
}

/// [`serve_warned`], with `env` set besides.
fn serve_warned_with(admin: &str, token: Option<&str>, env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rocgate"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--admin", admin])
        .args(["--upstream", "http://127.0.0.1:1"])
        .env_remove("ROCGATE__ADMIN__TOKEN")
        .env_remove("ROCGATE__ADMIN__WRONG_TOKENS_BURST")
        .env_remove("ROCGATE__ADMIN__WRONG_TOKENS_PER_SECOND")
        .env_remove("ROCGATE__ADMIN__READS")
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    if let Some(token) = token {
        command.env("ROCGATE__ADMIN__TOKEN", token);
    }
    let mut child = command.spawn().unwrap();
    let (_, log) = logged_listen(child.stderr.take().unwrap());
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(child.wait().unwrap().success());
    log.iter().collect::<Vec<_>>().join("\n")
}

/// A scheduled event that has ended is logged as a warning when `serve` starts (it is
/// valid, and will never run). Here the start then fails on an address in use, which
/// ends the run.
#[test]
fn an_ended_event_is_logged_as_a_warning_at_start() {
    let (code, stderr) = serve_an_ended_event(None);
    assert_eq!(code, Some(1), "{stderr}");
    let warning = stderr
        .lines()
        .find(|l| l.contains("a scheduled event has ended: it will never run"))
        .unwrap_or_else(|| panic!("{stderr}"));
    for field in [
        "WARN",
        "event=last-sale",
        "at=\"routes[0].events[0]\"",
        "ended=2020-11-27T20:30:00Z",
    ] {
        assert!(warning.contains(field), "{field}: {warning}");
    }
}

/// `RUST_LOG` set but empty logs as if unset (it passed nothing, errors included:
/// a unit's `Environment=RUST_LOG=` silenced every line); one that is no filter is
/// said, and the default applies.
#[test]
fn an_empty_or_unreadable_rust_log_logs_at_the_default() {
    use std::os::unix::ffi::OsStrExt as _;
    for (rust_log, said) in [
        (&b""[..], false),
        (b"  ", false),
        (b"rocgate=loud", true),
        // Not UTF-8: the default, said (it went by in silence).
        (b"rocgate=\xffdebug", true),
    ] {
        let rust_log = std::ffi::OsStr::from_bytes(rust_log);
        let (code, stderr) = serve_an_ended_event(Some(rust_log));
        assert_eq!(code, Some(1), "{rust_log:?}: {stderr}");
        assert!(
            stderr.contains("a scheduled event has ended: it will never run"),
            "{rust_log:?}: {stderr}"
        );
        assert_eq!(
            stderr.contains("is no log filter"),
            said,
            "{rust_log:?}: {stderr}"
        );
    }
}

/// The status and body of a `method` request to `path` at `addr`, with `body`, naming
/// the host as `localhost` (the admin API answers no other name from loopback).
async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &'static str,
) -> Result<(u16, String), String> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            body.as_bytes(),
        )))
        .unwrap();
    status_and_text(send(addr, req).await?).await
}

/// The next log line that contains every one of `words`, within 10 s of silence and
/// 1,000 lines.
fn logged(lines: &std::sync::mpsc::Receiver<String>, words: &[&str]) -> Option<String> {
    (0..1000)
        .map_while(|_| lines.recv_timeout(Duration::from_secs(10)).ok())
        .find(|line| words.iter().all(|w| line.contains(w)))
}

/// `/metrics` of the admin API at `admin`, once it contains `wanted` (within 10 s), or
/// the last scrape.
async fn metrics_with(admin: SocketAddr, wanted: &str) -> String {
    let mut text = String::new();
    for _ in 0..100 {
        text = exchange(admin, "GET", "/metrics", "").await.unwrap().1;
        if text.contains(wanted) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    text
}

const RELOADED: &str = r#"
[[routes]]
name = "order_reloaded"
method = "POST"
path = "/api/order"
"#;

/// `rocgate serve --config file` in front of a port nothing listens on, logging at
/// `INFO`, with no other environment.
fn serve_file(file: &std::path::Path) -> Reap {
    Reap::spawn(
        serve_to("http://127.0.0.1:1")
            .arg("--config")
            .arg(file)
            .env_clear()
            .env("RUST_LOG", "info"),
    )
}

/// A refused reload keeps the running config, and the operator hears of it wherever
/// it was asked for: the log (a refusal answered to an admin API client was logged
/// nowhere; only SIGHUP's were) and `/metrics` (nothing counted reloads). A reload
/// whose file changed a route replaces its runtime change, and says so in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_is_logged_and_counted_whoever_asked_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    std::fs::write(&file, RELOADED).unwrap();
    let mut child = serve_file(&file);
    let pid = child.0.id().to_string();
    let lines = log_lines(child.0.stderr.take().unwrap());
    let started = logged(&lines, &["admin="]).expect("serve logs its admin address");
    let admin = field(&started, "admin=").expect("an address");
    // The start-up line names the file a SIGHUP reloads.
    assert!(
        started.contains(&format!("config={}", file.display())),
        "{started}"
    );
    // A SIGHUP the moment serving is logged reloads: SIGHUP is listened for by then
    // (its default action would end the process).
    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    assert!(
        logged(&lines, &["config reloaded"]).is_some(),
        "a SIGHUP right at the start reloads"
    );
    let text = metrics_with(admin, "rocgate_config_last_reload_successful 1").await;
    assert!(
        text.contains("rocgate_config_last_reload_successful 1"),
        "the reload applied: {text}"
    );

    std::fs::write(&file, RELOADED.replace("path =", "cut_limit = 600\npath =")).unwrap();
    let (status, answer) = exchange(admin, "POST", "/admin/reload", "").await.unwrap();
    assert_eq!(status, 422, "{answer}");
    let line = logged(&lines, &["reload refused", "routes[0].cut_limit"]);
    assert!(line.is_some(), "the admin API's refusal is logged");
    let refused = r#"rocgate_config_reloads_total{result="refused"} 1"#;
    let text = metrics_with(admin, refused).await;
    assert!(text.contains(refused), "{text}");
    assert!(
        text.contains("rocgate_config_last_reload_successful 0"),
        "{text}"
    );

    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    assert!(
        logged(&lines, &["reload refused", "routes[0].cut_limit"]).is_some(),
        "SIGHUP's refusal is logged"
    );
    let refused = r#"rocgate_config_reloads_total{result="refused"} 2"#;
    let text = metrics_with(admin, refused).await;
    assert!(text.contains(refused), "{text}");

    // A change at runtime, then a reload of a file that changes the route otherwise.
    let change = r#"{"base_limit": 300}"#;
    let (status, answer) = exchange(admin, "PUT", "/admin/routes/order_reloaded", change)
        .await
        .unwrap();
    assert_eq!(status, 200, "{answer}");
    std::fs::write(
        &file,
        RELOADED.replace("path =", "base_limit = 200\nhold = \"5s\"\npath ="),
    )
    .unwrap();
    let hup = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(hup.success());
    let line = logged(
        &lines,
        &["replaced the route's runtime change", "order_reloaded"],
    );
    assert!(line.is_some(), "the replaced change is logged");
    // The first applied reload was the SIGHUP at the start.
    let applied = r#"rocgate_config_reloads_total{result="applied"} 2"#;
    let text = metrics_with(admin, applied).await;
    assert!(text.contains(applied), "{text}");
    assert!(
        text.contains("rocgate_config_last_reload_successful 1"),
        "{text}"
    );
    assert!(text.contains(r#"rocgate_base_limit_rps{route="order_reloaded"} 200"#));
}

/// A field that a flag sets (`--listen`, `--admin`, `--upstream`) keeps the flag's value
/// whatever the file says of it, now and at a restart with the same flags: a reload
/// does not list a change to it as waiting for a restart. It listed `[server]` and
/// `[admin]` here, and a restart changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_does_not_ask_a_restart_for_what_a_flag_holds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    let server = |listen: u16, upstream: u16, admin: u16, body: u64| {
        format!(
            "[server]\nlisten = \"127.0.0.1:{listen}\"\nupstream = \"http://127.0.0.1:{upstream}\"\n\
             max_body_bytes = {body}\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n{RELOADED}"
        )
    };
    std::fs::write(&file, server(18080, 2, 19090, 1024)).unwrap();
    let mut child = serve_file(&file);
    let lines = log_lines(child.0.stderr.take().unwrap());
    let started = logged(&lines, &["admin="]).expect("serve logs its admin address");
    let admin = field(&started, "admin=").expect("an address");
    let reload = || async {
        let (status, answer) = exchange(admin, "POST", "/admin/reload", "").await.unwrap();
        assert_eq!(status, 200, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        answer["restart_required"].clone()
    };
    // Each of the three held fields changed in the file: nothing waits for a restart.
    std::fs::write(&file, server(18081, 3, 19091, 1024)).unwrap();
    assert_eq!(reload().await, serde_json::json!([]));
    // A field no flag holds still does.
    std::fs::write(&file, server(18081, 3, 19091, 2048)).unwrap();
    assert_eq!(reload().await, serde_json::json!(["[server]"]));
}

/// A reload refused for its store's URL says why in its answer and its log line
/// without the URL's password: both quoted the URL whole, and the log goes into
/// tickets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_shows_no_store_password() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rocgate.toml");
    std::fs::write(&file, RELOADED).unwrap();
    let mut child = serve_file(&file);
    let lines = log_lines(child.0.stderr.take().unwrap());
    let started = logged(&lines, &["admin="]).expect("serve logs its admin address");
    let admin = field(&started, "admin=").expect("an address");
    for password in ["s3cr3t-Pa55", "p%40ss"] {
        let store = format!(
            "[store]\nbackend = \"redis\"\nurl = \"rediss://fleet:{password}@cache:6380/2\"\n"
        );
        std::fs::write(&file, format!("{RELOADED}{store}")).unwrap();
        let (status, answer) = exchange(admin, "POST", "/admin/reload", "").await.unwrap();
        assert_eq!(status, 422, "{answer}");
        let line = logged(&lines, &["reload refused", "store.url"]).expect("the refusal is logged");
        for shown in [&answer, &line] {
            assert!(
                shown.contains("rediss://fleet:***@cache:6380/2"),
                "{password}: {shown}"
            );
            assert!(
                !shown.contains(password) && !shown.contains("p@ss"),
                "{password}: {shown}"
            );
        }
    }
}

/// An upstream that cannot be reached is logged, naming it and why, at most once every
/// 10 s with the count of failures since: the clients got 502s and the log said
/// nothing at its default level (only `/metrics` counted them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_logged_once_in_a_while() {
    // A port nothing listens on: bound, then closed.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = Reap::spawn(serve_to(&format!("http://{dead}")).env_clear());
    let lines = log_lines(child.0.stderr.take().unwrap());
    let listen = logged(&lines, &["listen="])
        .and_then(|line| field(&line, "listen="))
        .expect("serve logs its address");
    for _ in 0..5 {
        assert_eq!(get_status(listen, "/").await, Ok(502));
    }
    let warning = logged(&lines, &["WARN", "upstream"]).expect("the failure is logged");
    assert!(warning.contains(&dead.to_string()), "{warning}");
    assert!(warning.contains("Connection refused"), "{warning}");
    assert!(warning.contains("route=\"default\""), "{warning}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let more: Vec<String> = lines.try_iter().filter(|l| l.contains("WARN")).collect();
    assert!(
        more.is_empty(),
        "one warning for the five failures: {more:?}"
    );
}

/// `--listen` and `--admin` say what they take, as the file's `listen` does: a host
/// name was refused with "invalid socket address syntax", which does not tell an
/// operator that `localhost:8080` needs to be `127.0.0.1:8080`.
#[test]
fn an_address_flag_that_is_no_socket_address_says_what_it_takes() {
    for (command, flag) in [
        ("serve", "--listen"),
        ("serve", "--admin"),
        ("demo", "--listen"),
        ("demo", "--admin"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
            .args([command, flag, "localhost:8080"])
            .env_clear()
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command} {flag}: {stderr}");
        assert!(stderr.contains(flag), "{command} {flag}: {stderr}");
        assert!(
            stderr.contains("must be an IP address and port such as 127.0.0.1:8080"),
            "{command} {flag}: {stderr}"
        );
    }
}

/// `--listen` and `--admin` on one address are refused before anything is bound,
/// naming both flags: serve bound the proxy, then failed on the admin API with
/// "Address already in use", as if another process held the port.
#[test]
fn listen_and_admin_flags_on_one_address_are_refused_with_exit_code_2() {
    for command in ["serve", "demo"] {
        let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
            .args([
                command,
                "--listen",
                "127.0.0.1:47391",
                "--admin",
                "127.0.0.1:47391",
            ])
            .env_clear()
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains(
                "--listen 127.0.0.1:47391 and --admin 127.0.0.1:47391 take the same port"
            ),
            "{command}: {stderr}"
        );
    }
}

/// An `--upstream` that is rocgate's own admin API (the default 127.0.0.1:9090) or
/// proxy listener is refused before anything is bound, naming the flags: through it
/// every client of the proxy could read and change the limits.
#[test]
fn an_upstream_that_is_rocgates_own_listener_is_refused_with_exit_code_2() {
    for (args, expected) in [
        (
            vec!["--upstream", "http://127.0.0.1:9090"],
            "--upstream \"http://127.0.0.1:9090\" is rocgate's own admin.listen 127.0.0.1:9090",
        ),
        (
            vec![
                "--upstream",
                "http://localhost:47392",
                "--admin",
                "0.0.0.0:47392",
            ],
            "--upstream \"http://localhost:47392\" is rocgate's own --admin 0.0.0.0:47392",
        ),
        (
            vec![
                "--upstream",
                "http://127.0.0.1:47393",
                "--listen",
                "127.0.0.1:47393",
            ],
            "--upstream \"http://127.0.0.1:47393\" is rocgate's own --listen 127.0.0.1:47393",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rocgate"))
            .arg("serve")
            .args(&args)
            .env_clear()
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// The allocator does not ask the kernel for transparent huge pages: each is resident
/// whole (2 MiB) while one object in it is live, which kept the proxy's RSS about
/// twice its size for the same live heap (README, the soak-serve.sh bullet). A region
/// advised so carries the `hg` flag in /proc/PID/smaps, whatever the host's THP
/// setting.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocator_asks_for_no_transparent_huge_pages() {
    let up = upstream(Duration::ZERO, Arc::default()).await;
    let mut child = Reap::spawn(serve_to(&format!("http://{up}")).env("RUST_LOG", "info"));
    let stderr = child.0.stderr.take().unwrap();
    let (listen, _rx) = logged_listen(stderr);
    for _ in 0..200 {
        assert_eq!(get_status(listen, "/").await, Ok(200));
    }
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", child.0.id())).unwrap();
    let advised: Vec<&str> = smaps
        .lines()
        .filter(|line| {
            line.strip_prefix("VmFlags:")
                .is_some_and(|flags| flags.split_whitespace().any(|f| f == "hg"))
        })
        .collect();
    assert!(
        advised.is_empty(),
        "regions advised for huge pages: {advised:?}"
    );
}

/// A log nobody reads (a full pipe: a stalled log collector, `serve 2>&1 | slow`)
/// holds no request up: lines are written off the request's path, and dropped when
/// too many wait. (Each was written where it was logged: once the pipe was full, the
/// first request that logged stopped, and a route's transition logged under its lock
/// stopped the route.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_nobody_reads_holds_no_request_up() {
    use std::io::BufRead as _;
    let up = upstream(Duration::ZERO, Arc::default()).await;
    let mut child = Reap::spawn(
        serve_to(&format!("http://{up}"))
            // Several lines a request, from the HTTP stack.
            .env("RUST_LOG", "trace"),
    );
    let mut log = std::io::BufReader::new(child.0.stderr.take().unwrap());
    let listen = loop {
        let mut line = String::new();
        assert!(
            log.read_line(&mut line).unwrap() > 0,
            "serve logs its address"
        );
        if let Some(addr) = field(&line, "listen=") {
            break addr;
        }
    };
    // `log` is kept, never read again: the pipe (64 KiB) fills within the first
    // requests, each of which logs more than 1 KiB here.
    let served = tokio::time::timeout(Duration::from_secs(30), async {
        let mut statuses = Vec::new();
        for _ in 0..500 {
            statuses.push(get_status(listen, "/").await);
        }
        statuses
    })
    .await
    .expect("500 requests answered with the log unread");
    assert!(served.iter().all(|s| *s == Ok(200)), "{served:?}");
    drop(log);
}
