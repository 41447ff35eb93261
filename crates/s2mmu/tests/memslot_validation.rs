//! KVM's validation rules and error kinds, page sizes other than 4 KiB, hva aliasing, and
//! both policies at thousands of slots.

use s2mmu::{Gfn, Gpa, Hva};
use std::collections::BTreeMap;

use s2mmu::memslot::{
    errno, ArrayMemslots, HvaFault, MemslotChange, MemslotConfig, MemslotError, MemslotStore,
    NoStage2, Slot, SlotFlags, SlotLookup, TreeMemslots, UserMemoryRegion, KVM_MEM_MAX_NR_PAGES,
    KVM_USER_MEM_SLOTS,
};

const PAGE: u64 = 4096;
const HVA: u64 = 0x7f00_0000_0000;

fn set<S: MemslotStore>(
    store: &S,
    region: UserMemoryRegion,
) -> Result<MemslotChange, MemslotError> {
    store.set_memory_region(&region, &NoStage2)
}

fn region(id: u16, gfn: u64, npages: u64) -> UserMemoryRegion {
    UserMemoryRegion::new(
        id,
        SlotFlags::NONE,
        Gpa::new(gfn * PAGE),
        npages * PAGE,
        Hva::new(HVA + u64::from(id) * 0x100_0000),
    )
}

/// Requests malformed on their own (flags, id, alignment), each with KVM's
/// refusal.
fn malformed_requests() -> Vec<(UserMemoryRegion, MemslotError)> {
    vec![
        (
            UserMemoryRegion {
                flags: 1 << 2,
                ..region(1, 32, 4)
            },
            MemslotError::InvalidFlags { flags: 4 },
        ),
        (
            region(KVM_USER_MEM_SLOTS, 32, 4),
            MemslotError::IdOutOfRange {
                id: KVM_USER_MEM_SLOTS,
                max: KVM_USER_MEM_SLOTS,
            },
        ),
        (
            UserMemoryRegion {
                memory_size: PAGE + 1,
                ..region(1, 32, 4)
            },
            MemslotError::Misaligned {
                what: "memory_size",
                value: PAGE + 1,
            },
        ),
        (
            UserMemoryRegion {
                guest_phys_addr: Gpa::new(100),
                ..region(1, 32, 4)
            },
            MemslotError::Misaligned {
                what: "guest_phys_addr",
                value: 100,
            },
        ),
        (
            UserMemoryRegion {
                userspace_addr: Hva::new(HVA + 8),
                ..region(1, 32, 4)
            },
            MemslotError::Misaligned {
                what: "userspace_addr",
                value: HVA + 8,
            },
        ),
    ]
}

/// Requests whose ranges wrap around or exceed what KVM takes, or name an
/// address space that does not exist, each with KVM's refusal.
fn out_of_range_requests() -> Vec<(UserMemoryRegion, MemslotError)> {
    vec![
        (
            UserMemoryRegion {
                userspace_addr: Hva::new(u64::MAX - PAGE + 1),
                ..region(1, 32, 4)
            },
            MemslotError::Wraps {
                what: "userspace_addr",
                start: u64::MAX - PAGE + 1,
                len: 4 * PAGE,
            },
        ),
        (
            UserMemoryRegion {
                slot: 1 << 16 | 1,
                ..region(1, 32, 4)
            },
            MemslotError::AddressSpaceOutOfRange { as_id: 1, max: 1 },
        ),
        (
            UserMemoryRegion {
                guest_phys_addr: Gpa::new(u64::MAX - PAGE + 1),
                ..region(1, 32, 4)
            },
            MemslotError::Wraps {
                what: "guest_phys_addr",
                start: u64::MAX - PAGE + 1,
                len: 4 * PAGE,
            },
        ),
        (
            region(1, 1 << 40, KVM_MEM_MAX_NR_PAGES + 1),
            MemslotError::TooLarge {
                npages: KVM_MEM_MAX_NR_PAGES + 1,
                max: KVM_MEM_MAX_NR_PAGES,
            },
        ),
    ]
}

/// Requests that conflict with slot 0 (pages 0..16) or name no slot, each
/// with KVM's refusal.
fn conflicting_requests() -> Vec<(UserMemoryRegion, MemslotError)> {
    vec![
        (
            UserMemoryRegion::delete(5),
            MemslotError::NoSuchSlot { id: 5 },
        ),
        (
            region(1, 8, 16),
            MemslotError::Overlap { slot: 1, other: 0 },
        ),
        (
            region(1, 15, 1),
            MemslotError::Overlap { slot: 1, other: 0 },
        ),
        (
            region(0, 0, 8),
            MemslotError::ImmutableChange { what: "npages" },
        ),
        (
            UserMemoryRegion {
                userspace_addr: Hva::new(HVA + PAGE),
                ..region(0, 0, 16)
            },
            MemslotError::ImmutableChange {
                what: "userspace_addr",
            },
        ),
        (
            UserMemoryRegion {
                flags: SlotFlags::READONLY.bits(),
                ..region(0, 0, 16)
            },
            MemslotError::ImmutableChange { what: "readonly" },
        ),
        (region(0, 0, 16), MemslotError::NoChange { id: 0 }),
    ]
}

fn rejects_what_kvm_rejects<S: MemslotStore>() {
    let store = S::with_config(MemslotConfig::default());
    assert_eq!(set(&store, region(0, 0, 16)), Ok(MemslotChange::Create));
    let generation = store.snapshot().generation();
    let mut cases = malformed_requests();
    cases.extend(out_of_range_requests());
    cases.extend(conflicting_requests());
    for (request, error) in cases {
        assert_eq!(
            set(&store, request),
            Err(error),
            "{} {request:?}",
            S::POLICY
        );
        let expected_errno = match error {
            MemslotError::Overlap { .. } => errno::EEXIST,
            MemslotError::NoChange { .. } => 0,
            _ => errno::EINVAL,
        };
        assert_eq!(error.errno(), expected_errno);
    }
    let snapshot = store.snapshot();
    assert_eq!(
        snapshot.generation(),
        generation,
        "no failed request published anything"
    );
    assert_eq!(snapshot.len(), 1);
    assert_eq!(snapshot.total_pages(), 16);

    // The highest id and a slot right after the first are fine.
    drop(snapshot);
    assert_eq!(
        set(&store, region(KVM_USER_MEM_SLOTS - 1, 16, 1)),
        Ok(MemslotChange::Create)
    );
    let logging = UserMemoryRegion {
        flags: SlotFlags::LOG_DIRTY_PAGES.bits(),
        ..region(0, 0, 16)
    };
    assert_eq!(set(&store, logging), Ok(MemslotChange::FlagsOnly));
    assert!(store.snapshot().id_to_slot(0).unwrap().dirty_logging());
}

#[test]
fn tree_rejects_what_kvm_rejects() {
    rejects_what_kvm_rejects::<TreeMemslots>();
}

#[test]
fn array_rejects_what_kvm_rejects() {
    rejects_what_kvm_rejects::<ArrayMemslots>();
}

fn other_page_sizes_and_translation<S: MemslotStore>() {
    // 16 KiB pages: gfns count 16 KiB frames, and 4 KiB alignment is not enough.
    let store = S::with_config(MemslotConfig {
        page_shift: 14,
        ..MemslotConfig::default()
    });
    let page = 1u64 << 14;
    let misaligned =
        UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(4096), 4 * page, Hva::new(HVA));
    assert_eq!(
        set(&store, misaligned),
        Err(MemslotError::Misaligned {
            what: "guest_phys_addr",
            value: 4096
        })
    );
    let ro = UserMemoryRegion::new(
        0,
        SlotFlags::READONLY,
        Gpa::new(8 * page),
        4 * page,
        Hva::new(HVA),
    );
    assert_eq!(set(&store, ro), Ok(MemslotChange::Create));
    let snapshot = store.snapshot();
    let slot = snapshot
        .gfn_to_slot(Gfn::new(10))
        .expect("gfn 10 is in 8..12");
    assert_eq!((slot.base_gfn(), slot.npages()), (Gfn::new(8), 4));
    assert_eq!(
        slot.gfn_to_hva(Gfn::new(10), false),
        Ok(Hva::new(HVA + 2 * page))
    );
    assert_eq!(slot.gfn_to_hva(Gfn::new(10), true), Err(HvaFault::ReadOnly));
    assert_eq!(
        slot.gfn_to_hva(Gfn::new(12), false),
        Err(HvaFault::NotInSlot)
    );
    // The way back: an hva inside the slot names its gfn, one outside none
    // (no underflow below the slot, no gfn past its end).
    assert_eq!(
        slot.hva_to_gfn(Hva::new(HVA + 2 * page + 5)),
        Some(Gfn::new(10))
    );
    assert_eq!(slot.hva_to_gfn(Hva::new(HVA - 1)), None);
    assert_eq!(slot.hva_to_gfn(Hva::new(HVA + 4 * page)), None);
    let mut hits = Vec::new();
    snapshot.for_each_in_hva_range(
        Hva::new(HVA + page + 1),
        Hva::new(HVA + 2 * page + 1),
        |o| hits.push((o.gfn_start, o.gfn_end)),
    );
    assert_eq!(
        hits,
        vec![(Gfn::new(9), Gfn::new(11))],
        "partial pages round outwards"
    );
}

#[test]
fn tree_other_page_sizes_and_translation() {
    other_page_sizes_and_translation::<TreeMemslots>();
}

#[test]
fn array_other_page_sizes_and_translation() {
    other_page_sizes_and_translation::<ArrayMemslots>();
}

fn aliased_hva_and_empty<S: MemslotStore>() {
    let store = S::with_config(MemslotConfig::default());
    assert!(store.snapshot().gfn_to_slot_approx(Gfn::new(5)).is_none());
    // Two slots backed by the same host memory: both must hear of an invalidation.
    for (id, gfn) in [(1, 0), (2, 100)] {
        set(
            &store,
            UserMemoryRegion::new(
                id,
                SlotFlags::NONE,
                Gpa::new(gfn * PAGE),
                8 * PAGE,
                Hva::new(HVA),
            ),
        )
        .unwrap();
    }
    let mut hits = Vec::new();
    store.snapshot().for_each_in_hva_range(
        Hva::new(HVA + 2 * PAGE),
        Hva::new(HVA + 3 * PAGE),
        |o| hits.push((o.slot.id(), o.gfn_start, o.gfn_end)),
    );
    hits.sort_unstable();
    assert_eq!(
        hits,
        vec![
            (1, Gfn::new(2), Gfn::new(3)),
            (2, Gfn::new(102), Gfn::new(103))
        ]
    );
    let snapshot = store.snapshot();
    assert_eq!(
        snapshot.gfn_to_slot_approx(Gfn::new(50)).map(Slot::id),
        Some(1),
        "the neighbour below the hole"
    );
    assert_eq!(
        snapshot.gfn_to_slot_approx(Gfn::new(500)).map(Slot::id),
        Some(2)
    );
}

#[test]
fn tree_aliased_hva_and_empty() {
    aliased_hva_and_empty::<TreeMemslots>();
}

#[test]
fn array_aliased_hva_and_empty() {
    aliased_hva_and_empty::<ArrayMemslots>();
}

/// Thousands of slots created, moved and deleted in random order: enough to split and
/// merge the tree's leaves many times. Every slot and a sweep of gfns are checked.
fn many_slots<S: MemslotStore>() {
    let store = S::with_config(MemslotConfig::default());
    let mut model: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    let mut state = 0x1234_5678_9ABC_DEF1u64;
    let mut next = |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    // Each id owns a home cell of 4 gfns and an away cell far above, so nothing overlaps.
    let ids = 6000u64;
    for step in 0..20_000u64 {
        let id = next(ids) as u16;
        let home = u64::from(id) * 4;
        let away = 1 << 20 | home;
        let npages = 1 + u64::from(id) % 3;
        let hva = HVA + u64::from(id) * 4 * PAGE;
        let request = match model.get(&id) {
            None => UserMemoryRegion::new(
                id,
                SlotFlags::NONE,
                Gpa::new(home * PAGE),
                npages * PAGE,
                Hva::new(hva),
            ),
            Some(_) if step % 3 == 0 => UserMemoryRegion::delete(id),
            Some(&(base, _)) => {
                let target = if base == home { away } else { home };
                UserMemoryRegion::new(
                    id,
                    SlotFlags::NONE,
                    Gpa::new(target * PAGE),
                    npages * PAGE,
                    Hva::new(hva),
                )
            }
        };
        set(&store, request).unwrap();
        match request.memory_size {
            0 => model.remove(&id),
            size => model.insert(id, (request.guest_phys_addr.raw() / PAGE, size / PAGE)),
        };
    }
    let snapshot = store.snapshot();
    assert_eq!(snapshot.len(), model.len());
    for (&id, &(base, npages)) in &model {
        let slot = snapshot.id_to_slot(id).unwrap();
        assert_eq!((slot.base_gfn().raw(), slot.npages()), (base, npages));
        assert_eq!(
            snapshot.search(Gfn::new(base + npages - 1)).map(Slot::id),
            Some(id)
        );
    }
    let by_gfn: BTreeMap<u64, (u16, u64)> = model
        .iter()
        .map(|(&id, &(base, n))| (base, (id, n)))
        .collect();
    for gfn in (0..ids * 4).chain((1 << 20)..(1 << 20) + ids * 4) {
        let want = by_gfn
            .range(..=gfn)
            .next_back()
            .filter(|(&b, &(_, n))| gfn < b + n)
            .map(|(_, &(id, _))| id);
        assert_eq!(
            snapshot.search(Gfn::new(gfn)).map(Slot::id),
            want,
            "gfn {gfn}"
        );
    }
    let mut in_order = Vec::new();
    snapshot.for_each_slot(|slot| in_order.push(slot.base_gfn().raw()));
    assert_eq!(in_order, by_gfn.keys().copied().collect::<Vec<_>>());
}

#[test]
fn tree_many_slots() {
    many_slots::<TreeMemslots>();
}

#[test]
fn array_many_slots() {
    many_slots::<ArrayMemslots>();
}

/// A store configured with a page shift no granule has refuses every change
/// with a typed error instead of overflowing a shift.
fn refuses_a_page_shift_no_granule_has<S: MemslotStore>() {
    for shift in [0, 13, 64, 200] {
        let store = S::with_config(MemslotConfig {
            page_shift: shift,
            ..MemslotConfig::default()
        });
        assert_eq!(
            set(&store, region(0, 0, 16)),
            Err(MemslotError::BadConfig {
                what: "page_shift",
                value: u64::from(shift),
            })
        );
        assert_eq!(store.snapshot().len(), 0);
    }
}

#[test]
fn tree_refuses_bad_page_shift() {
    refuses_a_page_shift_no_granule_has::<TreeMemslots>();
}

#[test]
fn array_refuses_bad_page_shift() {
    refuses_a_page_shift_no_granule_has::<ArrayMemslots>();
}
