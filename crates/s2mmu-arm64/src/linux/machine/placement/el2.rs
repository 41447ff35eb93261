//! The EL2 placement: the engine linked into the EL2 image, driven by
//! command blocks; only the aborts it leaves to the host reach a vCPU's
//! thread.

use super::EngineLog;
use super::{Answer, PlacedLog, PlacedVcpu, Placement};
use crate::linux::el2::{El2Vm, WeakEl2Vm};
use crate::machine::{Exit, Machine};
use crate::tlbi::HypSink;
use crate::Result;
use std::sync::Arc;

/// A vCPU of the EL2 placement: EL2 keeps its state; the host knows its id.
struct El2Vcpu<'a> {
    vm: &'a El2Vm,
    id: usize,
}

impl PlacedVcpu for El2Vcpu<'_> {
    fn stage2_abort(&mut self, e: &Exit) -> Result<s2mmu::Result<Answer>> {
        if self.vm.slot_added_since(self.id, e) {
            return Ok(Ok(Answer::Retry));
        }
        Ok(self.vm.stage2_abort(self.id, e)?.map(Answer::Mapped))
    }
}

impl Placement for El2Vm {
    fn machine(&self) -> &Arc<Machine> {
        El2Vm::machine(self)
    }

    fn sink(&self) -> &Arc<HypSink> {
        El2Vm::sink(self)
    }

    fn new_vcpu(&self, id: usize) -> Result<Box<dyn PlacedVcpu + '_>> {
        Ok(Box::new(El2Vcpu { vm: self, id }))
    }

    fn stage2_regs(&self) -> (u64, u64) {
        El2Vm::stage2_regs(self)
    }

    fn add_slot(&self, id: u16, gpa: u64, pa: u64, size: u64, page: u64) -> Result<()> {
        El2Vm::add_slot(self, id, gpa, pa, size, page)
    }

    fn delete_slot(&self, slot: u16, _gpa: u64, _pa: u64, last: Option<&mut [u64]>) -> Result<()> {
        let Some(words) = last else {
            return El2Vm::delete_slot(self, slot);
        };
        let mut got = vec![0u64; words.len()];
        self.delete_logged(slot, &mut got)?;
        for (w, g) in words.iter_mut().zip(got) {
            *w |= g;
        }
        Ok(())
    }

    fn enable_dirty_logging(&self, slot: u16) -> Result<()> {
        El2Vm::enable_dirty_logging(self, slot)
    }

    fn collapse(&self, slot: u16) -> Result<u64> {
        El2Vm::collapse(self, slot)
    }

    fn remap_page(&self, pa: u64, new_pa: u64) -> Result<()> {
        let old = El2Vm::remap_page(self, pa, new_pa)?;
        let ram = self.machine().ram();
        for off in (0..4096).step_by(8) {
            ram.write(old + off, crate::vm::POISON);
        }
        Ok(())
    }

    fn log(&self) -> &dyn PlacedLog {
        self
    }

    fn dirty_log(&self) -> EngineLog {
        EngineLog::new(Arc::new(self.clone()))
    }

    fn brakes(&self) -> Option<WeakEl2Vm> {
        Some(self.downgrade())
    }

    fn postcopy_at_engine(&self) -> bool {
        true
    }

    fn postcopy_armed(&self) -> bool {
        self.postcopy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    fn arm_postcopy(&self, slot: u16, ipa: u64, pa: u64, bytes: u64, logging: bool) -> Result<()> {
        self.set_postcopy(slot, ipa, pa, bytes, logging)
    }

    fn el2(&self) -> Option<&El2Vm> {
        Some(self)
    }
}
