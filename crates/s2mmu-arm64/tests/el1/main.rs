//! The arm64 model with the bare EL1 test image (`common::el1`): boot and
//! mailbox, exits, faults, dirty logging, doorbells, injection, MMIO,
//! semihosting, shared memory, translation and the walk cache. One binary:
//! its tests take the model one at a time (`common::serial`).

#[path = "../common/mod.rs"]
mod common;

mod boot;
mod dirty_log;
mod doorbell;
mod effect;
mod exits;
mod inject;
mod mmio;
mod semihosting;
mod shm;
mod stop;
mod translate;
mod walk_cache;
