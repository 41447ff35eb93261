//! Synchronisation primitives of the lockless protocols, from `std` or,
//! under `--cfg loom`, from loom so the model checker can explore every
//! interleaving of them.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

/// One step of a wait loop: spin briefly, then give the CPU away. Under
/// loom every step yields, as its scheduler requires of spin loops.
#[inline]
pub(crate) fn wait_step(spins: u32) {
    #[cfg(loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// Locks a mutex; a poisoned lock is still used (its data are plain
/// queues that a panic cannot leave half-updated).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
