//! A guest at EL1 cannot use QEMU's semihosting to reach the host. With
//! `-semihosting` QEMU served `HLT #0xf000` from EL1 itself (its A64
//! translator checks `semihosting_enabled(el == 0)`: only EL0 needs
//! `userspace=on`), before any exception reached the EL2 stub, so a guest
//! kernel could print on the host's console and open, write or remove
//! host files as QEMU's user. QEMU now starts without it: the HLT is an
//! UNDEF the guest takes at EL1, and nothing reaches the host.

use crate::common;

use s2mmu_arm64::layout::{self, HVC_PROBE};
use s2mmu_arm64::vm::{Arm64Vm, HvcAnswer, VmConfig};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Semihosting operations (Arm's semihosting specification).
const SYS_OPEN: u64 = 0x01;
const SYS_WRITE0: u64 = 0x04;
/// SYS_OPEN's mode "w": create or truncate, for writing.
const MODE_W: u64 = 4;
/// The probe's report of an exception taken at EL1 (its vectors).
const HVC_EL1_EXCEPTION: u64 = 5;
/// ESR_EL1.EC of an UNDEF (unknown reason).
const EC_UNKNOWN: u64 = 0;
/// Where the test's data slot sits (IPA and RAM alike).
const SLOT: u16 = 1;
const BLOCK: u64 = layout::DATA;
const PATH: u64 = layout::DATA + 0x100;
const MARKER: u64 = layout::DATA + 0x800;

/// Runs the semihosting probe once with operation `op` and parameter
/// `param`; its report: (x0, x1) of its one HVC.
fn probe(vm: &Arm64Vm, op: u64, param: u64) -> (u64, u64) {
    let mut vcpu = vm.mmu().new_vcpu().unwrap();
    let entry = s2mmu_arm64::semihost_probe_entry();
    let mut seen = None;
    vm.run(0, &mut vcpu, entry, [op, param, 0, 0, 0, 0, 0, 0], |e| {
        seen = Some((e.x[0], e.x[1]));
        HvcAnswer::Stop
    })
    .unwrap();
    seen.expect("the probe reported")
}

/// Asserts that the probe took an UNDEF at EL1 for its HLT (the call was
/// not served): its report is the EL1 vectors' with an unknown-reason
/// syndrome, not the call's result.
fn assert_undef(what: &str, (x0, x1): (u64, u64)) {
    assert_ne!(
        x0, HVC_PROBE,
        "{what}: QEMU served the guest's semihosting call (result {x1:#x})"
    );
    assert_eq!(x0, HVC_EL1_EXCEPTION, "{what}: the probe's report");
    assert_eq!(
        x1 >> 26,
        EC_UNKNOWN,
        "{what}: ESR_EL1 {x1:#x} is not an UNDEF"
    );
}

/// SYS_WRITE0 of a marker and SYS_OPEN of a host path from EL1: the
/// guest takes an UNDEF for each, the marker never shows in QEMU's output
/// and the file is not created. With `-semihosting` put back on QEMU's
/// command line the first call prints the marker and returns, and the
/// second creates the file.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_guest_semihosting_call_does_not_reach_the_host() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 2 << 20) else {
        return;
    };
    let vm = Arm64Vm::new(m.clone(), &VmConfig::default()).unwrap();
    vm.add_slot(SLOT, layout::DATA, layout::DATA, 2 << 20, 4096)
        .unwrap();
    let ram = m.ram();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let tag = format!("s2mmu-semihost-{}-{nanos}", std::process::id());
    let marker = format!("{tag}-marker");
    ram.write_bytes(MARKER, format!("{marker}\0").as_bytes())
        .unwrap();
    let report = probe(&vm, SYS_WRITE0, MARKER);
    let host_file = std::env::temp_dir().join(&tag);
    let path = host_file.to_str().unwrap().to_string();
    ram.write_bytes(PATH, format!("{path}\0").as_bytes())
        .unwrap();
    ram.write(BLOCK, PATH);
    ram.write(BLOCK + 8, MODE_W);
    ram.write(BLOCK + 16, path.len() as u64);
    let open_report = probe(&vm, SYS_OPEN, BLOCK);
    let created = host_file.exists();
    let _ = std::fs::remove_file(&host_file);
    // QEMU wrote any console text before the guest's HVC; the host's
    // reader threads get it shortly after.
    std::thread::sleep(Duration::from_millis(500));
    let console = m.console();
    assert!(
        !console.contains(&marker),
        "the guest printed on QEMU's console: {console:?}"
    );
    assert!(!created, "the guest created the host file {path}");
    assert_undef("SYS_WRITE0", report);
    assert_undef("SYS_OPEN", open_report);
}

/// The stub's own way out still works without semihosting: an exception
/// at EL2 (an AT list at an address beyond the physical address space, a
/// load that faults with the MMU off) sends `hyp_panic`'s message through
/// the UART to QEMU's output, where the host reads it, and sets the
/// mailbox's error word. With the message still written by semihosting
/// (now off) nothing would arrive.
#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn the_stubs_panic_message_comes_out_of_the_uart() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 2 << 20) else {
        return;
    };
    let mbox = m.mailbox(0);
    assert_eq!(mbox.bad_insns(), 0);
    // AT: VTCR, VTTBR, HCR, IPA list, count 1, output list, read.
    let beyond = 1u64 << 60;
    mbox.post(layout::CMD_AT, &[0, 0, 0, beyond, 1, layout::SCRATCH, 0]);
    let t = std::time::Instant::now();
    let message = "s2mmu-hyp: exception taken at EL2";
    while !m.console().contains(message) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no panic message on the console: {:?}",
            m.console()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(mbox.bad_insns(), 0xdead, "the stub's error word");
}
