//! `--format`, the stage-2 format a simulated guest's tables are in: the
//! benchmarks and `migrate` take it, and dispatch once on it to code
//! generic over [`s2mmu::format::KnownFormat`].
//!
//! [`FormatArg`] is the engine's [`FormatId`] as the command line parses
//! it: a type of its own only because clap's `ValueEnum` cannot be
//! implemented on the engine's type. This is the one place a command
//! line's format name becomes a type ([`FormatArg::with`]); the names, the
//! words reports use ([`FormatArg::title`],
//! [`FormatArg::hardware_dirty_name`]) and the list (`--format`'s values,
//! [`FormatArg::all`]) are the engine's (made from each format's
//! [`s2mmu::format::KnownFormat`] consts). The migration stream carries a
//! format as its [`FormatId::code`], which the command line's spelling
//! cannot change. Adding a format changes nothing here.

use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptStage2;
use s2mmu::format::FormatId;
pub use s2mmu::format::WithFormat;
use std::fmt;

/// The stage-2 format of the simulated VM, as `--format` names it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FormatArg(FormatId);

/// How many formats the engine ships.
const COUNT: usize = FormatId::ALL.len();

/// Every format, in the engine's order: the values `--format` takes.
const ALL: [FormatArg; COUNT] = {
    let mut all = [FormatArg(FormatId::ALL[0]); COUNT];
    let mut i = 1;
    while i < COUNT {
        all[i] = FormatArg(FormatId::ALL[i]);
        i += 1;
    }
    all
};

#[allow(non_upper_case_globals)]
impl FormatArg {
    /// arm64 stage 2, named for the paths only it has (QEMU's model, KVM,
    /// other granules); spelled as the enum's variant was, so call sites
    /// read the same.
    pub const Arm64: FormatArg = FormatArg::of::<Arm64Stage2>();
    /// x86 EPT, for the tests that pick it.
    pub const Ept: FormatArg = FormatArg::of::<EptStage2>();

    /// Format `F`'s.
    pub const fn of<F: s2mmu::format::KnownFormat>() -> FormatArg {
        FormatArg(FormatId::of::<F>())
    }

    /// Runs `code` with the format type this name stands for.
    pub fn with<W: WithFormat>(self, code: W) -> W::Output {
        self.0.with(code)
    }

    /// The name the option takes (the type's [`s2mmu::format::KnownFormat::NAME`]).
    pub fn name(self) -> &'static str {
        self.0.name()
    }

    /// Every format, in the order `--format` lists them.
    pub fn all() -> &'static [FormatArg] {
        &ALL
    }

    /// What reports call the format's tables ("arm64 stage 2").
    pub fn title(self) -> &'static str {
        self.0.title()
    }

    /// What reports call the format's hardware dirty state ("arm64 DBM").
    pub fn hardware_dirty_name(self) -> &'static str {
        self.0.hardware_dirty_name()
    }
}

impl fmt::Debug for FormatArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl clap::ValueEnum for FormatArg {
    fn value_variants<'a>() -> &'a [Self] {
        &ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()).help(self.title()))
    }
}

impl From<FormatId> for FormatArg {
    fn from(f: FormatId) -> FormatArg {
        FormatArg(f)
    }
}

impl From<FormatArg> for FormatId {
    fn from(f: FormatArg) -> FormatId {
        f.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn names_and_codes_round_trip() {
        assert_eq!(FormatArg::all().len(), FormatId::ALL.len());
        for &f in FormatArg::all() {
            let id = FormatId::from(f);
            assert_eq!(FormatId::from_code(id.code()), Some(id));
            assert_eq!(FormatArg::from(id), f);
            assert_eq!(id.name(), f.name());
            assert_eq!(FormatArg::from_str(f.name(), false), Ok(f));
        }
        assert_eq!(FormatArg::Arm64.name(), "arm64");
        assert_eq!(FormatArg::Ept.name(), "ept");
        assert_eq!(FormatId::from(FormatArg::Ept).code(), 1);
        assert!(FormatArg::from_str("riscv", false).is_err());
        assert_eq!(FormatArg::Ept.title(), "x86 EPT");
        assert_eq!(FormatArg::Arm64.hardware_dirty_name(), "arm64 DBM");
    }
}
