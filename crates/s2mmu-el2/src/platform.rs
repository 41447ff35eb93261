//! The engine's platform at EL2: `spin`'s raw locks behind `lock_api`, the
//! generic timer as the clock, snapshot cells locked by the spin mutex.
//!
//! EL2 runs with interrupts masked, so a spin lock is never taken from a
//! handler that preempted its holder on the same CPU.

use s2mmu::sync::{Clock, LockedPlatform};

/// `spin`'s test-and-set mutex as a `lock_api` raw mutex.
pub type RawMutex = spin::mutex::SpinMutex<()>;
/// `spin`'s reader-writer lock as a `lock_api` raw rwlock.
pub type RawRwLock = spin::RwLock<()>;

/// The EL2 platform: [`RawMutex`], [`RawRwLock`], [`GenericTimer`], cells
/// locked by [`RawMutex`].
pub type El2Platform = LockedPlatform<RawMutex, RawRwLock, GenericTimer>;

/// The Arm generic timer: `CNTVCT_EL0` ticks at `CNTFRQ_EL0` Hz. Off
/// aarch64 (the host's unit tests) there is no counter: [`Clock::now_ns`]
/// is `None` and the engine reports durations as 0.
#[derive(Debug, Clone, Copy)]
pub enum GenericTimer {}

impl GenericTimer {
    /// The virtual counter now (`ISB` first, so the read is not taken
    /// early), or `None` off aarch64.
    #[inline]
    pub fn ticks() -> Option<u64> {
        #[cfg(target_arch = "aarch64")]
        {
            use aarch64_cpu::asm::barrier;
            use aarch64_cpu::registers::{Readable, CNTVCT_EL0};
            barrier::isb(barrier::SY);
            Some(CNTVCT_EL0.get())
        }
        #[cfg(not(target_arch = "aarch64"))]
        None
    }

    /// The counter's frequency in Hz, or `None` off aarch64 (or where the
    /// firmware left it 0).
    pub fn frequency() -> Option<u64> {
        #[cfg(target_arch = "aarch64")]
        {
            use aarch64_cpu::registers::{Readable, CNTFRQ_EL0};
            Some(CNTFRQ_EL0.get() & 0xffff_ffff).filter(|&f| f != 0)
        }
        #[cfg(not(target_arch = "aarch64"))]
        None
    }

    /// `ticks` at `hz` in nanoseconds (saturating).
    pub fn ticks_to_ns(ticks: u64, hz: u64) -> u64 {
        if hz == 0 {
            return 0;
        }
        let ns = u128::from(ticks) * 1_000_000_000 / u128::from(hz);
        u64::try_from(ns).unwrap_or(u64::MAX)
    }
}

impl Clock for GenericTimer {
    fn now_ns() -> Option<u64> {
        let hz = Self::frequency()?;
        Some(Self::ticks_to_ns(Self::ticks()?, hz))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_at_the_counter_frequency() {
        // QEMU's virt machine runs the counter at 62.5 MHz: 16 ns a tick.
        assert_eq!(GenericTimer::ticks_to_ns(1000, 62_500_000), 16_000);
        assert_eq!(GenericTimer::ticks_to_ns(5, 0), 0);
        assert_eq!(GenericTimer::ticks_to_ns(u64::MAX, 1), u64::MAX);
    }

    #[cfg(not(target_arch = "aarch64"))]
    #[test]
    fn off_aarch64_there_is_no_clock() {
        assert_eq!(GenericTimer::now_ns(), None);
    }
}
