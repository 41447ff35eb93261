//! The benchmark engines of the `s2mmu` command: each builds and runs what it
//! measures (simulated VMs and their vCPU threads, memslot guests, the arm64
//! model on QEMU, real KVM) and returns result structs; the command keeps
//! only its flags, the text and JSON reports and the plots.

pub mod arm64;
pub mod dirty_log;
pub mod dirty_mode;
pub mod harvest;
pub mod host;
pub mod memslot;
pub mod report;
pub mod split;
pub mod stats;
pub mod tlb;
pub mod views;
pub mod vs_qemu;
pub mod wire;

/// Where an engine reports how far it got (the command draws a progress
/// bar); every method does nothing unless implemented.
pub trait Progress {
    /// One step of the run is done.
    fn step(&self) {}
    /// What runs now.
    fn message(&self, _msg: &str) {}
}

/// Makes the progress bar of one phase of a run from what runs and its
/// number of steps (the command draws them; [`no_bars`] shows nothing).
pub type Bars<'a> = &'a dyn Fn(&str, u64) -> Box<dyn Progress>;

/// A [`Bars`] that shows nothing.
pub fn no_bars(_what: &str, _steps: u64) -> Box<dyn Progress> {
    Box::new(NoProgress)
}

/// No progress shown.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// A byte count as the largest exact unit (`1GiB`, `2MiB`, `4096B`).
pub fn human_bytes(b: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    format!("{b}B")
}
