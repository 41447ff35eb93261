//! The stub's exception injection (reply action `ACT_INJECT`) on QEMU: a
//! guest at EL1 with its own vectors (`guest_el1_vectors`, which report
//! ESR_EL1, FAR_EL1, ELR_EL1, SPSR_EL1, the vector's address and DAIF by
//! HVC) takes the abort and the UNDEF that `linux::inject` computes, where
//! the Linux host used to stop the VM.

use crate::common;

use s2mmu_arm64::layout::{self, mb};
use s2mmu_arm64::linux::inject::{Injection, ESR_IL, PSTATE_DAIF};
use s2mmu_arm64::machine::{Exit, Mailbox};
use s2mmu_arm64::stage2;
use s2mmu_arm64::vm::{Arm64Vm, VmConfig};
use std::time::{Duration, Instant};

/// The HVC the guest's EL1 vectors make: x0 = 5.
const HVC_EL1_EXCEPTION: u64 = 5;

fn next_exit(mbox: &Mailbox<'_>, last: u64) -> Exit {
    let t = Instant::now();
    loop {
        if let Some(e) = mbox.poll_exit(last) {
            return e;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no exit from the guest"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Answers `e` with an injection, as `linux::vcpu` does (empty list
/// registers: this guest has no vGIC).
fn inject(mbox: &Mailbox<'_>, e: &Exit, inj: &Injection) {
    for i in 0..4 {
        mbox.write(mb::LR0 + 8 * i, 0);
    }
    mbox.write(mb::ICH_HCR, 0);
    mbox.write(mb::NEW_ELR, inj.vector);
    mbox.write(mb::INJ_PSTATE, inj.pstate);
    mbox.reply(e, layout::ACT_INJECT, [inj.esr, inj.far], &[]);
}

/// What the vectors reported: ESR_EL1, FAR_EL1, ELR_EL1, SPSR_EL1, the
/// vector's address, DAIF.
fn report(mbox: &Mailbox<'_>, e: &Exit) -> [u64; 6] {
    assert_eq!(
        (e.kind, e.x[0]),
        (layout::EXIT_HVC, HVC_EL1_EXCEPTION),
        "the guest's EL1 vector did not run (exit {e:?}): the injection was not delivered"
    );
    [
        e.x[1],
        e.x[2],
        mbox.gpr(3),
        mbox.gpr(4),
        mbox.gpr(5),
        mbox.gpr(6),
    ]
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn an_injected_abort_and_undef_reach_the_guests_el1_vectors() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 2 << 20) else {
        return;
    };
    // No memslot covers DATA: the probe's first load is a stage-2 abort.
    let vm = Arm64Vm::new(m.clone(), &VmConfig::default()).unwrap();
    let mbox = m.mailbox(0);
    let mut last = mbox.read(mb::EXIT_SEQ);
    let (vtcr, vttbr) = vm.stage2_regs();
    let entry = s2mmu_arm64::semihost_probe_entry();
    let args = [
        vtcr,
        vttbr,
        stage2::HCR_GUEST,
        entry,
        0,
        layout::DATA + 0x18,
        0,
        0,
        0,
        0,
        3,
    ];
    let run = mbox.post(layout::CMD_LINUX, &args);

    let abort = next_exit(&mbox, last);
    last = abort.seq;
    assert_eq!(abort.kind, layout::EXIT_ABORT, "{abort:?}");
    let spsr = mbox.read(mb::SPSR);
    let a = Injection::abort(abort.esr, abort.far, spsr);
    inject(&mbox, &abort, &a);
    let hvc = next_exit(&mbox, last);
    last = hvc.seq;
    let [esr, far, elr, spsr1, vector, daif] = report(&mbox, &hvc);
    assert_eq!(esr, a.esr, "ESR_EL1 {esr:#x}");
    assert_eq!(esr >> 26, 0x25, "a data abort from the current EL");
    assert_eq!(esr & 0x3f, 0x10, "a synchronous external abort");
    assert_eq!(far, layout::DATA + 0x18, "FAR_EL1 (stage 1 off: the IPA)");
    assert_eq!(elr, abort.elr, "ELR_EL1: the load's address");
    assert_eq!(spsr1, spsr, "SPSR_EL1: the guest's PSTATE at the abort");
    // x5 is the address of the vector's ADR (its sixth instruction): the
    // vector is its 128-byte block in the 2 KiB-aligned table.
    assert_eq!(vector & 0x780, 0x200, "current EL with SP_ELx, synchronous");
    assert_eq!(daif, PSTATE_DAIF, "D, A, I, F masked in the handler");

    // The vector's HVC answered with an UNDEF: the handler runs again,
    // entered from itself; ELR_EL1 is the HVC's return address.
    let spsr = mbox.read(mb::SPSR);
    let u = Injection::undef(hvc.esr, spsr);
    inject(&mbox, &hvc, &u);
    let again = next_exit(&mbox, last);
    let [esr, _, elr, spsr1, vector2, _] = report(&mbox, &again);
    assert_eq!(
        esr,
        hvc.esr & ESR_IL,
        "ESR_EL1 {esr:#x}: EC 0 (unknown), IL"
    );
    assert_eq!(elr, hvc.elr, "ELR_EL1");
    assert_eq!(spsr1, spsr, "SPSR_EL1");
    assert_eq!(vector2, vector, "the same vector");

    mbox.reply(&again, layout::ACT_STOP, [0, 0], &[]);
    let t = Instant::now();
    while !mbox.done(run) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the run did not stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(mbox.bad_insns(), 0, "the stub's error word");
}
