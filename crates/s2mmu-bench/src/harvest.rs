//! The engine of `s2mmu harvest-perf`: the harvest of hardware dirty state (arm64 DBM,
//! `DirtyMode::Hardware`) on a large slot mapped with 4 KiB pages, the
//! case Keqian Zhu's arm64 DBM RFC measured (about 40 ms per 64 GiB): the
//! GET scans every leaf of the slot into the bitmap. Two scans run in the
//! same process on the same table: the word scan the engine's GET uses
//! (`scan_hw_dirty_into`, 64 last-level entries per bitmap word) and a
//! visit per leaf (`scan_hw_dirty`), so the table-walk cost is shown
//! beside the engine's. The CLEAR is timed on two tables of the same slot,
//! alternately: the engine's (a scattered bitmap cleaned a last-level table
//! at a time, `Mmu::with_sparse_clear_runs`) and one that cleans with a
//! walk per run of dirty pages, the CLEAR before that pass existed.
//!
//! The slot's host memory is never touched (the table only records host
//! addresses), and the hardware's dirtying is done by the CPU's walk
//! (`TableReader::hw_dirty_update`) before each timed harvest.

use crate::{human_bytes, Progress};
use s2mmu::dirty::DirtyBitmap;
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{DirtyMode, Mmu, MmuPolicy};
use s2mmu::{Gpa, HostMmOps, Hva, NoTlb};
use s2mmu_vm::KnownFormat;
use std::sync::Arc;
use std::time::{Duration, Instant};

const GPA: u64 = 1 << 32;
/// Host addresses the table records and nothing touches.
const HVA: u64 = 0x1000_0000_0000;
/// The settings of one `harvest-perf` run (the command checks them against
/// its flags' limits).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Size of the slot, mapped with 4 KiB pages without touching memory.
    pub size: u64,
    /// One page in this many is dirtied before each harvest.
    pub dirty_every: u64,
    /// Harvests per scan.
    pub runs: usize,
    /// The engine's CLEAR takes the masked walk above this many runs of
    /// dirty pages per last-level table (the engine's default if `None`).
    pub sparse_clear_runs: Option<usize>,
}

/// The largest slot a run maps.
pub const MAX_SIZE: u64 = 256 << 30;

/// Checks the settings before anything is mapped: the slot's size (a
/// multiple of 2 MiB, at most [`MAX_SIZE`]), the runs, the dirtied share,
/// and the memory its tables and bitmaps take against the host's.
///
/// # Errors
/// A message naming the flag (the setting of the same name) and its limit.
pub fn check(p: &Config) -> Result<(), String> {
    if p.size == 0 || !p.size.is_multiple_of(2 << 20) || p.size > MAX_SIZE {
        return Err(format!(
            "--mem {}: must be a non-zero multiple of 2M, at most {}",
            p.size,
            human_bytes(MAX_SIZE)
        ));
    }
    if !(1..=100).contains(&p.runs) {
        return Err(format!("--runs {}: must be 1..=100", p.runs));
    }
    if p.dirty_every == 0 || p.dirty_every > p.size / 4096 {
        return Err(format!(
            "--dirty-every {}: must be 1..={} (the slot's pages)",
            p.dirty_every,
            p.size / 4096
        ));
    }
    // Two tables of 4K pages (1/512 of the slot each) and two bitmaps of a
    // bit per page.
    let need = 2 * (p.size / 512) + 2 * (p.size / 4096 / 8);
    crate::host::check_memory(&format!("--mem {}", human_bytes(p.size)), need)?;
    Ok(())
}

type HwMmu<F> = Mmu<F, HostMmOps, TreeMemslots>;

/// The slot mapped, logged with hardware dirty state (every leaf
/// writable-clean), its CLEAR taking the masked walk above `sparse_runs`
/// runs per table.
fn setup<F: KnownFormat>(p: &Config, sparse_runs: u32) -> Result<(HwMmu<F>, Duration), String> {
    let e = |e: s2mmu::Error| e.to_string();
    let policy = MmuPolicy {
        dirty: DirtyMode::HW,
        ..MmuPolicy::default()
    };
    let mmu = Mmu::new(
        F::for_vm(40).map_err(e)?,
        HostMmOps::new(4096).map_err(e)?,
        Arc::new(NoTlb),
        TreeMemslots::new(),
        policy,
    )
    .map_err(e)?
    .with_sparse_clear_runs(sparse_runs);
    let slot = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), p.size, Hva::new(HVA));
    mmu.set_memory_region(&slot, 4096).map_err(e)?;
    let t = Instant::now();
    mmu.populate(0, 0, p.size / 4096).map_err(e)?;
    mmu.enable_dirty_logging(0).map_err(e)?;
    Ok((mmu, t.elapsed()))
}

/// Dirties one page in `every` as the hardware would (not timed).
fn dirty<F: KnownFormat>(mmu: &HwMmu<F>, size: u64, every: u64) -> u64 {
    let reader = mmu.reader();
    let mut n = 0;
    for page in (0..size / 4096).step_by(every as usize) {
        if reader.hw_dirty_update(GPA + page * 4096).is_some() {
            n += 1;
        }
    }
    n
}

pub struct Measured {
    /// The engine's GET (word scan), per harvest.
    pub word: Vec<Duration>,
    /// The per-leaf scan, per harvest.
    pub leaf: Vec<Duration>,
    /// The engine's CLEAR, per harvest.
    pub clear: Vec<Duration>,
    /// CLEAR with a walk per run of dirty pages (no masked pass).
    pub clear_runs: Vec<Duration>,
    /// Dirty pages the last harvest found.
    pub found: u64,
}

/// One harvest of `mmu`: dirties, times the per-leaf scan (into
/// `s.leaf`, if `leaf`) and the engine's GET (into `s.word`, if `leaf`),
/// checks both found every dirtied page, and returns the CLEAR's time.
fn harvest<F: KnownFormat>(
    p: &Config,
    mmu: &HwMmu<F>,
    bitmap: &mut [u64],
    s: &mut Measured,
    leaf: bool,
) -> Result<Duration, String> {
    let e = |e: s2mmu::Error| e.to_string();
    let npages = p.size / 4096;
    let dirtied = dirty(mmu, p.size, p.dirty_every);
    // The per-leaf walk over the same leaves, into a bitmap of its own.
    let own = DirtyBitmap::new(npages, false);
    let t = Instant::now();
    let n = mmu.with_table(|pt| {
        pt.scan_hw_dirty(GPA, p.size, |ipa, len| {
            for pg in 0..len / 4096 {
                own.mark((ipa - GPA) / 4096 + pg);
            }
        })
    });
    let leaf_time = t.elapsed();
    let n = n.map_err(e)?;
    // The engine's GET (manual protect: the scan and a copy).
    let t = Instant::now();
    let got = mmu.get_dirty_log(0, bitmap).map_err(e)?;
    let word_time = t.elapsed();
    if got != dirtied || n != dirtied {
        return Err(format!(
            "the scans found {got} (word) and {n} (per leaf) dirty pages, {dirtied} were dirtied"
        ));
    }
    if leaf {
        s.leaf.push(leaf_time);
        s.word.push(word_time);
    }
    s.found = got;
    let t = Instant::now();
    mmu.clear_dirty_log(0, 0, npages, bitmap).map_err(e)?;
    Ok(t.elapsed())
}

/// `p.runs` harvests of `mmu` (the engine's CLEAR) and of `runs_only` (a
/// walk per run), alternately, the first of each pair swapped every run so
/// that neither always follows the other.
fn measure<F: KnownFormat>(
    p: &Config,
    mmu: &HwMmu<F>,
    runs_only: &HwMmu<F>,
    bar: &dyn Progress,
) -> Result<Measured, String> {
    let mut bitmap = vec![0u64; (p.size / 4096).div_ceil(64) as usize];
    let mut s = Measured {
        word: Vec::new(),
        leaf: Vec::new(),
        clear: Vec::new(),
        clear_runs: Vec::new(),
        found: 0,
    };
    for i in 0..p.runs {
        bar.step();
        for engine in [i % 2 == 0, i % 2 == 1] {
            if engine {
                let t = harvest(p, mmu, &mut bitmap, &mut s, true)?;
                s.clear.push(t);
            } else {
                let t = harvest(p, runs_only, &mut bitmap, &mut s, false)?;
                s.clear_runs.push(t);
            }
        }
    }
    Ok(s)
}

/// Both tables of the slot (`setup`), then `measure`: the harvests.
///
/// # Errors
/// A message naming the step that failed (the table, a scan that missed
/// a dirtied page).
pub fn setup_and_measure<F: KnownFormat>(
    p: &Config,
    bar: &dyn Progress,
) -> Result<(Measured, Duration), String> {
    check(p)?;
    let runs = p
        .sparse_clear_runs
        .map_or(s2mmu::mmu::SPARSE_CLEAR_RUNS, |r| r as u32);
    let (mmu, t) = setup::<F>(p, runs)?;
    let (runs_only, _) = setup::<F>(p, u32::MAX)?;
    bar.step();
    bar.message("harvests");
    Ok((measure(p, &mmu, &runs_only, bar)?, t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::format::arm64::Arm64Stage2;

    #[test]
    fn bad_settings_are_refused_before_anything_is_mapped() {
        let ok = Config {
            size: 2 << 20,
            dirty_every: 1,
            runs: 1,
            sparse_clear_runs: None,
        };
        let refused = |c: Config, says: &str| {
            let e = setup_and_measure::<Arm64Stage2>(&c, &crate::NoProgress)
                .err()
                .expect("refused");
            assert!(e.contains(says), "{e:?} should name {says}");
        };
        refused(Config { size: 0, ..ok }, "--mem");
        refused(
            Config {
                size: MAX_SIZE + (2 << 20),
                ..ok
            },
            "--mem",
        );
        refused(Config { runs: 0, ..ok }, "--runs");
        refused(
            Config {
                dirty_every: 513,
                ..ok
            },
            "--dirty-every",
        );
        let (m, _) = setup_and_measure::<Arm64Stage2>(&ok, &crate::NoProgress).unwrap();
        assert_eq!(
            m.found, 512,
            "every page of the 2 MiB slot dirtied and found"
        );
    }
}
