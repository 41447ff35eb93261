//! A guest's stage-2 abort as EL2 receives it (`ESR_EL2`, `FAR_EL2`,
//! `HPFAR_EL2`), decoded into what the engine needs, and what EL2 did with
//! it.

use s2mmu::mmu::FaultKind;

/// `ESR_EL2.EC` of a data abort from a lower exception level.
pub const EC_DABT_LOW: u64 = 0x24;
/// `ESR_EL2.EC` of an instruction abort from a lower exception level.
pub const EC_IABT_LOW: u64 = 0x20;

/// The registers of one abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stage2Abort {
    /// `ESR_EL2`.
    pub esr: u64,
    /// `FAR_EL2`: the faulting virtual address (its page offset is the
    /// IPA's, the guest's stage 1 maps whole pages).
    pub far: u64,
    /// `HPFAR_EL2`: FIPA \[43:4\] holds IPA\[51:12\].
    pub hpfar: u64,
}

impl Stage2Abort {
    /// The exception class.
    pub fn ec(&self) -> u64 {
        (self.esr >> 26) & 0x3f
    }

    /// Whether this is a data or instruction abort from the guest.
    pub fn is_abort(&self) -> bool {
        matches!(self.ec(), EC_DABT_LOW | EC_IABT_LOW)
    }

    /// The faulting IPA, from `HPFAR_EL2`. The architecture leaves HPFAR
    /// UNKNOWN on a permission fault that is not on a stage-1 walk (and
    /// some CPUs' errata on others); QEMU fills it in always. On such
    /// hardware the address must come from translating `FAR_EL2` with
    /// `AT S1E1R` as KVM's `__translate_far_to_hpfar` does, which this
    /// entry does not do yet.
    pub fn ipa(&self) -> u64 {
        (((self.hpfar >> 4) & ((1 << 40) - 1)) << 12) | (self.far & 0xfff)
    }

    /// Whether the access was a write. On a stage-1 table walk (`S1PTW`)
    /// only a permission fault is (the walker's hardware update of an
    /// access flag or dirty state in a write-protected table page), as
    /// KVM's `kvm_is_write_fault` says; otherwise `WnR` of a data abort
    /// that is not a cache maintenance operation (`CM`); an instruction
    /// fetch is not.
    pub fn is_write(&self) -> bool {
        if self.esr & (1 << 7) != 0 {
            return matches!(self.kind(), Some(FaultKind::Permission { .. }));
        }
        self.ec() == EC_DABT_LOW && self.esr & (1 << 6) != 0 && self.esr & (1 << 8) == 0
    }

    /// The fault's kind from its status code (DFSC/IFSC \[5:0\]):
    /// translation (0b0001LL) or access flag (0b0010LL) faults are
    /// [`FaultKind::Translation`] (the engine maps), permission faults
    /// (0b0011LL) [`FaultKind::Permission`] at level LL; `None` for any
    /// other status (an external abort, an alignment fault) or class.
    pub fn kind(&self) -> Option<FaultKind> {
        if !self.is_abort() {
            return None;
        }
        let fsc = self.esr & 0x3f;
        let level = (fsc & 3) as u32;
        match fsc >> 2 {
            0b0001 | 0b0010 => Some(FaultKind::Translation),
            0b0011 => Some(FaultKind::Permission { level }),
            _ => None,
        }
    }
}

/// Why EL2 refused to map an aborting address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The IPA is in EL2's carve-out: no slot may cover it, and none does.
    CarveOut,
    /// No slot covers the IPA (an MMIO access, for the host's devices).
    NoSlot,
    /// A write to a read-only slot.
    ReadOnly,
    /// Not a stage-2 abort EL2 handles (another class or status).
    NotStage2,
}

/// What EL2 did with an abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AbortOutcome {
    /// Mapped or marked dirty: the guest retries the access and goes on.
    Handled {
        /// A write-protection fault (a dirty mark) rather than a first touch.
        permission: bool,
    },
    /// Not mapped: EL2 refused the access (the caller decides what the
    /// guest sees; the image skips the access and reports it).
    Refused(Refusal),
    /// The vCPU's dirty ring is soft-full: nothing changed, and the vCPU
    /// exits to the host, which harvests and resets the rings
    /// (`RING_HARVEST`, `RING_RESET`) and resumes it; the access is then
    /// retried and goes on (KVM's `KVM_EXIT_DIRTY_RING_FULL`).
    RingFull,
    /// Post-copy: the page at `ipa` (of a post-copy slot) has not been
    /// received; nothing is mapped. The host fills its backing and sends
    /// `PAGE_READY`, which maps it; the vCPU resumes and its access goes
    /// on.
    PageMissing {
        /// The page's guest-physical address.
        ipa: u64,
    },
    /// Needs the host: an engine error, or no VM or vCPU for the abort.
    ToHost,
    /// Mapped or marked dirty as [`AbortOutcome::Handled`], and the vCPU
    /// owes a wait for the pages it dirtied ([`crate::pace`]): it exits to
    /// the host, which waits this long before it resumes the guest; the
    /// access is then retried and goes on.
    Paced {
        /// Auto-converge's throttle owed, in nanoseconds.
        throttle_ns: u64,
        /// The lead over the dirty limit's pace, in nanoseconds.
        pace_ns: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dabt(fsc: u64, write: bool) -> u64 {
        EC_DABT_LOW << 26 | u64::from(write) << 6 | fsc
    }

    #[test]
    fn decodes_ipa_write_and_kind() {
        let a = Stage2Abort {
            esr: dabt(0b000111, true),
            far: 0x1234_5678,
            hpfar: (0x8000_5000u64 >> 12) << 4,
        };
        assert_eq!(a.ipa(), 0x8000_5678);
        assert!(a.is_write());
        assert_eq!(a.kind(), Some(FaultKind::Translation));
        let p = Stage2Abort {
            esr: dabt(0b001111, true),
            ..a
        };
        assert_eq!(p.kind(), Some(FaultKind::Permission { level: 3 }));
        let cm = Stage2Abort {
            esr: dabt(0b001111, true) | 1 << 8,
            ..a
        };
        assert!(!cm.is_write(), "cache maintenance is not a write");
        let ext = Stage2Abort {
            esr: dabt(0b010000, false),
            ..a
        };
        assert_eq!(ext.kind(), None);
        let iabt = Stage2Abort {
            esr: EC_IABT_LOW << 26 | 0b000110 | 1 << 6,
            ..a
        };
        assert!(!iabt.is_write());
        assert_eq!(iabt.kind(), Some(FaultKind::Translation));
        let hvc = Stage2Abort {
            esr: 0x16 << 26,
            ..a
        };
        assert!(!hvc.is_abort());
        assert_eq!(hvc.kind(), None);
    }
}
