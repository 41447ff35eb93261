//! The per-slot digests both sides compare at the switch: the same
//! function on the source's frozen memory and on the destination's.

use crate::hash::{digest_of_iter, page_hash};
use crate::vm::{GuestRam, SessionVm};
use crate::wire::PAGE_SIZE;

/// Per-slot digests of the source's memory as it is now: XXH3 of every
/// page (seeded with its address), then of those hashes in page order, as
/// the destination computes them.
pub fn source_digests<V: SessionVm + ?Sized>(vm: &V) -> Vec<(u16, u64)> {
    let mut buf = vec![0u8; PAGE_SIZE];
    vm.slots()
        .iter()
        .map(|s| {
            let n = s.size / PAGE_SIZE as u64;
            let hashes = (0..n).map(|i| {
                let off = s.mem_offset + i * PAGE_SIZE as u64;
                vm.ram().read_into(off, &mut buf);
                page_hash(&buf, s.gpa + i * PAGE_SIZE as u64)
            });
            (s.id, digest_of_iter(hashes))
        })
        .collect()
}
