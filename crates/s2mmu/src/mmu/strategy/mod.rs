//! The dirty-log strategy: how a VM tracks the pages its guest writes while
//! a slot logs, chosen once when the [`Mmu`] is made from
//! [`MmuPolicy::dirty`] and held as one object with its own state.
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

use super::*;

pub(super) mod hw_scan;
pub(super) mod pml;
pub(super) mod ring;
pub(super) mod wp;

/// A vCPU's own dirty-log state, read by its faults without a lock.
#[derive(Default)]
pub(super) struct VcpuLog {
    /// Its dirty ring, in ring mode.
    pub(super) ring: Option<Arc<DirtyRing>>,
    /// Its page-modification log, in PML mode.
    pub(super) pml: Option<Arc<PmlLog>>,
}

/// One dirty mode's behaviour. The defaults are write protection's:
/// protect by clearing write permission, nothing to scan, salvage or
/// flush, split as the eager-split policy says.
pub(super) trait DirtyStrategy<P: Platform> {
    /// When pages are protected again; `None`: the mode keeps no bitmaps
    /// (rings), so GET, CLEAR, views and host marks are refused.
    fn protect(&self) -> Option<Protect>;

    /// The per-vCPU state of vCPU `id` of the table `table` (what
    /// [`TableReader::table_id`] says), registered with the strategy.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`]; nothing is registered then.
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

    /// Protects `[ipa, ipa + size)` for the next round of logging.
    ///
    /// # Errors
    /// The table's error.
    fn protect_range<F: PteFormat, M: MmOps>(
        &self,
        pt: &mut PageTable<F, M>,
        ipa: u64,
        size: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        pt.wrprotect_batched(ipa, size, batch)
    }

    /// Whether a CLEAR may protect a last-level table's worth of pages in
    /// one masked walk ([`PageTable::clean_hw_dirty_masked`]).
    fn masked_clear(&self) -> bool {
        false
    }

    /// Before GET reads slot `id`'s bitmap `b`: records in it what the
    /// mode keeps elsewhere (leaves, logs).
    ///
    /// # Errors
    /// [`Error::NoSuchSlot`], the table's error.
    fn sync<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        _mmu: &Mmu<F, M, S, P>,
        _id: u16,
        _b: &DirtyBitmap,
    ) -> Result<()> {
        Ok(())
    }

    /// Before the leaves of `[ipa, ipa + len)` (slot `id`, whose guest
    /// range starts at `slot_base`) are unmapped: moves the dirty state
    /// only they hold into the slot's bitmap.
    ///
    /// # Errors
    /// The table's error.
    fn salvage<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        _mmu: &Mmu<F, M, S, P>,
        _pt: &PageTable<F, M>,
        _id: u16,
        _slot_base: u64,
        _ipa: u64,
        _len: u64,
    ) -> Result<()> {
        Ok(())
    }

    /// Before slot `id` (gfns `base_gfn..end_gfn`) is deleted or moved,
    /// after [`DirtyStrategy::salvage`] of its range: records what is
    /// logged elsewhere for its old range.
    fn before_slot_unmap<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        _mmu: &Mmu<F, M, S, P>,
        _id: u16,
        _base_gfn: u64,
        _end_gfn: u64,
    ) {
    }
}

/// The strategy an [`Mmu`] runs: one of the modes, with its state.
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
        dispatch!(self, s => DirtyStrategy::<P>::protect(s))
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
        dispatch!(self, s => DirtyStrategy::<P>::new_vcpu(s, id, table))
    }

    /// See [`DirtyStrategy::split_chunk`].
    pub(super) fn split_chunk(&self, eager: Option<u64>) -> Option<u64> {
        dispatch!(self, s => DirtyStrategy::<P>::split_chunk(s, eager))
    }

    /// See [`DirtyStrategy::splits_on_clear`].
    pub(super) fn splits_on_clear(&self, eager: Option<u64>) -> bool {
        dispatch!(self, s => DirtyStrategy::<P>::splits_on_clear(s, eager))
    }

    /// See [`DirtyStrategy::protect_range`].
    pub(super) fn protect_range<F: PteFormat, M: MmOps>(
        &self,
        pt: &mut PageTable<F, M>,
        ipa: u64,
        size: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        dispatch!(self, s => DirtyStrategy::<P>::protect_range(s, pt, ipa, size, batch))
    }

    /// See [`DirtyStrategy::masked_clear`].
    pub(super) fn masked_clear(&self) -> bool {
        dispatch!(self, s => DirtyStrategy::<P>::masked_clear(s))
    }

    /// See [`DirtyStrategy::sync`].
    pub(super) fn sync<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        mmu: &Mmu<F, M, S, P>,
        id: u16,
        b: &DirtyBitmap,
    ) -> Result<()> {
        dispatch!(self, s => DirtyStrategy::<P>::sync(s, mmu, id, b))
    }

    /// See [`DirtyStrategy::salvage`].
    pub(super) fn salvage<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        mmu: &Mmu<F, M, S, P>,
        pt: &PageTable<F, M>,
        id: u16,
        slot_base: u64,
        ipa: u64,
        len: u64,
    ) -> Result<()> {
        dispatch!(self, s => DirtyStrategy::<P>::salvage(s, mmu, pt, id, slot_base, ipa, len))
    }

    /// See [`DirtyStrategy::before_slot_unmap`].
    pub(super) fn before_slot_unmap<F: PteFormat, M: MmOps, S: MemslotStore>(
        &self,
        mmu: &Mmu<F, M, S, P>,
        id: u16,
        base_gfn: u64,
        end_gfn: u64,
    ) {
        dispatch!(self, s => DirtyStrategy::<P>::before_slot_unmap(s, mmu, id, base_gfn, end_gfn))
    }
}
