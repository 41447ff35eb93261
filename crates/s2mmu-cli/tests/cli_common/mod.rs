//! What the CLI test files share: running `s2mmu` as a user would, in a
//! scratch directory, with a deadline for its first output.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How long a command may stay silent before the test calls it stuck.
pub const FIRST_OUTPUT: Duration = Duration::from_secs(5);

/// A scratch directory for the files commands write (reports, plots).
pub fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("s2mmu-cli-tests-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("scratch directory");
    d
}

/// What one run did.
#[derive(Debug)]
pub struct Outcome {
    /// The exit code; `None` when killed (by us after its first output, or
    /// by a signal).
    pub code: Option<i32>,
    /// Killed by us: it was still running after its first output, or when
    /// the deadline passed.
    pub killed: bool,
    /// When its first byte on stdout or stderr came, if one did.
    pub first_output: Option<Duration>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// Why this run breaks the bounds (panic, abort, or silence for longer
    /// than [`FIRST_OUTPUT`]), if it does.
    pub fn violation(&self) -> Option<String> {
        if self.code == Some(101) || self.stderr.contains("panicked") {
            return Some(format!("panicked: {}", tail(&self.stderr)));
        }
        if self.code.is_none() && !self.killed {
            return Some(format!("killed by a signal: {}", tail(&self.stderr)));
        }
        match self.first_output {
            Some(t) if t <= FIRST_OUTPUT => None,
            Some(t) => Some(format!("first output after {t:?}")),
            None if self.killed => Some(format!("silent for {FIRST_OUTPUT:?}")),
            None => Some("exited without a word".into()),
        }
    }
}

fn tail(s: &str) -> String {
    let t: Vec<&str> = s.lines().take(3).collect();
    t.join(" | ")
}

/// Runs `s2mmu args` in the scratch directory; kills it as soon as it has
/// written its first output (or at the [`FIRST_OUTPUT`] deadline) unless it
/// exits first. Only the child this call started is killed.
pub fn first_words(args: &[&str]) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .current_dir(scratch())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("s2mmu starts");
    let start = Instant::now();
    let first: Arc<Mutex<Option<Duration>>> = Arc::new(Mutex::new(None));
    let reader = |mut r: Box<dyn Read + Send>| {
        let first = first.clone();
        thread::spawn(move || {
            let mut all = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                first.lock().unwrap().get_or_insert(start.elapsed());
                all.extend_from_slice(&buf[..n]);
            }
            String::from_utf8_lossy(&all).into_owned()
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout")));
    let err = reader(Box::new(child.stderr.take().expect("stderr")));
    let mut killed = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        let spoke = first.lock().unwrap().is_some();
        if spoke || start.elapsed() > FIRST_OUTPUT {
            // Give a command that is about to finish a moment, then stop it.
            thread::sleep(Duration::from_millis(200));
            if let Some(s) = child.try_wait().expect("wait") {
                break Some(s);
            }
            let _ = child.kill();
            let _ = child.wait();
            killed = true;
            break None;
        }
        thread::sleep(Duration::from_millis(10));
    };
    let ended = start.elapsed();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    // A command that exited may be read after `try_wait` saw it end: its
    // words came no later than its end.
    let said = !stdout.is_empty() || !stderr.is_empty();
    let first_output = first
        .lock()
        .unwrap()
        .map(|t| t.min(ended))
        .or(said.then_some(ended));
    Outcome {
        code: status.and_then(|s| s.code()),
        killed,
        first_output,
        stdout,
        stderr,
    }
}

/// Every value of a boundary pass over `flag` of `cmd` (with `base`, the
/// small companions that keep a valid run short): the failures, one line
/// each.
pub fn boundary(cmd: &str, base: &[&str], flag: &str, values: &[&str]) -> Vec<String> {
    let mut bad = Vec::new();
    for v in values {
        let mut args = vec![cmd];
        args.extend_from_slice(base);
        args.push(flag);
        args.push(v);
        let o = first_words(&args);
        if let Some(why) = o.violation() {
            bad.push(format!("s2mmu {}: {why}", args.join(" ")));
        }
    }
    bad
}

/// The values every numeric flag is tried with, around `max`.
pub fn around(max: &str, max_plus_one: &str) -> Vec<String> {
    [
        "0",
        "1",
        max,
        max_plus_one,
        "18446744073709551615",
        "18446744073709551616",
        "-1",
        "12x",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `s2mmu args` run to completion (in the current directory).
pub fn output(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_s2mmu"))
        .args(args)
        .output()
        .expect("the s2mmu binary runs")
}

/// `base` followed by `extra`: one variant of a command line.
pub fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

/// Runs `args`, which must succeed, and returns its stdout; fails with
/// its stderr otherwise.
pub fn succeeds(args: &[&str]) -> String {
    let out = output(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `args` (a `--json` command line), which must succeed and print
/// one JSON object; returns it.
pub fn json_of(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&succeeds(args))
        .unwrap_or_else(|e| panic!("{args:?}: not one JSON object: {e}"))
}

/// Runs `args`, which must fail with a message naming `named` on stderr.
pub fn fails_naming(args: &[&str], named: &str) {
    let out = output(args);
    assert!(!out.status.success(), "{args:?} accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(named), "{args:?}: names {named}: {err}");
}

/// Fails the test, with the reason, when the Linux guest cannot run (the
/// tests are ignored by their cfg where the build found it cannot).
pub fn require_linux() {
    let why = match s2mmu_arm64::available() {
        Err(e) => e.to_string(),
        Ok(()) => {
            let opts = s2mmu_arm64::linux::assets::AssetOptions::from_env();
            match s2mmu_arm64::linux::assets::ensure(&opts) {
                Ok(_) => return,
                Err(e) => e.to_string(),
            }
        }
    };
    panic!("the build found the Linux guest but it cannot run now: {why}");
}

/// Starts `c`, an `s2mmu migrate --listen ADDR`, with its stderr piped,
/// and reads that stderr until the destination says the address it
/// listens on. Returns the child, the address and the rest of its stderr
/// for the caller to read. The caller waits for the child.
#[allow(clippy::zombie_processes)]
pub fn spawn_listening(c: &mut Command) -> (Child, String, BufReader<ChildStderr>) {
    let mut child = c
        .stderr(Stdio::piped())
        .spawn()
        .expect("the destination starts");
    let mut err = BufReader::new(child.stderr.take().expect("its stderr"));
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).expect("its stderr reads") > 0,
            "the destination exited early"
        );
        if let Some(rest) = line.split("destination listening on ").nth(1) {
            let addr = rest.split_whitespace().next().unwrap_or_default();
            return (child, addr.to_string(), err);
        }
    }
}
