//! A Linux VM's vCPUs' power states: PSCI's CPU_ON and AFFINITY_INFO
//! against them, a vCPU thread's wait to be powered on, and the VM's side
//! of [`psci::serve`].

use crate::linux::psci::{self, PowerState};
use crate::linux::vm::{Shared, StopReason};
use std::time::Duration;

impl Shared {
    pub(crate) fn power(&self, v: usize) -> PowerState {
        self.power.lock().unwrap().state[v]
    }

    pub(crate) fn set_power(&self, v: usize, s: PowerState) {
        self.power.lock().unwrap().state[v] = s;
        self.watch.powered(v, s == PowerState::On);
    }

    /// PSCI CPU_ON: returns its status code.
    pub(crate) fn cpu_on(&self, target: u64, entry: u64, context: u64) -> i64 {
        let Some(t) = psci::vcpu_of(target, self.gic.vcpus()) else {
            return psci::RET_INVALID_PARAMS;
        };
        let mut p = self.power.lock().unwrap();
        match p.state[t] {
            PowerState::On => psci::RET_ALREADY_ON,
            PowerState::OnPending => psci::RET_ON_PENDING,
            PowerState::Off => {
                p.state[t] = PowerState::OnPending;
                p.start[t] = Some((entry, context));
                self.power_cv.notify_all();
                psci::RET_SUCCESS
            }
        }
    }

    /// Blocks until vCPU `v` is to start (its entry and x0), or the VM
    /// stops (`None`).
    pub(crate) fn wait_power_on(&self, v: usize) -> Option<(u64, u64)> {
        let mut p = self.power.lock().unwrap();
        loop {
            if self.stopping() {
                return None;
            }
            if let Some(s) = p.start[v].take() {
                return Some(s);
            }
            p = self
                .power_cv
                .wait_timeout(p, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }
}

/// PSCI served against the VM's power states (see [`psci::serve`]).
impl psci::PowerControl for Shared {
    fn vcpus(&self) -> usize {
        self.gic.vcpus()
    }

    fn cpu_on(&self, target: u64, entry: u64, context: u64) -> i64 {
        Shared::cpu_on(self, target, entry, context)
    }

    fn power(&self, v: usize) -> PowerState {
        Shared::power(self, v)
    }

    fn cpu_off(&self, id: usize) {
        Shared::cpu_off(self, id);
    }

    fn system_off(&self, reset: bool) {
        self.stop(if reset {
            StopReason::Reset
        } else {
            StopReason::PowerOff
        });
    }
}
