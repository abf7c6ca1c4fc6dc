//! The demo shop: an HTTP service with a modelled capacity, the upstream the demo
//! protects.
//!
//! `workers` requests are served at a time, each taking `service_time`; the others wait
//! in line, first come first served, so latency grows with the line. A request that
//! finds `workers + queue` requests in the shop already is answered `503` at once.
//! Capacity is thus `workers / service_time` req/s, and the worst wait about
//! `(workers + queue) × service_time / workers`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hdrhistogram::Histogram;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The shop's capacity model.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ShopSettings {
    /// Requests served at the same time.
    pub workers: usize,
    /// How long serving one request takes.
    pub service_time: Duration,
    /// Requests that may wait for a worker; one more is answered `503`.
    pub queue: usize,
}

impl Default for ShopSettings {
    /// 3 workers of 10 ms: about 300 req/s; a line of 60, so at most ~210 ms of waiting.
    fn default() -> Self {
        ShopSettings {
            workers: 3,
            service_time: Duration::from_millis(10),
            queue: 60,
        }
    }
}

impl ShopSettings {
    /// Requests per second the shop serves at most.
    pub fn capacity_rps(&self) -> f64 {
        self.workers as f64 / self.service_time.as_secs_f64()
    }
}

/// Latencies of served requests, in microseconds, from 1 µs to 60 s at 3 significant
/// digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant bounds are valid")
}

/// What the shop measured: latency of the requests it served (time in the shop, the
/// wait for a worker included), per second and over the whole run, and counts.
#[derive(Debug)]
pub struct ShopStats {
    latency: Mutex<Latency>,
    served: AtomicU64,
    overloaded: AtomicU64,
}

#[derive(Debug)]
struct Latency {
    second: Histogram<u64>,
    run: Histogram<u64>,
}

impl ShopStats {
    fn new() -> Self {
        ShopStats {
            latency: Mutex::new(Latency {
                second: histogram(),
                run: histogram(),
            }),
            served: AtomicU64::new(0),
            overloaded: AtomicU64::new(0),
        }
    }

    fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let mut l = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        l.second.saturating_record(us);
        l.run.saturating_record(us);
    }

    /// The 99th percentile latency of requests served since the last call (`None` if
    /// none were), and starts a new period.
    pub fn take_period_p99(&self) -> Option<Duration> {
        let mut l = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        let p99 = (!l.second.is_empty()).then(|| micros(l.second.value_at_quantile(0.99)));
        l.second.reset();
        p99
    }

    /// The 99th percentile latency over every request served (`None` if none were).
    pub fn run_p99(&self) -> Option<Duration> {
        let l = self.latency.lock().unwrap_or_else(PoisonError::into_inner);
        (!l.run.is_empty()).then(|| micros(l.run.value_at_quantile(0.99)))
    }

    /// Requests served (`200`).
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    /// Requests turned away because the line was full (`503`).
    pub fn overloaded(&self) -> u64 {
        self.overloaded.load(Ordering::Relaxed)
    }
}

fn micros(us: u64) -> Duration {
    Duration::from_micros(us)
}

#[derive(Clone, Debug)]
struct ShopState {
    settings: ShopSettings,
    workers: Arc<Semaphore>,
    in_shop: Arc<AtomicUsize>,
    stats: Arc<ShopStats>,
}

/// Counts a request out of the shop when dropped, however it leaves.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn serve_request(State(s): State<ShopState>) -> Response {
    let arrived = Instant::now();
    let ahead = s.in_shop.fetch_add(1, Ordering::AcqRel);
    let _leave = Leave(&s.in_shop);
    if ahead >= s.settings.workers + s.settings.queue {
        s.stats.overloaded.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::SERVICE_UNAVAILABLE, "shop overloaded\n").into_response();
    }
    // The semaphore is never closed; if it were, the shop would be shutting down.
    let Ok(_worker) = s.workers.acquire().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "shop closing\n").into_response();
    };
    tokio::time::sleep(s.settings.service_time).await;
    s.stats.record(arrived.elapsed());
    s.stats.served.fetch_add(1, Ordering::Relaxed);
    (StatusCode::OK, "order placed\n").into_response()
}

/// A running shop on loopback; stops when [`Shop::stop`] is called or it is dropped.
#[derive(Debug)]
pub struct Shop {
    addr: SocketAddr,
    stats: Arc<ShopStats>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<io::Result<()>>>,
}

impl Shop {
    /// Starts the shop on `127.0.0.1`, on a free port. Every path and method is served
    /// by the same model.
    pub async fn start(settings: ShopSettings) -> io::Result<Shop> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(ShopStats::new());
        let app = Router::new().fallback(serve_request).with_state(ShopState {
            settings,
            workers: Arc::new(Semaphore::new(settings.workers)),
            in_shop: Arc::new(AtomicUsize::new(0)),
            stats: Arc::clone(&stats),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let server = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = stopped.await;
        });
        let task = tokio::spawn(async move { server.await });
        Ok(Shop {
            addr,
            stats,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// Where the shop listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the shop has measured so far.
    pub fn stats(&self) -> &Arc<ShopStats> {
        &self.stats
    }

    /// Stops accepting and waits up to `grace` for the requests in the shop.
    pub async fn stop(mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(grace, &mut task).await.is_err() {
                tracing::warn!("the demo shop did not stop within {grace:?}");
                task.abort();
            }
        }
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
