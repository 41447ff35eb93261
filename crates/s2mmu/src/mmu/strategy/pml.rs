//! x86 Page-Modification Logging ([`DirtyMode::Pml`]): a per-vCPU log of
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

use super::hw_scan::{hw_split_chunk, salvage_leaves};
use super::*;
use crate::pgtable::Translation;

/// The PML strategy: hardware dirty state as [`super::hw_scan`] has it
/// (leaves cleaned, salvaged before unmapping), harvested from every
/// vCPU's log instead of the leaves.
pub(in crate::mmu) struct PmlLogs<P: Platform> {
    protect: Protect,
    /// Every vCPU's log, by vCPU index.
    logs: RwLock<P, Vec<Arc<PmlLog>>>,
}

impl<P: Platform> PmlLogs<P> {
    pub(super) fn new(protect: Protect) -> Self {
        PmlLogs {
            protect,
            logs: lock_api::RwLock::new(Vec::new()),
        }
    }
}

impl<P: Platform> DirtyStrategy<P> for PmlLogs<P> {
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

    /// The logs hold what a scan would find: no leaf is read.
    fn sync<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        mmu: &Mmu<F, M, S, P>,
        _id: u16,
        _b: &DirtyBitmap,
    ) -> Result<()> {
        mmu.flush_all_pml_with(self, None);
        Ok(())
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

    /// The PML entries of the slot's pages go into its bitmap: their flush
    /// would look the old addresses up in the new memslots and drop them.
    fn before_slot_unmap<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        mmu: &Mmu<F, M, S, P>,
        id: u16,
        base_gfn: u64,
        end_gfn: u64,
    ) {
        mmu.flush_all_pml_with(self, Some((id, base_gfn, end_gfn)));
    }
}

/// Entries of a PML log: one 4 KiB page of 8-byte addresses
/// (`PML_LOG_NR_ENTRIES`).
pub const PML_LOG_ENTRIES: usize = 512;

/// The index of an empty log, where the first entry is written
/// (`PML_HEAD_INDEX`).
const PML_HEAD_INDEX: u16 = (PML_LOG_ENTRIES - 1) as u16;

/// Why [`PmlLog::hw_write`] made no write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PmlWriteError {
    /// The log is full: the write that would set a dirty flag needs the
    /// "log-full" exit ([`Mmu::flush_pml`]) first, and then a retry.
    Full,
    /// The reader is not of the table of the MMU whose vCPU owns the log
    /// (a log records the writes to its own VM's table only).
    ForeignReader,
}

struct PmlState {
    entries: Box<[u64; PML_LOG_ENTRIES]>,
    /// The next entry to write; 0xFFFF (out of range) when full.
    index: u16,
}

impl PmlState {
    fn len(&self) -> usize {
        usize::from(PML_HEAD_INDEX.wrapping_sub(self.index))
    }
}

/// One vCPU's page-modification log ([`VcpuMmu::pml`]).
pub struct PmlLog {
    vcpu: usize,
    /// The [`TableReader::table_id`] of its MMU's table.
    table: u64,
    state: Mutex<DefaultPlatform, PmlState>,
}

impl PmlLog {
    fn new(vcpu: usize, table: u64) -> Self {
        PmlLog {
            vcpu,
            table,
            state: lock_api::Mutex::new(PmlState {
                entries: Box::new([0; PML_LOG_ENTRIES]),
                index: PML_HEAD_INDEX,
            }),
        }
    }

    /// The vCPU whose log this is.
    pub fn vcpu(&self) -> usize {
        self.vcpu
    }

    /// Entries logged and not flushed yet (0 to [`PML_LOG_ENTRIES`]).
    pub fn len(&self) -> usize {
        self.state.lock().len()
    }

    /// Whether the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What a CPU with EPT A/D flags and PML does on a guest write to
    /// `ipa` that missed its TLB: as [`TableReader::hw_dirty_update`], and
    /// when that sets the leaf's dirty flag, the page's address is logged.
    /// `None`: nothing maps `ipa` (a translation fault).
    ///
    /// # Errors
    /// [`PmlWriteError::Full`] when the write would set a dirty flag and
    /// the log is full; [`PmlWriteError::ForeignReader`] for a reader of
    /// another MMU's table. Nothing was changed then.
    pub fn hw_write<F: PteFormat, M: MmOps>(
        &self,
        reader: &TableReader<F, M>,
        ipa: u64,
    ) -> core::result::Result<Option<Translation>, PmlWriteError> {
        if reader.table_id() != self.table {
            return Err(PmlWriteError::ForeignReader);
        }
        let mut st = self.state.lock();
        if st.index > PML_HEAD_INDEX {
            // Full: the SDM checks the index only for a write that would
            // set a dirty flag; others go on.
            let t = reader.translate(ipa);
            let hw = reader.format().hw_dirty_bits();
            return match (t, hw) {
                (Some(t), Some(h)) if t.pte & h.update_mask == h.update_match => {
                    Err(PmlWriteError::Full)
                }
                (t, _) => Ok(t),
            };
        }
        let Some((t, dirtied)) = reader.hw_dirty_update_reporting(ipa) else {
            return Ok(None);
        };
        if dirtied {
            let i = usize::from(st.index);
            st.entries[i] = ipa & !0xfff;
            st.index = st.index.wrapping_sub(1);
        }
        Ok(Some(t))
    }

    /// Moves the entries into `out`, oldest first, and empties the log.
    fn drain(&self, out: &mut Vec<u64>) -> usize {
        let mut st = self.state.lock();
        let n = st.len();
        out.extend(st.entries[PML_LOG_ENTRIES - n..].iter().rev());
        st.index = PML_HEAD_INDEX;
        n
    }
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> Mmu<F, M, S, P> {
    /// The exit handler's PML flush (`vmx_flush_pml_buffer`): records every
    /// page in `vcpu`'s log as dirty in its slot's bitmap and empties the
    /// log. Call it on the "log-full" exit ([`PmlWriteError::Full`]) before retrying
    /// the write, and on every other exit of the vCPU; a harvest
    /// ([`Mmu::get_dirty_log`]) flushes every vCPU's log itself. Returns
    /// the number of entries flushed (a page of a slot that no longer
    /// exists or no longer logs is dropped, as in KVM).
    ///
    /// # Errors
    /// [`Error::ForeignVcpu`] for a vCPU of another MMU.
    pub fn flush_pml(&self, vcpu: &mut VcpuMmu<M>) -> Result<usize> {
        if vcpu.mmu_id != self.id {
            return Err(Error::ForeignVcpu { vcpu: vcpu.id });
        }
        let Some(log) = vcpu.pml.clone() else {
            return Ok(0);
        };
        let mut st = FaultStats::default();
        let n = self.flush_pml_log(&log, &mut st, None);
        vcpu.stats.dirtied += st.dirtied;
        vcpu.stats.pml_entries += st.pml_entries;
        Ok(n)
    }

    /// Flushes every vCPU's log of `pml`: what KVM's kick before
    /// `KVM_GET_DIRTY_LOG` achieves. No leaf is read. `old` (slot id,
    /// first gfn, end gfn) is the range a slot being deleted or moved had:
    /// its pages are marked in that slot's bitmap (the memslots no longer
    /// name it), as KVM flushes the logs before a slot moves.
    fn flush_all_pml_with(&self, pml: &PmlLogs<P>, old: Option<(u16, u64, u64)>) {
        let logs = pml.logs.read().clone();
        let mut st = FaultStats::default();
        for log in &logs {
            self.flush_pml_log(log, &mut st, old);
        }
        self.vm_stats.lock().add(&st);
    }

    fn flush_pml_log(
        &self,
        log: &PmlLog,
        st: &mut FaultStats,
        old: Option<(u16, u64, u64)>,
    ) -> usize {
        let mut gpas = Vec::with_capacity(PML_LOG_ENTRIES);
        let n = log.drain(&mut gpas);
        if n == 0 {
            return 0;
        }
        st.pml_entries += n as u64;
        let snap = self.slots.snapshot();
        // The slot of the previous entry, its gfn range and bitmap: a log
        // mostly holds runs of pages of one slot.
        let mut last: Option<(u16, u64, u64, Arc<DirtyBitmap>)> = None;
        for gpa in gpas {
            let gfn = gpa >> self.page_shift;
            if !last
                .as_ref()
                .is_some_and(|(_, lo, hi, _)| (*lo..*hi).contains(&gfn))
            {
                let range = match old {
                    Some((id, lo, hi)) if (lo..hi).contains(&gfn) => Some((id, lo, hi)),
                    _ => snap
                        .search(Gfn::new(gfn))
                        .filter(|s| s.dirty_logging() && !s.is_invalid())
                        .map(|s| (s.id(), s.base_gfn().raw(), s.end_gfn().raw())),
                };
                last = range.and_then(|(id, lo, hi)| {
                    let b = self.side.get(usize::from(id))?.dirty.load_full()?;
                    Some((id, lo, hi, b))
                });
            }
            let Some((id, base_gfn, _, bitmap)) = &last else {
                continue;
            };
            if self.drop_injected_mark() {
                continue;
            }
            // The page lies inside the slot, which the bitmap covers.
            let tracker: &dyn DirtyTracker = &**bitmap;
            if let Ok(true) = tracker.mark(log.vcpu, u32::from(*id), gfn - base_gfn) {
                st.dirtied += 1;
            }
        }
        n
    }
}
