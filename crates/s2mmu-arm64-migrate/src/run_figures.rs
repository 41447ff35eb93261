//! What one run of [`crate::session_run`] measured and how the guest
//! showed it went on.

use crate::console_gap::ConsoleGap;
use s2mmu_arm64::linux::dirty_limit::DirtyLimitCounters;
use s2mmu_arm64::linux::migrate::RestoreClock;
use s2mmu_arm64::machine::RamBacking;
use s2mmu_migrate::session::dest::DestOutcome;
use s2mmu_migrate::session::postcopy::PostcopyOutcome;
use s2mmu_migrate::session::source::{DowntimeParts, SourceOutcome};
use std::time::Duration;

/// What one run measured, beyond the common figures.
#[derive(Clone, Debug)]
pub enum RunDetails {
    /// Through the session (pre-copy).
    Session {
        /// The session's whole outcome (channels, the link's figure, page
        /// records and zero pages, rounds, throttle and pace, the sender's
        /// stage costs).
        outcome: Box<SourceOutcome>,
        /// What the guest's throttle and pace did.
        limit: DirtyLimitCounters,
        /// The destination's outcome and its machine's restore clock,
        /// when it ran in this process.
        dest: Option<Box<(DestOutcome, RestoreClock)>>,
    },
    /// Through the session, ending in post-copy.
    Postcopy {
        /// The session's figures of post-copy (the destination's FINAL
        /// among them).
        figures: PostcopyOutcome,
        /// Where the switch's downtime went, as the source saw it.
        parts: DowntimeParts,
        /// The destination's outcome (its part of the downtime among
        /// it) and its machine's restore clock, when it ran in this
        /// process.
        dest: Option<Box<(DestOutcome, RestoreClock)>>,
    },
}

/// How the destination's guest showed it went on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WentOn {
    /// The counter went on at this step (A's last plus one), every step
    /// once and in order across the switch.
    CounterStep(u64),
    /// The dirtier's `ok` line on B's console.
    DirtierOk(String),
    /// The user's guest printed this first whole line on B's console.
    Printed(String),
}

/// One run's figures.
#[derive(Clone, Debug)]
pub struct LinuxRun {
    /// From the pause on A to B's RESUMED read back on A (the source's
    /// view: it includes the reply's way back).
    pub downtime: Duration,
    /// From the pause on A to the first guest instruction on B, on this
    /// process's one clock; `None` when B is another process's (then
    /// [`LinuxRun::pause_unix_ns`] and B's own report of its first
    /// instruction give it).
    pub to_first_instruction: Option<Duration>,
    /// The pause on A, in nanoseconds since the Unix epoch on the host's
    /// real-time clock (one clock for every process of a host, network
    /// namespaces included); 0 without a pause.
    pub pause_unix_ns: u64,
    /// From logging on to the resume on B (not a post-copy's later pages).
    pub total: Duration,
    /// Before logging on: connecting (TCP, TLS, HEADER, ACCEPT, JOINs),
    /// the link probe, `--channels auto`'s probe.
    pub setup: s2mmu_migrate::session::source::SetupParts,
    /// From the migration's start (the setup included) to A's last byte
    /// of it sent: the span of QEMU's `total-time`
    /// ([`s2mmu_migrate::session::source::SourceOutcome::to_last_byte_sent`]).
    pub to_last_byte_sent: Duration,
    /// From logging on to the pause on A.
    pub precopy: Duration,
    /// Stream bytes the source sent up to the resume on B.
    pub stream_bytes: u64,
    /// The source's compression setting, and what compression did
    /// (pages sent compressed, their bytes raw and on the wire).
    pub compression: s2mmu_migrate::wire::Compression,
    pub compressed: s2mmu_migrate::wire::CompressStats,
    /// Pages of each pre-copy round.
    pub round_pages: Vec<u64>,
    /// Milliseconds of each pre-copy round.
    pub round_ms: Vec<f64>,
    /// Pages sent while the guest was paused.
    pub final_pages: u64,
    /// Bytes of the guest's vCPU and device state.
    pub state_bytes: usize,
    /// Figures of the way it was moved.
    pub details: RunDetails,
    /// How B's guest went on; `None` when B is another process's.
    pub went_on: Option<WentOn>,
    /// Which host pages backed A's RAM.
    pub ram_a: RamBacking,
    /// Which host pages backed B's RAM; `None` when B is another process's.
    pub ram_b: Option<RamBacking>,
    /// A's console, and B's when B ran in this process.
    pub consoles: (String, Option<String>),
    /// The guest programs' lines on A's and B's consoles, host-stamped.
    pub console_gap: ConsoleGap,
}
