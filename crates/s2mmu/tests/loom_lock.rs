//! Model check (loom) of the MMU lock's vCPU reader slots: no slot reader
//! and writer are ever inside together, through revocation and re-bias.
//! The guarded value is a loom `UnsafeCell`, so loom itself reports any read
//! that the lock does not order against a write.
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p s2mmu --release --test loom_lock`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use s2mmu::mmu::lock::{MmuLock, REBIAS_AFTER};

type Lock = Arc<MmuLock<UnsafeCell<u64>>>;

fn read(l: &Lock, slot: Option<usize>) -> u64 {
    let g = l.read(slot).guard;
    // SAFETY: shared access under a read guard; loom checks the ordering.
    g.with(|p| unsafe { *p })
}

fn write(l: &Lock) {
    let g = l.write().guard;
    // SAFETY: exclusive access under the write guard; loom checks it.
    g.with_mut(|p| unsafe { *p += 1 });
}

/// A vCPU reads through its slot (the lock starts biased) while a writer
/// revokes the bias.
#[test]
fn slot_reader_and_revoking_writer_exclude() {
    loom::model(|| {
        let l: Lock = Arc::new(MmuLock::new(UnsafeCell::new(0), 2));
        let slot = l.slot_for(0);
        let l2 = l.clone();
        let vcpu = thread::spawn(move || read(&l2, slot));
        write(&l);
        let seen = vcpu.join().unwrap();
        assert!(seen <= 1);
        assert_eq!(read(&l, None), 1);
    });
}

/// Two vCPUs on their slots and a writer.
#[test]
fn two_slot_readers_and_a_writer_exclude() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let l: Lock = Arc::new(MmuLock::new(UnsafeCell::new(0), 2));
        let vcpus: Vec<_> = (0..2)
            .map(|i| {
                let l = l.clone();
                let slot = l.slot_for(i);
                thread::spawn(move || read(&l, slot))
            })
            .collect();
        write(&l);
        for v in vcpus {
            assert!(v.join().unwrap() <= 1);
        }
    });
}

/// After a revocation, a vCPU's reads through the rwlock bring the bias back
/// while a second writer may come in: the re-bias must not let a slot reader
/// in beside it.
#[test]
fn rebias_and_a_second_writer_exclude() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let l: Lock = Arc::new(MmuLock::new(UnsafeCell::new(0), 1));
        let slot = l.slot_for(0);
        write(&l);
        assert!(!l.biased());
        let l2 = l.clone();
        let vcpu = thread::spawn(move || {
            let mut last = 0;
            for _ in 0..=REBIAS_AFTER {
                let v = read(&l2, slot);
                assert!(v >= last, "the value never goes back");
                last = v;
            }
            last
        });
        write(&l);
        let last = vcpu.join().unwrap();
        assert!((1..=2).contains(&last));
        assert_eq!(read(&l, None), 2);
    });
}
