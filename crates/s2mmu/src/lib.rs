//! s2mmu: a second-stage MMU for hypervisors.
#![cfg_attr(not(feature = "std"), no_std)]
extern crate alloc;
pub mod memslot;
