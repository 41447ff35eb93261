//! s2mmu: a second-stage MMU for hypervisors.
//!
//! The memory-virtualization core that Linux KVM keeps in its kernel, as an
//! embeddable library: stage-2 page tables and their walker ([`walk`],
//! [`ops`]), table memory ([`table`], [`memcache`]) and TLB invalidation
//! ([`tlb`]), memslots ([`memslot`]), dirty tracking ([`dirty`]) and the
//! [`mmu::Mmu`] facade over them. Everything needs only `alloc`: the
//! facade takes its locks, clock and snapshot cells from a
//! [`sync::Platform`]. The `std` feature (on by default) adds a host-memory
//! table allocator with epoch-based reclamation and the std platform
//! (parking_lot, `Instant`, arc-swap).
//!
//! ```
//! use s2mmu::format::arm64::{Arm64Stage2, Granule};
//! use s2mmu::{MapOptions, PageCache, PageTable, Prot, HostMmOps, NoTlb};
//! use std::sync::Arc;
//!
//! let fmt = Arm64Stage2::new(Granule::K4, 40)?;
//! let mm = HostMmOps::new(4096)?;
//! let mut pt = PageTable::new(fmt, mm.clone(), Arc::new(NoTlb))?;
//! let mut cache = PageCache::new(mm);
//! cache.top_up(4)?;
//! // 4 MiB at IPA 1 GiB, 2 MiB aligned on both sides: two 2 MiB blocks.
//! pt.map(1 << 30, 4 << 20, 0x8000_0000, Prot::RW, &mut cache, MapOptions::default())?;
//! let t = pt.translate((1 << 30) + 0x1234).unwrap();
//! assert_eq!(t.pa, 0x8000_1234);
//! assert_eq!(t.size, 2 << 20);
//! # Ok::<(), s2mmu::Error>(())
//! ```
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]
extern crate alloc;

pub mod addr;
pub mod bbm;
pub mod dirty;
mod error;
pub mod format;
pub mod memcache;
pub mod memslot;
pub mod mmu;
pub mod ops;
mod pgtable;
pub mod sync;
pub mod table;
mod table_view;
pub mod tlb;
mod tlbi;
#[cfg(feature = "vm-memory")]
pub mod vmm_bitmap;
pub mod walk;

pub use addr::{Gfn, Gpa, Hva, Pa};
pub use error::{Error, Result};

/// Whether this build of the engine has the `std` feature (cargo unifies
/// features across a build, so a no_std embedding's test can check that
/// its build really is one).
pub const STD: bool = cfg!(feature = "std");
pub use format::{HwDirtyBits, Prot, PteFormat};
pub use memcache::PageCache;
pub use ops::{
    CollapseStats, MapOptions, MapStats, RelaxOutcome, SplitPolicy, SplitStats, UnmapStats,
};
pub use pgtable::{Leaf, PageTable, TableReader, Translation};
#[cfg(feature = "std")]
pub use table::HostMmOps;
pub use table::MmOps;
pub use table_view::TableView;
pub use tlb::{NoTlb, TlbBatch, TlbInvalidate, TlbPolicy};

/// The README's examples, compiled and run as doctests so they stay true.
#[cfg(all(doctest, feature = "std"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
