//! A restore on a blank machine: its parked CPUs woken as the state
//! comes, and where the restore's time went ([`RestoreClock`]).

use super::{LinuxVm, RestoreClock};

impl LinuxVm {
    /// Ends a blank VM's park ([`BLANK_PARK`](super::BLANK_PARK)) at
    /// once: every CPU is back to the usual idle waits, the vCPUs' CPUs
    /// woken by a kick (the service CPU, rung by the host's bell, sends
    /// it), so that the resume's commands are picked up without waiting
    /// out a park's wait.
    /// Call it as early as the state is known to come (a migration's
    /// destination does on the STATE record;
    /// [`LinuxVm::load_guest_state`] does too; the second call finds
    /// nothing parked and kicks nothing).
    pub fn unpark_cpus(&self) {
        let parked: Vec<usize> = (0..self.vcpus)
            .filter(|&cpu| self.machine.mailbox(cpu).parked())
            .collect();
        for cpu in 0..self.machine.cpus() {
            self.machine.mailbox(cpu).unpark();
        }
        // A machine that cannot kick (QEMU gone) fails at the restore's
        // next step, by name; its CPUs would only wait out their park.
        if !parked.is_empty() {
            let _ = self.engine_sink().try_kick_all(&parked);
        }
    }

    /// Where the last restore's time went ([`RestoreClock`]; all zero
    /// before the first).
    pub fn restore_clock(&self) -> RestoreClock {
        self.restore_clock
    }

    /// Whether any CPU of this VM's machine is parked (a blank VM before
    /// [`LinuxVm::unpark_cpus`]).
    pub fn cpus_parked(&self) -> bool {
        (0..self.machine.cpus()).any(|cpu| self.machine.mailbox(cpu).parked())
    }
}
