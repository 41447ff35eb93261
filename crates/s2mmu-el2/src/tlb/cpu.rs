//! The instructions themselves, on the running CPU (aarch64 only; off it,
//! [`Cpu`] cannot be made and [`features`] reports none).

use s2mmu::tlb::arm64::{Arm64TlbiFeatures, Insn, TlbiSink};

/// Executes the instructions on the running CPU at EL2.
#[derive(Debug)]
pub struct Cpu {
    _private: (),
}

impl Cpu {
    /// The executor for this CPU.
    ///
    /// # Safety
    /// The caller runs at EL2 with `VTTBR_EL2` holding the VM's VMID while
    /// instructions execute (the by-VMID invalidations act on it).
    #[cfg(target_arch = "aarch64")]
    pub unsafe fn new() -> Self {
        Cpu { _private: () }
    }
}

/// The TLB features of the running CPU: FEAT_TLBIRANGE from
/// `ID_AA64ISAR0_EL1.TLB` (bits \[59:56\] = 2), FEAT_TTL from
/// `ID_AA64MMFR2_EL1.TTL`; no LPA2 (the stage 2 uses 48-bit output
/// addresses). Off aarch64: none.
pub fn features() -> Arm64TlbiFeatures {
    #[cfg(target_arch = "aarch64")]
    {
        use aarch64_cpu::registers::{Readable, ID_AA64ISAR0_EL1, ID_AA64MMFR2_EL1};
        Arm64TlbiFeatures {
            range: (ID_AA64ISAR0_EL1.get() >> 56) & 0xf >= 2,
            ttl: ID_AA64MMFR2_EL1.read(ID_AA64MMFR2_EL1::TTL) != 0,
            lpa2: false,
        }
    }
    #[cfg(not(target_arch = "aarch64"))]
    Arm64TlbiFeatures {
        range: false,
        ttl: false,
        lpa2: false,
    }
}

#[cfg(target_arch = "aarch64")]
impl TlbiSink for Cpu {
    #[inline]
    fn emit(&self, insn: Insn) {
        use core::arch::asm;
        use s2mmu::tlb::arm64::{Barrier, TlbiOp};
        // SAFETY: barriers and TLB invalidations change no memory or
        // register the compiler knows of; `Cpu::new`'s caller runs at EL2,
        // where they are permitted. The TLBIs use their `SYS` encodings
        // (op1 4: EL2's stage-2 operations) so no assembler extension is
        // needed: IPAS2E1IS = (4, c8, c0, 1), IPAS2LE1IS = (4, c8, c0, 5),
        // IPAS2E1 = (4, c8, c4, 1), IPAS2LE1 = (4, c8, c4, 5),
        // RIPAS2E1IS = (4, c8, c0, 2), VMALLE1IS = (0, c8, c3, 0),
        // VMALLE1 = (0, c8, c7, 0), VMALLS12E1IS = (4, c8, c3, 6).
        unsafe {
            match insn {
                Insn::Barrier(b) => match b {
                    Barrier::DsbIshst => asm!("dsb ishst", options(nostack, preserves_flags)),
                    Barrier::DsbIsh => asm!("dsb ish", options(nostack, preserves_flags)),
                    Barrier::DsbNshst => asm!("dsb nshst", options(nostack, preserves_flags)),
                    Barrier::DsbNsh => asm!("dsb nsh", options(nostack, preserves_flags)),
                    Barrier::Isb => asm!("isb", options(nostack, preserves_flags)),
                },
                Insn::Tlbi { op, operand: x } => match op {
                    TlbiOp::Ipas2e1is => {
                        asm!("sys #4, c8, c0, #1, {}", in(reg) x, options(nostack))
                    }
                    TlbiOp::Ipas2le1is => {
                        asm!("sys #4, c8, c0, #5, {}", in(reg) x, options(nostack))
                    }
                    TlbiOp::Ipas2e1 => asm!("sys #4, c8, c4, #1, {}", in(reg) x, options(nostack)),
                    TlbiOp::Ipas2le1 => asm!("sys #4, c8, c4, #5, {}", in(reg) x, options(nostack)),
                    TlbiOp::Ripas2e1is => {
                        asm!("sys #4, c8, c0, #2, {}", in(reg) x, options(nostack))
                    }
                    TlbiOp::Vmalle1is => asm!("sys #0, c8, c3, #0, xzr", options(nostack)),
                    TlbiOp::Vmalle1 => asm!("sys #0, c8, c7, #0, xzr", options(nostack)),
                    TlbiOp::Vmalls12e1is => asm!("sys #4, c8, c3, #6, xzr", options(nostack)),
                },
            }
        }
    }
}

/// Off aarch64 a [`Cpu`] cannot be made; this lets the backend's type
/// name it on every target.
#[cfg(not(target_arch = "aarch64"))]
impl TlbiSink for Cpu {
    fn emit(&self, _insn: Insn) {}
}
