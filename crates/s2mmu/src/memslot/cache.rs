//! The per-vCPU last-used-slot cache.

use core::ptr::NonNull;

use super::slot::Slot;

/// One vCPU's last-used slot, valid only for the store state (store id and generation) it
/// was filled under. Used through [`SlotLookup::gfn_to_slot_vcpu`]; any change published
/// by the store bumps the generation and so empties the cache implicitly.
///
/// [`SlotLookup::gfn_to_slot_vcpu`]: super::SlotLookup::gfn_to_slot_vcpu
#[derive(Debug, Default)]
pub struct VcpuSlotCache {
    store_id: u64,
    generation: u64,
    pub(crate) slot: Option<NonNull<Slot>>,
    /// The cached slot's gfn range, kept here so that a miss does not read the slot.
    pub(crate) base_gfn: u64,
    pub(crate) end_gfn: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that searched the set.
    pub misses: u64,
}

// SAFETY: the pointer is only dereferenced under a snapshot of the state that owns the slot
// (see `SlotLookup::gfn_to_slot_vcpu`), never on its own, so moving the cache to another
// thread moves no access to shared data.
unsafe impl Send for VcpuSlotCache {}

impl VcpuSlotCache {
    /// An empty cache.
    pub const fn new() -> Self {
        Self {
            store_id: 0,
            generation: 0,
            slot: None,
            base_gfn: 0,
            end_gfn: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// Whether the cache belongs to this store state.
    pub(crate) fn is_for(&self, store_id: u64, generation: u64) -> bool {
        self.store_id == store_id && self.generation == generation
    }

    /// Empties the cache and ties it to a new state.
    pub(crate) fn reset(&mut self, store_id: u64, generation: u64) {
        self.store_id = store_id;
        self.generation = generation;
        self.slot = None;
        self.base_gfn = 0;
        self.end_gfn = 0;
    }

    /// Remembers `slot`, found in the state the cache is tied to.
    pub(crate) fn fill(&mut self, slot: &Slot, base_gfn: u64, end_gfn: u64) {
        self.slot = Some(NonNull::from(slot));
        self.base_gfn = base_gfn;
        self.end_gfn = end_gfn;
    }

    /// The generation the cache was last filled under (0 if never).
    pub const fn generation(&self) -> u64 {
        self.generation
    }
}
