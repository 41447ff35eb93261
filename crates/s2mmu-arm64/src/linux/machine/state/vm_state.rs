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

impl VcpuPart {
    /// Whether the part is one the stub may load: a running vCPU has
    /// registers and no entry, a pending one an entry and no registers, an
    /// off one neither; and the registers pass [`VcpuState::check`].
    ///
    /// # Errors
    /// What is wrong, named.
    pub fn check(&self) -> std::result::Result<(), String> {
        let consistent = match self.power {
            PowerState::On => self.regs.is_some() && self.start.is_none(),
            PowerState::OnPending => self.regs.is_none() && self.start.is_some(),
            PowerState::Off => self.regs.is_none() && self.start.is_none(),
        };
        if !consistent {
            return Err(format!(
                "power state {:?} with registers {} and entry {:?}",
                self.power,
                self.regs.is_some(),
                self.start
            ));
        }
        match &self.regs {
            Some(r) => r.check(),
            None => Ok(()),
        }
    }
}

/// The most bytes the 16550's receive FIFO holds.
pub const UART_FIFO_BYTES: usize = 64;

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
    /// can load: its size, a GIC and a part for every vCPU, each part
    /// passing [`VcpuPart::check`], and a UART FIFO of at most
    /// [`UART_FIFO_BYTES`]. The fields are public, so this is checked
    /// again whatever built the state.
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
        for (i, c) in self.cpus.iter().enumerate() {
            c.check()
                .map_err(|e| Arm64Error::Guest(format!("vCPU {i}'s state: {e}")))?;
        }
        if self.uart.in_buffer.len() > UART_FIFO_BYTES {
            return Err(Arm64Error::Guest(format!(
                "a UART receive FIFO of {} bytes, at most {UART_FIFO_BYTES}",
                self.uart.in_buffer.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(cpus: Vec<VcpuPart>) -> LinuxState {
        LinuxState {
            vcpus: cpus.len(),
            mem: 1 << 20,
            vct: 0,
            gic: Gic::new(cpus.len()),
            uart: SerialState::default(),
            cpus,
        }
    }

    fn pending() -> VcpuPart {
        VcpuPart {
            power: PowerState::OnPending,
            start: Some((0x4000_0000, 0)),
            regs: None,
        }
    }

    #[test]
    fn fits_refuses_parts_the_stub_must_not_load() {
        assert!(state(vec![pending()]).fits(1, 1 << 20).is_ok());
        // A running vCPU without registers.
        let on = VcpuPart {
            power: PowerState::On,
            start: None,
            regs: None,
        };
        let e = state(vec![pending(), on]).fits(2, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("vCPU 1's state"), "{e}");
        // An off vCPU with an entry.
        let off = VcpuPart {
            power: PowerState::Off,
            ..pending()
        };
        assert!(state(vec![off]).fits(1, 1 << 20).is_err());
        // A receive FIFO over the 16550's.
        let mut s = state(vec![pending()]);
        s.uart.in_buffer = vec![0; UART_FIFO_BYTES + 1];
        let e = s.fits(1, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        // The wrong shape.
        assert!(state(vec![pending()]).fits(2, 1 << 20).is_err());
    }
}
