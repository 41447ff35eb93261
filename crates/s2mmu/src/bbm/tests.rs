//! Each rule broken on purpose through the engine's own store primitives
//! (a wrong order of the walk's `try_set`, `break_unflushed`, `make` and
//! the table's invalidations), and the right order of the same steps
//! accepted: the monitor catches what it claims to, and only that.

use super::{defer_invalidations, expect_violations, take_table_violations, Rule};
use crate::format::arm64::{Arm64Stage2, Granule};
use crate::format::ept::EptStage2;
use crate::tlb::TlbRecorder;
use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
use crate::{HostMmOps, MapOptions, PageCache, PageTable, Prot, PteFormat};
use alloc::sync::Arc;
use alloc::vec::Vec;

const IPA: u64 = 1 << 30;
const PA: u64 = 0x80_0000_0000;

/// A table marked as breaking rules on purpose, with 4K pages mapped at
/// `IPA` (a 2 MiB block when `block`).
fn table<F: PteFormat>(fmt: F, block: bool) -> (PageTable<F, HostMmOps>, PageCache<HostMmOps>) {
    let mm = HostMmOps::new(4096).unwrap();
    let mut pt = PageTable::new(fmt, mm.clone(), Arc::new(TlbRecorder::new())).unwrap();
    expect_violations(pt.bbm_id());
    let mut cache = PageCache::new(mm);
    cache.top_up(16).unwrap();
    let size = if block { 2 << 20 } else { 4 << 12 };
    let opts = MapOptions::default();
    pt.map(IPA, size, PA, Prot::RW, &mut cache, opts).unwrap();
    (pt, cache)
}

/// Runs `f` on the leaf (level `level`) that maps `IPA`, in an exclusive walk.
fn at_leaf<F: PteFormat>(
    pt: &mut PageTable<F, HostMmOps>,
    level: u32,
    mut f: impl FnMut(&VisitCtx<'_, F, HostMmOps>),
) {
    let mut v = |ctx: &VisitCtx<'_, F, HostMmOps>, _: Visit| {
        if ctx.level == level && ctx.fmt.is_valid(ctx.old) {
            f(ctx);
        }
        Ok(WalkAction::Continue)
    };
    let page = pt.format().page_size();
    pt.walk(IPA, page, WalkFlags::LEAF, &mut v).unwrap();
}

fn rules(pt: &PageTable<impl PteFormat, HostMmOps>) -> Vec<Rule> {
    rules_of(pt.bbm_id())
}

#[test]
fn a_remap_without_a_break_is_caught() {
    let (mut pt, _c) = table(Arm64Stage2::new(Granule::K4, 40).unwrap(), false);
    let moved = pt.format().leaf_pte(PA + (1 << 20), 3, Prot::RW).unwrap();
    at_leaf(&mut pt, 3, |ctx| ctx.try_set(moved).unwrap());
    assert_eq!(rules(&pt), [Rule::ChangeWithoutBreak]);
}

#[test]
fn a_make_before_the_break_is_invalidated_is_caught() {
    let (mut pt, _c) = table(Arm64Stage2::new(Granule::K4, 40).unwrap(), false);
    let moved = pt.format().leaf_pte(PA + (1 << 20), 3, Prot::RW).unwrap();
    at_leaf(&mut pt, 3, |ctx| {
        ctx.break_unflushed();
        ctx.make(moved);
    });
    assert_eq!(rules(&pt), [Rule::MakeBeforeInvalidate]);
    // The same steps with the invalidation between break and make pass.
    let back = pt.format().leaf_pte(PA, 3, Prot::RW).unwrap();
    let tlb = pt.tlb().clone();
    at_leaf(&mut pt, 3, |ctx| {
        ctx.break_unflushed();
        tlb.flush_ipa(ctx.addr, Some(ctx.level));
        ctx.make(back);
    });
    // try_break is break + invalidation in one.
    at_leaf(&mut pt, 3, |ctx| {
        ctx.try_break(&*tlb).unwrap();
        ctx.make(moved);
    });
    assert_eq!(rules(&pt), []);
}

#[test]
fn an_invalidation_of_another_address_does_not_cover_a_break() {
    let (mut pt, _c) = table(Arm64Stage2::new(Granule::K4, 40).unwrap(), false);
    let moved = pt.format().leaf_pte(PA + (1 << 20), 3, Prot::RW).unwrap();
    let tlb = pt.tlb().clone();
    at_leaf(&mut pt, 3, |ctx| {
        ctx.break_unflushed();
        tlb.flush_ipa(ctx.addr + 0x1000, Some(3)); // the wrong operand
        tlb.flush_range(ctx.addr + 0x1000, 0x3000); // a range beside it
        ctx.make(moved);
    });
    assert_eq!(rules(&pt), [Rule::MakeBeforeInvalidate]);
}

#[test]
fn a_split_whose_invalidation_is_only_queued_is_caught() {
    // A 2 MiB block broken and made a table while its invalidation waits
    // in a queue (what collecting a fault's TLBIs for later does).
    let (mut pt, mut cache) = table(Arm64Stage2::new(Granule::K4, 40).unwrap(), true);
    let tlb = pt.tlb().clone();
    let child = cache.pop().unwrap();
    let tpte = pt.format().table_pte(child);
    let (_, queued) = defer_invalidations(|| {
        at_leaf(&mut pt, 2, |ctx| {
            ctx.try_break(&*tlb).unwrap();
            ctx.make(tpte);
        })
    });
    queued.complete();
    assert_eq!(rules(&pt), [Rule::MakeBeforeInvalidate]);
    // Undo by hand so the table tears down cleanly.
    let block = pt.format().leaf_pte(PA, 2, Prot::RW).unwrap();
    at_leaf(&mut pt, 2, |ctx| {
        ctx.try_break(&*tlb).unwrap();
        ctx.make(block);
    });
    cache.push(child);
    assert_eq!(rules(&pt), []);
}

#[test]
fn a_table_freed_before_its_invalidation_is_caught() {
    for flush_first in [false, true] {
        let (mut pt, _c) = table(Arm64Stage2::new(Granule::K4, 40).unwrap(), false);
        pt.unmap(IPA, 4 << 12).unwrap(); // leaves gone, their table freed after a flush
        assert_eq!(rules(&pt), []);
        let mut cache = PageCache::new(pt.mm().clone());
        cache.top_up(8).unwrap();
        pt.map(
            IPA,
            4 << 12,
            PA,
            Prot::RW,
            &mut cache,
            MapOptions::default(),
        )
        .unwrap();
        let tlb = pt.tlb().clone();
        let mut freed = Vec::new();
        let mut v = |ctx: &VisitCtx<'_, Arm64Stage2, HostMmOps>, visit: Visit| {
            if visit == Visit::TablePost && ctx.level == 2 {
                ctx.try_set(0)?; // unlink the last-level table
                freed.push(ctx.fmt.output_address(ctx.old));
                if flush_first {
                    tlb.flush_range(ctx.entry_start(), ctx.granule());
                }
            }
            Ok(WalkAction::Continue)
        };
        pt.walk(IPA, 4 << 12, WalkFlags::TABLE_POST, &mut v)
            .unwrap();
        super::free_tables(pt.bbm_id(), &freed);
        let want: &[Rule] = if flush_first {
            &[]
        } else {
            &[Rule::FreeBeforeInvalidate]
        };
        assert_eq!(rules(&pt), want, "flush first: {flush_first}");
        // The page leaks here on purpose: its leaves were left in it.
    }
}

/// Write-protects the page at `IPA`, invalidates it or not, and reports.
fn protect_then_report<F: PteFormat>(fmt: F, flush: bool) -> Vec<Rule> {
    let (mut pt, _c) = table(fmt, false);
    let tlb = pt.tlb().clone();
    at_leaf(&mut pt, 3, |ctx| {
        ctx.try_set(ctx.old & !ctx.fmt.write_bit()).unwrap();
        if flush {
            tlb.flush_range(IPA, 4 << 12);
        }
    });
    super::report_clean(pt.bbm_id());
    rules(&pt)
}

#[test]
fn a_report_before_the_protection_is_invalidated_is_caught() {
    for flush in [false, true] {
        let want: &[Rule] = if flush {
            &[]
        } else {
            &[Rule::ReportBeforeInvalidate]
        };
        let arm64 = Arm64Stage2::new(Granule::K4, 40).unwrap();
        assert_eq!(
            protect_then_report(arm64, flush),
            want,
            "arm64, flush {flush}"
        );
        let ept = EptStage2::new(4).unwrap();
        assert_eq!(protect_then_report(ept, flush), want, "EPT, flush {flush}");
    }
}

#[test]
fn a_hardware_dirty_clean_is_a_protection() {
    // EPT with A/D flags: a clean clears the dirty flag and keeps the write
    // permission; a cached dirty translation would hide the next write.
    let (mut pt, _c) = table(EptStage2::new(4).unwrap(), false);
    let hw = pt.format().hw_dirty_bits().unwrap();
    assert!(pt.reader().hw_dirty_update(IPA).is_some());
    at_leaf(&mut pt, 3, |ctx| ctx.try_set(hw.clean(ctx.old)).unwrap());
    super::report_clean(pt.bbm_id());
    assert_eq!(rules(&pt), [Rule::ReportBeforeInvalidate]);
}

#[test]
fn a_permission_relaxation_needs_no_invalidation() {
    let (mut pt, _c) = table(Arm64Stage2::new(Granule::K4, 40).unwrap(), false);
    let tlb = pt.tlb().clone();
    at_leaf(&mut pt, 3, |ctx| {
        ctx.try_set(ctx.old & !ctx.fmt.write_bit()).unwrap()
    });
    tlb.flush_vmid();
    // Write and execute given back with no invalidation, then reported.
    at_leaf(&mut pt, 3, |ctx| {
        ctx.try_set(ctx.fmt.with_exec(ctx.old | ctx.fmt.write_bit()))
            .unwrap()
    });
    super::report_clean(pt.bbm_id());
    assert_eq!(rules(&pt), []);
}

/// The engine's own operations, with their invalidations held as if the
/// backend had only queued them (never completed): the trace points are
/// on the real paths, so each rule fires from the real code.
#[test]
fn the_engines_operations_are_traced() {
    let (mut pt, mut cache) = table(Arm64Stage2::new(Granule::K4, 40).unwrap(), true);
    // Split: break the block, invalidation held, make the table.
    let (split, held) =
        defer_invalidations(|| pt.split(IPA, 2 << 20, &mut cache, crate::SplitPolicy::SkipReturns));
    split.unwrap();
    drop(held);
    assert!(rules(&pt).contains(&Rule::MakeBeforeInvalidate));
    // Unmap: the emptied table freed while its invalidation is held.
    let (unmapped, held) = defer_invalidations(|| pt.unmap(IPA, 2 << 20));
    assert!(unmapped.unwrap().tables_freed >= 1);
    drop(held);
    assert!(rules(&pt).contains(&Rule::FreeBeforeInvalidate));
    // Without holding them (the held ones having run late), the same
    // operations break nothing.
    pt.tlb().flush_vmid();
    pt.map(
        IPA,
        2 << 20,
        PA,
        Prot::RW,
        &mut cache,
        MapOptions::default(),
    )
    .unwrap();
    cache.top_up(4).unwrap();
    pt.split(IPA, 2 << 20, &mut cache, crate::SplitPolicy::SkipReturns)
        .unwrap();
    pt.unmap(IPA, 2 << 20).unwrap();
    assert_eq!(rules(&pt), []);
}

#[test]
fn a_real_get_and_clear_are_checked() {
    use crate::memslot::{SlotFlags, TreeMemslots, UserMemoryRegion};
    use crate::mmu::{Mmu, MmuPolicy};
    use crate::{Gpa, Hva};
    let guest = alloc::vec![0u8; 17 << 12];
    let hva = (guest.as_ptr() as u64 + 4095) & !4095;
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let policy = MmuPolicy::default();
    let mmu = Mmu::new(
        fmt,
        HostMmOps::new(4096).unwrap(),
        Arc::new(TlbRecorder::new()),
        TreeMemslots::new(),
        policy,
    )
    .unwrap();
    expect_violations(mmu.bbm_id());
    let slot = UserMemoryRegion::new(0, SlotFlags::NONE, Gpa::new(IPA), 16 << 12, Hva::new(hva));
    mmu.set_memory_region(&slot, 4096).unwrap();
    mmu.enable_dirty_logging(0).unwrap();
    let mut vcpu = mmu.new_vcpu().unwrap();
    let mut bits = [0u64; 1];
    for held in [true, false] {
        mmu.handle_fault(&mut vcpu, Gpa::new(IPA + 0x3000), true)
            .unwrap();
        mmu.get_dirty_log(0, &mut bits).unwrap();
        assert_eq!(bits[0], 1 << 3);
        let clear = || mmu.clear_dirty_log(0, 0, 16, &bits);
        if held {
            let (cleared, queued) = defer_invalidations(clear);
            assert_eq!(cleared.unwrap(), 1);
            drop(queued);
        } else {
            assert_eq!(clear().unwrap(), 1);
        }
        let want: &[Rule] = if held {
            &[Rule::ReportBeforeInvalidate]
        } else {
            &[]
        };
        assert_eq!(rules_of(mmu.bbm_id()), want, "held {held}");
        mmu.with_table(|pt| pt.tlb().flush_vmid());
    }
}

fn rules_of(table: usize) -> Vec<Rule> {
    take_table_violations(table)
        .into_iter()
        .map(|v| v.rule)
        .collect()
}

#[test]
fn a_tlbi_sequence_without_its_barriers_is_caught() {
    use crate::tlbi::{Barrier::*, Insn, TlbiOp::*};
    let t = |op, operand| Insn::Tlbi { op, operand };
    let b = Insn::Barrier;
    let check = super::checker::check_sequence;
    // KVM's sequences pass.
    let ipa = [
        b(DsbIshst),
        t(Ipas2e1is, 0x40),
        b(DsbIsh),
        t(Vmalle1is, 0),
        b(DsbIsh),
        b(Isb),
    ];
    assert_eq!(check(&ipa), Ok(()));
    let local = [
        b(DsbNshst),
        t(Ipas2e1, 0x40),
        b(DsbNsh),
        t(Vmalle1, 0),
        b(DsbNsh),
        b(Isb),
    ];
    assert_eq!(check(&local), Ok(()));
    // No store barrier first, only a store barrier last, a local DSB for
    // a broadcast TLBI: each caught, naming the first TLBI's operand.
    let no_first = [
        t(Ipas2e1is, 0x40),
        b(DsbIsh),
        t(Vmalle1is, 0),
        b(DsbIsh),
        b(Isb),
    ];
    assert_eq!(check(&no_first), Err(0x40));
    let no_completion = [b(DsbIshst), t(Vmalls12e1is, 0), b(DsbIshst), b(Isb)];
    assert_eq!(check(&no_completion), Err(0));
    let local_dsb = [b(DsbNshst), t(Ipas2e1is, 0x80), b(DsbNsh), b(Isb)];
    assert_eq!(check(&local_dsb), Err(0x80));
    // The last-level forms keep their domain: local with local DSBs,
    // broadcast needing the Inner Shareable ones.
    let local_leaf = [
        b(DsbNshst),
        t(Ipas2le1, 0x40),
        b(DsbNsh),
        t(Vmalle1, 0),
        b(DsbNsh),
        b(Isb),
    ];
    assert_eq!(check(&local_leaf), Ok(()));
    let leaf_local_dsb = [b(DsbNshst), t(Ipas2le1is, 0xc0), b(DsbNsh), b(Isb)];
    assert_eq!(check(&leaf_local_dsb), Err(0xc0));
}

#[test]
fn the_arm64_backends_sequences_carry_their_barriers() {
    use crate::tlb::arm64::{Arm64Tlbi, InsnRecorder};
    use crate::TlbInvalidate;
    let before = super::violations().len();
    let tlb = Arm64Tlbi::new(InsnRecorder::default(), 12, Default::default());
    tlb.flush_ipa(0x4000_0000, Some(3));
    tlb.flush_ipa_local(0x4000_0000, Some(3));
    tlb.flush_range(0x4000_0000, 64 << 12);
    tlb.flush_vmid();
    assert_eq!(
        super::violations().len(),
        before,
        "{:?}",
        super::violations()
    );
}
