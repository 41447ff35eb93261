//! What the engine asks of the host about the memory behind memslots.
//!
//! A memslot names guest memory by host virtual address (KVM's
//! `userspace_addr`); a stage-2 descriptor needs the physical address. KVM
//! turns one into the other in the fault path (`gfn_to_pfn`, through the
//! host's page tables). [`HostMemory::host_to_phys`] is that step. A
//! hypervisor in user space whose "physical" addresses are its own virtual
//! ones (the simulated VM, tests, benchmarks) keeps [`IdentityHost`]; one
//! that drives a real MMU (the arm64 model in `s2mmu-arm64`) returns the
//! machine's physical addresses.
//!
//! The cache-maintenance hooks sit where KVM's `kvm_pgtable_mm_ops` has
//! them (`dcache_clean_inval_poc`, `icache_inval_pou`): before a new leaf
//! makes host memory visible to the guest through stage 2. On a CPU with
//! FEAT_FWB (stage 2 forces write-back) and DIC/IDC they are no-ops, as they
//! are under QEMU, which models no caches.

use crate::addr::{Hva, Pa};

/// The host's view of the memory behind memslots.
pub trait HostMemory: Send + Sync {
    /// The physical address of `[hva, hva + size)`, if that range is
    /// backed and physically contiguous; `None` otherwise (the fault path
    /// then maps a smaller piece, or fails with [`crate::Error::Unbacked`]
    /// at a single page).
    fn host_to_phys(&self, hva: Hva, size: u64) -> Option<Pa>;

    /// Cleans and invalidates the data cache to the point of coherency for
    /// `[hva, hva + size)`, before a cacheable mapping of it is installed
    /// (KVM: `dcache_clean_inval_poc`, skipped with FEAT_FWB).
    fn clean_dcache(&self, hva: Hva, size: u64) {
        let _ = (hva, size);
    }

    /// Invalidates the instruction cache to the point of unification for
    /// `[hva, hva + size)`, before an executable mapping of it is installed
    /// (KVM: `icache_inval_pou`, skipped with CTR_EL0.DIC).
    fn invalidate_icache(&self, hva: Hva, size: u64) {
        let _ = (hva, size);
    }
}

/// Host virtual addresses are the physical addresses (user-space
/// hypervisors that test or simulate, and the simulated VM); no cache
/// maintenance.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityHost;

impl HostMemory for IdentityHost {
    fn host_to_phys(&self, hva: Hva, _size: u64) -> Option<Pa> {
        Some(Pa::new(hva.raw()))
    }
}
