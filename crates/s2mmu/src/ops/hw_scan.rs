//! The harvest's scan of hardware dirty state into a dirty bitmap
//! (`KVM_GET_DIRTY_LOG` under arm64 DBM or EPT dirty flags).
//!
//! Its cost is reading the slot's last-level tables (1/512 of the slot), so
//! a last-level table wholly inside the range is read as a whole: 64
//! entries to a bitmap word with a branch-free bit per entry, no visit per
//! entry, the next table prefetched while this one is read, and the
//! table's words OR-ed into the bitmap only after all its entries are read.
//! The bitmap's OR is a locked instruction on x86, which orders the loads
//! around it: one per 64 entries in the middle of the reads kept few
//! cache-line misses in flight (the scan ran at a third of the memory
//! bandwidth). The clean that follows is `hw_clean.rs`.

use crate::dirty::DirtyBitmap;
use crate::format::PteFormat;
use crate::pgtable::PageTable;
use crate::table::{entry_ref, MmOps};
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::{Error, Result};
use core::sync::atomic::{AtomicU64, Ordering};

/// Entries per bitmap word.
const WORD: usize = 64;
/// The most entries a table page holds (64 KiB pages of 8-byte entries).
const MAX_TABLE_WORDS: usize = 8192 / WORD;

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// Hardware dirty state, the harvest's scan: marks in `bitmap` (whose
    /// bit 0 is the page at `base`) every page of `[ipa, ipa + size)` that
    /// a leaf the hardware dirtied maps. A last-level table wholly inside
    /// the range, at a 64-page-aligned offset from `base`, is read 64
    /// entries to a bitmap word without a visit per entry (KVM's DBM series
    /// measured the per-leaf walk as the cost of a harvest). Returns the
    /// number of dirty pages found.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the format has no hardware dirty state; as
    /// [`PageTable::check_range`]; [`Error::InvalidConfig`] for a `base`
    /// above `ipa`.
    pub fn scan_hw_dirty_into(
        &self,
        ipa: u64,
        size: u64,
        base: u64,
        bitmap: &DirtyBitmap,
    ) -> Result<u64> {
        let hw = self.hw_dirty_bits()?;
        self.check_range(ipa, size)?;
        if base > ipa {
            return Err(Error::InvalidConfig {
                what: "bitmap base above the scanned range",
                value: base,
            });
        }
        let fmt = self.format();
        let (shift, last) = (fmt.page_shift(), fmt.last_level());
        let dirty = hw.dirty;
        let per_table = fmt.entries_per_table();
        let table_words = per_table / WORD;
        let mut found = 0u64;
        let mut v = |ctx: &VisitCtx<'_, F, M>, visit: Visit| {
            // Pages before `base` have no bit: a leaf or table reaching
            // below it is clipped (the fast path needs it wholly above).
            let start = ctx.entry_start();
            let first_page = (start.max(base) - base) >> shift;
            if visit == Visit::TablePre {
                let fast = ctx.level + 1 == last
                    && start >= base
                    && ctx.entry_inside_range()
                    && first_page.is_multiple_of(WORD as u64)
                    && per_table.is_multiple_of(WORD)
                    && table_words <= MAX_TABLE_WORDS;
                let Some(table) = ctx.child_table().filter(|_| fast) else {
                    return Ok(WalkAction::Continue);
                };
                let next = ctx
                    .next_sibling()
                    .filter(|&e| fmt.is_table(e, ctx.level))
                    .map(|e| ctx.mm.phys_to_virt(fmt.output_address(e)) as *const u8);
                // SAFETY: `table` is the child of a valid table entry the
                // walker read under its read guard, so the page is
                // allocated; it holds `per_table` entries, all accessed
                // atomically.
                let entries =
                    unsafe { core::slice::from_raw_parts(entry_ref(ctx.mm, table, 0), per_table) };
                let mut words = [0u64; MAX_TABLE_WORDS];
                let words = &mut words[..table_words];
                dirty_words(entries, dirty, next, words);
                let first_word = (first_page / WORD as u64) as usize;
                for (i, &mask) in words.iter().enumerate() {
                    found += u64::from(mask.count_ones());
                    bitmap.mark_word(first_word + i, mask);
                }
                return Ok(WalkAction::SkipChildren);
            }
            if fmt.is_valid(ctx.old) && ctx.old & dirty == dirty {
                let end = start + ctx.granule();
                let pages = (end.max(base) - base) >> shift;
                let pages = pages - first_page;
                for p in first_page..first_page + pages {
                    bitmap.mark(p);
                }
                found += pages;
            }
            Ok(WalkAction::Continue)
        };
        let flags = WalkFlags::LEAF | WalkFlags::TABLE_PRE | WalkFlags::SHARED;
        // SAFETY: a read-only walk; the read guard it pins keeps tables
        // alive against concurrent unlinking.
        unsafe { self.walk_unchecked(ipa, size, flags, &mut v)? };
        Ok(found)
    }
}

/// Reads a last-level table's `entries` into `words` (bit `j` of word `w`
/// set when entry `w * 64 + j` has every bit of `dirty`), prefetching the
/// table page at `next`, if any, a cache line per 8 entries read.
///
/// An entry with the dirty bits is a valid leaf: the engine writes no
/// invalid value with them (0, the lock marker), and the hardware only
/// updates valid leaves. The loads are relaxed atomic loads (plain moves on
/// x86 and arm64): the hardware sets dirty state concurrently.
#[inline]
fn dirty_words(entries: &[AtomicU64], dirty: u64, next: Option<*const u8>, words: &mut [u64]) {
    for (w, (chunk, out)) in entries.chunks_exact(WORD).zip(words).enumerate() {
        if let Some(next) = next {
            for line in 0..WORD / 8 {
                prefetch(next.wrapping_add((w * WORD + line * 8) * 8));
            }
        }
        let mut mask = 0u64;
        for (j, e) in chunk.iter().enumerate() {
            // 1 when every dirty bit is set: `!e & dirty` is then 0, and
            // 0 - 1 has the top bit (the dirty bits are below bit 63).
            let missing = !e.load(Ordering::Relaxed) & dirty;
            mask |= (missing.wrapping_sub(1) >> 63) << j;
        }
        *out = mask;
    }
}

/// Asks the CPU to bring the cache line at `p` in; a hint, never a fault,
/// whatever `p` is.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch does not access memory architecturally: it cannot
    // fault or change anything observable, for any address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
