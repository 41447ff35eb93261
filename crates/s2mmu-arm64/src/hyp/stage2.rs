//! The EL2 registers that install an engine-built table: VTCR_EL2 from the
//! format's geometry, VTTBR_EL2 from the root and VMID, HCR_EL2.

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::PteFormat;

/// HCR_EL2.VM: stage 2 on.
pub const HCR_VM: u64 = 1 << 0;
/// HCR_EL2.SWIO.
pub const HCR_SWIO: u64 = 1 << 1;
/// HCR_EL2.DC: the guest's disabled stage 1 makes Normal write-back memory
/// (so guest data accesses are not Device accesses).
pub const HCR_DC: u64 = 1 << 12;
/// HCR_EL2.TSC: the guest's SMC traps to EL2 (else QEMU would take it as a
/// PSCI call and let the guest start CPUs).
pub const HCR_TSC: u64 = 1 << 19;
/// HCR_EL2.RW: EL1 is AArch64.
pub const HCR_RW: u64 = 1 << 31;
/// The HCR_EL2 a guest runs with.
pub const HCR_GUEST: u64 = HCR_VM | HCR_SWIO | HCR_DC | HCR_TSC | HCR_RW;

/// VTCR_EL2.HA: hardware access flag updates at stage 2.
pub const VTCR_HA: u64 = 1 << 21;
/// VTCR_EL2.HD: hardware dirty state (DBM) at stage 2 (needs HA).
pub const VTCR_HD: u64 = 1 << 22;

/// The VMID the tests' VM runs with.
pub const VMID: u64 = 1;

/// VTCR_EL2 for `fmt`: T0SZ, SL0 (start level), inner-shareable write-back
/// walks, TG0, PS = 48 bits, 16-bit VMIDs. `hw_dirty` adds HA and HD.
pub fn vtcr(fmt: &Arm64Stage2, hw_dirty: bool) -> u64 {
    let t0sz = 64 - u64::from(fmt.ipa_bits());
    let start = u64::from(fmt.start_level());
    let (sl0, tg0) = match fmt.translation_granule() {
        // 4K: SL0 0/1/2 = start level 2/1/0.
        Granule::K4 => (2 - start, 0),
        // 16K and 64K: SL0 0/1/2 = start level 3/2/1.
        Granule::K16 => (3 - start, 2),
        Granule::K64 => (3 - start, 1),
    };
    let ps = 5; // 48-bit output; QEMU checks levels against PS (not PAMax).
    let mut v = t0sz | sl0 << 6 | 1 << 8 | 1 << 10 | 3 << 12 | tg0 << 14 | ps << 16;
    v |= 1 << 19; // VS: 16-bit VMID
    v |= 1 << 31; // RES1
    if hw_dirty {
        v |= VTCR_HA | VTCR_HD;
    }
    v
}

/// VTTBR_EL2 for a root at `root_pa` and `vmid`.
pub fn vttbr(root_pa: u64, vmid: u64) -> u64 {
    root_pa | vmid << 48
}
