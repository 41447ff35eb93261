//! Incremental snapshots of a running guest from a dirty view of its own
//! ([`taker`]), to checked files ([`format`](mod@format)), and their
//! restore ([`restore`]).

pub mod format;
pub mod restore;
pub mod taker;
