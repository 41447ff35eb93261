//! Model check (loom) of hardware dirty state's scan and clean against a
//! guest write: a vCPU whose walker sets the leaf's dirty state on a write
//! that misses its TLB (the hardware's atomic update, as
//! `TableReader::hw_dirty_update` does it) and then writes through the
//! TLB, against a harvest that scans the leaf into the bitmap (GET), then
//! clears the bits seen, cleans those leaves and invalidates the TLB of
//! every leaf it found dirty (CLEAR, as `clean_hw_dirty_batched`), then
//! copies the page. The page's bit is set when the harvest starts, its
//! leaf clean (a bit from `KVM_DIRTY_LOG_INITIALLY_SET` or from a fault's
//! mark): CLEAR cleans a leaf that may turn dirty under it. No interleaving
//! may leave a write that is newer than the copy and neither in the bitmap
//! nor in the leaf's dirty state (the next harvest's scan). Run for both
//! formats' bits: x86 EPT's dirty flag and arm64's DBM.
//!
//! The model fails when the clean is a plain store instead of a
//! compare-and-swap: the store can land just after the hardware's update
//! and erase it, and since the leaf the harvest read was clean it
//! invalidates nothing, so the vCPU keeps writing through its TLB with no
//! dirty state anywhere. (The engine also skips a leaf whose cleaned value
//! equals what it read; a plain store made only after that check would
//! pass this model, since the hardware updates only clean leaves. The
//! injected store is the blind one of a clean that writes every tracked
//! leaf of its range.)
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p s2mmu-vm --release --test loom_hw_dirty`.
#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use s2mmu::dirty::DirtyBitmap;
use s2mmu::{HwDirtyBits, TlbInvalidate};
use s2mmu_vm::TlbShootdown;

const GPA: u64 = 0x1000;
const HOST: u64 = 0x9000;
/// The leaf's other bits (valid, readable, its output address).
const LEAF: u64 = 0x9000 | 1;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Clean {
    /// Compare-and-swap from the value read; a leaf that changed meanwhile
    /// is left as it is (dirty), as the engine's walk does.
    CompareAndSwap,
    /// Fault injection: store the cleaned value read before.
    PlainStore,
}

fn model(hw: HwDirtyBits, clean: Clean) {
    loom::model(move || {
        let sd = Arc::new(TlbShootdown::new(12));
        let mut tlb = sd.register(4);
        // Tracked and clean; its bit set.
        let leaf = Arc::new(AtomicU64::new(hw.clean(LEAF | hw.trackable)));
        let bitmap = Arc::new(DirtyBitmap::new(64, false));
        bitmap.mark(0);
        let data = Arc::new(AtomicU64::new(0));
        let (l2, d2) = (leaf.clone(), data.clone());
        let vcpu = loom::thread::spawn(move || {
            tlb.enter_guest();
            // Two writes: the first walks and may set the dirty state, the
            // second may go through the TLB entry the first filled.
            for _ in 0..2 {
                loop {
                    tlb.check_requests();
                    if tlb.lookup(GPA, true).is_some() {
                        d2.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    // The walk: the hardware's update of a clean leaf.
                    let pte = l2.load(Ordering::Acquire);
                    if pte & hw.update_mask == hw.update_match
                        && l2
                            .compare_exchange(
                                pte,
                                pte | hw.update_set,
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            )
                            .is_err()
                    {
                        continue; // changed meanwhile: walk again
                    }
                    tlb.fill(GPA, HOST, true);
                }
            }
            tlb.exit_guest();
        });
        // GET: the scan.
        if hw.is_dirty(leaf.load(Ordering::Acquire)) {
            bitmap.mark(0);
        }
        let mut seen = [0u64; 1];
        bitmap.copy_to(&mut seen).unwrap();
        // CLEAR: clear the bits seen, clean their leaves, invalidate.
        if bitmap.clear_masked(0, seen[0]) & 1 != 0 {
            let old = leaf.load(Ordering::Acquire);
            let new = hw.clean(old);
            let cleaned = match clean {
                Clean::CompareAndSwap => {
                    new == old
                        || leaf
                            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                }
                Clean::PlainStore => {
                    leaf.store(new, Ordering::Release);
                    true
                }
            };
            if cleaned && old & hw.clean_clear != 0 {
                sd.flush_range(GPA, 0x1000);
            }
        }
        let copied = data.load(Ordering::SeqCst);
        vcpu.join().unwrap();
        assert!(
            data.load(Ordering::SeqCst) == copied
                || bitmap.is_set(0)
                || hw.is_dirty(leaf.load(Ordering::Acquire)),
            "a write newer than the copy was not logged"
        );
    });
}

#[test]
fn ept_a_write_racing_scan_and_clean_is_copied_or_logged() {
    model(HwDirtyBits::EPT_AD, Clean::CompareAndSwap);
}

#[test]
fn dbm_a_write_racing_scan_and_clean_is_copied_or_logged() {
    model(HwDirtyBits::ARM64_DBM, Clean::CompareAndSwap);
}

#[test]
#[should_panic(expected = "not logged")]
fn ept_a_clean_without_compare_and_swap_loses_a_write() {
    model(HwDirtyBits::EPT_AD, Clean::PlainStore);
}

#[test]
#[should_panic(expected = "not logged")]
fn dbm_a_clean_without_compare_and_swap_loses_a_write() {
    model(HwDirtyBits::ARM64_DBM, Clean::PlainStore);
}
