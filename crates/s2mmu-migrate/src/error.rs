//! The library's error.

use crate::state::StateError;
use crate::vm::VmError;
use std::fmt;

/// Why a migration, snapshot or restore failed.
#[derive(Debug)]
pub enum MigrateError {
    /// The source VM failed (`what` says at which step).
    Source {
        /// The step.
        step: &'static str,
        /// The VM's error.
        err: VmError,
    },
    /// The destination VM failed, or refused the state.
    Destination {
        /// The step.
        step: &'static str,
        /// The VM's error.
        err: VmError,
    },
    /// Source and destination differ in size.
    SizeMismatch {
        /// Source pages.
        source: u64,
        /// Destination pages.
        destination: u64,
    },
    /// The memories differ at the switch.
    DigestMismatch {
        /// The source's digest.
        source: u64,
        /// The destination's digest.
        destination: u64,
    },
    /// A bad policy value.
    Policy(String),
    /// A snapshot file that is damaged, foreign or too large.
    State(StateError),
    /// A file could not be read or written.
    Io(String),
}

impl fmt::Display for MigrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigrateError::Source { step, err } => write!(f, "source VM, {step}: {err}"),
            MigrateError::Destination { step, err } => {
                write!(f, "destination VM, {step}: {err}")
            }
            MigrateError::SizeMismatch {
                source,
                destination,
            } => write!(
                f,
                "source has {source} pages, destination {destination}: they must be equal"
            ),
            MigrateError::DigestMismatch {
                source,
                destination,
            } => write!(
                f,
                "memories differ at the switch: source digest {source:#018x}, \
                 destination {destination:#018x}"
            ),
            MigrateError::Policy(s) => write!(f, "policy: {s}"),
            MigrateError::State(e) => write!(f, "{e}"),
            MigrateError::Io(s) => write!(f, "{s}"),
        }
    }
}

impl std::error::Error for MigrateError {}

impl From<StateError> for MigrateError {
    fn from(e: StateError) -> MigrateError {
        MigrateError::State(e)
    }
}
