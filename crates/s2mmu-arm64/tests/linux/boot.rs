//! Debian's arm64 Linux boots under the EL2 stub with every byte of its
//! RAM mapped by the engine's fault path: `/init` counts every vCPU
//! online, and the guest powers off through PSCI SYSTEM_OFF. The engine
//! on the host, each fault an exit (`tests/linux_el2.rs` boots it at
//! EL2, the default).

use s2mmu_arm64::linux::vm::{self, Engine, LinuxConfig, StopReason};

fn boot(vcpus: usize) {
    let a = s2mmu_arm64::test_support::linux_assets();
    let cmdline = std::env::var("S2MMU_LINUX_CMDLINE").unwrap_or_else(|_| "quiet".into());
    let r = vm::run(&LinuxConfig {
        engine: Engine::Host,
        ..s2mmu_arm64::test_support::linux_config(&a, vcpus, &cmdline)
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

s2mmu_arm64::linux_test! {
    fn linux_boots_to_init_on_one_vcpu_and_powers_off() { boot(1) }
    fn linux_boots_to_init_on_two_vcpus_and_powers_off() { boot(2) }
}
