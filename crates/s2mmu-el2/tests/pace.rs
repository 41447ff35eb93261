//! The brakes at EL2 (`PACE`): auto-converge's throttle and the dirty
//! limit's pace, applied in the abort path to the pages a fault dirties.
//! Bad arguments are refused with their code, the brakes unchanged; a
//! dirtying fault that owes a wait is answered and handed to the host
//! with it (`AbortOutcome::Paced`), counted. The brakes' clock here is a
//! fixed instant (`Hyp::with_clock`), so the pace's lead grows one
//! interval per page; without a clock a pace is refused (`NoClock`).

mod common;

use common::*;
use s2mmu_el2::abi::{HypError::*, LogMode, Op};
use s2mmu_el2::pace::{MAX_PACE, MAX_THROTTLE_NS};
use s2mmu_el2::AbortOutcome;

const IPA: u64 = 0x8000_0000;

/// The brakes' clock in these tests: it stands still at 5 ms.
fn fixed_clock() -> Option<u64> {
    Some(5_000_000)
}

/// A VM logging slot 0 (`manual`), its block mapped before logging, the
/// brakes on the fixed clock.
fn logging() -> Host {
    let mut h = unclocked();
    h.hyp = h.hyp.with_clock(fixed_clock);
    h
}

/// As [`logging`], the brakes without a clock.
fn unclocked() -> Host {
    let mut h = Host::with_slot(LogMode::Manual);
    h.hyp.handle_abort(0, &iabt(IPA));
    h.ok(Op::LogSet, &[0, 1, LogMode::Manual as u64]);
    h
}

/// A guest write to page `p` of slot 0 (a permission fault: mapped,
/// write protected by logging).
fn write(h: &Host, p: u64) -> AbortOutcome {
    h.hyp.handle_abort(0, &dabt(IPA + p * 4096, true, true))
}

fn handled() -> AbortOutcome {
    AbortOutcome::Handled { permission: true }
}

#[test]
fn pace_refuses_bad_arguments_and_keeps_its_brakes() {
    let mut h = Host::new();
    h.refused(Op::Pace, &[1_000_000, 0], NoVm);
    let mut h2 = logging();
    h2.refused(Op::Pace, &[MAX_THROTTLE_NS + 1, 0], BadArgument);
    h2.refused(Op::Pace, &[0, MAX_PACE + 1], BadArgument);
    h2.refused(Op::Pace, &[u64::MAX, u64::MAX], BadArgument);
    h2.refused(Op::Pace, &[0, 0, 1], BadArgument);
    h2.refused(Op::Pace, &[0, 0, 0, 0, 0, 7], BadArgument);
    // Still unbraked: a write is answered, nothing owed.
    assert_eq!(write(&h2, 1), handled());
    // Brakes on, then a bad command: the brakes set before still hold.
    h2.ok(Op::Pace, &[2_000_000, 0]);
    h2.refused(Op::Pace, &[MAX_THROTTLE_NS + 1, 5], BadArgument);
    assert_eq!(
        write(&h2, 2),
        AbortOutcome::Paced {
            throttle_ns: 2_000_000,
            pace_ns: 0
        }
    );
    // The largest values are taken.
    h2.ok(Op::Pace, &[MAX_THROTTLE_NS, MAX_PACE]);
    drop(h);
}

#[test]
fn without_a_clock_a_pace_is_refused_and_the_throttle_taken() {
    let mut h = unclocked();
    h.ok(Op::Pace, &[2_000_000, 0]);
    h.refused(Op::Pace, &[0, 1000], NoClock);
    h.refused(Op::Pace, &[2_000_000, 1], NoClock);
    // The throttle set before still holds, unpaced.
    assert_eq!(
        write(&h, 1),
        AbortOutcome::Paced {
            throttle_ns: 2_000_000,
            pace_ns: 0
        }
    );
    assert_eq!(h.hyp.counters().paced_pages, 0);
    h.ok(Op::Pace, &[0, 0]);
    assert_eq!(write(&h, 2), handled());
}

#[test]
fn a_new_pace_restarts_each_vcpus_clock() {
    let mut h = logging();
    // 100 pages a second: 10 ms a page. Four pages at one instant put the
    // vCPU 30 ms ahead.
    h.ok(Op::Pace, &[0, 100]);
    for p in 1..5 {
        write(&h, p);
    }
    let lead = |pace_ns| AbortOutcome::Paced {
        throttle_ns: 0,
        pace_ns,
    };
    assert_eq!(write(&h, 5), lead(40_000_000));
    // Loosened to 1,000 a second: the lead built under the old pace is
    // not owed; the clock starts again from now.
    h.ok(Op::Pace, &[0, 1000]);
    assert_eq!(write(&h, 6), handled());
    assert_eq!(write(&h, 7), lead(1_000_000));
    // The same pace again changes nothing: the lead stays.
    h.ok(Op::Pace, &[0, 1000]);
    assert_eq!(write(&h, 8), lead(2_000_000));
    // Off, then on again: no lead from before.
    h.ok(Op::Pace, &[0, 0]);
    assert_eq!(write(&h, 9), handled());
    h.ok(Op::Pace, &[0, 1000]);
    assert_eq!(write(&h, 10), handled());
}

#[test]
fn the_throttle_is_owed_per_page_dirtied_and_handed_over_in_batches() {
    let mut h = logging();
    h.ok(Op::Pace, &[400_000, 0]);
    assert_eq!(write(&h, 1), handled());
    // A read dirties nothing: no throttle for it.
    let r = h.hyp.handle_abort(0, &dabt(IPA + 9 * 4096, false, false));
    assert!(matches!(r, AbortOutcome::Handled { .. }), "{r:?}");
    assert_eq!(write(&h, 2), handled());
    // The third page's fault brings the debt to 1.2 ms: over the batch.
    let paced = AbortOutcome::Paced {
        throttle_ns: 1_200_000,
        pace_ns: 0,
    };
    assert_eq!(write(&h, 3), paced);
    // The debt starts again from nothing: the next page owes 0.4 ms.
    assert_eq!(write(&h, 4), handled());
    let c = h.hyp.counters();
    assert_eq!((c.paced_exits, c.throttle_ns, c.pace_ns), (1, 1_200_000, 0));
    assert_eq!(c.paced_pages, 0, "no pace: no page ahead of it");
    assert_eq!(c.dirtied, 4);
    // Off: nothing more is owed, the debt forgiven.
    h.ok(Op::Pace, &[0, 0]);
    for p in 5..10 {
        assert_eq!(write(&h, p), handled());
    }
    assert_eq!(h.hyp.counters().paced_exits, 1);
}

#[test]
fn a_vcpu_ahead_of_its_pace_owes_its_lead_and_the_counters_show_it() {
    let mut h = logging();
    // 1,000 pages a second: 1 ms a page. The clock stands still here, so
    // each page after the first is a millisecond further ahead.
    h.ok(Op::Pace, &[0, 1000]);
    assert_eq!(write(&h, 1), handled());
    for i in 1..5u64 {
        assert_eq!(
            write(&h, 1 + i),
            AbortOutcome::Paced {
                throttle_ns: 0,
                pace_ns: i * 1_000_000
            }
        );
    }
    h.ok(Op::Counters, &[SHARED_PA, COUNTERS_BYTES]);
    let c = h.hyp.counters();
    assert_eq!(
        (c.paced_exits, c.paced_pages, c.pace_ns),
        (4, 4, 10_000_000)
    );
    // The words COUNTERS wrote end with the brakes' four.
    let words: Vec<u64> = (10..14).map(|i| h.shared_word(i * 8)).collect();
    assert_eq!(words, [4, 4, 0, 10_000_000]);
    // An abort the engine leaves to the host is not paced.
    let mmio = h.hyp.handle_abort(0, &dabt(0x1000_0000, true, false));
    assert!(matches!(mmio, AbortOutcome::Refused(_)), "{mmio:?}");
}
