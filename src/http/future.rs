//! [`ResponseFuture`]: the inner service's future, after any pacing or queueing wait
//! and the inner service's readiness; or a ready rejection.
//!
//! A request admitted at once is passed to the inner service in `call` if that is
//! ready then. One that must wait (leaky-bucket pacing, concurrency queue), or finds
//! the inner service not ready, takes that service with it, leaving a clone in its
//! place: after its wait it drives the service to readiness (`poll_ready`, as tower's
//! `Oneshot` does) and calls it. So a service that does work in `call` (a timeout
//! that starts its timer there) sees the request only when it is admitted and the
//! service is ready, and the service readied is the one called. An error from the
//! inner service's `poll_ready` is the response future's error. A concurrency permit
//! is held from admission on, through the wait for readiness (the request is in
//! flight for the engine; the permit goes if the future is dropped), and goes into the
//! response's extensions as a [`HeldPermit`]: it is released when the response (head
//! and extensions) is dropped, which a hyper server does once it has written the head,
//! unless something moves it into the body ([`hold_permit_through_body`], as `rocgate
//! serve` does).

use super::layer::Place;
use crate::limiter::{Permit, Ticket};
use axum::body::Body;
use http::{Request, Response};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tower::Service;

/// What an admitted request waits for before the inner service is called.
pub(crate) enum Wait {
    /// Its departure from a leaky bucket, holding its place there until then (given
    /// back if the request is dropped before).
    Sleep(Pin<Box<tokio::time::Sleep>>, Option<Box<Place>>),
    /// A concurrency permit.
    Ticket(Ticket),
}

/// A concurrency permit in an admitted response's extensions: the request counts as
/// in flight until every clone of it is dropped. Move it into the response body to
/// count a streamed body as in flight too ([`hold_permit_through_body`]). Where
/// layers are stacked, it holds the permits of the layers inside it too.
#[derive(Clone, Debug)]
pub struct HeldPermit {
    permit: Arc<Permit>,
    /// The permit a layer inside this one put in the response, if any.
    inner: Option<Box<HeldPermit>>,
}

impl HeldPermit {
    /// These permits, released without their holds counted into the wait their routes
    /// tell refused requests ([`Permit::stop_timing`]): for permits that go on with an
    /// upgraded connection (a WebSocket tunnel), open for as long as its two ends keep
    /// it, which says nothing of how long the route's requests are served in.
    /// `rocgate serve` does this with the permit a 101 hands its tunnel. A clone of
    /// this `HeldPermit` held elsewhere (the response's extensions cloned) leaves its
    /// permits timed: take it out of the response, as `serve` does.
    #[must_use]
    pub fn untimed(mut self) -> Self {
        if let Some(permit) = Arc::get_mut(&mut self.permit) {
            permit.stop_timing();
        }
        self.inner = self.inner.map(|inner| Box::new(inner.untimed()));
        self
    }
}

/// Moves an admitted response's concurrency permit ([`HeldPermit`], put in its
/// extensions by the admission layer) into its body, so that a request counts as in
/// flight until its response body has been sent (or dropped), not only its head.
/// `rocgate serve` does this; with the layer, map responses with it outside
/// [`AdmissionLayer`](super::AdmissionLayer):
///
/// ```
/// use axum::{routing::get, Router};
/// use rocgate::config::{Config, RouteConfig, RouteMatch};
/// use rocgate::http::{hold_permit_through_body, AdmissionLayer};
/// use rocgate::limiter::Algorithm;
/// use tower::ServiceBuilder;
///
/// let mut feed = RouteConfig::new("feed", RouteMatch::prefix("/feed"));
/// feed.algorithm = Algorithm::Concurrency { queue: 0 };
/// feed.controller.base_limit_rps = 100.0; // 100 streams at once
/// let app: Router = Router::new().route("/feed", get(|| async { "events" })).layer(
///     ServiceBuilder::new()
///         .map_response(hold_permit_through_body)
///         .layer(AdmissionLayer::from_config(&Config::new(vec![feed]))?),
/// );
/// # Ok::<(), rocgate::config::ConfigError>(())
/// ```
///
/// A response without a permit (another algorithm, a rejection) is returned as it
/// is; one with a permit gets its body boxed once more.
pub fn hold_permit_through_body(mut response: Response<Body>) -> Response<Body> {
    match response.extensions_mut().remove::<HeldPermit>() {
        Some(held) => response.map(|body| Body::new(HoldUntilEnd::new(body, held))),
        None => response,
    }
}

/// A response body that holds `guard` until the body ends (or is dropped): a
/// concurrency permit, or in `rocgate serve` a connection's count of requests in
/// progress.
#[derive(Debug)]
pub(crate) struct HoldUntilEnd<B, G> {
    body: B,
    guard: Option<G>,
}

impl<B, G> HoldUntilEnd<B, G> {
    /// `body`, holding `guard` until its end.
    pub(crate) fn new(body: B, guard: G) -> Self {
        HoldUntilEnd {
            body,
            guard: Some(guard),
        }
    }
}

impl<B: http_body::Body + Unpin, G: Unpin> http_body::Body for HoldUntilEnd<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

pin_project! {
    /// The future of [`AdmissionService`](super::AdmissionService) over a service `S`.
    #[project = FutureProj]
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody, ResBody>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // Admitted after `wait` (if any); then the service is readied and called.
        // Boxed, so that the future of a request called at once stays small.
        Waiting {
            wait: Option<Wait>,
            permit: Option<Permit>,
            call: Option<Box<(S, Request<ReqBody>)>>,
        },
        Admitted { #[pin] inner: S::Future, permit: Option<Permit> },
        Rejected { response: Option<Response<ResBody>> },
        // The inner service failed to become ready.
        Failed { error: Option<S::Error> },
    }
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>>,
{
    pub(crate) fn admitted(inner: S::Future, permit: Option<Permit>) -> Self {
        ResponseFuture {
            kind: Kind::Admitted { inner, permit },
        }
    }

    /// Once `wait` (if any) is over, readies `service` and calls it with `req`,
    /// holding `permit` (a concurrency permit, if any) throughout.
    pub(crate) fn waiting(
        wait: Option<Wait>,
        permit: Option<Permit>,
        service: S,
        req: Request<ReqBody>,
    ) -> Self {
        ResponseFuture {
            kind: Kind::Waiting {
                wait,
                permit,
                call: Some(Box::new((service, req))),
            },
        }
    }

    /// The inner service's readiness error.
    pub(crate) fn failed(error: S::Error) -> Self {
        ResponseFuture {
            kind: Kind::Failed { error: Some(error) },
        }
    }

    pub(crate) fn rejected(response: Response<ResBody>) -> Self {
        ResponseFuture {
            kind: Kind::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqBody, ResBody> std::fmt::Debug for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            match kind.as_mut().project() {
                KindProj::Waiting { wait, permit, call } => {
                    match wait {
                        Some(Wait::Sleep(sleep, place)) => {
                            ready!(sleep.as_mut().poll(cx));
                            if let Some(place) = place {
                                place.depart();
                            }
                        }
                        Some(Wait::Ticket(ticket)) => {
                            *permit = Some(ready!(Pin::new(ticket).poll(cx)));
                        }
                        None => {}
                    }
                    *wait = None;
                    let Some(mut pending) = call.take() else {
                        return Poll::Pending;
                    };
                    match pending.0.poll_ready(cx) {
                        Poll::Pending => {
                            *call = Some(pending);
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(error)) => {
                            *permit = None;
                            return Poll::Ready(Err(error));
                        }
                        Poll::Ready(Ok(())) => {}
                    }
                    let (mut service, req) = *pending;
                    let inner = service.call(req);
                    let permit = permit.take();
                    kind.set(Kind::Admitted { inner, permit });
                }
                KindProj::Admitted { inner, permit } => {
                    // Without a permit the inner future's output is the answer, written
                    // where the caller wants it rather than taken apart and rebuilt.
                    if permit.is_none() {
                        return inner.poll(cx);
                    }
                    let mut response = ready!(inner.poll(cx))?;
                    if let Some(permit) = permit.take() {
                        // Inserting it would drop the permit of a layer inside this one.
                        let extensions = response.extensions_mut();
                        let inner = extensions.remove::<HeldPermit>().map(Box::new);
                        extensions.insert(HeldPermit {
                            permit: Arc::new(permit),
                            inner,
                        });
                    }
                    return Poll::Ready(Ok(response));
                }
                KindProj::Rejected { response } => {
                    return match response.take() {
                        Some(r) => Poll::Ready(Ok(r)),
                        None => Poll::Pending,
                    }
                }
                KindProj::Failed { error } => {
                    return match error.take() {
                        Some(e) => Poll::Ready(Err(e)),
                        None => Poll::Pending,
                    }
                }
            }
        }
    }
}
