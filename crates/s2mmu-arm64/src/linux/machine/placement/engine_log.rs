//! The engine of a migratable Linux VM as a migration's session drives
//! its dirty log, wherever the engine runs.

use crate::linux::el2::El2Vm;
use crate::vm::Arm64Mmu;
use crate::Result;
use std::sync::Arc;

/// The engine of a migratable VM as a migration's session drives its
/// dirty log: the host placement's MMU, or a handle on the engine at EL2
/// (whose log runs in manual-protect mode: GET copies, CLEAR protects).
#[derive(Clone)]
pub struct EngineLog(Log);

#[derive(Clone)]
enum Log {
    /// The engine in this process.
    Host(Arc<Arm64Mmu>),
    /// The engine at EL2.
    El2(El2Vm),
}

impl EngineLog {
    /// The log of the host placement's engine.
    pub(crate) fn host(mmu: Arc<Arm64Mmu>) -> EngineLog {
        EngineLog(Log::Host(mmu))
    }

    /// The log of the engine at EL2.
    pub(crate) fn el2(vm: El2Vm) -> EngineLog {
        EngineLog(Log::El2(vm))
    }

    /// Turns logging on for `slot`.
    pub fn enable(&self, slot: u16) -> Result<()> {
        match &self.0 {
            Log::Host(m) => Ok(m.enable_dirty_logging(slot).map(|_| ())?),
            Log::El2(v) => v.enable_dirty_logging(slot),
        }
    }

    /// Turns logging off for `slot`.
    pub fn disable(&self, slot: u16) -> Result<()> {
        match &self.0 {
            Log::Host(m) => Ok(m.disable_dirty_logging(slot)?),
            Log::El2(v) => v.disable_dirty_logging(slot),
        }
    }

    /// GET of `slot`'s log into `words` (a bit per page of the slot).
    pub fn get(&self, slot: u16, words: &mut [u64]) -> Result<()> {
        match &self.0 {
            Log::Host(m) => Ok(m.get_dirty_log(slot, words).map(|_| ())?),
            Log::El2(v) => v.get_dirty_log(slot, words),
        }
    }

    /// CLEAR of the pages `words` names in `slot`'s pages
    /// `first..first + n`.
    pub fn clear(&self, slot: u16, first: u64, n: u64, words: &[u64]) -> Result<()> {
        match &self.0 {
            Log::Host(m) => Ok(m.clear_dirty_log(slot, first, n, words).map(|_| ())?),
            Log::El2(v) => v.clear_dirty_log(slot, first, n, words),
        }
    }

    /// Whether GET leaves the pages writable until a CLEAR.
    pub fn manual_protect(&self) -> bool {
        match &self.0 {
            Log::Host(m) => m.policy().dirty.manual_protect(),
            Log::El2(_) => true,
        }
    }

    /// Whether nothing but a harvest's invalidations and a pause's kick
    /// needs the service CPU while the log runs (the host placement with
    /// eager splits): at EL2 the service CPU carries every GET and CLEAR.
    pub fn service_idle_while_logging(&self) -> bool {
        match &self.0 {
            Log::Host(m) => m.policy().eager_split_chunk.is_some(),
            Log::El2(_) => false,
        }
    }
}
