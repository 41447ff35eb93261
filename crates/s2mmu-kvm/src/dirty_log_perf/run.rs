//! The run: one host thread per vCPU in lockstep with the main thread, which
//! harvests each pass's dirty log (bitmaps or rings) while every vCPU is
//! parked in userspace.

use super::params::DirtyLogParams;
use super::report::{DirtyLogReport, IterationReport, Observer, PassCounts};
use crate::dirty_ring::{DirtyRing, RingResetter};
use crate::error::Error;
use crate::guest_code::{self, GUEST_PAGE_SIZE};
use crate::kvm_handle::open_kvm;
use crate::sys::{self, VcpuCounters, VcpuStats};
use crate::vm::{run_pass, MemstressShape, MemstressVm, PassExits, TestSlot};
use kvm_ioctls::VcpuFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Runs the memstress dirty-log workload on real KVM.
///
/// # Errors
/// Any [`Error`]: invalid parameters, KVM unusable, missing capability or hugetlb pages,
/// ioctl failures, or a guest that stopped unexpectedly.
pub fn run(params: &DirtyLogParams) -> Result<DirtyLogReport, Error> {
    run_observed(params, &mut |_, _| {})
}

/// What the main thread and the vCPU threads share to run passes in lockstep.
struct Lockstep {
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
    let manual_caps = enable_manual_protect(&vm, params)?;
    let mut harvest = Harvest::new(&mut vm, manual_caps)?;
    let shared = Arc::new(Lockstep {
        iteration: AtomicU64::new(0),
        quit: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        completed: (0..params.vcpus).map(|_| AtomicU64::new(0)).collect(),
        error: Mutex::new(None),
    });
    let populate_start = Instant::now();
    let threads = VcpuThreads::spawn(vm.take_vcpus(), &shared, &harvest)?;
    let result = run_passes(params, &vm, &shared, &mut harvest, populate_start, observer);
    let (logs, thread_error) = threads.stop(&shared);
    let phases = match result {
        Ok(phases) => phases,
        Err(e) => return Err(thread_error.unwrap_or(e)),
    };
    if let Some(e) = thread_error {
        return Err(e);
    }
    Ok(report(
        params,
        vm.shape(),
        &harvest.slots,
        manual_caps,
        &logs,
        phases,
    ))
}

/// Turns on manual protect (with initially-set where asked and offered) for a bitmap run
/// that asks for it; returns the capability bits enabled (0: none).
fn enable_manual_protect(vm: &MemstressVm, params: &DirtyLogParams) -> Result<u64, Error> {
    if !params.manual_protect || params.dirty_ring_entries.is_some() {
        return Ok(0);
    }
    let offered_initially_set = sys::manual_protect_caps(vm.vm_fd())
        & u64::from(kvm_bindings::KVM_DIRTY_LOG_INITIALLY_SET)
        != 0;
    sys::enable_manual_protect(vm.vm_fd(), params.initially_set && offered_initially_set)
}

/// The phases the main thread timed, and the iterations it harvested.
struct Phases {
    populate: Duration,
    enable_dirty_logging: Duration,
    iterations: Vec<IterationReport>,
    disable_dirty_logging: Duration,
}

/// Populate, logging on, the timed iterations, logging off: the main thread's side of the
/// lockstep.
fn run_passes(
    params: &DirtyLogParams,
    vm: &MemstressVm,
    shared: &Lockstep,
    harvest: &mut Harvest,
    populate_start: Instant,
    observer: &mut Observer<'_>,
) -> Result<Phases, Error> {
    wait_for_pass(shared, 0)?;
    let populate = populate_start.elapsed();
    let t = Instant::now();
    vm.set_dirty_logging(true)?;
    let enable_dirty_logging = t.elapsed();
    vm.set_write_threshold(guest_code::write_threshold(params.write_percent))?;
    let mut iterations = Vec::new();
    for iteration in 1..=params.iterations {
        let t = Instant::now();
        shared
            .iteration
            .store(u64::from(iteration), Ordering::Release);
        wait_for_pass(shared, u64::from(iteration))?;
        let dirty_memory = t.elapsed();
        let (get_dirty_log, clear_dirty_log) = harvest.collect(vm)?;
        let pages_dirty = harvest
            .bitmaps
            .iter()
            .flatten()
            .map(|w| u64::from(w.count_ones()))
            .sum();
        observer(iteration, &harvest.bitmaps);
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
    let t = Instant::now();
    vm.set_dirty_logging(false)?;
    Ok(Phases {
        populate,
        enable_dirty_logging,
        iterations,
        disable_dirty_logging: t.elapsed(),
    })
}

/// The report: the main thread's phases, with each pass's exits summed over the vCPUs'
/// logs and the pages written replayed from each vCPU's RNG.
fn report(
    params: &DirtyLogParams,
    shape: MemstressShape,
    slots: &[TestSlot],
    manual_caps: u64,
    logs: &[PassLog],
    phases: Phases,
) -> DirtyLogReport {
    let pass_counts = |pass: usize| {
        logs.iter()
            .filter_map(|log| log.get(pass))
            .fold(PassCounts::default(), |acc, c| acc.add(c))
    };
    let written = pages_written_per_pass(params, shape);
    let mut iterations = phases.iterations;
    for it in &mut iterations {
        it.exits = pass_counts(it.iteration as usize);
        it.pages_written = written[it.iteration as usize];
    }
    let last_slot = slots.last().copied();
    DirtyLogReport {
        params: *params,
        manual_caps,
        test_gpa: (
            slots.first().map_or(0, |s| s.gpa),
            last_slot.map_or(0, |s| s.gpa + s.pages * GUEST_PAGE_SIZE),
        ),
        total_pages: shape.total_pages(),
        populate: phases.populate,
        populate_exits: pass_counts(0),
        enable_dirty_logging: phases.enable_dirty_logging,
        iterations,
        disable_dirty_logging: phases.disable_dirty_logging,
    }
}

/// A vCPU's ring and the entries its thread harvested mid-pass when the ring filled.
struct RingState {
    ring: DirtyRing,
    /// (slot, offset) pairs harvested since the last collection.
    pending: Vec<(u32, u64)>,
}

/// The main thread's harvest: per-slot bitmaps filled from KVM's bitmaps (GET, then CLEAR
/// under manual protect) or from the vCPUs' dirty rings (then one ring reset).
struct Harvest {
    slots: Vec<TestSlot>,
    bitmaps: Vec<Vec<u64>>,
    rings: Vec<Arc<Mutex<RingState>>>,
    /// Present exactly when the VM has dirty rings.
    resetter: Option<Arc<RingResetter>>,
    manual_caps: u64,
}

impl Harvest {
    /// Takes the VM's rings (if any) and sizes one bitmap per test slot.
    fn new(vm: &mut MemstressVm, manual_caps: u64) -> Result<Self, Error> {
        let slots = vm.slots().to_vec();
        let bitmaps = slots
            .iter()
            .map(|s| vec![0u64; sys::bitmap_words(s.pages)])
            .collect();
        let rings: Vec<_> = vm
            .take_rings()
            .into_iter()
            .map(|ring| {
                let pending = Vec::new();
                Arc::new(Mutex::new(RingState { ring, pending }))
            })
            .collect();
        let resetter = match rings.is_empty() {
            true => None,
            false => Some(Arc::new(RingResetter::new(vm.vm_fd())?)),
        };
        Ok(Harvest {
            slots,
            bitmaps,
            rings,
            resetter,
            manual_caps,
        })
    }

    /// Harvests the pass just finished into `bitmaps`: returns the time of the collection
    /// (GET, or reading the rings) and of the re-protection (CLEAR, or the ring reset;
    /// `None` for GET alone without manual protect).
    fn collect(&mut self, vm: &MemstressVm) -> Result<(Duration, Option<Duration>), Error> {
        let t = Instant::now();
        if let Some(resetter) = &self.resetter {
            harvest_rings(&self.rings, &mut self.bitmaps)?;
            let get_dirty_log = t.elapsed();
            let t = Instant::now();
            resetter.reset()?;
            return Ok((get_dirty_log, Some(t.elapsed())));
        }
        for (slot, bitmap) in self.slots.iter().zip(self.bitmaps.iter_mut()) {
            sys::get_dirty_log(vm.vm_fd(), slot.id, slot.pages, bitmap)?;
        }
        let get_dirty_log = t.elapsed();
        if self.manual_caps == 0 {
            return Ok((get_dirty_log, None));
        }
        let t = Instant::now();
        for (slot, bitmap) in self.slots.iter().zip(self.bitmaps.iter()) {
            sys::clear_dirty_log(vm.vm_fd(), slot.id, 0, slot.pages, bitmap)?;
        }
        Ok((get_dirty_log, Some(t.elapsed())))
    }
}

/// The vCPU threads of one run.
struct VcpuThreads(Vec<JoinHandle<PassLog>>);

impl VcpuThreads {
    /// One thread per vCPU, each with its ring (if any). If a thread cannot be started, the
    /// ones already running are stopped and joined.
    fn spawn(vcpus: Vec<VcpuFd>, shared: &Arc<Lockstep>, harvest: &Harvest) -> Result<Self, Error> {
        let mut threads = VcpuThreads(Vec::new());
        for (index, vcpu) in vcpus.into_iter().enumerate() {
            let thread_shared = Arc::clone(shared);
            let ring = harvest
                .rings
                .get(index)
                .cloned()
                .zip(harvest.resetter.clone());
            let index = index as u32;
            let spawned = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || vcpu_thread(vcpu, index, &thread_shared, ring));
            match spawned {
                Ok(handle) => threads.0.push(handle),
                Err(e) => {
                    // The threads already started finish their pass, see `quit` and leave.
                    threads.stop(shared);
                    return Err(Error::Ioctl {
                        op: "pthread_create",
                        errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
                    });
                }
            }
        }
        Ok(threads)
    }

    /// Tells the threads to quit, joins them: their logs and the first error one met.
    fn stop(self, shared: &Lockstep) -> (Vec<PassLog>, Option<Error>) {
        shared.quit.store(true, Ordering::Release);
        let logs = self
            .0
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect();
        let err = shared.error.lock().map(|mut e| e.take()).unwrap_or(None);
        (logs, err)
    }
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
fn wait_for_pass(shared: &Lockstep, pass: u64) -> Result<(), Error> {
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
    shared: &Lockstep,
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
}
