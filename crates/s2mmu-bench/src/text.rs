//! What the benchmarks' text reports share: durations in a readable unit,
//! seconds as KVM's selftests print them, and the verdict of a target line.

use std::time::Duration;

/// Seconds with nine decimals, as the KVM selftests print them.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(s2mmu_bench::text::secs(Duration::from_millis(1500)), "1.500000000s");
/// ```
pub fn secs(d: Duration) -> String {
    format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
}

/// A duration in the most readable unit (ns, us, ms or s).
///
/// ```
/// use std::time::Duration;
/// assert_eq!(s2mmu_bench::text::human(Duration::from_micros(1500)), "1.500 ms");
/// ```
pub fn human(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.3} ms", ns / 1e6)
    } else {
        format!("{:.3} s", ns / 1e9)
    }
}

/// "PASS" or "MISS" for a line judged against its target.
pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_the_magnitude() {
        assert_eq!(human(Duration::from_nanos(999)), "999 ns");
        assert_eq!(human(Duration::from_nanos(1_500)), "1.50 us");
        assert_eq!(human(Duration::from_secs(2)), "2.000 s");
        assert_eq!(secs(Duration::from_nanos(5)), "0.000000005s");
        assert_eq!((verdict(true), verdict(false)), ("PASS", "MISS"));
    }
}
