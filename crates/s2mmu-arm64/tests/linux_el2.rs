//! Debian's arm64 Linux with the engine at EL2 (`Engine::El2`): the stub
//! links the engine, which answers every stage-2 abort on guest RAM on
//! the faulting CPU; only MMIO and the like exit to the host. `/init`
//! counts every vCPU online, and the guest powers off. Under dirty
//! logging (the write-protection faults marked at EL2, the host harvesting
//! through EL2's commands; under `hw` the CPU's dirty state) every guest
//! page's content is checked against the logs, as for the host placement
//! (`linux_dirty.rs`).

mod common;

use s2mmu::mmu::DirtyMode;
use s2mmu_arm64::linux::dirty::{self, HarvestConfig};
use s2mmu_arm64::linux::vm::{self, Engine, LinuxConfig, LinuxReport, StopReason};
use std::time::Duration;

fn run(vcpus: usize, dirty: HarvestConfig, cmdline: &str) -> Option<LinuxReport> {
    let a = common::linux_assets()?;
    let r = vm::run(&LinuxConfig {
        vcpus,
        mem: 256 << 20,
        kernel: a.image,
        initrd: a.initramfs,
        cmdline: cmdline.into(),
        echo: std::env::var_os("S2MMU_LINUX_ECHO").is_some(),
        timeout: Duration::from_secs(600),
        dirty,
        ram_pages: Default::default(),
        engine: Engine::El2,
    })
    .expect("the Linux VM runs with the engine at EL2");
    eprintln!(
        "init after {:?} s, stopped after {:.1} s ({:?}); exits {:?}; EL2 faults {} ({} ns); log {:?}",
        r.init_s, r.total_s, r.reason, r.exits, r.el2_faults, r.el2_fault_ns, r.log
    );
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    assert_eq!(
        r.cpus_online,
        Some(vcpus as u32),
        "init's CPU count; console:\n{}",
        r.console
    );
    // Every RAM fault was answered at EL2: none reached the host.
    assert!(r.el2_faults > 0, "RAM came through EL2's fault path");
    assert_eq!(r.exits[0], 0, "stage-2 faults answered by the host");
    assert!(
        r.exits[1] > 0,
        "the UART and the GIC still exit to the host"
    );
    Some(r)
}

fn boot(vcpus: usize) {
    let _one = common::serial();
    run(vcpus, HarvestConfig::default(), "quiet");
}

#[test]
#[cfg_attr(
    not(all(s2mmu_linux_runnable, s2mmu_el2_linux)),
    ignore = "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
)]
fn linux_boots_to_init_on_one_vcpu_with_the_engine_at_el2() {
    boot(1);
}

#[test]
#[cfg_attr(
    not(all(s2mmu_linux_runnable, s2mmu_el2_linux)),
    ignore = "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
)]
fn linux_boots_to_init_on_two_vcpus_with_the_engine_at_el2() {
    boot(2);
}

#[test]
#[cfg_attr(
    not(all(s2mmu_linux_runnable, s2mmu_el2_linux)),
    ignore = "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
)]
fn linux_boots_to_init_on_four_vcpus_with_the_engine_at_el2() {
    boot(4);
}

fn no_page_lost(mode: DirtyMode) {
    let _one = common::serial();
    let cfg = HarvestConfig {
        mode: Some(mode),
        period: Duration::from_millis(50),
        drop_invalidations_from: None,
        discard_log: None,
        change: Default::default(),
        cut_after: None,
    };
    let cmdline = "quiet s2mmu.run=dirtier s2mmu.args=mem=48,file=8,secs=20";
    let Some(r) = run(2, cfg, cmdline) else {
        return;
    };
    let d = r.dirty.expect("the harvester ran");
    assert!(
        r.console.contains("s2mmu-dirtier: ok"),
        "the guest's own check; console:\n{}",
        r.console
    );
    assert!(d.harvests >= 20, "{} harvests", d.harvests);
    assert!(d.changed > 1000, "the guest changed {} pages", d.changed);
    assert_eq!(d.lost, 0, "lost pages: {:x?}", d.lost_examples);
    let c = r
        .el2_counters
        .expect("EL2's counters")
        .expect("EL2 answers COUNTERS");
    if mode.hardware() {
        // The CPU sets the dirty state (DBM): EL2's GET reads the leaves.
        assert!(d.logged > 0, "{d:?}");
    } else {
        // The dirty marks were made at EL2: its write-protection faults.
        assert!(c.permission > 0 && c.dirtied > 0, "{c:?}");
    }
}

#[test]
#[cfg_attr(
    not(all(s2mmu_linux_runnable, s2mmu_el2_linux)),
    ignore = "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
)]
fn hardware_dirty_logging_at_el2_loses_no_page() {
    no_page_lost(dirty::HW);
}

#[test]
#[cfg_attr(
    not(all(s2mmu_linux_runnable, s2mmu_el2_linux)),
    ignore = "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
)]
fn write_protect_logging_at_el2_loses_no_page() {
    no_page_lost(dirty::WP);
}

#[test]
#[cfg_attr(
    not(all(s2mmu_linux_runnable, s2mmu_el2_linux)),
    ignore = "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
)]
fn manual_protect_logging_at_el2_loses_no_page() {
    no_page_lost(dirty::MANUAL);
}

#[test]
#[cfg_attr(
    not(all(s2mmu_linux_runnable, s2mmu_el2_linux)),
    ignore = "needs the Linux guest (scripts/setup.sh) and the aarch64-unknown-none target (rustup target add aarch64-unknown-none)"
)]
fn ring_logging_at_el2_loses_no_page() {
    no_page_lost(dirty::RING);
}
