//! `s2mmu linux --run ipi`: SGIs a second between the Linux VM's vCPUs
//! with 1, 2 and 4 vCPUs (those up to `-v`), the engine where `--engine`
//! says, `--runs` runs each, against
//! the same EL1 guest under QEMU alone (its writes not trapped), run
//! back to back; medians. The guest and its figures are the arm64
//! crate's ([`s2mmu_arm64::linux::ipi`]).

use super::Params;
use crate::arm64::EMULATOR_NOTE;
use crate::stats::median;
use s2mmu_arm64::linux::ipi::IpiFiles;
use s2mmu_cli::report::{emit, Report};
use serde_json::json;

/// One vCPU count's medians.
struct Row {
    vcpus: usize,
    ours: Vec<f64>,
    qemu: Vec<f64>,
    kicked: Vec<f64>,
}

/// Runs `--run ipi`.
///
/// # Errors
/// A flag this run does not take (before anything else), the arm64
/// model or the image missing, a run failing.
pub fn main(p: &Params) -> Result<(), String> {
    if p.dirty.is_some() || p.vs_qemu || p.kernel.is_some() || p.initrd.is_some() {
        return Err(
            "--run ipi runs its own EL1 guest against QEMU alone: no --dirty, --vs-qemu, \
             --kernel or --initrd"
                .into(),
        );
    }
    if let Some(why) = crate::arm64::unavailable() {
        return Err(why);
    }
    let f = IpiFiles::new()?;
    let timeout = p.timeout;
    let mut rows = Vec::new();
    for vcpus in [1, 2, 4].into_iter().filter(|&n| n <= p.vcpus) {
        let mut row = Row {
            vcpus,
            ours: Vec::new(),
            qemu: Vec::new(),
            kicked: Vec::new(),
        };
        for _ in 0..p.runs {
            let r = f
                .run(vcpus, p.engine, timeout)
                .map_err(|e| format!("{vcpus} vCPUs: {e}"))?;
            row.ours.push(r.sgis_per_s);
            row.kicked.push(r.kicked_exits as f64);
            let q = f
                .qemu_alone(vcpus, timeout)
                .map_err(|e| format!("{vcpus} vCPUs, QEMU alone: {e}"))?;
            row.qemu.push(q.sgis_per_s);
        }
        rows.push(row);
    }
    report(p, &rows);
    Ok(())
}

fn report(p: &Params, rows: &[Row]) {
    let one = rows.first().and_then(|r| median(&r.ours));
    let mut rep = Report::new("linux", p.params_json());
    for r in rows {
        let (m, q, k) = (median(&r.ours), median(&r.qemu), median(&r.kicked));
        let of_one = m.zip(one).map(|(m, o)| m / o);
        if p.json {
            rep.result(
                &format!("ipi_{}_vcpus", r.vcpus),
                "s2mmu",
                json!({"vcpus": r.vcpus, "runs": p.runs, "sgis_per_s_median": m,
                    "of_1_vcpu": of_one, "qemu_alone_median": q,
                    "ratio_to_qemu_alone": m.zip(q).map(|(m, q)| m / q),
                    "sgis_per_s_runs": r.ours, "qemu_alone_runs": r.qemu,
                    "kicked_exits_median": k}),
            );
        } else {
            println!(
                "ipi: {} vCPUs, {} runs: {:.0} SGIs/s median ({:.2} of 1 vCPU's), QEMU alone \
                 {:.0}/s; {:.0} kicked exits (median)",
                r.vcpus,
                p.runs,
                m.unwrap_or(0.0),
                of_one.unwrap_or(0.0),
                q.unwrap_or(0.0),
                k.unwrap_or(0.0)
            );
        }
    }
    if p.json {
        emit(&rep, true);
    } else {
        println!("{EMULATOR_NOTE}");
    }
}
