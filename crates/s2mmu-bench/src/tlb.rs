//! The engine parts of `s2mmu tlb-perf`: the vCPU workload that runs while
//! the big slot is cleared.

pub mod guest;

/// The page size of the slots.
pub const PAGE: u64 = 4096;
