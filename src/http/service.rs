//! [`AdmissionService`]: always ready, decides in `call`; an admitted request takes the
//! inner service with it when that is not ready yet (or the request must wait), and
//! calls it once admitted and ready.

use super::future::{ResponseFuture, Wait};
use super::layer::{Gate, MatchedRoute, Place};
use super::rejection;
use crate::limiter::{Admit, Decision, Permit};
use bytes::Bytes;
use http::{Request, Response};
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// The service built by [`AdmissionLayer`](super::AdmissionLayer).
#[derive(Clone)]
pub struct AdmissionService<S> {
    inner: S,
    gate: Arc<Gate>,
    /// The peer of the one client connection this service serves, if it serves one
    /// (`rocgate serve`): taken as the request's [`PeerAddr`](super::PeerAddr), without
    /// an extension to insert in every request.
    peer: Option<SocketAddr>,
    /// Whether the forwarding headers of `peer`'s requests are read if it is a trusted
    /// proxy: not if a PROXY protocol header from it named no client, its requests then
    /// being its relayed client's as that client wrote them.
    peer_forwards: bool,
    /// Where the route of a request handed to the inner service at once goes, in
    /// place of a [`MatchedRoute`] extension, for an inner service that takes it from
    /// there as it is called (`rocgate serve`'s forwarder).
    #[cfg(feature = "proxy")]
    route_slot: Option<Arc<RouteSlot>>,
}

/// The route of the request an [`AdmissionService`] is handing to its inner service,
/// put just before it calls that service and taken by the service as it is called:
/// an inner service that serves one client connection (`rocgate serve`'s forwarder)
/// learns the route without an extension inserted in every request (a map and a box
/// allocated). A request called later (paced, queued, or its service not ready) still
/// carries the extension, and goes by it ([`RouteSlot::route_of`]): by then another
/// request may be using the slot.
#[cfg(feature = "proxy")]
#[derive(Debug, Default)]
pub(crate) struct RouteSlot(std::sync::Mutex<Option<Arc<str>>>);

#[cfg(feature = "proxy")]
impl RouteSlot {
    fn put(&self, route: Arc<str>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(route);
    }

    /// The route put for the request being called, if one was.
    fn take(&self) -> Option<Arc<str>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    /// The route of `req`, which the inner service is being called with: its
    /// [`MatchedRoute`] if it carries one, else the one put for it. A request that
    /// carries one was called later than admitted, from a task of its own: on an
    /// HTTP/2 connection that may be just as the connection's task has put another
    /// stream's route here, which it leaves to that stream.
    pub(crate) fn route_of<B>(&self, req: &Request<B>) -> Option<Arc<str>> {
        match req.extensions().get::<MatchedRoute>() {
            Some(m) => Some(Arc::clone(&m.0)),
            None => self.take(),
        }
    }
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
        AdmissionService {
            inner,
            gate,
            peer: None,
            peer_forwards: true,
            #[cfg(feature = "proxy")]
            route_slot: None,
        }
    }

    /// This service for the requests of one client connection, from `peer`, whose
    /// forwarding headers are read if it is a trusted proxy and it `forwards` (not a
    /// load balancer whose PROXY protocol header named no client).
    #[cfg(feature = "proxy")]
    pub(crate) fn for_peer(mut self, peer: SocketAddr, forwards: bool) -> Self {
        self.peer = Some(peer);
        self.peer_forwards = forwards;
        self
    }

    /// This service handing the route of each request it calls at once to its inner
    /// service through `slot`, not in a [`MatchedRoute`] extension.
    #[cfg(feature = "proxy")]
    pub(crate) fn handing_route(mut self, slot: Arc<RouteSlot>) -> Self {
        self.route_slot = Some(slot);
        self
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

    /// Always ready: a request the engine rejects needs nothing from the inner
    /// service, so it is never kept waiting for it. An admitted request readies the
    /// inner service itself (see [`ResponseFuture`]).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        let gate = &*self.gate;
        // Admitted by a layer over this engine already (outside this one, over the
        // same engine): one arrival, decided once. Built to hand the route on, this
        // layer still does, its own, where the outer one did not.
        if gate.engine.mark().on(&req) {
            let label = (gate.matched_route && req.extensions().get::<MatchedRoute>().is_none())
                .then(|| {
                    let engine = gate.engine.guard();
                    gate.route_of(&engine, &req)
                        .and_then(|route| engine.route_label(route))
                })
                .flatten();
            return self.forward(req, None, label);
        }
        let engine = gate.engine.guard();
        let Some(route) = gate.route_of(&engine, &req) else {
            return self.forward(req, None, None);
        };
        let decided = gate.decide(&engine, route, &req, self.peer, self.peer_forwards);
        let admit = match decided.decision {
            Decision::Admit(admit) => admit,
            Decision::Reject(rejection) => {
                let eta = decided.restore_eta;
                let retry_after = rejection::retry_after_on(&engine, route, &rejection, eta);
                let limit = decided
                    .refused_at
                    .or_else(|| engine.limit_rps(route))
                    .unwrap_or(0.0);
                let mut res =
                    gate.rejections
                        .respond(&engine, route, &rejection, retry_after, limit);
                if req.method() == http::Method::HEAD {
                    // No body, the GET's `Content-Length`: hyper's HTTP/2 server sends
                    // a body it is given, in DATA frames a HEAD's stream must not carry.
                    *res.body_mut() = ResBody::from(Bytes::new());
                }
                return ResponseFuture::rejected(res);
            }
        };
        self.mark_decided(&mut req);
        // The name's `Arc` is cloned only when it is handed on: its count is one word
        // every core's admitted requests would write.
        let label = gate
            .matched_route
            .then(|| engine.route_label(route))
            .flatten();
        match admit {
            Admit::Now => self.forward(req, None, label),
            Admit::Held(mut permit) => {
                permit.time_on(&gate.hold_clock);
                self.forward(req, Some(permit), label)
            }
            Admit::Paced(pace) => {
                if let Some(label) = label {
                    req.extensions_mut().insert(MatchedRoute(label));
                }
                let wait = pace.wait(decided.now);
                // The place first: should the timer panic (no tokio runtime, or one
                // without timers), the place is given back as the panic unwinds.
                let place = decided.paced_key.map(|key| {
                    let engine = arc_swap::Guard::into_inner(engine);
                    Box::new(Place::new(
                        engine,
                        Arc::clone(&gate.clock),
                        route,
                        key,
                        pace,
                    ))
                });
                let sleep = Box::pin(tokio::time::sleep(wait));
                self.take_along(Some(Wait::Sleep(sleep, place)), None, req)
            }
            Admit::Queued(mut ticket) => {
                ticket.time_on(&gate.hold_clock);
                if let Some(label) = label {
                    req.extensions_mut().insert(MatchedRoute(label));
                }
                self.take_along(Some(Wait::Ticket(ticket)), None, req)
            }
        }
    }
}

impl<S: Clone> AdmissionService<S> {
    /// Marks an admitted request as decided by this service's engine, for a layer over
    /// the same engine inside this one to pass through (see `super::decided`). Not a
    /// request that `rocgate serve`'s forwarder takes its route through the slot of: no
    /// layer lies inside this one there, and its requests carry no extensions the mark
    /// could go beside without an allocation.
    fn mark_decided<ReqBody>(&self, req: &mut Request<ReqBody>) {
        #[cfg(feature = "proxy")]
        if self.route_slot.is_some() {
            return;
        }
        self.gate.engine.mark().put(req);
    }

    /// Passes an admitted request on: called at once if the inner service is ready
    /// now (the common case, at no cost beyond its `poll_ready`), else taken along
    /// with that service to be called once it is.
    ///
    /// The inner service is polled here with a waker that does nothing: if it is not
    /// ready, the response future polls the very same service again with its own
    /// waker before it waits, so no wake-up is lost.
    fn forward<ReqBody, ResBody>(
        &mut self,
        mut req: Request<ReqBody>,
        permit: Option<Permit>,
        route: Option<Arc<str>>,
    ) -> ResponseFuture<S, ReqBody, ResBody>
    where
        S: tower::Service<Request<ReqBody>>,
    {
        match self
            .inner
            .poll_ready(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(Ok(())) => {
                if let Some(route) = route {
                    self.hand_route(&mut req, route);
                }
                ResponseFuture::admitted(self.inner.call(req), permit)
            }
            Poll::Ready(Err(error)) => {
                // A service that failed is not polled again: a clone takes its place.
                self.inner = self.inner.clone();
                ResponseFuture::failed(error)
            }
            Poll::Pending => {
                if let Some(route) = route {
                    req.extensions_mut().insert(MatchedRoute(route));
                }
                self.take_along(None, permit, req)
            }
        }
    }

    /// Tells the inner service, about to be called with `req`, the route that admitted
    /// it: through the route slot if there is one, else in a [`MatchedRoute`]
    /// extension.
    fn hand_route<ReqBody>(&self, req: &mut Request<ReqBody>, route: Arc<str>) {
        #[cfg(feature = "proxy")]
        if let Some(slot) = &self.route_slot {
            slot.put(route);
            return;
        }
        req.extensions_mut().insert(MatchedRoute(route));
    }

    /// A response future that, after `wait`, readies the inner service and calls it.
    /// The service it readies is the one it calls: this one (already polled, perhaps
    /// holding a place in the inner service's own queue), with a clone left here for
    /// the next request.
    fn take_along<ReqBody, ResBody>(
        &mut self,
        wait: Option<Wait>,
        permit: Option<Permit>,
        req: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, ResBody>
    where
        S: tower::Service<Request<ReqBody>>,
    {
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::waiting(wait, permit, service, req)
    }
}

#[cfg(all(test, feature = "proxy"))]
mod tests {
    use super::{AdmissionService, RouteSlot};
    use crate::clock::{Clock as _, ManualClock, Nanos};
    use crate::config::{Config, RouteConfig, RouteMatch};
    use crate::engine::Engine;
    use crate::http::{AdmissionLayer, MatchedRoute, SharedEngine};
    use crate::limiter::Algorithm;
    use axum::body::Body;
    use http::{Request, Response};
    use std::convert::Infallible;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, SystemTime};
    use tower::{Layer as _, Service as _, ServiceExt as _};

    /// What the inner service found as it was called: the route in the slot, and the
    /// request's `MatchedRoute` extension.
    type Seen = Arc<Mutex<Vec<(Option<Arc<str>>, Option<MatchedRoute>)>>>;

    /// An admission service over `route`, handing routes through a slot to an inner
    /// service that records what it finds as it is called.
    fn service(
        route: RouteConfig,
    ) -> (
        impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
        Seen,
    ) {
        let slot = Arc::new(RouteSlot::default());
        let seen = Seen::default();
        let inner = tower::service_fn({
            let (slot, seen) = (Arc::clone(&slot), Arc::clone(&seen));
            move |req: Request<Body>| {
                let found = (slot.take(), req.extensions().get::<MatchedRoute>().cloned());
                seen.lock().unwrap().push(found);
                async { Ok::<_, Infallible>(Response::new(Body::empty())) }
            }
        });
        (handing(route, slot, inner), seen)
    }

    /// An admission service over `route` handing routes through `slot` to `inner`.
    fn handing<S>(route: RouteConfig, slot: Arc<RouteSlot>, inner: S) -> AdmissionService<S> {
        let clock = Arc::new(ManualClock::starting_at(Nanos::from_secs(1)));
        let config = Config::new(vec![route]);
        let engine = Engine::new(&config, clock.now(), SystemTime::UNIX_EPOCH).unwrap();
        let layer = AdmissionLayer::with_engine(SharedEngine::new(engine), clock)
            .matched_route(true)
            .build();
        layer.layer(inner).handing_route(slot)
    }

    /// A route `name` paced by a leaky bucket of 1 req/s with a queue of 2.
    fn paced(name: &str) -> RouteConfig {
        let mut r = RouteConfig::new(name, RouteMatch::prefix("/"));
        r.controller.base_limit_rps = 1.0;
        r.controller.cut_limit_rps = 1.0;
        r.algorithm = Algorithm::LeakyBucket { queue: 2 };
        r
    }

    fn get(path: &str) -> Request<Body> {
        Request::get(path).body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn a_request_called_at_once_gets_its_route_through_the_slot_alone() {
        let mut r = RouteConfig::new("slot_now", RouteMatch::prefix("/"));
        r.controller.base_limit_rps = 100.0;
        r.controller.cut_limit_rps = 100.0;
        let (mut svc, seen) = service(r);
        svc.ready().await.unwrap().call(get("/a")).await.unwrap();
        svc.ready().await.unwrap().call(get("/b")).await.unwrap();
        let seen = seen.lock().unwrap();
        let want = (Some(Arc::<str>::from("slot_now")), None);
        assert_eq!(
            *seen,
            [want.clone(), want],
            "no extension, the slot each time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_called_later_carries_its_route_in_the_extension() {
        // The second request departs a second later, its inner service called only
        // then.
        let (mut svc, seen) = service(paced("slot_paced"));
        svc.ready().await.unwrap().call(get("/a")).await.unwrap();
        let started = tokio::time::Instant::now();
        svc.ready().await.unwrap().call(get("/b")).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(900), "paced");
        let seen = seen.lock().unwrap();
        let route = Arc::<str>::from("slot_paced");
        assert_eq!(seen[0], (Some(Arc::clone(&route)), None));
        assert_eq!(seen[1], (None, Some(MatchedRoute(route))), "{seen:?}");
    }

    /// A request called later than it was admitted (paced here; queued, or its service
    /// not ready, alike) is called from its own task, which on an HTTP/2 connection
    /// may run on another thread just as the connection's task has put the route of
    /// another stream, called at once, in the slot. It goes by its extension and
    /// leaves that route to the request it was put for. It used to take the slot
    /// first: it was recorded under the other stream's route, and that stream, finding
    /// the slot empty and no extension, under no route at all.
    #[tokio::test(start_paused = true)]
    async fn a_request_called_later_leaves_the_slot_to_the_one_called_at_once() {
        let r = paced("slot_later");
        let slot = Arc::new(RouteSlot::default());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let inner = tower::service_fn({
            let (slot, seen) = (Arc::clone(&slot), Arc::clone(&seen));
            move |req: Request<Body>| {
                seen.lock().unwrap().push(slot.route_of(&req));
                async { Ok::<_, Infallible>(Response::new(Body::empty())) }
            }
        });
        let mut svc = handing(r, Arc::clone(&slot), inner);
        svc.ready().await.unwrap().call(get("/a")).await.unwrap();
        let paced = svc.ready().await.unwrap().call(get("/b"));
        // The route of a stream being called at once on the connection's task.
        slot.put(Arc::from("other_stream"));
        paced.await.unwrap();
        let route = Some(Arc::<str>::from("slot_later"));
        assert_eq!(*seen.lock().unwrap(), [route.clone(), route]);
        assert_eq!(
            slot.take().as_deref(),
            Some("other_stream"),
            "left in the slot"
        );
    }
}
