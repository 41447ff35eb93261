//! `s2mmu linux --rate-per-mode`: the dirtier's write rate without dirty
//! logging and under each mode (wp, manual, ring, hw), the same guest and
//! arguments, back to back, `--runs` times each; the ratio of each mode's
//! median to the median without logging.

use super::{dirtier_rate, verdict, Params};
use crate::stats::median;
use s2mmu_arm64::linux::dirty::LinuxDirty;
use s2mmu_arm64::linux::vm::{self, LinuxConfig};
use serde_json::json;

const MODES: [(LinuxDirty, &str); 5] = [
    (LinuxDirty::Off, "off"),
    (LinuxDirty::Wp, "wp"),
    (LinuxDirty::Manual, "manual"),
    (LinuxDirty::Ring, "ring"),
    (LinuxDirty::Hw, "hw"),
];

/// One mode's runs.
struct ModeRates {
    name: &'static str,
    pages_per_s: Vec<f64>,
    harvests: Vec<u64>,
    lost: u64,
}

/// Runs the dirtier without logging and under each mode, `p.runs` times
/// each (the modes interleaved, so that the load drifts over all alike).
///
/// # Errors
/// A run that fails, does not power off, loses a page, or whose dirtier
/// prints no rate.
pub(super) fn rate_per_mode(p: &Params, mut cfg: LinuxConfig) -> Result<(), String> {
    let mut rows: Vec<ModeRates> = MODES
        .iter()
        .map(|&(_, name)| ModeRates {
            name,
            pages_per_s: Vec::new(),
            harvests: Vec::new(),
            lost: 0,
        })
        .collect();
    for run in 1..=p.runs {
        for (row, &(mode, name)) in rows.iter_mut().zip(MODES.iter()) {
            cfg.dirty.mode = mode;
            let r = vm::run(&cfg).map_err(|e| format!("{name}: {e}"))?;
            let mp = Params {
                dirty: mode,
                ..p.clone()
            };
            verdict(&mp, &r).map_err(|e| format!("{name}: {e}"))?;
            let rate = dirtier_rate(&r.console)
                .ok_or_else(|| format!("{name}: the dirtier printed no ok line with its rate"))?;
            let d = r.dirty.unwrap_or_default();
            if !p.json {
                println!(
                    "run {run} {name}: {rate:.0} pages/s, {} harvests, {} lost",
                    d.harvests, d.lost
                );
            }
            row.pages_per_s.push(rate);
            row.harvests.push(d.harvests);
            row.lost += d.lost;
        }
    }
    report(p, &rows);
    Ok(())
}

fn report(p: &Params, rows: &[ModeRates]) {
    let base = median(&rows[0].pages_per_s);
    let ratio = |r: &ModeRates| median(&r.pages_per_s).zip(base).map(|(m, b)| m / b);
    if p.json {
        let modes: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({"mode": r.name, "runs": r.pages_per_s.len(),
                    "pages_per_s": r.pages_per_s, "median_pages_per_s": median(&r.pages_per_s),
                    "harvests": r.harvests, "lost_pages": r.lost,
                    "ratio_to_off": ratio(r)})
            })
            .collect();
        println!(
            "{}",
            json!({"rate_per_mode": {"vcpus": p.vcpus, "mem_bytes": p.mem, "args": p.args,
                "harvest_ms": p.harvest_ms, "modes": modes}})
        );
        return;
    }
    println!(
        "the dirtier's write rate ({} runs each, median; ratio to no logging):",
        p.runs
    );
    for r in rows {
        println!(
            "  {:<6} {:>10} pages/s  {:>6}  (runs {:.0?})",
            r.name,
            median(&r.pages_per_s).map_or("n/a".into(), |m| format!("{m:.0}")),
            ratio(r).map_or("n/a".into(), |x| format!("{x:.2}x")),
            r.pages_per_s
        );
    }
}
