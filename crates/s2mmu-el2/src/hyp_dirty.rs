//! The dirty-log commands (GET, CLEAR, ring harvest and reset) and the
//! counters, and how EL2 touches the memory it shares with the host: only
//! by volatile word accesses, and a buffer the host hands in is copied
//! before it is used, so the host changing it meanwhile changes nothing.

use alloc::vec::Vec;
use s2mmu::dirty::DirtyGfn;

use crate::abi::{Counters, HypError, LogMode, RingEntry};
use crate::check::{self, PAGE};
use crate::hyp::{slot_arg, Hyp, SlotRecord, Vm, FLAG_LOG};

/// `n` copies of `v`, or [`HypError::OutOfMemory`] where EL2's heap cannot
/// hold them (a size from the host must not abort EL2).
pub(crate) fn try_vec<T: Clone>(n: usize, v: T) -> Result<Vec<T>, HypError> {
    let mut out = Vec::new();
    out.try_reserve_exact(n)
        .map_err(|_| HypError::OutOfMemory)?;
    out.resize(n, v);
    Ok(out)
}

impl Hyp {
    /// Writes `words` at byte offset `off` of the shared area.
    pub(crate) fn put_words(&self, off: usize, words: &[u64]) {
        let base = self.layout.shared_va;
        for (k, w) in words.iter().enumerate() {
            // SAFETY: `check_shared` put `[off, off + 8 * words.len())`
            // inside the shared area and `off` 8-aligned (the area is page
            // aligned); `Hyp::new`'s caller keeps it mapped. Volatile: the
            // host may read it concurrently.
            unsafe { core::ptr::write_volatile(base.add(off + 8 * k) as *mut u64, *w) };
        }
    }

    /// Copies `n` words from byte offset `off` of the shared area.
    fn get_words(&self, off: usize, n: usize) -> Result<Vec<u64>, HypError> {
        let base = self.layout.shared_va;
        let mut out = try_vec(n, 0u64)?;
        for (k, w) in out.iter_mut().enumerate() {
            // SAFETY: as in `put_words`.
            *w = unsafe { core::ptr::read_volatile(base.add(off + 8 * k) as *const u64) };
        }
        Ok(out)
    }

    /// `GET_DIRTY`: slot, bitmap PA, bitmap bytes (at least one bit per
    /// page of the slot, in whole words). Refused for rings
    /// ([`HypError::WrongMode`]) and slots that do not log.
    pub(crate) fn get_dirty(&self, vm: &Vm, args: &[u64; 6]) -> Result<u64, HypError> {
        let slots = vm.slots.lock();
        let (id, rec) = slot_arg(&slots, args[0])?;
        let (off, mut bm) = self.slot_log_buffer(vm, &rec, args[1], args[2])?;
        let n = vm
            .mmu
            .get_dirty_log(id, &mut bm)
            .map_err(|_| HypError::Engine)?;
        self.put_words(off, &bm);
        Ok(n)
    }

    /// The buffer a whole slot's log is read into (`GET_DIRTY`, a logged
    /// delete): refused where the VM logs into rings
    /// ([`HypError::WrongMode`]) or the slot does not log
    /// ([`HypError::NotLogging`]); then `bytes` at `pa` must hold a bit per
    /// page of the slot ([`crate::Layout::check_shared`]). Returns the
    /// buffer's offset in the shared area and a zeroed bitmap of its size.
    pub(crate) fn slot_log_buffer(
        &self,
        vm: &Vm,
        rec: &SlotRecord,
        pa: u64,
        bytes: u64,
    ) -> Result<(usize, Vec<u64>), HypError> {
        if vm.mode == LogMode::Ring {
            return Err(HypError::WrongMode);
        }
        if rec.flags & FLAG_LOG == 0 {
            return Err(HypError::NotLogging);
        }
        let need = check::bitmap_bytes(rec.size / PAGE);
        let off = self.layout.check_shared(pa, bytes, need)?;
        Ok((off, try_vec((need / 8) as usize, 0u64)?))
    }

    /// `CLEAR_DIRTY`: slot, first page (a multiple of 64), pages, bitmap
    /// PA, bitmap bytes. Only with manual protect (`manual`, `hw`).
    pub(crate) fn clear_dirty(&self, vm: &Vm, args: &[u64; 6]) -> Result<u64, HypError> {
        let slots = vm.slots.lock();
        let (id, rec) = slot_arg(&slots, args[0])?;
        if !matches!(vm.mode, LogMode::Manual | LogMode::Hw) {
            return Err(HypError::WrongMode);
        }
        if rec.flags & FLAG_LOG == 0 {
            return Err(HypError::NotLogging);
        }
        let [_, first, num, pa, bytes, _] = *args;
        if num == 0 {
            return Err(HypError::BadSize);
        }
        if !first.is_multiple_of(64) {
            return Err(HypError::Misaligned);
        }
        match first.checked_add(num) {
            Some(end) if end <= rec.size / PAGE => {}
            _ => return Err(HypError::Overflow),
        }
        let need = check::bitmap_bytes(num);
        let off = self.layout.check_shared(pa, bytes, need)?;
        let bm = self.get_words(off, (need / 8) as usize)?;
        vm.mmu
            .clear_dirty_log(id, first, num, &bm)
            .map_err(|_| HypError::Engine)
    }

    /// `RING_HARVEST`: output PA and bytes, room for every entry the rings
    /// can hold (vCPUs x entries, 16 bytes each), so nothing harvested is
    /// dropped.
    pub(crate) fn ring_harvest(&self, vm: &Vm, args: &[u64; 6]) -> Result<u64, HypError> {
        if vm.mode != LogMode::Ring {
            return Err(HypError::WrongMode);
        }
        let cap = vm.vcpus.len() as u64 * vm.ring_entries;
        let need = cap * core::mem::size_of::<RingEntry>() as u64;
        let off = self.layout.check_shared(args[0], args[1], need)?;
        let mut out: Vec<DirtyGfn> = Vec::new();
        out.try_reserve_exact(cap as usize)
            .map_err(|_| HypError::OutOfMemory)?;
        let n = vm
            .mmu
            .harvest_rings(&mut out)
            .map_err(|_| HypError::Engine)?;
        let mut words: Vec<u64> = Vec::new();
        words
            .try_reserve_exact(out.len() * 2)
            .map_err(|_| HypError::OutOfMemory)?;
        words.extend(out.iter().flat_map(|g| [u64::from(g.slot), g.offset]));
        self.put_words(off, &words);
        Ok(n as u64)
    }

    /// `RING_RESET`.
    pub(crate) fn ring_reset(&self, vm: &Vm) -> Result<u64, HypError> {
        if vm.mode != LogMode::Ring {
            return Err(HypError::WrongMode);
        }
        vm.mmu.reset_rings().map_err(|_| HypError::Engine)
    }

    /// `COUNTERS`: output PA and bytes ([`Counters`]).
    pub(crate) fn write_counters(&self, args: &[u64; 6]) -> Result<(), HypError> {
        let need = core::mem::size_of::<Counters>() as u64;
        let off = self.layout.check_shared(args[0], args[1], need)?;
        let words = self.counters().to_words();
        self.put_words(off, &words);
        Ok(())
    }
}
