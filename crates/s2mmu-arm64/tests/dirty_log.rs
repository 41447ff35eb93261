//! Dirty logging of a running guest on the arm64 model, every pass checked
//! against the guest's own record: 0 missing, 0 extra.

mod common;

use s2mmu::mmu::MmuPolicy;
use s2mmu_arm64::vm::{Arm64Vm, VmConfig};
use s2mmu_arm64::workload::{run_dirty_log, DirtyConfig, DirtyReport, Harvest, Pattern};

fn run(vcpus: usize, policy: MmuPolicy, cfg: DirtyConfig) -> Option<DirtyReport> {
    let _one = common::serial();
    let m = common::machine(vcpus + 1, cfg.bytes_per_vcpu * vcpus as u64)?;
    let vm = Arm64Vm::new(
        m,
        &VmConfig {
            policy,
            ..VmConfig::default()
        },
    )
    .unwrap();
    let r = run_dirty_log(&vm, &DirtyConfig { vcpus, ..cfg }).unwrap();
    for p in &r.passes {
        eprintln!(
            "vcpus {vcpus} it {}: logged {} written {:?} missing {} extra {} ({:?})",
            p.iteration, p.logged, p.written, p.missing, p.extra, p.dirty_time
        );
    }
    eprintln!(
        "faults: {:?}; round trip {:.1} us (host {:.1} us, engine {:.1} us); tlbi {:?}",
        r.faults,
        r.round_trip_us(),
        r.host_us(),
        r.engine_us(),
        r.tlbi
    );
    Some(r)
}

fn assert_exact(r: &DirtyReport) {
    assert!(
        r.bad_tags.is_empty(),
        "torn or stale translations: {:?}",
        r.bad_tags
    );
    for p in &r.passes {
        if let Some(w) = p.written {
            assert!(
                w > 0,
                "iteration {} wrote nothing: the check would be empty",
                p.iteration
            );
            assert_eq!((p.missing, p.extra), (0, 0), "iteration {}", p.iteration);
        }
    }
    assert!(
        r.passes.iter().any(|p| p.written.is_some()),
        "no pass was checked"
    );
}

fn small() -> DirtyConfig {
    DirtyConfig {
        bytes_per_vcpu: 4 << 20,
        iterations: 3,
        ..DirtyConfig::default()
    }
}

#[test]
fn write_protect_bitmap_1_2_4_vcpus() {
    for vcpus in [1, 2, 4] {
        let Some(r) = run(vcpus, MmuPolicy::default(), small()) else {
            return;
        };
        assert_exact(&r);
        assert!(r.faults.fast > 0, "the read-lock fast path ran");
    }
}
