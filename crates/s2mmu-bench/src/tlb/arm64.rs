//! `tlb-perf --arm64`: the TLB range policy where a TLB call is a real round trip to
//! EL2. The slot is mapped with 4K pages over the arm64 model's sparse
//! guest RAM (untouched: only its tables take memory), logged, dirtied as
//! guest writes would dirty it, then got and cleared, whole and in
//! `--chunk` clears, with each large-range policy. Every invalidation the
//! clears issue is a sequence of TLBI instructions that the EL2 service CPU
//! executes (QEMU's own TLB judges them); the host thread waits for it.
//! Counted per cycle: service calls (round trips to EL2), TLBI
//! instructions, the time spent waiting for them and its share of the
//! clear. QEMU's timings are an emulator's: the counts are the result, the
//! times are read as ratios. The check that QEMU can fail on a wrong TLBI
//! operand runs after the cycles.

use super::cycle::{map_and_log, CycleTimes, SlotFacts};
use super::{alternate, Config, Mode, ModeSamples, PAGE, POLICIES};
use crate::arm64 as a64;
use crate::{human_bytes, Bars};
use s2mmu::mmu::MmuPolicy;
use s2mmu::tlb::LargeRangePolicy;
use s2mmu_arm64::effect::{protect_effect, spread, ProtectEffect};
use s2mmu_arm64::layout;
use s2mmu_arm64::vm::{Arm64Mmu, Arm64Vm, VmConfig};
use s2mmu_arm64::walk_cache::{change_stage1_table, AfterMove, Stage2Change, WalkCacheReport};
use std::time::{Duration, Instant};

const BIG_SLOT: u16 = 1;
/// Most round trips to EL2 one cycle may make.
const MAX_CALLS: u64 = 1 << 16;
/// Where the slot sits in the IPA space.
const BIG_GPA: u64 = 1 << 32;
/// Pages the effect check writes, harvests and writes again.
const EFFECT_PAGES: u64 = 8;

/// One measured harvest cycle: what every model measures, and the TLBIs
/// the EL2 service CPU executed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// What every model measures.
    pub times: CycleTimes,
    /// TLBI instructions the service CPU executed.
    pub tlbis: u64,
    /// Maintenance sequences host threads sent.
    pub sequences: u64,
    /// Of `times.inv`, the service CPU's own time on the calls (its
    /// counter stamps at each call's pickup and end); the rest is the wait
    /// for the stub to pick the calls up (it may be in an idle wait of up
    /// to 640 µs) and for the host to see the answers.
    pub work: Duration,
}

/// Checks the settings ([`super::check`]) and what only the arm64 model
/// limits, before QEMU starts.
///
/// # Errors
/// A message naming the flag (the setting of the same name) and its limit.
pub fn check(p: &Config) -> Result<(), String> {
    super::check(p)?;
    if p.size > a64::MAX_BYTES {
        return Err(format!(
            "--mem {}: the arm64 model holds at most {} of guest data",
            human_bytes(p.size),
            human_bytes(a64::MAX_BYTES)
        ));
    }
    // The slot stays untouched; its 4K tables (1/512 of it) are real memory
    // in the table arena.
    let tables = p.size / 512 + (16 << 20);
    if tables > a64::TABLE_BYTES {
        return Err(format!(
            "--mem {}: its tables do not fit the arm64 model's table arena of {}",
            human_bytes(p.size),
            human_bytes(a64::TABLE_BYTES)
        ));
    }
    a64::check_touched("--mem (its page tables)", tables)?;
    // Every call is a round trip to EL2 (tens of microseconds under QEMU):
    // bound the calls one cycle of split calls makes.
    let npages = p.size / PAGE;
    let calls = npages
        .div_ceil(p.chunk / PAGE)
        .saturating_mul(npages.div_ceil(p.limit_pages));
    if calls > MAX_CALLS {
        return Err(format!(
            "--limit-pages {} with --chunk {}: {calls} round trips to EL2 per cycle; at most {MAX_CALLS} on the arm64 model (raise --limit-pages or --chunk)",
            p.limit_pages,
            human_bytes(p.chunk)
        ));
    }
    Ok(())
}

struct Bench<'a> {
    vm: &'a Arm64Vm,
    npages: u64,
    chunk_pages: u64,
    p: &'a Config,
    bitmap: Vec<u64>,
}

impl Bench<'_> {
    fn mmu(&self) -> &Arm64Mmu {
        self.vm.mmu()
    }

    /// Dirties every `--dirty-every`th page as a guest write's fault would.
    /// The fault path's relax of the permissions ends with a local TLBI for
    /// the faulting CPU (KVM's `__kvm_tlb_flush_vmid_ipa_nsh`); a real fault
    /// carries it in its answer to that CPU. Here no vCPU runs, so they are
    /// collected as a fault's answer is (a few thousand pages at a time) and
    /// not sent: sending them from this host thread would make each page a
    /// round trip to the service CPU, a cost no guest write pays. They are
    /// not counted in the cycle's figures either way (taken after this).
    fn dirty(&self) -> Result<u64, String> {
        const BATCH: u64 = 4096;
        let every = self.p.dirty_every.max(1);
        let mut dirtied = 0;
        let mut first = 0;
        while first < self.npages {
            let end = first.saturating_add(BATCH * every).min(self.npages);
            let (r, _local) = self.vm.sink().collect_for_fault(|| {
                self.mmu()
                    .dirty_pages(BIG_SLOT, (first..end).step_by(every as usize))
            });
            dirtied += r.map_err(|e| e.to_string())?;
            first = end;
        }
        Ok(dirtied)
    }

    /// CLEAR of the whole slot from `self.bitmap`, in one call or in
    /// `--chunk` calls; returns the pages cleared.
    fn clear(&self, mode: Mode) -> s2mmu::Result<u64> {
        let chunk = match mode {
            Mode::Whole => self.npages,
            Mode::Chunked => self.chunk_pages,
        };
        let mut cleared = 0;
        let mut first = 0;
        while first < self.npages {
            let n = chunk.min(self.npages - first);
            let w0 = (first / 64) as usize;
            let w1 = (first + n).div_ceil(64) as usize;
            cleared += self
                .mmu()
                .clear_dirty_log(BIG_SLOT, first, n, &self.bitmap[w0..w1])?;
            first += n;
        }
        Ok(cleared)
    }

    /// The effect of each mode's and policy's invalidations on CPU 0's
    /// TLB ([`s2mmu_arm64::effect`]): `EFFECT_PAGES` pages written through
    /// a cached writable translation, harvested, written again; every
    /// second write must fault.
    ///
    /// # Errors
    /// The model's or the engine's errors, or a stale translation.
    fn effect(&mut self) -> Result<Vec<(Mode, LargeRangePolicy, ProtectEffect)>, String> {
        let pages = spread(self.npages, EFFECT_PAGES);
        let mut out = Vec::new();
        for mode in [Mode::Whole, Mode::Chunked] {
            for policy in POLICIES {
                let vm = self.vm;
                vm.mmu()
                    .set_tlb_large_range(policy, self.p.limit_pages)
                    .map_err(|e| e.to_string())?;
                let mut bitmap = std::mem::take(&mut self.bitmap);
                let r = protect_effect(vm, BIG_SLOT, BIG_GPA, &pages, 0, |m| {
                    m.get_dirty_log(BIG_SLOT, &mut bitmap)?;
                    self.bitmap = bitmap;
                    self.clear(mode)?;
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
                if !r.stale.is_empty() {
                    return Err(format!(
                        "effect check: after a {mode:?} CLEAR with {policy:?}, {} of {} pages took a write through a stale writable translation on CPU 0 (first at IPA {:#x}): the invalidation missed them",
                        r.stale.len(),
                        r.pages,
                        r.stale[0]
                    ));
                }
                out.push((mode, policy, r));
            }
        }
        Ok(out)
    }

    fn cycle(&mut self, mode: Mode, policy: LargeRangePolicy) -> Result<Sample, String> {
        let e = |e: s2mmu::Error| e.to_string();
        self.mmu()
            .set_tlb_large_range(policy, self.p.limit_pages)
            .map_err(e)?;
        self.dirty()?;
        let c0 = self.vm.sink().counters();
        let t0 = Instant::now();
        let vm = self.vm;
        vm.mmu()
            .get_dirty_log(BIG_SLOT, &mut self.bitmap)
            .map_err(e)?;
        let t1 = Instant::now();
        let cleared = self.clear(mode).map_err(e)?;
        let t2 = Instant::now();
        let c1 = self.vm.sink().counters();
        if c1.dropped != c0.dropped {
            return Err("maintenance was dropped: the measurement is void".into());
        }
        Ok(Sample {
            times: CycleTimes {
                get: t1 - t0,
                clear: t2 - t1,
                calls: c1.service_calls - c0.service_calls,
                inv: Duration::from_nanos(c1.service_ns - c0.service_ns),
                cleared,
            },
            tlbis: c1.tlbis - c0.tlbis,
            sequences: c1.host_sequences - c0.host_sequences,
            work: Duration::from_nanos(c1.service_work_ns - c0.service_work_ns),
        })
    }
}

/// Runs `tlb-perf --arm64` on a fresh QEMU with 2 CPUs: the harvest
/// cycles, then the effect check and the operand check.
///
/// # Errors
/// Settings [`check`] refuses (before QEMU starts), the model's or the
/// engine's errors, or a check that found a stale translation.
pub fn run(p: &Config, bars: Bars) -> Result<Arm64Run, String> {
    check(p)?;
    let npages = p.size / PAGE;
    let bar = bars("tlb-perf --arm64", 1);
    bar.message(&format!(
        "starting QEMU ({} of sparse guest RAM)",
        human_bytes(p.size)
    ));
    let t = Instant::now();
    let machine = a64::start(2, p.size)?;
    let boot_time = t.elapsed();
    let policy = MmuPolicy {
        tlb_limit_pages: p.limit_pages,
        ..MmuPolicy::default()
    };
    let vm = Arm64Vm::new(
        machine.clone(),
        &VmConfig {
            policy,
            table_bytes: a64::TABLE_BYTES,
            ..VmConfig::default()
        },
    )
    .map_err(|e| e.to_string())?;
    vm.add_slot(BIG_SLOT, BIG_GPA, layout::DATA, p.size, PAGE)
        .map_err(|e| e.to_string())?;
    bar.message(&format!("mapping {} with 4K pages", human_bytes(p.size)));
    let slot = map_and_log(vm.mmu(), BIG_SLOT, npages)?;
    drop(bar);
    let mut bench = Bench {
        vm: &vm,
        npages,
        chunk_pages: p.chunk / PAGE,
        p,
        bitmap: vec![0u64; npages.div_ceil(64) as usize],
    };
    let modes = alternate(p.runs, p.chunk, bars, |m, pol| bench.cycle(m, pol))?;
    let effect = bench.effect()?;
    drop(bench);
    drop(vm);
    let operand = operand_check(&machine)?;
    Ok(Arm64Run {
        slot,
        boot_time,
        modes,
        effect,
        operand,
    })
}

/// Where the operand check's guest maps itself (a gigabyte of its own).
const OPERAND_GPA: u64 = 4 << 30;

/// The check QEMU can fail on a wrong TLBI operand
/// ([`s2mmu_arm64::walk_cache`]), on a fresh VM of the same machine once
/// the benchmark's is gone: a guest with its own stage 1 on reads a page,
/// the host moves the page that holds the guest's stage-1 root table, and
/// the guest's next access must take a stage-2 abort on its stage-1 walk
/// at that page's IPA. The timed cycles above run with no guest and the
/// effect check with the guest's stage 1 off, where QEMU cannot tell an
/// invalidation of the wrong IPA from the right one.
///
/// # Errors
/// The model's or the engine's errors, or an access that went through a
/// stale translation.
fn operand_check(
    machine: &std::sync::Arc<s2mmu_arm64::machine::Machine>,
) -> Result<WalkCacheReport, String> {
    let e = |e: s2mmu_arm64::Arm64Error| e.to_string();
    let vm = Arm64Vm::new(machine.clone(), &VmConfig::default()).map_err(e)?;
    let spare = Stage2Change::MoveTablePage(layout::DATA + (64 << 10));
    let r = change_stage1_table(&vm, BIG_SLOT, OPERAND_GPA, layout::DATA, spare, 0).map_err(e)?;
    if r.after != (AfterMove::WalkFault { ipa: OPERAND_GPA }) {
        return Err(format!(
            "operand check: after the guest's stage-1 table page at IPA {OPERAND_GPA:#x} moved, its next access did {:x?}, not a stage-2 abort on its walk at that IPA: the invalidation missed the page",
            r.after
        ));
    }
    Ok(r)
}

/// What a run on the arm64 model measured and checked.
#[derive(Debug)]
pub struct Arm64Run {
    /// The slot's setup.
    pub slot: SlotFacts,
    /// QEMU's start.
    pub boot_time: Duration,
    /// Every cycle's sample, per mode and policy.
    pub modes: Vec<ModeSamples<Sample>>,
    /// The effect check of each mode and policy (every page protected,
    /// or the run failed).
    pub effect: Vec<(Mode, LargeRangePolicy, ProtectEffect)>,
    /// The operand check (a walk fault at the table's IPA, or the run
    /// failed).
    pub operand: WalkCacheReport,
}
