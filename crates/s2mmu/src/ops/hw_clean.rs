//! The clean of hardware dirty state (`KVM_CLEAR_DIRTY_LOG` under arm64
//! DBM or EPT dirty flags), in its whole-table forms.
//!
//! A CLEAR cleans the pages whose bits its caller clears. One walk from the
//! root per run of set bits is right where runs are long (a fully dirty
//! slot is one run, and a last-level table wholly inside it is cleaned in
//! one loop: [`PageTable::clean_hw_dirty_batched`]), but a scattered bitmap
//! (one page in 3 dirty) has a run per dirty page, and `perf` showed that
//! CLEAR spending its time in the walker's descent and the visitor call of
//! each one-page walk, not in the stores. [`PageTable::clean_hw_dirty_masked`]
//! takes such a bitmap in one walk: a last-level table wholly inside its
//! range is cleaned by a loop over the set bits of its words.

use crate::format::PteFormat;
use crate::pgtable::PageTable;
use crate::table::{entry_ref, MmOps};
use crate::tlb::TlbBatch;
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::{Error, HwDirtyBits, Result};
use core::sync::atomic::{AtomicU64, Ordering};

/// Entries per bitmap word.
const WORD: usize = 64;

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// `clean_hw_dirty_batched` for a range that may hold whole last-level
    /// tables (its range is checked): those are cleaned by
    /// [`clean_leaf_table`], other leaves by [`clean_leaf`].
    #[inline(never)]
    pub(super) fn clean_hw_dirty_tables(
        &mut self,
        ipa: u64,
        size: u64,
        hw: HwDirtyBits,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        let last = self.format().last_level();
        let mut changed = 0u64;
        let mut v = |ctx: &VisitCtx<'_, F, M>, visit: Visit| {
            if visit == Visit::TablePre {
                if ctx.level + 1 == last && ctx.entry_inside_range() {
                    if let Some(table) = ctx.child_table() {
                        changed += clean_leaf_table(ctx, table, hw, batch, |_| !0);
                        return Ok(WalkAction::SkipChildren);
                    }
                }
                return Ok(WalkAction::Continue);
            }
            changed += clean_leaf(ctx, hw, batch)?;
            Ok(WalkAction::Continue)
        };
        let flags = WalkFlags::LEAF | WalkFlags::TABLE_PRE | WalkFlags::IGNORE_AGAIN;
        self.walk(ipa, size, flags, &mut v)?;
        Ok(changed)
    }

    /// Hardware dirty state, the CLEAR of a scattered bitmap: cleans, as
    /// [`PageTable::clean_hw_dirty_batched`] of each run of set bits would,
    /// every leaf of `[ipa, ipa + size)` that maps a page whose bit is set
    /// in `masks` (bit `j` of `masks[w]` is the page `64 w + j` pages above
    /// `ipa`; bits past the range are ignored), in one walk: a last-level
    /// table wholly inside the range is cleaned by one loop over its set
    /// bits. A page whose bit is clear is left as it is, dirty or not: its
    /// dirty state belongs to a later harvest. Returns the number of leaves
    /// changed.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the format has no hardware dirty state,
    /// or if `masks` has fewer bits than the range has pages; as
    /// [`PageTable::wrprotect`].
    pub fn clean_hw_dirty_masked(
        &mut self,
        ipa: u64,
        size: u64,
        masks: &[u64],
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        let hw = self.hw_dirty_bits()?;
        self.check_range(ipa, size)?;
        let fmt = self.format();
        let (shift, last) = (fmt.page_shift(), fmt.last_level());
        let bits = (masks.len() as u64).saturating_mul(WORD as u64);
        if bits < size >> shift {
            return Err(Error::InvalidConfig {
                what: "clean masks with fewer bits than the range has pages",
                value: masks.len() as u64,
            });
        }
        let end = ipa + size;
        let mut changed = 0u64;
        let mut v = |ctx: &VisitCtx<'_, F, M>, visit: Visit| {
            let start = ctx.entry_start();
            if visit == Visit::TablePre {
                if ctx.level + 1 == last && ctx.entry_inside_range() {
                    if let Some(table) = ctx.child_table() {
                        let first = (start - ipa) >> shift;
                        let select = |w: usize| bits_at(masks, first + (w * WORD) as u64);
                        changed += clean_leaf_table(ctx, table, hw, batch, select);
                        return Ok(WalkAction::SkipChildren);
                    }
                }
                return Ok(WalkAction::Continue);
            }
            // The pages of this leaf inside the range (a block may reach
            // outside it).
            let lo = (start.max(ipa) - ipa) >> shift;
            let hi = ((start + ctx.granule()).min(end) - ipa) >> shift;
            if any_bit(masks, lo, hi) {
                changed += clean_leaf(ctx, hw, batch)?;
            }
            Ok(WalkAction::Continue)
        };
        let flags = WalkFlags::LEAF | WalkFlags::TABLE_PRE | WalkFlags::IGNORE_AGAIN;
        self.walk(ipa, size, flags, &mut v)?;
        Ok(changed)
    }
}

/// The clean's visit of one leaf: a valid trackable leaf that cleaning
/// changes is stored clean, and a dirty one's range added to `batch`.
/// Returns 1 if it changed the leaf.
///
/// # Errors
/// As [`VisitCtx::try_set`].
#[inline(always)]
pub(super) fn clean_leaf<F: PteFormat, M: MmOps>(
    ctx: &VisitCtx<'_, F, M>,
    hw: HwDirtyBits,
    batch: &mut TlbBatch<'_>,
) -> Result<u64> {
    // Only a leaf that may be written becomes tracked: a read-only mapping
    // stays read-only.
    let new = hw.clean(ctx.old);
    if ctx.fmt.is_valid(ctx.old) && ctx.old & hw.trackable != 0 && new != ctx.old {
        // The hardware only sets `update_set` on a clean leaf; this store
        // only changes a dirty one (clearing what it set), or starts
        // tracking one the hardware does not update yet: no update of the
        // hardware's is overwritten.
        ctx.try_set(new)?;
        if ctx.old & hw.clean_clear != 0 {
            batch.add(ctx.entry_start(), ctx.granule());
        }
        return Ok(1);
    }
    Ok(0)
}

/// Cleans the entries of the last-level table `table`, the child of the
/// entry of `ctx` (an exclusive walk), that `select` picks (bit `j` of
/// `select(w)` is entry `64 w + j`), as [`clean_leaf`] would each: every
/// valid trackable leaf that cleaning changes is stored clean. Adds to
/// `batch` the span from the first to the last one that was dirty, which is
/// what those leaves' invalidations add up to (a batch keeps one covering
/// range). Returns the number changed.
#[inline]
fn clean_leaf_table<F: PteFormat, M: MmOps>(
    ctx: &VisitCtx<'_, F, M>,
    table: u64,
    hw: HwDirtyBits,
    batch: &mut TlbBatch<'_>,
    select: impl Fn(usize) -> u64,
) -> u64 {
    let per_table = ctx.fmt.entries_per_table();
    let page = ctx.fmt.page_size();
    // SAFETY: `table` is the child of a valid table entry of an exclusive
    // walk (the caller holds the table for writing), so the page is
    // allocated; it holds `per_table` entries, all accessed atomically.
    let entries = unsafe { core::slice::from_raw_parts(entry_ref(ctx.mm, table, 0), per_table) };
    let mut changed = 0;
    let mut dirty_span: Option<(usize, usize)> = None;
    let mut clean = |i: usize, entry: &AtomicU64| {
        let old = entry.load(Ordering::Acquire);
        let new = hw.clean(old);
        if ctx.fmt.is_valid(old) && old & hw.trackable != 0 && new != old {
            // As `try_set` in an exclusive walk: a plain store, which
            // overwrites no update of the hardware's (it only sets
            // `update_set` on a clean leaf). Valid to valid: the table's
            // count of non-zero entries is unchanged.
            entry.store(new, Ordering::Release);
            let child = ctx.level + 1;
            let start = ctx.entry_start() + i as u64 * ctx.fmt.granule(child);
            ctx.trace_store(start, child, old, new);
            changed += 1;
            if old & hw.clean_clear != 0 {
                dirty_span = Some(dirty_span.map_or((i, i), |(lo, _)| (lo, i)));
            }
        }
    };
    for (w, chunk) in entries.chunks(WORD).enumerate() {
        let mut mask = select(w);
        if mask == !0 {
            // A whole word: a plain loop, as dense as the clean gets.
            for (j, entry) in chunk.iter().enumerate() {
                clean(w * WORD + j, entry);
            }
            continue;
        }
        while mask != 0 {
            let j = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if let Some(entry) = chunk.get(j) {
                clean(w * WORD + j, entry);
            }
        }
    }
    if let Some((lo, hi)) = dirty_span {
        let start = ctx.entry_start() + lo as u64 * page;
        batch.add(start, (hi - lo + 1) as u64 * page);
    }
    changed
}

/// The 64 bits of `masks` from bit `at` up (bits past its end are 0).
#[inline(always)]
fn bits_at(masks: &[u64], at: u64) -> u64 {
    let (w, sh) = ((at / WORD as u64) as usize, at % WORD as u64);
    let word = |i: usize| masks.get(i).copied().unwrap_or(0);
    if sh == 0 {
        word(w)
    } else {
        (word(w) >> sh) | (word(w + 1) << (WORD as u64 - sh))
    }
}

/// Whether any bit of `masks` in `[lo, hi)` is set (bits past its end are
/// 0).
#[inline(always)]
fn any_bit(masks: &[u64], lo: u64, hi: u64) -> bool {
    let mut at = lo;
    while at < hi {
        let n = (hi - at).min(WORD as u64);
        let bits = bits_at(masks, at);
        let want = if n == WORD as u64 {
            !0
        } else {
            (1u64 << n) - 1
        };
        if bits & want != 0 {
            return true;
        }
        at += n;
    }
    false
}
