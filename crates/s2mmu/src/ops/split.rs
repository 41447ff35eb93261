//! Split: replace block mappings by tables of smaller mappings with the same
//! translation (eager page splitting when dirty logging starts).

use crate::format::PteFormat;
use crate::memcache::PageCache;
use crate::pgtable::PageTable;
use crate::table::MmOps;
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::{Error, Result};
use core::sync::atomic::Ordering;

/// How the split walk moves through the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SplitPolicy {
    /// Visit every entry of the range, as Linux mainline does: after a block
    /// is split the walker descends into every new entry, and an
    /// already-split range is visited page by page. The seeds' baseline
    /// (the `baselines` feature only).
    #[cfg(feature = "baselines")]
    FullWalk,
    /// The split walk's RFC (2026-05-15, "v1" in split-perf): a last-level entry
    /// returns "skip siblings" (its table holds pages only), and a block
    /// split all the way down returns "skip children".
    #[default]
    SkipReturns,
    /// The series that replaced the skip returns after review ("v2" in
    /// split-perf; posted as v1 2026-06-10 and v2 2026-06-18): the split
    /// walk sets a walker flag, KVM's `KVM_PGTABLE_WALK_SKIP_LEVEL3`
    /// (here [`WalkFlags::NO_LAST_LEVEL_TABLES`]), so the walker never
    /// descends into a last-level table: no page entry is read, and the
    /// visitor returns nothing special. Compared with [`Self::SkipReturns`]
    /// it reads no page at all in an already-split range, but after
    /// splitting a level-1 block it still reads the new level-2 table.
    NoLastLevelTables,
}

impl SplitPolicy {
    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "baselines")]
            SplitPolicy::FullWalk => "full_walk",
            SplitPolicy::SkipReturns => "skip",
            SplitPolicy::NoLastLevelTables => "no_last_level_flag",
        }
    }
}

/// What a split did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SplitStats {
    /// Block mappings replaced by tables.
    pub blocks_split: u64,
    /// Table pages taken from the cache.
    pub tables: u64,
    /// Entries the walker read.
    pub entries: u64,
    /// Visitor calls.
    pub visits: u64,
    /// False when the cache ran dry before every block was split (split is
    /// best effort; the rest stays mapped by blocks).
    pub complete: bool,
}

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// Table pages needed to split every block in a range of `bytes` down to
    /// pages: KVM's `kvm_mmu_split_nr_page_tables` (one per block at each
    /// block level the range can hold).
    pub fn split_capacity(&self, bytes: u64) -> usize {
        let fmt = self.format();
        let mut n = 0u64;
        for level in fmt.start_level()..fmt.last_level() {
            if fmt.leaf_allowed(level) {
                n += bytes.div_ceil(fmt.granule(level));
            }
        }
        n as usize
    }

    /// Splits every valid block overlapping `[ipa, ipa + size)` down to
    /// last-level pages, taking tables from `cache`. A block whose complete
    /// subtree fits in the cache is rebuilt in one step; otherwise it is
    /// split one level and the walker splits the new blocks as it meets them.
    /// Each replaced block goes through break-before-make (one invalidation
    /// by IPA). Best effort: when the cache runs dry the split stops and
    /// reports [`SplitStats::complete`] false; the mappings stay correct.
    ///
    /// # Errors
    /// [`Error::Misaligned`], [`Error::EmptyRange`], [`Error::OutOfRange`];
    /// [`Error::InvalidConfig`] if `cache` draws from another allocator than
    /// the table's.
    pub fn split(
        &mut self,
        ipa: u64,
        size: u64,
        cache: &mut PageCache<M>,
        policy: SplitPolicy,
    ) -> Result<SplitStats> {
        self.check_range(ipa, size)?;
        cache.check_allocator(self.mm())?;
        let tlb = self.tlb.clone();
        let mut stats = SplitStats {
            complete: true,
            ..SplitStats::default()
        };
        let last = self.format().last_level();
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if ctx.level == last {
                return Ok(match policy {
                    SplitPolicy::SkipReturns => WalkAction::SkipSiblings,
                    _ => WalkAction::Continue,
                });
            }
            if !ctx.fmt.is_valid(ctx.old) {
                return Ok(WalkAction::Continue);
            }
            let full = subtree_pages(ctx.fmt, ctx.level);
            let force = cache.len() >= full;
            if cache.is_empty() {
                return Err(Error::CacheExhausted {
                    needed: full,
                    available: 0,
                });
            }
            let child = build_subtree(ctx.fmt, ctx.mm, cache, ctx.old, ctx.level, force);
            if let Err(e) = ctx.try_break(&*tlb) {
                // Only a shared walk can lose the entry; give the tables back.
                free_subtree(ctx.fmt, ctx.mm, cache, child, ctx.level + 1);
                return Err(e);
            }
            ctx.make(ctx.fmt.table_pte(child));
            stats.blocks_split += 1;
            stats.tables += if force { full as u64 } else { 1 };
            Ok(if force && policy == SplitPolicy::SkipReturns {
                WalkAction::SkipChildren
            } else {
                WalkAction::Continue
            })
        };
        let mut flags = WalkFlags::LEAF;
        if policy == SplitPolicy::NoLastLevelTables {
            flags = flags | WalkFlags::NO_LAST_LEVEL_TABLES;
        }
        match self.walk(ipa, size, flags, &mut v) {
            Ok(w) => {
                stats.entries = w.entries;
                stats.visits = w.visits;
            }
            Err(Error::CacheExhausted { .. }) => stats.complete = false,
            Err(e) => return Err(e),
        }
        Ok(stats)
    }
}

/// Table pages needed to expand one block at `level` down to pages.
fn subtree_pages<F: PteFormat>(fmt: &F, level: u32) -> usize {
    if level + 1 >= fmt.last_level() {
        1
    } else {
        1 + fmt.entries_per_table() * subtree_pages(fmt, level + 1)
    }
}

/// Builds, unlinked, the table that replaces the block `block` at `level`:
/// leaves one level down, or (with `force`) complete subtrees down to pages.
/// Entries are written with plain stores: nothing can see the table until
/// the release store that links it.
fn build_subtree<F: PteFormat, M: MmOps>(
    fmt: &F,
    mm: &M,
    cache: &mut PageCache<M>,
    block: u64,
    level: u32,
    force: bool,
) -> u64 {
    let child = cache.pop().expect("caller checked the cache");
    let child_level = level + 1;
    let entries = fmt.entries_per_table();
    let step = fmt.granule(child_level);
    let first = fmt.relevel_leaf(block, level, child_level);
    let ptr = mm.phys_to_virt(child);
    if force && child_level < fmt.last_level() {
        for i in 0..entries {
            let sub_block = fmt.advance_leaf(first, i as u64 * step);
            let sub = build_subtree(fmt, mm, cache, sub_block, child_level, true);
            // SAFETY: `child` is a fresh page from the cache with `entries`
            // entries that no one else can reach yet.
            unsafe { ptr.add(i).write(fmt.table_pte(sub)) };
        }
    } else {
        // SAFETY: as above; the slice is the page's entries and nothing
        // else refers to the page.
        let table = unsafe { core::slice::from_raw_parts_mut(ptr, entries) };
        let mut offset = 0;
        for e in table.iter_mut() {
            *e = fmt.advance_leaf(first, offset);
            offset += step;
        }
    }
    mm.entry_count(child)
        .store(entries as u32, Ordering::Relaxed);
    child
}

/// Returns an unlinked subtree built by [`build_subtree`] to the cache.
fn free_subtree<F: PteFormat, M: MmOps>(
    fmt: &F,
    mm: &M,
    cache: &mut PageCache<M>,
    table: u64,
    level: u32,
) {
    let ptr = mm.phys_to_virt(table);
    for i in 0..fmt.entries_per_table() {
        // SAFETY: an unlinked table we built; in bounds.
        let e = unsafe { ptr.add(i).read() };
        if fmt.is_table(e, level) {
            free_subtree(fmt, mm, cache, fmt.output_address(e), level + 1);
        }
        // SAFETY: as above; the page goes back to the cache, which expects
        // zeroed pages.
        unsafe { ptr.add(i).write(0) };
    }
    mm.entry_count(table).store(0, Ordering::Relaxed);
    cache.push(table);
}
