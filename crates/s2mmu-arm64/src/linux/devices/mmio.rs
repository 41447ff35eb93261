//! A guest's MMIO exit, decoded without QEMU: the syndrome (ESR_EL2's ISS
//! for a data abort) and the value a load puts in the guest's register.
//! The access itself goes to the bus ([`crate::linux::bus::MmioBus::access`]),
//! where every device model sits, the vGIC's frames included.
//!
//! Every field here comes from the guest: the IPA, the width, the
//! register, the value, the sign extension, the PC. The functions are
//! total over them (no panic, no overflow, no access outside a model's
//! registers), which `fuzz/fuzz_targets/devices.rs` checks.

/// ESR_EL2.EC of an instruction abort from a lower EL.
const EC_IABT_LOW: u64 = 0x20;
/// ISS.S1PTW: the abort was on a stage-1 table walk.
const ISS_S1PTW: u64 = 1 << 7;

/// The instruction after the one at `elr`. A guest may run code in the
/// last 4 bytes of the address space; the PC then wraps to 0, as the
/// architecture's PC arithmetic does, instead of overflowing.
pub fn next_insn(elr: u64) -> u64 {
    elr.wrapping_add(4)
}

/// A guest load or store that the host serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioOp {
    /// The guest-physical address.
    pub ipa: u64,
    /// Bytes: 1, 2, 4 or 8.
    pub size: u64,
    /// The register (ISS.SRT; 31 is XZR).
    pub srt: u64,
    /// `Some(value)`, masked to `size`, for a store.
    pub write: Option<u64>,
}

/// What an abort outside RAM is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmioDecode {
    /// A single-register load or store the device models serve.
    Access(MmioOp),
    /// An instruction fetch or a stage-1 table walk outside RAM: nothing
    /// a device answers.
    FetchOrWalk,
    /// A cache maintenance instruction by VA (ISS.CM set) to an address no
    /// memslot covers: nothing is cached there, so the instruction is
    /// skipped, as KVM does.
    CacheMaintenance,
    /// No valid syndrome (ISS.ISV clear: a pair, a writeback, SIMD): the
    /// host cannot emulate it.
    NoSyndrome,
}

/// ISS.CM: the abort came from a cache maintenance instruction.
const ISS_CM: u64 = 1 << 8;

/// The bits of a `size`-byte access.
fn mask(size: u64) -> u64 {
    if size >= 8 {
        u64::MAX
    } else {
        (1u64 << (size * 8)) - 1
    }
}

/// Decodes an abort at `ipa` with syndrome `esr`; `gpr(n)` reads the
/// guest's x`n` (0 for 31) for a store's value.
pub fn decode(esr: u64, ipa: u64, gpr: impl Fn(u64) -> u64) -> MmioDecode {
    if esr >> 26 == EC_IABT_LOW || esr & ISS_S1PTW != 0 {
        return MmioDecode::FetchOrWalk;
    }
    if esr & ISS_CM != 0 {
        return MmioDecode::CacheMaintenance;
    }
    if esr & (1 << 24) == 0 {
        return MmioDecode::NoSyndrome;
    }
    let size = 1u64 << ((esr >> 22) & 3);
    let srt = (esr >> 16) & 0x1f;
    let write = (esr & (1 << 6) != 0).then(|| gpr(srt) & mask(size));
    MmioDecode::Access(MmioOp {
        ipa,
        size,
        srt,
        write,
    })
}

/// The register value of a `size`-byte load that read `v`: sign-extended
/// when ISS.SSE is set, cut to 32 bits when ISS.SF is clear (a W
/// register).
pub fn load_value(esr: u64, size: u64, v: u64) -> u64 {
    let m = mask(size);
    let mut v = v & m;
    let sse = esr & (1 << 21) != 0;
    let sf = esr & (1 << 15) != 0;
    if sse && v & (1 << (size.clamp(1, 8) * 8 - 1)) != 0 {
        v |= !m;
    }
    if !sf {
        v &= 0xffff_ffff;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pc_after_the_last_instruction_wraps() {
        assert_eq!(next_insn(0x4000_0000), 0x4000_0004);
        assert_eq!(next_insn(u64::MAX - 3), 0);
    }

    #[test]
    fn syndromes_decode_and_loads_extend() {
        // STR W3, 4 bytes: ISV, SAS = 2, SRT = 3, WnR.
        let esr = 0x24 << 26 | 1 << 24 | 2 << 22 | 3 << 16 | 1 << 6;
        let d = decode(esr, 0x900_0000, |n| 0xdead_beef_0000_0000 | n);
        assert_eq!(
            d,
            MmioDecode::Access(MmioOp {
                ipa: 0x900_0000,
                size: 4,
                srt: 3,
                write: Some(3)
            })
        );
        assert_eq!(decode(0x24 << 26, 0, |_| 0), MmioDecode::NoSyndrome);
        // DC CIVAC to a device: CM and WnR set, no ISV; DC ZVA has no CM.
        assert_eq!(
            decode(0x24 << 26 | 1 << 8 | 1 << 6, 0, |_| 0),
            MmioDecode::CacheMaintenance
        );
        assert_eq!(
            decode(0x24 << 26 | 1 << 6, 0, |_| 0),
            MmioDecode::NoSyndrome
        );
        assert_eq!(decode(0x20 << 26, 0, |_| 0), MmioDecode::FetchOrWalk);
        assert_eq!(
            decode(0x24 << 26 | 1 << 7, 0, |_| 0),
            MmioDecode::FetchOrWalk
        );
        // LDRSB X0: SSE, SF.
        let ldrsb = 1 << 21 | 1 << 15;
        assert_eq!(load_value(ldrsb, 1, 0x80), 0xffff_ffff_ffff_ff80);
        assert_eq!(load_value(1 << 21, 1, 0x80), 0xffff_ff80);
        assert_eq!(load_value(1 << 15, 2, 0x1_8000), 0x8000);
        assert_eq!(load_value(1 << 15, 8, u64::MAX), u64::MAX);
    }
}
