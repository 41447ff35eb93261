//! The checker behind the trace points: per-entry records of what still
//! needs an invalidation, replayed against each store, free and report.

use super::event::Flush;
use super::rule::{Rule, Violation};
use crate::format::PteFormat;
use crate::tlbi::{Barrier, Insn, TlbiOp};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard, Once};

/// What the monitor needs of a descriptor, decoded by its format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Desc {
    valid: bool,
    table: bool,
    oa: u64,
    writable: bool,
    dirty: bool,
}

impl Desc {
    fn of<F: PteFormat>(fmt: &F, pte: u64, level: u32) -> Desc {
        if !fmt.is_valid(pte) {
            return Desc::default();
        }
        let table = fmt.is_table(pte, level);
        Desc {
            valid: true,
            table,
            oa: fmt.output_address(pte),
            writable: !table && pte & fmt.write_bit() != 0,
            dirty: !table && fmt.hw_dirty_bits().is_some_and(|h| h.is_dirty(pte)),
        }
    }

    /// Whether `to` translates differently from `self` (another output
    /// address, or a table where a leaf was or back).
    fn remaps(&self, to: &Desc) -> bool {
        self.table != to.table || self.oa != to.oa
    }
}

/// What an entry still needs a completed invalidation for.
#[derive(Clone, Copy, Debug)]
enum Pending {
    /// A valid entry `prev` was broken (made invalid).
    Break { prev: Desc, size: u64 },
    /// A leaf lost its write permission or hardware dirty state.
    Protect { size: u64 },
}

impl Pending {
    fn covered_by(&self, start: u64, s: Flush) -> bool {
        let (size, table) = match *self {
            Pending::Break { prev, size } => (size, prev.table),
            Pending::Protect { size } => (size, false),
        };
        covers(s, start, size, table)
    }

    /// Whether a CPU could still write through the old translation.
    fn was_writable(&self) -> bool {
        match *self {
            Pending::Break { prev, .. } => prev.writable,
            Pending::Protect { .. } => true,
        }
    }
}

/// A table page unlinked from the entry at `start` (covering `size`).
#[derive(Clone, Copy, Debug)]
struct Unlinked {
    start: u64,
    size: u64,
    level: u32,
    invalidated: bool,
}

/// Whether invalidation `s` removes every cached translation of the entry
/// at `[start, start + size)`: any address of a leaf, the whole range of a
/// table (its walk-cache entries and the leaves below it).
fn covers(s: Flush, start: u64, size: u64, table: bool) -> bool {
    let end = start.saturating_add(size);
    match s {
        Flush::All => true,
        Flush::Ipa(a) => !table && a >= start && a < end,
        Flush::Range(a, n) => {
            let e = a.saturating_add(n);
            if table {
                a <= start && e >= end
            } else {
                a < end && e > start
            }
        }
    }
}

#[derive(Default)]
struct Checker {
    entries: BTreeMap<(usize, u64, u32), Pending>,
    unlinked: BTreeMap<(usize, u64), Unlinked>,
    torn_down: BTreeSet<usize>,
    expect: BTreeSet<usize>,
    expected: Vec<Violation>,
    violations: Vec<Violation>,
}

static CHECKER: Mutex<Option<Checker>> = Mutex::new(None);
static EXIT_HOOK: Once = Once::new();

thread_local! {
    /// Invalidations held by [`defer`] on this thread.
    static DEFERRED: RefCell<Option<Vec<(usize, Flush)>>> = const { RefCell::new(None) };
    /// The arm64 sequence being built on this thread.
    static SEQUENCE: RefCell<Vec<Insn>> = const { RefCell::new(Vec::new()) };
}

pub(super) fn sequence_insn(insn: Insn) {
    SEQUENCE.with(|s| s.borrow_mut().push(insn));
}

pub(super) fn sequence_end() {
    let seq = SEQUENCE.with(|s| core::mem::take(&mut *s.borrow_mut()));
    if let Err(operand) = check_sequence(&seq) {
        with(|c| c.violate(Rule::BarrierMissing, 0, operand, 0));
    }
}

/// Whether `seq` has the barriers a TLBI sequence needs: a DSB covering
/// the TLBIs' domain before the first TLBI (a store DSB suffices: it
/// orders the table stores), and a full DSB of that domain after the last
/// (only a full DSB waits for the TLBIs to complete). `Err` carries the
/// first TLBI's operand.
pub(crate) fn check_sequence(seq: &[Insn]) -> Result<(), u64> {
    let tlbis: Vec<(usize, TlbiOp, u64)> = seq
        .iter()
        .enumerate()
        .filter_map(|(i, x)| match *x {
            Insn::Tlbi { op, operand } => Some((i, op, operand)),
            Insn::Barrier(_) => None,
        })
        .collect();
    let (Some(&(first, _, operand)), Some(&(last, ..))) = (tlbis.first(), tlbis.last()) else {
        return Ok(());
    };
    let local = tlbis.iter().all(|&(_, op, _)| !op.broadcast());
    let orders_stores = |b: Barrier| match b {
        Barrier::DsbIshst | Barrier::DsbIsh => true,
        Barrier::DsbNshst | Barrier::DsbNsh => local,
        Barrier::Isb => false,
    };
    let completes = |b: Barrier| match b {
        Barrier::DsbIsh => true,
        Barrier::DsbNsh => local,
        _ => false,
    };
    let before = seq[..first]
        .iter()
        .any(|x| matches!(*x, Insn::Barrier(b) if orders_stores(b)));
    let after = seq[last + 1..]
        .iter()
        .any(|x| matches!(*x, Insn::Barrier(b) if completes(b)));
    if before && after {
        Ok(())
    } else {
        Err(operand)
    }
}

fn with<R>(f: impl FnOnce(&mut Checker) -> R) -> R {
    // A panic while holding the lock is a bug in the checker; its state is
    // still consistent enough to report, so recover the guard.
    let mut g: MutexGuard<'_, Option<Checker>> = CHECKER.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Checker::default))
}

impl Checker {
    /// Records the table `o` links (where `o` is a table entry) as unlinked
    /// from the entry at `level` whose range starts at `start` in `table`,
    /// not yet invalidated.
    fn unlinked_by(&mut self, table: usize, o: Desc, start: u64, size: u64, level: u32) {
        if o.table {
            let u = Unlinked {
                start,
                size,
                level,
                invalidated: false,
            };
            self.unlinked.insert((table, o.oa), u);
        }
    }

    fn violate(&mut self, rule: Rule, table: usize, ipa: u64, level: u32) {
        let v = Violation {
            rule,
            table,
            ipa,
            level,
        };
        if self.expect.contains(&table) {
            self.expected.push(v);
            return;
        }
        std::eprintln!("{v}");
        self.violations.push(v);
        EXIT_HOOK.call_once(register_exit_check);
    }

    fn invalidate(&mut self, table: usize, s: Flush) {
        self.entries
            .retain(|&(t, start, _), p| t != table || !p.covered_by(start, s));
        for (_, u) in self.unlinked.range_mut((table, 0)..=(table, u64::MAX)) {
            if covers(s, u.start, u.size, true) {
                u.invalidated = true;
            }
        }
    }
}

/// Trace point: the engine replaced `old` with `new` in the entry at
/// `level` whose range starts at `start` in table `table`.
pub(crate) fn store<F: PteFormat>(
    table: usize,
    fmt: &F,
    start: u64,
    level: u32,
    old: u64,
    new: u64,
) {
    let (o, n) = (Desc::of(fmt, old, level), Desc::of(fmt, new, level));
    // The common stores need no record and can break no rule: a first map
    // over an invalid entry nobody broke is checked below, but a valid to
    // valid change of permission or access flag alone has nothing to check
    // unless it protects.
    if o.valid && n.valid && !o.remaps(&n) && o.writable == n.writable && o.dirty == n.dirty {
        return;
    }
    let size = fmt.granule(level);
    with(|c| {
        if c.torn_down.contains(&table) {
            return;
        }
        let key = (table, start, level);
        if n.valid {
            let prev = c.entries.get(&key).copied();
            if o.valid && o.remaps(&n) {
                c.violate(Rule::ChangeWithoutBreak, table, start, level);
                c.unlinked_by(table, o, start, size, level);
            } else if let Some(Pending::Break { prev, .. }) = prev.filter(|_| !o.valid) {
                if prev.remaps(&n) {
                    c.violate(Rule::MakeBeforeInvalidate, table, start, level);
                }
            }
            let protects =
                o.valid && !o.remaps(&n) && ((o.writable && !n.writable) || (o.dirty && !n.dirty));
            let stale_writable = prev.is_some_and(|p| p.was_writable()) && !n.writable;
            if protects || stale_writable {
                c.entries.insert(key, Pending::Protect { size });
            } else {
                c.entries.remove(&key);
            }
        } else if o.valid {
            c.entries.insert(key, Pending::Break { prev: o, size });
            c.unlinked_by(table, o, start, size, level);
        }
    });
}

pub(super) fn invalidated(table: usize, s: Flush) {
    let held = DEFERRED.with(|d| {
        d.borrow_mut()
            .as_mut()
            .map(|v| v.push((table, s)))
            .is_some()
    });
    if !held {
        with(|c| c.invalidate(table, s));
    }
}

pub(super) fn free_tables(table: usize, pages: &[u64]) {
    with(|c| {
        if c.torn_down.contains(&table) {
            return;
        }
        for &pa in pages {
            if let Some(u) = c.unlinked.remove(&(table, pa)) {
                if !u.invalidated {
                    c.violate(Rule::FreeBeforeInvalidate, table, u.start, u.level);
                }
            }
        }
    });
}

/// Trace point: GET or CLEAR is about to report pages of `table` clean.
pub(crate) fn report_clean(table: usize) {
    with(|c| {
        let stale: Vec<(u64, u32)> = c
            .entries
            .range((table, 0, 0)..=(table, u64::MAX, u32::MAX))
            .filter(|(_, p)| p.was_writable())
            .map(|(&(_, start, level), _)| (start, level))
            .collect();
        for (start, level) in stale {
            c.violate(Rule::ReportBeforeInvalidate, table, start, level);
        }
    });
}

pub(super) fn teardown(table: usize, gone: bool) {
    with(|c| {
        c.entries.retain(|&(t, _, _), _| t != table);
        c.unlinked.retain(|&(t, _), _| t != table);
        if gone {
            c.torn_down.remove(&table);
            c.expect.remove(&table);
        } else {
            c.torn_down.insert(table);
        }
    });
}

/// Runs `f` with this thread's completed invalidations held; returns
/// `f`'s result and what was held.
pub(super) fn defer<R>(f: impl FnOnce() -> R) -> (R, Vec<(usize, Flush)>) {
    let outer = DEFERRED.with(|d| d.borrow_mut().replace(Vec::new()));
    let r = f();
    let events = DEFERRED.with(|d| core::mem::replace(&mut *d.borrow_mut(), outer));
    (r, events.unwrap_or_default())
}

pub(super) fn complete(events: Vec<(usize, Flush)>) {
    for (table, s) in events {
        invalidated(table, s);
    }
}

/// Marks `table` as one a test breaks the rules on on purpose: its
/// violations are kept apart ([`take_table_violations`]) and do not fail
/// the process.
pub fn expect_violations(table: usize) {
    with(|c| {
        c.expect.insert(table);
    });
}

/// Takes the violations found on a table marked with [`expect_violations`].
pub fn take_table_violations(table: usize) -> Vec<Violation> {
    with(|c| {
        let (mine, rest) = core::mem::take(&mut c.expected)
            .into_iter()
            .partition(|v| v.table == table);
        c.expected = rest;
        mine
    })
}

/// The violations found so far on tables no test marked.
pub fn violations() -> Vec<Violation> {
    with(|c| c.violations.clone())
}

/// Takes the violations found so far on tables no test marked (a test
/// that shows a real sequence is caught takes them, so the process does
/// not fail at exit for them).
pub fn take_violations() -> Vec<Violation> {
    with(|c| core::mem::take(&mut c.violations))
}

extern "C" {
    fn atexit(cb: extern "C" fn()) -> core::ffi::c_int;
    fn _exit(status: core::ffi::c_int) -> !;
}

fn register_exit_check() {
    // SAFETY: `atexit` is the C library's, which every std program links;
    // `exit_check` is an `extern "C" fn` that lives for the whole program.
    unsafe { atexit(exit_check) };
}

extern "C" fn exit_check() {
    let left = violations();
    if left.is_empty() {
        return;
    }
    std::eprintln!(
        "break-before-make monitor: {} violation(s) in this process:",
        left.len()
    );
    for v in &left {
        std::eprintln!("  {v}");
    }
    // SAFETY: `_exit` ends the process at once without running further
    // exit handlers, which is what a failing check at exit wants (calling
    // `exit` again from a handler is undefined).
    unsafe { _exit(101) }
}
