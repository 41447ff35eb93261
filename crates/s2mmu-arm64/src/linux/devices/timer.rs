//! The guest's generic timer: the virtual timer's interrupt, the EL2
//! control a Linux guest runs with, and the virtual count's offset that
//! keeps the guest's time across a pause or a move to another machine.
//!
//! The timer itself is the hardware's (QEMU's): the guest programs
//! CNTV_CVAL_EL0/CNTV_CTL_EL0 directly. Its expiry reaches EL2 as a
//! physical interrupt, and the host makes the virtual PPI pending at the
//! vGIC, as KVM's `kvm_timer_update_irq` does.

/// The virtual timer's PPI (INTID 27 on the `virt` machine).
pub const VTIMER_INTID: u32 = 27;

/// CNTHCTL_EL2 of a Linux guest: EL1 may read the physical counter and
/// use the physical timer (EL1PCTEN, EL1PCEN).
pub const CNTHCTL_LINUX: u64 = 3;

/// The PPI to make pending for a physical interrupt `intid` that ended
/// a vCPU's run: the virtual timer's own, or none (any other interrupt
/// for EL2 is only a kick).
pub(crate) fn virtual_ppi(intid: u32) -> Option<u32> {
    (intid == VTIMER_INTID).then_some(VTIMER_INTID)
}

/// CNTVOFF_EL2 under which the guest's virtual count reads `vct` while
/// the physical counter reads `now` (the count wraps, as the hardware's).
pub(crate) fn offset_for(now: u64, vct: u64) -> u64 {
    now.wrapping_sub(vct)
}

/// The guest's virtual count at a pause: the latest any vCPU saw (0 when
/// no vCPU was running).
pub(crate) fn paused_count(seen: impl Iterator<Item = u64>) -> u64 {
    seen.max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

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
