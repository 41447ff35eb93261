//! The guest of `memslot-perf`: its memory, the VM with its slots and the guest
//! thread's accesses, and the host side's discards and syncs (the running part).

use super::*;
use s2mmu::{Gfn, Gpa, Hva};
use s2mmu_vm::{Backing, GuestMemory};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The word in the middle of a page, which RW's second half reads and writes.
pub(super) const HALF_PAGE_WORD: usize = (PAGE_SIZE / 2 / 8) as usize;

/// A simulated VM: memory, its slots, and the sync flags of the selftest.
pub(super) struct Vm<S> {
    pub(super) store: S,
    pub(super) memory: GuestMemory,
    pub(super) nslots: u32,
    pub(super) pages: u64,
    pub(super) pages_per_slot: u64,
    pub(super) sync: AtomicBool,
    pub(super) exit: AtomicBool,
    /// Guest accesses that found no usable slot (MMIO exits in the selftest).
    pub(super) mmio_exits: AtomicU64,
}

impl<S: MemslotStore> Vm<S> {
    /// The selftest's `prepare_vm`: the area cut into `nslots` equal slots, the remainder
    /// added to the last, created one by one. Returns the time the creates took.
    /// The last slot where it was set up, and the same slot moved just past the end of the
    /// area (the selftest's move target).
    pub(super) fn last_slot_home_and_away(&self) -> (UserMemoryRegion, UserMemoryRegion) {
        let last_base = self.last_slot_base_gfn();
        let home = UserMemoryRegion::new(
            (self.nslots - 1) as u16,
            SlotFlags::NONE,
            Gpa::new(last_base << PAGE_SHIFT),
            (self.base_gfn() + self.pages - last_base) << PAGE_SHIFT,
            Hva::new(self.page_hva(last_base - self.base_gfn())),
        );
        let away = UserMemoryRegion {
            guest_phys_addr: Gpa::new(MEM_GPA + self.pages * PAGE_SIZE),
            ..home
        };
        (home, away)
    }

    pub(super) fn prepare(nslots: u32, bytes: u64) -> Result<(Self, Duration), String> {
        let memory = GuestMemory::new(bytes, Backing::Anonymous).map_err(|e| e.to_string())?;
        let pages = bytes / PAGE_SIZE;
        let pages_per_slot = pages / u64::from(nslots);
        if pages_per_slot == 0 {
            return Err(format!("{nslots} slots do not fit {bytes} bytes"));
        }
        let store = S::with_config(s2mmu::memslot::MemslotConfig::default());
        let start = Instant::now();
        for index in 0..u64::from(nslots) {
            let npages = if index + 1 == u64::from(nslots) {
                pages - index * pages_per_slot
            } else {
                pages_per_slot
            };
            let offset = index * pages_per_slot * PAGE_SIZE;
            let region = UserMemoryRegion::new(
                index as u16,
                SlotFlags::NONE,
                Gpa::new(MEM_GPA + offset),
                npages * PAGE_SIZE,
                Hva::new(memory.host_addr() + offset),
            );
            store
                .set_memory_region(&region, &NoStage2)
                .map_err(|e| format!("slot setup: {e}"))?;
        }
        let setup = start.elapsed();
        // Populate the memory untimed, as the selftest does after adding the slots.
        for page in 0..pages {
            memory.write_u64(page * PAGE_SIZE, 0);
        }
        let vm = Self {
            store,
            memory,
            nslots,
            pages,
            pages_per_slot,
            sync: AtomicBool::new(false),
            exit: AtomicBool::new(false),
            mmio_exits: AtomicU64::new(0),
        };
        Ok((vm, setup))
    }

    pub(super) fn base_gfn(&self) -> u64 {
        MEM_GPA >> PAGE_SHIFT
    }

    pub(super) fn last_slot_base_gfn(&self) -> u64 {
        self.base_gfn() + u64::from(self.nslots - 1) * self.pages_per_slot
    }

    /// Host address of the page `page` of the area (host side: the selftest's own
    /// `addr_gpa2hva`, not a KVM lookup).
    pub(super) fn page_hva(&self, page: u64) -> u64 {
        self.memory.host_addr() + page * PAGE_SIZE
    }

    /// One guest access through the engine's translation, as a fault would do it,
    /// to word `WORD` of the page (a constant: an index past the page does not
    /// compile). The snapshot is held only while translating, as KVM holds SRCU in
    /// the fault handler but not while the guest then runs on the mapping.
    pub(super) fn guest_access<const WORD: usize>(
        &self,
        cache: &mut VcpuSlotCache,
        gfn: u64,
        write: Option<u64>,
    ) -> Option<u64> {
        let snapshot = self.store.snapshot();
        let hva = snapshot
            .gfn_to_slot_vcpu(cache, Gfn::new(gfn))
            .and_then(|slot| slot.gfn_to_hva(Gfn::new(gfn), write.is_some()).ok())
            .map(Hva::raw);
        drop(snapshot);
        let Some(hva) = hva else {
            self.mmio_exits.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        // The store keeps slots page-aligned, so `hva` starts a page of the guest's
        // memory. One that does not, or lies outside it (which a correct store never
        // gives), fails the access instead of reaching other memory: one test and
        // the page slice's one bounds check, no check of the word.
        let at = hva.wrapping_sub(self.memory.host_addr());
        if !at.is_multiple_of(PAGE_SIZE) {
            return None;
        }
        let page = self
            .memory
            .pages()
            .get(usize::try_from(at / PAGE_SIZE).ok()?)?;
        let word = &page[WORD];
        match write {
            Some(value) => {
                word.store(value, Ordering::Relaxed);
                Some(value)
            }
            None => Some(word.load(Ordering::Relaxed)),
        }
    }

    /// `madvise(MADV_DONTNEED)` plus what KVM's MMU notifier does for it.
    ///
    /// # Errors
    /// The range is not in the guest's memory, or the kernel refused.
    pub(super) fn host_discard(&self, hva: u64, len: u64) -> Result<(), String> {
        let offset = hva.wrapping_sub(self.memory.host_addr());
        self.memory
            .discard(offset, len)
            .map_err(|e| format!("discard: {e}"))?;
        let snapshot = self.store.snapshot();
        let mut hits = 0u64;
        snapshot.for_each_in_hva_range(Hva::new(hva), Hva::new(hva + len), |overlap| {
            NoStage2.unmap_gfn_range(
                overlap.gfn_start,
                overlap.gfn_end.raw() - overlap.gfn_start.raw(),
            );
            hits += 1;
        });
        black_box(hits);
        Ok(())
    }

    /// The selftest's `host_perform_sync`: raise the flag, wait for the guest to take it.
    pub(super) fn host_sync(&self) {
        self.sync.store(true, Ordering::Release);
        let mut spins = 0u32;
        while self.sync.load(Ordering::Acquire) {
            backoff(&mut spins);
        }
    }

    /// The selftest's `guest_perform_sync`; false once the host asked the guest to stop.
    pub(super) fn guest_sync(&self) -> bool {
        let mut spins = 0u32;
        loop {
            if self
                .sync
                .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return true;
            }
            if self.exit.load(Ordering::Acquire) {
                return false;
            }
            backoff(&mut spins);
        }
    }

    /// The guest of a two-phase scenario: `first`, a sync with the host,
    /// `second`, a sync, over and over with one slot cache, until a sync
    /// says the host stopped.
    pub(super) fn in_turns(
        &self,
        mut first: impl FnMut(&Self, &mut VcpuSlotCache),
        mut second: impl FnMut(&Self, &mut VcpuSlotCache),
    ) {
        let mut cache = VcpuSlotCache::new();
        loop {
            first(self, &mut cache);
            if !self.guest_sync() {
                return;
            }
            second(self, &mut cache);
            if !self.guest_sync() {
                return;
            }
        }
    }

    /// Runs `guest` on its own thread and `iteration` on this one until `seconds` pass;
    /// returns the iterations done and their total time.
    pub(super) fn run_loop(
        &self,
        seconds: Duration,
        guest: impl FnOnce(&Self) + Send,
        mut iteration: impl FnMut(&Self) -> Result<(), String>,
    ) -> Result<(u64, Duration), String> {
        thread::scope(|scope| {
            let guest_thread = scope.spawn(|| guest(self));
            let start = Instant::now();
            let mut iterations = 0;
            let mut outcome = Ok(());
            while start.elapsed() < seconds {
                if let Err(e) = iteration(self) {
                    outcome = Err(e);
                    break;
                }
                iterations += 1;
            }
            let elapsed = start.elapsed();
            self.exit.store(true, Ordering::Release);
            guest_thread
                .join()
                .map_err(|_| "guest thread panicked".to_string())?;
            outcome.map(|()| (iterations, elapsed))
        })
    }
}

pub(super) fn backoff(spins: &mut u32) {
    if *spins < 256 {
        *spins += 1;
        std::hint::spin_loop();
    } else {
        thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::memslot::TreeMemslots;

    #[test]
    fn a_guest_access_reaches_the_word_its_gfn_maps_and_nothing_outside() {
        let (vm, _) = Vm::<TreeMemslots>::prepare(2, 64 * PAGE_SIZE).unwrap();
        let mut cache = VcpuSlotCache::new();
        let gfn = vm.base_gfn();
        // Page 0 of each slot, word 0 and the middle word, written by the
        // guest and read by offset on the host: the same bytes.
        for page in [0, 32, 63] {
            let value = 0x1000 + page;
            let got = vm.guest_access::<0>(&mut cache, gfn + page, Some(value));
            assert_eq!(got, Some(value));
            assert_eq!(vm.memory.read_u64(page * PAGE_SIZE), Some(value));
            vm.guest_access::<HALF_PAGE_WORD>(&mut cache, gfn + page, Some(!value));
            assert_eq!(
                vm.memory.read_u64(page * PAGE_SIZE + PAGE_SIZE / 2),
                Some(!value)
            );
            let read = vm.guest_access::<HALF_PAGE_WORD>(&mut cache, gfn + page, None);
            assert_eq!(read, Some(!value));
        }
        // A gfn no slot maps is an MMIO exit, not an access.
        assert_eq!(vm.guest_access::<0>(&mut cache, gfn + 64, Some(1)), None);
        assert_eq!(vm.guest_access::<0>(&mut cache, gfn - 1, None), None);
        assert_eq!(vm.mmio_exits.load(Ordering::Relaxed), 2);
    }
}
