//! The switchable policies of an [`Mmu`]: every seed's optimisation and
//! its baseline, one typed field each.

use super::*;

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
    /// With `recover_huge_pages`: collapse the page tables back into blocks
    /// in place (KVM x86 since 6.13) instead of unmapping them for faults to
    /// map blocks again, so the guest takes no fault for its huge pages.
    pub recover_in_place: bool,
    /// vCPUs (by index) whose fault-path reads of the MMU lock go through
    /// a reader slot of their own while no writer is around ([`lock`]),
    /// instead of the rwlock's shared reader count; 0 keeps KVM's plain
    /// rwlock for every reader.
    pub reader_slots: usize,
}

/// The default eager-split chunk, 1 GiB: split, then drop the MMU lock and
/// top the page cache up, once per chunk (KVM's
/// `eager_split_chunk_size` default is a 2 MiB block's worth; arm64 uses
/// the chunk size userspace sets, QEMU 1 GiB).
pub const EAGER_SPLIT_CHUNK: u64 = 1 << 30;

/// Bytes write-protected or cleared per hold of the MMU write lock (QEMU's
/// default clear chunk is the same size).
pub const LOCK_CHUNK: u64 = 1 << 30;

impl Default for MmuPolicy {
    fn default() -> Self {
        MmuPolicy {
            fault_path: FaultPath::ReadLockFastPath,
            eager_split_chunk: Some(EAGER_SPLIT_CHUNK),
            split_walk: SplitPolicy::SkipReturns,
            tlb_large_range: LargeRangePolicy::WholeVmid,
            tlb_limit_pages: TlbPolicy::DEFAULT_LIMIT_PAGES,
            manual_protect: true,
            initially_set: false,
            dirty_ring_entries: None,
            hw_dirty: false,
            recover_huge_pages: true,
            recover_in_place: false,
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
