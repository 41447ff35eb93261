//! The `Mmu` facade: one VM's stage-2 table, memslots and dirty tracking
//! behind the MMU lock, with the fault path and the dirty-logging API.
//!
//! Every optimisation the seeds describe is a policy here ([`MmuPolicy`]),
//! defaulting to the optimised choice, so a benchmark can run both sides in
//! one process:
//! - fault path: permission relaxation under the read lock by
//!   compare-and-swap ([`FaultPath::ReadLockFastPath`], arm64 since 5.17 /
//!   seed 002) or every fault under the write lock ([`FaultPath::WriteLock`]);
//! - eager split when logging starts, in chunks that drop the lock between
//!   them (seed 004), or split on fault;
//! - the split walk ([`SplitPolicy`], seed 000);
//! - large TLB ranges as one whole-VMID flush or split calls (seed 003);
//! - memslots as the tree or the array (seed 001), through the store type.
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
//! Lock poisoning: the MMU lock (the table's `RwLock`) is taken through a
//! poisoned state, since the table is consistent between walker steps. The
//! other locks (the update mutex, the split cache, the counters, the ring
//! list) are `unwrap`ped: they are poisoned only if a thread panicked while
//! holding one, which no caller input causes (bad input is an [`Error`]), so
//! such a panic is a bug and is propagated rather than hidden.

use crate::dirty::{check_clear_args, DirtyBitmap, DirtyGfn, DirtyRing};
use crate::format::{Prot, PteFormat};
use crate::memcache::PageCache;
use crate::memslot::{
    MemslotChange, MemslotStore, SlotFlags, SlotLookup, Stage2Invalidate, UserMemoryRegion,
    VcpuSlotCache,
};
use crate::ops::{MapOptions, SplitPolicy};
use crate::pgtable::{PageTable, TableReader};
use crate::table::MmOps;
use crate::tlb::{LargeRangePolicy, TlbBatch, TlbInvalidate, TlbPolicy};
use crate::{Error, Result};
use arc_swap::ArcSwapOption;
use lock::{MmuLock, ReadGuard, WriteGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

mod host;
pub mod lock;
mod notifier;
mod populate;

pub use host::{HostMemory, IdentityHost};

/// How faults take the MMU lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultPath {
    /// A write to a write-protected page is fixed under the read lock by
    /// compare-and-swap; only faults that allocate or split take the write
    /// lock.
    ReadLockFastPath,
    /// Every fault takes the write lock (the baseline).
    WriteLock,
}

/// The switchable policies of an [`Mmu`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmuPolicy {
    /// How faults take the lock.
    pub fault_path: FaultPath,
    /// Eager split when logging starts, with this chunk size in bytes
    /// (the lock is dropped and the page cache topped up between chunks);
    /// `None` splits huge mappings on the first write fault instead.
    pub eager_split_chunk: Option<u64>,
    /// How the split walk moves.
    pub split_walk: SplitPolicy,
    /// What to do with range invalidations above the limit.
    pub tlb_large_range: LargeRangePolicy,
    /// The range limit in pages.
    pub tlb_limit_pages: u64,
    /// Manual protect (`KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`): GET only copies
    /// the bitmap; CLEAR re-protects.
    pub manual_protect: bool,
    /// With manual protect, bitmaps start all set and enabling logging
    /// protects nothing (`KVM_DIRTY_LOG_INITIALLY_SET`).
    pub initially_set: bool,
    /// Track dirty pages in per-vCPU rings of this many entries instead of
    /// bitmaps.
    pub dirty_ring_entries: Option<u32>,
    /// Hardware dirty state (arm64 FEAT_HAFDBS: DBM with VTCR_EL2.HD): a
    /// logged page is left writable-clean instead of write-protected, the
    /// hardware records the first write in the leaf without a fault, and a
    /// GET scans the slot's leaves into the bitmap; protecting (CLEAR, or
    /// GET without manual protect) cleans them again. Needs bitmaps (not
    /// rings) and a format with a hardware dirty bit; huge mappings are
    /// split when logging starts (eager split, whatever its chunk policy
    /// says, in 1 GiB chunks if it says none). The hypervisor must turn the
    /// hardware's updates on (arm64: VTCR_EL2.HA and HD).
    pub hw_dirty: bool,
    /// When logging stops, unmap the page mappings of regions the host backs
    /// with huge pages, so later faults map blocks again (x86's huge-page
    /// recovery; arm64 has none).
    pub recover_huge_pages: bool,
    /// vCPUs (by index) whose fault-path reads of the MMU lock go through
    /// a reader slot of their own while no writer is around ([`lock`]),
    /// instead of the rwlock's shared reader count; 0 keeps KVM's plain
    /// rwlock for every reader.
    pub reader_slots: usize,
}

impl Default for MmuPolicy {
    fn default() -> Self {
        MmuPolicy {
            fault_path: FaultPath::ReadLockFastPath,
            eager_split_chunk: Some(1 << 30),
            split_walk: SplitPolicy::SkipReturns,
            tlb_large_range: LargeRangePolicy::WholeVmid,
            tlb_limit_pages: TlbPolicy::DEFAULT_LIMIT_PAGES,
            manual_protect: true,
            initially_set: false,
            dirty_ring_entries: None,
            hw_dirty: false,
            recover_huge_pages: true,
            reader_slots: 256,
        }
    }
}

impl MmuPolicy {
    /// The baseline of every optimisation: write-lock faults, split on
    /// fault, full split walk, split TLB calls.
    pub fn baseline() -> Self {
        MmuPolicy {
            fault_path: FaultPath::WriteLock,
            eager_split_chunk: None,
            split_walk: SplitPolicy::FullWalk,
            tlb_large_range: LargeRangePolicy::SplitCalls,
            ..MmuPolicy::default()
        }
    }
}

/// Lock and fault counters of one vCPU (or of the VM-wide operations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Faults fixed by the read-lock fast path.
    pub fast: u64,
    /// Faults handled under the write lock.
    pub slow: u64,
    /// Faults that found the mapping already fixed.
    pub spurious: u64,
    /// Faults that lost a race and returned to the guest to retry.
    pub retries: u64,
    /// Faults on unmapped addresses.
    pub translation: u64,
    /// Faults on mapped but write-protected addresses.
    pub permission: u64,
    /// Huge mappings split by a fault.
    pub splits_on_fault: u64,
    /// Pages newly marked dirty.
    pub dirtied: u64,
    /// Read-lock acquisitions.
    pub read_locks: u64,
    /// Read-lock acquisitions that had to wait.
    pub read_contended: u64,
    /// Write-lock acquisitions.
    pub write_locks: u64,
    /// Write-lock acquisitions that had to wait.
    pub write_contended: u64,
    /// Nanoseconds spent waiting for the lock.
    pub lock_wait_ns: u64,
    /// Nanoseconds spent splitting huge mappings (eager or on fault).
    pub split_ns: u64,
}

impl FaultStats {
    /// Adds `o` to `self`.
    pub fn add(&mut self, o: &FaultStats) {
        self.fast += o.fast;
        self.slow += o.slow;
        self.spurious += o.spurious;
        self.retries += o.retries;
        self.translation += o.translation;
        self.permission += o.permission;
        self.splits_on_fault += o.splits_on_fault;
        self.dirtied += o.dirtied;
        self.read_locks += o.read_locks;
        self.read_contended += o.read_contended;
        self.write_locks += o.write_locks;
        self.write_contended += o.write_contended;
        self.lock_wait_ns += o.lock_wait_ns;
        self.split_ns += o.split_ns;
    }

    /// Lock acquisitions that had to wait, both modes.
    pub fn contentions(&self) -> u64 {
        self.read_contended + self.write_contended
    }
}

/// What the hardware reports about a stage-2 fault besides its address
/// (arm64: ESR_EL2's fault status code and level).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// No valid entry translates the address.
    Translation,
    /// A valid leaf at `level` translates it without the permission the
    /// access needs.
    Permission {
        /// The leaf's level.
        level: u32,
    },
    /// A valid leaf already allows the access (a fault raised before
    /// another vCPU fixed the entry): nothing to do.
    Spurious,
}

/// What a fault did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOutcome {
    /// Fixed under the read lock.
    Fast,
    /// Fixed under the write lock.
    Slow,
    /// Nothing to do: the mapping already allowed the access.
    Spurious,
    /// Lost a race; the guest retries the access.
    Retry,
}

/// A vCPU's state in the MMU: its memslot cache, its page cache and its
/// counters.
pub struct VcpuMmu<M: MmOps> {
    id: usize,
    /// The [`Mmu`] that made it ([`Mmu::new_vcpu`]): a handle is used only
    /// with its own MMU, whose reader slot and ring it owns.
    mmu_id: u64,
    /// Its dirty ring, when the VM logs to rings (read without the ring
    /// list's lock on every fault).
    ring: Option<Arc<DirtyRing>>,
    lock_slot: Option<usize>,
    /// The dirty bitmap of the slot this vCPU last marked, for the memslot
    /// state (store id, generation) and slot id it was read in: within one
    /// state a logging slot's bitmap never changes, so marking needs no
    /// atomic load of the side table (KVM reads `memslot->dirty_bitmap`).
    dirty_cache: Option<((u64, u64), u16, Arc<DirtyBitmap>)>,
    slot_cache: VcpuSlotCache,
    cache: PageCache<M>,
    /// Counters of this vCPU's faults.
    pub stats: FaultStats,
}

impl<M: MmOps> VcpuMmu<M> {
    /// The vCPU's index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Whether the vCPU's dirty ring is soft-full: its faults are refused
    /// with [`Error::RingFull`] until the rings are harvested and reset
    /// (read without a lock, for a vCPU loop's check before entering the
    /// guest).
    pub fn ring_soft_full(&self) -> bool {
        self.ring.as_ref().is_some_and(|r| r.soft_full())
    }
}

/// What a fault found about its memslot, in the memslot state it holds.
struct FaultSlot {
    id: u16,
    /// Dirty logging is on in that state.
    logging: bool,
    /// The slot's guest range in bytes.
    start: u64,
    end: u64,
    /// The host address of the faulting page.
    hva: u64,
    /// The state: store id and generation.
    state: (u64, u64),
}

/// A memslot's state that the MMU keeps beside the memslot store.
struct SlotSide {
    dirty: ArcSwapOption<DirtyBitmap>,
    host_page: AtomicU64,
}

/// One VM's MMU.
pub struct Mmu<F: PteFormat, M: MmOps, S: MemslotStore> {
    /// Unique among the process's MMUs: brands the vCPU handles it makes.
    id: u64,
    pt: MmuLock<PageTable<F, M>>,
    reader: TableReader<F, M>,
    mm: M,
    slots: S,
    side: Box<[SlotSide]>,
    rings: RwLock<Vec<Arc<DirtyRing>>>,
    policy: MmuPolicy,
    update: Mutex<()>,
    split_cache: Mutex<PageCache<M>>,
    vm_stats: Mutex<FaultStats>,
    page_shift: u32,
    host: Arc<dyn HostMemory>,
    /// Host ranges being invalidated ([`Mmu::invalidate_hva_range_start`]).
    invalidating: Mutex<Vec<(u64, u64)>>,
    /// Its length, read without the lock.
    invalidations: AtomicU64,
    /// Invalidation calls issued by dirty-log clears, and their time.
    pub clear_tlb_calls: AtomicU64,
}

struct Stage2Hook<'a, F: PteFormat, M: MmOps, S: MemslotStore> {
    mmu: &'a Mmu<F, M, S>,
}

impl<F: PteFormat, M: MmOps, S: MemslotStore> Stage2Invalidate for Stage2Hook<'_, F, M, S> {
    fn unmap_gfn_range(&self, base_gfn: u64, npages: u64) {
        let shift = self.mmu.page_shift;
        let mut st = FaultStats::default();
        let mut pt = self.mmu.write_lock(&mut st);
        // Whole leaves: a slot's range never cuts one (faults map blocks
        // only inside a slot), but unmapping leaf by leaf cannot fail even
        // if it did, and the range lies inside the IPA space (checked when
        // the slot was made).
        let (ipa, len) = (base_gfn << shift, npages << shift);
        let unmapped = pt.leaves(ipa, len).and_then(|leaves| {
            leaves
                .iter()
                .try_for_each(|l| pt.unmap(l.ipa, l.size).map(|_| ()))
        });
        if let Err(e) = unmapped {
            unreachable!("unmapping slot range {ipa:#x}+{len:#x}: {e}");
        }
        drop(pt);
        self.mmu.vm_stats.lock().unwrap().add(&st);
    }
}

impl<F: PteFormat, M: MmOps, S: MemslotStore> Mmu<F, M, S> {
    /// An MMU for `fmt`, table pages from `mm`, invalidations to `tlb`,
    /// memslots in `slots` (whose page size must be the granule).
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
        let page_shift = fmt.page_shift();
        if slots.config().page_shift != page_shift {
            return Err(Error::InvalidConfig {
                what: "memslot page shift (must match the granule)",
                value: u64::from(slots.config().page_shift),
            });
        }
        if let Some(chunk) = policy.eager_split_chunk {
            if chunk == 0 || chunk % fmt.page_size() != 0 {
                return Err(Error::InvalidConfig {
                    what: "eager split chunk size",
                    value: chunk,
                });
            }
        }
        if let Some(n) = policy.dirty_ring_entries {
            DirtyRing::new(n)?;
        }
        if policy.hw_dirty && (fmt.hw_dirty_bit() == 0 || policy.dirty_ring_entries.is_some()) {
            return Err(Error::InvalidConfig {
                what: "hardware dirty state (needs a format with a hardware dirty bit, and bitmaps, not rings)",
                value: u64::from(policy.dirty_ring_entries.unwrap_or(0)),
            });
        }
        let mut pt = PageTable::new(fmt, mm.clone(), tlb)?;
        pt.set_tlb_policy(TlbPolicy {
            limit_pages: policy.tlb_limit_pages,
            large_range: policy.tlb_large_range,
            page_shift,
        });
        let reader = pt.reader();
        let nslots = usize::from(slots.config().max_user_slots);
        let side = (0..nslots)
            .map(|_| SlotSide {
                dirty: ArcSwapOption::empty(),
                host_page: AtomicU64::new(1 << page_shift),
            })
            .collect();
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Ok(Mmu {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            pt: MmuLock::new(pt, policy.reader_slots),
            reader,
            split_cache: Mutex::new(PageCache::new(mm.clone())),
            mm,
            slots,
            side,
            rings: RwLock::new(Vec::new()),
            policy,
            update: Mutex::new(()),
            vm_stats: Mutex::new(FaultStats::default()),
            page_shift,
            host: Arc::new(IdentityHost),
            invalidating: Mutex::new(Vec::new()),
            invalidations: AtomicU64::new(0),
            clear_tlb_calls: AtomicU64::new(0),
        })
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

    /// The physical address to map `[hva, hva + size)` to, if the host
    /// backs it contiguously at an address aligned to `size`.
    fn phys_for(&self, hva: u64, size: u64) -> Option<u64> {
        self.host
            .host_to_phys(hva, size)
            .filter(|pa| pa & (size - 1) == 0)
    }

    /// The physical address of the page at `hva`, after the cache
    /// maintenance a new leaf over it needs.
    fn phys_for_leaf(&self, hva: u64, size: u64, prot: Prot) -> Result<u64> {
        let pa = self.phys_for(hva, size).ok_or(Error::Unbacked { hva })?;
        self.host.clean_dcache(hva, size);
        if prot.contains(Prot::X) {
            self.host.invalidate_icache(hva, size);
        }
        Ok(pa)
    }

    /// The policies in force.
    pub fn policy(&self) -> &MmuPolicy {
        &self.policy
    }

    /// The memslot store.
    pub fn slots(&self) -> &S {
        &self.slots
    }

    /// A lockless reader of the stage-2 table (a vCPU's table walker).
    pub fn reader(&self) -> TableReader<F, M> {
        self.reader.clone()
    }

    /// Runs `f` on the table under the read lock (inspection, tests).
    pub fn with_table<R>(&self, f: impl FnOnce(&PageTable<F, M>) -> R) -> R {
        f(&self.pt.read(None).guard)
    }

    /// Counters of VM-wide operations (logging changes, clears, memslot
    /// updates), not of vCPU faults.
    pub fn vm_stats(&self) -> FaultStats {
        *self.vm_stats.lock().unwrap()
    }

    /// Creates the MMU state of a new vCPU (and its dirty ring, if rings
    /// are on).
    ///
    /// # Errors
    /// [`Error::InvalidRingSize`] cannot happen here (checked at creation).
    pub fn new_vcpu(&self) -> Result<VcpuMmu<M>> {
        let mut rings = self.rings.write().unwrap();
        let id = rings.len();
        let entries = self.policy.dirty_ring_entries.unwrap_or(256);
        let ring = Arc::new(DirtyRing::new(entries)?);
        rings.push(ring.clone());
        Ok(VcpuMmu {
            id,
            mmu_id: self.id,
            ring: self.policy.dirty_ring_entries.map(|_| ring),
            lock_slot: self.pt.slot_for(id),
            dirty_cache: None,
            slot_cache: VcpuSlotCache::new(),
            cache: PageCache::new(self.mm.clone()),
            stats: FaultStats::default(),
        })
    }

    /// Takes the MMU lock for reading, through the vCPU's reader slot
    /// `slot` where it has one.
    fn read_lock(
        &self,
        st: &mut FaultStats,
        slot: Option<usize>,
    ) -> ReadGuard<'_, PageTable<F, M>> {
        let a = self.pt.read(slot);
        st.read_locks += 1;
        if let Some(ns) = a.waited_ns {
            st.read_contended += 1;
            st.lock_wait_ns += ns;
        }
        a.guard
    }

    fn write_lock(&self, st: &mut FaultStats) -> WriteGuard<'_, PageTable<F, M>> {
        let a = self.pt.write();
        st.write_locks += 1;
        if let Some(ns) = a.waited_ns {
            st.write_contended += 1;
            st.lock_wait_ns += ns;
        }
        a.guard
    }

    // ---- memslots ----------------------------------------------------

    /// `KVM_SET_USER_MEMORY_REGION`: creates, deletes, moves or changes
    /// the flags of a slot. `host_page_size` is the page size of the host
    /// memory behind it (the largest stage-2 mapping a fault may install).
    /// Turning `LOG_DIRTY_PAGES` on or off enables or disables dirty logging
    /// as [`Mmu::enable_dirty_logging`] describes.
    ///
    /// # Errors
    /// [`Error::Memslot`] with KVM's validation; [`Error::InvalidConfig`]
    /// for a host page size that is not a power of two of at least a page.
    pub fn set_memory_region(
        &self,
        region: &UserMemoryRegion,
        host_page_size: u64,
    ) -> Result<MemslotChange> {
        let page = 1u64 << self.page_shift;
        if !host_page_size.is_power_of_two() || host_page_size < page {
            return Err(Error::InvalidConfig {
                what: "host page size",
                value: host_page_size,
            });
        }
        let limit = self.reader.format().ipa_limit();
        if region.memory_size != 0
            && region
                .guest_phys_addr
                .checked_add(region.memory_size)
                .is_none_or(|end| end > limit)
        {
            // The store accepts any guest range; the table cannot map one
            // beyond the IPA space, so such a slot is refused here, before
            // anything changes, not at its first fault.
            return Err(Error::OutOfRange {
                ipa: region.guest_phys_addr,
                size: region.memory_size,
                limit,
            });
        }
        let _u = self.update.lock().unwrap();
        let id = usize::from(region.id());
        let was_logging = self
            .slots
            .snapshot()
            .id_to_slot(region.id())
            .is_some_and(|s| s.dirty_logging());
        let logging =
            region.flags & SlotFlags::LOG_DIRTY_PAGES.bits() != 0 && region.memory_size != 0;
        // A bitmap must exist before a fault can see the slot logging. It is
        // only built for a request the store can accept (an id with a side
        // entry, a size within the slot limit): a bad request must fail with
        // the store's error, not index out of `side` or allocate a bitmap for
        // an absurd size first.
        let plausible = self.side.get(id).is_some()
            && region.memory_size >> self.page_shift <= self.slots.config().max_npages;
        let new_bitmap =
            (logging && !was_logging && plausible && self.policy.dirty_ring_entries.is_none())
                .then(|| {
                    Arc::new(DirtyBitmap::new(
                        region.memory_size >> self.page_shift,
                        self.initially_set(),
                    ))
                });
        let prev_host_page = self
            .side
            .get(id)
            .map(|s| s.host_page.load(Ordering::Relaxed));
        if let (Some(side), Some(b)) = (self.side.get(id), &new_bitmap) {
            side.dirty.store(Some(b.clone()));
        }
        let change = match self
            .slots
            .set_memory_region(region, &Stage2Hook { mmu: self })
        {
            Ok(c) => c,
            Err(e) => {
                if let (Some(side), Some(_)) = (self.side.get(id), &new_bitmap) {
                    side.dirty.store(None);
                }
                return Err(e.into());
            }
        };
        let side = self
            .side
            .get(id)
            .expect("the store accepted the id, so it is below max_user_slots, the length of side");
        match change {
            MemslotChange::Create => side.host_page.store(host_page_size, Ordering::Relaxed),
            MemslotChange::Delete => {
                side.dirty.store(None);
                side.host_page.store(page, Ordering::Relaxed);
            }
            MemslotChange::Move | MemslotChange::FlagsOnly => {
                if let Some(p) = prev_host_page {
                    side.host_page.store(p.max(page), Ordering::Relaxed);
                }
            }
        }
        if !logging {
            // Every change that leaves the slot unlogged drops its bitmap
            // (a move as much as a flags change), so no stale log survives.
            side.dirty.store(None);
        }
        if logging && !was_logging && change != MemslotChange::Create {
            self.start_logging(region.id())?;
        } else if !logging && was_logging && change == MemslotChange::FlagsOnly {
            self.stop_logging(region.id())?;
        }
        Ok(change)
    }

    fn initially_set(&self) -> bool {
        self.policy.manual_protect && self.policy.initially_set
    }

    /// Slot range in bytes.
    fn slot_range(&self, id: u16) -> Result<(u64, u64)> {
        let snap = self.slots.snapshot();
        let s = snap.id_to_slot(id).ok_or(Error::NoSuchSlot {
            slot: u32::from(id),
        })?;
        Ok((
            s.base_gfn() << self.page_shift,
            s.npages() << self.page_shift,
        ))
    }

    /// Turns dirty logging on for slot `id` (a flags change).
    ///
    /// Unless bitmaps start all set, the slot's huge mappings are split
    /// first when eager split is on (in chunks: the cache is topped up and
    /// the lock dropped between chunks), then the whole slot is
    /// write-protected (in 1 GiB chunks) and its TLB entries flushed.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], [`Error::Memslot`].
    pub fn enable_dirty_logging(&self, id: u16) -> Result<()> {
        let region = self.region_of(id, true)?;
        let host_page = self.side[usize::from(id)].host_page.load(Ordering::Relaxed);
        self.set_memory_region(&region, host_page).map(|_| ())
    }

    /// Turns dirty logging off for slot `id`: later faults map huge pages
    /// again (and, with [`MmuPolicy::recover_huge_pages`], page mappings of
    /// huge-page-backed regions are dropped so they fault back as blocks).
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], [`Error::Memslot`].
    pub fn disable_dirty_logging(&self, id: u16) -> Result<()> {
        let region = self.region_of(id, false)?;
        let host_page = self.side[usize::from(id)].host_page.load(Ordering::Relaxed);
        self.set_memory_region(&region, host_page).map(|_| ())
    }

    fn region_of(&self, id: u16, logging: bool) -> Result<UserMemoryRegion> {
        let snap = self.slots.snapshot();
        let s = snap.id_to_slot(id).ok_or(Error::NoSuchSlot {
            slot: u32::from(id),
        })?;
        let mut flags = s.flags().bits() & SlotFlags::USER_MASK;
        if logging {
            flags |= SlotFlags::LOG_DIRTY_PAGES.bits();
        } else {
            flags &= !SlotFlags::LOG_DIRTY_PAGES.bits();
        }
        Ok(UserMemoryRegion::new(
            id,
            SlotFlags::from_bits(flags),
            s.base_gfn() << self.page_shift,
            s.npages() << self.page_shift,
            s.userspace_addr(),
        ))
    }

    fn start_logging(&self, id: u16) -> Result<()> {
        if self.initially_set() {
            return Ok(());
        }
        let (base, size) = self.slot_range(id)?;
        let chunk = match (self.policy.eager_split_chunk, self.policy.hw_dirty) {
            (Some(c), _) => Some(c),
            // A dirty bit per block would log whole blocks: split first.
            (None, true) => Some(1 << 30),
            (None, false) => None,
        };
        if let Some(chunk) = chunk {
            self.split_range(base, size, chunk)?;
        }
        self.wrprotect_range(base, size)
    }

    fn stop_logging(&self, id: u16) -> Result<()> {
        self.side[usize::from(id)].dirty.store(None);
        if !self.policy.recover_huge_pages {
            return Ok(());
        }
        let host_page = self.side[usize::from(id)].host_page.load(Ordering::Relaxed);
        let (base, size) = self.slot_range(id)?;
        let snap = self.slots.snapshot();
        let hva = snap.id_to_slot(id).map(|s| s.userspace_addr()).unwrap_or(0);
        drop(snap);
        let block = self.block_size_for(host_page);
        if block <= 1 << self.page_shift || (base ^ hva) & (block - 1) != 0 {
            return Ok(());
        }
        // Drop the page mappings of every block-aligned region inside the
        // slot; faults map them back as blocks.
        let first = base.next_multiple_of(block);
        let mut a = first;
        let mut st = FaultStats::default();
        while a + block <= base + size {
            let mut pt = self.write_lock(&mut st);
            let leaves = pt.leaves(a, block)?;
            if leaves.iter().any(|l| l.size < block) {
                pt.unmap(a, block)?;
            }
            drop(pt);
            a += block;
        }
        self.vm_stats.lock().unwrap().add(&st);
        Ok(())
    }

    /// The largest block the format allows that is not larger than `host_page`.
    fn block_size_for(&self, host_page: u64) -> u64 {
        self.reader.format().page_size().max(
            self.leaf_sizes()
                .into_iter()
                .filter(|&g| g <= host_page)
                .max()
                .unwrap_or(0),
        )
    }

    fn leaf_sizes(&self) -> Vec<u64> {
        let f = self.reader.format();
        (f.start_level()..=f.last_level())
            .filter(|&l| f.leaf_allowed(l))
            .map(|l| f.granule(l))
            .collect()
    }

    /// Splits every huge mapping in `[base, base + size)` chunk by chunk,
    /// dropping the lock between chunks.
    fn split_range(&self, base: u64, size: u64, chunk: u64) -> Result<()> {
        let mut st = FaultStats::default();
        let mut cache = self.split_cache.lock().unwrap();
        let mut a = base;
        while a < base + size {
            let next = ((a / chunk) + 1) * chunk;
            let n = next.min(base + size) - a;
            let capacity = self.with_table(|pt| pt.split_capacity(n));
            cache.top_up(capacity)?;
            let mut pt = self.write_lock(&mut st);
            let t0 = Instant::now();
            pt.split(a, n, &mut cache, self.policy.split_walk)?;
            st.split_ns += t0.elapsed().as_nanos() as u64;
            drop(pt);
            a += n;
        }
        self.vm_stats.lock().unwrap().add(&st);
        Ok(())
    }

    /// Write-protects `[base, base + size)` in 1 GiB chunks and flushes the
    /// range once.
    fn wrprotect_range(&self, base: u64, size: u64) -> Result<()> {
        let mut st = FaultStats::default();
        let tlb = self.with_table(|pt| pt.tlb().clone());
        let policy = self.with_table(|pt| pt.tlb_policy());
        let mut batch = TlbBatch::new(&*tlb, policy);
        let chunk = 1u64 << 30;
        let mut a = base;
        while a < base + size {
            let n = (((a / chunk) + 1) * chunk).min(base + size) - a;
            let mut pt = self.write_lock(&mut st);
            self.protect(&mut pt, a, n, &mut batch)?;
            drop(pt);
            a += n;
        }
        batch.finish();
        self.vm_stats.lock().unwrap().add(&st);
        Ok(())
    }

    // ---- the fault path ------------------------------------------------

    /// Handles a stage-2 fault of `vcpu` at `gpa` (`write` for a write
    /// access), as an exit handler would that has only the address: it
    /// walks the table to tell a translation fault from a permission fault,
    /// then goes on as [`Mmu::handle_stage2_fault`].
    ///
    /// # Errors
    /// [`Error::NoSlot`] (MMIO), [`Error::WriteToReadOnly`], or an engine
    /// error (out of memory).
    pub fn handle_fault(
        &self,
        vcpu: &mut VcpuMmu<M>,
        gpa: u64,
        write: bool,
    ) -> Result<FaultOutcome> {
        let kind = match self.reader.translate(gpa) {
            Some(t) if !write || t.prot.contains(Prot::W) => FaultKind::Spurious,
            Some(t) => FaultKind::Permission { level: t.level },
            None => FaultKind::Translation,
        };
        self.handle_stage2_fault(vcpu, gpa, write, kind)
    }

    /// Handles a stage-2 fault of `vcpu` at `gpa` (`write` for a write
    /// access) of the kind the hardware reported (arm64's ESR fault status
    /// and level), so the fast path needs no walk before its
    /// compare-and-swap; a report that the table has overtaken is caught
    /// there and the guest retries.
    ///
    /// # Errors
    /// [`Error::NoSlot`] (MMIO), [`Error::WriteToReadOnly`], or an engine
    /// error (out of memory).
    pub fn handle_stage2_fault(
        &self,
        vcpu: &mut VcpuMmu<M>,
        gpa: u64,
        write: bool,
        kind: FaultKind,
    ) -> Result<FaultOutcome> {
        if vcpu.mmu_id != self.id {
            return Err(Error::ForeignVcpu { vcpu: vcpu.id });
        }
        if vcpu.ring.as_ref().is_some_and(|r| r.soft_full()) {
            // KVM does not enter a vCPU whose ring is soft-full: making a
            // page writable now could leave its write unrecorded.
            return Err(Error::RingFull { vcpu: vcpu.id });
        }
        let shift = self.page_shift;
        let gfn = gpa >> shift;
        let snap = self.slots.snapshot();
        let slot = snap
            .gfn_to_slot_vcpu(&mut vcpu.slot_cache, gfn)
            .ok_or(Error::NoSlot { gpa })?;
        let hva = match slot.gfn_to_hva(gfn, write) {
            Ok(h) => h,
            Err(crate::memslot::HvaFault::ReadOnly) => return Err(Error::WriteToReadOnly { gpa }),
            // A slot being deleted or moved: the guest retries.
            Err(_) => return Ok(FaultOutcome::Retry),
        };
        let fs = FaultSlot {
            id: slot.id(),
            logging: slot.dirty_logging(),
            start: slot.base_gfn() << shift,
            end: slot.end_gfn() << shift,
            hva,
            state: (snap.store_id(), snap.generation()),
        };
        // `snap` is held to the end of the fault, as KVM holds SRCU across
        // it: a memslot change (turning logging on) waits for this fault
        // before it write-protects, so a fault that saw logging off cannot
        // make a page writable, unlogged, after the protect and flush.
        match kind {
            FaultKind::Spurious => {
                vcpu.stats.spurious += 1;
                return Ok(FaultOutcome::Spurious);
            }
            FaultKind::Permission { .. } if !write => {
                // Every mapping is readable: nothing to relax.
                vcpu.stats.spurious += 1;
                return Ok(FaultOutcome::Spurious);
            }
            FaultKind::Permission { level } => {
                // The fast path: relax a page (or a block of a slot that is
                // not logged) under the read lock. The leaf must still be at
                // the reported level: a huge mapping is never made writable
                // while its slot is logged.
                let fmt = self.reader.format();
                if self.policy.fault_path == FaultPath::ReadLockFastPath
                    && (level == fmt.last_level() || !fs.logging)
                {
                    let pt = self.read_lock(&mut vcpu.stats, vcpu.lock_slot);
                    match pt.relax_perms_at_level(gpa, Prot::RW, level) {
                        Ok(o) if o.new == o.old => {
                            vcpu.stats.spurious += 1;
                            return Ok(FaultOutcome::Spurious);
                        }
                        Ok(o) => {
                            drop(pt);
                            vcpu.stats.permission += 1;
                            if o.became_writable(fmt.write_bit()) && fs.logging {
                                self.mark_dirty(vcpu, &fs, gfn - (fs.start >> shift));
                            }
                            vcpu.stats.fast += 1;
                            return Ok(FaultOutcome::Fast);
                        }
                        Err(Error::Again { .. }) => {
                            vcpu.stats.retries += 1;
                            return Ok(FaultOutcome::Retry);
                        }
                        Err(Error::NotMapped { .. }) => {}
                        Err(e) => return Err(e),
                    }
                }
                vcpu.stats.permission += 1;
            }
            FaultKind::Translation => vcpu.stats.translation += 1,
        }
        self.slow_fault(vcpu, gpa, write, &fs)
    }

    fn slow_fault(
        &self,
        vcpu: &mut VcpuMmu<M>,
        gpa: u64,
        write: bool,
        fs: &FaultSlot,
    ) -> Result<FaultOutcome> {
        let FaultSlot {
            id,
            logging,
            start: slot_start,
            end: slot_end,
            hva,
            ..
        } = *fs;
        let fmt = self.reader.format();
        let shift = self.page_shift;
        let page = 1u64 << shift;
        // Top up outside the lock: enough for a map, or for splitting the
        // largest block in one step.
        let levels = (fmt.last_level() - fmt.start_level()) as usize;
        vcpu.cache.top_up(levels)?;
        let mut pt = self.write_lock(&mut vcpu.stats);
        vcpu.stats.slow += 1;
        if self.hva_invalidating(hva, page) {
            // The host is changing what backs the page: wait for it.
            vcpu.stats.retries += 1;
            return Ok(FaultOutcome::Retry);
        }
        let offset = (gpa - slot_start) >> shift;
        match pt.translate(gpa) {
            Some(t) if !write || t.prot.contains(Prot::W) => {
                vcpu.stats.spurious += 1;
                Ok(FaultOutcome::Spurious)
            }
            Some(t) if logging && t.size > page => {
                // A huge mapping is never made writable while logged. Split
                // on fault as KVM does without eager split (arm64's map of a
                // page over a block; x86 before 5.18): break the block and
                // map only the faulting page; the rest of the block faults
                // back page by page (translation faults on the slow path).
                let block = gpa & !(t.size - 1);
                let t0 = Instant::now();
                pt.unmap(block, t.size)?;
                let prot = Prot::RWX;
                let opts = MapOptions { force_pages: true };
                let pa = self.phys_for_leaf(hva & !(page - 1), page, prot)?;
                pt.map(gpa & !(page - 1), page, pa, prot, &mut vcpu.cache, opts)?;
                vcpu.stats.split_ns += t0.elapsed().as_nanos() as u64;
                vcpu.stats.splits_on_fault += 1;
                drop(pt);
                self.mark_dirty(vcpu, fs, offset);
                Ok(FaultOutcome::Slow)
            }
            Some(_) => {
                let o = pt.relax_perms(gpa, Prot::RW)?;
                drop(pt);
                if logging && o.became_writable(fmt.write_bit()) {
                    self.mark_dirty(vcpu, fs, offset);
                }
                Ok(FaultOutcome::Slow)
            }
            None => {
                // Map: pages while logging, else the largest block that the
                // host backing, both alignments and the slot allow.
                let host_page = self.side[usize::from(id)].host_page.load(Ordering::Relaxed);
                let mut size = page;
                if !logging {
                    for g in self.leaf_sizes() {
                        let base = gpa & !(g - 1);
                        // `hva` is the page's; `gpa` carries the access's
                        // offset within the page (a real abort's IPA does).
                        if g <= host_page
                            && ((gpa & !(page - 1)) ^ hva) & (g - 1) == 0
                            && base >= slot_start
                            && base + g <= slot_end
                            && (g == page
                                || (self.phys_for(hva & !(g - 1), g).is_some()
                                    && !self.hva_invalidating(hva & !(g - 1), g)))
                        {
                            size = g;
                            break;
                        }
                    }
                }
                // Logged pages are mapped read-only on a read so the first
                // write traps; otherwise writable as the host page is.
                let prot = if logging && !write {
                    Prot::R | Prot::X
                } else {
                    Prot::RWX
                };
                let opts = MapOptions { force_pages: false };
                let pa = self.phys_for_leaf(hva & !(size - 1), size, prot)?;
                let mut r = pt.map(gpa & !(size - 1), size, pa, prot, &mut vcpu.cache, opts);
                if matches!(r, Err(Error::AlreadyMapped { .. })) && size > page {
                    // Part of the block is mapped by pages: map just this page.
                    let pa = self.phys_for_leaf(hva & !(page - 1), page, prot)?;
                    r = pt.map(gpa & !(page - 1), page, pa, prot, &mut vcpu.cache, opts);
                }
                r?;
                drop(pt);
                if logging && write {
                    self.mark_dirty(vcpu, fs, offset);
                }
                Ok(FaultOutcome::Slow)
            }
        }
    }

    fn mark_dirty(&self, vcpu: &mut VcpuMmu<M>, fs: &FaultSlot, offset: u64) {
        let slot = fs.id;
        if let Some(ring) = &vcpu.ring {
            // The push cannot overflow: a fault on a soft-full ring is
            // refused before it changes anything, and a fault pushes at most
            // once, into the entries reserved past the soft limit.
            match ring.push(vcpu.id, u32::from(slot), offset) {
                Ok(_) => vcpu.stats.dirtied += 1,
                Err(e) => unreachable!("dirty ring overflow past its reserve: {e}"),
            }
        } else {
            let cached =
                matches!(&vcpu.dirty_cache, Some((st, id, _)) if *st == fs.state && *id == slot);
            if !cached {
                // The bitmap was published before the state in which the
                // slot logs, and is dropped only after a later state has
                // waited for this fault's.
                vcpu.dirty_cache = self.side[usize::from(slot)]
                    .dirty
                    .load_full()
                    .map(|b| (fs.state, slot, b));
            }
            if let Some((_, _, b)) = &vcpu.dirty_cache {
                if b.mark(offset) {
                    vcpu.stats.dirtied += 1;
                }
            }
        }
    }

    // ---- dirty log: bitmaps -------------------------------------------

    fn bitmap(&self, id: u16) -> Result<Arc<DirtyBitmap>> {
        if self.policy.dirty_ring_entries.is_some() {
            return Err(Error::WrongDirtyMode {
                needs: "dirty bitmaps (the VM uses dirty rings)",
            });
        }
        let side = self
            .side
            .get(usize::from(id))
            .filter(|_| self.slots.snapshot().id_to_slot(id).is_some())
            .ok_or(Error::NoSuchSlot {
                slot: u32::from(id),
            })?;
        side.dirty.load_full().ok_or(Error::LoggingDisabled {
            slot: u32::from(id),
        })
    }

    /// `KVM_GET_DIRTY_LOG`: copies slot `id`'s bitmap into `out`. Without
    /// manual protect it also clears the bitmap and write-protects the
    /// pages that were dirty (take-and-clear, protect, flush); returns the
    /// number of dirty pages reported.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], [`Error::LoggingDisabled`],
    /// [`Error::WrongDirtyMode`], [`Error::BitmapTooSmall`].
    pub fn get_dirty_log(&self, id: u16, out: &mut [u64]) -> Result<u64> {
        let _u = self.update.lock().unwrap();
        let b = self.bitmap(id)?;
        if out.len() < b.words() {
            return Err(Error::BitmapTooSmall {
                words: out.len(),
                needed: b.words(),
            });
        }
        self.sync_hw_dirty(id, &b)?;
        if self.policy.manual_protect {
            b.copy_to(out)?;
            return Ok(out[..b.words()]
                .iter()
                .map(|w| u64::from(w.count_ones()))
                .sum());
        }
        let (base, size) = self.slot_range(id)?;
        let mut st = FaultStats::default();
        let mut pt = self.write_lock(&mut st);
        let tlb = pt.tlb().clone();
        let mut batch = TlbBatch::new(&*tlb, pt.tlb_policy());
        let mut n = 0;
        for (i, o) in out.iter_mut().enumerate().take(b.words()) {
            let mask = b.take_word(i);
            *o = mask;
            if mask != 0 {
                n += u64::from(mask.count_ones());
                self.protect_mask(&mut pt, base, i as u64 * 64, mask, &mut batch)?;
            }
        }
        drop(pt);
        if n > 0 {
            batch.add(base, size);
        }
        let calls = batch.finish();
        self.clear_tlb_calls.fetch_add(calls, Ordering::Relaxed);
        self.vm_stats.lock().unwrap().add(&st);
        Ok(n)
    }

    /// `KVM_CLEAR_DIRTY_LOG`: for pages `[first_page, first_page +
    /// num_pages)` of slot `id` whose bit is set in `bitmap` (bit 0 of word
    /// 0 is `first_page`), clears the dirty bits that are set and
    /// write-protects exactly those pages, then flushes the slot's TLB
    /// entries once; returns the number of pages cleared. Processed in
    /// 1 GiB chunks, dropping the lock between them (QEMU's default clear
    /// chunk is the same size).
    ///
    /// # Errors
    /// [`Error::ClearNotAligned`], [`Error::ClearBadRange`],
    /// [`Error::BitmapTooSmall`], [`Error::NoSuchSlot`],
    /// [`Error::LoggingDisabled`], [`Error::WrongDirtyMode`].
    pub fn clear_dirty_log(
        &self,
        id: u16,
        first_page: u64,
        num_pages: u64,
        bitmap: &[u64],
    ) -> Result<u64> {
        let _u = self.update.lock().unwrap();
        let b = self.bitmap(id)?;
        check_clear_args(first_page, num_pages, b.npages(), bitmap.len())?;
        let (base, size) = self.slot_range(id)?;
        let tlb = self.with_table(|pt| pt.tlb().clone());
        let mut batch = TlbBatch::new(&*tlb, self.with_table(|pt| pt.tlb_policy()));
        let mut st = FaultStats::default();
        let words = num_pages.div_ceil(64) as usize;
        let first_word = (first_page / 64) as usize;
        let chunk_words = ((1u64 << 30) >> self.page_shift) as usize / 64;
        let split = self.initially_set() && self.policy.eager_split_chunk.is_some();
        let mut cache = self.split_cache.lock().unwrap();
        let mut cleared = 0;
        let mut w = 0;
        while w < words {
            let end = (w + chunk_words.max(1)).min(words);
            if split {
                let bytes = ((end - w) as u64 * 64) << self.page_shift;
                let cap = self.with_table(|pt| pt.split_capacity(bytes));
                cache.top_up(cap)?;
            }
            let mut pt = self.write_lock(&mut st);
            for (k, &user) in bitmap.iter().enumerate().take(end).skip(w) {
                let mask = b.clear_masked(first_word + k, user);
                if mask == 0 {
                    continue;
                }
                cleared += u64::from(mask.count_ones());
                let page0 = (first_word + k) as u64 * 64;
                if split {
                    let lo = base + ((page0 + u64::from(mask.trailing_zeros())) << self.page_shift);
                    let hi =
                        base + ((page0 + 64 - u64::from(mask.leading_zeros())) << self.page_shift);
                    let t0 = Instant::now();
                    pt.split(lo, hi - lo, &mut cache, self.policy.split_walk)?;
                    st.split_ns += t0.elapsed().as_nanos() as u64;
                }
                self.protect_mask(&mut pt, base, page0, mask, &mut batch)?;
            }
            drop(pt);
            w = end;
        }
        drop(cache);
        if cleared > 0 {
            batch.add(base, size);
        }
        let calls = batch.finish();
        self.clear_tlb_calls.fetch_add(calls, Ordering::Relaxed);
        self.vm_stats.lock().unwrap().add(&st);
        Ok(cleared)
    }

    /// Write-protects the pages of `mask` (bit i = page `page0 + i` of the
    /// slot at `base`), one call per run of consecutive bits.
    /// Write-protects a range for dirty logging: clears write permission,
    /// or with hardware dirty state makes the leaves writable-clean.
    fn protect(
        &self,
        pt: &mut PageTable<F, M>,
        ipa: u64,
        size: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        if self.policy.hw_dirty {
            pt.clean_hw_dirty_batched(ipa, size, batch)
        } else {
            pt.wrprotect_batched(ipa, size, batch)
        }
    }

    /// Hardware dirty state: records the leaves of slot `id` the hardware
    /// dirtied in its bitmap (the scan KVM's DBM series does before it
    /// copies the bitmap). Runs under the MMU lock for reading: the
    /// hardware updates leaves concurrently, and only protection, under the
    /// write lock, cleans them.
    fn sync_hw_dirty(&self, id: u16, b: &DirtyBitmap) -> Result<()> {
        if !self.policy.hw_dirty {
            return Ok(());
        }
        let (base, size) = self.slot_range(id)?;
        let shift = self.page_shift;
        let mut st = FaultStats::default();
        let pt = self.read_lock(&mut st, None);
        pt.scan_hw_dirty(base, size, |ipa, len| {
            for p in 0..len >> shift {
                b.mark(((ipa - base) >> shift) + p);
            }
        })?;
        drop(pt);
        self.vm_stats.lock().unwrap().add(&st);
        Ok(())
    }

    fn protect_mask(
        &self,
        pt: &mut PageTable<F, M>,
        base: u64,
        page0: u64,
        mut mask: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<()> {
        while mask != 0 {
            let lo = mask.trailing_zeros();
            let run = (!(mask >> lo)).trailing_zeros();
            let start = base + ((page0 + u64::from(lo)) << self.page_shift);
            self.protect(pt, start, u64::from(run) << self.page_shift, batch)?;
            mask = if lo + run >= 64 {
                0
            } else {
                mask & !(((1u64 << run) - 1) << lo)
            };
        }
        Ok(())
    }

    // ---- dirty log: rings ---------------------------------------------

    /// Whether `vcpu`'s dirty ring is soft-full: the vCPU must not enter the
    /// guest until the ring is harvested and reset.
    pub fn ring_soft_full(&self, vcpu: usize) -> bool {
        self.policy.dirty_ring_entries.is_some()
            && self
                .rings
                .read()
                .unwrap()
                .get(vcpu)
                .is_some_and(|r| r.soft_full())
    }

    /// Harvests every vCPU's ring into `out`; returns the number of entries.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] when rings are off.
    pub fn harvest_rings(&self, out: &mut Vec<DirtyGfn>) -> Result<usize> {
        if self.policy.dirty_ring_entries.is_none() {
            return Err(Error::WrongDirtyMode {
                needs: "dirty rings",
            });
        }
        Ok(self
            .rings
            .read()
            .unwrap()
            .iter()
            .map(|r| r.harvest(out))
            .sum())
    }

    /// `KVM_RESET_DIRTY_RINGS`: re-protects every harvested page and frees
    /// its ring entry, then flushes the whole VM's TLBs once if anything
    /// was reset; returns the number of entries reset.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] when rings are off.
    pub fn reset_rings(&self) -> Result<u64> {
        if self.policy.dirty_ring_entries.is_none() {
            return Err(Error::WrongDirtyMode {
                needs: "dirty rings",
            });
        }
        let _u = self.update.lock().unwrap();
        let snap = self.slots.snapshot();
        let rings = self.rings.read().unwrap().clone();
        let mut st = FaultStats::default();
        let mut pt = self.write_lock(&mut st);
        let tlb = pt.tlb().clone();
        let mut batch = TlbBatch::new(&*tlb, pt.tlb_policy());
        let mut total = 0;
        let mut result = Ok(());
        for r in &rings {
            total += r.reset(|slot, offset, mask| {
                let Ok(id) = u16::try_from(slot) else { return };
                let Some(s) = snap.id_to_slot(id) else { return };
                // Entries beyond the slot (a stale ring entry of a moved
                // slot) are ignored, as KVM does.
                if offset + 64 - u64::from(mask.leading_zeros()) > s.npages() {
                    return;
                }
                let base = s.base_gfn() << self.page_shift;
                if let Err(e) = self.protect_mask(&mut pt, base, offset, mask, &mut batch) {
                    result = Err(e);
                }
            });
        }
        drop(pt);
        drop(snap);
        // KVM flushes the whole VM after a reset.
        if total > 0 {
            batch.add_whole_vmid();
        }
        batch.finish();
        self.vm_stats.lock().unwrap().add(&st);
        result.map(|_| total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::arm64::{Arm64Stage2, Granule};
    use crate::memslot::{MemslotConfig, TreeMemslots};
    use crate::tlb::NoTlb;
    use crate::HostMmOps;

    type TestMmu = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;

    const GPA: u64 = 1 << 30;
    /// Host addresses only recorded in the table, never touched.
    const HVA: u64 = 0x7000_0000_0000;

    fn mmu(policy: MmuPolicy) -> TestMmu {
        let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
        let mm = HostMmOps::new(4096).unwrap();
        let store = TreeMemslots::with_config(MemslotConfig::default());
        Mmu::new(fmt, mm, Arc::new(NoTlb), store, policy).unwrap()
    }

    #[test]
    fn logged_region_with_bad_id_is_refused_not_a_panic() {
        let m = mmu(MmuPolicy::default());
        let id = m.slots().config().max_user_slots;
        let r = UserMemoryRegion::new(id, SlotFlags::LOG_DIRTY_PAGES, GPA, 1 << 20, HVA);
        assert!(matches!(
            m.set_memory_region(&r, 4096),
            Err(Error::Memslot(_))
        ));
    }

    #[test]
    fn logged_region_too_large_is_refused_before_any_bitmap() {
        let m = mmu(MmuPolicy::default());
        // 2^52 pages: a bitmap for it would be 512 TiB.
        let r = UserMemoryRegion::new(0, SlotFlags::LOG_DIRTY_PAGES, 0, 1 << 63, 0);
        assert!(matches!(
            m.set_memory_region(&r, 4096),
            Err(Error::Memslot(_) | Error::OutOfRange { .. })
        ));
    }

    #[test]
    fn a_slot_beyond_the_ipa_space_is_refused_at_creation() {
        let m = mmu(MmuPolicy::default());
        // 40-bit IPA space: the last MiB is fine, one more byte is not.
        let ok = UserMemoryRegion::new(0, SlotFlags::NONE, (1 << 40) - (1 << 20), 1 << 20, HVA);
        m.set_memory_region(&ok, 4096).unwrap();
        let bad = UserMemoryRegion::new(1, SlotFlags::NONE, 1 << 40, 1 << 20, HVA);
        assert!(matches!(
            m.set_memory_region(&bad, 4096),
            Err(Error::OutOfRange { .. })
        ));
        assert!(
            m.slots().snapshot().id_to_slot(1).is_none(),
            "nothing was created"
        );
    }

    /// A move that turns logging off drops the bitmap like a flags change.
    #[test]
    fn a_move_that_stops_logging_drops_the_bitmap() {
        let m = mmu(MmuPolicy::default());
        let r = UserMemoryRegion::new(0, SlotFlags::LOG_DIRTY_PAGES, GPA, 1 << 20, HVA);
        m.set_memory_region(&r, 4096).unwrap();
        let mut bm = vec![0u64; 4];
        m.get_dirty_log(0, &mut bm).unwrap();
        let moved = UserMemoryRegion::new(0, SlotFlags::NONE, GPA << 1, 1 << 20, HVA);
        m.set_memory_region(&moved, 4096).unwrap();
        assert_eq!(
            m.get_dirty_log(0, &mut bm),
            Err(Error::LoggingDisabled { slot: 0 })
        );
    }

    /// Hardware dirty state: logged leaves are writable-clean, a write the
    /// hardware records (write bit set, simulated here by relaxing the
    /// leaf as the walker would) is found by GET, and CLEAR cleans it.
    #[test]
    fn hardware_dirty_state_is_scanned_and_cleaned() {
        use crate::format::arm64::{DBM, S2AP_W};
        let m = mmu(MmuPolicy {
            hw_dirty: true,
            ..MmuPolicy::default()
        });
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 2 << 20, HVA);
        m.set_memory_region(&r, 2 << 20).unwrap();
        let mut v = m.new_vcpu().unwrap();
        m.handle_fault(&mut v, GPA, true).unwrap();
        assert_eq!(m.reader().translate(GPA).unwrap().size, 2 << 20);
        m.enable_dirty_logging(0).unwrap();
        let leaves = m.with_table(|pt| pt.leaves(GPA, 2 << 20)).unwrap();
        assert_eq!(leaves.len(), 512, "split when logging starts");
        assert!(leaves.iter().all(|l| l.pte & (DBM | S2AP_W) == DBM));
        // The hardware's update of pages 3 and 300.
        for p in [3u64, 300] {
            m.with_table(|pt| pt.relax_perms(GPA + p * 4096, Prot::RW))
                .unwrap();
        }
        let mut bm = vec![0u64; 8];
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 2);
        assert_eq!((bm[0], bm[4]), (1 << 3, 1 << (300 - 256)));
        assert_eq!(m.clear_dirty_log(0, 0, 512, &bm).unwrap(), 2);
        let t = m.reader().translate(GPA + 300 * 4096).unwrap();
        assert_eq!(t.pte & (DBM | S2AP_W), DBM, "cleaned: writable-clean again");
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0);
        assert_eq!(v.stats.permission, 0);
        // A hardware-dirtied leaf the host invalidates keeps its write in
        // the bitmap (found on QEMU: remapped pages lost their writes).
        m.with_table(|pt| pt.relax_perms(GPA + 7 * 4096, Prot::RW))
            .unwrap();
        m.invalidate_hva_range_start(HVA + 7 * 4096, 4096).unwrap();
        m.invalidate_hva_range_end(HVA + 7 * 4096, 4096).unwrap();
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 1);
        assert_eq!(bm[0], 1 << 7);
    }

    #[test]
    fn hardware_dirty_state_refuses_rings() {
        let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
        let r = Mmu::new(
            fmt,
            HostMmOps::new(4096).unwrap(),
            Arc::new(NoTlb),
            TreeMemslots::with_config(MemslotConfig::default()),
            MmuPolicy {
                hw_dirty: true,
                dirty_ring_entries: Some(1024),
                ..MmuPolicy::default()
            },
        );
        assert!(matches!(r, Err(Error::InvalidConfig { .. })));
    }

    /// The MMU notifier: an invalidated host range loses its stage-2
    /// mappings (the whole block), faults on it retry until the end, then
    /// map what backs it now.
    #[test]
    fn host_range_invalidation_unmaps_and_holds_faults() {
        let m = mmu(MmuPolicy::default());
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 4 << 20, HVA);
        m.set_memory_region(&r, 2 << 20).unwrap();
        let mut v = m.new_vcpu().unwrap();
        m.handle_fault(&mut v, GPA, true).unwrap();
        m.handle_fault(&mut v, GPA + (2 << 20), true).unwrap();
        assert_eq!(m.invalidate_hva_range_start(HVA + 0x5000, 4096), Ok(1));
        assert!(m.reader().translate(GPA).is_none(), "the whole block went");
        assert!(
            m.reader().translate(GPA + (2 << 20)).is_some(),
            "the other stayed"
        );
        assert_eq!(
            m.handle_fault(&mut v, GPA + 0x5000, true),
            Ok(FaultOutcome::Retry)
        );
        // Pages of the block outside the range map again at once.
        m.handle_fault(&mut v, GPA + 0x1000, true).unwrap();
        assert!(
            m.invalidate_hva_range_end(HVA, 4096).is_err(),
            "not that range"
        );
        m.invalidate_hva_range_end(HVA + 0x5000, 4096).unwrap();
        assert_eq!(
            m.handle_fault(&mut v, GPA + 0x5000, true),
            Ok(FaultOutcome::Slow)
        );
        assert!(matches!(
            m.invalidate_hva_range_start(HVA, 0),
            Err(Error::EmptyRange { .. })
        ));
    }

    #[test]
    fn a_vcpu_of_another_mmu_is_refused() {
        let a = mmu(MmuPolicy::default());
        let b = mmu(MmuPolicy::default());
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 1 << 20, HVA);
        b.set_memory_region(&r, 4096).unwrap();
        let mut va = a.new_vcpu().unwrap();
        assert_eq!(
            b.handle_fault(&mut va, GPA, true),
            Err(Error::ForeignVcpu { vcpu: 0 })
        );
        assert!(b.reader().translate(GPA).is_none());
    }

    /// At the soft limit a fault changes nothing and says so: no page is
    /// made writable that no ring would record.
    #[test]
    fn a_soft_full_ring_refuses_faults_before_any_change() {
        let m = mmu(MmuPolicy {
            dirty_ring_entries: Some(256),
            ..MmuPolicy::default()
        });
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 4 << 20, HVA);
        m.set_memory_region(&r, 4096).unwrap();
        let mut v = m.new_vcpu().unwrap();
        for p in 0..1024u64 {
            m.handle_fault(&mut v, GPA + p * 4096, false).unwrap();
        }
        m.enable_dirty_logging(0).unwrap();
        let mut p = 0u64;
        while !v.ring_soft_full() {
            m.handle_fault(&mut v, GPA + p * 4096, true).unwrap();
            p += 1;
        }
        assert!(m.ring_soft_full(0));
        let next = GPA + p * 4096;
        assert_eq!(
            m.handle_fault(&mut v, next, true),
            Err(Error::RingFull { vcpu: 0 })
        );
        let t = m.reader().translate(next).unwrap();
        assert!(!t.prot.contains(Prot::W), "still write-protected");
        let mut out = Vec::new();
        assert_eq!(m.harvest_rings(&mut out).unwrap(), p as usize);
        m.reset_rings().unwrap();
        assert_eq!(m.handle_fault(&mut v, next, true), Ok(FaultOutcome::Fast));
    }

    /// A real abort reports the accessed byte, not the page: the block
    /// choice must look at the page (found on QEMU's arm64, where every
    /// read of word 1 of a page mapped 4 KiB instead of 2 MiB).
    #[test]
    fn a_fault_inside_a_page_still_maps_a_block() {
        let m = mmu(MmuPolicy::default());
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 4 << 20, HVA);
        m.set_memory_region(&r, 2 << 20).unwrap();
        let mut v = m.new_vcpu().unwrap();
        m.handle_stage2_fault(&mut v, GPA + 0x1008, false, FaultKind::Translation)
            .unwrap();
        let t = m.reader().translate(GPA).unwrap();
        assert_eq!((t.size, t.pa), (2 << 20, HVA));
    }

    /// Output addresses come from the host-memory hook.
    #[test]
    fn output_addresses_come_from_the_host_memory_hook() {
        struct Offset;
        impl HostMemory for Offset {
            fn host_to_phys(&self, hva: u64, _size: u64) -> Option<u64> {
                (hva >= HVA).then(|| hva - HVA + 0x80_0000_0000)
            }
        }
        let m = mmu(MmuPolicy::default()).with_host_memory(Arc::new(Offset));
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 4 << 20, HVA);
        m.set_memory_region(&r, 4096).unwrap();
        let mut v = m.new_vcpu().unwrap();
        m.handle_fault(&mut v, GPA + 0x3000, true).unwrap();
        assert_eq!(
            m.reader().translate(GPA + 0x3010).unwrap().pa,
            0x80_0000_3010
        );
        // An unbacked host page is an error, not a mapping.
        let r = UserMemoryRegion::new(1, SlotFlags::NONE, GPA << 1, 1 << 20, 0x1000);
        m.set_memory_region(&r, 4096).unwrap();
        assert_eq!(
            m.handle_fault(&mut v, GPA << 1, true),
            Err(Error::Unbacked { hva: 0x1000 })
        );
    }

    /// A vCPU remembers the bitmap it last marked; logging turned off and on
    /// again gives the slot a new bitmap, and the marks must land there.
    #[test]
    fn marks_after_logging_is_restarted_land_in_the_new_bitmap() {
        let m = mmu(MmuPolicy {
            manual_protect: false,
            ..MmuPolicy::default()
        });
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 1 << 20, HVA);
        m.set_memory_region(&r, 4096).unwrap();
        let mut v = m.new_vcpu().unwrap();
        let mut log = vec![0u64; 4];
        for round in 0..3u64 {
            m.enable_dirty_logging(0).unwrap();
            for page in [round, round + 10] {
                // A read maps the logged page read-only, the write then takes
                // the fast path and marks it.
                m.handle_fault(&mut v, GPA + page * 4096, false).unwrap();
                assert_eq!(
                    m.handle_fault(&mut v, GPA + page * 4096, true).unwrap(),
                    FaultOutcome::Fast
                );
            }
            assert_eq!(m.get_dirty_log(0, &mut log).unwrap(), 2, "round {round}");
            assert_eq!(log[0], (1 << round) | (1 << (round + 10)));
            m.disable_dirty_logging(0).unwrap();
        }
    }

    #[test]
    fn fault_by_a_vcpu_of_another_mmu_does_not_panic() {
        let policy = MmuPolicy {
            dirty_ring_entries: Some(256),
            ..MmuPolicy::default()
        };
        let a = mmu(policy);
        let b = mmu(policy);
        let r = UserMemoryRegion::new(0, SlotFlags::NONE, GPA, 1 << 20, HVA);
        a.set_memory_region(&r, 4096).unwrap();
        a.enable_dirty_logging(0).unwrap();
        let mut own = a.new_vcpu().unwrap();
        // A read maps the logged page read-only.
        a.handle_fault(&mut own, GPA, false).unwrap();
        let _ = b.new_vcpu().unwrap();
        let mut foreign = b.new_vcpu().unwrap();
        assert_eq!(foreign.id(), 1, "no ring 1 in `a`");
        // Refused before anything changes: the page would become writable
        // with no ring of `a` to record it, and a map would draw pages
        // from `b`'s allocator.
        assert_eq!(
            a.handle_fault(&mut foreign, GPA, true),
            Err(Error::ForeignVcpu { vcpu: 1 })
        );
        assert!(!a.reader().translate(GPA).unwrap().prot.contains(Prot::W));
        assert_eq!(
            a.handle_fault(&mut foreign, GPA + 4096, false),
            Err(Error::ForeignVcpu { vcpu: 1 })
        );
    }
}
