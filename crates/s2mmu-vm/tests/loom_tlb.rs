//! Model check (loom) of the software-TLB shootdown: once a flush returns,
//! no vCPU can use a translation it removed. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p s2mmu-vm --release --test loom_tlb`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use s2mmu::TlbInvalidate;
use s2mmu_vm::TlbShootdown;

/// A vCPU caches a writable translation and keeps accessing the page; the
/// host write-protects the page and flushes. An access that hits the
/// cached writable entry after the flush returned would be a write the
/// dirty log never sees.
#[test]
fn no_access_through_a_flushed_entry_after_the_flush_returns() {
    loom::model(|| {
        let sd = Arc::new(TlbShootdown::new(12));
        let mut tlb = sd.register(4);
        let writable = Arc::new(AtomicBool::new(true));
        let flushed = Arc::new(AtomicBool::new(false));
        let (w2, f2) = (writable.clone(), flushed.clone());
        let vcpu = loom::thread::spawn(move || {
            tlb.enter_guest();
            for _ in 0..2 {
                tlb.check_requests();
                if tlb.lookup(0x1000, true).is_some() {
                    assert!(
                        !f2.load(Ordering::SeqCst),
                        "write through a stale entry after the flush"
                    );
                } else if w2.load(Ordering::SeqCst) {
                    tlb.fill(0x1000, 0x9000, true);
                }
            }
            tlb.exit_guest();
            // Re-entering guest mode applies anything posted meanwhile.
            tlb.enter_guest();
            if tlb.lookup(0x1000, true).is_some() {
                assert!(!f2.load(Ordering::SeqCst), "stale entry survived re-entry");
            }
            tlb.exit_guest();
        });
        writable.store(false, Ordering::SeqCst);
        sd.flush_range(0x1000, 0x1000);
        flushed.store(true, Ordering::SeqCst);
        vcpu.join().unwrap();
    });
}

/// A whole-VMID flush against a vCPU that leaves and re-enters guest mode
/// between accesses.
#[test]
fn vmid_flush_reaches_a_vcpu_that_exits_and_reenters() {
    loom::model(|| {
        let sd = Arc::new(TlbShootdown::new(12));
        let mut tlb = sd.register(4);
        tlb.fill(0x2000, 0xa000, true);
        let flushed = Arc::new(AtomicBool::new(false));
        let f2 = flushed.clone();
        let vcpu = loom::thread::spawn(move || {
            for _ in 0..2 {
                tlb.enter_guest();
                if tlb.lookup(0x2000, true).is_some() {
                    assert!(
                        !f2.load(Ordering::SeqCst),
                        "hit after a whole-VMID flush returned"
                    );
                }
                tlb.exit_guest();
            }
        });
        sd.flush_vmid();
        flushed.store(true, Ordering::SeqCst);
        vcpu.join().unwrap();
    });
}
