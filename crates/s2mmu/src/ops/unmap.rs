//! Unmap: clear leaves in a range and free the tables that become empty.

use crate::format::PteFormat;
use crate::pgtable::PageTable;
use crate::table::MmOps;
use crate::tlb::TlbBatch;
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::{Error, Result};
use alloc::vec::Vec;
use core::sync::atomic::Ordering;

/// What an unmap did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnmapStats {
    /// Leaves cleared.
    pub leaves: u64,
    /// Bytes those leaves mapped.
    pub bytes: u64,
    /// Table pages freed because they became empty.
    pub tables_freed: u64,
    /// Invalidation calls issued.
    pub tlb_calls: u64,
}

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// Unmaps `[ipa, ipa + size)`. Unmapped holes in the range are fine (as
    /// `munmap`); tables left empty are unlinked and freed once no lockless
    /// reader can be walking them. One range invalidation covering what was
    /// unmapped is issued before the tables are freed.
    ///
    /// # Errors
    /// [`Error::Misaligned`], [`Error::EmptyRange`], [`Error::OutOfRange`] for
    /// a bad range; [`Error::SplitsBlock`] when the range covers only part of
    /// a block mapping. On error the table is unchanged.
    pub fn unmap(&mut self, ipa: u64, size: u64) -> Result<UnmapStats> {
        self.check_range(ipa, size)?;
        self.check_no_partial_block(ipa, size)?;
        let tlb = self.tlb.clone();
        let mut batch = TlbBatch::new(&*tlb, self.tlb_policy);
        let mut freed = Vec::new();
        let mut stats = UnmapStats::default();
        let mut v = |ctx: &VisitCtx<'_, F, M>, visit: Visit| {
            match visit {
                Visit::Leaf if ctx.old != 0 => {
                    ctx.try_set(0)?;
                    stats.leaves += 1;
                    stats.bytes += ctx.granule();
                    batch.add(ctx.entry_start(), ctx.granule());
                }
                Visit::TablePost => {
                    let child = ctx.fmt.output_address(ctx.old);
                    if ctx.mm.entry_count(child).load(Ordering::Acquire) == 0 {
                        ctx.try_set(0)?;
                        freed.push(child);
                        batch.add(ctx.entry_start(), ctx.granule());
                    }
                }
                _ => {}
            }
            Ok(WalkAction::Continue)
        };
        self.walk(ipa, size, WalkFlags::LEAF | WalkFlags::TABLE_POST, &mut v)?;
        stats.tables_freed = freed.len() as u64;
        stats.tlb_calls = batch.finish();
        crate::bbm::free_tables(self.bbm_id(), &freed);
        // SAFETY: the tables were unlinked above and the invalidation that
        // covers them has been issued; readers still inside are protected by
        // the deferral.
        unsafe { self.mm().free_pages_deferred(freed) };
        Ok(stats)
    }

    /// Refuses a range that starts or ends inside a valid block.
    pub(crate) fn check_no_partial_block(&self, ipa: u64, size: u64) -> Result<()> {
        let end = ipa + size;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            let s = ctx.entry_start();
            if ctx.fmt.is_valid(ctx.old) && (s < ipa || s + ctx.granule() > end) {
                return Err(Error::SplitsBlock {
                    block_ipa: ctx.entry_start(),
                    block_size: ctx.granule(),
                });
            }
            Ok(WalkAction::Continue)
        };
        // Only the first and last page can be inside a partly covered block.
        let page = self.format().page_size();
        let last = ipa + size - page;
        // SAFETY: read-only walks under the read guard they pin.
        unsafe {
            self.walk_unchecked(ipa, page, WalkFlags::LEAF | WalkFlags::SHARED, &mut v)?;
            self.walk_unchecked(last, page, WalkFlags::LEAF | WalkFlags::SHARED, &mut v)?;
        }
        Ok(())
    }
}
