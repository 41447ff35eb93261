//! Exceptions the host injects into a Linux guest instead of stopping its
//! VM, as KVM does (`arch/arm64/kvm/inject_fault.c`,
//! `arch/arm64/kvm/hyp/exception.c`): an external abort for an instruction
//! fetch or a stage-1 table walk outside RAM and for a stage-2 abort the
//! engine does not serve, an UNDEF for an exception class the host does not
//! expect. The guest's kernel then decides (SIGBUS to the process that did
//! it, or an oops).
//!
//! The host computes everything that depends only on the exit: ESR_EL1,
//! FAR_EL1, the vector's offset from VBAR_EL1 and the new PSTATE's bits
//! that come from the old one. The stub ([`crate::layout::ACT_INJECT`])
//! applies it: ELR_EL1 and SPSR_EL1 from ELR_EL2 and SPSR_EL2, ELR_EL2 =
//! VBAR_EL1 + the offset, and the two PSTATE bits that depend on
//! SCTLR_EL1 (PAN when SPAN is clear, SSBS when DSSBS is set), which the
//! host does not have at an exit.

/// ESR.EC of an instruction abort from a lower EL.
pub const EC_IABT_LOW: u64 = 0x20;
/// ESR.EC of an instruction abort from the current EL.
pub const EC_IABT_CUR: u64 = 0x21;
/// ESR.EC of a data abort from a lower EL.
pub const EC_DABT_LOW: u64 = 0x24;
/// ESR.EC of a data abort from the current EL.
pub const EC_DABT_CUR: u64 = 0x25;
/// ESR.IL: a 32-bit instruction.
pub const ESR_IL: u64 = 1 << 25;
/// ESR.ISS.FSC of a synchronous external abort, not on a table walk.
pub const FSC_EXTABT: u64 = 0x10;
/// ESR.ISS.FSC of an address size fault at level 0.
pub const FSC_ADDR_SIZE_L0: u64 = 0x00;

/// PSTATE.M\[3:0\] values (with M\[4\], the AArch32 bit, clear).
pub const MODE_EL0T: u64 = 0b0000;
/// EL1 with SP_EL0.
pub const MODE_EL1T: u64 = 0b0100;
/// EL1 with SP_EL1.
pub const MODE_EL1H: u64 = 0b0101;
/// PSTATE.M\[4\]: the exception came from AArch32.
pub const MODE_32: u64 = 1 << 4;

/// PSTATE bits the exception entry keeps from the old PSTATE: N, Z, C, V,
/// DIT and PAN (PAN may also be set by the stub, from SCTLR_EL1.SPAN).
pub const PSTATE_KEPT: u64 = 0xf << 28 | 1 << 24 | 1 << 22;
/// D, A, I, F: masked on entry.
pub const PSTATE_DAIF: u64 = 0xf << 6;

/// Where the synchronous exception's vector lies from VBAR_EL1, for a
/// guest that was in PSTATE `spsr` (SPSR_EL2 at the exit).
pub fn sync_vector(spsr: u64) -> u64 {
    let mode = spsr & (MODE_32 | 0xf);
    if mode == MODE_EL1H {
        0x200
    } else if mode == MODE_EL1T {
        0x000
    } else if mode & MODE_32 == 0 {
        0x400
    } else {
        0x600
    }
}

/// The PSTATE the guest's EL1 handler starts with, less the bits the stub
/// adds from SCTLR_EL1: `enter_exception64` for EL1h. UAO, SS, IL, BTYPE
/// and TCO are clear (TCO would be set where the VM had MTE: it has not).
pub fn entry_pstate(spsr: u64) -> u64 {
    (spsr & PSTATE_KEPT) | PSTATE_DAIF | MODE_EL1H
}

/// Whether the guest was at EL0 (or in AArch32): the exception comes
/// from a lower EL.
fn from_lower(spsr: u64) -> bool {
    spsr & MODE_32 != 0 || spsr & 0xf == MODE_EL0T
}

/// ESR_EL1 of an external abort: an instruction abort when `iabt`, else a
/// data abort, from the EL that SPSR `spsr` says, with IL copied from the
/// trapped syndrome `esr_el2`, and fault status `fsc` (`inject_abt64`).
pub fn abort_esr(iabt: bool, spsr: u64, esr_el2: u64, fsc: u64) -> u64 {
    let ec = match (iabt, from_lower(spsr)) {
        (true, true) => EC_IABT_LOW,
        (true, false) => EC_IABT_CUR,
        (false, true) => EC_DABT_LOW,
        (false, false) => EC_DABT_CUR,
    };
    ec << 26 | (esr_el2 & ESR_IL) | (fsc & 0x3f)
}

/// ESR_EL1 of an UNDEF (EC 0, unknown reason), IL copied from the trapped
/// syndrome (`inject_undef64`).
pub fn undef_esr(esr_el2: u64) -> u64 {
    esr_el2 & ESR_IL
}

/// One exception to deliver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Injection {
    /// ESR_EL1.
    pub esr: u64,
    /// FAR_EL1 (0 for an UNDEF, whose FAR is UNKNOWN).
    pub far: u64,
    /// The vector's offset from VBAR_EL1.
    pub vector: u64,
    /// The new PSTATE, less SCTLR_EL1's PAN and SSBS.
    pub pstate: u64,
}

impl Injection {
    /// An external abort for the trapped abort `esr_el2` at guest VA
    /// `far` (FAR_EL2) taken in PSTATE `spsr`: a prefetch abort for an
    /// instruction abort (its stage-1 walk's included), a data abort for
    /// a data abort (a load's or store's walk included), as KVM's
    /// `kvm_handle_guest_abort`. A stage-2 address size fault is reported
    /// as an address size fault at level 0 (`kvm_inject_size_fault`),
    /// everything else as a synchronous external abort.
    pub fn abort(esr_el2: u64, far: u64, spsr: u64) -> Injection {
        let ec = esr_el2 >> 26;
        let iabt = ec == EC_IABT_LOW || ec == EC_IABT_CUR;
        let fsc = if (esr_el2 & 0x3f) >> 2 == 0 {
            FSC_ADDR_SIZE_L0
        } else {
            FSC_EXTABT
        };
        Injection {
            esr: abort_esr(iabt, spsr, esr_el2, fsc),
            far,
            vector: sync_vector(spsr),
            pstate: entry_pstate(spsr),
        }
    }

    /// An UNDEF for the trapped exception `esr_el2` taken in PSTATE `spsr`.
    pub fn undef(esr_el2: u64, spsr: u64) -> Injection {
        Injection {
            esr: undef_esr(esr_el2),
            far: 0,
            vector: sync_vector(spsr),
            pstate: entry_pstate(spsr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EL0: u64 = MODE_EL0T;
    const EL1H: u64 = MODE_EL1H;

    #[test]
    fn vector_by_mode() {
        assert_eq!(sync_vector(EL1H), 0x200);
        assert_eq!(sync_vector(MODE_EL1T), 0x000);
        assert_eq!(sync_vector(EL0), 0x400);
        // AArch32 EL0 (usr).
        assert_eq!(sync_vector(MODE_32), 0x600);
        // Other PSTATE bits do not move the vector.
        assert_eq!(sync_vector(EL0 | 0xf << 28 | PSTATE_DAIF), 0x400);
        assert_eq!(sync_vector(EL1H | PSTATE_DAIF), 0x200);
    }

    #[test]
    fn pstate_masks_and_keeps_flags() {
        // From EL0 with N, C set, DIT, PAN, SSBS, SS, BTYPE, IL set: NZCV,
        // DIT and PAN stay; SSBS (from SCTLR), SS, IL, BTYPE go; DAIF set.
        let old =
            EL0 | 1 << 31 | 1 << 29 | 1 << 24 | 1 << 22 | 1 << 12 | 1 << 21 | 1 << 20 | 3 << 10;
        let new = entry_pstate(old);
        assert_eq!(
            new,
            1 << 31 | 1 << 29 | 1 << 24 | 1 << 22 | PSTATE_DAIF | EL1H
        );
        assert_eq!(entry_pstate(EL0), 0x3c5);
        assert_eq!(entry_pstate(EL1H | 1 << 23), 0x3c5, "UAO cleared");
    }

    #[test]
    fn abort_syndromes() {
        let il = ESR_IL;
        // A user fetch outside RAM (stage-2 translation fault, level 3).
        let iabt = EC_IABT_LOW << 26 | il | 0x07;
        let i = Injection::abort(iabt, 0x7f00_1000, EL0);
        assert_eq!(i.esr, 0x8200_0010);
        assert_eq!(i.far, 0x7f00_1000);
        assert_eq!((i.vector, i.pstate), (0x400, 0x3c5));
        // A kernel fetch: current EL.
        assert_eq!(Injection::abort(iabt, 0, EL1H).esr, 0x8600_0010);
        // A stage-1 walk (S1PTW) for a user load: a data abort from EL0.
        let walk = EC_DABT_LOW << 26 | il | 1 << 7 | 0x07;
        assert_eq!(Injection::abort(walk, 0, EL0).esr, 0x9200_0010);
        // An instruction fetch whose walk aborted: a prefetch abort.
        let iwalk = EC_IABT_LOW << 26 | il | 1 << 7 | 0x07;
        assert_eq!(Injection::abort(iwalk, 0, EL0).esr, 0x8200_0010);
        // In the kernel: a data abort from the current EL.
        assert_eq!(Injection::abort(walk, 0, EL1H).esr, 0x9600_0010);
        // A stage-2 address size fault (level 1): level 0 size fault.
        let size = EC_DABT_LOW << 26 | il | 1 << 24 | 0x01;
        assert_eq!(Injection::abort(size, 0, EL0).esr, 0x9200_0000);
        // An access flag fault: external abort. IL follows the trap.
        let af = EC_DABT_LOW << 26 | 0x0b;
        assert_eq!(Injection::abort(af, 0, EL0).esr, 0x9000_0010);
    }

    #[test]
    fn undef_syndrome() {
        let u = Injection::undef(0x3f << 26 | ESR_IL | 0x1234, EL1H);
        assert_eq!(u.esr, ESR_IL);
        assert_eq!((u.far, u.vector, u.pstate), (0, 0x200, 0x3c5));
        assert_eq!(Injection::undef(0x3f << 26, EL0).esr, 0);
        assert_eq!(Injection::undef(0x3f << 26, EL0).vector, 0x400);
    }
}
