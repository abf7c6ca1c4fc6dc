//! The demo's load generator: open loop, at a profile's rate, over real HTTP.
//!
//! Each arrival of the profile is sent at its own time, whether or not earlier requests
//! have been answered, so the offered rate is the profile's rate however slow the
//! answers get (a closed loop would slow down with the service and hide the overload).
//! Requests go out over a pool of keep-alive HTTP/1.1 connections; at most
//! `max_in_flight` are outstanding, and an arrival that finds that many is counted as
//! skipped rather than sent late. Outcomes are counted from the client's side.

use crate::sim::{ArrivalModel, Profile};
use bytes::Bytes;
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::ops::Sub;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// Where and how the generator sends its requests. Build it with
/// [`LoadSettings::new`] and set its fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LoadSettings {
    /// The server to send to (the proxy, or the shop itself).
    pub target: SocketAddr,
    /// The requests' method.
    pub method: Method,
    /// The requests' path.
    pub path: String,
    /// Most requests outstanding at once.
    pub max_in_flight: usize,
    /// A request not answered within this counts as an error.
    pub timeout: Duration,
}

impl LoadSettings {
    /// Requests of `method` to `path` on `target`: at most 1,000 outstanding, each
    /// given 10 s.
    pub fn new(target: SocketAddr, method: Method, path: impl Into<String>) -> Self {
        LoadSettings {
            target,
            method,
            path: path.into(),
            max_in_flight: 1000,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Outcome counters, updated as requests are sent and answered.
#[derive(Debug, Default)]
pub struct LoadCounters {
    offered: AtomicU64,
    ok: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    errors: AtomicU64,
    skipped: AtomicU64,
}

/// What the generator has counted so far; the difference of two is what happened in
/// between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoadTotals {
    /// Arrivals that came due (sent or skipped).
    pub offered: u64,
    /// Answered `2xx`.
    pub ok: u64,
    /// Answered `429`.
    pub rejected: u64,
    /// Answered with any other status (`503` from an overloaded shop, `502`/`504` from
    /// the proxy).
    pub failed: u64,
    /// Not answered: connection errors and timeouts.
    pub errors: u64,
    /// Not sent: `max_in_flight` requests were outstanding.
    pub skipped: u64,
}

impl LoadTotals {
    /// Requests that got an answer other than `429`: the ones the shop was asked to serve.
    pub fn admitted(&self) -> u64 {
        self.ok + self.failed
    }

    /// Requests that failed the client: any status but `2xx` and `429`, or no answer.
    pub fn failures(&self) -> u64 {
        self.failed + self.errors
    }

    /// Requests sent and not yet answered (nor timed out).
    pub fn in_flight(&self) -> u64 {
        self.offered
            .saturating_sub(self.skipped + self.ok + self.rejected + self.failed + self.errors)
    }
}

impl Sub for LoadTotals {
    type Output = LoadTotals;

    fn sub(self, earlier: LoadTotals) -> LoadTotals {
        LoadTotals {
            offered: self.offered.saturating_sub(earlier.offered),
            ok: self.ok.saturating_sub(earlier.ok),
            rejected: self.rejected.saturating_sub(earlier.rejected),
            failed: self.failed.saturating_sub(earlier.failed),
            errors: self.errors.saturating_sub(earlier.errors),
            skipped: self.skipped.saturating_sub(earlier.skipped),
        }
    }
}

impl LoadCounters {
    /// The counts so far.
    pub fn totals(&self) -> LoadTotals {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LoadTotals {
            offered: get(&self.offered),
            ok: get(&self.ok),
            rejected: get(&self.rejected),
            failed: get(&self.failed),
            errors: get(&self.errors),
            skipped: get(&self.skipped),
        }
    }

    fn count(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Ok => &self.ok,
            Outcome::Rejected => &self.rejected,
            Outcome::Failed => &self.failed,
            Outcome::Error => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

enum Outcome {
    Ok,
    Rejected,
    Failed,
    Error,
}

/// Sends `profile`'s arrivals, time 0 being `start`, and returns once every request sent
/// has been answered or has timed out. Dropping the future stops sending; requests
/// already sent run to their end.
pub async fn run(
    settings: LoadSettings,
    profile: Profile,
    model: ArrivalModel,
    start: Instant,
    counters: Arc<LoadCounters>,
) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(settings.max_in_flight)
        .build(connector);
    let uri: Uri = match format!("http://{}{}", settings.target, settings.path).parse() {
        Ok(uri) => uri,
        Err(e) => {
            tracing::error!(
                "the demo's target {}{}: {e}",
                settings.target,
                settings.path
            );
            return;
        }
    };
    let max = u32::try_from(settings.max_in_flight).unwrap_or(u32::MAX);
    let slots = Arc::new(Semaphore::new(max as usize));
    for at in profile.arrivals(model) {
        let due = start + Duration::from_nanos(at.as_u64());
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        counters.offered.fetch_add(1, Ordering::Relaxed);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let request = Request::builder()
            .method(settings.method.clone())
            .uri(uri.clone())
            .body(Empty::new());
        let (client, counters, timeout) = (client.clone(), Arc::clone(&counters), settings.timeout);
        tokio::spawn(async move {
            let outcome = match request {
                Ok(request) => send(&client, request, timeout).await,
                Err(_) => Outcome::Error,
            };
            counters.count(outcome);
            drop(slot);
        });
    }
    // Every request sent holds a slot until it ends, and each ends within `timeout`.
    let _ = slots.acquire_many(max).await;
}

async fn send(
    client: &Client<HttpConnector, Empty<Bytes>>,
    request: Request<Empty<Bytes>>,
    timeout: Duration,
) -> Outcome {
    let exchange = async {
        let response = client.request(request).await.ok()?;
        let status = response.status();
        // Read the body to its end so the connection goes back to the pool.
        response.into_body().collect().await.ok()?;
        Some(status)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Some(status)) if status.is_success() => Outcome::Ok,
        Ok(Some(status)) if status == http::StatusCode::TOO_MANY_REQUESTS => Outcome::Rejected,
        Ok(Some(_)) => Outcome::Failed,
        Ok(None) | Err(_) => Outcome::Error,
    }
}
