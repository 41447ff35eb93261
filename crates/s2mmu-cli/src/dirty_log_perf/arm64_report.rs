//! `dirty-log-perf --arm64`: the selftest flow on QEMU's arm64 model, the
//! engine as its stage-2 MMU (`s2mmu-arm64`; the run is
//! [`s2mmu_bench::dirty_log::arm64`]). Every pass can be checked against
//! the guest's own record of what it wrote (`--check`). Here: the flags
//! checked against the model's limits, the lines and the JSON rows.
//!
//! QEMU's timings are an emulator's: the lines say so, and the figures
//! worth reading are the counts (faults, aborts, maintenance, pages) and
//! ratios (the host's and the engine's share of an abort's round trip).

use super::engine::policy_for;
use super::params::{Params, PolicyArg};
use crate::report::{human, human_bytes, merge, Report, Summary};
use s2mmu::mmu::{FaultPath, Protect};
use s2mmu_arm64::workload::DirtyReport;
use s2mmu_bench::arm64 as a64;
use s2mmu_bench::dirty_log::arm64::round_trip;
pub(super) use s2mmu_bench::dirty_log::arm64::{as_engine_run, run_one, Plan};
use s2mmu_bench::dirty_log::{capitalise, secs, EngineRun};
use s2mmu_vm::Backing;
use serde_json::json;
use std::time::Duration;

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

/// `Abort round trip: ...` and the maintenance line.
pub(super) fn round_trip_lines(r: &DirtyReport) -> Vec<String> {
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

/// The selftest's lines for one run, the check of each pass, the faults
/// and the round trip.
fn lines(r: &DirtyReport, e: &EngineRun, ring: bool, check: bool) -> Vec<String> {
    let s = secs;
    let (g, c) = if ring {
        ("harvest dirty ring", "reset dirty ring")
    } else {
        ("get dirty log", "clear dirty log")
    };
    let mut out = vec![
        format!("Test iterations: {}", e.iterations.len()),
        format!(
            "Machine: QEMU's arm64 model, {} CPUs ({} vCPU(s) + 1 service CPU at EL2), 4K granule",
            e.vcpus + 1,
            e.vcpus
        ),
        format!("Engine: {}", e.label),
        format!(
            "guest physical test memory: [{:#x}, {:#x})",
            e.test_gpa.0, e.test_gpa.1
        ),
        format!("Populate memory time: {}", s(e.populate)),
        format!("Enabling dirty logging time: {}", s(e.enable)),
        String::new(),
    ];
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
    let n = e.iterations.len().max(1) as u32;
    let gt: Duration = e.iterations.iter().map(|i| i.get).sum();
    out.push(format!(
        "{} over {} iterations took {}. (Avg {}/iteration)",
        capitalise(g),
        e.iterations.len(),
        s(gt),
        s(gt / n)
    ));
    if e.iterations.iter().any(|i| i.clear.is_some()) {
        let ct: Duration = e.iterations.iter().filter_map(|i| i.clear).sum();
        out.push(format!(
            "{} over {} iterations took {}. (Avg {}/iteration)",
            capitalise(c),
            e.iterations.len(),
            s(ct),
            s(ct / n)
        ));
    }
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

/// Runs `dirty-log-perf --arm64`: every vCPU count, `-r` runs each.
/// A pass with missing or extra pages marks the report failed.
///
/// # Errors
/// A bad option (before QEMU starts), or a run that failed.
pub(super) fn run(
    p: &Params,
    vcpus_list: &[usize],
    bytes: u64,
    report: &mut Report,
) -> Result<String, String> {
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
            for l in lines(&r, &e, ring, p.check) {
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

/// JSON rows of one vCPU count: every phase with its samples, the round
/// trip, the fault and maintenance counters of each run.
pub(super) fn rows(report: &mut Report, v: usize, runs: &[(DirtyReport, EngineRun)], ring: bool) {
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

/// With `-r` > 1: the medians of the dirty passes and the round trip.
fn medians_text(v: usize, runs: &[(DirtyReport, EngineRun)], ring: bool) -> String {
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
