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
mod event;
pub mod export;
mod rule;
#[cfg(all(test, feature = "bbm-trace"))]
mod tests;

// Trace points with nothing to do without the checker: a descriptor
// store, GET or CLEAR about to report pages clean.
#[cfg(feature = "bbm-trace")]
pub(crate) use checker::{report_clean, store};
pub use rule::{Rule, Violation};

/// Whether this build carries the monitor (the `bbm-trace` feature).
pub const ENABLED: bool = cfg!(feature = "bbm-trace");

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
pub(crate) fn sequence_insn(insn: crate::tlbi::Insn) {
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

/// Trace point: an invalidation of `table` completed (its backend's call
/// returned, barriers included; held while [`defer_invalidations`] runs).
#[cfg(feature = "bbm-trace")]
#[inline(always)]
pub(crate) fn invalidated(table: usize, flush: Flush) {
    checker::invalidated(table, flush);
}

/// Invalidations the engine issued inside [`defer_invalidations`], held
/// until the backend says they ran.
#[must_use = "complete() says when the queued invalidations ran"]
#[derive(Debug, Default)]
pub struct Deferred {
    #[cfg(feature = "bbm-trace")]
    events: alloc::vec::Vec<(usize, Flush)>,
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
        let (r, events) = checker::defer(f);
        (r, Deferred { events })
    }
    #[cfg(not(feature = "bbm-trace"))]
    {
        (f(), Deferred::default())
    }
}

#[cfg(feature = "bbm-trace")]
pub use checker::{expect_violations, take_table_violations, take_violations, violations};
pub use export::{Event, Flush};
