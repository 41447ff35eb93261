//! The break-before-make monitor's fault injection with the engine at EL2
//! (the harvester's `drop_invalidations_from` under the EL2 placement).
//! EL2 records its descriptor stores and completed invalidations into a
//! trace ring in memory it shares with the host (`s2mmu_el2::trace`); the
//! host reads the ring back for a checker to replay
//! (`s2mmu::bbm::export::replay`, as for the bare-metal EL2 image).
//!
//! With drops from harvest `k`: the trace starts two harvests before (the
//! engine's own operations, which must replay clean); at harvest `k` EL2
//! withholds every invalidation (marked in the trace) while that harvest
//! re-protects and reports pages, and after it logging stops on guest RAM
//! (the split blocks collapsed in place, their table pages freed) and
//! starts again (split again); then the invalidations are issued again
//! with a whole-VMID flush and the trace stops. A replay must find a make
//! before its break's invalidation, a report before a protection's
//! invalidation and a table page freed before its invalidation, all after
//! the mark.

use crate::linux::placement::Placement;
use crate::linux::shared::RAM_SLOT;
use crate::Result;

/// What EL2 recorded for the break-before-make checker.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct El2Trace {
    /// The records as EL2 wrote them (`s2mmu_el2::trace::decode_all`).
    pub bytes: Vec<u8>,
    /// Records in `bytes`.
    pub records: u64,
    /// Records dropped because the ring was full (a replay of a ring that
    /// dropped any is incomplete).
    pub dropped: u64,
    /// Blocks collapsed while the invalidations were withheld.
    pub collapsed: u64,
}

/// The injection's steps as the harvester reaches them.
pub(crate) struct El2Inject {
    at: Option<u64>,
    withheld: bool,
}

impl El2Inject {
    /// Injection from harvest `from`, if the engine runs at EL2.
    pub(crate) fn new(vm: &dyn Placement, from: Option<u64>) -> El2Inject {
        let at = vm.el2().and(from);
        El2Inject {
            at,
            withheld: false,
        }
    }

    /// Before harvest number `harvests + 1`: starts the trace, or withholds.
    ///
    /// # Errors
    /// EL2's refusal.
    pub(crate) fn before_harvest(&mut self, vm: &dyn Placement, harvests: u64) -> Result<()> {
        let (Some(at), Some(v)) = (self.at, vm.el2()) else {
            return Ok(());
        };
        if harvests == at.saturating_sub(2) {
            v.trace_start()?;
        }
        if harvests == at {
            v.withhold(true)?;
            self.withheld = true;
        }
        Ok(())
    }

    /// After a harvest: if it ran withheld, collapses and splits guest RAM
    /// still withheld, then issues the invalidations again and returns the
    /// trace.
    ///
    /// # Errors
    /// EL2's refusal.
    pub(crate) fn after_harvest(&mut self, vm: &dyn Placement) -> Result<Option<El2Trace>> {
        let Some(v) = vm.el2() else {
            return Ok(None);
        };
        if !std::mem::take(&mut self.withheld) {
            return Ok(None);
        }
        let collapsed = v.collapse(RAM_SLOT)?;
        v.enable_dirty_logging(RAM_SLOT)?;
        v.withhold(false)?;
        let (bytes, dropped) = v.trace_stop()?;
        let records = (bytes.len() / (s2mmu_el2::trace::WORDS * 8)) as u64;
        Ok(Some(El2Trace {
            bytes,
            records,
            dropped,
            collapsed,
        }))
    }
}
