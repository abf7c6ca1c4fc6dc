//! GCRA on one TAT word, with the emission interval `t` and the capacity beside it:
//! the arithmetic of [`TokenBucket`](super::TokenBucket), shared with the engine's per-key buckets, which
//! keep the same words beside their own bookkeeping.
//!
//! # Limit changes that no decision waits for
//!
//! A bucket's rate, capacity and tokens are three words, and a change
//! ([`Words::set`]) rewrites all three. A decision must never mix one change's rate
//! with another capacity, nor new parameters with tokens not yet rescaled (an empty
//! bucket lowered from 4/s to 1/s, one second's burst, would admit); nor may it wait
//! for a change, or a change preempted half-way would stall every decision on its
//! bucket until the change ran again.
//!
//! The TAT word holds, above the TAT itself (59 bits), a 4-bit count of the changes
//! the bucket has been through and a `CHANGING` mark. A change:
//! 1. takes the `Note` its bucket's address hashes to (changes of one bucket take
//!    turns, and so do changes of buckets that share a note; decisions never take
//!    it; a change on a request's path that finds it taken gives up, see below), and
//!    writes into it the rate and capacity it is about to replace;
//! 2. marks the TAT word `CHANGING`, leaving the TAT as it is;
//! 3. writes the new rate, then the new capacity;
//! 4. swaps the marked word for the TAT rescaled to the new parameters, unmarked, with
//!    the count one higher (a compare-exchange loop: decisions may take tokens
//!    meanwhile);
//! 5. gives the note back.
//!
//! # No request waits for a note
//!
//! [`Words::set`] ([`TokenBucket::set_limit`](super::TokenBucket::set_limit)) waits
//! for the note while another change holds it: a few stores and an exchange, unless
//! the OS deschedules the holding thread meanwhile, and then until it runs again.
//! Changes made on requests' paths never wait: [`Words::try_set`] takes the note
//! with one compare-exchange and, if another change holds it (of this bucket, or of
//! any bucket of any route that shares the note), changes nothing and says so. The
//! engine then decides the request at the parameters the bucket has, as it decides
//! any request that meets a change, and makes the change later, never dropping it:
//! - a key's bucket (which catches up with its route's limit on the key's next
//!   request) records a route generation that is not the route's, so the key's next
//!   request tries again (`keep_up` in `engine/keys.rs`);
//! - a route's bucket (changed by the request that wins a slot rollover, or by an
//!   update) is marked behind, and the next decision on the route, or the next
//!   upkeep, makes the change before it decides, dated where it was pushed.
//!
//! A note is held for a few stores and an exchange, so a change finds it taken only
//! while another change is under way; the first decision after that change gives it
//! back (after its thread runs again, if the OS descheduled it) makes the change left
//! behind. Waiting for the note, as those requests did before, made no change sooner:
//! the bucket keeps its old parameters until the change is made either way.
//!
//! A decision loads the TAT word first. Unmarked, the rate and capacity words go with
//! the TAT; marked, the note holds the rate and capacity the TAT is still scaled to
//! (a decision during a change is charged at the old rate, as one just before it). It
//! admits only by a compare-exchange expecting the very word it loaded, count and
//! mark included, and rejects, lowers nothing or reports a level only if a second
//! load still finds that word. A parameter it read that was written later than the
//! word it loaded (a new rate or capacity, or a note's values from a later change)
//! was written after that word had moved on: steps 2 and 4 come first in the
//! changing thread, parameters are written with `Release` and read with `Acquire`.
//! So its exchange fails, or its second load differs, and it reads again: a decision
//! retries because a change moved on, never waits for one to.
//!
//! The count keeps a word from coming back. Without it, a change that leaves the TAT
//! as it found it (a full bucket stays full; an empty one stays empty at the same τ,
//! as from 4/s to 1/s with one second's burst) would let a decision that read the old
//! rate and the new capacity pass its exchange. With it, the word comes back only
//! after 16 changes of the same bucket, one after another, between two loads of one
//! decision (tens of nanoseconds, unless its thread is descheduled meanwhile), and
//! with the TAT where it was. A bucket changes at most once per controller slot, and
//! per admin update or reload (a key's bucket when a request finds its route's limit
//! changed), so this takes a thread descheduled across 16 limit changes; even then
//! one decision is charged with the parameters it read, and the next reads afresh.
//!
//! # Changes dated in the past
//!
//! A change is made as of a date: the engine dates a route's change at the slot
//! where its controller made it (so that after a silence the bucket refills at the
//! new limit from then, not only from the request that found it), a key's at its
//! route's change, and a change left behind at the date it was pushed. Decisions
//! made after that date, at the old parameters, are already in the TAT: the requests
//! that raced the rollover, or were decided while the change found its note taken.
//! Read at the date, the TAT may then show fewer tokens than none (it is later than
//! the date plus τ1), and taken as none, the tokens those requests took were handed
//! back: 10/s with 10 tokens, emptied at 0 and then drained at 10/s, cut at 1 s to
//! 1/s dated at 0, admitted a 21st request by 1 s, beyond what either limit allows.
//! So a change counts from its date or from TAT − τ1, whichever is later. Every
//! admission at time `a` leaves the TAT at most `a + τ1` (and a `lower_to` at `now`,
//! at most `now + τ1`), so the latest decision the TAT holds was made at TAT − τ1 or
//! later: counted from there, the tokens are never fewer than none, none are handed
//! back, and the new rate refills from then only. Over any interval a bucket then
//! admits at most the larger capacity plus the larger rate times the interval.
//!
//! The TAT counts up to 2^59 ns (18.3 years) and τ is at most 2^57 ns (4.6 years):
//! a bucket holds `now` at 2^59 − 2^57 ns (13.7 years; the clock counts from the
//! process's start), past which it no longer refills.
//!
//! [`Words::set`]: Words::set
//! [`Words::try_set`]: Words::try_set

use super::{interval_ns, Level};
use crate::clock::Nanos;
use crate::sync::{spin_wait, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// A burst kept to the millisecond in 32 bits (49 days).
pub(crate) fn burst_ms(burst: Duration) -> u32 {
    u32::try_from(burst.as_millis()).unwrap_or(u32::MAX)
}

/// Emission interval and capacity (at least one token) for `limit`. A capacity a
/// hair below a whole number is that number, as a window's quota is
/// ([`words::quota`](super::words::quota)): 1,000 per 1.1 s, written as
/// 909.090909090909 req/s, comes out of the float product as 999.9999999999999
/// and holds 1,000 tokens. The interval is at most the most τ may be, so that a
/// full bucket admits one request even at a limit of zero (and then waits 4.6
/// years).
pub(crate) fn params(limit: f64, burst_ms: u32) -> (u64, u32) {
    let capacity = tokens(limit, burst_ms).clamp(1.0, f64::from(MAX_TOKENS));
    (interval_ns(limit).min(TAU_MAX), capacity as u32)
}

/// The most tokens a bucket holds: its capacity is kept in 32 bits.
pub(crate) const MAX_TOKENS: u32 = u32::MAX;

/// The whole tokens `limit` for `burst_ms` makes, before [`params`] bounds them to
/// between one and [`MAX_TOKENS`] (the configuration refuses more).
pub(crate) fn tokens(limit: f64, burst_ms: u32) -> f64 {
    (limit * f64::from(burst_ms) / 1e3 + 1e-6).floor()
}

/// Bits of a TAT word that hold the TAT.
const TAT_BITS: u32 = 59;
/// The TAT in a TAT word.
const TAT: u64 = (1 << TAT_BITS) - 1;
/// One change in the count above the TAT.
const ONE_CHANGE: u64 = 1 << TAT_BITS;
/// The count of changes in a TAT word (4 bits, wrapping).
const COUNT: u64 = 0b1111 << TAT_BITS;
/// The top bit of a TAT word: set while a change rewrites the rate and capacity,
/// which the bucket's [`Note`] then holds for decisions (see the module docs).
const CHANGING: u64 = 1 << 63;
/// The most τ may be (4.6 years).
const TAU_MAX: u64 = 1 << 57;
/// The latest `now` a bucket sees: its TAT, at most `now + τ`, fits in [`TAT`].
const NOW_MAX: u64 = TAT - TAU_MAX;

/// `now` as a bucket sees it (held at [`NOW_MAX`]).
#[inline]
fn clamped(now: Nanos) -> u64 {
    now.as_u64().min(NOW_MAX)
}

/// The TAT word of a bucket that is full at `now`.
pub(crate) fn full_at(now: Nanos) -> u64 {
    clamped(now)
}

/// Tolerance τ = capacity × T.
#[inline]
fn tolerance(t: u64, capacity: u32) -> u64 {
    t.saturating_mul(u64::from(capacity)).min(TAU_MAX)
}

/// Where a change leaves, for the decisions it overlaps, the rate and capacity it
/// replaces; held by one change at a time (see the module docs).
struct Note {
    /// 1 while a change holds the note.
    held: AtomicU32,
    /// The capacity the holding change replaces.
    capacity: AtomicU32,
    /// The emission interval the holding change replaces.
    emission_ns: AtomicU64,
}

/// Bits of a bucket's address hash that pick its note: 64 notes, 1 KiB in all
/// (one under loom, so that the models' buckets all share it, whatever their
/// addresses: the models check a change of one bucket that rewrites the note a
/// decision on another is reading).
const NOTE_BITS: u32 = if cfg!(loom) { 0 } else { 6 };

#[cfg(not(loom))]
static NOTES: [Note; 1 << NOTE_BITS] = [const {
    Note {
        held: AtomicU32::new(0),
        capacity: AtomicU32::new(0),
        emission_ns: AtomicU64::new(0),
    }
}; 1 << NOTE_BITS];
// Loom's atomics have no `const fn new`; its statics start afresh in each execution.
#[cfg(loom)]
loom::lazy_static! {
    static ref NOTES: [Note; 1 << NOTE_BITS] = std::array::from_fn(|_| Note {
        held: AtomicU32::new(0),
        capacity: AtomicU32::new(0),
        emission_ns: AtomicU64::new(0),
    });
}

std::thread_local! {
    /// The note this thread's buckets all take while it is set
    /// ([`notes_of_this_thread`]; the unit tests' `with_the_note_held`).
    static THREAD_NOTE: std::cell::Cell<Option<&'static Note>> =
        const { std::cell::Cell::new(None) };
    /// This thread's own note, made the first time it takes one: leaked, once per
    /// thread (32 bytes), so that [`THREAD_NOTE`] may lend it for `'static`.
    static OWN_NOTE: &'static Note = Box::leak(Box::new(Note {
        held: AtomicU32::new(0),
        capacity: AtomicU32::new(0),
        emission_ns: AtomicU64::new(0),
    }));
}

/// Until the guard returned is dropped, every bucket changed or decided on this
/// thread takes a note of this thread's own, instead of the one its address picks
/// among the notes all threads share. For a simulation, whose buckets are all changed
/// and decided on the one thread it runs on: a change of one of its buckets then never
/// finds the note held by a change of another thread's bucket (another simulation's,
/// run at once), which would put the change off to the bucket's next decision and make
/// the run's result depend on what else the process was doing. Buckets that other
/// threads decide must not be changed or decided on this thread meanwhile (their
/// changes would not exclude each other); once the guard is dropped, they may be
/// again: a thread of a pool that ran a simulation goes back to the shared notes.
pub(crate) fn notes_of_this_thread() -> NotesOfThisThread {
    let before = THREAD_NOTE.get();
    THREAD_NOTE.set(Some(OWN_NOTE.with(|own| *own)));
    NotesOfThisThread {
        before,
        this_thread: std::marker::PhantomData,
    }
}

/// While alive, this thread's buckets take its own note ([`notes_of_this_thread`]);
/// dropped, they take the note they took before.
#[must_use = "the thread takes its own note only while the guard lives"]
pub(crate) struct NotesOfThisThread {
    /// The thread's note before the guard was made.
    before: Option<&'static Note>,
    /// Not `Send`: dropped on another thread, it would set that thread's note.
    this_thread: std::marker::PhantomData<*const ()>,
}

impl Drop for NotesOfThisThread {
    fn drop(&mut self) {
        THREAD_NOTE.set(self.before);
    }
}

/// Unit tests only: runs `during` on this thread while a change of another bucket
/// is held half-way on a thread of its own, holding a note of the test's own.
/// Every bucket changed or decided on this thread takes that note from now on,
/// as every bucket takes the one note under loom, so that `during` meets the held
/// change whatever bucket it changes (decisions on those buckets must stay on
/// this thread). The note is no other test's, so tests run at once cannot take it
/// meanwhile ([`OWN_NOTE`]).
#[cfg(test)]
pub(crate) fn with_the_note_held(during: impl FnOnce()) {
    let note = Some(OWN_NOTE.with(|own| *own));
    THREAD_NOTE.set(note);
    let other = super::TokenBucket::new(1.0, Duration::from_secs(1), Nanos::ZERO);
    held_beside(&other, note, during);
}

/// Unit tests only: runs `during` on this thread while a change of `bucket` is held
/// half-way on a thread of its own, which takes the note the bucket's address picks
/// among those all threads share.
#[cfg(test)]
pub(crate) fn with_a_change_held(bucket: &super::TokenBucket, during: impl FnOnce()) {
    held_beside(bucket, None, during);
}

/// Runs `during` while a change of `bucket` is held half-way on a thread of its own,
/// which takes `note` (`None`: the shared note of the bucket's address).
#[cfg(test)]
fn held_beside(bucket: &super::TokenBucket, note: Option<&'static Note>, during: impl FnOnce()) {
    let (held, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            THREAD_NOTE.set(note);
            bucket
                .words()
                .set_midway(params(2.0, bucket.burst_ms), Nanos::ZERO, || {
                    held.wait();
                    release.wait();
                });
        });
        held.wait();
        // A failing assertion in `during` still lets the change go, then fails
        // the test: it would otherwise wait for the held change, which waits for
        // `release`, for ever.
        let during = std::panic::catch_unwind(std::panic::AssertUnwindSafe(during));
        release.wait();
        if let Err(panic) = during {
            std::panic::resume_unwind(panic);
        }
    });
}

impl Note {
    /// The note of the bucket whose TAT word is `tat`, by its address (which does
    /// not change while a change or a decision borrows the bucket).
    fn of(tat: &AtomicU64) -> &'static Note {
        if let Some(note) = THREAD_NOTE.get() {
            return note;
        }
        let addr = std::ptr::from_ref(tat) as usize as u64;
        // `checked_shr`: a shift by 64 (no bits, under loom) picks note 0.
        let i = (addr >> 3)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .checked_shr(64 - NOTE_BITS)
            .unwrap_or(0);
        &NOTES[i as usize]
    }

    /// Takes the note, after any change that holds it.
    fn take(&self) {
        let mut turns = 0;
        while !self.try_take() {
            spin_wait(&mut turns);
        }
    }

    /// Takes the note if no change holds it: one compare-exchange, no wait.
    #[inline]
    fn try_take(&self) -> bool {
        self.held
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Lets the next change take the note.
    fn give_back(&self) {
        self.held.store(0, Ordering::Release);
    }
}

/// The rate and capacity a change left in the note of the bucket whose TAT word
/// is `tat`. Out of line: the decisions that overlap a change are rare.
#[cold]
#[inline(never)]
fn noted(tat: &AtomicU64) -> (u64, u32) {
    let note = Note::of(tat);
    (
        note.emission_ns.load(Ordering::Acquire),
        note.capacity.load(Ordering::Acquire),
    )
}

/// The words of one bucket: its TAT, emission interval and capacity.
#[derive(Clone, Copy)]
pub(crate) struct Words<'a> {
    pub(crate) tat: &'a AtomicU64,
    pub(crate) emission_ns: &'a AtomicU64,
    pub(crate) capacity: &'a AtomicU32,
}

impl Words<'_> {
    /// The TAT word as loaded, its TAT, and the rate and capacity the TAT is scaled
    /// to: the rate and capacity words, or a changing bucket's note. Never waits;
    /// the caller acts on them only if the word is still the one loaded (see the
    /// module docs).
    #[inline]
    fn read(self) -> (u64, u64, u64, u32) {
        let word = self.tat.load(Ordering::Acquire);
        let (t, capacity) = if word & CHANGING == 0 {
            (
                self.emission_ns.load(Ordering::Acquire),
                self.capacity.load(Ordering::Acquire),
            )
        } else {
            noted(self.tat)
        };
        (word, word & TAT, t, capacity)
    }

    /// Whether the TAT word is still `word`, for a decision that writes nothing.
    #[inline]
    fn still(self, word: u64) -> bool {
        self.tat.load(Ordering::Relaxed) == word
    }

    /// Takes one token at `now`: `Ok`, or the nanoseconds until one will be there.
    #[inline]
    pub(crate) fn take(self, now: Nanos) -> Result<(), u64> {
        let now = clamped(now);
        loop {
            let (word, tat, t, capacity) = self.read();
            let tau = tolerance(t, capacity);
            let next = tat.max(now) + t;
            if next - now > tau {
                if self.still(word) {
                    return Err(next - tau - now);
                }
                continue;
            }
            // The word with its TAT moved to `next` (never back: `next` is later),
            // count and mark kept.
            let moved = word + (next - tat);
            if self
                .tat
                .compare_exchange_weak(word, moved, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(());
            }
        }
    }

    /// Changes the emission interval and capacity to `(t2, c2)` as of `now`,
    /// keeping the tokens there are (clamped to the new capacity). Decisions go on
    /// meanwhile at the old rate; two changes of one bucket take turns, and this
    /// one waits for the note while another change holds it (see the module docs).
    pub(crate) fn set(self, new: (u64, u32), now: Nanos) {
        self.set_midway(new, now, || {});
    }

    /// [`Words::set`] if the bucket's note is free, and nothing if another change
    /// holds it: never waits. Whether the change was made; the caller that gets
    /// `false` makes it again later (see the module docs).
    pub(crate) fn try_set(self, new: (u64, u32), now: Nanos) -> bool {
        let note = Note::of(self.tat);
        if !note.try_take() {
            return false;
        }
        self.change(note, new, now, || {});
        true
    }

    /// Whether the bucket is at `new` (emission interval, capacity) already: a change
    /// to it would change nothing. Read without the note: for the holder of the lock
    /// under which the bucket's changes are made.
    pub(crate) fn is_at(self, (t, c): (u64, u32)) -> bool {
        self.emission_ns.load(Ordering::Relaxed) == t && self.capacity.load(Ordering::Relaxed) == c
    }

    /// [`Words::set`], calling `midway` once the TAT word is marked, before the new
    /// rate is written: the model checks and the tests hold a change there.
    pub(crate) fn set_midway(self, new: (u64, u32), now: Nanos, midway: impl FnOnce()) {
        let note = Note::of(self.tat);
        note.take();
        self.change(note, new, now, midway);
    }

    /// The change, by the holder of the bucket's `note`, which it gives back.
    fn change(self, note: &Note, (t2, c2): (u64, u32), now: Nanos, midway: impl FnOnce()) {
        let now = clamped(now);
        // Only a change that holds the bucket's note writes its rate and capacity.
        let t1 = self.emission_ns.load(Ordering::Relaxed);
        let c1 = self.capacity.load(Ordering::Relaxed);
        note.emission_ns.store(t1, Ordering::Release);
        note.capacity.store(c1, Ordering::Release);
        let mut seen = self.tat.fetch_or(CHANGING, Ordering::Release) | CHANGING;
        midway();
        self.emission_ns.store(t2, Ordering::Release);
        self.capacity.store(c2, Ordering::Release);
        loop {
            let count = (seen & COUNT).wrapping_add(ONE_CHANGE) & COUNT;
            let next = count | rescaled(seen & TAT, (t1, c1), (t2, c2), now);
            match self
                .tat
                .compare_exchange_weak(seen, next, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(current) => seen = current,
            }
        }
        note.give_back();
    }

    /// Leaves at most `tokens` tokens (at least none) at `now`: moves the TAT
    /// later, never earlier, and never past `now + τ` (an empty bucket). A TAT
    /// already later is left as it is, without a write.
    #[inline]
    pub(crate) fn lower_to(self, tokens: f64, now: Nanos) {
        let now = clamped(now);
        loop {
            let (word, tat, t, capacity) = self.read();
            let tau = tolerance(t, capacity);
            // `max` maps NaN to 0: an unreadable level lowers to empty, never refills.
            let kept = ((tokens.max(0.0) * t as f64) as u64).min(tau);
            let floor = now + (tau - kept);
            if tat >= floor {
                if self.still(word) {
                    return;
                }
            } else if self
                .tat
                .compare_exchange_weak(
                    word,
                    (word & !TAT) | floor,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return;
            }
        }
    }

    /// Gives this bucket the tokens `from` holds at `now` (clamped to its capacity),
    /// its count and mark kept: `from`'s TAT rescaled from `from`'s rate and capacity
    /// to this bucket's, as a change rescales one ([`rescaled`]), so that a bucket at
    /// another rate (a twin whose change found its note taken) takes the tokens, not
    /// the TAT read at its own rate. `from` is read as a decision reads it, whole;
    /// this bucket's rate and capacity must not be changing (its changes are made
    /// by the caller only). A decision on this bucket that loaded the word before
    /// retries; one that wrote it since is overwritten.
    pub(crate) fn copy_tat(self, from: Words<'_>, now: Nanos) {
        let (tat, t1, c1) = loop {
            let (word, tat, t, capacity) = from.read();
            if from.still(word) {
                break (tat, t, capacity);
            }
        };
        let own = (
            self.emission_ns.load(Ordering::Acquire),
            self.capacity.load(Ordering::Acquire),
        );
        // At the same rate and capacity, the TAT as it is: rescaled, it may come out a
        // nanosecond off, in floating point.
        let tat = if own == (t1, c1) {
            tat
        } else {
            rescaled(tat, (t1, c1), own, clamped(now))
        };
        let mut seen = self.tat.load(Ordering::Relaxed);
        while let Err(current) = self.tat.compare_exchange_weak(
            seen,
            (seen & !TAT) | tat,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            seen = current;
        }
    }

    /// The nanoseconds from `now` until [`take`](Self::take) would take a token (0:
    /// one is there now), taking none.
    pub(crate) fn wait(self, now: Nanos) -> u64 {
        let now = clamped(now);
        loop {
            let (word, tat, t, capacity) = self.read();
            if self.still(word) {
                let next = tat.max(now) + t;
                return (next - now).saturating_sub(tolerance(t, capacity));
            }
        }
    }

    /// Tokens left at `now` and the capacity.
    pub(crate) fn level(self, now: Nanos) -> Level {
        let now = clamped(now);
        loop {
            let (word, tat, t, capacity) = self.read();
            if self.still(word) {
                let tau = tolerance(t, capacity);
                let backlog = tat.saturating_sub(now);
                return Level {
                    value: tau.saturating_sub(backlog) as f64 / t as f64,
                    capacity: f64::from(capacity),
                };
            }
        }
    }

    /// Whether the bucket is full at `now`, with no change under way: a new
    /// bucket would start where it stands.
    pub(crate) fn full(self, now: Nanos) -> bool {
        let word = self.tat.load(Ordering::Relaxed);
        word & CHANGING == 0 && word & TAT <= clamped(now)
    }
}

/// The TAT that keeps the tokens a TAT of `tat` holds under `(t1, c1)` (clamped
/// to the new capacity) under `(t2, c2)`, as of `at`, or as of `tat − τ1` if that
/// is later: the change counts from then (see "Changes dated in the past" in the
/// module docs).
fn rescaled(tat: u64, (t1, c1): (u64, u32), (t2, c2): (u64, u32), at: u64) -> u64 {
    let (tau1, tau2) = (tolerance(t1, c1), tolerance(t2, c2));
    let now = at.max(tat.saturating_sub(tau1)).min(NOW_MAX);
    let backlog = tat.saturating_sub(now);
    let tokens = tau1.saturating_sub(backlog) as f64 / t1 as f64;
    let kept = tokens.min(f64::from(c2));
    // Bounded in integers: `tau2 as f64` may round above `tau2`, and the
    // subtraction would go below zero.
    now + tau2 - ((kept * t2 as f64) as u64).min(tau2)
}
