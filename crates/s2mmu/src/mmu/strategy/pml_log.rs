//! A vCPU's page-modification log ([`PmlLog`]): the 4 KiB log page and
//! its index, written by the (simulated) CPU and drained by a flush.

use crate::format::PteFormat;
use crate::pgtable::{TableReader, Translation};
use crate::sync::{DefaultPlatform, Mutex};
use crate::table::MmOps;
use alloc::boxed::Box;
use alloc::vec::Vec;

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
    /// "log-full" exit ([`crate::mmu::Mmu::flush_pml`]) first, and then a retry.
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

/// One vCPU's page-modification log ([`VcpuMmu::pml`](crate::mmu::VcpuMmu::pml)).
pub struct PmlLog {
    vcpu: usize,
    /// The [`TableReader::table_id`] of its MMU's table.
    table: u64,
    state: Mutex<DefaultPlatform, PmlState>,
}

impl PmlLog {
    pub(super) fn new(vcpu: usize, table: u64) -> Self {
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
    pub(in crate::mmu) fn drain(&self, out: &mut Vec<u64>) -> usize {
        let mut st = self.state.lock();
        let n = st.len();
        out.extend(st.entries[PML_LOG_ENTRIES - n..].iter().rev());
        st.index = PML_HEAD_INDEX;
        n
    }
}
