//! Per-slot dirty bitmaps: words of 64 pages updated with word-at-a-time
//! atomics.

use super::{DirtyGfn, DirtyTracker};
use crate::{Error, Result};
use alloc::boxed::Box;
use alloc::vec::Vec;
#[cfg(not(loom))]
use core::sync::atomic::{AtomicU64, Ordering};
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};

/// One slot's dirty bitmap: bit `i` is page `base_gfn + i`.
pub struct DirtyBitmap {
    words: Box<[AtomicU64]>,
    npages: u64,
    slot: u32,
}

impl DirtyBitmap {
    /// A bitmap for `npages` pages, all clear or (KVM's
    /// `KVM_DIRTY_LOG_INITIALLY_SET`) all set.
    ///
    /// # Panics
    /// If its memory cannot be allocated (a bit per page); for a size a
    /// caller chose, use [`DirtyBitmap::try_new`].
    pub fn new(npages: u64, all_set: bool) -> Self {
        Self::try_new(npages, all_set).expect("memory for a dirty bitmap")
    }

    /// [`DirtyBitmap::new`], failing instead of aborting where its memory
    /// cannot be had.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when the allocator refuses its words (or
    /// their count does not fit the address space).
    pub fn try_new(npages: u64, all_set: bool) -> Result<Self> {
        let n = usize::try_from(npages.div_ceil(64)).map_err(|_| Error::OutOfMemory)?;
        let mut words: Vec<AtomicU64> = Vec::new();
        words.try_reserve_exact(n).map_err(|_| Error::OutOfMemory)?;
        words.extend((0..n).map(|i| {
            let left = npages - i as u64 * 64;
            let v = match (all_set, left >= 64) {
                (false, _) => 0,
                (true, true) => u64::MAX,
                (true, false) => (1 << left) - 1,
            };
            AtomicU64::new(v)
        }));
        Ok(DirtyBitmap {
            words: words.into_boxed_slice(),
            npages,
            slot: 0,
        })
    }

    /// A bitmap of slot `slot` ([`DirtyBitmap::new`] is slot 0): the slot
    /// its [`DirtyTracker`] records name.
    ///
    /// # Panics
    /// As [`DirtyBitmap::new`]; [`DirtyBitmap::try_for_slot`] fails instead.
    pub fn for_slot(slot: u32, npages: u64, all_set: bool) -> Self {
        DirtyBitmap {
            slot,
            ..Self::new(npages, all_set)
        }
    }

    /// [`DirtyBitmap::for_slot`], failing where its memory cannot be had.
    ///
    /// # Errors
    /// As [`DirtyBitmap::try_new`].
    pub fn try_for_slot(slot: u32, npages: u64, all_set: bool) -> Result<Self> {
        Ok(DirtyBitmap {
            slot,
            ..Self::try_new(npages, all_set)?
        })
    }

    /// The slot it tracks.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// Pages covered.
    pub fn npages(&self) -> u64 {
        self.npages
    }

    /// Number of 64-page words.
    pub fn words(&self) -> usize {
        self.words.len()
    }

    /// Marks `page` dirty; returns whether it was clean. Out-of-range pages
    /// are ignored (returns false).
    #[inline]
    pub fn mark(&self, page: u64) -> bool {
        if page >= self.npages {
            return false;
        }
        let bit = 1u64 << (page % 64);
        self.words[(page / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit == 0
    }

    /// Whether `page` is marked.
    pub fn is_set(&self, page: u64) -> bool {
        page < self.npages
            && self.words[(page / 64) as usize].load(Ordering::Relaxed) & (1 << (page % 64)) != 0
    }

    /// Number of dirty pages.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// Copies the bitmap into `out` without clearing it (manual-protect GET).
    ///
    /// # Errors
    /// [`Error::BitmapTooSmall`] if `out` has fewer words than the bitmap.
    pub fn copy_to(&self, out: &mut [u64]) -> Result<()> {
        if out.len() < self.words.len() {
            return Err(Error::BitmapTooSmall {
                words: out.len(),
                needed: self.words.len(),
            });
        }
        for (o, w) in out.iter_mut().zip(self.words.iter()) {
            *o = w.load(Ordering::Relaxed);
        }
        Ok(())
    }

    /// Word `index` (pages `64 * index ..`), 0 beyond the bitmap.
    #[inline]
    pub fn word(&self, index: usize) -> u64 {
        self.words
            .get(index)
            .map_or(0, |w| w.load(Ordering::Relaxed))
    }

    /// Marks the pages of `mask` in word `index` at once (a scan of 64
    /// leaves). A word beyond the bitmap is ignored, as are bits past its
    /// last page.
    #[inline]
    pub fn mark_word(&self, index: usize, mask: u64) {
        let Some(word) = self.words.get(index) else {
            return;
        };
        let left = self.npages - index as u64 * 64;
        let valid = if left >= 64 {
            u64::MAX
        } else {
            (1 << left) - 1
        };
        if mask & valid != 0 {
            word.fetch_or(mask & valid, Ordering::Relaxed);
        }
    }

    /// Takes word `index` and clears it (legacy GET: take-and-clear). A word
    /// beyond the bitmap holds no dirty page (returns 0).
    #[inline]
    pub fn take_word(&self, index: usize) -> u64 {
        let Some(word) = self.words.get(index) else {
            return 0;
        };
        if word.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        word.swap(0, Ordering::AcqRel)
    }

    /// Clears the bits of `mask` in word `index` and returns those that were
    /// set (and so are now cleared): KVM's `fetch_andnot` step of CLEAR. A
    /// word beyond the bitmap holds no dirty page (returns 0).
    #[inline]
    pub fn clear_masked(&self, index: usize, mask: u64) -> u64 {
        if mask == 0 {
            return 0;
        }
        let Some(word) = self.words.get(index) else {
            return 0;
        };
        mask & word.fetch_and(!mask, Ordering::AcqRel)
    }
}

impl DirtyTracker for DirtyBitmap {
    fn mark(&self, _vcpu: usize, slot: u32, offset: u64) -> Result<bool> {
        if slot != self.slot {
            return Err(Error::NoSuchSlot { slot });
        }
        if offset >= self.npages {
            return Err(Error::OutsideSlot {
                slot,
                first_page: offset,
                pages: 1,
                slot_pages: self.npages,
            });
        }
        Ok(DirtyBitmap::mark(self, offset))
    }

    fn collect(&self, out: &mut Vec<DirtyGfn>) -> usize {
        let before = out.len();
        for i in 0..self.words.len() {
            let mut w = self.take_word(i);
            while w != 0 {
                let bit = w.trailing_zeros();
                w &= w - 1;
                out.push(DirtyGfn {
                    slot: self.slot,
                    offset: i as u64 * 64 + u64::from(bit),
                });
            }
        }
        out.len() - before
    }
}
