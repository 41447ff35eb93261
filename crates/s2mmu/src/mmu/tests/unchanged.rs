//! "Every call either fails with the state unchanged or succeeds": the
//! facade's calls made to fail part-way (an allocator that refuses after a
//! budget, a page already mapped), and the state checked against what it
//! was before (slots, table contents through translate, bitmaps).

use super::super::*;
use super::slot_4m;
use crate::format::arm64::{Arm64Stage2, Granule};
use crate::memslot::TreeMemslots;
use crate::tlb::NoTlb;
use crate::{Gpa, HostMmOps, Hva};
use core::sync::atomic::AtomicUsize;

/// Host table pages, refused once `budget` pages have been handed out.
#[derive(Clone)]
struct BudgetMmOps {
    inner: HostMmOps,
    budget: Arc<AtomicUsize>,
}

impl BudgetMmOps {
    fn take(&self, n: usize) -> bool {
        self.budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| b.checked_sub(n))
            .is_ok()
    }
}

// SAFETY: every call is forwarded to `HostMmOps`, which upholds the
// contract; refusing an allocation (None) is allowed by it.
unsafe impl MmOps for BudgetMmOps {
    type ReadGuard = <HostMmOps as MmOps>::ReadGuard;
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }
    fn zalloc_page(&self) -> Option<u64> {
        self.take(1).then(|| self.inner.zalloc_page()).flatten()
    }
    fn zalloc_pages_exact(&self, n: usize) -> Option<u64> {
        self.take(n)
            .then(|| self.inner.zalloc_pages_exact(n))
            .flatten()
    }
    unsafe fn free_page(&self, pa: u64) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.free_page(pa) }
    }
    unsafe fn free_pages_exact(&self, pa: u64, n: usize) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.free_pages_exact(pa, n) }
    }
    fn phys_to_virt(&self, pa: u64) -> *mut u64 {
        self.inner.phys_to_virt(pa)
    }
    fn entry_count(&self, pa: u64) -> &core::sync::atomic::AtomicU32 {
        self.inner.entry_count(pa)
    }
    fn read_guard(&self) -> Self::ReadGuard {
        self.inner.read_guard()
    }
    fn same_allocator(&self, other: &Self) -> bool {
        self.inner.same_allocator(&other.inner)
    }
    unsafe fn free_pages_deferred(&self, pages: Vec<u64>) {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.inner.free_pages_deferred(pages) }
    }
}

type BudgetMmu = Mmu<Arm64Stage2, BudgetMmOps, TreeMemslots>;

const GPA: u64 = 1 << 30;
/// Host addresses only recorded in the table, never touched.
const HVA: u64 = 0x7000_0000_0000;

fn mmu(policy: MmuPolicy) -> (BudgetMmu, Arc<AtomicUsize>) {
    let budget = Arc::new(AtomicUsize::new(usize::MAX));
    let mm = BudgetMmOps {
        inner: HostMmOps::new(4096).unwrap(),
        budget: budget.clone(),
    };
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let store = TreeMemslots::with_config(super::tests::slot_config());
    let m = Mmu::new(fmt, mm, Arc::new(NoTlb), store, policy).unwrap();
    (m, budget)
}

/// What a translate of each 2 MiB of `[GPA, GPA + size)` shows: size and
/// whether writable, or nothing.
fn table_view(m: &BudgetMmu, size: u64) -> Vec<Option<(u64, bool)>> {
    (0..size / 4096)
        .map(|p| {
            m.reader()
                .translate(GPA + p * 4096)
                .map(|t| (t.size, t.prot.contains(Prot::W)))
        })
        .collect()
}

/// CLEAR with bitmaps initially set splits before it protects; with no
/// table memory it fails, and the bitmap and the table are as before.
#[test]
fn a_clear_that_cannot_split_leaves_bitmap_and_table_unchanged() {
    let (m, budget) = mmu(MmuPolicy {
        dirty: DirtyMode::Bitmap {
            protect: Protect::Manual {
                initially_set: true,
            },
        },
        ..MmuPolicy::default()
    });
    let mut v = slot_4m(&m, 2 << 20);
    m.handle_fault(&mut v, Gpa::new(GPA), true).unwrap();
    m.enable_dirty_logging(0).unwrap();
    let mut before = vec![0u64; 16];
    assert_eq!(m.get_dirty_log(0, &mut before).unwrap(), 1024, "all set");
    let table_before = table_view(&m, 4 << 20);
    assert_eq!(table_before[0], Some((2 << 20, true)), "a writable block");
    let stats_before = m.vm_stats();

    budget.store(0, Ordering::Relaxed);
    assert_eq!(
        m.clear_dirty_log(0, 0, 1024, &before),
        Err(Error::OutOfMemory)
    );
    let mut after = vec![0u64; 16];
    m.get_dirty_log(0, &mut after).unwrap();
    assert_eq!(after, before, "no dirty bit lost");
    assert_eq!(table_view(&m, 4 << 20), table_before);
    assert_eq!(m.vm_stats().write_locks, stats_before.write_locks);

    // With memory the same call succeeds: split, protected, bits cleared.
    budget.store(usize::MAX, Ordering::Relaxed);
    assert_eq!(m.clear_dirty_log(0, 0, 1024, &before), Ok(1024));
    assert_eq!(table_view(&m, 4096)[0], Some((4096, false)));
    m.get_dirty_log(0, &mut after).unwrap();
    assert!(after.iter().all(|w| *w == 0));
}

/// A populate that meets a mapped page in its second chunk takes back the
/// first chunk it mapped: the table is as before.
#[test]
fn a_populate_that_fails_part_way_unmaps_what_it_mapped() {
    let (m, _) = mmu(MmuPolicy::default());
    // 1 GiB and 4 KiB: the populate's second chunk holds one page.
    let size = (1 << 30) + 4096;
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), size, Hva::new(HVA));
    m.set_memory_region(&r, 4096).unwrap();
    let mut v = m.new_vcpu().unwrap();
    let last = GPA + (1 << 30);
    m.handle_fault(&mut v, Gpa::new(last), false).unwrap();
    let npages = size >> 12;
    assert_eq!(
        m.populate(0, 0, npages),
        Err(Error::AlreadyMapped { ipa: last })
    );
    assert!(m.reader().translate(GPA).is_none(), "the first chunk went");
    assert!(m.reader().translate(last - 4096).is_none());
    assert!(
        m.reader().translate(last).is_some(),
        "the fault's page stays"
    );
    // Nothing in the way: the same call maps it all.
    let gone = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 0, Hva::new(HVA));
    m.set_memory_region(&gone, 4096).unwrap();
    m.set_memory_region(&r, 4096).unwrap();
    assert_eq!(m.populate(0, 0, npages), Ok(npages));
    assert!(m.reader().translate(last).is_some());
}

/// Logging turned on with no table memory for the eager split succeeds
/// (the split is best effort, its failure counted): the slot logs, its
/// block is write-protected whole and split on its first write.
#[test]
fn logging_on_without_split_memory_succeeds_and_logs() {
    let (m, budget) = mmu(MmuPolicy::default());
    let mut v = slot_4m(&m, 2 << 20);
    m.handle_fault(&mut v, Gpa::new(GPA), true).unwrap();
    budget.store(0, Ordering::Relaxed);
    m.enable_dirty_logging(0).unwrap();
    assert_eq!(m.vm_stats().eager_split_failures, 1);
    assert_eq!(table_view(&m, 4096)[0], Some((2 << 20, false)));
    assert!(m
        .slots()
        .snapshot()
        .id_to_slot(0)
        .is_some_and(|s| s.dirty_logging()));
    budget.store(usize::MAX, Ordering::Relaxed);
    m.handle_fault(&mut v, Gpa::new(GPA + 3 * 4096), true)
        .unwrap();
    let mut bm = vec![0u64; 16];
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 1);
    assert_eq!(bm[0], 1 << 3);
}

/// A manually protected, initially set slot of 1 GiB (one CLEAR chunk) of
/// 2 MiB blocks and one block beyond it, every block mapped and the slot
/// logging: the MMU, its table-memory budget and the slot's size.
fn logging_blocks_past_one_chunk() -> (BudgetMmu, Arc<AtomicUsize>, u64) {
    let (m, budget) = mmu(MmuPolicy {
        dirty: DirtyMode::Bitmap {
            protect: Protect::Manual {
                initially_set: true,
            },
        },
        ..MmuPolicy::default()
    });
    let size = (1 << 30) + (2 << 20);
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), size, Hva::new(HVA));
    m.set_memory_region(&r, 2 << 20).unwrap();
    let mut v = m.new_vcpu().unwrap();
    for b in 0..size / (2 << 20) {
        m.handle_fault(&mut v, Gpa::new(GPA + b * (2 << 20)), true)
            .unwrap();
    }
    m.enable_dirty_logging(0).unwrap();
    (m, budget, size)
}

/// A CLEAR of all `size` bytes of slot 0 with `before` as its mask, given
/// exactly the table memory the first chunk's top-up takes (splitting its
/// 512 blocks uses it all, and the second chunk's top-up finds none): it
/// fails for memory, and the bitmap after it is returned.
fn clear_failing_in_second_chunk(
    m: &BudgetMmu,
    budget: &AtomicUsize,
    size: u64,
    before: &[u64],
) -> Vec<u64> {
    let first = m.with_table(|pt| pt.split_capacity(1 << 30));
    budget.store(first, Ordering::Relaxed);
    let r = m.clear_dirty_log(0, 0, size >> 12, before);
    assert_eq!(r, Err(Error::OutOfMemory), "capacity {first}");
    let mut after = vec![0u64; before.len()];
    m.get_dirty_log(0, &mut after).unwrap();
    after
}

/// A CLEAR that runs out of table memory in its second chunk, after the
/// first chunk's bits were cleared and its pages protected: the bits come
/// back, so the bitmap is as before and no dirty page is lost.
#[test]
fn a_clear_that_fails_in_a_later_chunk_puts_its_bits_back() {
    let (m, budget, size) = logging_blocks_past_one_chunk();
    let words = (size >> 12) as usize / 64;
    let mut before = vec![0u64; words];
    m.get_dirty_log(0, &mut before).unwrap();
    let after = clear_failing_in_second_chunk(&m, &budget, size, &before);
    assert_eq!(after, before, "the first chunk's bits came back");
    // Its pages were split and protected (they fault and log again); the
    // second chunk's block is as it was.
    let t = m.reader().translate(GPA).unwrap();
    assert_eq!((t.size, t.prot.contains(Prot::W)), (4096, false));
    let t = m.reader().translate(GPA + (1 << 30)).unwrap();
    assert_eq!((t.size, t.prot.contains(Prot::W)), (2 << 20, true));
}

/// The same CLEAR with a dirty view open (the slot's log is then one
/// consumer among several): the first chunk's bits come back too, for the
/// log and for the view, which the CLEAR did not touch.
#[test]
fn a_clear_beside_views_that_fails_in_a_later_chunk_puts_its_bits_back() {
    let (m, budget, size) = logging_blocks_past_one_chunk();
    let view = m.open_dirty_view(0).unwrap();
    let words = (size >> 12) as usize / 64;
    let mut before = vec![0u64; words];
    m.get_dirty_log(0, &mut before).unwrap();
    let mut view_before = vec![0u64; words];
    m.get_dirty_view(view, &mut view_before).unwrap();
    let mut after = clear_failing_in_second_chunk(&m, &budget, size, &before);
    let lost = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (b & !a).count_ones())
        .sum::<u32>();
    assert_eq!(lost, 0, "dirty pages lost by the failed CLEAR");
    m.get_dirty_view(view, &mut after).unwrap();
    assert_eq!(after, view_before, "the view is untouched");
    // With memory the same call succeeds, and the view still reports all.
    budget.store(usize::MAX, Ordering::Relaxed);
    assert_eq!(m.clear_dirty_log(0, 0, size >> 12, &before), Ok(size >> 12));
    m.close_dirty_view(view).unwrap();
}
