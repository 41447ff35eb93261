//! The writes a workload made between two paused states, recomputed by
//! `replay_writes`, turn a copy of memory at the first state into memory
//! at the second (what post-copy's verification relies on); states the
//! vCPU cannot reach are refused.

use s2mmu_vm::{replay_writes, Pattern, VcpuState, Vm, VmConfig, Workload, WorkloadConfig};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

mod common;
use common::wait_for_writes;

const PAGE: u64 = 4096;
const MEM: u64 = 4 << 20;

fn cfg(pattern: Pattern, write_percent: u32) -> WorkloadConfig {
    WorkloadConfig {
        bytes_per_vcpu: 2 << 20,
        write_percent,
        pattern,
        page_size: PAGE,
    }
}

fn words(vm: &Vm) -> Vec<u64> {
    (0..MEM / 8)
        .map(|w| vm.memory().read_u64(w * 8).unwrap())
        .collect()
}

/// Runs, pauses (state A, memory copied), runs on for `more`, pauses
/// (state B); the replay from A to B applied to the copy must give the
/// memory at B.
fn replay_matches(pattern: Pattern, write_percent: u32, pace: u64, more: Duration) {
    let vm = Arc::new(
        Vm::new(VmConfig {
            mem_size: MEM,
            ..VmConfig::default()
        })
        .unwrap(),
    );
    let c = cfg(pattern, write_percent);
    let w = Workload::start(vm.clone(), 2, c).unwrap();
    w.run_pass(|| {}).unwrap();
    w.control()
        .pace_pages_per_sec
        .store(pace, Ordering::Relaxed);
    w.run_free();
    std::thread::sleep(Duration::from_millis(30));
    w.pause();
    let a = w.vcpu_states();
    let mut copy = words(&vm);
    let at_a = w.control().live_writes();
    w.resume();
    std::thread::sleep(more);
    wait_for_writes(&w, &at_a);
    w.pause();
    let b = w.vcpu_states();
    let mut last: HashMap<u64, u64> = HashMap::new();
    let gpa_base = vm.config().gpa_base;
    let mut total = 0;
    for v in 0..2 {
        total += replay_writes(
            &c,
            v,
            gpa_base + v as u64 * c.bytes_per_vcpu,
            a[v],
            b[v],
            1 << 30,
            |gpa, value| {
                last.insert(gpa, value);
            },
        )
        .unwrap();
    }
    assert_eq!(
        total,
        b.iter()
            .zip(&a)
            .map(|(b, a)| b.writes - a.writes)
            .sum::<u64>()
    );
    assert!(total > 0, "the guest wrote between the states");
    for (gpa, value) in last {
        copy[((gpa - gpa_base) / 8) as usize] = value;
    }
    assert!(
        copy == words(&vm),
        "replayed memory differs ({pattern:?}, {write_percent}%)"
    );
    // A state the vCPU cannot reach from A: the replay refuses it.
    let mut wrong = b[0];
    wrong.rng ^= 1;
    wrong.writes += 1;
    assert!(replay_writes(&c, 0, gpa_base, a[0], wrong, 1 << 30, |_, _| {}).is_err());
    assert!(
        replay_writes(&c, 0, gpa_base, b[0], a[0], 1 << 30, |_, _| {}).is_err() || a[0] == b[0]
    );
}

#[test]
fn sequential_writes_replay_exactly_even_over_many_passes() {
    // Unpaced: many passes between the states (the fast-forward).
    replay_matches(Pattern::Sequential, 100, 0, Duration::from_millis(100));
}

#[test]
fn random_mixed_accesses_replay_exactly() {
    replay_matches(Pattern::Random, 60, 20_000, Duration::from_millis(60));
}

#[test]
fn too_many_accesses_are_refused() {
    let c = cfg(Pattern::Random, 100);
    let from = VcpuState {
        pass: 1,
        next_page: 0,
        rng: 7,
        writes: 0,
    };
    let to = VcpuState {
        pass: 1_000_000,
        ..from
    };
    let e = replay_writes(&c, 0, 0, from, to, 1 << 20, |_, _| {}).unwrap_err();
    assert!(e.contains("more than"), "{e}");
}
