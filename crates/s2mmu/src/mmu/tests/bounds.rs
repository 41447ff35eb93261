//! Handles branded to their MMU, and every size or count a caller passes
//! checked before anything changes: each bad call is a typed error with
//! the state as it was, never an abort, a panic, a hang or someone else's
//! state changed.

use super::super::*;
use super::{ept_mmu, region};
use crate::format::arm64::{Arm64Stage2, Granule};
use crate::format::ept::EptStage2;
use crate::memslot::{MemslotConfig, MemslotError, TreeMemslots};
use crate::tlb::NoTlb;
use crate::{Gpa, HostMmOps, Hva};

type TestMmu = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;

const GPA: u64 = 1 << 30;
/// Host addresses only recorded in the table, never touched.
const HVA: u64 = 0x7000_0000_0000;

fn mmu(policy: MmuPolicy) -> Result<TestMmu> {
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let mm = HostMmOps::new(4096).unwrap();
    let store = TreeMemslots::with_config(super::tests::slot_config());
    Mmu::new(fmt, mm, Arc::new(NoTlb), store, policy)
}

fn logged(m: &TestMmu) {
    let r = region(0, SlotFlags::LOG_DIRTY_PAGES, GPA);
    m.set_memory_region(&r, 4096).unwrap();
}

#[test]
fn a_view_of_another_mmu_is_refused_and_changes_nothing() {
    let (a, b) = (
        mmu(MmuPolicy::default()).unwrap(),
        mmu(MmuPolicy::default()).unwrap(),
    );
    logged(&a);
    logged(&b);
    let va = a.open_dirty_view(0).unwrap();
    let vb = b.open_dirty_view(0).unwrap();
    assert_eq!(va.id(), vb.id(), "ids overlap across MMUs");
    let mut bm = vec![0u64; 4];
    let foreign = Err(Error::ForeignDirtyView { view: va.id() });
    assert_eq!(b.get_dirty_view(va, &mut bm), foreign);
    assert_eq!(b.clear_dirty_view(va, 0, 256, &bm), foreign.map(|_| 0));
    assert_eq!(b.dirty_view_stats(va).map(|_| ()), foreign.map(|_| ()));
    assert_eq!(b.close_dirty_view(va), foreign.map(|_| ()));
    assert_eq!(b.dirty_views_open(0), 1, "b's own view is still open");
    assert_eq!(b.get_dirty_view(vb, &mut bm), Ok(256), "and all dirty");
    b.close_dirty_view(vb).unwrap();
    a.close_dirty_view(va).unwrap();
}

#[test]
fn a_pml_log_refuses_the_reader_of_another_mmu() {
    let policy = MmuPolicy {
        dirty: DirtyMode::PML,
        ..MmuPolicy::default()
    };
    let (a, b) = (ept_mmu(policy), ept_mmu(policy));
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 1 << 20, Hva::new(HVA));
    b.set_memory_region(&r, 4096).unwrap();
    let mut vb = b.new_vcpu().unwrap();
    b.handle_fault(&mut vb, Gpa::new(GPA), true).unwrap();
    b.enable_dirty_logging(0).unwrap();
    let before = b.reader().translate(GPA).unwrap().pte;
    let va = a.new_vcpu().unwrap();
    let log = va.pml().unwrap();
    assert_eq!(
        log.hw_write(&b.reader(), GPA),
        Err(PmlWriteError::ForeignReader)
    );
    assert_eq!(
        b.reader().translate(GPA).unwrap().pte,
        before,
        "leaf as it was"
    );
    assert!(log.is_empty());
    // Its own MMU's reader is accepted (nothing mapped there).
    assert_eq!(log.hw_write(&a.reader(), GPA), Ok(None));
}

#[test]
fn vcpus_are_limited_and_get_no_ring_without_rings() {
    let m = mmu(MmuPolicy {
        reader_slots: 0,
        ..MmuPolicy::default()
    })
    .unwrap();
    let vcpus: Vec<_> = (0..MAX_VCPUS).map(|_| m.new_vcpu().unwrap()).collect();
    assert!(
        vcpus.iter().all(|v| v.ring.is_none()),
        "bitmap mode: no ring"
    );
    assert!(
        matches!(m.strategy, Strategy::WriteProtect(_)),
        "and the MMU has no ring list at all"
    );
    assert_eq!(
        m.new_vcpu().map(|_| ()),
        Err(Error::TooManyVcpus { limit: MAX_VCPUS })
    );
    let rings = mmu(MmuPolicy {
        dirty: DirtyMode::Ring { entries: 256 },
        ..MmuPolicy::default()
    })
    .unwrap();
    assert!(rings.new_vcpu().unwrap().ring.is_some());
}

#[test]
fn absurd_policies_are_refused() {
    for slots in [usize::MAX, 1 << 40, MAX_VCPUS + 1] {
        let r = mmu(MmuPolicy {
            reader_slots: slots,
            ..MmuPolicy::default()
        });
        assert!(
            matches!(r, Err(Error::InvalidConfig { .. })),
            "{slots} reader slots"
        );
    }
    for chunk in [1u64 << 63, MAX_EAGER_SPLIT_CHUNK * 2] {
        let r = mmu(MmuPolicy {
            eager_split_chunk: Some(chunk),
            ..MmuPolicy::default()
        });
        assert!(
            matches!(r, Err(Error::InvalidConfig { .. })),
            "chunk {chunk:#x}"
        );
    }
    assert!(mmu(MmuPolicy {
        reader_slots: MAX_VCPUS,
        eager_split_chunk: Some(MAX_EAGER_SPLIT_CHUNK),
        ..MmuPolicy::default()
    })
    .is_ok());
    // The lock alone caps its slots instead of allocating them.
    let l = lock::MmuLock::new((), usize::MAX);
    assert_eq!(l.slot_for(MAX_VCPUS - 1), Some(MAX_VCPUS - 1));
    assert_eq!(l.slot_for(MAX_VCPUS), None);
}

/// A logged slot whose bitmap cannot be allocated (2^45 pages: 4 TiB of
/// bitmap, with the store's page limit lifted) is refused with nothing
/// changed.
#[test]
fn a_bitmap_too_big_to_allocate_is_an_error() {
    let config = MemslotConfig {
        max_npages: u64::MAX,
        ..super::tests::slot_config()
    };
    let m = Mmu::new(
        EptStage2::new(5).unwrap(),
        HostMmOps::new(4096).unwrap(),
        Arc::new(NoTlb),
        TreeMemslots::with_config(config),
        MmuPolicy::default(),
    )
    .unwrap();
    let r = UserMemoryRegion::new(
        0,
        SlotFlags::LOG_DIRTY_PAGES,
        Gpa::new(0),
        1 << 57,
        Hva::new(0),
    );
    assert_eq!(m.set_memory_region(&r, 4096), Err(Error::OutOfMemory));
    assert!(m.slots().snapshot().id_to_slot(0).is_none());
}

#[test]
fn a_huge_top_up_fails_at_once() {
    let mut cache = PageCache::new(HostMmOps::new(4096).unwrap());
    for n in [usize::MAX, 1 << 40] {
        assert_eq!(cache.top_up(n), Err(Error::OutOfMemory));
        assert_eq!(cache.len(), 0, "nothing taken");
    }
    cache.top_up(3).unwrap();
    assert_eq!(cache.len(), 3);
}

/// The count of table pages a map needs is computed per level, not per
/// child entry: 2^52 bytes of pages with an empty cache is refused with
/// the exact count (it took 20 to 40 s when every child was visited).
#[test]
fn a_huge_map_with_an_empty_cache_says_what_it_needs() {
    let mm = HostMmOps::new(4096).unwrap();
    let mut pt = PageTable::new(EptStage2::new(5).unwrap(), mm.clone(), Arc::new(NoTlb)).unwrap();
    let mut cache = PageCache::new(mm);
    let opts = MapOptions { force_pages: true };
    let size = 1u64 << 52;
    let r = pt.map(0, size, 0, Prot::RW, &mut cache, opts);
    // 16 entries of the root's 2^48 bytes each: a table at each of the
    // four levels below it, for each entry of the level above.
    let per_root_entry: usize = 1 + 512 + 512 * 512 + 512 * 512 * 512;
    assert_eq!(
        r,
        Err(Error::CacheExhausted {
            needed: 16 * per_root_entry,
            available: 0
        })
    );
    // A ragged range gets its partial children counted too.
    let r = pt.map(4096, (2 << 20) + 4096, 4096, Prot::RW, &mut cache, opts);
    // One table per level down to level 3, and two last-level tables.
    assert!(
        matches!(r, Err(Error::CacheExhausted { needed: 5, .. })),
        "{r:?}"
    );
}

#[test]
fn a_memslot_change_while_holding_a_snapshot_is_refused() {
    let m = mmu(MmuPolicy::default()).unwrap();
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 1 << 20, Hva::new(HVA));
    let snap = m.slots().snapshot();
    assert_eq!(
        m.set_memory_region(&r, 4096),
        Err(Error::Memslot(MemslotError::SnapshotHeld))
    );
    assert!(snap.id_to_slot(0).is_none());
    drop(snap);
    assert!(m.slots().snapshot().id_to_slot(0).is_none(), "unchanged");
    m.set_memory_region(&r, 4096).unwrap();
    // A snapshot of another store does not count.
    let other = mmu(MmuPolicy::default()).unwrap();
    let snap = other.slots().snapshot();
    let moved = region(0, SlotFlags::NONE, GPA << 1);
    m.set_memory_region(&moved, 4096).unwrap();
    drop(snap);
}

#[test]
fn dirty_pages_checks_every_page_before_touching_any() {
    let m = mmu(MmuPolicy::default()).unwrap();
    logged(&m);
    let mut v = m.new_vcpu().unwrap();
    m.handle_fault(&mut v, Gpa::new(GPA + 4096), false).unwrap();
    let e = m.dirty_pages(0, [1, 1 << 40]);
    assert_eq!(
        e,
        Err(Error::OutsideSlot {
            slot: 0,
            first_page: 1 << 40,
            pages: 1,
            slot_pages: 256
        })
    );
    let text = e.unwrap_err().to_string();
    assert!(text.contains("memslot 0 of 256 pages"), "{text}");
    let mut bm = vec![0u64; 4];
    assert_eq!(m.get_dirty_log(0, &mut bm), Ok(0), "page 1 untouched");
    assert!(!m
        .reader()
        .translate(GPA + 4096)
        .unwrap()
        .prot
        .contains(Prot::W));
    assert_eq!(m.dirty_pages(0, [1]), Ok(1));
}
