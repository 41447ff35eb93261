//! The dirty-log strategy: how a VM tracks the pages its guest writes while
//! a slot logs, chosen once when the [`Mmu`](crate::mmu::Mmu) is made from
//! [`MmuPolicy::dirty`](crate::mmu::MmuPolicy::dirty) and held as one object with its own state.
//!
//! Each mode is one implementation of [`DirtyStrategy`] in a file of its
//! own: write protection into bitmaps ([`wp`]), write protection into
//! per-vCPU rings ([`ring`], which alone owns rings), hardware dirty state
//! scanned from the leaves ([`hw_scan`]) and hardware dirty state with
//! page-modification logs ([`pml`], which alone owns the logs). The fault
//! path, GET and CLEAR, dirty views, the MMU notifier, populate, the
//! sparse clear and logging on and off ask the strategy what to do instead
//! of testing the mode; the fault path itself reads only the vCPU's own
//! state ([`VcpuLog`], made by [`DirtyStrategy::new_vcpu`]).
//!
//! [`Strategy`] dispatches by `match` (no indirect call: the compiler
//! inlines each arm). Adding a mode (FEAT_HDBSS, say) is its file here, a
//! variant of [`Strategy`] and of [`DirtyMode`] (`mmu/policy.rs`, which
//! also names and parses it for the command line).

use crate::dirty::DirtyBitmap;
use crate::format::PteFormat;
use crate::mmu::policy::{DirtyMode, Protect};
use crate::pgtable::PageTable;
use crate::sync::Platform;
use crate::table::MmOps;
use crate::tlb::TlbBatch;
use crate::{Error, Result};

mod hw_scan;
mod mode;
mod pml;
mod pml_log;
mod ring;
mod wp;

use mode::DirtyStrategy;
pub(super) use mode::{StrategyHost, VcpuLog};
pub use pml_log::{PmlLog, PmlWriteError, PML_LOG_ENTRIES};
pub(super) use ring::Rings;

/// The strategy an [`Mmu`](crate::mmu::Mmu) runs: one of the modes, with its state.
pub(super) enum Strategy<P: Platform> {
    /// [`DirtyMode::Bitmap`].
    WriteProtect(wp::WriteProtect),
    /// [`DirtyMode::Ring`].
    Ring(ring::Rings<P>),
    /// [`DirtyMode::Hardware`].
    Hardware(hw_scan::HwScan),
    /// [`DirtyMode::Pml`].
    Pml(pml::PmlLogs<P>),
}

/// Runs `$body` with `$s` bound to the strategy object, whatever its mode.
macro_rules! dispatch {
    ($strategy:expr, $s:ident => $body:expr) => {
        match $strategy {
            Strategy::WriteProtect($s) => $body,
            Strategy::Ring($s) => $body,
            Strategy::Hardware($s) => $body,
            Strategy::Pml($s) => $body,
        }
    };
}

impl<P: Platform> Strategy<P> {
    /// The strategy for `mode` over format `fmt`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a ring size out of range or hardware
    /// dirty state on a format without it.
    pub(super) fn new<F: PteFormat>(mode: DirtyMode, fmt: &F) -> Result<Self> {
        let no_hw = || Error::InvalidConfig {
            what: "hardware dirty state (the format has none)",
            value: 0,
        };
        Ok(match mode {
            DirtyMode::Bitmap { protect } => Strategy::WriteProtect(wp::WriteProtect { protect }),
            DirtyMode::Ring { entries } => Strategy::Ring(ring::Rings::new(entries)?),
            DirtyMode::Hardware { protect, blocks } => {
                fmt.hw_dirty_bits().ok_or_else(no_hw)?;
                Strategy::Hardware(hw_scan::HwScan { protect, blocks })
            }
            DirtyMode::Pml { protect } => {
                fmt.hw_dirty_bits().ok_or_else(no_hw)?;
                Strategy::Pml(pml::PmlLogs::new(protect))
            }
        })
    }

    /// See [`DirtyStrategy::protect`].
    pub(super) fn protect(&self) -> Option<Protect> {
        dispatch!(self, s => DirtyStrategy::protect(s))
    }

    /// Whether bitmaps start all set.
    pub(super) fn initially_set(&self) -> bool {
        self.protect().is_some_and(Protect::initially_set)
    }

    /// Whether GET only copies and CLEAR protects.
    pub(super) fn manual_protect(&self) -> bool {
        self.protect().is_some_and(Protect::manual)
    }

    /// The protection of a bitmap mode.
    ///
    /// # Errors
    /// [`Error::WrongDirtyMode`] in a mode without bitmaps (rings).
    pub(super) fn bitmaps(&self) -> Result<Protect> {
        self.protect().ok_or(Error::WrongDirtyMode {
            needs: "dirty bitmaps (the VM uses dirty rings)",
        })
    }

    /// See [`DirtyStrategy::new_vcpu`].
    pub(super) fn new_vcpu(&self, id: usize, table: u64) -> Result<VcpuLog> {
        dispatch!(self, s => DirtyStrategy::new_vcpu(s, id, table))
    }

    /// See [`DirtyStrategy::split_chunk`].
    pub(super) fn split_chunk(&self, eager: Option<u64>) -> Option<u64> {
        dispatch!(self, s => DirtyStrategy::split_chunk(s, eager))
    }

    /// See [`DirtyStrategy::splits_on_clear`].
    pub(super) fn splits_on_clear(&self, eager: Option<u64>) -> bool {
        dispatch!(self, s => DirtyStrategy::splits_on_clear(s, eager))
    }

    /// See [`DirtyStrategy::hardware_dirty`].
    fn hardware_dirty(&self) -> bool {
        dispatch!(self, s => DirtyStrategy::hardware_dirty(s))
    }

    /// Protects `[ipa, ipa + size)` for the next round of logging: cleans
    /// the leaves with hardware dirty state, clears write permission
    /// otherwise.
    ///
    /// # Errors
    /// The table's error.
    pub(super) fn protect_range<F: PteFormat, M: MmOps>(
        &self,
        pt: &mut PageTable<F, M>,
        ipa: u64,
        size: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        if self.hardware_dirty() {
            pt.clean_hw_dirty_batched(ipa, size, batch)
        } else {
            pt.wrprotect_batched(ipa, size, batch)
        }
    }

    /// Whether a CLEAR may protect a last-level table's worth of pages in
    /// one masked walk ([`PageTable::clean_hw_dirty_masked`]).
    pub(super) fn masked_clear(&self) -> bool {
        self.hardware_dirty()
    }

    /// See [`DirtyStrategy::sync`].
    pub(super) fn sync<H: StrategyHost>(&self, host: &H, id: u16, b: &DirtyBitmap) -> Result<()> {
        dispatch!(self, s => DirtyStrategy::sync(s, host, id, b))
    }

    /// Before the leaves of `[ipa, ipa + len)` (slot `id`, whose guest
    /// range starts at `slot_base`) are unmapped: with hardware dirty
    /// state, moves what only they hold into the slot's bitmap.
    ///
    /// # Errors
    /// The table's error.
    pub(super) fn salvage<H: StrategyHost, F: PteFormat, M: MmOps>(
        &self,
        host: &H,
        pt: &PageTable<F, M>,
        id: u16,
        slot_base: u64,
        ipa: u64,
        len: u64,
    ) -> Result<()> {
        if !self.hardware_dirty() {
            return Ok(());
        }
        // Frozen, the hardware can no longer dirty them; the pages of
        // those it had dirtied go into the slot's bitmap.
        let bitmap = host.slot_bitmap(id);
        let shift = host.page_shift();
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

    /// See [`DirtyStrategy::before_slot_unmap`].
    pub(super) fn before_slot_unmap<H: StrategyHost>(
        &self,
        host: &H,
        id: u16,
        base_gfn: u64,
        end_gfn: u64,
    ) {
        dispatch!(self, s => DirtyStrategy::before_slot_unmap(s, host, id, base_gfn, end_gfn))
    }
}
