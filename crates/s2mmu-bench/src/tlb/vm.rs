//! `tlb-perf` on the simulated VM: the big slot over reserved host address
//! space, vCPU threads writing a small slot of real memory meanwhile (so
//! every invalidation must reach them), the harvest cycles, and the text
//! report of what it costs the vCPUs (entries removed, TLB refills).

use super::guest::{sum_live, vcpu_loop, Live, Reservation};
use super::report::{
    build_kind, fill, map_and_log, median_f_of, median_of, open, table, Common, CycleTimes,
    ModelRows, SlotFacts,
};
use super::{alternate, check, Mode, Params, PAGE, POLICIES};
use crate::progress::Progress;
use crate::report::{human, human_bytes, Report};
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::MmuPolicy;
use s2mmu::tlb::LargeRangePolicy;
use s2mmu::{Gpa, Hva};
use s2mmu_vm::{Backing, Vm, VmConfig, VmFormat};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SMALL_GPA: u64 = 1 << 32;
const BIG_SLOT: u16 = 1;

/// One measured harvest cycle: what every model measures, and what the
/// vCPUs paid.
#[derive(Clone, Copy, Default)]
struct Sample {
    times: CycleTimes,
    vmid_flushes: u64,
    removed: u64,
    refill_misses: f64,
}

struct Bench<'a, F: VmFormat> {
    vm: &'a Vm<TreeMemslots, F>,
    live: &'a [Live],
    npages: u64,
    chunk_pages: u64,
    p: &'a Params,
    /// Misses per second the vCPUs take with no flush at all.
    base_miss_rate: f64,
    bitmap: Vec<u64>,
}

impl<F: VmFormat> Bench<'_, F> {
    fn cycle(&mut self, mode: Mode, policy: LargeRangePolicy) -> Result<Sample, String> {
        let mmu = self.vm.mmu();
        let e = |e: s2mmu::Error| e.to_string();
        mmu.set_tlb_large_range(policy, self.p.limit_pages)
            .map_err(e)?;
        let every = self.p.dirty_every.max(1);
        mmu.dirty_pages(BIG_SLOT, (0..self.npages).step_by(every as usize))
            .map_err(e)?;
        let sd0 = self.vm.shootdown().stats();
        let l0 = sum_live(self.live);
        let t0 = Instant::now();
        mmu.get_dirty_log(BIG_SLOT, &mut self.bitmap).map_err(e)?;
        let t1 = Instant::now();
        let mut cleared = 0;
        match mode {
            Mode::Whole => {
                cleared += mmu
                    .clear_dirty_log(BIG_SLOT, 0, self.npages, &self.bitmap)
                    .map_err(e)?;
            }
            Mode::Chunked => {
                let mut first = 0;
                while first < self.npages {
                    let n = self.chunk_pages.min(self.npages - first);
                    let w0 = (first / 64) as usize;
                    let w1 = (first + n).div_ceil(64) as usize;
                    cleared += mmu
                        .clear_dirty_log(BIG_SLOT, first, n, &self.bitmap[w0..w1])
                        .map_err(e)?;
                    first += n;
                }
            }
        }
        let t2 = Instant::now();
        let sd1 = self.vm.shootdown().stats();
        let settle = Duration::from_micros(self.p.settle_us);
        std::thread::sleep(settle);
        let window = t0.elapsed();
        let l1 = sum_live(self.live);
        let expected = self.base_miss_rate * window.as_secs_f64();
        Ok(Sample {
            times: CycleTimes {
                get: t1 - t0,
                clear: t2 - t1,
                calls: sd1.calls - sd0.calls,
                inv: Duration::from_nanos(sd1.time_ns - sd0.time_ns),
                cleared,
            },
            vmid_flushes: sd1.vmid_flushes - sd0.vmid_flushes,
            removed: l1.removed - l0.removed,
            refill_misses: ((l1.misses - l0.misses) as f64 - expected).max(0.0),
        })
    }
}

/// Medians of one mode and policy: the common figures and what the vCPUs paid.
struct Row {
    common: Common,
    vmid_flushes: u64,
    removed: u64,
    refill_misses: f64,
}

/// The VM with the big slot mapped and logged, and what setting it up took.
struct Setup<F: VmFormat> {
    /// Declared before `reservation`, so dropped first: its table holds
    /// addresses into the reservation.
    vm: Vm<TreeMemslots, F>,
    reservation: Reservation,
    slot: SlotFacts,
}

/// Options with `--vcpus 0` resolved to the machine's CPUs.
fn resolve(p: &Params) -> Params {
    let mut resolved = p.clone();
    if resolved.vcpus == 0 {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        resolved.vcpus = cpus.saturating_sub(1).clamp(1, 8);
    }
    resolved
}

/// Builds the VM: the vCPUs' small slot of real memory and the big slot,
/// mapped with 4K pages and dirty-logged.
fn setup<F: VmFormat>(p: &Params, progress: &Progress) -> Result<Setup<F>, String> {
    let e = |e: s2mmu::Error| e.to_string();
    let too_big = || {
        format!(
            "--vcpu-mem {} x --vcpus {} and --size {}: together more than a 48-bit IPA space",
            human_bytes(p.vcpu_mem),
            p.vcpus,
            human_bytes(p.size)
        )
    };
    let small = p.vcpu_mem.checked_mul(p.vcpus as u64).ok_or_else(too_big)?;
    // The big slot sits above the small one, 1 GiB aligned.
    let big_gpa = SMALL_GPA
        .checked_add(small)
        .and_then(|e| e.checked_next_multiple_of(1 << 30))
        .ok_or_else(too_big)?;
    let end = big_gpa.checked_add(p.size).ok_or_else(too_big)?;
    let ipa_bits = (64 - (end - 1).leading_zeros()).max(40);
    if ipa_bits > 48 {
        return Err(too_big());
    }
    let reservation = Reservation::new(p.size)?;
    let policy = MmuPolicy {
        tlb_limit_pages: p.limit_pages,
        ..MmuPolicy::default()
    };
    let vm = Vm::<TreeMemslots, F>::new(VmConfig {
        mem_size: small,
        backing: Backing::Anonymous,
        slots: 1,
        gpa_base: SMALL_GPA,
        policy,
        tlb_entries: 1024,
        ipa_bits,
    })
    .map_err(|e| e.to_string())?;
    let mmu = vm.mmu().clone();
    let region = UserMemoryRegion::new(
        BIG_SLOT,
        SlotFlags::NONE,
        Gpa::new(big_gpa),
        p.size,
        Hva::new(reservation.addr as u64),
    );
    mmu.set_memory_region(&region, PAGE).map_err(e)?;
    progress.message(&format!("mapping {} with 4K pages", human_bytes(p.size)));
    let slot = map_and_log(&mmu, BIG_SLOT, p.size / PAGE)?;
    Ok(Setup {
        vm,
        reservation,
        slot,
    })
}

/// Starts the vCPU threads, measures while they run, stops them.
fn with_vcpus<F: VmFormat>(p: &Params, st: &Setup<F>, progress: bool) -> Result<Measured, String> {
    let live: Vec<Live> = (0..p.vcpus).map(|_| Live::default()).collect();
    let stop = AtomicBool::new(false);
    let vcpu_pages = p.vcpu_mem / PAGE;
    let vcpus: Vec<_> = (0..p.vcpus)
        .map(|_| st.vm.new_vcpu().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let stop_ref = &stop;
    let idle = Duration::from_micros(p.idle_us);
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, v) in vcpus.into_iter().enumerate() {
            let l = &live[i];
            let base = SMALL_GPA + i as u64 * p.vcpu_mem;
            handles.push(s.spawn(move || vcpu_loop(v, i, base, vcpu_pages, idle, l, stop_ref)));
        }
        let r = measure(p, &st.vm, &live, st.slot.npages, progress);
        stop.store(true, Ordering::Relaxed);
        let mut errs = Vec::new();
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(m)) => errs.push(m),
                Err(_) => errs.push("a vCPU thread panicked".into()),
            }
        }
        match (r, errs.first()) {
            (Err(m), _) => Err(m),
            (Ok(_), Some(m)) => Err(m.clone()),
            (Ok(x), None) => Ok(x),
        }
    })
}

/// Runs `tlb-perf` on the simulated VM and returns its report.
///
/// # Errors
/// A message naming the flag or the step that failed.
pub(super) fn run<F: VmFormat>(p: &Params, progress: bool) -> Result<Report, String> {
    check(p)?;
    let p = &resolve(p);
    let bar = Progress::new("tlb-perf", 1, progress);
    let st = setup::<F>(p, &bar)?;
    drop(bar);
    let (rows, walk_ns, base_miss_rate) = with_vcpus(p, &st, progress)?;
    let Setup {
        vm,
        reservation,
        slot,
    } = st;
    drop(vm);
    drop(reservation);
    let facts = Facts {
        slot,
        walk_ns,
        base_miss_rate,
    };
    report(p, &rows, &facts)
}

/// What the report says besides the rows.
struct Facts {
    slot: SlotFacts,
    /// The cost of one TLB refill (a table walk).
    walk_ns: f64,
    /// Misses per second the vCPUs take with no flush at all.
    base_miss_rate: f64,
}

fn report(p: &Params, rows: &[Row], f: &Facts) -> Result<Report, String> {
    let mut report = open(
        p,
        json!({
            "vcpus": p.vcpus,
            "vcpu_mem_bytes": p.vcpu_mem,
            "format": p.format.name(),
            "settle_us": p.settle_us,
            "idle_us": p.idle_us,
        }),
        "populate",
        &f.slot,
        json!({
            "walk_ns": f.walk_ns,
            "baseline_misses_per_s": f.base_miss_rate,
        }),
    );
    let model = ModelRows {
        rows: rows
            .iter()
            .map(|r| {
                let extra = json!({
                    "tlb_vmid_flushes": r.vmid_flushes,
                    "tlb_entries_removed": r.removed,
                    "refill_misses": r.refill_misses,
                    "refill_walk_ns": r.refill_misses * f.walk_ns,
                });
                (&r.common, extra)
            })
            .collect(),
        call_noun: "call(s)",
        judge_chunked_calls: false,
    };
    let judged = fill(&mut report, p, f.slot.npages, &model)?;
    let mut lines = Vec::new();
    for (mode, mut mode_lines) in [Mode::Whole, Mode::Chunked].into_iter().zip(judged) {
        mode_lines.extend(tradeoff_lines(p, rows, mode, f)?);
        lines.extend(mode_lines);
    }
    report.set_text(text(p, rows, f, &lines));
    Ok(report)
}

/// What the whole-VMID flush costs the vCPUs in `mode`, against what it
/// saves the clearing thread.
fn tradeoff_lines(p: &Params, rows: &[Row], mode: Mode, f: &Facts) -> Result<Vec<String>, String> {
    let find = |pol: LargeRangePolicy| {
        rows.iter()
            .find(|r| r.common.mode == mode && r.common.policy == pol)
            .ok_or_else(|| "missing result row".to_string())
    };
    let b = find(LargeRangePolicy::SplitCalls)?;
    let o = find(LargeRangePolicy::WholeVmid)?;
    let clears = match mode {
        Mode::Whole => 1,
        Mode::Chunked => f.slot.npages.div_ceil(p.chunk / PAGE),
    };
    let per_clear = |x: f64| x / clears as f64;
    let walk_ns = f.walk_ns;
    let saved = b.common.inv.median().saturating_sub(o.common.inv.median());
    let refill =
        Duration::from_nanos(((o.refill_misses - b.refill_misses).max(0.0) * walk_ns) as u64);
    Ok(vec![
        format!(
            "{:<12} trade-off per clear: whole_vmid removes {:.0} vCPU TLB entries, {:.0} refill misses (~{} of table walks); split_calls removes {:.0}, {:.0} misses",
            b.common.case,
            per_clear(o.removed as f64),
            per_clear(o.refill_misses),
            human(Duration::from_nanos(
                (per_clear(o.refill_misses) * walk_ns) as u64
            )),
            per_clear(b.removed as f64),
            per_clear(b.refill_misses),
        ),
        format!(
            "{:<12} per cycle: whole_vmid saves {} of invalidation on the clearing thread and costs the vCPUs ~{} of extra TLB refills",
            b.common.case,
            human(saved),
            human(refill),
        ),
    ])
}

/// The human-readable report.
fn text(p: &Params, rows: &[Row], f: &Facts, lines: &[String]) -> String {
    let mut s = format!(
        "tlb-perf: {} slot of {} pages ({} of stage-2 tables, mapped in {}, logging enabled in {}), range limit {} pages ({}), {} vCPUs writing {} each, 1 page in {} dirtied per cycle, {} runs ({} build)\n",
        human_bytes(p.size),
        f.slot.npages,
        human_bytes(f.slot.table_pages as u64 * PAGE),
        human(f.slot.populate_time),
        human(f.slot.enable_time),
        p.limit_pages,
        human_bytes(p.limit_pages.saturating_mul(PAGE)),
        p.vcpus,
        human_bytes(p.vcpu_mem),
        p.dirty_every,
        p.runs,
        build_kind()
    );
    let cells: Vec<(&Common, String)> = rows
        .iter()
        .map(|r| {
            let extra = format!(
                " {:>9} {:>9.0} {:>10}",
                r.removed,
                r.refill_misses,
                human(Duration::from_nanos((r.refill_misses * f.walk_ns) as u64)),
            );
            (&r.common, extra)
        })
        .collect();
    s += &table(
        &cells,
        &format!(" {:>9} {:>9} {:>10}", "removed", "misses", "refill"),
    );
    s += &format!(
        "(medians of {} cycles; calls, removed vCPU TLB entries and refill misses per cycle; refill = misses x {:.0} ns per table walk; vCPUs miss {:.0}/s with no flush)\n",
        p.runs, f.walk_ns, f.base_miss_rate
    );
    for l in lines {
        s += l;
        s.push('\n');
    }
    // A call that waits for a vCPU the host preempted in guest mode pays a
    // scheduler time slice, not the cost of reaching it: say so.
    let slowest = rows
        .iter()
        .filter(|r| r.common.calls > 0)
        .map(|r| r.common.inv.median() / u32::try_from(r.common.calls).unwrap_or(u32::MAX))
        .max()
        .unwrap_or_default();
    if slowest > Duration::from_micros(100) {
        s += &format!(
            "note: an invalidation call took {} on average in one case: vCPU threads were preempted in guest mode (more runnable threads than free cores), so calls waited for the scheduler; use fewer --vcpus or --idle-us 50\n",
            human(slowest)
        );
    }
    s
}

type Measured = (Vec<Row>, f64, f64);

/// Waits for the vCPUs to run, measures the cost of a TLB refill, then the
/// harvest cycles of both modes and policies.
fn measure<F: VmFormat>(
    p: &Params,
    vm: &Vm<TreeMemslots, F>,
    live: &[Live],
    npages: u64,
    progress: bool,
) -> Result<Measured, String> {
    // Let the vCPUs fault their regions in and fill their TLBs.
    let want = p.vcpu_mem / PAGE * 8;
    let t = Instant::now();
    while live
        .iter()
        .any(|l| l.accesses.load(Ordering::Relaxed) < want)
    {
        if t.elapsed() > Duration::from_secs(30) {
            return Err("the vCPUs did not start running".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Misses with no flush at all (conflicts, none if the region fits).
    let l0 = sum_live(live);
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(50));
    let base_miss_rate = (sum_live(live).misses - l0.misses) as f64 / t.elapsed().as_secs_f64();
    // The cost of one TLB refill: a walk of the table.
    let reader = vm.mmu().reader();
    let pages = p.vcpu_mem * p.vcpus as u64 / PAGE;
    let walks = 200_000u64;
    let t = Instant::now();
    let mut found = 0u64;
    for i in 0..walks {
        found += u64::from(reader.translate(SMALL_GPA + (i % pages) * PAGE).is_some());
    }
    let walk_ns = t.elapsed().as_nanos() as f64 / walks as f64;
    std::hint::black_box(found);

    let mut bench = Bench {
        vm,
        live,
        npages,
        chunk_pages: p.chunk / PAGE,
        p,
        base_miss_rate,
        bitmap: vec![0u64; npages.div_ceil(64) as usize],
    };
    let mut rows = Vec::new();
    for (mode, case, samples) in alternate(p.runs, p.chunk, progress, |m, pol| bench.cycle(m, pol))?
    {
        for (pi, pol) in POLICIES.iter().enumerate() {
            let s = &samples[pi];
            rows.push(Row {
                common: Common::of(&case, mode, *pol, s.iter().map(|x| &x.times)),
                vmid_flushes: median_of(s, |x| x.vmid_flushes),
                removed: median_of(s, |x| x.removed),
                refill_misses: median_f_of(s, |x| x.refill_misses),
            });
        }
    }
    Ok((rows, walk_ns, base_miss_rate))
}
