//! Reading rocgate's metrics out of a PromQL expression, as the tests of the shipped
//! dashboards and alert rules do.

/// The vector selectors of `expr` that read rocgate's metrics, in order: each
/// metric's name, and the text between its braces where it has label matchers.
pub(crate) fn rocgate_selectors(expr: &str) -> Vec<(&str, Option<&str>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("rocgate_") {
        let from = &rest[at..];
        let name_len = from
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(from.len());
        let matchers = from[name_len..]
            .strip_prefix('{')
            .map(|m| &m[..m.find('}').expect("a closed selector")]);
        out.push((&from[..name_len], matchers));
        rest = &from[name_len + matchers.map_or(0, |m| m.len() + 2)..];
    }
    out
}
