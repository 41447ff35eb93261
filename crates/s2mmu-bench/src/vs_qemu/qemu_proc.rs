//! QEMU's processes of one run, each one's stderr kept in a file and its
//! exit status (or the signal that ended it) written beside it, so that a
//! failed run says why: its error names how each QEMU ended and the first
//! lines of its stderr.

use super::console::{self, Lines};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Bytes of a stderr file read back into an error.
const MAX_READ: u64 = 16 * 1024;
/// Distinct stderr lines an error quotes.
const MAX_QUOTED: usize = 6;
/// How long a failed run waits for a QEMU that is going down to exit.
const GRACE: Duration = Duration::from_secs(2);

/// One QEMU process: its role, its child, where its stderr goes.
pub struct QemuProc {
    /// "source" or "destination".
    pub role: &'static str,
    /// Its stderr, kept after the run.
    pub stderr: PathBuf,
    child: Child,
    /// How it ended, once known; `killed` when the benchmark ended it.
    ended: Option<(ExitStatus, bool)>,
}

impl QemuProc {
    /// Starts `c` as `role`, its stderr into `dir/<role>.stderr`, its
    /// stdout stamped into `lines`.
    ///
    /// # Errors
    /// The file or the process could not be made.
    pub fn start(
        mut c: Command,
        role: &'static str,
        dir: &Path,
        lines: &Lines,
    ) -> Result<QemuProc, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let stderr = dir.join(format!("{role}.stderr"));
        let f = File::create(&stderr).map_err(|e| format!("{}: {e}", stderr.display()))?;
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(f)
            .spawn()
            .map_err(|e| format!("{}: {e}", c.get_program().to_string_lossy()))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let p = QemuProc {
            role,
            stderr,
            child,
            ended: None,
        };
        console::stamp(out, lines.clone()).map_err(|e| e.to_string())?;
        Ok(p)
    }

    /// How it ended, if it has (waiting up to `grace` for it).
    pub fn exited(&mut self, grace: Duration) -> Option<ExitStatus> {
        let by = Instant::now() + grace;
        loop {
            if let Some((st, _)) = self.ended {
                return Some(st);
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                self.record(st, false);
                return Some(st);
            }
            if Instant::now() >= by {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends it (killing it if it still runs) and writes how it ended
    /// beside its stderr.
    pub fn finish(&mut self) {
        if self.exited(Duration::ZERO).is_none() {
            let _ = self.child.kill();
            if let Ok(st) = self.child.wait() {
                self.record(st, true);
            }
        }
    }

    fn record(&mut self, st: ExitStatus, killed: bool) {
        self.ended = Some((st, killed));
        let how = if killed {
            format!("{st} (killed by the benchmark at the run's end)")
        } else {
            format!("{st} (exited by itself)")
        };
        let _ = std::fs::write(self.stderr.with_extension("status"), how + "\n");
    }

    /// A line for an error: how it ended (if it did) and its stderr's
    /// first lines.
    pub fn describe(&mut self, grace: Duration) -> String {
        let how = match self.exited(grace) {
            Some(st) => format!("QEMU's {} exited ({st})", self.role),
            None => format!("QEMU's {} still runs", self.role),
        };
        match first_lines(&self.stderr) {
            Some(l) => format!("{how}, its stderr: {l}"),
            None => format!("{how}, its stderr empty"),
        }
    }
}

impl Drop for QemuProc {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The first distinct lines of the file at `path` (a line repeated in a
/// row counted once, with its count), joined by " | "; `None` when empty.
pub fn first_lines(path: &Path) -> Option<String> {
    let mut text = String::new();
    let f = File::open(path).ok()?;
    let _ = f.take(MAX_READ).read_to_string(&mut text);
    let mut out: Vec<(String, usize)> = Vec::new();
    for l in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let full = out.len() == MAX_QUOTED;
        match out.last_mut() {
            Some((last, n)) if last == l => *n += 1,
            _ if full => break,
            _ => out.push((l.to_string(), 1)),
        }
    }
    let quoted: Vec<String> = out
        .into_iter()
        .map(|(l, n)| match n {
            1 => format!("{l:?}"),
            n => format!("{l:?} (x{n})"),
        })
        .collect();
    (!quoted.is_empty()).then(|| quoted.join(" | "))
}

/// `why`, with how each of `procs` ended and its stderr's first lines,
/// and the source guest's last console line (a guest that powered off
/// ends its QEMU).
pub fn failure(why: &str, procs: &mut [QemuProc], src_console: &Lines) -> String {
    let mut s = why.to_string();
    for p in procs.iter_mut() {
        s += "; ";
        s += &p.describe(GRACE);
    }
    if let Some(last) = console::snapshot(src_console).last() {
        s += &format!("; the source guest's last console line: {:?}", last.line);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("s2mmu-qproc-{name}-{}", std::process::id()))
    }

    /// A stand-in for QEMU: `sh -c script` as `role`, kept under `d`.
    fn sh(script: &str, role: &'static str, d: &Path, lines: &Lines) -> QemuProc {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        QemuProc::start(c, role, d, lines).expect("started")
    }

    /// The status file written for `role` under `d` says each of `words`;
    /// `d` is removed after.
    fn status_says(d: &Path, role: &str, words: &[&str]) {
        let st = std::fs::read_to_string(d.join(format!("{role}.status"))).expect("kept");
        let _ = std::fs::remove_dir_all(d);
        for w in words {
            assert!(st.contains(w), "{role}: {st:?} lacks {w:?}");
        }
    }

    #[test]
    fn a_failed_run_names_how_each_process_ended_and_its_stderr() {
        let d = dir("failed");
        let lines = Lines::default();
        let script = "echo 'power off'; echo boom >&2; echo boom >&2; echo why >&2; exit 3";
        let mut procs = vec![sh(script, "source", &d, &lines)];
        // The console's line is read on its own thread: the message is
        // looked at once that thread has it.
        let by = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while console::snapshot(&lines).is_empty() && std::time::Instant::now() < by {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let e = failure("QMP query-migrate: Broken pipe", &mut procs, &lines);
        assert!(e.starts_with("QMP query-migrate: Broken pipe; "), "{e}");
        assert!(e.contains("QEMU's source exited (exit status: 3)"), "{e}");
        assert!(e.contains("\"boom\" (x2) | \"why\""), "{e}");
        assert!(e.contains("last console line: \"power off\""), "{e}");
        drop(procs);
        status_says(&d, "source", &["exit status: 3", "by itself"]);
    }

    #[test]
    fn a_process_still_running_is_killed_and_its_status_kept() {
        let d = dir("killed");
        let lines = Lines::default();
        let mut p = sh("echo started >&2; exec sleep 60", "destination", &d, &lines);
        // Its stderr line arrives while it runs.
        let by = Instant::now() + Duration::from_secs(10);
        while first_lines(&p.stderr).is_none() && Instant::now() < by {
            std::thread::sleep(Duration::from_millis(20));
        }
        let e = p.describe(Duration::ZERO);
        assert_eq!(e, "QEMU's destination still runs, its stderr: \"started\"");
        p.finish();
        status_says(&d, "destination", &["signal: 9", "killed by the benchmark"]);
    }

    #[test]
    fn the_quote_is_bounded_and_an_empty_file_says_none() {
        let d = dir("bounded");
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("x.stderr");
        std::fs::write(&f, "").unwrap();
        assert_eq!(first_lines(&f), None);
        let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&f, many).unwrap();
        let q = first_lines(&f).expect("lines");
        assert_eq!(q.matches(" | ").count(), MAX_QUOTED - 1);
        assert!(q.starts_with("\"line 0\"") && !q.contains("line 6"));
        assert_eq!(first_lines(&d.join("absent")), None);
        let _ = std::fs::remove_dir_all(&d);
    }
}
