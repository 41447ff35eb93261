//! The correctness check with real KVM: every page the guest wrote in a pass appears in
//! that pass's dirty log, and (after the first pass) no page it did not write does.
//!
//! The guest decides per page with its own random generator whether to write or only read
//! (see [`crate::guest_code`]); the host replays the generator to know the exact set of
//! pages written in each pass and compares it bit for bit with the harvested bitmaps.

use crate::dirty_log_perf::{self, DirtyLogParams, DirtyLogReport};
use crate::error::Error;
use crate::guest_code;

/// The comparison for one iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IterationCheck {
    /// 1-based iteration.
    pub iteration: u32,
    /// Pages the guest wrote in the pass.
    pub written: u64,
    /// Pages the dirty log reported.
    pub reported: u64,
    /// Written but not reported: lost dirty bits, always a failure.
    pub missing: u64,
    /// Reported but not written: a failure after the first iteration (in the first, with
    /// `KVM_DIRTY_LOG_INITIALLY_SET`, every page is reported).
    pub extra: u64,
}

impl IterationCheck {
    /// Whether this iteration satisfies the rule.
    pub fn passes(&self) -> bool {
        self.missing == 0 && (self.extra == 0 || self.iteration == 1)
    }
}

/// The outcome of [`check_dirty_log`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyLogCheckReport {
    /// One entry per iteration.
    pub iterations: Vec<IterationCheck>,
    /// The measured run the check rode on.
    pub run: DirtyLogReport,
}

impl DirtyLogCheckReport {
    /// True when every iteration passes.
    pub fn passes(&self) -> bool {
        self.iterations.iter().all(IterationCheck::passes)
    }

    /// A one-line description of the first failing iteration, if any.
    pub fn first_failure(&self) -> Option<String> {
        self.iterations.iter().find(|c| !c.passes()).map(|c| {
            format!(
                "iteration {}: {} pages written, {} reported, {} missing, {} extra",
                c.iteration, c.written, c.reported, c.missing, c.extra
            )
        })
    }
}

/// Runs the dirty-log workload and checks each iteration's bitmaps against the pages the
/// guest wrote. Use `write_percent` below 100 to check a random subset of pages.
///
/// # Errors
/// As [`dirty_log_perf::run`]. A mismatch is not an error: it is in the report.
pub fn check_dirty_log(params: &DirtyLogParams) -> Result<DirtyLogCheckReport, Error> {
    params.validate()?;
    let shape = params.shape();
    let pages_per_vcpu = shape.pages_per_vcpu();
    let pages_per_slot = shape.pages_per_slot();
    let threshold = guest_code::write_threshold(params.write_percent);
    // Random state of each vCPU at the start of the next pass to replay; pass 0 (populate)
    // writes every page.
    let mut states: Vec<u64> = (0..shape.vcpus)
        .map(|v| {
            guest_code::replay_pass(
                guest_code::initial_random_state(v),
                pages_per_vcpu,
                guest_code::THRESHOLD_ALL_WRITES,
                |_| {},
            )
        })
        .collect();
    let mut checks = Vec::new();
    let mut observer = |iteration: u32, bitmaps: &[Vec<u64>]| {
        let mut expected: Vec<Vec<u64>> = bitmaps.iter().map(|b| vec![0; b.len()]).collect();
        let mut written = 0u64;
        for (vcpu, state) in states.iter_mut().enumerate() {
            let first = vcpu as u64 * pages_per_vcpu;
            *state = guest_code::replay_pass(*state, pages_per_vcpu, threshold, |page| {
                let global = first + page;
                let (slot, bit) = ((global / pages_per_slot) as usize, global % pages_per_slot);
                expected[slot][(bit / 64) as usize] |= 1 << (bit % 64);
                written += 1;
            });
        }
        let (mut reported, mut missing, mut extra) = (0u64, 0u64, 0u64);
        for (got, want) in bitmaps.iter().zip(&expected) {
            for (g, w) in got.iter().zip(want) {
                reported += u64::from(g.count_ones());
                missing += u64::from((w & !g).count_ones());
                extra += u64::from((g & !w).count_ones());
            }
        }
        checks.push(IterationCheck {
            iteration,
            written,
            reported,
            missing,
            extra,
        });
    };
    let run = dirty_log_perf::run_observed(params, &mut observer)?;
    Ok(DirtyLogCheckReport {
        iterations: checks,
        run,
    })
}
