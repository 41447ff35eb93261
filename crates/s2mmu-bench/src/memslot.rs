//! The engine of `s2mmu memslot-perf`: the scenarios of KVM's `memslot_perf_test`, run on the engine's
//! two memslot policies side by side (array = "Before", tree = "After", as in the scalable
//! memslots cover letter).
//!
//! The guest is a host thread that does what the selftest's guest code does: it turns
//! each gfn into a slot through a snapshot and its own last-used-slot cache, turns that
//! into a host address, and reads or writes real memory there. A gfn without a usable slot
//! counts as an MMIO exit and is skipped, as the selftest accepts for the moved slot. The
//! host thread does what the selftest's host side does, including `madvise(MADV_DONTNEED)`;
//! each such call is followed by what KVM's MMU notifier does on it: an hva-range lookup of
//! the slots it hits and an unmap of their gfn ranges.
//!
//! Besides the scenarios it measures single slot operations at each count (one move, one
//! delete) and the random gfn lookup, which the scenarios only exercise indirectly.

use std::time::Duration;

mod guest;
pub mod report;
mod scenarios;

use guest::*;
use scenarios::*;

use crate::stats::paired_ratio;
use crate::Progress;
use s2mmu::memslot::{
    ArrayMemslots, MemslotStore, NoStage2, SlotFlags, SlotLookup, Stage2Invalidate, TreeMemslots,
    UserMemoryRegion, VcpuSlotCache,
};

const PAGE_SHIFT: u32 = 12;
/// The guest page size.
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
/// `MEM_GPA` of the selftest: where the test area starts in guest-physical space.
const MEM_GPA: u64 = 256 << 20;
/// `MEM_TEST_MOVE_SIZE`: the window the guest writes in the move tests.
const MOVE_WINDOW_BYTES: u64 = 3 * (64 << 10);
/// `MEM_TEST_UNMAP_CHUNK_SIZE`: the unit of the chunked unmap test.
const UNMAP_CHUNK_BYTES: u64 = 2 << 20;
const VAL_1: u64 = 0x1122_3344_5566_7788;
const VAL_2: u64 = 0x99AA_BBCC_DDEE_FF00;

/// Options of one `memslot-perf` run.
#[derive(Clone, Debug)]
pub struct MemslotPerfParams {
    /// Slot counts to test (`-s` of the selftest, one table each).
    pub slots: Vec<u32>,
    /// Test area of the move and RW tests (`MEM_SIZE`).
    pub mem_bytes: u64,
    /// Test area of the map test (`MEM_SIZE_MAP`).
    pub map_bytes: u64,
    /// Test area of the unmap tests (`MEM_TEST_UNMAP_SIZE` plus the extra).
    pub unmap_bytes: u64,
    /// Length of each run (`-l`).
    pub run_seconds: f64,
    /// Runs per test (`-r`); the tables show the median run.
    pub runs: u32,
    /// Single moves and deletes timed per slot count.
    pub single_ops: u32,
    /// Random gfn lookups timed per slot count.
    pub lookups: u32,
}

impl Default for MemslotPerfParams {
    fn default() -> Self {
        Self {
            slots: vec![10, 30, 50, 100, 509, 32764],
            mem_bytes: (512 << 20) + (64 << 10),
            map_bytes: (32 << 20) + (64 << 10),
            unmap_bytes: (128 << 20) + (64 << 10),
            run_seconds: 0.5,
            runs: 5,
            single_ops: 200,
            lookups: 1_000_000,
        }
    }
}

/// One measured case for one policy at one slot count.
#[derive(Clone, Debug, PartialEq)]
pub struct CaseResult {
    /// `map`, `unmap`, `unmap_chunked`, `move_active`, `move_inactive`, `rw`, `slot_setup`,
    /// `move_slot`, `delete_slot`, `lookup_gfn` (search on a held snapshot),
    /// `lookup_gfn_vcpu` (through a per-vCPU cache, which random gfns miss),
    /// `lookup_gfn_snapshot` (a snapshot taken per lookup, as a fault does).
    pub case: &'static str,
    /// The slot count asked for.
    pub slots: u32,
    /// The slot count used (smaller when the area cannot be split that finely, as the
    /// selftest's map test at 32k slots).
    pub slots_used: u32,
    /// `array`, `tree`, or `kvm`.
    pub policy: String,
    /// Median over runs: per iteration for the scenarios, the whole setup for `slot_setup`,
    /// one operation for `move_slot` / `delete_slot` / the lookups.
    pub median_ns: f64,
    /// Fastest run.
    pub min_ns: f64,
    /// Slowest run.
    pub max_ns: f64,
    /// Number of runs (samples).
    pub runs: u32,
    /// Each run's figure, in run order (empty where only the median is known, as the
    /// real-KVM rows' repeated operations).
    pub samples_ns: Vec<f64>,
    /// Iterations summed over runs (scenarios only, else 0).
    pub iterations: u64,
    /// Tree rows of the scenarios: the median over runs of this run's time divided by the
    /// array run beside it (ABBA pairs), robust to the machine's drift during the test.
    pub paired_ratio: Option<f64>,
}

/// Everything one `memslot-perf` run measured.
#[derive(Clone, Debug)]
pub struct MemslotPerfReport {
    /// The options as used.
    pub params: MemslotPerfParams,
    /// Engine results, both policies.
    pub results: Vec<CaseResult>,
    /// The same slot operations on the host's real KVM (`slot_setup`, `move_slot`,
    /// `delete_slot` rows with policy `kvm`), filled in by the caller when `/dev/kvm` works.
    pub kvm: Option<Vec<CaseResult>>,
}

/// The most slot counts one run takes (`-s`): each is a table of minutes.
const MAX_SLOT_COUNTS: usize = 16;

/// Refuses options that make no sense, naming the flag and its limit.
///
/// # Errors
/// `-s`/`--slots`, `-r`/`--runs` or `-l`/`--seconds` out of range.
pub fn check(params: &MemslotPerfParams) -> Result<(), String> {
    let max = s2mmu::memslot::KVM_USER_MEM_SLOTS;
    if params.slots.is_empty() || params.slots.len() > MAX_SLOT_COUNTS {
        return Err(format!(
            "--slots: 1 to {MAX_SLOT_COUNTS} slot counts, {} given",
            params.slots.len()
        ));
    }
    if let Some(n) = params.slots.iter().find(|&&n| n == 0 || n > u32::from(max)) {
        return Err(format!("--slots {n}: each count must be in 1..={max}"));
    }
    if params.runs == 0 {
        return Err("--runs 0: at least 1".into());
    }
    // `contains` is false for NaN; the upper bound keeps `Duration::from_secs_f64` (which
    // panics on NaN, infinity and values beyond u64 seconds) away from absurd lengths.
    if !(f64::MIN_POSITIVE..=86_400.0).contains(&params.run_seconds) {
        return Err(format!(
            "--seconds {}: more than 0 and at most 86400",
            params.run_seconds
        ));
    }
    Ok(())
}

/// Runs every scenario for every slot count and both policies.
///
/// # Errors
/// A message when the parameters make no sense (no slot counts, zero runs) or when the
/// guest memory cannot be mapped or a guest saw wrong data.
/// `bar` advances after each scenario run.
pub fn run_with(
    params: &MemslotPerfParams,
    bar: &dyn Progress,
) -> Result<MemslotPerfReport, String> {
    check(params)?;
    let mut results = Vec::new();
    for &nslots in &params.slots {
        results.extend(run_both(params, nslots, bar)?);
    }
    Ok(MemslotPerfReport {
        params: params.clone(),
        results,
        kvm: None,
    })
}

/// The selftest's scenarios: name, test area, and whether its setup counts towards the
/// `slot_setup` row (the tests on the full area do).
pub const SCENARIO_TABLE: [(&str, bool); 6] = [
    ("map", false),
    ("unmap", false),
    ("unmap_chunked", false),
    ("move_active", true),
    ("move_inactive", true),
    ("rw", true),
];

fn scenario_bytes(params: &MemslotPerfParams, case: &str) -> u64 {
    match case {
        "map" => params.map_bytes,
        "unmap" | "unmap_chunked" => params.unmap_bytes,
        _ => params.mem_bytes,
    }
}

/// What one run of one scenario measured.
struct OneRun {
    per_iteration_ns: Option<f64>,
    iterations: u64,
    setup_ns: f64,
    single_ops: Vec<CaseResult>,
}

/// One run of scenario `case` on a fresh VM with policy `S`.
fn one_run<S: MemslotStore>(
    params: &MemslotPerfParams,
    nslots: u32,
    used: u32,
    case: &str,
    with_single_ops: bool,
) -> Result<OneRun, String> {
    type Scenario<S> = fn(&Vm<S>, Duration) -> Result<(u64, Duration), String>;
    let scenario: Scenario<S> = match case {
        "map" => scenario_map::<S>,
        "unmap" => scenario_unmap::<S>,
        "unmap_chunked" => scenario_unmap_chunked::<S>,
        "move_active" => scenario_move_active::<S>,
        "move_inactive" => scenario_move_inactive::<S>,
        _ => scenario_rw::<S>,
    };
    let (vm, setup) = Vm::<S>::prepare(used, scenario_bytes(params, case))?;
    let (iters, elapsed) = scenario(&vm, Duration::from_secs_f64(params.run_seconds))?;
    let single_ops = if with_single_ops {
        single_ops(&vm, nslots, params)?
    } else {
        Vec::new()
    };
    Ok(OneRun {
        per_iteration_ns: (iters > 0).then(|| elapsed.as_nanos() as f64 / iters as f64),
        iterations: iters,
        setup_ns: setup.as_nanos() as f64,
        single_ops,
    })
}

/// Every scenario at one slot count on both policies. The policies alternate run by
/// run in ABBA order, so a drift of this shared machine's speed during the test falls
/// on both alike instead of on whichever ran second.
fn run_both(
    params: &MemslotPerfParams,
    nslots: u32,
    bar: &dyn Progress,
) -> Result<Vec<CaseResult>, String> {
    const POLICIES: [&str; 2] = [
        <ArrayMemslots as MemslotStore>::POLICY,
        <TreeMemslots as MemslotStore>::POLICY,
    ];
    let mut out = Vec::new();
    let mut setups: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for (case, counts_setup) in SCENARIO_TABLE {
        let used = usable_slots(nslots, scenario_bytes(params, case), case);
        let mut samples: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut iterations = [0u64; 2];
        bar.message(&format!("{nslots} slots: {case}"));
        for run in 0..params.runs {
            let order = if run % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                let single = case == "rw" && run == 0;
                let r = if which == 0 {
                    one_run::<ArrayMemslots>(params, nslots, used, case, single)?
                } else {
                    one_run::<TreeMemslots>(params, nslots, used, case, single)?
                };
                if counts_setup {
                    setups[which].push(r.setup_ns);
                }
                samples[which].extend(r.per_iteration_ns);
                iterations[which] += r.iterations;
                out.extend(r.single_ops);
                bar.step();
            }
        }
        for which in 0..2 {
            let mut row = CaseResult::from_samples(
                case,
                nslots,
                used,
                POLICIES[which],
                &samples[which],
                iterations[which],
            );
            if which == 1 {
                row.paired_ratio = paired_ratio(&samples[0], &samples[1]);
            }
            out.push(row);
        }
    }
    for (which, policy) in POLICIES.iter().enumerate() {
        let mut row =
            CaseResult::from_samples("slot_setup", nslots, nslots, policy, &setups[which], 0);
        if which == 1 {
            row.paired_ratio = paired_ratio(&setups[0], &setups[1]);
        }
        out.push(row);
    }
    Ok(out)
}

/// The largest slot count not above `nslots` at which `bytes` splits into non-empty slots
/// (the selftest's `get_max_slots`); the move tests also need the last slot to hold half
/// the move window.
fn usable_slots(nslots: u32, bytes: u64, case: &str) -> u32 {
    let pages = bytes / PAGE_SIZE;
    let mut n = u64::from(nslots).min(pages).max(1);
    if case.starts_with("move") {
        while n > 2 && pages / n + pages % n < MOVE_WINDOW_BYTES / 2 / PAGE_SIZE {
            n -= 1;
        }
    }
    n as u32
}

impl CaseResult {
    fn from_samples(
        case: &'static str,
        slots: u32,
        slots_used: u32,
        policy: &str,
        samples: &[f64],
        iterations: u64,
    ) -> Self {
        use crate::stats;
        Self {
            case,
            slots,
            slots_used,
            policy: policy.to_string(),
            median_ns: stats::median(samples).unwrap_or(f64::NAN),
            min_ns: stats::min(samples).unwrap_or(f64::NAN),
            max_ns: stats::max(samples).unwrap_or(f64::NAN),
            runs: u32::try_from(samples.len()).unwrap_or(u32::MAX),
            samples_ns: samples.to_vec(),
            iterations,
            paired_ratio: None,
        }
    }
}

/// The real-KVM rows: setup, one move and one delete at each slot count, on the same area
/// as the engine's `Slot setup` row.
///
/// # Errors
/// Why `/dev/kvm` is unusable, or which slot count KVM refused.
pub fn kvm_rows(params: &MemslotPerfParams) -> Result<Vec<CaseResult>, String> {
    if let Some(why) = s2mmu_kvm::kvm_unusable_reason() {
        return Err(why);
    }
    let mut rows = Vec::new();
    for &nslots in &params.slots {
        // The VM's slot 0 is the selftest's default slot, so KVM takes one test slot fewer
        // than KVM_CAP_NR_MEMSLOTS; the row says how many it used.
        let t = match s2mmu_kvm::memslot_perf::kvm_memslot_ops(nslots, params.mem_bytes) {
            Err(s2mmu_kvm::Error::TooManySlots { max, .. }) if max > 1 => {
                s2mmu_kvm::memslot_perf::kvm_memslot_ops((max - 1) as u32, params.mem_bytes)
            }
            other => other,
        }
        .map_err(|e| format!("{nslots} slots: {e}"))?;
        let one = |case: &'static str, d: Duration, runs: u32| CaseResult {
            case,
            slots: nslots,
            slots_used: t.nslots,
            policy: "kvm".into(),
            median_ns: d.as_nanos() as f64,
            min_ns: f64::NAN,
            max_ns: f64::NAN,
            runs,
            samples_ns: if runs == 1 {
                vec![d.as_nanos() as f64]
            } else {
                Vec::new()
            },
            iterations: 0,
            paired_ratio: None,
        };
        rows.push(one("slot_setup", t.setup, 1));
        rows.push(one("move_slot", t.move_median, t.repetitions));
        rows.push(one("delete_slot", t.delete_median, t.repetitions));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_length_that_is_no_duration_is_refused() {
        // Each of these reached `Duration::from_secs_f64` before and panicked there.
        for seconds in [f64::NAN, f64::INFINITY, 1e30, -1.0, 0.0] {
            let params = MemslotPerfParams {
                slots: vec![2],
                run_seconds: seconds,
                runs: 1,
                ..MemslotPerfParams::default()
            };
            assert!(
                run_with(&params, &crate::NoProgress).is_err(),
                "-l {seconds}"
            );
        }
    }
}
