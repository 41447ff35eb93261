//! Debian's arm64 Linux boots under the EL2 stub with every byte of its
//! RAM mapped by the engine's fault path: `/init` counts every vCPU
//! online, and the guest powers off through PSCI SYSTEM_OFF. The engine
//! on the host, each fault an exit (`tests/linux_el2.rs` boots it at
//! EL2, the default).

use crate::common;

use s2mmu_arm64::linux::dirty::HarvestConfig;
use s2mmu_arm64::linux::vm::{self, Engine, LinuxConfig, StopReason};
use std::time::Duration;

fn boot(vcpus: usize) {
    let _one = common::serial();
    let Some(a) = common::linux_assets() else {
        return;
    };
    let r = vm::run(&LinuxConfig {
        vcpus,
        mem: 256 << 20,
        kernel: a.image,
        initrd: a.initramfs,
        cmdline: std::env::var("S2MMU_LINUX_CMDLINE").unwrap_or_else(|_| "quiet".into()),
        echo: std::env::var_os("S2MMU_LINUX_ECHO").is_some(),
        timeout: Duration::from_secs(600),
        dirty: HarvestConfig::default(),
        ram_pages: Default::default(),
        engine: Engine::Host,
    })
    .expect("the Linux VM runs");
    eprintln!(
        "init after {:?} s, stopped after {:.1} s ({:?}); exits {:?}; log {:?}",
        r.init_s, r.total_s, r.reason, r.exits, r.log
    );
    assert_eq!(
        r.cpus_online,
        Some(vcpus as u32),
        "init's CPU count; console:\n{}",
        r.console
    );
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    assert!(r.exits[0] > 0, "RAM came through stage-2 faults");
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn linux_boots_to_init_on_one_vcpu_and_powers_off() {
    boot(1);
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn linux_boots_to_init_on_two_vcpus_and_powers_off() {
    boot(2);
}
