//! A ticket lock: FIFO among waiters, unlike the engine's test-and-set.
//! Copied from `crates/s2mmu-nostd-check`: only `core` and `lock_api`.

use core::sync::atomic::{AtomicU32, Ordering};

/// A FIFO spin lock: a waiter takes the next ticket and spins until it is
/// served.
pub struct RawTicketLock {
    next: AtomicU32,
    serving: AtomicU32,
    /// Times the lock was taken (every `lock` and successful `try_lock`).
    taken: AtomicU32,
}

static TAKEN_TOTAL: AtomicU32 = AtomicU32::new(0);

impl RawTicketLock {
    /// Ticket locks taken so far in the process: the example checks that
    /// the facade ran on them.
    pub fn taken_total() -> u32 {
        TAKEN_TOTAL.load(Ordering::Relaxed)
    }

    fn count(&self) {
        self.taken.fetch_add(1, Ordering::Relaxed);
        TAKEN_TOTAL.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: a thread holds the lock from when `serving` reaches its ticket
// (acquire) until it advances `serving` in `unlock` (release); tickets are
// unique (fetch_add), so one thread at a time holds it, and `unlock` is only
// called by the holder per the trait's contract.
unsafe impl lock_api::RawMutex for RawTicketLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawTicketLock {
        next: AtomicU32::new(0),
        serving: AtomicU32::new(0),
        taken: AtomicU32::new(0),
    };
    type GuardMarker = lock_api::GuardSend;

    fn lock(&self) {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        while self.serving.load(Ordering::Acquire) != ticket {
            core::hint::spin_loop();
        }
        self.count();
    }

    fn try_lock(&self) -> bool {
        // Acquire: pairs with the release of the last holder's unlock.
        let serving = self.serving.load(Ordering::Acquire);
        let ok = self
            .next
            .compare_exchange(
                serving,
                serving.wrapping_add(1),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok();
        if ok {
            self.count();
        }
        ok
    }

    unsafe fn unlock(&self) {
        let s = self.serving.load(Ordering::Relaxed);
        self.serving.store(s.wrapping_add(1), Ordering::Release);
    }
}
