//! SYNC on the main channel: the source asks, before it pauses its guest,
//! that every page it sent so far (on every channel) be taken here, and
//! waits for SYNCED. What is still on its way then (socket buffers, a
//! relay, a destination behind on its checks) arrives while the guest
//! still runs on the source, not inside the downtime. A SYNC that
//! announces the switch to post-copy has the VM readied for its resume
//! before SYNCED, for the same reason.

use crate::stream_error::MigrateError;
use crate::transport::Connection;
use crate::vm::SessionVm;
use crate::wire::{tag, Dec, WireReader, WireWriter, SYNC_THEN_POSTCOPY, SYNC_THEN_STOP};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What SYNC's wait reads of the receiving threads.
pub(super) struct SyncProgress {
    /// Pages taken so far on each channel.
    pub(super) taken: Vec<AtomicU64>,
    /// How long the wait lets a channel's count stand still.
    pub(super) wait: Duration,
    /// A further channel failed (SYNC stops waiting; its error wins).
    pub(super) channel_failed: AtomicBool,
    /// The HEADER allows post-copy (a SYNC may announce the switch).
    pub(super) postcopy: bool,
    /// The dirty log is on (turned on at a SYNC that announced post-copy,
    /// [`answer`]).
    pub(super) logging: AtomicBool,
}

impl SyncProgress {
    /// Nothing taken yet on any of `channels`; waits up to `wait` at a
    /// time; `postcopy`: the HEADER allows the switch.
    pub(super) fn new(channels: u16, wait: Duration, postcopy: bool) -> Self {
        SyncProgress {
            taken: (0..channels).map(|_| AtomicU64::new(0)).collect(),
            wait,
            channel_failed: AtomicBool::new(false),
            postcopy,
            logging: AtomicBool::new(false),
        }
    }
}

/// How long the main channel sleeps between looks at the other channels'
/// counts while it waits.
const POLL: Duration = Duration::from_micros(50);

/// Answers SYNC (`body`, at `at_byte`, read on the main channel `rd`)
/// once `sh` has taken the pages it names on each channel, with SYNCED;
/// when SYNC announces the switch to post-copy, `vm` is readied for its
/// resume first ([`prepare_postcopy`]).
///
/// # Errors
/// A malformed body (an ending other than the two, or post-copy where
/// the HEADER did not allow it), or a main channel whose count is not
/// the source's (everything before SYNC on it is here: a record went
/// missing); [`MigrateError::Timeout`] when another channel's count stops
/// growing for `sh.wait` short of the source's; the VM refusing the
/// post-copy set-up; the reply's I/O error.
pub(super) fn answer<C: Connection, V: SessionVm>(
    rd: &mut WireReader<&mut C>,
    sh: &SyncProgress,
    vm: &V,
    body: &[u8],
    at_byte: u64,
) -> Result<(), MigrateError> {
    let mut d = Dec::new(body, "SYNC", at_byte);
    let mut sent = Vec::with_capacity(sh.taken.len());
    for _ in 0..sh.taken.len() {
        sent.push(d.u64()?);
    }
    let postcopy = match d.u8()? {
        SYNC_THEN_STOP => false,
        SYNC_THEN_POSTCOPY if sh.postcopy => true,
        SYNC_THEN_POSTCOPY => {
            return Err(d.malformed(
                "it announces the switch to post-copy, which the HEADER did not allow".into(),
            ))
        }
        other => {
            return Err(d.malformed(format!(
                "its ending {other} is neither {SYNC_THEN_STOP} (stop-and-copy) nor \
                 {SYNC_THEN_POSTCOPY} (post-copy)"
            )))
        }
    };
    d.finish()?;
    if sent[0] != rd.pages {
        return Err(d.malformed(format!(
            "the source sent {} pages on the main channel, {} arrived",
            sent[0], rd.pages
        )));
    }
    for (k, &n) in sent.iter().enumerate().skip(1) {
        wait_for(sh, k, n)?;
    }
    if postcopy {
        prepare_postcopy(sh, vm)?;
    }
    let mut w = WireWriter::replies(rd.get_mut());
    w.control(tag::SYNCED, &[])?;
    w.flush()
}

/// Readies `vm` for the post-copy resume SYNC announced: its dirty log on
/// (once: see `sh.logging`), which the resume needs to keep every mapping
/// one page wide, then [`SessionVm::prepare_postcopy`]. Both run before
/// SYNCED, while the source's guest still runs: not inside the downtime,
/// and not beside the source's pause on a host both ends share.
///
/// # Errors
/// The VM refusing either.
fn prepare_postcopy<V: SessionVm>(sh: &SyncProgress, vm: &V) -> Result<(), MigrateError> {
    if !sh.logging.load(Ordering::Acquire) {
        vm.enable_dirty_logging()
            .map_err(|e| MigrateError::Setup(format!("destination logging: {e}")))?;
        sh.logging.store(true, Ordering::Release);
    }
    vm.prepare_postcopy()
        .map_err(|e| MigrateError::Setup(format!("destination post-copy set-up: {e}")))
}

/// What SYNC's wait ends with when a further channel failed meanwhile
/// (that channel's own error is the one reported).
const A_CHANNEL_FAILED: &str = "SYNC: a further channel failed";

/// Whether `e` is SYNC's stop for a failed channel.
pub(super) fn stopped_for_a_channel(e: &MigrateError) -> bool {
    matches!(e, MigrateError::Setup(w) if w == A_CHANNEL_FAILED)
}

/// Waits until `sh` has taken `sent` pages on `channel`, its count
/// growing at least once every `sh.wait`, unless a further channel
/// fails.
pub(super) fn wait_for(sh: &SyncProgress, channel: usize, sent: u64) -> Result<(), MigrateError> {
    let taken = &sh.taken[channel];
    let mut last = taken.load(Ordering::Acquire);
    let mut since = Instant::now();
    while last < sent {
        if sh.channel_failed.load(Ordering::Acquire) {
            return Err(MigrateError::Setup(A_CHANNEL_FAILED.into()));
        }
        std::thread::sleep(POLL);
        let now = taken.load(Ordering::Acquire);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > sh.wait {
            return Err(MigrateError::Timeout {
                what: format!(
                    "SYNC: {last} of the {sent} pages the source sent on channel {channel} \
                     were taken here, none more for {:?}",
                    sh.wait
                ),
            });
        }
    }
    Ok(())
}
