//! The traits an environment implements for the facade (locks, time,
//! snapshot reclamation) and the helpers built on them.

use alloc::sync::Arc;
use core::ops::Deref;

/// A mutex of platform `P`.
pub type Mutex<P, T> = lock_api::Mutex<<P as Platform>::RawMutex, T>;
/// A reader-writer lock of platform `P`.
pub type RwLock<P, T> = lock_api::RwLock<<P as Platform>::RawRwLock, T>;

/// Locks, time and snapshot reclamation for the facade (see the module
/// documentation). A marker type: nothing of it is instantiated.
pub trait Platform: Send + Sync + 'static {
    /// The raw lock behind the facade's mutexes (update serialisation, the
    /// split cache, counters).
    type RawMutex: lock_api::RawMutex + Send + Sync;
    /// The raw lock behind the MMU lock's shared side and the ring list.
    type RawRwLock: lock_api::RawRwLock + Send + Sync;
    /// Where wait and split durations come from.
    type Clock: Clock;
    /// A published `Arc` that readers load while a writer swaps it.
    type Cell<T: Send + Sync + 'static>: ArcCell<T>;
    /// A published `Option<Arc>`, as [`Platform::Cell`].
    type OptionCell<T: Send + Sync + 'static>: ArcOptionCell<T>;

    /// Called while spinning for another thread (a writer waiting for
    /// readers to leave): yield to the scheduler with `std`, a CPU pause
    /// hint in a spin-only environment.
    fn relax();
}

/// A monotonic clock.
pub trait Clock {
    /// Nanoseconds since some fixed point, or `None` where there is no
    /// clock (durations are then reported as 0).
    fn now_ns() -> Option<u64>;
}

/// A started measurement of a duration on clock `C`.
pub(crate) struct Stopwatch<C: Clock>(Option<u64>, core::marker::PhantomData<C>);

impl<C: Clock> Stopwatch<C> {
    /// Starts measuring.
    #[inline]
    pub(crate) fn start() -> Self {
        Stopwatch(C::now_ns(), core::marker::PhantomData)
    }

    /// Nanoseconds since [`Stopwatch::start`]; 0 without a clock.
    #[inline]
    pub(crate) fn elapsed_ns(&self) -> u64 {
        match (self.0, C::now_ns()) {
            (Some(t0), Some(t1)) => t1.saturating_sub(t0),
            _ => 0,
        }
    }
}

/// A published `Arc<T>`: loads never wait for the writer, and a loaded
/// snapshot keeps the value it loaded, holding a strong reference to it for
/// as long as it lives (the updaters wait for readers by strong count).
pub trait ArcCell<T>: Send + Sync {
    /// A reader's snapshot.
    type Guard: Deref<Target = T>;
    /// A cell holding `value`.
    fn new(value: Arc<T>) -> Self;
    /// A snapshot of the value now published.
    fn load(&self) -> Self::Guard;
    /// The value now published, as an `Arc`.
    fn load_full(&self) -> Arc<T>;
    /// Publishes `value` and returns the value it replaced.
    fn swap(&self, value: Arc<T>) -> Arc<T>;
}

/// A published `Option<Arc<T>>` (a slot's dirty bitmap, absent while the
/// slot does not log).
pub trait ArcOptionCell<T>: Send + Sync {
    /// A cell holding `None`.
    fn empty() -> Self;
    /// The value now published.
    fn load_full(&self) -> Option<Arc<T>>;
    /// Publishes `value`.
    fn store(&self, value: Option<Arc<T>>);
}

/// Waits until `retired` is the only strong reference to its value: every
/// snapshot of a retired state has been dropped (the `synchronize_srcu` of
/// this design). Afterwards `Arc::make_mut` and `Arc::try_unwrap` on it
/// neither copy nor fail.
pub(crate) fn wait_for_readers<P: Platform, T>(retired: &Arc<T>) {
    let mut spins = 0u32;
    // Snapshots are the only other strong references; no weak ones are ever made.
    while Arc::strong_count(retired) > 1 {
        // Readers hold snapshots for a lookup or a fault; spin briefly, then let them run.
        if spins < 128 {
            spins += 1;
            core::hint::spin_loop();
        } else {
            P::relax();
        }
    }
}
