//! What the `Mmu` facade and the memslot stores need from their environment,
//! behind small traits so that a no_std hypervisor can supply its own:
//!
//! - locks, through [`lock_api`]'s raw lock traits ([`Platform::RawMutex`],
//!   [`Platform::RawRwLock`]): parking_lot's with `std`, a spin lock
//!   ([`spin`]) or the embedder's without;
//! - time, for the counters that report waits and split durations
//!   ([`Clock`]): std's `Instant` with `std`, the embedder's clock or none;
//! - snapshot reclamation ([`ArcCell`], [`ArcOptionCell`]): how a published
//!   `Arc` (the active memslot set, a slot's dirty bitmap) is swapped while
//!   readers load it without blocking the writer. `arc-swap` with `std`; a
//!   lock-protected `Arc` ([`spin::LockedArcCell`]) without. Either way a
//!   reader's snapshot holds a strong reference (arc-swap pays its debts on
//!   a swap), so an updater waits for a retired state's readers by its
//!   strong count.
//!
//! [`DefaultPlatform`] is [`StdPlatform`] with `std` and [`SpinPlatform`]
//! without; [`crate::mmu::Mmu`] and the memslot stores take the platform as
//! their last type parameter, defaulting to it.
//!
//! Table pages are not reclaimed here: the table allocator
//! ([`crate::MmOps`]) owns their reclamation ([`crate::MmOps::ReadGuard`]).

mod platform;
pub mod spin;
#[cfg(feature = "std")]
mod std_platform;

pub(crate) use platform::{wait_for_readers, Stopwatch};
pub use platform::{ArcCell, ArcOptionCell, Clock, Mutex, Platform, RwLock};
pub use spin::{
    LockedArcCell, LockedArcOptionCell, LockedPlatform, NoClock, RawSpinMutex, RawSpinRwLock,
    SpinPlatform,
};
#[cfg(feature = "std")]
pub use std_platform::{StdClock, StdPlatform, SwapCell, SwapOptionCell};

/// The platform the engine's types default to: [`StdPlatform`] with the
/// `std` feature, else [`SpinPlatform`].
#[cfg(feature = "std")]
pub type DefaultPlatform = StdPlatform;
/// The platform the engine's types default to: [`StdPlatform`] with the
/// `std` feature, else [`SpinPlatform`].
#[cfg(not(feature = "std"))]
pub type DefaultPlatform = SpinPlatform;
