//! Memslots: which guest-physical ranges exist and which host memory backs them.
//!
//! Two policies sit behind one interface, [`MemslotStore`]:
//! - [`TreeMemslots`], the design Linux KVM merged in 5.17 ("Scalable memslots"): two sets,
//!   active and inactive, that share `Arc<Slot>` objects; each set has a gfn-ordered tree,
//!   an hva interval index, an id map and a last-used-slot cache. A change is applied to
//!   the inactive set, published by swapping, and replayed on the retired set once its
//!   readers are gone: O(log n) per change.
//! - `ArrayMemslots` (the `baselines` feature), the design before it and the baseline: a gfn-sorted array copied
//!   whole on every change, binary search by gfn, linear scan by hva: O(n) per change.
//!
//! Readers (vCPU threads, MMU notifiers) call [`MemslotStore::snapshot`] and use the
//! [`SlotLookup`] methods on it. They never lock and always see one published state, the
//! old or the new, never a mix. A vCPU keeps a [`VcpuSlotCache`], which is checked against
//! the state's generation.
//!
//! Delete and move reach the stage-2 page table through [`Stage2Invalidate`].
//!
//! Everything here is `no_std` + `alloc`: the stores take their update lock and the cell
//! they publish through from a [`crate::sync::Platform`] (arc-swap with `std`).

#[cfg(feature = "baselines")]
mod array;
mod cache;
mod config;
mod error;
mod hva_index;
mod invalidate;
mod lookup;
mod slot;
mod sorted_map;
mod store;
mod tree;
mod validate;

#[cfg(feature = "baselines")]
mod array_store;
mod tree_store;

#[cfg(feature = "baselines")]
pub use array::ArraySet;
pub use cache::VcpuSlotCache;
pub use config::{
    MemslotConfig, KVM_MEM_MAX_NR_PAGES, KVM_MEM_SLOTS_NUM, KVM_USER_MEM_SLOTS, PAGE_SHIFT_4K,
};
pub use error::{errno, MemslotError};
pub use invalidate::{NoStage2, Stage2Invalidate};
pub use lookup::{HvaOverlap, SlotLookup};
pub use slot::{HvaFault, MemslotChange, Slot, SlotFlags, UserMemoryRegion};
pub use store::MemslotStore;
pub use tree::TreeSet;

#[cfg(feature = "baselines")]
pub use array_store::{ArrayMemslots, ArraySnapshot};
pub use tree_store::{TreeMemslots, TreeSnapshot};
