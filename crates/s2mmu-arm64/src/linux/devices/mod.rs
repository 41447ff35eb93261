//! What a Linux guest's exits reach on the host: the MMIO bus, where every
//! MMIO device sits behind one trait ([`bus::MmioDevice`]: the GICv3's
//! frames and the console UART), a data abort's decoding, PSCI over HVC
//! behind the machine's power control, and the timer. A device with state
//! reads it out and is built again from it as plain values (`Gic::state`,
//! `Uart::state`, `VirtualTimer::save`); a migration encodes them in a
//! crate above this one.

pub mod bus;
pub(crate) mod console_echo;
pub mod console_input;
pub mod gic;
pub mod gic_frames;
pub mod gic_snapshot;
pub mod mmio;
pub mod psci;
pub(crate) mod set;
pub mod timer;
pub mod uart;
