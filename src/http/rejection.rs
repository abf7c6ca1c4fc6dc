//! The rejection response: status, `Retry-After`, RateLimit headers and a JSON body.
//!
//! ```text
//! HTTP/1.1 429 Too Many Requests
//! retry-after: 3
//! ratelimit-policy: "order";q=60;w=1
//! ratelimit: "order";r=0;t=3
//! rocgate-reason: roc_cut
//! content-type: application/json
//!
//! {"error":"rate_limited","reason":"roc_cut","retry_after_ms":2731,"route":"order"}
//! ```
//!
//! The status is the route's `reject_status` (429 unless configured, e.g. 503 for
//! capacity shedding). `Retry-After` is whole seconds, rounded up, at least 1. For `roc_cut` it is derived
//! from the controller's restore schedule (when the limit will next rise) plus a random
//! jitter of up to that long again (between 1 s and 10 s), so rejected clients do not
//! all return in the same second. `RateLimit-Policy` and `RateLimit` follow the IETF
//! draft (draft-ietf-httpapi-ratelimit-headers): the quota `q` is the route's current
//! limit per `w = 1` second, `r` the remaining quota (0) and `t` the seconds to wait.

use super::body::ResponseBody;
use crate::engine::{Engine, RouteId};
use crate::limiter::{Reason, Rejection};
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, Response, StatusCode};
use std::fmt::Write as _;
use std::time::Duration;

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static REASON: HeaderName = HeaderName::from_static("rocgate-reason");
static JSON: HeaderValue = HeaderValue::from_static("application/json");

/// The time a rejected client is told to wait: the limiter's exact time, or for a
/// cut, the restore schedule (`restore_eta`) with jitter.
pub fn retry_after(rejection: &Rejection, restore_eta: Option<Duration>) -> Duration {
    match (rejection.reason, restore_eta) {
        (Reason::RocCut, Some(eta)) => {
            let spread = eta.clamp(Duration::from_secs(1), Duration::from_secs(10));
            let jitter = spread.mul_f64(fastrand::f64());
            rejection.retry_after.max(eta) + jitter
        }
        _ => rejection.retry_after,
    }
}

/// The response to a rejected request on `route`, with the route's status
/// (`reject_status`, 429 by default).
pub fn respond<B>(
    engine: &Engine,
    route: RouteId,
    rejection: &Rejection,
    retry_after: Duration,
) -> Response<ResponseBody<B>> {
    let name = engine.route_name(route);
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let secs = secs.max(1);
    let reason = rejection.reason.as_str();
    let mut body = String::with_capacity(96);
    let _ = write!(
        body,
        r#"{{"error":"rate_limited","reason":"{reason}","retry_after_ms":{},"route":"{name}"}}"#,
        retry_after.as_millis()
    );
    let mut response = Response::new(ResponseBody::rejected(Bytes::from(body)));
    *response.status_mut() =
        StatusCode::from_u16(engine.reject_status(route)).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let headers = response.headers_mut();
    headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    let quota = engine.limit_rps(route).floor() as u64;
    // Route names are validated to [A-Za-z0-9_.:-], safe inside a quoted string.
    if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";q={quota};w=1")) {
        headers.insert(RATELIMIT_POLICY.clone(), v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("\"{name}\";r=0;t={secs}")) {
        headers.insert(RATELIMIT.clone(), v);
    }
    headers.insert(REASON.clone(), HeaderValue::from_static(reason));
    headers.insert(CONTENT_TYPE, JSON.clone());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_retry_is_the_restore_eta_plus_bounded_jitter() {
        let rej = Rejection {
            retry_after: Duration::from_millis(20),
            reason: Reason::RocCut,
        };
        let eta = Duration::from_millis(2500);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let r = retry_after(&rej, Some(eta));
            assert!(r >= eta && r < eta * 2, "{r:?}");
            seen.insert(r.as_secs());
        }
        assert!(
            seen.len() >= 2,
            "jitter spreads clients over seconds: {seen:?}"
        );
        let limit = Rejection {
            retry_after: Duration::from_millis(20),
            reason: Reason::Limit,
        };
        assert_eq!(retry_after(&limit, Some(eta)), Duration::from_millis(20));
    }
}
