//! The benchmark's summaries (medians over the runs, with their counts)
//! and whether each target is met, with the numbers it was judged by.

use super::cell::{Cell, CellRuns, Measured};
use crate::stats::median;
use serde_json::{json, Value};

/// A run's line as it ends.
pub fn run_line(link: &str, cell: Cell, side: &str, i: u32, m: &Measured) -> String {
    match &m.error {
        Some(e) => format!("{link} {} {side} run {}: FAILED: {e}", cell.name(), i + 1),
        None => format!(
            "{link} {} {side} run {}: downtime {:.1} ms, total {:.0} ms, {:.1} MiB, largest \
             console gap {}, pages lost {}, guest rate {} -> {} pages/s",
            cell.name(),
            i + 1,
            m.downtime_ms,
            m.total_ms,
            m.wire_bytes as f64 / (1u64 << 20) as f64,
            opt(m.gap_ms, "ms"),
            m.pages_lost.map_or("unknown".into(), |n| n.to_string()),
            opt(m.rate_before, ""),
            opt(m.rate_during, "")
        ),
    }
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or("-".into(), |v| {
        format!("{v:.0}{}{unit}", if unit.is_empty() { "" } else { " " })
    })
}

/// The median of `f` over the runs that succeeded and have it.
fn med(runs: &[Measured], f: impl Fn(&Measured) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = runs
        .iter()
        .filter(|m| m.error.is_none())
        .filter_map(f)
        .collect();
    median(&v)
}

/// One side's medians.
pub fn side(runs: &[Measured]) -> Value {
    let ok = runs.iter().filter(|m| m.error.is_none()).count();
    let ratio = |m: &Measured| Some(m.rate_during? / m.rate_before.filter(|b| *b > 0.0)?);
    json!({
        "runs": runs.len(), "runs_ok": ok,
        "downtime_ms": med(runs, |m| Some(m.downtime_ms)),
        "downtime_resumed_ms": med(runs, |m| m.downtime_resumed_ms),
        "total_ms": med(runs, |m| Some(m.total_ms)),
        "to_running_ms": med(runs, |m| m.to_running_ms),
        "setup_ms": med(runs, |m| m.setup_ms),
        "wire_mib": med(runs, |m| Some(m.wire_bytes as f64 / (1u64 << 20) as f64)),
        "compressed_pages": med(runs, |m| m.compressed_pages.map(|p| p as f64)),
        "saved_mib": med(runs, |m| m.saved_bytes.map(|b| b as f64 / (1u64 << 20) as f64)),
        "largest_gap_ms": med(runs, |m| m.gap_ms),
        "rate_before_pages_per_s": med(runs, |m| m.rate_before),
        "rate_during_pages_per_s": med(runs, |m| m.rate_during),
        "rate_during_over_before": med(runs, ratio),
        "pages_lost_per_run": runs.iter().map(|m| m.pages_lost).collect::<Vec<_>>(),
        "errors": runs.iter().filter_map(|m| m.error.clone()).collect::<Vec<_>>(),
    })
}

/// A target's verdict: met, not met, or not judged (a side lacks runs).
fn verdict(name: &str, met: Option<bool>, detail: String) -> Value {
    json!({"target": name, "met": met, "detail": detail})
}

/// The targets of one cell against QEMU's own migration, judged on the
/// medians: downtime and total time at or below QEMU's, no page lost, the
/// guest's work rate at least 80 % of its rate under QEMU's, and (1 Gbit/s,
/// 64 MiB/s writer) every run converging.
pub fn targets(c: &CellRuns) -> Vec<Value> {
    let (o, q) = (side(&c.ours), side(&c.qemu));
    let f = |v: &Value, k: &str| v[k].as_f64();
    let le = |k: &str| match (f(&o, k), f(&q, k)) {
        (Some(a), Some(b)) => (Some(a <= b), format!("ours {a:.1} vs QEMU {b:.1}")),
        _ => (None, "a side has no successful run".into()),
    };
    let mut v = Vec::new();
    for (k, name) in [
        ("downtime_ms", "downtime"),
        ("total_ms", "total time"),
        ("to_running_ms", "start to running on the destination"),
    ] {
        let (met, d) = le(k);
        v.push(verdict(name, met, format!("{name} median, ms: {d}")));
    }
    let lost = |runs: &[Measured]| runs.iter().map(|m| m.pages_lost.unwrap_or(0)).sum::<u64>();
    let unknown = c.ours.iter().any(|m| m.pages_lost.is_none());
    v.push(verdict(
        "no loss",
        Some(lost(&c.ours) == 0 && !unknown && c.ours.iter().all(|m| m.error.is_none())),
        format!(
            "ours: {} pages lost over {} runs{}; QEMU: {} over {} runs, {} of them without \
             the guest's verdict",
            lost(&c.ours),
            c.ours.len(),
            if unknown {
                " (some runs without the guest's verdict)"
            } else {
                ""
            },
            lost(&c.qemu),
            c.qemu.len(),
            c.qemu.iter().filter(|m| m.pages_lost.is_none()).count()
        ),
    ));
    let r = "rate_during_over_before";
    v.push(match (f(&o, r), f(&q, r)) {
        (Some(a), Some(b)) if b > 0.0 => verdict(
            "guest work rate",
            Some(a >= 0.8 * b),
            format!(
                "the guest's rate during the migration over its rate before: ours {a:.2}, \
                 QEMU {b:.2} (ours at {:.0} % of QEMU's; at least 80 % needed)",
                100.0 * a / b
            ),
        ),
        _ => verdict("guest work rate", None, "a side has no rate".into()),
    });
    if c.link == "1gbit-1ms" && c.cell == Cell::Write64 {
        let ok = c.ours.iter().filter(|m| m.error.is_none()).count();
        v.push(verdict(
            "convergence",
            Some(ok == c.ours.len() && ok > 0),
            format!("ours completed {ok} of {} runs", c.ours.len()),
        ));
    }
    v
}

/// The whole report as JSON.
pub fn json(cells: &[CellRuns], settings: Value, ours: &str) -> Value {
    json!({
        "settings": settings,
        "qemu_settings": super::qemu::SETTINGS,
        "ours_settings": ours,
        "cells": cells.iter().map(|c| json!({
            "link": c.link, "latency": c.latency, "cell": c.cell.name(),
            "transport": c.transport,
            "ours": side(&c.ours), "qemu": side(&c.qemu),
            "targets": targets(c),
            "per_run": {"ours": c.ours, "qemu": c.qemu},
        })).collect::<Vec<_>>(),
        "memory_floor": "not measured by this benchmark: --wire-bench measures it",
        "total_time": "both sides from the migration's start (QEMU: its `migrate` command; \
            ours: after the warm-up, before connecting) to the source's last byte sent \
            (connecting, TLS, the handshake and the setup included on both; the \
            destination's load and start after it on neither): QEMU's own `total-time`",
        "to_running": "both sides from the same start to the guest running on the \
            destination (QEMU: its RESUME event; ours: its first guest instruction)",
    })
}

/// Our side's settings as the report states them, beside QEMU's.
pub fn ours_settings(spec: &super::Spec) -> String {
    format!(
        "--compress {} (page compression, LZ4; `auto`, the default of `s2mmu migrate`, \
         compresses while the link is the bottleneck and pages compress, and is off where the \
         destination is on this host, as in the loopback cells), --dirty {}, \
         --max-downtime 300ms",
        spec.ours_compress, spec.ours_dirty
    )
}

/// The report as text: a block per cell.
pub fn text(cells: &[CellRuns], ours: &str) -> String {
    let mut s = format!("QEMU's settings: {}\nOurs: {ours}\n", super::qemu::SETTINGS);
    for c in cells {
        let (o, q) = (side(&c.ours), side(&c.qemu));
        s += &format!(
            "\n{} over {} (latency: {}; {}), medians over {} of {} runs (ours) and {} of {} \
             (QEMU):\n",
            c.cell.name(),
            c.link,
            c.latency,
            c.transport,
            o["runs_ok"],
            o["runs"],
            q["runs_ok"],
            q["runs"]
        );
        for (label, k) in [
            ("downtime, ms", "downtime_ms"),
            ("total, ms", "total_ms"),
            ("start to running, ms", "to_running_ms"),
            ("setup before round 0, ms", "setup_ms"),
            ("stream, MiB", "wire_mib"),
            ("pages sent compressed", "compressed_pages"),
            ("saved by compression, MiB", "saved_mib"),
            ("largest console gap, ms", "largest_gap_ms"),
            ("guest pages/s before", "rate_before_pages_per_s"),
            ("guest pages/s during", "rate_during_pages_per_s"),
            ("during / before", "rate_during_over_before"),
        ] {
            let n = |v: &Value| v[k].as_f64().map_or("-".into(), |x| format!("{x:.2}"));
            s += &format!("  {label:<26} ours {:>12}   QEMU {:>12}\n", n(&o), n(&q));
        }
        s += &format!(
            "  pages lost per run         ours {}   QEMU {}\n",
            o["pages_lost_per_run"], q["pages_lost_per_run"]
        );
        for t in targets(c) {
            let met = match t["met"].as_bool() {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "not judged",
            };
            s += &format!(
                "  target {}: {met}: {}\n",
                t["target"],
                t["detail"].as_str().unwrap_or("")
            );
        }
    }
    s
}
