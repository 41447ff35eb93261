//! Where the stage-2 engine runs, as a Linux VM's vCPU threads see it: the
//! one seam between the machine (devices, PSCI, vCPU threads, the VM's
//! state) and the engine.
//!
//! - The host placement ([`Arm64Vm`], the one this crate runs): the engine
//!   runs in this process. The EL2 stub posts every stage-2 abort to its
//!   vCPU's mailbox; the vCPU's host thread answers it with the engine's
//!   fault path, and the answer carries the TLB maintenance the engine
//!   asked for. A kick, or a TLBI with no exit to ride on, goes to the
//!   service CPU.
//! - The EL2 placement ([`El2Vm`]): the engine linked into the EL2 image.
//!   RAM faults are answered at EL2 on the faulting CPU, and only the
//!   aborts the engine leaves to the host (an IPA no memslot covers, a
//!   full dirty ring) reach [`Placement::stage2_abort`]; the host drives
//!   the engine by command blocks EL2 checks.
//!
//! The machine holds its placement as [`EngineVm`], either of the two, chosen
//! when the VM is made (`LinuxConfig::engine`); code that answers exits
//! goes through this trait, not through the host placement's engine.

use crate::arena::ArenaMmOps;
use crate::linux::el2::El2Vm;
use crate::machine::{Exit, Machine};
use crate::tlbi::HypSink;
use crate::vm::{Arm64Mmu, Arm64Vm};
use crate::{Arm64Error, Result};
use s2mmu::mmu::VcpuMmu;
use std::sync::Arc;

/// The engine's placement, as a VM's vCPU threads use it.
pub(crate) trait Placement: Send + Sync {
    /// What a vCPU's host thread keeps of the engine between exits.
    type Vcpu;

    /// The engine's state for vCPU `id`'s thread.
    ///
    /// # Errors
    /// The engine's refusal.
    fn new_vcpu(&self, id: usize) -> Result<Self::Vcpu>;

    /// VTCR_EL2 and VTTBR_EL2 that a vCPU runs its guest under.
    fn stage2_regs(&self) -> (u64, u64);

    /// A stage-2 abort the stub reported for `vcpu`: the maintenance the
    /// answer must carry before the guest retries, or the engine's error
    /// ([`s2mmu::Error::NoSlot`] for an IPA no memslot covers: MMIO).
    ///
    /// # Errors
    /// A fault status the engine does not handle.
    fn stage2_abort(
        &self,
        vcpu: &mut Self::Vcpu,
        e: &Exit,
    ) -> Result<s2mmu::Result<Vec<(u64, u64)>>>;

    /// Kicks every vCPU in `vcpus` out of its guest, with one command.
    ///
    /// # Errors
    /// The command was not carried out.
    fn kick_all(&self, vcpus: &[usize]) -> Result<()>;
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

/// The placement a Linux VM runs with.
pub(crate) enum EngineVm {
    /// The engine in this process.
    Host(Arm64Vm),
    /// The engine at EL2.
    El2(El2Vm),
}

/// What a vCPU thread keeps of the engine under [`EngineVm`].
pub(crate) enum EngineVcpu {
    /// The host placement's vCPU state (boxed: the EL2 one is an id).
    Host(Box<VcpuMmu<ArenaMmOps>>),
    /// EL2 keeps the vCPU's state; the host knows its id.
    El2(usize),
}

impl EngineVm {
    /// The machine.
    pub(crate) fn machine(&self) -> &Arc<Machine> {
        match self {
            EngineVm::Host(v) => v.machine(),
            EngineVm::El2(v) => v.machine(),
        }
    }

    /// The service CPU's sink.
    pub(crate) fn sink(&self) -> &Arc<HypSink> {
        match self {
            EngineVm::Host(v) => v.sink(),
            EngineVm::El2(v) => v.sink(),
        }
    }

    /// The host placement's VM, or an error naming `what` for the EL2 one.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] under the EL2 placement.
    pub(crate) fn host(&self, what: &str) -> Result<&Arm64Vm> {
        match self {
            EngineVm::Host(v) => Ok(v),
            EngineVm::El2(_) => Err(Arm64Error::Config(format!(
                "{what} is not supported with the engine at EL2 (--engine el2)"
            ))),
        }
    }

    /// The host placement's engine; see [`EngineVm::host`].
    ///
    /// # Errors
    /// As [`EngineVm::host`].
    pub(crate) fn mmu(&self, what: &str) -> Result<&Arc<Arm64Mmu>> {
        self.host(what).map(|v| v.mmu())
    }

    /// Creates a memslot with the engine, wherever it runs.
    ///
    /// # Errors
    /// The engine's refusal.
    pub(crate) fn add_slot(&self, id: u16, gpa: u64, pa: u64, size: u64, page: u64) -> Result<()> {
        match self {
            EngineVm::Host(v) => v.add_slot(id, gpa, pa, size, page),
            EngineVm::El2(v) => v.add_slot(id, gpa, pa, size, page),
        }
    }
}

impl EngineVm {
    /// Turns dirty logging on for `slot`, wherever the engine runs.
    ///
    /// # Errors
    /// The engine's refusal.
    pub(crate) fn enable_dirty_logging(&self, slot: u16) -> Result<()> {
        match self {
            EngineVm::Host(v) => Ok(v.mmu().enable_dirty_logging(slot)?),
            EngineVm::El2(v) => v.enable_dirty_logging(slot),
        }
    }
}

/// The host changing memory under a running guest, wherever the engine
/// runs (`logging/changes.rs`).
impl EngineVm {
    /// Moves the guest page backed at `pa` (as its slot names it) to the
    /// free page `new_pa` through the engine's MMU notifier; the page it
    /// left holds [`crate::vm::POISON`] afterwards.
    ///
    /// # Errors
    /// The engine's refusal (EL2's, for a page or target it does not take).
    pub(crate) fn remap_page(&self, pa: u64, new_pa: u64) -> Result<()> {
        match self {
            EngineVm::Host(v) => {
                let hva = v.machine().ram().hva(pa).ok_or_else(|| {
                    Arm64Error::Config(format!("{pa:#x} is not a guest data page"))
                })?;
                v.remap_host_page(hva, new_pa)
            }
            EngineVm::El2(v) => {
                let old = v.remap_page(pa, new_pa)?;
                let ram = v.machine().ram();
                for off in (0..4096).step_by(8) {
                    ram.write(old + off, crate::vm::POISON);
                }
                Ok(())
            }
        }
    }

    /// Stops logging on `slot`, its split blocks collapsed back in place;
    /// returns the blocks collapsed.
    ///
    /// # Errors
    /// The engine's refusal.
    pub(crate) fn collapse(&self, slot: u16) -> Result<u64> {
        match self {
            EngineVm::Host(v) => {
                let before = v.mmu().vm_stats().collapsed;
                v.mmu().disable_dirty_logging(slot)?;
                Ok(v.mmu().vm_stats().collapsed - before)
            }
            EngineVm::El2(v) => v.collapse(slot),
        }
    }
}

impl Placement for EngineVm {
    type Vcpu = EngineVcpu;

    fn new_vcpu(&self, id: usize) -> Result<Self::Vcpu> {
        match self {
            EngineVm::Host(v) => Ok(EngineVcpu::Host(Box::new(v.mmu().new_vcpu()?))),
            EngineVm::El2(_) => Ok(EngineVcpu::El2(id)),
        }
    }

    fn stage2_regs(&self) -> (u64, u64) {
        match self {
            EngineVm::Host(v) => v.stage2_regs(),
            EngineVm::El2(v) => v.stage2_regs(),
        }
    }

    fn stage2_abort(
        &self,
        vcpu: &mut Self::Vcpu,
        e: &Exit,
    ) -> Result<s2mmu::Result<Vec<(u64, u64)>>> {
        match (self, vcpu) {
            (EngineVm::Host(v), EngineVcpu::Host(c)) => v.fault(c, e),
            (EngineVm::El2(v), EngineVcpu::El2(id)) => v.stage2_abort(*id, e),
            _ => Err(Arm64Error::Config(
                "a vCPU of one placement ran under the other".into(),
            )),
        }
    }

    fn kick_all(&self, vcpus: &[usize]) -> Result<()> {
        self.sink().try_kick_all(vcpus)
    }
}
