//! The read side of a memslot set: what a vCPU or an MMU notifier asks of a snapshot.

use super::cache::VcpuSlotCache;
use super::slot::Slot;
use crate::addr::{Gfn, Hva};

pub(crate) mod sealed {
    use super::Slot;

    /// Only this crate's sets implement [`super::SlotLookup`]: the per-vCPU cache relies on
    /// their promise that a (store id, generation) pair names one immutable state.
    pub trait Sealed {
        /// The slot containing `gfn` with its gfn range, read from the index rather than
        /// from the slot, so that filling a cache costs no extra memory access.
        fn search_with_range(&self, gfn: u64) -> Option<(&Slot, u64, u64)>;
    }
}

/// One slot that overlaps a host-virtual range, with the overlap converted to gfns
/// (as KVM's `__kvm_handle_hva_range` does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HvaOverlap<'a> {
    /// The slot.
    pub slot: &'a Slot,
    /// First gfn of the overlap.
    pub gfn_start: Gfn,
    /// One past the last gfn of the overlap.
    pub gfn_end: Gfn,
}

impl<'a> HvaOverlap<'a> {
    /// Clamps the half-open hva range `[start, end)` to `slot`; the caller knows they overlap.
    pub(crate) fn clamp(slot: &'a Slot, start: u64, end: u64) -> Self {
        let base_hva = slot.userspace_addr().raw();
        let hva_start = start.max(base_hva);
        let hva_end = end.min(slot.hva_end().raw());
        let page_mask = (1u64 << slot.page_shift()) - 1;
        let base_gfn = slot.base_gfn().raw();
        Self {
            slot,
            gfn_start: Gfn::new(base_gfn + ((hva_start - base_hva) >> slot.page_shift())),
            // Round the end up to a page, as KVM does with `hva_end + PAGE_SIZE - 1`.
            gfn_end: Gfn::new(base_gfn + ((hva_end - base_hva + page_mask) >> slot.page_shift())),
        }
    }
}

/// The half-open range `[start, end)` as raw numbers, or `None` where it is
/// empty: the ranged lookups then visit nothing.
#[inline]
pub(crate) fn nonempty(start: u64, end: u64) -> Option<(u64, u64)> {
    (start < end).then_some((start, end))
}

/// Lookups on one published memslot state. Implemented by the sets of both policies and
/// reached through a store's snapshot (which dereferences to the set).
pub trait SlotLookup: sealed::Sealed {
    /// Identity of the store this state belongs to (unique in the process).
    fn store_id(&self) -> u64;

    /// Generation of this state; every publication gets a new, larger one.
    fn generation(&self) -> u64;

    /// Number of slots, including a stand-in of an update in flight.
    fn len(&self) -> usize;

    /// Whether there are no slots.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sum of `npages` over all slots (KVM's `nr_memslot_pages`).
    fn total_pages(&self) -> u64;

    /// The slot with this id.
    fn id_to_slot(&self, id: u16) -> Option<&Slot>;

    /// The slot containing `gfn`, searched without touching any cache (KVM's
    /// `search_memslots(.., approx = false)`).
    fn search(&self, gfn: Gfn) -> Option<&Slot>;

    /// The slot containing `gfn`, trying the set-wide last-used slot first and updating it
    /// (KVM's `__gfn_to_memslot`). For callers that are not vCPUs.
    fn gfn_to_slot(&self, gfn: Gfn) -> Option<&Slot>;

    /// The slot containing `gfn`, or on a miss a neighbour of the hole: the slot with the
    /// highest base below `gfn`, or the lowest slot if `gfn` lies below all of them (the
    /// choice KVM's array made; its tree returns one of the same two neighbours). `None`
    /// only when the set is empty. KVM's `__gfn_to_memslot_approx`, used by s390 CMMA.
    fn gfn_to_slot_approx(&self, gfn: Gfn) -> Option<&Slot>;

    /// Calls `f` for every slot overlapping the half-open gfn range `[start, end)`, in
    /// ascending gfn order (KVM's `kvm_for_each_memslot_in_gfn_range`).
    fn for_each_in_gfn_range<'a, F: FnMut(&'a Slot)>(&'a self, start: Gfn, end: Gfn, f: F);

    /// Calls `f` for every slot whose host range overlaps the half-open hva range
    /// `[start, end)`, with the overlap clamped and converted to gfns (KVM's
    /// `kvm_for_each_memslot_in_hva_range`, as MMU notifiers use it). Host ranges of
    /// different slots may overlap; each overlapping slot is reported once, in no
    /// particular order.
    fn for_each_in_hva_range<'a, F: FnMut(HvaOverlap<'a>)>(&'a self, start: Hva, end: Hva, f: F);

    /// Calls `f` for every slot in ascending gfn order.
    fn for_each_slot<'a, F: FnMut(&'a Slot)>(&'a self, f: F) {
        self.for_each_in_gfn_range(Gfn::new(0), Gfn::new(u64::MAX), f);
    }

    /// The slot containing `gfn` through a vCPU's own last-used cache (KVM's
    /// `kvm_vcpu_gfn_to_memslot`): the cache is reset when this state's generation differs
    /// from the one it was filled under, and a miss searches without touching the set-wide
    /// cache, so vCPUs do not fight over it.
    fn gfn_to_slot_vcpu<'a>(&'a self, cache: &mut VcpuSlotCache, gfn: Gfn) -> Option<&'a Slot> {
        let gfn = gfn.raw();
        if cache.is_for(self.store_id(), self.generation()) {
            if let Some(cached) = cache.slot {
                if gfn >= cache.base_gfn && gfn < cache.end_gfn {
                    cache.hits += 1;
                    // SAFETY: the cache was filled from a state of this store with this
                    // generation. A generation is published once per store and a published
                    // state never changes while anyone can read it (the sets are sealed to
                    // this crate, which keeps that promise), so `self` is that same state
                    // and holds an `Arc` to the cached slot for at least the lifetime `'a`.
                    return Some(unsafe { cached.as_ref() });
                }
            }
        } else {
            cache.reset(self.store_id(), self.generation());
        }
        cache.misses += 1;
        let (found, base_gfn, end_gfn) = self.search_with_range(gfn)?;
        cache.fill(found, base_gfn, end_gfn);
        Some(found)
    }
}
