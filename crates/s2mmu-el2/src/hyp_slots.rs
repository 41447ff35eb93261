//! The slot commands: `MEMSLOT_SET`, `LOG_SET`, `UNMAP_RANGE`, `COLLAPSE`.
//! Each holds the slot records' lock from its checks to its record update.

use s2mmu::memslot::{SlotFlags, UserMemoryRegion};
use s2mmu::{Gpa, Hva};

use crate::abi::{HypError, LogMode};
use crate::check::{self, Region};
use crate::hyp::{
    engine_error, slot_arg, Hyp, SlotRecord, Slots, Vm, FLAG_LOG, FLAG_POSTCOPY, FLAG_READONLY,
    MAX_SLOTS,
};
use crate::hyp_postcopy::check_postcopy;

/// `rec` with the log flag `on`.
pub(crate) fn with_log(rec: SlotRecord, on: bool) -> SlotRecord {
    let flags = if on {
        rec.flags | FLAG_LOG
    } else {
        rec.flags & !FLAG_LOG
    };
    SlotRecord { flags, ..rec }
}

impl Hyp {
    /// `MEMSLOT_SET` ([`crate::abi`]): every check before the engine sees
    /// the request; see `docs/el2.md` for their order.
    pub(crate) fn memslot_set(&self, vm: &Vm, args: &[u64; 6]) -> Result<(), HypError> {
        let [id, flags, ipa, size, backing, page_size] = *args;
        let mut slots = vm.slots.lock();
        let i = usize::try_from(id)
            .ok()
            .filter(|&i| i < MAX_SLOTS)
            .ok_or(HypError::SlotOutOfRange)?;
        if flags & !(FLAG_LOG | FLAG_READONLY | FLAG_POSTCOPY) != 0 {
            return Err(HypError::BadArgument);
        }
        let old = slots[i];
        let mut bitmap = None;
        let region = if size == 0 {
            let o = old.ok_or(HypError::NoSuchSlot)?;
            UserMemoryRegion::new(
                i as u16,
                SlotFlags::NONE,
                Gpa::new(o.ipa),
                0,
                Hva::new(o.backing),
            )
        } else {
            self.check_new_slot(vm, &slots, i, args)?;
            bitmap = check_postcopy(&slots, i, flags, size, page_size)?;
            let f = SlotFlags::from_bits((flags & !FLAG_POSTCOPY) as u32);
            UserMemoryRegion::new(i as u16, f, Gpa::new(ipa), size, Hva::new(backing))
        };
        let ps = if size == 0 { check::PAGE } else { page_size };
        vm.mmu
            .set_memory_region(&region, ps)
            .map_err(engine_error)?;
        let mut received = vm.received.lock();
        if size == 0 {
            if let Some(o) = old {
                vm.host.forget(Region::new(o.backing, o.size));
            }
            received[i] = None;
        } else if bitmap.is_some() {
            received[i] = bitmap;
        }
        drop(received);
        slots[i] = (size != 0).then_some(SlotRecord {
            ipa,
            size,
            backing,
            flags,
            page_size,
        });
        Ok(())
    }

    /// The checks of a slot being created, moved or given new flags.
    fn check_new_slot(
        &self,
        vm: &Vm,
        slots: &Slots,
        i: usize,
        args: &[u64; 6],
    ) -> Result<(), HypError> {
        let [_, _, ipa, size, backing, page_size] = *args;
        if ![check::PAGE, 2 << 20, 1 << 30].contains(&page_size) {
            return Err(HypError::BadArgument);
        }
        check::guest_range(ipa, size)?;
        self.layout.check_backing(backing, size)?;
        if let Some(o) = slots[i] {
            if (o.backing, o.size) != (backing, size) {
                return Err(HypError::BackingChanged);
            }
        }
        for (_, s) in slots.iter().enumerate().filter(|(j, _)| *j != i) {
            let Some(s) = s else { continue };
            if Region::new(s.ipa, s.size).overlaps(ipa, size) {
                return Err(HypError::SlotOverlap);
            }
            if Region::new(s.backing, s.size).overlaps(backing, size) {
                return Err(HypError::BackingOverlap);
            }
        }
        // A new slot's backing may not hold a page another's moved to.
        if slots[i].is_none() && vm.host.target_in(Region::new(backing, size)) {
            return Err(HypError::BackingOverlap);
        }
        Ok(())
    }

    /// `LOG_SET`: slot, on (0/1), mode (the VM's, when turning on).
    pub(crate) fn log_set(&self, vm: &Vm, args: &[u64; 6]) -> Result<(), HypError> {
        let mut slots = vm.slots.lock();
        let (id, rec) = slot_arg(&slots, args[0])?;
        let on = match args[1] {
            0 => false,
            1 => true,
            _ => return Err(HypError::BadArgument),
        };
        if on && LogMode::from_code(args[2]) != Some(vm.mode) {
            return Err(HypError::WrongMode);
        }
        if on {
            vm.mmu.enable_dirty_logging(id)
        } else {
            vm.mmu.disable_dirty_logging(id)
        }
        .map_err(engine_error)?;
        slots[usize::from(id)] = Some(with_log(rec, on));
        Ok(())
    }

    /// `UNMAP_RANGE`: the MMU notifier over backing memory.
    pub(crate) fn unmap_range(&self, vm: &Vm, args: &[u64; 6]) -> Result<u64, HypError> {
        let [base, size, ..] = *args;
        check::pages(base, size)?;
        if self.layout.carve_out.overlaps(base, size) {
            return Err(HypError::CarveOut);
        }
        let m = &vm.mmu;
        let n = m
            .invalidate_hva_range_start(Hva::new(base), size)
            .map_err(engine_error)?;
        m.invalidate_hva_range_end(Hva::new(base), size)
            .map_err(engine_error)?;
        Ok(n)
    }

    /// `COLLAPSE`: logging off on a logging slot, its pages collapsed back
    /// into blocks in place (the VM's huge-page recovery).
    pub(crate) fn collapse(&self, vm: &Vm, args: &[u64; 6]) -> Result<u64, HypError> {
        let mut slots = vm.slots.lock();
        let (id, rec) = slot_arg(&slots, args[0])?;
        if rec.flags & FLAG_LOG == 0 {
            return Err(HypError::NotLogging);
        }
        let before = vm.mmu.vm_stats().collapsed;
        vm.mmu.disable_dirty_logging(id).map_err(engine_error)?;
        let n = vm.mmu.vm_stats().collapsed - before;
        slots[usize::from(id)] = Some(with_log(rec, false));
        Ok(n)
    }
}
