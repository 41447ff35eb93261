//! Per-vCPU dirty rings (KVM's `kvm_dirty_ring`) with the harvest and
//! reset protocol and a soft-full limit.

use super::{DirtyGfn, DirtyTracker};
use crate::{Error, Result};
use alloc::boxed::Box;
use alloc::vec::Vec;
#[cfg(not(loom))]
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Entry flags of a dirty ring (`struct kvm_dirty_gfn.flags`).
pub mod ring_flags {
    /// Published by the vCPU, not yet harvested.
    pub const DIRTY: u32 = 1 << 0;
    /// Harvested, waiting for reset.
    pub const RESET: u32 = 1 << 1;
}

/// One ring entry.
struct RingEntry {
    flags: AtomicU32,
    slot: AtomicU32,
    offset: AtomicU64,
}

impl RingEntry {
    fn new() -> Self {
        RingEntry {
            flags: AtomicU32::new(0),
            slot: AtomicU32::new(0),
            offset: AtomicU64::new(0),
        }
    }
}

/// A per-vCPU dirty ring (KVM's `kvm_dirty_ring`): the vCPU pushes, a
/// collector harvests in order and marks entries harvested, and a reset
/// re-protects the harvested pages and frees their entries. When the ring
/// reaches its soft limit the vCPU must stop until it is reset.
pub struct DirtyRing {
    entries: Box<[RingEntry]>,
    /// Next entry a push claims (by compare-and-swap: a ring is its vCPU's,
    /// but nothing in safe code stops two threads pushing at once, and
    /// neither push may be lost).
    dirty_index: AtomicU64,
    /// Next entry a reset frees.
    reset_index: AtomicU64,
    /// Next entry the collector harvests.
    fetch_index: AtomicU64,
    soft_limit: u64,
    /// Held by a harvest or a reset: one collector at a time, whoever
    /// calls (the indices they advance are read-modify-written).
    collector: AtomicBool,
}

/// Holds a ring's collector flag.
struct Collector<'a>(&'a AtomicBool);

impl<'a> Collector<'a> {
    fn take(flag: &'a AtomicBool) -> Self {
        while flag
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        Collector(flag)
    }
}

impl Drop for Collector<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Entries kept free beyond the soft limit so that pushes already under
/// way when it is reached never overflow (`KVM_DIRTY_RING_RSVD_ENTRIES`).
pub const RING_RESERVED_ENTRIES: u32 = 64;

impl DirtyRing {
    /// A ring of `entries` entries (a power of two, 256..=65536).
    ///
    /// # Errors
    /// [`Error::InvalidRingSize`].
    pub fn new(entries: u32) -> Result<Self> {
        if !entries.is_power_of_two() || !(256..=65536).contains(&entries) {
            return Err(Error::InvalidRingSize { entries });
        }
        Ok(DirtyRing {
            entries: (0..entries).map(|_| RingEntry::new()).collect(),
            dirty_index: AtomicU64::new(0),
            reset_index: AtomicU64::new(0),
            fetch_index: AtomicU64::new(0),
            soft_limit: u64::from(entries - RING_RESERVED_ENTRIES),
            collector: AtomicBool::new(false),
        })
    }

    /// Entries published and not yet reset.
    pub fn used(&self) -> u64 {
        self.dirty_index.load(Ordering::Acquire) - self.reset_index.load(Ordering::Acquire)
    }

    /// Whether the vCPU must stop until a reset (`KVM_EXIT_DIRTY_RING_FULL`).
    pub fn soft_full(&self) -> bool {
        self.used() >= self.soft_limit
    }

    /// Publishes a dirty page (the owning vCPU's call; concurrent pushes
    /// each claim an entry of their own).
    ///
    /// # Errors
    /// [`Error::RingFull`] if the ring is hard-full (the vCPU ignored the
    /// soft limit); nothing is written then.
    pub fn push(&self, vcpu: usize, slot: u32, offset: u64) -> Result<()> {
        let mut di = self.dirty_index.load(Ordering::Relaxed);
        loop {
            if di - self.reset_index.load(Ordering::Acquire) >= self.entries.len() as u64 {
                return Err(Error::RingFull { vcpu });
            }
            match self.dirty_index.compare_exchange_weak(
                di,
                di + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => di = now,
            }
        }
        let e = &self.entries[(di as usize) & (self.entries.len() - 1)];
        e.slot.store(slot, Ordering::Relaxed);
        e.offset.store(offset, Ordering::Relaxed);
        e.flags.store(ring_flags::DIRTY, Ordering::Release);
        Ok(())
    }

    /// Harvests published entries in order, marking each harvested, and
    /// appends them to `out`; returns how many.
    pub fn harvest(&self, out: &mut Vec<DirtyGfn>) -> usize {
        let _one = Collector::take(&self.collector);
        let n = self.entries.len() as u64;
        let mut fetch = self.fetch_index.load(Ordering::Relaxed);
        let mut got = 0;
        loop {
            let e = &self.entries[(fetch % n) as usize];
            if e.flags.load(Ordering::Acquire) != ring_flags::DIRTY {
                break;
            }
            out.push(DirtyGfn {
                slot: e.slot.load(Ordering::Relaxed),
                offset: e.offset.load(Ordering::Relaxed),
            });
            e.flags.store(ring_flags::RESET, Ordering::Release);
            fetch += 1;
            got += 1;
        }
        self.fetch_index.store(fetch, Ordering::Relaxed);
        got
    }

    /// Frees harvested entries in order, calling `reprotect` for each
    /// (slot, offset, 64-page mask) group of consecutive entries, as KVM
    /// coalesces them; returns the number of entries reset.
    pub fn reset(&self, mut reprotect: impl FnMut(u32, u64, u64)) -> u64 {
        let _one = Collector::take(&self.collector);
        let n = self.entries.len() as u64;
        let mut ri = self.reset_index.load(Ordering::Relaxed);
        let mut count = 0;
        let mut group: Option<(u32, u64, u64)> = None;
        loop {
            let e = &self.entries[(ri % n) as usize];
            if e.flags.load(Ordering::Acquire) & ring_flags::RESET == 0 {
                break;
            }
            let slot = e.slot.load(Ordering::Relaxed);
            let offset = e.offset.load(Ordering::Relaxed);
            e.flags.store(0, Ordering::Release);
            ri += 1;
            count += 1;
            group = match group {
                Some((s, base, mask)) if s == slot && offset >= base && offset - base < 64 => {
                    Some((s, base, mask | 1 << (offset - base)))
                }
                Some((s, base, mask)) => {
                    reprotect(s, base, mask);
                    Some((slot, offset, 1))
                }
                None => Some((slot, offset, 1)),
            };
        }
        if let Some((s, base, mask)) = group {
            reprotect(s, base, mask);
        }
        self.reset_index.store(ri, Ordering::Release);
        count
    }
}

impl DirtyTracker for DirtyRing {
    fn mark(&self, vcpu: usize, slot: u32, offset: u64) -> Result<bool> {
        self.push(vcpu, slot, offset).map(|()| true)
    }

    fn collect(&self, out: &mut Vec<DirtyGfn>) -> usize {
        self.harvest(out)
    }
}
