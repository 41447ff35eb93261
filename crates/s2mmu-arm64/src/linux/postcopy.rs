//! Post-copy for a Linux VM: on the destination, guest RAM pages that
//! have not arrived are not mapped at stage 2 (a destination maps 4 KiB
//! pages, so mapping one page never maps a missing neighbour); the
//! engine's stage-2 translation fault on such a page is its request. The
//! faulting vCPU's host thread calls the [`PageFetch`] before the engine
//! maps the page and waits there while the other vCPUs run on.
//!
//! [`MissingPages`] is that hook for a migration in one process: a
//! missing page is copied from the paused source's RAM by whichever comes
//! first, the faulting vCPU or the background copy of every missing page.

use super::memory::{LinuxRam, PAGE};
use super::migrate::LinuxVm;
use super::vm::Shared;
use crate::machine::Exit;
use crate::vm::fault_kind;
use crate::{Arm64Error, Result};
use s2mmu::mmu::FaultKind;
use s2mmu_migrate::driver::MAX_ROUNDS;
use s2mmu_migrate::{MigratableVm, MigrateError, Pausable, VmError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Where a destination vCPU's translation fault in guest RAM goes first:
/// the migration library's post-copy hook.
pub use s2mmu_migrate::vm::PageFetch;

/// A hook and the guest-physical range it covers (base, bytes).
pub(crate) type RangeHook = (Arc<dyn PageFetch>, u64, u64);

/// The hook of a running VM.
#[derive(Default)]
pub(crate) struct HookSlot(RwLock<Option<RangeHook>>);

impl HookSlot {
    /// Sets (or with `None` removes) the hook for `[gpa, gpa + size)`.
    pub(crate) fn set(&self, hook: Option<RangeHook>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = hook;
    }

    fn get(&self) -> Option<RangeHook> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Before the engine handles a stage-2 abort: a translation fault in the
/// hooked range waits for its page.
///
/// # Errors
/// [`Arm64Error::Guest`] naming the page when the hook cannot have it.
pub(crate) fn before_fault(sh: &Shared, id: usize, e: &Exit) -> Result<()> {
    let Some((hook, base, size)) = sh.page_fetch.get() else {
        return Ok(());
    };
    let ipa = e.ipa();
    if ipa < base
        || ipa - base >= size
        || !matches!(fault_kind(e.dfsc()), Some(FaultKind::Translation))
    {
        return Ok(());
    }
    hook.fetch(id, ipa & !(PAGE as u64 - 1))
        .map(|_| ())
        .map_err(|why| {
            Arm64Error::Guest(format!(
                "vCPU {id}: the page at IPA {ipa:#x} is not on this host and could not be \
                 fetched: {why}"
            ))
        })
}

/// How long a vCPU waits for a page another thread is copying.
const LAND_WAIT: Duration = Duration::from_secs(60);

fn bit(v: &[AtomicU64], i: u64) -> bool {
    v[(i / 64) as usize].load(Ordering::Acquire) & (1 << (i % 64)) != 0
}

/// The missing pages of a destination in the same process as its paused
/// source, and their copy: the [`PageFetch`] of a post-copy destination.
pub struct MissingPages {
    src: LinuxRam,
    dst: LinuxRam,
    /// Bit set: the page has not landed.
    missing: Vec<AtomicU64>,
    /// Bit set: a thread is copying (or has copied) the page.
    claimed: Vec<AtomicU64>,
    /// Pages missing at the start.
    total: u64,
    left: AtomicU64,
    lock: Mutex<()>,
    cv: Condvar,
    /// Faults on a missing page.
    pub remote_faults: AtomicU64,
    /// Pages copied by a faulting vCPU.
    pub by_fault: AtomicU64,
    /// Pages copied by the background copy.
    pub by_background: AtomicU64,
}

impl MissingPages {
    /// The pages `missing` (page numbers of `dst`) to come from `src`.
    ///
    /// # Errors
    /// [`Arm64Error::Config`] when the RAMs differ in size or a page is
    /// outside them.
    pub fn new(src: LinuxRam, dst: LinuxRam, missing: &[u64]) -> Result<MissingPages> {
        if src.size() != dst.size() || src.gpa() != dst.gpa() {
            return Err(Arm64Error::Config(format!(
                "post-copy between guest RAMs of {:#x} and {:#x} bytes at {:#x} and {:#x}",
                src.size(),
                dst.size(),
                src.gpa(),
                dst.gpa()
            )));
        }
        let pages = dst.pages();
        if let Some(p) = missing.iter().find(|&&p| p >= pages) {
            return Err(Arm64Error::Config(format!(
                "missing page {p} outside the guest's {pages} pages"
            )));
        }
        let words = pages.div_ceil(64) as usize;
        let bits = || (0..words).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        let (m, c) = (bits(), bits());
        let mut total = 0;
        for &p in missing {
            let b = 1u64 << (p % 64);
            if m[(p / 64) as usize].fetch_or(b, Ordering::Relaxed) & b == 0 {
                total += 1;
            }
        }
        Ok(MissingPages {
            src,
            dst,
            missing: m,
            claimed: c,
            total,
            left: AtomicU64::new(total),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            remote_faults: AtomicU64::new(0),
            by_fault: AtomicU64::new(0),
            by_background: AtomicU64::new(0),
        })
    }

    /// Pages missing at the start.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Pages not landed yet.
    pub fn left(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }

    /// Whether page `p` has not landed.
    pub fn is_missing(&self, p: u64) -> bool {
        p < self.dst.pages() && bit(&self.missing, p)
    }

    /// Copies missing page `p` if no other thread claimed it; returns
    /// whether this call copied it.
    fn land(&self, p: u64) -> bool {
        let (w, b) = ((p / 64) as usize, 1u64 << (p % 64));
        if self.missing[w].load(Ordering::Acquire) & b == 0
            || self.claimed[w].fetch_or(b, Ordering::AcqRel) & b != 0
        {
            return false;
        }
        let mut buf = [0u8; PAGE];
        let off = p * PAGE as u64;
        let ok = self.src.read_into(off, &mut buf) && self.dst.write_from(off, &buf);
        debug_assert!(ok, "pages checked in new");
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.missing[w].fetch_and(!b, Ordering::Release);
        self.left.fetch_sub(1, Ordering::AcqRel);
        self.cv.notify_all();
        true
    }

    /// Copies every page still missing, in page order (the background
    /// stream); returns the pages this call copied.
    pub fn copy_all(&self) -> u64 {
        let mut n = 0;
        for p in 0..self.dst.pages() {
            if bit(&self.missing, p) && self.land(p) {
                n += 1;
            }
        }
        self.by_background.fetch_add(n, Ordering::Relaxed);
        n
    }
}

impl PageFetch for MissingPages {
    fn fetch(&self, _vcpu: usize, gpa: u64) -> std::result::Result<bool, String> {
        let p = gpa.wrapping_sub(self.dst.gpa()) / PAGE as u64;
        if !self.is_missing(p) {
            return Ok(false);
        }
        self.remote_faults.fetch_add(1, Ordering::Relaxed);
        if self.land(p) {
            self.by_fault.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        let t = Instant::now();
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while bit(&self.missing, p) {
            if t.elapsed() > LAND_WAIT {
                return Err(format!("page {p} did not land in {LAND_WAIT:?}"));
            }
            g = self
                .cv
                .wait_timeout(g, Duration::from_millis(10))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(true)
    }
}

/// When a migration in one process switches to post-copy.
#[derive(Clone, Copy, Debug)]
pub struct PostcopyPolicy {
    /// Pre-copy passes before the pause, round 0 the first
    /// (0..=[`MAX_ROUNDS`]; 0: none, every page comes after the switch).
    pub precopy_passes: u32,
    /// Pre-copy has converged once a harvest finds at most this many
    /// pages: they are then copied while the source is paused (a plain
    /// stop-and-copy, nothing missing).
    pub switch_below_pages: u64,
}

/// What a post-copy migration in one process did.
#[derive(Clone, Debug)]
pub struct PostcopyReport {
    /// Pages and time of each pre-copy pass, round 0 first.
    pub rounds: Vec<(u64, Duration)>,
    /// Whether pre-copy converged (nothing was left missing).
    pub converged: bool,
    /// Pages copied while the source was paused.
    pub final_pages: u64,
    /// Pages missing on the destination when it resumed.
    pub missing: u64,
    /// From the start of the source's pause to the destination's first
    /// guest instruction.
    pub downtime: Duration,
    /// Destination faults on a missing page.
    pub remote_faults: u64,
    /// Missing pages copied by a faulting vCPU.
    pub by_fault: u64,
    /// Missing pages copied by the background copy.
    pub by_background: u64,
    /// From the destination's resume to the last page landing.
    pub complete: Duration,
    /// Bytes of vCPU and device state.
    pub state_bytes: usize,
}

fn src_err(step: &'static str) -> impl FnOnce(VmError) -> MigrateError {
    move |err| MigrateError::Source { step, err }
}

fn dst_err(step: &'static str) -> impl FnOnce(VmError) -> MigrateError {
    move |err| MigrateError::Destination { step, err }
}

/// Copies `pages` of `s` into `d`; returns how many.
fn copy(s: &LinuxVm, d: &mut LinuxVm, pages: &[u64]) -> std::result::Result<u64, MigrateError> {
    let mut buf = [0u8; PAGE];
    for &p in pages {
        s.read_pages(p, &mut buf)
            .map_err(src_err("reading a page"))?;
        d.write_pages(p, &buf).map_err(dst_err("writing a page"))?;
    }
    Ok(pages.len() as u64)
}

/// The passes' figures, the pages harvested but not copied yet, and
/// whether pre-copy converged.
type Precopied = (Vec<(u64, Duration)>, Vec<u64>, bool);

/// Pre-copy passes of `policy`: returns their figures, the pages
/// harvested but not copied yet, and whether pre-copy converged.
fn precopy(
    src: &mut LinuxVm,
    dst: &mut LinuxVm,
    policy: &PostcopyPolicy,
) -> std::result::Result<Precopied, MigrateError> {
    let mut rounds = Vec::new();
    let mut pending = Vec::new();
    if policy.precopy_passes == 0 {
        return Ok((rounds, pending, false));
    }
    src.start_dirty_log()
        .map_err(src_err("starting dirty logging"))?;
    let t = Instant::now();
    let n = copy(src, dst, &(0..src.page_count()).collect::<Vec<_>>())?;
    rounds.push((n, t.elapsed()));
    for _ in 1..policy.precopy_passes {
        let t = Instant::now();
        pending.clear();
        src.harvest_dirty(&mut pending)
            .map_err(src_err("harvesting"))?;
        if pending.len() as u64 <= policy.switch_below_pages {
            return Ok((rounds, pending, true));
        }
        let n = copy(src, dst, &pending)?;
        pending.clear();
        rounds.push((n, t.elapsed()));
    }
    Ok((rounds, pending, false))
}

/// Migrates `src` into `dst` (blank, of the same size): the pre-copy
/// passes of `policy`, then the source pauses and its state goes over.
/// If pre-copy converged, the last dirty pages are copied during the
/// pause; otherwise the destination resumes with them (or, without
/// pre-copy, every page) missing, and each comes when a vCPU faults on it
/// or by the background copy, which this waits for. `src` stays paused.
///
/// # Errors
/// Sizes that differ, passes over [`MAX_ROUNDS`], a VM's error at the
/// step it failed (before the destination resumes, the source then runs
/// on).
pub fn migrate_postcopy(
    src: &mut LinuxVm,
    dst: &mut LinuxVm,
    policy: &PostcopyPolicy,
) -> std::result::Result<PostcopyReport, MigrateError> {
    if src.page_count() != dst.page_count() {
        return Err(MigrateError::SizeMismatch {
            source: src.page_count(),
            destination: dst.page_count(),
        });
    }
    if policy.precopy_passes > MAX_ROUNDS {
        return Err(MigrateError::Policy(format!(
            "{} pre-copy passes, over {MAX_ROUNDS}",
            policy.precopy_passes
        )));
    }
    let (rounds, mut pending, converged) = precopy(src, dst, policy)?;
    let t0 = Instant::now();
    src.pause().map_err(src_err("pausing"))?;
    let sw = match switch(src, dst, policy.precopy_passes > 0, converged, &mut pending) {
        Ok(h) => h,
        Err(e) => {
            let _ = src.stop_dirty_log();
            let _ = src.resume();
            return Err(e);
        }
    };
    dst.resume().map_err(dst_err("resuming"))?;
    let downtime = t0.elapsed();
    let t1 = Instant::now();
    let h = sw.hook.clone();
    std::thread::scope(|s| s.spawn(move || h.copy_all()).join())
        .map_err(|_| MigrateError::Policy("the background copy panicked".into()))?;
    let complete = t1.elapsed();
    dst.set_page_fetch(None);
    let _ = src.stop_dirty_log();
    let m = &sw.hook;
    Ok(PostcopyReport {
        rounds,
        converged,
        final_pages: sw.final_pages,
        missing: m.total(),
        downtime,
        remote_faults: m.remote_faults.load(Ordering::Relaxed),
        by_fault: m.by_fault.load(Ordering::Relaxed),
        by_background: m.by_background.load(Ordering::Relaxed),
        complete,
        state_bytes: sw.state_bytes,
    })
}

/// What the switch did.
struct Switched {
    hook: Arc<MissingPages>,
    final_pages: u64,
    state_bytes: usize,
}

/// With the source paused: the last harvest (with `pending`) copied now
/// when pre-copy `converged`, else missing (all pages without pre-copy,
/// `logged` false); the state into the destination; the hook set on it.
fn switch(
    src: &mut LinuxVm,
    dst: &mut LinuxVm,
    logged: bool,
    converged: bool,
    pending: &mut Vec<u64>,
) -> std::result::Result<Switched, MigrateError> {
    let mut last: Vec<u64> = if logged {
        src.harvest_dirty(pending)
            .map_err(src_err("the last harvest"))?;
        std::mem::take(pending)
    } else {
        (0..src.page_count()).collect()
    };
    last.sort_unstable();
    last.dedup();
    let final_pages = if converged {
        let n = copy(src, dst, &last)?;
        last.clear();
        n
    } else {
        0
    };
    let state = src.save_state().map_err(src_err("saving the state"))?;
    dst.restore_state(&state)
        .map_err(dst_err("restoring the state"))?;
    let m = MissingPages::new(src.ram().clone(), dst.ram().clone(), &last)
        .map_err(|e| MigrateError::Policy(e.to_string()))?;
    let hook = Arc::new(m);
    dst.set_page_fetch(Some(hook.clone()));
    Ok(Switched {
        hook,
        final_pages,
        state_bytes: state.len(),
    })
}
