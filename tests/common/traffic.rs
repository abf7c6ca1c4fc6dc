//! Traffic profiles the hint tests share, as `(t_seconds, rate)` points.

/// 100 req/s with one second at 600 every 10 s, for 60 s: bursts a bucket can absorb,
/// mean demand 150 req/s.
pub(crate) fn bursts() -> Vec<(f64, f64)> {
    let mut points = Vec::new();
    for k in 0..6 {
        let t = f64::from(k) * 10.0;
        points.extend([
            (t, 100.0),
            (t + 9.0, 100.0),
            (t + 9.0, 600.0),
            (t + 10.0, 600.0),
        ]);
    }
    points.push((60.0, 100.0));
    points
}
