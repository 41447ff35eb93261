//! The baseline store: one sorted array, copied whole on every change and published by
//! swapping the pointer.

use std::sync::{Mutex, PoisonError};

use alloc::sync::Arc;
use arc_swap::{ArcSwap, Guard};

use super::array::ArraySet;
use super::config::MemslotConfig;
use super::error::MemslotError;
use super::invalidate::Stage2Invalidate;
use super::slot::{MemslotChange, UserMemoryRegion};
use super::store::{next_store_id, wait_for_readers, MemslotStore};
use super::validate::plan_update;

/// A reader's view of the active array.
pub struct ArraySnapshot(Guard<Arc<ArraySet>>);

impl core::ops::Deref for ArraySnapshot {
    type Target = ArraySet;
    fn deref(&self) -> &ArraySet {
        &self.0
    }
}

/// Memslots as Linux KVM had them before 5.17, behind the same interface as
/// [`super::TreeMemslots`].
pub struct ArrayMemslots {
    config: MemslotConfig,
    active: ArcSwap<ArraySet>,
    /// Serializes updates; holds the last generation published.
    updater: Mutex<u64>,
}

impl ArrayMemslots {
    /// An empty store with KVM's default limits and 4 KiB pages.
    pub fn new() -> Self {
        Self::with_config(MemslotConfig::default())
    }
}

impl ArrayMemslots {
    /// KVM's old `install_new_memslots`: publish the new array, wait for the readers of the
    /// old one (`synchronize_srcu_expedited`) and free it. Returns a handle on the array now
    /// active.
    fn install(&self, next: ArraySet) -> Arc<ArraySet> {
        let next = Arc::new(next);
        let retired = self.active.swap(Arc::clone(&next));
        wait_for_readers(&retired);
        drop(retired);
        next
    }
}

impl Default for ArrayMemslots {
    fn default() -> Self {
        Self::new()
    }
}

impl MemslotStore for ArrayMemslots {
    type Set = ArraySet;
    type Snapshot = ArraySnapshot;
    const POLICY: &'static str = "array";

    fn with_config(config: MemslotConfig) -> Self {
        Self {
            config,
            active: ArcSwap::from_pointee(ArraySet::new(next_store_id())),
            updater: Mutex::new(0),
        }
    }

    fn config(&self) -> &MemslotConfig {
        &self.config
    }

    fn snapshot(&self) -> ArraySnapshot {
        ArraySnapshot(self.active.load())
    }

    fn set_memory_region(
        &self,
        region: &UserMemoryRegion,
        stage2: &dyn Stage2Invalidate,
    ) -> Result<MemslotChange, MemslotError> {
        let mut generation = self.updater.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.active.load_full();
        let plan = plan_update(&self.config, region, &*current)?;
        let new = plan.new.map(Arc::new);
        let old = current.id_arc(plan.id).cloned();
        match plan.change {
            MemslotChange::Create | MemslotChange::FlagsOnly => {
                *generation += 1;
                let next = current.with_change(old.as_deref(), new.as_ref(), *generation);
                drop(current);
                self.install(next);
            }
            MemslotChange::Delete | MemslotChange::Move => {
                let Some(old) = old else {
                    return Err(MemslotError::NoSuchSlot { id: plan.id });
                };
                let invalid = Arc::new(old.to_invalid());
                *generation += 1;
                let with_invalid = current.with_change(Some(&old), Some(&invalid), *generation);
                drop(current);
                let with_invalid = self.install(with_invalid);
                stage2.unmap_gfn_range(old.base_gfn(), old.npages());
                *generation += 1;
                let next = with_invalid.with_change(Some(&invalid), new.as_ref(), *generation);
                drop(with_invalid);
                self.install(next);
            }
        }
        Ok(plan.change)
    }
}
