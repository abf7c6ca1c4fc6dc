//! `rocgate check-config FILE`: validates a configuration file as `serve` would load
//! it (environment overrides included).

use super::out;
use super::CheckConfigArgs;
use rocgate::config::Config;
use std::process::ExitCode;

/// Prints `ok` and exits 0, or prints every problem on stderr, one per line, and exits 2.
pub(crate) fn run(args: CheckConfigArgs) -> ExitCode {
    match Config::load(&args.file) {
        Ok(_) => {
            out!("ok\n");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
