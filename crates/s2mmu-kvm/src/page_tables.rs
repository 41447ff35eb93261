//! 4-level x86-64 guest page tables, built on the host and copied into guest memory.
//!
//! kvm_pvm runs guest code natively only at CPL 3, and a user-mode access needs the user
//! bit on every level of the walk, so every entry this builder writes is present, writable
//! and user. Accessed (and, on leaves, dirty) bits are preset so that the guest's first
//! accesses do not make KVM write back A/D bits into these tables during a measured pass.

use crate::error::Error;

/// Entry bit: present.
pub const PTE_PRESENT: u64 = 1 << 0;
/// Entry bit: writable.
pub const PTE_WRITABLE: u64 = 1 << 1;
/// Entry bit: user-mode accessible.
pub const PTE_USER: u64 = 1 << 2;
/// Entry bit: accessed.
pub const PTE_ACCESSED: u64 = 1 << 5;
/// Entry bit (leaf only): dirty.
pub const PTE_DIRTY: u64 = 1 << 6;
/// The physical-address field of an entry (bits 12..51).
pub const PTE_ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

/// Flags of every non-leaf entry.
pub const TABLE_FLAGS: u64 = PTE_PRESENT | PTE_WRITABLE | PTE_USER | PTE_ACCESSED;
/// Flags of every leaf (4 KiB) entry.
pub const LEAF_FLAGS: u64 = TABLE_FLAGS | PTE_DIRTY;

const PAGE: u64 = 4096;
const ENTRIES: usize = 512;

/// Guest page tables under construction. Table pages are allocated one after another at
/// guest-physical `base_gpa`; page 0 of the pool is the PML4 (the value for CR3).
#[derive(Debug, Clone)]
pub struct GuestPageTables {
    base_gpa: u64,
    /// One `[u64; 512]` per table page, flattened.
    entries: Vec<u64>,
}

impl GuestPageTables {
    /// An empty hierarchy (just a PML4) whose tables will live at `base_gpa`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `base_gpa` is not 4 KiB aligned.
    pub fn new(base_gpa: u64) -> Result<Self, Error> {
        if !base_gpa.is_multiple_of(PAGE) {
            return Err(Error::invalid(
                "base_gpa",
                format!("{base_gpa:#x} is not 4 KiB aligned"),
            ));
        }
        Ok(GuestPageTables {
            base_gpa,
            entries: vec![0; ENTRIES],
        })
    }

    /// The guest-physical address of the PML4 (what CR3 holds).
    pub fn root_gpa(&self) -> u64 {
        self.base_gpa
    }

    /// How many 4 KiB table pages exist so far.
    pub fn table_pages(&self) -> u64 {
        (self.entries.len() / ENTRIES) as u64
    }

    /// The bytes of all table pages, to copy to guest-physical [`Self::root_gpa`].
    pub fn bytes(&self) -> Vec<u8> {
        self.entries.iter().flat_map(|e| e.to_le_bytes()).collect()
    }

    /// The guest-physical size the tables occupy.
    pub fn size_bytes(&self) -> u64 {
        self.table_pages() * PAGE
    }

    fn table_gpa(&self, index: usize) -> u64 {
        self.base_gpa + index as u64 * PAGE
    }

    fn index_of_table(&self, gpa: u64) -> usize {
        ((gpa - self.base_gpa) / PAGE) as usize
    }

    /// Returns the table that entry `slot` of table `table` points to, creating it.
    fn next_level(&mut self, table: usize, slot: usize) -> usize {
        let entry = self.entries[table * ENTRIES + slot];
        if entry & PTE_PRESENT != 0 {
            return self.index_of_table(entry & PTE_ADDR_MASK);
        }
        let new = self.entries.len() / ENTRIES;
        self.entries.resize(self.entries.len() + ENTRIES, 0);
        self.entries[table * ENTRIES + slot] = self.table_gpa(new) | TABLE_FLAGS;
        new
    }

    fn indices(gva: u64) -> [usize; 4] {
        [39, 30, 21, 12].map(|shift| ((gva >> shift) & 511) as usize)
    }

    /// Maps `len` bytes at `gva` to `gpa` with 4 KiB pages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when an address or the length is not 4 KiB aligned, the
    /// virtual range is not canonical in the lower half (below 2^47), or the physical range
    /// exceeds 52 bits.
    pub fn map(&mut self, gva: u64, gpa: u64, len: u64) -> Result<(), Error> {
        if !gva.is_multiple_of(PAGE) || !gpa.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(Error::invalid(
                "map",
                format!("gva {gva:#x}, gpa {gpa:#x} and len {len:#x} must be 4 KiB aligned"),
            ));
        }
        if gva.checked_add(len).is_none_or(|end| end > 1 << 47)
            || gpa.checked_add(len).is_none_or(|end| end > 1 << 52)
        {
            return Err(Error::invalid(
                "map",
                format!("range {gva:#x}+{len:#x} -> {gpa:#x} leaves the 47/52-bit space"),
            ));
        }
        for page in 0..len / PAGE {
            let va = gva + page * PAGE;
            let [l4, l3, l2, l1] = Self::indices(va);
            let pdpt = self.next_level(0, l4);
            let pd = self.next_level(pdpt, l3);
            let pt = self.next_level(pd, l2);
            self.entries[pt * ENTRIES + l1] = (gpa + page * PAGE) | LEAF_FLAGS;
        }
        Ok(())
    }

    /// Walks the tables like the MMU would, returning the four entries of the walk
    /// (PML4E, PDPTE, PDE, PTE), or `None` where a level is not present.
    pub fn walk(&self, gva: u64) -> Option<[u64; 4]> {
        let mut table = 0usize;
        let mut out = [0u64; 4];
        for (level, index) in Self::indices(gva).into_iter().enumerate() {
            let entry = self.entries[table * ENTRIES + index];
            if entry & PTE_PRESENT == 0 {
                return None;
            }
            out[level] = entry;
            if level < 3 {
                table = self.index_of_table(entry & PTE_ADDR_MASK);
            }
        }
        Some(out)
    }

    /// The guest-physical address `gva` translates to, if mapped.
    pub fn translate(&self, gva: u64) -> Option<u64> {
        self.walk(gva)
            .map(|walk| (walk[3] & PTE_ADDR_MASK) | (gva & (PAGE - 1)))
    }

    /// How many table pages mapping `len` bytes at one 1 GiB-aligned place needs at most
    /// (one PML4 is counted by the caller). Used to size the system slot before building.
    pub fn pages_needed(len: u64) -> u64 {
        let pts = len.div_ceil(2 << 20);
        let pds = len.div_ceil(1 << 30) + 1;
        let pdpts = len.div_ceil(1 << 39) + 1;
        pts + pds + pdpts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_is_present_writable_user() {
        let mut pt = GuestPageTables::new(0x10000).unwrap();
        pt.map(0x1_0000_0000, 0x1_0000_0000, 8 << 20).unwrap();
        pt.map(0x3000, 0x3000, 0x1000).unwrap();
        for gva in [0x1_0000_0000u64, 0x1_0000_0000 + (8 << 20) - 4096, 0x3000] {
            let walk = pt.walk(gva).unwrap();
            for (level, entry) in walk.iter().enumerate() {
                let want = if level == 3 { LEAF_FLAGS } else { TABLE_FLAGS };
                assert_eq!(entry & 0xfff, want, "level {level} of {gva:#x}: {entry:#x}");
            }
            assert_eq!(pt.translate(gva + 8), Some(gva + 8));
        }
        assert_eq!(pt.translate(0x1_0000_0000 + (8 << 20)), None);
        assert_eq!(pt.translate(0x4000), None);
    }

    #[test]
    fn table_pages_and_bytes_agree_with_the_layout() {
        let mut pt = GuestPageTables::new(0x10000).unwrap();
        // 8 MiB at 4 GiB: 1 PML4 + 1 PDPT + 1 PD + 4 PTs.
        pt.map(0x1_0000_0000, 0x2_0000_0000, 8 << 20).unwrap();
        assert_eq!(pt.table_pages(), 7);
        assert!(pt.table_pages() <= 1 + GuestPageTables::pages_needed(8 << 20));
        let bytes = pt.bytes();
        assert_eq!(bytes.len() as u64, pt.size_bytes());
        // PML4 entry 0 points at the PDPT, the next page of the pool.
        let pml4e0 = u64::from_le_bytes(bytes[0..8].try_into().unwrap());
        assert_eq!(pml4e0, 0x11000 | TABLE_FLAGS);
        // PDPT entry 4 (4 GiB) points at the PD.
        let pdpte4 = u64::from_le_bytes(bytes[4096 + 32..4096 + 40].try_into().unwrap());
        assert_eq!(pdpte4, 0x12000 | TABLE_FLAGS);
        // The first PTE of the first PT maps the first target page.
        let pte0 = u64::from_le_bytes(bytes[3 * 4096..3 * 4096 + 8].try_into().unwrap());
        assert_eq!(pte0, 0x2_0000_0000 | LEAF_FLAGS);
        assert_eq!(pt.translate(0x1_0000_0000 + 0x5123), Some(0x2_0000_5123));
    }

    #[test]
    fn rejects_bad_arguments() {
        assert!(GuestPageTables::new(0x10001).is_err());
        let mut pt = GuestPageTables::new(0).unwrap();
        assert!(pt.map(0x1001, 0, 4096).is_err());
        assert!(pt.map(0, 0, 100).is_err());
        assert!(pt.map(1 << 47, 0, 4096).is_err());
        assert!(pt.map(0, 1 << 52, 4096).is_err());
    }
}
