//! KVM's `dirty_log_perf_test` flow on the arm64 model, checked against
//! the guest's own record.
//!
//! Each vCPU runs the memstress guest code on its own region: every pass
//! writes a stamp (`vCPU << 48 | pass`) to the first word of each page it
//! visits (all pages, or random ones), then asks the host for the next
//! pass with an HVC. Between passes every vCPU waits at EL2, so the host
//! harvests a quiet guest: the pages whose stamp carries the pass number
//! are exactly the pages written in that pass, and the dirty log must name
//! exactly those (0 missing, 0 extra). A write the log misses is a write
//! QEMU let through without a fault: a mapping the engine left writable,
//! or a stale translation in QEMU's TLB after an invalidation the engine
//! did not issue.

use crate::layout;
use crate::passes::{Control, CtlState};
use crate::vm::{Arm64Vm, HvcAnswer, RunStats};
use crate::{entry, Arm64Error, Result};
use s2mmu::dirty::DirtyGfn;
use s2mmu::mmu::FaultStats;
use s2mmu::PteFormat;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The data memslot's id.
pub const DATA_SLOT: u16 = 1;
/// Where guest data sits in the IPA space (not where it sits in RAM, so a
/// translation that ignored the table would show).
pub const DATA_GPA: u64 = 1 << 32;

/// Which pages a pass writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Every page of the region, in order (memstress).
    Sequential,
    /// This many writes to pages chosen by a per-vCPU xorshift generator.
    Random {
        /// Writes per pass.
        writes: u64,
    },
}

/// A dirty-logging run.
#[derive(Clone, Copy, Debug)]
pub struct DirtyConfig {
    /// Guest vCPUs (each with its own region and QEMU CPU).
    pub vcpus: usize,
    /// Bytes each vCPU writes.
    pub bytes_per_vcpu: u64,
    /// Dirty-logging passes after the populate pass.
    pub iterations: u32,
    /// Which pages a pass writes.
    pub pattern: Pattern,
    /// Host page size behind the slot: the largest block a fault maps.
    pub host_page: u64,
    /// Compare every pass's log with the guest's record.
    pub check: bool,
    /// The guest checks that every page it writes holds its own address
    /// (written by the host first): a stale or torn translation shows.
    pub verify_tags: bool,
    /// Turn logging on while the vCPUs run the first logged pass (the
    /// eager split then races the guest); that pass is not checked.
    pub enable_during_pass: bool,
    /// Fault injection: drop the invalidations the host issues while it
    /// harvests after this iteration (the check must then fail).
    pub drop_invalidations_after: Option<u32>,
    /// Fault injection: before harvesting this iteration, the host marks
    /// dirty one page the guest did not write in it (the check must then
    /// count one extra page).
    pub log_unwritten_after: Option<u32>,
    /// At most this many host pages moved to new physical pages while each
    /// logged pass runs, spread over the pass ([`Arm64Vm::remap_host_page`]);
    /// the spare pages follow the slot in guest data RAM.
    pub remaps_per_pass: u64,
    /// Passes run after the logged ones, logging turned off while the first
    /// of them runs (with `HugePageRecovery::Collapse`, the collapse back to blocks
    /// then races the guest); each page's stamp is checked after them.
    pub passes_after_logging: u32,
}

impl Default for DirtyConfig {
    fn default() -> Self {
        DirtyConfig {
            vcpus: 2,
            bytes_per_vcpu: 64 << 20,
            iterations: 3,
            pattern: Pattern::Sequential,
            host_page: 4096,
            check: true,
            verify_tags: false,
            enable_during_pass: false,
            drop_invalidations_after: None,
            log_unwritten_after: None,
            remaps_per_pass: 0,
            passes_after_logging: 0,
        }
    }
}

/// Spare bytes after the slot that `cfg`'s remaps use.
pub fn spare_bytes(cfg: &DirtyConfig, page: u64) -> u64 {
    cfg.remaps_per_pass
        .saturating_mul(u64::from(cfg.iterations))
        .saturating_mul(page)
}

/// One logged pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassReport {
    /// Iteration number (1-based).
    pub iteration: u32,
    /// Wall time of the guest's pass.
    pub dirty_time: Duration,
    /// Time of GET (or the ring harvest).
    pub get_time: Duration,
    /// Time of CLEAR (or the ring reset).
    pub clear_time: Duration,
    /// Pages the log named.
    pub logged: u64,
    /// Pages the guest wrote in the pass (its record), if checked.
    pub written: Option<u64>,
    /// Written but not logged.
    pub missing: u64,
    /// Logged but not written.
    pub extra: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct DirtyReport {
    /// The populate pass (logging off).
    pub populate_time: Duration,
    /// Turning logging on (eager split included).
    pub enable_time: Duration,
    /// Turning it off.
    pub disable_time: Duration,
    /// Each logged pass.
    pub passes: Vec<PassReport>,
    /// The engine's fault counters, summed over vCPUs.
    pub faults: FaultStats,
    /// Per-vCPU exit handling.
    pub runs: Vec<RunStats>,
    /// Exits answered with a resume, and counter ticks from exit entry to
    /// ERET, summed over vCPUs (the stub's own count).
    pub el2_exits: u64,
    /// See `el2_exits`.
    pub el2_ticks: u64,
    /// CNTFRQ_EL0 (ticks per second).
    pub cntfrq: u64,
    /// Maintenance counters.
    pub tlbi: crate::tlbi::TlbiCounters,
    /// Pages holding another page's tag (verify mode): (IPA, value).
    pub bad_tags: Vec<(u64, u64)>,
    /// Host pages moved while the guest ran.
    pub remaps: u64,
    /// After the passes that follow logging: pages whose stamp is the last
    /// pass's (sequential pattern: all of them), and the slot's pages.
    pub after_logging: Option<(u64, u64)>,
    /// Blocks the engine collapsed back in place when logging stopped.
    pub collapsed: u64,
}

impl DirtyReport {
    /// Mean time of one abort's round trip as the stub sees it (exception
    /// entry at EL2 to ERET, the host's handling included), in µs.
    pub fn round_trip_us(&self) -> f64 {
        if self.el2_exits == 0 || self.cntfrq == 0 {
            return 0.0;
        }
        self.el2_ticks as f64 / self.el2_exits as f64 / self.cntfrq as f64 * 1e6
    }

    /// Mean time of the engine's fault path per abort, in µs.
    pub fn engine_us(&self) -> f64 {
        self.per_abort_us(|r| r.engine_ns)
    }

    /// Mean host time per abort (seeing it to answering it), in µs.
    pub fn host_us(&self) -> f64 {
        self.per_abort_us(|r| r.host_ns)
    }

    /// The nanoseconds `ns` takes from each run, summed over the runs, per
    /// abort of all of them, in µs (0 without aborts).
    fn per_abort_us(&self, ns: impl Fn(&RunStats) -> u64) -> f64 {
        let (sum, n) = self
            .runs
            .iter()
            .fold((0, 0), |(sum, n), r| (sum + ns(r), n + r.aborts));
        if n == 0 {
            0.0
        } else {
            sum as f64 / n as f64 / 1e3
        }
    }

    /// Total missing and extra pages over all checked passes.
    pub fn errors(&self) -> (u64, u64) {
        self.passes
            .iter()
            .fold((0, 0), |(m, e), p| (m + p.missing, e + p.extra))
    }
}

fn check_config(vm: &Arm64Vm, cfg: &DirtyConfig) -> Result<u64> {
    let page = vm.format().page_size();
    let cpus = vm.machine().cpus();
    if cfg.vcpus == 0 || cfg.vcpus + 1 > cpus {
        return Err(Arm64Error::Config(format!(
            "{} vCPUs on a machine of {cpus} CPUs (one serves maintenance)",
            cfg.vcpus
        )));
    }
    let unit = cfg.host_page.max(page);
    if cfg.bytes_per_vcpu == 0
        || !cfg.bytes_per_vcpu.is_multiple_of(unit)
        || !cfg.host_page.is_power_of_two()
    {
        return Err(Arm64Error::Config(format!(
            "{} bytes per vCPU: must be a non-zero multiple of the host page ({}) and the granule",
            cfg.bytes_per_vcpu, cfg.host_page
        )));
    }
    let spare = spare_bytes(cfg, page);
    let total = (cfg.vcpus as u64)
        .checked_mul(cfg.bytes_per_vcpu)
        .filter(|&t| {
            t.checked_add(spare)
                .is_some_and(|all| vm.machine().ram().contains(layout::DATA, all))
        })
        .ok_or_else(|| {
            Arm64Error::Config(format!(
                "{} vCPUs x {} bytes (+ {spare} spare for remaps) do not fit the machine's guest data",
                cfg.vcpus, cfg.bytes_per_vcpu
            ))
        })?;
    // The VM's dirty mode says how the host harvests: rings, or GET (+
    // CLEAR with manual protect) for every bitmap mode.
    if let Some(n) = vm.mmu().policy().dirty.ring_entries() {
        if u64::from(n) < cfg.bytes_per_vcpu / page + 64 {
            return Err(Arm64Error::Config(format!(
                "dirty rings of {n} entries cannot hold a pass of {} pages",
                cfg.bytes_per_vcpu / page
            )));
        }
    }
    Ok(total)
}

/// Runs the flow: populate pass, enable logging, `iterations` logged
/// passes each followed by a harvest (and a check), disable logging.
///
/// # Errors
/// [`Arm64Error::Config`] for a run that does not fit the VM; any error of
/// a vCPU's run; the engine's errors.
pub fn run_dirty_log(vm: &Arm64Vm, cfg: &DirtyConfig) -> Result<DirtyReport> {
    let total = check_config(vm, cfg)?;
    let page = vm.format().page_size();
    let shift = vm.format().page_shift();
    let npages = total >> shift;
    vm.add_slot(DATA_SLOT, DATA_GPA, layout::DATA, total, cfg.host_page)?;
    let ram = vm.machine().ram().clone();
    // Fresh stamps and, for verify mode, each page's own IPA in word 1.
    for i in 0..npages {
        ram.write(layout::DATA + i * page, 0);
        ram.write(layout::DATA + i * page + 8, DATA_GPA + i * page);
    }
    let cntfrq = vm.machine().mailbox(0).command(layout::CMD_PING, &[])?;
    let ctl = Control {
        state: Mutex::new(CtlState {
            next: 0,
            stop: false,
            done: vec![None; cfg.vcpus],
            failed: None,
            bad_tags: Vec::new(),
        }),
        cv: Condvar::new(),
    };
    let before: Vec<(u64, u64)> = (0..cfg.vcpus)
        .map(|c| vm.machine().mailbox(c).exit_stats())
        .collect();
    let mut report = DirtyReport {
        cntfrq,
        ..DirtyReport::default()
    };
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for c in 0..cfg.vcpus {
            let ctl = &ctl;
            handles.push(s.spawn(move || vcpu_thread(vm, cfg, ctl, c)));
        }
        let co = Coordinator {
            vm,
            cfg,
            ctl: &ctl,
            npages,
        };
        let r = co.run(&mut report);
        ctl.stop();
        for h in handles {
            match h.join() {
                Ok(Ok((run, stats))) => {
                    report.runs.push(run);
                    report.faults.add(&stats);
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Arm64Error::Guest("a vCPU thread panicked".into())),
            }
        }
        r
    })?;
    for (c, b) in before.iter().enumerate() {
        let (n, t) = vm.machine().mailbox(c).exit_stats();
        report.el2_exits += n - b.0;
        report.el2_ticks += t - b.1;
    }
    report.tlbi = vm.sink().counters();
    report.bad_tags = std::mem::take(&mut ctl.state.lock().unwrap().bad_tags);
    Ok(report)
}

fn vcpu_thread(
    vm: &Arm64Vm,
    cfg: &DirtyConfig,
    ctl: &Control,
    c: usize,
) -> Result<(RunStats, FaultStats)> {
    let page = vm.format().page_size();
    let npages = cfg.bytes_per_vcpu / page;
    let (mode, writes) = match cfg.pattern {
        Pattern::Sequential => (0, 0),
        Pattern::Random { writes } => (1, writes),
    };
    let args = [
        DATA_GPA + c as u64 * cfg.bytes_per_vcpu,
        npages,
        page,
        c as u64,
        mode,
        0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1),
        writes,
        u64::from(cfg.verify_tags),
    ];
    let mut vcpu = vm.mmu().new_vcpu()?;
    let r = vm.run(c, &mut vcpu, entry::MEMSTRESS, args, |e| match e.x[0] {
        layout::HVC_PASS => {
            ctl.report(c, e.x[1]);
            match ctl.next_after(e.x[1]) {
                Some(p) => HvcAnswer::Resume(p, 0),
                None => HvcAnswer::Stop,
            }
        }
        layout::HVC_BAD_TAG => {
            let mut s = ctl.state.lock().unwrap();
            s.bad_tags.push((e.x[1], e.x[2]));
            drop(s);
            ctl.fail(format!(
                "vCPU {c}: page at IPA {:#x} holds {:#x}, not its own address",
                e.x[1], e.x[2]
            ));
            HvcAnswer::Stop
        }
        other => {
            ctl.fail(format!("vCPU {c}: unknown HVC {other:#x}"));
            HvcAnswer::Stop
        }
    });
    match r {
        Ok(st) => Ok((st, vcpu.stats)),
        Err(e) => {
            ctl.fail(format!("vCPU {c}: {e}"));
            Err(e)
        }
    }
}

/// The host side of a dirty-logging run: the passes it starts, the logs
/// it harvests and checks.
struct Coordinator<'a> {
    vm: &'a Arm64Vm,
    cfg: &'a DirtyConfig,
    ctl: &'a Control,
    /// Pages of the data slot.
    npages: u64,
}

impl Coordinator<'_> {
    /// Populates, turns logging on (before the first logged pass or during
    /// it), runs the logged passes with their harvests, then the passes after
    /// logging.
    fn run(&self, report: &mut DirtyReport) -> Result<()> {
        let Coordinator {
            vm,
            cfg,
            ctl,
            npages,
        } = *self;
        let mmu = vm.mmu();
        ctl.wait_all(0)?;
        let t = Instant::now();
        ctl.go(1);
        ctl.wait_all(1)?;
        report.populate_time = t.elapsed();
        if !cfg.enable_during_pass {
            let t = Instant::now();
            mmu.enable_dirty_logging(DATA_SLOT)?;
            report.enable_time = t.elapsed();
        }
        let words = npages.div_ceil(64) as usize;
        let mut bitmap = vec![0u64; words];
        let mut ring: Vec<DirtyGfn> = Vec::new();
        for it in 1..=cfg.iterations {
            let pass = u64::from(it) + 1;
            let t = Instant::now();
            ctl.go(pass);
            let racing = cfg.enable_during_pass && it == 1;
            if racing {
                let t = Instant::now();
                mmu.enable_dirty_logging(DATA_SLOT)?;
                report.enable_time = t.elapsed();
            }
            // Remaps spread over the pass (until it ends or the pass's spare
            // pages are used), so pages move after the guest touched them.
            let mut k = 0;
            while k < cfg.remaps_per_pass && !ctl.all_done(pass) {
                remap_one(vm, npages, u64::from(it - 1) * cfg.remaps_per_pass + k)?;
                report.remaps += 1;
                k += 1;
                std::thread::sleep(Duration::from_micros(50));
            }
            ctl.wait_all(pass)?;
            let dirty_time = t.elapsed();
            if cfg.drop_invalidations_after == Some(it) {
                vm.sink().drop_host_sequences(u64::MAX);
            }
            if cfg.log_unwritten_after == Some(it) {
                let unwritten = (0..npages).find(|&i| !written_in(vm, i, pass));
                mmu.dirty_pages(DATA_SLOT, unwritten)?;
            }
            let (get_time, clear_time) = harvest(vm, npages, &mut bitmap, &mut ring)?;
            if cfg.drop_invalidations_after == Some(it) {
                vm.sink().drop_host_sequences(0);
            }
            let logged = bitmap.iter().map(|w| u64::from(w.count_ones())).sum();
            let mut p = PassReport {
                iteration: it,
                dirty_time,
                get_time,
                clear_time,
                logged,
                ..PassReport::default()
            };
            if cfg.check && !racing {
                let (written, missing, extra) = compare(vm, npages, pass, &bitmap);
                p.written = Some(written);
                p.missing = missing;
                p.extra = extra;
            }
            report.passes.push(p);
        }
        self.passes_after_logging(report)
    }

    /// Logging off (timed) at the start of the passes after logging, if any,
    /// which then run; the pages they wrote and whether huge pages came back.
    fn passes_after_logging(&self, report: &mut DirtyReport) -> Result<()> {
        let (vm, cfg, npages) = (self.vm, self.cfg, self.npages);
        let mmu = vm.mmu();
        if cfg.passes_after_logging == 0 {
            let t = Instant::now();
            mmu.disable_dirty_logging(DATA_SLOT)?;
            report.disable_time = t.elapsed();
            return Ok(());
        }
        let first = u64::from(cfg.iterations) + 2;
        let last = first + u64::from(cfg.passes_after_logging) - 1;
        for pass in first..=last {
            self.ctl.go(pass);
            if pass == first {
                let t = Instant::now();
                mmu.disable_dirty_logging(DATA_SLOT)?;
                report.disable_time = t.elapsed();
            }
            self.ctl.wait_all(pass)?;
        }
        report.collapsed = mmu.vm_stats().collapsed;
        let none = vec![0u64; npages.div_ceil(64) as usize];
        let (written, _, _) = compare(vm, npages, last, &none);
        report.after_logging = Some((written, npages));
        Ok(())
    }
}

/// One pass's harvest into `bitmap` (GET and, with manual protect, CLEAR;
/// or the rings read and reset): the times of the collection and of the
/// re-protection.
fn harvest(
    vm: &Arm64Vm,
    npages: u64,
    bitmap: &mut [u64],
    ring: &mut Vec<DirtyGfn>,
) -> Result<(Duration, Duration)> {
    let mmu = vm.mmu();
    Ok(match mmu.policy().dirty.ring_entries() {
        None => {
            let t = Instant::now();
            mmu.get_dirty_log(DATA_SLOT, bitmap)?;
            let g = t.elapsed();
            let t = Instant::now();
            if mmu.policy().dirty.manual_protect() {
                mmu.clear_dirty_log(DATA_SLOT, 0, npages, bitmap)?;
            }
            (g, t.elapsed())
        }
        Some(_) => {
            let t = Instant::now();
            ring.clear();
            mmu.harvest_rings(ring)?;
            bitmap.iter_mut().for_each(|w| *w = 0);
            for g in ring.iter() {
                if g.slot == u32::from(DATA_SLOT) && g.offset < npages {
                    bitmap[(g.offset / 64) as usize] |= 1 << (g.offset % 64);
                }
            }
            let h = t.elapsed();
            let t = Instant::now();
            mmu.reset_rings()?;
            (h, t.elapsed())
        }
    })
}

/// Moves the `k`-th remap's page (chosen by a fixed hash of `k`) to spare
/// page `k`.
fn remap_one(vm: &Arm64Vm, npages: u64, k: u64) -> Result<()> {
    let page = vm.format().page_size();
    let ram = vm.machine().ram();
    let victim = k.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) % npages;
    let hva = ram.hva(layout::DATA).expect("data in RAM") + victim * page;
    let spare = layout::DATA + npages * page + k * page;
    vm.remap_host_page(hva, spare)
}

/// Whether the guest's stamp says it wrote page `i` of the slot in `pass`
/// (read where the page lives now: remaps move them).
fn written_in(vm: &Arm64Vm, i: u64, pass: u64) -> bool {
    let ram = vm.machine().ram();
    let page = vm.format().page_size();
    let hva0 = ram.hva(layout::DATA).expect("data in RAM");
    let pa = vm
        .host_page_pa(hva0 + i * page)
        .expect("slot pages are backed");
    ram.read(pa) & 0xffff_ffff == pass
}

/// The guest's record against the log: (written, missing, extra). Stamps
/// are read where each page lives now (remaps move them).
fn compare(vm: &Arm64Vm, npages: u64, pass: u64, bitmap: &[u64]) -> (u64, u64, u64) {
    let (mut written, mut missing, mut extra) = (0, 0, 0);
    for i in 0..npages {
        let w = written_in(vm, i, pass);
        let l = bitmap[(i / 64) as usize] >> (i % 64) & 1 == 1;
        written += u64::from(w);
        missing += u64::from(w && !l);
        extra += u64::from(l && !w);
    }
    (written, missing, extra)
}
