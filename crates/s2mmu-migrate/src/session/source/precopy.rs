//! The pre-copy round loop: each round sends what is pending (all memory
//! in round 0), harvests what the guest dirtied meanwhile, and decides
//! whether what is left fits the downtime budget, needs convergence help,
//! or calls for the switch to post-copy.

use super::super::guest::{GuestShape, RoundHook};
use super::super::postcopy::Postcopy;
use super::super::timeline::Timeline;
use super::figures::MIB;
use super::{Converge, RoundStat, Sender, SourceConfig};
use crate::stream_error::MigrateError;
use crate::vm::{GuestRun, SessionVm};
use crate::wire::{tag, Enc, PAGE_RECORD_BYTES, PAGE_SIZE};
use std::time::{Duration, Instant};

/// The loop's state across rounds, with what it reads from the run.
pub(super) struct Precopy<'a> {
    pub cfg: &'a SourceConfig,
    pub guest: &'a dyn GuestRun,
    pub timeline: &'a Timeline,
    /// The guest's vCPUs and bytes of memory.
    pub vcpus: u64,
    pub mem_size: u64,
    /// The link figure from the probe, bytes per second.
    pub link: f64,
    /// The configured pace (pages per second per vCPU; 0 unpaced).
    pub pace: u64,
    pub rounds: Vec<RoundStat>,
    pub send_time: Duration,
    pub send_bytes: u64,
    pub last_harvest: Instant,
    pub last_writes: u64,
    pub high_rounds: u32,
    pub throttle_pct: u32,
    pub unthrottled_ns_per_page: f64,
    pub max_throttle: u32,
    pub round: u32,
    /// Set when the loop ended to switch to post-copy.
    pub switch: bool,
}

/// Rounds a migration that shrinks on its own may still need before the
/// throttle starts.
const CONVERGING_ROUNDS: f64 = 2.0;

/// Whether pre-copy converges without help: the next round sends `next`
/// bytes where this one sent `sent`, so each round sends `next / sent` of
/// the one before (the guest's dirtying against the link), and at that
/// ratio what is left now (`est` to send) fits `budget` within
/// [`CONVERGING_ROUNDS`] more rounds. Never for rounds that do not shrink.
pub(super) fn converging(est: Duration, budget: Duration, next: u64, sent: u64) -> bool {
    if sent == 0 || next >= sent {
        return false;
    }
    if est <= budget {
        return true;
    }
    let r = next as f64 / sent as f64;
    (budget.as_secs_f64() / est.as_secs_f64()).ln() / r.ln() <= CONVERGING_ROUNDS
}

/// What one round measured that the decision after it needs.
struct RoundEnd {
    bytes: u64,
    dirty: u64,
    dirty_rate: f64,
    guest_pages_per_s: f64,
    bandwidth: f64,
    remaining: u64,
    est: Duration,
}

impl<'a> Precopy<'a> {
    /// A loop starting now, dirty logging just enabled at `log_start`.
    pub fn new(
        cfg: &'a SourceConfig,
        guest: &'a dyn GuestRun,
        timeline: &'a Timeline,
        shape: &GuestShape,
        link: f64,
        pace: u64,
        log_start: Instant,
    ) -> Self {
        Precopy {
            cfg,
            guest,
            timeline,
            vcpus: u64::from(shape.vcpus),
            mem_size: shape.mem_size,
            link,
            pace,
            rounds: Vec::new(),
            send_time: Duration::ZERO,
            send_bytes: 0,
            last_harvest: log_start,
            last_writes: guest.counters().writes,
            high_rounds: 0,
            throttle_pct: 0,
            unthrottled_ns_per_page: 0.0,
            max_throttle: 0,
            round: 0,
            switch: false,
        }
    }

    /// Runs rounds until what is left fits the budget or post-copy takes
    /// over (`self.switch`).
    ///
    /// # Errors
    /// Sending or harvesting failed, or [`MigrateError::NotConverged`]
    /// at the round limit.
    pub fn run<V: SessionVm, H: RoundHook<V>>(
        &mut self,
        s: &mut Sender<'_, V>,
        hook: &mut H,
    ) -> Result<(), MigrateError> {
        loop {
            let end = self.one_round(s, hook)?;
            if self.decide(&end)? {
                return Ok(());
            }
            self.round += 1;
        }
    }

    /// Sends one round, harvests, records and reports its figures.
    fn one_round<V: SessionVm, H: RoundHook<V>>(
        &mut self,
        s: &mut Sender<'_, V>,
        hook: &mut H,
    ) -> Result<RoundEnd, MigrateError> {
        let round = self.round;
        let page = PAGE_SIZE as u64;
        let t0 = Instant::now();
        let (p0, b0, z0) = s.counts();
        let c0 = s.compression();
        let mut e = Enc::default();
        let start = round == 0 && self.cfg.postcopy == Postcopy::Start;
        e.u32(round).u64(if start {
            0
        } else if round == 0 {
            self.mem_size / page
        } else {
            s.dirty_count()
        });
        s.chans[0].wire.control(tag::ROUND, &e.0)?;
        if start {
            // Post-copy from the start: nothing is sent before the switch
            // (which makes every page missing).
        } else if round == 0 {
            s.send_all()?;
        } else {
            s.send_dirty(false)?;
        }
        let t1 = Instant::now();
        let (p1, b1, z1) = s.counts();
        let (pages, bytes) = (p1 - p0, b1 - b0);
        self.send_time += t1 - t0;
        self.send_bytes += bytes;
        // Harvest what the guest dirtied meanwhile.
        let dirty = s.harvest()?;
        hook.round(s.vm, &s.pending)?;
        let now = Instant::now();
        let dt = (now - self.last_harvest).as_secs_f64().max(1e-9);
        self.last_harvest = now;
        let w = self.guest.counters().writes;
        let guest_pages_per_s = w.saturating_sub(self.last_writes) as f64 / dt;
        self.last_writes = w;
        let dirty_rate = dirty as f64 * page as f64 / dt;
        let bandwidth = self.send_bytes as f64 / self.send_time.as_secs_f64().max(1e-9);
        let remaining = dirty * record_bytes(pages - (z1 - z0), &s.compression().since(&c0));
        let est = Duration::from_secs_f64(remaining as f64 / bandwidth.max(1.0));
        let stat = RoundStat {
            round,
            pages,
            zero_pages: z1 - z0,
            bytes,
            start_s: self.timeline.at(t0),
            end_s: self.timeline.at(t1),
            dirty_after: dirty,
            dirty_rate,
            bandwidth: bytes as f64 / (t1 - t0).as_secs_f64().max(1e-9),
            page_rate: pages as f64 * page as f64 / (t1 - t0).as_secs_f64().max(1e-9),
            throttle_pct: self.throttle_pct,
            pace: self.guest.pace(),
            final_round: false,
        };
        let end = RoundEnd {
            bytes,
            dirty,
            dirty_rate,
            guest_pages_per_s,
            bandwidth,
            remaining,
            est,
        };
        self.report(&stat, &end, t1 - t0);
        self.rounds.push(stat);
        Ok(end)
    }

    /// The round's progress line.
    fn report(&self, stat: &RoundStat, end: &RoundEnd, took: Duration) {
        let cfg = self.cfg;
        if !cfg.progress.is_on() {
            return;
        }
        let page = PAGE_SIZE as u64;
        let (round, pages, dirty) = (stat.round, stat.pages, end.dirty);
        cfg.progress.line(&format!(
            "{}round {round:>2}: sent {pages:>7} pages ({:>7.1} MiB, {} zero) in {:>7.1} ms at {:>7.1} MiB/s ({:>3.0}% of link; memory {:>7.1} MiB/s); guest dirtied {dirty:>6} pages ({:>6.1} MiB/s; {:>9.0} guest writes/s); est. downtime {:>6.1} ms{}",
            cfg.label,
            end.bytes as f64 / MIB,
            stat.zero_pages,
            took.as_secs_f64() * 1e3,
            stat.bandwidth / MIB,
            100.0 * stat.bandwidth / self.link.max(1.0),
            stat.page_rate / MIB,
            end.dirty_rate / MIB,
            end.guest_pages_per_s,
            end.est.as_secs_f64() * 1e3,
            match (self.throttle_pct, cfg.converge) {
                (0, Converge::DirtyLimit) if stat.pace != self.pace => format!("; dirty limit {:.1} MiB/s", (stat.pace * page * self.vcpus) as f64 / MIB),
                (0, _) => String::new(),
                (p, _) => format!("; throttle {p}%"),
            }
        ));
        cfg.progress.step();
    }

    /// Whether the loop ends after this round (`Ok(true)`; `self.switch`
    /// says whether to post-copy), else applies convergence help.
    fn decide(&mut self, end: &RoundEnd) -> Result<bool, MigrateError> {
        let cfg = self.cfg;
        let round = self.round;
        if matches!(cfg.postcopy, Postcopy::On | Postcopy::Start)
            || (cfg.postcopy == Postcopy::Auto && round >= cfg.max_rounds)
        {
            self.switch = true;
            return Ok(true);
        }
        // Half the budget: the rest is the margin for a link or a host
        // slower during the stop-and-copy than on average (another round
        // is cheap when this one is this small).
        if end.est <= cfg.max_downtime / 2 {
            return Ok(true);
        }
        if round >= cfg.max_rounds {
            return Err(MigrateError::NotConverged {
                rounds: round + 1,
                dirty_rate_mib_s: end.dirty_rate / MIB,
                guest_writes_per_s: end.guest_pages_per_s,
                bandwidth_mib_s: end.bandwidth / MIB,
                remaining_mib: end.remaining as f64 / MIB,
                max_downtime_ms: cfg.max_downtime.as_secs_f64() * 1e3,
            });
        }
        // Convergence help, QEMU's trigger: the round dirtied more than
        // half of what it sent; unless the rounds shrink fast enough to
        // fit the budget within a few more (QEMU's one-second periods
        // never count a migration that short).
        let budget = cfg.max_downtime / 2;
        if round > 0
            && end.dirty * PAGE_SIZE as u64 * 2 > end.bytes
            && !converging(end.est, budget, end.remaining, end.bytes)
        {
            self.high_rounds += 1;
            if cfg.postcopy == Postcopy::Auto && self.high_rounds >= 2 {
                // Not converging: post-copy instead of a throttle.
                self.switch = true;
                return Ok(true);
            }
            self.help_converge(end);
        }
        Ok(false)
    }

    /// Throttles the vCPUs or lowers their dirty limit, as configured.
    fn help_converge(&mut self, end: &RoundEnd) {
        let cfg = self.cfg;
        let page = PAGE_SIZE as u64;
        match cfg.converge {
            Converge::Auto if self.high_rounds >= 2 => {
                if self.throttle_pct == 0 {
                    self.unthrottled_ns_per_page =
                        1e9 * self.vcpus as f64 / end.guest_pages_per_s.max(1.0);
                    self.throttle_pct = 20;
                } else {
                    self.throttle_pct = (self.throttle_pct + 10).min(99);
                }
                self.max_throttle = self.max_throttle.max(self.throttle_pct);
                // Sleeping p of the time: a delay of p / (1 - p) of
                // the time a page took unthrottled.
                let p = f64::from(self.throttle_pct) / 100.0;
                let ns = self.unthrottled_ns_per_page * p / (1.0 - p);
                self.guest.set_throttle_ns(ns as u64);
                self.guest.set_throttle_pct(self.throttle_pct);
            }
            Converge::DirtyLimit => {
                let cur = self.guest.pace();
                let quarter = (end.bandwidth / 4.0 / page as f64 / self.vcpus as f64) as u64;
                let limit = if cur == 0 || cur > quarter {
                    quarter
                } else {
                    cur / 2
                };
                self.guest.set_pace(limit.max(1));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn shrinking_rounds_that_fit_soon_need_no_help() {
        // 64 MiB/s over a 110 MiB/s link: each round 0.6 of the last; 345
        // ms left fits 150 ms in under two rounds.
        assert!(converging(MS(345), MS(150), 38 << 20, 64 << 20));
        // Already inside the budget.
        assert!(converging(MS(100), MS(150), 60, 100));
    }

    #[test]
    fn rounds_that_do_not_shrink_or_shrink_slowly_get_help() {
        // A writer as fast as the link: never converging on its own.
        assert!(!converging(MS(600), MS(150), 64 << 20, 64 << 20));
        assert!(!converging(MS(600), MS(150), 70 << 20, 64 << 20));
        // 0.9 a round from 600 ms: 14 rounds to 150 ms.
        assert!(!converging(MS(600), MS(150), 90, 100));
        // 0.6 a round from 2 s: 5 rounds.
        assert!(!converging(MS(2000), MS(150), 60, 100));
        // Nothing sent: nothing to judge by.
        assert!(!converging(MS(600), MS(150), 10, 0));
    }
}

/// Bytes a dirty page is expected to take on the wire: a whole record,
/// less what compression saved per data page in a round of `data_pages`
/// (zero pages not counted: a page dirtied again is seldom zero).
fn record_bytes(data_pages: u64, c: &crate::wire::CompressStats) -> u64 {
    match data_pages {
        0 => PAGE_RECORD_BYTES,
        n => PAGE_RECORD_BYTES - (c.saved() / n).min(PAGE_SIZE as u64),
    }
}

#[cfg(test)]
mod record_bytes_tests {
    use super::*;
    use crate::wire::CompressStats;

    #[test]
    fn compression_lowers_the_expected_bytes_of_a_page() {
        assert_eq!(
            record_bytes(0, &CompressStats::default()),
            PAGE_RECORD_BYTES
        );
        assert_eq!(
            record_bytes(10, &CompressStats::default()),
            PAGE_RECORD_BYTES
        );
        let half = CompressStats {
            pages: 10,
            raw_bytes: 10 * 4096,
            wire_bytes: 10 * 2048,
            ..Default::default()
        };
        assert_eq!(record_bytes(20, &half), PAGE_RECORD_BYTES - 1024);
        assert_eq!(record_bytes(10, &half), 16 + 2048);
    }
}
