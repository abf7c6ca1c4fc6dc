//! The traffic simulator: replays traffic through the real [`Engine`](crate::engine::Engine)
//! on a virtual clock, and reports what each route would have done, slot by slot.
//!
//! The parts:
//! - a [`Profile`]: a piecewise-linear request rate over time, from a CSV text
//!   ([`Profile::parse_csv`]) or a built-in [`Scenario`]; its [`Arrivals`] are evenly
//!   spaced ([`ArrivalModel::Uniform`]) or Poisson ([`ArrivalModel::Poisson`], from a
//!   seed), generated lazily;
//! - an [`AccessLog`] ([`access_log`]): yesterday's nginx or Apache log, each request
//!   matched to a route as `rocgate serve` would match it;
//! - a [`Simulator`]: builds an engine from a [`Config`](crate::config::Config) at
//!   virtual time zero, sends every request to its route with the request's time as
//!   `now`, and returns a [`SimRun`]: a [`RunSummary`] over all routes and, per route, a
//!   [`SimResult`] of a [`Summary`] and one [`SlotRow`] per window slot;
//! - a [`Sweep`] ([`sweep`]): the same traffic under a grid of parameter values, run on
//!   every core;
//! - charts of a run (`chart`, feature `charts`).
//!
//! Nothing here reads a clock or sleeps, and the only I/O is through readers and
//! writers the caller passes (and [`access_log::open`]): the same inputs give the same
//! result, byte for byte.
//!
//! ```
//! use rocgate::config::{Config, PathPattern, RouteConfig, RouteMatch};
//! use rocgate::sim::{ArrivalModel, Scenario, Simulator};
//!
//! // Any method; a 6 s window of 100 ms slots; base 200, cut 60, danger 80.
//! let matcher = RouteMatch::new(None, PathPattern::Exact("/api/order".into()));
//! let route = RouteConfig::new("order", matcher);
//! let sim = Simulator::new(Config::new(vec![route]), None).unwrap();
//! // 40 req/s, then 600 req/s from t = 20 s.
//! let profile = Scenario::FlashSale.profile();
//! let result = sim.run_profile(&profile, ArrivalModel::Uniform).unwrap();
//! let s = &result.summary;
//! let cut_s = s.first_cut_s.unwrap();
//! assert!(cut_s > 20.0 && cut_s <= 20.6, "cut at {cut_s}");
//! assert_eq!(s.offered, 16_400);
//! assert_eq!(s.admitted + s.rejected, s.offered);
//! assert_eq!(result.series.len(), 600); // 60 s in 100 ms slots
//! ```
//!
//! # Time
//!
//! The virtual clock starts at zero at the profile's first point (or the access log's
//! first second, see [`access_log`]), and the engine is built then (so no controller
//! acts during the first full window). Every time in the results is in seconds since
//! that start (`t_s`, `*_s`), whatever the profile's own first `t_seconds` was.
//! Scheduled events are placed by wall-clock time: the start is taken to be
//! `UNIX_EPOCH + first t_seconds` (so a profile written in Unix seconds meets the
//! config's events where they belong), the log's first second, or the time given to
//! [`Simulator::wall_start`] (`rocgate simulate --start`).
//!
//! Requests complete instantly: a concurrency limit never binds, and a paced (leaky
//! bucket) admission counts as admitted.
//!
//! # Several routes
//!
//! A run records one or more routes of the configuration ([`Simulator::for_routes`]).
//! Requests go to the engine in time order, all routes interleaved, as they would
//! reach `serve`; each route keeps its own series, in its own slots.
//!
//! # Overload
//!
//! With a capacity ([`Simulator::capacity`], `rocgate simulate --capacity RPS`), the
//! protected service is taken to handle `RPS` requests in each whole second of the run
//! (`[k s, k+1 s)`), all recorded routes together: in each second, every admitted
//! request after the first `RPS` counts as *overload*, on the route it was sent to. A
//! sweep then shows the trade between what rocgate rejects and what gets through to a
//! service that cannot take it.
//!
//! # `timeseries.csv`
//!
//! One row per slot of each route's window (100 ms by default), from `t = 0` to the
//! end of the run, route after route in config order, written by
//! [`SimRun::write_csv`]:
//!
//! | column | meaning |
//! |---|---|
//! | `route` | the route's name |
//! | `t_s` | start of the slot, seconds |
//! | `offered` | requests that arrived during the slot |
//! | `admitted` | of those, admitted (in `shadow` mode: all) |
//! | `rejected` | of those, rejected, all reasons |
//! | `rejected_limit`, `rejected_roc_cut`, `rejected_concurrency`, `rejected_queue_full`, `rejected_fallback_local` | rejected, by reason |
//! | `shadow_rejected` | shadow modes: admitted but would have been rejected (in `shadow_adaptive`, by the cut, besides `rejected`) |
//! | `overload` | of the admitted, those above the capacity (0 without one) |
//! | `roc` | ROC of the last window sample the controller saw when the slot began (req/s per half-window; a ratio in relative mode) |
//! | `danger_roc`, `safe_roc` | the thresholds in force (an event's, while one is active) |
//! | `limit_rps` | the controller's limit in force during the slot |
//! | `base_limit_rps` | the base limit in force |
//! | `state` | the controller's state during the slot: `normal`, `cut`, `recovering` |
//! | `level` | the limiter's level at the end of the slot: tokens left for a token bucket (requests counted, queued or in flight for the other algorithms); `NaN` on a partitioned route, whose limiters are each key's |
//! | `level_capacity` | the most `level` can be at that time (the bucket's capacity) |
//! | `route_limit_rejected` | of `rejected` (in `shadow` mode, of `shadow_rejected`), those a partitioned route's `route_limit` refused after their key's own limit admitted them, counted among `rejected_limit` or `rejected_roc_cut` too; 0 on a route without one |
//!
//! The engine steps its controller when the first request of a new slot arrives, so
//! `roc`, the thresholds, `limit_rps` and `state` are exactly what decided that slot's
//! requests. A slot without requests steps the controller at its start all the same
//! ([`Engine::catch_up`](crate::engine::Engine::catch_up)): a route that falls silent during a
//! cut recovers in the series, the transitions and `time_in_cut_s` as the controller
//! does when stepped every slot, instead of staying cut (at its last ROC) to the end of
//! the run. (`serve` catches a silent route up every 5 s, and at its next request,
//! which lands it in the same state.) A route name holding a comma or a quote is quoted, CSV style.
//!
//! # `summary.json`
//!
//! `rocgate simulate --out DIR` writes the input, the [`RunSummary`] and one
//! [`Summary`] per route:
//!
//! | field | meaning |
//! |---|---|
//! | `scenario`, `profile`, `access_logs` | the traffic: a scenario name, a profile path, or the access logs read (the others `null`) |
//! | `seed` | Poisson arrivals (profiles) or random spreading in a second (logs); `null`: evenly spaced |
//! | `log` | access logs only: what reading found, see [`LogStats`]: `lines`, `blank`, `unparsable`, `first_unparsable` (a list of the first five, each `{source, line, error}`), `outside`, `unmatched`, `unmatched_examples`, `other_routes`, `other_route_names` (the first five), `no_address` (requests on routes partitioned by client IP whose client is no IP address), `no_address_examples` (the first five), `replayed` |
//! | `start_unix_s` | wall-clock time of `t = 0`, Unix seconds |
//! | `duration_s` | length of the run |
//! | `capacity_rps` | the capacity modelled, or `null` |
//! | `offered`, `admitted`, `rejected`, `shadow_rejected` | all routes together |
//! | `rejected_without_cuts` | what all routes together would have rejected had no route enforced a cut: each `enforce` route's own (below), the others' `rejected`; `null` when no route is in `enforce` mode |
//! | `overload` | admitted requests above the capacity |
//! | `overload_s` | whole seconds in which more than the capacity was admitted |
//! | `cut_count`, `first_cut_s`, `time_in_cut_s` | cuts of all routes, the earliest (or `null`), time in cut summed over routes |
//! | `peak_admitted_1s`, `peak_admitted_1s_at_s` | most requests admitted in any 1 s, all routes together (sliding by the longest step that meets every route's, below: one route's alone; 100 ms where that would be under 1 ms), and when that second began |
//! | `routes` | one object per route, in config order, as below |
//! | `hints` | the run's tuning hints, each as `GET /admin/hints` gives it (`route`, `rule`, `severity`, `parameter`, `current`, `suggested`, `reason`, and `event` on a hint judged under a scheduled event's profile that changes that event's setting or nothing) |
//!
//! Each of `routes`:
//!
//! | field | meaning |
//! |---|---|
//! | `route`, `mode` | the route and its mode |
//! | `start_unix_s`, `duration_s`, `slot_s` | as above, and the route's slot |
//! | `offered`, `admitted`, `rejected` | request counts over the run |
//! | `rejected_by_reason` | `{limit, roc_cut, concurrency, queue_full, fallback_local}` |
//! | `route_limit_rejected` | a partitioned route's `route_limit`: of the requests `rejected_by_reason` (in `shadow` mode, `shadow_rejected_by_reason`) counts as `limit` or `roc_cut`, those the keys' total refused after their key's own limit admitted them; `null` on a route without one |
//! | `rejected_without_cuts` | `enforce` routes: what the route rejects on the same arrivals with a controller that never cuts, by its base limit alone (an event's while one is active), counted by a second engine beside the run's; `rejected` less this is what the cuts themselves rejected (every refusal during a cut counts as `roc_cut`, those the base limit would have made too). Equal to `rejected` on a route that never cut; `null` on a route in a shadow mode |
//! | `cut_own_net` | the cuts' own refusals as the run's engine counts them live, net (`GET /admin/routes`' `cut_own_net` at the run's end): against a twin token bucket at the base limit started from the route's at each cut's start; 0 on a route that never cut; `null` where not counted (a partitioned route, another algorithm, `shadow_adaptive`) |
//! | `shadow_rejected`, `shadow_rejected_by_reason` | shadow modes: what would have been rejected |
//! | `overload` | this route's admitted requests above the capacity |
//! | `cuts` | every cut: `{t_s, from, to, roc, limit_rps}` |
//! | `first_cut_s` | time of the first cut, or `null` |
//! | `time_in_cut_s` | total time the controller spent in `cut` |
//! | `transitions` | every state change, same shape as `cuts` |
//! | `peak_admitted_1s`, `peak_admitted_1s_at_s` | most requests admitted in any 1 s (sliding by 100 ms, or by the slot when slots are shorter and 1 s is a whole number of them; by 50 ms for slots of 250 ms, 25 ms for 125 ms, so that every second the series shows as whole slots is weighed), and when that second began |
//! | `peak_offered_1s` | most requests offered in any 1 s, likewise |
//!
//! Fields are only ever added, never renamed or removed.

pub mod access_log;
#[cfg(feature = "charts")]
pub mod chart;
pub mod hints;
mod profile;
mod run;
pub mod sweep;

pub use access_log::{AccessLog, LogOptions, LogReader, LogStats, Spread};
pub use profile::{
    ArrivalModel, Arrivals, Profile, ProfileError, Scenario, UnknownScenario, LATEST_TIME_S,
};
pub use run::{
    CutsOwn, ReasonCounts, Request, RunSummary, SimError, SimResult, SimRun, Simulator, SlotRow,
    Summary, TransitionRecord,
};
pub use sweep::{Sweep, SweepError, SweepParam, SweepRow};

/// The most slots one run may record, over all its routes (27.7 hours of 100 ms
/// slots on one route, a tenth of that on ten; about 184 MB of rows, and a peak of
/// about 300 MB resident for the whole run).
pub const MAX_SLOTS: u64 = 1_000_000;

/// The most requests a profile may offer in one run: at about 110 ns a request
/// (`cargo bench --bench sim`), under two minutes; 27 hours at 10,000 req/s.
pub const MAX_ARRIVALS: f64 = 1e9;
