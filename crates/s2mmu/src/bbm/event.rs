//! The monitor's trace points as data: what the checker keeps per
//! invalidation, and what an embedder's sink receives and a host replays
//! ([`super::export`]).

/// The kind of invalidation an [`Event::Invalidate`] completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flush {
    /// The translation of one address (`TLBI IPAS2E1IS`): the leaf that
    /// maps it, whatever its size.
    Ipa(u64),
    /// Every translation of `[start, start + size)` (`TLBI RIPAS2E1IS`),
    /// walk caches included.
    Range(u64, u64),
    /// The whole VMID (`TLBI VMALLS12E1IS`).
    All,
}

/// One trace point's event. `table` is the table's id
/// ([`crate::PageTable::bbm_id`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// The entry at `level` whose range starts at `start` went from `old`
    /// to `new`.
    Store {
        /// The table.
        table: usize,
        /// First address of the entry's range.
        start: u64,
        /// Level of the entry.
        level: u32,
        /// The descriptor before.
        old: u64,
        /// The descriptor after.
        new: u64,
    },
    /// An invalidation completed (barriers included). Recorded by the
    /// embedder's backend, never by the engine.
    Invalidate {
        /// The table whose VMID it covered.
        table: usize,
        /// What it covered.
        flush: Flush,
    },
    /// The table page at physical address `pa` is about to be freed.
    FreeTable {
        /// The table.
        table: usize,
        /// The page.
        pa: u64,
    },
    /// GET or CLEAR is about to report pages clean.
    ReportClean {
        /// The table.
        table: usize,
    },
    /// The table is being torn down (`gone` false) or is gone (`gone`).
    Teardown {
        /// The table.
        table: usize,
        /// Whether it is gone.
        gone: bool,
    },
}
