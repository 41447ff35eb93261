//! A minimum rate a peer must keep: the time spent waiting on it against
//! the bytes it moved. The reader's record deadline
//! ([`crate::wire::MIN_RATE`]) and the writes' rate
//! ([`crate::transport::WritePace`]) both count with it.

use std::time::Duration;

/// The time spent waiting on a peer, against the bytes it moved: the
/// wait may not exceed `grace` plus those bytes at `min_rate` bytes per
/// second (a minimum rate, not a deadline per read or write).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pace {
    grace: Duration,
    min_rate: u64,
    /// What the peer did, for the error: "the peer {verb} N {unit} in T".
    verb: &'static str,
    unit: &'static str,
    waited: Duration,
    bytes: u64,
}

impl Pace {
    /// An empty account: `grace`, then `min_rate` bytes per second (at
    /// least 1); `verb` and `unit` word the error ("sent", "bytes of a
    /// record").
    pub(crate) fn new(
        grace: Duration,
        min_rate: u64,
        verb: &'static str,
        unit: &'static str,
    ) -> Self {
        Pace {
            grace,
            min_rate: min_rate.max(1),
            verb,
            unit,
            waited: Duration::ZERO,
            bytes: 0,
        }
    }

    /// The grace before the rate counts.
    #[cfg(test)]
    fn grace(&self) -> Duration {
        self.grace
    }

    /// Bytes counted since the account began.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The same account, empty again.
    pub(crate) fn restart(&mut self) {
        *self = Pace::new(self.grace, self.min_rate, self.verb, self.unit);
    }

    /// Counts `n` bytes after a wait of `took`.
    ///
    /// # Errors
    /// `TimedOut` once the time waited exceeds the grace plus the bytes
    /// at the minimum rate, naming both.
    pub(crate) fn record(&mut self, n: usize, took: Duration) -> std::io::Result<()> {
        self.waited += took;
        self.bytes += n as u64;
        let allowed =
            self.grace + Duration::from_secs_f64(self.bytes as f64 / self.min_rate as f64);
        if self.waited > allowed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the peer {} {} {} in {:?}, slower than {} KiB/s",
                    self.verb,
                    self.bytes,
                    self.unit,
                    self.waited,
                    self.min_rate >> 10
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_wait_within_grace_and_rate_passes() {
        let mut p = Pace::new(100 * MS, 1 << 20, "sent", "bytes");
        // 1 MiB earns one second on top of the grace.
        p.record(1 << 20, 1000 * MS).unwrap();
        p.record(0, 100 * MS).unwrap();
        assert_eq!(p.bytes(), 1 << 20);
    }

    #[test]
    fn a_wait_past_the_allowance_is_timed_out_with_its_figures() {
        let mut p = Pace::new(100 * MS, 256 << 10, "sent", "bytes of a record");
        p.record(1024, 50 * MS).unwrap();
        let e = p
            .record(0, 60 * MS)
            .expect_err("110 ms for 1 KiB at 256 KiB/s + 100 ms");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            e.to_string().starts_with(
                "the peer sent 1024 bytes of a record in 110ms, slower than 256 KiB/s"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_restart_forgets_the_bytes_and_the_wait() {
        let mut p = Pace::new(100 * MS, 256 << 10, "took", "bytes");
        p.record(4096, 90 * MS).unwrap();
        p.restart();
        assert_eq!((p.bytes(), p.grace()), (0, 100 * MS));
        // Without the restart 180 ms would exceed 100 ms + 2 x 4 KiB's 15.6 ms.
        p.record(4096, 90 * MS).unwrap();
    }
}
