//! Who may use a control socket, and for how long: the directory it lives
//! in, the peer's credentials, and a line read within one overall
//! deadline (not a deadline per read).
//!
//! Whoever can replace the socket can answer `migrate-ctl` in the
//! migration's name, and whoever can connect can resume or cancel it. So
//! both sides check:
//! - the directory: owned by this user or root, and writable by no one
//!   else, unless it is sticky (as `/tmp` is), where only a file's owner
//!   may remove or replace it; then the socket itself must be this user's;
//! - the peer: `SO_PEERCRED` names the process at the other end; it must
//!   run as this user or as root.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Checks the directory of the socket `path` (and, in a sticky
/// directory, that the socket, when it exists, is this user's).
///
/// # Errors
/// Why the directory cannot be trusted.
pub(super) fn check_dir(path: &Path) -> Result<(), String> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let m = std::fs::metadata(dir).map_err(|e| format!("directory {}: {e}", dir.display()))?;
    let me = euid();
    if m.uid() != me && m.uid() != 0 {
        return Err(format!(
            "directory {} belongs to uid {}, not to this user ({me}) or root: another user could replace the socket",
            dir.display(),
            m.uid()
        ));
    }
    let others_write = m.mode() & 0o022 != 0;
    let sticky = m.mode() & 0o1000 != 0;
    if others_write && !sticky {
        return Err(format!(
            "directory {} is writable by others (mode {:o}) and not sticky: another user could replace the socket",
            dir.display(),
            m.mode() & 0o7777
        ));
    }
    if others_write {
        if let Ok(s) = std::fs::symlink_metadata(path) {
            if s.uid() != me {
                return Err(format!(
                    "{} belongs to uid {}, not to this user ({me}), in a directory others write to",
                    path.display(),
                    s.uid()
                ));
            }
        }
    }
    Ok(())
}

/// The uid of the process at the other end of `c`.
fn peer_uid(c: &UnixStream) -> std::io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for the kernel to write, `len`
    // says the size of `cred`, and the descriptor is open while `c` lives.
    let r = unsafe {
        libc::getsockopt(
            c.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Checks that the peer of `c` runs as this user or as root.
///
/// # Errors
/// Who the peer is, or why it could not be told.
pub(super) fn check_peer(c: &UnixStream) -> Result<(), String> {
    let me = euid();
    match peer_uid(c) {
        Ok(u) if u == me || u == 0 => Ok(()),
        Ok(u) => Err(format!(
            "the peer runs as uid {u}, not as this user ({me}) or root"
        )),
        Err(e) => Err(format!("the peer's credentials: {e}")),
    }
}

/// One line of at most `max` bytes (newline included), UTF-8, the whole
/// of it within `limit` from now.
///
/// # Errors
/// A message: too long, no newline, not UTF-8, or not complete in time.
pub(super) fn read_line_within(
    c: &UnixStream,
    max: usize,
    limit: Duration,
) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    let mut buf = Vec::new();
    let mut byte = [0u8; 256];
    let mut r = c;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no complete line within {limit:?}"));
        }
        c.set_read_timeout(Some(left))
            .map_err(|e| format!("reading: {e}"))?;
        // At most what the line may still hold, so nothing past it is
        // consumed.
        let want = (max + 1 - buf.len()).min(byte.len());
        let n = match r.read(&mut byte[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!("no complete line within {limit:?}"))
            }
            Err(e) => return Err(format!("reading: {e}")),
        };
        let got = &byte[..n];
        if let Some(end) = got.iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&got[..end]);
            return String::from_utf8(buf).map_err(|_| "the line is not UTF-8".into());
        }
        buf.extend_from_slice(got);
        if buf.len() > max - 1 {
            return Err(format!("a line of more than {max} bytes"));
        }
        if n == 0 {
            return Err("the line did not end with a newline".into());
        }
    }
}
