//! How a Linux VM's engine is made ([`EngineSpec`]): where it runs, its
//! policy and log mode, the pages its RAM is mapped with, the host
//! change it serves.

use crate::linux::changes::HostChange;
use crate::linux::dirty::HarvestConfig;
use crate::linux::placement::Engine;
use crate::machine::RamPages;
use crate::vm::VmConfig;
use s2mmu::mmu::{DirtyMode, MmuPolicy};

/// How a Linux VM's engine is made, the same for every QEMU the VM
/// starts (`LinuxVm::renew`).
#[derive(Clone, Copy, Debug)]
pub(in crate::linux) struct EngineSpec {
    /// Where the engine runs.
    pub(in crate::linux) engine: Engine,
    /// Which host pages back the machine's RAM.
    pub(in crate::linux) ram_pages: RamPages,
    /// The size of the pages guest RAM is mapped with where it can.
    pub(in crate::linux) granule: u64,
    /// The host placement's policy.
    pub(in crate::linux) policy: MmuPolicy,
    /// The log mode EL2's engine is made with (the EL2 placement).
    pub(in crate::linux) el2_mode: Option<DirtyMode>,
    /// What the host changes under the guest: a framebuffer slot past
    /// guest RAM, and the host memory it needs.
    pub(in crate::linux) change: HostChange,
}

impl EngineSpec {
    /// A VM whose log a migration's session drives: the host placement's
    /// default policy, EL2's log in manual protect (as that policy: the
    /// session GETs, then CLEARs what it will send), no host change; RAM
    /// mapped with `granule`-byte pages.
    pub(in crate::linux) fn migratable(engine: Engine, ram_pages: RamPages, granule: u64) -> Self {
        EngineSpec {
            engine,
            ram_pages,
            granule,
            policy: VmConfig::default().policy,
            el2_mode: Some(DirtyMode::WP),
            change: HostChange::None,
        }
    }

    /// A VM whose log the harvester of `dirty` drives (`s2mmu linux`'s
    /// run), its RAM in 2 MiB blocks where it can.
    pub(in crate::linux) fn harvested(
        engine: Engine,
        ram_pages: RamPages,
        dirty: &HarvestConfig,
    ) -> Self {
        EngineSpec {
            engine,
            ram_pages,
            granule: 2 << 20,
            policy: dirty.policy(),
            el2_mode: dirty.mode,
            change: dirty.change,
        }
    }
}
