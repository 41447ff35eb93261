//! EL2's dispatcher from several threads at once, as several CPUs use it:
//! four vCPUs answer write-protection aborts on their own pages while the
//! host harvests (GET, CLEAR) and moves another slot. Nothing deadlocks,
//! every page written is harvested, and the table's entry counts hold.

mod common;

use common::*;
use s2mmu_el2::abi::{LogMode, Op};
use s2mmu_el2::AbortOutcome;
use std::sync::atomic::{AtomicBool, Ordering};

const IPA: u64 = 0x8000_0000;
const PAGES: u64 = 1024;
const VCPUS: u64 = 4;
const ROUNDS: u64 = 100;

#[test]
fn vcpus_fault_while_the_host_harvests() {
    let mut h = Host::new();
    h.ok(Op::VmInit, &[LogMode::Manual as u64, 0, VCPUS]);
    h.ok(Op::MemslotSet, &S0);
    h.ok(
        Op::MemslotSet,
        &[1, 0, 0x1_0000_0000, 0x1000, 0x4800_0000, 4096],
    );
    for p in 0..PAGES {
        let out = h.hyp.handle_abort(0, &dabt(IPA + p * 4096, true, false));
        assert_eq!(out, AbortOutcome::Handled { permission: false });
    }
    h.ok(Op::LogSet, &[0, 1, LogMode::Manual as u64]);
    let done = AtomicBool::new(false);
    let mut harvested = vec![0u64; (PAGES / 64) as usize];
    let hyp = &h.hyp;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..VCPUS)
            .map(|v| {
                s.spawn(move || {
                    for _ in 0..ROUNDS {
                        for p in (v..PAGES).step_by(VCPUS as usize) {
                            let out =
                                hyp.handle_abort(v as usize, &dabt(IPA + p * 4096, true, true));
                            assert!(matches!(out, AbortOutcome::Handled { .. }), "{out:?}");
                        }
                    }
                })
            })
            .collect();
        let host = s.spawn(|| {
            let mut moves = 0u64;
            // At least one harvest and move, however fast the vCPUs are.
            loop {
                let last = done.load(Ordering::Acquire);
                harvest(hyp, &mut harvested);
                let ipa = 0x1_0000_0000 + ((moves + 1) % 2) * 0x10_0000;
                call(hyp, Op::MemslotSet, &[1, 0, ipa, 0x1000, 0x4800_0000, 4096]);
                moves += 1;
                if last {
                    break;
                }
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Release);
        host.join().unwrap();
    });
    assert!(
        harvested.iter().all(|w| *w == u64::MAX),
        "every page written was harvested"
    );
    let c = h.hyp.counters();
    assert_eq!(c.aborts_handled, PAGES + VCPUS * ROUNDS * PAGES / VCPUS);
    let counts = h.hyp.with_mmu(|m| m.with_table(|pt| pt.check_counts()));
    assert!(matches!(counts, Some(Ok(_))), "{counts:?}");
}

/// Sends `op` through a command block from any thread; its results.
fn call(hyp: &s2mmu_el2::Hyp, op: Op, args: &[u64]) -> [u64; 4] {
    let mut c = s2mmu_el2::Command::new(op, args);
    hyp.dispatch(&mut c);
    assert_eq!(c.status, 0, "{op:?} refused");
    c.ret
}

/// GET into the shared area (its first 128 bytes), OR into `acc`, CLEAR.
fn harvest(hyp: &s2mmu_el2::Hyp, acc: &mut [u64]) {
    call(hyp, Op::GetDirty, &[0, SHARED_PA, 128]);
    let base = hyp.layout().shared_va;
    for (k, a) in acc.iter_mut().enumerate() {
        // SAFETY: the shared area is the test's leaked buffer; 128 bytes
        // from its start were just written by GET.
        *a |= unsafe { (base.add(8 * k) as *const u64).read_volatile() };
    }
    call(hyp, Op::ClearDirty, &[0, 0, PAGES, SHARED_PA, 128]);
}
