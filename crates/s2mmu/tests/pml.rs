//! x86 Page-Modification Logging (`DirtyMode::Pml`): the simulated CPU's
//! log, its "log-full" exit, the flush into the bitmap, and a harvest that
//! reads the logs and not the leaves.

use s2mmu::format::ept::{EptStage2, DIRTY};
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{DirtyMode, Mmu, MmuPolicy, PmlWriteError, Protect, PML_LOG_ENTRIES};
use s2mmu::{Gpa, HostMmOps, Hva, NoTlb};
use std::sync::Arc;

const GPA: u64 = 1 << 30;
/// Host addresses only recorded in the table, never touched.
const HVA: u64 = 0x7000_0000_0000;
/// 4 MiB: 1024 pages, two logs' worth.
const SIZE: u64 = 4 << 20;
const PAGES: u64 = SIZE / 4096;

type EptMmu = Mmu<EptStage2, HostMmOps, TreeMemslots>;

fn logged_mmu(dirty: DirtyMode, manual_protect: bool) -> EptMmu {
    let m = Mmu::new(
        EptStage2::new(4).unwrap(),
        HostMmOps::new(4096).unwrap(),
        Arc::new(NoTlb),
        TreeMemslots::new(),
        MmuPolicy {
            dirty: dirty.with_protect(Protect::manual_if(manual_protect)),
            ..MmuPolicy::default()
        },
    )
    .unwrap();
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), SIZE, Hva::new(HVA));
    m.set_memory_region(&r, 2 << 20).unwrap();
    let mut v = m.new_vcpu().unwrap();
    for b in 0..SIZE / (2 << 20) {
        m.handle_fault(&mut v, s2mmu::Gpa::new(GPA + b * (2 << 20)), true)
            .unwrap();
    }
    m.enable_dirty_logging(0).unwrap();
    m
}

fn bits(bm: &[u64]) -> Vec<u64> {
    let mut v = Vec::new();
    for (w, &word) in bm.iter().enumerate() {
        for b in 0..64 {
            if word >> b & 1 == 1 {
                v.push(w as u64 * 64 + b);
            }
        }
    }
    v
}

#[test]
fn a_full_log_exits_before_the_write_and_the_flush_records_every_entry() {
    let m = logged_mmu(DirtyMode::PML, false);
    let mut v = m.new_vcpu().unwrap();
    let log = v.pml().expect("a PML vCPU has a log").clone();
    let reader = m.reader();
    // Pages written in a scattered order: the log records them as written.
    let order: Vec<u64> = (0..PML_LOG_ENTRIES as u64 + 1)
        .map(|i| (i * 7) % PAGES)
        .collect();
    for &p in &order[..PML_LOG_ENTRIES] {
        let t = log.hw_write(&reader, GPA + p * 4096 + 8).unwrap().unwrap();
        assert_eq!(t.pte & DIRTY, DIRTY);
    }
    assert_eq!(log.len(), PML_LOG_ENTRIES);
    // A write to a page already dirty logs nothing and needs no room.
    assert!(log.hw_write(&reader, GPA + order[3] * 4096).is_ok());
    // The 513th page: the log-full exit, before the flag is set.
    let next = GPA + order[PML_LOG_ENTRIES] * 4096;
    assert_eq!(log.hw_write(&reader, next), Err(PmlWriteError::Full));
    assert_eq!(
        reader.translate(next).unwrap().pte & DIRTY,
        0,
        "no flag set"
    );
    assert_eq!(m.flush_pml(&mut v).unwrap(), PML_LOG_ENTRIES);
    assert_eq!(v.stats.pml_entries, PML_LOG_ENTRIES as u64);
    assert!(log.is_empty());
    assert!(log.hw_write(&reader, next).unwrap().is_some(), "the retry");
    assert_eq!(log.len(), 1);
    // The harvest flushes the rest itself and reports each page once.
    let mut bm = vec![0u64; (PAGES / 64) as usize];
    assert_eq!(
        m.get_dirty_log(0, &mut bm).unwrap(),
        PML_LOG_ENTRIES as u64 + 1
    );
    let mut want = order.clone();
    want.sort_unstable();
    assert_eq!(bits(&bm), want);
    // GET without manual protect cleaned the flags: the next write logs
    // again, and a page not written since is not reported.
    assert_eq!(reader.translate(next).unwrap().pte & DIRTY, 0, "cleaned");
    log.hw_write(&reader, next).unwrap();
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 1);
    assert_eq!(bits(&bm), vec![order[PML_LOG_ENTRIES]]);
    assert_eq!(v.stats.permission + v.stats.translation, 0, "no fault");
}

#[test]
fn the_pml_harvest_reads_the_logs_not_the_leaves() {
    // A dirty flag set without a log entry (a CPU that did not log it):
    // the scan of the hardware mode finds it, the PML harvest does not,
    // which shows it reads no leaf. Its clean on CLEAR still works.
    for (dirty, found) in [(DirtyMode::HW, 1), (DirtyMode::PML, 0)] {
        let m = logged_mmu(dirty, true);
        let reader = m.reader();
        reader.hw_dirty_update(GPA + 42 * 4096).unwrap();
        let mut bm = vec![0u64; (PAGES / 64) as usize];
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), found, "{dirty:?}");
    }
}

#[test]
fn clear_cleans_the_logged_pages_so_the_next_write_logs_again() {
    let m = logged_mmu(DirtyMode::PML, true);
    let mut v = m.new_vcpu().unwrap();
    let log = v.pml().unwrap().clone();
    let reader = m.reader();
    let mut bm = vec![0u64; (PAGES / 64) as usize];
    for round in 0..3u64 {
        for p in [1u64, 64, 65, 1023 - round] {
            log.hw_write(&reader, GPA + p * 4096).unwrap();
        }
        assert_eq!(log.len(), 4, "round {round}: each write logged again");
        assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 4);
        assert_eq!(bits(&bm), vec![1, 64, 65, 1023 - round]);
        assert_eq!(m.clear_dirty_log(0, 0, PAGES, &bm).unwrap(), 4);
        for p in [1u64, 64, 65] {
            assert_eq!(reader.translate(GPA + p * 4096).unwrap().pte & DIRTY, 0);
        }
    }
    assert_eq!(m.flush_pml(&mut v).unwrap(), 0, "the harvests emptied it");
}

#[test]
fn a_vcpu_of_another_mmu_is_refused() {
    let a = logged_mmu(DirtyMode::PML, true);
    let b = logged_mmu(DirtyMode::PML, true);
    let mut v = b.new_vcpu().unwrap();
    assert!(matches!(
        a.flush_pml(&mut v),
        Err(s2mmu::Error::ForeignVcpu { .. })
    ));
    let m = logged_mmu(DirtyMode::HW, true);
    assert!(m.new_vcpu().unwrap().pml().is_none(), "no log without PML");
}
