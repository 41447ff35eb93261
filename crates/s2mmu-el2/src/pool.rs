//! Stage-2 table pages from a region of the carve-out: the engine's
//! [`MmOps`] at EL2, where a table page's physical address is what
//! `VTTBR_EL2` and the table descriptors hold.
//!
//! The pool hands out page runs aligned to their size (a concatenated
//! root), zeroed, keeps each page's entry count, and frees unlinked pages
//! only when no lockless reader walks (a reader count, as the no_std
//! embedding's arena does).

use alloc::boxed::Box;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use s2mmu::MmOps;

use crate::platform::RawMutex;

/// Bytes in a table page (the 4 KiB granule).
pub const PAGE: usize = 4096;

/// The pool's pages and their bookkeeping.
pub struct PagePool {
    base_pa: u64,
    base_va: *mut u8,
    pages: usize,
    counts: Box<[AtomicU32]>,
    state: lock_api::Mutex<RawMutex, PoolState>,
    readers: AtomicUsize,
}

struct PoolState {
    used: Vec<bool>,
    in_use: usize,
    deferred: Vec<u64>,
}

// SAFETY: the pool's memory is handed out one owner at a time under
// `state`'s lock, and table code reads and writes entries atomically
// (MmOps's contract); the raw pointer is only an address base.
unsafe impl Send for PagePool {}
// SAFETY: as for `Send`.
unsafe impl Sync for PagePool {}

impl PagePool {
    /// A pool over `pages` pages at physical address `base_pa`, accessed at
    /// `base_va`.
    ///
    /// # Safety
    /// `[base_va, base_va + pages * PAGE)` is memory this pool owns alone
    /// for as long as it and its tables live, page aligned, readable and
    /// writable, and `base_pa` is its physical address (the address a
    /// table walker uses).
    pub unsafe fn new(base_pa: u64, base_va: *mut u8, pages: usize) -> Arc<Self> {
        Arc::new(PagePool {
            base_pa,
            base_va,
            pages,
            counts: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            state: lock_api::Mutex::new(PoolState {
                used: vec![false; pages],
                in_use: 0,
                deferred: Vec::new(),
            }),
            readers: AtomicUsize::new(0),
        })
    }

    /// Pages allocated now (deferred ones included until freed).
    pub fn used_pages(&self) -> usize {
        self.state.lock().in_use
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// `[base, base + bytes)` of physical memory the pool covers.
    pub fn range(&self) -> (u64, u64) {
        (self.base_pa, (self.pages * PAGE) as u64)
    }

    fn index(&self, pa: u64) -> usize {
        let i = pa
            .checked_sub(self.base_pa)
            .map(|o| (o / PAGE as u64) as usize)
            .filter(|&i| i < self.pages);
        match i {
            Some(i) => i,
            None => panic!("{pa:#x} is not a page of this pool"),
        }
    }

    fn alloc(&self, n: usize) -> Option<u64> {
        if n == 0 || !n.is_power_of_two() || n > self.pages {
            return None;
        }
        let mut st = self.state.lock();
        self.reclaim(&mut st);
        let first = (0..self.pages / n)
            .map(|k| k * n)
            .find(|&i| st.used[i..i + n].iter().all(|u| !*u))?;
        st.used[first..first + n].iter_mut().for_each(|u| *u = true);
        st.in_use += n;
        drop(st);
        // SAFETY: pages `first..first + n` were free and are now ours
        // alone; they lie inside the pool (`new`'s contract).
        unsafe { core::ptr::write_bytes(self.base_va.add(first * PAGE), 0, n * PAGE) };
        for c in &self.counts[first..first + n] {
            c.store(0, Ordering::Relaxed);
        }
        Some(self.base_pa + (first * PAGE) as u64)
    }

    fn free(&self, st: &mut PoolState, pa: u64, n: usize) {
        let i = self.index(pa);
        for u in &mut st.used[i..i + n] {
            assert!(*u, "double free of {pa:#x}");
            *u = false;
        }
        st.in_use -= n;
    }

    /// Frees the deferred pages if no reader walks now.
    fn reclaim(&self, st: &mut PoolState) {
        if !st.deferred.is_empty() && self.readers.load(Ordering::SeqCst) == 0 {
            for pa in core::mem::take(&mut st.deferred) {
                self.free(st, pa, 1);
            }
        }
    }
}

/// [`MmOps`] over a shared [`PagePool`].
#[derive(Clone)]
pub struct PoolMmOps(Arc<PagePool>);

impl PoolMmOps {
    /// Table pages from `pool`.
    pub fn new(pool: Arc<PagePool>) -> Self {
        PoolMmOps(pool)
    }

    /// The pool.
    pub fn pool(&self) -> &Arc<PagePool> {
        &self.0
    }
}

/// A lockless reader's pin: deferred pages stay while any lives.
pub struct PoolReadGuard(Arc<PagePool>);

impl Drop for PoolReadGuard {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

// SAFETY: pages are zeroed, page aligned (the pool is, `new`'s contract),
// runs aligned to their size, used by one owner until freed (the `used`
// map); `phys_to_virt` points into the pool, which outlives every table
// (each holds an `Arc` of it); counts are per page and zeroed on
// allocation; deferred pages are freed only when no read guard is alive.
unsafe impl MmOps for PoolMmOps {
    type ReadGuard = PoolReadGuard;

    fn page_size(&self) -> usize {
        PAGE
    }
    fn zalloc_page(&self) -> Option<u64> {
        self.0.alloc(1)
    }
    fn zalloc_pages_exact(&self, n: usize) -> Option<u64> {
        self.0.alloc(n)
    }
    unsafe fn free_page(&self, pa: u64) {
        self.0.free(&mut self.0.state.lock(), pa, 1);
    }
    unsafe fn free_pages_exact(&self, pa: u64, n: usize) {
        self.0.free(&mut self.0.state.lock(), pa, n);
    }
    fn phys_to_virt(&self, pa: u64) -> *mut u64 {
        let i = self.0.index(pa);
        // SAFETY: `i < pages`, so the pointer stays inside the pool.
        unsafe { self.0.base_va.add(i * PAGE) as *mut u64 }
    }
    fn entry_count(&self, pa: u64) -> &AtomicU32 {
        &self.0.counts[self.0.index(pa)]
    }
    fn read_guard(&self) -> PoolReadGuard {
        self.0.readers.fetch_add(1, Ordering::SeqCst);
        PoolReadGuard(self.0.clone())
    }
    fn same_allocator(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
    unsafe fn free_pages_deferred(&self, pages: Vec<u64>) {
        let mut st = self.0.state.lock();
        st.deferred.extend(pages);
        self.0.reclaim(&mut st);
    }
}
