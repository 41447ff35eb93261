//! The hook through which memslot updates reach the stage-2 page table.

use crate::addr::Gfn;

/// What a delete or move asks of the stage-2 page table: unmap the old range (and flush
/// its TLB entries) before the new state is published. Called with the store's update lock
/// held, after the temporary `INVALID` stand-in has been published and every reader of the
/// earlier state has finished, so no vCPU can map the old range again.
///
/// The engine's `Mmu` implements this; tests use a recorder.
pub trait Stage2Invalidate {
    /// Unmaps guest frames `[base_gfn, base_gfn + npages)`.
    fn unmap_gfn_range(&self, base_gfn: Gfn, npages: u64);
}

/// A stage-2 hook that does nothing, for stores used without a page table.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoStage2;

impl Stage2Invalidate for NoStage2 {
    fn unmap_gfn_range(&self, _base_gfn: Gfn, _npages: u64) {}
}
