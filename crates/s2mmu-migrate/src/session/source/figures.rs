//! The guest's figures over a run's phases: its counters at an instant
//! and its speed between two of them, which the source's endings share.

use super::super::timeline::{intervals, Sample};
use super::outcome::Phase;
use crate::vm::GuestRun;
use s2mmu_stats::median;
use std::time::Instant;

/// Bytes in a MiB, for the progress lines.
pub const MIB: f64 = (1u64 << 20) as f64;

/// The guest's counters at an instant: time, guest writes, guest
/// execution nanoseconds.
pub fn counters(g: &dyn GuestRun) -> (Instant, u64, u64) {
    let c = g.counters();
    (Instant::now(), c.writes, c.guest_ns)
}

/// The guest between two counter snapshots. The time per write is the
/// median over the timeline's intervals in the phase when it has at least
/// three (robust to a host that deschedules a vCPU now and then), else
/// the phase's mean.
pub fn phase(
    a: (Instant, u64, u64),
    b: (Instant, u64, u64),
    samples: &[Sample],
    from_s: f64,
    to_s: f64,
) -> Phase {
    let w = b.1.saturating_sub(a.1);
    let secs = (b.0 - a.0).as_secs_f64();
    if w == 0 || secs <= 0.0 {
        return Phase::default();
    }
    let per: Vec<f64> = intervals(samples)
        .iter()
        .filter(|i| i.start_s >= from_s && i.end_s <= to_s)
        .filter_map(|i| i.speed.map(|v| 1e9 / v))
        .collect();
    let ns_per_write = match median(&per) {
        Some(m) if per.len() >= 3 => m,
        _ => b.2.saturating_sub(a.2) as f64 / w as f64,
    };
    Phase {
        write_rate: w as f64 / secs,
        ns_per_write,
    }
}
