//! The engine of `s2mmu tlb-perf` (the TLB range policy): a large slot mapped with 4K
//! pages and dirty-logged, its harvest cycles (GET, then CLEAR whole or in
//! chunks) under both large-range policies, on the simulated VM with vCPU
//! threads running ([`vm`]) or on QEMU's arm64 model where every TLB call
//! is a round trip to EL2 ([`arm64`]). Each returns the raw samples of
//! every cycle; [`vm_report`] and [`arm64_report`] run them and reduce
//! them to medians, JSON rows and the report's text.

pub mod arm64;
pub mod arm64_report;
pub mod cycle;
pub mod guest;
pub mod report;
pub mod vm;
pub mod vm_report;

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

/// Checks the settings before anything is allocated or a thread starts:
/// the slot and chunk sizes, counts, the range limit, and the memory the
/// vCPUs' regions and the slot's 4K tables take against the host's.
/// `vcpus` 0 passes (the command's "one per CPU but one"); a run needs it
/// resolved.
///
/// # Errors
/// A message naming the flag (the setting of the same name) and its limit.
pub fn check(p: &Config) -> Result<(), String> {
    if p.size == 0 || !p.size.is_multiple_of(1 << 30) {
        return Err("--mem must be a non-zero multiple of 1G".into());
    }
    if p.chunk == 0 || !p.chunk.is_multiple_of(64 * PAGE) || p.chunk > p.size {
        return Err(format!(
            "--chunk must be a non-zero multiple of {} (64 pages: one bitmap word) and at most --mem",
            human_bytes(64 * PAGE)
        ));
    }
    if p.runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    if p.vcpus > 64 {
        return Err("--vcpus must be at most 64".into());
    }
    if p.vcpu_mem < PAGE || !p.vcpu_mem.is_multiple_of(PAGE) {
        return Err("--vcpu-mem must be a non-zero multiple of 4K".into());
    }
    if p.limit_pages == 0 {
        return Err("--limit-pages must be at least 1".into());
    }
    // The report shows the limit in bytes; a limit of more pages than the
    // 64-bit address space holds means nothing.
    if p.limit_pages.checked_mul(PAGE).is_none() {
        return Err(format!(
            "--limit-pages must be at most {} (the 64-bit address space in pages)",
            u64::MAX / PAGE
        ));
    }
    if p.dirty_every == 0 {
        return Err("--dirty-every must be at least 1".into());
    }
    if p.runs == 0 || p.runs > 1000 {
        return Err(format!("--runs {}: must be 1..=1000", p.runs));
    }
    // Real memory: the vCPUs' regions, and the big slot's 4K tables (1/512).
    let regions = p
        .vcpu_mem
        .checked_mul(p.vcpus.max(1) as u64)
        .ok_or_else(|| {
            format!(
                "--vcpu-mem {} x --vcpus {}: more than 64 bits",
                human_bytes(p.vcpu_mem),
                p.vcpus
            )
        })?;
    let what = format!(
        "--vcpu-mem {} x --vcpus {} and --mem {}",
        human_bytes(p.vcpu_mem),
        p.vcpus,
        human_bytes(p.size)
    );
    crate::host::check_memory(&what, regions.saturating_add(p.size / 512))?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use s2mmu::format::arm64::Arm64Stage2;

    /// A small run: a 1 GiB slot in 256 MiB chunks, one vCPU, one round.
    pub(super) fn config() -> Config {
        Config {
            size: 1 << 30,
            chunk: 256 << 20,
            runs: 1,
            vcpus: 1,
            vcpu_mem: 64 << 10,
            dirty_every: 64,
            limit_pages: 1 << 16,
            idle_us: 50,
            settle_us: 100,
        }
    }

    /// What the simulated VM's run refuses, before anything is allocated.
    fn refused(c: Config, says: &str) {
        let e = vm::run::<Arm64Stage2>(&c, &crate::no_bars).unwrap_err();
        assert!(e.contains(says), "{e:?} should name {says}");
    }

    #[test]
    fn a_run_refuses_bad_settings_by_name_before_it_starts() {
        refused(
            Config {
                size: 0,
                ..config()
            },
            "--mem",
        );
        refused(
            Config {
                chunk: 4096,
                ..config()
            },
            "--chunk",
        );
        refused(
            Config {
                runs: 0,
                ..config()
            },
            "--runs",
        );
        refused(
            Config {
                vcpus: 0,
                ..config()
            },
            "--vcpus 0",
        );
        refused(
            Config {
                vcpus: 65,
                ..config()
            },
            "--vcpus",
        );
        refused(
            Config {
                dirty_every: 0,
                ..config()
            },
            "--dirty-every",
        );
        refused(
            Config {
                limit_pages: u64::MAX,
                ..config()
            },
            "--limit-pages",
        );
        let huge = Config {
            vcpu_mem: 1 << 62,
            vcpus: 8,
            ..config()
        };
        refused(huge, "more than 64 bits");
        // Tables of a 256 TiB slot (1/512 of it) are more than any host has.
        refused(
            Config {
                size: 256 << 40,
                chunk: 1 << 30,
                ..config()
            },
            "needs about",
        );
    }

    #[test]
    fn the_arm64_model_bounds_its_round_trips_before_qemu_starts() {
        let c = Config {
            limit_pages: 1,
            chunk: 256 << 10,
            ..config()
        };
        let e = arm64::check(&c).unwrap_err();
        assert!(e.contains("round trips to EL2"), "{e}");
        assert!(arm64::check(&config()).is_ok());
        let e = arm64::run(
            &Config {
                size: 0,
                ..config()
            },
            &crate::no_bars,
        )
        .unwrap_err();
        assert!(e.contains("--mem"), "{e}");
    }

    #[test]
    fn a_small_run_counts_the_calls_of_each_policy() {
        // 1 GiB slot, limit 2^16 pages (256 MiB): 4 split calls or 1 VMID
        // flush per whole-slot clear; 256 MiB chunks: 4 clears.
        let r = vm::run::<Arm64Stage2>(&config(), &crate::no_bars).unwrap();
        let calls = |mode: Mode, pol: usize| -> Vec<u64> {
            let (_, _, samples) = r.modes.iter().find(|m| m.0 == mode).unwrap();
            samples[pol].iter().map(|s| s.times.calls).collect()
        };
        assert_eq!(calls(Mode::Whole, 0), [4]);
        assert_eq!(calls(Mode::Whole, 1), [1]);
        assert_eq!(calls(Mode::Chunked, 0), [16]);
        assert_eq!(calls(Mode::Chunked, 1), [4]);
        assert_eq!(r.slot.npages, (1 << 30) / PAGE);
    }
}
