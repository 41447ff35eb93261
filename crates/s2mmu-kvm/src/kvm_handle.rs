//! Opening `/dev/kvm` with errors that say what is wrong, and probing whether it can run a
//! vCPU at all (for tests that must skip on machines without KVM).

use crate::error::Error;
use kvm_ioctls::{Cap, Kvm};

/// The KVM device node.
pub const KVM_PATH: &str = "/dev/kvm";

/// Opens `/dev/kvm` and checks the API version.
///
/// # Errors
/// [`Error::KvmMissing`] when the node does not exist or cannot be opened,
/// [`Error::NotPermitted`] on EACCES/EPERM, [`Error::ApiVersion`] when it is not 12.
pub fn open_kvm() -> Result<Kvm, Error> {
    let kvm = Kvm::new().map_err(|e| match e.errno() {
        libc::EACCES | libc::EPERM => Error::NotPermitted {
            path: KVM_PATH.to_string(),
        },
        errno => Error::KvmMissing {
            path: KVM_PATH.to_string(),
            reason: std::io::Error::from_raw_os_error(errno).to_string(),
        },
    })?;
    let version = kvm.get_api_version();
    if version != 12 {
        return Err(Error::ApiVersion { found: version });
    }
    Ok(kvm)
}

/// Fails with [`Error::CapabilityMissing`] unless KVM has `cap`.
///
/// # Errors
/// [`Error::CapabilityMissing`] naming `name`.
pub fn require_cap(kvm: &Kvm, cap: Cap, name: &'static str) -> Result<(), Error> {
    if kvm.check_extension(cap) {
        Ok(())
    } else {
        Err(Error::CapabilityMissing { name })
    }
}

/// `None` when this process can create a VM and run a CPL-3 guest on it; otherwise a
/// one-line reason, for tests to print as `skipped: <reason>`.
pub fn kvm_unusable_reason() -> Option<String> {
    match crate::vm::MemstressVm::probe() {
        Ok(()) => None,
        Err(e) => Some(e.to_string()),
    }
}
