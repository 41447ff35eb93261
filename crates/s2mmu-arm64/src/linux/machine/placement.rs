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
//! - An EL2 placement implements the same trait with the engine linked
//!   into the EL2 image: RAM faults are answered at EL2 on the faulting
//!   CPU, and only the aborts the engine leaves to the host (an IPA no
//!   memslot covers, a page a post-copy destination has not received)
//!   reach [`Placement::stage2_abort`]; the host drives the engine by
//!   commands the stub checks.
//!
//! The machine holds its placement as [`Host`]; code that answers exits
//! goes through this trait, not through the host placement's engine.

use crate::arena::ArenaMmOps;
use crate::machine::Exit;
use crate::vm::Arm64Vm;
use crate::Result;
use s2mmu::mmu::VcpuMmu;

/// The engine's placement, as a VM's vCPU threads use it.
pub(crate) trait Placement: Send + Sync {
    /// What a vCPU's host thread keeps of the engine between exits.
    type Vcpu;

    /// The engine's state for one more vCPU thread.
    ///
    /// # Errors
    /// The engine's refusal.
    fn new_vcpu(&self) -> Result<Self::Vcpu>;

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

/// The placement a Linux VM runs with.
pub(crate) type Host = Arm64Vm;

/// What a vCPU thread keeps of the engine under [`Host`].
pub(crate) type EngineVcpu = <Host as Placement>::Vcpu;

/// The host placement: the engine in this process, faults and TLBIs
/// through the mailboxes and the service CPU.
impl Placement for Arm64Vm {
    type Vcpu = VcpuMmu<ArenaMmOps>;

    fn new_vcpu(&self) -> Result<Self::Vcpu> {
        Ok(self.mmu().new_vcpu()?)
    }

    fn stage2_regs(&self) -> (u64, u64) {
        Arm64Vm::stage2_regs(self)
    }

    fn stage2_abort(
        &self,
        vcpu: &mut Self::Vcpu,
        e: &Exit,
    ) -> Result<s2mmu::Result<Vec<(u64, u64)>>> {
        self.fault(vcpu, e)
    }

    fn kick_all(&self, vcpus: &[usize]) -> Result<()> {
        self.sink().try_kick_all(vcpus)
    }
}
