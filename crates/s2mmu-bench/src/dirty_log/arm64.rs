//! `dirty-log-perf --arm64`'s engine: the selftest flow on QEMU's arm64
//! model, the engine as its stage-2 MMU (`s2mmu-arm64`), one run on a fresh
//! QEMU per call, and its figures as the simulated VM's run names them.
//! The command checks the flags against the model's limits ([`Plan`]) and
//! reports.

use super::{label, EngineIteration, EngineRun};
use crate::arm64 as a64;
use s2mmu::mmu::MmuPolicy;
use s2mmu_arm64::vm::{Arm64Vm, VmConfig};
use s2mmu_arm64::workload::{run_dirty_log, DirtyConfig, DirtyReport, Pattern, DATA_GPA};

/// Bytes per page of the model's granule (4K).
const PAGE: u64 = 4096;

/// What an arm64 run needs, every option checked before QEMU starts.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Host page behind the slot (the largest block a fault maps).
    pub host_page: u64,
    /// The engine's policy.
    pub policy: MmuPolicy,
    /// Random writes (-a) instead of every page in order.
    pub random: bool,
    /// Runs per vCPU count.
    pub runs: u32,
    /// Logged passes per run.
    pub iterations: u32,
    /// Every pass checked against the guest's record of its writes.
    pub check: bool,
}

/// The run's shape against the model's limits, before QEMU starts:
/// 1 to [`a64::MAX_VCPUS`] vCPUs, each a non-zero multiple of the host
/// page, all together at most [`a64::MAX_BYTES`].
fn check_shape(plan: &Plan, vcpus: usize, bytes: u64) -> Result<(), String> {
    if vcpus == 0 || vcpus > a64::MAX_VCPUS {
        return Err(format!(
            "-v {vcpus}: the arm64 model runs 1..={} vCPUs",
            a64::MAX_VCPUS
        ));
    }
    if plan.host_page == 0 || bytes == 0 || !bytes.is_multiple_of(plan.host_page) {
        return Err(format!(
            "-b {bytes}: must be a non-zero multiple of the host page ({} bytes)",
            plan.host_page
        ));
    }
    match bytes.checked_mul(vcpus as u64) {
        Some(total) if total <= a64::MAX_BYTES => Ok(()),
        _ => Err(format!(
            "-v {vcpus} x -b {bytes}: the arm64 model holds at most {} bytes of guest data",
            a64::MAX_BYTES
        )),
    }
}

/// One run on a fresh QEMU: `vcpus` vCPUs of `bytes` each.
///
/// # Errors
/// The model's errors (QEMU, the stub, the engine) as text.
pub fn run_one(plan: &Plan, vcpus: usize, bytes: u64) -> Result<DirtyReport, String> {
    check_shape(plan, vcpus, bytes)?;
    let machine = a64::start(vcpus + 1, bytes * vcpus as u64)?;
    let vm = Arm64Vm::new(
        machine,
        &VmConfig {
            policy: plan.policy,
            table_bytes: a64::TABLE_BYTES,
            ..VmConfig::default()
        },
    )
    .map_err(|e| e.to_string())?;
    let cfg = DirtyConfig {
        vcpus,
        bytes_per_vcpu: bytes,
        iterations: plan.iterations,
        pattern: if plan.random {
            Pattern::Random {
                writes: bytes / PAGE,
            }
        } else {
            Pattern::Sequential
        },
        host_page: plan.host_page,
        check: plan.check,
        verify_tags: plan.check,
        ..DirtyConfig::default()
    };
    run_dirty_log(&vm, &cfg).map_err(|e| format!("arm64 model: {e}"))
}

/// The run as the engine's phases name them (for `--compare` and JSON).
pub fn as_engine_run(r: &DirtyReport, plan: &Plan, vcpus: usize, bytes: u64) -> EngineRun {
    let clear = plan.policy.dirty.manual_protect() || plan.policy.dirty.ring_entries().is_some();
    EngineRun {
        label: label(&plan.policy, "tree"),
        vcpus,
        populate: r.populate_time,
        enable: r.enable_time,
        iterations: r
            .passes
            .iter()
            .map(|x| EngineIteration {
                dirty_memory: x.dirty_time,
                get: x.get_time,
                clear: clear.then_some(x.clear_time),
                pages_dirty: x.logged,
                ..EngineIteration::default()
            })
            .collect(),
        disable: r.disable_time,
        after: None,
        test_gpa: (DATA_GPA, DATA_GPA + bytes * vcpus as u64),
        vm_stats: Default::default(),
        off_pass: None,
    }
}

/// The mean abort round trip and its parts, in ns, and the aborts.
pub fn round_trip(r: &DirtyReport) -> (f64, f64, f64, u64) {
    let aborts = r.runs.iter().map(|x| x.aborts).sum();
    (
        r.round_trip_us() * 1e3,
        r.host_us() * 1e3,
        r.engine_us() * 1e3,
        aborts,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_refuses_a_shape_the_model_cannot_hold_before_qemu_starts() {
        let plan = Plan {
            host_page: PAGE,
            policy: MmuPolicy::default(),
            random: false,
            runs: 1,
            iterations: 1,
            check: false,
        };
        let refused = |vcpus: usize, bytes: u64, says: &str| {
            let e = run_one(&plan, vcpus, bytes).expect_err("refused");
            assert!(e.contains(says), "{e:?} should name {says}");
        };
        refused(0, 1 << 20, "-v 0");
        refused(a64::MAX_VCPUS + 1, 1 << 20, "-v");
        refused(1, 100, "-b 100");
        refused(2, u64::MAX - 4095, "holds at most");
        assert!(check_shape(&plan, 1, 1 << 20).is_ok());
    }
}
