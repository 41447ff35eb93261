//! x86 Page-Modification Logging ([`DirtyMode::Pml`](crate::mmu::DirtyMode::Pml)): a per-vCPU log of
//! the guest-physical pages whose EPT dirty flag the CPU set, so a harvest
//! reads the log instead of scanning the slot's leaves.
//!
//! What the hardware does (Intel SDM Vol. 3C, 29.3.6 "Page-Modification
//! Logging"): with the EPTP's A/D flag and the "enable PML" VM-execution
//! control set, before the CPU sets a dirty flag in an EPT leaf it checks
//! the 16-bit PML index. Out of 0..=511, a "page-modification log-full"
//! VM exit happens instead, and neither the flag is set nor the access
//! made. In range, it sets the flag, writes the access's guest-physical
//! address with bits 11:0 cleared to entry `index` of the 4 KiB log page
//! and decrements the index: the log fills from entry 511 down, and the
//! index wraps to 0xFFFF after entry 0 is written.
//!
//! What KVM does with it (Linux `arch/x86/kvm/vmx/vmx.c`,
//! `vmx_flush_pml_buffer`, `PML_LOG_NR_ENTRIES` = 512, `PML_HEAD_INDEX` =
//! 511): on every VM exit, the log-full exit included, it walks the entries
//! above the index, marks each page dirty in its memslot (the bitmap, or
//! the vCPU's dirty ring), and resets the index to 511; before
//! `KVM_GET_DIRTY_LOG` it kicks every vCPU out of the guest so their logs
//! are flushed first. Protecting a page for the next round clears its dirty
//! flag, so the next write logs it again.
//!
//! Here [`PmlLog`] is the log page and index of one vCPU. The simulated
//! CPU's write ([`PmlLog::hw_write`]) sets the dirty flag and appends under
//! the log's lock, and a flush takes the same lock, which stands for the
//! kick: a flush sees a flag set by the hardware only together with its
//! entry, as KVM sees a vCPU's log only at an instruction boundary.

use super::hw_scan::hw_split_chunk;
use super::mode::{DirtyStrategy, StrategyHost, VcpuLog};
use super::pml_log::PmlLog;
use crate::dirty::DirtyBitmap;
use crate::mmu::policy::{HwDirtyBlocks, Protect};
use crate::sync::{Platform, RwLock};
use crate::{Error, Result};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// The PML strategy: hardware dirty state as [`super::hw_scan`] has it
/// (leaves cleaned, salvaged before unmapping), harvested from every
/// vCPU's log instead of the leaves.
pub(in crate::mmu) struct PmlLogs<P: Platform> {
    protect: Protect,
    /// Every vCPU's log, by vCPU index.
    pub(in crate::mmu) logs: RwLock<P, Vec<Arc<PmlLog>>>,
}

impl<P: Platform> PmlLogs<P> {
    pub(super) fn new(protect: Protect) -> Self {
        PmlLogs {
            protect,
            logs: lock_api::RwLock::new(Vec::new()),
        }
    }
}

impl<P: Platform> DirtyStrategy for PmlLogs<P> {
    fn protect(&self) -> Option<Protect> {
        Some(self.protect)
    }

    fn new_vcpu(&self, id: usize, table: u64) -> Result<VcpuLog> {
        let log = Arc::new(PmlLog::new(id, table));
        let mut logs = self.logs.write();
        logs.try_reserve(1).map_err(|_| Error::OutOfMemory)?;
        logs.push(log.clone());
        Ok(VcpuLog {
            ring: None,
            pml: Some(log),
        })
    }

    /// PML logs the 4 KiB page written, not the block whose dirty flag the
    /// write set: blocks are always split first.
    fn split_chunk(&self, eager: Option<u64>) -> Option<u64> {
        hw_split_chunk(HwDirtyBlocks::SplitFirst, eager)
    }

    fn splits_on_clear(&self, _eager: Option<u64>) -> bool {
        true
    }

    fn hardware_dirty(&self) -> bool {
        true
    }

    /// The logs hold what a scan would find: no leaf is read.
    fn sync<H: StrategyHost>(&self, host: &H, _id: u16, _b: &DirtyBitmap) -> Result<()> {
        host.flush_pml_logs(&self.logs.read().clone(), None);
        Ok(())
    }

    /// The PML entries of the slot's pages go into its bitmap: their flush
    /// would look the old addresses up in the new memslots and drop them.
    fn before_slot_unmap<H: StrategyHost>(&self, host: &H, id: u16, base_gfn: u64, end_gfn: u64) {
        host.flush_pml_logs(&self.logs.read().clone(), Some((id, base_gfn, end_gfn)));
    }
}
