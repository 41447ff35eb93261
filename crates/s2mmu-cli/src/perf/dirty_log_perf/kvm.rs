//! `--kvm`: the selftest flow on the host's real KVM (s2mmu-kvm), with
//! `--check` comparing each pass's dirty log with the pages written.

use crate::report::Report;
use serde_json::json;

use super::engine::Job;
use super::params::Params;
use s2mmu_bench::dirty_log::rows::phase_rows;

/// The selftest's parameters for real KVM from the flags.
pub(super) fn kvm_params(
    p: &Params,
    vcpus: usize,
    bytes: u64,
) -> Result<s2mmu_kvm::DirtyLogParams, String> {
    // One backing type (s2mmu-memory) for the simulated VM and KVM.
    let backing = p.backing;
    Ok(s2mmu_kvm::DirtyLogParams {
        vcpus: u32::try_from(vcpus).map_err(|_| "too many vCPUs".to_string())?,
        bytes_per_vcpu: bytes,
        iterations: p.iterations,
        backing,
        slots: p.slots,
        manual_protect: !p.no_manual_protect,
        write_percent: p.write_percent,
        dirty_ring_entries: p.ring(),
        ..s2mmu_kvm::DirtyLogParams::default()
    })
}

/// Runs each vCPU count on real KVM and returns the selftest's text.
pub(super) fn run(job: &Job<'_>, report: &mut Report) -> Result<String, String> {
    let (p, vcpus_list, bytes) = (job.p, job.vcpus, job.bytes);
    let mut text = String::new();
    for &v in vcpus_list {
        let kp = kvm_params(p, v, bytes)?;
        let r = if p.check {
            let c = s2mmu_kvm::check_dirty_log(&kp).map_err(|e| e.to_string())?;
            for i in &c.iterations {
                text += &format!(
                    "check iteration {}: {} pages written, {} reported, {} missing, {} extra: {}\n",
                    i.iteration,
                    i.written,
                    i.reported,
                    i.missing,
                    i.extra,
                    if i.passes() { "ok" } else { "FAILED" }
                );
                report.result(
                    &format!("check_iteration_{}", i.iteration),
                    "kvm",
                    json!({"written": i.written, "reported": i.reported,
                           "missing": i.missing, "extra": i.extra, "passes": i.passes()}),
                );
            }
            if let Some(f) = c.first_failure() {
                return Err(format!("dirty log check failed on real KVM: {f}"));
            }
            c.run
        } else {
            s2mmu_kvm::dirty_log_perf::run(&kp).map_err(|e| e.to_string())?
        };
        for l in r.selftest_lines() {
            text += &l;
            text.push('\n');
        }
        phase_rows(report, &r.phases(), "kvm");
    }
    Ok(text)
}
