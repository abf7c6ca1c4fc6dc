//! `rocgate demo`: the demo shop, the proxy in front of it and a flash sale over real
//! HTTP on loopback, with a live table; see [`rocgate::demo`].

use super::signals::{ShutdownSignals, Stop};
use rocgate::demo::{DemoSettings, Plan};
use rocgate::sim::ArrivalModel;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `rocgate demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Length of the flash sale, warm-up to tail: seconds (`10`) or a duration (`90s`,
    /// `2m`), 5 s to 1 h. The scenario and the config's times scale with it.
    #[arg(
        long,
        default_value = "60",
        allow_negative_numbers = true,
        value_parser = parse_plan
    )]
    duration: Plan,
    /// Then play the same traffic straight to a new shop, without rocgate, and print
    /// both side by side.
    #[arg(long)]
    compare: bool,
    /// Address of the admin API (`/metrics`, `/admin/routes`); `127.0.0.1:0` takes any
    /// free port [default: 127.0.0.1:9090, or any free port if that one is taken]
    #[arg(long, value_parser = super::parse_addr)]
    admin: Option<SocketAddr>,
    /// Address the proxy listens on (`127.0.0.1:0`: any free port on loopback).
    #[arg(long, default_value = "127.0.0.1:0", value_parser = super::parse_addr)]
    listen: SocketAddr,
    /// Poisson arrivals from this seed (default: evenly spaced).
    #[arg(long, allow_negative_numbers = true, value_parser = super::simulate::parse_seed)]
    seed: Option<u64>,
}

/// A `--duration`: whole or decimal seconds, or a humantime duration.
fn parse_plan(text: &str) -> Result<Plan, String> {
    // As the other flags: " 60" (a quoted value with a space) is 60.
    let text = text.trim();
    let duration = match text.parse::<f64>().map(Duration::try_from_secs_f64) {
        Ok(Ok(d)) => d,
        Ok(Err(_)) => return Err(format!("{text:?} is not a length of time")),
        Err(_) => humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))?,
    };
    Plan::new(duration).map_err(|e| {
        // clap names the flag itself.
        let e = e.to_string();
        e.strip_prefix("--duration: ")
            .map_or_else(|| e.clone(), str::to_owned)
    })
}

/// The admin API's usual address (the one `dashboards/prometheus.yml` scrapes).
const DEFAULT_ADMIN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9090);

/// `--admin`, or the usual address if it is free, or any free port: a demo should not
/// fail because something else (often Prometheus itself) holds port 9090, or because
/// `--listen` (`listen`) takes it.
fn admin_addr(given: Option<SocketAddr>, listen: SocketAddr) -> SocketAddr {
    if let Some(addr) = given {
        return addr;
    }
    if rocgate::config::listeners_clash(listen, DEFAULT_ADMIN) {
        eprintln!("rocgate demo: --listen {listen} takes {DEFAULT_ADMIN}; the admin API takes any free port");
        return SocketAddr::new(DEFAULT_ADMIN.ip(), 0);
    }
    match std::net::TcpListener::bind(DEFAULT_ADMIN) {
        Ok(probe) => {
            drop(probe);
            DEFAULT_ADMIN
        }
        Err(e) => {
            eprintln!("rocgate demo: {DEFAULT_ADMIN} is not free ({e}); the admin API takes any free port");
            SocketAddr::new(DEFAULT_ADMIN.ip(), 0)
        }
    }
}

/// The `ROCGATE__…` variables set (not empty) in the environment, sorted, as
/// [`rocgate::config::env_name_shown`] shows them: the demo applies none of them.
fn overrides_set() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter(|(_, value)| !value.is_empty())
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .filter(|name| name.to_ascii_lowercase().starts_with("rocgate__"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|name| rocgate::config::env_name_shown(name))
        .collect()
}

pub(crate) fn run(args: DemoArgs) -> ExitCode {
    // Its numbers are those `simulate --config config/demo.toml` prints: a variable
    // meant for `serve` was ignored without a word, as if it had taken.
    let ignored = overrides_set();
    if !ignored.is_empty() {
        eprintln!(
            "rocgate demo: the demo runs its built-in configuration (config/demo.toml), \
             which environment variables do not change: {} not applied",
            ignored.join(", ")
        );
    }
    let admin = admin_addr(args.admin, args.listen);
    if rocgate::config::listeners_clash(args.listen, admin) {
        eprintln!(
            "rocgate demo: --listen {} and --admin {admin} take the same port: the proxy and \
             the admin API need an address each",
            args.listen
        );
        return ExitCode::from(2);
    }
    let mut settings = DemoSettings::new(args.duration, args.listen, admin);
    settings.compare = args.compare;
    settings.arrivals = ArrivalModel::from_seed(args.seed);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rocgate demo: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout();
    let stopped_by = std::cell::Cell::new(None);
    // The first SIGTERM or Ctrl-C stops the traffic and lets the demo shut down and
    // report (a few seconds at most); a second one ends it at once, as `serve`'s does.
    let outcome = runtime.block_on(async {
        let mut signals = ShutdownSignals::listen();
        let (first, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut first = Some(first);
        let run = rocgate::demo::run(&settings, &mut out, async {
            let _ = stopped.await;
        });
        tokio::pin!(run);
        loop {
            tokio::select! {
                outcome = &mut run => return Some(outcome),
                signal = signals.next() => match first.take() {
                    Some(first) => {
                        stopped_by.set(Some(signal));
                        let _ = first.send(());
                    }
                    None => return None,
                },
            }
        }
    });
    let outcome = match outcome {
        Some(Ok(o)) => o,
        None => {
            eprintln!("rocgate demo: a second SIGTERM or Ctrl-C during the shutdown: exiting now, without the summary");
            runtime.shutdown_background();
            let signal = stopped_by.get().unwrap_or(Stop::Interrupt);
            return ExitCode::from(signal.exit_code());
        }
        Some(Err(e)) => {
            eprintln!("rocgate demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = rocgate::demo::write_report(&mut out, &outcome) {
        eprintln!("rocgate demo: cannot write the report: {e}");
        return ExitCode::FAILURE;
    }
    // The runtime's leftover tasks (requests that were still in flight) end with it.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match stopped_by.get() {
        Some(signal) if outcome.interrupted() => ExitCode::from(signal.exit_code()),
        _ => ExitCode::SUCCESS,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_plan;
    use std::time::Duration;

    /// A value with spaces around it (a quoted `" 60"`) is read as the other flags
    /// read theirs: it was refused as no duration.
    #[test]
    fn a_duration_is_read_without_the_spaces_around_it() {
        for text in [" 60", "60 ", " 1m "] {
            let plan = parse_plan(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(plan.duration(), Duration::from_secs(60), "{text:?}");
        }
    }
}
