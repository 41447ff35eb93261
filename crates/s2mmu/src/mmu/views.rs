//! Dirty views: several independent consumers of one slot's dirty log over
//! one stage-2 table (the bookkeeping is [`crate::dirty::SlotViews`]).
//!
//! A view is opened on a logged slot and gets and clears its own bitmap,
//! with `KVM_CLEAR_DIRTY_LOG`'s arguments. While a slot has views, its own
//! GET/CLEAR ([`Mmu::get_dirty_log`], [`Mmu::clear_dirty_log`]) is one more
//! consumer beside them, with the same results as without views; when the
//! last view closes, the slot's log goes back to the shared bitmap alone,
//! so a slot without views runs exactly the single-consumer code.
//!
//! A clear write-protects only the cleared pages that may be writable: a
//! page another consumer's clear protected and that was not written since
//! costs no protect, no flush and, for the guest, no second fault. Works in
//! every bitmap mode (write protection, with or without manual protect, and
//! hardware dirty state, whose leaves are scanned into the shared bitmap
//! before each fold); dirty rings have no bitmap and are refused.

use super::*;
use crate::dirty::{DirtyConsumer, DirtyViewStats, SlotViews, MAX_DIRTY_VIEWS_PER_SLOT};

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// Opens a dirty view of slot `id`: a consumer with a bitmap of its
    /// own, all pages dirty at first (it cannot know what changed before
    /// it existed).
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], [`Error::LoggingDisabled`],
    /// [`Error::WrongDirtyMode`] (dirty rings), [`Error::TooManyDirtyViews`],
    /// [`Error::OutOfMemory`] for its bitmaps.
    pub fn open_dirty_view(&self, id: u16) -> Result<DirtyView> {
        let _u = self.update.lock();
        let b = self.bitmap(id)?;
        self.strategy.sync(self, id, &b)?;
        let mut views = self.views.lock();
        let view = self.next_view.fetch_add(1, Ordering::Relaxed);
        match views.iter_mut().find(|v| v.slot() == id) {
            Some(v) => v.open(view)?,
            None => {
                let mut v = SlotViews::new(id, b)?;
                v.open(view)?;
                views.push(v);
                self.views_open.fetch_add(1, Ordering::Release);
            }
        }
        Ok(DirtyView {
            mmu: self.id,
            id: view,
        })
    }

    /// Closes `view` and frees its bitmap; the last view of a slot hands
    /// the slot's log back to its shared bitmap.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`] (never opened, closed, or its slot
    /// stopped logging, which closes its views); [`Error::ForeignDirtyView`]
    /// for a view of another MMU.
    pub fn close_dirty_view(&self, view: DirtyView) -> Result<()> {
        let view = self.own_view(view)?;
        let _u = self.update.lock();
        let mut views = self.views.lock();
        let i = views
            .iter()
            .position(|v| v.has_view(view))
            .ok_or(Error::UnknownDirtyView { view })?;
        views[i].close(view);
        if views[i].views() == 0 {
            views.swap_remove(i).restore();
            self.views_open.fetch_sub(1, Ordering::Release);
        }
        Ok(())
    }

    /// Open views of slot `id` (0 for an unknown slot).
    pub fn dirty_views_open(&self, id: u16) -> usize {
        let views = self.views.lock();
        views
            .iter()
            .find(|v| v.slot() == id)
            .map_or(0, |v| v.views())
    }

    /// What `view`'s gets and clears did.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`], [`Error::ForeignDirtyView`].
    pub fn dirty_view_stats(&self, view: DirtyView) -> Result<DirtyViewStats> {
        let view = self.own_view(view)?;
        let mut views = self.views.lock();
        let v = views
            .iter_mut()
            .find(|v| v.has_view(view))
            .ok_or(Error::UnknownDirtyView { view })?;
        v.stats_mut(DirtyConsumer::View(view)).copied()
    }

    /// Copies `view`'s bitmap into `out` (bit 0 of word 0 is page 0 of its
    /// slot) without clearing it; returns the number of dirty pages.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`], [`Error::ForeignDirtyView`],
    /// [`Error::BitmapTooSmall`].
    pub fn get_dirty_view(&self, view: DirtyView, out: &mut [u64]) -> Result<u64> {
        let _u = self.update.lock();
        let id = self.view_slot(view)?;
        self.consumer_get(id, DirtyConsumer::View(view.id), out)
    }

    /// Clears `view`'s bits for the pages of `[first_page, first_page +
    /// num_pages)` set in `bitmap` (bit 0 of word 0 is `first_page`, as
    /// `KVM_CLEAR_DIRTY_LOG`), write-protects those of them that may be
    /// writable and flushes the slot's TLB entries once if it protected
    /// any; returns the number of pages cleared.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`], [`Error::ForeignDirtyView`],
    /// [`Error::ClearNotAligned`],
    /// [`Error::ClearBadRange`], [`Error::BitmapTooSmall`].
    pub fn clear_dirty_view(
        &self,
        view: DirtyView,
        first_page: u64,
        num_pages: u64,
        bitmap: &[u64],
    ) -> Result<u64> {
        let _u = self.update.lock();
        let id = self.view_slot(view)?;
        let b = self.bitmap(id)?;
        check_clear_args(first_page, num_pages, b.npages(), bitmap.len())?;
        let clears = [(DirtyConsumer::View(view.id), bitmap)];
        Ok(self.consumer_clear(id, first_page, num_pages, &clears)?[0])
    }

    /// [`Mmu::clear_dirty_view`] for several views of one slot at once, the
    /// same range for each, each with its own bitmap: one pass under the
    /// write lock, each page that may be writable protected once for all
    /// of them, one flush. Consumers whose harvests fall together (a
    /// snapshot every third round of a migration) clear this way so that
    /// no write lands between their clears; returns the pages cleared per
    /// view, in order.
    ///
    /// # Errors
    /// [`Error::UnknownDirtyView`], [`Error::ForeignDirtyView`],
    /// [`Error::DirtyViewsOfSeveralSlots`],
    /// [`Error::TooManyDirtyViews`] for more clears than a slot may have
    /// views, and [`Mmu::clear_dirty_view`]'s argument errors; nothing is
    /// cleared then.
    pub fn clear_dirty_views(
        &self,
        first_page: u64,
        num_pages: u64,
        clears: &[(DirtyView, &[u64])],
    ) -> Result<Vec<u64>> {
        let _u = self.update.lock();
        let Some(&(first, _)) = clears.first() else {
            return Ok(Vec::new());
        };
        let id = self.view_slot(first)?;
        if clears.len() > MAX_DIRTY_VIEWS_PER_SLOT {
            return Err(Error::TooManyDirtyViews {
                slot: u32::from(id),
                limit: MAX_DIRTY_VIEWS_PER_SLOT,
            });
        }
        let b = self.bitmap(id)?;
        let mut who = Vec::with_capacity(clears.len());
        for &(view, bitmap) in clears {
            let other = self.view_slot(view)?;
            if other != id {
                return Err(Error::DirtyViewsOfSeveralSlots {
                    slot: u32::from(id),
                    other: u32::from(other),
                });
            }
            check_clear_args(first_page, num_pages, b.npages(), bitmap.len())?;
            who.push((DirtyConsumer::View(view.id), bitmap));
        }
        self.consumer_clear(id, first_page, num_pages, &who)
    }

    /// The slot `view` looks at.
    fn view_slot(&self, view: DirtyView) -> Result<u16> {
        let view = self.own_view(view)?;
        let views = self.views.lock();
        views
            .iter()
            .find(|v| v.has_view(view))
            .map(|v| v.slot())
            .ok_or(Error::UnknownDirtyView { view })
    }

    /// `view`'s id, if this MMU opened it.
    fn own_view(&self, view: DirtyView) -> Result<u64> {
        if view.mmu != self.id {
            return Err(Error::ForeignDirtyView { view: view.id });
        }
        Ok(view.id)
    }

    /// Whether slot `id` has views open, so that its log is one consumer
    /// among several: one atomic load while no slot has any.
    pub(super) fn has_views(&self, id: u16) -> bool {
        self.views_open.load(Ordering::Acquire) != 0
            && self.views.lock().iter().any(|v| v.slot() == id)
    }

    /// GET for one consumer of slot `id` (the update mutex held): folds
    /// the shared bitmap (after scanning hardware dirty state into it) and
    /// copies the consumer's bitmap.
    pub(super) fn consumer_get(&self, id: u16, who: DirtyConsumer, out: &mut [u64]) -> Result<u64> {
        let b = self.bitmap(id)?;
        if out.len() < b.words() {
            return Err(Error::BitmapTooSmall {
                words: out.len(),
                needed: b.words(),
            });
        }
        self.strategy.sync(self, id, &b)?;
        let mut views = self.views.lock();
        let v = views_of(&mut views, id)?;
        v.fold();
        v.bits(who)?.copy_to(out)?;
        let n: u64 = out[..b.words()]
            .iter()
            .map(|w| u64::from(w.count_ones()))
            .sum();
        let st = v.stats_mut(who)?;
        st.gets += 1;
        st.reported += n;
        drop(views);
        self.bbm_report_clean();
        Ok(n)
    }

    /// The slot's own GET while it has views (the update mutex held): the
    /// log's bitmap; without manual protect also cleared and protected.
    pub(super) fn log_get_with_views(&self, id: u16, out: &mut [u64]) -> Result<u64> {
        let n = self.consumer_get(id, DirtyConsumer::Log, out)?;
        if !self.strategy.manual_protect() && n > 0 {
            let npages = self.bitmap(id)?.npages();
            let words = npages.div_ceil(64) as usize;
            self.consumer_clear(id, 0, npages, &[(DirtyConsumer::Log, &out[..words])])?;
        }
        Ok(n)
    }

    /// CLEAR for consumers of slot `id` at once (the update mutex held,
    /// the arguments checked): in 1 GiB chunks under the write lock, clears
    /// each consumer's bits and write-protects the cleared pages that may
    /// be writable, once for all of them (splitting first where bitmaps
    /// start all set with eager split, as [`Mmu::clear_dirty_log`]), then
    /// one flush if any was; returns the pages cleared per consumer.
    pub(super) fn consumer_clear(
        &self,
        id: u16,
        first_page: u64,
        num_pages: u64,
        clears: &[(DirtyConsumer, &[u64])],
    ) -> Result<Vec<u64>> {
        let (base, size) = self.slot_range(id)?;
        let tlb = self.with_table(|pt| pt.tlb().clone());
        let mut batch = TlbBatch::new(&*tlb, self.with_table(|pt| pt.tlb_policy()));
        let mut st = FaultStats::default();
        let mut cache = self.split_cache.lock();
        let mut views = self.views.lock();
        let v = views_of(&mut views, id)?;
        // Pages cleared and protected per consumer, and every word's clears
        // of this call (to undo if a later step fails, in any chunk).
        let mut counts = alloc::vec![(0u64, 0u64); clears.len()];
        let mut undo = Vec::new();
        let span = (first_page, num_pages);
        let done = self.clear_consumer_words(
            v,
            base,
            span,
            clears,
            &mut counts,
            &mut undo,
            &mut cache,
            &mut batch,
            &mut st,
        );
        if let Err(e) = done {
            // Nothing may be lost: the pages stay dirty for the consumers
            // and may-be-writable for everyone (those protected already
            // fault and log on their next write).
            for &(who, i, c, m) in &undo {
                v.undo_clear(who, i, c, m)?;
            }
            drop(views);
            drop(cache);
            batch.finish();
            return Err(e);
        }
        let flushed = counts.iter().any(|c| c.1 > 0);
        if flushed {
            batch.add(base, size);
        }
        for ((who, _), &(cleared, protected)) in clears.iter().zip(&counts) {
            let s = v.stats_mut(*who)?;
            s.cleared += cleared;
            s.protected += protected;
            s.already_protected += cleared - protected;
            s.flushes += u64::from(protected > 0);
        }
        drop(views);
        drop(cache);
        let calls = batch.finish();
        self.bbm_report_clean();
        self.count_clear_tlb_calls(calls);
        self.vm_stats.lock().add(&st);
        Ok(counts.into_iter().map(|c| c.0).collect())
    }

    /// The chunks of [`Mmu::consumer_clear`]: clears each word of `span`
    /// (first page, pages) for every consumer and protects what may be
    /// writable, recording each word's clears in `undo`.
    #[allow(clippy::too_many_arguments)]
    fn clear_consumer_words(
        &self,
        v: &SlotViews,
        base: u64,
        (first_page, num_pages): (u64, u64),
        clears: &[(DirtyConsumer, &[u64])],
        counts: &mut [(u64, u64)],
        undo: &mut Vec<(DirtyConsumer, usize, u64, u64)>,
        cache: &mut PageCache<M>,
        batch: &mut TlbBatch<'_>,
        st: &mut FaultStats,
    ) -> Result<()> {
        let words = num_pages.div_ceil(64) as usize;
        let first_word = (first_page / 64) as usize;
        let chunk_words = ((LOCK_CHUNK >> self.page_shift) as usize / 64).max(1);
        for w in (0..words).step_by(chunk_words) {
            let end = (w + chunk_words).min(words);
            if self.split_on_clear() {
                let bytes = ((end - w) as u64 * 64) << self.page_shift;
                cache.top_up(self.with_table(|pt| pt.split_capacity(bytes)))?;
            }
            let mut pt = self.write_lock(st);
            for k in w..end {
                let i = first_word + k;
                let mut mask = 0;
                for (j, (who, bm)) in clears.iter().enumerate() {
                    undo.try_reserve(1).map_err(|_| Error::OutOfMemory)?;
                    let (c, m) = v.clear_word(*who, i, bm.get(k).copied().unwrap_or(0))?;
                    counts[j].0 += u64::from(c.count_ones());
                    counts[j].1 += u64::from(m.count_ones());
                    if c != 0 {
                        undo.push((*who, i, c, m));
                    }
                    mask |= m;
                }
                if mask != 0 {
                    let page0 = i as u64 * 64;
                    st.split_ns +=
                        self.protect_cleared(&mut pt, base, page0, mask, cache, batch)?;
                }
            }
        }
        Ok(())
    }

    /// Drops the views of slots that stopped logging (or whose bitmap was
    /// replaced): their ids become unknown.
    pub(super) fn drop_stale_views(&self) {
        let mut views = self.views.lock();
        let before = views.len();
        views.retain(|v| {
            self.side
                .get(usize::from(v.slot()))
                .and_then(|s| s.dirty.load_full())
                .is_some_and(|b| Arc::ptr_eq(&b, v.shared()))
        });
        let dropped = (before - views.len()) as u64;
        self.views_open.fetch_sub(dropped, Ordering::Release);
    }

    /// Whether clears split what they protect: KVM splits on CLEAR where
    /// enabling logging split nothing (initially-set bitmaps) and faults
    /// would not: with eager split, and with hardware dirty state, whose
    /// writes never fault (a block left whole would be logged whole).
    pub(super) fn split_on_clear(&self) -> bool {
        self.initially_set() && self.strategy.splits_on_clear(self.policy.eager_split_chunk)
    }

    /// Write-protects the pages of `mask` (bit i = page `page0 + i` of the
    /// slot at `base`), splitting their range first where
    /// [`Self::split_on_clear`]; returns the nanoseconds spent splitting.
    fn protect_cleared(
        &self,
        pt: &mut PageTable<F, M>,
        base: u64,
        page0: u64,
        mask: u64,
        cache: &mut PageCache<M>,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        let mut ns = 0;
        if self.split_on_clear() {
            let lo = base + ((page0 + u64::from(mask.trailing_zeros())) << self.page_shift);
            let hi = base + ((page0 + 64 - u64::from(mask.leading_zeros())) << self.page_shift);
            let t0 = Stopwatch::<P::Clock>::start();
            pt.split(lo, hi - lo, cache, self.policy.split_walk)?;
            ns = t0.elapsed_ns();
        }
        self.protect_mask(pt, base, page0, mask, batch)?;
        Ok(ns)
    }
}

/// The views of slot `id`, or [`Error::LoggingDisabled`] when it has none.
fn views_of(views: &mut [SlotViews], id: u16) -> Result<&mut SlotViews> {
    views
        .iter_mut()
        .find(|v| v.slot() == id)
        .ok_or(Error::LoggingDisabled {
            slot: u32::from(id),
        })
}
