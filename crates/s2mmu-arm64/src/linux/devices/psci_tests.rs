//! Each PSCI function's arguments, bit by bit.

use super::*;

const INVALID: PsciCall = PsciCall::Answer(RET_INVALID_PARAMS as u64);
const UNSUPPORTED: PsciCall = PsciCall::Answer(RET_NOT_SUPPORTED as u64);

fn call(id: u32, x1: u64, x2: u64, x3: u64) -> PsciCall {
    decode([id as u64, x1, x2, x3])
}

#[test]
fn version_and_migrate_info_type_answer_whatever_their_unused_arguments() {
    for junk in [0, u64::MAX] {
        assert_eq!(call(VERSION, junk, junk, junk), PsciCall::Answer(0x1_0001));
        assert_eq!(
            call(MIGRATE_INFO_TYPE, junk, junk, junk),
            PsciCall::Answer(TOS_NOT_PRESENT_MP)
        );
    }
}

#[test]
fn cpu_on_names_a_cpu_only_through_the_affinity_fields() {
    let on = |target| PsciCall::CpuOn {
        target,
        entry: 0x4020_0000,
        context: 7,
    };
    assert_eq!(call(CPU_ON, 1, 0x4020_0000, 7), on(1));
    // The decode passes the affinity on; the VM looks it up.
    for bad in [0x0100_0000, 0x8000_0000, 0x8000_0001, 1 << 40, 1 << 63] {
        assert_eq!(call(CPU_ON, bad, 0x4020_0000, 7), on(bad));
        assert_eq!(vcpu_of(bad, 4), None, "{bad:#x}");
    }
    // Aff1, Aff2, Aff3: a cluster with no CPU.
    for other in [0x100, 0x1_0000, 1 << 32] {
        assert_eq!(vcpu_of(other, 4), None, "{other:#x}");
    }
    assert_eq!(vcpu_of(3, 4), Some(3));
    assert_eq!(vcpu_of(4, 4), None);
}

#[test]
fn cpu_on_32_looks_at_the_low_halves_only() {
    let r = call(
        CPU_ON_32,
        0xffff_ffff_0000_0001,
        0x1_4020_0000,
        0x1_0000_0007,
    );
    assert_eq!(
        r,
        PsciCall::CpuOn {
            target: 1,
            entry: 0x4020_0000,
            context: 7
        }
    );
    // Bits 31:24 are inside the low half: still no CPU.
    let PsciCall::CpuOn { target, .. } = call(CPU_ON_32, 0x0100_0000, 0, 0) else {
        panic!("CPU_ON_32 not decoded");
    };
    assert_eq!(vcpu_of(target, 4), None);
}

#[test]
fn affinity_info_checks_its_level_and_passes_its_target_on() {
    for id in [AFFINITY_INFO, AFFINITY_INFO_32] {
        assert_eq!(call(id, 2, 0, 0), PsciCall::AffinityInfo { target: 2 });
        for level in [1, 2, 3, 0x8000_0000] {
            assert_eq!(call(id, 2, level, 0), INVALID, "{id:#x} level {level:#x}");
        }
    }
    // Level with only its upper half set: 0 for the 32-bit call.
    assert_eq!(call(AFFINITY_INFO, 0, 1 << 32, 0), INVALID);
    assert_eq!(
        call(AFFINITY_INFO_32, 0, 1 << 32, 0),
        PsciCall::AffinityInfo { target: 0 }
    );
}

#[test]
fn cpu_off_system_off_and_reset_take_no_arguments() {
    for junk in [0, u64::MAX] {
        assert_eq!(call(CPU_OFF, junk, junk, junk), PsciCall::CpuOff);
        assert_eq!(call(SYSTEM_OFF, junk, junk, junk), PsciCall::SystemOff);
        assert_eq!(call(SYSTEM_RESET, junk, junk, junk), PsciCall::SystemReset);
    }
}

#[test]
fn features_checks_the_whole_function_id() {
    let ok = PsciCall::Answer(RET_SUCCESS as u64);
    for id in [
        VERSION,
        CPU_SUSPEND,
        CPU_SUSPEND_32,
        CPU_OFF,
        CPU_ON,
        CPU_ON_32,
        AFFINITY_INFO,
        AFFINITY_INFO_32,
        MIGRATE_INFO_TYPE,
        SYSTEM_OFF,
        SYSTEM_RESET,
        FEATURES,
    ] {
        assert_eq!(call(FEATURES, id as u64, 0, 0), ok, "{id:#x}");
        assert_eq!(
            call(FEATURES, 1 << 32 | id as u64, 0, 0),
            UNSUPPORTED,
            "{id:#x} with the upper half set"
        );
    }
    assert_eq!(
        call(FEATURES, 0xc400_0002, 0, 0),
        UNSUPPORTED,
        "no 64-bit CPU_OFF"
    );
    assert_eq!(call(FEATURES, 0x8000_0000, 0, 0), UNSUPPORTED);
}

#[test]
fn unknown_calls_are_not_supported_and_x0s_upper_half_is_ignored() {
    assert_eq!(call(0x8000_0000, 0, 0, 0), UNSUPPORTED);
    assert_eq!(call(0xc400_0002, 0, 0, 0), UNSUPPORTED, "no 64-bit CPU_OFF");
    // The function ID is W0: VERSION whatever x0's upper half holds.
    for upper in [1u64 << 32, 0xffff_ffff << 32] {
        assert_eq!(
            decode([upper | VERSION as u64, 0, 0, 0]),
            call(VERSION, 0, 0, 0)
        );
        assert_eq!(
            decode([upper | SYSTEM_OFF as u64, 0, 0, 0]),
            PsciCall::SystemOff
        );
    }
}

/// A VM of `n` vCPUs that records what PSCI asked of it.
struct Recorder {
    n: usize,
    on: std::cell::RefCell<Vec<(u64, u64, u64)>>,
    off: std::cell::RefCell<Vec<usize>>,
    system: std::cell::Cell<Option<bool>>,
}

impl PowerControl for Recorder {
    fn vcpus(&self) -> usize {
        self.n
    }
    fn cpu_on(&self, target: u64, entry: u64, context: u64) -> i64 {
        self.on.borrow_mut().push((target, entry, context));
        RET_ALREADY_ON
    }
    fn power(&self, v: usize) -> PowerState {
        [PowerState::On, PowerState::OnPending][v % 2]
    }
    fn cpu_off(&self, id: usize) {
        self.off.borrow_mut().push(id);
    }
    fn system_off(&self, reset: bool) {
        self.system.set(Some(reset));
    }
}

#[test]
fn serve_asks_the_vm_and_answers_with_what_it_says() {
    let vm = Recorder {
        n: 2,
        on: Default::default(),
        off: Default::default(),
        system: Default::default(),
    };
    let on = serve([CPU_ON as u64, 1, 0x8000, 7], 0, &vm);
    assert_eq!(on, Served::Resume(RET_ALREADY_ON as u64));
    assert_eq!(*vm.on.borrow(), [(1, 0x8000, 7)]);
    let info = |t| serve([AFFINITY_INFO as u64, t, 0, 0], 0, &vm);
    assert_eq!(info(1), Served::Resume(PowerState::OnPending.code()));
    assert_eq!(info(2), Served::Resume(RET_INVALID_PARAMS as u64));
    assert_eq!(
        serve([VERSION as u64, 0, 0, 0], 0, &vm),
        Served::Resume(VERSION_1_1)
    );
    assert_eq!(serve([CPU_OFF as u64, 0, 0, 0], 1, &vm), Served::Off);
    assert_eq!(*vm.off.borrow(), [1]);
    assert_eq!(vm.system.get(), None);
    assert_eq!(serve([SYSTEM_RESET as u64, 0, 0, 0], 0, &vm), Served::Off);
    assert_eq!(vm.system.get(), Some(true));
    assert_eq!(serve([SYSTEM_OFF as u64, 0, 0, 0], 0, &vm), Served::Off);
    assert_eq!(vm.system.get(), Some(false));
}

/// CPU_SUSPEND, in either convention and for any power state (standby or
/// power-down, any state ID), is served as a WFI: SUCCESS, every register
/// kept, as KVM serves it.
#[test]
fn cpu_suspend_is_served_as_a_wfi_whatever_its_power_state() {
    let ok = PsciCall::Answer(RET_SUCCESS as u64);
    for id in [CPU_SUSPEND, CPU_SUSPEND_32] {
        for state in [0, 1, 1 << 16, 0x0101_0000, u64::MAX] {
            assert_eq!(call(id, state, 0x4008_0000, 7), ok, "{id:#x} {state:#x}");
        }
    }
}
