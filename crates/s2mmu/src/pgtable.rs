//! The stage-2 page table: its root, its lockless reader, tear-down.
//!
//! This level takes and returns bare `u64` addresses (IPAs in, output
//! addresses out), as aarch64-paging's table does below its typed API: it
//! is the low-level table the facade ([`crate::mmu::Mmu`]) drives, its
//! callers do address arithmetic on every call (alignment, block bases,
//! level strides), and it has one kind of input and one of output, so a mixed
//! up argument is an IPA-versus-size slip that types would not catch. The
//! facade's public API, where guest-physical, frame, host-virtual and
//! physical addresses meet, uses [`crate::addr`]'s types.

use crate::format::{Prot, PteFormat};
use crate::table::{entry_ref, MmOps};
use crate::tlb::{TlbInvalidate, TlbPolicy};
use crate::walk::{self, Visit, VisitCtx, Visitor, WalkAction, WalkFlags, WalkStats};
use crate::{Error, Result};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

/// What a table and its lockless readers share: the format, the allocator
/// and the root. The root is freed when the last of them goes.
static NEXT_TABLE_ID: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

pub(crate) struct TableCore<F: PteFormat, M: MmOps> {
    pub(crate) fmt: F,
    pub(crate) mm: M,
    pub(crate) root: u64,
    /// Unique among the process's tables: brands handles tied to this one
    /// ([`TableReader::table_id`]).
    pub(crate) id: u64,
}

impl<F: PteFormat, M: MmOps> Drop for TableCore<F, M> {
    fn drop(&mut self) {
        crate::bbm::teardown(self.mm.phys_to_virt(self.root) as usize, true);
        // SAFETY: allocated in `PageTable::new` with the same count; the
        // owning table tore down every child, and this is the last handle.
        unsafe { self.mm.free_pages_exact(self.root, self.fmt.root_pages()) };
    }
}

/// A stage-2 page table.
///
/// Operations that need exclusive access (map, unmap, write-protect, split;
/// the MMU lock held for writing) take `&mut self`; those that are safe
/// alongside each other (the fault path under the read lock: shared map,
/// permission relaxation, access flag) take `&self` and update entries by
/// compare-and-swap. [`TableReader`] walks the table without any lock, as a
/// hardware walker (or a vCPU's software TLB) does.
pub struct PageTable<F: PteFormat, M: MmOps> {
    pub(crate) core: Arc<TableCore<F, M>>,
    pub(crate) tlb: Arc<dyn TlbInvalidate>,
    pub(crate) tlb_policy: TlbPolicy,
}

/// The translation of one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Output address of the translated address (not of the leaf's start).
    pub pa: u64,
    /// Level of the leaf that maps it.
    pub level: u32,
    /// Bytes the leaf maps.
    pub size: u64,
    /// The leaf entry.
    pub pte: u64,
    /// The leaf's permissions.
    pub prot: Prot,
}

/// One valid leaf, as listed by [`PageTable::leaves`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// First address it maps.
    pub ipa: u64,
    /// Bytes it maps.
    pub size: u64,
    /// Output address of its first byte.
    pub pa: u64,
    /// Level.
    pub level: u32,
    /// Permissions.
    pub prot: Prot,
    /// The raw entry.
    pub pte: u64,
}

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// An empty table for `fmt`, with pages from `mm`, issuing invalidations
    /// to `tlb`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `mm`'s page size is not the format's
    /// granule; [`Error::OutOfMemory`] if the root cannot be allocated.
    pub fn new(fmt: F, mm: M, tlb: Arc<dyn TlbInvalidate>) -> Result<Self> {
        if mm.page_size() as u64 != fmt.page_size() {
            return Err(Error::InvalidConfig {
                what: "allocator page size (must equal the granule)",
                value: mm.page_size() as u64,
            });
        }
        let root = mm
            .zalloc_pages_exact(fmt.root_pages())
            .ok_or(Error::OutOfMemory)?;
        let tlb_policy = TlbPolicy::new(fmt.page_shift());
        let tlb = crate::tlb::traced::traced(mm.phys_to_virt(root) as usize, tlb);
        Ok(PageTable {
            core: Arc::new(TableCore {
                fmt,
                mm,
                root,
                id: NEXT_TABLE_ID.fetch_add(1, core::sync::atomic::Ordering::Relaxed),
            }),
            tlb,
            tlb_policy,
        })
    }

    /// The table's id in the break-before-make monitor ([`crate::bbm`]):
    /// where its root lives in this process, unique while the table does.
    pub fn bbm_id(&self) -> usize {
        self.core.mm.phys_to_virt(self.core.root) as usize
    }

    /// The descriptor format.
    pub fn format(&self) -> &F {
        &self.core.fmt
    }

    /// The table-page allocator.
    pub fn mm(&self) -> &M {
        &self.core.mm
    }

    /// The invalidation backend.
    pub fn tlb(&self) -> &Arc<dyn TlbInvalidate> {
        &self.tlb
    }

    /// How range invalidations are issued.
    pub fn tlb_policy(&self) -> TlbPolicy {
        self.tlb_policy
    }

    /// Sets how range invalidations are issued. The policy's `page_shift` is
    /// the table's own page size whatever the caller put there: it is a
    /// property of the format, and a wrong one would miscount pages (or, at
    /// 64 and above, overflow the shift).
    pub fn set_tlb_policy(&mut self, policy: TlbPolicy) {
        self.tlb_policy = TlbPolicy {
            page_shift: self.core.fmt.page_shift(),
            ..policy
        };
    }

    /// Physical address of the root (what VTTBR_EL2.BADDR would hold).
    pub fn root_pa(&self) -> u64 {
        self.core.root
    }

    /// A handle that translates addresses without taking any lock.
    pub fn reader(&self) -> TableReader<F, M> {
        TableReader {
            core: self.core.clone(),
        }
    }

    /// Translates `ipa` (see [`TableReader::translate`]).
    pub fn translate(&self, ipa: u64) -> Option<Translation> {
        translate(&self.core, ipa)
    }

    /// Walks `[ipa, ipa + size)` exclusively with `visitor`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] or the first error of the visitor.
    pub fn walk<V: Visitor<F, M>>(
        &mut self,
        ipa: u64,
        size: u64,
        flags: WalkFlags,
        visitor: &mut V,
    ) -> Result<WalkStats> {
        let flags = WalkFlags(flags.0 & !WalkFlags::SHARED.0);
        // SAFETY: `&mut self` gives exclusive access to the table's entries
        // (lockless readers only read, and freed tables are deferred).
        unsafe { self.walk_unchecked(ipa, size, flags, visitor) }
    }

    /// Walks `[ipa, ipa + size)` alongside other shared walkers (under the
    /// MMU lock for reading). A visitor outside the engine only reads; the
    /// engine's own visitors update entries by compare-and-swap.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] or the first error of the visitor.
    pub fn walk_shared<V: Visitor<F, M>>(
        &self,
        ipa: u64,
        size: u64,
        flags: WalkFlags,
        visitor: &mut V,
    ) -> Result<WalkStats> {
        let flags = flags | WalkFlags::SHARED;
        // SAFETY: shared walks update entries only by compare-and-swap, and
        // any table they unlink is freed through the deferred path.
        unsafe { self.walk_unchecked(ipa, size, flags, visitor) }
    }

    /// # Safety
    /// The caller upholds [`walk::walk`]'s contract for `flags`.
    pub(crate) unsafe fn walk_unchecked<V: Visitor<F, M>>(
        &self,
        ipa: u64,
        size: u64,
        flags: WalkFlags,
        visitor: &mut V,
    ) -> Result<WalkStats> {
        let c = &*self.core;
        // SAFETY: forwarded.
        unsafe { walk::walk(&c.fmt, &c.mm, c.root, ipa, size, flags, visitor) }
    }

    /// Checks that `[ipa, ipa + size)` is a non-empty, page-aligned range
    /// inside the IPA space.
    ///
    /// # Errors
    /// [`Error::Misaligned`], [`Error::EmptyRange`] or [`Error::OutOfRange`].
    pub fn check_range(&self, ipa: u64, size: u64) -> Result<()> {
        let fmt = &self.core.fmt;
        let page = fmt.page_size();
        if ipa & (page - 1) != 0 {
            return Err(Error::Misaligned {
                what: "ipa",
                value: ipa,
                align: page,
            });
        }
        if size & (page - 1) != 0 {
            return Err(Error::Misaligned {
                what: "size",
                value: size,
                align: page,
            });
        }
        let end = ipa.checked_add(size);
        if size == 0 || end.is_none() {
            return Err(Error::EmptyRange { ipa, size });
        }
        let limit = fmt.ipa_limit();
        if end.is_some_and(|e| e > limit) {
            return Err(Error::OutOfRange { ipa, size, limit });
        }
        Ok(())
    }

    /// The entry a hardware walk of `ipa` ends at: its level and value, a
    /// valid leaf or an invalid entry (what a translation fault at that
    /// level reports, as KVM's `kvm_pgtable_get_leaf`).
    ///
    /// # Errors
    /// As [`PageTable::check_range`] for the page holding `ipa`.
    pub fn lookup(&self, ipa: u64) -> Result<(u32, u64)> {
        let page = self.format().page_size();
        self.check_range(ipa & !(page - 1), page)?;
        let mut out = None;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            out.get_or_insert((ctx.level, ctx.old));
            Ok(WalkAction::Continue)
        };
        // SAFETY: a read-only walk; the read guard it pins keeps tables alive
        // against concurrent unlinking.
        unsafe {
            self.walk_unchecked(
                ipa & !(page - 1),
                page,
                WalkFlags::LEAF | WalkFlags::SHARED,
                &mut v,
            )?
        };
        out.ok_or(Error::NotMapped { ipa })
    }

    /// Every valid leaf that overlaps `[ipa, ipa + size)`, in address order.
    ///
    /// # Errors
    /// As [`PageTable::check_range`].
    pub fn leaves(&self, ipa: u64, size: u64) -> Result<Vec<Leaf>> {
        self.check_range(ipa, size)?;
        let mut out = Vec::new();
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if ctx.fmt.is_valid(ctx.old) {
                out.push(Leaf {
                    ipa: ctx.entry_start(),
                    size: ctx.granule(),
                    pa: ctx.fmt.output_address(ctx.old),
                    level: ctx.level,
                    prot: ctx.fmt.prot(ctx.old),
                    pte: ctx.old,
                });
            }
            Ok(WalkAction::Continue)
        };
        // SAFETY: a read-only walk; the read guard it pins keeps tables alive
        // against concurrent unlinking.
        unsafe { self.walk_unchecked(ipa, size, WalkFlags::LEAF | WalkFlags::SHARED, &mut v)? };
        Ok(out)
    }

    /// Number of non-root table pages reachable from the root.
    pub fn table_pages(&self) -> usize {
        let mut n = 0usize;
        let mut v = |_: &VisitCtx<'_, F, M>, _: Visit| {
            n += 1;
            Ok(WalkAction::Continue)
        };
        let limit = self.core.fmt.ipa_limit();
        // SAFETY: read-only walk under a read guard.
        let walked = unsafe {
            self.walk_unchecked(0, limit, WalkFlags::TABLE_PRE | WalkFlags::SHARED, &mut v)
        };
        // A walk of the whole IPA space whose visitor never fails cannot.
        walked.expect("counting walk over the IPA space");
        n
    }

    /// Checks that every non-root table's entry count equals its number of
    /// non-zero entries and that no table is empty; returns the number of
    /// tables checked. For tests and debugging.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first inconsistency found.
    pub fn check_counts(&self) -> Result<usize> {
        let mut checked = 0usize;
        let entries = self.core.fmt.entries_per_table();
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            let child = ctx.child_table().expect("table-pre visits are tables");
            let mut nonzero = 0u32;
            for i in 0..entries {
                // SAFETY: a live child table (read guard held), i in bounds.
                let e = unsafe { entry_ref(ctx.mm, child, i) }.load(Ordering::Acquire);
                nonzero += (e != 0) as u32;
            }
            let count = ctx.mm.entry_count(child).load(Ordering::Acquire);
            checked += 1;
            if count != nonzero {
                return Err(Error::InvalidConfig {
                    what: "table entry count differs from its non-zero entries",
                    value: ctx.entry_start(),
                });
            }
            if nonzero == 0 {
                return Err(Error::InvalidConfig {
                    what: "empty table left linked",
                    value: ctx.entry_start(),
                });
            }
            Ok(WalkAction::Continue)
        };
        let limit = self.core.fmt.ipa_limit();
        // SAFETY: read-only walk under a read guard.
        unsafe { self.walk_unchecked(0, limit, WalkFlags::TABLE_PRE | WalkFlags::SHARED, &mut v)? };
        Ok(checked)
    }

    /// Unlinks every table below the root and frees them once no reader
    /// can reach them. No invalidation is issued: the caller makes sure no
    /// CPU uses the table any more (VM tear-down).
    fn destroy(&mut self) {
        crate::bbm::teardown(self.bbm_id(), false);
        let mut pages = Vec::new();
        let mut v = |ctx: &VisitCtx<'_, F, M>, visit: Visit| {
            if visit == Visit::TablePost {
                pages.push(ctx.fmt.output_address(ctx.old));
            }
            if ctx.level == ctx.fmt.start_level() {
                // Root entries are not counted; clear them so readers stop.
                ctx.try_set(0)?;
            }
            Ok(WalkAction::Continue)
        };
        let limit = self.core.fmt.ipa_limit();
        let flags = WalkFlags::LEAF | WalkFlags::TABLE_POST;
        // SAFETY: `&mut self`; root entries are cleared after their subtree
        // was walked (table-post), and pages are freed deferred.
        let walked = unsafe { self.walk_unchecked(0, limit, flags, &mut v) };
        // The visitor only fails on a concurrent change, which `&mut self`
        // excludes; a failure would leak pages, never free a reachable one.
        debug_assert!(walked.is_ok(), "table teardown walk failed: {walked:?}");
        // SAFETY: every page is unreachable now (its root entry is cleared).
        unsafe { self.core.mm.free_pages_deferred(pages) };
    }
}

impl<F: PteFormat, M: MmOps> Drop for PageTable<F, M> {
    fn drop(&mut self) {
        self.destroy();
    }
}

/// A lockless handle on a table's translations, as a hardware walker (or a
/// vCPU's software TLB refill) sees them. It keeps the root alive; tables it
/// is walking are freed only after it finishes.
pub struct TableReader<F: PteFormat, M: MmOps> {
    core: Arc<TableCore<F, M>>,
}

impl<F: PteFormat, M: MmOps> Clone for TableReader<F, M> {
    fn clone(&self) -> Self {
        TableReader {
            core: self.core.clone(),
        }
    }
}

impl<F: PteFormat, M: MmOps> TableReader<F, M> {
    /// The table's identity, unique among the process's tables (never
    /// reused): what handles tied to one table check.
    pub fn table_id(&self) -> u64 {
        self.core.id
    }

    /// Translates `ipa`: `None` if no valid leaf maps it (a translation
    /// fault), else the leaf and the output address.
    pub fn translate(&self, ipa: u64) -> Option<Translation> {
        translate(&self.core, ipa)
    }

    /// The descriptor format.
    pub fn format(&self) -> &F {
        &self.core.fmt
    }

    /// Pins the caller as a lockless reader for as long as the guard lives
    /// (with [`crate::HostMmOps`], an epoch pin). Walks made meanwhile pin
    /// again, and with `HostMmOps` a nested pin only counts, so a vCPU that
    /// holds one across its walk, the fault handler and its walk again pays
    /// for one pin instead of three. Do not hold one while idle: table pages
    /// freed meanwhile stay allocated until it is dropped.
    pub fn read_guard(&self) -> M::ReadGuard {
        self.core.mm.read_guard()
    }

    /// What a CPU with hardware dirty state does on a write to `ipa` (arm64
    /// FEAT_HAFDBS with VTCR_EL2.HD; x86 EPT with A/D flags): if the leaf is
    /// clean and tracked ([`crate::HwDirtyBits`]: arm64 DBM set and write
    /// permission clear; EPT writable with the dirty flag clear), it makes
    /// it dirty by compare-and-swap, with no fault and no lock, and returns
    /// the translation after the update; otherwise it returns the
    /// translation as it is (a write to it still faults if it is not
    /// writable). `None`: nothing maps `ipa`. For simulated vCPUs
    /// and tests: the engine's cleaning and unmapping are built to race
    /// this update, as they race the hardware's.
    pub fn hw_dirty_update(&self, ipa: u64) -> Option<Translation> {
        self.hw_dirty_update_reporting(ipa).map(|(t, _)| t)
    }

    /// [`TableReader::hw_dirty_update`], also saying whether this call made
    /// the leaf dirty (`true`: the write that x86 PML logs; `false`: the
    /// leaf was dirty already, or is not tracked).
    pub fn hw_dirty_update_reporting(&self, ipa: u64) -> Option<(Translation, bool)> {
        let fmt = &self.core.fmt;
        let hw = fmt.hw_dirty_bits();
        let _guard = self.core.mm.read_guard();
        loop {
            let (entry, level, pte) = find_leaf(&self.core, ipa)?;
            let Some(hw) = hw.filter(|h| pte & h.update_mask == h.update_match) else {
                return Some((translation(fmt, ipa, level, pte), false));
            };
            let new = pte | hw.update_set;
            if entry
                .compare_exchange(pte, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some((translation(fmt, ipa, level, new), true));
            }
            // The engine changed the entry meanwhile: walk again.
        }
    }
}

fn translate<F: PteFormat, M: MmOps>(core: &TableCore<F, M>, ipa: u64) -> Option<Translation> {
    let _guard = core.mm.read_guard();
    let (_, level, pte) = find_leaf(core, ipa)?;
    Some(translation(&core.fmt, ipa, level, pte))
}

fn translation<F: PteFormat>(fmt: &F, ipa: u64, level: u32, pte: u64) -> Translation {
    let size = fmt.granule(level);
    Translation {
        pa: fmt.output_address(pte) + (ipa & (size - 1)),
        level,
        size,
        pte,
        prot: fmt.prot(pte),
    }
}

/// The valid leaf that maps `ipa`: its entry, level and value. The caller
/// holds a read guard, which keeps the entry's table page allocated.
fn find_leaf<F: PteFormat, M: MmOps>(
    core: &TableCore<F, M>,
    ipa: u64,
) -> Option<(&AtomicU64, u32, u64)> {
    let fmt = &core.fmt;
    if ipa >= fmt.ipa_limit() {
        return None;
    }
    let root_index = ipa / fmt.root_page_span();
    let mut table = core.root + root_index * fmt.page_size();
    let mut level = fmt.start_level();
    loop {
        // SAFETY: `table` is the root or a child read from a valid table
        // entry; the caller's read guard keeps it allocated; the index is in
        // bounds.
        let entry = unsafe { entry_ref(&core.mm, table, fmt.index(ipa, level)) };
        let pte = entry.load(Ordering::Acquire);
        if !fmt.is_valid(pte) {
            return None;
        }
        if fmt.is_table(pte, level) {
            table = fmt.output_address(pte);
            level += 1;
            continue;
        }
        return Some((entry, level, pte));
    }
}
