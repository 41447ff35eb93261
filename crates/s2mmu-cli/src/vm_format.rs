//! `--format`, the stage-2 format a simulated guest's tables are in: the
//! benchmarks and `migrate` take it, and dispatch once on it to code
//! generic over [`s2mmu_vm::VmFormat`].
//!
//! This is the one place a format's name becomes a type
//! ([`FormatArg::with`]); the migration stream carries a format as a
//! [`WireFormat`] code, which the command line's spelling cannot change.
//! Adding a format: its `VmFormat` impl in s2mmu-vm, a variant here in
//! [`FormatArg`] and in s2mmu-migrate's [`WireFormat`] (a new code), and its arm in `with`.

use s2mmu::format::arm64::Arm64Stage2;
use s2mmu::format::ept::EptFormat;
pub use s2mmu_migrate::wire::WireFormat;
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
}

impl From<WireFormat> for FormatArg {
    fn from(w: WireFormat) -> FormatArg {
        match w {
            WireFormat::Arm64 => FormatArg::Arm64,
            WireFormat::Ept => FormatArg::Ept,
        }
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
        for f in [FormatArg::Arm64, FormatArg::Ept] {
            let w = WireFormat::from(f);
            assert_eq!(WireFormat::of_code(w.code()), Some(w));
            assert_eq!(FormatArg::from(w), f);
            assert_eq!(w.name(), f.name());
        }
        assert_eq!(FormatArg::Arm64.name(), "arm64");
        assert_eq!(FormatArg::Ept.name(), "ept");
        assert_eq!(WireFormat::of_code(2), None);
    }
}
