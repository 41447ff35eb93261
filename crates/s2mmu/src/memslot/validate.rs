//! The checks of KVM's `kvm_set_memory_region()`, shared by both policies.

use super::config::MemslotConfig;
use super::error::MemslotError;
use super::lookup::SlotLookup;
use super::slot::{MemslotChange, Slot, SlotFlags, UserMemoryRegion};
use crate::addr::Gfn;

/// An update that passed every check, ready to apply.
#[derive(Debug)]
pub(crate) struct Plan {
    pub change: MemslotChange,
    pub id: u16,
    /// The slot after the update; `None` for a delete.
    pub new: Option<Slot>,
}

/// Checks `req` against `set` in KVM's order and classifies it.
///
/// # Errors
/// The first failed check, as a [`MemslotError`]; [`MemslotError::NoChange`] when the
/// request equals the slot as it is.
pub(crate) fn plan_update<S: SlotLookup + ?Sized>(
    config: &MemslotConfig,
    req: &UserMemoryRegion,
    set: &S,
) -> Result<Plan, MemslotError> {
    let (id, npages) = check_request(config, req)?;
    let old = set.id_to_slot(id);
    if npages == 0 {
        return match old {
            Some(_) => Ok(Plan {
                change: MemslotChange::Delete,
                id,
                new: None,
            }),
            None => Err(MemslotError::NoSuchSlot { id }),
        };
    }
    let base_gfn = req.guest_phys_addr.gfn(config.page_shift);
    let change = classify(old, req, base_gfn, npages, set)?;
    if matches!(change, MemslotChange::Create | MemslotChange::Move) {
        let mut other = None;
        set.for_each_in_gfn_range(base_gfn, Gfn::new(base_gfn.raw() + npages), |slot| {
            if slot.id() != id && other.is_none() {
                other = Some(slot.id());
            }
        });
        if let Some(other) = other {
            return Err(MemslotError::Overlap { slot: id, other });
        }
    }
    let flags = SlotFlags::from_bits(req.flags);
    let new = Slot::new(
        id,
        base_gfn,
        npages,
        req.userspace_addr,
        flags,
        config.page_shift,
    );
    Ok(Plan {
        change,
        id,
        new: Some(new),
    })
}

/// The checks that need no memslot state, in KVM's order: flags, id,
/// alignment, wrap-around, size. Returns the id and the size in pages.
fn check_request(
    config: &MemslotConfig,
    req: &UserMemoryRegion,
) -> Result<(u16, u64), MemslotError> {
    if !matches!(config.page_shift, 12 | 14 | 16) {
        return Err(MemslotError::BadConfig {
            what: "page_shift",
            value: u64::from(config.page_shift),
        });
    }
    if req.flags & !SlotFlags::USER_MASK != 0 {
        return Err(MemslotError::InvalidFlags { flags: req.flags });
    }
    let id = req.id();
    if id >= config.max_user_slots {
        return Err(MemslotError::IdOutOfRange {
            id,
            max: config.max_user_slots,
        });
    }
    let page_mask = config.page_size() - 1;
    if req.memory_size & page_mask != 0 {
        return Err(MemslotError::Misaligned {
            what: "memory_size",
            value: req.memory_size,
        });
    }
    if req.guest_phys_addr.raw() & page_mask != 0 {
        return Err(MemslotError::Misaligned {
            what: "guest_phys_addr",
            value: req.guest_phys_addr.raw(),
        });
    }
    if req.userspace_addr.raw() & page_mask != 0 {
        return Err(MemslotError::Misaligned {
            what: "userspace_addr",
            value: req.userspace_addr.raw(),
        });
    }
    if req.userspace_addr.checked_add(req.memory_size).is_none() {
        return Err(MemslotError::Wraps {
            what: "userspace_addr",
            start: req.userspace_addr.raw(),
            len: req.memory_size,
        });
    }
    if req.as_id() != 0 {
        return Err(MemslotError::AddressSpaceOutOfRange {
            as_id: req.as_id(),
            max: 1,
        });
    }
    if req.guest_phys_addr.checked_add(req.memory_size).is_none() {
        return Err(MemslotError::Wraps {
            what: "guest_phys_addr",
            start: req.guest_phys_addr.raw(),
            len: req.memory_size,
        });
    }
    let npages = req.memory_size >> config.page_shift;
    if npages > config.max_npages {
        return Err(MemslotError::TooLarge {
            npages,
            max: config.max_npages,
        });
    }

    Ok((id, npages))
}

/// What an accepted request does to the slot it names (`old`): create,
/// move or change flags; the fields KVM keeps immutable must not change.
fn classify<S: SlotLookup + ?Sized>(
    old: Option<&Slot>,
    req: &UserMemoryRegion,
    base_gfn: Gfn,
    npages: u64,
    set: &S,
) -> Result<MemslotChange, MemslotError> {
    let Some(old) = old else {
        if set.total_pages().checked_add(npages).is_none() {
            return Err(MemslotError::Wraps {
                what: "total_pages",
                start: set.total_pages(),
                len: npages,
            });
        }
        return Ok(MemslotChange::Create);
    };
    if old.userspace_addr() != req.userspace_addr {
        return Err(MemslotError::ImmutableChange {
            what: "userspace_addr",
        });
    }
    if old.npages() != npages {
        return Err(MemslotError::ImmutableChange { what: "npages" });
    }
    let old_flags = old.flags().bits() & SlotFlags::USER_MASK;
    if (old_flags ^ req.flags) & SlotFlags::READONLY.bits() != 0 {
        return Err(MemslotError::ImmutableChange { what: "readonly" });
    }
    if old.base_gfn() != base_gfn {
        Ok(MemslotChange::Move)
    } else if old_flags != req.flags {
        Ok(MemslotChange::FlagsOnly)
    } else {
        Err(MemslotError::NoChange { id: req.id() })
    }
}
