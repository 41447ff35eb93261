//! A no_std embedding of the s2mmu facade, as a hypervisor without `std`
//! would write it: table pages from a static arena ([`ArenaMmOps`]), its own
//! `lock_api` raw lock ([`RawTicketLock`]), its own clock ([`TickClock`]),
//! snapshot cells from the engine's lock-protected cell over its own lock,
//! all bundled as [`CheckPlatform`]. `tests/facade.rs` drives
//! [`s2mmu::mmu::Mmu`] through it (faults, memslots, dirty logging, eager
//! split) with a global allocator of its own.
//!
//! The engine must be built without `std` for this to mean anything: run
//! `cargo test -p s2mmu-nostd-check` on its own (`cargo tree -p
//! s2mmu-nostd-check -e features` shows no `std` feature of `s2mmu`).
#![no_std]
#![warn(missing_docs)]
extern crate alloc;

mod arena;
mod ticket;

pub use arena::{Arena, ArenaMmOps};
pub use ticket::RawTicketLock;

use core::sync::atomic::{AtomicU64, Ordering};
use s2mmu::sync::{Clock, LockedPlatform, RawSpinRwLock};

/// The embedding's platform: ticket-lock mutexes, the engine's spin
/// reader-writer lock, [`TickClock`], cells locked by ticket locks.
pub type CheckPlatform = LockedPlatform<RawTicketLock, RawSpinRwLock, TickClock>;

/// A clock that advances one nanosecond per reading: monotonic, and
/// countable ([`TickClock::readings`]), as a stand-in for a hypervisor's
/// counter register.
#[derive(Debug, Clone, Copy)]
pub enum TickClock {}

static TICKS: AtomicU64 = AtomicU64::new(0);

impl TickClock {
    /// Readings so far.
    pub fn readings() -> u64 {
        TICKS.load(Ordering::Relaxed)
    }
}

impl Clock for TickClock {
    fn now_ns() -> Option<u64> {
        Some(TICKS.fetch_add(1, Ordering::Relaxed))
    }
}
