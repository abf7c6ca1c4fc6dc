//! Simulation speed: simulated requests per second, for the rehearsal an operator runs
//! before a sale (an hour of 1,000 req/s must replay in under 2 s, ≥ 2,000,000
//! requests per second on one core).
//!
//! Groups (criterion reports time per iteration and, from the throughput, elements per
//! second):
//!
//! - `profile_hour_1000rps`: `Simulator::run_profile_all` over an hour at 1,000 req/s
//!   (3.6 M requests), uniform and Poisson arrivals, with a capacity; against
//!   `engine_only`, the same arrivals sent to `Engine::check` with nothing recorded: the
//!   simulator's own cost is the difference (its second engine included, which decides
//!   every arrival of an `enforce` route again to count what it rejects without cuts:
//!   `Simulator::count_without_cuts`).
//! - `log_10min_1000rps`: an access log of 10 minutes at 1,000 req/s on two routes
//!   (600 k lines, built in memory): `parse` reads it into an `AccessLog`
//!   (throughput: lines), `replay` runs it (throughput: requests).
//!
//! Run: `cargo bench --bench sim -- --warm-up-time 1 --measurement-time 5`.

use criterion::{Criterion, Throughput};
use rocgate::clock::Nanos;
use rocgate::config::{Config, RouteConfig, RouteMatch};
use rocgate::engine::{Engine, Key};
use rocgate::sim::{ArrivalModel, LogOptions, LogReader, Profile, Simulator};
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::SystemTime;

const RATE: f64 = 1000.0;
const HOUR_S: f64 = 3600.0;
const LOG_S: u64 = 600;

fn config() -> Config {
    Config::new(vec![
        RouteConfig::new("order", RouteMatch::exact("POST", "/api/order")),
        RouteConfig::new("default", RouteMatch::prefix("/")),
    ])
}

fn profile_hour(c: &mut Criterion) {
    let profile = Profile::from_points(&[(0.0, RATE), (HOUR_S, RATE)]).unwrap();
    let requests = profile.expected_arrivals() as u64;
    let sim = Simulator::new(config(), Some("order"))
        .unwrap()
        .capacity(900);
    let mut g = c.benchmark_group("profile_hour_1000rps");
    g.sample_size(10).throughput(Throughput::Elements(requests));
    for (name, model) in [
        ("uniform", ArrivalModel::Uniform),
        ("poisson", ArrivalModel::Poisson { seed: 1 }),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| black_box(sim.run_profile_all(&profile, model).unwrap()))
        });
    }
    g.bench_function("engine_only", |b| {
        b.iter(|| {
            let engine = Engine::new(&config(), Nanos::ZERO, SystemTime::UNIX_EPOCH).unwrap();
            let route = engine.route_at(0).unwrap();
            let admitted = profile
                .arrivals(ArrivalModel::Uniform)
                .filter(|&t| engine.check(route, Key::None, t).is_admit())
                .count();
            black_box(admitted)
        })
    });
    g.finish();
}

/// A combined-format log of `LOG_S` seconds at 1,000 req/s: 9 in 10 requests to
/// `/api/order`, the rest to other paths.
fn log_text() -> String {
    let mut text = String::with_capacity(LOG_S as usize * 1000 * 130);
    for s in 0..LOG_S {
        let (m, sec) = (s / 60, s % 60);
        for i in 0..1000 {
            let (method, path) = if i % 10 == 0 {
                ("GET", "/static/app.js")
            } else {
                ("POST", "/api/order?item=42")
            };
            let _ = writeln!(
                text,
                "203.0.113.{} - - [27/Nov/2026:20:{m:02}:{sec:02} +0100] \"{method} {path} HTTP/1.1\" 200 512 \"-\" \"Mozilla/5.0\"",
                i % 250
            );
        }
    }
    text
}

fn log_replay(c: &mut Criterion) {
    let text = log_text();
    let read = || {
        let mut reader = LogReader::new(&config(), LogOptions::default()).unwrap();
        reader.read("bench.log", text.as_bytes()).unwrap();
        reader.finish().unwrap()
    };
    let log = read();
    let sim = Simulator::for_routes(config(), &["order", "default"]).unwrap();
    let mut g = c.benchmark_group("log_10min_1000rps");
    g.sample_size(10);
    g.throughput(Throughput::Elements(log.stats().lines));
    g.bench_function("parse", |b| b.iter(|| black_box(read())));
    g.throughput(Throughput::Elements(log.len() as u64));
    g.bench_function("replay", |b| {
        b.iter(|| black_box(sim.replay(&log).unwrap()))
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    profile_hour(&mut c);
    log_replay(&mut c);
    c.final_summary();
}
