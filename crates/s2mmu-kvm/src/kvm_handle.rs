//! Opening `/dev/kvm` with errors that say what is wrong, and probing whether it can run a
//! vCPU at all (for tests that must skip on machines without KVM).

use crate::error::Error;
use kvm_ioctls::{Cap, Kvm};

/// The KVM device node.
pub const KVM_PATH: &str = "/dev/kvm";

/// Environment variable that overrides [`KVM_PATH`] (for example to check that the tests
/// skip cleanly: `S2MMU_KVM_PATH=/nonexistent cargo test -p s2mmu-kvm`).
pub const KVM_PATH_ENV: &str = "S2MMU_KVM_PATH";

/// Opens `/dev/kvm` (or `$S2MMU_KVM_PATH`) and checks the API version.
///
/// # Errors
/// As [`open_kvm_at`].
pub fn open_kvm() -> Result<Kvm, Error> {
    match std::env::var(KVM_PATH_ENV) {
        Ok(path) => open_kvm_at(&path),
        Err(_) => open_kvm_at(KVM_PATH),
    }
}

/// Opens the KVM device at `path` and checks the API version.
///
/// # Errors
/// [`Error::KvmMissing`] when the node does not exist or cannot be opened (or is not a KVM
/// device), [`Error::NotPermitted`] on EACCES/EPERM, [`Error::ApiVersion`] when it is not
/// 12.
pub fn open_kvm_at(path: &str) -> Result<Kvm, Error> {
    let c_path =
        std::ffi::CString::new(path).map_err(|_| Error::invalid("path", "contains a NUL byte"))?;
    let kvm = Kvm::new_with_path(&c_path).map_err(|e| match e.errno() {
        libc::EACCES | libc::EPERM => Error::NotPermitted {
            path: path.to_string(),
        },
        errno => Error::KvmMissing {
            path: path.to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_is_kvm_missing() {
        match open_kvm_at("/nonexistent/kvm") {
            Err(e @ Error::KvmMissing { .. }) => {
                assert!(e.is_environment());
                assert!(e.to_string().contains("/nonexistent/kvm"), "{e}");
            }
            other => panic!("expected KvmMissing, got {other:?}"),
        }
    }

    #[test]
    fn a_device_that_is_not_kvm_is_refused() {
        // /dev/null opens, but KVM_GET_API_VERSION on it fails (ENOTTY) and reads as -1.
        match open_kvm_at("/dev/null") {
            Err(Error::ApiVersion { .. }) | Err(Error::KvmMissing { .. }) => {}
            other => panic!("expected an environment error, got {other:?}"),
        }
    }
}
