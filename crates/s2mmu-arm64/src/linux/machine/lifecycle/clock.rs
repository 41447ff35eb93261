//! Where a restore's time went.

use std::time::Duration;

/// Where a restore's time went on this machine, from
/// [`LinuxVm::load_guest_state`](crate::linux::migrate::LinuxVm::load_guest_state) to the
/// first guest instruction after
/// [`LinuxVm::resume_vcpus`](crate::linux::migrate::LinuxVm::resume_vcpus) (the
/// destination's `start` part of the downtime, broken down).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RestoreClock {
    /// This machine's counter (for CNTVOFF): carried forward from the read
    /// made with the blank VM (microseconds), or read through its service
    /// CPU, the wait for the CPU to pick the command up included.
    pub counter: Duration,
    /// Starting the vCPU threads around the loaded state.
    pub threads: Duration,
    /// From the resume's start to the first vCPU's first instruction.
    pub first_instruction: Duration,
}
