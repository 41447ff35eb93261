//! The JSON rows and text lines of single engine runs (`s2mmu
//! dirty-log-perf` with one policy): phases, counts, the lost-write check
//! and the single-run target.

use crate::report::Report;
use crate::stats::Samples;
use crate::text::{human, verdict};
use serde_json::json;
use std::time::Duration;

use super::EngineRun;

/// One JSON row per phase of a single run (`runs: 1`).
pub fn phase_rows(report: &mut Report, phases: &[(String, Duration)], policy: &str) {
    for (name, d) in phases {
        // One sample: `value_ns` and `runs: 1`, not a distribution.
        report.result(name, policy, Samples::of(&[*d]).json());
    }
}

/// The counts the run's text prints, as JSON rows: each iteration's faults
/// (fast, slow, split on fault), lock contentions and pages dirtied, the
/// pass after logging stopped, and the per-fault time of the pass the text
/// quotes.
pub fn count_rows(report: &mut Report, r: &EngineRun, vcpus: usize, policy: &str) {
    for (i, it) in r.iterations.iter().enumerate() {
        report.result(
            &format!("iteration_{}_faults", i + 1),
            policy,
            json!({
                "vcpus": vcpus,
                "faults": it.faults.permission + it.faults.translation,
                "fast": it.faults.fast,
                "slow": it.faults.slow,
                "split_on_fault": it.faults.splits_on_fault,
                "lock_contentions": it.faults.contentions(),
                "pages_dirty": it.pages_dirty,
            }),
        );
    }
    if let Some((t, f)) = &r.after {
        report.result(
            "pass_after_logging_stopped",
            policy,
            json!({
                "vcpus": vcpus,
                "pass_ns": t.as_nanos() as u64,
                "faults": f.fast + f.slow,
                "translation_faults": f.translation,
                "blocks_collapsed_in_place": r.vm_stats.collapsed,
            }),
        );
    }
    if let Some((faults, per)) = per_fault(r) {
        report.result(
            "per_fault",
            policy,
            json!({"vcpus": vcpus, "faults": faults, "ns_per_fault": per}),
        );
    }
}

/// The pass `single_target` quotes (the second, or the only one): its
/// faults and its time per fault in ns.
fn per_fault(r: &EngineRun) -> Option<(u64, f64)> {
    let it = r
        .iterations
        .iter()
        .skip(1)
        .chain(r.iterations.first())
        .next()?;
    let faults = it.faults.permission + it.faults.translation;
    let per = if faults > 0 {
        it.dirty_memory.as_nanos() as f64 / faults as f64
    } else {
        0.0
    };
    Some((faults, per))
}

/// The lost-write check's rows, and the run's failure if a write was lost.
pub fn lost_rows(report: &mut Report, r: &EngineRun, vcpus: usize) {
    let mut total = 0;
    for (i, it) in r.iterations.iter().enumerate() {
        if let Some(l) = it.lost_writes {
            report.result(
                &format!("lost_write_check_iteration_{}", i + 1),
                "engine",
                json!({"vcpus": vcpus, "changed": l.changed, "lost": l.lost}),
            );
            total += l.lost;
        }
    }
    if total > 0 {
        report.fail(format!(
            "lost-write check: {total} pages changed without being in the dirty log"
        ));
    }
}

/// The single-run target: 1 vCPU, 256 MiB, a dirty pass of 65536
/// write-protection faults within 50 ms.
pub fn single_target(r: &EngineRun, vcpus: usize, bytes: u64) -> String {
    let (Some(it), Some((faults, per))) = (
        r.iterations
            .iter()
            .skip(1)
            .chain(r.iterations.first())
            .next(),
        per_fault(r),
    ) else {
        return String::new();
    };
    let mut s = format!("Per fault (pass time / faults): {per:.0} ns over {faults} faults\n");
    if vcpus == 1 && bytes == 256 << 20 {
        s += &format!(
            "target: 1 vCPU, 256 MiB dirty pass within 50 ms: {} ({})\n",
            human(it.dirty_memory),
            verdict(it.dirty_memory <= Duration::from_millis(50))
        );
    }
    s
}
