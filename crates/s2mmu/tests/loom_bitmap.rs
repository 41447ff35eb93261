//! Model check (loom) of the dirty bitmap under concurrent marking: a vCPU
//! marks pages (the fast path's `fetch_or`) while the collector runs the
//! legacy GET (take-and-clear) or the manual-protect GET + CLEAR. No mark
//! may be lost in any interleaving.
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p s2mmu --release --test loom_bitmap`.
#![cfg(loom)]

use loom::sync::Arc;
use s2mmu::dirty::DirtyBitmap;

const PAGES: [u64; 2] = [1, 2];

/// A bitmap and a vCPU thread marking `PAGES` in it, as the fault path does.
fn bitmap_with_marking_vcpu() -> (Arc<DirtyBitmap>, loom::thread::JoinHandle<()>) {
    let map = Arc::new(DirtyBitmap::new(64, false));
    let m2 = map.clone();
    let vcpu = loom::thread::spawn(move || {
        for p in PAGES {
            m2.mark(p);
        }
    });
    (map, vcpu)
}

#[test]
fn legacy_get_takes_every_mark_once() {
    loom::model(|| {
        let (map, vcpu) = bitmap_with_marking_vcpu();
        let first = map.take_word(0);
        vcpu.join().unwrap();
        let second = map.take_word(0);
        for p in PAGES {
            let bit = 1u64 << p;
            assert_eq!(
                u32::from(first & bit != 0) + u32::from(second & bit != 0),
                1,
                "page {p} must be harvested exactly once (first {first:#x}, second {second:#x})"
            );
        }
        assert_eq!(map.take_word(0), 0);
    });
}

#[test]
fn manual_clear_never_drops_an_unseen_mark() {
    loom::model(|| {
        let (map, vcpu) = bitmap_with_marking_vcpu();
        // GET copies, CLEAR clears only what the caller saw.
        let mut seen = [0u64; 1];
        map.copy_to(&mut seen).unwrap();
        let cleared = map.clear_masked(0, seen[0]);
        assert_eq!(
            cleared & !seen[0],
            0,
            "CLEAR cleared a bit the caller never saw"
        );
        vcpu.join().unwrap();
        let mut after = [0u64; 1];
        map.copy_to(&mut after).unwrap();
        for p in PAGES {
            let bit = 1u64 << p;
            assert!(
                cleared & bit != 0 || after[0] & bit != 0,
                "page {p} was marked but is neither in the cleared set nor still dirty"
            );
        }
    });
}
