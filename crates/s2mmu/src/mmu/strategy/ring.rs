//! Write protection into per-vCPU dirty rings ([`DirtyMode::Ring`](crate::mmu::DirtyMode::Ring)): the
//! fault pushes the page to its vCPU's ring; harvest and reset. The rings
//! exist only in this strategy: a VM in another mode has none.

use super::mode::{DirtyStrategy, VcpuLog};
use crate::dirty::DirtyRing;
use crate::mmu::policy::Protect;
use crate::sync::{Platform, RwLock};
use crate::{Error, Result};
use alloc::sync::Arc;
use alloc::vec::Vec;

/// The ring strategy: the ring size and every vCPU's ring.
pub(in crate::mmu) struct Rings<P: Platform> {
    entries: u32,
    /// Every vCPU's ring, by vCPU index.
    pub(in crate::mmu) rings: RwLock<P, Vec<Arc<DirtyRing>>>,
}

impl<P: Platform> Rings<P> {
    /// Rings of `entries` entries.
    ///
    /// # Errors
    /// As [`DirtyRing::new`], for a size out of range.
    pub(super) fn new(entries: u32) -> Result<Self> {
        DirtyRing::new(entries)?;
        Ok(Rings {
            entries,
            rings: lock_api::RwLock::new(Vec::new()),
        })
    }
}

impl<P: Platform> DirtyStrategy for Rings<P> {
    fn protect(&self) -> Option<Protect> {
        None
    }

    fn new_vcpu(&self, id: usize, _table: u64) -> Result<VcpuLog> {
        let ring = Arc::new(DirtyRing::new(self.entries)?);
        let mut rings = self.rings.write();
        rings.try_reserve(1).map_err(|_| Error::OutOfMemory)?;
        debug_assert_eq!(rings.len(), id, "vCPUs are made one at a time, in order");
        rings.push(ring.clone());
        Ok(VcpuLog {
            ring: Some(ring),
            pml: None,
        })
    }
}
