//! The access-log parser behind `rocgate simulate --replay` and `rocgate hints`.
//!
//! Each line goes through `parse_line` (and what a parsed line offers), the whole input
//! through a `LogReader` over the built-in config and `finish`. Invariants: no panic;
//! the reader counts every line; an unparsable line is named by a line number of the
//! input; the cached time parse the reader uses agrees with `parse_line` (same counts
//! of unparsable lines); replayed requests come in time order within the log's span.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocgate::config::Config;
use rocgate::sim::access_log::{parse_line, parse_time, LogError, MAX_LINE_BYTES};
use rocgate::sim::{LogOptions, LogReader, Spread};
use std::sync::OnceLock;

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let mut config = Config::embedded_default();
        // One route keyed by client IP, so the reader keeps clients too.
        let text = "[[routes]]\nname = \"ip\"\npath_prefix = \"/ip\"\npartition = \"ip\"\n\
                    [[routes]]\nname = \"all\"\npath_prefix = \"/\"\n";
        let ip = Config::from_toml_str(text, "fuzz").expect("valid");
        config.routes.splice(0..0, ip.routes);
        config
    })
}

fuzz_target!(|data: &[u8]| {
    let (lenient, data) = match data.split_first() {
        Some((&flag, rest)) => (flag & 1 == 1, rest),
        None => (false, data),
    };
    // The reader's rules: a line is cut at `\n`, loses every `\r` and `\n` at its end,
    // is too long beyond MAX_LINE_BYTES (before that trimming of more than one `\r`),
    // which ends the read, and is blank if all whitespace.
    let mut unparsable = 0u64;
    let mut lines = 0u64;
    let mut too_long = None;
    let mut rest = data;
    while !rest.is_empty() && too_long.is_none() {
        let (line, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &[][..]),
        };
        rest = next;
        lines += 1;
        let _ = parse_time(line);
        let one_cr = line.strip_suffix(b"\r").unwrap_or(line);
        let mut trimmed = line;
        while let [head @ .., b'\r'] = trimmed {
            trimmed = head;
        }
        if one_cr.len() > MAX_LINE_BYTES {
            too_long = Some(lines);
            continue;
        }
        match parse_line(trimmed) {
            Ok(l) => {
                let _ = l.client_ip();
                let _ = l.request_text();
                let _ = l.method_and_path();
            }
            Err(e) => {
                let _ = e.to_string();
                if !trimmed.iter().all(u8::is_ascii_whitespace) {
                    unparsable += 1;
                }
            }
        }
    }
    let mut options = LogOptions::default();
    options.spread = Spread::Random { seed: 3 };
    options.lenient = lenient;
    let mut reader = LogReader::new(config(), options).expect("the options are valid");
    match (reader.read("fuzz.log", data), too_long) {
        (Err(LogError::LineTooLong { line, .. }), Some(at)) => {
            assert_eq!(line, at, "the line too long");
            return;
        }
        (Ok(()), None) => {}
        (result, at) => panic!(
            "read {:?}, a line too long at {at:?}",
            result.map_err(|e| e.to_string())
        ),
    }
    let stats = reader.stats().clone();
    assert_eq!(stats.lines, lines, "lines counted");
    for bad in &stats.first_unparsable {
        assert!(bad.line >= 1 && bad.line <= lines, "{bad}");
    }
    assert_eq!(stats.unparsable, unparsable, "unparsable lines");
    let Ok(log) = reader.finish() else {
        return;
    };
    let span = log.duration().as_nanos();
    let mut last = 0;
    for r in log.requests().take(100_000) {
        let at = u128::from(r.at.as_u64());
        assert!(at >= last, "out of order");
        assert!(at <= span, "after the span: {at} > {span}");
        last = at;
    }
});
