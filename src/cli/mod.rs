//! Command-line arguments of the `rocgate` binary; one module per subcommand.

pub(crate) mod check_config;
pub(crate) mod demo;
pub(crate) mod hints;
pub(crate) mod serve;
pub(crate) mod signals;
pub(crate) mod simulate;

use clap::{Parser, Subcommand};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::SystemTime;

/// rocgate: adaptive admission control for HTTP routes.
#[derive(Debug, Parser)]
#[command(name = "rocgate", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// A flash sale on a demo shop behind rocgate, over real HTTP on loopback, with a
    /// live table; `--compare` also runs it without rocgate.
    Demo(demo::DemoArgs),
    /// Run the reverse proxy in front of an upstream, with the admin API.
    Serve(ServeArgs),
    /// Replay a traffic profile or an access log through the engine on a virtual clock.
    Simulate(SimulateArgs),
    /// Validate a configuration file: prints `ok`, or every error (exit code 2).
    CheckConfig(CheckConfigArgs),
    /// Print the tuning hints of a running `serve`, from its admin API.
    Hints(HintsArgs),
}

/// Arguments of `rocgate hints`.
#[derive(Debug, clap::Args)]
pub(crate) struct HintsArgs {
    /// The admin API of the running `serve`: `http://host[:port]`, or `host:port`.
    #[arg(long, default_value = "http://127.0.0.1:9090")]
    pub(crate) admin: String,
    /// How far back to look (at most the history kept, `[hints] keep`).
    // Hyphen values are taken, so that `-5m` gets the period's own error rather than
    // clap's "unexpected argument".
    #[arg(long, default_value = "15m", allow_hyphen_values = true)]
    pub(crate) period: String,
    /// Print the JSON the admin API returned instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// A file holding the admin API's token (`[admin] token`), sent as
    /// `Authorization: Bearer`; without it, no token is sent. A token held in a
    /// variable: --token-file <(printf %s "$ROCGATE__ADMIN__TOKEN").
    #[arg(long, value_name = "PATH")]
    pub(crate) token_file: Option<PathBuf>,
}

/// Arguments of `rocgate serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Configuration file (default: the embedded default configuration).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Address clients connect to (overrides the file).
    #[arg(long, value_parser = parse_addr)]
    pub(crate) listen: Option<SocketAddr>,
    /// Upstream to forward to, `http://host[:port]` (overrides the file).
    #[arg(long)]
    pub(crate) upstream: Option<String>,
    /// Address of the admin API (overrides the file).
    #[arg(long, value_parser = parse_addr)]
    pub(crate) admin: Option<SocketAddr>,
}

/// Arguments of `rocgate simulate`.
#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// Configuration file (default: the embedded default configuration).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Route to drive; repeat for several with --access-log (default: the first route
    /// for a profile, every route the log reaches for an access log).
    #[arg(long = "route", value_name = "NAME")]
    pub(crate) routes: Vec<String>,
    /// Built-in scenario: steady, warmup, flash-sale, bot-burst, double-spike (default:
    /// flash-sale, when no profile or access log is given).
    #[arg(long, conflicts_with_all = ["profile", "access_logs"])]
    pub(crate) scenario: Option<String>,
    /// CSV profile: `t_seconds,rate` lines, piecewise linear.
    #[arg(long, conflicts_with = "access_logs")]
    pub(crate) profile: Option<PathBuf>,
    /// nginx/Apache access log (common or combined format, gzip or not; `-` reads
    /// stdin) to replay; repeat for several files.
    #[arg(long = "access-log", value_name = "FILE")]
    pub(crate) access_logs: Vec<PathBuf>,
    /// Replay only requests logged at or after this time: RFC 3339 in UTC
    /// (`2026-11-27T19:00:00Z`) or as logged (`27/Nov/2026:20:00:00 +0100`).
    #[arg(long, requires = "access_logs", value_parser = simulate::parse_log_bound)]
    pub(crate) from: Option<SystemTime>,
    /// Replay only requests logged before this time (same forms as --from).
    #[arg(long, requires = "access_logs", value_parser = simulate::parse_log_bound)]
    pub(crate) to: Option<SystemTime>,
    /// Go on when more than 1% of the log's lines cannot be parsed.
    #[arg(long, requires = "access_logs")]
    pub(crate) lenient: bool,
    /// Seed: Poisson arrivals for a profile, random times inside each logged second
    /// for an access log; without it, arrivals are evenly spaced.
    #[arg(long, allow_negative_numbers = true, value_parser = simulate::parse_seed)]
    pub(crate) seed: Option<u64>,
    /// Wall-clock time of t = 0, RFC 3339 in UTC (places scheduled events; default: the
    /// profile's first `t_seconds` read as Unix seconds, or the log's first second).
    #[arg(long, value_parser = simulate::parse_start)]
    pub(crate) start: Option<SystemTime>,
    /// Capacity of the protected service, req/s, all driven routes together: what is
    /// admitted beyond it in a second counts as overload.
    #[arg(
        long,
        value_name = "RPS",
        allow_negative_numbers = true,
        value_parser = simulate::parse_capacity
    )]
    pub(crate) capacity: Option<u64>,
    /// Run once per value of a route parameter and print a table:
    /// `[ROUTE.]NAME=START..END:STEP` or `[ROUTE.]NAME=V1,V2,…` (durations in seconds);
    /// repeat for a grid of at most 400 runs, offering at most 10^10 requests in all.
    #[arg(long = "sweep", value_name = "PARAM", value_parser = simulate::parse_sweep)]
    pub(crate) sweeps: Vec<rocgate::sim::SweepParam>,
    /// Directory for summary.json, timeseries.csv, chart.svg and chart.png (with
    /// --sweep: sweep.csv).
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

/// An address flag (`--listen`, `--admin`): an IP address and a port, refused as the
/// file's `listen` is, saying what it takes (a host name is not looked up).
pub(crate) fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("must be an IP address and port such as 127.0.0.1:8080 or [::1]:8080, got {text:?}")
    })
}

/// Arguments of `rocgate check-config`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckConfigArgs {
    /// The configuration file to validate.
    pub(crate) file: PathBuf,
}

/// Writes to standard output like `print!`, but a reader that has gone (`rocgate
/// simulate | head -1`) ends the output quietly, where `print!` would panic.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_out(format_args!($($arg)*))
    };
}
pub(crate) use out;

/// What [`out!`] writes with. A closed pipe is dropped quietly; another error (a full
/// disk, `> /dev/full`) is kept for [`stdout_failure`], so that the command does not
/// end as if its output had been written.
pub(crate) fn write_out(text: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let _ = STDOUT_FAILURE.set(e.to_string());
        }
    }
}

/// `path` as a message shows it: its control characters escaped (`\n`, `\u{1b}`), as
/// other input shown is ([`rocgate::config::escaped`]): a line break in `--out` split
/// the `wrote` line, and an escape sequence in a file's name acted on the terminal.
pub(crate) fn shown(path: &std::path::Path) -> String {
    rocgate::config::escaped(&path.display().to_string(), char::is_control).into_owned()
}

/// The first error [`write_out`] met other than a closed pipe.
static STDOUT_FAILURE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Why standard output could not be written, if it could not (a closed pipe aside).
pub(crate) fn stdout_failure() -> Option<&'static str> {
    STDOUT_FAILURE.get().map(String::as_str)
}
