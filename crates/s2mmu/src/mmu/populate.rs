//! Mapping and dirtying a slot without vCPUs, for benchmarks and tests.
//!
//! [`Mmu::populate`] maps a range of a memslot with last-level pages the way
//! faults would, but in one pass and without touching guest memory (like
//! `KVM_PRE_FAULT_MEMORY`): the table only records the host addresses, so a
//! slot can be backed by reserved, never-touched address space.
//! [`Mmu::dirty_pages`] does what a guest write's permission fault does to a
//! logged page (make it writable, mark it dirty), page by page.
//! `Mmu::set_tlb_large_range` (the `baselines` feature) switches the large-range TLB policy of a
//! live MMU, so one process can measure both sides of the TLB range policy.

use super::{FaultStats, Mmu};
use crate::format::{Prot, PteFormat};
use crate::memcache::PageCache;
use crate::memslot::{MemslotStore, SlotLookup};
use crate::ops::MapOptions;
use crate::sync::{ArcOptionCell, Platform};
use crate::table::MmOps;
#[cfg(feature = "baselines")]
use crate::tlb::LargeRangePolicy;
use crate::tlb::TlbPolicy;
use crate::{Error, Hva, Result};

/// Bytes mapped per hold of the write lock in [`Mmu::populate`].
const POPULATE_CHUNK: u64 = 1 << 30;

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// Maps pages `[first_page, first_page + npages)` of slot `id` with
    /// last-level pages, to the slot's host addresses, without touching
    /// them. Pages of a logged slot are mapped read-only (their first write
    /// faults, as after a fault on a read); others read-write-execute.
    /// Works in 1 GiB chunks, topping the page cache up and dropping the
    /// lock between them. Returns the number of pages mapped.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`]; [`Error::OutOfRange`] for pages beyond the
    /// slot; [`Error::AlreadyMapped`] if a page in the range is mapped;
    /// [`Error::Again`] while the host invalidates part of the range
    /// ([`Mmu::invalidate_hva_range_start`]); [`Error::OutOfMemory`]. The
    /// pages this call mapped before the error are unmapped again.
    ///
    /// `first_page` is a page offset within the slot, not an address (hence
    /// a bare `u64`): the gfn is the slot's base gfn plus it.
    pub fn populate(&self, id: u16, first_page: u64, npages: u64) -> Result<u64> {
        let _u = self.update.lock();
        let snap = self.slots.snapshot();
        let slot = snap.id_to_slot(id).ok_or(Error::no_such_slot(id))?;
        let shift = self.page_shift;
        if !slot.holds_pages(first_page, npages) {
            return Err(Error::OutsideSlot {
                slot: u32::from(id),
                first_page,
                pages: npages,
                slot_pages: slot.npages(),
            });
        }
        let base = (slot.base_gfn().raw() + first_page) << shift;
        let hva = slot.userspace_addr().raw() + (first_page << shift);
        let prot = if slot.dirty_logging() {
            Prot::R | Prot::X
        } else {
            Prot::RWX
        };
        drop(snap);
        let size = npages << shift;
        let mut st = FaultStats::default();
        let mut cache = self.split_cache.lock();
        let mut done = 0;
        let mapped = self.populate_chunks(base, hva, size, prot, &mut st, &mut cache, &mut done);
        if let Err(e) = mapped {
            // Take back what this call mapped, `[base, base + done)`: every
            // page of it was unmapped before (a mapped one stops the call),
            // and unmapping whole pages needs no memory.
            if done > 0 {
                let mut pt = self.write_lock(&mut st);
                if let Err(u) = pt.unmap(base, done) {
                    unreachable!("unmapping pages just mapped at {base:#x}+{done:#x}: {u}");
                }
            }
            self.vm_stats.lock().add(&st);
            return Err(e);
        }
        self.vm_stats.lock().add(&st);
        Ok(npages)
    }

    /// The chunks of [`Mmu::populate`]; `done` counts the bytes mapped from
    /// `base` on, for the caller to take back on an error.
    #[allow(clippy::too_many_arguments)]
    fn populate_chunks(
        &self,
        base: u64,
        hva: u64,
        size: u64,
        prot: Prot,
        st: &mut FaultStats,
        cache: &mut PageCache<M>,
        done: &mut u64,
    ) -> Result<()> {
        let shift = self.page_shift;
        let levels = (self.stage2.reader.format().last_level()
            - self.stage2.reader.format().start_level()) as usize;
        while *done < size {
            let n = POPULATE_CHUNK.min(size - *done);
            let need = self.with_table(|pt| pt.split_capacity(n)) + levels + 1;
            cache.top_up(need)?;
            // The host backs the chunk contiguously (the identity), or
            // page by page.
            let contiguous = self.host.host_to_phys(Hva::new(hva + *done), n);
            let mut pt = self.write_lock(st);
            if self.hva_invalidating(hva + *done, n) {
                // The host is changing what backs part of the chunk.
                return Err(Error::Again { ipa: base + *done });
            }
            let opts = MapOptions { force_pages: true };
            if let Some(pa) = contiguous {
                pt.map(base + *done, n, pa.raw(), prot, cache, opts)?;
                *done += n;
            } else {
                let page = 1u64 << shift;
                let end = *done + n;
                while *done < end {
                    let hva = hva + *done;
                    let pa = self.host.host_to_phys(Hva::new(hva), page);
                    let pa = pa.ok_or(Error::Unbacked { hva: Hva::new(hva) })?;
                    pt.map(base + *done, page, pa.raw(), prot, cache, opts)?;
                    *done += page;
                }
            }
            drop(pt);
        }
        Ok(())
    }

    /// Does to each page of slot `id` in `pages` (page offsets in the slot)
    /// what a guest write's fault does: makes its mapping writable and, if
    /// the slot is logged, marks it dirty. Pages that are not mapped are
    /// skipped. Returns the number of pages newly marked dirty.
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`]; [`Error::OutsideSlot`] for a page beyond the
    /// slot (checked before any page is touched: nothing is changed then).
    ///
    /// `pages` are page offsets within the slot, not addresses (hence bare
    /// `u64`s), as in a dirty bitmap or a ring entry.
    pub fn dirty_pages<I>(&self, id: u16, pages: I) -> Result<u64>
    where
        I: IntoIterator<Item = u64>,
        I::IntoIter: Clone,
    {
        let pages = pages.into_iter();
        let snap = self.slots.snapshot();
        let slot = snap.id_to_slot(id).ok_or(Error::no_such_slot(id))?;
        let (base_gfn, npages, logging) =
            (slot.base_gfn().raw(), slot.npages(), slot.dirty_logging());
        // `snap` is held to the end, as a fault holds it: see handle_fault.
        let shift = self.page_shift;
        let bitmap = if logging && self.strategy.bitmaps().is_ok() {
            self.side[usize::from(id)].dirty.load_full()
        } else {
            None
        };
        // Every page checked before any is touched.
        if let Some(p) = pages.clone().find(|&p| p >= npages) {
            return Err(Error::OutsideSlot {
                slot: u32::from(id),
                first_page: p,
                pages: 1,
                slot_pages: npages,
            });
        }
        let wbit = self.stage2.reader.format().write_bit();
        let mut st = FaultStats::default();
        let pt = self.read_lock(&mut st, None);
        let mut dirtied = 0;
        for p in pages {
            let o = match pt.relax_perms((base_gfn + p) << shift, Prot::RW) {
                Ok(o) => o,
                Err(Error::NotMapped { .. }) => continue,
                Err(e) => return Err(e),
            };
            if o.became_writable(wbit) {
                if let Some(b) = &bitmap {
                    dirtied += u64::from(b.mark(p));
                }
            }
        }
        drop(pt);
        self.vm_stats.lock().add(&st);
        Ok(dirtied)
    }

    /// Switches how range invalidations above the page limit are issued
    /// (`limit_pages` is the limit, at least 1) from now on, for a
    /// benchmark that measures both policies on one MMU (the `baselines`
    /// feature only: the other policy is a baseline).
    /// [`Mmu::policy`] keeps reporting the policy the MMU was created with.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a zero limit.
    #[cfg(feature = "baselines")]
    pub fn set_tlb_large_range(
        &self,
        large_range: LargeRangePolicy,
        limit_pages: u64,
    ) -> Result<()> {
        if limit_pages == 0 {
            return Err(Error::InvalidConfig {
                what: "TLB range limit in pages",
                value: 0,
            });
        }
        let mut st = FaultStats::default();
        let mut pt = self.write_lock(&mut st);
        pt.set_tlb_policy(TlbPolicy {
            limit_pages,
            large_range,
            page_shift: self.page_shift,
        });
        Ok(())
    }

    /// The TLB policy the table uses now.
    pub fn tlb_policy(&self) -> TlbPolicy {
        self.with_table(|pt| pt.tlb_policy())
    }
}
