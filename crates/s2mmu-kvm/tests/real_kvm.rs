//! Tests that run guests on the host's real KVM. Where the build found no usable
//! /dev/kvm they are ignored with that reason (`build.rs`); where it opens but cannot run
//! this crate's CPL-3 guests, each one fails with the reason. They assert counts and
//! contents, never timings.

use s2mmu_kvm::dirty_log_check::check_dirty_log;
use s2mmu_kvm::dirty_log_perf::{self, DirtyLogParams};
use s2mmu_kvm::memslot_perf::kvm_memslot_ops_with;
use s2mmu_kvm::{Backing, Error};

/// Fails the test, with the reason, where /dev/kvm opened at build time
/// but cannot run this crate's guests (where it does not open, the tests
/// are ignored by their cfg).
fn require_kvm() {
    if let Some(reason) = s2mmu_kvm::kvm_unusable_reason() {
        panic!("the build opened /dev/kvm but KVM cannot run this crate's guests: {reason}");
    }
}

fn small(manual_protect: bool) -> DirtyLogParams {
    DirtyLogParams {
        vcpus: 1,
        bytes_per_vcpu: 16 << 20,
        iterations: 3,
        manual_protect,
        ..Default::default()
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn one_write_fault_per_page_after_write_protection() {
    require_kvm();
    for manual_protect in [true, false] {
        let report = dirty_log_perf::run(&small(manual_protect)).unwrap();
        let phases: Vec<String> = report.phases().into_iter().map(|(name, _)| name).collect();
        assert!(
            phases.contains(&"iteration 3 dirty memory".to_string()),
            "{phases:?}"
        );
        assert_eq!(
            phases.contains(&"clear dirty log total".to_string()),
            manual_protect,
            "{phases:?}"
        );
        let pages = 16 << 20 >> 12;
        assert_eq!(report.total_pages, pages);
        assert_eq!(report.populate_exits.userspace_mmio_exits, 1);
        // Iteration 1 is write-protected only without INITIALLY_SET; from iteration 2 on
        // every page was re-protected by GET (legacy) or CLEAR (manual).
        let first_protected = if report.manual_caps & 2 != 0 { 2 } else { 1 };
        for it in &report.iterations {
            assert_eq!(it.pages_written, pages, "{it:?}");
            assert_eq!(it.pages_dirty, pages, "{it:?}");
            assert_eq!(it.exits.userspace_mmio_exits, 1, "{it:?}");
            if it.iteration >= first_protected {
                // The guest runs natively: each first write to a protected page is one fixed
                // fault and one VM exit (an emulated guest would show none). A handful more
                // are tolerated for host-side invalidations (compaction, reclaim) that zap a
                // mapping mid-pass; observed here: exactly `pages`.
                if let (Some(fixed), Some(exits)) = (it.exits.kvm.pf_fixed, it.exits.kvm.exits) {
                    assert!(
                        (pages..=pages + 16).contains(&fixed),
                        "manual={manual_protect} {it:?}"
                    );
                    assert!(exits >= pages, "manual={manual_protect} {it:?}");
                }
            } else if let Some(fixed) = it.exits.kvm.pf_fixed {
                assert_eq!(fixed, 0, "nothing is protected yet: {it:?}");
            }
            assert_eq!(it.clear_dirty_log.is_some(), manual_protect);
        }
        assert!(report
            .selftest_lines()
            .iter()
            .any(|l| l.starts_with("Iteration 2 dirty memory time: ")));
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn dirty_log_reports_exactly_the_written_pages() {
    require_kvm();
    for (manual_protect, write_percent, vcpus, slots) in [
        (true, 50, 2, 4),
        (false, 30, 2, 2),
        (true, 100, 1, 1),
        (true, 0, 1, 2),
    ] {
        let params = DirtyLogParams {
            vcpus,
            bytes_per_vcpu: 8 << 20,
            iterations: 4,
            slots,
            manual_protect,
            write_percent,
            ..Default::default()
        };
        let check = check_dirty_log(&params).unwrap();
        assert_eq!(check.iterations.len(), 4);
        assert!(check.passes(), "{params:?}: {:?}", check.first_failure());
        let later = &check.iterations[1];
        assert_eq!(later.reported, later.written);
        if write_percent == 50 {
            assert!(later.written > 0 && later.written < 2 * 2048, "{later:?}");
        }
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn memslot_ops_at_small_counts() {
    require_kvm();
    let times = kvm_memslot_ops_with(64, (64 << 20) + 4096, 11).unwrap();
    assert_eq!(times.nslots, 64);
    assert_eq!(times.pages_per_slot, 256);
    assert_eq!(times.last_slot_pages, 257);
    assert_eq!(times.repetitions, 11);
    let max = times.max_memslots;
    match kvm_memslot_ops_with(u32::try_from(max).unwrap(), 1 << 30, 1) {
        Err(Error::TooManySlots { requested, max: m }) => {
            assert_eq!(requested, max);
            assert_eq!(m, max);
        }
        other => panic!("expected TooManySlots, got {other:?}"),
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn hugetlb_without_reservation_says_how_to_reserve() {
    require_kvm();
    let free =
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
    let params = DirtyLogParams {
        bytes_per_vcpu: 1 << 30,
        backing: Backing::Hugetlb1G,
        ..Default::default()
    };
    if free != Some(0) {
        // Pages reserved (or no 1 GiB size here): either the run works or
        // it fails for a reason of the host, never of the caller.
        if let Err(e) = dirty_log_perf::run(&params) {
            assert!(e.is_environment(), "{e:?}");
        }
        return;
    }
    match dirty_log_perf::run(&params) {
        Err(e @ Error::HugetlbNotReserved { .. }) => {
            assert!(
                e.to_string().contains("hugepages-1048576kB/nr_hugepages"),
                "{e}"
            );
        }
        other => panic!("expected HugetlbNotReserved, got {other:?}"),
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn thp_backing_runs() {
    require_kvm();
    let params = DirtyLogParams {
        bytes_per_vcpu: 8 << 20,
        backing: Backing::AnonymousThp,
        slots: 2,
        ..Default::default()
    };
    let check = check_dirty_log(&params).unwrap();
    assert!(check.passes(), "{:?}", check.first_failure());
}

#[test]
#[cfg_attr(
    not(s2mmu_kvm_device),
    ignore = "needs /dev/kvm, read-write (see the build warning)"
)]
fn dirty_ring_reports_exactly_the_written_pages() {
    require_kvm();
    for (entries, write_percent, vcpus) in [(1024, 100, 1), (1024, 50, 2), (65536, 100, 1)] {
        let params = DirtyLogParams {
            vcpus,
            bytes_per_vcpu: 16 << 20,
            iterations: 3,
            slots: 2,
            write_percent,
            dirty_ring_entries: Some(entries),
            ..Default::default()
        };
        let check = match check_dirty_log(&params) {
            Err(e @ Error::CapabilityMissing { .. }) => {
                panic!("the host's KVM has no dirty ring (Linux 5.11 or newer has): {e}")
            }
            other => other.unwrap(),
        };
        assert!(check.passes(), "{params:?}: {:?}", check.first_failure());
        // Without INITIALLY_SET, iteration 1 is exact too.
        assert_eq!(check.iterations[0].extra, 0);
        for it in &check.run.iterations {
            assert_eq!(it.pages_written, it.pages_dirty, "{it:?}");
            if entries == 1024 && write_percent == 100 {
                // 4096 pages per vCPU cannot fit a 1024-entry ring: it must fill mid-pass.
                assert!(it.exits.userspace_ring_full_exits >= 3, "{it:?}");
            }
            if entries == 65536 {
                assert_eq!(it.exits.userspace_ring_full_exits, 0, "{it:?}");
            }
        }
    }
}
