//! Dirty logging under a running Linux: while the guest's dirtier writes
//! anonymous memory and tmpfs files on every vCPU, the host harvests every
//! 100 ms and checks every guest page's content against the logs. A
//! changed page in no log is a lost page; the dirtier checks its own data.

mod common;

use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::dirty::{HarvestConfig, LinuxDirty};
use s2mmu_arm64::linux::vm::{self, LinuxConfig, LinuxReport, StopReason};
use std::time::Duration;

fn assets() -> Option<assets::LinuxAssets> {
    if common::machine_unavailable() {
        return None;
    }
    match assets::ensure(&AssetOptions::from_env()) {
        Ok(a) => Some(a),
        Err(e) => {
            assert!(
                std::env::var_os("S2MMU_REQUIRE_ARM64").is_none(),
                "S2MMU_REQUIRE_ARM64 is set but the Linux assets are missing: {e}"
            );
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn run(mode: LinuxDirty, secs: u32, drop_from: Option<u64>) -> Option<LinuxReport> {
    let _one = common::serial();
    let a = assets()?;
    let r = vm::run(&LinuxConfig {
        vcpus: 2,
        mem: 256 << 20,
        kernel: a.image,
        initrd: a.initramfs,
        cmdline: format!("quiet s2mmu.run=dirtier s2mmu.args=mem=48,file=8,secs={secs}"),
        echo: std::env::var_os("S2MMU_LINUX_ECHO").is_some(),
        timeout: Duration::from_secs(240),
        dirty: HarvestConfig {
            mode,
            period: Duration::from_millis(100),
            drop_invalidations_from: drop_from,
        },
    })
    .expect("the Linux VM runs");
    eprintln!(
        "{mode:?}: init after {:?} s, {:.1} s in all ({:?}); exits {:?}; dirty {:?}",
        r.init_s, r.total_s, r.reason, r.exits, r.dirty
    );
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    Some(r)
}

fn no_page_lost(mode: LinuxDirty) {
    let Some(r) = run(mode, 20, None) else { return };
    let d = r.dirty.expect("the harvester ran");
    assert!(
        r.console.contains("s2mmu-dirtier: ok"),
        "the guest's own check; console:\n{}",
        r.console
    );
    assert!(d.harvests >= 50, "{} harvests", d.harvests);
    assert!(d.changed > 1000, "the guest changed {} pages", d.changed);
    assert_eq!(d.lost, 0, "lost pages: {:x?}", d.lost_examples);
}

#[test]
fn linux_write_protect_logging_loses_no_page() {
    no_page_lost(LinuxDirty::Wp);
}

#[test]
fn linux_manual_protect_logging_loses_no_page() {
    no_page_lost(LinuxDirty::Manual);
}

#[test]
fn linux_ring_logging_loses_no_page() {
    no_page_lost(LinuxDirty::Ring);
}

#[test]
fn linux_hardware_dirty_logging_loses_no_page() {
    no_page_lost(LinuxDirty::Hw);
}

/// The check can fail: with the harvests' invalidations dropped, QEMU's
/// TLB keeps writable translations and the guest's writes go unlogged.
#[test]
fn dropped_harvest_invalidations_show_as_lost_pages() {
    let Some(r) = run(LinuxDirty::Wp, 8, Some(5)) else {
        return;
    };
    let d = r.dirty.expect("the harvester ran");
    assert!(d.lost > 0, "no lost page reported: {d:?}");
}
