//! The orders `dirty-log-perf`'s comparisons run the engine in: several
//! settings in rotating order, so a slow stretch of a shared machine lands
//! on every one (eager split against split on fault, the three fault-path
//! policies, the dirty modes side by side), and what the side-by-side
//! table keeps of each mode's runs ([`ModeSamples`]).

use super::{median_dirty, EngineIteration, EngineRun, RunSpec};
use crate::stats::Summary;
use s2mmu::mmu::DirtyMode;
use std::time::Duration;

/// `runs` runs of each of `specs`, the first of each round rotating
/// (round `r` starts with `specs[r % len]`); returns each spec's runs, in
/// `specs` order. `run` runs one (the caller's format dispatch).
///
/// # Errors
/// The first run's error.
pub fn rotated<Fmt: Copy>(
    runs: usize,
    specs: &[RunSpec<Fmt>],
    mut run: impl FnMut(RunSpec<Fmt>) -> Result<EngineRun, String>,
) -> Result<Vec<Vec<EngineRun>>, String> {
    let n = specs.len();
    let mut got: Vec<Vec<EngineRun>> = (0..n).map(|_| Vec::new()).collect();
    for r in 0..runs {
        for k in 0..n {
            let i = (k + r) % n;
            got[i].push(run(specs[i])?);
        }
    }
    Ok(got)
}

/// `mode` protecting as `like` does (a run's policy sets the protection
/// from `-g`; the mode list only names modes).
fn protected_as(mode: DirtyMode, like: DirtyMode) -> DirtyMode {
    match like.protect() {
        Some(p) => mode.with_protect(p),
        None => mode,
    }
}

/// `runs` runs of every mode in `modes` in rotating order, each from
/// `base` with that mode (protecting as `base` does) and a pass with
/// logging off first.
///
/// # Errors
/// The first run's error.
pub fn sample_modes<Fmt: Copy>(
    base: RunSpec<Fmt>,
    modes: &[DirtyMode],
    runs: usize,
    run: impl FnMut(RunSpec<Fmt>) -> Result<EngineRun, String>,
) -> Result<Vec<ModeSamples>, String> {
    let specs: Vec<RunSpec<Fmt>> = modes
        .iter()
        .map(|&m| {
            let mut s = base;
            s.policy.dirty = protected_as(m, base.policy.dirty);
            s.off_pass = true;
            s
        })
        .collect();
    let got = rotated(runs, &specs, run)?;
    Ok(got
        .iter()
        .map(|runs| {
            let mut s = ModeSamples::default();
            for r in runs {
                s.add(r);
            }
            s
        })
        .collect())
}

/// The samples of one mode over the runs.
#[derive(Clone, Debug, Default)]
pub struct ModeSamples {
    /// Per run: the median logged pass (the passes after the first when
    /// there are several: the first meets what enabling logging left).
    pub dirty: Vec<Duration>,
    /// Per run: the pass with logging off before logging started.
    pub off: Vec<Duration>,
    /// Per run: median GET + CLEAR time of those passes.
    pub harvest: Vec<Duration>,
    /// Per run: median CPU time of the harvesting thread in them.
    pub harvest_cpu: Vec<Duration>,
    /// Per run: median faults (translation + permission) per pass.
    pub faults: Vec<u64>,
    /// Per run: median log-full exits per pass.
    pub pml_full: Vec<u64>,
    /// Per run: median pages reported dirty per pass.
    pub pages: Vec<u64>,
    /// Per run: enabling logging (the eager split, where the mode splits).
    pub enable: Vec<Duration>,
    /// Per run: time splitting (eager, on CLEAR, and on fault).
    pub split: Vec<Duration>,
}

/// The middle value (the upper one of an even count, unlike
/// [`crate::stats::median_u64`]; 0 when empty): the side-by-side table's
/// per-pass counts.
pub fn middle_u64(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

/// The middle value (the upper one of an even count; 0 when empty).
pub fn middle_f64(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

impl ModeSamples {
    /// Adds one run's figures.
    pub fn add(&mut self, r: &EngineRun) {
        let steady: Vec<_> = r
            .iterations
            .iter()
            .skip(usize::from(r.iterations.len() > 1))
            .collect();
        self.dirty.push(median_dirty(r));
        self.enable.push(r.enable);
        let on_fault: u64 = r.iterations.iter().map(|i| i.faults.split_ns).sum();
        self.split
            .push(Duration::from_nanos(r.vm_stats.split_ns + on_fault));
        self.off.push(r.off_pass.unwrap_or_default());
        let harvest: Vec<Duration> = steady
            .iter()
            .map(|i| i.get + i.clear.unwrap_or_default())
            .collect();
        self.harvest.push(Summary::of(&harvest).median);
        let cpu: Vec<Duration> = steady.iter().map(|i| i.harvest_cpu).collect();
        self.harvest_cpu.push(Summary::of(&cpu).median);
        let per = |f: &dyn Fn(&EngineIteration) -> u64| {
            middle_u64(&steady.iter().map(|i| f(i)).collect::<Vec<_>>())
        };
        self.faults
            .push(per(&|i| i.faults.permission + i.faults.translation));
        self.pml_full.push(per(&|i| i.faults.pml_full_exits));
        self.pages.push(per(&|i| i.pages_dirty));
    }

    /// Per run, logged pass over that run's pass with logging off.
    pub fn slowdowns(&self) -> Vec<f64> {
        self.dirty
            .iter()
            .zip(&self.off)
            .filter(|(_, o)| !o.is_zero())
            .map(|(d, o)| d.as_secs_f64() / o.as_secs_f64())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: usize) -> RunSpec<()> {
        RunSpec::for_tests(id, 4096)
    }

    #[test]
    fn each_round_starts_with_the_next_setting_and_runs_stay_with_their_setting() {
        let specs = [spec(0), spec(1), spec(2)];
        let mut order = Vec::new();
        let got = rotated(4, &specs, |s| {
            order.push(s.vcpus);
            Ok(EngineRun {
                vcpus: s.vcpus,
                ..EngineRun::default()
            })
        })
        .unwrap();
        assert_eq!(order, [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]);
        for (i, runs) in got.iter().enumerate() {
            assert_eq!(runs.len(), 4);
            assert!(runs.iter().all(|r| r.vcpus == i), "setting {i}'s runs");
        }
    }

    #[test]
    fn a_failed_run_stops_the_schedule_with_its_error() {
        let mut calls = 0;
        let r = rotated(3, &[spec(0), spec(1)], |s| {
            calls += 1;
            if s.vcpus == 1 {
                Err("run 1 failed".to_string())
            } else {
                Ok(EngineRun::default())
            }
        });
        assert_eq!(r.unwrap_err(), "run 1 failed");
        assert_eq!(calls, 2);
    }

    #[test]
    fn modes_run_with_the_base_protection_and_a_logging_off_pass() {
        let base = spec(1);
        let mut seen = Vec::new();
        let modes = [DirtyMode::WP, DirtyMode::HW];
        let got = sample_modes(base, &modes, 2, |s| {
            seen.push((s.policy.dirty, s.off_pass));
            Ok(EngineRun::default())
        })
        .unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|m| m.dirty.len() == 2 && m.off.len() == 2));
        let want = |m: DirtyMode| protected_as(m, base.policy.dirty);
        assert_eq!(
            seen,
            [
                (want(DirtyMode::WP), true),
                (want(DirtyMode::HW), true),
                (want(DirtyMode::HW), true),
                (want(DirtyMode::WP), true),
            ]
        );
    }
}
