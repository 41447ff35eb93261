//! `s2mmu linux --engine-compare`: the two placements of the engine back
//! to back in one invocation, `--runs` times, with QEMU booting the same
//! kernel alone as the outside reference. Per run and placement: the boot
//! to init, then the dirtier under `wp`, `manual` and `ring` logging (its
//! write rate, the stage-2 fault cost from the abort to the return to the
//! guest, the faults and logged pages per harvest). Medians over the runs
//! and the ratios between the placements.

use super::Params;
use crate::stats::median;
use s2mmu::mmu::DirtyMode;
use s2mmu_arm64::linux::dirty;
use s2mmu_arm64::linux::run::{dirtier_rate, verdict};
use s2mmu_arm64::linux::vm::{self, Engine, LinuxConfig, LinuxReport};
use s2mmu_cli::report::Report;
use serde_json::json;
use std::collections::BTreeMap;

/// The modes compared.
const MODES: [(&str, DirtyMode); 3] = [
    ("wp", dirty::WP),
    ("manual", dirty::MANUAL),
    ("ring", dirty::RING),
];
/// The dirtier's arguments when `--args` names none.
const DIRTIER: &str = "mem=48,file=8,secs=10";

/// One measured quantity's samples, by placement.
#[derive(Default)]
struct Samples(BTreeMap<String, Vec<f64>>);

impl Samples {
    fn add(&mut self, key: String, v: Option<f64>) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            self.0.entry(key).or_default().push(v);
        }
    }
}

fn engine_name(e: Engine) -> &'static str {
    match e {
        Engine::Host => "host",
        Engine::El2 => "el2",
    }
}

/// The mean stage-2 fault cost of a run in µs, from the abort's vector
/// entry to the `ERET`: at EL2 without an exit, or the host's round trip.
fn fault_us(e: Engine, r: &LinuxReport) -> Option<f64> {
    let (n, ns) = match e {
        Engine::Host => (r.s2_round_trips, r.s2_round_trip_ns),
        Engine::El2 => (r.el2_faults, r.el2_fault_ns),
    };
    (n > 0).then(|| ns as f64 / n as f64 / 1e3)
}

/// Stage-2 faults of a run, wherever they were answered.
fn faults(r: &LinuxReport) -> u64 {
    r.exits[0] + r.el2_faults
}

fn run_one(cfg: &LinuxConfig, vcpus: usize) -> Result<LinuxReport, String> {
    let r = vm::run(cfg).map_err(|e| format!("{:?}: {e}", cfg.engine))?;
    verdict(vcpus, &r).map_err(|e| format!("{:?}: {e}", cfg.engine))?;
    Ok(r)
}

/// One run of both placements: boot, then each mode.
fn one_round(p: &Params, base: &LinuxConfig, s: &mut Samples) -> Result<(), String> {
    let args = if p.args.is_empty() { DIRTIER } else { &p.args };
    for e in [Engine::Host, Engine::El2] {
        let en = engine_name(e);
        let boot = LinuxConfig {
            engine: e,
            cmdline: p.cmdline.clone(),
            echo: false,
            dirty: Default::default(),
            ..clone_cfg(base)
        };
        let r = run_one(&boot, p.vcpus)?;
        s.add(format!("{en}.boot_to_init_s"), r.init_s);
        for (mn, mode) in MODES {
            let mut cfg = clone_cfg(&boot);
            cfg.cmdline = format!("{} s2mmu.run=dirtier s2mmu.args={args}", p.cmdline);
            cfg.dirty.mode = Some(mode);
            cfg.dirty.period = p.harvest();
            let r = run_one(&cfg, p.vcpus)?;
            let d = r.dirty.clone().unwrap_or_default();
            let h = d.harvests.max(1) as f64;
            s.add(format!("{en}.{mn}.pages_per_s"), dirtier_rate(&r.console));
            s.add(format!("{en}.{mn}.fault_us"), fault_us(e, &r));
            s.add(
                format!("{en}.{mn}.faults_per_harvest"),
                Some(faults(&r) as f64 / h),
            );
            s.add(
                format!("{en}.{mn}.logged_per_harvest"),
                Some(d.logged as f64 / h),
            );
            s.add(
                format!("{en}.{mn}.faults_per_logged_page"),
                (d.logged > 0).then(|| faults(&r) as f64 / d.logged as f64),
            );
            s.add(format!("{en}.{mn}.lost_pages"), Some(d.lost as f64));
            if !p.json {
                println!(
                    "  {en} {mn}: {:.0} pages/s, fault {:.2} us, {} faults, {} logged, {} harvests, {} lost",
                    dirtier_rate(&r.console).unwrap_or(0.0),
                    fault_us(e, &r).unwrap_or(0.0),
                    faults(&r),
                    d.logged,
                    d.harvests,
                    d.lost
                );
            }
        }
    }
    Ok(())
}

fn clone_cfg(c: &LinuxConfig) -> LinuxConfig {
    LinuxConfig {
        vcpus: c.vcpus,
        mem: c.mem,
        kernel: c.kernel.clone(),
        initrd: c.initrd.clone(),
        cmdline: c.cmdline.clone(),
        echo: c.echo,
        timeout: c.timeout,
        dirty: c.dirty,
        ram_pages: c.ram_pages,
        engine: c.engine,
    }
}

/// Runs the comparison and prints each run's figures, then the medians
/// and ratios (one JSON object with `--json`).
///
/// # Errors
/// A run that fails, does not power off, or loses a page; the baseline's
/// failure.
pub(super) fn engine_compare(
    p: &Params,
    cfg: LinuxConfig,
    a: &s2mmu_arm64::linux::assets::LinuxAssets,
) -> Result<(), String> {
    let mut s = Samples::default();
    for run in 1..=p.runs {
        if !p.json {
            println!("run {run}:");
        }
        one_round(p, &cfg, &mut s)?;
        let b = super::spec(p).baseline(a)?;
        s.add("qemu_alone.boot_to_init_s".into(), Some(b.init_s));
    }
    report(p, &s);
    Ok(())
}

fn report(p: &Params, s: &Samples) {
    let med = |k: &str| s.0.get(k).and_then(|v| median(v));
    let ratio = |a: &str, b: &str| med(a).zip(med(b)).map(|(a, b)| a / b);
    let mut ratios = serde_json::Map::new();
    for (mn, _) in MODES {
        ratios.insert(
            format!("{mn}.write_rate_el2_over_host"),
            json!(ratio(
                &format!("el2.{mn}.pages_per_s"),
                &format!("host.{mn}.pages_per_s")
            )),
        );
        ratios.insert(
            format!("{mn}.fault_cost_el2_over_host"),
            json!(ratio(
                &format!("el2.{mn}.fault_us"),
                &format!("host.{mn}.fault_us")
            )),
        );
        ratios.insert(
            format!("{mn}.faults_per_logged_page_el2_over_host"),
            json!(ratio(
                &format!("el2.{mn}.faults_per_logged_page"),
                &format!("host.{mn}.faults_per_logged_page")
            )),
        );
    }
    for en in ["host", "el2"] {
        ratios.insert(
            format!("{en}.boot_over_qemu_alone"),
            json!(ratio(
                &format!("{en}.boot_to_init_s"),
                "qemu_alone.boot_to_init_s"
            )),
        );
    }
    let medians: serde_json::Map<String, serde_json::Value> =
        s.0.keys().map(|k| (k.clone(), json!(med(k)))).collect();
    if p.json {
        let samples: serde_json::Map<String, serde_json::Value> =
            s.0.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        let mut rep = Report::new("linux", super::params_json(p));
        let dirtier = if p.args.is_empty() { DIRTIER } else { &p.args };
        rep.result(
            "engine_compare",
            "medians",
            json!({"runs": p.runs, "dirtier_args": dirtier, "medians": medians,
                "ratios": ratios, "samples": samples, "note": crate::arm64::EMULATOR_NOTE}),
        );
        s2mmu_cli::report::emit(&rep, true);
        return;
    }
    println!("medians over {} runs:", p.runs);
    for (k, v) in &medians {
        println!(
            "  {k:<40} {}",
            v.as_f64().map_or("n/a".into(), |x| format!("{x:.3}"))
        );
    }
    println!("ratios of the medians:");
    for (k, v) in &ratios {
        println!(
            "  {k:<40} {}",
            v.as_f64().map_or("n/a".into(), |x| format!("{x:.3}"))
        );
    }
    println!("{}", crate::arm64::EMULATOR_NOTE);
}
