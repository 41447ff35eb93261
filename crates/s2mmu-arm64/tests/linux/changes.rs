//! The stage-2 changes a host makes under a running Linux while the
//! guest's dirtier writes and checks its data on 2 vCPUs and the host
//! harvests (write protection, every 100 ms) and hashes every page: pages
//! moved by the MMU notifier, and logging stopped (blocks collapsed back in
//! place) and started again. The dirtier's own check must pass and no page
//! may be lost. The engine on the host (`tests/linux_el2.rs` makes the same
//! changes at EL2, the default).

use crate::common;

use s2mmu::mmu::DirtyMode;
use s2mmu_arm64::linux::changes::{HostChange, FB_IPA, FB_SIZE};
use s2mmu_arm64::linux::dirty::{self, HarvestConfig, HarvestReport};
use s2mmu_arm64::linux::vm::{self, LinuxConfig, StopReason};

/// Runs the dirtier for 10 s on anonymous memory and tmpfs under `change`
/// and returns the harvester's report once the guest's check passed and
/// nothing was lost.
fn run(mode: Option<DirtyMode>, change: HostChange) -> HarvestReport {
    let d = run_args(mode, change, "mem=48,file=8,secs=10", "ok");
    assert!(d.changed > 1000, "the guest changed {} pages", d.changed);
    d
}

/// Runs the dirtier with `args` under `change`; its line
/// `s2mmu-dirtier: {ok}` must show and no page may be lost.
fn run_args(mode: Option<DirtyMode>, change: HostChange, args: &str, ok: &str) -> HarvestReport {
    let harvest = HarvestConfig {
        mode,
        change,
        ..HarvestConfig::default()
    };
    let r = common::run_on_host(args, harvest);
    eprintln!(
        "{mode:?} {change:?}: {:.1} s; dirty {:?}",
        r.total_s, r.dirty
    );
    assert_eq!(r.reason, StopReason::PowerOff, "console:\n{}", r.console);
    common::check_dirtier(&r, ok)
}

s2mmu_arm64::linux_test! {
    /// The MMU notifier moves 32 of the pages each harvest logged (the
    /// dirtier's, mostly) to other host pages and poisons the old ones: a
    /// stale translation would make the dirtier read poison, a dropped dirty
    /// mark would show as a lost page.
    fn linux_pages_remapped_under_the_dirtier() {
        for mode in [Some(dirty::WP_GET), Some(dirty::HW_GET)] {
            let d = run(mode, HostChange::Remap { pages: 32 });
            assert!(d.remapped >= 100, "{} pages remapped", d.remapped);
        }
    }
}

s2mmu_arm64::linux_test! {
    /// Logging stops after the 5th harvest: the engine collapses the split
    /// blocks back in place (no fault to get them back); 5 periods later it
    /// starts again (split again) and the check goes on.
    fn linux_blocks_collapsed_in_place_when_logging_stops() {
        let d = run(Some(dirty::WP_GET), HostChange::Collapse { at: 5, after: 5 });
        assert_eq!(d.pauses, 1);
        assert!(d.collapsed > 0, "no block collapsed: {d:?}");
        assert!(d.harvests > 10, "{} harvests", d.harvests);
    }
}

s2mmu_arm64::linux_test! {
    /// A logged memslot outside RAM moves: the dirtier writes and checks a
    /// framebuffer it maps through `/dev/mem` (a device-tree region at
    /// `FB_IPA`); at the 20th harvest the host deletes its slot, copies it to
    /// other host memory and adds it again at the same IPA, logging. The
    /// dirtier's check passes, and every changed page of it is in a log.
    /// (Write-protection modes: faults on the slot wait during the move; with
    /// hardware dirty state a write needs no fault, so the move would have to
    /// stop the vCPUs, which this host side does not do yet.)
    fn linux_framebuffer_slot_moved_while_logged() {
        for mode in [Some(dirty::WP_GET), Some(dirty::RING)] {
            let args = format!("fb={FB_IPA:#x}:{FB_SIZE:#x},secs=8");
            let d = run_args(mode, HostChange::MoveSlot { at: 20 }, &args, "ok fb");
            assert_eq!(d.moves, 1, "{d:?}");
        }
    }
}

/// A framebuffer move under hardware dirty state (writes need no fault, so
/// holding faults does not hold them) is refused before QEMU starts, as is
/// any change without logging.
#[test]
fn changes_the_mode_cannot_hold_are_refused() {
    for (mode, change) in [
        (Some(dirty::HW_GET), HostChange::MoveSlot { at: 1 }),
        (None, HostChange::MoveSlot { at: 1 }),
        (None, HostChange::Remap { pages: 1 }),
    ] {
        let e = vm::run(&LinuxConfig {
            dirty: HarvestConfig {
                mode,
                change,
                ..HarvestConfig::default()
            },
            ..s2mmu_arm64::test_support::unbootable_config()
        })
        .expect_err("refused");
        assert!(
            matches!(&e, s2mmu_arm64::Arm64Error::Config(m) if m.contains("host change")),
            "{e:?}"
        );
    }
}
