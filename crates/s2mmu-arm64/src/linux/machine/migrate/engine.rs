//! Where a migratable Linux VM's engine runs: a new QEMU machine with
//! the engine in this process ([`Engine::Host`]) or linked into its EL2
//! image ([`Engine::El2`]), its one RAM slot made, and the handle a
//! migration's session drives the dirty log through (`EngineLog`).

use super::engine_log::EngineLog;
use super::LinuxVm;
use crate::layout;
use crate::linux::el2::{El2Vm, SHARED_BYTES};
use crate::linux::memory::LinuxRam;
use crate::linux::placement::{Engine, Host};
use crate::linux::vm;
use crate::machine::{Machine, MachineConfig, RamPages};
use crate::tlbi::HypSink;
use crate::vm::{Arm64Vm, VmConfig};
use crate::{Arm64Error, Result};
use s2mmu::mmu::DirtyMode;
use std::sync::Arc;

/// The engine's dirty mode for a migration's log when the machine's
/// settings ask for `mode`: hardware dirty state ([`DirtyMode::HW`]) for
/// any hardware mode, else write protection ([`DirtyMode::WP`]); both with
/// manual protect, as the session GETs, then CLEARs what it will send.
fn migration_log(mode: Option<DirtyMode>) -> DirtyMode {
    match mode {
        Some(m) if m.hardware() => DirtyMode::HW,
        _ => DirtyMode::WP,
    }
}

impl LinuxVm {
    /// Starts a QEMU machine for `vcpus` vCPUs and `mem` bytes of guest
    /// RAM with the engine where `engine` says, logging in the mode
    /// [`migration_log`] picks for `log`, and makes the RAM slot (mapped with
    /// `granule`-byte pages where it can).
    ///
    /// # Errors
    /// QEMU, the EL2 image or EL2's set-up failing; the engine's refusal.
    pub(super) fn start_engine(
        vcpus: usize,
        mem: u64,
        ram_pages: RamPages,
        engine: Engine,
        granule: u64,
        log: Option<DirtyMode>,
    ) -> Result<(Arc<Machine>, Host)> {
        let log = migration_log(log);
        let mc = MachineConfig {
            cpus: vcpus + 1,
            data_bytes: mem,
            ram_pages,
        };
        let (machine, vm) = match engine {
            Engine::Host => {
                let machine = Arc::new(Machine::start(&mc)?);
                let mut vc = VmConfig::default();
                vc.policy.dirty = log;
                let avm = Arm64Vm::new_bare(machine.clone(), &vc)?;
                (machine, Host::Host(avm))
            }
            Engine::El2 => {
                let mc = MachineConfig {
                    data_bytes: mem + SHARED_BYTES,
                    ..mc
                };
                let machine = Arc::new(Machine::start_with(&mc, crate::image_el2()?)?);
                let v = El2Vm::new(machine.clone(), Some(log), vcpus, mem)?;
                (machine, Host::El2(v))
            }
        };
        vm.add_slot(vm::RAM_SLOT, vm::RAM_IPA, layout::DATA, mem, granule)?;
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
        let (machine, v) = LinuxVm::start_engine(
            self.vcpus,
            self.mem,
            self.ram_pages,
            self.engine,
            self.granule,
            self.log,
        )?;
        self.ram = LinuxRam::new(machine.ram().clone(), layout::DATA, self.mem, vm::RAM_IPA)?;
        self.written = Some(self.ram.fresh_hashes()?);
        self.machine = machine;
        self.idle = Some(v);
        self.ran = false;
        Ok(())
    }

    /// Where this VM's engine runs.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether the engine logs with hardware dirty state (no write faults:
    /// auto-converge then throttles by a share of time).
    pub fn hardware_dirty(&self) -> bool {
        migration_log(self.log).hardware()
    }

    /// The engine's placement, whether the vCPU threads hold it or not.
    fn placement(&self) -> &Host {
        match (&self.run, &self.idle) {
            (Some(r), _) => &r.sh.vm,
            (None, Some(v)) => v,
            (None, None) => unreachable!("the engine's VM is either idle or running"),
        }
    }

    /// The engine's dirty log of this machine (the same until a guest
    /// comes back to it and it starts a new QEMU, see `renew`).
    pub fn engine_log(&self) -> EngineLog {
        EngineLog::of(self.placement())
    }

    /// The engine's TLBI sink (its service CPU).
    pub fn engine_sink(&self) -> &Arc<HypSink> {
        self.placement().sink()
    }

    /// Whether the RAM slot is a post-copy slot at EL2 (always true with
    /// the host placement, whose fault path asks the hook itself).
    pub(crate) fn el2_postcopy_armed(&self) -> bool {
        match self.placement() {
            Host::Host(_) => true,
            Host::El2(v) => v
                .postcopy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some(),
        }
    }

    /// Makes the RAM slot a post-copy slot at EL2 (logging if `logging`):
    /// EL2 maps none of its pages until the host has it. The host
    /// placement's fault path asks the hook itself: nothing to do there.
    ///
    /// # Errors
    /// EL2's refusal.
    pub fn el2_postcopy(&self, logging: bool) -> Result<()> {
        match self.placement() {
            Host::Host(_) => Ok(()),
            Host::El2(v) => {
                if self.ran {
                    return Err(Arm64Error::Config(
                        "post-copy into a machine that has run guest code".into(),
                    ));
                }
                v.set_postcopy(vm::RAM_SLOT, vm::RAM_IPA, layout::DATA, self.mem, logging)
            }
        }
    }
}
