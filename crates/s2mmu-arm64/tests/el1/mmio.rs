//! An access to an IPA no memslot covers is answered by a device model:
//! the stub skips the instruction and a read gets the model's value.

use crate::common;

use s2mmu_arm64::layout::HVC_PROBE;
use s2mmu_arm64::vm::{Arm64Vm, HvcAnswer, MmioAccess, VmConfig};
use std::sync::{Arc, Mutex};

#[test]
#[cfg_attr(
    not(s2mmu_arm64_runnable),
    ignore = "needs qemu-system-aarch64 and the EL2 image (apt-get install qemu-system-arm binutils-aarch64-linux-gnu)"
)]
fn mmio_reads_and_writes_reach_the_device_model() {
    let _one = common::serial();
    let Some(m) = common::machine(2, 2 << 20) else {
        return;
    };
    let vm = Arm64Vm::new(m, &VmConfig::default()).unwrap();
    let seen: Arc<Mutex<Vec<MmioAccess>>> = Arc::default();
    let s2 = seen.clone();
    vm.set_mmio_handler(Box::new(move |a| {
        s2.lock().unwrap().push(a);
        0x1234_5678_9abc_def0
    }));
    let mut vcpu = vm.mmu().new_vcpu().unwrap();
    const UART: u64 = 0x0900_0000;
    for (write, value) in [(false, 0u64), (true, 0xabcd)] {
        let mut got = None;
        let args = [u64::from(write), UART + 8, value, 0, 0, 0, 0, 0];
        let st = vm
            .run(0, &mut vcpu, s2mmu_arm64::probe_entry(), args, |e| {
                assert_eq!(e.x[0], HVC_PROBE);
                got = Some(e.x[1]);
                HvcAnswer::Stop
            })
            .unwrap();
        assert_eq!(st.mmio, 1, "one emulated access");
        if write {
            assert_eq!(got, Some(0xabcd));
        } else {
            assert_eq!(
                got,
                Some(0x1234_5678_9abc_def0),
                "the model's value reached x1"
            );
        }
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        (seen[0].ipa, seen[0].size, seen[0].write),
        (UART + 8, 8, None)
    );
    assert_eq!(seen[1].write, Some(0xabcd));
}
