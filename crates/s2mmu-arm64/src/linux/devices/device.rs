//! The one trait every device of a Linux VM sits behind, whatever exit
//! reaches it: an MMIO range, a trapped system register, an SMCCC call
//! over HVC or SMC, or a physical interrupt that ended a vCPU's run. A
//! device says which exits it takes ([`Device::claims`]); the bus
//! (`set.rs`) dispatches each exit to the device that claims it and
//! answers the ones no device claims as hardware would. Each device also
//! reads out its own state ([`Device::save`]); it is built again from it
//! by its own constructor (`Gic::from_state`, `Uart::from_state`,
//! `VirtualTimer::restore`), as a device with no state to hand is built
//! only from its arguments.
//!
//! This follows cloud-hypervisor's `vm-device` (a device trait whose
//! methods default to doing nothing, a bus of non-overlapping claims) and
//! Firecracker's devices (each saves its own state as plain values),
//! with exits other than MMIO as claims of their own.

use crate::linux::bus::MmioDevice;
use crate::linux::gic_snapshot::GicState;
use crate::linux::psci::PowerControl;
use crate::linux::timer::TimerState;
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;
use vm_superio::serial::SerialState;

/// A system register's encoding (op0, op1, CRn, CRm, op2), as ESR_EL2's
/// ISS of a trapped MSR/MRS gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SysReg {
    pub(crate) op0: u8,
    pub(crate) op1: u8,
    pub(crate) crn: u8,
    pub(crate) crm: u8,
    pub(crate) op2: u8,
}

impl SysReg {
    /// The register of `(op0, op1, CRn, CRm, op2)`.
    pub(crate) const fn new(op0: u8, op1: u8, crn: u8, crm: u8, op2: u8) -> SysReg {
        SysReg {
            op0,
            op1,
            crn,
            crm,
            op2,
        }
    }
}

impl fmt::Display for SysReg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let SysReg {
            op0,
            op1,
            crn,
            crm,
            op2,
        } = self;
        write!(f, "({op0},{op1},{crn},{crm},{op2})")
    }
}

/// A trapped system register access (ESR_EL2.EC 0x18), decoded from the
/// ISS: the register, whether it is a read, and the guest's register.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SysRegAccess {
    /// The register.
    pub(crate) reg: SysReg,
    /// An MRS (a read).
    pub(crate) read: bool,
    /// The general-purpose register (Rt; 31 is XZR).
    pub(crate) rt: u64,
}

impl SysRegAccess {
    /// The access ESR_EL2 `esr` describes.
    pub(crate) fn decode(esr: u64) -> SysRegAccess {
        let iss = esr & 0x1ff_ffff;
        let f = |shift: u32, mask: u64| ((iss >> shift) & mask) as u8;
        SysRegAccess {
            reg: SysReg::new(f(20, 3), f(14, 7), f(10, 0xf), f(1, 0xf), f(17, 7)),
            read: iss & 1 != 0,
            rt: (iss >> 5) & 0x1f,
        }
    }
}

/// How a guest makes an SMCCC call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Conduit {
    /// HVC: the conduit the device tree names.
    Hvc,
    /// SMC.
    Smc,
}

/// An exit a device takes.
#[derive(Clone)]
pub(crate) enum Claim {
    /// Loads and stores in `[base, base + size)`, served by `regs` at their
    /// offset into the range.
    Mmio {
        /// The range's name on the bus.
        range: &'static str,
        /// The range's first address.
        base: u64,
        /// Its bytes.
        size: u64,
        /// The register file that serves it.
        regs: Arc<dyn MmioDevice>,
    },
    /// MSR/MRS of this system register ([`Device::sysreg`]).
    SysReg(SysReg),
    /// SMCCC calls over `conduit` whose function ID (W0) lies in `ids`
    /// ([`Device::call`]).
    Call {
        /// HVC or SMC.
        conduit: Conduit,
        /// The function IDs.
        ids: RangeInclusive<u32>,
    },
    /// A physical interrupt `intid` that ended a vCPU's run
    /// ([`Device::interrupt`]).
    Interrupt(u32),
}

/// What a system register access leaves for the caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SysRegDone {
    /// A read's value.
    pub(crate) value: u64,
    /// vCPUs that now have an interrupt pending (the caller kicks those in
    /// their guest).
    pub(crate) raised: Vec<usize>,
}

/// What an SMCCC call leaves for the vCPU that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallDone {
    /// Resume it with x0 = this.
    Resume(u64),
    /// Its CPU is off, or the machine is.
    Off,
}

/// A device's state as plain values, as the device reads it out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DeviceState {
    /// The GICv3's (boxed: a kilobyte of registers).
    Gic(Box<GicState>),
    /// The 16550's (vm-superio's).
    Uart(SerialState),
    /// The timer's.
    Timer(TimerState),
    /// A device whose state lives elsewhere, or that has none (PSCI's
    /// power states are the vCPUs').
    Stateless,
}

/// The VM as a device sees it while serving an exit: the vCPUs' power
/// states (PSCI).
pub(crate) type DeviceHost = dyn PowerControl;

/// A device of a Linux VM. Every method but [`Device::name`] and
/// [`Device::claims`] has a default that serves nothing: a device
/// implements those of the exits it claims.
pub(crate) trait Device: Send + Sync {
    /// The device's name, for logs and refused claims.
    fn name(&self) -> &'static str;

    /// The exits it takes.
    fn claims(&self) -> Vec<Claim>;

    /// An access of vCPU `vcpu` to a system register it claims: `write`
    /// for an MSR, `None` for an MRS.
    fn sysreg(&self, vcpu: usize, reg: SysReg, write: Option<u64>) -> SysRegDone {
        let _ = (vcpu, reg, write);
        SysRegDone::default()
    }

    /// vCPU `vcpu`'s SMCCC call with `x0..x3`, whose function ID it claims.
    fn call(&self, vcpu: usize, x: [u64; 4], host: &DeviceHost) -> CallDone {
        let _ = (vcpu, x, host);
        CallDone::Resume(crate::linux::psci::RET_NOT_SUPPORTED as u64)
    }

    /// The physical interrupt `intid` it claims ended a vCPU's run: the
    /// interrupt to make pending for that vCPU, if any.
    fn interrupt(&self, intid: u32) -> Option<u32> {
        let _ = intid;
        None
    }

    /// Its state as plain values; `vcts` are the virtual counts the paused
    /// vCPUs saw.
    fn save(&self, vcts: &[u64]) -> DeviceState {
        let _ = vcts;
        DeviceState::Stateless
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trapped_msr_decodes_to_its_register() {
        // MSR ICC_SGI1R_EL1, X3: op0 3, op1 0, CRn 12, CRm 11, op2 5.
        let iss = (3 << 20) | (5 << 17) | (12 << 10) | (3 << 5) | (11 << 1);
        let a = SysRegAccess::decode((0x18 << 26) | iss);
        assert_eq!(a.reg, SysReg::new(3, 0, 12, 11, 5));
        assert!(!a.read);
        assert_eq!(a.rt, 3);
        assert_eq!(a.reg.to_string(), "(3,0,12,11,5)");
        assert!(SysRegAccess::decode((0x18 << 26) | iss | 1).read);
    }
}
