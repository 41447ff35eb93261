//! What an [`Mmu`](super::Mmu) hands out and answers with: a vCPU's state in
//! the MMU ([`VcpuMmu`]), what the hardware reports about a fault and what
//! the fault did ([`FaultKind`], [`FaultOutcome`]), an open dirty view
//! ([`DirtyView`]), and what resolves a fault on a page that is not on this
//! host yet ([`PageFetch`]).

use super::stats::FaultStats;
use super::strategy::PmlLog;
use crate::dirty::{DirtyBitmap, DirtyRing};
use crate::memcache::PageCache;
use crate::memslot::VcpuSlotCache;
use crate::table::MmOps;
use alloc::string::String;
use alloc::sync::Arc;

/// Where a stage-2 translation fault on a page that is not on this host
/// yet is resolved: post-copy migration's page request. The vCPU that
/// faults calls it before the engine maps the page, outside guest mode,
/// and only that vCPU waits; the others run on. One trait for every VM
/// that takes pages late: the migration session implements it, the VMs
/// (simulated, arm64) call it.
pub trait PageFetch: Send + Sync {
    /// Returns once the page at `gpa` is in guest memory: at once when it
    /// is already there, otherwise after asking for it and waiting for it.
    /// `vcpu` is the faulting vCPU's index. Returns whether it had to wait
    /// (a remote fault).
    ///
    /// # Errors
    /// A reason when the page cannot be had (the connection to its source
    /// broke); the vCPU then cannot go on.
    fn fetch(&self, vcpu: usize, gpa: u64) -> Result<bool, String>;
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
    pub(super) id: usize,
    /// The [`Mmu`](super::Mmu) that made it ([`Mmu::new_vcpu`](super::Mmu::new_vcpu)): a handle is used only
    /// with its own MMU, whose reader slot and ring it owns.
    pub(super) mmu_id: u64,
    /// Its dirty ring, when the VM logs to rings (read without the ring
    /// list's lock on every fault).
    pub(super) ring: Option<Arc<DirtyRing>>,
    pub(super) lock_slot: Option<usize>,
    /// The dirty bitmap of the slot this vCPU last marked, for the memslot
    /// state (store id, generation) and slot id it was read in: within one
    /// state a logging slot's bitmap never changes, so marking needs no
    /// atomic load of the side table (KVM reads `memslot->dirty_bitmap`).
    pub(super) dirty_cache: Option<((u64, u64), u16, Arc<DirtyBitmap>)>,
    pub(super) slot_cache: VcpuSlotCache,
    pub(super) cache: PageCache<M>,
    /// Its page-modification log, with [`DirtyMode::Pml`](super::DirtyMode::Pml).
    pub(super) pml: Option<Arc<PmlLog>>,
    /// Counters of this vCPU's faults.
    pub stats: FaultStats,
}

impl<M: MmOps> VcpuMmu<M> {
    /// The vCPU's index.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Whether the vCPU's dirty ring is soft-full: its faults are refused
    /// with [`Error::RingFull`](crate::Error::RingFull) until the rings are harvested and reset
    /// (read without a lock, for a vCPU loop's check before entering the
    /// guest).
    pub fn ring_soft_full(&self) -> bool {
        self.ring.as_ref().is_some_and(|r| r.soft_full())
    }

    /// Its page-modification log, where the VM tracks dirty pages with
    /// [`DirtyMode::Pml`](super::DirtyMode::Pml): the simulated CPU writes through it
    /// ([`PmlLog::hw_write`]).
    pub fn pml(&self) -> Option<&Arc<PmlLog>> {
        self.pml.as_ref()
    }
}

/// An open dirty view of a slot, from [`Mmu::open_dirty_view`](super::Mmu::open_dirty_view). Ids are
/// never reused within an MMU, so a closed view's id stays unknown; the
/// handle also names its MMU, which alone accepts it (ids of different
/// MMUs overlap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DirtyView {
    /// The id of the MMU that opened it.
    pub(super) mmu: u64,
    pub(super) id: u64,
}

impl DirtyView {
    /// The view's id (unique within its MMU).
    pub fn id(self) -> u64 {
        self.id
    }
}
