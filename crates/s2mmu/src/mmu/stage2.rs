//! The stage-2 part of an [`Mmu`](super::Mmu): the table behind the MMU
//! lock, its lockless reader (the vCPUs' walker), the TLB backend, and the
//! configuration fixed at creation. What is fixed is kept outside the lock,
//! so reading it (the granule, the IPA limit, where invalidations go) never
//! takes the lock; what changes (the table, the TLB range policy) is only
//! reached through it.

use super::lock::{MmuLock, ReadGuard, WriteGuard};
use super::FaultStats;
use crate::format::PteFormat;
use crate::pgtable::{PageTable, TableReader};
use crate::sync::Platform;
use crate::table::MmOps;
use crate::tlb::{TlbInvalidate, TlbPolicy};
use crate::Result;
use alloc::sync::Arc;

/// What the stage-2 part is made with and never changes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Stage2Config {
    /// log2 of the granule.
    pub(super) page_shift: u32,
    /// The first address beyond the IPA space.
    pub(super) ipa_limit: u64,
}

/// The table, the MMU lock, the TLB backend and the fixed configuration.
pub(super) struct Stage2<F: PteFormat, M: MmOps, P: Platform> {
    table: MmuLock<PageTable<F, M>, P>,
    /// A lockless reader of `table`.
    pub(super) reader: TableReader<F, M>,
    /// Where invalidations go (the table holds the same backend).
    pub(super) tlb: Arc<dyn TlbInvalidate>,
    pub(super) config: Stage2Config,
    /// The table-page allocator (vCPU and split caches are topped up from it).
    pub(super) mm: M,
}

impl<F: PteFormat, M: MmOps, P: Platform> Stage2<F, M, P> {
    /// A table for `fmt` with pages from `mm`, invalidating through `tlb`
    /// as `tlb_policy` says, behind an MMU lock with `reader_slots` slots.
    ///
    /// # Errors
    /// [`crate::Error::OutOfMemory`] for the root.
    pub(super) fn new(
        fmt: F,
        mm: M,
        tlb: Arc<dyn TlbInvalidate>,
        tlb_policy: TlbPolicy,
        reader_slots: usize,
    ) -> Result<Self> {
        let config = Stage2Config {
            page_shift: fmt.page_shift(),
            ipa_limit: fmt.ipa_limit(),
        };
        let mut pt = PageTable::new(fmt, mm.clone(), tlb.clone())?;
        pt.set_tlb_policy(tlb_policy);
        // The table's backend: the caller's, traced where the monitor is on.
        let tlb = pt.tlb().clone();
        Ok(Stage2 {
            reader: pt.reader(),
            table: MmuLock::for_platform(pt, reader_slots),
            tlb,
            config,
            mm,
        })
    }

    /// The MMU lock's reader slot of vCPU `vcpu` (see [`MmuLock::slot_for`]).
    pub(super) fn slot_for(&self, vcpu: usize) -> Option<usize> {
        self.table.slot_for(vcpu)
    }

    /// Takes the MMU lock for reading, through reader slot `slot` where the
    /// caller has one, counting the take and any wait in `st`.
    pub(super) fn read_lock(
        &self,
        st: &mut FaultStats,
        slot: Option<usize>,
    ) -> ReadGuard<'_, PageTable<F, M>, P> {
        let a = self.table.read(slot);
        st.read_locks += 1;
        if let Some(ns) = a.waited_ns {
            st.read_contended += 1;
            st.lock_wait_ns += ns;
        }
        a.guard
    }

    /// Takes the MMU lock for writing, counting the take and any wait.
    pub(super) fn write_lock(&self, st: &mut FaultStats) -> WriteGuard<'_, PageTable<F, M>, P> {
        let a = self.table.write();
        st.write_locks += 1;
        if let Some(ns) = a.waited_ns {
            st.write_contended += 1;
            st.lock_wait_ns += ns;
        }
        a.guard
    }

    /// Runs `f` on the table under the read lock, uncounted.
    pub(super) fn with_table<R>(&self, f: impl FnOnce(&PageTable<F, M>) -> R) -> R {
        f(&self.table.read(None).guard)
    }
}
