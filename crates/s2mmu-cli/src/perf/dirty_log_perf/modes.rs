//! `dirty-log-perf --dirty wp,hw,pml` (or `--dirty all`): the dirty
//! tracking modes side by side in one process, each run beside a pass with
//! logging off, in alternating order; and `--format`, the stage-2 format
//! the simulated VM's vCPUs walk.

use super::engine::{engine, Job, RunSpec};
use super::params::{Params, PolicyArg};
use crate::report::{human, human_bytes, verdict, Report, Summary};
use s2mmu::mmu::{DirtyMode, FaultPath, HwDirtyBlocks};
use s2mmu_bench::dirty_log::schedule::{middle_f64, middle_u64, ModeSamples};
use serde_json::json;
use std::time::Duration;

/// The stage-2 format of the simulated VM (shared with `migrate`).
pub use s2mmu_cli::vm_format::FormatArg;

impl Params {
    /// The dirty tracking modes asked for, `all` expanded, each once, in
    /// the order given.
    pub fn dirty_modes(&self) -> Vec<DirtyMode> {
        match self.ring {
            // `--ring N`, the hidden alias of `--dirty ring:N`.
            Some(entries) if self.dirty.0 == [DirtyMode::WP] => vec![DirtyMode::Ring { entries }],
            _ => self.dirty.0.clone(),
        }
    }

    /// The ring size: `--ring N`, or a ring mode's in `--dirty`.
    pub fn ring(&self) -> Option<u32> {
        self.ring
            .or_else(|| self.dirty.0.iter().find_map(|d| d.ring_entries()))
    }
}

/// Refuses combinations of `--dirty` and `--format` with the other options
/// that cannot run, naming why.
pub(super) fn check_params(p: &Params) -> Result<(), String> {
    let modes = p.dirty_modes();
    let hardware = modes.iter().any(|d| d.hardware());
    if hardware && (p.ring().is_some() || p.kvm || p.compare) {
        return Err(
            "--dirty hw/pml: hardware dirty state logs to bitmaps on the engine (the simulated VM, or --arm64 for hw), not with --ring, --kvm or --compare".into(),
        );
    }
    let blocks_whole = |d: &DirtyMode| {
        matches!(
            d,
            DirtyMode::Hardware {
                blocks: HwDirtyBlocks::LogWholeBlocks,
                ..
            }
        )
    };
    if modes.iter().any(blocks_whole) && (p.arm64 || p.kvm || p.compare) {
        return Err(
            "--dirty hw-blocks runs on the simulated VM only (QEMU's arm64 model logs hw with blocks split first)".into(),
        );
    }
    if modes.iter().any(|d| d.pml()) && p.arm64 {
        return Err(
            "--dirty pml: Page-Modification Logging is x86's; QEMU's arm64 model has no such log (run --arm64 with --dirty wp or hw, or pml on the simulated VM)".into(),
        );
    }
    if modes.len() > 1
        && (p.arm64
            || p.kvm
            || p.compare
            || p.check
            || p.policy == PolicyArg::Both
            || p.vcpus.len() > 1)
    {
        return Err(
            "--dirty with several modes runs its side-by-side table on the simulated VM, for one vCPU count: not with --arm64, --kvm, --compare, --check, --policy both or a -v list".into(),
        );
    }
    if p.format != FormatArg::Arm64 && (p.arm64 || p.kvm || p.compare) {
        return Err(format!(
            "--format {} runs on the simulated VM: --arm64 is QEMU's arm64 model, and --kvm/--compare use the host's own stage-2 format",
            p.format.name()
        ));
    }
    Ok(())
}

fn ns(v: &[Duration]) -> Vec<u64> {
    v.iter().map(|d| d.as_nanos() as u64).collect()
}

/// Runs every mode `-r` times (default 3) in rotating order and prints the
/// table: faults per pass, dirty memory time, slowdown against the pass
/// with logging off, harvest time per GiB and the harvesting thread's CPU
/// time.
pub(super) fn table(job: &Job<'_>, report: &mut Report) -> Result<String, String> {
    let (p, vcpus, bytes, spec) = (job.p, job.vcpus[0], job.bytes, job.spec);
    let modes = p.dirty_modes();
    let runs = p.runs.unwrap_or(3).max(1) as usize;
    let samples = sample_modes(p, vcpus, runs, &modes, &spec)?;
    let mem = bytes * vcpus as u64;
    let gib = mem as f64 / f64::from(1u32 << 30);
    let mut out = table_head(p, vcpus, bytes, runs);
    let mut hw_check = None;
    for (d, s) in modes.iter().zip(&samples) {
        let dirty = Summary::of(&s.dirty);
        let off = Summary::of(&s.off);
        let harvest = Summary::of(&s.harvest);
        let cpu = Summary::of(&s.harvest_cpu);
        let slow = middle_f64(&s.slowdowns());
        let per_gib = Duration::from_secs_f64(harvest.median.as_secs_f64() / gib);
        let faults = middle_u64(&s.faults);
        out += &format!(
            "{:<9} {:>11} {:>9} {:>10} {:>12} {:>12} {:>12} {:>6.2}x {:>12} {:>11}\n",
            d.name(),
            faults,
            middle_u64(&s.pml_full),
            middle_u64(&s.pages),
            human(Summary::of(&s.split).median),
            human(off.median),
            human(dirty.median),
            slow,
            human(per_gib),
            human(cpu.median),
        );
        report.result(
            "dirty_modes",
            d.name(),
            json!({
                "vcpus": vcpus, "bytes_per_vcpu": bytes, "format": p.format.name(),
                "runs": runs, "iterations": p.iterations,
                "faults_per_pass": s.faults, "pml_full_exits_per_pass": s.pml_full,
                "pages_dirty_per_pass": s.pages,
                "enable_ns": ns(&s.enable), "split_ns": ns(&s.split),
                "dirty_memory_ns": ns(&s.dirty), "logging_off_pass_ns": ns(&s.off),
                "slowdown_vs_logging_off": s.slowdowns(),
                "harvest_ns": ns(&s.harvest), "harvest_ns_per_gib": harvest.median.as_secs_f64() * 1e9 / gib,
                "harvest_thread_cpu_ns": ns(&s.harvest_cpu),
                "dirty_memory": dirty.json(),
            }),
        );
        if matches!(
            d,
            DirtyMode::Hardware {
                blocks: HwDirtyBlocks::SplitFirst,
                ..
            }
        ) {
            hw_check = Some((faults, slow));
        }
    }
    out += "split: time splitting huge mappings in the run (eagerly, on CLEAR with initially-set bitmaps, or on fault; 0 where nothing was split); faults/pass: stage-2 faults (translation + permission) in a logged pass; PML exits: log-full exits per pass; vs off: a run's logged pass over its own pass with logging off; harvest: GET + CLEAR per GiB of guest memory; harvest CPU: the harvesting thread's CPU time (CLOCK_THREAD_CPUTIME_ID) per harvest\n";
    if let (Some((faults, slow)), 1, true) = (hw_check, vcpus, bytes == 256 << 20) {
        out += &format!(
            "target: 1 vCPU, 256 MiB, hardware dirty mode takes 0 write faults per pass: {faults} ({})\n",
            verdict(faults == 0)
        );
        out += &format!(
            "target: its dirty memory time within 1.5x of a pass with logging off: {slow:.2}x ({})\n",
            verdict(slow <= 1.5)
        );
    }
    Ok(out)
}

/// The table's title (the run's shape) and column heads.
fn table_head(p: &Params, vcpus: usize, bytes: u64, runs: usize) -> String {
    let mut out = format!(
        "Dirty tracking side by side: {vcpus} vCPU(s), {} each, format {}, {} iterations, {runs} run(s) of each mode in rotating order; medians over runs (a run's figure: its passes after the first)\n",
        human_bytes(bytes),
        p.format.name(),
        p.iterations,
    );
    out += &format!(
        "{:<9} {:>11} {:>9} {:>10} {:>12} {:>12} {:>12} {:>7} {:>12} {:>11}\n",
        "mode",
        "faults/pass",
        "PML exits",
        "pages/pass",
        "split",
        "logging off",
        "dirty memory",
        "vs off",
        "harvest/GiB",
        "harvest CPU"
    );
    out
}

/// `runs` runs of every mode in rotating order, each with a pass with
/// logging off.
fn sample_modes(
    p: &Params,
    vcpus: usize,
    runs: usize,
    modes: &[DirtyMode],
    spec: &impl Fn(usize, FaultPath, bool) -> RunSpec,
) -> Result<Vec<ModeSamples>, String> {
    let fault_path = if p.policy == PolicyArg::Baseline {
        FaultPath::WriteLock
    } else {
        FaultPath::ReadLockFastPath
    };
    let base = spec(vcpus, fault_path, p.eager_split);
    s2mmu_bench::dirty_log::schedule::sample_modes(base, modes, runs, |s| engine(s, &p.memslots))
}
