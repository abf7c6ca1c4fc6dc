//! Distributed routes in `rocgate serve`: requests on routes the Redis store shares
//! are decided by [`RedisStore::check`] (one round trip, or a local decision within
//! `timeout`) and forwarded directly; every other request goes through the admission
//! layer as before. Without a store, [`Front`] is the layer itself behind one branch.

use super::forward::Forwarder;
use crate::clock::Clock;
use crate::http::{rejection, MatchedRoute, SharedEngine};
use crate::limiter::Decision;
use crate::store::redis::RedisStore;
use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use pin_project_lite::pin_project;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

type Reply = Result<Response<Body>, Infallible>;

/// The proxy's front service: the admission layer (`layered`), and, with a store, the
/// shared decision for distributed routes.
#[derive(Clone)]
pub(crate) struct Front<S> {
    layered: S,
    shared: Option<Arc<SharedGate>>,
    /// Forwards the admitted requests of distributed routes.
    direct: Forwarder,
}

pub(crate) struct SharedGate {
    pub(crate) store: RedisStore,
    pub(crate) engine: SharedEngine,
    pub(crate) clock: Arc<dyn Clock>,
}

impl<S> Front<S> {
    /// The layered service, with the shared decision (if any) forwarding through
    /// `direct`.
    pub(crate) fn new(layered: S, shared: Option<Arc<SharedGate>>, direct: Forwarder) -> Self {
        Front {
            layered,
            shared,
            direct,
        }
    }
}

pin_project! {
    #[project = FrontProj]
    pub(crate) enum FrontFuture<F> {
        Layered { #[pin] inner: F },
        Shared { inner: Pin<Box<dyn Future<Output = Reply> + Send>> },
    }
}

impl<F: Future<Output = Reply>> Future for FrontFuture<F> {
    type Output = Reply;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        match self.project() {
            FrontProj::Layered { inner } => inner.poll(cx),
            FrontProj::Shared { inner } => inner.as_mut().poll(cx),
        }
    }
}

impl<S> Service<Request<Incoming>> for Front<S>
where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = FrontFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.layered.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let Some(gate) = &self.shared else {
            return FrontFuture::Layered {
                inner: self.layered.call(req),
            };
        };
        let engine = gate.engine.load();
        let route = engine
            .route_for(req.method().as_str(), req.uri().path())
            .filter(|r| gate.store.shares(&engine, *r));
        let Some(route) = route else {
            return FrontFuture::Layered {
                inner: self.layered.call(req),
            };
        };
        let gate = Arc::clone(gate);
        let mut direct = self.direct.clone();
        let now = gate.clock.now();
        FrontFuture::Shared {
            inner: Box::pin(async move {
                let mut req = req;
                // Counted in the engine by the store.
                let decision = gate.store.check(&engine, route, now).await;
                match decision {
                    Decision::Reject(rej) => {
                        let name = engine.route_name(route);
                        // The limit the decision enforced: a base limit in force below
                        // the shared limit last seen is (in fallback, in batched mode),
                        // and none is under `fail_mode = "closed"` in fallback.
                        let limit = gate
                            .store
                            .limit_in_force(&engine, route, rej.reason, now)
                            .or_else(|| engine.limit_rps(route))
                            .unwrap_or(0.0);
                        // For a cut (and a fallback under one), the shared restore
                        // schedule with jitter, as the admission layer tells of a local
                        // route's.
                        let eta = name.and_then(|name| gate.store.restore_eta(name, now));
                        let retry_after = rejection::retry_after(&rej, eta);
                        Ok(rejection::respond_at_limit(
                            &engine,
                            route,
                            &rej,
                            retry_after,
                            limit,
                        ))
                    }
                    Decision::Admit(_) => {
                        if let Some(label) = engine.route_label(route) {
                            req.extensions_mut().insert(MatchedRoute(label));
                        }
                        direct.call(req).await
                    }
                }
            }),
        }
    }
}
