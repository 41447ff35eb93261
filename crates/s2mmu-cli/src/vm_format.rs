//! `--format`, the stage-2 format a simulated guest's tables are in: the
//! benchmarks and `migrate` take it, and dispatch once on it to code
//! generic over [`s2mmu_vm::VmFormat`].
//!
//! This is the one place a command line's format name becomes a type
//! ([`FormatArg::with`]); the names, the words reports use
//! ([`FormatArg::title`], [`FormatArg::hardware_dirty`]) and the list
//! (`--format`'s values, [`FormatArg::all`]) are the engine's
//! ([`s2mmu::format::FormatId`], made from each format's
//! [`s2mmu::format::KnownFormat`] consts). The migration stream carries a
//! format as a [`WireFormat`] code (s2mmu-migrate's), which the command
//! line's spelling cannot change. Adding a format changes nothing here.

use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptFormat;
use s2mmu::format::FormatId;
pub use s2mmu::format::WithFormat;
use s2mmu_migrate::wire::WireFormat;
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
    pub const Ept: FormatArg = FormatArg::of::<EptFormat>();

    /// Format `F`'s.
    pub const fn of<F: s2mmu_vm::VmFormat>() -> FormatArg {
        FormatArg(FormatId::of::<F>())
    }

    /// Runs `code` with the format type this name stands for.
    pub fn with<W: WithFormat>(self, code: W) -> W::Output {
        self.0.with(code)
    }

    /// The name the option takes (the type's [`s2mmu_vm::VmFormat::NAME`]).
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
    pub fn hardware_dirty(self) -> &'static str {
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

impl From<WireFormat> for FormatArg {
    fn from(w: WireFormat) -> FormatArg {
        FormatArg(w.id())
    }
}

impl From<FormatArg> for WireFormat {
    fn from(f: FormatArg) -> WireFormat {
        WireFormat::from(f.0)
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
            let w = WireFormat::from(f);
            assert_eq!(WireFormat::of_code(w.code()), Some(w));
            assert_eq!(FormatArg::from(w), f);
            assert_eq!(w.name(), f.name());
            assert_eq!(FormatArg::from_str(f.name(), false), Ok(f));
        }
        assert_eq!(FormatArg::Arm64.name(), "arm64");
        assert_eq!(FormatArg::Ept.name(), "ept");
        assert_eq!(WireFormat::from(FormatArg::Ept).code(), 1);
        assert!(FormatArg::from_str("riscv", false).is_err());
        assert_eq!(FormatArg::Ept.title(), "x86 EPT");
        assert_eq!(FormatArg::Arm64.hardware_dirty(), "arm64 DBM");
    }
}
