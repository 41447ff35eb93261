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
    /// From the resume's start to the first vCPU's first instruction: the
    /// stub's counter stamp at the guest's entry placed on the host's
    /// clock by the blank machine's counter anchor (late by at most
    /// [`RestoreClock::anchor_round_trip`]), or when the host saw it where
    /// the machine has no anchor.
    pub first_instruction: Duration,
    /// From the resume's start to the host seeing the first instruction's
    /// stamp (it looks in 50 µs naps: later than the instruction by its
    /// last nap and by however long a loaded host took to run it again).
    pub first_seen: Duration,
    /// From the resume's start to where the counter anchor placed the
    /// stamp, before `first_instruction` bounds it by the resume's start
    /// and `first_seen` (zero without an anchor, or for a placement before
    /// the start). The anchor places a stamp late by at most its round
    /// trip and never early, so a placement beyond `first_seen` plus
    /// [`RestoreClock::anchor_round_trip`] is an anchor or a stamp gone
    /// wrong.
    pub first_placed: Duration,
    /// The round trip of the counter read the blank machine's anchor came
    /// from (zero without one): how late the anchor may place a stamp.
    pub anchor_round_trip: Duration,
}
