//! Typed addresses for the facade's public API: a guest-physical address
//! and a host-virtual one are both 64-bit numbers, and passing one where
//! the other is meant compiles as bare `u64` and goes wrong at run time.
//! Built with an explicit constructor (no `From<u64>`), so every place that
//! makes one says which it is.

use core::fmt;

macro_rules! address {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[repr(transparent)]
        pub struct $name(u64);

        impl $name {
            /// The address `raw`.
            #[inline]
            pub const fn new(raw: u64) -> Self {
                $name(raw)
            }

            /// The address as a number.
            #[inline]
            pub const fn raw(self) -> u64 {
                self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
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
    /// reports and the stage-2 table translates.
    Gpa
);
address!(
    /// A host-virtual address: where the hypervisor's process (or the host
    /// kernel) sees guest memory, what a memslot's `userspace_addr` is and
    /// what the MMU notifier invalidates.
    Hva
);
