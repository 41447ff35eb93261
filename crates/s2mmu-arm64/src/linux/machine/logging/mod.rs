//! Dirty logging under a running Linux guest: the harvester checked against
//! page hashes, and the stage-2 changes the host makes between harvests.

pub mod changes;
pub mod dirty;
