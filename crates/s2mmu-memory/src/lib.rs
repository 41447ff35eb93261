//! Guest memory for the s2mmu VMs: one private anonymous host mapping per
//! [`GuestMemory`], backed by 4 KiB pages, transparent huge pages or
//! hugetlbfs ([`Backing`], the KVM selftests' `-s`).
//!
//! The simulated VM (`s2mmu-vm`: vCPU threads writing through the engine's
//! translations) and the real-KVM harness (`s2mmu-kvm`: the mapping is a
//! memslot's `userspace_addr`) both take this type, so they map, align and
//! refuse guest memory alike.
//!
//! Every access through the safe API is atomic (word-wise `AtomicU64`,
//! relaxed: plain loads and stores on x86-64 and arm64), because vCPU
//! threads, a migration thread and the host touch the same words at once.
//! Raw pointers ([`GuestMemory::as_ptr`], [`GuestMemory::host_addr`]) are
//! for KVM and for code that keeps to the same rule in its own `unsafe`.
//!
//! Why not rust-vmm's `vm-memory` as this type: its `MmapRegion` maps
//! without a huge-page choice or alignment (THP needs a 2 MiB-aligned
//! range, made here by over-mapping and trimming), a region built over a
//! pointer made elsewhere is not owned (nothing unmaps it), and neither
//! VM needs its guest-address regions (the engine's memslots and KVM's
//! slots translate). A VMM that wants `vm-memory` keeps the engine's
//! `vm-memory` feature (`s2mmu::vmm_bitmap`) over its own `GuestMemoryMmap`.
//!
//! ```
//! use s2mmu_memory::{Backing, GuestMemory, MemoryError};
//!
//! let mem = GuestMemory::new(2 << 20, Backing::Anonymous)?;
//! assert!(mem.write_u64(4096, 0xfeed));
//! assert_eq!(mem.read_u64(4096), Some(0xfeed));
//! // Past the end: refused, nothing written.
//! assert!(!mem.write_u64(2 << 20, 1));
//! assert_eq!(mem.read_u64(2 << 20), None);
//! // The host gives a range back: it reads as zero again.
//! mem.discard(0, 2 << 20)?;
//! assert_eq!(mem.read_u64(4096), Some(0));
//! # Ok::<(), MemoryError>(())
//! ```

mod access;
mod backing;
mod error;
mod mapping;

pub use access::PAGE_WORDS;
pub use backing::Backing;
pub use error::MemoryError;
pub use mapping::GuestMemory;
