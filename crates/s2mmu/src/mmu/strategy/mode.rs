//! What a dirty-log mode is ([`DirtyStrategy`]), what its hooks may ask of
//! the MMU they serve ([`StrategyHost`], which the MMU implements), and
//! the per-vCPU state a mode gives each vCPU ([`VcpuLog`]).

use super::pml_log::PmlLog;
use crate::dirty::{DirtyBitmap, DirtyRing};
use crate::mmu::policy::Protect;
use crate::Result;
use alloc::sync::Arc;

/// What a mode's hooks ([`DirtyStrategy::sync`],
/// [`DirtyStrategy::before_slot_unmap`]) need
/// of the MMU they serve: the MMU implements it, so a mode depends on this
/// trait rather than on the MMU's type.
pub(in crate::mmu) trait StrategyHost {
    /// The memslots' page shift.
    fn page_shift(&self) -> u32;

    /// Slot `id`'s dirty bitmap, where it has one (it logs).
    fn slot_bitmap(&self, id: u16) -> Option<Arc<DirtyBitmap>>;

    /// Records the leaves of slot `id` the hardware dirtied in its bitmap
    /// `b`, under the MMU lock for reading.
    ///
    /// # Errors
    /// [`crate::Error::NoSuchSlot`], the table's error.
    fn scan_hw_dirty(&self, id: u16, b: &DirtyBitmap) -> Result<()>;

    /// Flushes every log of `logs` into the slots' bitmaps; `old` (slot
    /// id, first gfn, end gfn) is the range a slot being deleted or moved
    /// had, whose pages go to that slot's bitmap.
    fn flush_pml_logs(&self, logs: &[Arc<PmlLog>], old: Option<(u16, u64, u64)>);
}

/// A vCPU's own dirty-log state, read by its faults without a lock.
#[derive(Default)]
pub(in crate::mmu) struct VcpuLog {
    /// Its dirty ring, in ring mode.
    pub(in crate::mmu) ring: Option<Arc<DirtyRing>>,
    /// Its page-modification log, in PML mode.
    pub(in crate::mmu) pml: Option<Arc<PmlLog>>,
}

/// One dirty mode's behaviour. The defaults are write protection's:
/// protect by clearing write permission, nothing to scan, salvage or
/// flush, split as the eager-split policy says.
pub(super) trait DirtyStrategy {
    /// When pages are protected again; `None`: the mode keeps no bitmaps
    /// (rings), so GET, CLEAR, views and host marks are refused.
    fn protect(&self) -> Option<Protect>;

    /// The per-vCPU state of vCPU `id` of the table `table` (what
    /// [`TableReader::table_id`](crate::TableReader::table_id) says), registered with the strategy.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory); nothing is registered then.
    fn new_vcpu(&self, _id: usize, _table: u64) -> Result<VcpuLog> {
        Ok(VcpuLog::default())
    }

    /// The chunk in which huge mappings are split when logging starts,
    /// `None` for no split there, given the policy's eager-split chunk.
    fn split_chunk(&self, eager: Option<u64>) -> Option<u64> {
        eager
    }

    /// Whether a CLEAR splits what it protects where enabling logging
    /// split nothing (initially-set bitmaps): where writes would not split
    /// on their own fault.
    fn splits_on_clear(&self, eager: Option<u64>) -> bool {
        eager.is_some()
    }

    /// Whether the mode tracks writes by the hardware's dirty state in the
    /// leaves: then protecting cleans the leaves instead of clearing write
    /// permission, a CLEAR may protect a last-level table's worth of pages
    /// in one masked walk ([`PageTable::clean_hw_dirty_masked`]), and the
    /// dirty state only the leaves hold is salvaged before they are
    /// unmapped.
    ///
    /// [`PageTable::clean_hw_dirty_masked`]: crate::pgtable::PageTable::clean_hw_dirty_masked
    fn hardware_dirty(&self) -> bool {
        false
    }

    /// Before GET reads slot `id`'s bitmap `b`: records in it what the
    /// mode keeps elsewhere (leaves, logs).
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`](crate::Error::NoSuchSlot), the table's error.
    fn sync<H: StrategyHost>(&self, _host: &H, _id: u16, _b: &DirtyBitmap) -> Result<()> {
        Ok(())
    }

    /// Before slot `id` (gfns `base_gfn..end_gfn`) is deleted or moved,
    /// after the dirty state of its leaves is salvaged: records what is
    /// logged elsewhere for its old range.
    fn before_slot_unmap<H: StrategyHost>(
        &self,
        _host: &H,
        _id: u16,
        _base_gfn: u64,
        _end_gfn: u64,
    ) {
    }
}
