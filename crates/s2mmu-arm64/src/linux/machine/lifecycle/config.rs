//! How to run a Linux guest ([`LinuxConfig`]) and the bounds it is
//! checked against before any machine starts.

use crate::linux::dirty::HarvestConfig;
use crate::linux::placement::Engine;
use crate::machine::RamPages;
use crate::{Arm64Error, Result};
use std::path::PathBuf;
use std::time::Duration;

/// Most vCPUs.
pub const MAX_VCPUS: usize = 4;
/// Least guest RAM.
pub const MIN_MEM: u64 = 128 << 20;
/// Most guest RAM.
pub const MAX_MEM: u64 = 4 << 30;

/// How to run a Linux guest.
#[derive(Clone)]
pub struct LinuxConfig {
    /// vCPUs, 1..=[`MAX_VCPUS`].
    pub vcpus: usize,
    /// Guest RAM bytes, [`MIN_MEM`]..=[`MAX_MEM`], a multiple of 2 MiB.
    pub mem: u64,
    /// The uncompressed arm64 `Image`.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// Kernel command line after the console settings.
    pub cmdline: String,
    /// Where the console goes besides the buffer the report reads.
    pub echo: bool,
    /// Longest the guest may run before the host stops it.
    pub timeout: Duration,
    /// Dirty logging once `/init` runs, checked against page hashes.
    pub dirty: HarvestConfig,
    /// Which host pages back the machine's RAM.
    pub ram_pages: RamPages,
    /// Where the stage-2 engine runs.
    pub engine: Engine,
}

/// Checks `cfg`'s vCPUs, RAM size and dirty logging.
///
/// # Errors
/// [`Arm64Error::Config`] naming what is out of bounds.
pub(crate) fn check(cfg: &LinuxConfig) -> Result<()> {
    if !(1..=MAX_VCPUS).contains(&cfg.vcpus) {
        return Err(Arm64Error::Config(format!(
            "vCPUs {} outside 1..={MAX_VCPUS}",
            cfg.vcpus
        )));
    }
    if !(MIN_MEM..=MAX_MEM).contains(&cfg.mem) || !cfg.mem.is_multiple_of(2 << 20) {
        return Err(Arm64Error::Config(format!(
            "guest RAM of {} bytes: must be a multiple of 2 MiB in {}M..={}G",
            cfg.mem,
            MIN_MEM >> 20,
            MAX_MEM >> 30
        )));
    }
    cfg.dirty
        .change
        .check(cfg.dirty.mode)
        .map_err(Arm64Error::Config)?;
    Ok(())
}
