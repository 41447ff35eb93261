//! How the sender collects the guest's dirty set: a strategy it holds, one
//! per [`Harvest`] method. With bitmaps a round's log is read by GET and
//! each chunk's bits are cleared (its pages write-protected again) just
//! before the chunk's pages are sent; with rings every vCPU's ring is
//! reaped into the pending set whenever one fills, while pages are sent
//! and at the end of each round.

use super::Harvest;
use crate::stream_error::MigrateError;
use crate::vm::{RingEntry, SessionVm};
use crate::wire::PAGE_SIZE;

/// Pages per job when the rings are reaped between jobs.
const RING_JOB_PAGES: u64 = 256;

/// The sender's harvest strategy.
pub(super) enum Harvester {
    /// GET per round, CLEAR per chunk just before its pages are sent.
    Bitmap {
        /// Pages per `clear_dirty_log` call (a multiple of 64).
        chunk_pages: u64,
    },
    /// Per-vCPU dirty rings, reaped when one fills and at each round.
    Ring {
        /// vCPUs whose rings are watched.
        vcpus: usize,
        /// The entries of the last reap (its allocation kept).
        gfns: Vec<RingEntry>,
    },
}

impl Harvester {
    /// The strategy of `harvest`, clearing `clear_chunk` bytes of bitmap
    /// at a time, over `vcpus` rings.
    pub(super) fn new(harvest: Harvest, clear_chunk: u64, vcpus: usize) -> Self {
        match harvest {
            Harvest::Bitmap => Harvester::Bitmap {
                chunk_pages: (clear_chunk / PAGE_SIZE as u64 / 64 * 64).max(64),
            },
            Harvest::Ring => Harvester::Ring {
                vcpus,
                gfns: Vec::new(),
            },
        }
    }

    /// Pages per job of a round: a bitmap chunk, or a short job between
    /// reaps.
    pub(super) fn job_pages(&self) -> u64 {
        match self {
            Harvester::Bitmap { chunk_pages } => *chunk_pages,
            Harvester::Ring { .. } => RING_JOB_PAGES,
        }
    }

    /// Whether the rings must be reaped while pages are sent (a full ring
    /// stalls its vCPU): the jobs are then handed on without blocking.
    pub(super) fn reaps_while_sending(&self) -> bool {
        matches!(self, Harvester::Ring { .. })
    }

    /// Just before the pages `mask` marks (from page `first` of slot
    /// `slot`, `n` pages) are read: with bitmaps their dirty bits are
    /// cleared, so a write after it is logged again.
    pub(super) fn before_send<V: SessionVm>(
        &self,
        vm: &V,
        slot: u16,
        first: u64,
        n: u64,
        mask: &[u64],
    ) -> Result<(), MigrateError> {
        match self {
            Harvester::Bitmap { .. } => vm
                .clear_dirty_log(slot, first, n, mask)
                .map_err(|e| MigrateError::Setup(e.what)),
            Harvester::Ring { .. } => Ok(()),
        }
    }

    /// End of a round: what the guest dirtied since its pages were last
    /// protected, added to `pending` (one bitmap per slot).
    pub(super) fn harvest<V: SessionVm>(
        &mut self,
        vm: &V,
        pending: &mut [Vec<u64>],
    ) -> Result<(), MigrateError> {
        match self {
            Harvester::Bitmap { .. } => {
                for (slot, bm) in vm.slots().iter().zip(pending.iter_mut()) {
                    vm.get_dirty_log(slot.id, bm)
                        .map_err(|e| MigrateError::Setup(e.what))?;
                }
                Ok(())
            }
            Harvester::Ring { gfns, .. } => reap(vm, gfns, pending),
        }
    }

    /// With the vCPUs paused: everything still dirty (nothing is
    /// protected again; the guest will not run here again).
    pub(super) fn final_harvest<V: SessionVm>(
        &mut self,
        vm: &V,
        pending: &mut [Vec<u64>],
    ) -> Result<(), MigrateError> {
        match self {
            Harvester::Bitmap { .. } => self.harvest(vm, pending),
            Harvester::Ring { gfns, .. } => {
                gfns.clear();
                vm.harvest_rings(gfns)
                    .map_err(|e| MigrateError::Setup(e.what))?;
                mark(vm, gfns, pending);
                Ok(())
            }
        }
    }

    /// While pages are sent: reaps the rings if one is full (bitmaps:
    /// nothing).
    pub(super) fn reap_if_full<V: SessionVm>(
        &mut self,
        vm: &V,
        pending: &mut [Vec<u64>],
    ) -> Result<(), MigrateError> {
        match self {
            Harvester::Ring { vcpus, gfns } if (0..*vcpus).any(|v| vm.ring_soft_full(v)) => {
                reap(vm, gfns, pending)
            }
            _ => Ok(()),
        }
    }
}

/// Harvests every ring into `pending`, then resets them (which protects
/// the pages again: they are read only after this).
fn reap<V: SessionVm>(
    vm: &V,
    gfns: &mut Vec<RingEntry>,
    pending: &mut [Vec<u64>],
) -> Result<(), MigrateError> {
    gfns.clear();
    vm.harvest_rings(gfns)
        .and_then(|()| vm.reset_rings())
        .map_err(|e| MigrateError::Setup(format!("reaping the dirty rings: {e}")))?;
    mark(vm, gfns, pending);
    Ok(())
}

/// Marks the pages of `gfns` in `pending`.
fn mark<V: SessionVm>(vm: &V, gfns: &[RingEntry], pending: &mut [Vec<u64>]) {
    for g in gfns {
        let Some(slot) = vm.slots().iter().position(|s| u32::from(s.id) == g.slot) else {
            continue;
        };
        if let Some(w) = pending[slot].get_mut((g.offset / 64) as usize) {
            *w |= 1 << (g.offset % 64);
        }
    }
}
