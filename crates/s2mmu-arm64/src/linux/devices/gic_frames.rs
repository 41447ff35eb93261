//! The GICv3's two MMIO frames as devices on the bus: the distributor
//! ([`GicDistributor`]) and the redistributors, one per vCPU, in one range
//! ([`GicRedistributors`]). Both share one [`Gic`]; each answers a bus
//! access at its offset as the register access [`Gic::dist_access`] or
//! [`Gic::redist_access`] serves, and says that an access may leave an
//! interrupt pending for another vCPU ([`MmioDevice::routes_interrupts`]),
//! so the vCPU loop kicks the vCPUs that now have one.
//!
//! `GicDevice` is the GIC as the bus's device: both frames, and the SGI
//! registers whose writes trap to EL2.

use crate::linux::bus::MmioDevice;
use crate::linux::devices::device::{Claim, Device, DeviceState, SysReg, SysRegDone};
use crate::linux::gic::{Gic, GicAccess, GICD_SIZE, GICR_STRIDE};
use std::sync::Arc;

/// The distributor's frame ([`GICD_SIZE`] bytes).
pub struct GicDistributor(pub Arc<Gic>);

/// Every vCPU's redistributor, [`GICR_STRIDE`] bytes each, back to back.
pub struct GicRedistributors(pub Arc<Gic>);

impl GicDistributor {
    /// The frame's size on the bus.
    pub fn size(&self) -> u64 {
        GICD_SIZE
    }
}

impl GicRedistributors {
    /// The range's size on the bus: one stride per vCPU.
    pub fn size(&self) -> u64 {
        GICR_STRIDE * self.0.vcpus() as u64
    }
}

/// A bus access as a register access: the store's value from its
/// little-endian bytes.
fn access(offset: u64, len: usize, write: Option<&[u8]>) -> GicAccess {
    let write = write.map(|d| {
        let mut b = [0u8; 8];
        let n = d.len().min(8);
        b[..n].copy_from_slice(&d[..n]);
        u64::from_le_bytes(b)
    });
    GicAccess {
        offset,
        size: len as u64,
        write,
    }
}

/// A load's bytes: the register's value cut to the access's width.
fn fill(data: &mut [u8], v: u64) {
    let n = data.len().min(8);
    data[..n].copy_from_slice(&v.to_le_bytes()[..n]);
}

impl MmioDevice for GicDistributor {
    fn read(&self, offset: u64, data: &mut [u8]) {
        fill(data, self.0.dist_access(access(offset, data.len(), None)));
    }

    fn write(&self, offset: u64, data: &[u8]) {
        self.0.dist_access(access(offset, data.len(), Some(data)));
    }

    fn routes_interrupts(&self) -> bool {
        true
    }
}

impl MmioDevice for GicRedistributors {
    fn read(&self, offset: u64, data: &mut [u8]) {
        fill(data, self.0.redist_access(access(offset, data.len(), None)));
    }

    fn write(&self, offset: u64, data: &[u8]) {
        self.0.redist_access(access(offset, data.len(), Some(data)));
    }

    fn routes_interrupts(&self) -> bool {
        true
    }
}

/// ICC_SGI1R_EL1: an SGI to group 1.
const ICC_SGI1R_EL1: SysReg = SysReg::new(3, 0, 12, 11, 5);
/// ICC_ASGI1R_EL1: an SGI to group 1 of the other security state, the
/// same with one security state.
const ICC_ASGI1R_EL1: SysReg = SysReg::new(3, 1, 12, 11, 6);

/// The SGI a write `v` of ICC_SGI1R_EL1 by vCPU `from` sends, made
/// pending for every target: the targets that now have one pending.
pub(crate) fn raise_sgi(gic: &Gic, from: usize, v: u64) -> Vec<usize> {
    let (intid, targets) = gic.sgi_targets(from, v);
    targets
        .into_iter()
        .filter_map(|t| gic.raise(t, intid))
        .collect()
}

/// The GICv3 as one device: its distributor at `gicd`, its
/// redistributors at `gicr`, and the SGI registers.
pub(crate) struct GicDevice {
    /// The interrupt controller.
    pub(crate) gic: Arc<Gic>,
    /// The distributor's base.
    pub(crate) gicd: u64,
    /// The first redistributor's base.
    pub(crate) gicr: u64,
}

impl Device for GicDevice {
    fn name(&self) -> &'static str {
        "GIC"
    }

    fn claims(&self) -> Vec<Claim> {
        let dist = GicDistributor(self.gic.clone());
        let redist = GicRedistributors(self.gic.clone());
        vec![
            Claim::Mmio {
                range: "GIC distributor",
                base: self.gicd,
                size: dist.size(),
                regs: Arc::new(dist),
            },
            Claim::Mmio {
                range: "GIC redistributors",
                base: self.gicr,
                size: redist.size(),
                regs: Arc::new(redist),
            },
            Claim::SysReg(ICC_SGI1R_EL1),
            Claim::SysReg(ICC_ASGI1R_EL1),
        ]
    }

    /// The SGI registers are write-only: a read is zero.
    fn sysreg(&self, vcpu: usize, _reg: SysReg, write: Option<u64>) -> SysRegDone {
        SysRegDone {
            value: 0,
            raised: write.map_or_else(Vec::new, |v| raise_sgi(&self.gic, vcpu, v)),
        }
    }

    fn save(&self, _vcts: &[u64]) -> DeviceState {
        DeviceState::Gic(Box::new(self.gic.state()))
    }
}
