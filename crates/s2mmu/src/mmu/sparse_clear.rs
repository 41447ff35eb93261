//! The hardware-dirty CLEAR's choice between a walk per run of dirty pages
//! and one masked walk per last-level table (`Mmu::with_sparse_clear_runs`).
//!
//! A CLEAR of one page in 3 of 16 GiB made 1.4M one-page walks from the
//! root; `perf` put its time in the walker's descent, its read guard and
//! the visitor call of each, not in the stores. The cleared bitmap words of
//! one last-level table's worth of pages are gathered here (only the
//! non-zero ones, so a bitmap with little in it costs what it did before),
//! their runs of set bits counted as they come, and the group is cleaned by
//! [`PageTable::clean_hw_dirty_masked`] when it has more runs than the
//! threshold, or run by run (runs joining across words and tables, the
//! whole-table loop for long ones) otherwise.

use super::*;

/// The non-zero cleared words of one last-level table's worth of a slot's
/// bitmap (words `start..start + table_words`), in order, and their runs of
/// set bits.
pub(super) struct ClearGroup {
    /// Words per group: a power of two, a last-level table's entries / 64.
    table_words: usize,
    /// The group's first word, or `usize::MAX` while it is empty.
    start: usize,
    /// (word index, cleared bits), non-zero, in increasing index.
    words: Vec<(usize, u64)>,
    /// Runs of set bits among them, read as one bitmap.
    runs: u32,
    /// The group as a bitmap, for the masked clean.
    dense: Vec<u64>,
}

impl ClearGroup {
    /// An empty group of `table_words` words (rounded up to a power of
    /// two, at least 1).
    pub(super) fn new(table_words: usize) -> Self {
        let table_words = table_words.max(1).next_power_of_two();
        ClearGroup {
            table_words,
            start: usize::MAX,
            words: Vec::with_capacity(table_words),
            runs: 0,
            dense: Vec::with_capacity(table_words),
        }
    }

    /// Whether word `index` belongs in the group as it is (it is empty, or
    /// the word is in its table's span).
    pub(super) fn holds(&self, index: usize) -> bool {
        self.start == usize::MAX || index & !(self.table_words - 1) == self.start
    }

    /// Adds word `index` (after any word already in, in the same span) with
    /// its non-zero cleared bits `mask`.
    pub(super) fn add(&mut self, index: usize, mask: u64) {
        if self.start == usize::MAX {
            self.start = index & !(self.table_words - 1);
        }
        // A run that goes on from the previous word is not a new one.
        let carry = match self.words.last() {
            Some(&(i, m)) if i + 1 == index => m >> 63,
            _ => 0,
        };
        self.runs += (mask & !((mask << 1) | carry)).count_ones();
        self.words.push((index, mask));
    }
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// Protects the pages of `group` (of the slot at `base`, of `npages`
    /// pages) and empties it. With hardware dirty state and more than
    /// `Mmu::with_sparse_clear_runs`'s runs among them, in one masked
    /// clean ([`PageTable::clean_hw_dirty_masked`]) after protecting `run`;
    /// otherwise run by run through `run` ([`Mmu::protect_mask_runs`]), so
    /// long runs join across words.
    pub(super) fn protect_group(
        &self,
        pt: &mut PageTable<F, M>,
        base: u64,
        group: &mut ClearGroup,
        npages: u64,
        run: &mut (u64, u64),
        batch: &mut TlbBatch<'_>,
    ) -> Result<()> {
        let start = core::mem::replace(&mut group.start, usize::MAX);
        let runs = core::mem::take(&mut group.runs);
        if group.words.is_empty() {
            return Ok(());
        }
        let done = if self.strategy.masked_clear() && runs > self.sparse_clear_runs {
            self.protect_run(pt, base, run, batch)?;
            group.dense.clear();
            group.dense.resize(group.table_words, 0);
            for &(i, m) in &group.words {
                group.dense[i - start] = m;
            }
            let page0 = start as u64 * 64;
            let pages = (group.table_words as u64 * 64).min(npages.saturating_sub(page0));
            let ipa = base + (page0 << self.page_shift);
            match pages {
                0 => Ok(()),
                _ => pt
                    .clean_hw_dirty_masked(ipa, pages << self.page_shift, &group.dense, batch)
                    .map(|_| ()),
            }
        } else {
            group.words.iter().try_for_each(|&(i, m)| {
                self.protect_mask_runs(pt, base, i as u64 * 64, m, run, batch)
            })
        };
        group.words.clear();
        done
    }
}
