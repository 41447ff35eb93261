//! `s2mmu snapshot`'s run on the simulated guest: the guest writes its
//! regions at a paced rate while the base and then an incremental
//! snapshot every `every` are taken from a dirty view of their own; after
//! `duration` the guest pauses, the last snapshot is taken, and the chain
//! is restored and compared with the guest's memory page for page.

use super::snapshot_taker::{differing_pages, SnapshotLoop, Snapshotter, TakeStat};
use crate::session::progress::Progress;
use crate::session::snapshot::format::{SnapshotError, PAGE};
use crate::session::snapshot::restore::restore;
use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::MmuPolicy;
use s2mmu_vm::{Backing, Pattern, Vm, VmConfig, Workload, WorkloadConfig};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One run's settings (the caller has checked their bounds).
#[derive(Clone, Debug)]
pub struct SnapshotRunConfig {
    /// Bytes of guest memory.
    pub mem: u64,
    /// vCPUs running the workload.
    pub vcpus: usize,
    /// Bytes per second the guest dirties, all vCPUs together (0: as fast
    /// as it can).
    pub dirty_rate: u64,
    /// Time between snapshots.
    pub every: Duration,
    /// How long the guest runs while snapshots are taken.
    pub duration: Duration,
    /// Directory of the snapshot files (created; must hold none).
    pub dir: PathBuf,
}

/// What the run measured.
#[derive(Clone, Debug)]
pub struct SnapshotRun {
    /// Each snapshot taken, the base first.
    pub taken: Vec<TakeStat>,
    /// Restoring the chain.
    pub restore_time: Duration,
    /// Pages of the restored memory that differ from the guest's at the
    /// stop point, and the first one's address.
    pub differing: u64,
    pub first_differing: Option<u64>,
}

/// Runs the guest, takes the snapshots, restores them, compares. Steps
/// (two) and what runs go to `progress`.
///
/// # Errors
/// A message naming the step that failed.
pub fn run(c: &SnapshotRunConfig, progress: &Progress) -> Result<SnapshotRun, String> {
    let s = |e: SnapshotError| e.to_string();
    let vm = Arc::new(
        Vm::<TreeMemslots>::new(VmConfig {
            mem_size: c.mem,
            backing: Backing::Anonymous,
            slots: 1,
            policy: MmuPolicy::default(),
            ..VmConfig::default()
        })
        .map_err(|e| e.to_string())?,
    );
    let wl = Workload::start(
        vm.clone(),
        c.vcpus,
        WorkloadConfig {
            bytes_per_vcpu: c.mem / c.vcpus as u64,
            write_percent: 100,
            pattern: Pattern::Sequential,
            page_size: PAGE,
        },
    )?;
    wl.run_pass(|| {})?;
    let pace = match c.dirty_rate {
        0 => 0,
        r => (r / PAGE / c.vcpus as u64).max(1),
    };
    wl.control()
        .pace_pages_per_sec
        .store(pace, Ordering::Relaxed);
    vm.enable_dirty_logging().map_err(|e| e.to_string())?;
    progress.line("base and incrementals");
    let taker = Snapshotter::open(vm.clone(), &c.dir).map_err(s)?;
    wl.run_free();
    let snaps = SnapshotLoop::start(taker, c.every).map_err(s)?;
    std::thread::sleep(c.duration);
    wl.pause();
    let mut taker = snaps.finish().map_err(s)?;
    taker.take().map_err(s)?;
    progress.step();
    progress.line("restoring the chain");
    let t = Instant::now();
    let restored = restore(&c.dir, c.mem).map_err(s)?;
    let restore_time = t.elapsed();
    let (differing, first_differing) = differing_pages(&restored, &vm);
    progress.step();
    let taken = std::mem::take(&mut taker.taken);
    drop(taker);
    wl.stop();
    Ok(SnapshotRun {
        taken,
        restore_time,
        differing,
        first_differing,
    })
}
