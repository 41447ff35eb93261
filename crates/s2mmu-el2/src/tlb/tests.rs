use super::*;
use alloc::vec::Vec;
use s2mmu::tlb::arm64::decode_range;
use spin::Mutex;

#[derive(Default)]
struct Rec(Mutex<Vec<Step>>);

impl Exec for Rec {
    fn exec(&self, step: Step) {
        self.0.lock().push(step);
    }
}

fn tlb(range: bool, ttl: bool) -> El2Tlb<Rec> {
    El2Tlb::new(Rec::default(), TlbFeatures { range, ttl })
}

fn take(t: &El2Tlb<Rec>) -> Vec<Step> {
    core::mem::take(&mut *t.exec().0.lock())
}

#[test]
fn a_leaf_is_invalidated_at_the_last_level_with_its_level_hint() {
    let t = tlb(true, true);
    t.flush_ipa(0x8000_5000, Some(3));
    let op = (0x8000_5000u64 >> 12) | ((1 << 2) | 3) << 44;
    assert_eq!(
        take(&t),
        [
            Step::DsbIshst,
            Step::Ipas2le1is(op),
            Step::DsbIsh,
            Step::Vmalle1is,
            Step::DsbIsh,
            Step::Isb
        ]
    );
    t.flush_ipa(0x8000_5000, None);
    assert_eq!(take(&t)[1], Step::Ipas2e1is(0x8000_5000 >> 12));
    assert_eq!((t.counts().last_level, t.counts().all_levels), (1, 1));
    let no_ttl = tlb(true, false);
    no_ttl.flush_ipa(0x8000_5000, Some(2));
    assert_eq!(take(&no_ttl)[1], Step::Ipas2le1is(0x8000_5000 >> 12));
}

#[test]
fn a_local_flush_stays_on_this_cpu() {
    let t = tlb(true, true);
    t.flush_ipa_local(0x4000, Some(3));
    let s = take(&t);
    assert_eq!(s[0], Step::DsbNshst);
    assert!(matches!(s[1], Step::Ipas2le1(_)));
    assert_eq!(
        &s[2..],
        &[Step::DsbNsh, Step::Vmalle1, Step::DsbNsh, Step::Isb]
    );
}

#[test]
fn ranges_use_range_tlbis_only_with_feat_tlbirange() {
    let t = tlb(true, true);
    let start = 0x1_0000_0000 + 7 * 4096;
    for pages in [1u64, 2, 3, 64, 65, 1000, 123_457] {
        t.flush_range(start, pages << 12);
        let s = take(&t);
        let mut at = start;
        for step in &s[1..s.len() - 4] {
            let (a, n) = match *step {
                Step::Ripas2e1is(op) => decode_range(op, 12, false),
                Step::Ipas2e1is(op) => ((op & ((1 << 44) - 1)) << 12, 4096),
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
        [Step::DsbIshst, Step::Vmalls12e1is, Step::DsbIsh, Step::Isb]
    );
    assert_eq!(old.sequences(), 1);
    assert_eq!(old.counts().vmid, 1);
    let c = t.counts();
    assert!(c.range > 0 && c.all_levels > 0, "{c:?}");
    assert_eq!((c.last_level, c.vmid), (0, 0));
}

#[test]
fn an_empty_range_issues_nothing() {
    let t = tlb(true, true);
    t.flush_range(0x1000, 0);
    assert!(take(&t).is_empty());
    assert_eq!(t.sequences(), 0);
}
