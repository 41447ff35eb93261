//! A restore on a blank machine: its parked CPUs woken for the state,
//! and where the restore's time went ([`RestoreClock`]).

use super::{LinuxVm, RestoreClock};

impl LinuxVm {
    /// Ends a blank VM's park ([`BLANK_PARK`](super::BLANK_PARK)) at
    /// once: every CPU is back to the usual idle waits, the vCPUs' CPUs
    /// woken by a kick (the service CPU, rung by the host's bell, sends
    /// it), so that the resume's commands are picked up without waiting
    /// out a park's wait.
    /// [`LinuxVm::load_guest_state`] needs no call before it: it ends
    /// the park itself and has each vCPU's CPU kicked once the vCPU's
    /// STATE command is posted, which wakes the CPU to find the command
    /// (a kick before it left the CPU to wait out an idle wait of up to
    /// 640 us for it). After this call it finds nothing parked.
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

    /// Ends a blank VM's park for a restore without a kick: every CPU is
    /// back to the usual idle waits once the wait in progress has ended.
    /// Returns the vCPUs whose CPUs were parked: each is kicked by its
    /// thread right after its first command is posted, so the CPU wakes
    /// to find the command (see `vcpu_thread`'s `Start`). The service CPU
    /// needs no kick: the vCPUs' kicks ring it out of its wait.
    pub(in crate::linux) fn unpark_for_restore(&self) -> Vec<bool> {
        let parked = (0..self.vcpus)
            .map(|cpu| self.machine.mailbox(cpu).parked())
            .collect();
        for cpu in 0..self.machine.cpus() {
            self.machine.mailbox(cpu).unpark();
        }
        parked
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
