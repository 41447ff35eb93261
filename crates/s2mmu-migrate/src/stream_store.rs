//! Copies into memory that is not read again soon (guest memory written
//! on arrival), with stores that bypass the cache where the CPU has them.
//!
//! An ordinary store to a line that is not in the cache first reads the
//! line from memory; a streaming store (x86-64 `MOVNTDQ`) writes it
//! without that read. Guest memory the destination fills is cold and is
//! not read again before the guest runs there, so the read is wasted.
//! Streaming stores are weakly ordered: [`fence_streaming`] orders them
//! before every later store and load, and must run before the bytes are
//! handed to anything else.

/// Copies `src` into `dst` (of the same length): the bytes up to `dst`'s
/// first 16-byte boundary and after its last one with an ordinary copy,
/// the 16-byte aligned middle with streaming stores (x86-64; elsewhere
/// an ordinary copy; under Miri ordinary aligned stores). Whether streaming stores were used
/// (then [`fence_streaming`] is owed before the bytes are used).
///
/// # Panics
/// When the lengths differ (a caller's bug, as for `copy_from_slice`).
pub(crate) fn copy_streaming(dst: &mut [u8], src: &[u8]) -> bool {
    assert_eq!(dst.len(), src.len(), "copy_streaming of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128};
        let head = dst.as_ptr().align_offset(16).min(dst.len());
        let body = (dst.len() - head) / 16 * 16;
        if body == 0 {
            dst.copy_from_slice(src);
            return false;
        }
        let (d_head, d_rest) = dst.split_at_mut(head);
        let (s_head, s_rest) = src.split_at(head);
        d_head.copy_from_slice(s_head);
        let (d_body, d_tail) = d_rest.split_at_mut(body);
        let (s_body, s_tail) = s_rest.split_at(body);
        for (d, s) in d_body.chunks_exact_mut(16).zip(s_body.chunks_exact(16)) {
            // SAFETY: SSE2 is part of every x86-64 CPU; `s` is 16 bytes of
            // `src` (an unaligned load); `d` is 16 bytes of `dst`, 16-byte
            // aligned (`head` brought `dst` to a 16-byte boundary and each
            // chunk is 16 bytes long); both are ordinary borrows. Miri,
            // which cannot run the streaming store, checks the same
            // aligned store made the ordinary way.
            unsafe {
                let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                #[cfg(not(miri))]
                std::arch::x86_64::_mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
                #[cfg(miri)]
                std::arch::x86_64::_mm_store_si128(d.as_mut_ptr().cast::<__m128i>(), v);
            }
        }
        d_tail.copy_from_slice(s_tail);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        dst.copy_from_slice(src);
        false
    }
}

/// Orders the streaming stores of [`copy_streaming`] before every later
/// store and load (they are weakly ordered otherwise). Without streaming
/// stores (other CPUs) there is nothing to order; Miri, which has no
/// SFENCE, skips it.
pub(crate) fn fence_streaming() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: SFENCE only orders stores; SSE is part of every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every start alignment and length around the 16-byte boundaries
    /// gives the bytes of an ordinary copy, and nothing outside `dst`
    /// changes.
    #[test]
    fn copies_exactly_the_bytes_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..600u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..20 {
            for len in [0, 1, 15, 16, 17, 31, 32, 33, 64, 100, 255, 512] {
                let mut dst = vec![0xAAu8; 600];
                copy_streaming(&mut dst[start..start + len], &src[..len]);
                fence_streaming();
                assert_eq!(&dst[start..start + len], &src[..len], "{start}+{len}");
                assert!(dst[..start].iter().all(|&b| b == 0xAA), "{start}+{len}");
                assert!(
                    dst[start + len..].iter().all(|&b| b == 0xAA),
                    "{start}+{len}"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "unequal lengths")]
    fn unequal_lengths_are_refused() {
        copy_streaming(&mut [0u8; 4], &[0u8; 5]);
    }
}
