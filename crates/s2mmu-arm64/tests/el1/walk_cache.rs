//! The checks QEMU can fail on a wrong TLBI operand (`src/walk_cache.rs`):
//! the page holding a guest's stage-1 root table is moved while the guest
//! runs with stage 1 on. The guest's next access must take a stage-2 abort
//! on its stage-1 walk at the table's IPA. With every by-IPA operand one
//! page off (the engine asked for the right one; the sink changes it on
//! purpose) QEMU keeps its stage-2 entry of the table page and the access
//! goes through; with the final `TLBI VMALLE1IS` left out, the combined
//! entry survives and the access goes through too.

use crate::common;

use s2mmu_arm64::vm::VmConfig;
use s2mmu_arm64::walk_cache::{
    change_stage1_table, AfterMove, Stage2Change, WalkCacheReport, DATA_WORD,
};
use s2mmu_arm64::{layout, stage2};

const SLOT: u16 = 1;
const GPA: u64 = 4 << 30;
/// The table page moves to a page outside the slot.
const MOVE: Stage2Change = Stage2Change::MoveTablePage(layout::DATA + (64 << 10));

/// Which fault the sink injects while the page moves.
#[derive(Clone, Copy, Debug)]
enum Inject {
    Nothing,
    OperandOnePageOff,
    NoStage1Flush,
    NoSequences,
}

fn run(inject: Inject, change: Stage2Change) -> WalkCacheReport {
    let (_one, vm) = common::vm(2, 2 << 20, &VmConfig::default());
    match inject {
        Inject::Nothing => {}
        Inject::OperandOnePageOff => vm.sink().skew_ipa_operands(1),
        Inject::NoStage1Flush => vm.sink().drop_stage1_flushes(true),
        Inject::NoSequences => vm.sink().drop_host_sequences(u64::MAX),
    }
    let r = change_stage1_table(&vm, SLOT, GPA, layout::DATA, change, 0).unwrap();
    eprintln!("{inject:?}, {change:x?}: {r:x?}");
    assert_eq!(r.before, DATA_WORD);
    if !matches!(inject, Inject::NoSequences) {
        assert!(
            r.sequences >= 1 && r.tlbis >= 1,
            "the change invalidated: {r:?}"
        );
    }
    r
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_moved_stage1_table_is_walked_again_through_stage2() {
    let r = run(Inject::Nothing, MOVE);
    assert_eq!(r.after, AfterMove::WalkFault { ipa: GPA }, "{r:x?}");
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn an_ipa_operand_one_page_off_leaves_the_old_table_walkable() {
    let r = run(Inject::OperandOnePageOff, MOVE);
    assert_eq!(r.after, AfterMove::Read(DATA_WORD), "{r:x?}");
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_sequence_without_its_stage1_flush_leaves_the_combined_entry() {
    let r = run(Inject::NoStage1Flush, MOVE);
    assert_eq!(r.after, AfterMove::Read(DATA_WORD), "{r:x?}");
}

/// Not a check of the engine: what QEMU 7.2 makes of maintenance issued
/// under another VMID than the guest's (run by hand with `--ignored`; the
/// docs/arm64-check.md quotes it). QEMU's TLB entries carry no VMID, so the service
/// CPU's TLBIs under VMID 2 still drop the entries of the guest running
/// under VMID 1: a wrong VMID is one more thing QEMU cannot judge.
#[test]
#[ignore = "an observation of QEMU, run by hand: cargo test -p s2mmu-arm64 --test el1 walk_cache -- --ignored"]
fn qemu_7_2_does_not_judge_the_vmid() {
    let (_one, vm) = common::vm(2, 2 << 20, &VmConfig::default());
    let (vtcr, vttbr) = vm.stage2_regs();
    let other_vmid = (vttbr & ((1 << 48) - 1)) | (stage2::VMID + 1) << 48;
    vm.sink().set_context(vtcr, other_vmid);
    let r = change_stage1_table(&vm, SLOT, GPA, layout::DATA, MOVE, 0).unwrap();
    eprintln!("maintenance under VMID {}: {r:x?}", stage2::VMID + 1);
    assert_eq!(r.after, AfterMove::WalkFault { ipa: GPA }, "{r:x?}");
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn an_unmapped_range_is_walked_again_through_stage2() {
    let r = run(Inject::Nothing, Stage2Change::UnmapSlot);
    assert_eq!(r.after, AfterMove::WalkFault { ipa: GPA }, "{r:x?}");
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn an_unmapped_range_left_uninvalidated_stays_walkable() {
    let r = run(Inject::NoSequences, Stage2Change::UnmapSlot);
    assert_eq!(r.after, AfterMove::Read(DATA_WORD), "{r:x?}");
}

/// Not a check of the engine: what QEMU 7.2 makes of a range TLBI one page
/// off (run by hand with `--ignored`; docs/arm64-check.md quotes it). Unmapping the
/// slot ends with a range TLBI over the freed tables (1 GiB here); every
/// by-IPA operand one page off leaves the table page outside every
/// operand, yet the walk faults: QEMU's range flush drops more than its
/// range (a range longer than its small TLB drops that TLB whole), so a
/// wrong range operand is not something QEMU can judge.
#[test]
#[ignore = "an observation of QEMU, run by hand: cargo test -p s2mmu-arm64 --test el1 walk_cache -- --ignored"]
fn qemu_7_2_does_not_judge_range_operands() {
    let r = run(Inject::OperandOnePageOff, Stage2Change::UnmapSlot);
    assert_eq!(r.after, AfterMove::WalkFault { ipa: GPA }, "{r:x?}");
}
