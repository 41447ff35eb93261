//! The one error type of memslot updates.

use core::fmt;

/// Linux errno values that KVM returns for the failures below (positive, as in `errno.h`).
pub mod errno {
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Already exists (overlapping guest-physical range).
    pub const EEXIST: i32 = 17;
}

/// Why a memslot update was refused. The store is unchanged whenever one is returned.
///
/// Each variant names the check of KVM's `kvm_set_memory_region()` it mirrors; [`errno`]
/// gives the value the ioctl would have failed with.
///
/// [`errno`]: MemslotError::errno
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemslotError {
    /// Flags other than `LOG_DIRTY_PAGES` and `READONLY` (KVM: -EINVAL).
    InvalidFlags {
        /// The flags as given.
        flags: u32,
    },
    /// Slot id at or beyond the configured number of user slots (KVM: -EINVAL).
    IdOutOfRange {
        /// The id as given.
        id: u16,
        /// The number of user slot ids.
        max: u16,
    },
    /// Address-space id other than 0 (KVM: -EINVAL); one address space is modelled.
    AddressSpaceOutOfRange {
        /// The address-space id (bits 16..31 of the uapi `slot` field).
        as_id: u16,
        /// The number of address spaces.
        max: u16,
    },
    /// An address or size that is not a multiple of the page size (KVM: -EINVAL).
    Misaligned {
        /// Which field: `"memory_size"`, `"guest_phys_addr"` or `"userspace_addr"`.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// A range whose end does not fit in 64 bits (KVM: -EINVAL).
    Wraps {
        /// Which range: `"guest_phys_addr"`, `"userspace_addr"` or `"total_pages"`.
        what: &'static str,
        /// The start of the range.
        start: u64,
        /// Its length in bytes (pages for `"total_pages"`).
        len: u64,
    },
    /// A slot larger than the configured maximum (KVM: -EINVAL).
    TooLarge {
        /// The size asked for, in pages.
        npages: u64,
        /// The maximum, in pages.
        max: u64,
    },
    /// Deleting a slot id that has no slot (KVM: -EINVAL).
    NoSuchSlot {
        /// The id as given.
        id: u16,
    },
    /// Changing what an existing slot cannot change: its size, its host address, or its
    /// read-only flag (KVM: -EINVAL). Userspace must delete and re-create the slot instead.
    ImmutableChange {
        /// `"npages"`, `"userspace_addr"` or `"readonly"`.
        what: &'static str,
    },
    /// The guest-physical range of a created or moved slot overlaps another slot
    /// (KVM: -EEXIST).
    Overlap {
        /// The slot being created or moved.
        slot: u16,
        /// The existing slot it overlaps (the lowest such slot by gfn).
        other: u16,
    },
    /// The store's configuration cannot describe any slot (a page shift that is not one
    /// of the arm64 granules' 12, 14 or 16).
    BadConfig {
        /// Which setting.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// The request equals the slot as it is. KVM returns 0 without any swap; this store
    /// reports it so callers can tell, and does nothing.
    NoChange {
        /// The slot id.
        id: u16,
    },
    /// The thread asking for the update holds a snapshot of the same store
    /// ([`super::MemslotStore::snapshot`]): the update waits for the readers
    /// of the state it retires, so it would wait for that thread forever.
    SnapshotHeld,
}

impl MemslotError {
    /// The errno KVM's `KVM_SET_USER_MEMORY_REGION` returns for this case, positive; 0 for
    /// [`MemslotError::NoChange`], which KVM treats as success.
    pub const fn errno(&self) -> i32 {
        match self {
            Self::Overlap { .. } => errno::EEXIST,
            Self::NoChange { .. } => 0,
            _ => errno::EINVAL,
        }
    }
}

impl fmt::Display for MemslotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidFlags { flags } => write!(f, "invalid memslot flags {flags:#x}"),
            Self::IdOutOfRange { id, max } => {
                write!(f, "slot id {id} out of range (ids below {max})")
            }
            Self::AddressSpaceOutOfRange { as_id, max } => {
                write!(f, "address space {as_id} out of range (below {max})")
            }
            Self::Misaligned { what, value } => write!(f, "{what} {value:#x} is not page aligned"),
            Self::Wraps { what, start, len } => {
                write!(f, "{what} range {start:#x} + {len:#x} wraps around")
            }
            Self::TooLarge { npages, max } => {
                write!(f, "slot of {npages} pages exceeds the maximum of {max}")
            }
            Self::NoSuchSlot { id } => write!(f, "no slot with id {id}"),
            Self::ImmutableChange { what } => {
                write!(f, "the {what} of an existing slot cannot change")
            }
            Self::Overlap { slot, other } => {
                write!(
                    f,
                    "slot {slot} overlaps slot {other} in guest-physical space"
                )
            }
            Self::NoChange { id } => write!(f, "slot {id} is already as requested"),
            Self::SnapshotHeld => write!(
                f,
                "memslot update by a thread that holds a snapshot of the same memslots (drop it first: the update would wait for it forever)"
            ),
            Self::BadConfig { what, value } => {
                write!(f, "memslot configuration: {what} {value} is not supported")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for MemslotError {}
