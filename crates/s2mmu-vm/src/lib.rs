//! A simulated VM on the s2mmu engine.
//!
//! Guest memory is real host memory ([`memory`], the `s2mmu-memory` crate,
//! shared with the real-KVM harness); each vCPU ([`vcpu`]) is
//! a thread that accesses it through a per-vCPU software TLB ([`tlb`]); a
//! TLB miss walks the stage-2 table without locks, and a missing or
//! write-protected entry is a fault handled by the engine, as a hardware
//! exit would be. TLB invalidations from the engine reach every vCPU's TLB
//! before the engine goes on.

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
pub use vm::{SlotInfo, Vm, VmConfig, VmError, VmFormat, VmMmu};
pub use workload::{
    stamp, Control, LiveCounters, Pattern, VcpuState, Workload, WorkloadConfig, LIVE_EVERY,
};
