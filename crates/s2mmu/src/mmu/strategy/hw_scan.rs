//! Hardware dirty state scanned from the leaves ([`DirtyMode::Hardware`]):
//! logged leaves are left tracked and clean, the hardware dirties them
//! without a fault, a GET scans them into the slot's bitmap, protection
//! cleans them, and leaves about to be unmapped give up their state first.

use super::*;

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

/// Hardware dirty state: records the leaves of slot `id` the hardware
/// dirtied in its bitmap `b` (the scan KVM's DBM series does before it
/// copies the bitmap). Runs under the MMU lock for reading: the hardware
/// updates leaves concurrently, and only protection, under the write lock,
/// cleans them.
fn scan<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform>(
    mmu: &Mmu<F, M, S, P>,
    id: u16,
    b: &DirtyBitmap,
) -> Result<()> {
    let (base, size) = mmu.slot_range(id)?;
    let mut st = FaultStats::default();
    let pt = mmu.read_lock(&mut st, None);
    pt.scan_hw_dirty_into(base, size, base, b)?;
    drop(pt);
    mmu.vm_stats.lock().add(&st);
    Ok(())
}

/// Freezes the leaves of `[ipa, ipa + len)` (slot `id`, whose guest range
/// starts at `slot_base`) so the hardware can no longer dirty them, and
/// marks in the slot's bitmap the pages of those it had dirtied, before
/// they are unmapped.
pub(super) fn salvage_leaves<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform>(
    mmu: &Mmu<F, M, S, P>,
    pt: &PageTable<F, M>,
    id: u16,
    slot_base: u64,
    ipa: u64,
    len: u64,
) -> Result<()> {
    let bitmap = mmu
        .side
        .get(usize::from(id))
        .and_then(|s| s.dirty.load_full());
    let shift = mmu.page_shift;
    pt.freeze_hw_dirty(ipa, len, |leaf, size| {
        if let Some(b) = &bitmap {
            let first = (leaf.max(slot_base) - slot_base) >> shift;
            for p in first..first + (size >> shift) {
                b.mark(p);
            }
        }
    })?;
    Ok(())
}

impl<P: Platform> DirtyStrategy<P> for HwScan {
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

    fn protect_range<F: PteFormat, M: MmOps>(
        &self,
        pt: &mut PageTable<F, M>,
        ipa: u64,
        size: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        pt.clean_hw_dirty_batched(ipa, size, batch)
    }

    fn masked_clear(&self) -> bool {
        true
    }

    fn sync<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        mmu: &Mmu<F, M, S, P>,
        id: u16,
        b: &DirtyBitmap,
    ) -> Result<()> {
        scan(mmu, id, b)
    }

    fn salvage<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        mmu: &Mmu<F, M, S, P>,
        pt: &PageTable<F, M>,
        id: u16,
        slot_base: u64,
        ipa: u64,
        len: u64,
    ) -> Result<()> {
        salvage_leaves(mmu, pt, id, slot_base, ipa, len)
    }
}
