//! `s2mmu snapshot --verify DIR` refuses a file it cannot restore by name,
//! without aborting or blocking. The snapshots themselves are tested with
//! the migration library (crates/s2mmu-migrate/tests/snapshot_chain.rs).

use s2mmu_migrate::session::snapshot::format::{Header, SlotGeom, SnapshotWriter};
use s2mmu_migrate::session::snapshot::restore::file_name;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("s2mmu-snap-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `s2mmu snapshot --verify DIR` within 30 s: its exit code (None: a
/// signal ended it, as an abort does) and stderr.
fn verify_process(dir: &Path) -> (Option<i32>, String) {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(["snapshot", "--verify", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let st = loop {
        if let Some(st) = c.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = c.kill();
            panic!("snapshot --verify {} hung", dir.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
    (st.code(), err)
}

#[test]
fn a_valid_file_describing_more_memory_than_the_host_has_is_refused_not_aborted() {
    let dir = scratch("huge");
    std::fs::create_dir_all(&dir).unwrap();
    // 88 bytes: a base of no pages for one 64 GiB slot (the format's
    // largest guest), more than a machine of this size has available.
    let header = Header {
        base: true,
        seq: 0,
        parent: None,
        slots: vec![SlotGeom {
            id: 0,
            gpa: 0,
            size: 64 << 30,
        }],
        pages: 0,
    };
    let w = SnapshotWriter::create(&dir.join(file_name(0)), header).unwrap();
    assert_eq!(w.finish().unwrap(), 88);
    let (code, err) = verify_process(&dir);
    assert!(matches!(code, Some(c) if c != 0), "{code:?}: {err}");
    assert!(err.contains("bytes of memory"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fifo_named_like_a_snapshot_is_refused_without_blocking() {
    let dir = scratch("fifo");
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = std::ffi::CString::new(dir.join(file_name(0)).to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let (code, err) = verify_process(&dir);
    assert!(matches!(code, Some(c) if c != 0), "{code:?}: {err}");
    assert!(err.contains("not a regular file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
