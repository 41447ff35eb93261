//! A paused workload's vCPU states resume it on another VM, where it goes
//! on exactly where it stopped (what a migration relies on).

use s2mmu_vm::{stamp, Pattern, VcpuState, Vm, VmConfig, Workload, WorkloadConfig};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod common;
use common::wait_for_writes;

const PAGE: u64 = 4096;

fn vm() -> Arc<Vm> {
    Arc::new(
        Vm::new(VmConfig {
            mem_size: 4 << 20,
            ..VmConfig::default()
        })
        .unwrap(),
    )
}

fn cfg() -> WorkloadConfig {
    WorkloadConfig {
        bytes_per_vcpu: 2 << 20,
        write_percent: 100,
        pattern: Pattern::Sequential,
        page_size: PAGE,
    }
}

#[test]
fn states_resume_the_workload_where_it_stopped() {
    let src = vm();
    let w = Workload::start(src.clone(), 2, cfg()).unwrap();
    w.run_pass(|| {}).unwrap();
    // Paced so that the pause lands mid-pass.
    w.control()
        .pace_pages_per_sec
        .store(2000, Ordering::Relaxed);
    let before = w.control().live_writes();
    w.run_free();
    wait_for_writes(&w, &before);
    w.pause();
    let states = w.vcpu_states();
    // Pass 2 or later: a loaded machine may leave the vCPUs running past
    // a pass's 256 ms before the pause.
    assert!(states.iter().all(|s| s.pass >= 2), "{states:?}");
    assert!(states.iter().any(|s| s.next_page > 0));

    // Copy the memory, as a migration would, and resume elsewhere.
    let dst = vm();
    let mut page = vec![0u8; PAGE as usize];
    for off in (0..4u64 << 20).step_by(PAGE as usize) {
        assert!(src.memory().read_into(off, &mut page));
        assert!(dst.memory().write_from(off, &page));
    }
    let r = Workload::start_at(dst.clone(), cfg(), &states).unwrap();
    r.control()
        .pace_pages_per_sec
        .store(2000, Ordering::Relaxed);
    let before = r.control().live_writes();
    r.run_free();
    wait_for_writes(&r, &before);
    r.pause();
    let after = r.vcpu_states();
    for (i, (a, b)) in states.iter().zip(&after).enumerate() {
        assert!(
            (b.pass, b.next_page) > (a.pass, a.next_page),
            "vCPU {i} ran"
        );
        assert!(b.writes > a.writes);
        // The pages it wrote after the resume carry the pass it was in.
        let base = i as u64 * (2 << 20);
        let end = if b.pass == a.pass { b.next_page } else { 512 };
        for p in a.next_page..end {
            let v = dst.memory().read_u64(base + p * PAGE).unwrap();
            assert_eq!(v, stamp(i, a.pass, p), "vCPU {i} page {p}");
        }
        // The source's memory past the pause point is untouched by it.
        if a.next_page < 512 {
            let v = src.memory().read_u64(base + a.next_page * PAGE).unwrap();
            assert_eq!(v, stamp(i, a.pass - 1, a.next_page));
        }
    }
}

#[test]
fn states_that_do_not_fit_are_refused() {
    let bad = [VcpuState {
        pass: 1,
        next_page: 10_000,
        rng: 1,
        writes: 0,
    }];
    assert!(Workload::start_at(vm(), cfg(), &bad).is_err());
    let zero = [VcpuState::default()];
    assert!(Workload::start_at(vm(), cfg(), &zero).is_err());
}
