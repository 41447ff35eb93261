//! What the engine asks of a descriptor format ([`PteFormat`]), and the
//! format-independent values it passes: a mapping's permissions and
//! memory type ([`Prot`]), a format's hardware dirty state
//! ([`HwDirtyBits`]).

use core::fmt;

/// Access permissions and memory type of a mapping, independent of format.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Prot(u32);

impl Prot {
    /// Readable.
    pub const R: Prot = Prot(1 << 0);
    /// Writable.
    pub const W: Prot = Prot(1 << 1);
    /// Executable (at every exception level).
    pub const X: Prot = Prot(1 << 2);
    /// Device memory (nGnRE); never executable, never cacheable.
    pub const DEVICE: Prot = Prot(1 << 3);
    /// Normal non-cacheable memory.
    pub const NORMAL_NC: Prot = Prot(1 << 4);
    /// Read and write.
    pub const RW: Prot = Prot(Self::R.0 | Self::W.0);
    /// Read, write and execute.
    pub const RWX: Prot = Prot(Self::R.0 | Self::W.0 | Self::X.0);
    /// No access (an invalid mapping is expressed by not mapping; this is
    /// only useful as an empty set).
    pub const NONE: Prot = Prot(0);

    const ALL: u32 = 0x1f;

    /// Builds a value from raw bits.
    ///
    /// # Errors
    /// [`crate::Error::InvalidProt`] when unknown bits are set.
    pub fn from_bits(bits: u32) -> crate::Result<Prot> {
        if bits & !Self::ALL != 0 {
            return Err(crate::Error::InvalidProt { bits });
        }
        Ok(Prot(bits))
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every permission in `other` is in `self`.
    pub const fn contains(self, other: Prot) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of both sets.
    #[must_use]
    pub const fn union(self, other: Prot) -> Prot {
        Prot(self.0 | other.0)
    }

    /// `self` without the permissions in `other`.
    #[must_use]
    pub const fn difference(self, other: Prot) -> Prot {
        Prot(self.0 & !other.0)
    }
}

impl core::ops::BitOr for Prot {
    type Output = Prot;
    fn bitor(self, rhs: Prot) -> Prot {
        self.union(rhs)
    }
}

impl fmt::Debug for Prot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::R, "R"),
            (Self::W, "W"),
            (Self::X, "X"),
            (Self::DEVICE, "DEVICE"),
            (Self::NORMAL_NC, "NC"),
        ];
        let mut first = true;
        write!(f, "Prot(")?;
        for (p, n) in names {
            if self.contains(p) {
                if !first {
                    write!(f, "|")?;
                }
                write!(f, "{n}")?;
                first = false;
            }
        }
        write!(f, ")")
    }
}

/// The descriptor bits of a format's hardware dirty state, as masks, so the
/// engine's clean, scan, freeze and the simulated CPU's update are one code
/// for every format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HwDirtyBits {
    /// A leaf is tracked (or may become so) when any of these is set: a
    /// read-only mapping is never made writable by tracking.
    pub trackable: u64,
    /// Cleaning a tracked leaf clears these bits...
    pub clean_clear: u64,
    /// ...and sets these.
    pub clean_set: u64,
    /// A leaf is dirty when all of these are set.
    pub dirty: u64,
    /// The hardware's update on a write: where `pte & update_mask ==
    /// update_match`, it sets `update_set` (by an atomic update).
    pub update_mask: u64,
    /// See `update_mask`.
    pub update_match: u64,
    /// See `update_mask`.
    pub update_set: u64,
    /// Clearing these stops the hardware from updating the leaf.
    pub freeze_clear: u64,
}

impl HwDirtyBits {
    /// arm64 FEAT_HAFDBS at stage 2: DBM (bit 51) with the write permission
    /// S2AP\[1\] (bit 7). Writable-clean = DBM set, write clear; the hardware
    /// sets the write permission on the first write; dirty = both set.
    pub const ARM64_DBM: HwDirtyBits = HwDirtyBits {
        trackable: (1 << 7) | (1 << 51),
        clean_clear: 1 << 7,
        clean_set: 1 << 51,
        dirty: (1 << 7) | (1 << 51),
        update_mask: (1 << 7) | (1 << 51),
        update_match: 1 << 51,
        update_set: 1 << 7,
        freeze_clear: 1 << 51,
    };

    /// x86 EPT accessed/dirty flags (EPTP bit 6): a writable leaf stays
    /// writable, the CPU sets the dirty flag (bit 9) on the first write;
    /// cleaning clears it; freezing takes the write permission (bit 1).
    pub const EPT_AD: HwDirtyBits = HwDirtyBits {
        trackable: 1 << 1,
        clean_clear: 1 << 9,
        clean_set: 0,
        dirty: 1 << 9,
        update_mask: (1 << 1) | (1 << 9),
        update_match: 1 << 1,
        update_set: 1 << 9,
        freeze_clear: 1 << 1,
    };

    /// `pte` cleaned: tracked and clean again.
    #[inline]
    pub const fn clean(&self, pte: u64) -> u64 {
        (pte & !self.clean_clear) | self.clean_set
    }

    /// Whether the hardware has dirtied `pte`.
    #[inline]
    pub const fn is_dirty(&self, pte: u64) -> bool {
        pte & self.dirty == self.dirty
    }
}

/// A stage-2 descriptor format and the geometry of one table built with it.
///
/// Levels are numbered as on arm64: the last level (pages) is
/// [`PteFormat::last_level`], the root is [`PteFormat::start_level`], and a
/// smaller number covers more address space. The root may consist of several
/// concatenated table pages ([`PteFormat::root_pages`]).
///
/// All methods are cheap and pure; the walker calls them for every entry.
///
/// # Safety
/// The walker follows the table entries this trait recognises and indexes
/// table pages with the geometry it gives, with raw pointers. An
/// implementation must guarantee, for every value the engine stores:
/// - geometry: `page_shift` is 12, 14 or 16; `start_level <= last_level`;
///   `1 <= root_pages <= 16`; [`PteFormat::index`] of any address below
///   [`PteFormat::ipa_limit`] at the start level, plus the root page
///   number, stays inside the root; `ipa_bits` is at most 57 and
///   `pa_bits` at most 52;
/// - tables: `is_table(table_pte(pa), level)` holds for every level above
///   the last, and `output_address(table_pte(pa)) == pa`;
/// - nothing else is a table: `is_table` is false for `0`, for
///   [`PteFormat::locked`], for every value [`PteFormat::leaf_pte`] returns,
///   and for those values changed by [`PteFormat::perm_bits`],
///   [`PteFormat::with_exec`], [`PteFormat::relevel_leaf`],
///   [`PteFormat::advance_leaf`], the write bit, the access flag and the
///   hardware dirty bit; and `is_table` is false at the last level;
/// - `is_valid(0)` and `is_valid(locked())` are false.
///
/// A format that broke these would make the walker read or write memory
/// that is not a table page.
pub unsafe trait PteFormat: Clone + Send + Sync + 'static {
    /// log2 of the translation granule (the size of a page and of a table page).
    fn page_shift(&self) -> u32;
    /// Number of IPA bits the table translates.
    fn ipa_bits(&self) -> u32;
    /// Number of output-address bits the descriptors can hold.
    fn pa_bits(&self) -> u32;
    /// Level of the root table.
    fn start_level(&self) -> u32;
    /// Number of concatenated pages that form the root table.
    fn root_pages(&self) -> usize;
    /// Whether a leaf (block or page) may be installed at `level`.
    fn leaf_allowed(&self, level: u32) -> bool;

    /// Level of page (last-level) entries.
    #[inline]
    fn last_level(&self) -> u32 {
        3
    }
    /// Bytes in one page (and one table page).
    #[inline]
    fn page_size(&self) -> u64 {
        1 << self.page_shift()
    }
    /// Index bits resolved per level.
    #[inline]
    fn bits_per_level(&self) -> u32 {
        self.page_shift() - 3
    }
    /// Entries in one table page.
    #[inline]
    fn entries_per_table(&self) -> usize {
        1 << self.bits_per_level()
    }
    /// log2 of the bytes an entry at `level` covers.
    #[inline]
    fn level_shift(&self, level: u32) -> u32 {
        self.bits_per_level() * (self.last_level() - level) + self.page_shift()
    }
    /// Bytes an entry at `level` covers.
    #[inline]
    fn granule(&self, level: u32) -> u64 {
        1 << self.level_shift(level)
    }
    /// Index of `addr` in a table at `level` (for the root: within one root page).
    #[inline]
    fn index(&self, addr: u64, level: u32) -> usize {
        ((addr >> self.level_shift(level)) as usize) & (self.entries_per_table() - 1)
    }
    /// Bytes of IPA space one root page covers.
    #[inline]
    fn root_page_span(&self) -> u64 {
        self.granule(self.start_level()) << self.bits_per_level()
    }
    /// Size of the IPA space in bytes.
    #[inline]
    fn ipa_limit(&self) -> u64 {
        1u64 << self.ipa_bits()
    }

    /// Whether the entry is valid (a table or a leaf that translates).
    fn is_valid(&self, pte: u64) -> bool;
    /// Whether the entry at `level` points to a next-level table.
    fn is_table(&self, pte: u64, level: u32) -> bool;
    /// A table entry pointing at the table page at `pa`.
    fn table_pte(&self, pa: u64) -> u64;
    /// A valid leaf at `level` mapping `pa` with `prot`, access flag set.
    ///
    /// # Errors
    /// [`crate::Error::InvalidProt`] for contradictory permissions,
    /// [`crate::Error::PhysOutOfRange`] when `pa` does not fit.
    fn leaf_pte(&self, pa: u64, level: u32, prot: Prot) -> crate::Result<u64>;
    /// The output address of a valid table or leaf entry.
    fn output_address(&self, pte: u64) -> u64;
    /// The permissions (and memory type where the format records it) of a leaf.
    fn prot(&self, pte: u64) -> Prot;
    /// The descriptor bits that grant `prot`'s access permissions (not the
    /// memory type): what a permission relaxation ORs in.
    fn perm_bits(&self, prot: Prot) -> u64;
    /// The bit that grants write access.
    fn write_bit(&self) -> u64;
    /// The access flag bit.
    fn access_flag(&self) -> u64;
    /// `pte` made executable (at every exception level).
    fn with_exec(&self, pte: u64) -> u64;
    /// The leaf that maps `offset` bytes further than `pte` with the same
    /// attributes (used to fill a table from a block). The default adds to
    /// the entry, right for formats whose output address sits in place in
    /// the entry and does not carry out of it for offsets inside one block.
    #[inline]
    fn advance_leaf(&self, pte: u64, offset: u64) -> u64 {
        pte + offset
    }
    /// The leaf at `level` with the output address and attributes of the
    /// leaf `pte` (a block's attributes carried to its pages, or back).
    fn relevel_leaf(&self, pte: u64, from_level: u32, to_level: u32) -> u64;
    /// The invalid value that marks an entry locked for break-before-make.
    fn locked(&self) -> u64;
    /// How the hardware records a write in a leaf without a fault
    /// (hardware dirty state), or `None` where the format has no such
    /// state: arm64's DBM ([`HwDirtyBits::ARM64_DBM`]) or x86 EPT's dirty
    /// flag ([`HwDirtyBits::EPT_AD`]).
    #[inline]
    fn hw_dirty_bits(&self) -> Option<HwDirtyBits> {
        None
    }
    /// Whether the entry holds the break-before-make lock marker.
    #[inline]
    fn is_locked(&self, pte: u64) -> bool {
        pte == self.locked()
    }
}
