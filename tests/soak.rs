//! Long uptime on a virtual clock: what the engine does after hours, days and weeks,
//! after long silences and across the points where its counters wrap.

use rocgate::clock::Nanos;
use rocgate::config::{Config, Event, KeyLimits, Partition, RouteConfig, RouteMatch};
use rocgate::controller::ControllerState;
use rocgate::engine::{Engine, Key, RouteId};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

#[path = "common/offer.rs"]
mod offer;
use offer::offer;

fn engine(routes: Vec<RouteConfig>) -> Engine {
    Engine::new(&Config::new(routes), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap()
}

/// `n` requests at one instant; returns those admitted.
fn burst(e: &Engine, id: RouteId, key: Key<'_>, at: Nanos, n: u64) -> u64 {
    (0..n).filter(|_| e.check(id, key, at).is_admit()).count() as u64
}

/// The default route (base 200 req/s with a second of burst, cut 60), cut by a spike
/// from 40 to 600 req/s at 10 s, then left without a request.
fn cut_then_silent(partition: Partition) -> (Engine, RouteId) {
    let mut route = RouteConfig::new("order", RouteMatch::any());
    route.partition = partition;
    let e = engine(vec![route]);
    let id = e.route_at(0).unwrap();
    let key = Key::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
    offer(&e, id, key, 0.0, 10.0, 40.0);
    offer(&e, id, key, 10.0, 11.0, 600.0);
    let s = e.route_snapshot(id, Nanos::from_secs(11)).unwrap();
    assert_eq!(s.state, ControllerState::Cut);
    (e, id)
}

#[test]
fn a_bucket_silent_since_a_cut_comes_back_full_at_the_base_limit() {
    // The cut ended (max_cut 60 s) and the limit climbed back to base long before the
    // next request, an hour later: by then the bucket has refilled at the base limit,
    // to its base capacity, not only to the cut's.
    for partition in [
        Partition::Route,
        Partition::ClientIp({
            let mut v = KeyLimits::default();
            v.idle_timeout = Duration::from_secs(24 * 3600);
            v
        }),
    ] {
        let (e, id) = cut_then_silent(partition.clone());
        let key = Key::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let later = Nanos::from_secs(3600);
        let admitted = burst(&e, id, key, later, 300);
        let s = e.route_snapshot(id, later).unwrap();
        assert_eq!(s.state, ControllerState::Normal, "{partition:?}");
        assert_eq!(admitted, 200, "{partition:?}");
    }
}

/// A small deterministic generator (xorshift64*), so that a soak is the same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn thirty_days_of_bursts_after_silences_never_exceed_a_quota_nor_refuse_a_fresh_one() {
    use rocgate::limiter::Algorithm;
    let ms = Duration::from_millis;
    let algorithms = [
        Algorithm::TokenBucket { burst: ms(1000) },
        Algorithm::FixedWindow { window: ms(10) },
        Algorithm::FixedWindow { window: ms(1000) },
        Algorithm::SlidingWindow { window: ms(10) },
        Algorithm::SlidingWindow { window: ms(1000) },
    ];
    for algorithm in algorithms {
        for partition in [
            Partition::Route,
            Partition::ClientIp({
                let mut v = KeyLimits::default();
                v.max_keys = 4;
                v.idle_timeout = Duration::from_secs(60);
                v
            }),
        ] {
            let mut route = RouteConfig::new("r", RouteMatch::any());
            route.algorithm = algorithm;
            route.partition = partition.clone();
            // A limit no burst here changes: the controller stays in Normal.
            route.controller.danger_roc = 1e9;
            route.controller.safe_roc = 1e8;
            // A cut that admits a request per 10 ms window, as the engine requires.
            route.controller.cut_limit_rps = 100.0;
            let e = engine(vec![route]);
            let id = e.route_at(0).unwrap();
            let quota = match algorithm {
                Algorithm::FixedWindow { window } | Algorithm::SlidingWindow { window } => {
                    (200.0 * window.as_secs_f64()).floor().max(1.0) as u64
                }
                _ => 200,
            };
            let mut rng = Rng(0x5eed_0000 + quota);
            let mut now = Nanos::from_secs(1);
            let end = Nanos::from_secs(30 * 86_400);
            let mut visits = 0;
            while now < end {
                // Silences from a minute to about five hours (2^24 windows of 10 ms are 46.6 hours).
                now = now + Duration::from_secs(60 + rng.below(5 * 3600));
                let key = Key::Ip(IpAddr::V4(Ipv4Addr::from(rng.below(8) as u32)));
                let admitted = burst(&e, id, key, now, quota + 5);
                assert!(
                    admitted <= quota,
                    "{algorithm:?} {partition:?} at {now}: {admitted} of {quota}"
                );
                assert_eq!(
                    admitted, quota,
                    "{algorithm:?} {partition:?} at {now}: a fresh quota refused after silence"
                );
                visits += 1;
            }
            assert!(visits > 200, "{visits}");
        }
    }
}

/// A route with a sale event from wall-clock `wall0 + 2 h`, for an hour, at base 1000,
/// on an engine built at `wall0`.
fn sale_in_two_hours(wall0: SystemTime) -> Engine {
    let mut route = RouteConfig::new("order", RouteMatch::any());
    let mut sale = route.controller.clone();
    sale.base_limit_rps = 1000.0;
    route.events = vec![Event::new(
        "sale",
        wall0 + Duration::from_secs(2 * 3600),
        Duration::from_secs(3600),
        sale,
    )];
    Engine::new(&Config::new(vec![route]), Nanos::ZERO, wall0).unwrap()
}

/// The event in force after a request at `at` (minutes on the engine's clock).
fn event_at(e: &Engine, minutes: u64) -> Option<String> {
    let now = Nanos::from_secs(minutes * 60);
    let _ = e.check(e.route_at(0).unwrap(), Key::None, now);
    e.route_snapshot(e.route_at(0).unwrap(), now)
        .unwrap()
        .active_event
}

#[test]
fn scheduled_events_follow_the_wall_clock_when_the_monotonic_clock_parts_from_it() {
    let wall0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let minutes = |m: u64| Duration::from_secs(m * 60);
    // The host is paused for 30 minutes at 10 minutes of uptime: the monotonic clock
    // stops, the wall clock does not. At 95 minutes of uptime it is 2 h 05 on the
    // wall: the sale has begun.
    let paused = sale_in_two_hours(wall0);
    assert_eq!(event_at(&paused, 10), None);
    paused.align_events(Nanos::from_secs(600), wall0 + minutes(40));
    assert_eq!(event_at(&paused, 89), None);
    assert_eq!(event_at(&paused, 95).as_deref(), Some("sale"));
    assert_eq!(paused.limit_rps(paused.route_at(0).unwrap()), Some(1000.0));
    // It ends at 3 h on the wall, 150 minutes of uptime.
    assert_eq!(event_at(&paused, 149).as_deref(), Some("sale"));
    assert_eq!(event_at(&paused, 151), None);
    assert_eq!(paused.limit_rps(paused.route_at(0).unwrap()), Some(200.0));
    // A wall clock that was 20 minutes fast at start, corrected by NTP at 10 minutes:
    // the sale begins at 140 minutes of uptime, not 120.
    let fast = sale_in_two_hours(wall0);
    fast.align_events(Nanos::from_secs(600), wall0 - minutes(10));
    assert_eq!(event_at(&fast, 125), None);
    assert_eq!(event_at(&fast, 141).as_deref(), Some("sale"));
    // Aligned once it has ended, an event is never due again.
    fast.align_events(Nanos::from_secs(600), wall0 + minutes(200));
    assert_eq!(event_at(&fast, 142), None);
    assert_eq!(event_at(&fast, 300), None);
}

#[test]
fn a_week_of_spikes_every_two_hours_cuts_and_restores_each_time() {
    for partition in [
        Partition::Route,
        Partition::ClientIp({
            let mut v = KeyLimits::default();
            v.idle_timeout = Duration::from_secs(60);
            v
        }),
    ] {
        let mut route = RouteConfig::new("order", RouteMatch::any());
        route.partition = partition.clone();
        let e = engine(vec![route]);
        let id = e.route_at(0).unwrap();
        let key = Key::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let spikes = 7 * 12;
        for k in 0..spikes {
            let t0 = 100.0 + 7200.0 * k as f64;
            // Calm, then a spike, then calm long enough to restore; then silence.
            assert_eq!(offer(&e, id, key, t0, t0 + 10.0, 40.0), 400, "{k}");
            let spiked = offer(&e, id, key, t0 + 10.0, t0 + 15.0, 600.0);
            assert!(spiked < 3000, "{partition:?} spike {k}: {spiked} of 3000");
            let s = e
                .route_snapshot(id, Nanos::from_secs_f64(t0 + 15.0))
                .unwrap();
            assert_eq!(s.state, ControllerState::Cut, "{partition:?} spike {k}");
            offer(&e, id, key, t0 + 15.0, t0 + 90.0, 40.0);
            let s = e
                .route_snapshot(id, Nanos::from_secs_f64(t0 + 90.0))
                .unwrap();
            assert_eq!(s.state, ControllerState::Normal, "{partition:?} spike {k}");
            assert_eq!(s.limit_rps, 200.0);
            // The first requests after two hours of silence find a full bucket. (Their
            // 83 req/s over the half-window, from nothing, are a spike of their own:
            // a second cut, over before the next calm.)
            let later = Nanos::from_secs_f64(t0 + 7100.0);
            assert_eq!(burst(&e, id, key, later, 250), 200, "{partition:?} {k}");
        }
        let s = e.route_snapshot(id, Nanos::from_secs(8 * 86_400)).unwrap();
        assert_eq!(s.cuts, 2 * spikes - 1, "{partition:?}");
        assert!(s.keys <= 1, "{partition:?}: {} keys", s.keys);
    }
}

#[test]
fn a_silent_route_caught_up_shows_where_its_controller_stands() {
    // Cut at 10 s, then no request for an hour. The controller's own clock says the
    // cut ended 2 s into the silence (its hold of calm), and the limit was back at
    // base 7 s later; a snapshot of the silent route said "cut for an hour".
    let (e, id) = cut_then_silent(Partition::Route);
    let hour = Nanos::from_secs(3600);
    e.catch_up(id, hour);
    let s = e.route_snapshot(id, hour).unwrap();
    assert_eq!(s.state, ControllerState::Normal);
    assert_eq!(s.limit_rps, 200.0);
    assert!(
        s.time_in_cut < Duration::from_secs(5),
        "{:?}",
        s.time_in_cut
    );
    assert_eq!(
        s.offered,
        e.route_snapshot(id, Nanos::from_secs(11)).unwrap().offered
    );
    assert_eq!(e.restore_eta(id, hour), None);
}

/// `Engine::upkeep`, which `rocgate serve` and the layer call every few seconds,
/// brings the routes decided here up to now and leaves those a shared store decides.
#[test]
fn upkeep_catches_up_the_routes_decided_here_only() {
    let hour = Nanos::from_secs(3600);
    let (here, id) = cut_then_silent(Partition::Route);
    here.upkeep(
        hour,
        SystemTime::UNIX_EPOCH + Duration::from_secs(3600),
        |_| false,
    );
    assert_eq!(
        here.route_snapshot(id, hour).unwrap().state,
        ControllerState::Normal
    );
    let (elsewhere, id) = cut_then_silent(Partition::Route);
    elsewhere.upkeep(
        hour,
        SystemTime::UNIX_EPOCH + Duration::from_secs(3600),
        |r| r == id,
    );
    assert_eq!(
        elsewhere.route_snapshot(id, hour).unwrap().state,
        ControllerState::Cut
    );
}

#[test]
fn a_silent_partitioned_route_caught_up_lets_its_idle_keys_go() {
    let (e, id) = cut_then_silent(Partition::ClientIp({
        let mut v = KeyLimits::default();
        v.idle_timeout = Duration::from_secs(60);
        v
    }));
    assert_eq!(e.route_snapshot(id, Nanos::from_secs(11)).unwrap().keys, 1);
    e.catch_up(id, Nanos::from_secs(3600));
    assert_eq!(
        e.route_snapshot(id, Nanos::from_secs(3600)).unwrap().keys,
        0
    );
}

#[test]
fn a_silent_route_caught_up_takes_its_scheduled_event_when_due() {
    let wall0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let e = sale_in_two_hours(wall0);
    let at = |minutes: u64| Nanos::from_secs(minutes * 60);
    e.catch_up(e.route_at(0).unwrap(), at(119));
    assert_eq!(
        e.route_snapshot(e.route_at(0).unwrap(), at(119))
            .unwrap()
            .active_event,
        None
    );
    e.catch_up(e.route_at(0).unwrap(), at(121));
    let s = e.route_snapshot(e.route_at(0).unwrap(), at(121)).unwrap();
    assert_eq!(s.active_event.as_deref(), Some("sale"));
    assert_eq!(e.limit_rps(e.route_at(0).unwrap()), Some(1000.0));
    assert_eq!(s.offered, 0);
}
