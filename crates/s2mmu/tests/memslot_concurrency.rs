//! Readers look up gfns while a writer creates, moves, deletes and re-flags slots; every
//! answer a reader gets must be the answer of one published state (the one whose
//! generation the reader's snapshot carried), never a mix.

use s2mmu::{Gfn, Gpa, Hva};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use s2mmu::memslot::{
    ArrayMemslots, MemslotChange, MemslotConfig, MemslotStore, NoStage2, Slot, SlotFlags,
    SlotLookup, Stage2Invalidate, TreeMemslots, UserMemoryRegion, VcpuSlotCache,
};

const PAGE: u64 = 4096;
const GFN_SPACE: u64 = 512;
type Key = (u16, u64, u64, u32);

fn key(s: &Slot) -> Key {
    (s.id(), s.base_gfn().raw(), s.npages(), s.flags().bits())
}

/// A small deterministic generator, so failures reproduce.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

/// Every state the writer published, indexed by generation.
fn record_publications(
    states: &mut Vec<BTreeMap<u16, Key>>,
    change: MemslotChange,
    id: u16,
    new: Option<Key>,
) {
    let mut next = states.last().cloned().unwrap_or_default();
    if matches!(change, MemslotChange::Delete | MemslotChange::Move) {
        let old = next[&id];
        next.insert(id, (old.0, old.1, old.2, old.3 | SlotFlags::INVALID.bits()));
        states.push(next.clone());
    }
    match new {
        Some(k) => next.insert(id, k),
        None => next.remove(&id),
    };
    states.push(next);
}

/// What a reader saw: the snapshot's generation, the gfn, the slot found.
type Seen = (u64, u64, Option<Key>);

/// A reader thread: random lookups, each in one snapshot both through a
/// vCPU's slot cache and through the set, until `stop` (and at least one).
fn spawn_reader<S: MemslotStore + 'static>(
    store: &Arc<S>,
    stop: &Arc<AtomicBool>,
    seed: u64,
) -> thread::JoinHandle<Vec<Seen>> {
    let (store, stop) = (Arc::clone(store), Arc::clone(stop));
    thread::spawn(move || {
        let mut rng = Lcg(seed + 100);
        let mut cache = VcpuSlotCache::new();
        let mut seen = Vec::new();
        let mut last_generation = 0;
        while !stop.load(Ordering::Relaxed) || seen.is_empty() {
            let snap = store.snapshot();
            let generation = snap.generation();
            assert!(generation >= last_generation, "generations go forward");
            last_generation = generation;
            for _ in 0..4 {
                let gfn = rng.next(GFN_SPACE);
                let by_vcpu = snap.gfn_to_slot_vcpu(&mut cache, Gfn::new(gfn)).map(key);
                let by_set = snap.gfn_to_slot(Gfn::new(gfn)).map(key);
                assert_eq!(by_vcpu, by_set, "one snapshot, one answer");
                if seen.len() < 400_000 {
                    seen.push((generation, gfn, by_vcpu));
                }
            }
        }
        seen
    })
}

/// The writer's next request for slot `id` (`current`: its state now): a
/// create, or a delete, a flags change or a move.
fn random_region(rng: &mut Lcg, id: u16, current: Option<Key>) -> UserMemoryRegion {
    let hva = 0x1000_0000 + u64::from(id) * 0x100_000;
    match (current, rng.next(4)) {
        (None, _) => UserMemoryRegion::new(
            id,
            SlotFlags::NONE,
            Gpa::new(rng.next(GFN_SPACE) * PAGE),
            (1 + rng.next(24)) * PAGE,
            Hva::new(hva),
        ),
        (Some(_), 0) => UserMemoryRegion::delete(id),
        (Some(k), 1) => UserMemoryRegion::new(
            id,
            SlotFlags::from_bits(k.3 ^ 1),
            Gpa::new(k.1 * PAGE),
            k.2 * PAGE,
            Hva::new(hva),
        ),
        (Some(k), _) => UserMemoryRegion::new(
            id,
            SlotFlags::from_bits(k.3),
            Gpa::new(rng.next(GFN_SPACE) * PAGE),
            k.2 * PAGE,
            Hva::new(hva),
        ),
    }
}

fn readers_see_only_published_states<S: MemslotStore + 'static>() {
    let store = Arc::new(S::with_config(MemslotConfig {
        max_user_slots: 32,
        ..MemslotConfig::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|seed| spawn_reader(&store, &stop, seed))
        .collect();

    let mut states: Vec<BTreeMap<u16, Key>> = vec![BTreeMap::new()];
    let mut rng = Lcg(7);
    let mut ops = 0;
    while ops < 1000 {
        let id = rng.next(16) as u16;
        let current = states.last().and_then(|s| s.get(&id)).copied();
        let region = random_region(&mut rng, id, current);
        let before = store.snapshot().generation();
        if let Ok(change) = store.set_memory_region(&region, &NoStage2) {
            assert_eq!(before as usize, states.len() - 1);
            let npages = region.memory_size / PAGE;
            let new = (npages > 0).then_some((
                id,
                region.guest_phys_addr.raw() / PAGE,
                npages,
                region.flags,
            ));
            record_publications(&mut states, change, id, new);
            assert_eq!(store.snapshot().generation() as usize, states.len() - 1);
            ops += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);

    let mut checked = 0;
    for reader in readers {
        for (generation, gfn, got) in reader.join().expect("reader panicked") {
            let state = &states[generation as usize];
            let want = state
                .values()
                .find(|k| gfn >= k.1 && gfn < k.1 + k.2)
                .copied();
            assert_eq!(got, want, "{} generation {generation} gfn {gfn}", S::POLICY);
            checked += 1;
        }
    }
    assert!(checked > 0);
}

#[test]
fn tree_readers_see_only_published_states() {
    readers_see_only_published_states::<TreeMemslots>();
}

#[test]
fn array_readers_see_only_published_states() {
    readers_see_only_published_states::<ArrayMemslots>();
}

/// At the moment of the unmap, readers see the old range held by an `INVALID` stand-in
/// and nothing of the new state.
struct OrderChecker<S> {
    store: Arc<S>,
    calls: Mutex<Vec<(u64, u64)>>,
}

impl<S: MemslotStore> Stage2Invalidate for OrderChecker<S> {
    fn unmap_gfn_range(&self, base_gfn: Gfn, npages: u64) {
        let base_gfn = base_gfn.raw();
        let snap = self.store.snapshot();
        let slot = snap
            .search(Gfn::new(base_gfn))
            .expect("the old range is still covered");
        assert!(
            slot.is_invalid(),
            "the stand-in is published before the unmap"
        );
        assert_eq!((slot.base_gfn().raw(), slot.npages()), (base_gfn, npages));
        assert!(
            snap.search(Gfn::new(1000)).is_none(),
            "the moved slot is not visible yet"
        );
        self.calls.lock().unwrap().push((base_gfn, npages));
    }
}

fn unmap_happens_before_publication<S: MemslotStore>() {
    let store = Arc::new(S::with_config(MemslotConfig::default()));
    let checker = OrderChecker {
        store: Arc::clone(&store),
        calls: Mutex::new(Vec::new()),
    };
    let hva = 0x7000_0000;
    store
        .set_memory_region(
            &UserMemoryRegion::new(
                3,
                SlotFlags::NONE,
                Gpa::new(16 * PAGE),
                8 * PAGE,
                Hva::new(hva),
            ),
            &checker,
        )
        .unwrap();
    assert!(
        checker.calls.lock().unwrap().is_empty(),
        "a create unmaps nothing"
    );
    let moved = UserMemoryRegion::new(
        3,
        SlotFlags::NONE,
        Gpa::new(1000 * PAGE),
        8 * PAGE,
        Hva::new(hva),
    );
    assert_eq!(
        store.set_memory_region(&moved, &checker),
        Ok(MemslotChange::Move)
    );
    let snap = store.snapshot();
    assert!(snap.search(Gfn::new(16)).is_none());
    assert_eq!(snap.search(Gfn::new(1003)).map(Slot::id), Some(3));
    assert!(!snap.id_to_slot(3).unwrap().is_invalid());
    drop(snap);
    let logging = UserMemoryRegion::new(
        3,
        SlotFlags::LOG_DIRTY_PAGES,
        Gpa::new(1000 * PAGE),
        8 * PAGE,
        Hva::new(hva),
    );
    assert_eq!(
        store.set_memory_region(&logging, &checker),
        Ok(MemslotChange::FlagsOnly)
    );
    let checker_at_1000 = OrderChecker {
        store: Arc::clone(&store),
        calls: Mutex::new(Vec::new()),
    };
    // The delete's stand-in sits at gfn 1000, so the "not visible yet" probe must look elsewhere.
    struct DeleteChecker<S>(OrderChecker<S>);
    impl<S: MemslotStore> Stage2Invalidate for DeleteChecker<S> {
        fn unmap_gfn_range(&self, base_gfn: Gfn, npages: u64) {
            let base_gfn = base_gfn.raw();
            let snap = self.0.store.snapshot();
            assert!(snap.search(Gfn::new(base_gfn)).unwrap().is_invalid());
            self.0.calls.lock().unwrap().push((base_gfn, npages));
        }
    }
    let deleter = DeleteChecker(checker_at_1000);
    assert_eq!(
        store.set_memory_region(&UserMemoryRegion::delete(3), &deleter),
        Ok(MemslotChange::Delete)
    );
    assert_eq!(*checker.calls.lock().unwrap(), vec![(16, 8)]);
    assert_eq!(*deleter.0.calls.lock().unwrap(), vec![(1000, 8)]);
    assert!(store.snapshot().is_empty());
}

#[test]
fn tree_unmap_happens_before_publication() {
    unmap_happens_before_publication::<TreeMemslots>();
}

#[test]
fn array_unmap_happens_before_publication() {
    unmap_happens_before_publication::<ArrayMemslots>();
}

/// A snapshot taken before an update keeps showing the old state while the update
/// publishes the new one; the writer finishes once the snapshot is dropped. (A delete or
/// move would wait for this reader before publishing its final state, as KVM waits for
/// SRCU readers.)
fn snapshot_is_stable<S: MemslotStore + 'static>() {
    let store = Arc::new(S::with_config(MemslotConfig::default()));
    store
        .set_memory_region(
            &UserMemoryRegion::new(
                1,
                SlotFlags::NONE,
                Gpa::new(0),
                4 * PAGE,
                Hva::new(0x10_0000),
            ),
            &NoStage2,
        )
        .unwrap();
    let old = store.snapshot();
    let writer = {
        let store = Arc::clone(&store);
        thread::spawn(move || {
            store.set_memory_region(
                &UserMemoryRegion::new(
                    2,
                    SlotFlags::NONE,
                    Gpa::new(64 * PAGE),
                    4 * PAGE,
                    Hva::new(0x20_0000),
                ),
                &NoStage2,
            )
        })
    };
    while store.snapshot().search(Gfn::new(64)).is_none() {
        thread::yield_now();
    }
    assert_eq!(old.search(Gfn::new(0)).map(Slot::id), Some(1));
    assert!(!old.search(Gfn::new(0)).unwrap().is_invalid());
    assert!(old.search(Gfn::new(64)).is_none());
    drop(old);
    assert_eq!(writer.join().unwrap(), Ok(MemslotChange::Create));
    let now = store.snapshot();
    assert_eq!(
        (
            now.len(),
            now.search(Gfn::new(0)).map(Slot::id),
            now.search(Gfn::new(64)).map(Slot::id)
        ),
        (2, Some(1), Some(2))
    );
}

#[test]
fn tree_snapshot_is_stable() {
    snapshot_is_stable::<TreeMemslots>();
}

#[test]
fn array_snapshot_is_stable() {
    snapshot_is_stable::<ArrayMemslots>();
}
