//! The abort path and the dirty-log commands on the host: first touch,
//! write protection under logging, GET and CLEAR into shared memory, ring
//! harvest, collapse, unmap, counters.

mod common;

use common::*;
use s2mmu::Prot;
use s2mmu_el2::abi::{LogMode, Op};
use s2mmu_el2::{AbortOutcome, FLAG_POSTCOPY};

const IPA: u64 = 0x8000_0000;
const BACKING: u64 = 0x4400_0000;

fn pages_written() -> Vec<u64> {
    vec![0, 5, 63, 64, 700, 1023]
}

#[test]
fn first_touch_maps_from_the_backing_and_wp_faults_mark_dirty() {
    let mut h = Host::with_slot(LogMode::Manual);
    let out = h.hyp.handle_abort(0, &iabt(IPA + 0x10));
    assert_eq!(out, AbortOutcome::Handled { permission: false });
    let t = h
        .hyp
        .with_mmu(|m| m.reader())
        .unwrap()
        .translate(IPA + 0x10)
        .unwrap();
    assert_eq!(
        (t.pa, t.size),
        (BACKING + 0x10, 2 << 20),
        "a block from the backing"
    );

    h.ok(Op::LogSet, &[0, 1, LogMode::Manual as u64]);
    let m = h.hyp.with_mmu(|m| m.reader()).unwrap();
    assert!(!m.translate(IPA).unwrap().prot.contains(Prot::W));
    for p in pages_written() {
        let ipa = IPA + p * 4096;
        let mapped = h
            .hyp
            .with_mmu(|m| m.reader())
            .unwrap()
            .translate(ipa)
            .is_some();
        let out = h.hyp.handle_abort(0, &dabt(ipa, true, mapped));
        assert_eq!(out, AbortOutcome::Handled { permission: mapped });
    }
    let n = h.ok(Op::GetDirty, &[0, SHARED_PA, 128])[0];
    assert_eq!(n, 6);
    let mut want = [0u64; 16];
    for p in pages_written() {
        want[(p / 64) as usize] |= 1 << (p % 64);
    }
    let got: Vec<u64> = (0..16).map(|w| h.shared_word(w * 8)).collect();
    assert_eq!(got, want, "GET wrote the pages written, no others");

    // CLEAR the first 64 pages from a bitmap the host writes.
    h.set_shared_word(4096, want[0]);
    assert_eq!(h.ok(Op::ClearDirty, &[0, 0, 64, SHARED_PA + 4096, 8])[0], 3);
    let m = h.hyp.with_mmu(|m| m.reader()).unwrap();
    assert!(!m.translate(IPA + 5 * 4096).unwrap().prot.contains(Prot::W));
    assert!(m
        .translate(IPA + 700 * 4096)
        .unwrap()
        .prot
        .contains(Prot::W));

    h.ok(Op::Counters, &[SHARED_PA + 8192, COUNTERS_BYTES]);
    let c = h.hyp.counters();
    assert_eq!(h.shared_word(8192), c.aborts_handled);
    assert_eq!(c.aborts_handled, 7);
    assert_eq!(c.dirtied, 6);
    assert_eq!(
        h.shared_word(8192 + 5 * 8),
        6,
        "dirtied, in the counters' layout"
    );
}

#[test]
fn collapse_brings_the_blocks_back_and_unmap_drops_them() {
    let mut h = Host::with_slot(LogMode::Manual);
    h.hyp.handle_abort(0, &dabt(IPA, true, false));
    h.ok(Op::LogSet, &[0, 1, LogMode::Manual as u64]);
    let size = |h: &Host| {
        h.hyp
            .with_mmu(|m| m.reader().translate(IPA).map(|t| t.size))
    };
    assert_eq!(size(&h), Some(Some(4096)), "split");
    assert_eq!(h.ok(Op::Collapse, &[0])[0], 1, "the one split block");
    assert_eq!(size(&h), Some(Some(2 << 20)));
    assert_eq!(h.hyp.slot(0).unwrap().flags & 1, 0, "not logging any more");

    assert_eq!(h.ok(Op::UnmapRange, &[BACKING + 0x3000, 0x1000])[0], 1);
    assert!(h
        .hyp
        .with_mmu(|m| m.reader())
        .unwrap()
        .translate(IPA)
        .is_none());
    assert_eq!(h.ok(Op::MemslotSet, &[0, 0, 0, 0, 0, 0]), [0; 4], "deleted");
    assert_eq!(h.hyp.slot(0), None);
    h.ok(Op::VmDestroy, &[]);
    assert_eq!(
        h.hyp.counters().table_pages,
        0,
        "every table page back in the pool"
    );
}

#[test]
fn ring_mode_harvests_into_shared_memory_and_resets() {
    let mut h = Host::with_slot(LogMode::Ring);
    h.ok(Op::LogSet, &[0, 1, LogMode::Ring as u64]);
    for p in pages_written() {
        let out = h.hyp.handle_abort(0, &dabt(IPA + p * 4096, true, false));
        assert_eq!(out, AbortOutcome::Handled { permission: false });
    }
    assert_eq!(h.ok(Op::RingHarvest, &[SHARED_PA, 4096])[0], 6);
    let mut got: Vec<(u64, u64)> = (0..6)
        .map(|i| (h.shared_word(i * 16), h.shared_word(i * 16 + 8)))
        .collect();
    got.sort();
    let want: Vec<(u64, u64)> = pages_written().into_iter().map(|p| (0, p)).collect();
    assert_eq!(got, want);
    assert_eq!(h.ok(Op::RingReset, &[])[0], 6);
    let m = h.hyp.with_mmu(|m| m.reader()).unwrap();
    assert!(!m.translate(IPA + 5 * 4096).unwrap().prot.contains(Prot::W));
}

#[test]
fn a_soft_full_ring_exits_to_the_host_which_harvests_resets_and_resumes_it() {
    let mut h = Host::with_slot(LogMode::Ring);
    h.ok(Op::LogSet, &[0, 1, LogMode::Ring as u64]);
    let mut harvested = Vec::new();
    let mut exits = 0;
    // 600 pages written into a 256-entry ring: the host must empty it.
    for p in 0..600u64 {
        let abort = dabt(IPA + p * 4096, true, false);
        let mut out = h.hyp.handle_abort(0, &abort);
        if out == AbortOutcome::RingFull {
            exits += 1;
            let before = h.hyp.counters();
            let n = h.ok(Op::RingHarvest, &[SHARED_PA, 4096])[0];
            assert!(n > 0 && n <= 256, "{n} entries");
            harvested.extend((0..n).map(|i| h.shared_word(i as usize * 16 + 8)));
            assert_eq!(h.ok(Op::RingReset, &[])[0], n);
            // The refused abort changed nothing: the page is still clean.
            assert_eq!(before.dirtied, h.hyp.counters().dirtied);
            out = h.hyp.handle_abort(0, &abort);
        }
        assert_eq!(out, AbortOutcome::Handled { permission: false }, "page {p}");
    }
    let n = h.ok(Op::RingHarvest, &[SHARED_PA, 4096])[0];
    harvested.extend((0..n).map(|i| h.shared_word(i as usize * 16 + 8)));
    harvested.sort_unstable();
    assert!(exits >= 2, "{exits} exits");
    assert_eq!(
        harvested,
        (0..600).collect::<Vec<u64>>(),
        "lost or extra pages"
    );
    assert_eq!(h.hyp.counters().aborts_to_host, exits);
}

#[test]
fn a_post_copy_page_is_mapped_only_after_the_host_says_it_arrived() {
    let mut h = Host::with_slot(LogMode::Manual);
    let ipa = 0x1000_0000;
    h.ok(
        Op::MemslotSet,
        &[1, FLAG_POSTCOPY, ipa, 16 << 12, 0x4800_0000, 4096],
    );
    let m = h.hyp.with_mmu(|m| m.reader()).unwrap();
    for p in [0u64, 7, 15] {
        let a = ipa + p * 4096 + 0x18;
        let out = h.hyp.handle_abort(0, &dabt(a, p % 2 == 1, false));
        assert_eq!(out, AbortOutcome::PageMissing { ipa: a & !0xfff });
        assert!(
            m.translate(a).is_none(),
            "page {p} mapped before it arrived"
        );
        assert_eq!(h.ok(Op::PageReady, &[1, p])[0], 1);
        let t = m.translate(a).expect("mapped by PAGE_READY");
        assert_eq!(t.pa, 0x4800_0000 + p * 4096 + 0x18);
    }
    // A page not received yet still exits; the ordinary slot is unaffected.
    let out = h.hyp.handle_abort(0, &dabt(ipa + 4096, false, false));
    assert_eq!(out, AbortOutcome::PageMissing { ipa: ipa + 4096 });
    let out = h.hyp.handle_abort(0, &dabt(IPA, true, false));
    assert_eq!(out, AbortOutcome::Handled { permission: false });
    assert_eq!(h.hyp.counters().aborts_to_host, 4);
    // Deleting and re-creating the slot forgets what arrived.
    h.ok(Op::MemslotSet, &[1, 0, 0, 0, 0, 0]);
    h.ok(
        Op::MemslotSet,
        &[1, FLAG_POSTCOPY, ipa, 16 << 12, 0x4800_0000, 4096],
    );
    let out = h.hyp.handle_abort(0, &dabt(ipa, false, false));
    assert_eq!(out, AbortOutcome::PageMissing { ipa });
}
