//! The traffic profile CSV parser (`rocgate simulate --profile`).
//!
//! Invariants: no panic; an error about a line names a line of the text; a parsed
//! profile has a finite, non-negative rate everywhere and arrivals in order within its
//! duration. (There is no profile formatter, so no round trip.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocgate::sim::{ArrivalModel, Profile};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let profile = match Profile::parse_csv(text) {
        Ok(p) => p,
        Err(e) => {
            let _ = e.to_string();
            if let Some(line) = e.line() {
                // Lines end with `\n`, `\r\n` or a `\r` alone.
                let lines = text
                    .replace("\r\n", "\n")
                    .replace('\r', "\n")
                    .lines()
                    .count();
                assert!(
                    line >= 1 && line <= lines,
                    "line {line} of {lines} lines: {e}"
                );
            }
            return;
        }
    };
    let duration = profile.duration().as_secs_f64();
    let expected = profile.expected_arrivals();
    assert!(expected >= 0.0, "expected arrivals {expected}");
    for i in 0..=16 {
        let t = duration * f64::from(i) / 16.0;
        let r = profile.rate_at(t);
        assert!(r.is_finite() && r >= 0.0, "rate {r} at {t}");
    }
    let mut last = 0.0;
    for (n, at) in profile
        .arrivals(ArrivalModel::Uniform)
        .enumerate()
        .take(1000)
    {
        let at = at.as_secs_f64();
        assert!(at >= last, "arrival {n} at {at} before {last}");
        assert!(
            at <= duration,
            "arrival {n} at {at} after the end {duration}"
        );
        last = at;
    }
    let _ = profile
        .arrivals(ArrivalModel::Poisson { seed: 7 })
        .take(1000)
        .count();
    let _ = profile.time_scaled(0.5);
});
