//! TOML text and environment overrides into a validated config.
//!
//! Input: the TOML text, then optionally a NUL byte and `NAME=VALUE` lines, the
//! environment (`ROCGATE__…` variables are overrides). Invariants: no panic; a refused
//! config names its origin and has at least one problem, each with a message; loading
//! the same input twice gives the same outcome (the same config, or the same errors).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocgate::config::Config;

fuzz_target!(|data: &[u8]| {
    let (text, env) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let env: Vec<(String, String)> = String::from_utf8_lossy(env)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let first = Config::from_toml_str_with_env(text, "fuzz.toml", env.clone());
    match &first {
        Ok(_) => {}
        Err(e) => {
            assert!(!e.problems().is_empty(), "an error without a problem");
            assert_eq!(e.origin(), "fuzz.toml");
            let shown = e.to_string();
            assert!(shown.starts_with("fuzz.toml"), "{shown}");
            for p in e.problems() {
                assert!(!p.message().is_empty(), "a problem without a message: {e}");
            }
        }
    }
    let again = Config::from_toml_str_with_env(text, "fuzz.toml", env);
    match (&first, &again) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("loading the same text twice gave different outcomes"),
    }
});
