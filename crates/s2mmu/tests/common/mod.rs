//! Test helpers shared by the engine's integration tests and fuzz target.
#![allow(dead_code)]

pub mod model;

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::tlb::TlbRecorder;
use s2mmu::{HostMmOps, MapOptions, PageCache, PageTable, Prot, PteFormat};
use std::sync::Arc;

/// A table with a recording TLB backend.
pub struct Fixture<F: PteFormat = Arm64Stage2> {
    pub pt: PageTable<F, HostMmOps>,
    pub mm: HostMmOps,
    pub tlb: Arc<TlbRecorder>,
    pub cache: PageCache<HostMmOps>,
}

pub fn fixture(granule: Granule, ipa_bits: u32) -> Fixture {
    fixture_for(Arm64Stage2::new(granule, ipa_bits).unwrap())
}

/// A fixture for a table of any format.
pub fn fixture_for<F: PteFormat>(fmt: F) -> Fixture<F> {
    let mm = HostMmOps::new(fmt.page_size() as usize).unwrap();
    let tlb = Arc::new(TlbRecorder::new());
    let pt = PageTable::new(fmt, mm.clone(), tlb.clone()).unwrap();
    let cache = PageCache::new(mm.clone());
    Fixture { pt, mm, tlb, cache }
}

impl<F: PteFormat> Fixture<F> {
    /// Maps `[ipa, ipa + size)` read-write to `pa` in pages only (no
    /// block), tables from the fixture's cache.
    pub fn map_pages(&mut self, ipa: u64, size: u64, pa: u64) {
        let force = MapOptions { force_pages: true };
        self.pt
            .map(ipa, size, pa, Prot::RW, &mut self.cache, force)
            .unwrap();
    }

    /// Table pages allocated and not freed or waiting for reclamation must
    /// be exactly those reachable from the root plus those in the cache.
    pub fn assert_no_leak(&self) {
        let s = self.mm.stats();
        let reachable = self.pt.table_pages();
        assert_eq!(
            s.live_pages - s.deferred_pages,
            reachable + self.cache.len(),
            "live {} deferred {} reachable {} cached {}",
            s.live_pages,
            s.deferred_pages,
            reachable,
            self.cache.len()
        );
        self.pt.check_counts().unwrap();
    }
}
