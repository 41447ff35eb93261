//! Several dirty consumers of one slot: the slot's own log (GET/CLEAR) and
//! any number of dirty views (a migration, an incremental snapshot, a
//! working-set estimator), each with its own bitmap, over one stage-2 table
//! and one write protection.
//!
//! The fault path keeps marking the slot's one shared [`DirtyBitmap`]. While
//! views are open, every harvest *folds* it: takes its words and ORs them
//! into every consumer's bitmap and into `writable`, the pages that may be
//! writable in the table (made writable by a fault, or never protected, and
//! not protected since). A consumer's clear clears its own bits and returns
//! the cleared pages that are still in `writable`: only those need a
//! write-protect (and a TLB flush). A page protected by another consumer's
//! clear and not written since is clean in the table already, so a second
//! consumer costs the guest no second fault for it.
//!
//! No consumer loses a write: a write to a protected page faults and marks
//! the shared bitmap, which the next fold gives to every consumer; a page
//! that is writable is in the shared bitmap (its fault's mark, not folded
//! yet) or in `writable` (folded, not protected since), and a clear
//! protects every cleared page of `writable`. A mark that lands after a
//! consumer cleared the page (a fault racing with the clear) reaches that
//! consumer at the next fold: an over-report, never a loss.
//!
//! The table side (write-protecting, flushing) is done by
//! [`crate::mmu::Mmu`]; this is the bookkeeping, with its own tests.

use super::DirtyBitmap;
use crate::{Error, Result};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// Views a slot may have open at once (besides its own log): each costs a
/// bitmap of a bit per page and a pass over it at every fold.
pub const MAX_DIRTY_VIEWS_PER_SLOT: usize = 8;

/// A consumer of a slot's dirty log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirtyConsumer {
    /// The slot's own `KVM_GET_DIRTY_LOG`/`KVM_CLEAR_DIRTY_LOG` caller.
    Log,
    /// An open dirty view, by id.
    View(u64),
}

/// What one consumer's gets and clears did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirtyViewStats {
    /// Gets (harvests).
    pub gets: u64,
    /// Pages its gets reported dirty, summed over gets.
    pub reported: u64,
    /// Pages the consumer was opened with marked dirty: a view starts all
    /// dirty (it cannot know what changed before it existed), so these are
    /// reported once whether written or not, an over-report by design.
    pub opened_dirty: u64,
    /// Pages its clears cleared.
    pub cleared: u64,
    /// Of those, pages its clears write-protected (they could be writable).
    pub protected: u64,
    /// Of those, pages that needed no protect: clean in the table since
    /// another consumer's clear and not written since.
    pub already_protected: u64,
    /// Clears that flushed the TLB (those that protected a page).
    pub flushes: u64,
}

/// One consumer's bitmap and counters.
struct Consumer {
    who: DirtyConsumer,
    bits: DirtyBitmap,
    stats: DirtyViewStats,
}

/// The consumers of one logged slot while it has views open.
pub struct SlotViews {
    slot: u16,
    shared: Arc<DirtyBitmap>,
    /// Pages that may be writable in the table: folded from `shared` and
    /// not write-protected since.
    writable: DirtyBitmap,
    /// `consumers[0]` is [`DirtyConsumer::Log`]; views follow.
    consumers: Vec<Consumer>,
}

impl SlotViews {
    /// The consumers of slot `slot`, whose fault path marks `shared`: the
    /// slot's log takes over what `shared` holds (the pages it has not
    /// cleared yet, which are also the pages that may be writable), and
    /// no view is open yet.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when its bitmaps cannot be allocated.
    pub fn new(slot: u16, shared: Arc<DirtyBitmap>) -> Result<Self> {
        let n = shared.npages();
        let s = u32::from(slot);
        let mut consumers = Vec::new();
        consumers
            .try_reserve(MAX_DIRTY_VIEWS_PER_SLOT + 1)
            .map_err(|_| Error::OutOfMemory)?;
        consumers.push(Consumer {
            who: DirtyConsumer::Log,
            bits: DirtyBitmap::try_for_slot(s, n, false)?,
            stats: DirtyViewStats::default(),
        });
        let views = SlotViews {
            slot,
            writable: DirtyBitmap::try_for_slot(s, n, false)?,
            consumers,
            shared,
        };
        views.fold();
        Ok(views)
    }

    /// The slot.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The shared bitmap the fault path marks.
    pub fn shared(&self) -> &Arc<DirtyBitmap> {
        &self.shared
    }

    /// Open views (the slot's log not counted).
    pub fn views(&self) -> usize {
        self.consumers.len() - 1
    }

    /// Whether view `view` is one of these.
    pub fn has_view(&self, view: u64) -> bool {
        self.index(DirtyConsumer::View(view)).is_some()
    }

    /// Opens view `view`, every page dirty.
    ///
    /// # Errors
    /// [`Error::TooManyDirtyViews`] when [`MAX_DIRTY_VIEWS_PER_SLOT`] are
    /// open, [`Error::OutOfMemory`] when its bitmap cannot be allocated;
    /// nothing changes then.
    pub fn open(&mut self, view: u64) -> Result<()> {
        if self.views() >= MAX_DIRTY_VIEWS_PER_SLOT {
            return Err(Error::TooManyDirtyViews {
                slot: u32::from(self.slot),
                limit: MAX_DIRTY_VIEWS_PER_SLOT,
            });
        }
        let n = self.shared.npages();
        let bits = DirtyBitmap::try_for_slot(u32::from(self.slot), n, true)?;
        self.consumers
            .try_reserve(1)
            .map_err(|_| Error::OutOfMemory)?;
        self.consumers.push(Consumer {
            who: DirtyConsumer::View(view),
            bits,
            stats: DirtyViewStats {
                opened_dirty: n,
                ..DirtyViewStats::default()
            },
        });
        Ok(())
    }

    /// Closes view `view` and frees its bitmap; false if it is not open.
    pub fn close(&mut self, view: u64) -> bool {
        match self.index(DirtyConsumer::View(view)) {
            Some(i) => {
                self.consumers.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// Hands the slot's log back to the shared bitmap (the last view
    /// closed): what the log has not cleared, and every page that may be
    /// writable, is marked in it again, so the slot's log alone loses
    /// nothing either.
    pub fn restore(self) {
        self.fold();
        for i in 0..self.shared.words() {
            let keep = self.consumers[0].bits.word(i) | self.writable.word(i);
            self.shared.mark_word(i, keep);
        }
    }

    fn index(&self, who: DirtyConsumer) -> Option<usize> {
        self.consumers.iter().position(|c| c.who == who)
    }

    /// Folds word `i` of the shared bitmap into every consumer.
    pub fn fold_word(&self, i: usize) {
        let w = self.shared.take_word(i);
        if w != 0 {
            self.writable.mark_word(i, w);
            for c in &self.consumers {
                c.bits.mark_word(i, w);
            }
        }
    }

    /// Folds the whole shared bitmap into every consumer.
    pub fn fold(&self) {
        for i in 0..self.shared.words() {
            self.fold_word(i);
        }
    }

    /// Consumer `who`'s bitmap.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`] for a view that is not open here.
    pub fn bits(&self, who: DirtyConsumer) -> Result<&DirtyBitmap> {
        Ok(&self.consumers[self.consumer(who)?].bits)
    }

    /// Consumer `who`'s counters, to update.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`] for a view that is not open here.
    pub fn stats_mut(&mut self, who: DirtyConsumer) -> Result<&mut DirtyViewStats> {
        let i = self.consumer(who)?;
        Ok(&mut self.consumers[i].stats)
    }

    fn consumer(&self, who: DirtyConsumer) -> Result<usize> {
        self.index(who).ok_or(match who {
            DirtyConsumer::View(view) => Error::UnknownDirtyView { view },
            // The log is consumers[0], always present.
            DirtyConsumer::Log => Error::LoggingDisabled {
                slot: u32::from(self.slot),
            },
        })
    }

    /// Clears the pages of `mask` in word `i` of consumer `who` (after
    /// folding that word): returns the pages cleared and, of those, the
    /// ones the caller must write-protect (they may be writable; they are
    /// no longer counted so, the caller protecting them before it lets a
    /// fault in, under the MMU's write lock).
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`] for a view that is not open here.
    pub fn clear_word(&self, who: DirtyConsumer, i: usize, mask: u64) -> Result<(u64, u64)> {
        let c = self.consumer(who)?;
        if mask == 0 {
            return Ok((0, 0));
        }
        self.fold_word(i);
        let cleared = self.consumers[c].bits.clear_masked(i, mask);
        let protect = self.writable.clear_masked(i, cleared);
        Ok((cleared, protect))
    }
}

impl SlotViews {
    /// Undoes a [`SlotViews::clear_word`] whose protect failed: the pages
    /// are dirty for `who` again and may be writable.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`] for a view that is not open here.
    pub fn undo_clear(
        &self,
        who: DirtyConsumer,
        i: usize,
        cleared: u64,
        protect: u64,
    ) -> Result<()> {
        let c = self.consumer(who)?;
        self.consumers[c].bits.mark_word(i, cleared);
        self.writable.mark_word(i, protect);
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use alloc::vec;

    fn slot(npages: u64) -> SlotViews {
        SlotViews::new(0, Arc::new(DirtyBitmap::for_slot(0, npages, false))).unwrap()
    }

    /// Clears every page a consumer has dirty; returns how many, and the
    /// pages to protect.
    fn clear_all(v: &SlotViews, who: DirtyConsumer) -> (u32, Vec<u64>) {
        let (mut n, mut protect) = (0, Vec::new());
        for i in 0..v.shared().words() {
            let (c, mut p) = v.clear_word(who, i, u64::MAX).unwrap();
            n += c.count_ones();
            while p != 0 {
                protect.push(i as u64 * 64 + u64::from(p.trailing_zeros()));
                p &= p - 1;
            }
        }
        (n, protect)
    }

    #[test]
    fn one_consumers_clear_never_hides_a_page_from_another() {
        let mut v = slot(64);
        v.open(1).unwrap();
        v.open(2).unwrap();
        clear_all(&v, DirtyConsumer::View(1));
        clear_all(&v, DirtyConsumer::View(2));
        clear_all(&v, DirtyConsumer::Log);
        // A fault makes page 5 writable and marks it.
        v.shared().mark(5);
        assert_eq!(clear_all(&v, DirtyConsumer::View(1)), (1, vec![5]));
        v.fold();
        assert!(v.bits(DirtyConsumer::View(2)).unwrap().is_set(5));
        assert!(v.bits(DirtyConsumer::Log).unwrap().is_set(5));
        assert!(!v.bits(DirtyConsumer::View(1)).unwrap().is_set(5));
    }

    #[test]
    fn a_page_protected_by_one_clear_needs_no_second_protect() {
        let mut v = slot(128);
        v.open(7).unwrap();
        clear_all(&v, DirtyConsumer::Log);
        clear_all(&v, DirtyConsumer::View(7));
        v.shared().mark(70);
        v.shared().mark(3);
        assert_eq!(clear_all(&v, DirtyConsumer::Log), (2, vec![3, 70]));
        // View 7 still reports both, and needs neither protected again.
        assert_eq!(clear_all(&v, DirtyConsumer::View(7)), (2, vec![]));
        // Written again after both clears: protected once more, by the
        // first clear to come.
        v.shared().mark(3);
        assert_eq!(clear_all(&v, DirtyConsumer::View(7)), (1, vec![3]));
        assert_eq!(clear_all(&v, DirtyConsumer::Log), (1, vec![]));
    }

    #[test]
    fn a_new_view_starts_all_dirty_and_pages_may_be_writable() {
        let shared = Arc::new(DirtyBitmap::for_slot(0, 100, false));
        shared.mark(9);
        let mut v = SlotViews::new(0, shared).unwrap();
        assert!(v.bits(DirtyConsumer::Log).unwrap().is_set(9));
        v.open(1).unwrap();
        assert_eq!(v.bits(DirtyConsumer::View(1)).unwrap().count(), 100);
        // Only page 9 could be writable: it alone is protected.
        assert_eq!(clear_all(&v, DirtyConsumer::View(1)), (100, vec![9]));
    }

    #[test]
    fn restore_hands_uncleared_pages_back_to_the_shared_bitmap() {
        let shared = Arc::new(DirtyBitmap::for_slot(0, 64, false));
        let mut v = SlotViews::new(0, shared.clone()).unwrap();
        v.open(1).unwrap();
        shared.mark(1);
        shared.mark(2);
        assert_eq!(v.clear_word(DirtyConsumer::Log, 0, 1 << 1).unwrap(), (2, 2));
        assert!(v.close(1));
        assert!(!v.close(1), "closed already");
        v.restore();
        assert!(shared.is_set(2) && !shared.is_set(1));
    }

    #[test]
    fn limits_and_unknown_views_are_typed_errors() {
        let mut v = slot(64);
        for id in 0..MAX_DIRTY_VIEWS_PER_SLOT as u64 {
            v.open(id).unwrap();
        }
        assert_eq!(
            v.open(99),
            Err(Error::TooManyDirtyViews {
                slot: 0,
                limit: MAX_DIRTY_VIEWS_PER_SLOT
            })
        );
        assert_eq!(v.views(), MAX_DIRTY_VIEWS_PER_SLOT);
        assert!(matches!(
            v.clear_word(DirtyConsumer::View(99), 0, 1),
            Err(Error::UnknownDirtyView { view: 99 })
        ));
    }
}
