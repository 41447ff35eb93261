//! No write goes through a stale writable TLB entry once a write-protect
//! plus flush (a dirty-log clear) has returned: the next write faults and
//! is logged. (The dirty-log stress test checks the same end to end, with
//! many vCPUs, as "no dirty write is lost".)

use s2mmu::memslot::TreeMemslots;
use s2mmu::mmu::MmuPolicy;
use s2mmu::TlbInvalidate;
use s2mmu_vm::{Backing, Vm, VmConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn vm() -> Arc<Vm<TreeMemslots>> {
    let vm = Vm::new(VmConfig {
        mem_size: 4 << 20,
        backing: Backing::Anonymous,
        slots: 1,
        policy: MmuPolicy::default(),
        ..VmConfig::default()
    })
    .unwrap();
    vm.enable_dirty_logging().unwrap();
    Arc::new(vm)
}

/// GET + CLEAR of slot 0; whether page `gpa` was dirty.
fn harvest(vm: &Vm<TreeMemslots>, gpa: u64) -> bool {
    let s = vm.slots()[0];
    let pages = s.size / 4096;
    let mut bm = vec![0u64; pages.div_ceil(64) as usize];
    vm.mmu().get_dirty_log(s.id, &mut bm).unwrap();
    vm.mmu().clear_dirty_log(s.id, 0, pages, &bm).unwrap();
    let p = (gpa - s.gpa) / 4096;
    bm[(p / 64) as usize] & (1 << (p % 64)) != 0
}

#[test]
fn write_after_clear_faults_and_is_logged() {
    let vm = vm();
    let gpa = vm.slots()[0].gpa + 5 * 4096;
    let mut v = vm.new_vcpu().unwrap();
    v.write_u64(gpa, 1).unwrap();
    v.write_u64(gpa + 8, 2).unwrap();
    let faults = v.faults;
    assert!(faults > 0);
    assert_eq!(v.tlb().valid_entries(), 1, "a writable entry is cached");
    v.exit();
    assert!(harvest(&vm, gpa));
    v.write_u64(gpa, 3).unwrap();
    assert_eq!(v.faults, faults + 1, "the write after the clear faults");
    v.exit();
    assert!(harvest(&vm, gpa), "and is logged");
    assert!(!harvest(&vm, gpa), "nothing written since");
}

#[test]
fn whole_vmid_flush_empties_every_vcpu_tlb() {
    let vm = vm();
    let base = vm.slots()[0].gpa;
    let mut a = vm.new_vcpu().unwrap();
    let mut b = vm.new_vcpu().unwrap();
    for i in 0..8 {
        a.write_u64(base + i * 4096, i).unwrap();
        b.read_u64(base + i * 4096).unwrap();
    }
    a.exit();
    b.exit();
    assert_eq!(a.tlb().valid_entries(), 8);
    assert_eq!(b.tlb().valid_entries(), 8);
    let before = vm.shootdown().stats();
    vm.shootdown().flush_vmid();
    let after = vm.shootdown().stats();
    assert_eq!(after.calls - before.calls, 1);
    assert_eq!(after.vmid_flushes - before.vmid_flushes, 1);
    // Applied on entry to guest mode, before any access.
    a.read_u64(base).unwrap();
    b.read_u64(base).unwrap();
    assert_eq!(a.tlb().valid_entries(), 1);
    assert_eq!(b.tlb().valid_entries(), 1);
}

#[test]
fn concurrent_writer_never_bypasses_a_finished_clear() {
    let vm = vm();
    let gpa = vm.slots()[0].gpa + 17 * 4096;
    let (_, off) = vm.locate(gpa).unwrap();
    let stop = AtomicBool::new(false);
    let mut v = vm.new_vcpu().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 1u64;
            while !stop.load(Ordering::Relaxed) {
                v.write_u64(gpa, n).unwrap();
                n += 1;
            }
            v.exit();
        });
        let mut writes_seen = 0;
        for _ in 0..300 {
            harvest(&vm, gpa);
            // The clear has returned: the vCPU's writable entry is gone.
            let before = vm.memory().read_u64(off).unwrap();
            std::thread::yield_now();
            let after = vm.memory().read_u64(off).unwrap();
            if after != before {
                writes_seen += 1;
                // Written after the clear returned: it must have faulted
                // and been logged.
                assert!(harvest(&vm, gpa), "a write after the clear was not logged");
            }
        }
        stop.store(true, Ordering::Relaxed);
        // Not a timing assertion: on a loaded host the writer may not run.
        let _ = writes_seen;
    });
}
