//! EL2's heap: `linked_list_allocator`'s first-fit heap behind a spin
//! lock, over a region of the carve-out. An EL2 program declares it as its
//! global allocator and gives it its region once, before anything
//! allocates:
//!
//! ```text
//! #[global_allocator]
//! static HEAP: s2mmu_el2::heap::El2Heap = s2mmu_el2::heap::El2Heap::empty();
//! // at boot, stage-1 MMU on:
//! unsafe { s2mmu_el2::heap::init(&HEAP, heap_start, heap_bytes) };
//! ```
//!
//! The engine's memslots, bitmaps, rings and caches live there; its table
//! pages come from a [`crate::PagePool`] beside it.

/// The heap type (a `GlobalAlloc`).
pub type El2Heap = linked_list_allocator::LockedHeap;

/// Gives `heap` the region `[start, start + bytes)`.
///
/// # Safety
/// The region is memory nothing else uses for as long as the heap lives
/// (it lies in the carve-out, which no guest mapping reaches), mapped
/// Normal write-back, and `heap` was empty.
pub unsafe fn init(heap: &El2Heap, start: *mut u8, bytes: usize) {
    // SAFETY: forwarded from this function's contract.
    unsafe { heap.lock().init(start, bytes) };
}

/// Bytes of `heap` in use and free.
pub fn usage(heap: &El2Heap) -> (usize, usize) {
    let h = heap.lock();
    (h.used(), h.free())
}
