//! Attribute updates of existing leaves: write-protect, permission
//! relaxation, access flag. No break-before-make: only permissions change.

use crate::format::{Prot, PteFormat};
use crate::pgtable::PageTable;
use crate::table::MmOps;
use crate::tlb::TlbBatch;
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::{Error, Result};

/// What a permission relaxation found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelaxOutcome {
    /// The leaf before.
    pub old: u64,
    /// The leaf after (equal to `old` if it already allowed the access).
    pub new: u64,
    /// Level of the leaf.
    pub level: u32,
    /// First address the leaf maps.
    pub leaf_ipa: u64,
}

impl RelaxOutcome {
    /// Whether this call made the leaf writable (the moment a dirty-logged
    /// page must be marked dirty).
    pub fn became_writable(&self, write_bit: u64) -> bool {
        self.old & write_bit == 0 && self.new & write_bit != 0
    }
}

impl<F: PteFormat, M: MmOps> PageTable<F, M> {
    /// Removes write permission from every leaf overlapping
    /// `[ipa, ipa + size)` (whole blocks, even partly covered ones). Holes
    /// are skipped. Issues one range invalidation for what it changed and
    /// returns the number of leaves changed.
    ///
    /// # Errors
    /// [`Error::Misaligned`], [`Error::EmptyRange`], [`Error::OutOfRange`].
    pub fn wrprotect(&mut self, ipa: u64, size: u64) -> Result<u64> {
        let tlb = self.tlb.clone();
        let mut batch = TlbBatch::new(&*tlb, self.tlb_policy);
        let n = self.wrprotect_batched(ipa, size, &mut batch)?;
        batch.finish();
        Ok(n)
    }

    /// [`PageTable::wrprotect`] adding its invalidation to `batch`, for
    /// callers that protect many ranges and flush once (dirty-log clear).
    ///
    /// # Errors
    /// As [`PageTable::wrprotect`].
    pub fn wrprotect_batched(
        &mut self,
        ipa: u64,
        size: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        self.check_range(ipa, size)?;
        let w = self.format().write_bit();
        let mut changed = 0u64;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if ctx.fmt.is_valid(ctx.old) && ctx.old & w != 0 {
                ctx.try_set(ctx.old & !w)?;
                changed += 1;
                batch.add(ctx.entry_start(), ctx.granule());
            }
            Ok(WalkAction::Continue)
        };
        self.walk(ipa, size, WalkFlags::LEAF | WalkFlags::IGNORE_AGAIN, &mut v)?;
        Ok(changed)
    }

    /// Hardware dirty state: makes every trackable valid leaf overlapping
    /// `[ipa, ipa + size)` clean (the format's [`crate::HwDirtyBits`]:
    /// arm64 write permission cleared and DBM set, EPT dirty flag cleared),
    /// so the hardware records the next write in the leaf instead of
    /// faulting; adds what it changed to `batch`. Returns the number of
    /// leaves changed.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the format has no hardware dirty state; as
    /// [`PageTable::wrprotect`].
    pub fn clean_hw_dirty_batched(
        &mut self,
        ipa: u64,
        size: u64,
        batch: &mut TlbBatch<'_>,
    ) -> Result<u64> {
        let hw = self.hw_dirty_bits()?;
        self.check_range(ipa, size)?;
        let last = self.format().last_level();
        if last > 0 && size >= self.format().granule(last - 1) {
            // Room for a whole last-level table: cleaned a table at a time.
            return self.clean_hw_dirty_tables(ipa, size, hw, batch);
        }
        let mut changed = 0u64;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            changed += super::hw_clean::clean_leaf(ctx, hw, batch)?;
            Ok(WalkAction::Continue)
        };
        let flags = WalkFlags::LEAF | WalkFlags::IGNORE_AGAIN;
        self.walk(ipa, size, flags, &mut v)?;
        Ok(changed)
    }

    /// Hardware dirty state: calls `dirty(leaf_ipa, leaf_size)` for every
    /// leaf overlapping `[ipa, ipa + size)` that the hardware has dirtied
    /// ([`crate::HwDirtyBits::is_dirty`]). It only reads: cleaning is
    /// [`PageTable::clean_hw_dirty_batched`]. Returns the number of dirty
    /// leaves.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the format has no hardware dirty state; as
    /// [`PageTable::check_range`].
    pub fn scan_hw_dirty(
        &self,
        ipa: u64,
        size: u64,
        mut dirty: impl FnMut(u64, u64),
    ) -> Result<u64> {
        let hw = self.hw_dirty_bits()?;
        self.check_range(ipa, size)?;
        let mut n = 0u64;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if ctx.fmt.is_valid(ctx.old) && hw.is_dirty(ctx.old) {
                dirty(ctx.entry_start(), ctx.granule());
                n += 1;
            }
            Ok(WalkAction::Continue)
        };
        // SAFETY: a read-only walk; the read guard it pins keeps tables
        // alive against concurrent unlinking.
        unsafe { self.walk_unchecked(ipa, size, WalkFlags::LEAF | WalkFlags::SHARED, &mut v)? };
        Ok(n)
    }

    /// Hardware dirty state: takes the hardware's dirty bit off every leaf
    /// overlapping `[ipa, ipa + size)` by compare-and-swap, so the hardware
    /// can no longer change them, and calls `dirty(leaf_ipa, leaf_size)` for
    /// each leaf whose last value was dirty. Done before leaves that may be
    /// dirty are unmapped: a plain store could overwrite a write the
    /// hardware records between the engine's read and its store; a
    /// compare-and-swap that loses to the hardware sees it and tries again
    /// (the hardware changes a leaf at most once, so this ends).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] if the format has no hardware dirty state; as
    /// [`PageTable::check_range`].
    pub fn freeze_hw_dirty(
        &self,
        ipa: u64,
        size: u64,
        mut dirty: impl FnMut(u64, u64),
    ) -> Result<u64> {
        let hw = self.hw_dirty_bits()?;
        self.check_range(ipa, size)?;
        let mut frozen = 0u64;
        loop {
            let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
                if ctx.fmt.is_valid(ctx.old) && ctx.old & hw.freeze_clear != 0 {
                    ctx.try_set(ctx.old & !hw.freeze_clear)?;
                    frozen += 1;
                    if hw.is_dirty(ctx.old) {
                        dirty(ctx.entry_start(), ctx.granule());
                    }
                }
                Ok(WalkAction::Continue)
            };
            match self.walk_shared(ipa, size, WalkFlags::LEAF, &mut v) {
                // Leaves frozen before the lost race stay frozen (and
                // reported); the next pass skips them.
                Err(Error::Again { .. }) => continue,
                r => {
                    r?;
                    return Ok(frozen);
                }
            }
        }
    }

    pub(crate) fn hw_dirty_bits(&self) -> Result<crate::HwDirtyBits> {
        self.format().hw_dirty_bits().ok_or(Error::InvalidConfig {
            what: "hardware dirty state (the format has none)",
            value: 0,
        })
    }

    /// Adds the access permissions of `prot` (read, write, execute) to the
    /// leaf that maps `ipa`, whatever its size, by compare-and-swap (safe
    /// under the read lock: the fault path's fast path). Then invalidates
    /// the address on this CPU only, as KVM does: other CPUs at worst take a
    /// spurious fault on the old entry.
    ///
    /// # Errors
    /// - [`Error::InvalidProt`] if `prot` has memory-type bits;
    /// - [`Error::NotMapped`] if no valid leaf maps `ipa`;
    /// - [`Error::Again`] if the entry changed underneath or is locked.
    pub fn relax_perms(&self, ipa: u64, prot: Prot) -> Result<RelaxOutcome> {
        self.relax_perms_inner(ipa, prot, None)
    }

    /// As [`PageTable::relax_perms`], but only if the leaf is at `level`:
    /// the level a permission fault reported (arm64's ESR fault level), so
    /// a fault handler that trusts it need not walk the table first. A leaf
    /// at another level means the table changed since the fault; nothing is
    /// changed and the access is retried.
    ///
    /// # Errors
    /// As [`PageTable::relax_perms`]; [`Error::Again`] also for a leaf at
    /// another level.
    pub fn relax_perms_at_level(&self, ipa: u64, prot: Prot, level: u32) -> Result<RelaxOutcome> {
        self.relax_perms_inner(ipa, prot, Some(level))
    }

    fn relax_perms_inner(&self, ipa: u64, prot: Prot, level: Option<u32>) -> Result<RelaxOutcome> {
        if prot.contains(Prot::DEVICE) || prot.contains(Prot::NORMAL_NC) {
            return Err(Error::InvalidProt { bits: prot.bits() });
        }
        let page = self.format().page_size();
        self.check_range(ipa & !(page - 1), page)?;
        let set = self.format().perm_bits(prot);
        let mut out = None;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if ctx.fmt.is_locked(ctx.old) {
                return Err(Error::Again { ipa: ctx.addr });
            }
            if !ctx.fmt.is_valid(ctx.old) {
                return Err(Error::NotMapped { ipa: ctx.addr });
            }
            if level.is_some_and(|l| l != ctx.level) {
                return Err(Error::Again { ipa: ctx.addr });
            }
            let mut new = ctx.old | set;
            if prot.contains(Prot::X) {
                new = ctx.fmt.with_exec(new);
            }
            if new != ctx.old {
                ctx.try_set(new)?;
            }
            out = Some(RelaxOutcome {
                old: ctx.old,
                new,
                level: ctx.level,
                leaf_ipa: ctx.entry_start(),
            });
            Ok(WalkAction::Continue)
        };
        let r = self.walk_shared(ipa & !(page - 1), page, WalkFlags::LEAF, &mut v);
        if let Some(o) = out {
            if o.new != o.old {
                self.tlb.flush_ipa_local(ipa, Some(o.level));
            }
        }
        r?;
        out.ok_or(Error::NotMapped { ipa })
    }

    /// Sets the access flag of the leaf that maps `ipa` (an access-flag
    /// fault), by compare-and-swap.
    ///
    /// # Errors
    /// [`Error::NotMapped`] or [`Error::Again`] as for
    /// [`PageTable::relax_perms`].
    pub fn mkyoung(&self, ipa: u64) -> Result<()> {
        let page = self.format().page_size();
        self.check_range(ipa & !(page - 1), page)?;
        let af = self.format().access_flag();
        let mut found = false;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if !ctx.fmt.is_valid(ctx.old) {
                return Err(Error::NotMapped { ipa: ctx.addr });
            }
            found = true;
            if ctx.old & af == 0 {
                ctx.try_set(ctx.old | af)?;
            }
            Ok(WalkAction::Continue)
        };
        self.walk_shared(ipa & !(page - 1), page, WalkFlags::LEAF, &mut v)?;
        if found {
            Ok(())
        } else {
            Err(Error::NotMapped { ipa })
        }
    }

    /// Reports whether any leaf overlapping `[ipa, ipa + size)` has its
    /// access flag set, clearing the flags if `mkold` (page aging). No
    /// invalidation: a stale young entry only delays aging.
    ///
    /// # Errors
    /// [`Error::Misaligned`], [`Error::EmptyRange`], [`Error::OutOfRange`].
    pub fn test_clear_young(&mut self, ipa: u64, size: u64, mkold: bool) -> Result<bool> {
        self.check_range(ipa, size)?;
        let af = self.format().access_flag();
        let mut young = false;
        let mut v = |ctx: &VisitCtx<'_, F, M>, _: Visit| {
            if ctx.fmt.is_valid(ctx.old) && ctx.old & af != 0 {
                young = true;
                if mkold {
                    ctx.try_set(ctx.old & !af)?;
                }
            }
            Ok(WalkAction::Continue)
        };
        self.walk(ipa, size, WalkFlags::LEAF, &mut v)?;
        Ok(young)
    }
}
