use super::*;
use alloc::vec::Vec;
use s2mmu::tlb::arm64::{decode_range, Barrier};
use s2mmu::TlbInvalidate;
use spin::Mutex;

/// Records what the sink executes.
#[derive(Default)]
struct Rec(Mutex<Vec<Insn>>);

impl TlbiSink for Rec {
    fn emit(&self, insn: Insn) {
        self.0.lock().push(insn);
    }
}

fn tlb(range: bool, ttl: bool) -> El2Tlbi<Rec> {
    let features = Arm64TlbiFeatures {
        range,
        ttl,
        lpa2: false,
    };
    El2Tlb::backend(Rec::default(), features)
}

fn take(t: &El2Tlbi<Rec>) -> Vec<Insn> {
    core::mem::take(&mut *t.sink().exec().0.lock())
}

fn tlbi(op: TlbiOp, operand: u64) -> Insn {
    Insn::Tlbi { op, operand }
}

#[test]
fn a_leaf_is_invalidated_at_the_last_level_with_its_level_hint() {
    let t = tlb(true, true);
    t.flush_ipa(0x8000_5000, Some(3));
    let op = (0x8000_5000u64 >> 12) | ((1 << 2) | 3) << 44;
    assert_eq!(
        take(&t),
        [
            Insn::Barrier(Barrier::DsbIshst),
            tlbi(TlbiOp::Ipas2le1is, op),
            Insn::Barrier(Barrier::DsbIsh),
            tlbi(TlbiOp::Vmalle1is, 0),
            Insn::Barrier(Barrier::DsbIsh),
            Insn::Barrier(Barrier::Isb),
        ]
    );
    t.flush_ipa(0x8000_5000, None);
    assert_eq!(take(&t)[1], tlbi(TlbiOp::Ipas2e1is, 0x8000_5000 >> 12));
    let c = t.sink().counts();
    assert_eq!((c.last_level, c.all_levels), (1, 1));
    assert_eq!(t.sink().sequences(), 2);
    let no_ttl = tlb(true, false);
    no_ttl.flush_ipa(0x8000_5000, Some(2));
    assert_eq!(
        take(&no_ttl)[1],
        tlbi(TlbiOp::Ipas2le1is, 0x8000_5000 >> 12)
    );
}

#[test]
fn a_local_flush_stays_on_this_cpu() {
    let t = tlb(true, true);
    t.flush_ipa_local(0x4000, Some(3));
    let s = take(&t);
    assert_eq!(s[0], Insn::Barrier(Barrier::DsbNshst));
    assert!(matches!(
        s[1],
        Insn::Tlbi {
            op: TlbiOp::Ipas2le1,
            ..
        }
    ));
    assert_eq!(
        &s[2..],
        &[
            Insn::Barrier(Barrier::DsbNsh),
            tlbi(TlbiOp::Vmalle1, 0),
            Insn::Barrier(Barrier::DsbNsh),
            Insn::Barrier(Barrier::Isb),
        ]
    );
    assert_eq!(t.sink().counts().last_level, 1);
}

#[test]
fn ranges_use_range_tlbis_only_with_feat_tlbirange() {
    let t = tlb(true, true);
    let start = 0x1_0000_0000 + 7 * 4096;
    for pages in [1u64, 2, 3, 64, 65, 1000, 123_457] {
        t.flush_range(start, pages << 12);
        let s = take(&t);
        let mut at = start;
        for insn in &s[1..s.len() - 4] {
            let (a, n) = match *insn {
                Insn::Tlbi {
                    op: TlbiOp::Ripas2e1is,
                    operand,
                } => decode_range(operand, 12, false),
                Insn::Tlbi {
                    op: TlbiOp::Ipas2e1is,
                    operand,
                } => ((operand & ((1 << 44) - 1)) << 12, 4096),
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(a, at, "contiguous ({pages} pages)");
            at += n;
        }
        assert_eq!(at, start + (pages << 12), "{pages} pages covered");
    }
    let old = tlb(false, true);
    old.flush_range(0x1000, 0x3000);
    assert_eq!(
        take(&old),
        [
            Insn::Barrier(Barrier::DsbIshst),
            tlbi(TlbiOp::Vmalls12e1is, 0),
            Insn::Barrier(Barrier::DsbIsh),
            Insn::Barrier(Barrier::Isb),
        ]
    );
    assert_eq!(old.sink().sequences(), 1);
    assert_eq!(old.sink().counts().vmid, 1);
    let c = t.sink().counts();
    assert!(c.range > 0 && c.all_levels > 0, "{c:?}");
    assert_eq!((c.last_level, c.vmid), (0, 0));
}

#[test]
fn an_empty_range_issues_nothing() {
    let t = tlb(true, true);
    t.flush_range(0x1000, 0);
    assert!(take(&t).is_empty());
    assert_eq!(t.sink().sequences(), 0);
}
