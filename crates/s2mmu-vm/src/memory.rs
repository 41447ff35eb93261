//! Guest memory: real host memory, anonymous, transparent huge pages or
//! hugetlbfs, so guest writes really happen.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// How guest memory is backed (dirty_log_perf_test's `-s`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backing {
    /// Anonymous memory in 4 KiB pages.
    Anonymous,
    /// Anonymous memory with `MADV_HUGEPAGE` (2 MiB transparent huge pages).
    AnonymousThp,
    /// hugetlbfs 2 MiB pages (must be reserved).
    Hugetlb2M,
    /// hugetlbfs 1 GiB pages (must be reserved).
    Hugetlb1G,
}

impl Backing {
    /// The selftests' name.
    pub fn name(self) -> &'static str {
        match self {
            Backing::Anonymous => "anonymous",
            Backing::AnonymousThp => "anonymous_thp",
            Backing::Hugetlb2M => "anonymous_hugetlb_2mb",
            Backing::Hugetlb1G => "anonymous_hugetlb_1gb",
        }
    }

    /// Parses a selftests name.
    ///
    /// # Errors
    /// A message listing the accepted names.
    pub fn parse(s: &str) -> Result<Backing, String> {
        match s {
            "anonymous" => Ok(Backing::Anonymous),
            "anonymous_thp" => Ok(Backing::AnonymousThp),
            "anonymous_hugetlb_2mb" | "anonymous_hugetlb" => Ok(Backing::Hugetlb2M),
            "anonymous_hugetlb_1gb" => Ok(Backing::Hugetlb1G),
            _ => Err(format!(
                "unknown backing '{s}': use anonymous, anonymous_thp, anonymous_hugetlb_2mb or anonymous_hugetlb_1gb"
            )),
        }
    }

    /// The host page size the backing provides: the largest stage-2
    /// mapping a fault may install over it.
    pub fn page_size(self) -> u64 {
        match self {
            Backing::Anonymous => 4 << 10,
            Backing::AnonymousThp | Backing::Hugetlb2M => 2 << 20,
            Backing::Hugetlb1G => 1 << 30,
        }
    }
}

/// Why guest memory could not be set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryError {
    /// The size is zero or not a multiple of the backing's page size.
    BadSize {
        /// Bytes asked for.
        size: u64,
        /// Required multiple.
        multiple: u64,
    },
    /// Not enough hugetlb pages are reserved.
    HugetlbNotReserved {
        /// Page size in bytes.
        page_size: u64,
        /// Pages needed.
        needed: u64,
        /// Pages free now.
        free: u64,
    },
    /// `mmap` failed.
    Mmap {
        /// errno.
        errno: i32,
    },
}

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemoryError::BadSize { size, multiple } => write!(
                f,
                "guest memory size {size:#x} must be a non-zero multiple of {multiple:#x}"
            ),
            MemoryError::HugetlbNotReserved {
                page_size,
                needed,
                free,
            } => {
                let (knob, n) = if page_size == 1 << 30 {
                    (
                        "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
                        needed,
                    )
                } else {
                    ("/proc/sys/vm/nr_hugepages", needed)
                };
                write!(
                    f,
                    "{needed} hugetlb pages of {} MiB needed, {free} free; reserve them as root with: echo {n} > {knob}",
                    page_size >> 20
                )
            }
            MemoryError::Mmap { errno } => write!(
                f,
                "mmap of guest memory failed: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
        }
    }
}

impl std::error::Error for MemoryError {}

/// A mapping of guest memory. Guest accesses go through atomics (the
/// vCPUs, a migration thread and the host may touch the same words
/// concurrently); they compile to plain loads and stores.
pub struct GuestMemory {
    ptr: *mut u8,
    map_len: usize,
    offset: usize,
    size: u64,
    backing: Backing,
}

// SAFETY: the mapping is plain memory owned by this value; every access
// through the safe API uses atomics, so sharing it between threads is sound.
unsafe impl Send for GuestMemory {}
// SAFETY: as above.
unsafe impl Sync for GuestMemory {}

fn hugetlb_free(page_size: u64) -> u64 {
    let path = format!(
        "/sys/kernel/mm/hugepages/hugepages-{}kB/free_hugepages",
        page_size >> 10
    );
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

impl GuestMemory {
    /// Maps `size` bytes with `backing`.
    ///
    /// # Errors
    /// [`MemoryError::BadSize`], [`MemoryError::HugetlbNotReserved`] with
    /// how to reserve pages, [`MemoryError::Mmap`].
    pub fn new(size: u64, backing: Backing) -> Result<Self, MemoryError> {
        let page = backing.page_size();
        let multiple = if backing == Backing::AnonymousThp {
            4096
        } else {
            page
        };
        if size == 0 || !size.is_multiple_of(multiple) {
            return Err(MemoryError::BadSize { size, multiple });
        }
        // The mapping's length (with THP's 2 MiB of slack) must fit the
        // address space: near 2^64 it cannot, whatever mmap would say.
        let slack = if backing == Backing::AnonymousThp {
            2 << 20
        } else {
            0
        };
        let Some(map_len) = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_add(slack))
            .filter(|&l| l <= isize::MAX as usize)
        else {
            return Err(MemoryError::Mmap {
                errno: libc::ENOMEM,
            });
        };
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        match backing {
            Backing::Hugetlb2M | Backing::Hugetlb1G => {
                let needed = size / page;
                let free = hugetlb_free(page);
                if free < needed {
                    return Err(MemoryError::HugetlbNotReserved {
                        page_size: page,
                        needed,
                        free,
                    });
                }
                let shift = page.trailing_zeros() as i32;
                flags |= libc::MAP_HUGETLB | (shift << libc::MAP_HUGE_SHIFT);
            }
            // Over-mapped (`slack`) so the guest memory can start on a
            // 2 MiB boundary, which THP needs.
            Backing::AnonymousThp | Backing::Anonymous => {}
        }
        // SAFETY: an anonymous private mapping at an address the kernel
        // chooses; nothing else is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(MemoryError::Mmap { errno });
        }
        let p = p as *mut u8;
        let mut offset = 0;
        if backing == Backing::AnonymousThp {
            offset = (p as usize).next_multiple_of(2 << 20) - p as usize;
            // SAFETY: the advised range lies inside the mapping just made.
            unsafe {
                libc::madvise(
                    p.add(offset) as *mut libc::c_void,
                    size as usize,
                    libc::MADV_HUGEPAGE,
                );
            }
        }
        Ok(GuestMemory {
            ptr: p,
            map_len,
            offset,
            size,
            backing,
        })
    }

    /// Bytes of guest memory.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The backing.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Host address of the first byte (what a memslot's `userspace_addr` is).
    pub fn host_addr(&self) -> u64 {
        // SAFETY: `offset` is inside the mapping.
        unsafe { self.ptr.add(self.offset) as u64 }
    }

    /// The word at byte `offset` (8-byte aligned, inside the memory).
    fn word(&self, offset: u64) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || offset + 8 > self.size {
            return None;
        }
        // SAFETY: aligned and in bounds of the live mapping; the memory is
        // only ever accessed through atomics.
        Some(unsafe {
            AtomicU64::from_ptr(self.ptr.add(self.offset + offset as usize) as *mut u64)
        })
    }

    /// Reads the 8-byte word at `offset` (None if misaligned or outside).
    pub fn read_u64(&self, offset: u64) -> Option<u64> {
        self.word(offset).map(|w| w.load(Ordering::Relaxed))
    }

    /// Writes the 8-byte word at `offset`; returns false if misaligned or outside.
    pub fn write_u64(&self, offset: u64, value: u64) -> bool {
        self.word(offset)
            .map(|w| w.store(value, Ordering::Relaxed))
            .is_some()
    }

    /// Copies `out.len()` bytes from `offset` (word by word, atomically per
    /// word, as a migration reads memory the guest may be writing).
    /// Returns false if the range is misaligned or outside.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        if !offset.is_multiple_of(8)
            || !out.len().is_multiple_of(8)
            || offset + out.len() as u64 > self.size
        {
            return false;
        }
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            let v = self.read_u64(offset + 8 * i as u64).unwrap_or(0);
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        true
    }

    /// Writes `data` at `offset` word by word. Returns false if misaligned
    /// or outside.
    pub fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        if !offset.is_multiple_of(8)
            || !data.len().is_multiple_of(8)
            || offset + data.len() as u64 > self.size
        {
            return false;
        }
        for (i, chunk) in data.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            self.write_u64(offset + 8 * i as u64, v);
        }
        true
    }

    /// Bytes of this mapping backed by transparent huge pages, from
    /// /proc/self/smaps (None where it cannot be read).
    pub fn thp_bytes(&self) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let start = self.ptr as u64;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, _)) = range.split_once('-') {
                    if let Ok(a) = u64::from_str_radix(a, 16) {
                        inside = a >= start && a < start + self.map_len as u64;
                        continue;
                    }
                }
            }
            if inside && line.starts_with("AnonHugePages:") {
                let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                return Some(kb << 10);
            }
        }
        None
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_memory_reads_back() {
        let m = GuestMemory::new(1 << 20, Backing::Anonymous).unwrap();
        assert!(m.write_u64(4096, 0xdead_beef));
        assert_eq!(m.read_u64(4096), Some(0xdead_beef));
        assert_eq!(m.read_u64(3), None);
        assert_eq!(m.read_u64(1 << 20), None);
        let mut buf = [0u8; 16];
        assert!(m.read_into(4096, &mut buf));
        assert_eq!(
            u64::from_le_bytes(buf[..8].try_into().unwrap()),
            0xdead_beef
        );
        assert!(m.write_from(8192, &buf));
        assert_eq!(m.read_u64(8192), Some(0xdead_beef));
    }

    #[test]
    fn thp_memory_is_2m_aligned() {
        let m = GuestMemory::new(4 << 20, Backing::AnonymousThp).unwrap();
        assert_eq!(m.host_addr() % (2 << 20), 0);
    }

    #[test]
    fn bad_sizes_and_missing_hugetlb_pages_are_clear_errors() {
        assert!(matches!(
            GuestMemory::new(4097, Backing::Anonymous),
            Err(MemoryError::BadSize { .. })
        ));
        if hugetlb_free(1 << 30) < 1024 {
            let e = GuestMemory::new(1024 << 30, Backing::Hugetlb1G)
                .err()
                .unwrap();
            assert!(matches!(e, MemoryError::HugetlbNotReserved { .. }));
            assert!(e.to_string().contains("nr_hugepages"), "{e}");
        }
        assert_eq!(
            Backing::parse("anonymous_thp").unwrap(),
            Backing::AnonymousThp
        );
        assert!(Backing::parse("bogus")
            .unwrap_err()
            .contains("anonymous_thp"));
    }
}
