//! What every `tlb-perf` model measures: the figures of one harvest cycle
//! and the slot's setup (mapped with 4K pages, logging enabled).

use s2mmu::memslot::MemslotStore;
use s2mmu::mmu::Mmu;
use s2mmu::sync::Platform;
use s2mmu::{MmOps, PteFormat};
use std::time::{Duration, Instant};

/// What every model's harvest cycle measures; each model's sample holds
/// one, next to the figures only that model counts.
#[derive(Clone, Copy, Debug, Default)]
pub struct CycleTimes {
    /// The GET's time.
    pub get: Duration,
    /// The CLEAR's time (all chunks).
    pub clear: Duration,
    /// Time spent waiting for TLB invalidation during the clear.
    pub inv: Duration,
    /// TLB invalidation calls the clear made.
    pub calls: u64,
    /// Pages the clear write-protected.
    pub cleared: u64,
}

/// What the slot's setup took, which every model reports.
#[derive(Clone, Copy, Debug)]
pub struct SlotFacts {
    /// Pages of the slot.
    pub npages: u64,
    /// Table pages mapping it.
    pub table_pages: usize,
    /// Mapping it with 4K pages.
    pub populate_time: Duration,
    /// Enabling its dirty logging.
    pub enable_time: Duration,
}

/// Maps slot `slot`'s `npages` pages with 4K pages and enables its dirty
/// logging, timing both: the setup every model does once its slot exists.
///
/// # Errors
/// The engine's error, as text.
pub fn map_and_log<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform>(
    mmu: &Mmu<F, M, S, P>,
    slot: u16,
    npages: u64,
) -> Result<SlotFacts, String> {
    let e = |e: s2mmu::Error| e.to_string();
    let t = Instant::now();
    mmu.populate(slot, 0, npages).map_err(e)?;
    let populate_time = t.elapsed();
    let table_pages = mmu.with_table(|pt| pt.table_pages());
    let t = Instant::now();
    mmu.enable_dirty_logging(slot).map_err(e)?;
    let enable_time = t.elapsed();
    Ok(SlotFacts {
        npages,
        table_pages,
        populate_time,
        enable_time,
    })
}
