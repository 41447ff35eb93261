//! Why guest memory could not be set up or accessed.

use std::fmt;

/// Why guest memory could not be set up, or a range of it accessed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryError {
    /// The size is zero or not a multiple of the backing's page size.
    BadSize {
        /// Bytes asked for.
        size: u64,
        /// Required multiple.
        multiple: u64,
    },
    /// The size cannot be mapped in this address space at all.
    TooLarge {
        /// Bytes asked for.
        size: u64,
    },
    /// Not enough hugetlb pages are reserved.
    HugetlbNotReserved {
        /// Page size in bytes.
        page_size: u64,
        /// Pages needed.
        needed: u64,
        /// Pages free when the mapping was tried.
        free: u64,
    },
    /// `mmap` failed.
    Mmap {
        /// errno.
        errno: i32,
    },
    /// `madvise` failed: `MADV_HUGEPAGE` on a kernel without transparent
    /// huge pages, or `MADV_DONTNEED` on a range the backing cannot drop.
    Madvise {
        /// The advice, as named in madvise(2).
        advice: &'static str,
        /// errno.
        errno: i32,
    },
    /// A byte range does not lie inside the guest memory.
    OutOfRange {
        /// First byte of the range.
        offset: u64,
        /// Bytes in the range.
        len: u64,
        /// Bytes of guest memory.
        size: u64,
    },
}

impl MemoryError {
    /// The sysfs (or procfs) file that reserves hugetlb pages of `page_size`.
    pub(crate) fn hugetlb_knob(page_size: u64) -> &'static str {
        if page_size == 1 << 30 {
            "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"
        } else {
            "/proc/sys/vm/nr_hugepages"
        }
    }
}

fn os(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemoryError::BadSize { size, multiple } => write!(
                f,
                "guest memory size {size:#x} must be a non-zero multiple of {multiple:#x}"
            ),
            MemoryError::TooLarge { size } => {
                write!(
                    f,
                    "guest memory size {size:#x} does not fit this address space"
                )
            }
            MemoryError::HugetlbNotReserved {
                page_size,
                needed,
                free,
            } => write!(
                f,
                "{needed} hugetlb pages of {} MiB needed, {free} free; reserve them as root with: \
                 echo {needed} > {} (and give them back afterwards)",
                page_size >> 20,
                Self::hugetlb_knob(page_size)
            ),
            MemoryError::Mmap { errno } => {
                write!(f, "mmap of guest memory failed: {}", os(errno))
            }
            MemoryError::Madvise { advice, errno } => {
                write!(f, "madvise({advice}) on guest memory failed: {}", os(errno))
            }
            MemoryError::OutOfRange { offset, len, size } => write!(
                f,
                "{len} bytes at {offset:#x} overrun {size:#x} bytes of guest memory"
            ),
        }
    }
}

impl std::error::Error for MemoryError {}
