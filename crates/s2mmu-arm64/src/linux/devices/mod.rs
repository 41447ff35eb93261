//! What a Linux guest's exits reach on the host: the MMIO bus and its
//! dispatch, the GICv3, PSCI over HVC, the timer and the console UART. A device with
//! state that a migration carries saves and loads it itself
//! ([`DeviceState`]: `gic_state`, `uart_state`).

use s2mmu_migrate::state::StateError;

pub mod bus;
pub(crate) mod console_echo;
pub mod console_input;
pub mod gic;
mod gic_state;
pub mod mmio;
pub mod psci;
pub(crate) mod timer;
pub mod uart;
mod uart_state;

/// A device that saves its own state as the bytes of one section and
/// builds itself again from them.
pub(crate) trait DeviceState: Sized {
    /// What the device is built for besides its bytes (the GIC: its vCPUs).
    type Shape;
    /// Appends the device's state.
    fn save(&self, out: &mut Vec<u8>);
    /// The device with the state `bytes` hold, for section `tag`.
    ///
    /// # Errors
    /// Truncated or left-over bytes, or a value the device cannot hold
    /// ([`StateError::BadSection`] naming `tag`).
    fn load(bytes: &[u8], shape: Self::Shape, tag: u32) -> Result<Self, StateError>;
}
