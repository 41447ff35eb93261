//! How a guest's exit and the host's answer find each other without
//! polling: the stub rings the doorbell of a host thread that sleeps
//! (`Mailbox::sleep_until_exit`), and while it waits for an answer that
//! comes late it backs off its timer waits instead of waking QEMU's main
//! loop every 20 µs.

use crate::common;

use s2mmu_arm64::layout::{self, mb, EXIT_BACKOFF_SHIFT, EXIT_SHORT_WAITS, HVC_PROBE};
use s2mmu_arm64::machine::Machine;
use s2mmu_arm64::stage2::HCR_GUEST;
use s2mmu_arm64::vm::{Arm64Vm, HvcAnswer, VmConfig};
use std::time::{Duration, Instant};

/// Waits until command `run` is done (60 s: a hang).
fn wait_done(mbox: &s2mmu_arm64::machine::Mailbox<'_>, run: u64) {
    let t = Instant::now();
    while !mbox.done(run) {
        assert!(t.elapsed() < Duration::from_secs(60), "command {run} hung");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs the probe guest once through the engine (its code page gets
/// mapped) and returns the VM.
fn vm_with_probe_mapped(m: &std::sync::Arc<Machine>) -> Arm64Vm {
    let vm = Arm64Vm::new(m.clone(), &VmConfig::default()).unwrap();
    let mut vcpu = vm.mmu().new_vcpu().unwrap();
    let entry = s2mmu_arm64::probe_entry();
    let st = vm
        .run(0, &mut vcpu, entry, [0, entry, 0, 0, 0, 0, 0, 0], |e| {
            assert_eq!(e.x[0], HVC_PROBE);
            HvcAnswer::Stop
        })
        .unwrap();
    assert_eq!(st.hvcs, 1);
    vm
}

/// A host thread sleeping on CPU 0 is woken by the exit the stub posts
/// 100 ms later: the stub rang once (its count and the host's), and the
/// sleep returned that exit before its 60 s timeout. Without the ring the
/// stub's count stays 0 and the sleep lasts the whole timeout.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn an_exit_rings_the_doorbell_of_a_sleeping_host() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 2 << 20) else {
        return;
    };
    let vm = vm_with_probe_mapped(&m);
    let mbox = m.mailbox(0);
    let (rung0, heard0) = (mbox.read(mb::BELLS), mbox.doorbells());
    assert_eq!((rung0, heard0), (0, 0), "no ring while no host slept");
    let last = mbox.read(mb::EXIT_SEQ);
    let (vtcr, vttbr) = vm.stage2_regs();
    let entry = s2mmu_arm64::probe_entry();
    let timeout = Duration::from_secs(60);
    let t = Instant::now();
    let (run, exit) = std::thread::scope(|s| {
        let poster = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            let a = [vtcr, vttbr, HCR_GUEST, entry, 0, entry, 0, 0, 0, 0, 0, 0];
            m.mailbox(0).post(layout::CMD_RUN, &a)
        });
        let exit = mbox.sleep_until_exit(last, timeout);
        (poster.join().unwrap(), exit)
    });
    let slept = t.elapsed();
    let e = exit.expect("the sleep returned the exit");
    assert_eq!((e.kind, e.x[0]), (layout::EXIT_HVC, HVC_PROBE));
    assert!(slept < timeout, "woken by the timeout after {slept:?}");
    assert_eq!(mbox.read(mb::BELLS), 1, "the stub rang once");
    assert_eq!(mbox.doorbells(), 1, "the host heard it");
    assert_eq!(mbox.read(mb::HOST_WAITING), 0, "the sleeper is awake");
    mbox.reply(&e, layout::ACT_STOP, [0, 0], &[]);
    wait_done(&mbox, run);
    // A second exit, with nobody asleep: no ring.
    let a = [vtcr, vttbr, HCR_GUEST, entry, 0, entry, 0, 0, 0, 0, 0, 0];
    let run = mbox.post(layout::CMD_RUN, &a);
    let e = mbox.wait_exit(e.seq).unwrap();
    mbox.reply(&e, layout::ACT_STOP, [0, 0], &[]);
    wait_done(&mbox, run);
    assert_eq!(mbox.read(mb::BELLS), 1, "a ring with no host asleep");
    eprintln!("woken after {slept:?} (the exit was posted after 100 ms)");
}

/// Runs `entry` once (x1 = `entry`, a mapped page) and answers its first
/// HVC 100 ms late; the stub's idle waits meanwhile and the window's
/// length in counter ticks.
fn late_answer(m: &std::sync::Arc<Machine>, entry: u64) -> (u64, u64) {
    let vm = vm_with_probe_mapped(m);
    let mbox = m.mailbox(0);
    let freq = mbox.read(mb::CNTFRQ);
    let mut vcpu = vm.mmu().new_vcpu().unwrap();
    let mut seen = None;
    vm.run(0, &mut vcpu, entry, [0, entry, 0, 0, 0, 0, 0, 0], |_| {
        let t = Instant::now();
        let before = mbox.read(mb::IDLE_WAITS);
        std::thread::sleep(Duration::from_millis(100));
        let waits = mbox.read(mb::IDLE_WAITS) - before;
        let ticks = (t.elapsed().as_nanos() * u128::from(freq) / 1_000_000_000) as u64;
        seen = Some((waits, ticks));
        HvcAnswer::Stop
    })
    .unwrap();
    seen.expect("one exit")
}

/// The most waits an exit answered `ticks` late may make: the short
/// waits, the ramp, one per longest (20 µs << EXIT_BACKOFF_SHIFT), one in
/// flight.
fn wait_bound(m: &Machine, ticks: u64) -> u64 {
    let longest = m.mailbox(0).read(mb::IDLE_TICKS) << EXIT_BACKOFF_SHIFT;
    EXIT_SHORT_WAITS + u64::from(EXIT_BACKOFF_SHIFT) + ticks / longest + 2
}

/// Runs [`late_answer`] on the guest at `entry` and asserts the stub
/// waited, but no more often than [`wait_bound`] allows.
fn assert_few_waits(m: &std::sync::Arc<Machine>, entry: u64, what: &str) {
    let (waits, ticks) = late_answer(m, entry);
    let bound = wait_bound(m, ticks);
    eprintln!("{waits} waits in {ticks} ticks {what} (at most {bound})");
    assert!(waits > 0, "the stub waited on its timer");
    assert!(
        waits <= bound,
        "{waits} waits in {ticks} ticks: more than {bound}"
    );
}

/// An exit the host answers 100 ms late: the stub makes its short waits,
/// the ramp and then one wait per longest, so few; at a fixed 20 µs it
/// made one per 20 µs plus QEMU's overhead (a wait never ends before its
/// timer, so load only lowers either count).
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_late_answer_makes_the_stub_back_off() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 2 << 20) else {
        return;
    };
    assert_few_waits(&m, s2mmu_arm64::probe_entry(), "for one late answer");
}

/// The same late answer to a guest whose virtual timer has fired: the
/// stub masks the timer while it waits, so its waits still sleep (with
/// the timer's interrupt pending every WFI returned at once: tens of
/// thousands of waits in 100 ms, a busy loop on QEMU's thread).
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_fired_guest_timer_does_not_make_the_wait_spin() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 2 << 20) else {
        return;
    };
    assert_few_waits(
        &m,
        s2mmu_arm64::timer_probe_entry(),
        "with the guest's timer fired",
    );
}
