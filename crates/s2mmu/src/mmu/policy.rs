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
    /// Eager split when logging starts, with this chunk size in bytes, a
    /// multiple of the page size up to [`MAX_EAGER_SPLIT_CHUNK`] (the lock
    /// is dropped and the page cache topped up between chunks);
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
    /// How dirty pages are tracked while a slot logs.
    pub dirty: DirtyMode,
    /// With [`DirtyMode::Hardware`]: split huge mappings when logging
    /// starts, or log them as whole blocks.
    pub hw_dirty_blocks: HwDirtyBlocks,
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
    /// rwlock for every reader. At most [`MAX_VCPUS`].
    pub reader_slots: usize,
}

/// How dirty pages are tracked while a slot logs: one policy, one value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DirtyMode {
    /// Write protection; the first write to a page after a harvest faults
    /// and marks the slot's bitmap (`KVM_GET_DIRTY_LOG`, and
    /// `KVM_CLEAR_DIRTY_LOG` with manual protect).
    #[default]
    Bitmap,
    /// Write protection; the fault pushes the page to the vCPU's ring of
    /// this many entries (`KVM_CAP_DIRTY_LOG_RING`: a power of two,
    /// 256..=65536).
    Ring {
        /// Entries per vCPU ring.
        entries: u32,
    },
    /// Hardware dirty state ([`crate::HwDirtyBits`]: arm64 FEAT_HAFDBS, DBM
    /// with VTCR_EL2.HD; x86 EPT accessed/dirty flags): a logged page is
    /// left tracked and clean instead of write-protected, the
    /// hardware records the first write in the leaf without a fault, and a
    /// GET scans the slot's leaves into its bitmap; protecting (CLEAR, or
    /// GET without manual protect) cleans them again. Needs a format with a
    /// hardware dirty state; huge mappings are split when logging starts
    /// (eager split, whatever its chunk policy says, in 1 GiB chunks if it
    /// says none). The hypervisor must turn the hardware's updates on
    /// (arm64: VTCR_EL2.HA and HD; EPT: the EPTP's A/D flag).
    Hardware,
    /// Hardware dirty state with x86 Page-Modification Logging ([`PmlLog`],
    /// Intel SDM 29.3.6): as [`DirtyMode::Hardware`] (logged leaves tracked
    /// and clean, no write fault, protection cleans the dirty flags of the
    /// pages harvested), but the CPU also appends each page whose dirty flag
    /// it sets to its vCPU's 512-entry log, and a GET flushes those logs
    /// into the slots' bitmaps instead of scanning the leaves. A full log
    /// exits to [`Mmu::flush_pml`]. Logs drain into bitmaps only (KVM can
    /// also drain them into dirty rings; this mode is a bitmap mode). A mode
    /// of its own rather than a flag beside `Hardware`, so the policy stays
    /// one value per choice: PML without hardware dirty flags does not
    /// exist. On arm64 the nearest equivalent is FEAT_HDBSS (Armv9.5), which
    /// the simulated arm64 walker also runs as this mode.
    Pml,
}

impl DirtyMode {
    /// The ring size, for [`DirtyMode::Ring`].
    pub const fn ring_entries(self) -> Option<u32> {
        match self {
            DirtyMode::Ring { entries } => Some(entries),
            _ => None,
        }
    }

    /// Whether the hardware records writes in the leaves
    /// ([`DirtyMode::Hardware`], [`DirtyMode::Pml`]).
    pub const fn hardware(self) -> bool {
        matches!(self, DirtyMode::Hardware | DirtyMode::Pml)
    }

    /// Whether the hardware also logs the pages it dirties
    /// ([`DirtyMode::Pml`]).
    pub const fn pml(self) -> bool {
        matches!(self, DirtyMode::Pml)
    }

    /// Whether slots keep bitmaps (every mode but rings).
    pub const fn bitmaps(self) -> bool {
        !matches!(self, DirtyMode::Ring { .. })
    }
}

/// What happens to huge mappings (blocks) of a slot that starts logging
/// with hardware dirty state: the trade-off between the split's cost and
/// the log's resolution.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HwDirtyBlocks {
    /// Split them into pages first (eager split, in the chunks
    /// [`MmuPolicy::eager_split_chunk`] says, 1 GiB if it says none), so
    /// the hardware dirties and the harvest reports single pages: what KVM
    /// does (x86 maps no huge page in a logged slot; the arm64 DBM series
    /// splits before it relies on DBM).
    #[default]
    SplitFirst,
    /// Leave them: a block is tracked and cleaned as one leaf, the
    /// hardware's first write to it dirties the whole block, and the
    /// harvest reports every page of it. No split when logging starts (nor
    /// on CLEAR with initially-set bitmaps), at the price of reporting (and
    /// a migration copying) up to a block's worth of pages per write. Not
    /// with [`DirtyMode::Pml`]: PML logs the 4 KiB page written, not the
    /// block whose dirty flag the write set, so the block's other pages
    /// would be written unlogged ([`Mmu::new`] refuses it).
    LogWholeBlocks,
}

/// The default eager-split chunk, 1 GiB: split, then drop the MMU lock and
/// top the page cache up, once per chunk (KVM's
/// `eager_split_chunk_size` default is a 2 MiB block's worth; arm64 uses
/// the chunk size userspace sets, QEMU 1 GiB).
pub const EAGER_SPLIT_CHUNK: u64 = 1 << 30;

/// The largest eager-split chunk [`Mmu::new`] accepts, 1 GiB: a chunk's
/// split is done under one hold of the MMU write lock with the table pages
/// topped up for it first, so the chunk bounds both the lock hold and that
/// allocation (KVM arm64 accepts block sizes only, 1 GiB at most with 4 KiB
/// pages).
pub const MAX_EAGER_SPLIT_CHUNK: u64 = 1 << 30;

/// The most vCPUs an [`Mmu`] may have ([`Mmu::new_vcpu`]) and the most
/// reader slots its lock may have ([`MmuPolicy::reader_slots`]): x86 KVM's
/// `KVM_MAX_VCPUS`.
pub const MAX_VCPUS: usize = 4096;

/// Bytes write-protected or cleared per hold of the MMU write lock (QEMU's
/// default clear chunk is the same size).
pub const LOCK_CHUNK: u64 = 1 << 30;

/// With hardware dirty state, a CLEAR cleans a last-level table's worth of
/// bitmap words in one masked walk when they hold more than this many runs
/// of set bits, and by a walk per run otherwise ([`Mmu::with_sparse_clear_runs`]).
/// 1: `s2mmu harvest-perf --size 16G --sparse-clear-runs 0`, which times both
/// in one process, had the masked walk at about 1.1 times the walk per run
/// with one run per table (`--dirty-every 512`) and 0.6 to 0.8 times with
/// 2 to 8 (`--dirty-every 256`, `128`, `64`).
pub const SPARSE_CLEAR_RUNS: u32 = 1;

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
            dirty: DirtyMode::Bitmap,
            hw_dirty_blocks: HwDirtyBlocks::SplitFirst,
            recover_huge_pages: true,
            recover_in_place: false,
            reader_slots: 256,
        }
    }
}

impl MmuPolicy {
    /// Whether logging splits huge mappings (eagerly, or on a write fault
    /// or CLEAR): every mode but hardware dirty state logging whole blocks.
    pub const fn splits_for_logging(&self) -> bool {
        !(self.dirty.hardware() && matches!(self.hw_dirty_blocks, HwDirtyBlocks::LogWholeBlocks))
    }

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
