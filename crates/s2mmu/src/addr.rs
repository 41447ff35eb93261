//! Typed addresses for the facade's public API: a guest-physical address,
//! a guest frame number, a host-virtual address and a host-physical one are
//! all 64-bit numbers, and passing one where another is meant compiles as
//! bare `u64` and goes wrong at run time. Built with an explicit constructor
//! (no `From<u64>`), so every place that makes one says which it is.
//!
//! What stays `u64` on purpose: sizes in bytes, page counts, and page
//! offsets within a slot (`Mmu::populate`, `Mmu::dirty_pages`, the
//! `offset` of a [`crate::dirty::DirtyGfn`]): those are indexes into one
//! slot, not addresses, and only mean something next to the slot id. The
//! low-level [`crate::PageTable`] keeps `u64` IPAs too (see its docs).
//!
//! Conversions between the kinds that can overflow are checked and return
//! `Option`: [`Gfn::gpa`] (a frame number shifted past bit 63), the
//! `checked_add`s. Those that cannot ([`Gpa::gfn`]) return the value.

use core::fmt;

macro_rules! address {
    ($(#[$doc:meta])* $name:ident, $unit:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[repr(transparent)]
        pub struct $name(u64);

        impl $name {
            /// The value `raw`.
            #[inline]
            pub const fn new(raw: u64) -> Self {
                $name(raw)
            }

            /// The value as a number.
            #[inline]
            pub const fn raw(self) -> u64 {
                self.0
            }

            #[doc = concat!("This value plus `n` ", $unit, ", or `None` if that passes `u64::MAX`.")]
            #[inline]
            pub const fn checked_add(self, n: u64) -> Option<Self> {
                match self.0.checked_add(n) {
                    Some(v) => Some($name(v)),
                    None => None,
                }
            }

            #[doc = concat!("How many ", $unit, " this value lies above `base`, or `None` if it lies below.")]
            #[inline]
            pub const fn offset_from(self, base: Self) -> Option<u64> {
                self.0.checked_sub(base.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }

        impl fmt::LowerHex for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::LowerHex::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

address!(
    /// A guest-physical address (an IPA on arm64): what a stage-2 fault
    /// reports and the stage-2 table translates; a memslot's
    /// `guest_phys_addr`.
    Gpa,
    "bytes"
);
address!(
    /// A guest frame number: a guest-physical address shifted right by the
    /// page shift. What memslots are indexed by (KVM's `gfn_t`).
    Gfn,
    "pages"
);
address!(
    /// A host-virtual address: where the hypervisor's process (or the host
    /// kernel) sees guest memory, what a memslot's `userspace_addr` is and
    /// what the MMU notifier invalidates.
    Hva,
    "bytes"
);
address!(
    /// A host-physical address: what a stage-2 leaf descriptor points at,
    /// what [`crate::mmu::HostMemory::host_to_phys`] returns for an [`Hva`].
    Pa,
    "bytes"
);

/// `value >> shift`, 0 for a shift of 64 or more (no panic on a bad shift).
const fn shr(value: u64, shift: u32) -> u64 {
    match value.checked_shr(shift) {
        Some(v) => v,
        None => 0,
    }
}

impl Gpa {
    /// The frame this address lies in, for pages of `1 << page_shift` bytes.
    #[inline]
    pub const fn gfn(self, page_shift: u32) -> Gfn {
        Gfn(shr(self.0, page_shift))
    }

    /// The byte offset of this address within its page.
    #[inline]
    pub const fn page_offset(self, page_shift: u32) -> u64 {
        let mask = if page_shift >= 64 {
            u64::MAX
        } else {
            (1u64 << page_shift) - 1
        };
        self.0 & mask
    }
}

impl Gfn {
    /// The guest-physical address of the first byte of this frame, for pages
    /// of `1 << page_shift` bytes; `None` if it does not fit in 64 bits.
    #[inline]
    pub const fn gpa(self, page_shift: u32) -> Option<Gpa> {
        if page_shift >= 64 {
            return if self.0 == 0 { Some(Gpa(0)) } else { None };
        }
        let gpa = self.0 << page_shift;
        if gpa >> page_shift != self.0 {
            return None;
        }
        Some(Gpa(gpa))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpa_and_gfn_convert_both_ways() {
        let gpa = Gpa::new(0x1234_5678);
        assert_eq!(gpa.gfn(12), Gfn::new(0x12345));
        assert_eq!(gpa.page_offset(12), 0x678);
        assert_eq!(Gfn::new(0x12345).gpa(12), Some(Gpa::new(0x1234_5000)));
        assert_eq!(Gfn::new(1).gpa(0), Some(Gpa::new(1)));
    }

    #[test]
    fn conversions_that_overflow_are_refused() {
        assert_eq!(Gfn::new(1 << 52).gpa(12), None);
        assert_eq!(Gfn::new((1 << 52) - 1).gpa(12), Some(Gpa::new(!0xfff)));
        assert_eq!(Gfn::new(1).gpa(64), None);
        assert_eq!(Gpa::new(u64::MAX).gfn(64), Gfn::new(0));
        assert_eq!(Gpa::new(u64::MAX).page_offset(64), u64::MAX);
        assert_eq!(Hva::new(u64::MAX).checked_add(1), None);
        assert_eq!(Pa::new(1).checked_add(2), Some(Pa::new(3)));
        assert_eq!(Gfn::new(5).offset_from(Gfn::new(7)), None);
        assert_eq!(Gfn::new(7).offset_from(Gfn::new(5)), Some(2));
    }
}
