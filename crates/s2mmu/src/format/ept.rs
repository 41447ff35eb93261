//! The x86 EPT format (Intel SDM Vol. 3C, chapter 29 "VMX Support for
//! Address Translation", section 29.3 "The Extended Page Table Mechanism
//! (EPT)": 29.3.2 "EPT Translation Mechanism", tables 29-1 to 29-6 for the
//! entry layouts; 29.3.3 for EPT violations and misconfigurations; 29.3.7
//! "EPT and Memory Typing"), with the constants Linux's KVM uses
//! (`arch/x86/include/asm/vmx.h` `VMX_EPT_*`, `arch/x86/kvm/mmu/spte.h`).
//!
//! Levels are numbered as the engine numbers them, root first: with 4-level
//! EPT the PML4 is level 0, the PDPT level 1 (1 GiB leaves), the page
//! directory level 2 (2 MiB leaves) and the page table level 3 (4 KiB
//! pages); 5-level EPT puts the PML5 at level 0 and the page table at
//! level 4. Every table is one 4 KiB page of 512 entries; there are no
//! concatenated roots.
//!
//! An entry is present when any of its read, write and execute bits is set
//! (29.3.2); a table entry is present without the page-size bit (7), a
//! leaf above the last level has it. Write without read is a
//! misconfiguration (29.3.3.1), so [`EptStage2`] refuses it. Leaves carry
//! the EPT memory type in bits 5:3 with "ignore PAT" (bit 6) set, as KVM
//! sets it for a VM without non-coherent DMA: write-back for memory,
//! uncacheable for devices, write-combining for non-cacheable normal
//! memory. The accessed flag (bit 8) is set in every leaf the engine makes
//! (the EPTP's A/D enable, bit 6, makes the CPU set it otherwise); the
//! dirty flag (bit 9) is the hardware's.

use super::known::KnownFormat;
use super::leaf::{decoded_prot, leaf_mem_type, rw_bits, MemCodes};
use super::pte::{HwDirtyBits, Prot, PteFormat};
use crate::{Error, Result};

/// Read access (bit 0).
pub const READ: u64 = 1 << 0;
/// Write access (bit 1).
pub const WRITE: u64 = 1 << 1;
/// Execute access (bit 2; supervisor-mode execute with MBEC).
pub const EXEC: u64 = 1 << 2;
/// Read, write and execute: what makes an entry present.
pub const RWX: u64 = READ | WRITE | EXEC;
/// Shift of the EPT memory type field (bits 5:3) of a leaf.
pub const MEMTYPE_SHIFT: u32 = 3;
/// The memory type field.
pub const MEMTYPE_MASK: u64 = 7 << MEMTYPE_SHIFT;
/// Memory type: uncacheable.
pub const MT_UC: u64 = 0;
/// Memory type: write-combining.
pub const MT_WC: u64 = 1;
/// Memory type: write-back.
pub const MT_WB: u64 = 6;
/// Ignore the guest's PAT (bit 6 of a leaf).
pub const IPAT: u64 = 1 << 6;
/// Page size: a leaf above the last level (bit 7).
pub const PAGE_SIZE: u64 = 1 << 7;
/// Accessed (bit 8), with A/D flags enabled in the EPTP.
pub const ACCESSED: u64 = 1 << 8;
/// Dirty (bit 9), with A/D flags enabled in the EPTP; set by the CPU on a
/// write through the leaf.
pub const DIRTY: u64 = 1 << 9;
/// User-mode execute (bit 10), with mode-based execute control.
pub const USER_EXEC: u64 = 1 << 10;
/// Suppress #VE (bit 63).
pub const SUPPRESS_VE: u64 = 1 << 63;
/// Bits 51:12: the physical address of a table or a 4 KiB page.
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
/// KVM's frozen (break-before-make) value, `SHADOW_NONPRESENT_VALUE |
/// 0x5a0`: not present (no read, write or execute bit), never a table, and
/// not a value the CPU or the engine writes otherwise.
pub const FROZEN: u64 = SUPPRESS_VE | 0x5a0;

/// The EPT memory types of the engine's memory types.
const MEMTYPE_CODES: MemCodes = MemCodes {
    normal: MT_WB,
    device: MT_UC,
    normal_nc: MT_WC,
};

/// EPT with 4 or 5 levels of 4 KiB tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EptStage2 {
    levels: u32,
}

/// The former name of [`EptStage2`], named now as
/// [`Arm64Stage2`](super::arm64::Arm64Stage2) is; code that spells it still
/// builds the same format.
///
/// ```
/// # #![allow(deprecated)]
/// use s2mmu::format::{ept::EptFormat, KnownFormat};
/// assert_eq!(<EptFormat as KnownFormat>::NAME, "ept");
/// ```
#[deprecated(
    since = "0.1.0",
    note = "renamed to EptStage2, as Arm64Stage2 is named"
)]
pub type EptFormat = EptStage2;

impl EptStage2 {
    /// EPT with `levels` levels: 4 (48-bit guest-physical addresses) or 5
    /// (57-bit).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for another level count.
    pub fn new(levels: u32) -> Result<Self> {
        if !matches!(levels, 4 | 5) {
            return Err(Error::InvalidConfig {
                what: "EPT levels (4 or 5)",
                value: u64::from(levels),
            });
        }
        Ok(EptStage2 { levels })
    }

    /// The number of levels.
    pub fn levels(&self) -> u32 {
        self.levels
    }

    /// The EPT pointer for a root at `root_pa` (29.3.2 / 25.6.11): memory
    /// type write-back, page-walk length minus one, and accessed/dirty
    /// flags on when `ad` is true.
    pub fn eptp(&self, root_pa: u64, ad: bool) -> u64 {
        (root_pa & ADDR_MASK) | MT_WB | u64::from(self.levels - 1) << 3 | u64::from(ad) << 6
    }
}

// SAFETY: 4 KiB granule, one root page at level 0, `last_level` 3 or 4 so
// every index stays within 512 entries; a table entry is present (an RWX
// bit) without PAGE_SIZE and only below the last level, and nothing else
// is: leaves above the last level carry PAGE_SIZE, last-level entries are
// never tables, 0 and FROZEN have no RWX bit, and the permission, exec,
// accessed and dirty bits never clear PAGE_SIZE or set RWX on a non-present
// value (relevel and advance keep the address in bits 51:12);
// `output_address` inverts `table_pte`.
unsafe impl PteFormat for EptStage2 {
    #[inline]
    fn page_shift(&self) -> u32 {
        12
    }
    #[inline]
    fn ipa_bits(&self) -> u32 {
        12 + 9 * self.levels
    }
    #[inline]
    fn pa_bits(&self) -> u32 {
        52
    }
    #[inline]
    fn start_level(&self) -> u32 {
        0
    }
    #[inline]
    fn root_pages(&self) -> usize {
        1
    }
    #[inline]
    fn last_level(&self) -> u32 {
        self.levels - 1
    }
    #[inline]
    fn leaf_allowed(&self, level: u32) -> bool {
        // 4 KiB pages, 2 MiB and 1 GiB leaves; no 512 GiB ones.
        level + 3 >= self.levels
    }
    #[inline]
    fn is_valid(&self, pte: u64) -> bool {
        pte & RWX != 0
    }
    #[inline]
    fn is_table(&self, pte: u64, level: u32) -> bool {
        level < self.last_level() && pte & RWX != 0 && pte & PAGE_SIZE == 0
    }
    #[inline]
    fn table_pte(&self, pa: u64) -> u64 {
        (pa & ADDR_MASK) | RWX
    }

    fn leaf_pte(&self, pa: u64, level: u32, prot: Prot) -> Result<u64> {
        let mem = leaf_mem_type(pa, self.pa_bits(), prot)?;
        // Write without read is an EPT misconfiguration (29.3.3.1), and a
        // leaf with no access bit would not be present.
        let no_access = !prot.contains(Prot::R) && !prot.contains(Prot::X);
        if (prot.contains(Prot::W) && !prot.contains(Prot::R)) || no_access {
            return Err(Error::InvalidProt { bits: prot.bits() });
        }
        let mt = MEMTYPE_CODES.encode(mem);
        let mut pte = (pa & ADDR_MASK) | mt << MEMTYPE_SHIFT | IPAT | ACCESSED;
        if level < self.last_level() {
            pte |= PAGE_SIZE;
        }
        pte |= self.perm_bits(prot);
        if prot.contains(Prot::W) {
            // Writable leaves start dirty, as KVM's `make_spte` makes them
            // (`spte_shadow_dirty_mask` with ACC_WRITE_MASK): the CPU need
            // not set the flag, and with PML it logs nothing until dirty
            // logging cleans the leaf.
            pte |= DIRTY;
        }
        if prot.contains(Prot::X) {
            pte |= EXEC;
        }
        Ok(pte)
    }

    #[inline]
    fn output_address(&self, pte: u64) -> u64 {
        pte & ADDR_MASK
    }

    fn prot(&self, pte: u64) -> Prot {
        decoded_prot(
            pte & READ != 0,
            pte & WRITE != 0,
            pte & EXEC != 0,
            MEMTYPE_CODES.decode((pte & MEMTYPE_MASK) >> MEMTYPE_SHIFT),
        )
    }

    #[inline]
    fn perm_bits(&self, prot: Prot) -> u64 {
        rw_bits(prot, READ, WRITE)
    }
    #[inline]
    fn write_bit(&self) -> u64 {
        WRITE
    }
    #[inline]
    fn access_flag(&self) -> u64 {
        ACCESSED
    }
    #[inline]
    fn locked(&self) -> u64 {
        FROZEN
    }
    #[inline]
    fn with_exec(&self, pte: u64) -> u64 {
        pte | EXEC
    }
    #[inline]
    fn hw_dirty_bits(&self) -> Option<HwDirtyBits> {
        Some(HwDirtyBits::EPT_AD)
    }
    #[inline]
    fn relevel_leaf(&self, pte: u64, _from_level: u32, to_level: u32) -> u64 {
        if to_level == self.last_level() {
            pte & !PAGE_SIZE
        } else {
            pte | PAGE_SIZE
        }
    }
}

impl KnownFormat for EptStage2 {
    const NAME: &'static str = "ept";
    const TITLE: &'static str = "x86 EPT";
    const HARDWARE_DIRTY_NAME: &'static str = "x86 EPT dirty flags";
    const WIRE_CODE: u8 = 1;

    /// 4-level EPT up to 48 bits, 5-level up to 57 (Intel SDM 29.3.2).
    fn for_vm(ipa_bits: u32) -> Result<Self> {
        match ipa_bits {
            0..=48 => EptStage2::new(4),
            49..=57 => EptStage2::new(5),
            _ => Err(Error::InvalidConfig {
                what: "EPT guest-physical address bits (at most 57)",
                value: u64::from(ipa_bits),
            }),
        }
    }
}

/// Every configuration the format accepts (4 and 5 levels), for the
/// conformance suite (`format/conformance.rs`).
#[cfg(all(test, feature = "std"))]
pub(super) fn conformance_configs() -> alloc::vec::Vec<EptStage2> {
    [4, 5]
        .into_iter()
        .map(|levels| EptStage2::new(levels).expect("EPT has 4 and 5 levels"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_of_4_and_5_levels() {
        let f4 = EptStage2::new(4).unwrap();
        assert_eq!(
            (f4.ipa_bits(), f4.last_level(), f4.root_pages()),
            (48, 3, 1)
        );
        assert_eq!(f4.granule(0), 512 << 30);
        assert_eq!(f4.granule(1), 1 << 30);
        assert_eq!(f4.granule(2), 2 << 20);
        assert_eq!(f4.granule(3), 4096);
        assert_eq!(
            (0..4).map(|l| f4.leaf_allowed(l)).collect::<Vec<_>>(),
            [false, true, true, true]
        );
        let f5 = EptStage2::new(5).unwrap();
        assert_eq!((f5.ipa_bits(), f5.last_level()), (57, 4));
        assert_eq!(f5.granule(2), 1 << 30);
        assert!(!f5.leaf_allowed(1) && f5.leaf_allowed(2));
        assert!(EptStage2::new(3).is_err());
    }

    #[test]
    fn leaves_tables_and_the_frozen_marker() {
        let f = EptStage2::new(4).unwrap();
        let t = f.table_pte(0x1234_5000);
        assert!(f.is_table(t, 0) && f.is_table(t, 2) && !f.is_table(t, 3));
        assert_eq!(f.output_address(t), 0x1234_5000);
        let block = f.leaf_pte(0x4000_0000, 1, Prot::RW).unwrap();
        assert!(f.is_valid(block) && !f.is_table(block, 1), "a 1 GiB leaf");
        assert_eq!(block & MEMTYPE_MASK, MT_WB << MEMTYPE_SHIFT);
        assert_eq!(
            block & (IPAT | ACCESSED | PAGE_SIZE),
            IPAT | ACCESSED | PAGE_SIZE
        );
        let page = f.relevel_leaf(block, 1, 3);
        assert_eq!(page & PAGE_SIZE, 0);
        assert_eq!(f.prot(page), Prot::RW);
        assert!(!f.is_valid(FROZEN) && !f.is_table(FROZEN, 0) && f.is_locked(FROZEN));
        let dev = f.leaf_pte(0xfee0_0000, 3, Prot::RW | Prot::DEVICE).unwrap();
        assert_eq!(f.prot(dev), Prot::RW | Prot::DEVICE);
        assert_eq!(f.with_exec(page) & EXEC, EXEC);
    }

    #[test]
    fn misconfigurations_are_refused() {
        let f = EptStage2::new(4).unwrap();
        assert!(
            f.leaf_pte(0x1000, 3, Prot::W).is_err(),
            "write without read"
        );
        assert!(f.leaf_pte(0x1000, 3, Prot::NONE).is_err(), "not present");
        assert!(f.leaf_pte(1 << 52, 3, Prot::R).is_err(), "beyond 52 bits");
        assert!(f.leaf_pte(0x1000, 3, Prot::X).is_ok(), "execute-only");
    }

    #[test]
    fn eptp_encodes_walk_length_and_ad() {
        let f = EptStage2::new(4).unwrap();
        assert_eq!(f.eptp(0x5000, true), 0x5000 | 6 | 3 << 3 | 1 << 6);
        assert_eq!(
            EptStage2::new(5).unwrap().eptp(0x5000, false),
            0x5000 | 6 | 4 << 3
        );
    }
}
