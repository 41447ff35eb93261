//! The post-copy control socket against clients that misbehave and
//! against a directory others can write to: idle and slow clients do not
//! keep `status` from an operator (each client is served on its own, its
//! whole line within one deadline), and a socket whose directory another
//! user could write is refused by the migration and by `migrate-ctl`.
//! Behaviour only: no timing is asserted.

use s2mmu_migrate::session::postcopy::control::{request, Control, CONTROL_IO_TIMEOUT};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn scratch(name: &str, mode: u32) -> PathBuf {
    let d = std::env::temp_dir().join(format!("s2mmu-ctl-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
    d
}

#[test]
fn idle_and_slow_clients_do_not_keep_status_from_the_operator() {
    let dir = scratch("idle", 0o700);
    let path = dir.join("c.sock");
    let ctl = Control::start(&path, "destination").unwrap();
    // Five clients that connect and say nothing, and one that sends a
    // byte every 1.5 s (each within a per-read deadline of 2 s).
    let idle: Vec<UnixStream> = (0..5)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    let mut slow = UnixStream::connect(&path).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&request(&path, "status").unwrap()).unwrap();
    assert_eq!(v["side"], "destination");
    // The slow client is answered (refused) once its line's deadline
    // passed, however it paces its bytes.
    let t0 = Instant::now();
    let mut answer = Vec::new();
    while t0.elapsed() < CONTROL_IO_TIMEOUT * 5 {
        let _ = slow.write_all(b"s");
        let mut b = [0u8; 256];
        match slow.read(&mut b) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&b[..n]),
            Err(_) => std::thread::sleep(Duration::from_millis(1400)),
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("error: no complete line"), "{answer:?}");
    drop(idle);
    ctl.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_socket_in_a_directory_others_can_write_is_refused_on_both_sides() {
    let open = scratch("open", 0o777);
    let e = Control::start(&open.join("c.sock"), "source").unwrap_err();
    assert!(e.to_string().contains("writable by others"), "{e}");
    // Made in a private directory, which then opens up: migrate-ctl
    // refuses to talk to what may be an impostor.
    let dir = scratch("opened", 0o700);
    let path = dir.join("c.sock");
    let ctl = Control::start(&path, "source").unwrap();
    assert!(request(&path, "status").is_ok());
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = request(&path, "status").unwrap_err();
    assert!(e.contains("writable by others"), "{e}");
    // A sticky directory (as /tmp): this user's socket is accepted.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert!(request(&path, "status").is_ok());
    ctl.stop();
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&open).unwrap();
}
