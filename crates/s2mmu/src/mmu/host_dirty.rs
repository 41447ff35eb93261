//! Writes the host makes to guest memory, into the dirty log: KVM's
//! `mark_page_dirty`. A VMM's device models (a virtio queue's used ring, a
//! block device's DMA) write guest memory without a stage-2 fault, so the
//! fault path never sees them; they mark the pages here, and the next GET
//! reports them beside the guest's own writes ([`crate::vmm_bitmap`] does
//! it for rust-vmm's `vm-memory`).

use super::Mmu;
use crate::format::PteFormat;
use crate::memslot::{MemslotStore, SlotLookup};
use crate::sync::{ArcOptionCell, Platform};
use crate::table::MmOps;
use crate::{Error, Result};

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// Marks pages `[first_page, first_page + npages)` of slot `id` dirty
    /// in its log, for writes the host made to them (KVM's
    /// `mark_page_dirty`). Nothing is marked, and `Ok(0)` returned, while
    /// the slot does not log. The mapping is left as it is: the page is in
    /// the log whether the guest has it mapped or not, and the next CLEAR
    /// protects it as any other. Returns the number of pages that were not
    /// marked before.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`]; [`Error::OutOfRange`] for pages beyond the
    /// slot, checked before anything is marked; [`Error::WrongDirtyMode`]
    /// with dirty rings (their entries belong to vCPUs: a host write has
    /// no ring to go to).
    ///
    /// `first_page` is a page offset within the slot, not an address (hence
    /// a bare `u64`), as in a dirty bitmap.
    pub fn mark_dirty_by_host(&self, id: u16, first_page: u64, npages: u64) -> Result<u64> {
        self.strategy.bitmaps()?;
        let snap = self.slots.snapshot();
        let slot = snap.id_to_slot(id).ok_or(Error::no_such_slot(id))?;
        let shift = self.page_shift;
        if !slot.holds_pages(first_page, npages) {
            return Err(Error::OutOfRange {
                ipa: slot.base_gfn().raw().saturating_add(first_page) << shift,
                size: npages.saturating_mul(1 << shift),
                limit: slot.end_gfn().raw() << shift,
            });
        }
        if !slot.dirty_logging() {
            return Ok(0);
        }
        // The bitmap is published before the state in which the slot logs
        // and dropped only after a later one (see `mark_dirty`); `snap` is
        // held to the end, as a fault holds it.
        let Some(bitmap) = self.side[usize::from(id)].dirty.load_full() else {
            return Ok(0);
        };
        let marked = (first_page..first_page + npages)
            .map(|p| u64::from(bitmap.mark(p)))
            .sum();
        drop(snap);
        Ok(marked)
    }

    /// log2 of the page size of the slots (for [`crate::vmm_bitmap`]).
    #[cfg(feature = "vm-memory")]
    pub(crate) fn slot_page_shift(&self) -> u32 {
        self.page_shift
    }

    /// Whether page `page` of slot `id` is marked in the slot's log and
    /// not yet taken by a GET: `false` while the slot does not log. A
    /// guest's write in hardware dirty mode shows here only after a GET
    /// scanned its leaf; with dirty views open a GET moves the marks into
    /// the views' own bitmaps.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`]; [`Error::OutOfRange`] for a page beyond the
    /// slot; [`Error::WrongDirtyMode`] with dirty rings.
    pub fn is_marked_dirty(&self, id: u16, page: u64) -> Result<bool> {
        self.strategy.bitmaps()?;
        let snap = self.slots.snapshot();
        let slot = snap.id_to_slot(id).ok_or(Error::no_such_slot(id))?;
        if page >= slot.npages() {
            return Err(Error::OutOfRange {
                ipa: slot.base_gfn().raw().saturating_add(page) << self.page_shift,
                size: 1 << self.page_shift,
                limit: slot.end_gfn().raw() << self.page_shift,
            });
        }
        let bitmap = self.side[usize::from(id)].dirty.load_full();
        Ok(slot.dirty_logging() && bitmap.is_some_and(|b| b.is_set(page)))
    }
}
