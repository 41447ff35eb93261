//! Resuming the guest after a complete pre-copy stream: digests, the
//! workload from the transferred state, and its run.

use super::checks::compare_with_snapshot;
use super::config::{DestConfig, DestOutcome, ResumeParts};
use super::guest::{DestGuest, ResumedGuest};
use super::receive::ReceiveState;
use crate::hash::digest_of_iter;
use crate::stream_error::MigrateError;
use crate::transport::Connection;
use crate::vm::{GuestRun, SessionVm};
use crate::wire::{tag, Enc, WireReader, WireWriter, PAGE_SIZE};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The destination's clock up to the state's check (see [`ResumeParts`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    /// The STATE record came in.
    pub(super) state_at: Instant,
    /// Every channel ended and every page was found here.
    pub(super) drained: Instant,
    /// The guest checked the state.
    pub(super) decoded: Instant,
    /// The dirty log is on (turned on at a SYNC that announced post-copy,
    /// which then did not come): it goes off once RESUMED is out, outside
    /// the downtime.
    pub(super) logging: bool,
}

/// Resumes the guest here after a complete pre-copy stream: per-slot
/// digests (made while the guest starts) to the source (RESUMED), the
/// byte comparison with verify-full, then the guest runs for `run_after`.
/// The counts are the main channel's only (the caller adds the others').
pub(super) fn resume_after_end<C: Connection, G: DestGuest>(
    rd: &mut WireReader<&mut C>,
    guest: &G,
    sh: &ReceiveState<'_, G::Vm>,
    state: &G::State,
    cfg: &DestConfig,
    clock: Clock,
) -> Result<DestOutcome, MigrateError> {
    let vm = guest.vm();
    // The digests are of the hashes of what arrived, which nothing
    // changes any more (the drain found every page): they are made on a
    // thread of their own while the guest starts (mostly a wait for its
    // first instruction), and only RESUMED waits for both. Where no
    // thread can be made, they are made here after the start.
    let (started, slot_digests, digested) = std::thread::scope(|s| {
        let digester = std::thread::Builder::new()
            .name("digests".into())
            .spawn_scoped(s, || slot_digests(&**vm, sh))
            .ok();
        let started = guest.start(state).map(|wl| {
            let at = resumed_at(&wl);
            (wl, at)
        });
        let digests = match digester {
            Some(t) => t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
            None => slot_digests(&**vm, sh),
        };
        (started, digests, Instant::now())
    });
    let (wl, resumed_at) = started?;
    let writes0 = wl.counters().writes;
    send_resumed(rd, &slot_digests)?;
    if clock.logging {
        vm.disable_dirty_logging()
            .map_err(|e| MigrateError::Setup(format!("destination logging off: {e}")))?;
    }
    let resume_parts = ResumeParts {
        drain: clock.drained.saturating_duration_since(clock.state_at),
        decode: clock.decoded.saturating_duration_since(clock.drained),
        page_fetch: Duration::ZERO,
        start: resumed_at.saturating_duration_since(clock.decoded),
        digests: digested.saturating_duration_since(resumed_at),
        reply: digested.elapsed(),
    };
    let (page_records, bytes, zero_pages) = (rd.pages, rd.pos, rd.zero_pages);
    let (mut verify_mismatches, mut verify_error) = (None, None);
    if let Some(snapshot) = &sh.snapshot {
        // The guest runs here already: a comparison that breaks (a cut,
        // a damaged record) is reported, and the guest runs on.
        match verify_pass(rd, &**vm, snapshot) {
            Ok(bad) => verify_mismatches = Some(bad),
            Err(e) => {
                eprintln!("destination: the guest RESUMED here; the byte comparison after it broke: {e}; the guest runs on, unverified");
                verify_error = Some(e.to_string());
            }
        }
    }
    let resumed_write_rate = run_resumed(&wl, writes0, cfg.run_after, resumed_at);
    let resumed_progress = wl.progress();
    drop(wl);
    Ok(DestOutcome {
        page_records,
        zero_pages,
        bytes,
        channels: 1,
        probe_bytes: 0,
        prefault: Duration::ZERO,
        resumed_at: Some(resumed_at),
        slot_digests,
        verify_mismatches,
        verify_error,
        resumed_write_rate,
        resumed_progress,
        postcopy: None,
        recv_stages: Default::default(),
        resume_parts,
    })
}

/// RESUMED with the per-slot digests, written and flushed.
fn send_resumed<C: Connection>(
    rd: &mut WireReader<&mut C>,
    slot_digests: &[(u16, u64)],
) -> Result<(), MigrateError> {
    let mut e = Enc::default();
    e.u32(slot_digests.len() as u32);
    for (id, d) in slot_digests {
        e.u16(*id).u64(*d);
    }
    let mut w = WireWriter::replies(rd.get_mut());
    w.control(tag::RESUMED, &e.0)?;
    w.flush()
}

/// verify-full's byte comparison, and VERIFIED with its result.
fn verify_pass<C: Connection, V: SessionVm>(
    rd: &mut WireReader<&mut C>,
    vm: &V,
    snapshot: &[std::sync::atomic::AtomicU64],
) -> Result<u64, MigrateError> {
    let (bad, first) = compare_with_snapshot(rd, vm, snapshot)?;
    let mut e = Enc::default();
    e.u64(bad).u64(first);
    let mut w = WireWriter::replies(rd.get_mut());
    w.control(tag::VERIFIED, &e.0)?;
    w.flush()?;
    Ok(bad)
}

/// Each slot's digest of the memory the guest resumes from.
pub(super) fn slot_digests<V: SessionVm>(vm: &V, sh: &ReceiveState<'_, V>) -> Vec<(u16, u64)> {
    vm.slots()
        .iter()
        .map(|s| {
            let first = (s.mem_offset / PAGE_SIZE as u64) as usize;
            let n = (s.size / PAGE_SIZE as u64) as usize;
            let hashes = sh.hashes[first..first + n]
                .iter()
                .map(|h| h.load(Ordering::Relaxed));
            (s.id, digest_of_iter(hashes))
        })
        .collect()
}

/// When the guest `wl`, just started, resumed: its own first instruction
/// ([`GuestRun::first_instruction_at`]) where it knows it, never after
/// now; else now.
pub(crate) fn resumed_at<R: GuestRun>(wl: &R) -> Instant {
    let seen = Instant::now();
    wl.first_instruction_at().map_or(seen, |t| t.min(seen))
}

/// Lets the resumed guest run until `run_after` has passed since
/// `resumed_at`, then pauses it. Returns its writes per second since the
/// resume (`writes0`: its write count when it started).
pub(crate) fn run_resumed<R: ResumedGuest>(
    wl: &R,
    writes0: u64,
    run_after: Duration,
    resumed_at: Instant,
) -> f64 {
    if let Some(rest) = run_after.checked_sub(resumed_at.elapsed()) {
        std::thread::sleep(rest);
    }
    let writes1 = wl.counters().writes;
    let secs = resumed_at.elapsed().as_secs_f64();
    wl.pause();
    writes1.saturating_sub(writes0) as f64 / secs.max(1e-9)
}
