//! The break-before-make monitor on the arm64 model: a split on fault
//! (2 MiB blocks written while logged, no eager split) breaks each block,
//! invalidates it and makes a table. With the fault's broadcast
//! invalidation left in the abort's answer (run by the stub after the host
//! made the table, as this crate once did) the monitor reports a make
//! before its break was invalidated; run through the service CPU, between
//! break and make, it reports nothing. QEMU itself passes both runs: it
//! does not model TLB conflicts.

mod common;

use s2mmu::bbm::{self, Rule};
use s2mmu::mmu::MmuPolicy;
use s2mmu_arm64::vm::VmConfig;
use s2mmu_arm64::workload::{run_dirty_log, DirtyConfig, DirtyReport};
use std::sync::MutexGuard;

/// A split-on-fault run on 2 vCPUs, the fault's broadcasts in its answer
/// when `answer_broadcasts`, and the binary's turn on the model: held
/// while the caller reads the monitor's findings.
fn split_on_fault(answer_broadcasts: bool) -> (MutexGuard<'static, ()>, DirtyReport) {
    let vcpus = 2;
    let cfg = DirtyConfig {
        vcpus,
        bytes_per_vcpu: 4 << 20,
        iterations: 2,
        host_page: 2 << 20,
        verify_tags: true,
        ..DirtyConfig::default()
    };
    let vm_cfg = VmConfig {
        policy: MmuPolicy {
            eager_split_chunk: None,
            ..MmuPolicy::default()
        },
        ..VmConfig::default()
    };
    let (one, vm) = common::dirty_log_vm(vcpus, &cfg, &vm_cfg);
    vm.sink().answer_fault_broadcasts(answer_broadcasts);
    let r = run_dirty_log(&vm, &cfg).unwrap();
    assert_eq!(r.faults.splits_on_fault, 2 * vcpus as u64, "{:?}", r.faults);
    eprintln!("answer broadcasts {answer_broadcasts}: tlbi {:?}", r.tlbi);
    (one, r)
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_split_whose_invalidation_runs_after_the_answer_is_caught() {
    const { assert!(bbm::ENABLED, "the tests build the engine with bbm-trace") };
    let (_one, r) = split_on_fault(true);
    assert!(
        r.bad_tags.is_empty(),
        "QEMU does not see it: {:?}",
        r.bad_tags
    );
    let found = bbm::take_violations();
    let makes = found
        .iter()
        .filter(|v| v.rule == Rule::MakeBeforeInvalidate)
        .count();
    assert!(
        makes >= 4,
        "each of the 4 splits is a make before its invalidation: {found:?}"
    );
    assert_eq!(r.tlbi.fault_service_sequences, 0);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_split_on_fault_invalidates_between_break_and_make() {
    let (_one, r) = split_on_fault(false);
    assert!(r.bad_tags.is_empty(), "{:?}", r.bad_tags);
    assert!(
        r.tlbi.fault_service_sequences >= 4,
        "each split's invalidation ran on the service CPU: {:?}",
        r.tlbi
    );
    assert_eq!(bbm::violations(), []);
}
