//! KVM's MMU notifier: the host tells the MMU that what backs a range of
//! host addresses is about to change (a page migrated, swapped, remapped),
//! and the MMU drops every stage-2 mapping of it first.
//!
//! [`Mmu::invalidate_hva_range_start`] unmaps the guest ranges that map the
//! host range (whole leaves, break-before-make with invalidation), and from
//! then until [`Mmu::invalidate_hva_range_end`] a fault that would map a
//! page of the range is retried instead (KVM's `mmu_invalidate_in_progress`
//! check in the fault path). Faults look the physical address up and
//! install the leaf under the MMU write lock, which the start also takes,
//! so no fault can install an address the host is about to replace.

use super::{FaultStats, Mmu};
use crate::format::PteFormat;
use crate::memslot::{MemslotStore, SlotLookup};
use crate::sync::Platform;
use crate::table::MmOps;
use crate::{Error, Hva, Result};
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// The host is about to change what backs `[hva, hva + size)`: unmaps
    /// every stage-2 leaf that maps any of it (whole blocks), with their
    /// invalidations, and makes faults on it retry until the matching
    /// [`Mmu::invalidate_hva_range_end`]. Returns the number of leaves
    /// unmapped.
    ///
    /// # Errors
    /// [`Error::EmptyRange`] for size 0 or a range that wraps; nothing is
    /// changed then.
    pub fn invalidate_hva_range_start(&self, hva: Hva, size: u64) -> Result<u64> {
        let hva = hva.raw();
        if size == 0 {
            return Err(Error::EmptyRange { ipa: hva, size });
        }
        let end = hva
            .checked_add(size)
            .ok_or(Error::EmptyRange { ipa: hva, size })?;
        let shift = self.page_shift;
        let mut st = FaultStats::default();
        let mut pt = self.write_lock(&mut st);
        let snap = self.slots.snapshot();
        let mut ranges = Vec::new();
        snap.for_each_in_hva_range(Hva::new(hva), Hva::new(end), |o| {
            let slot = (o.slot.id(), o.slot.base_gfn().raw() << shift);
            ranges.push((
                o.gfn_start.raw() << shift,
                (o.gfn_end.raw() - o.gfn_start.raw()) << shift,
                slot,
            ));
        });
        drop(snap);
        let mut leaves = Vec::new();
        for &(ipa, len, (id, slot_base)) in &ranges {
            // A leaf the hardware dirtied carries the only record of that
            // write: move it to the bitmap before the leaf goes.
            self.strategy.salvage(self, &pt, id, slot_base, ipa, len)?;
            leaves.extend(pt.leaves(ipa, len)?);
        }
        // Registered before the lock is dropped: a fault that takes it next
        // sees the range and retries.
        self.invalidating.lock().push((hva, end));
        self.invalidations.fetch_add(1, Ordering::AcqRel);
        for l in &leaves {
            // A leaf of a slot lies inside the IPA space and is whole.
            pt.unmap(l.ipa, l.size)?;
        }
        drop(pt);
        self.vm_stats.lock().add(&st);
        Ok(leaves.len() as u64)
    }

    /// Ends an invalidation begun with the same range: faults on it map
    /// again (with what the host backs it with now).
    ///
    /// # Errors
    /// [`Error::NotMapped`] (naming `hva`) if no invalidation of exactly
    /// that range is in progress.
    pub fn invalidate_hva_range_end(&self, hva: Hva, size: u64) -> Result<()> {
        let hva = hva.raw();
        let mut inv = self.invalidating.lock();
        let i = inv
            .iter()
            .position(|&r| r == (hva, hva.wrapping_add(size)))
            .ok_or(Error::NotMapped { ipa: hva })?;
        inv.swap_remove(i);
        self.invalidations.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }

    /// Whether a host-range invalidation overlapping `[hva, hva + size)`
    /// is in progress (called by faults under the MMU write lock, for the
    /// page and for each block they consider).
    pub(super) fn hva_invalidating(&self, hva: u64, size: u64) -> bool {
        // The common case, no invalidation at all, takes no lock. The count
        // only changes under the MMU write lock or before the range is
        // removed, and faults read it under the write lock.
        if self.invalidations.load(Ordering::Acquire) == 0 {
            return false;
        }
        let inv = self.invalidating.lock();
        let end = hva.saturating_add(size);
        !inv.is_empty() && inv.iter().any(|&(a, b)| hva < b && a < end)
    }
}
