//! The one error type of this crate.

use std::fmt;

/// Everything that can go wrong when running a workload on the host's KVM.
///
/// Caller input is validated up front and reported as [`Error::InvalidArgument`];
/// nothing in this crate panics on what a caller passes in.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The KVM device node does not exist or could not be opened for a reason other than
    /// permissions (for example no KVM module is loaded).
    KvmMissing {
        /// The device path that was tried.
        path: String,
        /// Why it could not be used (the OS error text).
        reason: String,
    },
    /// The KVM device exists but this process may not open it.
    NotPermitted {
        /// The device path that was tried.
        path: String,
    },
    /// The KVM API version is not the stable 12.
    ApiVersion {
        /// The version KVM reported.
        found: i32,
    },
    /// KVM lacks a capability the workload needs.
    CapabilityMissing {
        /// The capability's name as in the KVM API documentation.
        name: &'static str,
    },
    /// More memslots were asked for than KVM allows.
    TooManySlots {
        /// Slots the caller asked for (not counting reserved slot 0).
        requested: u64,
        /// `KVM_CAP_NR_MEMSLOTS`.
        max: u64,
    },
    /// An ioctl (or another system call) failed.
    Ioctl {
        /// The call, as named in the KVM API (`KVM_CLEAR_DIRTY_LOG`, `mmap`, ...).
        op: &'static str,
        /// The errno it returned.
        errno: i32,
    },
    /// Huge pages of a hugetlbfs size were asked for but are not reserved.
    HugetlbNotReserved {
        /// The huge page size in bytes.
        size: u64,
        /// What to do about it.
        how_to_reserve: String,
    },
    /// The guest stopped in a way the workload did not plan for.
    GuestFailed {
        /// Which vCPU.
        vcpu: u32,
        /// The exit, described.
        exit_reason: String,
    },
    /// A caller argument is out of range; the message says which and why.
    InvalidArgument {
        /// The parameter's name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl Error {
    /// Builds [`Error::Ioctl`] from the calling thread's current `errno`.
    pub(crate) fn last_os(op: &'static str) -> Self {
        Error::Ioctl {
            op,
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        }
    }

    /// Builds [`Error::Ioctl`] from a kvm-ioctls / vmm-sys-util errno.
    pub(crate) fn from_errno(op: &'static str, err: vmm_sys_util::errno::Error) -> Self {
        Error::Ioctl {
            op,
            errno: err.errno(),
        }
    }

    /// Builds [`Error::InvalidArgument`].
    pub(crate) fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            name,
            reason: reason.into(),
        }
    }

    /// True when the error means "this machine cannot run KVM guests here", as opposed to a
    /// bug or a bad argument; tests use it to decide whether to skip.
    pub fn is_environment(&self) -> bool {
        matches!(
            self,
            Error::KvmMissing { .. }
                | Error::NotPermitted { .. }
                | Error::ApiVersion { .. }
                | Error::CapabilityMissing { .. }
                | Error::HugetlbNotReserved { .. }
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::KvmMissing { path, reason } => {
                write!(
                    f,
                    "{path} is not usable: {reason} (is the kvm module loaded?)"
                )
            }
            Error::NotPermitted { path } => write!(
                f,
                "{path}: permission denied (run as root or join the group that owns {path})"
            ),
            Error::ApiVersion { found } => {
                write!(f, "KVM API version is {found}, expected 12")
            }
            Error::CapabilityMissing { name } => {
                write!(f, "KVM lacks the capability {name}")
            }
            Error::TooManySlots { requested, max } => write!(
                f,
                "{requested} memslots requested but KVM_CAP_NR_MEMSLOTS is {max} \
                 (slot 0 is reserved, so at most {} test slots)",
                max.saturating_sub(1)
            ),
            Error::Ioctl { op, errno } => write!(
                f,
                "{op} failed: {} (errno {errno})",
                std::io::Error::from_raw_os_error(*errno)
            ),
            Error::HugetlbNotReserved {
                size,
                how_to_reserve,
            } => write!(
                f,
                "no {} KiB hugetlb pages reserved: {how_to_reserve}",
                size / 1024
            ),
            Error::GuestFailed { vcpu, exit_reason } => {
                write!(f, "guest vCPU {vcpu} failed: {exit_reason}")
            }
            Error::InvalidArgument { name, reason } => {
                write!(f, "invalid argument {name}: {reason}")
            }
        }
    }
}

impl std::error::Error for Error {}

/// Guest memory's refusals in this crate's terms: a bad size or range is a bad argument, a
/// missing reservation an environment error (what the host lacks), a failed system call an
/// `Ioctl` naming it.
impl From<s2mmu_memory::MemoryError> for Error {
    fn from(e: s2mmu_memory::MemoryError) -> Self {
        use s2mmu_memory::MemoryError as M;
        match e {
            M::HugetlbNotReserved { page_size, .. } => Error::HugetlbNotReserved {
                size: page_size,
                how_to_reserve: e.to_string(),
            },
            M::Mmap { errno } => Error::Ioctl { op: "mmap", errno },
            M::Madvise { advice, errno } => Error::Ioctl { op: advice, errno },
            M::OutOfRange { .. } => Error::invalid("offset", e.to_string()),
            _ => Error::invalid("bytes", e.to_string()),
        }
    }
}
