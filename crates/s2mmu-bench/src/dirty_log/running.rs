//! Running the selftest flow on the engine's simulated VM ([`super::RunSpec`]):
//! the VM and workload, and the timed phases.

use s2mmu::memslot::{ArrayMemslots, MemslotStore, TreeMemslots};
use s2mmu::mmu::{DirtyMode, FaultPath, FaultStats, MmuPolicy};
use s2mmu_vm::{KnownFormat, Pattern, Vm, VmConfig, Workload, WorkloadConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::spec::RunSpec;
use super::{EngineIteration, EngineRun};
use s2mmu_migrate::sim::lost_write as lost;

/// The run's label: fault path, split policy, memslots and dirty tracking.
pub fn label(policy: &MmuPolicy, memslots: &str) -> String {
    format!(
        "{}, {}, memslots {memslots}{}",
        match (policy.fault_path, policy.reader_slots) {
            (FaultPath::ReadLockFastPath, 0) => "read-lock fast path (shared rwlock)",
            (FaultPath::ReadLockFastPath, _) => "read-lock fast path (per-vCPU reader slots)",
            (FaultPath::WriteLock, _) => "write-lock faults",
        },
        if policy.eager_split_chunk.is_some() {
            "eager split"
        } else {
            "split on fault"
        },
        match policy.dirty {
            DirtyMode::Bitmap { .. } => String::new(),
            mode => format!(", {}", mode.title()),
        },
    )
}

/// One empty dirty bitmap per memslot of `vm` (a bit per 4 KiB page).
fn slot_bitmaps<S: MemslotStore, F: KnownFormat>(vm: &Vm<S, F>) -> Vec<Vec<u64>> {
    vm.slots()
        .iter()
        .map(|s| vec![0u64; (s.size / 4096).div_ceil(64) as usize])
        .collect()
}

/// The engine's fault injection: its next `n` dirty marks are dropped (the
/// bug the lost-write check must catch).
#[cfg(feature = "test-hooks")]
fn inject_lost_marks<S: MemslotStore, F: KnownFormat>(vm: &Vm<S, F>, n: u64) -> Result<(), String> {
    vm.mmu().inject_lost_marks(n);
    Ok(())
}

/// Without the engine's test hooks, a run that asks for dropped dirty
/// marks is refused.
#[cfg(not(feature = "test-hooks"))]
fn inject_lost_marks<S: MemslotStore, F: KnownFormat>(_: &Vm<S, F>, n: u64) -> Result<(), String> {
    match n {
        0 => Ok(()),
        _ => Err(format!(
            "inject_lost_marks = {n} needs feature `test-hooks` of s2mmu-bench (a build for tests)"
        )),
    }
}

/// Runs the selftest flow on the engine.
fn run_engine<S: MemslotStore + 'static, F: KnownFormat>(
    spec: RunSpec<impl Copy>,
    memslots: &str,
) -> Result<EngineRun, String> {
    let mem = spec.bytes * spec.vcpus as u64;
    let gpa_base = super::GPA_BASE;
    let vm = Arc::new(new_vm::<S, F>(&spec, gpa_base)?);
    let mut run = EngineRun {
        label: label(&spec.policy, memslots),
        vcpus: spec.vcpus,
        test_gpa: (gpa_base, gpa_base + mem),
        ..EngineRun::default()
    };
    let (w, populate, off_pass) = populate(&vm, &spec)?;
    run.populate = populate;
    run.off_pass = off_pass;
    let t = Instant::now();
    vm.enable_dirty_logging().map_err(|e| e.to_string())?;
    run.enable = t.elapsed();
    let mmu = vm.mmu().clone();
    let ring = spec.policy.dirty.ring_entries().is_some();
    let mut prev = sum(&w.fault_stats());
    let mut prev_vcpu_time: Duration = w.pass_times().iter().flatten().sum();
    let mut bitmaps = slot_bitmaps(&vm);
    let mut reaped = Vec::new();
    let mut lost = spec
        .check
        .then(|| lost::LostWriteCheck::new(&vm))
        .transpose()?;
    inject_lost_marks(&vm, spec.inject_lost_marks)?;
    for _ in 0..spec.iterations {
        let mut it = EngineIteration::default();
        // With rings, a reaper harvests and resets whenever a vCPU stops on
        // a full ring (its cost lands in the dirty memory time, as in KVM).
        let mut reap = || {
            if ring && (0..spec.vcpus).any(|v| mmu.ring_soft_full(v)) {
                let mut tmp = Vec::new();
                if mmu.harvest_rings(&mut tmp).is_ok() {
                    let _ = mmu.reset_rings();
                }
                reaped.push(tmp.len());
            }
        };
        it.dirty_memory = w.run_pass(&mut reap)?;
        let cpu0 = thread_cpu_time();
        harvest(
            &vm,
            ring,
            spec.policy.dirty.manual_protect(),
            &mut bitmaps,
            &mut reaped,
            &mut it,
        )?;
        it.harvest_cpu = thread_cpu_time().saturating_sub(cpu0);
        if let Some(check) = lost.as_mut() {
            it.lost_writes = Some(check.round(&vm, &bitmaps)?);
        }
        let now = sum(&w.fault_stats());
        it.faults = diff(&now, &prev);
        prev = now;
        let vt: Duration = w.pass_times().iter().flatten().sum();
        it.vcpu_time = vt - prev_vcpu_time;
        prev_vcpu_time = vt;
        run.iterations.push(it);
    }
    let t = Instant::now();
    vm.disable_dirty_logging().map_err(|e| e.to_string())?;
    run.disable = t.elapsed();
    if spec.after_pass {
        let before = sum(&w.fault_stats());
        let t = w.run_pass(|| {})?;
        run.after = Some((t, sum(&w.fault_stats()).since(&before)));
    }
    run.vm_stats = mmu.vm_stats();
    w.stop();
    Ok(run)
}

/// The started workload, its populate time and the median pass with
/// logging off (when asked for).
type Populated<S, F> = (Workload<S, F>, Duration, Option<Duration>);

/// Starts the workload and times its populate pass; then sets the pattern
/// of the logged passes and, when asked, times passes with logging off
/// (their median).
fn populate<S: MemslotStore + 'static, F: KnownFormat>(
    vm: &Arc<Vm<S, F>>,
    spec: &RunSpec<impl Copy>,
) -> Result<Populated<S, F>, String> {
    let t0 = Instant::now();
    let w = Workload::start(
        vm.clone(),
        spec.vcpus,
        WorkloadConfig {
            bytes_per_vcpu: spec.bytes,
            write_percent: 100,
            pattern: Pattern::Sequential,
            page_size: 4096,
        },
    )?;
    w.run_pass(|| {})?;
    let populate = t0.elapsed();
    // The workload's pattern from here on (populate writes every page in
    // order), so a pass with logging off runs the same accesses.
    let ctl = w.control();
    ctl.write_percent.store(
        u64::from(spec.write_percent),
        std::sync::atomic::Ordering::Relaxed,
    );
    ctl.random
        .store(spec.random, std::sync::atomic::Ordering::Relaxed);
    let mut off_pass = None;
    if spec.off_pass {
        // The median of three passes, as a logged run's figure is a median
        // of its passes.
        let mut t = (0..3)
            .map(|_| w.run_pass(|| {}))
            .collect::<Result<Vec<_>, _>>()?;
        t.sort();
        off_pass = Some(t[1]);
    }
    Ok((w, populate, off_pass))
}

/// The simulated VM of `spec.vcpus * spec.bytes` bytes at `gpa_base`.
fn new_vm<S: MemslotStore + 'static, F: KnownFormat>(
    spec: &RunSpec<impl Copy>,
    gpa_base: u64,
) -> Result<Vm<S, F>, String> {
    Vm::<S, F>::new(VmConfig {
        mem_size: spec.bytes * spec.vcpus as u64,
        backing: spec.backing,
        slots: spec.slots,
        gpa_base,
        policy: spec.policy,
        ..VmConfig::default()
    })
    .map_err(|e| e.to_string())
}

/// One iteration's GET and CLEAR (or ring harvest and reset), timed into
/// `it` with the pages the log reported.
fn harvest<S: MemslotStore + 'static, F: KnownFormat>(
    vm: &Vm<S, F>,
    ring: bool,
    manual_protect: bool,
    bitmaps: &mut [Vec<u64>],
    reaped: &mut Vec<usize>,
    it: &mut EngineIteration,
) -> Result<(), String> {
    let mmu = vm.mmu();
    let t = Instant::now();
    if ring {
        let mut got = Vec::new();
        mmu.harvest_rings(&mut got).map_err(|e| e.to_string())?;
        it.get = t.elapsed();
        it.pages_dirty = got.len() as u64 + reaped.drain(..).sum::<usize>() as u64;
        let t = Instant::now();
        mmu.reset_rings().map_err(|e| e.to_string())?;
        it.clear = Some(t.elapsed());
    } else {
        for (s, bm) in vm.slots().iter().zip(bitmaps.iter_mut()) {
            it.pages_dirty += mmu.get_dirty_log(s.id, bm).map_err(|e| e.to_string())?;
        }
        it.get = t.elapsed();
        if manual_protect {
            let t = Instant::now();
            for (s, bm) in vm.slots().iter().zip(bitmaps.iter()) {
                mmu.clear_dirty_log(s.id, 0, s.size / 4096, bm)
                    .map_err(|e| e.to_string())?;
            }
            it.clear = Some(t.elapsed());
        }
    }
    Ok(())
}

fn sum(v: &[FaultStats]) -> FaultStats {
    let mut t = FaultStats::default();
    for s in v {
        t.add(s);
    }
    t
}

fn diff(a: &FaultStats, b: &FaultStats) -> FaultStats {
    a.since(b)
}

/// Runs the selftest flow on the simulated VM with stage-2 format `F` and
/// the memslot store `memslots` names (`array`, else the tree).
///
/// # Errors
/// Settings [`super::check`] refuses (before anything is allocated), or a
/// message naming what failed: the VM or its memory, logging, a harvest,
/// or a lost write that `spec.check` found.
pub fn run<F: KnownFormat, Fmt: Copy>(
    spec: RunSpec<Fmt>,
    memslots: &str,
) -> Result<EngineRun, String> {
    super::check(&spec)?;
    match memslots {
        "array" => run_engine::<ArrayMemslots, F>(spec, memslots),
        _ => run_engine::<TreeMemslots, F>(spec, memslots),
    }
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
