//! `s2mmu migrate`: a pre-copy live migration of a running guest over TCP.
//!
//! By default the source and the destination run in one process (two
//! threads over loopback TCP, mutual TLS with an ephemeral identity);
//! `--listen ADDR` runs only a destination and `--to ADDR` only a source,
//! for two processes ([`s2mmu_migrate::transport`]: TLS from files or a pre-shared key, a
//! deadline on every read and write). The stream is our own versioned
//! format ([`s2mmu_migrate::wire`]) with a checksum on every page and record, spread over
//! `--channels` connections; the destination checks it against its own
//! limits, resumes the guest only from a complete, valid stream ([`s2mmu_migrate::session::dest`]),
//! and the source then checks the destination's memory against its own
//! ([`s2mmu_migrate::session::source`]).
//!
//! The migration itself (session, stream, transport, the simulated
//! guest's parts) lives in the library; this module holds its flags,
//! reports and plots.

pub mod linux;
pub mod linux_guest;
pub mod linux_net;
pub mod linux_plot;
pub mod outcome_json;
pub mod postcopy_report;
pub mod wire_bench;

mod drivers;
mod local_peer;
mod params;
mod report_text;

pub use drivers::main;
pub use params::{
    default_channels, parse_channels, parse_duration, ChannelCounts, ConvergeArg, Params,
    PatternArg, PostcopyArg, RecoveryArg, SplitArg, MAX_RATE, MAX_ROUNDS, MIN_CLEAR_CHUNK,
};
pub use report_text::policy_label;
