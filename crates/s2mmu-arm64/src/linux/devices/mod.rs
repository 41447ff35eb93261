//! What a Linux guest's exits reach on the host: the MMIO bus and its
//! dispatch, the GICv3, PSCI over HVC, the timer and the console UART. A
//! device with state that a migration carries hands it out as plain
//! values and is built again from them (`gic_state`; the UART's is
//! vm-superio's `SerialState`).

pub mod bus;
pub(crate) mod console_echo;
pub mod console_input;
pub mod gic;
pub mod gic_state;
pub mod mmio;
pub mod psci;
pub(crate) mod timer;
pub mod uart;
