//! Unit tests of the facade.

mod bounds;
mod slot_change;
mod unchanged;
mod views;

use super::*;
use crate::format::arm64::{Arm64Stage2, Granule};
use crate::memslot::{MemslotConfig, TreeMemslots};
use crate::tlb::{LargeRangePolicy, NoTlb};
use crate::{Gpa, HostMmOps, Hva};

type TestMmu = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;

const GPA: u64 = 1 << 30;
/// Host addresses only recorded in the table, never touched.
const HVA: u64 = 0x7000_0000_0000;

/// The memslot store's settings for the facade's tests: KVM's, but under
/// Miri 64 slot ids instead of 32,764. The MMU keeps a side entry per id,
/// and Miri took minutes to build and drop them in every test.
pub(super) fn slot_config() -> MemslotConfig {
    let mut c = MemslotConfig::default();
    if cfg!(miri) {
        c.max_user_slots = 64;
    }
    c
}

fn mmu(policy: MmuPolicy) -> TestMmu {
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let mm = HostMmOps::new(4096).unwrap();
    let store = TreeMemslots::with_config(slot_config());
    Mmu::new(fmt, mm, Arc::new(NoTlb), store, policy).unwrap()
}

/// A 1 MiB slot `id` at `gpa` with `flags`, backed at [`HVA`].
fn region(id: u16, flags: SlotFlags, gpa: u64) -> UserMemoryRegion {
    UserMemoryRegion::new(id, flags, Gpa::new(gpa), 1 << 20, Hva::new(HVA))
}

/// Adds slot 0, 4 MiB at [`GPA`] backed at [`HVA`] by host pages of
/// `host_page` bytes, and returns a new vCPU.
fn slot_4m<F: PteFormat, M: MmOps>(m: &Mmu<F, M, TreeMemslots>, host_page: u64) -> VcpuMmu<M> {
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 4 << 20, Hva::new(HVA));
    m.set_memory_region(&r, host_page).unwrap();
    m.new_vcpu().unwrap()
}

/// The default policy with hardware dirty state.
fn hw_policy() -> MmuPolicy {
    MmuPolicy {
        dirty: DirtyMode::HW,
        ..MmuPolicy::default()
    }
}

/// Maps slot 0 (2 MiB at [`GPA`]) with one 2 MiB block by a write fault,
/// then turns logging on; returns the vCPU and the leaves that now map
/// the slot.
fn block_then_logged<F: PteFormat>(
    m: &Mmu<F, HostMmOps, TreeMemslots>,
) -> (VcpuMmu<HostMmOps>, Vec<crate::Leaf>) {
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 2 << 20, Hva::new(HVA));
    m.set_memory_region(&r, 2 << 20).unwrap();
    let mut v = m.new_vcpu().unwrap();
    m.handle_fault(&mut v, Gpa::new(GPA), true).unwrap();
    assert_eq!(m.reader().translate(GPA).unwrap().size, 2 << 20);
    m.enable_dirty_logging(0).unwrap();
    (v, m.with_table(|pt| pt.leaves(GPA, 2 << 20)).unwrap())
}

/// An MMU over a 4-level EPT table with `policy`.
fn ept_mmu(policy: MmuPolicy) -> Mmu<crate::format::ept::EptStage2, HostMmOps, TreeMemslots> {
    Mmu::new(
        crate::format::ept::EptStage2::new(4).unwrap(),
        HostMmOps::new(4096).unwrap(),
        Arc::new(NoTlb),
        TreeMemslots::with_config(slot_config()),
        policy,
    )
    .unwrap()
}

#[test]
fn logged_region_with_bad_id_is_refused_not_a_panic() {
    let m = mmu(MmuPolicy::default());
    let id = m.slots().config().max_user_slots;
    let r = region(id, SlotFlags::LOG_DIRTY_PAGES, GPA);
    assert!(matches!(
        m.set_memory_region(&r, 4096),
        Err(Error::Memslot(_))
    ));
}

#[test]
fn logged_region_too_large_is_refused_before_any_bitmap() {
    let m = mmu(MmuPolicy::default());
    // 2^52 pages: a bitmap for it would be 512 TiB.
    let r = UserMemoryRegion::new(
        0,
        SlotFlags::LOG_DIRTY_PAGES,
        Gpa::new(0),
        1 << 63,
        Hva::new(0),
    );
    assert!(matches!(
        m.set_memory_region(&r, 4096),
        Err(Error::Memslot(_) | Error::OutOfRange { .. })
    ));
}

#[test]
fn a_slot_beyond_the_ipa_space_is_refused_at_creation() {
    let m = mmu(MmuPolicy::default());
    // 40-bit IPA space: the last MiB is fine, one more byte is not.
    let ok = UserMemoryRegion::new(
        0,
        SlotFlags::NONE,
        Gpa::new((1 << 40) - (1 << 20)),
        1 << 20,
        Hva::new(HVA),
    );
    m.set_memory_region(&ok, 4096).unwrap();
    let bad = UserMemoryRegion::new(
        1,
        SlotFlags::NONE,
        Gpa::new(1 << 40),
        1 << 20,
        Hva::new(HVA),
    );
    assert!(matches!(
        m.set_memory_region(&bad, 4096),
        Err(Error::OutOfRange { .. })
    ));
    assert!(
        m.slots().snapshot().id_to_slot(1).is_none(),
        "nothing was created"
    );
}

/// A move that turns logging off drops the bitmap like a flags change.
#[test]
fn a_move_that_stops_logging_drops_the_bitmap() {
    let m = mmu(MmuPolicy::default());
    let r = region(0, SlotFlags::LOG_DIRTY_PAGES, GPA);
    m.set_memory_region(&r, 4096).unwrap();
    let mut bm = vec![0u64; 4];
    m.get_dirty_log(0, &mut bm).unwrap();
    let moved = region(0, SlotFlags::NONE, GPA << 1);
    m.set_memory_region(&moved, 4096).unwrap();
    assert_eq!(
        m.get_dirty_log(0, &mut bm),
        Err(Error::LoggingDisabled { slot: 0 })
    );
}

/// Hardware dirty state: logged leaves are writable-clean, a write the
/// hardware records (write bit set, simulated here by relaxing the
/// leaf as the walker would) is found by GET, and CLEAR cleans it.
#[test]
fn hardware_dirty_state_is_scanned_and_cleaned() {
    use crate::format::arm64::{DBM, S2AP_W};
    let m = mmu(hw_policy());
    let (v, leaves) = block_then_logged(&m);
    assert_eq!(leaves.len(), 512, "split when logging starts");
    assert!(leaves.iter().all(|l| l.pte & (DBM | S2AP_W) == DBM));
    // The hardware's update of pages 3 and 300.
    for p in [3u64, 300] {
        m.reader().hw_dirty_update(GPA + p * 4096).unwrap();
    }
    let mut bm = vec![0u64; 8];
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 2);
    assert_eq!((bm[0], bm[4]), (1 << 3, 1 << (300 - 256)));
    assert_eq!(m.clear_dirty_log(0, 0, 512, &bm).unwrap(), 2);
    let t = m.reader().translate(GPA + 300 * 4096).unwrap();
    assert_eq!(t.pte & (DBM | S2AP_W), DBM, "cleaned: writable-clean again");
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0);
    assert_eq!(v.stats.permission, 0);
    // A hardware-dirtied leaf the host invalidates keeps its write in
    // the bitmap (found on QEMU: remapped pages lost their writes).
    m.reader().hw_dirty_update(GPA + 7 * 4096).unwrap();
    m.invalidate_hva_range_start(Hva::new(HVA + 7 * 4096), 4096)
        .unwrap();
    m.invalidate_hva_range_end(Hva::new(HVA + 7 * 4096), 4096)
        .unwrap();
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 1);
    assert_eq!(bm[0], 1 << 7);
}

/// The MMU notifier: an invalidated host range loses its stage-2
/// mappings (the whole block), faults on it retry until the end, then
/// map what backs it now.
#[test]
fn host_range_invalidation_unmaps_and_holds_faults() {
    let m = mmu(MmuPolicy::default());
    let mut v = slot_4m(&m, 2 << 20);
    m.handle_fault(&mut v, Gpa::new(GPA), true).unwrap();
    m.handle_fault(&mut v, Gpa::new(GPA + (2 << 20)), true)
        .unwrap();
    assert_eq!(
        m.invalidate_hva_range_start(Hva::new(HVA + 0x5000), 4096),
        Ok(1)
    );
    assert!(m.reader().translate(GPA).is_none(), "the whole block went");
    assert!(
        m.reader().translate(GPA + (2 << 20)).is_some(),
        "the other stayed"
    );
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(GPA + 0x5000), true),
        Ok(FaultOutcome::Retry)
    );
    // Pages of the block outside the range map again at once.
    m.handle_fault(&mut v, Gpa::new(GPA + 0x1000), true)
        .unwrap();
    assert!(
        m.invalidate_hva_range_end(Hva::new(HVA), 4096).is_err(),
        "not that range"
    );
    m.invalidate_hva_range_end(Hva::new(HVA + 0x5000), 4096)
        .unwrap();
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(GPA + 0x5000), true),
        Ok(FaultOutcome::Slow)
    );
    assert!(matches!(
        m.invalidate_hva_range_start(Hva::new(HVA), 0),
        Err(Error::EmptyRange { .. })
    ));
}

#[test]
fn a_vcpu_of_another_mmu_is_refused() {
    let a = mmu(MmuPolicy::default());
    let b = mmu(MmuPolicy::default());
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 1 << 20, Hva::new(HVA));
    b.set_memory_region(&r, 4096).unwrap();
    let mut va = a.new_vcpu().unwrap();
    assert_eq!(
        b.handle_fault(&mut va, Gpa::new(GPA), true),
        Err(Error::ForeignVcpu { vcpu: 0 })
    );
    assert!(b.reader().translate(GPA).is_none());
}

/// At the soft limit a fault changes nothing and says so: no page is
/// made writable that no ring would record.
#[test]
fn a_soft_full_ring_refuses_faults_before_any_change() {
    let m = mmu(MmuPolicy {
        dirty: DirtyMode::Ring { entries: 256 },
        ..MmuPolicy::default()
    });
    let mut v = slot_4m(&m, 4096);
    // More pages mapped than the ring has entries: every write below
    // takes the fast path until the ring is soft-full.
    for p in 0..300u64 {
        m.handle_fault(&mut v, Gpa::new(GPA + p * 4096), false)
            .unwrap();
    }
    m.enable_dirty_logging(0).unwrap();
    let mut p = 0u64;
    while !v.ring_soft_full() {
        m.handle_fault(&mut v, Gpa::new(GPA + p * 4096), true)
            .unwrap();
        p += 1;
    }
    assert!(m.ring_soft_full(0));
    let next = GPA + p * 4096;
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(next), true),
        Err(Error::RingFull { vcpu: 0 })
    );
    let t = m.reader().translate(next).unwrap();
    assert!(!t.prot.contains(Prot::W), "still write-protected");
    let mut out = Vec::new();
    assert_eq!(m.harvest_rings(&mut out).unwrap(), p as usize);
    m.reset_rings().unwrap();
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(next), true),
        Ok(FaultOutcome::Fast)
    );
}

/// A real abort reports the accessed byte, not the page: the block
/// choice must look at the page (found on QEMU's arm64, where every
/// read of word 1 of a page mapped 4 KiB instead of 2 MiB).
#[test]
fn a_fault_inside_a_page_still_maps_a_block() {
    let m = mmu(MmuPolicy::default());
    let mut v = slot_4m(&m, 2 << 20);
    m.handle_stage2_fault(
        &mut v,
        Gpa::new(GPA + 0x1008),
        false,
        FaultKind::Translation,
    )
    .unwrap();
    let t = m.reader().translate(GPA).unwrap();
    assert_eq!((t.size, t.pa), (2 << 20, HVA));
}

/// Output addresses come from the host-memory hook.
#[test]
fn output_addresses_come_from_the_host_memory_hook() {
    struct Offset;
    impl HostMemory for Offset {
        fn host_to_phys(&self, hva: Hva, _size: u64) -> Option<Pa> {
            let hva = hva.raw();
            (hva >= HVA).then(|| Pa::new(hva - HVA + 0x80_0000_0000))
        }
    }
    let m = mmu(MmuPolicy::default()).with_host_memory(Arc::new(Offset));
    let mut v = slot_4m(&m, 4096);
    m.handle_fault(&mut v, Gpa::new(GPA + 0x3000), true)
        .unwrap();
    assert_eq!(
        m.reader().translate(GPA + 0x3010).unwrap().pa,
        0x80_0000_3010
    );
    // An unbacked host page is an error, not a mapping.
    let r = UserMemoryRegion::new(
        1,
        SlotFlags::NONE,
        Gpa::new(GPA << 1),
        1 << 20,
        Hva::new(0x1000),
    );
    m.set_memory_region(&r, 4096).unwrap();
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(GPA << 1), true),
        Err(Error::Unbacked {
            hva: Hva::new(0x1000)
        })
    );
}

/// A vCPU remembers the bitmap it last marked; logging turned off and on
/// again gives the slot a new bitmap, and the marks must land there.
#[test]
fn marks_after_logging_is_restarted_land_in_the_new_bitmap() {
    let m = mmu(MmuPolicy {
        dirty: DirtyMode::Bitmap {
            protect: Protect::OnGet,
        },
        ..MmuPolicy::default()
    });
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 1 << 20, Hva::new(HVA));
    m.set_memory_region(&r, 4096).unwrap();
    let mut v = m.new_vcpu().unwrap();
    let mut log = vec![0u64; 4];
    for round in 0..3u64 {
        m.enable_dirty_logging(0).unwrap();
        for page in [round, round + 10] {
            // A read maps the logged page read-only, the write then takes
            // the fast path and marks it.
            m.handle_fault(&mut v, Gpa::new(GPA + page * 4096), false)
                .unwrap();
            assert_eq!(
                m.handle_fault(&mut v, Gpa::new(GPA + page * 4096), true)
                    .unwrap(),
                FaultOutcome::Fast
            );
        }
        assert_eq!(m.get_dirty_log(0, &mut log).unwrap(), 2, "round {round}");
        assert_eq!(log[0], (1 << round) | (1 << (round + 10)));
        m.disable_dirty_logging(0).unwrap();
    }
}

#[test]
fn fault_by_a_vcpu_of_another_mmu_does_not_panic() {
    let policy = MmuPolicy {
        dirty: DirtyMode::Ring { entries: 256 },
        ..MmuPolicy::default()
    };
    let a = mmu(policy);
    let b = mmu(policy);
    let r = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(GPA), 1 << 20, Hva::new(HVA));
    a.set_memory_region(&r, 4096).unwrap();
    a.enable_dirty_logging(0).unwrap();
    let mut own = a.new_vcpu().unwrap();
    // A read maps the logged page read-only.
    a.handle_fault(&mut own, Gpa::new(GPA), false).unwrap();
    let _ = b.new_vcpu().unwrap();
    let mut foreign = b.new_vcpu().unwrap();
    assert_eq!(foreign.id(), 1, "no ring 1 in `a`");
    // Refused before anything changes: the page would become writable
    // with no ring of `a` to record it, and a map would draw pages
    // from `b`'s allocator.
    assert_eq!(
        a.handle_fault(&mut foreign, Gpa::new(GPA), true),
        Err(Error::ForeignVcpu { vcpu: 1 })
    );
    assert!(!a.reader().translate(GPA).unwrap().prot.contains(Prot::W));
    assert_eq!(
        a.handle_fault(&mut foreign, Gpa::new(GPA + 4096), false),
        Err(Error::ForeignVcpu { vcpu: 1 })
    );
}

/// `policy()` reports the TLB range policy in force, also after it was
/// switched on a live MMU (one source of truth: the table's).
#[test]
fn policy_reports_the_tlb_policy_in_force() {
    let m = mmu(MmuPolicy::default());
    assert_eq!(m.policy().tlb_large_range, LargeRangePolicy::WholeVmid);
    m.set_tlb_large_range(LargeRangePolicy::SplitCalls, 512)
        .unwrap();
    let p = m.policy();
    assert_eq!(
        (p.tlb_large_range, p.tlb_limit_pages),
        (LargeRangePolicy::SplitCalls, 512)
    );
}

/// The facade is format-agnostic: an x86 EPT VM maps 2 MiB leaves, logs
/// writes, splits when logging starts, and write-protects with EPT's bits.
#[test]
fn an_ept_vm_logs_dirty_pages() {
    use crate::format::ept::WRITE;
    let m = ept_mmu(MmuPolicy::default());
    let mut v = slot_4m(&m, 2 << 20);
    m.handle_fault(&mut v, Gpa::new(GPA + 0x2008), true)
        .unwrap();
    assert_eq!(m.reader().translate(GPA).unwrap().size, 2 << 20);
    m.enable_dirty_logging(0).unwrap();
    let leaves = m.with_table(|pt| pt.leaves(GPA, 2 << 20)).unwrap();
    assert_eq!(leaves.len(), 512, "eager split to 4 KiB");
    assert!(leaves.iter().all(|l| l.pte & WRITE == 0), "write-protected");
    assert_eq!(
        m.handle_fault(&mut v, Gpa::new(GPA + 0x5000), true),
        Ok(FaultOutcome::Fast)
    );
    let mut bm = vec![0u64; 16];
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 1);
    assert_eq!(bm[0], 1 << 5);
}

/// Hardware dirty state on EPT: logged leaves stay writable with the dirty
/// flag clear, a CPU write sets the flag (no fault), GET scans it, CLEAR
/// clears it.
#[test]
fn an_ept_vm_logs_with_hardware_dirty_flags() {
    use crate::format::ept::{DIRTY, WRITE};
    let m = ept_mmu(hw_policy());
    let (v, leaves) = block_then_logged(&m);
    assert_eq!(leaves.len(), 512, "split first");
    assert!(
        leaves.iter().all(|l| l.pte & (WRITE | DIRTY) == WRITE),
        "writable, clean"
    );
    let reader = m.reader();
    for p in [5u64, 6, 400] {
        let t = reader.hw_dirty_update(GPA + p * 4096).unwrap();
        assert_eq!(t.pte & DIRTY, DIRTY, "the CPU's update");
    }
    let mut bm = vec![0u64; 8];
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 3);
    assert_eq!((bm[0], bm[6]), (0b110_0000, 1 << (400 - 384)));
    assert_eq!(m.clear_dirty_log(0, 0, 512, &bm).unwrap(), 3);
    assert_eq!(
        reader.translate(GPA + 5 * 4096).unwrap().pte & DIRTY,
        0,
        "cleaned"
    );
    assert_eq!(m.get_dirty_log(0, &mut bm).unwrap(), 0);
    assert_eq!(v.stats.permission, 0);
}

/// Huge pages back in place: when logging stops, the eagerly split pages
/// become 2 MiB blocks again without unmapping, writable as the slot is.
#[test]
fn logging_stops_with_blocks_collapsed_in_place() {
    for in_place in [false, true] {
        let m = mmu(MmuPolicy {
            huge_page_recovery: if in_place {
                HugePageRecovery::Collapse
            } else {
                HugePageRecovery::Unmap
            },
            ..MmuPolicy::default()
        });
        let mut v = slot_4m(&m, 2 << 20);
        for b in 0..2u64 {
            m.handle_fault(&mut v, Gpa::new(GPA + b * (2 << 20)), true)
                .unwrap();
        }
        m.enable_dirty_logging(0).unwrap();
        m.handle_fault(&mut v, Gpa::new(GPA + 0x3000), true)
            .unwrap();
        assert_eq!(m.reader().translate(GPA).unwrap().size, 4096);
        m.disable_dirty_logging(0).unwrap();
        let t = m.reader().translate(GPA + 0x7000);
        if in_place {
            let t = t.expect("still mapped");
            assert_eq!(t.size, 2 << 20);
            assert!(t.prot.contains(Prot::W), "writable again, as the slot is");
            assert_eq!(m.vm_stats().collapsed, 2);
        } else {
            assert!(t.is_none(), "unmapped for faults to map blocks");
        }
    }
}
