//! One memory slot: a guest-physical range backed by a host-virtual range.

use core::ops::{BitOr, Range};

use crate::addr::{Gfn, Gpa, Hva};

/// Memslot flags, KVM's uapi bits plus the kernel-internal `INVALID` bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SlotFlags(u32);

impl SlotFlags {
    /// No flags.
    pub const NONE: Self = Self(0);
    /// `KVM_MEM_LOG_DIRTY_PAGES`: dirty logging is on for this slot.
    pub const LOG_DIRTY_PAGES: Self = Self(1 << 0);
    /// `KVM_MEM_READONLY`: guest writes to this slot are refused (they exit as MMIO).
    pub const READONLY: Self = Self(1 << 1);
    /// `KVM_MEMSLOT_INVALID`: the stand-in that a delete or move publishes while the old
    /// range is being unmapped. Lookups find it; translation to an hva refuses it.
    pub const INVALID: Self = Self(1 << 16);
    /// The flags userspace may set.
    pub const USER_MASK: u32 = Self::LOG_DIRTY_PAGES.0 | Self::READONLY.0;

    /// Flags from raw bits, unchecked (validation happens on update).
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every bit of `other` is set here.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for SlotFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// Why a gfn could not be translated to a host address through a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HvaFault {
    /// The gfn is not inside the slot.
    NotInSlot,
    /// The slot is the temporary stand-in of a delete or move (KVM_HVA_ERR_BAD).
    Invalid,
    /// A write to a read-only slot (KVM_HVA_ERR_RO_BAD).
    ReadOnly,
}

/// One memory slot. Immutable once published: a change makes a new `Slot`, and the two
/// memslot sets share `Arc<Slot>` objects.
///
/// The dirty bitmap will become a field of this struct (the dirty-logging work); nothing
/// here depends on the struct being `Copy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    id: u16,
    base_gfn: u64,
    npages: u64,
    userspace_addr: u64,
    flags: SlotFlags,
    page_shift: u32,
}

impl Slot {
    /// A slot. Callers normally get slots from a store; this constructor exists for tests
    /// and reference models. `npages` must be non-zero for the slot to cover anything.
    pub const fn new(
        id: u16,
        base_gfn: Gfn,
        npages: u64,
        userspace_addr: Hva,
        flags: SlotFlags,
        page_shift: u32,
    ) -> Self {
        Self {
            id,
            base_gfn: base_gfn.raw(),
            npages,
            userspace_addr: userspace_addr.raw(),
            flags,
            page_shift,
        }
    }

    /// Slot id (address-space-less).
    pub const fn id(&self) -> u16 {
        self.id
    }

    /// Whether pages `[first, first + n)` of the slot (offsets from its
    /// first page) lie inside it.
    pub(crate) fn holds_pages(&self, first: u64, n: u64) -> bool {
        first.checked_add(n).is_some_and(|end| end <= self.npages)
    }

    /// First guest frame number.
    pub const fn base_gfn(&self) -> Gfn {
        Gfn::new(self.base_gfn)
    }

    /// Size in pages.
    pub const fn npages(&self) -> u64 {
        self.npages
    }

    /// One past the last gfn. Validation guarantees this does not wrap.
    pub const fn end_gfn(&self) -> Gfn {
        Gfn::new(self.base_gfn + self.npages)
    }

    /// The gfns covered, half open.
    pub const fn gfn_range(&self) -> Range<Gfn> {
        self.base_gfn()..self.end_gfn()
    }

    /// Host virtual address of the first page.
    pub const fn userspace_addr(&self) -> Hva {
        Hva::new(self.userspace_addr)
    }

    /// One past the last host byte. Validation guarantees this does not wrap.
    pub const fn hva_end(&self) -> Hva {
        Hva::new(self.userspace_addr + (self.npages << self.page_shift))
    }

    /// Flags, including `INVALID` for a stand-in.
    pub const fn flags(&self) -> SlotFlags {
        self.flags
    }

    /// log2 of the page size the slot was created with.
    pub const fn page_shift(&self) -> u32 {
        self.page_shift
    }

    /// Whether dirty logging is on.
    pub const fn dirty_logging(&self) -> bool {
        self.flags.contains(SlotFlags::LOG_DIRTY_PAGES)
    }

    /// Whether this is the temporary stand-in of a delete or move.
    pub const fn is_invalid(&self) -> bool {
        self.flags.contains(SlotFlags::INVALID)
    }

    /// Whether `gfn` lies inside the slot (KVM's `try_get_memslot`).
    pub const fn contains(&self, gfn: Gfn) -> bool {
        let gfn = gfn.raw();
        gfn >= self.base_gfn && gfn - self.base_gfn < self.npages
    }

    /// Host address of `gfn` for an access (`write` or read), as KVM's
    /// `__gfn_to_hva_many`.
    ///
    /// # Errors
    /// [`HvaFault::NotInSlot`] if the gfn is outside, [`HvaFault::Invalid`] for a stand-in,
    /// [`HvaFault::ReadOnly`] for a write to a read-only slot.
    pub const fn gfn_to_hva(&self, gfn: Gfn, write: bool) -> Result<Hva, HvaFault> {
        if !self.contains(gfn) {
            return Err(HvaFault::NotInSlot);
        }
        if self.is_invalid() {
            return Err(HvaFault::Invalid);
        }
        if write && self.flags.contains(SlotFlags::READONLY) {
            return Err(HvaFault::ReadOnly);
        }
        Ok(Hva::new(
            self.userspace_addr + ((gfn.raw() - self.base_gfn) << self.page_shift),
        ))
    }

    /// The gfn that `hva` maps to in this slot (KVM's `hva_to_gfn_memslot`), or `None`
    /// if `hva` lies outside the slot's host range.
    pub const fn hva_to_gfn(&self, hva: Hva) -> Option<Gfn> {
        let hva = hva.raw();
        if hva < self.userspace_addr || hva >= self.hva_end().raw() {
            return None;
        }
        Some(Gfn::new(
            self.base_gfn + ((hva - self.userspace_addr) >> self.page_shift),
        ))
    }

    /// The temporary stand-in published while the old range is unmapped.
    pub(crate) fn to_invalid(&self) -> Self {
        Self {
            flags: self.flags | SlotFlags::INVALID,
            ..self.clone()
        }
    }
}

/// KVM's `struct kvm_userspace_memory_region`, the request of one memslot update.
///
/// `memory_size == 0` deletes the slot; otherwise the request creates the slot, or moves
/// it (new `guest_phys_addr`), or changes its flags. [`Gpa`] and [`Hva`] are
/// `repr(transparent)` over `u64`, so the layout is still the uapi one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserMemoryRegion {
    /// Bits 0..15: slot id; bits 16..31: address-space id.
    pub slot: u32,
    /// `LOG_DIRTY_PAGES` and/or `READONLY`.
    pub flags: u32,
    /// Guest-physical base address.
    pub guest_phys_addr: Gpa,
    /// Size in bytes; 0 deletes.
    pub memory_size: u64,
    /// Host virtual address backing the first byte.
    pub userspace_addr: Hva,
}

impl UserMemoryRegion {
    /// A create, move or flags change for slot `id` in address space 0.
    pub const fn new(
        id: u16,
        flags: SlotFlags,
        guest_phys_addr: Gpa,
        memory_size: u64,
        userspace_addr: Hva,
    ) -> Self {
        Self {
            slot: id as u32,
            flags: flags.bits(),
            guest_phys_addr,
            memory_size,
            userspace_addr,
        }
    }

    /// A delete of slot `id` in address space 0.
    pub const fn delete(id: u16) -> Self {
        Self {
            slot: id as u32,
            flags: 0,
            guest_phys_addr: Gpa::new(0),
            memory_size: 0,
            userspace_addr: Hva::new(0),
        }
    }

    /// The slot id (low 16 bits of `slot`).
    pub const fn id(&self) -> u16 {
        self.slot as u16
    }

    /// The address-space id (high 16 bits of `slot`).
    pub const fn as_id(&self) -> u16 {
        (self.slot >> 16) as u16
    }
}

/// What an accepted update did (KVM's `enum kvm_mr_change`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemslotChange {
    /// A new slot.
    Create,
    /// A slot removed; its old range was unmapped.
    Delete,
    /// A slot given a new guest-physical base; its old range was unmapped.
    Move,
    /// Dirty logging switched on or off.
    FlagsOnly,
}
