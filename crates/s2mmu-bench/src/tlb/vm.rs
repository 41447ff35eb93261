//! `tlb-perf` on the simulated VM: the big slot over reserved host address
//! space, vCPU threads writing a small slot of real memory meanwhile (so
//! every invalidation must reach them), and the harvest cycles with what
//! they cost the vCPUs (entries removed, TLB refills).

use super::cycle::{map_and_log, CycleTimes, SlotFacts};
use super::guest::{sum_live, vcpu_loop, Live, Reservation};
use super::{alternate, Config, Mode, ModeSamples, PAGE};
use crate::{human_bytes, Bars, Progress};
use s2mmu::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::MmuPolicy;
use s2mmu::tlb::LargeRangePolicy;
use s2mmu::{Gpa, Hva};
use s2mmu_vm::{Backing, KnownFormat, Vm, VmConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const SMALL_GPA: u64 = 1 << 32;
const BIG_SLOT: u16 = 1;

/// One measured harvest cycle: what every model measures, and what the
/// vCPUs paid.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    /// What every model measures.
    pub times: CycleTimes,
    /// Whole-VMID flushes the clear made.
    pub vmid_flushes: u64,
    /// vCPU TLB entries the clear's invalidations removed.
    pub removed: u64,
    /// TLB misses the vCPUs took beyond their rate with no flush.
    pub refill_misses: f64,
}

struct Bench<'a, F: KnownFormat> {
    vm: &'a Vm<TreeMemslots, F>,
    live: &'a [Live],
    npages: u64,
    chunk_pages: u64,
    p: &'a Config,
    /// Misses per second the vCPUs take with no flush at all.
    base_miss_rate: f64,
    bitmap: Vec<u64>,
}

impl<F: KnownFormat> Bench<'_, F> {
    fn cycle(&mut self, mode: Mode, policy: LargeRangePolicy) -> Result<Sample, String> {
        let mmu = self.vm.mmu();
        let e = |e: s2mmu::Error| e.to_string();
        mmu.set_tlb_large_range(policy, self.p.limit_pages)
            .map_err(e)?;
        let every = self.p.dirty_every.max(1);
        mmu.dirty_pages(BIG_SLOT, (0..self.npages).step_by(every as usize))
            .map_err(e)?;
        let sd0 = self.vm.shootdown().stats();
        let l0 = sum_live(self.live);
        let t0 = Instant::now();
        mmu.get_dirty_log(BIG_SLOT, &mut self.bitmap).map_err(e)?;
        let t1 = Instant::now();
        let mut cleared = 0;
        match mode {
            Mode::Whole => {
                cleared += mmu
                    .clear_dirty_log(BIG_SLOT, 0, self.npages, &self.bitmap)
                    .map_err(e)?;
            }
            Mode::Chunked => {
                let mut first = 0;
                while first < self.npages {
                    let n = self.chunk_pages.min(self.npages - first);
                    let w0 = (first / 64) as usize;
                    let w1 = (first + n).div_ceil(64) as usize;
                    cleared += mmu
                        .clear_dirty_log(BIG_SLOT, first, n, &self.bitmap[w0..w1])
                        .map_err(e)?;
                    first += n;
                }
            }
        }
        let t2 = Instant::now();
        let sd1 = self.vm.shootdown().stats();
        let settle = Duration::from_micros(self.p.settle_us);
        std::thread::sleep(settle);
        let window = t0.elapsed();
        let l1 = sum_live(self.live);
        let expected = self.base_miss_rate * window.as_secs_f64();
        Ok(Sample {
            times: CycleTimes {
                get: t1 - t0,
                clear: t2 - t1,
                calls: sd1.calls - sd0.calls,
                inv: Duration::from_nanos(sd1.time_ns - sd0.time_ns),
                cleared,
            },
            vmid_flushes: sd1.vmid_flushes - sd0.vmid_flushes,
            removed: l1.removed - l0.removed,
            refill_misses: ((l1.misses - l0.misses) as f64 - expected).max(0.0),
        })
    }
}

/// The VM with the big slot mapped and logged, and what setting it up took.
struct Setup<F: KnownFormat> {
    /// Declared before `reservation`, so dropped first: its table holds
    /// addresses into the reservation.
    vm: Vm<TreeMemslots, F>,
    reservation: Reservation,
    slot: SlotFacts,
}

/// Builds the VM: the vCPUs' small slot of real memory and the big slot,
/// mapped with 4K pages and dirty-logged.
fn setup<F: KnownFormat>(p: &Config, progress: &dyn Progress) -> Result<Setup<F>, String> {
    let e = |e: s2mmu::Error| e.to_string();
    let too_big = || {
        format!(
            "--vcpu-mem {} x --vcpus {} and --mem {}: together more than a 48-bit IPA space",
            human_bytes(p.vcpu_mem),
            p.vcpus,
            human_bytes(p.size)
        )
    };
    let small = p.vcpu_mem.checked_mul(p.vcpus as u64).ok_or_else(too_big)?;
    // The big slot sits above the small one, 1 GiB aligned.
    let big_gpa = SMALL_GPA
        .checked_add(small)
        .and_then(|e| e.checked_next_multiple_of(1 << 30))
        .ok_or_else(too_big)?;
    let end = big_gpa.checked_add(p.size).ok_or_else(too_big)?;
    let ipa_bits = (64 - (end - 1).leading_zeros()).max(40);
    if ipa_bits > 48 {
        return Err(too_big());
    }
    let reservation = Reservation::new(p.size)?;
    let policy = MmuPolicy {
        tlb_limit_pages: p.limit_pages,
        ..MmuPolicy::default()
    };
    let vm = Vm::<TreeMemslots, F>::new(VmConfig {
        mem_size: small,
        backing: Backing::Anonymous,
        slots: 1,
        gpa_base: SMALL_GPA,
        policy,
        tlb_entries: 1024,
        ipa_bits,
    })
    .map_err(|e| e.to_string())?;
    let mmu = vm.mmu().clone();
    let region = UserMemoryRegion::new(
        BIG_SLOT,
        SlotFlags::NONE,
        Gpa::new(big_gpa),
        p.size,
        Hva::new(reservation.addr as u64),
    );
    mmu.set_memory_region(&region, PAGE).map_err(e)?;
    progress.message(&format!("mapping {} with 4K pages", human_bytes(p.size)));
    let slot = map_and_log(&mmu, BIG_SLOT, p.size / PAGE)?;
    Ok(Setup {
        vm,
        reservation,
        slot,
    })
}

/// Starts the vCPU threads, measures while they run, stops them.
fn with_vcpus<F: KnownFormat>(p: &Config, st: &Setup<F>, bars: Bars) -> Result<Measured, String> {
    let live: Vec<Live> = (0..p.vcpus).map(|_| Live::default()).collect();
    let stop = AtomicBool::new(false);
    let vcpu_pages = p.vcpu_mem / PAGE;
    let vcpus: Vec<_> = (0..p.vcpus)
        .map(|_| st.vm.new_vcpu().map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let stop_ref = &stop;
    let idle = Duration::from_micros(p.idle_us);
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (i, v) in vcpus.into_iter().enumerate() {
            let l = &live[i];
            let base = SMALL_GPA + i as u64 * p.vcpu_mem;
            handles.push(s.spawn(move || vcpu_loop(v, i, base, vcpu_pages, idle, l, stop_ref)));
        }
        let r = measure(p, &st.vm, &live, st.slot.npages, bars);
        stop.store(true, Ordering::Relaxed);
        let mut errs = Vec::new();
        for h in handles {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(m)) => errs.push(m),
                Err(_) => errs.push("a vCPU thread panicked".into()),
            }
        }
        match (r, errs.first()) {
            (Err(m), _) => Err(m),
            (Ok(_), Some(m)) => Err(m.clone()),
            (Ok(x), None) => Ok(x),
        }
    })
}

/// What a run on the simulated VM measured.
#[derive(Debug)]
pub struct VmRun {
    /// The big slot's setup.
    pub slot: SlotFacts,
    /// The cost of one TLB refill (a table walk), in ns.
    pub walk_ns: f64,
    /// Misses per second the vCPUs take with no flush at all.
    pub base_miss_rate: f64,
    /// Every cycle's sample, per mode and policy.
    pub modes: Vec<ModeSamples<Sample>>,
}

/// Runs `tlb-perf` on the simulated VM with stage-2 format `F`: the VM
/// with its big slot mapped and logged, then the harvest cycles with
/// `p.vcpus` vCPU threads writing meanwhile.
///
/// # Errors
/// Settings [`super::check`] refuses, `vcpus` 0, or a message naming the
/// step that failed.
pub fn run<F: KnownFormat>(p: &Config, bars: Bars) -> Result<VmRun, String> {
    super::check(p)?;
    if p.vcpus == 0 {
        return Err(
            "--vcpus 0: a run needs at least one vCPU (the command resolves 0 to the CPUs but one)"
                .into(),
        );
    }
    let bar = bars("tlb-perf", 1);
    let st = setup::<F>(p, &*bar)?;
    drop(bar);
    let (modes, walk_ns, base_miss_rate) = with_vcpus(p, &st, bars)?;
    let Setup {
        vm,
        reservation,
        slot,
    } = st;
    drop(vm);
    drop(reservation);
    Ok(VmRun {
        slot,
        walk_ns,
        base_miss_rate,
        modes,
    })
}

type Measured = (Vec<ModeSamples<Sample>>, f64, f64);

/// Waits for the vCPUs to run, measures the cost of a TLB refill, then the
/// harvest cycles of both modes and policies.
fn measure<F: KnownFormat>(
    p: &Config,
    vm: &Vm<TreeMemslots, F>,
    live: &[Live],
    npages: u64,
    bars: Bars,
) -> Result<Measured, String> {
    // Let the vCPUs fault their regions in and fill their TLBs.
    let want = p.vcpu_mem / PAGE * 8;
    let t = Instant::now();
    while live
        .iter()
        .any(|l| l.accesses.load(Ordering::Relaxed) < want)
    {
        if t.elapsed() > Duration::from_secs(30) {
            return Err("the vCPUs did not start running".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Misses with no flush at all (conflicts, none if the region fits).
    let l0 = sum_live(live);
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(50));
    let base_miss_rate = (sum_live(live).misses - l0.misses) as f64 / t.elapsed().as_secs_f64();
    // The cost of one TLB refill: a walk of the table.
    let reader = vm.mmu().reader();
    let pages = p.vcpu_mem * p.vcpus as u64 / PAGE;
    let walks = 200_000u64;
    let t = Instant::now();
    let mut found = 0u64;
    for i in 0..walks {
        found += u64::from(reader.translate(SMALL_GPA + (i % pages) * PAGE).is_some());
    }
    let walk_ns = t.elapsed().as_nanos() as f64 / walks as f64;
    std::hint::black_box(found);

    let mut bench = Bench {
        vm,
        live,
        npages,
        chunk_pages: p.chunk / PAGE,
        p,
        base_miss_rate,
        bitmap: vec![0u64; npages.div_ceil(64) as usize],
    };
    let modes = alternate(p.runs, p.chunk, bars, |m, pol| bench.cycle(m, pol))?;
    Ok((modes, walk_ns, base_miss_rate))
}
