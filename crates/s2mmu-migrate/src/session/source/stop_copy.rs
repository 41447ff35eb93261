//! The stop-and-copy: pauses the guest, sends the last dirty pages and
//! the vCPU state, waits for the destination to resume it, verifies the
//! destination's memory, and assembles the outcome.

use super::super::guest::{RoundHook, SourceGuest};
use super::super::replies::{abort_and_reason, read_reply, unexpected_reply};
use super::figures::{counters, phase, MIB};
use super::precopy_end::PrecopyEnd;
use super::verify::{check_digests, parse_digests, verify_full};
use super::{DowntimeParts, RoundStat, SourceOutcome};
use crate::stream_error::MigrateError;
use crate::wire::{tag, Enc, Record, PAGE_SIZE};
use std::time::Instant;

/// Pauses the guest, sends the rest, and verifies the destination.
///
/// # Errors
/// Sending failed (the guest resumes here; the destination's reason when
/// it gave up), the destination did not resume it (it resumes here), or
/// [`MigrateError::MemoryMismatch`]. `extras` are pre-copy's check and
/// snapshots, `throttle_pct` the throttle of its last round.
pub(super) fn run<G: SourceGuest>(
    mut x: PrecopyEnd<'_, '_, G>,
    mut hook: G::Hook,
    throttle_pct: u32,
) -> Result<SourceOutcome, MigrateError> {
    let at = x.clock();
    // In-flight pages land, and the pause's first step is done, before it.
    x.guest.prepare_pause();
    super::sync::before_pause(x.s, false)?;
    let (pause_at, at_pause) = (Instant::now(), counters(x.guest));
    x.guest.pause();
    let paused_at = Instant::now();
    let sent = match send_last(&mut x, &mut hook, throttle_pct) {
        Ok(sent) => sent,
        Err(e) => {
            // Not sent in full: the guest goes on here, and the destination,
            // still waiting for the main connection's END, is told to stop.
            x.guest.resume();
            return Err(abort_and_reason(e, &mut x.s.chans[0].wire));
        }
    };
    let digests = read_resumed(&mut x);
    let resumed_at = Instant::now();
    // Not resumed there: the guest goes on here.
    let dest_digests = digests.inspect_err(|_| x.guest.resume())?;
    let downtime = resumed_at - pause_at;
    let cfg = x.cfg;
    say_resumed(cfg, downtime);
    let samples = x.timeline.finish();
    let pause_s = at(pause_at);
    let before = phase(x.warm, x.warm_end, &samples, 0.0, x.warm_end_s);
    let during = phase(x.at_log, at_pause, &samples, x.log_start_s, pause_s);

    // Verification against the frozen source memory: the byte-for-byte
    // pass first (the destination waits for it under its I/O deadline),
    // then the digests.
    let compressed = x.s.compression();
    if cfg.verify_full {
        verify_full(x.s)?;
    }
    let slot_digests = check_digests(&**x.guest.vm(), &dest_digests)?;
    let rounds = x.rounds;
    let sum = |f: fn(&RoundStat) -> u64| rounds.iter().map(f).sum::<u64>();
    let (page_records, zero_pages, bytes) =
        (sum(|r| r.pages), sum(|r| r.zero_pages), sum(|r| r.bytes));
    Ok(SourceOutcome {
        extras: hook.finish(x.guest.vm()),
        rounds,
        total: resumed_at - x.log_start,
        downtime,
        setup: Default::default(),
        downtime_parts: parts(pause_at, paused_at, sent, resumed_at),
        pause_at: Some(pause_at),
        page_records,
        zero_pages,
        bytes,
        link: x.link,
        link_bytes: x.link_bytes,
        channels: cfg.channels,
        log_start_s: x.log_start_s,
        pause_s,
        resumed_s: at(resumed_at),
        samples,
        before,
        during,
        slot_digests,
        verified_full: cfg.verify_full,
        max_throttle_pct: x.max_throttle,
        final_pace: x.final_pace,
        postcopy: None,
        send_stages: x.s.stages(),
        channel_choice: None,
        compression: cfg.compression,
        compressed,
    })
}

/// The progress line of the destination's resume.
fn say_resumed(cfg: &super::SourceConfig, downtime: std::time::Duration) {
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}resumed on the destination after {:.1} ms of downtime",
            cfg.label,
            downtime.as_secs_f64() * 1e3
        ));
    }
}

/// The downtime's parts from the instants that end each: the pause asked,
/// the guest stopped, `sent` (harvested, last pages sent, state saved,
/// state and ends sent: [`send_last`]'s), RESUMED read.
fn parts(
    pause_at: Instant,
    paused_at: Instant,
    sent: [Instant; 4],
    resumed: Instant,
) -> DowntimeParts {
    DowntimeParts {
        pause: paused_at - pause_at,
        harvest: sent[0] - paused_at,
        last_pages: sent[1] - sent[0],
        state_save: sent[2] - sent[1],
        state_send: sent[3] - sent[2],
        until_resumed: resumed - sent[3],
    }
}

/// The destination's RESUMED and the per-slot digests it carries.
///
/// # Errors
/// The stream's, or another reply (REJECTED: the destination's reason).
fn read_resumed<G: SourceGuest>(
    x: &mut PrecopyEnd<'_, '_, G>,
) -> Result<Vec<(u16, u64)>, MigrateError> {
    match read_reply(&mut x.s.chans[0].wire, 0) {
        Ok(Record::Control {
            tag: tag::RESUMED,
            body,
            at_byte,
        }) => parse_digests(&body, at_byte),
        Ok(other) => Err(unexpected_reply(other, "RESUMED")),
        Err(e) => Err(no_resumed(e)),
    }
}

/// What the source waited for when RESUMED did not come.
const AWAITING_RESUMED: &str =
    "waiting for the destination's RESUMED after the last pages and the vCPU state were sent";

/// A reply that broke off is named for what happened: the destination
/// closed the connection (it ended, or failed, before its guest resumed)
/// or the connection failed, while the source's guest was paused for the
/// stop-and-copy; not a truncated stream.
fn no_resumed(e: MigrateError) -> MigrateError {
    match e {
        MigrateError::Truncated { at_byte: 0, .. } => MigrateError::Io {
            what: AWAITING_RESUMED.into(),
            error: "the destination closed the connection without a reply: it ended or \
                    failed before its guest resumed"
                .into(),
        },
        MigrateError::Io { what, error } => MigrateError::Io {
            what: format!("{AWAITING_RESUMED} ({what})"),
            error,
        },
        e => e,
    }
}

/// With the vCPUs paused: the last harvest, the last dirty pages, the
/// vCPU state, the end of every channel; records the final round. Returns
/// when each of the four steps ended.
fn send_last<G: SourceGuest>(
    x: &mut PrecopyEnd<'_, '_, G>,
    hook: &mut G::Hook,
    throttle_pct: u32,
) -> Result<[Instant; 4], MigrateError> {
    let page = PAGE_SIZE as u64;
    let s = &mut *x.s;
    let t0 = Instant::now();
    let (p0, b0, z0) = s.counts();
    s.final_harvest()?;
    hook.last_round(x.guest.vm(), &s.pending)?;
    let harvested = Instant::now();
    let mut e = Enc::default();
    e.u32(x.round + 1).u64(s.dirty_count());
    s.chans[0].wire.control(tag::ROUND, &e.0)?;
    s.send_dirty(true)?;
    let pages_sent = Instant::now();
    let state = x.guest_state()?;
    let saved = Instant::now();
    let s = &mut *x.s;
    for c in s.chans.iter_mut().skip(1) {
        c.wire.end()?;
    }
    s.chans[0].wire.control(tag::STATE, &state)?;
    s.chans[0].wire.end()?;
    let t1 = Instant::now();
    let (p1, b1, z1) = s.counts();
    x.rounds.push(RoundStat {
        round: x.round + 1,
        pages: p1 - p0,
        zero_pages: z1 - z0,
        bytes: b1 - b0,
        start_s: x.timeline.at(t0),
        end_s: x.timeline.at(t1),
        bandwidth: (b1 - b0) as f64 / (t1 - t0).as_secs_f64().max(1e-9),
        page_rate: (p1 - p0) as f64 * page as f64 / (t1 - t0).as_secs_f64().max(1e-9),
        throttle_pct,
        pace: x.final_pace,
        final_round: true,
        ..RoundStat::default()
    });
    let cfg = x.cfg;
    if cfg.progress.is_on() {
        let r = x.rounds.last().expect("pushed");
        cfg.progress.line(&format!(
            "{}round {:>2}: vCPUs paused; sent the last {} pages ({:.1} MiB) and the vCPU state in {:.1} ms",
            cfg.label,
            r.round,
            r.pages,
            r.bytes as f64 / MIB,
            (t1 - t0).as_secs_f64() * 1e3
        ));
    }
    Ok([harvested, pages_sent, saved, t1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_that_broke_off_names_the_wait_for_resumed() {
        let closed = no_resumed(MigrateError::Truncated {
            at_byte: 0,
            inside: "the next record's tag",
        })
        .to_string();
        assert!(closed.starts_with(AWAITING_RESUMED), "{closed}");
        assert!(
            closed.contains("closed the connection without a reply"),
            "{closed}"
        );
        assert!(!closed.contains("truncated"), "{closed}");
        let reset = no_resumed(MigrateError::Io {
            what: "reading a reply".into(),
            error: "connection reset by peer".into(),
        })
        .to_string();
        assert!(reset.starts_with(AWAITING_RESUMED), "{reset}");
        assert!(
            reset.ends_with("(reading a reply): connection reset by peer"),
            "{reset}"
        );
        // A reply cut inside a record, or another failure, keeps its own name.
        let cut = MigrateError::Truncated {
            at_byte: 9,
            inside: "RESUMED",
        };
        assert_eq!(no_resumed(cut.clone()), cut);
    }
}
