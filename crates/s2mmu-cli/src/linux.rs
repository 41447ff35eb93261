//! `s2mmu linux`: Debian's arm64 Linux at EL1 under the project's EL2 stub
//! on QEMU's model, every byte of guest RAM mapped by the engine's fault
//! path; with `--dirty`, dirty logging from `/init` on, every harvest
//! checked against a hash of every guest page; with `--baseline`, the same
//! kernel and initramfs booted by QEMU itself, back to back, for the ratio.

use crate::arm64::EMULATOR_NOTE;
use crate::report::human_bytes;
use crate::stats::median;
use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::baseline;
use s2mmu_arm64::linux::reboot;
use s2mmu_arm64::linux::run::{check_word, dirtier_rate, verdict, RunSpec};
use s2mmu_arm64::linux::vm::{self, LinuxConfig, LinuxReport, EXIT_NAMES};
use s2mmu_cli::dirty_mode::{linux_dirty_name, parse_linux_dirty};
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;

mod ipi;
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
    /// Dirty logging from /init on: off, wp, manual, ring, ring:N, hw.
    // The full path keeps clap from making the flag optional: "off" is
    // the value `None`.
    #[arg(long, default_value = "off", value_parser = parse_linux_dirty)]
    pub dirty: std::option::Option<s2mmu::mmu::DirtyMode>,
    /// Milliseconds between harvests (10..=10000).
    #[arg(long, default_value_t = 100, value_parser = crate::limits::count_in(10..=10_000))]
    pub harvest_ms: usize,
    /// Stop the guest after this many seconds (1..=3600).
    #[arg(long, default_value_t = 300, value_parser = crate::limits::count_in(1..=3600))]
    pub timeout: usize,
    /// Also boot the same kernel and initramfs with QEMU alone (EL1, no stage 2) and report the ratio.
    #[arg(long)]
    pub baseline: bool,
    /// Runs (1..=10); with --baseline each run boots both, back to back, and the medians are compared.
    #[arg(long, default_value_t = 1, value_parser = crate::limits::count_in(1..=10))]
    pub runs: usize,
    /// With --run dirtier: one run without dirty logging, then one per mode (wp, manual, ring, hw), and the dirtier's write rate in each against the run without.
    #[arg(long)]
    pub rate_per_mode: bool,
    /// Only make sure the kernel and initramfs are in the cache (downloads with S2MMU_LINUX_FETCH=1).
    #[arg(long)]
    pub fetch_only: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
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

fn config(p: &Params) -> Result<(LinuxConfig, assets::LinuxAssets), String> {
    if !(vm::MIN_MEM..=vm::MAX_MEM).contains(&p.mem) || !p.mem.is_multiple_of(2 << 20) {
        return Err(format!(
            "--mem {}: a multiple of 2M from 128M to 4G",
            human_bytes(p.mem)
        ));
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
    if p.dirty.is_none() && !p.rate_per_mode && p.harvest_ms != 100 {
        return Err("--harvest-ms needs --dirty or --rate-per-mode".into());
    }
    if p.rate_per_mode && (p.run != "dirtier" || p.dirty.is_some() || p.baseline) {
        return Err(
            "--rate-per-mode needs --run dirtier, and no --dirty or --baseline (it runs each mode)"
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
        echo: p.console == "-" && !p.json,
        timeout: Duration::from_secs(p.timeout as u64),
        dirty: p.dirty,
        harvest: Duration::from_millis(p.harvest_ms as u64),
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
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for run in 1..=p.runs {
        let r = reboot::run_rebooting(&cfg, on_reset(&p)).map_err(|e| e.to_string())?;
        if p.console != "-" {
            std::fs::write(&p.console, &r.console).map_err(|e| format!("{}: {e}", p.console))?;
        }
        let base = if p.baseline {
            Some(spec(&p).baseline(&a)?)
        } else {
            None
        };
        ours.extend(r.init_s);
        theirs.extend(base.as_ref().map(|b| b.init_s));
        if p.json {
            println!("{}", to_json(&p, &r, base.as_ref()));
        } else {
            println!("run {run}:");
            print_text(&p, &r, base.as_ref());
        }
        verdict(p.vcpus, &r)?;
    }
    if p.runs > 1 {
        summary(&p, &ours, &theirs);
    }
    Ok(())
}

/// Medians over the runs (the JSON summary is the last line).
fn summary(p: &Params, ours: &[f64], theirs: &[f64]) {
    let (m, b) = (median(ours), median(theirs));
    let ratio = m.zip(b).map(|(m, b)| m / b);
    if p.json {
        println!(
            "{}",
            json!({"summary": {"runs": p.runs, "vcpus": p.vcpus, "boot_to_init_s": ours,
                "baseline_boot_to_init_s": theirs, "median_s": m, "baseline_median_s": b,
                "ratio_of_medians": ratio}})
        );
    } else {
        println!(
            "{} runs: boot to init median {} (runs {ours:.2?}); baseline median {} (runs {theirs:.2?}); ratio {}",
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

fn to_json(p: &Params, r: &LinuxReport, b: Option<&baseline::BaselineReport>) -> serde_json::Value {
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
        "vcpus": p.vcpus,
        "mem_bytes": p.mem,
        "stop": format!("{:?}", r.reason),
        "reboots": r.reboots,
        "cpus_online": r.cpus_online,
        "boot_to_init_s": r.init_s,
        "total_s": r.total_s,
        "stage2_faults": r.exits[0],
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
            "mode": linux_dirty_name(p.dirty),
            "harvest_ms": p.harvest_ms,
            "harvests": d.harvests,
            "logged_pages": d.logged,
            "changed_pages": d.changed,
            "lost_pages": d.lost,
            "harvest_ms_total": ms(d.harvest_ns),
            "hash_ms_total": ms(d.hash_ns),
        })),
        "baseline": b.map(|b| json!({
            "boot_to_init_s": b.init_s,
            "total_s": b.poweroff_s,
            "cpus_online": b.cpus_online,
            "ratio_boot_to_init": r.init_s.map(|s| s / b.init_s),
        })),
        "note": EMULATOR_NOTE,
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
            "dirty ({}, every {} ms): {} harvests, {} pages logged, {} changed, {} lost; harvest {:.1} ms, hashing {:.1} ms",
            linux_dirty_name(p.dirty),
            p.harvest_ms,
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
            "baseline (QEMU alone, EL1): init after {:.2} s; ratio {}",
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
