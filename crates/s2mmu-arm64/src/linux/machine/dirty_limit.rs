//! The host's brakes on a Linux guest that dirties memory faster than a
//! migration sends it: auto-converge's throttle (a delay owed per page the
//! guest writes, as the simulated guest's) and the dirty limit (each
//! vCPU's pace in pages per second, as KVM's dirty-limit).
//!
//! Both act where the host sees the guest's writes: its stage-2 write
//! faults. While dirty logging is on, each page the guest writes after a
//! harvest faults once (the harvest write-protected it), so a vCPU's write
//! faults are the pages it dirties. `DirtyLimit::on_write_fault` counts
//! one and works out the delay it owes; the vCPU's thread serves that
//! delay (`DirtyLimit::serve`) before it answers the fault, outside
//! guest mode, in short slices, so a pause or a stop never waits for a
//! whole delay. A vCPU that does not write is never slowed.
//!
//! With the engine at EL2 (`DirtyLimit::attach`) the write faults never
//! reach the host: the throttle and the pace go to EL2 (its `PACE`
//! command), which counts each vCPU's dirtied pages in its fault path and
//! works out the same delays; a fault that owes one exits to the host,
//! and the vCPU's thread sleeps it here as it does for the host
//! placement; EL2 then counts the pages dirtied and those ahead of the
//! pace. Under hardware dirty state no write faults at all: auto-converge
//! takes a share of each vCPU's time, owed at its exits (`set_throttle_pct`).

use crate::linux::el2::WeakEl2Vm;
use crate::linux::placement::Placement;
use crate::machine::Exit;
use crate::vm::fault_kind;
use s2mmu::mmu::FaultKind;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread;
use std::time::{Duration, Instant};

/// Throttle owed is slept once it reaches this (shorter sleeps overshoot
/// by more than they last; the sum owed is what counts).
const THROTTLE_BATCH_NS: u64 = 1_000_000;
/// A vCPU ahead of its pace by less than this is not put to sleep yet
/// (its lead is kept and served at a later fault).
const PACE_SLACK_NS: u64 = 200_000;
/// The longest single sleep between checks for a pause or a stop.
const SLICE: Duration = Duration::from_millis(2);
/// The most run time one exit accrues a time share for (QEMU's throttle
/// timeslice): a vCPU paused or idle between two exits owes no more.
const SHARE_SLICE_NS: u64 = 10_000_000;

/// What the brakes did so far, summed over the vCPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirtyLimitCounters {
    /// Stage-2 faults answered that dirty a page (a write, or any
    /// permission fault): each page the guest dirtied while dirty logging
    /// was on, plus first writes to pages not mapped yet.
    pub write_faults: u64,
    /// Nanoseconds the vCPUs slept for the throttle.
    pub throttled_ns: u64,
    /// Write faults that found their vCPU ahead of its pace (each one's
    /// answer waited, or its lead was kept for a later wait).
    pub paced_faults: u64,
    /// Nanoseconds the vCPUs slept for their pace.
    pub paced_ns: u64,
    /// Faults the engine at EL2 answered and then passed to the host for
    /// their vCPU to wait its throttle or pace (0 with the engine here).
    pub el2_paced_exits: u64,
    /// Brakes the engine at EL2 did not take (its machine gone, or its
    /// refusal).
    pub el2_refused: u64,
}

/// One vCPU's state (touched by its own thread only; atomics so the
/// whole is `Sync`).
#[derive(Default)]
struct VcpuLimit {
    /// Throttle owed and not slept yet.
    owed_ns: AtomicU64,
    /// When the vCPU may fault next at its pace (ns since the epoch): a
    /// virtual clock advanced one interval per write fault.
    next_ns: AtomicU64,
    /// The lead over the pace found at the last fault, to sleep.
    lead_ns: AtomicU64,
    /// When the vCPU last left the host under a time share (ns since the
    /// epoch; 0: not yet).
    mark_ns: AtomicU64,
}

/// Throttle and pace of one VM's vCPUs, and their counters.
pub struct DirtyLimit {
    epoch: Instant,
    throttle_ns: AtomicU64,
    /// Auto-converge as a share of time, percent.
    share_pct: AtomicU64,
    pace: AtomicU64,
    vcpus: Vec<VcpuLimit>,
    write_faults: AtomicU64,
    throttled_ns: AtomicU64,
    paced_faults: AtomicU64,
    paced_ns: AtomicU64,
    /// The engine at EL2 applies the brakes ([`DirtyLimit::attach`]).
    at_el2: AtomicBool,
    /// Never held across a command to EL2, except by `attach` for the
    /// old machine's last counts.
    el2: Mutex<El2Link>,
    /// The current EL2 machine's per-vCPU waits (throttle and pace, ns),
    /// which each vCPU's thread takes after every resume at EL2; written
    /// only by `attach`, so those threads never wait behind a command.
    el2_waits: RwLock<Option<Arc<[[AtomicU64; 2]]>>>,
    /// Held from reading the brakes to sending them (`PACE`), so the last
    /// one sent carries the last ones set.
    push: Mutex<()>,
    el2_refused: AtomicU64,
}

/// The engine at EL2 this VM's brakes go to, and its counts: EL2's counters
/// start at 0 on each machine, so those of the machines before are kept.
#[derive(Default)]
struct El2Link {
    vm: Option<WeakEl2Vm>,
    /// Write faults, paced faults and paced exits counted on earlier
    /// machines.
    base: [u64; 3],
    /// The last counts read from the current machine.
    last: [u64; 3],
}

impl El2Link {
    /// Counts read from the current machine (they only grow, so an older
    /// read that lands late changes nothing).
    fn note(&mut self, now: [u64; 3]) {
        for (l, n) in self.last.iter_mut().zip(now) {
            *l = (*l).max(n);
        }
    }

    /// The current machine is left: its counts join the earlier ones'.
    fn fold(&mut self) {
        let last = std::mem::take(&mut self.last);
        for (b, x) in self.base.iter_mut().zip(last) {
            *b += x;
        }
    }

    /// Every EL2 machine's counts: write faults, paced faults, exits.
    fn sums(&self) -> [u64; 3] {
        std::array::from_fn(|i| self.base[i] + self.last[i])
    }
}

/// EL2's counts as the link keeps them.
fn el2_counts(e: &s2mmu_el2::abi::Counters) -> [u64; 3] {
    [e.dirtied, e.paced_pages, e.paced_exits]
}

impl DirtyLimit {
    /// No throttle and no pace, for `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> DirtyLimit {
        DirtyLimit {
            epoch: Instant::now(),
            throttle_ns: AtomicU64::new(0),
            share_pct: AtomicU64::new(0),
            pace: AtomicU64::new(0),
            vcpus: (0..vcpus).map(|_| VcpuLimit::default()).collect(),
            write_faults: AtomicU64::new(0),
            throttled_ns: AtomicU64::new(0),
            paced_faults: AtomicU64::new(0),
            paced_ns: AtomicU64::new(0),
            at_el2: AtomicBool::new(false),
            el2: Mutex::new(El2Link::default()),
            el2_waits: RwLock::new(None),
            push: Mutex::new(()),
            el2_refused: AtomicU64::new(0),
        }
    }

    /// The brakes apply where `host` runs the engine: for the EL2
    /// placement, EL2 gets the throttle and pace set now and each one
    /// set later; for the host placement, the host's fault path. Called
    /// as a VM's machine is made and as its vCPUs start on a machine.
    /// Leaving an EL2 machine reads its counts a last time, if it lives.
    pub(crate) fn attach(&self, host: &dyn Placement) {
        let vm = host.brakes();
        let mut l = self.link();
        let same = matches!((&l.vm, &vm), (Some(a), Some(b)) if a.same_machine(b));
        if same {
            return; // Its brakes are there: a start sends EL2 nothing.
        }
        let old = l.vm.as_ref().and_then(WeakEl2Vm::upgrade);
        if let Some(Ok(e)) = old.map(|v| v.counters()) {
            l.note(el2_counts(&e));
        }
        l.fold();
        *self.el2_waits.write().unwrap_or_else(|p| p.into_inner()) =
            vm.as_ref().map(|v| v.waits.clone());
        l.vm = vm;
        self.at_el2.store(l.vm.is_some(), Ordering::Release);
        drop(l);
        self.push_to_el2();
    }

    fn link(&self) -> MutexGuard<'_, El2Link> {
        self.el2.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends the brakes to EL2, if the engine runs there.
    fn push_to_el2(&self) {
        let _push = self.push.lock().unwrap_or_else(|p| p.into_inner());
        if !self.at_el2.load(Ordering::Acquire) {
            return;
        }
        let vm = self.link().vm.as_ref().and_then(WeakEl2Vm::upgrade);
        let sent = vm.map(|v| v.set_brakes(self.throttle_ns(), self.pace()));
        if !matches!(sent, Some(Ok(()))) {
            self.el2_refused.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Auto-converge: each write fault owes `ns` of sleep (0: none).
    pub fn set_throttle_ns(&self, ns: u64) {
        self.throttle_ns.store(ns, Ordering::Relaxed);
        self.push_to_el2();
    }

    /// The throttle per write fault, in nanoseconds.
    pub fn throttle_ns(&self) -> u64 {
        self.throttle_ns.load(Ordering::Relaxed)
    }

    /// Auto-converge as QEMU's: each vCPU sleeps `pct` % of its time (0:
    /// none, at most 99), owed for the time it ran between its exits and
    /// slept at them (the vCPU thread serves it). For a log whose writes the
    /// host does not see (hardware dirty state), where no write fault
    /// would carry a throttle per page.
    pub fn set_throttle_pct(&self, pct: u32) {
        self.share_pct
            .store(u64::from(pct.min(99)), Ordering::Relaxed);
        for v in &self.vcpus {
            v.mark_ns.store(0, Ordering::Relaxed);
        }
    }

    /// The time share, percent.
    pub fn throttle_pct(&self) -> u32 {
        self.share_pct.load(Ordering::Relaxed) as u32
    }

    /// Adds to what `v` owes the time share of its run since it last left
    /// the host (at most [`SHARE_SLICE_NS`] of it), at `now`.
    fn accrue_share(&self, v: &VcpuLimit, now: u64) {
        let pct = self.share_pct.load(Ordering::Relaxed);
        let mark = v.mark_ns.swap(now, Ordering::Relaxed);
        if pct == 0 || mark == 0 {
            return;
        }
        let ran = now.saturating_sub(mark).min(SHARE_SLICE_NS);
        v.owed_ns
            .fetch_add(ran * pct / (100 - pct), Ordering::Relaxed);
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Dirty limit: at most `pages_per_sec` write faults a second per vCPU
    /// (0: unpaced). A new pace restarts each vCPU's clock, so no lead
    /// built under the old one is owed under the new one.
    pub fn set_pace(&self, pages_per_sec: u64) {
        if self.pace.swap(pages_per_sec, Ordering::Relaxed) != pages_per_sec {
            for v in &self.vcpus {
                v.next_ns.store(0, Ordering::Relaxed);
            }
        }
        self.push_to_el2();
    }

    /// Each vCPU's pace in pages per second (0: unpaced).
    pub fn pace(&self) -> u64 {
        self.pace.load(Ordering::Relaxed)
    }

    /// The counters so far. The write faults and the paced ones add EL2's
    /// counts on each machine the engine ran on there (on the current one
    /// a `COUNTERS` command, sent without holding what a vCPU's exit takes;
    /// on those before, their last counts).
    pub fn counters(&self) -> DirtyLimitCounters {
        let mut c = DirtyLimitCounters {
            write_faults: self.write_faults.load(Ordering::Relaxed),
            throttled_ns: self.throttled_ns.load(Ordering::Relaxed),
            paced_faults: self.paced_faults.load(Ordering::Relaxed),
            paced_ns: self.paced_ns.load(Ordering::Relaxed),
            el2_paced_exits: 0,
            el2_refused: self.el2_refused.load(Ordering::Relaxed),
        };
        if self.at_el2.load(Ordering::Acquire) {
            let weak = self.link().vm.clone();
            let read = weak.as_ref().and_then(WeakEl2Vm::upgrade);
            if let (Some(Ok(e)), Some(w)) = (read.map(|v| v.counters()), weak) {
                let mut l = self.link();
                // Only if `attach` did not move to another machine since.
                if l.vm.as_ref().is_some_and(|v| v.same_machine(&w)) {
                    l.note(el2_counts(&e));
                }
            }
        }
        let n = self.link().sums();
        c.write_faults += n[0];
        c.paced_faults += n[1];
        c.el2_paced_exits = n[2];
        c
    }

    /// vCPU `id` dirtied a page (its write fault was answered by the
    /// engine): counts it and adds what it owes. An `id` out of range is
    /// counted only.
    pub(crate) fn on_write_fault(&self, id: usize) {
        if self.at_el2.load(Ordering::Relaxed) {
            // EL2 counted it, and owes its delays itself.
            return;
        }
        self.on_write_fault_at(id, self.now_ns());
    }

    /// [`DirtyLimit::on_write_fault`] at `now` (ns since the epoch).
    fn on_write_fault_at(&self, id: usize, now: u64) {
        self.write_faults.fetch_add(1, Ordering::Relaxed);
        let Some(v) = self.vcpus.get(id) else {
            return;
        };
        let throttle = self.throttle_ns();
        if throttle > 0 {
            let owed = v.owed_ns.load(Ordering::Relaxed).saturating_add(throttle);
            v.owed_ns.store(owed, Ordering::Relaxed);
        }
        let pace = self.pace();
        if pace == 0 {
            return;
        }
        // A virtual clock that runs one interval per fault: a vCPU whose
        // clock is ahead of now has dirtied faster than its pace, by that
        // lead. One that fell behind (idle, paused, throttled) restarts
        // from now: it does not catch up in a burst.
        let interval = 1_000_000_000 / pace;
        let next = v.next_ns.load(Ordering::Relaxed).max(now);
        v.next_ns
            .store(next.saturating_add(interval), Ordering::Relaxed);
        let lead = next - now;
        v.lead_ns.store(lead, Ordering::Relaxed);
        if lead > 0 {
            self.paced_faults.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Serves what vCPU `id` owes before its fault is answered: the
    /// throttle once a millisecond or more is owed, its lead over its pace
    /// once that is 200 µs or more. Sleeps in slices of 2 ms and returns
    /// early once `interrupted` says so (a pause, a stop); a throttle not
    /// slept stays owed, a lead not slept is still in the pace's clock.
    pub(crate) fn serve(&self, id: usize, interrupted: &dyn Fn() -> bool) {
        let Some(v) = self.vcpus.get(id) else {
            return;
        };
        if self.at_el2.load(Ordering::Relaxed) {
            self.take_el2_wait(id, v);
        }
        let share = self.throttle_pct() > 0;
        if self.throttle_ns() == 0 && !share {
            v.owed_ns.store(0, Ordering::Relaxed);
        }
        if share {
            self.accrue_share(v, self.now_ns());
        }
        let owed = v.owed_ns.load(Ordering::Relaxed);
        if owed >= THROTTLE_BATCH_NS {
            let slept = nap(owed, interrupted);
            v.owed_ns.store(owed - slept, Ordering::Relaxed);
            self.throttled_ns.fetch_add(slept, Ordering::Relaxed);
            if share {
                // The sleep is not run time.
                v.mark_ns.store(self.now_ns(), Ordering::Relaxed);
            }
        }
        let lead = v.lead_ns.swap(0, Ordering::Relaxed);
        if lead >= PACE_SLACK_NS && self.pace() > 0 {
            let slept = nap(lead, interrupted);
            self.paced_ns.fetch_add(slept, Ordering::Relaxed);
        }
    }
}

impl DirtyLimit {
    /// Adds the wait EL2's paced aborts handed vCPU `id` to what it owes:
    /// the throttle to its debt, the pace's lead as its lead.
    fn take_el2_wait(&self, id: usize, v: &VcpuLimit) {
        let (t, p) = {
            let waits = self.el2_waits.read().unwrap_or_else(|p| p.into_inner());
            let w = waits.as_ref().and_then(|w| w.get(id));
            w.map_or((0, 0), |w| {
                (
                    w[0].swap(0, Ordering::Relaxed),
                    w[1].swap(0, Ordering::Relaxed),
                )
            })
        };
        if t > 0 {
            let owed = v.owed_ns.load(Ordering::Relaxed).saturating_add(t);
            v.owed_ns.store(owed, Ordering::Relaxed);
        }
        if p > 0 {
            v.lead_ns.fetch_max(p, Ordering::Relaxed);
        }
    }
}

/// Whether the abort `e`, answered by the engine, dirtied a page while
/// dirty logging is on: a write (the access's WnR, or the guest's stage-1
/// walker updating a descriptor, as [`crate::vm::Arm64Vm::fault`]
/// decides), or any permission fault: the engine's answer to one makes
/// the page writable and logs it, whatever the access was.
pub(crate) fn dirties(e: &Exit) -> bool {
    e.write() || matches!(fault_kind(e.dfsc()), Some(FaultKind::Permission { .. }))
}

/// Sleeps `ns` in slices until done or `interrupted`; returns the
/// nanoseconds slept (at most `ns`).
fn nap(ns: u64, interrupted: &dyn Fn() -> bool) -> u64 {
    let start = Instant::now();
    let want = Duration::from_nanos(ns);
    let mut slept = Duration::ZERO;
    while slept < want && !interrupted() {
        thread::sleep((want - slept).min(SLICE));
        slept = start.elapsed();
    }
    u64::try_from(slept.as_nanos()).unwrap_or(u64::MAX).min(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_write_faults_and_owes_nothing_unbraked() {
        let l = DirtyLimit::new(2);
        for _ in 0..10 {
            l.on_write_fault(0);
            l.serve(0, &|| false);
        }
        l.on_write_fault(7); // no such vCPU: counted only
        l.serve(7, &|| false);
        let c = l.counters();
        assert_eq!(c.write_faults, 11);
        assert_eq!((c.throttled_ns, c.paced_faults, c.paced_ns), (0, 0, 0));
    }

    #[test]
    fn throttle_is_owed_per_fault_and_slept_in_batches() {
        let l = DirtyLimit::new(1);
        l.set_throttle_ns(400_000);
        l.on_write_fault(0);
        l.on_write_fault(0);
        l.serve(0, &|| false);
        // 0.8 ms owed: below the batch, nothing slept yet.
        assert_eq!(l.counters().throttled_ns, 0);
        l.on_write_fault(0);
        l.serve(0, &|| false);
        assert_eq!(l.counters().throttled_ns, 1_200_000);
        // Throttle off: what is owed is forgiven.
        l.on_write_fault(0);
        l.set_throttle_ns(0);
        l.serve(0, &|| false);
        assert_eq!(l.counters().throttled_ns, 1_200_000);
    }

    #[test]
    fn a_time_share_is_owed_per_run_time_and_capped_per_exit() {
        let l = DirtyLimit::new(1);
        let v = &l.vcpus[0];
        l.set_throttle_pct(50);
        // The first exit only marks; 2 ms of run at 50 % owes 2 ms.
        l.accrue_share(v, 1_000_000);
        assert_eq!(v.owed_ns.load(Ordering::Relaxed), 0);
        l.accrue_share(v, 3_000_000);
        assert_eq!(v.owed_ns.load(Ordering::Relaxed), 2_000_000);
        // A second away (paused, idle) owes one slice's share at most.
        l.accrue_share(v, 1_003_000_000);
        assert_eq!(v.owed_ns.load(Ordering::Relaxed), 12_000_000);
        // 20 %: a quarter of the run; 99 % at most.
        l.set_throttle_pct(20);
        l.accrue_share(v, 2_000_000_000);
        l.accrue_share(v, 2_004_000_000);
        assert_eq!(v.owed_ns.load(Ordering::Relaxed), 13_000_000);
        l.set_throttle_pct(150);
        assert_eq!(l.throttle_pct(), 99);
        // Off: nothing accrues, and serving forgives what was owed.
        l.set_throttle_pct(0);
        l.accrue_share(v, 3_000_000_000);
        l.accrue_share(v, 3_005_000_000);
        assert_eq!(v.owed_ns.load(Ordering::Relaxed), 13_000_000);
        l.serve(0, &|| false);
        assert_eq!(
            (v.owed_ns.load(Ordering::Relaxed), l.counters().throttled_ns),
            (0, 0)
        );
    }

    #[test]
    fn a_vcpu_faster_than_its_pace_is_held_back() {
        let l = DirtyLimit::new(1);
        // 1 ms a page.
        l.set_pace(1000);
        // 20 faults at the same instant: each one's lead is a millisecond
        // more than the last one's.
        for i in 0..20u64 {
            l.on_write_fault_at(0, 5_000_000);
            assert_eq!(l.vcpus[0].lead_ns.load(Ordering::Relaxed), i * 1_000_000);
        }
        let c = l.counters();
        assert_eq!((c.write_faults, c.paced_faults), (20, 19));
        // The last lead (19 ms) is slept whole.
        l.serve(0, &|| false);
        assert_eq!(l.counters().paced_ns, 19_000_000);
        // A vCPU that fell behind its clock restarts from now, no burst
        // and no lead.
        l.on_write_fault_at(0, 1_000_000_000);
        assert_eq!(l.vcpus[0].lead_ns.load(Ordering::Relaxed), 0);
        assert_eq!(l.counters().paced_faults, 19);
        // A lead under the slack (100 µs at 10,000 a second) is kept on
        // the clock, not slept.
        l.set_pace(10_000);
        l.on_write_fault_at(0, 2_000_000_000);
        l.on_write_fault_at(0, 2_000_000_000);
        assert_eq!(l.counters().paced_faults, 20);
        l.serve(0, &|| false);
        assert_eq!(l.counters().paced_ns, 19_000_000);
        assert_eq!(l.vcpus[0].next_ns.load(Ordering::Relaxed), 2_000_200_000);
    }

    #[test]
    fn a_new_pace_restarts_the_clock() {
        let l = DirtyLimit::new(2);
        // 100 a second: 10 ms a page. Five faults at one instant put the
        // clock 50 ms on.
        l.set_pace(100);
        for _ in 0..5 {
            l.on_write_fault_at(1, 3_000_000);
        }
        assert_eq!(l.vcpus[1].next_ns.load(Ordering::Relaxed), 53_000_000);
        // Loosened: the lead built under the old pace is not owed.
        l.set_pace(1000);
        l.on_write_fault_at(1, 3_000_000);
        assert_eq!(l.vcpus[1].lead_ns.load(Ordering::Relaxed), 0);
        l.on_write_fault_at(1, 3_000_000);
        assert_eq!(l.vcpus[1].lead_ns.load(Ordering::Relaxed), 1_000_000);
        // The same pace again keeps the clock.
        l.set_pace(1000);
        l.on_write_fault_at(1, 3_000_000);
        assert_eq!(l.vcpus[1].lead_ns.load(Ordering::Relaxed), 2_000_000);
        // Off, then on: no lead from before.
        l.set_pace(0);
        l.set_pace(1000);
        l.on_write_fault_at(1, 3_000_000);
        assert_eq!(l.vcpus[1].lead_ns.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn el2_counts_sum_over_machines_and_a_late_read_changes_nothing() {
        let mut k = El2Link::default();
        k.note([10, 2, 1]);
        // An older read landing after a newer one.
        k.note([7, 1, 1]);
        assert_eq!(k.sums(), [10, 2, 1]);
        // Leaving the machine keeps its counts; the next starts at 0.
        k.fold();
        assert_eq!((k.base, k.last), ([10, 2, 1], [0; 3]));
        k.note([5, 0, 3]);
        assert_eq!(k.sums(), [15, 2, 4]);
        k.fold();
        assert_eq!(k.sums(), [15, 2, 4]);
    }

    #[test]
    fn counters_keep_el2_counts_after_a_move_to_the_host() {
        let l = DirtyLimit::new(1);
        // Counts from EL2 machines before, the engine on the host now.
        l.link().base = [40, 6, 3];
        l.on_write_fault(0);
        let c = l.counters();
        assert_eq!((c.write_faults, c.paced_faults), (41, 6));
        assert_eq!(c.el2_paced_exits, 3);
    }

    #[test]
    fn an_interrupted_sleep_returns_early() {
        let l = DirtyLimit::new(1);
        l.set_throttle_ns(10_000_000_000); // 10 s a fault
        l.on_write_fault(0);
        l.serve(0, &|| true);
        // Nothing slept, all still owed.
        assert_eq!(l.counters().throttled_ns, 0);
        assert_eq!(l.vcpus[0].owed_ns.load(Ordering::Relaxed), 10_000_000_000);
    }
}
