//! An engine run's settings, which the bounds check and the run share.

use s2mmu::mmu::MmuPolicy;
use s2mmu_vm::Backing;

/// An engine run's settings; `Fmt` names the stage-2 format the caller
/// dispatches on (the engine runs on the format type [`run`](super::run) is given).
#[derive(Clone, Copy, Debug)]
pub struct RunSpec<Fmt> {
    pub vcpus: usize,
    pub bytes: u64,
    pub iterations: u32,
    pub backing: Backing,
    pub slots: u32,
    pub write_percent: u32,
    pub random: bool,
    pub policy: MmuPolicy,
    pub after_pass: bool,
    pub check: bool,
    pub inject_lost_marks: u64,
    /// The stage-2 format the caller names.
    pub format: Fmt,
    /// Time passes with logging off before logging starts (their median).
    pub off_pass: bool,
}

#[cfg(test)]
impl RunSpec<()> {
    /// The tests' run: `vcpus` vCPUs over `bytes` of 4 KiB pages in one
    /// slot, one sequential all-write iteration, default policy, no checks.
    pub(crate) fn for_tests(vcpus: usize, bytes: u64) -> Self {
        RunSpec {
            vcpus,
            bytes,
            iterations: 1,
            backing: Backing::Anonymous,
            slots: 1,
            write_percent: 100,
            random: false,
            policy: MmuPolicy::default(),
            after_pass: false,
            check: false,
            inject_lost_marks: 0,
            format: (),
            off_pass: false,
        }
    }
}
