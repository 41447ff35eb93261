//! The split benchmark's vocabulary: how a slot is mapped, what is timed,
//! the policies compared and one measured split.

use s2mmu::{HostMmOps, PageTable, SplitPolicy};
use std::time::Duration;

/// The page table a case builds and splits.
pub type Table<F> = PageTable<F, HostMmOps>;

/// How the slot is mapped before the split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Every page mapped on its own (nothing to split).
    Pages,
    /// Level-2 blocks (2 MiB with 4 KiB pages).
    Level2Blocks,
    /// Level-1 blocks (1 GiB with 4 KiB pages).
    Level1Blocks,
}

/// The split policies compared, the baseline first.
pub const POLICIES: [SplitPolicy; 3] = [
    SplitPolicy::FullWalk,
    SplitPolicy::SkipReturns,
    SplitPolicy::NoLastLevelTables,
];

/// What is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One split of the whole slot, cache filled beforehand.
    Split,
    /// The split chunk by chunk with the cache top-ups timed too, as the
    /// seed's measurement of `kvm_mmu_split_huge_pages` does.
    SplitTopup,
    /// The engine's CLEAR: split and write-protect per 64-page word.
    Clear,
}

/// One case: its row name, how the slot is mapped and what is timed.
pub struct Case {
    /// The row name.
    pub name: String,
    /// How the slot is mapped.
    pub backing: Backing,
    /// What is timed.
    pub mode: Mode,
}

/// One measured split.
#[derive(Clone, Copy, Default)]
pub struct Sample {
    /// Time of the timed part.
    pub time: Duration,
    /// Entries written.
    pub entries: u64,
    /// Tables the split created.
    pub tables: u64,
    /// Blocks split.
    pub blocks: u64,
}
