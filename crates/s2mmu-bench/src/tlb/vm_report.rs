//! The harvest cycles on the simulated VM (`s2mmu tlb-perf`), the report: the engine's cycles
//! ([`super::vm`]) reduced to medians, and what the whole-VMID
//! flush costs the vCPUs (entries removed, TLB refills) against what it
//! saves the clearing thread.

use super::report::{
    build_kind, fill, median_f_of, median_of, open, rows_of, table, Common, ModelRows, SlotFacts,
};
use super::vm::{Sample, VmRun};
use super::{check, Config};
use super::{Mode, PAGE};
use crate::human_bytes;
use crate::report::Report;
use crate::text::human;
use crate::Bars;
use s2mmu::tlb::LargeRangePolicy;
use s2mmu_vm::KnownFormat;
use serde_json::json;
use std::time::Duration;

/// Medians of one mode and policy: the common figures and what the vCPUs paid.
struct Row {
    common: Common,
    vmid_flushes: u64,
    removed: u64,
    refill_misses: f64,
}

impl Row {
    /// The row's JSON fields beside the common ones; `walk_ns`: the cost
    /// of one TLB refill.
    fn json(&self, walk_ns: f64) -> serde_json::Value {
        json!({
            "tlb_vmid_flushes": self.vmid_flushes,
            "tlb_entries_removed": self.removed,
            "refill_misses": self.refill_misses,
            "refill_walk_ns": self.refill_misses * walk_ns,
        })
    }
}

/// Options with `--vcpus 0` resolved to the machine's CPUs.
fn resolve(p: &Config) -> Config {
    let mut resolved = *p;
    if resolved.vcpus == 0 {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        resolved.vcpus = cpus.saturating_sub(1).clamp(1, 8);
    }
    resolved
}

/// Runs the harvest cycles on the simulated VM with format `F` and
/// returns their report (its text and JSON); `vcpus` 0 is one per logical
/// CPU but one (at least 1, at most 8). `bars` draws the progress of each
/// phase.
///
/// # Errors
/// A message naming the setting (the flag of the same name) or the step
/// that failed.
pub fn run<F: KnownFormat>(p: &Config, bars: Bars<'_>) -> Result<Report, String> {
    check(p)?;
    let p = &resolve(p);
    let r = super::vm::run::<F>(p, bars)?;
    let facts = Facts {
        format: F::NAME,
        slot: r.slot,
        walk_ns: r.walk_ns,
        base_miss_rate: r.base_miss_rate,
    };
    report(p, &rows(&r), &facts)
}

/// The medians of each mode and policy.
fn rows(r: &VmRun) -> Vec<Row> {
    let row = |common: Common, s: &[Sample]| {
        let count = |f: fn(&Sample) -> u64| median_of(s, f);
        Row {
            common,
            vmid_flushes: count(|x| x.vmid_flushes),
            removed: count(|x| x.removed),
            refill_misses: median_f_of(s, |x| x.refill_misses),
        }
    };
    rows_of(&r.modes, |x| &x.times, row)
}

/// What the report says besides the rows.
struct Facts {
    /// The format's name (`KnownFormat::NAME`).
    format: &'static str,
    slot: SlotFacts,
    /// The cost of one TLB refill (a table walk).
    walk_ns: f64,
    /// Misses per second the vCPUs take with no flush at all.
    base_miss_rate: f64,
}

fn report(p: &Config, rows: &[Row], f: &Facts) -> Result<Report, String> {
    let mut report = open(
        p,
        json!({
            "vcpus": p.vcpus,
            "vcpu_mem_bytes": p.vcpu_mem,
            "format": f.format,
            "settle_us": p.settle_us,
            "idle_us": p.idle_us,
        }),
        "populate",
        &f.slot,
        json!({
            "walk_ns": f.walk_ns,
            "baseline_misses_per_s": f.base_miss_rate,
        }),
    );
    let model = ModelRows {
        rows: rows
            .iter()
            .map(|r| (&r.common, r.json(f.walk_ns)))
            .collect(),
        call_noun: "call(s)",
        judge_chunked_calls: false,
    };
    let judged = fill(&mut report, p, f.slot.npages, &model)?;
    let mut lines = Vec::new();
    for (mode, mut mode_lines) in [Mode::Whole, Mode::Chunked].into_iter().zip(judged) {
        mode_lines.extend(tradeoff_lines(p, rows, mode, f)?);
        lines.extend(mode_lines);
    }
    report.set_text(text(p, rows, f, &lines));
    Ok(report)
}

/// What the whole-VMID flush costs the vCPUs in `mode`, against what it
/// saves the clearing thread.
fn tradeoff_lines(p: &Config, rows: &[Row], mode: Mode, f: &Facts) -> Result<Vec<String>, String> {
    let find = |pol: LargeRangePolicy| {
        rows.iter()
            .find(|r| r.common.mode == mode && r.common.policy == pol)
            .ok_or_else(|| "missing result row".to_string())
    };
    let b = find(LargeRangePolicy::SplitCalls)?;
    let o = find(LargeRangePolicy::WholeVmid)?;
    let clears = match mode {
        Mode::Whole => 1,
        Mode::Chunked => f.slot.npages.div_ceil(p.chunk / PAGE),
    };
    let per_clear = |x: f64| x / clears as f64;
    let walk_ns = f.walk_ns;
    let saved = b.common.inv.median().saturating_sub(o.common.inv.median());
    let refill =
        Duration::from_nanos(((o.refill_misses - b.refill_misses).max(0.0) * walk_ns) as u64);
    Ok(vec![
        format!(
            "{:<12} trade-off per clear: whole_vmid removes {:.0} vCPU TLB entries, {:.0} refill misses (~{} of table walks); split_calls removes {:.0}, {:.0} misses",
            b.common.case,
            per_clear(o.removed as f64),
            per_clear(o.refill_misses),
            human(Duration::from_nanos(
                (per_clear(o.refill_misses) * walk_ns) as u64
            )),
            per_clear(b.removed as f64),
            per_clear(b.refill_misses),
        ),
        format!(
            "{:<12} per cycle: whole_vmid saves {} of invalidation on the clearing thread and costs the vCPUs ~{} of extra TLB refills",
            b.common.case,
            human(saved),
            human(refill),
        ),
    ])
}

/// The human-readable report.
fn text(p: &Config, rows: &[Row], f: &Facts, lines: &[String]) -> String {
    let mut s = format!(
        "tlb-perf: {} slot of {} pages ({} of stage-2 tables, mapped in {}, logging enabled in {}), range limit {} pages ({}), {} vCPUs writing {} each, 1 page in {} dirtied per cycle, {} runs ({} build)\n",
        human_bytes(p.size),
        f.slot.npages,
        human_bytes(f.slot.table_pages as u64 * PAGE),
        human(f.slot.populate_time),
        human(f.slot.enable_time),
        p.limit_pages,
        human_bytes(p.limit_pages.saturating_mul(PAGE)),
        p.vcpus,
        human_bytes(p.vcpu_mem),
        p.dirty_every,
        p.runs,
        build_kind()
    );
    let cells: Vec<(&Common, String)> = rows
        .iter()
        .map(|r| {
            let extra = format!(
                " {:>9} {:>9.0} {:>10}",
                r.removed,
                r.refill_misses,
                human(Duration::from_nanos((r.refill_misses * f.walk_ns) as u64)),
            );
            (&r.common, extra)
        })
        .collect();
    s += &table(
        &cells,
        &format!(" {:>9} {:>9} {:>10}", "removed", "misses", "refill"),
    );
    s += &format!(
        "(medians of {} cycles; calls, removed vCPU TLB entries and refill misses per cycle; refill = misses x {:.0} ns per table walk; vCPUs miss {:.0}/s with no flush)\n",
        p.runs, f.walk_ns, f.base_miss_rate
    );
    for l in lines {
        s += l;
        s.push('\n');
    }
    // A call that waits for a vCPU the host preempted in guest mode pays a
    // scheduler time slice, not the cost of reaching it: say so.
    let slowest = rows
        .iter()
        .filter(|r| r.common.calls > 0)
        .map(|r| r.common.inv.median() / u32::try_from(r.common.calls).unwrap_or(u32::MAX))
        .max()
        .unwrap_or_default();
    if slowest > Duration::from_micros(100) {
        s += &format!(
            "note: an invalidation call took {} on average in one case: vCPU threads were preempted in guest mode (more runnable threads than free cores), so calls waited for the scheduler; use fewer --vcpus or --idle 50us\n",
            human(slowest)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlb::POLICIES;
    use s2mmu::format::arm64::Arm64Stage2;

    fn config() -> Config {
        Config {
            vcpu_mem: 2 << 20,
            limit_pages: s2mmu::TlbPolicy::DEFAULT_LIMIT_PAGES,
            idle_us: 0,
            ..crate::tlb::tests::config()
        }
    }

    #[test]
    fn a_run_reports_both_modes_under_both_policies() {
        let report = run::<Arm64Stage2>(&config(), &crate::no_bars).unwrap();
        let v = report.to_json();
        assert_eq!(v["params"]["format"], Arm64Stage2::NAME);
        assert_eq!(v["params"]["size_bytes"], 1u64 << 30);
        let rows = v["results"].as_array().unwrap();
        // The setup row, then each mode under each policy.
        assert_eq!(rows.len(), 1 + 2 * POLICIES.len(), "{rows:?}");
        for pol in POLICIES {
            let name = super::super::report::policy_name(pol);
            assert_eq!(rows.iter().filter(|r| r["policy"] == name).count(), 2);
        }
        assert!(report.text().contains("whole_slot"), "{}", report.text());
    }

    #[test]
    fn a_bad_setting_is_refused_by_name() {
        let bad = Config {
            chunk: 4096,
            ..config()
        };
        let Err(e) = run::<Arm64Stage2>(&bad, &crate::no_bars) else {
            panic!("a 4 KiB chunk was taken");
        };
        assert!(e.contains("chunk"), "{e}");
    }
}
