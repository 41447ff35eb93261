//! The dirty log through per-vCPU rings: harvest and reset.

use super::*;

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// Whether `vcpu`'s dirty ring is soft-full: the vCPU must not enter the
    /// guest until the ring is harvested and reset.
    pub fn ring_soft_full(&self, vcpu: usize) -> bool {
        self.policy.dirty.ring_entries().is_some()
            && self
                .rings
                .read()
                .get(vcpu)
                .is_some_and(|r| r.as_ref().is_some_and(|r| r.soft_full()))
    }

    /// Harvests every vCPU's ring into `out`; returns the number of entries.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] when rings are off.
    pub fn harvest_rings(&self, out: &mut Vec<DirtyGfn>) -> Result<usize> {
        if self.policy.dirty.ring_entries().is_none() {
            return Err(Error::WrongDirtyMode {
                needs: "dirty rings",
            });
        }
        Ok(self
            .rings
            .read()
            .iter()
            .flatten()
            .map(|r| r.harvest(out))
            .sum())
    }

    /// `KVM_RESET_DIRTY_RINGS`: re-protects every harvested page and frees
    /// its ring entry, then flushes the whole VM's TLBs once if anything
    /// was reset; returns the number of entries reset.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] when rings are off.
    pub fn reset_rings(&self) -> Result<u64> {
        if self.policy.dirty.ring_entries().is_none() {
            return Err(Error::WrongDirtyMode {
                needs: "dirty rings",
            });
        }
        let _u = self.update.lock();
        let snap = self.slots.snapshot();
        let rings = self.rings.read().clone();
        let mut st = FaultStats::default();
        let mut pt = self.write_lock(&mut st);
        let tlb = self.stage2.tlb.clone();
        let mut batch = TlbBatch::new(&*tlb, pt.tlb_policy());
        let mut total = 0;
        let mut result = Ok(());
        for r in rings.iter().flatten() {
            total += r.reset(|slot, offset, mask| {
                let Ok(id) = u16::try_from(slot) else { return };
                let Some(s) = snap.id_to_slot(id) else { return };
                // Entries beyond the slot (a stale ring entry of a moved
                // slot) are ignored, as KVM does.
                if offset + 64 - u64::from(mask.leading_zeros()) > s.npages() {
                    return;
                }
                let base = s.base_gfn().raw() << self.page_shift;
                if let Err(e) = self.protect_mask(&mut pt, base, offset, mask, &mut batch) {
                    result = Err(e);
                }
            });
        }
        drop(pt);
        drop(snap);
        // KVM flushes the whole VM after a reset.
        if total > 0 {
            batch.add_whole_vmid();
        }
        batch.finish();
        self.bbm_report_clean();
        self.vm_stats.lock().add(&st);
        result.map(|_| total)
    }
}
