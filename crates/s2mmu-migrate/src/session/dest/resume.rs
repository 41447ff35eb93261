//! Resuming the guest after a complete pre-copy stream: digests, the
//! workload from the transferred state, and its run.

use super::checks::compare_with_snapshot;
use super::config::{DestConfig, DestOutcome};
use super::receive::Shared;
use crate::hash::digest_of;
use crate::sim::state::{workload_config, GuestState};
use crate::stream_error::MigrateError;
use crate::transport::Connection;
use crate::wire::{tag, Enc, WireReader, WireWriter, PAGE_SIZE};
use s2mmu::memslot::TreeMemslots;
use s2mmu_vm::{Vm, VmFormat, Workload};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Resumes the guest here after a complete pre-copy stream: per-slot
/// digests to the source (RESUMED), the byte comparison with verify-full,
/// then the guest runs for `run_after`. The counts are the main channel's
/// only (the caller adds the others').
pub(super) fn resume_after_end<C: Connection, F: VmFormat>(
    rd: &mut WireReader<&mut C>,
    vm: &Arc<Vm<TreeMemslots, F>>,
    sh: &Shared<'_, F>,
    state: &GuestState,
    cfg: &DestConfig,
) -> Result<DestOutcome, MigrateError> {
    let slot_digests = slot_digests(vm, sh);
    let wl = start_workload(vm, state)?;
    let resumed_at = Instant::now();
    let mut e = Enc::default();
    e.u32(slot_digests.len() as u32);
    for (id, d) in &slot_digests {
        e.u16(*id).u64(*d);
    }
    {
        let mut w = WireWriter::replies(rd.get_mut());
        w.control(tag::RESUMED, &e.0)?;
        w.flush()?;
    }
    let (page_records, bytes, zero_pages) = (rd.pages, rd.pos, rd.zero_pages);
    let (mut verify_mismatches, mut verify_error) = (None, None);
    if let Some(snapshot) = &sh.snapshot {
        // The guest runs here already: a comparison that breaks (a cut,
        // a damaged record) is reported, and the guest runs on.
        match verify_pass(rd, vm, snapshot) {
            Ok(bad) => verify_mismatches = Some(bad),
            Err(e) => {
                eprintln!("destination: the guest RESUMED here; the byte comparison after it broke: {e}; the guest runs on, unverified");
                verify_error = Some(e.to_string());
            }
        }
    }
    let resumed_write_rate = run_resumed(&wl, state, cfg.run_after, resumed_at);
    let resumed_passes = wl.vcpu_states().iter().map(|s| s.pass).collect();
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
        resumed_passes,
        postcopy: None,
    })
}

/// verify-full's byte comparison, and VERIFIED with its result.
fn verify_pass<C: Connection, F: VmFormat>(
    rd: &mut WireReader<&mut C>,
    vm: &Arc<Vm<TreeMemslots, F>>,
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
pub(super) fn slot_digests<F: VmFormat>(
    vm: &Vm<TreeMemslots, F>,
    sh: &Shared<'_, F>,
) -> Vec<(u16, u64)> {
    let hashes: Vec<u64> = sh
        .hashes
        .iter()
        .map(|h| h.load(Ordering::Relaxed))
        .collect();
    vm.slots()
        .iter()
        .map(|s| {
            let first = (s.mem_offset / PAGE_SIZE as u64) as usize;
            let n = (s.size / PAGE_SIZE as u64) as usize;
            (s.id, digest_of(&hashes[first..first + n]))
        })
        .collect()
}

/// Resume: the vCPUs continue from the transferred state, paced as on the
/// source.
pub(crate) fn start_workload<F: VmFormat>(
    vm: &Arc<Vm<TreeMemslots, F>>,
    state: &GuestState,
) -> Result<Workload<TreeMemslots, F>, MigrateError> {
    let wl = Workload::start_at(vm.clone(), workload_config(state), &state.vcpus)
        .map_err(|why| MigrateError::BadState { why })?;
    wl.control()
        .pace_pages_per_sec
        .store(state.pace_pages_per_sec, Ordering::Relaxed);
    wl.run_free();
    Ok(wl)
}

/// Lets the resumed guest run until `run_after` has passed since
/// `resumed_at`, then pauses it. Returns its writes per second since the
/// resume (counted from the transferred state's totals).
pub(crate) fn run_resumed<F: VmFormat>(
    wl: &Workload<TreeMemslots, F>,
    state: &GuestState,
    run_after: Duration,
    resumed_at: Instant,
) -> f64 {
    let writes0: u64 = state.vcpus.iter().map(|v| v.writes).sum();
    if let Some(rest) = run_after.checked_sub(resumed_at.elapsed()) {
        std::thread::sleep(rest);
    }
    let writes1: u64 = wl
        .control()
        .live
        .iter()
        .map(|l| l.writes.load(Ordering::Relaxed))
        .sum();
    let secs = resumed_at.elapsed().as_secs_f64();
    wl.pause();
    writes1.saturating_sub(writes0) as f64 / secs.max(1e-9)
}
