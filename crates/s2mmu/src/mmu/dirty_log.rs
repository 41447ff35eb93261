//! The dirty log: through bitmaps (`KVM_GET_DIRTY_LOG`, and
//! `KVM_CLEAR_DIRTY_LOG` with manual protect, hardware dirty state scanned
//! into the bitmap), through the vCPUs' dirty rings (harvest and reset)
//! and through their page-modification logs (the exit handler's flush),
//! and what the modes' hooks ask of the MMU ([`StrategyHost`]).

use super::sparse_clear::ClearGroup;
use super::strategy::{PmlLog, Rings, StrategyHost, PML_LOG_ENTRIES};
use super::*;
use crate::dirty::DirtyConsumer;

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    pub(super) fn bitmap(&self, id: u16) -> Result<Arc<DirtyBitmap>> {
        self.strategy.bitmaps()?;
        let side = self
            .side
            .get(usize::from(id))
            .filter(|_| self.slots.snapshot().id_to_slot(id).is_some())
            .ok_or(Error::NoSuchSlot {
                slot: u32::from(id),
            })?;
        side.dirty.load_full().ok_or(Error::LoggingDisabled {
            slot: u32::from(id),
        })
    }

    /// `KVM_GET_DIRTY_LOG`: copies slot `id`'s bitmap into `out`. Without
    /// manual protect it also clears the bitmap and write-protects the
    /// pages that were dirty (take-and-clear, protect, flush); returns the
    /// number of dirty pages reported. While the slot has dirty views open
    /// ([`Mmu::open_dirty_view`]) this is one consumer among them, with the
    /// same results.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], [`Error::LoggingDisabled`],
    /// [`Error::WrongDirtyMode`], [`Error::BitmapTooSmall`]; the bitmap is
    /// then as it was.
    pub fn get_dirty_log(&self, id: u16, out: &mut [u64]) -> Result<u64> {
        let _u = self.update.lock();
        let b = self.bitmap(id)?;
        if self.has_views(id) {
            return self.log_get_with_views(id, out);
        }
        if out.len() < b.words() {
            return Err(Error::BitmapTooSmall {
                words: out.len(),
                needed: b.words(),
            });
        }
        self.strategy.sync(self, id, &b)?;
        if self.strategy.manual_protect() {
            b.copy_to(out)?;
            self.bbm_report_clean();
            return Ok(out[..b.words()]
                .iter()
                .map(|w| u64::from(w.count_ones()))
                .sum());
        }
        let (base, size) = self.slot_range(id)?;
        let mut st = FaultStats::default();
        let mut pt = self.write_lock(&mut st);
        let tlb = self.stage2.tlb.clone();
        let mut batch = TlbBatch::new(&*tlb, pt.tlb_policy());
        let mut n = 0;
        for i in 0..b.words() {
            let mask = b.take_word(i);
            out[i] = mask;
            if mask != 0 {
                n += u64::from(mask.count_ones());
                if let Err(e) = self.protect_mask(&mut pt, base, i as u64 * 64, mask, &mut batch) {
                    // Put back every bit taken: the bitmap is as before and
                    // no dirty page is lost (pages already protected stay
                    // so, and fault again on their next write).
                    for (j, &taken) in out.iter().enumerate().take(i + 1) {
                        b.mark_word(j, taken);
                    }
                    drop(pt);
                    batch.finish();
                    return Err(e);
                }
            }
        }
        drop(pt);
        if n > 0 {
            batch.add(base, size);
        }
        let calls = batch.finish();
        self.bbm_report_clean();
        self.count_clear_tlb_calls(calls);
        self.vm_stats.lock().add(&st);
        Ok(n)
    }

    /// `KVM_CLEAR_DIRTY_LOG`: for pages `[first_page, first_page +
    /// num_pages)` of slot `id` whose bit is set in `bitmap` (bit 0 of word
    /// 0 is `first_page`), clears the dirty bits that are set and
    /// write-protects exactly those pages, then flushes the slot's TLB
    /// entries once; returns the number of pages cleared. Processed in
    /// 1 GiB chunks, dropping the lock between them (QEMU's default clear
    /// chunk is the same size). While the slot has dirty views open, only
    /// the cleared pages that may be writable are protected (and the flush
    /// is skipped if none is), as [`Mmu::clear_dirty_view`] does.
    ///
    /// # Errors
    /// [`Error::ClearNotAligned`], [`Error::ClearBadRange`],
    /// [`Error::BitmapTooSmall`], [`Error::NoSuchSlot`],
    /// [`Error::LoggingDisabled`], [`Error::WrongDirtyMode`];
    /// [`Error::OutOfMemory`] where bitmaps start set and the split before
    /// protection cannot get table pages. The bitmap is then as it was
    /// (pages of earlier chunks may stay write-protected: their next write
    /// faults and is logged, so nothing is lost).
    pub fn clear_dirty_log(
        &self,
        id: u16,
        first_page: u64,
        num_pages: u64,
        bitmap: &[u64],
    ) -> Result<u64> {
        let _u = self.update.lock();
        let b = self.bitmap(id)?;
        check_clear_args(first_page, num_pages, b.npages(), bitmap.len())?;
        if self.has_views(id) {
            let clears = [(DirtyConsumer::Log, bitmap)];
            return Ok(self.consumer_clear(id, first_page, num_pages, &clears)?[0]);
        }
        let (base, size) = self.slot_range(id)?;
        let tlb = self.stage2.tlb.clone();
        let mut batch = TlbBatch::new(&*tlb, self.with_table(|pt| pt.tlb_policy()));
        let mut st = FaultStats::default();
        // Words cleared so far and the bits cleared in each, put back if a
        // later step fails: the bitmap is then as before, and no dirty page
        // is lost (pages already write-protected stay so: their next write
        // faults and is logged again).
        let mut taken = Vec::new();
        let cleared = match self.clear_words(
            &b, base, first_page, num_pages, bitmap, &mut st, &mut batch, &mut taken,
        ) {
            Ok(n) => n,
            Err(e) => {
                for (word, mask) in taken {
                    b.mark_word(word, mask);
                }
                batch.finish();
                return Err(e);
            }
        };
        if cleared > 0 {
            batch.add(base, size);
        }
        let calls = batch.finish();
        self.bbm_report_clean();
        self.count_clear_tlb_calls(calls);
        self.vm_stats.lock().add(&st);
        Ok(cleared)
    }

    /// The body of [`Mmu::clear_dirty_log`]: clears and protects chunk by
    /// chunk, recording in `taken` each word's cleared bits.
    #[allow(clippy::too_many_arguments)]
    fn clear_words(
        &self,
        b: &DirtyBitmap,
        base: u64,
        first_page: u64,
        num_pages: u64,
        bitmap: &[u64],
        st: &mut FaultStats,
        batch: &mut TlbBatch<'_>,
        taken: &mut Vec<(usize, u64)>,
    ) -> Result<u64> {
        let words = num_pages.div_ceil(64) as usize;
        let first_word = (first_page / 64) as usize;
        let chunk_words = (LOCK_CHUNK >> self.page_shift) as usize / 64;
        let split = self.split_on_clear();
        let mut cache = self.split_cache.lock();
        let mut cleared = 0;
        let mut w = 0;
        // Pages to protect that run on across words (start page, pages): a
        // fully dirty last-level table is one walk, not one per word.
        let mut run = (0u64, 0u64);
        let table_words = self.with_table(|pt| pt.format().entries_per_table()) / 64;
        let mut group = ClearGroup::new(table_words);
        let npages = b.npages();
        while w < words {
            let end = (w + chunk_words.max(1)).min(words);
            if split {
                let bytes = ((end - w) as u64 * 64) << self.page_shift;
                let cap = self.with_table(|pt| pt.split_capacity(bytes));
                cache.top_up(cap)?;
            }
            let mut pt = self.write_lock(st);
            for (k, &user) in bitmap.iter().enumerate().take(end).skip(w) {
                let mask = b.clear_masked(first_word + k, user);
                if mask == 0 {
                    continue;
                }
                taken.push((first_word + k, mask));
                cleared += u64::from(mask.count_ones());
                let page0 = (first_word + k) as u64 * 64;
                if split {
                    let lo = base + ((page0 + u64::from(mask.trailing_zeros())) << self.page_shift);
                    let hi =
                        base + ((page0 + 64 - u64::from(mask.leading_zeros())) << self.page_shift);
                    let t0 = Stopwatch::<P::Clock>::start();
                    pt.split(lo, hi - lo, &mut cache, self.policy.split_walk)?;
                    st.split_ns += t0.elapsed_ns();
                }
                if !group.holds(first_word + k) {
                    self.protect_group(&mut pt, base, &mut group, npages, &mut run, batch)?;
                }
                group.add(first_word + k, mask);
            }
            self.protect_group(&mut pt, base, &mut group, npages, &mut run, batch)?;
            self.protect_run(&mut pt, base, &mut run, batch)?;
            drop(pt);
            w = end;
        }
        Ok(cleared)
    }

    /// As [`Mmu::protect_mask`], but a run of bits that starts where
    /// `run` (start page, pages) ends extends it, and the rest go through
    /// `run` too: only the runs it cannot extend are protected here; the
    /// caller protects the last with [`Mmu::protect_run`].
    pub(super) fn protect_mask_runs(
        &self,
        pt: &mut PageTable<F, M>,
        base: u64,
        page0: u64,
        mut mask: u64,
        run: &mut (u64, u64),
        batch: &mut TlbBatch<'_>,
    ) -> Result<()> {
        while mask != 0 {
            let lo = mask.trailing_zeros();
            let len = (!(mask >> lo)).trailing_zeros();
            let start = page0 + u64::from(lo);
            if run.1 == 0 || run.0 + run.1 != start {
                self.protect_run(pt, base, run, batch)?;
                run.0 = start;
            }
            run.1 += u64::from(len);
            mask = if lo + len >= 64 {
                0
            } else {
                mask & !(((1u64 << len) - 1) << lo)
            };
        }
        Ok(())
    }

    /// Protects the pages of `run` (start page, pages; none if empty) of
    /// the slot at `base`, and empties it.
    pub(super) fn protect_run(
        &self,
        pt: &mut PageTable<F, M>,
        base: u64,
        run: &mut (u64, u64),
        batch: &mut TlbBatch<'_>,
    ) -> Result<()> {
        let (start, pages) = core::mem::take(run);
        if pages > 0 {
            let ipa = base + (start << self.page_shift);
            self.strategy
                .protect_range(pt, ipa, pages << self.page_shift, batch)?;
        }
        Ok(())
    }

    /// Protects the pages of `mask` (bit i = page `page0 + i` of the
    /// slot at `base`), one call per run of consecutive bits.
    pub(super) fn protect_mask(
        &self,
        pt: &mut PageTable<F, M>,
        base: u64,
        page0: u64,
        mut mask: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<()> {
        while mask != 0 {
            let lo = mask.trailing_zeros();
            let run = (!(mask >> lo)).trailing_zeros();
            let start = base + ((page0 + u64::from(lo)) << self.page_shift);
            self.strategy
                .protect_range(pt, start, u64::from(run) << self.page_shift, batch)?;
            mask = if lo + run >= 64 {
                0
            } else {
                mask & !(((1u64 << run) - 1) << lo)
            };
        }
        Ok(())
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

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// The exit handler's PML flush (`vmx_flush_pml_buffer`): records every
    /// page in `vcpu`'s log as dirty in its slot's bitmap and empties the
    /// log. Call it on the "log-full" exit ([`PmlWriteError::Full`]) before retrying
    /// the write, and on every other exit of the vCPU; a harvest
    /// ([`Mmu::get_dirty_log`]) flushes every vCPU's log itself. Returns
    /// the number of entries flushed (a page of a slot that no longer
    /// exists or no longer logs is dropped, as in KVM).
    ///
    /// # Errors
    /// [`Error::ForeignVcpu`] for a vCPU of another MMU.
    pub fn flush_pml(&self, vcpu: &mut VcpuMmu<M>) -> Result<usize> {
        if vcpu.mmu_id != self.id {
            return Err(Error::ForeignVcpu { vcpu: vcpu.id });
        }
        let Some(log) = vcpu.pml.clone() else {
            return Ok(0);
        };
        let mut st = FaultStats::default();
        let n = self.flush_pml_log(&log, &mut st, None);
        vcpu.stats.dirtied += st.dirtied;
        vcpu.stats.pml_entries += st.pml_entries;
        Ok(n)
    }

    fn flush_pml_log(
        &self,
        log: &PmlLog,
        st: &mut FaultStats,
        old: Option<(u16, u64, u64)>,
    ) -> usize {
        let mut gpas = Vec::with_capacity(PML_LOG_ENTRIES);
        let n = log.drain(&mut gpas);
        if n == 0 {
            return 0;
        }
        st.pml_entries += n as u64;
        let snap = self.slots.snapshot();
        // The slot of the previous entry, its gfn range and bitmap: a log
        // mostly holds runs of pages of one slot.
        let mut last: Option<(u16, u64, u64, Arc<DirtyBitmap>)> = None;
        for gpa in gpas {
            let gfn = gpa >> self.page_shift;
            if !last
                .as_ref()
                .is_some_and(|(_, lo, hi, _)| (*lo..*hi).contains(&gfn))
            {
                let range = match old {
                    Some((id, lo, hi)) if (lo..hi).contains(&gfn) => Some((id, lo, hi)),
                    _ => snap
                        .search(Gfn::new(gfn))
                        .filter(|s| s.dirty_logging() && !s.is_invalid())
                        .map(|s| (s.id(), s.base_gfn().raw(), s.end_gfn().raw())),
                };
                last = range.and_then(|(id, lo, hi)| {
                    let b = self.side.get(usize::from(id))?.dirty.load_full()?;
                    Some((id, lo, hi, b))
                });
            }
            let Some((id, base_gfn, _, bitmap)) = &last else {
                continue;
            };
            if self.drop_injected_mark() {
                continue;
            }
            // The page lies inside the slot, which the bitmap covers.
            let tracker: &dyn DirtyTracker = &**bitmap;
            if let Ok(true) = tracker.mark(log.vcpu(), u32::from(*id), gfn - base_gfn) {
                st.dirtied += 1;
            }
        }
        n
    }
}

/// What the dirty-log modes' hooks ask of the MMU (`mmu/strategy`).
impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> StrategyHost for Mmu<F, M, S, P> {
    fn page_shift(&self) -> u32 {
        self.page_shift
    }

    fn slot_bitmap(&self, id: u16) -> Option<Arc<DirtyBitmap>> {
        self.side
            .get(usize::from(id))
            .and_then(|s| s.dirty.load_full())
    }

    /// The scan KVM's DBM series does before it copies the bitmap. Runs
    /// under the MMU lock for reading: the hardware updates leaves
    /// concurrently, and only protection, under the write lock, cleans
    /// them.
    fn scan_hw_dirty(&self, id: u16, b: &DirtyBitmap) -> Result<()> {
        let (base, size) = self.slot_range(id)?;
        let mut st = FaultStats::default();
        let pt = self.read_lock(&mut st, None);
        pt.scan_hw_dirty_into(base, size, base, b)?;
        drop(pt);
        self.vm_stats.lock().add(&st);
        Ok(())
    }

    /// What KVM's kick before `KVM_GET_DIRTY_LOG` achieves: no leaf is
    /// read. As KVM flushes the logs before a slot moves, the pages of
    /// `old` go to that slot's bitmap (the memslots no longer name it).
    fn flush_pml_logs(&self, logs: &[Arc<PmlLog>], old: Option<(u16, u64, u64)>) {
        let mut st = FaultStats::default();
        for log in logs {
            self.flush_pml_log(log, &mut st, old);
        }
        self.vm_stats.lock().add(&st);
    }
}
