//! Decision latency with the Redis store on loopback, beside the local engine and a
//! bare Redis round trip, in one run (a scripted benchmark: criterion reports means and
//! medians, and this needs tail percentiles of single decisions).
//!
//! Starts its own `redis-server` on a free loopback port (killed by PID at the end),
//! then times, one decision at a time on one task:
//!
//! - `local`: `Engine::check` with the time read from `MonotonicClock` (the local
//!   backend; nothing waits);
//! - `redis_ping`: one `PING` through the same connection manager (the floor: one
//!   loopback round trip);
//! - `redis_exact`: `RedisStore::check` (one `EVALSHA` of the decision script);
//! - `redis_batched`: `RedisStore::check` in batched mode (a local decision; the first
//!   of each slot spawns the slot's sync, which runs between timed decisions).
//!
//! Run with `cargo bench --bench store`; `ROUNDS` decisions per backend (default
//! 20000); `EVENTS` scheduled events on the route (default 0), each to come (a minute
//! every hour from the start), so that they change no decision but make the route's
//! schedule, which a shared store steps its controller under, one of that many.
#![allow(clippy::disallowed_methods)] // a benchmark measures wall time, by definition

use rocgate::clock::{Clock, MonotonicClock};
use rocgate::config::{Config, Event, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key};
use rocgate::limiter::Algorithm;
use rocgate::store::redis::RedisStore;
use rocgate::store::{RedisConfig, RedisServers, SyncMode};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentiles(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{name:<14} n={:<6} p50={:>9.2?} p90={:>9.2?} p99={:>9.2?} p99.9={:>9.2?} max={:>9.2?}",
        samples.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(0.999),
        samples[samples.len() - 1],
    );
}

fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let _server = Server(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed"),
    );
    let url = format!("redis://127.0.0.1:{port}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = loop {
            if let Ok(client) = redis::Client::open(url.as_str()) {
                if let Ok(c) = redis::aio::ConnectionManager::new(client).await {
                    break c;
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let mut route = RouteConfig::new("order", RouteMatch::exact("POST", "/api/order"));
        // Never rejects during the run: decisions cost the same throughout. The most
        // a token bucket is configured at, with a burst of 4 × 10⁹ tokens, and a danger
        // ROC no demand under that limit reaches (the safe ROC must be below it).
        route.controller.base_limit_rps = 2e6;
        route.controller.cut_limit_rps = 2e6;
        route.controller.danger_roc = 1e9;
        route.controller.safe_roc = 1e8;
        route.algorithm = Algorithm::TokenBucket {
            burst: Duration::from_secs(2000),
        };
        let events: u32 = std::env::var("EVENTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        route.events = (1..=events)
            .map(|i| {
                let mut profile = route.controller.clone();
                profile.danger_roc = 2e9;
                let start = SystemTime::UNIX_EPOCH + Duration::from_secs(3600 * u64::from(i));
                Event::new(
                    format!("event-{i}"),
                    start,
                    Duration::from_secs(60),
                    profile,
                )
            })
            .collect();
        let config = Config::new(vec![route]);
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
        let id = engine.route_id("order").expect("the route");
        let store = RedisStore::connect(
            &{
                let mut v = RedisConfig::default();
                v.servers = RedisServers::Single(url.clone());
                v.timeout = Duration::from_secs(1);
                v
            },
            Arc::clone(&clock),
        )
        .expect("the store");

        let mut local = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            let d = std::hint::black_box(engine.check(id, Key::None, clock.now()));
            assert!(d.is_admit());
            local.push(t.elapsed());
        }
        let mut ping = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .expect("PING");
            ping.push(t.elapsed());
        }
        let mut exact = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            let d = store.check(&engine, id, clock.now()).await;
            exact.push(t.elapsed());
            assert!(d.is_admit());
        }
        assert_eq!(store.fallback_decisions(), 0, "every decision was shared");
        let batched_store = RedisStore::connect(
            &{
                let mut v = RedisConfig::default();
                v.servers = RedisServers::Single(url.clone());
                v.timeout = Duration::from_secs(1);
                v.key_prefix = "batched".into();
                v.mode = SyncMode::Batched;
                v
            },
            Arc::clone(&clock),
        )
        .expect("the store");
        let mut batched = Vec::with_capacity(rounds);
        for i in 0..rounds {
            let t = Instant::now();
            let d = batched_store.check(&engine, id, clock.now()).await;
            batched.push(t.elapsed());
            assert!(d.is_admit());
            if i % 100 == 0 {
                // Lets the slot's sync run, outside the timed decisions.
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(batched_store.fallback_decisions(), 0, "Redis stayed up");
        percentiles("local", local);
        percentiles("redis_ping", ping);
        percentiles("redis_exact", exact);
        percentiles("redis_batched", batched);
    });
}
