//! The source's migration settings (policy and presentation; the guest
//! itself is the caller's) and their checks.

use super::super::guest::GuestShape;
pub use super::super::policy::{Converge, Harvest};
use super::super::postcopy::Postcopy;
use super::super::progress::Progress;
use crate::stream_error::MigrateError;
use crate::wire::{Compression, MAX_CHANNELS, MAX_MEM, MAX_SLOTS, MAX_VCPUS, PAGE_SIZE};
use std::time::Duration;

/// How the source migrates: policy, presentation, the work beside it.
/// The guest is the caller's ([`super::super::guest::SourceGuest`]).
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// How dirty pages are collected.
    pub harvest: Harvest,
    /// Bytes cleared per `clear_dirty_log` call (bitmap harvest).
    pub clear_chunk: u64,
    /// Downtime budget.
    pub max_downtime: Duration,
    /// Pre-copy rounds after the first before giving up.
    pub max_rounds: u32,
    /// Link limit in bytes per second (0: none).
    pub bandwidth: u64,
    /// Convergence help.
    pub converge: Converge,
    /// Byte-compare all of memory after the resume.
    pub verify_full: bool,
    /// How long the guest runs before logging starts (its speed then is
    /// the reference for the slowdown).
    pub warmup: Duration,
    /// Interval of the throughput timeline.
    pub sample_every: Duration,
    /// Where the progress lines go (the link, a line per round, the
    /// resume), one step per round: a callback, or nowhere
    /// ([`Progress::off`]).
    pub progress: Progress,
    /// Name of this run in progress lines.
    pub label: String,
    /// Connections the pages are spread over.
    pub channels: u16,
    /// Choose `channels` by measurement instead (the channel count chosen by measurement): the
    /// count whose probe of round 0's pipeline was fastest.
    pub auto_channels: Option<super::auto_channels::AutoChannels>,
    /// When to switch to post-copy.
    pub postcopy: Postcopy,
    /// What post-copy does when a connection breaks.
    pub recovery: super::super::postcopy::control::Recovery,
    /// Measure the link before the migration by sending as many bytes as
    /// guest memory over the run's channels (the figure a wire benchmark
    /// compares round 0 with). Off, the source sends an empty probe and
    /// the migration carries the guest's pages and nothing of that size
    /// besides.
    pub link_probe: bool,
    /// The guest image's identity the HEADER carries
    /// ([`crate::wire::Header::image`]), when the guest has one.
    pub image: Option<[u8; crate::wire::IMAGE_ID_LEN]>,
    /// When pages go compressed on the stream (every data channel and
    /// post-copy's answers): by default `auto`, when the link is the
    /// bottleneck and pages compress (see [`Compression`]).
    pub compression: Compression,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            harvest: Harvest::Bitmap,
            clear_chunk: 64 << 20,
            max_downtime: Duration::from_millis(300),
            max_rounds: 30,
            bandwidth: 0,
            converge: Converge::Auto,
            verify_full: false,
            warmup: Duration::from_millis(500),
            sample_every: Duration::from_millis(50),
            progress: Progress::off(),
            label: String::new(),
            channels: 1,
            auto_channels: None,
            postcopy: Postcopy::Off,
            recovery: super::super::postcopy::control::Recovery::default(),
            link_probe: false,
            image: None,
            compression: Compression::Auto,
        }
    }
}

/// Checks the guest's shape against the stream's bounds.
///
/// # Errors
/// [`MigrateError::Setup`] naming what is out of range.
pub fn validate_shape(shape: &GuestShape) -> Result<(), MigrateError> {
    let page = PAGE_SIZE as u64;
    let vcpus = u64::from(shape.vcpus);
    if vcpus == 0 || shape.vcpus > MAX_VCPUS || shape.mem_size < vcpus * page {
        return Err(MigrateError::Setup(format!(
            "{} bytes of guest memory cannot hold a page for each of {} vCPUs (1 to {MAX_VCPUS})",
            shape.mem_size, shape.vcpus
        )));
    }
    if shape.mem_size > MAX_MEM || shape.slots == 0 || shape.slots > MAX_SLOTS {
        return Err(MigrateError::Setup(format!(
            "a guest of {} bytes in {} slots: at most {MAX_MEM} bytes, 1 to {MAX_SLOTS} slots",
            shape.mem_size, shape.slots
        )));
    }
    Ok(())
}

/// Checks `cfg` before anything is allocated or started.
///
/// # Errors
/// [`MigrateError::Setup`] naming the setting out of range or the
/// combination not supported.
pub fn validate(cfg: &SourceConfig) -> Result<(), MigrateError> {
    if cfg.postcopy != Postcopy::Off && cfg.verify_full {
        return Err(MigrateError::Setup(
            "post-copy and verify-full: the byte comparison needs the memory the guest resumed from; post-copy checks the destination against this memory plus its guest's writes".into(),
        ));
    }
    if cfg.channels == 0 || cfg.channels > MAX_CHANNELS {
        return Err(MigrateError::Setup(format!(
            "{} channels: use 1 to {MAX_CHANNELS}",
            cfg.channels
        )));
    }
    if let Some(a) = &cfg.auto_channels {
        a.validate()?;
    }
    Ok(())
}
