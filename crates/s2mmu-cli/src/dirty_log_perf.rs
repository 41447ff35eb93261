//! `s2mmu dirty-log-perf`: KVM's dirty_log_perf_test on the engine's
//! simulated VM (seeds 002 and 004), on the host's real KVM (`--kvm`), or
//! both side by side (`--compare`).
//!
//! Flow, as the selftest: vCPU threads populate their memory (one pass),
//! dirty logging is enabled on every slot, then for each iteration the
//! vCPUs dirty their memory in lockstep and the host gets (and with manual
//! protect clears) the log; finally logging is disabled.

use crate::report::{
    self, human, human_bytes, paired_ratio, paired_ratios, parse_size, verdict, Report, Summary,
};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptFormat;
use s2mmu::memslot::{ArrayMemslots, MemslotStore, TreeMemslots};
use s2mmu::mmu::{DirtyMode, FaultPath, FaultStats, MmuPolicy};
use s2mmu::SplitPolicy;
use s2mmu_vm::{Backing, Pattern, Vm, VmConfig, VmFormat, Workload, WorkloadConfig};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod arm64;
mod bounds;
mod modes;

pub use modes::FormatArg;
use s2mmu_cli::lost_write as lost;

/// Which fault-path policy to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// Read-lock fast path (optimised).
    Fast,
    /// Every fault under the write lock.
    Baseline,
    /// Both, as a table per vCPU count (seed 002).
    Both,
}

/// What happens to huge pages split for logging when logging stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RecoverArg {
    /// Unmap the pages; faults map blocks again (x86 before 6.13).
    Zap,
    /// Collapse the pages back into blocks in place (x86 since 6.13).
    InPlace,
    /// Keep the pages (arm64 today).
    Off,
}

/// How dirty pages are tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DirtyArg {
    /// Write protection: the first write to a page after each harvest
    /// faults (KVM's default).
    Wp,
    /// Hardware dirty state (arm64 DBM, EPT dirty flags): logged pages stay
    /// writable-clean, the vCPU's walker records the first write in the
    /// leaf without a fault, and GET scans the leaves.
    Hw,
    /// Hardware dirty state with x86 Page-Modification Logging: as hw, and
    /// the walker appends each page it dirties to its vCPU's 512-entry log
    /// (a full log exits); GET flushes the logs instead of scanning.
    Pml,
    /// As hw, but huge mappings are not split when logging starts: a write
    /// to a block dirties (and reports) the whole block
    /// (`HwDirtyBlocks::LogWholeBlocks`).
    HwBlocks,
    /// wp, hw and pml side by side (as `--dirty wp,hw,pml`).
    All,
}

/// How fast-path faults take the MMU lock for reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadLockArg {
    /// Per-vCPU reader slots while no writer is around (s2mmu).
    Slots,
    /// The rwlock's shared reader count (KVM's mmu_lock).
    Rwlock,
}

impl ReadLockArg {
    fn reader_slots(self) -> usize {
        match self {
            ReadLockArg::Slots => MmuPolicy::default().reader_slots,
            ReadLockArg::Rwlock => 0,
        }
    }
}

/// Options of `dirty-log-perf` (the selftest's names where one exists).
#[derive(Clone, Debug, clap::Args)]
pub struct Params {
    /// vCPUs: a number or a comma list (default 1; 1,2,4,8,16,32,64 with --policy both).
    #[arg(short = 'v', value_delimiter = ',')]
    pub vcpus: Vec<usize>,
    /// Memory dirtied per vCPU (default 1G; 64M with a vCPU list or --arm64).
    #[arg(short = 'b', value_parser = parse_size)]
    pub bytes_per_vcpu: Option<u64>,
    /// Dirty iterations.
    #[arg(short = 'i', default_value_t = 2)]
    pub iterations: u32,
    /// Backing: anonymous, anonymous_thp, anonymous_hugetlb_2mb, anonymous_hugetlb_1gb.
    #[arg(short = 's', default_value = "anonymous", value_parser = Backing::parse)]
    pub backing: Backing,
    /// Number of memslots the memory is divided into.
    #[arg(short = 'x', default_value_t = 1)]
    pub slots: u32,
    /// Do not use manual protect: GET clears and re-protects; no CLEAR phase.
    #[arg(short = 'g')]
    pub no_manual_protect: bool,
    /// Eager split when logging is enabled (compared with split on fault on
    /// huge-page backing). Note: the selftest's -e is "evil" mode instead.
    #[arg(short = 'e')]
    pub eager_split: bool,
    /// Percent of accesses that write.
    #[arg(short = 'w', default_value_t = 100)]
    pub write_percent: u32,
    /// Random page order in the dirty iterations.
    #[arg(short = 'a')]
    pub random: bool,
    /// Fault-path policy.
    #[arg(long, value_enum, default_value = "fast")]
    pub policy: PolicyArg,
    /// How vCPUs take the MMU lock for reading on the fast path: their own reader
    /// slots (s2mmu's default) or the rwlock's shared reader count (KVM's mmu_lock).
    #[arg(long, value_enum, default_value = "slots")]
    pub read_lock: ReadLockArg,
    /// Memslot implementation of the engine: tree (5.17) or array (baseline).
    #[arg(long, default_value = "tree", value_parser = ["tree", "array"])]
    pub memslots: String,
    /// Use per-vCPU dirty rings of this many entries instead of bitmaps.
    #[arg(long)]
    pub ring: Option<u32>,
    /// Dirty tracking: write protection (wp), hardware dirty state (hw:
    /// arm64 DBM or EPT dirty flags), or hardware dirty state with x86 PML
    /// (pml); hw and pml log to bitmaps only, not with --ring. Several
    /// (`wp,hw,pml`, or `all`) run side by side in one process, with a pass
    /// with logging off, as one table.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "wp")]
    pub dirty: Vec<DirtyArg>,
    /// The stage-2 format the simulated VM's vCPUs walk: arm64 (4 KiB
    /// granule) or x86 EPT (4-level). Not with --kvm, --compare or --arm64.
    #[arg(long, value_enum, default_value = "arm64")]
    pub format: FormatArg,
    /// Huge pages when logging stops: zap (refault), in-place (collapse),
    /// off (stay split).
    #[arg(long, value_enum, default_value = "zap")]
    pub recover: RecoverArg,
    /// Run one more pass after logging stops and time it (how the huge
    /// pages came back shows there).
    #[arg(long)]
    pub after_pass: bool,
    /// Run on the host's real KVM instead of the engine.
    #[arg(long)]
    pub kvm: bool,
    /// Run the engine, real KVM and QEMU's arm64 model in one process and print the ratios
    /// per phase (a column that cannot run here is skipped with the reason).
    #[arg(long)]
    pub compare: bool,
    /// Run on QEMU's arm64 model: the engine as the stage-2 MMU of qemu-system-aarch64
    /// (s2mmu-arm64). Its timings are an emulator's, not hardware figures.
    #[arg(long, conflicts_with_all = ["kvm", "compare"])]
    pub arm64: bool,
    /// Check every pass's dirty log: with --kvm or --arm64, that it holds exactly the pages
    /// the guest wrote; on the engine, that no page whose content changed is missing from it
    /// (a lost write; pages hashed after each harvest). A mismatch fails the run.
    #[arg(long)]
    pub check: bool,
    /// Test-only fault injection for --check on the engine: drop this many dirty marks in
    /// the first logged pass (the check must then report lost writes).
    #[arg(long, default_value_t = 0, requires = "check")]
    pub inject_lost_marks: u64,
    /// Runs of each policy in the comparisons (-e, --policy both), alternating which goes
    /// first; the tables quote medians (default 5 with -e, 3 with --policy both). With
    /// --arm64: runs of the workload, each on a fresh QEMU (default 1).
    #[arg(short = 'r', long)]
    pub runs: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// No progress on stderr.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

/// One dirty iteration of the engine run.
#[derive(Clone, Debug, Default)]
pub struct EngineIteration {
    /// Wall time until the slowest vCPU finished the pass.
    pub dirty_memory: Duration,
    /// GET (or ring harvest) time.
    pub get: Duration,
    /// CLEAR (or ring reset) time, with manual protect or rings.
    pub clear: Option<Duration>,
    /// Pages the log reported dirty.
    pub pages_dirty: u64,
    /// Fault and lock counters of the pass, all vCPUs.
    pub faults: FaultStats,
    /// Sum over vCPUs of their pass times.
    pub vcpu_time: Duration,
    /// CPU time of the harvesting thread in GET and CLEAR (or the ring
    /// harvest and reset).
    pub harvest_cpu: Duration,
    /// With `--check` on the engine: pages changed in the pass, and those
    /// of them missing from the log.
    pub lost_writes: Option<lost::Round>,
}

/// One engine run.
#[derive(Clone, Debug, Default)]
pub struct EngineRun {
    /// Policy label.
    pub label: String,
    /// vCPUs.
    pub vcpus: usize,
    /// Populate memory time.
    pub populate: Duration,
    /// The median of three passes with logging off after populating, when
    /// asked for.
    pub off_pass: Option<Duration>,
    /// Enabling dirty logging time.
    pub enable: Duration,
    /// Iterations.
    pub iterations: Vec<EngineIteration>,
    /// Disabling dirty logging time.
    pub disable: Duration,
    /// With `--after-pass`: the first pass after logging stops, and the
    /// vCPU faults it took (huge pages refaulted or collapsed in place).
    pub after: Option<(Duration, FaultStats)>,
    /// Guest-physical test memory.
    pub test_gpa: (u64, u64),
    /// Counters of VM-wide operations (enable, clears): eager split time.
    pub vm_stats: FaultStats,
}

impl EngineRun {
    /// Phases named as `s2mmu_kvm::DirtyLogReport::phases` names them.
    pub fn phases(&self, ring: bool) -> Vec<(String, Duration)> {
        let (g, c) = if ring {
            ("harvest dirty ring", "reset dirty ring")
        } else {
            ("get dirty log", "clear dirty log")
        };
        let mut v = vec![
            ("populate memory".to_string(), self.populate),
            ("enabling dirty logging".to_string(), self.enable),
        ];
        for (i, it) in self.iterations.iter().enumerate() {
            let n = i + 1;
            v.push((format!("iteration {n} dirty memory"), it.dirty_memory));
            v.push((format!("iteration {n} {g}"), it.get));
            if let Some(cl) = it.clear {
                v.push((format!("iteration {n} {c}"), cl));
            }
        }
        v.push(("disabling dirty logging".to_string(), self.disable));
        v.push((
            format!("{g} total"),
            self.iterations.iter().map(|i| i.get).sum(),
        ));
        if self.iterations.iter().any(|i| i.clear.is_some()) {
            v.push((
                format!("{c} total"),
                self.iterations.iter().filter_map(|i| i.clear).sum(),
            ));
        }
        v
    }

    /// Fault counters of all dirty iterations.
    pub fn fault_totals(&self) -> FaultStats {
        let mut t = FaultStats::default();
        for it in &self.iterations {
            t.add(&it.faults);
        }
        t
    }

    /// The selftest's lines plus the engine's counters.
    pub fn lines(&self, ring: bool) -> Vec<String> {
        let s = secs;
        let mut out = vec![
            format!("Test iterations: {}", self.iterations.len()),
            format!("Engine: {}, {} vCPUs", self.label, self.vcpus),
            format!(
                "guest physical test memory: [{:#x}, {:#x})",
                self.test_gpa.0, self.test_gpa.1
            ),
            format!("Populate memory time: {}", s(self.populate)),
            format!("Enabling dirty logging time: {}", s(self.enable)),
            String::new(),
        ];
        let (g, c) = if ring {
            ("harvest dirty ring", "reset dirty ring")
        } else {
            ("get dirty log", "clear dirty log")
        };
        for (i, it) in self.iterations.iter().enumerate() {
            let n = i + 1;
            out.push(format!(
                "Iteration {n} dirty memory time: {}",
                s(it.dirty_memory)
            ));
            out.push(format!(
                "Iteration {n} faults: {} ({} fast, {} slow, {} split on fault), lock contentions {}, pages dirty {}",
                it.faults.permission + it.faults.translation,
                it.faults.fast,
                it.faults.slow,
                it.faults.splits_on_fault,
                it.faults.contentions(),
                it.pages_dirty
            ));
            out.push(format!("Iteration {n} {g} time: {}", s(it.get)));
            if let Some(cl) = it.clear {
                out.push(format!("Iteration {n} {c} time: {}", s(cl)));
            }
            if let Some(l) = it.lost_writes {
                out.push(format!(
                    "Iteration {n} lost-write check: {} pages changed, {} of them not in the log: {}",
                    l.changed,
                    l.lost,
                    if l.lost == 0 { "ok" } else { "LOST WRITES" }
                ));
            }
        }
        out.push(format!("Disabling dirty logging time: {}", s(self.disable)));
        if let Some((t, f)) = &self.after {
            out.push(format!(
                "Pass after logging stopped: {} ({} faults: {} translation; {} blocks collapsed in place)",
                s(*t),
                f.fast + f.slow,
                f.translation,
                self.vm_stats.collapsed
            ));
        }
        let n = self.iterations.len().max(1) as u32;
        let gt: Duration = self.iterations.iter().map(|i| i.get).sum();
        out.push(format!(
            "{} over {} iterations took {}. (Avg {}/iteration)",
            capitalise(g),
            self.iterations.len(),
            s(gt),
            s(gt / n)
        ));
        if self.iterations.iter().any(|i| i.clear.is_some()) {
            let ct: Duration = self.iterations.iter().filter_map(|i| i.clear).sum();
            out.push(format!(
                "{} over {} iterations took {}. (Avg {}/iteration)",
                capitalise(c),
                self.iterations.len(),
                s(ct),
                s(ct / n)
            ));
        }
        out
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// Seconds with nine decimals, as the selftests print them.
fn secs(d: Duration) -> String {
    format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
}

/// Engine-run settings derived from the options.
#[derive(Clone, Copy, Debug)]
struct RunSpec {
    vcpus: usize,
    bytes: u64,
    iterations: u32,
    backing: Backing,
    slots: u32,
    write_percent: u32,
    random: bool,
    policy: MmuPolicy,
    after_pass: bool,
    check: bool,
    inject_lost_marks: u64,
    format: FormatArg,
    /// Time passes with logging off before logging starts (their median).
    off_pass: bool,
}

fn policy_for(p: &Params, fault_path: FaultPath, eager: bool) -> MmuPolicy {
    MmuPolicy {
        fault_path,
        eager_split_chunk: eager.then_some(1 << 30),
        split_walk: SplitPolicy::SkipReturns,
        manual_protect: !p.no_manual_protect,
        // As the selftest: with manual protect it also asks for
        // INITIALLY_SET (KVM offers it on x86 and arm64), so enabling
        // logging protects nothing and iteration 1 takes no faults.
        initially_set: !p.no_manual_protect && p.ring.is_none(),
        dirty: match p.ring {
            Some(entries) => DirtyMode::Ring { entries },
            None => modes::dirty_mode(p.dirty_modes()[0]),
        },
        hw_dirty_blocks: modes::hw_dirty_blocks(p.dirty_modes()[0]),
        recover_huge_pages: p.recover != RecoverArg::Off,
        recover_in_place: p.recover == RecoverArg::InPlace,
        reader_slots: p.read_lock.reader_slots(),
        ..MmuPolicy::default()
    }
}

fn label(policy: &MmuPolicy, memslots: &str) -> String {
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
            DirtyMode::Ring { .. } => ", dirty ring",
            DirtyMode::Hardware if !policy.splits_for_logging() => {
                ", hardware dirty state, blocks logged whole"
            }
            DirtyMode::Hardware => ", hardware dirty state",
            DirtyMode::Pml => ", hardware dirty state with PML",
            DirtyMode::Bitmap => "",
        },
    )
}

/// Runs the selftest flow on the engine.
fn run_engine<S: MemslotStore + 'static, F: VmFormat>(
    spec: RunSpec,
    memslots: &str,
) -> Result<EngineRun, String> {
    let mem = spec.bytes * spec.vcpus as u64;
    let gpa_base = 1u64 << 32;
    let vm = Arc::new(
        Vm::<S, F>::new(VmConfig {
            mem_size: mem,
            backing: spec.backing,
            slots: spec.slots,
            gpa_base,
            policy: spec.policy,
            ..VmConfig::default()
        })
        .map_err(|e| e.to_string())?,
    );
    let mut run = EngineRun {
        label: label(&spec.policy, memslots),
        vcpus: spec.vcpus,
        test_gpa: (gpa_base, gpa_base + mem),
        ..EngineRun::default()
    };
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
    run.populate = t0.elapsed();
    // The workload's pattern from here on (populate writes every page in
    // order), so a pass with logging off runs the same accesses.
    let ctl = w.control();
    ctl.write_percent.store(
        u64::from(spec.write_percent),
        std::sync::atomic::Ordering::Relaxed,
    );
    ctl.random
        .store(spec.random, std::sync::atomic::Ordering::Relaxed);
    if spec.off_pass {
        // The median of three passes, as a logged run's figure is a median
        // of its passes.
        let mut t = (0..3)
            .map(|_| w.run_pass(|| {}))
            .collect::<Result<Vec<_>, _>>()?;
        t.sort();
        run.off_pass = Some(t[1]);
    }
    let t = Instant::now();
    vm.enable_dirty_logging().map_err(|e| e.to_string())?;
    run.enable = t.elapsed();
    let mmu = vm.mmu().clone();
    let ring = spec.policy.dirty.ring_entries().is_some();
    let mut prev = sum(&w.fault_stats());
    let mut prev_vcpu_time: Duration = w.pass_times().iter().flatten().sum();
    let mut bitmaps: Vec<Vec<u64>> = vm
        .slots()
        .iter()
        .map(|s| vec![0u64; (s.size / 4096).div_ceil(64) as usize])
        .collect();
    let mut reaped = Vec::new();
    let mut lost = spec
        .check
        .then(|| lost::LostWriteCheck::new(&vm))
        .transpose()?;
    mmu.inject_lost_marks(spec.inject_lost_marks);
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
        let cpu0 = modes::thread_cpu_time();
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
            if spec.policy.manual_protect {
                let t = Instant::now();
                for (s, bm) in vm.slots().iter().zip(bitmaps.iter()) {
                    mmu.clear_dirty_log(s.id, 0, s.size / 4096, bm)
                        .map_err(|e| e.to_string())?;
                }
                it.clear = Some(t.elapsed());
            }
        }
        it.harvest_cpu = modes::thread_cpu_time().saturating_sub(cpu0);
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

fn engine(spec: RunSpec, memslots: &str) -> Result<EngineRun, String> {
    match (memslots, spec.format) {
        ("array", FormatArg::Arm64) => run_engine::<ArrayMemslots, Arm64Stage2>(spec, memslots),
        ("array", FormatArg::Ept) => run_engine::<ArrayMemslots, EptFormat>(spec, memslots),
        (_, FormatArg::Arm64) => run_engine::<TreeMemslots, Arm64Stage2>(spec, memslots),
        (_, FormatArg::Ept) => run_engine::<TreeMemslots, EptFormat>(spec, memslots),
    }
}

fn kvm_params(p: &Params, vcpus: usize, bytes: u64) -> Result<s2mmu_kvm::DirtyLogParams, String> {
    let backing = s2mmu_kvm::Backing::from_selftest_name(p.backing.name())
        .map_err(|e| format!("backing {}: {e}", p.backing.name()))?;
    Ok(s2mmu_kvm::DirtyLogParams {
        vcpus: u32::try_from(vcpus).map_err(|_| "too many vCPUs".to_string())?,
        bytes_per_vcpu: bytes,
        iterations: p.iterations,
        backing,
        slots: p.slots,
        manual_protect: !p.no_manual_protect,
        write_percent: p.write_percent,
        dirty_ring_entries: p.ring,
        ..s2mmu_kvm::DirtyLogParams::default()
    })
}

fn phase_rows(report: &mut Report, phases: &[(String, Duration)], policy: &str) {
    for (name, d) in phases {
        report.result(name, policy, json!({"median_ns": d.as_nanos() as u64, "min_ns": d.as_nanos() as u64, "max_ns": d.as_nanos() as u64, "runs": 1}));
    }
}

/// Runs `dirty-log-perf` from the command line.
///
/// # Errors
/// A message naming what failed.
pub fn main(p: Params) -> Result<(), String> {
    let report = run(&p)?;
    crate::report::emit(&report, p.json);
    match report.failure() {
        Some(why) => Err(why.to_string()),
        None => Ok(()),
    }
}

/// Runs the benchmark and returns its report.
///
/// # Errors
/// A message naming what failed.
pub fn run(p: &Params) -> Result<Report, String> {
    let list = p.vcpus.len() > 1 || p.policy == PolicyArg::Both;
    let vcpus_list: Vec<usize> = if p.vcpus.is_empty() {
        if p.policy == PolicyArg::Both {
            vec![1, 2, 4, 8, 16, 32, 64]
        } else {
            vec![1]
        }
    } else {
        p.vcpus.clone()
    };
    modes::check_params(p)?;
    if p.check && !p.kvm && !p.arm64 && (p.ring.is_some() || p.compare) {
        return Err(
            "--check on the engine compares page contents with the dirty bitmaps: not with --ring or --compare".into(),
        );
    }
    let bytes = p
        .bytes_per_vcpu
        .unwrap_or(if list || p.arm64 { 64 << 20 } else { 1 << 30 });
    bounds::check(p, &vcpus_list, bytes)?;
    // Runs take from a second to minutes: say what runs before it does
    // (not before --arm64's one-line refusal where QEMU cannot run).
    let _progress = (!p.arm64 || crate::arm64::unavailable().is_none()).then(|| {
        crate::progress::Progress::new(
            "dirty-log-perf",
            (vcpus_list.len() as u64).saturating_mul(u64::from(p.iterations)),
            !p.quiet,
        )
    });
    let params = json!({
        "vcpus": vcpus_list, "bytes_per_vcpu": bytes, "iterations": p.iterations,
        "backing": p.backing.name(), "slots": p.slots, "manual_protect": !p.no_manual_protect,
        "eager_split": p.eager_split, "write_percent": p.write_percent, "random": p.random,
        "policy": format!("{:?}", p.policy).to_lowercase(), "memslots": p.memslots,
        "ring": p.ring, "dirty": p.dirty_modes().iter().map(|d| modes::name(*d)).collect::<Vec<_>>(), "format": p.format.name(), "recover": format!("{:?}", p.recover).to_lowercase(), "after_pass": p.after_pass, "kvm": p.kvm, "compare": p.compare, "arm64": p.arm64, "check": p.check,
        "runs": p.runs,
    });
    let mut report = Report::new("dirty-log-perf", params);
    let mut text = String::new();
    let spec = |vcpus: usize, fault_path: FaultPath, eager: bool| RunSpec {
        vcpus,
        bytes,
        iterations: p.iterations,
        backing: p.backing,
        slots: p.slots,
        write_percent: p.write_percent,
        random: p.random,
        policy: policy_for(p, fault_path, eager),
        after_pass: p.after_pass,
        check: p.check && !p.kvm && !p.arm64,
        inject_lost_marks: p.inject_lost_marks,
        format: p.format,
        off_pass: false,
    };
    let ring = p.ring.is_some();
    let huge = p.backing != Backing::Anonymous;

    if p.dirty_modes().len() > 1 {
        text += &modes::table(p, vcpus_list[0], bytes, spec, &mut report)?;
    } else if p.arm64 {
        text += &arm64::run(p, &vcpus_list, bytes, &mut report)?;
    } else if p.kvm && !p.compare {
        for &v in &vcpus_list {
            let kp = kvm_params(p, v, bytes)?;
            let r = if p.check {
                let c = s2mmu_kvm::check_dirty_log(&kp).map_err(|e| e.to_string())?;
                for i in &c.iterations {
                    text += &format!(
                        "check iteration {}: {} pages written, {} reported, {} missing, {} extra: {}\n",
                        i.iteration,
                        i.written,
                        i.reported,
                        i.missing,
                        i.extra,
                        if i.passes() { "ok" } else { "FAILED" }
                    );
                    report.result(
                        &format!("check_iteration_{}", i.iteration),
                        "kvm",
                        json!({"written": i.written, "reported": i.reported,
                               "missing": i.missing, "extra": i.extra, "passes": i.passes()}),
                    );
                }
                if let Some(f) = c.first_failure() {
                    return Err(format!("dirty log check failed on real KVM: {f}"));
                }
                c.run
            } else {
                s2mmu_kvm::dirty_log_perf::run(&kp).map_err(|e| e.to_string())?
            };
            for l in r.selftest_lines() {
                text += &l;
                text.push('\n');
            }
            phase_rows(&mut report, &r.phases(), "kvm");
        }
    } else if p.compare {
        let v = vcpus_list[0];
        // Which columns can run, decided before anything runs.
        // -r means nothing to --compare: one run of each column.
        let one_run = Params {
            runs: None,
            ..p.clone()
        };
        let arm64_plan = arm64::plan(&one_run, &[v], bytes).and_then(|mut plan| {
            if let Some(why) = crate::arm64::unavailable() {
                return Err(why);
            }
            // The engine column's policy.
            plan.policy.fault_path = FaultPath::ReadLockFastPath;
            plan.runs = 1;
            Ok(plan)
        });
        let kvm_skip = s2mmu_kvm::kvm_unusable_reason();
        let kp = kvm_params(p, v, bytes)?;
        let e = engine(
            spec(v, FaultPath::ReadLockFastPath, p.eager_split),
            &p.memslots,
        )?;
        let k = match kvm_skip {
            None => Ok(s2mmu_kvm::dirty_log_perf::run(&kp).map_err(|e| e.to_string())?),
            Some(why) => Err(why),
        };
        let a = match arm64_plan {
            Ok(plan) => {
                let r = arm64::run_one(p, &plan, v, bytes)?;
                let run = arm64::as_engine_run(&r, &plan, v, bytes);
                Ok((r, run))
            }
            Err(why) => Err(why),
        };
        text += &compare_text(p, v, bytes, &e, &k, &a, &mut report);
    } else if p.policy == PolicyArg::Both {
        text += &both_table(p, &vcpus_list, bytes, spec, &mut report)?;
    } else if p.eager_split && huge {
        text += &eager_vs_fault(p, vcpus_list[0], bytes, spec, &mut report)?;
    } else {
        let fp = if p.policy == PolicyArg::Baseline {
            FaultPath::WriteLock
        } else {
            FaultPath::ReadLockFastPath
        };
        for &v in &vcpus_list {
            let r = engine(spec(v, fp, p.eager_split), &p.memslots)?;
            for l in r.lines(ring) {
                text += &l;
                text.push('\n');
            }
            let pol = if fp == FaultPath::WriteLock {
                "write_lock"
            } else {
                "fast_path"
            };
            phase_rows(&mut report, &r.phases(ring), pol);
            text += &single_target(&r, v, bytes);
            lost_rows(&mut report, &r, v);
        }
    }
    report.set_text(text);
    Ok(report)
}

/// The lost-write check's rows, and the run's failure if a write was lost.
fn lost_rows(report: &mut Report, r: &EngineRun, vcpus: usize) {
    let mut total = 0;
    for (i, it) in r.iterations.iter().enumerate() {
        if let Some(l) = it.lost_writes {
            report.result(
                &format!("lost_write_check_iteration_{}", i + 1),
                "engine",
                json!({"vcpus": vcpus, "changed": l.changed, "lost": l.lost}),
            );
            total += l.lost;
        }
    }
    if total > 0 {
        report.fail(format!(
            "lost-write check: {total} pages changed without being in the dirty log"
        ));
    }
}

/// The single-run target: 1 vCPU, 256 MiB, a dirty pass of 65536
/// write-protection faults within 50 ms.
fn single_target(r: &EngineRun, vcpus: usize, bytes: u64) -> String {
    let Some(it) = r
        .iterations
        .iter()
        .skip(1)
        .chain(r.iterations.first())
        .next()
    else {
        return String::new();
    };
    let faults = it.faults.permission + it.faults.translation;
    let per = if faults > 0 {
        it.dirty_memory.as_nanos() as f64 / faults as f64
    } else {
        0.0
    };
    let mut s = format!("Per fault (pass time / faults): {per:.0} ns over {faults} faults\n");
    if vcpus == 1 && bytes == 256 << 20 {
        s += &format!(
            "target: 1 vCPU, 256 MiB dirty pass within 50 ms: {} ({})\n",
            human(it.dirty_memory),
            verdict(it.dirty_memory <= Duration::from_millis(50))
        );
    }
    s
}

fn median_dirty(r: &EngineRun) -> Duration {
    // Iteration 1 after enabling logging includes first-touch effects of
    // protection; the steady state is the later iterations when there are any.
    let its: Vec<Duration> = r
        .iterations
        .iter()
        .skip(usize::from(r.iterations.len() > 1))
        .map(|i| i.dirty_memory)
        .collect();
    crate::report::Summary::of(&its).median
}

fn both_table(
    p: &Params,
    vcpus_list: &[usize],
    bytes: u64,
    spec: impl Fn(usize, FaultPath, bool) -> RunSpec,
    report: &mut Report,
) -> Result<String, String> {
    let runs = p.runs.unwrap_or(3).max(1) as usize;
    let mut s = format!(
        "dirty-log-perf: read-lock fast path against write-lock faults, {} per vCPU, {}, {} iterations; dirty memory time: median of iterations after the first, then median of {runs} runs of each policy, alternating\n",
        human_bytes(bytes),
        p.backing.name(),
        p.iterations
    );
    s += "fast = read-lock fast path, vCPUs on their own reader slots (s2mmu); rwlock = the same fast path on a shared reader count (KVM's mmu_lock); write = every fault under the write lock (the baseline)\n";
    if p.backing != Backing::Anonymous && !p.eager_split {
        s += "note: huge-page backing without -e: the measured pass splits every block on fault, so all three policies map pages under the write lock; add -e to split eagerly and measure the fast path\n";
    }
    s += &format!(
        "{:>6} | {:>12} {:>11} {:>10} | {:>12} | {:>12} {:>11} {:>10} | {:>9} {:>9} {:>11}\n",
        "vCPUs",
        "fast: dirty",
        "contentions",
        "lock wait",
        "rwlock:dirty",
        "write: dirty",
        "contentions",
        "lock wait",
        "write/fast",
        "write/rw",
        "cont. ratio"
    );
    // The three policies, in the order of the table's column groups.
    let policies: [(&str, FaultPath, usize); 3] = [
        (
            "fast_path",
            FaultPath::ReadLockFastPath,
            ReadLockArg::Slots.reader_slots(),
        ),
        ("fast_path_rwlock", FaultPath::ReadLockFastPath, 0),
        (
            "write_lock",
            FaultPath::WriteLock,
            ReadLockArg::Slots.reader_slots(),
        ),
    ];
    let mut lines = Vec::new();
    for &v in vcpus_list {
        // Per policy, per run: the dirty memory time and the fault counters.
        let mut got: [Vec<(Duration, FaultStats)>; 3] = Default::default();
        for r in 0..runs {
            for k in 0..3 {
                let i = (k + r) % 3;
                let (_, fp, slots) = policies[i];
                let mut sp = spec(v, fp, p.eager_split);
                sp.policy.reader_slots = slots;
                let run = engine(sp, &p.memslots)?;
                got[i].push((median_dirty(&run), run.fault_totals()));
            }
        }
        // Medians of the dirty time, the contentions and the lock wait.
        let med = |v: &[(Duration, FaultStats)]| {
            let d = Summary::of(&v.iter().map(|x| x.0).collect::<Vec<_>>());
            let median = |f: fn(&FaultStats) -> u64| {
                let mut x: Vec<u64> = v.iter().map(|r| f(&r.1)).collect();
                x.sort_unstable();
                x[x.len() / 2]
            };
            (
                d,
                median(FaultStats::contentions),
                median(|t| t.lock_wait_ns),
            )
        };
        let m = [med(&got[0]), med(&got[1]), med(&got[2])];
        for (i, (pol, _, _)) in policies.iter().enumerate() {
            let t = got[i][0].1;
            report.result(
                &format!("vcpus_{v}"),
                pol,
                report::merge(
                    m[i].0.json(),
                    json!({"vcpus": v, "contentions": m[i].1, "lock_wait_ns": m[i].2,
                           "faults": t.permission + t.translation, "fast_faults": t.fast, "slow_faults": t.slow}),
                ),
            );
        }
        let secs =
            |v: &[(Duration, FaultStats)]| v.iter().map(|x| x.0.as_secs_f64()).collect::<Vec<_>>();
        let (fast, rw, write) = (secs(&got[0]), secs(&got[1]), secs(&got[2]));
        let speedup = paired_ratio(&fast, &write).unwrap_or(0.0);
        let speedup_rw = paired_ratio(&rw, &write).unwrap_or(0.0);
        report.compare(
            &format!("vcpus_{v}"),
            "median_ns",
            m[2].0.median.as_nanos() as f64,
            m[0].0.median.as_nanos() as f64,
        );
        report.compare(
            &format!("vcpus_{v}_rwlock"),
            "median_ns",
            m[2].0.median.as_nanos() as f64,
            m[1].0.median.as_nanos() as f64,
        );
        report.compare(
            &format!("vcpus_{v}"),
            "contentions",
            m[2].1 as f64,
            m[0].1.max(1) as f64,
        );
        let ratio = m[2].1 as f64 / m[0].1.max(1) as f64;
        let ratio_text = if m[0].1 == 0 && m[2].1 > 0 {
            "none vs N".to_string()
        } else {
            format!("{ratio:.1}x")
        };
        s += &format!(
            "{:>6} | {:>12} {:>11} {:>10} | {:>12} | {:>12} {:>11} {:>10} | {:>8.2}x {:>8.2}x {:>11}\n",
            v,
            human(m[0].0.median),
            m[0].1,
            human(Duration::from_nanos(m[0].2)),
            human(m[1].0.median),
            human(m[2].0.median),
            m[2].1,
            human(Duration::from_nanos(m[2].2)),
            speedup,
            speedup_rw,
            ratio_text
        );
        if v == 8 {
            lines.push(format!(
                "target (8 vCPUs): >= 10x fewer contentions and a lower dirty memory time: {} vs {} contentions, {speedup:.2}x time, median of {runs} paired runs ({}); with KVM's shared rwlock: {speedup_rw:.2}x",
                m[0].1,
                m[2].1,
                verdict(ratio >= 10.0 && speedup > 1.0)
            ));
        }
    }
    for l in lines {
        s += &l;
        s.push('\n');
    }
    s += &format!(
        "(machine: {} logical CPUs; vCPUs beyond that share them)\n",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    Ok(s)
}

/// One figure of an engine run.
type RunMetric<'a> = dyn Fn(&EngineRun) -> Duration + 'a;

fn eager_vs_fault(
    p: &Params,
    vcpus: usize,
    bytes: u64,
    spec: impl Fn(usize, FaultPath, bool) -> RunSpec,
    report: &mut Report,
) -> Result<String, String> {
    // The pass that meets the write protection: the first after enabling, or with
    // KVM_DIRTY_LOG_INITIALLY_SET (manual protect, the default) the first after a CLEAR,
    // which is where KVM then write-protects and eagerly splits.
    let wp = usize::from(policy_for(p, FaultPath::ReadLockFastPath, true).initially_set);
    if p.iterations as usize <= wp {
        return Err(format!(
            "-e with manual protect needs at least {} iterations (-i): the first pass after a clear is the one measured; or use -g",
            wp + 1
        ));
    }
    let runs = p.runs.unwrap_or(5).max(1) as usize;
    // Both policies in one process, alternating which goes first, so a slow
    // stretch of this shared machine lands on both.
    let (mut eager, mut lazy) = (Vec::new(), Vec::new());
    for r in 0..runs {
        for e in [r % 2 == 0, r % 2 == 1] {
            let run = engine(spec(vcpus, FaultPath::ReadLockFastPath, e), &p.memslots)?;
            if e {
                eager.push(run);
            } else {
                lazy.push(run);
            }
        }
    }
    let first = |r: &EngineRun| {
        r.iterations
            .get(wp)
            .map(|i| i.dirty_memory)
            .unwrap_or_default()
    };
    let split_cpu = |r: &EngineRun| {
        Duration::from_nanos(
            r.vm_stats.split_ns + r.iterations.iter().map(|i| i.faults.split_ns).sum::<u64>(),
        )
    };
    let vcpu_cpu = |r: &EngineRun| {
        r.iterations
            .get(wp)
            .map(|i| i.vcpu_time)
            .unwrap_or_default()
    };
    let enable = |r: &EngineRun| r.enable;
    let mut s = format!(
        "dirty-log-perf -e: eager split against split on fault, {vcpus} vCPUs x {}, {} (seed 004); measured pass: iteration {} ({}); medians of {runs} runs of each, alternating\n",
        human_bytes(bytes),
        p.backing.name(),
        wp + 1,
        if wp == 0 { "first after enabling logging" } else { "first after a clear, initially-set" }
    );
    s += &format!(
        "{:<46} {:>14} {:>14} {:>9}\n",
        "", "eager split", "split on fault", "ratio"
    );
    let rows: [(&str, &RunMetric<'_>); 4] = [
        ("vCPUs dirty their memory, first protected pass", &first),
        ("CPU time spent splitting", &split_cpu),
        ("vCPU CPU time in that first pass", &vcpu_cpu),
        ("enabling dirty logging", &enable),
    ];
    let secs = |runs: &[EngineRun], f: &RunMetric<'_>| {
        runs.iter().map(|r| f(r).as_secs_f64()).collect::<Vec<_>>()
    };
    for (name, f) in rows {
        let e: Vec<Duration> = eager.iter().map(f).collect();
        let l: Vec<Duration> = lazy.iter().map(f).collect();
        let (es, ls) = (Summary::of(&e), Summary::of(&l));
        // The ratio of each pair of runs, then its median.
        let ratio = paired_ratio(&secs(&eager, f), &secs(&lazy, f));
        let ratio_text = ratio.map_or("-".to_string(), |r| format!("{r:.2}x"));
        s += &format!(
            "{name:<46} {:>14} {:>14} {ratio_text:>9}\n",
            human(es.median),
            human(ls.median),
        );
        let case = name.replace([' ', ','], "_").replace("__", "_");
        report.result(&case, "eager_split", es.json());
        report.result(&case, "split_on_fault", ls.json());
        report.compare(
            &case,
            "median_ns",
            ls.median.as_nanos() as f64,
            es.median.as_nanos() as f64,
        );
    }
    let splits: u64 = lazy
        .iter()
        .flat_map(|r| &r.iterations)
        .map(|i| i.faults.splits_on_fault)
        .sum::<u64>()
        / runs as u64;
    s += &format!(
        "splits on fault: {splits} per run (each under the write lock on a vCPU thread)\n"
    );
    let all = paired_ratios(&secs(&eager, &first), &secs(&lazy, &first));
    let ratio = all.get(all.len() / 2).copied().unwrap_or(0.0);
    s += &format!(
        "first-pass ratio per run: {}\n",
        all.iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if vcpus == 2 && p.backing.page_size() == 2 << 20 {
        s += &format!(
            "target (2 MiB backing, 2 vCPUs): first dirty pass >= 5x faster with eager split: {ratio:.2}x, median of {runs} paired runs ({})\n",
            verdict(ratio >= 5.0)
        );
    } else {
        s += &format!(
            "first dirty pass {ratio:.2}x faster with eager split, median of {runs} paired runs (the target is set for 2 vCPUs on 2 MiB backing)\n"
        );
    }
    if let Some(run) = eager.first() {
        for l in run.lines(p.ring.is_some()) {
            report.result("eager_detail", "eager_split", json!({"line": l}));
        }
    }
    Ok(s)
}

/// A column of `--compare`: its run, or why it was skipped.
type Column<T> = Result<T, String>;

fn compare_text(
    p: &Params,
    vcpus: usize,
    bytes: u64,
    e: &EngineRun,
    k: &Column<s2mmu_kvm::DirtyLogReport>,
    a: &Column<(s2mmu_arm64::workload::DirtyReport, EngineRun)>,
    report: &mut Report,
) -> String {
    let ring = p.ring.is_some();
    let ep = e.phases(ring);
    let kp = k.as_ref().map(|k| k.phases()).unwrap_or_default();
    let ap = a.as_ref().map(|a| a.1.phases(ring)).unwrap_or_default();
    phase_rows(report, &ep, "engine");
    phase_rows(report, &kp, "kvm");
    match a {
        Ok(run) => arm64::rows(report, vcpus, std::slice::from_ref(run), ring),
        Err(why) => report.result("column_skipped", "arm64", json!({"reason": why})),
    }
    if let Err(why) = k {
        report.result("column_skipped", "kvm", json!({"reason": why}));
    }
    let host = s2mmu_kvm::HostInfo::detect();
    let mut s = format!(
        "dirty_log_perf: s2mmu engine vs host KVM vs QEMU's arm64 model, {vcpus} vCPU(s) x {}, {}, {} slot(s), {} iterations{}\n",
        human_bytes(bytes),
        p.backing.name(),
        p.slots,
        p.iterations,
        if p.no_manual_protect { ", no manual protect" } else { ", manual protect" }
    );
    s += &format!("host: {}\n", host.one_line());
    s += &format!("engine: {}\n", e.label);
    if let Err(why) = k {
        s += &format!("KVM column skipped: {why}\n");
    }
    match a {
        Ok(_) => s += &format!("arm64: the engine as the stage-2 MMU of qemu-system-aarch64 ({} CPUs: {vcpus} vCPU(s) + 1 service CPU); {}\n", vcpus + 1, crate::arm64::EMULATOR_NOTE.trim_start_matches("note: ")),
        Err(why) => s += &format!("arm64 column skipped: {why}\n"),
    }
    s += &format!(
        "\n{:<34} {:>16} {:>16} {:>16} {:>10} {:>12}\n",
        "phase", "s2mmu engine", "KVM", "arm64 (QEMU)", "KVM/engine", "arm64/engine"
    );
    let find =
        |v: &[(String, Duration)], name: &str| v.iter().find(|(n, _)| n == name).map(|(_, d)| *d);
    let ratio = |x: Duration, d: Duration| x.as_secs_f64() / d.as_secs_f64().max(1e-12);
    for (name, d) in &ep {
        let kd = find(&kp, name);
        let ad = find(&ap, name);
        if kd.is_none() && ad.is_none() && (k.is_ok() || a.is_ok()) {
            continue;
        }
        if let Some(kd) = kd {
            report.compare(name, "median_ns", kd.as_nanos() as f64, d.as_nanos() as f64);
        }
        if let Some(ad) = ad {
            report.compare(
                name,
                "median_ns_arm64",
                ad.as_nanos() as f64,
                d.as_nanos() as f64,
            );
        }
        let cell = |x: Option<Duration>| x.map_or("-".to_string(), secs);
        let rcell =
            |x: Option<Duration>| x.map_or("-".to_string(), |x| format!("{:.2}x", ratio(x, *d)));
        s += &format!(
            "{name:<34} {:>16} {:>16} {:>16} {:>10} {:>12}\n",
            secs(*d),
            cell(kd),
            cell(ad),
            rcell(kd),
            rcell(ad),
        );
    }
    for (i, it) in e.iterations.iter().enumerate() {
        let ef = it.faults.permission + it.faults.translation;
        let mut line = format!("iteration {} faults: engine {ef}", i + 1);
        if let Ok(k) = k {
            if let Some(kit) = k.iterations.get(i) {
                let kf = kit
                    .exits
                    .kvm
                    .pf_fixed
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "n/a".into());
                line += &format!(", KVM pf_fixed {kf} (pages written {})", kit.pages_written);
            }
        }
        if let Ok((r, _)) = a {
            if let Some(ap) = r.passes.get(i) {
                line += &format!(", arm64 pages logged {}", ap.logged);
            }
        }
        s += &line;
        s.push('\n');
    }
    if let Ok((r, _)) = a {
        let f = &r.faults;
        s += &format!(
            "arm64 faults, all passes (populate included): {} ({} fast, {} slow)\n",
            f.permission + f.translation,
            f.fast,
            f.slow
        );
        for l in arm64::round_trip_lines(r) {
            s += &l;
            s.push('\n');
        }
    }
    if k.is_ok() {
        s += "(KVM/engine > 1: the engine's simulated path is faster than a real KVM exit per fault)\n";
    }
    if a.is_ok() {
        s += "(arm64/engine: QEMU's emulated arm64 guest with the engine as its stage-2 MMU against the simulated VM; an emulator's time, so read it as a ratio on this machine, not as arm64 speed)\n";
    }
    s
}
