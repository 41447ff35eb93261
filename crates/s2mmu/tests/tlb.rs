//! TLB invalidation as the engine issues it: every operation that removes
//! or restricts a mapping is followed by an invalidation that covers it
//! (checked with the recorder against the table), both large-range
//! policies issue what they promise, and on arm64 only stage-2 (by-IPA or
//! whole-VMID) invalidations are emitted, never a stage-1 by-VA one.

use s2mmu::format::arm64::{Arm64Stage2, Granule};
use s2mmu::memslot::{MemslotConfig, SlotFlags, TreeMemslots, UserMemoryRegion};
use s2mmu::mmu::{Mmu, MmuPolicy};
use s2mmu::tlb::arm64::{Arm64Tlbi, Arm64TlbiFeatures, Insn, InsnRecorder, TlbiOp, TlbiScope};
use s2mmu::tlb::{LargeRangePolicy, TlbCall, TlbRecorder};
use s2mmu::{Gpa, Hva};
use s2mmu::{
    HostMmOps, MapOptions, PageCache, PageTable, Prot, SplitPolicy, TlbInvalidate, TlbPolicy,
};
use std::sync::Arc;

const PAGE: u64 = 4096;
const SLOT: u16 = 0;
const GPA: u64 = 1 << 30;
/// Host addresses only recorded in the table, never touched.
const HVA: u64 = 0x7000_0000_0000;
const SLOT_SIZE: u64 = 64 << 20;
/// A small range limit (16 MiB) so the 64 MiB slot is above it.
const LIMIT_PAGES: u64 = 4096;

type TestMmu = Mmu<Arm64Stage2, HostMmOps, TreeMemslots>;

fn mmu(tlb: Arc<dyn TlbInvalidate>) -> TestMmu {
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let mm = HostMmOps::new(4096).unwrap();
    let store = TreeMemslots::with_config(MemslotConfig {
        page_shift: 12,
        ..MemslotConfig::default()
    });
    let policy = MmuPolicy {
        tlb_limit_pages: LIMIT_PAGES,
        ..MmuPolicy::default()
    };
    let m = Mmu::new(fmt, mm, tlb, store, policy).unwrap();
    m.set_memory_region(
        &UserMemoryRegion::new(
            SLOT,
            SlotFlags::NONE,
            Gpa::new(GPA),
            SLOT_SIZE,
            Hva::new(HVA),
        ),
        PAGE,
    )
    .unwrap();
    m.populate(SLOT, 0, SLOT_SIZE / PAGE).unwrap();
    m
}

fn writable(m: &TestMmu, page: u64) -> bool {
    m.with_table(|pt| pt.translate(GPA + page * PAGE))
        .expect("mapped")
        .prot
        .contains(Prot::W)
}

fn assert_covered(calls: &[TlbCall], pages: &[u64], what: &str) {
    for &p in pages {
        let ipa = GPA + p * PAGE;
        assert!(
            calls.iter().any(|c| c.covers(ipa, PAGE)),
            "{what}: page {p} ({ipa:#x}) not invalidated by {calls:?}"
        );
    }
}

/// Pages a cycle dirties: spread over the slot, runs and single pages.
fn dirty_set() -> Vec<u64> {
    let n = SLOT_SIZE / PAGE;
    let mut v: Vec<u64> = (0..n).step_by(997).collect();
    v.extend(64..200);
    v.push(n - 1);
    v.sort();
    v.dedup();
    v
}

#[test]
fn populate_maps_pages_without_invalidating() {
    let r = Arc::new(TlbRecorder::new());
    let m = mmu(r.clone());
    assert!(r.is_empty(), "mapping empty entries needs no invalidation");
    let leaves = m.with_table(|pt| pt.leaves(GPA, SLOT_SIZE)).unwrap();
    assert_eq!(leaves.len() as u64, SLOT_SIZE / PAGE);
    assert!(leaves
        .iter()
        .all(|l| l.size == PAGE && l.pa == HVA + (l.ipa - GPA)));
    // Bad input is refused with a typed error and changes nothing.
    assert!(m.populate(SLOT, SLOT_SIZE / PAGE, 1).is_err());
    assert!(m.populate(SLOT, u64::MAX, 2).is_err());
    assert!(m.populate(7, 0, 1).is_err());
    assert!(m.populate(SLOT, 0, 1).is_err(), "already mapped");
    assert!(m
        .set_tlb_large_range(LargeRangePolicy::SplitCalls, 0)
        .is_err());
}

/// Every policy field a setter checks, `Mmu::new` checks the same way: a
/// zero TLB range limit, which `set_tlb_large_range` refuses, is refused at
/// creation with the same error instead of being run as a one-page limit.
#[test]
fn creation_refuses_a_zero_tlb_limit_as_the_setter_does() {
    let make = |limit| {
        let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
        let mm = HostMmOps::new(4096).unwrap();
        let store = TreeMemslots::with_config(MemslotConfig::default());
        let policy = MmuPolicy {
            tlb_limit_pages: limit,
            ..MmuPolicy::default()
        };
        Mmu::new(fmt, mm, Arc::new(s2mmu::NoTlb), store, policy)
    };
    let made = make(0).map(|_: TestMmu| ());
    let set = mmu(Arc::new(s2mmu::NoTlb)).set_tlb_large_range(LargeRangePolicy::SplitCalls, 0);
    let want = s2mmu::Error::InvalidConfig {
        what: "TLB range limit in pages",
        value: 0,
    };
    assert_eq!(made, Err(want));
    assert_eq!(set, Err(want));
    let one: TestMmu = make(1).unwrap();
    assert_eq!(one.policy().tlb_limit_pages, 1);
    assert_eq!(one.tlb_policy().limit_pages, 1);
}

#[test]
fn enabling_logging_and_clearing_invalidate_what_they_protect() {
    for policy in [LargeRangePolicy::SplitCalls, LargeRangePolicy::WholeVmid] {
        let r = Arc::new(TlbRecorder::new());
        let m = mmu(r.clone());
        m.set_tlb_large_range(policy, LIMIT_PAGES).unwrap();
        let npages = SLOT_SIZE / PAGE;
        m.enable_dirty_logging(SLOT).unwrap();
        let calls = r.take();
        let all: Vec<u64> = (0..npages).collect();
        assert!(all.iter().all(|&p| !writable(&m, p)), "logging protects");
        assert_covered(&calls, &all, "enable logging");

        let words = npages.div_ceil(64) as usize;
        for chunk_pages in [npages, npages / 4] {
            let dirty = dirty_set();
            let n = m.dirty_pages(SLOT, dirty.iter().copied()).unwrap();
            assert_eq!(n, dirty.len() as u64);
            assert!(dirty.iter().all(|&p| writable(&m, p)));
            r.take();
            let mut bitmap = vec![0u64; words];
            assert_eq!(m.get_dirty_log(SLOT, &mut bitmap).unwrap(), n);
            assert!(r.is_empty(), "manual protect: get only copies");
            let mut first = 0;
            let mut clears = 0;
            while first < npages {
                let k = chunk_pages.min(npages - first);
                let w = (first / 64) as usize;
                let b = &bitmap[w..w + k.div_ceil(64) as usize];
                m.clear_dirty_log(SLOT, first, k, b).unwrap();
                first += k;
                clears += 1;
            }
            let calls = r.take();
            assert!(dirty.iter().all(|&p| !writable(&m, p)), "clear protects");
            assert_covered(&calls, &dirty, "clear");
            // Each clear that protected something flushes the whole slot.
            let flushing = if chunk_pages == npages { 1 } else { clears };
            match policy {
                LargeRangePolicy::WholeVmid => {
                    assert_eq!(calls, vec![TlbCall::Vmid; flushing]);
                }
                LargeRangePolicy::SplitCalls => {
                    let per = npages / LIMIT_PAGES;
                    assert_eq!(calls.len() as u64, flushing as u64 * per);
                    assert!(calls.iter().all(|c| matches!(
                        c,
                        TlbCall::Range { size, .. } if *size <= LIMIT_PAGES * PAGE
                    )));
                }
            }
        }
    }
}

#[test]
fn deleting_a_slot_invalidates_its_mappings() {
    let r = Arc::new(TlbRecorder::new());
    let m = mmu(r.clone());
    m.set_memory_region(
        &UserMemoryRegion::new(SLOT, SlotFlags::NONE, Gpa::new(GPA), 0, Hva::new(HVA)),
        PAGE,
    )
    .unwrap();
    let calls = r.take();
    let all: Vec<u64> = (0..SLOT_SIZE / PAGE).collect();
    assert_covered(&calls, &all, "delete");
    assert!(m.with_table(|pt| pt.translate(GPA)).is_none());
}

/// Every TLBI is a stage-2 one (by IPA or the whole VMID), except the
/// stage-1 VMALLE1(IS) that follows a completed stage-2 invalidation.
fn assert_stage2_only(seqs: &[Vec<Insn>]) {
    assert!(!seqs.is_empty(), "something was invalidated");
    for s in seqs {
        let mut stage2_done = false;
        let mut tlbis = 0;
        for (i, insn) in s.iter().enumerate() {
            match *insn {
                Insn::Tlbi { op, .. } => {
                    tlbis += 1;
                    match op.scope() {
                        TlbiScope::Stage2ByIpa | TlbiScope::WholeVmid => {
                            stage2_done = false;
                            let later_s1 = s[i..].iter().any(|x| {
                                matches!(x, Insn::Tlbi { op, .. } if op.scope() == TlbiScope::Stage1WholeVmid)
                            });
                            if op.scope() == TlbiScope::Stage2ByIpa {
                                assert!(later_s1, "stage-2 by IPA then stage-1 of the VMID: {s:?}");
                            }
                        }
                        TlbiScope::Stage1WholeVmid => assert!(
                            stage2_done,
                            "stage-1 invalidation only after a completed stage-2 one: {s:?}"
                        ),
                    }
                }
                Insn::Barrier(_) => {
                    if i > 0
                        && matches!(s[i - 1], Insn::Tlbi { op, .. } if op.scope() != TlbiScope::Stage1WholeVmid)
                    {
                        stage2_done = true;
                    }
                }
            }
        }
        assert!(tlbis > 0, "no empty sequence: {s:?}");
    }
}

#[test]
fn table_operations_issue_stage2_tlbis_only() {
    let tlb = Arc::new(Arm64Tlbi::new(
        InsnRecorder::new(),
        12,
        Arm64TlbiFeatures::default(),
    ));
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let mm = HostMmOps::new(4096).unwrap();
    let mut pt = PageTable::new(fmt, mm.clone(), tlb.clone()).unwrap();
    let mut cache = PageCache::new(mm);
    cache.top_up(600).unwrap();
    let base = 1u64 << 30;
    pt.map(
        base,
        4 << 20,
        0x8000_0000,
        Prot::RW,
        &mut cache,
        MapOptions::default(),
    )
    .unwrap();
    assert!(tlb.sink().take().is_empty());
    // Split: break-before-make of a valid block, a leaf: by IPA at the
    // last level, with the block's level (2) as the TTL hint.
    pt.split(base, 2 << 20, &mut cache, SplitPolicy::SkipReturns)
        .unwrap();
    let seqs = tlb.sink().take();
    assert_stage2_only(&seqs);
    let ttl2 = ((1 << 2) | 2) << 44;
    assert!(
        seqs.iter().flatten().any(|i| *i
            == Insn::Tlbi {
                op: TlbiOp::Ipas2le1is,
                operand: base >> 12 | ttl2
            }),
        "BBM of a block is last-level with its TTL: {seqs:?}"
    );
    pt.wrprotect(base, 4 << 20).unwrap();
    let seqs = tlb.sink().take();
    assert_stage2_only(&seqs);
    assert!(seqs.iter().flatten().any(|i| matches!(
        i,
        Insn::Tlbi {
            op: TlbiOp::Ripas2e1is,
            ..
        }
    )));
    pt.relax_perms(base + PAGE, Prot::RW).unwrap();
    let seqs = tlb.sink().take();
    assert_stage2_only(&seqs);
    assert!(
        seqs.iter()
            .flatten()
            .all(|i| !matches!(i, Insn::Tlbi { op, .. } if op.broadcast())),
        "relaxing is invalidated on this CPU only"
    );
    pt.unmap(base, 4 << 20).unwrap();
    assert_stage2_only(&tlb.sink().take());
}

#[test]
fn dirty_log_clears_issue_stage2_tlbis_only_under_both_policies() {
    let tlb = Arc::new(Arm64Tlbi::new(
        InsnRecorder::new(),
        12,
        Arm64TlbiFeatures::default(),
    ));
    let m = mmu(tlb.clone());
    m.enable_dirty_logging(SLOT).unwrap();
    let npages = SLOT_SIZE / PAGE;
    let mut bitmap = vec![0u64; npages.div_ceil(64) as usize];
    for (policy, want_calls) in [
        (LargeRangePolicy::SplitCalls, npages / LIMIT_PAGES),
        (LargeRangePolicy::WholeVmid, 1),
    ] {
        m.set_tlb_large_range(policy, LIMIT_PAGES).unwrap();
        assert_eq!(
            m.tlb_policy(),
            TlbPolicy {
                limit_pages: LIMIT_PAGES,
                large_range: policy,
                page_shift: 12
            }
        );
        m.dirty_pages(SLOT, dirty_set()).unwrap();
        tlb.sink().take();
        m.get_dirty_log(SLOT, &mut bitmap).unwrap();
        m.clear_dirty_log(SLOT, 0, npages, &bitmap).unwrap();
        let seqs = tlb.sink().take();
        assert_stage2_only(&seqs);
        assert_eq!(
            seqs.len() as u64,
            want_calls,
            "{policy:?}: hypervisor calls"
        );
        if policy == LargeRangePolicy::WholeVmid {
            assert!(matches!(
                seqs[0][1],
                Insn::Tlbi {
                    op: TlbiOp::Vmalls12e1is,
                    ..
                }
            ));
        }
    }
}

/// A caller's policy cannot carry a page size other than the table's: a
/// shift of 64 or more used to overflow in the first range flush.
#[test]
fn tlb_policy_page_shift_is_the_tables_own() {
    let rec = Arc::new(TlbRecorder::new());
    let mm = HostMmOps::new(4096).unwrap();
    let mut pt = PageTable::new(
        Arm64Stage2::new(Granule::K4, 40).unwrap(),
        mm.clone(),
        rec.clone(),
    )
    .unwrap();
    pt.set_tlb_policy(TlbPolicy {
        limit_pages: 4,
        large_range: LargeRangePolicy::SplitCalls,
        page_shift: 70,
    });
    assert_eq!(pt.tlb_policy().page_shift, 12);
    let mut cache = PageCache::new(mm);
    cache.top_up(8).unwrap();
    let opts = MapOptions { force_pages: true };
    pt.map(0, 16 << 12, 0x1000_0000, Prot::RW, &mut cache, opts)
        .unwrap();
    rec.take();
    pt.wrprotect(0, 16 << 12).unwrap();
    // 16 pages over a 4-page limit: four range calls of 4 pages.
    let ranges = rec
        .take()
        .into_iter()
        .filter(|c| matches!(c, TlbCall::Range { .. }))
        .count();
    assert_eq!(ranges, 4);
}
