//! PSCI SYSTEM_RESET from Debian's arm64 Linux (`/init` runs `reboot -f`
//! on every boot): without a reboot policy the VM stops after the first
//! boot with the reset as its reason; with `OnReset::Reboot { max: 2 }`
//! the guest boots three times (`/init` counts its CPUs on each, the
//! kernel's first message is there each time) and the third reset stops
//! it, with two reboots counted.

mod common;

use s2mmu_arm64::linux::dirty::HarvestConfig;
use s2mmu_arm64::linux::reboot::{self, OnReset};
use s2mmu_arm64::linux::vm::{LinuxConfig, StopReason, INIT_LINE};
use std::time::Duration;

fn reboot_config() -> Option<LinuxConfig> {
    let a = common::linux_assets()?;
    Some(LinuxConfig {
        vcpus: 2,
        mem: 256 << 20,
        kernel: a.image,
        initrd: a.initramfs,
        // Not quiet: the kernel's banner marks each boot.
        cmdline: "loglevel=4 s2mmu.run=reboot".into(),
        echo: false,
        timeout: Duration::from_secs(600),
        dirty: HarvestConfig::default(),
        ram_pages: Default::default(),
        engine: Default::default(),
    })
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn a_reset_reboots_the_guest_up_to_the_bound_then_stops() {
    let _one = common::serial();
    let Some(cfg) = reboot_config() else {
        return;
    };
    let r = reboot::run_rebooting(&cfg, OnReset::Reboot { max: 2 }).expect("the Linux VM runs");
    let c = &r.console;
    assert_eq!(r.reason, StopReason::Reset, "console:\n{c}");
    assert_eq!(r.reboots, 2, "console:\n{c}");
    assert_eq!(c.matches(INIT_LINE).count(), 3, "three boots:\n{c}");
    assert_eq!(c.matches("s2mmu-init: cpus online 2").count(), 3, "{c}");
    assert_eq!(c.matches("s2mmu-init: reboot").count(), 3, "{c}");
    assert_eq!(c.matches("Booting Linux on physical CPU").count(), 3, "{c}");
    assert_eq!(r.cpus_online, Some(2), "the last boot's count");
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn a_reset_stops_the_guest_without_a_reboot_policy() {
    let _one = common::serial();
    let Some(cfg) = reboot_config() else {
        return;
    };
    let r = reboot::run_rebooting(&cfg, OnReset::Stop).expect("the Linux VM runs");
    assert_eq!(r.reason, StopReason::Reset, "console:\n{}", r.console);
    assert_eq!(r.reboots, 0);
    assert_eq!(r.console.matches(INIT_LINE).count(), 1, "{}", r.console);
}

#[test]
fn a_reboot_bound_out_of_range_is_refused_before_any_machine_starts() {
    let cfg = LinuxConfig {
        vcpus: 1,
        mem: 256 << 20,
        kernel: "/nonexistent/Image".into(),
        initrd: "/nonexistent/initrd".into(),
        cmdline: String::new(),
        echo: false,
        timeout: Duration::from_secs(1),
        dirty: HarvestConfig::default(),
        ram_pages: Default::default(),
        engine: Default::default(),
    };
    for max in [0, reboot::MAX_REBOOTS + 1] {
        let e = reboot::run_rebooting(&cfg, OnReset::Reboot { max }).expect_err("refused");
        assert!(e.to_string().contains(&format!("{max} reboots")), "{e}");
    }
}
