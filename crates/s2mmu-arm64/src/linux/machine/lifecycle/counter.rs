//! The machine's physical counter without a command: one read through
//! the service CPU, anchored to the host's monotonic clock, carried
//! forward from there.
//!
//! QEMU derives the counter from its virtual clock, which is the host's
//! `CLOCK_MONOTONIC` plus an offset while the machine runs (the machine
//! is never stopped here), so the count moves by `CNTFRQ` a host second.
//! A restore needs the count only to place the guest's virtual count
//! (`CNTVOFF`); reading it through the service CPU is a round trip
//! inside a migration's downtime (1 to 9 ms measured on a loaded host).

use std::time::Instant;

/// A count read from the machine and the host instant its answer was
/// seen: the count was taken at or before `at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::linux) struct CounterAnchor {
    count: u64,
    at: Instant,
    hz: u64,
}

impl CounterAnchor {
    /// `count` read, its answer seen at `at`, the counter running at
    /// `hz`; `None` for a frequency of 0 (the stub has not reported it).
    pub(in crate::linux) fn new(count: u64, at: Instant, hz: u64) -> Option<CounterAnchor> {
        (hz != 0).then_some(CounterAnchor { count, at, hz })
    }

    /// The count at `now`, never above the machine's own: the count was
    /// taken at or before `at`, so this is a lower bound (a restore
    /// placed by it lets the guest's virtual count step forward by at
    /// most the read's round trip, never back).
    pub(in crate::linux) fn count_at(&self, now: Instant) -> u64 {
        let ns = now.saturating_duration_since(self.at).as_nanos();
        let ticks = ns * u128::from(self.hz) / 1_000_000_000;
        self.count
            .saturating_add(u64::try_from(ticks).unwrap_or(u64::MAX))
    }

    /// The host instant of the machine's count `count` (a stamp the stub
    /// made), never before the true one: the anchor's count was taken at
    /// or before `at`, so the instant found is late by at most the
    /// anchor read's round trip. A count before the anchor's gives `at`.
    pub(in crate::linux) fn instant_of(&self, count: u64) -> Instant {
        let ticks = u128::from(count.saturating_sub(self.count));
        let ns = ticks * 1_000_000_000 / u128::from(self.hz);
        self.at + std::time::Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_count_goes_on_at_the_counters_rate_from_the_read() {
        let t0 = Instant::now();
        let a = CounterAnchor::new(1_000, t0, 62_500_000).expect("a frequency");
        assert_eq!(a.count_at(t0), 1_000);
        // 1 ms at 62.5 MHz: 62,500 ticks.
        assert_eq!(a.count_at(t0 + Duration::from_millis(1)), 63_500);
        // 15 ns is not a whole tick of 16 ns: rounded down.
        assert_eq!(a.count_at(t0 + Duration::from_nanos(15)), 1_000);
        // An instant before the read gives the read's count, not less.
        let later = CounterAnchor::new(1_000, t0 + Duration::from_millis(1), 62_500_000)
            .expect("a frequency");
        assert_eq!(later.count_at(t0), 1_000);
    }

    #[test]
    fn a_stamp_maps_to_the_host_instant_at_the_counters_rate() {
        let t0 = Instant::now();
        let a = CounterAnchor::new(1_000, t0, 62_500_000).expect("a frequency");
        assert_eq!(a.instant_of(1_000), t0);
        // 62,500 ticks at 62.5 MHz: 1 ms after the anchor.
        assert_eq!(a.instant_of(63_500), t0 + Duration::from_millis(1));
        // One tick is 16 ns.
        assert_eq!(a.instant_of(1_001), t0 + Duration::from_nanos(16));
        // A stamp before the anchor's count: the anchor's instant.
        assert_eq!(a.instant_of(10), t0);
        // The two directions agree.
        assert_eq!(a.count_at(a.instant_of(5_000_000)), 5_000_000);
    }

    #[test]
    fn no_frequency_no_anchor() {
        assert_eq!(CounterAnchor::new(5, Instant::now(), 0), None);
    }

    #[test]
    fn a_count_near_the_top_saturates() {
        let t0 = Instant::now();
        let a = CounterAnchor::new(u64::MAX - 1, t0, 1_000_000_000).expect("a frequency");
        assert_eq!(a.count_at(t0 + Duration::from_secs(1)), u64::MAX);
    }
}
