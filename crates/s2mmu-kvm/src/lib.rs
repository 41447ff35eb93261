//! The s2mmu workloads on the host's real KVM.
