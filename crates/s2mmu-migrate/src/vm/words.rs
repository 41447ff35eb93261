//! [`GuestRam`]'s default copies: 8-byte words, atomically, through the
//! host spans the implementation names, across regions where a copy
//! spans two.

use super::GuestRam;
use std::sync::atomic::{AtomicU64, Ordering};

/// The host spans covering `len` bytes from RAM offset `offset`, as
/// (host address, bytes) pieces, or `None` when they are not all inside
/// guest RAM or not word-aligned.
fn pieces<R: GuestRam + ?Sized>(ram: &R, offset: u64, len: usize) -> Option<Vec<(u64, usize)>> {
    let len = len as u64;
    if !offset.is_multiple_of(8) || !len.is_multiple_of(8) || offset.checked_add(len)? > ram.size()
    {
        return None;
    }
    let mut out = Vec::new();
    let mut done = 0u64;
    while done < len {
        let (host, n) = ram.host_span(offset + done)?;
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
/// `(host, bytes)` is a piece [`pieces`] returned for a `ram` that lives
/// as long as the slice.
unsafe fn words<'a>(host: u64, bytes: usize) -> &'a [AtomicU64] {
    // SAFETY: GuestRam's contract: `bytes` bytes from `host` are mapped
    // for as long as the RAM lives, 8-byte aligned (checked in `pieces`),
    // and every other access to them is atomic per word.
    unsafe { std::slice::from_raw_parts(host as *const AtomicU64, bytes / 8) }
}

/// [`GuestRam::read_into`]'s default.
pub(super) fn read<R: GuestRam + ?Sized>(ram: &R, offset: u64, out: &mut [u8]) -> bool {
    let Some(pieces) = pieces(ram, offset, out.len()) else {
        return false;
    };
    let mut chunks = out.chunks_exact_mut(8);
    for (host, bytes) in pieces {
        // SAFETY: a piece of `ram`, borrowed for this loop only.
        for w in unsafe { words(host, bytes) } {
            if let Some(c) = chunks.next() {
                c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
            }
        }
    }
    true
}

/// [`GuestRam::write_from`]'s default.
pub(super) fn write<R: GuestRam + ?Sized>(ram: &R, offset: u64, data: &[u8]) -> bool {
    let Some(pieces) = pieces(ram, offset, data.len()) else {
        return false;
    };
    let mut chunks = data.chunks_exact(8);
    for (host, bytes) in pieces {
        // SAFETY: a piece of `ram`, borrowed for this loop only.
        for w in unsafe { words(host, bytes) } {
            if let Some(c) = chunks.next() {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                w.store(u64::from_le_bytes(b), Ordering::Relaxed);
            }
        }
    }
    true
}
