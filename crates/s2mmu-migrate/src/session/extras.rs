//! What the source runs beside the migration, each optional:
//! `--check`, the lost-write check of every round ([`super::checks`]), and
//! `--snapshot-every`, incremental snapshots of the running guest taken
//! from a dirty view of their own ([`crate::snapshot`]) while the migration
//! harvests through the slot's own log, one consumer beside the view.
//!
//! The source calls [`SourceExtras::begin`] once logging is on,
//! [`ExtrasRun::round`] after each pre-copy harvest,
//! [`ExtrasRun::last_round`] after the final harvest (vCPUs paused; a lost
//! write fails the migration there, before the destination resumes), and
//! [`ExtrasRun::finish`] after the resume: the last snapshot of the
//! source's memory, frozen at the stop point, and the chain restored and
//! compared with it.

use super::checks::{CheckSummary, RunningLostCheck};
use super::error::MigrateError;
use super::source::Harvest;
use crate::report::{verdict, Report};
use crate::snapshot::restore::{differing_pages, restore};
use crate::snapshot::taker::{SnapshotLoop, Snapshotter};
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{Vm, VmFormat};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// The lost-write check's findings (`--check`).
    pub check: Option<CheckSummary>,
    /// The snapshots, or why they failed (`--snapshot-every`).
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

/// The extras of one migration in progress.
pub struct ExtrasRun<F: VmFormat> {
    check: Option<RunningLostCheck>,
    snaps: Option<SnapshotLoop<TreeMemslots, F>>,
    dir: Option<PathBuf>,
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
                "--check and --snapshot-every need --harvest bitmap".into(),
            ));
        }
        if self.snapshot_every.is_some() != self.snapshot_dir.is_some() {
            return Err(MigrateError::Setup(
                "--snapshot-every and --snapshot-dir go together".into(),
            ));
        }
        if let Some(e) = self.snapshot_every {
            if e < Duration::from_millis(1) || e > Duration::from_secs(3600) {
                return Err(MigrateError::Setup(format!(
                    "--snapshot-every {e:?}: must be 1ms..=1h"
                )));
            }
        }
        Ok(())
    }

    /// Starts them (logging is on, the guest running): hashes every page,
    /// injects the lost marks, opens the snapshot view and takes the base.
    ///
    /// # Errors
    /// [`MigrateError::Setup`], [`MigrateError::Snapshot`].
    pub fn begin<F: VmFormat>(
        &self,
        vm: &Arc<Vm<TreeMemslots, F>>,
    ) -> Result<ExtrasRun<F>, MigrateError> {
        let check = self.check.then(|| RunningLostCheck::new(vm)).transpose()?;
        vm.mmu().inject_lost_marks(self.inject_lost_marks);
        let snaps = match (&self.snapshot_dir, self.snapshot_every) {
            (Some(dir), Some(every)) => {
                let s = |e: crate::snapshot::format::SnapshotError| {
                    MigrateError::Snapshot(e.to_string())
                };
                let taker = Snapshotter::open(vm.clone(), dir).map_err(s)?;
                Some(SnapshotLoop::start(taker, every).map_err(s)?)
            }
            _ => None,
        };
        Ok(ExtrasRun {
            check,
            snaps,
            dir: self.snapshot_dir.clone(),
        })
    }
}

impl ExtrasOutcome {
    /// Adds its rows and lines to a migration's report; snapshots that
    /// failed or restore to other memory fail the run.
    pub fn add_to(&self, r: &mut Report, text: &mut String) {
        if let Some(c) = &self.check {
            r.result(
                "lost-write check",
                "migrate",
                json!({ "rounds": c.rounds, "pages_changed": c.changed, "pages_lost": c.lost }),
            );
            text.push_str(&format!(
                "Lost-write check: {} rounds, {} page changes, {} not in any log [{}]\n",
                c.rounds,
                c.changed,
                c.lost,
                verdict(c.lost == 0)
            ));
        }
        match &self.snapshots {
            Some(Ok(s)) => {
                r.result(
                    "snapshots",
                    "migrate",
                    json!({ "snapshots": s.taken, "pages": s.pages, "bytes": s.bytes,
                            "restore_ns": s.restore_time.as_nanos() as u64,
                            "pages_differing": s.differing_pages }),
                );
                text.push_str(&format!(
                    "Snapshots beside the migration (a dirty view of their own): {} files, {} pages, {:.1} MiB; \
                     the chain restored in {:.1} ms, {} pages differ from the source at the stop point [{}]\n",
                    s.taken,
                    s.pages,
                    s.bytes as f64 / (1u64 << 20) as f64,
                    s.restore_time.as_secs_f64() * 1e3,
                    s.differing_pages,
                    verdict(s.differing_pages == 0)
                ));
                if s.differing_pages > 0 {
                    r.fail(format!(
                        "the snapshots restore to memory that differs from the source's in {} pages",
                        s.differing_pages
                    ));
                }
            }
            Some(Err(e)) => {
                text.push_str(&format!("Snapshots: FAILED: {e}\n"));
                r.fail(format!("snapshots: {e}"));
            }
            None => {}
        }
    }
}

impl<F: VmFormat> ExtrasRun<F> {
    /// After a pre-copy harvest whose log is `pending`.
    ///
    /// # Errors
    /// [`MigrateError::Setup`] from the check.
    pub fn round(
        &mut self,
        vm: &Vm<TreeMemslots, F>,
        pending: &[Vec<u64>],
    ) -> Result<(), MigrateError> {
        match &mut self.check {
            Some(c) => c.round(vm, pending, false),
            None => Ok(()),
        }
    }

    /// After the final harvest, the vCPUs paused.
    ///
    /// # Errors
    /// [`MigrateError::LostWrites`] if the check found any.
    pub fn last_round(
        &mut self,
        vm: &Vm<TreeMemslots, F>,
        pending: &[Vec<u64>],
    ) -> Result<(), MigrateError> {
        let Some(c) = &mut self.check else {
            return Ok(());
        };
        c.round(vm, pending, true)?;
        match c.found {
            CheckSummary {
                lost: pages @ 1..,
                first_lost_gpa,
                ..
            } => Err(MigrateError::LostWrites {
                pages,
                first_gpa: first_lost_gpa.unwrap_or(0),
            }),
            _ => Ok(()),
        }
    }

    /// After the resume: the last snapshot of the frozen source memory,
    /// the chain restored and compared with it.
    pub fn finish(self, vm: &Vm<TreeMemslots, F>) -> ExtrasOutcome {
        let snapshots = self.snaps.map(|l| {
            let mut taker = l.finish().map_err(|e| e.to_string())?;
            taker.take().map_err(|e| e.to_string())?;
            let (taken, pages, bytes) = taker
                .taken
                .iter()
                .fold((0, 0, 0), |a, t| (a.0 + 1, a.1 + t.pages, a.2 + t.bytes));
            drop(taker);
            let dir = self.dir.as_deref().expect("snapshots have a directory");
            let t = Instant::now();
            let total: u64 = vm.slots().iter().map(|s| s.size).sum();
            let r = restore(dir, total).map_err(|e| e.to_string())?;
            Ok(SnapshotSummary {
                taken,
                pages,
                bytes,
                restore_time: t.elapsed(),
                differing_pages: differing_pages(&r, vm).0,
            })
        });
        ExtrasOutcome {
            check: self.check.map(|c| c.found),
            snapshots,
        }
    }
}
