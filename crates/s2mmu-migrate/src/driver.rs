//! In-process pre-copy migration between two [`MigratableVm`]s: round 0
//! copies every page while the source runs, later rounds copy what the
//! dirty harvest names, then the source is paused, the last dirty pages
//! and the state are copied, the destination's digest taken, and the
//! destination resumed; the source's digest of its frozen memory is
//! compared after that, outside the downtime (as the network session
//! does). The source never runs again after a successful switch; after a
//! failure before the destination resumes, or a digest that differs (the
//! destination is then paused again), it runs on.

use crate::error::MigrateError;
use crate::vm::{MigratableVm, PAGE_SIZE};
use std::time::{Duration, Instant};

/// Most pre-copy rounds a policy may ask for.
pub const MAX_ROUNDS: u32 = 1000;

/// When pre-copy stops and the switch begins.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// Pre-copy rounds after round 0 at most, 0..=[`MAX_ROUNDS`].
    pub max_rounds: u32,
    /// Stop pre-copy once a harvest finds at most this many pages.
    pub switch_below_pages: u64,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            max_rounds: 8,
            switch_below_pages: 256,
        }
    }
}

/// One round's figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    /// Pages copied.
    pub pages: u64,
    /// Time the round took.
    pub time: Duration,
}

/// What a migration did.
#[derive(Clone, Debug)]
pub struct MigrationReport {
    /// Pre-copy rounds, round 0 first.
    pub rounds: Vec<Round>,
    /// Pages copied while the source was paused.
    pub final_pages: u64,
    /// Bytes of vCPU and device state.
    pub state_bytes: usize,
    /// The digest both memories had at the switch.
    pub digest: u64,
    /// From the start of the source's pause to the destination running
    /// guest code ([`crate::Pausable::resume`] returning).
    pub downtime: Duration,
    /// Of the downtime: pausing the source.
    pub pause_time: Duration,
    /// Of the downtime: the destination's digest.
    pub dest_digest_time: Duration,
    /// After the downtime: the source's digest and the comparison.
    pub digest_time: Duration,
}

fn src(step: &'static str) -> impl FnOnce(crate::VmError) -> MigrateError {
    move |err| MigrateError::Source { step, err }
}

fn dst(step: &'static str) -> impl FnOnce(crate::VmError) -> MigrateError {
    move |err| MigrateError::Destination { step, err }
}

fn copy_pages<S: MigratableVm, D: MigratableVm>(
    s: &S,
    d: &mut D,
    pages: impl Iterator<Item = u64>,
) -> Result<u64, MigrateError> {
    let mut buf = [0u8; PAGE_SIZE];
    let mut n = 0;
    for p in pages {
        s.read_page(p, &mut buf).map_err(src("reading a page"))?;
        d.write_page(p, &buf).map_err(dst("writing a page"))?;
        n += 1;
    }
    Ok(n)
}

/// Migrates `s` into `d`, which must have the same number of pages and
/// not have run. `d` runs on afterwards; `s` stays paused.
///
/// # Errors
/// [`MigrateError::Policy`] and [`MigrateError::SizeMismatch`] before
/// anything starts; a VM's error at the step it failed; the destination's
/// refusal of the state; [`MigrateError::DigestMismatch`] (the
/// destination, which had resumed, is paused again). On any error after
/// the source's pause and before the destination resumed, and on a
/// digest mismatch, the source is resumed (if that fails too, the first
/// error is returned).
pub fn migrate<S: MigratableVm, D: MigratableVm>(
    s: &mut S,
    d: &mut D,
    policy: &Policy,
) -> Result<MigrationReport, MigrateError> {
    if policy.max_rounds > MAX_ROUNDS {
        return Err(MigrateError::Policy(format!(
            "max_rounds {} over {MAX_ROUNDS}",
            policy.max_rounds
        )));
    }
    if s.page_count() != d.page_count() {
        return Err(MigrateError::SizeMismatch {
            source: s.page_count(),
            destination: d.page_count(),
        });
    }
    s.start_dirty_log().map_err(src("starting dirty logging"))?;
    let mut dirty = Vec::new();
    let rounds = precopy_rounds(s, d, policy, &mut dirty)?;
    let t0 = Instant::now();
    s.pause().map_err(src("pausing"))?;
    let pause_time = t0.elapsed();
    let (final_pages, state_bytes, digest, dest_digest_time) = match switch(s, d, &mut dirty) {
        Ok(r) => r,
        Err(e) => {
            let _ = s.stop_dirty_log();
            let _ = s.resume();
            return Err(e);
        }
    };
    d.resume().map_err(dst("resuming"))?;
    let downtime = t0.elapsed();
    // Logging served the migration only; the source stays paused.
    let _ = s.stop_dirty_log();
    let t = Instant::now();
    let verified = s.memory_digest().map_err(src("digest")).and_then(|a| {
        (a == digest)
            .then_some(())
            .ok_or(MigrateError::DigestMismatch {
                source: a,
                destination: digest,
            })
    });
    if let Err(e) = verified {
        // The destination runs on memory that is not the source's: the
        // guest goes back to the source.
        let _ = d.pause();
        let _ = s.resume();
        return Err(e);
    }
    Ok(MigrationReport {
        rounds,
        final_pages,
        state_bytes,
        digest,
        downtime,
        pause_time,
        dest_digest_time,
        digest_time: t.elapsed(),
    })
}

/// Round 0 (every page) and the pre-copy rounds after it, until one
/// copies at most `policy.switch_below_pages` or the rounds run out.
fn precopy_rounds<S: MigratableVm, D: MigratableVm>(
    s: &mut S,
    d: &mut D,
    policy: &Policy,
    dirty: &mut Vec<u64>,
) -> Result<Vec<Round>, MigrateError> {
    let mut rounds = Vec::new();
    let t = Instant::now();
    let n = copy_pages(s, d, 0..s.page_count())?;
    rounds.push(Round {
        pages: n,
        time: t.elapsed(),
    });
    for _ in 0..policy.max_rounds {
        let t = Instant::now();
        dirty.clear();
        s.harvest_dirty(dirty).map_err(src("harvesting"))?;
        let n = copy_pages(s, d, dirty.iter().copied())?;
        rounds.push(Round {
            pages: n,
            time: t.elapsed(),
        });
        if n <= policy.switch_below_pages {
            break;
        }
    }
    Ok(rounds)
}

/// Stop-and-copy with the source paused: the last dirty pages, the state,
/// the destination's digest. Returns pages copied, state bytes, the
/// digest and the time it took.
fn switch<S: MigratableVm, D: MigratableVm>(
    s: &mut S,
    d: &mut D,
    dirty: &mut Vec<u64>,
) -> Result<(u64, usize, u64, Duration), MigrateError> {
    dirty.clear();
    s.harvest_dirty(dirty).map_err(src("the last harvest"))?;
    let pages = copy_pages(s, d, dirty.iter().copied())?;
    let state = s.save_state().map_err(src("saving the state"))?;
    d.restore_state(&state)
        .map_err(dst("restoring the state"))?;
    let t = Instant::now();
    let b = d.memory_digest().map_err(dst("digest"))?;
    Ok((pages, state.len(), b, t.elapsed()))
}
