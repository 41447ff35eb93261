//! SGIs between the vCPUs of the Linux VM (`s2mmu linux --run ipi`'s
//! guest) on both placements of the engine: vCPU 0's 20,000 SGIs, each to
//! every vCPU, all taken by vCPU 0 (the guest's own check of its count),
//! a rate read from the guest's line, and kicks that woke the other vCPU.

use s2mmu_arm64::linux::ipi::IpiFiles;
use s2mmu_arm64::linux::vm::Engine;
use std::time::Duration;

fn sgis_reach_every_vcpu(engine: Engine) {
    let f = IpiFiles::new().expect("the EL1 image");
    let r = f
        .run(2, engine, Duration::from_secs(300))
        .unwrap_or_else(|e| panic!("{engine:?}: {e}"));
    eprintln!("{engine:?}: {r:?}");
    assert!(r.sgis_per_s > 0.0, "{r:?}");
    assert!(r.kicked_exits > 0, "no kick woke vCPU 1: {r:?}");
}

s2mmu_arm64::linux_test! {
    fn sgis_reach_every_vcpu_with_the_engine_at_el2() { sgis_reach_every_vcpu(Engine::El2) }
    fn sgis_reach_every_vcpu_with_the_engine_on_the_host() { sgis_reach_every_vcpu(Engine::Host) }
}
