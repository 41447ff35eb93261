//! Table pages from an arena inside the machine's RAM: the engine's
//! [`MmOps`] with real guest-physical addresses, so QEMU's walker reads the
//! tables the engine writes.

use crate::machine::SharedRam;
use s2mmu::MmOps;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A bump-and-free-list allocator of table pages over `[base, base + size)`
/// of the machine's RAM. Entry counters live beside it in host memory.
#[derive(Clone)]
pub struct ArenaMmOps {
    inner: Arc<Inner>,
}

struct Inner {
    ram: Arc<SharedRam>,
    base: u64,
    size: u64,
    page_size: usize,
    counts: Box<[AtomicU32]>,
    state: Mutex<State>,
    live: AtomicUsize,
}

struct State {
    next: u64,
    free: Vec<u64>,
}

impl ArenaMmOps {
    /// An arena of `page_size` pages over `[base, base + size)` of `ram`.
    ///
    /// # Errors
    /// [`s2mmu::Error::InvalidConfig`] for a page size the engine does not
    /// know, a range that is not page aligned or not inside `ram`.
    pub fn new(ram: Arc<SharedRam>, base: u64, size: u64, page_size: usize) -> s2mmu::Result<Self> {
        if !matches!(page_size, 0x1000 | 0x4000 | 0x10000) {
            return Err(s2mmu::Error::InvalidConfig {
                what: "arena page size",
                value: page_size as u64,
            });
        }
        let ps = page_size as u64;
        if !base.is_multiple_of(ps) || !size.is_multiple_of(ps) || !ram.contains(base, size) {
            return Err(s2mmu::Error::InvalidConfig {
                what: "arena range (page aligned, inside RAM)",
                value: base,
            });
        }
        let pages = (size / ps) as usize;
        Ok(ArenaMmOps {
            inner: Arc::new(Inner {
                ram,
                base,
                size,
                page_size,
                counts: (0..pages).map(|_| AtomicU32::new(0)).collect(),
                state: Mutex::new(State {
                    next: base,
                    free: Vec::new(),
                }),
                live: AtomicUsize::new(0),
            }),
        })
    }

    /// Pages handed out and not given back.
    pub fn live_pages(&self) -> usize {
        self.inner.live.load(Ordering::Acquire)
    }

    fn zero(&self, pa: u64, n: usize) {
        let len = n * self.inner.page_size;
        let p = self
            .inner
            .ram
            .ptr(pa, len as u64)
            .expect("arena page inside RAM");
        // SAFETY: `p` points to `len` bytes of the shared mapping (checked by
        // `ptr`), a page nothing reaches yet (not linked into a table).
        unsafe { core::ptr::write_bytes(p, 0, len) };
    }
}

impl Inner {
    fn release(&self, pa: u64) {
        self.state.lock().unwrap().free.push(pa);
        self.live.fetch_sub(1, Ordering::Release);
    }
}

// SAFETY: pages are zeroed when handed out, page aligned (bump pointer from
// an aligned base, or recycled pages), and never handed out twice until
// freed; `phys_to_virt` points into the shared mapping, which lives as long
// as the `SharedRam` this arena holds; each page has its own counter, reset
// on allocation; deferred frees wait for a crossbeam epoch in which no guard
// from before the call is alive.
unsafe impl MmOps for ArenaMmOps {
    type ReadGuard = crossbeam_epoch::Guard;

    fn page_size(&self) -> usize {
        self.inner.page_size
    }

    fn zalloc_page(&self) -> Option<u64> {
        let ps = self.inner.page_size as u64;
        let mut st = self.inner.state.lock().unwrap();
        let pa = match st.free.pop() {
            Some(pa) => pa,
            None if st.next + ps <= self.inner.base + self.inner.size => {
                st.next += ps;
                st.next - ps
            }
            None => return None,
        };
        drop(st);
        self.zero(pa, 1);
        self.entry_count(pa).store(0, Ordering::Relaxed);
        self.inner.live.fetch_add(1, Ordering::Relaxed);
        Some(pa)
    }

    fn zalloc_pages_exact(&self, n: usize) -> Option<u64> {
        let ps = self.inner.page_size as u64;
        let total = (n as u64).checked_mul(ps)?;
        let mut st = self.inner.state.lock().unwrap();
        let start = st
            .next
            .checked_next_multiple_of(total.next_power_of_two())?;
        if start + total > self.inner.base + self.inner.size {
            return None;
        }
        // Pages skipped for alignment go to the free list.
        let mut a = st.next;
        while a < start {
            st.free.push(a);
            a += ps;
        }
        st.next = start + total;
        drop(st);
        self.zero(start, n);
        self.inner.live.fetch_add(n, Ordering::Relaxed);
        Some(start)
    }

    unsafe fn free_page(&self, pa: u64) {
        self.inner.release(pa);
    }

    unsafe fn free_pages_exact(&self, pa: u64, n: usize) {
        for i in 0..n as u64 {
            self.inner.release(pa + i * self.inner.page_size as u64);
        }
    }

    fn phys_to_virt(&self, pa: u64) -> *mut u64 {
        self.inner
            .ram
            .ptr(pa, self.inner.page_size as u64)
            .expect("table page inside RAM") as *mut u64
    }

    fn entry_count(&self, pa: u64) -> &AtomicU32 {
        let i = ((pa - self.inner.base) / self.inner.page_size as u64) as usize;
        &self.inner.counts[i]
    }

    fn read_guard(&self) -> crossbeam_epoch::Guard {
        crossbeam_epoch::pin()
    }

    fn same_allocator(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    unsafe fn free_pages_deferred(&self, pages: Vec<u64>) {
        if pages.is_empty() {
            return;
        }
        let inner = self.inner.clone();
        let guard = crossbeam_epoch::pin();
        // Runs once every thread pinned before now has unpinned.
        guard.defer(move || {
            for pa in pages {
                inner.release(pa);
            }
        });
    }
}
