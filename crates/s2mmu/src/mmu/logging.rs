//! Memslot changes and dirty logging turned on and off: write protection
//! of a slot, the eager split when logging starts, huge pages
//! recovered when it stops.

use super::*;

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// `KVM_SET_USER_MEMORY_REGION`: creates, deletes, moves or changes
    /// the flags of a slot. `host_page_size` is the page size of the host
    /// memory behind it (the largest stage-2 mapping a fault may install).
    /// Turning `LOG_DIRTY_PAGES` on or off enables or disables dirty logging
    /// as [`Mmu::enable_dirty_logging`] describes.
    ///
    /// # Errors
    /// [`Error::Memslot`] with KVM's validation; [`Error::InvalidConfig`]
    /// for a host page size that is not a power of two of at least a page;
    /// [`Error::OutOfMemory`] when a logged slot's bitmap cannot be
    /// allocated; [`Error::Memslot`] with
    /// [`crate::memslot::MemslotError::SnapshotHeld`] when this thread holds
    /// a snapshot of the memslots. Nothing is changed then.
    pub fn set_memory_region(
        &self,
        region: &UserMemoryRegion,
        host_page_size: u64,
    ) -> Result<MemslotChange> {
        self.check_region(region, host_page_size)?;
        let _u = self.update.lock();
        let id = usize::from(region.id());
        let was_logging = self
            .slots
            .snapshot()
            .id_to_slot(region.id())
            .is_some_and(|s| s.dirty_logging());
        let logging =
            region.flags & SlotFlags::LOG_DIRTY_PAGES.bits() != 0 && region.memory_size != 0;
        // A bitmap must exist before a fault can see the slot logging. It is
        // only built for a request the store can accept (an id with a side
        // entry, a size within the slot limit): a bad request must fail with
        // the store's error, not index out of `side` or allocate a bitmap for
        // an absurd size first.
        let plausible = self.side.get(id).is_some()
            && region.memory_size >> self.page_shift <= self.slots.config().max_npages;
        let new_bitmap = if logging && !was_logging && plausible && self.strategy.bitmaps().is_ok()
        {
            Some(Arc::new(DirtyBitmap::try_for_slot(
                u32::from(region.id()),
                region.memory_size >> self.page_shift,
                self.initially_set(),
            )?))
        } else {
            None
        };
        let prev_host_page = self
            .side
            .get(id)
            .map(|s| s.host_page.load(Ordering::Relaxed));
        if let (Some(side), Some(b)) = (self.side.get(id), &new_bitmap) {
            side.dirty.store(Some(b.clone()));
        }
        let change = match self.slots.set_memory_region(
            region,
            &Stage2Hook {
                mmu: self,
                id: region.id(),
            },
        ) {
            Ok(c) => c,
            Err(e) => {
                if let (Some(side), Some(_)) = (self.side.get(id), &new_bitmap) {
                    side.dirty.store(None);
                }
                return Err(e.into());
            }
        };
        let side = self
            .side
            .get(id)
            .expect("the store accepted the id, so it is below max_user_slots, the length of side");
        self.update_side(side, change, host_page_size, prev_host_page, logging);
        // The store has changed: from here on nothing may fail, or the call
        // would return an error with the state changed. Both steps below are
        // best effort where they need memory (an eager split, a huge-page
        // recovery: optimisations whose failure is counted, not an error),
        // and their other errors cannot happen for a slot the store holds.
        if logging && !was_logging && change != MemslotChange::Create {
            self.start_logging(region.id())?;
        } else if !logging && was_logging && change == MemslotChange::FlagsOnly {
            // `update_side` dropped the bitmap.
            if self.recover_huge_pages(region.id()).is_err() {
                self.vm_stats.lock().recovery_failures += 1;
            }
        }
        Ok(change)
    }

    /// The checks the memslot store does not make: the host page size, and
    /// a guest range inside the IPA space (the store accepts any; the table
    /// cannot map beyond it, so such a slot is refused here, before anything
    /// changes, not at its first fault).
    fn check_region(&self, region: &UserMemoryRegion, host_page_size: u64) -> Result<()> {
        let page = 1u64 << self.page_shift;
        if !host_page_size.is_power_of_two() || host_page_size < page {
            return Err(Error::InvalidConfig {
                what: "host page size",
                value: host_page_size,
            });
        }
        let limit = self.stage2.config.ipa_limit;
        let end = region.guest_phys_addr.raw().checked_add(region.memory_size);
        if region.memory_size != 0 && end.is_none_or(|end| end > limit) {
            return Err(Error::OutOfRange {
                ipa: region.guest_phys_addr.raw(),
                size: region.memory_size,
                limit,
            });
        }
        Ok(())
    }

    /// The MMU's side of a slot after an accepted change: the host page
    /// size, and no bitmap where the slot no longer logs (a delete, a move
    /// or a flags change alike, so no stale log survives).
    fn update_side(
        &self,
        side: &SlotSide<P>,
        change: MemslotChange,
        host_page_size: u64,
        prev_host_page: Option<u64>,
        logging: bool,
    ) {
        let page = 1u64 << self.page_shift;
        match change {
            MemslotChange::Create => side.host_page.store(host_page_size, Ordering::Relaxed),
            MemslotChange::Delete => side.host_page.store(page, Ordering::Relaxed),
            MemslotChange::Move | MemslotChange::FlagsOnly => {
                if let Some(p) = prev_host_page {
                    side.host_page.store(p.max(page), Ordering::Relaxed);
                }
            }
        }
        if !logging {
            side.dirty.store(None);
            self.drop_stale_views();
        }
    }

    pub(super) fn initially_set(&self) -> bool {
        self.strategy.initially_set()
    }

    /// Slot range in bytes.
    pub(super) fn slot_range(&self, id: u16) -> Result<(u64, u64)> {
        let snap = self.slots.snapshot();
        let s = snap.id_to_slot(id).ok_or(Error::no_such_slot(id))?;
        Ok((
            s.base_gfn().raw() << self.page_shift,
            s.npages() << self.page_shift,
        ))
    }

    /// Turns dirty logging on for slot `id` (a flags change).
    ///
    /// Unless bitmaps start all set, the slot's huge mappings are split
    /// first when eager split is on (in chunks: the cache is topped up and
    /// the lock dropped between chunks), then the whole slot is
    /// write-protected (in 1 GiB chunks) and its TLB entries flushed.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], [`Error::Memslot`].
    pub fn enable_dirty_logging(&self, id: u16) -> Result<()> {
        let region = self.region_of(id, true)?;
        let host_page = self.side[usize::from(id)].host_page.load(Ordering::Relaxed);
        self.set_memory_region(&region, host_page).map(|_| ())
    }

    /// Turns dirty logging off for slot `id`: later faults map huge pages
    /// again (and, as [`MmuPolicy::huge_page_recovery`] says, page mappings
    /// of huge-page-backed regions are dropped so they fault back as
    /// blocks, or collapsed into blocks in place).
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], [`Error::Memslot`].
    pub fn disable_dirty_logging(&self, id: u16) -> Result<()> {
        let region = self.region_of(id, false)?;
        let host_page = self.side[usize::from(id)].host_page.load(Ordering::Relaxed);
        self.set_memory_region(&region, host_page).map(|_| ())
    }

    pub(super) fn region_of(&self, id: u16, logging: bool) -> Result<UserMemoryRegion> {
        let snap = self.slots.snapshot();
        let s = snap.id_to_slot(id).ok_or(Error::no_such_slot(id))?;
        let mut flags = s.flags().bits() & SlotFlags::USER_MASK;
        if logging {
            flags |= SlotFlags::LOG_DIRTY_PAGES.bits();
        } else {
            flags &= !SlotFlags::LOG_DIRTY_PAGES.bits();
        }
        Ok(UserMemoryRegion::new(
            id,
            SlotFlags::from_bits(flags),
            // Validation kept the slot's guest range within 64 bits.
            Gpa::new(s.base_gfn().raw() << self.page_shift),
            s.npages() << self.page_shift,
            s.userspace_addr(),
        ))
    }

    pub(super) fn start_logging(&self, id: u16) -> Result<()> {
        if self.initially_set() {
            return Ok(());
        }
        let (base, size) = self.slot_range(id)?;
        if let Some(chunk) = self.strategy.split_chunk(self.policy.eager_split_chunk) {
            // Best effort, as KVM's eager split: the memslot change has
            // happened, and a block left unsplit (out of table memory) is
            // still logged correctly (split on its first write fault, or
            // logged whole in hardware dirty state), so the change must not
            // fail now. The failure is counted, not hidden.
            if self.split_range(base, size, chunk).is_err() {
                self.vm_stats.lock().eager_split_failures += 1;
            }
        }
        // Cannot fail: the slot lies inside the IPA space (checked when it
        // was made), the only thing a write-protect walk checks.
        self.wrprotect_range(base, size)
    }

    /// Logging stopped on slot `id`: gets its huge mappings back
    /// ([`MmuPolicy::huge_page_recovery`]), by unmapping page-mapped blocks
    /// or collapsing them in place.
    ///
    /// # Errors
    /// The table's error if an unmap or collapse fails; the slot is then
    /// partly recovered and still correct (the rest stays mapped as pages).
    pub(super) fn recover_huge_pages(&self, id: u16) -> Result<()> {
        if self.policy.huge_page_recovery == HugePageRecovery::Off {
            return Ok(());
        }
        let host_page = self.side[usize::from(id)].host_page.load(Ordering::Relaxed);
        let (base, size) = self.slot_range(id)?;
        let snap = self.slots.snapshot();
        let slot = snap.id_to_slot(id);
        let hva = slot.map(|s| s.userspace_addr().raw()).unwrap_or(0);
        let readonly = slot.is_some_and(|s| s.flags().contains(SlotFlags::READONLY));
        drop(snap);
        let block = self.block_size_for(host_page);
        if block <= 1 << self.page_shift || (base ^ hva) & (block - 1) != 0 {
            return Ok(());
        }
        if self.policy.huge_page_recovery == HugePageRecovery::Collapse {
            let prot = if readonly {
                Prot::R | Prot::X
            } else {
                Prot::RWX
            };
            return self.collapse_range(base, size, block, prot);
        }
        // Drop the page mappings of every block-aligned region inside the
        // slot; faults map them back as blocks.
        let first = base.next_multiple_of(block);
        let mut a = first;
        let mut st = FaultStats::default();
        while a + block <= base + size {
            let mut pt = self.write_lock(&mut st);
            let leaves = pt.leaves(a, block)?;
            if leaves.iter().any(|l| l.size < block) {
                pt.unmap(a, block)?;
            }
            drop(pt);
            a += block;
        }
        self.vm_stats.lock().add(&st);
        Ok(())
    }

    /// Huge pages back in place ([`HugePageRecovery::Collapse`]): collapses
    /// `[base, base + size)` chunk by chunk under the write lock, one
    /// whole-VMID invalidation per chunk and block level.
    fn collapse_range(&self, base: u64, size: u64, block: u64, prot: Prot) -> Result<()> {
        let mut st = FaultStats::default();
        let mut a = base;
        while a < base + size {
            let n = (((a / LOCK_CHUNK) + 1) * LOCK_CHUNK).min(base + size) - a;
            let mut pt = self.write_lock(&mut st);
            let c = pt.collapse(a, n, block, prot)?;
            drop(pt);
            st.collapsed += c.blocks;
            a += n;
        }
        self.vm_stats.lock().add(&st);
        Ok(())
    }

    /// The largest block the format allows that is not larger than `host_page`.
    pub(super) fn block_size_for(&self, host_page: u64) -> u64 {
        self.stage2.reader.format().page_size().max(
            self.leaf_sizes()
                .into_iter()
                .filter(|&g| g <= host_page)
                .max()
                .unwrap_or(0),
        )
    }

    pub(super) fn leaf_sizes(&self) -> Vec<u64> {
        let f = self.stage2.reader.format();
        (f.start_level()..=f.last_level())
            .filter(|&l| f.leaf_allowed(l))
            .map(|l| f.granule(l))
            .collect()
    }

    /// Splits every huge mapping in `[base, base + size)` chunk by chunk,
    /// dropping the lock between chunks.
    pub(super) fn split_range(&self, base: u64, size: u64, chunk: u64) -> Result<()> {
        let mut st = FaultStats::default();
        let mut cache = self.split_cache.lock();
        let mut a = base;
        while a < base + size {
            let next = ((a / chunk) + 1) * chunk;
            let n = next.min(base + size) - a;
            let capacity = self.with_table(|pt| pt.split_capacity(n));
            cache.top_up(capacity)?;
            let mut pt = self.write_lock(&mut st);
            let t0 = Stopwatch::<P::Clock>::start();
            pt.split(a, n, &mut cache, self.policy.split_walk)?;
            st.split_ns += t0.elapsed_ns();
            drop(pt);
            a += n;
        }
        self.vm_stats.lock().add(&st);
        Ok(())
    }

    /// Write-protects `[base, base + size)` in 1 GiB chunks and flushes the
    /// range once.
    pub(super) fn wrprotect_range(&self, base: u64, size: u64) -> Result<()> {
        let mut st = FaultStats::default();
        let tlb = self.stage2.tlb.clone();
        let policy = self.with_table(|pt| pt.tlb_policy());
        let mut batch = TlbBatch::new(&*tlb, policy);
        let chunk = LOCK_CHUNK;
        let mut a = base;
        while a < base + size {
            let n = (((a / chunk) + 1) * chunk).min(base + size) - a;
            let mut pt = self.write_lock(&mut st);
            self.strategy.protect_range(&mut pt, a, n, &mut batch)?;
            drop(pt);
            a += n;
        }
        batch.finish();
        self.vm_stats.lock().add(&st);
        Ok(())
    }
}
