//! What a Linux guest's exits reach on the host. Every device (the GICv3,
//! the console UART, the virtual timer and PSCI) sits behind one trait,
//! `device::Device`: it claims the exits it takes (MMIO ranges, whose
//! register files are [`bus::MmioDevice`]s on the [`bus::MmioBus`];
//! trapped system registers; SMCCC calls over HVC or SMC; physical
//! interrupts), and the device set (`set.rs`) dispatches each exit to the
//! device that claims it. Each device reads out its own state as plain
//! values (`Device::save`) and is built again from it by its constructor
//! (`Gic::from_state`, `Uart::from_state`, `VirtualTimer::restore`); a
//! migration encodes them in a crate above this one. A data abort's
//! decoding is [`mmio`]'s.

pub mod bus;
pub(crate) mod console_echo;
pub mod console_input;
pub(crate) mod device;
pub mod gic;
pub mod gic_frames;
pub mod gic_snapshot;
pub mod mmio;
mod no_address;
pub mod psci;
pub(crate) mod set;
pub mod timer;
pub mod uart;
