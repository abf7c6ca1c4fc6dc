//! The body of `PUT /admin/routes/{name}` (a JSON object of controller fields, with
//! durations as text) checked against a running route's parameters.
//!
//! Input: a selector byte (the route's algorithm and current parameters), then the
//! body. Invariants: no panic; a refused change names its origin and a message for
//! each problem; an accepted one obeys the file's rules (cut ≤ base, safe < danger,
//! finite positive limits) and is a valid current state: an empty change on it
//! changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocgate::config::patch_controller;
use rocgate::controller::ControllerParams;
use rocgate::limiter::Algorithm;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let Ok(body) = std::str::from_utf8(body) else {
        return;
    };
    let algorithm = match selector % 5 {
        0 => Algorithm::TokenBucket {
            burst: Duration::from_millis(1500),
        },
        1 => Algorithm::FixedWindow {
            window: Duration::from_secs(1),
        },
        2 => Algorithm::SlidingWindow {
            window: Duration::from_millis(250),
        },
        3 => Algorithm::LeakyBucket { queue: 10 },
        _ => Algorithm::Concurrency { queue: 0 },
    };
    let mut current = ControllerParams::default();
    if selector & 8 != 0 {
        current.base_limit_rps = 0.5;
        current.cut_limit_rps = 0.25;
        current.restore_step_rps = 0.25;
    }
    match patch_controller(&current, &algorithm, body, "PUT") {
        Err(e) => {
            assert!(!e.problems().is_empty());
            assert!(e.to_string().starts_with("PUT"), "{e}");
            for p in e.problems() {
                assert!(!p.message().is_empty(), "{e}");
            }
        }
        Ok(p) => {
            for x in [p.base_limit_rps, p.cut_limit_rps, p.restore_step_rps] {
                assert!(x.is_finite() && x > 0.0, "{p:?}");
            }
            assert!(p.cut_limit_rps <= p.base_limit_rps, "{p:?}");
            assert!(p.safe_roc < p.danger_roc, "{p:?}");
            let same = patch_controller(&p, &algorithm, "{}", "again")
                .unwrap_or_else(|e| panic!("the accepted change {p:?} is no valid state: {e}"));
            assert_eq!(same, p);
        }
    }
});
