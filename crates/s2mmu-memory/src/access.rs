//! Guest memory read and written word by word, atomically, as vCPUs, a
//! migration thread and the host may touch the same words at once.

use crate::{GuestMemory, MemoryError};
use std::sync::atomic::{AtomicU64, Ordering};

// The word accessors are `#[inline]`: callers in other crates (a guest's
// accesses in memslot-perf, a migration's page copies) call them per word.
impl GuestMemory {
    /// Whether `[offset, offset + len)` lies inside guest memory.
    #[inline]
    fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    /// The word at byte `offset` (8-byte aligned, inside the memory).
    #[inline]
    fn word(&self, offset: u64) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || !self.contains(offset, 8) {
            return None;
        }
        // SAFETY: aligned and in bounds of the mapping, which lives as long
        // as `&self`; guest memory is only ever accessed through atomics
        // (this type's methods, and the `unsafe` users of `as_ptr`).
        Some(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset as usize).cast()) })
    }

    /// Reads the 8-byte word at `offset` (None if misaligned or outside).
    #[inline]
    pub fn read_u64(&self, offset: u64) -> Option<u64> {
        self.word(offset).map(|w| w.load(Ordering::Relaxed))
    }

    /// Writes the 8-byte word at `offset`; returns false if misaligned or
    /// outside.
    #[inline]
    pub fn write_u64(&self, offset: u64, value: u64) -> bool {
        self.word(offset)
            .map(|w| w.store(value, Ordering::Relaxed))
            .is_some()
    }

    /// Copies `out.len()` bytes from `offset` (word by word, atomically per
    /// word, as a migration reads memory the guest may be writing).
    /// Returns false, copying nothing, if the offset or length is not a
    /// multiple of 8 or the range is outside.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        if !offset.is_multiple_of(8)
            || !out.len().is_multiple_of(8)
            || !self.contains(offset, out.len() as u64)
        {
            return false;
        }
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            let v = self.read_u64(offset + 8 * i as u64).unwrap_or(0);
            chunk.copy_from_slice(&v.to_le_bytes());
        }
        true
    }

    /// Writes `data` at `offset` word by word. Returns false, writing
    /// nothing, if the offset or length is not a multiple of 8 or the range
    /// is outside.
    pub fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        if !offset.is_multiple_of(8)
            || !data.len().is_multiple_of(8)
            || !self.contains(offset, data.len() as u64)
        {
            return false;
        }
        for (i, chunk) in data.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
            self.write_u64(offset + 8 * i as u64, v);
        }
        true
    }

    /// Copies `data` to `offset`, any alignment (code and tables a harness
    /// loads). The bytes of a partly covered word are merged into it with
    /// a compare-and-swap, so the word's other bytes, which a vCPU may be
    /// writing, are kept.
    ///
    /// # Errors
    /// [`MemoryError::OutOfRange`] when the range is not inside guest
    /// memory; nothing is written then.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<(), MemoryError> {
        let len = data.len() as u64;
        if !self.contains(offset, len) {
            return Err(MemoryError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        }
        let (mut at, mut rest) = (offset, data);
        while !rest.is_empty() {
            // Inside guest memory (checked above), so the word exists.
            let Some(word) = self.word(at - at % 8) else {
                break;
            };
            let skip = (at % 8) as usize;
            let take = rest.len().min(8 - skip);
            merge_bytes(word, skip, &rest[..take]);
            (at, rest) = (at + take as u64, &rest[take..]);
        }
        Ok(())
    }
}

/// Stores `bytes` into `word` from byte `skip` on (little-endian order),
/// keeping the word's other bytes.
fn merge_bytes(word: &AtomicU64, skip: usize, bytes: &[u8]) {
    if skip == 0 && bytes.len() == 8 {
        let v = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
        word.store(v, Ordering::Relaxed);
        return;
    }
    let mut new = [0u8; 8];
    new[skip..skip + bytes.len()].copy_from_slice(bytes);
    let mut mask = [0u8; 8];
    mask[skip..skip + bytes.len()].fill(0xff);
    let (new, mask) = (u64::from_le_bytes(new), u64::from_le_bytes(mask));
    // fetch_update retries until no other writer came in between.
    let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        Some(old & !mask | new)
    });
}
