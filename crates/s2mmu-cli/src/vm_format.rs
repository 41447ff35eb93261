//! `--format`, the stage-2 format a simulated guest's tables are in: the
//! benchmarks and `migrate` take it, and dispatch once on it to code
//! generic over [`s2mmu_vm::VmFormat`].

/// The stage-2 format of the simulated VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// arm64 stage 2, 4 KiB granule, DBM for hardware dirty state.
    Arm64,
    /// x86 EPT, 4 levels, accessed/dirty flags (and PML).
    Ept,
}

impl FormatArg {
    /// The name the option takes.
    pub fn name(self) -> &'static str {
        match self {
            FormatArg::Arm64 => "arm64",
            FormatArg::Ept => "ept",
        }
    }
}
