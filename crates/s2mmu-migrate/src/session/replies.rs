//! The replies the source reads from the destination, and how a failed
//! send is reported: helpers the source's phases (pre-copy, the
//! stop-and-copy, post-copy) share instead of importing each other.

use crate::stream_error::MigrateError;
use crate::transport::{BoxConn, Connection};
use crate::wire::{record_name, tag, Record, WireReader, WireWriter, DEFAULT_GRACE};
use std::time::{Duration, Instant};

/// Opens the connection for a channel (0: the main one), secured as
/// configured.
pub type Connect<'a> = dyn FnMut(u16) -> Result<BoxConn, MigrateError> + 'a;

/// Sending failed before the stream's END: tells the destination with
/// ABORT on the main connection, then returns the error to report (the
/// destination's reason when it gave up, see [`rejected_or`]).
///
/// The ABORT is what ends the destination's wait on the main connection
/// when the failure was on a further channel (a page it found damaged
/// there): it then answers at once with REJECTED and its own reason.
/// Without it both sides wait out their I/O deadlines, and the source
/// reports its own broken channel instead of the destination's reason.
pub fn abort_and_reason(e: MigrateError, main: &mut WireWriter<BoxConn>) -> MigrateError {
    // Best effort: the main connection may be the one that failed.
    let _ = main.control(tag::ABORT, e.to_string().as_bytes());
    let _ = main.flush();
    rejected_or(e, main)
}

/// The slowest a destination may back guest memory with RAM while it
/// answers PROGRESS before ACCEPT: past that, PROGRESS no longer proves
/// it is preparing.
pub const MIN_PREPARE_RATE: u64 = 32 << 20;

/// Reads the destination's next reply on the main connection, each
/// record within its deadline (the connection's I/O timeout as grace).
/// PROGRESS (the destination is still preparing `prepare_bytes` of guest
/// memory) is skipped: each one proves it alive within the I/O timeout,
/// but all of them together at most the I/O timeout plus `prepare_bytes`
/// at [`MIN_PREPARE_RATE`] (a destination answering PROGRESS for ever
/// does not hold the source for ever).
pub fn read_reply(w: &mut WireWriter<BoxConn>, prepare_bytes: u64) -> Result<Record, MigrateError> {
    let grace = w.get_mut().io_timeout().unwrap_or(DEFAULT_GRACE);
    let limit = grace + Duration::from_secs_f64(prepare_bytes as f64 / MIN_PREPARE_RATE as f64);
    let t0 = Instant::now();
    let mut rd = WireReader::replies(w.get_mut()).with_grace(grace);
    loop {
        match rd.next_record()? {
            Record::Control {
                tag: tag::PROGRESS, ..
            } if t0.elapsed() <= limit => {}
            Record::Control {
                tag: tag::PROGRESS, ..
            } => {
                return Err(MigrateError::Timeout {
                    what: format!(
                        "waiting for the destination's reply (it answered PROGRESS for {:?}, longer than preparing {prepare_bytes} bytes may take)",
                        t0.elapsed()
                    ),
                })
            }
            other => return Ok(other),
        }
    }
}

/// The destination's reply to the opening, as [`read_reply`]; a connection
/// it closed before the first byte of any reply, or answered in TLS, is
/// named for what it is, a refusal of the opening, not a truncated or
/// corrupt stream.
pub fn read_opening_reply(
    w: &mut WireWriter<BoxConn>,
    prepare_bytes: u64,
) -> Result<Record, MigrateError> {
    read_reply(w, prepare_bytes).map_err(|e| match e {
        MigrateError::Truncated { at_byte: 0, .. } => MigrateError::Rejected {
            reason: "it closed the connection at the opening without a reply (a destination \
                     that expects TLS or a pre-shared key refuses a plain-TCP source, and any \
                     destination a bad opening; its log names which)"
                .into(),
        },
        // A TLS record's type (0x15 an alert, 0x16 a handshake) where the
        // first reply's tag should be: the destination speaks TLS.
        MigrateError::UnknownRecord {
            tag: tag @ (0x15 | 0x16),
            at_byte: 0,
        } => MigrateError::Rejected {
            reason: format!(
                "it answered the opening with a TLS record (type {tag:#04x}): it expects TLS or \
                 a pre-shared key and refuses a plain-TCP source"
            ),
        },
        e => e,
    })
}

/// A reply that is not the one expected: REJECTED is the destination's
/// reason, anything else malformed.
pub fn unexpected_reply(r: Record, expected: &str) -> MigrateError {
    match r {
        Record::Control {
            tag: tag::REJECTED,
            body,
            ..
        } => MigrateError::rejected(&body),
        other => MigrateError::Malformed {
            record: "reply",
            at_byte: 0,
            why: format!("expected {expected}, got {}", record_name(&other)),
        },
    }
}

/// When sending failed because the destination gave up, its reason is the
/// better error.
pub fn rejected_or(e: MigrateError, main: &mut WireWriter<BoxConn>) -> MigrateError {
    if !matches!(e, MigrateError::Io { .. }) {
        return e;
    }
    match read_reply(main, 0) {
        Ok(Record::Control {
            tag: tag::REJECTED,
            body,
            ..
        }) => MigrateError::rejected(&body),
        _ => e,
    }
}
