//! The tests every [`DirtyTracker`] runs (the way vm-memory tests every
//! `Bitmap` implementation): what the fault path relies on, whatever the
//! mode.

use super::{DirtyBitmap, DirtyGfn, DirtyRing, DirtyTracker};
use alloc::vec::Vec;
use std::collections::BTreeSet;
use std::sync::Arc;

const SLOT: u32 = 3;

fn collected(t: &dyn DirtyTracker) -> BTreeSet<(u32, u64)> {
    let mut out: Vec<DirtyGfn> = Vec::new();
    let n = t.collect(&mut out);
    assert_eq!(n, out.len(), "collect returns what it appended");
    out.iter().map(|g| (g.slot, g.offset)).collect()
}

/// Each mark is collected once, with its slot and page; a second collect
/// finds nothing; marks after a collect go to the next one.
fn marks_are_collected_once(t: &dyn DirtyTracker) {
    for p in [0u64, 1, 63, 64, 100] {
        assert_eq!(t.mark(0, SLOT, p), Ok(true), "page {p}");
    }
    let want: BTreeSet<_> = [0u64, 1, 63, 64, 100].iter().map(|&p| (SLOT, p)).collect();
    assert_eq!(collected(t), want);
    assert!(collected(t).is_empty(), "nothing twice");
    t.mark(1, SLOT, 7).unwrap();
    assert_eq!(collected(t), [(SLOT, 7)].into_iter().collect());
}

/// Marks from several threads at once are all collected.
fn concurrent_marks_lose_nothing(t: Arc<dyn DirtyTracker>) {
    let threads: Vec<_> = (0..4u64)
        .map(|v| {
            let t = t.clone();
            std::thread::spawn(move || {
                for i in 0..40u64 {
                    t.mark(v as usize, SLOT, v * 40 + i).unwrap();
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let got = collected(&*t);
    assert_eq!(got, (0..160u64).map(|p| (SLOT, p)).collect());
}

/// A mark the tracker refuses records nothing and says why.
fn refused_marks_record_nothing(t: &dyn DirtyTracker, refused: (u32, u64)) {
    assert!(t.mark(0, refused.0, refused.1).is_err());
    assert!(!collected(t).contains(&refused));
}

#[test]
fn bitmap_conforms() {
    marks_are_collected_once(&DirtyBitmap::for_slot(SLOT, 200, false));
    concurrent_marks_lose_nothing(Arc::new(DirtyBitmap::for_slot(SLOT, 200, false)));
    refused_marks_record_nothing(&DirtyBitmap::for_slot(SLOT, 200, false), (SLOT, 200));
    refused_marks_record_nothing(&DirtyBitmap::for_slot(SLOT, 200, false), (SLOT + 1, 5));
}

#[test]
fn ring_conforms() {
    marks_are_collected_once(&DirtyRing::new(256).unwrap());
    concurrent_marks_lose_nothing(Arc::new(DirtyRing::new(256).unwrap()));
    // A full ring refuses the push.
    let r = DirtyRing::new(256).unwrap();
    for p in 0..256 {
        r.mark(0, SLOT, p).unwrap();
    }
    refused_marks_record_nothing(&r, (SLOT, 999));
}
