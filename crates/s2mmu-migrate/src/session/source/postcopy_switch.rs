//! The source's switch from pre-copy to post-copy: it pauses the guest,
//! sends the state and the still-dirty pages, and once the destination
//! runs it, streams the rest, answers requests, recovers broken
//! connections and verifies ([`crate::session::postcopy::source`]).

use super::super::guest::SourceGuest;
use super::super::postcopy::{self, PostcopyOutcome};
use super::super::replies::{abort_and_reason, Connect};
use super::figures::{counters, phase};
use super::precopy_end::PrecopyEnd;
use super::{DowntimeParts, MigrateError, SourceOutcome};
use crate::transport::BoxConn;
use crate::vm::SessionVm;
use crate::wire::{WireWriter, SESSION_LEN};
use std::time::{Duration, Instant};

/// Pauses the guest and migrates the rest by post-copy.
///
/// # Errors
/// Before the destination resumed, the switch's error (the guest goes on
/// here); after it, [`MigrateError::PostcopyBroken`] (it stays paused) or
/// [`MigrateError::MemoryMismatch`]. `pc_conns` are post-copy's request
/// and answer connections; a recovery opens new ones with `connect`,
/// joining `session`.
pub(super) fn run<G: SourceGuest>(
    mut x: PrecopyEnd<'_, '_, G>,
    pc_conns: Vec<WireWriter<BoxConn>>,
    connect: &mut Connect<'_>,
    session: [u8; SESSION_LEN],
) -> Result<SourceOutcome, MigrateError> {
    // In-flight pages land, and the pause's first step is done, before it.
    x.guest.prepare_pause();
    super::sync::before_pause(x.s, true)?;
    let pause_at = Instant::now();
    let at_pause = counters(x.guest);
    x.guest.pause();
    let paused_at = Instant::now();
    let state = match x.guest_state() {
        Ok(s) => s,
        Err(e) => {
            x.guest.resume();
            return Err(abort_and_reason(e, &mut x.s.chans[0].wire));
        }
    };
    let saved_at = Instant::now();
    let mut pc = pc_conns.into_iter();
    let (Some(req), Some(answers)) = (pc.next(), pc.next()) else {
        return Err(MigrateError::Setup("post-copy's connections".into()));
    };
    harvest_missing(&mut x)?;
    let harvested_at = Instant::now();
    let switched = {
        let sw = postcopy::source::Switch {
            vm: x.guest.vm(),
            missing: postcopy::memory_bitmap(&**x.guest.vm(), &x.s.pending),
            req,
            answers,
            state: &state,
            bucket: &x.s.bucket,
        };
        postcopy::source::switch(&sw, &mut x.s.chans[0].wire).map(|at| (sw, at))
    };
    let (sw, [sent_at, resumed_at]) = match switched {
        Ok(x) => x,
        Err(e) => {
            // The destination did not resume: the guest goes on here.
            x.guest.resume();
            return Err(e);
        }
    };
    let downtime = resumed_at - pause_at;
    say_resumed(&x, downtime, &sw.missing);
    // From here the guest's memory is split until FINAL: the source
    // guest stays paused whatever happens.
    let done = postcopy::source::run(
        sw,
        &mut x.s.chans[0].wire,
        resumed_at,
        connect,
        (&session, x.cfg.channels),
        &x.cfg.recovery,
    )?;
    let slot_digests = x.guest.verify_final(&state, &done.fin)?;
    let parts = switch_parts([
        pause_at,
        paused_at,
        saved_at,
        harvested_at,
        sent_at,
        resumed_at,
    ]);
    Ok(outcome(
        x,
        done,
        slot_digests,
        (pause_at, at_pause, resumed_at, parts),
    ))
}

/// With the guest paused and its state saved: the last harvest and the
/// end of every data channel; with `--postcopy start` every page is
/// missing. A failure resumes the guest here and tells the destination.
///
/// # Errors
/// The harvest's or a channel's, with the destination's reason.
fn harvest_missing<G: SourceGuest>(x: &mut PrecopyEnd<'_, '_, G>) -> Result<(), MigrateError> {
    // Before POSTCOPY goes out the destination still waits on the main
    // connection: a failure here (a further channel cut) is told to it
    // with ABORT, as in stop-and-copy, so that its reason comes back.
    let ended =
        x.s.final_harvest()
            .and_then(|()| x.s.chans.iter_mut().skip(1).try_for_each(|c| c.wire.end()));
    if let Err(e) = ended {
        x.guest.resume();
        return Err(abort_and_reason(e, &mut x.s.chans[0].wire));
    }
    if x.cfg.postcopy == postcopy::Postcopy::Start {
        // No page was sent: every page is missing, whatever the dirty log
        // (which only saw what was written since logging began) says.
        every_page_pending(
            &x.s.vm.slots().iter().map(|i| i.size).collect::<Vec<_>>(),
            &mut x.s.pending,
        );
    }
    Ok(())
}

/// The switch's downtime parts from the instants that end each: the pause
/// asked, the guest stopped, the state saved, the harvest, STATE and
/// POSTCOPY flushed, POSTCOPY_RESUMED read. No page is sent while the
/// guest is paused.
fn switch_parts(t: [Instant; 6]) -> DowntimeParts {
    DowntimeParts {
        pause: t[1] - t[0],
        state_save: t[2] - t[1],
        harvest: t[3] - t[2],
        last_pages: Duration::ZERO,
        state_send: t[4] - t[3],
        until_resumed: t[5] - t[4],
    }
}

/// The source's outcome of a post-copy run that ended with `done` and
/// checked `slot_digests`; `times`: the pause, the counters then, the
/// destination's resume, and the downtime's parts.
fn outcome<G: SourceGuest>(
    x: PrecopyEnd<'_, '_, G>,
    done: postcopy::source::Done,
    slot_digests: Vec<(u16, u64)>,
    times: (Instant, (Instant, u64, u64), Instant, DowntimeParts),
) -> SourceOutcome {
    let (pause_at, at_pause, resumed_at, parts) = times;
    let at = x.clock();
    let samples = x.timeline.finish();
    let pause_s = at(pause_at);
    let (p0, _, z0) = x.s.counts();
    SourceOutcome {
        // The lost-write check and snapshots are refused with post-copy.
        extras: Default::default(),
        total: done.background_end - x.log_start,
        downtime: resumed_at - pause_at,
        setup: Default::default(),
        downtime_parts: parts,
        pause_at: Some(pause_at),
        page_records: p0 + done.answered_pages,
        zero_pages: z0,
        bytes: x.rounds.iter().map(|r| r.bytes).sum::<u64>() + done.bytes,
        link: x.link,
        link_bytes: x.link_bytes,
        channels: x.cfg.channels,
        log_start_s: x.log_start_s,
        pause_s,
        resumed_s: at(resumed_at),
        before: phase(x.warm, x.warm_end, &samples, 0.0, x.warm_end_s),
        during: phase(x.at_log, at_pause, &samples, x.log_start_s, pause_s),
        samples,
        rounds: x.rounds,
        slot_digests,
        verified_full: false,
        max_throttle_pct: x.max_throttle,
        final_pace: x.final_pace,
        postcopy: Some(PostcopyOutcome {
            figures: done.fin.figures,
            after_round: x.round,
            background_pages: done.background_pages,
            answered_pages: done.answered_pages,
            bytes: done.bytes,
            background_end_s: at(done.background_end),
            recoveries: done.recoveries,
        }),
        send_stages: x.s.stages(),
        channel_choice: None,
        compression: x.cfg.compression,
        compressed: {
            let mut c = x.s.compression();
            c.add(&done.compression);
            c
        },
    }
}

/// The progress line of the switch: the round, the downtime and the pages
/// the destination resumed without.
fn say_resumed<G: SourceGuest>(x: &PrecopyEnd<'_, '_, G>, downtime: Duration, missing: &[u64]) {
    if x.cfg.progress.is_on() {
        x.cfg.progress.line(&format!(
            "{}post-copy: vCPUs paused after round {}; the destination resumed after {:.1} ms of downtime with {} pages missing",
            x.cfg.label,
            x.round,
            downtime.as_secs_f64() * 1e3,
            missing.iter().map(|w| u64::from(w.count_ones())).sum::<u64>()
        ));
    }
}

/// Marks every page of each slot (`sizes`, bytes) pending in `pending`
/// (one bitmap per slot).
fn every_page_pending(sizes: &[u64], pending: &mut [Vec<u64>]) {
    for (bm, size) in pending.iter_mut().zip(sizes) {
        let pages = size / crate::wire::PAGE_SIZE as u64;
        for (i, w) in bm.iter_mut().enumerate() {
            let left = pages.saturating_sub(i as u64 * 64);
            *w = if left >= 64 {
                u64::MAX
            } else {
                (1u64 << left) - 1
            };
        }
    }
}
