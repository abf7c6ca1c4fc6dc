//! The `rocgate` command: a demo, serve as a reverse proxy, simulate a spike on a
//! virtual clock, check a config file, print a running instance's tuning hints.

mod cli;

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;

/// mimalloc, not the system allocator: `rocgate serve` allocates and frees a few small
/// objects per request (buffers, futures, header maps), which glibc's malloc serves
/// from its slower bins past 1 KiB; mimalloc takes 2% off the instructions of a
/// proxied request (benches/README.md, "rocgate vs nginx"). Built without transparent
/// huge pages (the `no_thp` feature, Cargo.toml): with them the proxy's RSS under load
/// was about twice its size without, for the same live heap.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // The demo's table is on stdout; its info logs (each transition) would interleave
    // with it on a terminal, so it logs warnings only unless RUST_LOG says otherwise.
    let default_filter = match args.command {
        cli::Command::Demo(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match args.command {
        cli::Command::Demo(a) => cli::demo::run(a),
        cli::Command::Serve(a) => cli::serve::run(a),
        cli::Command::Simulate(a) => cli::simulate::run(a),
        cli::Command::CheckConfig(a) => cli::check_config::run(a),
        cli::Command::Hints(a) => cli::hints::run(a),
    }
}
