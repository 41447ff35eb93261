//! The copy of a guest page into a PAGES batch: word by word (atomic per
//! word, as the guest may be writing it), the zero check folded in, and
//! the next page's lines fetched ahead.

use crate::hash::is_zero;
use crate::vm::GuestRam;
use crate::wire::PAGE_SIZE;
use std::sync::atomic::{AtomicU64, Ordering};

/// Copies the guest page at `off` into `dst` word by word (atomically per
/// word: the guest may be writing it), and says whether it was all zeros.
pub(crate) fn copy_page<R: GuestRam + ?Sized>(ram: &R, off: u64, dst: &mut [u8]) -> bool {
    let host = ram.host_range(off, PAGE_SIZE as u64);
    let Some(host) = host.filter(|h| h.is_multiple_of(8) && dst.len() == PAGE_SIZE) else {
        ram.read_into(off, dst);
        return is_zero(dst);
    };
    // SAFETY: the page lies inside one mapping of guest RAM
    // (`host_range`), which GuestRam's contract keeps alive while `ram`
    // lives; `host` is 8-byte aligned (checked), so every word is; the
    // contract also makes every other access to it atomic per word, as
    // these loads are.
    let words = unsafe { std::slice::from_raw_parts(host as *const AtomicU64, PAGE_SIZE / 8) };
    // The next page's lines are fetched while this one is copied: a round
    // reads pages in address order, and the CPU's stream prefetcher stops
    // at each 4 KiB boundary, so without this every page starts with
    // misses to memory. (Past the mapping's end nothing is fetched.)
    let ahead = off
        .checked_add(PAGE_SIZE as u64)
        .and_then(|next| ram.host_range(next, PAGE_SIZE as u64));
    let mut acc = 0u64;
    for (k, (ws, ds)) in words
        .chunks_exact(8)
        .zip(dst.chunks_exact_mut(64))
        .enumerate()
    {
        if let Some(a) = ahead {
            prefetch(a + 64 * k as u64);
        }
        for (w, d) in ws.iter().zip(ds.chunks_exact_mut(8)) {
            let v = w.load(Ordering::Relaxed);
            acc |= v;
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
    acc == 0
}

/// Asks the CPU to bring the cache line at host address `addr` into the
/// cache (a hint: it reads nothing the program sees, and faults on
/// nothing, so any address will do).
#[inline(always)]
fn prefetch(addr: u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint that neither faults nor changes memory
    // or any register, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::*;
    use s2mmu_vm::{Backing, GuestMemory};

    /// Every page of a mapping, the last one included (where nothing is
    /// fetched ahead), is copied byte for byte, and the zero check says
    /// whether it was all zeros, whichever word of it was not.
    #[test]
    fn copies_every_page_and_finds_zeros() {
        let pages = 5u64;
        let ram = GuestMemory::new(pages * PAGE_SIZE as u64, Backing::Anonymous).expect("mapping");
        let fill: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 + 3) as u8).collect();
        // Page 0 all data, page 1 zeros, pages 2-4 one non-zero word each
        // (the first, one in the middle, the last).
        assert!(ram.write_from(0, &fill));
        for (page, word) in [(2u64, 0u64), (3, 250), (4, 511)] {
            assert!(ram.write_u64(page * PAGE_SIZE as u64 + word * 8, 0x55 << 32));
        }
        let mut dst = vec![0xAAu8; PAGE_SIZE];
        for page in 0..pages {
            let off = page * PAGE_SIZE as u64;
            let zero = copy_page(&ram, off, &mut dst);
            let mut want = vec![0u8; PAGE_SIZE];
            assert!(ram.read_into(off, &mut want));
            assert_eq!(dst, want, "page {page}");
            assert_eq!(zero, page == 1, "page {page}");
        }
    }
}
