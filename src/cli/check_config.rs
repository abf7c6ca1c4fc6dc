//! `rocgate check-config FILE`: validates a configuration file as `serve` would load
//! it (environment overrides included).

use super::CheckConfigArgs;
use super::{out, shown};
use rocgate::config::Config;
use std::process::ExitCode;
use std::time::SystemTime;

/// Prints `ok` and exits 0, or prints every problem on stderr, one per line, and exits 2.
/// A valid file's scheduled events that have ended by now (a date left from last year)
/// are named on stderr as warnings: they are valid, and will never run.
pub(crate) fn run(args: CheckConfigArgs) -> ExitCode {
    match Config::load(&args.file) {
        Ok(config) => {
            #[allow(clippy::disallowed_methods)] // the wall clock, which events are placed on
            let now = SystemTime::now();
            for (at, event, end) in config.ended_events(now) {
                eprintln!(
                    "{}: warning: {at} ({:?}) ended at {}: it will never run",
                    shown(&args.file),
                    event.name,
                    humantime::format_rfc3339_seconds(end),
                );
            }
            out!("ok\n");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
