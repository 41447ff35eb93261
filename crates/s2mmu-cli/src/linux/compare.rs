//! `s2mmu linux --engine-compare`: the two placements of the engine back
//! to back in one invocation, `--runs` times, with QEMU booting the same
//! kernel alone as the outside reference (the runs are
//! [`s2mmu_arm64::linux::compare`]'s); medians over the runs and the
//! ratios between the placements.

use super::Params;
use s2mmu_arm64::linux::compare::{self, CompareSpec, EngineComparison, DIRTIER_ARGS};
use s2mmu_arm64::linux::vm::LinuxConfig;
use s2mmu_cli::report::Report;
use serde_json::json;

/// Runs the comparison and prints each run's figures, then the medians
/// and ratios (one JSON envelope with `--json`).
///
/// # Errors
/// A run that fails, does not power off, or loses a page; the baseline's
/// failure.
pub(super) fn engine_compare(
    p: &Params,
    cfg: LinuxConfig,
    a: &s2mmu_arm64::linux::assets::LinuxAssets,
) -> Result<(), String> {
    let spec = CompareSpec {
        runs: p.runs,
        cmdline: p.cmdline.clone(),
        dirtier_args: if p.args.is_empty() {
            DIRTIER_ARGS.into()
        } else {
            p.args.clone()
        },
        harvest: p.harvest(),
    };
    let mut qemu_alone = || p.spec().baseline(a).map(|b| b.init_s);
    let mut progress = |line: &str| {
        if !p.json && !p.quiet {
            println!("{line}");
        }
    };
    let c = compare::engine_compare(&spec, &cfg, &mut qemu_alone, &mut progress)?;
    report(p, &spec, &c);
    Ok(())
}

fn report(p: &Params, spec: &CompareSpec, c: &EngineComparison) {
    let (medians, ratios) = (c.medians(), c.ratios());
    if p.json {
        let mut rep = Report::new("linux", p.params_json());
        rep.result(
            "engine_compare",
            "medians",
            json!({"runs": p.runs, "dirtier_args": spec.dirtier_args, "medians": medians,
                "ratios": ratios, "samples": c.samples, "per_pass_faults": c.per_pass,
                "per_pass_equal": c.per_pass_equal(), "note": crate::arm64::EMULATOR_NOTE}),
        );
        s2mmu_cli::report::emit(&rep, true);
        return;
    }
    println!("medians over {} runs:", p.runs);
    for (k, v) in &medians {
        println!("  {k:<40} {v:.3}");
    }
    println!("ratios of the medians:");
    for (k, v) in &ratios {
        println!(
            "  {k:<40} {}",
            v.map_or("n/a".into(), |x| format!("{x:.3}"))
        );
    }
    println!(
        "fixed-work faults per pass equal in both placements: {:?}",
        c.per_pass_equal()
    );
    println!("{}", crate::arm64::EMULATOR_NOTE);
}
