//! The engine's error type: one small enum whose variants carry the offending values.

use core::fmt;

use crate::addr::{Gpa, Hva};

/// Everything an engine operation can refuse or fail with.
///
/// Operations validate their input before they change anything, so an error
/// means the page table is exactly as it was before the call (the one
/// documented exception is [`Error::Again`] from shared-mode walks, which
/// leaves the table consistent but tells the caller to retry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// An address or size is not aligned as required.
    Misaligned {
        /// Which argument (`"ipa"`, `"size"`, `"pa"`, ...).
        what: &'static str,
        /// The value given.
        value: u64,
        /// The alignment it must have.
        align: u64,
    },
    /// A size of zero, or a range that wraps around the address space.
    EmptyRange {
        /// Start of the range.
        ipa: u64,
        /// Size given.
        size: u64,
    },
    /// The range does not fit in the input address space.
    OutOfRange {
        /// Start of the range.
        ipa: u64,
        /// Size of the range.
        size: u64,
        /// Size of the IPA space (`1 << ipa_bits`).
        limit: u64,
    },
    /// A configuration value is not supported (granule, IPA size, chunk size, ...).
    InvalidConfig {
        /// Which setting.
        what: &'static str,
        /// The value given.
        value: u64,
    },
    /// The output address does not fit the descriptor format.
    PhysOutOfRange {
        /// The output address given.
        pa: u64,
        /// The number of physical address bits the format encodes.
        pa_bits: u32,
    },
    /// Mapping over a page that is already mapped.
    AlreadyMapped {
        /// First guest address that is already mapped.
        ipa: u64,
    },
    /// An operation on a single address found no valid mapping there.
    NotMapped {
        /// The address.
        ipa: u64,
    },
    /// The range cuts through a block mapping that the operation cannot
    /// change partially (split it first).
    SplitsBlock {
        /// Start of the block.
        block_ipa: u64,
        /// Size of the block.
        block_size: u64,
    },
    /// Permissions that the format cannot express or that contradict each other.
    InvalidProt {
        /// The raw permission bits.
        bits: u32,
    },
    /// The page cache holds fewer table pages than the operation needs.
    CacheExhausted {
        /// Pages the operation needs.
        needed: usize,
        /// Pages the cache holds.
        available: usize,
    },
    /// The table-page allocator returned no memory.
    OutOfMemory,
    /// A shared-mode update lost a race with another walker (or met an
    /// entry locked for break-before-make); retry the operation.
    Again {
        /// The address whose entry changed underneath.
        ipa: u64,
    },
    /// A dirty-log clear whose first page is not a multiple of 64 (EINVAL).
    ClearNotAligned {
        /// The first page given.
        first_page: u64,
    },
    /// A dirty-log clear that leaves the slot, or whose page count is not a
    /// multiple of 64 without reaching the slot's end (EINVAL).
    ClearBadRange {
        /// The first page given.
        first_page: u64,
        /// The number of pages given.
        num_pages: u64,
        /// Pages in the slot.
        slot_pages: u64,
    },
    /// A caller's bitmap has fewer 64-bit words than the range needs.
    BitmapTooSmall {
        /// Words given.
        words: usize,
        /// Words needed.
        needed: usize,
    },
    /// No memslot with this id (EINVAL/ENOENT).
    NoSuchSlot {
        /// The slot id.
        slot: u32,
    },
    /// Dirty logging is off for the slot (ENOENT).
    LoggingDisabled {
        /// The slot id.
        slot: u32,
    },
    /// No memslot covers the guest address: an MMIO access.
    NoSlot {
        /// The faulting guest physical address.
        gpa: Gpa,
    },
    /// The host memory behind a memslot page has no physical address
    /// ([`crate::mmu::HostMemory::host_to_phys`] returned `None`).
    Unbacked {
        /// The host virtual address.
        hva: Hva,
    },
    /// A vCPU handle made by another `Mmu` was passed to this one.
    ForeignVcpu {
        /// The handle's vCPU index.
        vcpu: usize,
    },
    /// A write to a read-only memslot.
    WriteToReadOnly {
        /// The faulting guest physical address.
        gpa: Gpa,
    },
    /// The dirty ring is not enabled, or a bitmap call was made while only
    /// the ring tracks dirty pages (ENXIO).
    WrongDirtyMode {
        /// What the call needs.
        needs: &'static str,
    },
    /// A dirty-ring size that is not a power of two within the limits.
    InvalidRingSize {
        /// Entries asked for.
        entries: u32,
    },
    /// A memslot update was refused.
    Memslot(crate::memslot::MemslotError),
    /// The vCPU's dirty ring is soft-full: the vCPU must stop until the
    /// ring is harvested and reset (`KVM_EXIT_DIRTY_RING_FULL`).
    RingFull {
        /// The vCPU.
        vcpu: usize,
    },
    /// No open dirty view with this id (never opened, closed, or its slot
    /// stopped logging).
    UnknownDirtyView {
        /// The view id.
        view: u64,
    },
    /// One clear of several dirty views named views of different slots.
    DirtyViewsOfSeveralSlots {
        /// The first view's slot.
        slot: u32,
        /// Another view's slot.
        other: u32,
    },
    /// A slot already has the most dirty views it may have open.
    TooManyDirtyViews {
        /// The slot id.
        slot: u32,
        /// Views a slot may have open at once.
        limit: usize,
    },
    /// A dirty view of another MMU (views are branded to the MMU that
    /// opened them, as vCPU handles are).
    ForeignDirtyView {
        /// The view id (in the MMU that opened it).
        view: u64,
    },
    /// The MMU already has the most vCPUs it may have.
    TooManyVcpus {
        /// vCPUs an MMU may have.
        limit: usize,
    },
    /// Pages beyond the end of a memslot (page offsets in the slot).
    OutsideSlot {
        /// The slot id.
        slot: u32,
        /// First page offset of the range.
        first_page: u64,
        /// Pages in the range.
        pages: u64,
        /// Pages in the slot.
        slot_pages: u64,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Misaligned { what, value, align } => {
                write!(f, "{what} {value:#x} is not aligned to {align:#x}")
            }
            Error::EmptyRange { ipa, size } => {
                write!(f, "range at {ipa:#x} of size {size:#x} is empty or wraps")
            }
            Error::OutOfRange { ipa, size, limit } => write!(
                f,
                "range {ipa:#x}+{size:#x} is outside the IPA space of {limit:#x} bytes"
            ),
            Error::InvalidConfig { what, value } => {
                write!(f, "unsupported {what}: {value}")
            }
            Error::PhysOutOfRange { pa, pa_bits } => {
                write!(f, "output address {pa:#x} does not fit in {pa_bits} bits")
            }
            Error::AlreadyMapped { ipa } => write!(f, "IPA {ipa:#x} is already mapped"),
            Error::NotMapped { ipa } => write!(f, "IPA {ipa:#x} is not mapped"),
            Error::SplitsBlock {
                block_ipa,
                block_size,
            } => write!(
                f,
                "range cuts through the block mapping at {block_ipa:#x} of size {block_size:#x}; split it first"
            ),
            Error::InvalidProt { bits } => write!(f, "invalid permissions {bits:#x}"),
            Error::CacheExhausted { needed, available } => write!(
                f,
                "page cache holds {available} table pages, the operation needs {needed}"
            ),
            Error::OutOfMemory => write!(f, "out of memory for table pages"),
            Error::Again { ipa } => {
                write!(f, "entry for IPA {ipa:#x} changed concurrently; retry")
            }
            Error::ClearNotAligned { first_page } => write!(
                f,
                "dirty-log clear: first page {first_page} is not a multiple of 64"
            ),
            Error::ClearBadRange {
                first_page,
                num_pages,
                slot_pages,
            } => write!(
                f,
                "dirty-log clear of {num_pages} pages from page {first_page} does not fit a slot of {slot_pages} pages (the count must be a multiple of 64 unless it ends at the slot's end)"
            ),
            Error::BitmapTooSmall { words, needed } => {
                write!(f, "bitmap has {words} words, the range needs {needed}")
            }
            Error::NoSuchSlot { slot } => write!(f, "no memslot {slot}"),
            Error::LoggingDisabled { slot } => {
                write!(f, "dirty logging is not enabled on memslot {slot}")
            }
            Error::ForeignVcpu { vcpu } => {
                write!(f, "vCPU {vcpu} belongs to another MMU")
            }
            Error::Unbacked { hva } => {
                write!(f, "host address {hva:#x} has no physical address")
            }
            Error::NoSlot { gpa } => write!(f, "no memslot covers guest address {gpa:#x}"),
            Error::WriteToReadOnly { gpa } => {
                write!(f, "write to read-only memslot at guest address {gpa:#x}")
            }
            Error::WrongDirtyMode { needs } => write!(f, "this call needs {needs}"),
            Error::InvalidRingSize { entries } => write!(
                f,
                "dirty ring of {entries} entries: must be a power of two from 256 to 65536"
            ),
            Error::RingFull { vcpu } => write!(f, "dirty ring of vCPU {vcpu} is full"),
            Error::Memslot(e) => write!(f, "memslot update refused: {e}"),
            Error::TooManyVcpus { .. } | Error::OutsideSlot { .. } => self.fmt_limit(f),
            Error::UnknownDirtyView { .. }
            | Error::DirtyViewsOfSeveralSlots { .. }
            | Error::TooManyDirtyViews { .. }
            | Error::ForeignDirtyView { .. } => self.fmt_view(f),
        }
    }
}

impl Error {
    /// [`Error::NoSuchSlot`] for slot `id`.
    pub(crate) fn no_such_slot(id: u16) -> Self {
        Error::NoSuchSlot {
            slot: u32::from(id),
        }
    }

    /// The messages of the limits on vCPUs and slot pages.
    fn fmt_limit(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::TooManyVcpus { limit } => {
                write!(f, "the MMU already has {limit} vCPUs, the most it may have")
            }
            Error::OutsideSlot {
                slot,
                first_page,
                pages,
                slot_pages,
            } => write!(
                f,
                "{pages} pages from page {first_page} do not fit memslot {slot} of {slot_pages} pages"
            ),
            // Only the limit errors come here.
            _ => fmt::Debug::fmt(self, f),
        }
    }

    /// The dirty-view errors' messages.
    fn fmt_view(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::UnknownDirtyView { view } => write!(f, "no open dirty view {view}"),
            Error::DirtyViewsOfSeveralSlots { slot, other } => write!(
                f,
                "one clear of dirty views of memslot {slot} and of memslot {other}: one slot per clear"
            ),
            Error::TooManyDirtyViews { slot, limit } => write!(
                f,
                "memslot {slot} already has {limit} dirty views open, the most it may have"
            ),
            Error::ForeignDirtyView { view } => {
                write!(f, "dirty view {view} belongs to another MMU")
            }
            // Only the dirty-view errors come here.
            _ => fmt::Debug::fmt(self, f),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

/// Shorthand for engine results.
pub type Result<T> = core::result::Result<T, Error>;

impl From<crate::memslot::MemslotError> for Error {
    fn from(e: crate::memslot::MemslotError) -> Self {
        Error::Memslot(e)
    }
}
