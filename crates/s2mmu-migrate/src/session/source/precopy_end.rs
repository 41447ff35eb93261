//! Where pre-copy left the source: what both of its endings take over,
//! the stop-and-copy (`stop_copy`) and the switch to post-copy
//! (`postcopy_switch`).

use super::super::guest::SourceGuest;
use super::super::timeline::Timeline;
use super::{RoundStat, Sender, SourceConfig};
use std::time::Instant;

/// Where pre-copy left the source.
pub(super) struct PrecopyEnd<'a, 'v, G: SourceGuest> {
    pub guest: &'a G,
    pub s: &'a mut Sender<'v, G::Vm>,
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

impl<G: SourceGuest> PrecopyEnd<'_, '_, G> {
    /// The STATE record's body (the vCPUs paused).
    ///
    /// # Errors
    /// The guest's.
    pub fn guest_state(&self) -> Result<Vec<u8>, crate::stream_error::MigrateError> {
        self.guest.state(self.final_pace)
    }

    /// Timeline seconds of an instant.
    pub fn clock(&self) -> impl Fn(Instant) -> f64 {
        let (start, start_s) = (self.log_start, self.log_start_s);
        move |t| start_s + (t - start).as_secs_f64()
    }
}
