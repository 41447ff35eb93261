//! The break-before-make monitor: every descriptor store the engine makes,
//! every invalidation it completes and every table page it frees pass a
//! trace point here; a checker replays them per table entry against the
//! architecture's rules (Arm ARM D8.16 "TLB maintenance requirements";
//! Linux's `arch/arm64/kvm/hyp/pgtable.c`, `stage2_try_break_pte`; the
//! Casemate and relaxed-VM work on pKVM):
//!
//! - [`Rule::ChangeWithoutBreak`], [`Rule::MakeBeforeInvalidate`]: a valid
//!   entry changes its output address or block size (leaf to table or back)
//!   only through invalid, DSB, TLBI covering it, DSB: a store of the new
//!   valid value over the old one, or over an invalid value whose break no
//!   completed invalidation has covered yet, is a violation;
//! - [`Rule::FreeBeforeInvalidate`]: a table page is freed only after the
//!   invalidation that covers its last use (the range its entry mapped);
//! - [`Rule::ReportBeforeInvalidate`]: a write protection (or a hardware
//!   dirty clean, or an unmap of a writable leaf) is invalidated before GET
//!   or CLEAR reports the page clean;
//! - a permission relaxation, or an access-flag change, needs no
//!   invalidation (a CPU with the old entry takes at worst a spurious fault).
//!
//! An invalidation counts once it has completed: when the backend's call
//! returns (the [`crate::TlbInvalidate`] contract, barriers included), or,
//! where a backend only queues it, when the backend says it ran
//! ([`defer_invalidations`]).
//!
//! With the `bbm-trace` feature off (the default, the product build) every
//! trace point is an empty inline function: the engine pays nothing. With
//! it on (the test builds: the engine's, the simulated VM's and the arm64
//! model's dev-dependencies turn it on), a violation on a table that no
//! test marked with `expect_violations` is recorded and makes the process
//! exit with status 101 at its end, after printing each one: a test binary
//! in which any test broke a rule fails as a whole.
//!
//! With the `bbm-export` feature (no `std` needed), every trace point is
//! also handed as an [`Event`] to a sink the embedder installs
//! (`export::set_sink`): a `no_std` build (the engine at EL2) records
//! them where a host can read them, and the host's checker replays them
//! (`export::replay`, with `bbm-trace`). Invalidations are the
//! embedder's to record, as its backend completes them.
//!
//! The monitor keys entries by (table, entry start, level), not by where
//! the entry lives: a stale translation is held by address, so a break of
//! an entry whose table page is freed and later replaced still has to be
//! invalidated before the new table's entry maps something else there.

#[cfg(feature = "bbm-trace")]
mod checker;
pub mod export;
#[cfg(all(test, feature = "bbm-trace"))]
mod tests;

#[cfg(feature = "bbm-trace")]
use crate::format::PteFormat;
use crate::tlb::TlbInvalidate;
use alloc::sync::Arc;
use core::fmt;

/// The rule a violation broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A valid entry was overwritten by a valid one with another output
    /// address or block size, without a break.
    ChangeWithoutBreak,
    /// An entry was made with another output address or block size while
    /// its break had not been covered by a completed invalidation.
    MakeBeforeInvalidate,
    /// A table page was freed before an invalidation covered the range its
    /// unlinked entry had mapped.
    FreeBeforeInvalidate,
    /// GET or CLEAR reported pages clean while a write protection (or
    /// clean, or unmap) of one of them was not yet invalidated.
    ReportBeforeInvalidate,
    /// An arm64 invalidation sequence lacks its barriers: a DSB that makes
    /// the table stores visible before the first TLBI (`DSB ISHST`), or one
    /// that waits for the TLBIs to complete after the last (`DSB ISH`; the
    /// `NSH` forms for a sequence of local TLBIs only). Reported with
    /// table 0 and the first TLBI's operand as the address.
    BarrierMissing,
}

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// The table ([`crate::PageTable::bbm_id`]).
    pub table: usize,
    /// First address of the entry (or of the freed table's range).
    pub ipa: u64,
    /// Level of the entry (of the freed table's parent entry).
    pub level: u32,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.rule {
            Rule::ChangeWithoutBreak => {
                "valid entry changed output address or size without a break"
            }
            Rule::MakeBeforeInvalidate => {
                "entry made before the invalidation of its break completed"
            }
            Rule::FreeBeforeInvalidate => "table page freed before the invalidation of its range",
            Rule::ReportBeforeInvalidate => {
                "page reported clean before its write protection was invalidated"
            }
            Rule::BarrierMissing => {
                "TLBI sequence without a DSB before its first or after its last TLBI"
            }
        };
        write!(
            f,
            "break-before-make: {what} (table {:#x}, IPA {:#x}, level {})",
            self.table, self.ipa, self.level
        )
    }
}

/// What an invalidation covers.
#[cfg(feature = "bbm-trace")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The translation of one address (`TLBI IPAS2E1IS`): the leaf that
    /// maps it, whatever its size.
    Ipa(u64),
    /// Every translation in `[start, start + size)` (`TLBI RIPAS2E1IS`),
    /// walk caches included.
    Range(u64, u64),
    /// The whole VMID.
    All,
}

/// What the monitor needs of a descriptor, decoded by its format.
#[cfg(feature = "bbm-trace")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Desc {
    pub(crate) valid: bool,
    pub(crate) table: bool,
    pub(crate) oa: u64,
    pub(crate) writable: bool,
    pub(crate) dirty: bool,
}

#[cfg(feature = "bbm-trace")]
impl Desc {
    pub(crate) fn of<F: PteFormat>(fmt: &F, pte: u64, level: u32) -> Desc {
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
    pub(crate) fn remaps(&self, to: &Desc) -> bool {
        self.table != to.table || self.oa != to.oa
    }
}

/// Whether this build carries the monitor (the `bbm-trace` feature).
pub const ENABLED: bool = cfg!(feature = "bbm-trace");

/// Trace point: the engine replaced `old` with `new` in the entry at
/// `level` whose range starts at `start` in table `table`.
#[cfg(feature = "bbm-trace")]
#[inline(always)]
pub(crate) fn store<F: PteFormat>(
    table: usize,
    fmt: &F,
    start: u64,
    level: u32,
    old: u64,
    new: u64,
) {
    checker::store(table, fmt, start, level, old, new);
}

/// Trace point: the engine is about to free these table pages of `table`.
#[inline(always)]
pub(crate) fn free_tables(table: usize, pages: &[u64]) {
    #[cfg(feature = "bbm-trace")]
    checker::free_tables(table, pages);
    #[cfg(feature = "bbm-export")]
    for &pa in pages {
        export::emit(&Event::FreeTable { table, pa });
    }
    #[cfg(not(any(feature = "bbm-trace", feature = "bbm-export")))]
    let _ = (table, pages);
}

/// Trace point: GET or CLEAR is about to report pages of `table` clean.
#[cfg(feature = "bbm-trace")]
#[inline(always)]
pub(crate) fn report_clean(table: usize) {
    checker::report_clean(table);
}

/// Trace point: `table` is being torn down (no CPU uses it any more, its
/// stores and frees from now on are not checked) or is gone.
#[inline(always)]
pub(crate) fn teardown(table: usize, gone: bool) {
    #[cfg(feature = "bbm-trace")]
    checker::teardown(table, gone);
    #[cfg(feature = "bbm-export")]
    export::emit(&Event::Teardown { table, gone });
    #[cfg(not(any(feature = "bbm-trace", feature = "bbm-export")))]
    let _ = (table, gone);
}

/// Trace point: the arm64 backend emitted `insn` in the sequence it is
/// building on this thread.
#[inline(always)]
pub(crate) fn sequence_insn(insn: crate::tlb::arm64::Insn) {
    #[cfg(feature = "bbm-trace")]
    checker::sequence_insn(insn);
    #[cfg(not(feature = "bbm-trace"))]
    let _ = insn;
}

/// Trace point: the arm64 backend's sequence on this thread is complete;
/// its barriers are checked ([`Rule::BarrierMissing`]).
#[inline(always)]
pub(crate) fn sequence_end() {
    #[cfg(feature = "bbm-trace")]
    checker::sequence_end();
}

/// The table's invalidation backend, with its completions traced (itself
/// when the monitor is off).
#[inline(always)]
pub(crate) fn traced_tlb(table: usize, tlb: Arc<dyn TlbInvalidate>) -> Arc<dyn TlbInvalidate> {
    #[cfg(feature = "bbm-trace")]
    {
        Arc::new(checker::TracedTlb { inner: tlb, table })
    }
    #[cfg(not(feature = "bbm-trace"))]
    {
        let _ = table;
        tlb
    }
}

/// Invalidations the engine issued inside [`defer_invalidations`], held
/// until the backend says they ran.
#[must_use = "complete() says when the queued invalidations ran"]
#[derive(Debug, Default)]
pub struct Deferred {
    #[cfg(feature = "bbm-trace")]
    events: alloc::vec::Vec<(usize, Scope)>,
}

impl Deferred {
    /// The held invalidations completed now (the CPU that was to execute
    /// them did, barriers included).
    pub fn complete(self) {
        #[cfg(feature = "bbm-trace")]
        checker::complete(self.events);
    }
}

/// Runs `f` with the invalidations the engine issues on this thread
/// counted as queued, not completed, when their backend call returns: for
/// a backend that only collects them for a CPU to execute later. Returns
/// `f`'s result and what was held. Without the monitor, just runs `f`.
pub fn defer_invalidations<R>(f: impl FnOnce() -> R) -> (R, Deferred) {
    #[cfg(feature = "bbm-trace")]
    {
        checker::defer(f)
    }
    #[cfg(not(feature = "bbm-trace"))]
    {
        (f(), Deferred::default())
    }
}

#[cfg(feature = "bbm-trace")]
pub use checker::{expect_violations, take_table_violations, take_violations, violations};
pub use export::{Event, Flush};
