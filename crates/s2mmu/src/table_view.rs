//! A read-only view of a live stage-2 table.
//!
//! [`crate::mmu::Mmu::with_table`] hands this out instead of the
//! [`PageTable`] itself. The table's `&self` methods include writers that are
//! safe alongside each other under the MMU's read lock (the fault path's
//! [`PageTable::relax_perms`], [`PageTable::map_shared`],
//! [`PageTable::mkyoung`]): called from outside the engine they would make a
//! write-protected page writable while dirty logging is on (a write never
//! logged) or map a page outside every memslot. This type has no method
//! that changes an entry, an entry count or the table's policy, and no way
//! back to the table or its allocator.
//!
//! ```compile_fail,E0599
//! use s2mmu::{mmu::Mmu, memslot::MemslotStore, sync::Platform};
//! use s2mmu::{MmOps, Prot, PteFormat};
//! fn relax<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform>(m: &Mmu<F, M, S, P>) {
//!     let _ = m.with_table(|pt| pt.relax_perms(0x4000_0000, Prot::RW));
//! }
//! ```
//!
//! Nor do the other writers that take `&self`:
//!
//! ```compile_fail,E0599
//! use s2mmu::{mmu::Mmu, memslot::MemslotStore, sync::Platform};
//! use s2mmu::{MmOps, Prot, PteFormat};
//! fn relax<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform>(m: &Mmu<F, M, S, P>) {
//!     let _ = m.with_table(|pt| pt.relax_perms_at_level(0x4000_0000, Prot::RW, 3));
//! }
//! ```
//!
//! ```compile_fail,E0599
//! use s2mmu::{mmu::Mmu, memslot::MemslotStore, sync::Platform};
//! use s2mmu::{MmOps, PteFormat};
//! fn young<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform>(m: &Mmu<F, M, S, P>) {
//!     let _ = m.with_table(|pt| pt.mkyoung(0x4000_0000));
//! }
//! ```
//!
//! The same function reading through the view compiles:
//!
//! ```
//! use s2mmu::{mmu::Mmu, memslot::MemslotStore, sync::Platform};
//! use s2mmu::{MmOps, Prot, PteFormat};
//! fn read<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform>(m: &Mmu<F, M, S, P>) {
//!     let _ = m.with_table(|pt| pt.translate(0x4000_0000).map(|t| t.prot == Prot::RW));
//! }
//! ```

use crate::dirty::DirtyBitmap;
use crate::format::PteFormat;
use crate::pgtable::{Leaf, PageTable, Translation};
use crate::table::MmOps;
use crate::tlb::{TlbInvalidate, TlbPolicy};
use crate::Result;
use alloc::sync::Arc;
use alloc::vec::Vec;

/// A read-only view of a live stage-2 table (see the module documentation).
/// Each method is the [`PageTable`] method of the same name.
pub struct TableView<'a, F: PteFormat, M: MmOps> {
    pt: &'a PageTable<F, M>,
}

impl<F: PteFormat, M: MmOps> Clone for TableView<'_, F, M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F: PteFormat, M: MmOps> Copy for TableView<'_, F, M> {}

impl<'a, F: PteFormat, M: MmOps> TableView<'a, F, M> {
    /// A view of `pt`.
    pub(crate) fn new(pt: &'a PageTable<F, M>) -> Self {
        TableView { pt }
    }

    /// As [`PageTable::bbm_id`].
    pub fn bbm_id(&self) -> usize {
        self.pt.bbm_id()
    }

    /// As [`PageTable::format`].
    pub fn format(&self) -> &'a F {
        self.pt.format()
    }

    /// As [`PageTable::tlb`]: invalidations change no entry, so an extra one
    /// costs only a refill.
    pub fn tlb(&self) -> &'a Arc<dyn TlbInvalidate> {
        self.pt.tlb()
    }

    /// As [`PageTable::tlb_policy`].
    pub fn tlb_policy(&self) -> TlbPolicy {
        self.pt.tlb_policy()
    }

    /// As [`PageTable::root_pa`].
    pub fn root_pa(&self) -> u64 {
        self.pt.root_pa()
    }

    /// As [`PageTable::translate`].
    pub fn translate(&self, ipa: u64) -> Option<Translation> {
        self.pt.translate(ipa)
    }

    /// As [`PageTable::check_range`].
    ///
    /// # Errors
    /// As [`PageTable::check_range`].
    pub fn check_range(&self, ipa: u64, size: u64) -> Result<()> {
        self.pt.check_range(ipa, size)
    }

    /// As [`PageTable::lookup`].
    ///
    /// # Errors
    /// As [`PageTable::lookup`].
    pub fn lookup(&self, ipa: u64) -> Result<(u32, u64)> {
        self.pt.lookup(ipa)
    }

    /// As [`PageTable::leaves`].
    ///
    /// # Errors
    /// As [`PageTable::leaves`].
    pub fn leaves(&self, ipa: u64, size: u64) -> Result<Vec<Leaf>> {
        self.pt.leaves(ipa, size)
    }

    /// As [`PageTable::table_pages`].
    pub fn table_pages(&self) -> usize {
        self.pt.table_pages()
    }

    /// As [`PageTable::check_counts`].
    ///
    /// # Errors
    /// As [`PageTable::check_counts`].
    pub fn check_counts(&self) -> Result<usize> {
        self.pt.check_counts()
    }

    /// As [`PageTable::split_capacity`].
    pub fn split_capacity(&self, bytes: u64) -> usize {
        self.pt.split_capacity(bytes)
    }

    /// As [`PageTable::scan_hw_dirty`]: it only reads the table.
    ///
    /// # Errors
    /// As [`PageTable::scan_hw_dirty`].
    pub fn scan_hw_dirty(&self, ipa: u64, size: u64, dirty: impl FnMut(u64, u64)) -> Result<u64> {
        self.pt.scan_hw_dirty(ipa, size, dirty)
    }

    /// As [`PageTable::scan_hw_dirty_into`]: it writes only `bitmap`.
    ///
    /// # Errors
    /// As [`PageTable::scan_hw_dirty_into`].
    pub fn scan_hw_dirty_into(
        &self,
        ipa: u64,
        size: u64,
        base: u64,
        bitmap: &DirtyBitmap,
    ) -> Result<u64> {
        self.pt.scan_hw_dirty_into(ipa, size, base, bitmap)
    }
}
