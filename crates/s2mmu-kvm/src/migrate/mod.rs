//! A real KVM guest under the migration library (`s2mmu-migrate`): the
//! library's traits implemented over `/dev/kvm`.
//!
//! - [`ram::KvmRam`]: guest RAM of several regions, one mapping each (the
//!   library's `GuestRam` through `RamRegions`);
//! - [`session_vm::KvmVm`]: the VM, one memslot per region, and KVM's own
//!   dirty log in either form ([`session_vm::KvmDirtyLog`]): bitmaps with
//!   `KVM_CLEAR_DIRTY_LOG` (manual protect) or per-vCPU dirty rings (the
//!   library's `SessionVm`);
//! - [`vcpus::KvmVcpus`]: vCPU threads that pause at an instruction
//!   boundary and whose registers are read and written while paused (the
//!   library's `GuestRun`); [`cpu_state`]: the registers as STATE bytes;
//! - [`writer`]: a tiny guest that writes every page of two regions without
//!   end, with the source's and destination's traits, what the tests and
//!   `examples/kvm_migrate.rs` move between processes.

pub mod cpu_state;
pub mod ram;
pub mod session_vm;
pub mod vcpus;
pub mod writer;
