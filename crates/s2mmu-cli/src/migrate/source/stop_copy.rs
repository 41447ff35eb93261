//! The stop-and-copy: pauses the guest, sends the last dirty pages and
//! the vCPU state, waits for the destination to resume it, verifies the
//! destination's memory, and assembles the outcome.

use super::super::error::MigrateError;
use super::super::extras::ExtrasRun;
use super::super::wire::{tag, Enc, Record, PAGE_SIZE};
use super::precopy_end::PrecopyEnd;
use super::verify::{check_digests, parse_digests, verify_full};
use super::{
    abort_and_reason, counters, phase, read_reply, unexpected_reply, RoundStat, SourceOutcome, MIB,
};
use s2mmu_vm::VmFormat;
use std::time::Instant;

/// Pauses the guest, sends the rest, and verifies the destination.
///
/// # Errors
/// Sending failed (the guest resumes here; the destination's reason when
/// it gave up), the destination did not resume it (it resumes here), or
/// [`MigrateError::MemoryMismatch`]. `extras` are pre-copy's check and
/// snapshots, `throttle_pct` the throttle of its last round.
pub(super) fn run<F: VmFormat>(
    mut x: PrecopyEnd<'_, '_, F>,
    mut extras: ExtrasRun<F>,
    throttle_pct: u32,
) -> Result<SourceOutcome, MigrateError> {
    let at = x.clock();
    let pause_at = Instant::now();
    let at_pause = counters(x.ctl);
    x.wl.pause();
    if let Err(e) = send_last(&mut x, &mut extras, throttle_pct) {
        // Not sent in full: the guest goes on here, and the destination,
        // still waiting for the main connection's END, is told to stop.
        x.wl.resume();
        return Err(abort_and_reason(e, &mut x.s.chans[0].wire));
    }
    let digests = match read_reply(&mut x.s.chans[0].wire, 0) {
        Ok(Record::Control {
            tag: tag::RESUMED,
            body,
            at_byte,
        }) => parse_digests(&body, at_byte),
        Ok(other) => Err(unexpected_reply(other, "RESUMED")),
        Err(e) => Err(e),
    };
    let resumed_at = Instant::now();
    let dest_digests = match digests {
        Ok(d) => d,
        Err(e) => {
            // Not resumed there: the guest goes on here.
            x.wl.resume();
            return Err(e);
        }
    };
    let downtime = resumed_at - pause_at;
    let cfg = x.cfg;
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}resumed on the destination after {:.1} ms of downtime",
            cfg.label,
            downtime.as_secs_f64() * 1e3
        ));
    }
    let samples = x.timeline.finish();
    let pause_s = at(pause_at);
    let before = phase(x.warm, x.warm_end, &samples, 0.0, x.warm_end_s);
    let during = phase(x.at_log, at_pause, &samples, x.log_start_s, pause_s);

    // Verification against the frozen source memory: the byte-for-byte
    // pass first (the destination waits for it under its I/O deadline),
    // then the digests.
    if cfg.verify_full {
        verify_full(x.vm, x.s)?;
    }
    let slot_digests = check_digests(x.vm, &dest_digests)?;
    let rounds = x.rounds;
    let page_records: u64 = rounds.iter().map(|r| r.pages).sum();
    let zero_pages: u64 = rounds.iter().map(|r| r.zero_pages).sum();
    let bytes: u64 = rounds.iter().map(|r| r.bytes).sum();
    let extras = extras.finish(x.vm);
    Ok(SourceOutcome {
        rounds,
        total: resumed_at - x.log_start,
        downtime,
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
        extras,
        verified_full: cfg.verify_full,
        max_throttle_pct: x.max_throttle,
        final_pace: x.final_pace,
        postcopy: None,
        send_stages: x.s.stages(),
        plain_link: None,
    })
}

/// With the vCPUs paused: the last harvest, the last dirty pages, the
/// vCPU state, the end of every channel; records the final round.
fn send_last<F: VmFormat>(
    x: &mut PrecopyEnd<'_, '_, F>,
    extras: &mut ExtrasRun<F>,
    throttle_pct: u32,
) -> Result<(), MigrateError> {
    let page = PAGE_SIZE as u64;
    let s = &mut *x.s;
    let t0 = Instant::now();
    let (p0, b0, z0) = s.counts();
    s.final_harvest()?;
    extras.last_round(x.vm, &s.pending)?;
    let mut e = Enc::default();
    e.u32(x.round + 1).u64(s.dirty_count());
    s.chans[0].wire.control(tag::ROUND, &e.0)?;
    s.send_dirty()?;
    let state = x.guest_state();
    let s = &mut *x.s;
    for c in s.chans.iter_mut().skip(1) {
        c.wire.end()?;
    }
    s.chans[0].wire.control(tag::STATE, &state.encode())?;
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
    Ok(())
}
