//! A Linux guest on the arm64 model, in folders by concern:
//!
//! - `devices/`: what the guest's MMIO and HVC exits reach on the host:
//!   the [`bus`] every MMIO device model sits on, a data abort's syndrome
//!   decoded in [`mmio`], the GICv3's distributor and redistributors
//!   ([`gic`], on the bus through [`gic_frames`], its state in
//!   [`gic_snapshot`]), PSCI 1.1 over HVC ([`psci`]), the virtual
//!   [`timer`] and a 16550 ([`uart`], rust-vmm `vm-superio`);
//! - `machine/`: the VM itself ([`migrate::LinuxVm`], made in one
//!   lifecycle in `machine/lifecycle/`: blank, loaded, started; [`vm`]'s
//!   report run, [`migrate`]'s pause, save and restore; the vCPU
//!   threads, what they share, the engine's placement, its RAM as one
//!   mapping in [`memory`], [`inject`]ed exceptions, post-copy's
//!   [`page_fetch`]); in `machine/load/`, what puts a guest in its RAM
//!   ([`boot`], the boot protocol's [`loader`], the device tree in
//!   [`fdt`], rust-vmm `vm-fdt`); in `machine/logging/`, [`dirty`]
//!   logging and the [`changes`] the host makes; the brakes of
//!   [`dirty_limit`]; in `machine/state/`, its state as plain values
//!   ([`vcpu_state`], [`vm_state`]);
//! - [`assets`]: the kernel and the initramfs ([`cpio`]), from Debian
//!   packages fetched with apt ([`debs`]), kept in a cache directory;
//! - `runs/`: `s2mmu linux`'s runs from plain settings ([`run`]), the two
//!   placements compared ([`compare`]), the reboot policy ([`reboot`]),
//!   the SGI rate ([`ipi`]) and QEMU's own boot of the same guest
//!   ([`baseline`]).
//!
//! Each module keeps its path under `linux::` whichever room holds it.
//!
//! The same VM behind the migration library's session is the
//! `s2mmu-arm64-migrate` crate's.

pub mod assets;
mod devices;
mod machine;
mod runs;

pub use assets::{cpio, debs};
pub use devices::{bus, console_input, gic, gic_frames, gic_snapshot, mmio, psci, timer, uart};
pub use machine::load::{boot, fdt, loader};
pub use machine::logging::{changes, dirty, el2_inject};
pub use machine::state::{vcpu_state, vm_state};
pub use machine::{dirty_limit, inject, memory, migrate, page_fetch, vm};
pub use runs::{baseline, compare, ipi, reboot, run};

use devices::{console_echo, set};
use machine::lifecycle::{self, config, spec, start};
use machine::{el2, placement, power, shared, vcpu, watch};
