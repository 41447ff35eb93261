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
//!   boundary and whose state is read and written while paused (the
//!   library's `GuestRun`), throttled for auto-converge as QEMU's
//!   `cpu_throttle` does ([`throttle`]); [`cpu_state`] and [`cpu_parts`]:
//!   a vCPU's full x86 state and the VM's clock as STATE bytes;
//!   [`vcpu_io`]: that state read from KVM and restored in KVM's order;
//! - [`writer`]: a tiny guest that writes every page of two regions without
//!   end and checks its SSE state and TSC, with the source's traits, and
//!   [`writer_dest`], its destination's: what the tests and
//!   `examples/kvm_migrate.rs` move between processes.

pub mod cpu_parts;
pub mod cpu_state;
pub mod ram;
pub mod session_vm;
pub mod throttle;
pub mod vcpu_io;
pub mod vcpus;
pub mod writer;
pub mod writer_dest;
