//! A Linux guest on the arm64 model, in folders by concern:
//!
//! - `devices/`: what the guest's MMIO and HVC exits reach on the host
//!   ([`bus`], [`mmio`], [`gic`] with its bus frames in [`gic_frames`] and its
//!   state in [`gic_snapshot`], [`psci`], [`timer`], [`uart`]);
//! - `machine/`: the VM itself ([`migrate::LinuxVm`], made in one
//!   lifecycle in `machine/lifecycle/`: blank, loaded, started; [`vm`]'s
//!   report run, [`migrate`]'s pause, save and restore; the vCPU
//!   threads, what they share, the engine's placement, its RAM in
//!   [`memory`], [`inject`]ed exceptions, post-copy's [`page_fetch`]); in
//!   `machine/load/`, what puts a guest in its RAM ([`boot`], [`loader`],
//!   [`fdt`]); in `machine/logging/`, [`dirty`] logging and the
//!   [`changes`] the host makes; the brakes of [`dirty_limit`]; in
//!   `machine/state/`, its state as plain values
//!   ([`vcpu_state`], [`vm_state`]);
//! - [`assets`]: the kernel, the initramfs ([`cpio`]) and the Debian
//!   packages ([`debs`]);
//! - `runs/`: `s2mmu linux`'s runs ([`run`]), its SGI rate ([`ipi`]) and QEMU's own boot of the
//!   same guest ([`baseline`]).
//!
//! Each module keeps its path under `linux::` whichever room holds it.
//!
//! - [`assets`]: the kernel `Image` and initramfs, fetched with apt and
//!   built in a cache directory ([`debs`] unpacks the packages, [`cpio`]
//!   writes the archive).
//! - [`fdt`]: the device tree (rust-vmm `vm-fdt`).
//! - [`loader`]: the arm64 boot protocol's placement; [`boot`] loads the
//!   asset files and the device tree in one call.
//! - [`bus`]: guest-physical MMIO ranges and their device models;
//!   [`mmio`] a data abort's syndrome decoded and dispatched to the vGIC
//!   or the bus.
//! - [`uart`]: a 16550 (rust-vmm `vm-superio`).
//! - [`baseline`]: the same kernel booted by QEMU itself, for comparison.
//! - [`gic`]: the GICv3 distributor and redistributors, list registers.
//! - [`psci`]: PSCI 1.1 over HVC.
//! - [`vm`]: the Linux VM's report run ([`vm::run`]), its exits answered
//!   in `vcpu`.
//! - [`migrate`]: the same VM paused, saved and restored (its own
//!   `pause_vcpus`, `guest_state`, ...); [`vcpu_state`] and [`vm_state`]
//!   are its state as plain values; [`memory`] its RAM as one
//!   mapping (bulk copies, the parallel digest); [`page_fetch`] the
//!   stage-2 fault on a page that has not arrived as its request.
//! - [`run`]: `s2mmu linux`'s runs from plain settings (the guest's
//!   configuration, the baseline, the verdict, the dirtier's rate per mode).
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
