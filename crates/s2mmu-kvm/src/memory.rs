//! Host memory that backs guest memory: anonymous, transparent huge pages or hugetlbfs.

use crate::error::Error;
use std::fmt;
use std::ptr::NonNull;

const SIZE_2M: u64 = 2 << 20;
const SIZE_1G: u64 = 1 << 30;

/// Where the host memory behind a guest memory slot comes from (the selftests' `-s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backing {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`, 4 KiB host pages (`anonymous`).
    #[default]
    Anonymous,
    /// Anonymous memory on a 2 MiB-aligned mapping with `MADV_HUGEPAGE` (`anonymous_thp`).
    AnonymousThp,
    /// `MAP_HUGETLB | MAP_HUGE_2MB` (`anonymous_hugetlb_2mb`).
    Hugetlb2M,
    /// `MAP_HUGETLB | MAP_HUGE_1GB` (`anonymous_hugetlb_1gb`).
    Hugetlb1G,
}

impl Backing {
    /// The size of the host pages behind this backing, so callers can check alignment.
    pub fn page_size(self) -> u64 {
        match self {
            Backing::Anonymous => 4096,
            Backing::AnonymousThp | Backing::Hugetlb2M => SIZE_2M,
            Backing::Hugetlb1G => SIZE_1G,
        }
    }

    /// The alignment a mapping of this backing gets, and that slot sizes must respect.
    pub fn alignment(self) -> u64 {
        self.page_size()
    }

    /// The name the KVM selftests use for this backing (`-s`).
    pub fn selftest_name(self) -> &'static str {
        match self {
            Backing::Anonymous => "anonymous",
            Backing::AnonymousThp => "anonymous_thp",
            Backing::Hugetlb2M => "anonymous_hugetlb_2mb",
            Backing::Hugetlb1G => "anonymous_hugetlb_1gb",
        }
    }

    /// Parses a selftest backing name (`anonymous`, `anonymous_thp`,
    /// `anonymous_hugetlb_2mb`, `anonymous_hugetlb_1gb`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any other name.
    pub fn from_selftest_name(name: &str) -> Result<Self, Error> {
        match name {
            "anonymous" => Ok(Backing::Anonymous),
            "anonymous_thp" => Ok(Backing::AnonymousThp),
            "anonymous_hugetlb_2mb" | "anonymous_hugetlb" => Ok(Backing::Hugetlb2M),
            "anonymous_hugetlb_1gb" => Ok(Backing::Hugetlb1G),
            other => Err(Error::invalid(
                "backing",
                format!(
                    "unknown backing {other:?}; expected anonymous, anonymous_thp, \
                     anonymous_hugetlb_2mb or anonymous_hugetlb_1gb"
                ),
            )),
        }
    }

    fn hugetlb_sysfs_path(self) -> Option<&'static str> {
        match self {
            Backing::Hugetlb2M => Some("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"),
            Backing::Hugetlb1G => Some("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages"),
            _ => None,
        }
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.selftest_name())
    }
}

/// One private anonymous host mapping used as guest memory. Unmapped on drop.
#[derive(Debug)]
pub struct GuestMemory {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: the mapping is plain memory owned by this value; the raw pointer is only an address
// and moving it to another thread does not change who may access it.
unsafe impl Send for GuestMemory {}
// SAFETY: shared references only hand out the address and length; all accesses through the
// address go through `unsafe` code (KVM or the caller) that takes care of races itself.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    /// Maps `len` bytes of `backing` memory, not yet populated.
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] when `len` is 0 or not a multiple of the backing's page
    ///   size;
    /// - [`Error::HugetlbNotReserved`] when hugetlb pages of that size are not reserved;
    /// - [`Error::Ioctl`] (`mmap`, `madvise`) for any other failure.
    pub fn new(len: u64, backing: Backing) -> Result<Self, Error> {
        let align = backing.alignment();
        if len == 0 || !len.is_multiple_of(align) {
            return Err(Error::invalid(
                "bytes",
                format!("{len} is not a positive multiple of the {backing} page size {align}"),
            ));
        }
        let len_usize = usize::try_from(len)
            .map_err(|_| Error::invalid("bytes", format!("{len} does not fit in usize")))?;
        match backing {
            Backing::Anonymous => Self::map(len_usize, 0, backing),
            Backing::AnonymousThp => Self::map_thp(len_usize),
            Backing::Hugetlb2M => {
                Self::map(len_usize, libc::MAP_HUGETLB | libc::MAP_HUGE_2MB, backing)
            }
            Backing::Hugetlb1G => {
                Self::map(len_usize, libc::MAP_HUGETLB | libc::MAP_HUGE_1GB, backing)
            }
        }
    }

    fn map(len: usize, extra_flags: i32, backing: Backing) -> Result<Self, Error> {
        // hugetlb must reserve at mmap time: with MAP_NORESERVE a missing reservation would
        // only show up later as SIGBUS inside KVM_RUN instead of a clear error here.
        let noreserve = if extra_flags & libc::MAP_HUGETLB == 0 {
            libc::MAP_NORESERVE
        } else {
            0
        };
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing touches no
        // existing memory; the result is checked for MAP_FAILED below.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | noreserve | extra_flags,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            if let (Some(path), libc::ENOMEM | libc::EINVAL) = (backing.hugetlb_sysfs_path(), errno)
            {
                let pages = (len as u64).div_ceil(backing.page_size());
                let how = if backing == Backing::Hugetlb2M {
                    format!(
                        "as root, write at least {pages} to /proc/sys/vm/nr_hugepages \
                         (or {path}), and give them back afterwards"
                    )
                } else {
                    format!(
                        "as root, write at least {pages} to {path}, and give them back afterwards"
                    )
                };
                return Err(Error::HugetlbNotReserved {
                    size: backing.page_size(),
                    how_to_reserve: how,
                });
            }
            return Err(Error::Ioctl { op: "mmap", errno });
        }
        let ptr = NonNull::new(addr.cast::<u8>()).ok_or(Error::Ioctl {
            op: "mmap",
            errno: libc::ENOMEM,
        })?;
        Ok(GuestMemory { ptr, len, backing })
    }

    /// THP needs a 2 MiB-aligned range: over-map by 2 MiB, trim both ends, then madvise.
    fn map_thp(len: usize) -> Result<Self, Error> {
        let align = SIZE_2M as usize;
        let over = Self::map(len + align, 0, Backing::Anonymous)?;
        let base = over.ptr.as_ptr() as usize;
        let aligned = base.next_multiple_of(align);
        let head = aligned - base;
        let tail = align - head;
        // Forget the over-sized mapping: its pieces are unmapped or re-owned below.
        std::mem::forget(over);
        // SAFETY: [base, base+head) and [aligned+len, aligned+len+tail) are the untouched
        // ends of the mapping just created, which nothing else references.
        unsafe {
            if head != 0 {
                libc::munmap(base as *mut libc::c_void, head);
            }
            if tail != 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
        }
        let memory = GuestMemory {
            // SAFETY: `aligned` lies inside a successful mapping, so it is not null.
            ptr: unsafe { NonNull::new_unchecked(aligned as *mut u8) },
            len,
            backing: Backing::AnonymousThp,
        };
        // SAFETY: the range is exactly this value's own mapping.
        let rc = unsafe {
            libc::madvise(
                memory.ptr.as_ptr().cast::<libc::c_void>(),
                len,
                libc::MADV_HUGEPAGE,
            )
        };
        if rc != 0 {
            return Err(Error::last_os("madvise(MADV_HUGEPAGE)"));
        }
        Ok(memory)
    }

    /// The host virtual address of the first byte.
    pub fn host_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// A raw pointer to the first byte, for KVM and for guest-memory accesses.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Never true: empty mappings are rejected by [`GuestMemory::new`].
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The backing this memory was mapped with.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Copies `bytes` to `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the range does not lie inside the mapping.
    pub fn write_bytes(&self, offset: u64, bytes: &[u8]) -> Result<(), Error> {
        let end = offset.checked_add(bytes.len() as u64);
        if end.is_none_or(|end| end > self.len()) {
            return Err(Error::invalid(
                "offset",
                format!(
                    "{} bytes at {offset:#x} overrun a {:#x}-byte mapping",
                    bytes.len(),
                    self.len
                ),
            ));
        }
        // SAFETY: the range was checked to lie inside this mapping, which is writable; the
        // source is a separate Rust slice, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset as usize),
                bytes.len(),
            );
        }
        Ok(())
    }

    /// Writes one little-endian u64 at `offset` with a volatile store, so a running guest
    /// sees it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the word is outside the mapping or not 8-byte aligned.
    pub fn write_u64(&self, offset: u64, value: u64) -> Result<(), Error> {
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|end| end > self.len()) {
            return Err(Error::invalid(
                "offset",
                format!("u64 at {offset:#x} is misaligned or outside the mapping"),
            ));
        }
        // SAFETY: the aligned word lies inside this writable mapping (checked above).
        unsafe {
            std::ptr::write_volatile(self.ptr.as_ptr().add(offset as usize).cast::<u64>(), value);
        }
        Ok(())
    }

    /// Reads one u64 at `offset` with a volatile load.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the word is outside the mapping or not 8-byte aligned.
    pub fn read_u64(&self, offset: u64) -> Result<u64, Error> {
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|end| end > self.len()) {
            return Err(Error::invalid(
                "offset",
                format!("u64 at {offset:#x} is misaligned or outside the mapping"),
            ));
        }
        // SAFETY: the aligned word lies inside this readable mapping (checked above).
        Ok(
            unsafe {
                std::ptr::read_volatile(self.ptr.as_ptr().add(offset as usize).cast::<u64>())
            },
        )
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: this value owns exactly this mapping; KVM slots that point at it are torn
        // down by the VM, which callers drop first (the VM owns its memory and drops it last).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast::<libc::c_void>(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_sizes_that_are_not_page_multiples() {
        assert!(matches!(
            GuestMemory::new(4097, Backing::Anonymous),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            GuestMemory::new(0, Backing::Anonymous),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            GuestMemory::new(4096, Backing::Hugetlb2M),
            Err(Error::InvalidArgument { .. })
        ));
    }

    #[test]
    fn thp_mapping_is_2m_aligned_and_round_trips() {
        let mem = GuestMemory::new(4 << 20, Backing::AnonymousThp).unwrap();
        assert_eq!(mem.host_addr() % (2 << 20), 0);
        mem.write_u64(8, 0x0123_4567_89ab_cdef).unwrap();
        assert_eq!(mem.read_u64(8).unwrap(), 0x0123_4567_89ab_cdef);
        assert!(mem.write_u64(4 << 20, 1).is_err());
        assert!(mem.write_bytes((4 << 20) - 1, &[1, 2]).is_err());
    }

    #[test]
    fn parses_selftest_names() {
        for b in [
            Backing::Anonymous,
            Backing::AnonymousThp,
            Backing::Hugetlb2M,
            Backing::Hugetlb1G,
        ] {
            assert_eq!(Backing::from_selftest_name(b.selftest_name()).unwrap(), b);
        }
        assert!(Backing::from_selftest_name("shmem").is_err());
    }
}
