//! A Linux VM's vCPU threads: each waits for its vCPU to be powered on
//! (PSCI CPU_ON, or the boot vCPU at start) or for a saved state to
//! resume from (the STATE command), starts it on its QEMU CPU and answers
//! its exits ([`crate::linux::vcpu`]) until the vCPU turns off or the VM
//! stops; a pause stops each vCPU at its next exit with its whole state
//! saved by the stub (ACT_SAVE).

use crate::layout::{self, mb};
use crate::linux::gic::ICH_HCR_EN;
use crate::linux::placement::PlacedVcpu;
use crate::linux::psci::PowerState;
use crate::linux::shared::{Shared, StopReason, HCR_LINUX};
use crate::linux::timer::CNTHCTL_LINUX;
use crate::linux::vcpu::{self, Next, CURRENT};
use crate::linux::vcpu_state::{VcpuState, ACT_SAVE, CMD_STATE};
use crate::machine::Mailbox;
use crate::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the pause protocol shares between the VM and its vCPU threads.
pub(crate) struct Ctl {
    /// Mirrors `CtlState::pause` for the exit path's quick check.
    pause_flag: AtomicBool,
    m: Mutex<CtlState>,
    cv: Condvar,
}

pub(crate) struct CtlState {
    /// The VM is to be (or is) paused.
    pub(crate) pause: bool,
    /// vCPU threads that are stopped (saved, or idle) while paused.
    pub(crate) parked: Vec<bool>,
    /// States saved at the pause (vCPUs that were running).
    pub(crate) saved: Vec<Option<VcpuState>>,
    /// States to start from on resume.
    pub(crate) restore: Vec<Option<VcpuState>>,
    /// vCPUs whose CPU the thread kicks after posting its first command
    /// (see [`Start`]).
    pub(crate) kick: Vec<bool>,
}

impl Ctl {
    /// A control for `vcpus` vCPUs, paused or not.
    pub(crate) fn new(vcpus: usize, paused: bool) -> Ctl {
        Ctl {
            pause_flag: AtomicBool::new(paused),
            m: Mutex::new(CtlState {
                pause: paused,
                parked: vec![false; vcpus],
                saved: vec![None; vcpus],
                restore: vec![None; vcpus],
                kick: vec![false; vcpus],
            }),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, CtlState> {
        self.m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets or clears the pause and wakes the threads.
    pub(crate) fn set_pause(&self, g: &mut CtlState, on: bool) {
        g.pause = on;
        self.pause_flag.store(on, Ordering::Release);
        self.cv.notify_all();
    }

    /// Waits until every vCPU thread is parked, or until `deadline`.
    /// The running ones are kicked together (`kick`, one call for all of
    /// them), then again only if [`REKICK`] passes without every one
    /// parked. The lock is not held across a kick: a kick is a round trip
    /// to the service CPU (0.1-7 ms on a loaded host), and a vCPU that
    /// stopped must take the lock to say it parked.
    ///
    /// # Errors
    /// A message naming the vCPUs that did not stop.
    pub(crate) fn wait_parked(
        &self,
        deadline: Instant,
        kick: impl Fn(&[usize]),
    ) -> std::result::Result<(), String> {
        let mut kicked: Option<Instant> = None;
        let mut g = self.lock();
        loop {
            let running: Vec<usize> = (0..g.parked.len()).filter(|&v| !g.parked[v]).collect();
            if running.is_empty() {
                return Ok(());
            }
            let now = Instant::now();
            if now > deadline {
                return Err(format!("vCPUs {running:?} did not stop for the pause"));
            }
            let since = kicked.map(|t| now.saturating_duration_since(t));
            match since {
                Some(since) if since < REKICK => {
                    g = self
                        .cv
                        .wait_timeout(g, REKICK - since)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                _ => {
                    // Parked is looked at again under the lock after the
                    // kick, so a vCPU that parks meanwhile is not missed.
                    drop(g);
                    kick(&running);
                    kicked = Some(Instant::now());
                    g = self.lock();
                }
            }
        }
    }
}

/// How long a pause waits for its kicked vCPUs before it kicks the ones
/// still running again (a vCPU powered on by another just as the kick
/// went out, say). The pause is inside a migration's downtime: a vCPU
/// its first kick did not stop waits at most this long more. A kick
/// costs one service-CPU command; an idle guest's pause ends within
/// milliseconds, before any second kick.
const REKICK: Duration = Duration::from_millis(10);

/// How a vCPU starts, and whether its CPU is kicked once the command is
/// posted: a blank machine's CPU whose park ended without a kick may be
/// in a wait of up to the park's length, and one kick after the command
/// (a round trip through the service CPU, rung by the host's bell) wakes
/// it to find the command, where a kick before the command (as the park
/// ended) left it to wait out the usual 640 us idle wait for it.
enum Start {
    /// From its reset state at an entry point with x0 (PSCI CPU_ON, boot).
    Boot(u64, u64, bool),
    /// From a saved state.
    State(Box<VcpuState>, bool),
}

/// Runs vCPU `id` until the VM stops: waits for a start, runs, parks at
/// a pause with its state saved.
///
/// # Errors
/// The engine's errors, an exit the host cannot answer, QEMU exiting.
pub(crate) fn vcpu_main(sh: &Shared, ctl: &Ctl, id: usize) -> Result<()> {
    CURRENT.with(|c| c.set(Some(id)));
    let mut vcpu = sh.vm.new_vcpu(id)?;
    while let Some(start) = next_start(sh, ctl, id) {
        match run_one(sh, ctl, id, &mut *vcpu, start) {
            Ok(Some(state)) => {
                let mut g = ctl.lock();
                g.saved[id] = Some(state);
                g.parked[id] = true;
                ctl.cv.notify_all();
            }
            Ok(None) => sh.cpus.set_power(id, PowerState::Off),
            Err(e) => {
                sh.cpus.set_power(id, PowerState::Off);
                sh.stop(StopReason::Error(e.to_string()));
                let mut g = ctl.lock();
                g.parked[id] = true;
                ctl.cv.notify_all();
                return Err(e);
            }
        }
    }
    Ok(())
}

/// Waits for this vCPU's next start: a state to resume from, or a power-on
/// (only while the VM is not paused). `None` once the VM stops.
fn next_start(sh: &Shared, ctl: &Ctl, id: usize) -> Option<Start> {
    let mut g = ctl.lock();
    loop {
        if sh.stopping() {
            g.parked[id] = true;
            ctl.cv.notify_all();
            return None;
        }
        if g.pause {
            if !g.parked[id] {
                g.parked[id] = true;
                ctl.cv.notify_all();
            }
        } else {
            g.parked[id] = false;
            if let Some(s) = g.restore[id].take() {
                let kick = std::mem::take(&mut g.kick[id]);
                return Some(Start::State(Box::new(s), kick));
            }
            let on = sh.cpus.take_start(id);
            if let Some((entry, x0)) = on {
                let kick = std::mem::take(&mut g.kick[id]);
                return Some(Start::Boot(entry, x0, kick));
            }
        }
        g = ctl
            .cv
            .wait_timeout(g, Duration::from_millis(20))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Posts the start's command to the vCPU's mailbox: Linux's entry for a
/// boot, the saved state for a restore. Returns the command's sequence
/// and whether the vCPU's CPU is to be kicked.
fn post_start(sh: &Shared, mbox: &Mailbox<'_>, start: Start) -> (u64, bool) {
    let (vtcr, vttbr) = sh.vm.stage2_regs();
    let voff = sh.devices.timer.cntvoff();
    match start {
        Start::Boot(entry, x0, kick) => {
            let args = [
                vtcr,
                vttbr,
                HCR_LINUX,
                entry,
                x0,
                0,
                0,
                0,
                ICH_HCR_EN,
                voff,
                CNTHCTL_LINUX,
            ];
            (mbox.post(layout::CMD_LINUX, &args), kick)
        }
        Start::State(s, kick) => {
            s.write(mbox);
            let args = [vtcr, vttbr, HCR_LINUX, 1, voff, CNTHCTL_LINUX];
            (mbox.post(CMD_STATE, &args), kick)
        }
    }
}

/// Runs one start of the vCPU: `Some(state)` if it stopped for a pause,
/// `None` if it turned off or the VM stopped.
fn run_one(
    sh: &Shared,
    ctl: &Ctl,
    id: usize,
    vcpu: &mut dyn PlacedVcpu,
    start: Start,
) -> Result<Option<VcpuState>> {
    let mbox = sh.vm.machine().mailbox(id);
    let mut last = mbox.read(mb::EXIT_SEQ);
    let (run, kick) = post_start(sh, &mbox, start);
    if kick {
        // A kick that fails (QEMU gone) is found by the exit wait below.
        let _ = sh.vm.kick_all(&[id]);
    }
    sh.cpus.set_power(id, PowerState::On);
    loop {
        let Some(e) = vcpu::wait_exit(sh, id, &mbox, last, run)? else {
            return Ok(None);
        };
        last = e.seq;
        let t0 = Instant::now();
        let next = if sh.stopping() {
            Next::Off
        } else {
            vcpu::handle(sh, id, vcpu, &mbox, &e)?
        };
        match next {
            Next::Resume(elr, insns) => {
                let handled = t0.elapsed();
                // A write fault's throttle or pace, before the answer; a
                // pause or a stop cuts it short (not the host's time).
                sh.faults.limit.serve(id, &|| {
                    ctl.pause_flag.load(Ordering::Acquire) || sh.stopping()
                });
                let t1 = Instant::now();
                vcpu::sync_lrs(sh, id, &mbox);
                mbox.write(mb::NEW_ELR, elr);
                add_host_ns(sh, id, handled + t1.elapsed());
                if ctl.pause_flag.load(Ordering::Acquire) {
                    mbox.reply(&e, ACT_SAVE, [0, 0], &insns);
                    sh.vm
                        .machine()
                        .wait("a vCPU saving its state", Instant::now(), || mbox.done(run))?;
                    return Ok(Some(VcpuState::read(&mbox)));
                }
                mbox.reply(&e, layout::ACT_LINUX, [0, 0], &insns);
            }
            // A pause is taken at the next exit (the exception's handler
            // runs first).
            Next::Inject(inj) => vcpu::reply_inject(sh, id, &mbox, &e, &inj),
            Next::Off => {
                mbox.reply(&e, layout::ACT_STOP, [0, 0], &[]);
                sh.vm
                    .machine()
                    .wait("a stopped vCPU", Instant::now(), || mbox.done(run))?;
                return Ok(None);
            }
        }
    }
}

/// Adds `d` to the host's time answering vCPU `id`'s exits.
fn add_host_ns(sh: &Shared, id: usize, d: Duration) {
    sh.host_log.stats[id]
        .host_ns
        .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
}
