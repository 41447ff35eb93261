//! The guest's generic timer: the virtual timer's interrupt, the EL2
//! control a Linux guest runs with, and the virtual count's offset that
//! keeps the guest's time across a pause or a move to another machine.
//!
//! The timer itself is the hardware's (QEMU's): the guest programs
//! CNTV_CVAL_EL0/CNTV_CTL_EL0 directly. Its expiry reaches EL2 as a
//! physical interrupt, and the host makes the virtual PPI pending at the
//! vGIC, as KVM's `kvm_timer_update_irq` does.
//!
//! So the timer has no registers on the MMIO bus: [`VirtualTimer`] is the
//! host's part of it, the count's offset each vCPU enters its guest with
//! and the PPI its expiry raises; on the bus it claims its expiry's
//! physical interrupt. It saves its state as the guest's count
//! at a pause ([`VirtualTimer::save`]) and is built again from it on
//! any host ([`VirtualTimer::restore`]).

/// The virtual timer's PPI (INTID 27 on the `virt` machine).
pub const VTIMER_INTID: u32 = 27;

/// CNTHCTL_EL2 of a Linux guest: EL1 may read the physical counter and
/// use the physical timer (EL1PCTEN, EL1PCEN).
pub const CNTHCTL_LINUX: u64 = 3;

/// The PPI to make pending for a physical interrupt `intid` that ended
/// a vCPU's run: the virtual timer's own, or none (any other interrupt
/// for EL2 is only a kick).
fn virtual_ppi(intid: u32) -> Option<u32> {
    (intid == VTIMER_INTID).then_some(VTIMER_INTID)
}

/// CNTVOFF_EL2 under which the guest's virtual count reads `vct` while
/// the physical counter reads `now` (the count wraps, as the hardware's).
fn offset_for(now: u64, vct: u64) -> u64 {
    now.wrapping_sub(vct)
}

/// The guest's virtual count at a pause: the latest any vCPU saw (0 when
/// no vCPU was running).
fn paused_count(seen: impl Iterator<Item = u64>) -> u64 {
    seen.max().unwrap_or(0)
}

/// The host's part of the guest's timer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtualTimer {
    cntvoff: u64,
}

/// What the timer carries across a pause or a move: the guest's virtual
/// count when it was paused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerState {
    /// The latest virtual count a vCPU saw before the pause.
    pub vct: u64,
}

impl VirtualTimer {
    /// The timer of a guest that starts now: its virtual count is the
    /// physical counter (an offset of 0).
    pub fn new() -> VirtualTimer {
        VirtualTimer::default()
    }

    /// CNTVOFF_EL2 of every vCPU's entry.
    pub fn cntvoff(&self) -> u64 {
        self.cntvoff
    }

    /// The PPI to make pending for the physical interrupt `intid` that
    /// ended a vCPU's run, if it was the timer's own.
    pub fn interrupt(&self, intid: u32) -> Option<u32> {
        virtual_ppi(intid)
    }

    /// The state at a pause, from the virtual counts the vCPUs saw.
    pub fn save(&self, seen: impl Iterator<Item = u64>) -> TimerState {
        TimerState {
            vct: paused_count(seen),
        }
    }

    /// The timer under which the guest's count goes on from `s.vct`
    /// while the host's physical counter reads `now`.
    pub fn restore(s: &TimerState, now: u64) -> VirtualTimer {
        VirtualTimer {
            cntvoff: offset_for(now, s.vct),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_timer_goes_on_from_the_count_it_saved() {
        let t = VirtualTimer::new();
        assert_eq!(t.cntvoff(), 0);
        let s = t.save([7, 1_000, 20].into_iter());
        assert_eq!(s, TimerState { vct: 1_000 });
        // Restored where the physical counter reads 5,000: the guest's
        // count (physical - offset) reads 1,000 there.
        let r = VirtualTimer::restore(&s, 5_000);
        assert_eq!(5_000 - r.cntvoff(), 1_000);
        assert_eq!(r.interrupt(VTIMER_INTID), Some(VTIMER_INTID));
        assert_eq!(r.interrupt(30), None);
    }

    #[test]
    fn only_the_virtual_timer_raises_its_ppi_and_the_offset_wraps() {
        assert_eq!(virtual_ppi(VTIMER_INTID), Some(27));
        assert_eq!(virtual_ppi(26), None);
        assert_eq!(offset_for(100, 40), 60);
        assert_eq!(offset_for(5, 10), u64::MAX - 4);
        assert_eq!(paused_count([3, 9, 4].into_iter()), 9);
        assert_eq!(paused_count(std::iter::empty()), 0);
    }
}
