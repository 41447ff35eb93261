//! The host moving memory under a running guest: `REMAP_PAGE` (one page
//! of a slot's backing moved to another page of RAM, as a host's page
//! migration does behind KVM's MMU notifier) and `MEMSLOT_DELETE_LOGGED`
//! (a logging slot deleted with its last dirty log, as a VMM moving a
//! framebuffer needs it). Both hold the slot records' lock throughout.

use s2mmu::Hva;

use crate::abi::HypError;
use crate::check::{self, Region, PAGE};
use crate::hyp::{engine_error, slot_arg, Hyp, Slots, Vm};

/// Pages that may be moved away from their slot's backing at once (each
/// costs EL2 a map entry on its heap).
pub const MAX_MOVED: usize = 65536;

/// The slot whose backing holds page `at`.
fn backing_slot(slots: &Slots, at: u64) -> Option<usize> {
    slots
        .iter()
        .position(|s| s.is_some_and(|s| Region::new(s.backing, s.size).overlaps(at, PAGE)))
}

impl Hyp {
    /// `REMAP_PAGE`: backing page, new PA. Checked in this order: unused
    /// arguments not zero ([`HypError::BadArgument`]); either address not
    /// page aligned ([`HypError::Misaligned`]); the new page touching the
    /// carve-out ([`HypError::CarveOut`]) or outside RAM
    /// ([`HypError::NotRam`]); the backing page in no slot's backing
    /// ([`HypError::NoSuchSlot`]); the new page inside a slot's backing or
    /// already a moved page's ([`HypError::BackingOverlap`]); too many
    /// pages moved ([`HypError::OutOfMemory`]).
    pub(crate) fn remap_page(&self, vm: &Vm, args: &[u64; 6]) -> Result<[u64; 4], HypError> {
        let [at, to, ..] = *args;
        if args[2..] != [0; 4] {
            return Err(HypError::BadArgument);
        }
        check::pages(at, PAGE)?;
        self.layout.check_backing(to, PAGE)?;
        let slots = vm.slots.lock();
        backing_slot(&slots, at).ok_or(HypError::NoSuchSlot)?;
        if backing_slot(&slots, to).is_some() || vm.host.target_in(Region::new(to, PAGE)) {
            return Err(HypError::BackingOverlap);
        }
        let from = vm.host.current(at);
        if from == at && vm.host.moved_pages() >= MAX_MOVED {
            return Err(HypError::OutOfMemory);
        }
        let m = &vm.mmu;
        // From here until the range's end, faults on the page retry.
        let n = m
            .invalidate_hva_range_start(Hva::new(at), PAGE)
            .map_err(engine_error)?;
        self.copy_page(from, to);
        vm.host.record_move(at, to);
        m.invalidate_hva_range_end(Hva::new(at), PAGE)
            .map_err(engine_error)?;
        Ok([n, from, 0, 0])
    }

    /// Copies the RAM page at `from` to `to`, both checked to lie in RAM.
    fn copy_page(&self, from: u64, to: u64) {
        let base = self.layout.ram_va;
        let ram = self.layout.ram.base;
        for k in 0..(PAGE / 8) as usize {
            // SAFETY: both pages lie inside `layout.ram` (`to` by
            // `check_backing`, `from` a slot's backing page or an earlier
            // `to`), which `Hyp::new`'s caller keeps reachable at
            // `ram_va`; word aligned. Volatile: the host may touch guest
            // memory at any time.
            unsafe {
                let src = base.add((from - ram) as usize + 8 * k) as *const u64;
                let dst = base.add((to - ram) as usize + 8 * k) as *mut u64;
                core::ptr::write_volatile(dst, core::ptr::read_volatile(src));
            }
        }
    }

    /// `MEMSLOT_DELETE_LOGGED`: slot, bitmap PA, bitmap bytes (a bit per
    /// page of the slot). Checked in this order: unused arguments not zero
    /// ([`HypError::BadArgument`]), the slot's id and existence, the VM
    /// logging into rings ([`HypError::WrongMode`]: its entries stay in
    /// the rings for the next harvest, a plain delete suffices), the slot
    /// not logging ([`HypError::NotLogging`]), the buffer
    /// ([`crate::Layout::check_shared`]).
    pub(crate) fn memslot_delete_logged(&self, vm: &Vm, args: &[u64; 6]) -> Result<u64, HypError> {
        if args[3..] != [0; 3] {
            return Err(HypError::BadArgument);
        }
        let mut slots = vm.slots.lock();
        let (id, rec) = slot_arg(&slots, args[0])?;
        let (off, mut bm) = self.slot_log_buffer(vm, &rec, args[1], args[2])?;
        let m = &vm.mmu;
        let hva = Hva::new(rec.backing);
        // No mapping of the slot is left and its faults retry, so the log
        // read next is the last: nothing can write the slot before it goes.
        m.invalidate_hva_range_start(hva, rec.size)
            .map_err(engine_error)?;
        let got = m.get_dirty_log(id, &mut bm).map_err(engine_error);
        let gone = got.and_then(|_| {
            let r = s2mmu::memslot::UserMemoryRegion::new(
                id,
                s2mmu::memslot::SlotFlags::NONE,
                s2mmu::Gpa::new(rec.ipa),
                0,
                hva,
            );
            m.set_memory_region(&r, PAGE).map_err(engine_error)
        });
        m.invalidate_hva_range_end(hva, rec.size)
            .map_err(engine_error)?;
        gone?;
        vm.host.forget(Region::new(rec.backing, rec.size));
        vm.received.lock()[usize::from(id)] = None;
        slots[usize::from(id)] = None;
        self.put_words(off, &bm);
        Ok(bm.iter().map(|w| u64::from(w.count_ones())).sum())
    }
}
