//! The simulated source's work beside pre-copy (`SourceExtras::check`, the
//! lost-write check of every round, and `SourceExtras::snapshot_every`, incremental
//! snapshots from a dirty view of their own) as the session's
//! [`RoundHook`].

use super::lost_check::{CheckSummary, RunningLostCheck};
use super::snapshot_taker::{differing_pages, SnapshotLoop, Snapshotter};
use super::SimVm;
use crate::session::extras::{ExtrasOutcome, SnapshotSummary, SourceExtras};
use crate::session::guest::RoundHook;
use crate::session::snapshot::restore::restore;
use crate::stream_error::MigrateError;
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{KnownFormat, Vm};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The extras of one migration in progress.
pub struct ExtrasRun<F: KnownFormat> {
    check: Option<RunningLostCheck>,
    snaps: Option<SnapshotLoop<TreeMemslots, F>>,
    dir: Option<PathBuf>,
}

/// Starts them (logging is on, the guest running): hashes every page,
/// injects the lost marks, opens the snapshot view and takes the base.
///
/// # Errors
/// [`MigrateError::Setup`], [`MigrateError::Snapshot`].
pub fn begin<F: KnownFormat>(
    x: &SourceExtras,
    vm: &Arc<Vm<TreeMemslots, F>>,
) -> Result<ExtrasRun<F>, MigrateError> {
    let check = x.check.then(|| RunningLostCheck::new(vm)).transpose()?;
    inject_lost_marks(vm, x.inject_lost_marks)?;
    let snaps = match (&x.snapshot_dir, x.snapshot_every) {
        (Some(dir), Some(every)) => {
            let s = |e: crate::session::snapshot::format::SnapshotError| {
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
        dir: x.snapshot_dir.clone(),
    })
}

impl<F: KnownFormat> RoundHook<SimVm<F>> for ExtrasRun<F> {
    /// After a pre-copy harvest whose log is `pending`.
    ///
    /// # Errors
    /// [`MigrateError::Setup`] from the check.
    fn round(&mut self, vm: &SimVm<F>, pending: &[Vec<u64>]) -> Result<(), MigrateError> {
        match &mut self.check {
            Some(c) => c.round(vm.vm(), pending, false),
            None => Ok(()),
        }
    }

    /// After the final harvest, the vCPUs paused.
    ///
    /// # Errors
    /// [`MigrateError::LostWrites`] if the check found any.
    fn last_round(&mut self, vm: &SimVm<F>, pending: &[Vec<u64>]) -> Result<(), MigrateError> {
        let Some(c) = &mut self.check else {
            return Ok(());
        };
        c.round(vm.vm(), pending, true)?;
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
    fn finish(self, vm: &SimVm<F>) -> ExtrasOutcome {
        let vm = &**vm.vm();
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

/// The harness's lost-mark injection (the engine's `test-hooks`, turned
/// on by this crate's feature of the same name).
#[cfg(feature = "test-hooks")]
fn inject_lost_marks<F: KnownFormat>(vm: &Vm<TreeMemslots, F>, n: u64) -> Result<(), MigrateError> {
    vm.mmu().inject_lost_marks(n);
    Ok(())
}

/// Without the engine's test hooks nothing can lose a mark: asking for it
/// is refused by name rather than ignored.
#[cfg(not(feature = "test-hooks"))]
fn inject_lost_marks<F: KnownFormat>(
    _vm: &Vm<TreeMemslots, F>,
    n: u64,
) -> Result<(), MigrateError> {
    if n == 0 {
        return Ok(());
    }
    Err(MigrateError::Setup(format!(
        "inject_lost_marks = {n} needs feature `test-hooks` of s2mmu-migrate"
    )))
}
