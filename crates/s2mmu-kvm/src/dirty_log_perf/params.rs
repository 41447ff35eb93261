//! What one run is asked to do: the selftest's options, checked.

use crate::error::Error;
use crate::guest_code::GUEST_PAGE_SIZE;
use crate::memory::Backing;
use crate::vm::MemstressShape;

/// Parameters of one run (the selftest's options in brackets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyLogParams {
    /// Number of vCPUs (`-v`, default 1).
    pub vcpus: u32,
    /// Memory each vCPU dirties (`-b`, default 1 GiB).
    pub bytes_per_vcpu: u64,
    /// Dirty iterations after population (`-i`, default 2; at least 1 here).
    pub iterations: u32,
    /// Host backing of the test memory (`-s`, default anonymous).
    pub backing: Backing,
    /// Memslots the test memory is split into (`-x`, default 1).
    pub slots: u32,
    /// Use `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` (true unless `-g`): GET copies, CLEAR
    /// re-protects. When false, GET takes, clears and re-protects in one ioctl.
    pub manual_protect: bool,
    /// With manual protect, also enable `KVM_DIRTY_LOG_INITIALLY_SET` where the host offers
    /// it (the selftest does whenever it is offered).
    pub initially_set: bool,
    /// Percentage of page accesses that are writes in the dirty passes (`-w`, default 100).
    pub write_percent: u32,
    /// Guest page size; only 4096 is supported.
    pub page_size: u64,
    /// Use the per-vCPU dirty ring with this many entries (a power of two in
    /// 1024..=65536) instead of bitmaps. Then `manual_protect` is ignored, "get dirty log"
    /// is the harvest of every ring and "clear dirty log" is `KVM_RESET_DIRTY_RINGS`; vCPUs
    /// whose ring fills mid-pass harvest and reset it themselves and go on.
    pub dirty_ring_entries: Option<u32>,
}

impl Default for DirtyLogParams {
    fn default() -> Self {
        DirtyLogParams {
            vcpus: 1,
            bytes_per_vcpu: 1 << 30,
            iterations: 2,
            backing: Backing::Anonymous,
            slots: 1,
            manual_protect: true,
            initially_set: true,
            write_percent: 100,
            page_size: GUEST_PAGE_SIZE,
            dirty_ring_entries: None,
        }
    }
}

impl DirtyLogParams {
    /// The VM shape these parameters ask for.
    pub fn shape(&self) -> MemstressShape {
        MemstressShape {
            vcpus: self.vcpus,
            bytes_per_vcpu: self.bytes_per_vcpu,
            slots: self.slots,
            backing: self.backing,
            dirty_ring_entries: self.dirty_ring_entries,
        }
    }

    /// Checks every field without touching KVM.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first offending field.
    pub fn validate(&self) -> Result<(), Error> {
        if self.page_size != GUEST_PAGE_SIZE {
            return Err(Error::invalid(
                "page_size",
                format!("{} is not supported; only 4096", self.page_size),
            ));
        }
        if self.iterations == 0 {
            return Err(Error::invalid("iterations", "must be at least 1"));
        }
        if self.write_percent > 100 {
            return Err(Error::invalid(
                "write_percent",
                format!("{} is not in 0..=100", self.write_percent),
            ));
        }
        self.shape().validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_rejects_bad_parameters() {
        let ok = DirtyLogParams {
            bytes_per_vcpu: 16 << 20,
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        let bad = [
            DirtyLogParams { vcpus: 0, ..ok },
            DirtyLogParams {
                bytes_per_vcpu: 1000,
                ..ok
            },
            DirtyLogParams {
                iterations: 0,
                ..ok
            },
            DirtyLogParams {
                write_percent: 101,
                ..ok
            },
            DirtyLogParams {
                page_size: 2 << 20,
                ..ok
            },
            DirtyLogParams { slots: 3, ..ok },
            DirtyLogParams { slots: 0, ..ok },
            DirtyLogParams {
                backing: Backing::Hugetlb1G,
                ..ok
            },
        ];
        for p in bad {
            assert!(
                matches!(p.validate(), Err(Error::InvalidArgument { .. })),
                "{p:?}"
            );
        }
    }
}
