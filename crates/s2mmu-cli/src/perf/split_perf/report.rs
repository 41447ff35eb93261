//! `split-perf`'s reporting: the JSON rows of each case and policy, the
//! comparisons against the full walk and between the two versions, the
//! floor line, and the table.

use super::params::Params;
use crate::report::{human, human_bytes, merge, verdict, Report};
use crate::stats::{paired_ratios, Samples, Summary};
use s2mmu::{PteFormat, SplitPolicy};
use s2mmu_bench::split::{cases, Backing, Case, Mode, Sample, POLICIES};
use serde_json::json;
use std::time::Duration;

/// One case measured under one policy.
pub(super) struct Row {
    pub(super) name: String,
    pub(super) policy: SplitPolicy,
    pub(super) sum: Summary,
    pub(super) last: Sample,
    /// Each run's time in seconds, in run order (runs are paired: every
    /// run measures every policy).
    pub(super) secs: Vec<f64>,
}

/// A row's median, last sample and per-run times.
pub(super) type Measured = (Summary, Sample, Vec<f64>);

/// One case's JSON rows (raw samples included) and table rows.
pub(super) fn case_rows(report: &mut Report, case: &Case, samples: &[Vec<Sample>]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (pi, policy) in POLICIES.iter().enumerate() {
        let s = &samples[pi];
        let times: Vec<Duration> = s.iter().map(|x| x.time).collect();
        let samples = Samples::of(&times);
        let sum = samples.summary();
        let last = s.last().copied().unwrap_or_default();
        report.result(
            &case.name,
            policy.name(),
            merge(
                samples.json(),
                json!({
                    "entries_visited": last.entries,
                    "tables_allocated": last.tables,
                    "blocks_split": last.blocks,
                }),
            ),
        );
        rows.push(Row {
            name: case.name.clone(),
            policy: *policy,
            sum,
            last,
            secs: samples.secs(),
        });
    }
    rows
}

/// The comparisons of every case and the floor, and the text.
pub(super) fn finish<F: PteFormat>(
    report: &mut Report,
    p: &Params,
    fmt: &F,
    rows: &[Row],
    floor: &Samples,
) {
    report.result(
        "store_floor",
        "plain_stores",
        merge(
            floor.json(),
            json!({"tables_written": p.size / fmt.granule(2), "entries_written": p.size / fmt.page_size()}),
        ),
    );
    let find = |name: &str, pol: SplitPolicy| {
        rows.iter()
            .find(|r| r.name == name && r.policy == pol)
            .map(|r| (r.sum, r.last, r.secs.clone()))
    };
    let mut lines = Vec::new();
    for case in cases(fmt) {
        let (Some(full), Some(v1), Some(v2)) = (
            find(&case.name, SplitPolicy::FullWalk),
            find(&case.name, SplitPolicy::SkipReturns),
            find(&case.name, SplitPolicy::NoLastLevelTables),
        ) else {
            continue;
        };
        lines.extend(compare_case(report, &case, full, v1, v2));
    }
    if let Some((skip2m, _, _)) = cases(fmt)
        .iter()
        .find(|c| c.backing == Backing::Level2Blocks && c.mode == Mode::Split)
        .and_then(|c| find(&c.name, SplitPolicy::SkipReturns))
    {
        let ratio = skip2m.median.as_secs_f64() / floor.median().as_secs_f64();
        report.compare(
            "blocks_split_vs_floor",
            "median_ns",
            floor.median().as_nanos() as f64,
            skip2m.median.as_nanos() as f64,
        );
        lines.push(format!(
            "floor: writing {} new tables with plain stores takes {}; the level-2-block split takes {} = {:.2}x the floor  [target <= 3x: {}]",
            p.size / fmt.granule(2),
            human(floor.median()),
            human(skip2m.median),
            ratio,
            verdict(ratio <= 3.0)
        ));
    }
    report.set_text(render(p, fmt, rows, &lines));
}

/// The comparisons of one case: v1 and v2 each against the full walk, and
/// v2 against v1 (JSON rows and the text lines).
fn compare_case(
    report: &mut Report,
    case: &Case,
    full: Measured,
    v1: Measured,
    v2: Measured,
) -> Vec<String> {
    let ns = |m: &Measured| m.0.median.as_nanos() as f64;
    let name = &case.name;
    let c1 = report.compare(name, "median_ns", ns(&full), ns(&v1));
    report.compare(
        name,
        "entries_visited",
        full.1.entries as f64,
        v1.1.entries as f64,
    );
    let c2 = report.compare(&format!("{name}_v2"), "median_ns", ns(&full), ns(&v2));
    report.compare(
        &format!("{name}_v2"),
        "entries_visited",
        full.1.entries as f64,
        v2.1.entries as f64,
    );
    let c21 = report.compare(&format!("{name}_v2_vs_v1"), "median_ns", ns(&v1), ns(&v2));
    let entries_ratio = full.1.entries as f64 / v1.1.entries.max(1) as f64;
    let (target, ok) = match case.backing {
        Backing::Pages => (
            "target >= 20x faster and >= 100x fewer entries",
            c1.speedup >= 20.0 && entries_ratio >= 100.0,
        ),
        _ => ("target >= 15 % faster", c1.improvement_pct >= 15.0),
    };
    let tail = match case.mode {
        Mode::SplitTopup => {
            "[cache top-ups timed too, as the seed measured; seed saw about -20 %]".to_string()
        }
        Mode::Clear => {
            "[CLEAR: split + write-protect per 64-page word; entries: the split walk's]".to_string()
        }
        Mode::Split => format!("[{target}: {}]", verdict(ok)),
    };
    let runs = full.0.runs.min(v1.0.runs).min(v2.0.runs);
    // v2/v1 run by run: the spread says whether a difference of medians is
    // more than run-to-run noise.
    let paired = paired_ratios(&v1.2, &v2.2);
    let spread = match (paired.first(), paired.last()) {
        (Some(lo), Some(hi)) => format!(
            "; v2/v1 per run {:+.1} % .. {:+.1} %",
            (lo - 1.0) * 100.0,
            (hi - 1.0) * 100.0
        ),
        _ => String::new(),
    };
    vec![
        format!(
            "{name:<22} v1 skip returns vs full walk: {:+.1} % time ({:.1}x faster), {entries_ratio:.0}x fewer entries  {tail}",
            -c1.improvement_pct, c1.speedup,
        ),
        format!(
            "{name:<22} v2 skip-level flag vs full walk: {:+.1} % time ({:.1}x faster); v2 vs v1: {:+.1} % time (medians of {runs} runs: full {}, v1 {}, v2 {}{spread})",
            -c2.improvement_pct,
            c2.speedup,
            -c21.improvement_pct,
            human(full.0.median),
            human(v1.0.median),
            human(v2.0.median),
        ),
    ]
}

/// Which version of the split walk a policy is, for the table.
fn version(pol: SplitPolicy) -> &'static str {
    match pol {
        SplitPolicy::FullWalk => "--",
        SplitPolicy::SkipReturns => "v1",
        SplitPolicy::NoLastLevelTables => "v2",
    }
}

fn render<F: PteFormat>(p: &Params, fmt: &F, rows: &[Row], lines: &[String]) -> String {
    let mut s = format!(
        "split-perf: {} slot, {} pages, {} runs per policy ({} build)\n",
        human_bytes(p.size),
        human_bytes(fmt.page_size()),
        p.runs,
        if cfg!(debug_assertions) {
            "DEBUG"
        } else {
            "release"
        }
    );
    s += &format!(
        "{:<22} {:<22} {:>12} {:>12} {:>12} {:>10} {:>8} {:>8}\n",
        "backing", "policy", "median", "min", "max", "entries", "tables", "blocks"
    );
    for Row {
        name,
        policy: pol,
        sum,
        last,
        ..
    } in rows
    {
        s += &format!(
            "{:<22} {:<22} {:>12} {:>12} {:>12} {:>10} {:>8} {:>8}\n",
            name,
            format!("{} {}", version(*pol), pol.name()),
            human(sum.median),
            human(sum.min),
            human(sum.max),
            last.entries,
            last.tables,
            last.blocks
        );
    }
    for l in lines {
        s += l;
        s.push('\n');
    }
    s
}
