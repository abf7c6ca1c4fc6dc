//! The bound on bearer-token guesses at the admin API: each client address may send
//! a burst of wrong tokens, then one per interval; past that, a request presenting a
//! token is answered 429 without its token being compared.
//!
//! Only wrong tokens are charged. A client with the right token (a CI job making a
//! hundred changes, `rocgate hints` polling) is never bounded, however fast it goes;
//! one that guesses is, after [`GuessBound::burst`] wrong ones. Once over the bound, a
//! request is refused before its token is looked at, right or wrong, so the 429 says
//! nothing about the guess it carries: it answers the address, not the token.
//!
//! Each address has a token bucket of the project's own ([`TokenBucket`], GCRA),
//! refilling at [`GuessBound::per_second`] up to [`GuessBound::burst`]. An IPv6
//! address is counted by its /64, the block one host is usually given: an attacker
//! with a /64 has 2⁶⁴ addresses to guess from. At most [`MAX_PEERS`] addresses are
//! tracked; one whose bucket has refilled, with no guess being compared, carries
//! nothing and is dropped to make room, the table walked for such ones at most ten
//! times a second (a place freed is taken up to a tenth of a second late, where a
//! walk at each new address read 4,096 buckets under the lock). When every place is taken by an address still
//! owed tokens, a new address guesses on one overflow bucket that all such addresses
//! share: the bound then falls on the newcomers together, never lifts. The caller
//! leaves out who is never bounded (the operator on the host, see
//! `admin::guess_bounded`).
//!
//! A guess is counted from the moment its comparison begins ([`Guesses::begin`]) until
//! it is charged or let go ([`Guess`]): a client sending its guesses all at once does
//! not pass more of them than its bucket holds while the first are being compared.

use crate::clock::Nanos;
use crate::limiter::TokenBucket;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The most client addresses (IPv6: /64 blocks) whose guesses are tracked one by one.
pub(crate) const MAX_PEERS: usize = 4096;

/// How many wrong tokens a client address may send: a burst, then a rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GuessBound {
    /// Wrong tokens an address may send at once (at least one).
    pub(crate) burst: u32,
    /// Wrong tokens an address may send per second once its burst is spent
    /// (positive).
    pub(crate) per_second: f64,
}

impl GuessBound {
    /// The bound `[admin]` sets when it leaves `wrong_tokens_burst` and
    /// `wrong_tokens_per_second` out: 10 at once, then one a second.
    #[cfg(test)]
    pub(crate) fn by_default() -> Self {
        let server = crate::config::ServerConfig::default();
        GuessBound {
            burst: server.admin_wrong_tokens_burst,
            per_second: server.admin_wrong_tokens_per_second,
        }
    }
}

/// The guesses of every client address, and how many were refused.
#[derive(Debug)]
pub(crate) struct Guesses {
    bound: GuessBound,
    table: Mutex<Table>,
    /// Tokens compared and found wrong.
    wrong: AtomicU64,
    /// Requests answered 429 for their address's guesses.
    refused: AtomicU64,
}

#[derive(Debug)]
struct Table {
    peers: HashMap<IpAddr, Tally>,
    /// Shared by the addresses that found no place among [`MAX_PEERS`].
    overflow: Tally,
    /// No tracked address can be dropped before then (see [`Table::make_room`]).
    no_room_until: Nanos,
    /// Walks of the table made to make room, since the start.
    #[cfg(test)]
    walks: usize,
}

/// One address's bucket, and its guesses being compared.
#[derive(Debug)]
struct Tally {
    bucket: TokenBucket,
    comparing: u32,
}

impl Tally {
    fn new(bound: GuessBound, now: Nanos) -> Self {
        Tally {
            bucket: TokenBucket::new(bound.per_second, burst_duration(bound), now),
            comparing: 0,
        }
    }
}

/// The burst as the bucket takes it: long enough at `per_second` to hold `burst`
/// tokens, rounded up to the millisecond (rounded down, 10 at 0.3 a second would
/// hold 9).
fn burst_duration(bound: GuessBound) -> Duration {
    let ms = (f64::from(bound.burst) * 1e3 / bound.per_second).ceil();
    Duration::from_millis(ms as u64)
}

/// The key an address is counted under: itself (an IPv4-mapped IPv6 address as the
/// IPv4 one), an IPv6 address by its /64.
fn key(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(v6.to_bits() & !u128::from(u64::MAX))),
        v4 => v4,
    }
}

/// Where a guess is counted.
#[derive(Clone, Copy, Debug)]
enum Place {
    Peer(IpAddr),
    Overflow,
}

/// A guess being compared: [`wrong`](Self::wrong) charges its address; dropped
/// otherwise (the token was right), it costs nothing.
#[derive(Debug)]
#[must_use = "a guess is charged only if found wrong"]
pub(crate) struct Guess<'a> {
    guesses: &'a Guesses,
    place: Place,
}

impl Guess<'_> {
    /// The token was wrong: its address is charged one, at `now`.
    pub(crate) fn wrong(self, now: Nanos) {
        let mut table = self.guesses.lock();
        if let Some(tally) = table.tally(self.place) {
            // Room was held for this guess since it began: the take finds a token.
            let _ = tally.bucket.take(now);
        }
    }
}

impl Drop for Guess<'_> {
    fn drop(&mut self) {
        let mut table = self.guesses.lock();
        if let Some(tally) = table.tally(self.place) {
            tally.comparing = tally.comparing.saturating_sub(1);
        }
    }
}

impl Table {
    fn tally(&mut self, place: Place) -> Option<&mut Tally> {
        match place {
            Place::Peer(key) => self.peers.get_mut(&key),
            Place::Overflow => Some(&mut self.overflow),
        }
    }

    /// Drops the idle addresses (bucket full, no guess under way: the record says
    /// nothing a new one would not) if any may be idle by `now`, in one walk of the
    /// table, and notes when the next walk may be: [`WALKS_APART`] on, or, if none was
    /// idle, when the first may be. A client sending from many addresses at the cap,
    /// freeing a place each millisecond, has the table walked ten times a second, not
    /// at each new address; a place is then taken up to [`WALKS_APART`] late.
    fn make_room(&mut self, bound: GuessBound, now: Nanos) {
        if now < self.no_room_until {
            return;
        }
        #[cfg(test)]
        {
            self.walks += 1;
        }
        let mut soonest = Duration::MAX;
        self.peers.retain(|_, tally| {
            let level = tally.bucket.level(now);
            let idle = tally.comparing == 0 && level.value >= level.capacity;
            if !idle {
                let owed = (level.capacity - level.value).max(0.0) / bound.per_second;
                soonest = soonest.min(Duration::from_secs_f64(owed));
            }
            !idle
        });
        let next = if self.peers.len() < MAX_PEERS {
            Duration::ZERO
        } else {
            soonest
        };
        self.no_room_until = now + next.max(WALKS_APART);
    }
}

/// The least time between two walks of the table at the cap ([`Table::make_room`]):
/// each reads every bucket under the lock every guess takes.
const WALKS_APART: Duration = Duration::from_millis(100);

impl Guesses {
    /// No guesses yet, bounded by `bound` held to the range the config takes
    /// (`[admin] wrong_tokens_burst` and `wrong_tokens_per_second`): a bound built by
    /// hand with no rate, or one that is not a number, would have no wait to answer.
    pub(crate) fn new(bound: GuessBound) -> Self {
        let most_burst = u32::try_from(crate::config::MAX_WRONG_TOKENS_BURST).unwrap_or(u32::MAX);
        let per_second = if bound.per_second.is_nan() {
            crate::config::MIN_WRONG_TOKENS_PER_SECOND
        } else {
            bound.per_second.clamp(
                crate::config::MIN_WRONG_TOKENS_PER_SECOND,
                crate::config::MAX_WRONG_TOKENS_PER_SECOND,
            )
        };
        let bound = GuessBound {
            burst: bound.burst.clamp(1, most_burst),
            per_second,
        };
        Guesses {
            bound,
            table: Mutex::new(Table {
                peers: HashMap::new(),
                overflow: Tally::new(bound, Nanos::ZERO),
                no_room_until: Nanos::ZERO,
                #[cfg(test)]
                walks: 0,
            }),
            wrong: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins the comparison of a token `peer` sent at `now`: the guess to charge if
    /// it is wrong, or, if `peer`'s wrong tokens and those being compared already
    /// take all its bucket holds, how long until one more fits (to be answered 429
    /// with it, the token left uncompared).
    pub(crate) fn begin(&self, peer: IpAddr, now: Nanos) -> Result<Guess<'_>, Duration> {
        let key = key(peer);
        let bound = self.bound;
        let mut guard = self.lock();
        let table = &mut *guard;
        if !table.peers.contains_key(&key) && table.peers.len() >= MAX_PEERS {
            table.make_room(bound, now);
        }
        let (place, tally) = if table.peers.contains_key(&key) || table.peers.len() < MAX_PEERS {
            let tally = table
                .peers
                .entry(key)
                .or_insert_with(|| Tally::new(bound, now));
            (Place::Peer(key), tally)
        } else {
            (Place::Overflow, &mut table.overflow)
        };
        let room = tally.bucket.level(now).value - f64::from(tally.comparing);
        if room < 1.0 {
            drop(guard);
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Duration::from_secs_f64((1.0 - room) / bound.per_second));
        }
        tally.comparing += 1;
        Ok(Guess {
            guesses: self,
            place,
        })
    }

    /// Counts a token compared and found wrong, whether its address is bounded or not.
    pub(crate) fn found_wrong(&self) {
        self.wrong.fetch_add(1, Ordering::Relaxed);
    }

    /// Tokens compared and found wrong, since the start.
    pub(crate) fn wrong(&self) -> u64 {
        self.wrong.load(Ordering::Relaxed)
    }

    /// Requests answered 429 for their address's wrong tokens, since the start.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Addresses tracked one by one now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.lock().peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: f64) -> Nanos {
        Nanos::ZERO + Duration::from_secs_f64(secs)
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// Sends `n` wrong tokens from `peer` at `now`; how many were compared.
    fn guess(guesses: &Guesses, peer: &str, n: usize, now: Nanos) -> usize {
        (0..n)
            .filter(|_| match guesses.begin(ip(peer), now) {
                Ok(g) => {
                    g.wrong(now);
                    true
                }
                Err(_) => false,
            })
            .count()
    }

    #[test]
    fn an_address_guesses_its_burst_then_one_a_second() {
        let guesses = Guesses::new(GuessBound::by_default());
        assert_eq!(guess(&guesses, "192.0.2.7", 15, at(0.0)), 10);
        // Refused: when one more fits, one second on; the token was never compared.
        let wait = guesses.begin(ip("192.0.2.7"), at(0.0)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(1));
        let wait = guesses.begin(ip("192.0.2.7"), at(0.25)).unwrap_err();
        assert_eq!(wait, Duration::from_millis(750));
        assert_eq!(guess(&guesses, "192.0.2.7", 3, at(1.0)), 1);
        assert_eq!(guess(&guesses, "192.0.2.7", 3, at(4.0)), 3);
        assert_eq!(guesses.refused(), 9);
        // Another address has its own burst.
        assert_eq!(guess(&guesses, "192.0.2.8", 15, at(4.0)), 10);
    }

    #[test]
    fn a_right_token_costs_nothing() {
        let guesses = Guesses::new(GuessBound::by_default());
        for _ in 0..1000 {
            let right = guesses.begin(ip("192.0.2.7"), at(0.0)).unwrap();
            drop(right);
        }
        assert_eq!(guess(&guesses, "192.0.2.7", 15, at(0.0)), 10);
    }

    /// Guesses sent together, each still being compared, hold a token each: no more
    /// begin than the bucket holds.
    #[test]
    fn guesses_under_way_hold_their_place() {
        let guesses = Guesses::new(GuessBound::by_default());
        let under_way: Vec<_> = (0..15)
            .filter_map(|_| guesses.begin(ip("192.0.2.7"), at(0.0)).ok())
            .collect();
        assert_eq!(under_way.len(), 10);
        for g in under_way {
            g.wrong(at(0.0));
        }
        assert!(guesses.begin(ip("192.0.2.7"), at(0.0)).is_err());
    }

    #[test]
    fn an_ipv6_address_is_counted_by_its_64() {
        let guesses = Guesses::new(GuessBound::by_default());
        assert_eq!(guess(&guesses, "2001:db8:0:1::1", 6, at(0.0)), 6);
        assert_eq!(guess(&guesses, "2001:db8:0:1:ffff::9", 6, at(0.0)), 4);
        assert_eq!(guess(&guesses, "2001:db8:0:2::1", 6, at(0.0)), 6);
        // An IPv4-mapped address is its IPv4 one.
        assert_eq!(guess(&guesses, "192.0.2.7", 6, at(0.0)), 6);
        assert_eq!(guess(&guesses, "::ffff:192.0.2.7", 6, at(0.0)), 4);
    }

    #[test]
    fn a_burst_is_whole_at_any_rate() {
        let bound = GuessBound {
            burst: 10,
            per_second: 0.3,
        };
        let guesses = Guesses::new(bound);
        assert_eq!(guess(&guesses, "192.0.2.7", 15, at(0.0)), 10);
    }

    /// A client guessing from more addresses than are tracked, so that one of its
    /// places frees each millisecond, has the table walked ten times a second, where
    /// it was walked at each new address: every walk reads all 4,096 buckets under
    /// the lock that every guess takes.
    #[test]
    fn at_the_cap_the_table_is_walked_a_few_times_a_second() {
        let guesses = Guesses::new(GuessBound::by_default());
        let ms = |i: usize| Nanos::ZERO + Duration::from_millis(i as u64);
        for i in 0..MAX_PEERS {
            let peer = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 0xff, i & 0xff);
            assert_eq!(guess(&guesses, &peer, 1, ms(i)), 1);
        }
        // From one second on, address i's bucket is full again at i ms past it.
        let newcomers: usize = (1000..2000)
            .map(|i| {
                guess(
                    &guesses,
                    &format!("172.16.{}.{}", i >> 8, i & 0xff),
                    1,
                    ms(i),
                )
            })
            .sum();
        assert_eq!(guesses.tracked(), MAX_PEERS);
        // The first tenth of a second shares the overflow bucket's 10; from then on,
        // each newcomer has a place the walk before freed.
        assert!(newcomers >= 900, "{newcomers} newcomers guessed");
        let walks = guesses.lock().walks;
        assert!(walks <= 11, "{walks} walks of the table in a second");
    }

    /// A bound built by hand, outside what the config takes (no refill, none at once,
    /// not a number), is held to the config's range: the guess past it is answered
    /// with a wait, where dividing by a rate of zero panicked.
    #[test]
    fn a_bound_outside_the_configs_range_is_held_to_it() {
        for per_second in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let guesses = Guesses::new(GuessBound {
                burst: 0,
                per_second,
            });
            assert_eq!(guess(&guesses, "192.0.2.7", 3, at(0.0)), 1, "{per_second}");
            let wait = guesses.begin(ip("192.0.2.7"), at(0.0)).unwrap_err();
            assert!(wait > Duration::ZERO, "{per_second}: {wait:?}");
        }
    }

    /// At the cap, an address whose bucket has refilled makes room; while none has,
    /// new addresses share the overflow bucket, so guessing from more addresses
    /// gains nothing past it.
    #[test]
    fn at_the_cap_new_addresses_share_one_bucket_until_one_makes_room() {
        let guesses = Guesses::new(GuessBound::by_default());
        for i in 0..MAX_PEERS {
            let peer = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 0xff, i & 0xff);
            assert_eq!(guess(&guesses, &peer, 1, at(0.0)), 1);
        }
        assert_eq!(guesses.tracked(), MAX_PEERS);
        let newcomers: usize = (0..20)
            .map(|i| guess(&guesses, &format!("192.0.2.{i}"), 1, at(0.5)))
            .sum();
        assert_eq!(newcomers, 10, "the overflow bucket's burst, shared");
        assert_eq!(guesses.tracked(), MAX_PEERS);
        // One second on, every tracked bucket has refilled: a newcomer has a place.
        assert_eq!(guess(&guesses, "198.51.100.1", 15, at(1.0)), 10);
        assert_eq!(guesses.tracked(), 1);
    }
}
