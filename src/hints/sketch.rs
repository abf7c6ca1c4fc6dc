//! A small, mergeable log histogram for quantiles of positive values (ROC, upstream
//! latency) kept per history interval.
//!
//! Buckets grow by a factor of 2^(1/8) (about 9%) from [`Sketch::FLOOR`]; a quantile is
//! reported as its bucket's upper bound, so it errs high by at most 9%, which is the
//! safe side for "just above the high quantiles". Values at or below the floor,
//! negative ones included, share bucket 0. Only occupied buckets are stored, as a
//! sorted list of (bucket, count) pairs: 8 bytes a bucket.

use serde::Serialize;

/// Counts of values per logarithmic bucket.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sketch {
    /// Occupied buckets in increasing order, with their counts (saturating).
    buckets: Vec<(u16, u32)>,
    count: u64,
    max: f64,
}

/// Buckets per doubling.
const PER_DOUBLING: f64 = 8.0;

impl Sketch {
    /// Values at or below this share the lowest bucket.
    pub const FLOOR: f64 = 1e-3;

    /// An empty sketch.
    pub fn new() -> Self {
        Sketch::default()
    }

    /// The bucket that holds `value`.
    pub(crate) fn bucket(value: f64) -> u16 {
        if value.is_nan() || value <= Self::FLOOR {
            return 0;
        }
        let i = ((value / Self::FLOOR).log2() * PER_DOUBLING).ceil();
        // Capped: 2^(u16::MAX / 8) is far beyond any rate or latency.
        i.min(f64::from(u16::MAX)) as u16
    }

    fn upper_bound(bucket: u16) -> f64 {
        Self::FLOOR * (f64::from(bucket) / PER_DOUBLING).exp2()
    }

    /// Records one value.
    pub fn record(&mut self, value: f64) {
        self.record_n(value, 1);
    }

    /// Records `value` `n` times.
    pub fn record_n(&mut self, value: f64, n: u64) {
        self.record_at(Self::bucket(value), value, n);
    }

    /// Records `n` values known only by their `bucket` (read as its upper bound, which
    /// is then the maximum if none recorded is larger).
    pub(crate) fn record_in(&mut self, bucket: u16, n: u64) {
        self.record_at(bucket, Self::upper_bound(bucket), n);
    }

    fn record_at(&mut self, bucket: u16, value: f64, n: u64) {
        if n == 0 {
            return;
        }
        self.add(bucket, n);
        self.max = if self.count == 0 {
            value
        } else {
            self.max.max(value)
        };
        self.count += n;
    }

    fn add(&mut self, bucket: u16, n: u64) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        match self.buckets.binary_search_by_key(&bucket, |&(b, _)| b) {
            Ok(i) => self.buckets[i].1 = self.buckets[i].1.saturating_add(n),
            Err(i) => self.buckets.insert(i, (bucket, n)),
        }
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Sketch) {
        if other.count == 0 {
            return;
        }
        for &(b, n) in &other.buckets {
            self.add(b, u64::from(n));
        }
        self.max = if self.count == 0 {
            other.max
        } else {
            self.max.max(other.max)
        };
        self.count += other.count;
    }

    /// Gives back the spare capacity of the bucket list (for a sketch that is done).
    pub(crate) fn compact(&mut self) {
        self.buckets.shrink_to_fit();
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The largest value recorded (exact), if any.
    pub fn max(&self) -> Option<f64> {
        (self.count > 0).then_some(self.max)
    }

    /// Values recorded in buckets above the one that holds `value`: those certainly
    /// above it (a value in its bucket may lie up to 9% either side of it).
    pub fn count_above(&self, value: f64) -> u64 {
        let at = Self::bucket(value);
        self.buckets
            .iter()
            .filter(|&&(b, _)| b > at)
            .map(|&(_, n)| u64::from(n))
            .sum()
    }

    /// The value below which a fraction `q` of the values lie: the upper bound of
    /// the bucket holding the `q`-th value, never above the exact maximum. `None`
    /// when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for &(b, n) in &self.buckets {
            seen += u64::from(n);
            if seen >= rank {
                let bound = if b == 0 {
                    Self::FLOOR
                } else {
                    Self::upper_bound(b)
                };
                return Some(bound.min(self.max.max(Self::FLOOR)));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_err_high_by_at_most_one_bucket() {
        let mut s = Sketch::new();
        for v in 1..=1000 {
            s.record(f64::from(v));
        }
        for (q, exact) in [(0.5, 500.0), (0.9, 900.0), (0.99, 990.0)] {
            let got = s.quantile(q).unwrap();
            assert!(
                got >= exact && got <= exact * 1.0906,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!(s.quantile(1.0), Some(1000.0));
        assert_eq!(s.max(), Some(1000.0));
    }

    #[test]
    fn values_above_count_only_buckets_above_the_values_own() {
        let mut s = Sketch::new();
        s.record_n(0.4, 97);
        // The meter's 0.5 s bound, recorded as itself: in the bucket of 0.5 (up to
        // 0.512), not above it.
        s.record_n(0.5, 2);
        s.record(1.0);
        assert_eq!(s.count_above(0.5), 1);
        assert_eq!(s.count_above(0.3), 100);
        assert_eq!(s.count_above(2.0), 0);
        assert_eq!(Sketch::new().count_above(0.5), 0);
    }

    #[test]
    fn merge_equals_recording_everything_in_one() {
        let (mut a, mut b, mut all) = (Sketch::new(), Sketch::new(), Sketch::new());
        for v in [0.5, 3.0, 40.0, -2.0] {
            a.record(v);
            all.record(v);
        }
        for v in [7.0, 900.0] {
            b.record(v);
            all.record(v);
        }
        a.merge(&b);
        assert_eq!(a, all);
        assert_eq!(a.count(), 6);
    }

    #[test]
    fn negative_and_tiny_values_share_the_floor() {
        let mut s = Sketch::new();
        s.record(-5.0);
        s.record(0.0);
        assert_eq!(s.quantile(0.99), Some(Sketch::FLOOR));
        assert_eq!(s.max(), Some(0.0));
        assert_eq!(Sketch::new().quantile(0.5), None);
    }
}
