//! The demo shop: an HTTP service with a modelled capacity, the upstream the demo
//! protects.
//!
//! `workers` requests are served at a time, each taking `service_time`; the others wait
//! in line, first come first served, so latency grows with the line. Each worker keeps
//! a timetable: a request is booked to end `service_time` after its worker comes free
//! (or after it arrives, if later), and sleeps until then. A timer fires up to a
//! millisecond late, but a late wake does not delay the next booking, so the shop
//! serves its capacity exactly (a plain 10 ms sleep per request took about 11.4 ms,
//! and 300 req/s became about 270). A request that
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
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The shop's capacity model.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ShopSettings {
    /// Requests served at the same time (0 is taken as 1).
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

/// When each worker comes free.
#[derive(Debug)]
struct Timetable {
    free_at: Vec<Instant>,
    service_time: Duration,
}

impl Timetable {
    fn new(settings: ShopSettings, now: Instant) -> Self {
        Timetable {
            free_at: vec![now; settings.workers.max(1)],
            service_time: settings.service_time,
        }
    }

    /// Books a request that arrived at `arrived` on the worker that comes free first,
    /// and returns when it is served.
    fn book(&mut self, arrived: Instant) -> Instant {
        let worker = self
            .free_at
            .iter_mut()
            .min()
            .expect("a timetable has a worker");
        let end = (*worker).max(arrived) + self.service_time;
        *worker = end;
        end
    }
}

#[derive(Clone, Debug)]
struct ShopState {
    settings: ShopSettings,
    timetable: Arc<Mutex<Timetable>>,
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
    let served_at = s
        .timetable
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .book(arrived);
    tokio::time::sleep_until(served_at).await;
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
            timetable: Arc::new(Mutex::new(Timetable::new(settings, Instant::now()))),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 300 requests at once on 3 workers of 10 ms: served 10 ms apart per worker, the
    /// last at 1 s, first come first served.
    #[test]
    fn the_timetable_serves_the_capacity_exactly() {
        let start = Instant::now();
        let mut t = Timetable::new(ShopSettings::default(), start);
        let ends: Vec<Duration> = (0..300).map(|_| t.book(start) - start).collect();
        assert_eq!(ends[0], Duration::from_millis(10));
        assert_eq!(ends[2], Duration::from_millis(10));
        assert_eq!(ends[3], Duration::from_millis(20));
        assert_eq!(ends[299], Duration::from_secs(1));
        assert!(ends.windows(2).all(|w| w[0] <= w[1]));
        // Requests arriving after every worker came free are served at once; one
        // arriving while all three are busy waits for the first to come free.
        let later = start + Duration::from_secs(5);
        for _ in 0..3 {
            assert_eq!(t.book(later) - later, Duration::from_millis(10));
        }
        assert_eq!(
            t.book(later + Duration::from_millis(1)) - later,
            Duration::from_millis(20)
        );
    }
}
