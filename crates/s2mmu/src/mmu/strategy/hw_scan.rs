//! Hardware dirty state scanned from the leaves ([`DirtyMode::Hardware`](crate::mmu::DirtyMode::Hardware)):
//! logged leaves are left tracked and clean, the hardware dirties them
//! without a fault, a GET scans them into the slot's bitmap, protection
//! cleans them, and leaves about to be unmapped give up their state first.

use super::mode::{DirtyStrategy, StrategyHost};
use crate::dirty::DirtyBitmap;
use crate::mmu::policy::{HwDirtyBlocks, Protect, EAGER_SPLIT_CHUNK};
use crate::Result;

/// The hardware-scan strategy.
pub(in crate::mmu) struct HwScan {
    pub(in crate::mmu) protect: Protect,
    pub(in crate::mmu) blocks: HwDirtyBlocks,
}

/// The split when logging starts with hardware dirty state: a dirty bit
/// per block would log whole blocks, so split first (in 1 GiB chunks
/// without an eager-split chunk), unless blocks are to be logged whole.
pub(super) fn hw_split_chunk(blocks: HwDirtyBlocks, eager: Option<u64>) -> Option<u64> {
    match blocks {
        HwDirtyBlocks::SplitFirst => Some(eager.unwrap_or(EAGER_SPLIT_CHUNK)),
        HwDirtyBlocks::LogWholeBlocks => None,
    }
}

impl DirtyStrategy for HwScan {
    fn protect(&self) -> Option<Protect> {
        Some(self.protect)
    }

    fn split_chunk(&self, eager: Option<u64>) -> Option<u64> {
        hw_split_chunk(self.blocks, eager)
    }

    /// Writes never fault, so a block left whole would be logged whole.
    fn splits_on_clear(&self, _eager: Option<u64>) -> bool {
        self.blocks == HwDirtyBlocks::SplitFirst
    }

    fn hardware_dirty(&self) -> bool {
        true
    }

    fn sync<H: StrategyHost>(&self, host: &H, id: u16, b: &DirtyBitmap) -> Result<()> {
        host.scan_hw_dirty(id, b)
    }
}
