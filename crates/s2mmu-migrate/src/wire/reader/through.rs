//! The destination's checked read of a PAGES record's data over a
//! connection that does not authenticate it: through a buffer in the
//! cache, each page hashed there before it is copied into place.

use super::{MigrateError, WireReader, PAGE_SIZE};
use crate::hash::page_hash;
use crate::stages::{RecvStages, StageObserver};
use std::io::{IoSliceMut, Read};

impl<R: Read> WireReader<R> {
    /// The data of the record's pages read through `buf` (the reader's own
    /// buffer, reused): each read brings what the socket holds of them,
    /// each page it completes is hashed there, while the read's copy is
    /// still in the cache, and only a page whose hash matches is copied
    /// into its place, with streaming stores. Reading straight into guest
    /// memory and hashing the pages there read each page back from
    /// memory; the same copy with ordinary stores cost more than that
    /// (each cold line of guest memory is read before it is written).
    /// `obs` is told where each read begins and ends.
    pub(super) fn read_through(
        &mut self,
        buf: &mut [u8],
        pages: &mut [&mut [u8]],
        at_byte: u64,
        obs: &mut impl StageObserver<RecvStages>,
    ) -> Result<(), MigrateError> {
        let total = pages.len() * PAGE_SIZE;
        // The next entry to look at for a data page's hash.
        let mut want = 0usize;
        // Bytes read, and pages of them checked and copied into place.
        let (mut got, mut done) = (0usize, 0usize);
        while done < pages.len() {
            got += self.read_page_data(&mut [IoSliceMut::new(&mut buf[got..total])], obs)?;
            let complete = got / PAGE_SIZE;
            for (k, page) in pages.iter_mut().enumerate().take(complete).skip(done) {
                while self.entries[want].zero {
                    want += 1;
                }
                let e = self.entries[want];
                want += 1;
                let data = &buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
                if page_hash(data, e.gpa) != e.hash {
                    fence_streaming();
                    return Err(MigrateError::PageChecksum {
                        gpa: e.gpa,
                        at_byte,
                    });
                }
                copy_streaming(page, data);
            }
            fence_streaming();
            done = complete;
        }
        Ok(())
    }
}

/// Copies `src` into `dst` (of the same length) with stores that bypass
/// the cache where the CPU has them and `dst` allows (x86-64, 16-byte
/// aligned, a multiple of 64 bytes): guest memory written on arrival is
/// not read again before the guest runs, and ordinary stores would first
/// read each of its cold lines from memory. Elsewhere a plain copy.
/// [`fence_streaming`] orders these stores before later ones.
fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if dst.len() == src.len()
        && dst.len().is_multiple_of(64)
        && (dst.as_ptr() as usize).is_multiple_of(16)
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        for (d, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
            // SAFETY: SSE2 is part of every x86-64 CPU; `s` is 16 bytes
            // (an unaligned load), `d` is 16 bytes of `dst`, 16-byte
            // aligned as `dst` is (checked) and each chunk is 16 bytes;
            // both are ordinary exclusive or shared borrows.
            unsafe {
                let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
            }
        }
        return;
    }
    dst.copy_from_slice(src);
}

/// Orders the streaming stores of [`copy_streaming`] before every later
/// store and load (they are weakly ordered otherwise). Miri, which runs
/// them as ordinary stores and has no SFENCE, skips it.
fn fence_streaming() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: SFENCE only orders stores; SSE is part of every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}
