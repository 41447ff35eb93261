//! `s2mmu harvest-perf`: its flags and the report of what
//! [`s2mmu_bench::harvest`] measured (the harvest of hardware dirty state
//! on a large slot: the engine's word scan against a per-leaf walk, and its
//! CLEAR against a walk per run of dirty pages).

use crate::perf::dirty_log_perf::FormatArg;
use crate::progress::Progress;
use crate::report::{human, human_bytes, verdict, Report};
use crate::stats::Samples;
use s2mmu_bench::harvest::{setup_and_measure, Config, Measured};
use s2mmu_vm::KnownFormat;
use serde_json::json;
use std::time::Duration;

/// Options of `harvest-perf`.
#[derive(Clone, Debug, clap::Args)]
// "-1" is a value (refused naming its flag), not an unknown flag.
#[command(allow_negative_numbers = true)]
pub struct Params {
    /// Size of the slot, mapped with 4 KiB pages without touching memory
    /// (a multiple of 2M, at most 256G: its two tables take size/256 bytes, which must fit
    /// the host's available memory).
    #[arg(short = 'm', long = "mem", alias = "size", default_value = "64G", value_parser = crate::report::parse_size)]
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

/// The harvest's target per 64 GiB: half the ~40 ms that the arm64 DBM
/// dirty-logging RFC reported for a 64 GiB guest.
const TARGET_PER_64G: Duration = Duration::from_millis(20);

fn check(p: &Params) -> Result<(), String> {
    s2mmu_bench::harvest::check(&p.config())
}

impl Params {
    /// The engine's settings.
    fn config(&self) -> Config {
        Config {
            size: self.size,
            dirty_every: self.dirty_every,
            runs: self.runs,
            sparse_clear_runs: self.sparse_clear_runs,
        }
    }
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

/// The setup and measurement, on the format `--format` names.
struct Measure<'a> {
    p: Config,
    bar: &'a Progress,
}

impl s2mmu_cli::vm_format::WithFormat for Measure<'_> {
    type Output = Result<(Measured, Duration), String>;
    fn call<F: KnownFormat>(self) -> Self::Output {
        setup_and_measure::<F>(&self.p, self.bar)
    }
}

/// Runs the benchmark and builds its report.
///
/// # Errors
/// A message naming the flag or the step that failed.
pub fn run(p: &Params, bar: &Progress) -> Result<Report, String> {
    check(p)?;
    bar.message(&format!("mapping {}", human_bytes(p.size)));
    let (s, setup_time) = p.format.with(Measure { p: p.config(), bar })?;
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
        p.format.hardware_dirty_name(),
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
