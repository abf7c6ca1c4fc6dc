//! The synchronisation types of the lock-free core, from one place, so that the loom
//! model checker can stand in for them.
//!
//! In a normal build every item is a plain re-export of `std`'s: the core compiles to
//! exactly the types and code it would name directly. Built with `--cfg loom`
//! (`tests/loom.rs`, see README "Model checking (loom)"), the same names are loom's
//! mock types, whose every operation is a point where loom switches threads and
//! whose relaxed loads may return any value the memory model allows. Only what the
//! core uses is here: atomics and `Arc` for the window's lanes and slot boundary,
//! the limiters' state words and the concurrency limiter's shared state, atomics and
//! a `Mutex` for [`crate::beside`]'s wake flags and task waker, and the engine's
//! route state lock with the atomics written under it (so that a model's next holder
//! of the lock sees what the last one wrote, as a real lock's does).
//!
//! A loom atomic has no `const fn new`, so a `static` atomic is declared through
//! loom's `lazy_static!` under `cfg(loom)`; see [`crate::lanes`].

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    fence, AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    fence, AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};

/// Nothing in a normal build; a `SeqCst` fence under loom.
///
/// The concurrency limiter pairs a `SeqCst` write of one word with a `SeqCst` read of
/// another on both sides (a ticket counts itself in `waiting`, then reads
/// `in_flight`; a release writes `in_flight`, then reads `waiting` and the limit,
/// which a change writes before reading `in_flight`): C11 forbids both
/// reads to miss the other side's write, so one of them sees the other. Loom models
/// `SeqCst` accesses as `AcqRel` only (its README, "Unsupported features"), under
/// which both may miss, and reports a lost wake-up that cannot happen. It does model
/// `SeqCst` fences, so each such write is followed by this call: under loom the
/// ordering the accesses already give is stated with a fence; in a normal build it
/// compiles to nothing, and the accesses alone give it.
#[inline(always)]
pub(crate) fn seq_cst_fence_under_loom() {
    #[cfg(loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// One turn of a wait for another thread's few stores, the `turns`-th: a spin hint,
/// then, from the 64th, a yield to the OS (the other thread may have been preempted
/// between two stores). Under loom every turn yields: loom runs one thread at a time,
/// and a spinning one must let the others on.
#[inline]
pub(crate) fn spin_wait(turns: &mut u32) {
    *turns = turns.saturating_add(1);
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    if *turns < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
