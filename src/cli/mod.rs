//! Command-line arguments of the `rocgate` binary; one module per subcommand.

pub(crate) mod check_config;
pub(crate) mod serve;
pub(crate) mod simulate;

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// rocgate: adaptive admission control for HTTP routes.
#[derive(Debug, Parser)]
#[command(name = "rocgate", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the reverse proxy in front of an upstream, with the admin API.
    Serve(ServeArgs),
    /// Replay a traffic profile through the engine on a virtual clock.
    Simulate(SimulateArgs),
    /// Validate a configuration file: prints `ok`, or every error (exit code 2).
    CheckConfig(CheckConfigArgs),
}

/// Arguments of `rocgate serve`.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Configuration file (default: the embedded default configuration).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Address clients connect to (overrides the file).
    #[arg(long)]
    pub(crate) listen: Option<SocketAddr>,
    /// Upstream to forward to, `http://host:port` (overrides the file).
    #[arg(long)]
    pub(crate) upstream: Option<String>,
    /// Address of the admin API (overrides the file).
    #[arg(long)]
    pub(crate) admin: Option<SocketAddr>,
}

/// Arguments of `rocgate simulate`.
#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// Configuration file (default: the embedded default configuration).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Route to drive (default: the first route).
    #[arg(long)]
    pub(crate) route: Option<String>,
    /// Built-in scenario: steady, warmup, flash-sale, bot-burst, double-spike.
    #[arg(long, conflicts_with = "profile")]
    pub(crate) scenario: Option<String>,
    /// CSV profile: `t_seconds,rate` lines, piecewise linear.
    #[arg(long)]
    pub(crate) profile: Option<PathBuf>,
    /// Seed for Poisson arrivals; without it arrivals are evenly spaced.
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Wall-clock time of the profile's start, RFC 3339 (places scheduled events;
    /// default: the profile's first `t_seconds`, read as Unix seconds).
    #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
    pub(crate) start: Option<std::time::SystemTime>,
    /// Directory for summary.json and timeseries.csv.
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,
}

/// Arguments of `rocgate check-config`.
#[derive(Debug, clap::Args)]
pub(crate) struct CheckConfigArgs {
    /// The configuration file to validate.
    pub(crate) file: PathBuf,
}
