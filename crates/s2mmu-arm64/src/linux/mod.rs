//! What a Linux guest needs from the host side, apart from the vCPUs and
//! the interrupt controller: its files (Debian's arm64 kernel, an
//! initramfs with busybox and the guest programs of `guest/`), its device
//! tree, the kernel's placement in guest RAM, the MMIO bus that stage-2
//! data aborts outside RAM are routed to, and the console UART.
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
//! - [`vm`]: the Linux VM ([`vm::run`]), its vCPU threads in `vcpu`.
//! - [`migrate`]: the same VM paused, saved and restored (its own
//!   `pause_vcpus`, `guest_state`, ...); [`vcpu_state`] and [`vm_state`]
//!   are its state in the migration encoding; [`memory`] its RAM as one
//!   mapping (bulk copies, the parallel digest); [`page_fetch`] the
//!   stage-2 fault on a page that has not arrived as its request.
//! - [`run`]: `s2mmu linux`'s runs from plain settings (the guest's
//!   configuration, the baseline, the verdict, the dirtier's rate per mode).
//! - [`session_source`] and [`session_dest`]: the same VM behind the
//!   migration library's session (`s2mmu_migrate::session`), source and
//!   destination, over any connection (TLS by default in the CLI);
//!   [`session_run`] a whole run of `s2mmu migrate --guest linux` with
//!   them: boot, migrate, check that the guest went on ([`run_error`]
//!   why it failed);
//!   [`session_postcopy`] what a post-copy destination reports in FINAL
//!   and the source's check of it.

pub mod assets;
pub mod baseline;
pub mod boot;
pub mod bus;
pub mod changes;
mod console_echo;
mod console_watch;
pub mod cpio;
pub mod debs;
pub mod dirty;
pub mod dirty_limit;
pub mod fdt;
pub mod gic;
pub mod inject;
pub mod loader;
pub mod memory;
mod mig_mem;
mod mig_vcpu;
pub mod migrate;
pub mod mmio;
pub mod page_fetch;
pub mod psci;
pub mod run;
pub mod run_error;
pub mod session_dest;
pub mod session_postcopy;
pub mod session_run;
pub mod session_source;
pub mod uart;
mod vcpu;
pub mod vcpu_state;
pub mod vm;
pub mod vm_state;
mod watch;
