//! A KVM guest's vCPUs as the migration library's [`GuestRun`]: one
//! thread per vCPU in `KVM_RUN`, stopped at an instruction boundary by a
//! signal that makes `KVM_RUN` return (`EINTR`), their full state read
//! and written ([`super::vcpu_io`]) while they are stopped, and throttled
//! for auto-converge ([`super::throttle`]).
//!
//! The kick is the real-time signal [`kick_signal`], whose handler (set
//! once per process) does nothing: a process that uses it for something
//! else cannot use this runner.

use super::cpu_state::{ClockState, KvmState};
use super::session_vm::{KvmVm, NewVcpus};
use super::throttle::{Throttle, TIMESLICE};
use super::vcpu_io;
use crate::Error;
use kvm_bindings::KVM_EXIT_DIRTY_RING_FULL;
use kvm_ioctls::{VcpuExit, VcpuFd};
use s2mmu_migrate::vm::{GuestCounters, GuestRun};
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What the VMM does with an exit of vCPU `i` the runner does not handle
/// itself (it handles interruptions and full dirty rings): `Ok(n)` runs
/// on, counting `n` units of the vCPU's progress ([`KvmVcpus::passes`]);
/// `Err` stops the vCPU with that reason ([`KvmVcpus::errors`]).
pub type ExitHandler = dyn Fn(usize, &VcpuExit<'_>) -> Result<u64, String> + Send + Sync;

/// The signal that kicks a vCPU thread out of `KVM_RUN`.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

extern "C" fn ignore(_: libc::c_int) {}

fn install_kick() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is valid; the handler does nothing
        // (async-signal-safe) and is installed without SA_RESTART, so an
        // interrupted KVM_RUN returns EINTR.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(kick_signal(), &sa, std::ptr::null_mut());
        }
    });
}

#[derive(Default)]
struct Ctl {
    pause: bool,
    stop: bool,
    /// Threads waiting for `pause` to drop (or stopped for good).
    parked: usize,
    errors: Vec<String>,
}

/// What the KVM vCPU threads of a migrating VM and their controller share.
struct VcpuShared {
    ctl: Mutex<Ctl>,
    cv: Condvar,
    fds: Vec<Mutex<VcpuFd>>,
    passes: Vec<AtomicU64>,
    /// Nanoseconds each vCPU spent in `KVM_RUN`.
    run_ns: Vec<AtomicU64>,
    /// The vCPU threads, to kick (set once they are spawned).
    pthreads: Mutex<Vec<libc::pthread_t>>,
    throttle: Throttle,
    ring_full: Arc<[AtomicBool]>,
    handler: Arc<ExitHandler>,
}

impl VcpuShared {
    fn ctl(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Running vCPUs: created paused or running, stopped for good on drop.
pub struct KvmVcpus {
    shared: Arc<VcpuShared>,
    threads: Vec<JoinHandle<()>>,
    /// Dropped after the threads are joined: the memory the vCPUs write
    /// outlives them.
    vm: Arc<KvmVm>,
}

impl KvmVcpus {
    /// Loads `state` into the VM and its vCPUs (the clock, then each
    /// vCPU in KVM's order; none: the registers as set) and starts a
    /// thread per vCPU, paused when `paused`, and the throttle's ticker;
    /// `handler` takes the exits the runner does not.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a state whose vCPU count does not
    /// match or that this host cannot take; KVM's refusals, by ioctl.
    pub fn start(
        vcpus: NewVcpus,
        state: Option<&KvmState>,
        handler: Arc<ExitHandler>,
        paused: bool,
    ) -> Result<KvmVcpus, Error> {
        let NewVcpus { fds, vm } = vcpus;
        if let Some(st) = state {
            restore(&vm, &fds, st)?;
        }
        install_kick();
        let shared = Arc::new(VcpuShared {
            ctl: Mutex::new(Ctl {
                pause: paused,
                ..Ctl::default()
            }),
            cv: Condvar::new(),
            passes: fds.iter().map(|_| AtomicU64::new(0)).collect(),
            run_ns: fds.iter().map(|_| AtomicU64::new(0)).collect(),
            pthreads: Mutex::new(Vec::new()),
            throttle: Throttle::default(),
            fds: fds.into_iter().map(Mutex::new).collect(),
            ring_full: vm.ring_full_flags(),
            handler,
        });
        let mut threads: Vec<JoinHandle<()>> = (0..shared.fds.len())
            .map(|i| {
                let sh = shared.clone();
                std::thread::spawn(move || vcpu_loop(&sh, i))
            })
            .collect();
        *lock(&shared.pthreads) = threads.iter().map(|t| t.as_pthread_t()).collect();
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || ticker(&sh)));
        Ok(KvmVcpus {
            shared,
            threads,
            vm,
        })
    }

    /// The throttle: its percentage, and the sleeps it made.
    pub fn throttle(&self) -> &Throttle {
        &self.shared.throttle
    }

    /// Each vCPU's progress: the units its exits counted.
    pub fn passes(&self) -> Vec<u64> {
        self.shared
            .passes
            .iter()
            .map(|p| p.load(Ordering::Relaxed))
            .collect()
    }

    /// Why vCPUs stopped on their own (an exit the handler refused, a
    /// `KVM_RUN` error), one line each.
    pub fn errors(&self) -> Vec<String> {
        self.shared.ctl().errors.clone()
    }

    /// Every vCPU's state and the VM's clock. Pauses the vCPUs first
    /// (they stay paused).
    ///
    /// # Errors
    /// The KVM ioctl that refused.
    pub fn save(&self) -> Result<KvmState, Error> {
        self.pause();
        let caps = self.vm.state_caps();
        let mut tsc_khz = 0;
        let vcpus = self
            .shared
            .fds
            .iter()
            .map(|fd| {
                let fd = lock(fd);
                if tsc_khz == 0 {
                    tsc_khz = fd.get_tsc_khz().unwrap_or(0);
                }
                vcpu_io::save(&fd, caps)
            })
            .collect::<Result<_, _>>()?;
        let clock_ns = self.vm.clock_ns()?;
        Ok(KvmState {
            vcpus,
            clock: ClockState { clock_ns, tsc_khz },
        })
    }

    /// Kicks every thread not yet parked until all are.
    fn wait_parked(&self) {
        let n = self.shared.fds.len();
        let mut c = self.shared.ctl();
        while c.parked < n {
            kick_all(&self.shared);
            c = self
                .shared
                .cv
                .wait_timeout(c, Duration::from_millis(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Kicks every vCPU thread out of `KVM_RUN`.
fn kick_all(sh: &VcpuShared) {
    for t in lock(&sh.pthreads).iter() {
        // SAFETY: each pthread_t is of a thread not yet joined, so it is
        // still valid (an exited thread's stays valid until it is
        // joined). Only two callers kick, both holding the control lock:
        // the ticker, which kicks only after seeing `stop` clear under
        // that lock, and `wait_parked`, which `Drop` calls after setting
        // `stop` and before joining any thread; `Drop` joins only once
        // `wait_parked` has returned, and the ticker kicks no more once
        // `stop` is set. The signal's handler does nothing.
        unsafe { libc::pthread_kill(*t, kick_signal()) };
    }
}

/// While the throttle is on, kicks the vCPUs once per timeslice, so that
/// a vCPU that does not exit on its own takes its sleep.
fn ticker(sh: &VcpuShared) {
    let mut c = sh.ctl();
    while !c.stop {
        c = sh
            .cv
            .wait_timeout(c, TIMESLICE)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        if !c.stop && !c.pause && sh.throttle.pct() > 0 {
            kick_all(sh);
        }
    }
}

/// Sleeps the throttle's share of `ran` (returns how long it slept), or
/// less when a pause or stop comes meanwhile.
fn throttle_sleep(sh: &VcpuShared, ran: Duration) -> Duration {
    let due = sh.throttle.due(ran);
    if due.is_zero() {
        return due;
    }
    let t0 = Instant::now();
    let mut c = sh.ctl();
    while !c.pause && !c.stop && t0.elapsed() < due {
        c = sh
            .cv
            .wait_timeout(c, due - t0.elapsed())
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    let slept = t0.elapsed();
    sh.throttle.slept(slept);
    slept
}

/// Loads `st` into the VM's clock and its vCPUs, the TSC frequency first.
fn restore(vm: &KvmVm, fds: &[VcpuFd], st: &KvmState) -> Result<(), Error> {
    if st.vcpus.len() != fds.len() {
        let why = format!("{} states for {} vCPUs", st.vcpus.len(), fds.len());
        return Err(Error::invalid("state", why));
    }
    vm.set_clock(&st.clock)?;
    for (fd, v) in fds.iter().zip(&st.vcpus) {
        let khz = st.clock.tsc_khz;
        if khz != 0 && fd.get_tsc_khz().ok() != Some(khz) {
            fd.set_tsc_khz(khz)
                .map_err(|e| Error::from_errno("KVM_SET_TSC_KHZ", e))?;
        }
        vcpu_io::restore(fd, v, vm.state_caps())?;
    }
    Ok(())
}

/// One vCPU's thread: runs until paused or stopped, parks meanwhile,
/// sleeps while throttled.
fn vcpu_loop(sh: &VcpuShared, i: usize) {
    let mut ran = Duration::ZERO;
    loop {
        {
            let mut c = sh.ctl();
            if c.pause || c.stop {
                c.parked += 1;
                sh.cv.notify_all();
                while c.pause && !c.stop {
                    c = sh.cv.wait(c).unwrap_or_else(|p| p.into_inner());
                }
                if c.stop {
                    return; // stays counted as parked
                }
                c.parked -= 1;
            }
        }
        let t0 = Instant::now();
        let r = run_once(sh, i);
        let took = t0.elapsed();
        sh.run_ns[i].fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        if let Err(why) = r {
            let mut c = sh.ctl();
            c.errors.push(format!("vCPU {i}: {why}"));
            c.parked += 1; // for good: pause() must not wait for it
            sh.cv.notify_all();
            return;
        }
        ran += took;
        if ran >= TIMESLICE {
            throttle_sleep(sh, ran);
            ran = Duration::ZERO;
        }
    }
}

/// One `KVM_RUN` and its exit.
fn run_once(sh: &VcpuShared, i: usize) -> Result<(), String> {
    let mut fd = sh.fds[i].lock().unwrap_or_else(|p| p.into_inner());
    match fd.run() {
        Ok(VcpuExit::Unsupported(r)) if r == KVM_EXIT_DIRTY_RING_FULL => {
            // Runs on once the migration reaps and resets the rings.
            if let Some(f) = sh.ring_full.get(i) {
                f.store(true, Ordering::Release);
            }
            drop(fd);
            std::thread::sleep(Duration::from_micros(200));
            Ok(())
        }
        Ok(VcpuExit::Intr) => Ok(()),
        Ok(exit) => {
            let n = (sh.handler)(i, &exit)?;
            sh.passes[i].fetch_add(n, Ordering::Relaxed);
            Ok(())
        }
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Ok(()),
        Err(e) => Err(format!("KVM_RUN: {e}")),
    }
}

impl GuestRun for KvmVcpus {
    fn pause(&self) {
        self.shared.ctl().pause = true;
        self.shared.cv.notify_all(); // ends a throttle's sleep
        self.wait_parked();
    }

    fn request_pause(&self) {
        self.shared.ctl().pause = true;
        self.shared.cv.notify_all();
    }

    fn resume(&self) {
        self.shared.ctl().pause = false;
        self.shared.cv.notify_all();
    }

    /// `writes`: the dirty pages KVM's log reported (KVM does not count
    /// the guest's writes); `guest_ns`: the vCPUs' time in `KVM_RUN`.
    fn counters(&self) -> GuestCounters {
        let writes = self.vm.dirty_pages();
        let guest_ns = self
            .shared
            .run_ns
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .sum();
        self.shared.throttle.sample(writes, guest_ns);
        GuestCounters { writes, guest_ns }
    }

    /// Auto-converge: the delay per page as a throttle percentage
    /// ([`Throttle::set_ns_per_page`]).
    fn set_throttle_ns(&self, ns: u64) {
        self.shared.throttle.set_ns_per_page(ns);
    }

    /// Unpaced (0): no dirty limit.
    fn pace(&self) -> u64 {
        0
    }

    /// Not supported (see [`GuestRun::pace`]).
    fn set_pace(&self, _pages_per_sec: u64) {}
}

impl Drop for KvmVcpus {
    fn drop(&mut self) {
        {
            let mut c = self.shared.ctl();
            c.stop = true;
        }
        self.shared.cv.notify_all();
        self.wait_parked();
        // The vCPU threads first, the ticker (pushed last) after them.
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
