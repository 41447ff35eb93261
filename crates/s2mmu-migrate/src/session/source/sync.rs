//! SYNC before the pause: the source waits until the destination has
//! taken every page sent so far, on every channel, while its guest still
//! runs. Pages that were only in flight (socket buffers, a relay, a
//! destination behind on its checks) would otherwise reach it inside the
//! downtime, ahead of the last round and the vCPU state; what the guest
//! writes during the wait is in the last round's harvest. SYNC also says
//! which ending follows, so that a destination readies its post-copy
//! resume (its dirty log, the VM's page fetch) before SYNCED, while the
//! guest still runs here, instead of inside the downtime.

use super::super::replies::{abort_and_reason, read_reply, unexpected_reply};
use super::Sender;
use crate::stream_error::MigrateError;
use crate::vm::SessionVm;
use crate::wire::{tag, Enc, Record, SYNC_THEN_POSTCOPY, SYNC_THEN_STOP};

/// Sends SYNC with the pages sent so far on each channel (each one
/// flushed already) and the ending that follows (`postcopy`: the switch
/// to post-copy, else the stop-and-copy), and waits for SYNCED.
///
/// # Errors
/// The stream's, or another reply (REJECTED: the destination's reason).
pub(super) fn sync<V: SessionVm>(
    s: &mut Sender<'_, V>,
    postcopy: bool,
) -> Result<(), MigrateError> {
    let mut e = Enc::default();
    for c in &s.chans {
        e.u64(c.wire.pages);
    }
    e.u8(if postcopy {
        SYNC_THEN_POSTCOPY
    } else {
        SYNC_THEN_STOP
    });
    let main = &mut s.chans[0].wire;
    main.control(tag::SYNC, &e.0)?;
    main.flush()?;
    match read_reply(main, 0)? {
        Record::Control {
            tag: tag::SYNCED, ..
        } => Ok(()),
        other => Err(unexpected_reply(other, "SYNCED")),
    }
}

/// [`sync`] before the guest's pause (`postcopy`: the switch follows);
/// a failure tells the destination to
/// stop (ABORT) and is reported with its reason. The guest was not
/// paused: it goes on here.
///
/// # Errors
/// As [`sync`], or the destination's reason.
pub(super) fn before_pause<V: SessionVm>(
    s: &mut Sender<'_, V>,
    postcopy: bool,
) -> Result<(), MigrateError> {
    sync(s, postcopy).map_err(|e| abort_and_reason(e, &mut s.chans[0].wire))
}
