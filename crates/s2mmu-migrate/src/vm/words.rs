//! `GuestRam`'s default copies: 8-byte words, atomically, through the
//! host spans the implementation names (`span`: its `host_span`), across
//! regions where a copy spans two. A leaf: the trait passes itself in as
//! `size` and `span`.

use std::sync::atomic::{AtomicU64, Ordering};

/// The host spans covering `len` bytes from RAM offset `offset`, as
/// (host address, bytes) pieces, or `None` when they are not all inside
/// guest RAM or not word-aligned.
fn pieces(
    size: u64,
    span: impl Fn(u64) -> Option<(u64, u64)>,
    offset: u64,
    len: usize,
) -> Option<Vec<(u64, usize)>> {
    let len = len as u64;
    if !offset.is_multiple_of(8) || !len.is_multiple_of(8) || offset.checked_add(len)? > size {
        return None;
    }
    let mut out = Vec::new();
    let mut done = 0u64;
    while done < len {
        let (host, n) = span(offset + done)?;
        if n == 0 || !host.is_multiple_of(8) || !n.is_multiple_of(8) {
            return None; // outside GuestRam's contract: copy nothing
        }
        let take = n.min(len - done);
        out.push((host, take as usize));
        done += take;
    }
    Some(out)
}

/// The words of one piece.
///
/// # Safety
/// `(host, bytes)` is a piece [`pieces`] returned for the `host_span` of
/// a `GuestRam` that lives as long as the slice.
unsafe fn words<'a>(host: u64, bytes: usize) -> &'a [AtomicU64] {
    // SAFETY: GuestRam's contract on `host_span`: `bytes` bytes from
    // `host` are mapped for as long as the RAM lives, 8-byte aligned (checked in `pieces`),
    // and every other access to them is atomic per word.
    unsafe { std::slice::from_raw_parts(host as *const AtomicU64, bytes / 8) }
}

/// Calls `each` with the words of the `len` bytes from RAM offset
/// `offset`, in order; `false` (nothing visited) where [`pieces`] refuses
/// the range.
fn each_word(
    size: u64,
    span: impl Fn(u64) -> Option<(u64, u64)>,
    offset: u64,
    len: usize,
    mut each: impl FnMut(&AtomicU64),
) -> bool {
    let Some(pieces) = pieces(size, span, offset, len) else {
        return false;
    };
    for (host, bytes) in pieces {
        // SAFETY: a piece of the caller's GuestRam (borrowed by `span`
        // for this call), used for this loop only.
        unsafe { words(host, bytes) }.iter().for_each(&mut each);
    }
    true
}

/// `GuestRam::read_into`'s default, over a `GuestRam`'s `size` and
/// `host_span` (`span`).
pub(super) fn read(
    size: u64,
    span: impl Fn(u64) -> Option<(u64, u64)>,
    offset: u64,
    out: &mut [u8],
) -> bool {
    let len = out.len();
    let mut chunks = out.chunks_exact_mut(8);
    each_word(size, span, offset, len, |w| {
        if let Some(c) = chunks.next() {
            c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
    })
}

/// `GuestRam::write_from`'s default, as [`read`].
pub(super) fn write(
    size: u64,
    span: impl Fn(u64) -> Option<(u64, u64)>,
    offset: u64,
    data: &[u8],
) -> bool {
    let mut chunks = data.chunks_exact(8);
    each_word(size, span, offset, data.len(), |w| {
        if let Some(c) = chunks.next() {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
    })
}
