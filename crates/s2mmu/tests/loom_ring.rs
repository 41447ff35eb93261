//! Model check (loom) of the dirty ring's push / harvest / reset protocol:
//! every pushed page is harvested exactly once and reset exactly once.
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p s2mmu --release --test loom_ring`.
#![cfg(loom)]

use loom::sync::Arc;
use s2mmu::dirty::DirtyRing;

#[test]
fn every_push_is_harvested_and_reset_once() {
    loom::model(|| {
        let ring = Arc::new(DirtyRing::new(256).unwrap());
        let r2 = ring.clone();
        let vcpu = loom::thread::spawn(move || {
            for off in 0..3u64 {
                r2.push(0, 1, off).unwrap();
            }
        });
        let mut got = Vec::new();
        let mut reset = 0;
        // The collector runs concurrently with the pushes.
        ring.harvest(&mut got);
        reset += ring.reset(|_, _, _| {});
        vcpu.join().unwrap();
        ring.harvest(&mut got);
        reset += ring.reset(|_, _, _| {});
        let offsets: Vec<u64> = got.iter().map(|g| g.offset).collect();
        assert_eq!(offsets, vec![0, 1, 2], "each page once, in push order");
        assert_eq!(reset, 3);
        assert_eq!(ring.used(), 0);
    });
}
