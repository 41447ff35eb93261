//! Table pages: how the engine gets, counts and gives back the memory its
//! tables live in.
//!
//! The hypervisor provides physical memory through [`MmOps`] (KVM's
//! `kvm_pgtable_mm_ops`). Every non-root table page carries a count of its
//! non-zero entries, so an emptied table is found without scanning it and
//! freed. Tables unlinked while lockless readers may still be walking them are
//! handed to [`MmOps::free_pages_deferred`], which frees them only once no
//! reader can hold a pointer into them (epoch-based reclamation in the `std`
//! default, [`HostMmOps`]).

use alloc::vec::Vec;
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Physical memory for table pages.
///
/// # Safety
/// Implementations must uphold what the walker relies on:
/// - [`MmOps::zalloc_page`] returns a zeroed, page-aligned page of
///   [`MmOps::page_size`] bytes that nothing else uses until it is freed, and
///   [`MmOps::zalloc_pages_exact`] `n` contiguous such pages aligned to their
///   total size;
/// - [`MmOps::phys_to_virt`] returns a pointer through which the page can be
///   read and written for as long as it is allocated;
/// - [`MmOps::entry_count`] returns the same counter for a page for as long as
///   it is allocated, zero when the page is handed out;
/// - memory given to [`MmOps::free_pages_deferred`] stays readable until every
///   [`MmOps::ReadGuard`] that existed at the time of the call is dropped.
pub unsafe trait MmOps: Clone + Send + Sync + 'static {
    /// What a lockless reader holds while it walks tables (an epoch pin).
    type ReadGuard;

    /// Size of one table page in bytes (the granule).
    fn page_size(&self) -> usize;
    /// One zeroed table page, or `None` when out of memory.
    fn zalloc_page(&self) -> Option<u64>;
    /// `n` physically contiguous zeroed pages (the concatenated root).
    fn zalloc_pages_exact(&self, n: usize) -> Option<u64>;
    /// Gives back a page from [`MmOps::zalloc_page`].
    ///
    /// # Safety
    /// `pa` came from `zalloc_page` of this allocator, is not freed yet, and no
    /// reader can reach it any more.
    unsafe fn free_page(&self, pa: u64);
    /// Gives back pages from [`MmOps::zalloc_pages_exact`].
    ///
    /// # Safety
    /// As for [`MmOps::free_page`], with the same `n` as the allocation.
    unsafe fn free_pages_exact(&self, pa: u64, n: usize);
    /// A pointer to the entries of the page at `pa`.
    fn phys_to_virt(&self, pa: u64) -> *mut u64;
    /// The count of non-zero entries of the table page at `pa`.
    fn entry_count(&self, pa: u64) -> &AtomicU32;
    /// Pins the caller as a reader: pages unlinked after this call are not
    /// freed while the guard lives.
    fn read_guard(&self) -> Self::ReadGuard;
    /// Whether `other` hands out pages of the same allocator as `self`, so
    /// that a page from one may be freed through the other. Tables refuse a
    /// [`crate::PageCache`] of another allocator: its pages would be linked
    /// into the table and later freed into the wrong pool (or outlive theirs).
    /// The default, `true`, suits an implementation with one allocator per
    /// type; one whose handles can refer to different allocators overrides it.
    fn same_allocator(&self, other: &Self) -> bool {
        let _ = other;
        true
    }
    /// Frees unlinked pages once no reader that started before this call can
    /// still reach them. The default frees at once, which is right only
    /// where no software walks tables without the lock (hardware walkers are
    /// fenced by TLB invalidation).
    ///
    /// # Safety
    /// Each page came from `zalloc_page`, is not freed yet, and is no longer
    /// reachable from the root.
    unsafe fn free_pages_deferred(&self, pages: Vec<u64>) {
        for pa in pages {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.free_page(pa) };
        }
    }
}

/// Reads the entry at `index` of the table page at `pa`.
///
/// # Safety
/// `pa` is a table page allocated by `mm` and still readable (reachable, or
/// protected by a read guard), and `index` is below the entries per page.
#[inline(always)]
pub(crate) unsafe fn entry_ref<M: MmOps>(mm: &M, pa: u64, index: usize) -> &AtomicU64 {
    // SAFETY: the page is live and 8-byte aligned (page aligned), `index` is in
    // bounds, and `AtomicU64` has the layout of `u64`; all accesses to table
    // entries go through atomics, so no plain access races with this one.
    unsafe { &*(mm.phys_to_virt(pa).add(index) as *const AtomicU64) }
}

#[cfg(feature = "std")]
pub use host::{HostMmOps, HostMmStats};

#[cfg(feature = "std")]
mod host {
    use super::MmOps;
    use alloc::sync::Arc;
    use alloc::vec::Vec;
    use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::sync::Mutex;

    // Lock poisoning: the pool's mutexes guard a free list and a chunk list
    // that are updated by single pushes and pops, never left half-done, and
    // no code panics while holding them; their `unwrap`s can only propagate
    // a panic that is already a bug.

    /// Bytes in one allocation chunk. Its first page holds the entry counters
    /// of the others, so a counter is found by address arithmetic alone.
    /// Under Miri, which interprets every byte of a fresh chunk, 256 KiB
    /// (four 64 KiB pages): the same arithmetic on fewer pages.
    const CHUNK: usize = if cfg!(miri) { 256 << 10 } else { 2 << 20 };

    /// Table pages from host memory, for hypervisors that run in user space,
    /// tests and benchmarks. Addresses are host virtual addresses used as
    /// "physical" addresses (identity `phys_to_virt`). Freed pages are zeroed
    /// and recycled; unlinked tables are reclaimed through crossbeam-epoch.
    #[derive(Clone)]
    pub struct HostMmOps {
        pool: Arc<Pool>,
    }

    struct Pool {
        page_size: usize,
        chunks: Mutex<Vec<usize>>,
        free: Mutex<Vec<u64>>,
        live_pages: AtomicUsize,
        deferred_pages: AtomicUsize,
        root_pages: AtomicUsize,
        chunk_pages: AtomicUsize,
    }

    /// Page accounting of a [`HostMmOps`], for leak checks.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub struct HostMmStats {
        /// Table pages handed out and not yet given back (deferred ones included).
        pub live_pages: usize,
        /// Of those, pages waiting for readers to leave before they are freed.
        pub deferred_pages: usize,
        /// Root pages handed out and not yet given back.
        pub root_pages: usize,
        /// Pages obtained from the host so far (high-water mark).
        pub chunk_pages: usize,
    }

    impl HostMmOps {
        /// An allocator of `page_size`-byte table pages (4, 16 or 64 KiB).
        ///
        /// # Errors
        /// [`crate::Error::InvalidConfig`] for another page size.
        pub fn new(page_size: usize) -> crate::Result<Self> {
            if !matches!(page_size, 0x1000 | 0x4000 | 0x10000) {
                return Err(crate::Error::InvalidConfig {
                    what: "table page size",
                    value: page_size as u64,
                });
            }
            Ok(HostMmOps {
                pool: Arc::new(Pool {
                    page_size,
                    chunks: Mutex::new(Vec::new()),
                    free: Mutex::new(Vec::new()),
                    live_pages: AtomicUsize::new(0),
                    deferred_pages: AtomicUsize::new(0),
                    root_pages: AtomicUsize::new(0),
                    chunk_pages: AtomicUsize::new(0),
                }),
            })
        }

        /// Current page accounting.
        pub fn stats(&self) -> HostMmStats {
            HostMmStats {
                live_pages: self.pool.live_pages.load(Ordering::Acquire),
                deferred_pages: self.pool.deferred_pages.load(Ordering::Acquire),
                root_pages: self.pool.root_pages.load(Ordering::Acquire),
                chunk_pages: self.pool.chunk_pages.load(Ordering::Acquire),
            }
        }

        /// Advances the reclamation epoch until this pool's deferred frees
        /// have run, for at most about ten seconds (other threads' garbage
        /// shares the queue, and a thread pinned for long holds the epoch
        /// back; on a loaded 2-core machine two seconds were not always
        /// enough): for leak checks in tests. Returns whether all ran.
        pub fn flush_deferred(&self) -> bool {
            let start = std::time::Instant::now();
            let mut i = 0u32;
            while start.elapsed() < std::time::Duration::from_secs(10) {
                if self.pool.deferred_pages.load(Ordering::Acquire) == 0 {
                    return true;
                }
                crossbeam_epoch::pin().flush();
                i = i.wrapping_add(1);
                if i % 64 == 63 {
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            }
            self.pool.deferred_pages.load(Ordering::Acquire) == 0
        }
    }

    impl Pool {
        fn grow(&self, free: &mut Vec<u64>) -> bool {
            let layout = Layout::from_size_align(CHUNK, CHUNK).expect("constant layout");
            // SAFETY: the layout has a non-zero size.
            let base = unsafe { alloc_zeroed(layout) };
            if base.is_null() {
                return false;
            }
            let pages = CHUNK / self.page_size;
            // Page 0 holds the counters; fault the others in now, outside any
            // lock the caller may take later, so a split writes to hot pages.
            for i in (1..pages).rev() {
                // SAFETY: in bounds of the fresh allocation, which nothing else uses.
                unsafe { base.add(i * self.page_size).write_volatile(0) };
                free.push(base as u64 + (i * self.page_size) as u64);
            }
            self.chunks.lock().unwrap().push(base as usize);
            self.chunk_pages.fetch_add(pages, Ordering::Relaxed);
            true
        }

        fn release(&self, pa: u64) {
            // SAFETY: the caller gives back a page of this pool that no one
            // reads any more; zero it so the next user gets a clean table.
            unsafe { core::ptr::write_bytes(pa as *mut u8, 0, self.page_size) };
            self.free.lock().unwrap().push(pa);
            self.live_pages.fetch_sub(1, Ordering::Release);
        }
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            let layout = Layout::from_size_align(CHUNK, CHUNK).expect("constant layout");
            for &base in self.chunks.get_mut().unwrap().iter() {
                // SAFETY: allocated in `grow` with this layout; the last
                // handle is gone, so no table page is in use.
                unsafe { dealloc(base as *mut u8, layout) };
            }
        }
    }

    // SAFETY: pages come from zeroed chunks or are zeroed when given back; a
    // page's counter lives in its chunk's first page at a fixed index and is
    // reset on release because a freed table has no counted entries (the
    // engine frees a table only when its count is zero or after clearing
    // it); deferred frees wait for an epoch in which no guard from before
    // the call is alive.
    unsafe impl MmOps for HostMmOps {
        type ReadGuard = crossbeam_epoch::Guard;

        #[inline]
        fn page_size(&self) -> usize {
            self.pool.page_size
        }

        fn zalloc_page(&self) -> Option<u64> {
            let mut free = self.pool.free.lock().unwrap();
            if free.is_empty() && !self.pool.grow(&mut free) {
                return None;
            }
            let pa = free.pop()?;
            drop(free);
            self.entry_count(pa).store(0, Ordering::Relaxed);
            self.pool.live_pages.fetch_add(1, Ordering::Relaxed);
            Some(pa)
        }

        fn zalloc_pages_exact(&self, n: usize) -> Option<u64> {
            let size = n.checked_mul(self.pool.page_size)?;
            let layout = Layout::from_size_align(size, size).ok()?;
            // SAFETY: non-zero size.
            let p = unsafe { alloc_zeroed(layout) };
            if p.is_null() {
                return None;
            }
            self.pool.root_pages.fetch_add(n, Ordering::Relaxed);
            Some(p as u64)
        }

        unsafe fn free_page(&self, pa: u64) {
            self.pool.release(pa);
        }

        unsafe fn free_pages_exact(&self, pa: u64, n: usize) {
            let size = n * self.pool.page_size;
            let layout = Layout::from_size_align(size, size).expect("same layout as allocation");
            // SAFETY: allocated by `zalloc_pages_exact` with this layout.
            unsafe { dealloc(pa as *mut u8, layout) };
            self.pool.root_pages.fetch_sub(n, Ordering::Relaxed);
        }

        #[inline(always)]
        fn phys_to_virt(&self, pa: u64) -> *mut u64 {
            pa as *mut u64
        }

        #[inline(always)]
        fn entry_count(&self, pa: u64) -> &AtomicU32 {
            let base = (pa as usize) & !(CHUNK - 1);
            // `page_size` is a power of two (checked in `new`): a shift, not a
            // division, on every level of every walk.
            let index = (pa as usize - base) >> self.pool.page_size.trailing_zeros();
            // SAFETY: `pa` is a page of a live chunk (the caller holds a table
            // page of this pool, and chunks live as long as the pool); the
            // counters of a chunk are the first `CHUNK / page_size` u32s of
            // its first page, and `index` is below that.
            unsafe { &*((base as *const AtomicU32).add(index)) }
        }

        #[inline]
        fn read_guard(&self) -> crossbeam_epoch::Guard {
            crossbeam_epoch::pin()
        }

        fn same_allocator(&self, other: &Self) -> bool {
            Arc::ptr_eq(&self.pool, &other.pool)
        }

        unsafe fn free_pages_deferred(&self, pages: Vec<u64>) {
            if pages.is_empty() {
                return;
            }
            self.pool
                .deferred_pages
                .fetch_add(pages.len(), Ordering::AcqRel);
            let pool = self.pool.clone();
            let guard = crossbeam_epoch::pin();
            // The closure runs once every thread pinned before now has unpinned.
            guard.defer(move || {
                let n = pages.len();
                for pa in pages {
                    pool.release(pa);
                }
                pool.deferred_pages.fetch_sub(n, Ordering::AcqRel);
            });
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn pages_are_zeroed_aligned_and_counted() {
            let mm = HostMmOps::new(4096).unwrap();
            let a = mm.zalloc_page().unwrap();
            assert_eq!(a % 4096, 0);
            assert_eq!(mm.stats().live_pages, 1);
            let p = mm.phys_to_virt(a);
            // SAFETY: a live page of 512 u64 entries.
            unsafe {
                assert!((0..512).all(|i| *p.add(i) == 0));
                *p.add(7) = 42;
            }
            mm.entry_count(a).store(3, Ordering::Relaxed);
            // SAFETY: `a` is ours and unreachable.
            unsafe { mm.free_page(a) };
            assert_eq!(mm.stats().live_pages, 0);
            let b = mm.zalloc_page().unwrap();
            assert_eq!(a, b, "freed page is recycled");
            // SAFETY: live page of 512 entries.
            let word = unsafe { *mm.phys_to_virt(b).add(7) };
            assert_eq!(word, 0, "recycled page is zeroed");
            assert_eq!(mm.entry_count(b).load(Ordering::Relaxed), 0);
        }

        #[test]
        fn counters_are_distinct_per_page() {
            for ps in [4096usize, 16384, 65536] {
                let mm = HostMmOps::new(ps).unwrap();
                let pages: Vec<u64> = (0..40).map(|_| mm.zalloc_page().unwrap()).collect();
                for (i, &p) in pages.iter().enumerate() {
                    mm.entry_count(p).store(i as u32 + 1, Ordering::Relaxed);
                }
                for (i, &p) in pages.iter().enumerate() {
                    assert_eq!(mm.entry_count(p).load(Ordering::Relaxed), i as u32 + 1);
                }
            }
        }

        #[test]
        fn deferred_frees_wait_for_readers() {
            let mm = HostMmOps::new(4096).unwrap();
            let a = mm.zalloc_page().unwrap();
            let reader = mm.read_guard();
            // SAFETY: `a` is unreachable (never linked).
            unsafe { mm.free_pages_deferred(alloc::vec![a]) };
            assert_eq!(mm.stats().deferred_pages, 1);
            // The reader is still pinned, so the page must not be freed.
            for _ in 0..10 {
                crossbeam_epoch::pin().flush();
            }
            assert_eq!(mm.stats().live_pages, 1);
            drop(reader);
            mm.flush_deferred();
            assert_eq!(mm.stats().deferred_pages, 0);
            assert_eq!(mm.stats().live_pages, 0);
        }

        #[test]
        fn root_pages_are_aligned_to_their_size() {
            let mm = HostMmOps::new(4096).unwrap();
            let r = mm.zalloc_pages_exact(16).unwrap();
            assert_eq!(r % (16 * 4096), 0);
            assert_eq!(mm.stats().root_pages, 16);
            // SAFETY: allocated just above with n = 16.
            unsafe { mm.free_pages_exact(r, 16) };
            assert_eq!(mm.stats().root_pages, 0);
        }

        #[test]
        fn rejects_odd_page_sizes() {
            assert!(HostMmOps::new(8192).is_err());
        }
    }
}
