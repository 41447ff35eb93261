//! What a guest's exits get from the Linux VM's host, seen from small EL1
//! guests (`asm/el1_tests.S`): PSCI's answers to every argument bit, an
//! access with no syndrome refused whole with an external abort, SGIs
//! that reach only their targets.

use crate::common;

use common::el1::{self, hex, Scenario};
use s2mmu_arm64::linux::vm::StopReason;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// PSCI's codes as x0 holds them.
const INVALID: u64 = -2i64 as u64;
const NOT_SUPPORTED: u64 = -1i64 as u64;
const ALREADY_ON: u64 = -4i64 as u64;

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn psci_answers_every_argument_bit_as_the_specification_says() {
    let _one = common::serial();
    let r = el1::run(Scenario::PsciArgs, 1, LONG);
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    let got: Vec<(u64, u64)> = el1::lines(&r, "psci")
        .iter()
        .map(|w| (hex(w[0]), hex(w[1])))
        .collect();
    let want = [
        INVALID,       // CPU_ON, Aff bits 31:24
        INVALID,       // CPU_ON, bit 31
        INVALID,       // CPU_ON, bit 40
        ALREADY_ON,    // CPU_ON, itself
        ALREADY_ON,    // CPU_ON 32-bit, upper half ignored: itself
        INVALID,       // AFFINITY_INFO, Aff bits 31:24
        INVALID,       // AFFINITY_INFO, level 1
        0,             // AFFINITY_INFO, itself: ON
        NOT_SUPPORTED, // PSCI_FEATURES, upper half set
        0,             // PSCI_FEATURES(CPU_OFF)
        0x1_0001,      // x0's upper half set: ignored, PSCI_VERSION 1.1
    ];
    let want: Vec<(u64, u64)> = want
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u64, v))
        .collect();
    assert_eq!(got, want, "console:\n{}", r.console);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn accesses_without_a_syndrome_are_refused_whole_with_an_external_abort() {
    let _one = common::serial();
    let r = el1::run(Scenario::NoSyndrome, 1, LONG);
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    // Each form: its name, the exception the vector saw, then x0 and x3.
    let forms = [
        "strpost", "ldrpre", "stp", "ldp", "ldxr", "dczva", "ld1", "st1post",
    ];
    let text: Vec<&str> = r
        .console
        .lines()
        .filter_map(|l| l.strip_prefix("el1: "))
        .filter(|l| !l.starts_with("hello"))
        .collect();
    assert_eq!(text.len(), forms.len() * 3, "console:\n{}", r.console);
    for (i, name) in forms.iter().enumerate() {
        let [form, sync, after] = [0, 1, 2].map(|k| text[i * 3 + k]);
        assert_eq!(form, format!("form {name}"), "console:\n{}", r.console);
        let s: Vec<&str> = sync.split_whitespace().collect();
        assert_eq!(
            s[0], "sync",
            "{name}: no exception: console:\n{}",
            r.console
        );
        let (esr, far) = (hex(s[1]), hex(s[2]));
        // A data abort taken from EL1 (EC 0x25), 32-bit instruction, a
        // synchronous external abort (DFSC 0x10).
        assert_eq!(esr >> 26, 0x25, "{name}: ESR_EL1 {esr:#x}");
        assert_eq!(esr & 0x3f, 0x10, "{name}: ESR_EL1 {esr:#x}");
        let addr = if *name == "ldrpre" {
            0x0a00_0004
        } else {
            0x0a00_0000
        };
        assert_eq!(far, addr, "{name}: FAR_EL1");
        // Not half done: the base register is not written back, the
        // loaded register keeps its value.
        let a: Vec<&str> = after.split_whitespace().collect();
        assert_eq!(a[0], "after");
        assert_eq!(hex(a[1]), 0x0a00_0000, "{name}: x0 written back");
        assert_eq!(hex(a[2]), 0x5a, "{name}: x3 written");
    }
    assert_eq!(r.injected, forms.len() as u64, "log: {:?}", r.log);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and binutils-aarch64-linux-gnu"
)]
fn sgis_reach_their_targets_only_and_wait_for_a_vcpu_that_is_off() {
    let _one = common::serial();
    let r = el1::run(Scenario::SgiTargets, 4, LONG);
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    let l = el1::lines(&r, "sgis");
    assert_eq!(l.len(), 1, "console:\n{}", r.console);
    let (to1, to3) = (hex(l[0][0]), hex(l[0][1]));
    assert!((1..=1000).contains(&to1), "vCPU 1 took {to1} of 1000 SGIs");
    assert_eq!(to3, 1, "vCPU 3 took {to3} SGIs queued while it was off");
    // vCPU 2 spins with its interrupts masked and is no target: it never
    // left its guest (until the stop, whose exit is not counted).
    assert_eq!(
        r.vcpu_exits[2], [0; 5],
        "vCPU 2's exits: {:?}",
        r.vcpu_exits
    );
    // The sender's SGI writes were trapped, each one.
    assert_eq!(
        r.vcpu_exits[0][3], 1001,
        "vCPU 0's exits: {:?}",
        r.vcpu_exits
    );
}
