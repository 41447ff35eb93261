//! The interface both memslot policies implement, and what their publication shares.

use core::ops::Deref;
use core::sync::atomic::{AtomicU64, Ordering};

use super::config::MemslotConfig;
use super::error::MemslotError;
use super::invalidate::Stage2Invalidate;
use super::lookup::SlotLookup;
use super::slot::{MemslotChange, UserMemoryRegion};

/// A VM's memslots: updated by one writer at a time (KVM's `slots_lock`), read by any
/// number of vCPU threads through lock-free snapshots.
pub trait MemslotStore: Send + Sync {
    /// The published state that snapshots dereference to.
    type Set: SlotLookup;
    /// A reader's handle on the active state. Hold it briefly, as an SRCU read section:
    /// updates wait for readers of the state they retire, so a thread must not hold a
    /// snapshot while it updates the same store.
    type Snapshot: Deref<Target = Self::Set>;

    /// Short name of the policy, as benchmarks print it (`"tree"`, `"array"`).
    const POLICY: &'static str;

    /// An empty store.
    fn with_config(config: MemslotConfig) -> Self
    where
        Self: Sized;

    /// The limits it was made with.
    fn config(&self) -> &MemslotConfig;

    /// The active state, without locking. It stays the same state however long it is held.
    fn snapshot(&self) -> Self::Snapshot;

    /// KVM's `KVM_SET_USER_MEMORY_REGION`: create, delete, move or change the flags of one
    /// slot. A delete or move first publishes an `INVALID` stand-in of the slot, waits for
    /// the readers of the earlier state, calls `stage2.unmap_gfn_range` on the old range,
    /// and only then publishes the new state.
    ///
    /// # Errors
    /// A [`MemslotError`] naming the first check that failed, in KVM's order; the store is
    /// unchanged and `stage2` is not called.
    fn set_memory_region(
        &self,
        region: &UserMemoryRegion,
        stage2: &dyn Stage2Invalidate,
    ) -> Result<MemslotChange, MemslotError>;
}

static NEXT_STORE_ID: AtomicU64 = AtomicU64::new(1);

/// A process-unique store identity (never 0, which marks an unused vCPU cache).
pub(crate) fn next_store_id() -> u64 {
    NEXT_STORE_ID.fetch_add(1, Ordering::Relaxed)
}
