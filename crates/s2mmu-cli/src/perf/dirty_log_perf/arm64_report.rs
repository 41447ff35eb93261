//! `dirty-log-perf --arm64`: the selftest flow on QEMU's arm64 model, the
//! engine as its stage-2 MMU (`s2mmu-arm64`; the run is
//! [`s2mmu_bench::dirty_log::arm64`]). Every pass can be checked against
//! the guest's own record of what it wrote (`--check`). Here: the flags
//! checked against the model's limits and the run (its lines and JSON rows
//! are `s2mmu_bench::dirty_log::arm64_rows`').
//!
//! QEMU's timings are an emulator's: the lines say so, and the figures
//! worth reading are the counts (faults, aborts, maintenance, pages) and
//! ratios (the host's and the engine's share of an abort's round trip).

use super::engine::{policy_for, Job};
use super::params::{Params, PolicyArg};
use crate::report::{human_bytes, Report};
use s2mmu::mmu::{FaultPath, Protect};
use s2mmu_bench::arm64 as a64;
pub(super) use s2mmu_bench::dirty_log::arm64::{as_engine_run, run_one, Plan};
use s2mmu_bench::dirty_log::arm64_rows::{medians_text, run_lines};
pub(super) use s2mmu_bench::dirty_log::arm64_rows::{round_trip_lines, rows};
use s2mmu_vm::Backing;
use serde_json::json;

/// Bytes per page of the model's granule (4K).
const PAGE: u64 = 4096;

/// Checks the options against the model's limits, before anything is
/// allocated or started.
///
/// # Errors
/// A message naming the flag and its limit.
pub(super) fn plan(p: &Params, vcpus: &[usize], bytes: u64) -> Result<Plan, String> {
    refuse_other_shapes(p)?;
    let host_page = match p.backing {
        Backing::Anonymous => PAGE,
        Backing::AnonymousThp => 2 << 20,
        other => {
            return Err(format!(
                "-s {}: the arm64 model backs guest memory with 4K pages (anonymous) or 2M blocks (anonymous_thp)",
                other.name()
            ))
        }
    };
    if let Some(&v) = vcpus.iter().find(|&&v| v == 0 || v > a64::MAX_VCPUS) {
        return Err(format!(
            "-v {v}: the arm64 model runs 1..={} vCPUs (QEMU's {} CPUs less the one that serves maintenance)",
            a64::MAX_VCPUS,
            a64::MAX_VCPUS + 1
        ));
    }
    if bytes == 0 || !bytes.is_multiple_of(host_page) {
        return Err(format!(
            "-b {bytes}: must be a non-zero multiple of {} (the page of -s {})",
            human_bytes(host_page),
            p.backing.name()
        ));
    }
    let most = vcpus.iter().copied().max().unwrap_or(1) as u64;
    let total = bytes
        .checked_mul(most)
        .filter(|&t| t <= a64::MAX_BYTES)
        .ok_or_else(|| {
            format!(
                "-v {most} x -b {}: the arm64 model holds at most {} of guest data",
                human_bytes(bytes),
                human_bytes(a64::MAX_BYTES)
            )
        })?;
    a64::check_touched("-v x -b", total)?;
    let pages = bytes / PAGE;
    if let Some(n) = p.ring() {
        check_ring(n, pages)?;
    }
    let runs = p.runs.unwrap_or(1);
    if !(1..=100).contains(&runs) {
        return Err(format!("-r {runs}: must be 1..=100 with --arm64"));
    }
    let fault_path = if p.policy == PolicyArg::Baseline {
        FaultPath::WriteLock
    } else {
        FaultPath::ReadLockFastPath
    };
    let mut policy = policy_for(p, fault_path, p.eager_split);
    // `--check` runs the random pattern: a sequential pass writes every
    // page, so a page logged but never written ("extra") could not occur
    // and the check would judge half the log. Random writes skip about a
    // third of the pages each pass; with the bitmap initially set, pass 1
    // would then log pages the guest never wrote (and take no fault), so
    // initially-set is off with them.
    let random = p.random || p.check;
    if random {
        let manual = policy.dirty.manual_protect();
        policy.dirty = policy.dirty.with_protect(Protect::manual_if(manual));
    }
    Ok(Plan {
        host_page,
        policy,
        random,
        runs,
        iterations: p.iterations,
        check: p.check,
    })
}

/// Refuses what the model does not run: both fault paths in one run, the
/// array memslots, more than one data memslot, reads.
fn refuse_other_shapes(p: &Params) -> Result<(), String> {
    if p.policy == PolicyArg::Both {
        return Err(
            "--policy both: not available with the arm64 model (use --policy default or baseline)"
                .into(),
        );
    }
    if p.memslots != "tree" {
        return Err(format!(
            "--memslots {}: the arm64 model runs the tree memslots only (--memslots tree)",
            p.memslots
        ));
    }
    if p.slots != 1 {
        return Err(format!(
            "-x {}: the arm64 model runs one data memslot (-x 1)",
            p.slots
        ));
    }
    if p.write_percent != 100 {
        return Err(format!(
            "-w {}: the arm64 guest writes every page it visits (-w 100)",
            p.write_percent
        ));
    }
    Ok(())
}

/// `--ring n` with the arm64 model: a power of two in 256..=65536 that
/// holds a vCPU's pass of `pages` pages plus 64 entries.
fn check_ring(n: u32, pages: u64) -> Result<(), String> {
    if !n.is_power_of_two() || !(256..=65536).contains(&n) {
        return Err(format!("--ring {n}: must be a power of two in 256..=65536"));
    }
    if u64::from(n) < pages + 64 {
        let want = (pages + 64).next_power_of_two();
        return Err(if want <= 65536 {
            format!(
                "--ring {n}: a vCPU's ring must hold a pass of {pages} pages plus 64 entries (--ring {want} or more)"
            )
        } else {
            format!(
                "--ring {n}: a ring of at most 65536 entries cannot hold a pass of {pages} pages (-b at most {} with rings)",
                human_bytes((65536 - 64) / 64 * 64 * PAGE)
            )
        });
    }
    Ok(())
}

/// Runs `dirty-log-perf --arm64`: every vCPU count, `-r` runs each.
/// A pass with missing or extra pages marks the report failed.
///
/// # Errors
/// A bad option (before QEMU starts), or a run that failed.
pub(super) fn run(job: &Job<'_>, report: &mut Report) -> Result<String, String> {
    let (p, vcpus_list, bytes) = (job.p, job.vcpus, job.bytes);
    let plan = plan(p, vcpus_list, bytes)?;
    if let Some(why) = a64::unavailable() {
        return Err(format!("--arm64: {why}"));
    }
    let ring = p.ring().is_some();
    let mut text = format!(
        "dirty-log-perf --arm64: the engine as the stage-2 MMU of QEMU's arm64 model (qemu-system-aarch64, MTTCG), {} per vCPU, {} ({} host pages), {} iterations, {} run(s) each on a fresh QEMU{}\n{}\n",
        human_bytes(bytes),
        p.backing.name(),
        human_bytes(plan.host_page),
        p.iterations,
        plan.runs,
        if plan.random {
            "; -a (or --check): each pass writes as many random pages as the region has (with repeats, so about a third stay unwritten and the check can see extra pages), initially-set off"
        } else {
            ""
        },
        a64::EMULATOR_NOTE
    );
    let (mut passes, mut missing, mut extra) = (0u64, 0u64, 0u64);
    for &v in vcpus_list {
        let mut runs = Vec::new();
        for k in 0..plan.runs {
            let r = run_one(&plan, v, bytes)?;
            let e = as_engine_run(&r, &plan, v, bytes);
            if plan.runs > 1 {
                text += &format!("\n-- {v} vCPU(s), run {} of {}\n", k + 1, plan.runs);
            }
            for l in run_lines(&r, &e, ring, p.check) {
                text += &l;
                text.push('\n');
            }
            for x in &r.passes {
                if let Some(w) = x.written {
                    passes += 1;
                    missing += x.missing;
                    extra += x.extra;
                    report.result(
                        &format!("check_iteration_{}", x.iteration),
                        "arm64",
                        json!({"vcpus": v, "run": k + 1, "logged": x.logged, "written": w,
                               "missing": x.missing, "extra": x.extra,
                               "passes": x.missing == 0 && x.extra == 0}),
                    );
                }
            }
            runs.push((r, e));
        }
        rows(report, v, &runs, ring);
        if plan.runs > 1 {
            text += &medians_text(v, &runs, ring);
        }
    }
    if p.check {
        let ok = missing == 0 && extra == 0 && passes > 0;
        text += &format!(
            "arm64 check: {passes} passes checked against the guest's record, {missing} missing, {extra} extra: {}\n",
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            report.fail(format!(
                "dirty log check failed on the arm64 model: {missing} missing, {extra} extra pages over {passes} passes"
            ));
        }
    }
    Ok(text)
}
