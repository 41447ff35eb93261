//! Where the stage-2 engine runs, as a Linux VM sees it: the one seam
//! between the machine (devices, PSCI, vCPU threads, the VM's state) and
//! the engine, the [`Placement`] trait, with one implementation per
//! placement.
//!
//! - The host placement ([`crate::vm::Arm64Vm`], in `host.rs`): the engine runs in
//!   this process. The EL2 stub posts every stage-2 abort to its vCPU's
//!   mailbox; the vCPU's host thread answers it with the engine's fault
//!   path, and the answer carries the TLB maintenance the engine asked
//!   for. A kick, or a TLBI with no exit to ride on, goes to the service
//!   CPU.
//! - The EL2 placement ([`El2Vm`], in `el2.rs`): the engine linked into
//!   the EL2 image. RAM faults are answered at EL2 on the faulting CPU,
//!   and only the aborts the engine leaves to the host (an IPA no memslot
//!   covers, a full dirty ring) reach [`PlacedVcpu::stage2_abort`]; the
//!   host drives the engine by command blocks EL2 checks.
//!
//! The machine holds its placement as a `Box<dyn Placement>`, chosen when
//! the VM is made (`LinuxConfig::engine`). Nothing per page goes through
//! the box: a stage-2 abort makes one call through it (beside an exit's
//! round trip through the stub's mailbox), and a harvest one per slot.

mod el2;
mod engine_log;
mod host;

pub use engine_log::EngineLog;
pub(crate) use engine_log::PlacedLog;

use crate::linux::el2::{El2Vm, WeakEl2Vm};
use crate::machine::{Exit, Machine};
use crate::tlbi::HypSink;
use crate::Result;
use s2mmu::dirty::DirtyGfn;
use s2mmu::mmu::DirtyMode;
use std::sync::Arc;

/// What the host made of a stage-2 abort the stub reported.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Answered by the host: the TLB maintenance the answer must carry
    /// before the guest retries.
    Mapped(Vec<(u64, u64)>),
    /// Nothing for the host to answer: a memslot added since the abort
    /// now covers its IPA. The guest retries the access, and the engine
    /// answers it where it runs.
    Retry,
}

/// What a vCPU's host thread keeps of the engine between exits.
pub(crate) trait PlacedVcpu: Send {
    /// A stage-2 abort the stub reported for this vCPU: the host's
    /// [`Answer`], or the engine's error ([`s2mmu::Error::NoSlot`] for an
    /// IPA no memslot covers: MMIO).
    ///
    /// # Errors
    /// A fault status the engine does not handle.
    fn stage2_abort(&mut self, e: &Exit) -> Result<s2mmu::Result<Answer>>;
}

/// The engine's placement: what the machine needs of its stage-2 engine,
/// wherever the engine runs.
pub(crate) trait Placement: Send + Sync {
    /// The QEMU machine the engine drives.
    fn machine(&self) -> &Arc<Machine>;

    /// The service CPU's sink.
    fn sink(&self) -> &Arc<HypSink>;

    /// The engine's state for vCPU `id`'s thread.
    ///
    /// # Errors
    /// The engine's refusal.
    fn new_vcpu(&self, id: usize) -> Result<Box<dyn PlacedVcpu + '_>>;

    /// VTCR_EL2 and VTTBR_EL2 that a vCPU runs its guest under.
    fn stage2_regs(&self) -> (u64, u64);

    /// Kicks every vCPU in `vcpus` out of its guest, with one command.
    ///
    /// # Errors
    /// The command was not carried out.
    fn kick_all(&self, vcpus: &[usize]) -> Result<()> {
        self.sink().try_kick_all(vcpus)
    }

    /// Creates a memslot: `size` bytes at IPA `gpa`, backed at `pa`, in
    /// pages of `page` bytes.
    ///
    /// # Errors
    /// The engine's refusal.
    fn add_slot(&self, id: u16, gpa: u64, pa: u64, size: u64, page: u64) -> Result<()>;

    /// Deletes memslot `slot` at IPA `gpa`, backed at `pa`. With `last`,
    /// the slot's log in the mode without rings: its last bits are ORed
    /// into `last` (a bit per page) as it goes.
    ///
    /// # Errors
    /// The engine's refusal.
    fn delete_slot(&self, slot: u16, gpa: u64, pa: u64, last: Option<&mut [u64]>) -> Result<()>;

    /// Turns dirty logging on for `slot`.
    ///
    /// # Errors
    /// The engine's refusal.
    fn enable_dirty_logging(&self, slot: u16) -> Result<()>;

    /// Stops logging on `slot`, its split blocks collapsed back in place;
    /// returns the blocks collapsed.
    ///
    /// # Errors
    /// The engine's refusal.
    fn collapse(&self, slot: u16) -> Result<u64>;

    /// Moves the guest page backed at `pa` (as its slot names it) to the
    /// free page `new_pa` through the engine's MMU notifier; the page it
    /// left holds [`crate::vm::POISON`] afterwards.
    ///
    /// # Errors
    /// The engine's refusal (EL2's, for a page or target it does not take).
    fn remap_page(&self, pa: u64, new_pa: u64) -> Result<()>;

    /// The engine's dirty log as the harvester reads it.
    fn log(&self) -> &dyn PlacedLog;

    /// One harvest under `mode` into `bitmap`: of each logged slot
    /// `(memslot, first bit, pages)`, each slot's first bit a multiple of
    /// 64; `ring` is scratch for the rings' entries.
    ///
    /// # Errors
    /// The engine's refusal.
    fn harvest(
        &self,
        mode: DirtyMode,
        slots: &[(u16, u64, u64)],
        bitmap: &mut [u64],
        ring: &mut Vec<DirtyGfn>,
    ) -> Result<()> {
        engine_log::harvest(self.log(), mode, slots, bitmap, ring)
    }

    /// The engine's dirty log, as a migration's session drives it.
    fn dirty_log(&self) -> EngineLog;

    /// Where the dirty-rate brakes run besides the host's fault path: the
    /// engine at EL2, or nowhere else (`None`).
    fn brakes(&self) -> Option<WeakEl2Vm>;

    /// Whether the engine itself holds back post-copy's pages (EL2), as
    /// opposed to a fault path that asks the hook itself (the host's).
    fn postcopy_at_engine(&self) -> bool;

    /// Whether the RAM slot waits for post-copy's pages where the engine
    /// runs (always true where the fault path asks the hook itself).
    fn postcopy_armed(&self) -> bool;

    /// Makes slot `slot` (`bytes` at IPA `ipa`, backed at `pa`) a
    /// post-copy slot (logging if `logging`): the engine maps none of its
    /// pages until the host has it. Nothing to do where the fault path
    /// asks the hook itself.
    ///
    /// # Errors
    /// The engine's refusal.
    fn arm_postcopy(&self, slot: u16, ipa: u64, pa: u64, bytes: u64, logging: bool) -> Result<()>;

    /// The engine at EL2, for what only it has: its counters and per-CPU
    /// fault counts in a report, its break-before-make trace and fault
    /// injection (`logging/el2_inject.rs`); `None` elsewhere.
    fn el2(&self) -> Option<&El2Vm>;
}

/// Where a Linux VM's engine runs. The default is EL2, the faster of the
/// two by `s2mmu linux --engine-compare` (its write-protection fault cost
/// and the guest's write rate under dirty logging).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    /// In this process: every stage-2 abort exits to a host thread.
    Host,
    /// At EL2, linked into the stub: aborts on RAM never leave EL2.
    #[default]
    El2,
}

impl std::str::FromStr for Engine {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "host" => Ok(Engine::Host),
            "el2" => Ok(Engine::El2),
            _ => Err(format!("engine {s:?}: expected host or el2")),
        }
    }
}
