//! `s2mmu linux --rate-per-mode`: the dirtier's write rate without dirty
//! logging and under each mode (wp-get, wp, ring, hw-get), the same guest and
//! arguments, back to back, `--runs` times each; the ratio of each mode's
//! median to the median without logging.

use super::Params;
use crate::stats::median;
use s2mmu_arm64::linux::run::{self, ModeRates};
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_cli::report::{emit, Report};
use serde_json::json;

/// Runs the dirtier without logging and under each mode, `p.runs` times
/// each (the library's `run::rate_per_mode`), printing each run's line.
///
/// # Errors
/// A run that fails, does not power off, loses a page, or whose dirtier
/// prints no rate.
pub(super) fn rate_per_mode(p: &Params, cfg: LinuxConfig) -> Result<(), String> {
    let rows = run::rate_per_mode(cfg, p.runs, &mut |run, name, rate, d| {
        if !p.json {
            println!(
                "run {run} {name}: {rate:.0} pages/s, {} harvests, {} lost",
                d.harvests, d.lost
            );
        }
    })?;
    report(p, &rows);
    Ok(())
}

fn report(p: &Params, rows: &[ModeRates]) {
    let base = median(&rows[0].pages_per_s);
    let ratio = |r: &ModeRates| median(&r.pages_per_s).zip(base).map(|(m, b)| m / b);
    if p.json {
        let mut rep = Report::new("linux", p.params_json());
        for r in rows {
            rep.result(
                &format!("dirtier under {}", r.name),
                "s2mmu",
                json!({"runs": r.pages_per_s.len(), "pages_per_s": r.pages_per_s,
                    "median_pages_per_s": median(&r.pages_per_s), "harvests": r.harvests,
                    "lost_pages": r.lost, "ratio_to_off": ratio(r)}),
            );
        }
        emit(&rep, true);
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
