//! A Linux VM's guest RAM as one host mapping: bulk copies in and out of
//! it (no call per page, no lookup per word) and its digest hashed on
//! every CPU in parallel. Migration reads pages while the guest runs and
//! writes them into a destination that has not run; both go straight
//! through the mapping of the file QEMU uses as its memory.

use crate::machine::SharedRam;
use crate::{Arm64Error, Result};
use std::sync::Arc;
use twox_hash::XxHash3_64;

/// Bytes of a guest page.
pub const PAGE: usize = 4096;

/// Pages each hashing thread copies out of the mapping at a time (64 KiB:
/// the copy stays in the CPU's L2 while it is hashed).
const CHUNK_PAGES: usize = 16;

/// Most threads a digest uses.
const MAX_THREADS: usize = 16;

/// The hash of one page: XXH3-64 of its bytes seeded with the page's
/// guest-physical address. It is the migration stream's page hash, so a
/// Linux VM's digest is the one a migration computes (the
/// `s2mmu-arm64-migrate` crate's tests hold the two equal).
pub fn page_hash(data: &[u8], gpa: u64) -> u64 {
    XxHash3_64::oneshot_with_seed(gpa, data)
}

/// The digest of a memory from its page hashes in page order: XXH3-64 of
/// their little-endian bytes (the migration stream's slot digest).
pub fn digest_of(page_hashes: &[u64]) -> u64 {
    use std::hash::Hasher;
    let mut h = XxHash3_64::with_seed(0);
    // 4 KiB of hashes at a time: no copy of them all is made.
    for chunk in page_hashes.chunks(512) {
        let mut buf = [0u8; 512 * 8];
        for (b, v) in buf.chunks_exact_mut(8).zip(chunk) {
            b.copy_from_slice(&v.to_le_bytes());
        }
        h.write(&buf[..chunk.len() * 8]);
    }
    h.finish()
}

/// A Linux VM's guest RAM: `size` bytes of the machine's shared RAM from
/// physical address `base`, which the guest sees at `gpa`.
#[derive(Clone)]
pub struct LinuxRam {
    ram: Arc<SharedRam>,
    ptr: *mut u8,
    size: u64,
    gpa: u64,
}

// SAFETY: `ptr` points into the mapping `ram` keeps alive; every access
// through it copies bytes (no reference into the shared memory is made),
// as `SharedRam` itself does, so the value may move and be shared between
// threads.
unsafe impl Send for LinuxRam {}
// SAFETY: as above.
unsafe impl Sync for LinuxRam {}

impl LinuxRam {
    /// The hashes of every page of a fresh machine's guest RAM as it is
    /// now, its page tables here first filled in as if written: a
    /// migration's stream writes every page of it next, and the first write
    /// to a page mapped by a read costs a 4 KiB shmem page 0.3-0.8 us more
    /// (see [`LinuxRam::populate_for_writes`]); the read here then faults
    /// nothing in.
    ///
    /// # Errors
    /// [`Arm64Error::Io`] when the hashes' memory cannot be had.
    pub(crate) fn fresh_hashes(&self) -> Result<Vec<u64>> {
        let ram = self;
        // Without MADV_POPULATE_WRITE (Linux before 5.14) the read below
        // faults the pages in, and the stream pays the first writes.
        let _ = ram.populate_for_writes();
        let mut h = Vec::new();
        h.try_reserve_exact(ram.pages() as usize)
            .map_err(|e| Arm64Error::Io(format!("page hashes: {e}")))?;
        h.resize(ram.pages() as usize, 0);
        ram.page_hashes(0, &mut h);
        Ok(h)
    }

    /// The guest RAM of `size` bytes at physical `base` in `ram`, at
    /// guest-physical `gpa`.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] when the range is not inside `ram` or not
    /// made of whole pages.
    pub fn new(ram: Arc<SharedRam>, base: u64, size: u64, gpa: u64) -> Result<LinuxRam> {
        let ptr = ram
            .ptr(base, size)
            .filter(|_| size.is_multiple_of(PAGE as u64) && base.is_multiple_of(PAGE as u64))
            .ok_or_else(|| {
                Arm64Error::Config(format!(
                    "guest RAM {base:#x}+{size:#x}: not whole pages inside the machine's RAM"
                ))
            })?;
        Ok(LinuxRam {
            ram,
            ptr,
            size,
            gpa,
        })
    }

    /// Bytes of guest RAM.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Guest pages.
    pub fn pages(&self) -> u64 {
        self.size / PAGE as u64
    }

    /// The guest-physical address of byte 0.
    pub fn gpa(&self) -> u64 {
        self.gpa
    }

    /// The host address of byte 0 (4096-byte aligned).
    pub fn host_addr(&self) -> u64 {
        self.ptr as u64
    }

    /// The shared RAM this lies in.
    pub fn shared(&self) -> &Arc<SharedRam> {
        &self.ram
    }

    /// Maps this guest RAM here as if written, without changing a byte
    /// ([`SharedRam::populate_for_writes`]); whether the kernel did it.
    pub fn populate_for_writes(&self) -> bool {
        self.ram
            .pa(self.ptr as u64)
            .is_some_and(|pa| self.ram.populate_for_writes(pa, self.size))
    }

    fn inside(&self, offset: u64, len: usize) -> bool {
        offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.size)
    }

    /// Copies `out.len()` bytes at `offset` into `out`; false (and `out`
    /// untouched) when they are not all inside.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        if !self.inside(offset, out.len()) {
            return false;
        }
        // SAFETY: `offset..offset + len` is inside the mapping (checked),
        // which `self.ram` keeps; bytes are copied, no reference to the
        // shared memory is made (a guest store racing with the copy leaves
        // some bytes old, some new: the dirty log names the page again).
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.ptr.add(offset as usize),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        true
    }

    /// Copies `data` to `offset`; false (and nothing written) when it does
    /// not fit.
    pub fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        if !self.inside(offset, data.len()) {
            return false;
        }
        // SAFETY: inside the mapping (checked); bytes are copied.
        unsafe {
            core::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset as usize), data.len())
        };
        true
    }

    /// The hashes of pages `first..first + out.len()` ([`page_hash`]), on
    /// every CPU the process may use; false (and `out` untouched) when
    /// the pages are not all inside.
    pub fn page_hashes(&self, first: u64, out: &mut [u64]) -> bool {
        let n = out.len() as u64;
        if first.checked_add(n).is_none_or(|end| end > self.pages()) {
            return false;
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, MAX_THREADS);
        let per = out.len().div_ceil(threads).max(CHUNK_PAGES);
        std::thread::scope(|s| {
            for (i, part) in out.chunks_mut(per).enumerate() {
                let start = first + (i * per) as u64;
                s.spawn(move || self.hash_run(start, part));
            }
        });
        true
    }

    /// Hashes pages `first..` into `out` on this thread.
    fn hash_run(&self, first: u64, out: &mut [u64]) {
        let mut buf = vec![0u8; CHUNK_PAGES * PAGE];
        for (j, hs) in out.chunks_mut(CHUNK_PAGES).enumerate() {
            let p0 = first + (j * CHUNK_PAGES) as u64;
            let bytes = &mut buf[..hs.len() * PAGE];
            let ok = self.read_into(p0 * PAGE as u64, bytes);
            debug_assert!(ok, "the caller checked the range");
            for (k, h) in hs.iter_mut().enumerate() {
                let gpa = self.gpa + (p0 + k as u64) * PAGE as u64;
                *h = page_hash(&bytes[k * PAGE..(k + 1) * PAGE], gpa);
            }
        }
    }

    /// The digest of all guest RAM now ([`digest_of`] its page hashes).
    ///
    /// # Errors
    /// [`Arm64Error::Io`] when the hashes' memory cannot be had.
    pub fn digest(&self) -> Result<u64> {
        let mut hashes = Vec::new();
        hashes
            .try_reserve_exact(self.pages() as usize)
            .map_err(|e| Arm64Error::Io(format!("page hashes: {e}")))?;
        hashes.resize(self.pages() as usize, 0);
        self.page_hashes(0, &mut hashes);
        Ok(digest_of(&hashes))
    }
}
