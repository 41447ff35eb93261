//! The settings of choosing the channel count by measurement ([`AutoChannels`]), apart from the probe
//! (`channel_choice`) so that the source's configuration can hold them
//! without importing the sender the probe drives.

use crate::stream_error::MigrateError;
use crate::wire::PAGE_SIZE;
use std::time::Duration;

/// The most candidate counts [`AutoChannels`] tries.
pub const MAX_AUTO_CANDIDATES: usize = 8;

/// The most bytes of guest memory one count's probe sends: a few MiB, so
/// that choosing the count never costs a guest-sized transfer.
pub const MAX_AUTO_PROBE_BYTES: u64 = 16 << 20;

/// How the channel count is chosen by measurement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AutoChannels {
    /// The counts to try (1 to [`crate::wire::MAX_CHANNELS`] each, at most
    /// [`MAX_AUTO_CANDIDATES`], no repeats).
    pub candidates: Vec<u16>,
    /// The run's connections use TLS (certificates or a key): the probe
    /// seals and opens records too.
    pub tls: bool,
    /// Each count's probe ends after this long (10 ms to 10 s)...
    pub per_count: Duration,
    /// ...or this many bytes of guest memory (4 KiB to
    /// [`MAX_AUTO_PROBE_BYTES`], and at most the guest's memory), whichever
    /// comes first.
    pub max_bytes: u64,
}

impl Default for AutoChannels {
    /// 1, 2 and 4 channels, 150 ms or 8 MiB each.
    fn default() -> Self {
        AutoChannels {
            candidates: vec![1, 2, 4],
            tls: true,
            per_count: Duration::from_millis(150),
            max_bytes: 8 << 20,
        }
    }
}

impl AutoChannels {
    /// Checks the settings before anything is started.
    ///
    /// # Errors
    /// [`MigrateError::Setup`] naming the setting out of range.
    pub fn validate(&self) -> Result<(), MigrateError> {
        let bad = |what: String| Err(MigrateError::Setup(format!("auto_channels: {what}")));
        let c = &self.candidates;
        if c.is_empty() || c.len() > MAX_AUTO_CANDIDATES {
            return bad(format!(
                "{} candidate counts: use 1 to {MAX_AUTO_CANDIDATES}",
                c.len()
            ));
        }
        if let Some(n) = c.iter().find(|&&n| n == 0 || n > crate::wire::MAX_CHANNELS) {
            return bad(format!(
                "{n} channels: use 1 to {}",
                crate::wire::MAX_CHANNELS
            ));
        }
        if (1..c.len()).any(|i| c[..i].contains(&c[i])) {
            return bad("a candidate count given twice".into());
        }
        if !(Duration::from_millis(10)..=Duration::from_secs(10)).contains(&self.per_count) {
            return bad(format!("{:?} a count: use 10 ms to 10 s", self.per_count));
        }
        if !(PAGE_SIZE as u64..=MAX_AUTO_PROBE_BYTES).contains(&self.max_bytes) {
            return bad(format!(
                "{} bytes a count: use 4 KiB to {} MiB",
                self.max_bytes,
                MAX_AUTO_PROBE_BYTES >> 20
            ));
        }
        Ok(())
    }
}
