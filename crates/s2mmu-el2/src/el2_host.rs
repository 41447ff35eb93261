//! Where the memory behind slots is at EL2 ([`El2Host`]): the engine's
//! [`HostMemory`], which `REMAP_PAGE` (`hyp_remap.rs`) changes page by page.

use alloc::collections::BTreeMap;
use s2mmu::mmu::HostMemory;
use s2mmu::{Hva, Pa};

use crate::check::{Region, PAGE};
use crate::platform::RawMutex;

/// The engine's view of the memory behind slots at EL2: a slot's backing
/// address is the physical address ([`s2mmu::mmu::IdentityHost`]), except
/// for the pages `REMAP_PAGE` moved.
#[derive(Default)]
pub(crate) struct El2Host {
    moved: lock_api::Mutex<RawMutex, BTreeMap<u64, u64>>,
}

impl HostMemory for El2Host {
    fn host_to_phys(&self, hva: Hva, size: u64) -> Option<Pa> {
        let hva = hva.raw();
        let moved = self.moved.lock();
        let mut inside = moved.range(hva..hva.saturating_add(size));
        match inside.next() {
            None => Some(Pa::new(hva)),
            // A moved page is contiguous only with itself.
            Some((&at, &pa)) if at == hva && size == PAGE => Some(Pa::new(pa)),
            Some(_) => None,
        }
    }
}

impl El2Host {
    /// Where the backing page `at` is now.
    pub(crate) fn current(&self, at: u64) -> u64 {
        self.moved.lock().get(&at).copied().unwrap_or(at)
    }

    /// How many backing pages are moved now.
    pub(crate) fn moved_pages(&self) -> usize {
        self.moved.lock().len()
    }

    /// Records that backing page `at` now lives at `to`.
    pub(crate) fn record_move(&self, at: u64, to: u64) {
        self.moved.lock().insert(at, to);
    }

    /// Whether a page some backing page moved to lies in `r`.
    pub(crate) fn target_in(&self, r: Region) -> bool {
        self.moved.lock().values().any(|&pa| r.overlaps(pa, PAGE))
    }

    /// Forgets the moves of the backing pages in `r` (its slot is gone).
    pub(crate) fn forget(&self, r: Region) {
        self.moved.lock().retain(|&at, _| !r.overlaps(at, PAGE));
    }
}
