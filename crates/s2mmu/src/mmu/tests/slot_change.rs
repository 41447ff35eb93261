//! Every dirty mark survives every memslot change, in every dirty mode and
//! both formats: a page written before a move is reported after it (the
//! slot's log moves with the slot, as KVM's bitmap does), and a page written
//! after a move, a delete and re-create or a logging restart is reported
//! (no stale state of the old slot hides it). A delete ends the slot's log
//! (KVM frees its bitmap), and turning logging off discards it, so only the
//! move carries the earlier write.

use super::super::*;
use crate::format::arm64::{Arm64Stage2, Granule};
use crate::format::ept::EptStage2;
use crate::memslot::TreeMemslots;
use crate::tlb::NoTlb;
use crate::{Gpa, HostMmOps, Hva};
use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::String;

const GPA: u64 = 1 << 30;
const MOVED: u64 = 2 << 30;
const SIZE: u64 = 4 << 20;
/// Host addresses only recorded in the table, never touched.
const HVA: u64 = 0x7000_0000_0000;
/// The page written before the change, and the one written after it.
const BEFORE: u64 = 3;
const AFTER: u64 = 700;

#[derive(Clone, Copy, Debug)]
enum Change {
    /// Moved to another guest address, logging kept.
    Move,
    /// Deleted, then created again where it was, logging.
    DeleteRecreate,
    /// Logging turned off and on again (flags changes).
    LoggingRestart,
}

fn modes() -> [(&'static str, MmuPolicy); 5] {
    let p = MmuPolicy::default();
    [
        (
            "write protection",
            MmuPolicy {
                dirty: DirtyMode::Bitmap {
                    protect: Protect::OnGet,
                },
                ..p
            },
        ),
        (
            "manual protect",
            MmuPolicy {
                dirty: DirtyMode::WP,
                ..p
            },
        ),
        (
            "ring",
            MmuPolicy {
                dirty: DirtyMode::Ring { entries: 256 },
                ..p
            },
        ),
        (
            "hardware",
            MmuPolicy {
                dirty: DirtyMode::HW,
                ..p
            },
        ),
        (
            "pml",
            MmuPolicy {
                dirty: DirtyMode::PML,
                ..p
            },
        ),
    ]
}

fn region(gpa: u64, size: u64, logging: bool) -> UserMemoryRegion {
    let flags = if logging {
        SlotFlags::LOG_DIRTY_PAGES
    } else {
        SlotFlags::NONE
    };
    UserMemoryRegion::new(0, flags, Gpa::new(gpa), size, Hva::new(HVA))
}

/// A guest write to `gpa` as the mode's CPU makes it, after a read: a
/// write fault where the leaf refuses it, else the hardware's dirty update (logged to the
/// vCPU's PML log with PML).
/// `tracked`: the page is mapped tracked and clean, so in the hardware
/// modes the write must be the hardware's.
fn write<F: PteFormat>(
    m: &Mmu<F, HostMmOps, TreeMemslots>,
    v: &mut VcpuMmu<HostMmOps>,
    gpa: u64,
    tracked: bool,
) {
    let reader = m.reader();
    for _ in 0..4 {
        let t = match (m.policy.dirty.hardware(), v.pml().cloned()) {
            (true, Some(log)) => match log.hw_write(&reader, gpa) {
                Ok(t) => t,
                Err(e) => {
                    assert_eq!(e, PmlWriteError::Full);
                    m.flush_pml(v).unwrap();
                    continue;
                }
            },
            (true, None) => reader.hw_dirty_update(gpa),
            (false, _) => reader.translate(gpa),
        };
        if t.is_some_and(|t| t.prot.contains(Prot::W)) {
            return;
        }
        assert!(
            !(m.policy.dirty.hardware() && tracked),
            "a mapped page of a logged slot takes the hardware's write"
        );
        // A page not mapped yet is mapped by a read first, so the write
        // is the hardware's where the mode has it (a write fault would
        // mark the page itself).
        m.handle_fault(v, Gpa::new(gpa), t.is_some()).unwrap();
    }
    panic!("the write to {gpa:#x} never completed");
}

/// The pages of slot 0 its log reports.
fn harvest<F: PteFormat>(m: &Mmu<F, HostMmOps, TreeMemslots>) -> BTreeSet<u64> {
    if m.policy.dirty.ring_entries().is_some() {
        let mut out = Vec::new();
        m.harvest_rings(&mut out).unwrap();
        return out.iter().map(|g| g.offset).collect();
    }
    let mut bm = vec![0u64; (SIZE >> 12) as usize / 64];
    m.get_dirty_log(0, &mut bm).unwrap();
    (0..SIZE >> 12)
        .filter(|&p| bm[(p / 64) as usize] & (1 << (p % 64)) != 0)
        .collect()
}

/// Runs one case; returns what went wrong, if anything.
fn case<F: PteFormat>(fmt: F, policy: MmuPolicy, change: Change) -> Option<String> {
    let mm = HostMmOps::new(4096).unwrap();
    let store = TreeMemslots::with_config(super::tests::slot_config());
    let m = Mmu::new(fmt, mm, Arc::new(NoTlb), store, policy).unwrap();
    m.set_memory_region(&region(GPA, SIZE, false), 4096)
        .unwrap();
    let mut v = m.new_vcpu().unwrap();
    // Both pages mapped before logging starts, which makes them tracked
    // and clean in the hardware modes (faults map logged pages as write
    // protection does).
    for p in [BEFORE, AFTER] {
        m.handle_fault(&mut v, Gpa::new(GPA + p * 4096), true)
            .unwrap();
    }
    m.enable_dirty_logging(0).unwrap();
    // A first harvest, so only the writes below are dirty.
    harvest(&m);
    if policy.dirty.manual_protect() {
        let all = vec![u64::MAX; (SIZE >> 12) as usize / 64];
        m.clear_dirty_log(0, 0, SIZE >> 12, &all).unwrap();
    }
    write(&m, &mut v, GPA + BEFORE * 4096, true);
    let now = match change {
        Change::Move => {
            m.set_memory_region(&region(MOVED, SIZE, true), 4096)
                .unwrap();
            MOVED
        }
        Change::DeleteRecreate => {
            m.set_memory_region(&region(GPA, 0, true), 4096).unwrap();
            m.set_memory_region(&region(GPA, SIZE, true), 4096).unwrap();
            GPA
        }
        Change::LoggingRestart => {
            m.disable_dirty_logging(0).unwrap();
            m.enable_dirty_logging(0).unwrap();
            GPA
        }
    };
    write(&m, &mut v, now + AFTER * 4096, false);
    let got = harvest(&m);
    let mut want = alloc::vec![AFTER];
    if matches!(change, Change::Move) {
        want.push(BEFORE);
    }
    let missing: Vec<u64> = want.into_iter().filter(|p| !got.contains(p)).collect();
    (!missing.is_empty()).then(|| format!("pages {missing:?} missing (reported {got:?})"))
}

#[test]
fn every_mark_survives_every_slot_change_in_every_mode() {
    let mut failures = Vec::new();
    for (name, policy) in modes() {
        for change in [Change::Move, Change::DeleteRecreate, Change::LoggingRestart] {
            let arm = case(Arm64Stage2::new(Granule::K4, 40).unwrap(), policy, change);
            let ept = case(EptStage2::new(4).unwrap(), policy, change);
            for (fmt, r) in [("arm64", arm), ("ept", ept)] {
                if let Some(why) = r {
                    failures.push(format!("{fmt} {name} {change:?}: {why}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
