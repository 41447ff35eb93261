//! Dirty logging end to end on simulated vCPUs.

use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptStage2;
use s2mmu::memslot::{ArrayMemslots, MemslotStore, TreeMemslots};
use s2mmu::mmu::{DirtyMode, FaultPath, MmuPolicy, Protect, PML_LOG_ENTRIES};
use s2mmu_vm::{
    Backing, GuestMemory, KnownFormat, Pattern, Vm, VmConfig, Workload, WorkloadConfig,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

fn vm<S: MemslotStore>(mem: u64, backing: Backing, slots: u32, policy: MmuPolicy) -> Arc<Vm<S>> {
    vm_on::<S, Arm64Stage2>(mem, backing, slots, policy)
}

/// A VM whose vCPUs walk tables of format `F`.
fn vm_on<S: MemslotStore, F: KnownFormat>(
    mem: u64,
    backing: Backing,
    slots: u32,
    policy: MmuPolicy,
) -> Arc<Vm<S, F>> {
    Arc::new(
        Vm::new(VmConfig {
            mem_size: mem,
            backing,
            slots,
            policy,
            ..VmConfig::default()
        })
        .unwrap(),
    )
}

fn workload<S: MemslotStore + 'static, F: KnownFormat>(
    vm: &Arc<Vm<S, F>>,
    vcpus: usize,
    pattern: Pattern,
) -> Workload<S, F> {
    let per = vm.config().mem_size / vcpus as u64;
    Workload::start(
        vm.clone(),
        vcpus,
        WorkloadConfig {
            bytes_per_vcpu: per,
            write_percent: 100,
            pattern,
            page_size: 4096,
        },
    )
    .unwrap()
}

/// Dirty pages of every slot, through GET (+ CLEAR with manual protect).
fn harvest<S: MemslotStore, F: KnownFormat>(vm: &Vm<S, F>) -> Vec<u64> {
    let mmu = vm.mmu();
    let mut gpas = Vec::new();
    for s in vm.slots() {
        let pages = s.size / 4096;
        let mut bm = vec![0u64; pages.div_ceil(64) as usize];
        mmu.get_dirty_log(s.id, &mut bm).unwrap();
        if mmu.policy().dirty.manual_protect() {
            mmu.clear_dirty_log(s.id, 0, pages, &bm).unwrap();
        }
        for (w, &word) in bm.iter().enumerate() {
            let mut m = word;
            while m != 0 {
                let b = m.trailing_zeros() as u64;
                gpas.push(s.gpa + (w as u64 * 64 + b) * 4096);
                m &= m - 1;
            }
        }
    }
    gpas
}

#[test]
fn every_written_page_is_logged_and_nothing_else() {
    logs_every_written_page::<Arm64Stage2>();
}

#[test]
fn every_written_page_is_logged_and_nothing_else_on_ept() {
    logs_every_written_page::<EptStage2>();
}

fn logs_every_written_page<F: KnownFormat>() {
    for (manual, dirty) in [
        (true, DirtyMode::WP),
        (false, DirtyMode::WP),
        (true, DirtyMode::HW),
        (false, DirtyMode::HW),
        (true, DirtyMode::PML),
        (false, DirtyMode::PML),
    ] {
        let policy = MmuPolicy {
            dirty: dirty.with_protect(Protect::manual_if(manual)),
            ..MmuPolicy::default()
        };
        let vm = vm_on::<TreeMemslots, F>(16 * MIB, Backing::Anonymous, 2, policy);
        let w = workload(&vm, 1, Pattern::Sequential);
        w.run_pass(|| {}).unwrap(); // populate
        vm.enable_dirty_logging().unwrap();
        assert!(
            harvest(&vm).is_empty(),
            "nothing dirty before the guest writes"
        );
        for _ in 0..3 {
            w.run_pass(|| {}).unwrap();
            let got = harvest(&vm);
            assert_eq!(
                got.len() as u64,
                16 * MIB / 4096,
                "manual={manual} {dirty:?}"
            );
        }
        assert!(harvest(&vm).is_empty(), "a harvest clears the log");
        let st = w.stop();
        let f = st[0];
        // Populate: one translation fault per page; then, with write
        // protection, one fault per page per pass, all on the fast path;
        // with hardware dirty state the walker records every write itself.
        assert_eq!(f.translation, 4096);
        let per_pass = if dirty.hardware() { 0 } else { 4096 };
        assert_eq!(f.permission, 3 * per_pass);
        assert_eq!(f.fast, 3 * per_pass);
        // (With PML, the pages its exits flushed are marked by the vCPU.)
        assert_eq!(f.dirtied, 3 * per_pass + f.pml_entries);
        // PML: 4096 pages a pass fill the 512-entry log 8 times; the first
        // 7 fills end in a log-full exit at the next write, the last is
        // flushed by the harvest. Nothing is logged before logging starts
        // (writable leaves are made dirty).
        let exits = if dirty.pml() { 3 * 7 } else { 0 };
        assert_eq!(f.pml_full_exits, exits, "{} {dirty:?}", F::NAME);
        let entries = if dirty.pml() { 3 * 4096 } else { 0 };
        assert_eq!(f.pml_entries, exits * PML_LOG_ENTRIES as u64);
        assert!(f.pml_entries <= entries);
    }
}

#[test]
fn a_pml_full_exit_mid_pass_loses_nothing() {
    // One vCPU writes 1000 pages: the log fills at page 512 and exits at
    // page 513, in the middle of the pass; the harvest then finds every
    // page exactly once, the first 512 from the exit's flush and the rest
    // from the log.
    let policy = MmuPolicy {
        dirty: DirtyMode::PML,
        ..MmuPolicy::default()
    };
    let vm = vm_on::<TreeMemslots, EptStage2>(4 * MIB, Backing::Anonymous, 1, policy);
    let mut vcpu = vm.new_vcpu().unwrap();
    let base = vm.slots()[0].gpa;
    for p in 0..1024u64 {
        vcpu.write_u64(base + p * 4096, p).unwrap(); // populate
    }
    // Out of guest mode, or this thread's invalidations would wait for it.
    vcpu.exit();
    vm.enable_dirty_logging().unwrap();
    harvest(&vm);
    for round in 0..2u64 {
        for p in 0..1000u64 {
            vcpu.write_u64(base + p * 4096 + 8, round).unwrap();
            let exits = vcpu.fault_stats().pml_full_exits;
            assert_eq!(exits, round + u64::from(p >= 512), "round {round} page {p}");
        }
        vcpu.exit();
        let log = vcpu.fault_stats();
        assert_eq!(log.permission + log.translation, 1024, "populate only");
        let got = harvest(&vm);
        let want: Vec<u64> = (0..1000).map(|p| base + p * 4096).collect();
        assert_eq!(got, want, "round {round}");
    }
}

#[test]
fn baseline_policy_takes_the_write_lock_for_every_fault() {
    let vm = vm::<ArrayMemslots>(8 * MIB, Backing::Anonymous, 1, MmuPolicy::baseline());
    let w = workload(&vm, 2, Pattern::Sequential);
    w.run_pass(|| {}).unwrap();
    vm.enable_dirty_logging().unwrap();
    w.run_pass(|| {}).unwrap();
    assert_eq!(harvest(&vm).len() as u64, 8 * MIB / 4096);
    let st = w.stop();
    let total: u64 = st.iter().map(|s| s.write_locks).sum();
    let fast: u64 = st.iter().map(|s| s.fast).sum();
    assert_eq!(fast, 0);
    assert_eq!(
        total,
        2 * 8 * MIB / 4096,
        "one write lock per fault, populate and dirty pass"
    );
}

#[test]
fn huge_pages_are_split_eagerly_or_on_fault_and_never_writable_while_logged() {
    for eager in [Some(1u64 << 30), None] {
        let policy = MmuPolicy {
            eager_split_chunk: eager,
            ..MmuPolicy::default()
        };
        let vm = vm::<TreeMemslots>(16 * MIB, Backing::AnonymousThp, 1, policy);
        let w = workload(&vm, 2, Pattern::Sequential);
        w.run_pass(|| {}).unwrap();
        let blocks = vm
            .mmu()
            .with_table(|pt| pt.leaves(1 << 32, 16 * MIB).unwrap());
        assert_eq!(blocks.len(), 8, "populate maps 2 MiB blocks over THP");
        vm.enable_dirty_logging().unwrap();
        let after = vm
            .mmu()
            .with_table(|pt| pt.leaves(1 << 32, 16 * MIB).unwrap());
        assert!(
            after.iter().all(|l| !l.prot.contains(s2mmu::Prot::W)),
            "all protected"
        );
        if eager.is_some() {
            assert_eq!(after.len(), 4096, "eager split leaves pages only");
        } else {
            assert_eq!(after.len(), 8, "blocks stay until a write faults");
        }
        w.run_pass(|| {}).unwrap();
        assert_eq!(harvest(&vm).len(), 4096);
        let leaves = vm
            .mmu()
            .with_table(|pt| pt.leaves(1 << 32, 16 * MIB).unwrap());
        assert!(
            leaves.iter().all(|l| l.size == 4096),
            "no huge mapping while logged"
        );
        let st = w.stop();
        let splits: u64 = st.iter().map(|s| s.splits_on_fault).sum();
        assert_eq!(splits, if eager.is_some() { 0 } else { 8 });
        // Disabling logging lets faults map blocks again.
        vm.disable_dirty_logging().unwrap();
        let w = workload(&vm, 1, Pattern::Sequential);
        w.run_pass(|| {}).unwrap();
        let leaves = vm
            .mmu()
            .with_table(|pt| pt.leaves(1 << 32, 16 * MIB).unwrap());
        assert_eq!(leaves.len(), 8, "blocks are back after logging stops");
        drop(w);
    }
}

#[test]
fn initially_set_protects_lazily_through_clear() {
    let policy = MmuPolicy {
        dirty: DirtyMode::Bitmap {
            protect: Protect::Manual {
                initially_set: true,
            },
        },
        ..MmuPolicy::default()
    };
    let vm = vm::<TreeMemslots>(8 * MIB, Backing::AnonymousThp, 1, policy);
    let w = workload(&vm, 1, Pattern::Sequential);
    w.run_pass(|| {}).unwrap();
    vm.enable_dirty_logging().unwrap();
    // Everything reads dirty first; nothing was protected yet.
    assert_eq!(harvest(&vm).len(), 2048);
    let leaves = vm
        .mmu()
        .with_table(|pt| pt.leaves(1 << 32, 8 * MIB).unwrap());
    assert_eq!(
        leaves.len(),
        2048,
        "the clear split the blocks (eager split on)"
    );
    assert!(leaves.iter().all(|l| !l.prot.contains(s2mmu::Prot::W)));
    w.run_pass(|| {}).unwrap();
    assert_eq!(harvest(&vm).len(), 2048);
}

#[test]
fn clear_dirty_log_checks_its_arguments() {
    let vm = vm::<TreeMemslots>(4 * MIB, Backing::Anonymous, 1, MmuPolicy::default());
    let mmu = vm.mmu();
    let bm = vec![u64::MAX; 16];
    assert_eq!(
        mmu.clear_dirty_log(0, 0, 1024, &bm),
        Err(s2mmu::Error::LoggingDisabled { slot: 0 })
    );
    vm.enable_dirty_logging().unwrap();
    assert_eq!(
        mmu.clear_dirty_log(0, 1, 64, &bm),
        Err(s2mmu::Error::ClearNotAligned { first_page: 1 })
    );
    assert!(matches!(
        mmu.clear_dirty_log(0, 0, 65, &bm),
        Err(s2mmu::Error::ClearBadRange { .. })
    ));
    assert!(matches!(
        mmu.clear_dirty_log(0, 0, 1024, &bm[..3]),
        Err(s2mmu::Error::BitmapTooSmall { .. })
    ));
    assert_eq!(
        mmu.clear_dirty_log(9, 0, 64, &bm),
        Err(s2mmu::Error::NoSuchSlot { slot: 9 })
    );
    assert_eq!(
        mmu.clear_dirty_log(0, 0, 1024, &bm),
        Ok(0),
        "nothing dirty yet"
    );
}

/// The stress test: vCPUs write without pause while the host harvests and
/// copies dirty pages to a mirror (as a migration would), toggles logging
/// (a full copy restarts tracking) and splits. At the end, with vCPUs
/// paused and a last harvest copied, the mirror must equal guest memory:
/// a dirty write that was not logged would leave a stale page.
fn stress<S: MemslotStore + 'static>(
    policy: MmuPolicy,
    backing: Backing,
    vcpus: usize,
    pattern: Pattern,
) {
    stress_on::<S, Arm64Stage2>(policy, backing, vcpus, pattern);
}

/// The stress run's length and vCPU count from the environment:
/// `S2MMU_STRESS_SECS` (default 1) and `S2MMU_STRESS_VCPUS`, more vCPUs on
/// a machine with the cores for them (a power of two up to 64, so each gets
/// whole pages of the 32 MiB).
fn stress_env(vcpus: usize) -> (f64, usize) {
    let secs: f64 = std::env::var("S2MMU_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let vcpus = match std::env::var("S2MMU_STRESS_VCPUS") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| n.is_power_of_two() && *n <= 64)
            .expect("S2MMU_STRESS_VCPUS must be a power of two from 1 to 64"),
        Err(_) => vcpus,
    };
    (secs, vcpus)
}

/// The host's copy of guest memory, as a migration keeps it: a word per
/// guest word, refreshed from the pages the dirty log reports.
struct Mirror(Vec<u64>);

impl Mirror {
    fn copy_page<S: MemslotStore, F: KnownFormat>(&mut self, vm: &Vm<S, F>, gpa: u64) {
        let (_, off) = vm.locate(gpa).expect("harvested gpa is in a slot");
        for i in 0..512u64 {
            self.0[(off / 8 + i) as usize] = vm.memory().read_u64(off + i * 8).unwrap();
        }
    }

    fn full_copy(&mut self, memory: &GuestMemory) {
        for (i, m) in self.0.iter_mut().enumerate() {
            *m = memory.read_u64(i as u64 * 8).unwrap();
        }
    }

    /// Words that differ from guest memory.
    fn differences(&self, memory: &GuestMemory) -> usize {
        let differs = |(i, m): (usize, &u64)| memory.read_u64(i as u64 * 8) != Some(*m);
        self.0.iter().enumerate().filter(|&w| differs(w)).count()
    }

    /// One harvest copied: with rings KVM's protocol (harvest, reset so the
    /// pages are protected again, then copy), else GET (and CLEAR). Returns
    /// the pages copied.
    fn harvest<S: MemslotStore, F: KnownFormat>(
        &mut self,
        vm: &Vm<S, F>,
        ring: &mut Vec<s2mmu::dirty::DirtyGfn>,
    ) -> usize {
        if vm.mmu().policy().dirty.ring_entries().is_none() {
            let gpas = harvest(vm);
            gpas.iter().for_each(|&gpa| self.copy_page(vm, gpa));
            return gpas.len();
        }
        ring.clear();
        vm.mmu().harvest_rings(ring).unwrap();
        vm.mmu().reset_rings().unwrap();
        for g in ring.iter() {
            let s = vm.slots()[g.slot as usize];
            self.copy_page(vm, s.gpa + g.offset * 4096);
        }
        ring.len()
    }
}

/// Memory holds exactly what the vCPUs wrote: each page's first word is a
/// stamp of the vCPU that owns it and of that page. A random pattern picks
/// pages with replacement, so after few passes (a loaded machine) some
/// pages may never have been written: they hold 0, which is no vCPU's
/// stamp but also no lost write (the mirror comparison covers those).
/// Sequential passes write every page.
fn check_stamps(memory: &GuestMemory, vcpus: usize, pattern: Pattern) {
    let mem = memory.size();
    let per = mem / vcpus as u64;
    for page in 0..mem / 4096 {
        let v = memory.read_u64(page * 4096).unwrap();
        if v == 0 && pattern != Pattern::Sequential {
            continue;
        }
        let owner = page * 4096 / per;
        assert_eq!(v >> 48, owner, "page {page} written by its vCPU");
        if pattern == Pattern::Sequential {
            assert_eq!(
                v & 0xff_ffff,
                page % (per / 4096),
                "page {page} holds its own index"
            );
        }
    }
}

fn stress_on<S: MemslotStore + 'static, F: KnownFormat>(
    policy: MmuPolicy,
    backing: Backing,
    vcpus: usize,
    pattern: Pattern,
) {
    let (secs, vcpus) = stress_env(vcpus);
    let mem = 32 * MIB;
    let vm = vm_on::<S, F>(mem, backing, 2, policy);
    let w = workload(&vm, vcpus, pattern);
    let memory = vm.memory().clone();
    let mut mirror = Mirror(vec![0u64; (mem / 8) as usize]);
    w.run_pass(|| {}).unwrap();
    vm.enable_dirty_logging().unwrap();
    if policy.dirty.bitmaps() {
        harvest(&vm); // start clean, then copy everything
    }
    mirror.full_copy(&memory);
    w.run_free();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut rounds, mut harvested, mut ring) = (0u64, 0usize, Vec::new());
    // The run's length, and on until a harvest found a page: a loaded
    // machine need not schedule the vCPU threads within it (60 s: a hang).
    let hung = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline || harvested == 0 {
        assert!(Instant::now() < hung, "nothing harvested in 60 s");
        rounds += 1;
        harvested += mirror.harvest(&vm, &mut ring);
        if policy.dirty.ring_entries().is_none() && rounds.is_multiple_of(7) {
            // Stop tracking and start again: a fresh full copy.
            vm.disable_dirty_logging().unwrap();
            std::thread::sleep(Duration::from_millis(2));
            vm.enable_dirty_logging().unwrap();
            harvest(&vm);
            mirror.full_copy(&memory);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    w.pause();
    mirror.harvest(&vm, &mut ring);
    let passes = w.passes_done();
    let written: u64 = w
        .control()
        .pages_written
        .iter()
        .map(|p| p.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    // Stop the (still paused) vCPUs before comparing: none may write again.
    drop(w);
    assert!(
        written > 0 && harvested > 0,
        "the test exercised something: {written} writes, {harvested} harvested"
    );
    let bad = mirror.differences(&memory);
    assert_eq!(
        bad, 0,
        "{bad} words differ: dirty writes were lost ({rounds} rounds, passes {passes:?})"
    );
    check_stamps(&memory, vcpus, pattern);
}

#[test]
fn stress_fast_path_anonymous() {
    stress::<TreeMemslots>(
        MmuPolicy::default(),
        Backing::Anonymous,
        4,
        Pattern::Sequential,
    );
}

#[test]
fn stress_baseline_thp_split_on_fault() {
    stress::<ArrayMemslots>(
        MmuPolicy::baseline(),
        Backing::AnonymousThp,
        2,
        Pattern::Random,
    );
}

#[test]
fn stress_eager_split_thp() {
    stress::<TreeMemslots>(
        MmuPolicy::default(),
        Backing::AnonymousThp,
        2,
        Pattern::Sequential,
    );
}

#[test]
fn stress_hardware_dirty_state() {
    // The vCPUs' walkers set the write permission of writable-clean leaves
    // themselves, racing the harvest's scan and clean: no write may be lost.
    let policy = MmuPolicy {
        dirty: DirtyMode::HW,
        ..MmuPolicy::default()
    };
    stress::<TreeMemslots>(policy, Backing::AnonymousThp, 2, Pattern::Random);
}

#[test]
fn stress_hardware_dirty_flags_on_ept() {
    let policy = MmuPolicy {
        dirty: DirtyMode::HW,
        ..MmuPolicy::default()
    };
    stress_on::<TreeMemslots, EptStage2>(policy, Backing::AnonymousThp, 2, Pattern::Random);
}

#[test]
fn stress_pml() {
    // The walkers set dirty flags and log them, log-full exits flush
    // mid-pass, and the harvests flush the logs and clean the flags, all
    // racing: no write may be lost.
    let policy = MmuPolicy {
        dirty: DirtyMode::PML,
        ..MmuPolicy::default()
    };
    stress_on::<TreeMemslots, EptStage2>(policy, Backing::AnonymousThp, 2, Pattern::Random);
}

#[test]
fn stress_write_protection_on_ept() {
    stress_on::<TreeMemslots, EptStage2>(
        MmuPolicy::default(),
        Backing::Anonymous,
        2,
        Pattern::Sequential,
    );
}

#[test]
fn stress_dirty_ring() {
    let policy = MmuPolicy {
        dirty: DirtyMode::Ring { entries: 1024 },
        ..MmuPolicy::default()
    };
    stress::<TreeMemslots>(policy, Backing::Anonymous, 2, Pattern::Random);
}

#[test]
fn fault_path_policies_are_distinct() {
    assert_ne!(MmuPolicy::default().fault_path, FaultPath::WriteLock);
    assert_eq!(MmuPolicy::baseline().fault_path, FaultPath::WriteLock);
}
