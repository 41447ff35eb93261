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
//!
//! [`DirtyTracker`] is what the fault path records into: the bitmap
//! ([`DirtyBitmap`]) and the ring ([`DirtyRing`]) implement it, and every
//! implementation runs the same conformance tests (`conformance`). Hardware
//! dirty state records in the page table itself and is scanned into a
//! bitmap (see [`crate::mmu::DirtyMode::Hardware`]).
//!
//! Several consumers of one slot's log (dirty views: a migration, a
//! snapshot, a working-set estimator) each keep a bitmap of their own
//! ([`SlotViews`]) over one write protection.

mod bitmap;
#[cfg(all(test, not(loom)))]
mod conformance;
mod ring;
mod tracker;
mod view;

pub use bitmap::DirtyBitmap;
pub use ring::{ring_flags, DirtyRing, RING_RESERVED_ENTRIES};
pub use tracker::{check_clear_args, DirtyGfn, DirtyTracker};
pub use view::{DirtyConsumer, DirtyViewStats, SlotViews, MAX_DIRTY_VIEWS_PER_SLOT};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::Error;

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
