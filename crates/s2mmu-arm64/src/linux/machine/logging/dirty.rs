//! Dirty logging under a running Linux, checked without trusting the
//! engine: every harvest the host hashes each guest page, and a page whose
//! content changed must be in the log of that harvest or of the next one
//! (a write after a harvest's re-protection shows up in the next). A page
//! that changed and is in neither was written without the engine knowing:
//! a lost page.

use crate::layout;
use crate::linux::changes::{Changer, HostChange};
use crate::linux::el2_inject::{El2Inject, El2Trace};
use crate::linux::placement::Placement;
use crate::linux::shared::{RamFaults, StopReason, RAM_IPA};
use crate::Result;
use s2mmu::mmu::{DirtyMode, HugePageRecovery, HwDirtyBlocks, MmuPolicy, Protect};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The ring size of a Linux guest's dirty rings, [`RING`]'s: a harvest
/// each 100 ms of a guest writing tens of MiB a second fills the engine's
/// default of 4096 entries per vCPU between harvests.
pub const RING_ENTRIES: u32 = 16384;

/// Write protection, GET re-protects (`KVM_GET_DIRTY_LOG` alone): reports
/// call it `wp-get`; no `--dirty` name selects it (`--dirty wp` is [`MANUAL`]).
pub const WP_GET: DirtyMode = DirtyMode::Bitmap {
    protect: Protect::OnGet,
};
/// Write protection, GET then CLEAR (manual protect, the engine's
/// [`DirtyMode::WP`]): `--dirty wp`, also spelled `--dirty manual`.
pub const MANUAL: DirtyMode = DirtyMode::WP;
/// Write protection into per-vCPU dirty rings of [`RING_ENTRIES`]: `--dirty ring`.
pub const RING: DirtyMode = DirtyMode::Ring {
    entries: RING_ENTRIES,
};
/// Hardware dirty state (FEAT_HAFDBS: VTCR_EL2.HA/HD, DBM leaves), GET
/// cleans, huge mappings split first: reports call it `hw-get`; `--dirty hw`
/// is the engine's [`DirtyMode::HW`] (manual protect: GET copies, CLEAR cleans).
pub const HW_GET: DirtyMode = DirtyMode::Hardware {
    protect: Protect::OnGet,
    blocks: HwDirtyBlocks::SplitFirst,
};

/// The engine's policy for a Linux guest harvested under `mode` (`None`:
/// no logging) with `change` made between harvests: eager split on, the
/// default chunk; a collapse needs [`HugePageRecovery::Collapse`].
pub fn policy_for(mode: Option<DirtyMode>, change: HostChange) -> MmuPolicy {
    let mut p = MmuPolicy {
        // With no logging nothing harvests: the plainest bitmap mode (GET
        // re-protects; no rings, no CLEAR) serves.
        dirty: mode.unwrap_or(WP_GET),
        ..MmuPolicy::default()
    };
    if let HostChange::Collapse { .. } = change {
        p.huge_page_recovery = HugePageRecovery::Collapse;
    }
    p
}

/// How the harvester runs.
#[derive(Clone, Copy, Debug)]
pub struct HarvestConfig {
    /// The engine's dirty mode the harvester collects, `None` for no
    /// logging. Rings are harvested and reset; every other mode by GET,
    /// and CLEAR after it where the mode has manual protect.
    pub mode: Option<DirtyMode>,
    /// Time between harvests.
    pub period: Duration,
    /// Fault injection: drop the invalidations host threads issue from
    /// this harvest on (see [`HarvestReport::dropped`]). With the engine at
    /// EL2, EL2 withholds its own for this harvest and a collapse and
    /// split after it, recording them in [`HarvestReport::el2_trace`]
    /// (`el2_inject.rs`).
    pub drop_invalidations_from: Option<u64>,
    /// Fault injection: discard this harvest's log, as a harvest that lost
    /// its result would (the check must then report lost pages).
    pub discard_log: Option<u64>,
    /// What the host changes under the guest between harvests.
    pub change: HostChange,
    /// Stop the guest ([`crate::linux::vm::StopReason::Timeout`]) this long after
    /// logging started, `None` for no such cut: a fault-injection run whose
    /// guest may stall ends without waiting for the whole run's limit, which
    /// counts from before the boot (over a minute on a loaded machine).
    pub cut_after: Option<Duration>,
}

impl Default for HarvestConfig {
    /// No logging (the guest's pages are mapped writable and never
    /// harvested), a harvest each 100 ms once a mode is set, no fault
    /// injected, no change under the guest.
    fn default() -> Self {
        HarvestConfig {
            mode: None,
            period: Duration::from_millis(100),
            drop_invalidations_from: None,
            discard_log: None,
            change: HostChange::default(),
            cut_after: None,
        }
    }
}

impl HarvestConfig {
    /// The engine's policy for this harvest ([`policy_for`]).
    pub fn policy(&self) -> MmuPolicy {
        policy_for(self.mode, self.change)
    }
}

/// What the harvester saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HarvestReport {
    /// Harvests made.
    pub harvests: u64,
    /// Pages logged over all harvests.
    pub logged: u64,
    /// Pages whose content changed between two harvests.
    pub changed: u64,
    /// Changed pages in no log (must be 0).
    pub lost: u64,
    /// The first lost pages' guest-physical addresses.
    pub lost_examples: Vec<u64>,
    /// Host ns spent harvesting (GET/CLEAR or ring harvest and reset).
    pub harvest_ns: u64,
    /// Host ns spent hashing guest RAM.
    pub hash_ns: u64,
    /// Invalidation sequences dropped by fault injection.
    pub dropped: u64,
    /// Guest pages the host moved ([`HostChange::Remap`]).
    pub remapped: u64,
    /// Blocks collapsed back in place when logging stopped
    /// ([`HostChange::Collapse`]).
    pub collapsed: u64,
    /// Times logging stopped and started again.
    pub pauses: u64,
    /// Times the framebuffer's memslot moved ([`HostChange::MoveSlot`]).
    pub moves: u64,
    /// Each harvest's end in microseconds since logging started, and the
    /// pages it logged (the first [`MAX_HARVEST_POINTS`] harvests).
    pub per_harvest: Vec<(u64, u64)>,
    /// EL2's break-before-make trace around its withheld invalidations.
    pub el2_trace: Option<El2Trace>,
    /// Framebuffer pages logged in each finished pass of
    /// [`HostChange::Paced`].
    pub per_pass: Vec<u64>,
}

/// The most harvests [`HarvestReport::per_harvest`] keeps.
pub const MAX_HARVEST_POINTS: usize = 100_000;

impl HarvestReport {
    /// Counts a harvest that logged `bitmap`'s pages.
    fn record(&mut self, bitmap: &[u64], logging_since: Instant) {
        let logged = bitmap
            .iter()
            .map(|w| u64::from(w.count_ones()))
            .sum::<u64>();
        self.harvests += 1;
        self.logged += logged;
        if self.per_harvest.len() < MAX_HARVEST_POINTS {
            let at = logging_since.elapsed().as_micros() as u64;
            self.per_harvest.push((at, logged));
        }
    }
}

/// The guest RAM as words shared with QEMU.
fn ram_words(vm: &dyn Placement, bytes: u64) -> &[AtomicU64] {
    let p = vm
        .machine()
        .ram()
        .ptr(layout::DATA, bytes)
        .expect("guest RAM lies inside the machine's data region");
    // SAFETY: `p` points at `bytes` bytes of the shared mapping, 8-byte
    // aligned (DATA is), valid for the engine's VM's lifetime (the machine
    // owns it); QEMU and this process only access it with
    // single-copy-atomic loads and stores, which AtomicU64 is.
    unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), (bytes / 8) as usize) }
}

/// Hashes every guest page where it lies now (`loc`: its page index in the
/// data region, which a remap changes).
fn hash_pages(words: &[AtomicU64], loc: &[u64], out: &mut [u64]) {
    for (h, &at) in out.iter_mut().zip(loc) {
        let i = at as usize;
        let mut x = 0xcbf2_9ce4_8422_2325u64;
        for w in &words[i * 512..(i + 1) * 512] {
            x = (x ^ w.load(Ordering::Relaxed)).wrapping_mul(0x0100_0000_01b3);
        }
        *h = x;
    }
}

/// The running VM as the harvester sees it besides the engine and the
/// fault path: whether it stops, and its stop (which takes every vCPU out
/// of its guest).
pub(crate) trait RunState {
    /// Whether the VM stops (or has stopped).
    fn stopping(&self) -> bool;
    /// Stops the VM for `why`.
    fn stop(&self, why: StopReason);
}

/// Turns logging on for guest RAM and harvests every `cfg.period` until
/// the VM stops, checking every page's content against the logs, and
/// making `cfg.change` between harvests.
///
/// # Errors
/// The engine's errors.
pub(crate) fn run_harvester(
    vm: &dyn Placement,
    faults: &RamFaults,
    run: &dyn RunState,
    cfg: &HarvestConfig,
    mem: u64,
) -> Result<HarvestReport> {
    let ram_pages = mem / 4096;
    let words = ram_words(vm, mem + cfg.change.spare_bytes());
    let mut changer = Changer::new(cfg.change, ram_pages);
    let mut inject = El2Inject::new(vm, cfg.drop_invalidations_from);
    let slots = changer.slots(ram_pages);
    let npages = ram_pages + cfg.change.fb_pages(); // RAM's, then the framebuffer's
    let mut rep = HarvestReport::default();
    let (mut prev, mut now) = (vec![0u64; npages as usize], vec![0u64; npages as usize]);
    let mut bitmap = vec![0u64; npages.div_ceil(64) as usize];
    let (mut ring, mut carry) = (Vec::new(), Vec::<u64>::new());
    for &(slot, _, _) in slots.iter().filter(|_| cfg.mode.is_some()) {
        vm.enable_dirty_logging(slot)?;
    }
    // The hashes the first window starts from: taken after logging is on,
    // so every later write is either logged or a loss.
    hash_pages(words, &changer.loc, &mut prev);
    let logging_since = Instant::now();
    while !run.stopping() {
        std::thread::sleep(cfg.period);
        if cfg.cut_after.is_some_and(|c| logging_since.elapsed() > c) {
            run.stop(StopReason::Timeout);
            break;
        }
        if changer.paused() {
            if changer.tick_paused(vm)? {
                // Logging is on again: a fresh start, as at the beginning.
                hash_pages(words, &changer.loc, &mut prev);
            }
            continue;
        }
        if changer.pass_running(vm) {
            continue;
        }
        if cfg.drop_invalidations_from == Some(rep.harvests) {
            vm.sink().drop_host_sequences(u64::MAX);
        }
        changer.before_harvest(faults, rep.harvests);
        inject.before_harvest(vm, rep.harvests)?;
        let t = Instant::now();
        match cfg.mode {
            Some(mode) => vm.harvest(mode, &slots, &mut bitmap, &mut ring)?,
            None => bitmap.fill(0),
        }
        rep.harvest_ns += t.elapsed().as_nanos() as u64;
        changer.move_framebuffer(vm, faults, ram_pages, cfg.mode, &mut bitmap)?;
        if cfg.discard_log == Some(rep.harvests) {
            bitmap.fill(0);
        }
        rep.record(&bitmap, logging_since);
        let t = Instant::now();
        check_window(
            &bitmap,
            &mut carry,
            &mut rep,
            ram_pages,
            |now_h| hash_pages(words, &changer.loc, now_h),
            &mut prev,
            &mut now,
        );
        rep.hash_ns += t.elapsed().as_nanos() as u64;
        changer.after_harvest(vm, rep.harvests, &bitmap)?;
        if let Some(p) = changer.host_written() {
            hash_pages(words, &changer.loc[p..=p], &mut prev[p..=p]);
        }
        rep.el2_trace = inject.after_harvest(vm)?.or(rep.el2_trace.take());
        if changer.paused() {
            // Pages carried to the next log cannot be judged: no next log.
            carry.clear();
        }
    }
    finish(vm, changer, &mut rep);
    Ok(rep)
}

/// The harvester's end: the host's dropped invalidations and what
/// `changer` did, into `rep`.
fn finish(vm: &dyn Placement, changer: Changer, rep: &mut HarvestReport) {
    vm.sink().drop_host_sequences(0);
    rep.dropped = vm.sink().counters().dropped;
    rep.remapped = changer.remapped;
    rep.collapsed = changer.collapsed;
    rep.pauses = changer.pauses;
    rep.moves = changer.moves;
    rep.per_pass = changer.per_pass;
}

/// The guest-physical address of bit `p`: guest RAM's `ram_pages`, then
/// the framebuffer's.
fn ipa_of(p: u64, ram_pages: u64) -> u64 {
    if p < ram_pages {
        RAM_IPA + p * 4096
    } else {
        crate::linux::changes::FB_IPA + (p - ram_pages) * 4096
    }
}

/// One harvest's check: the pages carried from the last window must be in
/// this log; a page whose hash changed since the last window and is in
/// this log is fine, else it must be in the next (carried).
fn check_window(
    bitmap: &[u64],
    carry: &mut Vec<u64>,
    rep: &mut HarvestReport,
    ram_pages: u64,
    hash: impl FnOnce(&mut [u64]),
    prev: &mut Vec<u64>,
    now: &mut Vec<u64>,
) {
    let logged = |p: u64| bitmap[(p / 64) as usize] >> (p % 64) & 1 == 1;
    for &p in carry.iter() {
        if !logged(p) {
            rep.lost += 1;
            if rep.lost_examples.len() < 16 {
                rep.lost_examples.push(ipa_of(p, ram_pages));
            }
        }
    }
    hash(now);
    carry.clear();
    for p in 0..now.len() as u64 {
        if now[p as usize] != prev[p as usize] {
            rep.changed += 1;
            if !logged(p) {
                carry.push(p);
            }
        }
    }
    std::mem::swap(prev, now);
}
