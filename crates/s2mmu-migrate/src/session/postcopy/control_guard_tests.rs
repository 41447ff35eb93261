//! The control socket's peer check with a real second user: created here
//! with `useradd` (which needs root) and removed after.

use super::control_guard::check_peer;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::Command;

/// A system user made for the test, removed when dropped.
struct TempUser {
    name: String,
    uid: u32,
}

impl TempUser {
    fn create() -> TempUser {
        let name = format!("s2mmu-peer-{}", std::process::id());
        let _ = Command::new("userdel").arg(&name).output();
        let made = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(&name)
            .output()
            .expect("useradd runs");
        assert!(
            made.status.success(),
            "useradd {name}: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        let id = Command::new("id").args(["-u", &name]).output().unwrap();
        let uid = String::from_utf8_lossy(&id.stdout).trim().parse().unwrap();
        TempUser { name, uid }
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// Connects to `path` from a thread whose effective uid is `uid`: the raw
/// system call changes the calling thread's credentials only (glibc's
/// wrapper would change every thread's), and `SO_PEERCRED` records the
/// connecting thread's.
fn connect_as(uid: u32, path: std::path::PathBuf) -> UnixStream {
    std::thread::spawn(move || {
        let keep = u32::MAX; // -1: leave the real and saved uids as they are.
                             // SAFETY: setresuid takes three integers and touches no memory of
                             // ours; it changes only this thread, which ends after the connect.
        let r = unsafe { libc::syscall(libc::SYS_setresuid, keep, uid, keep) };
        assert_eq!(r, 0, "setresuid: {}", std::io::Error::last_os_error());
        UnixStream::connect(path).unwrap()
    })
    .join()
    .unwrap()
}

#[test]
#[ignore = "needs root (it creates a second user with useradd): .ci/run runs it with --ignored as root"]
fn a_peer_of_another_user_is_refused_and_this_users_is_taken() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "run as root");
    let user = TempUser::create();
    let dir = std::env::temp_dir().join(format!("s2mmu-peercred-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ctl.sock");
    let l = UnixListener::bind(&path).unwrap();
    // The other user must be let through the directory and to the socket:
    // the peer check is what this test is about.
    use std::os::unix::fs::PermissionsExt;
    let open = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open(&dir, 0o755);
    open(&path, 0o777);
    let other = connect_as(user.uid, path.clone());
    let (theirs, _) = l.accept().unwrap();
    let e = check_peer(&theirs).unwrap_err();
    assert!(
        e.contains(&format!("uid {}", user.uid)) && e.contains("not as this user"),
        "{e}"
    );
    let mine = UnixStream::connect(&path).unwrap();
    let (ours, _) = l.accept().unwrap();
    assert_eq!(check_peer(&ours), Ok(()));
    drop((other, mine));
    let _ = std::fs::remove_dir_all(&dir);
}
