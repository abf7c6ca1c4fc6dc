//! [`AdmissionService`]: decides in `call`, passes `poll_ready` through; a request
//! that must wait takes the readied inner service with it and calls it when admitted.

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
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: From<Bytes>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let gate = &*self.gate;
        let engine = gate.engine.load();
        let Some(route) = gate.route_of(&engine, &req) else {
            return ResponseFuture::admitted(self.inner.call(req), None);
        };
        let (decision, now, refused_at) = gate.decide(&engine, route, &req);
        let admit = match decision {
            Decision::Admit(admit) => admit,
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
        let wait = match admit {
            Admit::Now => return ResponseFuture::admitted(self.inner.call(req), None),
            Admit::Held(permit) => {
                return ResponseFuture::admitted(self.inner.call(req), Some(permit))
            }
            Admit::Paced(delay) => Wait::Sleep(Box::pin(tokio::time::sleep(delay))),
            Admit::Queued(ticket) => Wait::Ticket(ticket),
        };
        // The inner service `poll_ready` readied goes with the request; a clone, not
        // yet ready, stays for the next `poll_ready`.
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(wait, ready, req)
    }
}
