//! Auto-converge for KVM vCPUs, as QEMU's `cpu_throttle` does it: at a
//! throttle of `p` percent every vCPU, after each timeslice
//! ([`TIMESLICE`]) of running guest code, sleeps `p / (100 - p)`
//! timeslices, so that it runs `100 - p` percent of the time. A ticker
//! kicks the vCPUs out of `KVM_RUN` once per timeslice while the throttle
//! is on, so a guest that never exits is throttled too.
//!
//! The migration library asks for a delay per page the guest writes
//! ([`s2mmu_migrate::vm::GuestRun::set_throttle_ns`]) and derives it from
//! the guest's page rate (its counters). KVM does not count the guest's
//! writes; the adapter counts the pages its dirty log reports instead, so
//! the rate is the dirty rate, and the delay per page over the time a
//! page took unthrottled is the percentage: `p = ns / (ns + t)`, `t` the
//! vCPUs' run time per dirty page over the round before the throttle
//! came on (the window the library measured it over). The throttle keeps
//! that window itself, one snapshot per harvest of the dirty log (the
//! first `counters()` call that sees a new dirty-page count), so other
//! readers of the counters (a timeline's sampler) do not narrow it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The running time after which a throttled vCPU sleeps.
pub const TIMESLICE: Duration = Duration::from_millis(10);
/// The highest throttle (QEMU's `max-cpu-throttle` default).
pub const MAX_THROTTLE_PCT: u32 = 99;

/// The counters at the first `counters()` call after a harvest: (dirty
/// pages, run ns).
type Sample = (u64, u64);

/// The throttle's settings and what it did.
#[derive(Debug, Default)]
pub struct Throttle {
    pct: AtomicU32,
    max_pct: AtomicU32,
    sleeps: AtomicU64,
    slept_ns: AtomicU64,
    /// The snapshots of the two latest harvests (older, newer), and the
    /// run time per dirty page the current throttle was derived from.
    window: Mutex<([Sample; 2], Option<f64>)>,
}

impl Throttle {
    /// The throttle now, percent.
    pub fn pct(&self) -> u32 {
        self.pct.load(Ordering::Relaxed)
    }

    /// The highest throttle set so far.
    pub fn max_pct(&self) -> u32 {
        self.max_pct.load(Ordering::Relaxed)
    }

    /// Sleeps taken, and their nanoseconds.
    pub fn sleeps(&self) -> (u64, u64) {
        (
            self.sleeps.load(Ordering::Relaxed),
            self.slept_ns.load(Ordering::Relaxed),
        )
    }

    /// Sets the throttle, clamped to [`MAX_THROTTLE_PCT`].
    pub fn set_pct(&self, pct: u32) {
        let pct = pct.min(MAX_THROTTLE_PCT);
        self.pct.store(pct, Ordering::Relaxed);
        self.max_pct.fetch_max(pct, Ordering::Relaxed);
    }

    /// Records the counters just read: a new snapshot where the dirty
    /// log was harvested since the last one (its count moved), none
    /// otherwise, however often the counters are read between harvests.
    pub(crate) fn sample(&self, dirty_pages: u64, run_ns: u64) {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if dirty_pages != w.0[1].0 {
            w.0 = [w.0[1], (dirty_pages, run_ns)];
        }
    }

    /// The library's delay per dirty page as a percentage (see the
    /// module's text); 0 turns the throttle off.
    pub fn set_ns_per_page(&self, ns: u64) {
        let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if ns == 0 {
            w.1 = None;
            drop(w);
            self.set_pct(0);
            return;
        }
        let [(p0, r0), (p1, r1)] = w.0;
        let per_page = *w.1.get_or_insert_with(|| {
            let pages = p1.saturating_sub(p0).max(1);
            (r1.saturating_sub(r0) as f64 / pages as f64).max(1.0)
        });
        drop(w);
        let ns = ns as f64;
        self.set_pct((100.0 * ns / (ns + per_page)).round() as u32);
    }

    /// How long a vCPU that ran `ran` since its last sleep sleeps now
    /// (zero: it runs on).
    pub(crate) fn due(&self, ran: Duration) -> Duration {
        let pct = self.pct();
        if pct == 0 || ran < TIMESLICE {
            return Duration::ZERO;
        }
        ran * pct / (100 - pct)
    }

    /// Counts a sleep of `d`.
    pub(crate) fn slept(&self, d: Duration) {
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        self.slept_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vcpu_sleeps_its_share_of_each_timeslice() {
        let t = Throttle::default();
        assert_eq!(t.due(Duration::from_secs(1)), Duration::ZERO);
        t.set_pct(50);
        assert_eq!(t.due(TIMESLICE / 2), Duration::ZERO);
        assert_eq!(t.due(TIMESLICE), TIMESLICE);
        t.set_pct(250);
        assert_eq!(t.pct(), MAX_THROTTLE_PCT);
        assert_eq!(t.due(TIMESLICE), TIMESLICE * 99);
        t.set_pct(0);
        assert_eq!((t.pct(), t.max_pct()), (0, 99));
    }

    #[test]
    fn a_delay_per_page_is_the_share_of_the_time_a_page_took() {
        let t = Throttle::default();
        // 1000 dirty pages in 10 ms of running: 10 us per page.
        t.sample(5_000, 1_000_000);
        t.sample(6_000, 11_000_000);
        // Readers between harvests (the same count) leave the window.
        t.sample(6_000, 11_500_000);
        t.sample(6_000, 11_900_000);
        // QEMU's first step, 20 %: a delay of a quarter of that per page.
        t.set_ns_per_page(2_500);
        assert_eq!(t.pct(), 20);
        // Later rounds keep the unthrottled time per page.
        t.sample(6_100, 12_000_000);
        t.set_ns_per_page(10_000 * 3 / 7);
        assert_eq!(t.pct(), 30);
        t.set_ns_per_page(0);
        assert_eq!(t.pct(), 0);
    }
}
