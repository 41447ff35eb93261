//! The per-vCPU dirty ring (`KVM_CAP_DIRTY_LOG_RING[_ACQ_REL]`), which kvm-ioctls 0.25
//! does not wrap: enabling it, mapping each vCPU's ring, harvesting with the acquire /
//! release protocol of `dirty_log_test.c`, and `KVM_RESET_DIRTY_RINGS`.

use crate::error::Error;
use kvm_bindings::{
    kvm_enable_cap, KVMIO, KVM_CAP_DIRTY_LOG_RING, KVM_CAP_DIRTY_LOG_RING_ACQ_REL,
    KVM_DIRTY_LOG_PAGE_OFFSET,
};
use kvm_ioctls::{VcpuFd, VmFd};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, KVMIO, 0xc7);

/// Size of one `struct kvm_dirty_gfn` (u32 flags, u32 slot, u64 offset).
pub const DIRTY_GFN_BYTES: u64 = 16;
/// Flags value KVM publishes for a dirty entry.
pub const DIRTY_GFN_F_DIRTY: u32 = 1;
/// Flags value userspace stores once it has collected an entry.
pub const DIRTY_GFN_F_RESET: u32 = 2;
/// Most entries a ring may have (`KVM_DIRTY_RING_MAX_ENTRIES`).
pub const MAX_ENTRIES: u32 = 65536;
/// Fewest entries accepted here (16 KiB: the smallest legal size with PML reservations).
pub const MIN_ENTRIES: u32 = 1024;

/// Checks a ring size: a power of two in [`MIN_ENTRIES`]..=[`MAX_ENTRIES`].
///
/// # Errors
/// [`Error::InvalidArgument`] otherwise.
pub fn validate_entries(entries: u32) -> Result<(), Error> {
    if !entries.is_power_of_two() || !(MIN_ENTRIES..=MAX_ENTRIES).contains(&entries) {
        return Err(Error::invalid(
            "dirty_ring_entries",
            format!("{entries} is not a power of two in {MIN_ENTRIES}..={MAX_ENTRIES}"),
        ));
    }
    Ok(())
}

/// Enables the dirty ring with `entries` entries per vCPU. Must run before any vCPU exists.
/// Prefers the `_ACQ_REL` variant where offered.
///
/// # Errors
/// [`Error::CapabilityMissing`] when neither variant is offered or the ring is too small
/// for this host; [`Error::Ioctl`] when `KVM_ENABLE_CAP` fails.
pub fn enable(vm: &VmFd, entries: u32) -> Result<(), Error> {
    validate_entries(entries)?;
    let bytes = u64::from(entries) * DIRTY_GFN_BYTES;
    let cap = [KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_CAP_DIRTY_LOG_RING]
        .into_iter()
        .find(|&c| vm.check_extension_raw(u64::from(c)) > 0)
        .ok_or(Error::CapabilityMissing {
            name: "KVM_CAP_DIRTY_LOG_RING",
        })?;
    let max = vm.check_extension_raw(u64::from(cap)).max(0) as u64;
    if bytes > max {
        return Err(Error::invalid(
            "dirty_ring_entries",
            format!("{entries} entries exceed this host's {max}-byte maximum ring"),
        ));
    }
    let mut enable = kvm_enable_cap {
        cap,
        ..Default::default()
    };
    enable.args[0] = bytes;
    vm.enable_cap(&enable)
        .map_err(|e| Error::from_errno("KVM_ENABLE_CAP(DIRTY_LOG_RING)", e))
}

/// One vCPU's ring, mapped from its vCPU fd, with the next index to collect.
#[derive(Debug)]
pub struct DirtyRing {
    base: NonNull<u8>,
    entries: u32,
    fetch: u64,
}

// SAFETY: the mapping is shared memory owned by this value; it is only accessed through
// `&mut self` (harvest), and KVM's concurrent accesses are ordered by the flags protocol.
unsafe impl Send for DirtyRing {}

impl DirtyRing {
    /// Maps the ring of `vcpu` (the VM must have the ring enabled with `entries`).
    ///
    /// # Errors
    /// [`Error::Ioctl`] (`mmap`) when the vCPU fd has no ring at that size.
    pub fn map(vcpu: &VcpuFd, entries: u32) -> Result<Self, Error> {
        let len = (u64::from(entries) * DIRTY_GFN_BYTES) as usize;
        let offset = libc::off_t::from(KVM_DIRTY_LOG_PAGE_OFFSET as i32) * 4096;
        // SAFETY: maps KVM's ring pages of this vCPU fd (shared, not executable, as KVM
        // requires); the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                vcpu.as_raw_fd(),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Error::last_os("mmap(dirty ring)"));
        }
        let base = NonNull::new(addr.cast::<u8>()).ok_or(Error::Ioctl {
            op: "mmap(dirty ring)",
            errno: libc::ENOMEM,
        })?;
        Ok(DirtyRing {
            base,
            entries,
            fetch: 0,
        })
    }

    /// Collects every published entry in order, calling `on_entry(slot, offset)` for each
    /// (slot is `as_id << 16 | id`), and marks them for reset. Returns how many it took.
    pub fn harvest(&mut self, mut on_entry: impl FnMut(u32, u64)) -> u64 {
        let mut count = 0;
        loop {
            let index = (self.fetch % u64::from(self.entries)) as usize;
            // SAFETY: `index < entries`, so the 16-byte entry lies inside the mapping; the
            // flags word is 4-byte aligned and only accessed atomically here and by KVM.
            let entry = unsafe { self.base.as_ptr().add(index * DIRTY_GFN_BYTES as usize) };
            // SAFETY: see above; AtomicU32 has the layout of u32.
            let flags = unsafe { &*entry.cast::<AtomicU32>() };
            if flags.load(Ordering::Acquire) & DIRTY_GFN_F_DIRTY == 0 {
                break;
            }
            // SAFETY: slot (offset 4) and offset (offset 8) are inside the entry; KVM wrote
            // them before publishing DIRTY with release semantics, observed by the acquire.
            let (slot, offset) = unsafe {
                (
                    std::ptr::read_volatile(entry.add(4).cast::<u32>()),
                    std::ptr::read_volatile(entry.add(8).cast::<u64>()),
                )
            };
            on_entry(slot, offset);
            flags.store(DIRTY_GFN_F_RESET, Ordering::Release);
            self.fetch += 1;
            count += 1;
        }
        count
    }
}

impl Drop for DirtyRing {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the ring mapping this value owns.
        unsafe {
            libc::munmap(
                self.base.as_ptr().cast(),
                (u64::from(self.entries) * DIRTY_GFN_BYTES) as usize,
            );
        }
    }
}

/// A duplicate of the VM fd, so vCPU threads can call `KVM_RESET_DIRTY_RINGS` themselves
/// when their ring fills mid-pass.
#[derive(Debug)]
pub struct RingResetter {
    vm: File,
}

impl RingResetter {
    /// Duplicates `vm`'s fd.
    ///
    /// # Errors
    /// [`Error::Ioctl`] (`dup`) on failure.
    pub fn new(vm: &VmFd) -> Result<Self, Error> {
        // SAFETY: dup of a valid fd; the result is checked.
        let fd = unsafe { libc::dup(vm.as_raw_fd()) };
        if fd < 0 {
            return Err(Error::last_os("dup"));
        }
        Ok(RingResetter {
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            vm: unsafe { File::from_raw_fd(fd) },
        })
    }

    /// `KVM_RESET_DIRTY_RINGS`: re-protects every harvested entry of every vCPU. Returns the
    /// number of entries reset.
    ///
    /// # Errors
    /// [`Error::Ioctl`] when KVM refuses.
    pub fn reset(&self) -> Result<u64, Error> {
        // SAFETY: a VM ioctl without argument on a valid VM fd; the result is checked.
        let rc = unsafe { ioctl(&self.vm, KVM_RESET_DIRTY_RINGS()) };
        if rc < 0 {
            return Err(Error::last_os("KVM_RESET_DIRTY_RINGS"));
        }
        Ok(rc as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_sizes() {
        assert!(validate_entries(65536).is_ok());
        assert!(validate_entries(1024).is_ok());
        assert!(validate_entries(512).is_err());
        assert!(validate_entries(131072).is_err());
        assert!(validate_entries(3000).is_err());
    }
}
