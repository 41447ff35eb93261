//! What a Linux guest's exits reach on the host: the MMIO bus and its
//! dispatch, the GICv3, PSCI over HVC and the console UART.

pub mod bus;
pub(crate) mod console_echo;
pub mod gic;
pub mod mmio;
pub mod psci;
pub mod uart;
