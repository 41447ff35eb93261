//! A Linux VM's vCPU threads: each waits for its vCPU to be powered on
//! (PSCI CPU_ON, or the boot vCPU at start) or for a saved state to
//! resume from (the STATE command), starts it on its QEMU CPU and answers
//! its exits ([`crate::linux::vcpu`]) until the vCPU turns off or the VM
//! stops; a pause stops each vCPU with its whole state saved by the stub:
//! at the pause's kick by the stub itself ([`take_kick_save`]), or at an
//! exit the host was answering, by its ACT_SAVE answer.

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
    /// The start command of each vCPU while it runs: a state the stub
    /// saved at a pause's kick ends it ([`take_kick_save`]).
    pub(crate) runs: Vec<Option<u64>>,
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
                runs: vec![None; vcpus],
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
    /// stopped must take the lock to say it parked. After a kick, `poll`
    /// looks (under the lock) for states the stub saved at the kick
    /// ([`take_kick_save`]) every [`POLL`], and every [`POLL_LATE`] once
    /// [`POLL_FOR`] has passed: such a save rings no doorbell, so nothing
    /// else would wake the vCPU's thread for it.
    ///
    /// # Errors
    /// A message naming the vCPUs that did not stop.
    pub(crate) fn wait_parked(
        &self,
        deadline: Instant,
        kick: impl Fn(&[usize]),
        poll: impl Fn(&mut CtlState),
    ) -> std::result::Result<(), String> {
        let mut kicked: Option<Instant> = None;
        let mut g = self.lock();
        loop {
            if kicked.is_some() {
                poll(&mut g);
            }
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
                    let nap = if since < POLL_FOR { POLL } else { POLL_LATE };
                    g = self
                        .cv
                        .wait_timeout(g, (REKICK - since).min(nap))
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
/// The pause's wait between two looks for a state saved at its kick: a
/// kicked vCPU of an idle guest saves within 100 to 500 us of the kick.
const POLL: Duration = Duration::from_micros(20);
/// How long after a kick the pause looks every [`POLL`].
const POLL_FOR: Duration = Duration::from_millis(3);
/// The wait between two looks after that: a vCPU that takes long to stop
/// costs the pausing thread a look this often.
const POLL_LATE: Duration = Duration::from_micros(500);

/// What the status of a vCPU's start command says when the stub saved the
/// vCPU's state at a pause's kick (`asm/state.S`, `RET_KICK_SAVED`).
const KICK_SAVED: u64 = 0x21;

/// Takes vCPU `id`'s state if its CPU saved it at a pause's kick: merged
/// with the pending interrupts, into `saved`, the vCPU parked. The
/// pausing thread and the vCPU's own thread both look; whichever does
/// first (under the lock) takes it, and the start's command is then no
/// longer the vCPU's ([`CtlState::runs`]). Returns whether it took it.
pub(crate) fn take_kick_save(sh: &Shared, g: &mut CtlState, id: usize) -> bool {
    let Some(run) = g.runs[id] else {
        return false;
    };
    let mbox = sh.vm.machine().mailbox(id);
    if !mbox.done(run) || mbox.read(mb::RET) != KICK_SAVED {
        return false;
    }
    let mut st = VcpuState::read(&mbox);
    vcpu::sync_saved_lrs(sh, id, &mut st);
    g.runs[id] = None;
    g.saved[id] = Some(st);
    g.parked[id] = true;
    true
}

/// How a start of a vCPU ended.
enum Ended {
    /// Stopped by a pause at an exit (ACT_SAVE): its state.
    Saved(Box<VcpuState>),
    /// Stopped by a pause's kick: its state is in the control already.
    Parked,
    /// Turned off, or the VM stopped.
    Off,
}

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
        let ended = run_one(sh, ctl, id, &mut *vcpu, start);
        ctl.lock().runs[id] = None;
        match ended {
            Ok(Ended::Saved(state)) => {
                let mut g = ctl.lock();
                g.saved[id] = Some(*state);
                g.parked[id] = true;
                ctl.cv.notify_all();
            }
            Ok(Ended::Parked) => ctl.cv.notify_all(),
            Ok(Ended::Off) => sh.cpus.set_power(id, PowerState::Off),
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
    // Set only while a pause is pending, which this start is not in.
    mbox.write(mb::SAVE_ON_KICK, 0);
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

/// Runs one start of the vCPU until it stops for a pause or turns off
/// (or the VM stops).
fn run_one(
    sh: &Shared,
    ctl: &Ctl,
    id: usize,
    vcpu: &mut dyn PlacedVcpu,
    start: Start,
) -> Result<Ended> {
    let mbox = sh.vm.machine().mailbox(id);
    let mut last = mbox.read(mb::EXIT_SEQ);
    let (run, kick) = post_start(sh, &mbox, start);
    ctl.lock().runs[id] = Some(run);
    if kick {
        // A kick that fails (QEMU gone) is found by the exit wait below.
        let _ = sh.vm.kick_all(&[id]);
    }
    sh.cpus.set_power(id, PowerState::On);
    loop {
        let Some(e) = vcpu::wait_exit(sh, id, &mbox, last, run)? else {
            // The command ended without an exit: a save at a pause's kick
            // (taken here or by the pausing thread already), or a stop.
            let mut g = ctl.lock();
            if g.runs[id].is_none() || take_kick_save(sh, &mut g, id) {
                return Ok(Ended::Parked);
            }
            return Ok(Ended::Off);
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
                    return Ok(Ended::Saved(Box::new(VcpuState::read(&mbox))));
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
                return Ok(Ended::Off);
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
