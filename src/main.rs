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

/// The most log lines waiting to be written before further ones are dropped.
const LOG_LINES_WAITING: usize = 100_000;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // The demo's table is on stdout; its info logs (each transition) would interleave
    // with it on a terminal, so it logs warnings only unless RUST_LOG says otherwise.
    // The Redis client's cluster code logs every failed reconnection, tens of lines a
    // second while a cluster is away (more with traffic), where rocgate says once
    // every 10 s that the store is unreachable.
    let default_filter = match args.command {
        cli::Command::Demo(_) => "warn",
        _ => "info,redis::cluster_handling=off",
    };
    // `RUST_LOG` set but empty (a unit's `Environment=RUST_LOG=`) is the default, not
    // a filter that passes nothing, errors included; one that is no filter is the
    // default too, and said.
    let (filter, unreadable) = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => match tracing_subscriber::EnvFilter::try_new(&v) {
            Ok(filter) => (filter, None),
            Err(e) => (
                tracing_subscriber::EnvFilter::new(default_filter),
                Some((format!("{v:?}"), e.to_string())),
            ),
        },
        Err(std::env::VarError::NotUnicode(v)) => (
            tracing_subscriber::EnvFilter::new(default_filter),
            Some((format!("{v:?}"), "not UTF-8".to_owned())),
        ),
        _ => (tracing_subscriber::EnvFilter::new(default_filter), None),
    };
    // Lines are written to stderr by a thread of their own, never where they are
    // logged: a pipe nobody reads (a stalled log collector) would otherwise stop the
    // first request that logs, and a route whose transition is logged under its lock.
    // While that thread is behind by LOG_LINES_WAITING lines, further ones are dropped.
    // The guard writes out what waits when `main` returns.
    let (writer, written_out) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_LINES_WAITING)
        .lossy(true)
        .thread_name("rocgate-log")
        .finish(std::io::stderr());
    let dropped = writer.error_counter();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Some((value, e)) = unreadable {
        tracing::warn!("RUST_LOG={value} is no log filter ({e}): logging with {default_filter:?}");
    }
    let code = match args.command {
        cli::Command::Demo(a) => cli::demo::run(a),
        cli::Command::Serve(a) => cli::serve::run(a),
        cli::Command::Simulate(a) => cli::simulate::run(a),
        cli::Command::CheckConfig(a) => cli::check_config::run(a),
        cli::Command::Hints(a) => cli::hints::run(a),
    };
    // Lines were dropped: nobody reads stderr, and the writer thread is stuck there.
    // The guard would wait for it in vain, then print its failure on stdout, which
    // holds `simulate`'s and `demo`'s output: it is left undropped instead.
    if dropped.dropped_lines() > 0 {
        std::mem::forget(written_out);
    }
    // Output that could not be written (a full disk) is a failure, not a success with
    // nothing to show.
    match cli::stdout_failure() {
        Some(e) if code == ExitCode::SUCCESS => {
            eprintln!("rocgate: cannot write to standard output: {e}");
            ExitCode::FAILURE
        }
        _ => code,
    }
}
