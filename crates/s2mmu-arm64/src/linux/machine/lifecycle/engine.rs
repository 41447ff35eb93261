//! Where a Linux VM's engine runs: a new QEMU machine with the engine in
//! this process ([`Engine::Host`]) or linked into its EL2 image
//! ([`Engine::El2`]), its one RAM slot made, as [`EngineSpec`] says;
//! and what the rest of the VM asks of the engine wherever it runs.

use super::spec::EngineSpec;
use super::LinuxVm;
use crate::layout;
use crate::linux::el2::{El2Vm, SHARED_BYTES, TRACE_BYTES};
use crate::linux::memory::LinuxRam;
use crate::linux::placement::{Engine, Placement};
use crate::linux::shared::{RAM_IPA, RAM_SLOT};
use crate::machine::{Machine, MachineConfig};
use crate::tlbi::HypSink;
use crate::vm::{Arm64Vm, VmConfig};
use crate::{Arm64Error, Result};
use std::sync::Arc;

impl LinuxVm {
    /// Starts a QEMU machine for `vcpus` vCPUs and `mem` bytes of guest
    /// RAM (and the host memory `spec`'s change needs past it) with the
    /// engine as `spec` says, and makes the RAM slot.
    ///
    /// # Errors
    /// QEMU, the EL2 image or EL2's set-up failing; the engine's refusal.
    pub(super) fn start_engine(
        vcpus: usize,
        mem: u64,
        spec: &EngineSpec,
    ) -> Result<(Arc<Machine>, Box<dyn Placement>)> {
        let ram_bytes = mem + spec.change.spare_bytes();
        let mc = MachineConfig {
            cpus: vcpus + 1,
            data_bytes: ram_bytes,
            ram_pages: spec.ram_pages,
        };
        let (machine, vm) = match spec.engine {
            Engine::Host => {
                let machine = Arc::new(Machine::start(&mc)?);
                let vc = VmConfig {
                    policy: spec.policy,
                    ..VmConfig::default()
                };
                let avm = Arm64Vm::new_bare(machine.clone(), &vc)?;
                (machine, Box::new(avm) as Box<dyn Placement>)
            }
            Engine::El2 => {
                let mc = MachineConfig {
                    data_bytes: ram_bytes + SHARED_BYTES + TRACE_BYTES,
                    ..mc
                };
                let machine = Arc::new(Machine::start_with(&mc, crate::image_el2()?)?);
                let v = El2Vm::new(machine.clone(), spec.el2_mode, vcpus, ram_bytes)?;
                (machine, Box::new(v) as Box<dyn Placement>)
            }
        };
        vm.add_slot(RAM_SLOT, RAM_IPA, layout::DATA, mem, spec.granule)?;
        Ok((machine, vm))
    }

    /// Replaces this VM's QEMU with a new one of the same size, before a
    /// guest comes back to it. QEMU caches the code it has translated by
    /// guest-physical page and notices changes only through its own
    /// stores: pages the host writes into the shared RAM behind its back
    /// (a migration's copies) would run stale translations of the old
    /// guest code. A new QEMU has none.
    ///
    /// # Errors
    /// As [`LinuxVm::blank`].
    pub(in crate::linux) fn renew(&mut self) -> Result<()> {
        self.take_down()?;
        self.idle = None;
        let (machine, v) = LinuxVm::start_engine(self.vcpus, self.mem, &self.spec)?;
        self.ram = LinuxRam::new(machine.ram().clone(), layout::DATA, self.mem, RAM_IPA)?;
        self.written = Some(self.ram.fresh_hashes()?);
        self.machine = machine;
        // The anchor was the old machine's count.
        self.counter_anchor = None;
        self.idle = Some(v);
        self.ran = false;
        Ok(())
    }

    /// Where this VM's engine runs.
    pub fn engine(&self) -> Engine {
        self.spec.engine
    }

    /// Whether the engine logs with hardware dirty state (no write faults:
    /// auto-converge then throttles by a share of time).
    pub fn hardware_dirty(&self) -> bool {
        self.spec.hardware_dirty()
    }

    /// The engine's placement, whether the vCPU threads hold it or not.
    pub(in crate::linux) fn placement(&self) -> &dyn Placement {
        match (&self.run, &self.idle) {
            (Some(r), _) => &*r.sh.vm,
            (None, Some(v)) => &**v,
            (None, None) => unreachable!("the engine's VM is either idle or running"),
        }
    }

    /// The engine's TLBI sink (its service CPU).
    pub fn engine_sink(&self) -> &Arc<HypSink> {
        self.placement().sink()
    }

    /// Whether the RAM slot is a post-copy slot at EL2 (always true with
    /// the host placement, whose fault path asks the hook itself).
    pub(crate) fn el2_postcopy_armed(&self) -> bool {
        self.placement().postcopy_armed()
    }

    /// Makes the RAM slot a post-copy slot at EL2 (logging if `logging`):
    /// EL2 maps none of its pages until the host has it. The host
    /// placement's fault path asks the hook itself: nothing to do there.
    ///
    /// # Errors
    /// EL2's refusal.
    pub fn el2_postcopy(&self, logging: bool) -> Result<()> {
        let p = self.placement();
        if self.ran && p.postcopy_at_engine() {
            return Err(Arm64Error::Config(
                "post-copy into a machine that has run guest code".into(),
            ));
        }
        p.arm_postcopy(RAM_SLOT, RAM_IPA, layout::DATA, self.mem, logging)
    }
}
