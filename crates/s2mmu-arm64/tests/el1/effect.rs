//! The effect check `tlb-perf --arm64` runs, and its proof: with the
//! harvest's maintenance dropped, the idle CPU's second write goes through
//! its stale writable translation, and the check reports every page.

use crate::common;

use s2mmu::mmu::MmuPolicy;
use s2mmu_arm64::effect::{protect_effect, spread, ProtectEffect};
use s2mmu_arm64::layout;
use s2mmu_arm64::vm::{Arm64Vm, VmConfig};

const SLOT: u16 = 1;
const GPA: u64 = 1 << 32;
const PAGES: u64 = 4096;

fn run(drop_maintenance: bool) -> Option<ProtectEffect> {
    let _one = common::serial();
    let m = common::machine(2, PAGES * 4096)?;
    let policy = MmuPolicy::default();
    let vm = Arm64Vm::new(
        m,
        &VmConfig {
            policy,
            ..VmConfig::default()
        },
    )
    .unwrap();
    vm.add_slot(SLOT, GPA, layout::DATA, PAGES * 4096, 4096)
        .unwrap();
    vm.mmu().populate(SLOT, 0, PAGES).unwrap();
    vm.mmu().enable_dirty_logging(SLOT).unwrap();
    let pages = spread(PAGES, 8);
    let mut bitmap = vec![0u64; (PAGES / 64) as usize];
    let r = protect_effect(&vm, SLOT, GPA, &pages, 0, |mmu| {
        mmu.get_dirty_log(SLOT, &mut bitmap)?;
        if drop_maintenance {
            vm.sink().drop_host_sequences(u64::MAX);
        }
        mmu.clear_dirty_log(SLOT, 0, PAGES, &bitmap)?;
        vm.sink().drop_host_sequences(0);
        Ok(())
    })
    .unwrap();
    eprintln!("drop {drop_maintenance}: {r:?}");
    Some(r)
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_clears_invalidation_reaches_the_idle_cpu() {
    let Some(r) = run(false) else {
        return;
    };
    assert_eq!((r.pages, r.protected), (8, 8), "{r:?}");
    assert!(r.stale.is_empty());
}

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn a_dropped_clear_invalidation_leaves_stale_writable_translations() {
    let Some(r) = run(true) else {
        return;
    };
    assert_eq!(r.stale.len(), 8, "{r:?}");
    assert_eq!(r.protected, 0);
}
