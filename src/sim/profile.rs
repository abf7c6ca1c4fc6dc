//! Traffic profiles: a piecewise-linear request rate ([`Profile`]), the built-in
//! [`Scenario`]s, and the arrival times a profile yields ([`Arrivals`]), evenly spaced
//! or Poisson.

use crate::clock::Nanos;
use crate::config::figure;
use crate::window::WindowSpec;
use rand::{RngCore, SeedableRng};
use rand_pcg::Pcg64Mcg;
use std::fmt;
use std::iter::FusedIterator;
use std::str::FromStr;
use std::time::Duration;

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

/// The latest time a profile's point may be at, in seconds: 10^12, where an `f64`
/// still holds a time to about a tenth of a millisecond.
pub const LATEST_TIME_S: f64 = 1e12;

/// Why a profile was refused. Line numbers are 1-based.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// A line does not hold exactly two comma-separated fields.
    #[error("line {line}: expected `t_seconds,rate`, found {fields} field(s)")]
    Fields {
        /// The line.
        line: usize,
        /// How many fields it holds.
        fields: usize,
    },
    /// The header names the rate first: the columns are read as `t_seconds,rate`
    /// whatever a header says, so the points would be read swapped.
    #[error("line {line}: the header names `{first}` first, but a profile's columns are `t_seconds,rate`: swap them")]
    SwappedHeader {
        /// The line.
        line: usize,
        /// The header's first field as written.
        first: String,
    },
    /// A field is not a finite number. The field is quoted with the characters that
    /// show as nothing (control characters, a byte order mark) escaped (`\0`,
    /// `\u{feff}`).
    #[error("line {line}: {field} is not a number: `{}`", shown(.text))]
    NotANumber {
        /// The line.
        line: usize,
        /// `t_seconds` or `rate`.
        field: &'static str,
        /// The field as written.
        text: String,
    },
    /// A rate is below zero.
    #[error("line {line}: rate must not be negative, got {}", figure(*.rate))]
    NegativeRate {
        /// The line.
        line: usize,
        /// The rate.
        rate: f64,
    },
    /// A time is below zero: a profile's times are seconds from its start, and its
    /// first is read as Unix seconds when no `--start` is given.
    #[error("line {line}: t_seconds must not be negative, got {}", figure(*.t))]
    NegativeTime {
        /// The line.
        line: usize,
        /// The time.
        t: f64,
    },
    /// A time is past [`LATEST_TIME_S`]: read as Unix seconds it is no date a clock
    /// holds, and a float that large no longer holds a slot's time.
    #[error("line {line}: t_seconds must be at most {LATEST_TIME_S:e} (the year 33658 read as Unix seconds), got {}", figure(*.t))]
    TimeTooLate {
        /// The line.
        line: usize,
        /// The time.
        t: f64,
    },
    /// A point's time is earlier than the previous point's.
    #[error("line {line}: t_seconds must increase, got {} after {}", figure(*.t), figure(*.previous))]
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
    #[error("a profile must span some time, but all its points are at t = {}", figure(*.t))]
    NoDuration {
        /// The time of every point.
        t: f64,
    },
    /// The last point is less than [`WindowSpec::SHORTEST_SLOT`] after the first: a
    /// run that short is shorter than any route's slot, and reports no slot of it (it
    /// ran for "0.0 s", with no hints).
    #[error("line {line}: a profile must span at least 1 ms (the shortest slot), but its last point is {span_s:e} s after its first")]
    SpanTooShort {
        /// The last point's line.
        line: usize,
        /// From the first point to the last, seconds.
        span_s: f64,
    },
}

impl ProfileError {
    /// The 1-based line the error is on, if it is about one line.
    pub fn line(&self) -> Option<usize> {
        match self {
            ProfileError::Fields { line, .. }
            | ProfileError::SwappedHeader { line, .. }
            | ProfileError::NotANumber { line, .. }
            | ProfileError::NegativeRate { line, .. }
            | ProfileError::NegativeTime { line, .. }
            | ProfileError::TimeTooLate { line, .. }
            | ProfileError::TimeNotIncreasing { line, .. }
            | ProfileError::SpanTooShort { line, .. } => Some(*line),
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
    /// so is a first line none of whose fields is or starts like a number, in quotes or
    /// not (a header, such as `t_seconds,rate`; one that names the rate first, `rate,t`,
    /// is refused: the columns are read by position): `0;40` and `"0","40"` are points
    /// written wrong, not headers. A
    /// byte order mark before the first line, as spreadsheets write, is skipped. A line
    /// ends with a line feed, a carriage return and a line feed, or a carriage return
    /// alone (old Mac programs, a spreadsheet's "CSV (Macintosh)" export), as CSV
    /// readers take them.
    pub fn parse_csv(text: &str) -> Result<Self, ProfileError> {
        let mut points = Vec::new();
        let mut seen_content = false;
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (i, raw) in csv_lines(text).enumerate() {
            let line = i + 1;
            let content = raw.split('#').next().unwrap_or_default().trim();
            if content.is_empty() {
                continue;
            }
            // Read as they come, not collected: a line of a million commas held 16 B a
            // field.
            let fields = || content.split(',').map(str::trim);
            // Judged inside quotes: `"0","40"` is a point written wrong, not a header.
            let is_header = !seen_content
                && fields().all(|f| {
                    let f = f.trim_start_matches(['"', '\'']);
                    f.parse::<f64>().is_err()
                        && !f.starts_with(|c: char| c.is_ascii_digit() || "+-.".contains(c))
                });
            seen_content = true;
            if is_header {
                // Read by position, a header `rate,t_seconds` had its points read
                // swapped ("all its points are at t = 40").
                let mut header = fields();
                let written = header.next().unwrap_or_default();
                let first = written.to_ascii_lowercase();
                if header.count() == 1 && (first.starts_with("rate") || first.starts_with("rps")) {
                    return Err(ProfileError::SwappedHeader {
                        line,
                        first: written.to_owned(),
                    });
                }
                continue;
            }
            let mut point = fields();
            let (Some(t), Some(rate), None) = (point.next(), point.next(), point.next()) else {
                return Err(ProfileError::Fields {
                    line,
                    fields: fields().count(),
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
        let mut last_line = 0;
        for (line, (t, rate)) in points {
            last_line = line;
            for (x, field) in [(t, "t_seconds"), (rate, "rate")] {
                if !x.is_finite() {
                    let text = x.to_string();
                    return Err(ProfileError::NotANumber { line, field, text });
                }
            }
            if t < 0.0 {
                return Err(ProfileError::NegativeTime { line, t });
            }
            if t > LATEST_TIME_S {
                return Err(ProfileError::TimeTooLate { line, t });
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
            // As the run takes the span: a duration, to the nanosecond.
            (Some(&(first, _)), Some(&(last, _)))
                if Duration::try_from_secs_f64(last - first)
                    .is_ok_and(|span| span < WindowSpec::SHORTEST_SLOT) =>
            {
                Err(ProfileError::SpanTooShort {
                    line: last_line,
                    span_s: last - first,
                })
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
                let ((t0, r0), (t1, r1)) = (w[0], w[1]);
                // A segment without width or without rate offers nothing, even where
                // the other factor is ∞ (rates that sum beyond f64::MAX, a span of
                // more seconds than f64 holds): ∞ × 0 would make the count NaN, which
                // no cap refuses. Halves first, so the sum of two rates stays finite.
                if t1 > t0 && (r0 > 0.0 || r1 > 0.0) {
                    area += (0.5 * r0 + 0.5 * r1) * (t1 - t0);
                }
                area
            }))
            .collect();
        Profile {
            start_s,
            points,
            cumulative,
        }
    }

    /// `t_seconds` of the first point (never negative): the profile's own time at the
    /// start of a run.
    pub fn start_s(&self) -> f64 {
        self.start_s
    }

    /// From the first point to the last.
    pub fn duration(&self) -> Duration {
        let end = self.points.last().map_or(0.0, |p| p.0);
        Duration::try_from_secs_f64(end).unwrap_or(Duration::MAX)
    }

    /// The same rates over a timeline stretched by `factor` (below 1: compressed):
    /// each point's time since the first is multiplied by `factor`. A factor that is
    /// not finite and above zero is refused like a bad point.
    ///
    /// ```
    /// use rocgate::sim::Scenario;
    ///
    /// let sale = Scenario::FlashSale.profile().time_scaled(0.5).unwrap();
    /// assert_eq!(sale.duration().as_secs(), 30);
    /// assert_eq!(sale.rate_at(9.9), 40.0);
    /// assert_eq!(sale.rate_at(10.0), 600.0);
    /// ```
    pub fn time_scaled(&self, factor: f64) -> Result<Profile, ProfileError> {
        let points: Vec<(f64, f64)> = self
            .points
            .iter()
            .map(|&(t, rate)| (self.start_s + t * factor, rate))
            .collect();
        Self::from_points(&points)
    }

    /// The rate `t_s` seconds after the first point, req/s (zero outside the profile).
    pub fn rate_at(&self, t_s: f64) -> f64 {
        let i = self.points.partition_point(|p| p.0 <= t_s);
        if i == 0 || i == self.points.len() {
            return 0.0;
        }
        let (t0, r0) = self.points[i - 1];
        let (t1, r1) = self.points[i];
        // The fraction of the segment first: the rate difference times the time
        // could overflow, a fraction of it cannot.
        r0 + (r1 - r0) * ((t_s - t0) / (t1 - t0))
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

/// The lines of `text`, each ended by `\n`, `\r\n` or a `\r` alone, without their
/// line break (as [`str::lines`], which takes `\r` alone for a part of the line).
fn csv_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest.find(['\n', '\r']).unwrap_or(rest.len());
        let (line, after) = rest.split_at(end);
        rest = after
            .strip_prefix("\r\n")
            .or_else(|| after.get(1..))
            .unwrap_or_default();
        Some(line)
    })
}

/// `text` with its characters that show as nothing escaped, as `{:?}` writes them,
/// the rest as written: a field quoted in an error that held a NUL or a second byte
/// order mark showed as a number.
fn shown(text: &str) -> std::borrow::Cow<'_, str> {
    crate::config::escaped(text, |c| c.is_control() || c == '\u{feff}')
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
#[non_exhaustive]
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
#[non_exhaustive]
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
#[error("unknown scenario `{}`; known scenarios: {}", shown(.name), Scenario::names().join(", "))]
#[non_exhaustive]
pub struct UnknownScenario {
    /// The name asked for (shown with its control characters escaped).
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_between_two_points_lies_between_their_rates() {
        // Found by fuzzing (fuzz/fuzz_targets/profile.rs): the rate difference times
        // the time since the first point overflowed to -inf before the division.
        let p = Profile::parse_csv("0,1e308\n80,2\n").unwrap();
        let r = p.rate_at(5.0);
        assert!((2.0..=1e308).contains(&r), "{r}");
        assert_eq!(p.rate_at(0.0), 1e308);
    }

    /// A field's characters that show as nothing (a NUL, a backspace, a second byte
    /// order mark) are quoted escaped: "rate is not a number: `20`" quoted a field that
    /// held `20` and a NUL, and read as a number refused.
    #[test]
    fn a_field_quoted_in_an_error_shows_what_does_not_print() {
        let said = |text: &str| Profile::parse_csv(text).unwrap_err().to_string();
        assert_eq!(
            said("0,10\n10,20\0\n"),
            "line 2: rate is not a number: `20\\0`"
        );
        assert_eq!(
            said("\u{feff}\u{feff}0,10\n10,20\n"),
            "line 1: t_seconds is not a number: `\\u{feff}0`"
        );
        assert_eq!(
            said("0,10\n1\u{8}0,20\n"),
            "line 2: t_seconds is not a number: `1\\u{8}0`"
        );
        // Text that prints is quoted as written.
        assert_eq!(
            said("0,10\n10,\"café\"\n"),
            "line 2: rate is not a number: `\"café\"`"
        );
    }

    /// A first line whose fields are numbers in quotes, as a CSV writer quoting every
    /// field writes them, is a point written wrong, not a header: it was skipped as
    /// one, and its point silently left out. A quoted header is still a header.
    #[test]
    fn a_first_line_of_quoted_numbers_is_no_header() {
        assert_eq!(
            Profile::parse_csv("\"0\",\"10\"\n10,20\n30,5\n").unwrap_err(),
            ProfileError::NotANumber {
                line: 1,
                field: "t_seconds",
                text: "\"0\"".into()
            }
        );
        let p = Profile::parse_csv("\"t_seconds\",\"rate\"\n0,10\n30,10\n").unwrap();
        assert_eq!(p.rate_at(0.0), 10.0);
    }

    /// A number far from 1 is quoted with an exponent: `1e300` was written out in
    /// full, a 1 and 300 zeros.
    #[test]
    fn a_number_far_from_one_is_written_with_an_exponent() {
        let said = |text: &str| Profile::parse_csv(text).unwrap_err().to_string();
        assert!(
            said("0,1\n1e300,5\n").ends_with("got 1e300"),
            "{}",
            said("0,1\n1e300,5\n")
        );
        assert_eq!(
            said("0,-1e300\n1,1\n"),
            "line 1: rate must not be negative, got -1e300"
        );
        assert_eq!(
            said("-1e300,1\n1,1\n"),
            "line 1: t_seconds must not be negative, got -1e300"
        );
        // Numbers near 1 as written.
        assert_eq!(
            said("0,-5\n1,1\n"),
            "line 1: rate must not be negative, got -5"
        );
    }

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
        // A header naming the rate first: read by position, the points were swapped.
        for header in ["rate,t_seconds", " RPS , t"] {
            assert_eq!(
                err(&format!("{header}\n0,40\n10,40\n")),
                ProfileError::SwappedHeader {
                    line: 1,
                    first: header.split(',').next().unwrap().trim().into()
                }
            );
        }
        assert_eq!(
            Profile::parse_csv("t,rate\n0,40\n10,40\n")
                .unwrap()
                .rate_at(5.0),
            40.0
        );
        // A header is only taken on the first line with content, and only without numbers.
        assert!(matches!(
            err("0,1\nt,rate\n"),
            ProfileError::NotANumber { line: 2, .. }
        ));
        assert!(matches!(
            err("1O,40\n2,40\n"),
            ProfileError::NotANumber { line: 1, .. }
        ));
        // Nor on a first line that starts like a number: a point written wrong.
        assert_eq!(
            err("0;40\n1;40\n"),
            ProfileError::Fields { line: 1, fields: 1 }
        );
        assert_eq!(
            err("t,rate\n0,1\n"),
            ProfileError::TooFewPoints { points: 1 }
        );
        assert_eq!(err("3,1\n3,5\n"), ProfileError::NoDuration { t: 3.0 });
        // A span shorter than any slot runs for no slot: "0.0 s", no hints.
        let short = err("0,10\n5e-324,10\n");
        assert_eq!(
            short,
            ProfileError::SpanTooShort {
                line: 2,
                span_s: 5e-324
            }
        );
        assert_eq!(short.line(), Some(2));
        assert_eq!(
            short.to_string(),
            "line 2: a profile must span at least 1 ms (the shortest slot), but its last point is 5e-324 s after its first"
        );
        assert!(matches!(
            err("7,10\n7.0005,0\n# end\n"),
            ProfileError::SpanTooShort { line: 2, .. }
        ));
        assert_eq!(
            Profile::parse_csv("0,10\n0.001,10\n").unwrap().duration(),
            Duration::from_millis(1)
        );
        // Read as Unix seconds, a time past 10^12 is no date (it started the run in
        // 1970), and its slots' times are no longer held to the millisecond.
        assert_eq!(
            err("1e19,10\n10000000000000010000,10\n"),
            ProfileError::TimeTooLate { line: 1, t: 1e19 }
        );
        assert_eq!(
            err("0,10\n1000000000001,10\n"),
            ProfileError::TimeTooLate {
                line: 2,
                t: 1_000_000_000_001.0
            }
        );
        assert!(Profile::parse_csv("0,10\n1000000000000,10\n").is_ok());
        let msg = err("0,1\n\n2,x\n").to_string();
        assert!(msg.starts_with("line 3:"), "{msg}");
    }

    #[test]
    fn csv_skips_a_byte_order_mark() {
        for text in ["\u{feff}0,10\n10,20\n", "\u{feff}t,rate\n0,10\n10,20\n"] {
            let p = Profile::parse_csv(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!((p.start_s(), p.rate_at(5.0)), (0.0, 15.0), "{text:?}");
        }
        // Only at the start of the text: anywhere else it is no number.
        assert!(matches!(
            Profile::parse_csv("0,10\n\u{feff}10,20\n"),
            Err(ProfileError::NotANumber { line: 2, .. })
        ));
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

    /// Lines that end in a carriage return alone, as old Mac programs and a
    /// spreadsheet's "CSV (Macintosh)" export write them, are lines: the whole file
    /// was one line, refused as "line 1: expected `t_seconds,rate`, found 5 field(s)".
    #[test]
    fn csv_takes_lines_ended_by_a_carriage_return_alone() {
        let p = Profile::parse_csv("t_seconds,rate\r0,10\r10,20\r\r20,20\r").unwrap();
        assert_eq!(
            (p.rate_at(5.0), p.duration()),
            (15.0, Duration::from_secs(20))
        );
        // Counted as lines, a blank one and each line break of a mixed file included.
        assert_eq!(
            Profile::parse_csv("0,10\r\n10,20\r\r20,x\n").unwrap_err(),
            ProfileError::NotANumber {
                line: 4,
                field: "rate",
                text: "x".into()
            }
        );
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

    /// A time far from 1 in a refusal is written with an exponent, as the others
    /// are: `t_seconds = 1e-300` after 5 was written in 300 digits.
    #[test]
    fn a_refused_time_is_quoted_compactly() {
        let e = Profile::parse_csv("0,1\n5,1\n1e-300,1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "line 3: t_seconds must increase, got 1e-300 after 5");
        let e = Profile::parse_csv("1e-300,1\n1e-300,1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "a profile must span some time, but all its points are at t = 1e-300"
        );
    }
}
