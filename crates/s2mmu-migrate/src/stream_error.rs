//! Why a migration failed: every variant names what was wrong and where.

use std::fmt;

/// A failed migration.
#[derive(Debug, Clone, PartialEq)]
pub enum MigrateError {
    /// A socket or file operation failed.
    Io { what: String, error: String },
    /// The peer sent or took nothing for longer than the I/O timeout: it
    /// is stopped, stalled, or gone.
    Timeout { what: String },
    /// The stream asks for more than the destination's own options allow.
    OverLimit {
        what: &'static str,
        asked: u64,
        allowed: u64,
    },
    /// The vCPU state does not describe a guest that fits the destination's
    /// memory.
    BadState { why: String },
    /// The peer failed authentication (TLS or the pre-shared key); nothing
    /// of the guest was sent or written.
    Auth { why: String },
    /// The stream ended before it was complete.
    Truncated { at_byte: u64, inside: &'static str },
    /// The stream does not start with this format's magic.
    BadMagic { found: [u8; 8] },
    /// The stream's format version is not the one this build reads.
    Version { found: u16, supported: u16 },
    /// The stream's guest runs on another stage-2 format than the one the
    /// destination was started with (its configured format).
    FormatMismatch {
        /// The format the stream's HEADER names (the source's).
        stream: &'static str,
        /// The destination's own.
        destination: &'static str,
    },
    /// The stream's guest has a shape this destination cannot build (its
    /// image is not the one the destination was told to expect, say).
    ShapeMismatch {
        /// What differs.
        what: &'static str,
        /// The stream's (the source's) value.
        stream: String,
        /// The destination's.
        destination: String,
    },
    /// A page's checksum does not match its data.
    PageChecksum { gpa: u64, at_byte: u64 },
    /// A compressed page's bytes are not a page: a length out of bounds,
    /// bytes that do not decode, or decode to another size.
    BadCompressedPage { gpa: u64, at_byte: u64, why: String },
    /// A record's checksum does not match its contents.
    RecordChecksum { record: &'static str, at_byte: u64 },
    /// A record tag this format does not have.
    UnknownRecord { tag: u8, at_byte: u64 },
    /// A record whose contents do not make sense.
    Malformed {
        record: &'static str,
        at_byte: u64,
        why: String,
    },
    /// A page outside the destination's guest memory.
    PageOutOfRange { gpa: u64, at_byte: u64 },
    /// The stream ended properly but some guest pages never arrived.
    Incomplete {
        missing_pages: u64,
        first_missing_gpa: u64,
    },
    /// After the migration, a slot of the destination differs from the
    /// source's.
    MemoryMismatch { slot: u16, detail: String },
    /// Pre-copy could not reach the downtime budget.
    NotConverged {
        rounds: u32,
        dirty_rate_mib_s: f64,
        guest_writes_per_s: f64,
        bandwidth_mib_s: f64,
        remaining_mib: f64,
        max_downtime_ms: f64,
    },
    /// The source gave up and told the destination.
    Aborted { reason: String },
    /// The destination refused the stream and told the source.
    Rejected { reason: String },
    /// No connection of this migration joined within the wait (further
    /// channels, a post-copy recovery); the ones that came were refused.
    JoinRefused {
        wait: std::time::Duration,
        /// Connections refused.
        refused: u64,
        /// Why the last was refused.
        last: String,
    },
    /// Post-copy broke after the destination resumed: the guest's memory
    /// is split between the two hosts.
    PostcopyBroken {
        /// Which side saw what.
        why: String,
        /// Pages the destination still lacked when it broke (None: the
        /// side reporting does not know).
        missing_pages: Option<u64>,
    },
    /// The TLS layer refused a record after authentication: the stream
    /// was damaged or forged in transit (a failed integrity check, an
    /// unexpected message). Never a failed authentication.
    StreamDamaged { what: String, why: String },
    /// Options or the VM could not be set up.
    Setup(String),
    /// `SourceExtras::check`: pages whose content changed that no dirty log reported
    /// (the destination is not resumed; the source guest keeps running).
    LostWrites { pages: u64, first_gpa: u64 },
    /// `SourceExtras::snapshot_every`: a snapshot could not be taken or restored.
    Snapshot(String),
    /// The source's own guest stopped (powered off, reset, failed) before
    /// the switch: there is no running guest to move, and the destination
    /// was not resumed.
    SourceGuestStopped { why: String },
}

impl MigrateError {
    /// The source's ABORT, its body the reason (escaped: the peer's
    /// text never reaches a terminal or a log as control characters).
    pub fn aborted(body: &[u8]) -> Self {
        MigrateError::Aborted {
            reason: peer_text(body),
        }
    }

    /// The destination's REJECTED, its body the reason (escaped).
    pub fn rejected(body: &[u8]) -> Self {
        MigrateError::Rejected {
            reason: peer_text(body),
        }
    }

    /// An I/O error while doing `what`; a socket deadline that passed is
    /// [`MigrateError::Timeout`]. After a handshake, TLS reports a damaged
    /// or forged record as `InvalidData`: that is
    /// [`MigrateError::StreamDamaged`], never [`MigrateError::Auth`] (only
    /// the handshake's own errors are authentication failures, and the
    /// handshake classifies those itself).
    pub fn io(what: impl Into<String>, e: &std::io::Error) -> Self {
        use std::io::ErrorKind::{InvalidData, TimedOut, WouldBlock};
        if matches!(e.kind(), WouldBlock | TimedOut) {
            // A deadline of our own (a record's minimum rate, a
            // handshake's overall deadline) says which.
            let what = match e.get_ref() {
                Some(why) => format!("{} ({why})", what.into()),
                None => what.into(),
            };
            return MigrateError::Timeout { what };
        }
        if e.kind() == InvalidData {
            return MigrateError::StreamDamaged {
                what: what.into(),
                why: e.to_string(),
            };
        }
        let error = if e.kind() == std::io::ErrorKind::ConnectionRefused {
            // Only a connect is refused: the peer is not there any more
            // (a destination process that ended, in a recovery).
            format!("{e}: nothing listens there (the peer's process has ended or closed its port)")
        } else {
            e.to_string()
        };
        MigrateError::Io {
            what: what.into(),
            error,
        }
    }
}

impl fmt::Display for MigrateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use MigrateError::*;
        match self {
            Io { what, error } => write!(f, "{what}: {error}"),
            Timeout { what } => write!(
                f,
                "{what}: timed out: the peer sent or accepted nothing for longer than the I/O deadline (`NetConfig::io_timeout`); it is stopped, stalled or gone"
            ),
            OverLimit {
                what,
                asked,
                allowed,
            } => write!(
                f,
                "the stream asks for {asked} {what}, this destination accepts at most {allowed}"
            ),
            BadState { why } => write!(f, "the vCPU state does not fit the guest: {why}"),
            Auth { why } => write!(f, "authentication failed: {why}"),
            Truncated { .. }
            | BadMagic { .. }
            | Version { .. }
            | FormatMismatch { .. }
            | ShapeMismatch { .. }
            | PageChecksum { .. }
            | BadCompressedPage { .. }
            | RecordChecksum { .. }
            | UnknownRecord { .. }
            | Malformed { .. }
            | PageOutOfRange { .. } => fmt_stream_damage(self, f),
            Incomplete {
                missing_pages,
                first_missing_gpa,
            } => write!(
                f,
                "incomplete memory: {missing_pages} pages never arrived (first at gpa {first_missing_gpa:#x}); the guest is not resumed"
            ),
            MemoryMismatch { slot, detail } => write!(
                f,
                "VERIFICATION FAILED: destination memory differs from source in slot {slot}: {detail}"
            ),
            NotConverged {
                rounds,
                dirty_rate_mib_s,
                guest_writes_per_s,
                bandwidth_mib_s,
                remaining_mib,
                max_downtime_ms,
            } => write!(
                f,
                "did not converge: dirty rate {dirty_rate_mib_s:.1} MiB/s (the guest writes {guest_writes_per_s:.0} times a second) against bandwidth {bandwidth_mib_s:.1} MiB/s after {rounds} rounds; {remaining_mib:.1} MiB would remain for a {max_downtime_ms:.0} ms downtime budget. The source guest keeps running; the destination was not resumed"
            ),
            Aborted { reason } => write!(f, "the source aborted the migration: {reason}"),
            Rejected { reason } => write!(f, "the destination rejected the migration: {reason}"),
            JoinRefused {
                wait,
                refused,
                last,
            } => write!(
                f,
                "no connection of this migration joined within {wait:?}; {refused} refused, the last because {last}"
            ),
            PostcopyBroken { why, missing_pages } => write!(
                f,
                "POST-COPY BROKE: {why}. The guest's memory is SPLIT between the two hosts: the destination ran it with {} that only the source holds. Both sides are paused; neither may resume it alone",
                missing_text(*missing_pages)
            ),
            StreamDamaged { what, why } => write!(
                f,
                "{what}: the stream was damaged in transit after authentication (TLS refused a record: {why}); the connection is dropped"
            ),
            Setup(s) => write!(f, "{s}"),
            LostWrites { pages, first_gpa } => write!(
                f,
                "lost-write check: {pages} pages changed that the dirty log did not report, the first at gpa {first_gpa:#x}; the destination was not resumed"
            ),
            Snapshot(s) => write!(f, "snapshots: {s}"),
            SourceGuestStopped { why } => fmt_source_guest_stopped(why, f),
        }
    }
}

/// [`MigrateError::SourceGuestStopped`]'s message (apart, to keep
/// `Display::fmt` short).
fn fmt_source_guest_stopped(why: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "the source's own guest stopped during the migration ({why}): there is no running guest to move; the destination was not resumed"
    )
}

/// Post-copy's missing pages in words.
fn missing_text(missing_pages: Option<u64>) -> String {
    match missing_pages {
        Some(n) => format!("{n} pages missing"),
        None => "pages missing".to_string(),
    }
}

/// The messages of a stream that is not one this destination reads, or
/// is damaged (split from `Display::fmt` to keep it short).
fn fmt_stream_damage(e: &MigrateError, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    use MigrateError::*;
    match e {
            Truncated { at_byte, inside } => {
                write!(f, "truncated stream at byte {at_byte} (inside {inside})")
            }
            BadMagic { found } => write!(
                f,
                "not an s2mmu migration stream: magic {:?}",
                String::from_utf8_lossy(found)
            ),
            Version { found, supported } => write!(
                f,
                "stream format version mismatch: stream is version {found}, this build reads version {supported}"
            ),
            FormatMismatch {
                stream,
                destination,
            } => write!(
                f,
                "stage-2 format mismatch: the stream's guest runs on format {stream}, this destination on format {destination}"
            ),
            ShapeMismatch {
                what,
                stream,
                destination,
            } => write!(
                f,
                "guest shape mismatch: the stream's {what} is {stream}, this destination builds {destination}"
            ),
            PageChecksum { gpa, at_byte } => {
                write!(f, "checksum mismatch for the page at gpa {gpa:#x} (stream byte {at_byte})")
            }
            BadCompressedPage { gpa, at_byte, why } => write!(
                f,
                "the compressed page at gpa {gpa:#x} (PAGES record at stream byte {at_byte}) is not a page: {why}"
            ),
            RecordChecksum { record, at_byte } => {
                write!(f, "checksum mismatch in the {record} record at stream byte {at_byte}")
            }
            UnknownRecord { tag, at_byte } => {
                write!(f, "corrupt stream: unknown record tag {tag:#04x} at byte {at_byte}")
            }
            Malformed {
                record,
                at_byte,
                why,
            } => write!(f, "malformed {record} record at stream byte {at_byte}: {why}"),
            PageOutOfRange { gpa, at_byte } => write!(
                f,
                "page at gpa {gpa:#x} (stream byte {at_byte}) is outside the guest's memory"
            ),
        // Only the stream errors above are sent here.
        other => write!(f, "{other:?}"),
    }
}

impl std::error::Error for MigrateError {}

/// Text a peer sent (an ABORT's or REJECTED's reason), made safe to print:
/// invalid UTF-8 replaced, and every control character (escape sequences,
/// newlines, carriage returns), every bidirectional or zero-width format
/// character and the backslash written as a Rust escape (`\u{1b}`,
/// `\n`, `\\`), so that it can neither forge log lines nor drive the
/// terminal.
pub fn peer_text(body: &[u8]) -> String {
    let mut out = String::with_capacity(body.len());
    for c in String::from_utf8_lossy(body).chars() {
        let format_char = matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}');
        if c.is_control() || c == '\\' || format_char {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
