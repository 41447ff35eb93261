//! Two `s2mmu migrate` processes over a Unix socket with a pre-shared key.
//! The transport itself is tested with the migration library
//! (crates/s2mmu-migrate/tests/migrate_unix.rs).

#[path = "../cli_common/mod.rs"]
mod cli_common;
#[path = "../recover_common/mod.rs"]
mod recover_common;

use std::time::Duration;

/// A fresh socket path in the test's temporary directory.
fn socket_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("s2mmu-unix-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("migrate.sock")
}

#[test]
fn two_processes_migrate_over_a_unix_socket_with_a_key() {
    use std::process::{Command, Stdio};
    let path = socket_path("process");
    let key = path.with_file_name("key");
    std::fs::write(&key, "a key of at least sixteen bytes\n").unwrap();
    let small = [&recover_common::QUICK[..], &["--plot", "", "--psk"]].concat();
    let addr = format!("unix:{}", path.display());
    let dest = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(["migrate", "--listen", &addr])
        .args(&small)
        .arg(&key)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no socket at {addr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let src = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(["migrate", "--to", &addr])
        .args(&small)
        .arg(&key)
        .output()
        .unwrap();
    let d = dest.wait_with_output().unwrap();
    let dlog = String::from_utf8_lossy(&d.stderr);
    assert!(
        src.status.success(),
        "{}",
        String::from_utf8_lossy(&src.stderr)
    );
    assert!(d.status.success(), "{dlog}");
    assert!(
        dlog.contains(&format!("destination listening on {addr}")),
        "{dlog}"
    );
    assert!(!path.exists(), "the destination removed its socket file");
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
