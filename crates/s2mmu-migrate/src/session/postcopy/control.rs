//! Operator-driven post-copy recovery (QEMU's `migrate-recover` and
//! `migrate -r`): when a post-copy connection breaks and no automatic
//! reconnect is left (`RecoveryMode::Manual`, or `Auto` after its
//! [`super::source::MAX_RECOVERIES`] tries), each process keeps its guest
//! paused with its memory intact and waits, at most `Recovery::wait`, for
//! an operator on its control socket (`Recovery::control`).
//!
//! The control socket is a Unix socket (mode 0600, created fresh) that
//! speaks one line per connection, each way (at most [`MAX_LINE`] bytes,
//! each line within [`CONTROL_IO_TIMEOUT`] as a whole; clients served
//! concurrently, at most [`MAX_CLIENTS`]). Both sides check the socket's
//! directory and the peer's credentials (`control_guard`):
//! - `status`: one JSON line: `side`, `phase` (`migrating`, `postcopy`,
//!   `paused`, `recovering`, `done`, `failed`), `pages_missing` (the
//!   destination: the pages it still lacks; the source: the pages the
//!   destination lacked when it last said, at the switch or at the last
//!   recovery), `recoveries`, `last_error`.
//! - `recover [ADDR]`, only while `paused`: the source connects again, to
//!   ADDR if given (default: the address it migrated to); the destination accepts the source's
//!   new connections on a new listener at ADDR if given (default: its
//!   listening socket). ADDR then stays the side's address for later
//!   recoveries. A connection refused while the destination waits
//!   (authentication, another session's id, garbage or a stall after
//!   authenticating) shows in `last_error` at once, and the wait goes on;
//!   a recovery whose connections fail leaves the side paused, with the
//!   reason in `last_error`.
//! - `cancel`, only while `paused`: the process gives post-copy up and
//!   exits with [`MigrateError::PostcopyBroken`], which says that the
//!   memory is split and where the pages are.
//!
//! Every other line gets `error: ...` and changes nothing.
//! `s2mmu migrate-ctl` is the client ([`request`]).

use super::control_guard::{check_dir, check_peer, read_line_within};
use crate::stream_error::MigrateError;
use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest line either side of the control socket sends, newline
/// included.
pub const MAX_LINE: usize = 512;
/// The longest address `recover ADDR` takes.
pub const MAX_ADDR: usize = 255;
/// The deadline of every read and write on the control socket.
pub const CONTROL_IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Clients served at once; one more is closed at once.
pub const MAX_CLIENTS: usize = 16;
/// The most [`Recovery::wait`] takes: a day.
pub const MAX_RECOVER_WAIT: Duration = Duration::from_secs(86_400);

/// What a side does when a post-copy connection breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Reconnect at once, a few times; then wait for an operator if there
    /// is a control socket.
    Auto,
    /// Stay paused and wait for an operator (`recover` or `cancel`).
    Manual,
}

/// A side's recovery policy.
#[derive(Clone, Debug)]
pub struct Recovery {
    pub mode: RecoveryMode,
    /// How long a paused side waits for the operator.
    pub wait: Duration,
    /// The control socket, if any.
    pub control: Option<Arc<Control>>,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            mode: RecoveryMode::Auto,
            wait: Duration::from_secs(600),
            control: None,
        }
    }
}

/// What the operator asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Resume over new connections (the source: to this address).
    Recover(Option<String>),
    /// Give post-copy up.
    Cancel,
}

/// Where a side stands, as `status` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Migrating,
    Postcopy,
    Paused,
    Recovering,
    Done,
    Failed,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Migrating => "migrating",
            Phase::Postcopy => "postcopy",
            Phase::Paused => "paused",
            Phase::Recovering => "recovering",
            Phase::Done => "done",
            Phase::Failed => "failed",
        }
    }
}

#[derive(Debug)]
struct State {
    phase: Phase,
    pages_missing: u64,
    recoveries: u32,
    last_error: String,
    command: Option<Command>,
    /// The address of the next connections (`recover ADDR`): the source
    /// connects to it, the destination listens on it.
    redirect: Option<String>,
}

/// A control socket and the state it reports; its thread serves it
/// (each client on a thread of its own) until this is dropped.
#[derive(Debug)]
pub struct Control {
    side: &'static str,
    path: PathBuf,
    state: Mutex<State>,
    cv: Condvar,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Control {
    /// Creates the socket at `path` (mode 0600) for `side` ("source" or
    /// "destination") and starts serving it. A stale socket (nobody
    /// listening) is replaced.
    ///
    /// # Errors
    /// [`MigrateError::Setup`]: the path exists and is not a socket, a
    /// process serves it already, or it cannot be created.
    pub fn start(path: &Path, side: &'static str) -> Result<Arc<Self>, MigrateError> {
        let setup =
            |why: String| MigrateError::Setup(format!("control socket {}: {why}", path.display()));
        check_dir(path).map_err(setup)?;
        if let Ok(m) = std::fs::symlink_metadata(path) {
            if !m.file_type().is_socket() {
                return Err(setup(
                    "exists and is not a socket; refusing to replace it".into(),
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(setup("a process serves this socket already".into()));
            }
            std::fs::remove_file(path)
                .map_err(|e| setup(format!("removing a stale socket: {e}")))?;
        }
        let listener = UnixListener::bind(path).map_err(|e| setup(e.to_string()))?;
        // Only this user may ask a paused migration to resume or give up.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| setup(format!("setting mode 0600: {e}")))?;
        let ctl = Arc::new(Control {
            side,
            path: path.to_path_buf(),
            state: Mutex::new(State {
                phase: Phase::Migrating,
                pages_missing: 0,
                recoveries: 0,
                last_error: String::new(),
                command: None,
                redirect: None,
            }),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let served = ctl.clone();
        let t = std::thread::Builder::new()
            .name("migrate-control".into())
            .spawn(move || Control::serve(&served, &listener))
            .map_err(|e| setup(format!("starting its thread: {e}")))?;
        *ctl.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
        Ok(ctl)
    }

    /// Stops the thread and removes the socket.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the phase and, when given, the pages missing.
    pub fn set(&self, phase: Phase, pages_missing: Option<u64>) {
        let mut s = self.lock();
        s.phase = phase;
        if let Some(n) = pages_missing {
            s.pages_missing = n;
        }
    }

    /// Records a completed recovery.
    pub fn recovered(&self, pages_missing: u64) {
        let mut s = self.lock();
        s.recoveries += 1;
        s.phase = Phase::Postcopy;
        s.pages_missing = pages_missing;
    }

    /// Records a connection refused while a recovery waits for the
    /// source's (another session's, a failed authentication, a stall):
    /// `status` shows it in `last_error` while the wait goes on.
    pub fn refused(&self, why: &str) {
        self.lock().last_error = format!("refused a recovery connection: {why}");
    }

    /// The address `recover ADDR` gave: the source connects to it, the
    /// destination listens on it.
    pub fn redirect(&self) -> Option<String> {
        self.lock().redirect.clone()
    }

    /// `status`'s JSON line.
    pub fn status_json(&self) -> String {
        let s = self.lock();
        serde_json::json!({
            "side": self.side,
            "phase": s.phase.name(),
            "pages_missing": s.pages_missing,
            "recoveries": s.recoveries,
            "last_error": s.last_error,
        })
        .to_string()
    }

    /// Pauses: records `why` and the pages missing, and waits at most
    /// `wait` for `recover` or `cancel`. None: nothing came in time.
    fn await_command(&self, why: &str, pages_missing: u64, wait: Duration) -> Option<Command> {
        let deadline = Instant::now() + wait;
        let mut s = self.lock();
        s.phase = Phase::Paused;
        s.pages_missing = pages_missing;
        s.last_error = why.to_string();
        s.command = None;
        loop {
            if let Some(c) = s.command.take() {
                s.phase = Phase::Recovering;
                if let Command::Recover(Some(a)) = &c {
                    s.redirect = Some(a.clone());
                }
                return Some(c);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.phase = Phase::Failed;
                return None;
            }
            s = self
                .cv
                .wait_timeout(s, left.min(Duration::from_millis(200)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The answer to one control line (without its newline).
    pub fn handle(&self, line: &str) -> String {
        let mut words = line.split_ascii_whitespace();
        let cmd = words.next().unwrap_or("");
        let arg = words.next();
        if words.next().is_some() {
            return format!("error: too many words in {line:?} (status, recover [ADDR], cancel)");
        }
        let command = match (cmd, arg) {
            ("status", None) => return self.status_json(),
            ("recover", None) => Command::Recover(None),
            ("recover", Some(a)) if a.len() > MAX_ADDR => {
                return format!(
                    "error: an address of {} bytes (at most {MAX_ADDR})",
                    a.len()
                )
            }
            ("recover", Some(a)) => Command::Recover(Some(a.to_string())),
            ("cancel", None) => Command::Cancel,
            ("status" | "cancel", Some(_)) => return format!("error: {cmd} takes no argument"),
            _ => {
                return format!("error: unknown command {line:?} (status, recover [ADDR], cancel)")
            }
        };
        let mut s = self.lock();
        if s.phase != Phase::Paused || s.command.is_some() {
            return format!(
                "error: {cmd} applies to a paused post-copy; the {} is {}",
                self.side,
                if s.command.is_some() {
                    "acting on an earlier command"
                } else {
                    s.phase.name()
                }
            );
        }
        let said = match &command {
            Command::Recover(Some(a)) if self.side == "source" => {
                format!("ok: recovering, connecting to {a}")
            }
            Command::Recover(Some(a)) => format!("ok: recovering, listening on {a}"),
            Command::Recover(None) => "ok: recovering".into(),
            Command::Cancel => "ok: cancelling; the process exits with the memory split".into(),
        };
        s.command = Some(command);
        drop(s);
        self.cv.notify_all();
        said
    }

    /// Serves each client on a thread of its own (at most
    /// [`MAX_CLIENTS`] at once; one more is closed at once), so an idle or
    /// slow client delays no other; each has [`CONTROL_IO_TIMEOUT`] for
    /// its whole line.
    fn serve(ctl: &Arc<Self>, listener: &UnixListener) {
        let clients = Arc::new(AtomicUsize::new(0));
        for conn in listener.incoming() {
            if ctl.stop.load(Ordering::SeqCst) {
                return;
            }
            let Ok(c) = conn else { continue };
            // Another user's process is closed before anything is read.
            if check_peer(&c).is_err() || clients.load(Ordering::SeqCst) >= MAX_CLIENTS {
                continue;
            }
            clients.fetch_add(1, Ordering::SeqCst);
            let (ctl, n) = (ctl.clone(), clients.clone());
            let spawned = std::thread::Builder::new()
                .name("migrate-control-client".into())
                .spawn(move || {
                    // A client that misbehaves only loses its own answer.
                    let _ = ctl.serve_one(c);
                    n.fetch_sub(1, Ordering::SeqCst);
                });
            if spawned.is_err() {
                clients.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    fn serve_one(&self, c: UnixStream) -> std::io::Result<()> {
        c.set_write_timeout(Some(CONTROL_IO_TIMEOUT))?;
        let mut w = c.try_clone()?;
        let answer = match read_line(&c) {
            Ok(line) => self.handle(&line),
            Err(why) => format!("error: {why}"),
        };
        w.write_all(answer.as_bytes())?;
        w.write_all(b"\n")?;
        w.flush()
    }
}

/// Owns a [`Control`]: stops it and removes its socket when dropped.
#[derive(Debug)]
pub struct ControlSocket(pub Arc<Control>);

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// One line of at most [`MAX_LINE`] bytes (newline included), UTF-8, the
/// whole of it within [`CONTROL_IO_TIMEOUT`].
fn read_line(c: &UnixStream) -> Result<String, String> {
    read_line_within(c, MAX_LINE, CONTROL_IO_TIMEOUT)
}

/// Sends `line` to the control socket at `path` and returns its answer.
///
/// # Errors
/// A message naming the socket: absent, refused, silent past the
/// deadline, or an answer too long.
pub fn request(path: &Path, line: &str) -> Result<String, String> {
    let at = |why: String| format!("control socket {}: {why}", path.display());
    if line.len() + 1 > MAX_LINE {
        return Err(at(format!("a command of more than {MAX_LINE} bytes")));
    }
    // Nobody else could have put an impostor there.
    check_dir(path).map_err(at)?;
    let mut c = UnixStream::connect(path).map_err(|e| {
        at(if e.kind() == std::io::ErrorKind::NotFound {
            "no such socket (is the migration running with a control socket?)".into()
        } else {
            e.to_string()
        })
    })?;
    check_peer(&c).map_err(at)?;
    c.set_write_timeout(Some(CONTROL_IO_TIMEOUT))
        .map_err(|e| at(e.to_string()))?;
    c.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| at(format!("sending: {e}")))?;
    read_line(&c).map_err(|e| at(format!("the answer: {e}")))
}

/// After a post-copy connection broke and no automatic reconnect is left:
/// waits for the operator, and on `recover` runs `attempt` with the
/// address given (if any); a failed attempt pauses again. `pages` says
/// how many pages are missing as far as this side knows.
///
/// # Errors
/// Why post-copy is given up (no control socket, the wait passed,
/// `cancel`): the caller's [`MigrateError::PostcopyBroken`] names it.
pub fn await_operator<T>(
    rec: &Recovery,
    side: &str,
    first: String,
    pages: u64,
    mut attempt: impl FnMut(Option<&str>) -> Result<T, MigrateError>,
) -> Result<T, String> {
    let Some(ctl) = &rec.control else {
        return Err(format!(
            "{first}; no control socket to wait for an operator on"
        ));
    };
    let mut why = first.clone();
    loop {
        eprintln!(
            "{side}: POST-COPY PAUSED ({why}): the guest's memory is split between the two hosts ({pages} pages missing on the destination as far as this side knows); the guest stays paused here and this side's memory is kept for a recovery; waiting up to {:?} for `recover` or `cancel` on the control socket {}",
            rec.wait,
            ctl.path.display()
        );
        match ctl.await_command(&why, pages, rec.wait) {
            None => {
                return Err(format!(
                    "{why}; no operator command within the recovery wait {:?}",
                    rec.wait
                ))
            }
            Some(Command::Cancel) => {
                ctl.set(Phase::Failed, None);
                return Err(format!(
                    "{why}; cancelled by the operator (this {side} process ends; the other side stays paused until its own cancel or the end of its recovery wait)"
                ));
            }
            Some(Command::Recover(addr)) => match attempt(addr.as_deref()) {
                Ok(t) => return Ok(t),
                Err(e) => why = format!("{first}; the recovery failed: {e}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_apply_only_while_paused_and_bad_lines_change_nothing() {
        let dir = std::env::temp_dir().join(format!("s2mmu-ctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.sock");
        let ctl = Control::start(&path, "source").unwrap();
        assert!(Control::start(&path, "source").is_err(), "served already");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(ctl
            .handle("recover")
            .starts_with("error: recover applies to a paused"));
        assert!(ctl
            .handle("frobnicate")
            .starts_with("error: unknown command"));
        assert!(ctl
            .handle("status now")
            .starts_with("error: status takes no"));
        let long = "x".repeat(MAX_LINE + 10);
        let got = request(&path, &long).unwrap_err();
        assert!(got.contains("more than"), "{got}");
        // Over the socket: the server refuses the overlong line itself.
        let mut c = UnixStream::connect(&path).unwrap();
        c.write_all(format!("{long}\n").as_bytes()).unwrap();
        let answer = read_line(&c).unwrap();
        assert!(answer.contains("more than 512 bytes"), "{answer}");
        let v: serde_json::Value =
            serde_json::from_str(&request(&path, "status").unwrap()).unwrap();
        assert_eq!(v["phase"], "migrating");
        assert_eq!(v["recoveries"], 0);
        // Paused: a command is taken once.
        let waiter = {
            let ctl = ctl.clone();
            std::thread::spawn(move || ctl.await_command("cut", 7, Duration::from_secs(20)))
        };
        while !ctl.status_json().contains("\"paused\"") {
            std::thread::sleep(Duration::from_millis(5));
        }
        let v: serde_json::Value =
            serde_json::from_str(&request(&path, "status").unwrap()).unwrap();
        assert_eq!(
            (v["pages_missing"].as_u64(), v["last_error"].as_str()),
            (Some(7), Some("cut"))
        );
        assert_eq!(
            request(&path, "recover 127.0.0.1:9").unwrap(),
            "ok: recovering, connecting to 127.0.0.1:9"
        );
        assert_eq!(
            waiter.join().unwrap(),
            Some(Command::Recover(Some("127.0.0.1:9".into())))
        );
        assert_eq!(ctl.redirect().as_deref(), Some("127.0.0.1:9"));
        assert!(request(&path, "cancel").unwrap().starts_with("error:"));
        ctl.stop();
        assert!(!path.exists());
        assert!(request(&path, "status")
            .unwrap_err()
            .contains("no such socket"));
        std::fs::write(&path, b"x").unwrap();
        let e = Control::start(&path, "destination")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a socket"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
