//! What a Linux guest's exits reach on the host: the MMIO bus, where every
//! MMIO device sits behind one trait ([`bus::MmioDevice`]: the GICv3's
//! frames and the console UART), a data abort's decoding, PSCI over HVC
//! behind the machine's power control, and the timer. A device with state
//! reads it out and is built again from it as plain values (`Gic::state`,
//! `Uart::state`, `VirtualTimer::save`); `gic_state` and `uart_state`
//! encode those as a migration's sections ([`DeviceState`]).

use s2mmu_migrate::state::StateError;

pub mod bus;
pub(crate) mod console_echo;
pub mod console_input;
pub mod gic;
pub mod gic_frames;
pub mod gic_snapshot;
mod gic_state;
pub mod mmio;
pub mod psci;
pub(crate) mod set;
pub mod timer;
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
