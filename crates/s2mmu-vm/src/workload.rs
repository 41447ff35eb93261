//! Guest workloads on vCPU threads: the KVM selftests' memstress pattern
//! (each vCPU writes one word per page of its own region, pass after pass,
//! in lockstep with the host) and a random-access pattern, with a throttle
//! for migration's convergence help.

use crate::vm::{KnownFormat, Vm};
use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::memslot::MemslotStore;
use s2mmu::mmu::FaultStats;
use std::sync::atomic::Ordering;
// Lock poisoning: the `Control` mutexes (see `control`) hold plain per-vCPU
// records that are replaced or pushed whole, and vCPU threads report
// failures as errors, not panics; the `unwrap`s only propagate a panic that
// is already a bug.
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod control;
mod pass;
mod vcpu_loop;
pub use control::Control;
pub(crate) use pass::Rng;
pub use pass::{stamp, LiveCounters, Pattern, VcpuState, WorkloadConfig, LIVE_EVERY};
use vcpu_loop::vcpu_thread;

/// vCPU threads running a workload on a VM.
pub struct Workload<S: MemslotStore + 'static, F: KnownFormat = Arm64Stage2> {
    vm: Arc<Vm<S, F>>,
    control: Arc<Control>,
    threads: Vec<JoinHandle<()>>,
    config: WorkloadConfig,
}

impl<S: MemslotStore + 'static, F: KnownFormat> Workload<S, F> {
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

impl<S: MemslotStore + 'static, F: KnownFormat> Drop for Workload<S, F> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The host's pause and free-running switches.
impl<S: MemslotStore + 'static, F: KnownFormat> Workload<S, F> {
    /// Lets vCPUs run passes back to back until [`Workload::pause`].
    pub fn run_free(&self) {
        self.control.free_running.store(true, Ordering::Release);
        self.wake_vcpus();
    }

    /// Pauses every vCPU wherever it is (mid-pass included) and returns
    /// once none executes guest accesses: the stop of a migration's
    /// downtime. Free running resumes with [`Workload::resume`].
    pub fn pause(&self) {
        self.control.paused.store(true, Ordering::SeqCst);
        while self
            .control
            .running
            .iter()
            .any(|r| r.load(Ordering::SeqCst))
        {
            if self.check_errors().is_err() {
                return;
            }
            std::hint::spin_loop();
        }
    }

    /// Asks every vCPU to pause at its next access without waiting for
    /// them: one blocked in a fault (post-copy's page request) pauses
    /// once its page is there. [`Workload::resume`] undoes it.
    pub fn request_pause(&self) {
        self.control.paused.store(true, Ordering::SeqCst);
    }

    /// Undoes [`Workload::pause`] and [`Workload::request_pause`].
    pub fn resume(&self) {
        self.control.paused.store(false, Ordering::SeqCst);
        self.wake_vcpus();
    }

    /// Stops free running after the current passes (vCPUs then wait for
    /// [`Workload::run_pass`]).
    pub fn stop_free(&self) {
        self.control.free_running.store(false, Ordering::Release);
    }
}
