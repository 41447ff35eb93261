//! The 5.17 store: two tree sets, active and inactive, sharing slot objects. Every change
//! is applied to the inactive set, published by swapping, and then replayed on the set
//! that was retired once its readers are gone, so both sets end up equal again.

use alloc::sync::Arc;

use crate::sync::{wait_for_readers, ArcCell, DefaultPlatform, Mutex, Platform};

use super::config::MemslotConfig;
use super::error::MemslotError;
use super::invalidate::Stage2Invalidate;
use super::lookup::SlotLookup;
use super::slot::{MemslotChange, Slot, UserMemoryRegion};
use super::store::{held_by_this_thread, next_store_id, Held, MemslotStore};
use super::tree::TreeSet;
use super::validate::plan_update;

/// A reader's view of the active tree set.
pub struct TreeSnapshot<P: Platform = DefaultPlatform>(
    <P::Cell<TreeSet> as ArcCell<TreeSet>>::Guard,
    // Counts the snapshot for its thread while it lives (read by its drop).
    #[allow(dead_code)] Held,
);

impl<P: Platform> core::ops::Deref for TreeSnapshot<P> {
    type Target = TreeSet;
    fn deref(&self) -> &TreeSet {
        &self.0
    }
}

/// What only the updater touches.
struct TreeUpdater {
    /// The set no reader can see, and the only handle on it between updates (so
    /// `Arc::make_mut` on it never copies). Equal to the active one between updates.
    inactive: Arc<TreeSet>,
    generation: u64,
}

/// Memslots as Linux KVM has them since 5.17. See the module documentation.
pub struct TreeMemslots<P: Platform = DefaultPlatform> {
    config: MemslotConfig,
    active: P::Cell<TreeSet>,
    updater: Mutex<P, TreeUpdater>,
}

impl TreeMemslots {
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

impl<P: Platform> TreeMemslots<P> {
    /// KVM's `kvm_swap_active_memslots`: publishes the inactive set with a new generation,
    /// waits for the readers of the set it replaces, and makes that one the inactive set.
    fn swap_active(&self, updater: &mut TreeUpdater) {
        updater.generation += 1;
        Arc::make_mut(&mut updater.inactive).generation = updater.generation;
        updater.inactive = self.active.swap(Arc::clone(&updater.inactive));
        wait_for_readers::<P, _>(&updater.inactive);
    }

    /// KVM's `kvm_activate_memslot` after a `kvm_replace_memslot` on the inactive set.
    fn replace_and_activate(
        &self,
        updater: &mut TreeUpdater,
        old: Option<&Arc<Slot>>,
        new: Option<&Arc<Slot>>,
    ) {
        Arc::make_mut(&mut updater.inactive).replace(old, new);
        self.swap_active(updater);
        Arc::make_mut(&mut updater.inactive).replace(old, new);
    }
}

impl<P: Platform> Default for TreeMemslots<P> {
    fn default() -> Self {
        <Self as MemslotStore>::with_config(MemslotConfig::default())
    }
}

impl<P: Platform> MemslotStore for TreeMemslots<P> {
    type Set = TreeSet;
    type Snapshot = TreeSnapshot<P>;
    const POLICY: &'static str = "tree";

    fn with_config(config: MemslotConfig) -> Self {
        let store_id = next_store_id();
        Self {
            config,
            active: ArcCell::new(Arc::new(TreeSet::new(store_id))),
            updater: lock_api::Mutex::new(TreeUpdater {
                inactive: Arc::new(TreeSet::new(store_id)),
                generation: 0,
            }),
        }
    }

    fn config(&self) -> &MemslotConfig {
        &self.config
    }

    fn snapshot(&self) -> TreeSnapshot<P> {
        let guard = self.active.load();
        let held = Held::new(guard.store_id());
        TreeSnapshot(guard, held)
    }

    fn set_memory_region(
        &self,
        region: &UserMemoryRegion,
        stage2: &dyn Stage2Invalidate,
    ) -> Result<MemslotChange, MemslotError> {
        // Every step below completes or does not start, so a panic elsewhere cannot leave
        // the sets half-updated for the next updater (the platform's locks do not poison).
        let mut guard = self.updater.lock();
        let updater = &mut *guard;
        if held_by_this_thread(updater.inactive.store_id()) {
            return Err(MemslotError::SnapshotHeld);
        }
        // Between updates the inactive set equals the active one; validating against it
        // avoids holding a snapshot of the set about to be retired.
        let plan = plan_update(&self.config, region, &*updater.inactive)?;
        let new = plan.new.map(Arc::new);
        let old = updater.inactive.id_arc(plan.id).cloned();
        match plan.change {
            MemslotChange::Create | MemslotChange::FlagsOnly => {
                self.replace_and_activate(updater, old.as_ref(), new.as_ref());
            }
            MemslotChange::Delete | MemslotChange::Move => {
                let Some(old) = old else {
                    // plan_update only classifies an existing slot as a delete or move.
                    return Err(MemslotError::NoSuchSlot { id: plan.id });
                };
                // Publish the stand-in so no vCPU can map the old range any more; the set
                // retired by the swap still holds `old`.
                let invalid = Arc::new(old.to_invalid());
                Arc::make_mut(&mut updater.inactive).replace(Some(&old), Some(&invalid));
                self.swap_active(updater);
                stage2.unmap_gfn_range(old.base_gfn(), old.npages());
                Arc::make_mut(&mut updater.inactive).replace(Some(&old), new.as_ref());
                self.swap_active(updater);
                Arc::make_mut(&mut updater.inactive).replace(Some(&invalid), new.as_ref());
            }
        }
        debug_assert_eq!(updater.inactive.len(), self.active.load().len());
        Ok(plan.change)
    }
}
