//! `s2mmu dirty-log-perf`: KVM's dirty_log_perf_test on the engine's
//! simulated VM (fault paths and eager split), on the host's real KVM (`--kvm`), or
//! both side by side (`--compare`).
//!
//! Flow, as the selftest: vCPU threads populate their memory (one pass),
//! dirty logging is enabled on every slot, then for each iteration the
//! vCPUs dirty their memory in lockstep and the host gets (and with manual
//! protect clears) the log; finally logging is disabled.
//!
//! The parts, one file each: the flags ([`params`]), the engine's
//! settings and its `--format` dispatch (`engine`; the run and its figures are
//! `s2mmu_bench::dirty_log`), single-run rows and lines
//! (`s2mmu_bench::dirty_log::rows`), real KVM (`kvm`), `--policy both` (`policy_table`), `-e`
//! (`eager`), `--compare` (`compare`), the side-by-side `--dirty` table
//! (`modes`), `--arm64` (`arm64_report`; its run is the bench crate's) and
//! the flag bounds (`bounds`).

use crate::report::Report;
use s2mmu::mmu::FaultPath;
use s2mmu_vm::Backing;
use serde_json::json;

mod arm64_report;
mod bounds;
mod compare;
mod eager;
mod engine;
mod kvm;
mod modes;
pub mod params;
mod policy_table;

pub use modes::FormatArg;
pub use params::{Params, PolicyArg};

use engine::{engine, policy_for, Job, RunSpec};
use s2mmu_bench::dirty_log::rows::{count_rows, lost_rows, phase_rows, single_target};

/// Runs `dirty-log-perf` from the command line.
///
/// # Errors
/// A message naming what failed.
pub fn main(p: Params) -> Result<(), String> {
    let report = run(&p)?;
    crate::report::emit(&report, p.json);
    match report.failure() {
        Some(why) => Err(why.to_string()),
        None => Ok(()),
    }
}

/// Runs the benchmark and returns its report.
///
/// # Errors
/// A message naming what failed.
pub fn run(p: &Params) -> Result<Report, String> {
    let list = p.vcpus.len() > 1 || p.policy == PolicyArg::Both;
    let vcpus_list: Vec<usize> = if p.vcpus.is_empty() {
        if p.policy == PolicyArg::Both {
            vec![1, 2, 4, 8, 16, 32, 64]
        } else {
            vec![1]
        }
    } else {
        p.vcpus.clone()
    };
    modes::check_params(p)?;
    if p.check && !p.kvm && !p.arm64 && (p.ring().is_some() || p.compare) {
        return Err(
            "--check on the engine compares page contents with the dirty bitmaps: not with --ring or --compare".into(),
        );
    }
    let bytes = p
        .bytes_per_vcpu
        .unwrap_or(if list || p.arm64 { 64 << 20 } else { 1 << 30 });
    bounds::check(p, &vcpus_list, bytes)?;
    // Runs take from a second to minutes: say what runs before it does
    // (not before --arm64's one-line refusal where QEMU cannot run).
    let _progress = (!p.arm64 || crate::arm64::unavailable().is_none()).then(|| {
        crate::progress::Progress::new(
            "dirty-log-perf",
            (vcpus_list.len() as u64).saturating_mul(u64::from(p.iterations)),
            !p.quiet,
        )
    });
    let params = params_json(p, &vcpus_list, bytes);
    let mut report = Report::new("dirty-log-perf", params);
    let mut text = String::new();
    let spec = |vcpus: usize, fault_path: FaultPath, eager: bool| RunSpec {
        vcpus,
        bytes,
        iterations: p.iterations,
        backing: p.backing,
        slots: p.slots,
        write_percent: p.write_percent,
        random: p.random,
        policy: policy_for(p, fault_path, eager),
        after_pass: p.after_pass,
        check: p.check && !p.kvm && !p.arm64,
        inject_lost_marks: p.inject_lost_marks,
        format: p.format,
        off_pass: false,
    };
    let huge = p.backing != Backing::Anonymous;
    let job = Job {
        p,
        vcpus: &vcpus_list,
        bytes,
        spec: &spec,
    };

    if p.dirty_modes().len() > 1 {
        text += &modes::table(&job, &mut report)?;
    } else if p.arm64 {
        text += &arm64_report::run(&job, &mut report)?;
    } else if p.kvm && !p.compare {
        text += &kvm::run(&job, &mut report)?;
    } else if p.compare {
        text += &compare::run(&job, &mut report)?;
    } else if p.policy == PolicyArg::Both {
        text += &policy_table::both_table(&job, &mut report)?;
    } else if p.eager_split && huge {
        text += &eager::eager_vs_fault(&job, &mut report)?;
    } else {
        text += &run_single(&job, &mut report)?;
    }
    report.set_text(text);
    Ok(report)
}

/// The run's parameters as its JSON report names them.
fn params_json(p: &Params, vcpus_list: &[usize], bytes: u64) -> serde_json::Value {
    json!({
        "vcpus": vcpus_list, "bytes_per_vcpu": bytes, "iterations": p.iterations,
        "backing": p.backing.name(), "slots": p.slots, "manual_protect": !p.no_manual_protect,
        "eager_split": p.eager_split, "write_percent": p.write_percent, "random": p.random,
        "policy": format!("{:?}", p.policy).to_lowercase(), "memslots": p.memslots,
        "ring": p.ring(), "dirty": p.dirty_modes().iter().map(|d| d.name()).collect::<Vec<_>>(), "format": p.format.name(), "recover": format!("{:?}", p.recover).to_lowercase(), "after_pass": p.after_pass, "kvm": p.kvm, "compare": p.compare, "arm64": p.arm64, "check": p.check,
        "runs": p.runs,
    })
}

/// One policy's engine run per vCPU count, with the selftest's lines.
fn run_single(job: &Job<'_>, report: &mut Report) -> Result<String, String> {
    let (p, vcpus_list, bytes, spec) = (job.p, job.vcpus, job.bytes, job.spec);
    let ring = p.ring().is_some();
    let mut text = String::new();
    let fp = if p.policy == PolicyArg::Baseline {
        FaultPath::WriteLock
    } else {
        FaultPath::ReadLockFastPath
    };
    for &v in vcpus_list {
        let r = engine(spec(v, fp, p.eager_split), &p.memslots)?;
        for l in r.lines(ring) {
            text += &l;
            text.push('\n');
        }
        let pol = if fp == FaultPath::WriteLock {
            "write_lock"
        } else {
            "fast_path"
        };
        phase_rows(report, &r.phases(ring), pol);
        count_rows(report, &r, v, pol);
        text += &single_target(&r, v, bytes);
        lost_rows(report, &r, v);
    }
    Ok(text)
}
