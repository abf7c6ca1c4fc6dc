//! `rocgate check-config FILE`: validates a configuration file as `serve` would load
//! it (environment overrides included).

use super::out;
use super::CheckConfigArgs;
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
            for warning in ended_events(&config, now) {
                eprintln!("{}: warning: {warning}", args.file.display());
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

/// A line for each of `config`'s events that ended at or before `now`.
fn ended_events(config: &Config, now: SystemTime) -> Vec<String> {
    let mut lines = Vec::new();
    for (i, route) in config.routes.iter().enumerate() {
        for (j, event) in route.events.iter().enumerate() {
            let end = event.start.checked_add(event.duration);
            if end.is_some_and(|end| end <= now) {
                lines.push(format!(
                    "routes[{i}].events[{j}] ({:?}) ended at {}: it will never run",
                    event.name,
                    humantime::format_rfc3339_seconds(end.unwrap_or(now)),
                ));
            }
        }
    }
    lines
}
