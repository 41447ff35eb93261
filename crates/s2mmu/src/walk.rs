//! The generic table walker (KVM's `kvm_pgtable_walk`).
//!
//! One walker serves every operation: it visits the entries that cover a
//! range, calling a [`Visitor`] on leaf, table-pre and table-post visits as
//! its [`WalkFlags`] ask. After a leaf or table-pre visit the walker re-reads
//! the entry, so a visitor that installs a table is descended into and one
//! that replaces a table with a block is not. A visitor steers the walk with
//! its [`WalkAction`]: skip the children of the entry it just visited, or skip
//! the rest of the table the entry is in (the 2026 "Optimize S2 page
//! splitting" RFC).
//!
//! Exclusive walks (the caller holds the MMU lock for writing) update entries
//! with plain stores; shared walks (read lock, concurrent walkers) update
//! them only by compare-and-swap from the value the walker read, and report a
//! lost race as [`Error::Again`].

use crate::format::PteFormat;
use crate::table::{entry_ref, MmOps};
use crate::tlb::TlbInvalidate;
use crate::{Error, Result};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// What a walk visits and how it may update entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WalkFlags(pub(crate) u32);

impl WalkFlags {
    /// Visit entries that are not tables (valid leaves and invalid entries).
    pub const LEAF: WalkFlags = WalkFlags(1 << 0);
    /// Visit table entries before descending into them.
    pub const TABLE_PRE: WalkFlags = WalkFlags(1 << 1);
    /// Visit table entries after their subtree.
    pub const TABLE_POST: WalkFlags = WalkFlags(1 << 2);
    /// Other walkers may run concurrently: update by compare-and-swap only.
    pub const SHARED: WalkFlags = WalkFlags(1 << 3);
    /// Keep walking when a visitor reports [`Error::Again`] (range walkers
    /// such as write-protect must not stop at a busy entry).
    pub const IGNORE_AGAIN: WalkFlags = WalkFlags(1 << 4);
    /// Never descend into last-level tables: the walk skips the whole last
    /// level (KVM's `KVM_PGTABLE_WALK_SKIP_LEVEL3` in the series that
    /// replaced the RFC's skip return values; for a walk that only cares
    /// about blocks, such as split).
    pub const NO_LAST_LEVEL_TABLES: WalkFlags = WalkFlags(1 << 5);

    /// No flags.
    pub const fn empty() -> Self {
        WalkFlags(0)
    }
    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: WalkFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for WalkFlags {
    type Output = WalkFlags;
    fn bitor(self, rhs: WalkFlags) -> WalkFlags {
        WalkFlags(self.0 | rhs.0)
    }
}

/// Which visit of an entry this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visit {
    /// An entry that is not a table: a valid leaf, or an invalid entry.
    Leaf,
    /// A table entry, before its subtree.
    TablePre,
    /// A table entry, after its subtree.
    TablePost,
}

/// How the walk goes on after a visit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalkAction {
    /// Descend if the entry is (now) a table, else go to the next entry.
    Continue,
    /// Do not descend into the entry's table; go to its next sibling.
    SkipChildren,
    /// Skip the remaining entries of this table; go on in the parent.
    SkipSiblings,
}

/// The entry being visited and the walk it belongs to.
///
/// A visitor outside the engine can only read: the writes (`try_set`,
/// break-before-make) are the engine's own, so every entry the walker
/// follows is one the engine built, whatever a caller's visitor does.
pub struct VisitCtx<'a, F: PteFormat, M: MmOps> {
    /// The descriptor format.
    pub fmt: &'a F,
    /// The table-page allocator.
    pub mm: &'a M,
    /// The entry's value, read once before the visit.
    pub old: u64,
    /// The walk's current address. Not aligned to the entry's granule on the
    /// first visit of a walk that starts inside a block.
    pub addr: u64,
    /// Start of the walk (page aligned).
    pub start: u64,
    /// End of the walk (exclusive, page aligned).
    pub end: u64,
    /// Level of the entry.
    pub level: u32,
    /// The walk's flags.
    pub flags: WalkFlags,
    entry: &'a AtomicU64,
    count: Option<&'a AtomicU32>,
    /// The table's id for the break-before-make monitor.
    #[cfg(any(feature = "bbm-trace", feature = "bbm-export"))]
    table: usize,
}

impl<F: PteFormat, M: MmOps> VisitCtx<'_, F, M> {
    /// The monitor's trace point for a store of this walk: the entry at
    /// `level` starting at `start` went from `old` to `new`.
    #[inline(always)]
    pub(crate) fn trace_store(&self, start: u64, level: u32, old: u64, new: u64) {
        #[cfg(feature = "bbm-trace")]
        crate::bbm::store(self.table, self.fmt, start, level, old, new);
        #[cfg(feature = "bbm-export")]
        crate::bbm::export::emit(&crate::bbm::Event::Store {
            table: self.table,
            start,
            level,
            old,
            new,
        });
        #[cfg(not(any(feature = "bbm-trace", feature = "bbm-export")))]
        let _ = (start, level, old, new);
    }

    /// Whether this is a shared walk.
    #[inline]
    pub fn shared(&self) -> bool {
        self.flags.contains(WalkFlags::SHARED)
    }

    /// Bytes the entry covers.
    #[inline]
    pub fn granule(&self) -> u64 {
        self.fmt.granule(self.level)
    }

    /// First address the entry covers.
    #[inline]
    pub fn entry_start(&self) -> u64 {
        self.addr & !(self.granule() - 1)
    }

    /// Whether the whole entry lies inside the walk's range.
    #[inline]
    pub fn entry_inside_range(&self) -> bool {
        let s = self.entry_start();
        s >= self.start && s + self.granule() <= self.end
    }

    /// The next-level table this entry points to, if it is a table.
    #[inline]
    pub fn child_table(&self) -> Option<u64> {
        self.fmt
            .is_table(self.old, self.level)
            .then(|| self.fmt.output_address(self.old))
    }

    /// The value of the entry after this one in the same table page, or
    /// `None` for the page's last entry: a hint of what the walk visits
    /// next (a scan prefetches its table), read once and relaxed.
    #[inline]
    pub(crate) fn next_sibling(&self) -> Option<u64> {
        let idx = self.fmt.index(self.addr, self.level);
        if idx + 1 >= self.fmt.entries_per_table() {
            return None;
        }
        let next = (self.entry as *const AtomicU64).wrapping_add(1);
        // SAFETY: `entry` is entry `idx` of a live table page of
        // `entries_per_table` entries (the walker took it at the index of
        // `addr`), so entry `idx + 1` is in the same page, which the walk
        // keeps alive; table entries are only accessed atomically.
        Some(unsafe { &*next }.load(Ordering::Relaxed))
    }

    #[inline]
    fn adjust_count(&self, old: u64, new: u64) {
        if let Some(c) = self.count {
            match (old != 0, new != 0) {
                (false, true) => {
                    c.fetch_add(1, Ordering::Relaxed);
                }
                (true, false) => {
                    c.fetch_sub(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }

    /// Replaces the entry's value `old` with `new`: a plain store in an
    /// exclusive walk, a compare-and-swap in a shared one. Keeps the table's
    /// entry count.
    ///
    /// # Errors
    /// [`Error::Again`] when a shared walk lost a race for the entry.
    #[inline]
    pub(crate) fn try_set(&self, new: u64) -> Result<()> {
        if self.shared() {
            self.entry
                .compare_exchange(self.old, new, Ordering::AcqRel, Ordering::Acquire)
                .map_err(|_| Error::Again { ipa: self.addr })?;
        } else {
            self.entry.store(new, Ordering::Release);
        }
        self.trace_store(self.entry_start(), self.level, self.old, new);
        self.adjust_count(self.old, new);
        Ok(())
    }

    /// The "break" of break-before-make: replaces a valid entry with the lock
    /// marker and invalidates what it translated (the entry at its level for
    /// a leaf, its whole range for a table), so no CPU uses the old entry once
    /// the new one is made.
    ///
    /// # Errors
    /// [`Error::Again`] if the entry is locked by another walker or changed
    /// since it was read.
    pub(crate) fn try_break(&self, tlb: &dyn TlbInvalidate) -> Result<()> {
        if self.fmt.is_locked(self.old) {
            return Err(Error::Again { ipa: self.addr });
        }
        let locked = self.fmt.locked();
        if self.shared() {
            self.entry
                .compare_exchange(self.old, locked, Ordering::AcqRel, Ordering::Acquire)
                .map_err(|_| Error::Again { ipa: self.addr })?;
        } else {
            self.entry.store(locked, Ordering::Release);
        }
        self.trace_store(self.entry_start(), self.level, self.old, locked);
        if self.fmt.is_table(self.old, self.level) {
            tlb.flush_range(self.entry_start(), self.granule());
        } else if self.fmt.is_valid(self.old) {
            tlb.flush_ipa(self.addr, Some(self.level));
        }
        if self.old != 0 {
            self.adjust_count(self.old, 0);
        }
        Ok(())
    }

    /// The "break" of a batched break-before-make (an exclusive walk that
    /// breaks many entries and then invalidates them all at once, see
    /// `collapse`): replaces the entry with the lock marker without an
    /// invalidation; the caller invalidates before any `make`.
    pub(crate) fn break_unflushed(&self) {
        debug_assert!(!self.shared(), "only exclusive walks batch their breaks");
        self.entry.store(self.fmt.locked(), Ordering::Release);
        self.trace_store(self.entry_start(), self.level, self.old, self.fmt.locked());
        if self.old != 0 {
            self.adjust_count(self.old, 0);
        }
    }

    /// The "make" of break-before-make: publishes `new` over the lock marker
    /// with release ordering, so a table built before is visible to any
    /// walker that reads the new entry.
    pub(crate) fn make(&self, new: u64) {
        debug_assert!(self.fmt.is_locked(self.entry.load(Ordering::Relaxed)));
        self.entry.store(new, Ordering::Release);
        self.trace_store(self.entry_start(), self.level, self.fmt.locked(), new);
        self.adjust_count(0, new);
    }
}

/// Called by the walker for each visit its flags ask for.
pub trait Visitor<F: PteFormat, M: MmOps> {
    /// Visits one entry.
    ///
    /// # Errors
    /// Any error stops the walk and is returned to the walk's caller, except
    /// [`Error::Again`] in a walk with [`WalkFlags::IGNORE_AGAIN`].
    fn visit(&mut self, ctx: &VisitCtx<'_, F, M>, visit: Visit) -> Result<WalkAction>;
}

impl<F: PteFormat, M: MmOps, T> Visitor<F, M> for T
where
    T: FnMut(&VisitCtx<'_, F, M>, Visit) -> Result<WalkAction>,
{
    fn visit(&mut self, ctx: &VisitCtx<'_, F, M>, visit: Visit) -> Result<WalkAction> {
        self(ctx, visit)
    }
}

/// What a walk did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStats {
    /// Entries read by the walker (visited or not).
    pub entries: u64,
    /// Visitor calls made.
    pub visits: u64,
}

enum Flow {
    Next,
    LeaveTable,
}

struct Walker<'a, F: PteFormat, M: MmOps, V: Visitor<F, M>> {
    fmt: &'a F,
    mm: &'a M,
    flags: WalkFlags,
    start: u64,
    end: u64,
    addr: u64,
    visitor: &'a mut V,
    stats: WalkStats,
    #[cfg(any(feature = "bbm-trace", feature = "bbm-export"))]
    table: usize,
}

impl<'a, F: PteFormat, M: MmOps, V: Visitor<F, M>> Walker<'a, F, M, V> {
    /// Bytes covered by the table that holds entries of `level`.
    #[inline]
    fn table_span(&self, level: u32) -> u64 {
        if level == self.fmt.start_level() {
            self.fmt.root_page_span()
        } else {
            self.fmt.granule(level - 1)
        }
    }

    #[inline]
    fn call(&mut self, ctx: &VisitCtx<'_, F, M>, visit: Visit) -> Result<WalkAction> {
        self.stats.visits += 1;
        match self.visitor.visit(ctx, visit) {
            Err(Error::Again { .. }) if self.flags.contains(WalkFlags::IGNORE_AGAIN) => {
                Ok(WalkAction::Continue)
            }
            r => r,
        }
    }

    fn walk_table(&mut self, table: u64, level: u32, counted: bool) -> Result<()> {
        let entries = self.fmt.entries_per_table();
        let mut idx = self.fmt.index(self.addr, level);
        let count = counted.then(|| self.mm.entry_count(table));
        while idx < entries && self.addr < self.end {
            // SAFETY: `table` is a live table page of `mm` (the root, or a
            // child read from a valid table entry while the caller's read
            // guard or exclusive access keeps it from being freed), and
            // `idx < entries`.
            let entry = unsafe { entry_ref(self.mm, table, idx) };
            if let Flow::LeaveTable = self.visit(entry, count, level)? {
                break;
            }
            idx += 1;
        }
        Ok(())
    }

    #[inline]
    fn visit(&mut self, entry: &AtomicU64, count: Option<&AtomicU32>, level: u32) -> Result<Flow> {
        let fmt = self.fmt;
        let mut old = entry.load(Ordering::Acquire);
        let mut table = fmt.is_table(old, level);
        self.stats.entries += 1;
        let visit_addr = self.addr;
        let mut action = WalkAction::Continue;
        let kind = if table { Visit::TablePre } else { Visit::Leaf };
        let wanted = if table {
            WalkFlags::TABLE_PRE
        } else {
            WalkFlags::LEAF
        };
        if self.flags.contains(wanted) {
            let ctx = self.ctx(entry, count, old, visit_addr, level);
            action = self.call(&ctx, kind)?;
            // Re-read: the visitor may have installed or removed a table.
            old = entry.load(Ordering::Acquire);
            table = fmt.is_table(old, level);
        }
        let granule = fmt.granule(level);
        match action {
            WalkAction::SkipSiblings => {
                let span = self.table_span(level);
                self.addr = (self.addr & !(span - 1)).saturating_add(span);
                return Ok(Flow::LeaveTable);
            }
            WalkAction::SkipChildren => {
                self.addr = (self.addr & !(granule - 1)) + granule;
                return Ok(Flow::Next);
            }
            WalkAction::Continue => {}
        }
        let no_descent =
            self.flags.contains(WalkFlags::NO_LAST_LEVEL_TABLES) && level + 1 == fmt.last_level();
        if !table || no_descent {
            self.addr = (self.addr & !(granule - 1)) + granule;
            return Ok(Flow::Next);
        }
        let child = fmt.output_address(old);
        self.walk_table(child, level + 1, true)?;
        if self.flags.contains(WalkFlags::TABLE_POST) {
            let ctx = self.ctx(entry, count, old, visit_addr, level);
            if let WalkAction::SkipSiblings = self.call(&ctx, Visit::TablePost)? {
                let span = self.table_span(level);
                self.addr = (visit_addr & !(span - 1)).saturating_add(span);
                return Ok(Flow::LeaveTable);
            }
        }
        Ok(Flow::Next)
    }

    #[inline]
    fn ctx<'c>(
        &self,
        entry: &'c AtomicU64,
        count: Option<&'c AtomicU32>,
        old: u64,
        addr: u64,
        level: u32,
    ) -> VisitCtx<'c, F, M>
    where
        'a: 'c,
    {
        VisitCtx {
            fmt: self.fmt,
            mm: self.mm,
            old,
            addr,
            start: self.start,
            end: self.end,
            level,
            flags: self.flags,
            entry,
            count,
            #[cfg(any(feature = "bbm-trace", feature = "bbm-export"))]
            table: self.table,
        }
    }
}

/// Walks `[addr, addr + size)` of the table rooted at `root`.
///
/// The range is widened to whole pages (the end is computed from the
/// unaligned address, so a range that straddles a page boundary covers both
/// pages).
///
/// # Errors
/// [`Error::OutOfRange`] if the range leaves the IPA space; otherwise the
/// first error a visitor returned.
///
/// # Safety
/// `root` is the root of a table built with `fmt` and `mm` whose pages stay
/// allocated for the walk: the caller holds the MMU lock for writing, or for
/// reading with [`WalkFlags::SHARED`] (the walk pins a read guard itself).
pub(crate) unsafe fn walk<F: PteFormat, M: MmOps, V: Visitor<F, M>>(
    fmt: &F,
    mm: &M,
    root: u64,
    addr: u64,
    size: u64,
    flags: WalkFlags,
    visitor: &mut V,
) -> Result<WalkStats> {
    let page = fmt.page_size();
    let limit = fmt.ipa_limit();
    let end = addr
        .checked_add(size)
        .and_then(|e| e.checked_add(page - 1))
        .map(|e| e & !(page - 1))
        .ok_or(Error::OutOfRange {
            ipa: addr,
            size,
            limit,
        })?;
    if addr > limit || end > limit {
        return Err(Error::OutOfRange {
            ipa: addr,
            size,
            limit,
        });
    }
    let start = addr & !(page - 1);
    let _guard = mm.read_guard();
    let mut w = Walker {
        fmt,
        mm,
        flags,
        start,
        end,
        addr: start,
        visitor,
        stats: WalkStats::default(),
        #[cfg(any(feature = "bbm-trace", feature = "bbm-export"))]
        table: mm.phys_to_virt(root) as usize,
    };
    let span = fmt.root_page_span();
    let mut root_index = (start / span) as usize;
    while w.addr < w.end && root_index < fmt.root_pages() {
        let root_page = root + (root_index as u64) * page;
        w.walk_table(root_page, fmt.start_level(), false)?;
        root_index += 1;
    }
    Ok(w.stats)
}
