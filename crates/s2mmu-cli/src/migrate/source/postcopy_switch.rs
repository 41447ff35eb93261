//! The source's switch from pre-copy to post-copy: it pauses the guest,
//! sends the state and the still-dirty pages, and once the destination
//! runs it, streams the rest, answers requests, recovers broken
//! connections and verifies ([`crate::migrate::postcopy::source`]).

use super::super::net::BoxConn;
use super::super::postcopy::{self, PostcopyOutcome};
use super::super::wire::{WireWriter, SESSION_LEN};
use super::{
    counters, phase, Connect, GuestState, MigrateError, Pattern, RoundStat, Sender, SourceConfig,
    SourceOutcome, Timeline,
};
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{Control, Vm, Workload, WorkloadConfig};
use std::sync::Arc;
use std::time::Instant;

/// Where pre-copy left the source when it decided to switch.
pub(super) struct Switching<'a, 'v, 'c> {
    pub vm: &'a Arc<Vm>,
    pub wl: &'a Workload<TreeMemslots>,
    pub wl_cfg: WorkloadConfig,
    pub ctl: &'a Control,
    pub s: &'a mut Sender<'v>,
    /// Post-copy's request and answer connections.
    pub pc_conns: Vec<WireWriter<BoxConn>>,
    pub final_pace: u64,
    /// The last pre-copy round.
    pub round: u32,
    pub rounds: Vec<RoundStat>,
    pub timeline: Timeline,
    pub log_start: Instant,
    pub log_start_s: f64,
    /// The guest's counters at warm-up start and end and at logging on.
    pub warm: (Instant, u64, u64),
    pub warm_end: (Instant, u64, u64),
    pub warm_end_s: f64,
    pub at_log: (Instant, u64, u64),
    pub link: f64,
    pub link_bytes: u64,
    pub cfg: &'a SourceConfig,
    pub connect: &'a mut Connect<'c>,
    pub session: [u8; SESSION_LEN],
    pub max_throttle: u32,
}

/// Pauses the guest and migrates the rest by post-copy.
///
/// # Errors
/// Before the destination resumed, the switch's error (the guest goes on
/// here); after it, [`MigrateError::PostcopyBroken`] (it stays paused) or
/// [`MigrateError::MemoryMismatch`].
pub(super) fn run(x: Switching<'_, '_, '_>) -> Result<SourceOutcome, MigrateError> {
    let Switching {
        vm,
        wl,
        wl_cfg,
        ctl,
        s,
        pc_conns,
        final_pace,
        round,
        rounds,
        timeline,
        log_start,
        log_start_s,
        warm,
        warm_end,
        warm_end_s,
        at_log,
        link,
        link_bytes,
        cfg,
        connect,
        session,
        max_throttle,
    } = x;
    let pause_at = Instant::now();
    let at_pause = counters(ctl);
    wl.pause();
    let state = GuestState {
        bytes_per_vcpu: wl_cfg.bytes_per_vcpu,
        write_percent: wl_cfg.write_percent,
        pattern: u8::from(wl_cfg.pattern == Pattern::Random),
        pace_pages_per_sec: final_pace,
        vcpus: wl.vcpu_states(),
    };
    let mut pc = pc_conns.into_iter();
    let (Some(req), Some(answers)) = (pc.next(), pc.next()) else {
        return Err(MigrateError::Setup("post-copy's connections".into()));
    };
    let switched = s.final_harvest().and_then(|()| {
        for c in s.chans.iter_mut().skip(1) {
            c.wire.end()?;
        }
        let sw = postcopy::source::Switch {
            vm,
            missing: postcopy::memory_bitmap(vm, &s.pending),
            req,
            answers,
            state: &state,
            bucket: &s.bucket,
        };
        let at = postcopy::source::switch(&sw, &mut s.chans[0].wire)?;
        Ok((sw, at))
    });
    let (sw, resumed_at) = match switched {
        Ok(x) => x,
        Err(e) => {
            // The destination did not resume: the guest goes on here.
            wl.resume();
            return Err(e);
        }
    };
    let downtime = resumed_at - pause_at;
    if cfg.progress.is_on() {
        cfg.progress.line(&format!(
            "{}post-copy: vCPUs paused after round {round}; the destination resumed after {:.1} ms of downtime with {} pages missing",
            cfg.label,
            downtime.as_secs_f64() * 1e3,
            sw.missing.iter().map(|w| w.count_ones() as u64).sum::<u64>()
        ));
    }
    // From here the guest's memory is split until FINAL: the source
    // guest stays paused whatever happens.
    let done = postcopy::source::run(
        sw,
        &mut s.chans[0].wire,
        resumed_at,
        connect,
        &session,
        cfg.channels,
    )?;
    let slot_digests = postcopy::source::verify(vm, &state, &done.fin)?;
    let samples = timeline.finish();
    let pause_s = log_start_s + (pause_at - log_start).as_secs_f64();
    let at = |t: Instant| log_start_s + (t - log_start).as_secs_f64();
    let (p0, b0, z0) = s.counts();
    let _ = b0;
    Ok(SourceOutcome {
        total: done.background_end - log_start,
        downtime,
        page_records: p0 + done.answered_pages,
        zero_pages: z0,
        bytes: rounds.iter().map(|r| r.bytes).sum::<u64>() + done.bytes,
        link,
        link_bytes,
        channels: cfg.channels,
        log_start_s,
        pause_s,
        resumed_s: at(resumed_at),
        before: phase(warm, warm_end, &samples, 0.0, warm_end_s),
        during: phase(at_log, at_pause, &samples, log_start_s, pause_s),
        samples,
        rounds,
        slot_digests,
        verified_full: false,
        max_throttle_pct: max_throttle,
        final_pace,
        postcopy: Some(PostcopyOutcome {
            figures: done.fin.figures,
            after_round: round,
            background_pages: done.background_pages,
            answered_pages: done.answered_pages,
            bytes: done.bytes,
            background_end_s: at(done.background_end),
            recoveries: done.recoveries,
        }),
    })
}
