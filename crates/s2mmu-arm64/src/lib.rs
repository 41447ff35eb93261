//! The s2mmu engine as the stage-2 MMU of a real arm64 implementation:
//! QEMU's architectural model (`qemu-system-aarch64 -M
//! virt,virtualization=on -cpu max`, MTTCG).
//!
//! The split is nVHE KVM's. The engine runs here, on the host, and writes
//! its stage-2 tables into guest-physical RAM that this process shares with
//! QEMU (a `memory-backend-file`): table pages come from an arena in that
//! RAM ([`arena::ArenaMmOps`]), and mappings point at real guest-physical
//! addresses ([`s2mmu::mmu::HostMemory`]). A small EL2 program in assembly
//! (`asm/hyp.S`, assembled by the build with GNU binutils) runs on every
//! QEMU CPU: it installs the tables (VTCR_EL2, VTTBR_EL2, HCR_EL2), runs
//! guest code at EL1, reports every stage-2 abort (ESR_EL2, HPFAR_EL2,
//! FAR_EL2) through a per-CPU mailbox and waits for the engine's answer,
//! and executes the TLB maintenance the engine asks for — from a fault's
//! answer, or queued by a host thread to a CPU kept for that ([`tlbi`]):
//! the design's `kvm_call_hyp`.
//!
//! So QEMU's own walker — written independently of s2mmu — judges every
//! table the engine builds, every fault it handles and every invalidation
//! it issues: a missing TLBI leaves QEMU's TLB with a stale translation,
//! and the guest's write is lost to the dirty log ([`vm`] checks every
//! pass against the guest's own record).
//!
//! QEMU timings are an emulator's (TCG translates guest code), never
//! hardware figures: use counts and ratios.
//!
//! Without QEMU or the aarch64 assembler the crate still builds;
//! [`machine::Machine::start`] then returns [`Arm64Error::Unavailable`],
//! and the test runner reports the tests as ignored with that reason.
//!
//! Where to start:
//! - [`machine::Machine`]: a QEMU machine with the EL2 program on every
//!   CPU; [`vm::Arm64Vm`]: the engine's stage 2 over it, a guest at EL1;
//! - [`workload::run_dirty_log`]: dirty logging of a running guest, every
//!   pass checked against what the guest wrote;
//! - [`linux`]: Debian's arm64 Linux as the guest: [`linux::vm::run`]
//!   boots it, [`linux::migrate::LinuxVm`] pauses, saves and restores it
//!   (the `s2mmu-arm64-migrate` crate migrates it through `s2mmu-migrate`'s
//!   session);
//! - [`available`]: whether the model can run here, and why not.
//!
//! Dirty logging on the model (QEMU and the EL2 image needed, so not run
//! here):
//!
//! ```no_run
//! use s2mmu_arm64::machine::{Machine, MachineConfig};
//! use s2mmu_arm64::vm::{Arm64Vm, VmConfig};
//! use s2mmu_arm64::workload::{run_dirty_log, DirtyConfig};
//! use std::sync::Arc;
//!
//! // Two vCPUs and one CPU more for the TLB maintenance host threads queue.
//! let m = Machine::start(&MachineConfig {
//!     cpus: 3,
//!     data_bytes: 16 << 20,
//!     ram_pages: Default::default(),
//! })?;
//! let vm = Arm64Vm::new(Arc::new(m), &VmConfig::default())?;
//! let cfg = DirtyConfig {
//!     vcpus: 2,
//!     bytes_per_vcpu: 4 << 20,
//!     ..DirtyConfig::default()
//! };
//! let r = run_dirty_log(&vm, &cfg)?;
//! for p in &r.passes {
//!     // Every page the guest wrote was logged, and nothing else.
//!     assert_eq!((p.missing, p.extra), (0, 0));
//! }
//! # Ok::<(), s2mmu_arm64::Arm64Error>(())
//! ```
#![warn(missing_docs)]

pub mod effect;
mod hyp;
pub mod linux;
mod passes;
pub mod probe;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod vm;
pub mod walk_cache;
pub mod workload;

pub use hyp::{arena, layout, machine, ram, stage2, tlbi};
use hyp::{doorbell, qemu_process, ram_file};

use std::fmt;

mod symbols {
    include!(concat!(env!("OUT_DIR"), "/symbols.rs"));
}

/// What running on the arm64 model can fail with.
#[derive(Debug)]
pub enum Arm64Error {
    /// QEMU or the assembled image is missing: the check cannot run here.
    Unavailable(String),
    /// A bad configuration (names the value).
    Config(String),
    /// A file or mapping could not be made.
    Io(String),
    /// QEMU exited, or the stub did not answer in time.
    Boot(String),
    /// The stub reported something the engine cannot handle.
    Guest(String),
    /// The engine refused an operation.
    Engine(s2mmu::Error),
}

impl fmt::Display for Arm64Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arm64Error::Unavailable(s) => write!(f, "arm64 model unavailable: {s}"),
            Arm64Error::Config(s) => write!(f, "arm64 configuration: {s}"),
            Arm64Error::Io(s) => write!(f, "arm64 I/O: {s}"),
            Arm64Error::Boot(s) => write!(f, "arm64 machine: {s}"),
            Arm64Error::Guest(s) => write!(f, "arm64 guest: {s}"),
            Arm64Error::Engine(e) => write!(f, "engine: {e}"),
        }
    }
}

impl std::error::Error for Arm64Error {}

impl From<s2mmu::Error> for Arm64Error {
    fn from(e: s2mmu::Error) -> Self {
        Arm64Error::Engine(e)
    }
}

/// This crate's result.
pub type Result<T> = std::result::Result<T, Arm64Error>;

/// The assembled EL2 image.
///
/// # Errors
/// [`Arm64Error::Unavailable`] when the build had no aarch64 assembler.
pub fn image() -> Result<&'static [u8]> {
    #[cfg(s2mmu_arm64_image)]
    {
        Ok(symbols::IMAGE)
    }
    #[cfg(not(s2mmu_arm64_image))]
    {
        Err(Arm64Error::Unavailable(symbols::MISSING.to_string()))
    }
}

/// The stub with the engine linked in, for the EL2 placement
/// (`linux::vm::Engine::El2`).
///
/// # Errors
/// [`Arm64Error::Unavailable`] when the build had no aarch64 assembler or
/// no `aarch64-unknown-none` target.
pub fn image_el2() -> Result<&'static [u8]> {
    #[cfg(s2mmu_arm64_image)]
    {
        symbols::IMAGE_EL2.map_err(|why| Arm64Error::Unavailable(why.to_string()))
    }
    #[cfg(not(s2mmu_arm64_image))]
    {
        Err(Arm64Error::Unavailable(symbols::MISSING.to_string()))
    }
}

/// Guest code entry points in the image.
#[cfg(s2mmu_arm64_image)]
pub(crate) mod entry {
    pub use super::symbols::GUEST_SEMIHOST_PROBE as SEMIHOST_PROBE;
    pub use super::symbols::{
        GUEST_MEMSTRESS as MEMSTRESS, GUEST_PROBE as PROBE, GUEST_S1_PROBE as S1_PROBE,
        GUEST_TIMER_PROBE as TIMER_PROBE,
    };
}
/// Guest code entry points in the image (none without one).
#[cfg(not(s2mmu_arm64_image))]
pub(crate) mod entry {
    pub const MEMSTRESS: u64 = 0;
    pub const PROBE: u64 = 0;
    pub const S1_PROBE: u64 = 0;
    pub const TIMER_PROBE: u64 = 0;
    pub const SEMIHOST_PROBE: u64 = 0;
}

/// The guest probe's entry point (one load or store, then HVC with what it
/// read or wrote): for [`vm::Arm64Vm::run`] with x0 = 1 to write, x1 =
/// IPA, x2 = value.
pub fn probe_entry() -> u64 {
    entry::PROBE
}

/// The timer probe's entry point: it arms the virtual timer to fire at
/// once (interrupts masked, so the guest never takes it), then makes HVC
/// after HVC with x0 = 2, for [`vm::Arm64Vm::run`].
pub fn timer_probe_entry() -> u64 {
    entry::TIMER_PROBE
}

/// The semihosting probe's entry point: it makes the semihosting call
/// `HLT #0xf000` at EL1 with x0 = the operation and x1 = its parameter (an
/// IPA), then reports with HVC x0 = 2, x1 = the call's result; an
/// exception at EL1 (the HLT's UNDEF) with HVC x0 = 5, x1 = ESR_EL1. For
/// [`vm::Arm64Vm::run`].
pub fn semihost_probe_entry() -> u64 {
    entry::SEMIHOST_PROBE
}

/// Whether the arm64 model can run here, or why not (for tests that skip).
pub fn available() -> std::result::Result<(), String> {
    image().map_err(|e| e.to_string())?;
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::var_os("S2MMU_QEMU").is_none()
        && !std::env::split_paths(&path).any(|d| d.join("qemu-system-aarch64").is_file())
    {
        return Err(
            "qemu-system-aarch64 not found (Debian: apt-get install qemu-system-arm)".into(),
        );
    }
    Ok(())
}
