//! The mark an admission layer leaves on a request its engine admitted, by which a
//! layer over the same engine inside it (a route's own layer inside a router-wide one)
//! passes the request straight through: one arrival is decided and counted once. A
//! request may pass layers over other engines too, each of which decides it.
//!
//! Each shared engine takes one of [`SLOTS`] marker types while it lives, each a type
//! with no data: a request extension of such a type allocates nothing where the
//! request's extensions have room (an admitted request through the layer allocates
//! nothing of its own, `tests/memory.rs`): their map grows as it takes its fourth
//! entry and its eighth, and behind axum's `ConnectInfo`, `OriginalUri` and
//! `MatchedPath` the mark is a fourth. An engine made while every slot is taken
//! marks with its id in a [`DecidedBy`] extension, one allocation per request.
//!
//! A slot is taken again once the last clone of its engine is gone. A request keeps
//! its mark: should it outlive that engine and then meet a layer over one made since,
//! holding the slot, that layer would pass it undecided. A request meets the layers of
//! the stack it entered, which hold their engines while it runs in them, so this takes
//! a service that hands requests on to a stack built after the one that marked them.

use http::{Extensions, Request};
use std::sync::atomic::{AtomicU64, Ordering};

/// A request admitted by the engine holding slot `N`.
#[derive(Clone, Copy, Debug)]
struct DecidedIn<const N: usize>;

fn put<const N: usize>(extensions: &mut Extensions) {
    extensions.insert(DecidedIn::<N>);
}

fn has<const N: usize>(extensions: &Extensions) -> bool {
    extensions.get::<DecidedIn<N>>().is_some()
}

macro_rules! slots {
    ($($n:literal)*) => {
        /// The shared engines that mark without allocating, at once.
        const SLOTS: usize = [$($n),*].len();
        /// Marks a request with each slot's type.
        static PUT: [fn(&mut Extensions); SLOTS] = [$(put::<$n>),*];
        /// Whether a request carries each slot's type.
        static HAS: [fn(&Extensions) -> bool; SLOTS] = [$(has::<$n>),*];
    };
}

slots!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60
    61 62 63
);

/// The slots held, a bit each.
static TAKEN: AtomicU64 = AtomicU64::new(0);

/// The id the next engine past the slots marks with.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// The engines, past the slots, that admitted a request, by id.
#[derive(Clone, Debug)]
struct DecidedBy(Vec<u64>);

/// How one shared engine marks the requests it admits: by its slot's type, or, every
/// slot taken, by its id. Dropped (with the last clone of its engine), it frees its
/// slot.
#[derive(Debug)]
pub(crate) enum Mark {
    Slot(usize),
    Id(u64),
}

impl Mark {
    /// A mark of its own: a free slot if there is one.
    pub(crate) fn new() -> Self {
        let taken = TAKEN.fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
            (taken != u64::MAX).then(|| taken | 1 << (!taken).trailing_zeros())
        });
        match taken {
            Ok(before) => Mark::Slot((!before).trailing_zeros() as usize),
            Err(_) => Mark::Id(NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        }
    }

    /// Whether `req` carries this mark: its engine admitted it.
    #[inline]
    pub(crate) fn on<B>(&self, req: &Request<B>) -> bool {
        match *self {
            Mark::Slot(slot) => HAS[slot](req.extensions()),
            Mark::Id(id) => req
                .extensions()
                .get::<DecidedBy>()
                .is_some_and(|by| by.0.contains(&id)),
        }
    }

    /// Marks `req`, which its engine admitted.
    #[inline]
    pub(crate) fn put<B>(&self, req: &mut Request<B>) {
        match *self {
            Mark::Slot(slot) => PUT[slot](req.extensions_mut()),
            Mark::Id(id) => match req.extensions_mut().get_mut::<DecidedBy>() {
                Some(by) => by.0.push(id),
                None => {
                    req.extensions_mut().insert(DecidedBy(vec![id]));
                }
            },
        }
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        if let Mark::Slot(slot) = *self {
            TAKEN.fetch_and(!(1 << slot), Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks of different engines, slots or ids, tell their requests apart; a freed
    /// slot is taken again; past the slots, engines mark by id.
    #[test]
    fn each_mark_knows_its_own_requests() {
        let marks: Vec<Mark> = (0..SLOTS + 2).map(|_| Mark::new()).collect();
        assert!(marks.iter().any(|m| matches!(m, Mark::Id(_))));
        let mut req = Request::new(());
        marks[0].put(&mut req);
        let last = marks.last().unwrap();
        last.put(&mut req);
        for (i, mark) in marks.iter().enumerate() {
            let own = i == 0 || i == marks.len() - 1;
            assert_eq!(mark.on(&req), own, "{i}: {mark:?}");
        }
        drop(marks);
        let again = Mark::new();
        assert!(matches!(again, Mark::Slot(_)), "{again:?}");
    }
}
