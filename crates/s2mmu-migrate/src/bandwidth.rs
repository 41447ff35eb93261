//! The sender's bandwidth limit: a token bucket that lets bytes out at a
//! set rate with a small burst, sleeping when the sender is ahead.

use std::time::{Duration, Instant};

/// Paces bytes to `rate` per second (0 = unlimited).
pub struct TokenBucket {
    rate: u64,
    /// When the bytes sent so far may all have left at `rate`.
    next_free: Instant,
    burst: Duration,
}

impl TokenBucket {
    /// A bucket for `rate` bytes per second (0: no limit).
    pub fn new(rate: u64) -> Self {
        TokenBucket {
            rate,
            next_free: Instant::now(),
            burst: Duration::from_millis(2),
        }
    }

    /// The limit in bytes per second (0: none).
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Accounts for `bytes` about to be sent; sleeps while the sender is
    /// more than the burst ahead of the rate.
    pub fn take(&mut self, bytes: u64) {
        if self.rate == 0 {
            return;
        }
        let now = Instant::now();
        // Idle time does not bank an unbounded burst.
        if self.next_free + self.burst < now {
            self.next_free = now;
        }
        self.next_free += Duration::from_nanos(bytes.saturating_mul(1_000_000_000) / self.rate);
        if self.next_free > now + self.burst {
            std::thread::sleep(self.next_free - now - self.burst);
        }
    }
}
