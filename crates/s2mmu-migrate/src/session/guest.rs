//! What the session needs of the source's guest beyond its memory and
//! dirty log ([`SessionVm`]) and its vCPUs' stop and go ([`GuestRun`]):
//! how the stream's header describes it, its state for the STATE record,
//! and the optional work beside a run (checks, snapshots, post-copy).

use super::extras::ExtrasOutcome;
use super::postcopy::Final;
use crate::stream_error::MigrateError;
use crate::vm::{GuestCounters, GuestRun, SessionVm};
use s2mmu::format::FormatId;
use std::sync::Arc;

/// What the stream's header tells the destination about the guest, so
/// that it can check its limits and build the same guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestShape {
    /// Bytes of guest memory.
    pub mem_size: u64,
    /// Memslots.
    pub slots: u32,
    /// vCPUs.
    pub vcpus: u32,
    /// How its memory is backed (a name the destination knows).
    pub backing: String,
    /// The stage-2 format of its tables.
    pub format: FormatId,
}

/// Work that runs beside pre-copy and sees every harvest (the lost-write
/// check, snapshots).
pub trait RoundHook<V: SessionVm> {
    /// After a pre-copy harvest whose log is `pending` (one bitmap per
    /// slot).
    ///
    /// # Errors
    /// Its own: the migration stops with it.
    fn round(&mut self, vm: &V, pending: &[Vec<u64>]) -> Result<(), MigrateError>;

    /// After the final harvest, the vCPUs paused (an error here fails the
    /// migration before the destination resumes).
    ///
    /// # Errors
    /// Its own.
    fn last_round(&mut self, vm: &V, pending: &[Vec<u64>]) -> Result<(), MigrateError>;

    /// After the resume, on the frozen source memory: what it found.
    fn finish(self, vm: &V) -> ExtrasOutcome;
}

/// No work beside the migration.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHook;

impl<V: SessionVm> RoundHook<V> for NoHook {
    fn round(&mut self, _: &V, _: &[Vec<u64>]) -> Result<(), MigrateError> {
        Ok(())
    }

    fn last_round(&mut self, _: &V, _: &[Vec<u64>]) -> Result<(), MigrateError> {
        Ok(())
    }

    fn finish(self, _: &V) -> ExtrasOutcome {
        ExtrasOutcome::default()
    }
}

/// The source's guest as the session drives it.
pub trait SourceGuest: GuestRun {
    /// Its memory and dirty log.
    type Vm: SessionVm;

    /// Its work beside pre-copy.
    type Hook: RoundHook<Self::Vm>;

    /// Its memory and dirty log.
    fn vm(&self) -> &Arc<Self::Vm>;

    /// What the header says about it.
    fn shape(&self) -> GuestShape;

    /// A reader of its counters that a sampling thread can own.
    fn counter_source(&self) -> Arc<dyn Fn() -> GuestCounters + Send + Sync>;

    /// The STATE record's body (the vCPUs are paused): everything the
    /// destination needs to run it on. `pace` is the dirty limit in force.
    ///
    /// # Errors
    /// The guest's (a vCPU whose state cannot be read).
    fn state(&self, pace: u64) -> Result<Vec<u8>, MigrateError>;

    /// Starts the work beside pre-copy (logging is on, the guest runs).
    ///
    /// # Errors
    /// Its own.
    fn begin_hook(&self) -> Result<Self::Hook, MigrateError>;

    /// Whether [`SourceGuest::verify_final`] can check a post-copy
    /// destination (post-copy is refused before anything starts
    /// otherwise).
    fn supports_postcopy(&self) -> bool {
        false
    }

    /// Post-copy: checks FINAL, the destination's digests after its run,
    /// against this (frozen) memory plus the writes its guest made from
    /// `state` (the STATE body sent) to FINAL's vCPU states. Returns the
    /// digests that agreed.
    ///
    /// # Errors
    /// [`MigrateError::MemoryMismatch`]; [`MigrateError::Setup`] when the
    /// guest cannot check (the default).
    fn verify_final(&self, _state: &[u8], _fin: &Final) -> Result<Vec<(u16, u64)>, MigrateError> {
        Err(MigrateError::Setup(
            "post-copy: this guest cannot check the destination's memory".into(),
        ))
    }
}
