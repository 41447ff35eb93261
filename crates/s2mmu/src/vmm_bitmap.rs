//! The engine's dirty log as rust-vmm's `vm_memory::bitmap::Bitmap`
//! (feature `vm-memory`).
//!
//! A rust-vmm VMM's device models write guest memory through
//! `vm_memory::Bytes` on a `GuestMemoryMmap<B>`, and each write calls its
//! region's bitmap `B`. With [`SlotDirtyBitmap`] as `B`, those writes land
//! in the memslot's dirty log ([`Mmu::mark_dirty_by_host`]), so one GET
//! (or a dirty view's) reports the pages the guest wrote through its
//! stage-2 faults and the pages the VMM's virtio queues wrote, and a
//! migration or snapshot sees both.
//!
//! ```
//! use s2mmu::format::arm64::{Arm64Stage2, Granule};
//! use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
//! use s2mmu::mmu::{Mmu, MmuPolicy};
//! use s2mmu::vmm_bitmap::SlotDirtyBitmap;
//! use s2mmu::{Gpa, HostMmOps, Hva, NoTlb};
//! use std::sync::Arc;
//! use vm_memory::mmap::MmapRegionBuilder;
//! use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap, GuestRegionMmap};
//!
//! let mmu = Arc::new(Mmu::new(
//!     Arm64Stage2::new(Granule::K4, 40)?,
//!     HostMmOps::new(4096)?,
//!     Arc::new(NoTlb),
//!     TreeMemslots::new(),
//!     MmuPolicy::default(),
//! )?);
//! // A 1 MiB region of guest memory at 1 GiB, its bitmap the engine's slot 0.
//! let bitmap = SlotDirtyBitmap::new(mmu.clone(), 0, 0);
//! let region = MmapRegionBuilder::new_with_bitmap(1 << 20, bitmap)
//!     .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE) // the builder's default is PROT_NONE
//!     .build()
//!     .unwrap();
//! let hva = region.as_ptr() as u64;
//! let mem = GuestMemoryMmap::from_regions(vec![
//!     GuestRegionMmap::new(region, GuestAddress(1 << 30)).unwrap(),
//! ]).unwrap();
//! let slot = UserMemoryRegion::new(0, SlotFlags::LOG_DIRTY_PAGES, Gpa::new(1 << 30), 1 << 20, Hva::new(hva));
//! mmu.set_memory_region(&slot, 4096)?;
//!
//! mem.write_obj(0xabcd_u32, GuestAddress((1 << 30) + 5 * 4096)).unwrap(); // a device's write
//! let mut log = vec![0u64; 4];
//! mmu.get_dirty_log(0, &mut log)?;
//! assert_eq!(log[0], 1 << 5);
//! # Ok::<(), s2mmu::Error>(())
//! ```

use crate::memslot::MemslotStore;
use crate::mmu::Mmu;
use crate::sync::Platform;
use crate::table::MmOps;
use crate::{PteFormat, Result};
use alloc::sync::Arc;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};
use vm_memory::bitmap::{Bitmap, BitmapSlice, WithBitmapSlice};

/// What [`SlotDirtyBitmap`] needs of an MMU, object-safe so that one bitmap
/// type serves every `Mmu<F, M, S, P>`.
pub trait HostDirtyLog: Send + Sync {
    /// [`Mmu::mark_dirty_by_host`].
    ///
    /// # Errors
    /// As [`Mmu::mark_dirty_by_host`].
    fn mark_dirty_by_host(&self, id: u16, first_page: u64, npages: u64) -> Result<u64>;
    /// [`Mmu::is_marked_dirty`].
    ///
    /// # Errors
    /// As [`Mmu::is_marked_dirty`].
    fn is_marked_dirty(&self, id: u16, page: u64) -> Result<bool>;
    /// log2 of the page size of the MMU's memslots.
    fn page_shift(&self) -> u32;
}

impl<F: PteFormat, M: MmOps, S: MemslotStore, P: Platform> HostDirtyLog for Mmu<F, M, S, P>
where
    Mmu<F, M, S, P>: Send + Sync,
{
    fn mark_dirty_by_host(&self, id: u16, first_page: u64, npages: u64) -> Result<u64> {
        Mmu::mark_dirty_by_host(self, id, first_page, npages)
    }
    fn is_marked_dirty(&self, id: u16, page: u64) -> Result<bool> {
        Mmu::is_marked_dirty(self, id, page)
    }
    fn page_shift(&self) -> u32 {
        self.slot_page_shift()
    }
}

/// A `vm-memory` region's bitmap that is memslot `slot`'s dirty log in an
/// MMU, starting `offset` bytes into the slot (0 when the region is the
/// slot). Give one to `MmapRegionBuilder::new_with_bitmap` for each region
/// the VMM registers as a memslot.
///
/// `Bitmap::mark_dirty` cannot fail, so a mark the MMU refuses (the slot
/// was deleted, or is shorter than the region) is counted instead:
/// [`SlotDirtyBitmap::refused_marks`], shared by the bitmap and its slices,
/// is the number of such writes, and a VMM that migrates checks it is 0.
/// The default bitmap belongs to no MMU and marks nothing.
#[derive(Clone, Default)]
pub struct SlotDirtyBitmap {
    log: Option<Arc<dyn HostDirtyLog>>,
    slot: u16,
    offset: u64,
    refused: Arc<AtomicU64>,
}

impl SlotDirtyBitmap {
    /// The bitmap of memslot `slot` of `log`, `offset` bytes into the slot.
    /// The slot need not exist yet (a VMM maps the region before it
    /// registers the slot); marks made while it does not are refused.
    pub fn new(log: Arc<dyn HostDirtyLog>, slot: u16, offset: u64) -> Self {
        SlotDirtyBitmap {
            log: Some(log),
            slot,
            offset,
            refused: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The memslot this bitmap marks.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// Byte offset in the slot of this bitmap's offset 0.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Writes whose marks the MMU refused (see the type's docs), over this
    /// bitmap and every slice of it.
    pub fn refused_marks(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The pages `[first, first + n)` of the slot that bytes `[offset,
    /// offset + len)` of this bitmap cover, or `None` if `len` is 0 or the
    /// sum overflows.
    fn pages(&self, shift: u32, offset: usize, len: usize) -> Option<(u64, u64)> {
        let start = self.offset.checked_add(u64::try_from(offset).ok()?)?;
        let last = start.checked_add(u64::try_from(len).ok()?.checked_sub(1)?)?;
        Some((start >> shift, (last >> shift) - (start >> shift) + 1))
    }
}

impl fmt::Debug for SlotDirtyBitmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotDirtyBitmap")
            .field("attached", &self.log.is_some())
            .field("slot", &self.slot)
            .field("offset", &self.offset)
            .field("refused", &self.refused_marks())
            .finish()
    }
}

impl WithBitmapSlice<'_> for SlotDirtyBitmap {
    type S = Self;
}

impl BitmapSlice for SlotDirtyBitmap {}

impl Bitmap for SlotDirtyBitmap {
    fn mark_dirty(&self, offset: usize, len: usize) {
        let Some(log) = &self.log else { return };
        if len == 0 {
            return;
        }
        let marked = self
            .pages(log.page_shift(), offset, len)
            .map(|(first, n)| log.mark_dirty_by_host(self.slot, first, n));
        if !matches!(marked, Some(Ok(_))) {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn dirty_at(&self, offset: usize) -> bool {
        let Some(log) = &self.log else { return false };
        self.pages(log.page_shift(), offset, 1)
            .is_some_and(|(page, _)| log.is_marked_dirty(self.slot, page) == Ok(true))
    }

    fn slice_at(&self, offset: usize) -> Self {
        let mut s = self.clone();
        // An offset past u64 cannot address the slot: the slice's marks
        // are then refused (counted) as any other beyond it.
        s.offset = u64::try_from(offset)
            .ok()
            .and_then(|o| self.offset.checked_add(o))
            .unwrap_or(u64::MAX);
        s
    }
}
