//! The formats the engine ships, as names, codes and a dispatcher: what a
//! command line, a migration stream or a simulated VM needs to turn a
//! format chosen at run time into the type its code is generic over.
//!
//! Each format states its own name, words and code ([`KnownFormat`], in its
//! file); the list in `format/id.rs` makes [`super::FormatId`] and its
//! dispatch from them, so no crate above names a format to dispatch on it.

use super::pte::PteFormat;
pub(super) use listed::Listed;

/// The sealed supertrait of [`KnownFormat`]: its module is private, and
/// the list in `format/id.rs` alone implements it.
mod listed {
    /// A format of the list.
    pub trait Listed {
        /// Its position in the list ([`super::super::FormatId::ALL`]).
        const INDEX: usize;
    }
}

/// A format the engine ships: one listed in `format/id.rs`, which alone
/// implements the sealed supertrait, so every `KnownFormat` has a
/// [`FormatId`](super::FormatId) and is reached by its dispatch.
pub trait KnownFormat: PteFormat + Listed + Sized {
    /// Its name on a command line and in messages (`arm64`, `ept`).
    const NAME: &'static str;
    /// What reports call its tables (`arm64 stage 2`).
    const TITLE: &'static str;
    /// What reports call its hardware dirty state (`arm64 DBM`).
    const HARDWARE_DIRTY_NAME: &'static str;
    /// Its code in a migration stream's header. Fixed once released: a
    /// stream written by an older build names its format by this number.
    /// Distinct across the list (checked when the crate compiles).
    const WIRE_CODE: u8;

    /// The format with 4 KiB pages for a guest of `ipa_bits`
    /// guest-physical address bits, as a simulated VM runs it.
    ///
    /// # Errors
    /// [`crate::Error::InvalidConfig`] for an address size the format
    /// cannot translate.
    fn for_vm(ipa_bits: u32) -> crate::Result<Self>;
}

/// Code generic over the format, run by [`super::FormatId::with`] on the type the
/// id stands for (a visitor: Rust has no closures generic over a type).
pub trait WithFormat {
    /// What the code returns.
    type Output;
    /// Runs the code on format `F`.
    fn call<F: KnownFormat>(self) -> Self::Output;
}
