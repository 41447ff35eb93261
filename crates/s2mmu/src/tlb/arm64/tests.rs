//! The backend's sequences and encodings, and its choice between the
//! last-level and the every-level form as the engine's breaks drive it.

use super::*;

fn backend(f: Arm64TlbiFeatures) -> Arm64Tlbi<InsnRecorder> {
    Arm64Tlbi::new(InsnRecorder::new(), 12, f)
}

fn ranges(seq: &[Insn]) -> Vec<(u64, u64)> {
    seq.iter()
        .filter_map(|i| match *i {
            Insn::Tlbi {
                op: TlbiOp::Ripas2e1is,
                operand,
            } => Some(decode_range(operand, 12, false)),
            Insn::Tlbi {
                op: TlbiOp::Ipas2e1is,
                operand,
            } => Some(((operand & ((1 << 44) - 1)) << 12, 4096)),
            _ => None,
        })
        .collect()
}

#[test]
fn limits_match_the_kernel() {
    assert_eq!(MAX_TLBI_RANGE_PAGES, 1 << 21);
    assert_eq!(range_num(1 << 21, 3), Some(31));
    assert_eq!(range_num(1 << 15, 3), None);
    assert_eq!(range_num(3, 0), Some(0));
}

#[test]
fn ipa_operand_carries_the_level_hint() {
    let op = ipa_operand(0x4020_1000, Some(3), 12, true);
    assert_eq!(op & ((1 << 44) - 1), 0x0004_0201);
    assert_eq!(op >> 44, (1 << 2) | 3);
    assert_eq!(ipa_operand(0x4020_1000, None, 12, true) >> 44, 0);
    assert_eq!(ipa_operand(0x4020_1000, Some(2), 12, false) >> 44, 0);
}

/// KVM's broadcast sequence around one stage-2 TLBI: store barrier, the
/// TLBI, its completion, then the stage-1 flush of the VMID.
fn broadcast_sequence(op: TlbiOp, operand: u64) -> Vec<Insn> {
    vec![
        Insn::Barrier(Barrier::DsbIshst),
        Insn::Tlbi { op, operand },
        Insn::Barrier(Barrier::DsbIsh),
        Insn::Tlbi {
            op: TlbiOp::Vmalle1is,
            operand: 0,
        },
        Insn::Barrier(Barrier::DsbIsh),
        Insn::Barrier(Barrier::Isb),
    ]
}

/// The TLBI of each sequence, in order.
fn tlbis(seqs: &[Vec<Insn>]) -> Vec<(TlbiOp, u64)> {
    seqs.iter()
        .flatten()
        .filter_map(|i| match *i {
            Insn::Tlbi { op, operand } => Some((op, operand)),
            Insn::Barrier(_) => None,
        })
        .collect()
}

#[test]
fn a_leaf_is_invalidated_at_the_last_level_with_its_ttl() {
    let b = backend(Arm64TlbiFeatures::default());
    let ipa = 0x8000_5000u64;
    b.flush_ipa(ipa, Some(3));
    let page = (ipa >> 12) | ((1 << 2) | 3) << 44;
    assert_eq!(
        b.sink().take(),
        [broadcast_sequence(TlbiOp::Ipas2le1is, page)]
    );
    // A 2 MiB block is a leaf too: last level, TTL level 2.
    b.flush_ipa(0x8020_0000, Some(2));
    b.flush_ipa_local(ipa, Some(3));
    // Level unknown: every level, no hint.
    b.flush_ipa(ipa, None);
    b.flush_ipa_local(ipa, None);
    let block = (0x8020_0000u64 >> 12) | ((1 << 2) | 2) << 44;
    let want = [
        (TlbiOp::Ipas2le1is, block),
        (TlbiOp::Vmalle1is, 0),
        (TlbiOp::Ipas2le1, page),
        (TlbiOp::Vmalle1, 0),
        (TlbiOp::Ipas2e1is, ipa >> 12),
        (TlbiOp::Vmalle1is, 0),
        (TlbiOp::Ipas2e1, ipa >> 12),
        (TlbiOp::Vmalle1, 0),
    ];
    assert_eq!(tlbis(&b.sink().take()), want);
    // Without FEAT_TTL the last-level form stays, without the hint.
    let no_ttl = backend(Arm64TlbiFeatures {
        ttl: false,
        ..Arm64TlbiFeatures::default()
    });
    no_ttl.flush_ipa(ipa, Some(3));
    assert_eq!(
        tlbis(&no_ttl.sink().take())[0],
        (TlbiOp::Ipas2le1is, ipa >> 12)
    );
}

#[test]
fn the_last_level_ops_are_stage2_by_ipa_and_keep_their_domain() {
    for (op, broadcast, name) in [
        (TlbiOp::Ipas2le1is, true, "ipas2le1is"),
        (TlbiOp::Ipas2le1, false, "ipas2le1"),
    ] {
        assert!(op.last_level());
        assert_eq!(op.scope(), TlbiScope::Stage2ByIpa);
        assert_eq!((op.broadcast(), op.mnemonic()), (broadcast, name));
    }
    for op in [TlbiOp::Ipas2e1is, TlbiOp::Ipas2e1, TlbiOp::Ripas2e1is] {
        assert!(!op.last_level(), "{op:?} invalidates every level");
    }
}

#[test]
fn a_range_never_uses_the_last_level_form() {
    // A range is what the engine issues for a changed table entry: its
    // cached table entries must go too.
    let b = backend(Arm64TlbiFeatures::default());
    b.flush_range(0x4000_0000, 2 << 20);
    b.flush_range(0x4000_0000, 4096);
    let ops = tlbis(&b.sink().take());
    assert!(ops.iter().all(|(op, _)| !op.last_level()), "{ops:?}");
    assert!(ops.contains(&(TlbiOp::Ipas2e1is, 0x4000_0000 >> 12)));
}

#[test]
fn an_8g_range_is_one_range_tlbi() {
    let b = backend(Arm64TlbiFeatures::default());
    b.flush_range(1 << 33, 8 << 30);
    let seqs = b.sink().take();
    assert_eq!(seqs.len(), 1);
    let s = &seqs[0];
    let want = range_operand(1 << 33, 31, 3, 12, false);
    assert_eq!(
        want,
        ((1u64 << 33) >> 12) | 31 << 39 | 3 << 44 | 1 << 46,
        "BADDR, NUM 31, SCALE 3, TG 4K"
    );
    assert_eq!(*s, broadcast_sequence(TlbiOp::Ripas2e1is, want));
}

#[test]
fn odd_ranges_are_covered_exactly() {
    let b = backend(Arm64TlbiFeatures::default());
    for pages in [1u64, 2, 3, 63, 64, 65, 1000, 123_457, (1 << 21) + 5] {
        let start = 0x1_0000_0000 + 7 * 4096;
        b.flush_range(start, pages << 12);
        let seqs = b.sink().take();
        assert_eq!(seqs.len(), 1);
        let mut r = ranges(&seqs[0]);
        r.sort();
        let mut at = start;
        for (s, n) in r {
            assert_eq!(s, at, "contiguous, no overlap ({pages} pages)");
            at += n;
        }
        assert_eq!(at, start + (pages << 12), "{pages} pages covered");
    }
}

#[test]
fn without_range_ops_a_range_is_a_whole_vmid_flush() {
    let b = backend(Arm64TlbiFeatures {
        range: false,
        ..Arm64TlbiFeatures::default()
    });
    b.flush_range(0x1000, 0x3000);
    let seqs = b.sink().take();
    assert_eq!(
        seqs[0][1],
        Insn::Tlbi {
            op: TlbiOp::Vmalls12e1is,
            operand: 0
        }
    );
}

#[test]
fn lpa2_uses_single_tlbis_until_64k_aligned() {
    let b = Arm64Tlbi::new(
        InsnRecorder::new(),
        12,
        Arm64TlbiFeatures {
            lpa2: true,
            ..Arm64TlbiFeatures::default()
        },
    );
    b.flush_range(0x1_0000_3000, 64 << 12);
    let seqs = b.sink().take();
    let singles = seqs[0]
        .iter()
        .take_while(|i| {
            !matches!(
                i,
                Insn::Tlbi {
                    op: TlbiOp::Ripas2e1is,
                    ..
                }
            )
        })
        .filter(|i| {
            matches!(
                i,
                Insn::Tlbi {
                    op: TlbiOp::Ipas2e1is,
                    ..
                }
            )
        })
        .count();
    assert_eq!(singles, 13, "pages 3..16 of the first 64 KiB one by one");
}

/// The engine's own breaks through the backend: breaking a 2 MiB block
/// (a leaf) invalidates its entry at the last level with TTL level 2;
/// breaking the table that replaced it invalidates every level of its
/// range, since walks may hold the table entry. Either choice made the
/// other way round fails here.
#[test]
fn a_leaf_break_is_last_level_and_a_table_break_is_every_level() {
    use crate::format::arm64::{Arm64Stage2, Granule};
    use crate::walk::{Visit, VisitCtx, WalkAction, WalkFlags};
    use crate::{HostMmOps, MapOptions, PageCache, PageTable, Prot, PteFormat};
    use alloc::sync::Arc;
    type Fmt = Arm64Stage2;
    const IPA: u64 = 1 << 30;
    const PA: u64 = 0x80_0000_0000;
    let tlb = Arc::new(backend(Arm64TlbiFeatures::default()));
    let mm = HostMmOps::new(4096).unwrap();
    let fmt = Arm64Stage2::new(Granule::K4, 40).unwrap();
    let mut pt = PageTable::new(fmt, mm.clone(), tlb.clone()).unwrap();
    let mut cache = PageCache::new(mm);
    cache.top_up(8).unwrap();
    let opts = MapOptions::default();
    pt.map(IPA, 2 << 20, PA, Prot::RW, &mut cache, opts)
        .unwrap();
    assert!(tlb.sink().take().is_empty(), "a first map breaks nothing");
    // The level-2 entry, whatever it holds, replaced by `new`.
    // Through the table's own backend handle, which the break-before-make
    // monitor traces.
    let traced = pt.tlb().clone();
    let replace_level2 = |pt: &mut PageTable<Fmt, HostMmOps>, new: u64| {
        let mut v = |ctx: &VisitCtx<'_, Fmt, HostMmOps>, _: Visit| {
            if ctx.level == 2 {
                ctx.try_break(&*traced).unwrap();
                ctx.make(new);
                return Ok(WalkAction::SkipChildren);
            }
            Ok(WalkAction::Continue)
        };
        let flags = WalkFlags::LEAF | WalkFlags::TABLE_PRE;
        pt.walk(IPA, 4096, flags, &mut v).unwrap();
    };
    let child = cache.pop().unwrap();
    let table = pt.format().table_pte(child);
    replace_level2(&mut pt, table);
    let ttl2 = ((1 << 2) | 2) << 44;
    assert_eq!(
        tlbis(&tlb.sink().take()),
        [
            (TlbiOp::Ipas2le1is, IPA >> 12 | ttl2),
            (TlbiOp::Vmalle1is, 0)
        ],
        "the block is a leaf: last level, TTL 2"
    );
    let block = pt.format().leaf_pte(PA, 2, Prot::RW).unwrap();
    replace_level2(&mut pt, block);
    let ops = tlbis(&tlb.sink().take());
    assert!(ops.iter().all(|(op, _)| !op.last_level()), "{ops:?}");
    let covered: Vec<(u64, u64)> = ops
        .iter()
        .filter(|(op, _)| *op == TlbiOp::Ripas2e1is)
        .map(|&(_, operand)| decode_range(operand, 12, false))
        .collect();
    assert_eq!(covered, [(IPA, 2 << 20)], "the table's whole range");
    cache.push(child);
}
