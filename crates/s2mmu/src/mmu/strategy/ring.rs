//! Write protection into per-vCPU dirty rings ([`DirtyMode::Ring`]): the
//! fault pushes the page to its vCPU's ring; harvest and reset. The rings
//! exist only in this strategy: a VM in another mode has none.

use super::*;

/// The ring strategy: the ring size and every vCPU's ring.
pub(in crate::mmu) struct Rings<P: Platform> {
    entries: u32,
    /// Every vCPU's ring, by vCPU index.
    rings: RwLock<P, Vec<Arc<DirtyRing>>>,
}

impl<P: Platform> Rings<P> {
    /// Rings of `entries` entries.
    ///
    /// # Errors
    /// As [`DirtyRing::new`], for a size out of range.
    pub(super) fn new(entries: u32) -> Result<Self> {
        DirtyRing::new(entries)?;
        Ok(Rings {
            entries,
            rings: lock_api::RwLock::new(Vec::new()),
        })
    }
}

impl<P: Platform> DirtyStrategy<P> for Rings<P> {
    fn protect(&self) -> Option<Protect> {
        None
    }

    fn new_vcpu(&self, id: usize, _table: u64) -> Result<VcpuLog> {
        let ring = Arc::new(DirtyRing::new(self.entries)?);
        let mut rings = self.rings.write();
        rings.try_reserve(1).map_err(|_| Error::OutOfMemory)?;
        debug_assert_eq!(rings.len(), id, "vCPUs are made one at a time, in order");
        rings.push(ring.clone());
        Ok(VcpuLog {
            ring: Some(ring),
            pml: None,
        })
    }
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// The ring strategy.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] when rings are off.
    fn rings(&self) -> Result<&Rings<P>> {
        match &self.strategy {
            Strategy::Ring(r) => Ok(r),
            _ => Err(Error::WrongDirtyMode {
                needs: "dirty rings",
            }),
        }
    }
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// Whether `vcpu`'s dirty ring is soft-full: the vCPU must not enter the
    /// guest until the ring is harvested and reset.
    pub fn ring_soft_full(&self, vcpu: usize) -> bool {
        self.rings()
            .is_ok_and(|r| r.rings.read().get(vcpu).is_some_and(|r| r.soft_full()))
    }

    /// Harvests every vCPU's ring into `out`; returns the number of entries.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] when rings are off.
    pub fn harvest_rings(&self, out: &mut Vec<DirtyGfn>) -> Result<usize> {
        let rings = self.rings()?;
        Ok(rings.rings.read().iter().map(|r| r.harvest(out)).sum())
    }

    /// `KVM_RESET_DIRTY_RINGS`: re-protects every harvested page and frees
    /// its ring entry, then flushes the whole VM's TLBs once if anything
    /// was reset; returns the number of entries reset.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] when rings are off.
    pub fn reset_rings(&self) -> Result<u64> {
        let rings = self.rings()?;
        let _u = self.update.lock();
        let snap = self.slots.snapshot();
        let rings = rings.rings.read().clone();
        let mut st = FaultStats::default();
        let mut pt = self.write_lock(&mut st);
        let tlb = self.stage2.tlb.clone();
        let mut batch = TlbBatch::new(&*tlb, pt.tlb_policy());
        let mut total = 0;
        let mut result = Ok(());
        for r in rings.iter() {
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
