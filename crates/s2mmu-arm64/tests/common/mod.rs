//! Shared helpers of the arm64 checks.
#![allow(dead_code)]

pub mod el1;

use s2mmu_arm64::linux::dirty::{HarvestConfig, HarvestReport};
use s2mmu_arm64::linux::vm::{self as linux_vm, Engine, LinuxConfig, LinuxReport};
use s2mmu_arm64::machine::{Machine, MachineConfig};
use s2mmu_arm64::vm::{Arm64Vm, VmConfig};
use s2mmu_arm64::workload::{spare_bytes, DirtyConfig};
use std::sync::{Arc, MutexGuard};

pub use s2mmu_arm64::test_support::serial;

/// A machine with `cpus` CPUs (the last serves maintenance). Each test
/// that needs one is `#[cfg_attr(not(s2mmu_arm64_runnable), ignore =
/// ...)]`: where the build found no EL2 image or no QEMU the test runner
/// reports it as ignored, with the reason (`build.rs` sets the cfg). Where
/// the build found them, a model that cannot run now (QEMU removed since)
/// fails the test with the reason. Always `Some`: the `Option` keeps the
/// callers' `let Some(m) = .. else` shape.
pub fn machine(cpus: usize, data_bytes: u64) -> Option<Arc<Machine>> {
    machine_unavailable();
    Some(Arc::new(
        Machine::start(&MachineConfig {
            cpus,
            data_bytes,
            ram_pages: Default::default(),
        })
        .expect("QEMU starts"),
    ))
}

/// The binary's turn on the model ([`serial`]) and a VM configured as
/// `cfg` on a fresh machine ([`machine`]): hold the guard while the VM
/// runs.
pub fn vm(cpus: usize, data_bytes: u64, cfg: &VmConfig) -> (MutexGuard<'static, ()>, Arm64Vm) {
    let one = serial();
    let m = machine(cpus, data_bytes).expect("a machine");
    (one, Arm64Vm::new(m, cfg).expect("the VM starts"))
}

/// [`vm`] for `run_dirty_log` of `dirty` on `vcpus` vCPUs: one CPU more
/// for maintenance, and data for every vCPU's share and the spare pages,
/// in whole 2 MiB blocks.
pub fn dirty_log_vm(
    vcpus: usize,
    dirty: &DirtyConfig,
    cfg: &VmConfig,
) -> (MutexGuard<'static, ()>, Arm64Vm) {
    let data = dirty.bytes_per_vcpu * vcpus as u64 + spare_bytes(dirty, 4096);
    vm(vcpus + 1, data.next_multiple_of(2 << 20), cfg)
}

/// Fails the test, with the reason, when the arm64 model cannot run (the
/// test is ignored by its cfg where the build found no model). Always
/// `false`.
pub fn machine_unavailable() -> bool {
    if let Err(why) = s2mmu_arm64::available() {
        panic!("the build found the arm64 model but it cannot run now: {why}");
    }
    false
}

/// The Linux guest on 2 vCPUs and 256 MiB running the dirtier with `args`
/// (its `s2mmu.args`), harvested as `dirty` says, its console echoed where
/// `S2MMU_LINUX_ECHO` is set. The 600 s limit bounds a hung guest, not a
/// speed: under stress-ng --cpu 8 on a 2-core machine the boot alone took
/// 111 s and a run passed 240 s.
pub fn dirtier(args: &str, dirty: HarvestConfig) -> LinuxConfig {
    let a = s2mmu_arm64::test_support::linux_assets();
    let cmdline = format!("quiet s2mmu.run=dirtier s2mmu.args={args}");
    LinuxConfig {
        dirty,
        ..s2mmu_arm64::test_support::linux_config(&a, 2, &cmdline)
    }
}

/// Runs [`dirtier`] with `args` and `dirty` with the engine on the host.
pub fn run_on_host(args: &str, dirty: HarvestConfig) -> LinuxReport {
    linux_vm::run(&LinuxConfig {
        engine: Engine::Host,
        ..dirtier(args, dirty)
    })
    .expect("the Linux VM runs")
}

/// Checks a run of the dirtier: its line `s2mmu-dirtier: {ok}` (its own
/// check passed), pages changed and none lost. Its harvester's report.
pub fn check_dirtier(r: &LinuxReport, ok: &str) -> HarvestReport {
    let d = r.dirty.clone().expect("the harvester ran");
    assert!(
        r.console.contains(&format!("s2mmu-dirtier: {ok}")),
        "the guest's own check; console:\n{}",
        r.console
    );
    assert!(d.changed > 0, "the guest changed no page");
    assert_eq!(d.lost, 0, "lost pages: {:x?}", d.lost_examples);
    d
}
