//! The Linux guest under the engine: its host-side pieces against the real
//! tools (`guest`), its boot (`boot`), dirty logging in each mode (`dirty`),
//! the page changes it makes (`changes`) and SGIs between its vCPUs
//! (`ipi`). One binary: its tests take QEMU one at a time
//! (`common::serial`).

#[path = "../common/mod.rs"]
mod common;

mod boot;
mod changes;
mod dirty;
mod guest;
mod ipi;
