//! The concurrency limiter: permits held by RAII guards, with an optional bounded
//! queue of tickets.
//!
//! # When a refused request is told to come back
//!
//! A permit given the clock its grant's `now` was read from ([`Permit::time_on`])
//! is timed from its grant to its release, and the limiter keeps a moving mean `H` of how
//! long a permit is held (each release weighing 1/8; kept within 0.1%). A request refused is told
//! when, on average, a permit comes free for it: with `n` permits held, each for about
//! `H` and granted at unrelated times, one comes free every `H / n` on average; it needs
//! as many releases as bring the permits in flight under the limit (one, unless the
//! limit was lowered under them) plus one for each request queued ahead of it, so
//! `releases × H / n`, at most [`CONCURRENCY_RETRY_MAX`]. Until a hold has been timed,
//! 1 s. At a limit of 0 no release admits it: [`CONCURRENCY_RETRY_MAX`], the longest
//! this limiter tells (as a token bucket at a limit of 0 tells the longest it can). A
//! permit that goes on with something other than a request (a WebSocket tunnel) is not
//! timed ([`Permit::stop_timing`]).

use super::{reject, Admit, Decision, Level, Reason, MAX_PERMITS};
use crate::clock::{duration_nanos, Clock, Nanos};
use crate::sync::{Arc, AtomicU16, AtomicU32, Ordering};
use event_listener::{Event, EventListener, IntoNotification};
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

/// Limits requests in flight. A permit is an RAII guard: dropping it frees the slot.
/// With a queue, requests over the limit may wait (await the [`Ticket`]); requests
/// beyond the queue are rejected with `queue_full`, without a queue with `concurrency`.
#[derive(Debug, Clone)]
pub struct Concurrency {
    shared: Arc<ConcurrencyShared>,
}

#[derive(Debug)]
struct ConcurrencyShared {
    in_flight: AtomicU32,
    waiting: AtomicU32,
    limit: AtomicU32,
    /// Requests that may wait; set anew when a reload hands the permits to a route
    /// with another queue ([`Concurrency::handed_over`]).
    queue: AtomicU32,
    /// Queued tickets listen here, in order; each freed permit notifies one more.
    freed: Event,
    /// A partitioned route's key keeps the route generation its limit was set for
    /// here, beside its permits, and its tier (see [`Concurrency::for_key`]): its place
    /// in the key table then holds only this state's address and a second. Unused at
    /// route level, where they fill what would be padding.
    key_generation: AtomicU32,
    key_tier: u16,
    /// A moving mean of how long a permit is held, µs, packed in 16 bits
    /// ([`pack_us`]); 0 until one is timed. In what was padding: a partitioned
    /// route's every key holds one. (The clock a permit is timed on goes with the
    /// permit, for the same reason.)
    mean_hold: AtomicU16,
}

/// The clock permits are timed on ([`Permit::time_on`]): behind an `Arc` of its own,
/// so that a permit holds it in one word.
pub struct HoldClock(std::sync::Arc<dyn Clock>);

impl HoldClock {
    /// Permits timed on `clock`, which must be the clock the `now` given to
    /// [`Concurrency::check`] is read from: a hold is timed from that `now`.
    pub fn new(clock: std::sync::Arc<dyn Clock>) -> Self {
        HoldClock(clock)
    }

    fn now(&self) -> Nanos {
        self.0.now()
    }
}

impl std::fmt::Debug for HoldClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoldClock")
    }
}

/// How long a refused request is told to wait while no permit's hold has been timed.
const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

/// The longest a request refused for a permit is told to wait. The wait is a mean
/// over past holds: past a minute that says little of when the next permit frees (a
/// controller restoring the limit frees permits at once, and a request already in
/// flight may end any moment), and a client told longer is better told to come back
/// and be told again. Also what a request refused at a limit of 0 is told, which no
/// release admits.
pub const CONCURRENCY_RETRY_MAX: Duration = Duration::from_secs(60);

// `in_flight` and `waiting` are read and written in sequentially consistent order: a
// ticket counts itself in `waiting` before it tries for a permit, a release frees its
// permit before it reads `waiting`, so either the ticket sees the permit free or the
// release sees the ticket waiting and notifies. So are `in_flight` and `limit`: a
// release frees its permit before it reads the limit (it notifies only under it),
// `set_limit` writes the limit before it reads `in_flight`. (On x86 this costs
// nothing: the writes are locked instructions anyway.)
impl ConcurrencyShared {
    fn try_acquire(&self) -> bool {
        let limit = self.limit.load(Ordering::SeqCst);
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Wakes up to `n` more queued tickets to try for a permit. With none queued it
    /// leaves the event alone (its state is allocated on first use).
    fn notify_waiting(&self, n: u32) {
        // After the write that frees permits (see `seq_cst_fence_under_loom`).
        crate::sync::seq_cst_fence_under_loom();
        if n > 0 && self.waiting.load(Ordering::SeqCst) > 0 {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            self.freed.notify(n.additional());
        }
    }

    /// Counts a permit granted at `granted`, released now, into the mean hold, if
    /// holds are timed. Two releases at once may each write the mean from the same
    /// read: one of the two samples is then lost, which a mean of many can afford
    /// (a compare-and-swap loop would make releases contend).
    fn time_hold(&self, granted: Nanos, clock: &HoldClock) {
        let held_us = clock.now().saturating_since(granted).as_micros();
        let held = i64::try_from(held_us).unwrap_or(i64::MAX).max(1);
        let mean = unpack_us(self.mean_hold.load(Ordering::Relaxed));
        let mean = if mean == 0 {
            held
        } else {
            mean + (held - mean) / 8
        };
        self.mean_hold.store(pack_us(mean), Ordering::Relaxed);
    }

    /// How long a request refused now is told to wait, ns (see the module's docs).
    fn retry_after_ns(&self) -> u64 {
        let limit = u64::from(self.limit.load(Ordering::Relaxed));
        if limit == 0 {
            return duration_nanos(CONCURRENCY_RETRY_MAX);
        }
        let mean_us = unpack_us(self.mean_hold.load(Ordering::Relaxed)).unsigned_abs();
        if mean_us == 0 {
            return duration_nanos(CONCURRENCY_RETRY);
        }
        let held = u64::from(self.in_flight.load(Ordering::Relaxed)).max(1);
        let ahead = u64::from(self.waiting.load(Ordering::Relaxed));
        let releases = (held + 1).saturating_sub(limit).max(1) + ahead;
        let mean_ns = mean_us * 1_000;
        // In 64 bits but for a product that needs more (a mean of hours over many
        // releases): a 128-bit division is a call into the runtime library.
        let wait = match mean_ns.checked_mul(releases) {
            Some(product) => product / held,
            None => u64::try_from(u128::from(mean_ns) * u128::from(releases) / u128::from(held))
                .unwrap_or(u64::MAX),
        };
        wait.min(duration_nanos(CONCURRENCY_RETRY_MAX))
    }
}

impl Concurrency {
    /// No requests in flight; at most `limit` at once (up to `u32::MAX`), `queue`
    /// more waiting.
    pub fn new(limit: f64, queue: u32) -> Self {
        Concurrency::for_key(limit, queue, 0, 0)
    }

    /// [`new`](Self::new), for a key of a partitioned route, with the key's route
    /// `generation` and `tier` kept beside the permits ([`key_generation`],
    /// [`key_tier`]).
    ///
    /// [`key_generation`]: Self::key_generation
    /// [`key_tier`]: Self::key_tier
    pub(crate) fn for_key(limit: f64, queue: u32, generation: u32, tier: u16) -> Self {
        Concurrency {
            shared: Arc::new(ConcurrencyShared {
                in_flight: AtomicU32::new(0),
                waiting: AtomicU32::new(0),
                limit: AtomicU32::new(permits(limit)),
                queue: AtomicU32::new(queue),
                freed: Event::new(),
                key_generation: AtomicU32::new(generation),
                key_tier: tier,
                mean_hold: AtomicU16::new(0),
            }),
        }
    }

    /// The route generation a key's limit was last set for (see
    /// [`for_key`](Self::for_key)).
    pub(crate) fn key_generation(&self) -> &AtomicU32 {
        &self.shared.key_generation
    }

    /// A key's tier (see [`for_key`](Self::for_key)).
    pub(crate) fn key_tier(&self) -> u16 {
        self.shared.key_tier
    }

    /// Takes a permit granted at `now`, a place in the queue, or neither.
    pub fn check(&self, now: Nanos) -> Decision {
        let s = &self.shared;
        if s.waiting.load(Ordering::SeqCst) == 0 && s.try_acquire() {
            return Decision::Admit(Admit::Held(Permit::new(Arc::clone(s), now)));
        }
        let queue = s.queue.load(Ordering::Relaxed);
        if queue == 0 {
            return reject(s.retry_after_ns(), Reason::Concurrency);
        }
        let queued = s
            .waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < queue).then_some(n + 1)
            })
            .is_ok();
        if queued {
            // After counting itself in `waiting`, the ticket reads `in_flight` (see
            // `seq_cst_fence_under_loom`).
            crate::sync::seq_cst_fence_under_loom();
            Decision::Admit(Admit::Queued(Ticket {
                shared: ManuallyDrop::new(Some(Arc::clone(s))),
                listener: None,
                clock: None,
            }))
        } else {
            reject(s.retry_after_ns(), Reason::QueueFull)
        }
    }

    /// Changes the number of permits. Requests in flight keep theirs; lowering the
    /// limit only stops new ones until enough have finished; raising it wakes as many
    /// queued requests as it frees permits.
    pub fn set_limit(&self, limit: f64) {
        let s = &self.shared;
        let limit = permits(limit);
        s.limit.store(limit, Ordering::SeqCst);
        crate::sync::seq_cst_fence_under_loom();
        s.notify_waiting(limit.saturating_sub(s.in_flight.load(Ordering::SeqCst)));
    }

    /// The same permits and queue, for a route that a reload rebuilds around them,
    /// taking at most `queue` waiting from now on: the permits held and the requests
    /// queued stay, and are counted under its limit, which it sets; releasing a permit
    /// frees a place in it. Lowering the queue leaves the requests already queued
    /// there, as lowering the limit leaves the permits held.
    pub(crate) fn handed_over(&self, queue: u32) -> Concurrency {
        self.shared.queue.store(queue, Ordering::Relaxed);
        self.clone()
    }

    /// Requests in flight and the limit.
    pub fn level(&self) -> Level {
        Level {
            value: f64::from(self.shared.in_flight.load(Ordering::Relaxed)),
            capacity: f64::from(self.shared.limit.load(Ordering::Relaxed)),
        }
    }

    /// Requests waiting for a permit.
    pub fn waiting(&self) -> u64 {
        u64::from(self.shared.waiting.load(Ordering::Relaxed))
    }

    /// Whether a request is queued, read `SeqCst` (see the engine's concurrency keys).
    pub(crate) fn has_waiters(&self) -> bool {
        self.shared.waiting.load(Ordering::SeqCst) > 0
    }

    /// Whether no permit is out and no request is queued, so that a fresh limiter
    /// would stand where this one does (a partitioned route evicts an idle key only
    /// then).
    ///
    /// A queued request that takes its permit counts itself in flight before it leaves
    /// the queue, so the queue is read first, then the permits, each with `Acquire`:
    /// a request seen gone from the queue is seen in flight. Read the other way round
    /// (or relaxed), a hand-over between the two reads looked idle, and the key was
    /// evicted while its permit was out (`tests/loom.rs`).
    pub(crate) fn is_idle(&self) -> bool {
        let s = &self.shared;
        s.waiting.load(Ordering::Acquire) == 0 && s.in_flight.load(Ordering::Acquire) == 0
    }
}

/// `us` (at least 1) in 16 bits: up to 2,047 exactly, above as its 11 leading bits
/// and how far they are shifted (5 bits): within 0.1%, up to 51 days.
pub(super) fn pack_us(us: i64) -> u16 {
    let us = u64::try_from(us).unwrap_or(1).clamp(1, 0x7FF << 31);
    let shift = (64 - us.leading_zeros()).saturating_sub(11);
    (u16::try_from(shift).unwrap_or(31) << 11) | u16::try_from(us >> shift).unwrap_or(0x7FF)
}

/// The µs that [`pack_us`] packed (0 for 0).
pub(super) fn unpack_us(packed: u16) -> i64 {
    i64::from(packed & 0x7FF) << (packed >> 11)
}

/// Whole permits for a limit of `limit` requests in flight: rounded down, but a limit
/// a rounding error short of a whole number is that number. A key's limit is computed
/// as `cut + (base − cut) × progress`, which for a route recovering at 16 between 1 and
/// 23 comes out as 15.999999999999998, and must give the route's 16 permits.
pub(crate) fn permits(limit: f64) -> u32 {
    let whole = limit.round();
    let n = if (limit - whole).abs() <= 1e-9 * whole.abs().max(1.0) {
        whole
    } else {
        limit.floor()
    };
    n.clamp(0.0, f64::from(MAX_PERMITS)) as u32
}

/// A slot in flight; dropping it lets the next request in.
#[derive(Debug)]
pub struct Permit {
    // Always `Some` until dropped. In `ManuallyDrop` so that the out-of-line `Drop`
    // below releases the `Arc` too: a `Decision`'s drop glue is then a tag check and
    // at most one call, small enough to inline on the paths that hold no permit.
    shared: ManuallyDrop<Option<Arc<ConcurrencyShared>>>,
    /// When it was granted, on `clock`.
    granted: Nanos,
    /// The clock its hold is timed on, if given one.
    clock: Option<std::sync::Arc<HoldClock>>,
}

impl Permit {
    fn new(shared: Arc<ConcurrencyShared>, granted: Nanos) -> Self {
        Permit {
            shared: ManuallyDrop::new(Some(shared)),
            granted,
            clock: None,
        }
    }

    /// Times this permit's hold on `clock`, the clock the `now` given to
    /// [`Concurrency::check`] was read from: released, it counts how long it was held
    /// into the wait its limiter tells refused requests. The tower layer (and so
    /// `rocgate serve`) times every permit it is handed; permits never timed leave
    /// that wait at 1 s.
    pub fn time_on(&mut self, clock: &std::sync::Arc<HoldClock>) {
        self.clock = Some(std::sync::Arc::clone(clock));
    }

    /// Undoes [`time_on`](Self::time_on): released, this permit leaves the wait its
    /// limiter tells refused requests as it is. For a permit that goes on with
    /// something other than a request, such as an upgraded connection (a WebSocket
    /// tunnel), whose life is not a request's service time: an hour's hold, weighing
    /// 1/8 in the mean, would tell every request refused after it the longest wait
    /// ([`CONCURRENCY_RETRY_MAX`]), though requests are served in milliseconds.
    pub fn stop_timing(&mut self) {
        self.clock = None;
    }
}

impl Drop for Permit {
    #[inline(never)]
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let left = shared.in_flight.fetch_sub(1, Ordering::SeqCst) - 1;
            // Only a release that leaves those in flight under the limit frees a
            // permit for a queued ticket: one over a lowered limit wakes none, which
            // would find no permit and wait again at the back of the line, behind
            // those queued after it. The limit is read after the write that frees the
            // permit, as `set_limit` reads `in_flight` after writing the limit (see
            // `seq_cst_fence_under_loom`): a raise racing a release sees the permit
            // freed, or the release sees the raise.
            crate::sync::seq_cst_fence_under_loom();
            if left < shared.limit.load(Ordering::SeqCst) {
                shared.notify_waiting(1);
            }
            // After the permit is free: its clock read does not delay the next holder.
            if let Some(clock) = &self.clock {
                shared.time_hold(self.granted, clock);
            }
        }
    }
}

/// A place in a concurrency queue. Awaiting it yields a [`Permit`]; dropping it
/// gives the place up. Waiters are woken in order, one per freed permit, but a woken
/// waiter competes with the next permit release, so the order is not strictly
/// first-come first-served. Polling it more often than it is woken is harmless.
#[derive(Debug)]
pub struct Ticket {
    // `None` once the permit is taken; `ManuallyDrop` as in `Permit`.
    shared: ManuallyDrop<Option<Arc<ConcurrencyShared>>>,
    /// Its place among the listeners for a freed permit, once it has had to wait.
    listener: Option<EventListener>,
    /// The clock the permit it takes is timed on, if given one.
    clock: Option<std::sync::Arc<HoldClock>>,
}

impl Future for Ticket {
    type Output = Permit;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit> {
        let Some(shared) = (*self.shared).clone() else {
            return Poll::Pending;
        };
        // A notification already in stands for a freed permit, the one this poll is
        // about to try for: taken first, it is not passed on if the permit is taken,
        // which would wake the next in line for nothing (and, polled, send it to the
        // back of the line).
        if let Some(listener) = self.listener.as_mut() {
            if Pin::new(listener).poll(cx).is_ready() {
                self.listener = None;
            }
        }
        // Try; if that fails, listen and try again (a permit freed before the listener
        // was in place notified nobody); then wait for a notification, and so on.
        while !shared.try_acquire() {
            match self.listener.as_mut() {
                None => self.listener = Some(shared.freed.listen()),
                Some(listener) => {
                    ready!(Pin::new(listener).poll(cx));
                    self.listener = None;
                }
            }
        }
        *self.shared = None;
        // A listener notified meanwhile passes its notification on as it drops.
        self.listener = None;
        shared.waiting.fetch_sub(1, Ordering::SeqCst);
        let clock = self.clock.take();
        let granted = clock.as_ref().map_or(Nanos::ZERO, |c| c.now());
        let mut permit = Permit::new(shared, granted);
        permit.clock = clock;
        Poll::Ready(permit)
    }
}

impl Ticket {
    /// [`Permit::time_on`], for the permit this ticket takes: timed from when it is
    /// taken.
    pub fn time_on(&mut self, clock: &std::sync::Arc<HoldClock>) {
        self.clock = Some(std::sync::Arc::clone(clock));
    }
}

impl Drop for Ticket {
    #[inline(never)]
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.waiting.fetch_sub(1, Ordering::SeqCst);
        }
        // A listener notified for a permit this ticket will not take passes the
        // notification on to the next one.
    }
}
