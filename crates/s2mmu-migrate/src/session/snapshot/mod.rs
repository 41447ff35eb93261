//! Snapshots: whole ones of any guest over the session's VM traits
//! ([`guest`]), to checked files ([`format`](mod@format)), and their
//! restore ([`restore`]). The simulated guest's incremental snapshots,
//! taken from a dirty view of its own, are `crate::sim::snapshot_taker`
//! (feature `sim`).

pub mod format;
pub mod guest;
pub mod restore;
