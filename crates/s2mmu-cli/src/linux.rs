//! `s2mmu linux`: Debian's arm64 Linux at EL1 under the project's EL2 stub
//! on QEMU's model, every byte of guest RAM mapped by the engine's fault
//! path; with `--dirty`, dirty logging from `/init` on, every harvest
//! checked against a hash of every guest page; with `--vs-qemu`, the same
//! kernel and initramfs booted by QEMU itself, back to back, for the ratio.
//!
//! Here are its flags; [`command`] runs it and prints its reports.

use crate::arm64::EMULATOR_NOTE;
use s2mmu::mmu::DirtyMode;
use s2mmu_arm64::linux::run::RunSpec;
use s2mmu_arm64::linux::vm;
use s2mmu_cli::dirty_mode::dirty_name;
use s2mmu_cli::dirty_mode::{parse_dirty_or_off, DirtyModeArgError};
use s2mmu_cli::flags::parse_duration;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

pub mod command;
mod compare;
mod ipi;
mod plot;
mod rate;

/// Options of `linux`.
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// vCPUs (1..=4); QEMU runs one more CPU for the engine's invalidations and kicks.
    #[arg(short = 'v', long, default_value_t = 1, value_parser = crate::limits::count_in(1..=4))]
    pub vcpus: usize,
    /// Guest RAM, 128M..=4G, a multiple of 2M.
    #[arg(short = 'm', long, default_value = "512M", value_parser = crate::report::parse_size)]
    pub mem: u64,
    /// An uncompressed arm64 `Image` instead of Debian's (from the asset cache).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// An initramfs instead of the project's (from the asset cache).
    #[arg(long)]
    pub initrd: Option<PathBuf>,
    /// The console: `-` for stdout, or a file written when the guest stops.
    #[arg(long, default_value = "-")]
    pub console: String,
    /// Kernel command line words after the console settings.
    #[arg(long, default_value = "quiet")]
    pub cmdline: String,
    /// The guest program /init runs (none, dirtier, counter, shell, reboot: `reboot -f`, a PSCI SYSTEM_RESET; ipi: SGIs a second with 1, 2 and 4 vCPUs up to -v, an EL1 guest of the crate's own, against QEMU alone, --runs each).
    #[arg(long, default_value = "none")]
    pub run: String,
    /// Its arguments, comma-separated (dirtier: mem=MiB,file=MiB,rate=N,secs=N).
    #[arg(long, default_value = "")]
    pub args: String,
    /// Dirty logging from /init on, the engine's modes: off, wp (or manual: GET then CLEAR), ring (16384 entries here), ring:N, hw.
    // The full path keeps clap from making the flag optional: "off" is
    // the value `None`.
    #[arg(long, default_value = "off", value_parser = parse_linux_dirty)]
    pub dirty: std::option::Option<DirtyMode>,
    /// Time between harvests (10ms..=10s).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub harvest_every: Duration,
    /// Hidden alias of --harvest-every in milliseconds.
    #[arg(long, hide = true, conflicts_with = "harvest_every", value_parser = crate::limits::count_in(10..=10_000))]
    pub harvest_ms: Option<usize>,
    /// Stop the guest after this long (1s..=1h).
    #[arg(long, default_value = "300s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Also boot the same kernel and initramfs with QEMU alone (EL1, no stage 2) and report the ratio.
    #[arg(long, alias = "baseline")]
    pub vs_qemu: bool,
    /// Runs (1..=10); with --vs-qemu each run boots both, back to back, and the medians are compared.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count_in(1..=10))]
    pub runs: usize,
    /// With --run dirtier: one run without dirty logging, then one per mode (wp-get, wp, ring, hw-get), and the dirtier's write rate in each against the run without.
    #[arg(long)]
    pub rate_per_mode: bool,
    /// Only make sure the kernel and initramfs are in the cache (downloads with S2MMU_LINUX_FETCH=1).
    #[arg(long)]
    pub fetch_only: bool,
    /// Both placements back to back, --runs times (with QEMU booting the same kernel alone): boot to init, the dirtier under wp-get, wp and ring logging (its write rate, the stage-2 fault cost, faults per harvest), its fixed work (faults per pass, compared), medians and ratios.
    #[arg(long)]
    pub engine_compare: bool,
    /// Where the stage-2 engine runs: host (a host thread answers every stage-2 abort) or el2 (linked into the EL2 stub, RAM faults answered there).
    #[arg(long, default_value = "el2")]
    pub engine: vm::Engine,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Draw the exits per second and the dirty rate per harvest into this SVG file (PNG beside it; the last run's).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// The guest's console is not echoed (it still goes to a --console file).
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// What the guest's PSCI SYSTEM_RESET does: stop (the run ends, reported as a reset) or reboot (a cold boot of the same kernel on a fresh machine, up to --max-reboots times).
    #[arg(long, default_value = "stop", value_parser = ["stop", "reboot"])]
    pub on_reset: String,
    /// With --on-reset reboot: reboots before a reset stops the run (1..=100).
    #[arg(long, default_value_t = 10, value_parser = crate::limits::count_in(1..=100))]
    pub max_reboots: usize,
}

impl Params {
    /// The time between harvests (`--harvest-every`, or its alias in ms).
    pub fn harvest(&self) -> Duration {
        self.harvest_ms
            .map_or(self.harvest_every, |ms| Duration::from_millis(ms as u64))
    }

    /// The run's settings from the flags.
    pub fn spec(&self) -> RunSpec {
        RunSpec {
            vcpus: self.vcpus,
            mem: self.mem,
            kernel: self.kernel.clone(),
            initrd: self.initrd.clone(),
            cmdline: self.cmdline.clone(),
            run: self.run.clone(),
            args: self.args.clone(),
            echo: self.console == "-" && !self.json && !self.quiet,
            timeout: self.timeout,
            dirty: self.dirty,
            harvest: self.harvest(),
            engine: self.engine,
        }
    }

    /// The flags as used, for the JSON envelope.
    pub fn params_json(&self) -> serde_json::Value {
        json!({"vcpus": self.vcpus, "mem_bytes": self.mem, "run": self.run, "args": self.args,
            "dirty": dirty_name(self.dirty), "harvest_every_ms": self.harvest().as_secs_f64() * 1e3,
            "timeout_s": self.timeout.as_secs_f64(), "vs_qemu": self.vs_qemu, "runs": self.runs,
            "engine": format!("{:?}", self.engine).to_lowercase(), "engine_compare": self.engine_compare,
            "cmdline": self.cmdline, "note": EMULATOR_NOTE})
    }
}

/// `--dirty`: [`parse_dirty_or_off`], `ring` with the Linux harvester's
/// [`s2mmu_arm64::linux::dirty::RING_ENTRIES`].
fn parse_linux_dirty(s: &str) -> Result<Option<DirtyMode>, DirtyModeArgError> {
    match s {
        "ring" => Ok(Some(s2mmu_arm64::linux::dirty::RING)),
        _ => parse_dirty_or_off(s),
    }
}
