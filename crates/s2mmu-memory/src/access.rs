//! Guest memory read and written word by word, atomically, as vCPUs, a
//! migration thread and the host may touch the same words at once.

use crate::{GuestMemory, MemoryError};
use std::sync::atomic::{AtomicU64, Ordering};

/// 8-byte words in a 4 KiB page.
pub const PAGE_WORDS: usize = 512;

// The word accessors are `#[inline]`: callers in other crates (a guest's
// accesses in memslot-perf, a migration's page copies) call them per word.
impl GuestMemory {
    /// Whether `[offset, offset + len)` lies inside guest memory.
    #[inline]
    fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size)
    }

    /// The whole of guest memory as atomic words, word `i` at byte `8 * i`.
    ///
    /// The bounds are established once here (the mapping is 4 KiB-aligned,
    /// its size a multiple of 4 KiB and at most `isize::MAX`), so a loop
    /// over the slice, or an index checked by the slice, reaches only
    /// guest memory without a range check per access of its own.
    #[inline]
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: `ptr` is the start of a live mapping of `size` bytes
        // (a multiple of 4 KiB, checked by `new` against `isize::MAX`),
        // page-aligned and so aligned for `AtomicU64`, zero-filled or
        // written, so initialised; it stays mapped as long as `&self`.
        // Guest memory is only ever accessed atomically (this type's
        // methods, and the `unsafe` users of `as_ptr`, KVM included, whose
        // stores are single instructions), so shared `AtomicU64`s over it
        // race with nothing non-atomic. A discard (`MADV_DONTNEED`) zeroes
        // pages, which readers observe as another writer's stores.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.as_ptr().cast::<AtomicU64>(),
                (self.size / 8) as usize,
            )
        }
    }

    /// Guest memory as 4 KiB pages of [`PAGE_WORDS`] atomic words: page
    /// `p` at byte `4096 * p`. As [`GuestMemory::words`], bounds checked
    /// once; a word index below [`PAGE_WORDS`] needs no check at all.
    #[inline]
    pub fn pages(&self) -> &[[AtomicU64; PAGE_WORDS]] {
        let words = self.words();
        // SAFETY: the words are a whole number of 4 KiB pages (the size is
        // a multiple of 4 KiB for every backing), so `len / PAGE_WORDS`
        // arrays cover exactly the same memory; `[AtomicU64; N]` has the
        // layout of N consecutive `AtomicU64`s, with the same alignment.
        unsafe {
            std::slice::from_raw_parts(
                words.as_ptr().cast::<[AtomicU64; PAGE_WORDS]>(),
                words.len() / PAGE_WORDS,
            )
        }
    }

    /// The word at byte `offset` (8-byte aligned, inside the memory).
    #[inline]
    fn word(&self, offset: u64) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) {
            return None;
        }
        let index = usize::try_from(offset / 8).ok()?;
        self.words().get(index)
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

    /// The words of the `len` bytes at `offset`, or `None` if the offset or
    /// length is not a multiple of 8 or the range is outside: in bounds, so
    /// one slice and no check per word.
    #[inline]
    fn aligned_words(&self, offset: u64, len: usize) -> Option<&[AtomicU64]> {
        if !offset.is_multiple_of(8) || !len.is_multiple_of(8) || !self.contains(offset, len as u64)
        {
            return None;
        }
        let first = (offset / 8) as usize;
        Some(&self.words()[first..first + len / 8])
    }

    /// Copies `out.len()` bytes from `offset` (word by word, atomically per
    /// word, as a migration reads memory the guest may be writing).
    /// Returns false, copying nothing, if the offset or length is not a
    /// multiple of 8 or the range is outside.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> bool {
        let Some(words) = self.aligned_words(offset, out.len()) else {
            return false;
        };
        for (word, chunk) in words.iter().zip(out.chunks_exact_mut(8)) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        true
    }

    /// Writes `data` at `offset` word by word. Returns false, writing
    /// nothing, if the offset or length is not a multiple of 8 or the range
    /// is outside.
    pub fn write_from(&self, offset: u64, data: &[u8]) -> bool {
        let Some(words) = self.aligned_words(offset, data.len()) else {
            return false;
        };
        for (word, chunk) in words.iter().zip(data.chunks_exact(8)) {
            let v = u64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
            word.store(v, Ordering::Relaxed);
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
