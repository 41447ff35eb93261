//! The stage-2 changes a host makes under a running Linux while the
//! guest's dirtier writes and checks its data on 2 vCPUs and the host
//! harvests (write protection, every 100 ms) and hashes every page: pages
//! moved by the MMU notifier, and logging stopped (blocks collapsed back in
//! place) and started again. The dirtier's own check must pass and no page
//! may be lost.

mod common;

use s2mmu_arm64::linux::assets::{self, AssetOptions};
use s2mmu_arm64::linux::changes::HostChange;
use s2mmu_arm64::linux::dirty::{HarvestConfig, HarvestReport, LinuxDirty};
use s2mmu_arm64::linux::vm::{self, LinuxConfig, StopReason};
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

/// Runs the dirtier for 10 s under `change` and returns the harvester's
/// report once the guest's check passed and nothing was lost.
fn run(mode: LinuxDirty, change: HostChange) -> Option<HarvestReport> {
    let _one = common::serial();
    let a = assets()?;
    let r = vm::run(&LinuxConfig {
        vcpus: 2,
        mem: 256 << 20,
        kernel: a.image,
        initrd: a.initramfs,
        cmdline: "quiet s2mmu.run=dirtier s2mmu.args=mem=48,file=8,secs=10".into(),
        echo: std::env::var_os("S2MMU_LINUX_ECHO").is_some(),
        timeout: Duration::from_secs(240),
        dirty: HarvestConfig {
            mode,
            period: Duration::from_millis(100),
            drop_invalidations_from: None,
            discard_log: None,
            change,
        },
    })
    .expect("the Linux VM runs");
    let d = r.dirty.clone().expect("the harvester ran");
    eprintln!("{mode:?} {change:?}: {:.1} s; dirty {d:?}", r.total_s);
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    assert!(
        r.console.contains("s2mmu-dirtier: ok"),
        "the guest's own check; console:\n{}",
        r.console
    );
    assert!(d.changed > 1000, "the guest changed {} pages", d.changed);
    assert_eq!(d.lost, 0, "lost pages: {:x?}", d.lost_examples);
    Some(d)
}

/// The MMU notifier moves 32 of the pages each harvest logged (the
/// dirtier's, mostly) to other host pages and poisons the old ones: a
/// stale translation would make the dirtier read poison, a dropped dirty
/// mark would show as a lost page.
#[test]
fn linux_pages_remapped_under_the_dirtier() {
    for mode in [LinuxDirty::Wp, LinuxDirty::Hw] {
        let Some(d) = run(mode, HostChange::Remap { pages: 32 }) else {
            return;
        };
        assert!(d.remapped >= 100, "{} pages remapped", d.remapped);
    }
}

/// Logging stops after the 5th harvest: the engine collapses the split
/// blocks back in place (no fault to get them back); 5 periods later it
/// starts again (split again) and the check goes on.
#[test]
fn linux_blocks_collapsed_in_place_when_logging_stops() {
    let Some(d) = run(LinuxDirty::Wp, HostChange::Collapse { at: 5, after: 5 }) else {
        return;
    };
    assert_eq!(d.pauses, 1);
    assert!(d.collapsed > 0, "no block collapsed: {d:?}");
    assert!(d.harvests > 10, "{} harvests", d.harvests);
}
