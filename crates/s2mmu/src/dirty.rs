//! Dirty tracking: per-slot bitmaps and per-vCPU dirty rings, with KVM's
//! interfaces and rules (`KVM_GET_DIRTY_LOG`, `KVM_CLEAR_DIRTY_LOG`,
//! `KVM_RESET_DIRTY_RINGS`).
//!
//! Bitmaps are words of 64 pages updated with word-at-a-time atomics: a
//! vCPU marks with `fetch_or`, a harvest takes a word with `swap` (legacy
//! mode) or clears exactly the bits a caller asks for with `fetch_and` and
//! learns which of them were set (manual-protect mode). The page-table side
//! (re-protecting the pages whose bits were cleared) is done by
//! [`crate::mmu::Mmu`].

use crate::{Error, Result};
use alloc::boxed::Box;
use alloc::vec::Vec;
#[cfg(not(loom))]
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// One slot's dirty bitmap: bit `i` is page `base_gfn + i`.
pub struct DirtyBitmap {
    words: Box<[AtomicU64]>,
    npages: u64,
}

impl DirtyBitmap {
    /// A bitmap for `npages` pages, all clear or (KVM's
    /// `KVM_DIRTY_LOG_INITIALLY_SET`) all set.
    pub fn new(npages: u64, all_set: bool) -> Self {
        let n = npages.div_ceil(64) as usize;
        let words: Vec<AtomicU64> = (0..n)
            .map(|i| {
                let left = npages - i as u64 * 64;
                let v = match (all_set, left >= 64) {
                    (false, _) => 0,
                    (true, true) => u64::MAX,
                    (true, false) => (1 << left) - 1,
                };
                AtomicU64::new(v)
            })
            .collect();
        DirtyBitmap {
            words: words.into_boxed_slice(),
            npages,
        }
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

/// Entry flags of a dirty ring (`struct kvm_dirty_gfn.flags`).
pub mod ring_flags {
    /// Published by the vCPU, not yet harvested.
    pub const DIRTY: u32 = 1 << 0;
    /// Harvested, waiting for reset.
    pub const RESET: u32 = 1 << 1;
}

/// One ring entry.
struct RingEntry {
    flags: AtomicU32,
    slot: AtomicU32,
    offset: AtomicU64,
}

impl RingEntry {
    fn new() -> Self {
        RingEntry {
            flags: AtomicU32::new(0),
            slot: AtomicU32::new(0),
            offset: AtomicU64::new(0),
        }
    }
}

/// A harvested dirty page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirtyGfn {
    /// Slot id.
    pub slot: u32,
    /// Page offset in the slot.
    pub offset: u64,
}

/// A per-vCPU dirty ring (KVM's `kvm_dirty_ring`): the vCPU pushes, a
/// collector harvests in order and marks entries harvested, and a reset
/// re-protects the harvested pages and frees their entries. When the ring
/// reaches its soft limit the vCPU must stop until it is reset.
pub struct DirtyRing {
    entries: Box<[RingEntry]>,
    /// Next entry the vCPU writes (only the vCPU writes it).
    dirty_index: AtomicU64,
    /// Next entry a reset frees.
    reset_index: AtomicU64,
    /// Next entry the collector harvests.
    fetch_index: AtomicU64,
    soft_limit: u64,
}

/// Entries kept free beyond the soft limit so that pushes already under
/// way when it is reached never overflow (`KVM_DIRTY_RING_RSVD_ENTRIES`).
pub const RING_RESERVED_ENTRIES: u32 = 64;

impl DirtyRing {
    /// A ring of `entries` entries (a power of two, 256..=65536).
    ///
    /// # Errors
    /// [`Error::InvalidRingSize`].
    pub fn new(entries: u32) -> Result<Self> {
        if !entries.is_power_of_two() || !(256..=65536).contains(&entries) {
            return Err(Error::InvalidRingSize { entries });
        }
        Ok(DirtyRing {
            entries: (0..entries).map(|_| RingEntry::new()).collect(),
            dirty_index: AtomicU64::new(0),
            reset_index: AtomicU64::new(0),
            fetch_index: AtomicU64::new(0),
            soft_limit: u64::from(entries - RING_RESERVED_ENTRIES),
        })
    }

    /// Entries published and not yet reset.
    pub fn used(&self) -> u64 {
        self.dirty_index.load(Ordering::Acquire) - self.reset_index.load(Ordering::Acquire)
    }

    /// Whether the vCPU must stop until a reset (`KVM_EXIT_DIRTY_RING_FULL`).
    pub fn soft_full(&self) -> bool {
        self.used() >= self.soft_limit
    }

    /// Publishes a dirty page. Called only by the owning vCPU.
    ///
    /// # Errors
    /// [`Error::RingFull`] if the ring is hard-full (the vCPU ignored the
    /// soft limit); nothing is written then.
    pub fn push(&self, vcpu: usize, slot: u32, offset: u64) -> Result<()> {
        let di = self.dirty_index.load(Ordering::Relaxed);
        if di - self.reset_index.load(Ordering::Acquire) >= self.entries.len() as u64 {
            return Err(Error::RingFull { vcpu });
        }
        let e = &self.entries[(di as usize) & (self.entries.len() - 1)];
        e.slot.store(slot, Ordering::Relaxed);
        e.offset.store(offset, Ordering::Relaxed);
        e.flags.store(ring_flags::DIRTY, Ordering::Release);
        self.dirty_index.store(di + 1, Ordering::Release);
        Ok(())
    }

    /// Harvests published entries in order, marking each harvested, and
    /// appends them to `out`; returns how many.
    pub fn harvest(&self, out: &mut Vec<DirtyGfn>) -> usize {
        let n = self.entries.len() as u64;
        let mut fetch = self.fetch_index.load(Ordering::Relaxed);
        let mut got = 0;
        loop {
            let e = &self.entries[(fetch % n) as usize];
            if e.flags.load(Ordering::Acquire) != ring_flags::DIRTY {
                break;
            }
            out.push(DirtyGfn {
                slot: e.slot.load(Ordering::Relaxed),
                offset: e.offset.load(Ordering::Relaxed),
            });
            e.flags.store(ring_flags::RESET, Ordering::Release);
            fetch += 1;
            got += 1;
        }
        self.fetch_index.store(fetch, Ordering::Relaxed);
        got
    }

    /// Frees harvested entries in order, calling `reprotect` for each
    /// (slot, offset, 64-page mask) group of consecutive entries, as KVM
    /// coalesces them; returns the number of entries reset.
    pub fn reset(&self, mut reprotect: impl FnMut(u32, u64, u64)) -> u64 {
        let n = self.entries.len() as u64;
        let mut ri = self.reset_index.load(Ordering::Relaxed);
        let mut count = 0;
        let mut group: Option<(u32, u64, u64)> = None;
        loop {
            let e = &self.entries[(ri % n) as usize];
            if e.flags.load(Ordering::Acquire) & ring_flags::RESET == 0 {
                break;
            }
            let slot = e.slot.load(Ordering::Relaxed);
            let offset = e.offset.load(Ordering::Relaxed);
            e.flags.store(0, Ordering::Release);
            ri += 1;
            count += 1;
            group = match group {
                Some((s, base, mask)) if s == slot && offset >= base && offset - base < 64 => {
                    Some((s, base, mask | 1 << (offset - base)))
                }
                Some((s, base, mask)) => {
                    reprotect(s, base, mask);
                    Some((slot, offset, 1))
                }
                None => Some((slot, offset, 1)),
            };
        }
        if let Some((s, base, mask)) = group {
            reprotect(s, base, mask);
        }
        self.reset_index.store(ri, Ordering::Release);
        count
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bitmap_mark_take_and_clear() {
        let b = DirtyBitmap::new(130, false);
        assert_eq!(b.words(), 3);
        assert!(b.mark(0) && b.mark(65) && b.mark(129));
        assert!(!b.mark(65), "second mark finds it dirty");
        assert!(!b.mark(130), "beyond the slot is ignored");
        assert_eq!(b.count(), 3);
        let mut out = [0u64; 3];
        b.copy_to(&mut out).unwrap();
        assert_eq!(out, [1, 2, 2]);
        assert_eq!(b.clear_masked(1, 0b111), 0b10, "only bits that were set");
        assert_eq!(b.take_word(2), 2);
        assert_eq!(b.count(), 1);
        assert!(matches!(
            b.copy_to(&mut [0u64; 2]),
            Err(Error::BitmapTooSmall { .. })
        ));
    }

    #[test]
    fn words_beyond_the_bitmap_are_clean_not_a_panic() {
        // Indexed `words[index]` before: out of bounds panicked.
        let b = DirtyBitmap::new(130, true);
        assert_eq!(b.take_word(3), 0);
        assert_eq!(b.take_word(usize::MAX), 0);
        assert_eq!(b.clear_masked(3, u64::MAX), 0);
        assert_eq!(b.count(), 130, "nothing in range was touched");
    }

    #[test]
    fn initially_set_covers_exactly_the_slot() {
        let b = DirtyBitmap::new(70, true);
        assert_eq!(b.count(), 70);
        assert!(b.is_set(69) && !b.is_set(70));
    }

    #[test]
    fn clear_arguments_follow_kvm() {
        assert_eq!(
            check_clear_args(1, 64, 256, 4),
            Err(Error::ClearNotAligned { first_page: 1 })
        );
        assert!(check_clear_args(0, 256, 256, 4).is_ok());
        assert!(check_clear_args(64, 64, 256, 1).is_ok());
        // Not a multiple of 64, but reaches the slot's end: allowed.
        assert!(check_clear_args(64, 36, 100, 1).is_ok());
        assert!(matches!(
            check_clear_args(0, 36, 100, 1),
            Err(Error::ClearBadRange { .. })
        ));
        assert!(matches!(
            check_clear_args(0, 257, 256, 5),
            Err(Error::ClearBadRange { .. })
        ));
        assert!(matches!(
            check_clear_args(320, 0, 256, 0),
            Err(Error::ClearBadRange { .. })
        ));
        assert!(matches!(
            check_clear_args(0, 256, 256, 3),
            Err(Error::BitmapTooSmall { .. })
        ));
    }

    #[test]
    fn ring_push_harvest_reset() {
        assert!(DirtyRing::new(100).is_err());
        assert!(DirtyRing::new(128).is_err());
        let r = DirtyRing::new(256).unwrap();
        for off in [3u64, 4, 10, 200] {
            r.push(0, 1, off).unwrap();
        }
        r.push(0, 2, 5).unwrap();
        let mut got = Vec::new();
        assert_eq!(r.harvest(&mut got), 5);
        assert_eq!(got[0], DirtyGfn { slot: 1, offset: 3 });
        assert_eq!(
            r.harvest(&mut got),
            0,
            "harvested entries are not returned twice"
        );
        let mut groups = Vec::new();
        assert_eq!(r.reset(|s, o, m| groups.push((s, o, m))), 5);
        assert_eq!(groups, vec![(1, 3, 0b1000_0011), (1, 200, 1), (2, 5, 1)]);
        assert_eq!(r.used(), 0);
    }

    #[test]
    fn ring_soft_and_hard_full() {
        let r = DirtyRing::new(256).unwrap();
        for i in 0..192u64 {
            assert!(!r.soft_full());
            r.push(3, 0, i).unwrap();
        }
        assert!(
            r.soft_full(),
            "soft limit is size minus the reserved entries"
        );
        for i in 192..256u64 {
            r.push(3, 0, i).unwrap();
        }
        assert_eq!(r.push(3, 0, 0), Err(Error::RingFull { vcpu: 3 }));
        let mut got = Vec::new();
        r.harvest(&mut got);
        assert_eq!(r.reset(|_, _, _| {}), 256);
        assert!(!r.soft_full());
        r.push(3, 0, 7).unwrap();
    }
}
