//! PSCI 1.1 over HVC, as Linux's `arch/arm64/kvm/psci.c` serves it: the
//! guest's power state calls, decoded into what the VM must do
//! ([`decode`]) and served against the VM's power states (`serve`, over
//! the VM's `PowerControl`), as the bus's device `Psci` (in `no_address.rs`)
//! whose calls these are.

/// PSCI_VERSION.
pub const VERSION: u32 = 0x8400_0000;
/// CPU_SUSPEND (64-bit).
pub const CPU_SUSPEND: u32 = 0xc400_0001;
/// CPU_SUSPEND (32-bit).
pub const CPU_SUSPEND_32: u32 = 0x8400_0001;
/// CPU_OFF.
pub const CPU_OFF: u32 = 0x8400_0002;
/// CPU_ON (64-bit).
pub const CPU_ON: u32 = 0xc400_0003;
/// CPU_ON (32-bit: the arguments' upper halves are not looked at).
pub const CPU_ON_32: u32 = 0x8400_0003;
/// AFFINITY_INFO (64-bit).
pub const AFFINITY_INFO: u32 = 0xc400_0004;
/// AFFINITY_INFO (32-bit).
pub const AFFINITY_INFO_32: u32 = 0x8400_0004;
/// MIGRATE_INFO_TYPE.
pub const MIGRATE_INFO_TYPE: u32 = 0x8400_0006;
/// SYSTEM_OFF.
pub const SYSTEM_OFF: u32 = 0x8400_0008;
/// SYSTEM_RESET.
pub const SYSTEM_RESET: u32 = 0x8400_0009;
/// PSCI_FEATURES.
pub const FEATURES: u32 = 0x8400_000a;

/// PSCI 1.1 (major 1 in bits 31:16, minor 1).
pub const VERSION_1_1: u64 = 0x1_0001;
/// SUCCESS.
pub const RET_SUCCESS: i64 = 0;
/// NOT_SUPPORTED.
pub const RET_NOT_SUPPORTED: i64 = -1;
/// INVALID_PARAMETERS.
pub const RET_INVALID_PARAMS: i64 = -2;
/// ALREADY_ON.
pub const RET_ALREADY_ON: i64 = -4;
/// ON_PENDING.
pub const RET_ON_PENDING: i64 = -5;
/// MIGRATE_INFO_TYPE: no Trusted OS that needs migrating.
pub const TOS_NOT_PRESENT_MP: u64 = 2;

/// A vCPU's power state, as AFFINITY_INFO reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerState {
    /// Running (or started and about to run).
    On,
    /// Off (never started, or CPU_OFF).
    Off,
    /// CPU_ON accepted, not running yet.
    OnPending,
}

impl PowerState {
    /// AFFINITY_INFO's code.
    pub fn code(self) -> u64 {
        match self {
            PowerState::On => 0,
            PowerState::Off => 1,
            PowerState::OnPending => 2,
        }
    }
}

/// What a PSCI call asks of the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PsciCall {
    /// Answer with x0 = this and resume.
    Answer(u64),
    /// Start vCPU `target` at `entry` with x0 = `context`.
    CpuOn {
        /// The target vCPU (MPIDR Aff0).
        target: u64,
        /// Its entry point.
        entry: u64,
        /// Its x0.
        context: u64,
    },
    /// Report vCPU `target`'s power state.
    AffinityInfo {
        /// The target vCPU.
        target: u64,
    },
    /// Stop this vCPU.
    CpuOff,
    /// Power the machine off.
    SystemOff,
    /// Reset the machine (the host stops it and says so, or boots it
    /// again: `reboot::run_rebooting`).
    SystemReset,
}

/// Decodes a guest HVC with `x0..x3`. Unknown calls answer NOT_SUPPORTED,
/// as SMCCC asks. A 32-bit call's arguments are their low halves (SMC32:
/// the upper halves are not the caller's to set). A target affinity is
/// an MPIDR (Aff3 in 39:32, Aff2..Aff0 in 23:0): any other bit set makes
/// it INVALID_PARAMETERS, as an affinity no CPU has ([`vcpu_of`], checked
/// by the VM); so is a lowest affinity level other than 0 (PSCI 1.0 on).
/// PSCI_FEATURES' function ID is 32 bits: one with its upper half set is
/// no function (NOT_SUPPORTED). The call's own function ID is W0, as
/// SMCCC passes it: x0's upper half is ignored, as KVM does
/// (`smccc_get_function` reads it as a `u32`).
pub fn decode(x: [u64; 4]) -> PsciCall {
    let id = x[0] as u32;
    let ans = |v: i64| PsciCall::Answer(v as u64);
    let narrow = |v: u64| if id & SMC64 == 0 { v & 0xffff_ffff } else { v };
    let (x1, x2, x3) = (narrow(x[1]), narrow(x[2]), narrow(x[3]));
    match id {
        VERSION => PsciCall::Answer(VERSION_1_1),
        // A suspend is served as a WFI, whatever its power state, as KVM
        // serves it (`kvm_psci_vcpu_suspend`): PSCI lets a power-down
        // state be taken as standby, which keeps every register, and the
        // wake-up is the caller's next interrupt. A trapped WFI here ends
        // at once (a WFI may), so the call answers SUCCESS at once.
        CPU_SUSPEND | CPU_SUSPEND_32 => PsciCall::Answer(RET_SUCCESS as u64),
        CPU_ON | CPU_ON_32 => PsciCall::CpuOn {
            target: x1,
            entry: x2,
            context: x3,
        },
        AFFINITY_INFO | AFFINITY_INFO_32 if x2 != 0 => ans(RET_INVALID_PARAMS),
        AFFINITY_INFO | AFFINITY_INFO_32 => PsciCall::AffinityInfo { target: x1 },
        CPU_OFF => PsciCall::CpuOff,
        SYSTEM_OFF => PsciCall::SystemOff,
        SYSTEM_RESET => PsciCall::SystemReset,
        MIGRATE_INFO_TYPE => PsciCall::Answer(TOS_NOT_PRESENT_MP),
        FEATURES if x[1] >> 32 != 0 => ans(RET_NOT_SUPPORTED),
        FEATURES => ans(features(x[1] as u32)),
        _ => ans(RET_NOT_SUPPORTED),
    }
}

fn features(id: u32) -> i64 {
    match id {
        VERSION | CPU_SUSPEND | CPU_SUSPEND_32 | CPU_OFF | CPU_ON | CPU_ON_32 | AFFINITY_INFO
        | AFFINITY_INFO_32 | MIGRATE_INFO_TYPE | SYSTEM_OFF | SYSTEM_RESET | FEATURES => {
            RET_SUCCESS
        }
        _ => RET_NOT_SUPPORTED,
    }
}

/// SMCCC's bit of a 64-bit call.
const SMC64: u32 = 1 << 30;

/// The vCPU an MPIDR names, if it exists: vCPU n has Aff0 = n and every
/// other affinity 0, and any bit outside the affinity fields (31:24,
/// 63:40) names no CPU.
pub fn vcpu_of(mpidr: u64, vcpus: usize) -> Option<usize> {
    let aff0 = (mpidr & 0xff) as usize;
    (mpidr & !0xff == 0 && aff0 < vcpus).then_some(aff0)
}

/// The VM's side of PSCI: its vCPUs' power states and the machine's.
pub(crate) trait PowerControl {
    /// How many vCPUs the VM has.
    fn vcpus(&self) -> usize;
    /// CPU_ON for the vCPU `target` names: its status code (SUCCESS,
    /// ALREADY_ON, ON_PENDING, INVALID_PARAMETERS).
    fn cpu_on(&self, target: u64, entry: u64, context: u64) -> i64;
    /// vCPU `v`'s power state.
    fn power(&self, v: usize) -> PowerState;
    /// CPU_OFF from vCPU `id`.
    fn cpu_off(&self, id: usize);
    /// SYSTEM_OFF, or SYSTEM_RESET when `reset`.
    fn system_off(&self, reset: bool);
}

/// What a served call leaves for the vCPU that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Served {
    /// Resume it with x0 = this.
    Resume(u64),
    /// Its CPU is off (CPU_OFF), or the machine is (SYSTEM_OFF/RESET).
    Off,
}

/// Serves vCPU `id`'s HVC with `x0..x3` against `vm`.
pub(crate) fn serve(x: [u64; 4], id: usize, vm: &(impl PowerControl + ?Sized)) -> Served {
    match decode(x) {
        PsciCall::Answer(v) => Served::Resume(v),
        PsciCall::CpuOn {
            target,
            entry,
            context,
        } => Served::Resume(vm.cpu_on(target, entry, context) as u64),
        PsciCall::AffinityInfo { target } => Served::Resume(match vcpu_of(target, vm.vcpus()) {
            Some(t) => vm.power(t).code(),
            None => RET_INVALID_PARAMS as u64,
        }),
        PsciCall::CpuOff => {
            vm.cpu_off(id);
            Served::Off
        }
        PsciCall::SystemOff => {
            vm.system_off(false);
            Served::Off
        }
        PsciCall::SystemReset => {
            vm.system_off(true);
            Served::Off
        }
    }
}

#[cfg(test)]
#[path = "psci_tests.rs"]
mod tests;
