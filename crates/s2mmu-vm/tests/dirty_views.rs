//! Dirty views on running vCPU threads: several consumers of one slot's
//! log harvest at their own periods while the guest writes, and each one's
//! copy of guest memory, built only from the pages it was told were dirty,
//! ends equal to the guest's.

use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::{DirtyMode, DirtyView, MmuPolicy};
use s2mmu_vm::{Backing, Pattern, SlotInfo, Vm, VmConfig, Workload, WorkloadConfig};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 4096;

/// A consumer: a view (or the slot's own log) and its copy of the slot.
struct Consumer {
    view: Option<DirtyView>,
    copy: Vec<u8>,
    period: u32,
}

/// GET, CLEAR, then copy the reported pages (after the clear, as a
/// migration must: a write after the copy faults and is logged again).
fn harvest(vm: &Vm<TreeMemslots>, slot: &SlotInfo, c: &mut Consumer) -> u64 {
    let mmu = vm.mmu();
    let pages = slot.size / PAGE;
    let mut bm = vec![0u64; pages.div_ceil(64) as usize];
    let n = match c.view {
        Some(v) => {
            mmu.get_dirty_view(v, &mut bm).unwrap();
            mmu.clear_dirty_view(v, 0, pages, &bm).unwrap()
        }
        None => {
            mmu.get_dirty_log(slot.id, &mut bm).unwrap();
            mmu.clear_dirty_log(slot.id, 0, pages, &bm).unwrap()
        }
    };
    for p in 0..pages {
        if bm[(p / 64) as usize] & (1 << (p % 64)) != 0 {
            let at = (p * PAGE) as usize;
            let dst = &mut c.copy[at..at + PAGE as usize];
            assert!(vm.memory().read_into(slot.mem_offset + p * PAGE, dst));
        }
    }
    n
}

/// An 8 MiB VM in one slot with `dirty` logging, and two vCPUs writing at
/// random that have made their first pass.
fn start(dirty: DirtyMode) -> (Arc<Vm<TreeMemslots>>, Workload<TreeMemslots>) {
    let policy = MmuPolicy {
        dirty,
        ..MmuPolicy::default()
    };
    let vm = Arc::new(
        Vm::<TreeMemslots>::new(VmConfig {
            mem_size: 8 * MIB,
            backing: Backing::Anonymous,
            slots: 1,
            policy,
            ..VmConfig::default()
        })
        .unwrap(),
    );
    let w = Workload::start(
        vm.clone(),
        2,
        WorkloadConfig {
            bytes_per_vcpu: 4 * MIB,
            write_percent: 100,
            pattern: Pattern::Random,
            page_size: PAGE,
        },
    )
    .unwrap();
    w.run_pass(|| {}).unwrap();
    (vm, w)
}

fn run(dirty: DirtyMode) {
    let (vm, w) = start(dirty);
    vm.enable_dirty_logging().unwrap();
    let slot = vm.slots()[0];
    let mmu = vm.mmu();
    let mut consumers: Vec<Consumer> = [(true, 1), (true, 3), (false, 2)]
        .into_iter()
        .map(|(view, period)| Consumer {
            view: view.then(|| mmu.open_dirty_view(slot.id).unwrap()),
            copy: vec![0; slot.size as usize],
            period,
        })
        .collect();
    // The log consumer starts from a full copy (its bitmap only covers
    // writes since logging started); views start all dirty.
    assert!(vm
        .memory()
        .read_into(slot.mem_offset, &mut consumers[2].copy));
    let at_start: u64 = w.control().live_writes().iter().sum();
    w.run_free();
    let t0 = Instant::now();
    let mut tick = 0u32;
    // 400 ms of harvests, and on until a vCPU wrote: a loaded machine need
    // not schedule the vCPU threads within a fixed time (60 s: a hang).
    let wrote = || w.control().live_writes().iter().sum::<u64>() > at_start;
    while t0.elapsed() < Duration::from_millis(400) || !wrote() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no vCPU wrote in 60 s"
        );
        for c in consumers
            .iter_mut()
            .filter(|c| tick.is_multiple_of(c.period))
        {
            harvest(&vm, &slot, c);
        }
        tick += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    w.pause();
    let mut guest = vec![0u8; slot.size as usize];
    assert!(vm.memory().read_into(slot.mem_offset, &mut guest));
    for (i, c) in consumers.iter_mut().enumerate() {
        harvest(&vm, &slot, c);
        let lost = (0..slot.size / PAGE)
            .filter(|p| {
                let r = (p * PAGE) as usize..((p + 1) * PAGE) as usize;
                c.copy[r.clone()] != guest[r]
            })
            .count();
        assert_eq!(lost, 0, "consumer {i} ({dirty:?}) lost writes");
    }
    let st = w.stop();
    assert!(
        st.iter().map(|s| s.dirtied).sum::<u64>() > 0 || dirty.hardware(),
        "the guest wrote while logged"
    );
    for c in &consumers {
        if let Some(v) = c.view {
            mmu.close_dirty_view(v).unwrap();
        }
    }
    assert_eq!(mmu.dirty_views_open(slot.id), 0);
}

#[test]
fn no_consumer_loses_a_write_under_running_vcpus() {
    run(DirtyMode::WP);
}

#[test]
fn no_consumer_loses_a_write_with_hardware_dirty_state() {
    run(DirtyMode::HW);
}
