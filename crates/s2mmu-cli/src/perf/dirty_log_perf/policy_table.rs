//! `--policy both`: the read-lock fast path, the same on KVM's
//! shared rwlock, and write-lock faults, as a table per vCPU count.

use crate::report::{self, human, human_bytes, paired_ratio, verdict, Report, Summary};
use s2mmu::mmu::{FaultPath, FaultStats};
use s2mmu_vm::Backing;
use serde_json::json;
use std::time::Duration;

use super::engine::{engine, Job, RunSpec};
use super::params::{Params, ReadLockArg};
use s2mmu_bench::dirty_log::schedule::rotated;
use s2mmu_bench::dirty_log::{median_dirty, EngineRun};

/// The three policies in alternating runs per vCPU count; returns the table.
pub(super) fn both_table(job: &Job<'_>, report: &mut Report) -> Result<String, String> {
    let (p, vcpus_list, bytes, spec) = (job.p, job.vcpus, job.bytes, job.spec);
    let runs = p.runs.unwrap_or(3).max(1) as usize;
    let mut s = header(p, bytes, runs);
    // The three policies, in the order of the table's column groups.
    let policies: [Policy; 3] = [
        (
            "fast_path",
            FaultPath::ReadLockFastPath,
            ReadLockArg::Slots.reader_slots(),
        ),
        ("fast_path_rwlock", FaultPath::ReadLockFastPath, 0),
        (
            "write_lock",
            FaultPath::WriteLock,
            ReadLockArg::Slots.reader_slots(),
        ),
    ];
    let mut lines = Vec::new();
    for &v in vcpus_list {
        let got = run_policies(p, v, runs, &spec, &policies)?;
        let m = [medians(&got[0]), medians(&got[1]), medians(&got[2])];
        rows(report, v, &policies, &got, &m);
        let secs =
            |v: &[(Duration, FaultStats)]| v.iter().map(|x| x.0.as_secs_f64()).collect::<Vec<_>>();
        let (fast, rw, write) = (secs(&got[0]), secs(&got[1]), secs(&got[2]));
        let speedup = paired_ratio(&fast, &write).unwrap_or(0.0);
        let speedup_rw = paired_ratio(&rw, &write).unwrap_or(0.0);
        let ratio = m[2].1 as f64 / m[0].1.max(1) as f64;
        let ratio_text = if m[0].1 == 0 && m[2].1 > 0 {
            "none vs N".to_string()
        } else {
            format!("{ratio:.1}x")
        };
        s += &format!(
            "{:>6} | {:>12} {:>11} {:>10} | {:>12} | {:>12} {:>11} {:>10} | {:>8.2}x {:>8.2}x {:>11}\n",
            v,
            human(m[0].0.median),
            m[0].1,
            human(Duration::from_nanos(m[0].2)),
            human(m[1].0.median),
            human(m[2].0.median),
            m[2].1,
            human(Duration::from_nanos(m[2].2)),
            speedup,
            speedup_rw,
            ratio_text
        );
        if v == 8 {
            lines.push(format!(
                "target (8 vCPUs): >= 10x fewer contentions and a lower dirty memory time: {} vs {} contentions, {speedup:.2}x time, median of {runs} paired runs ({}); with KVM's shared rwlock: {speedup_rw:.2}x",
                m[0].1,
                m[2].1,
                verdict(ratio >= 10.0 && speedup > 1.0)
            ));
        }
    }
    for l in lines {
        s += &l;
        s.push('\n');
    }
    s += &format!(
        "(machine: {} logical CPUs; vCPUs beyond that share them)\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    Ok(s)
}

/// The table's title, legend, note and column heads.
fn header(p: &Params, bytes: u64, runs: usize) -> String {
    let mut s = format!(
        "dirty-log-perf: read-lock fast path against write-lock faults, {} per vCPU, {}, {} iterations; dirty memory time: median of iterations after the first, then median of {runs} runs of each policy, alternating\n",
        human_bytes(bytes),
        p.backing.name(),
        p.iterations
    );
    s += "fast = read-lock fast path, vCPUs on their own reader slots (s2mmu); rwlock = the same fast path on a shared reader count (KVM's mmu_lock); write = every fault under the write lock (the baseline)\n";
    if p.backing != Backing::Anonymous && !p.eager_split {
        s += "note: huge-page backing without -e: the measured pass splits every block on fault, so all three policies map pages under the write lock; add -e to split eagerly and measure the fast path\n";
    }
    s += &format!(
        "{:>6} | {:>12} {:>11} {:>10} | {:>12} | {:>12} {:>11} {:>10} | {:>9} {:>9} {:>11}\n",
        "vCPUs",
        "fast: dirty",
        "contentions",
        "lock wait",
        "rwlock:dirty",
        "write: dirty",
        "contentions",
        "lock wait",
        "write/fast",
        "write/rw",
        "cont. ratio"
    );
    s
}

/// One policy of the table: its JSON name, fault path and reader slots.
type Policy = (&'static str, FaultPath, usize);

/// Per policy, per run: the dirty memory time and the fault counters of
/// `runs` runs of each policy on `v` vCPUs, alternating which goes first.
fn run_policies(
    p: &Params,
    v: usize,
    runs: usize,
    spec: &impl Fn(usize, FaultPath, bool) -> RunSpec,
    policies: &[Policy; 3],
) -> Result<[Vec<(Duration, FaultStats)>; 3], String> {
    let specs = policies.map(|(_, fp, slots)| {
        let mut sp = spec(v, fp, p.eager_split);
        sp.policy.reader_slots = slots;
        sp
    });
    let got = rotated(runs, &specs, |s| engine(s, &p.memslots))?;
    let figures = |runs: &[EngineRun]| -> Vec<(Duration, FaultStats)> {
        runs.iter()
            .map(|r| (median_dirty(r), r.fault_totals()))
            .collect()
    };
    Ok([figures(&got[0]), figures(&got[1]), figures(&got[2])])
}

/// A policy's medians over its runs: the dirty memory time, the lock
/// contentions and the lock wait in nanoseconds.
type Medians = (Summary, u64, u64);

/// Medians of the dirty time, the contentions and the lock wait.
fn medians(v: &[(Duration, FaultStats)]) -> Medians {
    let d = Summary::of(&v.iter().map(|x| x.0).collect::<Vec<_>>());
    let median = |f: fn(&FaultStats) -> u64| {
        let x: Vec<u64> = v.iter().map(|r| f(&r.1)).collect();
        crate::stats::median_u64(&x).unwrap_or(0)
    };
    (
        d,
        median(FaultStats::contentions),
        median(|t| t.lock_wait_ns),
    )
}

/// The JSON rows and comparisons of one vCPU count.
fn rows(
    report: &mut Report,
    v: usize,
    policies: &[Policy; 3],
    got: &[Vec<(Duration, FaultStats)>; 3],
    m: &[Medians; 3],
) {
    for (i, (pol, _, _)) in policies.iter().enumerate() {
        let t = got[i][0].1;
        report.result(
            &format!("vcpus_{v}"),
            pol,
            report::merge(
                m[i].0.json(),
                json!({"vcpus": v, "contentions": m[i].1, "lock_wait_ns": m[i].2,
                       "faults": t.permission + t.translation, "fast_faults": t.fast, "slow_faults": t.slow}),
            ),
        );
    }
    report.compare(
        &format!("vcpus_{v}"),
        "median_ns",
        m[2].0.median.as_nanos() as f64,
        m[0].0.median.as_nanos() as f64,
    );
    report.compare(
        &format!("vcpus_{v}_rwlock"),
        "median_ns",
        m[2].0.median.as_nanos() as f64,
        m[1].0.median.as_nanos() as f64,
    );
    report.compare(
        &format!("vcpus_{v}"),
        "contentions",
        m[2].1 as f64,
        m[0].1.max(1) as f64,
    );
}
