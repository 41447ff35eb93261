//! The `Mmu` facade: one VM's stage-2 part (`mmu/stage2.rs`: the table behind
//! the MMU lock, the TLB backend, the fixed configuration), its memslot side
//! (the store and each slot's dirty bitmap) and its dirty side (the vCPUs'
//! rings), with the fault path and the dirty-logging API.
//!
//! Every optimisation the seeds describe is a policy here ([`MmuPolicy`]),
//! defaulting to the optimised choice, so a benchmark can run both sides in
//! one process:
//! - fault path: permission relaxation under the read lock by
//!   compare-and-swap ([`FaultPath::ReadLockFastPath`], arm64 since 5.17 /
//!   the fast path) or every fault under the write lock (`FaultPath::WriteLock`, with the
//!   `baselines` feature);
//! - eager split when logging starts, in chunks that drop the lock between
//!   them, or split on fault;
//! - the split walk ([`SplitPolicy`](crate::SplitPolicy));
//! - large TLB ranges as one whole-VMID flush or split calls;
//! - memslots as the tree or the array, through the store type.
//!
//! Lock order: memslot updates and logging changes are serialised by an
//! update mutex (KVM's `slots_lock`) and never hold the MMU lock while they
//! wait for memslot readers.
//!
//! The MMU lock ([`lock::MmuLock`]) is KVM's reader-writer lock with one
//! addition: vCPUs on the fast path read through reader slots of their own
//! while no writer is around, so the fast path shares no cache line between
//! vCPUs ([`MmuPolicy::reader_slots`]; 0 is KVM's plain rwlock).
//!
//! Platform: the locks, the clock and the snapshot cells come from the
//! type parameter `P` ([`crate::sync::Platform`]): parking_lot, `Instant`
//! and arc-swap with `std`, spin locks and lock-protected cells without, or
//! the embedder's own ([`Mmu::for_platform`]). Its locks do not poison: a
//! panic while one is held comes from a bug, not from caller input (bad
//! input is an [`Error`]), and every structure they guard is consistent
//! between the steps that take them.

use crate::dirty::{check_clear_args, DirtyBitmap, DirtyGfn, DirtyTracker, SlotViews};
use crate::format::{Prot, PteFormat};
use crate::memcache::PageCache;
use crate::memslot::{
    MemslotChange, MemslotStore, SlotFlags, SlotLookup, Stage2Invalidate, UserMemoryRegion,
    VcpuSlotCache,
};
use crate::ops::MapOptions;
use crate::pgtable::{PageTable, TableReader};
use crate::sync::{ArcOptionCell, DefaultPlatform, Mutex, Platform, Stopwatch};
use crate::table::MmOps;
use crate::table_view::TableView;
use crate::tlb::{TlbBatch, TlbInvalidate, TlbPolicy};
use crate::{Error, Gfn, Gpa, Hva, Pa, Result};
use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};
use lock::{ReadGuard, WriteGuard};
use stage2::Stage2;

mod dirty_log;
mod fault;
mod handles;
mod host;
mod host_dirty;
pub mod lock;
mod logging;
mod notifier;
mod policy;
mod populate;
mod sparse_clear;
mod stage2;
mod stats;
mod strategy;
#[cfg(test)]
mod tests;
mod views;

pub use handles::{DirtyView, FaultKind, FaultOutcome, PageFetch, VcpuMmu};
pub use host::{HostMemory, IdentityHost};
pub use policy::{
    DirtyMode, FaultPath, HugePageRecovery, HwDirtyBlocks, MmuPolicy, ParseDirtyModeError, Protect,
    EAGER_SPLIT_CHUNK, LOCK_CHUNK, MAX_EAGER_SPLIT_CHUNK, MAX_VCPUS, SPARSE_CLEAR_RUNS,
};
pub use stats::FaultStats;
pub use strategy::{PmlLog, PmlWriteError, PML_LOG_ENTRIES};
use strategy::{Strategy, VcpuLog};

/// A memslot's state that the MMU keeps beside the memslot store.
struct SlotSide<P: Platform> {
    dirty: P::OptionCell<DirtyBitmap>,
    host_page: AtomicU64,
}

/// One VM's MMU, its locks, clock and snapshot cells from platform `P`
/// ([`crate::sync`]).
pub struct Mmu<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform = DefaultPlatform> {
    /// Unique among the process's MMUs: brands the vCPU handles it makes.
    id: u64,
    /// The table, the MMU lock, the TLB backend, the fixed configuration.
    stage2: Stage2<F, M, P>,
    slots: S,
    side: Box<[SlotSide<P>]>,
    /// The dirty-log strategy ([`MmuPolicy::dirty`]) and its state (the
    /// vCPUs' rings or logs where its mode has them).
    strategy: Strategy<P>,
    /// The vCPUs made so far ([`Mmu::new_vcpu`]).
    vcpus: Mutex<P, usize>,
    policy: MmuPolicy,
    update: Mutex<P, ()>,
    split_cache: Mutex<P, PageCache<M>>,
    vm_stats: Mutex<P, FaultStats>,
    /// The memslots' page shift, the granule's (checked at creation).
    page_shift: u32,
    host: Arc<dyn HostMemory>,
    /// Host ranges being invalidated ([`Mmu::invalidate_hva_range_start`]).
    invalidating: Mutex<P, Vec<(u64, u64)>>,
    /// Its length, read without the lock.
    invalidations: AtomicU64,
    /// Dirty marks still to drop (`Mmu::inject_lost_marks`).
    #[cfg(feature = "test-hooks")]
    drop_marks: AtomicU64,
    /// Invalidation calls issued by dirty-log clears (the `test-hooks`
    /// feature only).
    #[cfg(feature = "test-hooks")]
    pub clear_tlb_calls: AtomicU64,
    /// The consumers of each slot that has dirty views open.
    views: Mutex<P, Vec<SlotViews>>,
    /// Its length, read without the lock (the single-consumer GET/CLEAR
    /// checks it and nothing else while no view is open).
    views_open: AtomicU64,
    /// The next view id.
    next_view: AtomicU64,
    /// With hardware dirty state, a CLEAR cleans a last-level table's
    /// worth of bitmap words with more runs of set bits than this in one
    /// masked walk (`Mmu::with_sparse_clear_runs`).
    sparse_clear_runs: u32,
}

struct Stage2Hook<'a, F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> {
    mmu: &'a Mmu<F, M, S, P>,
    /// The slot being deleted or moved.
    id: u16,
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Stage2Invalidate
    for Stage2Hook<'_, F, M, S, P>
{
    fn unmap_gfn_range(&self, base_gfn: Gfn, npages: u64) {
        let base_gfn = base_gfn.raw();
        let shift = self.mmu.stage2.config.page_shift;
        let mut st = FaultStats::default();
        let mut pt = self.mmu.write_lock(&mut st);
        // Whole leaves: a slot's range never cuts one (faults map blocks
        // only inside a slot), but unmapping leaf by leaf cannot fail even
        // if it did, and the range lies inside the IPA space (checked when
        // the slot was made).
        let (ipa, len) = (base_gfn << shift, npages << shift);
        // The slot's dirty state that lives outside its bitmap goes into
        // it first, while the old range still names the slot: leaves the
        // hardware dirtied (frozen, so no write lands after), then the PML
        // entries of its pages (their flush would look the old addresses
        // up in the new memslots and drop them). A move keeps the bitmap.
        let strategy = &self.mmu.strategy;
        let salvaged = strategy.salvage(self.mmu, &pt, self.id, ipa, ipa, len);
        strategy.before_slot_unmap(self.mmu, self.id, base_gfn, base_gfn + npages);
        let unmapped = salvaged
            .and_then(|()| pt.leaves(ipa, len))
            .and_then(|leaves| {
                leaves
                    .iter()
                    .try_for_each(|l| pt.unmap(l.ipa, l.size).map(|_| ()))
            });
        if let Err(e) = unmapped {
            unreachable!("unmapping slot range {ipa:#x}+{len:#x}: {e}");
        }
        drop(pt);
        self.mmu.vm_stats.lock().add(&st);
    }
}

impl<F: PteFormat, M: MmOps, S: MemslotStore> Mmu<F, M, S> {
    /// An MMU for `fmt`, table pages from `mm`, invalidations to `tlb`,
    /// memslots in `slots` (whose page size must be the granule), on the
    /// default platform ([`crate::sync::DefaultPlatform`]).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for mismatched page sizes or a bad policy;
    /// [`Error::OutOfMemory`].
    pub fn new(
        fmt: F,
        mm: M,
        tlb: Arc<dyn TlbInvalidate>,
        slots: S,
        policy: MmuPolicy,
    ) -> Result<Self> {
        Self::for_platform(fmt, mm, tlb, slots, policy)
    }
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// As [`Mmu::new`], on platform `P` (a no_std hypervisor's locks,
    /// clock and snapshot cells).
    ///
    /// # Errors
    /// As [`Mmu::new`].
    pub fn for_platform(
        fmt: F,
        mm: M,
        tlb: Arc<dyn TlbInvalidate>,
        slots: S,
        policy: MmuPolicy,
    ) -> Result<Self> {
        let page_shift = fmt.page_shift();
        if slots.config().page_shift != page_shift {
            return Err(Error::InvalidConfig {
                what: "memslot page shift (must match the granule)",
                value: u64::from(slots.config().page_shift),
            });
        }
        if let Some(chunk) = policy.eager_split_chunk {
            if chunk == 0 || chunk % fmt.page_size() != 0 || chunk > MAX_EAGER_SPLIT_CHUNK {
                return Err(Error::InvalidConfig {
                    what: "eager split chunk size",
                    value: chunk,
                });
            }
        }
        // As `set_tlb_large_range` refuses it: a zero limit would be taken
        // as one page by the invalidation layer, a policy nobody asked for.
        if policy.tlb_limit_pages == 0 {
            return Err(Error::InvalidConfig {
                what: "TLB range limit in pages",
                value: 0,
            });
        }
        if policy.reader_slots > MAX_VCPUS {
            return Err(Error::InvalidConfig {
                what: "reader slots (at most MAX_VCPUS)",
                value: policy.reader_slots as u64,
            });
        }
        let strategy = Strategy::new(policy.dirty, &fmt)?;
        let tlb_policy = TlbPolicy {
            limit_pages: policy.tlb_limit_pages,
            large_range: policy.tlb_large_range,
            page_shift,
        };
        let stage2 = Stage2::new(fmt, mm, tlb, tlb_policy, policy.reader_slots)?;
        let nslots = usize::from(slots.config().max_user_slots);
        let side = (0..nslots)
            .map(|_| SlotSide {
                dirty: ArcOptionCell::empty(),
                host_page: AtomicU64::new(1 << page_shift),
            })
            .collect();
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(Mmu {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            split_cache: lock_api::Mutex::new(PageCache::new(stage2.mm.clone())),
            stage2,
            slots,
            side,
            strategy,
            vcpus: lock_api::Mutex::new(0),
            policy,
            update: lock_api::Mutex::new(()),
            vm_stats: lock_api::Mutex::new(FaultStats::default()),
            page_shift,
            host: Arc::new(IdentityHost),
            invalidating: lock_api::Mutex::new(Vec::new()),
            invalidations: AtomicU64::new(0),
            #[cfg(feature = "test-hooks")]
            drop_marks: AtomicU64::new(0),
            #[cfg(feature = "test-hooks")]
            clear_tlb_calls: AtomicU64::new(0),
            views: lock_api::Mutex::new(Vec::new()),
            views_open: AtomicU64::new(0),
            next_view: AtomicU64::new(0),
            sparse_clear_runs: SPARSE_CLEAR_RUNS,
        })
    }

    /// With hardware dirty state, how scattered a CLEAR's bitmap must be for
    /// a last-level table's worth of its words to be cleaned in one masked
    /// walk: more than `runs` runs of set bits among them (default
    /// [`SPARSE_CLEAR_RUNS`]); fewer are cleaned by a walk per run, which
    /// joins runs across words. `u32::MAX` never takes the masked walk:
    /// benchmarks compare the two with it. A tuning knob, not fault
    /// injection: every value cleans exactly the pages asked for.
    #[must_use]
    pub fn with_sparse_clear_runs(mut self, runs: u32) -> Self {
        self.sparse_clear_runs = runs;
        self
    }

    /// Takes output addresses from `host` instead of using host addresses
    /// as physical ones ([`IdentityHost`], the default), and calls its
    /// cache maintenance before installing leaves. Set it before the first
    /// mapping: leaves made earlier keep the addresses they were made with.
    #[must_use]
    pub fn with_host_memory(mut self, host: Arc<dyn HostMemory>) -> Self {
        self.host = host;
        self
    }

    /// Fault injection for lost-write checks: the next `n` dirty marks of
    /// the fault path are dropped (the page is made writable and not
    /// recorded, the bug a lost-write check must catch). Never use it
    /// outside such a check (the `test-hooks` feature only).
    #[cfg(feature = "test-hooks")]
    pub fn inject_lost_marks(&self, n: u64) {
        self.drop_marks.store(n, Ordering::Release);
    }

    /// Whether to drop this dirty mark (`Mmu::inject_lost_marks`).
    #[cfg(feature = "test-hooks")]
    pub(super) fn drop_injected_mark(&self) -> bool {
        self.drop_marks.load(Ordering::Relaxed) != 0
            && self
                .drop_marks
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
    }

    /// Never: the product build has no fault injection.
    #[cfg(not(feature = "test-hooks"))]
    #[inline(always)]
    pub(super) fn drop_injected_mark(&self) -> bool {
        false
    }

    /// Counts the invalidation calls a dirty-log clear issued (in
    /// `clear_tlb_calls`, with the `test-hooks` feature).
    #[inline(always)]
    pub(super) fn count_clear_tlb_calls(&self, _calls: u64) {
        #[cfg(feature = "test-hooks")]
        self.clear_tlb_calls.fetch_add(_calls, Ordering::Relaxed);
    }

    /// The physical address to map `[hva, hva + size)` to, if the host
    /// backs it contiguously at an address aligned to `size`.
    fn phys_for(&self, hva: u64, size: u64) -> Option<u64> {
        self.host
            .host_to_phys(Hva::new(hva), size)
            .map(Pa::raw)
            .filter(|pa| pa & (size - 1) == 0)
    }

    /// The physical address of the page at `hva`, after the cache
    /// maintenance a new leaf over it needs.
    fn phys_for_leaf(&self, hva: u64, size: u64, prot: Prot) -> Result<u64> {
        let pa = self
            .phys_for(hva, size)
            .ok_or(Error::Unbacked { hva: Hva::new(hva) })?;
        self.host.clean_dcache(Hva::new(hva), size);
        if prot.contains(Prot::X) {
            self.host.invalidate_icache(Hva::new(hva), size);
        }
        Ok(pa)
    }

    /// The policies in force. The TLB range policy is read from the table,
    /// where `Mmu::set_tlb_large_range` changes it, so this reports what
    /// the next invalidation will do.
    pub fn policy(&self) -> MmuPolicy {
        let tlb = self.with_table(|pt| pt.tlb_policy());
        MmuPolicy {
            tlb_large_range: tlb.large_range,
            tlb_limit_pages: tlb.limit_pages,
            ..self.policy
        }
    }

    /// The memslot store.
    pub fn slots(&self) -> &S {
        &self.slots
    }

    /// A lockless reader of the stage-2 table (a vCPU's table walker).
    pub fn reader(&self) -> TableReader<F, M> {
        self.stage2.reader.clone()
    }

    /// Runs `f` on a read-only view of the table under the read lock
    /// (inspection, tests). The view has no method that writes: entries
    /// change only through the engine, which keeps dirty logging, the
    /// memslots and the TLB in step with them.
    pub fn with_table<R>(&self, f: impl FnOnce(TableView<'_, F, M>) -> R) -> R {
        self.stage2.with_table(|pt| f(TableView::new(pt)))
    }

    /// The stage-2 table's id in the break-before-make monitor
    /// ([`crate::bbm`], [`PageTable::bbm_id`]).
    pub fn bbm_id(&self) -> usize {
        self.with_table(|pt| pt.bbm_id())
    }

    /// The monitor's trace point: GET or CLEAR reports pages clean now, so
    /// every protection it made must have been invalidated.
    #[inline(always)]
    pub(crate) fn bbm_report_clean(&self) {
        #[cfg(feature = "bbm-trace")]
        crate::bbm::report_clean(self.bbm_id());
        #[cfg(feature = "bbm-export")]
        crate::bbm::export::emit(&crate::bbm::Event::ReportClean {
            table: self.bbm_id(),
        });
    }

    /// Counters of VM-wide operations (logging changes, clears, memslot
    /// updates), not of vCPU faults.
    pub fn vm_stats(&self) -> FaultStats {
        *self.vm_stats.lock()
    }

    /// Creates the MMU state of a new vCPU (and its dirty ring, if rings
    /// are on, or its PML log with [`DirtyMode::Pml`]).
    ///
    /// # Errors
    /// [`Error::TooManyVcpus`] beyond [`MAX_VCPUS`];
    /// [`Error::OutOfMemory`] if its ring or log cannot be allocated.
    /// Nothing is changed then.
    pub fn new_vcpu(&self) -> Result<VcpuMmu<M>> {
        let mut vcpus = self.vcpus.lock();
        let id = *vcpus;
        if id >= MAX_VCPUS {
            return Err(Error::TooManyVcpus { limit: MAX_VCPUS });
        }
        let VcpuLog { ring, pml } = self.strategy.new_vcpu(id, self.stage2.reader.table_id())?;
        *vcpus += 1;
        Ok(VcpuMmu {
            id,
            mmu_id: self.id,
            ring,
            lock_slot: self.stage2.slot_for(id),
            dirty_cache: None,
            slot_cache: VcpuSlotCache::new(),
            cache: PageCache::new(self.stage2.mm.clone()),
            pml,
            stats: FaultStats::default(),
        })
    }

    /// Takes the MMU lock for reading, through the vCPU's reader slot
    /// `slot` where it has one.
    fn read_lock(
        &self,
        st: &mut FaultStats,
        slot: Option<usize>,
    ) -> ReadGuard<'_, PageTable<F, M>, P> {
        self.stage2.read_lock(st, slot)
    }

    fn write_lock(&self, st: &mut FaultStats) -> WriteGuard<'_, PageTable<F, M>, P> {
        self.stage2.write_lock(st)
    }
}
