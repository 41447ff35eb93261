//! A record's read under its deadline: the minimum rate a peer must keep
//! once a record's first byte came, and the paced fill of a buffer.

use crate::stream_error::MigrateError;
use std::io::Read;
use std::time::{Duration, Instant};

/// The slowest a peer may send a record once its first byte came: below
/// it the record's deadline passes. A real peer sends hundreds of MiB/s;
/// one that drips bytes to hold the other side is cut off.
pub const MIN_RATE: u64 = 256 << 10;

/// A record's overall deadline: once its first byte came, the time spent
/// waiting for the rest may not exceed `grace` plus the bytes received at
/// [`MIN_RATE`] (a minimum rate, not a deadline per read). The wait for a
/// record's first byte is the socket's own I/O timeout (an idle peer).
#[derive(Clone, Copy, Debug)]
pub(super) struct Pace {
    rate: crate::pace::Pace,
    started: bool,
}

impl Pace {
    pub(super) fn new(grace: Duration) -> Self {
        Pace {
            rate: crate::pace::Pace::new(grace, MIN_RATE, "sent", "bytes of a record"),
            started: false,
        }
    }

    /// A new record: its bytes and its wait start from nothing, under the
    /// same grace.
    pub(super) fn restart(&mut self) {
        self.rate.restart();
        self.started = false;
    }

    /// One read of the record, timed.
    pub(super) fn read<R: Read>(
        &mut self,
        r: &mut R,
        f: impl FnOnce(&mut R) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let t = Instant::now();
        let n = f(r)?;
        // The wait for the record's first byte is not the peer's rate.
        let took = if self.started {
            t.elapsed()
        } else {
            Duration::ZERO
        };
        self.started |= n > 0;
        self.rate.record(n, took)?;
        Ok(n)
    }
}

/// Reads `buf` in full from `r`, paced, advancing `pos` by what was read
/// (also when it fails part-way).
pub(super) fn fill_from<R: Read>(
    r: &mut R,
    pace: &mut Pace,
    pos: &mut u64,
    buf: &mut [u8],
    inside: &'static str,
) -> Result<(), MigrateError> {
    let mut got = 0;
    while got < buf.len() {
        match pace.read(r, |r| r.read(&mut buf[got..])) {
            Ok(0) => {
                return Err(MigrateError::Truncated {
                    at_byte: *pos + got as u64,
                    inside,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                *pos += got as u64;
                return Err(MigrateError::io("receiving the migration stream", &e));
            }
        }
    }
    *pos += got as u64;
    Ok(())
}
