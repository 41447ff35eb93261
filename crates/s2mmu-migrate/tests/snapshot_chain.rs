//! Incremental snapshots of a running simulated guest: the restored chain
//! equals the guest's memory at the stop point, and a damaged, truncated or
//! missing file is refused with an error naming it.

use s2mmu::memslot::TreeMemslots;
use s2mmu_migrate::session::snapshot::format::{Header, SlotGeom, SnapshotError, SnapshotWriter};
use s2mmu_migrate::session::snapshot::restore::{file_name, restore};
use s2mmu_migrate::sim::snapshot_taker::{differing_pages, SnapshotLoop, Snapshotter};
use s2mmu_vm::{Backing, Pattern, Vm, VmConfig, Workload, WorkloadConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("s2mmu-snap-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// How long a step the machine's load may stretch gets before the test
/// calls it hung (the machine's speed, not the behaviour under test).
const LIMIT: Duration = Duration::from_secs(60);

/// Waits until `done` holds, failing the test with `what` after [`LIMIT`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        assert!(t0.elapsed() < LIMIT, "{what}: not within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A guest with two slots whose vCPUs write half of its pages while
/// snapshots are taken every 10 ms (until the loop's second incremental
/// is on disk), then paused and snapshotted once more.
fn snapshotted(dir: &Path) -> (Arc<Vm<TreeMemslots>>, Workload<TreeMemslots>, u64) {
    let vm = Arc::new(
        Vm::<TreeMemslots>::new(VmConfig {
            mem_size: 16 * MIB,
            backing: Backing::Anonymous,
            slots: 2,
            ..VmConfig::default()
        })
        .unwrap(),
    );
    let w = Workload::start(
        vm.clone(),
        2,
        WorkloadConfig {
            // Half of the guest's 4096 pages: an incremental holding
            // every page is a copy of all memory, not of the changes.
            bytes_per_vcpu: 4 * MIB,
            write_percent: 100,
            pattern: Pattern::Random,
            page_size: 4096,
        },
    )
    .unwrap();
    w.run_pass(|| {}).unwrap();
    // 20,000 pages a second per vCPU: a few hundred pages per 10 ms.
    w.control()
        .pace_pages_per_sec
        .store(20_000, std::sync::atomic::Ordering::Relaxed);
    vm.enable_dirty_logging().unwrap();
    let taker = Snapshotter::open(vm.clone(), dir).unwrap();
    w.run_free();
    let lp = SnapshotLoop::start(taker, Duration::from_millis(10)).unwrap();
    // The base is file 0. A fixed 150 ms here needed the loop's thread to
    // run within it; a loaded machine need not schedule it (n = 2: the
    // base and the paused one only).
    wait_until("the loop's incrementals", || {
        dir.join(file_name(2)).exists()
    });
    w.pause();
    let mut taker = lp.finish().unwrap();
    taker.take().unwrap();
    let n = taker.taken.len() as u64;
    assert!(n >= 3, "a base and incrementals: {n}");
    assert!(
        taker.taken[1..].iter().all(|t| t.pages <= 2048),
        "incrementals hold the changed pages only: {:?}",
        taker.taken
    );
    drop(taker);
    assert_eq!(
        vm.mmu().dirty_views_open(vm.slots()[0].id),
        0,
        "views closed"
    );
    (vm, w, n)
}

#[test]
fn the_restored_chain_equals_the_guest_at_the_stop_point() {
    let dir = scratch("equal");
    let (vm, w, n) = snapshotted(&dir);
    let r = restore(&dir, 16 * MIB).unwrap();
    assert_eq!(r.snapshots, n);
    assert_eq!(differing_pages(&r, &vm), (0, None));
    // The guest moves on: the chain no longer matches it.
    // Until each vCPU has made writes (a fixed 30 ms needed the vCPU
    // threads to run within it).
    let before: Vec<u64> = w.control().live_writes();
    w.resume();
    wait_until("writes after the resume", || {
        w.control()
            .live_writes()
            .iter()
            .zip(&before)
            .all(|(a, b)| a > b)
    });
    w.pause();
    assert!(differing_pages(&r, &vm).0 > 0, "the comparison can fail");
    drop(w);
    // A second run must not mix its files into this chain.
    assert!(matches!(
        Snapshotter::open(vm.clone(), &dir),
        Err(SnapshotError::Chain { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damaged_truncated_or_missing_files_are_refused() {
    let dir = scratch("damaged");
    let (vm, w, _) = snapshotted(&dir);
    drop(w);
    let f1 = dir.join(file_name(1));
    let good = std::fs::read(&f1).unwrap();
    let mut bad = good.clone();
    let at = bad.len() - 100;
    bad[at] ^= 1;
    std::fs::write(&f1, &bad).unwrap();
    assert_eq!(
        restore(&dir, 16 * MIB).unwrap_err(),
        SnapshotError::Checksum { path: f1.clone() }
    );
    bad = good.clone();
    bad[20] ^= 1;
    std::fs::write(&f1, &bad).unwrap();
    assert_eq!(
        restore(&dir, 16 * MIB).unwrap_err(),
        SnapshotError::HeaderChecksum { path: f1.clone() }
    );
    std::fs::write(&f1, &good[..good.len() - 1]).unwrap();
    assert!(matches!(
        restore(&dir, 16 * MIB),
        Err(SnapshotError::Truncated { .. })
    ));
    bad = good.clone();
    bad[0] = b'X';
    std::fs::write(&f1, &bad).unwrap();
    assert!(matches!(
        restore(&dir, 16 * MIB),
        Err(SnapshotError::BadMagic { .. })
    ));
    std::fs::remove_file(&f1).unwrap();
    assert!(matches!(
        restore(&dir, 16 * MIB),
        Err(SnapshotError::Chain { .. })
    ));
    std::fs::write(&f1, &good).unwrap();
    assert!(
        matches!(restore(&dir, 8 * MIB), Err(SnapshotError::Chain { .. })),
        "a guest over the caller's limit is refused before allocating it"
    );
    let r = restore(&dir, 16 * MIB).unwrap();
    assert_eq!(
        differing_pages(&r, &vm),
        (0, None),
        "the good file restores again"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_writer_refuses_records_that_do_not_fit_its_header() {
    let dir = scratch("writer");
    std::fs::create_dir_all(&dir).unwrap();
    let header = Header {
        base: true,
        seq: 0,
        parent: None,
        slots: vec![SlotGeom {
            id: 0,
            gpa: 0,
            size: 2 * 4096,
        }],
        pages: 1,
    };
    let path = dir.join(file_name(0));
    let mut w = SnapshotWriter::create(&path, header.clone()).unwrap();
    let page = vec![7u8; 4096];
    assert!(matches!(
        w.page(0, 2, &page),
        Err(SnapshotError::Malformed { .. })
    ));
    assert!(matches!(
        w.page(1, 0, &page),
        Err(SnapshotError::Malformed { .. })
    ));
    assert!(matches!(
        w.page(0, 0, &page[..8]),
        Err(SnapshotError::Malformed { .. })
    ));
    w.page(0, 1, &page).unwrap();
    assert!(matches!(
        w.page(0, 0, &page),
        Err(SnapshotError::Malformed { .. })
    ));
    assert_eq!(w.finish().unwrap(), header.file_len());
    let r = restore(&dir, 1 << 20).unwrap();
    assert_eq!(r.memory[0][4096..], page[..]);
    assert!(r.memory[0][..4096].iter().all(|&b| b == 0));
    let short =
        SnapshotWriter::create(&dir.join(file_name(1)), Header { pages: 2, ..header }).unwrap();
    assert!(matches!(
        short.finish(),
        Err(SnapshotError::Malformed { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
