//! What the fault path records into ([`DirtyTracker`]), what a harvest
//! returns ([`DirtyGfn`]) and the checks of a clear's arguments.

use crate::{Error, Result};
use alloc::vec::Vec;

/// Where the fault path records that a page became dirty: one place, one
/// call, whatever the tracking mode.
pub trait DirtyTracker: Send + Sync {
    /// Records that vCPU `vcpu` dirtied page `offset` of slot `slot`;
    /// `Ok(true)` if this is a new record, `Ok(false)` if the page was
    /// recorded already (a bitmap keeps one bit per page; a ring records
    /// every push).
    ///
    /// # Errors
    /// [`Error::OutsideSlot`] for a page the tracker does not cover (a
    /// bitmap: beyond its slot), [`Error::RingFull`] for a full ring; the
    /// record is not made then.
    fn mark(&self, vcpu: usize, slot: u32, offset: u64) -> Result<bool>;

    /// Moves the records not collected yet into `out`, oldest first where
    /// the tracker keeps an order; returns how many.
    fn collect(&self, out: &mut Vec<DirtyGfn>) -> usize;
}

/// A harvested dirty page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirtyGfn {
    /// Slot id.
    pub slot: u32,
    /// Page offset in the slot: an index into the slot's pages, not an
    /// address, so a bare `u64` (KVM's `kvm_dirty_gfn.offset`); the gfn is
    /// the slot's [`crate::memslot::Slot::base_gfn`] plus this.
    pub offset: u64,
}

/// Checks `KVM_CLEAR_DIRTY_LOG`'s arguments for a slot of `slot_pages`
/// pages and a caller bitmap of `bitmap_words` words (bit 0 of word 0 is
/// `first_page`).
///
/// # Errors
/// [`Error::ClearNotAligned`], [`Error::ClearBadRange`],
/// [`Error::BitmapTooSmall`].
pub fn check_clear_args(
    first_page: u64,
    num_pages: u64,
    slot_pages: u64,
    bitmap_words: usize,
) -> Result<()> {
    if !first_page.is_multiple_of(64) {
        return Err(Error::ClearNotAligned { first_page });
    }
    let bad = first_page > slot_pages
        || num_pages > slot_pages - first_page
        || (num_pages < slot_pages - first_page && !num_pages.is_multiple_of(64));
    if bad {
        return Err(Error::ClearBadRange {
            first_page,
            num_pages,
            slot_pages,
        });
    }
    let needed = num_pages.div_ceil(64) as usize;
    if bitmap_words < needed {
        return Err(Error::BitmapTooSmall {
            words: bitmap_words,
            needed,
        });
    }
    Ok(())
}
