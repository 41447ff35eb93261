//! The engine as a simulated VM holds it: the one alias the VM and its
//! vCPUs share.

use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::mmu::Mmu;
use s2mmu::HostMmOps;

/// The engine types a simulated VM uses.
pub type VmMmu<S, F = Arm64Stage2> = Mmu<F, HostMmOps, S>;
