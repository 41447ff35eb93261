//! The engine of a migratable Linux VM as a migration's session drives
//! its dirty log, wherever the engine runs: [`EngineLog`], over the
//! [`PlacedLog`] each placement implements.

use crate::linux::el2::El2Vm;
use crate::vm::Arm64Mmu;
use crate::Result;
use s2mmu::dirty::DirtyGfn;
use s2mmu::mmu::DirtyMode;
use std::sync::Arc;

/// A placement's dirty log, as a migration's session drives it. Each call
/// covers a whole slot or bitmap: nothing per page goes through it.
pub(crate) trait PlacedLog: Send + Sync {
    /// Turns logging on for `slot`.
    fn enable(&self, slot: u16) -> Result<()>;
    /// Turns logging off for `slot`.
    fn disable(&self, slot: u16) -> Result<()>;
    /// GET of `slot`'s log into `words`.
    fn get(&self, slot: u16, words: &mut [u64]) -> Result<()>;
    /// CLEAR of the pages `words` names in `slot`'s `first..first + n`.
    fn clear(&self, slot: u16, first: u64, n: u64, words: &[u64]) -> Result<()>;
    /// Whether GET leaves the pages writable until a CLEAR.
    fn manual_protect(&self) -> bool;
    /// Whether nothing but a harvest's invalidations and a pause's kick
    /// needs the service CPU while the log runs.
    fn service_idle_while_logging(&self) -> bool;
    /// Every vCPU's dirty ring's entries, appended to `out`.
    fn ring_entries(&self, out: &mut Vec<DirtyGfn>) -> Result<()>;
    /// Re-protects the pages the harvested entries name and empties the
    /// rings.
    fn reset_ring_entries(&self) -> Result<()>;
}

/// One harvest of `log` under `mode` into `bitmap`: of each logged slot
/// `(memslot, first bit, pages)`, each slot's first bit a multiple of 64;
/// `ring` is scratch for the rings' entries.
pub(crate) fn harvest(
    log: &dyn PlacedLog,
    mode: DirtyMode,
    slots: &[(u16, u64, u64)],
    bitmap: &mut [u64],
    ring: &mut Vec<DirtyGfn>,
) -> Result<()> {
    if mode.ring_entries().is_some() {
        ring.clear();
        log.ring_entries(ring)?;
        bitmap.fill(0);
        for g in ring.iter() {
            let at = slots
                .iter()
                .find(|s| u32::from(s.0) == g.slot && g.offset < s.2);
            if let Some(&(_, first, _)) = at {
                let b = first + g.offset;
                bitmap[(b / 64) as usize] |= 1 << (b % 64);
            }
        }
        return log.reset_ring_entries();
    }
    for &(slot, first, n) in slots {
        let words = &mut bitmap[(first / 64) as usize..(first + n).div_ceil(64) as usize];
        log.get(slot, words)?;
        if mode.manual_protect() {
            log.clear(slot, 0, n, words)?;
        }
    }
    Ok(())
}

/// The engine of a migratable VM as a migration's session drives its
/// dirty log: the host placement's MMU, or a handle on the engine at EL2
/// (whose log runs in manual-protect mode: GET copies, CLEAR protects).
#[derive(Clone)]
pub struct EngineLog(Arc<dyn PlacedLog>);

impl EngineLog {
    /// The log `log` keeps.
    pub(crate) fn new(log: Arc<dyn PlacedLog>) -> EngineLog {
        EngineLog(log)
    }

    /// Turns logging on for `slot`.
    pub fn enable(&self, slot: u16) -> Result<()> {
        self.0.enable(slot)
    }

    /// Turns logging off for `slot`.
    pub fn disable(&self, slot: u16) -> Result<()> {
        self.0.disable(slot)
    }

    /// GET of `slot`'s log into `words` (a bit per page of the slot).
    pub fn get(&self, slot: u16, words: &mut [u64]) -> Result<()> {
        self.0.get(slot, words)
    }

    /// CLEAR of the pages `words` names in `slot`'s pages
    /// `first..first + n`.
    pub fn clear(&self, slot: u16, first: u64, n: u64, words: &[u64]) -> Result<()> {
        self.0.clear(slot, first, n, words)
    }

    /// Whether GET leaves the pages writable until a CLEAR.
    pub fn manual_protect(&self) -> bool {
        self.0.manual_protect()
    }

    /// Whether nothing but a harvest's invalidations and a pause's kick
    /// needs the service CPU while the log runs (the host placement with
    /// eager splits): at EL2 the service CPU carries every GET and CLEAR.
    pub fn service_idle_while_logging(&self) -> bool {
        self.0.service_idle_while_logging()
    }
}

/// The host placement's log: the engine's MMU in this process.
impl PlacedLog for Arm64Mmu {
    fn enable(&self, slot: u16) -> Result<()> {
        Ok(self.enable_dirty_logging(slot).map(|_| ())?)
    }

    fn disable(&self, slot: u16) -> Result<()> {
        Ok(self.disable_dirty_logging(slot)?)
    }

    fn get(&self, slot: u16, words: &mut [u64]) -> Result<()> {
        Ok(self.get_dirty_log(slot, words).map(|_| ())?)
    }

    fn clear(&self, slot: u16, first: u64, n: u64, words: &[u64]) -> Result<()> {
        Ok(self.clear_dirty_log(slot, first, n, words).map(|_| ())?)
    }

    fn manual_protect(&self) -> bool {
        self.policy().dirty.manual_protect()
    }

    fn service_idle_while_logging(&self) -> bool {
        self.policy().eager_split_chunk.is_some()
    }

    fn ring_entries(&self, out: &mut Vec<DirtyGfn>) -> Result<()> {
        self.harvest_rings(out)?;
        Ok(())
    }

    fn reset_ring_entries(&self) -> Result<()> {
        self.reset_rings()?;
        Ok(())
    }
}

/// The EL2 placement's log, by command blocks.
impl PlacedLog for El2Vm {
    fn enable(&self, slot: u16) -> Result<()> {
        self.enable_dirty_logging(slot)
    }

    fn disable(&self, slot: u16) -> Result<()> {
        self.disable_dirty_logging(slot)
    }

    fn get(&self, slot: u16, words: &mut [u64]) -> Result<()> {
        self.get_dirty_log(slot, words)
    }

    fn clear(&self, slot: u16, first: u64, n: u64, words: &[u64]) -> Result<()> {
        self.clear_dirty_log(slot, first, n, words)
    }

    fn manual_protect(&self) -> bool {
        true
    }

    fn service_idle_while_logging(&self) -> bool {
        false
    }

    fn ring_entries(&self, out: &mut Vec<DirtyGfn>) -> Result<()> {
        self.harvest_rings(out)
    }

    fn reset_ring_entries(&self) -> Result<()> {
        self.reset_rings()
    }
}
