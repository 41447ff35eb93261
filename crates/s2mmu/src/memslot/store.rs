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
    /// A [`MemslotError`] naming the first check that failed, in KVM's order, or
    /// [`MemslotError::SnapshotHeld`] when the calling thread holds a snapshot of this store
    /// (detected with `std`); the store is unchanged and `stage2` is not called.
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

/// A snapshot held by this thread, counted per thread so that an update
/// asked for by a thread holding one is refused ([`MemslotError::SnapshotHeld`])
/// instead of waiting for itself forever. With `std` only (no thread-local
/// storage without it), and not under loom, whose threads share one OS thread.
pub(crate) struct Held {
    #[cfg(all(feature = "std", not(loom)))]
    tag: Option<u64>,
    /// Not `Send`: the count belongs to the thread that took the snapshot.
    _thread: core::marker::PhantomData<*const ()>,
}

#[cfg(all(feature = "std", not(loom)))]
std::thread_local! {
    /// (store id, snapshots) of the first store this thread holds
    /// snapshots of, and the count of its snapshots of any other store.
    static HELD: core::cell::Cell<(u64, u32, u32)> = const { core::cell::Cell::new((0, 0, 0)) };
}

impl Held {
    /// Counts a snapshot of store `store_id` taken by this thread.
    #[inline]
    #[allow(unused_variables)]
    pub(crate) fn new(store_id: u64) -> Self {
        #[cfg(all(feature = "std", not(loom)))]
        {
            let tag = HELD.with(|h| {
                let (id, n, others) = h.get();
                if n == 0 || id == store_id {
                    h.set((store_id, n + 1, others));
                    Some(store_id)
                } else {
                    h.set((id, n, others + 1));
                    None
                }
            });
            Held {
                tag,
                _thread: core::marker::PhantomData,
            }
        }
        #[cfg(not(all(feature = "std", not(loom))))]
        Held {
            _thread: core::marker::PhantomData,
        }
    }
}

impl Drop for Held {
    #[inline]
    fn drop(&mut self) {
        #[cfg(all(feature = "std", not(loom)))]
        HELD.with(|h| {
            let (id, n, others) = h.get();
            match self.tag {
                Some(_) => h.set((id, n.saturating_sub(1), others)),
                None => h.set((id, n, others.saturating_sub(1))),
            }
        });
    }
}

/// Whether this thread is known to hold a snapshot of store `store_id`
/// (false where it cannot tell: without `std`, or while it holds snapshots
/// of several stores).
#[allow(unused_variables)]
pub(crate) fn held_by_this_thread(store_id: u64) -> bool {
    #[cfg(all(feature = "std", not(loom)))]
    {
        HELD.with(|h| {
            let (id, n, _) = h.get();
            n > 0 && id == store_id
        })
    }
    #[cfg(not(all(feature = "std", not(loom))))]
    false
}
