//! The report of a memslot run: the cover letter's tables, the target
//! lines, and the JSON rows and comparisons (array against tree, real KVM
//! against tree), with [`run_report`] running it all as `s2mmu
//! memslot-perf` does.

use super::{
    check, kvm_rows, run_with, CaseResult, MemslotPerfParams, MemslotPerfReport, PAGE_SIZE,
    SCENARIO_TABLE,
};
use crate::report::Report;
use crate::text::verdict;
use crate::Bars;
use serde_json::{json, Value};

/// Table rows in the cover letter's order, with their printed names.
const TABLE_ROWS: [(&str, &str); 12] = [
    ("map", "Map"),
    ("unmap", "Unmap"),
    ("unmap_chunked", "Unmap 2M"),
    ("move_active", "Move active"),
    ("move_inactive", "Move inactive"),
    ("rw", "RW"),
    ("slot_setup", "Slot setup"),
    ("move_slot", "One move"),
    ("delete_slot", "One delete"),
    ("lookup_gfn", "Gfn lookup"),
    ("lookup_gfn_vcpu", "Gfn lookup vCPU"),
    ("lookup_gfn_snapshot", "Gfn lookup+snap"),
];

fn find<'a>(
    rows: &'a [CaseResult],
    case: &str,
    slots: u32,
    policy: &str,
) -> Option<&'a CaseResult> {
    rows.iter()
        .find(|r| r.case == case && r.slots == slots && r.policy == policy)
}

/// Seconds the way the cover letter prints them: three significant digits.
fn seconds(ns: f64) -> String {
    if !ns.is_finite() {
        return "-".into();
    }
    let s = ns / 1e9;
    let digits = if s >= 1.0 {
        2
    } else {
        (2 - s.log10().floor() as i32).max(0) as usize
    };
    format!("{s:.digits$}s")
}

/// The cover letter's "Improvement": how much less time the tree takes, or "None".
fn improvement(before: f64, after: f64) -> String {
    let pct = (before - after) / before * 100.0;
    if !pct.is_finite() || pct < 1.0 {
        "None".into()
    } else {
        format!("{pct:.0}%")
    }
}

/// One table per slot count, like the scalable-memslots cover letter: Test, Before
/// (array), After (tree), Improvement, and a KVM column when real-KVM rows exist.
pub fn tables(report: &MemslotPerfReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let kvm = report.kvm.as_deref().unwrap_or(&[]);
    let _ = writeln!(
            out,
        "memslot-perf: {} run(s) of {}s per test, medians; scenario rows are per iteration, Slot setup is the total",
        report.params.runs, report.params.run_seconds
    );
    for &nslots in &report.params.slots {
        let _ = writeln!(out);
        let _ = writeln!(out, "{nslots} slots in use:");
        let with_kvm = kvm.iter().any(|r| r.slots == nslots);
        let _ = write!(
            out,
            "{:<22} {:>12} {:>12} {:>12}",
            "Test", "Before", "After", "Improvement"
        );
        if with_kvm {
            let _ = write!(out, " {:>12}", "KVM");
        }
        let _ = writeln!(out);
        for (case, name) in TABLE_ROWS {
            let before = find(&report.results, case, nslots, "array");
            let after = find(&report.results, case, nslots, "tree");
            let Some(row) = before.or(after) else {
                continue;
            };
            let label = if row.slots_used == nslots {
                name.to_string()
            } else {
                format!("{name} ({})", row.slots_used)
            };
            let (b, a) = (
                before.map_or(f64::NAN, |r| r.median_ns),
                after.map_or(f64::NAN, |r| r.median_ns),
            );
            let _ = write!(
                out,
                "{label:<22} {:>12} {:>12} {:>12}",
                seconds(b),
                seconds(a),
                improvement(b, a)
            );
            if with_kvm {
                let _ = write!(
                    out,
                    " {:>12}",
                    seconds(find(kvm, case, nslots, "kvm").map_or(f64::NAN, |r| r.median_ns))
                );
            }
            let _ = writeln!(out);
        }
    }
    out
}

/// The targets, each a line with what was measured and PASS or MISS.
pub fn targets(report: &MemslotPerfReport) -> Vec<String> {
    let mut lines = Vec::new();
    let kvm = report.kvm.as_deref().unwrap_or(&[]);
    let median = |rows: &[CaseResult], case: &str, n: u32, policy: &str| {
        find(rows, case, n, policy).map(|r| r.median_ns)
    };
    if let Some(&big) = report.params.slots.iter().max().filter(|&&n| n >= 10_000) {
        let r = &report.results;
        if let (Some(a), Some(t)) = (
            median(r, "slot_setup", big, "array"),
            median(r, "slot_setup", big, "tree"),
        ) {
            let x = a / t;
            lines.push(format!(
                "{big} slots: setup {} tree vs {} array = {x:.1}x  [target >= 10x: {}]",
                seconds(t),
                seconds(a),
                verdict(x >= 10.0)
            ));
            if let Some(k) = find(kvm, "slot_setup", big, "kvm") {
                let x = k.median_ns / t;
                lines.push(format!(
                    "{big} slots: setup {} tree vs {} real KVM ({} slots) = {x:.1}x  [target >= 10x: {}]",
                    seconds(t),
                    seconds(k.median_ns),
                    k.slots_used,
                    verdict(x >= 10.0)
                ));
            }
        }
        if let Some(m) = median(r, "move_slot", big, "tree") {
            lines.push(format!(
                "{big} slots: one move {:.2} us  [target < 10 us: {}]",
                m / 1e3,
                verdict(m < 10_000.0)
            ));
        }
        if let Some(l) = median(r, "lookup_gfn", big, "tree") {
            lines.push(format!(
                "{big} slots: gfn lookup {l:.1} ns (random gfns, held snapshot)  [target < 50 ns: {}]",
                verdict(l < 50.0)
            ));
        }
    }
    if report.params.slots.contains(&10) {
        let mut worst: Option<(&str, f64)> = None;
        // The selftest's scenarios and the slot setup; the single-operation and lookup
        // rows are microbenchmarks, reported but not judged here.
        let judged = SCENARIO_TABLE.iter().map(|&(case, _)| case);
        for case in judged.chain(["slot_setup"]) {
            let Some(tree) = find(&report.results, case, 10, "tree") else {
                continue;
            };
            let Some(ratio) = tree
                .paired_ratio
                .or_else(|| median(&report.results, case, 10, "array").map(|a| tree.median_ns / a))
            else {
                continue;
            };
            let slower = (ratio - 1.0) * 100.0;
            if worst.is_none_or(|(_, w)| slower > w) {
                worst = Some((case, slower));
            }
        }
        if let Some((case, slower)) = worst {
            lines.push(format!(
                "10 slots: worst scenario {case}: tree {slower:+.1} % vs array (median of paired runs)  [target no scenario > 10 % slower: {}]",
                verdict(slower <= 10.0)
            ));
        }
    }
    lines
}

/// The parameters of a run as the report's `params`; `kvm` says whether
/// real KVM's column was asked for.
pub fn params_json(p: &MemslotPerfParams, kvm: bool) -> Value {
    json!({
        "slots": p.slots,
        "mem_bytes": p.mem_bytes,
        "map_bytes": p.map_bytes,
        "unmap_bytes": p.unmap_bytes,
        "run_seconds": p.run_seconds,
        "runs": p.runs,
        "single_ops": p.single_ops,
        "lookups": p.lookups,
        "page_bytes": PAGE_SIZE,
        "kvm": kvm,
    })
}

/// One row's metrics: one run is a value, not a distribution (`value_ns`); a median
/// whose runs were not kept (real KVM's repeated operations) has no minimum or maximum.
fn row_metrics(r: &CaseResult) -> Value {
    let finite = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
    let mut m = json!({
        "slots": r.slots,
        "slots_used": r.slots_used,
        "runs": r.runs,
        "samples_ns": r.samples_ns,
        "iterations": r.iterations,
        "paired_ratio_to_array": r.paired_ratio,
    });
    if r.runs == 1 {
        m["value_ns"] = finite(r.median_ns);
    } else {
        m["median_ns"] = finite(r.median_ns);
        if r.samples_ns.len() >= 2 {
            m["min_ns"] = finite(r.min_ns);
            m["max_ns"] = finite(r.max_ns);
        }
    }
    m
}

/// Results and comparisons (array against tree for every case; real KVM against tree
/// where KVM rows exist) into the JSON envelope.
pub fn fill(out: &mut Report, report: &MemslotPerfReport) {
    let kvm = report.kvm.as_deref().unwrap_or(&[]);
    for r in report.results.iter().chain(kvm) {
        out.result(
            &format!("{}@{}", r.case, r.slots),
            &r.policy,
            row_metrics(r),
        );
    }
    for &nslots in &report.params.slots {
        for (case, _) in TABLE_ROWS {
            let Some(tree) = find(&report.results, case, nslots, "tree") else {
                continue;
            };
            if let Some(array) = find(&report.results, case, nslots, "array") {
                out.compare(
                    &format!("{case}@{nslots} array vs tree"),
                    "median_ns",
                    array.median_ns,
                    tree.median_ns,
                );
            }
            if let Some(real) = find(kvm, case, nslots, "kvm") {
                out.compare(
                    &format!("{case}@{nslots} kvm vs tree"),
                    "median_ns",
                    real.median_ns,
                    tree.median_ns,
                );
            }
        }
    }
}

/// Runs every scenario at every slot count on both policies (and on real
/// KVM with `kvm`), and builds the report: the tables, the target lines,
/// and the JSON rows and comparisons. `bars` draws the progress of the
/// scenario runs.
///
/// # Errors
/// Bad parameters (as [`check`]), guest memory that cannot be mapped, or
/// wrong data seen by a guest. Real KVM being unusable is not an error:
/// its column is left out with a note in the text.
pub fn run_report(params: &MemslotPerfParams, kvm: bool, bars: Bars<'_>) -> Result<Report, String> {
    check(params)?;
    // Each scenario runs `runs` times on each policy, at each slot count.
    let steps = (params.slots.len() * SCENARIO_TABLE.len() * 2) as u64 * u64::from(params.runs);
    let bar = bars("memslot-perf", steps);
    let mut report = run_with(params, bar.as_ref())?;
    drop(bar);
    let mut notes = Vec::new();
    if kvm {
        match kvm_rows(params) {
            Ok(rows) => report.kvm = Some(rows),
            Err(e) => notes.push(format!("KVM column left out: {e}")),
        }
    }
    let mut text = tables(&report);
    let mut out = Report::new("memslot-perf", params_json(params, kvm));
    fill(&mut out, &report);
    text.push('\n');
    for line in targets(&report).into_iter().chain(notes) {
        text.push_str(&line);
        text.push('\n');
    }
    out.set_text(text);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &'static str, policy: &str, median_ns: f64) -> CaseResult {
        CaseResult {
            case,
            slots: 10,
            slots_used: 10,
            policy: policy.into(),
            median_ns,
            min_ns: median_ns,
            max_ns: median_ns,
            runs: 1,
            samples_ns: vec![median_ns],
            iterations: 0,
            paired_ratio: None,
        }
    }

    #[test]
    fn tables_rows_and_comparisons_follow_the_results() {
        let params = MemslotPerfParams {
            slots: vec![10],
            ..MemslotPerfParams::default()
        };
        let report = MemslotPerfReport {
            params: params.clone(),
            results: vec![
                row("move_slot", "array", 200.0),
                row("move_slot", "tree", 100.0),
            ],
            kvm: Some(vec![row("move_slot", "kvm", 400.0)]),
        };
        let text = tables(&report);
        let line = text.lines().find(|l| l.starts_with("One move")).unwrap();
        assert!(line.contains("50%"), "tree half the array's time: {line}");
        assert!(line.ends_with("0.000000400s"), "the KVM column: {line}");
        let mut out = Report::new("memslot-perf", params_json(&params, true));
        fill(&mut out, &report);
        let v = out.to_json();
        assert_eq!(v["results"].as_array().unwrap().len(), 3);
        let names: Vec<&str> = v["comparisons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["case"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["move_slot@10 array vs tree", "move_slot@10 kvm vs tree"]
        );
        assert_eq!(v["results"][0]["value_ns"], 200.0);
    }

    #[test]
    fn a_run_with_bad_parameters_is_refused_before_it_starts() {
        let params = MemslotPerfParams {
            runs: 0,
            ..MemslotPerfParams::default()
        };
        assert!(run_report(&params, false, &crate::no_bars).is_err());
    }
}
