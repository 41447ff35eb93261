//! Where pre-copy left the source: what both of its endings take over,
//! the stop-and-copy (`stop_copy`) and the switch to post-copy
//! (`postcopy_switch`).

use super::super::timeline::Timeline;
use super::super::wire::GuestState;
use super::{RoundStat, Sender, SourceConfig};
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{Control, Pattern, Vm, VmFormat, Workload, WorkloadConfig};
use std::sync::Arc;
use std::time::Instant;

/// The running guest, the channels and the figures so far, when pre-copy
/// stopped its rounds.
pub(super) struct PrecopyEnd<'a, 'v, F: VmFormat> {
    pub vm: &'a Arc<Vm<TreeMemslots, F>>,
    pub wl: &'a Workload<TreeMemslots, F>,
    pub wl_cfg: WorkloadConfig,
    pub ctl: &'a Control,
    pub s: &'a mut Sender<'v, F>,
    /// The vCPUs' pace (pages per second per vCPU; 0 unpaced) after the
    /// convergence help.
    pub final_pace: u64,
    /// The last pre-copy round.
    pub round: u32,
    /// The highest throttle any round applied (percent).
    pub max_throttle: u32,
    pub rounds: Vec<RoundStat>,
    pub timeline: Timeline,
    pub log_start: Instant,
    pub log_start_s: f64,
    /// The guest's counters at warm-up start and end and at logging on.
    pub warm: (Instant, u64, u64),
    pub warm_end: (Instant, u64, u64),
    pub warm_end_s: f64,
    pub at_log: (Instant, u64, u64),
    /// The link probe's bytes per second and bytes.
    pub link: f64,
    pub link_bytes: u64,
    pub cfg: &'a SourceConfig,
}

impl<F: VmFormat> PrecopyEnd<'_, '_, F> {
    /// STATE's body for the paused vCPUs: where each stopped and the
    /// workload they run.
    pub fn guest_state(&self) -> GuestState {
        GuestState {
            bytes_per_vcpu: self.wl_cfg.bytes_per_vcpu,
            write_percent: self.wl_cfg.write_percent,
            pattern: u8::from(self.wl_cfg.pattern == Pattern::Random),
            pace_pages_per_sec: self.final_pace,
            vcpus: self.wl.vcpu_states(),
        }
    }

    /// The timeline's clock: seconds on it at an instant (a copy, usable
    /// after the timeline and the rounds are moved out).
    pub fn clock(&self) -> impl Fn(Instant) -> f64 {
        let (start, start_s) = (self.log_start, self.log_start_s);
        move |t| start_s + (t - start).as_secs_f64()
    }
}
