//! The engine of `s2mmu split-perf`: building a mapped slot and timing its
//! eager split.

pub mod measure;

use crate::human_bytes;
use s2mmu::{HostMmOps, PageTable, PteFormat, SplitPolicy};
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

/// The cases the format `fmt` has: a split of pages, of each block size it
/// maps, with cache top-ups, and the engine's CLEAR over each.
pub fn cases<F: PteFormat>(fmt: &F) -> Vec<Case> {
    let page = human_bytes(fmt.page_size())
        .to_lowercase()
        .replace("kib", "k");
    let mut v = vec![Case {
        name: format!("already_{page}"),
        backing: Backing::Pages,
        mode: Mode::Split,
    }];
    let mut blocks = Vec::new();
    if fmt.leaf_allowed(2) {
        let name = format!(
            "blocks_{}",
            human_bytes(fmt.granule(2)).to_lowercase().replace("ib", "")
        );
        blocks.push((name, Backing::Level2Blocks));
    }
    if fmt.leaf_allowed(1) {
        let name = format!(
            "block_{}",
            human_bytes(fmt.granule(1)).to_lowercase().replace("ib", "")
        );
        blocks.push((name, Backing::Level1Blocks));
    }
    for mode in [Mode::Split, Mode::SplitTopup] {
        for (name, backing) in &blocks {
            v.push(Case {
                name: if mode == Mode::SplitTopup {
                    format!("{name}_topup")
                } else {
                    name.clone()
                },
                backing: *backing,
                mode,
            });
        }
    }
    let clears: Vec<Case> = std::iter::once((format!("already_{page}"), Backing::Pages))
        .chain(blocks)
        .map(|(name, backing)| Case {
            name: format!("clear_{name}"),
            backing,
            mode: Mode::Clear,
        })
        .collect();
    v.extend(clears);
    v
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
