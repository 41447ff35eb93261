//! A Linux VM paused, saved, restored and migrated ([`LinuxVm`], made by
//! the one lifecycle of `machine/lifecycle/`), driven step by step:
//! [`LinuxVm::pause_vcpus`], [`LinuxVm::guest_state`],
//! [`LinuxVm::load_guest_state`], [`LinuxVm::resume_vcpus`]. The
//! `s2mmu-arm64-migrate` crate puts it behind the migration library's
//! session.
//!
//! A pause kicks every running vCPU; at its next exit the host answers
//! as usual but with ACT_SAVE, and the stub stores the vCPU's registers
//! (asm/state.S). Resume (on the same machine or another) starts each
//! vCPU with the STATE command from those registers. On a new machine
//! CNTVOFF_EL2 is set so that the guest's virtual count continues from
//! the value it had at the pause: the downtime is invisible to the
//! guest's clock.

use crate::linux::devices::device::DeviceState;
use crate::linux::gic::Gic;
use crate::linux::psci::PowerState;
use crate::linux::shared::{Power, StopReason};
use crate::linux::start::StartState;
use crate::linux::timer::{TimerState, VirtualTimer};
use crate::linux::vcpu_state::VcpuState;
use crate::linux::vm_state::{LinuxState, VcpuPart};
use crate::{Arm64Error, Result};
use std::time::{Duration, Instant};

mod ram;
mod restore;
pub use crate::linux::lifecycle::{LinuxVm, RestoreClock, BLANK_PARK};
pub use crate::linux::placement::EngineLog;

/// How long a pause may take (a loaded 2-core host runs QEMU slowly).
const PAUSE_DEADLINE: Duration = Duration::from_secs(60);

impl LinuxVm {
    /// Stops every vCPU at an instruction boundary (their registers
    /// saved); memory and state are then stable.
    ///
    /// # Errors
    /// The VM never ran, a vCPU did not stop in time, or the guest
    /// stopped with an error.
    pub fn pause_vcpus(&mut self) -> Result<()> {
        let r = self.running()?;
        if self.paused {
            return Ok(());
        }
        {
            let mut g = r.ctl.lock();
            r.ctl.set_pause(&mut g, true);
        }
        let sh = r.sh.clone();
        r.ctl
            .wait_parked(Instant::now() + PAUSE_DEADLINE, |running| {
                let on: Vec<usize> = running
                    .iter()
                    .copied()
                    .filter(|&v| sh.cpus.power(v) == PowerState::On)
                    .collect();
                // A kick that fails (QEMU gone) ends with the vCPU
                // threads, which stop with that error and park.
                if !on.is_empty() {
                    if let Err(e) = sh.vm.kick_all(&on) {
                        eprintln!("linux guest: pause: kick {on:?}: {e}");
                    }
                }
            })
            .map_err(Arm64Error::Guest)?;
        if let Some(StopReason::Error(e)) = self.stopped() {
            return Err(Arm64Error::Guest(format!("the guest stopped: {e}")));
        }
        let saved = r
            .ctl
            .lock()
            .saved
            .iter()
            .flatten()
            .map(|s| s.cntvct)
            .collect::<Vec<_>>();
        let vct = r.sh.devices.timer.save(saved.into_iter()).vct;
        self.paused_vct = vct;
        self.paused = true;
        Ok(())
    }

    /// Runs the vCPUs again (after a pause, or for the first time after
    /// [`LinuxVm::load_guest_state`]); returns once the first one executes
    /// guest code.
    ///
    /// # Errors
    /// The VM has no state, a vCPU did not start, or QEMU died.
    pub fn resume_vcpus(&mut self) -> Result<()> {
        let r = self.running()?;
        if !self.paused {
            return Ok(());
        }
        let t0 = Instant::now();
        // The first resume after a load ends a restore; later ones are
        // not timed.
        let restoring = !self.ran;
        let mbox: Vec<_> = (0..self.vcpus).map(|v| self.machine.mailbox(v)).collect();
        let first = {
            let mut g = r.ctl.lock();
            for v in 0..self.vcpus {
                if let Some(s) = g.saved[v].take() {
                    g.restore[v] = Some(s);
                }
            }
            let first = (0..self.vcpus).find(|&v| g.restore[v].is_some());
            if let Some(v) = first {
                VcpuState::clear_entered(&mbox[v]);
            }
            r.ctl.set_pause(&mut g, false);
            first
        };
        self.paused = false;
        self.ran = true;
        self.written = None;
        // Returns at the first guest instruction: the stub marks its ERET
        // with the counter.
        let mut stamp = None;
        if let Some(v) = first {
            loop {
                let s = VcpuState::entered_at(&mbox[v]);
                if s != 0 {
                    stamp = Some(s);
                    break;
                }
                if t0.elapsed() > PAUSE_DEADLINE {
                    return Err(Arm64Error::Guest(format!("vCPU {v} did not start")));
                }
                self.machine.check_alive()?;
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let seen = Instant::now();
        // The stamp on the host's clock, never after the host saw it.
        let placed = match (stamp, self.counter_anchor) {
            (Some(s), Some(a)) => Some(a.instant_of(s)),
            _ => None,
        };
        let at = placed.map_or(seen, |p| p.clamp(t0, seen));
        self.first_instruction_at = Some(at);
        if restoring {
            self.restore_clock.first_instruction = at - t0;
            self.restore_clock.first_seen = seen - t0;
            self.restore_clock.first_placed =
                placed.map_or(Duration::ZERO, |p| p.saturating_duration_since(t0));
        }
        Ok(())
    }
}

impl LinuxVm {
    /// When the first guest instruction after the last
    /// [`LinuxVm::resume_vcpus`] ran, on the host's monotonic clock: the
    /// stub's counter stamp at the guest's entry, placed by the counter
    /// anchor a blank machine reads when it is made (late by at most that
    /// read's round trip, [`RestoreClock::anchor_round_trip`]), or when
    /// the host saw the stamp where there is no anchor. `None` before the
    /// first resume.
    pub fn first_instruction_at(&self) -> Option<Instant> {
        self.first_instruction_at
    }

    /// The vCPU and device state of the paused VM ([`LinuxState`]; the
    /// `s2mmu-arm64-migrate` crate encodes it as a migration's STATE body).
    ///
    /// # Errors
    /// The VM has no state or is not paused.
    pub fn guest_state(&mut self) -> Result<LinuxState> {
        let r = self.running()?;
        if !self.paused {
            return Err(Arm64Error::Guest(
                "the VM must be paused to save its state".into(),
            ));
        }
        let g = r.ctl.lock();
        let vcts: Vec<u64> = g.saved.iter().flatten().map(|s| s.cntvct).collect();
        let p = r.sh.cpus.power.lock().unwrap_or_else(|p| p.into_inner());
        let cpus = (0..self.vcpus)
            .map(|v| VcpuPart {
                power: p.state[v],
                start: p.start[v],
                regs: g.saved[v].clone(),
            })
            .collect();
        drop((g, p));
        let (mut gic, mut uart) = (None, None);
        for s in r.sh.devices.save(&vcts) {
            match s {
                DeviceState::Gic(s) => gic = Some(s),
                DeviceState::Uart(s) => uart = Some(s),
                DeviceState::Timer(_) | DeviceState::Stateless => {}
            }
        }
        let missing = |what: &str| Arm64Error::Guest(format!("no device saved the {what}'s state"));
        let gic = Gic::from_state(&*gic.ok_or_else(|| missing("GIC"))?)
            .map_err(|e| Arm64Error::Guest(e.to_string()))?;
        Ok(LinuxState {
            vcpus: self.vcpus,
            mem: self.mem,
            vct: self.paused_vct,
            gic,
            uart: uart.ok_or_else(|| missing("UART"))?,
            cpus,
        })
    }

    /// Loads a state [`LinuxVm::guest_state`] made into this paused VM,
    /// which has not run guest code; it runs from it on
    /// [`LinuxVm::resume_vcpus`]. State of another VM size is refused
    /// (naming what is wrong) with the VM unchanged.
    ///
    /// # Errors
    /// A state for another VM size, a VM that is not paused or has run,
    /// or its vCPU threads not starting.
    pub fn load_guest_state(&mut self, st: LinuxState) -> Result<()> {
        if !self.paused {
            return Err(Arm64Error::Guest(
                "state is restored into a paused VM only".into(),
            ));
        }
        // Every check first: a refused state leaves the VM as it was.
        st.fits(self.vcpus, self.mem)?;
        if self.ran {
            return Err(Arm64Error::Guest(
                "this QEMU has run guest code: write the guest's memory first (it then \
                 starts a new QEMU, whose translated-code cache is empty)"
                    .into(),
            ));
        }
        let kick = self.unpark_for_restore();
        self.take_down()?;
        let t0 = Instant::now();
        let had_anchor = self.counter_anchor.is_some();
        let now = self.counter_now()?;
        let t1 = Instant::now();
        if !had_anchor {
            // Read through the service CPU just now (a machine made anew
            // for a guest coming back): it anchors the first instruction's
            // stamp.
            self.anchor_counter(now, t0, t1);
        }
        let timer = VirtualTimer::restore(&TimerState { vct: st.vct }, now);
        let power = Power {
            state: st.cpus.iter().map(|c| c.power).collect(),
            start: st.cpus.iter().map(|c| c.start).collect(),
        };
        let restore = st.cpus.iter().map(|c| c.regs.clone()).collect();
        self.start(StartState {
            gic: st.gic,
            uart: Some(st.uart),
            power,
            timer,
            restore,
            kick,
            paused: true,
        })?;
        self.paused_vct = st.vct;
        self.restore_clock = RestoreClock {
            counter: t1 - t0,
            threads: t1.elapsed(),
            first_instruction: Duration::ZERO,
            first_seen: Duration::ZERO,
            first_placed: Duration::ZERO,
            anchor_round_trip: self.restore_clock.anchor_round_trip,
        };
        Ok(())
    }
}

impl LinuxVm {
    /// The engine's dirty log of this machine (the same until a guest
    /// comes back to it and it starts a new QEMU, see `renew`).
    pub fn engine_log(&self) -> EngineLog {
        self.placement().dirty_log()
    }
}
