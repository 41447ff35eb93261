//! The memslot set of the pre-5.17 design, kept as the baseline policy: a gfn-sorted array
//! that every change copies whole, searched by binary search on gfn and by a linear scan
//! on hva.

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering};

use super::config::KVM_MEM_SLOTS_NUM;
use super::lookup::{nonempty, sealed, HvaOverlap, SlotLookup};
use super::slot::Slot;
use crate::addr::{Gfn, Hva};

/// One array element: the search keys inline (as KVM kept whole slot structs in its
/// array), plus the shared slot object.
#[derive(Clone, Debug)]
struct ArrayEntry {
    base_gfn: u64,
    end_gfn: u64,
    hva_start: u64,
    hva_end: u64,
    slot: Arc<Slot>,
}

impl ArrayEntry {
    fn new(slot: &Arc<Slot>) -> Self {
        Self {
            base_gfn: slot.base_gfn().raw(),
            end_gfn: slot.end_gfn().raw(),
            hva_start: slot.userspace_addr().raw(),
            hva_end: slot.hva_end().raw(),
            slot: Arc::clone(slot),
        }
    }
}

/// `id_to_index` value of an id without a slot (KVM used -1 in its `short` array).
const NO_INDEX: u16 = u16::MAX;

/// One memslot state of the array policy. Immutable once built; read it through a snapshot.
#[derive(Debug)]
pub struct ArraySet {
    store_id: u64,
    generation: u64,
    /// Sorted by ascending base_gfn.
    entries: Vec<ArrayEntry>,
    /// Slot id -> index in `entries`: KVM's `short id_to_index[KVM_MEM_SLOTS_NUM]`, which
    /// 5.12-5.16 kernels embedded in `struct kvm_memslots` and so copied whole (64 KiB) with
    /// every change, however few slots were in use. The "pay for what you use" goal of the
    /// tree design is measured against exactly this cost.
    id_to_index: Vec<u16>,
    total_pages: u64,
    /// Index of the last slot found by `gfn_to_slot` (KVM's `lru_slot`), or `usize::MAX`.
    last_used: AtomicUsize,
}

impl ArraySet {
    pub(crate) fn new(store_id: u64) -> Self {
        Self {
            store_id,
            generation: 0,
            entries: Vec::new(),
            id_to_index: vec![NO_INDEX; usize::from(KVM_MEM_SLOTS_NUM)],
            total_pages: 0,
            last_used: AtomicUsize::new(usize::MAX),
        }
    }

    /// The shared slot object with this id.
    pub(crate) fn id_arc(&self, id: u16) -> Option<&Arc<Slot>> {
        let index = *self.id_to_index.get(usize::from(id))?;
        self.entries.get(index as usize).map(|entry| &entry.slot)
    }

    /// A copy of this set with `old` (by id) removed and `new` inserted in gfn order: the
    /// whole-array copy that every change of the old design paid.
    pub(crate) fn with_change(
        &self,
        old: Option<&Slot>,
        new: Option<&Arc<Slot>>,
        generation: u64,
    ) -> Self {
        let mut entries = Vec::with_capacity(self.entries.len() + 1);
        entries.extend_from_slice(&self.entries);
        let mut total_pages = self.total_pages;
        if let Some(old) = old {
            if let Some(&index) = self.id_to_index.get(usize::from(old.id())) {
                if index != NO_INDEX {
                    entries.remove(index as usize);
                    total_pages -= old.npages();
                }
            }
        }
        if let Some(new) = new {
            let at = entries.partition_point(|entry| entry.base_gfn < new.base_gfn().raw());
            entries.insert(at, ArrayEntry::new(new));
            total_pages += new.npages();
        }
        // The copy of the whole array struct, then the index fix-up of `update_memslots`.
        let mut id_to_index = self.id_to_index.clone();
        if let Some(old) = old {
            if let Some(index) = id_to_index.get_mut(usize::from(old.id())) {
                *index = NO_INDEX;
            }
        }
        for (index, entry) in entries.iter().enumerate() {
            if let Some(slot) = id_to_index.get_mut(usize::from(entry.slot.id())) {
                // Fits: at most KVM_MEM_SLOTS_NUM (< u16::MAX) entries exist.
                *slot = index as u16;
            }
        }
        Self {
            store_id: self.store_id,
            generation,
            entries,
            id_to_index,
            total_pages,
            last_used: AtomicUsize::new(usize::MAX),
        }
    }

    fn search_index(&self, gfn: u64) -> Option<usize> {
        let after = self.entries.partition_point(|entry| entry.base_gfn <= gfn);
        let index = after.checked_sub(1)?;
        (gfn < self.entries[index].end_gfn).then_some(index)
    }
}

impl sealed::Sealed for ArraySet {
    fn search_with_range(&self, gfn: u64) -> Option<(&Slot, u64, u64)> {
        let entry = &self.entries[self.search_index(gfn)?];
        Some((&*entry.slot, entry.base_gfn, entry.end_gfn))
    }
}

impl SlotLookup for ArraySet {
    fn store_id(&self) -> u64 {
        self.store_id
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn total_pages(&self) -> u64 {
        self.total_pages
    }

    fn id_to_slot(&self, id: u16) -> Option<&Slot> {
        self.id_arc(id).map(|slot| &**slot)
    }

    fn search(&self, gfn: Gfn) -> Option<&Slot> {
        let gfn = gfn.raw();
        self.search_index(gfn)
            .map(|index| &*self.entries[index].slot)
    }

    fn gfn_to_slot(&self, gfn: Gfn) -> Option<&Slot> {
        let gfn = gfn.raw();
        let cached = self.last_used.load(Ordering::Relaxed);
        if let Some(entry) = self.entries.get(cached) {
            if gfn >= entry.base_gfn && gfn < entry.end_gfn {
                return Some(&entry.slot);
            }
        }
        let index = self.search_index(gfn)?;
        self.last_used.store(index, Ordering::Relaxed);
        Some(&self.entries[index].slot)
    }

    fn gfn_to_slot_approx(&self, gfn: Gfn) -> Option<&Slot> {
        let gfn = gfn.raw();
        let after = self.entries.partition_point(|entry| entry.base_gfn <= gfn);
        let index = after.saturating_sub(1);
        self.entries.get(index).map(|entry| &*entry.slot)
    }

    fn for_each_in_gfn_range<'a, F: FnMut(&'a Slot)>(&'a self, start: Gfn, end: Gfn, mut f: F) {
        let Some((start, end)) = nonempty(start.raw(), end.raw()) else {
            return;
        };
        let first = self.entries.partition_point(|entry| entry.end_gfn <= start);
        for entry in &self.entries[first..] {
            if entry.base_gfn >= end {
                break;
            }
            f(&entry.slot);
        }
    }

    fn for_each_in_hva_range<'a, F: FnMut(HvaOverlap<'a>)>(
        &'a self,
        start: Hva,
        end: Hva,
        mut f: F,
    ) {
        let Some((start, end)) = nonempty(start.raw(), end.raw()) else {
            return;
        };
        for entry in &self.entries {
            if entry.hva_start < end && start < entry.hva_end {
                f(HvaOverlap::clamp(&entry.slot, start, end));
            }
        }
    }
}
