//! The VMSAv8-64 stage-2 descriptor format (Arm ARM D8, KVM's `kvm_pgtable.h`).
//!
//! Bit layout of a stage-2 descriptor:
//!
//! | bits | field |
//! |---|---|
//! | 0 | valid |
//! | 1 | type: table (levels < 3) or page (level 3); 0 = block |
//! | 5:2 | MemAttr |
//! | 7:6 | S2AP (6 = read, 7 = write) |
//! | 9:8 | SH, or PA\[51:50\] with LPA2 |
//! | 10 | AF |
//! | 15:12 | PA\[51:48\] with 64K granule and 52-bit PA |
//! | 47/49:page shift | output address |
//! | 51 | DBM: hardware dirty state (`DirtyMode::Hardware`, with VTCR_EL2.HA/HD) |
//! | 52 | Contiguous (not used) |
//! | 54:53 | XN (FEAT_XNX encoding) |
//! | 58:55 | software bits |
//! | 63:60 | invalid-entry type (1 = locked for break-before-make) |

use super::known::KnownFormat;
use super::leaf::{decoded_prot, leaf_mem_type, rw_bits, MemCodes};
use super::pte::{HwDirtyBits, Prot, PteFormat};
use crate::{Error, Result};

/// Valid bit.
pub const VALID: u64 = 1 << 0;
/// Type bit: table at levels < 3, page at level 3.
pub const TYPE: u64 = 1 << 1;
/// Shift of the MemAttr field.
pub const MEMATTR_SHIFT: u32 = 2;
/// MemAttr field mask.
pub const MEMATTR_MASK: u64 = 0xf << MEMATTR_SHIFT;
/// MemAttr for Normal write-back memory (without FWB).
pub const MEMATTR_NORMAL: u64 = 0xf;
/// MemAttr for Normal non-cacheable memory.
pub const MEMATTR_NORMAL_NC: u64 = 0x5;
/// MemAttr for Device-nGnRE memory.
pub const MEMATTR_DEVICE: u64 = 0x1;
/// S2AP read permission.
pub const S2AP_R: u64 = 1 << 6;
/// S2AP write permission.
pub const S2AP_W: u64 = 1 << 7;
/// Shift of the shareability field.
pub const SH_SHIFT: u32 = 8;
/// Inner shareable.
pub const SH_INNER: u64 = 3 << SH_SHIFT;
/// Access flag.
pub const AF: u64 = 1 << 10;
/// Dirty bit modifier (hardware dirty state; unused by KVM stage-2).
pub const DBM: u64 = 1 << 51;
/// Contiguous hint (unused).
pub const CONTIGUOUS: u64 = 1 << 52;
/// Shift of the XN field.
pub const XN_SHIFT: u32 = 53;
/// XN field mask.
pub const XN_MASK: u64 = 3 << XN_SHIFT;
/// XN encoding: executable at neither EL1 nor EL0.
pub const XN_NONE_EXEC: u64 = 2 << XN_SHIFT;
/// Software bits 58:55.
pub const SW_MASK: u64 = 0xf << 55;
/// Shift of the invalid-entry type field.
pub const INVALID_TYPE_SHIFT: u32 = 60;
/// The break-before-make lock marker: an invalid entry of type 1.
pub const LOCKED: u64 = 1 << INVALID_TYPE_SHIFT;

/// Translation granule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granule {
    /// 4 KiB pages, 512 entries per table.
    K4,
    /// 16 KiB pages, 2048 entries per table.
    K16,
    /// 64 KiB pages, 8192 entries per table.
    K64,
}

impl Granule {
    /// log2 of the page size.
    pub const fn shift(self) -> u32 {
        match self {
            Granule::K4 => 12,
            Granule::K16 => 14,
            Granule::K64 => 16,
        }
    }

    /// The lowest level at which KVM installs block mappings
    /// (`KVM_PGTABLE_MIN_BLOCK_LEVEL`).
    pub const fn min_block_level(self) -> u32 {
        match self {
            Granule::K4 => 1,
            Granule::K16 | Granule::K64 => 2,
        }
    }

    /// Parses `4k`, `16k`, `64k` or a byte count.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for any other size.
    pub fn from_bytes(bytes: u64) -> Result<Granule> {
        match bytes {
            0x1000 => Ok(Granule::K4),
            0x4000 => Ok(Granule::K16),
            0x10000 => Ok(Granule::K64),
            _ => Err(Error::InvalidConfig {
                what: "granule size",
                value: bytes,
            }),
        }
    }
}

/// The arm64 stage-2 format for one granule and IPA size, with the start level
/// and root concatenation computed as KVM computes them (`kvm_get_vtcr`,
/// `kvm_pgd_pages`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arm64Stage2 {
    granule: Granule,
    ipa_bits: u32,
    start_level: u32,
    root_pages: usize,
    lpa2: bool,
}

impl Arm64Stage2 {
    /// The format for `granule` and an IPA space of `ipa_bits` bits.
    ///
    /// KVM's rule: `levels = (ipa_bits - 8) / (page_shift - 3)` (at least 2),
    /// which lets up to 16 root pages be concatenated instead of adding a
    /// level; `start_level = 4 - levels`; the root has
    /// `((2^ipa_bits - 1) >> shift(start_level - 1)) + 1` pages.
    /// IPA sizes above 48 bits use the 52-bit output encodings (64K: PA\[51:48\]
    /// in bits 15:12; 4K/16K: LPA2).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for an IPA size outside 32..=52.
    pub fn new(granule: Granule, ipa_bits: u32) -> Result<Self> {
        if !(32..=52).contains(&ipa_bits) {
            return Err(Error::InvalidConfig {
                what: "IPA size in bits (32..=52)",
                value: ipa_bits as u64,
            });
        }
        let bits_per_level = granule.shift() - 3;
        let levels = ((ipa_bits - 8) / bits_per_level).clamp(2, 4);
        let start_level = 4 - levels;
        // Shift of the (virtual) level above the root: what one root page spans.
        let above_root_shift = bits_per_level * (3 - start_level + 1) + granule.shift();
        let root_pages = if above_root_shift >= 64 {
            1
        } else {
            (((1u64 << ipa_bits) - 1) >> above_root_shift) as usize + 1
        };
        if root_pages > 16 {
            return Err(Error::InvalidConfig {
                what: "IPA size needing more than 16 concatenated root pages",
                value: ipa_bits as u64,
            });
        }
        Ok(Arm64Stage2 {
            granule,
            ipa_bits,
            start_level,
            root_pages,
            lpa2: ipa_bits > 48 && granule != Granule::K64,
        })
    }

    /// The translation granule.
    pub fn translation_granule(&self) -> Granule {
        self.granule
    }

    /// Whether the LPA2 output-address encoding is in use.
    pub fn lpa2(&self) -> bool {
        self.lpa2
    }

    fn encode_oa(&self, pa: u64) -> u64 {
        let shift = self.granule.shift();
        match (self.granule, self.lpa2) {
            (Granule::K64, _) => {
                let lo = pa & genmask(47, shift);
                let hi = (pa >> 48) & 0xf;
                lo | (hi << 12)
            }
            (_, true) => {
                let lo = pa & genmask(49, shift);
                let hi = (pa >> 50) & 0x3;
                lo | (hi << 8)
            }
            (_, false) => pa & genmask(47, shift),
        }
    }
}

/// The `MemAttr` codes of the memory types.
const MEMATTR_CODES: MemCodes = MemCodes {
    normal: MEMATTR_NORMAL,
    device: MEMATTR_DEVICE,
    normal_nc: MEMATTR_NORMAL_NC,
};

const fn genmask(hi: u32, lo: u32) -> u64 {
    (u64::MAX >> (63 - hi)) & !((1u64 << lo) - 1)
}

// SAFETY: the geometry comes from `new`, which accepts only the three
// granules, 32..=52 IPA bits and at most 16 root pages, computed as KVM does;
// a table entry is VALID|TYPE below the last level and nothing else is
// (leaves are blocks, type 0, or last-level pages; the lock marker and 0 are
// invalid), and the permission, access, dirty and exec bits never touch
// VALID or TYPE; `output_address` inverts `encode_oa` for table pages.
unsafe impl PteFormat for Arm64Stage2 {
    #[inline]
    fn page_shift(&self) -> u32 {
        self.granule.shift()
    }
    #[inline]
    fn ipa_bits(&self) -> u32 {
        self.ipa_bits
    }
    #[inline]
    fn pa_bits(&self) -> u32 {
        if self.ipa_bits > 48 {
            52
        } else {
            48
        }
    }
    #[inline]
    fn start_level(&self) -> u32 {
        self.start_level
    }
    #[inline]
    fn root_pages(&self) -> usize {
        self.root_pages
    }
    #[inline]
    fn leaf_allowed(&self, level: u32) -> bool {
        level == 3 || (level >= self.granule.min_block_level() && level >= self.start_level)
    }
    #[inline]
    fn is_valid(&self, pte: u64) -> bool {
        pte & VALID != 0
    }
    #[inline]
    fn is_table(&self, pte: u64, level: u32) -> bool {
        level < 3 && pte & (VALID | TYPE) == (VALID | TYPE)
    }
    #[inline]
    fn table_pte(&self, pa: u64) -> u64 {
        self.encode_oa(pa) | TYPE | VALID
    }

    fn leaf_pte(&self, pa: u64, level: u32, prot: Prot) -> Result<u64> {
        let memattr = MEMATTR_CODES.encode(leaf_mem_type(pa, self.pa_bits(), prot)?);
        let mut pte = self.encode_oa(pa) | (memattr << MEMATTR_SHIFT) | AF | VALID;
        if level == 3 {
            pte |= TYPE;
        }
        if !self.lpa2 {
            pte |= SH_INNER;
        }
        pte |= self.perm_bits(prot);
        if !prot.contains(Prot::X) {
            pte |= XN_NONE_EXEC;
        }
        Ok(pte)
    }

    #[inline]
    fn output_address(&self, pte: u64) -> u64 {
        let shift = self.granule.shift();
        match (self.granule, self.lpa2) {
            (Granule::K64, _) => (pte & genmask(47, shift)) | (((pte >> 12) & 0xf) << 48),
            (_, true) => (pte & genmask(49, shift)) | (((pte >> 8) & 0x3) << 50),
            (_, false) => pte & genmask(47, shift),
        }
    }

    fn prot(&self, pte: u64) -> Prot {
        decoded_prot(
            pte & S2AP_R != 0,
            pte & S2AP_W != 0,
            pte & XN_MASK != XN_NONE_EXEC,
            MEMATTR_CODES.decode((pte & MEMATTR_MASK) >> MEMATTR_SHIFT),
        )
    }

    #[inline]
    fn perm_bits(&self, prot: Prot) -> u64 {
        rw_bits(prot, S2AP_R, S2AP_W)
    }
    #[inline]
    fn write_bit(&self) -> u64 {
        S2AP_W
    }
    #[inline]
    fn access_flag(&self) -> u64 {
        AF
    }
    #[inline]
    fn locked(&self) -> u64 {
        LOCKED
    }
    #[inline]
    fn with_exec(&self, pte: u64) -> u64 {
        pte & !XN_MASK
    }
    #[inline]
    fn hw_dirty_bits(&self) -> Option<HwDirtyBits> {
        Some(HwDirtyBits::ARM64_DBM)
    }
    #[inline]
    fn relevel_leaf(&self, pte: u64, _from_level: u32, to_level: u32) -> u64 {
        // Blocks have type 0, pages type 1; everything else carries over.
        if to_level == 3 {
            pte | TYPE
        } else {
            pte & !TYPE
        }
    }
}

impl KnownFormat for Arm64Stage2 {
    const NAME: &'static str = "arm64";
    const TITLE: &'static str = "arm64 stage 2";
    const HARDWARE_DIRTY_NAME: &'static str = "arm64 DBM";
    const WIRE_CODE: u8 = 0;

    /// The 4 KiB granule, levels and root pages as KVM chooses them.
    fn for_vm(ipa_bits: u32) -> Result<Self> {
        Arm64Stage2::new(Granule::K4, ipa_bits)
    }
}

/// Every configuration the format accepts (each granule, 32 to 52 IPA
/// bits), for the conformance suite (`format/conformance.rs`).
#[cfg(all(test, feature = "std"))]
pub(super) fn conformance_configs() -> alloc::vec::Vec<Arm64Stage2> {
    [Granule::K4, Granule::K16, Granule::K64]
        .into_iter()
        .flat_map(|g| (32..=52).filter_map(move |bits| Arm64Stage2::new(g, bits).ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_level_and_root_pages_match_kvm() {
        // (granule, ipa bits, start level, concatenated root pages), from
        // the worked examples of KVM's formula.
        let cases = [
            (Granule::K4, 32, 2, 4),
            (Granule::K4, 36, 1, 1),
            (Granule::K4, 40, 1, 2),
            (Granule::K4, 42, 1, 8),
            (Granule::K4, 48, 0, 1),
            (Granule::K4, 52, 0, 16),
            (Granule::K16, 40, 2, 16),
            (Granule::K16, 47, 1, 1),
            (Granule::K64, 40, 2, 1),
            (Granule::K64, 44, 2, 4),
            (Granule::K64, 48, 1, 1),
        ];
        for (g, ipa, sl, pages) in cases {
            let f = Arm64Stage2::new(g, ipa).unwrap();
            assert_eq!(f.start_level(), sl, "{g:?} ipa {ipa}");
            assert_eq!(f.root_pages(), pages, "{g:?} ipa {ipa}");
            // The root covers exactly the IPA space.
            assert!(f.root_page_span() * pages as u64 >= f.ipa_limit());
        }
    }

    #[test]
    fn ipa_size_out_of_range_is_rejected() {
        for bits in [0, 31, 53, 64] {
            assert!(matches!(
                Arm64Stage2::new(Granule::K4, bits),
                Err(Error::InvalidConfig { .. })
            ));
        }
    }

    #[test]
    fn level_geometry() {
        let f = Arm64Stage2::new(Granule::K4, 40).unwrap();
        assert_eq!(f.granule(3), 4096);
        assert_eq!(f.granule(2), 2 << 20);
        assert_eq!(f.granule(1), 1 << 30);
        assert_eq!(f.entries_per_table(), 512);
        let f = Arm64Stage2::new(Granule::K16, 40).unwrap();
        assert_eq!(f.granule(2), 32 << 20);
        let f = Arm64Stage2::new(Granule::K64, 40).unwrap();
        assert_eq!(f.granule(2), 512 << 20);
        assert_eq!(f.entries_per_table(), 8192);
    }

    #[test]
    fn block_levels_per_granule() {
        let f4 = Arm64Stage2::new(Granule::K4, 40).unwrap();
        assert!(!f4.leaf_allowed(0) && f4.leaf_allowed(1) && f4.leaf_allowed(2));
        let f16 = Arm64Stage2::new(Granule::K16, 47).unwrap();
        assert!(!f16.leaf_allowed(1) && f16.leaf_allowed(2) && f16.leaf_allowed(3));
        let f64k = Arm64Stage2::new(Granule::K64, 48).unwrap();
        assert!(!f64k.leaf_allowed(1) && f64k.leaf_allowed(2));
        // A 4K table starting at level 2 has no level-1 blocks.
        let f4_32 = Arm64Stage2::new(Granule::K4, 32).unwrap();
        assert!(!f4_32.leaf_allowed(1) && f4_32.leaf_allowed(2));
    }

    #[test]
    fn leaf_bits() {
        let f = Arm64Stage2::new(Granule::K4, 40).unwrap();
        let pte = f.leaf_pte(0x1234_5000, 3, Prot::RW).unwrap();
        assert_eq!(pte & (VALID | TYPE), VALID | TYPE);
        assert_eq!(pte & (S2AP_R | S2AP_W), S2AP_R | S2AP_W);
        assert_ne!(pte & AF, 0);
        assert_eq!(pte & XN_MASK, XN_NONE_EXEC);
        assert_eq!((pte & MEMATTR_MASK) >> MEMATTR_SHIFT, MEMATTR_NORMAL);
        assert_eq!(pte & (3 << SH_SHIFT), SH_INNER);
        assert_eq!(f.output_address(pte), 0x1234_5000);
        assert_eq!(f.prot(pte), Prot::RW);
        let block = f.leaf_pte(0x4000_0000, 1, Prot::R | Prot::X).unwrap();
        assert_eq!(block & (VALID | TYPE), VALID, "blocks have type 0");
        assert!(!f.is_table(block, 1));
        assert_eq!(f.prot(block), Prot::R | Prot::X);
        let table = f.table_pte(0x8000);
        assert!(f.is_table(table, 2));
        assert!(!f.is_table(table, 3), "type 1 at level 3 is a page");
    }

    #[test]
    fn memory_types() {
        let f = Arm64Stage2::new(Granule::K4, 40).unwrap();
        let dev = f.leaf_pte(0x1000, 3, Prot::RW | Prot::DEVICE).unwrap();
        assert_eq!((dev & MEMATTR_MASK) >> MEMATTR_SHIFT, MEMATTR_DEVICE);
        assert_eq!(f.prot(dev), Prot::RW | Prot::DEVICE);
        assert!(matches!(
            f.leaf_pte(0x1000, 3, Prot::R | Prot::X | Prot::DEVICE),
            Err(Error::InvalidProt { .. })
        ));
        assert!(matches!(
            f.leaf_pte(0x1000, 3, Prot::R | Prot::DEVICE | Prot::NORMAL_NC),
            Err(Error::InvalidProt { .. })
        ));
    }

    #[test]
    fn wide_output_addresses_round_trip() {
        let f64k = Arm64Stage2::new(Granule::K64, 52).unwrap();
        let pa = 0x000f_1234_5678_0000;
        let pte = f64k.leaf_pte(pa, 3, Prot::R).unwrap();
        assert_eq!(f64k.output_address(pte), pa);
        let f4 = Arm64Stage2::new(Granule::K4, 52).unwrap();
        assert!(f4.lpa2());
        let pa = 0x000c_1234_5678_9000;
        let pte = f4.leaf_pte(pa, 3, Prot::R).unwrap();
        assert_eq!(f4.output_address(pte), pa);
        // With LPA2, bits 9:8 carry PA[51:50] instead of shareability.
        assert_eq!((pte >> 8) & 3, 3);
        let f4_48 = Arm64Stage2::new(Granule::K4, 48).unwrap();
        assert!(matches!(
            f4_48.leaf_pte(1 << 48, 3, Prot::R),
            Err(Error::PhysOutOfRange { .. })
        ));
    }

    #[test]
    fn locked_marker_is_invalid() {
        let f = Arm64Stage2::new(Granule::K4, 40).unwrap();
        assert!(!f.is_valid(f.locked()));
        assert!(f.is_locked(LOCKED));
        assert!(!f.is_table(LOCKED, 1));
    }
}
