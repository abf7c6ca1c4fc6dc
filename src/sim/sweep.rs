//! Parameter sweeps: the same traffic replayed under a grid of route parameter values,
//! one run per point of the grid, on every core; each run reduced to a [`SweepRow`].
//!
//! A parameter is written `NAME=START..END:STEP` (both ends included) or
//! `NAME=V1,V2,…`, where `NAME` is a route parameter as written in the config file,
//! optionally prefixed by a route (`order.danger_roc`) to change that route only;
//! otherwise the value applies to every route of the run. Durations are in seconds.
//! Several parameters make a grid of every combination (the first one varies slowest),
//! at most [`MAX_RUNS`] runs, offering at most [`MAX_SWEEP_ARRIVALS`] requests in all
//! ([`Sweep::check_arrivals`]). A scheduled event's profile keeps the fields its table
//! sets and takes the others from the point, as through a runtime change. Every point
//! is checked by the config file's own rules, events and tiers included, before
//! anything runs.
//!
//! ```
//! use rocgate::config::{Config, RouteConfig, RouteMatch};
//! use rocgate::sim::{ArrivalModel, Scenario, Simulator, Sweep};
//!
//! let config = Config::new(vec![RouteConfig::new("order", RouteMatch::prefix("/"))]);
//! let sim = Simulator::new(config, None).unwrap().capacity(250);
//! let sweep = Sweep::new(vec!["danger_roc=40..160:40".parse().unwrap()]).unwrap();
//! let profile = Scenario::FlashSale.profile();
//! let rows = sweep
//!     .run(&sim, 2, |sim| sim.run_profile_all(&profile, ArrivalModel::Uniform))
//!     .unwrap();
//! assert_eq!(rows.iter().map(|r| r.values[0]).collect::<Vec<_>>(), [40.0, 80.0, 120.0, 160.0]);
//! // A higher danger threshold cuts later: less rejected, more overload.
//! assert!(rows[0].summary.first_cut_s <= rows[3].summary.first_cut_s);
//! assert!(rows[0].summary.overload <= rows[3].summary.overload);
//! ```
//!
//! # `sweep.csv`
//!
//! Written by [`write_csv`]: one row per run, in grid order.
//!
//! | column | meaning |
//! |---|---|
//! | one per parameter, named as written (`danger_roc`, `order.hold`) | the value of the run |
//! | `offered`, `admitted`, `rejected` | requests, all routes of the run together |
//! | `rejected_pct` | rejected, % of offered (3 decimals) |
//! | `shadow_rejected` | shadow modes: admitted but would have been rejected (in `shadow_adaptive`, by the cut, besides `rejected`) |
//! | `cut_count` | cuts, all routes |
//! | `first_cut_s` | the earliest cut, seconds since the start (empty: none) |
//! | `time_in_cut_s` | time in cut, summed over routes |
//! | `peak_admitted_1s` | most requests admitted in any 1 s, all routes together |
//! | `overload` | admitted requests above the capacity (0 without one) |
//! | `overload_pct` | overload, % of offered (3 decimals) |
//! | `overload_s` | whole seconds in which more than the capacity was admitted |

use super::run::{count_of, csv_field, RunSummary, SimError, SimRun, Simulator};
use crate::config::{figure, patch_controller, RouteConfig};
use crate::limiter::Algorithm;
use crate::window::WindowSpec;
use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The most runs one sweep may make.
pub const MAX_RUNS: usize = 400;

/// The most requests one sweep may offer over all its runs: ten runs at the bound of
/// one ([`MAX_ARRIVALS`](super::MAX_ARRIVALS)). At about 110 ns a request (`cargo bench
/// --bench sim`), under twenty minutes of one core; [`MAX_RUNS`] runs at the bound of
/// one were 400 × 10^9 requests, half a day.
pub const MAX_SWEEP_ARRIVALS: f64 = 1e10;

/// What a parameter's values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// A number ≥ 0.
    Number,
    /// Any number: a ROC threshold (a falling demand has a negative ROC).
    Signed,
    /// A whole number ≥ 0.
    Whole,
    /// A duration in seconds.
    Seconds,
}

/// The parameters a sweep can vary, as the config file names them.
const PARAMS: [(&str, Unit); 15] = [
    ("base_limit", Unit::Number),
    ("cut_limit", Unit::Number),
    ("danger_roc", Unit::Signed),
    ("safe_roc", Unit::Signed),
    ("hold", Unit::Seconds),
    ("restore_step", Unit::Number),
    ("restore_interval", Unit::Seconds),
    ("min_rps", Unit::Number),
    ("min_samples", Unit::Whole),
    ("min_dwell", Unit::Seconds),
    ("max_cut", Unit::Seconds),
    ("window", Unit::Seconds),
    ("slot", Unit::Seconds),
    ("burst", Unit::Seconds),
    ("queue", Unit::Whole),
];

/// The names of the parameters a sweep can vary.
pub fn parameter_names() -> impl Iterator<Item = &'static str> {
    PARAMS.iter().map(|(name, _)| *name)
}

/// Why a sweep cannot run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// The text is not `NAME=START..END:STEP` or `NAME=V1,V2,…`.
    #[error("`{}`: {}; expected NAME=START..END:STEP or NAME=V1,V2,…", shown(.spec), shown(.problem))]
    Syntax {
        /// The parameter as written.
        spec: String,
        /// What is wrong.
        problem: String,
    },
    /// No route parameter has this name.
    #[error("`{}`: unknown parameter `{}`; parameters: {}", shown(.spec), shown(.name), parameter_names().collect::<Vec<_>>().join(", "))]
    UnknownParameter {
        /// The parameter as written.
        spec: String,
        /// The name asked for.
        name: String,
    },
    /// The same parameter is given twice.
    #[error("`{}` is swept twice{}", shown(.name), written.as_ref().map_or_else(String::new, |(a, b)| format!(" (as `{}` and `{}`)", shown(a), shown(b))))]
    Duplicate {
        /// The parameter.
        name: String,
        /// The two flags' names for it, where they differ (`hold` and `order.hold`).
        written: Option<(String, String)>,
    },
    /// The grid has too many points.
    #[error("{} = {} runs, more than {MAX_RUNS}", shown(&counts.join(" × ")), runs_text(*.runs))]
    TooManyRuns {
        /// Values per parameter, as `name (n)`.
        counts: Vec<String>,
        /// Runs the grid would make, [`u128::MAX`] for a count past it.
        runs: u128,
    },
    /// The runs would offer more than [`MAX_SWEEP_ARRIVALS`] requests in all.
    #[error(
        "{runs} runs × {} requests = {} requests, more than {MAX_SWEEP_ARRIVALS:.0} in all",
        count_of(*.per_run),
        count_of(*.runs as f64 * *.per_run)
    )]
    TooManyArrivals {
        /// Runs the grid makes.
        runs: usize,
        /// Requests each run offers.
        per_run: f64,
    },
    /// A parameter names a route the run does not drive.
    #[error("`{}`: route `{}` is not one of the routes run: {}", shown(.spec), shown(.route), run.join(", "))]
    UnknownRoute {
        /// The parameter as written.
        spec: String,
        /// The route named.
        route: String,
        /// The routes run.
        run: Vec<String>,
    },
    /// A point of the grid is not a valid configuration.
    #[error("at {point}: route `{route}`: {problem}")]
    Invalid {
        /// The point, as `name=value, …`.
        point: String,
        /// The route it makes invalid.
        route: String,
        /// Why.
        problem: String,
    },
    /// A run failed.
    #[error("at {point}: {error}")]
    Run {
        /// The point, as `name=value, …`.
        point: String,
        /// Why.
        error: SimError,
    },
}

/// One swept parameter: its name, the route it is limited to, and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepParam {
    /// As written (`danger_roc`, `order.hold`): the column's name.
    pub label: String,
    /// The route it changes; every route of the run when `None`.
    pub route: Option<String>,
    /// The parameter, as the config file names it.
    pub name: String,
    /// The values, in order.
    pub values: Vec<f64>,
    unit: Unit,
}

impl FromStr for SweepParam {
    type Err = SweepError;

    /// Parses `[route.]NAME=START..END:STEP` or `[route.]NAME=V1,V2,…`.
    ///
    /// ```
    /// use rocgate::sim::SweepParam;
    ///
    /// let p: SweepParam = "danger_roc=40..160:20".parse().unwrap();
    /// assert_eq!(p.values, [40.0, 60.0, 80.0, 100.0, 120.0, 140.0, 160.0]);
    /// let p: SweepParam = "order.hold=0.5,1,2".parse().unwrap();
    /// assert_eq!((p.route.as_deref(), p.name.as_str()), (Some("order"), "hold"));
    /// let e = "danger_roc=160..40:20".parse::<SweepParam>().unwrap_err().to_string();
    /// assert_eq!(e, "`danger_roc=160..40:20`: the end 40 is below the start 160; expected NAME=START..END:STEP or NAME=V1,V2,…");
    /// ```
    fn from_str(spec: &str) -> Result<Self, SweepError> {
        let syntax = |problem: String| SweepError::Syntax {
            spec: spec.to_owned(),
            problem,
        };
        let (label, values) = spec
            .split_once('=')
            .ok_or_else(|| syntax("no `=`".into()))?;
        let label = label.trim();
        let (route, name) = match label.rsplit_once('.') {
            Some((route, name)) if !route.is_empty() => (Some(route.to_owned()), name),
            _ => (None, label),
        };
        let unit = PARAMS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, unit)| unit)
            .ok_or_else(|| SweepError::UnknownParameter {
                spec: spec.to_owned(),
                name: name.to_owned(),
            })?;
        let num = |text: &str, what: &str| -> Result<f64, SweepError> {
            match text.trim().parse::<f64>() {
                Ok(x) if x.is_finite() => Ok(x),
                _ => Err(syntax(format!("{what} `{}` is not a number", text.trim()))),
            }
        };
        let values = match values.split_once("..") {
            Some((start, rest)) => {
                let (end, step) = rest
                    .split_once(':')
                    .ok_or_else(|| syntax("a range needs a step, `:STEP`".into()))?;
                let exact = whole_count(start, end, step);
                let (start, end, step) =
                    (num(start, "start")?, num(end, "end")?, num(step, "step")?);
                if step <= 0.0 {
                    return Err(syntax(format!(
                        "the step must be above 0, got {}",
                        figure(step)
                    )));
                }
                if end < start {
                    return Err(syntax(format!(
                        "the end {} is below the start {}",
                        figure(end),
                        figure(start)
                    )));
                }
                let steps = ((end - start) / step + 1e-9).floor();
                if steps >= MAX_RUNS as f64 {
                    // Past u128 (or infinite), the count saturates.
                    let runs = exact.unwrap_or((steps as u128).saturating_add(1));
                    return Err(SweepError::TooManyRuns {
                        counts: vec![format!("{label} ({})", runs_text(runs))],
                        runs,
                    });
                }
                (0..=steps as u64)
                    .map(|i| tidy(start + i as f64 * step))
                    .collect()
            }
            None => values
                .split(',')
                .map(|v| num(v, "value"))
                .collect::<Result<Vec<f64>, _>>()?,
        };
        for &v in &values {
            let fits = match unit {
                Unit::Signed => true,
                Unit::Number | Unit::Seconds => v >= 0.0,
                Unit::Whole => v >= 0.0 && v.fract() == 0.0 && v <= f64::from(u32::MAX),
            };
            if !fits {
                let kind = match unit {
                    Unit::Whole => "a whole number ≥ 0",
                    Unit::Number => "a number ≥ 0",
                    Unit::Signed => "a finite number",
                    Unit::Seconds => "a number of seconds ≥ 0",
                };
                return Err(syntax(format!("{name} must be {kind}, got {}", figure(v))));
            }
        }
        Ok(SweepParam {
            label: label.to_owned(),
            route,
            name: name.to_owned(),
            values,
            unit,
        })
    }
}

/// The count of values of the range `start..end:step` written as whole numbers, exact
/// (a float holds every whole number only up to 2^53: `0..18446744073709551615:1` was
/// counted 18446744073709551617); `None` for other numbers, or a count past `u128`.
fn whole_count(start: &str, end: &str, step: &str) -> Option<u128> {
    let [start, end, step] = [start, end, step].map(|t| t.trim().parse::<i128>().ok());
    let span = u128::try_from(end?.checked_sub(start?)?).ok()?;
    let step = u128::try_from(step?).ok().filter(|&s| s > 0)?;
    (span / step).checked_add(1)
}

/// `x` without the float noise of repeated steps (`0.30000000000000004` → `0.3`).
fn tidy(x: f64) -> f64 {
    let scaled = (x * 1e9).round() / 1e9;
    if (scaled - x).abs() < 1e-6 {
        scaled
    } else {
        x
    }
}

/// A grid of parameter values to run the same traffic under.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep {
    params: Vec<SweepParam>,
}

/// The columns of `sweep.csv` after the parameters' ([`Sweep::csv_header`]).
pub const CSV_COLUMNS: [&str; 12] = [
    "offered",
    "admitted",
    "rejected",
    "rejected_pct",
    "shadow_rejected",
    "cut_count",
    "first_cut_s",
    "time_in_cut_s",
    "peak_admitted_1s",
    "overload",
    "overload_pct",
    "overload_s",
];

/// Text from a `--sweep` flag as an error quotes it: its control characters escaped
/// (`\u{1b}`), which went to the terminal to act on.
fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    crate::config::escaped(text, char::is_control)
}

/// A count of runs as an error words it: [`u128::MAX`] stands for every count past it,
/// not for itself.
fn runs_text(runs: u128) -> String {
    if runs == u128::MAX {
        format!("more than {:.1e}", u128::MAX as f64)
    } else {
        runs.to_string()
    }
}

/// One run of a sweep: its point of the grid and what it did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SweepRow {
    /// One value per parameter, in the order of the sweep's parameters.
    pub values: Vec<f64>,
    /// The run over all its routes.
    pub summary: RunSummary,
}

impl SweepRow {
    /// Rejected, % of offered.
    pub fn rejected_pct(&self) -> f64 {
        percent(self.summary.rejected, self.summary.offered)
    }

    /// Counted as rejected but admitted (`shadow`, `shadow_adaptive`), % of offered.
    pub fn shadow_rejected_pct(&self) -> f64 {
        percent(self.summary.shadow_rejected, self.summary.offered)
    }

    /// Overload, % of offered.
    pub fn overload_pct(&self) -> f64 {
        percent(self.summary.overload, self.summary.offered)
    }
}

fn percent(n: u64, of: u64) -> f64 {
    100.0 * n as f64 / of.max(1) as f64
}

impl Sweep {
    /// A sweep over the grid of these parameters, at most [`MAX_RUNS`] runs, each
    /// parameter (and route) given once, each with at least one value. Without
    /// parameters, one run of the configuration as it is.
    pub fn new(params: Vec<SweepParam>) -> Result<Self, SweepError> {
        for (i, p) in params.iter().enumerate() {
            if p.values.is_empty() {
                return Err(SweepError::Syntax {
                    spec: p.label.clone(),
                    problem: "no values".into(),
                });
            }
            let clash = params[..i].iter().find(|q| {
                q.name == p.name && (q.route.is_none() || p.route.is_none() || q.route == p.route)
            });
            if let Some(q) = clash {
                let (name, written) = if q.label == p.label {
                    (p.label.clone(), None)
                } else {
                    (p.name.to_string(), Some((q.label.clone(), p.label.clone())))
                };
                return Err(SweepError::Duplicate { name, written });
            }
        }
        // Saturated: the product of many parameters' counts passes u128.
        let runs = params
            .iter()
            .fold(1u128, |runs, p| runs.saturating_mul(p.values.len() as u128));
        if runs > MAX_RUNS as u128 {
            return Err(SweepError::TooManyRuns {
                counts: params
                    .iter()
                    .map(|p| format!("{} ({})", p.label, p.values.len()))
                    .collect(),
                runs,
            });
        }
        Ok(Sweep { params })
    }

    /// Refuses a sweep whose runs, each offering `per_run` requests (a profile's
    /// [`expected_arrivals`](super::Profile::expected_arrivals), an access log's
    /// [`len`](super::AccessLog::len)), would offer more than [`MAX_SWEEP_ARRIVALS`] in
    /// all. [`Sweep::run`], which is not given the traffic, does not check it.
    pub fn check_arrivals(&self, per_run: f64) -> Result<(), SweepError> {
        let runs = self.runs();
        if runs as f64 * per_run > MAX_SWEEP_ARRIVALS {
            return Err(SweepError::TooManyArrivals { runs, per_run });
        }
        Ok(())
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[SweepParam] {
        &self.params
    }

    /// The number of runs: the size of the grid.
    pub fn runs(&self) -> usize {
        self.params.iter().map(|p| p.values.len()).product()
    }

    /// Point `i` of the grid (the first parameter varies slowest).
    fn point(&self, mut i: usize) -> Vec<f64> {
        let mut values = vec![0.0; self.params.len()];
        for (slot, p) in values.iter_mut().zip(&self.params).rev() {
            *slot = p.values[i % p.values.len()];
            i /= p.values.len();
        }
        values
    }

    /// `name=value, …` for a point.
    fn describe(&self, values: &[f64]) -> String {
        self.params
            .iter()
            .zip(values)
            .map(|(p, v)| format!("{}={}", p.label, figure(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// One simulator per point of the grid, every point checked before any runs.
    pub fn simulators(&self, base: &Simulator) -> Result<Vec<(Vec<f64>, Simulator)>, SweepError> {
        let names: Vec<String> = base
            .routes()
            .iter()
            .filter_map(|&r| base.config().routes.get(r))
            .map(|r| r.name.clone())
            .collect();
        for p in &self.params {
            if let Some(route) = &p.route {
                if !names.contains(route) {
                    return Err(SweepError::UnknownRoute {
                        spec: p.label.clone(),
                        route: route.clone(),
                        run: names,
                    });
                }
            }
        }
        (0..self.runs())
            .map(|i| {
                let values = self.point(i);
                let mut config = base.config().clone();
                for &id in base.routes() {
                    let Some(route) = config.routes.get_mut(id) else {
                        continue;
                    };
                    let changes: Vec<(&SweepParam, f64)> = self
                        .params
                        .iter()
                        .zip(&values)
                        .filter(|(p, _)| p.route.as_ref().is_none_or(|r| *r == route.name))
                        .map(|(p, &v)| (p, v))
                        .collect();
                    // The point's values, its events' profiles moved onto them (each
                    // keeps the fields it sets, as through a runtime change), then the
                    // route whole as the file's rules see it.
                    let file = route.controller.clone();
                    apply(route, &changes)
                        .and_then(|()| {
                            for e in &mut route.events {
                                e.controller = e.profile_on(&file, &route.controller);
                            }
                            crate::config::check_route(route).map_err(|problems| {
                                let problems: Vec<String> =
                                    problems.iter().map(ToString::to_string).collect();
                                problems.join("; ")
                            })
                        })
                        .map_err(|problem| SweepError::Invalid {
                            point: self.describe(&values),
                            route: route.name.clone(),
                            problem,
                        })?;
                }
                // A sweep's rows show no rejections without cuts: not counted.
                Ok((values, base.with_config(config).count_without_cuts(false)))
            })
            .collect()
    }

    /// Runs `run` once per point of the grid on up to `threads` threads, and reduces
    /// each run to a [`SweepRow`], in grid order whatever the threads.
    pub fn run<F>(
        &self,
        base: &Simulator,
        threads: usize,
        run: F,
    ) -> Result<Vec<SweepRow>, SweepError>
    where
        F: Fn(&Simulator) -> Result<SimRun, SimError> + Sync,
    {
        let sims = self.simulators(base)?;
        let next = AtomicUsize::new(0);
        let rows: Mutex<Vec<Option<Result<SweepRow, SweepError>>>> =
            Mutex::new(vec![None; sims.len()]);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((values, sim)) = sims.get(i) else {
                return;
            };
            let row = run(sim)
                .map(|r| SweepRow {
                    values: values.clone(),
                    summary: r.summary,
                })
                .map_err(|error| SweepError::Run {
                    point: self.describe(values),
                    error,
                });
            rows.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)[i] = Some(row);
        };
        std::thread::scope(|s| {
            for _ in 1..threads.clamp(1, sims.len().max(1)) {
                s.spawn(work);
            }
            work();
        });
        rows.into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .into_iter()
            .flatten()
            .collect()
    }

    /// The header line of [`write_csv`], without the line break.
    pub fn csv_header(&self) -> String {
        let mut header: Vec<String> = self
            .params
            .iter()
            .map(|p| csv_field(&p.label).into_owned())
            .collect();
        header.extend(CSV_COLUMNS.map(String::from));
        header.join(",")
    }
}

/// Writes the rows of a sweep as CSV: the header, then one line per run, each swept
/// value as the table prints it ([`figure`]: `1e308`, not a 1 and 308 zeros), which
/// reads back as the value run.
pub fn write_csv(sweep: &Sweep, rows: &[SweepRow], mut out: impl io::Write) -> io::Result<()> {
    writeln!(out, "{}", sweep.csv_header())?;
    for row in rows {
        let s = &row.summary;
        for v in &row.values {
            write!(out, "{},", figure(*v))?;
        }
        writeln!(
            out,
            "{},{},{},{:.3},{},{},{},{},{},{},{:.3},{}",
            s.offered,
            s.admitted,
            s.rejected,
            row.rejected_pct(),
            s.shadow_rejected,
            s.cut_count,
            s.first_cut_s.map(|t| t.to_string()).unwrap_or_default(),
            s.time_in_cut_s,
            s.peak_admitted_1s,
            s.overload,
            row.overload_pct(),
            s.overload_s,
        )?;
    }
    out.flush()
}

/// A duration of `secs` seconds (already checked ≥ 0 and finite).
fn seconds(secs: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(secs)
        .map_err(|e| format!("{} s is not a duration: {e}", figure(secs)))
}

/// Applies one point's values to a route, checked as the config file would be.
fn apply(route: &mut RouteConfig, changes: &[(&SweepParam, f64)]) -> Result<(), String> {
    let mut patch = serde_json::Map::new();
    // Window and slot are checked together, once both are set: each alone may not
    // divide the other's value in force (0.5 s with 100 ms slots) where the pair does.
    let (mut window, mut slot) = (None, None);
    for &(p, v) in changes {
        match p.name.as_str() {
            "window" => window = Some(seconds(v)?),
            "slot" => slot = Some(seconds(v)?),
            "burst" => match &mut route.algorithm {
                Algorithm::TokenBucket { burst } if v > 0.0 => {
                    *burst = crate::config::check_burst(seconds(v)?)
                        .map_err(|e| format!("burst: {e}"))?;
                }
                Algorithm::TokenBucket { .. } => {
                    return Err(format!(
                        "burst: must be longer than zero, got {}",
                        figure(v)
                    ))
                }
                other => {
                    return Err(format!(
                        "burst applies to token_bucket, not {}",
                        other.name()
                    ))
                }
            },
            "queue" => match &mut route.algorithm {
                Algorithm::LeakyBucket { queue } | Algorithm::Concurrency { queue } => {
                    *queue = v as u32;
                }
                other => {
                    return Err(format!(
                        "queue applies to leaky_bucket and concurrency, not {}",
                        other.name()
                    ))
                }
            },
            name => {
                let value = match p.unit {
                    Unit::Seconds => {
                        serde_json::Value::from(format!("{}ns", seconds(v)?.as_nanos()))
                    }
                    Unit::Whole => serde_json::Value::from(v as u64),
                    Unit::Number | Unit::Signed => serde_json::Value::from(v),
                };
                patch.insert(name.to_owned(), value);
            }
        }
    }
    if window.is_some() || slot.is_some() {
        let names: Vec<&str> = changes
            .iter()
            .map(|(p, _)| p.name.as_str())
            .filter(|n| matches!(*n, "window" | "slot"))
            .collect();
        route.window = WindowSpec::new(
            window.unwrap_or(route.window.window()),
            slot.unwrap_or(route.window.slot()),
        )
        .map_err(|e| format!("{}: {e}", names.join(" and ")))?;
    }
    if !patch.is_empty() {
        let json = serde_json::Value::Object(patch).to_string();
        route.controller = patch_controller(&route.controller, &route.algorithm, &json, "--sweep")
            .map_err(|e| {
                e.problems()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text from the flag is quoted with its control characters escaped: an escape
    /// sequence in a parameter's name, route or value went to the terminal to act on.
    #[test]
    fn an_error_quotes_the_flag_escaped() {
        for spec in [
            "x\u{1b}[2Jy=1",
            "hold=1\u{1b}[2J",
            "hold",
            "o\u{1b}r.hold=0..1e9:1",
        ] {
            let e = spec.parse::<SweepParam>().unwrap_err().to_string();
            assert!(!e.contains('\u{1b}'), "{spec:?}: {e}");
        }
        let e = "x\u{1b}[2Jy=1"
            .parse::<SweepParam>()
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("`x\\u{1b}[2Jy=1`: unknown parameter `x\\u{1b}[2Jy`"),
            "{e}"
        );
        let e = SweepError::UnknownRoute {
            spec: "o\u{1b}r.hold=1".into(),
            route: "o\u{1b}r".into(),
            run: vec!["order".into()],
        };
        assert_eq!(
            e.to_string(),
            "`o\\u{1b}r.hold=1`: route `o\\u{1b}r` is not one of the routes run: order"
        );
    }

    /// A parameter swept twice under a route name as written, control characters and
    /// all: the message wrote the flags raw (an escape sequence reached the terminal),
    /// where every other sweep error escapes them.
    #[test]
    fn a_parameter_swept_twice_is_named_escaped() {
        for (flags, message) in [
            (
                ["hold=1", "o\u{1b}[2Jr.hold=3"],
                "`hold` is swept twice (as `hold` and `o\\u{1b}[2Jr.hold`)",
            ),
            (
                ["o\u{1b}r.hold=1", "o\u{1b}r.hold=3"],
                "`o\\u{1b}r.hold` is swept twice",
            ),
        ] {
            let params = flags.iter().map(|f| f.parse().unwrap()).collect();
            let e = Sweep::new(params).unwrap_err().to_string();
            assert_eq!(e, message, "{flags:?}");
        }
    }

    #[test]
    fn steps_do_not_accumulate_float_noise() {
        let p: SweepParam = "hold=0.1..0.5:0.1".parse().unwrap();
        assert_eq!(p.values, [0.1, 0.2, 0.3, 0.4, 0.5]);
        // The end is reached even when (end − start) / step is a hair below a whole number.
        let p: SweepParam = "min_rps=0..0.3:0.1".parse().unwrap();
        assert_eq!(p.values.len(), 4);
    }

    #[test]
    fn a_range_of_more_runs_than_any_count_is_refused_with_its_count() {
        // Its count of steps is past u128, or infinite: it saturates (an overflow
        // once, which counted it as 0 runs or panicked).
        for (range, runs) in [
            ("danger_roc=0..1e39:1", u128::MAX),
            ("danger_roc=0..1e300:1e-300", u128::MAX),
            ("danger_roc=0..1000:1", 1001),
            // Written as whole numbers, counted exactly: 2^64 values, where the count
            // read in floats was 2^64 + 1 (and 2^53 + 3 for 2^53 + 2).
            ("danger_roc=0..18446744073709551615:1", 1 << 64),
            ("danger_roc=1..18446744073709551616:1", 1 << 64),
            ("danger_roc=0..9007199254740993:1", (1 << 53) + 2),
            ("danger_roc=-5..+18446744073709551615:2", (1 << 63) + 3),
        ] {
            let e = range.parse::<SweepParam>().unwrap_err();
            assert!(
                matches!(e, SweepError::TooManyRuns { runs: r, .. } if r == runs),
                "{range}: {e}"
            );
        }
    }

    /// The runs' requests are bounded in all, at the bound and one past it, and a
    /// count past any a person writes out is said in scientific notation.
    #[test]
    fn the_requests_of_all_runs_are_bounded() {
        let sweep = Sweep::new(vec!["hold=1..100:1".parse().unwrap()]).unwrap();
        assert_eq!(sweep.check_arrivals(MAX_SWEEP_ARRIVALS / 100.0), Ok(()));
        assert_eq!(sweep.check_arrivals(0.0), Ok(()));
        let e = sweep.check_arrivals(1e8 + 1.0).unwrap_err();
        assert_eq!(
            e.to_string(),
            "100 runs × 100000001 requests = 10000000100 requests, more than 10000000000 in all"
        );
        let e = sweep.check_arrivals(1e300).unwrap_err().to_string();
        assert!(
            e.starts_with("100 runs × 1.00e300 requests = 1.00e302 requests"),
            "{e}"
        );
        // One run is held by the bound of one, ten times lower.
        let one = Sweep::new(Vec::new()).unwrap();
        assert_eq!(one.check_arrivals(super::super::MAX_ARRIVALS), Ok(()));
    }

    /// A grid of more points than u128 holds is refused, its count saturated: the
    /// product overflowed, panicking in a debug build and wrapping in a release one,
    /// where 512^14 × 4 points (2^128) made "0 run(s)" and an empty table, exit 0.
    #[test]
    fn a_grid_past_any_count_is_refused_not_wrapped() {
        // The event's numeric settings a sweep varies (not `route_limit`) and three of
        // the route's own: 14 parameters.
        let names = crate::config::EVENT_SETTINGS
            .iter()
            .filter(|&&n| !matches!(n, "roc_mode" | "route_limit"))
            .chain(&["burst", "queue", "window"]);
        let many: Vec<String> = (1..=512).map(|v| v.to_string()).collect();
        let mut params: Vec<SweepParam> = names
            .map(|n| format!("{n}={}", many.join(",")).parse().unwrap())
            .collect();
        params.push("slot=0.1,0.2,0.3,0.4".parse().unwrap());
        let e = Sweep::new(params).map(|s| s.runs()).unwrap_err();
        assert!(
            matches!(e, SweepError::TooManyRuns { runs, .. } if runs == u128::MAX),
            "{e}"
        );
        // Said as a bound, not as the count u128::MAX is.
        assert!(
            e.to_string()
                .ends_with("slot (4) = more than 3.4e38 runs, more than 400"),
            "{e}"
        );
    }

    #[test]
    fn the_grid_varies_the_first_parameter_slowest() {
        let sweep = Sweep::new(vec![
            "danger_roc=1,2".parse().unwrap(),
            "safe_roc=3,4,5".parse().unwrap(),
        ])
        .unwrap();
        let points: Vec<Vec<f64>> = (0..sweep.runs()).map(|i| sweep.point(i)).collect();
        assert_eq!(
            points,
            [
                [1.0, 3.0],
                [1.0, 4.0],
                [1.0, 5.0],
                [2.0, 3.0],
                [2.0, 4.0],
                [2.0, 5.0]
            ]
        );
    }

    #[test]
    fn roc_thresholds_may_be_negative_as_in_the_file() {
        // The file takes any finite danger_roc and safe_roc (a falling demand is a
        // negative ROC); a sweep over them must too.
        let p: SweepParam = "safe_roc=-20..0:10".parse().unwrap();
        assert_eq!(p.values, [-20.0, -10.0, 0.0]);
        let p: SweepParam = "danger_roc=-5,5".parse().unwrap();
        assert_eq!(p.values, [-5.0, 5.0]);
        let e = "hold=-1".parse::<SweepParam>().unwrap_err().to_string();
        assert!(
            e.contains("hold must be a number of seconds ≥ 0, got -1"),
            "{e}"
        );
    }

    #[test]
    fn routes_may_have_dots_in_their_names() {
        let p: SweepParam = "api.v2.order.danger_roc=50".parse().unwrap();
        assert_eq!(p.route.as_deref(), Some("api.v2.order"));
        assert_eq!(p.name, "danger_roc");
        assert_eq!(p.label, "api.v2.order.danger_roc");
    }

    #[test]
    fn window_and_slot_are_checked_together_whatever_their_order() {
        use crate::config::{Config, RouteConfig, RouteMatch};
        let config = Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let sim = Simulator::new(config, None).unwrap();
        // 0.5 s of 0.125 s slots is 4 slots; 0.5 s of the default 0.1 s slots is 5.
        for flags in [["window=0.5", "slot=0.125"], ["slot=0.125", "window=0.5"]] {
            let sweep = Sweep::new(flags.iter().map(|f| f.parse().unwrap()).collect()).unwrap();
            let sims = sweep
                .simulators(&sim)
                .unwrap_or_else(|e| panic!("{flags:?}: {e}"));
            let window = &sims[0].1.config().routes[0].window;
            assert_eq!(
                (window.window(), window.slot()),
                (Duration::from_millis(500), Duration::from_millis(125))
            );
        }
    }

    /// A point's value far from 1 is named with an exponent: `slot=1e-300` was
    /// named with 300 zeros.
    #[test]
    fn a_point_far_from_one_is_named_with_an_exponent() {
        use crate::config::{Config, RouteConfig, RouteMatch};
        let config = Config::new(vec![RouteConfig::new("r", RouteMatch::any())]);
        let sim = Simulator::new(config, None).unwrap();
        let sweep = Sweep::new(vec!["slot=1e-300".parse().unwrap()]).unwrap();
        let e = sweep.simulators(&sim).unwrap_err().to_string();
        assert!(e.starts_with("at slot=1e-300: route `r`: "), "{e}");
    }

    /// A refused value far from 1 is quoted with an exponent: `hold=-1e308`, a step
    /// of `-1e308` and a start of `1e308` were written in 309 digits.
    #[test]
    fn a_refused_value_far_from_one_is_quoted_with_an_exponent() {
        for (spec, says) in [
            (
                "hold=-1e308",
                "hold must be a number of seconds ≥ 0, got -1e308",
            ),
            ("hold=0..1:-1e308", "the step must be above 0, got -1e308"),
            ("hold=1e308..1:1", "the end 1 is below the start 1e308"),
            ("hold=1..-1e-300:1", "the end -1e-300 is below the start 1"),
            ("queue=1e300", "queue must be a whole number ≥ 0, got 1e300"),
        ] {
            let e = spec.parse::<SweepParam>().unwrap_err().to_string();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }

    #[test]
    fn a_concurrency_queue_is_refused_in_shadow_mode_as_in_the_file() {
        use crate::config::{Config, Mode, RouteConfig, RouteMatch};
        let mut route = RouteConfig::new("r", RouteMatch::any());
        route.mode = Mode::Shadow;
        route.algorithm = Algorithm::Concurrency { queue: 0 };
        let sim = Simulator::new(Config::new(vec![route]), None).unwrap();
        let sweep = |spec: &str| Sweep::new(vec![spec.parse().unwrap()]).unwrap();
        assert_eq!(sweep("queue=0").simulators(&sim).unwrap().len(), 1);
        let e = sweep("queue=0,5").simulators(&sim).unwrap_err().to_string();
        assert!(
            e.starts_with("at queue=5: route `r`: mode: shadow admits"),
            "{e}"
        );
    }

    /// A point reaches the fields a route's event leaves as the route's, and is held
    /// to the file's rules with the events beside it: a base limit under the cut limit
    /// an event sets is refused before anything runs, naming the point. The event kept
    /// the file's base limit whatever the point, and a point its cut limit refused was
    /// taken, the run failing on the engine's check with no word of the point.
    #[test]
    fn a_point_the_routes_events_refuse_is_refused_before_anything_runs() {
        use crate::config::Config;
        let text = "[[routes]]\nname = \"sale\"\npath_prefix = \"/\"\n\n\
                    [[routes.events]]\nname = \"flash\"\n\
                    start = \"1970-01-01T00:00:10Z\"\nduration = \"20s\"\ncut_limit = 150\n";
        let config = Config::from_toml_str(text, "sale.toml").unwrap();
        let sim = Simulator::new(config, None).unwrap();
        let sweep = |spec: &str| Sweep::new(vec![spec.parse().unwrap()]).unwrap();
        // The event keeps its cut limit and takes the point's base limit, which it
        // leaves as the route's (it kept the file's 200).
        let sims = sweep("base_limit=150,300").simulators(&sim).unwrap();
        let during: Vec<(f64, f64)> = sims
            .iter()
            .map(|(_, s)| {
                let c = &s.config().routes[0].events[0].controller;
                (c.base_limit_rps, c.cut_limit_rps)
            })
            .collect();
        assert_eq!(during, [(150.0, 150.0), (300.0, 150.0)]);
        let e = sweep("base_limit=300,100")
            .simulators(&sim)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "at base_limit=100: route `sale`: events[0].cut_limit: must be ≤ base_limit \
             (100), got 150"
        );
    }

    #[test]
    fn a_parameter_without_values_is_refused() {
        let mut p: SweepParam = "danger_roc=50".parse().unwrap();
        p.values.clear();
        let e = Sweep::new(vec![p]).unwrap_err().to_string();
        assert_eq!(
            e,
            "`danger_roc`: no values; expected NAME=START..END:STEP or NAME=V1,V2,…"
        );
        assert_eq!(Sweep::new(vec![]).unwrap().runs(), 1);
    }
}
