//! The memslot set of the 5.17 design: a gfn-ordered tree, an hva interval index, an id
//! map and a last-used-slot cache. Two of these (active and inactive) share `Arc<Slot>`
//! objects; see [`super::TreeMemslots`] for how they are swapped.

use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::Bound;
use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};

use super::hva_index::HvaIndex;
use super::lookup::{sealed, HvaOverlap, SlotLookup};
use super::slot::Slot;

/// One memslot set of the tree policy. Read it through a snapshot.
#[derive(Debug, Default)]
pub struct TreeSet {
    store_id: u64,
    pub(crate) generation: u64,
    /// base_gfn -> slot. Slots never overlap in gfn space, so ordering by base is enough.
    gfn_tree: BTreeMap<u64, Arc<Slot>>,
    hva_index: HvaIndex,
    /// Slot id -> slot, grown on demand (pay for the highest id in use, not the maximum).
    id_map: Vec<Option<Arc<Slot>>>,
    len: usize,
    total_pages: u64,
    /// Null, or a slot held by this set's maps (kept so by `replace`, which needs
    /// `&mut self` and so runs only while the set is unpublished).
    last_used: AtomicPtr<Slot>,
}

impl TreeSet {
    pub(crate) fn new(store_id: u64) -> Self {
        Self {
            store_id,
            ..Self::default()
        }
    }

    /// The shared slot object with this id.
    pub(crate) fn id_arc(&self, id: u16) -> Option<&Arc<Slot>> {
        self.id_map.get(usize::from(id))?.as_ref()
    }

    /// KVM's `kvm_replace_memslot`: removes `old` (if any) and inserts `new` (if any), both
    /// with the same id. A gfn-tree entry is replaced in place when the base is unchanged.
    pub(crate) fn replace(&mut self, old: Option<&Arc<Slot>>, new: Option<&Arc<Slot>>) {
        if let Some(old) = old {
            if let Some(entry) = self.id_map.get_mut(usize::from(old.id())) {
                *entry = None;
            }
            self.hva_index.remove(old);
            self.len -= 1;
            self.total_pages -= old.npages();
            let last_used = self.last_used.get_mut();
            if ptr::eq(*last_used, Arc::as_ptr(old)) {
                *last_used = new.map_or(ptr::null_mut(), |n| Arc::as_ptr(n).cast_mut());
            }
            if new.is_none_or(|n| n.base_gfn() != old.base_gfn()) {
                self.gfn_tree.remove(&old.base_gfn());
            }
        }
        let Some(new) = new else {
            return;
        };
        let index = usize::from(new.id());
        if self.id_map.len() <= index {
            self.id_map.resize(index + 1, None);
        }
        self.id_map[index] = Some(Arc::clone(new));
        self.hva_index.insert(new);
        self.gfn_tree.insert(new.base_gfn(), Arc::clone(new));
        self.len += 1;
        self.total_pages += new.npages();
    }
}

impl sealed::Sealed for TreeSet {}

impl SlotLookup for TreeSet {
    fn store_id(&self) -> u64 {
        self.store_id
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn len(&self) -> usize {
        self.len
    }

    fn total_pages(&self) -> u64 {
        self.total_pages
    }

    fn id_to_slot(&self, id: u16) -> Option<&Slot> {
        self.id_arc(id).map(|slot| &**slot)
    }

    fn search(&self, gfn: u64) -> Option<&Slot> {
        let (_, slot) = self.gfn_tree.range(..=gfn).next_back()?;
        slot.contains(gfn).then_some(&**slot)
    }

    fn gfn_to_slot(&self, gfn: u64) -> Option<&Slot> {
        let cached = self.last_used.load(Ordering::Relaxed);
        if !cached.is_null() {
            // SAFETY: `last_used` is null or points to a slot this set holds an `Arc` to
            // (see the field); the set cannot change while `&self` is borrowed. Relaxed is
            // enough: the slot was initialised before the set was published to this reader.
            let slot = unsafe { &*cached };
            if slot.contains(gfn) {
                return Some(slot);
            }
        }
        let slot = self.search(gfn)?;
        self.last_used
            .store(ptr::from_ref(slot).cast_mut(), Ordering::Relaxed);
        Some(slot)
    }

    fn gfn_to_slot_approx(&self, gfn: u64) -> Option<&Slot> {
        match self.gfn_tree.range(..=gfn).next_back() {
            Some((_, slot)) => Some(slot),
            None => self.gfn_tree.first_key_value().map(|(_, slot)| &**slot),
        }
    }

    fn for_each_in_gfn_range<'a, F: FnMut(&'a Slot)>(&'a self, start: u64, end: u64, mut f: F) {
        if start >= end {
            return;
        }
        if let Some((_, slot)) = self.gfn_tree.range(..=start).next_back() {
            if slot.end_gfn() > start {
                f(slot);
            }
        }
        let rest = (Bound::Excluded(start), Bound::Excluded(end));
        for (_, slot) in self.gfn_tree.range(rest) {
            f(slot);
        }
    }

    fn for_each_in_hva_range<'a, F: FnMut(HvaOverlap<'a>)>(
        &'a self,
        start: u64,
        end: u64,
        mut f: F,
    ) {
        if start >= end {
            return;
        }
        self.hva_index.for_each_overlap(start, end - 1, |slot| {
            f(HvaOverlap::clamp(slot, start, end))
        });
    }
}
