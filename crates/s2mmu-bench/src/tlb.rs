//! The engine of `s2mmu tlb-perf` (seed 003): a large slot mapped with 4K
//! pages and dirty-logged, its harvest cycles (GET, then CLEAR whole or in
//! chunks) under both large-range policies, on the simulated VM with vCPU
//! threads running ([`vm`]) or on QEMU's arm64 model where every TLB call
//! is a round trip to EL2 ([`arm64`]). Each returns the raw samples of
//! every cycle; the command reduces them to medians and reports.

pub mod arm64;
pub mod cycle;
pub mod guest;
pub mod vm;

use crate::{human_bytes, Bars};
use s2mmu::tlb::LargeRangePolicy;

/// The page size of the slots.
pub const PAGE: u64 = 4096;

/// The large-range policies compared, the baseline first.
pub const POLICIES: [LargeRangePolicy; 2] =
    [LargeRangePolicy::SplitCalls, LargeRangePolicy::WholeVmid];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
/// The two clear modes: the whole slot in one call, or `--chunk` pieces.
pub enum Mode {
    /// One CLEAR of the whole slot.
    Whole,
    /// CLEARs of `chunk` bytes each.
    Chunked,
}

/// A run's settings (the command checks them first).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Bytes of the dirty-logged slot.
    pub size: u64,
    /// Bytes per CLEAR in [`Mode::Chunked`].
    pub chunk: u64,
    /// Measured cycles per mode and policy.
    pub runs: usize,
    /// vCPU threads writing meanwhile (simulated VM only).
    pub vcpus: usize,
    /// Bytes each vCPU writes (simulated VM only).
    pub vcpu_mem: u64,
    /// One page in this many is dirtied before each cycle.
    pub dirty_every: u64,
    /// The TLB range limit in pages.
    pub limit_pages: u64,
    /// A vCPU's idle time after each burst of writes, in microseconds.
    pub idle_us: u64,
    /// How long the vCPUs are watched after each clear, in microseconds.
    pub settle_us: u64,
}

/// One mode's case name and the samples of each policy, in [`POLICIES`]
/// order.
pub type ModeSamples<S> = (Mode, String, Vec<Vec<S>>);

/// The two clear modes, each measured for both policies: one untimed
/// warm-up cycle per policy, then `runs` rounds alternating which policy
/// goes first. Returns, per mode, its case name and the samples of each
/// policy (in `POLICIES` order).
///
/// # Errors
/// The first error of a cycle.
pub fn alternate<S>(
    runs: usize,
    chunk: u64,
    bars: Bars,
    mut cycle: impl FnMut(Mode, LargeRangePolicy) -> Result<S, String>,
) -> Result<Vec<ModeSamples<S>>, String> {
    let modes = [
        (Mode::Whole, "whole_slot".to_string()),
        (
            Mode::Chunked,
            format!("chunk_{}", human_bytes(chunk).to_lowercase()),
        ),
    ];
    // Both modes' cycles (the warm-up cycles too), for the progress bar.
    let steps = (runs.saturating_add(1) * POLICIES.len() * modes.len()) as u64;
    let bar = bars("tlb-perf", steps);
    let mut out = Vec::new();
    for (mode, case) in modes {
        bar.message(&case);
        let mut samples: Vec<Vec<S>> = (0..POLICIES.len()).map(|_| Vec::new()).collect();
        for pol in POLICIES {
            cycle(mode, pol)?;
            bar.step();
        }
        for run in 0..runs {
            for k in 0..POLICIES.len() {
                let pi = (k + run) % POLICIES.len();
                samples[pi].push(cycle(mode, POLICIES[pi])?);
                bar.step();
            }
        }
        out.push((mode, case, samples));
    }
    Ok(out)
}
