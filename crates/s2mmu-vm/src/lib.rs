//! A simulated VM on the s2mmu engine.
//!
//! Guest memory is real host memory ([`memory`]); each vCPU is a thread
//! that accesses it through a per-vCPU software TLB ([`tlb`]); a TLB miss
//! walks the stage-2 table without locks and a missing or write-protected
//! entry is a fault handled by the engine, as a hardware exit would be.

pub mod memory;
pub mod tlb;

pub use memory::{Backing, GuestMemory, MemoryError};
pub use tlb::{ShootdownStats, SoftTlb, TlbShootdown, TlbStats};
