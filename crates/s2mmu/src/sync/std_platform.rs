//! The platform with `std`: parking_lot's locks, std's `Instant`, arc-swap.

use alloc::sync::Arc;
use arc_swap::{ArcSwap, ArcSwapOption, Guard};
use std::sync::OnceLock;
use std::time::Instant;

use super::{ArcCell, ArcOptionCell, Clock, Platform};

/// parking_lot's locks, std's monotonic clock, arc-swap's cells, and
/// `std::thread::yield_now` while spinning.
#[derive(Debug, Clone, Copy)]
pub enum StdPlatform {}

impl Platform for StdPlatform {
    type RawMutex = parking_lot::RawMutex;
    type RawRwLock = parking_lot::RawRwLock;
    type Clock = StdClock;
    type Cell<T: Send + Sync + 'static> = SwapCell<T>;
    type OptionCell<T: Send + Sync + 'static> = SwapOptionCell<T>;

    #[inline]
    fn relax() {
        std::thread::yield_now();
    }
}

/// std's `Instant`, as nanoseconds since the first reading in the process.
#[derive(Debug, Clone, Copy)]
pub enum StdClock {}

impl Clock for StdClock {
    #[inline]
    fn now_ns() -> Option<u64> {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        let epoch = EPOCH.get_or_init(Instant::now);
        Some(epoch.elapsed().as_nanos() as u64)
    }
}

/// An `Arc` published through `arc-swap`: a load takes no lock and, in the
/// common case, writes no shared cache line.
pub struct SwapCell<T>(ArcSwap<T>);

/// A snapshot of a [`SwapCell`].
pub struct SwapGuard<T>(Guard<Arc<T>>);

impl<T> core::ops::Deref for SwapGuard<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Send + Sync> ArcCell<T> for SwapCell<T> {
    type Guard = SwapGuard<T>;
    fn new(value: Arc<T>) -> Self {
        SwapCell(ArcSwap::new(value))
    }
    #[inline]
    fn load(&self) -> SwapGuard<T> {
        SwapGuard(self.0.load())
    }
    fn load_full(&self) -> Arc<T> {
        self.0.load_full()
    }
    fn swap(&self, value: Arc<T>) -> Arc<T> {
        self.0.swap(value)
    }
}

/// An `Option<Arc>` published through `arc-swap`.
pub struct SwapOptionCell<T>(ArcSwapOption<T>);

impl<T: Send + Sync> ArcOptionCell<T> for SwapOptionCell<T> {
    fn empty() -> Self {
        SwapOptionCell(ArcSwapOption::empty())
    }
    #[inline]
    fn load_full(&self) -> Option<Arc<T>> {
        self.0.load_full()
    }
    fn store(&self, value: Option<Arc<T>>) {
        self.0.store(value);
    }
}
