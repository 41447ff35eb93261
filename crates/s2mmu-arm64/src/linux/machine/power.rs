//! A Linux VM's vCPU control: each vCPU's power state (PSCI's CPU_ON,
//! CPU_OFF and AFFINITY_INFO against it), a vCPU thread's wait to be
//! powered on, and the VM's stop: its flag, its reason, its deadline and
//! the vCPUs' modes ([`Watch`]). The kicks a stop sends need the engine's
//! placement, so [`crate::linux::shared::Shared::stop`] sends them.

use crate::linux::psci::{self, PowerState};
use crate::linux::watch::Watch;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Why the guest stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// PSCI SYSTEM_OFF.
    PowerOff,
    /// PSCI SYSTEM_RESET (the VM stops; `reboot::run_rebooting` may boot it
    /// again).
    Reset,
    /// PSCI CPU_OFF on the last vCPU that was on: no CPU is left to run.
    CpusOff,
    /// The run's time limit passed.
    Timeout,
    /// A vCPU met an error (its text).
    Error(String),
    /// The operator typed the console's escape, `Ctrl-A x`
    /// ([`crate::linux::vm::run_interactive`]).
    Escape,
}

/// Each vCPU's power state, and where one about to start starts.
pub(crate) struct Power {
    pub(crate) state: Vec<PowerState>,
    pub(crate) start: Vec<Option<(u64, u64)>>,
}

/// The vCPUs' power states and the VM's stop.
pub(crate) struct VcpuControl {
    pub(crate) power: Mutex<Power>,
    stopping: AtomicBool,
    pub(crate) reason: Mutex<Option<StopReason>>,
    pub(crate) deadline: Instant,
    /// The vCPUs' modes, the stop's time and the deadline's thread.
    pub(crate) watch: Arc<Watch>,
}

impl VcpuControl {
    /// Control over `power.state.len()` vCPUs, each in the host, until
    /// `deadline`.
    pub(crate) fn new(power: Power, deadline: Instant) -> VcpuControl {
        let n = power.state.len();
        VcpuControl {
            power: Mutex::new(power),
            stopping: AtomicBool::new(false),
            reason: Mutex::new(None),
            deadline,
            watch: Watch::new(n),
        }
    }

    /// How many vCPUs the VM has.
    pub(crate) fn vcpus(&self) -> usize {
        self.power
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .state
            .len()
    }

    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Notes the stop and its reason (the first one counts) and wakes the
    /// threads waiting for CPU_ON; the caller kicks the vCPUs.
    pub(crate) fn mark_stopped(&self, why: StopReason) {
        self.reason.lock().unwrap().get_or_insert(why);
        self.stopping.store(true, Ordering::SeqCst);
        self.watch.stopped();
    }

    /// Why the VM stopped, once it has.
    pub(crate) fn stop_reason(&self) -> Option<StopReason> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the deadline has passed with the VM not yet stopped.
    pub(crate) fn past_deadline(&self) -> bool {
        !self.stopping() && Instant::now() > self.deadline
    }

    pub(crate) fn power(&self, v: usize) -> PowerState {
        self.power.lock().unwrap().state[v]
    }

    pub(crate) fn set_power(&self, v: usize, s: PowerState) {
        self.power.lock().unwrap().state[v] = s;
        self.watch.powered(v, s == PowerState::On);
    }

    /// PSCI CPU_ON: returns its status code.
    pub(crate) fn cpu_on(&self, target: u64, entry: u64, context: u64) -> i64 {
        let mut p = self.power.lock().unwrap();
        let Some(t) = psci::vcpu_of(target, p.state.len()) else {
            return psci::RET_INVALID_PARAMS;
        };
        match p.state[t] {
            PowerState::On => psci::RET_ALREADY_ON,
            PowerState::OnPending => psci::RET_ON_PENDING,
            PowerState::Off => {
                p.state[t] = PowerState::OnPending;
                p.start[t] = Some((entry, context));
                psci::RET_SUCCESS
            }
        }
    }

    /// PSCI CPU_OFF from vCPU `id`: its power state is off. Returns
    /// whether no vCPU is left on or about to start (the caller stops the
    /// VM then, as KVM reports the VM stopped when its last CPU is off).
    pub(crate) fn cpu_off(&self, id: usize) -> bool {
        let mut p = self.power.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = p.state.get_mut(id) {
            *s = PowerState::Off;
        }
        p.state.iter().all(|s| *s == PowerState::Off)
    }

    /// Where vCPU `v` is to start (its entry and x0), if CPU_ON or the
    /// boot asked for it; taken, so it starts once.
    pub(crate) fn take_start(&self, v: usize) -> Option<(u64, u64)> {
        self.power.lock().unwrap_or_else(|p| p.into_inner()).start[v].take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn control(n: usize) -> VcpuControl {
        let mut state = vec![PowerState::Off; n];
        state[0] = PowerState::On;
        let power = Power {
            state,
            start: vec![None; n],
        };
        VcpuControl::new(power, Instant::now() + Duration::from_secs(60))
    }

    #[test]
    fn cpu_on_starts_an_off_vcpu_once_and_the_last_cpu_off_says_so() {
        let c = control(2);
        assert_eq!(c.vcpus(), 2);
        assert_eq!(c.cpu_on(1, 0x8000, 7), psci::RET_SUCCESS);
        assert_eq!(c.cpu_on(1, 0x8000, 7), psci::RET_ON_PENDING);
        assert_eq!(c.cpu_on(0, 0x8000, 7), psci::RET_ALREADY_ON);
        assert_eq!(c.cpu_on(2, 0x8000, 7), psci::RET_INVALID_PARAMS);
        assert_eq!(c.take_start(1), Some((0x8000, 7)));
        assert_eq!(c.take_start(1), None, "a start is taken once");
        c.set_power(1, PowerState::On);
        assert!(!c.cpu_off(0), "vCPU 1 is still on");
        assert!(c.cpu_off(1), "the last vCPU is off");
        assert!(!c.stopping());
        c.mark_stopped(StopReason::CpusOff);
        c.mark_stopped(StopReason::Timeout);
        assert!(c.stopping() && !c.past_deadline());
        assert_eq!(*c.reason.lock().unwrap(), Some(StopReason::CpusOff));
    }
}
