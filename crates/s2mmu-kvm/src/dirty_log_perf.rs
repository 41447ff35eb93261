//! `dirty_log_perf_test` on real vCPUs: the memstress workload with dirty logging, phase by
//! phase, returning measured figures as plain data.
//!
//! One host thread per vCPU runs `KVM_RUN` until the guest rings the doorbell at the end of
//! a pass, records the pass, and spins until the main thread publishes the next iteration,
//! exactly the lockstep of the selftest: GET and CLEAR happen while every vCPU is parked in
//! userspace.

use crate::dirty_ring::{DirtyRing, RingResetter};
use crate::error::Error;
use crate::guest_code::{self, GUEST_PAGE_SIZE};
use crate::kvm_handle::open_kvm;
use crate::memory::Backing;
use crate::sys::{self, VcpuCounters, VcpuStats};
use crate::vm::{run_pass, MemstressShape, MemstressVm, PassExits};
use kvm_ioctls::VcpuFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Parameters of one run (the selftest's options in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyLogParams {
    /// Number of vCPUs (`-v`, default 1).
    pub vcpus: u32,
    /// Memory each vCPU dirties (`-b`, default 1 GiB).
    pub bytes_per_vcpu: u64,
    /// Dirty iterations after population (`-i`, default 2; at least 1 here).
    pub iterations: u32,
    /// Host backing of the test memory (`-s`, default anonymous).
    pub backing: Backing,
    /// Memslots the test memory is split into (`-x`, default 1).
    pub slots: u32,
    /// Use `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` (true unless `-g`): GET copies, CLEAR
    /// re-protects. When false, GET takes, clears and re-protects in one ioctl.
    pub manual_protect: bool,
    /// With manual protect, also enable `KVM_DIRTY_LOG_INITIALLY_SET` where the host offers
    /// it (the selftest does whenever it is offered).
    pub initially_set: bool,
    /// Percentage of page accesses that are writes in the dirty passes (`-w`, default 100).
    pub write_percent: u32,
    /// Guest page size; only 4096 is supported.
    pub page_size: u64,
    /// Use the per-vCPU dirty ring with this many entries (a power of two in
    /// 1024..=65536) instead of bitmaps. Then `manual_protect` is ignored, "get dirty log"
    /// is the harvest of every ring and "clear dirty log" is `KVM_RESET_DIRTY_RINGS`; vCPUs
    /// whose ring fills mid-pass harvest and reset it themselves and go on.
    pub dirty_ring_entries: Option<u32>,
}

impl Default for DirtyLogParams {
    fn default() -> Self {
        DirtyLogParams {
            vcpus: 1,
            bytes_per_vcpu: 1 << 30,
            iterations: 2,
            backing: Backing::Anonymous,
            slots: 1,
            manual_protect: true,
            initially_set: true,
            write_percent: 100,
            page_size: GUEST_PAGE_SIZE,
            dirty_ring_entries: None,
        }
    }
}

impl DirtyLogParams {
    /// The VM shape these parameters ask for.
    pub fn shape(&self) -> MemstressShape {
        MemstressShape {
            vcpus: self.vcpus,
            bytes_per_vcpu: self.bytes_per_vcpu,
            slots: self.slots,
            backing: self.backing,
            dirty_ring_entries: self.dirty_ring_entries,
        }
    }

    /// Checks every field without touching KVM.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first offending field.
    pub fn validate(&self) -> Result<(), Error> {
        if self.page_size != GUEST_PAGE_SIZE {
            return Err(Error::invalid(
                "page_size",
                format!("{} is not supported; only 4096", self.page_size),
            ));
        }
        if self.iterations == 0 {
            return Err(Error::invalid("iterations", "must be at least 1"));
        }
        if self.write_percent > 100 {
            return Err(Error::invalid(
                "write_percent",
                format!("{} is not in 0..=100", self.write_percent),
            ));
        }
        self.shape().validate()
    }
}

/// Counts for one pass, summed over vCPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Returns from `KVM_RUN` to userspace that were the doorbell (one per vCPU per pass).
    pub userspace_mmio_exits: u64,
    /// `KVM_EXIT_DIRTY_RING_FULL` returns (dirty ring only).
    pub userspace_ring_full_exits: u64,
    /// Other returns to userspace (interruptions).
    pub userspace_other_exits: u64,
    /// KVM's per-vCPU binary statistics over the pass (None where unavailable): `exits`
    /// counts every VM exit, including the write-protection faults handled in the kernel.
    pub kvm: VcpuCounters,
}

impl PassCounts {
    fn add(&self, other: &PassCounts) -> PassCounts {
        PassCounts {
            userspace_mmio_exits: self.userspace_mmio_exits + other.userspace_mmio_exits,
            userspace_ring_full_exits: self.userspace_ring_full_exits
                + other.userspace_ring_full_exits,
            userspace_other_exits: self.userspace_other_exits + other.userspace_other_exits,
            kvm: self.kvm.add(&other.kvm),
        }
    }
}

/// One dirty iteration (the selftest's "Iteration N ..." lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IterationReport {
    /// 1-based iteration number.
    pub iteration: u32,
    /// From publishing the iteration until the slowest vCPU finished its pass.
    pub dirty_memory: Duration,
    /// `KVM_GET_DIRTY_LOG` on every slot (dirty ring: harvesting every ring into bitmaps).
    pub get_dirty_log: Duration,
    /// `KVM_CLEAR_DIRTY_LOG` of every whole slot (manual protect only; dirty ring:
    /// `KVM_RESET_DIRTY_RINGS`).
    pub clear_dirty_log: Option<Duration>,
    /// Pages the guest wrote in this pass (replayed on the host from the guest's RNG).
    pub pages_written: u64,
    /// Bits set in the harvested bitmaps.
    pub pages_dirty: u64,
    /// Exits during the pass, summed over vCPUs.
    pub exits: PassCounts,
}

/// Everything one run measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyLogReport {
    /// The parameters it ran with.
    pub params: DirtyLogParams,
    /// The `MANUAL_DIRTY_LOG_PROTECT2` bits enabled (0 when manual protect is off).
    pub manual_caps: u64,
    /// Guest-physical range of the test memory.
    pub test_gpa: (u64, u64),
    /// Pages in the test memory.
    pub total_pages: u64,
    /// Thread start up to the last vCPU finishing pass 0 (all first-touch faults).
    pub populate: Duration,
    /// Exits during population.
    pub populate_exits: PassCounts,
    /// Turning `KVM_MEM_LOG_DIRTY_PAGES` on for every slot.
    pub enable_dirty_logging: Duration,
    /// The dirty iterations.
    pub iterations: Vec<IterationReport>,
    /// Turning dirty logging off for every slot.
    pub disable_dirty_logging: Duration,
}

impl DirtyLogReport {
    /// Every timed phase, named as in the selftest's output (lower case, without "time"),
    /// so a comparison can join these with the engine's figures by name: `populate
    /// memory`, `enabling dirty logging`, `iteration N dirty memory`, `iteration N get
    /// dirty log`, `iteration N clear dirty log`, `disabling dirty logging`, `get dirty
    /// log total`, `clear dirty log total` (dirty ring: `harvest dirty ring`, `reset dirty
    /// ring`).
    pub fn phases(&self) -> Vec<(String, Duration)> {
        let (get_name, clear_name) = self.collect_names();
        let mut out = vec![
            ("populate memory".to_string(), self.populate),
            (
                "enabling dirty logging".to_string(),
                self.enable_dirty_logging,
            ),
        ];
        for it in &self.iterations {
            let n = it.iteration;
            out.push((format!("iteration {n} dirty memory"), it.dirty_memory));
            out.push((format!("iteration {n} {get_name}"), it.get_dirty_log));
            if let Some(clear) = it.clear_dirty_log {
                out.push((format!("iteration {n} {clear_name}"), clear));
            }
        }
        out.push((
            "disabling dirty logging".to_string(),
            self.disable_dirty_logging,
        ));
        out.push((format!("{get_name} total"), self.get_dirty_log_total()));
        if let Some(clear) = self.clear_dirty_log_total() {
            out.push((format!("{clear_name} total"), clear));
        }
        out
    }

    fn collect_names(&self) -> (&'static str, &'static str) {
        if self.params.dirty_ring_entries.is_some() {
            ("harvest dirty ring", "reset dirty ring")
        } else {
            ("get dirty log", "clear dirty log")
        }
    }

    /// Sum of the GET times.
    pub fn get_dirty_log_total(&self) -> Duration {
        self.iterations.iter().map(|i| i.get_dirty_log).sum()
    }

    /// Sum of the CLEAR times (None without manual protect).
    pub fn clear_dirty_log_total(&self) -> Option<Duration> {
        self.iterations.iter().map(|i| i.clear_dirty_log).sum()
    }

    /// Sum of the dirty-memory times.
    pub fn dirty_memory_total(&self) -> Duration {
        self.iterations.iter().map(|i| i.dirty_memory).sum()
    }

    /// `total / iterations`.
    pub fn average(total: Duration, iterations: usize) -> Duration {
        total / u32::try_from(iterations.max(1)).unwrap_or(u32::MAX)
    }

    /// The run in the selftest's output format, one line per element (the dirty-memory
    /// lines are followed by the exits of the pass, which the selftest does not print).
    pub fn selftest_lines(&self) -> Vec<String> {
        let s = fmt_secs;
        let (get_name, clear_name) = self.collect_names();
        let mut out = vec![
            format!("Test iterations: {}", self.iterations.len()),
            "Testing guest mode: PA-bits:ANY, VA-bits:48,  4K pages".to_string(),
            format!(
                "guest physical test memory: [{:#x}, {:#x})",
                self.test_gpa.0, self.test_gpa.1
            ),
            format!("Populate memory time: {}", s(self.populate)),
            format!(
                "Enabling dirty logging time: {}",
                s(self.enable_dirty_logging)
            ),
            String::new(),
        ];
        for it in &self.iterations {
            let n = it.iteration;
            out.push(format!(
                "Iteration {n} dirty memory time: {}",
                s(it.dirty_memory)
            ));
            out.push(format!(
                "Iteration {n} exits: {} (KVM stat 'exits'), {} write faults fixed \
                 ('pf_fixed'), {} doorbell MMIO exits{}; pages written {}, pages dirty {}",
                opt(it.exits.kvm.exits),
                opt(it.exits.kvm.pf_fixed),
                it.exits.userspace_mmio_exits,
                if self.params.dirty_ring_entries.is_some() {
                    format!(
                        ", {} ring-full exits (harvested and reset inside the pass)",
                        it.exits.userspace_ring_full_exits
                    )
                } else {
                    String::new()
                },
                it.pages_written,
                it.pages_dirty
            ));
            out.push(format!(
                "Iteration {n} {get_name} time: {}",
                s(it.get_dirty_log)
            ));
            if let Some(clear) = it.clear_dirty_log {
                out.push(format!("Iteration {n} {clear_name} time: {}", s(clear)));
            }
        }
        out.push(format!(
            "Disabling dirty logging time: {}",
            s(self.disable_dirty_logging)
        ));
        let n = self.iterations.len();
        let get = self.get_dirty_log_total();
        out.push(format!(
            "{} over {n} iterations took {}. (Avg {}/iteration)",
            capitalize(get_name),
            s(get),
            s(Self::average(get, n))
        ));
        if let Some(clear) = self.clear_dirty_log_total() {
            out.push(format!(
                "{} over {n} iterations took {}. (Avg {}/iteration)",
                capitalize(clear_name),
                s(clear),
                s(Self::average(clear, n))
            ));
        }
        out
    }
}

/// `%ld.%.9lds`, as the selftests print durations.
pub fn fmt_secs(d: Duration) -> String {
    format!("{}.{:09}s", d.as_secs(), d.subsec_nanos())
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map_or_else(String::new, |c| {
        c.to_uppercase().collect::<String>() + chars.as_str()
    })
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| v.to_string())
}

/// Per-iteration hook: the iteration number and the harvested bitmap of every slot (as
/// returned by `KVM_GET_DIRTY_LOG`, before any clear).
pub type Observer<'a> = dyn FnMut(u32, &[Vec<u64>]) + 'a;

/// Runs the memstress dirty-log workload on real KVM.
///
/// # Errors
/// Any [`Error`]: invalid parameters, KVM unusable, missing capability or hugetlb pages,
/// ioctl failures, or a guest that stopped unexpectedly.
pub fn run(params: &DirtyLogParams) -> Result<DirtyLogReport, Error> {
    run_observed(params, &mut |_, _| {})
}

struct Shared {
    /// The pass the vCPUs may run; 0 = populate.
    iteration: AtomicU64,
    quit: AtomicBool,
    failed: AtomicBool,
    /// Per vCPU: the last pass it finished, plus one (0 = none yet).
    completed: Vec<AtomicU64>,
    error: Mutex<Option<Error>>,
}

/// One vCPU thread's record of each pass it ran (index = pass number).
type PassLog = Vec<PassCounts>;

/// Like [`run`], calling `observer` after each iteration's harvest.
///
/// # Errors
/// As [`run`].
pub fn run_observed(
    params: &DirtyLogParams,
    observer: &mut Observer<'_>,
) -> Result<DirtyLogReport, Error> {
    params.validate()?;
    let kvm = open_kvm()?;
    let mut vm = MemstressVm::create(&kvm, params.shape())?;
    let manual_caps = if params.manual_protect && params.dirty_ring_entries.is_none() {
        let offered_initially_set = sys::manual_protect_caps(vm.vm_fd())
            & u64::from(kvm_bindings::KVM_DIRTY_LOG_INITIALLY_SET)
            != 0;
        sys::enable_manual_protect(vm.vm_fd(), params.initially_set && offered_initially_set)?
    } else {
        0
    };
    let shape = vm.shape();
    let slots = vm.slots().to_vec();
    let mut bitmaps: Vec<Vec<u64>> = slots
        .iter()
        .map(|s| vec![0u64; sys::bitmap_words(s.pages)])
        .collect();

    let shared = Arc::new(Shared {
        iteration: AtomicU64::new(0),
        quit: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        completed: (0..params.vcpus).map(|_| AtomicU64::new(0)).collect(),
        error: Mutex::new(None),
    });

    let rings: Vec<Arc<Mutex<RingState>>> = vm
        .take_rings()
        .into_iter()
        .map(|ring| {
            Arc::new(Mutex::new(RingState {
                ring,
                pending: Vec::new(),
            }))
        })
        .collect();
    let resetter = if rings.is_empty() {
        None
    } else {
        Some(Arc::new(RingResetter::new(vm.vm_fd())?))
    };

    let populate_start = Instant::now();
    let mut handles = Vec::new();
    for (index, vcpu) in vm.take_vcpus().into_iter().enumerate() {
        let thread_shared = Arc::clone(&shared);
        let ring = rings.get(index).cloned().zip(resetter.clone());
        let index = index as u32;
        let spawned = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || vcpu_thread(vcpu, index, &thread_shared, ring));
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                // The threads already started finish their pass, see `quit` and leave.
                shared.quit.store(true, Ordering::Release);
                for handle in handles {
                    let _ = handle.join();
                }
                return Err(Error::Ioctl {
                    op: "pthread_create",
                    errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
                });
            }
        }
    }
    let mut stop = |shared: &Shared| {
        shared.quit.store(true, Ordering::Release);
        let logs: Vec<PassLog> = handles
            .drain(..)
            .map(|h| h.join().unwrap_or_default())
            .collect();
        let err = shared.error.lock().map(|mut e| e.take()).unwrap_or(None);
        (logs, err)
    };

    let result = (|| -> Result<_, Error> {
        wait_for_pass(&shared, 0)?;
        let populate = populate_start.elapsed();

        let t = Instant::now();
        vm.set_dirty_logging(true)?;
        let enable_dirty_logging = t.elapsed();
        let threshold = guest_code::write_threshold(params.write_percent);
        vm.set_write_threshold(threshold)?;

        let mut iterations = Vec::new();
        for iteration in 1..=params.iterations {
            let t = Instant::now();
            shared
                .iteration
                .store(u64::from(iteration), Ordering::Release);
            wait_for_pass(&shared, u64::from(iteration))?;
            let dirty_memory = t.elapsed();

            let t = Instant::now();
            if let Some(resetter) = &resetter {
                harvest_rings(&rings, &mut bitmaps)?;
                let get_dirty_log = t.elapsed();
                let t = Instant::now();
                resetter.reset()?;
                let reset = t.elapsed();
                finish_iteration(
                    iteration,
                    dirty_memory,
                    get_dirty_log,
                    Some(reset),
                    &bitmaps,
                    &mut iterations,
                    observer,
                );
                continue;
            }
            for (slot, bitmap) in slots.iter().zip(bitmaps.iter_mut()) {
                sys::get_dirty_log(vm.vm_fd(), slot.id, slot.pages, bitmap)?;
            }
            let get_dirty_log = t.elapsed();
            let clear_dirty_log = if manual_caps != 0 {
                let t = Instant::now();
                for (slot, bitmap) in slots.iter().zip(bitmaps.iter()) {
                    sys::clear_dirty_log(vm.vm_fd(), slot.id, 0, slot.pages, bitmap)?;
                }
                Some(t.elapsed())
            } else {
                None
            };
            finish_iteration(
                iteration,
                dirty_memory,
                get_dirty_log,
                clear_dirty_log,
                &bitmaps,
                &mut iterations,
                observer,
            );
        }

        let t = Instant::now();
        vm.set_dirty_logging(false)?;
        let disable_dirty_logging = t.elapsed();
        Ok((
            populate,
            enable_dirty_logging,
            iterations,
            disable_dirty_logging,
        ))
    })();

    let (logs, thread_error) = stop(&shared);
    let (populate, enable_dirty_logging, mut iterations, disable_dirty_logging) = match result {
        Ok(r) => r,
        Err(e) => return Err(thread_error.unwrap_or(e)),
    };
    if let Some(e) = thread_error {
        return Err(e);
    }

    // Exits per pass, summed over vCPUs; pages written replayed from each vCPU's RNG.
    let pass_counts = |pass: usize| {
        logs.iter()
            .filter_map(|log| log.get(pass))
            .fold(PassCounts::default(), |acc, c| acc.add(c))
    };
    let written = pages_written_per_pass(params, shape);
    for it in &mut iterations {
        it.exits = pass_counts(it.iteration as usize);
        it.pages_written = written[it.iteration as usize];
    }
    let last_slot = slots.last().copied();
    Ok(DirtyLogReport {
        params: *params,
        manual_caps,
        test_gpa: (
            slots.first().map_or(0, |s| s.gpa),
            last_slot.map_or(0, |s| s.gpa + s.pages * GUEST_PAGE_SIZE),
        ),
        total_pages: shape.total_pages(),
        populate,
        populate_exits: pass_counts(0),
        enable_dirty_logging,
        iterations,
        disable_dirty_logging,
    })
}

/// Records one iteration and shows its bitmaps to the observer.
fn finish_iteration(
    iteration: u32,
    dirty_memory: Duration,
    get_dirty_log: Duration,
    clear_dirty_log: Option<Duration>,
    bitmaps: &[Vec<u64>],
    iterations: &mut Vec<IterationReport>,
    observer: &mut Observer<'_>,
) {
    let pages_dirty = bitmaps
        .iter()
        .flatten()
        .map(|w| u64::from(w.count_ones()))
        .sum();
    observer(iteration, bitmaps);
    iterations.push(IterationReport {
        iteration,
        dirty_memory,
        get_dirty_log,
        clear_dirty_log,
        pages_written: 0,
        pages_dirty,
        exits: PassCounts::default(),
    });
}

/// A vCPU's ring and the entries its thread harvested mid-pass when the ring filled.
struct RingState {
    ring: DirtyRing,
    /// (slot, offset) pairs harvested since the last collection.
    pending: Vec<(u32, u64)>,
}

/// Collects every vCPU's ring (and what its thread harvested mid-pass) into per-slot
/// bitmaps, replacing their contents. Runs while every vCPU is parked.
fn harvest_rings(rings: &[Arc<Mutex<RingState>>], bitmaps: &mut [Vec<u64>]) -> Result<(), Error> {
    for bitmap in bitmaps.iter_mut() {
        bitmap.fill(0);
    }
    for ring in rings {
        let mut state = ring.lock().map_err(|_| Error::GuestFailed {
            vcpu: u32::MAX,
            exit_reason: "a vCPU thread panicked while harvesting its ring".into(),
        })?;
        let RingState { ring, pending } = &mut *state;
        ring.harvest(|slot, offset| pending.push((slot, offset)));
        for &(slot, offset) in pending.iter() {
            // Test slots are ids 1..=slots in address space 0.
            let index = (slot & 0xffff) as usize;
            let word = index
                .checked_sub(1)
                .and_then(|i| bitmaps.get_mut(i))
                .and_then(|b| b.get_mut((offset / 64) as usize));
            match word {
                Some(word) => *word |= 1 << (offset % 64),
                None => {
                    return Err(Error::GuestFailed {
                        vcpu: u32::MAX,
                        exit_reason: format!(
                            "dirty ring entry for unknown slot {slot:#x} offset {offset}"
                        ),
                    })
                }
            }
        }
        pending.clear();
    }
    Ok(())
}

/// Pages written in each pass (index = pass, 0 = populate), summed over vCPUs.
fn pages_written_per_pass(params: &DirtyLogParams, shape: MemstressShape) -> Vec<u64> {
    let mut out = vec![0u64; params.iterations as usize + 1];
    for vcpu in 0..shape.vcpus {
        let mut state = guest_code::initial_random_state(vcpu);
        for (pass, count) in out.iter_mut().enumerate() {
            let threshold = if pass == 0 {
                guest_code::THRESHOLD_ALL_WRITES
            } else {
                guest_code::write_threshold(params.write_percent)
            };
            state = guest_code::replay_pass(state, shape.pages_per_vcpu(), threshold, |_| {
                *count += 1;
            });
        }
    }
    out
}

/// Spins until every vCPU has finished pass `pass` (or one failed).
fn wait_for_pass(shared: &Shared, pass: u64) -> Result<(), Error> {
    loop {
        if shared.failed.load(Ordering::Acquire) {
            return Err(Error::GuestFailed {
                vcpu: u32::MAX,
                exit_reason: "a vCPU thread failed".into(),
            });
        }
        if shared
            .completed
            .iter()
            .all(|c| c.load(Ordering::Acquire) > pass)
        {
            return Ok(());
        }
        // Yield rather than pure spinning: on small hosts the vCPU threads need the CPUs.
        std::thread::yield_now();
    }
}

fn vcpu_thread(
    mut vcpu: VcpuFd,
    index: u32,
    shared: &Shared,
    ring: Option<(Arc<Mutex<RingState>>, Arc<RingResetter>)>,
) -> PassLog {
    // When the ring fills mid-pass: move its entries aside for the next collection and
    // reset it, so the guest can go on (a stop the selftest's lockstep does not have).
    let mut on_ring_full = || -> Result<(), Error> {
        let Some((state, resetter)) = &ring else {
            return Err(Error::GuestFailed {
                vcpu: index,
                exit_reason: "KVM_EXIT_DIRTY_RING_FULL without a dirty ring".into(),
            });
        };
        {
            let mut state = state.lock().map_err(|_| Error::GuestFailed {
                vcpu: index,
                exit_reason: "ring lock poisoned".into(),
            })?;
            let RingState { ring, pending } = &mut *state;
            ring.harvest(|slot, offset| pending.push((slot, offset)));
        }
        resetter.reset().map(|_| ())
    };

    let mut log = PassLog::new();
    let stats = VcpuStats::open(&vcpu).ok();
    let read = |s: &Option<VcpuStats>| s.as_ref().and_then(|s| s.read().ok());
    let mut before = read(&stats);
    let mut pass = 0u64;
    loop {
        let mut exits = PassExits::default();
        if let Err(e) = run_pass(&mut vcpu, index, &mut exits, &mut on_ring_full) {
            if let Ok(mut slot) = shared.error.lock() {
                slot.get_or_insert(e);
            }
            shared.failed.store(true, Ordering::Release);
            return log;
        }
        shared.completed[index as usize].store(pass + 1, Ordering::Release);
        // Read the counters after reporting completion: the vCPU is out of the guest, so
        // they no longer move, and the read stays out of the measured pass time.
        let after = read(&stats);
        let kvm = match (before, after) {
            (Some(b), Some(a)) => a.since(&b),
            _ => VcpuCounters::default(),
        };
        log.push(PassCounts {
            userspace_mmio_exits: exits.mmio,
            userspace_ring_full_exits: exits.ring_full,
            userspace_other_exits: exits.other,
            kvm,
        });
        before = after;
        pass += 1;
        while shared.iteration.load(Ordering::Acquire) < pass {
            if shared.quit.load(Ordering::Acquire) {
                return log;
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_bad_parameters() {
        let ok = DirtyLogParams {
            bytes_per_vcpu: 16 << 20,
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        let bad = [
            DirtyLogParams { vcpus: 0, ..ok },
            DirtyLogParams {
                bytes_per_vcpu: 1000,
                ..ok
            },
            DirtyLogParams {
                iterations: 0,
                ..ok
            },
            DirtyLogParams {
                write_percent: 101,
                ..ok
            },
            DirtyLogParams {
                page_size: 2 << 20,
                ..ok
            },
            DirtyLogParams { slots: 3, ..ok },
            DirtyLogParams { slots: 0, ..ok },
            DirtyLogParams {
                backing: Backing::Hugetlb1G,
                ..ok
            },
        ];
        for p in bad {
            assert!(
                matches!(p.validate(), Err(Error::InvalidArgument { .. })),
                "{p:?}"
            );
        }
    }

    #[test]
    fn replayed_writes_match_the_write_percentage() {
        let p = DirtyLogParams {
            bytes_per_vcpu: 4 << 20,
            vcpus: 2,
            iterations: 3,
            write_percent: 100,
            ..Default::default()
        };
        assert_eq!(pages_written_per_pass(&p, p.shape()), vec![2048; 4]);
        let p = DirtyLogParams {
            write_percent: 0,
            ..p
        };
        assert_eq!(pages_written_per_pass(&p, p.shape()), vec![2048, 0, 0, 0]);
    }

    #[test]
    fn run_rejects_bad_parameters_before_opening_kvm() {
        let bad = DirtyLogParams {
            write_percent: 200,
            ..Default::default()
        };
        assert!(matches!(
            run(&bad),
            Err(Error::InvalidArgument {
                name: "write_percent",
                ..
            })
        ));
    }

    #[test]
    fn formats_like_the_selftest() {
        assert_eq!(fmt_secs(Duration::new(3, 5)), "3.000000005s");
    }
}
