//! The host moving memory under a guest through EL2: `REMAP_PAGE` and
//! `MEMSLOT_DELETE_LOGGED` with bad arguments (the exact error, EL2's
//! state and shared memory unchanged), then what each does when accepted.

mod common;

use common::*;
use s2mmu_el2::abi::{HypError::*, LogMode, Op};

const SHARED_END: u64 = SHARED_PA + SHARED_BYTES as u64;
/// A free page of RAM, in no slot's backing.
const SPARE: u64 = 0x4800_0000;
/// Slot 1: 64 KiB at IPA 0x1000_0000 backed at 0x4600_0000 (4 KiB pages).
const S1: [u64; 6] = [1, 0, 0x1000_0000, 0x10000, 0x4600_0000, 4096];

#[test]
fn remap_page_checks_its_arguments() {
    let mut h = Host::new();
    h.refused(Op::RemapPage, &[0x4400_0000, SPARE], NoVm);
    let mut h = Host::with_slot(LogMode::Manual);
    h.ok(Op::MemslotSet, &S1);
    h.refused(Op::RemapPage, &[0x4400_0000, SPARE, 1], BadArgument);
    h.refused(
        Op::RemapPage,
        &[0x4400_0000, SPARE, 0, 0, 0, 9],
        BadArgument,
    );
    h.refused(Op::RemapPage, &[0x4400_0800, SPARE], Misaligned);
    h.refused(Op::RemapPage, &[0x4400_0000, SPARE + 8], Misaligned);
    h.refused(Op::RemapPage, &[!0xfff, SPARE], Overflow);
    h.refused(Op::RemapPage, &[0x4400_0000, CARVE.base + 0x1000], CarveOut);
    h.refused(Op::RemapPage, &[0x4400_0000, RAM.base + RAM.size], NotRam);
    h.refused(Op::RemapPage, &[SPARE, SPARE + 0x1000], NoSuchSlot);
    // The new page inside a slot's backing, its own or another's.
    h.refused(Op::RemapPage, &[0x4400_0000, 0x4400_1000], BackingOverlap);
    h.refused(Op::RemapPage, &[0x4400_0000, 0x4600_f000], BackingOverlap);
    h.ok(Op::RemapPage, &[0x4400_0000, SPARE]);
    // A page something moved to is taken, for a remap and for a new slot.
    h.refused(Op::RemapPage, &[0x4400_1000, SPARE], BackingOverlap);
    h.refused(
        Op::MemslotSet,
        &[2, 0, 0x2000_0000, 0x1000, SPARE, 4096],
        BackingOverlap,
    );
}

#[test]
fn a_remapped_page_keeps_its_data_and_is_mapped_from_its_new_place() {
    let mut h = Host::with_slot(LogMode::Manual);
    h.ok(Op::MemslotSet, &S1);
    let (ipa, at) = (0x1000_3000, 0x4600_3000);
    h.set_ram_word(at + 8, 0x1234_5678);
    // The guest writes the page: mapped from the slot's backing.
    assert!(matches!(
        h.hyp.handle_abort(0, &dabt(ipa, true, false)),
        s2mmu_el2::AbortOutcome::Handled { .. }
    ));
    let tr = |h: &Host| h.hyp.with_mmu(|m| m.reader().translate(ipa)).unwrap();
    assert_eq!(tr(&h).map(|t| t.pa), Some(at));
    let r = h.ok(Op::RemapPage, &[at, SPARE]);
    assert_eq!(
        r,
        [1, at, 0, 0],
        "one leaf unmapped, the page was at its backing"
    );
    assert_eq!(tr(&h), None, "the old mapping is gone");
    assert_eq!(h.ram_word(SPARE + 8), 0x1234_5678, "EL2 copied the page");
    h.hyp.handle_abort(0, &dabt(ipa, true, false));
    assert_eq!(tr(&h).map(|t| t.pa), Some(SPARE));
    // Moved again: the answer names where it was, the old place is free.
    let r = h.ok(Op::RemapPage, &[at, SPARE + 0x1000]);
    assert_eq!(r[1], SPARE);
    assert_eq!(h.ram_word(SPARE + 0x1008), 0x1234_5678);
    h.ok(Op::RemapPage, &[0x4600_4000, SPARE]);
    // Deleting the slot forgets its moves: the pages are free again.
    h.ok(Op::MemslotSet, &[1, 0, 0x1000_0000, 0, 0, 0]);
    h.ok(Op::MemslotSet, &[2, 0, 0x2000_0000, 0x2000, SPARE, 4096]);
}

#[test]
fn delete_logged_checks_its_arguments() {
    let mut h = Host::new();
    h.refused(Op::MemslotDeleteLogged, &[1, SHARED_PA, 8], NoVm);
    let mut h = Host::with_slot(LogMode::Manual);
    h.ok(Op::MemslotSet, &S1);
    // 16 pages: one word of bitmap.
    h.refused(Op::MemslotDeleteLogged, &[1, SHARED_PA, 8], NotLogging);
    h.ok(Op::LogSet, &[1, 1, LogMode::Manual as u64]);
    h.refused(Op::MemslotDeleteLogged, &[1, SHARED_PA, 8, 1], BadArgument);
    h.refused(Op::MemslotDeleteLogged, &[40, SHARED_PA, 8], SlotOutOfRange);
    h.refused(Op::MemslotDeleteLogged, &[5, SHARED_PA, 8], NoSuchSlot);
    h.refused(Op::MemslotDeleteLogged, &[1, SHARED_PA + 4, 8], Misaligned);
    h.refused(Op::MemslotDeleteLogged, &[1, SHARED_PA, 4], TooSmall);
    h.refused(Op::MemslotDeleteLogged, &[1, !7, 8], Overflow);
    h.refused(Op::MemslotDeleteLogged, &[1, SHARED_END, 8], OutsideShared);
    h.refused(Op::MemslotDeleteLogged, &[1, CARVE.base, 8], OutsideShared);
    let mut r = Host::with_slot(LogMode::Ring);
    r.ok(Op::MemslotSet, &S1);
    r.ok(Op::LogSet, &[1, 1, LogMode::Ring as u64]);
    r.refused(Op::MemslotDeleteLogged, &[1, SHARED_PA, 8], WrongMode);
}

#[test]
fn delete_logged_hands_back_the_last_log_and_deletes_the_slot() {
    for mode in [LogMode::WpGet, LogMode::Manual] {
        let mut h = Host::with_slot(mode);
        h.ok(Op::MemslotSet, &S1);
        h.ok(Op::LogSet, &[1, 1, mode as u64]);
        for p in [2u64, 5, 15] {
            let out = h
                .hyp
                .handle_abort(0, &dabt(0x1000_0000 + p * 4096, true, false));
            assert!(
                matches!(out, s2mmu_el2::AbortOutcome::Handled { .. }),
                "{out:?}"
            );
        }
        let r = h.ok(Op::MemslotDeleteLogged, &[1, SHARED_PA, 8]);
        assert_eq!(r[0], 3, "{mode:?}");
        assert_eq!(h.shared_word(0), 1 << 2 | 1 << 5 | 1 << 15, "{mode:?}");
        assert_eq!(h.hyp.slot(1), None);
        let m = h
            .hyp
            .with_mmu(|m| m.reader().translate(0x1000_2000))
            .unwrap();
        assert_eq!(m, None, "nothing of the slot stays mapped");
        let out = h.hyp.handle_abort(0, &dabt(0x1000_2000, true, false));
        assert_eq!(
            out,
            s2mmu_el2::AbortOutcome::Refused(s2mmu_el2::Refusal::NoSlot)
        );
        // The backing is free for a new slot.
        h.ok(Op::MemslotSet, &S1);
    }
}
