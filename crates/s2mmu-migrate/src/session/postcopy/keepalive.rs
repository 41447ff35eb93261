//! The PROGRESS keepalives one post-copy connection accepts from its peer,
//! bounded in count and in rate.
//!
//! While no vCPU faults, the destination sends a PROGRESS every quarter of
//! its I/O deadline on the request connection, and the source echoes each
//! on the answer connection, so that neither side's reader times out. A
//! peer that authenticated can still send them as fast as it likes (each
//! one an echo and a flush on the source) or for ever (a post-copy that
//! never ends): each connection takes at most [`KEEPALIVE_BURST`] at once,
//! refilled at one per [`KEEPALIVE_GAP`], and [`MAX_KEEPALIVES`] in all.

use crate::stream_error::MigrateError;
use std::time::{Duration, Instant};

/// Keepalives a connection takes back to back. A sender's beats that a
/// stalled link delivered together arrive as one burst.
pub const KEEPALIVE_BURST: u32 = 16;

/// The refill of the burst: one keepalive per this much time. The
/// destination's beat is a quarter of its I/O deadline, 25 ms at the
/// command's shortest (100 ms): two and a half times this gap.
pub const KEEPALIVE_GAP: Duration = Duration::from_millis(10);

/// Keepalives a connection takes in all. At the destination's beat (four
/// per I/O deadline) a post-copy lasts 262,144 deadlines before it is
/// reached (3.6 days at 1.2 s); at the most the rate lets through, 2.9
/// hours.
pub const MAX_KEEPALIVES: u64 = 1 << 20;

/// The keepalive budget of one connection (see the module documentation).
#[derive(Debug)]
pub struct Keepalives {
    /// What the errors name: too many in all, too many at once.
    over_count: &'static str,
    over_rate: &'static str,
    count: u64,
    /// Keepalives the burst has left.
    tokens: u32,
    /// When the last token was added (or the budget began).
    refilled: Instant,
}

impl Keepalives {
    /// A full budget for the request connection (the source reads it),
    /// from `now`.
    pub fn request(now: Instant) -> Self {
        Self::new(
            "PROGRESS keepalives on the request connection",
            "PROGRESS keepalives back to back on the request connection (one more per 10 ms)",
            now,
        )
    }

    /// A full budget for the answer connection (the destination reads it),
    /// from `now`.
    pub fn answer(now: Instant) -> Self {
        Self::new(
            "PROGRESS keepalives on the answer connection",
            "PROGRESS keepalives back to back on the answer connection (one more per 10 ms)",
            now,
        )
    }

    fn new(over_count: &'static str, over_rate: &'static str, now: Instant) -> Self {
        Keepalives {
            over_count,
            over_rate,
            count: 0,
            tokens: KEEPALIVE_BURST,
            refilled: now,
        }
    }

    /// Keepalives taken so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Takes one keepalive that arrived at `now`.
    ///
    /// # Errors
    /// [`MigrateError::OverLimit`] when it is one more than the connection
    /// takes in all, or one more than its burst while the burst is empty.
    pub fn take(&mut self, now: Instant) -> Result<(), MigrateError> {
        if self.count >= MAX_KEEPALIVES {
            return Err(MigrateError::OverLimit {
                what: self.over_count,
                asked: self.count + 1,
                allowed: MAX_KEEPALIVES,
            });
        }
        let gap = KEEPALIVE_GAP.as_nanos();
        let due = now.saturating_duration_since(self.refilled).as_nanos() / gap;
        if due > 0 {
            let add = u32::try_from(due).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(add).min(KEEPALIVE_BURST);
            // Whole gaps only: the rest of one counts towards the next.
            let used = Duration::from_nanos(u64::try_from(due * gap).unwrap_or(u64::MAX));
            self.refilled = self.refilled.checked_add(used).unwrap_or(now).min(now);
        }
        if self.tokens == 0 {
            return Err(MigrateError::OverLimit {
                what: self.over_rate,
                asked: u64::from(KEEPALIVE_BURST) + 1,
                allowed: u64::from(KEEPALIVE_BURST),
            });
        }
        self.tokens -= 1;
        self.count += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_beyond_its_size_is_refused_by_name() {
        let t0 = Instant::now();
        let mut k = Keepalives::request(t0);
        for _ in 0..KEEPALIVE_BURST {
            k.take(t0).unwrap();
        }
        let e = k.take(t0).unwrap_err();
        assert!(
            matches!(e, MigrateError::OverLimit { what, allowed: 16, .. }
                if what.contains("back to back on the request connection")),
            "{e}"
        );
        assert_eq!(k.count(), u64::from(KEEPALIVE_BURST));
    }

    #[test]
    fn the_burst_refills_at_one_per_gap_and_not_beyond_its_size() {
        let t0 = Instant::now();
        let mut k = Keepalives::answer(t0);
        for _ in 0..KEEPALIVE_BURST {
            k.take(t0).unwrap();
        }
        // Three gaps later: three more, not a fourth.
        let t1 = t0 + KEEPALIVE_GAP * 3 + KEEPALIVE_GAP / 2;
        for _ in 0..3 {
            k.take(t1).unwrap();
        }
        let e = k.take(t1).unwrap_err().to_string();
        assert!(e.contains("answer connection"), "{e}");
        // A long quiet refills the burst, never more than it.
        let t2 = t1 + KEEPALIVE_GAP * 1000;
        for _ in 0..KEEPALIVE_BURST {
            k.take(t2).unwrap();
        }
        assert!(k.take(t2).is_err());
        // The half gap left over at t1 counts: half a gap on, one more.
        let mut k = Keepalives::request(t0);
        for _ in 0..KEEPALIVE_BURST {
            k.take(t0).unwrap();
        }
        k.take(t1).unwrap();
        k.take(t1).unwrap();
        k.take(t1).unwrap();
        k.take(t1 + KEEPALIVE_GAP / 2).unwrap();
    }

    #[test]
    fn a_sender_at_the_destinations_beat_is_never_refused_until_the_count() {
        let t0 = Instant::now();
        let mut k = Keepalives::request(t0);
        // The beat at the shortest I/O deadline: 25 ms.
        let beat = Duration::from_millis(25);
        for i in 0..10_000u32 {
            k.take(t0 + beat * i).unwrap();
        }
        k.count = MAX_KEEPALIVES;
        let e = k.take(t0 + beat * 10_001).unwrap_err();
        assert!(
            matches!(e, MigrateError::OverLimit { asked, allowed: MAX_KEEPALIVES, .. }
                if asked == MAX_KEEPALIVES + 1),
            "{e}"
        );
    }
}
