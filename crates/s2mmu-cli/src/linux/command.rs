//! `s2mmu linux`'s run: which kind of run the flags ask for, one boot,
//! and its text and JSON reports.

use super::{compare, ipi, plot, rate, Params};
use crate::arm64::EMULATOR_NOTE;
use crate::report::human_bytes;
use crate::stats::median;
use s2mmu::mmu::DirtyMode;
use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::reboot;
use s2mmu_arm64::linux::run::{check_word, dirtier_rate, verdict};
use s2mmu_arm64::linux::vm::{self, LinuxConfig, LinuxReport, EXIT_NAMES};
use s2mmu_arm64::linux::{baseline, console_input};
use s2mmu_cli::dirty_mode::dirty_name;
use s2mmu_cli::report::{emit, Report};
use serde_json::json;
use std::time::Duration;

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
    Ok((p.spec().config(&a), a))
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
    let mut rep = Report::new("linux", p.params_json());
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for run in 1..=p.runs {
        let r = run_once(&p, &cfg)?;
        if p.console != "-" {
            std::fs::write(&p.console, &r.console).map_err(|e| format!("{}: {e}", p.console))?;
        }
        let base = if p.vs_qemu {
            Some(p.spec().baseline(&a)?)
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
