//! The host mapping behind guest memory: made, aligned, advised, unmapped.

use crate::{Backing, MemoryError};
use std::fmt;
use std::ptr::NonNull;

const SIZE_2M: usize = 2 << 20;

/// One private anonymous host mapping used as guest memory, unmapped on
/// drop. Accesses through its methods are atomic (see the crate's docs).
pub struct GuestMemory {
    /// First byte of guest memory (2 MiB-aligned for THP).
    pub(crate) ptr: NonNull<u8>,
    /// Bytes of guest memory, all of them mapped (nothing else is).
    pub(crate) size: u64,
    backing: Backing,
}

// SAFETY: the mapping is plain memory owned by this value; the pointer is
// only an address, and every access through the safe API is atomic, so
// moving the value to another thread changes nothing about who may access
// what.
unsafe impl Send for GuestMemory {}
// SAFETY: shared references give atomic word accesses only (see `access`),
// and the address (`as_ptr`, `host_addr`), whose users (KVM, `unsafe`
// code) keep to atomic accesses themselves.
unsafe impl Sync for GuestMemory {}

/// Hugetlb pages of `page_size` free now (0 where the size is not offered).
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

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A fresh private anonymous read-write mapping of `len` bytes with `extra`
/// flags, at an address of the kernel's choosing.
fn mmap_anonymous(len: usize, extra: i32) -> Result<NonNull<u8>, i32> {
    // Miri's mmap takes no other flag; MAP_NORESERVE (the only one passed
    // for memory it can map) changes the kernel's accounting, not what the
    // mapping holds.
    let extra = if cfg!(miri) { 0 } else { extra };
    // SAFETY: a new anonymous mapping at an address the kernel picks
    // touches no existing memory; the result is checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    NonNull::new(p.cast::<u8>()).ok_or(libc::ENOMEM)
}

impl GuestMemory {
    /// Maps `size` bytes of `backing` memory, not yet populated (4 KiB
    /// pages and THP are `MAP_NORESERVE`; hugetlb pages are reserved here,
    /// so a missing reservation is this error instead of a SIGBUS later).
    ///
    /// # Errors
    /// - [`MemoryError::BadSize`]: zero or not a multiple of
    ///   [`Backing::size_multiple`];
    /// - [`MemoryError::TooLarge`]: more than this address space can map;
    /// - [`MemoryError::HugetlbNotReserved`] with how to reserve pages;
    /// - [`MemoryError::Mmap`], [`MemoryError::Madvise`] for other failures.
    pub fn new(size: u64, backing: Backing) -> Result<Self, MemoryError> {
        let multiple = backing.size_multiple();
        if size == 0 || !size.is_multiple_of(multiple) {
            return Err(MemoryError::BadSize { size, multiple });
        }
        // THP over-maps by 2 MiB: that too must fit below isize::MAX.
        let len = usize::try_from(size)
            .ok()
            .filter(|l| {
                l.checked_add(SIZE_2M)
                    .is_some_and(|e| e <= isize::MAX as usize)
            })
            .ok_or(MemoryError::TooLarge { size })?;
        let ptr = match backing {
            Backing::Anonymous => mmap_anonymous(len, libc::MAP_NORESERVE)
                .map_err(|errno| MemoryError::Mmap { errno })?,
            Backing::AnonymousThp => map_thp(len)?,
            Backing::Hugetlb2M | Backing::Hugetlb1G => map_hugetlb(len, backing)?,
        };
        Ok(GuestMemory { ptr, size, backing })
    }

    /// Bytes of guest memory.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The backing this memory was mapped with.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Host address of the first byte (what a memslot's `userspace_addr` is).
    pub fn host_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// A raw pointer to the first byte, for KVM and for `unsafe` code that,
    /// like this type, accesses guest memory only atomically.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Gives the host pages of `[offset, offset + len)` back
    /// (`MADV_DONTNEED`), as a host discard or a balloon does: they read
    /// as zero afterwards and are faulted in again on the next access.
    ///
    /// # Errors
    /// [`MemoryError::OutOfRange`] when the range is not inside guest
    /// memory or its start is not 4 KiB-aligned (nothing is dropped then);
    /// [`MemoryError::Madvise`] when the kernel refuses (a hugetlb range not
    /// aligned to its pages).
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), MemoryError> {
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.size);
        if !inside || !offset.is_multiple_of(4096) {
            return Err(MemoryError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        }
        // SAFETY: the range lies inside this private anonymous mapping,
        // which stays mapped; its pages only turn to zero, which accesses
        // (all atomic, see `access`) may observe as another writer's store.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().add(offset as usize).cast(),
                len as usize,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            return Err(MemoryError::Madvise {
                advice: "MADV_DONTNEED",
                errno: errno(),
            });
        }
        Ok(())
    }

    /// Bytes of this mapping backed by transparent huge pages, from
    /// /proc/self/smaps (None where it cannot be read).
    pub fn thp_bytes(&self) -> Option<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let (start, end) = (self.host_addr(), self.host_addr() + self.size);
        let mut inside = false;
        for line in smaps.lines() {
            // A mapping's header line: "start-end perms ...".
            let header = line
                .split_once(' ')
                .and_then(|(range, _)| range.split_once('-'));
            if let Some(a) = header.and_then(|(a, _)| u64::from_str_radix(a, 16).ok()) {
                inside = a >= start && a < end;
                continue;
            }
            if inside && line.starts_with("AnonHugePages:") {
                let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
                return Some(kb << 10);
            }
        }
        None
    }
}

/// THP needs a 2 MiB-aligned range: over-map by 2 MiB, unmap both ends,
/// then advise.
fn map_thp(len: usize) -> Result<NonNull<u8>, MemoryError> {
    let over = mmap_anonymous(len + SIZE_2M, libc::MAP_NORESERVE)
        .map_err(|errno| MemoryError::Mmap { errno })?;
    let base = over.as_ptr() as usize;
    let head = base.next_multiple_of(SIZE_2M) - base;
    let tail = SIZE_2M - head;
    // SAFETY: the head and tail are the unused ends of the mapping just
    // made, which nothing references; `head` stays inside it (< 2 MiB).
    let aligned = unsafe {
        if head != 0 {
            libc::munmap(base as *mut libc::c_void, head);
        }
        let aligned = over.as_ptr().add(head);
        if tail != 0 {
            libc::munmap(aligned.add(len).cast(), tail);
        }
        aligned
    };
    // SAFETY: exactly the range kept above, owned by nobody else yet.
    if unsafe { libc::madvise(aligned.cast(), len, libc::MADV_HUGEPAGE) } != 0 {
        let errno = errno();
        // SAFETY: as above; nothing else refers to it.
        unsafe { libc::munmap(aligned.cast(), len) };
        return Err(MemoryError::Madvise {
            advice: "MADV_HUGEPAGE",
            errno,
        });
    }
    NonNull::new(aligned).ok_or(MemoryError::Mmap {
        errno: libc::ENOMEM,
    })
}

/// hugetlbfs pages, reserved at mmap time (no `MAP_NORESERVE`).
fn map_hugetlb(len: usize, backing: Backing) -> Result<NonNull<u8>, MemoryError> {
    let page_size = backing.page_size();
    let shift = page_size.trailing_zeros() as i32;
    let flags = libc::MAP_HUGETLB | (shift << libc::MAP_HUGE_SHIFT);
    mmap_anonymous(len, flags).map_err(|errno| match errno {
        libc::ENOMEM | libc::EINVAL => MemoryError::HugetlbNotReserved {
            page_size,
            needed: len as u64 / page_size,
            free: hugetlb_free(page_size),
        },
        errno => MemoryError::Mmap { errno },
    })
}

impl fmt::Debug for GuestMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuestMemory")
            .field("host_addr", &format_args!("{:#x}", self.host_addr()))
            .field("size", &self.size)
            .field("backing", &self.backing)
            .finish()
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made and this value owns;
        // no reference into it outlives `&self`. (A KVM memslot still
        // pointing here would fault in the kernel, not touch freed memory;
        // the KVM harness closes its VM first anyway.)
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.size as usize) };
    }
}
