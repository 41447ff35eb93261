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

pub mod checks;
pub mod dest;
pub mod extras;
pub mod guest_state;
pub mod linux;
pub mod plot;
pub mod postcopy;
pub mod source;
pub mod timeline;
pub mod wire;
pub mod wire_bench;

// The stream's parts live in the migration library.
pub use s2mmu_migrate::stream_error as error;
pub use s2mmu_migrate::transport as net;
pub use s2mmu_migrate::{bandwidth, hash};

mod drivers;
mod params;
mod report_text;

pub use drivers::{main, migrate_in_process, policy_label};
pub use params::{
    default_channels, parse_channels, parse_duration, ChannelCounts, ConvergeArg, HarvestArg,
    Params, PatternArg, PostcopyArg, RecoveryArg, SplitArg, MAX_RATE, MAX_ROUNDS, MIN_CLEAR_CHUNK,
};
