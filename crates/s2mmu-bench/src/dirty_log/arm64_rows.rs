//! The text lines and JSON rows of the dirty-log flow on QEMU's arm64
//! model ([`super::arm64`]): each run's selftest lines and checks, the
//! abort round trip and TLB maintenance, and the medians over runs.
//!
//! QEMU's timings are an emulator's: the figures worth reading are the
//! counts (faults, aborts, maintenance, pages) and ratios (the host's and
//! the engine's share of an abort's round trip).

use super::arm64::round_trip;
use super::engine_run::harvest_names;
use super::{secs, EngineRun};
use crate::report::{merge, Report};
use crate::stats::Summary;
use crate::text::human;
use s2mmu_arm64::workload::DirtyReport;
use serde_json::json;
use std::time::Duration;

/// Bytes per page of the model's granule (4K).
const PAGE: u64 = 4096;

/// `Abort round trip: ...` and the maintenance line.
pub fn round_trip_lines(r: &DirtyReport) -> Vec<String> {
    let (rt, host, eng, aborts) = round_trip(r);
    let pct = |x: f64| if rt > 0.0 { x / rt * 100.0 } else { 0.0 };
    let t = &r.tlbi;
    vec![
        format!(
            "Abort round trip: {:.1} us (host {:.1} us of it, engine {:.1} us), mean of {aborts} aborts (EL2 entry to ERET, as the stub counts; host {:.0} %, engine {:.0} % of it)",
            rt / 1e3,
            host / 1e3,
            eng / 1e3,
            pct(host),
            pct(eng)
        ),
        format!(
            "TLB maintenance: {} sequences in abort answers; {} from host threads in {} round trips to the EL2 service CPU ({} waiting); {} TLBI instructions",
            t.fault_sequences,
            t.host_sequences,
            t.service_calls,
            human(Duration::from_nanos(t.service_ns)),
            t.tlbis
        ),
    ]
}

/// The selftest's lines for one run, the check of each pass (with
/// `check`), the faults and the round trip; `ring`: the harvest is a dirty
/// ring's.
pub fn run_lines(r: &DirtyReport, e: &EngineRun, ring: bool, check: bool) -> Vec<String> {
    let s = secs;
    let (g, c) = harvest_names(ring);
    let mut out = vec![
        format!("Test iterations: {}", e.iterations.len()),
        format!(
            "Machine: QEMU's arm64 model, {} CPUs ({} vCPU(s) + 1 service CPU at EL2), 4K granule",
            e.vcpus + 1,
            e.vcpus
        ),
        format!("Engine: {}", e.label),
    ];
    out.extend(e.setup_lines());
    for (it, p) in e.iterations.iter().zip(&r.passes) {
        let n = p.iteration;
        out.push(format!(
            "Iteration {n} dirty memory time: {}",
            s(it.dirty_memory)
        ));
        out.push(format!("Iteration {n} {g} time: {}", s(it.get)));
        if let Some(cl) = it.clear {
            out.push(format!("Iteration {n} {c} time: {}", s(cl)));
        }
        if check {
            out.push(match p.written {
                Some(w) => format!(
                    "arm64 check: logged {}, written {w}, unwritten {}, missing {}, extra {}",
                    p.logged,
                    ((e.test_gpa.1 - e.test_gpa.0) / PAGE).saturating_sub(w),
                    p.missing,
                    p.extra
                ),
                None => format!("arm64 check: logged {}, pass not checked", p.logged),
            });
        }
    }
    out.push(format!("Disabling dirty logging time: {}", s(e.disable)));
    e.push_totals((g, c), &mut out);
    let f = &r.faults;
    out.push(format!(
        "Faults, all passes: {} ({} fast, {} slow, {} split on fault), lock contentions {}",
        f.permission + f.translation,
        f.fast,
        f.slow,
        f.splits_on_fault,
        f.contentions()
    ));
    out.extend(round_trip_lines(r));
    out
}

/// JSON rows of one vCPU count: every phase with its samples, the round
/// trip, the fault and maintenance counters of each run.
pub fn rows(report: &mut Report, v: usize, runs: &[(DirtyReport, EngineRun)], ring: bool) {
    let Some((_, first)) = runs.first() else {
        return;
    };
    for (i, (name, _)) in first.phases(ring).iter().enumerate() {
        let samples: Vec<Duration> = runs
            .iter()
            .filter_map(|(_, e)| e.phases(ring).get(i).map(|x| x.1))
            .collect();
        report.result(
            name,
            "arm64",
            merge(
                Summary::of(&samples).json(),
                json!({"vcpus": v, "samples_ns": samples.iter().map(|d| d.as_nanos() as u64).collect::<Vec<_>>()}),
            ),
        );
    }
    let rt: Vec<(f64, f64, f64, u64)> = runs.iter().map(|(r, _)| round_trip(r)).collect();
    let ns = |f: fn(&(f64, f64, f64, u64)) -> f64| {
        Summary::of(
            &rt.iter()
                .map(|x| Duration::from_nanos(f(x) as u64))
                .collect::<Vec<_>>(),
        )
    };
    report.result(
        "abort_round_trip",
        "arm64",
        merge(
            ns(|x| x.0).json(),
            json!({
                "vcpus": v,
                "samples_ns": rt.iter().map(|x| x.0 as u64).collect::<Vec<_>>(),
                "host_median_ns": ns(|x| x.1).median.as_nanos() as u64,
                "host_samples_ns": rt.iter().map(|x| x.1 as u64).collect::<Vec<_>>(),
                "engine_median_ns": ns(|x| x.2).median.as_nanos() as u64,
                "engine_samples_ns": rt.iter().map(|x| x.2 as u64).collect::<Vec<_>>(),
                "aborts": rt.iter().map(|x| x.3).collect::<Vec<_>>(),
            }),
        ),
    );
    for (k, (r, _)) in runs.iter().enumerate() {
        let (f, t) = (&r.faults, &r.tlbi);
        report.result(
            "counters",
            "arm64",
            json!({
                "vcpus": v, "run": k + 1,
                "faults": f.permission + f.translation, "fast_faults": f.fast, "slow_faults": f.slow,
                "splits_on_fault": f.splits_on_fault, "contentions": f.contentions(),
                "fault_sequences": t.fault_sequences, "host_sequences": t.host_sequences,
                "service_calls": t.service_calls, "service_ns": t.service_ns, "tlbis": t.tlbis,
                "el2_exits": r.el2_exits,
            }),
        );
    }
}

/// With several runs of one vCPU count: the medians of the dirty passes
/// and the round trip.
pub fn medians_text(v: usize, runs: &[(DirtyReport, EngineRun)], ring: bool) -> String {
    let n = runs.len();
    let Some((_, first)) = runs.first() else {
        return String::new();
    };
    let mut s = format!("\n{v} vCPU(s), medians of {n} runs (each on a fresh QEMU):\n");
    for (i, (name, _)) in first.phases(ring).iter().enumerate() {
        let d: Vec<Duration> = runs
            .iter()
            .filter_map(|(_, e)| e.phases(ring).get(i).map(|x| x.1))
            .collect();
        s += &format!("  {name:<34} {}\n", secs(Summary::of(&d).median));
    }
    let rt: Vec<Duration> = runs
        .iter()
        .map(|(r, _)| Duration::from_nanos((r.round_trip_us() * 1e3) as u64))
        .collect();
    let host: Vec<Duration> = runs
        .iter()
        .map(|(r, _)| Duration::from_nanos((r.host_us() * 1e3) as u64))
        .collect();
    let eng: Vec<Duration> = runs
        .iter()
        .map(|(r, _)| Duration::from_nanos((r.engine_us() * 1e3) as u64))
        .collect();
    s += &format!(
        "  abort round trip {} (host {}, engine {})\n",
        human(Summary::of(&rt).median),
        human(Summary::of(&host).median),
        human(Summary::of(&eng).median)
    );
    s
}
