//! What one vCPU's passes are made of: the access pattern and its
//! configuration, the word each write stores, the counters a vCPU
//! publishes while it runs and the state a pass resumes from.

use crate::vcpu::Vcpu;
use crate::vm::KnownFormat;
use s2mmu::memslot::MemslotStore;
use std::sync::atomic::{AtomicU64, Ordering};

/// The access pattern of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Every page of the vCPU's region in order (memstress).
    Sequential,
    /// As many pages as the region has, chosen at random in it.
    Random,
}

/// What each vCPU does.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadConfig {
    /// Bytes of guest memory each vCPU touches (its own region).
    pub bytes_per_vcpu: u64,
    /// Percent of accesses that are writes (the rest read).
    pub write_percent: u32,
    /// Access pattern.
    pub pattern: Pattern,
    /// Page size the workload steps by.
    pub page_size: u64,
}

/// Values the vCPUs write: `(vcpu << 48) | (pass << 24) | page`, so a
/// checker can tell which pass of which vCPU wrote a page.
pub fn stamp(vcpu: usize, pass: u64, page: u64) -> u64 {
    ((vcpu as u64) << 48) | ((pass & 0xff_ffff) << 24) | (page & 0xff_ffff)
}

/// How often (in accesses) a vCPU publishes its live counters.
pub const LIVE_EVERY: u64 = 64;

/// One vCPU's running totals, readable while it runs. Each sits on its own
/// cache line and only its vCPU writes it.
#[derive(Default)]
#[repr(align(128))]
pub struct LiveCounters {
    /// Guest accesses made.
    pub accesses: AtomicU64,
    /// Guest writes made.
    pub writes: AtomicU64,
    /// Faults (exits) taken.
    pub faults: AtomicU64,
    /// Software-TLB misses (table walks).
    pub tlb_misses: AtomicU64,
    /// Software-TLB fills.
    pub tlb_fills: AtomicU64,
    /// Invalidation requests the vCPU applied.
    pub tlb_flushes: AtomicU64,
    /// Nanoseconds spent executing guest accesses (faults included;
    /// throttle, pacing sleeps and pauses excluded): writes per guest
    /// nanosecond is the guest's speed, whatever its pacing.
    pub guest_ns: AtomicU64,
}

impl LiveCounters {
    pub(super) fn publish<S: MemslotStore, F: KnownFormat>(
        &self,
        vcpu: &Vcpu<S, F>,
        writes: u64,
        guest_ns: u64,
    ) {
        let t = vcpu.tlb().stats();
        self.guest_ns.store(guest_ns, Ordering::Relaxed);
        self.accesses.store(vcpu.accesses, Ordering::Relaxed);
        self.writes.store(writes, Ordering::Relaxed);
        self.faults.store(vcpu.faults, Ordering::Relaxed);
        self.tlb_misses.store(t.misses, Ordering::Relaxed);
        self.tlb_fills.store(t.fills, Ordering::Relaxed);
        self.tlb_flushes.store(
            vcpu.tlb().shared().flushes_applied.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
}

/// Where a vCPU is in its workload: the architectural state a migration
/// carries to resume it on the destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuState {
    /// The pass it is in (1-based; passes before it are complete).
    pub pass: u64,
    /// Index of the next access in that pass.
    pub next_page: u64,
    /// Its random generator's state.
    pub rng: u64,
    /// Guest writes it has made in total.
    pub writes: u64,
}

/// A small xorshift generator, as the selftests' guest_random.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}
