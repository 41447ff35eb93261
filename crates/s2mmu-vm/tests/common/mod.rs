//! Helpers the workload tests share.

use s2mmu::memslot::MemslotStore;
use s2mmu_vm::Workload;
use std::time::{Duration, Instant};

/// Waits until every vCPU wrote past `before` (a reading of
/// `Control::live_writes`): a loaded machine need not schedule the vCPU
/// threads within a fixed sleep. Fails after 60 s.
pub fn wait_for_writes<S: MemslotStore + 'static>(w: &Workload<S>, before: &[u64]) {
    let t0 = Instant::now();
    while !w
        .control()
        .live_writes()
        .iter()
        .zip(before)
        .all(|(now, b)| now > b)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no vCPU writes in 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
