//! `rocgate simulate`: replays a built-in scenario or a CSV profile through the engine
//! on a virtual clock, prints a summary, and with `--out DIR` writes `DIR/summary.json`
//! and `DIR/timeseries.csv` (their fields are described in [`rocgate::sim`]).
//!
//! Bad input (an invalid config, an unknown route or scenario, a malformed profile, an
//! output directory that cannot be written) is reported on stderr, naming the file or
//! option at fault, with exit code 2, before anything runs.

use super::SimulateArgs;
use rocgate::config::Config;
use rocgate::sim::{ArrivalModel, Profile, Scenario, SimResult, Simulator, Summary};
use serde::Serialize;
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

/// Exit code for bad input.
const BAD_INPUT: u8 = 2;
/// Exit code for a failure after the run (an output file could not be written).
const FAILED: u8 = 1;
/// Transitions listed in the printed summary; the rest are counted.
const LISTED_TRANSITIONS: usize = 12;

/// What went wrong: the message for stderr and the exit code.
struct Failure {
    message: String,
    code: u8,
}

fn bad_input(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        code: BAD_INPUT,
    }
}

/// Runs the simulation the arguments describe.
pub(crate) fn run(args: SimulateArgs) -> ExitCode {
    match simulate(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("{}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Where the traffic came from, as written to `summary.json`.
#[derive(Serialize)]
struct SummaryFile<'a> {
    /// The built-in scenario, if one was run.
    scenario: Option<&'a str>,
    /// The CSV profile, if one was run.
    profile: Option<String>,
    /// The Poisson seed; `null` for evenly spaced arrivals.
    seed: Option<u64>,
    #[serde(flatten)]
    summary: &'a Summary,
}

/// The two output files, created before the run so that an unwritable directory is
/// reported before any work is done.
struct Outputs {
    summary: (PathBuf, BufWriter<File>),
    series: (PathBuf, BufWriter<File>),
}

impl Outputs {
    fn create(dir: &Path) -> Result<Self, Failure> {
        fs::create_dir_all(dir).map_err(|e| {
            bad_input(format!(
                "{}: cannot create the output directory: {e}",
                dir.display()
            ))
        })?;
        let open = |name: &str| {
            let path = dir.join(name);
            File::create(&path)
                .map(|f| (path.clone(), BufWriter::new(f)))
                .map_err(|e| bad_input(format!("{}: cannot write: {e}", path.display())))
        };
        Ok(Outputs {
            summary: open("summary.json")?,
            series: open("timeseries.csv")?,
        })
    }

    fn write(self, file: &SummaryFile<'_>, result: &SimResult) -> Result<(), Failure> {
        let failed = |path: &Path, e: io::Error| Failure {
            message: format!("{}: cannot write: {e}", path.display()),
            code: FAILED,
        };
        let (path, mut out) = self.summary;
        serde_json::to_writer_pretty(&mut out, file)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush())
            .map_err(|e| failed(&path, e))?;
        let (path, out) = self.series;
        result.write_csv(out).map_err(|e| failed(&path, e))
    }
}

fn simulate(args: &SimulateArgs) -> Result<(), Failure> {
    let config = match &args.config {
        Some(path) => Config::load(path).map_err(|e| bad_input(e.to_string()))?,
        None => Config::embedded_default(),
    };
    let (label, scenario, profile) = match (&args.scenario, &args.profile) {
        (Some(name), _) => {
            let s: Scenario = name
                .parse()
                .map_err(|e| bad_input(format!("--scenario: {e}")))?;
            (format!("scenario {}", s.name()), Some(s), s.profile())
        }
        (None, Some(path)) => (
            format!("profile {}", path.display()),
            None,
            read_profile(path)?,
        ),
        (None, None) => {
            let s = Scenario::FlashSale;
            (format!("scenario {}", s.name()), Some(s), s.profile())
        }
    };
    let mut sim = Simulator::new(config, args.route.as_deref())
        .map_err(|e| bad_input(format!("--route: {e}")))?;
    if let Some(at) = args.start {
        sim = sim.wall_start(at);
    }
    let outputs = args.out.as_deref().map(Outputs::create).transpose()?;

    let model = ArrivalModel::from_seed(args.seed);
    let result = sim
        .run_profile(&profile, model)
        .map_err(|e| bad_input(format!("{label}: {e}")))?;
    print!("{}", render(&result.summary, &label, model));

    if let Some(outputs) = outputs {
        let file = SummaryFile {
            scenario: scenario.map(Scenario::name),
            profile: args.profile.as_ref().map(|p| p.display().to_string()),
            seed: args.seed,
            summary: &result.summary,
        };
        let paths = [outputs.summary.0.clone(), outputs.series.0.clone()];
        outputs.write(&file, &result)?;
        println!(
            "wrote         {}, {}",
            paths[0].display(),
            paths[1].display()
        );
    }
    Ok(())
}

fn read_profile(path: &Path) -> Result<Profile, Failure> {
    let text = fs::read_to_string(path)
        .map_err(|e| bad_input(format!("{}: cannot read the profile: {e}", path.display())))?;
    Profile::parse_csv(&text).map_err(|e| bad_input(format!("{}: {e}", path.display())))
}

/// The summary as a short table.
fn render(s: &Summary, label: &str, model: ArrivalModel) -> String {
    let mut out = String::new();
    let pct = |n: u64| 100.0 * n as f64 / s.offered.max(1) as f64;
    // Writing to a String cannot fail.
    let mut line = |args: std::fmt::Arguments<'_>| {
        let _ = out.write_fmt(args);
        out.push('\n');
    };
    line(format_args!(
        "route         {} ({}), {label}, {model} arrivals",
        s.route,
        s.mode.as_str()
    ));
    line(format_args!(
        "start         t = 0 at {}; {:.1} s in slots of {} ms",
        wall_clock(s.start_unix_s),
        s.duration_s,
        s.slot_s * 1e3
    ));
    match s.first_cut_s {
        None => line(format_args!("cuts          none")),
        Some(first) => line(format_args!(
            "cuts          {}, first at {first:.3} s",
            s.cuts.len()
        )),
    }
    for t in s.transitions.iter().take(LISTED_TRANSITIONS) {
        line(format_args!(
            "  {:>9.3} s  {:<21} roc {:.1}, limit {} req/s",
            t.t_s,
            format!("{} → {}", t.from, t.to),
            t.roc,
            t.limit_rps
        ));
    }
    if s.transitions.len() > LISTED_TRANSITIONS {
        line(format_args!(
            "  … and {} more transitions",
            s.transitions.len() - LISTED_TRANSITIONS
        ));
    }
    line(format_args!("time in cut   {:.3} s", s.time_in_cut_s));
    line(format_args!("offered       {:>8}", s.offered));
    line(format_args!(
        "admitted      {:>8}  {:5.1}%",
        s.admitted,
        pct(s.admitted)
    ));
    line(format_args!(
        "rejected      {:>8}  {:5.1}%",
        s.rejected,
        pct(s.rejected)
    ));
    for (reason, n) in s.rejected_by_reason.iter().filter(|&(_, n)| n > 0) {
        line(format_args!(
            "  {:<12}{n:>8}  {:5.1}%",
            reason.as_str(),
            pct(n)
        ));
    }
    if s.shadow_rejected > 0 {
        line(format_args!(
            "would reject  {:>8}  {:5.1}%  (shadow)",
            s.shadow_rejected,
            pct(s.shadow_rejected)
        ));
        for (reason, n) in s.shadow_rejected_by_reason.iter().filter(|&(_, n)| n > 0) {
            line(format_args!(
                "  {:<12}{n:>8}  {:5.1}%",
                reason.as_str(),
                pct(n)
            ));
        }
    }
    line(format_args!(
        "peak admitted {:>8}  in 1 s from {:.1} s (offered peak {} in 1 s)",
        s.peak_admitted_1s, s.peak_admitted_1s_at_s, s.peak_offered_1s
    ));
    out
}

/// Unix seconds as RFC 3339 when they fall between 1970 and 9999, else as a number.
fn wall_clock(unix_s: f64) -> String {
    match Duration::try_from_secs_f64(unix_s) {
        Ok(d) if d.as_secs() < 253_402_300_800 => {
            humantime::format_rfc3339_millis(UNIX_EPOCH + d).to_string()
        }
        _ => format!("unix {unix_s} s"),
    }
}
