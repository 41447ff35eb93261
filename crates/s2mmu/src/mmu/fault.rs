//! The fault path: the read-lock fast path and the write-lock slow path,
//! and the one place a fault marks a page dirty (what the hardware reports
//! and the vCPU's state are in `mmu/handles.rs`).

use super::*;

/// What a fault found about its memslot, in the memslot state it holds.
pub(super) struct FaultSlot {
    pub(super) id: u16,
    /// Dirty logging is on in that state.
    pub(super) logging: bool,
    /// The slot's guest range in bytes.
    pub(super) start: u64,
    pub(super) end: u64,
    /// The host address of the faulting page.
    pub(super) hva: u64,
    /// The state: store id and generation.
    pub(super) state: (u64, u64),
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// Handles a stage-2 fault of `vcpu` at `gpa` (`write` for a write
    /// access), as an exit handler would that has only the address: it
    /// walks the table to tell a translation fault from a permission fault,
    /// then goes on as [`Mmu::handle_stage2_fault`].
    ///
    /// # Errors
    /// [`Error::NoSlot`] (MMIO), [`Error::WriteToReadOnly`], or an engine
    /// error (out of memory).
    pub fn handle_fault(
        &self,
        vcpu: &mut VcpuMmu<M>,
        gpa: Gpa,
        write: bool,
    ) -> Result<FaultOutcome> {
        let gpa = gpa.raw();
        let kind = match self.stage2.reader.translate(gpa) {
            Some(t) if !write || t.prot.contains(Prot::W) => FaultKind::Spurious,
            Some(t) => FaultKind::Permission { level: t.level },
            None => FaultKind::Translation,
        };
        self.handle_stage2_fault(vcpu, Gpa::new(gpa), write, kind)
    }

    /// Handles a stage-2 fault of `vcpu` at `gpa` (`write` for a write
    /// access) of the kind the hardware reported (arm64's ESR fault status
    /// and level), so the fast path needs no walk before its
    /// compare-and-swap; a report that the table has overtaken is caught
    /// there and the guest retries.
    ///
    /// # Errors
    /// [`Error::NoSlot`] (MMIO), [`Error::WriteToReadOnly`], or an engine
    /// error (out of memory).
    pub fn handle_stage2_fault(
        &self,
        vcpu: &mut VcpuMmu<M>,
        gpa: Gpa,
        write: bool,
        kind: FaultKind,
    ) -> Result<FaultOutcome> {
        let gpa = gpa.raw();
        if vcpu.mmu_id != self.id {
            return Err(Error::ForeignVcpu { vcpu: vcpu.id });
        }
        if vcpu.ring.as_ref().is_some_and(|r| r.soft_full()) {
            // KVM does not enter a vCPU whose ring is soft-full: making a
            // page writable now could leave its write unrecorded.
            return Err(Error::RingFull { vcpu: vcpu.id });
        }
        let shift = self.page_shift;
        let gfn = Gpa::new(gpa).gfn(shift);
        let snap = self.slots.snapshot();
        let slot = snap
            .gfn_to_slot_vcpu(&mut vcpu.slot_cache, gfn)
            .ok_or(Error::NoSlot { gpa: Gpa::new(gpa) })?;
        let hva = match slot.gfn_to_hva(gfn, write) {
            Ok(h) => h.raw(),
            Err(crate::memslot::HvaFault::ReadOnly) => {
                return Err(Error::WriteToReadOnly { gpa: Gpa::new(gpa) })
            }
            // A slot being deleted or moved: the guest retries.
            Err(_) => return Ok(FaultOutcome::Retry),
        };
        let fs = FaultSlot {
            id: slot.id(),
            logging: slot.dirty_logging(),
            // Validation keeps a slot's guest range inside the 64-bit space.
            start: slot.base_gfn().raw() << shift,
            end: slot.end_gfn().raw() << shift,
            hva,
            state: (snap.store_id(), snap.generation()),
        };
        // `snap` is held to the end of the fault, as KVM holds SRCU across
        // it: a memslot change (turning logging on) waits for this fault
        // before it write-protects, so a fault that saw logging off cannot
        // make a page writable, unlogged, after the protect and flush.
        match kind {
            FaultKind::Spurious => {
                vcpu.stats.spurious += 1;
                return Ok(FaultOutcome::Spurious);
            }
            FaultKind::Permission { .. } if !write => {
                // Every mapping is readable: nothing to relax.
                vcpu.stats.spurious += 1;
                return Ok(FaultOutcome::Spurious);
            }
            FaultKind::Permission { level } => {
                if let Some(done) = self.fast_path(vcpu, gpa, level, &fs) {
                    return done;
                }
                vcpu.stats.permission += 1;
            }
            FaultKind::Translation => vcpu.stats.translation += 1,
        }
        self.slow_fault(vcpu, gpa, write, &fs)
    }

    /// The fast path: relax a page (or a block of a slot that is
    /// not logged) under the read lock by compare-and-swap. The leaf must
    /// still be at the reported level: a huge mapping is never made
    /// writable while its slot is logged. `None`: go to the slow path.
    fn fast_path(
        &self,
        vcpu: &mut VcpuMmu<M>,
        gpa: u64,
        level: u32,
        fs: &FaultSlot,
    ) -> Option<Result<FaultOutcome>> {
        let fmt = self.stage2.reader.format();
        if self.policy.fault_path != FaultPath::ReadLockFastPath
            || (level != fmt.last_level() && fs.logging)
        {
            return None;
        }
        let pt = self.read_lock(&mut vcpu.stats, vcpu.lock_slot);
        match pt.relax_perms_at_level(gpa, Prot::RW, level) {
            Ok(o) if o.new == o.old => {
                vcpu.stats.spurious += 1;
                Some(Ok(FaultOutcome::Spurious))
            }
            Ok(o) => {
                drop(pt);
                vcpu.stats.permission += 1;
                if o.became_writable(fmt.write_bit()) && fs.logging {
                    self.mark_dirty(vcpu, fs, (gpa - fs.start) >> self.page_shift);
                }
                vcpu.stats.fast += 1;
                Some(Ok(FaultOutcome::Fast))
            }
            Err(Error::Again { .. }) => {
                vcpu.stats.retries += 1;
                Some(Ok(FaultOutcome::Retry))
            }
            Err(Error::NotMapped { .. }) => None,
            Err(e) => Some(Err(e)),
        }
    }

    pub(super) fn slow_fault(
        &self,
        vcpu: &mut VcpuMmu<M>,
        gpa: u64,
        write: bool,
        fs: &FaultSlot,
    ) -> Result<FaultOutcome> {
        let FaultSlot {
            logging,
            start: slot_start,
            hva,
            ..
        } = *fs;
        let fmt = self.stage2.reader.format();
        let shift = self.page_shift;
        let page = 1u64 << shift;
        // Top up outside the lock: enough for a map, or for splitting the
        // largest block in one step.
        let levels = (fmt.last_level() - fmt.start_level()) as usize;
        vcpu.cache.top_up(levels)?;
        let pt = self.write_lock(&mut vcpu.stats);
        vcpu.stats.slow += 1;
        if self.hva_invalidating(hva, page) {
            // The host is changing what backs the page: wait for it.
            vcpu.stats.retries += 1;
            return Ok(FaultOutcome::Retry);
        }
        let offset = (gpa - slot_start) >> shift;
        match pt.translate(gpa) {
            Some(t) if !write || t.prot.contains(Prot::W) => {
                vcpu.stats.spurious += 1;
                Ok(FaultOutcome::Spurious)
            }
            Some(t) if logging && t.size > page => {
                self.split_on_fault(pt, vcpu, gpa, t.size, fs)?;
                Ok(FaultOutcome::Slow)
            }
            Some(_) => {
                let o = pt.relax_perms(gpa, Prot::RW)?;
                drop(pt);
                if logging && o.became_writable(fmt.write_bit()) {
                    self.mark_dirty(vcpu, fs, offset);
                }
                Ok(FaultOutcome::Slow)
            }
            None => {
                self.map_new(pt, vcpu, gpa, write, fs)?;
                Ok(FaultOutcome::Slow)
            }
        }
    }

    /// Split on fault, as KVM does without eager split (arm64's map of a
    /// page over a block; x86 before 5.18): a huge mapping is never made
    /// writable while logged, so break the block of `size` bytes and map
    /// only the faulting page; the rest of the block faults back page by
    /// page (translation faults on the slow path).
    fn split_on_fault(
        &self,
        mut pt: WriteGuard<'_, PageTable<F, M>, P>,
        vcpu: &mut VcpuMmu<M>,
        gpa: u64,
        size: u64,
        fs: &FaultSlot,
    ) -> Result<()> {
        let page = 1u64 << self.page_shift;
        let t0 = Stopwatch::<P::Clock>::start();
        pt.unmap(gpa & !(size - 1), size)?;
        let prot = Prot::RWX;
        let opts = MapOptions { force_pages: true };
        let pa = self.phys_for_leaf(fs.hva & !(page - 1), page, prot)?;
        pt.map(gpa & !(page - 1), page, pa, prot, &mut vcpu.cache, opts)?;
        vcpu.stats.split_ns += t0.elapsed_ns();
        vcpu.stats.splits_on_fault += 1;
        drop(pt);
        self.mark_dirty(vcpu, fs, (gpa - fs.start) >> self.page_shift);
        Ok(())
    }

    /// The largest leaf a translation fault at `gpa` may map: pages while
    /// logging, else the largest block that the host backing, the guest,
    /// host and physical alignments and the slot allow, and that no host
    /// invalidation overlaps.
    fn leaf_size_for(&self, gpa: u64, fs: &FaultSlot) -> u64 {
        let page = 1u64 << self.page_shift;
        if fs.logging {
            return page;
        }
        let host_page = self.side[usize::from(fs.id)]
            .host_page
            .load(Ordering::Relaxed);
        let hva = fs.hva;
        for g in self.leaf_sizes() {
            let base = gpa & !(g - 1);
            // `hva` is the page's; `gpa` carries the access's offset within
            // the page (a real abort's IPA does).
            if g <= host_page
                && ((gpa & !(page - 1)) ^ hva) & (g - 1) == 0
                && base >= fs.start
                && base + g <= fs.end
                && (g == page
                    || (self.phys_for(hva & !(g - 1), g).is_some()
                        && !self.hva_invalidating(hva & !(g - 1), g)))
            {
                return g;
            }
        }
        page
    }

    /// A translation fault: map the page, or the largest block allowed.
    fn map_new(
        &self,
        mut pt: WriteGuard<'_, PageTable<F, M>, P>,
        vcpu: &mut VcpuMmu<M>,
        gpa: u64,
        write: bool,
        fs: &FaultSlot,
    ) -> Result<()> {
        let page = 1u64 << self.page_shift;
        let size = self.leaf_size_for(gpa, fs);
        let hva = fs.hva;
        // Logged pages are mapped read-only on a read so the first write
        // traps; otherwise writable as the host page is.
        let prot = if fs.logging && !write {
            Prot::R | Prot::X
        } else {
            Prot::RWX
        };
        let opts = MapOptions { force_pages: false };
        let pa = self.phys_for_leaf(hva & !(size - 1), size, prot)?;
        let mut r = pt.map(gpa & !(size - 1), size, pa, prot, &mut vcpu.cache, opts);
        if matches!(r, Err(Error::AlreadyMapped { .. })) && size > page {
            // Part of the block is mapped by pages: map just this page.
            let pa = self.phys_for_leaf(hva & !(page - 1), page, prot)?;
            r = pt.map(gpa & !(page - 1), page, pa, prot, &mut vcpu.cache, opts);
        }
        r?;
        drop(pt);
        if fs.logging && write {
            self.mark_dirty(vcpu, fs, (gpa - fs.start) >> self.page_shift);
        }
        Ok(())
    }

    /// The one place a fault records a dirty page, in the vCPU's ring or
    /// in the slot's bitmap: both are a [`DirtyTracker`].
    pub(super) fn mark_dirty(&self, vcpu: &mut VcpuMmu<M>, fs: &FaultSlot, offset: u64) {
        let slot = fs.id;
        if vcpu.ring.is_none() {
            let cached =
                matches!(&vcpu.dirty_cache, Some((st, id, _)) if *st == fs.state && *id == slot);
            if !cached {
                // The bitmap was published before the state in which the
                // slot logs, and is dropped only after a later state has
                // waited for this fault's.
                vcpu.dirty_cache = self.side[usize::from(slot)]
                    .dirty
                    .load_full()
                    .map(|b| (fs.state, slot, b));
            }
        }
        let tracker: Option<&dyn DirtyTracker> = match (&vcpu.ring, &vcpu.dirty_cache) {
            (Some(ring), _) => Some(&**ring),
            (None, Some((_, _, bitmap))) => Some(&**bitmap),
            // No bitmap in this state: the slot stopped logging.
            (None, None) => None,
        };
        let Some(tracker) = tracker else { return };
        if self.drop_injected_mark() {
            return;
        }
        // Neither can fail: a fault on a soft-full ring is refused before it
        // changes anything and pushes at most once, into the entries
        // reserved past the soft limit; the page lies inside its slot, which
        // the bitmap covers.
        match tracker.mark(vcpu.id, u32::from(slot), offset) {
            Ok(true) => vcpu.stats.dirtied += 1,
            Ok(false) => {}
            Err(e) => unreachable!("recording dirty page {offset} of slot {slot}: {e}"),
        }
    }
}
