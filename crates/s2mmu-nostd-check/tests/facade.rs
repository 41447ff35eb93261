//! Drives the `Mmu` facade built without `std`: table pages from a static
//! arena, the embedding's ticket locks and clock, and a global allocator of
//! this test's own (a bump allocator over a static buffer, so the heap
//! bytes the engine takes are counted here; it falls back to the system
//! allocator only once the buffer is spent, which a panic's backtrace
//! symbolisation can do).

use s2mmu::{Error, Gpa, Hva, NoTlb, Prot};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{MemslotConfig, MemslotStore, SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{FaultOutcome, Mmu, MmuPolicy};
use s2mmu_nostd_check::{Arena, ArenaMmOps, CheckPlatform, RawTicketLock, TickClock};

/// Bytes the bump allocator can hand out.
const HEAP: usize = 64 << 20;

#[repr(C, align(4096))]
struct Heap(UnsafeCell<[u8; HEAP]>);

/// A bump allocator: never reuses memory (a test process is short-lived),
/// counts what it hands out, and passes requests to the system allocator
/// once the buffer is spent.
struct BumpAlloc {
    heap: Heap,
    next: AtomicUsize,
}

// SAFETY: every byte range is handed out once (the compare-and-swap on
// `next` claims it), so no two allocations overlap.
unsafe impl Sync for BumpAlloc {}

// SAFETY: returned blocks are inside the static buffer, aligned as asked
// (the start is rounded up to `layout.align()`), of `layout.size()` bytes,
// and never handed out twice, or come from `System`, to which `dealloc`
// returns exactly the blocks outside the buffer.
unsafe impl GlobalAlloc for BumpAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let base = self.heap.0.get() as usize;
        let mut cur = self.next.load(Ordering::Relaxed);
        loop {
            let start = (base + cur).next_multiple_of(layout.align()) - base;
            let Some(end) = start.checked_add(layout.size()).filter(|&e| e <= HEAP) else {
                // SAFETY: forwarded with the caller's layout.
                return unsafe { System.alloc(layout) };
            };
            match self
                .next
                .compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return (base + start) as *mut u8,
                Err(now) => cur = now,
            }
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let base = self.heap.0.get() as usize;
        if !(base..base + HEAP).contains(&(ptr as usize)) {
            // SAFETY: a block outside the buffer came from `System.alloc`
            // with this layout.
            unsafe { System.dealloc(ptr, layout) };
        }
    }
}

#[global_allocator]
static ALLOC: BumpAlloc = BumpAlloc {
    heap: Heap(UnsafeCell::new([0; HEAP])),
    next: AtomicUsize::new(0),
};

const PAGES: usize = 512;
static ARENA: Arena<PAGES> = Arena::new();

type NoStdMmu = Mmu<Arm64Stage2, ArenaMmOps<PAGES>, TreeMemslots<CheckPlatform>, CheckPlatform>;

const GPA: u64 = 1 << 30;
/// Host addresses, recorded in the table and never touched (the default
/// host memory maps them to themselves).
const HVA: u64 = 0x8000_0000;

/// The engine was built without `std` in this test binary's build. A
/// workspace build unifies `std` back on (other crates want it), so this
/// runs only when asked, with this crate built alone: `.ci/run` runs
/// `cargo test -p s2mmu-nostd-check -- --include-ignored`.
#[test]
#[ignore = "needs this crate built alone: cargo test -p s2mmu-nostd-check -- --include-ignored"]
// The constant is this build's: as a `const` assertion it would fail
// every workspace build instead of this test.
#[allow(clippy::assertions_on_constants)]
fn the_engine_is_built_without_std() {
    assert!(
        !s2mmu::STD,
        "s2mmu was built with std: run `cargo test -p s2mmu-nostd-check` alone"
    );
}

/// Faults, memslots, dirty logging with an eager split, GET and CLEAR,
/// all through the no_std facade on this crate's allocator and locks.
#[test]
fn maps_faults_logs_and_harvests_without_std() {
    let heap_before = ALLOC.next.load(Ordering::Relaxed);
    let locks_before = RawTicketLock::taken_total();
    let ticks_before = TickClock::readings();
    let m = new_mmu();
    let base_pages = ARENA.used_pages();
    assert!(base_pages >= 1, "the root came from the arena");

    // A 4 MiB slot on 2 MiB host pages: a write fault maps a block.
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 4 << 20, Hva::new(HVA));
    m.set_memory_region(&r, 2 << 20).unwrap();
    let mut v = m.new_vcpu().unwrap();
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(GPA + 0x5000), true),
        Ok(FaultOutcome::Slow)
    );
    let t = m.reader().translate(GPA + 0x5000).unwrap();
    assert_eq!((t.pa, t.size), (HVA + 0x5000, 2 << 20));
    assert!(t.prot.contains(Prot::W));
    assert!(
        ARENA.used_pages() > base_pages,
        "tables came from the arena"
    );

    start_logging(&m);

    // Writes to pages 5 and 700 (the second, unmapped, 2 MiB): a fast-path
    // relaxation and a new page mapping, both logged.
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(GPA + 5 * 4096), true),
        Ok(FaultOutcome::Fast)
    );
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(GPA + 700 * 4096), true),
        Ok(FaultOutcome::Slow)
    );
    assert_eq!(m.reader().translate(GPA + 700 * 4096).unwrap().size, 4096);
    assert_harvests(&m);

    // Deleting the slot unmaps it and gives its tables back (deferred
    // until no lockless reader walks).
    let gone = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 0, Hva::new(HVA));
    m.set_memory_region(&gone, 2 << 20).unwrap();
    assert!(m.reader().translate(GPA + 5 * 4096).is_none());
    drop(v);
    drop(m);

    assert_embedding_used(heap_before, locks_before, ticks_before);
}

/// The engine on this crate's arena, locks and clock, with no TLB to
/// invalidate and one 8-slot memslot set.
fn new_mmu() -> NoStdMmu {
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let slots = <TreeMemslots<CheckPlatform> as MemslotStore>::with_config(MemslotConfig {
        max_user_slots: 8,
        ..MemslotConfig::default()
    });
    Mmu::for_platform(
        fmt,
        ArenaMmOps::new(&ARENA),
        Arc::new(NoTlb),
        slots,
        MmuPolicy::default(),
    )
    .unwrap()
}

/// Logging on: the eager split breaks the block into pages, all
/// write-protected.
fn start_logging(m: &NoStdMmu) {
    let logged = UserMemoryRegion::new(
        0,
        SlotFlags::LOG_DIRTY_PAGES,
        Gpa::new(GPA),
        4 << 20,
        Hva::new(HVA),
    );
    m.set_memory_region(&logged, 2 << 20).unwrap();
    let leaves = m.with_table(|pt| pt.leaves(GPA, 2 << 20)).unwrap();
    assert_eq!(leaves.len(), 512, "split when logging started");
    assert!(leaves.iter().all(|l| l.size == 4096));
    assert!(!m.reader().translate(GPA).unwrap().prot.contains(Prot::W));
}

/// GET reports the two pages written (5 and 700), CLEAR protects them
/// again, and a call naming no slot is refused.
fn assert_harvests(m: &NoStdMmu) {
    let mut bm = vec![0u64; 16];
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 2);
    assert_eq!(bm[0], 1 << 5);
    assert_eq!(bm[700 / 64], 1 << (700 % 64));
    assert_eq!(m.clear_dirty_log(0, 0, 1024, &bm).unwrap(), 2);
    assert!(!m
        .reader()
        .translate(GPA + 5 * 4096)
        .unwrap()
        .prot
        .contains(Prot::W));
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0);

    assert_eq!(
        m.get_dirty_log(1, &mut bm),
        Err(Error::NoSuchSlot { slot: 1 })
    );
}

/// The engine allocated from this test's allocator, took its locks and
/// read its clock.
fn assert_embedding_used(heap_before: usize, locks_before: u32, ticks_before: u64) {
    assert!(
        ALLOC.next.load(Ordering::Relaxed) > heap_before,
        "the engine allocated from this test's allocator"
    );
    assert!(
        RawTicketLock::taken_total() > locks_before,
        "the facade took the embedding's ticket locks"
    );
    assert!(
        TickClock::readings() > ticks_before,
        "the facade read the embedding's clock"
    );
}
