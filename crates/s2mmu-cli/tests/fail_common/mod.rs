//! What the failed-migration tests of the Linux guest share: a QEMU
//! wrapper (`S2MMU_QEMU`) that records each machine's process id and can
//! refuse to start a given machine, `s2mmu migrate --guest linux`
//! processes with their stderr collected, and the source's report that
//! its guest was resumed and went on.

#![allow(dead_code)]

pub use super::cli_common::{require_linux, spawn_listening};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_s2mmu")
}

/// One process's QEMU machines, through a wrapper script: machine `n`
/// (counted from 1 in the order the process starts them) writes its
/// process id to `qemu.<n>.pid`, and exits at once with an error when
/// `fail.<n>` exists. Every machine still running is killed on drop.
pub struct Qemu {
    pub dir: PathBuf,
}

impl Qemu {
    pub fn new(name: &str) -> Qemu {
        let dir = std::env::temp_dir().join(format!("s2mmu-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = std::env::var_os("PATH").unwrap_or_default();
        let real = std::env::split_paths(&path)
            .map(|d| d.join("qemu-system-aarch64"))
            .find(|p| p.is_file())
            .expect("qemu-system-aarch64 on PATH");
        let d = dir.display();
        let script = format!(
            "#!/bin/sh\nn=$(( $(cat {d}/count 2>/dev/null || echo 0) + 1 ))\necho $n > {d}/count\n\
             echo $$ > {d}/qemu.$n.pid\nif [ -e {d}/fail.$n ]; then\n  \
             echo \"qemu-system-aarch64: machine $n refused by the test\" >&2\n  exit 1\nfi\n\
             exec {} \"$@\"\n",
            real.display()
        );
        let wrapper = dir.join("qemu");
        std::fs::write(&wrapper, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        Qemu { dir }
    }

    pub fn wrapper(&self) -> PathBuf {
        self.dir.join("qemu")
    }

    /// Machine `n` will not start.
    pub fn fail(&self, n: u32) {
        std::fs::write(self.dir.join(format!("fail.{n}")), "").unwrap();
    }

    pub fn pid(&self, n: u32) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(format!("qemu.{n}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Waits (up to `limit`) until machine `n` started; panics with
    /// `log` if `c` exits first.
    pub fn wait_started(&self, n: u32, c: &mut Child, log: &Log, limit: Duration) -> i32 {
        let t0 = Instant::now();
        loop {
            if let Some(p) = self.pid(n) {
                return p;
            }
            if let Some(s) = c.try_wait().unwrap() {
                panic!("exited ({s}) before machine {n} started:\n{}", log.text());
            }
            assert!(t0.elapsed() < limit, "machine {n} never started");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills machine `n` (SIGKILL), as a crash would.
    pub fn kill(&self, n: u32) {
        let pid = self.pid(n).expect("the machine started");
        kill(pid);
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        for n in 1..=8 {
            if let Some(p) = self.pid(n) {
                // Only a process still running this test's QEMU.
                let cmd = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
                if cmd.contains("qemu-system-aarch64") {
                    kill(p);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether process `pid` holds an established TCP connection (its socket
/// descriptors against /proc/net/tcp and tcp6).
pub fn connected(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: Vec<String> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|t| {
        std::fs::read_to_string(t)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .any(|f| f.len() > 9 && f[3] == "01" && inodes.iter().any(|i| i == f[9]))
    })
}

pub fn kill(pid: i32) {
    // SAFETY: kill(2) has no memory effects; `pid` is a process this
    // test started (a QEMU machine or an `s2mmu` process).
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// A process's stderr, collected on a thread of its own.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<String>>);

impl Log {
    pub fn text(&self) -> String {
        self.0.lock().unwrap().clone()
    }

    fn collect(&self, r: impl BufRead + Send + 'static) {
        let log = self.0.clone();
        std::thread::spawn(move || {
            for line in r.lines() {
                let Ok(line) = line else { return };
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
    }
}

/// `s2mmu migrate --guest linux -v 1 --mem MEM ARGS` with `qemu` as its
/// QEMU; its stderr in the log (stdout too, after it).
pub fn migrate(qemu: &Qemu, mem: &str, args: &[&str]) -> (Child, Log) {
    migrate_env(qemu, mem, args, &[])
}

/// [`migrate`] with `env` set too.
pub fn migrate_env(qemu: &Qemu, mem: &str, args: &[&str], env: &[(&str, &str)]) -> (Child, Log) {
    let mut c = Command::new(bin())
        .args(["migrate", "--guest", "linux", "-v", "1", "--mem", mem])
        .args(args)
        .envs(env.iter().copied())
        .env("S2MMU_QEMU", qemu.wrapper())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("s2mmu starts");
    let log = Log::default();
    log.collect(BufReader::new(c.stderr.take().unwrap()));
    log.collect(BufReader::new(c.stdout.take().unwrap()));
    (c, log)
}

/// A listening destination and the address it bound.
pub fn listen(qemu: &Qemu, mem: &str, args: &[&str]) -> (Child, String, Log) {
    listen_env(qemu, mem, args, &[])
}

/// [`listen`] with `env` set too.
pub fn listen_env(
    qemu: &Qemu,
    mem: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Child, String, Log) {
    let (mut c, addr, err) = spawn_listening(
        Command::new(bin())
            .args(["migrate", "--guest", "linux", "-v", "1", "--mem", mem])
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .env("S2MMU_QEMU", qemu.wrapper())
            .stdout(Stdio::piped()),
    );
    let log = Log::default();
    log.collect(err);
    log.collect(BufReader::new(c.stdout.take().unwrap()));
    (c, addr, log)
}

/// Waits (up to `limit`) for `c` to exit; kills it and panics past that.
pub fn wait_exit(c: &mut Child, log: &Log, limit: Duration) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = c.try_wait().unwrap() {
            // Its pipes' last lines.
            std::thread::sleep(Duration::from_millis(200));
            return s;
        }
        if t0.elapsed() > limit {
            let _ = c.kill();
            panic!("a migration process hung:\n{}", log.text());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The source failed, saying what failed (`what`) and that its guest was
/// resumed and printed its next counter steps in order.
pub fn source_resumed(c: &mut Child, log: &Log, what: &str) {
    let s = wait_exit(c, log, Duration::from_secs(900));
    let text = log.text();
    eprintln!("the source:\n{text}");
    assert!(!s.success(), "the source succeeded:\n{text}");
    assert!(text.contains(what), "the error names {what:?}:\n{text}");
    assert!(
        text.contains(
            "the migration failed and the source's guest was resumed: its counter printed step"
        ),
        "the source's guest went on:\n{text}"
    );
    assert!(
        text.contains("every step once and in order"),
        "the steps in order:\n{text}"
    );
}

/// A test of the Linux guest: ignored, with the reason, where the guest
/// cannot run; failing where `S2MMU_REQUIRE_LINUX` says it must.
#[allow(unused_macros)] // a file that writes its tests out in full
macro_rules! linux_test {
    ($name:ident, $body:block) => {
        #[test]
        #[cfg_attr(
            not(s2mmu_linux_runnable),
            ignore = "needs the Linux guest: QEMU, the EL2 image, the cross compiler, dtc and the kernel packages (scripts/setup.sh)"
        )]
        fn $name() {
            require_linux();
            $body
        }
    };
}
