//! The memslot set of the 5.17 design: a gfn-ordered tree, an hva interval index, an id
//! map and a last-used-slot cache. Two of these (active and inactive) share `Arc<Slot>`
//! objects; see [`super::TreeMemslots`] for how they are swapped.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ptr;
use core::sync::atomic::{AtomicPtr, Ordering};

use super::hva_index::HvaIndex;
use super::lookup::{nonempty, sealed, HvaOverlap, SlotLookup};
use super::slot::Slot;
use super::sorted_map::SortedMap;
use crate::addr::{Gfn, Hva};

/// A gfn-tree entry: the slot's end kept beside it, so a search decides a hit or a miss
/// without touching the slot.
#[derive(Clone, Debug)]
struct GfnEntry {
    end_gfn: u64,
    slot: Arc<Slot>,
}

/// One memslot set of the tree policy. Read it through a snapshot.
#[derive(Debug, Default)]
pub struct TreeSet {
    store_id: u64,
    pub(crate) generation: u64,
    /// base_gfn -> slot. Slots never overlap in gfn space, so ordering by base is enough.
    gfn_tree: SortedMap<u64, GfnEntry>,
    hva_index: HvaIndex,
    /// Slot id -> slot, grown on demand (pay for the highest id in use, not the maximum).
    id_map: Vec<Option<Arc<Slot>>>,
    len: usize,
    total_pages: u64,
    /// Null, or a slot held by this set's maps (kept so by `replace`, which needs
    /// `&mut self` and so runs only while the set is unpublished).
    last_used: AtomicPtr<Slot>,
}

/// Needed by `Arc::make_mut`, which copies only if a reader still held the set; the store
/// waits for readers first, so this runs only if that promise were broken.
impl Clone for TreeSet {
    fn clone(&self) -> Self {
        Self {
            store_id: self.store_id,
            generation: self.generation,
            gfn_tree: self.gfn_tree.clone(),
            hva_index: self.hva_index.clone(),
            id_map: self.id_map.clone(),
            len: self.len,
            total_pages: self.total_pages,
            last_used: AtomicPtr::new(self.last_used.load(Ordering::Relaxed)),
        }
    }
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
            if new.is_none_or(|n| n.base_gfn().raw() != old.base_gfn().raw()) {
                self.gfn_tree.remove(&old.base_gfn().raw());
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
        let entry = GfnEntry {
            end_gfn: new.end_gfn().raw(),
            slot: Arc::clone(new),
        };
        self.gfn_tree.insert(new.base_gfn().raw(), entry);
        self.len += 1;
        self.total_pages += new.npages();
    }
}

impl sealed::Sealed for TreeSet {
    fn search_with_range(&self, gfn: u64) -> Option<(&Slot, u64, u64)> {
        let (&base_gfn, entry) = self.gfn_tree.get_le(&gfn)?;
        (gfn < entry.end_gfn).then_some((&*entry.slot, base_gfn, entry.end_gfn))
    }
}

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

    fn search(&self, gfn: Gfn) -> Option<&Slot> {
        let gfn = gfn.raw();
        sealed::Sealed::search_with_range(self, gfn).map(|(slot, _, _)| slot)
    }

    fn gfn_to_slot(&self, gfn: Gfn) -> Option<&Slot> {
        let gfn = gfn.raw();
        let cached = self.last_used.load(Ordering::Relaxed);
        if !cached.is_null() {
            // SAFETY: `last_used` is null or points to a slot this set holds an `Arc` to
            // (see the field); the set cannot change while `&self` is borrowed. Relaxed is
            // enough: the slot was initialised before the set was published to this reader.
            let slot = unsafe { &*cached };
            if slot.contains(Gfn::new(gfn)) {
                return Some(slot);
            }
        }
        let slot = self.search(Gfn::new(gfn))?;
        self.last_used
            .store(ptr::from_ref(slot).cast_mut(), Ordering::Relaxed);
        Some(slot)
    }

    fn gfn_to_slot_approx(&self, gfn: Gfn) -> Option<&Slot> {
        let gfn = gfn.raw();
        let (_, entry) = self
            .gfn_tree
            .get_le(&gfn)
            .or_else(|| self.gfn_tree.first())?;
        Some(&entry.slot)
    }

    fn for_each_in_gfn_range<'a, F: FnMut(&'a Slot)>(&'a self, start: Gfn, end: Gfn, mut f: F) {
        let Some((start, end)) = nonempty(start.raw(), end.raw()) else {
            return;
        };
        if let Some((_, entry)) = self.gfn_tree.get_le(&start) {
            if entry.end_gfn > start {
                f(&entry.slot);
            }
        }
        // start < end <= u64::MAX, so start + 1 does not wrap.
        for (&base, entry) in self.gfn_tree.iter_from(&(start + 1)) {
            if base >= end {
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
        self.hva_index.for_each_overlap(start, end - 1, |slot| {
            f(HvaOverlap::clamp(slot, start, end))
        });
    }
}
