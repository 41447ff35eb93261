//! The host placement: the engine in this process, every stage-2 abort
//! answered by the faulting vCPU's host thread.

use super::EngineLog;
use super::{Answer, PlacedLog, PlacedVcpu, Placement};
use crate::arena::ArenaMmOps;
use crate::linux::el2::{El2Vm, WeakEl2Vm};
use crate::machine::{Exit, Machine};
use crate::tlbi::HypSink;
use crate::vm::Arm64Vm;
use crate::{Arm64Error, Result};
use s2mmu::memslot::{SlotFlags, UserMemoryRegion};
use s2mmu::mmu::VcpuMmu;
use s2mmu::{Gpa, Hva};
use std::sync::Arc;

/// A vCPU of the host placement: the engine's per-vCPU state.
struct HostVcpu<'a> {
    vm: &'a Arm64Vm,
    mmu: VcpuMmu<ArenaMmOps>,
}

impl PlacedVcpu for HostVcpu<'_> {
    fn stage2_abort(&mut self, e: &Exit) -> Result<s2mmu::Result<Answer>> {
        Ok(self.vm.fault(&mut self.mmu, e)?.map(Answer::Mapped))
    }
}

impl Placement for Arm64Vm {
    fn machine(&self) -> &Arc<Machine> {
        Arm64Vm::machine(self)
    }

    fn sink(&self) -> &Arc<HypSink> {
        Arm64Vm::sink(self)
    }

    fn new_vcpu(&self, _id: usize) -> Result<Box<dyn PlacedVcpu + '_>> {
        let mmu = self.mmu().new_vcpu()?;
        Ok(Box::new(HostVcpu { vm: self, mmu }))
    }

    fn stage2_regs(&self) -> (u64, u64) {
        Arm64Vm::stage2_regs(self)
    }

    fn add_slot(&self, id: u16, gpa: u64, pa: u64, size: u64, page: u64) -> Result<()> {
        Arm64Vm::add_slot(self, id, gpa, pa, size, page)
    }

    fn delete_slot(&self, slot: u16, gpa: u64, pa: u64, _last: Option<&mut [u64]>) -> Result<()> {
        let hva = self
            .machine()
            .ram()
            .hva(pa)
            .ok_or_else(|| Arm64Error::Config(format!("{pa:#x} is not a guest data page")))?;
        let gone = UserMemoryRegion::new(slot, SlotFlags::NONE, Gpa::new(gpa), 0, Hva::new(hva));
        self.mmu().set_memory_region(&gone, 4096)?;
        Ok(())
    }

    fn enable_dirty_logging(&self, slot: u16) -> Result<()> {
        Ok(self.mmu().enable_dirty_logging(slot)?)
    }

    fn collapse(&self, slot: u16) -> Result<u64> {
        let before = self.mmu().vm_stats().collapsed;
        self.mmu().disable_dirty_logging(slot)?;
        Ok(self.mmu().vm_stats().collapsed - before)
    }

    fn remap_page(&self, pa: u64, new_pa: u64) -> Result<()> {
        let hva = self
            .machine()
            .ram()
            .hva(pa)
            .ok_or_else(|| Arm64Error::Config(format!("{pa:#x} is not a guest data page")))?;
        self.remap_host_page(hva, new_pa)
    }

    fn log(&self) -> &dyn PlacedLog {
        &**self.mmu()
    }

    fn dirty_log(&self) -> EngineLog {
        EngineLog::new(self.mmu().clone())
    }

    fn brakes(&self) -> Option<WeakEl2Vm> {
        None
    }

    fn postcopy_at_engine(&self) -> bool {
        false
    }

    fn postcopy_armed(&self) -> bool {
        true
    }

    fn arm_postcopy(&self, _: u16, _: u64, _: u64, _: u64, _: bool) -> Result<()> {
        Ok(())
    }

    fn el2(&self) -> Option<&El2Vm> {
        None
    }
}
