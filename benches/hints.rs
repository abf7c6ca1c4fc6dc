//! What `rocgate serve`'s hints timer costs with many routes: the look it takes once a
//! second ([`Advisor::next_tick`]: every route's profile due, cloned from its settings,
//! and the next event edge) and the tick that closes every route's interval
//! ([`Advisor::tick`], every `[hints] interval`, 10 s by default).
//!
//! 1,000 routes, each with a scheduled event (a second profile to look at and edges to
//! find), on the engine's own virtual time: the engine and the history are driven by
//! the times passed in, criterion times the calls.
//!
//! `cargo bench --all-features --bench hints -- --warm-up-time 1 --measurement-time 3`

use criterion::Criterion;
use rocgate::clock::Nanos;
use rocgate::config::Config;
use rocgate::engine::Engine;
use rocgate::proxy::Advisor;
use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, UNIX_EPOCH};

/// Routes in the configuration.
const ROUTES: usize = 1_000;

/// `ROUTES` prefix routes, each with a one-hour event an hour in; a history of ten
/// minutes (an hour's, 240 KB a route, would hold 240 MB here).
fn config() -> Config {
    let mut toml = String::from("[hints]\nkeep = \"10m\"\n");
    for k in 0..ROUTES {
        write!(
            toml,
            "[[routes]]\nname = \"r{k}\"\npath_prefix = \"/r{k}/\"\n\
             [[routes.events]]\nname = \"sale\"\nstart = \"1970-01-01T01:00:00Z\"\n\
             duration = \"1h\"\nbase_limit = 500\ncut_limit = 150\n"
        )
        .expect("writing to a String");
    }
    Config::from_toml_str(&toml, "bench").expect("the bench's configuration is valid")
}

fn timer(c: &mut Criterion) {
    let config = config();
    let engine = Engine::new(&config, Nanos::ZERO, UNIX_EPOCH).expect("an engine");
    let advisor = Advisor::new(&config.hints);
    advisor.tick(&engine, Nanos::ZERO);
    let mut group = c.benchmark_group("hints_timer_1000_routes");
    let mut last = 0u64;
    group.bench_function("next_tick", |b| {
        b.iter(|| {
            // Within the first interval, so every look goes through every route.
            last = (last + 1) % 9_000;
            black_box(advisor.next_tick(&engine, Nanos::from_millis(last)))
        });
    });
    let mut at = Nanos::ZERO;
    group.bench_function("tick", |b| {
        b.iter(|| {
            at = at + Duration::from_secs(10);
            advisor.tick(&engine, at);
        });
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    timer(&mut c);
    c.final_summary();
}
