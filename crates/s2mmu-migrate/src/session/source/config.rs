//! The source's settings, their checks, and the MMU policy its VM runs
//! with.

use super::super::error::MigrateError;
use super::super::postcopy::Postcopy;
use super::super::wire::{MAX_CHANNELS, MAX_MEM, MAX_SLOTS, MAX_VCPUS, PAGE_SIZE};
use crate::progress::Progress;
use crate::vm_format::FormatArg;
use s2mmu::mmu::{DirtyMode, MmuPolicy};
use s2mmu_vm::{Backing, Pattern};
use std::sync::Arc;
use std::time::Duration;

/// How dirty pages are collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Harvest {
    /// `KVM_GET_DIRTY_LOG` per round, `KVM_CLEAR_DIRTY_LOG` per chunk just
    /// before the chunk's pages are sent (QEMU's clear_bmap).
    Bitmap,
    /// Per-vCPU dirty rings, reaped whenever one fills and at each round.
    Ring,
}

/// What the source does when the guest dirties memory faster than the
/// link drains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Converge {
    /// QEMU's auto-converge: throttle the vCPUs (20 %, then +10 % per
    /// round, up to 99 %) after two rounds that dirtied more than half of
    /// what they sent.
    Auto,
    /// QEMU's dirty-limit: cap each vCPU's dirty rate (its pace) to a
    /// quarter of the link, halving it on every further such round.
    DirtyLimit,
    /// Nothing: a guest that outruns the link fails at the round limit.
    None,
}

/// The source's guest and migration settings.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// Bytes of guest memory.
    pub mem_size: u64,
    /// vCPUs running the workload.
    pub vcpus: usize,
    /// How guest memory is backed.
    pub backing: Backing,
    /// Memslots.
    pub slots: u32,
    /// The MMU's policy (dirty-log fields are set from `harvest`).
    pub policy: MmuPolicy,
    /// How dirty pages are collected.
    pub harvest: Harvest,
    /// Entries of each vCPU's dirty ring.
    pub ring_entries: u32,
    /// Bytes cleared per `clear_dirty_log` call (bitmap harvest).
    pub clear_chunk: u64,
    /// Bytes per second the whole guest dirties (0: as fast as it can).
    pub dirty_rate: u64,
    /// The guest's access pattern.
    pub pattern: Pattern,
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
    /// resume): stderr lines, a bar on a terminal, or nowhere
    /// ([`Progress::off`]); one step per round.
    pub progress: Arc<Progress>,
    /// Name of this run in progress lines.
    pub label: String,
    /// Connections the pages are spread over.
    pub channels: u16,
    /// When to switch to post-copy.
    pub postcopy: Postcopy,
    /// The lost-write check and snapshots beside the migration.
    pub extras: super::super::extras::SourceExtras,
    /// What post-copy does when a connection breaks.
    pub recovery: super::super::postcopy::control::Recovery,
    /// The stage-2 format of the guest's tables (arm64 or x86 EPT).
    pub format: FormatArg,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            mem_size: 1 << 30,
            vcpus: 2,
            backing: Backing::AnonymousThp,
            slots: 1,
            policy: MmuPolicy::default(),
            harvest: Harvest::Bitmap,
            ring_entries: 4096,
            clear_chunk: 64 << 20,
            dirty_rate: 64 << 20,
            pattern: Pattern::Sequential,
            max_downtime: Duration::from_millis(300),
            max_rounds: 30,
            bandwidth: 0,
            converge: Converge::Auto,
            verify_full: false,
            warmup: Duration::from_millis(500),
            sample_every: Duration::from_millis(50),
            progress: Arc::new(Progress::lines_only()),
            label: String::new(),
            channels: 1,
            postcopy: Postcopy::Off,
            extras: super::super::extras::SourceExtras::default(),
            recovery: super::super::postcopy::control::Recovery::default(),
            format: FormatArg::Arm64,
        }
    }
}

/// The policy the source's VM runs with: the caller's, with the dirty-log
/// mode of `cfg` (manual protect; nothing initially set, so the first
/// round sends all memory and logs what changes meanwhile).
pub fn source_policy(cfg: &SourceConfig) -> MmuPolicy {
    MmuPolicy {
        manual_protect: true,
        initially_set: false,
        dirty: if cfg.harvest == Harvest::Ring {
            DirtyMode::Ring {
                entries: cfg.ring_entries,
            }
        } else {
            DirtyMode::Bitmap
        },
        ..cfg.policy
    }
}

/// Checks `cfg` before anything is allocated or started.
///
/// # Errors
/// [`MigrateError::Setup`] naming the setting out of range or the
/// combination not supported.
pub(super) fn validate(cfg: &SourceConfig) -> Result<(), MigrateError> {
    let page = PAGE_SIZE as u64;
    if cfg.vcpus == 0 || cfg.vcpus > MAX_VCPUS as usize || cfg.mem_size < cfg.vcpus as u64 * page {
        return Err(MigrateError::Setup(format!(
            "{} bytes of guest memory cannot hold a page for each of {} vCPUs (1 to {MAX_VCPUS})",
            cfg.mem_size, cfg.vcpus
        )));
    }
    if cfg.postcopy != Postcopy::Off && cfg.verify_full {
        return Err(MigrateError::Setup(
            "post-copy and verify-full: the byte comparison needs the memory the guest resumed from; post-copy checks the destination against this memory plus its guest's writes".into(),
        ));
    }
    if cfg.postcopy != Postcopy::Off && (cfg.extras.check || cfg.extras.snapshot_every.is_some()) {
        return Err(MigrateError::Setup(
            "post-copy with --check or --snapshot-every: both check and snapshot the source's memory round by round to the stop, and after a post-copy switch the memory is split between the hosts (not supported together)".into(),
        ));
    }
    if cfg.channels == 0 || cfg.channels > MAX_CHANNELS {
        return Err(MigrateError::Setup(format!(
            "{} channels: use 1 to {MAX_CHANNELS}",
            cfg.channels
        )));
    }
    if cfg.mem_size > MAX_MEM || cfg.slots == 0 || cfg.slots > MAX_SLOTS {
        return Err(MigrateError::Setup(format!(
            "a guest of {} bytes in {} slots: at most {MAX_MEM} bytes, 1 to {MAX_SLOTS} slots",
            cfg.mem_size, cfg.slots
        )));
    }
    cfg.extras.validate(cfg.harvest)
}
