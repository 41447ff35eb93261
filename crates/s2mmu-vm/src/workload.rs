//! Guest workloads on vCPU threads: the KVM selftests' memstress pattern
//! (each vCPU writes one word per page of its own region, pass after pass,
//! in lockstep with the host) and a random-access pattern, with a throttle
//! for migration's convergence help.

use crate::vcpu::Vcpu;
use crate::vm::{Vm, VmFormat};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::memslot::MemslotStore;
use s2mmu::mmu::FaultStats;
use std::sync::atomic::{AtomicU64, Ordering};
// Lock poisoning: the `Control` mutexes (see `control`) hold plain per-vCPU
// records that are replaced or pushed whole, and vCPU threads report
// failures as errors, not panics; the `unwrap`s only propagate a panic that
// is already a bug.
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod control;
mod vcpu_loop;
pub use control::Control;
use vcpu_loop::vcpu_thread;

/// The access pattern of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Every page of the vCPU's region in order (memstress).
    Sequential,
    /// As many pages as the region has, chosen at random in it.
    Random,
}

/// What each vCPU does.
#[derive(Clone, Copy, Debug)]
pub struct WorkloadConfig {
    /// Bytes of guest memory each vCPU touches (its own region).
    pub bytes_per_vcpu: u64,
    /// Percent of accesses that are writes (the rest read).
    pub write_percent: u32,
    /// Access pattern.
    pub pattern: Pattern,
    /// Page size the workload steps by.
    pub page_size: u64,
}

/// Values the vCPUs write: `(vcpu << 48) | (pass << 24) | page`, so a
/// checker can tell which pass of which vCPU wrote a page.
pub fn stamp(vcpu: usize, pass: u64, page: u64) -> u64 {
    ((vcpu as u64) << 48) | ((pass & 0xff_ffff) << 24) | (page & 0xff_ffff)
}

/// How often (in accesses) a vCPU publishes its live counters.
pub const LIVE_EVERY: u64 = 64;

/// One vCPU's running totals, readable while it runs. Each sits on its own
/// cache line and only its vCPU writes it.
#[derive(Default)]
#[repr(align(128))]
pub struct LiveCounters {
    /// Guest accesses made.
    pub accesses: AtomicU64,
    /// Guest writes made.
    pub writes: AtomicU64,
    /// Faults (exits) taken.
    pub faults: AtomicU64,
    /// Software-TLB misses (table walks).
    pub tlb_misses: AtomicU64,
    /// Software-TLB fills.
    pub tlb_fills: AtomicU64,
    /// Invalidation requests the vCPU applied.
    pub tlb_flushes: AtomicU64,
    /// Nanoseconds spent executing guest accesses (faults included;
    /// throttle, pacing sleeps and pauses excluded): writes per guest
    /// nanosecond is the guest's speed, whatever its pacing.
    pub guest_ns: AtomicU64,
}

impl LiveCounters {
    fn publish<S: MemslotStore, F: VmFormat>(&self, vcpu: &Vcpu<S, F>, writes: u64, guest_ns: u64) {
        let t = vcpu.tlb().stats();
        self.guest_ns.store(guest_ns, Ordering::Relaxed);
        self.accesses.store(vcpu.accesses, Ordering::Relaxed);
        self.writes.store(writes, Ordering::Relaxed);
        self.faults.store(vcpu.faults, Ordering::Relaxed);
        self.tlb_misses.store(t.misses, Ordering::Relaxed);
        self.tlb_fills.store(t.fills, Ordering::Relaxed);
        self.tlb_flushes.store(
            vcpu.tlb().shared().flushes_applied.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
}

/// Where a vCPU is in its workload: the architectural state a migration
/// carries to resume it on the destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VcpuState {
    /// The pass it is in (1-based; passes before it are complete).
    pub pass: u64,
    /// Index of the next access in that pass.
    pub next_page: u64,
    /// Its random generator's state.
    pub rng: u64,
    /// Guest writes it has made in total.
    pub writes: u64,
}

/// vCPU threads running a workload on a VM.
pub struct Workload<S: MemslotStore + 'static, F: VmFormat = Arm64Stage2> {
    vm: Arc<Vm<S, F>>,
    control: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
    config: WorkloadConfig,
}

impl<S: MemslotStore + 'static, F: VmFormat> Workload<S, F> {
    /// Starts `vcpus` vCPU threads, each owning the region
    /// `[gpa_base + i * bytes_per_vcpu, +bytes_per_vcpu)`; they wait for
    /// [`Workload::run_pass`] or [`Workload::run_free`].
    ///
    /// # Errors
    /// A message when the regions do not fit the VM's memory or a vCPU
    /// cannot be created.
    pub fn start(vm: Arc<Vm<S, F>>, vcpus: usize, config: WorkloadConfig) -> Result<Self, String> {
        Self::start_inner(vm, vcpus, config, None)
    }

    /// Starts vCPU threads that continue from `states` (one per vCPU, as
    /// [`Workload::vcpu_states`] returned them on another VM): the resume
    /// of a migrated guest. Call [`Workload::run_free`] to let them run;
    /// pass counts continue from the saved ones.
    ///
    /// # Errors
    /// As [`Workload::start`], or when a state does not fit the workload.
    pub fn start_at(
        vm: Arc<Vm<S, F>>,
        config: WorkloadConfig,
        states: &[VcpuState],
    ) -> Result<Self, String> {
        let pages = config.bytes_per_vcpu / config.page_size.max(1);
        if let Some((i, s)) = states
            .iter()
            .enumerate()
            .find(|(_, s)| s.pass == 0 || s.next_page > pages)
        {
            return Err(format!(
                "vCPU {i} state (pass {}, page {}) does not fit a workload of {pages} pages per vCPU",
                s.pass, s.next_page
            ));
        }
        Self::start_inner(vm, states.len(), config, Some(states))
    }

    fn start_inner(
        vm: Arc<Vm<S, F>>,
        vcpus: usize,
        config: WorkloadConfig,
        resume: Option<&[VcpuState]>,
    ) -> Result<Self, String> {
        // Every count and size checked before anything is allocated or a
        // thread started (the per-vCPU state is allocated per vCPU).
        let need = u64::try_from(vcpus)
            .ok()
            .and_then(|n| config.bytes_per_vcpu.checked_mul(n));
        if vcpus == 0
            || vcpus > s2mmu::mmu::MAX_VCPUS
            || config.page_size == 0
            || config.bytes_per_vcpu < config.page_size
            || !config.bytes_per_vcpu.is_multiple_of(config.page_size)
            || need.is_none_or(|need| need > vm.config().mem_size)
        {
            return Err(format!(
                "{vcpus} vCPUs (1 to {}) x {} bytes (whole pages of {} bytes each) do not fit {} bytes of guest memory",
                s2mmu::mmu::MAX_VCPUS,
                config.bytes_per_vcpu,
                config.page_size,
                vm.config().mem_size
            ));
        }
        let control = Arc::new(Control::new(vcpus));
        if let Some(states) = resume {
            for (i, s) in states.iter().enumerate() {
                control.done[i].store(s.pass - 1, Ordering::Relaxed);
                control.pages_written[i].store(s.writes, Ordering::Relaxed);
            }
            control.states.lock().unwrap().copy_from_slice(states);
        }
        control
            .write_percent
            .store(u64::from(config.write_percent), Ordering::Relaxed);
        control
            .random
            .store(config.pattern == Pattern::Random, Ordering::Relaxed);
        // Built first, so that a failure part-way stops and joins the
        // threads already started (its drop does).
        let mut w = Workload {
            vm,
            control,
            threads: Vec::new(),
            config,
        };
        for i in 0..vcpus {
            let mut vcpu = w.vm.new_vcpu().map_err(|e| e.to_string())?;
            let control = w.control.clone();
            let base = w.vm.config().gpa_base + i as u64 * config.bytes_per_vcpu;
            let start = resume.map(|s| s[i]);
            let h = std::thread::Builder::new()
                .name(format!("vcpu{i}"))
                .spawn(move || vcpu_thread(&mut vcpu, i, base, config, &control, start))
                .map_err(|e| e.to_string())?;
            w.threads.push(h);
        }
        Ok(w)
    }

    /// The shared control block.
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// The VM.
    pub fn vm(&self) -> &Arc<Vm<S, F>> {
        &self.vm
    }

    /// The workload's configuration.
    pub fn config(&self) -> &WorkloadConfig {
        &self.config
    }

    /// Runs one pass on every vCPU and waits for all; returns the wall
    /// time. `while_waiting` is called repeatedly meanwhile (a dirty-ring
    /// reaper).
    ///
    /// # Errors
    /// The first error a vCPU reported.
    pub fn run_pass(&self, mut while_waiting: impl FnMut()) -> Result<Duration, String> {
        let pass = self.control.target.load(Ordering::Acquire) + 1;
        *self.control.host.lock().unwrap() = Some(std::thread::current());
        let t0 = Instant::now();
        self.control.target.store(pass, Ordering::Release);
        self.wake_vcpus();
        let mut spins = 0u32;
        while self
            .control
            .done
            .iter()
            .any(|d| d.load(Ordering::Acquire) < pass)
        {
            self.check_errors()?;
            while_waiting();
            spins += 1;
            if spins > 64 {
                // Woken by the last vCPU to finish (or one on a full ring);
                // the timeout only bounds a missed wake-up.
                std::thread::park_timeout(Duration::from_millis(1));
            }
        }
        let t = t0.elapsed();
        *self.control.host.lock().unwrap() = None;
        self.check_errors()?;
        Ok(t)
    }

    /// Wakes vCPU threads that wait for the host (a new pass, a resume, a
    /// stop).
    fn wake_vcpus(&self) {
        for t in &self.threads {
            t.thread().unpark();
        }
    }

    /// Where each vCPU is. Exact while the workload is paused
    /// ([`Workload::pause`]); otherwise as of its last stop or pass end.
    pub fn vcpu_states(&self) -> Vec<VcpuState> {
        self.control.states.lock().unwrap().clone()
    }

    /// Passes completed by each vCPU.
    pub fn passes_done(&self) -> Vec<u64> {
        self.control
            .done
            .iter()
            .map(|d| d.load(Ordering::Acquire))
            .collect()
    }

    /// Duration of every pass of every vCPU.
    pub fn pass_times(&self) -> Vec<Vec<Duration>> {
        self.control.pass_times.lock().unwrap().clone()
    }

    /// Fault counters of every vCPU, as of its last completed pass.
    pub fn fault_stats(&self) -> Vec<FaultStats> {
        self.control.fault_stats.lock().unwrap().clone()
    }

    fn check_errors(&self) -> Result<(), String> {
        match self.control.errors.lock().unwrap().first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Stops the vCPU threads and joins them.
    pub fn stop(mut self) -> Vec<FaultStats> {
        self.shutdown();
        self.fault_stats()
    }

    fn shutdown(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        self.wake_vcpus();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl<S: MemslotStore + 'static, F: VmFormat> Drop for Workload<S, F> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A small xorshift generator, as the selftests' guest_random.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}
