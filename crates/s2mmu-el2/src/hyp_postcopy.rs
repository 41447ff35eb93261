//! Post-copy at EL2: a slot created with [`FLAG_POSTCOPY`] maps no page
//! the host has not said arrived. A first touch of a missing page exits to
//! the host ([`crate::AbortOutcome::PageMissing`]) with nothing mapped; the
//! host fills the page's backing and sends `PAGE_READY`, which marks it
//! received and maps it (the engine's `populate`), and the vCPU resumes.

use alloc::vec::Vec;

use crate::abi::HypError;
use crate::check::PAGE;
use crate::hyp::{engine_error, slot_arg, Hyp, Slots, Vm, FLAG_POSTCOPY};

impl Vm {
    /// Whether `ipa` lies in a post-copy slot and its page has not been
    /// received.
    pub(crate) fn page_missing(&self, ipa: u64) -> bool {
        let slots = self.slots.lock();
        let Some((i, s)) = slots.iter().enumerate().find_map(|(i, s)| {
            s.filter(|s| s.flags & FLAG_POSTCOPY != 0 && ipa >= s.ipa && ipa - s.ipa < s.size)
                .map(|s| (i, s))
        }) else {
            return false;
        };
        let page = (ipa - s.ipa) / PAGE;
        let received = self.received.lock();
        received[i]
            .as_ref()
            .is_none_or(|b| b[(page / 64) as usize] >> (page % 64) & 1 == 0)
    }
}

/// The checks `MEMSLOT_SET` adds for post-copy, before anything changes:
/// a post-copy slot has 4 KiB backing pages, and the flag is given at
/// creation only (an existing slot keeps what it had). For a new
/// post-copy slot, its empty bitmap (reserved fallibly).
pub(crate) fn check_postcopy(
    slots: &Slots,
    i: usize,
    flags: u64,
    size: u64,
    page_size: u64,
) -> Result<Option<Vec<u64>>, HypError> {
    let on = flags & FLAG_POSTCOPY != 0;
    if let Some(old) = slots[i] {
        if (old.flags & FLAG_POSTCOPY != 0) != on {
            return Err(HypError::BadArgument);
        }
        return Ok(None);
    }
    if !on {
        return Ok(None);
    }
    if page_size != PAGE {
        return Err(HypError::BadArgument);
    }
    let words = usize::try_from((size / PAGE).div_ceil(64)).map_err(|_| HypError::OutOfMemory)?;
    let mut bitmap = Vec::new();
    bitmap
        .try_reserve_exact(words)
        .map_err(|_| HypError::OutOfMemory)?;
    bitmap.resize(words, 0);
    Ok(Some(bitmap))
}

impl Hyp {
    /// `PAGE_READY`: slot (post-copy), page offset. Marks the page
    /// received and maps it; the page must be inside the slot and not
    /// received yet.
    pub(crate) fn page_ready(&self, vm: &Vm, args: &[u64; 6]) -> Result<u64, HypError> {
        let slots = vm.slots.lock();
        let (id, rec) = slot_arg(&slots, args[0])?;
        if rec.flags & FLAG_POSTCOPY == 0 || args[2..] != [0; 4] {
            return Err(HypError::BadArgument);
        }
        let page = args[1];
        if page >= rec.size / PAGE {
            return Err(HypError::Overflow);
        }
        let mut received = vm.received.lock();
        let bitmap = received[usize::from(id)].as_mut().ok_or(HypError::Engine)?;
        let (w, bit) = ((page / 64) as usize, 1u64 << (page % 64));
        if bitmap[w] & bit != 0 {
            return Err(HypError::BadArgument);
        }
        let n = vm.mmu.populate(id, page, 1).map_err(engine_error)?;
        bitmap[w] |= bit;
        Ok(n)
    }
}
