//! `--format`, the stage-2 format a simulated guest's tables are in: the
//! benchmarks and `migrate` take it, and dispatch once on it to code
//! generic over [`s2mmu_vm::VmFormat`].
//!
//! This is the one place a format's name becomes a type
//! ([`FormatArg::with`]) or the words a report uses for it
//! ([`FormatArg::title`], [`FormatArg::hardware_dirty`]); the rest of the
//! command iterates [`FormatArg::all`] and dispatches through `with`. The
//! migration stream carries a format as a [`WireFormat`] code, which the
//! command line's spelling cannot change. Adding a format: its `VmFormat`
//! impl in s2mmu-vm, and here a variant in [`FormatArg`] and
//! [`WireFormat`] (a new code) with its arms in `with`, `words` and the
//! conversions.

use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptFormat;
use s2mmu_vm::VmFormat;

/// The stage-2 format of the simulated VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// arm64 stage 2, 4 KiB granule, DBM for hardware dirty state.
    Arm64,
    /// x86 EPT, 4 levels, accessed/dirty flags (and PML).
    Ept,
}

/// Code generic over the format, run by [`FormatArg::with`] with the type
/// the name stands for.
pub trait WithFormat {
    /// What the code returns.
    type Output;
    /// Runs the code on format `F`.
    fn call<F: VmFormat>(self) -> Self::Output;
}

/// The format's name, read off its type.
struct Name;

impl WithFormat for Name {
    type Output = &'static str;
    fn call<F: VmFormat>(self) -> &'static str {
        F::NAME
    }
}

impl FormatArg {
    /// Runs `code` with the format type this name stands for.
    pub fn with<W: WithFormat>(self, code: W) -> W::Output {
        match self {
            FormatArg::Arm64 => code.call::<Arm64Stage2>(),
            FormatArg::Ept => code.call::<EptFormat>(),
        }
    }

    /// The name the option takes (the type's [`VmFormat::NAME`]).
    pub fn name(self) -> &'static str {
        self.with(Name)
    }

    /// Every format, in the order `--format` lists them.
    pub fn all() -> &'static [FormatArg] {
        <FormatArg as clap::ValueEnum>::value_variants()
    }

    /// What reports call the format's tables ("arm64 stage 2").
    pub fn title(self) -> &'static str {
        self.words().0
    }

    /// What reports call the format's hardware dirty state ("arm64 DBM").
    pub fn hardware_dirty(self) -> &'static str {
        self.words().1
    }

    /// The words of [`FormatArg::title`] and [`FormatArg::hardware_dirty`].
    fn words(self) -> (&'static str, &'static str) {
        match self {
            FormatArg::Arm64 => ("arm64 stage 2", "arm64 DBM"),
            FormatArg::Ept => ("x86 EPT", "x86 EPT dirty flags"),
        }
    }
}

/// A stage-2 format as the migration stream's HEADER carries it: a code
/// fixed on the wire, separate from the command line's enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireFormat {
    /// Code 0: arm64 stage 2.
    Arm64,
    /// Code 1: x86 EPT.
    Ept,
}

impl WireFormat {
    /// The code on the wire.
    pub const fn code(self) -> u8 {
        match self {
            WireFormat::Arm64 => 0,
            WireFormat::Ept => 1,
        }
    }

    /// The format of a code (`None`: one this build does not know).
    pub const fn of_code(code: u8) -> Option<WireFormat> {
        match code {
            0 => Some(WireFormat::Arm64),
            1 => Some(WireFormat::Ept),
            _ => None,
        }
    }

    /// The command line's value for it.
    pub const fn arg(self) -> FormatArg {
        match self {
            WireFormat::Arm64 => FormatArg::Arm64,
            WireFormat::Ept => FormatArg::Ept,
        }
    }

    /// Its name (as `--format` spells it).
    pub fn name(self) -> &'static str {
        self.arg().name()
    }
}

impl From<FormatArg> for WireFormat {
    fn from(f: FormatArg) -> WireFormat {
        match f {
            FormatArg::Arm64 => WireFormat::Arm64,
            FormatArg::Ept => WireFormat::Ept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        assert_eq!(FormatArg::all(), [FormatArg::Arm64, FormatArg::Ept]);
        for &f in FormatArg::all() {
            let w = WireFormat::from(f);
            assert_eq!(WireFormat::of_code(w.code()), Some(w));
            assert_eq!(w.arg(), f);
            assert_eq!(w.name(), f.name());
        }
        assert_eq!(FormatArg::Arm64.name(), "arm64");
        assert_eq!(FormatArg::Ept.name(), "ept");
        assert_eq!(WireFormat::of_code(2), None);
        assert_eq!(FormatArg::Ept.title(), "x86 EPT");
        assert_eq!(FormatArg::Arm64.hardware_dirty(), "arm64 DBM");
    }
}
