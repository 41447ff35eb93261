//! The Linux VM: `lifecycle/` makes it (blank, loaded, started; its vCPU
//! threads), `vm` runs it for a report, `migrate/` pauses, saves and
//! restores it; its RAM, dirty logging and the stage-2 changes the host
//! makes under it; `load/` puts a guest in its RAM;
//! `logging/` holds dirty logging and the host's changes under a running
//! guest, `state/` the VM's state in the migration encoding; `placement`
//! is the seam between the machine and where the engine runs.

pub mod dirty_limit;
pub(crate) mod el2;
pub mod inject;
pub(crate) mod lifecycle;
pub mod load;
pub mod logging;
pub mod memory;
pub mod migrate;
pub mod page_fetch;
pub(crate) mod placement;
pub(crate) mod power;
pub(crate) mod shared;
pub mod state;
pub(crate) mod vcpu;
pub mod vm;
pub(crate) mod watch;
