//! Property tests: random update sequences against a plain list of slots, for both
//! policies, checking every result and every lookup after every step.

use s2mmu::{Gfn, Gpa, Hva};
use std::sync::Mutex;

use proptest::prelude::*;
use s2mmu::memslot::{
    ArrayMemslots, MemslotChange, MemslotConfig, MemslotError, MemslotStore, Slot, SlotFlags,
    SlotLookup, Stage2Invalidate, TreeMemslots, UserMemoryRegion, VcpuSlotCache,
};

const PAGE: u64 = 4096;
const MAX_SLOTS: u16 = 12;
const GFN_SPACE: u64 = 96;

/// The reference: a list of slots and KVM's rules written out the slow, obvious way.
#[derive(Default)]
struct Model {
    slots: Vec<Slot>,
}

impl Model {
    fn by_id(&self, id: u16) -> Option<&Slot> {
        self.slots.iter().find(|s| s.id() == id)
    }

    /// KVM's checks of a request on its own: flags, id, alignment, address
    /// space, wrap-around. Returns the slot id.
    fn check_fields(req: &UserMemoryRegion) -> Result<u16, MemslotError> {
        if req.flags & !3 != 0 {
            return Err(MemslotError::InvalidFlags { flags: req.flags });
        }
        let id = req.slot as u16;
        if id >= MAX_SLOTS {
            return Err(MemslotError::IdOutOfRange { id, max: MAX_SLOTS });
        }
        for (what, value) in [
            ("memory_size", req.memory_size),
            ("guest_phys_addr", req.guest_phys_addr.raw()),
            ("userspace_addr", req.userspace_addr.raw()),
        ] {
            if value % PAGE != 0 {
                return Err(MemslotError::Misaligned { what, value });
            }
        }
        if req.slot >> 16 != 0 {
            return Err(MemslotError::AddressSpaceOutOfRange {
                as_id: (req.slot >> 16) as u16,
                max: 1,
            });
        }
        if req.guest_phys_addr.checked_add(req.memory_size).is_none() {
            return Err(MemslotError::Wraps {
                what: "guest_phys_addr",
                start: req.guest_phys_addr.raw(),
                len: req.memory_size,
            });
        }
        Ok(id)
    }

    /// What changing slot `old` to `req` (`npages` from guest frame `base`)
    /// is: a move or a flags-only change; anything else KVM refuses.
    fn update_kind(
        old: &Slot,
        req: &UserMemoryRegion,
        npages: u64,
        base: u64,
    ) -> Result<MemslotChange, MemslotError> {
        if old.userspace_addr() != req.userspace_addr {
            return Err(MemslotError::ImmutableChange {
                what: "userspace_addr",
            });
        }
        if old.npages() != npages {
            return Err(MemslotError::ImmutableChange { what: "npages" });
        }
        if (old.flags().bits() ^ req.flags) & 2 != 0 {
            return Err(MemslotError::ImmutableChange { what: "readonly" });
        }
        if old.base_gfn() != Gfn::new(base) {
            Ok(MemslotChange::Move)
        } else if old.flags().bits() != req.flags {
            Ok(MemslotChange::FlagsOnly)
        } else {
            Err(MemslotError::NoChange { id: old.id() })
        }
    }

    /// The lowest slot other than `id` that `[base, base + npages)` overlaps.
    fn overlapping(&self, id: u16, base: u64, npages: u64) -> Option<&Slot> {
        self.slots
            .iter()
            .filter(|s| {
                s.id() != id && s.base_gfn() < Gfn::new(base + npages) && base < s.end_gfn().raw()
            })
            .min_by_key(|s| s.base_gfn())
    }

    fn apply(&mut self, req: &UserMemoryRegion) -> Result<MemslotChange, MemslotError> {
        let id = Self::check_fields(req)?;
        let npages = req.memory_size / PAGE;
        let base = req.guest_phys_addr.raw() / PAGE;
        let old = self.by_id(id).cloned();
        if npages == 0 {
            let Some(_) = old else {
                return Err(MemslotError::NoSuchSlot { id });
            };
            self.slots.retain(|s| s.id() != id);
            return Ok(MemslotChange::Delete);
        }
        let change = match &old {
            None => MemslotChange::Create,
            Some(o) => Self::update_kind(o, req, npages, base)?,
        };
        if change != MemslotChange::FlagsOnly {
            if let Some(other) = self.overlapping(id, base, npages) {
                return Err(MemslotError::Overlap {
                    slot: id,
                    other: other.id(),
                });
            }
        }
        self.slots.retain(|s| s.id() != id);
        self.slots.push(Slot::new(
            id,
            Gfn::new(base),
            npages,
            req.userspace_addr,
            SlotFlags::from_bits(req.flags),
            12,
        ));
        Ok(change)
    }

    fn find(&self, gfn: u64) -> Option<&Slot> {
        self.slots.iter().find(|s| s.contains(Gfn::new(gfn)))
    }

    fn approx(&self, gfn: u64) -> Option<&Slot> {
        self.find(gfn)
            .or_else(|| {
                self.slots
                    .iter()
                    .filter(|s| s.base_gfn() <= Gfn::new(gfn))
                    .max_by_key(|s| s.base_gfn())
            })
            .or_else(|| self.slots.iter().min_by_key(|s| s.base_gfn()))
    }
}

/// Records every unmap the store asks for.
#[derive(Default)]
struct Recorder(Mutex<Vec<(u64, u64)>>);

impl Stage2Invalidate for Recorder {
    fn unmap_gfn_range(&self, base_gfn: Gfn, npages: u64) {
        self.0.lock().unwrap().push((base_gfn.raw(), npages));
    }
}

fn region() -> impl Strategy<Value = UserMemoryRegion> {
    let id = prop_oneof![9 => 0u32..8, 1 => 8u32..16, 1 => Just(0x1_0001u32)];
    let flags = prop_oneof![10 => 0u32..4, 1 => Just(4u32)];
    // A home position per id (so repeated requests are flag changes or no-ops), else anywhere
    // (moves and overlaps), sometimes misaligned or wrapping.
    let gpa = prop_oneof![
        12 => Just(None),
        8 => (0..GFN_SPACE).prop_map(|g| Some(g * PAGE)),
        1 => Just(Some(PAGE / 2)),
        1 => Just(Some(!(PAGE - 1))),
    ];
    let size = prop_oneof![
        3 => Just(0u64),
        8 => Just(4 * PAGE),
        6 => prop::sample::select(vec![1u64, 2, 8, 16]).prop_map(|p| p * PAGE),
        1 => Just(PAGE + 8),
    ];
    // Mostly a fixed hva per id, so that moves and flag changes are legal; sometimes another,
    // which also makes host ranges of different slots overlap.
    let hva = prop_oneof![8 => Just(None), 2 => (0u64..64).prop_map(|p| Some(0x4000_0000 + p * PAGE)), 1 => Just(Some(0x4000_0100))];
    (id, flags, gpa, size, hva).prop_map(|(slot, flags, gpa, memory_size, hva)| {
        let id = u64::from(slot as u16);
        UserMemoryRegion {
            slot,
            flags,
            guest_phys_addr: Gpa::new(gpa.unwrap_or(id * 8 * PAGE)),
            memory_size,
            userspace_addr: Hva::new(hva.unwrap_or(0x1000_0000 + id * 0x10_0000)),
        }
    })
}

fn key(s: &Slot) -> (u16, u64, u64, u64, u32) {
    (
        s.id(),
        s.base_gfn().raw(),
        s.npages(),
        s.userspace_addr().raw(),
        s.flags().bits(),
    )
}

fn check_state<S: MemslotStore>(
    store: &S,
    model: &Model,
    cache: &mut VcpuSlotCache,
    probes: &[(u64, u64)],
) {
    let snap = store.snapshot();
    assert_eq!(snap.len(), model.slots.len());
    assert_eq!(
        snap.total_pages(),
        model.slots.iter().map(Slot::npages).sum::<u64>()
    );
    for id in 0..MAX_SLOTS + 2 {
        assert_eq!(
            snap.id_to_slot(id).map(key),
            model.by_id(id).map(key),
            "id {id}"
        );
    }
    for gfn in 0..GFN_SPACE + 20 {
        let want = model.find(gfn).map(key);
        assert_eq!(snap.search(Gfn::new(gfn)).map(key), want, "search {gfn}");
        assert_eq!(
            snap.gfn_to_slot(Gfn::new(gfn)).map(key),
            want,
            "gfn_to_slot {gfn}"
        );
        assert_eq!(
            snap.gfn_to_slot_vcpu(cache, Gfn::new(gfn)).map(key),
            want,
            "vcpu {gfn}"
        );
        assert_eq!(
            snap.gfn_to_slot_approx(Gfn::new(gfn)).map(key),
            model.approx(gfn).map(key),
            "approx {gfn}"
        );
    }
    let mut in_order = Vec::new();
    snap.for_each_slot(|s| in_order.push(key(s)));
    let mut want: Vec<_> = model.slots.iter().map(key).collect();
    want.sort_by_key(|k| k.1);
    assert_eq!(in_order, want);
    for &(a, b) in probes {
        let (start, end) = (a % (GFN_SPACE + 20), b % (GFN_SPACE + 20));
        let mut got = Vec::new();
        snap.for_each_in_gfn_range(Gfn::new(start), Gfn::new(end), |s| got.push(key(s)));
        let want: Vec<_> = want
            .iter()
            .copied()
            .filter(|k| start < end && k.1 < end && start < k.1 + k.2)
            .collect();
        assert_eq!(got, want, "gfn range {start}..{end}");

        // Starts on a page, a byte before one (the last byte of a slot) or mid-page.
        let hva_start = 0x1000_0000 + (a * 0x1000 % 0x100_0000) - [0, 1, 0x800][(b % 3) as usize];
        let hva_end = hva_start + (b % 40) * 0x800 + (a % 2);
        let mut got = Vec::new();
        snap.for_each_in_hva_range(Hva::new(hva_start), Hva::new(hva_end), |o| {
            got.push((o.slot.id(), o.gfn_start.raw(), o.gfn_end.raw()))
        });
        got.sort_unstable();
        let mut want = Vec::new();
        for s in &model.slots {
            let (lo, hi) = (
                hva_start.max(s.userspace_addr().raw()),
                hva_end.min(s.hva_end().raw()),
            );
            if lo < hi {
                let first = s.base_gfn().raw() + (lo - s.userspace_addr().raw()) / PAGE;
                let end = s.base_gfn().raw() + (hi - s.userspace_addr().raw()).div_ceil(PAGE);
                want.push((s.id(), first, end));
            }
        }
        want.sort_unstable();
        assert_eq!(got, want, "hva range {hva_start:#x}..{hva_end:#x}");
    }
}

fn run_sequence<S: MemslotStore>(ops: &[UserMemoryRegion], probes: &[(u64, u64)]) {
    let config = MemslotConfig {
        max_user_slots: MAX_SLOTS,
        ..MemslotConfig::default()
    };
    let store = S::with_config(config);
    let mut model = Model::default();
    let mut cache = VcpuSlotCache::new();
    for op in ops {
        let before = model.by_id(op.slot as u16).cloned();
        let generation = store.snapshot().generation();
        let recorder = Recorder::default();
        let got = store.set_memory_region(op, &recorder);
        let want = model.apply(op);
        assert_eq!(got, want, "{} on {op:?}", S::POLICY);
        let unmaps = recorder.0.into_inner().unwrap();
        let published = store.snapshot().generation() - generation;
        match got {
            Ok(MemslotChange::Delete | MemslotChange::Move) => {
                let old = before.expect("delete or move of an existing slot");
                assert_eq!(unmaps, vec![(old.base_gfn().raw(), old.npages())]);
                assert_eq!(published, 2, "stand-in then final state");
            }
            Ok(_) => {
                assert!(unmaps.is_empty());
                assert_eq!(published, 1);
            }
            Err(_) => {
                assert!(unmaps.is_empty());
                assert_eq!(published, 0, "state unchanged on error");
            }
        }
        check_state(&store, &model, &mut cache, probes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn tree_matches_model(ops in prop::collection::vec(region(), 1..50), probes in prop::collection::vec((0u64..4096, 0u64..4096), 8)) {
        run_sequence::<TreeMemslots>(&ops, &probes);
    }

    #[test]
    fn array_matches_model(ops in prop::collection::vec(region(), 1..50), probes in prop::collection::vec((0u64..4096, 0u64..4096), 8)) {
        run_sequence::<ArrayMemslots>(&ops, &probes);
    }
}
