//! Map: install leaves for a range, the largest blocks the alignment allows.

use crate::format::{Prot, PteFormat};
use crate::memcache::PageCache;
use crate::pgtable::PageTable;
use crate::table::MmOps;
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::{Error, Result};

/// How [`PageTable::map`] picks mapping sizes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapOptions {
    /// Map with last-level pages only (KVM's `force_pte`: dirty logging,
    /// or host memory that is not backed by huge pages).
    pub force_pages: bool,
}

/// What a map did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapStats {
    /// Leaves installed.
    pub leaves: u64,
    /// Table pages taken from the cache.
    pub tables: u64,
}

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// Maps `[ipa, ipa + size)` to `[pa, pa + size)` with `prot`, using the
    /// largest leaves that the format allows at each address and that the
    /// alignment of both addresses permits (or pages only, with
    /// [`MapOptions::force_pages`]). Tables come from `cache`.
    ///
    /// # Errors
    /// - [`Error::Misaligned`], [`Error::EmptyRange`], [`Error::OutOfRange`]
    ///   for a bad range, [`Error::Misaligned`] for a `pa` not page aligned;
    /// - [`Error::PhysOutOfRange`], [`Error::InvalidProt`] from the format;
    /// - [`Error::AlreadyMapped`] naming the first mapped address in the range;
    /// - [`Error::CacheExhausted`] if `cache` holds fewer pages than needed;
    /// - [`Error::InvalidConfig`] if `cache` draws from another allocator
    ///   than the table's.
    ///
    /// On error the table is unchanged.
    pub fn map(
        &mut self,
        ipa: u64,
        size: u64,
        pa: u64,
        prot: Prot,
        cache: &mut PageCache<M>,
        opts: MapOptions,
    ) -> Result<MapStats> {
        // SAFETY: `&mut self` makes this the only walker that writes.
        unsafe { self.map_inner(ipa, size, pa, prot, cache, opts, WalkFlags::empty()) }
    }

    /// Like [`PageTable::map`], alongside other shared walkers (the fault
    /// path under the read lock). Entries are installed by compare-and-swap.
    ///
    /// # Errors
    /// As [`PageTable::map`]; additionally [`Error::Again`] when another
    /// walker changed an entry first, in which case the mapping may be
    /// partly installed (every installed entry is valid), and
    /// [`Error::AlreadyMapped`] when another walker mapped the page first.
    #[allow(clippy::too_many_arguments)]
    pub fn map_shared(
        &self,
        ipa: u64,
        size: u64,
        pa: u64,
        prot: Prot,
        cache: &mut PageCache<M>,
        opts: MapOptions,
    ) -> Result<MapStats> {
        // SAFETY: a shared walk; every update is a compare-and-swap.
        unsafe { self.map_inner(ipa, size, pa, prot, cache, opts, WalkFlags::SHARED) }
    }

    /// # Safety
    /// Exclusive access unless `mode` is [`WalkFlags::SHARED`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn map_inner(
        &self,
        ipa: u64,
        size: u64,
        pa: u64,
        prot: Prot,
        cache: &mut PageCache<M>,
        opts: MapOptions,
        mode: WalkFlags,
    ) -> Result<MapStats> {
        self.check_range(ipa, size)?;
        cache.check_allocator(self.mm())?;
        let fmt = self.format();
        let page = fmt.page_size();
        if pa & (page - 1) != 0 {
            return Err(Error::Misaligned {
                what: "pa",
                value: pa,
                align: page,
            });
        }
        // Validate permissions and both ends of the output range up front.
        fmt.leaf_pte(pa, fmt.last_level(), prot)?;
        let last_pa = pa.checked_add(size - page).ok_or(Error::PhysOutOfRange {
            pa,
            pa_bits: fmt.pa_bits(),
        })?;
        fmt.leaf_pte(last_pa, fmt.last_level(), prot)?;

        let pa_offset = pa.wrapping_sub(ipa);
        let needed = self.map_precheck(ipa, size, pa_offset, opts)?;
        if cache.len() < needed {
            return Err(Error::CacheExhausted {
                needed,
                available: cache.len(),
            });
        }
        let mut stats = MapStats::default();
        let mut visitor = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            map_visit(ctx, pa_offset, prot, opts, cache, &mut stats)
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.walk_unchecked(ipa, size, WalkFlags::LEAF | mode, &mut visitor)? };
        Ok(stats)
    }

    /// Read-only pass before a map: refuses a range with a mapping in it and
    /// counts the table pages the map will need.
    fn map_precheck(&self, ipa: u64, size: u64, pa_offset: u64, opts: MapOptions) -> Result<usize> {
        let mut needed = 0usize;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if ctx.fmt.is_locked(ctx.old) {
                return Err(Error::Again { ipa: ctx.addr });
            }
            let lo = ctx.addr.max(ctx.entry_start());
            if ctx.fmt.is_valid(ctx.old) {
                return Err(Error::AlreadyMapped { ipa: lo });
            }
            let hi = (ctx.entry_start() + ctx.granule()).min(ctx.end);
            needed += tables_needed(ctx.fmt, lo, hi, ctx.level, pa_offset, opts.force_pages);
            Ok(WalkAction::Continue)
        };
        // SAFETY: a read-only walk under the read guard it pins.
        unsafe { self.walk_unchecked(ipa, size, WalkFlags::LEAF | WalkFlags::SHARED, &mut v)? };
        Ok(needed)
    }
}

/// Whether a leaf for `[addr, addr + granule(level))` may be installed.
#[inline]
fn leaf_fits<F: PteFormat>(
    fmt: &F,
    addr: u64,
    end: u64,
    level: u32,
    pa_offset: u64,
    force_pages: bool,
) -> bool {
    let g = fmt.granule(level);
    fmt.leaf_allowed(level)
        && (!force_pages || level == fmt.last_level())
        && addr & (g - 1) == 0
        && end - addr >= g
        && addr.wrapping_add(pa_offset) & (g - 1) == 0
}

/// Table pages needed to map `[lo, hi)`, which lies inside one empty entry
/// at `level`.
fn tables_needed<F: PteFormat>(
    fmt: &F,
    lo: u64,
    hi: u64,
    level: u32,
    pa_offset: u64,
    force_pages: bool,
) -> usize {
    if level == fmt.last_level() || leaf_fits(fmt, lo, hi, level, pa_offset, force_pages) {
        return 0;
    }
    let child = level + 1;
    let mut n = 1;
    if child == fmt.last_level() {
        return n;
    }
    // The children wholly inside the range all need the same count (each
    // is aligned to its size, and a leaf's fit depends on the alignment
    // of `pa_offset` alone then): counted once and multiplied, so a huge
    // range costs a walk per level, not one per child (a 2^52-byte map
    // with an empty cache took half a minute to say it needs more).
    let cg = fmt.granule(child);
    let first_full = (lo + cg - 1) & !(cg - 1);
    let full_end = hi & !(cg - 1);
    if first_full >= full_end {
        let mut a = lo;
        while a < hi {
            let next = ((a & !(cg - 1)) + cg).min(hi);
            n += tables_needed(fmt, a, next, child, pa_offset, force_pages);
            a = next;
        }
        return n;
    }
    if lo < first_full {
        n += tables_needed(fmt, lo, first_full, child, pa_offset, force_pages);
    }
    let full = usize::try_from((full_end - first_full) / cg).unwrap_or(usize::MAX);
    let each = tables_needed(
        fmt,
        first_full,
        first_full + cg,
        child,
        pa_offset,
        force_pages,
    );
    n = n.saturating_add(full.saturating_mul(each));
    if full_end < hi {
        n = n.saturating_add(tables_needed(
            fmt,
            full_end,
            hi,
            child,
            pa_offset,
            force_pages,
        ));
    }
    n
}

fn map_visit<F: PteFormat, M: MmOps>(
    ctx: &VisitCtx<'_, F, M>,
    pa_offset: u64,
    prot: Prot,
    opts: MapOptions,
    cache: &mut PageCache<M>,
    stats: &mut MapStats,
) -> Result<WalkAction> {
    let fmt = ctx.fmt;
    if fmt.is_locked(ctx.old) {
        return Err(Error::Again { ipa: ctx.addr });
    }
    if fmt.is_valid(ctx.old) {
        return Err(Error::AlreadyMapped {
            ipa: ctx.addr.max(ctx.entry_start()),
        });
    }
    if leaf_fits(
        fmt,
        ctx.addr,
        ctx.end,
        ctx.level,
        pa_offset,
        opts.force_pages,
    ) {
        let pte = fmt.leaf_pte(ctx.addr.wrapping_add(pa_offset), ctx.level, prot)?;
        ctx.try_set(pte)?;
        stats.leaves += 1;
        return Ok(WalkAction::Continue);
    }
    // Too big for a leaf here: install an empty table; the walker re-reads
    // the entry and descends into it.
    let available = cache.len();
    let child = cache.pop().ok_or(Error::CacheExhausted {
        needed: 1,
        available,
    })?;
    if let Err(e) = ctx.try_set(fmt.table_pte(child)) {
        cache.push(child);
        return Err(e);
    }
    stats.tables += 1;
    Ok(WalkAction::Continue)
}
