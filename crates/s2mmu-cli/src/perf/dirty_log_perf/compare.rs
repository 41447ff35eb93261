//! `--compare`: the engine, the host's real KVM and QEMU's arm64 model in
//! one process, with the ratios per phase.

use crate::report::{human_bytes, Report};
use serde_json::json;
use std::time::Duration;

use s2mmu::mmu::FaultPath;

use super::engine::{engine, Job};
use super::params::Params;
use super::{arm64_report, kvm::kvm_params};
use s2mmu_bench::dirty_log::rows::phase_rows;
use s2mmu_bench::dirty_log::{secs, EngineRun};

/// Runs the three columns that can run here (the engine always) for `v`
/// vCPUs and returns the comparison's text.
pub(super) fn run(job: &Job<'_>, report: &mut Report) -> Result<String, String> {
    let (p, v, bytes, spec) = (job.p, job.vcpus[0], job.bytes, job.spec);
    // Which columns can run, decided before anything runs.
    // -r means nothing to --compare: one run of each column.
    let one_run = Params {
        runs: None,
        ..p.clone()
    };
    let arm64_plan = arm64_report::plan(&one_run, &[v], bytes).and_then(|mut plan| {
        if let Some(why) = crate::arm64::unavailable() {
            return Err(why);
        }
        // The engine column's policy.
        plan.policy.fault_path = FaultPath::ReadLockFastPath;
        plan.runs = 1;
        Ok(plan)
    });
    let kvm_skip = s2mmu_kvm::kvm_unusable_reason();
    let kp = kvm_params(p, v, bytes)?;
    let e = engine(
        spec(v, FaultPath::ReadLockFastPath, p.eager_split),
        &p.memslots,
    )?;
    let k = match kvm_skip {
        None => Ok(s2mmu_kvm::dirty_log_perf::run(&kp).map_err(|e| e.to_string())?),
        Some(why) => Err(why),
    };
    let a = match arm64_plan {
        Ok(plan) => {
            let r = arm64_report::run_one(&plan, v, bytes)?;
            let run = arm64_report::as_engine_run(&r, &plan, v, bytes);
            Ok((r, run))
        }
        Err(why) => Err(why),
    };
    Ok(compare_text(job, &Columns { e, k, a }, report))
}

/// A column of `--compare`: its run, or why it was skipped.
type Column<T> = Result<T, String>;

/// The three columns: the engine's run, real KVM's, the arm64 model's.
struct Columns {
    e: EngineRun,
    k: Column<s2mmu_kvm::DirtyLogReport>,
    a: Column<(s2mmu_arm64::workload::DirtyReport, EngineRun)>,
}

/// The comparison's title: the run's shape, the host, and what each column
/// is or why it was skipped.
fn compare_header(job: &Job<'_>, c: &Columns) -> String {
    let (p, vcpus, bytes) = (job.p, job.vcpus[0], job.bytes);
    let Columns { e, k, a } = c;
    let host = s2mmu_kvm::HostInfo::detect();
    let mut s = format!(
        "dirty_log_perf: s2mmu engine vs host KVM vs QEMU's arm64 model, {vcpus} vCPU(s) x {}, {}, {} slot(s), {} iterations{}\n",
        human_bytes(bytes),
        p.backing.name(),
        p.slots,
        p.iterations,
        if p.no_manual_protect { ", no manual protect" } else { ", manual protect" }
    );
    s += &format!("host: {}\n", host.one_line());
    s += &format!("engine: {}\n", e.label);
    if let Err(why) = k {
        s += &format!("KVM column skipped: {why}\n");
    }
    match a {
        Ok(_) => s += &format!("arm64: the engine as the stage-2 MMU of qemu-system-aarch64 ({} CPUs: {vcpus} vCPU(s) + 1 service CPU); {}\n", vcpus + 1, crate::arm64::EMULATOR_NOTE.trim_start_matches("note: ")),
        Err(why) => s += &format!("arm64 column skipped: {why}\n"),
    }
    s
}

/// The comparison's rows and text from the three columns.
fn compare_text(job: &Job<'_>, c: &Columns, report: &mut Report) -> String {
    let (p, vcpus) = (job.p, job.vcpus[0]);
    let Columns { e, k, a } = c;
    let ring = p.ring().is_some();
    let ep = e.phases(ring);
    let kp = k.as_ref().map(|k| k.phases()).unwrap_or_default();
    let ap = a.as_ref().map(|a| a.1.phases(ring)).unwrap_or_default();
    phase_rows(report, &ep, "engine");
    phase_rows(report, &kp, "kvm");
    match a {
        Ok(run) => arm64_report::rows(report, vcpus, std::slice::from_ref(run), ring),
        Err(why) => report.result("column_skipped", "arm64", json!({"reason": why})),
    }
    if let Err(why) = k {
        report.result("column_skipped", "kvm", json!({"reason": why}));
    }
    let mut s = compare_header(job, c);
    s += &format!(
        "\n{:<34} {:>16} {:>16} {:>16} {:>10} {:>12}\n",
        "phase", "s2mmu engine", "KVM", "arm64 (QEMU)", "KVM/engine", "arm64/engine"
    );
    let find =
        |v: &[(String, Duration)], name: &str| v.iter().find(|(n, _)| n == name).map(|(_, d)| *d);
    let ratio = |x: Duration, d: Duration| x.as_secs_f64() / d.as_secs_f64().max(1e-12);
    for (name, d) in &ep {
        let kd = find(&kp, name);
        let ad = find(&ap, name);
        if kd.is_none() && ad.is_none() && (k.is_ok() || a.is_ok()) {
            continue;
        }
        if let Some(kd) = kd {
            report.compare(name, "median_ns", kd.as_nanos() as f64, d.as_nanos() as f64);
        }
        if let Some(ad) = ad {
            report.compare(
                name,
                "median_ns_arm64",
                ad.as_nanos() as f64,
                d.as_nanos() as f64,
            );
        }
        let cell = |x: Option<Duration>| x.map_or("-".to_string(), secs);
        let rcell =
            |x: Option<Duration>| x.map_or("-".to_string(), |x| format!("{:.2}x", ratio(x, *d)));
        s += &format!(
            "{name:<34} {:>16} {:>16} {:>16} {:>10} {:>12}\n",
            secs(*d),
            cell(kd),
            cell(ad),
            rcell(kd),
            rcell(ad),
        );
    }
    s += &fault_lines(e, k, a);
    fault_rows(report, e, k, a);
    if k.is_ok() {
        s += "(KVM/engine > 1: the engine's simulated path is faster than a real KVM exit per fault)\n";
    }
    if a.is_ok() {
        s += "(arm64/engine: QEMU's emulated arm64 guest with the engine as its stage-2 MMU against the simulated VM; an emulator's time, so read it as a ratio on this machine, not as arm64 speed)\n";
    }
    s
}

/// `fault_lines`' counts as JSON rows: per iteration the engine's faults,
/// KVM's pf_fixed (null where the kernel does not export it) and pages
/// written, the arm64 model's pages logged; the arm64 column's totals.
fn fault_rows(
    report: &mut Report,
    e: &EngineRun,
    k: &Column<s2mmu_kvm::DirtyLogReport>,
    a: &Column<(s2mmu_arm64::workload::DirtyReport, EngineRun)>,
) {
    for (i, it) in e.iterations.iter().enumerate() {
        let mut row = json!({"engine_faults": it.faults.permission + it.faults.translation});
        if let Some(kit) = k.as_ref().ok().and_then(|k| k.iterations.get(i)) {
            row["kvm_pf_fixed"] = json!(kit.exits.kvm.pf_fixed);
            row["kvm_pages_written"] = json!(kit.pages_written);
        }
        if let Some(ap) = a.as_ref().ok().and_then(|(r, _)| r.passes.get(i)) {
            row["arm64_pages_logged"] = json!(ap.logged);
        }
        report.result(&format!("iteration_{}_faults", i + 1), "compare", row);
    }
    if let Ok((r, _)) = a {
        let f = &r.faults;
        report.result(
            "arm64_faults_all_passes",
            "arm64",
            json!({"faults": f.permission + f.translation, "fast": f.fast, "slow": f.slow}),
        );
    }
}

/// Each iteration's faults per column, and the arm64 column's totals and
/// round trips.
fn fault_lines(
    e: &EngineRun,
    k: &Column<s2mmu_kvm::DirtyLogReport>,
    a: &Column<(s2mmu_arm64::workload::DirtyReport, EngineRun)>,
) -> String {
    let mut s = String::new();
    for (i, it) in e.iterations.iter().enumerate() {
        let ef = it.faults.permission + it.faults.translation;
        let mut line = format!("iteration {} faults: engine {ef}", i + 1);
        if let Ok(k) = k {
            if let Some(kit) = k.iterations.get(i) {
                let kf = kit
                    .exits
                    .kvm
                    .pf_fixed
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "n/a".into());
                line += &format!(", KVM pf_fixed {kf} (pages written {})", kit.pages_written);
            }
        }
        if let Ok((r, _)) = a {
            if let Some(ap) = r.passes.get(i) {
                line += &format!(", arm64 pages logged {}", ap.logged);
            }
        }
        s += &line;
        s.push('\n');
    }
    if let Ok((r, _)) = a {
        let f = &r.faults;
        s += &format!(
            "arm64 faults, all passes (populate included): {} ({} fast, {} slow)\n",
            f.permission + f.translation,
            f.fast,
            f.slow
        );
        for l in arm64_report::round_trip_lines(r) {
            s += &l;
            s.push('\n');
        }
    }
    s
}
