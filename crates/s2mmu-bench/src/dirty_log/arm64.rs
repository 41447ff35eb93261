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

/// One run on a fresh QEMU: `vcpus` vCPUs of `bytes` each.
///
/// # Errors
/// The model's errors (QEMU, the stub, the engine) as text.
pub fn run_one(plan: &Plan, vcpus: usize, bytes: u64) -> Result<DirtyReport, String> {
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
