//! Dirty logging under a running Linux guest: the harvester checked against
//! page hashes, the stage-2 changes the host makes between harvests, and
//! the break-before-make fault injection with the engine at EL2.

pub mod changes;
pub mod dirty;
pub mod el2_inject;
