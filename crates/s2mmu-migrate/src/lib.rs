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
//! - the network stream's parts: [`wire`] (the versioned, checksummed
//!   format), [`transport`] (connections and listeners: TCP, Unix
//!   sockets, TLS and a pre-shared key over either), [`hash`] (its
//!   checksums), [`bandwidth`] (the sender's rate limit) and
//!   [`stream_error`] (why a stream failed).
//!
//! Import graph (a DAG): `state`, `vm`, `bandwidth` and `stream_error`
//! import nothing of this crate; `hash` imports `vm`; `wire` imports
//! `hash` and `stream_error`; `transport` imports `stream_error`; `error`
//! imports `state` and `vm`; `driver` and `snapshot` import `error`,
//! `state` and `vm`. No clap, plotting, progress bars or KVM here.

pub mod bandwidth;
pub mod driver;
pub mod error;
pub mod hash;
pub mod session;
#[cfg(feature = "sim")]
#[allow(unsafe_code)] // GuestMemory's impl of the unsafe trait GuestRam
pub mod sim;
pub mod snapshot;
pub mod state;
pub mod stream_error;
pub mod transport;
#[allow(unsafe_code)] // declares the unsafe trait GuestRam
pub mod vm;
pub mod wire;

pub use error::MigrateError;
pub use vm::{MigratableVm, Pausable, VmError, PAGE_SIZE};
