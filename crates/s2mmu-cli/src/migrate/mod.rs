//! `s2mmu migrate`: a pre-copy live migration of a running guest over TCP.
//!
//! By default the source and the destination run in one process (two
//! threads over loopback TCP, mutual TLS with an ephemeral identity);
//! `--listen ADDR` runs only a destination and `--to ADDR` only a source,
//! for two processes ([`net`]: TLS from files or a pre-shared key, a
//! deadline on every read and write). The stream is our own versioned
//! format ([`wire`]) with a checksum on every page and record, spread over
//! `--channels` connections; the destination checks it against its own
//! limits, resumes the guest only from a complete, valid stream ([`dest`]),
//! and the source then checks the destination's memory against its own
//! ([`source`]).

pub mod linux;
pub mod linux_guest;
pub mod linux_net;
pub mod plot;
pub mod postcopy_report;
pub mod wire;
pub mod wire_bench;

// The migration (session, stream, transport, the simulated guest's
// parts) lives in the library; this crate holds its flags, reports and
// plots.
pub use s2mmu_migrate::session::{checks, extras, timeline};
/// The destination: the session's, received into the simulated guest.
pub mod dest {
    pub use s2mmu_migrate::session::dest::*;
    pub use s2mmu_migrate::sim::dest::{
        receive, receive_from, serve, serve_attempts, SimDestConfig,
    };
}
pub use s2mmu_migrate::stream_error as error;
pub use s2mmu_migrate::transport as net;
pub use s2mmu_migrate::{bandwidth, hash};

/// Post-copy (the library's), with its report (this crate's).
pub mod postcopy {
    pub use super::postcopy_report as report;
    pub use s2mmu_migrate::session::postcopy::*;
}

/// The source (the library's session) and the simulated guest it runs.
pub mod source {
    pub use s2mmu_migrate::session::digests::source_digests;
    pub use s2mmu_migrate::session::source::*;
    pub use s2mmu_migrate::sim::source::{
        migrate_source, migrate_source_to, plain_link_to, session_harvest, SimGuestConfig, SimRun,
    };
}

mod drivers;
mod params;
mod report_text;

pub use drivers::{main, policy_label};
pub use params::{
    default_channels, parse_channels, parse_duration, ChannelCounts, ConvergeArg, Params,
    PatternArg, PostcopyArg, RecoveryArg, SplitArg, MAX_RATE, MAX_ROUNDS, MIN_CLEAR_CHUNK,
};
pub use s2mmu_migrate::sim::in_process::migrate_in_process;
