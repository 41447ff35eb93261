//! The Linux VM's state ([`LinuxState`]) in the migration encoding
//! (`s2mmu_migrate::state`): a section per device, each device's bytes
//! written and checked by its own `DeviceState` (`gic`, `uart`), each
//! vCPU's registers ([`vcpu`]), and the whole state ([`linux`]).
//!
//! [`LinuxState`]: s2mmu_arm64::linux::vm_state::LinuxState

mod device;
mod gic;
pub mod linux;
mod uart;
pub mod vcpu;

use s2mmu_arm64::linux::migrate::LinuxVm;
use s2mmu_arm64::Arm64Error;
use s2mmu_migrate::VmError;

/// The encoded state of the paused `vm` ([`linux::encode`] of
/// [`LinuxVm::guest_state`]): a migration's STATE body.
///
/// # Errors
/// The VM has no state or is not paused; the state does not encode.
pub fn save(vm: &mut LinuxVm) -> Result<Vec<u8>, VmError> {
    let st = vm.guest_state().map_err(vm_error)?;
    linux::encode(&st).map_err(|e| VmError::new(e.to_string()))
}

/// Loads the state `bytes` encode into the paused `vm`, which has not
/// run guest code ([`LinuxVm::load_guest_state`]). Damaged or foreign
/// state is refused (naming what is wrong) with the VM unchanged.
///
/// # Errors
/// The state's decoding error, a VM that is not paused or has run, or
/// its vCPU threads not starting.
pub fn load(vm: &mut LinuxVm, bytes: &[u8]) -> Result<(), VmError> {
    if !vm.is_paused() {
        return Err(VmError::new("state is restored into a paused VM only"));
    }
    let st = linux::decode(bytes, vm.vcpu_count(), vm.ram().size())
        .map_err(|e| VmError::new(e.to_string()))?;
    vm.load_guest_state(st).map_err(vm_error)
}

/// `e` as the session's error: the guest's own message as it is.
pub fn vm_error(e: Arm64Error) -> VmError {
    VmError::new(match e {
        Arm64Error::Guest(s) => s,
        other => other.to_string(),
    })
}
