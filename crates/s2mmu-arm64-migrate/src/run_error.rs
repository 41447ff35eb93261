//! Why a run of `s2mmu migrate --guest linux` ([`crate::session_run`])
//! failed: which step, on which machine, and the underlying error (the
//! session's own [`MigrateError`] kept whole, so a caller can tell a
//! refused peer from a broken post-copy).

use s2mmu_migrate::stream_error::MigrateError;
use std::fmt;
use std::time::Duration;

/// A failed Linux migration run.
#[derive(Debug)]
pub enum LinuxRunError {
    /// A QEMU machine did not start, boot, pause, resume or shut down
    /// (`machine`: "machine A", "machine B", "the destination's guest").
    Machine {
        /// Which machine.
        machine: &'static str,
        /// What went wrong.
        error: String,
    },
    /// Binding the listening address failed.
    Bind {
        /// The address asked for.
        addr: String,
        /// Why.
        error: MigrateError,
    },
    /// The destination's serving thread could not start or panicked.
    Thread(String),
    /// The migration session failed on one side (`side`: "source" or
    /// "destination").
    Session {
        /// Which side reported it.
        side: &'static str,
        /// The session's error.
        error: MigrateError,
    },
    /// Every source a listening destination served failed.
    Attempts {
        /// Attempts that failed.
        failures: u32,
        /// `--attempts`.
        attempts: u32,
        /// The last one's error.
        last: MigrateError,
    },
    /// The session ended but built no destination guest.
    NoGuest,
    /// A guest program failed its own check: its FAIL line.
    GuestCheck {
        /// Which machine.
        machine: &'static str,
        /// The line.
        line: String,
    },
    /// The guest stopped before it showed what was waited for.
    GuestStopped {
        /// Which machine.
        machine: &'static str,
        /// Why it stopped, as the VM reports it.
        reason: String,
    },
    /// The migrated guest did not go on as it must: the counter skipped
    /// or went back, or the source's guest printed after the switch.
    WentWrong(String),
    /// The migration failed (`error`) before the destination's guest
    /// ran, and the source's guest, resumed (or never paused), went on.
    SourceResumed {
        /// What failed.
        error: Box<LinuxRunError>,
        /// How the source's guest showed it went on.
        went_on: String,
    },
    /// The migration failed (`error`) and the source's guest, resumed,
    /// did not go on (`why`).
    SourceStuck {
        /// What failed.
        error: Box<LinuxRunError>,
        /// Why the source's guest did not go on.
        why: Box<LinuxRunError>,
    },
    /// What was waited for did not show within the limit.
    Timeout {
        /// Which machine.
        machine: &'static str,
        /// The limit.
        limit: Duration,
    },
}

impl fmt::Display for LinuxRunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinuxRunError::Machine { machine, error } => write!(f, "{machine}: {error}"),
            LinuxRunError::Bind { addr, error } => write!(f, "binding {addr}: {error}"),
            LinuxRunError::Thread(why) => write!(f, "the destination's thread: {why}"),
            LinuxRunError::Session { side, error } => write!(f, "{side}: {error}"),
            LinuxRunError::Attempts {
                failures,
                attempts,
                last,
            } => write!(
                f,
                "the migration failed ({failures} of --attempts {attempts}): {last}"
            ),
            LinuxRunError::NoGuest => write!(f, "the destination built no guest"),
            LinuxRunError::GuestCheck { machine, line } => {
                write!(f, "{machine}: the guest program failed its check: {line}")
            }
            LinuxRunError::GuestStopped { machine, reason } => {
                write!(f, "{machine}: the guest stopped ({reason})")
            }
            LinuxRunError::WentWrong(why) => f.write_str(why),
            LinuxRunError::SourceResumed { error, went_on } => write!(
                f,
                "{error}; the migration failed and the source's guest was resumed: {went_on}"
            ),
            LinuxRunError::SourceStuck { error, why } => write!(
                f,
                "{error}; the migration failed and the source's guest, resumed, did not go on: {why}"
            ),
            LinuxRunError::Timeout { machine, limit } => {
                write!(f, "{machine}: not seen after {} s", limit.as_secs())
            }
        }
    }
}

impl std::error::Error for LinuxRunError {}

/// The CLI reports errors as text.
impl From<LinuxRunError> for String {
    fn from(e: LinuxRunError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::LinuxRunError;
    use crate::session_run::{self, GuestProgram, ListenEvent, RunSettings};
    use s2mmu_arm64::linux::dirty::HarvestConfig;
    use s2mmu_arm64::linux::vm::LinuxConfig;
    use s2mmu_migrate::session::dest::DestConfig;
    use s2mmu_migrate::session::source::SourceConfig;
    use s2mmu_migrate::transport::NetConfig;
    use std::time::Duration;

    /// A listening destination on an address that cannot be bound fails
    /// with the typed error, naming the address, before any QEMU starts.
    #[test]
    fn listen_on_a_bad_address_is_a_bind_error() {
        let s = RunSettings {
            vcpus: 1,
            mem: 128 << 20,
            program: GuestProgram::Counter,
            postcopy: None,
            session: SourceConfig::default(),
            dest: DestConfig::with_run_after(Duration::ZERO),
            net: NetConfig::plain(Duration::from_secs(1)),
            attempts: 1,
            ram_pages: Default::default(),
            engine: Default::default(),
            hardware_dirty: false,
        };
        let cfg = LinuxConfig {
            vcpus: 1,
            mem: 128 << 20,
            kernel: Default::default(),
            initrd: Default::default(),
            cmdline: String::new(),
            echo: false,
            timeout: Duration::from_secs(1),
            dirty: HarvestConfig::default(),
            ram_pages: Default::default(),
            engine: Default::default(),
        };
        let mut events = 0;
        let e = session_run::listen(&s, &cfg, "256.0.0.1:1", &mut |_: ListenEvent<'_>| {
            events += 1
        })
        .expect_err("no such address");
        assert!(
            matches!(&e, LinuxRunError::Bind { addr, .. } if addr == "256.0.0.1:1"),
            "{e:?}"
        );
        assert!(String::from(e).starts_with("binding 256.0.0.1:1: "));
        assert_eq!(events, 0, "nothing was served");
    }
}
