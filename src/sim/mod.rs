//! The traffic simulator: replays a traffic profile through the real [`Engine`] on a
//! virtual clock, and reports what the route would have done, slot by slot.
//!
//! Three parts:
//! - a [`Profile`]: a piecewise-linear request rate over time, from a CSV text
//!   ([`Profile::parse_csv`]) or a built-in [`Scenario`];
//! - [`Arrivals`]: the request times a profile yields, evenly spaced
//!   ([`ArrivalModel::Uniform`]) or Poisson ([`ArrivalModel::Poisson`], from a seed),
//!   generated lazily;
//! - a [`Simulator`]: builds an engine from a [`Config`] at virtual time zero, sends
//!   every arrival to one route with the arrival's time as `now`, and returns a
//!   [`SimResult`]: a [`Summary`] and one [`SlotRow`] per window slot.
//!
//! Nothing here reads a clock, sleeps or does I/O other than into the writer the
//! caller passes to [`SimResult::write_csv`]: the same inputs give the same result.
//!
//! ```
//! use rocgate::config::{Config, Mode, Partition, PathPattern, RouteConfig, RouteMatch};
//! use rocgate::controller::ControllerParams;
//! use rocgate::sim::{ArrivalModel, Scenario, Simulator};
//!
//! let route = RouteConfig {
//!     name: "order".into(),
//!     matcher: RouteMatch { method: None, path: PathPattern::Exact("/api/order".into()) },
//!     mode: Mode::Enforce,
//!     reject_status: 429,
//!     window: Default::default(), // 6 s of 100 ms slots
//!     controller: ControllerParams::default(), // base 200, cut 60, danger 80
//!     algorithm: Default::default(),
//!     partition: Partition::Route,
//!     tiers: vec![],
//!     events: vec![],
//! };
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
//! The virtual clock starts at zero at the profile's first point, and the engine is
//! built then (so no controller acts during the first full window). Every time in the
//! results is in seconds since that start (`t_s`, `*_s`), whatever the profile's own
//! first `t_seconds` was. Scheduled events are placed by wall-clock time: the start is
//! taken to be `UNIX_EPOCH + first t_seconds` (so a profile written in Unix seconds
//! meets the config's events where they belong), or the time given to
//! [`Simulator::wall_start`] (`rocgate simulate --start`).
//!
//! Requests complete instantly: a concurrency limit never binds, and a paced (leaky
//! bucket) admission counts as admitted.
//!
//! # `timeseries.csv`
//!
//! One row per slot of the route's window (100 ms by default), from `t = 0` to the end
//! of the profile, written by [`SimResult::write_csv`]:
//!
//! | column | meaning |
//! |---|---|
//! | `t_s` | start of the slot, seconds |
//! | `offered` | requests that arrived during the slot |
//! | `admitted` | of those, admitted (in `shadow` mode: all) |
//! | `rejected` | of those, rejected, all reasons |
//! | `rejected_limit`, `rejected_roc_cut`, `rejected_concurrency`, `rejected_queue_full`, `rejected_fallback_local` | rejected, by reason |
//! | `shadow_rejected` | shadow modes: admitted but would have been rejected |
//! | `roc` | ROC of the last window sample the controller saw when the slot began (req/s per half-window; a ratio in relative mode) |
//! | `limit_rps` | the controller's limit in force during the slot |
//! | `state` | the controller's state during the slot: `normal`, `cut`, `recovering` |
//! | `level` | the limiter's level at the end of the slot: tokens left for a token bucket (requests counted, queued or in flight for the other algorithms) |
//! | `level_capacity` | the most `level` can be at that time (the bucket's capacity) |
//!
//! The engine steps its controller when the first request of a new slot arrives, so
//! `roc`, `limit_rps` and `state` are exactly what decided that slot's requests; in a
//! slot without requests they stay as they were.
//!
//! # `summary.json`
//!
//! `rocgate simulate --out DIR` writes the input (`scenario` or `profile`, `seed`) and
//! the fields of [`Summary`]:
//!
//! | field | meaning |
//! |---|---|
//! | `route`, `mode` | the route driven and its mode |
//! | `start_unix_s` | wall-clock time of `t = 0`, Unix seconds |
//! | `duration_s`, `slot_s` | length of the run and of one slot |
//! | `offered`, `admitted`, `rejected` | request counts over the run |
//! | `rejected_by_reason` | `{limit, roc_cut, concurrency, queue_full, fallback_local}` |
//! | `shadow_rejected`, `shadow_rejected_by_reason` | shadow modes: what would have been rejected |
//! | `cuts` | every cut: `{t_s, from, to, roc, limit_rps}` |
//! | `first_cut_s` | time of the first cut, or `null` |
//! | `time_in_cut_s` | total time the controller spent in `cut` |
//! | `transitions` | every state change, same shape as `cuts` |
//! | `peak_admitted_1s`, `peak_admitted_1s_at_s` | most requests admitted in any 1 s (whole slots, sliding), and when that second began |
//! | `peak_offered_1s` | most requests offered in any 1 s |

use crate::clock::{duration_nanos, Nanos};
use crate::config::{Config, Mode};
use crate::controller::{ControllerState, Transition};
use crate::engine::{Engine, Key, RouteId};
use crate::limiter::{Decision, Reason};
use rand::{RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::{Serialize, Serializer};
use std::fmt;
use std::io;
use std::iter::FusedIterator;
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The most slots one run may record (27.7 hours of 100 ms slots, about 120 MB of rows).
pub const MAX_SLOTS: u64 = 1_000_000;

/// The most requests a profile may offer in one run.
pub const MAX_ARRIVALS: f64 = 1e10;

/// A request rate that varies linearly between points, over a finite span.
///
/// The rate is zero outside `[first point, last point)`. Two points at the same time
/// make a step.
///
/// ```
/// use rocgate::sim::Profile;
///
/// let p = Profile::parse_csv("t_seconds,rate\n0,10\n10,30\n10,0\n20,0\n").unwrap();
/// assert_eq!(p.rate_at(5.0), 20.0);
/// assert_eq!(p.rate_at(15.0), 0.0);
/// assert_eq!(p.expected_arrivals(), 200.0);
/// assert_eq!(p.duration().as_secs(), 20);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// `t_seconds` of the first point.
    start_s: f64,
    /// `(seconds since the first point, rate)`.
    points: Box<[(f64, f64)]>,
    /// Expected arrivals from the start to each point.
    cumulative: Box<[f64]>,
}

/// Why a profile was refused. Line numbers are 1-based.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// A line does not hold exactly two comma-separated fields.
    #[error("line {line}: expected `t_seconds,rate`, found {fields} field(s)")]
    Fields {
        /// The line.
        line: usize,
        /// How many fields it holds.
        fields: usize,
    },
    /// A field is not a finite number.
    #[error("line {line}: {field} is not a number: `{text}`")]
    NotANumber {
        /// The line.
        line: usize,
        /// `t_seconds` or `rate`.
        field: &'static str,
        /// The field as written.
        text: String,
    },
    /// A rate is below zero.
    #[error("line {line}: rate must not be negative, got {rate}")]
    NegativeRate {
        /// The line.
        line: usize,
        /// The rate.
        rate: f64,
    },
    /// A point's time is earlier than the previous point's.
    #[error("line {line}: t_seconds must increase, got {t} after {previous}")]
    TimeNotIncreasing {
        /// The line.
        line: usize,
        /// The point's time.
        t: f64,
        /// The previous point's time.
        previous: f64,
    },
    /// Fewer than two points.
    #[error("a profile needs at least 2 points, found {points}")]
    TooFewPoints {
        /// How many points there are.
        points: usize,
    },
    /// The last point is at the same time as the first.
    #[error("a profile must span some time, but all its points are at t = {t}")]
    NoDuration {
        /// The time of every point.
        t: f64,
    },
}

impl ProfileError {
    /// The 1-based line the error is on, if it is about one line.
    pub fn line(&self) -> Option<usize> {
        match self {
            ProfileError::Fields { line, .. }
            | ProfileError::NotANumber { line, .. }
            | ProfileError::NegativeRate { line, .. }
            | ProfileError::TimeNotIncreasing { line, .. } => Some(*line),
            ProfileError::TooFewPoints { .. } | ProfileError::NoDuration { .. } => None,
        }
    }
}

impl Profile {
    /// A profile through `(t_seconds, rate)` points. Errors give the 1-based position of
    /// the offending point as its line.
    pub fn from_points(points: &[(f64, f64)]) -> Result<Self, ProfileError> {
        Self::build(points.iter().enumerate().map(|(i, &p)| (i + 1, p)))
    }

    /// Parses `t_seconds,rate` lines. Blank lines and `#` comments are ignored, and
    /// so is a first line with no number in it (a header).
    pub fn parse_csv(text: &str) -> Result<Self, ProfileError> {
        let mut points = Vec::new();
        let mut seen_content = false;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or_default().trim();
            if content.is_empty() {
                continue;
            }
            let fields: Vec<&str> = content.split(',').map(str::trim).collect();
            let is_header = !seen_content && fields.iter().all(|f| f.parse::<f64>().is_err());
            seen_content = true;
            if is_header {
                continue;
            }
            let [t, rate] = fields[..] else {
                return Err(ProfileError::Fields {
                    line,
                    fields: fields.len(),
                });
            };
            points.push((
                line,
                (number(t, "t_seconds", line)?, number(rate, "rate", line)?),
            ));
        }
        Self::build(points)
    }

    fn build(points: impl IntoIterator<Item = (usize, (f64, f64))>) -> Result<Self, ProfileError> {
        let mut valid: Vec<(f64, f64)> = Vec::new();
        for (line, (t, rate)) in points {
            for (x, field) in [(t, "t_seconds"), (rate, "rate")] {
                if !x.is_finite() {
                    let text = x.to_string();
                    return Err(ProfileError::NotANumber { line, field, text });
                }
            }
            if rate < 0.0 {
                return Err(ProfileError::NegativeRate { line, rate });
            }
            if let Some(&(previous, _)) = valid.last() {
                if t < previous {
                    return Err(ProfileError::TimeNotIncreasing { line, t, previous });
                }
            }
            valid.push((t, rate));
        }
        match (valid.first(), valid.last()) {
            _ if valid.len() < 2 => Err(ProfileError::TooFewPoints {
                points: valid.len(),
            }),
            (Some(&(first, _)), Some(&(last, _))) if last <= first => {
                Err(ProfileError::NoDuration { t: first })
            }
            _ => Ok(Self::assemble(&valid)),
        }
    }

    /// A profile through points already known to be valid.
    fn assemble(points: &[(f64, f64)]) -> Self {
        let start_s = points.first().map_or(0.0, |p| p.0);
        let points: Box<[(f64, f64)]> = points.iter().map(|&(t, r)| (t - start_s, r)).collect();
        let mut area = 0.0;
        let cumulative = std::iter::once(0.0)
            .chain(points.windows(2).map(|w| {
                area += 0.5 * (w[0].1 + w[1].1) * (w[1].0 - w[0].0);
                area
            }))
            .collect();
        Profile {
            start_s,
            points,
            cumulative,
        }
    }

    /// `t_seconds` of the first point: the profile's own time at the start of a run.
    pub fn start_s(&self) -> f64 {
        self.start_s
    }

    /// From the first point to the last.
    pub fn duration(&self) -> Duration {
        let end = self.points.last().map_or(0.0, |p| p.0);
        Duration::try_from_secs_f64(end).unwrap_or(Duration::MAX)
    }

    /// The rate `t_s` seconds after the first point, req/s (zero outside the profile).
    pub fn rate_at(&self, t_s: f64) -> f64 {
        let i = self.points.partition_point(|p| p.0 <= t_s);
        if i == 0 || i == self.points.len() {
            return 0.0;
        }
        let (t0, r0) = self.points[i - 1];
        let (t1, r1) = self.points[i];
        r0 + (r1 - r0) * (t_s - t0) / (t1 - t0)
    }

    /// Requests the profile offers in expectation: the integral of its rate.
    pub fn expected_arrivals(&self) -> f64 {
        self.cumulative.last().copied().unwrap_or(0.0)
    }

    /// The arrival times of this profile under `model`, in seconds since its first
    /// point, generated lazily.
    pub fn arrivals(&self, model: ArrivalModel) -> Arrivals<'_> {
        let (target, rng) = match model {
            // Arrival k at the time the expected count reaches k − ½: evenly spread,
            // never on a slot boundary at whole rates, and as many as the integral rounds to.
            ArrivalModel::Uniform => (-0.5, None),
            ArrivalModel::Poisson { seed } => (0.0, Some(Pcg64Mcg::seed_from_u64(seed))),
        };
        Arrivals {
            profile: self,
            segment: 0,
            target,
            rng,
        }
    }
}

fn number(text: &str, field: &'static str, line: usize) -> Result<f64, ProfileError> {
    match text.parse::<f64>() {
        Ok(x) if x.is_finite() => Ok(x),
        _ => Err(ProfileError::NotANumber {
            line,
            field,
            text: text.to_owned(),
        }),
    }
}

/// How arrivals are placed under a profile's rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalModel {
    /// Evenly spaced: arrival k comes when the integral of the rate reaches k − ½.
    Uniform,
    /// An inhomogeneous Poisson process (by time-rescaling), reproducible from the seed
    /// (PCG-64 MCG, a value-stable generator).
    Poisson {
        /// The generator's seed.
        seed: u64,
    },
}

impl ArrivalModel {
    /// Poisson with this seed, or uniform without one.
    pub fn from_seed(seed: Option<u64>) -> Self {
        seed.map_or(ArrivalModel::Uniform, |seed| ArrivalModel::Poisson { seed })
    }
}

impl fmt::Display for ArrivalModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArrivalModel::Uniform => f.write_str("uniform"),
            ArrivalModel::Poisson { seed } => write!(f, "poisson (seed {seed})"),
        }
    }
}

/// The arrival times of a profile, in time order, as time since its first point.
///
/// Time-rescaling: arrival k comes at the time the integral of the rate reaches a
/// target, the k-th of evenly spaced targets (uniform) or of the partial sums of
/// unit-mean exponential draws (Poisson). Each arrival costs a few floating-point
/// operations and a square root; nothing is allocated.
#[derive(Clone, Debug)]
pub struct Arrivals<'a> {
    profile: &'a Profile,
    /// The segment `points[segment]..points[segment + 1]` holding the last arrival.
    segment: usize,
    /// Integral of the rate at the last arrival.
    target: f64,
    rng: Option<Pcg64Mcg>,
}

impl Iterator for Arrivals<'_> {
    type Item = Nanos;

    fn next(&mut self) -> Option<Nanos> {
        self.target += match &mut self.rng {
            None => 1.0,
            Some(rng) => exponential(rng),
        };
        let points = &self.profile.points;
        let cumulative = &self.profile.cumulative;
        while self.segment + 1 < points.len() && self.target > cumulative[self.segment + 1] {
            self.segment += 1;
        }
        if self.segment + 1 >= points.len() {
            return None;
        }
        let (t0, r0) = points[self.segment];
        let (t1, r1) = points[self.segment + 1];
        let dt = t1 - t0;
        let area = self.target - cumulative[self.segment];
        // Solve r0·u + ½·slope·u² = area for u in a form that stays exact when the
        // slope is zero and does not cancel when it is negative.
        let u = if dt > 0.0 {
            let slope = (r1 - r0) / dt;
            let denominator = r0 + (r0 * r0 + 2.0 * slope * area).max(0.0).sqrt();
            if denominator > 0.0 {
                (2.0 * area / denominator).clamp(0.0, dt)
            } else {
                0.0
            }
        } else {
            0.0
        };
        Some(Nanos::from_secs_f64(t0 + u))
    }
}

impl FusedIterator for Arrivals<'_> {}

/// A unit-mean exponential draw from 53 random bits.
fn exponential(rng: &mut Pcg64Mcg) -> f64 {
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
    -(-u).ln_1p()
}

/// The built-in traffic scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// 40 req/s for 60 s: must never cut.
    Steady,
    /// A legitimate ramp, 5 → 40 req/s over 60 s: must never cut.
    Warmup,
    /// 40 req/s for 20 s, a step to 600 req/s held for 20 s, a decay back to 40 over
    /// 10 s, a 10 s tail.
    FlashSale,
    /// 40 req/s, with a 2 s burst at 400 req/s from t = 20 s; 45 s in all.
    BotBurst,
    /// 40 req/s with two 500 req/s spikes: 15–20 s, then 26–30 s while the first cut
    /// is still being restored; 60 s in all.
    DoubleSpike,
}

impl Scenario {
    /// Every scenario, in the order of [`Scenario::names`].
    pub const ALL: [Scenario; 5] = [
        Scenario::Steady,
        Scenario::Warmup,
        Scenario::FlashSale,
        Scenario::BotBurst,
        Scenario::DoubleSpike,
    ];

    /// The scenarios' names, as the CLI takes them.
    pub fn names() -> [&'static str; 5] {
        Self::ALL.map(Scenario::name)
    }

    /// The scenario's name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Steady => "steady",
            Scenario::Warmup => "warmup",
            Scenario::FlashSale => "flash-sale",
            Scenario::BotBurst => "bot-burst",
            Scenario::DoubleSpike => "double-spike",
        }
    }

    /// The scenario's rate profile.
    pub fn profile(self) -> Profile {
        let points: &[(f64, f64)] = match self {
            Scenario::Steady => &[(0.0, 40.0), (60.0, 40.0)],
            Scenario::Warmup => &[(0.0, 5.0), (60.0, 40.0)],
            Scenario::FlashSale => &[
                (0.0, 40.0),
                (20.0, 40.0),
                (20.0, 600.0),
                (40.0, 600.0),
                (50.0, 40.0),
                (60.0, 40.0),
            ],
            Scenario::BotBurst => &[
                (0.0, 40.0),
                (20.0, 40.0),
                (20.0, 400.0),
                (22.0, 400.0),
                (22.0, 40.0),
                (45.0, 40.0),
            ],
            Scenario::DoubleSpike => &[
                (0.0, 40.0),
                (15.0, 40.0),
                (15.0, 500.0),
                (20.0, 500.0),
                (20.0, 40.0),
                (26.0, 40.0),
                (26.0, 500.0),
                (30.0, 500.0),
                (30.0, 40.0),
                (60.0, 40.0),
            ],
        };
        // Constant points; a test checks that `from_points` accepts each of them.
        Profile::assemble(points)
    }
}

impl FromStr for Scenario {
    type Err = UnknownScenario;

    fn from_str(name: &str) -> Result<Self, UnknownScenario> {
        Self::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| UnknownScenario {
                name: name.to_owned(),
            })
    }
}

/// A scenario name that is not built in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown scenario `{name}`; known scenarios: {}", Scenario::names().join(", "))]
pub struct UnknownScenario {
    /// The name asked for.
    pub name: String,
}

/// Why a simulation cannot run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SimError {
    /// The configuration has no route to drive.
    #[error("the configuration has no routes")]
    NoRoutes,
    /// No route has the name asked for.
    #[error("unknown route `{name}`; routes in the configuration: {}", known.join(", "))]
    UnknownRoute {
        /// The name asked for.
        name: String,
        /// The routes there are.
        known: Vec<String>,
    },
    /// The run would record more than [`MAX_SLOTS`] slots.
    #[error(
        "a run of {duration:?} in slots of {slot:?} needs {slots} slots, more than {MAX_SLOTS}"
    )]
    TooManySlots {
        /// Length of the run.
        duration: Duration,
        /// The route's slot.
        slot: Duration,
        /// Slots the run would record.
        slots: u64,
    },
    /// The profile offers more than [`MAX_ARRIVALS`] requests.
    #[error("the profile offers {expected:.0} requests, more than {MAX_ARRIVALS:.0}")]
    TooManyArrivals {
        /// Requests the profile offers.
        expected: f64,
    },
}

/// Replays arrivals through a fresh [`Engine`] for one route of a configuration.
#[derive(Clone, Debug)]
pub struct Simulator {
    config: Config,
    route: RouteId,
    wall_start: Option<SystemTime>,
}

impl Simulator {
    /// A simulator for `route` (by name; the first route when `None`) of `config`.
    pub fn new(config: Config, route: Option<&str>) -> Result<Self, SimError> {
        let index = match route {
            None if config.routes.is_empty() => return Err(SimError::NoRoutes),
            None => 0,
            Some(name) => config
                .routes
                .iter()
                .position(|r| r.name == name)
                .ok_or_else(|| SimError::UnknownRoute {
                    name: name.to_owned(),
                    known: config.routes.iter().map(|r| r.name.clone()).collect(),
                })?,
        };
        Ok(Simulator {
            config,
            // The engine builds its route table in config order.
            route: RouteId(index),
            wall_start: None,
        })
    }

    /// Places virtual time zero at this wall-clock time, for scheduled events.
    pub fn wall_start(mut self, at: SystemTime) -> Self {
        self.wall_start = Some(at);
        self
    }

    /// Runs the profile's arrivals under `model`, for the profile's duration. Time
    /// zero is at wall-clock `UNIX_EPOCH + profile.start_s()` unless
    /// [`Simulator::wall_start`] says otherwise.
    pub fn run_profile(
        &self,
        profile: &Profile,
        model: ArrivalModel,
    ) -> Result<SimResult, SimError> {
        let expected = profile.expected_arrivals();
        if expected > MAX_ARRIVALS {
            return Err(SimError::TooManyArrivals { expected });
        }
        let wall = self
            .wall_start
            .unwrap_or_else(|| unix_time(profile.start_s()));
        self.run_at(profile.arrivals(model), profile.duration(), wall)
    }

    /// Runs arbitrary arrival times (time since the start, in order; an arrival earlier
    /// than the one before it is taken at that one's time) until `duration`: the first
    /// arrival at or after `duration` ends the run. Time zero is at wall-clock
    /// `UNIX_EPOCH` unless [`Simulator::wall_start`] says otherwise.
    pub fn run(
        &self,
        arrivals: impl IntoIterator<Item = Nanos>,
        duration: Duration,
    ) -> Result<SimResult, SimError> {
        self.run_at(arrivals, duration, self.wall_start.unwrap_or(UNIX_EPOCH))
    }

    fn run_at(
        &self,
        arrivals: impl IntoIterator<Item = Nanos>,
        duration: Duration,
        wall_start: SystemTime,
    ) -> Result<SimResult, SimError> {
        let cfg = &self.config.routes[self.route.0];
        let slot = cfg.window.slot();
        let slot_ns = duration_nanos(slot);
        let end = Nanos::new(duration_nanos(duration));
        let slots = end.as_u64().div_ceil(slot_ns);
        if slots > MAX_SLOTS {
            return Err(SimError::TooManySlots {
                duration,
                slot,
                slots,
            });
        }

        let transitions = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&transitions);
        let name = cfg.name.clone();
        let engine = Engine::new(&self.config, Nanos::ZERO, wall_start).with_transition_hook(
            Arc::new(move |route: &str, t: &Transition| {
                if route == name {
                    sink.lock().unwrap_or_else(PoisonError::into_inner).push(*t);
                }
            }),
        );

        let mut rec = Recorder::new(&engine, self.route, slot_ns, slots);
        let mut last = Nanos::ZERO;
        for t in arrivals {
            let t = t.max(last);
            if t >= end {
                break;
            }
            last = t;
            rec.arrive(t);
        }
        let series = rec.finish(slots);

        let snap = engine.route_snapshot(self.route, end);
        drop(engine);
        let transitions: Vec<TransitionRecord> =
            std::mem::take(&mut *transitions.lock().unwrap_or_else(PoisonError::into_inner))
                .iter()
                .map(TransitionRecord::from)
                .collect();
        let cuts: Vec<TransitionRecord> = transitions
            .iter()
            .filter(|t| t.to == ControllerState::Cut)
            .copied()
            .collect();

        let span = ((1e9 / slot_ns as f64).round() as usize).max(1);
        let (peak_admitted_1s, peak_at) = peak(&series, span, |r| r.admitted);
        let (peak_offered_1s, _) = peak(&series, span, |r| r.offered);
        let rejected_by_reason = ReasonCounts::from_pairs(&snap.rejected);
        let shadow_rejected_by_reason = ReasonCounts::from_pairs(&snap.shadow_rejected);
        let summary = Summary {
            route: snap.name,
            mode: snap.mode,
            start_unix_s: unix_seconds(wall_start),
            duration_s: end.as_secs_f64(),
            slot_s: slot.as_secs_f64(),
            offered: snap.offered,
            admitted: snap.admitted,
            rejected: rejected_by_reason.total(),
            rejected_by_reason,
            shadow_rejected: shadow_rejected_by_reason.total(),
            shadow_rejected_by_reason,
            first_cut_s: cuts.first().map(|c| c.t_s),
            cuts,
            time_in_cut_s: snap.time_in_cut.as_secs_f64(),
            transitions,
            peak_admitted_1s,
            peak_admitted_1s_at_s: Nanos::new(peak_at as u64 * slot_ns).as_secs_f64(),
            peak_offered_1s,
        };
        Ok(SimResult { summary, series })
    }
}

/// `UNIX_EPOCH + secs`, or the epoch itself when that is not a representable time.
fn unix_time(secs: f64) -> SystemTime {
    let offset = Duration::try_from_secs_f64(secs.abs()).ok();
    let at = if secs >= 0.0 {
        offset.and_then(|d| UNIX_EPOCH.checked_add(d))
    } else {
        offset.and_then(|d| UNIX_EPOCH.checked_sub(d))
    };
    at.unwrap_or(UNIX_EPOCH)
}

fn unix_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

/// The largest sum of `span` consecutive rows (all rows if fewer), and the first row's index.
fn peak(rows: &[SlotRow], span: usize, value: impl Fn(&SlotRow) -> u64) -> (u64, usize) {
    let span = span.min(rows.len());
    let mut sum: u64 = rows[..span].iter().map(&value).sum();
    let (mut best, mut at) = (sum, 0);
    for i in span..rows.len() {
        sum = sum + value(&rows[i]) - value(&rows[i - span]);
        if sum > best {
            (best, at) = (sum, i + 1 - span);
        }
    }
    (best, at)
}

/// Counts one slot's arrivals and closes it with one engine snapshot.
struct Recorder<'e> {
    engine: &'e Engine,
    route: RouteId,
    slot_ns: u64,
    /// End of the slot being counted.
    boundary: u64,
    row: SlotRow,
    /// Shadow would-rejects counted by the engine up to the last closed slot.
    shadow_seen: u64,
    rows: Vec<SlotRow>,
}

impl<'e> Recorder<'e> {
    fn new(engine: &'e Engine, route: RouteId, slot_ns: u64, slots: u64) -> Self {
        Recorder {
            engine,
            route,
            slot_ns,
            boundary: slot_ns,
            row: SlotRow::empty(0.0),
            shadow_seen: 0,
            rows: Vec::with_capacity(usize::try_from(slots).unwrap_or(0)),
        }
    }

    #[inline]
    fn arrive(&mut self, t: Nanos) {
        while t.as_u64() >= self.boundary {
            self.close();
        }
        self.row.offered += 1;
        match self.engine.check(self.route, Key::None, t) {
            Decision::Admit(_) => self.row.admitted += 1,
            Decision::Reject(r) => self.row.rejected.add(r.reason),
        }
    }

    /// Snapshots the engine at the slot's end (before any later arrival is decided)
    /// and starts the next slot.
    #[cold]
    fn close(&mut self) {
        let snap = self
            .engine
            .route_snapshot(self.route, Nanos::new(self.boundary));
        let shadow: u64 = snap.shadow_rejected.iter().map(|(_, n)| n).sum();
        let next = SlotRow::empty(Nanos::new(self.boundary).as_secs_f64());
        let row = std::mem::replace(&mut self.row, next);
        self.rows.push(SlotRow {
            shadow_rejected: shadow - self.shadow_seen,
            roc: snap.roc,
            limit_rps: snap.limit_rps,
            state: snap.state,
            level: snap.level.value,
            level_capacity: snap.level.capacity,
            ..row
        });
        self.shadow_seen = shadow;
        self.boundary = self.boundary.saturating_add(self.slot_ns);
    }

    fn finish(mut self, slots: u64) -> Vec<SlotRow> {
        while (self.rows.len() as u64) < slots {
            self.close();
        }
        self.rows
    }
}

/// Requests counted by rejection reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReasonCounts {
    /// `limit`: the absolute limit was exhausted.
    pub limit: u64,
    /// `roc_cut`: the limit was exhausted while cut by the controller.
    pub roc_cut: u64,
    /// `concurrency`: too many in flight.
    pub concurrency: u64,
    /// `queue_full`: the queue was full.
    pub queue_full: u64,
    /// `fallback_local`: rejected by the local fallback limiter.
    pub fallback_local: u64,
}

impl ReasonCounts {
    fn from_pairs(pairs: &[(Reason, u64)]) -> Self {
        let mut counts = ReasonCounts::default();
        for &(reason, n) in pairs {
            *counts.slot(reason) += n;
        }
        counts
    }

    #[inline]
    fn add(&mut self, reason: Reason) {
        *self.slot(reason) += 1;
    }

    #[inline]
    fn slot(&mut self, reason: Reason) -> &mut u64 {
        match reason {
            Reason::Limit => &mut self.limit,
            Reason::RocCut => &mut self.roc_cut,
            Reason::Concurrency => &mut self.concurrency,
            Reason::QueueFull => &mut self.queue_full,
            Reason::FallbackLocal => &mut self.fallback_local,
        }
    }

    /// Every reason with its count, in the order of [`Reason::ALL`].
    pub fn iter(&self) -> impl Iterator<Item = (Reason, u64)> {
        let counts = [
            self.limit,
            self.roc_cut,
            self.concurrency,
            self.queue_full,
            self.fallback_local,
        ];
        Reason::ALL.into_iter().zip(counts)
    }

    /// All reasons together.
    pub fn total(&self) -> u64 {
        self.iter().map(|(_, n)| n).sum()
    }
}

/// A controller state change, in simulation time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TransitionRecord {
    /// When the change took effect, seconds since the start.
    pub t_s: f64,
    /// State left.
    #[serde(serialize_with = "state_name")]
    pub from: ControllerState,
    /// State entered.
    #[serde(serialize_with = "state_name")]
    pub to: ControllerState,
    /// ROC of the sample that caused it.
    pub roc: f64,
    /// The limit after the change, req/s.
    pub limit_rps: f64,
}

impl From<&Transition> for TransitionRecord {
    fn from(t: &Transition) -> Self {
        TransitionRecord {
            t_s: t.at.as_secs_f64(),
            from: t.from,
            to: t.to,
            roc: t.roc,
            limit_rps: t.limit_rps,
        }
    }
}

/// One slot of the time series (see the module doc for each column).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SlotRow {
    /// Start of the slot, seconds since the start.
    pub t_s: f64,
    /// Requests that arrived in the slot.
    pub offered: u64,
    /// Of those, admitted.
    pub admitted: u64,
    /// Of those, rejected, by reason.
    pub rejected: ReasonCounts,
    /// Shadow modes: admitted but would have been rejected.
    pub shadow_rejected: u64,
    /// ROC of the last sample the controller saw when the slot began.
    pub roc: f64,
    /// The limit in force during the slot, req/s.
    pub limit_rps: f64,
    /// The controller's state during the slot.
    #[serde(serialize_with = "state_name")]
    pub state: ControllerState,
    /// The limiter's level at the end of the slot (tokens left, for a token bucket).
    pub level: f64,
    /// The most `level` can be.
    pub level_capacity: f64,
}

impl SlotRow {
    fn empty(t_s: f64) -> Self {
        SlotRow {
            t_s,
            offered: 0,
            admitted: 0,
            rejected: ReasonCounts::default(),
            shadow_rejected: 0,
            roc: 0.0,
            limit_rps: 0.0,
            state: ControllerState::Normal,
            level: 0.0,
            level_capacity: 0.0,
        }
    }
}

/// What a run did, in a few numbers (see the module doc for each field).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// The route driven.
    pub route: String,
    /// Its mode.
    #[serde(serialize_with = "mode_name")]
    pub mode: Mode,
    /// Wall-clock time of the start, Unix seconds.
    pub start_unix_s: f64,
    /// Length of the run, seconds.
    pub duration_s: f64,
    /// Length of one slot, seconds.
    pub slot_s: f64,
    /// Requests offered.
    pub offered: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests rejected, all reasons.
    pub rejected: u64,
    /// Requests rejected, by reason.
    pub rejected_by_reason: ReasonCounts,
    /// Shadow modes: requests admitted that would have been rejected.
    pub shadow_rejected: u64,
    /// Shadow would-rejects, by reason.
    pub shadow_rejected_by_reason: ReasonCounts,
    /// Every transition into `cut`.
    pub cuts: Vec<TransitionRecord>,
    /// Time of the first cut, seconds since the start.
    pub first_cut_s: Option<f64>,
    /// Total time in `cut`, seconds.
    pub time_in_cut_s: f64,
    /// Every state change.
    pub transitions: Vec<TransitionRecord>,
    /// Most requests admitted in any 1 s (whole slots, sliding).
    pub peak_admitted_1s: u64,
    /// Start of that busiest second, seconds since the start.
    pub peak_admitted_1s_at_s: f64,
    /// Most requests offered in any 1 s.
    pub peak_offered_1s: u64,
}

/// The outcome of a run: a summary and the per-slot time series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimResult {
    /// The run in a few numbers.
    pub summary: Summary,
    /// One row per slot, from time zero.
    pub series: Vec<SlotRow>,
}

impl SimResult {
    /// The header line of [`SimResult::write_csv`], without the line break.
    pub const CSV_HEADER: &'static str = "t_s,offered,admitted,rejected,rejected_limit,\
        rejected_roc_cut,rejected_concurrency,rejected_queue_full,rejected_fallback_local,\
        shadow_rejected,roc,limit_rps,state,level,level_capacity";

    /// Writes the time series as CSV: the header, then one line per slot.
    pub fn write_csv(&self, mut out: impl io::Write) -> io::Result<()> {
        writeln!(out, "{}", Self::CSV_HEADER)?;
        for r in &self.series {
            let x = &r.rejected;
            writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                r.t_s,
                r.offered,
                r.admitted,
                x.total(),
                x.limit,
                x.roc_cut,
                x.concurrency,
                x.queue_full,
                x.fallback_local,
                r.shadow_rejected,
                r.roc,
                r.limit_rps,
                r.state,
                r.level,
                r.level_capacity,
            )?;
        }
        out.flush()
    }
}

fn state_name<S: Serializer>(state: &ControllerState, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.as_str())
}

fn mode_name<S: Serializer>(mode: &Mode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(mode.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_errors_name_the_line() {
        let err = |text: &str| Profile::parse_csv(text).unwrap_err();
        assert_eq!(
            err("# profile\nt,rate\n0,10\n\n5,abc\n"),
            ProfileError::NotANumber {
                line: 5,
                field: "rate",
                text: "abc".into()
            }
        );
        assert_eq!(err("0,10\n1,-1\n").line(), Some(2));
        assert!(matches!(
            err("0,10\n1,2,3\n"),
            ProfileError::Fields { line: 2, fields: 3 }
        ));
        assert!(matches!(
            err("0,1\n5,1\n4,1\n"),
            ProfileError::TimeNotIncreasing { line: 3, .. }
        ));
        assert!(matches!(
            err("0,1\n1,inf\n"),
            ProfileError::NotANumber { line: 2, .. }
        ));
        // A header is only taken on the first line with content, and only without numbers.
        assert!(matches!(
            err("0,1\nt,rate\n"),
            ProfileError::NotANumber { line: 2, .. }
        ));
        assert!(matches!(
            err("1O,40\n2,40\n"),
            ProfileError::NotANumber { line: 1, .. }
        ));
        assert_eq!(
            err("t,rate\n0,1\n"),
            ProfileError::TooFewPoints { points: 1 }
        );
        assert_eq!(err("3,1\n3,5\n"), ProfileError::NoDuration { t: 3.0 });
        let msg = err("0,1\n\n2,x\n").to_string();
        assert!(msg.starts_with("line 3:"), "{msg}");
    }

    #[test]
    fn csv_accepts_comments_steps_and_crlf() {
        let p = Profile::parse_csv("t_seconds , rate\r\n10, 4 # warm\r\n20,4\r\n20,8\r\n30,8\r\n")
            .unwrap();
        assert_eq!(p.start_s(), 10.0);
        assert_eq!(p.duration(), Duration::from_secs(20));
        assert_eq!(p.rate_at(9.999), 4.0);
        assert_eq!(p.rate_at(10.0), 8.0); // a step takes the later point
        assert_eq!(p.expected_arrivals(), 120.0);
    }

    #[test]
    fn uniform_arrivals_follow_the_integral() {
        let p = Profile::from_points(&[(0.0, 0.0), (10.0, 20.0)]).unwrap();
        let times: Vec<f64> = p
            .arrivals(ArrivalModel::Uniform)
            .map(Nanos::as_secs_f64)
            .collect();
        assert_eq!(times.len(), 100);
        // Rate t·2: the integral is t², so arrival k is at √(k − ½).
        for (k, t) in times.iter().enumerate() {
            let expected = (k as f64 + 0.5).sqrt();
            assert!(
                (t - expected).abs() < 1e-6,
                "arrival {k} at {t}, expected {expected}"
            );
        }
        let down = Profile::from_points(&[(0.0, 20.0), (10.0, 0.0)]).unwrap();
        let times: Vec<Nanos> = down.arrivals(ArrivalModel::Uniform).collect();
        assert_eq!(times.len(), 100);
        assert!(times.windows(2).all(|w| w[0] < w[1]));
        assert!(*times.last().unwrap() < Nanos::from_secs(10));
    }

    #[test]
    fn poisson_arrivals_have_the_profile_mean() {
        let p = Scenario::FlashSale.profile();
        for seed in 0..3 {
            let mut arrivals = p.arrivals(ArrivalModel::Poisson { seed });
            let n = arrivals.by_ref().count() as f64;
            // 16,400 expected, standard deviation 128.
            assert!((n - 16_400.0).abs() < 5.0 * 128.0, "seed {seed}: {n}");
            assert_eq!(arrivals.next(), None);
        }
        let spike = p
            .arrivals(ArrivalModel::Poisson { seed: 9 })
            .filter(|t| (Nanos::from_secs(20)..Nanos::from_secs(40)).contains(t))
            .count() as f64;
        assert!((spike - 12_000.0).abs() < 5.0 * 110.0, "{spike}");
    }

    #[test]
    fn scenarios_parse_by_name() {
        for s in Scenario::ALL {
            assert_eq!(s.name().parse::<Scenario>(), Ok(s));
            assert_eq!(Profile::from_points(&s.profile().points), Ok(s.profile()));
            assert!(s.profile().duration() >= Duration::from_secs(45));
        }
        let err = "flashsale".parse::<Scenario>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown scenario `flashsale`; known scenarios: steady, warmup, flash-sale, bot-burst, double-spike"
        );
    }

    #[test]
    fn peak_slides_over_whole_rows() {
        let rows: Vec<SlotRow> = [1u64, 5, 5, 1, 9]
            .iter()
            .enumerate()
            .map(|(i, &n)| SlotRow {
                admitted: n,
                ..SlotRow::empty(i as f64)
            })
            .collect();
        assert_eq!(peak(&rows, 2, |r| r.admitted), (10, 1));
        assert_eq!(peak(&rows, 10, |r| r.admitted), (21, 0));
        assert_eq!(peak(&[], 10, |r| r.admitted), (0, 0));
    }
}
