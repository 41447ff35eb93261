//! Collapse: huge mappings back in place when dirty logging stops. A table
//! whose entries are all valid leaves mapping one contiguous, block-aligned
//! physical range with the same memory type becomes one block again,
//! without unmapping (so the guest takes no fault to get its huge page
//! back; KVM x86 does this since 6.13, arm64 waits for refaults).
//!
//! Break-before-make is batched: a pass breaks every collapsible table
//! entry of the range (the lock marker, no invalidation yet), invalidates
//! the whole VMID once, then makes the blocks. A CPU that still uses a
//! translation through an old table until the invalidation maps the same
//! physical memory the block will, and after it no CPU can hold both.

use crate::format::{Prot, PteFormat};
use crate::pgtable::PageTable;
use crate::table::{entry_ref, MmOps};
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::Result;
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

/// What a collapse did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollapseStats {
    /// Blocks made from tables.
    pub blocks: u64,
    /// Whole-VMID invalidations issued (one per pass that collapsed).
    pub flushes: u64,
}

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// Collapses every table in `[ipa, ipa + size)` that can become a block
    /// of at most `max_block` bytes (see the module documentation), level
    /// by level from the smallest block up, giving the blocks `prot` (the
    /// permissions the slot allows, whatever its pages' were: logging had
    /// write-protected some). Tables that cut the range's ends, hold
    /// anything but valid leaves, or whose leaves are not contiguous, are
    /// left as they are.
    ///
    /// # Errors
    /// As [`PageTable::check_range`]; [`crate::Error::InvalidProt`] for a
    /// `prot` the format cannot encode (nothing is changed then).
    pub fn collapse(
        &mut self,
        ipa: u64,
        size: u64,
        max_block: u64,
        prot: Prot,
    ) -> Result<CollapseStats> {
        self.check_range(ipa, size)?;
        let fmt = self.format().clone();
        // The leaf the blocks are built from must be encodable.
        fmt.leaf_pte(0, fmt.last_level(), prot)?;
        let mut st = CollapseStats::default();
        let levels: Vec<u32> = (fmt.start_level()..fmt.last_level())
            .rev()
            .filter(|&l| fmt.leaf_allowed(l) && fmt.granule(l) <= max_block)
            .collect();
        for level in levels {
            let n = self.collapse_level(ipa, size, level, prot)?;
            if n > 0 {
                st.blocks += n;
                st.flushes += 1;
            }
        }
        Ok(st)
    }

    /// One pass: break every collapsible table entry at `level`, one
    /// whole-VMID invalidation, make the blocks, free the tables.
    fn collapse_level(&mut self, ipa: u64, size: u64, level: u32, prot: Prot) -> Result<u64> {
        let fmt = self.format().clone();
        let mm = self.mm().clone();
        let mut made: Vec<(u64, u64, u64)> = Vec::new();
        let mut v = |ctx: &VisitCtx<'_, F, M>, visit: Visit| {
            if visit != Visit::TablePost || ctx.level != level || !ctx.entry_inside_range() {
                return Ok(WalkAction::Continue);
            }
            let Some(child) = ctx.child_table() else {
                return Ok(WalkAction::Continue);
            };
            if let Some(pa) = contiguous_leaves(&fmt, &mm, child, level + 1, ctx.granule()) {
                let block = fmt.leaf_pte(pa, level, prot)?;
                ctx.break_unflushed();
                made.push((ctx.entry_start(), block, child));
            }
            Ok(WalkAction::Continue)
        };
        self.walk(ipa, size, WalkFlags::TABLE_POST, &mut v)?;
        if made.is_empty() {
            return Ok(0);
        }
        self.tlb().flush_vmid();
        for &(at, block, _) in &made {
            let mut make = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
                if ctx.level == level && ctx.fmt.is_locked(ctx.old) {
                    ctx.make(block);
                }
                Ok(WalkAction::Continue)
            };
            self.walk(at, fmt.granule(level), WalkFlags::LEAF, &mut make)?;
        }
        let tables: Vec<u64> = made.iter().map(|&(_, _, t)| t).collect();
        crate::bbm::free_tables(self.bbm_id(), &tables);
        // SAFETY: each table was unlinked (its entry is a block now) and
        // the whole VMID invalidated; lockless readers that started before
        // hold a read guard, which the deferred free waits for.
        unsafe { mm.free_pages_deferred(tables) };
        Ok(made.len() as u64)
    }
}

/// The physical address of the block the table at `table` (at `level`,
/// spanning `span` bytes) can become: every entry a valid leaf, each
/// mapping the next `granule(level)` bytes after the previous one, from a
/// `span`-aligned start, and all alike but for the permission, access and
/// hardware-dirty bits. `None` otherwise.
fn contiguous_leaves<F: PteFormat, M: MmOps>(
    fmt: &F,
    mm: &M,
    table: u64,
    level: u32,
    span: u64,
) -> Option<u64> {
    let g = fmt.granule(level);
    let hw = fmt.hw_dirty_bits();
    let (dirty, tracked) = hw.map_or((0, 0), |h| (h.dirty, h.clean_set));
    let loose = fmt.perm_bits(Prot::RW) | fmt.access_flag() | dirty;
    let norm = |e: u64| fmt.with_exec(e | loose) & !tracked;
    // SAFETY: `table` is the child of a table entry the walker read in an
    // exclusive walk (the caller holds the table mutably), so it is live;
    // indices stay below the entries per table.
    let entry = |i: usize| unsafe { entry_ref(mm, table, i) }.load(Ordering::Acquire);
    let e0 = entry(0);
    if !fmt.is_valid(e0) || fmt.is_table(e0, level) || fmt.is_locked(e0) {
        return None;
    }
    let pa = fmt.output_address(e0);
    if !pa.is_multiple_of(span) {
        return None;
    }
    let n0 = norm(e0);
    for i in 1..fmt.entries_per_table() {
        let e = entry(i);
        if !fmt.is_valid(e)
            || fmt.is_table(e, level)
            || norm(e) != fmt.advance_leaf(n0, i as u64 * g)
        {
            return None;
        }
    }
    Some(pa)
}
