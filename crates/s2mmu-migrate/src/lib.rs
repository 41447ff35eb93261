//! Live migration and snapshots as a library, over a VM interface.
//!
//! A VMM implements the session's VM traits for its VM ([`vm::SessionVm`]:
//! guest RAM as one mapping and the engine's dirty log; [`vm::GuestRun`]:
//! stop and go; [`session::guest::SourceGuest`] and
//! [`session::dest::DestFactory`]: the stream's header and the guest's
//! STATE) and gets:
//! - [`session`]: pre-copy over one or more channels, the stop-and-copy,
//!   post-copy with recovery, and the destination's memory verified
//!   against the source's;
//! - [`session::snapshot`]: snapshots of a paused guest and their checked
//!   restore into a fresh one (and incremental snapshots of a running
//!   simulated guest);
//! - [`state::State`]: a versioned, checksummed, bounded encoding for the
//!   VM's state, whose refusals name what was wrong.
//!
//! To start: `examples/own_vm.rs` (`cargo run -p s2mmu-migrate --example
//! own_vm`) defines a VM of its own, 16 MiB of RAM and a vCPU thread
//! writing into it, and live-migrates it over TCP with the public API
//! alone: the traits above, with `GuestRam` (its RAM), `ResumedGuest` and
//! `DestGuest` (the destination's guest, blank then resumed).
//!
//! - the network stream's parts: [`wire`] (the versioned, checksummed
//!   format), [`transport`] (connections and listeners: TCP, Unix
//!   sockets, TLS and a pre-shared key over either), [`hash`] (its
//!   checksums), [`bandwidth`] (the sender's rate limit),
//!   [`stages`] (where the stream's time goes) and [`stream_error`] (why
//!   a stream failed).
//!
//! Import graph (a DAG): `state`, `vm`, `bandwidth`, `pace`, `stages`,
//! `stream_error` and `stream_store` import nothing of this crate; `hash` imports `vm`;
//! `wire` imports `hash`, `pace`, `stages`, `stream_error` and `stream_store`;
//! `transport` imports `pace`, `stages`, `stream_error` and `stream_store`. No clap,
//! plotting, progress bars or KVM here.

// Unsafe code only where a module allows it (below: the unsafe trait
// GuestRam and its impl for the simulated VM's memory, and the clock
// call in `stages`); the workspace's
// lints are inherited through `[lints] workspace = true`.
#![deny(unsafe_code)]

pub mod bandwidth;
pub mod hash;
mod host;
mod pace;
pub mod session;
#[cfg(feature = "sim")]
#[allow(unsafe_code)] // GuestMemory's impl of the unsafe trait GuestRam
pub mod sim;
#[allow(unsafe_code)] // clock_gettime for a thread's CPU time
pub mod stages;
pub mod state;
pub mod stream_error;
#[allow(unsafe_code)] // streaming stores (SSE2) into guest memory
mod stream_store;
pub mod transport;
#[allow(unsafe_code)] // declares the unsafe trait GuestRam
pub mod vm;
pub mod wire;

pub use vm::{VmError, PAGE_SIZE};
