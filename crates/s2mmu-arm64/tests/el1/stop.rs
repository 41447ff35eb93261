//! `--timeout` and every stop end the host whatever the guest does: small
//! EL1 guests (`asm/el1_tests.S`) that sleep in WFI with interrupts
//! masked, spin, loop on exits, never boot, or turn their CPUs off. Each
//! run fails if the host outlives its limit by more than
//! [`common::el1::GRACE`].

use crate::common;

use common::el1::{self, Scenario};
use s2mmu_arm64::linux::vm::StopReason;
use std::time::Duration;

/// The limit of the runs that only a timeout ends.
const LIMIT: Duration = Duration::from_secs(3);
/// The limit of the runs that end on their own: far above what they
/// need, so that reaching it is a failure of its own.
const LONG: Duration = Duration::from_secs(60);

fn timed_out(s: Scenario, vcpus: usize) -> s2mmu_arm64::linux::vm::LinuxReport {
    let _one = common::serial();
    let r = el1::run(s, vcpus, LIMIT);
    assert_eq!(r.reason, StopReason::Timeout, "console:\n{}", r.console);
    assert!(
        r.console.contains("el1: hello"),
        "the guest did not run: console:\n{}",
        r.console
    );
    r
}

fn ended(s: Scenario, vcpus: usize, why: StopReason) {
    let _one = common::serial();
    let r = el1::run(s, vcpus, LONG);
    assert_eq!(r.reason, why, "console:\n{}\nlog: {:?}", r.console, r.log);
    assert!(!r.console.contains("el1: FAIL"), "console:\n{}", r.console);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn a_vcpu_asleep_in_wfi_with_interrupts_masked_ends_at_the_timeout() {
    timed_out(Scenario::WfiMasked, 1);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn every_vcpu_asleep_in_wfi_ends_at_the_timeout() {
    timed_out(Scenario::WfiAll, 4);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn a_vcpu_spinning_without_exits_ends_at_the_timeout() {
    timed_out(Scenario::Spin, 2);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn a_guest_looping_on_exits_ends_at_the_timeout() {
    let r = timed_out(Scenario::ExitLoop, 1);
    assert!(r.exits[2] > 0, "no HVC exits: {:?}", r.exits);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn a_guest_that_never_boots_ends_at_the_timeout() {
    let _one = common::serial();
    let r = el1::run(Scenario::NeverBoots, 1, LIMIT);
    assert_eq!(r.reason, StopReason::Timeout, "console:\n{}", r.console);
    assert!(!r.console.contains("el1: hello"), "console:\n{}", r.console);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn cpu_off_on_the_only_cpu_ends_the_run_as_cpus_off() {
    ended(Scenario::CpuOff, 1, StopReason::CpusOff);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn cpu_off_on_the_last_of_two_cpus_ends_the_run_as_cpus_off() {
    ended(Scenario::CpuOffAll, 2, StopReason::CpusOff);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn system_off_ends_the_run_as_a_power_off() {
    ended(Scenario::SystemOff, 2, StopReason::PowerOff);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn system_reset_ends_the_run_as_a_reset() {
    ended(Scenario::SystemReset, 2, StopReason::Reset);
}
