//! Live migration and snapshots as a library, over a VM interface.
//!
//! A VMM implements [`vm::MigratableVm`] (pause and resume, guest pages,
//! the engine's dirty harvest, vCPU and device state as bytes) and gets:
//! - [`driver::migrate`]: pre-copy rounds over the dirty harvest, then
//!   stop-and-copy, state transfer and resume on the destination, with
//!   the memories' digests compared at the switch;
//! - [`snapshot::save`] and [`snapshot::restore`]: the same to a file;
//! - [`state::State`]: a versioned, checksummed, bounded encoding for the
//!   VM's state, whose refusals name what was wrong.
//!
//! Import graph (a DAG): `state` and `vm` import nothing of this crate;
//! `error` imports `state` and `vm`; `driver` and `snapshot` import the
//! three. No clap, plotting, progress bars or KVM here.

// No unsafe code in the migration library (the workspace's lints are
// inherited through `[lints] workspace = true`; this one is added here).
#![forbid(unsafe_code)]

pub mod driver;
pub mod error;
pub mod snapshot;
pub mod state;
pub mod vm;

pub use error::MigrateError;
pub use vm::{MigratableVm, Pausable, VmError, PAGE_SIZE};
