//! `s2mmu linux`'s runs and QEMU's own boot of the same guest.

pub mod baseline;
pub mod compare;
pub mod ipi;
pub mod reboot;
pub mod run;
