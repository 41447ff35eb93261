//! A KVM guest's vCPUs as the migration library's [`GuestRun`]: one
//! thread per vCPU in `KVM_RUN`, stopped at an instruction boundary by a
//! signal that makes `KVM_RUN` return (`EINTR`), their registers read and
//! written through `KVM_GET/SET_REGS` and `KVM_GET/SET_SREGS` while they
//! are stopped.
//!
//! The kick is the real-time signal [`kick_signal`], whose handler (set
//! once per process) does nothing: a process that uses it for something
//! else cannot use this runner.

use super::cpu_state::VcpuState;
use super::session_vm::{KvmVm, NewVcpus};
use crate::Error;
use kvm_bindings::KVM_EXIT_DIRTY_RING_FULL;
use kvm_ioctls::{VcpuExit, VcpuFd};
use s2mmu_migrate::vm::{GuestCounters, GuestRun};
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;
use std::time::Duration;

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

struct Shared {
    ctl: Mutex<Ctl>,
    cv: Condvar,
    fds: Vec<Mutex<VcpuFd>>,
    passes: Vec<AtomicU64>,
    ring_full: Arc<[AtomicBool]>,
    handler: Arc<ExitHandler>,
}

impl Shared {
    fn ctl(&self) -> MutexGuard<'_, Ctl> {
        self.ctl.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Running vCPUs: created paused or running, stopped for good on drop.
pub struct KvmVcpus {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Dropped after the threads are joined: the memory the vCPUs write
    /// outlives them.
    _vm: Arc<KvmVm>,
}

impl KvmVcpus {
    /// Loads `state` into the vCPUs (one each; none: the registers as
    /// set) and starts a thread per vCPU, paused when `paused`; `handler`
    /// takes the exits the runner does not.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a state per vCPU that does not
    /// match; `KVM_SET_REGS`/`KVM_SET_SREGS` refused.
    pub fn start(
        vcpus: NewVcpus,
        state: Option<&[VcpuState]>,
        handler: Arc<ExitHandler>,
        paused: bool,
    ) -> Result<KvmVcpus, Error> {
        let NewVcpus { fds, vm } = vcpus;
        if let Some(st) = state {
            if st.len() != fds.len() {
                let why = format!("{} states for {} vCPUs", st.len(), fds.len());
                return Err(Error::invalid("state", why));
            }
            for (fd, s) in fds.iter().zip(st) {
                fd.set_sregs(&s.sregs)
                    .map_err(|e| Error::from_errno("KVM_SET_SREGS", e))?;
                fd.set_regs(&s.regs)
                    .map_err(|e| Error::from_errno("KVM_SET_REGS", e))?;
            }
        }
        install_kick();
        let shared = Arc::new(Shared {
            ctl: Mutex::new(Ctl {
                pause: paused,
                ..Ctl::default()
            }),
            cv: Condvar::new(),
            passes: fds.iter().map(|_| AtomicU64::new(0)).collect(),
            fds: fds.into_iter().map(Mutex::new).collect(),
            ring_full: vm.ring_full_flags(),
            handler,
        });
        let threads = (0..shared.fds.len())
            .map(|i| {
                let sh = shared.clone();
                std::thread::spawn(move || vcpu_loop(&sh, i))
            })
            .collect();
        Ok(KvmVcpus {
            shared,
            threads,
            _vm: vm,
        })
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

    /// Every vCPU's registers. Pauses the vCPUs first (they stay paused).
    ///
    /// # Errors
    /// `KVM_GET_REGS`/`KVM_GET_SREGS` refused.
    pub fn save(&self) -> Result<Vec<VcpuState>, Error> {
        self.pause();
        self.shared
            .fds
            .iter()
            .map(|fd| {
                let fd = fd.lock().unwrap_or_else(|p| p.into_inner());
                Ok(VcpuState {
                    regs: fd
                        .get_regs()
                        .map_err(|e| Error::from_errno("KVM_GET_REGS", e))?,
                    sregs: fd
                        .get_sregs()
                        .map_err(|e| Error::from_errno("KVM_GET_SREGS", e))?,
                })
            })
            .collect()
    }

    /// Kicks every thread not yet parked until all are.
    fn wait_parked(&self) {
        let n = self.threads.len();
        let mut c = self.shared.ctl();
        while c.parked < n {
            for t in &self.threads {
                // SAFETY: the thread is not joined yet (joined only in
                // drop), so its pthread_t is valid; the signal's handler
                // does nothing.
                unsafe { libc::pthread_kill(t.as_pthread_t(), kick_signal()) };
            }
            c = self
                .shared
                .cv
                .wait_timeout(c, Duration::from_millis(1))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// One vCPU's thread: runs until paused or stopped, parks meanwhile.
fn vcpu_loop(sh: &Shared, i: usize) {
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
        if let Err(why) = run_once(sh, i) {
            let mut c = sh.ctl();
            c.errors.push(format!("vCPU {i}: {why}"));
            c.parked += 1; // for good: pause() must not wait for it
            sh.cv.notify_all();
            return;
        }
    }
}

/// One `KVM_RUN` and its exit.
fn run_once(sh: &Shared, i: usize) -> Result<(), String> {
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
        self.wait_parked();
    }

    fn request_pause(&self) {
        self.shared.ctl().pause = true;
    }

    fn resume(&self) {
        self.shared.ctl().pause = false;
        self.shared.cv.notify_all();
    }

    /// Unknown here (zeros): KVM does not count the guest's writes.
    fn counters(&self) -> GuestCounters {
        GuestCounters::default()
    }

    /// Not supported: KVM has no per-write delay, so auto-converge does
    /// nothing for this guest.
    fn set_throttle_ns(&self, _ns: u64) {}

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
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
