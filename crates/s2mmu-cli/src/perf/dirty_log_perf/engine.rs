//! The engine's settings the flags make ([`RunSpec`], [`policy_for`]) and
//! the `--format` dispatch of a run ([`engine`]).

use super::params::{Params, RecoverArg};
use s2mmu::mmu::{DirtyMode, FaultPath, HugePageRecovery, MmuPolicy, Protect};
use s2mmu::SplitPolicy;
use s2mmu_bench::dirty_log::EngineRun;
use s2mmu_cli::vm_format::{FormatArg, WithFormat};
use s2mmu_vm::KnownFormat;

/// What each way of running `dirty-log-perf` takes: the options, the vCPU
/// counts (the first alone where one count is measured), the bytes per
/// vCPU and the spec of one engine run for a vCPU count, fault path and
/// eager split.
pub(super) struct Job<'a> {
    pub p: &'a Params,
    pub vcpus: &'a [usize],
    pub bytes: u64,
    pub spec: &'a dyn Fn(usize, FaultPath, bool) -> RunSpec,
}

/// Engine-run settings derived from the options, with the `--format` the
/// run dispatches on.
pub(super) type RunSpec = s2mmu_bench::dirty_log::RunSpec<FormatArg>;

/// The engine's policy for the flags, a fault path and eager split or not.
pub(super) fn policy_for(p: &Params, fault_path: FaultPath, eager: bool) -> MmuPolicy {
    MmuPolicy {
        fault_path,
        eager_split_chunk: eager.then_some(1 << 30),
        split_walk: SplitPolicy::SkipReturns,
        // As the selftest: with manual protect it also asks for
        // INITIALLY_SET (KVM offers it on x86 and arm64), so enabling
        // logging protects nothing and iteration 1 takes no faults.
        dirty: match p.ring() {
            Some(entries) => DirtyMode::Ring { entries },
            None if p.no_manual_protect => p.dirty_modes()[0].with_protect(Protect::OnGet),
            None => p.dirty_modes()[0].with_protect(Protect::Manual {
                initially_set: true,
            }),
        },
        huge_page_recovery: match p.recover {
            RecoverArg::Off => HugePageRecovery::Off,
            RecoverArg::Zap => HugePageRecovery::Unmap,
            RecoverArg::InPlace => HugePageRecovery::Collapse,
        },
        reader_slots: p.read_lock.reader_slots(),
        ..MmuPolicy::default()
    }
}

/// Runs the flow on the memslot store and stage-2 format the flags name.
pub(super) fn engine(spec: RunSpec, memslots: &str) -> Result<EngineRun, String> {
    let format = spec.format;
    format.with(EngineOn { spec, memslots })
}

/// [`s2mmu_bench::dirty_log::run`] on the format type [`FormatArg::with`]
/// gives.
struct EngineOn<'a> {
    spec: RunSpec,
    memslots: &'a str,
}

impl WithFormat for EngineOn<'_> {
    type Output = Result<EngineRun, String>;
    fn call<F: KnownFormat>(self) -> Result<EngineRun, String> {
        s2mmu_bench::dirty_log::run::<F, FormatArg>(self.spec, self.memslots)
    }
}
