//! The engine of `s2mmu split-perf`: building a mapped slot and timing its
//! eager split.

pub mod measure;

use crate::human_bytes;
use s2mmu::{HostMmOps, PageTable, PteFormat, SplitPolicy};
use std::time::Duration;

/// The largest slot: the 48-bit IPA space above where the cases map it.
pub const MAX_SIZE: u64 = (1 << 48) - BASE;

/// Where the slot sits in the IPA space.
pub const BASE: u64 = 1 << 40;

/// Checks a run's slot size and runs against the format `fmt` (the size a
/// non-zero multiple of its largest block, at most [`MAX_SIZE`]) and the
/// host's memory, before anything is allocated.
///
/// # Errors
/// A message naming the flag (the setting of the same name) and its limit.
pub fn check<F: PteFormat>(fmt: &F, size: u64, runs: usize) -> Result<(), String> {
    let top_block = if fmt.leaf_allowed(1) {
        fmt.granule(1)
    } else {
        fmt.granule(2)
    };
    if size == 0 || !size.is_multiple_of(top_block) {
        return Err(format!(
            "--size {}: must be a non-zero multiple of {} (the largest block of this granule)",
            human_bytes(size),
            human_bytes(top_block)
        ));
    }
    if size > MAX_SIZE {
        return Err(format!(
            "--size {}: at most {} (the 48-bit IPA space above the slot's base)",
            human_bytes(size),
            human_bytes(MAX_SIZE)
        ));
    }
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    // Split to pages, the slot takes one last-level table entry (8 bytes)
    // per page. At the peak a table split to pages, a cache holding as many
    // pages again and the floor's tables are live: allow four times.
    let entries = size / fmt.page_size();
    let need = entries.saturating_mul(8).saturating_mul(4);
    crate::host::check_memory(&format!("--size {}", human_bytes(size)), need)?;
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::format::arm64::{Arm64Stage2, Granule};

    #[test]
    fn a_case_refuses_bad_sizes_and_runs_before_it_allocates() {
        let fmt = Arm64Stage2::new(Granule::K4, 48).unwrap();
        let mm = HostMmOps::new(4096).unwrap();
        let case = &cases(&fmt)[0];
        let refused = |size: u64, runs: usize, says: &str| {
            let e = measure::case(fmt, &mm, size, runs, case, &crate::NoProgress)
                .err()
                .unwrap_or_default();
            assert!(e.contains(says), "{e:?} should name {says}");
            let e = measure::store_floor(&fmt, &mm, size, runs).expect_err("refused");
            assert!(e.contains(says), "{e:?} should name {says}");
        };
        refused(0, 1, "--size");
        refused((1 << 30) + 4096, 1, "non-zero multiple");
        refused(MAX_SIZE + (1 << 30), 1, "at most");
        refused(1 << 30, 0, "--runs");
        assert!(check(&fmt, 1 << 30, 1).is_ok());
    }
}
