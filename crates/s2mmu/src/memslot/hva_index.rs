//! The hva interval index of the tree policy: which slots overlap a host-virtual range.
//!
//! Host ranges of different slots may overlap (aliasing), so a plain ordered map by start
//! is not enough on its own. The index keeps slots ordered by (start, id) together with a
//! multiset of range lengths: a slot overlapping `[start, last]` must begin at or after
//! `start - (longest - 1)`, so a query scans only the slots that begin in
//! `[start - longest + 1, last]`. With slots of similar size (the common case: guest RAM
//! cut into slots) that is O(log n + k) for k hits; one very large slot widens the scan
//! window of every query, which a balanced interval tree (KVM's) would not.

use alloc::sync::Arc;

use super::slot::Slot;
use super::sorted_map::SortedMap;

/// Slots by host range.
#[derive(Clone, Debug, Default)]
pub(crate) struct HvaIndex {
    /// (first byte, slot id) -> (last byte inclusive, slot).
    by_start: SortedMap<(u64, u16), (u64, Arc<Slot>)>,
    /// Range length in bytes -> number of slots with that length.
    lengths: SortedMap<u64, u32>,
}

impl HvaIndex {
    pub(crate) fn insert(&mut self, slot: &Arc<Slot>) {
        let start = slot.userspace_addr().raw();
        let len = slot.hva_end().raw() - start;
        self.by_start
            .insert((start, slot.id()), (start + len - 1, Arc::clone(slot)));
        match self.lengths.get_mut(&len) {
            Some(count) => *count += 1,
            None => {
                self.lengths.insert(len, 1);
            }
        }
    }

    pub(crate) fn remove(&mut self, slot: &Slot) {
        let start = slot.userspace_addr().raw();
        let len = slot.hva_end().raw() - start;
        if self.by_start.remove(&(start, slot.id())).is_some() {
            match self.lengths.get_mut(&len) {
                Some(count) if *count > 1 => *count -= 1,
                _ => {
                    self.lengths.remove(&len);
                }
            }
        }
    }

    /// Calls `f` for every slot whose range overlaps `[start, last]` (inclusive).
    pub(crate) fn for_each_overlap<'a, F: FnMut(&'a Slot)>(
        &'a self,
        start: u64,
        last: u64,
        mut f: F,
    ) {
        let Some((&longest, _)) = self.lengths.get_le(&u64::MAX) else {
            return;
        };
        let lowest_start = start.saturating_sub(longest - 1);
        for (&(slot_start, _), (slot_last, slot)) in self.by_start.iter_from(&(lowest_start, 0)) {
            if slot_start > last {
                break;
            }
            if *slot_last >= start {
                f(slot);
            }
        }
    }
}
