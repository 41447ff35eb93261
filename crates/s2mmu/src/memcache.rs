//! Pre-allocated table pages (KVM's `kvm_mmu_memory_cache`).
//!
//! Allocation may sleep or fail, so operations that run under the MMU lock
//! never allocate: the caller tops the cache up before taking the lock, and
//! the operation takes pages from it.

use crate::table::MmOps;
use crate::{Error, Result};
use alloc::vec::Vec;

/// A stack of zeroed table pages owned by one user (a vCPU, the split driver).
/// Pages left in it are given back when it is dropped.
pub struct PageCache<M: MmOps> {
    mm: M,
    pages: Vec<u64>,
}

impl<M: MmOps> PageCache<M> {
    /// An empty cache drawing from `mm`.
    pub fn new(mm: M) -> Self {
        PageCache {
            mm,
            pages: Vec::new(),
        }
    }

    /// Fills the cache until it holds at least `min` pages.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] if the list of `min` pages cannot be
    /// allocated (nothing is taken then: an absurd `min` fails at once), or
    /// if the allocator runs dry; the pages obtained so far stay in the
    /// cache then.
    pub fn top_up(&mut self, min: usize) -> Result<()> {
        self.pages
            .try_reserve(min.saturating_sub(self.pages.len()))
            .map_err(|_| Error::OutOfMemory)?;
        while self.pages.len() < min {
            let pa = self.mm.zalloc_page().ok_or(Error::OutOfMemory)?;
            self.pages.push(pa);
        }
        Ok(())
    }

    /// Number of pages held.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Checks that this cache's pages come from the allocator `mm`, the
    /// table's: a table must never link (and later free) another pool's pages.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when they do not.
    pub(crate) fn check_allocator(&self, mm: &M) -> Result<()> {
        if self.mm.same_allocator(mm) {
            Ok(())
        } else {
            Err(Error::InvalidConfig {
                what: "page cache drawing from another allocator than the table's",
                value: 0,
            })
        }
    }

    /// Takes one page.
    pub(crate) fn pop(&mut self) -> Option<u64> {
        self.pages.pop()
    }

    /// Returns an unused page taken with [`PageCache::pop`].
    pub(crate) fn push(&mut self, pa: u64) {
        self.pages.push(pa);
    }

    /// Gives every held page back to the allocator.
    pub fn release_all(&mut self) {
        for pa in self.pages.drain(..) {
            // SAFETY: cached pages were never linked into a table, so no
            // reader can reach them.
            unsafe { self.mm.free_page(pa) };
        }
    }
}

impl<M: MmOps> Drop for PageCache<M> {
    fn drop(&mut self) {
        self.release_all();
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::table::HostMmOps;

    #[test]
    fn top_up_and_release() {
        let mm = HostMmOps::new(4096).unwrap();
        let mut c = PageCache::new(mm.clone());
        c.top_up(5).unwrap();
        assert_eq!(c.len(), 5);
        c.top_up(3).unwrap();
        assert_eq!(c.len(), 5, "top_up never shrinks");
        let p = c.pop().unwrap();
        assert_eq!(c.len(), 4);
        c.push(p);
        assert_eq!(mm.stats().live_pages, 5);
        drop(c);
        assert_eq!(
            mm.stats().live_pages,
            0,
            "dropping the cache frees its pages"
        );
    }

    #[test]
    fn tables_refuse_a_cache_of_another_allocator() {
        use crate::format::arm64::{Arm64Stage2, Granule};
        use crate::{MapOptions, NoTlb, PageTable, Prot, SplitPolicy};
        use alloc::sync::Arc;

        let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
        let mut pt = PageTable::new(fmt, HostMmOps::new(4096).unwrap(), Arc::new(NoTlb)).unwrap();
        let other = HostMmOps::new(4096).unwrap();
        let mut foreign = PageCache::new(other.clone());
        foreign.top_up(8).unwrap();
        let opts = MapOptions::default();
        // Before the check, the map linked `other`'s pages into `pt`; dropping
        // `other` and the cache then freed memory the table still used.
        let r = pt.map(1 << 30, 4096, 0x8000_0000, Prot::RW, &mut foreign, opts);
        assert!(matches!(r, Err(Error::InvalidConfig { .. })));
        let r = pt.map_shared(1 << 30, 4096, 0x8000_0000, Prot::RW, &mut foreign, opts);
        assert!(matches!(r, Err(Error::InvalidConfig { .. })));
        let r = pt.split(1 << 30, 2 << 20, &mut foreign, SplitPolicy::SkipReturns);
        assert!(matches!(r, Err(Error::InvalidConfig { .. })));
        assert_eq!(foreign.len(), 8, "no page was taken");
        assert_eq!(pt.table_pages(), 0);

        let mut own = PageCache::new(pt.mm().clone());
        own.top_up(8).unwrap();
        pt.map(1 << 30, 4096, 0x8000_0000, Prot::RW, &mut own, opts)
            .unwrap();
        pt.split(1 << 30, 2 << 20, &mut own, SplitPolicy::SkipReturns)
            .unwrap();
    }
}
