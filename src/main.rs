//! The `rocgate` command: serve as a reverse proxy, simulate a spike on a virtual
//! clock, check a config file, print a running instance's tuning hints.

mod cli;

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let args = cli::Cli::parse();
    match args.command {
        cli::Command::Serve(a) => cli::serve::run(a),
        cli::Command::Simulate(a) => cli::simulate::run(a),
        cli::Command::CheckConfig(a) => cli::check_config::run(a),
        cli::Command::Hints(a) => cli::hints::run(a),
    }
}
