//! `s2mmu linux`: Debian's arm64 Linux at EL1 under the project's EL2 stub
//! on QEMU's model, every byte of guest RAM mapped by the engine's fault
//! path; with `--dirty`, dirty logging from `/init` on, every harvest
//! checked against a hash of every guest page; with `--vs-qemu`, the same
//! kernel and initramfs booted by QEMU itself, back to back, for the ratio.

use crate::arm64::EMULATOR_NOTE;
use crate::report::human_bytes;
use crate::stats::median;
use s2mmu::mmu::DirtyMode;
use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::reboot;
use s2mmu_arm64::linux::run::{check_word, dirtier_rate, verdict, RunSpec};
use s2mmu_arm64::linux::vm::{self, LinuxConfig, LinuxReport, EXIT_NAMES};
use s2mmu_arm64::linux::{baseline, console_input};
use s2mmu_cli::dirty_mode::{dirty_name, parse_dirty_or_off, DirtyModeArgError};
use s2mmu_cli::flags::parse_duration;
use s2mmu_cli::report::{emit, Report};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

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
    /// Both placements back to back, --runs times (with QEMU booting the same kernel alone): boot to init, the dirtier under wp, manual and ring logging (its write rate, the stage-2 fault cost, faults per harvest), its fixed work (faults per pass, compared), medians and ratios.
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

/// The reset policy of the flags.
fn on_reset(p: &Params) -> reboot::OnReset {
    match p.on_reset.as_str() {
        "reboot" => reboot::OnReset::Reboot {
            max: p.max_reboots as u32,
        },
        _ => reboot::OnReset::Stop,
    }
}

impl Params {
    /// The time between harvests (`--harvest-every`, or its alias in ms).
    pub fn harvest(&self) -> Duration {
        self.harvest_ms
            .map_or(self.harvest_every, |ms| Duration::from_millis(ms as u64))
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

fn config(p: &Params) -> Result<(LinuxConfig, assets::LinuxAssets), String> {
    if !(vm::MIN_MEM..=vm::MAX_MEM).contains(&p.mem) || !p.mem.is_multiple_of(2 << 20) {
        return Err(format!(
            "--mem {}: a multiple of 2M from 128M to 4G",
            human_bytes(p.mem)
        ));
    }
    let ms = |lo, hi| Duration::from_millis(lo)..=Duration::from_millis(hi);
    if !ms(10, 10_000).contains(&p.harvest()) || !ms(1000, 3_600_000).contains(&p.timeout) {
        return Err("--harvest-every: 10ms to 10s; --timeout: 1s to 1h".into());
    }
    if let Some(m) = p.dirty.filter(|m| m.pml() || *m == DirtyMode::HW_BLOCKS) {
        return Err(format!("--dirty {}: not a mode `linux` runs (QEMU's model has no FEAT_HDBSS; hw-blocks is unchecked here)", m.name()));
    }
    if p.dirty.is_none() && !p.rate_per_mode && p.harvest() != Duration::from_millis(100) {
        return Err("--harvest-every needs --dirty or --rate-per-mode".into());
    }
    check_word("--run", &p.run)?;
    check_word("--args", &p.args)?;
    if p.cmdline.len() > 1024 {
        return Err("--cmdline: at most 1024 characters".into());
    }
    if p.vcpus > 1 && p.console != "-" && p.run == "shell" {
        return Err("--run shell needs --console -".into());
    }
    if let Some(why) = crate::arm64::unavailable() {
        return Err(why);
    }
    if p.engine_compare && (p.rate_per_mode || p.dirty.is_some() || p.vs_qemu || p.run != "none") {
        return Err(
            "--engine-compare runs its own boots and dirtier runs: no --rate-per-mode, --dirty, --vs-qemu or --run"
                .into(),
        );
    }
    if p.rate_per_mode && (p.run != "dirtier" || p.dirty.is_some() || p.vs_qemu) {
        return Err(
            "--rate-per-mode needs --run dirtier, and no --dirty or --vs-qemu (it runs each mode)"
                .into(),
        );
    }
    let a = assets::ensure(&AssetOptions::from_env()).map_err(|e| {
        format!(
            "{e}\n(the kernel and initramfs: {}; S2MMU_LINUX_FETCH=1 lets this command download them)",
            assets::setup_hint()
        )
    })?;
    crate::arm64::check_touched("--mem", p.mem)?;
    Ok((spec(p).config(&a), a))
}

/// The run's settings from the flags.
fn spec(p: &Params) -> RunSpec {
    RunSpec {
        vcpus: p.vcpus,
        mem: p.mem,
        kernel: p.kernel.clone(),
        initrd: p.initrd.clone(),
        cmdline: p.cmdline.clone(),
        run: p.run.clone(),
        args: p.args.clone(),
        echo: p.console == "-" && !p.json && !p.quiet,
        timeout: p.timeout,
        dirty: p.dirty,
        harvest: p.harvest(),
        engine: p.engine,
    }
}

/// Runs `linux`.
///
/// # Errors
/// A bad flag, missing QEMU or assets (naming what to install), a failed
/// boot, a guest that did not power off, or lost dirty pages.
pub fn main(p: Params) -> Result<(), String> {
    if p.fetch_only {
        let a = assets::ensure(&AssetOptions::from_env()).map_err(|e| e.to_string())?;
        println!(
            "kernel {} ({}), initramfs {}",
            a.image.display(),
            a.kernel_version,
            a.initramfs.display()
        );
        return Ok(());
    }
    if p.run == "ipi" {
        return ipi::main(&p);
    }
    let (cfg, a) = config(&p)?;
    if p.rate_per_mode {
        return rate::rate_per_mode(&p, cfg);
    }
    if p.engine_compare {
        return compare::engine_compare(&p, cfg, &a);
    }
    let mut rep = Report::new("linux", params_json(&p));
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for run in 1..=p.runs {
        let r = run_once(&p, &cfg)?;
        if p.console != "-" {
            std::fs::write(&p.console, &r.console).map_err(|e| format!("{}: {e}", p.console))?;
        }
        let base = if p.vs_qemu {
            Some(spec(&p).baseline(&a)?)
        } else {
            None
        };
        ours.extend(r.init_s);
        theirs.extend(base.as_ref().map(|b| b.init_s));
        let case = format!("run {run}");
        rep.result(&case, "s2mmu", to_json(&p, &r));
        if let Some(b) = &base {
            rep.result(
                &case,
                "qemu_alone",
                json!({"boot_to_init_s": b.init_s,
                "total_s": b.poweroff_s, "cpus_online": b.cpus_online}),
            );
            if let Some(s) = r.init_s {
                rep.compare(&case, "boot_to_init_s", b.init_s, s);
            }
        }
        if !p.json {
            println!("run {run}:");
            print_text(&p, &r, base.as_ref());
        }
        if let Some(f) = &p.plot {
            plot::write(f, &r)?;
        }
        if r.reason == vm::StopReason::Escape {
            break;
        }
        if let Err(e) = verdict(p.vcpus, &r) {
            emit_json(&p, &rep);
            return Err(e);
        }
    }
    summary(&p, &mut rep, &ours, &theirs);
    emit_json(&p, &rep);
    Ok(())
}

/// One boot. With the console on a terminal (or `--run shell`) what the
/// user types goes to the guest, the terminal in raw mode until the guest
/// stops; `Ctrl-A x` stops it.
fn run_once(p: &Params, cfg: &LinuxConfig) -> Result<LinuxReport, String> {
    let tty = console_input::stdin_is_terminal();
    if p.console != "-" || p.json || !(tty || p.run == "shell") {
        return reboot::run_rebooting(cfg, on_reset(p)).map_err(|e| e.to_string());
    }
    eprintln!("linux: the console is this terminal; Ctrl-A x stops the VM");
    let raw = match tty {
        true => {
            Some(console_input::RawTerminal::enter().map_err(|e| format!("the terminal: {e}"))?)
        }
        false => None,
    };
    let r = vm::run_interactive(cfg).map_err(|e| e.to_string());
    drop(raw);
    r
}

fn emit_json(p: &Params, rep: &Report) {
    if p.json {
        emit(rep, true);
    }
}

/// The flags as used, for the JSON envelope.
pub(super) fn params_json(p: &Params) -> serde_json::Value {
    json!({"vcpus": p.vcpus, "mem_bytes": p.mem, "run": p.run, "args": p.args,
        "dirty": dirty_name(p.dirty), "harvest_every_ms": p.harvest().as_secs_f64() * 1e3,
        "timeout_s": p.timeout.as_secs_f64(), "vs_qemu": p.vs_qemu, "runs": p.runs,
        "engine": format!("{:?}", p.engine).to_lowercase(), "engine_compare": p.engine_compare,
        "cmdline": p.cmdline, "note": EMULATOR_NOTE})
}

/// Medians over the runs: a comparison in the envelope, a line of text.
fn summary(p: &Params, rep: &mut Report, ours: &[f64], theirs: &[f64]) {
    let (m, b) = (median(ours), median(theirs));
    let ratio = m.zip(b).map(|(m, b)| m / b);
    if let (Some(m), Some(b)) = (m, b) {
        rep.compare("median", "boot_to_init_s", b, m);
    }
    if p.runs > 1 && !p.json {
        println!(
            "{} runs: boot to init median {} (runs {ours:.2?}); QEMU alone median {} (runs {theirs:.2?}); ratio {}",
            p.runs,
            m.map_or("n/a".into(), |s| format!("{s:.2} s")),
            b.map_or("n/a".into(), |s| format!("{s:.2} s")),
            ratio.map_or("n/a".into(), |r| format!("{r:.2}x"))
        );
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn to_json(p: &Params, r: &LinuxReport) -> serde_json::Value {
    let per_s: serde_json::Map<String, serde_json::Value> = EXIT_NAMES
        .iter()
        .zip(r.exits)
        .map(|(n, e)| (n.to_string(), json!(e as f64 / r.total_s.max(1e-9))))
        .collect();
    let exits: serde_json::Map<String, serde_json::Value> = EXIT_NAMES
        .iter()
        .zip(r.exits)
        .map(|(n, e)| (n.to_string(), json!(e)))
        .collect();
    json!({
        "stop": format!("{:?}", r.reason),
        "reboots": r.reboots,
        "cpus_online": r.cpus_online,
        "boot_to_init_s": r.init_s,
        "total_s": r.total_s,
        "engine": format!("{:?}", p.engine).to_lowercase(),
        "stage2_faults": r.exits[0],
        "el2_faults": r.el2_faults,
        "el2_fault_ms": ms(r.el2_fault_ns),
        "injected": r.injected,
        "exits": exits,
        "exits_per_s": per_s,
        "host_ms": {
            "engine": ms(r.engine_ns),
            "devices": ms(r.device_ns),
            "answering_exits": ms(r.host_ns),
            "stub_round_trips": ms(r.stub_ns),
            "stub_exits": r.stub_exits,
            "service_cpu_calls": r.tlbi.service_calls,
            "service_cpu": ms(r.tlbi.service_ns),
        },
        "dirtier_pages_per_s": dirtier_rate(&r.console),
        "dirty": r.dirty.as_ref().map(|d| json!({
            "mode": dirty_name(p.dirty),
            "harvests": d.harvests,
            "logged_pages": d.logged,
            "changed_pages": d.changed,
            "lost_pages": d.lost,
            "harvest_ms_total": ms(d.harvest_ns),
            "hash_ms_total": ms(d.hash_ns),
        })),
    })
}

fn print_text(p: &Params, r: &LinuxReport, b: Option<&baseline::BaselineReport>) {
    println!(
        "linux: {} vCPUs, {} RAM: {} CPUs online at init after {}, stopped ({:?}) after {:.2} s{}",
        p.vcpus,
        human_bytes(p.mem),
        r.cpus_online.map_or("no".into(), |n| n.to_string()),
        r.init_s.map_or("never".into(), |s| format!("{s:.2} s")),
        r.reason,
        r.total_s,
        if r.reboots > 0 {
            format!(
                " and {} reboots (the figures are the last boot's)",
                r.reboots
            )
        } else {
            String::new()
        }
    );
    let exits: Vec<String> = EXIT_NAMES
        .iter()
        .zip(r.exits)
        .map(|(n, e)| format!("{n} {e} ({:.0}/s)", e as f64 / r.total_s.max(1e-9)))
        .collect();
    println!("exits: {}", exits.join(", "));
    if p.engine == vm::Engine::El2 {
        println!(
            "engine at EL2: {} stage-2 faults answered there without an exit, {:.1} ms at EL2",
            r.el2_faults,
            ms(r.el2_fault_ns)
        );
    }
    println!(
        "host time: engine {:.1} ms, devices {:.1} ms, answering exits {:.1} ms; the stub's EL2 time over {} exits {:.1} ms; service CPU {} calls, {:.1} ms",
        ms(r.engine_ns),
        ms(r.device_ns),
        ms(r.host_ns),
        r.stub_exits,
        ms(r.stub_ns),
        r.tlbi.service_calls,
        ms(r.tlbi.service_ns)
    );
    if let Some(d) = &r.dirty {
        println!(
            "dirty ({}, every {:?}): {} harvests, {} pages logged, {} changed, {} lost; harvest {:.1} ms, hashing {:.1} ms",
            dirty_name(p.dirty),
            p.harvest(),
            d.harvests,
            d.logged,
            d.changed,
            d.lost,
            ms(d.harvest_ns),
            ms(d.hash_ns)
        );
    }
    if let Some(rate) = dirtier_rate(&r.console) {
        println!("dirtier: {rate:.0} pages/s");
    }
    if let Some(b) = b {
        println!(
            "QEMU alone (EL1): init after {:.2} s; ratio {}",
            b.init_s,
            r.init_s
                .map_or("n/a".into(), |s| format!("{:.2}x", s / b.init_s))
        );
    }
    for l in &r.log {
        println!("log: {l}");
    }
    println!("{EMULATOR_NOTE}");
}
