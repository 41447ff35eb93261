//! A simulated VM on the s2mmu engine.
//!
//! Guest memory is real host memory ([`memory`], the `s2mmu-memory` crate,
//! shared with the real-KVM harness); each vCPU ([`vcpu`]) is
//! a thread that accesses it through a per-vCPU software TLB ([`tlb`]); a
//! TLB miss walks the stage-2 table without locks, and a missing or
//! write-protected entry is a fault handled by the engine, as a hardware
//! exit would be. TLB invalidations from the engine reach every vCPU's TLB
//! before the engine goes on.
//!
//! The main types:
//! - [`Vm`] ([`VmConfig`]): guest memory in memslots and the engine's MMU
//!   over them ([`Vm::mmu`]: dirty logging, memslot changes);
//! - [`Vcpu`]: one guest's loads and stores ([`Vcpu::write_u64`],
//!   [`Vcpu::read_u64`]), a fault answered by the engine inside the call;
//! - [`Workload`]: vCPU threads writing a [`Pattern`] in passes, paused,
//!   paced and resumed from their [`VcpuState`]s (what a migration moves);
//! - [`replay_writes`]: a recorded write trace replayed on a VM.
//!
//! A store, dirty logging on, a second store, and the log's harvest:
//!
//! ```
//! use s2mmu_vm::{Vm, VmConfig};
//!
//! let vm: Vm = Vm::new(VmConfig {
//!     mem_size: 4 << 20,
//!     ..VmConfig::default()
//! })?;
//! let slot = vm.slots()[0];
//! let mut vcpu = vm.new_vcpu()?;
//! // The first store faults; the engine maps the page and the store ends.
//! vcpu.write_u64(slot.gpa, 42).expect("mapped on its fault");
//! // Out of guest mode while the host changes the tables.
//! vcpu.exit();
//! vm.enable_dirty_logging()?;
//! vcpu.write_u64(slot.gpa + 4096, 7).expect("logged on its fault");
//! assert_eq!(vcpu.read_u64(slot.gpa).ok(), Some(42));
//! vcpu.exit();
//! let mut bitmap = vec![0u64; (slot.size / 4096).div_ceil(64) as usize];
//! assert_eq!(vm.mmu().get_dirty_log(slot.id, &mut bitmap)?, 1);
//! assert_eq!(bitmap[0], 0b10, "the second page, written while logged");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

/// Guest memory: the `s2mmu-memory` crate, which the KVM harness shares.
pub use s2mmu_memory as memory;
mod mmu;
pub mod replay;
mod sync;
pub mod tlb;
pub mod vcpu;
pub mod vm;
pub mod workload;

pub use memory::{Backing, GuestMemory, MemoryError};
pub use replay::replay_writes;
pub use tlb::{ShootdownStats, SoftTlb, TlbShootdown, TlbStats};
pub use vcpu::{PageFetch, Vcpu, VcpuExit};
#[allow(deprecated)]
pub use vm::VmFormat;
pub use vm::{Error, KnownFormat, SlotInfo, Vm, VmConfig, VmMmu};

/// The simulated VM's error, by its old name.
#[deprecated(
    note = "renamed to `s2mmu_vm::Error`: `s2mmu_migrate::VmError` is another type (what a `SessionVm` reports)"
)]
pub type VmError = Error;
pub use workload::{
    stamp, Control, LiveCounters, Pattern, VcpuState, Workload, WorkloadConfig, LIVE_EVERY,
};
