//! The checks of each pass and the report lines.

use alloc::vec;
use alloc::vec::Vec;
use s2mmu_el2::abi::{HypError, Op};
use s2mmu_el2::{GenericTimer, Refusal};

use super::{
    hyp, Driver, CARVE_PROBE, CPUS, DATA_BACKING, OFF_BITMAP, OFF_RING, PAGES, PER_CPU,
    RING_ENTRIES,
};
use crate::board::{CARVE_OUT, SHARED};
use crate::semihosting::{exit, println};

fn shared_word(off: u64) -> u64 {
    // SAFETY: `off` lies inside the shared area, mapped and 8-aligned.
    unsafe { ((SHARED.base + off) as *const u64).read_volatile() }
}

impl Driver {
    /// Compares the pages dirty by the engine with `got` and prints the
    /// line for `name`.
    fn compare(&mut self, name: &str, got: &[bool], faults: u64) {
        let mut want = vec![false; PAGES as usize];
        for p in &self.expect {
            want[*p as usize] = true;
        }
        let lost = want.iter().zip(got).filter(|(w, g)| **w && !**g).count();
        let extra = want.iter().zip(got).filter(|(w, g)| !**w && **g).count();
        println(format_args!(
            "el2: harvest {name} written={} dirty={} lost={lost} extra={extra} faults={faults}",
            self.expect.len(),
            got.iter().filter(|g| **g).count()
        ));
        if lost != 0 || extra != 0 {
            self.failures += 1;
        }
    }

    /// Starts counting the faults of the next pass from now.
    pub(super) fn mark_faults(&mut self) {
        let c = hyp().counters();
        self.fault_mark = c.permission + c.translation;
    }

    /// GET into the shared bitmap, compared with the pages written.
    pub(super) fn check_bitmap(&mut self, name: &str) {
        let bm = SHARED.base + OFF_BITMAP;
        self.must(Op::GetDirty, &[1, bm, PAGES / 8]);
        let got: Vec<bool> = (0..PAGES)
            .map(|p| shared_word(OFF_BITMAP + p / 64 * 8) >> (p % 64) & 1 != 0)
            .collect();
        let c = hyp().counters();
        let all = c.permission + c.translation;
        let faults = all - core::mem::replace(&mut self.fault_mark, all);
        self.compare(name, &got, faults);
    }

    /// The write-protection fault cost: counter ticks from the vector's
    /// entry to just before the ERET, median over the faults timed.
    pub(super) fn report_fault_cost(&mut self) {
        let mut s: Vec<u64> = PER_CPU
            .iter()
            .flat_map(|c| core::mem::take(&mut *c.samples.lock()))
            .collect();
        s.sort_unstable();
        let hz = GenericTimer::frequency().unwrap_or(0);
        let median = s.get(s.len() / 2).copied().unwrap_or(0);
        let mean = s.iter().sum::<u64>() / (s.len() as u64).max(1);
        println(format_args!(
            "el2: wp_fault_cost samples={} median_ticks={median} mean_ticks={mean} min_ticks={} max_ticks={} counter_hz={hz} median_ns={} mean_ns={}",
            s.len(),
            s.first().copied().unwrap_or(0),
            s.last().copied().unwrap_or(0),
            GenericTimer::ticks_to_ns(median, hz),
            GenericTimer::ticks_to_ns(mean, hz)
        ));
    }

    /// The guest's load from the carve-out was refused and nothing maps
    /// it; a slot backed by the carve-out is refused.
    pub(super) fn check_isolation(&mut self) {
        let refused = |write: bool| {
            self.refusals
                .iter()
                .any(|&(r, ipa, w)| r == Refusal::CarveOut && ipa == CARVE_PROBE && w == write)
        };
        let (read, write) = (refused(false), refused(true));
        let mapped = hyp()
            .with_mmu(|m| m.reader().translate(CARVE_PROBE))
            .flatten()
            .is_some();
        let slot = self.cmd(
            Op::MemslotSet,
            &[2, 0, 0x2000_0000, 0x1000, CARVE_OUT.base + 0x10_0000, 4096],
        );
        let word = |refused: bool| if refused { "refused" } else { "ALLOWED" };
        println(format_args!(
            "el2: isolation carve_out_read={} carve_out_write={} mapped={} carve_out_slot={:?}",
            word(read),
            word(write),
            u8::from(mapped),
            slot.err()
        ));
        if !read || !write || mapped || slot != Err(HypError::CarveOut) {
            self.failures += 1;
        }
    }

    /// The host's answer to a ring-full exit: RING_HARVEST into the
    /// shared area, the pages noted, RING_RESET.
    pub(super) fn ring_full_exit(&mut self) {
        self.ring_exits += 1;
        if self.harvest_ring().1 != 0 {
            self.failures += 1;
        }
    }

    /// RING_HARVEST, its entries noted; RING_RESET. The entries and the
    /// foreign ones (not the data slot's).
    fn harvest_ring(&mut self) -> (u64, u64) {
        let bytes = CPUS as u64 * RING_ENTRIES * 16;
        let n = self.must(Op::RingHarvest, &[SHARED.base + OFF_RING, bytes])[0];
        let mut foreign = 0;
        for i in 0..n {
            let (slot, off) = (
                shared_word(OFF_RING + i * 16),
                shared_word(OFF_RING + i * 16 + 8),
            );
            match self.ring_seen.get_mut(off as usize) {
                Some(g) if slot == 1 => *g = true,
                _ => foreign += 1,
            }
        }
        let reset = self.must(Op::RingReset, &[])[0];
        if reset != n {
            self.failures += 1;
        }
        (n, foreign)
    }

    /// The last harvest of the ring pass; with the exits' harvests it must
    /// hold every page written.
    pub(super) fn check_ring(&mut self) {
        let faults = hyp().counters().translation;
        let (n, foreign) = self.harvest_ring();
        let got = core::mem::take(&mut self.ring_seen);
        self.compare("ring", &got, faults);
        println(format_args!(
            "el2: ring entries={} exits={} last={n} foreign={foreign} backing={DATA_BACKING:#x}",
            RING_ENTRIES, self.ring_exits
        ));
        if foreign != 0 || self.ring_exits == 0 {
            self.failures += 1;
        }
    }

    /// The summary, and QEMU's exit.
    pub(super) fn finish(&mut self) -> ! {
        let c = self.counters();
        println(format_args!(
            "el2: counters handled={} refused={} to_host={} commands_ok={} commands_refused={} table_pages={} tlbi_sequences={}",
            c.aborts_handled,
            c.aborts_refused,
            c.aborts_to_host,
            c.commands_ok,
            c.commands_refused,
            c.table_pages,
            self.tlb.inner().sink().sequences()
        ));
        let per_cpu: Vec<u64> = PER_CPU
            .iter()
            .map(|c| c.aborts.load(core::sync::atomic::Ordering::Relaxed))
            .collect();
        let list = per_cpu
            .iter()
            .map(|n| alloc::format!("{n}"))
            .collect::<Vec<_>>()
            .join(",");
        println(format_args!("el2: cpus={CPUS} aborts_per_cpu={list}"));
        if per_cpu.contains(&0) {
            self.failures += 1;
        }
        let t = self.tlb.inner().sink().counts();
        println(format_args!(
            "el2: tlbi last_level={} all_levels={} range={} vmid={}",
            t.last_level, t.all_levels, t.range, t.vmid
        ));
        if self.failures == 0 {
            println(format_args!("el2: done ok"));
            exit(0)
        }
        println(format_args!("el2: done failures={}", self.failures));
        exit(1)
    }
}
