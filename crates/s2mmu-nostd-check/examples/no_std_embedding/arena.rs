//! Table pages from a static arena: what a no_std hypervisor has instead of
//! a heap for its page tables. Copied from `crates/s2mmu-nostd-check`
//! (without its fault injection): only `core`, `alloc` and `lock_api`.

use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use s2mmu::MmOps;

use s2mmu::sync::RawSpinMutex;

/// Bytes in a table page (the 4 KiB granule).
pub const PAGE: usize = 4096;
/// The "physical" address of the arena's first page: table addresses are
/// not host addresses, as on a real hypervisor ([`ArenaMmOps::phys_to_virt`]
/// translates).
pub const ARENA_PA: u64 = 0x4000_0000;

#[repr(C, align(4096))]
struct Page([u8; PAGE]);

/// `N` table pages, a map of the used ones, their entry counts and the
/// readers' count for deferred frees.
pub struct Arena<const N: usize> {
    pages: UnsafeCell<[Page; N]>,
    counts: [AtomicU32; N],
    // The engine's spin mutex, not the ticket lock: the example counts the
    // ticket locks the facade takes.
    state: lock_api::Mutex<RawSpinMutex, ArenaState<N>>,
    /// Lockless readers now walking ([`MmOps::read_guard`]).
    readers: AtomicUsize,
}

struct ArenaState<const N: usize> {
    used: [bool; N],
    /// Unlinked pages waiting for a moment with no reader.
    deferred: Vec<u64>,
}

// SAFETY: the pages are handed out one owner at a time under `state`'s lock
// and accessed only through the pointers `phys_to_virt` gives to the table
// code, which reads and writes entries atomically (MmOps's contract); the
// rest is atomics and a lock.
unsafe impl<const N: usize> Sync for Arena<N> {}

impl<const N: usize> Arena<N> {
    /// An arena with every page free.
    pub const fn new() -> Self {
        Arena {
            pages: UnsafeCell::new([const { Page([0; PAGE]) }; N]),
            counts: [const { AtomicU32::new(0) }; N],
            state: lock_api::Mutex::new(ArenaState {
                used: [false; N],
                deferred: Vec::new(),
            }),
            readers: AtomicUsize::new(0),
        }
    }

    /// Pages now allocated (deferred ones included until freed).
    pub fn used_pages(&self) -> usize {
        self.state.lock().used.iter().filter(|u| **u).count()
    }

    fn index(&self, pa: u64) -> usize {
        let i = pa
            .checked_sub(ARENA_PA)
            .map(|o| (o / PAGE as u64) as usize)
            .filter(|&i| i < N);
        match i {
            Some(i) => i,
            None => panic!("{pa:#x} is not a page of this arena"),
        }
    }

    fn alloc(&self, n: usize) -> Option<u64> {
        if n == 0 || !n.is_power_of_two() {
            return None;
        }
        let mut st = self.state.lock();
        self.reclaim(&mut st);
        // Aligned to the run's size, as `zalloc_pages_exact` promises.
        let first = (0..N / n)
            .map(|k| k * n)
            .find(|&i| st.used[i..i + n].iter().all(|u| !*u));
        let first = first?;
        st.used[first..first + n].iter_mut().for_each(|u| *u = true);
        drop(st);
        // SAFETY: pages `first..first + n` were free and are now ours alone;
        // the pointer stays inside the arena.
        unsafe {
            let p = (self.pages.get() as *mut Page).add(first);
            core::ptr::write_bytes(p, 0, n);
        }
        for c in &self.counts[first..first + n] {
            c.store(0, Ordering::Relaxed);
        }
        Some(ARENA_PA + (first * PAGE) as u64)
    }

    fn free(&self, st: &mut ArenaState<N>, pa: u64, n: usize) {
        let i = self.index(pa);
        for u in &mut st.used[i..i + n] {
            assert!(*u, "double free of {pa:#x}");
            *u = false;
        }
    }

    /// Frees the deferred pages if no reader walks now: every reader that
    /// could have reached one when it was unlinked has left.
    fn reclaim(&self, st: &mut ArenaState<N>) {
        if !st.deferred.is_empty() && self.readers.load(Ordering::SeqCst) == 0 {
            for pa in core::mem::take(&mut st.deferred) {
                self.free(st, pa, 1);
            }
        }
    }
}

impl<const N: usize> Default for Arena<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// [`MmOps`] over a static [`Arena`].
pub struct ArenaMmOps<const N: usize>(&'static Arena<N>);

impl<const N: usize> Clone for ArenaMmOps<N> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<const N: usize> Copy for ArenaMmOps<N> {}

impl<const N: usize> ArenaMmOps<N> {
    /// Table pages from `arena`.
    pub fn new(arena: &'static Arena<N>) -> Self {
        ArenaMmOps(arena)
    }
}

/// A lockless reader's pin: deferred pages stay while any lives.
pub struct ArenaReadGuard<const N: usize>(&'static Arena<N>);

impl<const N: usize> Drop for ArenaReadGuard<N> {
    fn drop(&mut self) {
        self.0.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

// SAFETY: pages are zeroed, page aligned (the arena is, and pages are
// `PAGE` apart), runs aligned to their size, used by one owner until freed
// (the `used` map); `phys_to_virt` points into the arena, which is static;
// counts are per page and zeroed on allocation; deferred pages are freed
// only when no read guard is alive (a guard taken after the unlink cannot
// reach them).
unsafe impl<const N: usize> MmOps for ArenaMmOps<N> {
    type ReadGuard = ArenaReadGuard<N>;

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
        // SAFETY: `i < N`, so the pointer stays inside the arena.
        unsafe { (self.0.pages.get() as *mut Page).add(i) as *mut u64 }
    }
    fn entry_count(&self, pa: u64) -> &AtomicU32 {
        &self.0.counts[self.0.index(pa)]
    }
    fn read_guard(&self) -> ArenaReadGuard<N> {
        self.0.readers.fetch_add(1, Ordering::SeqCst);
        ArenaReadGuard(self.0)
    }
    fn same_allocator(&self, other: &Self) -> bool {
        core::ptr::eq(self.0, other.0)
    }
    unsafe fn free_pages_deferred(&self, pages: Vec<u64>) {
        let mut st = self.0.state.lock();
        st.deferred.extend(pages);
        self.0.reclaim(&mut st);
    }
}
