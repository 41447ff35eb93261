//! The engine of `s2mmu dirty-views`: several independent dirty consumers (the engine's
//! dirty views) over one slot of a running guest, each at its own harvest
//! period, against one consumer alone at the fastest period.
//!
//! The guest's vCPUs write their regions; time advances in ticks (one
//! guest pass each, or `--tick-ms` of free running), and each view
//! harvests (GET, CLEAR, then reads the reported pages) every `period`
//! ticks, fastest first. Reported per consumer: pages reported, pages its
//! clears protected or found protected already, flushes; guest write
//! faults per page per cycle of the fastest view, beside the same figure
//! with that view alone. Every consumer keeps a hash of every page, updated
//! from the pages it was told were dirty only: after the guest stops and a
//! last harvest, a page whose hash differs from the guest's is a write that
//! consumer lost (there must be none), and a reported page whose content
//! had not changed is an over-report (allowed, counted).

use crate::Progress;
use s2mmu::dirty::MAX_DIRTY_VIEWS_PER_SLOT;
use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::{DirtyMode, DirtyView, MmuPolicy};
use s2mmu_vm::{Backing, Pattern, SlotInfo, Vm, VmConfig, Workload, WorkloadConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64;

const PAGE: u64 = 4096;

/// The settings of one `dirty-views` run (the command's flags of the same
/// names say their limits, which the command checks).
#[derive(Clone, Debug)]
pub struct Config {
    /// Guest memory, one slot.
    pub mem: u64,
    /// vCPU threads, each writing its own share of the slot.
    pub vcpus: usize,
    /// Harvest period of each view in ticks, one number per view.
    pub view_periods: Vec<u32>,
    /// Ticks to run.
    pub ticks: u32,
    /// A tick is this many milliseconds of free-running guest; 0: one
    /// guest pass over every page.
    pub tick_ms: u64,
    /// Pages visited at random instead of in order.
    pub random: bool,
    /// Track through hardware dirty state instead of write protection.
    pub hardware: bool,
    /// Views due at the same tick clear one after the other instead of in
    /// one call.
    pub separate_clears: bool,
}

/// One view and what it knows of guest memory.
pub struct Consumer {
    view: DirtyView,
    /// Its harvest period in ticks.
    pub period: u32,
    /// Hash of every page as of the copy it last made of it.
    pub hashes: Vec<u64>,
    pub harvests: u64,
    pub reported: u64,
    pub over_reported: u64,
    pub lost: u64,
}

/// What one run measured.
pub struct Outcome {
    /// Guest write faults while logged.
    pub faults: u64,
    /// Guest writes while logged.
    pub writes: u64,
    /// Each consumer with its view's counters, fastest first.
    pub consumers: Vec<(Consumer, s2mmu::dirty::DirtyViewStats)>,
    /// Pages of the slot.
    pub pages: u64,
}

/// GET of a consumer's view: the pages it must copy once cleared.
fn get(vm: &Vm<TreeMemslots>, slot: &SlotInfo, c: &Consumer) -> Result<Vec<u64>, String> {
    let mut bm = vec![0u64; (slot.size / PAGE).div_ceil(64) as usize];
    vm.mmu()
        .get_dirty_view(c.view, &mut bm)
        .map_err(|e| e.to_string())?;
    Ok(bm)
}

/// The copy a consumer makes of the pages of `bm` (after its clear): here
/// their hashes.
fn copy(
    vm: &Vm<TreeMemslots>,
    slot: &SlotInfo,
    c: &mut Consumer,
    bm: &[u64],
) -> Result<(), String> {
    let mut buf = vec![0u8; PAGE as usize];
    for (w, &word) in bm.iter().enumerate() {
        let mut m = word;
        while m != 0 {
            let p = w as u64 * 64 + u64::from(m.trailing_zeros());
            m &= m - 1;
            if !vm.memory().read_into(slot.mem_offset + p * PAGE, &mut buf) {
                return Err(format!("page {p} is outside guest memory"));
            }
            let h = xxh3_64(&buf);
            // The first harvest reports every page (a view starts dirty).
            if c.harvests > 0 && c.hashes[p as usize] == h {
                c.over_reported += 1;
            }
            c.hashes[p as usize] = h;
            c.reported += 1;
        }
    }
    c.harvests += 1;
    Ok(())
}

/// The consumers due, harvested together: their GETs, then one clear of
/// all their views (or, `separate`, a clear each, fastest first, so a
/// slower one finds what the faster one just protected, but the guest runs
/// between them), then their copies.
fn harvest_due(
    vm: &Vm<TreeMemslots>,
    slot: &SlotInfo,
    consumers: &mut [Consumer],
    separate: bool,
    due: impl Fn(&Consumer) -> bool,
) -> Result<(), String> {
    let mut taken = Vec::new();
    for (i, c) in consumers.iter().enumerate().filter(|(_, c)| due(c)) {
        taken.push((i, get(vm, slot, c)?));
    }
    let pages = slot.size / PAGE;
    let e = |e: s2mmu::Error| e.to_string();
    if separate {
        for (i, bm) in &taken {
            vm.mmu()
                .clear_dirty_view(consumers[*i].view, 0, pages, bm)
                .map_err(e)?;
        }
    } else {
        let clears: Vec<_> = taken
            .iter()
            .map(|(i, bm)| (consumers[*i].view, &bm[..]))
            .collect();
        vm.mmu().clear_dirty_views(0, pages, &clears).map_err(e)?;
    }
    for (i, bm) in taken {
        copy(vm, slot, &mut consumers[i], &bm)?;
    }
    Ok(())
}

/// The VM of `p` (one slot) with its vCPUs started: the harvests run
/// against it.
fn start_guest(p: &Config) -> Result<(Arc<Vm<TreeMemslots>>, Workload<TreeMemslots>), String> {
    let policy = MmuPolicy {
        dirty: if p.hardware {
            DirtyMode::HW
        } else {
            DirtyMode::WP
        },
        ..MmuPolicy::default()
    };
    let vm = Arc::new(
        Vm::<TreeMemslots>::new(VmConfig {
            mem_size: p.mem,
            backing: Backing::Anonymous,
            slots: 1,
            policy,
            ..VmConfig::default()
        })
        .map_err(|e| e.to_string())?,
    );
    let w = Workload::start(
        vm.clone(),
        p.vcpus,
        WorkloadConfig {
            bytes_per_vcpu: p.mem / p.vcpus as u64,
            write_percent: 100,
            pattern: if p.random {
                Pattern::Random
            } else {
                Pattern::Sequential
            },
            page_size: PAGE,
        },
    )?;
    Ok((vm, w))
}

/// Checks the settings before the guest starts: its shape
/// ([`crate::host::check_guest`]), the views (1 to
/// `MAX_DIRTY_VIEWS_PER_SLOT`, each period 1 to 1000 ticks), the ticks and
/// the tick length.
///
/// # Errors
/// A message naming the flag (the setting of the same name) and its limit.
pub fn check(p: &Config) -> Result<(), String> {
    crate::host::check_guest(p.vcpus, p.mem)?;
    check_periods(&p.view_periods)?;
    if !(1..=100_000).contains(&p.ticks) {
        return Err(format!("--ticks {}: must be 1..=100000", p.ticks));
    }
    if p.tick_ms > 10_000 {
        return Err(format!("--tick-ms {}: must be 0..=10000", p.tick_ms));
    }
    Ok(())
}

/// The views' harvest periods: 1 to `MAX_DIRTY_VIEWS_PER_SLOT` views, each
/// period 1 to 1000 ticks.
fn check_periods(periods: &[u32]) -> Result<(), String> {
    let n = periods.len();
    if n == 0 || n > MAX_DIRTY_VIEWS_PER_SLOT {
        return Err(format!(
            "--view-periods: {n} views, must be 1..={MAX_DIRTY_VIEWS_PER_SLOT}"
        ));
    }
    if let Some(bad) = periods.iter().find(|&&x| !(1..=1000).contains(&x)) {
        return Err(format!("--view-periods: {bad} ticks, must be 1..=1000"));
    }
    Ok(())
}

/// Runs the guest for `p.ticks` ticks with one view per period.
///
/// # Errors
/// Settings or periods [`check`] refuses, or a message naming the step
/// that failed.
pub fn run_views(p: &Config, periods: &[u32]) -> Result<Outcome, String> {
    check(p)?;
    check_periods(periods)?;
    let e = |e: s2mmu::Error| e.to_string();
    let (vm, w) = start_guest(p)?;
    w.run_pass(|| {})?;
    vm.enable_dirty_logging().map_err(|e| e.to_string())?;
    let slot = vm.slots()[0];
    let pages = slot.size / PAGE;
    let mut order: Vec<u32> = periods.to_vec();
    order.sort_unstable();
    let mut consumers = Vec::new();
    for &period in &order {
        consumers.push(Consumer {
            view: vm.mmu().open_dirty_view(slot.id).map_err(e)?,
            period,
            hashes: vec![0; pages as usize],
            harvests: 0,
            reported: 0,
            over_reported: 0,
            lost: 0,
        });
    }
    // The first harvest of each (every page), before the guest writes.
    harvest_due(&vm, &slot, &mut consumers, p.separate_clears, |_| true)?;
    let before: u64 = w.fault_stats().iter().map(|s| s.permission).sum();
    let writes = |w: &Workload<TreeMemslots>| -> u64 {
        let live = &w.control().live;
        live.iter()
            .map(|l| l.writes.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    };
    let writes_before = writes(&w);
    if p.tick_ms > 0 {
        w.run_free();
    }
    // Free running, ticks fall at fixed times (a harvest longer than a
    // tick delays only the next one), so both runs give the guest the same
    // time between harvests whatever their copies cost.
    let t0 = Instant::now();
    for tick in 1..=p.ticks {
        if p.tick_ms > 0 {
            let at = t0 + Duration::from_millis(p.tick_ms) * tick;
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
        } else {
            w.run_pass(|| {})?;
        }
        let due = |c: &Consumer| tick.is_multiple_of(c.period);
        harvest_due(&vm, &slot, &mut consumers, p.separate_clears, due)?;
    }
    if p.tick_ms > 0 {
        w.pause();
    }
    let faults = w.fault_stats().iter().map(|s| s.permission).sum::<u64>() - before;
    let writes = writes(&w) - writes_before;
    finish(p, &vm, &slot, consumers, (faults, writes), w)
}

/// The last harvest of each consumer with the guest stopped, its lost
/// pages, and its views closed.
fn finish(
    p: &Config,
    vm: &Vm<TreeMemslots>,
    slot: &SlotInfo,
    mut consumers: Vec<Consumer>,
    (faults, writes): (u64, u64),
    w: Workload<TreeMemslots>,
) -> Result<Outcome, String> {
    let pages = slot.size / PAGE;
    let mut guest = Vec::with_capacity(pages as usize);
    let mut buf = vec![0u8; PAGE as usize];
    for p in 0..pages {
        if !vm.memory().read_into(slot.mem_offset + p * PAGE, &mut buf) {
            return Err(format!("page {p} is outside guest memory"));
        }
        guest.push(xxh3_64(&buf));
    }
    harvest_due(vm, slot, &mut consumers, p.separate_clears, |_| true)?;
    let mut out = Vec::new();
    for mut c in consumers.drain(..) {
        c.lost = c.hashes.iter().zip(&guest).filter(|(a, b)| a != b).count() as u64;
        let st = vm
            .mmu()
            .dirty_view_stats(c.view)
            .map_err(|e| e.to_string())?;
        vm.mmu()
            .close_dirty_view(c.view)
            .map_err(|e| e.to_string())?;
        out.push((c, st));
    }
    w.stop();
    Ok(Outcome {
        faults,
        writes,
        consumers: out,
        pages,
    })
}

/// Guest write faults per page per cycle of the fastest view.
pub fn per_page_cycle(o: &Outcome, p: &Config) -> f64 {
    let fastest = o.consumers.iter().map(|(c, _)| c.period).min().unwrap_or(1);
    let cycles = (p.ticks / fastest).max(1);
    o.faults as f64 / (o.pages as f64 * f64::from(cycles))
}

/// The views at their periods, then the fastest alone: two runs of
/// `--ticks` each, said on stderr before the first (a long run is otherwise
/// silent until its table).
///
/// # Errors
/// A message naming the step that failed.
pub fn run_both(p: &Config, bar: &dyn Progress) -> Result<(Outcome, Outcome), String> {
    bar.message("views");
    let many = run_views(p, &p.view_periods)?;
    bar.step();
    bar.message("fastest alone");
    let fastest = *p.view_periods.iter().min().unwrap_or(&1);
    let one = run_views(p, &[fastest])?;
    bar.step();
    Ok((many, one))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(periods: &[u32], separate: bool) -> Config {
        Config {
            mem: 8 << 20,
            vcpus: 2,
            view_periods: periods.to_vec(),
            ticks: 6,
            tick_ms: 0,
            random: false,
            hardware: false,
            separate_clears: separate,
        }
    }

    /// A tick is one pass over every page: each pass faults once per page
    /// with one view or two, and nobody loses a page.
    #[test]
    fn a_second_view_adds_no_fault_and_loses_nothing() {
        let pages = (8 << 20) / PAGE;
        for separate in [false, true] {
            let p = params(&[1, 3], separate);
            let many = run_views(&p, &p.view_periods).unwrap();
            let one = run_views(&p, &[1]).unwrap();
            assert_eq!(one.faults, 6 * pages);
            assert_eq!(many.faults, one.faults, "separate clears: {separate}");
            for (c, st) in &many.consumers {
                assert_eq!(c.lost, 0);
                if c.period == 3 {
                    assert_eq!(st.protected, 0, "the faster view protected it all");
                    assert_eq!(c.harvests, 1 + 2 + 1);
                }
            }
        }
    }

    #[test]
    fn bad_settings_and_periods_are_refused_before_the_guest_starts() {
        let p = params(&[1, 3], false);
        let e = run_views(&p, &[]).err().expect("refused");
        assert!(e.contains("--view-periods: 0 views"), "{e}");
        let e = run_views(&p, &[0]).err().expect("refused");
        assert!(e.contains("--view-periods: 0 ticks"), "{e}");
        let bad = Config {
            vcpus: 0,
            ..p.clone()
        };
        assert!(run_both(&bad, &crate::NoProgress)
            .err()
            .expect("refused")
            .contains("--vcpus"));
        let bad = Config { ticks: 0, ..p };
        assert!(run_both(&bad, &crate::NoProgress)
            .err()
            .expect("refused")
            .contains("--ticks"));
    }
}
