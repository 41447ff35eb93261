//! The statistics every benchmark shares: medians, percentiles, minimum and
//! maximum, paired ratios, and [`Samples`], the raw measurements of one
//! result row with the JSON shape every benchmark's rows use.
//!
//! One place computes them so every table and JSON row means the same by
//! "median" (the mean of the two middle values for an even count) and so no
//! row presents a single measurement as a distribution: with one sample a
//! row carries `value_ns` and `runs: 1`, never `min_ns`/`median_ns`/`max_ns`.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
use std::time::Duration;

// Sorting, median and percentiles are s2mmu-stats', so a
// figure means the same in a migration's report and in a benchmark's row.
pub use s2mmu_stats::{median, median_u64, percentile, sorted};

/// The smallest of `values` (NaNs ignored).
pub fn min(values: &[f64]) -> Option<f64> {
    sorted(values).first().copied()
}

/// The largest of `values` (NaNs ignored).
pub fn max(values: &[f64]) -> Option<f64> {
    sorted(values).last().copied()
}

/// `after[i] / before[i]` over the runs both have, sorted (runs paired in
/// one process, so a machine-wide slowdown cancels out of each ratio). Runs
/// whose `before` is not positive give no ratio.
pub fn paired_ratios(before: &[f64], after: &[f64]) -> Vec<f64> {
    let ratios: Vec<f64> = before
        .iter()
        .zip(after)
        .filter(|(b, _)| **b > 0.0)
        .map(|(b, a)| a / b)
        .collect();
    sorted(&ratios)
}

/// The median of [`paired_ratios`], if any run pairs.
pub fn paired_ratio(before: &[f64], after: &[f64]) -> Option<f64> {
    median(&paired_ratios(before, after))
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The raw time measurements of one result row, in run order.
///
/// Serializes (and [`Samples::json`] gives) `runs`, `samples_ns` and, with
/// two or more samples, `median_ns`, `min_ns`, `max_ns`; with exactly one,
/// `value_ns` instead, so one run is never shown as a distribution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Samples {
    ns: Vec<u64>,
}

impl Samples {
    /// No samples yet.
    pub fn new() -> Self {
        Samples::default()
    }

    /// The samples `times`, in the order given.
    pub fn of(times: &[Duration]) -> Self {
        Samples {
            ns: times.iter().copied().map(nanos).collect(),
        }
    }

    /// Adds one measurement.
    pub fn push(&mut self, time: Duration) {
        self.ns.push(nanos(time));
    }

    /// How many measurements there are.
    pub fn runs(&self) -> usize {
        self.ns.len()
    }

    /// Each measurement in nanoseconds, in run order.
    pub fn nanos(&self) -> &[u64] {
        &self.ns
    }

    /// Each measurement in seconds, in run order (for [`paired_ratios`]).
    pub fn secs(&self) -> Vec<f64> {
        self.ns.iter().map(|&n| n as f64 / 1e9).collect()
    }

    /// The median (zero when empty).
    pub fn median(&self) -> Duration {
        Duration::from_nanos(median_u64(&self.ns).unwrap_or(0))
    }

    /// The `p`-th percentile (0 to 100; zero when empty or `p` is outside).
    pub fn percentile(&self, p: f64) -> Duration {
        let v: Vec<f64> = self.ns.iter().map(|&n| n as f64).collect();
        Duration::from_nanos(percentile(&v, p).map_or(0, |x| x.round() as u64))
    }

    /// The smallest measurement (zero when empty).
    pub fn min(&self) -> Duration {
        Duration::from_nanos(self.ns.iter().copied().min().unwrap_or(0))
    }

    /// The largest measurement (zero when empty).
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.ns.iter().copied().max().unwrap_or(0))
    }

    /// Median, minimum, maximum and count, without the raw samples.
    pub fn summary(&self) -> Summary {
        Summary {
            median: self.median(),
            min: self.min(),
            max: self.max(),
            runs: self.runs(),
        }
    }

    /// The row metrics as a JSON object (see the type's description).
    pub fn json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl Serialize for Samples {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self.ns.as_slice() {
            [] => {}
            [one] => m.serialize_entry("value_ns", one)?,
            _ => {
                m.serialize_entry("median_ns", &nanos(self.median()))?;
                m.serialize_entry("min_ns", &nanos(self.min()))?;
                m.serialize_entry("max_ns", &nanos(self.max()))?;
            }
        }
        m.serialize_entry("runs", &self.ns.len())?;
        m.serialize_entry("samples_ns", &self.ns)?;
        m.end()
    }
}

/// Median, minimum and maximum of a set of durations, and their count: the
/// copyable digest of [`Samples`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    /// Median.
    pub median: Duration,
    /// Minimum.
    pub min: Duration,
    /// Maximum.
    pub max: Duration,
    /// Number of samples.
    pub runs: usize,
}

impl Summary {
    /// Summarises `samples` (empty gives zeros).
    pub fn of(samples: &[Duration]) -> Summary {
        Samples::of(samples).summary()
    }

    /// The row metrics: `median_ns`, `min_ns`, `max_ns` and `runs`, or
    /// `value_ns` and `runs: 1` for a single sample (no raw samples: use
    /// [`Samples::json`] where they are kept).
    pub fn json(&self) -> Value {
        let ns = |d: Duration| Value::from(nanos(d));
        let mut m = serde_json::Map::new();
        match self.runs {
            0 => {}
            1 => {
                m.insert("value_ns".into(), ns(self.median));
            }
            _ => {
                m.insert("median_ns".into(), ns(self.median));
                m.insert("min_ns".into(), ns(self.min));
                m.insert("max_ns".into(), ns(self.max));
            }
        }
        m.insert("runs".into(), self.runs.into());
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn d(n: u64) -> Duration {
        Duration::from_nanos(n)
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
        assert_eq!(median_u64(&[1, 4]), Some(3));
        assert_eq!(median_u64(&[u64::MAX - 1, u64::MAX]), Some(u64::MAX));
        assert_eq!(median_u64(&[7]), Some(7));
        assert_eq!(median_u64(&[]), None);
    }

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let v = [10.0, 20.0, 30.0, 40.0, 50.0];
        assert_eq!(percentile(&v, 0.0), Some(10.0));
        assert_eq!(percentile(&v, 100.0), Some(50.0));
        assert_eq!(percentile(&v, 25.0), Some(20.0));
        assert_eq!(percentile(&v, 90.0), Some(46.0));
        assert_eq!(percentile(&v, 101.0), None);
        assert_eq!(percentile(&v, -1.0), None);
        assert_eq!((min(&v), max(&v)), (Some(10.0), Some(50.0)));
    }

    #[test]
    fn paired_ratio_is_the_median_of_per_run_ratios() {
        // Medians 2 and 6 (ratio 3) but per run 2x, 3x and 10x: the paired
        // median is 3; a zero baseline run is left out.
        let before = [1.0, 2.0, 3.0, 0.0];
        let after = [2.0, 6.0, 30.0, 5.0];
        assert_eq!(paired_ratios(&before, &after), vec![2.0, 3.0, 10.0]);
        assert_eq!(paired_ratio(&before, &after), Some(3.0));
        assert_eq!(paired_ratio(&[], &[]), None);
    }

    #[test]
    fn one_sample_is_not_a_distribution() {
        let one = Samples::of(&[d(7)]);
        assert_eq!(
            one.json(),
            json!({"value_ns": 7, "runs": 1, "samples_ns": [7]})
        );
        assert_eq!(
            Summary::of(&[d(7)]).json(),
            json!({"value_ns": 7, "runs": 1})
        );
        let three = Samples::of(&[d(5), d(1), d(3)]);
        assert_eq!(
            three.json(),
            json!({"median_ns": 3, "min_ns": 1, "max_ns": 5, "runs": 3, "samples_ns": [5, 1, 3]})
        );
        let s = three.summary();
        assert_eq!((s.median, s.min, s.max, s.runs), (d(3), d(1), d(5), 3));
        assert_eq!(Summary::of(&[d(1), d(3)]).median, d(2));
        assert_eq!(Samples::new().json(), json!({"runs": 0, "samples_ns": []}));
    }
}
