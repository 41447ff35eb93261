//! What the source runs beside the migration, each optional:
//! `check`, the lost-write check of every round, and
//! `snapshot_every`, incremental snapshots of the running guest taken
//! from a dirty view of their own while the migration
//! harvests through the slot's own log, one consumer beside the view.
//!
//! This module holds their settings and findings; a guest runs them as its
//! [`super::guest::RoundHook`] (the simulated guest's is
//! `crate::sim::extras`): started once logging is on, called after each
//! pre-copy harvest and after the final one (vCPUs paused; a lost write
//! fails the migration there, before the destination resumes), and
//! finished after the resume: the last snapshot of the source's memory,
//! frozen at the stop point, and the chain restored and compared with it.

use super::policy::Harvest;
use crate::stream_error::MigrateError;
use std::path::PathBuf;
use std::time::Duration;

/// The source's options beyond the migration itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceExtras {
    /// The lost-write check of every round.
    pub check: bool,
    /// Test only: dirty marks the fault path drops once logging is on (the
    /// check must catch them).
    pub inject_lost_marks: u64,
    /// A snapshot every this long into `snapshot_dir`.
    pub snapshot_every: Option<Duration>,
    /// Where the snapshots go (created; must hold none).
    pub snapshot_dir: Option<PathBuf>,
}

/// What they found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExtrasOutcome {
    /// The lost-write check's findings (`check`).
    pub check: Option<CheckSummary>,
    /// The snapshots, or why they failed (`snapshot_every`).
    pub snapshots: Option<Result<SnapshotSummary, String>>,
}

/// The snapshots taken during a migration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotSummary {
    /// Files written, the base included.
    pub taken: u64,
    /// Page records, all files together.
    pub pages: u64,
    /// Bytes, all files together.
    pub bytes: u64,
    /// Restoring the chain.
    pub restore_time: Duration,
    /// Pages of the restored memory that differ from the source's at the
    /// stop point (0 when the snapshots are right).
    pub differing_pages: u64,
}

impl SourceExtras {
    /// Checks the options against the harvest mode, before anything runs.
    ///
    /// # Errors
    /// [`MigrateError::Setup`] naming the option.
    pub fn validate(&self, harvest: Harvest) -> Result<(), MigrateError> {
        let bitmap = harvest == Harvest::Bitmap;
        if (self.check || self.snapshot_every.is_some()) && !bitmap {
            return Err(MigrateError::Setup(
                "check and snapshot_every need the bitmap harvest (Harvest::Bitmap)".into(),
            ));
        }
        if self.snapshot_every.is_some() != self.snapshot_dir.is_some() {
            return Err(MigrateError::Setup(
                "snapshot_every and snapshot_dir go together".into(),
            ));
        }
        if let Some(e) = self.snapshot_every {
            if e < Duration::from_millis(1) || e > Duration::from_secs(3600) {
                return Err(MigrateError::Setup(format!(
                    "snapshot_every {e:?}: must be 1ms..=1h"
                )));
            }
        }
        Ok(())
    }
}

/// What the check found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckSummary {
    /// Rounds checked.
    pub rounds: u32,
    /// Page changes seen (a page counted once per round it changed in).
    pub changed: u64,
    /// Changed pages no log reported (each page once).
    pub lost: u64,
    /// The guest address of the first lost page.
    pub first_lost_gpa: Option<u64>,
}
