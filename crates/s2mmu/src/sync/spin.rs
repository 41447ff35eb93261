//! A platform that needs nothing but atomics: spin locks, no clock, and
//! lock-protected `Arc` cells. The default without `std`; its parts serve an
//! embedder's own [`Platform`] too ([`LockedPlatform`] over its own raw
//! locks and clock, or a [`LockedArcCell`] over its own raw mutex).

use alloc::sync::Arc;
use core::convert::Infallible;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{ArcCell, ArcOptionCell, Clock, Platform};

/// A platform of raw mutex `M`, raw reader-writer lock `R` and clock `C`,
/// whose snapshot cells are locked by `M`, with a pause hint while
/// spinning: what a no_std hypervisor with its own locks and counter
/// needs. A marker type, as [`Platform`] says: it has no values.
pub struct LockedPlatform<M, R, C>(Infallible, Names<M, R, C>);

/// The types a [`LockedPlatform`] names, held as a function's result so
/// that the marker is `Send` and `Sync` whatever they are.
type Names<M, R, C> = PhantomData<fn() -> (M, R, C)>;

impl<M, R, C> Platform for LockedPlatform<M, R, C>
where
    M: lock_api::RawMutex + Send + Sync + 'static,
    R: lock_api::RawRwLock + Send + Sync + 'static,
    C: Clock + 'static,
{
    type RawMutex = M;
    type RawRwLock = R;
    type Clock = C;
    type Cell<T: Send + Sync + 'static> = LockedArcCell<M, T>;
    type OptionCell<T: Send + Sync + 'static> = LockedArcOptionCell<M, T>;

    #[inline]
    fn relax() {
        core::hint::spin_loop();
    }
}

// By hand: derives would ask the same of `M`, `R` and `C`.
impl<M, R, C> Clone for LockedPlatform<M, R, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M, R, C> Copy for LockedPlatform<M, R, C> {}

impl<M, R, C> core::fmt::Debug for LockedPlatform<M, R, C> {
    fn fmt(&self, _: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.0 {}
    }
}

/// Spin locks, no clock, lock-protected cells, a pause hint while spinning.
pub type SpinPlatform = LockedPlatform<RawSpinMutex, RawSpinRwLock, NoClock>;

/// No clock: every duration is reported as 0.
#[derive(Debug, Clone, Copy)]
pub enum NoClock {}

impl Clock for NoClock {
    #[inline]
    fn now_ns() -> Option<u64> {
        None
    }
}

/// A test-and-test-and-set spin lock.
pub struct RawSpinMutex(AtomicBool);

// SAFETY: `lock` returns only after swapping the flag from false to true
// (acquire), which one thread at a time can do, and `unlock` (only called
// by the holder, per the trait's contract) stores false with release: the
// lock is exclusive and orders the critical sections.
unsafe impl lock_api::RawMutex for RawSpinMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawSpinMutex(AtomicBool::new(false));
    type GuardMarker = lock_api::GuardSend;

    fn lock(&self) {
        while !self.try_lock() {
            while self.0.load(Ordering::Relaxed) {
                core::hint::spin_loop();
            }
        }
    }

    fn try_lock(&self) -> bool {
        !self.0.swap(true, Ordering::Acquire)
    }

    unsafe fn unlock(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// A spinning reader-writer lock that lets a waiting writer in before new
/// readers (so a stream of readers cannot starve it).
pub struct RawSpinRwLock(AtomicUsize);

/// A writer holds the lock.
const WRITER: usize = 1;
/// A writer waits: new readers hold back.
const WRITER_WAITING: usize = 2;
/// One reader (the count lives above the two flags).
const READER: usize = 4;

// SAFETY: a reader enters only by a compare-and-swap from a state with
// neither writer flag and leaves by subtracting its `READER`; a writer enters
// only by a compare-and-swap from a state with no writer and no reader, to
// `WRITER`, and leaves by clearing it. So a writer excludes everyone, and
// the acquire on entry and release on exit order the critical sections.
unsafe impl lock_api::RawRwLock for RawSpinRwLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = RawSpinRwLock(AtomicUsize::new(0));
    type GuardMarker = lock_api::GuardSend;

    fn lock_shared(&self) {
        while !self.try_lock_shared() {
            core::hint::spin_loop();
        }
    }

    fn try_lock_shared(&self) -> bool {
        let s = self.0.load(Ordering::Relaxed);
        s & (WRITER | WRITER_WAITING) == 0
            && s.checked_add(READER).is_some_and(|n| {
                self.0
                    .compare_exchange_weak(s, n, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            })
    }

    unsafe fn unlock_shared(&self) {
        self.0.fetch_sub(READER, Ordering::Release);
    }

    fn lock_exclusive(&self) {
        loop {
            let s = self.0.load(Ordering::Relaxed);
            if s & WRITER == 0 && s < READER {
                if self
                    .0
                    .compare_exchange_weak(s, WRITER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            } else if s & WRITER_WAITING == 0 {
                self.0.fetch_or(WRITER_WAITING, Ordering::Relaxed);
            }
            core::hint::spin_loop();
        }
    }

    fn try_lock_exclusive(&self) -> bool {
        let s = self.0.load(Ordering::Relaxed);
        s & WRITER == 0
            && s < READER
            && self
                .0
                .compare_exchange(s, WRITER, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    unsafe fn unlock_exclusive(&self) {
        self.0.fetch_and(!WRITER, Ordering::Release);
    }
}

/// An `Arc` published under a mutex: a load takes the lock just long enough
/// to clone the `Arc`, and the clone is the snapshot.
pub struct LockedArcCell<R: lock_api::RawMutex, T>(lock_api::Mutex<R, Arc<T>>);

impl<R: lock_api::RawMutex + Send + Sync, T: Send + Sync> ArcCell<T> for LockedArcCell<R, T> {
    type Guard = Arc<T>;
    fn new(value: Arc<T>) -> Self {
        LockedArcCell(lock_api::Mutex::new(value))
    }
    fn load(&self) -> Arc<T> {
        self.load_full()
    }
    fn load_full(&self) -> Arc<T> {
        Arc::clone(&self.0.lock())
    }
    fn swap(&self, value: Arc<T>) -> Arc<T> {
        core::mem::replace(&mut *self.0.lock(), value)
    }
}

/// An `Option<Arc>` published under a mutex.
pub struct LockedArcOptionCell<R: lock_api::RawMutex, T>(lock_api::Mutex<R, Option<Arc<T>>>);

impl<R: lock_api::RawMutex + Send + Sync, T: Send + Sync> ArcOptionCell<T>
    for LockedArcOptionCell<R, T>
{
    fn empty() -> Self {
        LockedArcOptionCell(lock_api::Mutex::new(None))
    }
    fn load_full(&self) -> Option<Arc<T>> {
        self.0.lock().clone()
    }
    fn store(&self, value: Option<Arc<T>>) {
        // The old value is dropped after the lock is released.
        let old = core::mem::replace(&mut *self.0.lock(), value);
        drop(old);
    }
}
