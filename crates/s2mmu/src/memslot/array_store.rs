//! The baseline store: one sorted array, copied whole on every change and published by
//! swapping the pointer.

use alloc::sync::Arc;

use crate::sync::{wait_for_readers, ArcCell, DefaultPlatform, Mutex, Platform};

use super::array::ArraySet;
use super::config::MemslotConfig;
use super::error::MemslotError;
use super::invalidate::Stage2Invalidate;
use super::lookup::SlotLookup as _;
use super::slot::{MemslotChange, UserMemoryRegion};
use super::store::{held_by_this_thread, next_store_id, Held, MemslotStore};
use super::validate::plan_update;

/// A reader's view of the active array.
pub struct ArraySnapshot<P: Platform = DefaultPlatform>(
    <P::Cell<ArraySet> as ArcCell<ArraySet>>::Guard,
    // Counts the snapshot for its thread while it lives (read by its drop).
    #[allow(dead_code)] Held,
);

impl<P: Platform> core::ops::Deref for ArraySnapshot<P> {
    type Target = ArraySet;
    fn deref(&self) -> &ArraySet {
        &self.0
    }
}

/// Memslots as Linux KVM had them before 5.17, behind the same interface as
/// [`super::TreeMemslots`].
pub struct ArrayMemslots<P: Platform = DefaultPlatform> {
    config: MemslotConfig,
    active: P::Cell<ArraySet>,
    /// Serializes updates; holds the last generation published.
    updater: Mutex<P, u64>,
}

impl ArrayMemslots {
    /// An empty store on the default platform with KVM's default limits and 4 KiB pages.
    pub fn new() -> Self {
        Self::with_config(MemslotConfig::default())
    }

    /// An empty store on the default platform with `config`'s limits (the
    /// store of another platform: [`MemslotStore::with_config`]).
    pub fn with_config(config: MemslotConfig) -> Self {
        <Self as MemslotStore>::with_config(config)
    }
}

impl<P: Platform> ArrayMemslots<P> {
    /// KVM's old `install_new_memslots`: publish the new array, wait for the readers of the
    /// old one (`synchronize_srcu_expedited`) and free it. Returns a handle on the array now
    /// active.
    fn install(&self, next: ArraySet) -> Arc<ArraySet> {
        let next = Arc::new(next);
        let retired = self.active.swap(Arc::clone(&next));
        wait_for_readers::<P, _>(&retired);
        drop(retired);
        next
    }
}

impl<P: Platform> Default for ArrayMemslots<P> {
    fn default() -> Self {
        <Self as MemslotStore>::with_config(MemslotConfig::default())
    }
}

impl<P: Platform> MemslotStore for ArrayMemslots<P> {
    type Set = ArraySet;
    type Snapshot = ArraySnapshot<P>;
    const POLICY: &'static str = "array";

    fn with_config(config: MemslotConfig) -> Self {
        Self {
            config,
            active: ArcCell::new(Arc::new(ArraySet::new(next_store_id()))),
            updater: lock_api::Mutex::new(0),
        }
    }

    fn config(&self) -> &MemslotConfig {
        &self.config
    }

    fn snapshot(&self) -> ArraySnapshot<P> {
        let guard = self.active.load();
        let held = Held::new(guard.store_id());
        ArraySnapshot(guard, held)
    }

    fn set_memory_region(
        &self,
        region: &UserMemoryRegion,
        stage2: &dyn Stage2Invalidate,
    ) -> Result<MemslotChange, MemslotError> {
        let mut generation = self.updater.lock();
        let current = self.active.load_full();
        if held_by_this_thread(current.store_id()) {
            return Err(MemslotError::SnapshotHeld);
        }
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
