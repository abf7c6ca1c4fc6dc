//! The proxy's errors: every way forwarding can fail, with the one function that maps
//! each to its status, and why a reload was refused.

use crate::config::ConfigError;
use axum::body::Body;
use http::{header, HeaderValue, Response, StatusCode};
use std::fmt;
use std::io;
use std::net::SocketAddr;

/// Why a request could not be forwarded. Non-exhaustive: a new way to fail (as
/// `ClientTimeout` was) is not a breaking change.
#[derive(Debug)]
#[non_exhaustive]
pub enum ProxyError {
    /// The request cannot be turned into an upstream request (400).
    BadRequest,
    /// The request's head is one rocgate does not forward (400, `bad_request`), and
    /// why, which the response's `detail` says: CONNECT, a target in a form its method
    /// cannot take, two `Host` fields, an HTTP/1.1 request without one, or a `Host`
    /// that is no `host[:port]`.
    Unforwardable(&'static str),
    /// The request body is larger than `max_body_bytes` (413).
    BodyTooLarge,
    /// The request has come through this instance before (its `Via` names it): the
    /// upstream leads back to rocgate (508).
    ForwardingLoop,
    /// The request body has a transfer coding besides `chunked` (`gzip, chunked`), or
    /// `chunked` twice (`chunked, chunked`), which rocgate does not decode (501, RFC
    /// 9112 §6.1).
    TransferCodingNotImplemented,
    /// The client stopped sending its request body before its end (400): the client's
    /// doing, not the upstream's.
    ClientAborted,
    /// The client sent nothing of its request body for `response_timeout` (408): the
    /// client's doing, not the upstream's.
    ClientTimeout,
    /// The upstream refused or reset the connection, or spoke broken HTTP (502).
    Upstream(Box<dyn std::error::Error + Send + Sync>),
    /// Connecting to the upstream took longer than `connect_timeout` (504).
    ConnectTimeout,
    /// The upstream's response head took longer than `response_timeout` after the
    /// request's head, or after its body's last byte (504).
    ResponseTimeout,
    /// `max_upstream_requests` requests were in flight to the upstream already (503,
    /// with `Retry-After: 1`): the request was answered at once, never forwarded. Not
    /// the upstream's failure, but this instance's cap on what it sends it.
    UpstreamOverflow,
}

impl fmt::Display for ProxyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyError::BadRequest => f.write_str("request cannot be forwarded"),
            ProxyError::Unforwardable(why) => write!(f, "request cannot be forwarded: {why}"),
            ProxyError::BodyTooLarge => f.write_str("request body too large"),
            ProxyError::ForwardingLoop => {
                f.write_str("forwarding loop: the request came back through this instance")
            }
            ProxyError::TransferCodingNotImplemented => {
                f.write_str("request body has a transfer coding besides chunked")
            }
            ProxyError::ClientAborted => f.write_str("client aborted the request body"),
            ProxyError::ClientTimeout => f.write_str("client stopped sending the request body"),
            ProxyError::Upstream(e) => write!(f, "upstream error: {e}"),
            ProxyError::ConnectTimeout => f.write_str("upstream connect timed out"),
            ProxyError::ResponseTimeout => f.write_str("upstream response timed out"),
            ProxyError::UpstreamOverflow => {
                f.write_str("max_upstream_requests requests in flight to the upstream already")
            }
        }
    }
}

impl std::error::Error for ProxyError {
    /// The upstream's error, for [`ProxyError::Upstream`]: its causes follow from it.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProxyError::Upstream(e) => Some(&**e),
            _ => None,
        }
    }
}

/// Why [`Proxy::bind`](super::Proxy::bind) started no proxy. Non-exhaustive: a new way
/// to fail is not a breaking change.
///
/// `rocgate serve` prints its `Display` after `rocgate serve: ` and exits 1.
///
/// ```
/// use rocgate::proxy::BindError;
///
/// fn exit_code(e: &BindError) -> u8 {
///     match e {
///         // Another instance may still hold the port: worth a retry.
///         BindError::Listen { .. } | BindError::AdminListen { .. } => 75,
///         BindError::Config(_) => 78,
///         _ => 1,
///     }
/// }
/// let e = BindError::Listen {
///     addr: "127.0.0.1:8080".parse().unwrap(),
///     source: std::io::ErrorKind::AddrInUse.into(),
/// };
/// assert_eq!(exit_code(&e), 75);
/// assert_eq!(e.to_string(), "cannot listen on 127.0.0.1:8080 (the proxy): address in use");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// The clients' listener could not be opened.
    #[error("cannot listen on {addr} (the proxy): {source}")]
    Listen {
        /// The address it was to listen on.
        addr: SocketAddr,
        /// Why (its kind is `AddrInUse` for a port taken).
        source: io::Error,
    },
    /// The admin API's listener could not be opened.
    #[error("cannot listen on {addr} (the admin API): {source}")]
    AdminListen {
        /// The address it was to listen on.
        addr: SocketAddr,
        /// Why.
        source: io::Error,
    },
    /// The routes are refused ([`Config::validate`](crate::config::Config::validate)).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The shared store (`[store] backend = "redis"`) could not be set up.
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Store(#[from] crate::store::redis::StoreError),
    /// The config asks for the shared store in a build without the `redis` feature.
    #[cfg(not(feature = "redis"))]
    #[error("[store] backend = \"redis\" needs rocgate built with the `redis` feature")]
    StoreNotBuilt,
}

/// Why [`Reloader::reload`](super::Reloader::reload) (or
/// [`reload_async`](super::Reloader::reload_async)) kept the running config.
/// Non-exhaustive: a new way to fail is not a breaking change.
///
/// `POST /admin/reload` answers `{"errors": [...]}` with `Display`'s lines, one a
/// line, and the reloader logs each.
///
/// ```
/// use rocgate::proxy::ReloadError;
///
/// fn advice(e: &ReloadError) -> String {
///     match e {
///         ReloadError::NoConfigFile => "start rocgate with --config to reload".into(),
///         ReloadError::Config(config) => format!("fix {}", config.origin()),
///         other => format!("see the logs: {other}"),
///     }
/// }
/// assert_eq!(
///     advice(&ReloadError::NoConfigFile),
///     "start rocgate with --config to reload"
/// );
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The proxy was started with the embedded default: there is no file to read.
    #[error("no config file to reload: rocgate was started with the embedded default")]
    NoConfigFile,
    /// The file cannot be read, or its configuration is refused: every problem, one a
    /// line of `Display`, each prefixed with the file's path.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The reload stopped before it finished: it panicked, or the runtime shut down
    /// while it ran on the blocking pool ([`reload_async`](super::Reloader::reload_async)
    /// only).
    #[error("the reload failed: {0}")]
    Aborted(#[source] tokio::task::JoinError),
}

impl ReloadError {
    /// The messages `POST /admin/reload` answers and the log shows: one for each line
    /// of a refused configuration, else the one message.
    pub(crate) fn messages(&self) -> Vec<String> {
        match self {
            ReloadError::Config(e) => e.to_string().lines().map(str::to_owned).collect(),
            other => vec![other.to_string()],
        }
    }
}

/// Whether `e` or an error in its source chain satisfies `is`.
fn caused_by(
    e: &(dyn std::error::Error + 'static),
    is: impl Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    let mut next = Some(e);
    while let Some(s) = next {
        if is(s) {
            return true;
        }
        next = s.source();
    }
    false
}

impl ProxyError {
    /// Classifies a pooled client's error: a connect that timed out, a body over the
    /// limit (surfacing through the upstream request), or another upstream failure.
    pub(crate) fn from_client(e: hyper_util::client::legacy::Error) -> Self {
        if e.is_connect() {
            return ProxyError::connecting(e);
        }
        ProxyError::upstream(e)
    }

    /// Classifies a failure to connect to the upstream: timed out, or refused.
    pub(crate) fn connecting(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let e = e.into();
        if caused_by(&*e, |s| {
            s.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        }) {
            return ProxyError::ConnectTimeout;
        }
        ProxyError::Upstream(e)
    }

    /// Classifies an upstream failure: a body over the limit or cut short by the
    /// client (surfacing through the upstream request), or another upstream failure.
    pub(crate) fn upstream(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let e = e.into();
        if caused_by(&*e, |s| s.is::<http_body_util::LengthLimitError>()) {
            return ProxyError::BodyTooLarge;
        }
        // The request body reaches the upstream client as an `axum::Body`, whose
        // errors are `axum::Error`s: nothing else in an upstream failure is one.
        if caused_by(&*e, |s| s.is::<axum::Error>()) {
            return ProxyError::ClientAborted;
        }
        ProxyError::Upstream(e)
    }

    /// What went wrong, with the causes of an upstream error ("upstream error: client
    /// error (Connect): tcp connect error: Connection refused (os error 111)"), where
    /// `Display` stops at the first ("client error (Connect)").
    pub fn detail(&self) -> String {
        let mut text = self.to_string();
        if let ProxyError::Upstream(e) = self {
            push_causes(&mut text, &**e);
        }
        text
    }

    /// Whether the upstream failed (what the tuning hints count against its health),
    /// rather than the request.
    pub(crate) fn is_upstream_failure(&self) -> bool {
        match self {
            ProxyError::BadRequest
            | ProxyError::Unforwardable(_)
            | ProxyError::BodyTooLarge
            | ProxyError::ForwardingLoop
            | ProxyError::TransferCodingNotImplemented
            | ProxyError::ClientAborted
            | ProxyError::ClientTimeout
            | ProxyError::UpstreamOverflow => false,
            ProxyError::Upstream(_) | ProxyError::ConnectTimeout | ProxyError::ResponseTimeout => {
                true
            }
        }
    }

    /// The status a client gets for this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BadRequest | ProxyError::Unforwardable(_) | ProxyError::ClientAborted => {
                StatusCode::BAD_REQUEST
            }
            ProxyError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::ForwardingLoop => StatusCode::LOOP_DETECTED,
            ProxyError::TransferCodingNotImplemented => StatusCode::NOT_IMPLEMENTED,
            ProxyError::ClientTimeout => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
            ProxyError::ConnectTimeout | ProxyError::ResponseTimeout => StatusCode::GATEWAY_TIMEOUT,
            ProxyError::UpstreamOverflow => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A short machine-readable name, for the JSON body and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            ProxyError::BadRequest | ProxyError::Unforwardable(_) => "bad_request",
            ProxyError::BodyTooLarge => "body_too_large",
            ProxyError::ForwardingLoop => "forwarding_loop",
            ProxyError::TransferCodingNotImplemented => "transfer_coding_not_implemented",
            ProxyError::ClientAborted => "client_aborted",
            ProxyError::ClientTimeout => "client_timeout",
            ProxyError::Upstream(_) => "upstream_error",
            ProxyError::ConnectTimeout => "connect_timeout",
            ProxyError::ResponseTimeout => "response_timeout",
            ProxyError::UpstreamOverflow => "upstream_overflow",
        }
    }

    /// The response sent to the client: `{"error":"<kind>"}` (with `"detail"`, why, for
    /// [`Unforwardable`](ProxyError::Unforwardable)), and `Retry-After: 1` for
    /// [`UpstreamOverflow`](ProxyError::UpstreamOverflow), whose cause passes as the
    /// requests in flight end.
    pub fn into_response(self) -> Response<Body> {
        let body = match &self {
            ProxyError::Unforwardable(why) => format!(
                r#"{{"error":"{}","detail":{}}}"#,
                self.kind(),
                serde_json::Value::from(*why)
            ),
            _ => format!(r#"{{"error":"{}"}}"#, self.kind()),
        };
        let mut res = Response::new(Body::from(body));
        *res.status_mut() = self.status();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(self, ProxyError::UpstreamOverflow) {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        res
    }
}

/// `e` and its causes, each after a colon ("error reading a body from connection:
/// unexpected end of file").
pub(crate) fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    push_causes(&mut text, e);
    text
}

/// Appends the causes of `e` to `text`, each after a colon.
fn push_causes(text: &mut String, e: &(dyn std::error::Error + 'static)) {
    let mut next = e.source();
    while let Some(cause) = next {
        text.push_str(&format!(": {cause}"));
        next = cause.source();
    }
}

#[cfg(test)]
mod tests {
    use super::ProxyError;

    /// Every kind the proxy counts is one `/metrics` sets at 0 before the first error,
    /// and README names it: a [`ProxyError`]'s, or `body_aborted`, which the upstream
    /// body counts itself (src/proxy/forward.rs's `UpstreamBody`); and `/metrics` sets
    /// no kind the proxy never counts. (tests/admin.rs checks the counters at 0 of
    /// `UPSTREAM_ERROR_KINDS`, which once named each kind, `body_aborted` too.)
    #[test]
    fn every_kind_is_counted_from_zero() {
        let errors = [
            ProxyError::BadRequest,
            ProxyError::Unforwardable("two Host fields"),
            ProxyError::BodyTooLarge,
            ProxyError::ForwardingLoop,
            ProxyError::TransferCodingNotImplemented,
            ProxyError::ClientAborted,
            ProxyError::ClientTimeout,
            ProxyError::Upstream("refused".into()),
            ProxyError::ConnectTimeout,
            ProxyError::ResponseTimeout,
            ProxyError::UpstreamOverflow,
        ];
        for e in &errors {
            assert!(
                crate::metrics::UPSTREAM_ERROR_KINDS.contains(&e.kind()),
                "{}",
                e.kind()
            );
        }
        let counted: std::collections::BTreeSet<&str> = errors
            .iter()
            .map(ProxyError::kind)
            .chain(["body_aborted"])
            .collect();
        let set: std::collections::BTreeSet<&str> =
            crate::metrics::UPSTREAM_ERROR_KINDS.into_iter().collect();
        assert_eq!(set, counted);
        let readme = include_str!("../../README.md");
        let row = readme
            .lines()
            .find(|l| l.starts_with("| `rocgate_upstream_errors_total` |"))
            .expect("README's row of rocgate_upstream_errors_total");
        for kind in set {
            assert!(row.contains(&format!("`{kind}`")), "README names no {kind}");
        }
    }
}
