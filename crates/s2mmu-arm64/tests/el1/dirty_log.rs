//! Dirty logging of a running guest on the arm64 model, every pass checked
//! against the guest's own record: 0 missing, 0 extra.

use crate::common;

use s2mmu::mmu::{DirtyMode, HugePageRecovery, MmuPolicy, Protect};
use s2mmu_arm64::vm::VmConfig;
use s2mmu_arm64::workload::{run_dirty_log, DirtyConfig, DirtyReport, Pattern};

fn run(vcpus: usize, policy: MmuPolicy, cfg: DirtyConfig) -> DirtyReport {
    run_on(
        vcpus,
        VmConfig {
            policy,
            ..VmConfig::default()
        },
        cfg,
    )
}

fn run_on(vcpus: usize, vm_cfg: VmConfig, cfg: DirtyConfig) -> DirtyReport {
    let (_one, vm) = common::dirty_log_vm(vcpus, &cfg, &vm_cfg);
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
    r
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
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn write_protect_bitmap_1_2_4_vcpus() {
    for vcpus in [1, 2, 4] {
        let r = run(vcpus, MmuPolicy::default(), small());
        assert_exact(&r);
        assert!(r.faults.fast > 0, "the read-lock fast path ran");
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn random_pattern_and_write_lock_baseline() {
    let cfg = DirtyConfig {
        pattern: Pattern::Random { writes: 700 },
        ..small()
    };
    let r = run(2, MmuPolicy::default(), cfg);
    assert_exact(&r);
    let written: Vec<u64> = r.passes.iter().filter_map(|p| p.written).collect();
    assert!(
        written.iter().all(|&w| w < 2048),
        "random passes skip pages: {written:?}"
    );
    let policy = MmuPolicy {
        fault_path: s2mmu::mmu::FaultPath::WriteLock,
        ..MmuPolicy::default()
    };
    let r = run(2, policy, cfg);
    assert_exact(&r);
    assert_eq!(
        r.faults.fast, 0,
        "the baseline takes every fault under the write lock"
    );
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn get_without_manual_protect() {
    let policy = MmuPolicy {
        dirty: DirtyMode::Bitmap {
            protect: Protect::OnGet,
        },
        ..MmuPolicy::default()
    };
    let r = run(2, policy, small());
    assert_exact(&r);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn dirty_rings_1_2_4_vcpus() {
    let policy = MmuPolicy {
        dirty: DirtyMode::Ring { entries: 2048 },
        ..MmuPolicy::default()
    };
    for vcpus in [1, 2, 4] {
        let r = run(vcpus, policy, small());
        assert_exact(&r);
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn split_on_fault_of_2m_blocks() {
    let policy = MmuPolicy {
        eager_split_chunk: None,
        ..MmuPolicy::default()
    };
    let cfg = DirtyConfig {
        host_page: 2 << 20,
        verify_tags: true,
        ..small()
    };
    for vcpus in [1, 2, 4] {
        let r = run(vcpus, policy, cfg);
        assert_exact(&r);
        assert_eq!(
            r.faults.splits_on_fault,
            2 * vcpus as u64,
            "each 2 MiB block split once"
        );
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn eager_split_racing_the_guest_keeps_translations_whole() {
    // Logging (and so the eager split of every 2 MiB block, break before
    // make) starts while the vCPUs write and check every page's tag.
    let cfg = DirtyConfig {
        host_page: 2 << 20,
        verify_tags: true,
        enable_during_pass: true,
        iterations: 4,
        ..small()
    };
    for vcpus in [1, 2, 4] {
        let r = run(vcpus, MmuPolicy::default(), cfg);
        assert_exact(&r);
        assert_eq!(
            r.faults.splits_on_fault, 0,
            "eager split left no block to split on fault"
        );
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_dropped_invalidation_loses_writes() {
    // The proof that QEMU's TLB judges the engine's invalidations: drop the
    // maintenance of one harvest (write protection still happens in the
    // table) and the next pass's write through the stale writable entry
    // never faults, so the log misses it. One page per vCPU: the local
    // invalidation each permission fault's answer carries (VMALLE1) empties
    // the CPU's TLB, so only the pages written after a pass's last fault
    // can still be cached when the harvest drops its flush.
    let base = DirtyConfig {
        bytes_per_vcpu: 4096,
        iterations: 3,
        ..small()
    };
    let cfg = DirtyConfig {
        drop_invalidations_after: Some(1),
        ..base
    };
    let r = run(2, MmuPolicy::default(), cfg);
    assert!(r.tlbi.dropped > 0, "the injection dropped something");
    let p2 = &r.passes[1];
    assert_eq!(p2.written, Some(2));
    assert_eq!(p2.missing, 2, "pass 2's writes must be lost: {p2:?}");
    eprintln!(
        "dropped {} sequences: pass 2 missed {} of {:?} pages",
        r.tlbi.dropped, p2.missing, p2.written
    );
    // Nothing was logged, so the next harvest protects (and flushes)
    // nothing: the stale entry keeps losing writes, as on hardware.
    assert_eq!(r.passes[2].missing, 2);
    // Without the injection the same run is exact.
    let r = run(2, MmuPolicy::default(), base);
    assert_exact(&r);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_page_logged_but_not_written_is_extra() {
    // The check's other half: random writes leave pages unwritten, and a
    // page the host marks dirty though the guest did not write it in that
    // pass is counted extra. Without the injection the same run is exact.
    let policy = MmuPolicy::default();
    let base = DirtyConfig {
        pattern: Pattern::Random { writes: 1024 },
        ..small()
    };
    let cfg = DirtyConfig {
        log_unwritten_after: Some(2),
        ..base
    };
    let r = run(1, policy, cfg);
    let p2 = &r.passes[1];
    assert!(
        p2.written.is_some_and(|w| w < 1024),
        "pages left unwritten: {p2:?}"
    );
    assert_eq!((p2.missing, p2.extra), (0, 1), "{p2:?}");
    assert_eq!((r.passes[0].missing, r.passes[0].extra), (0, 0));
    let r = run(1, policy, base);
    assert_exact(&r);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn hardware_dirty_state_logs_without_faults() {
    // FEAT_HAFDBS at stage 2: logged pages are writable-clean (DBM set,
    // write permission clear) and QEMU's walker sets the write permission
    // on the first write instead of raising a permission fault; GET scans
    // the leaves, CLEAR cleans them. If the model did not implement DBM at
    // stage 2, every first write would fault and this test would fail on
    // the fault count while the logs stayed exact.
    let policy = MmuPolicy {
        dirty: DirtyMode::HW,
        ..MmuPolicy::default()
    };
    for vcpus in [1, 2, 4] {
        let r = run(vcpus, policy, small());
        assert_exact(&r);
        assert_eq!(
            r.faults.permission, 0,
            "no write faulted: the hardware logged them"
        );
        assert_eq!(
            r.faults.translation,
            1024 * vcpus as u64,
            "only the populate pass faulted"
        );
    }
    // Random pages, 2 MiB backing split when logging starts.
    let cfg = DirtyConfig {
        host_page: 2 << 20,
        pattern: Pattern::Random { writes: 500 },
        ..small()
    };
    let r = run(2, policy, cfg);
    assert_exact(&r);
    assert_eq!(r.faults.permission, 0);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn pages_remapped_while_the_guest_writes_stay_coherent() {
    // The host moves pages (MMU notifier: unmap with break-before-make and
    // broadcast invalidation, copy, switch, poison the old page) while the
    // vCPUs write random pages, several times each per pass, checking each
    // page's tag before every write: a translation that still reached an
    // old page would read poison, and a write through it would be lost.
    let pages = 1024;
    let cfg = DirtyConfig {
        verify_tags: true,
        remaps_per_pass: 64,
        iterations: 3,
        pattern: Pattern::Random { writes: 4 * pages },
        ..small()
    };
    let hw = MmuPolicy {
        dirty: DirtyMode::HW,
        ..MmuPolicy::default()
    };
    for (vcpus, policy) in [
        (1, MmuPolicy::default()),
        (2, MmuPolicy::default()),
        (2, hw),
    ] {
        let r = run(vcpus, policy, cfg);
        assert_exact(&r);
        assert!(r.remaps > 0);
        eprintln!("{} remaps", r.remaps);
    }
    // With 2 MiB blocks: each remap breaks a whole block.
    let cfg = DirtyConfig {
        host_page: 2 << 20,
        ..cfg
    };
    let r = run(2, MmuPolicy::default(), cfg);
    assert_exact(&r);
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn granules_16k_and_64k() {
    use s2mmu::format::arm64::Granule;
    for (granule, bits) in [(Granule::K16, 40), (Granule::K64, 42)] {
        for (host_page, hw_dirty) in [(0, false), (32 << 20, false), (0, true)] {
            let page = 1u64 << granule.shift();
            let dirty = if hw_dirty {
                DirtyMode::HW
            } else {
                DirtyMode::WP
            };
            let policy = MmuPolicy {
                dirty,
                ..MmuPolicy::default()
            };
            let vm_cfg = VmConfig {
                granule,
                ipa_bits: bits,
                policy,
                ..VmConfig::default()
            };
            let cfg = DirtyConfig {
                bytes_per_vcpu: 32 << 20,
                host_page: host_page.max(page),
                verify_tags: true,
                ..small()
            };
            let r = run_on(2, vm_cfg, cfg);
            assert_exact(&r);
            eprintln!(
                "{granule:?} host page {:#x} hw {hw_dirty}: ok",
                cfg.host_page
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn huge_pages_collapse_back_in_place_under_a_running_guest() {
    // Logging stops while the vCPUs write and check every page's tag: the
    // engine collapses the split 2 MiB blocks back in place (break, one
    // whole-VMID TLBI, make) and QEMU must never see a torn or stale
    // translation; every stamp of the last pass lands in its own page.
    let policy = MmuPolicy {
        huge_page_recovery: HugePageRecovery::Collapse,
        ..MmuPolicy::default()
    };
    let cfg = DirtyConfig {
        host_page: 2 << 20,
        verify_tags: true,
        passes_after_logging: 3,
        ..small()
    };
    for vcpus in [1, 2] {
        let r = run(vcpus, policy, cfg);
        assert_exact(&r);
        let (written, pages) = r.after_logging.expect("passes after logging ran");
        assert_eq!(written, pages, "every page holds the last pass's stamp");
        assert_eq!(r.faults.splits_on_fault, 0);
        assert_eq!(
            r.collapsed,
            2 * vcpus as u64,
            "each 2 MiB block came back in place"
        );
    }
}
