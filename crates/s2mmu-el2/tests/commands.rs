//! Every command with bad arguments: the exact error code, EL2's state
//! unchanged, nothing written to shared memory.

mod common;

use common::*;
use s2mmu_el2::abi::{HypError::*, LogMode, Op};
use s2mmu_el2::{AbortOutcome, Command, FLAG_POSTCOPY};

const SHARED_END: u64 = SHARED_PA + SHARED_BYTES as u64;

#[test]
fn an_unknown_opcode_is_refused() {
    let h = Host::with_slot(LogMode::Manual);
    for code in [0u32, 16, 0xffff_ffff] {
        let before = h.state();
        let mut c = Command {
            op: code,
            ..Command::default()
        };
        h.hyp.dispatch(&mut c);
        assert_eq!(c.status, UnknownOp.status());
        assert_eq!(h.state(), before);
    }
}

#[test]
fn commands_before_a_vm_are_refused() {
    let mut h = Host::new();
    h.refused(Op::MemslotSet, &S0, NoVm);
    h.refused(Op::LogSet, &[0, 1, 1], NoVm);
    h.refused(Op::GetDirty, &[0, SHARED_PA, 4096], NoVm);
    h.refused(Op::RingReset, &[], NoVm);
    h.refused(Op::UnmapRange, &[0x4400_0000, 4096], NoVm);
    h.refused(Op::VmDestroy, &[], NoVm);
    h.refused(Op::PageReady, &[0, 0], NoVm);
}

#[test]
fn post_copy_slots_and_page_ready_check_their_arguments() {
    let mut h = Host::with_slot(LogMode::Manual);
    let pc = |page: u64| [1, FLAG_POSTCOPY, 0x1000_0000, 16 << 12, 0x4800_0000, page];
    // Post-copy maps 4 KiB pages only, and only from the slot's creation.
    h.refused(Op::MemslotSet, &pc(2 << 20), BadArgument);
    let mut s0 = S0;
    s0[1] = FLAG_POSTCOPY;
    h.refused(Op::MemslotSet, &s0, BadArgument);
    h.ok(Op::MemslotSet, &pc(4096));
    h.refused(
        Op::MemslotSet,
        &[1, 0, 0x1000_0000, 16 << 12, 0x4800_0000, 4096],
        BadArgument,
    );
    h.refused(Op::PageReady, &[32, 0], SlotOutOfRange);
    h.refused(Op::PageReady, &[5, 0], NoSuchSlot);
    h.refused(Op::PageReady, &[0, 0], BadArgument);
    h.refused(Op::PageReady, &[1, 16], Overflow);
    h.refused(Op::PageReady, &[1, u64::MAX], Overflow);
    h.refused(Op::PageReady, &[1, 3, 1], BadArgument);
    assert_eq!(h.ok(Op::PageReady, &[1, 3])[0], 1);
    h.refused(Op::PageReady, &[1, 3], BadArgument);
}

#[test]
fn vm_init_checks_mode_ring_size_and_vcpus() {
    let mut h = Host::new();
    h.refused(Op::VmInit, &[9, 0, 1], BadArgument);
    h.refused(Op::VmInit, &[LogMode::Ring as u64, 100, 1], BadArgument);
    h.refused(Op::VmInit, &[LogMode::Ring as u64, 1 << 17, 1], BadArgument);
    h.refused(Op::VmInit, &[LogMode::WpGet as u64, 256, 1], BadArgument);
    h.refused(Op::VmInit, &[LogMode::WpGet as u64, 0, 0], BadArgument);
    h.refused(Op::VmInit, &[LogMode::WpGet as u64, 0, 9], BadArgument);
    h.refused(Op::VmInit, &[LogMode::WpGet as u64, 0, 1, 7], BadArgument);
    h.ok(Op::VmInit, &[LogMode::WpGet as u64, 0, 1]);
    h.refused(Op::VmInit, &[LogMode::WpGet as u64, 0, 1], VmExists);
}

#[test]
fn memslot_sizes_alignment_and_overflow() {
    let mut h = Host::with_slot(LogMode::Manual);
    let s = |ipa: u64, size: u64, backing: u64| [1, 0, ipa, size, backing, 4096];
    h.refused(
        Op::MemslotSet,
        &[32, 0, 0x1000, 4096, 0x4800_0000, 4096],
        SlotOutOfRange,
    );
    h.refused(
        Op::MemslotSet,
        &[u64::MAX, 0, 0x1000, 4096, 0x4800_0000, 4096],
        SlotOutOfRange,
    );
    h.refused(
        Op::MemslotSet,
        &[1, 8, 0x1000, 4096, 0x4800_0000, 4096],
        BadArgument,
    );
    h.refused(
        Op::MemslotSet,
        &[1, 0, 0x1000, 4096, 0x4800_0000, 3],
        BadArgument,
    );
    h.refused(
        Op::MemslotSet,
        &[1, 0, 0x1000, 0, 0x4800_0000, 4096],
        NoSuchSlot,
    );
    h.refused(Op::MemslotSet, &s(0x1000, 0x1001, 0x4800_0000), BadSize);
    h.refused(Op::MemslotSet, &s(0x1800, 0x1000, 0x4800_0000), Misaligned);
    h.refused(Op::MemslotSet, &s(0x1000, 0x1000, 0x4800_0800), Misaligned);
    h.refused(
        Op::MemslotSet,
        &s((1 << 40) - 0x1000, 0x2000, 0x4800_0000),
        Overflow,
    );
    h.refused(Op::MemslotSet, &s(!0xfff, 0x2000, 0x4800_0000), Overflow);
    h.refused(Op::MemslotSet, &s(0x1000, 0x2000, !0xfff), Overflow);
}

#[test]
fn memslots_cannot_reach_the_carve_out_or_each_other() {
    let mut h = Host::with_slot(LogMode::Manual);
    let s = |ipa: u64, size: u64, backing: u64| [1, 0, ipa, size, backing, 4096];
    // The carve-out, wholly or by one page at either end.
    h.refused(Op::MemslotSet, &s(0x1000, 0x1000, CARVE.base), CarveOut);
    h.refused(
        Op::MemslotSet,
        &s(0x1000, 0x2000, CARVE.base - 0x1000),
        CarveOut,
    );
    h.refused(
        Op::MemslotSet,
        &s(0x1000, 0x1000, CARVE.base + CARVE.size - 0x1000),
        CarveOut,
    );
    // Outside RAM.
    h.refused(Op::MemslotSet, &s(0x1000, 0x1000, 0x1000_0000), NotRam);
    h.refused(
        Op::MemslotSet,
        &s(0x1000, 0x2000, RAM.base + RAM.size - 0x1000),
        NotRam,
    );
    // Slot 0's guest range, and slot 0's backing at another address.
    h.refused(
        Op::MemslotSet,
        &s(0x8000_0000 + (4 << 20) - 0x1000, 0x2000, 0x4800_0000),
        SlotOverlap,
    );
    h.refused(
        Op::MemslotSet,
        &s(0x1000, 0x1000, 0x4400_0000 + 0x3000),
        BackingOverlap,
    );
    // Slot 0 moved onto new backing, or resized.
    h.refused(
        Op::MemslotSet,
        &[0, 0, 0x9000_0000, 4 << 20, 0x4800_0000, 2 << 20],
        BackingChanged,
    );
    h.refused(
        Op::MemslotSet,
        &[0, 0, 0x8000_0000, 8 << 20, 0x4400_0000, 2 << 20],
        BackingChanged,
    );
    // A move that keeps the backing is accepted; so is a neighbour.
    h.ok(
        Op::MemslotSet,
        &[0, 0, 0x9000_0000, 4 << 20, 0x4400_0000, 2 << 20],
    );
    h.ok(Op::MemslotSet, &s(0x8000_0000, 0x1000, 0x4440_0000));
    assert_eq!(h.hyp.slot(0).unwrap().ipa, 0x9000_0000);
    assert_eq!(h.hyp.slot(1).unwrap().backing, 0x4440_0000);
}

#[test]
fn logging_checks_slot_switch_and_mode() {
    let mut h = Host::with_slot(LogMode::Manual);
    let manual = LogMode::Manual as u64;
    h.refused(Op::LogSet, &[40, 1, manual], SlotOutOfRange);
    h.refused(Op::LogSet, &[3, 1, manual], NoSuchSlot);
    h.refused(Op::LogSet, &[0, 2, manual], BadArgument);
    h.refused(Op::LogSet, &[0, 1, LogMode::Ring as u64], WrongMode);
    h.refused(Op::LogSet, &[0, 1, 77], WrongMode);
    h.refused(Op::Collapse, &[0], NotLogging);
    h.ok(Op::LogSet, &[0, 1, manual]);
}

#[test]
fn get_and_clear_bitmaps_must_lie_in_the_shared_area() {
    let mut h = Host::with_slot(LogMode::Manual);
    // 1024 pages: 128 bytes of bitmap.
    h.refused(Op::GetDirty, &[0, SHARED_PA, 128], NotLogging);
    h.ok(Op::LogSet, &[0, 1, LogMode::Manual as u64]);
    h.refused(Op::GetDirty, &[0, SHARED_PA + 4, 128], Misaligned);
    h.refused(Op::GetDirty, &[0, SHARED_PA, 120], TooSmall);
    h.refused(Op::GetDirty, &[0, !7, 128], Overflow);
    h.refused(Op::GetDirty, &[0, SHARED_END - 64, 128], OutsideShared);
    h.refused(Op::GetDirty, &[0, SHARED_PA - 8, 128], OutsideShared);
    h.refused(Op::GetDirty, &[0, CARVE.base, 128], OutsideShared);
    h.refused(Op::GetDirty, &[9, SHARED_PA, 128], NoSuchSlot);
    h.refused(Op::ClearDirty, &[0, 3, 64, SHARED_PA, 8], Misaligned);
    h.refused(Op::ClearDirty, &[0, 0, 0, SHARED_PA, 8], BadSize);
    h.refused(Op::ClearDirty, &[0, 960, 128, SHARED_PA, 16], Overflow);
    h.refused(Op::ClearDirty, &[0, 64, u64::MAX, SHARED_PA, 16], Overflow);
    h.refused(Op::ClearDirty, &[0, 0, 128, SHARED_PA, 8], TooSmall);
    h.refused(Op::ClearDirty, &[0, 0, 64, SHARED_END, 8], OutsideShared);
    h.refused(
        Op::Counters,
        &[SHARED_END - 8, COUNTERS_BYTES],
        OutsideShared,
    );
    h.refused(Op::Counters, &[SHARED_PA, 8], TooSmall);
}

#[test]
fn mode_specific_commands_need_their_mode() {
    let mut h = Host::with_slot(LogMode::WpGet);
    h.ok(Op::LogSet, &[0, 1, LogMode::WpGet as u64]);
    h.refused(Op::ClearDirty, &[0, 0, 64, SHARED_PA, 8], WrongMode);
    h.refused(Op::RingHarvest, &[SHARED_PA, 4096], WrongMode);
    h.refused(Op::RingReset, &[], WrongMode);
    let mut r = Host::with_slot(LogMode::Ring);
    r.ok(Op::LogSet, &[0, 1, LogMode::Ring as u64]);
    r.refused(Op::GetDirty, &[0, SHARED_PA, 128], WrongMode);
    // 256 entries of 16 bytes.
    r.refused(Op::RingHarvest, &[SHARED_PA, 4095], TooSmall);
    r.refused(Op::RingHarvest, &[SHARED_END - 2048, 4096], OutsideShared);
}

#[test]
fn unmap_checks_its_range() {
    let mut h = Host::with_slot(LogMode::Manual);
    h.refused(Op::UnmapRange, &[0x4400_0000, 0], BadSize);
    h.refused(Op::UnmapRange, &[0x4400_0100, 0x1000], Misaligned);
    h.refused(Op::UnmapRange, &[!0xfff, 0x2000], Overflow);
    h.refused(Op::UnmapRange, &[CARVE.base, 0x1000], CarveOut);
}

#[test]
fn an_abort_on_the_carve_out_is_refused_and_nothing_is_mapped() {
    let h = Host::with_slot(LogMode::Manual);
    let before = h.hyp.counters();
    let out = h
        .hyp
        .handle_abort(0, &dabt(CARVE.base + 0x5000, false, false));
    assert_eq!(out, AbortOutcome::Refused(s2mmu_el2::Refusal::CarveOut));
    let reader = h.hyp.with_mmu(|m| m.reader()).unwrap();
    assert!(reader.translate(CARVE.base + 0x5000).is_none());
    let out = h.hyp.handle_abort(0, &dabt(0x100_0000, true, false));
    assert_eq!(out, AbortOutcome::Refused(s2mmu_el2::Refusal::NoSlot));
    let after = h.hyp.counters();
    assert_eq!(after.aborts_refused, before.aborts_refused + 2);
    assert_eq!(after.aborts_handled, before.aborts_handled);
}

#[test]
fn status_codes_name_their_errors() {
    for e in s2mmu_el2::HypError::ALL {
        assert_eq!(s2mmu_el2::HypError::from_status(e.status()), Some(e));
    }
    assert_eq!(s2mmu_el2::HypError::from_status(0), None);
    assert_eq!(s2mmu_el2::HypError::from_status(-99), None);
}
