//! Descriptor formats behind one trait.
//!
//! Everything above this module (walker, operations, dirty logging) is
//! format-agnostic: it asks the format what a level covers, whether an entry
//! is a table, how to build a leaf. [`arm64`] is the VMSAv8-64 stage-2
//! format, [`ept`] the x86 EPT format.

pub mod arm64;
#[cfg(all(test, feature = "std"))]
mod conformance;
pub mod ept;
mod id;
mod known;
mod leaf;
mod pte;

pub use id::FormatId;
pub use known::{KnownFormat, WithFormat};
pub use pte::{HwDirtyBits, Prot, PteFormat};
