//! `s2mmu harvest-perf`: the harvest of hardware dirty state (arm64 DBM,
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

use crate::dirty_log_perf::FormatArg;
use crate::progress::Progress;
use crate::report::{human, human_bytes, verdict, Report};
use crate::stats::Samples;
use s2mmu::dirty::DirtyBitmap;
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{DirtyMode, Mmu, MmuPolicy};
use s2mmu::{Gpa, HostMmOps, Hva, NoTlb};
use s2mmu_vm::VmFormat;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `harvest-perf`.
#[derive(Clone, Debug, clap::Args)]
// "-1" is a value (refused naming its flag), not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct Params {
    /// Size of the slot, mapped with 4 KiB pages without touching memory
    /// (a multiple of 2M, at most 256G: its two tables take size/256 bytes, which must fit
    /// the host's available memory).
    #[arg(long, default_value = "64G", value_parser = crate::report::parse_size)]
    pub size: u64,
    /// One page in this many is dirtied before each harvest (1: every page), at most the
    /// slot's pages.
    #[arg(long, default_value_t = 1)]
    pub dirty_every: u64,
    /// Harvests per scan (1..=100).
    #[arg(long, default_value_t = 5, value_parser = crate::limits::count_in(1..=100))]
    pub runs: usize,
    /// The table's format: arm64 (4 KiB granule, DBM) or x86 EPT (4-level,
    /// dirty flags).
    #[arg(long, value_enum, default_value = "arm64")]
    pub format: FormatArg,
    /// The engine's CLEAR cleans a last-level table's worth of bitmap words in one masked
    /// walk when they hold more than this many runs of dirty pages (0..=512; the engine's
    /// default if not given).
    #[arg(long, value_parser = crate::limits::count_in(0..=512))]
    pub sparse_clear_runs: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

const GPA: u64 = 1 << 32;
/// Host addresses the table records and nothing touches.
const HVA: u64 = 0x1000_0000_0000;
const MAX_SIZE: u64 = 256 << 30;
/// The RFC's figure scaled to half: the target per 64 GiB.
const TARGET_PER_64G: Duration = Duration::from_millis(20);

fn check(p: &Params) -> Result<(), String> {
    if p.size == 0 || !p.size.is_multiple_of(2 << 20) || p.size > MAX_SIZE {
        return Err(format!(
            "--size {}: must be a non-zero multiple of 2M, at most {}",
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
    crate::limits::check_memory(&format!("--size {}", human_bytes(p.size)), need)?;
    Ok(())
}

/// Runs `harvest-perf` from the command line.
///
/// # Errors
/// A message naming the flag or the step that failed.
pub fn main(p: Params) -> Result<(), String> {
    let r = run(
        &p,
        &Progress::new("harvest-perf", (p.runs as u64).saturating_add(1), !p.quiet),
    )?;
    crate::report::emit(&r, p.json);
    Ok(())
}

type HwMmu<F> = Mmu<F, HostMmOps, TreeMemslots>;

/// The slot mapped, logged with hardware dirty state (every leaf
/// writable-clean), its CLEAR taking the masked walk above `sparse_runs`
/// runs per table.
fn setup<F: VmFormat>(p: &Params, sparse_runs: u32) -> Result<(HwMmu<F>, Duration), String> {
    let e = |e: s2mmu::Error| e.to_string();
    let policy = MmuPolicy {
        dirty: DirtyMode::Hardware,
        manual_protect: true,
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
fn dirty<F: VmFormat>(mmu: &HwMmu<F>, size: u64, every: u64) -> u64 {
    let reader = mmu.reader();
    let mut n = 0;
    for page in (0..size / 4096).step_by(every as usize) {
        if reader.hw_dirty_update(GPA + page * 4096).is_some() {
            n += 1;
        }
    }
    n
}

struct Measured {
    word: Vec<Duration>,
    leaf: Vec<Duration>,
    clear: Vec<Duration>,
    /// CLEAR with a walk per run of dirty pages (no masked pass).
    clear_runs: Vec<Duration>,
    found: u64,
}

/// One harvest of `mmu`: dirties, times the per-leaf scan (into
/// `s.leaf`, if `leaf`) and the engine's GET (into `s.word`, if `leaf`),
/// checks both found every dirtied page, and returns the CLEAR's time.
fn harvest<F: VmFormat>(
    p: &Params,
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
fn measure<F: VmFormat>(
    p: &Params,
    mmu: &HwMmu<F>,
    runs_only: &HwMmu<F>,
    bar: &Progress,
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

/// The setup and measurement, on the format `--format` names.
struct Measure<'a> {
    p: &'a Params,
    bar: &'a Progress,
}

impl s2mmu_cli::vm_format::WithFormat for Measure<'_> {
    type Output = Result<(Measured, Duration), String>;
    fn call<F: VmFormat>(self) -> Self::Output {
        setup_and_measure::<F>(self.p, self.bar)
    }
}

/// Both tables of the slot ([`setup`]), then [`measure`].
fn setup_and_measure<F: VmFormat>(
    p: &Params,
    bar: &Progress,
) -> Result<(Measured, Duration), String> {
    let runs = p
        .sparse_clear_runs
        .map_or(s2mmu::mmu::SPARSE_CLEAR_RUNS, |r| r as u32);
    let (mmu, t) = setup::<F>(p, runs)?;
    let (runs_only, _) = setup::<F>(p, u32::MAX)?;
    bar.step();
    bar.message("harvests");
    Ok((measure(p, &mmu, &runs_only, bar)?, t))
}

/// Runs the benchmark and builds its report.
///
/// # Errors
/// A message naming the flag or the step that failed.
pub fn run(p: &Params, bar: &Progress) -> Result<Report, String> {
    check(p)?;
    bar.message(&format!("mapping {}", human_bytes(p.size)));
    let (s, setup_time) = p.format.with(Measure { p, bar })?;
    let (word, leaf, clear, clear_runs) = (
        Samples::of(&s.word).summary(),
        Samples::of(&s.leaf).summary(),
        Samples::of(&s.clear).summary(),
        Samples::of(&s.clear_runs).summary(),
    );
    let gib = p.size as f64 / (1u64 << 30) as f64;
    let target = TARGET_PER_64G.mul_f64(p.size as f64 / (64u64 << 30) as f64);
    let mut r = Report::new(
        "harvest-perf",
        json!({ "size": p.size, "dirty_every": p.dirty_every, "runs": p.runs, "sparse_clear_runs": p.sparse_clear_runs, "page_size": 4096, "format": p.format.name() }),
    );
    for (case, sum, raw) in [
        ("get (word scan)", word, &s.word),
        ("per-leaf scan", leaf, &s.leaf),
        ("clear", clear, &s.clear),
        ("clear (walk per run)", clear_runs, &s.clear_runs),
    ] {
        let mut m = Samples::of(raw).json();
        m["per_gib_ns"] = json!((sum.median.as_nanos() as f64 / gib) as u64);
        r.result(case, "hw_dirty", m);
    }
    r.compare(
        "harvest scan",
        "median_ns",
        leaf.median.as_nanos() as f64,
        word.median.as_nanos() as f64,
    );
    r.compare(
        "clear",
        "median_ns",
        clear_runs.median.as_nanos() as f64,
        clear.median.as_nanos() as f64,
    );
    let ok = word.median <= target;
    let text = format!(
        "harvest-perf: hardware dirty state ({}) on a {} slot of 4 KiB pages, one page in {} dirty ({} pages), medians of {} runs\n\
         Setup (map + enable logging): {}\n\
         GET, word scan (the engine's): {} ({} per GiB; min {}, max {})\n\
         Per-leaf walk, same table:     {} ({} per GiB)\n\
         CLEAR (clean the dirty leaves): {} (min {}, max {})\n\
         CLEAR, a walk per run:          {} (min {}, max {}; other table, alternated)\n\
         CLEAR vs a walk per run: {:.2}x time\n\
         Word scan vs per-leaf walk: {:.1}x faster\n\
         [target: harvest under {} for {} (20 ms per 64 GiB, half the DBM RFC's ~40 ms): {}]\n",
        p.format.hardware_dirty(),
        human_bytes(p.size),
        p.dirty_every,
        s.found,
        p.runs,
        human(setup_time),
        human(word.median),
        human(word.median.div_f64(gib)),
        human(word.min),
        human(word.max),
        human(leaf.median),
        human(leaf.median.div_f64(gib)),
        human(clear.median),
        human(clear.min),
        human(clear.max),
        human(clear_runs.median),
        human(clear_runs.min),
        human(clear_runs.max),
        clear.median.as_secs_f64() / clear_runs.median.as_secs_f64().max(1e-12),
        leaf.median.as_secs_f64() / word.median.as_secs_f64().max(1e-12),
        human(target),
        human_bytes(p.size),
        verdict(ok),
    );
    r.set_text(text);
    Ok(r)
}
