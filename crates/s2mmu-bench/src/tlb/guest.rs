//! What runs beside `tlb-perf`'s clears on the simulated VM: the vCPU
//! threads' random-write workload and what they publish, and the reserved,
//! never-touched host range behind the big slot.

use super::PAGE;
use crate::human_bytes;
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{KnownFormat, Vcpu};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Guest writes between a vCPU's idle periods.
const BURST: u64 = 1024;

/// Host address space reserved without memory behind it: the big slot's
/// host addresses, which nothing ever touches.
pub struct Reservation {
    pub addr: usize,
    len: usize,
}

impl Reservation {
    pub fn new(len: u64) -> Result<Self, String> {
        let len = usize::try_from(len).map_err(|_| "slot too large for this host".to_string())?;
        // SAFETY: a fresh anonymous mapping at an address the kernel picks;
        // PROT_NONE and MAP_NORESERVE: no memory is committed and no
        // existing mapping is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "cannot reserve {} of address space: {}",
                human_bytes(len as u64),
                std::io::Error::last_os_error()
            ));
        }
        Ok(Reservation {
            addr: p as usize,
            len,
        })
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `new` created, unmapped once; the
        // stage-2 table that recorded its addresses never dereferences them.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// What one vCPU thread publishes.
#[derive(Default)]
#[repr(align(128))]
pub struct Live {
    pub accesses: AtomicU64,
    pub misses: AtomicU64,
    pub removed: AtomicU64,
}

#[derive(Clone, Copy, Default)]
pub struct LiveSum {
    pub accesses: u64,
    pub misses: u64,
    pub removed: u64,
}

pub fn sum_live(live: &[Live]) -> LiveSum {
    let mut s = LiveSum::default();
    for l in live {
        s.accesses += l.accesses.load(Ordering::Relaxed);
        s.misses += l.misses.load(Ordering::Relaxed);
        s.removed += l.removed.load(Ordering::Relaxed);
    }
    s
}

/// A vCPU writing random words of its region until `stop`, staying in
/// guest mode (so every invalidation waits for it).
pub fn vcpu_loop<F: KnownFormat>(
    mut v: Vcpu<TreeMemslots, F>,
    idx: usize,
    base: u64,
    pages: u64,
    idle: Duration,
    live: &Live,
    stop: &AtomicBool,
) -> Result<(), String> {
    let shared = v.tlb().shared().clone();
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ ((idx as u64 + 1) * 0x1000_0001);
    let mut n = 0u64;
    let mut applied = shared.flushes_applied.load(Ordering::Relaxed);
    while !stop.load(Ordering::Relaxed) {
        // Like a CPU returning from the invalidation interrupt: once this
        // vCPU applied a flush, give the core back, so a flusher that shares
        // it (more threads than cores) waits for the acknowledgement and not
        // for the rest of a scheduler time slice.
        let a = shared.flushes_applied.load(Ordering::Relaxed);
        if a != applied {
            applied = a;
            std::thread::yield_now();
        }
        if !idle.is_zero() && n.is_multiple_of(BURST) {
            v.exit();
            std::thread::sleep(idle);
        }
        for _ in 0..64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let gpa = base + (x % pages) * PAGE;
            v.write_u64(gpa, n)
                .map_err(|e| format!("vCPU {idx}: {e}"))?;
            n += 1;
        }
        live.accesses.store(v.accesses, Ordering::Relaxed);
        live.misses.store(v.tlb().stats().misses, Ordering::Relaxed);
        live.removed.store(
            shared.entries_removed.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
    v.exit();
    Ok(())
}
