//! The reporting both models of the harvest cycles share ([`super::vm_report`],
//! [`super::arm64_report`]): the figures every cycle
//! measures (get, clear, invalidation time, calls, pages cleared) reduced
//! to medians, their JSON rows and comparisons, the lines judged against
//! their targets, and the table. Each model adds its own columns and
//! JSON fields (the simulated VM's TLB refills, the arm64 model's TLBIs).

pub(super) use super::cycle::{CycleTimes, SlotFacts};
use super::{Config, ModeSamples};
use super::{Mode, PAGE, POLICIES};
use crate::human_bytes;
use crate::report::{merge, Comparison, Report};
use crate::stats::{self, Samples};
use crate::text::{human, verdict};
use s2mmu::tlb::LargeRangePolicy;
use serde_json::{json, Value};
use std::time::Duration;

/// Opens the report every model writes: the parameters all models share
/// with the model's own (`model_params`) merged in, and the setup row
/// (`setup_case`) with the model's own setup figures (`setup_extra`).
pub(super) fn open(
    p: &Config,
    model_params: Value,
    setup_case: &str,
    f: &SlotFacts,
    setup_extra: Value,
) -> Report {
    let params = json!({
        "size_bytes": p.size,
        "chunk_bytes": p.chunk,
        "runs": p.runs,
        "dirty_every": p.dirty_every,
        "limit_pages": p.limit_pages,
        "page_bytes": PAGE,
        "policies": POLICIES.iter().map(|x| policy_name(*x)).collect::<Vec<_>>(),
    });
    let mut report = Report::new("tlb-perf", merge(params, model_params));
    let setup = json!({
        "populate_ns": f.populate_time.as_nanos() as u64,
        "enable_logging_ns": f.enable_time.as_nanos() as u64,
        "table_pages": f.table_pages,
        "pages": f.npages,
    });
    report.result("setup", setup_case, merge(setup, setup_extra));
    report
}

/// The medians of one mode and policy over its cycles, and their raw samples.
pub(super) struct Common {
    pub case: String,
    pub mode: Mode,
    pub policy: LargeRangePolicy,
    pub clear: Samples,
    pub get: Samples,
    pub inv: Samples,
    /// Median over cycles of the invalidation's share of the clear time.
    pub share: f64,
    pub calls: u64,
    pub cleared: u64,
    calls_samples: Vec<u64>,
}

impl Common {
    /// Reduces `cycles` of one mode and policy.
    pub fn of<'c>(
        case: &str,
        mode: Mode,
        policy: LargeRangePolicy,
        cycles: impl IntoIterator<Item = &'c CycleTimes>,
    ) -> Self {
        let cycles: Vec<CycleTimes> = cycles.into_iter().copied().collect();
        let times =
            |f: fn(&CycleTimes) -> Duration| Samples::of(&cycles.iter().map(f).collect::<Vec<_>>());
        let shares: Vec<f64> = cycles
            .iter()
            .map(|c| c.inv.as_secs_f64() / c.clear.as_secs_f64().max(1e-12))
            .collect();
        let calls_samples: Vec<u64> = cycles.iter().map(|c| c.calls).collect();
        Common {
            case: case.to_string(),
            mode,
            policy,
            clear: times(|c| c.clear),
            get: times(|c| c.get),
            inv: times(|c| c.inv),
            share: stats::median(&shares).unwrap_or(0.0),
            calls: stats::median_u64(&calls_samples).unwrap_or(0),
            cleared: median_of(&cycles, |c| c.cleared),
            calls_samples,
        }
    }

    /// The row's JSON metrics, `extra` (the model's own fields) merged in.
    fn json(&self, extra: Value) -> Value {
        let clear = self.clear.json();
        merge(
            clear,
            merge(
                json!({
                    "get_median_ns": self.get.median().as_nanos() as u64,
                    "get_samples_ns": self.get.nanos(),
                    "tlb_calls": self.calls,
                    "tlb_calls_samples": self.calls_samples,
                    "tlb_time_ns": self.inv.median().as_nanos() as u64,
                    "tlb_time_samples_ns": self.inv.nanos(),
                    "tlb_share_pct": self.share * 100.0,
                    "pages": self.cleared,
                }),
                extra,
            ),
        )
    }

    /// The columns every model's table starts with (after mode and policy).
    fn cells(&self) -> String {
        format!(
            "{:<12} {:<12} {:>7} {:>8} {:>12} {:>12} {:>7.2}% {:>12}",
            self.case,
            policy_name(self.policy),
            self.calls,
            self.cleared,
            human(self.clear.median()),
            human(self.inv.median()),
            self.share * 100.0,
            human(self.get.median()),
        )
    }
}

/// One row per mode and policy of `modes`, in their order: the common
/// figures of the policy's samples (`times` picks a sample's cycle times)
/// and what `row` makes of them with the samples.
pub(super) fn rows_of<S, R>(
    modes: &[ModeSamples<S>],
    times: fn(&S) -> &CycleTimes,
    row: impl Fn(Common, &[S]) -> R,
) -> Vec<R> {
    let mut rows = Vec::new();
    for (mode, case, samples) in modes {
        for (pi, pol) in POLICIES.iter().enumerate() {
            let s = &samples[pi];
            rows.push(row(Common::of(case, *mode, *pol, s.iter().map(times)), s));
        }
    }
    rows
}

/// The median of a per-cycle count (zero when there are no cycles).
pub(super) fn median_of<S>(cycles: &[S], f: fn(&S) -> u64) -> u64 {
    stats::median_u64(&cycles.iter().map(f).collect::<Vec<_>>()).unwrap_or(0)
}

/// The median of a per-cycle figure (zero when there are no cycles).
pub(super) fn median_f_of<S>(cycles: &[S], f: fn(&S) -> f64) -> f64 {
    stats::median(&cycles.iter().map(f).collect::<Vec<_>>()).unwrap_or(0.0)
}

/// One model's rows: the common part and the model's own JSON fields.
pub(super) struct ModelRows<'a> {
    pub rows: Vec<(&'a Common, Value)>,
    /// What one call is, for the text ("call(s)", "round trip(s) to EL2").
    pub call_noun: &'static str,
    /// Whether the chunked clears' call count is judged too (each clear one
    /// call with whole_vmid, the split count with split_calls).
    pub judge_chunked_calls: bool,
}

/// The split-calls and whole-VMID rows of `mode`.
fn pair<'a>(m: &ModelRows<'a>, mode: Mode) -> Result<(&'a Common, &'a Common), String> {
    let find = |pol: LargeRangePolicy| {
        m.rows
            .iter()
            .map(|(c, _)| *c)
            .find(|c| c.mode == mode && c.policy == pol)
            .ok_or_else(|| format!("missing result row for {}", policy_name(pol)))
    };
    Ok((
        find(LargeRangePolicy::SplitCalls)?,
        find(LargeRangePolicy::WholeVmid)?,
    ))
}

/// Adds every row and the comparisons of both modes to `report`; returns
/// the judged lines of each mode, in `[Whole, Chunked]` order.
///
/// # Errors
/// A mode without both policies' rows (a bug in the caller).
pub(super) fn fill(
    report: &mut Report,
    p: &Config,
    npages: u64,
    m: &ModelRows,
) -> Result<Vec<Vec<String>>, String> {
    for (c, extra) in &m.rows {
        report.result(&c.case, policy_name(c.policy), c.json(extra.clone()));
    }
    let mut out = Vec::new();
    for mode in [Mode::Whole, Mode::Chunked] {
        let (b, o) = pair(m, mode)?;
        let (c, sh) = compare(report, b, o);
        let clears = match mode {
            Mode::Whole => 1,
            Mode::Chunked => npages.div_ceil(p.chunk / PAGE),
        };
        let want = npages.div_ceil(p.limit_pages);
        let noun = m.call_noun;
        let calls = match mode {
            Mode::Whole => format!(
                "{:<12} clearing the {} slot: {} {noun} with whole_vmid, {} with split_calls  [target 1 instead of {want}: {}]",
                b.case,
                human_bytes(p.size),
                o.calls,
                b.calls,
                verdict(o.calls == 1 && b.calls == want)
            ),
            Mode::Chunked => {
                let judged = if m.judge_chunked_calls {
                    let ok = o.calls == clears && b.calls == want * clears;
                    format!("  [target 1 instead of {want} per clear: {}]", verdict(ok))
                } else {
                    String::new()
                };
                format!(
                    "{:<12} {clears} clears of {}: {} {noun} with whole_vmid, {} with split_calls{judged}",
                    b.case,
                    human_bytes(p.chunk),
                    o.calls,
                    b.calls,
                )
            }
        };
        let share = format!(
            "{:<12} invalidation share of clear time {:.2} % -> {:.2} % ({:.1}x drop); clear {} -> {} ({:+.1} %)  [target share drop >= 5x: {}]",
            b.case,
            b.share * 100.0,
            o.share * 100.0,
            sh.speedup,
            human(b.clear.median()),
            human(o.clear.median()),
            -c.improvement_pct,
            verdict(sh.speedup >= 5.0)
        );
        out.push(vec![calls, share]);
    }
    Ok(out)
}

/// The comparisons of one mode: calls, invalidation time, clear time and
/// the invalidation's share; returns the clear time's and the share's.
fn compare(report: &mut Report, b: &Common, o: &Common) -> (Comparison, Comparison) {
    let ns = |s: &Samples| s.median().as_nanos() as f64;
    report.compare(&b.case, "tlb_calls", b.calls as f64, o.calls as f64);
    report.compare(&b.case, "tlb_time_ns", ns(&b.inv), ns(&o.inv));
    let c = report.compare(&b.case, "median_ns", ns(&b.clear), ns(&o.clear));
    let sh = report.compare(&b.case, "tlb_share_pct", b.share * 100.0, o.share * 100.0);
    (c, sh)
}

/// The table: the common columns, then the model's `extra` headers and
/// each row's extra cells (already formatted to the headers' widths).
pub(super) fn table(rows: &[(&Common, String)], extra_headers: &str) -> String {
    let mut s = format!(
        "{:<12} {:<12} {:>7} {:>8} {:>12} {:>12} {:>8} {:>12}{extra_headers}\n",
        "mode", "policy", "calls", "cleared", "clear", "invalidate", "share", "get"
    );
    for (c, extra) in rows {
        s += &c.cells();
        s += extra;
        s.push('\n');
    }
    s
}

/// A range policy's name in the report.
pub fn policy_name(p: LargeRangePolicy) -> &'static str {
    match p {
        LargeRangePolicy::SplitCalls => "split_calls",
        LargeRangePolicy::WholeVmid => "whole_vmid",
    }
}

/// Which build measured: a debug build's times mean little.
pub(super) fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        "DEBUG"
    } else {
        "release"
    }
}
