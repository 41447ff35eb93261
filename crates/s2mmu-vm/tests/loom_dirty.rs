//! Model check (loom) of the dirty-logging protocol end to end: a vCPU
//! writing a page through its software TLB, taking the read-lock fast path
//! (compare-and-swap on the leaf, then a mark in the bitmap) when the page
//! is write-protected, against a concurrent harvest: GET, CLEAR (clear the
//! bits seen, write-protect those pages, flush the TLBs), then copy the
//! page. No interleaving may leave a write that is newer than the copy and
//! absent from the bitmap. The model fails when the flush is left out or
//! done before the write protection.
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p s2mmu-vm --release --test loom_dirty`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;
use s2mmu::dirty::DirtyBitmap;
use s2mmu::TlbInvalidate;
use s2mmu_vm::TlbShootdown;

const GPA: u64 = 0x1000;
const HOST: u64 = 0x9000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Clear {
    /// Write-protect, then flush: what the engine does.
    ProtectThenFlush,
    /// Fault injection: no flush.
    NoFlush,
    /// Fault injection: flush first, then write-protect.
    FlushThenProtect,
}

fn model(clear: Clear) {
    loom::model(move || {
        let sd = Arc::new(TlbShootdown::new(12));
        let mut tlb = sd.register(4);
        // The page was dirtied in the previous round: writable in the leaf
        // (`pte_w`), cached writable in the TLB, its bit set.
        let pte_w = Arc::new(AtomicBool::new(true));
        let bitmap = Arc::new(DirtyBitmap::new(64, false));
        bitmap.mark(0);
        tlb.fill(GPA, HOST, true);
        let data = Arc::new(AtomicU64::new(0));
        let (p2, b2, d2) = (pte_w.clone(), bitmap.clone(), data.clone());
        let vcpu = loom::thread::spawn(move || {
            tlb.enter_guest();
            // One write, retried until it lands, as the guest's store is.
            loop {
                tlb.check_requests();
                if tlb.lookup(GPA, true).is_some() {
                    d2.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                if p2.load(Ordering::Acquire) {
                    // A walk that finds the leaf writable fills the TLB.
                    tlb.fill(GPA, HOST, true);
                    continue;
                }
                // Permission fault: the fast path relaxes the leaf by CAS
                // and marks the page, outside guest mode.
                tlb.exit_guest();
                if p2
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    b2.mark(0);
                }
                tlb.enter_guest();
            }
            tlb.exit_guest();
        });
        // The harvest: GET, CLEAR, copy.
        let mut seen = [0u64; 1];
        bitmap.copy_to(&mut seen).unwrap();
        let cleared = bitmap.clear_masked(0, seen[0]);
        if cleared & 1 != 0 {
            match clear {
                Clear::ProtectThenFlush => {
                    pte_w.store(false, Ordering::Release);
                    sd.flush_range(GPA, 0x1000);
                }
                Clear::NoFlush => pte_w.store(false, Ordering::Release),
                Clear::FlushThenProtect => {
                    sd.flush_range(GPA, 0x1000);
                    pte_w.store(false, Ordering::Release);
                }
            }
        }
        let copied = data.load(Ordering::SeqCst);
        vcpu.join().unwrap();
        assert!(
            data.load(Ordering::SeqCst) == copied || bitmap.is_set(0),
            "a write newer than the copy was not logged"
        );
    });
}

#[test]
fn a_write_racing_a_clear_is_copied_or_logged() {
    model(Clear::ProtectThenFlush);
}

#[test]
#[should_panic(expected = "not logged")]
fn without_the_flush_a_write_is_lost() {
    model(Clear::NoFlush);
}

#[test]
#[should_panic(expected = "not logged")]
fn a_flush_before_the_protection_loses_a_write() {
    model(Clear::FlushThenProtect);
}
