//! PSCI SYSTEM_RESET from Debian's arm64 Linux (`/init` runs `reboot -f`
//! on every boot): without a reboot policy the VM stops after the first
//! boot with the reset as its reason; with `OnReset::Reboot { max: 2 }`
//! the guest boots three times (`/init` counts its CPUs on each, the
//! kernel's first message is there each time) and the third reset stops
//! it, with two reboots counted.

mod common;

use s2mmu_arm64::linux::assets::LinuxAssets;
use s2mmu_arm64::linux::reboot::{self, OnReset};
use s2mmu_arm64::linux::vm::{LinuxConfig, StopReason, INIT_LINE};
use s2mmu_arm64::test_support;

fn reboot_config(a: &LinuxAssets) -> LinuxConfig {
    LinuxConfig {
        echo: false,
        // Not quiet: the kernel's banner marks each boot.
        ..test_support::linux_config(a, 2, "loglevel=4 s2mmu.run=reboot")
    }
}

s2mmu_arm64::linux_test! {
    fn a_reset_reboots_the_guest_up_to_the_bound_then_stops(a) {
        let cfg = reboot_config(&a);
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
}

s2mmu_arm64::linux_test! {
    fn a_reset_stops_the_guest_without_a_reboot_policy(a) {
        let cfg = reboot_config(&a);
        let r = reboot::run_rebooting(&cfg, OnReset::Stop).expect("the Linux VM runs");
        assert_eq!(r.reason, StopReason::Reset, "console:\n{}", r.console);
        assert_eq!(r.reboots, 0);
        assert_eq!(r.console.matches(INIT_LINE).count(), 1, "{}", r.console);
    }
}

#[test]
fn a_reboot_bound_out_of_range_is_refused_before_any_machine_starts() {
    let cfg = test_support::unbootable_config();
    for max in [0, reboot::MAX_REBOOTS + 1] {
        let e = reboot::run_rebooting(&cfg, OnReset::Reboot { max }).expect_err("refused");
        assert!(e.to_string().contains(&format!("{max} reboots")), "{e}");
    }
}
