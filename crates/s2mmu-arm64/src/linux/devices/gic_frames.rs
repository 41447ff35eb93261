//! The GICv3's two MMIO frames as devices on the bus: the distributor
//! ([`GicDistributor`]) and the redistributors, one per vCPU, in one range
//! ([`GicRedistributors`]). Both share one [`Gic`]; each answers a bus
//! access at its offset as the register access [`Gic::dist_access`] or
//! [`Gic::redist_access`] serves, and says that an access may leave an
//! interrupt pending for another vCPU ([`MmioDevice::routes_interrupts`]),
//! so the vCPU loop kicks the vCPUs that now have one.

use crate::linux::bus::MmioDevice;
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
