//! `rocgate simulate`: replays a built-in scenario, a CSV profile or access logs through
//! the engine on a virtual clock and prints a summary; with `--sweep`, runs the same
//! traffic once per parameter value and prints a table. With `--out DIR` it writes
//! `DIR/summary.json`, `DIR/timeseries.csv`, `DIR/chart.svg` and `DIR/chart.png`, or
//! with `--sweep`, `DIR/sweep.csv` (their fields are described in [`rocgate::sim`] and
//! [`rocgate::sim::sweep`]).
//!
//! Bad input (an invalid config, an unknown route or scenario, a malformed profile, a
//! log with too many unparsable lines, a bad sweep, an output directory that cannot be
//! written) is reported on stderr, naming the file, line or option at fault, with exit
//! code 2, before anything runs.

use super::SimulateArgs;
use super::{out, shown};
use rocgate::config::{figure, Config, Mode, Partition};
use rocgate::sim::access_log::{self, LogError};
use rocgate::sim::{
    chart, sweep, AccessLog, ArrivalModel, CutsOwn, LogOptions, LogReader, LogStats, Profile,
    ReasonCounts, RunSummary, Scenario, SimError, SimRun, Simulator, Spread, Summary, Sweep,
    SweepParam, SweepRow,
};
use serde::Serialize;
use std::fmt::Write as _;
use std::fs;
use std::io::{self, BufRead as _, BufWriter, Read as _, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tempfile::NamedTempFile;

/// Exit code for bad input.
const BAD_INPUT: u8 = 2;
/// Exit code for a failure after the run (an output file could not be written).
const FAILED: u8 = 1;
/// Transitions listed per route in the printed summary; the rest are counted.
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

/// `--sweep`: a swept parameter.
pub(crate) fn parse_sweep(text: &str) -> Result<SweepParam, String> {
    text.parse()
        .map_err(|e: rocgate::sim::SweepError| e.to_string())
}

/// `--seed`: a whole number from 0 to 18446744073709551615.
pub(crate) fn parse_seed(text: &str) -> Result<u64, String> {
    text.trim().parse().map_err(|_| {
        format!(
            "a seed is a whole number from 0 to {}, got {text:?}",
            u64::MAX
        )
    })
}

/// `--capacity`: a whole number of req/s, at least 1.
pub(crate) fn parse_capacity(text: &str) -> Result<u64, String> {
    text.trim().parse().ok().filter(|&c| c >= 1).ok_or_else(|| {
        format!(
            "a capacity is a whole number of req/s from 1 to {}, got {text:?}",
            u64::MAX
        )
    })
}

/// An RFC 3339 time in UTC: `Z`, an offset of zero, or none (read as UTC). Any other
/// offset is refused, naming it: humantime's weak parser, given one after a fraction
/// of a second (`19:00:00.0+01:00`), read the time as UTC and dropped the offset.
fn utc_rfc3339(text: &str) -> Result<SystemTime, String> {
    let text = text.trim();
    let time = text.get(10..).unwrap_or_default();
    let (body, offset) = match time.rfind(['+', '-']) {
        Some(i) => text.split_at(10 + i),
        None => (text, ""),
    };
    if !matches!(offset, "" | "+00:00" | "-00:00") {
        return Err(format!("the offset {offset} is not UTC"));
    }
    humantime::parse_rfc3339_weak(body).map_err(|e| e.to_string())
}

/// `--start`: an RFC 3339 UTC time.
pub(crate) fn parse_start(text: &str) -> Result<SystemTime, String> {
    utc_rfc3339(text).map_err(|e| {
        format!(
            "{e}: must be an RFC 3339 time in UTC from 1970 to 9999, such as 2026-11-27T19:00:00Z"
        )
    })
}

/// `--from`, `--to`: an RFC 3339 UTC time, or a time as an access log writes it.
pub(crate) fn parse_log_bound(text: &str) -> Result<SystemTime, String> {
    if let Ok(t) = utc_rfc3339(text) {
        return Ok(t);
    }
    access_log::parse_time(text.trim().as_bytes())
        .and_then(|s| {
            let offset = Duration::from_secs(s.unsigned_abs());
            if s >= 0 {
                UNIX_EPOCH.checked_add(offset)
            } else {
                UNIX_EPOCH.checked_sub(offset)
            }
        })
        .ok_or_else(|| {
            format!(
                "`{text}` is neither an RFC 3339 UTC time (2026-11-27T19:00:00Z) nor a time as logged (27/Nov/2026:20:00:00 +0100)"
            )
        })
}

/// The traffic to run. A log is boxed: what reading it found (its stats, the
/// examples they name) makes it several times a profile's size.
enum Traffic {
    Profile {
        scenario: Option<Scenario>,
        profile: Profile,
        model: ArrivalModel,
    },
    Log(Box<AccessLog>),
}

impl Traffic {
    fn run(&self, sim: &Simulator) -> Result<SimRun, SimError> {
        match self {
            Traffic::Profile { profile, model, .. } => sim.run_profile_all(profile, *model),
            Traffic::Log(log) => sim.replay(log),
        }
    }

    /// The requests a run offers: the profile's expected count, or the log's.
    fn requests(&self) -> f64 {
        match self {
            Traffic::Profile { profile, .. } => profile.expected_arrivals(),
            Traffic::Log(log) => log.len() as f64,
        }
    }
}

/// The input and the run, as written to `summary.json`.
#[derive(Serialize)]
struct SummaryFile<'a> {
    /// The built-in scenario, if one was run.
    scenario: Option<&'a str>,
    /// The CSV profile, if one was run.
    profile: Option<String>,
    /// The access logs, if replayed.
    access_logs: Option<Vec<String>>,
    /// The seed; `null` for evenly spaced arrivals.
    seed: Option<u64>,
    /// What reading the access logs found.
    log: Option<&'a LogStats>,
    #[serde(flatten)]
    summary: &'a RunSummary,
    routes: Vec<&'a Summary>,
    /// The tuning hints for the run.
    hints: &'a [rocgate::hints::Hint],
}

/// Writes one output file.
type Writer<'a> = Box<dyn FnOnce(&mut BufWriter<NamedTempFile>) -> io::Result<()> + 'a>;

/// The output files, opened before the run so that an unwritable directory, or a
/// directory where a file goes, is reported before any work is done. Each is written
/// under a temporary name beside its own (`.NAME.XXXXXX.partial`, removed when
/// dropped), and every one is renamed into place only once all are written: a run
/// refused or failing part-way leaves the last run's files as they were. Once they
/// are in place, the files an earlier run of the other kind wrote there
/// ([`earlier_run`], [`earlier_sweep`]) are removed: they would be read as this one's.
struct Outputs {
    files: Vec<Output>,
    /// The directory.
    dir: PathBuf,
    /// Finds the other kind of run's files in the directory, removed once these are in
    /// place.
    others: fn(&Path) -> Vec<PathBuf>,
    /// The directory, if this run created it: removed again (once the files above,
    /// dropped first, are gone) unless the run wrote its files there.
    created: CreatedDir,
}

/// A directory a run created for its output, removed when dropped if still armed and
/// empty: a run refused after it (too many slots) left an empty directory behind.
struct CreatedDir(Option<PathBuf>);

impl Drop for CreatedDir {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// One output file, while it is written.
struct Output {
    path: PathBuf,
    out: BufWriter<NamedTempFile>,
}

impl Outputs {
    fn create(
        dir: &Path,
        names: &[&str],
        others: fn(&Path) -> Vec<PathBuf>,
    ) -> Result<Self, Failure> {
        if dir.exists() && !dir.is_dir() {
            return Err(bad_input(format!(
                "{}: exists and is no directory, where the output files go",
                shown(dir)
            )));
        }
        // A link that leads nowhere, the directory or one on the way to it
        // (`dangling/run`): `create_dir_all` says "File exists" of it.
        let dangling = dir
            .ancestors()
            .take_while(|at| !at.as_os_str().is_empty() && !at.exists())
            .find_map(|at| fs::read_link(at).ok().map(|to| (at, to)));
        if let Some((link, to)) = dangling {
            return Err(bad_input(format!(
                "{}: is a symbolic link to {}, which leads to no directory (its target \
                 is missing, or the links loop)",
                shown(link),
                shown(&to)
            )));
        }
        let created = CreatedDir((!dir.exists()).then(|| dir.to_owned()));
        fs::create_dir_all(dir).map_err(|e| {
            bad_input(format!(
                "{}: cannot create the output directory: {e}",
                shown(dir)
            ))
        })?;
        let mut files = Vec::new();
        for name in names {
            let path = dir.join(name);
            if path.is_dir() {
                return Err(bad_input(format!(
                    "{}: is a directory, where the output file goes",
                    shown(&path)
                )));
            }
            let prefix = format!(".{name}.");
            let mut builder = tempfile::Builder::new();
            builder.prefix(&prefix).suffix(".partial");
            // Created as `File::create` creates, for everyone the umask lets read (a
            // temporary file's default is the owner alone).
            #[cfg(unix)]
            builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
            let file = builder
                .tempfile_in(dir)
                .map_err(|e| bad_input(format!("{}: cannot write: {e}", shown(&path))))?;
            files.push(Output {
                path,
                out: BufWriter::new(file),
            });
        }
        Ok(Outputs {
            files,
            dir: dir.to_owned(),
            others,
            created,
        })
    }

    /// Writes each file with its writer, in order, then puts them all in place, then
    /// removes the other kind of run's files; names both.
    fn write(self, writers: Vec<Writer<'_>>) -> Result<Written, Failure> {
        let failed = |path: &Path, e: io::Error| Failure {
            message: format!("{}: cannot write: {e}", shown(path)),
            code: FAILED,
        };
        let mut written = Vec::new();
        for (mut file, write) in self.files.into_iter().zip(writers) {
            write(&mut file.out).map_err(|e| failed(&file.path, e))?;
            let partial = file
                .out
                .into_inner()
                .map_err(|e| failed(&file.path, e.into_error()))?;
            written.push((partial, file.path));
        }
        let mut names = Vec::new();
        for (partial, path) in written {
            partial.persist(&path).map_err(|e| failed(&path, e.error))?;
            names.push(shown(&path));
        }
        let (mut removed, mut kept) = (Vec::new(), Vec::new());
        for path in (self.others)(&self.dir) {
            match fs::remove_file(&path) {
                Ok(()) => removed.push(shown(&path)),
                Err(e) => kept.push(format!("{}: {e}", shown(&path))),
            }
        }
        let mut created = self.created;
        created.0 = None;
        Ok(Written {
            names,
            removed,
            kept,
        })
    }
}

/// The files a run without `--sweep` writes into `--out`.
const RUN_FILES: [&str; 4] = ["summary.json", "timeseries.csv", "chart.svg", "chart.png"];
/// The files a sweep writes into `--out`.
const SWEEP_FILES: [&str; 1] = ["sweep.csv"];

/// The files of an earlier run without `--sweep` in `dir`: found by its `summary.json`,
/// a JSON object with `routes` and `hints` lists, and then its `timeseries.csv` (if
/// its header is a run's) and charts. Files of those names that are not (a
/// `summary.json` of the user's own in a directory used for other things) are left
/// alone, as is anything that is no regular file (a symbolic link, a directory).
fn earlier_run(dir: &Path) -> Vec<PathBuf> {
    let summary = dir.join("summary.json");
    let is_a_runs = regular(&summary)
        && fs::File::open(&summary)
            .ok()
            .and_then(|file| {
                serde_json::from_reader::<_, serde_json::Value>(io::BufReader::new(
                    file.take(MAX_SUMMARY_BYTES),
                ))
                .ok()
            })
            .is_some_and(|v| v["routes"].is_array() && v["hints"].is_array());
    if !is_a_runs {
        return Vec::new();
    }
    RUN_FILES
        .iter()
        .map(|name| dir.join(name))
        .filter(|path| {
            regular(path)
                && (!path.ends_with("timeseries.csv")
                    || first_line(path).is_some_and(|l| is_a_runs_header(&l)))
        })
        .collect()
}

/// Whether `line` is the header of a run's `timeseries.csv`: this version's, or an
/// earlier one's, written before its last column (`route_limit_rejected`) was added.
fn is_a_runs_header(line: &str) -> bool {
    line == SimRun::CSV_HEADER
        || SimRun::CSV_HEADER.strip_suffix(",route_limit_rejected") == Some(line)
}

/// The `sweep.csv` of an earlier sweep in `dir`, if its header ends with the columns a
/// sweep writes ([`sweep::CSV_COLUMNS`]); one of the user's own is left alone, as is
/// anything that is no regular file.
fn earlier_sweep(dir: &Path) -> Vec<PathBuf> {
    let path = dir.join("sweep.csv");
    let columns = format!(",{}", sweep::CSV_COLUMNS.join(","));
    let is_a_sweeps = regular(&path) && first_line(&path).is_some_and(|l| l.ends_with(&columns));
    is_a_sweeps.then_some(path).into_iter().collect()
}

/// The most of an earlier `summary.json` read to tell whether a run wrote it.
const MAX_SUMMARY_BYTES: u64 = 64 << 20;

/// Whether `path` is a regular file, not followed if a symbolic link.
fn regular(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_file())
}

/// The first line of the file at `path`, without its line break, if it is text within
/// 64 KiB.
fn first_line(path: &Path) -> Option<String> {
    let mut line = String::new();
    io::BufReader::new(fs::File::open(path).ok()?.take(64 << 10))
        .read_line(&mut line)
        .ok()?;
    line.strip_suffix('\n').map(str::to_owned)
}

/// What [`Outputs::write`] put in place, and the earlier run's files it removed.
struct Written {
    names: Vec<String>,
    removed: Vec<String>,
    /// The earlier run's files that could not be removed, each with the error.
    kept: Vec<String>,
}

impl Written {
    /// The lines the run prints about its files, and a warning for each earlier run's
    /// file it could not remove (this run's files are in place all the same).
    fn say(&self) {
        out!("wrote         {}\n", self.names.join(", "));
        if !self.removed.is_empty() {
            out!(
                "removed       {} (an earlier run's, of the other kind)\n",
                self.removed.join(", ")
            );
        }
        for kept in &self.kept {
            eprintln!("warning: cannot remove an earlier run's file, not this run's: {kept}");
        }
    }
}

fn simulate(args: &SimulateArgs) -> Result<(), Failure> {
    // clap requires an access log for these, but drops the requirement beside a flag
    // that conflicts with one (`--scenario`, `--profile`): the run ignored them.
    if args.access_logs.is_empty() {
        let log_only = [
            (args.from.is_some(), "--from"),
            (args.to.is_some(), "--to"),
            (args.lenient, "--lenient"),
        ];
        if let Some((_, flag)) = log_only.iter().find(|(set, _)| *set) {
            return Err(bad_input(format!(
                "{flag} applies to an access log (--access-log), and none is given"
            )));
        }
    }
    let config = match &args.config {
        Some(path) => Config::load(path),
        None => Config::embedded_default_with_env(),
    }
    .map_err(|e| bad_input(e.to_string()))?;
    let (traffic, label, routes) = if args.access_logs.is_empty() {
        profile_traffic(args, &config)?
    } else {
        log_traffic(args, &config)?
    };
    let mut sim =
        Simulator::for_routes(config, &routes).map_err(|e| bad_input(format!("--route: {e}")))?;
    if let Some(at) = args.start {
        sim = sim.wall_start(at);
    }
    if let Some(rps) = args.capacity {
        sim = sim.capacity(rps);
    }
    if args.sweeps.is_empty() {
        run_once(args, &sim, &traffic, &label)
    } else {
        run_sweep(args, &sim, &traffic, &label)
    }
}

/// A scenario or a CSV profile, on one route.
fn profile_traffic(
    args: &SimulateArgs,
    config: &Config,
) -> Result<(Traffic, String, Vec<String>), Failure> {
    let (label, scenario, profile) = match (&args.scenario, &args.profile) {
        (Some(name), _) => {
            let s: Scenario = name
                .parse()
                .map_err(|e| bad_input(format!("--scenario: {e}")))?;
            (format!("scenario {}", s.name()), Some(s), s.profile())
        }
        (None, Some(path)) => (
            format!("profile {}", shown(path)),
            None,
            read_profile(path)?,
        ),
        (None, None) => {
            let s = Scenario::FlashSale;
            (format!("scenario {}", s.name()), Some(s), s.profile())
        }
    };
    let route = match &args.routes[..] {
        [] => config
            .routes
            .first()
            .map(|r| r.name.clone())
            .ok_or_else(|| bad_input("--route: the configuration has no routes"))?,
        [one] => one.clone(),
        _ => {
            return Err(bad_input(
                "--route: a profile drives one route; several routes are for --access-log",
            ))
        }
    };
    if let Some(partition) = config
        .routes
        .iter()
        .find(|r| r.name == route)
        .and_then(|r| partitioned_by(&r.partition))
    {
        eprintln!(
            "note: route `{route}` is partitioned by {partition}; a profile's requests come from one keyless client, held to one key's limit"
        );
    }
    let model = ArrivalModel::from_seed(args.seed);
    let label = format!("{label}, {model} arrivals");
    let traffic = Traffic::Profile {
        scenario,
        profile,
        model,
    };
    Ok((traffic, label, vec![route]))
}

/// What a partitioned route is keyed by, as said in a note; `None` for a route
/// limited as a whole.
fn partitioned_by(partition: &Partition) -> Option<String> {
    match partition {
        Partition::Route => None,
        Partition::ClientIp(_) => Some("client IP".to_owned()),
        Partition::Header(header, _) => Some(format!("the header `{header}`")),
        _ => Some("its key".to_owned()),
    }
}

/// Access logs, on every route they reach (or the routes asked for).
fn log_traffic(
    args: &SimulateArgs,
    config: &Config,
) -> Result<(Traffic, String, Vec<String>), Failure> {
    let options = {
        let mut v = LogOptions::default();
        v.routes = args.routes.clone();
        v.from = args.from;
        v.to = args.to;
        v.spread = Spread::from_seed(args.seed);
        v.lenient = args.lenient;
        v
    };
    let mut reader = LogReader::new(config, options).map_err(|e| match e {
        LogError::EmptyBounds => bad_input("--from must be before --to"),
        LogError::Config(e) => bad_input(e.to_string()),
        e => bad_input(format!("--route: {e}")),
    })?;
    refuse_a_log_given_twice(&args.access_logs)?;
    let mut names = Vec::new();
    for path in &args.access_logs {
        let name = if path.as_os_str() == "-" {
            let input = access_log::sniffed(io::stdin())
                .map_err(|e| bad_input(format!("stdin: cannot read the access log: {e}")))?;
            reader
                .read("stdin", input)
                .map_err(|e| bad_input(e.to_string()))?;
            "stdin".to_owned()
        } else {
            let name = shown(path);
            let input = access_log::open(path)
                .map_err(|e| bad_input(format!("{name}: cannot read the access log: {e}")))?;
            reader
                .read(&name, input)
                .map_err(|e| bad_input(e.to_string()))?;
            name
        };
        names.push(name);
    }
    let log = reader.finish().map_err(|e| {
        bad_input(match e {
            LogError::TooManyUnparsable { .. } => {
                format!("{}: {e} (--lenient replays the rest)", names.join(", "))
            }
            LogError::TooLong { .. } => {
                format!("{}: {e}; replay a part with --from/--to", names.join(", "))
            }
            e => format!("{}: {e}", names.join(", ")),
        })
    })?;
    let stats = log.stats();
    if stats.unparsable > 0 {
        let first: Vec<String> = stats
            .first_unparsable
            .iter()
            .map(|b| b.to_string())
            .collect();
        eprintln!(
            "warning: {} unparsable line(s) skipped ({:.2}%): {}{}",
            stats.unparsable,
            100.0 * stats.unparsable_fraction(),
            first.join("; "),
            if stats.unparsable > first.len() as u64 {
                "; …"
            } else {
                ""
            }
        );
    }
    let routes: Vec<String> = log
        .routes()
        .iter()
        .filter_map(|&(id, _)| config.routes.get(id))
        .map(|r| r.name.clone())
        .collect();
    for route in config.routes.iter().filter(|r| routes.contains(&r.name)) {
        if let Partition::Header(header, _) = &route.partition {
            eprintln!(
                "note: route `{}` is partitioned by the header `{header}`, which access logs do not carry: its requests are replayed as one keyless client",
                route.name
            );
        }
    }
    if stats.no_address > 0 {
        eprintln!(
            "note: {} request{} on routes partitioned by client IP logged no IP address ({}{}): they are replayed as one keyless client, held to one key's limit",
            stats.no_address,
            if stats.no_address == 1 { "" } else { "s" },
            stats.no_address_examples.join(", "),
            if stats.no_address_examples.len() == access_log::EXAMPLES {
                ", …"
            } else {
                ""
            }
        );
    }
    let label = format!(
        "access log {} ({}), {}",
        names.join(", "),
        describe_log(stats),
        log.spread()
    );
    Ok((Traffic::Log(Box::new(log)), label, routes))
}

fn describe_log(s: &LogStats) -> String {
    let mut parts = vec![format!(
        "{} request{} replayed",
        s.replayed,
        if s.replayed == 1 { "" } else { "s" }
    )];
    let lines = if s.unparsable == 1 {
        "unparsable line"
    } else {
        "unparsable lines"
    };
    let others = if s.other_route_names.is_empty() {
        "on other routes".to_owned()
    } else {
        format!("on other routes ({})", s.other_route_names.join(", "))
    };
    for (n, what) in [
        (s.unmatched, "matching no route"),
        (s.other_routes, others.as_str()),
        (s.outside, "outside --from/--to"),
        (s.unparsable, lines),
    ] {
        if n > 0 {
            parts.push(format!("{n} {what}"));
        }
    }
    parts.join(", ")
}

/// Refuses an access log given twice, `-` or the same file by whatever path
/// (`a.log` and `./a.log`, a link to it): its requests were replayed twice, twice the
/// traffic logged, and a second `-` read nothing.
fn refuse_a_log_given_twice(paths: &[PathBuf]) -> Result<(), Failure> {
    let mut seen: Vec<(PathBuf, &PathBuf)> = Vec::new();
    for path in paths {
        let file = if path.as_os_str() == "-" {
            path.clone()
        } else {
            fs::canonicalize(path).unwrap_or_else(|_| path.clone())
        };
        if let Some((_, first)) = seen.iter().find(|(seen, _)| *seen == file) {
            return Err(bad_input(format!(
                "--access-log: {} is {} again: its requests would be replayed twice",
                shown(path),
                shown(first)
            )));
        }
        seen.push((file, path));
    }
    Ok(())
}

/// The longest profile read: a path to something endless (`/dev/zero`) or huge is
/// refused once this much is read, not read until memory runs out. A point every
/// 100 ms over the longest run a profile may make (27.7 hours) takes about 20 MB;
/// parsing holds about 70 B a point, so 32 MiB of the shortest points (`0,0`) take
/// about 600 MB.
const MAX_PROFILE_BYTES: u64 = 32 << 20;

fn read_profile(path: &Path) -> Result<Profile, Failure> {
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|file| file.take(MAX_PROFILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| bad_input(format!("{}: cannot read the profile: {e}", shown(path))))?;
    if bytes.len() as u64 > MAX_PROFILE_BYTES {
        return Err(bad_input(format!(
            "{}: longer than {} MiB: not a profile",
            shown(path),
            MAX_PROFILE_BYTES >> 20
        )));
    }
    let text = profile_text(&bytes);
    Profile::parse_csv(&text).map_err(|e| bad_input(format!("{}: {e}", shown(path))))
}

/// A profile file's text: UTF-16 after its byte order mark (as PowerShell's `>` and
/// `Out-File` write), else UTF-8, where bytes that are not (a Latin-1 comment) spoil
/// only the field holding them, which the parser then names with its line. Read as
/// UTF-8, UTF-16 put a NUL byte beside every digit: "line 2: t_seconds is not a
/// number" quoting a field that showed as ` 0 `.
fn profile_text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    let unit: fn([u8; 2]) -> u16 = match bytes {
        [0xFF, 0xFE, ..] => u16::from_le_bytes,
        [0xFE, 0xFF, ..] => u16::from_be_bytes,
        _ => return String::from_utf8_lossy(bytes),
    };
    let units = bytes[2..].chunks(2).map(|pair| match *pair {
        [a, b] => unit([a, b]),
        _ => 0xFFFD, // an odd last byte
    });
    char::decode_utf16(units)
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect::<String>()
        .into()
}

/// A run failed before it started: the error, with a hint for over-long logs.
fn run_failure(label: &str, traffic: &Traffic, e: SimError) -> Failure {
    let hint = match (&e, traffic) {
        (SimError::TooManySlots { routes: 1, .. }, Traffic::Log(_)) => {
            "; replay a part with --from/--to"
        }
        (SimError::TooManySlots { .. }, Traffic::Log(_)) => {
            "; replay a part with --from/--to, or fewer routes with --route"
        }
        _ => "",
    };
    bad_input(format!("{label}: {e}{hint}"))
}

fn run_once(
    args: &SimulateArgs,
    sim: &Simulator,
    traffic: &Traffic,
    label: &str,
) -> Result<(), Failure> {
    let outputs = args
        .out
        .as_deref()
        .map(|dir| Outputs::create(dir, &RUN_FILES, earlier_sweep))
        .transpose()?;
    let run = traffic
        .run(sim)
        .map_err(|e| run_failure(label, traffic, e))?;
    out!("{}", render(&run, label));
    let config = sim.config();
    let hints = rocgate::sim::hints::hints(&run, config, &config.hints.policy);
    out!("hints\n{}", rocgate::hints::table(&hints));
    if args.capacity.is_none() {
        out!("  (without --capacity the rules that need upstream health stay silent)\n");
    }

    let Some(outputs) = outputs else {
        return Ok(());
    };
    let (scenario, profile, logs, log) = match traffic {
        Traffic::Profile { scenario, .. } => (
            scenario.map(Scenario::name),
            args.profile.as_ref().map(|p| p.display().to_string()),
            None,
            None,
        ),
        Traffic::Log(log) => (
            None,
            None,
            Some(
                args.access_logs
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect(),
            ),
            Some(log.stats()),
        ),
    };
    let file = SummaryFile {
        scenario,
        profile,
        access_logs: logs,
        seed: args.seed,
        log,
        summary: &run.summary,
        routes: run.routes.iter().map(|r| &r.summary).collect(),
        hints: &hints,
    };
    let chart_failed = io::Error::other::<chart::ChartError>;
    outputs
        .write(vec![
            Box::new(|out| {
                serde_json::to_writer_pretty(&mut *out, &file).map_err(io::Error::from)?;
                writeln!(out)
            }),
            Box::new(|out| run.write_csv(out)),
            Box::new(|out| out.write_all(chart::svg(&run).map_err(chart_failed)?.as_bytes())),
            Box::new(|out| out.write_all(&chart::png(&run).map_err(chart_failed)?)),
        ])?
        .say();
    if run.routes.len() > chart::MAX_ROUTES {
        eprintln!(
            "note: the chart shows the first {} of {} routes",
            chart::MAX_ROUTES,
            run.routes.len()
        );
    }
    Ok(())
}

fn run_sweep(
    args: &SimulateArgs,
    sim: &Simulator,
    traffic: &Traffic,
    label: &str,
) -> Result<(), Failure> {
    let sweep = Sweep::new(args.sweeps.clone()).map_err(|e| bad_input(format!("--sweep: {e}")))?;
    // Check every point, and the requests of all the runs, before the output directory
    // is touched.
    sweep
        .check_arrivals(traffic.requests())
        .and_then(|()| sweep.simulators(sim))
        .map_err(|e| bad_input(format!("--sweep: {e}")))?;
    let outputs = args
        .out
        .as_deref()
        .map(|dir| Outputs::create(dir, &SWEEP_FILES, earlier_run))
        .transpose()?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows = sweep
        .run(sim, threads, |s| traffic.run(s))
        .map_err(|e| match e {
            rocgate::sim::SweepError::Run { point, error } => {
                run_failure(&format!("--sweep at {point}: {label}"), traffic, error)
            }
            e => bad_input(format!("--sweep: {e}")),
        })?;
    out!(
        "{}",
        render_sweep(&sweep, &rows, sim, label, threads.min(rows.len()))
    );
    if let Some(outputs) = outputs {
        outputs
            .write(vec![Box::new(|out| sweep::write_csv(&sweep, &rows, out))])?
            .say();
    }
    Ok(())
}

/// Appends one formatted line to `out` (writing to a `String` cannot fail).
fn line(out: &mut String, args: std::fmt::Arguments<'_>) {
    let _ = out.write_fmt(args);
    out.push('\n');
}

/// The run as a short report: the traffic, each route, and the totals.
fn render(run: &SimRun, label: &str) -> String {
    let mut out = String::new();
    let t = &run.summary;
    line(&mut out, format_args!("traffic       {label}"));
    line(
        &mut out,
        format_args!(
            "start         t = 0 at {}; {:.1} s",
            wall_clock(t.start_unix_s),
            t.duration_s
        ),
    );
    // With one route, the run's overload line (below) is the route's.
    let several = run.routes.len() > 1;
    for route in &run.routes {
        render_route(&mut out, &route.summary, several);
    }
    let pct = |n: u64| 100.0 * n as f64 / t.offered.max(1) as f64;
    if run.routes.len() > 1 {
        // Besides the rejections, those without cuts, when a route's line gave them.
        let without_cuts = t
            .rejected_without_cuts
            .filter(|_| {
                run.routes
                    .iter()
                    .any(|r| cuts_set_apart(&r.summary).is_some())
            })
            .map_or_else(String::new, |n| {
                format!(", {n} ({:.1}%) without cuts", pct(n))
            });
        line(
            &mut out,
            format_args!(
                "all routes    offered {}, admitted {} ({:.1}%), rejected {} ({:.1}%){without_cuts}, {} cut(s); peak admitted {} in 1 s from {} s",
                t.offered,
                t.admitted,
                pct(t.admitted),
                t.rejected,
                pct(t.rejected),
                t.cut_count,
                t.peak_admitted_1s,
                second_start(t.peak_admitted_1s_at_s)
            ),
        );
    }
    if let Some(rps) = t.capacity_rps {
        line(
            &mut out,
            format_args!(
                "overload      {:>8}  {:5.1}%  admitted above {rps} req/s, in {} s of {:.0}",
                t.overload,
                pct(t.overload),
                t.overload_s,
                t.duration_s.ceil()
            ),
        );
    }
    out
}

fn render_route(out: &mut String, s: &Summary, several: bool) {
    let pct = |n: u64| 100.0 * n as f64 / s.offered.max(1) as f64;
    line(
        out,
        format_args!(
            "route         {} ({}), slots of {} ms",
            s.route,
            s.mode.as_str(),
            s.slot_s * 1e3
        ),
    );
    match s.first_cut_s {
        None => line(out, format_args!("cuts          none")),
        Some(first) => line(
            out,
            format_args!("cuts          {}, first at {first:.3} s", s.cuts.len()),
        ),
    }
    for t in s.transitions.iter().take(LISTED_TRANSITIONS) {
        line(
            out,
            format_args!(
                "  {:>9.3} s  {:<21} roc {:.1}, limit {} req/s",
                t.t_s,
                format!("{} → {}", t.from, t.to),
                t.roc,
                t.limit_rps
            ),
        );
    }
    if s.transitions.len() > LISTED_TRANSITIONS {
        line(
            out,
            format_args!(
                "  … and {} more transitions",
                s.transitions.len() - LISTED_TRANSITIONS
            ),
        );
    }
    line(out, format_args!("time in cut   {:.3} s", s.time_in_cut_s));
    line(out, format_args!("offered       {:>8}", s.offered));
    line(
        out,
        format_args!("admitted      {:>8}  {:5.1}%", s.admitted, pct(s.admitted)),
    );
    line(
        out,
        format_args!("rejected      {:>8}  {:5.1}%", s.rejected, pct(s.rejected)),
    );
    let by_reason = |out: &mut String, counts: &ReasonCounts| {
        for (reason, n) in counts.iter().filter(|&(_, n)| n > 0) {
            line(
                out,
                format_args!("  {:<12}{n:>8}  {:5.1}%", reason.as_str(), pct(n)),
            );
        }
    };
    by_reason(out, &s.rejected_by_reason);
    if s.mode != Mode::Shadow {
        by_total(out, s);
    }
    if s.shadow_rejected > 0 {
        line(
            out,
            format_args!(
                "would reject  {:>8}  {:5.1}%  ({})",
                s.shadow_rejected,
                pct(s.shadow_rejected),
                if s.mode == Mode::ShadowAdaptive {
                    "shadow: by the cut, besides those rejected"
                } else {
                    "shadow"
                }
            ),
        );
        by_reason(out, &s.shadow_rejected_by_reason);
        if s.mode == Mode::Shadow {
            by_total(out, s);
        }
    }
    if let Some(without) = cuts_set_apart(s) {
        let own = CutsOwn::new(s.rejected, without, s.offered);
        line(
            out,
            format_args!(
                "without cuts  {without:>8}  {:5.1}%  rejected by the base limit alone; {} {}, {:.1}%",
                pct(without),
                own.label(),
                own.count,
                own.percent
            ),
        );
    }
    if let Some(net) = s.cut_own_net.filter(|_| !s.cuts.is_empty()) {
        line(
            out,
            format_args!(
                "cut's own net {net:>8}  {:5.1}%  live, as serve counts it (/admin/routes' cut_own_net)",
                100.0 * net as f64 / s.offered.max(1) as f64
            ),
        );
    }
    if several && s.overload > 0 {
        line(
            out,
            format_args!("overload      {:>8}  {:5.1}%", s.overload, pct(s.overload)),
        );
    }
    line(
        out,
        format_args!(
            "peak admitted {:>8}  in 1 s from {} s (offered peak {} in 1 s)",
            s.peak_admitted_1s,
            second_start(s.peak_admitted_1s_at_s),
            s.peak_offered_1s
        ),
    );
}

/// A partitioned route's line of the refusals its `route_limit` made (in `shadow`
/// mode, would have), which the lines by reason above count among `limit` or
/// `roc_cut`: said on a route with one that refused any.
fn by_total(out: &mut String, s: &Summary) {
    if let Some(n) = s.route_limit_rejected.filter(|&n| n > 0) {
        line(
            out,
            format_args!(
                "  of which    {n:>8}  {:5.1}%  by route_limit, the keys' total (not a key's own limit)",
                100.0 * n as f64 / s.offered.max(1) as f64
            ),
        );
    }
}

/// What an `enforce` route that cut rejects without its cuts, which its summary sets
/// apart from what it rejected; `None` for a route that never cut (the two are the
/// same), and for one that enforces no cut.
fn cuts_set_apart(s: &Summary) -> Option<u64> {
    s.rejected_without_cuts
        .filter(|_| s.mode == Mode::Enforce && !s.cuts.is_empty())
}

/// The sweep as a table, one line per run.
fn render_sweep(
    sweep: &Sweep,
    rows: &[SweepRow],
    sim: &Simulator,
    label: &str,
    threads: usize,
) -> String {
    let mut out = String::new();
    let routes: Vec<&str> = sim
        .routes()
        .iter()
        .filter_map(|&r| sim.config().routes.get(r))
        .map(|r| r.name.as_str())
        .collect();
    line(&mut out, format_args!("traffic       {label}"));
    line(
        &mut out,
        format_args!(
            "sweep         {} run(s) on {} thread(s), route(s) {}",
            rows.len(),
            threads,
            routes.join(", ")
        ),
    );
    let overload = sim_capacity(rows).is_some();
    let widths: Vec<usize> = sweep
        .params()
        .iter()
        .map(|p| p.label.len().max(8))
        .collect();
    let mut header = String::new();
    for (p, w) in sweep.params().iter().zip(&widths) {
        let _ = write!(header, "{:>w$}  ", p.label);
    }
    // A shadow route rejects nothing: what it would have rejected is what is tuned.
    let shadow = rows.iter().any(|r| r.summary.shadow_rejected > 0);
    header.push_str("rejected");
    if shadow {
        header.push_str("  would reject");
    }
    header.push_str("   cuts  first cut    in cut  peak 1 s");
    if overload {
        header.push_str("    overload");
    }
    line(&mut out, format_args!("{}", header.trim_end()));
    for row in rows {
        let s = &row.summary;
        let mut text = String::new();
        for (v, w) in row.values.iter().zip(&widths) {
            let _ = write!(text, "{:>w$}  ", figure(*v));
        }
        let first = s
            .first_cut_s
            .map_or_else(|| "-".to_owned(), |t| format!("{t:.1} s"));
        let _ = write!(text, "{:>7.1}%", row.rejected_pct());
        if shadow {
            let _ = write!(text, "  {:>11.1}%", row.shadow_rejected_pct());
        }
        let _ = write!(
            text,
            "  {:>5}  {:>9}  {:>6.1} s  {:>8}",
            s.cut_count, first, s.time_in_cut_s, s.peak_admitted_1s
        );
        if overload {
            let _ = write!(text, "  {:>9.1}%", row.overload_pct());
        }
        line(&mut out, format_args!("{text}"));
    }
    if shadow {
        line(
            &mut out,
            format_args!(
                "(would reject: admitted but counted rejected by a shadow mode, % of offered; \
                 on a shadow_adaptive route, by the cut, besides those rejected)"
            ),
        );
    }
    if let Some(rps) = sim_capacity(rows) {
        line(
            &mut out,
            format_args!("(overload: admitted above {rps} req/s, % of offered)"),
        );
    }
    out
}

fn sim_capacity(rows: &[SweepRow]) -> Option<u64> {
    rows.first().and_then(|r| r.summary.capacity_rps)
}

/// When a busiest second began, seconds since t = 0, to as many decimals as its step
/// takes (at least one, at most six): `39.9`, and `56.35` on the 50 ms step of 250 ms
/// slots, which one decimal rounded to a time the busiest second did not begin at.
fn second_start(s: f64) -> String {
    let text = format!("{s:.6}");
    let trimmed = text.trim_end_matches('0');
    if trimmed.ends_with('.') {
        format!("{trimmed}0")
    } else {
        trimmed.to_string()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rocgate::config::{RouteConfig, RouteMatch};

    /// The flash sale's summary of route `order` (which cuts) in `mode`.
    fn flash_sale(mode: Mode) -> Summary {
        let mut route = RouteConfig::new("order", RouteMatch::any());
        route.mode = mode;
        let sim = Simulator::new(Config::new(vec![route]), None).unwrap();
        let run = sim
            .run_profile(&Scenario::FlashSale.profile(), ArrivalModel::Uniform)
            .unwrap();
        run.summary
    }

    fn without_cuts_line(s: &Summary) -> Option<String> {
        let mut out = String::new();
        render_route(&mut out, s, false);
        out.lines()
            .find(|l| l.starts_with("without cuts"))
            .map(str::to_owned)
    }

    /// The table gives a busiest second's start to the step it slides by: from 0.25 s
    /// on 250 ms slots, not `0.2`, a second that began 50 ms before the busiest.
    #[test]
    fn a_busiest_second_is_printed_from_where_it_began() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nwindow = \"2s\"\n\
                    slot = \"250ms\"\nbase_limit = 1000\ncut_limit = 1000\n";
        let sim = Simulator::new(Config::from_toml_str(toml, "test").unwrap(), None).unwrap();
        let points = [
            (0.0, 0.0),
            (0.25, 0.0),
            (0.25, 400.0),
            (1.25, 400.0),
            (1.25, 0.0),
            (3.0, 0.0),
        ];
        let profile = Profile::from_points(&points).unwrap();
        let run = sim
            .run_profile_all(&profile, ArrivalModel::Uniform)
            .unwrap();
        let table = render(&run, "profile p.csv");
        assert!(
            table.contains("peak admitted      400  in 1 s from 0.25 s (offered peak 400 in 1 s)"),
            "{table}"
        );
        assert_eq!(second_start(39.9), "39.9");
        assert_eq!(second_start(20.0), "20.0");
        assert_eq!(second_start(0.025), "0.025");
        assert_eq!(second_start(0.0), "0.0");
    }

    /// A partitioned route's table says how many of its refusals were its
    /// `route_limit`'s, under the reasons that count them (under those it would have
    /// rejected, in `shadow`), and nothing of it on a route without one.
    #[test]
    fn the_totals_refusals_are_said_apart() {
        let toml = "[[routes]]\nname = \"r\"\npath_prefix = \"/\"\npartition = \"ip\"\n\
                    base_limit = 100\nroute_limit = 20\n";
        let profile = rocgate::sim::Profile::from_points(&[(0.0, 50.0), (10.0, 50.0)]).unwrap();
        for mode in [Mode::Enforce, Mode::Shadow] {
            let mut config = Config::from_toml_str(toml, "test").unwrap();
            config.routes[0].mode = mode;
            let s = Simulator::new(config, None)
                .unwrap()
                .run_profile(&profile, ArrivalModel::Uniform)
                .unwrap()
                .summary;
            let n = s.route_limit_rejected.unwrap();
            let mut out = String::new();
            render_route(&mut out, &s, false);
            let lines: Vec<&str> = out.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.contains("by route_limit"))
                .unwrap_or_else(|| panic!("{mode:?}: {out}"));
            assert!(lines[at].contains(&format!(" {n} ")), "{}", lines[at]);
            let heading = if mode == Mode::Shadow {
                "would reject"
            } else {
                "rejected"
            };
            let above = lines[..at]
                .iter()
                .rposition(|l| !l.starts_with("  "))
                .unwrap();
            assert!(lines[above].starts_with(heading), "{mode:?}: {out}");
        }
        let mut out = String::new();
        render_route(&mut out, &flash_sale(Mode::Enforce), false);
        assert!(!out.contains("route_limit"), "{out}");
    }

    /// A run's `timeseries.csv` is known by its header, this version's or one written
    /// before `route_limit_rejected` was added (removed as an earlier run's when a
    /// sweep writes beside it); a user's CSV, or a header cut elsewhere, is not.
    #[test]
    fn an_earlier_versions_timeseries_header_is_a_runs() {
        let old = "route,t_s,offered,admitted,rejected,rejected_limit,rejected_roc_cut,\
                   rejected_concurrency,rejected_queue_full,rejected_fallback_local,\
                   shadow_rejected,overload,roc,danger_roc,safe_roc,limit_rps,\
                   base_limit_rps,state,level,level_capacity";
        assert!(is_a_runs_header(old));
        assert!(is_a_runs_header(&format!("{old},route_limit_rejected")));
        assert!(is_a_runs_header(SimRun::CSV_HEADER));
        assert!(!is_a_runs_header("route,t_s,offered"));
        assert!(!is_a_runs_header(&format!(
            "{old},route_limit_rejected,mine"
        )));
        assert!(!is_a_runs_header(""));
    }

    /// The cuts' own rejections below zero are said as a difference, not saturated.
    #[test]
    fn rejections_without_cuts_above_the_runs_read_as_a_difference() {
        let mut s = flash_sale(Mode::Enforce);
        s.rejected_without_cuts = Some(s.rejected + 164);
        let line = without_cuts_line(&s).unwrap();
        assert!(
            line.ends_with("rejected by the base limit alone; difference -164, -1.0%"),
            "{line}"
        );
    }

    /// No line for a route that never cut (its rejections are those without cuts)
    /// nor for a route in a shadow mode.
    #[test]
    fn only_an_enforce_route_that_cut_sets_its_cuts_apart() {
        let mut s = flash_sale(Mode::Enforce);
        assert!(without_cuts_line(&s).is_some());
        s.cuts.clear();
        assert_eq!(without_cuts_line(&s), None);
        for mode in [Mode::Shadow, Mode::ShadowAdaptive] {
            let s = flash_sale(mode);
            assert!(!s.cuts.is_empty());
            assert_eq!(without_cuts_line(&s), None, "{mode:?}");
        }
    }
}
