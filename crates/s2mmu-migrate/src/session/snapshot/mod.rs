//! Snapshots: incremental ones of a running simulated guest from a dirty
//! view of its own (`taker`, feature `sim`), whole ones of any guest
//! over the session's VM traits ([`guest`]), to checked files
//! ([`format`](mod@format)), and their restore ([`restore`]).

pub mod format;
pub mod guest;
pub mod restore;
// Reads the simulated VM's engine's dirty views directly.
#[cfg(feature = "sim")]
pub mod taker;
