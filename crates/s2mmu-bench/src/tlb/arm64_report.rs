//! The harvest cycles on the arm64 model (`s2mmu tlb-perf --arm64`), the
//! limits on the model and the report: the
//! engine's cycles and checks ([`super::arm64`]) reduced to
//! medians, the TLBI counts and the wait for EL2. QEMU's timings are an
//! emulator's: the counts are the result, the times are read as ratios.

use super::arm64::Arm64Run;
use super::report::{
    build_kind, fill, median_of, open, rows_of, table, Common, ModelRows, SlotFacts,
};
use super::{check, Config};
use super::{Mode, PAGE};
use crate::arm64 as a64;
use crate::human_bytes;
use crate::report::Report;
use crate::text::human;
use crate::Bars;
use s2mmu::tlb::LargeRangePolicy;
use s2mmu_arm64::effect::ProtectEffect;
use s2mmu_arm64::walk_cache::{AfterMove, WalkCacheReport};
use serde_json::json;
use std::time::Duration;

/// Medians of one mode and policy: the common figures and the model's TLBIs.
struct Row {
    common: Common,
    tlbis: u64,
    sequences: u64,
    tlbi_samples: Vec<u64>,
    /// Medians of the service CPU's own time and of the rest of the wait
    /// (pickup and answer), in ns.
    work_ns: u64,
    pickup_ns: u64,
}

impl Row {
    /// The row's JSON fields beside the common ones.
    fn json(&self) -> serde_json::Value {
        json!({
            "model": "arm64",
            "service_calls": self.common.calls,
            "tlbi_instructions": self.tlbis,
            "tlbi_samples": self.tlbi_samples,
            "host_sequences": self.sequences,
            "tlb_work_ns": self.work_ns,
            "tlb_pickup_ns": self.pickup_ns,
        })
    }
}

/// Checks the settings and what only the arm64 model limits, before QEMU
/// starts.
///
/// # Errors
/// A message naming the setting (the flag of the same name) and its limit.
pub fn check_arm64(p: &Config) -> Result<(), String> {
    check(p)?;
    super::arm64::check(p)
}

/// Runs the harvest cycles on the arm64 model and returns their report
/// (its text and JSON); `bars` draws the progress of each phase.
///
/// # Errors
/// Bad settings (before QEMU starts), QEMU unavailable (`--arm64: why`),
/// the model's or the engine's errors.
pub fn run(p: &Config, bars: Bars<'_>) -> Result<Report, String> {
    check_arm64(p)?;
    if let Some(why) = a64::unavailable() {
        return Err(format!("--arm64: {why}"));
    }
    let r = super::arm64::run(p, bars)?;
    let rows = rows(&r);
    let facts = Facts {
        slot: r.slot,
        boot_time: r.boot_time,
        effect: r.effect,
        operand: r.operand,
    };
    report(p, &rows, &facts)
}

/// The medians of each mode and policy.
fn rows(r: &Arm64Run) -> Vec<Row> {
    rows_of(
        &r.modes,
        |x| &x.times,
        |common, s| Row {
            common,
            tlbis: median_of(s, |x| x.tlbis),
            sequences: median_of(s, |x| x.sequences),
            tlbi_samples: s.iter().map(|x| x.tlbis).collect(),
            work_ns: median_of(s, |x| x.work.as_nanos() as u64),
            pickup_ns: median_of(s, |x| x.times.inv.saturating_sub(x.work).as_nanos() as u64),
        },
    )
}

/// What the report says besides the rows.
struct Facts {
    slot: SlotFacts,
    boot_time: Duration,
    /// The effect check of each mode and policy (every page protected,
    /// or the run failed).
    effect: Vec<(Mode, LargeRangePolicy, ProtectEffect)>,
    /// The operand check (a walk fault at the table's IPA, or the run
    /// failed).
    operand: WalkCacheReport,
}

fn report(p: &Config, rows: &[Row], f: &Facts) -> Result<Report, String> {
    let mut report = open(
        p,
        json!({ "arm64": true, "qemu_cpus": 2 }),
        "arm64",
        &f.slot,
        json!({
            "boot_ns": f.boot_time.as_nanos() as u64,
            "effect_check": f.effect.iter().map(|(m, pol, e)| json!({
                "mode": format!("{m:?}").to_lowercase(), "policy": format!("{pol:?}"),
                "pages": e.pages, "protected": e.protected, "stale": e.stale.len(),
            })).collect::<Vec<_>>(),
            "operand_check": {
                "table_ipa": f.operand.table_ipa,
                "walk_fault": matches!(f.operand.after, AfterMove::WalkFault { .. }),
                "sequences": f.operand.sequences,
                "tlbis": f.operand.tlbis,
            },
        }),
    );
    let model = ModelRows {
        rows: rows.iter().map(|r| (&r.common, r.json())).collect(),
        call_noun: "round trip(s) to EL2",
        judge_chunked_calls: true,
    };
    let judged = fill(&mut report, p, f.slot.npages, &model)?;
    let mut lines = Vec::new();
    for (mode, mut mode_lines) in [Mode::Whole, Mode::Chunked].into_iter().zip(judged) {
        // The TLBI line goes between the call count and the share.
        let tlbi = tlbi_line(rows, mode, &mut report);
        mode_lines.splice(1..1, tlbi);
        lines.extend(mode_lines);
    }
    report.set_text(text(p, rows, f, &lines));
    Ok(report)
}

/// The TLBI counts and the wait for EL2 in `mode`, and their comparison
/// (none when a policy's row is missing).
fn tlbi_line(rows: &[Row], mode: Mode, report: &mut Report) -> Option<String> {
    let find = |pol: LargeRangePolicy| {
        rows.iter()
            .find(|r| r.common.mode == mode && r.common.policy == pol)
    };
    let (b, o) = (
        find(LargeRangePolicy::SplitCalls)?,
        find(LargeRangePolicy::WholeVmid)?,
    );
    let case = b.common.case.as_str();
    report.compare(case, "tlbi_instructions", b.tlbis as f64, o.tlbis as f64);
    let per_call =
        |r: &Row| r.common.inv.median() / u32::try_from(r.common.calls.max(1)).unwrap_or(u32::MAX);
    let (bi, oi) = (b.common.inv.median(), o.common.inv.median());
    Some(format!(
        "{case:<12} TLBI instructions {} -> {}; time waiting for EL2 {} -> {} ({:.1}x less; of it the stub's own work {} -> {}, its pickup and answer {} -> {}); per round trip {} with split_calls, {} with whole_vmid",
        b.tlbis,
        o.tlbis,
        human(bi),
        human(oi),
        bi.as_secs_f64() / oi.as_secs_f64().max(1e-12),
        human(Duration::from_nanos(b.work_ns)),
        human(Duration::from_nanos(o.work_ns)),
        human(Duration::from_nanos(b.pickup_ns)),
        human(Duration::from_nanos(o.pickup_ns)),
        human(per_call(b)),
        human(per_call(o)),
    ))
}

/// The human-readable report.
fn text(p: &Config, rows: &[Row], f: &Facts, lines: &[String]) -> String {
    let mut s = format!(
        "tlb-perf --arm64: {} slot of {} 4K pages on QEMU's arm64 model (2 CPUs: one idle at EL2, one serving the host's TLB maintenance at EL2, so every TLB call is a round trip to EL2); {} of stage-2 tables in the shared RAM, QEMU up in {}, mapped in {}, logging enabled in {}; range limit {} pages ({}); {} dirtied per cycle; {} runs ({} build)\n{}\n",
        human_bytes(p.size),
        f.slot.npages,
        human_bytes(f.slot.table_pages as u64 * PAGE),
        human(f.boot_time),
        human(f.slot.populate_time),
        human(f.slot.enable_time),
        p.limit_pages,
        human_bytes(p.limit_pages.saturating_mul(PAGE)),
        if p.dirty_every <= 1 {
            "every page".to_string()
        } else {
            format!("1 page in {}", p.dirty_every)
        },
        p.runs,
        build_kind(),
        a64::EMULATOR_NOTE
    );
    let cells: Vec<(&Common, String)> = rows
        .iter()
        .map(|r| (&r.common, format!(" {:>7}", r.tlbis)))
        .collect();
    s += &table(&cells, &format!(" {:>7}", "TLBIs"));
    s += &format!(
        "(medians of {} cycles per mode and policy, alternating; calls = round trips to the EL2 service CPU per cycle, TLBIs = TLBI instructions it executed, invalidate = the clearing thread's wait for them, the service CPU's pickup from its idle wait included; the stub's own work and the pickup are split below, from its counter stamps)\n",
        p.runs
    );
    for l in lines {
        s += l;
        s.push('\n');
    }
    let checked: Vec<String> = f
        .effect
        .iter()
        .map(|(m, pol, e)| format!("{m:?}/{pol:?} {} of {}", e.protected, e.pages))
        .collect();
    s += &format!(
        "effect check (CPU 0, idle at EL2 between probes): pages written through a cached writable translation, then GET + CLEAR, then written again; second writes that took a permission fault: {}\n",
        checked.join(", ")
    );
    s += &format!(
        "operand check (CPU 0, the guest's stage 1 on): its stage-1 table page at IPA {:#x} moved ({} sequence(s), {} TLBIs), its next access took a stage-2 abort on its walk at that IPA (a TLBI naming another IPA leaves QEMU's walk cache and the access goes through)\n",
        f.operand.table_ipa, f.operand.sequences, f.operand.tlbis
    );
    s
}
