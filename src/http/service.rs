//! [`AdmissionService`]: decides in `call`, passes `poll_ready` through.

use super::future::{ResponseFuture, Wait};
use super::layer::{Gate, MatchedRoute};
use super::rejection;
use crate::limiter::{Admit, Decision};
use bytes::Bytes;
use http::{Request, Response};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The service built by [`AdmissionLayer`](super::AdmissionLayer).
#[derive(Clone)]
pub struct AdmissionService<S> {
    inner: S,
    gate: Arc<Gate>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for AdmissionService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S> AdmissionService<S> {
    pub(crate) fn new(inner: S, gate: Arc<Gate>) -> Self {
        AdmissionService { inner, gate }
    }
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for AdmissionService<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let gate = &*self.gate;
        let engine = gate.engine.load();
        let Some(route) = gate.route_of(&engine, &req) else {
            return ResponseFuture::admitted(self.inner.call(req), Wait::Ready, None);
        };
        let (decision, now, refused_at) = gate.decide(&engine, route, &req);
        let (wait, permit) = match decision {
            Decision::Admit(Admit::Now) => (Wait::Ready, None),
            Decision::Admit(Admit::Held(permit)) => (Wait::Ready, Some(permit)),
            Decision::Admit(Admit::Paced(delay)) => {
                (Wait::Sleep(Box::pin(tokio::time::sleep(delay))), None)
            }
            Decision::Admit(Admit::Queued(ticket)) => (Wait::Ticket(ticket), None),
            Decision::Reject(rejection) => {
                let eta = engine.restore_eta(route, now);
                let retry_after = rejection::retry_after(&rejection, eta);
                let limit = refused_at.unwrap_or_else(|| engine.limit_rps(route));
                return ResponseFuture::rejected(gate.rejections.respond(
                    &engine,
                    route,
                    &rejection,
                    retry_after,
                    limit,
                ));
            }
        };
        if gate.matched_route {
            req.extensions_mut()
                .insert(MatchedRoute(engine.route_label(route)));
        }
        ResponseFuture::admitted(self.inner.call(req), wait, permit)
    }
}
