//! The peers `scripts/soak-serve.sh` runs around `rocgate serve`: the upstream, and
//! the clients that churn through it (aborted heads, uploads and responses, resets,
//! h2c, WebSockets closed and dropped).
//!
//! ```text
//! cargo run --release --example soak_peer --features proxy -- upstream ADDR
//! cargo run --release --example soak_peer --features proxy -- churn PROXY SECONDS CLIENTS
//! ```
//!
//! `upstream` serves on ADDR (`127.0.0.1:0` picks a free port), prints
//! `listening on http://ADDR` once it accepts connections, and runs until killed.
//! `churn` runs CLIENTS clients against the proxy at PROXY for SECONDS, then prints
//! per action the turns that ended well and those that met an error or a timeout
//! (expected of clients that misbehave). Both run on one thread.

#[path = "../tests/common/churn.rs"]
mod churn;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: soak_peer upstream ADDR | soak_peer churn PROXY SECONDS CLIENTS";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("soak_peer: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["upstream", addr] => {
            let Ok(addr) = addr.parse::<SocketAddr>() else {
                eprintln!("soak_peer: ADDR must be a socket address, got '{addr}'");
                return ExitCode::from(2);
            };
            runtime.block_on(async {
                let listener = match tokio::net::TcpListener::bind(addr).await {
                    Ok(listener) => listener,
                    Err(e) => {
                        eprintln!("soak_peer: cannot listen on {addr}: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                match listener.local_addr() {
                    Ok(bound) => println!("listening on http://{bound}"),
                    Err(e) => {
                        eprintln!("soak_peer: {e}");
                        return ExitCode::FAILURE;
                    }
                }
                match axum::serve(listener, churn::upstream_app()).await {
                    Ok(()) => ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("soak_peer: the upstream stopped: {e}");
                        ExitCode::FAILURE
                    }
                }
            })
        }
        ["churn", proxy, seconds, clients] => {
            let (Ok(proxy), Ok(seconds), Ok(clients)) = (
                proxy.parse::<SocketAddr>(),
                seconds.parse::<u64>(),
                clients.parse::<usize>(),
            ) else {
                eprintln!("soak_peer: churn takes an address and two whole numbers\n{USAGE}");
                return ExitCode::from(2);
            };
            let tally = runtime.block_on(async {
                let until = tokio::time::Instant::now() + Duration::from_secs(seconds);
                churn::churn(proxy, clients, until).await
            });
            println!("{:<18} {:>8} {:>8}", "action", "ended", "failed");
            for (action, (ok, failed)) in &tally.done {
                println!("{:<18} {ok:>8} {failed:>8}", format!("{action:?}"));
            }
            println!("{:<18} {:>8}", "turns", tally.turns());
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
