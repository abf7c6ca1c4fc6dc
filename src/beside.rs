//! Two futures run in one task, each polled only when it has been woken: [`Beside`].
//!
//! `rocgate serve` runs a client connection beside its lane's upstream connection
//! (`proxy::lane`), so that the wakes they give each other are taken in the poll under
//! way rather than waking the task again. Each future has a waker of its own; a wake
//! that arrives while the task is being polled only marks its future, and after the
//! poll the [`Beside`] wakes the task again if a future was marked meanwhile. A wake
//! lost between the two would leave a connection waiting forever, so the protocol is
//! model-checked with loom (`tests/loom.rs`, README "Model checking (loom)"): it is in
//! the core, with its flags and lock from `crate::sync`, and needs no runtime.
//!
//! The wakers are `std`'s `Arc`s even under loom, as [`std::task::Waker`] is made from
//! a `std::sync::Arc` only: their counts are no part of the protocol; the flags and
//! the lock they hold are loom's.

use crate::sync::{AtomicBool, Mutex, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker};

/// Most passes over its two futures a [`Beside`] makes in one poll: the wakes they
/// give each other are taken in the same poll, but a future that keeps waking itself
/// (tokio's budget spent) must let the task yield.
const PASSES: usize = 4;

pin_project_lite::pin_project! {
    /// Two futures run in one task, each polled only when it has been woken, and a
    /// wake that one gives the other while the task is being polled taken in the same
    /// poll. The client connection runs beside its lane's upstream connection: the
    /// client's request handed to the lane wakes the upstream side, the upstream's
    /// response handed back wakes the client side. Polled together under one waker
    /// (`select!`), each such hand-over woke the task again and each wake polled both
    /// sides, hyper's server and client and every watcher, for nothing on one of them.
    /// Completes with whichever completes first.
    pub struct Beside<A, B> {
        #[pin]
        main: A,
        #[pin]
        beside: B,
        main_wake: Arc<BranchWake>,
        beside_wake: Arc<BranchWake>,
        main_waker: Waker,
        beside_waker: Waker,
        shared: Arc<BesideTask>,
    }
}

/// The task a [`Beside`] runs in, and whether it is being polled.
#[derive(Debug, Default)]
struct BesideTask {
    /// While set, a wake marks its future only: the poll under way takes it.
    polling: AtomicBool,
    /// The task's waker at its last poll.
    task: Mutex<Option<Waker>>,
}

/// The waker of one of a [`Beside`]'s futures.
#[derive(Debug)]
struct BranchWake {
    /// Woken since last polled (set at first: each future is polled at the first poll).
    woken: AtomicBool,
    shared: Arc<BesideTask>,
}

impl std::task::Wake for BranchWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Both flags sequentially consistent: either the poll under way sees this
        // future woken after it stops polling, or this wake sees it stopped and wakes
        // the task. (The poll writes `polling`, then reads `woken`.)
        //
        // A swap, not a store, for loom: on x86-64 a `SeqCst` store is the same
        // instruction (`xchg`). Loom does not order a store against a concurrent swap
        // (tokio-rs/loom#389): it let this thread, and the next poll, read the poll's
        // earlier swap after this store, and reported a lost wake that cannot happen.
        self.woken.swap(true, Ordering::SeqCst);
        if !self.shared.polling.load(Ordering::SeqCst) {
            let task = self
                .shared
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(task) = task.as_ref() {
                task.wake_by_ref();
            }
        }
    }
}

impl<A, B> Beside<A, B> {
    /// `main` and `beside`, run in one task.
    pub fn new(main: A, beside: B) -> Self {
        let shared = Arc::new(BesideTask::default());
        let wake = || {
            Arc::new(BranchWake {
                woken: AtomicBool::new(true),
                shared: Arc::clone(&shared),
            })
        };
        let (main_wake, beside_wake) = (wake(), wake());
        Beside {
            main,
            beside,
            main_waker: Waker::from(Arc::clone(&main_wake)),
            beside_waker: Waker::from(Arc::clone(&beside_wake)),
            main_wake,
            beside_wake,
            shared,
        }
    }
}

impl<A: Future, B: Future<Output = A::Output>> Future for Beside<A, B> {
    type Output = A::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<A::Output> {
        let mut this = self.project();
        {
            let mut task = this
                .shared
                .task
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        this.shared.polling.store(true, Ordering::SeqCst);
        let mut done = None;
        for _ in 0..PASSES {
            let mut polled = false;
            if this.main_wake.woken.swap(false, Ordering::SeqCst) {
                polled = true;
                let mut cx = Context::from_waker(this.main_waker);
                if let Poll::Ready(output) = this.main.as_mut().poll(&mut cx) {
                    done = Some(output);
                    break;
                }
            }
            if this.beside_wake.woken.swap(false, Ordering::SeqCst) {
                polled = true;
                let mut cx = Context::from_waker(this.beside_waker);
                if let Poll::Ready(output) = this.beside.as_mut().poll(&mut cx) {
                    done = Some(output);
                    break;
                }
            }
            if !polled {
                break;
            }
        }
        this.shared.polling.store(false, Ordering::SeqCst);
        if let Some(output) = done {
            return Poll::Ready(output);
        }
        // Woken after its last look, or still waking itself after every pass.
        if this.main_wake.woken.load(Ordering::SeqCst)
            || this.beside_wake.woken.load(Ordering::SeqCst)
        {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::{Beside, PASSES};
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll, Waker};

    /// Counts the wakes of a task.
    #[derive(Default)]
    struct CountWakes(AtomicUsize);

    impl std::task::Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn beside_takes_the_wakes_its_futures_give_each_other_in_one_poll() {
        let (to_upstream, mut requests) = tokio::sync::mpsc::unbounded_channel::<u32>();
        let (reply, replied) = tokio::sync::oneshot::channel::<u32>();
        // The client side hands a request over and waits for its answer; the other
        // side answers it: each hand-over wakes the other future.
        let client = async move {
            to_upstream.send(20).unwrap();
            replied.await.unwrap()
        };
        let upstream = async move {
            let n = requests.recv().await.unwrap();
            reply.send(n + 1).unwrap();
            std::future::pending::<u32>().await
        };
        let both = Beside::new(client, upstream);
        tokio::pin!(both);
        let wakes = Arc::new(CountWakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let polled = both.as_mut().poll(&mut Context::from_waker(&waker));
        assert_eq!(polled, Poll::Ready(21), "answered within the one poll");
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            0,
            "the task was never woken"
        );
    }

    #[tokio::test]
    async fn beside_wakes_its_task_for_a_wake_from_outside_and_yields_to_a_busy_future() {
        let (send, receive) = tokio::sync::oneshot::channel::<u32>();
        let both = Beside::new(
            async move { receive.await.unwrap() },
            std::future::pending(),
        );
        tokio::pin!(both);
        let wakes = Arc::new(CountWakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        assert!(both.as_mut().poll(&mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        send.send(7).unwrap();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "woken by the send");
        assert_eq!(both.as_mut().poll(&mut cx), Poll::Ready(7));

        // A future that wakes itself at every poll is polled a few times, then the
        // task is woken to poll it again later, rather than spun on.
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&polls);
        let busy = std::future::poll_fn(move |cx| {
            counted.fetch_add(1, Ordering::SeqCst);
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        });
        let both = Beside::new(busy, std::future::pending());
        tokio::pin!(both);
        assert!(both.as_mut().poll(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), PASSES);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2, "the task woken to go on");
    }
}
