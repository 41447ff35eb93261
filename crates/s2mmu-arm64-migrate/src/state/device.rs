//! A device's state as the bytes of one section of the encoding.

use s2mmu_migrate::state::StateError;

/// A device's state that saves itself as the bytes of one section and
/// builds itself again from them.
pub(crate) trait DeviceState: Sized {
    /// Appends the device's state.
    fn save(&self, out: &mut Vec<u8>);
    /// The device's state `bytes` hold, for section `tag`, for `vcpus`
    /// vCPUs.
    ///
    /// # Errors
    /// Truncated or left-over bytes, or a value the device cannot hold
    /// ([`StateError::BadSection`] naming `tag`).
    fn load(bytes: &[u8], vcpus: usize, tag: u32) -> Result<Self, StateError>;
}
