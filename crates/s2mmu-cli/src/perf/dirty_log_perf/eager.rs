//! `-e` on huge-page backing: eager split against split on
//! fault, in paired runs.

use crate::report::{human, human_bytes, paired_ratio, paired_ratios, verdict, Report, Summary};
use s2mmu::mmu::FaultPath;
use serde_json::json;
use std::time::Duration;

use super::engine::{engine, policy_for, Job, RunSpec};
use super::params::Params;
use s2mmu_bench::dirty_log::schedule::rotated;
use s2mmu_bench::dirty_log::EngineRun;

/// One figure of an engine run.
type RunMetric<'a> = dyn Fn(&EngineRun) -> Duration + 'a;

/// Eager split against split on fault in alternating runs; returns the table.
pub(super) fn eager_vs_fault(job: &Job<'_>, report: &mut Report) -> Result<String, String> {
    let (p, vcpus, bytes, spec) = (job.p, job.vcpus[0], job.bytes, job.spec);
    // The pass that meets the write protection: the first after enabling, or with
    // KVM_DIRTY_LOG_INITIALLY_SET (manual protect, the default) the first after a CLEAR,
    // which is where KVM then write-protects and eagerly splits.
    let policy = policy_for(p, FaultPath::ReadLockFastPath, true);
    let wp = usize::from(
        policy
            .dirty
            .protect()
            .is_some_and(s2mmu::mmu::Protect::initially_set),
    );
    if p.iterations as usize <= wp {
        return Err(format!(
            "-e with manual protect needs at least {} iterations (-i): the first pass after a clear is the one measured; or use -g",
            wp + 1
        ));
    }
    let runs = p.runs.unwrap_or(5).max(1) as usize;
    let (eager, lazy) = paired_runs(p, vcpus, runs, &spec)?;
    let first = |r: &EngineRun| {
        r.iterations
            .get(wp)
            .map(|i| i.dirty_memory)
            .unwrap_or_default()
    };
    let split_cpu = |r: &EngineRun| {
        Duration::from_nanos(
            r.vm_stats.split_ns + r.iterations.iter().map(|i| i.faults.split_ns).sum::<u64>(),
        )
    };
    let vcpu_cpu = |r: &EngineRun| {
        r.iterations
            .get(wp)
            .map(|i| i.vcpu_time)
            .unwrap_or_default()
    };
    let enable = |r: &EngineRun| r.enable;
    let mut s = format!(
        "dirty-log-perf -e: eager split against split on fault, {vcpus} vCPUs x {}, {}; measured pass: iteration {} ({}); medians of {runs} runs of each, alternating\n",
        human_bytes(bytes),
        p.backing.name(),
        wp + 1,
        if wp == 0 { "first after enabling logging" } else { "first after a clear, initially-set" }
    );
    s += &format!(
        "{:<46} {:>14} {:>14} {:>9}\n",
        "", "eager split", "split on fault", "ratio"
    );
    let rows: [(&str, &RunMetric<'_>); 4] = [
        ("vCPUs dirty their memory, first protected pass", &first),
        ("CPU time spent splitting", &split_cpu),
        ("vCPU CPU time in that first pass", &vcpu_cpu),
        ("enabling dirty logging", &enable),
    ];
    for (name, f) in rows {
        s += &metric_row(name, f, &eager, &lazy, report);
    }
    let splits: u64 = lazy
        .iter()
        .flat_map(|r| &r.iterations)
        .map(|i| i.faults.splits_on_fault)
        .sum::<u64>()
        / runs as u64;
    s += &format!(
        "splits on fault: {splits} per run (each under the write lock on a vCPU thread)\n"
    );
    s += &first_pass_lines(p, vcpus, runs, &eager, &lazy, &first);
    if let Some(run) = eager.first() {
        for l in run.lines(p.ring().is_some()) {
            report.result("eager_detail", "eager_split", json!({"line": l}));
        }
    }
    Ok(s)
}

/// `runs` runs with eager split and as many with split on fault, both in one
/// process, alternating which goes first, so a slow stretch of this shared
/// machine lands on both.
fn paired_runs(
    p: &Params,
    vcpus: usize,
    runs: usize,
    spec: &impl Fn(usize, FaultPath, bool) -> RunSpec,
) -> Result<(Vec<EngineRun>, Vec<EngineRun>), String> {
    let specs = [true, false].map(|e| spec(vcpus, FaultPath::ReadLockFastPath, e));
    let mut got = rotated(runs, &specs, |s| engine(s, &p.memslots))?.into_iter();
    let eager = got.next().unwrap_or_default();
    Ok((eager, got.next().unwrap_or_default()))
}

/// A metric's values over runs, in seconds.
fn run_secs(runs: &[EngineRun], f: &RunMetric<'_>) -> Vec<f64> {
    runs.iter().map(|r| f(r).as_secs_f64()).collect::<Vec<_>>()
}

/// One metric's line of the table (eager, on fault, their paired ratio)
/// and its JSON rows.
fn metric_row(
    name: &str,
    f: &RunMetric<'_>,
    eager: &[EngineRun],
    lazy: &[EngineRun],
    report: &mut Report,
) -> String {
    let e: Vec<Duration> = eager.iter().map(f).collect();
    let l: Vec<Duration> = lazy.iter().map(f).collect();
    let (es, ls) = (Summary::of(&e), Summary::of(&l));
    // The ratio of each pair of runs, then its median.
    let ratio = paired_ratio(&run_secs(eager, f), &run_secs(lazy, f));
    let ratio_text = ratio.map_or("-".to_string(), |r| format!("{r:.2}x"));
    let s = format!(
        "{name:<46} {:>14} {:>14} {ratio_text:>9}\n",
        human(es.median),
        human(ls.median),
    );
    let case = name.replace([' ', ','], "_").replace("__", "_");
    report.result(&case, "eager_split", es.json());
    report.result(&case, "split_on_fault", ls.json());
    report.compare(
        &case,
        "median_ns",
        ls.median.as_nanos() as f64,
        es.median.as_nanos() as f64,
    );
    s
}

/// The first protected pass's ratio per run pair and the target line.
fn first_pass_lines(
    p: &Params,
    vcpus: usize,
    runs: usize,
    eager: &[EngineRun],
    lazy: &[EngineRun],
    first: &RunMetric<'_>,
) -> String {
    let mut s = String::new();
    let all = paired_ratios(&run_secs(eager, first), &run_secs(lazy, first));
    let ratio = crate::stats::median(&all).unwrap_or(0.0);
    s += &format!(
        "first-pass ratio per run: {}\n",
        all.iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if vcpus == 2 && p.backing.page_size() == 2 << 20 {
        s += &format!(
            "target (2 MiB backing, 2 vCPUs): first dirty pass >= 5x faster with eager split: {ratio:.2}x, median of {runs} paired runs ({})\n",
            verdict(ratio >= 5.0)
        );
    } else {
        s += &format!(
            "first dirty pass {ratio:.2}x faster with eager split, median of {runs} paired runs (the target is set for 2 vCPUs on 2 MiB backing)\n"
        );
    }
    s
}
