//! Unit tests of dirty views on the facade: several consumers of one
//! slot, one write protection.

use super::super::*;
use super::{hw_policy, region};
use crate::dirty::MAX_DIRTY_VIEWS_PER_SLOT;
use crate::format::arm64::{Arm64Stage2, Granule};
use crate::memslot::TreeMemslots;
use crate::tlb::NoTlb;
use crate::{Gpa, HostMmOps, Hva};

type TestMmu = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;

const GPA: u64 = 1 << 30;
const HVA: u64 = 0x7000_0000_0000;
const PAGES: u64 = 256;

/// A logged slot of `PAGES` pages, every page mapped and protected.
fn logged(policy: MmuPolicy) -> TestMmu {
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let mm = HostMmOps::new(4096).unwrap();
    let store = TreeMemslots::with_config(super::tests::slot_config());
    let m = Mmu::new(fmt, mm, Arc::new(NoTlb), store, policy).unwrap();
    let r = UserMemoryRegion::new(
        0,
        SlotFlags::NONE,
        Gpa::new(GPA),
        PAGES * 4096,
        Hva::new(HVA),
    );
    m.set_memory_region(&r, 4096).unwrap();
    m.populate(0, 0, PAGES).unwrap();
    m.enable_dirty_logging(0).unwrap();
    m
}

fn pages_of(bm: &[u64]) -> Vec<u64> {
    (0..PAGES)
        .filter(|p| bm[(p / 64) as usize] & (1 << (p % 64)) != 0)
        .collect()
}

/// GET then CLEAR of what GET returned, on a view; the pages reported.
fn harvest_view(m: &TestMmu, v: DirtyView) -> Vec<u64> {
    let mut bm = vec![0u64; 4];
    m.get_dirty_view(v, &mut bm).unwrap();
    m.clear_dirty_view(v, 0, PAGES, &bm).unwrap();
    pages_of(&bm)
}

/// The same on the slot's own log.
fn harvest_log(m: &TestMmu) -> Vec<u64> {
    let mut bm = vec![0u64; 4];
    m.get_dirty_log(0, &mut bm).unwrap();
    m.clear_dirty_log(0, 0, PAGES, &bm).unwrap();
    pages_of(&bm)
}

#[test]
fn every_consumer_sees_every_write_whoever_clears_first() {
    let m = logged(MmuPolicy::default());
    let (a, b) = (m.open_dirty_view(0).unwrap(), m.open_dirty_view(0).unwrap());
    assert_eq!(
        harvest_view(&m, a).len(),
        PAGES as usize,
        "starts all dirty"
    );
    assert_eq!(harvest_view(&m, b).len(), PAGES as usize);
    assert!(harvest_log(&m).is_empty());
    m.dirty_pages(0, [1, 2, 200]).unwrap();
    assert_eq!(harvest_view(&m, a), vec![1, 2, 200]);
    m.dirty_pages(0, [2, 3]).unwrap();
    assert_eq!(harvest_view(&m, a), vec![2, 3]);
    assert_eq!(harvest_log(&m), vec![1, 2, 3, 200]);
    assert_eq!(harvest_view(&m, b), vec![1, 2, 3, 200]);
    for c in [harvest_view(&m, a), harvest_view(&m, b), harvest_log(&m)] {
        assert!(c.is_empty(), "nothing written since");
    }
    let sa = m.dirty_view_stats(a).unwrap();
    let sb = m.dirty_view_stats(b).unwrap();
    assert_eq!((sa.protected, sa.already_protected), (5, PAGES));
    // b's clear found every page protected by a's: no protect, no flush.
    assert_eq!((sb.protected, sb.flushes), (0, 0));
    assert_eq!(sb.reported, PAGES + 4);
}

/// Two consumers at different harvest periods: the guest takes one fault
/// per page written per protect cycle of the faster one, as with that
/// consumer alone.
#[test]
fn two_periods_cost_the_faults_of_one_consumer() {
    let faults = |views: usize| {
        let m = logged(MmuPolicy::default());
        let v: Vec<_> = (0..views).map(|_| m.open_dirty_view(0).unwrap()).collect();
        v.iter().for_each(|&v| drop(harvest_view(&m, v)));
        let mut faults = 0;
        for tick in 0..12 {
            faults += m.dirty_pages(0, (0..PAGES).step_by(3)).unwrap();
            assert_eq!(harvest_view(&m, v[0]).len(), PAGES.div_ceil(3) as usize);
            if views > 1 && tick % 4 == 3 {
                assert_eq!(harvest_view(&m, v[1]).len(), PAGES.div_ceil(3) as usize);
            }
        }
        if views > 1 {
            let s = m.dirty_view_stats(v[1]).unwrap();
            assert_eq!((s.protected, s.flushes), (0, 0), "nothing left to protect");
        }
        faults
    };
    assert_eq!(faults(1), 12 * PAGES.div_ceil(3));
    assert_eq!(faults(2), faults(1));
}

/// A page written between two consumers' clears is protected by the
/// second clear (it is writable again) and reaches the first at its next
/// harvest.
#[test]
fn a_write_between_two_clears_is_protected_and_reported() {
    let m = logged(MmuPolicy::default());
    let (a, b) = (m.open_dirty_view(0).unwrap(), m.open_dirty_view(0).unwrap());
    harvest_view(&m, a);
    harvest_view(&m, b);
    m.dirty_pages(0, [1]).unwrap();
    assert_eq!(harvest_view(&m, a), vec![1]);
    m.dirty_pages(0, [1, 2]).unwrap();
    assert_eq!(harvest_view(&m, b), vec![1, 2]);
    assert_eq!(m.dirty_view_stats(b).unwrap().protected, 2);
    assert_eq!(m.dirty_pages(0, [1, 2]).unwrap(), 2, "both protected again");
    assert_eq!(harvest_view(&m, a), vec![1, 2]);
    assert_eq!(harvest_view(&m, b), vec![1, 2]);
}

#[test]
fn the_slots_log_is_unchanged_after_views_close() {
    let m = logged(MmuPolicy::default());
    m.dirty_pages(0, [5]).unwrap();
    let v = m.open_dirty_view(0).unwrap();
    m.dirty_pages(0, [6]).unwrap();
    assert_eq!(m.dirty_views_open(0), 1);
    m.close_dirty_view(v).unwrap();
    assert_eq!(m.dirty_views_open(0), 0, "closing frees its state");
    assert_eq!(m.views.lock().len(), 0);
    assert_eq!(m.views_open.load(Ordering::Relaxed), 0);
    assert_eq!(
        m.dirty_view_stats(v),
        Err(Error::UnknownDirtyView { view: v.id() })
    );
    assert_eq!(
        m.close_dirty_view(v),
        Err(Error::UnknownDirtyView { view: v.id() })
    );
    assert_eq!(harvest_log(&m), vec![5, 6]);
    m.dirty_pages(0, [7]).unwrap();
    assert_eq!(harvest_log(&m), vec![7]);
}

#[test]
fn legacy_get_without_manual_protect_takes_and_protects_beside_views() {
    let m = logged(MmuPolicy {
        dirty: DirtyMode::Bitmap {
            protect: Protect::OnGet,
        },
        ..MmuPolicy::default()
    });
    let v = m.open_dirty_view(0).unwrap();
    harvest_view(&m, v);
    m.dirty_pages(0, [9, 10]).unwrap();
    let mut bm = vec![0u64; 4];
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 2);
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0, "taken");
    assert_eq!(harvest_view(&m, v), vec![9, 10]);
    assert_eq!(
        m.dirty_pages(0, [9]).unwrap(),
        1,
        "protected again: a fault"
    );
}

#[test]
fn stopping_logging_closes_the_views() {
    let m = logged(MmuPolicy::default());
    let v = m.open_dirty_view(0).unwrap();
    m.disable_dirty_logging(0).unwrap();
    assert_eq!(m.dirty_views_open(0), 0);
    let mut bm = vec![0u64; 4];
    assert_eq!(
        m.get_dirty_view(v, &mut bm),
        Err(Error::UnknownDirtyView { view: v.id() })
    );
    m.enable_dirty_logging(0).unwrap();
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0);
}

#[test]
fn bad_calls_are_typed_errors_and_change_nothing() {
    let m = logged(MmuPolicy::default());
    assert_eq!(m.open_dirty_view(3), Err(Error::NoSuchSlot { slot: 3 }));
    let v = m.open_dirty_view(0).unwrap();
    let mut small = vec![0u64; 3];
    assert!(matches!(
        m.get_dirty_view(v, &mut small),
        Err(Error::BitmapTooSmall { .. })
    ));
    assert!(matches!(
        m.clear_dirty_view(v, 1, 64, &[u64::MAX]),
        Err(Error::ClearNotAligned { .. })
    ));
    assert!(matches!(
        m.clear_dirty_view(v, 0, PAGES + 64, &[u64::MAX; 5]),
        Err(Error::ClearBadRange { .. })
    ));
    assert_eq!(m.dirty_view_stats(v).unwrap().cleared, 0);
    for _ in 1..MAX_DIRTY_VIEWS_PER_SLOT {
        m.open_dirty_view(0).unwrap();
    }
    assert!(matches!(
        m.open_dirty_view(0),
        Err(Error::TooManyDirtyViews { .. })
    ));
    let off = region(1, SlotFlags::NONE, GPA << 1);
    m.set_memory_region(&off, 4096).unwrap();
    assert_eq!(
        m.open_dirty_view(1),
        Err(Error::LoggingDisabled { slot: 1 })
    );
}

#[test]
fn rings_have_no_bitmap_to_view() {
    let m = logged(MmuPolicy {
        dirty: DirtyMode::Ring { entries: 256 },
        ..MmuPolicy::default()
    });
    assert!(matches!(
        m.open_dirty_view(0),
        Err(Error::WrongDirtyMode { .. })
    ));
}

/// Hardware dirty state: the hardware's writes are scanned into every
/// view, and a clean by one consumer needs none by the other.
#[test]
fn hardware_dirty_state_feeds_every_view() {
    let m = logged(hw_policy());
    let (a, b) = (m.open_dirty_view(0).unwrap(), m.open_dirty_view(0).unwrap());
    harvest_view(&m, a);
    harvest_view(&m, b);
    // The hardware's update of pages 4 and 100.
    for p in [4u64, 100] {
        m.reader().hw_dirty_update(GPA + p * 4096).unwrap();
    }
    assert_eq!(harvest_view(&m, a), vec![4, 100]);
    assert_eq!(harvest_view(&m, b), vec![4, 100]);
    assert_eq!(m.dirty_view_stats(b).unwrap().protected, 0);
    assert!(harvest_view(&m, a).is_empty(), "cleaned by a's clear");
}

/// Several views cleared at once: each page protected once for all of
/// them, each view's bits cleared, one slot per call.
#[test]
fn a_joint_clear_protects_once_for_every_view() {
    let m = logged(MmuPolicy::default());
    let (a, b) = (m.open_dirty_view(0).unwrap(), m.open_dirty_view(0).unwrap());
    let full = [u64::MAX; 4];
    assert_eq!(
        m.clear_dirty_views(0, PAGES, &[(a, &full[..]), (b, &full[..])]),
        Ok(vec![PAGES, PAGES])
    );
    m.dirty_pages(0, [8, 9]).unwrap();
    let (mut ba, mut bb) = (vec![0u64; 4], vec![0u64; 4]);
    m.get_dirty_view(a, &mut ba).unwrap();
    m.get_dirty_view(b, &mut bb).unwrap();
    assert_eq!(
        m.clear_dirty_views(0, PAGES, &[(a, &ba[..]), (b, &bb[..])]),
        Ok(vec![2, 2])
    );
    let (sa, sb) = (
        m.dirty_view_stats(a).unwrap(),
        m.dirty_view_stats(b).unwrap(),
    );
    assert_eq!((sa.protected, sb.protected), (2, 0));
    assert_eq!((sa.flushes, sb.flushes), (1, 0));
    assert_eq!(m.dirty_pages(0, [8, 9]).unwrap(), 2, "protected again");
    let small = [0u64; 3];
    assert!(matches!(
        m.clear_dirty_views(0, PAGES, &[(a, &full[..]), (b, &small[..])]),
        Err(Error::BitmapTooSmall { .. })
    ));
    assert_eq!(
        m.dirty_view_stats(a).unwrap().cleared,
        PAGES + 2,
        "nothing cleared"
    );
    let r = UserMemoryRegion::new(
        1,
        SlotFlags::LOG_DIRTY_PAGES,
        Gpa::new(GPA << 1),
        PAGES * 4096,
        Hva::new(HVA),
    );
    m.set_memory_region(&r, 4096).unwrap();
    let c = m.open_dirty_view(1).unwrap();
    assert_eq!(
        m.clear_dirty_views(0, PAGES, &[(a, &full[..]), (c, &full[..])]),
        Err(Error::DirtyViewsOfSeveralSlots { slot: 0, other: 1 })
    );
    assert_eq!(m.clear_dirty_views(0, PAGES, &[]), Ok(vec![]));
}
