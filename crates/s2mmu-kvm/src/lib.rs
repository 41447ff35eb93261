//! The s2mmu workloads on the host's real KVM (`/dev/kvm`), so every benchmark can put the
//! real kernel's figures next to the engine's.
//!
//! Guest code runs at CPL 3 in 64-bit mode: on machines whose KVM is `kvm_pvm` only
//! user-mode guest code runs natively (see `shared/reference/real-kvm-here.md`).

pub mod asm;
pub mod cpu_mode;
pub mod dirty_log_check;
pub mod dirty_log_perf;
pub mod dirty_ring;
pub mod error;
pub mod guest_code;
pub mod host;
pub mod kvm_handle;
pub mod memory;
pub mod memslot_perf;
pub mod page_tables;
pub mod sys;
pub mod vm;

pub use error::Error;
pub use kvm_handle::{kvm_unusable_reason, open_kvm};
pub use memory::{Backing, GuestMemory};
