//! `s2mmu linux --run shell` typed into as a user would, through a
//! pseudo-terminal: the command reaches BusyBox's shell, its output comes
//! back, `Ctrl-A x` stops the VM, and the terminal is out of raw mode
//! afterwards.

#[path = "../cli_common/mod.rs"]
mod cli_common;

use cli_common::require_linux;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A pseudo-terminal: (master, slave).
fn openpty() -> (OwnedFd, OwnedFd) {
    let (mut m, mut s) = (-1, -1);
    // SAFETY: two out-parameters; no name, settings or window size.
    let r = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two descriptors this process owns.
    unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}

/// Whether the terminal is in canonical (cooked) mode.
fn canonical(fd: &OwnedFd) -> bool {
    // SAFETY: termios is plain data tcgetattr fills.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a termios to fill.
    assert_eq!(unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) }, 0);
    t.c_lflag & libc::ICANON != 0
}

/// Reads the master side on a thread; `wait_for` polls what came.
struct Screen {
    rx: mpsc::Receiver<Vec<u8>>,
    seen: String,
}

impl Screen {
    fn wait_for(&mut self, text: &str, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        while !self.seen.contains(text) {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(b) => self.seen.push_str(&String::from_utf8_lossy(&b)),
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
                Err(_) => return false,
            }
        }
        true
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_linux_runnable),
    ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
)]
fn a_user_types_into_the_guests_shell_and_ctrl_a_x_stops_it() {
    require_linux();
    let (master, slave) = openpty();
    let io = |f: &OwnedFd| Stdio::from(f.try_clone().expect("dup"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(["linux", "--run", "shell", "--timeout", "10m"])
        .stdin(io(&slave))
        .stdout(io(&slave))
        .stderr(io(&slave))
        .spawn()
        .expect("s2mmu starts");
    let mut reader = File::from(master.try_clone().expect("dup"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut screen = Screen {
        rx,
        seen: String::new(),
    };
    let mut keys = File::from(master.try_clone().expect("dup"));
    let booted = screen.wait_for("s2mmu-init: shell", Duration::from_secs(540));
    if !booted {
        let _ = child.kill();
        panic!("no shell: {}", screen.seen);
    }
    assert!(
        !canonical(&slave),
        "the terminal is in raw mode while the guest runs"
    );
    // The shell may print its prompt after the line: give it a moment,
    // then type; its answer is the expansion, not the echo of the line.
    std::thread::sleep(Duration::from_secs(2));
    keys.write_all(b"echo hello-$((6*7))\r").expect("type");
    let answered = screen.wait_for("hello-42", Duration::from_secs(60));
    keys.write_all(&[0x01, b'x']).expect("type the escape");
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > end {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(answered, "no hello-42 from the guest: {}", screen.seen);
    let status = status.unwrap_or_else(|| panic!("Ctrl-A x did not stop the VM: {}", screen.seen));
    assert!(status.success(), "{status}: {}", screen.seen);
    assert!(canonical(&slave), "the terminal was restored");
}
