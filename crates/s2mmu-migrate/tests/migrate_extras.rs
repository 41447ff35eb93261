//! `migrate --check` and `migrate --snapshot-every`: the lost-write check
//! reports 0 in a normal migration and catches a dropped dirty mark (the
//! destination is then not resumed); snapshots taken from a dirty view of
//! their own while the migration runs restore to the source's memory.

use s2mmu::mmu::DirtyMode;
use s2mmu::mmu::MmuPolicy;
use s2mmu_migrate::session::extras::SourceExtras;
use s2mmu_migrate::sim::dest::SimDestConfig;
use s2mmu_migrate::sim::in_process::migrate_in_process;
use s2mmu_migrate::sim::source::{session_harvest, SimRun};
use s2mmu_migrate::stream_error::MigrateError;
use s2mmu_migrate::transport::NetConfig;
use s2mmu_vm::{Backing, Pattern};
use std::time::Duration;

/// A small guest whose pre-copy takes several rounds (a slow link, a
/// tight downtime budget), rewriting its pages in order.
fn cfg(extras: SourceExtras) -> SimRun {
    SimRun::default().with(|g, s| {
        g.mem_size = 16 << 20;
        g.backing = Backing::Anonymous;
        g.slots = 2;
        s.clear_chunk = 1 << 20;
        g.dirty_rate = 16 << 20;
        s.bandwidth = 64 << 20;
        // Raw pages: the simulated guest's compress a hundredfold.
        s.compression = s2mmu_migrate::wire::Compression::Off;
        s.max_downtime = Duration::from_millis(20);
        g.pattern = Pattern::Sequential;
        s.warmup = Duration::from_millis(50);
        s.sample_every = Duration::from_millis(20);
        s.progress = s2mmu_migrate::session::Progress::off();
        g.extras = extras;
    })
}

fn run(c: &SimRun) -> Result<s2mmu_migrate::session::source::SourceOutcome, MigrateError> {
    let mut dest = SimDestConfig::new(MmuPolicy::default(), Duration::from_millis(50));
    dest.dest.prefault = false;
    migrate_in_process(c, &dest, &NetConfig::plain(Duration::from_secs(10))).map(|(s, _)| s)
}

#[test]
fn the_check_finds_no_lost_write_in_a_normal_migration() {
    let s = run(&cfg(SourceExtras {
        check: true,
        ..SourceExtras::default()
    }))
    .expect("migration succeeds");
    let c = s.extras.check.expect("checked");
    assert_eq!(c.lost, 0);
    assert!(c.changed > 0, "the guest wrote while logged");
    assert_eq!(c.rounds as usize, s.rounds.len(), "every round checked");
}

#[test]
fn the_check_catches_dropped_dirty_marks() {
    let e = run(&cfg(SourceExtras {
        check: true,
        inject_lost_marks: 3,
        ..SourceExtras::default()
    }))
    .expect_err("a lost write fails the migration");
    match e {
        MigrateError::LostWrites { pages, first_gpa } => {
            assert_eq!(pages, 3, "each dropped mark is one lost page");
            assert!(first_gpa >= 1 << 32);
        }
        other => panic!("expected LostWrites, got {other}"),
    }
}

#[test]
fn snapshots_beside_a_migration_restore_to_the_source_memory() {
    let dir = std::env::temp_dir().join(format!("s2mmu-migrate-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = run(&cfg(SourceExtras {
        check: true,
        snapshot_every: Some(Duration::from_millis(20)),
        snapshot_dir: Some(dir.clone()),
        ..SourceExtras::default()
    }))
    .expect("migration succeeds");
    let snaps = s.extras.snapshots.expect("taken").expect("no error");
    assert!(snaps.taken >= 2, "a base and at least the last");
    assert_eq!(snaps.differing_pages, 0);
    assert_eq!(s.extras.check.map(|c| c.lost), Some(0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn options_that_cannot_work_are_refused_before_the_guest_starts() {
    let ring = cfg(SourceExtras {
        check: true,
        ..SourceExtras::default()
    })
    .with(|g, s| {
        g.dirty = DirtyMode::Ring { entries: 256 };
        s.harvest = session_harvest(g.dirty);
    });
    assert!(matches!(run(&ring), Err(MigrateError::Setup(_))));
    let no_dir = cfg(SourceExtras {
        snapshot_every: Some(Duration::from_millis(20)),
        ..SourceExtras::default()
    });
    assert!(matches!(run(&no_dir), Err(MigrateError::Setup(_))));
    // The simulated run's own check now (the session's settings no longer
    // carry the extras).
    let postcopy = cfg(SourceExtras {
        check: true,
        ..SourceExtras::default()
    })
    .with(|_, s| s.postcopy = s2mmu_migrate::session::postcopy::Postcopy::On);
    assert!(
        matches!(run(&postcopy), Err(MigrateError::Setup(m)) if m.contains("post-copy with the lost-write check")),
        "post-copy with the check"
    );
}
