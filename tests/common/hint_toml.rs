//! A hint's suggestion written into a route's TOML, for the files that apply hints
//! (`tests/hints_loop.rs`, `tests/sim_numbers.rs`), included by path.

use rocgate::hints::Setting;

/// Replaces the line of `lines` that sets `parameter` by one, at the end, that sets it
/// to `suggested`: a number as it is, a text quoted.
pub(crate) fn set(lines: &mut Vec<String>, parameter: &str, suggested: &Setting) {
    let value = match suggested {
        Setting::Number(x) => format!("{x}"),
        Setting::Text(t) => format!("{t:?}"),
        other => panic!("a setting of no known kind: {other:?}"),
    };
    lines.retain(|l| !l.starts_with(&format!("{parameter} =")));
    lines.push(format!("{parameter} = {value}"));
}
