//! The s2mmu workloads on the host's real KVM (`/dev/kvm`), so every benchmark can put the
//! real kernel's figures next to the engine's.
//!
//! Guest code runs at CPL 3 in 64-bit mode: on machines whose KVM is `kvm_pvm` only
//! user-mode guest code runs natively; at CPL 3
//! every first write to a write-protected page is one shadow-MMU fault, which is what the
//! dirty-logging figures must measure. The reports carry KVM's own per-vCPU counters
//! (`exits`, `pf_fixed`) per pass, so that can be checked on every run.
//!
//! Entry points:
//! - [`dirty_log_perf::run`] (`dirty_log_perf_test` on real vCPUs) with
//!   [`dirty_log_perf::DirtyLogParams`], returning a [`dirty_log_perf::DirtyLogReport`];
//!   [`dirty_log_perf::DirtyLogReport::selftest_lines`] prints it like the selftest.
//! - [`dirty_log_check::check_dirty_log`]: the dirty log of each pass must be exactly the
//!   set of pages the guest wrote.
//! - [`memslot_perf::kvm_memslot_ops`]: memslot setup / move / delete times.
//! - [`host::HostInfo`]: kernel, CPU and KVM module description for reports.
//! - [`kvm_unusable_reason`]: `None` where guests run; else a one-line reason to skip.
//! - [`migrate`]: the migration library (`s2mmu-migrate`) over a KVM guest: RAM in
//!   regions, KVM's dirty bitmap with `KVM_CLEAR_DIRTY_LOG` or its dirty rings, vCPU
//!   threads and their registers; `examples/kvm_migrate.rs` moves a guest between
//!   processes with it.
//!
//! Building blocks: [`vm::MemstressVm`] (VM, slots, vCPUs in user long mode),
//! [`memory::GuestMemory`] (anonymous / THP / hugetlb backings, the `s2mmu-memory` crate the
//! simulated VM shares), [`asm`] (x86-64 encoder),
//! [`guest_code`] (the memstress guest program), [`page_tables`], [`cpu_mode`] (GDT and
//! sregs), [`sys`] (`KVM_CLEAR_DIRTY_LOG`, manual protect, binary stats) and
//! [`dirty_ring`].
//!
//! `dirty_log_perf_test` on 2 real vCPUs, where `/dev/kvm` is usable:
//!
//! ```no_run
//! use s2mmu_kvm::{dirty_log_perf, kvm_unusable_reason, DirtyLogParams};
//!
//! if let Some(why) = kvm_unusable_reason() {
//!     eprintln!("no KVM guest can run here: {why}");
//!     return Ok(());
//! }
//! let report = dirty_log_perf::run(&DirtyLogParams {
//!     vcpus: 2,
//!     bytes_per_vcpu: 64 << 20,
//!     manual_protect: true,
//!     ..DirtyLogParams::default()
//! })?;
//! for line in report.selftest_lines() {
//!     println!("{line}");
//! }
//! # Ok::<(), s2mmu_kvm::Error>(())
//! ```

pub mod asm;
pub mod cpu_mode;
pub mod dirty_log_check;
pub mod dirty_log_perf;
pub mod dirty_ring;
pub mod error;
pub mod guest_code;
pub mod host;
pub mod kvm_handle;
/// Guest memory: the `s2mmu-memory` crate, which the simulated VM shares.
pub use s2mmu_memory as memory;
pub mod memslot_perf;
pub mod migrate;
pub mod page_tables;
pub mod sys;
pub mod vm;

pub use dirty_log_check::{check_dirty_log, DirtyLogCheckReport};
pub use dirty_log_perf::{DirtyLogParams, DirtyLogReport, IterationReport, PassCounts};
pub use error::Error;
pub use host::HostInfo;
pub use kvm_handle::open_kvm;
pub use memory::{Backing, GuestMemory, MemoryError};
pub use memslot_perf::{kvm_memslot_ops, KvmMemslotTimes};
pub use vm::kvm_unusable_reason;
