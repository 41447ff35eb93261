//! What the destination needs from its guest, whatever VM runs it: a
//! factory that builds the VM a HEADER describes, the guest's own STATE
//! (checked before any vCPU starts), and the resumed guest. The simulated
//! VM's implementation is `crate::sim::dest` (feature `sim`).

use crate::stream_error::MigrateError;
use crate::vm::{GuestRun, SessionVm};
use crate::wire::Header;
use std::sync::Arc;

/// Builds the destination's guest for one migration.
pub trait DestFactory: Sync {
    /// The guest it builds.
    type Guest: DestGuest;

    /// Builds the guest `header` describes (its shape, format code and
    /// page count; the header is within the destination's limits
    /// already). No vCPU runs yet.
    ///
    /// # Errors
    /// [`MigrateError::FormatMismatch`] when the stream's format is not
    /// the one this destination runs; [`MigrateError::Setup`] when the VM
    /// cannot be built.
    fn build(&self, header: &Header) -> Result<Self::Guest, MigrateError>;
}

/// The destination's guest: its VM (pages land straight in its RAM), its
/// STATE and its start.
pub trait DestGuest: Send + Sync {
    /// The VM as the session sees it.
    type Vm: SessionVm;
    /// The decoded, checked vCPU state.
    type State: Send + Sync;
    /// The guest once it runs.
    type Running: ResumedGuest;

    /// The VM.
    fn vm(&self) -> &Arc<Self::Vm>;

    /// Decodes the STATE record's body (at `at_byte` of the stream) and
    /// checks it against `header` before any vCPU starts.
    ///
    /// # Errors
    /// [`MigrateError::Malformed`] for a body that does not decode,
    /// [`MigrateError::BadState`] for one the header contradicts.
    fn decode_state(
        &self,
        body: &[u8],
        header: &Header,
        at_byte: u64,
    ) -> Result<Self::State, MigrateError>;

    /// Starts (resumes) the vCPUs from `state`.
    ///
    /// # Errors
    /// [`MigrateError::BadState`] when the guest cannot start from it.
    fn start(&self, state: &Self::State) -> Result<Self::Running, MigrateError>;
}

/// A resumed guest: its run controls, and what FINAL and the outcome
/// report of it.
pub trait ResumedGuest: GuestRun {
    /// The vCPU state FINAL carries back to the source (the guest is
    /// paused).
    fn final_state(&self) -> Vec<u8>;

    /// A count of each vCPU's own work so far, in the guest's unit (a
    /// guest that keeps none reports none: the default).
    fn progress(&self) -> Vec<u64> {
        Vec::new()
    }
}
