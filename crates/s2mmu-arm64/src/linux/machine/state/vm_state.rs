//! The Linux VM's state besides memory as plain values: the emulated
//! GICv3, the 16550's registers and FIFO (vm-superio's `SerialState`),
//! each vCPU's PSCI power state and saved registers, and the guest's
//! virtual time ([`LinuxState`]). The `s2mmu-arm64-migrate` crate encodes
//! it as a migration's STATE body.

use crate::linux::gic::Gic;
use crate::linux::psci::PowerState;
use crate::linux::vcpu_state::VcpuState;
use crate::{Arm64Error, Result};
use vm_superio::serial::SerialState;

/// A vCPU's part of the state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VcpuPart {
    /// Its PSCI power state.
    pub power: PowerState,
    /// A CPU_ON accepted but not started: entry and x0.
    pub start: Option<(u64, u64)>,
    /// Its registers, if it was running.
    pub regs: Option<VcpuState>,
}

/// Everything the Linux VM carries across a migration besides memory.
pub struct LinuxState {
    /// vCPUs.
    pub vcpus: usize,
    /// RAM bytes.
    pub mem: u64,
    /// The guest's virtual count at the pause (the latest any vCPU saw).
    pub vct: u64,
    /// The GIC.
    pub gic: Gic,
    /// The UART.
    pub uart: SerialState,
    /// Per vCPU.
    pub cpus: Vec<VcpuPart>,
}

/// A copy of `g` (through its state).
pub fn gic_copy(g: &Gic) -> Gic {
    Gic::from_state(&g.state()).expect("a GIC's own state loads")
}

impl LinuxState {
    /// Whether the state is one a VM of `vcpus` vCPUs and `mem` bytes
    /// can load: its size, a GIC and a part for every vCPU.
    ///
    /// # Errors
    /// [`Arm64Error::Guest`] naming what does not fit.
    pub fn fits(&self, vcpus: usize, mem: u64) -> Result<()> {
        if self.vcpus != vcpus || self.mem != mem {
            return Err(Arm64Error::Guest(format!(
                "a VM of {} vCPUs and {} bytes, this one has {vcpus} and {mem}",
                self.vcpus, self.mem
            )));
        }
        if self.cpus.len() != vcpus || self.gic.vcpus() != vcpus {
            return Err(Arm64Error::Guest(format!(
                "state for {} vCPUs with a GIC for {}, the VM has {vcpus}",
                self.cpus.len(),
                self.gic.vcpus()
            )));
        }
        Ok(())
    }
}
