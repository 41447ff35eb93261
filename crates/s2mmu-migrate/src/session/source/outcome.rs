//! What a source run measured: its rounds, the guest's phases, the
//! totals.

use super::super::postcopy::PostcopyOutcome;
use super::super::timeline::Sample;
use std::time::{Duration, Instant};

/// One pre-copy round (round 0 sends all memory; the last is the
/// stop-and-copy with the vCPUs paused).
#[derive(Clone, Debug, Default)]
pub struct RoundStat {
    /// Round number.
    pub round: u32,
    /// Pages sent in it (zero pages included).
    pub pages: u64,
    /// Of those, zero pages (sent as a flag, without their bytes).
    pub zero_pages: u64,
    /// Stream bytes sent in it.
    pub bytes: u64,
    /// Seconds since the timeline started, at its start and end.
    pub start_s: f64,
    pub end_s: f64,
    /// Pages found dirty when it ended (what the next round sends).
    pub dirty_after: u64,
    /// Guest dirty rate during it, bytes per second.
    pub dirty_rate: f64,
    /// Bandwidth of its sending, stream bytes per second.
    pub bandwidth: f64,
    /// Guest memory it moved, bytes per second (zero pages count in full).
    pub page_rate: f64,
    /// Throttle in percent while it ran.
    pub throttle_pct: u32,
    /// Each vCPU's pace (pages per second, 0: unpaced) while it ran.
    pub pace: u64,
    /// Whether the vCPUs were paused (the stop-and-copy).
    pub final_round: bool,
}

/// The guest's speed in one phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phase {
    /// Guest writes per second of wall time.
    pub write_rate: f64,
    /// Nanoseconds of guest execution per write (faults included): the
    /// median over the phase's timeline intervals.
    pub ns_per_write: f64,
}

/// Where a migration's downtime went, as the source's clock saw it, the
/// guest paused throughout. The parts follow each other without a gap,
/// so they add up to [`SourceOutcome::downtime`] (a switch to post-copy
/// saves the state before its harvest and sends no last pages).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DowntimeParts {
    /// Stopping the guest ([`crate::vm::SessionVm`]'s pause, until every
    /// vCPU has stopped).
    pub pause: Duration,
    /// The last harvest of the dirty log (after a switch to post-copy:
    /// with the end of every data channel and the bitmap of what is
    /// missing).
    pub harvest: Duration,
    /// The last dirty pages on the wire.
    pub last_pages: Duration,
    /// Saving the vCPU and device state.
    pub state_save: Duration,
    /// The state and the end of every channel on the wire (after a switch
    /// to post-copy: STATE and POSTCOPY).
    pub state_send: Duration,
    /// From the last byte sent to the destination's RESUMED: the
    /// destination receiving the rest, checking and loading the state, and
    /// starting the guest (its digests come with RESUMED).
    pub until_resumed: Duration,
}

impl DowntimeParts {
    /// The parts' sum.
    pub fn total(&self) -> Duration {
        self.pause
            + self.harvest
            + self.last_pages
            + self.state_save
            + self.state_send
            + self.until_resumed
    }
}

/// Where the time before round 0 went: from the migration's start (the
/// guest warm, nothing connected: where a user's request starts it) to
/// dirty logging on. The parts follow each other without a gap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetupParts {
    /// `--channels auto`'s probe of the candidate counts (zero without
    /// [`super::SourceConfig::auto_channels`]).
    pub channel_probe: Duration,
    /// Every connection the run needs: TCP, TLS's handshake, the HEADER
    /// and the destination's ACCEPT, the further channels' JOINs and
    /// post-copy's two connections.
    pub connect: Duration,
    /// The link probe and its answer (one round trip when empty, without
    /// [`super::SourceConfig::link_probe`]).
    pub link_probe: Duration,
}

impl SetupParts {
    /// Connecting from `start` to `connected`, the link probe from there
    /// to `logging` (no channel-count probe).
    pub fn between(start: Instant, connected: Instant, logging: Instant) -> SetupParts {
        SetupParts {
            channel_probe: Duration::ZERO,
            connect: connected - start,
            link_probe: logging - connected,
        }
    }

    /// The parts' sum.
    pub fn total(&self) -> Duration {
        self.channel_probe + self.connect + self.link_probe
    }
}

/// What the source did.
#[derive(Clone, Debug, Default)]
pub struct SourceOutcome {
    /// Every round.
    pub rounds: Vec<RoundStat>,
    /// From logging on to the destination's resume (pre-copy), or to the
    /// last page sent (post-copy).
    pub total: Duration,
    /// Before logging on: the channel-count probe, connecting, the link
    /// probe ([`SourceOutcome::total`] does not include it). Timed by
    /// [`super::run_source`] around the run, so a run's own ending leaves
    /// it zero.
    pub setup: SetupParts,
    /// From the pause to the destination's resume (as the source saw it).
    pub downtime: Duration,
    /// Where the downtime went. After a switch to post-copy: the pause,
    /// the state saved, the harvest of what is missing, STATE and
    /// POSTCOPY sent (no last pages), and the wait for POSTCOPY_RESUMED.
    pub downtime_parts: DowntimeParts,
    /// When the source asked its guest to pause (the downtime's start),
    /// on this process's monotonic clock; `None` without a pause. With the
    /// destination's [`crate::session::dest::DestOutcome::resumed_at`] (its
    /// guest's first instruction) it gives the downtime as the pause to
    /// the first guest instruction on the destination.
    pub pause_at: Option<std::time::Instant>,
    /// Page records sent (the verification pass not included).
    pub page_records: u64,
    /// Of those, zero pages.
    pub zero_pages: u64,
    /// The link: stream bytes per second of the probe (the same bytes as
    /// round 0 over the same connections, no guest, no checksum); 0 when
    /// not measured (no [`super::SourceConfig::link_probe`]).
    pub link: f64,
    /// Bytes the probe sent (0 without [`super::SourceConfig::link_probe`]).
    pub link_bytes: u64,
    /// Channels used.
    pub channels: u16,
    /// Stream bytes sent (the verification pass not included).
    pub bytes: u64,
    /// Timeline samples.
    pub samples: Vec<Sample>,
    /// Timeline seconds at logging on, pause and resume.
    pub log_start_s: f64,
    pub pause_s: f64,
    pub resumed_s: f64,
    /// The guest before logging and while logging.
    pub before: Phase,
    pub during: Phase,
    /// Per-slot digests both sides agreed on.
    pub slot_digests: Vec<(u16, u64)>,
    /// What the lost-write check and the snapshots found.
    pub extras: super::super::extras::ExtrasOutcome,
    /// Whether all memory was byte-compared too.
    pub verified_full: bool,
    /// Highest throttle used, percent.
    pub max_throttle_pct: u32,
    /// Per-vCPU pace at the end (dirty-limit lowers it).
    pub final_pace: u64,
    /// Post-copy, when the migration switched to it.
    pub postcopy: Option<PostcopyOutcome>,
    /// Where the sending time went, over every round and channel.
    pub send_stages: crate::stages::SendStages,
    /// With `SourceConfig::auto_channels`: each candidate count's probe and the count
    /// chosen (which [`SourceOutcome::channels`] also says).
    pub channel_choice: Option<super::channel_choice::ChannelChoice>,
    /// The compression setting the run used ([`super::SourceConfig::compression`]).
    pub compression: crate::wire::Compression,
    /// What compression did: pages sent compressed, their bytes raw and
    /// on the wire (every channel, post-copy's answers included; the
    /// verification pass not included).
    pub compressed: crate::wire::CompressStats,
}

impl SourceOutcome {
    /// From the migration's start ([`SetupParts`] included) to the
    /// source's last byte of the migration sent: the vCPU state and every
    /// channel's end (pre-copy), or the last page (post-copy). The
    /// destination's load and start after it are not in it. This is the
    /// span QEMU's `query-migrate` calls `total-time` (its `migrate`
    /// command, connecting included, to the source's completion).
    pub fn to_last_byte_sent(&self) -> Duration {
        // A pre-copy run's `total` ends at RESUMED, after its last byte;
        // a post-copy run's ends at its last page, and the wait for
        // POSTCOPY_RESUMED its parts hold lies inside it.
        let after_last_byte = if self.postcopy.is_some() {
            Duration::ZERO
        } else {
            self.downtime_parts.until_resumed
        };
        self.setup.total() + self.total.saturating_sub(after_last_byte)
    }

    /// How much slower the guest executed per write while logging, in
    /// percent of its speed before.
    pub fn slowdown_pct(&self) -> f64 {
        if self.before.ns_per_write > 0.0 {
            (self.during.ns_per_write / self.before.ns_per_write - 1.0) * 100.0
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_span_to_the_last_byte_leaves_out_only_what_follows_it() {
        let ms = Duration::from_millis;
        let mut s = SourceOutcome {
            total: ms(100),
            setup: SetupParts {
                connect: ms(3),
                link_probe: ms(1),
                ..Default::default()
            },
            downtime_parts: DowntimeParts {
                until_resumed: ms(7),
                ..Default::default()
            },
            ..Default::default()
        };
        // Pre-copy: the wait for RESUMED comes after the last byte.
        assert_eq!(s.to_last_byte_sent(), ms(97));
        // Post-copy: the wait for POSTCOPY_RESUMED is inside the span
        // that runs to the last page.
        s.postcopy = Some(PostcopyOutcome::default());
        assert_eq!(s.to_last_byte_sent(), ms(104));
    }
}
