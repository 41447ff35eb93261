//! The statistics every s2mmu report uses (the migration session's
//! figures, the benchmarks' tables, the KVM and arm64 measurements): the
//! median of an even count is the mean of the two middle values (rounded
//! half up for whole counts); percentiles interpolate between ranks. One
//! definition, so a figure means the same everywhere.
//!
//! The crate has no dependencies and no types: functions over slices.
//! - [`median`] and [`percentile`] of `f64`s (NaNs ignored, `None` for
//!   none);
//! - [`median_u64`] of whole counts and [`median_duration`] of
//!   [`Duration`]s, which stay whole;
//! - [`sorted`], the order the others rank in.
//!
//! ```
//! use s2mmu_stats::{median, median_duration, median_u64, percentile};
//! use std::time::Duration;
//!
//! // Five runs' downtimes in milliseconds, one of them an outlier.
//! let runs = [6.4, 4.5, 16.8, 5.9, 6.1];
//! assert_eq!(median(&runs), Some(6.1));
//! assert_eq!(percentile(&runs, 0.0), Some(4.5));
//! assert_eq!(percentile(&[1.0, 2.0], 50.0), Some(1.5));
//! // Whole counts: the mean of the middle two, rounded half up.
//! assert_eq!(median_u64(&[3, 4]), Some(4));
//! let d = [Duration::from_millis(2), Duration::from_millis(3)];
//! assert_eq!(median_duration(&d), Some(Duration::from_micros(2500)));
//! assert_eq!(median(&[]), None);
//! ```

#![warn(missing_docs)]

use std::time::Duration;

/// `values` sorted ascending, NaNs dropped (a NaN has no rank).
pub fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The median of `values` (NaNs ignored); `None` when there is none.
pub fn median(values: &[f64]) -> Option<f64> {
    percentile(values, 50.0)
}

/// The `p`-th percentile (0 to 100) of `values`, NaNs ignored,
/// interpolated linearly between the two closest ranks. `None` when
/// `values` holds no number or `p` is outside 0..=100.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if !(0.0..=100.0).contains(&p) {
        return None;
    }
    let v = sorted(values);
    let last = v.len().checked_sub(1)?;
    let rank = p / 100.0 * last as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    Some(v[lo] + (v[hi] - v[lo]) * frac)
}

/// The median of whole counts, rounded half up; `None` for none.
pub fn median_u64(values: &[u64]) -> Option<u64> {
    let mut v = values.to_vec();
    v.sort_unstable();
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        // The mean of the middle two without overflow, rounded half up.
        _ => {
            let (a, b) = (v[n / 2 - 1], v[n / 2]);
            Some(a + (b - a).div_ceil(2))
        }
    }
}

/// The median of durations, by [`median_u64`] over their nanoseconds
/// (a duration past `u64::MAX` ns counts as that); `None` for none.
pub fn median_duration(values: &[Duration]) -> Option<Duration> {
    let ns: Vec<u64> = values
        .iter()
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .collect();
    median_u64(&ns).map(Duration::from_nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles_of_even_and_odd_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN]), None);
        assert_eq!(median_u64(&[1, 2]), Some(2));
        assert_eq!(median_u64(&[]), None);
        assert_eq!(percentile(&[0.0, 10.0], 99.0), Some(9.9));
        assert_eq!(percentile(&[0.0], 101.0), None);
        let ms = Duration::from_millis;
        assert_eq!(
            median_duration(&[ms(4), ms(1), ms(2), ms(3)]),
            Some(Duration::from_micros(2500))
        );
        assert_eq!(median_duration(&[]), None);
    }
}
