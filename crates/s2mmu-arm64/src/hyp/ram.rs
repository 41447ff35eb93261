//! The machine's RAM: the file QEMU uses as its memory backend, mapped
//! into this process.

use crate::layout;
use crate::ram_file::RamFile;
pub use crate::ram_file::{RamBacking, RamPages};
use crate::{Arm64Error, Result};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// The machine's RAM, mapped into this process from the file QEMU uses as
/// its memory backend.
pub struct SharedRam {
    ptr: *mut u8,
    len: u64,
    file: RamFile,
}

// SAFETY: the mapping is plain shared memory; every access through this
// type is atomic or volatile, and the pointer stays valid until drop.
unsafe impl Send for SharedRam {}
// SAFETY: as above; no method hands out references that allow plain
// (non-atomic) concurrent writes.
unsafe impl Sync for SharedRam {}

impl SharedRam {
    pub(crate) fn create(len: u64, pages: RamPages) -> Result<SharedRam> {
        let file = RamFile::create(len, pages)?;
        // Host addresses congruent to physical ones modulo 1 GiB, so the
        // engine's block mappings (which need guest, host and physical
        // addresses aligned alike) are possible: reserve, then place the
        // file at an aligned address inside the reservation.
        const ALIGN: usize = 1 << 30;
        // SAFETY: an anonymous reservation; the kernel picks the address.
        let res = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len as usize + ALIGN,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if res == libc::MAP_FAILED {
            return Err(Arm64Error::Io(format!(
                "reserving {len} bytes: {}",
                std::io::Error::last_os_error()
            )));
        }
        let aligned = (res as usize).next_multiple_of(ALIGN);
        let (head, tail) = (aligned - res as usize, ALIGN - (aligned - res as usize));
        // SAFETY: the unused head and tail of our own reservation.
        unsafe {
            if head > 0 {
                libc::munmap(res, head);
            }
            libc::munmap((aligned + len as usize) as *mut libc::c_void, tail);
        }
        // SAFETY: replaces the part of our reservation at `aligned` with a
        // shared mapping of the file we sized to `len`.
        let ptr = unsafe {
            libc::mmap(
                aligned as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                file.fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            // SAFETY: the rest of our reservation.
            unsafe { libc::munmap(aligned as *mut libc::c_void, len as usize) };
            return Err(Arm64Error::Io(format!(
                "mmap of {} bytes: {}",
                len,
                std::io::Error::last_os_error()
            )));
        }
        Ok(SharedRam {
            ptr: ptr.cast(),
            len,
            file,
        })
    }

    /// Which host pages back the RAM.
    pub fn backing(&self) -> &RamBacking {
        &self.file.backing
    }

    /// The path QEMU opens the RAM by (the open file, inherited).
    pub(crate) fn qemu_path(&self) -> String {
        self.file.qemu_path()
    }

    /// The open file behind the RAM, which a QEMU child must inherit.
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.fd.as_raw_fd()
    }

    /// Bytes of RAM.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the RAM is empty (never: a machine has RAM).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[pa, pa + size)` lies in RAM.
    pub fn contains(&self, pa: u64, size: u64) -> bool {
        pa >= layout::RAM_BASE
            && pa
                .checked_add(size)
                .is_some_and(|end| end <= layout::RAM_BASE + self.len)
    }

    /// A pointer to `[pa, pa + size)` in this process, if it lies in RAM.
    pub fn ptr(&self, pa: u64, size: u64) -> Option<*mut u8> {
        // SAFETY: in bounds of the mapping (checked).
        self.contains(pa, size)
            .then(|| unsafe { self.ptr.add((pa - layout::RAM_BASE) as usize) })
    }

    /// Maps `[pa, pa + size)` in this process as if written (page tables
    /// filled in, writable and dirty), without changing a byte
    /// (`MADV_POPULATE_WRITE`), so that a stream's copies into it (a
    /// migration's destination) take no first-write cost per page: 0.6
    /// against 0.9-1.4 us a 4 KiB `/dev/shm` page first touched by a read
    /// (`scripts/shm_first_write.c`). Returns whether the kernel did it
    /// (from Linux 5.14; a range outside RAM is refused).
    pub fn populate_for_writes(&self, pa: u64, size: u64) -> bool {
        let Some(p) = self.ptr(pa, size) else {
            return false;
        };
        // SAFETY: a range of our own mapping (checked by `ptr`); the
        // advice changes page tables, not memory contents.
        unsafe { libc::madvise(p.cast(), size as usize, libc::MADV_POPULATE_WRITE) == 0 }
    }

    /// The host address of `pa` (what a memslot's `userspace_addr` holds).
    pub fn hva(&self, pa: u64) -> Option<u64> {
        self.ptr(pa, 1).map(|p| p as u64)
    }

    /// The physical address of host address `hva`, if it lies in RAM.
    pub fn pa(&self, hva: u64) -> Option<u64> {
        let base = self.ptr as u64;
        (hva >= base && hva < base + self.len).then(|| hva - base + layout::RAM_BASE)
    }

    /// The 64-bit word at `pa`, as an atomic shared with QEMU.
    ///
    /// # Panics
    /// If `pa` is not 8-byte aligned or not in RAM: callers pass the fixed
    /// layout's addresses and addresses they checked.
    pub fn word(&self, pa: u64) -> &AtomicU64 {
        assert!(pa.is_multiple_of(8), "unaligned shared word {pa:#x}");
        let p = self.ptr(pa, 8).expect("shared word inside RAM");
        // SAFETY: aligned, in bounds, and the mapping outlives `&self`; the
        // other side (QEMU) accesses these words with single-copy-atomic
        // loads and stores, as atomics do.
        unsafe { &*(p as *const AtomicU64) }
    }

    /// Reads the word at `pa`.
    pub fn read(&self, pa: u64) -> u64 {
        self.word(pa).load(Ordering::Acquire)
    }

    /// Writes the word at `pa`.
    pub fn write(&self, pa: u64, v: u64) {
        self.word(pa).store(v, Ordering::Release)
    }

    /// Copies `data` to `pa`.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] if the range is not in RAM.
    pub fn write_bytes(&self, pa: u64, data: &[u8]) -> Result<()> {
        let p = self
            .ptr(pa, data.len() as u64)
            .ok_or_else(|| Arm64Error::Config(format!("{pa:#x}+{:#x} outside RAM", data.len())))?;
        // SAFETY: in bounds (checked); bytes are copied, no reference to the
        // shared memory is made.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }
}

impl Drop for SharedRam {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `create`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len as usize) };
    }
}
